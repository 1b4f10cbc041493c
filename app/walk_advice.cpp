#include "app/walk_advice.h"

#include <cmath>

namespace kvscope::app {

const std::vector<WalkComparison>& walk_comparisons() {
  static const std::vector<WalkComparison> c = {
      {"off", "", {}},
      {"temp 0.1 (authors' notebook)", "temp 0.1", {{"temp", 0.1}}},
      {"temp 0.1, block 256 (notebook)", "temp 0.1, block 256", {{"temp", 0.1}, {"block", 256}}},
      {"gamma 0 (uniform signs)", "gamma 0", {{"gamma", 0}}},
      {"temp 1, gamma 4 (defaults)", "temp 1, gamma 4", {{"temp", 1}, {"gamma", 4}}},
  };
  return c;
}

ParamValues with_walk_overrides(const Method& m, const ParamValues& current,
                                const ParamValues& overrides) {
  ParamValues out = current;
  for (const auto& [k, v] : overrides)
    for (const ParamSpec& p : m.params())
      if (p.name == k) out[k] = v;
  return out;
}

bool walk_overrides_change(const Method& m, const ParamValues& current,
                           const ParamValues& overrides) {
  const ParamValues next = with_walk_overrides(m, current, overrides);
  for (const ParamSpec& p : m.params())
    if (param_value(m.params(), current, p.name) != param_value(m.params(), next, p.name))
      return true;
  return false;
}

int saturation_remedy(const Method& m, const ParamValues& current) {
  bool has_temp = false;
  for (const ParamSpec& p : m.params()) has_temp = has_temp || p.name == "temp";
  if (!has_temp) return -1;
  const auto& c = walk_comparisons();
  for (int i : {2, 1, 3})
    if (walk_overrides_change(m, current, c[static_cast<size_t>(i)].overrides)) return i;
  return -1;
}

}  // namespace kvscope::app
