// SubGen's online key clustering on the GPU (ClusterBatch and the CPU reference cpu_key_clusters
// in engine/ops/key_clusters.h), one thread block per radius of the batch: the keys are visited
// in order (the clustering is sequential along the stream), and for each key the block's threads
// share the distances to the cluster representatives so far (double precision, from the float
// keys), reduce them to the nearest (ties to the oldest cluster) and thread 0 assigns the key or
// opens a cluster; the block stops once the capacity sum_c min(t, n_c) exceeds the limit. A
// SubGen bisection sends the next levels of its search tree as one batch, so the radii run side
// by side on the device's multiprocessors.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "engine/ops/backend.h"
#include "kernels/cuda_check.cuh"

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

struct ClusterWorkspace {
  DeviceBuffer keys, deltas, owner, size, reps, capacity, counts;
  void release() {
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
