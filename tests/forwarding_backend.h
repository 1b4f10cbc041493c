// A Backend that forwards every op to another one (the CPU's by default), counting the calls of
// the ops the methods run on MethodInput::backend (attention_scores, key_clusters, cache_scores,
// expected_scores, chunk_scores):
// the routing tests (test_methods_baselines.cpp) derive from it to change one op's figures, and
// the device parity tests (test_cuda_parity.cpp) wrap the device in it to see the methods reach
// it. Header-only, for tests.
#pragma once

#include <string>
#include <vector>

#include "engine/methods/method.h"
#include "engine/ops/backend.h"

namespace kvscope::testing {

class ForwardingBackend : public Backend {
 public:
  explicit ForwardingBackend(Backend& inner = cpu_backend()) : inner_(inner) {}
  int calls = 0;  // the methods' ops called through this backend

  std::string name() const override { return "forwarding to " + inner_.name(); }
  bool parallel_in_one_call() const override { return inner_.parallel_in_one_call(); }
  void walk_blocks(const WalkBatch& b) override { inner_.walk_blocks(b); }
  void attention_errors(const ErrorBatch& b) override { inner_.attention_errors(b); }
  double tsne_gradient(const TsneGradInput& in, float* grad) override {
    return inner_.tsne_gradient(in, grad);
  }
  std::vector<int> kcenter(const float* x, int n, int d, int k, int first) override {
    return inner_.kcenter(x, n, d, k, first);
  }
  void attention_scores(const ScoreBatch& b) override {
    ++calls;
    inner_.attention_scores(b);
  }
  void key_clusters(const ClusterBatch& b) override {
    ++calls;
    inner_.key_clusters(b);
  }
  void cache_scores(const CacheScoreBatch& b) override {
    ++calls;
    inner_.cache_scores(b);
  }
  void expected_scores(const ExpectedScoreBatch& b) override {
    ++calls;
    inner_.expected_scores(b);
  }
  void chunk_scores(const ChunkScoreBatch& b) override {
    ++calls;
    inner_.chunk_scores(b);
  }

 protected:
  Backend& inner_;
};

// A method and its parameters, as the routing and device parity tests run them.
struct MethodCase {
  const char* method;
  ParamValues params;
};

// The score-ranking set-ups whose attention scores go through the attention-score op.
inline const std::vector<MethodCase>& score_ranking_cases() {
  static const std::vector<MethodCase> cases = {
      {"h2o", {}},
      {"snapkv", {}},
      {"snapkv", {{"pooling", 1}}},
      {"snapkv", {{"variant", 1}}},
      {"pyramidkv", {}},
      {"tova", {}},
      {"tova", {{"variant", 1}}},
      {"buzz", {{"accumulate", 1}, {"window", 8}, {"threshold", 20}, {"top_up", 1}}},
      {"adakv(snapkv)", {}},
      {"chunkkv(h2o)", {}},
  };
  return cases;
}

}  // namespace kvscope::testing
