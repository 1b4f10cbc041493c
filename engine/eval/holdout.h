// Held-out tuning over a capture set (docs/evaluation.md, "Held-out tuning"): a parameter value
// chosen on some prompts is judged on others, so the gap between the error it was tuned on and
// the error it gets on prompts it never saw is in plain view.
#pragma once

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/eval/protocol.h"
#include "engine/eval/set_eval.h"

namespace kvscope {

// Which prompts (indices into a set's entries, ascending) tune and which are held out.
struct PromptSplit {
  std::vector<int> tuning, held_out;
};

// round(holdout * count) prompts held out (at least one, and at least one left to tune on when
// holdout > 0; none when holdout is 0), drawn by a Fisher-Yates shuffle on KVScope's counter-based
// random numbers (engine/core/random.h) with `seed`: the same split on every machine. Throws
// SettingError naming --holdout when holdout is outside [0, 1) or the set has fewer than two
// prompts to split.
PromptSplit split_prompts(int count, double holdout, uint64_t seed);

// A figure over some prompts: the mean over them of each prompt's figure with its 95%
// Student-t interval (as SetRow), NaN where no prompt has one.
struct PromptFigure {
  double mean = std::numeric_limits<double>::quiet_NaN();
  double ci_low = std::numeric_limits<double>::quiet_NaN();
  double ci_high = std::numeric_limits<double>::quiet_NaN();
  int prompts = 0;
};

// One ratio (or budget) column, for the whole capture (layer kAllLayers) or one layer.
struct HoldoutRow {
  int column = 0;
  std::string label;  // as SetRow::label
  int layer = kAllLayers;
  int best_point = -1;  // the point with the lowest tuning mean (-1: no point has a figure)
  PromptFigure best_tuning, best_held_out;
  PromptFigure default_tuning, default_held_out;
  // What tuning bought on prompts it never saw: the default's held-out mean minus the best's
  // (positive: the tuned value helps there too).
  double held_out_gain() const { return default_held_out.mean - best_held_out.mean; }
};

struct HoldoutReport {
  PromptSplit split;
  std::vector<ParamValues> points;  // the swept points, the default's included
  int default_point = 0;
  // Every point's figure over the tuning prompts, per whole-capture column: [point][column].
  std::vector<std::vector<PromptFigure>> tuning_by_point;
  std::vector<HoldoutRow> rows;  // whole-capture rows, then (with per_layer) layer by layer
  nlohmann::json to_json() const;
};

// reports[c][p]: capture c of the set evaluated at point p (EvalReport::split_points of a run
// with EvalSpec::points). A capture's figure at a point is its whole-capture mean (the summary of
// a single eval) or, per layer, the mean over that layer's heads of their mean relative error.
HoldoutReport holdout_tuning(const std::vector<std::vector<EvalReport>>& reports,
                             const std::vector<ParamValues>& points, int default_point,
                             const PromptSplit& split, bool per_layer);

}  // namespace kvscope
