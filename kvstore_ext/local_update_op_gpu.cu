/*
 * CUDA kernels of the fused OD-SGD local update (see local_update_op.cc).
 *
 * Compiled by `python -m odsgd.native build` only when nvcc is on PATH and the installed
 * MXNet is a CUDA build; local_update_op.cc then registers its "gpu" forward functions
 * (-DODSGD_WITH_CUDA). The CPU build never reads this file.
 *
 * The per-element math is local_update_kernels.h, shared with the CPU kernels. Each thread
 * handles elements i, i + stride, ... (grid-stride loop), so any n runs with a bounded grid.
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
    float m = mom[i];
    float v = kAdaptive ? var[i] : 0.0f;
    w[i] = LocalStep<kClip, kAdaptive>(p, w[i], grad[i], global_w[i], &m, &v);
    mom[i] = m;
    if (kAdaptive) var[i] = v;
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
    float v = kAdaptive ? var[i] : 0.0f;
    w[i] = PredictStep<kClip, kAdaptive>(p, w[i], grad[i], global_w[i], prev_global_w[i], &v);
    if (kAdaptive) var[i] = v;
  }
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

int CopyDeviceAsync(void* dst, const void* src, int64_t bytes, void* stream) {
  return static_cast<int>(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes),
                                          cudaMemcpyDeviceToDevice,
                                          static_cast<cudaStream_t>(stream)));
}

const char* CudaErrorString(int code) {
  return cudaGetErrorString(static_cast<cudaError_t>(code));
}

}  // namespace odsgd
