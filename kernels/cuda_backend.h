// The CUDA implementation of the engine's Backend seam. Plain C++ header: no CUDA types, so
// engine/, the CLI, the app, tests and benchmarks include it without nvcc.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "engine/backend.h"

namespace kvscope {

// The process-wide CUDA backend, or nullptr when no device answers (`why` says why: no driver,
// no device, a device this build has no kernels for, or KVSCOPE_DISABLE_CUDA set). When it is
// returned, `why` names the device. The device is probed once per process.
Backend* cuda_backend_instance(std::string* why);

// Why the most recent CUDA op of this process ran on the CPU instead (out of device memory, a
// launch or execution failure, a shape the kernels do not support), or "" when the most recent
// op ran on the GPU. Each distinct reason is also printed once to stderr.
std::string cuda_last_fallback();

// Test hook: the next op's first device-buffer request fails as if the device were out of memory
// (whether or not it needed to allocate), so tests can check that the op still returns the CPU
// result and reports why.
void cuda_fail_next_allocation_for_testing();

// Device-resident timing for bench/bench_gpu.cpp: the constructor uploads the inputs once; each
// run_ms() replays only the op's kernels and returns their time in milliseconds, measured with
// CUDA events. Throws std::runtime_error when no device is usable.
class GpuOpTimer {
 public:
  virtual ~GpuOpTimer() = default;
  virtual double run_ms() = 0;
};
std::unique_ptr<GpuOpTimer> cuda_walk_timer(const WalkBatch& batch);
std::unique_ptr<GpuOpTimer> cuda_error_timer(const ErrorBatch& batch);
std::unique_ptr<GpuOpTimer> cuda_tsne_timer(const TsneGradInput& in);
std::unique_ptr<GpuOpTimer> cuda_kcenter_timer(const float* x, int n, int d, int k, int first);
// A host-to-device copy of `bytes` bytes from pageable memory (the upload the op timers leave out).
std::unique_ptr<GpuOpTimer> cuda_upload_timer(const void* host, size_t bytes);

}  // namespace kvscope
