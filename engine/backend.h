// The compute seam (docs/design.md): the CPU implementation is always there and is the
// reference; the CUDA implementation (kernels/) is used when built and a device exists. Every op
// takes plain arrays so kernels/ never sees Eigen.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kvscope {

// Many independent walk blocks (all blocks of all heads of a layer in one round). Rows of a block
// are contiguous; keys are already centred within the block and values already multiplied by the
// accumulated weights. The walk is sequential inside a block:
//   sigma_0 = +1; p_i = 1/2 - gamma * sum_{j<i} K_ij sigma_j; sigma_i = +1 w.p. clip(p_i, 0, 1)
//   K_ij = exp(temp <k_i,k_j>/sqrt(d) - beta) * (<v_i,v_j> + value_bias)
// The uniform for step i is counter_uniform(seed, kRandWalk, layer, block_head[b], round,
// block_id[b], i): identical on every backend.
// With `float32` set (the authors' semantics, BalanceKV's default) everything is float32 with
// IEEE overflow: K_ij = exp(temp <k_i,k_j>/sqrt(d) - beta) * ((<v_i,v_j> + value_eps) +
// value_bias), p_i = 1/2 - gamma * sum_j K_ij sigma_j over the WHOLE block with sigma_j = 0 for
// j >= i (so a non-finite K_ij anywhere in row i makes the sum NaN), sigma_i = +1 iff
// float(u_i) < p_i without clipping (NaN or -inf p: -1). Otherwise the double rule above.
struct WalkBatch {
  int d = 0, dv = 0;
  int num_blocks = 0;
  const float* keys = nullptr;           // total_rows x d
  const float* values = nullptr;         // total_rows x dv
  const int* block_offset = nullptr;     // num_blocks + 1 row offsets
  const uint32_t* block_head = nullptr;  // kv head of each block (RNG key)
  const uint32_t* block_id = nullptr;    // block index within its head's round (RNG key)
  uint64_t seed = 0;
  uint32_t layer = 0, round = 0;
  double gamma = 4, temp = 1, beta = 0, value_bias = 0.025;
  bool float32 = false;
  double value_eps = 0;  // the authors' 1e-8 (float32 only)
  // Outputs, total_rows each. partial/p may be null when not traced.
  int8_t* sigma = nullptr;
  float* p = nullptr;        // before clipping
  float* partial = nullptr;  // sum_{j<i} K_ij sigma_j
};

// Weighted-attention error of docs/evaluation.md for every evaluation query of every query head of
// one layer. Selections hold absolute indices of the middle and log weights; sinks [0, sink) and
// the window [n-E, j] are added with weight 1 by the op itself.
struct ErrorBatch {
  int n = 0, d = 0, dv = 0, q_heads = 0, kv_heads = 0;
  int sink = 0, eval = 0;
  std::vector<const float*> keys, values;              // [kv_heads] n x d / n x dv
  std::vector<const float*> queries;                   // [q_heads] n x d
  std::vector<std::vector<int>> num_idx, den_idx;      // [kv_heads]
  std::vector<std::vector<float>> num_logw, den_logw;  // [kv_heads]
  // Outputs [q_heads * eval], row-major by query head.
  double* relative = nullptr;
  double* normalized = nullptr;
  double* mass = nullptr;
  // GPU only: logits and per-tile sums in float instead of double (faster; the figures then
  // differ from the CPU reference by about 1e-6 relative). The CPU always computes in double.
  bool float_scores = false;
};

// t-SNE gradient: P is a symmetric, normalised sparse affinity matrix in CSR form.
struct TsneGradInput {
  int n = 0;
  const float* y = nullptr;  // n x 2
  const int* p_rowptr = nullptr;
  const int* p_col = nullptr;
  const float* p_val = nullptr;
  // Optional: the same columns as 16-bit indices (n <= 65536), which the CPU's attraction reads
  // instead of p_col (a quarter less of P streamed from memory every iteration).
  const uint16_t* p_col16 = nullptr;
  double exaggeration = 1;
  double theta = 0;  // Barnes-Hut opening angle; 0 = exact O(n^2)
  // Whether the caller wants the KL divergence returned (a log per P entry: skipped on most
  // iterations by TsneRun). A backend may compute it anyway or return NaN when false.
  bool want_kl = true;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;  // "cpu" or "cuda (NVIDIA H100 ...)"
  virtual bool is_gpu() const = 0;
  virtual void walk_blocks(const WalkBatch& batch) = 0;
  virtual void attention_errors(const ErrorBatch& batch) = 0;
  // grad: n x 2. Returns the KL divergence when cheap to compute, else NaN.
  virtual double tsne_gradient(const TsneGradInput& in, float* grad) = 0;
  // Greedy k-center (Gonzalez) from row `first`; returns the k centre rows in pick order.
  virtual std::vector<int> kcenter(const float* x, int n, int d, int k, int first) = 0;
};

Backend& cpu_backend();
// Whether a CUDA backend is compiled in and a device answers; `why` says what was found.
bool cuda_available(std::string* why = nullptr);
// "cpu", "cuda" or "auto" (cuda when available, else cpu). "cuda" without a device throws
// InputError with the reason. The returned backend lives for the program.
Backend& select_backend(const std::string& which);

}  // namespace kvscope
