// streaming (StreamingLLM, Xiao et al. 2023; DESIGN.md section 4): the attention sinks and a
// recent window are kept by the protocol; of the middle it keeps the m most recent tokens
// [mid_end - m, mid_end), each at weight 1 (no reweighting: dropped tokens simply vanish).
#include <algorithm>

#include "engine/error.h"
#include "engine/method.h"

namespace kvscope {
namespace {

class Streaming final : public Method {
 public:
  std::string name() const override { return "streaming"; }
  std::string summary() const override {
    return "StreamingLLM: the m most recent middle tokens, weight 1";
  }
  Selection select(const MethodInput& in) const override {
    const int n_mid = in.mid_end - in.mid_begin;
    if (n_mid < 0) throw InputError("streaming: inverted middle");
    const int m = std::clamp(in.budget, 0, n_mid);
    Selection sel;
    for (int i = in.mid_end - m; i < in.mid_end; ++i) sel.indices.push_back(i);
    sel.weights.assign(m, 1.0);
    return sel;
  }
};

}  // namespace

std::unique_ptr<Method> make_streaming() {
  return std::make_unique<Streaming>();
}

}  // namespace kvscope
