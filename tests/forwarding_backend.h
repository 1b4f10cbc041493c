// The method cases the routing tests (test_methods_baselines.cpp) and the device parity tests
// (test_cuda_parity.cpp) run through ForwardingBackend (tests/op_cases.h). Header-only, for tests.
#pragma once

#include <string>
#include <vector>

#include "engine/methods/method.h"
#include "engine/ops/backend.h"
#include "tests/op_cases.h"

namespace kvscope::testing {

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
