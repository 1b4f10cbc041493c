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
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
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
#include "engine/ops/cpu_ops.h"
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

TEST(CudaParity, WalkSignsMatchCpu) {
  REQUIRE_GPU(gpu);
  const WalkCaseData w = standard_walk_case();
  std::vector<int8_t> s_cpu, s_gpu;
  std::vector<float> p_cpu, p_gpu, part_cpu, part_gpu;
  for (uint64_t seed : {1ull, 0x9e3779b97f4a7c15ull}) {
    cpu_backend().walk_blocks(w.batch(s_cpu, p_cpu, part_cpu, seed));
    gpu->walk_blocks(w.batch(s_gpu, p_gpu, part_gpu, seed));
    // A sign may only differ where the draw u_i lies within float rounding of the CPU's
    // clip(p_i): there the first difference of a block is allowed, and everything after it in
    // that block follows a different walk. Such draws must stay rare (< 0.1% of rows).
    int flipped_blocks = 0;
    for (size_t b = 0; b + 1 < w.offset.size(); ++b) {
      const int r0 = w.offset[b], r1 = w.offset[b + 1];
      int first_diff = -1;
      for (int i = r0; i < r1; ++i) {
        ASSERT_TRUE(s_gpu[i] == 1 || s_gpu[i] == -1) << "row " << i << " has no sign";
        if (s_gpu[i] != s_cpu[i]) {
          first_diff = i;
          break;
        }
      }
      const int compare_end = first_diff < 0 ? r1 : first_diff;
      if (first_diff >= 0) {
        ++flipped_blocks;
        const double u = counter_uniform(seed, kRandWalk, 3, w.head[b], 1, w.id[b],
                                         static_cast<uint32_t>(first_diff - r0));
        const double clipped = std::clamp(static_cast<double>(p_cpu[first_diff]), 0.0, 1.0);
        EXPECT_LT(std::fabs(u - clipped), 1e-4)
            << "block " << b << " row " << first_diff - r0 << ": sign differs although u = " << u
            << " is far from clip(p) = " << clipped;
      }
      // Up to the first difference, p and the partial sums agree to float accuracy.
      double scale = 1;
      for (int i = r0; i < compare_end; ++i)
        if (std::isfinite(part_cpu[i])) scale = std::max(scale, std::fabs(double(part_cpu[i])));
      for (int i = r0; i < compare_end; ++i) {
        if (!std::isfinite(part_cpu[i])) {  // beyond float range on both backends
          EXPECT_EQ(part_gpu[i], part_cpu[i]) << "block " << b << " row " << i - r0;
          continue;
        }
        EXPECT_NEAR(part_gpu[i], part_cpu[i], 1e-4 * scale) << "block " << b << " row " << i - r0;
        if (std::isfinite(p_cpu[i]))
          EXPECT_NEAR(p_gpu[i], p_cpu[i], 4e-4 * scale) << "block " << b << " row " << i - r0;
        else
          EXPECT_EQ(p_gpu[i], p_cpu[i]) << "block " << b << " row " << i - r0;
      }
    }
    EXPECT_LE(flipped_blocks, std::max(1, w.rows() / 1000)) << "seed " << seed;
  }
}

// The authors' float32 walk (WalkBatch::float32, BalanceKV's default) on the device: the same
// signs as the CPU op except where u_i lies within float rounding of p_i, and the same rows
// overflowed (p NaN, sigma -1) in the block whose exponents leave float range.
TEST(CudaParity, Float32WalkSignsMatchCpu) {
  REQUIRE_GPU(gpu);
  const WalkCaseData w = standard_walk_case();
  std::vector<int8_t> s_cpu, s_gpu;
  std::vector<float> p_cpu, p_gpu, part_cpu, part_gpu;
  for (uint64_t seed : {1ull, 0x9e3779b97f4a7c15ull}) {
    WalkBatch bc = w.batch(s_cpu, p_cpu, part_cpu, seed);
    WalkBatch bg = w.batch(s_gpu, p_gpu, part_gpu, seed);
    bc.float32 = bg.float32 = true;
    bc.value_eps = bg.value_eps = 1e-8;
    cpu_backend().walk_blocks(bc);
    gpu->walk_blocks(bg);
    int flipped_blocks = 0, nan_rows = 0;
    for (size_t b = 0; b + 1 < w.offset.size(); ++b) {
      const int r0 = w.offset[b], r1 = w.offset[b + 1];
      for (int i = r0; i < r1; ++i) {
        ASSERT_TRUE(s_gpu[i] == 1 || s_gpu[i] == -1) << "row " << i << " has no sign";
        ASSERT_EQ(std::isnan(p_gpu[i]), std::isnan(p_cpu[i])) << "block " << b << " row " << i - r0;
        nan_rows += std::isnan(p_cpu[i]);
        if (s_gpu[i] != s_cpu[i]) {
          ++flipped_blocks;
          const double u = counter_uniform(seed, kRandWalk, 3, w.head[b], 1, w.id[b],
                                           static_cast<uint32_t>(i - r0));
          EXPECT_LT(std::fabs(u - static_cast<double>(p_cpu[i])), 1e-4)
              << "block " << b << " row " << i - r0 << ": sign differs far from the draw";
          break;
        }
      }
    }
    EXPECT_GT(nan_rows, 0) << "the large-key block should overflow float32";
    EXPECT_LE(flipped_blocks, std::max(1, w.rows() / 1000)) << "seed " << seed;
  }
}

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

// Double scores (the default) must give the CPU reference's figures to rounding; float scores
// (ErrorBatch::float_scores) to 1e-4.
void check_error_parity(ErrorCaseData c, Backend& gpu) {
  c.run(cpu_backend());
  const auto rel = c.relative, nrm = c.normalized, mass = c.mass;
  c.run(gpu);
  expect_close(c.relative, rel, 1e-9, 1e-12, "relative (double scores)");
  expect_close(c.normalized, nrm, 1e-9, 1e-12, "normalized (double scores)");
  expect_close(c.mass, mass, 1e-9, 1e-12, "mass (double scores)");
  c.batch.float_scores = true;
  c.run(gpu);
  expect_close(c.relative, rel, 1e-4, 1e-7, "relative (float scores)");
  expect_close(c.normalized, nrm, 1e-4, 1e-7, "normalized (float scores)");
  expect_close(c.mass, mass, 1e-5, 1e-7, "mass (float scores)");
}

TEST(CudaParity, AttentionErrorsMatchCpu) {
  REQUIRE_GPU(gpu);
  int checked = 0;
  for (const ErrorCase& e : error_cases()) {
    if (!e.parity) continue;
    SCOPED_TRACE(e.name);
    check_error_parity(ErrorCaseData(e), *gpu);
    ++checked;
  }
  EXPECT_GE(checked, 4);
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

// ---------------------------------------------------------------------------------------------
// The attention-score op: every `parity` case of op_cases.h on the device against the CPU
// reference, scores and stopped sums within 1e-9 relative (both accumulate in double; they differ
// by the order of the dot products and sums only).
TEST(CudaParity, AttentionScoresMatchCpu) {
  REQUIRE_GPU(gpu);
  int checked = 0;
  for (const ScoreCase& c : score_cases()) {
    if (!c.parity) continue;
    SCOPED_TRACE(c.name);
    ScoreCaseData data(c);
    data.run(cpu_backend());
    const auto scores = data.scores, stopped = data.stopped;
    data.run(*gpu);
    EXPECT_EQ(last_fallback(), "") << "the op must run on the device";
    for (size_t h = 0; h < scores.size(); ++h) {
      expect_close(data.scores[h], scores[h], 1e-9, 1e-300, "scores");
      if (c.stops) expect_close(data.stopped[h], stopped[h], 1e-9, 1e-300, "stopped");
    }
    ++checked;
  }
  EXPECT_GE(checked, 5);
}

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

// ---------------------------------------------------------------------------------------------
// SubGen's clustering on the device: the same clusters as the CPU reference for every radius of
// every case (owners, sizes, capacity, early stop), identical. Distances that tie to rounding
// with a radius or with each other could differ; none do in these cases.
TEST(CudaParity, KeyClustersMatchCpu) {
  REQUIRE_GPU(gpu);
  int radii = 0, stopped = 0, several = 0;
  for (const ClusterCase& c : cluster_cases()) {
    if (!c.parity) continue;
    SCOPED_TRACE(c.name);
    ClusterCaseData data(c);
    data.run(cpu_backend());
    const std::vector<KeyClusters> cpu = data.out;
    data.run(*gpu);
    EXPECT_EQ(last_fallback(), "");
    ASSERT_EQ(data.out.size(), cpu.size());
    for (size_t r = 0; r < cpu.size(); ++r) {
      SCOPED_TRACE("radius " + std::to_string(r));
      EXPECT_EQ(data.out[r].owner, cpu[r].owner);
      EXPECT_EQ(data.out[r].size, cpu[r].size);
      EXPECT_EQ(data.out[r].capacity, cpu[r].capacity);
      EXPECT_EQ(data.out[r].over, cpu[r].over);
      ++radii;
      stopped += cpu[r].over;
      several += !cpu[r].over && cpu[r].size.size() > 1 && cpu[r].size.size() < size_t(c.n);
    }
  }
  // The cases exercise early stops and real clusterings (several clusters, fewer than keys).
  EXPECT_GT(stopped, 0);
  EXPECT_GT(several, 0);
  std::printf("key clusters: %d radii compared\n", radii);
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

// BUZZ's streamed scores on the device: every key's accumulated score within 1e-9 relative of
// the CPU reference's, and the segment really adds to them.
TEST(CudaParity, CacheScoresMatchCpu) {
  REQUIRE_GPU(gpu);
  for (const CacheScoreCase& c : cache_score_cases()) {
    if (!c.parity) continue;
    SCOPED_TRACE(c.name);
    CacheScoreCaseData data(c);
    data.run(cpu_backend());
    const std::vector<double> cpu = data.acc;
    data.run(*gpu);
    EXPECT_EQ(last_fallback(), "");
    expect_close(data.acc, cpu, 1e-9, 1e-300, "accumulated scores");
    int grown = 0;
    for (int i : data.ids) grown += cpu[i] > data.acc_start[i];
    EXPECT_EQ(grown, static_cast<int>(data.ids.size())) << "every key is seen by a row";
  }
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

// Expected-attention's scores on the device: every score within 1e-9 relative of the CPU
// reference's. The device sums the logits' dot products, the covariance and the softmax's
// denominator in other orders than Eigen (all in double): the logits differ by ~1e-15, which the
// exponential carries over as a relative difference of the same size.
TEST(CudaParity, ExpectedScoresMatchCpu) {
  REQUIRE_GPU(gpu);
  for (const ExpectedCase& c : expected_cases()) {
    if (!c.parity) continue;
    SCOPED_TRACE(c.name);
    ExpectedCaseData data(c);
    data.run(cpu_backend());
    const std::vector<std::vector<double>> cpu = data.out;
    data.run(*gpu);
    EXPECT_EQ(last_fallback(), "");
    double worst = 0;
    for (int h = 0; h < c.heads; ++h) {
      expect_close(data.out[h], cpu[h], 1e-9, 1e-300, "expected scores");
      for (size_t j = 0; j < cpu[h].size(); ++j) {
        EXPECT_GT(cpu[h][j], 0.0) << "every score is a positive probability";
        worst = std::max(worst, std::abs(data.out[h][j] - cpu[h][j]) / std::abs(cpu[h][j]));
      }
    }
    std::printf("expected scores %s: worst relative difference %.2g\n", c.name, worst);
  }
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

// Compactor's chunked attention on the device: every column sum within 1e-9 relative of the CPU
// reference's (the logits' dot products and the softmax's denominators are summed in other
// orders than Eigen's, in double).
TEST(CudaParity, ChunkScoresMatchCpu) {
  REQUIRE_GPU(gpu);
  for (const ChunkCase& c : chunk_cases()) {
    if (!c.parity) continue;
    SCOPED_TRACE(c.name);
    ChunkCaseData data(c);
    data.run(cpu_backend());
    const std::vector<std::vector<double>> cpu = data.col;
    data.run(*gpu);
    EXPECT_EQ(last_fallback(), "");
    double worst = 0;
    for (int h = 0; h < c.heads; ++h) {
      expect_close(data.col[h], cpu[h], 1e-9, 1e-300, "column sums");
      for (size_t j = 0; j < cpu[h].size(); ++j) {
        EXPECT_GT(cpu[h][j], 0.0);
        worst = std::max(worst, std::abs(data.col[h][j] - cpu[h][j]) / std::abs(cpu[h][j]));
      }
    }
    std::printf("chunk scores %s: worst relative difference %.2g\n", c.name, worst);
  }
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
TEST(CudaParity, TsneGradientMatchesCpu) {
  REQUIRE_GPU(gpu);
  for (const TsneCase& t : tsne_cases()) {
    if (!t.parity) continue;
    SCOPED_TRACE(t.name);
    const TsneCaseData data(t);
    const TsneGradInput& in = data.in;
    const int n = in.n;
    std::vector<float> g_cpu(2 * n), g_gpu(2 * n);
    const double kl_cpu = cpu_backend().tsne_gradient(in, g_cpu.data());
    const double kl_gpu = gpu->tsne_gradient(in, g_gpu.data());
    double scale = 0;
    for (float g : g_cpu) scale = std::max(scale, std::fabs(double(g)));
    for (int i = 0; i < 2 * n; ++i) EXPECT_NEAR(g_gpu[i], g_cpu[i], 1e-4 * scale) << i;
    EXPECT_NEAR(kl_gpu, kl_cpu, 1e-6 * std::fabs(kl_cpu) + 1e-9);
  }
}

// ---------------------------------------------------------------------------------------------
TEST(CudaParity, KcenterPicksMatchCpuOnSeparatedData) {
  REQUIRE_GPU(gpu);
  const KcenterCase& kc = find_kcenter_case("separated");
  const KcenterCaseData data(kc);
  const std::vector<float>& x = data.x;
  const int clusters = kc.clusters, n = data.n, d = data.d;
  for (int k : {1, clusters, 3 * clusters}) {
    const std::vector<int> cpu = cpu_backend().kcenter(x.data(), n, d, k, 5);
    const std::vector<int> gpu_picks = gpu->kcenter(x.data(), n, d, k, 5);
    EXPECT_EQ(gpu_picks, cpu) << "k = " << k;
  }
  // k beyond n picks every row once, like the CPU.
  std::vector<int> all = gpu->kcenter(x.data(), 30, d, 50, 0);
  EXPECT_EQ(all, cpu_backend().kcenter(x.data(), 30, d, 50, 0));
  EXPECT_THROW(gpu->kcenter(x.data(), n, d, -1, 0), InputError);
  EXPECT_THROW(gpu->kcenter(x.data(), n, d, 3, n), InputError);
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
