#include "cli/eval_output.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>
#include <stdexcept>

#include "cli/output_file.h"
#include "cli/validate.h"
#include "engine/core/error.h"
#include "engine/io/json_limits.h"

namespace kvscope::cli {
namespace {

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string ratio_label(double r) {
  return fmt("%g", r);
}

// Strict number parse: the whole string must be a finite number (or a fraction a/b).
bool parse_double(const std::string& s, double* out) {
  if (s.empty()) return false;
  const size_t slash = s.find('/');
  if (slash != std::string::npos) {
    double a = 0, b = 0;
    if (!parse_double(s.substr(0, slash), &a) || !parse_double(s.substr(slash + 1), &b) || b == 0)
      return false;
    *out = a / b;
    return true;
  }
  try {
    size_t used = 0;
    *out = std::stod(s, &used);
    return used == s.size() && std::isfinite(*out);
  } catch (const std::exception&) {
    return false;
  }
}

}  // namespace

std::vector<double> parse_number_list(const std::string& text, const std::string& flag) {
  std::vector<double> out;
  for (const std::string& item : split(text, ',')) {
    double v = 0;
    if (!parse_double(item, &v))
      throw InputError(flag + ": '" + item + "' is not a number (in '" + text + "')");
    out.push_back(v);
  }
  return out;
}

std::vector<int> parse_index_list(const std::string& text, const std::string& flag) {
  std::vector<int> out;
  auto to_int = [&](const std::string& s) {
    try {
      size_t used = 0;
      const int v = std::stoi(s, &used);
      if (used == s.size() && v >= 0) return v;
    } catch (const std::exception&) {
    }
    throw InputError(flag + ": '" + s + "' is not a non-negative integer (in '" + text + "')");
  };
  for (const std::string& item : split(text, ',')) {
    const size_t dash = item.find('-');
    if (dash == std::string::npos) {
      out.push_back(to_int(item));
      continue;
    }
    const int a = to_int(item.substr(0, dash)), b = to_int(item.substr(dash + 1));
    if (b < a) throw InputError(flag + ": range '" + item + "' runs backwards");
    // Bounded before expanding (see parse_bounded_index_list for lists checked against a capture).
    if (b - a >= (1 << 20) || out.size() + static_cast<size_t>(b - a) >= (1u << 20))
      throw InputError(flag + ": '" + item + "' lists more than 1048576 indices (limit)");
    for (int v = a; v <= b; ++v) out.push_back(v);
  }
  return out;
}

double parse_param_value(const ParamSpec& spec, const std::string& text, const std::string& flag) {
  double v = 0;
  if (parse_double(text, &v)) return v;
  if (spec.type == ParamSpec::Type::Bool) {
    if (text == "true" || text == "on") return 1;
    if (text == "false" || text == "off") return 0;
  }
  if (spec.type == ParamSpec::Type::Choice) {
    for (size_t i = 0; i < spec.choices.size(); ++i)
      if (spec.choices[i] == text) return static_cast<double>(i);
    std::string known;
    for (const std::string& c : spec.choices) known += (known.empty() ? "" : ", ") + c;
    throw InputError(flag + ": '" + text + "' is not one of " + known);
  }
  throw InputError(flag + ": '" + text + "' is not a number");
}

void write_json_file(const std::string& path, const nlohmann::json& j, const std::string& flag,
                     const std::vector<std::string>& inputs) {
  write_output(path, j.dump(1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n", flag,
               inputs);
}

void write_csv_file(const std::string& path, const EvalReport& report, const std::string& flag,
                    const std::vector<std::string>& inputs) {
  write_output(path, EvalReport::csv_header() + report.csv_rows(), flag, inputs);
}

nlohmann::json read_json_file(const std::string& path) {
  // An eval report of 32 layers x 8 heads x 14 methods x 4 ratios is ~50 MB; the limits leave
  // room for far larger runs while keeping a hostile file from taking gigabytes.
  JsonLimits limits;
  limits.max_depth = 32;
  limits.max_values = 1ull << 24;
  return read_json_file_limited(path, 256ull << 20, limits);
}

namespace {

// The capture, the window, the budgets, the seeds, the estimator and the report's notes.
void print_run_header(const EvalReport& rep, bool by_budget) {
  const CaptureInfo& info = rep.info;
  std::printf("capture  %s (%s, %d tokens, %d layers, %d query / %d kv heads, d=%d)%s\n",
              printable(rep.capture_path).c_str(),
              info.model.empty() ? "model not recorded" : printable(info.model).c_str(),
              info.num_tokens, info.num_layers, info.q_heads, info.kv_heads, info.head_dim,
              info.synthetic ? " [SYNTHETIC]" : "");
  std::printf("window   %s\n", rep.window_example.describe().c_str());
  std::string budgets;
  for (size_t i = 0; i < rep.spec.ratios.size(); ++i) {
    const double r = rep.spec.ratios[i];
    const long long m = std::llround(r * rep.window_example.n_mid);
    budgets += (budgets.empty() ? "" : ", ") +
               (by_budget ? "budget " + std::to_string(m) + " (ratio " + fmt("%.4g", r) + ")"
                          : ratio_label(r) + " -> m=" + std::to_string(m));
  }
  std::printf("budgets  %s%s\n", budgets.c_str(),
              by_budget ? "; a budget counts middle tokens: the cache holds s + m + E" : "");
  std::printf("seeds    %d (seed r = %llu + r)", rep.spec.seeds,
              static_cast<unsigned long long>(rep.spec.base_seed));
  if (rep.spec.shard_count > 1)
    std::printf(", shard %d/%d", rep.spec.shard_index, rep.spec.shard_count);
  std::printf("\n");
  if (rep.spec.estimator == Estimator::Authors)
    std::printf(
        "estimator authors: numerator weight w, denominator weight 2^T on every kept "
        "token\n");
  for (const std::string& note : rep.notes) std::printf("note     %s\n", printable(note).c_str());
}

// Heads the capture refuses (NaN/Inf or values too large for float), once each. A method the
// capture cannot run ("<method> needs ...") is named once in the report's notes already.
void print_refused_heads(const EvalReport& rep) {
  std::vector<std::string> refused_heads;
  for (const HeadEval& he : rep.results)
    if (he.refused && !he.note.empty() && he.note.rfind(he.method + " needs ", 0) != 0 &&
        std::find(refused_heads.begin(), refused_heads.end(), he.note) == refused_heads.end())
      refused_heads.push_back(he.note);
  for (size_t i = 0; i < refused_heads.size() && i < 8; ++i)
    std::printf("note     refused: %s\n", printable(refused_heads[i]).c_str());
  if (refused_heads.size() > 8)
    std::printf("note     ... and %zu more refused heads (see the JSON)\n",
                refused_heads.size() - 8);
}

// What methods said about their own runs (top-ups, scaled defaults, FAIL cases): the first
// note of each method, and how many other notes it left.
void print_method_notes(const EvalReport& rep) {
  for (const Method* m : rep.spec.methods) {
    std::vector<std::string> seen;
    for (const HeadEval& he : rep.results)
      if (he.method == m->name() && !he.refused && he.error.empty() && !he.note.empty() &&
          std::find(seen.begin(), seen.end(), he.note) == seen.end())
        seen.push_back(he.note);
    if (seen.empty()) continue;
    std::printf("note     %s: %s", m->name().c_str(), printable(seen[0]).c_str());
    if (seen.size() > 1) std::printf(" (and %zu other notes, see the JSON)", seen.size() - 1);
    std::printf("\n");
  }
}

// The heading of every ratio's column: its budget in middle tokens, or the ratio.
void print_ratio_columns(const EvalReport& rep, bool by_budget) {
  for (double r : rep.spec.ratios)
    std::printf("  %-19s",
                (by_budget ? "budget " + std::to_string(std::llround(r * rep.window_example.n_mid))
                           : "ratio " + ratio_label(r))
                    .c_str());
  std::printf("\n");
}

// What a table cell without figures shows: "-" when no head of that method and ratio (and layer,
// unless layer < 0) ran, "failed" when one failed, else "refused".
std::string cell_status(const EvalReport& rep, const std::string& method, double ratio, int layer) {
  bool any = false, failed = false;
  for (const HeadEval& he : rep.results) {
    if (he.method != method || he.ratio != ratio || (layer >= 0 && he.layer != layer)) continue;
    any = true;
    failed |= !he.error.empty();
  }
  return !any ? "-" : failed ? "failed" : "refused";
}

// method x ratio: the relative error, mean +- std over seeds.
void print_error_table(const EvalReport& rep, const std::vector<EvalSummary>& sum, int name_width,
                       bool by_budget) {
  std::printf("\nrelative error ||z_j - Attn_j|| / ||Attn_j||, mean +- std over seeds\n");
  std::printf("%-*s", name_width, "method");
  print_ratio_columns(rep, by_budget);
  size_t k = 0;
  for (const Method* m : rep.spec.methods) {
    std::printf("%-*s", name_width, m->name().c_str());
    for (double r : rep.spec.ratios) {
      const EvalSummary& s = sum[k++];
      const std::string cell = s.heads > 0 ? fmt("%.4f", s.mean) + " +- " + fmt("%.4f", s.std)
                                           : cell_status(rep, m->name(), r, -1);
      std::printf("  %-19s", cell.c_str());
    }
    std::printf("\n");
  }
}

// Harm kept vs dropped (docs/evaluation.md, "Harm kept and dropped").
void print_harm_table(const EvalReport& rep, const std::vector<EvalSummary>& sum, int name_width,
                      bool by_budget) {
  std::printf(
      "\nharm dropped: the summed harm of the middle tokens a method dropped (each token's "
      "harm: the\nexact output change of evicting it alone), share of the middle's total, "
      "mean over heads\n%-*s",
      name_width, "method");
  print_ratio_columns(rep, by_budget);
  size_t i = 0;
  for (const Method* m : rep.spec.methods) {
    std::printf("%-*s", name_width, m->name().c_str());
    for (size_t r = 0; r < rep.spec.ratios.size(); ++r) {
      const EvalSummary& s = sum[i++];
      std::printf("  %-19s", std::isnan(s.harm_dropped)
                                 ? "-"
                                 : (fmt("%.4g", s.harm_dropped) + " (" +
                                    fmt("%.0f%%", 100 * s.harm_dropped_share) + ")")
                                       .c_str());
    }
    std::printf("\n");
  }
}

// Per-layer means (over kv heads and seeds).
void print_layer_table(const EvalReport& rep, int name_width, bool by_budget) {
  std::set<int> layer_set;
  for (const HeadEval& he : rep.results) layer_set.insert(he.layer);
  if (rep.results.empty()) return;
  std::printf("\nper-layer mean relative error\n%-*s %-7s", name_width, "method",
              by_budget ? "budget" : "ratio");
  for (int l : layer_set) {
    char label[16];
    std::snprintf(label, sizeof label, "L%d", l);
    std::printf(" %9s", label);
  }
  std::printf("\n");
  for (const Method* m : rep.spec.methods) {
    for (double r : rep.spec.ratios) {
      std::printf("%-*s %-7s", name_width, m->name().c_str(),
                  by_budget ? std::to_string(std::llround(r * rep.window_example.n_mid)).c_str()
                            : ratio_label(r).c_str());
      for (int l : layer_set) {
        double acc = 0;
        int count = 0;
        for (const HeadEval& he : rep.results)
          if (he.method == m->name() && he.ratio == r && he.layer == l && !he.refused &&
              he.error.empty()) {
            acc += he.mean;
            ++count;
          }
        std::printf(" %9s", count ? fmt("%.4f", acc / count).c_str()
                                  : cell_status(rep, m->name(), r, l).c_str());
      }
      std::printf("\n");
    }
  }
}

}  // namespace

void print_report(const EvalReport& rep) {
  const bool by_budget = !rep.spec.budgets.empty();
  print_run_header(rep, by_budget);
  print_refused_heads(rep);
  print_method_notes(rep);
  // The method column fits the longest name (wrapped ones such as adakv(expected-attention)).
  int name_width = 18;
  for (const Method* m : rep.spec.methods)
    name_width = std::max(name_width, static_cast<int>(m->name().size()));
  const std::vector<EvalSummary> sum = rep.summary();
  print_error_table(rep, sum, name_width, by_budget);
  if (rep.spec.harm) print_harm_table(rep, sum, name_width, by_budget);
  print_layer_table(rep, name_width, by_budget);
  for (const std::string& f : rep.failures())
    std::fprintf(stderr, "kvscope-cli: %s\n", printable(f).c_str());
  std::fflush(stdout);
}

std::string methods_left_out_note(const std::vector<std::string>& left_out) {
  std::string note = "left out of --methods all (this capture cannot run them): ";
  for (size_t i = 0; i < left_out.size(); ++i) note += (i > 0 ? "; " : "") + left_out[i];
  return note;
}

void fail_on_method_errors(const EvalReport& report) {
  const std::vector<std::string> f = report.failures();
  if (!f.empty())
    throw std::runtime_error(std::to_string(f.size()) +
                             " method(s) failed on some heads (see the lines above); the other "
                             "figures were written");
}

}  // namespace kvscope::cli
