// Internal to the walk: the prefetch hint that engine/methods/balancekv/balance_walk.cpp's rounds
// give the CPU walk op (engine/ops/walk_blocks_cpu.cpp) about the block they will walk next. Only a
// hint: no result depends on it.
#pragma once

namespace kvscope::walk_prefetch {

// The rows of the block walked after the current one on this thread.
struct NextRows {
  const float* keys = nullptr;    // the head's rows, d wide
  const float* values = nullptr;  // dv wide
  int d = 0, dv = 0;
  const int* tokens = nullptr;  // rows of the next block
  int count = 0;
};

// While alive, the CPU walk op on this thread prefetches `rows` between its Gram tiles; cleared
// however the walk returns.
class Hint {
 public:
  explicit Hint(const NextRows* rows);
  ~Hint();
  Hint(const Hint&) = delete;
  Hint& operator=(const Hint&) = delete;
};

}  // namespace kvscope::walk_prefetch
