// kvscope-cli capture: run a llama2.c checkpoint on the CPU and write a capture
// (docs/capturing.md).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "cli/output_file.h"
#include "cli/seed_flag.h"
#include "cli/validate.h"
#include "engine/capture.h"
#include "engine/error.h"
#include "engine/llama2c.h"

namespace kvscope::cli {

namespace {

struct CaptureOptions {
  std::string model;
  std::string tokenizer;
  std::string prompt;
  std::string out;
  int steps = 256;
  float temperature = 0.0f;
  float topp = 0.9f;
  unsigned long long seed = 0;
  std::string dtype = "f32";
  bool quiet = false;
};

DType parse_dtype(const std::string& name) {
  if (name == "f32") return DType::F32;
  if (name == "f16") return DType::F16;
  if (name == "bf16") return DType::BF16;
  throw InputError("--dtype " + name + ": expected f32, f16 or bf16");
}

std::string format_float(float v) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%g", static_cast<double>(v));
  return buffer;
}

void run_capture(const CaptureOptions& o) {
  // Output problems are caught before the model runs (a large checkpoint takes minutes).
  auto ends_with = [](const std::string& s, const std::string& suffix) {
    return s.size() >= suffix.size() &&
           s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  const DType dtype = parse_dtype(o.dtype);
  const bool npz = ends_with(o.out, ".npz");
  if (!npz && !ends_with(o.out, ".safetensors")) {
    throw InputError("--out " + o.out + ": must end in .safetensors or .npz");
  }
  if (npz && dtype == DType::BF16) {
    throw InputError("--out " + o.out + ": .npz cannot hold bf16; use .safetensors or --dtype f16");
  }
  check_output(o.out, {o.model, o.tokenizer}, "--out");
  check_range_real(static_cast<double>(o.temperature), 0.0, 100.0, "--temperature");
  check_range_real(static_cast<double>(o.topp), 1e-6, 1.0, "--topp");
  llama2c::Transformer model(o.model);
  const llama2c::Config& c = model.config();
  // The whole capture is held in memory as float before it is written: refuse what cannot fit.
  {
    const double heads = 2.0 * c.n_kv_heads + c.n_heads;
    const double capture_bytes =
        static_cast<double>(c.n_layers) * heads * std::max(o.steps, 1) * c.head_size() * 4;
    require_memory(2 * capture_bytes, "capture --steps " + std::to_string(o.steps),
                   "the captured keys, values and queries " + gib(capture_bytes) +
                       ", plus the file's conversion buffers");
  }
  llama2c::Tokenizer tokenizer(o.tokenizer, c.vocab_size);
  std::fprintf(stderr,
               "model %s: dim %d, hidden %d, %d layers, %d query heads, %d kv heads, head dim %d, "
               "vocab %d, context %d\n",
               printable(o.model).c_str(), c.dim, c.hidden_dim, c.n_layers, c.n_heads, c.n_kv_heads,
               c.head_size(), c.vocab_size, c.seq_len);

  llama2c::GenerateOptions options;
  options.steps = o.steps;
  options.temperature = o.temperature;
  options.topp = o.topp;
  options.seed = o.seed;
  // The generated text goes to stdout as it appears (as run.c prints it); progress to stderr.
  // On a terminal the counter rewrites one line; in a log it prints every tenth of the run.
  const bool terminal = isatty(fileno(stderr)) != 0;
  const int progress_every = terminal ? 1 : std::max(1, o.steps / 10);
  options.on_token = [&](int pos, int, const std::string&) {
    if (!o.quiet && ((pos + 1) % progress_every == 0 || pos + 1 == o.steps)) {
      std::fprintf(stderr, terminal ? "\r[%d/%d positions]" : "[%d/%d positions]\n", pos + 1,
                   o.steps);
      std::fflush(stderr);
    }
  };
  const llama2c::Generation generation = llama2c::generate(model, tokenizer, o.prompt, options);
  if (!o.quiet && terminal) std::fprintf(stderr, "\n");
  std::printf("%s\n", printable(generation.decoded, true).c_str());

  const std::string sampling = o.temperature == 0.0f
                                   ? std::string("greedy (temperature 0)")
                                   : "temperature " + format_float(o.temperature) + ", top-p " +
                                         format_float(o.topp) + ", seed " + std::to_string(o.seed) +
                                         " (Philox)";
  CaptureData data =
      llama2c::make_capture(model, generation, llama2c::model_name_from_path(o.model), o.prompt,
                            "kvscope-cli capture (llama2.c forward pass)");
  data.info.metadata["sampling"] = sampling;
  data.info.metadata["steps"] = std::to_string(o.steps);
  data.info.metadata["bos_restarts"] = std::to_string(generation.restarts);
  write_capture(o.out, data, dtype);
  std::fprintf(stderr,
               "wrote %s: %d tokens (%d prompt incl. BOS, %s, %d restart(s) after BOS), %d layers "
               "x %d kv heads (%d query heads) x head dim %d, %s\n",
               printable(o.out).c_str(), data.info.num_tokens, generation.prompt_tokens,
               sampling.c_str(), generation.restarts, c.n_layers, c.n_kv_heads, c.n_heads,
               c.head_size(), dtype_name(dtype));
}

}  // namespace

void add_capture_command(CLI::App& app) {
  auto options = std::make_shared<CaptureOptions>();
  auto* sub = app.add_subcommand(
      "capture",
      "Run a llama2.c checkpoint on the CPU and write a capture (queries, keys after RoPE, "
      "values, token strings) of BOS + prompt + generated tokens");
  sub->add_option("--model", options->model,
                  "llama2.c checkpoint (legacy format, e.g. "
                  "stories260K.bin)")
      ->required();
  sub->add_option("--tokenizer", options->tokenizer, "llama2.c tokenizer (e.g. tok512.bin)")
      ->required();
  sub->add_option("--prompt", options->prompt, "Prompt text (empty: start from BOS alone)");
  sub->add_option("--steps", options->steps,
                  "Positions to capture in total, BOS and prompt included (<= the model's "
                  "context). Generation continues past an end-of-story BOS.")
      ->capture_default_str();
  sub->add_option("--out", options->out, "Output capture (.safetensors or .npz)")->required();
  sub->add_option("--temperature", options->temperature, "0 = greedy")->capture_default_str();
  sub->add_option("--topp", options->topp, "Nucleus sampling threshold when temperature > 0")
      ->capture_default_str();
  sub->add_option("--seed", options->seed, "Seed for sampling when temperature > 0")
      ->check(seed_validator())
      ->capture_default_str();
  sub->add_option("--dtype", options->dtype, "Tensor dtype in the file: f32, f16 or bf16")
      ->capture_default_str();
  sub->add_flag("--quiet", options->quiet, "No progress output");
  sub->callback([options] { run_capture(*options); });
}

}  // namespace kvscope::cli
