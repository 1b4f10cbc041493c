// kvscope-cli info FILE: what a capture holds (model, shapes, tokens, provenance), read from the
// header alone; --check also loads every layer and verifies every value is finite.
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/commands.h"
#include "cli/validate.h"
#include "engine/core/error.h"
#include "engine/io/capture.h"

namespace kvscope::cli {
namespace {

// Token text made printable on one line: control characters escaped, quotes kept visible.
std::string quoted(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"')
      out += "\\\"";
    else if (c == '\\')
      out += "\\\\";
    else
      out += c;
  }
  return printable(out);
}

// Shortens to at most `max_bytes`, never cutting a UTF-8 sequence in half.
std::string shorten(const std::string& s, size_t max_bytes) {
  if (s.size() <= max_bytes) return s;
  size_t cut = max_bytes;
  while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;
  return s.substr(0, cut) + "...";
}

std::string human_bytes(long long bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[64];
  if (u == 0)
    std::snprintf(buf, sizeof buf, "%lld B", bytes);
  else
    std::snprintf(buf, sizeof buf, "%.1f %s (%lld bytes)", v, units[u], bytes);
  return buf;
}

struct InfoOptions {
  std::string path;
  int show_tokens = 20;
  bool check = false;
  bool json = false;
};

void print_text(const CaptureInfo& info, const InfoOptions& opt) {
  // Every string from the file (or the command line) is escaped: a capture's metadata must not
  // be able to send escape sequences to the terminal.
  std::printf("file        %s\n", printable(info.path).c_str());
  std::printf("format      %s, %s, %s\n", info.file_format.c_str(), info.format.c_str(),
              human_bytes(info.file_bytes).c_str());
  std::printf("model       %s\n",
              info.model.empty() ? "(not recorded)" : printable(info.model).c_str());
  std::printf("synthetic   %s\n", info.synthetic
                                      ? "YES - generated data for scale and speed tests, not a "
                                        "real model's cache"
                                      : "no");
  std::printf("source      %s\n",
              info.source.empty() ? "(not recorded)" : printable(info.source).c_str());
  std::printf("layers      %d\n", info.num_layers);
  std::printf("heads       %d query, %d kv (GQA group of %d)\n", info.q_heads, info.kv_heads,
              info.group_size());
  std::printf("head dim    %d (keys, queries)\n", info.head_dim);
  std::printf("value dim   %d\n", info.value_dim);
  std::printf("tokens      %d\n", info.num_tokens);
  std::printf("dtype       %s\n", dtype_name(info.dtype));
  std::printf("queries     %s\n", info.has_queries ? "yes"
                                                   : "no (query-aware methods and "
                                                     "real-query error unavailable)");
  std::printf("prompt      \"%s\"\n", quoted(shorten(info.prompt, 100)).c_str());
  const int shown = std::min<int>(opt.show_tokens, static_cast<int>(info.tokens.size()));
  std::printf("first %d tokens:\n", shown);
  for (int i = 0; i < shown; ++i) std::printf("  %5d  \"%s\"\n", i, quoted(info.tokens[i]).c_str());
  if (shown < static_cast<int>(info.tokens.size()))
    std::printf("  ... %zu more\n", info.tokens.size() - shown);
}

void print_json(const CaptureInfo& info, const InfoOptions& opt) {
  nlohmann::json j;
  j["file"] = info.path;
  j["file_format"] = info.file_format;
  j["file_bytes"] = info.file_bytes;
  j["format"] = info.format;
  j["model"] = info.model;
  j["synthetic"] = info.synthetic;
  j["source"] = info.source;
  j["num_layers"] = info.num_layers;
  j["q_heads"] = info.q_heads;
  j["kv_heads"] = info.kv_heads;
  j["head_dim"] = info.head_dim;
  j["value_dim"] = info.value_dim;
  j["num_tokens"] = info.num_tokens;
  j["dtype"] = dtype_name(info.dtype);
  j["has_queries"] = info.has_queries;
  j["prompt"] = info.prompt;
  const int shown = std::min<int>(opt.show_tokens, static_cast<int>(info.tokens.size()));
  j["first_tokens"] = std::vector<std::string>(info.tokens.begin(), info.tokens.begin() + shown);
  std::printf("%s\n", j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
}

// Loads every layer (one resident at a time) and fails listing the refused heads, if any.
void check_all_layers(CaptureFile& capture, bool quiet) {
  capture.set_max_cached_layers(1);
  std::vector<std::string> problems;
  for (int L = 0; L < capture.info().num_layers; ++L) {
    auto layer = capture.layer(L);
    for (const std::string& why : layer->refused)
      if (!why.empty()) problems.push_back(why);
  }
  if (!problems.empty()) {
    std::string message = std::to_string(problems.size()) + " kv head(s) refused: " + problems[0];
    for (size_t i = 1; i < problems.size() && i < 8; ++i) message += "\n  " + problems[i];
    if (problems.size() > 8) message += "\n  ...";
    throw InputError(message);
  }
  if (!quiet)
    std::printf("check       all %d layers load; every value is finite\n",
                capture.info().num_layers);
}

}  // namespace

void add_info_command(CLI::App& app) {
  auto opt = std::make_shared<InfoOptions>();
  auto* sub = app.add_subcommand("info", "Show what a capture (.safetensors or .npz) holds");
  sub->add_option("file", opt->path, "Capture file")->required();
  sub->add_option("--tokens", opt->show_tokens, "How many leading tokens to list")
      ->default_val(20)
      ->check(CLI::NonNegativeNumber);
  sub->add_flag("--check", opt->check,
                "Also load every layer and check every value is finite (exit 1 if a head is "
                "refused)");
  sub->add_flag("--json", opt->json, "Print the summary as JSON");
  sub->callback([opt] {
    auto capture = CaptureFile::open(opt->path);
    if (opt->json)
      print_json(capture->info(), *opt);
    else
      print_text(capture->info(), *opt);
    std::fflush(stdout);
    if (opt->check) check_all_layers(*capture, opt->json);
  });
}

}  // namespace kvscope::cli
