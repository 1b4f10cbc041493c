// The Teaching view's second half (engine/teaching/teaching_modes.h): the exp kernel's truncated
// Taylor features, the numerator and denominator walks, the random-signs race and merge-and-reduce
// against balancekv-stream's own selection.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "engine/core/error.h"
#include "engine/methods/balancekv/softmax_balance.h"
#include "engine/methods/method.h"
#include "engine/teaching/teaching_modes.h"

using namespace kvscope;

TEST(ExpFeatures2D, InnerProductIsTheExpKernelWithinTheTaylorTail) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> coord(-1.5, 1.5);
  for (int degree : {6, 10, 14, 20}) {
    const ExpFeatures2D f(degree);
    EXPECT_EQ(static_cast<int>(f.phi({0.3, -0.2}).size()), (degree + 1) * (degree + 2) / 2);
    double worst = 0;
    for (int trial = 0; trial < 200; ++trial) {
      const TeachVec2 k{coord(rng), coord(rng)}, q{coord(rng), coord(rng)};
      const std::vector<double> pk = f.phi(k), pq = f.phi(q);
      double ip = 0;
      for (size_t i = 0; i < pk.size(); ++i) ip += pk[i] * pq[i];
      const double exact = std::exp((k[0] * q[0] + k[1] * q[1]) / std::sqrt(2.0));
      const double t = std::abs(k[0] * q[0] + k[1] * q[1]) / std::sqrt(2.0);
      // The truncated series never overshoots the tail bound (plus rounding).
      EXPECT_LE(std::abs(ip - exact), ExpFeatures2D::truncation_bound(t, degree) + 1e-12 * exact)
          << "degree " << degree << " k=(" << k[0] << "," << k[1] << ") q=(" << q[0] << "," << q[1]
          << ")";
      worst = std::max(worst, std::abs(ip - exact) / exact);
    }
    if (degree >= 14) {
      EXPECT_LT(worst, 1e-7) << degree;  // |<k,q>|/sqrt 2 <= 3.2 here
    }
  }
  // The features are not exact: degree 2 misses the cubic term visibly.
  const ExpFeatures2D low(2);
  const std::vector<double> a = low.phi({1.5, 1.5}), b = low.phi({1.5, 1.5});
  double ip = 0;
  for (size_t i = 0; i < a.size(); ++i) ip += a[i] * b[i];
  EXPECT_GT(std::abs(ip - std::exp(4.5 / std::sqrt(2.0))), 1.0);
  EXPECT_THROW(ExpFeatures2D(-1), InputError);
  EXPECT_THROW(ExpFeatures2D(41), InputError);
}

TEST(ExpKernelWalk, FeatureInnerProductsMatchTheTalksKernelFormAndSumsAreConsistent) {
  ExpKernelWalk w(24, 5);
  w.run();
  ASSERT_TRUE(w.done());
  EXPECT_LT(w.feature_error(), 1e-6);
  double den_w = 0, den_r = 0;
  TeachVec2 num_w{0, 0};
  for (const auto& s : w.steps()) {
    // The walk's <w_j, u_j> from explicit features equals the talk's kernel sums.
    EXPECT_NEAR(s.den_inner, s.den_inner_kernel, 1e-6 * (1 + std::abs(s.den_inner_kernel)));
    EXPECT_NEAR(s.num_inner, s.num_inner_kernel, 1e-6 * (1 + std::abs(s.num_inner_kernel)));
    EXPECT_NEAR(s.p_den, 0.5 - s.den_inner / (2 * w.c_den()), 1e-15);
    EXPECT_EQ(s.sigma_den, s.uniform < std::clamp(s.p_den, 0.0, 1.0) ? 1 : -1);
    EXPECT_EQ(s.sigma_num, s.uniform < std::clamp(s.p_num, 0.0, 1.0) ? 1 : -1);
    const double e =
        std::exp((w.keys()[s.index][0] * w.query()[0] + w.keys()[s.index][1] * w.query()[1]) /
                 std::sqrt(2.0));
    EXPECT_NEAR(s.e, e, 1e-12);
    den_w += s.sigma_den * e;
    den_r += s.sigma_random * e;
    num_w[0] += s.sigma_num * e * w.values()[s.index][0];
    num_w[1] += s.sigma_num * e * w.values()[s.index][1];
    EXPECT_NEAR(s.den_walk, den_w, 1e-12);
    EXPECT_NEAR(s.den_random, den_r, 1e-12);
    EXPECT_NEAR(s.num_walk[0], num_w[0], 1e-12);
    EXPECT_NEAR(s.num_walk[1], num_w[1], 1e-12);
  }
  // The walk balances along q far better than fair coins (same uniforms): over 40 seeds at
  // n = 64 and the view's default c (a quarter of the largest squared feature norm) the mean
  // error is below 40% of the coins', and the walk wins on at least 30 seeds.
  double dw = 0, dr = 0, nw = 0, nr = 0;
  int den_better = 0, num_better = 0;
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    ExpKernelWalk x(64, seed, 0.25);
    x.run();
    const auto& last = x.steps().back();
    dw += std::abs(last.den_walk), dr += std::abs(last.den_random);
    nw += std::hypot(last.num_walk[0], last.num_walk[1]);
    nr += std::hypot(last.num_random[0], last.num_random[1]);
    den_better += std::abs(last.den_walk) < std::abs(last.den_random);
    num_better += std::hypot(last.num_walk[0], last.num_walk[1]) <
                  std::hypot(last.num_random[0], last.num_random[1]);
  }
  EXPECT_LT(dw, 0.4 * dr);
  EXPECT_LT(nw, 0.4 * nr);
  EXPECT_GE(den_better, 30);
  EXPECT_GE(num_better, 30);
  EXPECT_THROW(ExpKernelWalk(0, 1), InputError);
  EXPECT_THROW(ExpKernelWalk(4, 1, 0.0), InputError);
}

TEST(DiscrepancyRace, WalkStaysBelowRandomSignsAtN1024) {
  for (uint64_t seed : {1u, 2u, 3u, 4u, 5u}) {
    for (int dim : {2, 8}) {
      const DiscrepancyRace r = run_discrepancy_race(1024, dim, 1.0, seed);
      ASSERT_EQ(r.walk.size(), 1024u);
      // Fair coins: E|.|^2 = n, so about 32; the walk stays near O(sqrt(dim) log n).
      EXPECT_LT(r.walk[1023], r.random[1023]) << "seed " << seed << " dim " << dim;
      EXPECT_LT(DiscrepancyRace::max_upto(r.walk, 1024), 4.0 * std::sqrt(dim) * std::log(1024.0))
          << seed;
      EXPECT_LT(DiscrepancyRace::max_upto(r.walk, 1024), 0.5 * std::sqrt(1024.0)) << seed;
    }
  }
  // Random signs do grow like sqrt(n): the mean square over seeds is n within sampling error.
  double ms = 0;
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    const DiscrepancyRace r = run_discrepancy_race(1024, 2, 1.0, seed);
    ms += r.random[1023] * r.random[1023] / 40;
  }
  EXPECT_NEAR(ms, 1024.0, 350.0);
  EXPECT_THROW(run_discrepancy_race(0, 2, 1, 1), InputError);
  EXPECT_THROW(run_discrepancy_race(16, 65, 1, 1), InputError);
}

TEST(MergeReduceTeaching, EachMergeKeepsAtMostHalfAndLevelsFollowAlgorithm3) {
  MergeReduceTeaching t(64, 16, 3, 0.02);
  ASSERT_GE(t.batch(), 2);
  std::vector<int> calls(t.levels() + 1, 0);
  while (t.step()) {
    const auto& lv = t.level_sets();
    long long total = 0;
    for (const auto& l : lv) total += static_cast<long long>(l.size());
    EXPECT_LE(total, t.pushed());
    // C^0 holds exactly the tokens since the last full batch.
    EXPECT_EQ(static_cast<int>(lv[0].size()), t.pushed() % t.batch()) << t.pushed();
  }
  ASSERT_FALSE(t.merges().empty());
  for (const auto& m : t.merges()) {
    EXPECT_LE(2 * m.kept.size(), m.input.size()) << "level " << m.level;  // halves (or less)
    EXPECT_EQ(m.sigma.size(), m.input.size());
    ++calls[m.level];
    // The kept class is the smaller sign class.
    int plus = 0;
    for (int s : m.sigma) plus += s > 0;
    EXPECT_EQ(static_cast<int>(m.kept.size()),
              std::min(plus, static_cast<int>(m.input.size()) - plus));
  }
  // Level l is reduced once every 2^l batches (l < T).
  for (int l = 0; l < t.levels(); ++l) EXPECT_EQ(calls[l], (64 / t.batch()) >> l) << l;
  long long kept = 0;
  for (const auto& l : t.level_sets()) kept += static_cast<long long>(l.size());
  EXPECT_LE(kept, t.size_bound());
  EXPECT_LE(kept, 16);
}

TEST(MergeReduceTeaching, KeptSetEqualsBalancekvStreamsDenominator) {
  for (uint64_t seed : {1u, 9u}) {
    for (double c_scale : {1.0, 0.01}) {
      for (auto [n, m] : {std::pair{48, 12}, std::pair{100, 30}, std::pair{256, 32}}) {
        MergeReduceTeaching t(n, m, seed, c_scale);
        t.run();
        MatrixF values = MatrixF::Constant(n, 2, 1.0f);
        MethodInput in;
        in.keys = &t.keys();
        in.values = &values;
        in.n = n;
        in.mid_begin = 0;
        in.mid_end = n;
        in.budget = m;
        in.seed = seed;
        in.params["c_scale"] = c_scale;
        const Selection sel = balancekv_stream_select(in);
        const auto kept = t.kept_with_weights();
        ASSERT_EQ(kept.size(), sel.den_indices.size()) << n << " " << seed << " " << c_scale;
        for (size_t i = 0; i < kept.size(); ++i) {
          EXPECT_EQ(kept[i].first, sel.den_indices[i]);
          EXPECT_EQ(kept[i].second, sel.den_weights[i]);
        }
      }
    }
  }
  EXPECT_THROW(MergeReduceTeaching(64, 64, 1), InputError);
  EXPECT_THROW(MergeReduceTeaching(1, 1, 1), InputError);
}
