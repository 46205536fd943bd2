/*
 * CUDA kernels of the fused OD-SGD operators (local_update_op.cc, multi_update_op.cc).
 *
 * Compiled by `python -m odsgd.native build` when nvcc is on PATH and the installed MXNet is
 * a CUDA build (the .cc files then register their "gpu" forward functions,
 * -DODSGD_WITH_CUDA), and by `python -m odsgd.native check-cuda` (run by `make test`) on
 * any machine, to check that it compiles.
 *
 * The per-element code (LocalUpdateAt, PredictUpdateAt, NagPredictUpdateAt) is
 * local_update_kernels.h, shared with the CPU kernels. Each thread handles elements i,
 * i + stride, ... (grid-stride loop), so any n runs with a bounded grid. A multi-array
 * kernel covers all arrays of a call in one launch: element i of the flat layout finds its
 * array by a binary search of the offsets.
 */
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "local_update_kernels.h"

namespace odsgd {
namespace {

constexpr int kThreadsPerBlock = 256;
// Enough blocks to fill the largest GPUs several times over; beyond this the grid-stride
// loop takes over instead of launching more blocks.
constexpr int64_t kMaxBlocks = 65535;

int BlocksFor(int64_t n) {
  return static_cast<int>(
      std::min<int64_t>(kMaxBlocks, (n + kThreadsPerBlock - 1) / kThreadsPerBlock));
}

template <bool kClip, bool kAdaptive>
__global__ void LocalUpdateKernel(int64_t n, UpdateParams p, float* __restrict__ w,
                                  const float* __restrict__ grad,
                                  const float* __restrict__ global_w,
                                  float* __restrict__ mom, float* __restrict__ var) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    LocalUpdateAt<kClip, kAdaptive, false>(i, p, w, grad, global_w, mom, var, nullptr);
  }
}

template <bool kClip, bool kAdaptive>
__global__ void PredictUpdateKernel(int64_t n, UpdateParams p, float* __restrict__ w,
                                    const float* __restrict__ grad,
                                    const float* __restrict__ global_w,
                                    const float* __restrict__ prev_global_w,
                                    float* __restrict__ var) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    PredictUpdateAt<kClip, kAdaptive, false>(i, p, w, grad, global_w, prev_global_w, var,
                                             nullptr);
  }
}

/*! \brief All arrays of a multi-array call; kKind picks update, gather or scatter. */
template <MultiKind kKind, bool kClip, bool kAdaptive, bool kSend>
__global__ void MultiKernel(int64_t total, int num, const void* __restrict__ table_block,
                            UpdateParams p, FlatArrays f) {
  const SegmentTable t = ViewSegmentTable(table_block, num);
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += stride) {
    const int k = FindSegment(t.offsets, num, i);
    const int64_t off = t.offsets[k];
    const int64_t j = i - off;
    if (kKind == MultiKind::kGather) {
      f.flat[i] = t.in[k][j];
    } else if (kKind == MultiKind::kScatter) {
      t.out[k][j] = f.flat[i];
    } else {
      const UpdateParams q = ParamsOf(p, t, k);
      float* var = kAdaptive ? f.var + off : f.var;
      float* send = kSend ? f.send + off : f.send;
      if (kKind == MultiKind::kLocal) {
        LocalUpdateAt<kClip, kAdaptive, kSend>(j, q, t.out[k], t.in[k], f.global_w + off,
                                               f.aux + off, var, send);
      } else if (kKind == MultiKind::kPredict) {
        PredictUpdateAt<kClip, kAdaptive, kSend>(j, q, t.out[k], t.in[k], f.global_w + off,
                                                 f.aux + off, var, send);
      } else {
        NagPredictUpdateAt<kClip, kAdaptive, kSend>(j, q, t.out[k], t.in[k],
                                                    f.global_w + off, f.aux + off,
                                                    f.est + off, var, send);
      }
    }
  }
}

template <MultiKind kKind>
void LaunchMulti(int blocks, cudaStream_t s, int64_t total, int num, const void* table,
                 const UpdateParams& p, bool clip, bool adaptive, bool send,
                 const FlatArrays& f) {
  DispatchFlags(clip, adaptive, [&](auto kclip, auto kadaptive) {
    DispatchBool(send, [&](auto ksend) {
      MultiKernel<kKind, decltype(kclip)::value, decltype(kadaptive)::value,
                  decltype(ksend)::value><<<blocks, kThreadsPerBlock, 0, s>>>(total, num, table,
                                                                              p, f);
    });
  });
}

}  // namespace

int LaunchLocalUpdateCuda(int64_t n, const UpdateParams& p, bool clip, bool adaptive, float* w,
                          const float* grad, const float* global_w, float* mom, float* var,
                          void* stream) {
  if (n == 0) return 0;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const int blocks = BlocksFor(n);
  DispatchFlags(clip, adaptive, [&](auto kclip, auto kadaptive) {
    LocalUpdateKernel<decltype(kclip)::value, decltype(kadaptive)::value>
        <<<blocks, kThreadsPerBlock, 0, s>>>(n, p, w, grad, global_w, mom, var);
  });
  return static_cast<int>(cudaGetLastError());
}

int LaunchPredictUpdateCuda(int64_t n, const UpdateParams& p, bool clip, bool adaptive,
                            float* w, const float* grad, const float* global_w,
                            const float* prev_global_w, float* var, void* stream) {
  if (n == 0) return 0;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const int blocks = BlocksFor(n);
  DispatchFlags(clip, adaptive, [&](auto kclip, auto kadaptive) {
    PredictUpdateKernel<decltype(kclip)::value, decltype(kadaptive)::value>
        <<<blocks, kThreadsPerBlock, 0, s>>>(n, p, w, grad, global_w, prev_global_w, var);
  });
  return static_cast<int>(cudaGetLastError());
}

int LaunchMultiCuda(MultiKind kind, int64_t total, int num, const void* device_table,
                    const UpdateParams& p, bool clip, bool adaptive, bool send,
                    const FlatArrays& flat, void* stream) {
  if (total == 0) return 0;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const int blocks = BlocksFor(total);
  switch (kind) {
    case MultiKind::kLocal:
      LaunchMulti<MultiKind::kLocal>(blocks, s, total, num, device_table, p, clip, adaptive,
                                     send, flat);
      break;
    case MultiKind::kPredict:
      LaunchMulti<MultiKind::kPredict>(blocks, s, total, num, device_table, p, clip, adaptive,
                                       send, flat);
      break;
    case MultiKind::kNagPredict:
      LaunchMulti<MultiKind::kNagPredict>(blocks, s, total, num, device_table, p, clip,
                                          adaptive, send, flat);
      break;
    case MultiKind::kGather:
      // Copies take no flags: one instantiation each.
      MultiKernel<MultiKind::kGather, false, false, false>
          <<<blocks, kThreadsPerBlock, 0, s>>>(total, num, device_table, p, flat);
      break;
    case MultiKind::kScatter:
      MultiKernel<MultiKind::kScatter, false, false, false>
          <<<blocks, kThreadsPerBlock, 0, s>>>(total, num, device_table, p, flat);
      break;
  }
  return static_cast<int>(cudaGetLastError());
}

int CopyHostToDeviceAsync(void* dst, const void* src, int64_t bytes, void* stream) {
  return static_cast<int>(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes),
                                          cudaMemcpyHostToDevice,
                                          static_cast<cudaStream_t>(stream)));
}

int CopyDeviceAsync(void* dst, const void* src, int64_t bytes, void* stream) {
  return static_cast<int>(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes),
                                          cudaMemcpyDeviceToDevice,
                                          static_cast<cudaStream_t>(stream)));
}

const char* CudaErrorString(int code) {
  return cudaGetErrorString(static_cast<cudaError_t>(code));
}

}  // namespace odsgd
