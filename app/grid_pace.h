// The grid's time left (docs/app.md, "Estimates"). A grid cell's work is of two kinds that cost
// very differently: building its head's exact side (cold: once per layer, kv head and window,
// then held by the reference cache in memory and on disk) and the method's selection and scoring
// against a side in hand (warm). A pace that averages the two over the cells done so far is far
// off both ways: the first cells of a fresh grid all build (an 8192-token grid was said to need
// 839 s early on), the later ones none (2 s said near the end of a 212 s run). GridPace keeps
// them apart: each slot's warm seconds per cell, the build seconds per exact side, and how often
// a head not yet touched in this session needed a build (it may be on disk); the time left is the
// work left in those classes, turned into wall seconds at this job's own rate so far.
#pragma once

#include <array>
#include <cstddef>
#include <deque>
#include <utility>
#include <vector>

namespace kvscope::app {

class GridPace {
 public:
  // What the app's cost model says before this job measured anything: each slot's warm
  // thread-seconds per cell and the thread-seconds of one exact side's build.
  struct Prior {
    std::array<double, 2> warm_s{0, 0};
    double build_s = 0;
  };
  // A pending cell: its slot (0: A, 1: B) and head.
  struct Cell {
    int slot = 0, layer = 0, head = 0;
  };

  GridPace(int layers, int heads, const Prior& prior);

  // A head whose exact side this session already holds (a cell of the same capture and window
  // was computed before): none of its cells is costed a build.
  void mark_in_hand(int layer, int head);
  // A cell computed, `at_s` seconds after the job started: `seconds` of its thread's time, of
  // which `build_seconds` building its head's exact side (0 when the side was in memory or on
  // disk).
  void cell_done(const Cell& c, double seconds, double build_seconds, double at_s);

  // A cell being computed, for `seconds` so far.
  struct Running {
    Cell cell;
    double seconds = 0;
  };
  // Thread-seconds still needed by the cells in `pending` (each its slot's warm seconds) and in
  // `running` (the same less what they ran), plus one expected build for every head among them
  // not yet touched.
  double work_left(const std::vector<Cell>& pending, const std::vector<Running>& running) const;
  // Wall seconds left: work_left at this job's rate of wall seconds per thread-second (over its
  // last cells: the wall time they spanned against their threads' seconds; before those, over the
  // whole run), or over `threads` before any.
  double left_s(const std::vector<Cell>& pending, const std::vector<Running>& running,
                double elapsed_s, int threads) const;

  // The classes as measured (for tests and the state export).
  // Each the median of its class's last kWindow measurements: a job's first cells also pay for
  // starting threads, loading layers and faulting pages in (the first cell of an 8192-token grid
  // took 25 times a later one), which a mean over all cells carried for a hundred cells.
  double warm_s(int slot) const;
  double build_s() const;
  double build_chance() const;  // of a head not touched before

  static constexpr size_t kWindow = 32;
  // The cells the wall-per-thread-second rate is measured over: fewer, so that the job's start
  // (the focused runs beside it at a higher priority, the first layers loading) stops counting
  // within a few cells.
  static constexpr size_t kRateWindow = 12;

 private:
  int heads_;
  Prior prior_;
  std::vector<char> touched_;  // [layer * heads + head]
  std::array<std::deque<double>, 2> warm_;  // the last kWindow warm seconds of each slot
  std::deque<double> build_;                // the last kWindow builds' seconds
  int builds_on_first_touch_ = 0, first_touches_ = 0;
  double done_s_ = 0;  // thread-seconds of the cells done
  // The last kRateWindow + 1 cells done: when (at_s) and their thread-seconds.
  std::deque<std::pair<double, double>> recent_;
};

}  // namespace kvscope::app
