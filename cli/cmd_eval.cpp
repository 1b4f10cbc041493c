// kvscope-cli eval: the evaluation protocol of docs/evaluation.md over a capture (methods x keep
// ratios x layers x kv heads x seeds), printed as tables and written as JSON/CSV; shardable
// (--shard i/N) for job arrays, merged exactly by `kvscope-cli merge`. kvscope-cli sweep: the same
// protocol over a grid of one method's parameters (for tuning);
// --grid2 A=... B=... prints it as one table per ratio (rows A, columns B) with the best and the
// default cell marked (engine/eval/sweep_grid.h).
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/eval_output.h"
#include "cli/output_file.h"
#include "cli/seed_flag.h"
#include "cli/validate.h"
#include "engine/core/error.h"
#include "engine/eval/capture_set.h"
#include "engine/eval/holdout.h"
#include "engine/eval/protocol.h"
#include "engine/eval/set_eval.h"
#include "engine/eval/sweep_grid.h"
#include "engine/io/capture.h"
#include "engine/ops/backend.h"

namespace kvscope::cli {
namespace {

// Options both commands share.
struct CommonOptions {
  std::string path;
  std::string ratios = "0.5,0.25,0.125,0.0625";
  std::string budget;  // --budget B1,B2,...: middle tokens kept (replaces --ratios)
  const CLI::Option* ratios_option = nullptr;
  int seeds = 10;
  unsigned long long base_seed = 0;
  std::string layers, heads;
  int sink = -1, eval = -1;
  std::string backend = "cpu";
  int threads = 0;
  std::string json_out;
  const CLI::Option* sink_option = nullptr;  // to tell "--sink not given" from a given value
  const CLI::Option* eval_option = nullptr;
  std::string estimator = "weighted";
};

struct EvalOptions {
  CommonOptions common;
  std::string methods = "all";
  std::vector<std::string> params;
  std::string shard;
  std::string csv_out;
  std::string summary_csv_out;  // sets: the aggregate rows
};

struct SweepOptions {
  CommonOptions common;
  std::string method;
  std::vector<std::string> params;
  std::vector<std::string> grid2;  // exactly two name=v1,v2,... (rows, columns)
  std::string csv_out;
  bool per_head_csv = false;
  // Sets: tune on some prompts, judge on the others (docs/evaluation.md, "Held-out tuning").
  double holdout = 0;
  unsigned long long split_seed = 0;
  bool per_layer = false;
};

void add_common(CLI::App* sub, CommonOptions& o) {
  sub->add_option("file", o.path, "capture (.safetensors or .npz)")->required();
  o.ratios_option =
      sub->add_option("--ratios", o.ratios,
                      "keep ratios, comma separated (0.5 or 1/2), or the preset kvpress (keep "
                      "0.75,0.5,0.25,0.125: kvpress's compression ratios 0.25..0.875)")
          ->capture_default_str();
  sub->add_option("--budget", o.budget,
                  "token budgets instead of ratios, comma separated: each method keeps exactly B "
                  "middle tokens (sinks and evaluation window on top; docs/evaluation.md)");
  sub->add_option("--seeds", o.seeds, "seeds R: seed r runs with base-seed + r")
      ->capture_default_str();
  // The check reads the text: an unsigned option would take "-1" as 2^64 - 1.
  sub->add_option("--base-seed", o.base_seed, "first seed")
      ->check(seed_validator())
      ->capture_default_str();
  sub->add_option("--layers", o.layers, "layers, e.g. 0,2,4-7 (default all)");
  sub->add_option("--heads", o.heads, "kv heads, e.g. 0-3 (default all)");
  o.sink_option = sub->add_option("--sink", o.sink, "sink tokens s (default min(256, n/32))");
  o.eval_option = sub->add_option("--eval", o.eval, "evaluation queries E (default min(256, n/8))");
  sub->add_option("--backend", o.backend, backend_choices_text())->capture_default_str();
  sub->add_option("--threads", o.threads, "worker threads (0: all cores)")->capture_default_str();
  sub->add_option("--json", o.json_out, "write the report as JSON");
  sub->add_option("--estimator", o.estimator,
                  "weighted: numerator and denominator use the method's weights w; authors: the "
                  "BalanceKV authors' notebook estimator, numerator w, denominator 2^T on every "
                  "kept token (T = ceil(log2(1/ratio)))")
      ->capture_default_str();
}

// The flags shared by eval and sweep, range-checked (limits in the messages) and bounded by the
// capture before anything is sized by them.
EvalSpec base_spec(const CommonOptions& o, const CaptureInfo& info) {
  EvalSpec spec;
  if (!o.budget.empty()) {
    spec.budgets = parse_budget_list(o.budget, o.ratios_option && o.ratios_option->count() > 0,
                                     kMaxCaptureTokens, "tokens");
    // Checked against the capture's middle once s and E are known (below).
  } else if (const std::vector<double>* preset = parse_ratio_preset(o.ratios)) {
    spec.ratios = *preset;
  } else {
    spec.ratios = parse_number_list(o.ratios, "--ratios");
  }
  if (spec.ratios.size() > 64)
    throw InputError("--ratios: " + std::to_string(spec.ratios.size()) +
                     " keep ratios given, at most 64");
  // Each ratio is checked against (0, 1] by EvalWindow::make, which names --ratios.
  check_range(o.seeds, 1, kMaxSeeds, "--seeds");
  spec.seeds = o.seeds;
  spec.base_seed = o.base_seed;
  if (!o.layers.empty())
    spec.layers = parse_bounded_index_list(o.layers, "--layers", info.num_layers, "layer");
  if (!o.heads.empty())
    spec.heads = parse_bounded_index_list(o.heads, "--heads", info.kv_heads, "kv head");
  // Whether s and E fit this capture is checked by EvalWindow::make (message "--sink/--eval").
  if (o.sink_option && o.sink_option->count() > 0)
    check_range(o.sink, 0, kMaxCaptureTokens, "--sink");
  if (o.eval_option && o.eval_option->count() > 0)
    check_range(o.eval, 1, kMaxCaptureTokens, "--eval");
  spec.sink = o.sink;
  spec.eval = o.eval;
  if (!spec.budgets.empty())
    spec.ratios = ratios_for_budgets(spec.budgets, info.num_tokens, spec.sink, spec.eval);
  check_range(o.threads, 0, 1024, "--threads");
  spec.threads = o.threads;
  spec.estimator = parse_estimator(o.estimator);
  return spec;
}

// How column `i` of a spec is named: "budget 128" under --budget, else "ratio 0.25".
std::string column_label(const EvalSpec& spec, size_t i) {
  char buf[64];
  if (i < spec.budgets.size())
    std::snprintf(buf, sizeof buf, "budget %d", spec.budgets[i]);
  else
    std::snprintf(buf, sizeof buf, "ratio %g", spec.ratios[i]);
  return buf;
}

// "method.name=value" -> spec.params[method][name].
void parse_param(const std::string& text, EvalSpec& spec) {
  const std::string flag = "--param " + text;
  const size_t dot = text.find('.'), eq = text.find('=');
  if (dot == std::string::npos || eq == std::string::npos || dot > eq)
    throw InputError(flag + ": expected method.name=value");
  const std::string method = text.substr(0, dot), name = text.substr(dot + 1, eq - dot - 1);
  const Method* m = find_method(method);
  if (!m) throw InputError(flag + ": unknown method '" + method + "'");
  const std::vector<ParamSpec> specs = m->params();
  double value = 0;
  auto it =
      std::find_if(specs.begin(), specs.end(), [&](const ParamSpec& p) { return p.name == name; });
  if (it == specs.end()) {
    validate_method_params(*m, {{name, 0.0}});  // throws the "unknown parameter" message
  } else {
    value = parse_param_value(*it, text.substr(eq + 1), flag);
  }
  spec.params[method][name] = value;
}

// Progress on stderr when it is a terminal.
ProgressFn progress_printer() {
  if (!isatty(2)) return {};
  return [](int done, int total) {
    std::fprintf(stderr, "\r%d/%d work items", done, total);
    if (done == total) std::fprintf(stderr, "\r%*s\r", 30, "");
  };
}

// eval's methods, parameters and shard into `spec`, for a capture described by `info` (a set's
// shape): `all` is the methods the capture can run, those it cannot are returned ("<name>
// (<why>)") for a note; a method asked for by name (in --methods or through --param) that it
// cannot run is a bad request: SettingError naming the method and what the capture lacks.
std::vector<std::string> choose_methods(const EvalOptions& o, const CaptureInfo& info,
                                        EvalSpec& spec) {
  spec.methods = parse_method_list(o.methods);
  spec.harm = true;  // harm kept vs dropped per head and method (engine/eval/token_harm.h)
  for (const std::string& p : o.params) parse_param(p, spec);
  if (o.methods != "all") require_runnable(spec.methods, info, spec.params, "methods", "--methods");
  for (const auto& [name, values] : spec.params)
    require_runnable({find_method(name)}, info, spec.params, name + ".*", "--param " + name + ".*");
  std::vector<std::string> left_out;
  spec.methods = runnable_methods(spec.methods, info, spec.params, left_out);
  if (!o.shard.empty()) {
    const auto [index, count] = parse_shard(o.shard, kMaxShards);
    spec.shard_index = index;
    spec.shard_count = count;
  }
  return left_out;
}

// The whole-capture rows of a complete set report: mean over prompts, its 95% interval, wins.
void print_set_summary(const SetEvalReport& rep) {
  std::printf(
      "\nacross %zu prompts: mean relative error over prompts [95%% Student-t interval], "
      "wins (prompts where the method is best), mean rank\n",
      rep.entries.size());
  for (const SetRow& r : rep.summary()) {
    if (r.layer != kAllLayers) continue;
    char interval[64];
    if (std::isnan(r.ci_low))
      std::snprintf(interval, sizeof interval, "[one prompt]");
    else
      std::snprintf(interval, sizeof interval, "[%.4f, %.4f]", r.ci_low, r.ci_high);
    std::printf("%-28s %-8s %.4f %-18s wins %d/%d  rank %.2f\n", r.method.c_str(), r.label.c_str(),
                r.mean, interval, r.wins, r.prompts, r.mean_rank);
  }
  const std::vector<PromptLoss> worst = rep.worst_prompts();
  if (!worst.empty()) std::printf("\nprompts where a method loses most to the best:\n");
  for (const PromptLoss& l : worst)
    std::printf("%-28s %-8s %s: +%.4f over %s\n", l.method.c_str(), l.label.c_str(),
                printable(rep.entries[l.capture].label).c_str(), l.loss, l.best.c_str());
}

// eval SET: every capture of a manifest or folder, and the aggregate across prompts.
void run_set_eval_command(const EvalOptions& o) {
  const std::vector<std::string> inputs{o.common.path};
  if (!o.common.json_out.empty()) check_output(o.common.json_out, inputs, "--json");
  if (!o.csv_out.empty()) check_output(o.csv_out, inputs, "--csv");
  if (!o.summary_csv_out.empty()) check_output(o.summary_csv_out, inputs, "--summary-csv");
  const CaptureSet set = open_capture_set(o.common.path);
  std::printf("set      %s: %zu captures of %s (%d layers, %d query / %d kv heads, d=%d)\n",
              printable(set.source).c_str(), set.entries.size(),
              set.shape.model.empty() ? "a model not recorded" : printable(set.shape.model).c_str(),
              set.shape.num_layers, set.shape.q_heads, set.shape.kv_heads, set.shape.head_dim);
  EvalSpec spec = base_spec(o.common, set.shape);
  // Budgets must fit every capture's middle (run_eval turns them into each capture's ratios).
  if (!spec.budgets.empty())
    for (const CaptureSetEntry& e : set.entries) {
      try {
        ratios_for_budgets(spec.budgets, e.num_tokens, spec.sink, spec.eval);
      } catch (const SettingError& err) {
        throw SettingError("budget", "--budget", e.path + ": " + err.detail());
      }
    }
  const std::vector<std::string> left_out = choose_methods(o, set.shape, spec);
  Backend& backend = select_backend(o.common.backend);
  std::printf("backend  %s\n", backend.name().c_str());
  const ProgressFn progress = isatty(2) ? ProgressFn([](int done, int total) {
    std::fprintf(stderr, "\r%.1f%% of the set", 100.0 * done / total);
    if (done == total) std::fprintf(stderr, "\r%*s\r", 30, "");
  })
                                        : ProgressFn();
  SetEvalReport rep = run_set_eval(set, spec, progress, nullptr, &backend);
  if (!left_out.empty())
    for (EvalReport& r : rep.captures)
      r.notes.insert(r.notes.begin(), methods_left_out_note(left_out));
  for (size_t c = 0; c < rep.captures.size(); ++c)
    std::printf("capture  %zu/%zu %s: %d tokens, %zu results\n", c + 1, rep.captures.size(),
                printable(rep.entries[c].path).c_str(), rep.entries[c].num_tokens,
                rep.captures[c].results.size());
  if (rep.shard_count > 1)
    std::printf(
        "shard    %d/%d: combine every shard's --json with `kvscope-cli merge` for the "
        "figures across prompts\n",
        rep.shard_index, rep.shard_count);
  else
    print_set_summary(rep);
  if (!o.common.json_out.empty())
    write_json_file(o.common.json_out, rep.to_json(), "--json", inputs);
  if (!o.csv_out.empty()) write_output(o.csv_out, rep.captures_csv(), "--csv", inputs);
  if (!o.summary_csv_out.empty()) {
    if (rep.shard_count > 1)
      throw InputError("--summary-csv: a shard has no figures across prompts; merge the shards");
    write_output(o.summary_csv_out, rep.summary_csv(), "--summary-csv", inputs);
  }
  for (const EvalReport& r : rep.captures) fail_on_method_errors(r);
}

void run_eval_command(const EvalOptions& o) {
  if (is_capture_set_path(o.common.path)) return run_set_eval_command(o);
  if (!o.summary_csv_out.empty())
    throw InputError("--summary-csv: only for a capture set (a manifest .jsonl or a folder)");
  // Output paths are checked before the work (never the capture itself, a link or a FIFO).
  if (!o.common.json_out.empty()) check_output(o.common.json_out, {o.common.path}, "--json");
  if (!o.csv_out.empty()) check_output(o.csv_out, {o.common.path}, "--csv");
  auto capture = CaptureFile::open(o.common.path);
  EvalSpec spec = base_spec(o.common, capture->info());
  const std::vector<std::string> left_out = choose_methods(o, capture->info(), spec);
  Backend& backend = select_backend(o.common.backend);
  std::printf("backend  %s\n", backend.name().c_str());
  EvalReport report = run_eval(*capture, spec, progress_printer(), nullptr, &backend);
  if (!left_out.empty()) report.notes.insert(report.notes.begin(), methods_left_out_note(left_out));
  print_report(report);
  if (!o.common.json_out.empty())
    write_json_file(o.common.json_out, report.to_json(), "--json", {o.common.path});
  if (!o.csv_out.empty()) write_csv_file(o.csv_out, report, "--csv", {o.common.path});
  fail_on_method_errors(report);
}

// "name=v1,v2,v3" or "method.name=v1,v2" -> (name, values).
std::pair<std::string, std::vector<double>> parse_grid(const std::string& text, const Method& m) {
  const std::string flag = "--param " + text;
  const size_t eq = text.find('=');
  if (eq == std::string::npos) throw InputError(flag + ": expected name=v1,v2,...");
  std::string name = text.substr(0, eq);
  if (name.rfind(m.name() + ".", 0) == 0) name = name.substr(m.name().size() + 1);
  const std::vector<ParamSpec> specs = m.params();
  auto it =
      std::find_if(specs.begin(), specs.end(), [&](const ParamSpec& p) { return p.name == name; });
  if (it == specs.end()) validate_method_params(m, {{name, 0.0}});  // unknown-name message
  std::vector<double> values;
  std::string rest = text.substr(eq + 1);
  size_t start = 0;
  for (;;) {
    const size_t comma = rest.find(',', start);
    values.push_back(parse_param_value(
        *it, rest.substr(start, comma == std::string::npos ? std::string::npos : comma - start),
        flag));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  for (double v : values) validate_method_params(m, {{name, v}});
  return {name, values};
}

// --grid2: two parameters at once, one table per ratio with the best (*) and default (d) cells.
void run_grid2_command(const SweepOptions& o, const Method& m) {
  if (o.grid2.size() != 2)
    throw InputError("--grid2: give exactly two name=v1,v2,... lists (rows, then columns)");
  Grid2Spec g;
  g.method = &m;
  const auto rows = parse_grid(o.grid2[0], m), cols = parse_grid(o.grid2[1], m);
  g.rows = {rows.first, rows.second};
  g.cols = {cols.first, cols.second};
  for (const std::string& p : o.params) {  // other parameters held fixed: name=value
    const auto fixed = parse_grid(p, m);
    if (fixed.second.size() != 1)
      throw InputError("--param " + p + ": with --grid2, --param holds one value fixed");
    g.fixed[fixed.first] = fixed.second[0];
  }
  auto capture = CaptureFile::open(o.common.path);
  const EvalSpec spec = base_spec(o.common, capture->info());
  // The method is asked for by name: a cell it cannot run on this capture is a bad request.
  for (double r : g.rows.values)
    for (double c : g.cols.values) {
      ParamValues cell = g.fixed;
      cell[g.rows.name] = r;
      cell[g.cols.name] = c;
      require_runnable({&m}, capture->info(), {{m.name(), cell}}, "method", "--method");
    }
  Backend& backend = select_backend(o.common.backend);
  const Grid2Result res = run_grid2(*capture, spec, g, {}, nullptr, &backend);
  std::printf("method   %s\nseeds    %d\nrows     %s\ncolumns  %s\n", m.name().c_str(), spec.seeds,
              g.rows.name.c_str(), g.cols.name.c_str());
  for (const std::string& note : res.notes) std::printf("note     %s\n", note.c_str());
  const auto def = res.default_cell();
  for (size_t r = 0; r < res.ratios.size(); ++r) {
    const auto best = res.best(r);
    std::printf("\n%s: mean relative error +- std over seeds (* best, d default)\n",
                column_label(spec, r).c_str());
    std::printf("%-14s", (g.rows.name + " \\ " + g.cols.name).c_str());
    for (double c : g.cols.values) std::printf("  %-21g", c);
    std::printf("\n");
    for (size_t i = 0; i < g.rows.values.size(); ++i) {
      std::printf("%-14g", g.rows.values[i]);
      for (size_t j = 0; j < g.cols.values.size(); ++j) {
        const std::pair<int, int> here{static_cast<int>(i), static_cast<int>(j)};
        char buf[64];
        if (std::isfinite(res.mean[r][i][j]))
          std::snprintf(buf, sizeof buf, "%.4f +- %.4f%s%s", res.mean[r][i][j],
                        res.seed_std[r][i][j], here == best ? " *" : "", here == def ? " d" : "");
        else
          std::snprintf(buf, sizeof buf, "failed/refused");
        std::printf("  %-21s", buf);
      }
      std::printf("\n");
    }
    if (best.first >= 0)
      std::printf("best: %s=%g %s=%g (%.4f)\n", g.rows.name.c_str(), g.rows.values[best.first],
                  g.cols.name.c_str(), g.cols.values[best.second],
                  res.mean[r][best.first][best.second]);
  }
  if (!o.common.json_out.empty()) write_json_file(o.common.json_out, res.to_json(), "--json");
  if (!o.csv_out.empty()) {
    std::FILE* f = std::fopen(o.csv_out.c_str(), "wb");
    if (!f) throw InputError("--csv " + o.csv_out + ": cannot open for writing");
    const std::string text = res.to_csv(o.per_head_csv);
    const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
    if (std::fclose(f) != 0 || !ok) throw InputError("--csv " + o.csv_out + ": write failed");
  }
  for (const std::string& f : res.failures) std::fprintf(stderr, "kvscope-cli: %s\n", f.c_str());
  if (!res.failures.empty())
    throw std::runtime_error(m.name() + " failed at some grid points (see the lines above)");
}

// The Cartesian product of a sweep's grid, last parameter fastest (at most 10000 points).
std::vector<ParamValues> grid_points(
    const std::vector<std::pair<std::string, std::vector<double>>>& grid) {
  size_t count = 1;
  for (const auto& [name, values] : grid) {
    count *= values.size();
    if (count > 10000)
      throw InputError(
          "--param: the grid has more than 10000 points (the product of the value "
          "counts); sweep fewer values");
  }
  std::vector<ParamValues> points(1);
  for (const auto& [name, values] : grid) {
    std::vector<ParamValues> next;
    for (const ParamValues& p : points)
      for (double v : values) {
        ParamValues q = p;
        q[name] = v;
        next.push_back(q);
      }
    points = std::move(next);
  }
  return points;
}

std::string point_label(const ParamValues& point) {
  std::string label;
  for (const auto& [name, v] : point) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%s=%g", name.c_str(), v);
    label += (label.empty() ? "" : " ") + std::string(buf);
  }
  return label;
}

std::string figure_text(const PromptFigure& f) {
  if (std::isnan(f.mean)) return "-";
  char buf[96];
  if (std::isnan(f.ci_low))
    std::snprintf(buf, sizeof buf, "%.4f (%d)", f.mean, f.prompts);
  else
    std::snprintf(buf, sizeof buf, "%.4f [%.4f, %.4f] (%d)", f.mean, f.ci_low, f.ci_high,
                  f.prompts);
  return buf;
}

// sweep SET: every point on every capture; with --holdout, the best point on the tuning prompts
// judged on the held-out ones beside the method's defaults.
void run_set_sweep_command(const SweepOptions& o, const Method& m,
                           const std::vector<std::pair<std::string, std::vector<double>>>& grid) {
  if (!o.common.json_out.empty()) check_output(o.common.json_out, {o.common.path}, "--json");
  const CaptureSet set = open_capture_set(o.common.path);
  const PromptSplit split =
      split_prompts(static_cast<int>(set.entries.size()), o.holdout, o.split_seed);
  EvalSpec spec = base_spec(o.common, set.shape);
  spec.methods = {&m};
  std::vector<ParamValues> points = grid_points(grid);
  for (const ParamValues& p : points)
    require_runnable({&m}, set.shape, {{m.name(), p}}, "method", "--method");
  // The defaults of the swept parameters, as a point of their own when the grid lacks it.
  ParamValues defaults;
  for (const auto& [name, values] : grid) defaults[name] = param_value(m.params(), {}, name);
  int default_point =
      static_cast<int>(std::find(points.begin(), points.end(), defaults) - points.begin());
  if (default_point == static_cast<int>(points.size())) points.push_back(defaults);
  spec.points = points;
  Backend& backend = select_backend(o.common.backend);
  std::printf("set      %s: %zu captures; method %s, %zu points (the defaults included)\n",
              printable(set.source).c_str(), set.entries.size(), m.name().c_str(), points.size());
  std::vector<std::vector<EvalReport>> reports;
  std::vector<std::string> failures;
  for (size_t c = 0; c < set.entries.size(); ++c) {
    std::fprintf(stderr, "capture %zu/%zu %s\n", c + 1, set.entries.size(),
                 printable(set.entries[c].path).c_str());
    auto capture = CaptureFile::open(set.entries[c].resolved);
    reports.push_back(
        run_eval(*capture, spec, progress_printer(), nullptr, &backend).split_points());
    for (const EvalReport& r : reports.back())
      for (const std::string& f : r.failures()) failures.push_back(set.entries[c].path + ": " + f);
  }
  const HoldoutReport holdout = holdout_tuning(reports, points, default_point, split, o.per_layer);
  const auto names = [&](const std::vector<int>& idx) {
    std::string s;
    for (int i : idx) s += (s.empty() ? "" : ", ") + set.entries[i].label;
    return s.empty() ? std::string("none") : s;
  };
  std::printf("tuning   %zu prompts: %s\n", split.tuning.size(), names(split.tuning).c_str());
  if (!split.held_out.empty())
    std::printf("held out %zu prompts (--holdout %g, --split-seed %llu): %s\n",
                split.held_out.size(), o.holdout, o.split_seed, names(split.held_out).c_str());
  std::printf(
      "\nmean relative error over the tuning prompts [95%% Student-t interval] (prompts)\n");
  for (size_t p = 0; p < points.size(); ++p) {
    std::printf("%-28s", (point_label(points[p]) +
                          (static_cast<int>(p) == default_point ? " (default)" : ""))
                             .c_str());
    for (const PromptFigure& f : holdout.tuning_by_point[p])
      std::printf("  %-34s", figure_text(f).c_str());
    std::printf("\n");
  }
  for (const HoldoutRow& r : holdout.rows) {
    if (r.best_point < 0) continue;
    const std::string where =
        r.layer == kAllLayers ? std::string("all layers") : "layer " + std::to_string(r.layer);
    std::printf("\n%s, %s: best on the tuning prompts %s: tuned on %s", r.label.c_str(),
                where.c_str(), point_label(points[r.best_point]).c_str(),
                figure_text(r.best_tuning).c_str());
    if (!split.held_out.empty())
      std::printf("\n    held out: tuned %s, default %s, gain %+.4f",
                  figure_text(r.best_held_out).c_str(), figure_text(r.default_held_out).c_str(),
                  r.held_out_gain());
  }
  std::printf("\n");
  if (!o.common.json_out.empty()) {
    nlohmann::json out = holdout.to_json();
    out["format"] = "kvscope-set-sweep/1";
    out["set"] = set.source;
    out["method"] = m.name();
    out["holdout"] = o.holdout;
    out["split_seed"] = o.split_seed;
    out["entries"] = nlohmann::json::array();
    for (const CaptureSetEntry& e : set.entries)
      out["entries"].push_back({{"path", e.path}, {"label", e.label}});
    out["failures"] = failures;
    write_json_file(o.common.json_out, out, "--json", {o.common.path});
  }
  for (const std::string& f : failures) std::fprintf(stderr, "kvscope-cli: %s\n", f.c_str());
  if (!failures.empty())
    throw std::runtime_error(m.name() + " failed at some grid points (see the lines above)");
}

void run_sweep_command(const SweepOptions& o) {
  const Method* m = find_method(o.method);
  if (!m) {
    parse_method_list(o.method);  // throws the "unknown method (known: ...)" message
    throw InputError("--method: no method given");
  }
  if (!o.grid2.empty()) return run_grid2_command(o, *m);
  if (!o.csv_out.empty())
    throw InputError("--csv: only with --grid2 (the 1-D sweep writes --json)");
  if (o.params.empty()) throw InputError("--param: give at least one name=v1,v2,... to sweep");
  std::vector<std::pair<std::string, std::vector<double>>> grid;
  for (const std::string& p : o.params) grid.push_back(parse_grid(p, *m));

  if (is_capture_set_path(o.common.path)) return run_set_sweep_command(o, *m, grid);
  if (o.holdout != 0 || o.per_layer)
    throw InputError(
        "--holdout/--per-layer: only for a capture set (a manifest .jsonl or a folder)");
  if (!o.common.json_out.empty()) check_output(o.common.json_out, {o.common.path}, "--json");
  auto capture = CaptureFile::open(o.common.path);
  EvalSpec spec = base_spec(o.common, capture->info());
  spec.methods = {m};
  Backend& backend = select_backend(o.common.backend);

  const std::vector<ParamValues> points = grid_points(grid);
  // The method is asked for by name: a point it cannot run on this capture is a bad request.
  for (const ParamValues& p : points)
    require_runnable({m}, capture->info(), {{m->name(), p}}, "method", "--method");

  nlohmann::json out;
  out["format"] = "kvscope-sweep/1";
  out["method"] = m->name();
  out["points"] = nlohmann::json::array();
  bool header = false;
  std::vector<double> best(spec.ratios.size(), 1e300);
  std::vector<std::string> best_at(spec.ratios.size());
  std::vector<std::string> failures;
  // One run for all points (EvalSpec::points): each layer is loaded and each head's exact
  // reference built once for the whole sweep.
  spec.points = points;
  const std::vector<EvalReport> reports =
      run_eval(*capture, spec, progress_printer(), nullptr, &backend).split_points();
  for (size_t pt = 0; pt < points.size(); ++pt) {
    const ParamValues& point = points[pt];
    const EvalReport& rep = reports[pt];
    if (!header) {
      std::printf("method   %s\nwindow   %s\nseeds    %d\n\n", m->name().c_str(),
                  rep.window_example.describe().c_str(), spec.seeds);
      for (const std::string& note : rep.notes) std::printf("note     %s\n", note.c_str());
      std::printf("%-28s", "parameters");
      for (size_t r = 0; r < spec.ratios.size(); ++r)
        std::printf("  %-19s", column_label(spec, r).c_str());
      std::printf("\n");
      out["capture"] = rep.to_json()["capture"];
      out["window"] = rep.to_json()["window"];
      out["spec"] = rep.to_json()["spec"];
      header = true;
    }
    const std::string label = point_label(point);
    nlohmann::json pj = nlohmann::json::object();
    for (const auto& [name, v] : point) pj[name] = v;
    std::printf("%-28s", label.c_str());
    const std::vector<EvalSummary> sum = rep.summary();
    nlohmann::json sj = nlohmann::json::array();
    for (size_t r = 0; r < sum.size(); ++r) {
      char buf[64];
      if (sum[r].heads > 0) {
        std::snprintf(buf, sizeof buf, "%.4f +- %.4f", sum[r].mean, sum[r].std);
        if (sum[r].mean < best[r]) best[r] = sum[r].mean, best_at[r] = label;
      } else {
        std::snprintf(buf, sizeof buf, "%s", "failed/refused");
      }
      std::printf("  %-19s", buf);
      sj.push_back({{"ratio", sum[r].ratio},
                    {"mean", sum[r].mean},
                    {"std", sum[r].std},
                    {"heads", sum[r].heads}});
    }
    std::printf("\n");
    std::fflush(stdout);
    for (const std::string& f : rep.failures()) failures.push_back(label + ": " + f);
    out["points"].push_back({{"params", pj}, {"summary", sj}, {"failures", rep.failures()}});
  }
  std::printf("\n");
  for (size_t r = 0; r < spec.ratios.size(); ++r)
    if (!best_at[r].empty())
      std::printf("best at %s: %s (%.4f)\n", column_label(spec, r).c_str(), best_at[r].c_str(),
                  best[r]);
  if (!o.common.json_out.empty())
    write_json_file(o.common.json_out, out, "--json", {o.common.path});
  for (const std::string& f : failures) std::fprintf(stderr, "kvscope-cli: %s\n", f.c_str());
  if (!failures.empty())
    throw std::runtime_error(m->name() + " failed at some grid points (see the lines above)");
}

}  // namespace

void add_eval_command(CLI::App& app) {
  auto eo = std::make_shared<EvalOptions>();
  auto* ev = app.add_subcommand(
      "eval", "attention-approximation error of compression methods (docs/evaluation.md)");
  add_common(ev, eo->common);
  ev->get_option("file")->description(
      "capture (.safetensors or .npz), or a capture set: a manifest .jsonl or a folder of "
      "*.safetensors (docs/evaluation.md, \"Capture sets\")");
  ev->add_option("--methods", eo->methods, "comma-separated methods, or all")
      ->capture_default_str();
  ev->add_option("--param", eo->params, "method.name=value (repeatable)");
  ev->add_option("--shard", eo->shard,
                 "i/N: run work items i, i+N, ... (merge with `merge`); auto: the index and count "
                 "of a Slurm array task or Kubernetes indexed job");
  ev->add_option("--csv", eo->csv_out,
                 "write one row per (method, ratio, layer, kv head); for a set, per capture too "
                 "(column `capture` first)");
  ev->add_option("--summary-csv", eo->summary_csv_out,
                 "sets: write the rows across prompts (method, ratio, layer, kv_head, mean, "
                 "ci_low, ci_high, prompts, wins)");
  ev->callback([eo] { run_eval_command(*eo); });

  auto so = std::make_shared<SweepOptions>();
  auto* sw = app.add_subcommand("sweep", "error of one method over a grid of its parameters");
  add_common(sw, so->common);
  sw->add_option("--method", so->method, "the method to tune")->required();
  sw->add_option("--param", so->params,
                 "name=v1,v2,... (repeatable: the grid is their product); with --grid2: "
                 "name=value held fixed");
  sw->add_option("--grid2", so->grid2,
                 "two parameters at once: ROWS=v1,v2,... COLS=v1,v2,... (e.g. gamma=0,1,2,4 "
                 "temp=0.1,0.3,1): one table per ratio, best (*) and default (d) marked")
      ->expected(2);
  sw->add_option("--csv", so->csv_out,
                 "--grid2: one row per (ratio, row value, column value) with mean, seed_std");
  sw->add_flag("--per-head", so->per_head_csv,
               "--grid2 --csv: one row per (ratio, cell, layer, kv head) instead");
  sw->add_option("--holdout", so->holdout,
                 "sets: the share of prompts held out (e.g. 0.3): the best point is chosen on the "
                 "others and reported on these beside the defaults")
      ->check(CLI::Range(0.0, 0.99));
  sw->add_option("--split-seed", so->split_seed, "sets: the seed of the tuning / held-out split")
      ->check(seed_validator());
  sw->add_flag("--per-layer", so->per_layer,
               "sets: also choose the best point per layer, with its held-out gain per layer");
  sw->callback([so] { run_sweep_command(*so); });
}

}  // namespace kvscope::cli
