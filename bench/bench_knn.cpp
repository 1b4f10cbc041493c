// Exact kNN (engine/geometry/knn.h) as t-SNE's setup runs it: k = 91 (3 x perplexity 30 + 1) of n
// keys in d = 128, centred. The keys are clustered and drift along the sequence the way a capture's
// do (neighbouring tokens have near keys). One benchmark per tile kernel: "portable" (Eigen float
// GEMM into a buffer, then a scan; the SSE2 table) and "avx2" (the fused register-block kernel).
// Counters: gflops = the upper triangle's 2 n^2 d / 2 flops per second of wall time.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "engine/core/simd.h"
#include "engine/geometry/knn.h"

using namespace kvscope;

namespace {

MatrixF drifting_clusters(int n, int d, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.f, 1.f);
  const int clusters = 48;
  MatrixF centres(clusters, d);
  for (int c = 0; c < clusters; ++c)
    for (int e = 0; e < d; ++e) centres(c, e) = 3.f * g(rng);
  MatrixF x(n, d);
  Eigen::RowVectorXf drift = Eigen::RowVectorXf::Zero(d);
  int cluster = 0;
  for (int i = 0; i < n; ++i) {
    if (rng() % 64 == 0) cluster = static_cast<int>(rng() % clusters);
    for (int e = 0; e < d; ++e) {
      drift(e) = 0.98f * drift(e) + 0.2f * g(rng);
      x(i, e) = centres(cluster, e) + drift(e) + g(rng);
    }
  }
  const Eigen::RowVectorXf mean = x.colwise().mean();
  x.rowwise() -= mean;
  return x;
}

void BM_KnnExact(benchmark::State& state, const char* table) {
  const std::vector<std::string> names = simd::available();
  if (std::find(names.begin(), names.end(), table) == names.end()) {
    state.SkipWithError("this CPU does not run the table");
    return;
  }
  const std::string before = simd::kernels().name;
  simd::use(table);
  const int n = static_cast<int>(state.range(0)), d = 128, k = 91;
  const MatrixF x = drifting_clusters(n, d, 5);
  std::vector<int> nb;
  std::vector<float> d2;
  for (auto _ : state) {
    knn_exact(x, k, nb, d2);
    benchmark::DoNotOptimize(nb.data());
  }
  simd::use(before);
  state.counters["gflops"] = benchmark::Counter(1e-9 * n * n * d * double(state.iterations()),
                                                benchmark::Counter::kIsRate);
}

}  // namespace

BENCHMARK_CAPTURE(BM_KnnExact, portable, "sse2")
    ->Arg(8192)
    ->Arg(32768)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Iterations(2);
BENCHMARK_CAPTURE(BM_KnnExact, avx2, "avx2")
    ->Arg(8192)
    ->Arg(32768)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Iterations(2);

BENCHMARK_MAIN();
