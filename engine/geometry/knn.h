// Exact k nearest neighbours (squared Euclidean) of every row of a point set, for t-SNE's sparse
// input affinities.
#pragma once

#include <atomic>
#include <vector>

#include "engine/core/tensor.h"

namespace kvscope {

// neighbours[i * k + r], dist2[i * k + r]: the k nearest other rows of row i, ordered by
// (distance, index): nearest first, ties to the lower index. Duplicates of row i are legitimate
// neighbours at distance 0; i itself never is. Needs 1 <= k <= rows - 1.
//  - d <= 32: an exact k-d tree search (nanoflann).
//  - otherwise: blocked brute force over the upper triangle of the Gram matrix (every pair is
//    computed once and offered to both points), in 512 x 512 tiles taken by the threads as they
//    finish one. With AVX2 (engine/core/simd.h's table is avx2 or wider) a 6 x 16 register-block
//    kernel computes |a|^2 + |b|^2 - 2 a.b and compares it with both points' thresholds while it
//    is still in registers; otherwise an Eigen float GEMM per tile, then a pass over it. Offers
//    that beat a threshold are appended to that point's buffer (per thread), which is cut back
//    to its k nearest when full. From n = 4096 on (AVX2), thresholds start at an estimate of
//    each point's k-th distance from a strided sample of the points; a point left with fewer
//    than k candidates is recomputed against all, so the result stays exact.
//    The result is the same for any thread count and schedule.
// Distances are float and clamped at 0 (the GEMM form can round a duplicate's slightly below).
// Centre the points first: the GEMM form loses precision to a large common offset. Throws
// Cancelled when `cancel` is set.
void knn_exact(const MatrixF& x, int k, std::vector<int>& neighbours, std::vector<float>& dist2,
               const std::atomic<bool>* cancel = nullptr);

}  // namespace kvscope
