// The device layer cache; see resident_layers.cuh for the design.
#include <algorithm>
#include <cstring>
#include <string>

#include "kernels/resident_layers.cuh"

namespace kvscope::cuda {

ResidentLayers::~ResidentLayers() {
  release();
  for (cudaEvent_t& e : copied_)
    if (e) {
      cudaEventDestroy(e);
      e = nullptr;
    }
}

void ResidentLayers::set_budget(size_t bytes) {
  set_budget_ = bytes;
  budget_ = bytes;  // 0: measured again at the next use
  ++call_;          // no call is running (the backend's lock): every entry may go
  while (budget_ > 0 && resident_bytes_ > budget_ && evict_one()) {
  }
}

void ResidentLayers::set_staging_chunk(size_t bytes) {
  chunk_ = bytes;
  for (void*& p : pinned_)
    if (p) {
      cudaFreeHost(p);
      p = nullptr;
    }
  staging_failed_ = false;
}

size_t ResidentLayers::budget() {
  if (budget_ == 0) {
    size_t free_bytes = 0, total_bytes = 0;
    KVS_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    // What is resident already counts as available to the cache.
    budget_ = std::max<size_t>((free_bytes + resident_bytes_) / 2, 1);
  }
  return budget_;
}

ResidentLayerStats ResidentLayers::stats() const {
  ResidentLayerStats s = stats_;
  s.resident_bytes = resident_bytes_;
  s.budget_bytes = set_budget_ ? set_budget_ : budget_;
  s.entries = static_cast<int>(lru_.size());
  return s;
}

bool ResidentLayers::begin_call(size_t bytes) {
  ++call_;
  if (bytes > budget()) {
    ++stats_.uncached_calls;
    return false;
  }
  return true;
}

void ResidentLayers::erase(std::list<Entry>::iterator it) {
  cudaFree(it->device);  // the stream is synchronised at the end of every call
  resident_bytes_ -= it->bytes;
  index_.erase(Key{it->layer, it->derived, it->host, it->bytes});
  lru_.erase(it);
}

bool ResidentLayers::evict_one() {
  for (auto it = lru_.end(); it != lru_.begin();) {
    --it;
    if (it->call == call_) continue;  // this call's kernels will read it
    erase(it);
    ++stats_.evictions;
    return true;
  }
  return false;
}

void* ResidentLayers::allocate(size_t bytes) {
  if (g_fail_next_allocation.exchange(false))
    throw CudaFailure(cudaErrorMemoryAllocation,
                      "cudaMalloc(" + std::to_string(bytes >> 20) +
                          " MiB, resident layer) failed: cudaErrorMemoryAllocation (simulated for "
                          "a test)");
  for (;;) {
    void* p = nullptr;
    const cudaError_t err = cudaMalloc(&p, std::max<size_t>(bytes, 1));
    if (err == cudaSuccess) return p;
    (void)cudaGetLastError();
    if (err != cudaErrorMemoryAllocation || !evict_one())
      check_cuda(err,
                 ("cudaMalloc(" + std::to_string(bytes >> 20) + " MiB, resident layer)").c_str(),
                 __FILE__, __LINE__);
  }
}

namespace {

// Calls f(offset, length) for each guard window of an array of `bytes` bytes: the whole array
// when it is small, else `windows` windows of `len` bytes at evenly spaced offsets from 0 to
// bytes - len.
template <typename F>
void for_each_guard_window(size_t bytes, size_t windows, size_t len, F&& f) {
  if (bytes <= windows * len) {
    f(size_t(0), bytes);
    return;
  }
  for (size_t w = 0; w < windows; ++w) f((bytes - len) * w / (windows - 1), len);
}

}  // namespace

std::vector<unsigned char> ResidentLayers::guard_of(const void* host, size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(host);
  std::vector<unsigned char> g;
  g.reserve(std::min(bytes, kGuardWindows * kGuardBytes));
  for_each_guard_window(bytes, kGuardWindows, kGuardBytes,
                        [&](size_t off, size_t len) { g.insert(g.end(), p + off, p + off + len); });
  return g;
}

bool ResidentLayers::guard_matches(const std::vector<unsigned char>& guard, const void* host,
                                   size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(host);
  size_t at = 0;
  bool same = true;
  for_each_guard_window(bytes, kGuardWindows, kGuardBytes, [&](size_t off, size_t len) {
    same = same && at + len <= guard.size() && std::memcmp(guard.data() + at, p + off, len) == 0;
    at += len;
  });
  return same && at == guard.size();
}

void ResidentLayers::upload(void* device, const void* host, size_t bytes, cudaStream_t stream) {
  stats_.uploaded_bytes += bytes;
  ++stats_.uploads;
  if (chunk_ > 0 && !staging_failed_ && !pinned_[0]) {
    bool ok = true;
    for (int i = 0; i < 2 && ok; ++i) {
      ok = cudaMallocHost(&pinned_[i], chunk_) == cudaSuccess;
      if (ok && !copied_[i])
        ok = cudaEventCreateWithFlags(&copied_[i], cudaEventDisableTiming) == cudaSuccess;
    }
    if (!ok) {  // no pinned memory: copy from pageable memory, as before
      (void)cudaGetLastError();
      for (void*& p : pinned_)
        if (p) {
          cudaFreeHost(p);
          p = nullptr;
        }
      staging_failed_ = true;
    }
  }
  if (!pinned_[0]) {
    KVS_CUDA_CHECK(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, stream));
    return;
  }
  const auto* src = static_cast<const unsigned char*>(host);
  auto* dst = static_cast<unsigned char*>(device);
  int buf = 0;
  for (size_t off = 0; off < bytes; off += chunk_, buf ^= 1) {
    const size_t len = std::min(chunk_, bytes - off);
    // The copy that last read this buffer has finished (an event never recorded is complete).
    KVS_CUDA_CHECK(cudaEventSynchronize(copied_[buf]));
    std::memcpy(pinned_[buf], src + off, len);
    KVS_CUDA_CHECK(cudaMemcpyAsync(dst + off, pinned_[buf], len, cudaMemcpyHostToDevice, stream));
    KVS_CUDA_CHECK(cudaEventRecord(copied_[buf], stream));
  }
}

std::list<ResidentLayers::Entry>::iterator ResidentLayers::insert(uint64_t layer, bool derived,
                                                                  const void* host, size_t bytes) {
  while (resident_bytes_ + bytes > budget() && evict_one()) {
  }
  Entry e;
  e.layer = layer;
  e.derived = derived;
  e.host = host;
  e.bytes = bytes;
  e.call = call_;
  e.device = allocate(bytes);
  lru_.push_front(std::move(e));
  index_[Key{layer, derived, host, bytes}] = lru_.begin();
  resident_bytes_ += bytes;
  return lru_.begin();
}

const void* ResidentLayers::find_or_upload(uint64_t layer, const void* host, size_t bytes,
                                           cudaStream_t stream, uint64_t* copy) {
  auto found = index_.find(Key{layer, false, host, bytes});
  if (found != index_.end()) {
    auto it = found->second;
    if (guard_matches(it->guard, host, bytes)) {
      ++stats_.hits;
      it->call = call_;
      lru_.splice(lru_.begin(), lru_, it);
      if (copy) *copy = it->serial;
      return it->device;
    }
    ++stats_.mismatches;  // the promise was broken: never serve it
    erase(it);
  }
  auto it = insert(layer, false, host, bytes);
  try {
    upload(it->device, host, bytes, stream);
  } catch (...) {
    erase(it);
    throw;
  }
  it->guard = guard_of(host, bytes);
  it->serial = ++serial_;
  if (copy) *copy = it->serial;
  return it->device;
}

void* ResidentLayers::find_or_make_derived(uint64_t layer, const void* tag, size_t bytes,
                                           const std::array<uint64_t, 3>& sources, bool* fresh) {
  auto found = index_.find(Key{layer, true, tag, bytes});
  std::list<Entry>::iterator it;
  if (found != index_.end()) {
    it = found->second;
    it->call = call_;
    lru_.splice(lru_.begin(), lru_, it);
    if (it->ready && it->sources == sources) {
      ++stats_.exact_reused;
      *fresh = false;
      return it->device;
    }
  } else {
    it = insert(layer, true, tag, bytes);
  }
  it->ready = false;  // until this call has filled it
  it->sources = sources;
  ++stats_.exact_built;
  *fresh = true;
  return it->device;
}

void ResidentLayers::mark_ready() {
  for (Entry& e : lru_) {
    if (e.call != call_) break;  // this call's entries are at the front
    if (e.derived) e.ready = true;
  }
}

void ResidentLayers::release() {
  while (!lru_.empty()) erase(lru_.begin());
  for (void*& p : pinned_)
    if (p) {
      cudaFreeHost(p);
      p = nullptr;
    }
  staging_failed_ = false;
  budget_ = set_budget_;
}

}  // namespace kvscope::cuda
