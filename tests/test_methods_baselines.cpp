// Defining behaviour of the score-ranking baselines (h2o, snapkv, pyramidkv, tova, knorm) checked
// against direct computations written out here, plus the properties every baseline method must
// have (budgets, unique in-range indices, positive weights, determinism, missing queries).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <memory>
#include <random>
#include <set>

#include "engine/core/error.h"
#include "engine/eval/protocol.h"
#include "engine/io/capture.h"
#include "engine/methods/method.h"
#include "engine/methods/scoring.h"
#include "engine/ops/backend.h"
#include "tests/forwarding_backend.h"
#include "tests/sample_captures.h"

namespace kvscope {
namespace {

// A random head: keys with a few strong directions so attention is peaked, GQA group of 2.
struct Head {
  MatrixF keys, values;
  std::vector<MatrixF> queries;
  MethodInput input(int budget, uint64_t seed = 1) const {
    MethodInput in;
    in.keys = &keys;
    in.values = &values;
    for (const MatrixF& q : queries) in.queries.push_back(&q);
    in.n = static_cast<int>(keys.rows());
    in.sink = 8;
    in.eval = 24;
    in.mid_begin = in.sink;
    in.mid_end = in.n - in.eval;
    in.budget = budget;
    in.keep_ratio = static_cast<double>(budget) / (in.mid_end - in.mid_begin);
    in.seed = seed;
    return in;
  }
};

Head random_head(int n, int d, int dv, int group, unsigned seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  Head h;
  h.keys.resize(n, d);
  h.values.resize(n, dv);
  for (int i = 0; i < n; ++i) {
    const float scale = 1.5f + (i % 7) * 0.3f;
    for (int j = 0; j < d; ++j) h.keys(i, j) = scale * normal(gen);
    for (int j = 0; j < dv; ++j) h.values(i, j) = normal(gen);
  }
  for (int g = 0; g < group; ++g) {
    MatrixF q(n, d);
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < d; ++j) q(i, j) = 1.2f * normal(gen);
    h.queries.push_back(std::move(q));
  }
  return h;
}

// Softmax of query row j over keys 0..j, computed directly (double, max-subtracted).
std::vector<double> direct_softmax(const MatrixF& q, const MatrixF& k, int j) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(k.cols()));
  std::vector<double> logits(j + 1);
  for (int i = 0; i <= j; ++i) {
    double dot = 0;
    for (int c = 0; c < k.cols(); ++c) dot += static_cast<double>(q(j, c)) * k(i, c);
    logits[i] = dot * scale;
  }
  const double mx = *std::max_element(logits.begin(), logits.end());
  double z = 0;
  for (double& x : logits) z += (x = std::exp(x - mx));
  for (double& x : logits) x /= z;
  return logits;
}

// The middle indices (absolute) of the m largest scores, computed with a full sort.
std::vector<int> expected_top(const std::vector<double>& middle_scores, int mid_begin, int m) {
  std::vector<int> order(middle_scores.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return middle_scores[a] > middle_scores[b]; });
  std::vector<int> top(order.begin(), order.begin() + m);
  for (int& i : top) i += mid_begin;
  std::sort(top.begin(), top.end());
  return top;
}

const Method& method(const std::string& name) {
  const Method* m = find_method(name);
  if (!m) throw std::runtime_error("no method " + name);
  return *m;
}

void expect_valid(const MethodInput& in, const std::vector<int>& idx, const std::vector<double>& w,
                  const std::string& what) {
  ASSERT_EQ(idx.size(), w.size()) << what;
  std::set<int> seen;
  for (size_t i = 0; i < idx.size(); ++i) {
    EXPECT_GE(idx[i], in.mid_begin) << what;
    EXPECT_LT(idx[i], in.mid_end) << what;
    EXPECT_TRUE(seen.insert(idx[i]).second) << what << ": duplicate index " << idx[i];
    EXPECT_TRUE(std::isfinite(w[i]) && w[i] > 0) << what << ": weight " << w[i];
  }
}

const std::vector<std::string> kBaselines = {"h2o",   "snapkv", "pyramidkv",      "tova",
                                             "knorm", "subgen", "subgen-kcenter", "buzz"};

TEST(Baselines, EveryMethodKeepsValidSelectionsOfTheBudget) {
  const Head h = random_head(200, 8, 8, 2, 11);
  for (const std::string& name : kBaselines) {
    for (int budget : {1, 7, 40, 84, 168}) {
      MethodInput in = h.input(budget);
      const Selection sel = method(name).select(in);
      const std::string what = name + " m=" + std::to_string(budget);
      expect_valid(in, sel.indices, sel.weights, what);
      if (name == "subgen") {
        ASSERT_TRUE(sel.separate);
        expect_valid(in, sel.den_indices, sel.den_weights, what + " (denominator)");
        EXPECT_LE(sel.indices.size() + sel.den_indices.size(), static_cast<size_t>(budget)) << what;
        if (budget >= 2) {
          EXPECT_FALSE(sel.indices.empty()) << what;
          EXPECT_FALSE(sel.den_indices.empty()) << what;
        }
      } else if (name != "pyramidkv") {  // pyramidkv's per-layer budget: its own test
        EXPECT_EQ(sel.indices.size(), static_cast<size_t>(budget)) << what << " " << sel.note;
      }
      if (!sel.middle_scores.empty()) {
        EXPECT_EQ(sel.middle_scores.size(), static_cast<size_t>(in.mid_end - in.mid_begin));
      }
    }
  }
}

TEST(Baselines, DeterministicPerSeed) {
  const Head h = random_head(160, 8, 8, 2, 12);
  for (const std::string& name : kBaselines) {
    const Selection a = method(name).select(h.input(30, 5));
    const Selection b = method(name).select(h.input(30, 5));
    EXPECT_EQ(a.indices, b.indices) << name;
    EXPECT_EQ(a.weights, b.weights) << name;
    EXPECT_EQ(a.den_indices, b.den_indices) << name;
    EXPECT_EQ(a.den_weights, b.den_weights) << name;
  }
}

TEST(Baselines, QueryAwareMethodsRefuseCapturesWithoutQueries) {
  const Head h = random_head(120, 8, 8, 2, 13);
  for (const std::string& name : kBaselines) {
    MethodInput in = h.input(20);
    in.queries.clear();
    if (method(name).needs_queries()) {
      try {
        method(name).select(in);
        ADD_FAILURE() << name << " ran without queries";
      } catch (const InputError& e) {
        EXPECT_NE(std::string(e.what()).find("quer"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
      }
    } else {
      EXPECT_NO_THROW(method(name).select(in)) << name;
    }
  }
  for (const char* name : {"h2o", "snapkv", "pyramidkv", "tova", "buzz"})
    EXPECT_TRUE(method(name).needs_queries()) << name;
  for (const char* name : {"knorm", "subgen", "subgen-kcenter"})
    EXPECT_FALSE(method(name).needs_queries()) << name;
}

TEST(Baselines, BadBudgetIsAnInputError) {
  const Head h = random_head(100, 8, 8, 2, 14);
  for (const std::string& name : kBaselines) {
    MethodInput in = h.input(10);
    in.budget = in.mid_end - in.mid_begin + 1;
    EXPECT_THROW(method(name).select(in), InputError) << name;
  }
}

TEST(Baselines, NonFiniteInputIsAnInputError) {
  for (const std::string& name : kBaselines) {
    Head h = random_head(100, 8, 8, 2, 15);
    h.keys(50, 3) = std::numeric_limits<float>::quiet_NaN();
    EXPECT_THROW(method(name).select(h.input(10)), InputError) << name;
    Head g = random_head(100, 8, 8, 2, 15);
    g.values(20, 1) = std::numeric_limits<float>::infinity();
    EXPECT_THROW(method(name).select(g.input(10)), InputError) << name;
  }
}

// Every method that reads the head runs the one input check (check_method_input,
// engine/methods/method.h): BalanceKV's walk and its streaming variant refuse a NaN key and an
// infinite value like the baselines, instead of walking on them.
TEST(Baselines, BalanceKvRefusesNonFiniteInputLikeEveryMethod) {
  for (const std::string name : {"balancekv", "balancekv-stream"}) {
    Head h = random_head(100, 8, 8, 2, 15);
    h.keys(50, 3) = std::numeric_limits<float>::quiet_NaN();
    try {
      method(name).select(h.input(10));
      ADD_FAILURE() << name << " accepted a NaN key";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("keys contain NaN or Inf"), std::string::npos)
          << name << ": " << e.what();
    }
    Head g = random_head(100, 8, 8, 2, 15);
    g.values(20, 1) = std::numeric_limits<float>::infinity();
    EXPECT_THROW(method(name).select(g.input(10)), InputError) << name;
  }
}

TEST(Baselines, UnknownOrOutOfRangeParametersAreInputErrors) {
  const Head h = random_head(100, 8, 8, 2, 16);
  for (const std::string& name : kBaselines) {
    MethodInput in = h.input(10);
    in.params["no_such_parameter"] = 1;
    try {
      method(name).select(in);
      ADD_FAILURE() << name << " accepted an unknown parameter";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(name + ".no_such_parameter"), std::string::npos)
          << e.what();
    }
    for (const ParamSpec& spec : method(name).params()) {
      MethodInput bad = h.input(10);
      bad.params[spec.name] = spec.type == ParamSpec::Type::Choice
                                  ? static_cast<double>(spec.choices.size())
                                  : spec.max + 1;
      EXPECT_THROW(method(name).select(bad), InputError) << name << "." << spec.name;
    }
  }
}

TEST(H2O, KeepsTopScoresOfCausalAttentionNormalisedByQueryCount) {
  const Head h = random_head(150, 8, 8, 2, 21);
  const MethodInput in = h.input(30);
  std::vector<double> expected(in.mid_end - in.mid_begin, 0.0);
  for (const MatrixF& q : h.queries)
    for (int j = 0; j < in.mid_end; ++j) {
      const std::vector<double> p = direct_softmax(q, h.keys, j);
      for (int i = in.mid_begin; i <= j; ++i)
        expected[i - in.mid_begin] += p[i] / (in.mid_end - i) / h.queries.size();
    }
  const Selection sel = method("h2o").select(in);
  ASSERT_EQ(sel.middle_scores.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i)
    EXPECT_NEAR(sel.middle_scores[i], expected[i], 1e-9 * std::max(1.0, expected[i]));
  EXPECT_EQ(sel.indices, expected_top(expected, in.mid_begin, in.budget));
}

TEST(SnapKV, KeepsTopPooledObservationWindowVotes) {
  const Head h = random_head(180, 8, 8, 2, 22);
  const MethodInput in = h.input(40);
  const int window = 32, kernel = 5;
  std::vector<double> votes(in.mid_end, 0.0);
  for (const MatrixF& q : h.queries)
    for (int j = in.mid_end - window; j < in.mid_end; ++j) {
      const std::vector<double> p = direct_softmax(q, h.keys, j);
      for (int i = 0; i <= j; ++i) votes[i] += p[i] / h.queries.size();
    }
  std::vector<double> expected(in.mid_end - in.mid_begin);
  for (int i = in.mid_begin; i < in.mid_end; ++i) {
    double s = 0;
    for (int t = i - kernel / 2; t <= i + kernel / 2; ++t)
      if (t >= 0 && t < in.mid_end) s += votes[t];
    expected[i - in.mid_begin] = s / kernel;  // zero padding, divisor = kernel
  }
  const Selection sel = method("snapkv").select(in);
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_NEAR(sel.middle_scores[i], expected[i], 1e-9);
  EXPECT_EQ(sel.indices, expected_top(expected, in.mid_begin, in.budget));

  // Pooling matters: without it the ranking is by raw votes.
  MethodInput raw = in;
  raw.params["kernel"] = 1;
  const Selection unpooled = method("snapkv").select(raw);
  std::vector<double> raw_mid(votes.begin() + in.mid_begin, votes.begin() + in.mid_end);
  EXPECT_EQ(unpooled.indices, expected_top(raw_mid, in.mid_begin, in.budget));
}

TEST(Tova, KeepsTopAttentionOfTheLastQueryBeforeTheWindow) {
  const Head h = random_head(140, 8, 8, 2, 23);
  const MethodInput in = h.input(25);
  std::vector<double> expected(in.mid_end - in.mid_begin, 0.0);
  for (const MatrixF& q : h.queries) {
    const std::vector<double> p = direct_softmax(q, h.keys, in.mid_end - 1);
    for (int i = in.mid_begin; i < in.mid_end; ++i)
      expected[i - in.mid_begin] += p[i] / h.queries.size();
  }
  const Selection sel = method("tova").select(in);
  for (size_t i = 0; i < expected.size(); ++i)
    EXPECT_NEAR(sel.middle_scores[i], expected[i], 1e-12);
  EXPECT_EQ(sel.indices, expected_top(expected, in.mid_begin, in.budget));
}

TEST(KNorm, KeepsTheLowestKeyNorms) {
  const Head h = random_head(130, 8, 8, 1, 24);
  const MethodInput in = h.input(33);
  const Selection sel = method("knorm").select(in);
  std::set<int> kept(sel.indices.begin(), sel.indices.end());
  double max_kept = 0, min_dropped = 1e300;
  for (int i = in.mid_begin; i < in.mid_end; ++i) {
    const double norm = h.keys.row(i).cast<double>().norm();
    if (kept.count(i))
      max_kept = std::max(max_kept, norm);
    else
      min_dropped = std::min(min_dropped, norm);
  }
  EXPECT_LE(max_kept, min_dropped);
  EXPECT_EQ(sel.indices.size(), 33u);
}

TEST(PyramidKV, LayerBudgetsFallLinearlyAndSumToTheCommonTotal) {
  const Head h = random_head(300, 8, 8, 2, 25);
  // Budgets worked out by hand from PyramidKV's line (min = m/beta, max = 2m - min, beta = 20,
  // clamped to [1, n_mid]) rounded through cumulative sums (pyramidkv.cpp's header):
  //   L=5, m=40:  line 78, 59, 40, 21, 2 (integers already)
  //   L=4, m=40:  line 78, 52.67, 27.33, 2; cumulative 78, 130.67, 158, 160 -> 78, 53, 27, 2
  //   L=3, m=3:   min 0.15 < 1, so min = 1, max = 5: 5, 3, 1
  //   L=32, m=40: the line falls by 76/31 per layer; rounding its cumulative sums gives the 32
  //               values below (worked out outside the C++ code)
  //   L=1:        the layer keeps m
  struct Case {
    int layers, m;
    std::vector<int> budgets;
  };
  const std::vector<Case> cases = {
      {5, 40, {78, 59, 40, 21, 2}},
      {4, 40, {78, 53, 27, 2}},
      {3, 3, {5, 3, 1}},
      {1, 120, {120}},
      {32, 40, {78, 76, 73, 70, 68, 66, 64, 60, 59, 56, 53, 51, 49, 46, 44, 41,
                39, 36, 34, 31, 29, 27, 24, 21, 20, 16, 14, 12, 10, 7,  4,  2}},
  };
  for (const Case& c : cases) {
    const std::string what = "L=" + std::to_string(c.layers) + " m=" + std::to_string(c.m);
    MethodInput in = h.input(c.m);
    in.num_layers = c.layers;
    std::vector<int> budgets;
    for (int l = 0; l < c.layers; ++l) {
      in.layer = l;
      const Selection sel = method("pyramidkv").select(in);
      budgets.push_back(static_cast<int>(sel.indices.size()));
      // The layer's selection is SnapKV's top m_l.
      MethodInput snap = in;
      snap.budget = budgets.back();
      EXPECT_EQ(sel.indices, method("snapkv").select(snap).indices) << what << " layer " << l;
    }
    EXPECT_EQ(budgets, c.budgets) << what;
  }
  // A budget beyond half the middle clamps the bottom layer to the whole middle (n_mid = 300 -
  // 8 sinks - 24 window = 268), and the top layer takes the rest of 2m = 500: 232.
  MethodInput in = h.input(250);
  ASSERT_EQ(in.mid_end - in.mid_begin, 268);
  in.num_layers = 2;
  in.layer = 0;
  EXPECT_EQ(method("pyramidkv").select(in).indices.size(), 268u);
  in.layer = 1;
  EXPECT_EQ(method("pyramidkv").select(in).indices.size(), 232u);
}

TEST(AttentionScores, PoolingMatchesPyTorchSamePadding) {
  const std::vector<double> x = {1, 2, 3, 4, 5, 6};
  const std::vector<double> avg = avg_pool_same(x, 5);
  EXPECT_DOUBLE_EQ(avg[0], (1 + 2 + 3) / 5.0);
  EXPECT_DOUBLE_EQ(avg[2], (1 + 2 + 3 + 4 + 5) / 5.0);
  EXPECT_DOUBLE_EQ(avg[5], (4 + 5 + 6) / 5.0);
  const std::vector<double> mx = max_pool_same(x, 3);
  EXPECT_EQ(mx, (std::vector<double>{2, 3, 4, 5, 6, 6}));
  EXPECT_THROW(avg_pool_same(x, 4), InputError);
  EXPECT_EQ(top_m_indices({0.5, 0.9, 0.1, 0.9}, 2), (std::vector<int>{1, 3}));
}

// On the real sample captures (stories260K and kjv3M, made by `kvscope-cli capture`), each
// baseline runs through the protocol and its error is finite; the query-aware score methods cover
// more exact attention mass than the worst case of keeping nothing.
TEST(Baselines, RunOnTheSampleCapture) {
  for (const std::string& path : ::kvscope::testing::sample_capture_paths()) {
    SCOPED_TRACE(path);
    auto capture = CaptureFile::open(path);
    ASSERT_TRUE(capture->info().has_queries) << path << " has no queries";
    auto layer = capture->layer(capture->info().num_layers - 1);
    for (const std::string& name : kBaselines) {
      MethodSettings s;
      s.method = &method(name);
      s.keep_ratio = 0.25;
      const HeadRun run = run_head(*layer, capture->info().num_layers, 0, s, 3);
      EXPECT_TRUE(std::isfinite(run.mean_relative)) << name;
      EXPECT_GT(run.mean_mass, 0.0) << name;
      const MethodInput in =
          make_method_input(*layer, capture->info().num_layers, 0, run.window, s, 3);
      expect_valid(in, run.selection.indices, run.selection.weights, name + " on " + path);
    }
  }
}

// The distortion every recording backend below applies to its op's figures: a factor from 1 to
// 13 that depends on the token, so a method reading the figures must rank differently.
double distortion(int token) {
  return 1 + (token * 7919) % 13;
}

// A backend whose attention-score op is the CPU reference, counted, and (when `distort`) with each
// output scaled by a factor that depends on the key, so that a method reading the op's figures
// must rank differently. Its other ops are the CPU references.
class ScoreRecorder final : public ::kvscope::testing::ForwardingBackend {
 public:
  bool distort = false;
  void attention_scores(const ScoreBatch& b) override {
    ForwardingBackend::attention_scores(b);
    if (!distort) return;
    for (const ScoreHead& h : b.heads)
      for (int i = 0; i < b.row_end; ++i) {
        h.scores[i] *= distortion(i);
        if (h.stopped) h.stopped[i] *= 1 + (i * 104729) % 11;
      }
  }
};

using ::kvscope::testing::MethodCase;

// Layer 1 of the first sample capture with the window at ratio 1/4 (the routing tests' input).
struct RoutingInput {
  std::unique_ptr<CaptureFile> capture =
      CaptureFile::open(::kvscope::testing::sample_capture_paths().front());
  int layers = capture->info().num_layers;
  std::shared_ptr<const LayerData> layer = capture->layer(1);
  EvalWindow w = EvalWindow::make(capture->info().num_tokens, 0.25);
};

// Calls fn(method, input, kv) for every case on every kv head of the routing input.
template <typename Fn>
void for_each_routed_head(const std::vector<MethodCase>& cases, Fn fn) {
  const RoutingInput r;
  for (const MethodCase& c : cases) {
    SCOPED_TRACE(std::string(c.method) + (c.params.empty() ? "" : " (with parameters)"));
    const Method& m = method(c.method);
    for (int kv = 0; kv < r.capture->info().kv_heads; ++kv) {
      MethodInput in = make_method_input(*r.layer, r.layers, kv, r.w, c.params, 0);
      fn(m, in, kv);
    }
  }
}

// What every routing test below checks: the selection made through a forwarding backend is the
// one made without, bit for bit (scores included) ...
void expect_same_selection(const Selection& routed, const Selection& plain, int kv) {
  EXPECT_EQ(routed.indices, plain.indices) << "kv head " << kv;
  EXPECT_EQ(routed.weights, plain.weights) << "kv head " << kv;
  EXPECT_EQ(routed.middle_scores, plain.middle_scores) << "kv head " << kv;
}
// ... and one made with the op's figures distorted differs in what it keeps or how it scores.
void expect_op_reached_selection(const Selection& distorted, const Selection& plain, int kv) {
  EXPECT_TRUE(distorted.indices != plain.indices || distorted.cluster != plain.cluster ||
              distorted.middle_scores != plain.middle_scores)
      << "kv head " << kv << ": the op's figures did not reach the selection";
}

// The score-ranking methods (and wrappers around them) compute their attention scores through
// MethodInput::backend's attention-score op: with a backend that forwards to the CPU reference
// every selection is the one without a backend, bit for bit (scores included); with one that
// changes the op's figures, the selections change (so the op's output is what they rank).
TEST(Baselines, ScoreMethodsScoreThroughTheMethodsBackend) {
  for_each_routed_head(::kvscope::testing::score_ranking_cases(),
                       [](const Method& m, MethodInput& in, int kv) {
                         const Selection plain = m.select(in);
                         ScoreRecorder rec;
                         in.backend = &rec;
                         const Selection routed = m.select(in);
                         EXPECT_GT(rec.calls, 0) << "kv head " << kv << ": the op was not called";
                         expect_same_selection(routed, plain, kv);
                         rec.distort = true;
                         expect_op_reached_selection(m.select(in), plain, kv);
                       });
}

// A backend whose key-clustering and cache-score ops are the CPU references, counted, and (when
// `distort`) with their figures changed: the clusters relabelled in reverse order of creation,
// each score addition scaled by a factor that depends on the key. Its other ops are the CPU's.
class StreamOpRecorder final : public ::kvscope::testing::ForwardingBackend {
 public:
  bool distort = false;
  bool parallel = false;  // as a device: SubGen then sends several radii per call
  bool parallel_in_one_call() const override { return parallel; }
  void key_clusters(const ClusterBatch& b) override {
    ForwardingBackend::key_clusters(b);
    if (!distort) return;
    for (size_t r = 0; r < b.deltas.size(); ++r) {
      KeyClusters& c = b.out[r];
      const int num = static_cast<int>(c.size.size());
      for (int& o : c.owner)
        if (o >= 0) o = num - 1 - o;
      std::reverse(c.size.begin(), c.size.end());
    }
  }
  void cache_scores(const CacheScoreBatch& b) override {
    if (!distort) return ForwardingBackend::cache_scores(b);
    std::vector<double> before(b.acc, b.acc + b.n);
    ForwardingBackend::cache_scores(b);
    for (int j = 0; j < b.num_keys; ++j) {
      const int i = b.key_ids[j];
      b.acc[i] = before[i] + (b.acc[i] - before[i]) * distortion(i);
    }
  }
};

// SubGen's clustering and BUZZ's streamed scores (the default compressed-cache rule, and
// full-prefix with log n) run on MethodInput::backend's ops: forwarding to the CPU references
// gives every selection bit for bit; changing the ops' figures changes the selections.
TEST(Baselines, SubGenAndBuzzRunTheirOpsOnTheMethodsBackend) {
  const std::vector<MethodCase> cases = {
      {"subgen", {}},
      {"buzz", {{"window", 8}, {"threshold", 20}}},
      {"buzz", {{"window", 8}, {"threshold", 20}, {"log_n", 1}, {"accumulate", 1}}},
  };
  for_each_routed_head(cases, [](const Method& m, MethodInput& in, int kv) {
    const Selection plain = m.select(in);
    // Recorders alive at once: SubGen remembers its radius search per backend.
    StreamOpRecorder rec, distorting, parallel;
    distorting.distort = true;
    parallel.parallel = true;
    in.backend = &rec;
    const Selection routed = m.select(in);
    EXPECT_GT(rec.calls, 0) << "kv head " << kv << ": the op was not called";
    expect_same_selection(routed, plain, kv);
    EXPECT_EQ(routed.den_indices, plain.den_indices) << "kv head " << kv;
    EXPECT_EQ(routed.cluster, plain.cluster) << "kv head " << kv;
    // A parallel backend gets SubGen's bisection several levels per call (31 radii): the same
    // search, so the same delta (in the note), clusters and selection.
    in.backend = &parallel;
    const Selection batched = m.select(in);
    EXPECT_EQ(batched.note, plain.note) << "kv head " << kv;
    EXPECT_EQ(batched.indices, plain.indices) << "kv head " << kv;
    EXPECT_EQ(batched.cluster, plain.cluster) << "kv head " << kv;
    EXPECT_EQ(batched.middle_scores, plain.middle_scores) << "kv head " << kv;
    if (m.name() == "subgen") {
      EXPECT_LT(parallel.calls, rec.calls) << "kv head " << kv << ": no radii batched";
    }
    in.backend = &distorting;
    expect_op_reached_selection(m.select(in), plain, kv);
  });
}

// A backend whose expected-attention op is the CPU reference, counted, and (when `distort`) with
// each score scaled by a factor that depends on the token.
class ExpectedRecorder final : public ::kvscope::testing::ForwardingBackend {
 public:
  bool distort = false;
  void expected_scores(const ExpectedScoreBatch& b) override {
    ForwardingBackend::expected_scores(b);
    if (!distort) return;
    for (const ExpectedScoreHead& h : b.heads)
      for (int j = 0; j < b.count; ++j) h.scores[j] *= distortion(j);
  }
};

// Expected-attention (and a wrapper around it) computes its scores through MethodInput::backend's
// expected-attention op: forwarding to the CPU reference gives every selection bit for bit;
// changing the op's figures changes the selections.
TEST(Baselines, ExpectedAttentionScoresThroughTheMethodsBackend) {
  const std::vector<MethodCase> cases = {
      {"expected-attention", {}},
      {"expected-attention", {{"use_covariance", 0}, {"use_vnorm", 0}}},
      {"adakv(expected-attention)", {}},
  };
  for_each_routed_head(cases, [](const Method& m, MethodInput& in, int kv) {
    const Selection plain = m.select(in);
    ExpectedRecorder rec;
    in.backend = &rec;
    const Selection routed = m.select(in);
    EXPECT_GT(rec.calls, 0) << "kv head " << kv << ": the op was not called";
    expect_same_selection(routed, plain, kv);
    rec.distort = true;
    expect_op_reached_selection(m.select(in), plain, kv);
  });
}

// A backend whose chunked-attention op is the CPU reference, counted, and (when `distort`) with
// each column sum scaled by a factor that depends on the token.
class ChunkRecorder final : public ::kvscope::testing::ForwardingBackend {
 public:
  bool distort = false;
  void chunk_scores(const ChunkScoreBatch& b) override {
    ForwardingBackend::chunk_scores(b);
    if (!distort) return;
    for (const ChunkScoreHead& h : b.heads)
      for (int j = 0; j < b.len; ++j) h.col[j] *= distortion(j);
  }
};

// Compactor computes its chunked attention through MethodInput::backend's chunked-attention op
// (its memo keeps each backend's scores apart): forwarding to the CPU reference gives every
// selection bit for bit; changing the op's figures changes them. The recorders live for the
// whole test, so no two share an address (the memo's key).
TEST(Baselines, CompactorScoresThroughTheMethodsBackend) {
  const std::vector<MethodCase> cases = {
      {"compactor", {}},
      {"compactor", {{"chunk_size", 50}, {"sketch", 1}}},
  };
  ChunkRecorder rec, distorting;
  distorting.distort = true;
  for_each_routed_head(cases, [&](const Method& m, MethodInput& in, int kv) {
    in.backend = &cpu_backend();
    const Selection plain = m.select(in);
    const int before = rec.calls;
    in.backend = &rec;
    const Selection routed = m.select(in);
    // One call per layer and parameter set (the memo serves the other kv heads).
    if (kv == 0) {
      EXPECT_GT(rec.calls, before) << "the op was not called";
    }
    expect_same_selection(routed, plain, kv);
    in.backend = &distorting;
    expect_op_reached_selection(m.select(in), plain, kv);
  });
}

// The attention-score methods exist to keep the tokens attention goes to: on the real capture
// their kept set covers more of the evaluation queries' exact attention mass than a uniform
// sample of the same size, on every layer.
TEST(Baselines, ScoreMethodsCoverMoreAttentionMassThanUniformOnTheSampleCapture) {
  for (const std::string& path : ::kvscope::testing::sample_capture_paths()) {
    SCOPED_TRACE(path);
    ASSERT_TRUE(std::filesystem::exists(path)) << path << " is missing";
    auto capture = CaptureFile::open(path);
    const int layers = capture->info().num_layers;
    for (int l = 0; l < layers; ++l) {
      auto layer = capture->layer(l);
      auto mass = [&](const std::string& name, uint64_t seed) {
        MethodSettings s;
        s.method = &method(name);
        s.keep_ratio = 0.25;
        double total = 0;
        for (int kv = 0; kv < capture->info().kv_heads; ++kv)
          total += run_head(*layer, layers, kv, s, seed).mean_mass;
        return total / capture->info().kv_heads;
      };
      double uniform = 0;
      for (uint64_t seed = 0; seed < 3; ++seed) uniform += mass("uniform", seed) / 3;
      for (const char* name : {"h2o", "snapkv", "tova", "buzz"})
        EXPECT_GT(mass(name, 0), uniform) << name << " layer " << l;
    }
  }
}

}  // namespace
}  // namespace kvscope
