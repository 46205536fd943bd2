/*
 * Per-element math of the OD-SGD local update (SPEC.md section 2), shared by the CPU
 * kernels in local_update_op.cc and the CUDA kernels in local_update_op_gpu.cu so that
 * both devices compute the same expression in the same order.
 *
 * Every operation is float32 and follows the order of the formulas in SPEC.md (and of
 * tests/od_reference.py), so results agree with the NumPy reference to float32 rounding.
 */
#ifndef ODSGD_KVSTORE_EXT_LOCAL_UPDATE_KERNELS_H_
#define ODSGD_KVSTORE_EXT_LOCAL_UPDATE_KERNELS_H_

#include <cmath>
#include <cstdint>
#include <type_traits>

#if defined(__CUDACC__)
#define ODSGD_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define ODSGD_HOST_DEVICE inline __attribute__((always_inline))
#endif

namespace odsgd {

/*! \brief Hyper-parameters of one call, already converted to float32.
 *  Plain old data so it can be passed by value to a CUDA kernel. */
struct UpdateParams {
  float rescale_grad;    // r: multiplies the raw gradient
  float clip_gradient;   // clip bound; only read by the kClip instantiations
  float lr;              // local learning rate (predict: the global optimizer's lr)
  float momentum;        // mu
  float wd;              // weight decay
  float lam;             // compensation strength, 0 turns the term off
  float beta;            // adaptive mode: decay of v
  float one_minus_beta;  // (float)(1.0 - beta) computed in double, as the reference does
  float eps;             // adaptive mode: added to v before the square root
  float num_workers;     // predict only: N, the number of workers
};

/*! \brief g = r * grad, clipped to [-clip, clip] when kClip. */
template <bool kClip>
ODSGD_HOST_DEVICE float RescaleClip(const UpdateParams& p, float grad) {
  float g = p.rescale_grad * grad;
  if (kClip) {
    // Written with comparisons rather than fminf/fmaxf so that GCC turns it into
    // min/max vector instructions without -ffast-math.
    g = g > p.clip_gradient ? p.clip_gradient : g;
    g = g < -p.clip_gradient ? -p.clip_gradient : g;
  }
  return g;
}

/*! \brief c of SPEC section 2; in adaptive mode updates v first (v = beta v + (1-beta) g g). */
template <bool kAdaptive>
ODSGD_HOST_DEVICE float CompensationScale(const UpdateParams& p, float g, float* v) {
  if (!kAdaptive) return 1.0f;
  const float v_new = p.beta * *v + p.one_minus_beta * g * g;
  *v = v_new;
  return 1.0f / sqrtf(v_new + p.eps);
}

/*!
 * \brief One element of the local SGD step. Returns w_{t+1}; updates m (and v) in place.
 *  step = g + wd W + lam c g g (W - w);  m = mu m - lr step;  w_{t+1} = W + m
 */
template <bool kClip, bool kAdaptive>
ODSGD_HOST_DEVICE float LocalStep(const UpdateParams& p, float w, float grad, float W,
                                  float* m, float* v) {
  const float g = RescaleClip<kClip>(p, grad);
  const float c = CompensationScale<kAdaptive>(p, g, v);
  const float step = g + p.wd * W + p.lam * c * g * g * (W - w);
  const float m_new = p.momentum * *m - p.lr * step;
  *m = m_new;
  return W + m_new;
}

/*!
 * \brief One element of the 'predict' step. Returns w_{t+1}; updates v in adaptive mode.
 *  gc = g + lam c g g (W - w);  w_{t+1} = W + mu (W - W_prev) - lr (N gc + wd W)
 */
template <bool kClip, bool kAdaptive>
ODSGD_HOST_DEVICE float PredictStep(const UpdateParams& p, float w, float grad, float W,
                                    float W_prev, float* v) {
  const float g = RescaleClip<kClip>(p, grad);
  const float c = CompensationScale<kAdaptive>(p, g, v);
  const float gc = g + p.lam * c * g * g * (W - w);
  return W + p.momentum * (W - W_prev) - p.lr * (p.num_workers * gc + p.wd * W);
}

/*!
 * \brief Calls fn(clip, adaptive) with each flag as std::true_type or std::false_type, so
 *  that fn can pick the kernel instantiation: decltype(clip)::value is a constant there.
 */
template <typename Fn>
void DispatchFlags(bool clip, bool adaptive, Fn fn) {
  if (clip) {
    if (adaptive) fn(std::true_type(), std::true_type());
    else fn(std::true_type(), std::false_type());
  } else {
    if (adaptive) fn(std::false_type(), std::true_type());
    else fn(std::false_type(), std::false_type());
  }
}

#if defined(ODSGD_WITH_CUDA)
/*
 * CUDA launchers, defined in local_update_op_gpu.cu. Pointers are device pointers; `stream`
 * is the cudaStream_t MXNet hands the operator (void* here so that this header and the .cc
 * file need no CUDA headers). `w` is read and written in place; `var` is only touched when
 * adaptive. Return 0 on success, otherwise a cudaError_t value.
 */
int LaunchLocalUpdateCuda(int64_t n, const UpdateParams& p, bool clip, bool adaptive, float* w,
                          const float* grad, const float* global_w, float* mom, float* var,
                          void* stream);
int LaunchPredictUpdateCuda(int64_t n, const UpdateParams& p, bool clip, bool adaptive,
                            float* w, const float* grad, const float* global_w,
                            const float* prev_global_w, float* var, void* stream);
/*! \brief Asynchronous device-to-device copy of `bytes` bytes on `stream`. */
int CopyDeviceAsync(void* dst, const void* src, int64_t bytes, void* stream);
/*! \brief Text of a cudaError_t returned by the functions above. */
const char* CudaErrorString(int code);
#endif  // ODSGD_WITH_CUDA

}  // namespace odsgd

#endif  // ODSGD_KVSTORE_EXT_LOCAL_UPDATE_KERNELS_H_
