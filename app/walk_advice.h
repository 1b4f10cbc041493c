// What the Walk view offers against a saturated walk (p_i clipped to 0 or 1, so the signs are
// forced): the parameter sets it can compare side by side, and which one to suggest. A suggestion
// must change the settings and lower this head's error, computed before it is offered; it never
// switches the balancing off (gamma 0).
#pragma once

#include <string>
#include <vector>

#include "engine/methods/method.h"

namespace kvscope::app {

struct WalkComparison {
  const char* label;  // combo entry
  const char* short_label;
  ParamValues overrides;
};

// Index 0 is "off" (no side by side).
const std::vector<WalkComparison>& walk_comparisons();

// Method A's parameters with `overrides` applied (only the parameters the method has).
ParamValues with_walk_overrides(const Method& m, const ParamValues& current,
                                const ParamValues& overrides);

// Whether applying `overrides` gives other effective parameter values than `current` (defaults
// filled in on both sides).
bool walk_overrides_change(const Method& m, const ParamValues& current,
                           const ParamValues& overrides);

// The comparisons to try against a saturated walk, in the order they are offered: the authors'
// notebook's temp 0.1 with block 256, temp 0.1, and the unsaturated walk of the Theory view (temp
// 0.02, gamma 0.1), each only when it changes the settings. Never gamma 0: it switches the
// balancing off. Empty for a method without temp.
std::vector<int> saturation_remedies(const Method& m, const ParamValues& current);

// What each remedy does to the focused head, computed before any is offered (the Walk view's
// job walk.advice): the head's mean relative error and the walk's saturation under it.
struct RemedyEffect {
  int comparison = 0;  // index into walk_comparisons()
  double error = 0;
  double saturation = -1;
};
struct WalkAdvice {
  std::vector<RemedyEffect> effects;
};

// The remedy to offer: the one with the lowest error when it is below `current_error`, or -1
// (none helps this head).
int best_remedy(const WalkAdvice& advice, double current_error);

}  // namespace kvscope::app
