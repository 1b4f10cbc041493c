// engine/theory: the power-law fit and its interval, Student t, the operator norm of SubGen's
// Eq. 3, and the discrepancy curves on synthetic data whose exponents are known (docs/theory.md).
#include <gtest/gtest.h>

#include <Eigen/SVD>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "engine/core/error.h"
#include "engine/io/capture.h"
#include "engine/teaching/theory.h"
#include "sample_captures.h"

using namespace kvscope;

namespace {

TEST(Theory, StudentTQuantilesMatchTables) {
  EXPECT_NEAR(student_t_quantile(0.975, 1), 12.7062, 1e-3);
  EXPECT_NEAR(student_t_quantile(0.975, 5), 2.5706, 1e-3);
  EXPECT_NEAR(student_t_quantile(0.975, 10), 2.2281, 1e-3);
  EXPECT_NEAR(student_t_quantile(0.975, 1000), 1.9623, 1e-3);
  EXPECT_NEAR(student_t_quantile(0.95, 20), 1.7247, 1e-3);
  EXPECT_NEAR(student_t_quantile(0.025, 10), -2.2281, 1e-3);
}

// y = c * m^-a * exp(noise): the fit recovers -a and its 95% interval covers it about 95% of
// the time.
void check_recovers(double a, double noise) {
  std::mt19937 rng(12345);
  std::normal_distribution<double> g(0, noise);
  const std::vector<double> budgets{13, 25, 51, 101, 202, 405};
  int covered = 0;
  const int trials = 400;
  double mean_slope = 0;
  for (int t = 0; t < trials; ++t) {
    std::vector<double> x, y;
    for (int seed = 0; seed < 5; ++seed)
      for (double m : budgets) {
        x.push_back(m);
        y.push_back(3.0 * std::pow(m, -a) * std::exp(g(rng)));
      }
    const PowerFit f = fit_power_law(x, y);
    ASSERT_TRUE(f.ok);
    EXPECT_EQ(f.points, 30);
    EXPECT_LT(f.ci_low, f.slope);
    EXPECT_GT(f.ci_high, f.slope);
    mean_slope += f.slope / trials;
    if (f.ci_low <= -a && -a <= f.ci_high) ++covered;
  }
  EXPECT_NEAR(mean_slope, -a, 0.01);
  const double coverage = double(covered) / trials;
  EXPECT_GT(coverage, 0.91) << "a = " << a;
  EXPECT_LT(coverage, 0.985) << "a = " << a;
}

TEST(Theory, FitRecoversKnownExponentsAndTheIntervalCovers) {
  check_recovers(0.5, 0.1);
  check_recovers(1.0, 0.1);
  check_recovers(1.0, 0.4);
}

TEST(Theory, FitWithoutNoiseIsExactAndNeedsTwoDistinctX) {
  const PowerFit f = fit_power_law({2, 4, 8, 16}, {1, 0.5, 0.25, 0.125});
  ASSERT_TRUE(f.ok);
  EXPECT_NEAR(f.slope, -1, 1e-12);
  EXPECT_NEAR(f.r2, 1, 1e-12);
  EXPECT_FALSE(fit_power_law({4, 4, 4}, {1, 2, 3}).ok);
  EXPECT_FALSE(fit_power_law({1, 2}, {1, 2}).ok);
  // Non-positive points are left out.
  EXPECT_EQ(fit_power_law({1, 2, 4, 8}, {1, 0, 0.25, 0.125}).points, 3);
}

TEST(Theory, OperatorNormOfPrefixesMatchesSvd) {
  std::mt19937 rng(7);
  std::normal_distribution<float> g(0, 1);
  const int n = 120, dv = 16;
  MatrixF V(n, dv);
  for (int i = 0; i < n; ++i)
    for (int c = 0; c < dv; ++c) V(i, c) = g(rng) + (c == 3 ? 2.f : 0.f) + (c == 5 ? 1.9f : 0.f);
  const int first = 40;
  const std::vector<double> op = prefix_operator_norms(V, first, n - 1);
  const std::vector<double> fro = prefix_frobenius_norms(V, first, n - 1);
  ASSERT_EQ(op.size(), static_cast<size_t>(n - first));
  for (int j = first; j < n; ++j) {
    const MatrixD P = V.topRows(j + 1).cast<double>();
    Eigen::JacobiSVD<MatrixD> svd(P);
    EXPECT_NEAR(op[static_cast<size_t>(j - first)], svd.singularValues()(0),
                1e-9 * svd.singularValues()(0))
        << "prefix " << j;
    EXPECT_NEAR(fro[static_cast<size_t>(j - first)], P.norm(), 1e-9 * P.norm());
    EXPECT_LE(op[static_cast<size_t>(j - first)], fro[static_cast<size_t>(j - first)] + 1e-9);
  }
  // Rank one: the operator norm is the Frobenius norm.
  MatrixF R(30, 4);
  for (int i = 0; i < 30; ++i) R.row(i) << 1.f * (i + 1), 2.f * (i + 1), 0.f, -1.f * (i + 1);
  const auto o1 = prefix_operator_norms(R, 0, 29), f1 = prefix_frobenius_norms(R, 0, 29);
  for (size_t i = 0; i < o1.size(); ++i) EXPECT_NEAR(o1[i], f1[i], 1e-9 * f1[i]);
}

// Random +-1 signs on random unit vectors grow like sqrt(n); the self-balancing walk (gamma 0.5,
// mostly unsaturated) stays far below them: slope under 0.3, under 0.3 of random's at n = 512.
TEST(Theory, DiscrepancyExponentsOnRandomUnitVectors) {
  std::mt19937 rng(3);
  std::normal_distribution<float> g(0, 1);
  const int N = 512, d = 4, dv = 4;
  MatrixF K(N, d), V(N, dv);
  for (int i = 0; i < N; ++i) {
    for (int c = 0; c < d; ++c) K(i, c) = g(rng);
    K.row(i) /= K.row(i).norm();
    for (int c = 0; c < dv; ++c) V(i, c) = g(rng);
    V.row(i) /= V.row(i).norm();
  }
  std::vector<std::vector<float>> qs;
  for (int q = 0; q < 8; ++q) {
    std::vector<float> v(d);
    for (float& x : v) x = g(rng);
    qs.push_back(v);
  }
  std::vector<int> sizes;
  for (int n = 4; n <= N; n *= 2) sizes.push_back(n);
  for (DiscSizes mode : {DiscSizes::Prefixes, DiscSizes::WholeBlocks}) {
    DiscRun run{DiscWalk{"unsaturated", BalanceParams{}}, 0, 0, {}};
    run.walk.params.gamma = 0.5;
    run.walk.params.temp = 1;
    long sat[2] = {0, 0}, walked[2] = {0, 0};
    measure_discrepancy(K, V, qs, sizes, mode, 40, 0, 0, 0, run, sat, walked);
    for (ScalingCurve& c : run.curves) finish_curve(c, 8);
    ASSERT_EQ(run.curves.size(), 8u);
    for (const char* inst : {"denominator", "numerator"})
      for (const char* meas : {"query", "kernel"}) {
        const ScalingCurve* rnd = run.find(inst, meas, "random");
        const ScalingCurve* walk = run.find(inst, meas, "walk");
        ASSERT_TRUE(rnd && walk);
        ASSERT_TRUE(rnd->fit.ok && walk->fit.ok);
        SCOPED_TRACE(std::string(inst) + " " + meas + " " + disc_sizes_name(mode));
        std::printf(
            "%-12s %-7s %-9s random %.3f [%.3f, %.3f]  walk %.3f [%.3f, %.3f]  ratio at n=%d "
            "%.3f\n",
            inst, meas, disc_sizes_name(mode), rnd->fit.slope, rnd->fit.ci_low, rnd->fit.ci_high,
            walk->fit.slope, walk->fit.ci_low, walk->fit.ci_high, N,
            walk->mean.back() / rnd->mean.back());
        if (mode == DiscSizes::WholeBlocks) {
          // Independent draws per size: the pooled interval is valid and covers 1/2.
          EXPECT_NEAR(rnd->fit.slope, 0.5, 0.06);
          EXPECT_LE(rnd->fit.ci_low, 0.5);
          EXPECT_GE(rnd->fit.ci_high, 0.5);
        } else {
          // Prefixes of one draw are correlated across n: a noisier estimate.
          EXPECT_NEAR(rnd->fit.slope, 0.5, 0.12);
        }
        EXPECT_LT(walk->fit.slope, 0.3);
        EXPECT_LT(walk->mean.back(), 0.3 * rnd->mean.back());
        for (size_t p = 0; p < walk->x.size(); ++p) {
          EXPECT_LE(walk->lo[p], walk->mean[p]);
          EXPECT_GE(walk->hi[p], walk->mean[p]);
          EXPECT_EQ(walk->samples[p].size(), 40u);
        }
      }
    EXPECT_GT(walked[0], 0);
    EXPECT_LT(double(sat[0]) / walked[0], 0.5);  // gamma 0.5 on unit vectors: mostly drawn
  }
}

// On a real head the normalised error under the operator norm is never below the Frobenius one
// (||V||_op <= ||V||_F), uniform's error falls with the budget, and every curve is fitted.
TEST(Theory, RunOnSampleCaptureGivesBothNormalisationsAndFits) {
  auto cap = CaptureFile::open(kvscope::testing::sample_capture_paths()[0]);
  TheorySpec spec;
  spec.layers = {1};
  spec.heads = {0};
  spec.disc_seeds = 3;
  spec.max_n = 128;
  spec.seeds = 3;
  spec.methods = {{"uniform", {}}, {"balancekv", {}}};
  int last_done = 0, last_total = 0;
  const TheoryResult r = run_theory(*cap, spec, [&](int done, int total) {
    last_done = done;
    last_total = total;
  });
  EXPECT_EQ(last_done, last_total);
  EXPECT_EQ(last_total, 2 + 2 * 5);
  ASSERT_EQ(r.discrepancy.size(), 2u);
  EXPECT_EQ(r.sizes.front(), 4);
  EXPECT_EQ(r.sizes.back(), 128);
  for (const DiscRun& d : r.discrepancy) {
    EXPECT_EQ(d.curves.size(), 8u);
    EXPECT_GE(d.saturation_numerator, 0);
    EXPECT_LE(d.saturation_numerator, 1);
  }
  // The default unsaturated set is less saturated than the authors' parameters.
  EXPECT_LT(r.discrepancy[1].saturation_numerator, r.discrepancy[0].saturation_numerator);
  ASSERT_EQ(r.errors.size(), 2u);
  for (const ErrorScaling& e : r.errors) {
    const ScalingCurve* fro = e.find("frobenius");
    const ScalingCurve* op = e.find("operator");
    ASSERT_TRUE(fro && op);
    for (size_t p = 0; p < fro->x.size(); ++p) EXPECT_GE(op->mean[p], fro->mean[p] * (1 - 1e-12));
    EXPECT_TRUE(e.find("relative")->fit.ok);
  }
  const ScalingCurve* u = r.errors[0].find("relative");
  EXPECT_GT(u->mean.back(), u->mean.front());  // smallest budget, largest error
  EXPECT_LT(u->fit.slope, 0);
  const nlohmann::json j = r.to_json();
  EXPECT_TRUE(j["error"]["methods"][0]["relative"].contains("alpha"));
  // Cancel stops the run.
  std::atomic<bool> cancel{true};
  EXPECT_THROW(run_theory(*cap, spec, {}, &cancel), Cancelled);
}

}  // namespace
