// Large-capture path (docs/performance.md, "Scale"): a ~2 GiB BF16 synthetic capture with
// Llama-3-8B shapes (32 q / 8 kv heads, d 128, 8192 tokens, 22 layers) is created once in /tmp,
// then
//  - open + convert the first layer, with the file in the page cache (warm) and evicted from it
//    (cold: posix_fadvise DONTNEED on this file only), target < 1 s;
//  - open alone (header parse + layout validation);
//  - touch every layer with max_cached_layers = 2 and report the process RSS, which must stay
//    bounded by the layers in use, not grow with the file.
// Set KVSCOPE_BENCH_CAPTURE to use another path.
#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "engine/core/error.h"
#include "engine/io/capture.h"
#include "engine/model/synth.h"

namespace {

using namespace kvscope;

constexpr int kLayers = 22;  // 22 x 96 MiB (BF16 q + k + v per layer) = 2.06 GiB
constexpr int kTokens = 8192;

std::string capture_path() {
  const char* env = std::getenv("KVSCOPE_BENCH_CAPTURE");
  return env ? env : "/tmp/kvscope_bench_llama3-8b_8k_bf16.safetensors";
}

// Creates the capture unless a valid one with the expected shape is already there.
const std::string& ensure_capture() {
  static const std::string path = [] {
    const std::string p = capture_path();
    try {
      auto cap = CaptureFile::open(p);
      if (cap->info().num_layers == kLayers && cap->info().num_tokens == kTokens &&
          cap->info().q_heads == 32 && cap->info().dtype == DType::BF16)
        return p;
    } catch (const InputError&) {
    }
    std::fprintf(stderr, "creating %s (%d layers, BF16, synthetic; once)...\n", p.c_str(), kLayers);
    SynthSpec spec = synth_preset("llama3-8b");
    spec.num_tokens = kTokens;
    spec.num_layers = kLayers;
    spec.seed = 1;
    write_synth_capture(p, spec, DType::BF16);
    return p;
  }();
  return path;
}

long long rss_bytes() {
  long long pages_total = 0, pages_resident = 0;
  if (FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%lld %lld", &pages_total, &pages_resident) != 2) pages_resident = 0;
    std::fclose(f);
  }
  return pages_resident * sysconf(_SC_PAGESIZE);
}

// The process's peak RSS so far (VmHWM): includes transients inside layer(), which sampling
// rss_bytes() between calls misses. Meaningful only when this process did not create the capture.
long long peak_rss_bytes() {
  long long kib = 0;
  if (FILE* f = std::fopen("/proc/self/status", "r")) {
    char line[256];
    while (std::fgets(line, sizeof line, f))
      if (std::sscanf(line, "VmHWM: %lld kB", &kib) == 1) break;
    std::fclose(f);
  }
  return kib * 1024;
}

void evict_from_page_cache(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return;
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

constexpr double kMiB = 1024.0 * 1024.0;

void BM_OpenOnly(benchmark::State& state) {
  const std::string& path = ensure_capture();
  for (auto _ : state) {
    auto cap = CaptureFile::open(path);
    benchmark::DoNotOptimize(cap->info().num_tokens);
  }
  state.counters["file_GiB"] = std::filesystem::file_size(path) / (kMiB * 1024.0);
}

void BM_OpenAndFirstLayer(benchmark::State& state) {
  const bool cold = state.range(0) != 0;
  const std::string& path = ensure_capture();
  for (auto _ : state) {
    if (cold) {
      state.PauseTiming();
      evict_from_page_cache(path);
      state.ResumeTiming();
    }
    auto cap = CaptureFile::open(path);
    auto layer = cap->layer(0);
    benchmark::DoNotOptimize(layer->keys[0].data());
    state.counters["layer_float_MiB"] = cap->resident_bytes() / kMiB;
  }
  state.SetLabel(cold ? "cold (file evicted from page cache)" : "warm (file in page cache)");
}

void BM_TouchAllLayersBoundedRss(benchmark::State& state) {
  const std::string& path = ensure_capture();
  const int max_cached = static_cast<int>(state.range(0));
  long long peak_rss = 0, rss_before = 0, rss_after = 0, cache_bytes = 0;
  for (auto _ : state) {
    rss_before = rss_bytes();
    auto cap = CaptureFile::open(path);
    cap->set_max_cached_layers(max_cached);
    for (int L = 0; L < cap->info().num_layers; ++L) {
      auto layer = cap->layer(L);
      benchmark::DoNotOptimize(layer->values[0].data());
      peak_rss = std::max(peak_rss, rss_bytes());
    }
    rss_after = rss_bytes();
    cache_bytes = cap->resident_bytes();
  }
  state.counters["rss_before_MiB"] = rss_before / kMiB;
  state.counters["rss_peak_MiB"] = peak_rss / kMiB;
  state.counters["rss_after_MiB"] = rss_after / kMiB;
  state.counters["cache_MiB"] = cache_bytes / kMiB;
  state.counters["vm_hwm_MiB"] = peak_rss_bytes() / kMiB;
  state.counters["file_MiB"] = std::filesystem::file_size(path) / kMiB;
}

BENCHMARK(BM_OpenOnly)->Unit(benchmark::kMillisecond)->Iterations(20);
BENCHMARK(BM_OpenAndFirstLayer)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->Iterations(5);
BENCHMARK(BM_TouchAllLayersBoundedRss)->Arg(2)->Unit(benchmark::kMillisecond)->Iterations(1);

}  // namespace

BENCHMARK_MAIN();
