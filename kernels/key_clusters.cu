// SubGen's online key clustering on the GPU (ClusterBatch and the CPU reference cpu_key_clusters
// in engine/ops/key_clusters.h), one thread block per radius of the batch: the keys are visited
// in order (the clustering is sequential along the stream), and for each key the block's threads
// share the distances to the cluster representatives so far (double precision, from the float
// keys), reduce them to the nearest (ties to the oldest cluster) and thread 0 assigns the key or
// opens a cluster; the block stops once the capacity sum_c min(t, n_c) exceeds the limit. A
// SubGen bisection sends the next levels of its search tree as one batch, so the radii run side
// by side on the device's multiprocessors.
//
// The op's device interface (its arguments, buffers, upload, launch and download) comes first,
// then the kernels, then the backend's CudaBackend::key_clusters (kernels/cuda_backend.cuh).
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstddef>
#include <string>
#include <vector>

#include "engine/core/error.h"
#include "engine/ops/backend.h"
#include "kernels/block_reduce.cuh"
#include "kernels/cuda_backend.cuh"
#include "kernels/cuda_check.cuh"
#include "kernels/resident_layers.cuh"

namespace kvscope::cuda {

constexpr int kClusterThreads = 128;

struct ClusterDeviceArgs {
  int n = 0, d = 0, t = 1, radii = 0, max_clusters = 0;
  long long limit = 0;
  const float* keys = nullptr;     // n x d
  const double* deltas = nullptr;  // [radii]
  int* owner = nullptr;            // [radii][n]
  int* size = nullptr;             // [radii][max_clusters]
  int* reps = nullptr;             // [radii][max_clusters]: each cluster's first key
  long long* capacity = nullptr;   // [radii]
  int* num = nullptr;              // [radii]: clusters
  int* over = nullptr;             // [radii]
};

struct ClusterWorkspace final : OpWorkspace {
  DeviceBuffer keys, deltas, owner, size, reps, capacity, counts;
  void release() override {
    keys.release();
    deltas.release();
    owner.release();
    size.release();
    reps.release();
    capacity.release();
    counts.release();
  }
};

// Dynamic shared memory for key width d (the current key in double), or 0 when it exceeds the
// 48 KiB a block gets without opting in (the backend then declines the shape).
size_t key_clusters_smem_bytes(int d);

class ResidentLayers;

// Checks `b` as the CPU reference does (check_cluster_batch: std::invalid_argument), throws
// Cancelled when b.cancel is set, and uploads. Returns radii == 0 when there is nothing to run.
// With `resident` and a batch naming its layer (b.layer_id), the keys are that layer's resident
// copy (copied at their first use); otherwise they are uploaded into the workspace.
ClusterDeviceArgs upload_cluster_batch(const ClusterBatch& b, ClusterWorkspace& ws,
                                       ResidentLayers* resident, cudaStream_t stream);

void launch_key_clusters(const ClusterDeviceArgs& a, cudaStream_t stream);

// Fills b.out[r] for every radius (the CPU reference's layout: owner -1 after an early stop).
void download_cluster_outputs(const ClusterDeviceArgs& a, const ClusterBatch& b,
                              cudaStream_t stream);

}  // namespace kvscope::cuda

namespace kvscope::cuda {
namespace {

// (value, index) minimum with ties to the lower index.
__device__ __forceinline__ bool nearer(double v, int i, double bv, int bi) {
  return arg_before(v, i, bv, bi, false);
}

__global__ void __launch_bounds__(kClusterThreads) key_clusters_kernel(ClusterDeviceArgs a) {
  extern __shared__ double key_row[];  // [d]: the current key
  __shared__ double sv[kClusterThreads];
  __shared__ int si[kClusterThreads];
  __shared__ int num;
  __shared__ long long capacity;
  __shared__ int stop;
  const int r = blockIdx.x;
  const double delta = a.deltas[r];
  const double delta2 = delta * delta;
  int* owner = a.owner + static_cast<size_t>(r) * a.n;
  int* size = a.size + static_cast<size_t>(r) * a.max_clusters;
  int* reps = a.reps + static_cast<size_t>(r) * a.max_clusters;
  if (threadIdx.x == 0) {
    num = 0;
    capacity = 0;
    stop = 0;
  }
  for (int i = threadIdx.x; i < a.n; i += blockDim.x) owner[i] = -1;
  __syncthreads();
  for (int i = 0; i < a.n; ++i) {
    const float* key = a.keys + static_cast<size_t>(i) * a.d;
    for (int c = threadIdx.x; c < a.d; c += blockDim.x) key_row[c] = static_cast<double>(key[c]);
    __syncthreads();
    const int count = num;
    double best = INFINITY;
    int arg = INT_MAX;
    for (int c = threadIdx.x; c < count; c += blockDim.x) {
      const float* rep = a.keys + static_cast<size_t>(reps[c]) * a.d;
      double d2 = 0.0;
      for (int j = 0; j < a.d; ++j) {
        const double diff = static_cast<double>(rep[j]) - key_row[j];
        d2 += diff * diff;
      }
      if (nearer(d2, c, best, arg)) {
        best = d2;
        arg = c;
      }
    }
    double nearest;
    int c;
    block_arg_reduce(best, arg, false, sv, si, &nearest, &c);
    if (threadIdx.x == 0) {
      if (count > 0 && nearest <= delta2) {
        owner[i] = c;
        if (size[c]++ < a.t) ++capacity;
      } else {
        reps[count] = i;
        owner[i] = count;
        size[count] = 1;
        num = count + 1;
        ++capacity;
      }
      if (capacity > a.limit) stop = 1;
    }
    __syncthreads();  // num, stop and key_row are read or rewritten next
    if (stop) break;
  }
  if (threadIdx.x == 0) {
    a.num[r] = num;
    a.capacity[r] = capacity;
    a.over[r] = stop;
  }
}

}  // namespace

size_t key_clusters_smem_bytes(int d) {
  const size_t bytes = static_cast<size_t>(std::max(d, 1)) * sizeof(double);
  return within_default_smem(bytes);
}

ClusterDeviceArgs upload_cluster_batch(const ClusterBatch& b, ClusterWorkspace& ws,
                                       ResidentLayers* resident, cudaStream_t stream) {
  check_cluster_batch(b);
  if (b.cancel && b.cancel->load(std::memory_order_relaxed)) throw Cancelled();
  ClusterDeviceArgs a;
  if (b.deltas.empty()) return a;
  if (key_clusters_smem_bytes(b.d) == 0)
    throw Unsupported("key width d=" + std::to_string(b.d) +
                      " exceeds the CUDA clustering kernel's shared-memory key row");
  a.n = b.n;
  a.d = b.d;
  a.t = b.t;
  a.limit = b.limit;
  a.radii = static_cast<int>(b.deltas.size());
  a.max_clusters = static_cast<int>(std::min<long long>(b.n, b.limit + 1));
  const size_t radii = a.radii, n = b.n, clusters = std::max(a.max_clusters, 1);
  const size_t count = n * b.d, key_bytes = count * sizeof(float);
  if (resident && b.layer_id != 0 && count > 0 && resident->begin_call(key_bytes)) {
    a.keys =
        static_cast<const float*>(resident->find_or_upload(b.layer_id, b.keys, key_bytes, stream));
  } else {
    float* keys = ws.keys.reserve_as<float>(std::max<size_t>(count, 1));
    if (count > 0)
      KVS_CUDA_CHECK(cudaMemcpyAsync(keys, b.keys, key_bytes, cudaMemcpyHostToDevice, stream));
    a.keys = keys;
  }
  double* deltas = ws.deltas.reserve_as<double>(radii);
  KVS_CUDA_CHECK(cudaMemcpyAsync(deltas, b.deltas.data(), radii * sizeof(double),
                                 cudaMemcpyHostToDevice, stream));
  a.deltas = deltas;
  a.owner = ws.owner.reserve_as<int>(std::max<size_t>(radii * n, 1));
  a.size = ws.size.reserve_as<int>(radii * clusters);
  a.reps = ws.reps.reserve_as<int>(radii * clusters);
  a.capacity = ws.capacity.reserve_as<long long>(radii);
  int* counts = ws.counts.reserve_as<int>(2 * radii);
  a.num = counts;
  a.over = counts + radii;
  return a;
}

void launch_key_clusters(const ClusterDeviceArgs& a, cudaStream_t stream) {
  if (a.radii == 0) return;
  key_clusters_kernel<<<a.radii, kClusterThreads, key_clusters_smem_bytes(a.d), stream>>>(a);
  KVS_CUDA_CHECK_LAUNCH("key_clusters_kernel");
}

void download_cluster_outputs(const ClusterDeviceArgs& a, const ClusterBatch& b,
                              cudaStream_t stream) {
  if (a.radii == 0) return;
  const size_t radii = a.radii, n = a.n, clusters = std::max(a.max_clusters, 1);
  std::vector<int> owner(radii * n), size(radii * clusters), counts(2 * radii);
  std::vector<long long> capacity(radii);
  if (n > 0)
    KVS_CUDA_CHECK(cudaMemcpyAsync(owner.data(), a.owner, owner.size() * sizeof(int),
                                   cudaMemcpyDeviceToHost, stream));
  KVS_CUDA_CHECK(cudaMemcpyAsync(size.data(), a.size, size.size() * sizeof(int),
                                 cudaMemcpyDeviceToHost, stream));
  KVS_CUDA_CHECK(cudaMemcpyAsync(counts.data(), a.num, counts.size() * sizeof(int),
                                 cudaMemcpyDeviceToHost, stream));
  KVS_CUDA_CHECK(cudaMemcpyAsync(capacity.data(), a.capacity, radii * sizeof(long long),
                                 cudaMemcpyDeviceToHost, stream));
  KVS_CUDA_CHECK(cudaStreamSynchronize(stream));
  for (size_t r = 0; r < radii; ++r) {
    KeyClusters& out = b.out[r];
    out.owner.assign(owner.begin() + r * n, owner.begin() + (r + 1) * n);
    out.size.assign(size.begin() + r * clusters, size.begin() + r * clusters + counts[r]);
    out.capacity = capacity[r];
    out.over = counts[radii + r] != 0;
  }
}

// ---- the backend's op ---------------------------------------------------------------------

void CudaBackend::key_clusters(const ClusterBatch& b) {
  if (key_clusters_smem_bytes(b.d) == 0)
    throw DeviceFailure("key width d=" + std::to_string(b.d) +
                        " exceeds the CUDA clustering kernel's shared-memory key row");
  guarded([&] {
    const ClusterDeviceArgs a =
        upload_cluster_batch(b, workspace<ClusterWorkspace>(Op::key_clusters), &resident_, stream_);
    launch([a, this] { launch_key_clusters(a, stream_); });
    download_cluster_outputs(a, b, stream_);
  });
}

}  // namespace kvscope::cuda
