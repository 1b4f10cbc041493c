// The grid's time left (app/grid_pace.h) against what a grid then takes, on grids replayed with
// known costs (no clock: the same figures on any machine and under any load). Each grid is run
// in the app's order (the focused layer first, then layer by layer; in each layer A's cells, then
// B's) on two threads, cell times with +-20% noise; at every cell the time left is recorded and
// compared with the time the rest then took. The app's own timing of real grids is in
// bench/bench_app_grid.cpp (docs/performance.md, "Estimates").
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "app/grid_pace.h"

namespace {

using kvscope::app::GridPace;

struct Costs {
  double warm_a = 1, warm_b = 0.2;  // thread-seconds per cell
  double build = 6;                 // per exact side built
  bool builds = true;               // false: every side is read from disk (a reopening)
};

// Replays a grid of `layers` x `heads` x 2 slots on two threads; returns the worst factor
// between the time left said (after the first `skip` cells) and the time the rest took, for the
// pace given `prior`, the first `in_hand` layers' sides held (no build; marked in hand as the app
// marks the sides this session has seen). `old_pace`: the previous rule (elapsed x left / done)
// instead, to show what it said.
double worst_factor(int layers, int heads, const Costs& c, const GridPace::Prior& prior,
                    int in_hand, int skip, bool old_pace = false) {
  struct Cell {
    GridPace::Cell cell;
    double seconds, build;
  };
  std::vector<Cell> order;
  uint64_t rng = 12345;
  auto noise = [&] {  // +-20%, fixed sequence
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return 0.8 + 0.4 * static_cast<double>(rng >> 11) / 9007199254740992.0;
  };
  for (int l = 0; l < layers; ++l)
    for (int slot = 0; slot < 2; ++slot)
      for (int h = 0; h < heads; ++h) {
        const bool builds = c.builds && l >= in_hand && slot == 0;  // A's cell comes first
        const double b = builds ? c.build * noise() : 0;
        order.push_back({{slot, l, h}, (slot == 0 ? c.warm_a : c.warm_b) * noise() + b, b});
      }
  GridPace pace(layers, heads, prior);
  for (int l = 0; l < in_hand; ++l)
    for (int h = 0; h < heads; ++h) pace.mark_in_hand(l, h);
  // Two threads: each takes the next cell when free; events in time order.
  double free_at[2] = {0, 0};
  struct Event {
    double end;
    size_t cell;
    int thread;
    double start;
  };
  std::vector<Event> events;
  for (size_t i = 0; i < order.size(); ++i) {
    const int t = free_at[0] <= free_at[1] ? 0 : 1;
    events.push_back({free_at[t] + order[i].seconds, i, t, free_at[t]});
    free_at[t] += order[i].seconds;
  }
  std::sort(events.begin(), events.end(), [](const Event& a, const Event& b) { return a.end < b.end; });
  const double end = std::max(free_at[0], free_at[1]);
  double worst = 1;
  std::vector<char> finished(order.size(), 0);
  for (size_t k = 0; k < events.size(); ++k) {
    const Event& e = events[k];
    pace.cell_done(order[e.cell].cell, order[e.cell].seconds, order[e.cell].build, e.end);
    finished[e.cell] = 1;
    const double now = e.end;
    // The last tenth of the run is left out: there a few cells' noise is a large factor of what
    // is left, and the time left is small whatever it says.
    if (static_cast<int>(k) + 1 < skip || end - now < 0.1 * end) continue;
    // What is left at `now`: the cells not started, and those running (started before now).
    std::vector<GridPace::Cell> pending;
    std::vector<GridPace::Running> running;
    for (const Event& o : events) {
      if (finished[o.cell]) continue;
      if (o.start < now)
        running.push_back({order[o.cell].cell, now - o.start});
      else
        pending.push_back(order[o.cell].cell);
    }
    double said;
    if (old_pace) {
      said = now * static_cast<double>(order.size() - (k + 1)) / static_cast<double>(k + 1);
    } else {
      said = pace.left_s(pending, running, now, 2);
    }
    const double taken = end - now;
    worst = std::max(worst, std::max(said / taken, taken / said));
    if (std::getenv("KVSCOPE_PACE_TRACE"))
      std::printf("cell %zu at %.1f: said %.1f taken %.1f\n", k + 1, now, said, taken);
  }
  return worst;
}

// A fresh grid: every head's side is built by its first cell. The time left holds within 1.5x
// once each class was measured (the first layer's cells), though the cost model's guess was 3x
// and 15x off.
TEST(GridPace, TheTimeLeftOfAFreshGridHoldsWithinAFactorOfOneAndAHalf) {
  const Costs c;
  GridPace::Prior prior;
  prior.warm_s = {3, 3};
  prior.build_s = 2;
  const int skip = 2 * 8 + 2;  // the first layer's cells, both slots measured
  EXPECT_LT(worst_factor(32, 8, c, prior, 0, skip), 1.5);
}

// A grid whose first half of layers has its sides in hand (an earlier grid at another keep
// ratio got that far, and measured the builds): its first cells are warm, the rest cold. The
// pace of the cells done (the previous rule) says the rest takes a fraction of what it takes; the
// classes hold within 1.5x.
TEST(GridPace, AGridHalfInHandIsNotPacedByItsWarmHalf) {
  const Costs c;
  GridPace::Prior prior;
  prior.warm_s = {3, 3};  // at the other keep ratio
  prior.build_s = 6.5;
  const int skip = 2 * 8 + 2;
  EXPECT_LT(worst_factor(32, 8, c, prior, 16, skip), 1.5);
  EXPECT_GT(worst_factor(32, 8, c, prior, 16, skip, true), 2.0)
      << "the previous rule held here too: the replay does not show what the classes are for";
}

// The same grid again after a parameter change (its heads' sides in hand): no build is costed,
// and the time left holds from the first cells.
TEST(GridPace, AGridOverSidesInHandCostsNoBuild) {
  const Costs c;
  GridPace::Prior prior;
  prior.warm_s = {1, 0.2};
  prior.build_s = 6;
  EXPECT_LT(worst_factor(32, 8, c, prior, 32, 2), 1.5);
  GridPace pace(2, 2, prior);
  for (int l = 0; l < 2; ++l)
    for (int h = 0; h < 2; ++h) pace.mark_in_hand(l, h);
  EXPECT_DOUBLE_EQ(pace.work_left({{0, 0, 0}, {1, 0, 0}, {0, 1, 1}}, {}), 1 + 0.2 + 1);
}

// A reopened capture whose sides are on disk: no cell builds. The chance of a build falls with
// every head touched without one, and the time left holds after the first layer.
TEST(GridPace, SidesReadFromDiskStopBeingCostedAsBuilds) {
  Costs c;
  c.builds = false;
  GridPace::Prior prior;
  prior.warm_s = {1, 0.2};
  prior.build_s = 6;
  EXPECT_LT(worst_factor(32, 8, c, prior, 0, 2 * 8 + 2), 1.5);
  GridPace pace(4, 1, prior);
  EXPECT_DOUBLE_EQ(pace.build_chance(), 1.0);
  for (int l = 0; l < 3; ++l) pace.cell_done({0, l, 0}, 1.0, 0.0, l + 1.0);
  EXPECT_DOUBLE_EQ(pace.build_chance(), 0.25);
}

// The classes as measured: warm seconds per slot without the builds, the build per side, and a
// slot not measured yet scaled from the other by the cost model's ratio.
TEST(GridPace, WarmAndColdAreMeasuredApart) {
  GridPace::Prior prior;
  prior.warm_s = {2, 0.5};
  prior.build_s = 9;
  GridPace pace(2, 2, prior);
  EXPECT_DOUBLE_EQ(pace.warm_s(0), 2);
  EXPECT_DOUBLE_EQ(pace.build_s(), 9);
  pace.cell_done({0, 0, 0}, 7.0, 6.0, 7.0);  // a build of 6 s and 1 s of scoring
  pace.cell_done({0, 0, 1}, 1.5, 0.0, 8.5);
  EXPECT_DOUBLE_EQ(pace.warm_s(0), 1.25);
  EXPECT_DOUBLE_EQ(pace.build_s(), 6);
  EXPECT_DOUBLE_EQ(pace.warm_s(1), 1.25 * 0.5 / 2);
  // A running cell counts what it has left; a pending cell on an untouched head one build at
  // the chance measured (1 build in 2 first touches, with the one assumed: 2/3).
  const double chance = 2.0 / 3.0;
  EXPECT_DOUBLE_EQ(pace.build_chance(), chance);
  EXPECT_DOUBLE_EQ(pace.work_left({{1, 1, 0}}, {}), pace.warm_s(1) + chance * 6);
  EXPECT_DOUBLE_EQ(pace.work_left({{1, 1, 0}}, {{{0, 1, 0}, 1.0}}),
                   pace.warm_s(0) + chance * 6 - 1.0 + pace.warm_s(1));
  // Wall seconds: the work at this job's rate (8.5 thread-seconds done in 5 s of wall).
  EXPECT_DOUBLE_EQ(pace.left_s({{1, 0, 0}}, {}, 5.0, 2), pace.warm_s(1) * 5.0 / 8.5);
}

}  // namespace
