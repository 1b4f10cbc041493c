// The practical balancekv method: selection invariants, determinism, top-up, the needle variant,
// traces, the layer-level entry point, bad input, the issue-11 switches, and what holds on the
// real stories260K captures (every variant below uniform's error; KVScope's earlier variant below
// its gamma = 0 ablation; the authors' exact walk not everywhere: see the last test).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <random>
#include <set>

#include "engine/core/error.h"
#include "engine/eval/protocol.h"
#include "engine/io/capture.h"
#include "engine/methods/balancekv/balance_walk.h"
#include "engine/methods/method.h"
#include "engine/ops/backend.h"
#include "tests/sample_captures.h"

using namespace kvscope;

namespace {

// Keys with a common offset plus spread (as real keys have), values Gaussian.
struct SynthHead {
  MatrixF keys, values, query;
};

SynthHead synth_head(int n, int d, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.f, 1.f);
  SynthHead h{MatrixF(n, d), MatrixF(n, d), MatrixF(n, d)};
  std::vector<float> offset(d);
  for (float& o : offset) o = 1.5f * g(rng);
  for (int i = 0; i < n; ++i)
    for (int c = 0; c < d; ++c) {
      h.keys(i, c) = offset[c] + g(rng);
      h.values(i, c) = g(rng);
      h.query(i, c) = g(rng);
    }
  return h;
}

MethodInput input_for(const SynthHead& h, double ratio, uint64_t seed, int sink = 16,
                      int eval = 64) {
  MethodInput in;
  in.keys = &h.keys;
  in.values = &h.values;
  in.queries = {&h.query};
  in.n = static_cast<int>(h.keys.rows());
  in.sink = sink;
  in.eval = eval;
  in.mid_begin = sink;
  in.mid_end = in.n - eval;
  in.keep_ratio = ratio;
  in.budget = static_cast<int>(std::lround(ratio * (in.mid_end - in.mid_begin)));
  in.seed = seed;
  in.layer = 1;
  in.kv_head = 2;
  return in;
}

bool power_of_two(double ratio) {
  const double r = std::log2(1.0 / ratio);
  return std::abs(r - std::round(r)) < 1e-9;
}

// Budget: the authors' floor halving keeps at most m (exactly floor(n_mid / 2^T) for ratio 2^-T);
// other ratios are topped up to exactly m.
void expect_valid(const Selection& s, const MethodInput& in) {
  const int n_mid = in.mid_end - in.mid_begin;
  if (power_of_two(in.keep_ratio) && in.budget > 0 && in.budget < n_mid &&
      in.params.count("protect_anticorrelated") == 0) {
    ASSERT_LE(static_cast<int>(s.indices.size()), in.budget);
    int floor_kept = n_mid;
    while (floor_kept > in.budget) floor_kept /= 2;
    ASSERT_EQ(static_cast<int>(s.indices.size()), floor_kept);
  } else if (power_of_two(in.keep_ratio) && in.budget > 0 && in.budget < n_mid) {
    ASSERT_LE(static_cast<int>(s.indices.size()), in.budget);
  } else {
    ASSERT_EQ(static_cast<int>(s.indices.size()), in.budget);
  }
  ASSERT_EQ(s.indices.size(), s.weights.size());
  std::set<int> seen;
  for (size_t k = 0; k < s.indices.size(); ++k) {
    EXPECT_GE(s.indices[k], in.mid_begin);
    EXPECT_LT(s.indices[k], in.mid_end);
    EXPECT_TRUE(seen.insert(s.indices[k]).second) << "duplicate " << s.indices[k];
    EXPECT_GT(s.weights[k], 0);
    EXPECT_TRUE(std::isfinite(s.weights[k]));
  }
  EXPECT_FALSE(s.separate);
}

const Method& balancekv() {
  const Method* m = find_method("balancekv");
  EXPECT_NE(m, nullptr);
  return *m;
}

}  // namespace

TEST(BalanceKV, BudgetIndicesAndWeightsAcrossRatiosAndParams) {
  const SynthHead h = synth_head(700, 16, 1);
  const std::vector<ParamValues> variants = {
      {}, {{"gamma", 0}}, {{"block", 64}}, {{"protect_anticorrelated", 1}}, {{"temp", 0.5}}};
  for (double ratio : {0.5, 0.25, 0.125, 0.0625, 0.3, 0.9, 0.01}) {
    for (const ParamValues& pv : variants) {
      MethodInput in = input_for(h, ratio, 3);
      in.params = pv;
      SCOPED_TRACE("ratio " + std::to_string(ratio));
      expect_valid(balancekv().select(in), in);
    }
  }
}

TEST(BalanceKV, EdgeBudgets) {
  const SynthHead h = synth_head(200, 8, 2);
  MethodInput in = input_for(h, 0.5, 1);
  in.budget = 0;
  Selection none = balancekv().select(in);
  EXPECT_TRUE(none.indices.empty());
  in.budget = in.mid_end - in.mid_begin;
  Selection all = balancekv().select(in);
  EXPECT_EQ(static_cast<int>(all.indices.size()), in.budget);
  for (double w : all.weights) EXPECT_EQ(w, 1.0);
  in.budget = 1;
  expect_valid(balancekv().select(in), in);
}

TEST(BalanceKV, DeterministicPerSeed) {
  const SynthHead h = synth_head(600, 16, 3);
  const Selection a = balancekv().select(input_for(h, 0.25, 5));
  const Selection b = balancekv().select(input_for(h, 0.25, 5));
  const Selection c = balancekv().select(input_for(h, 0.25, 6));
  EXPECT_EQ(a.indices, b.indices);
  EXPECT_EQ(a.weights, b.weights);
  EXPECT_NE(a.indices, c.indices);
}

TEST(BalanceKV, WeightsArePowersOfTwoForPowerOfTwoRatios) {
  const SynthHead h = synth_head(600, 16, 4);
  const Selection s = balancekv().select(input_for(h, 0.125, 2));
  for (double w : s.weights) {
    const double l = std::log2(w);
    EXPECT_NEAR(l, std::round(l), 1e-12);
    EXPECT_GE(w, 1.0);
    EXPECT_LE(w, 8.0);
  }
  EXPECT_EQ(s.note.find("topped up"), std::string::npos);
}

TEST(BalanceKV, NonPowerOfTwoRatioIsToppedUpAndSaysSo) {
  const SynthHead h = synth_head(600, 16, 5);
  MethodInput in = input_for(h, 0.3, 2);
  const Selection s = balancekv().select(in);
  expect_valid(s, in);
  EXPECT_NE(s.note.find("topped up"), std::string::npos) << s.note;
}

TEST(BalanceKV, NeedleVariantProtectsAntiCorrelatedKeys) {
  SynthHead h = synth_head(700, 16, 6);
  // Plant one key pointing against the common offset at token 300.
  const Eigen::RowVectorXf mean = h.keys.colwise().mean();
  h.keys.row(300) = -2.0f * mean;
  MethodInput in = input_for(h, 0.25, 9);
  in.params = {{"protect_anticorrelated", 1}};
  const Selection s = balancekv().select(in);
  expect_valid(s, in);
  for (int t = 300 - kProtectDilation; t <= 300 + kProtectDilation; ++t) {
    auto it = std::find(s.indices.begin(), s.indices.end(), t);
    ASSERT_NE(it, s.indices.end()) << "token " << t << " should be protected";
    EXPECT_EQ(s.weights[it - s.indices.begin()], 1.0);
  }
  EXPECT_NE(s.note.find("protected"), std::string::npos) << s.note;
}

TEST(BalanceKV, TraceShapes) {
  const SynthHead h = synth_head(600, 16, 7);
  MethodInput in = input_for(h, 0.25, 4);
  in.want_trace = true;
  const Selection s = balancekv().select(in);
  ASSERT_TRUE(s.trace);
  const WalkTrace& t = *s.trace;
  EXPECT_EQ(t.rounds, 2);
  EXPECT_EQ(t.trace_query, in.n - 1);
  const int n_mid = in.mid_end - in.mid_begin;  // 520: 5 blocks, then 260: 3 blocks
  ASSERT_EQ(t.blocks.size(), 8u);
  int walked[2] = {0, 0}, kept[2] = {0, 0};
  for (const WalkBlockTrace& b : t.blocks) {
    const size_t len = b.tokens.size();
    ASSERT_GT(len, 0u);
    EXPECT_LE(len, 128u);
    for (size_t sz : {b.p.size(), b.sigma.size(), b.partial.size(), b.disc_query.size(),
                      b.disc_kernel.size(), b.random_disc_query.size(), b.random_disc_kernel.size(),
                      b.path.size(), b.random_path.size(), b.kept.size()})
      EXPECT_EQ(sz, len);
    EXPECT_EQ(b.sigma[0], 1);
    for (size_t i = 0; i < len; ++i) {
      EXPECT_NEAR(b.p[i], 0.5 - 4.0 * b.partial[i], 1e-4 * (1 + std::abs(b.p[i])));
      EXPECT_GE(b.disc_kernel[i], 0);
    }
    walked[b.round] += static_cast<int>(len);
    for (int k : b.kept) kept[b.round] += k != 0;
  }
  EXPECT_EQ(walked[0], n_mid);
  EXPECT_EQ(kept[0], n_mid / 2);
  EXPECT_EQ(walked[1], n_mid / 2);
  EXPECT_EQ(kept[1], in.budget);
}

// Views ask Method::produces_trace(), not names: the methods that say so record a walk
// when asked, the others that run on a bare head record none, and the two walk methods say so.
TEST(BalanceKV, ProducesTraceIsWhatTheMethodsDo) {
  const SynthHead h = synth_head(600, 16, 7);
  MethodInput in = input_for(h, 0.25, 4);
  in.want_trace = true;
  int tracing = 0;
  for (const Method* m : all_methods()) {
    if (m->needs_layer() || m->needs_rope()) continue;
    Selection s;
    try {
      s = m->select(in);
    } catch (const InputError&) {
      EXPECT_FALSE(m->produces_trace()) << m->name();
      continue;
    }
    EXPECT_EQ(static_cast<bool>(s.trace), m->produces_trace()) << m->name();
    tracing += m->produces_trace() ? 1 : 0;
  }
  EXPECT_TRUE(find_method("balancekv")->produces_trace());
  EXPECT_TRUE(find_method("balancekv-stream")->produces_trace());
  EXPECT_EQ(tracing, 2);
}

TEST(BalanceKV, BadInputNamesTheProblem) {
  const SynthHead h = synth_head(200, 8, 8);
  MethodInput in = input_for(h, 0.5, 1);
  in.params = {{"block", 1}};
  EXPECT_THROW(balancekv().select(in), InputError);
  in.params = {{"gamma", -1}};
  EXPECT_THROW(balancekv().select(in), InputError);
  in.params = {{"gama", 4}};
  try {
    balancekv().select(in);
    ADD_FAILURE() << "unknown parameter accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("gama"), std::string::npos);
  }
  in.params = {};
  in.budget = in.mid_end - in.mid_begin + 1;
  EXPECT_THROW(balancekv().select(in), InputError);
  in.budget = 10;
  in.want_trace = true;
  in.trace_query = in.n;
  EXPECT_THROW(balancekv().select(in), InputError);
}

TEST(BalanceKV, LayerEntryPointEqualsPerHeadMethod) {
  LayerData layer;
  layer.layer = 3;
  const int kv_heads = 3, group = 2, n = 500, d = 16;
  for (int h = 0; h < kv_heads; ++h) {
    SynthHead s = synth_head(n, d, 40 + h);
    layer.keys.push_back(s.keys);
    layer.values.push_back(s.values);
  }
  for (int q = 0; q < kv_heads * group; ++q)
    layer.queries.push_back(synth_head(n, d, 90 + q).query);
  layer.refused.assign(kv_heads, "");
  EvalWindow w;
  w.n = n;
  w.sink = 15;
  w.eval = 62;
  w.mid_begin = 15;
  w.mid_end = n - 62;
  w.n_mid = w.mid_end - w.mid_begin;
  w.keep_ratio = 0.25;
  w.budget = static_cast<int>(std::lround(0.25 * w.n_mid));
  const ParamValues params{{"gamma", 3.5}};
  const std::vector<Selection> all =
      balancekv_layer(layer, 5, w, 77, params, cpu_backend(), true, 400);
  ASSERT_EQ(static_cast<int>(all.size()), kv_heads);
  for (int h = 0; h < kv_heads; ++h) {
    MethodInput in;
    in.keys = &layer.keys[h];
    in.values = &layer.values[h];
    in.queries = layer.group_queries(h);
    in.n = n;
    in.sink = w.sink;
    in.eval = w.eval;
    in.mid_begin = w.mid_begin;
    in.mid_end = w.mid_end;
    in.budget = w.budget;
    in.keep_ratio = w.keep_ratio;
    in.layer = 3;
    in.num_layers = 5;
    in.kv_head = h;
    in.seed = 77;
    in.params = params;
    in.want_trace = true;
    in.trace_query = 400;
    const Selection one = balancekv().select(in);
    EXPECT_EQ(one.indices, all[h].indices) << "head " << h;
    EXPECT_EQ(one.weights, all[h].weights) << "head " << h;
    ASSERT_TRUE(one.trace && all[h].trace);
    ASSERT_EQ(one.trace->blocks.size(), all[h].trace->blocks.size());
    EXPECT_EQ(one.trace->blocks[0].sigma, all[h].trace->blocks[0].sigma);
    EXPECT_EQ(one.trace->blocks[0].disc_query, all[h].trace->blocks[0].disc_query);
  }
  layer.refused[1] = "NaN in layers.3.key head 1";
  const std::vector<Selection> with_refused =
      balancekv_layer(layer, 5, w, 77, params, cpu_backend());
  EXPECT_TRUE(with_refused[1].indices.empty());
  EXPECT_NE(with_refused[1].note.find("refused"), std::string::npos);
  EXPECT_EQ(with_refused[0].indices, all[0].indices);
}

// Kept count: the authors' floor halving (202 / 101 / 50 of a 405-token middle) by default, the
// budget m (203 / 101 / 51) with kept = budget; the note and the trace say kept vs budget.
TEST(BalanceKV, KeptCountFollowsTheSwitch) {
  const SynthHead h = synth_head(405 + 15 + 60, 8, 11);
  for (double ratio : {0.5, 0.25, 0.125}) {
    MethodInput in = input_for(h, ratio, 1, 15, 60);
    in.want_trace = true;
    const Selection a = balancekv().select(in);
    const int floor_kept = 405 >> static_cast<int>(std::lround(std::log2(1 / ratio)));
    EXPECT_EQ(static_cast<int>(a.indices.size()), floor_kept);
    EXPECT_NE(a.note.find("kept " + std::to_string(floor_kept) + " of budget " +
                          std::to_string(in.budget)),
              std::string::npos)
        << a.note;
    ASSERT_TRUE(a.trace);
    EXPECT_EQ(a.trace->kept, floor_kept);
    EXPECT_EQ(a.trace->budget, in.budget);
    EXPECT_GE(a.saturation, 0.0);
    EXPECT_EQ(a.saturation, a.trace->saturation);
    in.params = {{"kept", 1}};
    EXPECT_EQ(static_cast<int>(balancekv().select(in).indices.size()), in.budget);
  }
}

// Each switch changes the selection on its own (so the Error view and sweep can show what each
// detail is worth), and the preset equals setting all four.
TEST(BalanceKV, SwitchesAreIndependentAndThePresetSetsAllFour) {
  auto cap = CaptureFile::open(std::string(KVSCOPE_SOURCE_DIR) +
                               "/sample_data/stories260K_lily.safetensors");
  auto layer = cap->layer(2);
  const EvalWindow w = EvalWindow::make(cap->info().num_tokens, 0.5);  // floor 202 of m = 203
  auto select = [&](int head, const ParamValues& p) {
    return balancekv().select(make_method_input(*layer, cap->info().num_layers, head, w, p, 3));
  };
  for (const char* sw : {"halving", "centring", "precision", "kept"}) {
    int differ = 0;
    for (int head = 0; head < cap->info().kv_heads; ++head) {
      const Selection a = select(head, {}), b = select(head, {{sw, 1}});
      differ += a.indices != b.indices || a.weights != b.weights;
    }
    // precision changes a selection only where float32 overflows or rounds across a draw.
    if (std::string(sw) != "precision") {
      EXPECT_GT(differ, 0) << sw;
    }
  }
  for (int head = 0; head < cap->info().kv_heads; ++head) {
    const Selection v1 = select(head, {{"preset", 1}});
    const Selection all4 =
        select(head, {{"halving", 1}, {"centring", 1}, {"precision", 1}, {"kept", 1}});
    EXPECT_EQ(v1.indices, all4.indices);
    EXPECT_EQ(v1.weights, all4.weights);
    // The preset overrides the switches.
    EXPECT_EQ(select(head, {{"preset", 1}, {"halving", 0}}).indices, v1.indices);
  }
  const SynthHead h = synth_head(300, 8, 12);
  MethodInput in = input_for(h, 0.5, 3);
  in.params = {{"precision", 2}};
  EXPECT_THROW(balancekv().select(in), InputError);
}

// The real stories260K captures, all layers and kv heads, 10 seeds. What holds (measured; the
// figures are printed and in README.md / docs/balancekv.md): every walk variant beats uniform at
// every ratio; KVScope's earlier variant (preset kvscope-v1) beats its own gamma = 0 ablation at
// every ratio; the authors' exact walk does NOT beat gamma = 0 everywhere (at ratio 1/2 gamma = 0
// is better on lily, as on three of the four stories260K captures the issue-11 report measured),
// so that claim is no longer made for the default.
TEST(BalanceKV, WalkVariantsAgainstUniformAndGammaZeroOnRealCaptures) {
  const Method* uniform = find_method("uniform");
  ASSERT_NE(uniform, nullptr);
  int captures = 0;
  for (const std::string& file : kvscope::testing::sample_capture_names()) {
    const char* name = file.c_str();
    const std::string path = std::string(KVSCOPE_SOURCE_DIR) + "/sample_data/" + file;
    ASSERT_TRUE(std::filesystem::exists(path)) << path;
    ++captures;
    // The gamma = 0 comparisons below were measured on stories260K (head dim 8); on kjv3M
    // (head dim 64) only the comparison with uniform is asserted, the rest is printed.
    const bool stories = file.find("stories260K") != std::string::npos;
    auto cap = CaptureFile::open(path);
    const int layers = cap->info().num_layers, heads = cap->info().kv_heads;
    for (double ratio : {0.5, 0.25, 0.125}) {
      // authors, authors gamma 0, kvscope-v1, kvscope-v1 gamma 0, uniform
      const std::vector<ParamValues> variants = {
          {}, {{"gamma", 0}}, {{"preset", 1}}, {{"preset", 1}, {"gamma", 0}}};
      std::vector<double> err(variants.size() + 1, 0.0);
      for (int L = 0; L < layers; ++L) {
        auto layer = cap->layer(L);
        for (int h = 0; h < heads; ++h)
          for (uint64_t seed = 0; seed < 10; ++seed) {
            MethodSettings s;
            s.keep_ratio = ratio;
            s.method = &balancekv();
            for (size_t v = 0; v < variants.size(); ++v) {
              s.params = variants[v];
              err[v] += run_head(*layer, layers, h, s, seed).mean_relative;
            }
            s.params = {};
            s.method = uniform;
            err.back() += run_head(*layer, layers, h, s, seed).mean_relative;
          }
      }
      for (double& e : err) e /= 10.0 * layers * heads;
      std::printf(
          "%s ratio %.3f: authors %.4f  authors gamma=0 %.4f  kvscope-v1 %.4f  kvscope-v1 "
          "gamma=0 %.4f  uniform %.4f\n",
          name, ratio, err[0], err[1], err[2], err[3], err[4]);
      for (size_t v = 0; v < variants.size(); ++v)
        EXPECT_LT(err[v], err.back()) << name << " ratio " << ratio << " variant " << v;
      if (!stories) continue;
      EXPECT_LT(err[2], err[3]) << name << " ratio " << ratio;
      // The authors' walk against its gamma = 0 ablation: better at 1/4 and 1/8 on both
      // captures, but at 1/2 worse on lily (0.100 vs 0.095) and better on dragon.
      const bool lily = std::string(name).find("lily") != std::string::npos;
      if (ratio == 0.5 && lily)
        EXPECT_GT(err[0], err[1]) << name << ": authors' walk vs gamma 0 at 1/2";
      else
        EXPECT_LT(err[0], err[1]) << name << ": authors' walk vs gamma 0 at " << ratio;
    }
  }
  EXPECT_EQ(captures, 3);
}
