// CPU emulation of the parts of the CUDA runtime and SIMT execution model that kernels/*.cu use,
// installed as <cuda_runtime.h> by kernels/emu/run_emulated_parity.sh (see there for what it does
// and does not check). A block runs its threads as ucontext fibers; __syncthreads / __syncwarp /
// shuffles are barriers the scheduler releases when every live thread of the block / warp has
// reached one (a barrier that never fills aborts with "barrier divergence"). Blocks run one after
// another, so __shared__ is a function-local static. Device memory is host memory, poisoned with
// 0xFF on allocation; it is counted against an emulated capacity (emu::g_device_capacity, for
// out-of-memory tests), and every host-to-device byte copied is counted (emu::g_h2d_bytes).

#pragma once
#include <ucontext.h>

#include <algorithm>
#include <atomic>
#include <cfloat>
#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
// For code that asks whether it runs under this emulation (test hooks in kernels/cuda_backend.cu).
#define KVSCOPE_CUDA_EMULATED 1

namespace emu {
inline std::atomic<unsigned long long> g_h2d_bytes{0};  // host-to-device bytes copied so far
inline std::mutex g_mem_mutex;
inline std::map<void*, size_t> g_allocs;  // live device allocations and their sizes
inline size_t g_device_used = 0;
inline size_t g_device_capacity = size_t(80) << 30;  // cudaMalloc beyond it: out of memory
}  // namespace emu

struct uint3e {
  unsigned x = 0, y = 0, z = 0;
};
struct dim3 {
  unsigned x, y, z;
  dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
inline uint3e threadIdx, blockIdx, blockDim, gridDim;

inline int min(int a, int b) {
  return a < b ? a : b;
}
inline int max(int a, int b) {
  return a > b ? a : b;
}

typedef int cudaError_t;
enum : int { cudaSuccess = 0, cudaErrorMemoryAllocation = 2, cudaErrorInvalidValue = 1 };
enum cudaMemcpyKind { cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice };
enum { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
enum { cudaStreamNonBlocking = 1 };
enum { cudaEventDisableTiming = 2 };
typedef void* cudaStream_t;
typedef void* cudaEvent_t;
struct cudaDeviceProp {
  char name[256] = "EMULATED";
  int major = 9, minor = 0;
  size_t totalGlobalMem = size_t(80) << 30;
  size_t sharedMemPerBlockOptin = 227 * 1024;
};
struct cudaFuncAttributes {
  int x;
};
inline const char* cudaGetErrorName(cudaError_t) {
  return "cudaErrorEmu";
}
inline const char* cudaGetErrorString(cudaError_t) {
  return "emulated error";
}
inline cudaError_t cudaGetLastError() {
  return cudaSuccess;
}
inline cudaError_t cudaGetDeviceCount(int* c) {
  *c = 1;
  return cudaSuccess;
}
inline cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int) {
  *p = cudaDeviceProp{};
  return cudaSuccess;
}
inline cudaError_t cudaSetDevice(int) {
  return cudaSuccess;
}
inline cudaError_t cudaDeviceSynchronize() {
  return cudaSuccess;
}
inline cudaError_t cudaMalloc(void** p, size_t n) {
  const size_t rounded = (n + 255) / 256 * 256;
  std::lock_guard<std::mutex> lock(emu::g_mem_mutex);
  *p = nullptr;
  if (emu::g_device_used + rounded > emu::g_device_capacity) return cudaErrorMemoryAllocation;
  *p = std::aligned_alloc(256, rounded);
  if (!*p) return cudaErrorMemoryAllocation;
  // Poison so uninitialised reads show up as garbage/NaN.
  std::memset(*p, 0xFF, rounded);
  emu::g_allocs[*p] = rounded;
  emu::g_device_used += rounded;
  return cudaSuccess;
}
template <typename T>
cudaError_t cudaMalloc(T** p, size_t n) {
  return cudaMalloc(reinterpret_cast<void**>(p), n);
}
inline cudaError_t cudaFree(void* p) {
  if (!p) return cudaSuccess;
  {
    std::lock_guard<std::mutex> lock(emu::g_mem_mutex);
    auto it = emu::g_allocs.find(p);
    if (it != emu::g_allocs.end()) {
      emu::g_device_used -= it->second;
      emu::g_allocs.erase(it);
    }
  }
  std::free(p);
  return cudaSuccess;
}
inline cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total) {
  std::lock_guard<std::mutex> lock(emu::g_mem_mutex);
  *total = emu::g_device_capacity;
  *free_bytes =
      emu::g_device_capacity > emu::g_device_used ? emu::g_device_capacity - emu::g_device_used : 0;
  return cudaSuccess;
}
// Pinned host memory is plain host memory here (not counted as device memory).
inline cudaError_t cudaMallocHost(void** p, size_t n) {
  *p = std::malloc(n);
  return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
inline cudaError_t cudaFreeHost(void* p) {
  std::free(p);
  return cudaSuccess;
}
inline cudaError_t cudaMemcpy(void* d, const void* s, size_t n, cudaMemcpyKind kind) {
  if (kind == cudaMemcpyHostToDevice) emu::g_h2d_bytes += n;
  std::memcpy(d, s, n);
  return cudaSuccess;
}
inline cudaError_t cudaMemcpyAsync(void* d, const void* s, size_t n, cudaMemcpyKind kind,
                                   cudaStream_t = nullptr) {
  if (kind == cudaMemcpyHostToDevice) emu::g_h2d_bytes += n;
  std::memcpy(d, s, n);
  return cudaSuccess;
}
inline cudaError_t cudaStreamSynchronize(cudaStream_t) {
  return cudaSuccess;
}
inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, int) {
  *s = nullptr;
  return cudaSuccess;
}
inline cudaError_t cudaStreamDestroy(cudaStream_t) {
  return cudaSuccess;
}
inline cudaError_t cudaEventCreate(cudaEvent_t* e) {
  *e = nullptr;
  return cudaSuccess;
}
inline cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned) {
  *e = nullptr;
  return cudaSuccess;
}
inline cudaError_t cudaEventDestroy(cudaEvent_t) {
  return cudaSuccess;
}
inline cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t = nullptr) {
  return cudaSuccess;
}
inline cudaError_t cudaEventSynchronize(cudaEvent_t) {
  return cudaSuccess;
}
inline cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t, cudaEvent_t) {
  *ms = 0;
  return cudaSuccess;
}
template <typename F>
cudaError_t cudaFuncSetAttribute(F, int, int) {
  return cudaSuccess;
}

namespace emu {
enum State { kReady, kWaitBlock, kWaitWarp, kDone };
struct Fiber {
  ucontext_t ctx;
  State state = kReady;
  std::vector<char> stack;
};
inline ucontext_t g_sched;
inline std::vector<Fiber> g_fibers;
inline int g_cur = -1;
inline std::vector<unsigned char> g_dyn;
inline double g_xchg[64][32];
inline std::function<void()> g_body;
inline bool g_reverse = std::getenv("EMU_REVERSE") != nullptr;
inline unsigned char* dynamic_smem() {
  return g_dyn.data();
}
inline void yield_as(State s) {
  g_fibers[g_cur].state = s;
  swapcontext(&g_fibers[g_cur].ctx, &g_sched);
}
inline void entry() {
  g_body();
  g_fibers[g_cur].state = kDone;
  swapcontext(&g_fibers[g_cur].ctx, &g_sched);
}
inline void set_thread(int t) {
  g_cur = t;
  threadIdx.x = t % blockDim.x;
}
inline void launch(dim3 grid, dim3 block, size_t smem, std::function<void()> body) {
  const int n = block.x;
  gridDim.x = grid.x;
  gridDim.y = grid.y;
  gridDim.z = 1;
  blockDim.x = block.x;
  blockDim.y = 1;
  blockDim.z = 1;
  g_body = body;
  for (unsigned by = 0; by < grid.y; ++by)
    for (unsigned bx = 0; bx < grid.x; ++bx) {
      blockIdx.x = bx;
      blockIdx.y = by;
      g_dyn.assign(smem + 16, 0xCD);
      g_fibers.assign(n, Fiber{});
      for (int t = 0; t < n; ++t) {
        auto& f = g_fibers[t];
        f.stack.resize(256 * 1024);
        getcontext(&f.ctx);
        f.ctx.uc_stack.ss_sp = f.stack.data();
        f.ctx.uc_stack.ss_size = f.stack.size();
        f.ctx.uc_link = nullptr;
        makecontext(&f.ctx, entry, 0);
      }
      for (;;) {
        bool any = false, progressed = false;
        for (int k = 0; k < n; ++k) {
          int t = g_reverse ? n - 1 - k : k;
          if (g_fibers[t].state == kReady) {
            set_thread(t);
            swapcontext(&g_sched, &g_fibers[t].ctx);
            progressed = true;
          }
        }
        for (int t = 0; t < n; ++t) any |= g_fibers[t].state != kDone;
        if (!any) break;
        // warp barriers
        for (int w = 0; w * 32 < n; ++w) {
          bool all = true, some = false;
          for (int t = w * 32; t < std::min(n, w * 32 + 32); ++t) {
            if (g_fibers[t].state == kDone) continue;
            if (g_fibers[t].state == kWaitWarp)
              some = true;
            else
              all = false;
          }
          if (all && some) {
            for (int t = w * 32; t < std::min(n, w * 32 + 32); ++t)
              if (g_fibers[t].state == kWaitWarp) g_fibers[t].state = kReady;
            progressed = true;
          }
        }
        bool allb = true, someb = false;
        for (int t = 0; t < n; ++t) {
          if (g_fibers[t].state == kDone) continue;
          if (g_fibers[t].state == kWaitBlock)
            someb = true;
          else
            allb = false;
        }
        if (allb && someb) {
          for (int t = 0; t < n; ++t)
            if (g_fibers[t].state == kWaitBlock) g_fibers[t].state = kReady;
          progressed = true;
        }
        if (!progressed) {
          std::fprintf(stderr, "EMU DEADLOCK: barrier divergence in block (%u,%u)\n", bx, by);
          std::abort();
        }
      }
    }
}
}  // namespace emu

inline void __syncthreads() {
  emu::yield_as(emu::kWaitBlock);
}
inline void __syncwarp(unsigned = 0xffffffffu) {
  emu::yield_as(emu::kWaitWarp);
}
template <typename T>
inline T __shfl_xor_sync(unsigned, T v, int o) {
  const int t = emu::g_cur, w = t / 32, lane = t % 32;
  double stored;
  std::memcpy(&stored, &v, sizeof(T));
  emu::g_xchg[w][lane] = stored;
  __syncwarp();
  double got = emu::g_xchg[w][lane ^ o];
  __syncwarp();
  T r;
  std::memcpy(&r, &got, sizeof(T));
  return r;
}
struct float2 {
  float x, y;
};
inline float2 make_float2(float a, float b) {
  return float2{a, b};
}
struct alignas(16) float4 {
  float x, y, z, w;
};
inline int atomicOr(int* p, int v) {
  const int old = *p;
  *p = old | v;
  return old;
}
