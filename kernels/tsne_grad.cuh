// Exact t-SNE gradient on the GPU (TsneGradInput and the CPU reference cpu_tsne_gradient in
// engine/ops/tsne_gradient.h): with unnormalised q_ij = 1 / (1 + |y_i - y_j|^2) and
// Z = sum_{k != l} q_kl,
//   dC/dy_i = 4 (exaggeration * sum_j p_ij q_ij (y_i - y_j) - sum_j q_ij^2 (y_i - y_j) / Z)
// and KL(P || Q) = sum p log p - sum p log q + (sum p) log Z for the un-exaggerated P.
//
// The repulsive term is the exact O(n^2) sum, tiled through shared memory (one thread per point,
// float inside a tile, double across tiles); the attractive term walks the sparse P (CSR) one row
// per thread in double; Z and the KL pieces are reduced in a fixed order, so results are
// deterministic. The GPU always computes the exact gradient: a Barnes-Hut `theta` > 0 (which the
// CPU uses to approximate the repulsion) is ignored here, so with theta > 0 the two backends
// differ by the Barnes-Hut error.
#pragma once

#include <cuda_runtime.h>

#include "engine/ops/backend.h"
#include "kernels/cuda_check.cuh"

namespace kvscope::cuda {

struct TsneDeviceArgs {
  int n = 0;
  double exaggeration = 1;
  const float* y = nullptr;  // n x 2
  const int* rowptr = nullptr;
  const int* col = nullptr;
  const float* val = nullptr;
  // The repulsion is split over `chunks` ranges of j (so a long embedding fills the GPU: one
  // 256-thread block per 256 points alone leaves most SMs idle); each range writes its partial
  // sums, added in a fixed order afterwards (deterministic).
  int chunks = 1;
  double* rep_part = nullptr;  // chunks x n x 3: fx, fy, z
  double* rep = nullptr;       // n x 2
  double* attr = nullptr;      // n x 2
  double* z_row = nullptr;     // n
  double* kl_row = nullptr;    // n
  double* p_row = nullptr;     // n
  double* totals = nullptr;    // 3: Z, sum p (log p - log q), sum p
  float* grad = nullptr;       // n x 2
};

struct TsneWorkspace {
  DeviceBuffer y, rowptr, col, val, scratch, totals, grad;
  void release() {
    y.release();
    rowptr.release();
    col.release();
    val.release();
    scratch.release();
    totals.release();
    grad.release();
  }
};

// Validates the CSR structure (rows ascending, columns in range: a bad index must not reach the
// device) and uploads. Throws std::invalid_argument for malformed input.
TsneDeviceArgs upload_tsne_input(const TsneGradInput& in, TsneWorkspace& ws, cudaStream_t stream);

// Enqueues the gradient kernels.
void launch_tsne_gradient(const TsneDeviceArgs& a, cudaStream_t stream);

// Copies the gradient to `grad` (n x 2) and returns the KL divergence.
double download_tsne_gradient(const TsneDeviceArgs& a, float* grad, cudaStream_t stream);

}  // namespace kvscope::cuda
