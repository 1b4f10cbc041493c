#include "engine/geometry/kcenter.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

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

}  // namespace

std::vector<int> greedy_kcenter(const MatrixF& x, int k, int first) {
  return cpu_kcenter(x.data(), static_cast<int>(x.rows()), static_cast<int>(x.cols()), k, first);
}

std::vector<int> assign_to_centres(const MatrixF& x, const std::vector<int>& centres) {
  if (centres.empty()) return {};
  const RowMatrixD xd = x.cast<double>();
  const int n = static_cast<int>(x.rows());
  std::vector<int> owner(n, 0);
  Eigen::VectorXd best = squared_distances_to(xd, centres[0]);
  for (size_t c = 1; c < centres.size(); ++c) {
    const Eigen::VectorXd dist = squared_distances_to(xd, centres[c]);
    for (int i = 0; i < n; ++i)
      if (dist[i] < best[i]) {
        best[i] = dist[i];
        owner[i] = static_cast<int>(c);
      }
  }
  return owner;
}

double covering_radius(const MatrixF& x, const std::vector<int>& centres) {
  if (x.rows() == 0) return 0.0;
  if (centres.empty()) return std::numeric_limits<double>::infinity();
  const RowMatrixD xd = x.cast<double>();
  Eigen::VectorXd best = squared_distances_to(xd, centres[0]);
  for (size_t c = 1; c < centres.size(); ++c)
    best = best.cwiseMin(squared_distances_to(xd, centres[c]));
  return std::sqrt(best.maxCoeff());
}

double rms_spread(const MatrixF& x) {
  if (x.rows() == 0) return 0.0;
  const RowMatrixD xd = x.cast<double>();
  const Eigen::RowVectorXd mean = xd.colwise().mean();
  return std::sqrt((xd.rowwise() - mean).rowwise().squaredNorm().mean());
}

int kcenter_count_within(Backend& backend, const MatrixF& x, double radius, int cap, bool* capped) {
  const int n = static_cast<int>(x.rows());
  if (capped) *capped = false;
  if (n == 0) return 0;
  const int k = std::min(std::max(cap, 1), n);
  const std::vector<int> picks = backend.kcenter(x.data(), n, static_cast<int>(x.cols()), k, 0);
  const RowMatrixD xd = x.cast<double>();
  const double r2 = radius * radius;
  Eigen::VectorXd nearest = squared_distances_to(xd, picks[0]);
  for (size_t j = 1; j < picks.size(); ++j) {
    if (nearest.maxCoeff() <= r2) return static_cast<int>(j);
    nearest = nearest.cwiseMin(squared_distances_to(xd, picks[j]));
  }
  if (nearest.maxCoeff() <= r2) return static_cast<int>(picks.size());
  if (capped) *capped = true;
  return static_cast<int>(picks.size());
}

KCenterFigure kcenter_figure(Backend& backend, const MatrixF& x, int k, double radius, int cap,
                             const std::atomic<bool>* cancel) {
  if (k < 1) throw InputError("k-center: k must be >= 1, got " + std::to_string(k));
  if (!(radius > 0) || !std::isfinite(radius))
    throw InputError("k-center: the cluster radius must be > 0");
  KCenterFigure f;
  f.radius = radius;
  const int n = static_cast<int>(x.rows());
  if (n == 0) return f;
  f.centres = backend.kcenter(x.data(), n, static_cast<int>(x.cols()), std::min(k, n), 0);
  f.owner = assign_to_centres(x, f.centres);
  f.covering = covering_radius(x, f.centres);
  for (int p = 16; p < n; p *= 2) f.prefix.push_back(p);
  f.prefix.push_back(n);
  for (int p : f.prefix) {
    if (cancel && cancel->load()) throw Cancelled();
    bool over = false;
    const MatrixF head = x.topRows(p);
    f.clusters.push_back(kcenter_count_within(backend, head, radius, cap, &over));
    f.capped.push_back(over ? 1 : 0);
  }
  return f;
}

}  // namespace kvscope
