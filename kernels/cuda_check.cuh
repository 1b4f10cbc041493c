// CUDA error handling for the kernels: every runtime call goes through KVS_CUDA_CHECK, which turns
// a failure into a CudaFailure exception naming the call, the CUDA error and where it happened.
// The backend (cuda_backend.cu) catches it, reports it and runs that call on the CPU instead, so a
// CUDA problem (out of memory, launch failure, a device that went away) never crashes the app.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <stdexcept>
#include <string>

namespace kvscope::cuda {

class CudaFailure : public std::runtime_error {
 public:
  CudaFailure(cudaError_t code, const std::string& what) : std::runtime_error(what), code_(code) {}
  cudaError_t code() const { return code_; }
  bool out_of_memory() const { return code_ == cudaErrorMemoryAllocation; }

 private:
  cudaError_t code_;
};

// A shape or input the kernels do not handle (e.g. head dims beyond the shared-memory tiles): the
// backend runs that call on the CPU and says why.
class Unsupported : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Test hook (cuda_fail_next_allocation_for_testing): the next DeviceBuffer request fails as if
// the device were out of memory, so the CPU fallback can be exercised on a real device.
inline std::atomic<bool> g_fail_next_allocation{false};

inline void check_cuda(cudaError_t err, const char* call, const char* file, int line) {
  if (err == cudaSuccess) return;
  // Clear the per-thread "last error" so a non-sticky failure (e.g. out of memory) does not
  // leak into the next call; sticky errors stay on the context whatever we do.
  (void)cudaGetLastError();
  throw CudaFailure(err, std::string(call) + " failed: " + cudaGetErrorName(err) + " (" +
                             cudaGetErrorString(err) + ") at " + file + ":" + std::to_string(line));
}

// Checks the launch itself (bad configuration, no kernel image for this device); execution
// errors surface at the next synchronising call, which is checked too.
inline void check_launch(const char* kernel, const char* file, int line) {
  check_cuda(cudaGetLastError(), kernel, file, line);
}

}  // namespace kvscope::cuda

#define KVS_CUDA_CHECK(call) ::kvscope::cuda::check_cuda((call), #call, __FILE__, __LINE__)
#define KVS_CUDA_CHECK_LAUNCH(kernel) \
  ::kvscope::cuda::check_launch("launch of " kernel, __FILE__, __LINE__)

namespace kvscope::cuda {

// The dynamic shared memory a block gets without opting in (cudaFuncSetAttribute).
constexpr size_t kDefaultSmemBytes = 48 * 1024;

// Dynamic shared memory is asked for in whole 32-byte units: ptxas may read a row's last element
// together with the next one as one vector load (the key-clustering kernel's 13-double key row
// was read 16 bytes at element 12, seen by compute-sanitizer memcheck on an H200; the value past
// the end is never used). The padding keeps that read inside the block's allocation.
constexpr size_t kSmemVectorBytes = 32;
inline size_t padded_smem(size_t bytes) {
  return (bytes + kSmemVectorBytes - 1) / kSmemVectorBytes * kSmemVectorBytes;
}

// `bytes` (padded) when a block may have that much dynamic shared memory without opting in, else
// 0 (the kernels' *_smem_bytes answers: the backend declines a shape whose answer is 0).
inline size_t within_default_smem(size_t bytes) {
  const size_t padded = padded_smem(bytes);
  return padded <= kDefaultSmemBytes ? padded : 0;
}

// A grow-only device allocation reused across calls (the backend keeps one per operand so
// repeated calls from the UI do not pay cudaMalloc each time).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { release(); }

  // Ensures at least `bytes` bytes; previous contents are not kept.
  void* reserve(size_t bytes) {
    // Checked before the capacity test so that the next op fails even when its buffers are
    // already big enough.
    if (g_fail_next_allocation.exchange(false))
      throw CudaFailure(cudaErrorMemoryAllocation,
                        "cudaMalloc(" + std::to_string(bytes >> 20) +
                            " MiB) failed: cudaErrorMemoryAllocation (simulated for a test)");
    if (bytes <= capacity_) return ptr_;
    release();
    if (bytes == 0) return nullptr;
    void* p = nullptr;
    check_cuda(cudaMalloc(&p, bytes),
               ("cudaMalloc(" + std::to_string(bytes >> 20) + " MiB)").c_str(), __FILE__, __LINE__);
    ptr_ = p;
    capacity_ = bytes;
    return ptr_;
  }
  template <typename T>
  T* reserve_as(size_t count) {
    return static_cast<T*>(reserve(count * sizeof(T)));
  }
  void release() {
    if (ptr_) cudaFree(ptr_);
    ptr_ = nullptr;
    capacity_ = 0;
  }
  size_t capacity() const { return capacity_; }

 private:
  void* ptr_ = nullptr;
  size_t capacity_ = 0;
};

}  // namespace kvscope::cuda
