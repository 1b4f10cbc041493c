// CPU emulation of the parts of the CUDA runtime and SIMT execution model that kernels/*.cu use,
// installed as <cuda_runtime.h> by kernels/emu/run_emulated_parity.sh (see there for what it does
// and does not check). A block runs its threads as ucontext fibers; __syncthreads / __syncwarp /
// shuffles are barriers the scheduler releases when every live thread of the block / warp has
// reached one (a barrier that never fills aborts with "barrier divergence"). Blocks run one after
// another, so __shared__ is a function-local static. Device memory is host memory, poisoned with
// 0xFF on allocation.

#pragma once
#include <ucontext.h>

#include <algorithm>
#include <cfloat>
#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))

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
  *p = std::aligned_alloc(256, (n + 255) / 256 * 256);
  // Poison so uninitialised reads show up as garbage/NaN.
  std::memset(*p, 0xFF, (n + 255) / 256 * 256);
  return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
template <typename T>
cudaError_t cudaMalloc(T** p, size_t n) {
  return cudaMalloc(reinterpret_cast<void**>(p), n);
}
inline cudaError_t cudaFree(void* p) {
  std::free(p);
  return cudaSuccess;
}
inline cudaError_t cudaMemcpy(void* d, const void* s, size_t n, cudaMemcpyKind) {
  std::memcpy(d, s, n);
  return cudaSuccess;
}
inline cudaError_t cudaMemcpyAsync(void* d, const void* s, size_t n, cudaMemcpyKind,
                                   cudaStream_t = nullptr) {
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
