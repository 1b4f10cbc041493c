// The CPU reference of the key-clustering op (engine/ops/key_clusters.h): SubGen's cluster_stream
// moved here unchanged (engine/methods/subgen.cpp had it), one radius after another. The CUDA
// kernel (kernels/key_clusters.cu) is tested against it (tests/test_cuda_parity.cpp).
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "engine/core/error.h"
#include "engine/core/tensor.h"
#include "engine/ops/backend.h"
#include "engine/ops/key_clusters.h"

namespace kvscope {
namespace {

using ConstMapF = Eigen::Map<const MatrixF>;

// Online clustering of the rows of `keys`, in order, with radius delta. Stops as soon as the
// capacity exceeds `limit` (it only grows along the stream).
KeyClusters cluster_stream(const MatrixD& keys, double delta, int t, long long limit) {
  const int n = static_cast<int>(keys.rows());
  KeyClusters c;
  c.owner.assign(n, -1);
  MatrixD reps(std::min<long long>(n, limit + 1) + 1, keys.cols());
  int num = 0;
  const double delta2 = delta * delta;
  for (int i = 0; i < n; ++i) {
    int best = -1;
    double best_d2 = 0;
    if (num > 0) {
      Eigen::Index arg = 0;
      best_d2 = (reps.topRows(num).rowwise() - keys.row(i)).rowwise().squaredNorm().minCoeff(&arg);
      best = static_cast<int>(arg);
    }
    if (best >= 0 && best_d2 <= delta2) {
      c.owner[i] = best;
      if (c.size[best]++ < t) ++c.capacity;
    } else {
      if (num == reps.rows()) reps.conservativeResize(2 * reps.rows(), Eigen::NoChange);
      reps.row(num) = keys.row(i);
      c.owner[i] = num++;
      c.size.push_back(1);
      ++c.capacity;
    }
    if (c.capacity > limit) {
      c.over = true;
      return c;
    }
  }
  return c;
}

}  // namespace

void check_cluster_batch(const ClusterBatch& b) {
  if (b.n < 0 || b.d < 0) throw std::invalid_argument("key_clusters: negative shape");
  if (b.n > 0 && !b.keys) throw std::invalid_argument("key_clusters: no keys given");
  if (!b.deltas.empty() && !b.out) throw std::invalid_argument("key_clusters: no outputs given");
  if (b.t < 1) throw std::invalid_argument("key_clusters: t must be >= 1");
  if (b.limit < 0) throw std::invalid_argument("key_clusters: the capacity limit must be >= 0");
  for (double delta : b.deltas)
    if (!(delta >= 0))
      throw std::invalid_argument("key_clusters: radius " + std::to_string(delta) + " is not >= 0");
}

void cpu_key_clusters(const ClusterBatch& b) {
  check_cluster_batch(b);
  if (b.deltas.empty()) return;
  const MatrixD keys = ConstMapF(b.keys, b.n, b.d).cast<double>();
  for (size_t r = 0; r < b.deltas.size(); ++r) {
    if (b.cancel && b.cancel->load(std::memory_order_relaxed)) throw Cancelled();
    b.out[r] = cluster_stream(keys, b.deltas[r], b.t, b.limit);
  }
}

OpShape op_shape(const ClusterBatch& b) {
  return {Op::key_clusters, b.n, b.d, 0, static_cast<int>(b.deltas.size()), false};
}

}  // namespace kvscope
