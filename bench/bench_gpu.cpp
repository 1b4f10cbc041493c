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
// Each is the timing mode of an OpCase (tests/op_cases.h): BM_Gpu<label> for every case marked
// `bench`, BM_Cpu<label> for those marked `bench_cpu`; this file has no code per op. GPU timings
// are device-resident: the case's steps run once (uploading), each iteration replays only their
// kernels and is timed with CUDA events (UseManualTime, cuda_op_timer). Host<->device copies are
// not included (BM_GpuUploadLayer times one layer's); the app pays them once per capture/layer.
// Without a device every GPU benchmark reports "no CUDA device: <why>" and is skipped.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <functional>
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

#ifdef KVSCOPE_HAVE_CUDA
template <typename MakeTimers>
void run_gpu(benchmark::State& state, MakeTimers make) {
  std::string why;
  if (!cuda_available(&why)) {
    state.SkipWithError(("no CUDA device: " + why).c_str());
    return;
  }
  std::unique_ptr<GpuOpTimer> timer;
  try {
    timer = make();
    timer->run_ms();  // warm-up (module load, clocks)
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
    return;
  }
  for (auto _ : state) state.SetIterationTime(timer->run_ms() / 1e3);
}
#else
template <typename MakeTimers>
void run_gpu(benchmark::State& state, MakeTimers) {
  state.SkipWithError("no CUDA device: this build has no CUDA kernels (nvcc was not found)");
}
#endif

// A case's timing mode on the device: its steps run once, then their kernels replay. The inputs
// are made only when a device answers (a layer's take seconds to fill).
void gpu_case(benchmark::State& state, const OpCase* c) {
  std::unique_ptr<OpRun> run;  // outlives the timer, whose steps point into it
  run_gpu(state, [&]() -> std::unique_ptr<GpuOpTimer> {
#ifdef KVSCOPE_HAVE_CUDA
    run = c->make();
    return cuda_op_timer(run->steps());
#else
    return nullptr;
#endif
  });
}

// On the CPU reference: the whole run, each iteration.
void cpu_case(benchmark::State& state, const OpCase* c) {
  std::unique_ptr<OpRun> run = c->make();
  for (auto _ : state) run->run(cpu_backend());
}

// The host-to-device copy of one layer's keys and values (kv heads x n x d, both), from pageable
// memory: reported apart from the device-resident op timings.
void gpu_upload_layer(benchmark::State& state, const ErrorCase* c) {
  static std::vector<float> host;
  host.assign(static_cast<size_t>(c->kv_heads) * c->n * (c->d + c->dv), 0.5f);
  run_gpu(state, []() -> std::unique_ptr<GpuOpTimer> {
#ifdef KVSCOPE_HAVE_CUDA
    return cuda_upload_timer(host.data(), host.size() * sizeof(float));
#else
    return nullptr;
#endif
  });
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) *
                          static_cast<int64_t>(host.size() * sizeof(float)));
}

void register_cases() {
  using benchmark::kMillisecond;
  for (const OpCase& c : all_op_cases()) {
    if (c.bench)
      benchmark::RegisterBenchmark(("BM_Gpu" + c.label).c_str(), gpu_case, &c)
          ->UseManualTime()
          ->Unit(kMillisecond);
    if (c.bench_cpu)
      benchmark::RegisterBenchmark(("BM_Cpu" + c.label).c_str(), cpu_case, &c)->Unit(kMillisecond);
  }
  for (const ErrorCase& c : error_cases())
    if (c.bench && c.q_heads > 1)
      benchmark::RegisterBenchmark((std::string("BM_GpuUploadLayer/") + c.name).c_str(),
                                   gpu_upload_layer, &c)
          ->UseManualTime()
          ->Unit(kMillisecond);
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
