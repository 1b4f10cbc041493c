#include "engine/eval/attention_stats.h"

#include <cmath>

#include "engine/attention/exact_attention.h"
#include "engine/core/error.h"

namespace kvscope {

double mean_attention_entropy(const LayerData& layer, int kv_head, const EvalWindow& w,
                              const std::atomic<bool>* cancel) {
  const size_t h = static_cast<size_t>(kv_head);
  if (layer.queries.empty() || h >= layer.keys.size()) return NAN;
  if (h < layer.refused.size() && !layer.refused[h].empty()) return NAN;
  double sum = 0;
  int count = 0;
  for (const MatrixF* Q : layer.group_queries(kv_head)) {
    for (int j = w.n - w.eval; j < w.n; ++j) {
      if (cancel && cancel->load(std::memory_order_relaxed)) throw Cancelled();
      const std::vector<double> p = attention_row(Q->row(j).data(), layer.keys[h], j);
      double e = 0;
      for (double x : p)
        if (x > 0) e -= x * std::log(x);
      sum += e;
      ++count;
    }
  }
  return count ? sum / count : NAN;
}

std::vector<double> estimator_weights(const float* q, const MatrixF& K, int j, const EvalWindow& w,
                                      const Selection& sel) {
  const size_t len = static_cast<size_t>(j + 1);
  std::vector<double> w_key(len, 0.0);
  for (int i = 0; i < std::min(w.sink, j + 1); ++i) w_key[static_cast<size_t>(i)] = 1;
  for (int i = std::max(0, w.n - w.eval); i <= j; ++i) w_key[static_cast<size_t>(i)] = 1;
  const auto& idx = sel.separate ? sel.den_indices : sel.indices;
  const auto& wts = sel.separate ? sel.den_weights : sel.weights;
  for (size_t t = 0; t < idx.size() && t < wts.size(); ++t)
    if (idx[t] >= 0 && idx[t] <= j) w_key[static_cast<size_t>(idx[t])] = wts[t];
  const int d = static_cast<int>(K.cols());
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  std::vector<double> logits(len, -INFINITY);
  double mx = -INFINITY;
  for (int i = 0; i <= j; ++i) {
    if (w_key[static_cast<size_t>(i)] <= 0) continue;
    double dot = 0;
    for (int c = 0; c < d; ++c) dot += static_cast<double>(q[c]) * K(i, c);
    logits[static_cast<size_t>(i)] = dot * scale + std::log(w_key[static_cast<size_t>(i)]);
    mx = std::max(mx, logits[static_cast<size_t>(i)]);
  }
  std::vector<double> out(len, 0.0);
  double z = 0;
  for (size_t i = 0; i < len; ++i)
    if (std::isfinite(logits[i])) z += (out[i] = std::exp(logits[i] - mx));
  if (z > 0)
    for (double& x : out) x /= z;
  return out;
}

}  // namespace kvscope
