// The CUDA implementation of the engine's Backend seam, for the programs that link the kernels
// (tests, benchmarks). Plain C++ header: no CUDA types, so it is included without nvcc. The
// engine never includes it: the backend registers itself (kernels/cuda_backend.cu).
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "engine/backend.h"

namespace kvscope {

// The process-wide CUDA backend itself, without the engine's CPU fallback (select_backend("cuda")
// returns it wrapped in a FallbackBackend), or nullptr when no device answers (`why` says why: no
// driver, no device, a device this build has no kernels for, or KVSCOPE_DISABLE_CUDA set). When it
// is returned, `why` names the device. The device is probed once per process. It is the probe the
// kernels register as "cuda" (register_backend, engine/backend.h).
Backend* cuda_backend_instance(std::string* why);

// Test hook: the next op's first device-buffer request fails as if the device were out of memory
// (whether or not it needed to allocate), so tests can check that the engine's fallback still
// returns the CPU result and reports why (last_fallback(), engine/backend.h).
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
std::unique_ptr<GpuOpTimer> cuda_score_timer(const ScoreBatch& batch);
std::unique_ptr<GpuOpTimer> cuda_cluster_timer(const ClusterBatch& batch);
std::unique_ptr<GpuOpTimer> cuda_cache_score_timer(const CacheScoreBatch& batch);
// A host-to-device copy of `bytes` bytes from pageable memory (the upload the op timers leave out).
std::unique_ptr<GpuOpTimer> cuda_upload_timer(const void* host, size_t bytes);

}  // namespace kvscope
