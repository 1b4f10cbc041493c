// The grid's A/B overlap (the Error view's heatmap source "A/B overlap"): for
// every (layer, kv head), how far methods A and B keep the same middle tokens at the current
// settings (keep ratio or token budget, seed, parameters): the Jaccard index |A n B| / |A u B|
// of their kept sets (engine/eval/selection_overlap.h), with |A|, |B| and |A n B| per cell.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "app/app_state.h"
#include "app/grid_values.h"

namespace kvscope::app {

inline constexpr const char* kOverlap = "overlap";

struct OverlapGrid {
  int layers = 0, heads = 0;
  std::string method_a, method_b;
  std::vector<double> jaccard;            // [layer * heads + head], NaN when refused or failed
  std::vector<int> a_kept, b_kept, both;  // |A|, |B|, |A n B|
  std::vector<std::string> note;          // why a cell has no value
};

// The job computing it (selections only, no errors): wanted while method B is on.
JobPlan plan_overlap(const AppState& s);
// Its cells as a grid (Jaccard, 0..1), for draw_grid.
GridValues overlap_grid_values(const AppState& s);
nlohmann::json overlap_json(const AppState& s);

}  // namespace kvscope::app
