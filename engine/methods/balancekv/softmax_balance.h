// The theorem's BalanceKV (docs/balancekv.md, "balancekv-stream"): SoftmaxBalance (Algorithm 2
// of balancekv-paper.txt) inside MergeAndReduce (Algorithm 3), with numerator instances per
// value-norm bucket and one denominator instance on (k, 1) (Algorithm 1). See docs/balancekv.md.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <vector>

#include "engine/attention/walk_trace.h"
#include "engine/core/tensor.h"
#include "engine/methods/method.h"

namespace kvscope {

// c = 30 log(n / delta) (Algorithm 2, line 3).
double softmax_balance_c(int n, double delta);
// R = exp(r_key^2 / (2 sqrt d)) * r_value (Algorithm 2, line 2).
double softmax_balance_radius(double r_key, double r_value, int d);

struct SoftmaxBalanceConfig {
  double c = 1;       // the walk's normaliser (30 log(n/delta) in the theorem)
  double radius = 1;  // R
  uint64_t seed = 0;
  uint32_t layer = 0, head = 0;
  uint32_t instance = 0;  // which MergeAndReduce instance (0: denominator, 1+: numerator buckets)
  // When non-empty, the call records a WalkBlockTrace measured along this query (length d).
  std::vector<float> trace_query;
};

struct SoftmaxBalanceOutput {
  std::vector<int>
      kept;            // the smaller sign class (ties: the +1 class), as token indices, ascending
  int fail_steps = 0;  // steps where |y^T eta| > c R^2 (the FAIL case); the walk then went on
                       // with p clipped to [0, 1]
  bool traced = false;
  WalkBlockTrace trace;
};

// Algorithm 2 on the rows `tokens` of `keys` (and `values`; nullptr = the scalar 1 of the
// denominator instance): eta_j = +1 with probability p_j = 1/2 - y^T eta / (2 c R^2), where
// y_i = exp(<k_i,k_j>/sqrt d) <v_i,v_j>. The uniform of step i is counter_uniform(seed, kRandMisc,
// layer, head, (instance << 6) | level, call, i).
SoftmaxBalanceOutput softmax_balance(const MatrixF& keys, const MatrixF* values,
                                     const std::vector<int>& tokens,
                                     const SoftmaxBalanceConfig& cfg, uint32_t level,
                                     uint32_t call);

// Algorithm 3: tokens arrive one by one into C^0; every `batch` tokens, C^i is reduced into
// C^{i+1} while the batch count is divisible by 2^i, up to level T = `levels` (C^T only
// accumulates). Level l carries weight 2^l.
class MergeAndReduce {
 public:
  // reduce(tokens, level, call) returns the kept subset (at most half of `tokens`).
  using Reduce = std::function<std::vector<int>(const std::vector<int>&, int, int)>;
  MergeAndReduce(int batch, int levels, Reduce reduce);
  void push(int token);
  const std::vector<std::vector<int>>& levels() const { return level_; }

 private:
  int batch_, levels_;
  long long count_ = 0;
  Reduce reduce_;
  std::vector<std::vector<int>> level_;
  std::vector<int> calls_;  // reductions done per level (the `call` id)
};

// The kept-size bound of MergeAndReduce over n tokens with the given batch size and levels when
// every reduction keeps floor(|C|/2) (SoftmaxBalance never keeps more).
long long merge_and_reduce_bound(long long n, int batch, int levels);

// The batch t and level count T that balancekv-stream's budget search picks for its denominator
// instance over n middle tokens at budget m (the Teaching view's merge-and-reduce tree uses it).
void balancekv_stream_den_plan(long long n, long long m, int max_batch, int* batch, int* levels);

// The method's ParamSpecs and its selection for one kv head (throws InputError on bad input).
std::vector<ParamSpec> balancekv_stream_param_specs();
Selection balancekv_stream_select(const MethodInput& in);

}  // namespace kvscope
