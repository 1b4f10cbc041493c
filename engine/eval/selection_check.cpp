#include "engine/eval/selection_check.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace kvscope {

void check_selection(const Selection& sel, int mid_begin, int mid_end, int budget, const Method& m,
                     SelectionUnit which_unit) {
  const std::string method = m.name();
  const bool token = which_unit == SelectionUnit::Token;
  const std::string unit = token ? "token" : "entry", plural = token ? "tokens" : "entries";
  auto check_set = [&](const std::vector<int>& idx, const std::vector<double>& wt,
                       const std::string& which) {
    const std::string set = which.empty() ? "" : which + " ";
    if (idx.size() != wt.size())
      throw std::runtime_error(method + ": " + set + "selection has " + std::to_string(idx.size()) +
                               " indices but " + std::to_string(wt.size()) + " weights");
    std::vector<char> seen(static_cast<size_t>(std::max(mid_end - mid_begin, 0)), 0);
    for (size_t i = 0; i < idx.size(); ++i) {
      if (idx[i] < mid_begin || idx[i] >= mid_end)
        throw std::runtime_error(method + ": " + set + "index " + std::to_string(idx[i]) +
                                 " is outside the middle [" + std::to_string(mid_begin) + ", " +
                                 std::to_string(mid_end) + ")");
      if (seen[idx[i] - mid_begin]++)
        throw std::runtime_error(method + ": " + set + "selection holds " + unit + " " +
                                 std::to_string(idx[i]) + " twice");
      if (!(wt[i] > 0) || !std::isfinite(wt[i])) {
        std::ostringstream weight;
        weight << wt[i];
        throw std::runtime_error(method + ": weight " + weight.str() + " of " + unit + " " +
                                 std::to_string(idx[i]) + " is not positive and finite");
      }
    }
  };
  check_set(sel.indices, sel.weights, sel.separate ? "numerator" : "");
  if (sel.separate) {
    check_set(sel.den_indices, sel.den_weights, "denominator");
  } else if (m.respects_budget() && static_cast<int>(sel.indices.size()) > budget) {
    throw std::runtime_error(method + ": kept " + std::to_string(sel.indices.size()) + " middle " +
                             plural + ", over the budget m = " + std::to_string(budget));
  }
}

}  // namespace kvscope
