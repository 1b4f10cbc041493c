// GPU benchmarks for the CUDA backend (docs/performance.md targets), with the CPU reference on
// the same inputs where that runs in reasonable time, so the GPU/CPU ratio can be read off. The
// inputs are the cases of tests/op_cases.h marked `bench` (the table the parity tests use):
//   walk:   one layer, 32 heads x 32768 tokens, d = dv = 128, B = 128, two rounds (< 2 ms on H100)
//           and one head of 32768 tokens on both backends (ratio)
//   errors: 256 evaluation queries over all 32 query heads (8 kv heads) of a layer (< 1 ms), at
//           n = 8192 and 32768, and one head on both backends (ratio)
//   t-SNE:  exact gradient of 32768 points (1000 iterations < 1 s means < 1 ms each), and 8192
//           points on both backends (ratio)
//   k-center: 32768 keys x 128 dims, 256 centres, both backends
//   scores: the attention-score op of the score-ranking methods over a layer's 8 kv heads
//           (groups of 4): H2O's every middle row at n = 8192, SnapKV's 32-row window at 32768
//   clusters: one SubGen batch (31 radii) over a head's 8192 middle keys, both backends
//   cache scores: one BUZZ segment (240 rows over 564 cached keys) at n = 8192, both backends
// GPU timings are device-resident: inputs are uploaded once, each iteration replays only the
// kernels and is timed with CUDA events (UseManualTime). Host<->device copies are not included;
// the app pays them once per capture/layer. Without a device every GPU benchmark reports
// "no CUDA device: <why>" and is skipped.
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/ops/backend.h"
#include "tests/op_cases.h"

#ifdef KVSCOPE_HAVE_CUDA
#include "kernels/cuda_backend.h"
#else
namespace kvscope {
// Stand-in so the GPU benchmarks compile (and report "no CUDA device") in builds without nvcc.
class GpuOpTimer {
 public:
  virtual ~GpuOpTimer() = default;
  virtual double run_ms() = 0;
};
}  // namespace kvscope
#endif

using namespace kvscope;

namespace {

// ---- walk ----------------------------------------------------------------------------------

// A walk case's rows with the batches of the method's rounds.
struct WalkData {
  WalkCaseData rows;
  int heads = 0, tokens = 0, block = 0;
  std::vector<int8_t> sigma;

  explicit WalkData(const WalkCase& c) : rows(c) {
    const WalkBlocks& g = c.groups.front();
    heads = g.heads;
    block = g.len;
    tokens = g.blocks * g.len;
    sigma.resize(rows.rows());
  }

  // Round r (0-based) walks the first tokens / 2^r tokens of every head (the kept tokens of the
  // previous round are contiguous after the method's gather).
  // `authors`: the authors' float32 semantics (BalanceKV's default); false: KVScope's double walk
  // (preset kvscope-v1).
  WalkBatch batch(int round, bool authors = true) {
    WalkBatch b;
    b.float32 = authors;
    b.value_eps = authors ? 1e-8 : 0.0;
    b.d = rows.d;
    b.dv = rows.dv;
    const int blocks_per_head = (tokens >> round) / block;
    // Blocks of round r: the first blocks_per_head blocks of each head, re-based contiguously.
    round_offset.clear();
    round_head.clear();
    round_id.clear();
    for (int h = 0; h < heads; ++h)
      for (int k = 0; k < blocks_per_head; ++k) {
        round_offset.push_back((h * blocks_per_head + k) * block);
        round_head.push_back(static_cast<uint32_t>(h));
        round_id.push_back(static_cast<uint32_t>(k));
      }
    round_offset.push_back(heads * blocks_per_head * block);
    b.num_blocks = heads * blocks_per_head;
    b.keys = rows.keys.data();
    b.values = rows.values.data();
    b.block_offset = round_offset.data();
    b.block_head = round_head.data();
    b.block_id = round_id.data();
    b.seed = 42;
    b.layer = 0;
    b.round = static_cast<uint32_t>(round);
    b.sigma = sigma.data();
    return b;
  }
  std::vector<int> round_offset;
  std::vector<uint32_t> round_head, round_id;
};

// Built once per case (a layer is 1 GiB).
WalkData& walk_data(const WalkCase& c) {
  static std::vector<std::unique_ptr<WalkData>> made(walk_cases().size());
  const size_t i = static_cast<size_t>(&c - walk_cases().data());
  if (!made[i]) made[i] = std::make_unique<WalkData>(c);
  return *made[i];
}

#ifdef KVSCOPE_HAVE_CUDA
bool require_gpu(benchmark::State& state) {
  std::string why;
  if (cuda_available(&why)) return true;
  state.SkipWithError(("no CUDA device: " + why).c_str());
  return false;
}

template <typename MakeTimers>
void run_gpu(benchmark::State& state, MakeTimers make) {
  if (!require_gpu(state)) return;
  std::vector<std::unique_ptr<GpuOpTimer>> timers;
  try {
    timers = make();
    for (auto& t : timers) t->run_ms();  // warm-up (module load, clocks)
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
    return;
  }
  for (auto _ : state) {
    double ms = 0;
    for (auto& t : timers) ms += t->run_ms();
    state.SetIterationTime(ms / 1e3);
  }
}
#else
template <typename MakeTimers>
void run_gpu(benchmark::State& state, MakeTimers) {
  state.SkipWithError("no CUDA device: this build has no CUDA kernels (nvcc was not found)");
}
#endif

// Two rounds: round 1 over every head's tokens, round 2 over the half kept.
// authors: the authors' float32 walk (the default); false: the double walk of preset kvscope-v1.
void gpu_walk_two_rounds(benchmark::State& state, const WalkCase* c, bool authors) {
  run_gpu(state, [c, authors] {
    std::vector<std::unique_ptr<GpuOpTimer>> t;
#ifdef KVSCOPE_HAVE_CUDA
    t.push_back(cuda_walk_timer(walk_data(*c).batch(0, authors)));
    t.push_back(cuda_walk_timer(walk_data(*c).batch(1, authors)));
#else
    (void)c;
    (void)authors;
#endif
    return t;
  });
  state.counters["tokens"] = static_cast<double>(walk_data(*c).rows.rows());
}

void gpu_walk_round(benchmark::State& state, const WalkCase* c, int round) {
  run_gpu(state, [c, round] {
    std::vector<std::unique_ptr<GpuOpTimer>> t;
#ifdef KVSCOPE_HAVE_CUDA
    t.push_back(cuda_walk_timer(walk_data(*c).batch(round)));
#else
    (void)c;
    (void)round;
#endif
    return t;
  });
}

// The CPU reference on the same rows (two rounds), for the GPU/CPU ratio.
void cpu_walk_two_rounds(benchmark::State& state, const WalkCase* c) {
  WalkData& data = walk_data(*c);
  for (auto _ : state) {
    cpu_walk_blocks(data.batch(0));
    cpu_walk_blocks(data.batch(1));
    benchmark::DoNotOptimize(data.sigma.data());
  }
}

// ---- attention errors ----------------------------------------------------------------------

// float_scores: false = double scores (the default, the CPU's figures to rounding), true = float.
// exact_kept: the approximate side alone (the exact side kept from an earlier call, as over a
// resident layer); else both sides, as a first call.
void gpu_errors(benchmark::State& state, const ErrorCase* c, bool float_scores, bool exact_kept) {
  run_gpu(state, [c, float_scores, exact_kept] {
    std::vector<std::unique_ptr<GpuOpTimer>> t;
#ifdef KVSCOPE_HAVE_CUDA
    ErrorCaseData data(*c);
    data.prepare_outputs();
    data.batch.float_scores = float_scores;
    t.push_back(cuda_error_timer(data.batch, exact_kept));
#else
    (void)c;
    (void)float_scores;
    (void)exact_kept;
#endif
    return t;
  });
}

void cpu_errors(benchmark::State& state, const ErrorCase* c) {
  ErrorCaseData data(*c);
  data.prepare_outputs();
  for (auto _ : state) {
    cpu_attention_errors(data.batch);
    benchmark::DoNotOptimize(data.relative.data());
  }
}

// The host-to-device copy of one layer's keys and values (kv heads x n x d, both), from pageable
// memory: reported apart from the device-resident op timings.
void gpu_upload_layer(benchmark::State& state, const ErrorCase* c) {
  static std::vector<float> host;
  host.assign(static_cast<size_t>(c->kv_heads) * c->n * (c->d + c->dv), 0.5f);
  run_gpu(state, [] {
    std::vector<std::unique_ptr<GpuOpTimer>> t;
#ifdef KVSCOPE_HAVE_CUDA
    t.push_back(cuda_upload_timer(host.data(), host.size() * sizeof(float)));
#endif
    return t;
  });
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) *
                          static_cast<int64_t>(host.size() * sizeof(float)));
}

// ---- t-SNE gradient ------------------------------------------------------------------------

void gpu_tsne(benchmark::State& state, const TsneCase* c) {
  run_gpu(state, [c] {
    std::vector<std::unique_ptr<GpuOpTimer>> t;
#ifdef KVSCOPE_HAVE_CUDA
    TsneCaseData data(*c);
    t.push_back(cuda_tsne_timer(data.in));
#else
    (void)c;
#endif
    return t;
  });
}

void cpu_tsne_exact(benchmark::State& state, const TsneCase* c) {
  TsneCaseData data(*c);
  std::vector<float> grad(2 * static_cast<size_t>(c->n));
  for (auto _ : state) benchmark::DoNotOptimize(cpu_tsne_gradient(data.in, grad.data()));
}

// ---- k-center ------------------------------------------------------------------------------

void gpu_kcenter(benchmark::State& state, const KcenterCase* c) {
  run_gpu(state, [c] {
    std::vector<std::unique_ptr<GpuOpTimer>> t;
#ifdef KVSCOPE_HAVE_CUDA
    const KcenterCaseData data(*c);
    t.push_back(cuda_kcenter_timer(data.x.data(), data.n, data.d, c->k, 0));
#else
    (void)c;
#endif
    return t;
  });
}

void cpu_kcenter_bench(benchmark::State& state, const KcenterCase* c) {
  const KcenterCaseData data(*c);
  for (auto _ : state)
    benchmark::DoNotOptimize(cpu_kcenter(data.x.data(), data.n, data.d, c->k, 0));
}

// ---- attention scores ----------------------------------------------------------------------

void gpu_scores(benchmark::State& state, const ScoreCase* c) {
  run_gpu(state, [c] {
    std::vector<std::unique_ptr<GpuOpTimer>> t;
#ifdef KVSCOPE_HAVE_CUDA
    ScoreCaseData data(*c);
    t.push_back(cuda_score_timer(data.batch));
#else
    (void)c;
#endif
    return t;
  });
}

void cpu_scores(benchmark::State& state, const ScoreCase* c) {
  ScoreCaseData data(*c);
  for (auto _ : state) {
    data.run(cpu_backend());
    benchmark::DoNotOptimize(data.scores.data());
  }
}

// ---- key clusters and cache scores ------------------------------------------------------------

void gpu_clusters(benchmark::State& state, const ClusterCase* c) {
  run_gpu(state, [c] {
    std::vector<std::unique_ptr<GpuOpTimer>> t;
#ifdef KVSCOPE_HAVE_CUDA
    ClusterCaseData data(*c);
    // The upload checks that the batch has outputs; the timed kernel never downloads into them.
    data.out.assign(data.batch.deltas.size(), KeyClusters{});
    data.batch.out = data.out.data();
    t.push_back(cuda_cluster_timer(data.batch));
#else
    (void)c;
#endif
    return t;
  });
}

void cpu_clusters(benchmark::State& state, const ClusterCase* c) {
  ClusterCaseData data(*c);
  for (auto _ : state) {
    data.run(cpu_backend());
    benchmark::DoNotOptimize(data.out.data());
  }
}

void gpu_cache_scores(benchmark::State& state, const CacheScoreCase* c) {
  run_gpu(state, [c] {
    std::vector<std::unique_ptr<GpuOpTimer>> t;
#ifdef KVSCOPE_HAVE_CUDA
    CacheScoreCaseData data(*c);
    data.acc = data.acc_start;
    data.batch.acc = data.acc.data();
    t.push_back(cuda_cache_score_timer(data.batch));
#else
    (void)c;
#endif
    return t;
  });
}

void cpu_cache_scores_bench(benchmark::State& state, const CacheScoreCase* c) {
  CacheScoreCaseData data(*c);
  for (auto _ : state) {
    data.run(cpu_backend());
    benchmark::DoNotOptimize(data.acc.data());
  }
}

void gpu_expected(benchmark::State& state, const ExpectedCase* c) {
  run_gpu(state, [c] {
    std::vector<std::unique_ptr<GpuOpTimer>> t;
#ifdef KVSCOPE_HAVE_CUDA
    ExpectedCaseData data(*c);
    t.push_back(cuda_expected_timer(data.batch));
#else
    (void)c;
#endif
    return t;
  });
}

void cpu_expected(benchmark::State& state, const ExpectedCase* c) {
  ExpectedCaseData data(*c);
  for (auto _ : state) {
    data.run(cpu_backend());
    benchmark::DoNotOptimize(data.out.data());
  }
}

void gpu_chunks(benchmark::State& state, const ChunkCase* c) {
  run_gpu(state, [c] {
    std::vector<std::unique_ptr<GpuOpTimer>> t;
#ifdef KVSCOPE_HAVE_CUDA
    ChunkCaseData data(*c);
    t.push_back(cuda_chunk_timer(data.batch));
#else
    (void)c;
#endif
    return t;
  });
}

void cpu_chunks(benchmark::State& state, const ChunkCase* c) {
  ChunkCaseData data(*c);
  for (auto _ : state) {
    data.run(cpu_backend());
    benchmark::DoNotOptimize(data.col.data());
  }
}

// Every `bench` case of the table, on the GPU (device-resident, manual time) and, where the CPU
// takes seconds rather than minutes (one head, 8192 points, the k-center case), on the CPU.
void register_cases() {
  using benchmark::kMillisecond;
  for (const WalkCase& c : walk_cases()) {
    if (!c.bench) continue;
    const std::string n = c.name;
    const bool layer = c.groups.front().heads > 1;
    for (bool authors : {true, false}) {
      if (!layer && !authors) continue;
      benchmark::RegisterBenchmark(
          ("BM_GpuWalkTwoRounds/" + n + (authors ? "/f32" : "/f64")).c_str(), gpu_walk_two_rounds,
          &c, authors)
          ->UseManualTime()
          ->Unit(kMillisecond);
    }
    if (layer) {
      for (int round : {0, 1})
        benchmark::RegisterBenchmark(("BM_GpuWalkRound/" + n + "/" + std::to_string(round)).c_str(),
                                     gpu_walk_round, &c, round)
            ->UseManualTime()
            ->Unit(kMillisecond);
    } else {
      benchmark::RegisterBenchmark(("BM_CpuWalkTwoRounds/" + n).c_str(), cpu_walk_two_rounds, &c)
          ->Unit(kMillisecond);
    }
  }
  for (const ErrorCase& c : error_cases()) {
    if (!c.bench) continue;
    const std::string n = c.name;
    for (bool fs : {false, true}) {
      if (c.q_heads == 1 && fs) continue;
      benchmark::RegisterBenchmark(("BM_GpuErrors/" + n + (fs ? "/float" : "/double")).c_str(),
                                   gpu_errors, &c, fs, false)
          ->UseManualTime()
          ->Unit(kMillisecond);
    }
    benchmark::RegisterBenchmark(("BM_GpuErrorsExactKept/" + n + "/double").c_str(), gpu_errors, &c,
                                 false, true)
        ->UseManualTime()
        ->Unit(kMillisecond);
    if (c.q_heads > 1)
      benchmark::RegisterBenchmark(("BM_GpuUploadLayer/" + n).c_str(), gpu_upload_layer, &c)
          ->UseManualTime()
          ->Unit(kMillisecond);
    else
      benchmark::RegisterBenchmark(("BM_CpuErrors/" + n).c_str(), cpu_errors, &c)
          ->Unit(kMillisecond);
  }
  for (const TsneCase& c : tsne_cases()) {
    if (!c.bench) continue;
    const std::string n = c.name;
    benchmark::RegisterBenchmark(("BM_GpuTsneGradient/" + n).c_str(), gpu_tsne, &c)
        ->UseManualTime()
        ->Unit(kMillisecond);
    if (c.n <= 8192)
      benchmark::RegisterBenchmark(("BM_CpuTsneGradientExact/" + n).c_str(), cpu_tsne_exact, &c)
          ->Unit(kMillisecond);
  }
  for (const KcenterCase& c : kcenter_cases()) {
    if (!c.bench) continue;
    const std::string n = c.name;
    benchmark::RegisterBenchmark(("BM_GpuKcenter/" + n).c_str(), gpu_kcenter, &c)
        ->UseManualTime()
        ->Unit(kMillisecond);
    benchmark::RegisterBenchmark(("BM_CpuKcenter/" + n).c_str(), cpu_kcenter_bench, &c)
        ->Unit(kMillisecond);
  }
  for (const ScoreCase& c : score_cases()) {
    if (!c.bench) continue;
    const std::string n = c.name;
    benchmark::RegisterBenchmark(("BM_GpuScores/" + n).c_str(), gpu_scores, &c)
        ->UseManualTime()
        ->Unit(kMillisecond);
    benchmark::RegisterBenchmark(("BM_CpuScores/" + n).c_str(), cpu_scores, &c)->Unit(kMillisecond);
  }
  for (const ClusterCase& c : cluster_cases()) {
    if (!c.bench) continue;
    const std::string n = c.name;
    benchmark::RegisterBenchmark(("BM_GpuClusters/" + n).c_str(), gpu_clusters, &c)
        ->UseManualTime()
        ->Unit(kMillisecond);
    benchmark::RegisterBenchmark(("BM_CpuClusters/" + n).c_str(), cpu_clusters, &c)
        ->Unit(kMillisecond);
  }
  for (const CacheScoreCase& c : cache_score_cases()) {
    if (!c.bench) continue;
    const std::string n = c.name;
    benchmark::RegisterBenchmark(("BM_GpuCacheScores/" + n).c_str(), gpu_cache_scores, &c)
        ->UseManualTime()
        ->Unit(kMillisecond);
    benchmark::RegisterBenchmark(("BM_CpuCacheScores/" + n).c_str(), cpu_cache_scores_bench, &c)
        ->Unit(kMillisecond);
  }
  for (const ExpectedCase& c : expected_cases()) {
    if (!c.bench) continue;
    const std::string n = c.name;
    benchmark::RegisterBenchmark(("BM_GpuExpected/" + n).c_str(), gpu_expected, &c)
        ->UseManualTime()
        ->Unit(kMillisecond);
    benchmark::RegisterBenchmark(("BM_CpuExpected/" + n).c_str(), cpu_expected, &c)
        ->Unit(kMillisecond);
  }
  for (const ChunkCase& c : chunk_cases()) {
    if (!c.bench) continue;
    const std::string n = c.name;
    benchmark::RegisterBenchmark(("BM_GpuChunks/" + n).c_str(), gpu_chunks, &c)
        ->UseManualTime()
        ->Unit(kMillisecond);
    benchmark::RegisterBenchmark(("BM_CpuChunks/" + n).c_str(), cpu_chunks, &c)->Unit(kMillisecond);
  }
}

}  // namespace

int main(int argc, char** argv) {
  register_cases();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
