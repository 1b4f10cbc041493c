// What a compressed cache keeps of one kv head's middle: token indices and their weights, what
// every method returns and every error figure scores (docs/evaluation.md).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/attention/walk_trace.h"

namespace kvscope {

struct Selection {
  // Absolute token indices in [mid_begin, mid_end), unique, and their positive weights.
  std::vector<int> indices;
  std::vector<double> weights;
  // When `separate`, indices/weights are the numerator selection and den_* the denominator's.
  bool separate = false;
  std::vector<int> den_indices;
  std::vector<double> den_weights;
  // Scores a method ranked by (same length as indices of the middle, or empty), for hover.
  std::vector<double> middle_scores;  // indexed by token - mid_begin
  std::vector<int> cluster;           // optional cluster id per middle token (-1: none)
  std::string note;                   // shown to users: FAIL cases, top-ups, scaled defaults
  std::shared_ptr<WalkTrace> trace;
  // Self-balancing walks: the fraction of walk steps whose p was clipped to 0 or 1 (the sign was
  // forced, not drawn); -1 for methods without a walk.
  double saturation = -1;
};

}  // namespace kvscope
