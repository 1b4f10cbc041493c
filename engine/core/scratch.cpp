#include "engine/core/scratch.h"

#include <algorithm>
#include <mutex>
#include <new>
#include <utility>
#include <vector>

namespace kvscope::scratch {
namespace {

// Free buffers kept for reuse: enough for the logits of a few heads at 32k tokens in flight, far
// below what the reference cache itself may hold.
constexpr size_t kPoolLimitBytes = size_t{256} << 20;

struct Pool {
  std::mutex mu;
  struct Block {
    double* data;
    size_t capacity;
  };
  std::vector<Block> free;  // most recently returned last
  size_t bytes = 0;

  // The smallest free block that holds `count` doubles without wasting more than half of it.
  double* take(size_t count, size_t* capacity) {
    std::lock_guard<std::mutex> lock(mu);
    size_t best = free.size();
    for (size_t i = 0; i < free.size(); ++i)
      if (free[i].capacity >= count && free[i].capacity / 2 <= count &&
          (best == free.size() || free[i].capacity < free[best].capacity))
        best = i;
    if (best == free.size()) return nullptr;
    const Block b = free[best];
    free.erase(free.begin() + static_cast<long>(best));
    bytes -= b.capacity * sizeof(double);
    *capacity = b.capacity;
    return b.data;
  }

  void give(double* data, size_t capacity) {
    const size_t b = capacity * sizeof(double);
    std::vector<double*> drop;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (b > kPoolLimitBytes) {
        drop.push_back(data);
      } else {
        free.push_back({data, capacity});
        bytes += b;
        // Over the limit: the oldest returned go first.
        size_t i = 0;
        while (bytes > kPoolLimitBytes && i < free.size()) {
          bytes -= free[i].capacity * sizeof(double);
          drop.push_back(free[i].data);
          ++i;
        }
        free.erase(free.begin(), free.begin() + static_cast<long>(i));
      }
    }
    for (double* p : drop) ::operator delete[](p, std::align_val_t{64});
  }

  ~Pool() {
    for (const Block& b : free) ::operator delete[](b.data, std::align_val_t{64});
  }
};

Pool& pool() {
  static Pool* p = new Pool;  // never destroyed: buffers may be returned during static teardown
  return *p;
}

}  // namespace

Buffer::Buffer(size_t count) {
  reserve(count);
}

Buffer::~Buffer() {
  release();
}

Buffer::Buffer(Buffer&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)),
      size_(std::exchange(o.size_, 0)),
      capacity_(std::exchange(o.capacity_, 0)) {}

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    release();
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
    capacity_ = std::exchange(o.capacity_, 0);
  }
  return *this;
}

void Buffer::reserve(size_t count) {
  size_ = count;
  if (count <= capacity_ && data_) return;
  release();
  size_ = count;
  const size_t want = std::max<size_t>(count, 1);
  size_t cap = 0;
  if (double* p = pool().take(want, &cap)) {
    data_ = p;
    capacity_ = cap;
    return;
  }
  data_ = static_cast<double*>(::operator new[](want * sizeof(double), std::align_val_t{64}));
  capacity_ = want;
}

void Buffer::release() {
  if (data_) pool().give(data_, capacity_);
  data_ = nullptr;
  capacity_ = 0;
}

size_t pool_bytes() {
  std::lock_guard<std::mutex> lock(pool().mu);
  return pool().bytes;
}

size_t pool_limit_bytes() {
  return kPoolLimitBytes;
}

}  // namespace kvscope::scratch
