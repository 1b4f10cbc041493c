// Per-token harm (docs/app.md, "Tokens view"): the exact output change of
// evicting one middle token alone, in double precision. For an evaluation query i with exact
// attention p_ij and exact output o_i, dropping token j renormalises the rest:
//   o_i' - o_i = p_ij / (1 - p_ij) (o_i - v_j),
// so its harm is the mean over the evaluation queries (and the query heads of the GQA group) of
//   p_ij / (1 - p_ij) ||o_i - v_j|| / ||o_i||.
// It depends on the capture's head and the window only, not on the method, ratio or seed.
#pragma once

#include <atomic>
#include <vector>

#include "engine/core/tensor.h"
#include "engine/methods/method.h"

namespace kvscope {

struct LayerData;

struct TokenHarm {
  int sink = 0, eval = 0;
  std::vector<double> harm;  // one per middle position [sink, n-eval), harm[j - sink]
  // The mean exact attention p_ij of every token j in [0, n) over the same queries (0 where a
  // window query does not see j yet): where the exact attention mass lies along the sequence.
  std::vector<double> mass;
};

// queries: n x d each, as ExactReference takes them (the GQA group's query heads, or the keys as
// proxy queries when the capture has none; harm_queries gives the protocol's choice). Throws
// std::invalid_argument on inconsistent shapes or window (as ExactReference). A token holding all
// of a query's attention (1 - p_ij = 0 in double) has infinite harm. A set cancel flag throws
// Cancelled (checked between panels of query rows).
TokenHarm token_harm(const std::vector<const MatrixF*>& queries, const MatrixF& K, const MatrixF& V,
                     int sink, int eval, const std::atomic<bool>* cancel = nullptr);

// The queries the protocol scores errors with for kv head `kv` (engine/eval/protocol.cpp): the GQA
// group's query heads, or the keys themselves when the capture has no queries.
std::vector<const MatrixF*> harm_queries(const LayerData& layer, int kv);

// Harm kept vs harm dropped by a selection (numerator and denominator indices together: a token
// in either is kept). Means are 0 over an empty set.
struct HarmSplit {
  int kept_count = 0, dropped_count = 0;
  double kept_sum = 0, dropped_sum = 0;
  double kept_mean = 0, dropped_mean = 0;
  double total = 0;  // kept_sum + dropped_sum
};
// Throws std::out_of_range for a selected index outside the middle.
HarmSplit harm_split(const TokenHarm& harm, const Selection& sel);

}  // namespace kvscope
