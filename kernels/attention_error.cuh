// Weighted-attention error on the GPU (docs/evaluation.md "The metrics"; ErrorBatch and the CPU
// reference cpu_attention_errors in engine/ops/attention_errors.h): for
// every evaluation query j in [n-E, n) of every query head of one layer, the exact output
// Attn_j over keys [0, j], the estimator z_j over sinks + selection + window [n-E, j] (separate
// numerator and denominator sets, log weights as logit biases), and the three figures
// cpu_attention_errors reports: relative error, the paper's normalised error, kept mass.
//
// Two kernels (attention_error.cu): the exact side of every evaluation query (kept on the device
// for a named layer, so later calls skip it), then the approximate side over the candidates only
// (sinks, selections, window, gathered by index) against it. Each: one thread block per (query
// head, tile of kErrQueries consecutive evaluation queries); keys and values stream through
// shared memory in tiles of kErrKeys; each query keeps running log-sum-exp states (the exact
// one, or the numerator's and denominator's: flash-attention style online rescaling), so there
// is no limit on n and nothing overflows. Logits and per-tile sums are double (float with
// ErrorBatch::float_scores); everything carried across tiles (output vectors, normalisers,
// masses) is double.
#pragma once

#include <cuda_runtime.h>

#include "engine/ops/backend.h"
#include "kernels/cuda_check.cuh"

namespace kvscope::cuda {

constexpr int kErrQueries = 16;  // evaluation queries per thread block
constexpr int kErrKeys = 32;     // keys per shared-memory tile (one per lane)
constexpr int kErrThreads = 256;
constexpr int kErrMaxDv = 256;  // value dims the register accumulators are sized for

struct ErrorDeviceArgs {
  int n = 0, d = 0, dv = 0, q_heads = 0, kv_heads = 0, sink = 0, eval = 0;
  bool float_scores = false;  // see ErrorBatch::float_scores
  // Device pointer tables: each head's rows, in the call's workspace or resident
  // (kernels/resident_layers.cuh).
  const float* const* keys = nullptr;     // [kv_heads] -> n x d
  const float* const* values = nullptr;   // [kv_heads] -> n x dv
  const float* const* queries = nullptr;  // [q_heads] -> eval x d: only the evaluation rows
  // The approximate side's candidates per kv head, ascending tokens: the sinks, the middle's
  // tokens either selection holds, the window ([kv_heads][cand_stride], cand_count[kv] used),
  // with their numerator and denominator log weights (-inf where that set does not hold them).
  const int* cand = nullptr;
  const int* cand_count = nullptr;  // [kv_heads]
  const double* cand_lwn = nullptr;
  const double* cand_lwd = nullptr;
  int cand_stride = 0;
  // [q_heads] -> [eval][dv + 3] doubles: Attn_j, then its maximum logit, normaliser and sum of
  // squared weights. Written by the exact-side kernel when compute_exact, else kept from an
  // earlier call (kernels/resident_layers.cuh).
  double* const* exact = nullptr;
  bool compute_exact = true;
  double* v_sq_prefix = nullptr;  // [kv_heads][eval]: sum_{i<=j} ||v_i||^2 (filled on device)
  double* relative = nullptr;     // [q_heads][eval]
  double* normalized = nullptr;
  double* mass = nullptr;
};

// Device copies of one ErrorBatch, reused across calls.
struct ErrorWorkspace {
  DeviceBuffer keys, values, queries, lw_num, lw_den, cand, v_sq, out, tables, exact, exact_tables;
  void release() {
    tables.release();
    cand.release();
    exact.release();
    exact_tables.release();
    keys.release();
    values.release();
    queries.release();
    lw_num.release();
    lw_den.release();
    v_sq.release();
    out.release();
  }
};

class ResidentLayers;

// Checks `b` exactly as cpu_attention_errors does (same exception types and messages), uploads
// it into `ws` and returns the device view. Selections become dense per-token log-weight rows.
// With `resident` and a non-zero b.layer_id, keys, values and the evaluation query rows come
// from (or go once into) the resident layer copies instead of being uploaded again.
ErrorDeviceArgs upload_error_batch(const ErrorBatch& b, ErrorWorkspace& ws,
                                   ResidentLayers* resident, cudaStream_t stream);

// Dynamic shared memory the main kernel needs for these shapes, or 0 when they are beyond what
// this kernel supports (dv > kErrMaxDv, or more shared memory than the device allows).
size_t attention_error_smem_bytes(int d, int dv, int device_smem_optin, bool float_scores);

// Enqueues the kernels; throws CudaFailure when a launch is rejected.
void launch_attention_errors(const ErrorDeviceArgs& a, int device_smem_optin, cudaStream_t stream);

// Copies the outputs back into the batch's (non-null) output arrays.
void download_error_outputs(const ErrorDeviceArgs& a, const ErrorBatch& b, cudaStream_t stream);

}  // namespace kvscope::cuda
