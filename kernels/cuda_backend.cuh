// The CUDA backend's class, seen by every op's kernel file: each kernels/<op>.cu defines its own
// `CudaBackend::<op>` (check the shape, upload, launch, download) next to its kernels, so an op's
// device code is one file and this class holds one line per op. The probe, the registry entry,
// the timers and the device memory shared by the ops are kernels/cuda_backend.cu.
//
// Every CUDA failure (out of memory, a rejected launch, an execution error, a shape found
// unsupported) becomes a DeviceFailure with a clear message (guarded()); the engine's
// FallbackBackend then runs that call on the CPU reference and records why. An error that leaves
// the CUDA context unusable makes every later call fail the same way. Input errors (the same
// checks the CPU reference makes) propagate unchanged.
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/ops/backend.h"
#include "kernels/cuda_check.cuh"
#include "kernels/resident_layers.cuh"

namespace kvscope::cuda {

// An op's device buffers (grow-only, kept between calls). Each op's workspace derives from this
// so that the backend holds them by op without knowing their types.
struct OpWorkspace {
  virtual ~OpWorkspace() = default;
  virtual void release() = 0;
};

class CudaBackend final : public Backend {
 public:
  // `keep_launches`: each op's launch is kept for replay_kept_launch() (the benchmark timers).
  CudaBackend(int device, const cudaDeviceProp& prop, cudaStream_t stream,
              bool keep_launches = false);

  std::string name() const override { return name_; }
  bool parallel_in_one_call() const override { return true; }
  // supports() is Backend's (every shape): an op whose kernels' tiles cannot hold a shape throws
  // DeviceFailure saying so before any upload, and the fallback runs the CPU reference.

  // One per op, each defined in its own kernels/<op>.cu.
  void walk_blocks(const WalkBatch& b) override;
  void attention_errors(const ErrorBatch& b) override;
  double tsne_gradient(const TsneGradInput& in, float* grad) override;
  std::vector<int> kcenter(const float* x, int n, int d, int k, int first) override;
  void attention_scores(const ScoreBatch& b) override;
  void key_clusters(const ClusterBatch& b) override;
  void cache_scores(const CacheScoreBatch& b) override;
  void expected_scores(const ExpectedScoreBatch& b) override;
  void chunk_scores(const ChunkScoreBatch& b) override;

  // The resident layer copies (kernels/resident_layers.cuh), under the same lock as the ops.
  ResidentLayerStats resident_stats();
  void set_resident_budget(size_t bytes);
  void reset_resident();
  void set_resident_staging_chunk(size_t bytes);

  // Runs the kernels of the last op again over the same device inputs (keep_launches only).
  void replay_kept_launch();
  cudaStream_t stream() const { return stream_; }

 private:
  // Runs `gpu`; a CUDA failure or a shape found unsupported becomes a DeviceFailure (the engine's
  // FallbackBackend runs the CPU reference and reports it). One op at a time: the app's worker
  // and background jobs may call concurrently.
  template <typename Gpu>
  auto guarded(Gpu&& gpu) -> decltype(gpu()) {
    std::lock_guard<std::mutex> lock(mutex_);
    check_usable();
    for (bool retried = false;; retried = true) {
      try {
        set_device();  // the calling thread may be new
        return gpu();
      } catch (const Unsupported& e) {
        throw DeviceFailure(e.what());
      } catch (const CudaFailure& e) {
        if (!recover(e, retried)) throw DeviceFailure(failure_text(e));
      }
    }
  }
  // Launches through here: the launch runs, and is kept for replay when keep_launches.
  template <typename Launch>
  void launch(Launch&& run) {
    run();
    if (keep_launches_) kept_launch_ = std::forward<Launch>(run);
  }
  // The op's workspace, made on first use.
  template <typename Workspace>
  Workspace& workspace(Op op) {
    std::unique_ptr<OpWorkspace>& w = workspaces_[static_cast<size_t>(op)];
    if (!w) w = std::make_unique<Workspace>();
    return static_cast<Workspace&>(*w);
  }

  void check_usable() const;  // throws DeviceFailure once the context is unusable
  void set_device() const;
  // After a CUDA failure: true when the op should run again on the device (out of memory with
  // layers resident, the first time); otherwise marks the context unusable where it is.
  bool recover(const CudaFailure& e, bool retried);
  static std::string failure_text(const CudaFailure& e);
  void release_buffers();

  int device_;
  cudaStream_t stream_;
  std::string name_;
  int smem_optin_ = static_cast<int>(kDefaultSmemBytes);
  std::mutex mutex_;
  std::string broken_;  // the failure that made the context unusable, when one did
  std::array<std::unique_ptr<OpWorkspace>, kOpCount> workspaces_;
  ResidentLayers resident_;
  bool keep_launches_ = false;
  std::function<void()> kept_launch_;
};

}  // namespace kvscope::cuda
