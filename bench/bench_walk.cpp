// Practical BalanceKV walk timings (docs/performance.md: one head, n = 8192, d = 128, B = 128,
// two rounds, under 30 ms on one CPU core). The backend comes from the environment variable
// KVSCOPE_BENCH_BACKEND (cpu | cuda | auto; default cpu), so the same binary times the CUDA
// kernels where they are built and a device answers.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "engine/core/simd.h"
#include "engine/methods/balancekv/balance_walk.h"
#include "engine/ops/backend.h"

using namespace kvscope;

namespace {

Backend& bench_backend() {
  const char* env = std::getenv("KVSCOPE_BENCH_BACKEND");
  static Backend& b = select_backend(env && *env ? env : "cpu");
  return b;
}

struct Head {
  MatrixF keys, values;
};

// Keys with a shared offset (as real keys have) plus Gaussian spread, values Gaussian.
Head make_head(int n, int d, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.f, 1.f);
  Head h{MatrixF(n, d), MatrixF(n, d)};
  std::vector<float> offset(d);
  for (float& o : offset) o = g(rng);
  for (int i = 0; i < n; ++i)
    for (int c = 0; c < d; ++c) {
      h.keys(i, c) = offset[c] + g(rng);
      h.values(i, c) = g(rng) * 0.5f;
    }
  return h;
}

void run_heads(benchmark::State& state, int heads, const BalanceParams& prm = BalanceParams{}) {
  const int n = static_cast<int>(state.range(0));
  const int d = 128;
  std::vector<Head> data;
  for (int h = 0; h < heads; ++h) data.push_back(make_head(n, d, 17u + h));
  std::vector<WalkJob> jobs(heads);
  for (int h = 0; h < heads; ++h) {
    jobs[h].keys = &data[h].keys;
    jobs[h].values = &data[h].values;
    jobs[h].kv_head = h;
    for (int t = 0; t < n; ++t) jobs[h].tokens.push_back(t);
    jobs[h].target = n / 4;  // two halving rounds
  }
  Backend& backend = bench_backend();
  uint64_t seed = 0;
  for (auto _ : state) {
    auto out = run_balance_walks(jobs, 0, seed++, prm, &backend);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetLabel(backend.name());
  state.counters["tokens"] = static_cast<double>(n) * heads;
}

void BM_BalanceKVHead(benchmark::State& state) {
  run_heads(state, 1);
}
// KVScope's earlier double-precision walk (preset kvscope-v1) on the same head: the "before" of
// the float32 walk, measured in the same run.
void BM_BalanceKVHeadKvscopeV1(benchmark::State& state) {
  run_heads(state, 1, kvscope_v1_params(BalanceParams{}));
}
// The same with the portable (Eigen, baseline x86-64) Gram path, as on a CPU without AVX2.
void BM_BalanceKVHeadPortableGram(benchmark::State& state) {
  const bool before = set_cpu_walk_simd(false);
  run_heads(state, 1);
  set_cpu_walk_simd(before);
}
void BM_BalanceKVLayer32(benchmark::State& state) {
  run_heads(state, 32);
}

// The walk op alone on the rows of one synthetic head (n rows, a multiple of 128, in blocks of 128,
// keys used as given, head seeded with `seed`), float32 (the authors' walk) or double.
void time_walk_op(benchmark::State& state, int n, bool float32, uint32_t seed) {
  const int d = 128, block = 128;
  Head h = make_head(n, d, seed);
  std::vector<int> offset;
  std::vector<uint32_t> head, id;
  for (int b = 0; b * block <= n; ++b) offset.push_back(std::min(n, b * block));
  for (int b = 0; b + 1 < static_cast<int>(offset.size()); ++b) {
    head.push_back(0);
    id.push_back(static_cast<uint32_t>(b));
  }
  std::vector<int8_t> sigma(n);
  WalkBatch batch;
  batch.float32 = float32;
  batch.value_eps = float32 ? kAuthorsValueEps : 0.0;
  batch.d = d;
  batch.dv = d;
  batch.num_blocks = static_cast<int>(head.size());
  batch.keys = h.keys.data();
  batch.values = h.values.data();
  batch.block_offset = offset.data();
  batch.block_head = head.data();
  batch.block_id = id.data();
  batch.sigma = sigma.data();
  Backend& backend = bench_backend();
  for (auto _ : state) {
    backend.walk_blocks(batch);
    benchmark::DoNotOptimize(sigma.data());
    ++batch.seed;
  }
  state.SetLabel(backend.name());
}

// One round of one head (64 blocks of 128 rows), to separate the op from block preparation and
// halving. Arg 1: float32 (default), 0: double.
void BM_WalkOpOneRound(benchmark::State& state) {
  time_walk_op(state, 8192, state.range(0) != 0, 5);
}

// The float32 op on one block of 128 rows again and again, its rows in cache: the compute floor
// of a block (two Grams, kernel rows, signs) without memory traffic; a walk at n = 8192 and two
// rounds walks 96 such blocks.
void BM_WalkOpOneBlockInCache(benchmark::State& state) {
  time_walk_op(state, 128, true, 6);
}

// One 128-row block's float32 Gram (d = 128) alone, rows in cache, with the walk_gram_f32 of the
// SIMD table named by the benchmark (engine/core/simd.h): the AVX2 / AVX-512 comparison on a CPU
// with both. Counter: 8-lane-equivalent FMAs per second (lower triangle only, as the walk needs).
void BM_WalkGramF32(benchmark::State& state, const std::string& table) {
  const simd::Kernels& t = simd::table(table);
  const int rows = 128, dim = 128, ld = 128;
  const Head h = make_head(rows, dim, 3);
  std::vector<float> packed(static_cast<size_t>(ld) * dim), g(static_cast<size_t>(rows) * ld);
  for (int p = 0; p < ld / 16; ++p)
    for (int c = 0; c < dim; ++c)
      for (int r = 0; r < 16; ++r)
        packed[(static_cast<size_t>(p) * dim + c) * 16 + r] =
            h.keys(std::min(16 * p + r, rows - 1), c);
  for (auto _ : state) {
    t.walk_gram_f32(packed.data(), rows, dim, 0, rows, ld, g.data(), nullptr, nullptr);
    benchmark::DoNotOptimize(g.data());
    benchmark::ClobberMemory();
  }
  const double lower = rows * (rows + 1) / 2.0 * dim / 8.0;
  state.counters["Gfma8"] =
      benchmark::Counter(lower * 1e-9 * state.iterations(), benchmark::Counter::kIsRate);
  state.SetLabel(table);
}

// A benchmark per table of this CPU that has the walk Gram.
const bool kWalkGramBenchmarks = [] {
  for (const std::string& name : simd::available())
    if (simd::table(name).walk_gram_f32)
      benchmark::RegisterBenchmark(("BM_WalkGramF32/" + name).c_str(), [name](benchmark::State& s) {
        BM_WalkGramF32(s, name);
      })->Unit(benchmark::kMicrosecond);
  return true;
}();

}  // namespace

BENCHMARK(BM_WalkOpOneBlockInCache)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_WalkOpOneRound)->Arg(1)->Arg(0)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_BalanceKVHead)->Arg(8192)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_BalanceKVHeadKvscopeV1)->Arg(8192)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_BalanceKVHeadPortableGram)->Arg(8192)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_BalanceKVLayer32)->Arg(8192)->Unit(benchmark::kMillisecond)->Iterations(2);

BENCHMARK_MAIN();
