// kvscope-cli generate: what compressing the cache does to a llama2.c model's output
// (docs/generate.md).
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <sstream>
#include <string>

#include "cli/commands.h"
#include "cli/output_file.h"
#include "cli/validate.h"
#include "engine/core/error.h"
#include "engine/eval/protocol.h"
#include "engine/model/generate.h"
#include "engine/model/llama2c.h"

namespace kvscope::cli {

namespace {

struct GenerateOptions {
  std::string model, tokenizer, prompt, methods = "uniform,snapkv,balancekv", ratios = "0.25";
  std::string budget;  // --budget B1,B2: middle entries kept (replaces --ratios)
  const CLI::Option* ratios_option = nullptr;
  std::vector<std::string> params;
  // Read wide, so a value far out of range gets the range message rather than CLI11's "could not
  // convert"; the seed as text, so "-1" is refused instead of wrapping to 2^64 - 1.
  long long compress_at = 0, steps = 64, recompress_every = 0, sink = -1, window = -1, threads = 0;
  std::string seed = "0";
  std::string continuation_file, json_out;
  bool quiet = false;
};

std::vector<double> parse_ratio_list(const std::string& list) {
  if (const std::vector<double>* preset = parse_ratio_preset(list)) return *preset;
  std::vector<double> out;
  std::stringstream ss(list);
  std::string item;
  while (std::getline(ss, item, ',')) {
    double value = 0;
    const auto slash = item.find('/');
    try {
      size_t used = 0;
      if (slash != std::string::npos) {
        const double num = std::stod(item.substr(0, slash));
        const double den = std::stod(item.substr(slash + 1), &used);
        if (used != item.size() - slash - 1) throw std::invalid_argument(item);
        value = num / den;
      } else {
        value = std::stod(item, &used);
        if (used != item.size()) throw std::invalid_argument(item);
      }
    } catch (const std::exception&) {
      throw InputError("--ratios: '" + item + "' is not a number (e.g. 0.25 or 1/4)");
    }
    for (double earlier : out)
      if (earlier == value) throw InputError("--ratios: " + item + " given twice");
    out.push_back(value);
  }
  if (out.empty()) throw InputError("--ratios: empty list");
  return out;
}

uint64_t parse_seed(const std::string& text) {
  uint64_t value = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc() || ptr != end)
    throw InputError("--seed '" + printable(text) +
                     "': must be an integer between 0 and 18446744073709551615");
  return value;
}

std::string read_text(const std::string& path) {
  // A continuation longer than the model's context cannot be scored anyway: refuse FIFOs (opening
  // one would wait for a writer), directories, devices and huge files before opening them.
  constexpr std::streamoff kMaxContinuationBytes = 1 << 20;
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    throw InputError("--continuation " + printable(path) +
                     ": cannot open: " + std::strerror(errno));
  if (!S_ISREG(st.st_mode))
    throw InputError("--continuation " + printable(path) + ": is " +
                     (S_ISFIFO(st.st_mode)                         ? "a FIFO (named pipe)"
                      : S_ISDIR(st.st_mode)                        ? "a directory"
                      : S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) ? "a device"
                                                                   : "not a regular file") +
                     "; it must be a regular text file");
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw InputError("--continuation " + printable(path) + ": cannot open");
  const std::streamoff size = in.tellg();
  if (size < 0) throw InputError("--continuation " + printable(path) + ": cannot read its size");
  if (size > kMaxContinuationBytes)
    throw InputError("--continuation " + printable(path) + ": " + std::to_string(size) +
                     " bytes, more than the 1 MiB limit");
  in.seekg(0);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void run_generate_command(const GenerateOptions& o) {
  // Every numeric flag first, with its limits (the engine checks how they fit the model).
  check_range(o.steps, 1, 1 << 20, "--steps");
  check_range(o.compress_at, 0, 1 << 20, "--compress-at");
  check_range(o.recompress_every, 0, 1 << 20, "--recompress-every");
  check_range(o.sink, -1, 1 << 20, "--sink");
  check_range(o.window, -1, 1 << 20, "--window");
  check_range(o.threads, 0, 4096, "--threads");
  GenerateSpec spec;
  spec.prompt = o.prompt;
  spec.methods = parse_method_list(o.methods);
  if (o.methods == "all") {
    // Methods that need every kv head of a layer at once (compactor, adakv(...)) cannot run on
    // generate's per-head caches: "all" leaves them out (named, they are refused).
    std::string left_out;
    std::erase_if(spec.methods, [&](const Method* m) {
      if (!m->needs_layer()) return false;
      left_out += (left_out.empty() ? "" : ", ") + m->name();
      return true;
    });
    if (!left_out.empty())
      std::fprintf(stderr,
                   "note: --methods all leaves out %s (they need every kv head of a layer)\n",
                   left_out.c_str());
  }
  if (!o.budget.empty()) {
    spec.budgets = parse_budget_list(o.budget, o.ratios_option && o.ratios_option->count() > 0,
                                     1 << 20, "cache entries");
  } else {
    spec.ratios = parse_ratio_list(o.ratios);
  }
  for (const std::string& p : o.params) {
    const auto dot = p.find('.'), eq = p.find('=');
    if (dot == std::string::npos || eq == std::string::npos || eq < dot)
      throw InputError("--param " + p + ": expected method.name=value");
    try {
      spec.params[p.substr(0, dot)][p.substr(dot + 1, eq - dot - 1)] = std::stod(p.substr(eq + 1));
    } catch (const std::out_of_range&) {
      throw InputError("--param " + printable(p) + ": value is beyond the range of a double");
    } catch (const std::exception&) {
      throw InputError("--param " + printable(p) + ": value is not a number");
    }
  }
  spec.compress_at = static_cast<int>(o.compress_at);
  spec.steps = static_cast<int>(o.steps);
  spec.recompress_every = static_cast<int>(o.recompress_every);
  spec.sink = static_cast<int>(o.sink);
  spec.window = static_cast<int>(o.window);
  spec.seed = parse_seed(o.seed);
  spec.threads = static_cast<int>(o.threads);
  if (!o.continuation_file.empty()) {
    spec.has_continuation = true;
    spec.continuation = read_text(o.continuation_file);
  }
  const std::vector<std::string> inputs = {o.model, o.tokenizer, o.continuation_file};
  // Fail on an unwritable output before the model runs.
  if (!o.json_out.empty()) check_output(o.json_out, inputs, "--json");

  llama2c::Transformer model(o.model);
  llama2c::Tokenizer tokenizer(o.tokenizer, model.config().vocab_size);
  const bool terminal = isatty(fileno(stderr)) != 0;
  long long last_tenth = -1;
  const GenerateReport rep =
      run_generate(model, tokenizer, spec, [&](long long done, long long total) {
        if (o.quiet) return;
        const long long tenth = done * 10 / total;
        if (terminal) {
          std::fprintf(stderr, "\r[%lld/%lld forward passes]", done, total);
        } else if (tenth != last_tenth) {
          std::fprintf(stderr, "[%lld/%lld forward passes]\n", done, total);
        }
        last_tenth = tenth;
      });
  if (!o.quiet && terminal) std::fprintf(stderr, "\n");

  std::string prefix, exact;
  for (size_t i = 1; i < rep.prefix_text.size(); ++i) prefix += rep.prefix_text[i];
  for (const std::string& t : rep.exact_text) exact += t;
  std::printf("compressed at position %d (s = %d sinks, window %d), %d steps%s\n",
              rep.spec.compress_at, rep.sink, rep.window, rep.spec.steps,
              rep.spec.recompress_every > 0
                  ? (", re-compressed every " + std::to_string(rep.spec.recompress_every)).c_str()
                  : ", compressed once");
  std::printf("prefix: %s\nexact:  %s\n", printable(prefix, true).c_str(),
              printable(exact, true).c_str());
  if (rep.spec.has_continuation)
    std::printf("continuation: %d tokens scored, exact-cache perplexity %.4f\n", rep.scored_tokens,
                rep.exact_perplexity);
  const bool by_budget = !rep.spec.budgets.empty();
  std::printf("%-16s %7s %9s %9s %10s %9s\n", "method", by_budget ? "budget" : "ratio", "top1",
              "mean KL", "perplexity", "diverges");
  for (const GenerateRun& r : rep.runs) {
    char ppl[32] = "-";
    if (rep.spec.has_continuation) std::snprintf(ppl, sizeof ppl, "%.4f", r.perplexity);
    char div[16] = "never";
    if (r.first_divergence >= 0) std::snprintf(div, sizeof div, "step %d", r.first_divergence);
    char col[32];
    if (r.budget >= 0)
      std::snprintf(col, sizeof col, "%d", r.budget);
    else
      std::snprintf(col, sizeof col, "%.4f", r.ratio);
    std::printf("%-16s %7s %8.1f%% %9.5f %10s %9s\n", r.method.c_str(), col,
                100.0 * r.top1_agreement, r.mean_kl, ppl, div);
  }
  for (const std::string& n : rep.notes) std::printf("note: %s\n", n.c_str());
  if (!o.json_out.empty()) {
    write_output(o.json_out,
                 rep.to_json().dump(1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n",
                 "--json", inputs);
    if (o.json_out != "-") std::fprintf(stderr, "wrote %s\n", printable(o.json_out).c_str());
  }
}

}  // namespace

void add_generate_command(CLI::App& app) {
  auto o = std::make_shared<GenerateOptions>();
  auto* sub = app.add_subcommand(
      "generate",
      "Run a llama2.c model on a prompt, compress every layer's KV cache at position N with each "
      "method and ratio, continue greedily, and compare with the exact cache: top-1 agreement and "
      "KL per step (teacher-forced on the exact tokens), the continuations, perplexity");
  sub->add_option("--model", o->model, "llama2.c checkpoint (e.g. kjv3M.bin)")->required();
  sub->add_option("--tokenizer", o->tokenizer, "llama2.c tokenizer (e.g. tok1024.bin)")->required();
  sub->add_option("--prompt", o->prompt, "Prompt text (BOS is prepended)");
  sub->add_option("--methods", o->methods, "Comma-separated methods or 'all'")
      ->capture_default_str();
  o->ratios_option = sub->add_option("--ratios", o->ratios,
                                     "Comma-separated keep ratios (0.25 or 1/4), or the preset "
                                     "kvpress (keep 0.75,0.5,0.25,0.125)")
                         ->capture_default_str();
  sub->add_option("--budget", o->budget,
                  "Token budgets instead of ratios, comma separated: the middle keeps exactly B "
                  "cache entries at every compression (sinks and window on top)");
  sub->add_option("--param", o->params, "Method parameter, method.name=value (repeatable)");
  sub->add_option("--compress-at", o->compress_at,
                  "N: positions run with the full cache before compression (0: the prompt's "
                  "length with BOS; greedy tokens fill the positions after the prompt)")
      ->capture_default_str();
  sub->add_option("--steps", o->steps, "Tokens generated after compression")->capture_default_str();
  sub->add_option("--recompress-every", o->recompress_every,
                  "Compress again after every K new positions (0: once)")
      ->capture_default_str();
  sub->add_option("--sink", o->sink, "Sink tokens kept (default: the protocol's N/32)");
  sub->add_option("--window", o->window,
                  "Most recent positions kept at compression (default: the protocol's N/8)");
  sub->add_option("--seed", o->seed, "Seed passed to random methods")->capture_default_str();
  sub->add_option("--continuation", o->continuation_file,
                  "Text file that follows the prompt verbatim: its perplexity under each method "
                  "(teacher-forced, compressed at N the same way)");
  sub->add_option("--threads", o->threads, "Runs in parallel (0: all cores)")
      ->capture_default_str();
  sub->add_option("--json", o->json_out, "Write the full report as JSON");
  sub->add_flag("--quiet", o->quiet, "No progress output");
  sub->callback([o] { run_generate_command(*o); });
}

}  // namespace kvscope::cli
