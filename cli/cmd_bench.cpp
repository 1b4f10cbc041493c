// kvscope-cli bench: times the practical BalanceKV walk (block preparation, the Backend walk op,
// halving, all rounds) on synthetic heads, median over repeats, on the chosen backend; when a
// CUDA device is available it also times the other backend on the same data in the same run and
// prints the GPU/CPU time ratio and whether the selections agree.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <random>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/seed_flag.h"
#include "cli/validate.h"
#include "engine/core/error.h"
#include "engine/methods/balancekv/balance_walk.h"
#include "engine/ops/backend.h"

namespace kvscope::cli {
namespace {

struct BenchOptions {
  std::string backend = "auto";
  int n = 8192, d = 128, heads = 1, rounds = 2, repeat = 5, block = 128;
  uint64_t seed = 0;
};

struct SyntheticHeads {
  std::vector<MatrixF> keys, values;
  std::vector<WalkJob> jobs;
};

// Keys share an offset (as real keys do) plus Gaussian spread; values Gaussian. Synthetic data,
// and the output says so.
SyntheticHeads make_heads(const BenchOptions& o) {
  SyntheticHeads s;
  std::mt19937 rng(static_cast<uint32_t>(o.seed) + 1);
  std::normal_distribution<float> g(0.f, 1.f);
  s.keys.resize(o.heads);
  s.values.resize(o.heads);
  for (int h = 0; h < o.heads; ++h) {
    s.keys[h].resize(o.n, o.d);
    s.values[h].resize(o.n, o.d);
    std::vector<float> offset(o.d);
    for (float& v : offset) v = g(rng);
    for (int i = 0; i < o.n; ++i)
      for (int c = 0; c < o.d; ++c) {
        s.keys[h](i, c) = offset[c] + g(rng);
        s.values[h](i, c) = 0.5f * g(rng);
      }
  }
  const int target = std::max(1, static_cast<int>(std::lround(std::ldexp(o.n, -o.rounds))));
  for (int h = 0; h < o.heads; ++h) {
    WalkJob job;
    job.keys = &s.keys[h];
    job.values = &s.values[h];
    job.kv_head = h;
    for (int t = 0; t < o.n; ++t) job.tokens.push_back(t);
    job.target = target;
    s.jobs.push_back(std::move(job));
  }
  return s;
}

struct Timing {
  double median_ms = 0, min_ms = 0;
  double median_thread_cpu_ms = 0;  // CPU time of this thread: the one-core cost on a busy machine
  std::vector<WalkOutcome> last;
};

Timing time_walk(const SyntheticHeads& s, const BalanceParams& prm, const BenchOptions& o,
                 Backend& backend) {
  std::vector<double> ms, cpu_ms;
  Timing t;
  auto thread_cpu_ms = [] {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return 1e3 * static_cast<double>(ts.tv_sec) + 1e-6 * static_cast<double>(ts.tv_nsec);
  };
  // One untimed warm-up call (first-touch buffers, GPU context and uploads).
  t.last = run_balance_walks(s.jobs, 0, o.seed, prm, &backend);
  for (int r = 0; r < o.repeat; ++r) {
    const double cpu0 = thread_cpu_ms();
    const auto start = std::chrono::steady_clock::now();
    t.last = run_balance_walks(s.jobs, 0, o.seed, prm, &backend);
    const auto stop = std::chrono::steady_clock::now();
    cpu_ms.push_back(thread_cpu_ms() - cpu0);
    ms.push_back(std::chrono::duration<double, std::milli>(stop - start).count());
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const size_t k = v.size();
    return k % 2 ? v[k / 2] : 0.5 * (v[k / 2 - 1] + v[k / 2]);
  };
  t.median_ms = median(ms);
  t.median_thread_cpu_ms = median(cpu_ms);
  t.min_ms = *std::min_element(ms.begin(), ms.end());
  return t;
}

// The thread CPU time says what a walk cost only where the calling thread runs it: on the CPU
// reference (a device backend computes elsewhere).
bool on_cpu(const Backend& b) {
  return &b == &cpu_backend();
}

void print_timing(const Backend& b, const Timing& t) {
  std::printf("%-40s median %10.3f ms   min %10.3f ms", b.name().c_str(), t.median_ms, t.min_ms);
  if (on_cpu(b)) std::printf("   (thread CPU time median %.3f ms)", t.median_thread_cpu_ms);
  std::printf("\n");
}

void check(const BenchOptions& o) {
  auto need = [](bool ok, const std::string& what) {
    if (!ok) throw InputError(what);
  };
  check_range(o.n, 2, 1 << 24, "--n");
  check_range(o.d, 1, 65536, "--d");
  check_range(o.heads, 1, 4096, "--heads");
  check_range(o.rounds, 1, 30, "--rounds");
  need(std::ldexp(o.n, -o.rounds) >= 1, "--rounds: " + std::to_string(o.rounds) +
                                            " rounds would halve --n " + std::to_string(o.n) +
                                            " below one token");
  check_range(o.repeat, 1, 10000, "--repeat");
  check_range(o.block, 2, 4096, "--block");
  // Keys and values (float), the walk's copies of one head's blocks, and the token lists; the
  // estimate is refused before anything is allocated.
  const double heads_bytes = static_cast<double>(o.n) * o.d * o.heads * 8;
  const double walk_bytes = static_cast<double>(o.n) * o.d * 8 + static_cast<double>(o.n) * 64;
  const double token_bytes = static_cast<double>(o.n) * o.heads * 8;
  require_memory(heads_bytes + walk_bytes + token_bytes,
                 "bench --n " + std::to_string(o.n) + " --d " + std::to_string(o.d) + " --heads " +
                     std::to_string(o.heads),
                 "keys and values " + gib(heads_bytes) + ", walk buffers " + gib(walk_bytes) +
                     ", token lists " + gib(token_bytes));
}

void run_bench(const BenchOptions& o) {
  check(o);
  Backend& chosen = select_backend(o.backend);
  BalanceParams prm;
  prm.block = o.block;
  const SyntheticHeads heads = make_heads(o);
  std::printf(
      "balancekv walk bench (synthetic keys/values): %d head%s x n=%d, d=%d, B=%d, %d round%s,"
      " %d repeat%s\n",
      o.heads, o.heads == 1 ? "" : "s", o.n, o.d, o.block, o.rounds, o.rounds == 1 ? "" : "s",
      o.repeat, o.repeat == 1 ? "" : "s");
  const Timing main = time_walk(heads, prm, o, chosen);
  std::printf("authors' walk (float32, the default):\n");
  print_timing(chosen, main);
  // KVScope's earlier double-precision walk (preset kvscope-v1) on the same data and backend:
  // the before/after ratio of the float32 walk.
  const Timing v1 = time_walk(heads, kvscope_v1_params(prm), o, chosen);
  std::printf("preset kvscope-v1 (double walk):\n");
  print_timing(chosen, v1);
  std::printf("float32 / kvscope-v1 time ratio %.3f (wall)", main.median_ms / v1.median_ms);
  if (on_cpu(chosen))
    std::printf(", %.3f (thread CPU time)", main.median_thread_cpu_ms / v1.median_thread_cpu_ms);
  std::printf("\n");

  // The other side on the same data: the CPU for a device backend, else the first registered
  // device backend that answers (select_backend("auto")), when there is one.
  Backend& other = on_cpu(chosen) ? select_backend("auto") : cpu_backend();
  if (on_cpu(other)) {
    std::string why = "no device backend in this build";
    for (const std::string& id : registered_backends())
      if (!backend_available(id, &why)) why = id + ": " + why;
    std::printf("(no GPU comparison: %s)\n", why.c_str());
    return;
  }
  const Timing second = time_walk(heads, prm, o, other);
  print_timing(other, second);
  const Timing& gpu = on_cpu(chosen) ? second : main;
  const Timing& cpu = on_cpu(chosen) ? main : second;
  std::printf("GPU/CPU time ratio %.4f (GPU %.1fx faster)\n", gpu.median_ms / cpu.median_ms,
              cpu.median_ms / gpu.median_ms);
  // Same seed, same counter-based uniforms: the selections should agree except where a
  // probability sits within float rounding of its uniform.
  long long same = 0, total = 0;
  for (size_t h = 0; h < gpu.last.size(); ++h) {
    const auto& a = gpu.last[h].indices;
    const auto& b = cpu.last[h].indices;
    std::vector<int> both;
    std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(both));
    same += static_cast<long long>(both.size());
    total += static_cast<long long>(std::max(a.size(), b.size()));
  }
  std::printf("kept tokens identical on both backends: %.2f%%\n",
              total ? 100.0 * static_cast<double>(same) / static_cast<double>(total) : 100.0);
}

}  // namespace

void add_bench_command(CLI::App& app) {
  auto opts = std::make_shared<BenchOptions>();
  auto* sub = app.add_subcommand(
      "bench", "Time the practical BalanceKV walk (median over repeats) on synthetic heads");
  sub->add_option("--backend", opts->backend, backend_choices_text())->default_val("auto");
  sub->add_option("--n", opts->n, "tokens per head")->default_val(8192);
  sub->add_option("--d", opts->d, "head dimension (keys and values)")->default_val(128);
  sub->add_option("--heads", opts->heads, "kv heads walked together (one layer)")->default_val(1);
  sub->add_option("--rounds", opts->rounds, "halving rounds (keep ratio 2^-rounds)")
      ->default_val(2);
  sub->add_option("--repeat", opts->repeat, "timed repeats (after one warm-up)")->default_val(5);
  sub->add_option("--block", opts->block, "walk block length B")->default_val(128);
  sub->add_option("--seed", opts->seed, "walk seed")->check(seed_validator())->default_val(0);
  sub->callback([opts] { run_bench(*opts); });
}

}  // namespace kvscope::cli
