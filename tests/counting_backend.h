// A device backend without a device, for the tests of a layer's heads in one attention_errors
// call (tests/test_batched_eval.cpp, tests/gui/test_app_batched.cpp; docs/testing.md): registered
// as "test-batch" by including this header, as kernels/cuda_backend.cu registers "cuda", it says
// it parallelises inside one call, runs the CPU references (cpu_attention_errors and the CPU
// backend's other ops) and records every attention_errors call.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "engine/ops/backend.h"

namespace kvscope::testing {

struct ErrorCall {
  int kv_heads = 0, q_heads = 0, n = 0;
  size_t distinct_keys = 0;  // different kv heads' keys in the call
  uint64_t layer_id = 0;     // ErrorBatch::layer_id: the loaded layer named, 0 for none
};

class CountingBackend final : public Backend {
 public:
  std::string name() const override { return "test-batch (CPU references, counting)"; }
  bool parallel_in_one_call() const override { return true; }
  void walk_blocks(const WalkBatch& b) override { cpu_backend().walk_blocks(b); }
  void attention_errors(const ErrorBatch& b) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      calls_.push_back({b.kv_heads, b.q_heads, b.n,
                        std::set<const float*>(b.keys.begin(), b.keys.end()).size(), b.layer_id});
    }
    for (const float* k : b.keys)
      if (k == reject_keys.load()) throw std::invalid_argument("test-batch rejects these keys");
    const int now = ++active_;
    for (int seen = max_active_.load();
         now > seen && !max_active_.compare_exchange_weak(seen, now);) {
    }
    if (sleep_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms.load()));
    cpu_attention_errors(b);
    --active_;
  }
  double tsne_gradient(const TsneGradInput& in, float* grad) override {
    return cpu_backend().tsne_gradient(in, grad);
  }
  std::vector<int> kcenter(const float* x, int n, int d, int k, int first) override {
    return cpu_backend().kcenter(x, n, d, k, first);
  }
  void attention_scores(const ScoreBatch& b) override { cpu_backend().attention_scores(b); }

  // A call holding these keys throws, as an op rejects a batch (input errors propagate).
  std::atomic<const float*> reject_keys{nullptr};
  // How long each call takes at least (to see calls overlap).
  std::atomic<int> sleep_ms{0};

  // The calls since the last take.
  std::vector<ErrorCall> take_calls() {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<ErrorCall> out;
    out.swap(calls_);
    return out;
  }
  // The most calls seen running at once since the last take.
  int take_max_active() { return max_active_.exchange(0); }

 private:
  std::mutex mu_;
  std::vector<ErrorCall> calls_;
  std::atomic<int> active_{0}, max_active_{0};
};

inline CountingBackend& counting() {
  static CountingBackend backend;
  return backend;
}

inline Backend* probe_counting(std::string* why) {
  if (why) *why = "the counting test backend";
  return &counting();
}

inline const bool kCountingRegistered = register_backend("test-batch", probe_counting);

}  // namespace kvscope::testing
