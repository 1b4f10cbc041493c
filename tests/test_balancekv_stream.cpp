// balancekv-stream: SoftmaxBalance (Algorithm 2), MergeAndReduce (Algorithm 3), the method's
// budgets, separate numerator / denominator sets, FAIL reporting, and finite error on a real
// capture.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <random>
#include <set>

#include "engine/core/error.h"
#include "engine/eval/protocol.h"
#include "engine/io/capture.h"
#include "engine/methods/balancekv/softmax_balance.h"
#include "engine/methods/method.h"
#include "tests/sample_captures.h"

using namespace kvscope;

namespace {

MatrixF gaussian(int rows, int cols, uint32_t seed, float scale = 1.f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.f, scale);
  MatrixF m(rows, cols);
  for (int i = 0; i < rows; ++i)
    for (int c = 0; c < cols; ++c) m(i, c) = g(rng);
  return m;
}

struct Head {
  MatrixF keys, values, query;
};

Head make_head(int n, int d, uint32_t seed) {
  Head h{gaussian(n, d, seed, 0.6f), gaussian(n, d, seed + 1), gaussian(n, d, seed + 2)};
  // Spread the value norms over several powers of two so there are several buckets.
  for (int i = 0; i < n; ++i) h.values.row(i) *= std::ldexp(1.0f, (i * 7) % 4 - 1);
  return h;
}

MethodInput input_for(const Head& h, double ratio, uint64_t seed) {
  MethodInput in;
  in.keys = &h.keys;
  in.values = &h.values;
  in.queries = {&h.query};
  in.n = static_cast<int>(h.keys.rows());
  in.sink = 16;
  in.eval = 64;
  in.mid_begin = 16;
  in.mid_end = in.n - 64;
  in.keep_ratio = ratio;
  in.budget = static_cast<int>(std::lround(ratio * (in.mid_end - in.mid_begin)));
  in.seed = seed;
  return in;
}

void expect_set(const std::vector<int>& idx, const std::vector<double>& w, const MethodInput& in) {
  ASSERT_EQ(idx.size(), w.size());
  EXPECT_LE(static_cast<int>(idx.size()), in.budget);
  std::set<int> seen;
  for (size_t k = 0; k < idx.size(); ++k) {
    EXPECT_GE(idx[k], in.mid_begin);
    EXPECT_LT(idx[k], in.mid_end);
    EXPECT_TRUE(seen.insert(idx[k]).second) << "duplicate " << idx[k];
    EXPECT_GT(w[k], 0);
    const double l = std::log2(w[k]);
    EXPECT_NEAR(l, std::round(l), 1e-12) << "level weights are powers of two";
  }
}

const Method& stream() {
  const Method* m = find_method("balancekv-stream");
  EXPECT_NE(m, nullptr);
  return *m;
}

}  // namespace

TEST(MergeAndReduce, BinaryCounterStructure) {
  // Keep the first half of every reduced set: 8 tokens, batch 2, 2 levels.
  MergeAndReduce mr(2, 2, [](const std::vector<int>& c, int, int) {
    return std::vector<int>(c.begin(), c.begin() + c.size() / 2);
  });
  for (int t = 0; t < 8; ++t) mr.push(t);
  ASSERT_EQ(mr.levels().size(), 3u);
  EXPECT_TRUE(mr.levels()[0].empty());
  EXPECT_TRUE(mr.levels()[1].empty());
  EXPECT_EQ(mr.levels()[2], (std::vector<int>{0, 4}));
  // Two more tokens land in C^1 after one reduction; one more stays in C^0.
  for (int t = 8; t < 11; ++t) mr.push(t);
  EXPECT_EQ(mr.levels()[0], (std::vector<int>{10}));
  EXPECT_EQ(mr.levels()[1], (std::vector<int>{8}));
}

TEST(MergeAndReduce, BoundMatchesFloorHalvingRuns) {
  for (int n : {1, 7, 64, 100, 433})
    for (int t : {2, 3, 8, 16})
      for (int T = 0; T <= 5; ++T) {
        MergeAndReduce mr(t, T, [](const std::vector<int>& c, int, int) {
          return std::vector<int>(c.begin(), c.begin() + c.size() / 2);
        });
        for (int i = 0; i < n; ++i) mr.push(i);
        long long total = 0;
        for (const auto& l : mr.levels()) {
          total += static_cast<long long>(l.size());
        }
        for (int l = 0; l < T; ++l) EXPECT_LE(mr.levels()[l].size(), static_cast<size_t>(t));
        EXPECT_EQ(total, merge_and_reduce_bound(n, t, T)) << n << " " << t << " " << T;
      }
}

TEST(SoftmaxBalance, KeepsTheSmallerClassAndReportsFail) {
  const MatrixF keys = gaussian(64, 8, 3, 0.5f);
  const MatrixF values = gaussian(64, 4, 4);
  std::vector<int> tokens(64);
  for (int i = 0; i < 64; ++i) tokens[i] = i;
  SoftmaxBalanceConfig cfg;
  cfg.c = softmax_balance_c(64, 0.01);
  double r_key = 0, r_value = 0;
  for (int i = 0; i < 64; ++i) {
    r_key = std::max(r_key, static_cast<double>(keys.row(i).norm()));
    r_value = std::max(r_value, static_cast<double>(values.row(i).norm()));
  }
  cfg.radius = softmax_balance_radius(r_key, r_value, 8);
  cfg.seed = 5;
  cfg.trace_query.assign(8, 0.1f);
  SoftmaxBalanceOutput o = softmax_balance(keys, &values, tokens, cfg, 0, 0);
  EXPECT_LE(o.kept.size(), 32u);
  EXPECT_EQ(o.fail_steps, 0) << "the theorem's c and R bound |y^T eta| on 64 items";
  ASSERT_TRUE(o.traced);
  EXPECT_EQ(o.trace.sigma.size(), 64u);
  int in_class = 0;
  for (int k : o.trace.kept) in_class += k;
  EXPECT_EQ(in_class, static_cast<int>(o.kept.size()));
  for (size_t j = 0; j < 64; ++j) {
    // p_j = 1/2 - y^T eta / (2 c R^2)
    EXPECT_NEAR(o.trace.p[j], 0.5 - o.trace.partial[j] / (2 * cfg.c * cfg.radius * cfg.radius),
                1e-12);
  }
  // A tiny normaliser makes |y^T eta| exceed c R^2: the FAIL case, counted and survived.
  cfg.c = 1e-3;
  SoftmaxBalanceOutput f = softmax_balance(keys, nullptr, tokens, cfg, 0, 0);
  EXPECT_GT(f.fail_steps, 0);
  EXPECT_LE(f.kept.size(), 32u);
}

TEST(BalanceKVStream, BudgetsSeparateSetsAndDeterminism) {
  const Head h = make_head(700, 16, 10);
  for (double ratio : {0.5, 0.25, 0.125, 0.0625, 0.3}) {
    const MethodInput in = input_for(h, ratio, 4);
    SCOPED_TRACE("ratio " + std::to_string(ratio));
    const Selection s = stream().select(in);
    EXPECT_TRUE(s.separate);
    expect_set(s.indices, s.weights, in);
    expect_set(s.den_indices, s.den_weights, in);
    // The budget search keeps a good part of the budget (the hard bound assumes every
    // reduction keeps half; the smaller sign class is usually smaller, and every numerator
    // bucket carries its own partly filled levels, so the numerator undershoots most).
    EXPECT_GE(static_cast<double>(s.den_indices.size()), 0.5 * in.budget) << s.note;
    EXPECT_GE(static_cast<double>(s.indices.size()), 0.35 * in.budget) << s.note;
    const Selection again = stream().select(in);
    EXPECT_EQ(s.indices, again.indices);
    EXPECT_EQ(s.den_indices, again.den_indices);
  }
  const Selection a = stream().select(input_for(h, 0.25, 1));
  const Selection b = stream().select(input_for(h, 0.25, 2));
  EXPECT_NE(a.den_indices, b.den_indices);
}

TEST(BalanceKVStream, FailIsReportedInNoteAndTrace) {
  const Head h = make_head(400, 8, 20);
  MethodInput in = input_for(h, 0.25, 3);
  in.params = {{"c_scale", 1e-6}};
  in.want_trace = true;
  const Selection s = stream().select(in);
  EXPECT_NE(s.note.find("FAIL"), std::string::npos) << s.note;
  ASSERT_TRUE(s.trace);
  EXPECT_NE(s.trace->note.find("FAIL"), std::string::npos);
  EXPECT_FALSE(s.trace->blocks.empty());
  for (const WalkBlockTrace& b : s.trace->blocks) {
    EXPECT_EQ(b.sigma.size(), b.tokens.size());
    EXPECT_EQ(b.path.size(), b.tokens.size());
  }
  in.params = {{"delta", 2.0}};
  EXPECT_THROW(stream().select(in), InputError);
}

TEST(BalanceKVStream, FiniteErrorOnRealCapture) {
  for (const std::string& path : ::kvscope::testing::sample_capture_paths()) {
    SCOPED_TRACE(path);
    ASSERT_TRUE(std::filesystem::exists(path)) << "sample capture not found: " << path;
    auto cap = CaptureFile::open(path);
    MethodSettings s;
    s.method = &stream();
    s.keep_ratio = 0.25;
    for (int L : {0, cap->info().num_layers - 1}) {
      auto layer = cap->layer(L);
      const HeadRun r = run_head(*layer, cap->info().num_layers, 0, s, 7);
      EXPECT_TRUE(std::isfinite(r.mean_relative));
      EXPECT_GT(r.mean_relative, 0);
      EXPECT_LT(r.mean_relative, 2.0);
      EXPECT_TRUE(r.selection.separate);
      EXPECT_LE(static_cast<int>(r.selection.indices.size()), r.window.budget);
      EXPECT_LE(static_cast<int>(r.selection.den_indices.size()), r.window.budget);
    }
  }
}
