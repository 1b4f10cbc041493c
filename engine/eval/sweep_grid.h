// Tuning two parameters at once: the evaluation protocol (engine/eval/protocol.h, run_eval) of one
// method over the product of two parameter lists, collected as a grid per keep ratio: mean error
// over heads, its spread over seeds, and every head's mean, with the best cell and the default
// cell. One run_eval for all cells (EvalSpec::points), shared by `kvscope-cli sweep --grid2` and
// the Error view's tuning heatmap.
#pragma once

#include <atomic>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/eval/protocol.h"

namespace kvscope {

class CaptureFile;
class Backend;

struct GridAxis {
  std::string name;            // parameter name without the method prefix ("gamma")
  std::vector<double> values;  // as given (rows / columns in this order)
};

struct Grid2Spec {
  const Method* method = nullptr;
  GridAxis rows, cols;
  ParamValues fixed;  // other parameters of the method, held at these values
};

struct Grid2Result {
  std::string method;
  GridAxis rows, cols;
  ParamValues fixed;
  std::vector<double> ratios;
  std::vector<std::pair<int, int>> heads;  // (layer, kv head) of the per-head values
  // [ratio][row][col]: mean over heads of the head means, and the std over seeds of the mean
  // over heads (EvalSummary); NaN where every head failed or was refused.
  std::vector<std::vector<std::vector<double>>> mean, seed_std;
  // [ratio][row][col][head]: the head's mean over seeds (NaN when refused or failed).
  std::vector<std::vector<std::vector<std::vector<double>>>> head_mean;
  std::vector<std::string> failures;  // "gamma=1 temp=0.3: ..." per failing cell
  std::vector<std::string> notes;
  int seeds = 0;
  // Cell of the smallest mean at ratio r (of the whole capture or of one head: head >= 0),
  // {-1, -1} when none is finite.
  std::pair<int, int> best(size_t r, int head = -1) const;
  // Cell whose values equal the method's defaults for both parameters, {-1, -1} when the grid
  // does not contain them. `defaults` from the method's ParamSpecs.
  std::pair<int, int> default_cell() const;
  double default_row_value = 0, default_col_value = 0;
  nlohmann::json to_json() const;
  // One row per (ratio, row value, col value[, layer, head]).
  std::string to_csv(bool per_head) const;
};

// Runs the grid: base.methods and base.params are replaced by the method and each cell's
// parameters. progress(done, total) counts work items (head, cell, ratio). Throws InputError for
// bad specs (same parameter twice, unknown names), Cancelled when `cancel` is set.
Grid2Result run_grid2(CaptureFile& capture, const EvalSpec& base, const Grid2Spec& g,
                      const std::function<void(int, int)>& progress = {},
                      const std::atomic<bool>* cancel = nullptr, Backend* backend = nullptr);

}  // namespace kvscope
