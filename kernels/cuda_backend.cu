// The CUDA backend: device probe, device memory (grow-only buffers per op), op dispatch, and its
// entry in the engine's backend registry (register_backend, engine/ops/backend.h). Every CUDA
// failure (out of memory, a rejected launch, an execution error, a shape found unsupported while
// uploading) becomes a DeviceFailure with a clear message; the engine's FallbackBackend then runs
// that call on the CPU reference and records why. An error that leaves the CUDA context unusable
// makes every later call fail the same way. Input errors (the same checks the CPU reference makes)
// propagate unchanged. Nothing here includes the CPU references: the link goes kernels -> engine.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>

#include "engine/ops/backend.h"
#include "kernels/attention_error.cuh"
#include "kernels/attention_scores.cuh"
#include "kernels/cache_scores.cuh"
#include "kernels/chunk_scores.cuh"
#include "kernels/cuda_backend.h"
#include "kernels/cuda_check.cuh"
#include "kernels/expected_scores.cuh"
#include "kernels/kcenter.cuh"
#include "kernels/key_clusters.cuh"
#include "kernels/resident_layers.cuh"
#include "kernels/tsne_grad.cuh"
#include "kernels/walk.cuh"

namespace kvscope {
namespace {

using cuda::CudaFailure;
using cuda::Unsupported;

// Launched once by the probe: proves the driver, the device and this build's kernel image agree.
__global__ void probe_kernel(int* out) {
  *out = 42;
}

class CudaBackend final : public Backend {
 public:
  CudaBackend(int device, const cudaDeviceProp& prop, cudaStream_t stream)
      : device_(device), stream_(stream) {
    const double gib = static_cast<double>(prop.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0);
    char buf[64];
    std::snprintf(buf, sizeof buf, ", sm_%d%d, %.0f GiB)", prop.major, prop.minor, gib);
    name_ = std::string("cuda (") + prop.name + buf;
    smem_optin_ = static_cast<int>(prop.sharedMemPerBlockOptin);
  }

  std::string name() const override { return name_; }
  bool parallel_in_one_call() const override { return true; }

  // Everything runs except what the kernels' tiles cannot hold (known before any upload).
  bool supports(const OpShape& s, std::string* why) const override {
    std::string no;
    if (s.op == Op::attention_errors && s.d > 0 && s.dv > 0 &&
        cuda::attention_error_smem_bytes(s.d, s.dv, smem_optin_, s.float_scores) == 0)
      no = "head dims d=" + std::to_string(s.d) + ", dv=" + std::to_string(s.dv) +
           " exceed the CUDA kernel's tiles";
    else if (s.op == Op::kcenter &&
             cuda::within_default_smem(static_cast<size_t>(s.d) * sizeof(float)) == 0)
      no = std::to_string(s.d) + " features exceed the CUDA kernel's shared-memory centre row";
    else if (s.op == Op::attention_scores && s.d > 0 && s.count > 0 &&
             cuda::attention_scores_smem_bytes(s.d, s.count, smem_optin_) == 0)
      no = "key width d=" + std::to_string(s.d) + " with " + std::to_string(s.count) +
           " query heads per group exceeds the CUDA kernels' tiles";
    else if (s.op == Op::key_clusters && cuda::key_clusters_smem_bytes(s.d) == 0)
      no = "key width d=" + std::to_string(s.d) +
           " exceeds the CUDA clustering kernel's shared-memory key row";
    else if (s.op == Op::cache_scores && cuda::cache_scores_smem_bytes(s.d, s.count) == 0)
      no = "key width d=" + std::to_string(s.d) + " with " + std::to_string(s.count) +
           " query heads per group exceeds the CUDA cache-score kernels' rows";
    else if (s.op == Op::expected_scores && cuda::expected_scores_smem_bytes(s.d) == 0)
      no = "key width d=" + std::to_string(s.d) +
           " exceeds the CUDA expected-attention kernel's tiles";
    else if (s.op == Op::chunk_scores && cuda::chunk_scores_smem_bytes(s.d) == 0)
      no = "key width d=" + std::to_string(s.d) +
           " exceeds the CUDA chunked-attention kernel's shared-memory row";
    if (no.empty()) return true;
    if (why) *why = no;
    return false;
  }

  void walk_blocks(const WalkBatch& b) override {
    guarded([&] {
      const cuda::WalkDeviceArgs a = cuda::upload_walk_batch(b, walk_ws_, stream_);
      if (a.num_blocks == 0) return;
      cuda::launch_walk_blocks(a, stream_);
      cuda::download_walk_outputs(a, b, stream_);
    });
  }

  void attention_errors(const ErrorBatch& b) override {
    guarded([&] {
      const cuda::ErrorDeviceArgs a = cuda::upload_error_batch(b, error_ws_, &resident_, stream_);
      cuda::launch_attention_errors(a, smem_optin_, stream_);
      resident_.mark_ready();  // the exact sides made in this call are enqueued
      cuda::download_error_outputs(a, b, stream_);
    });
  }

  double tsne_gradient(const TsneGradInput& in, float* grad) override {
    if (in.n <= 0) return 0;  // nothing to do; the CPU reference's answer too
    return guarded([&] {
      if (!grad) throw std::invalid_argument("tsne_gradient: no output array");
      const cuda::TsneDeviceArgs a = cuda::upload_tsne_input(in, tsne_ws_, stream_);
      cuda::launch_tsne_gradient(a, stream_);
      return cuda::download_tsne_gradient(a, grad, stream_);
    });
  }

  std::vector<int> kcenter(const float* x, int n, int d, int k, int first) override {
    return guarded([&] {
      const cuda::KcenterDeviceArgs a =
          cuda::upload_kcenter_input(x, n, d, k, first, kcenter_ws_, stream_);
      if (a.k == 0) return std::vector<int>{};
      cuda::launch_kcenter(a, stream_);
      return cuda::download_kcenter_picks(a, stream_);
    });
  }

  void attention_scores(const ScoreBatch& b) override {
    guarded([&] {
      const cuda::ScoreDeviceArgs a = cuda::upload_score_batch(b, score_ws_, &resident_, stream_);
      cuda::launch_attention_scores(a, smem_optin_, stream_);
      cuda::download_score_outputs(a, b, stream_);
    });
  }

  void key_clusters(const ClusterBatch& b) override {
    guarded([&] {
      const cuda::ClusterDeviceArgs a =
          cuda::upload_cluster_batch(b, cluster_ws_, &resident_, stream_);
      cuda::launch_key_clusters(a, stream_);
      cuda::download_cluster_outputs(a, b, stream_);
    });
  }

  void cache_scores(const CacheScoreBatch& b) override {
    guarded([&] {
      const cuda::CacheScoreDeviceArgs a =
          cuda::upload_cache_score_batch(b, cache_score_ws_, &resident_, stream_);
      cuda::launch_cache_scores(a, stream_);
      cuda::download_cache_scores(a, b, stream_);
    });
  }

  void expected_scores(const ExpectedScoreBatch& b) override {
    guarded([&] {
      const cuda::ExpectedDeviceArgs a = cuda::upload_expected_batch(b, expected_ws_, stream_);
      cuda::launch_expected_scores(a, stream_);
      cuda::download_expected_scores(a, b, stream_);
    });
  }

  void chunk_scores(const ChunkScoreBatch& b) override {
    guarded([&] {
      const cuda::ChunkDeviceArgs a = cuda::upload_chunk_batch(b, chunk_ws_, stream_);
      cuda::launch_chunk_scores(a, stream_);
      cuda::download_chunk_scores(a, b, stream_);
    });
  }

 private:
  // Runs `gpu`; a CUDA failure or a shape found unsupported becomes a DeviceFailure (the engine's
  // FallbackBackend runs the CPU reference and reports it). One op at a time: the app's worker
  // and background jobs may call concurrently.
  template <typename Gpu>
  auto guarded(Gpu&& gpu) -> decltype(gpu()) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!broken_.empty())
      throw DeviceFailure("the CUDA context is unusable since an earlier failure (" + broken_ +
                          ")");
    for (bool retried = false;; retried = true) {
      try {
        const cudaError_t set = cudaSetDevice(device_);  // the calling thread may be new
        if (set != cudaSuccess) cuda::check_cuda(set, "cudaSetDevice", __FILE__, __LINE__);
        return gpu();
      } catch (const Unsupported& e) {
        throw DeviceFailure(e.what());
      } catch (const CudaFailure& e) {
        if (e.out_of_memory()) {
          // Resident layers may hold the memory this op needs: the first time, they go (with
          // every buffer) and the op runs again on the device; then the CPU runs it.
          const bool had_resident = resident_.stats().entries > 0;
          release_buffers();
          if (!retried && had_resident) {
            resident_.count_retry();
            continue;
          }
          throw DeviceFailure(std::string("out of device memory (") + e.what() + ")");
        }
        // Launch configuration errors leave the context usable; execution errors (illegal
        // address, launch failure) are sticky. Ask the device which it is.
        const cudaError_t sync = cudaDeviceSynchronize();
        (void)cudaGetLastError();
        if (sync != cudaSuccess)
          broken_ = e.what();
        else
          release_buffers();
        throw DeviceFailure(e.what());
      }
    }
  }

 public:
  // The resident layer copies (kernels/resident_layers.cuh), under the same lock as the ops.
  ResidentLayerStats resident_stats() {
    std::lock_guard<std::mutex> lock(mutex_);
    return resident_.stats();
  }
  void set_resident_budget(size_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    resident_.set_budget(bytes);
  }
  void reset_resident() {
    std::lock_guard<std::mutex> lock(mutex_);
    resident_.release();
    resident_.reset_stats();
  }
  void set_resident_staging_chunk(size_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    resident_.set_staging_chunk(bytes);
  }

 private:
  void release_buffers() {
    resident_.release();
    walk_ws_.release();
    error_ws_.release();
    tsne_ws_.release();
    kcenter_ws_.release();
    score_ws_.release();
    cluster_ws_.release();
    cache_score_ws_.release();
    expected_ws_.release();
    chunk_ws_.release();
  }

  int device_;
  cudaStream_t stream_;
  std::string name_;
  int smem_optin_ = static_cast<int>(cuda::kDefaultSmemBytes);
  std::mutex mutex_;
  std::string broken_;  // the failure that made the context unusable, when one did
  cuda::WalkWorkspace walk_ws_;
  cuda::ErrorWorkspace error_ws_;
  cuda::TsneWorkspace tsne_ws_;
  cuda::KcenterWorkspace kcenter_ws_;
  cuda::ScoreWorkspace score_ws_;
  cuda::ClusterWorkspace cluster_ws_;
  cuda::CacheScoreWorkspace cache_score_ws_;
  cuda::ExpectedWorkspace expected_ws_;
  cuda::ChunkWorkspace chunk_ws_;
  cuda::ResidentLayers resident_;
};

struct Probe {
  CudaBackend* backend = nullptr;
  std::string why;
};

std::string error_text(cudaError_t err) {
  return std::string(cudaGetErrorName(err)) + ": " + cudaGetErrorString(err);
}

Probe probe_device() {
  Probe p;
  if (const char* off = std::getenv("KVSCOPE_DISABLE_CUDA");
      off && *off && std::string(off) != "0") {
    p.why = "CUDA disabled by KVSCOPE_DISABLE_CUDA";
    return p;
  }
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    p.why = "cudaGetDeviceCount failed (" + error_text(err) +
            "): no usable NVIDIA driver or device on this machine";
    return p;
  }
  if (count == 0) {
    p.why = "the CUDA driver reports no device";
    return p;
  }
  const int device = 0;
  cudaDeviceProp prop{};
  if ((err = cudaGetDeviceProperties(&prop, device)) != cudaSuccess ||
      (err = cudaSetDevice(device)) != cudaSuccess) {
    (void)cudaGetLastError();
    p.why = "CUDA device 0 cannot be opened (" + error_text(err) + ")";
    return p;
  }
  // A test launch: fails with "no kernel image" on GPUs older than this build's sm_90 target.
  int* flag = nullptr;
  int value = 0;
  err = cudaMalloc(&flag, sizeof(int));
  if (err == cudaSuccess) {
    probe_kernel<<<1, 1>>>(flag);
    err = cudaGetLastError();
    if (err == cudaSuccess) err = cudaMemcpy(&value, flag, sizeof(int), cudaMemcpyDeviceToHost);
    cudaFree(flag);
  }
  if (err != cudaSuccess || value != 42) {
    (void)cudaGetLastError();
    p.why = std::string("CUDA device ") + prop.name + " (sm_" + std::to_string(prop.major) +
            std::to_string(prop.minor) + ") cannot run this build's kernels (built for sm_90): " +
            (err != cudaSuccess ? error_text(err) : std::string("probe kernel wrote nothing"));
    return p;
  }
  cudaStream_t stream = nullptr;
  if ((err = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking)) != cudaSuccess) {
    (void)cudaGetLastError();
    p.why = "cudaStreamCreate failed (" + error_text(err) + ")";
    return p;
  }
  // Intentionally never destroyed: it lives for the program, and CUDA's own teardown at exit
  // must not race a destructor that frees device memory.
  p.backend = new CudaBackend(device, prop, stream);
  p.why = p.backend->name();
  return p;
}

const Probe& probe() {
  static const Probe p = probe_device();
  return p;
}

// ---- benchmark timers --------------------------------------------------------------------------

class EventTimer {
 public:
  EventTimer() {
    KVS_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    KVS_CUDA_CHECK(cudaEventCreate(&start_));
    KVS_CUDA_CHECK(cudaEventCreate(&stop_));
  }
  ~EventTimer() {
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
    cudaStreamDestroy(stream_);
  }
  EventTimer(const EventTimer&) = delete;
  EventTimer& operator=(const EventTimer&) = delete;
  cudaStream_t stream() const { return stream_; }
  template <typename Launch>
  double time(Launch&& launch) {
    KVS_CUDA_CHECK(cudaEventRecord(start_, stream_));
    launch();
    KVS_CUDA_CHECK(cudaEventRecord(stop_, stream_));
    KVS_CUDA_CHECK(cudaEventSynchronize(stop_));
    float ms = 0;
    KVS_CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_));
    return ms;
  }

 private:
  cudaStream_t stream_ = nullptr;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
};

void require_device() {
  if (!probe().backend) throw std::runtime_error("no CUDA device: " + probe().why);
  KVS_CUDA_CHECK(cudaSetDevice(0));
}

class WalkTimer final : public GpuOpTimer {
 public:
  explicit WalkTimer(const WalkBatch& b) {
    args_ = cuda::upload_walk_batch(b, ws_, timer_.stream());
    KVS_CUDA_CHECK(cudaStreamSynchronize(timer_.stream()));
  }
  double run_ms() override {
    return timer_.time([&] { cuda::launch_walk_blocks(args_, timer_.stream()); });
  }

 private:
  EventTimer timer_;
  cuda::WalkWorkspace ws_;
  cuda::WalkDeviceArgs args_;
};

// exact_kept: the exact side is computed once here and each run times the approximate side
// alone, as a later call over a resident layer runs.
class ErrorTimer final : public GpuOpTimer {
 public:
  ErrorTimer(const ErrorBatch& b, bool exact_kept) {
    cudaDeviceProp prop{};
    KVS_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    smem_optin_ = static_cast<int>(prop.sharedMemPerBlockOptin);
    args_ = cuda::upload_error_batch(b, ws_, nullptr, timer_.stream());
    if (exact_kept) {
      cuda::launch_attention_errors(args_, smem_optin_, timer_.stream());
      KVS_CUDA_CHECK(cudaStreamSynchronize(timer_.stream()));
      args_.compute_exact = false;
    }
  }
  double run_ms() override {
    return timer_.time([&] { cuda::launch_attention_errors(args_, smem_optin_, timer_.stream()); });
  }

 private:
  EventTimer timer_;
  cuda::ErrorWorkspace ws_;
  cuda::ErrorDeviceArgs args_;
  int smem_optin_ = 0;
};

class TsneTimer final : public GpuOpTimer {
 public:
  explicit TsneTimer(const TsneGradInput& in) {
    args_ = cuda::upload_tsne_input(in, ws_, timer_.stream());
    KVS_CUDA_CHECK(cudaStreamSynchronize(timer_.stream()));
  }
  double run_ms() override {
    return timer_.time([&] { cuda::launch_tsne_gradient(args_, timer_.stream()); });
  }

 private:
  EventTimer timer_;
  cuda::TsneWorkspace ws_;
  cuda::TsneDeviceArgs args_;
};

class KcenterTimer final : public GpuOpTimer {
 public:
  KcenterTimer(const float* x, int n, int d, int k, int first) {
    args_ = cuda::upload_kcenter_input(x, n, d, k, first, ws_, timer_.stream());
    KVS_CUDA_CHECK(cudaStreamSynchronize(timer_.stream()));
  }
  double run_ms() override {
    return timer_.time([&] { cuda::launch_kcenter(args_, timer_.stream()); });
  }

 private:
  EventTimer timer_;
  cuda::KcenterWorkspace ws_;
  cuda::KcenterDeviceArgs args_;
};

class ScoreTimer final : public GpuOpTimer {
 public:
  explicit ScoreTimer(const ScoreBatch& b) {
    cudaDeviceProp prop{};
    KVS_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    smem_optin_ = static_cast<int>(prop.sharedMemPerBlockOptin);
    args_ = cuda::upload_score_batch(b, ws_, nullptr, timer_.stream());
    KVS_CUDA_CHECK(cudaStreamSynchronize(timer_.stream()));
  }
  double run_ms() override {
    return timer_.time([&] { cuda::launch_attention_scores(args_, smem_optin_, timer_.stream()); });
  }

 private:
  EventTimer timer_;
  cuda::ScoreWorkspace ws_;
  cuda::ScoreDeviceArgs args_;
  int smem_optin_ = 0;
};

class ClusterTimer final : public GpuOpTimer {
 public:
  explicit ClusterTimer(const ClusterBatch& b) {
    args_ = cuda::upload_cluster_batch(b, ws_, nullptr, timer_.stream());
    KVS_CUDA_CHECK(cudaStreamSynchronize(timer_.stream()));
  }
  double run_ms() override {
    return timer_.time([&] { cuda::launch_key_clusters(args_, timer_.stream()); });
  }

 private:
  EventTimer timer_;
  cuda::ClusterWorkspace ws_;
  cuda::ClusterDeviceArgs args_;
};

// Replays the segment's two launches (the accumulated scores grow with each replay; the work
// does not depend on them).
class CacheScoreTimer final : public GpuOpTimer {
 public:
  explicit CacheScoreTimer(const CacheScoreBatch& b) {
    args_ = cuda::upload_cache_score_batch(b, ws_, nullptr, timer_.stream());
  }
  double run_ms() override {
    return timer_.time([&] { cuda::launch_cache_scores(args_, timer_.stream()); });
  }

 private:
  EventTimer timer_;
  cuda::CacheScoreWorkspace ws_;
  cuda::CacheScoreDeviceArgs args_;
};

// Replays expected-attention's launches over the uploaded batch.
class ExpectedTimer final : public GpuOpTimer {
 public:
  explicit ExpectedTimer(const ExpectedScoreBatch& b) {
    args_ = cuda::upload_expected_batch(b, ws_, timer_.stream());
    KVS_CUDA_CHECK(cudaStreamSynchronize(timer_.stream()));
  }
  double run_ms() override {
    return timer_.time([&] { cuda::launch_expected_scores(args_, timer_.stream()); });
  }

 private:
  EventTimer timer_;
  cuda::ExpectedWorkspace ws_;
  cuda::ExpectedDeviceArgs args_;
};

// Replays compactor's chunked-attention launches over the uploaded batch.
class ChunkTimer final : public GpuOpTimer {
 public:
  explicit ChunkTimer(const ChunkScoreBatch& b) {
    args_ = cuda::upload_chunk_batch(b, ws_, timer_.stream());
    KVS_CUDA_CHECK(cudaStreamSynchronize(timer_.stream()));
  }
  double run_ms() override {
    return timer_.time([&] { cuda::launch_chunk_scores(args_, timer_.stream()); });
  }

 private:
  EventTimer timer_;
  cuda::ChunkWorkspace ws_;
  cuda::ChunkDeviceArgs args_;
};

// A host-to-device copy of `bytes` from pageable host memory (as the app's captures are): what
// the device ops' timings leave out.
class UploadTimer final : public GpuOpTimer {
 public:
  UploadTimer(const void* host, size_t bytes) : host_(host), bytes_(bytes) {
    dev_ = buf_.reserve_as<unsigned char>(bytes);
  }
  double run_ms() override {
    return timer_.time([&] {
      KVS_CUDA_CHECK(cudaMemcpyAsync(dev_, host_, bytes_, cudaMemcpyHostToDevice, timer_.stream()));
    });
  }

 private:
  EventTimer timer_;
  cuda::DeviceBuffer buf_;
  const void* host_;
  size_t bytes_;
  unsigned char* dev_ = nullptr;
};

template <typename T, typename... Args>
std::unique_ptr<GpuOpTimer> make_timer(Args&&... args) {
  require_device();
  try {
    return std::make_unique<T>(std::forward<Args>(args)...);
  } catch (const CudaFailure& e) {
    throw std::runtime_error(e.what());
  } catch (const Unsupported& e) {
    throw std::runtime_error(e.what());
  }
}

}  // namespace

Backend* cuda_backend_instance(std::string* why) {
  const Probe& p = probe();
  if (why) *why = p.why;
  return p.backend;
}

namespace {
// The registrar: the engine finds "cuda" in its registry in every program that links the kernels
// (the executables link them whole: kvscope_compute in CMakeLists.txt), and probes it on first
// use.
const bool kRegistered = register_backend("cuda", cuda_backend_instance);
}  // namespace

void cuda_fail_next_allocation_for_testing() {
  cuda::g_fail_next_allocation = true;
}

ResidentLayerStats cuda_resident_stats() {
  return probe().backend ? probe().backend->resident_stats() : ResidentLayerStats{};
}
void cuda_set_resident_budget(size_t bytes) {
  if (probe().backend) probe().backend->set_resident_budget(bytes);
}
void cuda_reset_resident_for_testing() {
  if (probe().backend) probe().backend->reset_resident();
}
void cuda_set_resident_staging_chunk_for_testing(size_t bytes) {
  if (probe().backend) probe().backend->set_resident_staging_chunk(bytes);
}
bool cuda_set_emulated_device_memory_for_testing(size_t bytes) {
#ifdef KVSCOPE_CUDA_EMULATED
  std::lock_guard<std::mutex> lock(emu::g_mem_mutex);
  emu::g_device_capacity = bytes ? bytes : size_t(80) << 30;
  return true;
#else
  (void)bytes;
  return false;
#endif
}
size_t cuda_emulated_device_memory_used_for_testing() {
#ifdef KVSCOPE_CUDA_EMULATED
  std::lock_guard<std::mutex> lock(emu::g_mem_mutex);
  return emu::g_device_used;
#else
  return 0;
#endif
}
bool cuda_host_to_device_bytes_for_testing(uint64_t* bytes) {
#ifdef KVSCOPE_CUDA_EMULATED
  *bytes = emu::g_h2d_bytes.load();
  return true;
#else
  (void)bytes;
  return false;
#endif
}

std::unique_ptr<GpuOpTimer> cuda_walk_timer(const WalkBatch& batch) {
  return make_timer<WalkTimer>(batch);
}
std::unique_ptr<GpuOpTimer> cuda_error_timer(const ErrorBatch& batch, bool exact_kept) {
  return make_timer<ErrorTimer>(batch, exact_kept);
}
std::unique_ptr<GpuOpTimer> cuda_upload_timer(const void* host, size_t bytes) {
  return make_timer<UploadTimer>(host, bytes);
}
std::unique_ptr<GpuOpTimer> cuda_tsne_timer(const TsneGradInput& in) {
  return make_timer<TsneTimer>(in);
}
std::unique_ptr<GpuOpTimer> cuda_kcenter_timer(const float* x, int n, int d, int k, int first) {
  return make_timer<KcenterTimer>(x, n, d, k, first);
}
std::unique_ptr<GpuOpTimer> cuda_score_timer(const ScoreBatch& batch) {
  return make_timer<ScoreTimer>(batch);
}
std::unique_ptr<GpuOpTimer> cuda_cluster_timer(const ClusterBatch& batch) {
  return make_timer<ClusterTimer>(batch);
}
std::unique_ptr<GpuOpTimer> cuda_cache_score_timer(const CacheScoreBatch& batch) {
  return make_timer<CacheScoreTimer>(batch);
}
std::unique_ptr<GpuOpTimer> cuda_expected_timer(const ExpectedScoreBatch& batch) {
  return make_timer<ExpectedTimer>(batch);
}
std::unique_ptr<GpuOpTimer> cuda_chunk_timer(const ChunkScoreBatch& batch) {
  return make_timer<ChunkTimer>(batch);
}

}  // namespace kvscope
