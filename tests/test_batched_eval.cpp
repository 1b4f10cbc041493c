// A layer's kv heads in one attention_errors call (// engine/eval/protocol_batched.cpp, docs/design.md "Backend ops"). A counting backend
// ("test-batch", tests/counting_backend.h), as a device backend registers itself, says it
// parallelises inside one call and runs the CPU references (cpu_attention_errors and the CPU
// backend's walk, t-SNE, k-center and scores) while it records every attention_errors call.
// run_eval and the two-parameter sweep through it must make one call per layer and (point, method,
// ratio, seed) holding every kv head of the layer (a per-head protocol makes kv_heads times as many
// calls of one head each), and give exactly the CPU path's report: every figure, note and error.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/core/error.h"
#include "engine/eval/protocol.h"
#include "engine/eval/sweep_grid.h"
#include "engine/io/capture.h"
#include "engine/methods/method.h"
#include "engine/ops/backend.h"
#include "tests/counting_backend.h"
#include "tests/sample_captures.h"

using namespace kvscope;

namespace {

using kvscope::testing::counting;
using kvscope::testing::ErrorCall;

// Keeps the first m middle tokens, and throws on kv head 1 at its second seed: an error must land
// on its own item, as when each head is evaluated alone.
class ThrowsOnHeadOne final : public Method {
 public:
  std::string name() const override { return "test-throws-on-head-1"; }
  std::string summary() const override { return "first m tokens; throws on kv head 1, seed 1"; }
  Selection select(const MethodInput& in) const override {
    if (in.kv_head == 1 && in.seed == 1) throw std::runtime_error("head 1 refuses seed 1");
    Selection s;
    for (int t = in.mid_begin; t < in.mid_begin + in.budget; ++t) {
      s.indices.push_back(t);
      s.weights.push_back(1.0);
    }
    return s;
  }
};

const Method* throwing_method() {
  static const Method* m = [] {
    register_method(std::make_unique<ThrowsOnHeadOne>());
    return find_method("test-throws-on-head-1");
  }();
  return m;
}

Backend& batch_backend() {
  EXPECT_TRUE(kvscope::testing::kCountingRegistered);
  Backend& b = select_backend("test-batch");
  EXPECT_TRUE(b.parallel_in_one_call());
  counting().take_calls();
  return b;
}

// Equal, or both NaN; with `tol` > 0, within tol relative.
void expect_close(double got, double want, double tol, const std::string& what) {
  if (std::isnan(want)) {
    EXPECT_TRUE(std::isnan(got)) << what;
  } else if (tol == 0) {
    EXPECT_EQ(got, want) << what;
  } else {
    EXPECT_NEAR(got, want, tol * std::max(std::abs(want), 1e-300)) << what;
  }
}

void expect_close(const std::vector<double>& got, const std::vector<double>& want, double tol,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < want.size(); ++i)
    expect_close(got[i], want[i], tol, what + " [" + std::to_string(i) + "]");
}

// Every field of every result. The figures bit for bit with tol = 0, else within tol relative;
// what the methods chose (kept, notes, saturation, errors) always exactly.
void expect_same_report(const EvalReport& got, const EvalReport& want, double tol = 0) {
  ASSERT_EQ(got.results.size(), want.results.size());
  for (size_t i = 0; i < want.results.size(); ++i) {
    const HeadEval& g = got.results[i];
    const HeadEval& w = want.results[i];
    const std::string at = w.method + " r=" + std::to_string(w.ratio) + " L" +
                           std::to_string(w.layer) + " H" + std::to_string(w.kv_head) + " p" +
                           std::to_string(w.point);
    EXPECT_EQ(g.method, w.method) << at;
    EXPECT_EQ(g.ratio, w.ratio) << at;
    EXPECT_EQ(g.layer, w.layer) << at;
    EXPECT_EQ(g.kv_head, w.kv_head) << at;
    EXPECT_EQ(g.point, w.point) << at;
    expect_close(g.mean, w.mean, tol, at + " mean");
    // A spread over seeds amplifies the figures' relative difference: measured against the mean.
    if (tol == 0)
      EXPECT_EQ(g.std, w.std) << at;
    else
      EXPECT_NEAR(g.std, w.std, tol * std::abs(w.mean)) << at << " std";
    expect_close(g.normalized_mean, w.normalized_mean, tol, at + " normalized");
    expect_close(g.mass_mean, w.mass_mean, tol, at + " mass");
    expect_close(g.per_seed, w.per_seed, tol, at + " per_seed");
    expect_close(g.per_query, w.per_query, tol, at + " per_query");
    EXPECT_EQ(g.note, w.note) << at;
    EXPECT_EQ(g.kept, w.kept) << at;
    EXPECT_EQ(g.budget, w.budget) << at;
    EXPECT_EQ(g.saturation, w.saturation) << at;
    EXPECT_EQ(g.refused, w.refused) << at;
    EXPECT_EQ(g.error, w.error) << at;
    expect_close(g.harm_kept, w.harm_kept, 0, at + " harm_kept");
    expect_close(g.harm_dropped, w.harm_dropped, 0, at + " harm_dropped");
  }
  EXPECT_EQ(got.notes, want.notes);
}

// The calls one layer-batched run makes: per layer, one per (point, method, ratio, seed run),
// where a method that ignores the seed runs once and one that ignores the budget too (with the
// weighted estimator) once for all ratios.
size_t expected_calls(const EvalSpec& spec, int layers) {
  size_t per_layer = 0;
  const size_t points = std::max<size_t>(1, spec.points.size());
  for (const Method* m : spec.methods) {
    const size_t runs = m->depends_on_seed() ? static_cast<size_t>(spec.seeds) : 1;
    const bool budget_free =
        !m->depends_on_seed() && !m->depends_on_budget() && spec.estimator == Estimator::Weighted;
    per_layer += points * runs * (budget_free ? 1 : spec.ratios.size());
  }
  return per_layer * static_cast<size_t>(layers);
}

void expect_whole_layers(const std::vector<ErrorCall>& calls, const CaptureInfo& info) {
  const int group = info.has_queries ? info.q_heads / info.kv_heads : 1;
  for (const ErrorCall& c : calls) {
    EXPECT_EQ(c.kv_heads, info.kv_heads) << "a call must hold every kv head of the layer";
    EXPECT_EQ(c.distinct_keys, static_cast<size_t>(info.kv_heads));
    EXPECT_EQ(c.q_heads, info.kv_heads * group);
    EXPECT_EQ(c.n, info.num_tokens);
  }
}

// The results of kv head h alone (in the report's order).
EvalReport head_only(const EvalReport& r, int h) {
  EvalReport out = r;
  out.results.clear();
  for (const HeadEval& he : r.results)
    if (he.kv_head == h) out.results.push_back(he);
  return out;
}

// The op against the CPU path (the exact-reference cache scoring a Selection's double weights):
// the same log weights in double, so only the order of sums differs. The op's log weights were
// float until an H200 run showed eval --backend cuda ~1e-7 off on the weighted methods (uniform,
// SubGen, BalanceKV); at 1e-6 this test had let that through.
constexpr double kOpAgainstCpuPath = 1e-12;

// `got` (every kv head, through the backend) against the same spec on each kv head alone through
// the backend, one head per call, as the protocol scored before (bit for bit), and against the
// CPU path (the exact-reference cache, double weights).
void expect_per_head_and_cpu_figures(CaptureFile& cap, const EvalSpec& spec, Backend& backend,
                                     const EvalReport& got, const EvalReport& cpu) {
  expect_same_report(got, cpu, kOpAgainstCpuPath);
  EXPECT_EQ(got.failures(), cpu.failures());
  for (int h = 0; h < cap.info().kv_heads; ++h) {
    EvalSpec alone = spec;
    alone.heads = {h};
    const EvalReport one = run_eval(cap, alone, {}, nullptr, &backend);
    for (const ErrorCall& c : counting().take_calls()) EXPECT_EQ(c.kv_heads, 1);
    SCOPED_TRACE("kv head " + std::to_string(h) + " alone");
    expect_same_report(head_only(got, h), one);
  }
}

class BatchedEval : public ::testing::TestWithParam<std::string> {};

TEST_P(BatchedEval, OneCallPerLayerMethodRatioAndSeedWithEveryKvHeadAndTheSameFigures) {
  auto cap = CaptureFile::open(GetParam());
  const CaptureInfo& info = cap->info();
  Backend& backend = batch_backend();
  EvalSpec spec;
  // Seed and budget dependent, a walk through the backend, a score-ranking method, one that
  // ignores the seed, and one that ignores seed and budget.
  for (const char* name : {"uniform", "balancekv", "snapkv", "streaming", "exact"})
    spec.methods.push_back(find_method(name));
  for (const Method* m : spec.methods) ASSERT_NE(m, nullptr);
  spec.ratios = {0.5, 0.25};
  spec.seeds = 3;
  spec.threads = 2;
  spec.harm = true;
  const EvalReport cpu = run_eval(*cap, spec);  // the CPU path: exact-reference cache
  ASSERT_TRUE(counting().take_calls().empty()) << "the CPU path must not reach the backend";
  int last_done = 0, progress_calls = 0;
  const EvalReport got = run_eval(
      *cap, spec,
      [&](int done, int total) {
        ++progress_calls;
        EXPECT_EQ(done, last_done + 1);
        EXPECT_EQ(total, static_cast<int>(cpu.results.size()));
        last_done = done;
      },
      nullptr, &backend);
  EXPECT_EQ(progress_calls, static_cast<int>(cpu.results.size())) << "one call per item";
  const std::vector<ErrorCall> calls = counting().take_calls();
  EXPECT_EQ(calls.size(), expected_calls(spec, info.num_layers));
  expect_whole_layers(calls, info);
  expect_per_head_and_cpu_figures(*cap, spec, backend, got, cpu);
}

TEST(BatchedEvalCancel, ACancelDuringALayerStopsBeforeTheNextLayer) {
  auto cap = CaptureFile::open(kvscope::testing::sample_capture_paths()[0]);
  Backend& backend = batch_backend();
  EvalSpec spec;
  spec.methods = {find_method("uniform")};
  spec.ratios = {0.5};
  spec.seeds = 2;
  spec.threads = 2;
  std::atomic<bool> cancel{false};
  EXPECT_THROW(run_eval(
                   *cap, spec, [&](int, int) { cancel = true; }, &cancel, &backend),
               Cancelled);
  // The first items finish at the first layer's last seed: its two calls, none of the next layer.
  EXPECT_EQ(counting().take_calls().size(), 2u);
  cancel = true;
  EXPECT_THROW(run_eval(*cap, spec, {}, &cancel, &backend), Cancelled);
  EXPECT_TRUE(counting().take_calls().empty());
}

TEST_P(BatchedEval, ShardsOneThreadAndTheAuthorsEstimatorAsPerHead) {
  auto cap = CaptureFile::open(GetParam());
  const CaptureInfo& info = cap->info();
  Backend& backend = batch_backend();
  EvalSpec spec;
  spec.methods = {find_method("exact"), find_method("uniform")};
  spec.ratios = {0.5, 0.125};
  spec.seeds = 2;
  spec.threads = 1;
  spec.estimator = Estimator::Authors;  // exact then runs per ratio
  spec.layers = {info.num_layers - 1};
  const EvalReport got = run_eval(*cap, spec, {}, nullptr, &backend);
  const std::vector<ErrorCall> calls = counting().take_calls();
  EXPECT_EQ(calls.size(), expected_calls(spec, 1));
  expect_whole_layers(calls, info);
  expect_per_head_and_cpu_figures(*cap, spec, backend, got, run_eval(*cap, spec));

  // A shard holds some items of each head: its calls hold the heads that have them.
  spec.shard_count = 3;
  spec.shard_index = 1;
  const EvalReport shard = run_eval(*cap, spec, {}, nullptr, &backend);
  for (const ErrorCall& c : counting().take_calls()) {
    EXPECT_GE(c.kv_heads, 1);
    EXPECT_EQ(c.distinct_keys, static_cast<size_t>(c.kv_heads));
  }
  expect_same_report(shard, run_eval(*cap, spec), kOpAgainstCpuPath);
}

INSTANTIATE_TEST_SUITE_P(SampleCaptures, BatchedEval,
                         ::testing::ValuesIn(kvscope::testing::sample_capture_paths()),
                         [](const ::testing::TestParamInfo<std::string>& p) {
                           const std::string name = p.param.substr(p.param.rfind('/') + 1);
                           return name.substr(0, name.find('.'));  // stories260K_lily
                         });

TEST(BatchedEvalErrors, AMethodThatThrowsOnOneHeadFailsThatItemOnly) {
  auto cap = CaptureFile::open(kvscope::testing::sample_capture_paths()[0]);
  const CaptureInfo& info = cap->info();
  ASSERT_GE(info.kv_heads, 2);
  Backend& backend = batch_backend();
  EvalSpec spec;
  spec.methods = {throwing_method(), find_method("uniform")};
  ASSERT_NE(spec.methods[0], nullptr);
  spec.ratios = {0.25};
  spec.seeds = 3;
  spec.base_seed = 0;
  spec.threads = 2;
  spec.layers = {0, 2};
  const EvalReport cpu = run_eval(*cap, spec);
  const EvalReport got = run_eval(*cap, spec, {}, nullptr, &backend);
  ASSERT_EQ(cpu.failures().size(), 1u);
  size_t failed = 0;
  for (const HeadEval& h : got.results) failed += h.error.empty() ? 0 : 1;
  EXPECT_EQ(failed, 2u) << "kv head 1 of each layer, that method only";
  // Seed 0 holds every head; seeds 1 and 2 the heads that did not throw (an item stops at its
  // first error).
  const std::vector<ErrorCall> calls = counting().take_calls();
  EXPECT_EQ(calls.size(), 2u * (3 + 3));
  size_t short_calls = 0;
  for (const ErrorCall& c : calls) short_calls += c.kv_heads == info.kv_heads - 1 ? 1 : 0;
  EXPECT_EQ(short_calls, 4u);
  expect_per_head_and_cpu_figures(*cap, spec, backend, got, cpu);
}

TEST(BatchedEvalErrors, ABatchTheOpRejectsIsScoredHeadByHead) {
  auto cap = CaptureFile::open(kvscope::testing::sample_capture_paths()[0]);
  const CaptureInfo& info = cap->info();
  Backend& backend = batch_backend();
  EvalSpec spec;
  spec.methods = {find_method("uniform"), find_method("snapkv")};
  spec.ratios = {0.25, 0.5};
  spec.seeds = 2;
  spec.threads = 2;
  spec.layers = {1};
  counting().reject_keys = cap->layer(1)->keys[1].data();
  const EvalReport got = run_eval(*cap, spec, {}, nullptr, &backend);
  // Each rejected batch is tried once whole, then head by head: head 1's items fail with the op's
  // message, the other heads' figures stand, as when each head is evaluated alone.
  size_t failed = 0;
  for (const HeadEval& h : got.results) {
    EXPECT_EQ(h.error.empty(), h.kv_head != 1) << h.method << " H" << h.kv_head;
    if (!h.error.empty()) {
      EXPECT_EQ(h.error, "test-batch rejects these keys");
    }
    failed += h.error.empty() ? 0 : 1;
  }
  EXPECT_EQ(failed, 2u * 2u);  // two methods x two ratios
  const std::vector<ErrorCall> calls = counting().take_calls();
  // Seed 0: uniform's and snapkv's 2 ratios, each whole then alone per head; seed 1 (uniform
  // only): head 1's items stopped at their error, so the batches without it pass.
  EXPECT_EQ(calls.size(), 4u * (1 + static_cast<size_t>(info.kv_heads)) + 2u);
  for (int h = 0; h < info.kv_heads; ++h) {
    EvalSpec alone = spec;
    alone.heads = {h};
    const EvalReport one = run_eval(*cap, alone, {}, nullptr, &backend);
    counting().take_calls();
    SCOPED_TRACE("kv head " + std::to_string(h) + " alone");
    expect_same_report(head_only(got, h), one);
  }
  counting().reject_keys = nullptr;
}

// The two-parameter sweep (kvscope-cli sweep --grid2, the Error view's tuning heatmap): one call
// per layer, cell, ratio and seed, every kv head in it, and the CPU's grid.
TEST(BatchedSweep, TheGridScoresEachLayerPerCellInOneCallAndMatchesTheCpu) {
  auto cap = CaptureFile::open(kvscope::testing::sample_capture_paths()[0]);
  const CaptureInfo& info = cap->info();
  Backend& backend = batch_backend();
  Grid2Spec g;
  g.method = find_method("balancekv");
  ASSERT_NE(g.method, nullptr);
  g.rows = {"gamma", {0, 4}};
  g.cols = {"temp", {0.1, 1}};
  EvalSpec spec;
  spec.ratios = {0.25, 0.5};
  spec.seeds = 2;
  spec.threads = 2;
  const Grid2Result got = run_grid2(*cap, spec, g, {}, nullptr, &backend);
  const std::vector<ErrorCall> calls = counting().take_calls();
  EXPECT_EQ(calls.size(), static_cast<size_t>(info.num_layers) * 4 * 2 * 2);
  expect_whole_layers(calls, info);
  // Each kv head alone (one head per call, as before) gives the same grid, bit for bit; the CPU
  // path the same within the op's float log weights.
  const Grid2Result cpu = run_grid2(*cap, spec, g);
  for (int h = 0; h < info.kv_heads; ++h) {
    EvalSpec alone = spec;
    alone.heads = {h};
    const Grid2Result one = run_grid2(*cap, alone, g, {}, nullptr, &backend);
    for (const ErrorCall& c : counting().take_calls()) EXPECT_EQ(c.kv_heads, 1);
    for (size_t r = 0; r < spec.ratios.size(); ++r)
      for (size_t i = 0; i < 2; ++i)
        for (size_t j = 0; j < 2; ++j) {
          ASSERT_EQ(one.head_mean[r][i][j].size(), static_cast<size_t>(info.num_layers));
          for (int l = 0; l < info.num_layers; ++l) {
            const size_t k = static_cast<size_t>(l * info.kv_heads + h);
            ASSERT_EQ(got.heads[k], std::make_pair(l, h));
            EXPECT_EQ(got.head_mean[r][i][j][k], one.head_mean[r][i][j][static_cast<size_t>(l)])
                << "L" << l << " H" << h;
            expect_close(got.head_mean[r][i][j][k], cpu.head_mean[r][i][j][k], kOpAgainstCpuPath,
                         "cpu L" + std::to_string(l) + " H" + std::to_string(h));
          }
        }
  }
  for (size_t r = 0; r < spec.ratios.size(); ++r)
    for (size_t i = 0; i < 2; ++i)
      for (size_t j = 0; j < 2; ++j) {
        expect_close(got.mean[r][i][j], cpu.mean[r][i][j], kOpAgainstCpuPath, "grid mean");
        EXPECT_NEAR(got.seed_std[r][i][j], cpu.seed_std[r][i][j],
                    kOpAgainstCpuPath * std::abs(cpu.mean[r][i][j]));
      }
  EXPECT_EQ(got.failures, cpu.failures);
}

}  // namespace
