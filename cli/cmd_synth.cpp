// kvscope-cli synth: writes a synthetic capture (labelled synthetic) for scale and speed tests,
// layer by layer so memory stays bounded by one layer whatever the file size.
#include <sys/statvfs.h>

#include <chrono>
#include <cstdio>
#include <string>

#include "cli/commands.h"
#include "cli/output_file.h"
#include "cli/seed_flag.h"
#include "cli/validate.h"
#include "engine/core/error.h"
#include "engine/io/capture.h"
#include "engine/model/synth.h"

namespace kvscope::cli {
namespace {

struct SynthOptions {
  std::string shape = "llama3-8b";
  int tokens = 0;
  std::string out;
  int layers = 0;  // 0: the shape's layer count
  std::string dtype = "bf16";
  uint64_t seed = 0;
  bool quiet = false;
};

DType parse_dtype(const std::string& s) {
  if (s == "f32") return DType::F32;
  if (s == "f16") return DType::F16;
  if (s == "bf16") return DType::BF16;
  throw InputError("--dtype: \"" + s + "\" is not one of f32, f16, bf16");
}

void run_synth(const SynthOptions& opt) {
  check_output(opt.out, {}, "--out");
  SynthSpec spec = synth_preset(opt.shape);
  check_range(opt.tokens, 2, kMaxCaptureTokens, "--tokens");
  if (opt.layers != 0) check_range(opt.layers, 1, kMaxCaptureLayers, "--layers");
  spec.num_tokens = opt.tokens;
  if (opt.layers > 0) spec.num_layers = opt.layers;
  spec.seed = opt.seed;
  const DType dtype = parse_dtype(opt.dtype);
  const long long per_layer = static_cast<long long>(spec.num_tokens) * spec.head_dim *
                              (2LL * spec.kv_heads + spec.q_heads) *
                              static_cast<long long>(dtype == DType::F32 ? 4 : 2);
  // One layer is held in memory as float (plus the generator's per-token tables); the file must
  // fit the folder's free space. Both are refused up front, with the estimate.
  const double layer_float_bytes = static_cast<double>(spec.num_tokens) * spec.head_dim *
                                   (2.0 * spec.kv_heads + spec.q_heads) * 4;
  const double table_bytes = static_cast<double>(spec.num_tokens) * spec.head_dim * 8;
  require_memory(2 * layer_float_bytes + table_bytes,
                 "synth --tokens " + std::to_string(spec.num_tokens),
                 "one layer as float " + gib(layer_float_bytes) + ", written from a second copy");
  {
    const size_t slash = opt.out.find_last_of('/');
    const std::string dir = slash == std::string::npos ? "." : opt.out.substr(0, slash + 1);
    struct statvfs fs {};
    const double file_bytes = static_cast<double>(per_layer) * spec.num_layers;
    if (::statvfs(dir.c_str(), &fs) == 0) {
      const double free_bytes = static_cast<double>(fs.f_bavail) * static_cast<double>(fs.f_frsize);
      if (file_bytes > free_bytes)
        throw InputError("--out " + printable(opt.out) + ": the capture would take about " +
                         gib(file_bytes) + " but its folder has " + gib(free_bytes) + " free");
    }
  }
  if (!opt.quiet)
    std::printf(
        "synth: %s, %d layers x (%d q + 2 x %d kv heads) x %d tokens x d %d, %s, "
        "seed %llu -> %s (about %.2f GiB, SYNTHETIC)\n",
        spec.shape.c_str(), spec.num_layers, spec.q_heads, spec.kv_heads, spec.num_tokens,
        spec.head_dim, dtype_name(dtype), static_cast<unsigned long long>(spec.seed),
        printable(opt.out).c_str(), per_layer * spec.num_layers / 1073741824.0);
  const auto start = std::chrono::steady_clock::now();
  write_synth_capture(opt.out, spec, dtype, [&](int L) {
    if (!opt.quiet) {
      std::printf("\r  layer %d/%d", L + 1, spec.num_layers);
      std::fflush(stdout);
    }
  });
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!opt.quiet) std::printf("\n  done in %.1f s\n", seconds);
}

}  // namespace

void add_synth_command(CLI::App& app) {
  auto opt = std::make_shared<SynthOptions>();
  auto* sub = app.add_subcommand(
      "synth",
      "Write a SYNTHETIC capture (drifting key clusters, attention sink, outlier "
      "channels, RoPE) for scale and speed tests");
  sub->add_option("--shape", opt->shape,
                  "Model shape: llama3-8b (32 layers, 32 q / 8 kv heads, "
                  "d 128) or small (2 layers, 4 q / 2 kv heads, d 16)")
      ->default_val("llama3-8b");
  sub->add_option("--tokens", opt->tokens, "Number of tokens")->required();
  sub->add_option("--out", opt->out, "Output file (.safetensors, or .npz for f32/f16)")->required();
  sub->add_option("--layers", opt->layers, "Number of layers (default: the shape's)");
  sub->add_option("--dtype", opt->dtype, "Stored dtype: f32, f16 or bf16")->default_val("bf16");
  sub->add_option("--seed", opt->seed, "Random seed")->check(seed_validator())->default_val(0);
  sub->add_flag("--quiet", opt->quiet, "No progress output");
  sub->callback([opt] { run_synth(*opt); });
}

}  // namespace kvscope::cli
