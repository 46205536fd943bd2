/*
 * The odsgd extension library's operators: the fused OD-SGD local update (docs/spec.md, section 4)
 * for a whole group of parameters in one operator call (variadic inputs, like MXNet's
 * multi_sgd_mom_update), so that a step's dispatch cost does not grow with the number of
 * arrays, and the gather/scatter of arrays to and from one flat buffer. One array is the
 * group P = 1: there is no single-array operator.
 *
 * Built against the installed MXNet wheel's include/mxnet/lib_api.h and src/lib_api.cc by
 * `python -m odsgd.native build` and loaded with mx.library.load(); each operator then
 * appears as mx.nd.<name>. The CUDA kernels are in local_update_op_gpu.cu.
 *
 * P arrays of sizes n_k are laid end to end in "flat" 1-D float32 arrays of length
 * N = n_0 + ... + n_{P-1}: array k occupies flat[off_k, off_k + n_k), off_0 = 0, each array
 * flattened in C order. The weights and gradients stay the caller's own arrays.
 *
 *   odsgd_multi_local_update(grads[P], global_flat, mom_flat, var_flat, local_flat,
 *                            out=weights)
 *     The 'sgd' local step of docs/spec.md, section 4 on every array, array k with lr = lrs[k]
 *     and wd = wds[k]; mom_flat (and var_flat when adaptive) updated in place.
 *   odsgd_multi_predict_update(grads[P], global_flat, prev_global_flat, var_flat,
 *                              local_flat, est_flat, out=weights)
 *     The 'predict' local step of docs/spec.md, section 4 on every array, with the estimate of
 *     round t's gradient sum of docs/predict.md: own_scales[k] * gc, and with previous=1
 *     also prev_scales[k] times the previous round's sum, recovered with est_flat (the last
 *     change of the global weights, updated in place) and prev_decays[k].
 *   odsgd_multi_nag_predict_update(grads[P], global_flat, prev_global_flat, var_flat,
 *                                  local_flat, est_flat, out=weights)
 *     The 'predict' local step for the global optimizer NAG (docs/predict.md) on every
 *     array, array k with lr = lrs[k], wd = wds[k] and prev_decay = prev_decays[k] (lr * wd
 *     of the servers' round that produced global_flat); est_flat (the estimate of the
 *     servers' NAG state) updated in place. own_scales, previous and prev_scales as above.
 *   The weights are outputs only, for every lam: the kernels never read them. The old local
 *   weights w_t, which only the compensation term lam c g g (W - w) reads, come from
 *   local_flat with local=1 (the store's flat copy of the weights, a mutable input: the same
 *   pass writes w_{t+1} into it and into the weights); with local=0 (only with lam=0) the
 *   kernels take W_t for w_t, and the term is 0 either way (WeightAt in
 *   local_update_kernels.h). MXNet hands the weights over as kWriteTo outputs, and its engine
 *   drops an MKL-DNN layout of a kWriteTo output before running the operator
 *   (imperative_utils.h PushFComputeEx, InvalidateOutputs in mkldnn_base-inl.h), so a weight
 *   that an inference forward reordered into an MKL-DNN layout needs no reorder and no wait
 *   first (odsgd/native/layout.py); an output that is also an input would fail in MXNet's
 *   dispatcher ("We can't generate TBlob for MKLDNN data").
 *   odsgd_gather(arrays[P], out=flat)            flat = concatenation of the arrays
 *   odsgd_scatter(flat, arrays[P], out=arrays)   arrays[k] = flat[off_k, off_k + n_k); the
 *     arrays are inputs too only so that their shapes are known (never read).
 *
 * Attributes: num_arrays (P >= 1); for the updates also lrs and wds (P comma-separated
 * numbers each), rescale_grad, clip_gradient (<= 0: off), momentum, lam, adaptive (0/1),
 * beta, eps, local (0/1: local_flat is read and written); for both predicts own_scales
 * (P numbers) and previous (0/1), with previous=1 prev_scales (P numbers); prev_decays
 * (P numbers) for the NAG predict and for the predict with previous=1. var_flat is never
 * touched when adaptive is 0, local_flat when local is 0, nor the predict's est_flat when
 * previous is 0: each may then be any float32 array (a 1-element placeholder).
 */
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "lib_api.h"
#include "local_update_kernels.h"
#include "op_common.h"

namespace odsgd {
namespace {

// Input positions after the gradients of the update operators.
constexpr int kFlatGlobal = 0;
constexpr int kFlatAux = 1;    // mom_flat (local) or prev_global_flat (predict)
constexpr int kFlatVar = 2;
constexpr int kFlatLocal = 3;  // local_flat: w_t in, w_{t+1} out (local=1)
constexpr int kFlatEst = 4;    // predicts: est_flat, the worker's copy of the servers' state
// ps-lite and MXNet handle at most a few thousand parameters per model; this bound only
// stops a corrupt attribute from allocating absurd tables.
constexpr int64_t kMaxArrays = 1 << 20;

const char* OpName(MultiKind kind) {
  switch (kind) {
    case MultiKind::kLocal: return "odsgd_multi_local_update";
    case MultiKind::kPredict: return "odsgd_multi_predict_update";
    case MultiKind::kNagPredict: return "odsgd_multi_nag_predict_update";
    case MultiKind::kGather: return "odsgd_gather";
    default: return "odsgd_scatter";
  }
}

constexpr bool IsUpdate(MultiKind kind) {
  return kind == MultiKind::kLocal || kind == MultiKind::kPredict ||
         kind == MultiKind::kNagPredict;
}

bool IsPredict(MultiKind kind) {
  return kind == MultiKind::kPredict || kind == MultiKind::kNagPredict;
}

/*! \brief Flat inputs after the P gradients of an update operator. */
int NumFlat(MultiKind kind) { return IsPredict(kind) ? 5 : 4; }

std::string FlatName(MultiKind kind, int which) {
  static const char* local[] = {"global_flat", "mom_flat", "var_flat", "local_flat"};
  static const char* predict[] = {"global_flat", "prev_global_flat", "var_flat", "local_flat",
                                  "est_flat"};
  return (kind == MultiKind::kLocal ? local : predict)[which];
}

std::vector<const char*> AttrNames(MultiKind kind) {
  if (!IsUpdate(kind)) return {"num_arrays"};
  std::vector<const char*> names = {"num_arrays", "lrs", "wds", "rescale_grad",
                                    "clip_gradient", "momentum", "lam", "adaptive",
                                    "beta", "eps", "local"};
  if (IsPredict(kind)) {
    names.insert(names.end(), {"own_scales", "previous", "prev_scales", "prev_decays"});
  }
  return names;
}

/*! \brief Everything one call needs, parsed from the attribute strings. */
struct MultiConfig {
  int num = 0;                 // P
  UpdateParams p{};            // shared hyper-parameters (lr and wd per array below)
  std::vector<float> lrs, wds;
  std::vector<float> own_scales, prev_scales, prev_decays;   // predicts (ParsePredictLists)
  bool clip = false;
  bool adaptive = false;
  bool previous = false;      // predicts: the estimate takes the previous round's sum
  bool local_flat = false;    // updates: w_t is read from local_flat, w_{t+1} written there
};

// Where an update operator's inputs are: grads[P], then the flat arrays (the weights are
// outputs only).
int GradInput(int k) { return k; }
int FlatInput(const MultiConfig& cfg, int which) { return cfg.num + which; }

/*! \brief Name of input `i` for messages. */
std::string InputName(MultiKind kind, const MultiConfig& cfg, int i) {
  if (kind == MultiKind::kGather) return "arrays[" + std::to_string(i) + "]";
  if (kind == MultiKind::kScatter) {
    return i == 0 ? std::string("flat") : "arrays[" + std::to_string(i - 1) + "]";
  }
  if (i < FlatInput(cfg, 0)) return "grads[" + std::to_string(i) + "]";
  return FlatName(kind, i - FlatInput(cfg, 0));
}

/*! \brief Whether a call reads est_flat: the NAG estimate always, the SGD predict's last
 *  weight change with previous=1 (the runtime face of kUsesEst). */
bool UsesEstFlat(MultiKind kind, const MultiConfig& cfg) {
  return kind == MultiKind::kNagPredict || (kind == MultiKind::kPredict && cfg.previous);
}

/*! \brief Whether flat input `which` of an update is read: var only when adaptive,
 *  local_flat only with local=1, the predict's est_flat only with previous=1 (else each may
 *  be a placeholder). */
bool FlatIsRead(MultiKind kind, const MultiConfig& cfg, int which) {
  if (which == kFlatVar) return cfg.adaptive;
  if (which == kFlatLocal) return cfg.local_flat;
  if (which == kFlatEst) return UsesEstFlat(kind, cfg);
  return true;
}

/*! \brief Whether flat input `which` of an update is written (in place): the 'sgd'
 *  momentum, and var, local_flat and est_flat where they are read. */
bool FlatIsWritten(MultiKind kind, const MultiConfig& cfg, int which) {
  if (which == kFlatAux) return kind == MultiKind::kLocal;
  return which != kFlatGlobal && FlatIsRead(kind, cfg, which);
}

/*!
 * \brief How much of the attributes a callback parses. MXNet 1.9 calls the library's
 *  callbacks about seven times per operator call, each with the attribute strings, and
 *  ParseAttrs first (it gives the number of inputs): that one checks everything, the
 *  shape, type and mutate callbacks then read only what they use, the forward every value.
 */
enum class Parse {
  kValidate,   // ParseAttrs: every attribute, unknown names refused
  kLayout,     // shape, type and mutate callbacks: num_arrays, adaptive, previous, local
  kRun,        // forward: every value
};

/*! \brief The predicts' per-array lists: own_scales always; prev_scales with previous=1;
 *  prev_decays where est_flat is read. A list given where it is not read is refused: it
 *  would otherwise be ignored silently. */
bool ParsePredictLists(const Attrs& attrs, MultiKind kind, int64_t num, MultiConfig* cfg) {
  const char* op = OpName(kind);
  const bool reads_decays = UsesEstFlat(kind, *cfg);
  const char* unread = !cfg->previous && attrs.count("prev_scales") ? "prev_scales"
                       : !reads_decays && attrs.count("prev_decays") ? "prev_decays"
                                                                     : nullptr;
  if (unread != nullptr) {
    MX_ERROR_MSG << op << ": attribute '" << unread << "' is only read with previous=1; "
                 << "remove it or set previous=1";
    return false;
  }
  return GetFloatList(attrs, op, "own_scales", num, &cfg->own_scales) &&
         (!cfg->previous || GetFloatList(attrs, op, "prev_scales", num, &cfg->prev_scales)) &&
         (!reads_decays || GetFloatList(attrs, op, "prev_decays", num, &cfg->prev_decays));
}

/*! \brief Parses the attributes (as much as `level` says) into `cfg`; false, with the
 *  reason recorded, when one is missing or wrong. */
bool ParseConfig(const Attrs& attrs, MultiKind kind, Parse level, MultiConfig* cfg) {
  const char* op = OpName(kind);
  if (level == Parse::kValidate && !CheckKnownAttrs(attrs, op, AttrNames(kind))) return false;
  int64_t num = 0;
  if (!GetCount(attrs, op, "num_arrays", 1, kMaxArrays, &num)) return false;
  cfg->num = static_cast<int>(num);
  if (!IsUpdate(kind)) return true;
  if (IsPredict(kind) && !GetFlag(attrs, op, "previous", &cfg->previous)) return false;
  if (!GetFlag(attrs, op, "adaptive", &cfg->adaptive) ||
      !GetFlag(attrs, op, "local", &cfg->local_flat)) {
    return false;
  }
  if (level == Parse::kLayout) return true;
  double rescale_grad, clip_gradient, momentum, lam, beta, eps;
  if (!GetNumber(attrs, op, "rescale_grad", &rescale_grad) ||
      !GetNumber(attrs, op, "clip_gradient", &clip_gradient) ||
      !GetNumber(attrs, op, "momentum", &momentum) || !GetNumber(attrs, op, "lam", &lam) ||
      !GetNumber(attrs, op, "beta", &beta) || !GetNumber(attrs, op, "eps", &eps)) {
    return false;
  }
  if (cfg->adaptive && !(beta >= 0.0 && beta <= 1.0)) {
    MX_ERROR_MSG << op << ": beta must lie in [0, 1], got " << beta;
    return false;
  }
  if (cfg->adaptive && !(eps > 0.0)) {
    // eps = 0 divides by zero wherever v is still 0.
    MX_ERROR_MSG << op << ": eps must be > 0 in adaptive mode, got " << eps;
    return false;
  }
  if (lam != 0.0 && !cfg->local_flat) {
    // Without local_flat the kernels take W_t for w_t, which only the compensation term reads.
    MX_ERROR_MSG << op << ": lam=" << lam << " reads the old weights w_t, which the weights "
                 << "(outputs only) do not give: pass local_flat, the flat copy of the "
                 << "weights, with local=1";
    return false;
  }
  if (!GetFloatList(attrs, op, "lrs", num, &cfg->lrs) ||
      !GetFloatList(attrs, op, "wds", num, &cfg->wds) ||
      (IsPredict(kind) && !ParsePredictLists(attrs, kind, num, cfg))) {
    return false;
  }
  cfg->p = MakeUpdateParams(rescale_grad, clip_gradient, momentum, lam, beta, eps);
  cfg->clip = clip_gradient > 0.0;
  return true;
}

int NumInputs(MultiKind kind, const MultiConfig& cfg) {
  if (kind == MultiKind::kGather) return cfg.num;
  if (kind == MultiKind::kScatter) return cfg.num + 1;
  return FlatInput(cfg, NumFlat(kind));
}

int NumOutputs(MultiKind kind, const MultiConfig& cfg) {
  return kind == MultiKind::kGather ? 1 : cfg.num;
}

// ---------------------------------------------------------------------------------------
// Operator properties

template <MultiKind kKind>
MXReturnValue ParseAttrs(const Attrs& attrs, int* num_in, int* num_out) {
  MultiConfig cfg;
  if (!ParseConfig(attrs, kKind, Parse::kValidate, &cfg)) return MX_FAIL;
  *num_in = NumInputs(kKind, cfg);
  *num_out = NumOutputs(kKind, cfg);
  return MX_SUCCESS;
}

template <MultiKind kKind>
MXReturnValue InferType(const Attrs& attrs, std::vector<int>* in_types,
                        std::vector<int>* out_types) {
  MultiConfig cfg;
  if (!ParseConfig(attrs, kKind, Parse::kLayout, &cfg)) return MX_FAIL;
  for (size_t i = 0; i < in_types->size(); ++i) {
    const int t = (*in_types)[i];
    // -1: not yet known (symbolic graphs); imperative calls always know every dtype.
    if (t != -1 && t != mxnet::ext::kFloat32) {
      MX_ERROR_MSG << OpName(kKind) << ": input '" << InputName(kKind, cfg, i)
                   << "' has dtype code " << t << "; only float32 (code 0) is supported - "
                   << "use the NDArray fallback for other dtypes (odsgd.native.accepts() "
                   << "says which arrays the operators take)";
      return MX_FAIL;
    }
    (*in_types)[i] = mxnet::ext::kFloat32;
  }
  for (int& t : *out_types) t = mxnet::ext::kFloat32;
  return MX_SUCCESS;
}

/*! \brief `sizes` names what the total sums, for the message. */
bool CheckFlatShape(MultiKind kind, const std::string& name,
                    const std::vector<unsigned int>& shape, int64_t total,
                    const char* sizes = "the arrays' sizes") {
  if (shape.size() != 1 || static_cast<int64_t>(shape[0]) != total) {
    MX_ERROR_MSG << OpName(kind) << ": '" << name << "' has shape " << ShapeString(shape)
                 << " but must be 1-D of length " << total << " (the sum of " << sizes
                 << ", in their order)";
    return false;
  }
  return true;
}

template <MultiKind kKind>
MXReturnValue InferShape(const Attrs& attrs, std::vector<std::vector<unsigned int>>* in_shapes,
                         std::vector<std::vector<unsigned int>>* out_shapes) {
  MultiConfig cfg;
  if (!ParseConfig(attrs, kKind, Parse::kLayout, &cfg)) return MX_FAIL;
  const int num = cfg.num;
  const auto& in = *in_shapes;
  if (kKind == MultiKind::kGather) {
    int64_t total = 0;
    for (int k = 0; k < num; ++k) total += NumElements(in[k]);
    (*out_shapes)[0] = {static_cast<unsigned int>(total)};
    return MX_SUCCESS;
  }
  if (kKind == MultiKind::kScatter) {
    int64_t total = 0;
    for (int k = 0; k < num; ++k) {
      total += NumElements(in[k + 1]);
      (*out_shapes)[k] = in[k + 1];
    }
    return CheckFlatShape(kKind, "flat", in[0], total) ? MX_SUCCESS : MX_FAIL;
  }
  // The weights' shapes: the gradients' (the weights are outputs only; MXNet checks the
  // shapes given here against the output arrays).
  int64_t total = 0;
  for (int k = 0; k < num; ++k) {
    const auto& grad = in[GradInput(k)];
    total += NumElements(grad);
    (*out_shapes)[k] = grad;
  }
  for (int which = 0; which < NumFlat(kKind); ++which) {
    if (!FlatIsRead(kKind, cfg, which)) continue;   // never accessed: a placeholder will do
    if (!CheckFlatShape(kKind, FlatName(kKind, which), in[FlatInput(cfg, which)], total,
                        "the gradients' sizes")) {
      return MX_FAIL;
    }
  }
  return MX_SUCCESS;
}

// The arrays the operator writes besides its outputs. var is declared only when used:
// MXNet's engine serialises every operator that writes an array, so a shared placeholder
// declared written would serialise unrelated calls.
template <MultiKind kKind>
MXReturnValue MutateInputs(const Attrs& attrs, std::vector<int>* input_indices) {
  if (!IsUpdate(kKind)) return MX_SUCCESS;
  MultiConfig cfg;
  if (!ParseConfig(attrs, kKind, Parse::kLayout, &cfg)) return MX_FAIL;
  for (int which = 0; which < NumFlat(kKind); ++which) {
    if (FlatIsWritten(kKind, cfg, which)) input_indices->push_back(FlatInput(cfg, which));
  }
  return MX_SUCCESS;
}

// ---------------------------------------------------------------------------------------
// Forward: what CPU and GPU share

/*! \brief The per-array table of one call (local_update_kernels.h): updates and scatter
 *  write outputs[k] and read grads[k] / nothing; gather reads inputs[k]. */
void BuildTable(MultiKind kind, const MultiConfig& cfg, std::vector<MXTensor>* inputs,
                std::vector<MXTensor>* outputs, HostSegmentTable* table) {
  const int num = cfg.num;
  std::vector<SegmentSpec> specs(static_cast<size_t>(num));
  for (int k = 0; k < num; ++k) {
    SegmentSpec& s = specs[k];
    s = SegmentSpec{0, nullptr, nullptr, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    if (kind == MultiKind::kGather) {
      s.in = static_cast<const float*>((*inputs)[k].data_ptr);
      s.size = (*inputs)[k].size();
      continue;
    }
    s.out = static_cast<float*>((*outputs)[k].data_ptr);
    s.size = (*outputs)[k].size();
    if (IsUpdate(kind)) {
      s.in = static_cast<const float*>((*inputs)[GradInput(k)].data_ptr);
      s.lr = cfg.lrs[k];
      s.wd = cfg.wds[k];
      if (IsPredict(kind)) s.own_scale = cfg.own_scales[k];
      if (cfg.previous) s.prev_scale = cfg.prev_scales[k];
      if (UsesEstFlat(kind, cfg)) s.prev_decay = cfg.prev_decays[k];
    }
  }
  BuildSegmentTable(specs, table);
}

/*! \brief Written arrays must not share memory with anything else; read-only inputs may
 *  share memory. */
bool CheckNoAliasing(MultiKind kind, const MultiConfig& cfg, std::vector<MXTensor>* inputs,
                     std::vector<MXTensor>* outputs) {
  const int num = cfg.num;
  std::vector<Span> spans;
  spans.reserve(inputs->size() + outputs->size());
  if (kind == MultiKind::kGather) {
    spans.push_back(SpanOf((*outputs)[0], "out", true));
    for (int k = 0; k < num; ++k) spans.push_back(SpanOf((*inputs)[k], InputName(kind, cfg, k),
                                                         false));
  } else if (kind == MultiKind::kScatter) {
    spans.push_back(SpanOf((*inputs)[0], "flat", false));
    for (int k = 0; k < num; ++k) {
      spans.push_back(SpanOf((*outputs)[k], "arrays[" + std::to_string(k) + "]", true));
    }
  } else {
    for (int k = 0; k < num; ++k) {
      spans.push_back(SpanOf((*outputs)[k], "weights[" + std::to_string(k) + "]", true));
      spans.push_back(SpanOf((*inputs)[GradInput(k)], InputName(kind, cfg, GradInput(k)),
                             false));
    }
    for (int which = 0; which < NumFlat(kind); ++which) {
      if (!FlatIsRead(kind, cfg, which)) continue;
      spans.push_back(SpanOf((*inputs)[FlatInput(cfg, which)], FlatName(kind, which),
                             FlatIsWritten(kind, cfg, which)));
    }
  }
  return CheckNoOverlap(OpName(kind), spans, "pass distinct arrays");
}

bool Prepare(const Attrs& attrs, MultiKind kind, std::vector<MXTensor>* inputs,
             std::vector<MXTensor>* outputs, MultiConfig* cfg) {
  if (!ParseConfig(attrs, kind, Parse::kRun, cfg)) return false;
  for (const MXTensor& t : *inputs) {
    if (t.stype != mxnet::ext::kDefaultStorage) {
      MX_ERROR_MSG << OpName(kind) << ": only dense (default storage) arrays are supported";
      return false;
    }
  }
  return CheckNoAliasing(kind, *cfg, inputs, outputs);
}

FlatArrays FlatArraysOf(MultiKind kind, const MultiConfig& cfg, std::vector<MXTensor>* inputs,
                        std::vector<MXTensor>* outputs) {
  FlatArrays f{nullptr, nullptr, nullptr, nullptr, nullptr, nullptr};
  if (kind == MultiKind::kGather) {
    f.flat = static_cast<float*>((*outputs)[0].data_ptr);
  } else if (kind == MultiKind::kScatter) {
    f.flat = static_cast<float*>((*inputs)[0].data_ptr);
  } else {
    f.global_w = static_cast<const float*>((*inputs)[FlatInput(cfg, kFlatGlobal)].data_ptr);
    f.aux = static_cast<float*>((*inputs)[FlatInput(cfg, kFlatAux)].data_ptr);
    f.var = static_cast<float*>((*inputs)[FlatInput(cfg, kFlatVar)].data_ptr);
    f.local_flat = static_cast<float*>((*inputs)[FlatInput(cfg, kFlatLocal)].data_ptr);
    if (IsPredict(kind)) {
      f.est = static_cast<float*>((*inputs)[FlatInput(cfg, kFlatEst)].data_ptr);
    }
  }
  return f;
}

// ---------------------------------------------------------------------------------------
// CPU

// Each array's part of a thread's range runs in this non-inlined loop, whose pointers keep
// __restrict__ (GCC drops it on pointers captured into an OpenMP region) and whose body has
// no branch (kind and flags are template parameters), so GCC -O3 vectorises every
// instantiation. aux is read only for the predicts and may then be global_w itself, which
// __restrict__ allows (neither is written). w is only written.
template <MultiKind kKind, bool kClip, bool kAdaptive, bool kPrev, bool kLocalFlat>
__attribute__((noinline)) void UpdateRangeCPU(int64_t begin, int64_t end, const UpdateParams p,
                                              float* __restrict__ w,
                                              const float* __restrict__ grad,
                                              const float* __restrict__ global_w,
                                              float* __restrict__ aux, float* __restrict__ est,
                                              float* __restrict__ var,
                                              float* __restrict__ local_flat) {
  for (int64_t i = begin; i < end; ++i) {
    UpdateAt<kKind, kClip, kAdaptive, kPrev, kLocalFlat>(i, p, w, grad, global_w, aux, est, var,
                                                         local_flat);
  }
}

/*! \brief Calls fn(k, b, e) for every array k that flat range [begin, end) touches, with
 *  [b, e) the touched part in array k's own indices. */
template <typename SegmentFn>
void ForEachSegment(const SegmentTable& t, int num, int64_t begin, int64_t end,
                    SegmentFn fn) {
  if (begin >= end) return;
  for (int k = FindSegment(t.offsets, num, begin); k < num && t.offsets[k] < end; ++k) {
    const int64_t b = std::max(begin, t.offsets[k]) - t.offsets[k];
    const int64_t e = std::min(end, t.offsets[k + 1]) - t.offsets[k];
    if (b < e) fn(k, b, e);
  }
}

template <MultiKind kKind, bool kClip, bool kAdaptive, bool kPrev, bool kLocalFlat>
void MultiUpdateCPU(const MultiConfig& cfg, const HostSegmentTable& table, const FlatArrays& f) {
  const SegmentTable& t = table.view;
  ParallelFor(table.total, [&](int64_t begin, int64_t end) {
    ForEachSegment(t, cfg.num, begin, end, [&](int k, int64_t b, int64_t e) {
      const int64_t off = t.offsets[k];
      // est, var and local_flat are only offset where they are real arrays (not placeholders).
      float* est = kUsesEst<kKind, kPrev> ? f.est + off : f.est;
      float* var = kAdaptive ? f.var + off : f.var;
      float* local_flat = kLocalFlat ? f.local_flat + off : f.local_flat;
      UpdateRangeCPU<kKind, kClip, kAdaptive, kPrev, kLocalFlat>(
          b, e, ParamsOf(cfg.p, t, k), t.out[k], t.in[k], f.global_w + off, f.aux + off, est,
          var, local_flat);
    });
  });
}

void CopySegmentsCPU(MultiKind kind, int num, const HostSegmentTable& table,
                     const FlatArrays& f) {
  const SegmentTable& t = table.view;
  ParallelFor(table.total, [&](int64_t begin, int64_t end) {
    ForEachSegment(t, num, begin, end, [&](int k, int64_t b, int64_t e) {
      const size_t bytes = static_cast<size_t>(e - b) * sizeof(float);
      float* flat = f.flat + t.offsets[k];
      if (kind == MultiKind::kGather) {
        std::memcpy(flat + b, t.in[k] + b, bytes);
      } else {
        std::memcpy(t.out[k] + b, flat + b, bytes);
      }
    });
  });
}

template <MultiKind kKind>
MXReturnValue ForwardCPU(const Attrs& attrs, std::vector<MXTensor>* inputs,
                         std::vector<MXTensor>* outputs, const OpResource& res) {
  (void)res;
  MultiConfig cfg;
  if (!Prepare(attrs, kKind, inputs, outputs, &cfg)) return MX_FAIL;
  HostSegmentTable table;
  BuildTable(kKind, cfg, inputs, outputs, &table);
  const FlatArrays f = FlatArraysOf(kKind, cfg, inputs, outputs);
  if constexpr (!IsUpdate(kKind)) {
    CopySegmentsCPU(kKind, cfg.num, table, f);
  } else {
    DispatchFlags<kKind>(cfg.clip, cfg.adaptive, cfg.previous, cfg.local_flat,
                         [&](auto clip, auto adaptive, auto previous, auto local_flat) {
      MultiUpdateCPU<kKind, decltype(clip)::value, decltype(adaptive)::value,
                     decltype(previous)::value, decltype(local_flat)::value>(cfg, table, f);
    });
  }
  return MX_SUCCESS;
}

// ---------------------------------------------------------------------------------------
// GPU (only when built with nvcc against a CUDA build of MXNet)

#if defined(ODSGD_WITH_CUDA)
template <MultiKind kKind>
MXReturnValue ForwardGPU(const Attrs& attrs, std::vector<MXTensor>* inputs,
                         std::vector<MXTensor>* outputs, const OpResource& res) {
  MultiConfig cfg;
  if (!Prepare(attrs, kKind, inputs, outputs, &cfg)) return MX_FAIL;
  HostSegmentTable table;
  BuildTable(kKind, cfg, inputs, outputs, &table);
  void* stream = res.get_cuda_stream();
  const int64_t bytes = SegmentTableBytes(cfg.num);
  // MXNet's temporary workspace, valid for this call on this stream.
  void* device_table = res.alloc_gpu(static_cast<int>(bytes));
  int rc = device_table ? CopyHostToDeviceAsync(device_table, table.block.data(), bytes, stream)
                        : 2;  // cudaErrorMemoryAllocation
  if (rc == 0) {
    rc = LaunchMultiCuda(kKind, table.tiles, cfg.num, device_table, cfg.p, cfg.clip,
                         cfg.adaptive, cfg.previous, cfg.local_flat,
                         FlatArraysOf(kKind, cfg, inputs, outputs), stream);
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

#if defined(ODSGD_WITH_CUDA)
#define ODSGD_GPU_FORWARD(kind) .setForward(odsgd::ForwardGPU<kind>, "gpu")
#else
#define ODSGD_GPU_FORWARD(kind)
#endif

#define ODSGD_REGISTER_MULTI(name, kind)          \
  REGISTER_OP(name)                               \
      .setParseAttrs(odsgd::ParseAttrs<kind>)     \
      .setInferType(odsgd::InferType<kind>)       \
      .setInferShape(odsgd::InferShape<kind>)     \
      .setMutateInputs(odsgd::MutateInputs<kind>) \
      ODSGD_GPU_FORWARD(kind)                     \
      .setForward(odsgd::ForwardCPU<kind>, "cpu");

ODSGD_REGISTER_MULTI(odsgd_multi_local_update, odsgd::MultiKind::kLocal)
ODSGD_REGISTER_MULTI(odsgd_multi_predict_update, odsgd::MultiKind::kPredict)
ODSGD_REGISTER_MULTI(odsgd_multi_nag_predict_update, odsgd::MultiKind::kNagPredict)
ODSGD_REGISTER_MULTI(odsgd_gather, odsgd::MultiKind::kGather)
ODSGD_REGISTER_MULTI(odsgd_scatter, odsgd::MultiKind::kScatter)

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
