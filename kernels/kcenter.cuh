// Greedy k-center (Gonzalez) on the GPU, matching cpu_kcenter (engine/ops/kcenter_cpu.cpp): the
// first centre is row `first`; each later pick is the row farthest (squared Euclidean distance,
// double) from its nearest chosen centre, ties to the lowest row; chosen rows are marked -1 so no
// row is picked twice; k is capped at n.
//
// One launch per pick: every thread block first reduces the previous launch's per-block
// (distance, row) maxima to the new centre (each block does the same small reduction, so no grid
// synchronisation is needed), then updates nearest[] for its rows against that centre and writes
// its own block maximum into the other half of a double buffer. The picks stay on the device
// until the end.
#pragma once

#include <cuda_runtime.h>

#include <vector>

#include "kernels/cuda_check.cuh"

namespace kvscope::cuda {

struct KcenterDeviceArgs {
  int n = 0, d = 0, k = 0, first = 0;
  const float* x = nullptr;      // n x d
  double* nearest = nullptr;     // n
  double* block_best = nullptr;  // 2 x blocks
  int* block_arg = nullptr;      // 2 x blocks
  int* picks = nullptr;          // k
  int blocks = 0;
};

struct KcenterWorkspace {
  DeviceBuffer x, nearest, best, arg, picks;
  void release() {
    x.release();
    nearest.release();
    best.release();
    arg.release();
    picks.release();
  }
};

// Validates as cpu_kcenter does (InputError for k < 0, `first` out of range, negative shapes)
// and uploads. Returns args with k == 0 when there is nothing to pick.
KcenterDeviceArgs upload_kcenter_input(const float* x, int n, int d, int k, int first,
                                       KcenterWorkspace& ws, cudaStream_t stream);

void launch_kcenter(const KcenterDeviceArgs& a, cudaStream_t stream);

std::vector<int> download_kcenter_picks(const KcenterDeviceArgs& a, cudaStream_t stream);

}  // namespace kvscope::cuda
