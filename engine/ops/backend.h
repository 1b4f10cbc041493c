// The compute seam (docs/design.md, "Backend ops"): each op's batch type and CPU reference live
// in engine/ops/ (one header per op); a Backend runs them. The CPU backend is always there and is
// the reference. Device backends (kernels/cuda_backend.cu) register themselves with
// register_backend() from a static registrar, so the engine never includes or links the kernels;
// select_backend() hands out a device backend wrapped in FallbackBackend, the one place where an
// op that the device does not support, or that fails on it, runs on the CPU instead and says why.
// Every op takes plain arrays so kernels/ never sees Eigen.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "engine/ops/attention_errors.h"
#include "engine/ops/attention_scores.h"
#include "engine/ops/cache_scores.h"
#include "engine/ops/chunk_scores.h"
#include "engine/ops/expected_scores.h"
#include "engine/ops/kcenter.h"
#include "engine/ops/key_clusters.h"
#include "engine/ops/tsne_gradient.h"
#include "engine/ops/walk_blocks.h"

namespace kvscope {

// The ops of the seam, for supports() and the fallback's messages. A new op adds its entry here
// and its name below, in the same place.
enum class Op {
  walk_blocks,
  attention_errors,
  tsne_gradient,
  kcenter,
  attention_scores,
  key_clusters,
  cache_scores,
  expected_scores,
  chunk_scores,
};
inline constexpr const char* kOpNames[] = {
    "walk_blocks",  "attention_errors", "tsne_gradient",   "kcenter",      "attention_scores",
    "key_clusters", "cache_scores",     "expected_scores", "chunk_scores",
};
inline constexpr size_t kOpCount = sizeof kOpNames / sizeof kOpNames[0];
static_assert(static_cast<size_t>(Op::chunk_scores) + 1 == kOpCount,
              "every Op has its name in kOpNames, in the enum's order");

inline const char* op_name(Op op) {
  const auto i = static_cast<size_t>(op);
  return i < kOpCount ? kOpNames[i] : "?";
}

// What supports() is told about one call: the op and its sizes.
struct OpShape {
  Op op = Op::walk_blocks;
  // walk: total rows; attention, scores, cache scores: tokens n; t-SNE, k-center, clusters: points
  int64_t rows = 0;
  int d = 0;  // key width (t-SNE: 2; k-center: features)
  // value width (walk, attention, expected scores); scores: kv heads of the batch; cache scores:
  // keys of the cache; chunk scores: the chunk size
  int dv = 0;
  // walk: blocks; attention: query heads; scores, cache scores: group; t-SNE: 0; k-center: k;
  // clusters: radii; expected scores, chunk scores: query heads per group
  int count = 0;
  bool float_scores = false;  // attention: ErrorBatch::float_scores
};

// A device backend's report that it could not run an op (out of device memory, a rejected launch,
// an execution error, a context lost to an earlier failure, a shape found unsupported while
// uploading). FallbackBackend catches it, records what() and runs the CPU reference. Input errors
// (the checks the CPU reference makes) are not DeviceFailures: they propagate unchanged.
class DeviceFailure : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;  // "cpu" or "cuda (NVIDIA H100 ...)"
  // Whether this backend runs `shape` itself; when not, `why` (if given) says why. Asked by
  // FallbackBackend before each op. The CPU supports every shape.
  virtual bool supports(const OpShape& shape, std::string* why = nullptr) const { return true; }
  // How callers should feed it. True for a backend that parallelises inside one call (a device):
  // the walk hands it a whole round of every head at once, the protocol scores through
  // attention_errors, and t-SNE keeps the exact gradient at any size. False (the CPU): callers
  // spread heads over CPU threads and take the CPU's own shortcuts (each block walked while in
  // cache, the exact-reference cache, FFT repulsion, 16-bit columns). Results do not depend on it.
  // Which processor runs the ops is said by name() and by whether this is cpu_backend().
  virtual bool parallel_in_one_call() const { return false; }
  // One virtual per op, each defaulting to the op's CPU reference: the CPU backend is this
  // class as it is, and a device backend or a test's fake overrides what it runs itself.
  virtual void walk_blocks(const WalkBatch& batch) { cpu_walk_blocks(batch); }
  virtual void attention_errors(const ErrorBatch& batch) { cpu_attention_errors(batch); }
  // grad: n x 2. Returns the KL divergence when cheap to compute, else NaN.
  virtual double tsne_gradient(const TsneGradInput& in, float* grad) {
    return cpu_tsne_gradient(in, grad);
  }
  // Greedy k-center (Gonzalez) from row `first`; returns the k centre rows in pick order.
  virtual std::vector<int> kcenter(const float* x, int n, int d, int k, int first) {
    return cpu_kcenter(x, n, d, k, first);
  }
  // The causal attention each key receives, reduced per key (engine/ops/attention_scores.h).
  virtual void attention_scores(const ScoreBatch& batch) { cpu_attention_scores(batch); }
  // SubGen's online clustering of keys, one clustering per radius (engine/ops/key_clusters.h).
  virtual void key_clusters(const ClusterBatch& batch) { cpu_key_clusters(batch); }
  // BUZZ's streamed scores over one segment of its cache (engine/ops/cache_scores.h).
  virtual void cache_scores(const CacheScoreBatch& batch) { cpu_cache_scores(batch); }
  // Expected-attention's scores from its queries' statistics (engine/ops/expected_scores.h).
  virtual void expected_scores(const ExpectedScoreBatch& batch) { cpu_expected_scores(batch); }
  // Compactor's chunked non-causal attention column sums (engine/ops/chunk_scores.h).
  virtual void chunk_scores(const ChunkScoreBatch& batch) { cpu_chunk_scores(batch); }
};

// The engine's CPU fallback around a device backend: before each op it asks the device whether it
// supports the shape, runs the op there, and runs the CPU reference instead (the same figures as
// cpu_backend()) when the shape is not supported or the device throws DeviceFailure. Each reason
// is recorded (last_fallback()) and printed once to stderr. select_backend() returns device
// backends wrapped in one of these.
class FallbackBackend final : public Backend {
 public:
  // `label` starts the messages ("cuda attention_errors: out of device memory (...); ran on the
  // CPU"). `device` must outlive this.
  FallbackBackend(std::string label, Backend& device);
  std::string name() const override { return device_.name(); }
  bool parallel_in_one_call() const override { return device_.parallel_in_one_call(); }
  // Every shape runs, on the device or on the CPU.
  bool supports(const OpShape&, std::string* = nullptr) const override { return true; }
  // Each op: its shape, the device's call and the CPU reference's (one line per op).
  void walk_blocks(const WalkBatch& b) override {
    run(
        op_shape(b), [&] { device_.walk_blocks(b); }, [&] { cpu_walk_blocks(b); });
  }
  void attention_errors(const ErrorBatch& b) override {
    run(
        op_shape(b), [&] { device_.attention_errors(b); }, [&] { cpu_attention_errors(b); });
  }
  double tsne_gradient(const TsneGradInput& in, float* grad) override {
    return run(
        op_shape(in), [&] { return device_.tsne_gradient(in, grad); },
        [&] { return cpu_tsne_gradient(in, grad); });
  }
  std::vector<int> kcenter(const float* x, int n, int d, int k, int first) override {
    return run(
        kcenter_shape(n, d, k), [&] { return device_.kcenter(x, n, d, k, first); },
        [&] { return cpu_kcenter(x, n, d, k, first); });
  }
  void attention_scores(const ScoreBatch& b) override {
    run(
        op_shape(b), [&] { device_.attention_scores(b); }, [&] { cpu_attention_scores(b); });
  }
  void key_clusters(const ClusterBatch& b) override {
    run(
        op_shape(b), [&] { device_.key_clusters(b); }, [&] { cpu_key_clusters(b); });
  }
  void cache_scores(const CacheScoreBatch& b) override {
    run(
        op_shape(b), [&] { device_.cache_scores(b); }, [&] { cpu_cache_scores(b); });
  }
  void expected_scores(const ExpectedScoreBatch& b) override {
    run(
        op_shape(b), [&] { device_.expected_scores(b); }, [&] { cpu_expected_scores(b); });
  }
  void chunk_scores(const ChunkScoreBatch& b) override {
    run(
        op_shape(b), [&] { device_.chunk_scores(b); }, [&] { cpu_chunk_scores(b); });
  }

  // Why the most recent op ran on the CPU, or "" when it ran on the device.
  std::string last_fallback() const;
  Backend& device() const { return device_; }

 private:
  // Runs `device` when the device supports `shape`; otherwise, or when it throws DeviceFailure,
  // records why and returns `cpu()`. Other exceptions (input errors) propagate.
  template <typename Device, typename Cpu>
  auto run(const OpShape& shape, Device&& device, Cpu&& cpu) -> decltype(cpu()) {
    std::string why;
    if (!device_.supports(shape, &why)) {
      if (why.empty()) why = "shape not supported";
    } else {
      try {
        if constexpr (std::is_void_v<decltype(cpu())>) {
          device();
          record("");
          return;
        } else {
          auto result = device();
          record("");
          return result;
        }
      } catch (const DeviceFailure& e) {
        why = e.what();
      }
    }
    record(label_ + " " + op_name(shape.op) + ": " + why + "; ran on the CPU");
    return cpu();
  }
  void record(const std::string& why);

  std::string label_;
  Backend& device_;
  mutable std::mutex mutex_;
  std::string last_;
};

// Why the most recent op of any FallbackBackend in this process ran on the CPU, or "" when it ran
// on its device.
std::string last_fallback();

// A device backend's entry in the registry: called once, on first use; returns the backend (which
// lives for the program) or nullptr with `why` (no driver, no device, ...). When it returns one,
// `why` names the device.
using BackendProbe = Backend* (*)(std::string* why);
// Adds a device backend under `id` ("cuda"), in the order registered; called by the backend's
// static registrar (kernels/cuda_backend.cu), so a program has the backends it links. Returns
// true (for the registrar's static initialiser). Throws std::logic_error for a repeated id.
bool register_backend(const std::string& id, BackendProbe probe);
// The ids registered so far.
std::vector<std::string> registered_backends();
// The backends a user can name (the app's combo, sessions, every --backend): "cpu", the device
// backends KVScope has whether this build registered them or not ("cuda": choosing it without
// the kernels says why), the other registered ids, and "auto"; in that order.
std::vector<std::string> backend_choices();
// backend_choices() for help text and messages: "cpu, cuda or auto".
std::string backend_choices_text();

Backend& cpu_backend();
// Whether a device backend registered as `id` answers; `why` says what was found.
bool backend_available(const std::string& id, std::string* why = nullptr);
// backend_available("cuda", why): whether the CUDA kernels are linked and a device answers.
bool cuda_available(std::string* why = nullptr);
// "cpu", "auto" (the first registered device backend that answers, else cpu) or a registered id
// ("cuda"). A device that does not answer throws SettingError with the reason. The returned
// backend lives for the program; device backends come wrapped in a FallbackBackend.
Backend& select_backend(const std::string& which);

}  // namespace kvscope
