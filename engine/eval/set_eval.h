// Evidence across prompts (docs/evaluation.md, "Capture sets"): the protocol run on every capture
// of a set, each capture's figures exactly those of `eval` on that file, and their aggregate per
// method, ratio (or budget), layer and kv head: the mean over prompts with a 95% Student-t
// interval across prompts, each method's wins, and the prompts where it loses most to the best.
#pragma once

#include <atomic>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/eval/capture_set.h"
#include "engine/eval/protocol.h"

namespace kvscope {

// Layer / kv head of a whole-capture row.
constexpr int kAllLayers = -1;

// One aggregate row: a method at one ratio (or budget) column, on one (layer, kv head) or on the
// whole capture (layer = kv_head = kAllLayers, the capture's mean over heads).
struct SetRow {
  std::string method;
  int column = 0;     // index into the spec's ratios (or budgets)
  std::string label;  // "0.5" for a keep ratio, "B256" for a budget of 256 middle tokens
  int layer = kAllLayers, kv_head = kAllLayers;
  double mean = 0;  // over prompts of the per-prompt figure (mean relative error)
  double ci_low = std::numeric_limits<double>::quiet_NaN();   // 95% Student-t interval of the
  double ci_high = std::numeric_limits<double>::quiet_NaN();  // mean; NaN with one prompt
  int prompts = 0;       // prompts with a figure (refused and failed heads have none)
  int wins = 0;          // prompts where this method's figure is the lowest (ties count for each)
  double mean_rank = 0;  // over prompts, 1 = best (whole-capture rows; competition ranking)
};

// A prompt where a method loses to the best method of that prompt (whole-capture figures).
struct PromptLoss {
  std::string method;
  int column = 0;
  std::string label;  // the column's label, as SetRow::label
  int capture = 0;    // index into the set's entries
  std::string best;   // the best method on that prompt
  double loss = 0;    // method's figure minus the best's (>= 0)
};

struct SetEvalReport {
  std::string source;                    // the manifest or folder
  std::vector<CaptureSetEntry> entries;  // in the set's order
  std::vector<EvalReport> captures;      // one per entry: `eval` on that file (this shard's part)
  int shard_index = 0, shard_count = 1;

  // The aggregate rows, whole-capture rows first, then per (layer, kv head); in method, column
  // order. Only complete reports (every shard merged) are aggregated.
  std::vector<SetRow> summary() const;
  // For each method and column, the `per_method` prompts where it loses most to the best.
  std::vector<PromptLoss> worst_prompts(int per_method = 3) const;
  // The per-capture rows: a single capture's CSV columns with `capture` (the entry's path as the
  // set lists it) first; and the aggregate rows (method, ratio, layer, kv_head, mean, ci_low,
  // ci_high, prompts, wins; layer and kv_head "all" for whole-capture rows).
  std::string captures_csv() const;
  std::string summary_csv() const;
  nlohmann::json to_json() const;
  static SetEvalReport from_json(const nlohmann::json& j);  // throws InputError
};

// Whether `j` is a set report (its "format" is kvscope-set-report/1), not one capture's.
bool is_set_report(const nlohmann::json& j);

// How a column of `spec` is named in set reports: the keep ratio in its shortest exact form
// ("0.5"), or "B256" for a budget of 256 middle tokens.
std::string set_column_label(const EvalSpec& spec, int column);

using SetEvalProgress = std::function<void(int done, int total)>;

// How many captures run_set_eval evaluates at once: 2 on the CPU with two threads or more and two
// captures or more (each on half the threads), else 1 (a device backend takes them one by one).
int set_eval_lanes(const CaptureSet& set, const EvalSpec& spec, const Backend* backend);

// Runs `spec` (its shard_index / shard_count split each capture's work items) on every capture of
// the set, set_eval_lanes() captures open at a time; each capture's report is exactly run_eval's
// on that file (whatever the lanes). Methods a capture cannot run are refused by run_eval as for
// one capture. A capture that throws stops the set; the first such capture in set order is
// rethrown once the other lane has stopped.
SetEvalReport run_set_eval(const CaptureSet& set, const EvalSpec& spec,
                           const SetEvalProgress& progress = {},
                           const std::atomic<bool>* cancel = nullptr, Backend* backend = nullptr);

// Combines the shard reports of one set exactly (per capture, merge_reports); throws InputError
// when they are of different sets or specs, or a shard is missing or given twice.
SetEvalReport merge_set_reports(const std::vector<SetEvalReport>& parts);

}  // namespace kvscope
