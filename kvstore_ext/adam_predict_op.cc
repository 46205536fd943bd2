/*
 * odsgd_adam_predict: the 'predict' step for a global Adam (docs/predict.md, "Adam: the state
 * recovered from the global steps") on one parameter, in one pass over memory, CPU only.
 *
 * Inputs (float32, the same number of elements each; any shapes):
 *   0 W       the global weights W_t                 3 m     Adam's m before the round (in/out)
 *   1 W_prev  the global weights W_{t-1}             4 v     Adam's v before the round (in/out)
 *   2 grad    the worker's raw gradient              5 own   its own estimate of the last
 *                                                            round's gradient (in/out)
 * Output: the parameter, w_{t+1} (shape of grad).
 * Attributes: advance (0: keep m and v, 1: advance them by own, 2: by the gradient recovered
 * from the step W_{t-1} - W_t at rate_prev), rate_prev, rate (Adam's rates with the bias
 * correction), wd, scale (rescale_grad x N), clip_gradient (<= 0: none), beta1, beta2, epsilon.
 *
 * Per element, in float32 and in the order of tests/od_reference.py (adam_predict_step,
 * recover_adam_sum), which the tests hold it to.
 */
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "lib_api.h"
#include "op_common.h"

namespace odsgd {
namespace {

constexpr const char* kOp = "odsgd_adam_predict";
constexpr int kInputs = 6;

struct AdamPredictParams {
  int advance;
  float rate_prev, rate, wd, scale, clip, beta1, beta2, one_minus_beta1, one_minus_beta2, eps;
};

bool ParseParams(const Attrs& attrs, AdamPredictParams* p) {
  double advance, rate_prev, rate, wd, scale, clip, beta1, beta2, eps;
  if (!GetNumber(attrs, kOp, "advance", &advance) ||
      !GetNumber(attrs, kOp, "rate_prev", &rate_prev) || !GetNumber(attrs, kOp, "rate", &rate) ||
      !GetNumber(attrs, kOp, "wd", &wd) || !GetNumber(attrs, kOp, "scale", &scale) ||
      !GetNumber(attrs, kOp, "clip_gradient", &clip) ||
      !GetNumber(attrs, kOp, "beta1", &beta1) || !GetNumber(attrs, kOp, "beta2", &beta2) ||
      !GetNumber(attrs, kOp, "epsilon", &eps)) {
    return false;
  }
  if (advance != 0 && advance != 1 && advance != 2) {
    MX_ERROR_MSG << kOp << ": attribute 'advance' must be 0, 1 or 2, got " << advance;
    return false;
  }
  if (advance == 2 && !(rate_prev > 0)) {
    MX_ERROR_MSG << kOp << ": advance=2 recovers the round from its step and needs "
                 << "rate_prev > 0, got " << rate_prev;
    return false;
  }
  p->advance = static_cast<int>(advance);
  p->rate_prev = static_cast<float>(rate_prev);
  p->rate = static_cast<float>(rate);
  p->wd = static_cast<float>(wd);
  p->scale = static_cast<float>(scale);
  p->clip = static_cast<float>(clip);
  p->beta1 = static_cast<float>(beta1);
  p->beta2 = static_cast<float>(beta2);
  // formed in double first, as the reference's np.float32(1 - beta) does
  p->one_minus_beta1 = static_cast<float>(1.0 - beta1);
  p->one_minus_beta2 = static_cast<float>(1.0 - beta2);
  p->eps = static_cast<float>(eps);
  return true;
}

inline float Sign(float x) { return static_cast<float>(x > 0.0f) - static_cast<float>(x < 0.0f); }

/*! \brief The recovered gradient of the round (recover_adam_sum of the reference), written
 *  without branches (selects only) so that GCC vectorises the loop. */
inline float Recover(const AdamPredictParams& p, float s, float m, float v, float own) {
  const float b = p.one_minus_beta1, e = p.one_minus_beta2;
  const float a = p.beta1 * m, c = p.beta2 * v;
  const float A = b * b - e * s * s;
  const bool solvable = std::fabs(A) > 1e-3f * b * b;
  const float safe = solvable ? A : 1.0f;
  const float q = b * b * c + a * a * e - s * s * e * c;
  const float spread = std::fabs(s) * std::sqrt(q > 0.0f ? q : 0.0f);
  const float inverse = 1.0f / safe;
  const float r1 = (spread - a * b) * inverse, r2 = (-spread - a * b) * inverse;
  // bitwise & and | (no short-circuit branches), so that the loop vectorises
  const bool zero = s == 0.0f;
  const bool f1 = solvable & ((Sign(a + b * r1) == Sign(s)) | zero);
  const bool f2 = solvable & ((Sign(a + b * r2) == Sign(s)) | zero);
  const float d1 = std::fabs(r1 - own), d2 = std::fabs(r2 - own);
  // the reference's order: the first fitting root, then the second where strictly nearer
  const float best = f1 ? r1 : own;
  return (f2 & (!f1 | (d2 < d1))) ? r2 : best;
}

template <int kAdvance>
void AdamPredictCPU(const AdamPredictParams& p, int64_t begin, int64_t end,
                    const float* __restrict__ W,
                    const float* __restrict__ W_prev, const float* __restrict__ grad,
                    float* __restrict__ M, float* __restrict__ V, float* __restrict__ own,
                    float* __restrict__ out) {
  const float b = p.one_minus_beta1, e = p.one_minus_beta2;
#pragma omp simd
  for (int64_t i = begin; i < end; ++i) {
    float m = M[i], v = V[i];
    if (kAdvance != 0) {
      const float G = kAdvance == 2 ? Recover(p, (W_prev[i] - W[i]) / p.rate_prev, m, v, own[i])
                                    : own[i];
      m = p.beta1 * m + b * G;
      v = p.beta2 * v + e * G * G;
    }
    float g = p.scale * grad[i] + p.wd * W[i];
    g = (p.clip > 0.0f) & (g > p.clip) ? p.clip : g;
    g = (p.clip > 0.0f) & (g < -p.clip) ? -p.clip : g;
    own[i] = g;
    const float m1 = p.beta1 * m + b * g;
    const float v1 = p.beta2 * v + e * g * g;
    out[i] = W[i] - p.rate * m1 / (std::sqrt(v1) + p.eps);
    M[i] = m;
    V[i] = v;
  }
}

MXReturnValue ParseAttrs(const Attrs& attrs, int* num_in, int* num_out) {
  AdamPredictParams p;
  if (!CheckKnownAttrs(attrs, kOp, {"advance", "rate_prev", "rate", "wd", "scale",
                                    "clip_gradient", "beta1", "beta2", "epsilon"}) ||
      !ParseParams(attrs, &p)) {
    return MX_FAIL;
  }
  *num_in = kInputs;
  *num_out = 1;
  return MX_SUCCESS;
}

MXReturnValue InferType(const Attrs& attrs, std::vector<int>* in_types,
                        std::vector<int>* out_types) {
  (void)attrs;
  for (int& t : *in_types) {
    if (t != -1 && t != mxnet::ext::kFloat32) {
      MX_ERROR_MSG << kOp << ": only float32 is supported, got dtype code " << t;
      return MX_FAIL;
    }
    t = mxnet::ext::kFloat32;
  }
  (*out_types)[0] = mxnet::ext::kFloat32;
  return MX_SUCCESS;
}

MXReturnValue InferShape(const Attrs& attrs, std::vector<std::vector<unsigned int>>* in_shapes,
                         std::vector<std::vector<unsigned int>>* out_shapes) {
  (void)attrs;
  const int64_t n = NumElements((*in_shapes)[2]);
  for (int k = 0; k < kInputs; ++k) {
    if (NumElements((*in_shapes)[k]) != n) {
      MX_ERROR_MSG << kOp << ": input " << k << " has " << NumElements((*in_shapes)[k])
                   << " elements, the gradient " << n << "; pass arrays of one parameter";
      return MX_FAIL;
    }
  }
  (*out_shapes)[0] = (*in_shapes)[2];
  return MX_SUCCESS;
}

MXReturnValue MutateInputs(const Attrs& attrs, std::vector<int>* input_indices) {
  (void)attrs;
  *input_indices = {3, 4, 5};
  return MX_SUCCESS;
}

MXReturnValue ForwardCPU(const Attrs& attrs, std::vector<MXTensor>* inputs,
                         std::vector<MXTensor>* outputs, const OpResource& res) {
  (void)res;
  AdamPredictParams p;
  if (!ParseParams(attrs, &p)) return MX_FAIL;
  auto& in = *inputs;
  int64_t n = 1;
  for (const int64_t d : in[2].shape) n *= d;
  const auto run = p.advance == 2 ? AdamPredictCPU<2>
                  : p.advance == 1 ? AdamPredictCPU<1> : AdamPredictCPU<0>;
  // the library's one threading rule (op_common.h): MXNet's thread count, 32768+ per thread
  ParallelFor(n, [&](int64_t begin, int64_t end) {
    run(p, begin, end, in[0].data<float>(), in[1].data<float>(), in[2].data<float>(),
        in[3].data<float>(), in[4].data<float>(), in[5].data<float>(),
        (*outputs)[0].data<float>());
  });
  return MX_SUCCESS;
}

}  // namespace
}  // namespace odsgd

REGISTER_OP(odsgd_adam_predict)
    .setParseAttrs(odsgd::ParseAttrs)
    .setInferType(odsgd::InferType)
    .setInferShape(odsgd::InferShape)
    .setMutateInputs(odsgd::MutateInputs)
    .setForward(odsgd::ForwardCPU, "cpu");
