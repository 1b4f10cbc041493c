// Reusable work buffers for the hot loops of the exact reference
// (engine/attention/exact_attention.cpp): large arrays of doubles taken from a process-wide pool
// and handed back when done, so that the same pages serve one head after another instead of being
// mapped, cleared by the kernel and unmapped each time (docs/performance.md, "Exact reference
// cache").
#pragma once

#include <cstddef>

namespace kvscope::scratch {

// A buffer of at least `count` doubles, uninitialised. Move-only; goes back to the pool when
// destroyed. Thread-safe: any thread may take or return buffers.
class Buffer {
 public:
  Buffer() = default;
  explicit Buffer(size_t count);
  ~Buffer();
  Buffer(Buffer&& o) noexcept;
  Buffer& operator=(Buffer&& o) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  double* data() const { return data_; }
  size_t size() const { return size_; }  // as asked
  // Makes it hold at least `count` doubles (contents are lost when it grows).
  void reserve(size_t count);

 private:
  void release();
  double* data_ = nullptr;
  size_t size_ = 0, capacity_ = 0;
};

// Bytes held by returned buffers waiting for reuse (at most `pool_limit_bytes()`).
size_t pool_bytes();
size_t pool_limit_bytes();

}  // namespace kvscope::scratch
