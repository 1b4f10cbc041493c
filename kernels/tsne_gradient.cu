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
//
// The op's device interface (its arguments, buffers, upload, launch and download) comes first,
// then the kernels, then the backend's CudaBackend::tsne_gradient (kernels/cuda_backend.cuh).
#include <cuda_runtime.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <stdexcept>
#include <string>

#include "engine/ops/backend.h"
#include "kernels/cuda_backend.cuh"
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

struct TsneWorkspace final : OpWorkspace {
  DeviceBuffer y, rowptr, col, val, scratch, totals, grad;
  void release() override {
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

namespace kvscope::cuda {
namespace {

constexpr int kTsneThreads = 256;
constexpr int kReduceThreads = 1024;

// Repulsion and the row's share of Z over the j range of chunk blockIdx.y:
// sum_{j != i} q_ij^2 (y_i - y_j) and sum_{j != i} q_ij.
__global__ void __launch_bounds__(kTsneThreads) tsne_repulsive_kernel(TsneDeviceArgs a) {
  __shared__ float2 tile[kTsneThreads];
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  const int tiles = (a.n + kTsneThreads - 1) / kTsneThreads;
  const int chunk = blockIdx.y;
  const int tile_begin = static_cast<int>(static_cast<long long>(tiles) * chunk / a.chunks);
  const int tile_end = static_cast<int>(static_cast<long long>(tiles) * (chunk + 1) / a.chunks);
  float2 yi = make_float2(0.0f, 0.0f);
  if (i < a.n) yi = make_float2(a.y[2 * i], a.y[2 * i + 1]);
  double fx = 0.0, fy = 0.0, z = 0.0;
  for (int base = tile_begin * kTsneThreads; base < tile_end * kTsneThreads; base += kTsneThreads) {
    const int j = base + threadIdx.x;
    __syncthreads();
    tile[threadIdx.x] = j < a.n ? make_float2(a.y[2 * j], a.y[2 * j + 1]) : make_float2(0.0f, 0.0f);
    __syncthreads();
    const int count = min(kTsneThreads, a.n - base);
    float tfx = 0.0f, tfy = 0.0f, tz = 0.0f;
    for (int t = 0; t < count; ++t) {
      const float dx = yi.x - tile[t].x, dy = yi.y - tile[t].y;
      float q = 1.0f / (1.0f + dx * dx + dy * dy);
      q = (base + t == i) ? 0.0f : q;  // j == i is not a pair
      tz += q;
      tfx = fmaf(q * q, dx, tfx);
      tfy = fmaf(q * q, dy, tfy);
    }
    fx += tfx;
    fy += tfy;
    z += tz;
  }
  if (i < a.n) {
    double* out = a.rep_part + 3 * (static_cast<size_t>(chunk) * a.n + i);
    out[0] = fx;
    out[1] = fy;
    out[2] = z;
  }
}

// The chunks' partial repulsions, added in chunk order.
__global__ void tsne_repulsive_sum_kernel(TsneDeviceArgs a) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= a.n) return;
  double fx = 0.0, fy = 0.0, z = 0.0;
  for (int c = 0; c < a.chunks; ++c) {
    const double* part = a.rep_part + 3 * (static_cast<size_t>(c) * a.n + i);
    fx += part[0];
    fy += part[1];
    z += part[2];
  }
  a.rep[2 * i] = fx;
  a.rep[2 * i + 1] = fy;
  a.z_row[i] = z;
}

// Attraction over the sparse P and the row's KL pieces, in double like the CPU reference.
__global__ void tsne_attractive_kernel(TsneDeviceArgs a) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= a.n) return;
  const double xi = a.y[2 * i], yi = a.y[2 * i + 1];
  double fx = 0.0, fy = 0.0, kl = 0.0, ps = 0.0;
  for (int k = a.rowptr[i]; k < a.rowptr[i + 1]; ++k) {
    const int j = a.col[k];
    const double p = a.val[k];
    const double dx = xi - a.y[2 * j], dy = yi - a.y[2 * j + 1];
    const double q = 1.0 / (1.0 + dx * dx + dy * dy);
    fx += p * q * dx;
    fy += p * q * dy;
    if (p > 0) kl += p * (log(p) - log(q));
    ps += p;
  }
  a.attr[2 * i] = fx;
  a.attr[2 * i + 1] = fy;
  a.kl_row[i] = kl;
  a.p_row[i] = ps;
}

// Z, the KL sum and the P total in a fixed order (one block: deterministic).
__global__ void __launch_bounds__(kReduceThreads) tsne_totals_kernel(TsneDeviceArgs a) {
  __shared__ double part[3][kReduceThreads];
  double z = 0.0, kl = 0.0, ps = 0.0;
  for (int i = threadIdx.x; i < a.n; i += blockDim.x) {
    z += a.z_row[i];
    kl += a.kl_row[i];
    ps += a.p_row[i];
  }
  part[0][threadIdx.x] = z;
  part[1][threadIdx.x] = kl;
  part[2][threadIdx.x] = ps;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w >>= 1) {
    if (threadIdx.x < w)
      for (int c = 0; c < 3; ++c) part[c][threadIdx.x] += part[c][threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    a.totals[0] = fmax(part[0][0], DBL_MIN);
    a.totals[1] = part[1][0];
    a.totals[2] = part[2][0];
  }
}

__global__ void tsne_combine_kernel(TsneDeviceArgs a) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= 2 * a.n) return;
  const double z = a.totals[0];
  a.grad[i] = static_cast<float>(4.0 * (a.exaggeration * a.attr[i] - a.rep[i] / z));
}

}  // namespace

TsneDeviceArgs upload_tsne_input(const TsneGradInput& in, TsneWorkspace& ws, cudaStream_t stream) {
  const int n = in.n;
  if (n <= 0) throw std::invalid_argument("tsne_gradient: no points");
  if (!in.y || !in.p_rowptr || (in.p_rowptr[n] > 0 && (!in.p_col || !in.p_val)))
    throw std::invalid_argument("tsne_gradient: missing input array");
  if (in.p_rowptr[0] != 0)
    throw std::invalid_argument("tsne_gradient: P row pointer does not start at 0");
  for (int i = 0; i < n; ++i)
    if (in.p_rowptr[i + 1] < in.p_rowptr[i])
      throw std::invalid_argument("tsne_gradient: P row pointer decreases at row " +
                                  std::to_string(i));
  const int nnz = in.p_rowptr[n];
  for (int k = 0; k < nnz; ++k)
    if (in.p_col[k] < 0 || in.p_col[k] >= n)
      throw std::invalid_argument("tsne_gradient: P column " + std::to_string(in.p_col[k]) +
                                  " is not one of the " + std::to_string(n) + " points");

  TsneDeviceArgs a;
  a.n = n;
  a.exaggeration = in.exaggeration;
  const size_t un = static_cast<size_t>(n);
  float* y = ws.y.reserve_as<float>(2 * un);
  int* rowptr = ws.rowptr.reserve_as<int>(un + 1);
  int* col = ws.col.reserve_as<int>(std::max(nnz, 1));
  float* val = ws.val.reserve_as<float>(std::max(nnz, 1));
  // Enough j chunks for about 1024 blocks in all, each chunk at least one tile of points.
  const int row_blocks = (n + kTsneThreads - 1) / kTsneThreads;
  a.chunks = std::max(1, std::min(row_blocks, 1024 / row_blocks));
  double* scratch = ws.scratch.reserve_as<double>((7 + 3 * static_cast<size_t>(a.chunks)) * un);
  KVS_CUDA_CHECK(cudaMemcpyAsync(y, in.y, 2 * un * sizeof(float), cudaMemcpyHostToDevice, stream));
  KVS_CUDA_CHECK(
      cudaMemcpyAsync(rowptr, in.p_rowptr, (un + 1) * sizeof(int), cudaMemcpyHostToDevice, stream));
  if (nnz > 0) {
    KVS_CUDA_CHECK(
        cudaMemcpyAsync(col, in.p_col, nnz * sizeof(int), cudaMemcpyHostToDevice, stream));
    KVS_CUDA_CHECK(
        cudaMemcpyAsync(val, in.p_val, nnz * sizeof(float), cudaMemcpyHostToDevice, stream));
  }
  a.y = y;
  a.rowptr = rowptr;
  a.col = col;
  a.val = val;
  a.rep = scratch;
  a.attr = scratch + 2 * un;
  a.z_row = scratch + 4 * un;
  a.kl_row = scratch + 5 * un;
  a.p_row = scratch + 6 * un;
  a.rep_part = scratch + 7 * un;
  a.totals = ws.totals.reserve_as<double>(3);
  a.grad = ws.grad.reserve_as<float>(2 * un);
  return a;
}

void launch_tsne_gradient(const TsneDeviceArgs& a, cudaStream_t stream) {
  const int blocks = (a.n + kTsneThreads - 1) / kTsneThreads;
  const dim3 grid(blocks, a.chunks);
  tsne_repulsive_kernel<<<grid, kTsneThreads, 0, stream>>>(a);
  KVS_CUDA_CHECK_LAUNCH("tsne_repulsive_kernel");
  tsne_repulsive_sum_kernel<<<blocks, kTsneThreads, 0, stream>>>(a);
  KVS_CUDA_CHECK_LAUNCH("tsne_repulsive_sum_kernel");
  tsne_attractive_kernel<<<blocks, kTsneThreads, 0, stream>>>(a);
  KVS_CUDA_CHECK_LAUNCH("tsne_attractive_kernel");
  tsne_totals_kernel<<<1, kReduceThreads, 0, stream>>>(a);
  KVS_CUDA_CHECK_LAUNCH("tsne_totals_kernel");
  tsne_combine_kernel<<<(2 * a.n + kTsneThreads - 1) / kTsneThreads, kTsneThreads, 0, stream>>>(a);
  KVS_CUDA_CHECK_LAUNCH("tsne_combine_kernel");
}

double download_tsne_gradient(const TsneDeviceArgs& a, float* grad, cudaStream_t stream) {
  double totals[3] = {0, 0, 0};
  KVS_CUDA_CHECK(cudaMemcpyAsync(grad, a.grad, 2 * static_cast<size_t>(a.n) * sizeof(float),
                                 cudaMemcpyDeviceToHost, stream));
  KVS_CUDA_CHECK(cudaMemcpyAsync(totals, a.totals, sizeof(totals), cudaMemcpyDeviceToHost, stream));
  KVS_CUDA_CHECK(cudaStreamSynchronize(stream));
  return totals[1] + totals[2] * std::log(totals[0]);
}

// ---- the backend's op ---------------------------------------------------------------------

double CudaBackend::tsne_gradient(const TsneGradInput& in, float* grad) {
  if (in.n <= 0) return 0;  // nothing to do; the CPU reference's answer too
  return guarded([&] {
    if (!grad) throw std::invalid_argument("tsne_gradient: no output array");
    const TsneDeviceArgs a =
        upload_tsne_input(in, workspace<TsneWorkspace>(Op::tsne_gradient), stream_);
    launch([a, this] { launch_tsne_gradient(a, stream_); });
    return download_tsne_gradient(a, grad, stream_);
  });
}

}  // namespace kvscope::cuda
