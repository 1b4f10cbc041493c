// Host-side copies between a batch's per-head host arrays and one contiguous device array per
// operand ([heads][count], or [heads * group][count] for the GQA groups' queries), shared by the
// ops whose heads each carry their own pointers (ChunkScoreHead, ExpectedScoreHead: `keys`,
// `queries`, an output array).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <vector>

#include "kernels/cuda_check.cuh"

namespace kvscope::cuda {

// Copies each head's `count` elements at head.*in into its slice of `device` ([heads][count]),
// enqueued on `stream`: the host arrays must live until the stream gets there.
template <typename T, typename Head>
void upload_per_head(T* device, const std::vector<Head>& heads, size_t count, const T* Head::*in,
                     cudaStream_t stream) {
  for (size_t h = 0; h < heads.size(); ++h)
    KVS_CUDA_CHECK(cudaMemcpyAsync(device + h * count, heads[h].*in, count * sizeof(T),
                                   cudaMemcpyHostToDevice, stream));
}

// Copies the `count` elements of every query array of every head's group, head by head and in
// group order, into `device` ([heads * group][count]), enqueued on `stream`.
template <typename T, typename Head>
void upload_group_queries(T* device, const std::vector<Head>& heads, size_t count,
                          cudaStream_t stream) {
  size_t slice = 0;
  for (const Head& head : heads)
    for (const T* q : head.queries)
      KVS_CUDA_CHECK(cudaMemcpyAsync(device + slice++ * count, q, count * sizeof(T),
                                     cudaMemcpyHostToDevice, stream));
}

// Copies the [heads][count] device array into each head's own host array head.*out (one
// transfer, then scattered), and waits for it.
template <typename T, typename Head>
void download_per_head(const T* device, const std::vector<Head>& heads, size_t count, T* Head::*out,
                       cudaStream_t stream) {
  std::vector<T> host(heads.size() * count);
  KVS_CUDA_CHECK(cudaMemcpyAsync(host.data(), device, host.size() * sizeof(T),
                                 cudaMemcpyDeviceToHost, stream));
  KVS_CUDA_CHECK(cudaStreamSynchronize(stream));
  for (size_t h = 0; h < heads.size(); ++h)
    std::copy_n(host.begin() + h * count, count, heads[h].*out);
}

}  // namespace kvscope::cuda
