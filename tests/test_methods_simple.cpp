// The simple methods (exact, uniform, streaming): their defining behaviour (docs/methods.md, 7).
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>

#include "engine/eval/protocol.h"
#include "engine/methods/method.h"
#include "tests/memory_capture.h"

namespace kvscope {
namespace {

LayerData random_layer(int n, int d, int kv_heads, int q_heads, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist;
  auto rnd = [&](int r, int c) { return ::kvscope::testing::normal_matrix(rng, dist, r, c); };
  LayerData L;
  for (int h = 0; h < kv_heads; ++h) {
    L.keys.push_back(rnd(n, d));
    L.values.push_back(rnd(n, d));
  }
  for (int h = 0; h < q_heads; ++h) L.queries.push_back(rnd(n, d));
  L.refused.assign(kv_heads, "");
  return L;
}

Selection select(const char* method, const LayerData& L, double ratio, uint64_t seed, int kv = 0) {
  const Method* m = find_method(method);
  EXPECT_NE(m, nullptr);
  MethodSettings s;
  s.method = m;
  s.keep_ratio = ratio;
  const EvalWindow w = EvalWindow::make(static_cast<int>(L.keys[0].rows()), ratio);
  return m->select(make_method_input(L, 1, kv, w, s, seed));
}

void expect_valid(const Selection& sel, const EvalWindow& w, bool within_budget) {
  EXPECT_FALSE(sel.separate);
  ASSERT_EQ(sel.indices.size(), sel.weights.size());
  if (within_budget) {
    EXPECT_EQ(static_cast<int>(sel.indices.size()), w.budget);
  }
  std::set<int> unique(sel.indices.begin(), sel.indices.end());
  EXPECT_EQ(unique.size(), sel.indices.size()) << "indices not unique";
  for (size_t t = 0; t < sel.indices.size(); ++t) {
    EXPECT_GE(sel.indices[t], w.mid_begin);
    EXPECT_LT(sel.indices[t], w.mid_end);
    EXPECT_GT(sel.weights[t], 0.0);
  }
}

TEST(SimpleMethods, AreRegisteredAndSelfDescribed) {
  for (const char* name : {"exact", "uniform", "streaming"}) {
    const Method* m = find_method(name);
    ASSERT_NE(m, nullptr) << name;
    EXPECT_EQ(m->name(), name);
    EXPECT_FALSE(m->summary().empty());
    EXPECT_TRUE(m->params().empty()) << name << " has no tunable parameters";
    EXPECT_FALSE(m->needs_queries());
  }
}

TEST(SimpleMethods, BudgetUniqueInRangePositive) {
  const LayerData L = random_layer(512, 8, 2, 4, 1);
  for (double ratio : {0.5, 0.25, 0.125, 0.0625, 0.3}) {
    const EvalWindow w = EvalWindow::make(512, ratio);
    for (const char* name : {"uniform", "streaming"}) {
      SCOPED_TRACE(std::string(name) + " ratio " + std::to_string(ratio));
      expect_valid(select(name, L, ratio, 3), w, true);
    }
    const Selection ex = select("exact", L, ratio, 3);
    expect_valid(ex, w, false);
    EXPECT_EQ(static_cast<int>(ex.indices.size()), w.n_mid);
  }
}

TEST(SimpleMethods, ExactGivesZeroError) {
  const LayerData L = random_layer(256, 8, 2, 4, 2);
  MethodSettings s;
  s.method = find_method("exact");
  s.keep_ratio = 0.125;
  for (int kv = 0; kv < 2; ++kv) {
    const HeadRun run = run_head(L, 1, kv, s, 0);
    EXPECT_NEAR(run.mean_relative, 0.0, 1e-13);
    EXPECT_NEAR(run.mean_normalized, 0.0, 1e-13);
    EXPECT_NEAR(run.mean_mass, 1.0, 1e-12);
    EXPECT_EQ(run.per_query_head.size(), 2u);  // the GQA group of kv head `kv`
  }
}

TEST(SimpleMethods, UniformWeightIsMiddleOverBudget) {
  const LayerData L = random_layer(512, 8, 1, 1, 3);
  const EvalWindow w = EvalWindow::make(512, 0.25);
  const Selection sel = select("uniform", L, 0.25, 7);
  for (double x : sel.weights) EXPECT_DOUBLE_EQ(x, static_cast<double>(w.n_mid) / w.budget);
}

TEST(SimpleMethods, UniformIsDeterministicPerSeedAndVariesAcrossSeeds) {
  const LayerData L = random_layer(512, 8, 2, 2, 4);
  const Selection a = select("uniform", L, 0.25, 11), b = select("uniform", L, 0.25, 11);
  EXPECT_EQ(a.indices, b.indices);
  EXPECT_EQ(a.weights, b.weights);
  EXPECT_NE(a.indices, select("uniform", L, 0.25, 12).indices);
  // Different heads draw different samples for the same seed.
  EXPECT_NE(a.indices, select("uniform", L, 0.25, 11, 1).indices);
}

TEST(SimpleMethods, UniformIncludesEveryTokenEquallyOften) {
  // Without replacement and uniform: each middle token is kept with probability m / n_mid.
  // 400 seeds, n_mid = 108, m = 27: per-token count ~ Binomial(400, 1/4), sd ~ 8.7; a 5-sd band
  // fails by chance with probability ~1e-4 over all tokens, for a fixed seed set: never.
  const LayerData L = random_layer(128, 4, 1, 1, 5);
  const EvalWindow w = EvalWindow::make(128, 0.25);
  std::vector<int> count(w.n_mid, 0);
  const int seeds = 400;
  for (int s = 0; s < seeds; ++s)
    for (int i : select("uniform", L, 0.25, s).indices) ++count[i - w.mid_begin];
  const double p = static_cast<double>(w.budget) / w.n_mid;
  const double expected = seeds * p, sd = std::sqrt(seeds * p * (1 - p));
  for (int c : count) EXPECT_NEAR(c, expected, 5 * sd);
  // Early and late halves of the middle are equally represented (no positional bias).
  long early = 0, late = 0;
  for (int i = 0; i < w.n_mid; ++i) (i < w.n_mid / 2 ? early : late) += count[i];
  EXPECT_NEAR(static_cast<double>(early) / (early + late), 0.5, 0.02);
}

TEST(SimpleMethods, StreamingKeepsTheMostRecentMiddleTokens) {
  const LayerData L = random_layer(512, 8, 1, 1, 6);
  const EvalWindow w = EvalWindow::make(512, 0.125);
  const Selection sel = select("streaming", L, 0.125, 0);
  std::vector<int> expect;
  for (int i = w.mid_end - w.budget; i < w.mid_end; ++i) expect.push_back(i);
  std::vector<int> got = sel.indices;
  std::sort(got.begin(), got.end());
  EXPECT_EQ(got, expect);
  for (double x : sel.weights) EXPECT_EQ(x, 1.0);
  EXPECT_EQ(select("streaming", L, 0.125, 99).indices, sel.indices);  // no randomness
}

TEST(SimpleMethods, ErrorFallsAsTheBudgetGrows) {
  // More kept tokens, less error: the sanity check of the whole chain on random data (averaged
  // over 8 seeds for uniform so the comparison is not at the mercy of one draw).
  const LayerData L = random_layer(512, 8, 1, 2, 7);
  for (const char* name : {"uniform", "streaming"}) {
    MethodSettings s;
    s.method = find_method(name);
    double prev = 1e9;
    for (double ratio : {0.0625, 0.25, 0.75}) {
      s.keep_ratio = ratio;
      double err = 0;
      for (int seed = 0; seed < 8; ++seed) err += run_head(L, 1, 0, s, seed).mean_relative / 8;
      EXPECT_LT(err, prev) << name << " ratio " << ratio;
      prev = err;
    }
  }
}

TEST(SimpleMethods, EmptyMiddleGivesEmptySelection) {
  // s + E = n: nothing to compress.
  const LayerData L = random_layer(64, 4, 1, 1, 8);
  MethodSettings s;
  s.keep_ratio = 0.5;
  s.sink = 32;
  s.eval = 32;
  for (const char* name : {"exact", "uniform", "streaming"}) {
    s.method = find_method(name);
    const HeadRun run = run_head(L, 1, 0, s, 0);
    EXPECT_TRUE(run.selection.indices.empty()) << name;
    EXPECT_NEAR(run.mean_relative, 0.0, 1e-13) << name;  // everything before j is kept
  }
}

}  // namespace
}  // namespace kvscope
