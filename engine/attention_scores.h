// Score helpers shared by the attention-score baselines (h2o, snapkv, pyramidkv, tova, buzz) and
// the input checks every baseline method runs. All scores are softmax attention probabilities in
// double precision, scale 1/sqrt(d), causal (query j sees keys 0..j), averaged over the query
// heads of the GQA group that reads the kv head.
#pragma once

#include <atomic>
#include <functional>
#include <string>
#include <vector>

#include "engine/method.h"
#include "engine/tensor.h"

namespace kvscope {

// A ParamSpec in one call (the baselines' parameter lists are built from these).
ParamSpec param_spec(std::string name, ParamSpec::Type type, double min, double max,
                     double default_value, std::string help, std::vector<std::string> choices = {},
                     bool log_scale = false);

// Checks the parts of a MethodInput every method relies on: keys/values present with n rows,
// 0 <= mid_begin <= mid_end <= n, 0 <= budget <= n_mid, and (when `needs_queries`) at least one
// query head of n rows and the keys' width. Throws InputError naming the method and the problem.
void check_method_input(const MethodInput& in, const std::string& method, bool needs_queries);

// Visits the causal attention rows of query positions [row_begin, row_end) in increasing order.
// For row j, `probs` holds j+1 values: the softmax over keys 0..j of <q_j,k_i>/sqrt(d), averaged
// over the given query heads. Rows are computed in blocks with a double-precision matrix product.
// Checks `cancel` between blocks (throws Cancelled).
using AttentionRowFn = std::function<void(int row, const double* probs)>;
void for_each_attention_row(const std::vector<const MatrixF*>& queries, const MatrixF& keys,
                            int row_begin, int row_end, const AttentionRowFn& fn,
                            const std::atomic<bool>* cancel = nullptr);

// Sum over query rows [row_begin, row_end) of the group-averaged causal attention each key
// receives; entry i is for key i, keys [0, row_end) (a key after a row gets nothing from it).
std::vector<double> attention_column_sums(const std::vector<const MatrixF*>& queries,
                                          const MatrixF& keys, int row_begin, int row_end,
                                          const std::atomic<bool>* cancel = nullptr);

// H2O's score for middle token i (entry i - mid_begin): the attention it receives from every
// causal query before mid_end, summed and divided by how many of those queries see it
// (mid_end - i), group-averaged.
std::vector<double> h2o_scores(const MethodInput& in);

// SnapKV's observation-window vote before pooling: for each key in [0, mid_end), the attention
// it receives from the queries [max(0, mid_end - window), mid_end), summed over those queries and
// averaged over the group (the window's own tokens only get votes from later window queries).
std::vector<double> observation_window_scores(const MethodInput& in, int window);

// PyTorch's avg_pool1d(kernel, stride 1, padding kernel/2, count_include_pad=True): zero padding
// and a constant divisor `kernel`, so the output has the input's length (kernel must be odd).
std::vector<double> avg_pool_same(const std::vector<double>& x, int kernel);

// PyTorch's max_pool1d with the same padding (-inf pad): the output has the input's length.
std::vector<double> max_pool_same(const std::vector<double>& x, int kernel);

// SnapKV's observation-window parameters, read from `values` (spec defaults from `specs`, which
// must hold "window" and "kernel") and checked: window >= 1, kernel a positive odd number.
// Throws InputError naming method.window / method.kernel.
struct SnapKVWindow {
  int window = 0;
  int kernel = 0;
};
SnapKVWindow snapkv_window_params(const std::vector<ParamSpec>& specs, const ParamValues& values,
                                  const std::string& method);

// SnapKV's score of every middle token (entry i - mid_begin): observation_window_scores with
// `window` queries, pooled over the prefix [0, mid_end) with `kernel` (average pooling, or max
// pooling when `max_pool`), then restricted to the middle.
std::vector<double> snapkv_scores(const MethodInput& in, int window, int kernel, bool max_pool);

// Indices (0-based into `scores`) of the `m` largest scores, in increasing index order. Ties go
// to the lower index so the choice is deterministic.
std::vector<int> top_m_indices(const std::vector<double>& scores, int m);

// The ordering of a score-ranking method: every middle position sorted by `scores` (largest
// first, ties to the lower index, NaN last), so that its first m entries are exactly
// top_m_indices(scores, m) for every m. `hover` becomes the selections' middle_scores.
Ranking rank_by_scores(const std::vector<double>& scores, std::vector<double> hover);

// The selection of the first `m` positions of `ranking` (clamped to the middle), in increasing
// token order, weight 1 each, with the ranking's hover scores.
Selection prefix_selection(const MethodInput& in, const Ranking& ranking, int m);

// The selection of a score-ranking method: the `m` middle tokens with the largest `scores`
// (indexed by token - mid_begin), weight 1 each, with the scores kept for hover.
Selection top_m_selection(const MethodInput& in, std::vector<double> scores, int m);

}  // namespace kvscope
