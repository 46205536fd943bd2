/*
 * CUDA kernels of the fused OD-SGD operators (multi_update_op.cc): the local updates,
 * gather and scatter of a group of P arrays (one array is P = 1) in one launch.
 *
 * Compiled by `python -m odsgd.native build` when nvcc is on PATH and the installed MXNet is
 * a CUDA build (multi_update_op.cc then registers its "gpu" forward functions,
 * -DODSGD_WITH_CUDA), by `python -m odsgd.native check-cuda` (run by `make test`) on any
 * machine, to check that it compiles, and with gpu_check_driver.cu by
 * `python -m odsgd.native check-gpu`, which runs it without MXNet.
 *
 * The per-element code (UpdateAt: LocalUpdateAt, PredictUpdateAt, NagPredictUpdateAt) is
 * local_update_kernels.h, shared with the CPU kernels. Block b covers tile b of the call: a
 * run of kCudaTileElements elements inside one array (local_update_kernels.h), whose array
 * it finds once, by a binary search of the table's tile starts (a few loads of a table that
 * stays in the L1 cache); an element never searches. The weights are written, never loaded;
 * with kLocalFlat w_t is loaded from local_flat and w_{t+1} stored there too (WeightAt,
 * StoreWeight).
 */
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "local_update_kernels.h"

namespace odsgd {
namespace {

/*!
 * \brief This thread's elements of a tile: i = begin + r * kCudaThreadsPerBlock for
 *  r < kCudaElementsPerThread, those below `end`, all in one array. All their loads are
 *  issued first, into registers, and only then computed and stored: the kernel is bound by
 *  memory latency and bandwidth, and the compiler would not move a load above an earlier
 *  store itself (it cannot tell that the arrays do not overlap; the operator refuses arrays
 *  that do; local_flat is read and written at the same i).
 */
template <MultiKind kKind, bool kClip, bool kAdaptive, bool kPrev, bool kLocalFlat>
__device__ __forceinline__ void UpdateTile(int64_t begin, int64_t end, const UpdateParams& p,
                                           float* w, const float* grad, const float* global_w,
                                           float* aux, float* est, float* var,
                                           float* local_flat) {
  constexpr int kR = kCudaElementsPerThread;
  constexpr bool kWritesAux = kKind == MultiKind::kLocal;   // mom; the predicts read W_prev
  constexpr bool kEst = kUsesEst<kKind, kPrev>;
  float rw[kR], rgrad[kR], rglobal[kR], raux[kR], rest[kR], rvar[kR], rlocal[kR];
#pragma unroll
  for (int r = 0; r < kR; ++r) {
    const int64_t i = begin + static_cast<int64_t>(r) * kCudaThreadsPerBlock;
    if (i < end) {
      if (kLocalFlat) rlocal[r] = local_flat[i];
      rgrad[r] = grad[i];
      rglobal[r] = global_w[i];
      raux[r] = aux[i];
      if (kEst) rest[r] = est[i];
      if (kAdaptive) rvar[r] = var[i];
    }
  }
#pragma unroll
  for (int r = 0; r < kR; ++r) {
    const int64_t i = begin + static_cast<int64_t>(r) * kCudaThreadsPerBlock;
    if (i < end) {
      // The same per-element code as the CPU, on this thread's registers.
      UpdateAt<kKind, kClip, kAdaptive, kPrev, kLocalFlat>(r, p, rw, rgrad, rglobal, raux, rest,
                                                           rvar, rlocal);
      w[i] = rw[r];
      if (kLocalFlat) local_flat[i] = rlocal[r];
      if (kWritesAux) aux[i] = raux[r];
      if (kEst) est[i] = rest[r];
      if (kAdaptive) var[i] = rvar[r];
    }
  }
}

/*! \brief Gather or scatter of this thread's elements of a tile (see UpdateTile). */
__device__ __forceinline__ void CopyTile(int64_t begin, int64_t end, const float* src,
                                         float* dst) {
  float value[kCudaElementsPerThread];
#pragma unroll
  for (int r = 0; r < kCudaElementsPerThread; ++r) {
    const int64_t i = begin + static_cast<int64_t>(r) * kCudaThreadsPerBlock;
    if (i < end) value[r] = src[i];
  }
#pragma unroll
  for (int r = 0; r < kCudaElementsPerThread; ++r) {
    const int64_t i = begin + static_cast<int64_t>(r) * kCudaThreadsPerBlock;
    if (i < end) dst[i] = value[r];
  }
}

/*! \brief All arrays of a multi-array call, one tile per block; kKind picks update,
 *  gather or scatter. */
template <MultiKind kKind, bool kClip, bool kAdaptive, bool kPrev, bool kLocalFlat>
__global__ void __launch_bounds__(kCudaThreadsPerBlock)
    MultiKernel(int num, const void* __restrict__ table_block, UpdateParams p, FlatArrays f) {
  const SegmentTable t = ViewSegmentTable(table_block, num);
  const int64_t tile = blockIdx.x;
  const int k = FindSegment(t.tiles, num, tile);      // once per block, uniform
  const int64_t off = t.offsets[k];
  const int64_t first = (tile - t.tiles[k]) * kCudaTileElements;
  const int64_t size = t.offsets[k + 1] - off;
  const int64_t end = first + kCudaTileElements < size ? first + kCudaTileElements : size;
  const int64_t begin = first + threadIdx.x;
  if constexpr (kKind == MultiKind::kGather) {
    CopyTile(begin, end, t.in[k], f.flat + off);
  } else if constexpr (kKind == MultiKind::kScatter) {
    CopyTile(begin, end, f.flat + off, t.out[k]);
  } else {
    // est, var and local_flat are only offset where they are real arrays (not placeholders).
    float* est = kUsesEst<kKind, kPrev> ? f.est + off : f.est;
    float* var = kAdaptive ? f.var + off : f.var;
    float* local_flat = kLocalFlat ? f.local_flat + off : f.local_flat;
    UpdateTile<kKind, kClip, kAdaptive, kPrev, kLocalFlat>(
        begin, end, ParamsOf(p, t, k), t.out[k], t.in[k], f.global_w + off, f.aux + off, est,
        var, local_flat);
  }
}

template <MultiKind kKind>
void LaunchMulti(unsigned int blocks, cudaStream_t s, int num, const void* table,
                 const UpdateParams& p, bool clip, bool adaptive, bool previous, bool local_flat,
                 const FlatArrays& f) {
  DispatchFlags<kKind>(clip, adaptive, previous, local_flat,
                       [&](auto kclip, auto kadaptive, auto kprevious, auto klocal) {
    MultiKernel<kKind, decltype(kclip)::value, decltype(kadaptive)::value,
                decltype(kprevious)::value, decltype(klocal)::value>
        <<<blocks, kCudaThreadsPerBlock, 0, s>>>(num, table, p, f);
  });
}

}  // namespace

int LaunchMultiCuda(MultiKind kind, int64_t tiles, int num, const void* device_table,
                    const UpdateParams& p, bool clip, bool adaptive, bool previous,
                    bool local_flat, const FlatArrays& flat, void* stream) {
  if (tiles == 0) return 0;
  // A grid has at most 2^31 - 1 blocks: 2.2e12 elements, far beyond any GPU's memory.
  if (tiles > INT_MAX) return static_cast<int>(cudaErrorInvalidConfiguration);
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const auto blocks = static_cast<unsigned int>(tiles);
  switch (kind) {
    case MultiKind::kLocal:
      LaunchMulti<MultiKind::kLocal>(blocks, s, num, device_table, p, clip, adaptive, false,
                                     local_flat, flat);
      break;
    case MultiKind::kPredict:
      LaunchMulti<MultiKind::kPredict>(blocks, s, num, device_table, p, clip, adaptive,
                                       previous, local_flat, flat);
      break;
    case MultiKind::kNagPredict:
      LaunchMulti<MultiKind::kNagPredict>(blocks, s, num, device_table, p, clip, adaptive,
                                          previous, local_flat, flat);
      break;
    case MultiKind::kGather:
      // Copies take no flags: one instantiation each.
      MultiKernel<MultiKind::kGather, false, false, false, false>
          <<<blocks, kCudaThreadsPerBlock, 0, s>>>(num, device_table, p, flat);
      break;
    case MultiKind::kScatter:
      MultiKernel<MultiKind::kScatter, false, false, false, false>
          <<<blocks, kCudaThreadsPerBlock, 0, s>>>(num, device_table, p, flat);
      break;
  }
  return static_cast<int>(cudaGetLastError());
}

int CopyHostToDeviceAsync(void* dst, const void* src, int64_t bytes, void* stream) {
  return static_cast<int>(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes),
                                          cudaMemcpyHostToDevice,
                                          static_cast<cudaStream_t>(stream)));
}

const char* CudaErrorString(int code) {
  return cudaGetErrorString(static_cast<cudaError_t>(code));
}

}  // namespace odsgd
