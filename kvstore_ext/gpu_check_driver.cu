/*
 * Standalone test driver of the CUDA kernels (local_update_op_gpu.cu), without MXNet: it
 * calls their launchers as multi_update_op.cc's "gpu" forward does (a host SegmentTable
 * copied to the device, then one LaunchMultiCuda). `python -m odsgd.native check-gpu`
 * (odsgd/native/gpu_check.py) compiles it with the kernels, gives it its cases, compares
 * what it writes with a NumPy reference and prints its timings as bandwidth.
 * library.sources() leaves this file out of the extension library.
 *
 *   odsgd_gpu_check run CASE_DIR...
 *     For each folder: reads case.txt (the call) and arrays.f32 (8 flat float32 arrays of N
 *     elements: weight, grad, global, aux, var, est, local, flat), runs the call on the GPU
 *     with every weight and gradient in its own allocation, and writes all 8 back to
 *     result.f32. case.txt holds, as whitespace-separated tokens:
 *       kind sgd|predict|nag_predict|gather|scatter
 *       flags CLIP ADAPTIVE PREVIOUS LOCAL          (0 or 1 each; LOCAL: w_t is read from
 *                                                    local and w_{t+1} written there too;
 *                                                    LOCAL 0 needs LAM 0)
 *       hyper RESCALE_GRAD CLIP_GRADIENT MOMENTUM LAM BETA EPS
 *       sizes P N_0 ... N_{P-1}
 *       lrs L_0 ... / wds D_0 ... / prev_decays Q_0 ... / own_scales S_0 ... /
 *       prev_scales R_0 ...                          (P numbers each)
 *     The updates write the weights, never read them; gather reads the weights into flat,
 *     scatter writes flat into the weights.
 *   odsgd_gpu_check bench REPEATS N_0 ... N_{P-1}
 *     Times, with CUDA events, a device-to-device copy of N = N_0 + ... + N_{P-1} floats,
 *     and for every update kind (the predicts also with PREVIOUS) and compensation mode,
 *     with w_t in local (LAM != 0): a plain grid-stride kernel on one
 *     array of N (the launch of the single-array operators this family replaced), the
 *     multi-array call (table upload + kernel) on one array of N and on the P arrays; and
 *     gather and scatter on one array and on P. Prints `time LABEL MEDIAN_S MIN_S` lines.
 *
 * Exit status: 0 done, 1 failure (message on stderr), 2 no usable CUDA device (one line on
 * stdout saying why).
 */
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "local_update_kernels.h"

namespace {

using odsgd::FlatArrays;
using odsgd::MultiKind;
using odsgd::UpdateParams;

// The flat arrays of a case file, in file order.
enum Slot { kWeight, kGrad, kGlobal, kAux, kVar, kEst, kLocal, kFlat, kSlots };

void Fail(const std::string& what) {
  std::fprintf(stderr, "odsgd_gpu_check: %s\n", what.c_str());
  std::exit(1);
}

void Check(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) Fail(std::string(what) + ": " + cudaGetErrorString(rc));
}

void CheckLaunch(int rc, const char* what) { Check(static_cast<cudaError_t>(rc), what); }

float* DeviceFloats(int64_t n) {
  void* p = nullptr;
  // At least one element: a size-0 array still gets a distinct pointer, as MXNet's may.
  Check(cudaMalloc(&p, static_cast<size_t>(std::max<int64_t>(n, 1)) * sizeof(float)),
        "cudaMalloc");
  return static_cast<float*>(p);
}

MultiKind KindOf(const std::string& name) {
  if (name == "sgd") return MultiKind::kLocal;
  if (name == "predict") return MultiKind::kPredict;
  if (name == "nag_predict") return MultiKind::kNagPredict;
  if (name == "gather") return MultiKind::kGather;
  if (name == "scatter") return MultiKind::kScatter;
  Fail("unknown kind '" + name + "'");
  return MultiKind::kLocal;
}

/*! \brief One call, as case.txt describes it. */
struct Case {
  MultiKind kind = MultiKind::kLocal;
  bool clip = false, adaptive = false, previous = false, local = false;
  UpdateParams p{};
  std::vector<int64_t> sizes;
  std::vector<float> lrs, wds, prev_decays, own_scales, prev_scales;
};

Case ReadCase(const std::string& path) {
  std::ifstream in(path);
  if (!in) Fail("cannot read " + path);
  Case c;
  std::string key;
  while (in >> key) {
    if (key == "kind") {
      std::string name;
      in >> name;
      c.kind = KindOf(name);
    } else if (key == "flags") {
      in >> c.clip >> c.adaptive >> c.previous >> c.local;
    } else if (key == "hyper") {
      double h[6];
      for (double& x : h) in >> x;
      c.p = odsgd::MakeUpdateParams(h[0], h[1], h[2], h[3], h[4], h[5]);
    } else if (key == "sizes") {
      size_t num = 0;
      in >> num;
      c.sizes.resize(num);
      for (int64_t& n : c.sizes) in >> n;
    } else {
      std::vector<float>* list = key == "lrs" ? &c.lrs : key == "wds" ? &c.wds
                                 : key == "prev_decays" ? &c.prev_decays
                                 : key == "own_scales" ? &c.own_scales
                                 : key == "prev_scales" ? &c.prev_scales : nullptr;
      if (list == nullptr) Fail("unknown key '" + key + "' in " + path);
      list->resize(c.sizes.size());
      for (float& x : *list) {
        double value;
        in >> value;
        x = static_cast<float>(value);
      }
    }
    if (!in) Fail("malformed " + path + " at '" + key + "'");
  }
  c.lrs.resize(c.sizes.size(), 0.0f);
  c.wds.resize(c.sizes.size(), 0.0f);
  c.prev_decays.resize(c.sizes.size(), 0.0f);
  c.own_scales.resize(c.sizes.size(), 0.0f);
  c.prev_scales.resize(c.sizes.size(), 0.0f);
  if (!c.local && c.p.lam != 0.0f) {
    Fail("LOCAL 0 needs LAM 0 (the compensation term reads w_t from local) in " + path);
  }
  return c;
}

bool IsUpdate(MultiKind kind) {
  return kind != MultiKind::kGather && kind != MultiKind::kScatter;
}

/*! \brief The table a call of `kind` on arrays weights[k] (and grads[k]) builds. */
void Table(const Case& c, const std::vector<float*>& weights, const std::vector<float*>& grads,
           odsgd::HostSegmentTable* table) {
  std::vector<odsgd::SegmentSpec> specs(c.sizes.size());
  for (size_t k = 0; k < specs.size(); ++k) {
    specs[k] = odsgd::SegmentSpec{c.sizes[k], nullptr, nullptr, c.lrs[k], c.wds[k],
                                  c.prev_decays[k], c.own_scales[k], c.prev_scales[k]};
    if (c.kind == MultiKind::kGather) {
      specs[k].in = weights[k];
    } else {
      specs[k].out = weights[k];
      if (IsUpdate(c.kind)) specs[k].in = grads[k];
    }
  }
  odsgd::BuildSegmentTable(specs, table);
}

/*! \brief The multi-array call as the operator makes it: table upload, then one launch. */
void Call(const Case& c, const odsgd::HostSegmentTable& table, void* device_table,
          const FlatArrays& flat, cudaStream_t stream) {
  CheckLaunch(odsgd::CopyHostToDeviceAsync(device_table, table.block.data(),
                                           odsgd::SegmentTableBytes(static_cast<int>(
                                               c.sizes.size())),
                                           stream),
              "table upload");
  CheckLaunch(odsgd::LaunchMultiCuda(c.kind, table.tiles, static_cast<int>(c.sizes.size()),
                                     device_table, c.p, c.clip, c.adaptive, c.previous,
                                     c.local, flat, stream),
              "LaunchMultiCuda");
}

void RunCase(const std::string& dir) {
  const Case c = ReadCase(dir + "/case.txt");
  int64_t total = 0;
  for (int64_t n : c.sizes) total += n;
  std::vector<float> host(static_cast<size_t>(total) * kSlots);
  std::ifstream in(dir + "/arrays.f32", std::ios::binary);
  if (total > 0) {
    in.read(reinterpret_cast<char*>(host.data()), static_cast<std::streamsize>(host.size() * 4));
  }
  if (!in) Fail("cannot read " + dir + "/arrays.f32 (" + std::to_string(total) + " x 8 floats)");
  const float* slot[kSlots];
  for (int s = 0; s < kSlots; ++s) slot[s] = host.data() + static_cast<int64_t>(s) * total;

  // Each weight and gradient its own allocation, like MXNet's arrays; the rest flat.
  std::vector<float*> weights, grads;
  int64_t off = 0;
  for (int64_t n : c.sizes) {
    weights.push_back(DeviceFloats(n));
    grads.push_back(DeviceFloats(n));
    Check(cudaMemcpy(weights.back(), slot[kWeight] + off, n * 4, cudaMemcpyHostToDevice), "copy");
    Check(cudaMemcpy(grads.back(), slot[kGrad] + off, n * 4, cudaMemcpyHostToDevice), "copy");
    off += n;
  }
  float* dev[kSlots] = {};
  for (int s = kGlobal; s < kSlots; ++s) {
    dev[s] = DeviceFloats(total);
    Check(cudaMemcpy(dev[s], slot[s], total * 4, cudaMemcpyHostToDevice), "copy");
  }
  odsgd::HostSegmentTable table;
  Table(c, weights, grads, &table);
  void* device_table = nullptr;
  Check(cudaMalloc(&device_table, odsgd::SegmentTableBytes(static_cast<int>(c.sizes.size()))),
        "cudaMalloc");
  cudaStream_t stream;
  Check(cudaStreamCreate(&stream), "cudaStreamCreate");
  Call(c, table, device_table, FlatArrays{dev[kGlobal], dev[kAux], dev[kVar], dev[kLocal],
                                          dev[kFlat], dev[kEst]},
       stream);
  Check(cudaStreamSynchronize(stream), "kernel");

  std::vector<float> result(host.size());
  off = 0;
  for (size_t k = 0; k < c.sizes.size(); ++k) {
    const int64_t n = c.sizes[k];
    Check(cudaMemcpy(result.data() + kWeight * total + off, weights[k], n * 4,
                     cudaMemcpyDeviceToHost), "copy back");
    Check(cudaMemcpy(result.data() + kGrad * total + off, grads[k], n * 4,
                     cudaMemcpyDeviceToHost), "copy back");
    off += n;
  }
  for (int s = kGlobal; s < kSlots; ++s) {
    Check(cudaMemcpy(result.data() + static_cast<int64_t>(s) * total, dev[s], total * 4,
                     cudaMemcpyDeviceToHost), "copy back");
    Check(cudaFree(dev[s]), "cudaFree");
  }
  for (size_t k = 0; k < weights.size(); ++k) {
    Check(cudaFree(weights[k]), "cudaFree");
    Check(cudaFree(grads[k]), "cudaFree");
  }
  Check(cudaFree(device_table), "cudaFree");
  Check(cudaStreamDestroy(stream), "cudaStreamDestroy");
  std::ofstream out(dir + "/result.f32", std::ios::binary);
  out.write(reinterpret_cast<const char*>(result.data()),
            static_cast<std::streamsize>(result.size() * 4));
  if (!out) Fail("cannot write " + dir + "/result.f32");
  std::printf("ok %s\n", dir.c_str());
}

// ---------------------------------------------------------------------------------------
// Bandwidth

/*! \brief The single-array operators' kernel that this family replaced: one grid-stride
 *  loop over one array, 256 threads a block, at most 65535 blocks, with w_t in local_flat.
 *  The reference the multi-array kernel's bandwidth is held to. */
template <MultiKind kKind, bool kAdaptive, bool kPrev>
__global__ void GridStrideOneArray(int64_t n, UpdateParams p, float* __restrict__ w,
                                   const float* __restrict__ grad,
                                   const float* __restrict__ global_w, float* __restrict__ aux,
                                   float* __restrict__ est, float* __restrict__ var,
                                   float* __restrict__ local_flat) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    odsgd::UpdateAt<kKind, false, kAdaptive, kPrev, true>(i, p, w, grad, global_w, aux, est,
                                                          var, local_flat);
  }
}

template <MultiKind kKind>
void LaunchGridStride(bool adaptive, bool previous, int64_t n, const UpdateParams& p, float* w,
                      const float* grad, const FlatArrays& f, cudaStream_t s) {
  const int blocks = static_cast<int>(std::min<int64_t>(65535, (n + 255) / 256));
  odsgd::DispatchFlags<kKind>(false, adaptive, previous, true,
                              [&](auto, auto kadaptive, auto kprevious, auto) {
    GridStrideOneArray<kKind, decltype(kadaptive)::value, decltype(kprevious)::value>
        <<<blocks, 256, 0, s>>>(n, p, w, grad, f.global_w, f.aux, f.est, f.var, f.local_flat);
  });
  Check(cudaGetLastError(), "grid-stride kernel");
}

/*! \brief The grid-stride kernel of update call `c` on its one array. */
void GridStride(const Case& c, const odsgd::HostSegmentTable& table, float* w,
                const float* grad, const FlatArrays& f, cudaStream_t s) {
  const UpdateParams q = odsgd::ParamsOf(c.p, table.view, 0);
  if (c.kind == MultiKind::kLocal) {
    LaunchGridStride<MultiKind::kLocal>(c.adaptive, false, table.total, q, w, grad, f, s);
  } else if (c.kind == MultiKind::kPredict) {
    LaunchGridStride<MultiKind::kPredict>(c.adaptive, c.previous, table.total, q, w, grad, f,
                                          s);
  } else {
    LaunchGridStride<MultiKind::kNagPredict>(c.adaptive, c.previous, table.total, q, w, grad,
                                             f, s);
  }
}

/*! \brief Median and fastest seconds of `fn` on `stream` over `repeats` timed calls, each
 *  bracketed by CUDA events, after three untimed ones. */
template <typename Fn>
void Time(const char* label, int repeats, cudaStream_t stream, Fn fn) {
  for (int i = 0; i < 3; ++i) fn();
  cudaEvent_t start, stop;
  Check(cudaEventCreate(&start), "cudaEventCreate");
  Check(cudaEventCreate(&stop), "cudaEventCreate");
  std::vector<float> ms;
  for (int i = 0; i < repeats; ++i) {
    Check(cudaEventRecord(start, stream), "cudaEventRecord");
    fn();
    Check(cudaEventRecord(stop, stream), "cudaEventRecord");
    Check(cudaEventSynchronize(stop), "kernel");
    float t = 0.0f;
    Check(cudaEventElapsedTime(&t, start, stop), "cudaEventElapsedTime");
    ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  std::printf("time %s %.9g %.9g\n", label, ms[ms.size() / 2] / 1e3, ms.front() / 1e3);
  std::fflush(stdout);
  Check(cudaEventDestroy(start), "cudaEventDestroy");
  Check(cudaEventDestroy(stop), "cudaEventDestroy");
}

__global__ void Fill(int64_t n, float* a, float scale) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(blockDim.x) * gridDim.x) {
    a[i] = scale * static_cast<float>(i % 1000) * 1e-3f;
  }
}

void Bench(int repeats, const std::vector<int64_t>& sizes) {
  int64_t total = 0, padded = 0;
  for (int64_t n : sizes) {
    total += n;
    padded += (n + 63) / 64 * 64;   // each array starts 256-byte aligned, like cudaMalloc's
  }
  // Weights and gradients: one buffer each, carved into the P arrays (or used whole).
  float* weight_buf = DeviceFloats(padded);
  float* grad_buf = DeviceFloats(padded);
  float* flat[kSlots] = {};
  for (int s = kGlobal; s < kSlots; ++s) flat[s] = DeviceFloats(total);
  float* all[] = {weight_buf, grad_buf, flat[kGlobal], flat[kAux], flat[kVar], flat[kEst],
                  flat[kLocal], flat[kFlat]};
  for (float* a : all) Fill<<<1024, 256>>>(a == weight_buf || a == grad_buf ? padded : total,
                                            a, a == flat[kVar] ? 1.0f : 0.5f);
  Check(cudaDeviceSynchronize(), "fill");
  std::vector<float*> weights, grads;
  int64_t off = 0;
  for (int64_t n : sizes) {
    weights.push_back(weight_buf + off);
    grads.push_back(grad_buf + off);
    off += (n + 63) / 64 * 64;
  }
  const FlatArrays f{flat[kGlobal], flat[kAux], flat[kVar], flat[kLocal], flat[kFlat],
                     flat[kEst]};
  void* device_table = nullptr;
  Check(cudaMalloc(&device_table, odsgd::SegmentTableBytes(static_cast<int>(sizes.size()))),
        "cudaMalloc");
  cudaStream_t s;
  Check(cudaStreamCreate(&s), "cudaStreamCreate");

  Time("copy", repeats, s, [&] {
    Check(cudaMemcpyAsync(flat[kFlat], flat[kGlobal], total * 4, cudaMemcpyDeviceToDevice, s),
          "cudaMemcpyAsync");
  });
  // label, kind, previous: the predicts also with the previous round's sum in the estimate
  const struct { const char* label; const char* kind; bool previous; } calls[] = {
      {"sgd", "sgd", false},
      {"predict", "predict", false},
      {"predict+previous", "predict", true},
      {"nag_predict", "nag_predict", false},
      {"nag_predict+previous", "nag_predict", true},
      {"gather", "gather", false},
      {"scatter", "scatter", false}};
  for (const auto& call : calls) {
    const char* name = call.label;
    Case many;
    many.kind = KindOf(call.kind);
    many.previous = call.previous;
    many.local = IsUpdate(many.kind);   // lam != 0 below: w_t from local_flat
    many.p = odsgd::MakeUpdateParams(1.0 / 256, -1.0, 0.9, 0.04, 0.95, 1e-7);
    many.sizes = sizes;
    many.lrs.assign(sizes.size(), 0.05f);
    many.wds.assign(sizes.size(), 1e-4f);
    many.prev_decays.assign(sizes.size(), 5e-6f);
    many.own_scales.assign(sizes.size(), call.previous ? 1.0f : 4.0f);
    many.prev_scales.assign(sizes.size(), call.previous ? 0.75f : 0.0f);
    Case one = many;
    one.sizes = {total};
    for (auto* list : {&one.lrs, &one.wds, &one.prev_decays, &one.own_scales,
                       &one.prev_scales}) {
      list->resize(1);
    }
    for (int adaptive = 0; adaptive < (IsUpdate(many.kind) ? 2 : 1); ++adaptive) {
      many.adaptive = one.adaptive = adaptive != 0;
      const std::string suffix = std::string(name) + (IsUpdate(many.kind)
                                                          ? (adaptive ? ":adaptive" : ":constant")
                                                          : "");
      odsgd::HostSegmentTable many_table, one_table;
      Table(many, weights, grads, &many_table);
      Table(one, {weight_buf}, {grad_buf}, &one_table);
      if (IsUpdate(many.kind)) {
        Time(("grid-stride:" + suffix).c_str(), repeats, s,
             [&] { GridStride(one, one_table, weight_buf, grad_buf, f, s); });
      }
      Time(("one:" + suffix).c_str(), repeats, s,
           [&] { Call(one, one_table, device_table, f, s); });
      Time(("many:" + suffix).c_str(), repeats, s,
           [&] { Call(many, many_table, device_table, f, s); });
    }
  }
  Check(cudaStreamDestroy(s), "cudaStreamDestroy");
}

}  // namespace

int main(int argc, char** argv) {
  const std::string usage = "usage: odsgd_gpu_check run CASE_DIR... | bench REPEATS N_0 ...";
  if (argc < 3) Fail(usage);
  int devices = 0;
  const cudaError_t rc = cudaGetDeviceCount(&devices);
  if (rc != cudaSuccess || devices == 0) {
    std::printf("no CUDA device: %s\n",
                rc != cudaSuccess ? cudaGetErrorString(rc) : "cudaGetDeviceCount found 0");
    return 2;
  }
  const std::string mode = argv[1];
  if (mode == "run") {
    for (int i = 2; i < argc; ++i) RunCase(argv[i]);
  } else if (mode == "bench") {
    std::vector<int64_t> sizes;
    for (int i = 3; i < argc; ++i) sizes.push_back(std::atoll(argv[i]));
    if (sizes.empty()) Fail(usage);
    Bench(std::max(1, std::atoi(argv[2])), sizes);
  } else {
    Fail(usage);
  }
  return 0;
}
