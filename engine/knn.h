// Exact k nearest neighbours (squared Euclidean) of every row of a point set, for t-SNE's sparse
// input affinities.
#pragma once

#include <atomic>
#include <vector>

#include "engine/tensor.h"

namespace kvscope {

// neighbours[i * k + r], dist2[i * k + r]: the k nearest other rows of row i, ordered by
// (distance, index): nearest first, ties to the lower index. Duplicates of row i are legitimate
// neighbours at distance 0; i itself never is. Needs 1 <= k <= rows - 1.
//  - d <= 32: an exact k-d tree search (nanoflann).
//  - otherwise: blocked brute force. Each pair of 512-row blocks is multiplied once (a float GEMM,
//    the upper triangle of the Gram matrix only: every pair is seen once and offered to both
//    points), distances |a|^2 + |b|^2 - 2 a.b are compared against each point's current k-th
//    distance, and the few that beat it enter a bounded heap. Per-thread heaps are merged at the
//    end, so the result is the same for any thread count.
// Distances are float and clamped at 0 (the GEMM form can round a duplicate's slightly below).
// Centre the points first: the GEMM form loses precision to a large common offset. Throws
// Cancelled when `cancel` is set.
void knn_exact(const MatrixF& x, int k, std::vector<int>& neighbours, std::vector<float>& dist2,
               const std::atomic<bool>* cancel = nullptr);

}  // namespace kvscope
