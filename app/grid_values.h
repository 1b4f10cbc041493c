// The layer x kv-head grid shared by the Capture view and the Error view's heatmap: values from
// the background grid run (method A's error) or the entropy job, drawn as clickable cells with
// row/column labels and a colour bar.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "app/app_state.h"
#include "app/colormap.h"

namespace kvscope::app {

struct GridValues {
  int layers = 0, heads = 0;
  std::vector<double> mean, spread;  // [layer * heads + head], NaN when missing / refused
  std::vector<std::string> note;     // method note or refusal reason per cell
  std::vector<uint8_t> missing;      // 1: not evaluated (drawn grey), unlike refused (dark red)
  // The progressive grid's CellState per cell (empty for other sources): Stale cells are drawn
  // dimmed, Partial ones say how many seeds they have.
  std::vector<uint8_t> state;
  std::vector<int> seeds_done;
  int seeds = 0;
  double vmin = 0, vmax = 1;
  bool have_values = false;
  std::string caption;  // what is shown, or why nothing is
  std::string unit;
  Colormap map = Colormap::Viridis;
};

// The background grid's cells of method A (slot 0) or B (slot 1), or the entropy grid.
GridValues grid_values(const AppState& s, GridMetric metric, int slot = 0);
// Error cells of one (method, keep ratio) of a report, e.g. the Error view's sweep.
GridValues grid_values_from_report(const AppState& s, const EvalReport& rep,
                                   const std::string& method, double ratio);
// Sets have_values and the colour range (vmin, vmax) from the finite means; a flat grid gets a
// small range around its value.
void finish_range(GridValues& gv);
// Draws the grid filling the available width (cells square-ish, at most `max_height` tall).
void draw_grid(AppState& s, const GridValues& gv, const char* id, float max_height = 420.0f);
nlohmann::json grid_json(const AppState& s);
std::string grid_csv(const AppState& s);

}  // namespace kvscope::app
