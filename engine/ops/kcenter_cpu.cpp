// The CPU reference of the k-center op (engine/ops/kcenter.h): Gonzalez's greedy picks in double
// precision. engine/geometry/kcenter.h's greedy_kcenter is this op on a MatrixF; the CUDA kernel
// (kernels/kcenter.cu) is tested against it (tests/test_cuda_parity.cpp).
#include <Eigen/Core>
#include <algorithm>
#include <string>
#include <vector>

#include "engine/core/error.h"
#include "engine/ops/backend.h"
#include "engine/ops/kcenter.h"

namespace kvscope {
namespace {

using RowMatrixD = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// Squared distances of every row of `x` to row `c`.
Eigen::VectorXd squared_distances_to(const RowMatrixD& x, int c) {
  return (x.rowwise() - x.row(c)).rowwise().squaredNorm();
}

std::vector<int> kcenter_rows(const RowMatrixD& x, int k, int first) {
  const int n = static_cast<int>(x.rows());
  if (k < 0) throw InputError("k-center: k must be >= 0, got " + std::to_string(k));
  if (n == 0 || k == 0) return {};
  if (first < 0 || first >= n)
    throw InputError("k-center: first point " + std::to_string(first) + " is not a row of the " +
                     std::to_string(n) + " points");
  k = std::min(k, n);
  std::vector<int> picks;
  picks.reserve(k);
  picks.push_back(first);
  // nearest[i]: squared distance from row i to its nearest centre so far.
  // Chosen rows are marked -1 so duplicates of a centre (distance 0) are picked as new rows only
  // when every unchosen row is at distance 0, and a row is never picked twice.
  Eigen::VectorXd nearest = squared_distances_to(x, first);
  nearest[first] = -1;
  while (static_cast<int>(picks.size()) < k) {
    Eigen::Index far = 0;
    nearest.maxCoeff(&far);  // Eigen returns the first maximum: ties go to the lowest row
    picks.push_back(static_cast<int>(far));
    nearest = nearest.cwiseMin(squared_distances_to(x, static_cast<int>(far)));
    nearest[far] = -1;
  }
  return picks;
}

}  // namespace

std::vector<int> cpu_kcenter(const float* x, int n, int d, int k, int first) {
  if (n < 0 || d < 0) throw InputError("k-center: negative shape");
  if (n > 0 && !x) throw InputError("k-center: no points given");
  RowMatrixD xd(n, d);
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < d; ++j) xd(i, j) = x[static_cast<size_t>(i) * d + j];
  return kcenter_rows(xd, k, first);
}

OpShape kcenter_shape(int n, int d, int k) {
  return {Op::kcenter, n, d, 0, k, false};
}

}  // namespace kvscope
