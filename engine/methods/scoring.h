// Score helpers shared by the attention-score baselines (h2o, snapkv, pyramidkv, tova, buzz) and
// the input checks every baseline method runs. All scores are softmax attention probabilities in
// double precision, scale 1/sqrt(d), causal (query j sees keys 0..j), averaged over the query
// heads of the GQA group that reads the kv head, computed by the backend's attention-score op
// (engine/ops/attention_scores.h) on the method's backend (MethodInput::backend).
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/core/tensor.h"
#include "engine/methods/method.h"
#include "engine/ops/attention_scores.h"

namespace kvscope {

// A ParamSpec in one call (the baselines' parameter lists are built from these).
ParamSpec param_spec(std::string name, ParamSpec::Type type, double min, double max,
                     double default_value, std::string help, std::vector<std::string> choices = {},
                     bool log_scale = false);

// The backend a method runs its ops on: in.backend, or the CPU reference (cpu_backend()) when
// none is given. Both give the same figures up to rounding (tests/test_cuda_parity.cpp).
Backend& method_backend(const MethodInput& in);

// in.layer_data's id (LayerData::id, engine/io/capture.h) when every matrix of `arrays` is one of
// that layer's key or query matrices of in.n rows, so a device backend may keep them resident
// (ScoreBatch::layer_id); else 0 (upload at every call).
uint64_t layer_id_of(const MethodInput& in, const std::vector<const MatrixF*>& arrays);

// The attention-score op (engine/ops/attention_scores.h) for this head's keys and GQA group over
// the query rows [row_begin, row_end), on method_backend(in), checking in.cancel: entry i is key
// i's reduced score, keys [0, row_end). With `stop_rows` (row_end entries), `stopped` receives
// the running sums as they stood after row stop_rows[i] - 1.
std::vector<double> head_attention_scores(const MethodInput& in, int row_begin, int row_end,
                                          ScoreReduce reduce, const int* stop_rows = nullptr,
                                          std::vector<double>* stopped = nullptr);

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
