// engine/geometry/knn.h: the exact k nearest neighbours against a plain double-precision ranking of
// all pairs, on every tile kernel this CPU runs (the AVX2 register-block kernel and the portable
// Eigen one, picked through engine/core/simd.h's table).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "engine/core/error.h"
#include "engine/core/random.h"
#include "engine/core/simd.h"
#include "engine/geometry/knn.h"

using namespace kvscope;

namespace {

// The k first other rows of every row by (double distance, index).
std::vector<std::vector<std::pair<double, int>>> reference_knn(const MatrixF& x, int k) {
  const int n = static_cast<int>(x.rows());
  std::vector<std::vector<std::pair<double, int>>> out(n);
  std::vector<std::pair<double, int>> all;
  for (int i = 0; i < n; ++i) {
    all.clear();
    for (int j = 0; j < n; ++j)
      if (j != i) all.emplace_back((x.row(i) - x.row(j)).cast<double>().squaredNorm(), j);
    std::partial_sort(all.begin(), all.begin() + k + 1, all.end());
    out[i].assign(all.begin(), all.begin() + k + 1);  // one more: the k-th's successor
  }
  return out;
}

// Entries of knn_exact's result (neighbours nb, distances d2, k per row) that differ from the
// reference ranking, in index or in distance (exact distances: integer coordinates).
int ranking_mismatches(const std::vector<int>& nb, const std::vector<float>& d2,
                       const std::vector<std::vector<std::pair<double, int>>>& truth, int k) {
  int wrong = 0;
  for (size_t i = 0; i < truth.size(); ++i)
    for (int r = 0; r < k; ++r) {
      const size_t at = i * k + r;
      wrong += nb[at] != truth[i][r].second || d2[at] != static_cast<float>(truth[i][r].first);
    }
  return wrong;
}

// Runs `fn` once with each tile kernel the CPU runs ("portable" through the SSE2 table, "avx2"
// through the widest), then restores the table.
template <class Fn>
void for_each_kernel(Fn&& fn) {
  const std::string widest = simd::kernels().name;
  const std::vector<std::string> names = simd::available();
  std::vector<std::string> run = {"sse2"};
  if (std::find(names.begin(), names.end(), "avx2") != names.end()) run.push_back("avx2");
  for (const std::string& name : run) {
    simd::use(name);
    SCOPED_TRACE("SIMD table " + name);
    fn();
  }
  simd::use(widest);
}

// Clustered float points (a few Gaussian blobs), some rows exact copies of others.
// Coordinates in {-1, 0, 1}: every squared distance is an exact small integer, so rankings
// (ties broken by index) must match the reference exactly.
MatrixF integer_points(int n, int d, uint64_t seed) {
  CounterRng rng(seed, kRandMisc, 5, 6);
  MatrixF x(n, d);
  for (int i = 0; i < n; ++i)
    for (int c = 0; c < d; ++c) x(i, c) = static_cast<float>(static_cast<int>(rng.below(3)) - 1);
  return x;
}

MatrixF clustered_points(int n, int d, uint64_t seed) {
  CounterRng rng(seed, kRandMisc, 3, 4);
  const int blobs = 7;
  MatrixF centres(blobs, d);
  for (int b = 0; b < blobs; ++b)
    for (int c = 0; c < d; ++c) centres(b, c) = static_cast<float>(6 * (rng.uniform() - 0.5));
  MatrixF x(n, d);
  for (int i = 0; i < n; ++i) {
    const int b = static_cast<int>(rng.below(blobs));
    for (int c = 0; c < d; ++c) {
      const double u1 = std::max(rng.uniform(), 1e-300), u2 = rng.uniform();
      x(i, c) = centres(b, c) +
                static_cast<float>(std::sqrt(-2 * std::log(u1)) * std::cos(6.283185307179586 * u2));
    }
  }
  for (int i = 0; i < 60; ++i) x.row(n - 1 - 7 * i) = x.row(5 * i);  // exact duplicates
  return x;
}

}  // namespace

// Float points: the returned sets are the true ones except where the k-th and (k+1)-th true
// distances tie to float rounding, distances are the true ones to the GEMM form's rounding, and
// rows are sorted. n = 2101 is a multiple of no tile, panel or register-block size.
TEST(Knn, FloatPointsGiveTheExactNeighbours) {
  const int n = 2101, d = 72, k = 31;
  const MatrixF x = clustered_points(n, d, 41);
  const auto truth = reference_knn(x, k);
  for_each_kernel([&] {
    std::vector<int> nb;
    std::vector<float> d2;
    knn_exact(x, k, nb, d2);
    ASSERT_EQ(nb.size(), static_cast<size_t>(n) * k);
    int outside = 0;
    for (int i = 0; i < n; ++i) {
      const double kth = truth[i][k - 1].first, next = truth[i][k].first;
      const double tol = 2e-5 * (kth + x.row(i).squaredNorm()) + 1e-5;
      std::vector<int> row(nb.begin() + static_cast<size_t>(i) * k,
                           nb.begin() + static_cast<size_t>(i + 1) * k);
      for (int r = 0; r < k; ++r) {
        const int j = row[r];
        ASSERT_NE(j, i);
        ASSERT_GE(j, 0);
        ASSERT_LT(j, n);
        const double dist = (x.row(i) - x.row(j)).cast<double>().squaredNorm();
        EXPECT_LE(dist, kth + tol) << "row " << i << " rank " << r;
        EXPECT_NEAR(d2[static_cast<size_t>(i) * k + r], dist, tol);
        if (r > 0) {
          EXPECT_LE(d2[static_cast<size_t>(i) * k + r - 1], d2[static_cast<size_t>(i) * k + r]);
        }
      }
      std::sort(row.begin(), row.end());
      EXPECT_TRUE(std::adjacent_find(row.begin(), row.end()) == row.end()) << "row " << i;
      // Every true neighbour clearly inside the k-th distance is returned.
      for (int r = 0; r < k; ++r) {
        if (truth[i][r].first < kth - tol) {
          EXPECT_TRUE(std::binary_search(row.begin(), row.end(), truth[i][r].second))
              << "row " << i << " misses " << truth[i][r].second;
        }
      }
      if (next - kth > tol) {
        for (int r = 0; r < k; ++r)
          outside += !std::binary_search(row.begin(), row.end(), truth[i][r].second);
      }
    }
    EXPECT_EQ(outside, 0);
    // A duplicated row's nearest neighbour is its twin, at distance 0 to rounding.
    for (int i = 0; i < 60; ++i) {
      const int dup = n - 1 - 7 * i, orig = 5 * i;
      EXPECT_EQ(nb[static_cast<size_t>(dup) * k], orig);
      EXPECT_LT(d2[static_cast<size_t>(dup) * k], 1e-2f);
    }
  });
}

// Small integer coordinates: every norm, dot product and distance is exact in float, so there is
// no rounding to excuse and the result must be exactly the (distance, index) ranking, ties and
// all (many rows are at equal distances, and whole groups of rows are identical).
TEST(Knn, IntegerPointsGiveTheExactRankingWithTiesToTheLowerIndex) {
  const int n = 1400, d = 40, k = 23;
  MatrixF x = integer_points(n, d, 7);
  for (int i = 0; i < 50; ++i) x.row(700 + i) = x.row(i % 5);  // five groups of 11 equal rows
  const auto truth = reference_knn(x, k);
  for_each_kernel([&] {
    std::vector<int> nb;
    std::vector<float> d2;
    knn_exact(x, k, nb, d2);
    EXPECT_EQ(ranking_mismatches(nb, d2, truth, k), 0);
    // Row 0's copies are rows 700, 705, ..., 745: its ten first neighbours, lowest index first.
    for (int r = 0; r < 10; ++r) {
      EXPECT_EQ(nb[r], 700 + 5 * r);
      EXPECT_EQ(d2[r], 0.f);
    }
  });
}

// From n = 4096 on, each point's threshold starts at an estimate of its k-th distance from a
// strided sample of the points (engine/geometry/knn.cpp: sample t is row t * n / m, m = ceil(6 n /
// k)), and a point left with fewer than k candidates within it is recomputed against all others.
// Row 7 is copied onto sample rows 1..14, so its estimate (the 14th smallest sample distance) is
// 0 and only its 14 copies are within it: it takes the recomputation. Integer coordinates keep
// every distance exact, so the ranking must be exactly the reference one.
TEST(Knn, SampledThresholdsKeepTheRankingExact) {
  const int n = 4500, d = 40, k = 50;
  const int m = (6 * n + k - 1) / k;
  MatrixF x = integer_points(n, d, 11);
  for (int t = 1; t <= 14; ++t) x.row(static_cast<int>(static_cast<int64_t>(t) * n / m)) = x.row(7);
  for (int i = 0; i < 30; ++i) x.row(4000 + i) = x.row(2000 + i % 3);  // more equal rows
  const auto truth = reference_knn(x, k);
  for_each_kernel([&] {
    std::vector<int> nb;
    std::vector<float> d2;
    knn_exact(x, k, nb, d2);
    EXPECT_EQ(ranking_mismatches(nb, d2, truth, k), 0);
    for (int t = 0; t < 14; ++t) EXPECT_EQ(d2[static_cast<size_t>(7) * k + t], 0.f);
    EXPECT_GT(d2[static_cast<size_t>(7) * k + 14], 0.f);
  });
}

// Fewer points than one tile, k = n - 1 (every other point), and the thread count's edge: the
// same ranking.
TEST(Knn, AllOtherPointsWhenKIsNMinusOne) {
  for (const int n : {2, 17, 600}) {
    const int d = 48, k = n - 1;
    CounterRng rng(n, kRandMisc, 7, 8);
    MatrixF x(n, d);
    for (int i = 0; i < n; ++i)
      for (int c = 0; c < d; ++c) x(i, c) = static_cast<float>(static_cast<int>(rng.below(9)) - 4);
    const auto truth = reference_knn(x, k - 1);  // the k-th's successor does not exist
    for_each_kernel([&] {
      std::vector<int> nb;
      std::vector<float> d2;
      knn_exact(x, k, nb, d2);
      for (int i = 0; i < n; ++i) {
        std::vector<int> row(nb.begin() + static_cast<size_t>(i) * k,
                             nb.begin() + static_cast<size_t>(i + 1) * k);
        for (int r = 0; r < k; ++r) EXPECT_EQ(row[r], truth[i][r].second) << n << " " << i;
      }
    });
  }
}

TEST(Knn, BadInputAndCancellation) {
  const MatrixF x = clustered_points(900, 40, 3);
  std::vector<int> nb;
  std::vector<float> d2;
  EXPECT_THROW(knn_exact(x, 0, nb, d2), InputError);
  EXPECT_THROW(knn_exact(x, 900, nb, d2), InputError);
  MatrixF bad = x;
  bad(17, 3) = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THROW(knn_exact(bad, 10, nb, d2), InputError);
  bad(17, 3) = 3e20f;  // finite, but its square overflows float
  EXPECT_THROW(knn_exact(bad, 10, nb, d2), InputError);
  std::atomic<bool> cancel{true};
  EXPECT_THROW(knn_exact(x, 10, nb, d2, &cancel), Cancelled);
}
