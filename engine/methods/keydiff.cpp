// KeyDiff (Park et al., "KeyDiff: Key Similarity-Based KV Cache Eviction for Long-Context LLM
// Inference", 2025), ported from kvpress's KeyDiffPress (kvpress/presses/keydiff_press.py, the
// reference; docs/methods.md names the commit): the anchor is the mean of the L2-normalised keys
// of the context, and a key scores minus its cosine similarity to the anchor, so the keys least
// like the average are kept. Needs no queries.
//
// Mapping to the protocol (docs/methods.md, "kvpress presses"): the press's prefill is the
// prefix [0, n-E), so the anchor averages the keys of [0, n-E); the top m of the middle are kept,
// weight 1. (kvpress recommends BlockPress around it to follow the paper's block-wise eviction;
// this is the plain press.)
#include <algorithm>
#include <cmath>

#include "engine/methods/method.h"
#include "engine/methods/scoring.h"

namespace kvscope {
namespace {

class KeyDiff final : public ScoreRankingMethod {
 public:
  std::string name() const override { return "keydiff"; }
  std::string summary() const override {
    return "kvpress KeyDiff: the m keys least cosine-similar to the mean normalised key";
  }
  bool depends_on_seed() const override { return false; }
  Ranking rank(const MethodInput& in) const override {
    check_method_input(in, name(), false);
    validate_params(params(), in.params, name());
    const MatrixF& K = *in.keys;
    const int ctx = in.mid_end, d = static_cast<int>(K.cols());
    // F.normalize(p=2, eps=1e-12): x / max(|x|, eps), then the mean over the context.
    Eigen::VectorXd anchor = Eigen::VectorXd::Zero(d);
    std::vector<double> norms(ctx);
    for (int t = 0; t < ctx; ++t) {
      const Eigen::VectorXd k = K.row(t).cast<double>().transpose();
      norms[t] = k.norm();
      anchor += k / std::max(norms[t], 1e-12);
    }
    if (ctx > 0) anchor /= ctx;
    const double anchor_norm = anchor.norm();
    // F.cosine_similarity(eps=1e-8): x.y / max(|x| |y|, eps).
    std::vector<double> scores(in.mid_end - in.mid_begin);
    for (int t = in.mid_begin; t < in.mid_end; ++t) {
      const double dot = K.row(t).cast<double>().dot(anchor.transpose());
      scores[t - in.mid_begin] = -dot / std::max(norms[t] * anchor_norm, 1e-8);
    }
    return rank_by_scores(scores, scores);
  }
};

}  // namespace

std::unique_ptr<Method> make_keydiff() {
  return std::make_unique<KeyDiff>();
}

}  // namespace kvscope
