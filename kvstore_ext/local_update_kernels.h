/*
 * Per-element math of the OD-SGD local update (docs/spec.md, section 4) and the per-array table of
 * a multi-array call, shared by the CPU kernels in multi_update_op.cc, the CUDA kernels in
 * local_update_op_gpu.cu and the CUDA test driver gpu_check_driver.cu, so that every device
 * computes the same expression in the same order.
 *
 * Every operation is float32 and follows the order of the formulas in docs/spec.md (and of
 * tests/od_reference.py), so results agree with the NumPy reference to float32 rounding.
 */
#ifndef ODSGD_KVSTORE_EXT_LOCAL_UPDATE_KERNELS_H_
#define ODSGD_KVSTORE_EXT_LOCAL_UPDATE_KERNELS_H_

#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

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
  float own_scale;       // predicts only: the weight of gc in the estimate G_hat of round t's sum
  float prev_scale;      // predicts with kPrev only: the weight of lr_{t-1} G_{t-1} in lr G_hat
  float prev_decay;      // NAG predict, and predict with kPrev: lr * wd of the round that made W
  float one_plus_momentum;  // NAG predict only: momentum + 1.0f in float32, as MXNet's kernel
};

/*!
 * \brief The shared hyper-parameters of a call from its attribute values. Each is rounded to
 *  float32 once, as the NumPy reference's np.float32(x) does; 1 - beta is formed in double
 *  first (like the reference), 1 + momentum in float32 (like MXNet's nag_mom_update). lr, wd,
 *  own_scale, prev_scale and prev_decay are per array (ParamsOf).
 */
inline UpdateParams MakeUpdateParams(double rescale_grad, double clip_gradient, double momentum,
                                     double lam, double beta, double eps) {
  UpdateParams p{};
  p.rescale_grad = static_cast<float>(rescale_grad);
  p.clip_gradient = static_cast<float>(clip_gradient);
  p.momentum = static_cast<float>(momentum);
  p.lam = static_cast<float>(lam);
  p.beta = static_cast<float>(beta);
  p.one_minus_beta = static_cast<float>(1.0 - beta);
  p.eps = static_cast<float>(eps);
  p.one_plus_momentum = p.momentum + 1.0f;
  return p;
}

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

/*! \brief c of docs/spec.md, section 4; in adaptive mode updates v first (v = beta v + (1-beta) g g). */
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
 *  gc = g + lam c g g (W - w);  w_{t+1} = W + mu (W - W_prev) - lr (s_own gc + wd W)
 *  (s_own = N: the default estimate N gc of round t's sum, docs/predict.md). With kPrev the
 *  estimate also takes the previous round's sum: SGD's server momentum after round t-1 is
 *  W - W_prev, and *est holds the one before it (W_prev - W_prev2, this step's last call), so
 *  mom_t = mu mom_{t-1} - lr_{t-1} (G_{t-1} + wd_{t-1} W_prev) gives
 *  P = lr_{t-1} G_{t-1} = mu est - (W - W_prev) - prev_decay W_prev;  est = W - W_prev;
 *  w_{t+1} -= s_prev P   (s_prev = c_prev lr_t / lr_{t-1}).
 */
template <bool kClip, bool kAdaptive, bool kPrev>
ODSGD_HOST_DEVICE float PredictStep(const UpdateParams& p, float w, float grad, float W,
                                    float W_prev, float* est, float* v) {
  const float g = RescaleClip<kClip>(p, grad);
  const float c = CompensationScale<kAdaptive>(p, g, v);
  const float gc = g + p.lam * c * g * g * (W - w);
  const float next = W + p.momentum * (W - W_prev) - p.lr * (p.own_scale * gc + p.wd * W);
  if (!kPrev) return next;
  const float dW = W - W_prev;
  const float prev_sum = p.momentum * *est - dW - p.prev_decay * W_prev;
  *est = dW;
  return next - p.prev_scale * prev_sum;
}

/*!
 * \brief One element of the 'predict' step for the global optimizer NAG (docs/predict.md).
 *  Returns w_{t+1}; updates m, the estimate of the servers' NAG state (and v), in place.
 *  MXNet 1.9.1's nag_mom_update, in place on the servers, does a = mu mom;
 *  W' = (W - a) + (1 + mu) (a - lr (G + wd W)); mom' = a - lr (G + wd W') (it reads the
 *  weight after writing it), so from dW = W_t - W_{t-1} and the previous round's lr * wd:
 *  m  = (dW + mu m) / (1 + mu) - prev_decay dW
 *  gc = g + lam c g g (W - w);  d = s_own gc + wd W;  a = mu m
 *  w_{t+1} = (W - a) + (1 + mu) (a - lr d)          (NAG's weight update with G = s_own gc)
 *  With kPrev the estimate also takes the previous round's sum, which the state rule
 *  mom_t = mu mom_{t-1} - lr_{t-1} G_{t-1} - prev_decay W gives from m before and after:
 *  P = lr_{t-1} G_{t-1} = mu m_old - m - prev_decay W;  the bracket becomes
 *  (a - lr d - s_prev P).
 */
template <bool kClip, bool kAdaptive, bool kPrev>
ODSGD_HOST_DEVICE float NagPredictStep(const UpdateParams& p, float w, float grad, float W,
                                       float W_prev, float* m, float* v) {
  const float g = RescaleClip<kClip>(p, grad);
  const float c = CompensationScale<kAdaptive>(p, g, v);
  const float gc = g + p.lam * c * g * g * (W - w);
  const float dW = W - W_prev;
  const float m_old = *m;
  const float m_t = (dW + p.momentum * m_old) / p.one_plus_momentum - p.prev_decay * dW;
  *m = m_t;
  const float a = p.momentum * m_t;
  const float d = p.own_scale * gc + p.wd * W;
  float bracket = a - p.lr * d;
  if (kPrev) bracket = bracket - p.prev_scale * (p.momentum * m_old - m_t - p.prev_decay * W);
  return (W - a) + p.one_plus_momentum * bracket;
}

/*!
 * \brief The old local weight w_t of element i, as the update kinds read it: with kLocalFlat
 *  local_flat[i], the store's flat copy of the weights (which the update then overwrites with
 *  w_{t+1}, StoreWeight), else W_t itself (global_w[i]). Every kind reads w_t only in the
 *  compensation term lam c g g (W - w), which without kLocalFlat is lam c g g * 0: the
 *  operator refuses lam != 0 without local_flat, so the term is zero either way (for any
 *  finite w_t) and the result is the same. The weights themselves are never read, for any
 *  lam: they are outputs only (multi_update_op.cc).
 */
template <bool kLocalFlat>
ODSGD_HOST_DEVICE float WeightAt(int64_t i, const float* local_flat, const float* global_w) {
  return kLocalFlat ? local_flat[i] : global_w[i];
}

/*! \brief w_{t+1} of element i into the weight and, with kLocalFlat, into local_flat: one
 *  value written twice, so the two stay bit-equal. */
template <bool kLocalFlat>
ODSGD_HOST_DEVICE void StoreWeight(int64_t i, float next, float* w, float* local_flat) {
  w[i] = next;
  if (kLocalFlat) local_flat[i] = next;
}

/*!
 * \brief One element i of the local SGD step on whole arrays: the loop body of the CPU
 *  kernels and of the CUDA kernels alike. w is only written; w_t is read from local_flat
 *  (kLocalFlat) or not at all (WeightAt).
 */
template <bool kClip, bool kAdaptive, bool kLocalFlat>
ODSGD_HOST_DEVICE void LocalUpdateAt(int64_t i, const UpdateParams& p, float* w,
                                     const float* grad, const float* global_w, float* mom,
                                     float* var, float* local_flat) {
  float m = mom[i];
  float v = kAdaptive ? var[i] : 0.0f;
  const float next = LocalStep<kClip, kAdaptive>(p, WeightAt<kLocalFlat>(i, local_flat, global_w),
                                                 grad[i], global_w[i], &m, &v);
  StoreWeight<kLocalFlat>(i, next, w, local_flat);
  mom[i] = m;
  if (kAdaptive) var[i] = v;
}

/*! \brief One element i of the 'predict' step on whole arrays (see LocalUpdateAt); `est`
 *  (the last change of the global weights) is only touched when kPrev. */
template <bool kClip, bool kAdaptive, bool kPrev, bool kLocalFlat>
ODSGD_HOST_DEVICE void PredictUpdateAt(int64_t i, const UpdateParams& p, float* w,
                                       const float* grad, const float* global_w,
                                       const float* prev_global_w, float* est, float* var,
                                       float* local_flat) {
  float e = kPrev ? est[i] : 0.0f;
  float v = kAdaptive ? var[i] : 0.0f;
  const float next = PredictStep<kClip, kAdaptive, kPrev>(
      p, WeightAt<kLocalFlat>(i, local_flat, global_w), grad[i], global_w[i], prev_global_w[i],
      &e, &v);
  StoreWeight<kLocalFlat>(i, next, w, local_flat);
  if (kPrev) est[i] = e;
  if (kAdaptive) var[i] = v;
}

/*! \brief One element i of the NAG 'predict' step on whole arrays (see LocalUpdateAt);
 *  `est` is the estimate m of the servers' NAG state. */
template <bool kClip, bool kAdaptive, bool kPrev, bool kLocalFlat>
ODSGD_HOST_DEVICE void NagPredictUpdateAt(int64_t i, const UpdateParams& p, float* w,
                                          const float* grad, const float* global_w,
                                          const float* prev_global_w, float* est, float* var,
                                          float* local_flat) {
  float m = est[i];
  float v = kAdaptive ? var[i] : 0.0f;
  const float next = NagPredictStep<kClip, kAdaptive, kPrev>(
      p, WeightAt<kLocalFlat>(i, local_flat, global_w), grad[i], global_w[i], prev_global_w[i],
      &m, &v);
  StoreWeight<kLocalFlat>(i, next, w, local_flat);
  est[i] = m;
  if (kAdaptive) var[i] = v;
}

/*! \brief What a multi-array kernel does besides the per-array table. kNagPredict is the
 *  'predict' step for the global optimizer NAG. */
enum class MultiKind { kLocal, kPredict, kNagPredict, kGather, kScatter };

/*! \brief Whether an update kind reads and writes `est`: the NAG estimate always, the SGD
 *  predict's last weight change only when it uses the previous round's sum (kPrev). */
template <MultiKind kKind, bool kPrev>
constexpr bool kUsesEst =
    kKind == MultiKind::kNagPredict || (kKind == MultiKind::kPredict && kPrev);

/*!
 * \brief One element i of an update kind (kLocal, kPredict, kNagPredict) on whole arrays:
 *  `aux` is mom (kLocal, written) or prev_global_weight (the predicts, read only); `est` is
 *  only touched where kUsesEst, `var` only when kAdaptive, `local_flat` only when kLocalFlat.
 *  kPrev (the predicts' estimate takes the previous round's sum) means nothing to kLocal.
 *  w is written, never read (WeightAt).
 */
template <MultiKind kKind, bool kClip, bool kAdaptive, bool kPrev, bool kLocalFlat>
ODSGD_HOST_DEVICE void UpdateAt(int64_t i, const UpdateParams& p, float* w, const float* grad,
                                const float* global_w, float* aux, float* est, float* var,
                                float* local_flat) {
  static_assert(kKind == MultiKind::kLocal || kKind == MultiKind::kPredict ||
                kKind == MultiKind::kNagPredict, "UpdateAt takes the update kinds only");
  if (kKind == MultiKind::kLocal) {
    LocalUpdateAt<kClip, kAdaptive, kLocalFlat>(i, p, w, grad, global_w, aux, var, local_flat);
  } else if (kKind == MultiKind::kPredict) {
    PredictUpdateAt<kClip, kAdaptive, kPrev, kLocalFlat>(i, p, w, grad, global_w, aux, est, var,
                                                         local_flat);
  } else {
    NagPredictUpdateAt<kClip, kAdaptive, kPrev, kLocalFlat>(i, p, w, grad, global_w, aux, est,
                                                            var, local_flat);
  }
}

/*!
 * \brief Calls fn(flag) with std::true_type or std::false_type, so that fn can pick a
 *  template instantiation: decltype(flag)::value is a constant there. Nest calls for
 *  several flags.
 */
template <typename Fn>
void DispatchBool(bool flag, Fn fn) {
  if (flag) {
    fn(std::true_type());
  } else {
    fn(std::false_type());
  }
}

/*! \brief DispatchBool for the (clip, adaptive, previous, local_flat) flags of an update
 *  kernel of kind kKind: fn(kclip, kadaptive, kprevious, klocal). kPrev means nothing to
 *  kLocal, which gets std::false_type only (no instantiations that differ in nothing). */
template <MultiKind kKind, typename Fn>
void DispatchFlags(bool clip, bool adaptive, bool previous, bool local_flat, Fn fn) {
  DispatchBool(clip, [&](auto kclip) {
    DispatchBool(adaptive, [&](auto kadaptive) {
      DispatchBool(local_flat, [&](auto klocal) {
        if constexpr (kKind == MultiKind::kLocal) {
          fn(kclip, kadaptive, std::false_type(), klocal);
        } else {
          DispatchBool(previous, [&](auto kprevious) { fn(kclip, kadaptive, kprevious, klocal); });
        }
      });
    });
  });
}

// ---------------------------------------------------------------------------------------
// Multi-array calls: P arrays of any sizes n_k, laid end to end in a flat layout with
// offsets off_0 = 0, off_{k+1} = off_k + n_k (the states and the global weights are flat
// arrays of length off_P; the weights and gradients stay separate arrays). One array is
// the case P = 1: there is no other operator.

// A CUDA block of a multi-array kernel covers one tile: kCudaTileElements consecutive
// elements of one array, never two arrays, so that it looks its array up once (by its block
// index, in the table's tile starts) instead of once per element. Each of its threads
// handles kCudaElementsPerThread elements, a block apart (coalesced).
constexpr int kCudaThreadsPerBlock = 256;
constexpr int kCudaElementsPerThread = 4;
constexpr int64_t kCudaTileElements = kCudaThreadsPerBlock * kCudaElementsPerThread;

/*!
 * \brief The per-array part of a multi-array call, as one block of memory (host or device):
 *  offsets[P+1] and tiles[P+1] (int64: the first flat element and the first CUDA tile of
 *  array k; [P] holds the totals), out[P] and in[P] (float pointers: the written arrays,
 *  e.g. the weights, and the read ones, e.g. the gradients), lr[P], wd[P], prev_decay[P],
 *  own_scale[P] and prev_scale[P] (float32; the last three are only read by the predicts,
 *  prev_scale only with kPrev, prev_decay by the NAG predict and with kPrev; 0 otherwise).
 */
struct SegmentTable {
  const int64_t* offsets;
  const int64_t* tiles;
  float* const* out;
  const float* const* in;
  const float* lr;
  const float* wd;
  const float* prev_decay;
  const float* own_scale;
  const float* prev_scale;
};

/*! \brief Bytes of a SegmentTable block for `num` arrays (every part stays 8-byte aligned). */
inline int64_t SegmentTableBytes(int num) {
  const int64_t floats = 5 * static_cast<int64_t>(num) * static_cast<int64_t>(sizeof(float));
  return 2 * static_cast<int64_t>(num + 1) * 8 + 2 * static_cast<int64_t>(num) * 8 +
         ((floats + 7) / 8) * 8;
}

/*! \brief The SegmentTable view of a block laid out as SegmentTableBytes describes. */
ODSGD_HOST_DEVICE SegmentTable ViewSegmentTable(const void* block, int num) {
  const char* base = static_cast<const char*>(block);
  const int64_t n = num;
  SegmentTable t;
  t.offsets = reinterpret_cast<const int64_t*>(base);
  t.tiles = t.offsets + (n + 1);
  t.out = reinterpret_cast<float* const*>(base + 2 * (n + 1) * 8);
  t.in = reinterpret_cast<const float* const*>(base + (3 * n + 2) * 8);
  t.lr = reinterpret_cast<const float*>(base + (4 * n + 2) * 8);
  t.wd = t.lr + num;
  t.prev_decay = t.wd + num;
  t.own_scale = t.prev_decay + num;
  t.prev_scale = t.own_scale + num;
  return t;
}

/*! \brief What a call says about array k, for BuildSegmentTable. */
struct SegmentSpec {
  int64_t size;         // elements
  float* out;           // the array written (weights[k]; scatter: arrays[k]), or nullptr
  const float* in;      // the array read (grads[k]; gather: arrays[k]), or nullptr
  float lr, wd, prev_decay, own_scale, prev_scale;
};

/*! \brief A SegmentTable block in host memory, built by BuildSegmentTable. */
struct HostSegmentTable {
  std::vector<int64_t> block;   // int64 storage keeps every part 8-byte aligned
  SegmentTable view;
  int64_t total = 0;            // elements of all arrays (offsets[P])
  int64_t tiles = 0;            // CUDA blocks of a call (tiles[P])
};

/*! \brief Lays out the table of `specs` (array k = specs[k]) in host memory. */
inline void BuildSegmentTable(const std::vector<SegmentSpec>& specs, HostSegmentTable* table) {
  const int num = static_cast<int>(specs.size());
  table->block.assign(static_cast<size_t>((SegmentTableBytes(num) + 7) / 8), 0);
  table->view = ViewSegmentTable(table->block.data(), num);
  // The view's parts are const for the kernels; this is the one place that fills them.
  auto* offsets = const_cast<int64_t*>(table->view.offsets);
  auto* tiles = const_cast<int64_t*>(table->view.tiles);
  auto* out = const_cast<float**>(table->view.out);
  auto* in = const_cast<const float**>(table->view.in);
  auto* lr = const_cast<float*>(table->view.lr);
  auto* wd = const_cast<float*>(table->view.wd);
  auto* prev_decay = const_cast<float*>(table->view.prev_decay);
  auto* own_scale = const_cast<float*>(table->view.own_scale);
  auto* prev_scale = const_cast<float*>(table->view.prev_scale);
  int64_t total = 0, tile = 0;
  for (int k = 0; k < num; ++k) {
    const SegmentSpec& s = specs[k];
    offsets[k] = total;
    tiles[k] = tile;
    out[k] = s.out;
    in[k] = s.in;
    lr[k] = s.lr;
    wd[k] = s.wd;
    prev_decay[k] = s.prev_decay;
    own_scale[k] = s.own_scale;
    prev_scale[k] = s.prev_scale;
    total += s.size;
    tile += (s.size + kCudaTileElements - 1) / kCudaTileElements;
  }
  offsets[num] = total;
  tiles[num] = tile;
  table->total = total;
  table->tiles = tile;
}

/*! \brief The array k that holds position i of a table column of starts (offsets for a
 *  flat element, tiles for a CUDA block; 0 <= i < starts[num]): the largest k with
 *  starts[k] <= i, which skips empty arrays (starts[k] == starts[k+1]). */
ODSGD_HOST_DEVICE int FindSegment(const int64_t* starts, int num, int64_t i) {
  int lo = 0, hi = num;
  while (hi - lo > 1) {
    const int mid = lo + (hi - lo) / 2;
    if (starts[mid] <= i) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}

/*! \brief Hyper-parameters of array k: the call's, with array k's lr, wd, prev_decay,
 *  own_scale and prev_scale. */
ODSGD_HOST_DEVICE UpdateParams ParamsOf(const UpdateParams& p, const SegmentTable& t, int k) {
  UpdateParams q = p;
  q.lr = t.lr[k];
  q.wd = t.wd[k];
  q.prev_decay = t.prev_decay[k];
  q.own_scale = t.own_scale[k];
  q.prev_scale = t.prev_scale[k];
  return q;
}

/*! \brief The flat arrays of a multi-array call (device or host pointers). `aux` is mom
 *  (kLocal) or prev_global_weight (kPredict, kNagPredict); `est` the worker's copy of the
 *  servers' optimizer state (kNagPredict: the estimate of the NAG state; kPredict with
 *  kPrev: the last change of the global weights, SGD's momentum); `var` and `local_flat`
 *  (w_t in, w_{t+1} out) are only touched when the call is adaptive / has kLocalFlat. For
 *  kGather/kScatter only `flat` is used. */
struct FlatArrays {
  const float* global_w;
  float* aux;
  float* var;
  float* local_flat;
  float* flat;
  float* est;
};

#if defined(ODSGD_WITH_CUDA)
/*
 * CUDA launchers, defined in local_update_op_gpu.cu. Pointers are device pointers; `stream`
 * is the cudaStream_t MXNet hands the operator (void* here so that this header and the .cc
 * files need no CUDA headers). Return 0 on success, otherwise a cudaError_t value.
 */
/*!
 * \brief One kernel over all arrays of a multi-array call: `tiles` blocks (the host table's
 *  tiles[P]; 0 launches nothing). `device_table` is the SegmentTable block of `num` arrays
 *  in device memory; `p` gives the shared hyper-parameters (each array's lr, wd,
 *  prev_decay, own_scale and prev_scale come from the table); `previous`: kPrev;
 *  `local_flat`: kLocalFlat (w_t read from flat.local_flat, w_{t+1} written there too).
 */
int LaunchMultiCuda(MultiKind kind, int64_t tiles, int num, const void* device_table,
                    const UpdateParams& p, bool clip, bool adaptive, bool previous,
                    bool local_flat, const FlatArrays& flat, void* stream);
/*! \brief Asynchronous copy of `bytes` bytes on `stream`, host (pageable) to device; the
 *  host buffer may be freed as soon as this returns (CUDA stages pageable memory first). */
int CopyHostToDeviceAsync(void* dst, const void* src, int64_t bytes, void* stream);
/*! \brief Text of a cudaError_t returned by the functions above. */
const char* CudaErrorString(int code);
#endif  // ODSGD_WITH_CUDA

}  // namespace odsgd

#endif  // ODSGD_KVSTORE_EXT_LOCAL_UPDATE_KERNELS_H_
