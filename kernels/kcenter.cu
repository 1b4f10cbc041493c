// Greedy k-center (Gonzalez) on the GPU, matching cpu_kcenter (engine/ops/kcenter_cpu.cpp): the
// first centre is row `first`; each later pick is the row farthest (squared Euclidean distance,
// double) from its nearest chosen centre, ties to the lowest row; chosen rows are marked -1 so no
// row is picked twice; k is capped at n.
//
// One launch per pick: every thread block first reduces the previous launch's per-block
// (distance, row) maxima to the new centre (each block does the same small reduction, so no grid
// synchronisation is needed), then updates nearest[] for its rows against that centre and writes
// its own block maximum into the other half of a double buffer. The picks stay on the device
// until the end.
//
// The op's device interface (its arguments, buffers, upload, launch and download) comes first,
// then the kernels, then the backend's CudaBackend::kcenter (kernels/cuda_backend.cuh).
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <string>
#include <vector>

#include "engine/core/error.h"
#include "kernels/block_reduce.cuh"
#include "kernels/cuda_backend.cuh"
#include "kernels/cuda_check.cuh"

namespace kvscope::cuda {

struct KcenterDeviceArgs {
  int n = 0, d = 0, k = 0, first = 0;
  const float* x = nullptr;      // n x d
  double* nearest = nullptr;     // n
  double* block_best = nullptr;  // 2 x blocks
  int* block_arg = nullptr;      // 2 x blocks
  int* picks = nullptr;          // k
  int blocks = 0;
};

struct KcenterWorkspace final : OpWorkspace {
  DeviceBuffer x, nearest, best, arg, picks;
  void release() override {
    x.release();
    nearest.release();
    best.release();
    arg.release();
    picks.release();
  }
};

// Validates as cpu_kcenter does (InputError for k < 0, `first` out of range, negative shapes)
// and uploads. Returns args with k == 0 when there is nothing to pick.
KcenterDeviceArgs upload_kcenter_input(const float* x, int n, int d, int k, int first,
                                       KcenterWorkspace& ws, cudaStream_t stream);

void launch_kcenter(const KcenterDeviceArgs& a, cudaStream_t stream);

std::vector<int> download_kcenter_picks(const KcenterDeviceArgs& a, cudaStream_t stream);

}  // namespace kvscope::cuda

namespace kvscope::cuda {
namespace {

constexpr int kKcThreads = 256;
constexpr int kKcMaxBlocks = 1024;

// (value, row) maximum with ties to the lower row.
__device__ __forceinline__ bool better(double v, int i, double bv, int bi) {
  return arg_before(v, i, bv, bi, true);
}

__global__ void __launch_bounds__(kKcThreads) kcenter_pick_kernel(KcenterDeviceArgs a, int pick) {
  extern __shared__ float centre_row[];
  __shared__ double sv[kKcThreads];
  __shared__ int si[kKcThreads];
  int centre = a.first;
  if (pick > 0) {
    const double* prev_v = a.block_best + ((pick - 1) & 1) * a.blocks;
    const int* prev_i = a.block_arg + ((pick - 1) & 1) * a.blocks;
    double v = -INFINITY;
    int i = INT_MAX;
    for (int b = threadIdx.x; b < a.blocks; b += blockDim.x)
      if (better(prev_v[b], prev_i[b], v, i)) {
        v = prev_v[b];
        i = prev_i[b];
      }
    double best_v;
    block_arg_reduce(v, i, true, sv, si, &best_v, &centre);  // sv, si reused after the barrier
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) a.picks[pick] = centre;
  for (int c = threadIdx.x; c < a.d; c += blockDim.x)
    centre_row[c] = a.x[static_cast<size_t>(centre) * a.d + c];
  __syncthreads();

  double best_v = -INFINITY;
  int best_i = INT_MAX;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < a.n; i += gridDim.x * blockDim.x) {
    const float* xi = a.x + static_cast<size_t>(i) * a.d;
    double d2 = 0.0;
    for (int c = 0; c < a.d; ++c) {
      const double diff = static_cast<double>(xi[c]) - static_cast<double>(centre_row[c]);
      d2 += diff * diff;
    }
    // Chosen rows hold -1, which min() keeps; the new centre joins them.
    double nearest = pick == 0 ? d2 : fmin(a.nearest[i], d2);
    if (i == centre) nearest = -1.0;
    a.nearest[i] = nearest;
    if (better(nearest, i, best_v, best_i)) {
      best_v = nearest;
      best_i = i;
    }
  }
  double bv;
  int bi;
  block_arg_reduce(best_v, best_i, true, sv, si, &bv, &bi);
  if (threadIdx.x == 0) {
    a.block_best[(pick & 1) * a.blocks + blockIdx.x] = bv;
    a.block_arg[(pick & 1) * a.blocks + blockIdx.x] = bi;
  }
}

}  // namespace

KcenterDeviceArgs upload_kcenter_input(const float* x, int n, int d, int k, int first,
                                       KcenterWorkspace& ws, cudaStream_t stream) {
  if (n < 0 || d < 0) throw InputError("k-center: negative shape");
  if (n > 0 && !x) throw InputError("k-center: no points given");
  if (k < 0) throw InputError("k-center: k must be >= 0, got " + std::to_string(k));
  KcenterDeviceArgs a;
  if (n == 0 || k == 0) return a;  // k == 0: nothing to pick
  if (first < 0 || first >= n)
    throw InputError("k-center: first point " + std::to_string(first) + " is not a row of the " +
                     std::to_string(n) + " points");
  a.n = n;
  a.d = d;
  a.k = std::min(k, n);
  a.first = first;
  a.blocks = std::min(kKcMaxBlocks, (n + kKcThreads - 1) / kKcThreads);
  const size_t count = static_cast<size_t>(n) * d;
  float* dx = ws.x.reserve_as<float>(std::max<size_t>(count, 1));
  if (count > 0)
    KVS_CUDA_CHECK(cudaMemcpyAsync(dx, x, count * sizeof(float), cudaMemcpyHostToDevice, stream));
  a.x = dx;
  a.nearest = ws.nearest.reserve_as<double>(n);
  a.block_best = ws.best.reserve_as<double>(2 * a.blocks);
  a.block_arg = ws.arg.reserve_as<int>(2 * a.blocks);
  a.picks = ws.picks.reserve_as<int>(a.k);
  return a;
}

void launch_kcenter(const KcenterDeviceArgs& a, cudaStream_t stream) {
  const size_t smem = within_default_smem(static_cast<size_t>(a.d) * sizeof(float));
  if (smem == 0)
    throw Unsupported("k-center: " + std::to_string(a.d) +
                      " features exceed the CUDA kernel's shared-memory centre row");
  for (int pick = 0; pick < a.k; ++pick) {
    kcenter_pick_kernel<<<a.blocks, kKcThreads, smem, stream>>>(a, pick);
    KVS_CUDA_CHECK_LAUNCH("kcenter_pick_kernel");
  }
}

std::vector<int> download_kcenter_picks(const KcenterDeviceArgs& a, cudaStream_t stream) {
  std::vector<int> picks(a.k);
  if (a.k > 0)
    KVS_CUDA_CHECK(
        cudaMemcpyAsync(picks.data(), a.picks, a.k * sizeof(int), cudaMemcpyDeviceToHost, stream));
  KVS_CUDA_CHECK(cudaStreamSynchronize(stream));
  return picks;
}

// ---- the backend's op ---------------------------------------------------------------------

std::vector<int> CudaBackend::kcenter(const float* x, int n, int d, int k, int first) {
  if (within_default_smem(static_cast<size_t>(d) * sizeof(float)) == 0)
    throw DeviceFailure(std::to_string(d) +
                        " features exceed the CUDA kernel's shared-memory centre row");
  return guarded([&] {
    const KcenterDeviceArgs a =
        upload_kcenter_input(x, n, d, k, first, workspace<KcenterWorkspace>(Op::kcenter), stream_);
    if (a.k == 0) return std::vector<int>{};
    launch([a, this] { launch_kcenter(a, stream_); });
    return download_kcenter_picks(a, stream_);
  });
}

}  // namespace kvscope::cuda
