// K-norm (Devoto et al., "A Simple and Effective L2 Norm-Based Strategy for KV Cache
// Compression", EMNLP 2024): keys with a low L2 norm tend to receive high attention, so keep the
// m middle tokens whose keys have the lowest L2 norm; weight 1. Needs no queries. The hover score
// is the key norm itself (lower = kept first).
#include <cmath>

#include "engine/methods/method.h"
#include "engine/methods/scoring.h"

namespace kvscope {
namespace {

class KNorm final : public ScoreRankingMethod {
 public:
  std::string name() const override { return "knorm"; }
  std::string summary() const override { return "the m keys of lowest L2 norm"; }
  bool depends_on_seed() const override { return false; }
  // Ranked by the negated norm (lowest norm first); the hover shows the norm itself.
  Ranking rank(const MethodInput& in) const override {
    check_method_input(in, name(), false);
    validate_params(params(), in.params, name());
    const int n_mid = in.mid_end - in.mid_begin;
    std::vector<double> norms(n_mid), negated(n_mid);
    for (int i = 0; i < n_mid; ++i) {
      norms[i] = in.keys->row(in.mid_begin + i).cast<double>().norm();
      negated[i] = -norms[i];
    }
    return rank_by_scores(negated, std::move(norms));
  }
};

}  // namespace

std::unique_ptr<Method> make_knorm() {
  return std::make_unique<KNorm>();
}

}  // namespace kvscope
