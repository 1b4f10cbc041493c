// The app's progressive grid at real scale (docs/performance.md, "The app's grid"): the app's own
// state and jobs (AppState, reconcile() once per 10 ms as the frame loop runs it, no window) on a
// capture made by `kvscope-cli synth --shape llama3-8b --tokens 8192`, timed in wall seconds, one
// step after the other in one process:
//   first     open the capture; the whole grid (method A, one seed at this size) starts by itself
//             (no Run click: the bench fails if it is held) until every cell is in: first cell,
//             and whole grid;
//   param     one BalanceKV parameter changed (gamma 4 -> 2): only A's cells are computed again;
//   ratio     the keep ratio changed (0.25 -> 0.125): every cell;
//   back      gamma back to 4 at ratio 0.25: nothing is computed (cells in the store).
// Each step also prints what the app said it would take (the plan's estimate at the start and
// the time left at each tenth of the cells, as the status bar shows it) against what it took.
// Method B is off unless --ab (then B's cells follow A's in each step). With --disk the exact
// references are read from and written to the disk tier as the app does
// (engine/eval/reference_cache.h; KVSCOPE_CACHE_DIR picks the folder): a second run is a reopening.
//
// --backend cuda runs the grid's compute on the device, as the app does with Backend: CUDA
// (tools/gpu_device_check.sh times it there).
//
//   bench_app_grid CAPTURE [--method balancekv] [--ab] [--disk] [--backend cpu|cuda|auto]
//
// A plain timing program, not a Google Benchmark.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "app/app_state.h"
#include "engine/eval/reference_cache.h"

namespace {

using namespace kvscope;
using namespace kvscope::app;
using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

// The grid job's time left as the status bar shows it (time_left_s), -1 when it says nothing.
double grid_time_left(const AppState& s) {
  for (const JobInfo& j : s.worker.jobs())
    if (j.key == kGrid && j.running) return time_left_s(j);
  return -1;
}

// Runs frames until the grid is fresh; returns false when it was held for Run or failed. Records
// what the app said the grid would take (the plan's estimate at the start, the time left shown
// at each tenth of the cells) against what it took, and prints the ratios.
bool until_grid(AppState& s, const char* what, double limit_s = 1800) {
  const auto t0 = Clock::now();
  const double c0 = cpu_seconds();
  const uint64_t computed0 = s.grid_cells.computed();
  double first = -1;
  double estimate = -1;
  struct Said {
    int tenth;
    double at_s, left_s;
  };
  std::vector<Said> said;
  for (;;) {
    s.reconcile();
    const Result& r = s.result(kGrid);
    if (estimate < 0 && !r.want.empty()) estimate = r.estimate_s;
    if (const auto [done, total] = s.progress(kGrid); total > 0 && r.busy()) {
      const int tenth = 10 * done / total;
      if (tenth >= 1 && tenth <= 9 && (said.empty() || said.back().tenth < tenth))
        if (const double left = grid_time_left(s); left >= 0) said.push_back({tenth, since(t0), left});
    }
    if (!r.held.empty() && r.held == r.want) {
      std::printf("%-8s held for a Run click (estimate %.1f s): not progressive\n", what,
                  r.estimate_s);
      return false;
    }
    if (!r.error.empty() && r.key == r.want) {
      std::printf("%-8s failed: %s\n", what, r.error.c_str());
      return false;
    }
    if (first < 0 && s.grid_cells.computed() > computed0) first = since(t0);
    if (r.fresh()) break;
    if (since(t0) > limit_s) {
      std::printf("%-8s not done in %.0f s\n", what, limit_s);
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const double took = since(t0);
  std::printf(
      "%-8s whole grid %7.2f s wall, %7.2f s CPU, first cell %6.2f s, %4llu cells computed\n", what,
      took, cpu_seconds() - c0, first,
      static_cast<unsigned long long>(s.grid_cells.computed() - computed0));
  // Said against taken: a ratio above 1 said too much.
  std::printf("%-8s estimate at the start %.2f s against %.2f s taken (%.2fx)\n", what, estimate,
              took, estimate / took);
  double worst = 1;
  for (const Said& x : said) {
    const double ratio = x.left_s / std::max(1e-3, took - x.at_s);
    worst = std::max(worst, std::max(ratio, 1 / ratio));
    std::printf("%-8s   at %d0%% of the cells (%.2f s): %.2f s left said, %.2f s taken (%.2fx)\n",
                what, x.tenth, x.at_s, x.left_s, took - x.at_s, ratio);
  }
  if (!said.empty()) std::printf("%-8s   time left: worst factor %.2f\n", what, worst);
  std::fflush(stdout);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: bench_app_grid CAPTURE [--method balancekv] [--ab] [--disk] "
                 "[--backend cpu|cuda|auto]\n");
    return 2;
  }
  std::string method = "balancekv";
  std::string backend = "cpu";
  bool ab = false;
  for (int i = 2; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--method") && i + 1 < argc)
      method = argv[++i];
    else if (!std::strcmp(argv[i], "--backend") && i + 1 < argc)
      backend = argv[++i];
    else if (!std::strcmp(argv[i], "--ab"))
      ab = true;
    else if (!std::strcmp(argv[i], "--disk"))
      ReferenceCache::global().set_disk(ReferenceCache::default_disk_dir(),
                                        ReferenceCache::kDefaultDiskBudget);
  }
  AppState s;
  s.settings.method = {MethodChoice{method, {}}, MethodChoice{"uniform", {}}};
  s.settings.ab_enabled = ab;
  s.settings.keep_ratio = 0.25;
  s.settings.backend = backend;
  const auto t0 = Clock::now();
  s.request_open(argv[1]);
  while (!s.capture && s.load_error.empty()) {
    s.reconcile();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (!s.capture) {
    std::fprintf(stderr, "%s\n", s.load_error.c_str());
    return 1;
  }
  const CaptureInfo& ci = s.capture->info();
  std::printf(
      "capture %d layers x %d kv heads, %d tokens; grid seeds %d; method A %s%s; %u cores; "
      "backend %s (%s)\n",
      ci.num_layers, ci.kv_heads, ci.num_tokens, s.grid_seeds(), method.c_str(),
      ab ? ", B uniform" : "", std::thread::hardware_concurrency(), s.backend_active.c_str(),
      s.backend_note.c_str());
  if (s.settings.backend != backend) {
    std::fprintf(stderr, "backend %s refused: %s\n", backend.c_str(), s.backend_note.c_str());
    return 1;
  }
  std::printf("open     %7.2f s\n", since(t0));
  if (!until_grid(s, "first")) return 1;
  s.settings.method[0].params["gamma"] = 2;
  if (!until_grid(s, "param")) return 1;
  s.settings.keep_ratio = 0.125;
  if (!until_grid(s, "ratio")) return 1;
  s.settings.method[0].params.clear();
  s.settings.keep_ratio = 0.25;
  if (!until_grid(s, "back")) return 1;
  return 0;
}
