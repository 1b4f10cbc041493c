// Block-wide tree reductions shared by the kernels (one definition each: the cache-score, the
// chunked-attention, the expected-attention and the attention-error kernels reduce sums and
// maxima, the k-center and the key-clustering kernels an arg-extreme with ties to the lower
// index). Both assume blockDim.x is a power of two and the scratch arrays hold blockDim.x
// entries in shared memory; every thread of the block must call them (they hold barriers). The
// pairs are added in a fixed order (w = blockDim.x / 2, ..., 1), so a reduction gives the same
// bits at every run.
#pragma once

#include <cuda_runtime.h>

#include <cmath>

namespace kvscope::cuda {

// The block's maximum (take_max) or sum of `v`, returned to every thread. `scratch` may be
// reused at once: the last barrier comes after every thread has read the result.
__device__ __forceinline__ double block_reduce(double v, bool take_max, double* scratch) {
  scratch[threadIdx.x] = v;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w >>= 1) {
    if (threadIdx.x < w)
      scratch[threadIdx.x] = take_max ? fmax(scratch[threadIdx.x], scratch[threadIdx.x + w])
                                      : scratch[threadIdx.x] + scratch[threadIdx.x + w];
    __syncthreads();
  }
  const double out = scratch[0];
  __syncthreads();  // scratch is reused by the next reduction
  return out;
}

// Whether (v, i) comes before (best_v, best_i): the larger value (take_max) or the smaller one,
// ties to the lower index.
__device__ __forceinline__ bool arg_before(double v, int i, double best_v, int best_i,
                                           bool take_max) {
  return (take_max ? v > best_v : v < best_v) || (v == best_v && i < best_i);
}

// The block's first (value, index) pair by arg_before, in *out_v and *out_i of every thread. No
// barrier at the end (the clustering kernel runs one per key): `sv` and `si` may be written
// again only after the caller's next __syncthreads.
__device__ __forceinline__ void block_arg_reduce(double v, int i, bool take_max, double* sv,
                                                 int* si, double* out_v, int* out_i) {
  sv[threadIdx.x] = v;
  si[threadIdx.x] = i;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w >>= 1) {
    if (threadIdx.x < w && arg_before(sv[threadIdx.x + w], si[threadIdx.x + w], sv[threadIdx.x],
                                      si[threadIdx.x], take_max)) {
      sv[threadIdx.x] = sv[threadIdx.x + w];
      si[threadIdx.x] = si[threadIdx.x + w];
    }
    __syncthreads();
  }
  *out_v = sv[0];
  *out_i = si[0];
}

}  // namespace kvscope::cuda
