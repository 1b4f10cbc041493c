// The CUDA backend's shared parts (the class is kernels/cuda_backend.cuh; each op's method is in
// its own kernels/<op>.cu): the device probe and the backend's entry in the engine's registry
// (register_backend, engine/ops/backend.h), failure handling, the resident layers' hooks and the
// benchmark timers. Nothing here includes the CPU references: the link goes kernels -> engine.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "engine/ops/backend.h"
#include "kernels/cuda_backend.cuh"
#include "kernels/cuda_backend.h"
#include "kernels/cuda_check.cuh"
#include "kernels/resident_layers.cuh"

namespace kvscope {
namespace {

using cuda::CudaFailure;
using cuda::Unsupported;

// Launched once by the probe: proves the driver, the device and this build's kernel image agree.
__global__ void probe_kernel(int* out) {
  *out = 42;
}

}  // namespace

namespace cuda {

CudaBackend::CudaBackend(int device, const cudaDeviceProp& prop, cudaStream_t stream,
                         bool keep_launches)
    : device_(device), stream_(stream), keep_launches_(keep_launches) {
  const double gib = static_cast<double>(prop.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0);
  char buf[64];
  std::snprintf(buf, sizeof buf, ", sm_%d%d, %.0f GiB)", prop.major, prop.minor, gib);
  name_ = std::string("cuda (") + prop.name + buf;
  smem_optin_ = static_cast<int>(prop.sharedMemPerBlockOptin);
}

void CudaBackend::check_usable() const {
  if (!broken_.empty())
    throw DeviceFailure("the CUDA context is unusable since an earlier failure (" + broken_ + ")");
}

void CudaBackend::set_device() const {
  const cudaError_t set = cudaSetDevice(device_);
  if (set != cudaSuccess) check_cuda(set, "cudaSetDevice", __FILE__, __LINE__);
}

bool CudaBackend::recover(const CudaFailure& e, bool retried) {
  if (e.out_of_memory()) {
    // Resident layers may hold the memory this op needs: the first time, they go (with every
    // buffer) and the op runs again on the device; then the CPU runs it.
    const bool had_resident = resident_.stats().entries > 0;
    release_buffers();
    if (!retried && had_resident) {
      resident_.count_retry();
      return true;
    }
    return false;
  }
  // Launch configuration errors leave the context usable; execution errors (illegal address,
  // launch failure) are sticky. Ask the device which it is.
  const cudaError_t sync = cudaDeviceSynchronize();
  (void)cudaGetLastError();
  if (sync != cudaSuccess)
    broken_ = e.what();
  else
    release_buffers();
  return false;
}

std::string CudaBackend::failure_text(const CudaFailure& e) {
  return e.out_of_memory() ? std::string("out of device memory (") + e.what() + ")" : e.what();
}

void CudaBackend::release_buffers() {
  resident_.release();
  for (std::unique_ptr<OpWorkspace>& w : workspaces_)
    if (w) w->release();
}

ResidentLayerStats CudaBackend::resident_stats() {
  std::lock_guard<std::mutex> lock(mutex_);
  return resident_.stats();
}
void CudaBackend::set_resident_budget(size_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  resident_.set_budget(bytes);
}
void CudaBackend::reset_resident() {
  std::lock_guard<std::mutex> lock(mutex_);
  resident_.release();
  resident_.reset_stats();
}
void CudaBackend::set_resident_staging_chunk(size_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  resident_.set_staging_chunk(bytes);
}

void CudaBackend::replay_kept_launch() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (kept_launch_) kept_launch_();
}

}  // namespace cuda

namespace {

using cuda::CudaBackend;

struct Probe {
  CudaBackend* backend = nullptr;
  std::string why;
  cudaDeviceProp prop{};  // of device 0, for the timers' backends
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
  p.prop = prop;
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

// Each step ran once on a backend of its own (its own buffers, so each step's device inputs stay
// as its call uploaded them) on the timer's stream; a run replays every step's kept launch in
// order between two events.
class OpTimer final : public GpuOpTimer {
 public:
  explicit OpTimer(const std::vector<std::function<void(Backend&)>>& steps) {
    for (const auto& step : steps) {
      backends_.push_back(std::make_unique<CudaBackend>(0, probe().prop, timer_.stream(), true));
      try {
        step(*backends_.back());
      } catch (const DeviceFailure& e) {
        throw std::runtime_error(e.what());
      }
    }
    KVS_CUDA_CHECK(cudaStreamSynchronize(timer_.stream()));
  }
  double run_ms() override {
    return timer_.time([&] {
      for (auto& b : backends_) b->replay_kept_launch();
    });
  }

 private:
  EventTimer timer_;  // first: destroyed after the backends that use its stream
  std::vector<std::unique_ptr<CudaBackend>> backends_;
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

std::unique_ptr<GpuOpTimer> cuda_op_timer(const std::vector<std::function<void(Backend&)>>& steps) {
  return make_timer<OpTimer>(steps);
}
std::unique_ptr<GpuOpTimer> cuda_upload_timer(const void* host, size_t bytes) {
  return make_timer<UploadTimer>(host, bytes);
}

}  // namespace kvscope
