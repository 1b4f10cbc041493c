// kvscope-cli capture: run a llama2.c checkpoint on the CPU and write a capture, or with --prompts
// a capture set of one capture per prompt and its manifest (docs/capturing.md).
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/output_file.h"
#include "cli/seed_flag.h"
#include "cli/validate.h"
#include "engine/core/error.h"
#include "engine/eval/capture_set.h"
#include "engine/io/capture.h"
#include "engine/model/llama2c.h"

namespace kvscope::cli {

namespace {
namespace fs = std::filesystem;

struct CaptureOptions {
  std::string model;
  std::string tokenizer;
  std::string prompt;
  std::string out;
  std::string prompts;  // --prompts FILE.jsonl: one capture per line into --out-dir
  std::string out_dir;
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

// Runs the model on one prompt (the generated text on stdout, progress on stderr) and returns the
// capture with its metadata.
struct Captured {
  CaptureData data;
  int prompt_tokens = 0;  // BOS included
};

Captured capture_one(llama2c::Transformer& model, llama2c::Tokenizer& tokenizer,
                     const CaptureOptions& o, const std::string& prompt) {
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
  const llama2c::Generation generation = llama2c::generate(model, tokenizer, prompt, options);
  if (!o.quiet && terminal) std::fprintf(stderr, "\n");
  std::printf("%s\n", printable(generation.decoded, true).c_str());

  const std::string sampling = o.temperature == 0.0f
                                   ? std::string("greedy (temperature 0)")
                                   : "temperature " + format_float(o.temperature) + ", top-p " +
                                         format_float(o.topp) + ", seed " + std::to_string(o.seed) +
                                         " (Philox)";
  CaptureData data =
      llama2c::make_capture(model, generation, llama2c::model_name_from_path(o.model), prompt,
                            "kvscope-cli capture (llama2.c forward pass)");
  data.info.metadata["sampling"] = sampling;
  data.info.metadata["steps"] = std::to_string(o.steps);
  data.info.metadata["bos_restarts"] = std::to_string(generation.restarts);
  return {std::move(data), generation.prompt_tokens};
}

void report_written(const std::string& path, const Captured& captured, DType dtype) {
  const CaptureInfo& i = captured.data.info;
  std::fprintf(stderr,
               "wrote %s: %d tokens (%s prompt incl. BOS, %s, %s restart(s) after BOS), %d layers "
               "x %d kv heads (%d query heads) x head dim %d, %s\n",
               printable(path).c_str(), i.num_tokens,
               std::to_string(captured.prompt_tokens).c_str(), i.metadata.at("sampling").c_str(),
               i.metadata.at("bos_restarts").c_str(), i.num_layers, i.kv_heads, i.q_heads,
               i.head_dim, dtype_name(dtype));
}

struct PromptLine {
  std::string prompt, label;
  int line = 0;
};

// --prompts FILE.jsonl: one {"prompt": ..., "label": ...} per line ("label" optional; blank lines
// skipped). Throws InputError naming the file and line.
std::vector<PromptLine> read_prompts(const std::string& path, bool greedy) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError("--prompts " + path + ": cannot open");
  std::vector<PromptLine> out;
  std::map<std::string, int> seen;
  std::string text;
  for (int number = 1; std::getline(in, text); ++number) {
    const std::string where = "--prompts " + path + " line " + std::to_string(number);
    if (!text.empty() && text.back() == '\r') text.pop_back();
    if (text.find_first_not_of(" \t") == std::string::npos) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
      throw InputError(where + ": not JSON (" + e.what() + ")");
    }
    if (!j.is_object() || !j.contains("prompt") || !j["prompt"].is_string())
      throw InputError(where + ": expected {\"prompt\": \"...\", \"label\": \"...\"}");
    if (j.contains("label") && !j["label"].is_string())
      throw InputError(where + ": \"label\" is not a string");
    PromptLine p{j["prompt"].get<std::string>(), j.value("label", std::string()), number};
    // Greedy decoding of the same prompt gives the same capture, which a set refuses.
    if (greedy) {
      const auto [it, fresh] = seen.emplace(p.prompt, number);
      if (!fresh)
        throw InputError(where + ": the same prompt as line " + std::to_string(it->second) +
                         " (greedy decoding would capture it twice)");
    }
    out.push_back(std::move(p));
  }
  if (out.empty()) throw InputError("--prompts " + path + ": no prompt in the file");
  return out;
}

// "007-genesis-1.safetensors": the position keeps the files in the manifest's order; the label,
// reduced to letters, digits, '-' and '_', says which prompt it is.
std::string capture_file_name(size_t index, size_t count, const std::string& label) {
  std::string slug;
  for (char ch : label) {
    const bool keep = std::isalnum(static_cast<unsigned char>(ch)) || ch == '-' || ch == '_';
    if (keep)
      slug += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    else if (!slug.empty() && slug.back() != '-')
      slug += '-';
    if (slug.size() >= 40) break;
  }
  while (!slug.empty() && slug.back() == '-') slug.pop_back();
  const int width = std::max<int>(3, static_cast<int>(std::to_string(count).size()));
  std::string number = std::to_string(index);
  number.insert(0, width - number.size(), '0');
  return number + (slug.empty() ? "" : "-" + slug) + ".safetensors";
}

// --prompts FILE --out-dir DIR: one capture per prompt and DIR/manifest.jsonl. The captures are
// written into a folder of their own inside DIR and moved next to the manifest only when every
// prompt has been captured: a failure leaves DIR as it was.
void run_capture_set(const CaptureOptions& o, llama2c::Transformer& model,
                     llama2c::Tokenizer& tokenizer, DType dtype,
                     const std::vector<PromptLine>& prompts) {
  const fs::path dir(o.out_dir);
  std::vector<CaptureSetEntry> entries;
  for (size_t i = 0; i < prompts.size(); ++i) {
    CaptureSetEntry e;
    e.path = capture_file_name(i, prompts.size(), prompts[i].label);
    e.label = prompts[i].label.empty() ? "prompt " + std::to_string(i) : prompts[i].label;
    e.prompt = prompts[i].prompt;
    entries.push_back(std::move(e));
  }
  for (const CaptureSetEntry& e : entries)
    if (fs::exists(dir / e.path))
      throw InputError("--out-dir " + o.out_dir + ": " + e.path + " is already there");
  const fs::path partial = dir / (".kvscope-capture-partial-" + std::to_string(getpid()));
  fs::create_directories(partial);
  try {
    for (size_t i = 0; i < prompts.size(); ++i) {
      std::fprintf(stderr, "prompt %zu/%zu (%s line %d)\n", i + 1, prompts.size(),
                   printable(o.prompts).c_str(), prompts[i].line);
      const Captured captured = capture_one(model, tokenizer, o, prompts[i].prompt);
      write_capture((partial / entries[i].path).string(), captured.data, dtype);
      report_written((dir / entries[i].path).string(), captured, dtype);
    }
    write_output((partial / "manifest.jsonl").string(), manifest_text(entries), "--out-dir");
    for (const CaptureSetEntry& e : entries) fs::rename(partial / e.path, dir / e.path);
    fs::rename(partial / "manifest.jsonl", dir / "manifest.jsonl");
    fs::remove_all(partial);
  } catch (...) {
    std::error_code ignored;
    fs::remove_all(partial, ignored);
    throw;
  }
  std::fprintf(stderr, "wrote %s: %zu captures (kvscope-cli eval %s)\n",
               printable((dir / "manifest.jsonl").string()).c_str(), entries.size(),
               printable((dir / "manifest.jsonl").string()).c_str());
}

void run_capture(const CaptureOptions& o) {
  // Output problems are caught before the model runs (a large checkpoint takes minutes).
  auto ends_with = [](const std::string& s, const std::string& suffix) {
    return s.size() >= suffix.size() &&
           s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  const DType dtype = parse_dtype(o.dtype);
  const bool one = o.prompts.empty();
  std::vector<PromptLine> prompts;
  if (one) {
    if (o.out.empty())
      throw InputError("--out: give the capture's file (or --prompts and --out-dir)");
    if (!o.out_dir.empty())
      throw InputError("--out-dir: only with --prompts (one capture per prompt)");
    const bool npz = ends_with(o.out, ".npz");
    if (!npz && !ends_with(o.out, ".safetensors")) {
      throw InputError("--out " + o.out + ": must end in .safetensors or .npz");
    }
    if (npz && dtype == DType::BF16) {
      throw InputError("--out " + o.out +
                       ": .npz cannot hold bf16; use .safetensors or --dtype f16");
    }
    check_output(o.out, {o.model, o.tokenizer}, "--out");
  } else {
    if (!o.out.empty() || !o.prompt.empty())
      throw InputError(
          "--prompts: the prompts and file names come from the file; drop --prompt "
          "and --out, give --out-dir");
    if (o.out_dir.empty()) throw InputError("--prompts: give --out-dir DIR for the captures");
    if (fs::exists(fs::path(o.out_dir) / "manifest.jsonl"))
      throw InputError("--out-dir " + o.out_dir +
                       ": already holds a manifest.jsonl (choose a new folder)");
    prompts = read_prompts(o.prompts, o.temperature == 0.0f);
  }
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

  if (!one) return run_capture_set(o, model, tokenizer, dtype, prompts);
  const Captured captured = capture_one(model, tokenizer, o, o.prompt);
  write_capture(o.out, captured.data, dtype);
  report_written(o.out, captured, dtype);
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
  sub->add_option("--out", options->out, "Output capture (.safetensors or .npz)");
  sub->add_option("--prompts", options->prompts,
                  "A capture set instead: FILE.jsonl with one {\"prompt\": ..., \"label\": ...} "
                  "per line; one capture per prompt into --out-dir with its manifest.jsonl");
  sub->add_option("--out-dir", options->out_dir,
                  "With --prompts: the folder for the captures and manifest.jsonl");
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
