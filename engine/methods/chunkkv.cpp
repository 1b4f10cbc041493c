// ChunkKV (Liu et al., "ChunkKV: Semantic-Preserving KV Cache Compression for Efficient
// Long-Context LLM Inference", 2025), ported from kvpress's ChunkKVPress
// (kvpress/presses/chunkkv_press.py, the reference; docs/methods.md names the commit): the inner
// press's scores are summed over the layer's kv heads, the context is cut into chunks of
// `chunk_length` tokens (aligned at position 0, the last one shorter), a chunk scores the mean of
// its tokens' summed scores, and whole chunks are kept best first; every kv head keeps the same
// tokens.
//
// Mapping to the protocol (docs/methods.md, "kvpress presses"): a middle token scores its
// chunk's score, the chunk's mean taken over its middle tokens only (the chunk that straddles s
// leaves its sink tokens out), and the top m are kept with ties to the lower position, so chunks
// come whole in order of their score and the budget cuts the last one (the press keeps
// max(1, floor(chunks * (1 - ratio))) whole chunks instead, which misses the budget by up to a
// chunk).
#include <algorithm>

#include "engine/core/error.h"
#include "engine/methods/scoring.h"
#include "engine/methods/wrapper_util.h"

namespace kvscope {
namespace {

class ChunkKV final : public WrapperBase {
 public:
  explicit ChunkKV(const Method& inner)
      : WrapperBase("chunkkv", inner,
                    {param_spec("chunk_length", ParamSpec::Type::Int, 1, 65536, 20,
                                "tokens per chunk (aligned at position 0)")}) {}
  std::string summary() const override {
    return "kvpress ChunkKV around " + inner_.name() +
           ": whole 20-token chunks by their mean score summed over the layer's kv heads";
  }
  bool ranks_by_score() const override { return true; }
  bool needs_layer() const override { return true; }
  Selection select(const MethodInput& in) const override { return ranked_selection(in, rank(in)); }
  Selection ranked_selection(const MethodInput& in, const Ranking& r) const override {
    return prefix_selection(in, r, in.budget);
  }
  Ranking rank(const MethodInput& in) const override {
    check(in);
    const int len = static_cast<int>(own_param(in, "chunk_length"));
    const std::vector<std::vector<double>> all = layer_scores(in);
    const int n_mid = in.mid_end - in.mid_begin;
    std::vector<double> summed(n_mid, 0.0);
    for (const std::vector<double>& s : all)
      for (int i = 0; i < static_cast<int>(s.size()); ++i) summed[i] += s[i];
    std::vector<double> scores(n_mid);
    for (int t = in.mid_begin; t < in.mid_end;) {
      const int end = std::min(in.mid_end, (t / len + 1) * len);
      double sum = 0;
      for (int u = t; u < end; ++u) sum += summed[u - in.mid_begin];
      for (int u = t; u < end; ++u) scores[u - in.mid_begin] = sum / (end - t);
      t = end;
    }
    return rank_by_scores(scores, scores);
  }
};

}  // namespace

std::unique_ptr<Method> make_chunkkv(const Method& inner) {
  return std::make_unique<ChunkKV>(inner);
}

}  // namespace kvscope
