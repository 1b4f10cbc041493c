// GPU benchmarks for the CUDA backend (docs/performance.md targets), with the CPU reference on
// the same inputs where that runs in reasonable time, so the GPU/CPU ratio can be read off:
//   walk:   one layer, 32 heads x 32768 tokens, d = dv = 128, B = 128, two rounds (< 2 ms on H100)
//           and one head of 32768 tokens on both backends (ratio)
//   errors: 256 evaluation queries over all 32 query heads (8 kv heads) of a layer (< 1 ms), at
//           n = 8192 and 32768, and one head on both backends (ratio)
//   t-SNE:  exact gradient of 32768 points (1000 iterations < 1 s means < 1 ms each), and 8192
//           points on both backends (ratio)
//   k-center: 32768 keys x 128 dims, 256 centres, both backends
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

#include "engine/backend.h"
#include "engine/cpu_ops.h"

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

// Fast deterministic fill (a 1 GiB layer with std::normal_distribution takes too long): a
// splitmix64 hash of the index, mapped to a symmetric uniform in [-amp, amp].
void fill(std::vector<float>& v, float amp, uint64_t seed) {
  for (size_t i = 0; i < v.size(); ++i) {
    uint64_t z = seed + 0x9E3779B97F4A7C15ull * (i + 1);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    v[i] = amp * (static_cast<float>(z >> 40) * (2.0f / 16777216.0f) - 1.0f);
  }
}

// ---- walk ----------------------------------------------------------------------------------

constexpr int kHeads = 32, kTokens = 32768, kDim = 128, kBlock = 128;

struct WalkData {
  int heads = 0, tokens = 0;
  std::vector<float> keys, values;
  std::vector<int> offset;
  std::vector<uint32_t> head, id;
  std::vector<int8_t> sigma;

  WalkData(int heads_, int tokens_) : heads(heads_), tokens(tokens_) {
    const size_t rows = static_cast<size_t>(heads) * tokens;
    keys.resize(rows * kDim);
    values.resize(rows * kDim);
    // Key entries in [-0.6, 0.6]: <k_i,k_j>/sqrt(d) of order 1, as centred real keys are; values
    // small enough that p_i is not always clipped.
    fill(keys, 0.6f, 1);
    fill(values, 0.1f, 2);
    for (int h = 0; h < heads; ++h)
      for (int b = 0; b < tokens / kBlock; ++b) {
        offset.push_back((h * tokens) + b * kBlock);
        head.push_back(static_cast<uint32_t>(h));
        id.push_back(static_cast<uint32_t>(b));
      }
    offset.push_back(static_cast<int>(rows));
    sigma.resize(rows);
  }

  // Round r (0-based) walks the first tokens / 2^r tokens of every head (the kept tokens of the
  // previous round are contiguous after the method's gather).
  // `authors`: the authors' float32 semantics (BalanceKV's default); false: KVScope's double walk
  // (preset kvscope-v1).
  WalkBatch batch(int round, bool authors = true) {
    WalkBatch b;
    b.float32 = authors;
    b.value_eps = authors ? 1e-8 : 0.0;
    b.d = kDim;
    b.dv = kDim;
    const int blocks_per_head = (tokens >> round) / kBlock;
    // Blocks of round r: the first blocks_per_head blocks of each head, re-based contiguously.
    round_offset.clear();
    round_head.clear();
    round_id.clear();
    round_keys_begin = keys.data();
    round_values_begin = values.data();
    for (int h = 0; h < heads; ++h)
      for (int k = 0; k < blocks_per_head; ++k) {
        round_offset.push_back((h * blocks_per_head + k) * kBlock);
        round_head.push_back(static_cast<uint32_t>(h));
        round_id.push_back(static_cast<uint32_t>(k));
      }
    round_offset.push_back(heads * blocks_per_head * kBlock);
    b.num_blocks = heads * blocks_per_head;
    b.keys = round_keys_begin;
    b.values = round_values_begin;
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
  const float* round_keys_begin = nullptr;
  const float* round_values_begin = nullptr;
};

[[maybe_unused]] WalkData& layer_data() {
  static WalkData data(kHeads, kTokens);
  return data;
}
WalkData& head_data() {
  static WalkData data(1, kTokens);
  return data;
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

// One layer, two rounds: round 1 over 32 x 32768 tokens, round 2 over the 32 x 16384 kept.
// Arg 1: the authors' float32 walk (the default); 0: the double walk of preset kvscope-v1.
void BM_GpuWalkLayerTwoRounds(benchmark::State& state) {
  const bool authors = state.range(0) != 0;
  run_gpu(state, [authors] {
    std::vector<std::unique_ptr<GpuOpTimer>> t;
#ifdef KVSCOPE_HAVE_CUDA
    t.push_back(cuda_walk_timer(layer_data().batch(0, authors)));
    t.push_back(cuda_walk_timer(layer_data().batch(1, authors)));
#else
    (void)authors;
#endif
    return t;
  });
  state.counters["tokens"] = kHeads * kTokens;
}

void BM_GpuWalkLayerRound(benchmark::State& state) {
  const int round = static_cast<int>(state.range(0));
  run_gpu(state, [round] {
    std::vector<std::unique_ptr<GpuOpTimer>> t;
#ifdef KVSCOPE_HAVE_CUDA
    t.push_back(cuda_walk_timer(layer_data().batch(round)));
#endif
    return t;
  });
}

void BM_GpuWalkHead(benchmark::State& state) {
  run_gpu(state, [] {
    std::vector<std::unique_ptr<GpuOpTimer>> t;
#ifdef KVSCOPE_HAVE_CUDA
    t.push_back(cuda_walk_timer(head_data().batch(0)));
    t.push_back(cuda_walk_timer(head_data().batch(1)));
#endif
    return t;
  });
}

// The CPU reference on the same single head (two rounds), for the GPU/CPU ratio.
void BM_CpuWalkHead(benchmark::State& state) {
  WalkData& data = head_data();
  for (auto _ : state) {
    cpu_walk_blocks(data.batch(0));
    cpu_walk_blocks(data.batch(1));
    benchmark::DoNotOptimize(data.sigma.data());
  }
}

// ---- attention errors ----------------------------------------------------------------------

struct ErrorData {
  std::vector<std::vector<float>> keys, values;
  std::vector<float> queries;  // one buffer shared by all query heads (timing only)
  ErrorBatch batch;
  std::vector<double> rel, nrm, mass;

  ErrorData(int n, int q_heads, int kv_heads) {
    const int E = 256, s = std::min(256, n / 32);
    keys.resize(kv_heads);
    values.resize(kv_heads);
    for (int h = 0; h < kv_heads; ++h) {
      keys[h].resize(static_cast<size_t>(n) * kDim);
      values[h].resize(static_cast<size_t>(n) * kDim);
      fill(keys[h], 1.0f, 10 + h);
      fill(values[h], 1.0f, 100 + h);
    }
    queries.resize(static_cast<size_t>(n) * kDim);
    fill(queries, 1.0f, 7);
    batch.n = n;
    batch.d = kDim;
    batch.dv = kDim;
    batch.q_heads = q_heads;
    batch.kv_heads = kv_heads;
    batch.sink = s;
    batch.eval = E;
    for (int h = 0; h < kv_heads; ++h) {
      batch.keys.push_back(keys[h].data());
      batch.values.push_back(values[h].data());
      std::vector<int> idx;  // every other middle token at weight 2 (keep ratio 1/2)
      for (int i = s; i < n - E; i += 2) idx.push_back(i);
      batch.num_idx.push_back(idx);
      batch.num_logw.push_back(std::vector<float>(idx.size(), std::log(2.0f)));
      batch.den_idx.push_back(idx);
      batch.den_logw.push_back(batch.num_logw.back());
    }
    for (int h = 0; h < q_heads; ++h) batch.queries.push_back(queries.data());
    rel.resize(static_cast<size_t>(q_heads) * E);
    nrm.resize(rel.size());
    mass.resize(rel.size());
    batch.relative = rel.data();
    batch.normalized = nrm.data();
    batch.mass = mass.data();
  }
};

// Arg 1: 0 = double scores (the default, the CPU's figures to rounding), 1 = float scores.
void BM_GpuErrorsLayer(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  const bool float_scores = state.range(1) != 0;
  run_gpu(state, [n, float_scores] {
    std::vector<std::unique_ptr<GpuOpTimer>> t;
#ifdef KVSCOPE_HAVE_CUDA
    ErrorData data(n, 32, 8);
    data.batch.float_scores = float_scores;
    t.push_back(cuda_error_timer(data.batch));
#else
    (void)n;
    (void)float_scores;
#endif
    return t;
  });
}

// The host-to-device copy of one layer's keys and values (8 kv heads x n x 128, both), from
// pageable memory: reported apart from the device-resident op timings.
void BM_GpuUploadLayer(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  static std::vector<float> host;
  host.assign(static_cast<size_t>(8) * n * kDim * 2, 0.5f);
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

void BM_GpuErrorsHead(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  run_gpu(state, [n] {
    std::vector<std::unique_ptr<GpuOpTimer>> t;
#ifdef KVSCOPE_HAVE_CUDA
    ErrorData data(n, 1, 1);
    t.push_back(cuda_error_timer(data.batch));
#else
    (void)n;
#endif
    return t;
  });
}

void BM_CpuErrorsHead(benchmark::State& state) {
  ErrorData data(static_cast<int>(state.range(0)), 1, 1);
  for (auto _ : state) {
    cpu_attention_errors(data.batch);
    benchmark::DoNotOptimize(data.rel.data());
  }
}

// ---- t-SNE gradient ------------------------------------------------------------------------

struct TsneData {
  std::vector<float> y, val, grad;
  std::vector<int> rowptr{0}, col;
  TsneGradInput in;
  explicit TsneData(int n) {
    y.resize(2 * static_cast<size_t>(n));
    fill(y, 30.0f, 5);
    // 90 neighbours per point (3 x perplexity 30, as the affinity step produces), symmetric.
    const int half = 45;
    for (int i = 0; i < n; ++i) {
      for (int o = 1; o <= half; ++o) {
        col.push_back((i + o) % n);
        col.push_back((i - o + n) % n);
      }
      rowptr.push_back(static_cast<int>(col.size()));
    }
    val.assign(col.size(), 1.0f / static_cast<float>(col.size()));
    grad.resize(2 * static_cast<size_t>(n));
    in.n = n;
    in.y = y.data();
    in.p_rowptr = rowptr.data();
    in.p_col = col.data();
    in.p_val = val.data();
    in.exaggeration = 12;
    in.theta = 0;
  }
};

void BM_GpuTsneGradient(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  run_gpu(state, [n] {
    std::vector<std::unique_ptr<GpuOpTimer>> t;
#ifdef KVSCOPE_HAVE_CUDA
    TsneData data(n);
    t.push_back(cuda_tsne_timer(data.in));
#else
    (void)n;
#endif
    return t;
  });
}

void BM_CpuTsneGradientExact(benchmark::State& state) {
  TsneData data(static_cast<int>(state.range(0)));
  for (auto _ : state) benchmark::DoNotOptimize(cpu_tsne_gradient(data.in, data.grad.data()));
}

// ---- k-center ------------------------------------------------------------------------------

constexpr int kKcPoints = 32768, kKcCentres = 256;

std::vector<float>& kcenter_points() {
  static std::vector<float> x = [] {
    std::vector<float> v(static_cast<size_t>(kKcPoints) * kDim);
    fill(v, 1.0f, 9);
    return v;
  }();
  return x;
}

void BM_GpuKcenter(benchmark::State& state) {
  run_gpu(state, [] {
    std::vector<std::unique_ptr<GpuOpTimer>> t;
#ifdef KVSCOPE_HAVE_CUDA
    t.push_back(cuda_kcenter_timer(kcenter_points().data(), kKcPoints, kDim, kKcCentres, 0));
#endif
    return t;
  });
}

void BM_CpuKcenter(benchmark::State& state) {
  const std::vector<float>& x = kcenter_points();
  for (auto _ : state)
    benchmark::DoNotOptimize(cpu_kcenter(x.data(), kKcPoints, kDim, kKcCentres, 0));
}

}  // namespace

BENCHMARK(BM_GpuWalkLayerTwoRounds)->Arg(1)->Arg(0)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_GpuWalkLayerRound)->Arg(0)->Arg(1)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_GpuWalkHead)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_CpuWalkHead)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_GpuErrorsLayer)
    ->Args({8192, 0})
    ->Args({32768, 0})
    ->Args({8192, 1})
    ->Args({32768, 1})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_GpuUploadLayer)->Arg(8192)->Arg(32768)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_GpuErrorsHead)->Arg(8192)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_CpuErrorsHead)->Arg(8192)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_GpuTsneGradient)
    ->Arg(8192)
    ->Arg(32768)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_CpuTsneGradientExact)->Arg(8192)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_GpuKcenter)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_CpuKcenter)->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
