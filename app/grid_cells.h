// The progressive layer x kv-head grid (docs/app.md, "How the grid fills"): every cell is one
// method (with its own parameters) on one (layer, kv head) for one seed, computed alone through
// run_eval and kept in a store keyed by exactly what it depends on (GridCellInput in
// app/app_plans.cpp: its method and parameters, the capture, backend, window, estimator and keep
// ratio, its layer and head, its seed), so a change recomputes only the cells its key outdates: a
// change of method A's parameters leaves method B's cells (and every cell of an earlier A seen
// again) where they are. The grid job (AppState::plan_grid, started by reconcile()) computes the
// missing cells one by one, the focused cell and the visible rows first, seed 0 of every cell
// before the other seeds, and posts each cell to the store and a partial GridReport while the rest
// computes. On a backend that parallelises inside one call (a device), a cell is computed with
// the other missing cells of its layer, slot and seed run: one run_eval over their heads, one
// attention_errors call; each cell is still posted on its own.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "app/grid_pace.h"
#include "engine/eval/protocol.h"

namespace kvscope::app {

class JobContext;

// One computed cell: run_eval's figures for one seed alone.
struct GridCell {
  HeadEval eval;        // per_seed holds the one seed's mean
  uint64_t serial = 0;  // this cell was the serial-th the app computed (1, 2, ...)
};

// The cells computed so far, by cell key (see the file comment). Owned by the UI thread; the
// cells are immutable and shared with the jobs that read them.
class GridCellStore {
 public:
  const GridCell* find(const std::string& key) const;
  std::shared_ptr<const GridCell> get(const std::string& key) const;
  void insert(const std::string& key, HeadEval eval);
  // Bounded: past `max_cells`, every cell not in `keep` is dropped.
  void trim(size_t max_cells, const std::set<std::string>& keep);
  void clear();
  size_t size() const { return cells_.size(); }
  uint64_t computed() const { return computed_; }  // cells computed since the app started
  uint64_t version() const { return version_; }    // changes on every insert and clear

 private:
  std::unordered_map<std::string, std::shared_ptr<const GridCell>> cells_;
  uint64_t computed_ = 0, version_ = 0;
};

// How far a grid entry (one method slot on one head, over the grid's seeds) has come.
enum class CellState : uint8_t {
  Missing = 0,  // nothing computed yet (drawn grey)
  Stale = 1,    // the previous grid's value, shown until this one is computed (drawn dimmed)
  Partial = 2,  // some of the seeds (the spread over seeds grows as the others come in)
  Fresh = 3,    // every seed: the numbers eval gives for these settings
};
const char* cell_state_name(CellState s);

struct GridEntry {
  int slot = 0;  // 0: method A, 1: method B
  CellState state = CellState::Missing;
  int seeds_done = 0;
  std::vector<std::string> keys;  // the cell keys of its seeds (one for a seed-free method)
};

// The grid as shown: report.results and entries run in parallel, (layer, kv head, slot) order;
// an entry with state Missing has a default HeadEval.
struct GridReport {
  EvalReport report;
  std::vector<GridEntry> entries;
  std::array<std::string, 2> methods;  // "" for a slot not in the grid
  std::array<ParamValues, 2> params;   // each slot's own parameters
  int seeds = 1;
  int cells_done = 0, cells_total = 0;  // seed runs computed / wanted (progress)
  // The same per slot (method A, method B): what a caption of one method's cells counts.
  std::array<int, 2> slot_done{0, 0}, slot_total{0, 0};
  // The entry of (slot, layer, head), null when none.
  const HeadEval* find(int slot, int layer, int kv_head, const GridEntry** entry = nullptr) const;
  bool complete() const { return cells_done == cells_total; }
};

// Where the grid job looks first; set by the UI every frame, read by the job before each cell.
struct GridPriority {
  std::atomic<int> focus_layer{0}, focus_head{0};
  std::atomic<int> visible_first{-1}, visible_last{-1};  // rows on screen (-1: unknown)
};

// Everything the grid job needs, gathered on the UI thread by AppState::plan_grid.
struct GridJob {
  std::shared_ptr<CaptureFile> capture;
  Backend* backend = nullptr;
  EvalSpec base;  // window overrides, estimator, the one keep ratio
  struct Slot {
    const Method* method = nullptr;  // null: the slot is not in the grid
    std::string name;
    ParamValues params;
    int runs = 1;  // seed runs per head: the grid's seeds, or 1 for a seed-free method
  };
  std::array<Slot, 2> slots;
  int seeds = 1;
  uint64_t base_seed = 0;
  int layers = 0, heads = 0;
  int threads = 1;
  // On a backend that parallelises inside one call (computed a layer at a time): how many layers
  // at once at most, each with threads / layers_at_once threads for its selections, so the layers
  // held stay within the capture's layer cache (0: as many as threads).
  int layers_at_once = 0;
  // One seed run of one slot on one head; `have` is set when the store holds it.
  struct Need {
    int slot = 0, layer = 0, head = 0, run = 0;
    std::string key;
    std::shared_ptr<const GridCell> have;
  };
  std::vector<Need> needs;
  // The time left (app/grid_pace.h): the cost model's classes before this job measured its own,
  // and the heads whose exact side this session already holds for this capture and window
  // ([layer * heads + head]; empty: none).
  GridPace::Prior pace_prior;
  std::vector<char> exact_in_hand;
  std::shared_ptr<const GridReport> previous;  // shown (dimmed) where a cell is not yet computed
  std::shared_ptr<GridPriority> priority;
  size_t missing() const;
};

// Builds the GridReport of `job` from the cells in hand (`cells[i]` for job.needs[i], null when
// not computed); entries of `job.previous` fill in as Stale where no seed is computed yet.
std::shared_ptr<GridReport> assemble_grid(
    const GridJob& job, const std::vector<std::shared_ptr<const GridCell>>& cells);

// What one cell took: seconds of its thread (a batch's time shared among its cells), of which
// build_seconds building its head's exact side (cold work; 0 when the side was in hand).
struct CellTiming {
  double seconds = 0;
  double build_seconds = 0;
};

// Computes the job's missing cells in priority order; `cell_done` is called (from the computing
// thread, one call at a time) after each, `report` (throttled) with the partial grid. After each
// cell the job's time left (GridPace) goes to ctx.time_left. Returns the whole grid. Throws
// Cancelled, or InputError for a bad spec (the first cell's).
std::shared_ptr<GridReport> run_grid_job(
    const GridJob& job, JobContext& ctx,
    const std::function<void(const GridJob::Need&, const HeadEval&, const CellTiming&)>& cell_done,
    const std::function<void(std::shared_ptr<const GridReport>)>& report);

}  // namespace kvscope::app
