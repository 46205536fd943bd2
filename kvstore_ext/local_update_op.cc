/*
 * odsgd extension library: the fused OD-SGD local update as MXNet operators.
 *
 * Built against the installed MXNet wheel's include/mxnet/lib_api.h and src/lib_api.cc by
 * `python -m odsgd.native build` and loaded with mx.library.load(); each operator then
 * appears as mx.nd.<name>.
 *
 *   odsgd_local_update(weight, grad, global_weight, mom, var, out=weight)
 *     The 'sgd' local step of SPEC.md section 2; weight, mom (and var when adaptive) are
 *     updated in place in one pass over memory.
 *   odsgd_predict_update(weight, grad, global_weight, prev_global_weight, var, out=weight)
 *     The 'predict' local step of SPEC.md section 2; weight (and var when adaptive) in place.
 *
 * Attributes (strings, as MXNet passes them): rescale_grad, clip_gradient (<= 0: off), lr,
 * momentum, wd, lam, adaptive (0/1), beta, eps, and for predict also num_workers.
 * All arrays are float32, dense, and of the weight's shape; when adaptive is 0, var is never
 * read or written and may be any float32 array (a 1-element placeholder saves memory).
 */
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "lib_api.h"
#include "local_update_kernels.h"
#include "op_common.h"

using mxnet::ext::MXReturnValue;
using mxnet::ext::MXTensor;
using mxnet::ext::MX_FAIL;
using mxnet::ext::MX_SUCCESS;
using mxnet::ext::OpResource;

namespace odsgd {
namespace {

enum class OpKind { kLocal, kPredict };

const char* OpName(OpKind kind) {
  return kind == OpKind::kLocal ? "odsgd_local_update" : "odsgd_predict_update";
}

// Input positions, as the Python wrappers in odsgd/native/ops.py pass them.
constexpr int kWeight = 0;
constexpr int kGrad = 1;
constexpr int kGlobalWeight = 2;
constexpr int kMom = 3;             // odsgd_local_update
constexpr int kPrevGlobalWeight = 3;  // odsgd_predict_update
constexpr int kVar = 4;
constexpr int kNumInputs = 5;

std::vector<const char*> InputNames(OpKind kind) {
  if (kind == OpKind::kLocal) return {"weight", "grad", "global_weight", "mom", "var"};
  return {"weight", "grad", "global_weight", "prev_global_weight", "var"};
}

std::vector<const char*> AttrNames(OpKind kind) {
  std::vector<const char*> names = {"rescale_grad", "clip_gradient", "lr", "momentum", "wd",
                                    "lam", "adaptive", "beta", "eps"};
  if (kind == OpKind::kPredict) names.push_back("num_workers");
  return names;
}

/*! \brief Everything one call needs, parsed from the attribute strings. */
struct OpConfig {
  UpdateParams p;
  bool clip;
  bool adaptive;
};

/*! \brief Parses and checks the attributes; on failure records the reason and returns false. */
bool ParseConfig(const Attrs& attrs, OpKind kind, OpConfig* cfg) {
  if (!CheckKnownAttrs(attrs, OpName(kind), AttrNames(kind))) return false;
  double rescale_grad, clip_gradient, lr, momentum, wd, lam, beta, eps;
  bool adaptive;
  if (!GetNumber(attrs, OpName(kind), "rescale_grad", &rescale_grad) ||
      !GetNumber(attrs, OpName(kind), "clip_gradient", &clip_gradient) ||
      !GetNumber(attrs, OpName(kind), "lr", &lr) || !GetNumber(attrs, OpName(kind), "momentum", &momentum) ||
      !GetNumber(attrs, OpName(kind), "wd", &wd) || !GetNumber(attrs, OpName(kind), "lam", &lam) ||
      !GetFlag(attrs, OpName(kind), "adaptive", &adaptive) ||
      !GetNumber(attrs, OpName(kind), "beta", &beta) || !GetNumber(attrs, OpName(kind), "eps", &eps)) {
    return false;
  }
  if (adaptive && !(beta >= 0.0 && beta <= 1.0)) {
    MX_ERROR_MSG << OpName(kind) << ": beta must lie in [0, 1], got " << beta;
    return false;
  }
  if (adaptive && !(eps > 0.0)) {
    // eps = 0 divides by zero wherever v is still 0.
    MX_ERROR_MSG << OpName(kind) << ": eps must be > 0 in adaptive mode, got " << eps;
    return false;
  }
  double num_workers = 1.0;
  if (kind == OpKind::kPredict) {
    int64_t workers = 0;
    if (!GetCount(attrs, OpName(kind), "num_workers", 1, 1 << 30, &workers)) return false;
    num_workers = static_cast<double>(workers);
  }
  // Every constant is rounded to float32 once, here, as float32 code (and the NumPy
  // reference's np.float32(x)) does; 1 - beta is formed in double first, like the reference.
  cfg->p.rescale_grad = static_cast<float>(rescale_grad);
  cfg->p.clip_gradient = static_cast<float>(clip_gradient);
  cfg->p.lr = static_cast<float>(lr);
  cfg->p.momentum = static_cast<float>(momentum);
  cfg->p.wd = static_cast<float>(wd);
  cfg->p.lam = static_cast<float>(lam);
  cfg->p.beta = static_cast<float>(beta);
  cfg->p.one_minus_beta = static_cast<float>(1.0 - beta);
  cfg->p.eps = static_cast<float>(eps);
  cfg->p.num_workers = static_cast<float>(num_workers);
  cfg->clip = clip_gradient > 0.0;
  cfg->adaptive = adaptive;
  return true;
}

// ---------------------------------------------------------------------------------------
// Operator properties

template <OpKind kKind>
MXReturnValue ParseAttrs(const Attrs& attrs, int* num_in, int* num_out) {
  OpConfig cfg;
  if (!ParseConfig(attrs, kKind, &cfg)) return MX_FAIL;
  *num_in = kNumInputs;
  *num_out = 1;
  return MX_SUCCESS;
}

template <OpKind kKind>
MXReturnValue InferType(const Attrs& /*attrs*/, std::vector<int>* in_types,
                        std::vector<int>* out_types) {
  const std::vector<const char*> names = InputNames(kKind);
  for (size_t i = 0; i < in_types->size(); ++i) {
    const int t = (*in_types)[i];
    // -1: not yet known (symbolic graphs); imperative calls always know every dtype.
    if (t != -1 && t != mxnet::ext::kFloat32) {
      MX_ERROR_MSG << OpName(kKind) << ": input '" << names[i] << "' has dtype code " << t
                   << "; only float32 (code 0) is supported - cast the arrays to float32";
      return MX_FAIL;
    }
    (*in_types)[i] = mxnet::ext::kFloat32;
  }
  (*out_types)[0] = mxnet::ext::kFloat32;
  return MX_SUCCESS;
}

template <OpKind kKind>
MXReturnValue InferShape(const Attrs& attrs, std::vector<std::vector<unsigned int>>* in_shapes,
                         std::vector<std::vector<unsigned int>>* out_shapes) {
  OpConfig cfg;
  if (!ParseConfig(attrs, kKind, &cfg)) return MX_FAIL;
  const std::vector<const char*> names = InputNames(kKind);
  const std::vector<unsigned int>& wshape = (*in_shapes)[kWeight];
  for (int i = 1; i < kNumInputs; ++i) {
    if (i == kVar && !cfg.adaptive) continue;  // never accessed: any placeholder will do
    if ((*in_shapes)[i] != wshape) {
      MX_ERROR_MSG << OpName(kKind) << ": input '" << names[i] << "' has shape "
                   << ShapeString((*in_shapes)[i]) << " but 'weight' has shape "
                   << ShapeString(wshape) << "; all inputs must have the weight's shape"
                   << (i == kVar ? " (var only when adaptive=1)" : "");
      return MX_FAIL;
    }
  }
  (*out_shapes)[0] = wshape;
  return MX_SUCCESS;
}

// The arrays the operator writes besides its output. var is declared only in adaptive
// mode: MXNet's engine serialises every operator that writes an array, so a shared
// placeholder var that were declared written would serialise unrelated keys.
template <OpKind kKind>
MXReturnValue MutateInputs(const Attrs& attrs, std::vector<int>* input_indices) {
  OpConfig cfg;
  if (!ParseConfig(attrs, kKind, &cfg)) return MX_FAIL;
  if (kKind == OpKind::kLocal) input_indices->push_back(kMom);
  if (cfg.adaptive) input_indices->push_back(kVar);
  return MX_SUCCESS;
}

// ---------------------------------------------------------------------------------------
// Forward: checks shared by CPU and GPU

/*!
 * \brief out == weight exactly is the intended in-place use; read-only inputs may share
 *  memory with each other (e.g. prev_global_weight passed as global_weight when no older
 *  weights exist). Everything written must be distinct from everything else.
 */
bool CheckNoAliasing(OpKind kind, const OpConfig& cfg, std::vector<MXTensor>* inputs,
                     std::vector<MXTensor>* outputs) {
  const std::vector<const char*> names = InputNames(kind);
  std::vector<Span> spans = {SpanOf((*outputs)[0], "out", true)};
  for (int i = 0; i < kNumInputs; ++i) {
    if (i == kVar && !cfg.adaptive) continue;  // never accessed
    if (i == kWeight && (*inputs)[kWeight].data_ptr == (*outputs)[0].data_ptr) continue;
    const bool written = (kind == OpKind::kLocal && i == kMom) || i == kVar;
    spans.push_back(SpanOf((*inputs)[i], names[i], written));
  }
  return CheckNoOverlap(OpName(kind), spans,
                        "pass distinct arrays (out may only be weight itself)");
}

// ---------------------------------------------------------------------------------------
// CPU kernels

// The inner loops sit in their own non-inlined functions so that their parameters keep
// __restrict__ (GCC drops it on pointers captured into an OpenMP region) and the loop body
// has no branches: clip and adaptive are template parameters. GCC -O3 vectorises them.
template <bool kClip, bool kAdaptive>
__attribute__((noinline)) void LocalUpdateRange(int64_t begin, int64_t end,
                                                const UpdateParams p, float* __restrict__ w,
                                                const float* __restrict__ grad,
                                                const float* __restrict__ global_w,
                                                float* __restrict__ mom,
                                                float* __restrict__ var) {
  for (int64_t i = begin; i < end; ++i) {
    LocalUpdateAt<kClip, kAdaptive, false>(i, p, w, grad, global_w, mom, var, nullptr);
  }
}

template <bool kClip, bool kAdaptive>
__attribute__((noinline)) void PredictUpdateRange(int64_t begin, int64_t end,
                                                  const UpdateParams p, float* __restrict__ w,
                                                  const float* __restrict__ grad,
                                                  const float* __restrict__ global_w,
                                                  const float* __restrict__ prev_global_w,
                                                  float* __restrict__ var) {
  for (int64_t i = begin; i < end; ++i) {
    PredictUpdateAt<kClip, kAdaptive, false>(i, p, w, grad, global_w, prev_global_w, var,
                                             nullptr);
  }
}

template <bool kClip, bool kAdaptive>
void LocalUpdateCPU(int64_t n, const UpdateParams& p, float* w, const float* grad,
                    const float* global_w, float* mom, float* var) {
  ParallelFor(n, [&](int64_t b, int64_t e) {
    LocalUpdateRange<kClip, kAdaptive>(b, e, p, w, grad, global_w, mom, var);
  });
}

template <bool kClip, bool kAdaptive>
void PredictUpdateCPU(int64_t n, const UpdateParams& p, float* w, const float* grad,
                      const float* global_w, const float* prev_global_w, float* var) {
  ParallelFor(n, [&](int64_t b, int64_t e) {
    PredictUpdateRange<kClip, kAdaptive>(b, e, p, w, grad, global_w, prev_global_w, var);
  });
}

void CopyCPU(int64_t n, float* dst, const float* src) {
  ParallelFor(n, [&](int64_t b, int64_t e) {
    std::memcpy(dst + b, src + b, static_cast<size_t>(e - b) * sizeof(float));
  });
}

/*! \brief Checks, then reads the configuration and the pointers of one call. */
bool Prepare(const Attrs& attrs, OpKind kind, std::vector<MXTensor>* inputs,
             std::vector<MXTensor>* outputs, OpConfig* cfg) {
  if (!ParseConfig(attrs, kind, cfg)) return false;
  for (MXTensor& t : *inputs) {
    if (t.stype != mxnet::ext::kDefaultStorage) {
      MX_ERROR_MSG << OpName(kind) << ": only dense (default storage) arrays are supported";
      return false;
    }
  }
  return CheckNoAliasing(kind, *cfg, inputs, outputs);
}

template <OpKind kKind>
MXReturnValue ForwardCPU(const Attrs& attrs, std::vector<MXTensor>* inputs,
                         std::vector<MXTensor>* outputs, const OpResource& res) {
  (void)res;
  OpConfig cfg;
  if (!Prepare(attrs, kKind, inputs, outputs, &cfg)) return MX_FAIL;
  MXTensor& weight = (*inputs)[kWeight];
  const int64_t n = weight.size();
  float* out = (*outputs)[0].data<float>();
  // The kernels update out in place; a caller that did not pass out=weight gets the old
  // weight copied first (one extra pass, off the intended path).
  if (out != weight.data<float>()) CopyCPU(n, out, weight.data<float>());
  const float* grad = (*inputs)[kGrad].data<float>();
  const float* global_w = (*inputs)[kGlobalWeight].data<float>();
  float* var = (*inputs)[kVar].data<float>();
  const UpdateParams& p = cfg.p;
  if (kKind == OpKind::kLocal) {
    float* mom = (*inputs)[kMom].data<float>();
    DispatchFlags(cfg.clip, cfg.adaptive, [&](auto clip, auto adaptive) {
      LocalUpdateCPU<decltype(clip)::value, decltype(adaptive)::value>(n, p, out, grad,
                                                                       global_w, mom, var);
    });
  } else {
    const float* prev = (*inputs)[kPrevGlobalWeight].data<float>();
    DispatchFlags(cfg.clip, cfg.adaptive, [&](auto clip, auto adaptive) {
      PredictUpdateCPU<decltype(clip)::value, decltype(adaptive)::value>(n, p, out, grad,
                                                                         global_w, prev, var);
    });
  }
  return MX_SUCCESS;
}

// ---------------------------------------------------------------------------------------
// GPU forward (only when built with nvcc against a CUDA build of MXNet)

#if defined(ODSGD_WITH_CUDA)
template <OpKind kKind>
MXReturnValue ForwardGPU(const Attrs& attrs, std::vector<MXTensor>* inputs,
                         std::vector<MXTensor>* outputs, const OpResource& res) {
  OpConfig cfg;
  if (!Prepare(attrs, kKind, inputs, outputs, &cfg)) return MX_FAIL;
  void* stream = res.get_cuda_stream();
  MXTensor& weight = (*inputs)[kWeight];
  const int64_t n = weight.size();
  float* out = (*outputs)[0].data<float>();
  int rc = 0;
  if (out != weight.data<float>()) {
    rc = CopyDeviceAsync(out, weight.data<float>(), n * static_cast<int64_t>(sizeof(float)),
                         stream);
  }
  if (rc == 0) {
    if (kKind == OpKind::kLocal) {
      rc = LaunchLocalUpdateCuda(n, cfg.p, cfg.clip, cfg.adaptive, out,
                                 (*inputs)[kGrad].data<float>(),
                                 (*inputs)[kGlobalWeight].data<float>(),
                                 (*inputs)[kMom].data<float>(), (*inputs)[kVar].data<float>(),
                                 stream);
    } else {
      rc = LaunchPredictUpdateCuda(n, cfg.p, cfg.clip, cfg.adaptive, out,
                                   (*inputs)[kGrad].data<float>(),
                                   (*inputs)[kGlobalWeight].data<float>(),
                                   (*inputs)[kPrevGlobalWeight].data<float>(),
                                   (*inputs)[kVar].data<float>(), stream);
    }
  }
  if (rc != 0) {
    MX_ERROR_MSG << OpName(kKind) << ": CUDA error: " << CudaErrorString(rc);
    return MX_FAIL;
  }
  return MX_SUCCESS;
}
#endif  // ODSGD_WITH_CUDA

}  // namespace
}  // namespace odsgd

REGISTER_OP(odsgd_local_update)
    .setParseAttrs(odsgd::ParseAttrs<odsgd::OpKind::kLocal>)
    .setInferType(odsgd::InferType<odsgd::OpKind::kLocal>)
    .setInferShape(odsgd::InferShape<odsgd::OpKind::kLocal>)
    .setMutateInputs(odsgd::MutateInputs<odsgd::OpKind::kLocal>)
#if defined(ODSGD_WITH_CUDA)
    .setForward(odsgd::ForwardGPU<odsgd::OpKind::kLocal>, "gpu")
#endif
    .setForward(odsgd::ForwardCPU<odsgd::OpKind::kLocal>, "cpu");

REGISTER_OP(odsgd_predict_update)
    .setParseAttrs(odsgd::ParseAttrs<odsgd::OpKind::kPredict>)
    .setInferType(odsgd::InferType<odsgd::OpKind::kPredict>)
    .setInferShape(odsgd::InferShape<odsgd::OpKind::kPredict>)
    .setMutateInputs(odsgd::MutateInputs<odsgd::OpKind::kPredict>)
#if defined(ODSGD_WITH_CUDA)
    .setForward(odsgd::ForwardGPU<odsgd::OpKind::kPredict>, "gpu")
#endif
    .setForward(odsgd::ForwardCPU<odsgd::OpKind::kPredict>, "cpu");

/*!
 * \brief Called by mx.library.load with MXNET_VERSION = major*10000 + minor*100 + patch.
 *  lib_api.h's ABI (MX_LIBRARY_VERSION) changes between MXNet minor releases, so only the
 *  1.9 series this library was compiled against is accepted.
 */
MXReturnValue initialize(int version) {
  if (version < 10900 || version >= 11000) {
    MX_ERROR_MSG << "odsgd: libodsgd_ext was built for MXNet 1.9.x but was loaded by MXNet "
                 << version / 10000 << "." << (version / 100) % 100 << "." << version % 100
                 << "; rebuild it with `make native` or `python -m odsgd.native build`";
    return MX_FAIL;
  }
  return MX_SUCCESS;
}
