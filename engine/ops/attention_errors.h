// The attention-error op (Backend::attention_errors, engine/ops/backend.h): its batch type and its
// CPU reference, cpu_attention_errors (engine/ops/attention_errors_cpu.cpp, built on
// engine/attention/exact_attention.h's ExactReference). The CUDA kernel is
// kernels/attention_errors.cu.
#pragma once

#include <cstdint>
#include <vector>

namespace kvscope {

// Weighted-attention error of docs/evaluation.md for every evaluation query of every query head of
// one layer. Selections hold absolute indices of the middle and log weights; sinks [0, sink) and
// the window [n-E, j] are added with weight 1 by the op itself.
struct ErrorBatch {
  int n = 0, d = 0, dv = 0, q_heads = 0, kv_heads = 0;
  int sink = 0, eval = 0;
  std::vector<const float*> keys, values;          // [kv_heads] n x d / n x dv
  std::vector<const float*> queries;               // [q_heads] n x d
  std::vector<std::vector<int>> num_idx, den_idx;  // [kv_heads]
  // Log weights in double: the CPU path scores a Selection's double weights, and a log weight
  // rounded to float moves a figure by ~1e-7 relative (seen on an H200, docs/performance.md).
  std::vector<std::vector<double>> num_logw, den_logw;  // [kv_heads]
  // Outputs [q_heads * eval], row-major by query head.
  double* relative = nullptr;
  double* normalized = nullptr;
  double* mass = nullptr;
  // GPU only: logits and per-tile sums in float instead of double (faster; the figures then
  // differ from the CPU reference by about 1e-6 relative). The CPU always computes in double.
  bool float_scores = false;
  // Non-zero: keys, values and queries point into the matrices of the loaded layer with this
  // LayerData::id (engine/io/capture.h), which do not change while the id lives, so a device
  // backend may keep its copies of them across calls (kernels/resident_layers.cuh). 0: upload
  // them at every call. The CPU ignores it.
  uint64_t layer_id = 0;
};

// The op and its sizes, for Backend::supports() (OpShape: engine/ops/backend.h).
struct OpShape;
OpShape op_shape(const ErrorBatch& b);

// The CPU reference, in double precision whatever float_scores says. Throws
// std::invalid_argument for inconsistent heads or window, std::out_of_range for a selected index
// outside the middle.
void cpu_attention_errors(const ErrorBatch& batch);

}  // namespace kvscope
