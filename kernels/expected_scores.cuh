// Expected-attention's scores on the GPU (ExpectedScoreBatch and the CPU reference
// cpu_expected_scores in engine/ops/expected_scores.h), in double precision. With Q = heads x
// group query heads, seven launches:
//   1. column means of each query head's rows (one thread per column, rows in order);
//   2. R mu (one thread per entry);
//   3. the covariance S = (q - mu)^T (q - mu) / count: 16 x 16 output tiles, the centred rows
//      staged in shared memory 16 at a time;
//   4-5. R S, then (R S) R^T (one thread per entry; skipped without use_covariance);
//   6. the expected logits: a block scores 8 keys (held in shared memory) against one query
//      head, each thread a strided share of the channels (k . R mu and the quadratic form
//      k^T S' k through the columns of S', read coalesced), reduced per key in shared memory;
//   7. per query head the logits' maximum and sum of exp(l - max) (block reductions);
//   8. per key the group's probabilities added head by head, as the CPU reference adds them,
//      times (p + epsilon) |v| with use_vnorm.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "engine/ops/backend.h"
#include "kernels/cuda_check.cuh"

namespace kvscope::cuda {

constexpr int kExpectedThreads = 128;
constexpr int kExpectedKeysPerBlock = 8;

struct ExpectedDeviceArgs {
  int heads = 0, group = 0, count = 0, d = 0, dv = 0;
  bool use_covariance = true, use_vnorm = true;
  double epsilon = 0;
  const float* keys = nullptr;       // [heads][count][d]
  const float* values = nullptr;     // [heads][count][dv], or null without use_vnorm
  const double* queries = nullptr;   // [heads * group][count][d]
  const double* rotation = nullptr;  // [d][d]
  double* mu = nullptr;              // [heads * group][d]
  double* mu_r = nullptr;            // [heads * group][d]
  double* cov = nullptr;             // [heads * group][d][d]
  double* tmp = nullptr;             // [heads * group][d][d]: R S
  double* cov_r = nullptr;           // [heads * group][d][d]
  double* logits = nullptr;          // [heads * group][count]
  double* stats = nullptr;           // [heads * group][2]: max, sum of exp(l - max)
  double* out = nullptr;             // [heads][count]
};

struct ExpectedWorkspace {
  DeviceBuffer keys, values, queries, rotation, work, out;
  void release() {
    keys.release();
    values.release();
    queries.release();
    rotation.release();
    work.release();
    out.release();
  }
};

// Dynamic shared memory of the logits launch (8 keys in double, and the per-key partial sums),
// or 0 when it exceeds the 48 KiB a block gets without opting in (the backend then declines).
size_t expected_scores_smem_bytes(int d);

// Checks `b` as the CPU reference does (check_expected_score_batch: std::invalid_argument),
// throws Cancelled when b.cancel is set, uploads.
ExpectedDeviceArgs upload_expected_batch(const ExpectedScoreBatch& b, ExpectedWorkspace& ws,
                                         cudaStream_t stream);

void launch_expected_scores(const ExpectedDeviceArgs& a, cudaStream_t stream);

void download_expected_scores(const ExpectedDeviceArgs& a, const ExpectedScoreBatch& b,
                              cudaStream_t stream);

}  // namespace kvscope::cuda
