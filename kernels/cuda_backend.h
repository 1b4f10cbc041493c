// The CUDA implementation of the engine's Backend seam, for the programs that link the kernels
// (tests, benchmarks). Plain C++ header: no CUDA types, so it is included without nvcc. The
// engine never includes it: the backend registers itself (kernels/cuda_backend.cu).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/ops/backend.h"

namespace kvscope {

// The process-wide CUDA backend itself, without the engine's CPU fallback (select_backend("cuda")
// returns it wrapped in a FallbackBackend), or nullptr when no device answers (`why` says why: no
// driver, no device, a device this build has no kernels for, or KVSCOPE_DISABLE_CUDA set). When it
// is returned, `why` names the device. The device is probed once per process. It is the probe the
// kernels register as "cuda" (register_backend, engine/ops/backend.h).
Backend* cuda_backend_instance(std::string* why);

// Test hook: the next op's first device-buffer request fails as if the device were out of memory
// (whether or not it needed to allocate), so tests can check that the engine's fallback still
// returns the CPU result and reports why (last_fallback(), engine/ops/backend.h).
void cuda_fail_next_allocation_for_testing();

// The CUDA backend's resident layer copies (kernels/resident_layers.cuh): what a batch with a
// layer id (ErrorBatch::layer_id, ScoreBatch::layer_id) has cost and kept. For tests and reports.
struct ResidentLayerStats {
  uint64_t uploaded_bytes = 0;  // host-to-device bytes copied into resident entries
  uint64_t uploads = 0;         // entries copied (first uses, and again after an eviction)
  uint64_t hits = 0;            // entries served without a copy
  uint64_t evictions = 0;       // entries dropped for the budget or out of memory
  uint64_t mismatches = 0;      // hits refused because the host bytes had changed (a broken id)
  uint64_t uncached_calls = 0;  // calls whose layer arrays alone exceed the budget
  // The exact side of the errors per (layer, query head, window): computed (first use, or its
  // copies changed) and found kept, query heads counted.
  uint64_t exact_built = 0;
  uint64_t exact_reused = 0;
  // Ops that ran out of device memory with layers resident: every copy was dropped and the op
  // ran again on the device (a second failure runs it on the CPU).
  uint64_t out_of_memory_retries = 0;
  size_t resident_bytes = 0;  // device bytes held now
  size_t budget_bytes = 0;    // the budget (0 until first used when it is the default)
  int entries = 0;
};
// Zeros when no device answers.
ResidentLayerStats cuda_resident_stats();
// The resident budget in bytes; 0 restores the default (half of the device memory free at first
// use). Entries beyond a smaller budget are evicted at once.
void cuda_set_resident_budget(size_t bytes);
// Test hooks: drops every resident copy and zeroes the counters; the size of the pinned staging
// chunks (0: copy straight from pageable memory; default 8 MiB).
void cuda_reset_resident_for_testing();
void cuda_set_resident_staging_chunk_for_testing(size_t bytes);
// Under the CPU emulation of CUDA (kernels/emu/), every host-to-device byte any kernel file has
// copied since the start; false on a real device, where the runtime does not count them.
bool cuda_host_to_device_bytes_for_testing(uint64_t* bytes);
// Under the emulation: the device memory cudaMalloc may hand out (0: the default 80 GiB), so
// tests can run it out; false on a real device (nothing is changed). And the bytes allocated now
// (0 on a real device).
bool cuda_set_emulated_device_memory_for_testing(size_t bytes);
size_t cuda_emulated_device_memory_used_for_testing();

// Device-resident timing for bench/bench_gpu.cpp and its op cases (tests/op_cases.h): each step
// runs once, uploading its inputs, on a CUDA backend of its own; each run_ms() then replays only
// the kernels of every step's op over those inputs, in order, and returns their time in
// milliseconds measured with CUDA events. Throws std::runtime_error when no device is usable.
class GpuOpTimer {
 public:
  virtual ~GpuOpTimer() = default;
  virtual double run_ms() = 0;
};
std::unique_ptr<GpuOpTimer> cuda_op_timer(const std::vector<std::function<void(Backend&)>>& steps);
// A host-to-device copy of `bytes` bytes from pageable memory (the upload the op timers leave out).
std::unique_ptr<GpuOpTimer> cuda_upload_timer(const void* host, size_t bytes);

}  // namespace kvscope
