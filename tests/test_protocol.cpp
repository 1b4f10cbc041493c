// The evaluation protocol (docs/evaluation.md): window, run_eval over seeds/threads/shards, refused
// heads and methods, failures, cancellation, JSON and merge.
#include <gtest/gtest.h>

#include <atomic>
#include <limits>
#include <memory>
#include <random>
#include <stdexcept>

#include "engine/core/error.h"
#include "engine/eval/protocol.h"
#include "tests/memory_capture.h"
#include "tests/sample_captures.h"

namespace kvscope {
namespace {

using ::kvscope::testing::MemoryCapture;

MemoryCapture make_capture(int n, int layers, int kv_heads, int q_heads, bool queries,
                           uint32_t seed = 1) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist;
  auto rnd = [&](int r, int c) { return ::kvscope::testing::normal_matrix(rng, dist, r, c); };
  CaptureData data;
  data.info.path = "memory";
  data.info.model = "random";
  data.info.source = "test";
  data.info.synthetic = true;
  data.info.num_layers = layers;
  data.info.q_heads = q_heads;
  data.info.kv_heads = kv_heads;
  data.info.head_dim = 8;
  data.info.value_dim = 8;
  data.info.num_tokens = n;
  data.info.has_queries = queries;
  for (int l = 0; l < layers; ++l) {
    LayerData L;
    L.layer = l;
    for (int h = 0; h < kv_heads; ++h) {
      L.keys.push_back(rnd(n, 8));
      L.values.push_back(rnd(n, 8));
    }
    if (queries)
      for (int h = 0; h < q_heads; ++h) L.queries.push_back(rnd(n, 8));
    L.refused.assign(kv_heads, "");
    data.layers.push_back(std::move(L));
  }
  return MemoryCapture(std::move(data));
}

// Test doubles with the protocol's view of a method.
class Throwing final : public Method {
 public:
  std::string name() const override { return "throwing"; }
  std::string summary() const override { return "throws"; }
  Selection select(const MethodInput&) const override {
    throw std::runtime_error("deliberate failure");
  }
};
class NeedsQueries final : public Method {
 public:
  std::string name() const override { return "query-aware"; }
  std::string summary() const override { return "needs queries"; }
  bool needs_queries() const override { return true; }
  Selection select(const MethodInput&) const override { return {}; }
};
class OverBudget final : public Method {
 public:
  std::string name() const override { return "over-budget"; }
  std::string summary() const override { return "keeps too much"; }
  Selection select(const MethodInput& in) const override {
    Selection s;
    for (int i = in.mid_begin; i < in.mid_begin + in.budget + 1; ++i) {
      s.indices.push_back(i);
      s.weights.push_back(1);
    }
    return s;
  }
};

TEST(Window, ProtocolDefaults) {
  EvalWindow w = EvalWindow::make(512, 0.5);
  EXPECT_EQ(w.sink, 16);
  EXPECT_EQ(w.eval, 64);
  EXPECT_EQ(w.mid_begin, 16);
  EXPECT_EQ(w.mid_end, 448);
  EXPECT_EQ(w.n_mid, 432);
  EXPECT_EQ(w.budget, 216);
  EXPECT_TRUE(w.scaled_down());
  EXPECT_NE(w.describe().find("scaled down"), std::string::npos) << w.describe();
  EXPECT_NE(w.describe().find("s=16 E=64"), std::string::npos) << w.describe();

  w = EvalWindow::make(8192, 0.125);
  EXPECT_EQ(w.sink, 256);
  EXPECT_EQ(w.eval, 256);
  EXPECT_EQ(w.budget, static_cast<int>(std::llround(0.125 * (8192 - 512))));
  EXPECT_FALSE(w.scaled_down());
  EXPECT_EQ(w.describe().find("scaled down"), std::string::npos);
  EXPECT_EQ(EvalWindow::make(100000, 0.5).sink, 256);

  // m = round(ratio * n_mid): 0.3 * 432 = 129.6 -> 130.
  EXPECT_EQ(EvalWindow::make(512, 0.3).budget, 130);
}

TEST(Window, OverridesAndBadInput) {
  const EvalWindow w = EvalWindow::make(512, 0.5, 4, 32);
  EXPECT_EQ(w.sink, 4);
  EXPECT_EQ(w.eval, 32);
  EXPECT_NE(w.describe().find("s set by hand"), std::string::npos);
  EXPECT_EQ(EvalWindow::make(512, 0.5, 0).sink, 0);
  EXPECT_THROW(EvalWindow::make(512, 0.0), InputError);
  EXPECT_THROW(EvalWindow::make(512, 1.5), InputError);
  EXPECT_THROW(EvalWindow::make(512, 0.5, 300, 300), InputError);
  EXPECT_THROW(EvalWindow::make(512, 0.5, -1, 0), InputError);
  EXPECT_THROW(EvalWindow::make(5, 0.5), InputError);  // E = floor(5/8) = 0
  try {
    EvalWindow::make(512, -0.25);
    FAIL();
  } catch (const SettingError& e) {
    // The app shows the setting in words; the CLI prints the flag in its place.
    EXPECT_EQ(std::string(e.what()), "keep ratio: keep ratio -0.25 is not in (0, 1]");
    EXPECT_EQ(e.cli_message(), "--ratios: keep ratio -0.25 is not in (0, 1]");
  }
}

TEST(Window, MethodInputMatchesWindow) {
  MemoryCapture cap = make_capture(256, 1, 2, 4, true);
  const auto L = cap.layer(0);
  MethodSettings s;
  s.method = find_method("uniform");
  s.keep_ratio = 0.25;
  s.params = {{"x", 1.0}};
  const EvalWindow w = EvalWindow::make(256, 0.25);
  const MethodInput in = make_method_input(*L, 1, 1, w, s, 42);
  EXPECT_EQ(in.keys, &L->keys[1]);
  ASSERT_EQ(in.queries.size(), 2u);
  EXPECT_EQ(in.queries[0], &L->queries[2]);
  EXPECT_EQ(in.queries[1], &L->queries[3]);
  EXPECT_EQ(in.mid_begin, w.mid_begin);
  EXPECT_EQ(in.mid_end, w.mid_end);
  EXPECT_EQ(in.budget, w.budget);
  EXPECT_EQ(in.seed, 42u);
  EXPECT_EQ(in.params.at("x"), 1.0);
}

EvalSpec simple_spec(int seeds = 3) {
  EvalSpec spec;
  spec.methods = {find_method("exact"), find_method("uniform"), find_method("streaming")};
  spec.ratios = {0.5, 0.125};
  spec.seeds = seeds;
  return spec;
}

TEST(RunEval, ResultsSeedsAndSummary) {
  MemoryCapture cap = make_capture(256, 2, 2, 4, true);
  EvalSpec spec = simple_spec();
  spec.base_seed = 5;
  int calls = 0, last_total = 0;
  const EvalReport rep = run_eval(cap, spec, [&](int, int total) {
    ++calls;
    last_total = total;
  });
  ASSERT_EQ(rep.results.size(), 2u * 2u * 3u * 2u);
  EXPECT_EQ(calls, 24);
  EXPECT_EQ(last_total, 24);
  EXPECT_EQ(rep.window_example.sink, 8);
  EXPECT_EQ(rep.window_example.eval, 32);
  for (const HeadEval& he : rep.results) {
    ASSERT_EQ(he.per_seed.size(), 3u);
    EXPECT_EQ(he.per_query.size(), 32u);
    if (he.method == "exact") {
      EXPECT_NEAR(he.mean, 0.0, 1e-13);
    }
    if (he.method == "streaming") {
      EXPECT_EQ(he.std, 0.0);  // deterministic method
    }
  }
  // Seed r of the run is base_seed + r.
  const HeadEval& u = rep.results[2];  // layer 0, kv head 0, uniform, ratio 0.5
  ASSERT_EQ(u.method, "uniform");
  ASSERT_EQ(u.ratio, 0.5);
  MethodSettings s;
  s.method = find_method("uniform");
  s.keep_ratio = 0.5;
  EXPECT_EQ(u.per_seed[1], run_head(*cap.layer(0), 2, 0, s, 6).mean_relative);
  EXPECT_GT(u.std, 0.0);

  const std::vector<EvalSummary> sum = rep.summary();
  ASSERT_EQ(sum.size(), 6u);
  EXPECT_EQ(sum[2].method, "uniform");
  double mean = 0;
  for (const HeadEval& he : rep.results)
    if (he.method == "uniform" && he.ratio == 0.5) mean += he.mean / 4;
  EXPECT_NEAR(sum[2].mean, mean, 1e-15);
  EXPECT_EQ(sum[2].heads, 4);
  // Less budget, more error.
  EXPECT_GT(sum[3].mean, sum[2].mean);
}

TEST(RunEval, DeterministicRegardlessOfThreads) {
  MemoryCapture cap = make_capture(256, 2, 2, 2, true);
  EvalSpec spec = simple_spec();
  spec.threads = 1;
  const nlohmann::json one = run_eval(cap, spec).to_json();
  spec.threads = 3;
  const nlohmann::json three = run_eval(cap, spec).to_json();
  EXPECT_EQ(one["results"], three["results"]);
  EXPECT_EQ(one["summary"], three["summary"]);
}

// A sweep as one run (EvalSpec::points) gives, point by point, exactly the report of a run of
// that point alone: results, summaries and the spec (the point overlaid on the method's params).
TEST(RunEval, PointsAreTheRunsOfEachPointAlone) {
  MemoryCapture cap = make_capture(256, 2, 2, 4, true);
  EvalSpec spec = simple_spec();
  spec.methods = {find_method("balancekv")};
  spec.params = {{"balancekv", {{"temp", 0.5}}}};
  spec.points = {{{"gamma", 0.0}}, {{"gamma", 2.0}}, {{"gamma", 4.0}, {"temp", 1.0}}};
  int calls = 0;
  const EvalReport all = run_eval(cap, spec, [&](int, int) { ++calls; });
  EXPECT_EQ(calls, 3 * 2 * 2 * 2);  // points x layers x kv heads x ratios
  EXPECT_THROW(all.to_json(), std::logic_error);
  const std::vector<EvalReport> parts = all.split_points();
  ASSERT_EQ(parts.size(), 3u);
  const std::vector<ParamValues> alone = {{{"gamma", 0.0}, {"temp", 0.5}},
                                          {{"gamma", 2.0}, {"temp", 0.5}},
                                          {{"gamma", 4.0}, {"temp", 1.0}}};
  for (size_t pt = 0; pt < parts.size(); ++pt) {
    EvalSpec one = simple_spec();
    one.methods = {find_method("balancekv")};
    one.params = {{"balancekv", alone[pt]}};
    const nlohmann::json expected = run_eval(cap, one).to_json();
    const nlohmann::json got = parts[pt].to_json();
    EXPECT_EQ(got["results"], expected["results"]) << "point " << pt;
    EXPECT_EQ(got["summary"], expected["summary"]) << "point " << pt;
    EXPECT_EQ(got["spec"], expected["spec"]) << "point " << pt;
  }
  // The points differ (gamma 0 keeps a uniform half; 2 and 4 walk).
  EXPECT_NE(parts[0].to_json()["results"], parts[1].to_json()["results"]);

  EvalSpec two = spec;
  two.methods = {find_method("balancekv"), find_method("uniform")};
  try {
    run_eval(cap, two);
    ADD_FAILURE() << "two methods with points must be refused";
  } catch (const SettingError& e) {
    EXPECT_NE(std::string(e.what()).find("one method"), std::string::npos) << e.what();
  }
  EvalSpec bad = spec;
  bad.points.push_back({{"no_such_param", 1.0}});
  EXPECT_THROW(run_eval(cap, bad), InputError);
}

TEST(RunEval, ShardsMergeToTheUnshardedReport) {
  MemoryCapture cap = make_capture(192, 2, 2, 2, true);
  EvalSpec spec = simple_spec(2);
  const EvalReport full = run_eval(cap, spec);
  std::vector<EvalReport> parts;
  for (int i = 0; i < 3; ++i) {
    spec.shard_index = i;
    spec.shard_count = 3;
    parts.push_back(EvalReport::from_json(run_eval(cap, spec).to_json()));  // via JSON, as on disk
  }
  EXPECT_EQ(parts[0].results.size() + parts[1].results.size() + parts[2].results.size(),
            full.results.size());
  const EvalReport merged = merge_reports({parts[2], parts[0], parts[1]});
  EXPECT_EQ(merged.to_json()["results"], full.to_json()["results"]);
  EXPECT_EQ(merged.to_json()["summary"], full.to_json()["summary"]);
  EXPECT_EQ(merged.spec.shard_count, 1);

  EXPECT_THROW(merge_reports({parts[0], parts[1]}), InputError);            // missing shard
  EXPECT_THROW(merge_reports({parts[0], parts[0], parts[1]}), InputError);  // duplicate shard
  EvalReport other = parts[1];
  other.spec.seeds = 3;
  EXPECT_THROW(merge_reports({parts[0], other, parts[2]}), InputError);  // different spec
  EvalReport overlap = parts[1];
  overlap.results.push_back(parts[0].results[0]);
  EXPECT_THROW(merge_reports({parts[0], overlap, parts[2]}), InputError);  // item twice
  EvalReport incomplete = parts[1];
  incomplete.results.pop_back();
  EXPECT_THROW(merge_reports({parts[0], incomplete, parts[2]}), InputError);
}

TEST(RunEval, JsonRoundTrip) {
  MemoryCapture cap = make_capture(128, 1, 1, 2, true);
  EvalSpec spec = simple_spec(2);
  spec.layers = {0};
  const EvalReport rep = run_eval(cap, spec);
  const nlohmann::json j = rep.to_json();
  EXPECT_EQ(EvalReport::from_json(j).to_json(), j);
  EXPECT_EQ(j["window"]["s"], 4);
  EXPECT_EQ(j["window"]["E"], 16);
  ASSERT_TRUE(j["summary"].is_array());
  for (const char* key : {"method", "ratio", "mean", "std"})
    EXPECT_TRUE(j["summary"][0].contains(key)) << key;
  for (const char* key : {"method", "ratio", "layer", "kv_head", "mean", "std", "per_query"})
    EXPECT_TRUE(j["results"][0].contains(key)) << key;
  EXPECT_THROW(EvalReport::from_json(nlohmann::json{{"format", "other"}}), InputError);
  nlohmann::json bad = j;
  bad["spec"]["methods"] = {"no-such-method"};
  EXPECT_THROW(EvalReport::from_json(bad), InputError);
}

TEST(RunEval, RefusedHeadIsReportedNotCrashed) {
  CaptureData data;
  MemoryCapture base = make_capture(128, 1, 2, 2, true);
  data.info = base.info();
  LayerData L = *base.layer(0);
  L.refused[1] = "NaN in layers.0.key head 1";
  L.keys[1](5, 0) = std::numeric_limits<float>::quiet_NaN();
  data.layers.push_back(L);
  MemoryCapture cap(std::move(data));
  const EvalReport rep = run_eval(cap, simple_spec(1));
  int refused = 0;
  for (const HeadEval& he : rep.results) {
    if (he.kv_head == 1) {
      EXPECT_TRUE(he.refused);
      EXPECT_NE(he.note.find("NaN"), std::string::npos);
      ++refused;
    } else {
      EXPECT_FALSE(he.refused);
    }
  }
  EXPECT_EQ(refused, 6);
  for (const EvalSummary& s : rep.summary()) EXPECT_EQ(s.heads, 1);
}

TEST(RunEval, NoQueriesRefusesQueryAwareMethodsOnceAndUsesKeysAsProxy) {
  MemoryCapture cap = make_capture(128, 1, 2, 4, false);
  static NeedsQueries needs;
  EvalSpec spec = simple_spec(1);
  spec.methods.push_back(&needs);
  const EvalReport rep = run_eval(cap, spec);
  EXPECT_TRUE(rep.proxy_queries);
  int mentions = 0;
  for (const std::string& note : rep.notes)
    if (note.find("query-aware") != std::string::npos) ++mentions;
  EXPECT_EQ(mentions, 1);
  for (const HeadEval& he : rep.results) {
    EXPECT_EQ(he.refused, he.method == "query-aware");
    if (he.method == "uniform") {
      EXPECT_GT(he.mean, 0.0);
    }
  }
  // Direct run_head refuses too, with the method's name.
  MethodSettings s;
  s.method = &needs;
  try {
    run_head(*cap.layer(0), 1, 0, s, 0);
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("query-aware"), std::string::npos);
  }
}

// A capture without RoPE metadata lacks what expected-attention needs: its items are refused with
// method_unavailable's reason (the one the app greys it out with), once in the notes, not failed.
TEST(RunEval, MethodTheCaptureCannotRunIsRefusedWithTheReasonNotFailed) {
  MemoryCapture cap = make_capture(128, 1, 2, 4, true);
  ASSERT_FALSE(cap.info().rope.known());
  const Method* ea = find_method("expected-attention");
  ASSERT_NE(ea, nullptr);
  const std::string why = method_unavailable(*ea, cap.info());
  ASSERT_NE(why.find("RoPE"), std::string::npos) << why;
  EvalSpec spec = simple_spec(1);
  spec.methods.push_back(ea);
  const EvalReport rep = run_eval(cap, spec);
  EXPECT_TRUE(rep.failures().empty());
  int mentions = 0;
  for (const std::string& note : rep.notes)
    if (note.find("expected-attention needs RoPE") != std::string::npos) ++mentions;
  EXPECT_EQ(mentions, 1);
  for (const HeadEval& he : rep.results) {
    EXPECT_EQ(he.refused, he.method == "expected-attention") << he.method;
    EXPECT_EQ(he.error, "") << he.method;
    if (he.refused) {
      EXPECT_EQ(he.note, "expected-attention " + why);
    }
  }
}

TEST(RunEval, ThrowingMethodIsReportedAsError) {
  MemoryCapture cap = make_capture(128, 1, 2, 2, true);
  static Throwing throwing;
  static OverBudget over;
  EvalSpec spec;
  spec.methods = {&throwing, find_method("uniform"), &over};
  spec.ratios = {0.25};
  spec.seeds = 2;
  const EvalReport rep = run_eval(cap, spec);
  for (const HeadEval& he : rep.results) {
    if (he.method == "uniform") {
      EXPECT_TRUE(he.error.empty());
    } else {
      EXPECT_FALSE(he.error.empty()) << he.method;
    }
  }
  const std::vector<std::string> f = rep.failures();
  ASSERT_EQ(f.size(), 2u);
  EXPECT_NE(f[0].find("deliberate failure"), std::string::npos);
  EXPECT_NE(f[1].find("budget"), std::string::npos);
}

TEST(RunEval, CancelThrowsCancelled) {
  MemoryCapture cap = make_capture(256, 2, 2, 2, true);
  std::atomic<bool> cancel{false};
  EXPECT_THROW(run_eval(
                   cap, simple_spec(),
                   [&](int done, int) {
                     if (done >= 2) cancel = true;
                   },
                   &cancel),
               Cancelled);
}

TEST(RunEval, BadSpecNamesTheFlag) {
  MemoryCapture cap = make_capture(128, 2, 2, 2, true);
  auto expect_flag = [&](EvalSpec spec, const std::string& flag) {
    try {
      run_eval(cap, spec);
      FAIL() << flag;
    } catch (const SettingError& e) {
      // The engine names the setting in words; the flag is the CLI's (cli_message()).
      EXPECT_EQ(std::string(e.what()).find("--"), std::string::npos) << e.what();
      EXPECT_NE(e.cli_message().find(flag), std::string::npos) << e.cli_message();
    }
  };
  EvalSpec s = simple_spec(1);
  s.layers = {2};
  expect_flag(s, "--layers");
  s = simple_spec(1);
  s.heads = {0, 0};
  expect_flag(s, "--heads");
  s = simple_spec(1);
  s.seeds = 0;
  expect_flag(s, "--seeds");
  s = simple_spec(1);
  s.shard_index = 2;
  s.shard_count = 2;
  expect_flag(s, "--shard");
  s = simple_spec(1);
  s.ratios = {0.5, 2.0};
  expect_flag(s, "--ratios");
  s = simple_spec(1);
  s.params["uniform"]["gamma"] = 1;
  expect_flag(s, "uniform.gamma: unknown parameter");  // the CLI: "--param uniform.gamma: ..."
  s = simple_spec(1);
  s.params["balancekv"]["gamma"] = 1;
  expect_flag(s, "--param balancekv");
}

TEST(RunEval, ProxyQueriesAreTheKeys) {
  MemoryCapture cap = make_capture(128, 1, 2, 4, false);
  MethodSettings s;
  s.method = find_method("uniform");
  s.keep_ratio = 0.25;
  const auto L = cap.layer(0);
  const HeadRun run = run_head(*L, 1, 1, s, 3);
  ASSERT_EQ(run.per_query_head.size(), 1u);  // one proxy "head": the kv head's own keys
  const std::vector<QueryError> ref =
      evaluate_query_head(L->keys[1], L->keys[1], L->values[1], run.window, run.selection);
  for (size_t e = 0; e < ref.size(); ++e)
    EXPECT_NEAR(run.per_query_head[0][e].relative, ref[e].relative, 1e-14);
  const nlohmann::json j = run_eval(cap, simple_spec(1)).to_json();
  EXPECT_EQ(j["proxy_queries"], true);
}

// The protocol end to end on the real captures (stories260K and kjv3M).
TEST(RunEval, RealCapture) {
  for (const std::string& path : ::kvscope::testing::sample_capture_paths()) {
    SCOPED_TRACE(path);
    std::unique_ptr<CaptureFile> cap;
    try {
      cap = CaptureFile::open(path);
    } catch (const InputError& e) {
      FAIL() << "a bundled sample capture does not open: " << e.what();
    }
    EvalSpec spec = simple_spec(3);
    spec.ratios = {0.5, 0.125};
    const EvalReport rep = run_eval(*cap, spec);
    EXPECT_FALSE(rep.proxy_queries);
    EXPECT_TRUE(rep.failures().empty());
    EXPECT_EQ(rep.results.size(),
              static_cast<size_t>(cap->info().num_layers) * cap->info().kv_heads * 3 * 2);
    const std::vector<EvalSummary> sum = rep.summary();
    // exact 1/2, exact 1/8, uniform 1/2, uniform 1/8, streaming 1/2, streaming 1/8
    EXPECT_LT(sum[0].mean, 1e-13);
    EXPECT_LT(sum[2].mean, sum[3].mean);  // uniform: less budget, more error
    EXPECT_LT(sum[4].mean, sum[5].mean);
    EXPECT_GT(sum[2].std, 0.0);
    EXPECT_EQ(sum[4].std, 0.0);
    for (const HeadEval& he : rep.results) {
      EXPECT_FALSE(he.refused);
      EXPECT_GT(he.mass_mean, 0.0);
      EXPECT_LE(he.mass_mean, 1.0 + 1e-12);
    }
  }
}

TEST(Params, ValidatedAgainstSpec) {
  class Tunable final : public Method {
   public:
    std::string name() const override { return "tunable"; }
    std::string summary() const override { return ""; }
    std::vector<ParamSpec> params() const override {
      ParamSpec g{"gamma", ParamSpec::Type::Float, 0, 10, 4, "", {}, false};
      ParamSpec b{"block", ParamSpec::Type::Int, 8, 1024, 128, "", {}, false};
      return {g, b};
    }
    Selection select(const MethodInput&) const override { return {}; }
  } m;
  EXPECT_NO_THROW(validate_method_params(m, {{"gamma", 0.5}, {"block", 64}}));
  EXPECT_THROW(validate_method_params(m, {{"gamma", 11}}), InputError);
  EXPECT_THROW(validate_method_params(m, {{"block", 64.5}}), InputError);
  EXPECT_THROW(validate_method_params(m, {{"blocks", 64}}), InputError);
  try {
    validate_method_params(m, {{"gamma", -1}});
  } catch (const SettingError& e) {
    // The setting for the app, the flag for the CLI.
    EXPECT_EQ(std::string(e.what()), "tunable.gamma: -1 is outside [0, 10]");
    EXPECT_EQ(e.cli_message(), "--param tunable.gamma: -1 is outside [0, 10]");
  }
}

// The BalanceKV authors' estimator: numerator weight w, denominator weight 2^T on every
// kept token. For uniform (w = n_mid/m, close to 2^T) it barely moves the error; for balancekv
// (weights 2^k of the walk) it changes it; it round-trips through the JSON, and per-head JSON
// carries kept / budget / saturation.
TEST(Estimator, AuthorsOptionRewritesTheDenominatorAndRoundTrips) {
  Selection sel;
  sel.indices = {3, 5, 9};
  sel.weights = {2, 1, 1};
  apply_authors_estimator(sel, 0.25);
  EXPECT_TRUE(sel.separate);
  EXPECT_EQ(sel.den_indices, sel.indices);
  EXPECT_EQ(sel.den_weights, (std::vector<double>{4, 4, 4}));
  apply_authors_estimator(sel, 0.3);  // ceil(log2(1/0.3)) = 2
  EXPECT_EQ(sel.den_weights[0], 4.0);
  EXPECT_THROW(parse_estimator("nope"), InputError);

  auto cap = CaptureFile::open(std::string(KVSCOPE_SOURCE_DIR) +
                               "/sample_data/stories260K_lily.safetensors");
  EvalSpec spec;
  spec.methods = {find_method("balancekv")};
  spec.ratios = {0.5};
  spec.seeds = 2;
  spec.layers = {1};
  const EvalReport weighted = run_eval(*cap, spec);
  spec.estimator = Estimator::Authors;
  const EvalReport authors = run_eval(*cap, spec);
  ASSERT_EQ(weighted.results.size(), authors.results.size());
  int differ = 0;
  for (size_t i = 0; i < weighted.results.size(); ++i) {
    differ += weighted.results[i].mean != authors.results[i].mean;
    EXPECT_EQ(authors.results[i].kept, 202);  // floor(405 / 2)
    EXPECT_EQ(authors.results[i].budget, 203);
    EXPECT_GE(authors.results[i].saturation, 0.0);
    EXPECT_LE(authors.results[i].saturation, 1.0);
  }
  EXPECT_GT(differ, 0);
  const nlohmann::json j = authors.to_json();
  EXPECT_EQ(j["spec"]["estimator"], "authors");
  EXPECT_EQ(j["results"][0]["kept"], 202);
  EXPECT_TRUE(j["results"][0].contains("saturation"));
  const EvalReport back = EvalReport::from_json(j);
  EXPECT_EQ(back.spec.estimator, Estimator::Authors);
  EXPECT_EQ(back.results[0].saturation, authors.results[0].saturation);
}

}  // namespace
}  // namespace kvscope
