// Expected Attention (Devoto et al., "Expected Attention: KV Cache Compression by Estimating
// Attention from Future Queries Distribution", 2025), ported from kvpress's
// ExpectedAttentionPress (kvpress/presses/expected_attention_press.py, the reference;
// docs/methods.md names the commit). The queries of the context after `n_sink` tokens, before
// RoPE, give a mean mu and covariance S (divided by their count); RoPE averaged over the next
// `n_future_positions` positions, R = mean_p R(p), moves them to where future queries will be
// (mu' = R mu, S' = R S R^T). A key k (after RoPE) then expects the logit
// k.mu'/sqrt(d) + k^T S' k / (2d) (the log of E[exp(q.k/sqrt(d))] for Gaussian q); the softmax
// over the context's keys after the sinks, averaged over the GQA group's query heads and scaled
// by (score + epsilon) |v|, is the score. The first n_sink tokens score above every other.
//
// Mapping to the protocol (docs/methods.md, "kvpress presses"): the press's prefill is the prefix
// [0, n-E), so the statistics use the captured queries of [n_sink, n-E) rotated back to before
// RoPE (the capture stores them after RoPE; engine/core/rope.h, with the capture's rope_theta and
// rope_layout: a capture without them is refused), the future positions are [n-E, n-E+512), and
// the top m of the middle are kept, weight 1. Everything is double; the RoPE angles are computed
// in double (Hugging Face's rotary embedding computes them in float32). Only unscaled RoPE
// (theta^(-2i/d)) is modelled.
#include <algorithm>
#include <cmath>

#include "engine/core/error.h"
#include "engine/methods/method.h"
#include "engine/methods/scoring.h"
#include "engine/ops/backend.h"

namespace kvscope {
namespace {

std::vector<ParamSpec> ea_params() {
  return {
      param_spec("n_future_positions", ParamSpec::Type::Int, 1, 1 << 20, 512,
                 "future positions RoPE is averaged over"),
      param_spec("n_sink", ParamSpec::Type::Int, 0, 4096, 4,
                 "first tokens left out of the query statistics and kept first"),
      param_spec("use_covariance", ParamSpec::Type::Bool, 0, 1, 1,
                 "add the queries' covariance term k^T S k / (2d)"),
      param_spec("use_vnorm", ParamSpec::Type::Bool, 0, 1, 1,
                 "scale by the value norm: (score + epsilon) |v|"),
      param_spec("epsilon", ParamSpec::Type::Float, 0, 1, 0, "added before the value-norm scaling"),
  };
}

class ExpectedAttention final : public ScoreRankingMethod {
 public:
  std::string name() const override { return "expected-attention"; }
  std::string summary() const override {
    return "kvpress Expected Attention: top m by the attention Gaussian future queries "
           "(mean, covariance, averaged RoPE) expect, times |v|";
  }
  std::vector<ParamSpec> params() const override { return ea_params(); }
  bool needs_queries() const override { return true; }
  bool needs_rope() const override { return true; }
  bool depends_on_seed() const override { return false; }
  Ranking rank(const MethodInput& in) const override {
    check_method_input(in, name(), true);
    validate_params(params(), in.params, name());
    if (!in.rope.known())
      throw InputError(name() +
                       ": needs the capture's RoPE (rope_theta and rope_layout) to rotate the "
                       "queries back to before RoPE, and " +
                       (in.rope.missing.empty() ? std::string("it is unknown") : in.rope.missing));
    const auto specs = params();
    const int future = static_cast<int>(param_value(specs, in.params, "n_future_positions"));
    const int sink = static_cast<int>(param_value(specs, in.params, "n_sink"));
    const bool use_cov = param_value(specs, in.params, "use_covariance") >= 0.5;
    const bool use_vnorm = param_value(specs, in.params, "use_vnorm") >= 0.5;
    const double eps = param_value(specs, in.params, "epsilon");
    const int ctx = in.mid_end, d = static_cast<int>(in.keys->cols());
    if (ctx <= sink)
      throw InputError(name() + ": the context [0, n-E) has " + std::to_string(ctx) +
                       " tokens, not more than n_sink = " + std::to_string(sink));
    const int count = ctx - sink;

    // R = mean over positions p in [next, next + future) of RoPE's rotation at p, next the
    // position after the context's last token (ctx when rows are tokens 0..n-1).
    const int next = (in.positions ? (*in.positions)[ctx - 1] : ctx - 1) + 1;
    MatrixD R = MatrixD::Zero(d, d);
    for (int i = 0; i < d / 2; ++i) {
      const double freq = std::pow(in.rope.theta, -2.0 * i / d);
      double c = 0, s = 0;
      for (int p = next; p < next + future; ++p) {
        c += std::cos(p * freq);
        s += std::sin(p * freq);
      }
      c /= future, s /= future;
      const int a = rope_first(in.rope.layout, d, i), b = rope_second(in.rope.layout, d, i);
      R(a, a) = c, R(a, b) = -s, R(b, a) = s, R(b, b) = c;
    }

    // The queries before RoPE, then the op (engine/ops/expected_scores.h) on the method's
    // backend: the statistics, the expected logits, their softmax averaged over the group and
    // the value-norm scaling.
    std::vector<MatrixD> unrotated;
    unrotated.reserve(in.queries.size());
    ExpectedScoreHead head;
    for (const MatrixF* Q : in.queries) {
      if (in.cancel && in.cancel->load()) throw Cancelled();
      unrotated.push_back(unrotate_rows(*Q, sink, ctx, in.rope, in.positions));
      head.queries.push_back(unrotated.back().data());
    }
    std::vector<double> mean_probs(count);
    head.keys = in.keys->row(sink).data();
    head.values = in.values->row(sink).data();
    head.scores = mean_probs.data();
    ExpectedScoreBatch batch;
    batch.count = count;
    batch.d = d;
    batch.dv = static_cast<int>(in.values->cols());
    batch.rotation = R.data();
    batch.use_covariance = use_cov;
    batch.use_vnorm = use_vnorm;
    batch.epsilon = eps;
    batch.heads.push_back(std::move(head));
    batch.cancel = in.cancel;
    method_backend(in).expected_scores(batch);
    double best = -INFINITY;
    for (int j = 0; j < count; ++j) best = std::max(best, mean_probs[j]);
    std::vector<double> scores(in.mid_end - in.mid_begin);
    for (int t = in.mid_begin; t < in.mid_end; ++t)
      scores[t - in.mid_begin] = t < sink ? best + 1 : mean_probs[t - sink];
    return rank_by_scores(scores, scores);
  }
};

}  // namespace

std::unique_ptr<Method> make_expected_attention() {
  return std::make_unique<ExpectedAttention>();
}

}  // namespace kvscope
