// Greedy k-center (engine/geometry/kcenter.h): farthest-first picks, the 2-approximation of the
// covering radius against brute force on tiny inputs, the Voronoi assignment, and subgen-kcenter on
// top.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "engine/core/error.h"
#include "engine/geometry/kcenter.h"
#include "engine/methods/method.h"
#include "engine/ops/backend.h"

namespace kvscope {
namespace {

MatrixF random_points(int n, int d, unsigned seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  MatrixF x(n, d);
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < d; ++j) x(i, j) = normal(gen);
  return x;
}

double dist(const MatrixF& x, int a, int b) {
  return (x.row(a).cast<double>() - x.row(b).cast<double>()).norm();
}

TEST(KCenter, EachPickIsTheFarthestPointFromThePreviousPicks) {
  const MatrixF x = random_points(60, 3, 1);
  const std::vector<int> picks = greedy_kcenter(x, 12, 5);
  ASSERT_EQ(picks.size(), 12u);
  EXPECT_EQ(picks[0], 5);
  for (size_t p = 1; p < picks.size(); ++p) {
    auto to_previous = [&](int i) {
      double best = std::numeric_limits<double>::infinity();
      for (size_t q = 0; q < p; ++q) best = std::min(best, dist(x, i, picks[q]));
      return best;
    };
    double farthest = -1;
    int arg = -1;
    for (int i = 0; i < x.rows(); ++i)
      if (to_previous(i) > farthest) {
        farthest = to_previous(i);
        arg = i;
      }
    EXPECT_EQ(picks[p], arg) << "pick " << p;
    EXPECT_NEAR(to_previous(picks[p]), farthest, 1e-12);
  }
}

// Brute force: the smallest covering radius over all k-subsets.
double optimal_radius(const MatrixF& x, int k) {
  const int n = static_cast<int>(x.rows());
  double best = std::numeric_limits<double>::infinity();
  std::vector<int> subset;
  for (unsigned mask = 0; mask < (1u << n); ++mask) {
    if (__builtin_popcount(mask) != k) continue;
    subset.clear();
    for (int i = 0; i < n; ++i)
      if (mask & (1u << i)) subset.push_back(i);
    best = std::min(best, covering_radius(x, subset));
  }
  return best;
}

TEST(KCenter, CoveringRadiusWithinTwiceTheOptimum) {
  int strictly_worse = 0;
  for (unsigned seed = 0; seed < 25; ++seed) {
    const MatrixF x = random_points(10, 2, 100 + seed);
    for (int k : {1, 2, 3, 4}) {
      const double opt = optimal_radius(x, k);
      const double greedy = covering_radius(x, greedy_kcenter(x, k, 0));
      EXPECT_LE(greedy, 2 * opt + 1e-12) << "seed " << seed << " k " << k;
      EXPECT_GE(greedy, opt - 1e-12);
      strictly_worse += greedy > opt + 1e-9;
    }
  }
  // Greedy is an approximation: on random inputs it is sometimes strictly worse than optimal,
  // which shows the brute force is a real reference.
  EXPECT_GT(strictly_worse, 0);
}

TEST(KCenter, BackendAndRawArrayAgreeWithTheMatrixApi) {
  const MatrixF x = random_points(200, 8, 7);
  const std::vector<int> a = greedy_kcenter(x, 30, 3);
  EXPECT_EQ(cpu_kcenter(x.data(), 200, 8, 30, 3), a);
  EXPECT_EQ(cpu_backend().kcenter(x.data(), 200, 8, 30, 3), a);
}

TEST(KCenter, DuplicatesAndLargeKGiveDistinctRows) {
  MatrixF x(6, 2);
  x << 0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 5, 5;
  const std::vector<int> all = greedy_kcenter(x, 10, 0);
  ASSERT_EQ(all.size(), 6u);
  std::vector<int> sorted = all;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, (std::vector<int>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(all[1], 5);  // the far point first
  EXPECT_DOUBLE_EQ(covering_radius(x, greedy_kcenter(x, 3, 0)), 0.0);
}

TEST(KCenter, AssignmentIsToTheNearestCentre) {
  const MatrixF x = random_points(80, 4, 9);
  const std::vector<int> centres = greedy_kcenter(x, 7, 0);
  const std::vector<int> owner = assign_to_centres(x, centres);
  ASSERT_EQ(owner.size(), 80u);
  for (int i = 0; i < 80; ++i) {
    double best = std::numeric_limits<double>::infinity();
    for (int c : centres) best = std::min(best, dist(x, i, c));
    EXPECT_NEAR(dist(x, i, centres[owner[i]]), best, 1e-12);
  }
  for (size_t c = 0; c < centres.size(); ++c) EXPECT_EQ(owner[centres[c]], static_cast<int>(c));
}

TEST(KCenter, BadArgumentsAreInputErrors) {
  const MatrixF x = random_points(5, 2, 1);
  EXPECT_THROW(greedy_kcenter(x, -1, 0), InputError);
  EXPECT_THROW(greedy_kcenter(x, 2, 5), InputError);
  EXPECT_TRUE(greedy_kcenter(x, 0, 0).empty());
  EXPECT_TRUE(greedy_kcenter(MatrixF(0, 2), 3, 0).empty());
}

TEST(SubGenKCenter, KeepsTheGreedyCentresOfTheMiddle) {
  const MatrixF keys = random_points(120, 6, 3);
  const MatrixF values = random_points(120, 6, 4);
  MethodInput in;
  in.keys = &keys;
  in.values = &values;
  in.n = 120;
  in.sink = in.mid_begin = 4;
  in.eval = 16;
  in.mid_end = 104;
  in.budget = 15;
  const Method* method = find_method("subgen-kcenter");
  ASSERT_NE(method, nullptr);
  const Selection sel = method->select(in);
  const MatrixF middle = keys.middleRows(4, 100);
  std::vector<int> centres = greedy_kcenter(middle, 15, 0);
  std::vector<int> expected = centres;
  for (int& c : expected) c += 4;
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(sel.indices, expected);
  for (double w : sel.weights) EXPECT_EQ(w, 1.0);  // the paper's experiment: plain cache entries
  ASSERT_EQ(sel.cluster.size(), 100u);
  EXPECT_EQ(sel.cluster, assign_to_centres(middle, centres));

  in.params["weighting"] = 1;  // cluster size
  const Selection sized = method->select(in);
  EXPECT_EQ(sized.indices, expected);
  double total = 0;
  for (double w : sized.weights) total += w;
  EXPECT_DOUBLE_EQ(total, 100.0);  // the clusters partition the middle
}

}  // namespace
}  // namespace kvscope
