#include "engine/methods/scoring.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <sstream>

#include "engine/core/error.h"
#include "engine/io/capture.h"
#include "engine/ops/backend.h"

namespace kvscope {

ParamSpec param_spec(std::string name, ParamSpec::Type type, double min, double max,
                     double default_value, std::string help, std::vector<std::string> choices,
                     bool log_scale) {
  ParamSpec p;
  p.name = std::move(name);
  p.type = type;
  p.min = min;
  p.max = max;
  p.default_value = default_value;
  p.help = std::move(help);
  p.choices = std::move(choices);
  p.log_scale = log_scale;
  return p;
}

Backend& method_backend(const MethodInput& in) {
  return in.backend ? *in.backend : cpu_backend();
}

uint64_t layer_id_of(const MethodInput& in, const std::vector<const MatrixF*>& arrays) {
  const LayerData* layer = in.layer_data;
  if (!layer || layer->id.value() == 0) return 0;
  auto within = [](const std::vector<MatrixF>& list, const MatrixF* m) {
    for (const MatrixF& x : list)
      if (&x == m) return true;
    return false;
  };
  for (const MatrixF* m : arrays)
    if (!m || m->rows() != in.n || !(within(layer->keys, m) || within(layer->queries, m))) return 0;
  return layer->id.value();
}

std::vector<double> head_attention_scores(const MethodInput& in, int row_begin, int row_end,
                                          ScoreReduce reduce, const int* stop_rows,
                                          std::vector<double>* stopped) {
  std::vector<double> scores(std::max(0, row_end), 0.0);
  // Without query rows every sum is 0, which is what the op would return; the op is not asked,
  // since a capture with nothing before its evaluation window (n = E, no sinks) would hand it
  // no keys and no output at all.
  if (row_begin >= row_end) {
    if (stopped) stopped->assign(scores.size(), 0.0);
    return scores;
  }
  ScoreBatch b;
  b.n = in.n;
  b.d = static_cast<int>(in.keys->cols());
  b.row_begin = row_begin;
  b.row_end = row_end;
  b.reduce = reduce;
  b.cancel = in.cancel;
  ScoreHead head;
  head.keys = in.keys->data();
  for (const MatrixF* q : in.queries) head.queries.push_back(q->data());
  head.scores = scores.data();
  if (stopped) {
    stopped->assign(scores.size(), 0.0);
    head.stopped = stopped->data();
    b.stop_rows = stop_rows;
  }
  b.heads.push_back(std::move(head));
  std::vector<const MatrixF*> arrays = in.queries;
  arrays.push_back(in.keys);
  b.layer_id = layer_id_of(in, arrays);
  method_backend(in).attention_scores(b);
  return scores;
}

std::vector<double> h2o_scores(const MethodInput& in) {
  // Rows before mid_begin only see sinks, so the middle's scores need rows [mid_begin, mid_end);
  // the op divides each key's sum by the mid_end - i rows that see it.
  const std::vector<double> means =
      head_attention_scores(in, in.mid_begin, in.mid_end, ScoreReduce::mean_seen);
  return std::vector<double>(means.begin() + in.mid_begin, means.begin() + in.mid_end);
}

std::vector<double> observation_window_scores(const MethodInput& in, int window) {
  return head_attention_scores(in, std::max(0, in.mid_end - window), in.mid_end, ScoreReduce::sum);
}

namespace {

// PyTorch's 1-D pooling with stride 1 and padding kernel/2: out[i] folds `step` over x[t] for t
// in [i - kernel/2, i + kernel/2] within x, from `init` (the padding adds nothing to a sum and
// never wins a maximum).
template <typename Step>
std::vector<double> pool_same(const std::vector<double>& x, int kernel, double init, Step step) {
  if (kernel < 1 || kernel % 2 == 0)
    throw InputError("pooling kernel must be a positive odd number, got " + std::to_string(kernel));
  const int n = static_cast<int>(x.size());
  const int half = kernel / 2;
  std::vector<double> out(n, 0.0);
  for (int i = 0; i < n; ++i) {
    double acc = init;
    for (int t = std::max(0, i - half); t <= std::min(n - 1, i + half); ++t) acc = step(acc, x[t]);
    out[i] = acc;
  }
  return out;
}

}  // namespace

std::vector<double> avg_pool_same(const std::vector<double>& x, int kernel) {
  std::vector<double> out = pool_same(x, kernel, 0.0, [](double s, double v) { return s + v; });
  for (double& v : out) v /= kernel;  // count_include_pad: always the whole kernel
  return out;
}

std::vector<double> max_pool_same(const std::vector<double>& x, int kernel) {
  return pool_same(x, kernel, -std::numeric_limits<double>::infinity(),
                   [](double m, double v) { return std::max(m, v); });
}

SnapKVWindow snapkv_window_params(const std::vector<ParamSpec>& specs, const ParamValues& values,
                                  const std::string& method) {
  SnapKVWindow p;
  p.window = static_cast<int>(param_value(specs, values, "window"));
  p.kernel = static_cast<int>(param_value(specs, values, "kernel"));
  if (p.window < 1)
    throw InputError(method + ".window must be >= 1, got " + std::to_string(p.window));
  if (p.kernel < 1 || p.kernel % 2 == 0)
    throw InputError(method + ".kernel must be a positive odd number, got " +
                     std::to_string(p.kernel));
  return p;
}

std::vector<double> snapkv_scores(const MethodInput& in, int window, int kernel, bool max_pool) {
  const std::vector<double> votes = observation_window_scores(in, window);
  const std::vector<double> pooled =
      max_pool ? max_pool_same(votes, kernel) : avg_pool_same(votes, kernel);
  return std::vector<double>(pooled.begin() + in.mid_begin, pooled.begin() + in.mid_end);
}

namespace {

// Largest score first, ties to the lower index; NaN ranks last so this stays a strict total
// order (which is what makes every top m a prefix of one full ordering).
auto score_order(const std::vector<double>& scores) {
  return [&scores](int a, int b) {
    const double inf = std::numeric_limits<double>::infinity();
    const double va = std::isnan(scores[a]) ? -inf : scores[a];
    const double vb = std::isnan(scores[b]) ? -inf : scores[b];
    return va > vb || (va == vb && a < b);
  };
}

}  // namespace

std::vector<int> top_m_indices(const std::vector<double>& scores, int m) {
  const int n = static_cast<int>(scores.size());
  m = std::clamp(m, 0, n);
  std::vector<int> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + m, order.end(), score_order(scores));
  order.resize(m);
  std::sort(order.begin(), order.end());
  return order;
}

Ranking rank_by_scores(const std::vector<double>& scores, std::vector<double> hover) {
  Ranking r;
  r.order.resize(scores.size());
  std::iota(r.order.begin(), r.order.end(), 0);
  std::sort(r.order.begin(), r.order.end(), score_order(scores));
  r.hover = std::move(hover);
  r.scores = scores;
  return r;
}

Selection prefix_selection(const MethodInput& in, const Ranking& ranking, int m) {
  m = std::clamp(m, 0, static_cast<int>(ranking.order.size()));
  std::vector<int> kept(ranking.order.begin(), ranking.order.begin() + m);
  std::sort(kept.begin(), kept.end());
  Selection sel;
  sel.indices.reserve(m);
  for (int i : kept) sel.indices.push_back(in.mid_begin + i);
  sel.weights.assign(m, 1.0);
  sel.middle_scores = ranking.hover;
  return sel;
}

Selection top_m_selection(const MethodInput& in, std::vector<double> scores, int m) {
  Selection sel;
  for (int i : top_m_indices(scores, m)) {
    sel.indices.push_back(in.mid_begin + i);
    sel.weights.push_back(1.0);
  }
  sel.middle_scores = std::move(scores);
  return sel;
}

}  // namespace kvscope
