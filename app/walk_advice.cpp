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
      {"temp 0.02, gamma 0.1 (unsaturated)",
       "temp 0.02, gamma 0.1",
       {{"temp", 0.02}, {"gamma", 0.1}}},
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

std::vector<int> saturation_remedies(const Method& m, const ParamValues& current) {
  bool has_temp = false, has_gamma = false;
  for (const ParamSpec& p : m.params()) {
    has_temp = has_temp || p.name == "temp";
    has_gamma = has_gamma || p.name == "gamma";
  }
  if (!has_temp) return {};
  const auto& c = walk_comparisons();
  std::vector<int> out;
  for (int i : {2, 1, 5}) {
    const ParamValues& o = c[static_cast<size_t>(i)].overrides;
    const ParamValues next = with_walk_overrides(m, current, o);
    const bool balances = !has_gamma || param_value(m.params(), next, "gamma") > 0;
    if (balances && walk_overrides_change(m, current, o)) out.push_back(i);
  }
  return out;
}

int best_remedy(const WalkAdvice& advice, double current_error) {
  int best = -1;
  double lowest = current_error;
  for (const RemedyEffect& e : advice.effects)
    if (std::isfinite(e.error) && e.error < lowest) lowest = e.error, best = e.comparison;
  return best;
}

}  // namespace kvscope::app
