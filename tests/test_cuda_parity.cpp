// CUDA backend against the CPU reference (docs/testing.md): the same random inputs through
// cpu_backend() and the CUDA backend. Walk signs agree except for rare draws that land within
// float rounding of p_i, attention errors within 1e-4 relative, the t-SNE gradient closely,
// k-center picks exactly on well-separated data, attention scores within 1e-9 relative and the
// score-ranking methods' kept sets identical. The inputs are the named cases of
// tests/op_cases.h (the table bench/bench_gpu.cpp times too): the error and t-SNE tests run
// every case marked `parity`; the walk and k-center tests name theirs ("standard", "separated").
// Every device test skips with a message when no CUDA device is present; the probe's "no device"
// path itself is tested everywhere.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "engine/core/error.h"
#include "engine/core/random.h"
#include "engine/eval/protocol.h"
#include "engine/io/capture.h"
#include "engine/methods/method.h"
#include "engine/ops/backend.h"
#include "tests/op_cases.h"

#ifdef KVSCOPE_HAVE_CUDA
#include "kernels/cuda_backend.h"
#endif
#include "tests/forwarding_backend.h"

using namespace kvscope;

namespace {

Backend* gpu_or_null(std::string* why) {
  if (!cuda_available(why)) return nullptr;
  return &select_backend("cuda");
}

#define REQUIRE_GPU(var)                  \
  std::string why_##var;                  \
  Backend* var = gpu_or_null(&why_##var); \
  if (!var) GTEST_SKIP() << "no CUDA device: " << why_##var;

WalkCaseData standard_walk_case() {
  return WalkCaseData(find_walk_case("standard"));
}

TEST(CudaProbe, ReportsWhyWhenNoDeviceAndSelectBackendFollows) {
  std::string why;
  const bool available = cuda_available(&why);
  EXPECT_FALSE(why.empty()) << "cuda_available must always say what it found";
  EXPECT_EQ(&select_backend("cpu"), &cpu_backend());
  if (available) {
    Backend& gpu = select_backend("cuda");
    EXPECT_NE(&gpu, &cpu_backend());
    EXPECT_TRUE(gpu.parallel_in_one_call());
    EXPECT_NE(gpu.name().find("cuda"), std::string::npos) << gpu.name();
    EXPECT_NE(&select_backend("auto"), &cpu_backend());
  } else {
    EXPECT_EQ(&select_backend("auto"), &cpu_backend());
    try {
      select_backend("cuda");
      ADD_FAILURE() << "select_backend(\"cuda\") without a device must throw";
    } catch (const InputError& e) {
#ifdef KVSCOPE_HAVE_CUDA
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos)
          << "the error should carry the probe's reason: " << e.what();
#else
      EXPECT_NE(std::string(e.what()).find("no CUDA"), std::string::npos) << e.what();
#endif
    }
  }
#ifdef KVSCOPE_HAVE_CUDA
  std::string direct;
  Backend* instance = cuda_backend_instance(&direct);
  EXPECT_EQ(instance != nullptr, available);
  EXPECT_EQ(direct, why);
#endif
}

// Check mode of every `parity` case of tests/op_cases.h: the case run on the device against the
// same case on the CPU reference, compared as its op's figures allow (OpRun::mismatch), and on
// the device itself (no fallback).
class OpParity : public ::testing::TestWithParam<const OpCase*> {};

TEST_P(OpParity, MatchesCpu) {
  REQUIRE_GPU(gpu);
  const OpCase& c = *GetParam();
  const std::unique_ptr<OpRun> cpu = c.make(), dev = c.make();
  cpu->run(cpu_backend());
  dev->run(*gpu);
  EXPECT_EQ(last_fallback(), "") << "the op must run on the device";
  EXPECT_EQ(dev->mismatch(*cpu), "");
}

std::vector<const OpCase*> parity_cases() {
  std::vector<const OpCase*> out;
  for (const OpCase& c : all_op_cases())
    if (c.parity) out.push_back(&c);
  return out;
}

// The check mode's own plumbing, everywhere (no device needed): each parity case run twice on the
// CPU reference matches itself, and a changed output is reported.
TEST(OpCases, TheCheckModeAcceptsTheCpuAgainstItselfAndReportsAChange) {
  for (const OpCase* c : parity_cases()) {
    SCOPED_TRACE(c->label);
    const std::unique_ptr<OpRun> a = c->make(), b = c->make();
    a->run(cpu_backend());
    b->run(cpu_backend());
    EXPECT_EQ(a->mismatch(*b), "");
  }
  const std::vector<const OpCase*> cases = parity_cases();
  const OpCase& chunks = **std::find_if(cases.begin(), cases.end(),
                                        [](const OpCase* c) { return c->op == "chunk_scores"; });
  auto a = chunks.make(), b = chunks.make();
  a->run(cpu_backend());
  b->run(cpu_backend());
  static_cast<op_cases::ChunkRun&>(*a).data.col[0][3] *= 1 + 1e-8;
  EXPECT_NE(a->mismatch(*b).find("column sums[3]"), std::string::npos) << a->mismatch(*b);
}

INSTANTIATE_TEST_SUITE_P(Ops, OpParity, ::testing::ValuesIn(parity_cases()),
                         [](const ::testing::TestParamInfo<const OpCase*>& info) {
                           std::string name = info.param->label;
                           for (char& ch : name)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return name;
                         });

// Every op has cases in both modes: a new op's table is in the check mode and the benchmarks from
// its first cases.
TEST(OpCases, EveryOpHasParityAndBenchmarkCases) {
  for (size_t i = 0; i < kOpCount; ++i) {
    int parity = 0, bench = 0;
    for (const OpCase& c : all_op_cases())
      if (c.op == kOpNames[i]) parity += c.parity, bench += c.bench;
    EXPECT_GT(parity, 0) << kOpNames[i];
    EXPECT_GT(bench, 0) << kOpNames[i];
  }
}

#ifdef KVSCOPE_HAVE_CUDA
// The timing mode's machinery: the first parity case of every op, and the errors' variant that
// keeps the exact side resident, time through the one timer (each step once on a backend of its
// own, then its kernels replayed), and the steps' own run gave the CPU's figures.
TEST(CudaParity, EveryOpTimesThroughTheOneTimer) {
  REQUIRE_GPU(gpu);
  std::set<std::string> timed;
  for (const OpCase& c : all_op_cases()) {
    if (!c.parity || !timed.insert(c.op).second) continue;
    SCOPED_TRACE(c.label);
    const std::unique_ptr<OpRun> cpu = c.make(), dev = c.make();
    cpu->run(cpu_backend());
    const std::unique_ptr<GpuOpTimer> timer = cuda_op_timer(dev->steps());
    EXPECT_GE(timer->run_ms(), 0.0);
    EXPECT_GE(timer->run_ms(), 0.0);
    EXPECT_EQ(dev->mismatch(*cpu), "");
  }
  EXPECT_EQ(timed.size(), kOpCount);
  op_cases::ErrorRun cpu(find_error_case("gqa_separate"), false);
  op_cases::ErrorRun kept(find_error_case("gqa_separate"), false, true);
  cpu.run(cpu_backend());
  EXPECT_GE(cuda_op_timer(kept.steps())->run_ms(), 0.0);
  EXPECT_EQ(kept.mismatch(cpu), "");
}
#endif

// The authors' golden cases (../shared/golden) through the device walk: identical indices and
// weights. A subset of every file keeps the CPU emulation of the kernels within minutes.
TEST(CudaParity, BalanceKvMatchesTheAuthorsGoldenOnDevice) {
  REQUIRE_GPU(gpu);
  const char* root_env = std::getenv("KVSCOPE_SOURCE_DIR");
  const std::string root = root_env && *root_env ? root_env : KVSCOPE_SOURCE_DIR;
  const std::string golden = root + "/../shared/golden/";
  const int stride =
      std::getenv("KVSCOPE_GOLDEN_STRIDE") ? std::atoi(std::getenv("KVSCOPE_GOLDEN_STRIDE")) : 37;
  int checked = 0, identical = 0;
  for (const char* which : {"lily", "dragon", "d128", "overflow"}) {
    std::ifstream f(golden + "balancekv_authors_" + which + ".json");
    ASSERT_TRUE(f) << "no golden data in " << golden;
    const nlohmann::json g = nlohmann::json::parse(f);
    const std::string cap_name = g["capture"].get<std::string>();
    const std::string cap_path =
        std::ifstream(golden + cap_name) ? golden + cap_name : root + "/sample_data/" + cap_name;
    auto cap = CaptureFile::open(cap_path);
    const auto& cases = g["cases"];
    for (size_t k = 0; k < cases.size(); k += std::max(1, stride)) {
      const nlohmann::json& c = cases[k];
      auto layer = cap->layer(c["layer"].get<int>());
      const EvalWindow w = EvalWindow::make(g["n"].get<int>(), c["ratio"].get<double>());
      const ParamValues params{{"gamma", c["gamma"].get<double>()},
                               {"temp", c["temp"].get<double>()},
                               {"block", c["block"].get<double>()}};
      MethodInput in = make_method_input(*layer, cap->info().num_layers, c["kv_head"].get<int>(), w,
                                         params, c["seed"].get<uint64_t>());
      in.backend = gpu;
      const Selection sel = find_method("balancekv")->select(in);
      ++checked;
      const bool same = sel.indices == c["indices"].get<std::vector<int>>() &&
                        sel.weights == c["weights"].get<std::vector<double>>();
      identical += same;
      EXPECT_TRUE(same) << which << " case " << k << " (layer " << c["layer"] << " head "
                        << c["kv_head"] << " ratio " << c["ratio"] << " gamma " << c["gamma"]
                        << " temp " << c["temp"] << " seed " << c["seed"] << ")";
    }
  }
  std::printf("golden cases on the device: %d of %d identical\n", identical, checked);
}

TEST(CudaParity, WalkIsDeterministicAndIndependentOfBatching) {
  REQUIRE_GPU(gpu);
  const WalkCaseData w = standard_walk_case();
  std::vector<int8_t> all, again;
  std::vector<float> p, part;
  gpu->walk_blocks(w.batch(all, p, part, 7));
  gpu->walk_blocks(w.batch(again, p, part, 7));
  EXPECT_EQ(all, again);
  // Block 5 alone (same head / block id keys) gives the same signs as inside the batch.
  WalkCaseData one;
  one.d = w.d;
  one.dv = w.dv;
  const int r0 = w.offset[5], r1 = w.offset[6];
  one.keys.assign(w.keys.begin() + r0 * w.d, w.keys.begin() + r1 * w.d);
  one.values.assign(w.values.begin() + r0 * w.dv, w.values.begin() + r1 * w.dv);
  one.offset = {0, r1 - r0};
  one.head = {w.head[5]};
  one.id = {w.id[5]};
  std::vector<int8_t> alone;
  WalkBatch b = one.batch(alone, p, part, 7);
  b.p = nullptr;  // untraced call: p / partial not requested
  b.partial = nullptr;
  gpu->walk_blocks(b);
  EXPECT_TRUE(std::equal(alone.begin(), alone.end(), all.begin() + r0));
}

TEST(CudaParity, WalkRejectsBadInputLikeCpu) {
  REQUIRE_GPU(gpu);
  WalkCaseData w = standard_walk_case();
  std::vector<int8_t> s;
  std::vector<float> p, part;
  WalkBatch b = w.batch(s, p, part, 1);
  b.dv = 0;
  EXPECT_THROW(cpu_backend().walk_blocks(b), std::invalid_argument);
  EXPECT_THROW(gpu->walk_blocks(b), std::invalid_argument);
}

// ---------------------------------------------------------------------------------------------
void expect_close(const std::vector<double>& gpu, const std::vector<double>& cpu, double rel,
                  double abs, const char* what) {
  ASSERT_EQ(gpu.size(), cpu.size());
  int bad = 0;
  for (size_t i = 0; i < gpu.size(); ++i)
    if (!(std::fabs(gpu[i] - cpu[i]) <= rel * std::fabs(cpu[i]) + abs) && ++bad <= 5)
      ADD_FAILURE() << what << "[" << i << "]: gpu " << gpu[i] << " cpu " << cpu[i];
  EXPECT_EQ(bad, 0) << what;
}

TEST(CudaParity, AttentionErrorOfFullSelectionIsZero) {
  REQUIRE_GPU(gpu);
  ErrorCaseData c(find_error_case("full_selection"));
  for (auto& lw : c.batch.num_logw) std::fill(lw.begin(), lw.end(), 0.0f);
  c.batch.den_logw = c.batch.num_logw;
  c.run(*gpu);
  for (size_t i = 0; i < c.relative.size(); ++i) {
    EXPECT_LT(c.relative[i], 1e-5) << i;
    EXPECT_NEAR(c.mass[i], 1.0, 1e-6) << i;
  }
}

TEST(CudaParity, AttentionErrorsRejectBadSelectionsLikeCpu) {
  REQUIRE_GPU(gpu);
  ErrorCaseData c(find_error_case("bad_selection"));
  c.batch.num_idx[0][0] = 2;  // a sink, not the middle
  EXPECT_THROW(c.run(cpu_backend()), std::out_of_range);
  EXPECT_THROW(c.run(*gpu), std::out_of_range);
}

#ifdef KVSCOPE_HAVE_CUDA
TEST(CudaParity, OutOfMemoryFallsBackToCpuAndSaysSo) {
  REQUIRE_GPU(gpu);
  ErrorCaseData c(find_error_case("fallback"));
  c.run(cpu_backend());
  const auto rel = c.relative;
  cuda_fail_next_allocation_for_testing();
  c.run(*gpu);
  EXPECT_EQ(c.relative, rel) << "the fallback must give the CPU reference's figures";
  EXPECT_NE(last_fallback().find("out of device memory"), std::string::npos) << last_fallback();
  c.run(*gpu);  // the next call is back on the device
  EXPECT_EQ(last_fallback(), "");
  expect_close(c.relative, rel, 1e-4, 1e-7, "relative after recovery");
}
#endif

TEST(CudaParity, AttentionScoresWithoutRowsAndBadBatchesLikeCpu) {
  REQUIRE_GPU(gpu);
  ScoreCaseData data(find_score_case("h2o_gqa"));
  data.batch.row_begin = data.batch.row_end = 100;  // no rows: every sum is 0
  data.run(*gpu);
  for (const std::vector<double>& s : data.scores) EXPECT_EQ(s, std::vector<double>(100, 0.0));
  data.batch.row_end = data.batch.n + 1;
  EXPECT_THROW(data.run(cpu_backend()), std::invalid_argument);
  EXPECT_THROW(data.run(*gpu), std::invalid_argument);
}

using ::kvscope::testing::MethodCase;

// Runs every case on every layer and kv head of the sample captures, on the CPU and through
// `gpu` (wrapped to count the methods' ops: each run must reach the device, and none fall back),
// and checks the device's selection with `check(device, cpu)`, which says whether the two are
// identical. Returns {identical, runs}.
template <typename Check>
std::pair<int, int> select_on_cpu_and_device(Backend& gpu, const std::vector<MethodCase>& cases,
                                             uint64_t seed, Check check) {
  const char* root_env = std::getenv("KVSCOPE_SOURCE_DIR");
  const std::string root = root_env && *root_env ? root_env : KVSCOPE_SOURCE_DIR;
  int runs = 0, identical = 0;
  for (const char* file : {"stories260K_lily.safetensors", "kjv3M_beginning.safetensors"}) {
    const auto capture = CaptureFile::open(root + "/sample_data/" + file);
    const int layers = capture->info().num_layers;
    const EvalWindow w = EvalWindow::make(capture->info().num_tokens, 0.25);
    for (int layer = 0; layer < layers; ++layer) {
      const auto data = capture->layer(layer);
      for (int kv = 0; kv < capture->info().kv_heads; ++kv) {
        for (const MethodCase& c : cases) {
          SCOPED_TRACE(std::string(file) + " " + c.method + " layer " + std::to_string(layer) +
                       " kv head " + std::to_string(kv));
          const Method* m = find_method(c.method);
          if (!m) {
            ADD_FAILURE() << "no method " << c.method;
            continue;
          }
          MethodInput in = make_method_input(*data, layers, kv, w, c.params, seed);
          in.backend = &cpu_backend();
          const Selection cpu = m->select(in);
          ::kvscope::testing::ForwardingBackend dev(gpu);
          in.backend = &dev;
          const Selection sel = m->select(in);
          // A layer-level method (compactor) scores every kv head in its first call and memoises
          // the layer per backend (`dev` has the same address each time round).
          if (kv == 0 || !m->needs_layer()) {
            EXPECT_GT(dev.calls, 0);
          }
          EXPECT_EQ(last_fallback(), "");
          ++runs;
          identical += check(sel, cpu);
        }
      }
    }
  }
  return {identical, runs};
}

// The score-ranking methods routed through the op (MethodInput::backend) keep the CPU's sets on
// the real sample captures, every layer and kv head: identical indices and weights, scores
// within 1e-9 relative. A kept set may differ only where two scores tie to rounding; none do
// here.
TEST(CudaParity, ScoreRankingMethodsKeepTheCpuSetsOnDevice) {
  REQUIRE_GPU(gpu);
  const std::vector<MethodCase>& cases = ::kvscope::testing::score_ranking_cases();
  const auto [identical, runs] =
      select_on_cpu_and_device(*gpu, cases, 0, [](const Selection& sel, const Selection& cpu) {
        EXPECT_EQ(sel.indices, cpu.indices);
        expect_close(sel.middle_scores, cpu.middle_scores, 1e-9, 1e-300, "middle scores");
        return sel.indices == cpu.indices && sel.weights == cpu.weights;
      });
  std::printf("score-ranking selections on the device: %d of %d identical to the CPU's\n",
              identical, runs);
}

TEST(CudaParity, KeyClustersWithoutRadiiAndBadBatchesLikeCpu) {
  REQUIRE_GPU(gpu);
  ClusterCaseData data(find_cluster_case("odd_d_limit"));
  data.batch.deltas.clear();
  data.run(*gpu);  // nothing to do
  data.batch.deltas = {-1.0};
  EXPECT_THROW(data.run(cpu_backend()), std::invalid_argument);
  EXPECT_THROW(data.run(*gpu), std::invalid_argument);
  data.batch.deltas = {1.0};
  data.batch.t = 0;
  EXPECT_THROW(data.run(cpu_backend()), std::invalid_argument);
  EXPECT_THROW(data.run(*gpu), std::invalid_argument);
}

TEST(CudaParity, CacheScoresBadBatchesLikeCpu) {
  REQUIRE_GPU(gpu);
  CacheScoreCaseData data(find_cache_score_case("log_n_odd_d"));
  std::swap(data.ids[3], data.ids[4]);  // not ascending
  EXPECT_THROW(data.run(cpu_backend()), std::invalid_argument);
  EXPECT_THROW(data.run(*gpu), std::invalid_argument);
  std::swap(data.ids[3], data.ids[4]);
  data.batch.row_end = data.batch.n + 1;
  EXPECT_THROW(data.run(cpu_backend()), std::invalid_argument);
  EXPECT_THROW(data.run(*gpu), std::invalid_argument);
}

TEST(CudaParity, ExpectedScoresBadBatchesLikeCpu) {
  REQUIRE_GPU(gpu);
  ExpectedCaseData data(find_expected_case("two_heads_odd_d"));
  data.batch.heads[1].queries.pop_back();  // unequal groups
  EXPECT_THROW(data.run(cpu_backend()), std::invalid_argument);
  EXPECT_THROW(data.run(*gpu), std::invalid_argument);
  data.batch.heads[1].queries.push_back(data.queries.back().data());
  data.batch.rotation = nullptr;
  EXPECT_THROW(data.run(cpu_backend()), std::invalid_argument);
  EXPECT_THROW(data.run(*gpu), std::invalid_argument);
}

// Expected-attention routed through the op keeps the CPU's sets on the real sample captures,
// every layer and kv head: identical indices and weights, scores within 1e-9 relative.
TEST(CudaParity, ExpectedAttentionKeepsTheCpuSetsOnDevice) {
  REQUIRE_GPU(gpu);
  const std::vector<MethodCase> cases = {
      {"expected-attention", {}},
      {"expected-attention", {{"use_covariance", 0}, {"epsilon", 0.01}}},
      {"adakv(expected-attention)", {}},
  };
  const auto [identical, runs] =
      select_on_cpu_and_device(*gpu, cases, 0, [](const Selection& sel, const Selection& cpu) {
        EXPECT_EQ(sel.indices, cpu.indices);
        expect_close(sel.middle_scores, cpu.middle_scores, 1e-9, 1e-300, "middle scores");
        return sel.indices == cpu.indices && sel.weights == cpu.weights;
      });
  std::printf("expected-attention selections on the device: %d of %d identical to the CPU's\n",
              identical, runs);
}

TEST(CudaParity, ChunkScoresBadBatchesLikeCpu) {
  REQUIRE_GPU(gpu);
  ChunkCaseData data(find_chunk_case("two_heads_exact_chunks"));
  data.batch.heads[1].queries.pop_back();  // unequal groups
  EXPECT_THROW(data.run(cpu_backend()), std::invalid_argument);
  EXPECT_THROW(data.run(*gpu), std::invalid_argument);
  data.batch.heads[1].queries.push_back(data.queries.back().data());
  data.batch.chunk = 0;
  EXPECT_THROW(data.run(cpu_backend()), std::invalid_argument);
  EXPECT_THROW(data.run(*gpu), std::invalid_argument);
}

// Compactor routed through the op keeps the CPU's sets on the real sample captures, every layer
// and kv head (default, and exact leverage with chunks of 50): identical indices and weights,
// scores within 1e-9 relative.
TEST(CudaParity, CompactorKeepsTheCpuSetsOnDevice) {
  REQUIRE_GPU(gpu);
  const std::vector<MethodCase> cases = {
      {"compactor", {}},
      {"compactor", {{"chunk_size", 50}, {"sketch", 1}}},
  };
  const auto [identical, runs] =
      select_on_cpu_and_device(*gpu, cases, 0, [](const Selection& sel, const Selection& cpu) {
        EXPECT_EQ(sel.indices, cpu.indices);
        expect_close(sel.middle_scores, cpu.middle_scores, 1e-9, 1e-300, "middle scores");
        return sel.indices == cpu.indices && sel.weights == cpu.weights;
      });
  std::printf("compactor selections on the device: %d of %d identical to the CPU's\n", identical,
              runs);
}

// SubGen (its clustering, with the bisection's speculative levels on the device) and BUZZ (its
// streamed scores: the default compressed-cache rule, log n, full-prefix with log n) routed
// through the ops keep the CPU's sets on the real sample captures, every layer and kv head:
// identical indices, weights, denominator samples and clusters; scores within 1e-9 relative.
TEST(CudaParity, SubGenAndBuzzKeepTheCpuSetsOnDevice) {
  REQUIRE_GPU(gpu);
  const std::vector<MethodCase> cases = {
      {"subgen", {}},
      {"subgen", {{"t", 4}, {"split", 0.3}}},
      {"buzz", {}},
      {"buzz", {{"window", 8}, {"threshold", 20}, {"top_up", 1}}},
      {"buzz", {{"window", 8}, {"threshold", 20}, {"log_n", 1}}},
      {"buzz", {{"accumulate", 1}, {"window", 8}, {"threshold", 20}, {"log_n", 1}}},
  };
  const auto [identical, runs] =
      select_on_cpu_and_device(*gpu, cases, 3, [](const Selection& sel, const Selection& cpu) {
        const bool same = sel.indices == cpu.indices && sel.weights == cpu.weights &&
                          sel.den_indices == cpu.den_indices &&
                          sel.den_weights == cpu.den_weights && sel.cluster == cpu.cluster;
        EXPECT_TRUE(same) << "device: " << sel.note << "\ncpu: " << cpu.note;
        expect_close(sel.middle_scores, cpu.middle_scores, 1e-9, 1e-300, "middle scores");
        return same;
      });
  std::printf("subgen and buzz selections on the device: %d of %d identical to the CPU's\n",
              identical, runs);
}

// ---------------------------------------------------------------------------------------------
TEST(CudaParity, KcenterRejectsBadInputLikeCpu) {
  REQUIRE_GPU(gpu);
  const KcenterCaseData data(find_kcenter_case("separated"));
  EXPECT_THROW(gpu->kcenter(data.x.data(), data.n, data.d, -1, 0), InputError);
  EXPECT_THROW(gpu->kcenter(data.x.data(), data.n, data.d, 3, data.n), InputError);
}

// ---------------------------------------------------------------------------------------------
// End to end on the real stories260K capture: practical BalanceKV (its walk on the backend) and
// the evaluation (attention errors on the backend) for every layer and kv head.
TEST(CudaParity, BalanceKvRunHeadMatchesCpuOnRealCapture) {
  REQUIRE_GPU(gpu);
  // KVSCOPE_SOURCE_DIR in the environment wins, for binaries built elsewhere (gpu_check.sh).
  const char* root_env = std::getenv("KVSCOPE_SOURCE_DIR");
  const std::string root = root_env && *root_env ? root_env : KVSCOPE_SOURCE_DIR;
  const auto capture = CaptureFile::open(root + "/sample_data/stories260K_lily.safetensors");
  const Method* method = find_method("balancekv");
  ASSERT_NE(method, nullptr);
  MethodSettings settings;
  settings.method = method;
  settings.keep_ratio = 0.25;
  int runs = 0, identical = 0;
  for (int layer = 0; layer < capture->info().num_layers; ++layer) {
    const auto data = capture->layer(layer);
    for (int kv = 0; kv < static_cast<int>(data->keys.size()); ++kv) {
      const HeadRun cpu =
          run_head(*data, capture->info().num_layers, kv, settings, 3, false, &cpu_backend());
      const HeadRun dev = run_head(*data, capture->info().num_layers, kv, settings, 3, false, gpu);
      ++runs;
      if (dev.selection.indices != cpu.selection.indices) continue;  // a rounding-level flip
      ++identical;
      EXPECT_NEAR(dev.mean_relative, cpu.mean_relative, 1e-4 * cpu.mean_relative + 1e-7)
          << "layer " << layer << " kv head " << kv;
      EXPECT_NEAR(dev.mean_mass, cpu.mean_mass, 1e-5) << "layer " << layer << " kv head " << kv;
    }
  }
  // A sign flip needs a uniform within float rounding of p_i; over 20 heads at most one.
  EXPECT_GE(identical, runs - 1) << identical << " of " << runs << " selections identical";
}

}  // namespace
