// Exact causal attention and the weighted estimator of DESIGN.md section 3, in double precision.
#pragma once

#include <vector>

#include "engine/method.h"
#include "engine/tensor.h"

namespace kvscope {

struct EvalWindow;

// Exact output Attn(q; K[0..upto], V[0..upto]) (causal: keys 0..upto inclusive), scale 1/sqrt(d).
VectorD exact_attention(const float* q, const MatrixF& K, const MatrixF& V, int upto);

// Errors for one evaluation query j.
struct QueryError {
  int position = 0;        // j
  double relative = 0;     // ||z_j - Attn_j|| / ||Attn_j||
  double normalized = 0;   // ||z_j - Attn_j|| / (||softmax_j|| * ||V_j||_F), the paper's Eq. (2)
  double mass = 0;         // exact attention mass on the kept set (sinks + selection + window)
};

// The approximation z_j of DESIGN.md 3 for query q at position j: sinks [0, s) and window
// [n-E, j] at weight 1, the selection with its weights entering as logit biases log w (separate
// numerator and denominator sets when sel.separate).
VectorD weighted_attention(const float* q, const MatrixF& K, const MatrixF& V, int j,
                           const EvalWindow& w, const Selection& sel);

// Every evaluation query of one query head: Q is n x d; returns E entries for j = n-E .. n-1.
std::vector<QueryError> evaluate_query_head(const MatrixF& Q, const MatrixF& K, const MatrixF& V,
                                            const EvalWindow& w, const Selection& sel);

// Softmax attention weights of query position j over keys [0, j] (for views).
std::vector<double> attention_row(const float* q, const MatrixF& K, int j);

}  // namespace kvscope
