// Why a method loses, outside the Tokens view: eval's harm kept vs harm
// dropped per head and method (EvalSpec::harm, engine/eval/token_harm.h) equal the token_harm sums
// over each selection; the A/B overlap of kept sets (engine/eval/selection_overlap.h) equals a
// direct set computation.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "engine/eval/protocol.h"
#include "engine/eval/selection_overlap.h"
#include "engine/eval/token_harm.h"
#include "engine/io/capture.h"
#include "engine/methods/method.h"
#include "sample_captures.h"

namespace fs = std::filesystem;
using namespace kvscope;

namespace {

// harm_split of a method's own selection on one head, summed over `seeds` seeds.
HarmSplit direct_split(const LayerData& layer, int num_layers, int kv, const Method& m,
                       double ratio, int seeds, const TokenHarm& harm) {
  HarmSplit total;
  for (int r = 0; r < seeds; ++r) {
    const EvalWindow w = EvalWindow::make(static_cast<int>(layer.keys[kv].rows()), ratio);
    MethodSettings ms;
    ms.method = &m;
    ms.keep_ratio = ratio;
    const MethodInput in = make_method_input(layer, num_layers, kv, w, ms, r);
    const HarmSplit s = harm_split(harm, m.select(in));
    total.kept_sum += s.kept_sum;
    total.dropped_sum += s.dropped_sum;
  }
  return total;
}

}  // namespace

TEST(HarmInEval, KeptAndDroppedEqualTokenHarmSums) {
  for (const std::string& path : kvscope::testing::sample_capture_paths()) {
    auto cap = CaptureFile::open(path);
    EvalSpec spec;
    spec.methods = parse_method_list("uniform,snapkv,adakv(snapkv),balancekv,subgen");
    spec.ratios = {0.5, 0.125};
    spec.seeds = 2;
    spec.layers = {1};
    spec.harm = true;
    const EvalReport rep = run_eval(*cap, spec);
    const std::shared_ptr<const LayerData> layer = cap->layer(1);
    const EvalWindow w = rep.window_example;
    std::vector<TokenHarm> harms;
    for (int kv = 0; kv < cap->info().kv_heads; ++kv)
      harms.push_back(
          token_harm(harm_queries(*layer, kv), layer->keys[kv], layer->values[kv], w.sink, w.eval));
    int checked = 0;
    for (const HeadEval& he : rep.results) {
      ASSERT_TRUE(he.error.empty()) << he.error;
      ASSERT_TRUE(he.has_harm()) << he.method;
      const TokenHarm& h = harms[he.kv_head];
      double all = 0;
      for (double x : h.harm) all += x;
      const Method& m = *find_method(he.method);
      const int seeds = m.depends_on_seed() ? spec.seeds : 1;
      const HarmSplit d =
          direct_split(*layer, cap->info().num_layers, he.kv_head, m, he.ratio, seeds, h);
      const double tol = 1e-12 * std::max(1.0, all);
      EXPECT_NEAR(he.harm_kept, d.kept_sum / seeds, tol) << path << " " << he.method;
      EXPECT_NEAR(he.harm_dropped, d.dropped_sum / seeds, tol) << path << " " << he.method;
      // Every middle token is kept or dropped.
      EXPECT_NEAR(he.harm_kept + he.harm_dropped, all, tol) << he.method;
      ++checked;
    }
    EXPECT_EQ(checked, 5 * 2 * cap->info().kv_heads);
    // The summary: means over heads, and the mean dropped share.
    for (const EvalSummary& s : rep.summary()) {
      double kept = 0, dropped = 0, share = 0;
      int n = 0;
      for (const HeadEval& he : rep.results)
        if (he.method == s.method && he.ratio == s.ratio) {
          kept += he.harm_kept;
          dropped += he.harm_dropped;
          share += he.harm_dropped / (he.harm_kept + he.harm_dropped);
          ++n;
        }
      ASSERT_GT(n, 0);
      EXPECT_NEAR(s.harm_kept, kept / n, 1e-12);
      EXPECT_NEAR(s.harm_dropped, dropped / n, 1e-12);
      EXPECT_NEAR(s.harm_dropped_share, share / n, 1e-12);
      EXPECT_GT(s.harm_dropped_share, 0.0);
      EXPECT_LT(s.harm_dropped_share, 1.0);
    }
    // Keeping more drops less harm: at 1/2 every method drops less than at 1/8.
    const std::vector<EvalSummary> sum = rep.summary();
    for (size_t i = 0; i + 1 < sum.size(); i += 2)
      EXPECT_LT(sum[i].harm_dropped, sum[i + 1].harm_dropped) << sum[i].method;
    // JSON, per head and summary; it reads back.
    const nlohmann::json j = rep.to_json();
    EXPECT_EQ(j["results"][0]["harm_kept"].get<double>(), rep.results[0].harm_kept);
    EXPECT_EQ(j["summary"][0]["harm_dropped_share"].get<double>(), sum[0].harm_dropped_share);
    const EvalReport back = EvalReport::from_json(j);
    EXPECT_EQ(back.results[3].harm_dropped, rep.results[3].harm_dropped);
    EXPECT_TRUE(back.spec.harm);
  }
}

TEST(HarmInEval, OffByDefaultAndInTheCli) {
  auto cap = CaptureFile::open(kvscope::testing::sample_capture_paths()[0]);
  EvalSpec spec;
  spec.methods = parse_method_list("knorm");
  spec.ratios = {0.25};
  spec.seeds = 1;
  spec.layers = {0};
  const EvalReport rep = run_eval(*cap, spec);
  EXPECT_FALSE(rep.results[0].has_harm());
  EXPECT_FALSE(rep.to_json()["results"][0].contains("harm_kept"));

  const fs::path out = fs::temp_directory_path() / ("kvscope_harm_" + std::to_string(::getpid()));
  const std::string cmd = std::string(KVSCOPE_CLI) + " eval " +
                          kvscope::testing::sample_capture_paths()[0] +
                          " --methods knorm,tova --ratios 0.25 --seeds 1 --layers 0 --json " +
                          out.string() + " > /dev/null 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  std::ifstream in(out);
  const nlohmann::json j = nlohmann::json::parse(in);
  fs::remove(out);
  for (const auto& r : j["results"]) {
    ASSERT_TRUE(r.contains("harm_kept")) << r.dump();
    EXPECT_GE(r["harm_dropped"].get<double>(), 0.0);
  }
  for (const auto& s : j["summary"]) EXPECT_TRUE(s.contains("harm_dropped_share")) << s.dump();
}

TEST(KeptOverlap, EqualsADirectSetComputation) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    Selection a, b;
    std::set<int> sa, sb;
    const int n = 1 + static_cast<int>(rng() % 60);
    for (int t = 0; t < n; ++t) {
      if (rng() % 3 == 0) a.indices.push_back(t);
      if (rng() % 2 == 0) b.indices.push_back(t);
    }
    if (trial % 4 == 0) {  // a separate denominator set counts as kept too
      b.separate = true;
      for (int t = 0; t < n; ++t)
        if (rng() % 5 == 0) b.den_indices.push_back(t);
    }
    std::shuffle(a.indices.begin(), a.indices.end(), rng);
    sa.insert(a.indices.begin(), a.indices.end());
    sb.insert(b.indices.begin(), b.indices.end());
    sb.insert(b.den_indices.begin(), b.den_indices.end());
    std::set<int> both, either;
    for (int x : sa)
      if (sb.count(x)) both.insert(x);
    either = sa;
    either.insert(sb.begin(), sb.end());
    const KeptOverlap o = kept_overlap(a, b);
    EXPECT_EQ(o.a, static_cast<int>(sa.size()));
    EXPECT_EQ(o.b, static_cast<int>(sb.size()));
    EXPECT_EQ(o.both, static_cast<int>(both.size()));
    EXPECT_EQ(o.either(), static_cast<int>(either.size()));
    EXPECT_DOUBLE_EQ(o.jaccard(),
                     either.empty() ? 1.0 : static_cast<double>(both.size()) / either.size());
  }
  // A method against itself: 1; snapkv against streaming on a real head: the direct count.
  auto cap = CaptureFile::open(kvscope::testing::sample_capture_paths()[2]);
  const std::shared_ptr<const LayerData> layer = cap->layer(0);
  const EvalWindow w = EvalWindow::make(cap->info().num_tokens, 0.25);
  auto select = [&](const char* name) {
    MethodSettings ms;
    ms.method = find_method(name);
    ms.keep_ratio = 0.25;
    return ms.method->select(make_method_input(*layer, cap->info().num_layers, 1, w, ms, 0));
  };
  const Selection snap = select("snapkv"), stream = select("streaming");
  EXPECT_DOUBLE_EQ(kept_overlap(snap, snap).jaccard(), 1.0);
  std::set<int> a(snap.indices.begin(), snap.indices.end());
  int both = 0;
  for (int x : stream.indices) both += static_cast<int>(a.count(x));
  const KeptOverlap o = kept_overlap(snap, stream);
  EXPECT_EQ(o.both, both);
  EXPECT_EQ(o.a, w.budget);
  EXPECT_EQ(o.b, w.budget);
  EXPECT_LT(o.jaccard(), 1.0);
}
