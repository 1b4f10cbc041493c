// Statistics of attention that the app shows next to the methods' errors: the attention entropy
// of a head's evaluation queries, and the estimator's own normalised weights over the keys (what
// a method's selection turns softmax attention into). Double precision, GL-free.
#pragma once

#include <atomic>
#include <vector>

#include "engine/eval/protocol.h"
#include "engine/io/capture.h"
#include "engine/methods/method.h"

namespace kvscope {

// Mean over the evaluation queries [n-E, n) of the GQA group's query heads of the attention
// entropy -sum_i p_i log p_i (nats) of kv head `kv_head`. NaN when the layer has no queries or
// the head is refused. A set `cancel` throws Cancelled between queries.
double mean_attention_entropy(const LayerData& layer, int kv_head, const EvalWindow& w,
                              const std::atomic<bool>* cancel = nullptr);

// The estimator's normalised attention weights over keys [0, j] for query `q`: exp(q.k_i/sqrt(d))
// times weight 1 for sinks and the evaluation window, the method's (denominator) weight for its
// selected middle keys, 0 for dropped keys; normalised to sum 1.
std::vector<double> estimator_weights(const float* q, const MatrixF& K, int j, const EvalWindow& w,
                                      const Selection& sel);

}  // namespace kvscope
