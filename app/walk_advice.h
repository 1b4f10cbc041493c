// What the Walk view offers against a saturated walk (p_i clipped to 0 or 1, so the signs are
// forced): the parameter sets it can compare side by side, and which one to suggest. A suggestion
// must change the settings: after "use temp 0.1, block 256" a head that is still saturated gets
// the next remedy, not the same advice again.
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

// The comparison to suggest for a saturated walk: the first of the remedies (the authors'
// notebook's temp 0.1 with block 256, then temp 0.1, then gamma 0) that changes the settings;
// -1 when none does (or the method has no temp).
int saturation_remedy(const Method& m, const ParamValues& current);

}  // namespace kvscope::app
