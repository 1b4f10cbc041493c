// The Error view's class (app/views/view_error.cpp: the sweep, heatmap, positions and query panels,
// export, state; app/views/view_error_tuning.cpp: the two-parameter tuning heatmap), shared by the
// two files that define it. Only make_error_view() (app/views/view.h) is public.
#pragma once

#include <imgui.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <sstream>

#include "app/app_state.h"
#include "app/colormap.h"
#include "app/grid_values.h"
#include "app/method_list.h"
#include "app/overlap_grid.h"
#include "app/plot.h"
#include "app/result_status.h"
#include "app/ui_layout.h"
#include "app/views/set_figures.h"
#include "app/views/view.h"
#include "engine/core/error.h"
#include "engine/eval/sweep_grid.h"
#include "engine/io/json_fields.h"

namespace kvscope::app::error_view {

// A number for JSON, null when NaN (harm not computed).
inline nlohmann::json finite_or_null(double v) {
  return std::isnan(v) ? nlohmann::json() : nlohmann::json(v);
}

// Mean over the group's query heads of the relative error at each evaluation position.
inline void per_position(const HeadRun& r, std::vector<double>* x, std::vector<double>* y) {
  x->clear();
  y->clear();
  if (r.per_query_head.empty()) return;
  size_t E = r.per_query_head[0].size();
  for (size_t t = 0; t < E; ++t) {
    double sum = 0;
    int cnt = 0;
    for (const auto& head : r.per_query_head)
      if (t < head.size()) {
        sum += head[t].relative;
        ++cnt;
      }
    x->push_back(r.per_query_head[0][t].position);
    y->push_back(cnt ? sum / cnt : NAN);
  }
}

// The tuning grid's result (a derived result of the Error view, keyed by what it was run for).
struct TuneResult {
  Grid2Result grid;
  int scope = 0;  // the scope the grid was computed for (3: a capture set's tuning prompts)
  // Scope 3: `grid` holds the mean over the tuning prompts of each prompt's whole-capture figure
  // (seed_std: the std over those prompts); the held-out prompts' mean of the best cell and of
  // the defaults' cell (NaN when there is none).
  int tuning_prompts = 0, held_out_prompts = 0;
  double held_out_best = std::numeric_limits<double>::quiet_NaN();
  double held_out_default = std::numeric_limits<double>::quiet_NaN();
};

inline std::vector<double> parse_values(const std::string& text, const std::string& what) {
  std::vector<double> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t used = 0;
    double v = 0;
    try {
      v = std::stod(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    while (used < item.size() && std::isspace(static_cast<unsigned char>(item[used]))) ++used;
    if (used != item.size() || item.empty())
      throw InputError(what + ": '" + item + "' is not a number");
    out.push_back(v);
  }
  if (out.empty()) throw InputError(what + ": give values separated by commas");
  return out;
}

class ErrorView final : public View {
 public:
  const char* name() const override { return kErrorView; }
  const char* title() const override { return "Error"; }
  const char* help() const override;

  bool ready(const AppState& s) const override;

  void draw(AppState& s) override;

  nlohmann::json export_json(const AppState& s) const override;

  nlohmann::json save_state() const override;
  void load_state(const nlohmann::json& j) override;

  std::string export_csv(const AppState& s) const override;

 private:
  // ---- Tuning two parameters of method A at once (engine/eval/sweep_grid.h): a heatmap of the
  // mean error over the grid and one of its spread over seeds, best and default cells marked.
  void draw_tuning(AppState& s);

  // The tuning grid as a derived result: planned from the settings (method A's parameters,
  // ratio, window, seed, focus) and this view's choices; AppState::reconcile() runs it.
  static constexpr const char* kTune = "tune2";

  void plan(const AppState& s, std::vector<NamedPlan>& out) const override;

  JobPlan plan_tuning(const AppState& s) const;

  // One heatmap of the grid: rows = first parameter, columns = second, value in each cell, a
  // colour bar, the best cell outlined white and the default cell dashed yellow.
  void draw_grid_panel(const char* id, const Grid2Result& g,
                       const std::vector<std::vector<double>>& values, const char* what,
                       const char* bar_label, ImVec2 size);

  void draw_sweep(AppState& s);
  void draw_sweep_toolbar(AppState& s);
  struct SweepSeries {
    std::string method;
    std::vector<double> x, y, lo, hi, sd;
  };
  std::vector<SweepSeries> sweep_series(const AppState& s, std::vector<double>* all_y,
                                        std::vector<double>* ratios) const;
  // The sweep panel over the set's prompts (sweep_y_ 2, while a capture set is open).
  bool shows_set(const AppState& s) const;
  void draw_set_sweep(AppState& s);

  void draw_heatmap(AppState& s);

  void draw_positions(AppState& s);

  void draw_query(AppState& s);

  bool log_attention_ = true;
  std::pair<std::string, double> heat_source_;  // empty method: the background grid
  inline static const std::pair<std::string, double> kOverlapSource{"A/B overlap", -2.0};
  int mode_ = 0;     // 0 overview, 1 tune two parameters
  // The sweep plot's y: 0 relative error, 1 share of the harm dropped, 2 the error over the
  // prompts of the capture set open.
  int sweep_y_ = 0;
  SetFigures set_figures_;
  std::string tune_method_, tune_rows_, tune_cols_, row_values_, col_values_;
  int tune_seeds_ = 3, tune_scope_ = 0;
};

}  // namespace kvscope::app::error_view
