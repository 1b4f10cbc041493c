// Layers resident on the device (docs/design.md, "Backend ops", and
// docs/performance.md, "Layers resident on the device"). A batch with a non-zero layer id
// (ErrorBatch::layer_id, ScoreBatch::layer_id: LayerData::id, engine/io/capture.h) promises that
// its layer arrays are that loaded layer's matrices and do not change while the id lives; ids are
// never reused. So a range of host memory read under one id always holds the same bytes, and the
// device copy made at its first use serves every later call: the grid's and the sweep's calls
// over heads, methods, ratios, seeds and points pay a layer's host-to-device copy once.
//
// Entries are keyed by (layer id, host address, bytes): a head's keys, its values, the
// evaluation rows of each query head, each a separate allocation (the kernels take per-head
// pointer tables). They live in a least-recently-used list within a byte budget: by default half
// of the device memory free when the cache is first used, settable (cuda_set_resident_budget,
// kernels/cuda_backend.h). Entries used by the current call are never evicted during it. A call
// whose layer arrays exceed the budget on their own is not cached: its caller uploads as before.
// cudaMalloc running out of memory evicts the least recently used entries and retries; with
// nothing left to evict it throws CudaFailure (out of memory), which the backend turns into a
// DeviceFailure (the CPU runs that call).
//
// Copies go through two pinned staging buffers (double-buffered: the host fills one while the
// other's DMA runs, ordered by events) instead of the driver's pageable path; a zero chunk size
// or a failed pinned allocation copies straight from pageable memory. Whether that is faster on
// a given machine is for a device run to measure: this has only run under the CPU emulation.
//
// Guard: each entry keeps the bytes of kGuardWindows windows of kGuardBytes it was copied from,
// spread evenly over the array (its first and last bytes, and 32 strided through the middle); a
// hit whose host bytes differ there (a caller that broke the promise) is copied again and counted
// (ResidentLayerStats::mismatches), never served. A change that spans more than 1/33 of an array
// always meets a window; a smaller one may be missed (it is a sample, not a checksum). Arrays of
// up to kGuardWindows x kGuardBytes bytes are kept whole. The check runs at every hit: 34
// memcmp's of 64 bytes per array, about 2 KiB read (see docs/performance.md for its cost).
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <list>
#include <map>
#include <tuple>
#include <vector>

#include "kernels/cuda_backend.h"
#include "kernels/cuda_check.cuh"

namespace kvscope::cuda {

class ResidentLayers {
 public:
  ResidentLayers() = default;
  ResidentLayers(const ResidentLayers&) = delete;
  ResidentLayers& operator=(const ResidentLayers&) = delete;
  ~ResidentLayers();

  // Starts a call of `bytes` of layer arrays (duplicates counted each time). Returns false when
  // they cannot be resident together within the budget: the caller uploads them as before.
  // Entries found or uploaded from now until the next begin_call are kept for this call.
  bool begin_call(size_t bytes);
  // The device copy of `bytes` bytes at `host` read under `layer` (non-zero), copied on `stream`
  // at its first use. Only after begin_call returned true for bytes including these. `copy`, if
  // given, receives the copy's serial number (new at every copy, never reused).
  const void* find_or_upload(uint64_t layer, const void* host, size_t bytes, cudaStream_t stream,
                             uint64_t* copy = nullptr);
  // A device array computed from resident copies (the exact side of the errors), named by
  // (`layer`, `tag`, `bytes`) and valid while the copies with serials `sources` are the ones it
  // was computed from. When it is not kept (or was computed from other copies), `*fresh` is set
  // and the caller must fill it in this call; it is kept only once mark_ready() says the call
  // succeeded. Counted in the budget and the LRU like the copies.
  void* find_or_make_derived(uint64_t layer, const void* tag, size_t bytes,
                             const std::array<uint64_t, 3>& sources, bool* fresh);
  // The derived arrays made in this call are filled (their kernels are enqueued).
  void mark_ready();
  // Frees every device copy (after a device failure, or for a test) and the staging buffers.
  void release();

  // 0: the default (half of the free device memory at first use).
  void set_budget(size_t bytes);
  // 0 copies straight from pageable memory.
  void set_staging_chunk(size_t bytes);
  ResidentLayerStats stats() const;
  void reset_stats() { stats_ = ResidentLayerStats{}; }
  // The backend dropped every copy after running out of memory and ran the op again.
  void count_retry() { ++stats_.out_of_memory_retries; }

 private:
  static constexpr size_t kGuardBytes = 64;
  static constexpr size_t kGuardWindows = 34;
  struct Entry {
    uint64_t layer = 0;
    bool derived = false;  // computed on the device, not copied
    const void* host = nullptr;
    size_t bytes = 0;
    void* device = nullptr;
    uint64_t call = 0;                  // the call that used it last
    uint64_t serial = 0;                // copies: which copy this is
    std::array<uint64_t, 3> sources{};  // derived: the copies it was computed from
    bool ready = false;                 // derived: filled by a call that succeeded
    std::vector<unsigned char> guard;
  };
  using Key = std::tuple<uint64_t, bool, const void*, size_t>;

  size_t budget();
  void* allocate(size_t bytes);  // evicts and retries on out of memory
  std::list<Entry>::iterator insert(uint64_t layer, bool derived, const void* host, size_t bytes);
  bool evict_one();  // the least recently used entry not used by this call
  void erase(std::list<Entry>::iterator it);
  void upload(void* device, const void* host, size_t bytes, cudaStream_t stream);
  // The guard's windows of `bytes` at `host`, in order; guard_matches compares them in place.
  static std::vector<unsigned char> guard_of(const void* host, size_t bytes);
  static bool guard_matches(const std::vector<unsigned char>& guard, const void* host,
                            size_t bytes);

  std::list<Entry> lru_;  // most recently used first
  std::map<Key, std::list<Entry>::iterator> index_;
  size_t resident_bytes_ = 0;
  size_t budget_ = 0;      // 0 until known
  size_t set_budget_ = 0;  // set_budget's, 0: the default
  uint64_t call_ = 0;
  uint64_t serial_ = 0;
  ResidentLayerStats stats_;
  // Staging.
  size_t chunk_ = size_t(8) << 20;
  bool staging_failed_ = false;
  void* pinned_[2] = {nullptr, nullptr};
  cudaEvent_t copied_[2] = {nullptr, nullptr};
};

}  // namespace kvscope::cuda
