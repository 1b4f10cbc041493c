// SubGen's Figure 1 numbers (engine/geometry/kcenter.h): the k-center centres the Geometry view
// marks and the clusters found at a radius as the prefix grows, through the backend.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "engine/core/error.h"
#include "engine/geometry/kcenter.h"
#include "engine/ops/backend.h"

using namespace kvscope;

namespace {

// `blobs` tight Gaussian blobs (sd `spread`) on a circle of radius 10 in d dimensions, points
// assigned round-robin so every prefix of >= blobs rows touches every blob.
MatrixF blob_points(int n, int d, int blobs, double spread, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> g(0.0, spread);
  MatrixF x(n, d);
  for (int i = 0; i < n; ++i) {
    const int b = i % blobs;
    for (int j = 0; j < d; ++j) x(i, j) = static_cast<float>(g(rng));
    x(i, 0) += static_cast<float>(10 * std::cos(2 * M_PI * b / blobs));
    x(i, 1) += static_cast<float>(10 * std::sin(2 * M_PI * b / blobs));
  }
  return x;
}

}  // namespace

TEST(KCenterFigure, CentresArePointsAndCoverWithinTheirRadius) {
  const MatrixF x = blob_points(600, 8, 5, 0.3, 1);
  const KCenterFigure f = kcenter_figure(cpu_backend(), x, 16, 2.0, 64);
  ASSERT_EQ(f.centres.size(), 16u);
  // Centres are actual rows, distinct, and the first is row 0.
  EXPECT_EQ(f.centres[0], 0);
  std::vector<int> sorted = f.centres;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_TRUE(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end());
  ASSERT_EQ(f.owner.size(), 600u);
  double worst = 0;
  for (int i = 0; i < 600; ++i) {
    const int c = f.centres[f.owner[i]];
    ASSERT_GE(c, 0);
    ASSERT_LT(c, 600);
    const double dist = (x.row(i).cast<double>() - x.row(c).cast<double>()).norm();
    // Every point lies within the covering radius of its (nearest) centre ...
    EXPECT_LE(dist, f.covering + 1e-9) << i;
    // ... and no other centre is nearer.
    for (int other : f.centres)
      EXPECT_LE(dist, (x.row(i).cast<double>() - x.row(other).cast<double>()).norm() + 1e-9);
    worst = std::max(worst, dist);
  }
  EXPECT_NEAR(worst, f.covering, 1e-9);
  // 16 centres on 5 blobs of sd 0.3 in 8-D: the covering radius is inside a blob.
  EXPECT_LT(f.covering, 3.0);
}

TEST(KCenterFigure, CountsTheBlobsAtEveryPrefixAndGrowWithoutStructure) {
  // Five blobs, radius between the blob size and their separation: five clusters at every
  // prefix that holds all five blobs, however long.
  const MatrixF x = blob_points(2048, 8, 5, 0.3, 2);
  const KCenterFigure f = kcenter_figure(cpu_backend(), x, 16, 4.0, 128);
  ASSERT_EQ(f.prefix.front(), 16);
  ASSERT_EQ(f.prefix.back(), 2048);
  ASSERT_EQ(f.clusters.size(), f.prefix.size());
  for (size_t i = 0; i < f.prefix.size(); ++i) {
    EXPECT_EQ(f.clusters[i], 5) << "prefix " << f.prefix[i];
    EXPECT_EQ(f.capped[i], 0);
  }
  // Unstructured Gaussian points at a radius of half their spread: the count grows with n.
  std::mt19937 rng(3);
  std::normal_distribution<double> g(0.0, 1.0);
  MatrixF y(2048, 4);
  for (int i = 0; i < y.rows(); ++i)
    for (int j = 0; j < 4; ++j) y(i, j) = static_cast<float>(g(rng));
  const KCenterFigure h = kcenter_figure(cpu_backend(), y, 16, 0.5 * rms_spread(y), 4096);
  EXPECT_GT(h.clusters.back(), 4 * h.clusters.front());
  // The count is exact: its centres cover within the radius, one fewer does not.
  const int c = h.clusters.back();
  const std::vector<int> picks = greedy_kcenter(y, c);
  EXPECT_LE(covering_radius(y, picks), h.radius);
  EXPECT_GT(covering_radius(y, std::vector<int>(picks.begin(), picks.end() - 1)), h.radius);
  // A cap below the need is reported.
  bool capped = false;
  EXPECT_EQ(kcenter_count_within(cpu_backend(), y, h.radius, 8, &capped), 8);
  EXPECT_TRUE(capped);
  EXPECT_THROW(kcenter_figure(cpu_backend(), y, 0, 1.0, 8), InputError);
  EXPECT_THROW(kcenter_figure(cpu_backend(), y, 4, 0.0, 8), InputError);
}

TEST(KCenterFigure, RmsSpreadIsTheRootMeanSquareDistanceToTheMean) {
  MatrixF x(4, 2);
  x << 1, 1, -1, 1, 1, -1, -1, -1;
  EXPECT_NEAR(rms_spread(x), std::sqrt(2.0), 1e-12);
  x.col(0).array() += 5;  // translation changes nothing
  EXPECT_NEAR(rms_spread(x), std::sqrt(2.0), 1e-12);
}
