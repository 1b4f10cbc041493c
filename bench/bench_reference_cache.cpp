// The exact reference cache at real scale (docs/performance.md, "Exact reference cache"): on a
// capture made by `kvscope-cli synth --shape llama3-8b --tokens 8192` (or 32768), one process
// times, wall and CPU seconds, one after the other (so their ratios come from one run):
//   eval      all layers and kv heads, one method, one ratio, one seed: with the cache off (what
//             every run cost before it), cold (empty cache) and warm;
//   change    BalanceKV with one parameter changed, the cache warm (the app's grid after a slider
//             move: the whole 32 x 8 grid);
//   sweep     gamma = 0, 1, 2, 4, 8 as `kvscope-cli sweep` runs it (one run_eval for all five
//             values, EvalSpec::points, in one process, so starting cold), and as it ran before
//             (one eval per value), against one cold eval (and, with --sweep-off, with the cache
//             off: five times the work of one eval, as before the cache);
//   focused   one head (run_head), cold and warm, and the open time;
// and the process's resident memory after each step.
//
//   bench_reference_cache CAPTURE [--method balancekv] [--ratio 0.25] [--layers N] [--only-head]
//                         [--sweep-off]
//
// A plain timing program (each step is seconds long and runs once), not a Google Benchmark.
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "engine/eval/protocol.h"
#include "engine/eval/reference_cache.h"
#include "engine/io/capture.h"
#include "engine/methods/method.h"

namespace {

using namespace kvscope;

double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

long long rss_bytes() {
  long long pages_total = 0, pages_resident = 0;
  if (FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%lld %lld", &pages_total, &pages_resident) != 2) pages_resident = 0;
    std::fclose(f);
  }
  return pages_resident * 4096;
}

long long peak_rss_bytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<long long>(u.ru_maxrss) * 1024;
}

struct Timed {
  double wall = 0, cpu = 0;
};

template <typename Fn>
Timed timed(const char* label, Fn&& fn) {
  const auto t0 = std::chrono::steady_clock::now();
  const double c0 = cpu_seconds();
  fn();
  Timed t;
  t.wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  t.cpu = cpu_seconds() - c0;
  const ReferenceCacheStats s = ReferenceCache::global().stats();
  std::printf("%-44s %8.2f s wall %8.2f s cpu   rss %6.0f MiB   cache %5.0f MiB %4d entries\n",
              label, t.wall, t.cpu, rss_bytes() / 1048576.0, s.bytes / 1048576.0, s.entries);
  std::fflush(stdout);
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: %s CAPTURE [--method NAME] [--ratio R] [--layers N] [--only-head] "
                 "[--sweep-off]\n",
                 argv[0]);
    return 2;
  }
  const std::string path = argv[1];
  std::string method = "balancekv";
  double ratio = 0.25;
  int layers = 0;
  bool only_head = false, sweep_off_too = false;
  for (int i = 2; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--method") && i + 1 < argc)
      method = argv[++i];
    else if (!std::strcmp(argv[i], "--ratio") && i + 1 < argc)
      ratio = std::atof(argv[++i]);
    else if (!std::strcmp(argv[i], "--layers") && i + 1 < argc)
      layers = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--only-head"))
      only_head = true;
    else if (!std::strcmp(argv[i], "--sweep-off"))
      sweep_off_too = true;
  }
  try {
    std::unique_ptr<CaptureFile> capture;
    timed("open", [&] { capture = CaptureFile::open(path); });
    const CaptureInfo& ci = capture->info();
    std::printf("capture  %d layers, %d q / %d kv heads, d %d, %d tokens\n", ci.num_layers,
                ci.q_heads, ci.kv_heads, ci.head_dim, ci.num_tokens);
    ReferenceCache& cache = ReferenceCache::global();
    const size_t budget = cache.stats().budget;

    MethodSettings ms;
    ms.method = find_method(method);
    ms.keep_ratio = ratio;
    if (!ms.method) throw std::runtime_error("unknown method " + method);
    {
      std::shared_ptr<const LayerData> layer;
      timed("load layer 0", [&] { layer = capture->layer(0); });
      timed("focused head L0 H0, cold", [&] { run_head(*layer, ci.num_layers, 0, ms, 0); });
      timed("focused head L0 H0, warm", [&] { run_head(*layer, ci.num_layers, 0, ms, 0); });
      ms.params["gamma"] = 2;
      if (method == "balancekv")
        timed("focused head L0 H0, gamma changed, warm",
              [&] { run_head(*layer, ci.num_layers, 0, ms, 0); });
    }
    std::printf("peak rss %.0f MiB\n", peak_rss_bytes() / 1048576.0);
    if (only_head) return 0;

    EvalSpec spec;
    spec.methods = {ms.method};
    spec.ratios = {ratio};
    spec.seeds = 1;
    for (int l = 0; l < (layers > 0 ? layers : ci.num_layers); ++l) spec.layers.push_back(l);
    auto eval = [&] { return run_eval(*capture, spec); };

    cache.clear();
    cache.set_budget(0);
    const Timed off = timed("eval, cache off", eval);
    cache.set_budget(budget);
    cache.clear();
    const Timed cold = timed("eval, cache cold", eval);
    const Timed warm = timed("eval, cache warm", eval);
    Timed change;
    if (method == "balancekv") {
      spec.params["balancekv"] = {{"gamma", 3.0}};
      change = timed("eval, gamma changed, cache warm", eval);
      spec.params.clear();
    }
    auto sweep_evals = [&] {
      for (double g : {0.0, 1.0, 2.0, 4.0, 8.0}) {
        spec.params["balancekv"] = {{"gamma", g}};
        run_eval(*capture, spec);
      }
      spec.params.clear();
    };
    auto sweep = [&] {
      for (double g : {0.0, 1.0, 2.0, 4.0, 8.0}) spec.points.push_back({{"gamma", g}});
      run_eval(*capture, spec).split_points();
      spec.points.clear();
    };
    Timed sweep_off, sweep_on, sweep_five;
    if (method == "balancekv") {
      if (sweep_off_too) {
        cache.clear();
        cache.set_budget(0);
        sweep_off = timed("sweep gamma=0,1,2,4,8, cache off", sweep);
        cache.set_budget(budget);
      }
      cache.clear();
      sweep_five = timed("sweep gamma=0,1,2,4,8 as five evals, cache from cold", sweep_evals);
      cache.clear();
      sweep_on = timed("sweep gamma=0,1,2,4,8 as one run, cache from cold", sweep);
    }
    std::printf("\nratios (wall)\n");
    std::printf("  eval cold / eval cache off                     %.2f\n", cold.wall / off.wall);
    std::printf("  eval warm / eval cache off                     %.2f\n", warm.wall / off.wall);
    std::printf("  same in cpu seconds                            %.2f\n", warm.cpu / off.cpu);
    if (method == "balancekv") {
      std::printf("  gamma change warm / eval cache off             %.2f\n",
                  change.wall / off.wall);
      if (sweep_off_too)
        std::printf("  sweep (5 values), cache off / eval cache off   %.2f\n",
                    sweep_off.wall / off.wall);
      // What the CLI does: one process, so `sweep` starts cold, as `eval` does.
      std::printf("  sweep (5 values, one run) from cold / eval cold  %.2f (cpu %.2f)\n",
                  sweep_on.wall / cold.wall, sweep_on.cpu / cold.cpu);
      std::printf("  sweep (5 evals) from cold / eval cold            %.2f (cpu %.2f)\n",
                  sweep_five.wall / cold.wall, sweep_five.cpu / cold.cpu);
    }
    const ReferenceCacheStats s = cache.stats();
    std::printf("cache    %.0f MiB of %.0f MiB, %d entries, %lld hits, %lld misses\n",
                s.bytes / 1048576.0, s.budget / 1048576.0, s.entries, s.hits, s.misses);
    std::printf("peak rss %.0f MiB\n", peak_rss_bytes() / 1048576.0);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_reference_cache: %s\n", e.what());
    return 1;
  }
  return 0;
}
