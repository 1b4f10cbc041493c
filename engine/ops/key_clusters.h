// The key-clustering op (Backend::key_clusters, engine/ops/backend.h): SubGen's online clustering
// of the middle's keys (engine/methods/subgen.cpp, UpdateSoftmaxNormalizer of the paper's Algorithm
// 1), the hot part of its radius search. Its batch type and its CPU reference, cpu_key_clusters
// (engine/ops/key_clusters_cpu.cpp). The CUDA kernel is kernels/key_clusters.cu.
//
// For one radius delta, the keys k_0..k_{n-1} are visited in order: key i joins the cluster whose
// representative (its first key) is nearest, ties to the oldest cluster, when the squared
// distance (double precision) is <= delta^2; otherwise it starts a new cluster. A cluster's
// capacity is min(t, n_c); the clustering stops as soon as the total capacity exceeds `limit`
// (`over`), since it only grows along the stream. A batch holds several radii over the same keys
// (SubGen's bisection evaluates the next levels of its search tree in one call on a device).
#pragma once

#include <atomic>
#include <cstdint>
#include <vector>

namespace kvscope {

// One radius's clustering.
struct KeyClusters {
  std::vector<int> owner;  // cluster id per key (clusters numbered in order of creation); -1
                           // for the keys after an early stop
  std::vector<int> size;   // n_c per cluster
  long long capacity = 0;  // sum_c min(t, n_c)
  bool over = false;       // stopped early: capacity exceeded `limit`
};

struct ClusterBatch {
  const float* keys = nullptr;  // n x d row-major
  int n = 0, d = 0;
  int t = 1;                   // samples per cluster (capacity min(t, n_c))
  long long limit = 0;         // stop once the capacity exceeds this
  std::vector<double> deltas;  // radii, each >= 0
  KeyClusters* out = nullptr;  // [deltas.size()]
  // Checked between radii by the CPU reference (throws Cancelled), and before a device launch.
  const std::atomic<bool>* cancel = nullptr;
  // Non-zero: `keys` are rows of a key matrix of the loaded layer with this LayerData::id
  // (engine/io/capture.h), unchanged while it lives, so a device backend may keep them resident
  // across calls (kernels/resident_layers.cuh: SubGen's bisection sends several batches over the
  // same keys). 0: upload them at every call. The CPU ignores it.
  uint64_t layer_id = 0;
};

// Throws std::invalid_argument when the batch is inconsistent (no keys or outputs, negative
// sizes, t < 1, limit < 0, a negative or NaN radius).
void check_cluster_batch(const ClusterBatch& batch);

// The op and its sizes, for Backend::supports() (OpShape: engine/ops/backend.h).
struct OpShape;
OpShape op_shape(const ClusterBatch& b);

// The CPU reference: each radius in turn, distances by Eigen in double precision (the figures
// SubGen had before the op existed).
void cpu_key_clusters(const ClusterBatch& batch);

}  // namespace kvscope
