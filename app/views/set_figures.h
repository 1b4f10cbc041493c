// A capture set's figures as the views draw them (docs/app.md, "Set view"): the set's evaluation
// (methods A and B on every capture, planned by plan_set_eval under one key whichever view asks)
// and what is derived from its report at the current keep ratio: method A's mean over prompts per
// layer and kv head with its 95% interval and its spread over prompts (a grid the Capture view and
// the Set view draw), error against keep ratio with the interval as a band (the Set view and the
// Error view), and the prompts ranked by how much A loses to B.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "app/app_state.h"
#include "app/grid_values.h"
#include "engine/eval/set_eval.h"

namespace kvscope::app {

inline constexpr const char* kSetEval = "set.eval";

// Plans the set's evaluation (result kSetEval) when a set is open; called by every view that shows
// set figures, so the result is wanted while any of them does.
void plan_set_eval(const AppState& s, std::vector<NamedPlan>& out);
// Whether a screenshot may be taken: the set's figures are there, held for Run, or failed.
bool set_eval_settled(const AppState& s);

// One prompt's whole-capture figures of A and B at the current ratio, for the prompt list.
struct PromptRow {
  int entry = 0;
  double a = NAN, b = NAN;
  double loss() const { return a - b; }  // how much A loses to B (positive: B is better)
};

// What is drawn of a report, derived once per report and keep ratio (update()).
struct SetFigures {
  std::shared_ptr<const SetEvalReport> report;  // held, so that the rows never outlive it
  int column = -1;           // the keep ratio's column in the report, -1 when it has none
  std::vector<SetRow> rows;  // SetEvalReport::summary()
  // Per (layer, kv head) of method A at the column: the summary row and the spread over prompts.
  int layers = 0, heads = 0;
  std::vector<const SetRow*> cell;  // [layer * heads + head], null when missing
  std::vector<double> lo, hi;       // min and max over prompts
  std::vector<PromptRow> prompts;   // sorted by loss, largest first

  // From the current kSetEval report (cleared when there is none).
  void update(const AppState& s);
  // Method A's cells: the mean over prompts, or (by_interval) the width of the 95% interval; each
  // cell's note gives the interval and the spread over prompts in full.
  GridValues grid(const AppState& s, bool by_interval) const;
  // Error against keep ratio over the set, A and B, the 95% interval across prompts as a band.
  void draw_plot(const AppState& s, const char* id) const;
};

// A method's colour in set figures: A's slot colour or B's.
ImU32 set_slot_colour(const AppState& s, const std::string& method);

}  // namespace kvscope::app
