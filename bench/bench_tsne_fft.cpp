// The FFT-interpolated t-SNE repulsion (engine/tsne_fft) alone, on fixed 32768-point embeddings
// shaped like a t-SNE map (Gaussian clusters): ~110 wide (the grid of the last iterations of a
// 32k-key run, FFT side 675) and ~30 wide (an early iteration, the 50-box minimum: side 300).
// Wall time per compute() with the run's threads (real time), CPU time over all of them as the
// "cpu_ms" counter.
#include <benchmark/benchmark.h>

#include <ctime>
#include <random>
#include <vector>

#include "engine/ops/tsne_gradient_fft.h"

using namespace kvscope;

namespace {

double process_cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

// n points in 40 Gaussian clusters whose centres fill a square of side `width` (spread width/40).
std::vector<float> clustered_embedding(int n, double width, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(-0.42 * width, 0.42 * width);
  std::normal_distribution<double> g(0.0, width / 40);
  const int clusters = 40;
  std::vector<double> cx(clusters), cy(clusters);
  for (int c = 0; c < clusters; ++c) cx[c] = u(rng), cy[c] = u(rng);
  std::vector<float> y(2 * static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    y[2 * i] = static_cast<float>(cx[i % clusters] + g(rng));
    y[2 * i + 1] = static_cast<float>(cy[i % clusters] + g(rng));
  }
  return y;
}

void BM_TsneFftRepulsion(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  const double width = static_cast<double>(state.range(1));
  const std::vector<float> y = clustered_embedding(n, width, 7);
  TsneFftRepulsion repulsion;
  repulsion.compute(y.data(), n);  // the plan and the kernel's spectrum, kept across iterations
  const double cpu0 = process_cpu_seconds();
  double checksum = 0;
  for (auto _ : state) {
    const TsneFftRepulsion::Sums s = repulsion.compute(y.data(), n);
    checksum += s.rep[0] + s.z_each[n - 1];
  }
  benchmark::DoNotOptimize(checksum);
  state.counters["cpu_ms"] = benchmark::Counter(1e3 * (process_cpu_seconds() - cpu0) /
                                                static_cast<double>(state.iterations()));
  state.counters["fft_side"] = repulsion.last_fft_side();
}

}  // namespace

BENCHMARK(BM_TsneFftRepulsion)
    ->Args({32768, 116})
    ->Args({32768, 30})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

BENCHMARK_MAIN();
