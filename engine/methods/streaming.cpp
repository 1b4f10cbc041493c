// streaming (StreamingLLM, Xiao et al. 2023; docs/methods.md): the attention sinks and a
// recent window are kept by the protocol; of the middle it keeps the m most recent tokens
// [mid_end - m, mid_end), each at weight 1 (no reweighting: dropped tokens simply vanish).
#include <algorithm>

#include "engine/core/error.h"
#include "engine/methods/method.h"
#include "engine/methods/scoring.h"

namespace kvscope {
namespace {

class Streaming final : public ScoreRankingMethod {
 public:
  std::string name() const override { return "streaming"; }
  std::string summary() const override {
    return "StreamingLLM: the m most recent middle tokens, weight 1";
  }
  bool depends_on_seed() const override { return false; }
  bool ranks_with_scores() const override { return false; }
  // Ranked by position, most recent first: the top m are [mid_end - m, mid_end).
  Ranking rank(const MethodInput& in) const override {
    const int n_mid = in.mid_end - in.mid_begin;
    if (n_mid < 0) throw InputError("streaming: inverted middle");
    Ranking r;
    r.order.resize(n_mid);
    for (int i = 0; i < n_mid; ++i) r.order[i] = n_mid - 1 - i;
    return r;
  }
};

}  // namespace

std::unique_ptr<Method> make_streaming() {
  return std::make_unique<Streaming>();
}

}  // namespace kvscope
