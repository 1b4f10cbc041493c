// kvscope-cli theory: the papers' scaling claims on a capture's heads (docs/theory.md):
// discrepancy vs n of the self-balancing walk against random signs, error vs budget with the
// fitted exponent alpha (error ~ m^-alpha) and its interval, under both normalisations.
// Printed as tables; written as JSON, CSV and a vector figure (SVG).
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/eval_output.h"
#include "cli/output_file.h"
#include "cli/validate.h"
#include "engine/core/error.h"
#include "engine/eval/protocol.h"
#include "engine/io/capture.h"
#include "engine/teaching/theory.h"

namespace kvscope::cli {
namespace {

struct TheoryOptions {
  std::string file, json_out, csv_out, svg_out;
  std::string layers, heads;
  std::string methods = "balancekv,uniform,subgen";
  std::string ratios = "1/2,1/4,1/8,1/16,1/32";
  std::vector<std::string> params;
  int seeds = 5, disc_seeds = 8, max_n = 512, queries = 32, sink = -1, eval = -1;
  unsigned long long seed = 0;
  std::string sizes = "prefixes", estimator = "weighted";
  double unsat_temp = 0.02, unsat_gamma = 0.1;
  bool no_discrepancy = false, no_error = false;
};

std::string fmt(const char* f, double a) {
  char b[64];
  std::snprintf(b, sizeof b, f, a);
  return b;
}

std::string fit_text(const PowerFit& f, bool negate) {
  if (!f.ok) return "(no fit)";
  const double s = negate ? -f.slope : f.slope;
  const double lo = negate ? -f.ci_high : f.ci_low, hi = negate ? -f.ci_low : f.ci_high;
  return fmt("%.3f", s) + " [" + fmt("%.3f", lo) + ", " + fmt("%.3f", hi) + "]";
}

// ---- SVG: log-log panels drawn by hand (no UI needed).
struct Series {
  std::string label, colour;
  bool dashed = false;
  std::vector<double> x, y, lo, hi;
};

std::string svg_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '<')
      o += "&lt;";
    else if (c == '>')
      o += "&gt;";
    else if (c == '&')
      o += "&amp;";
    else
      o += c;
  }
  return o;
}

void svg_panel(std::ostringstream& os, double ox, double oy, double w, double h,
               const std::string& title, const std::string& xlabel,
               const std::vector<Series>& series) {
  double x0 = 1e300, x1 = -1e300, y0 = 1e300, y1 = -1e300;
  for (const Series& s : series)
    for (size_t i = 0; i < s.x.size(); ++i) {
      for (double v : {s.y[i], s.lo.empty() ? s.y[i] : s.lo[i], s.hi.empty() ? s.y[i] : s.hi[i]})
        if (v > 0 && std::isfinite(v)) y0 = std::min(y0, v), y1 = std::max(y1, v);
      if (s.x[i] > 0) x0 = std::min(x0, s.x[i]), x1 = std::max(x1, s.x[i]);
    }
  os << "<g font-family=\"sans-serif\" font-size=\"11\">\n";
  os << "<rect x=\"" << ox << "\" y=\"" << oy << "\" width=\"" << w << "\" height=\"" << h
     << "\" fill=\"none\" stroke=\"#888\"/>\n";
  os << "<text x=\"" << ox << "\" y=\"" << oy - 6 << "\" font-size=\"13\">" << svg_escape(title)
     << "</text>\n";
  os << "<text x=\"" << ox + w / 2 << "\" y=\"" << oy + h + 30 << "\" text-anchor=\"middle\">"
     << svg_escape(xlabel) << " (log)</text>\n";
  if (!(x1 > x0) || !(y1 >= y0)) {
    os << "</g>\n";
    return;
  }
  if (y1 <= y0 * 1.0001) y1 = y0 * 2, y0 /= 2;
  const double lx0 = std::log10(x0), lx1 = std::log10(x1);
  const double ly0 = std::log10(y0) - 0.05, ly1 = std::log10(y1) + 0.05;
  auto px = [&](double x) { return ox + (std::log10(x) - lx0) / (lx1 - lx0) * w; };
  auto py = [&](double y) { return oy + h - (std::log10(y) - ly0) / (ly1 - ly0) * h; };
  for (int e = static_cast<int>(std::floor(ly0)); e <= static_cast<int>(std::ceil(ly1)); ++e)
    if (e >= ly0 && e <= ly1)
      os << "<text x=\"" << ox - 4 << "\" y=\"" << py(std::pow(10, e)) + 4
         << "\" text-anchor=\"end\">1e" << e << "</text>\n";
  for (double x : series.empty() ? std::vector<double>{} : series[0].x)
    os << "<text x=\"" << px(x) << "\" y=\"" << oy + h + 14 << "\" text-anchor=\"middle\">" << x
       << "</text>\n";
  int row = 0;
  for (const Series& s : series) {
    std::ostringstream path, band;
    bool first = true;
    for (size_t i = 0; i < s.x.size(); ++i) {
      if (!(s.y[i] > 0)) continue;
      path << (first ? "M" : "L") << px(s.x[i]) << "," << py(s.y[i]) << " ";
      first = false;
    }
    if (!s.lo.empty()) {
      bool f2 = true;
      for (size_t i = 0; i < s.x.size(); ++i)
        if (s.hi[i] > 0)
          band << (f2 ? "M" : "L") << px(s.x[i]) << "," << py(s.hi[i]) << " ", f2 = false;
      for (size_t i = s.x.size(); i-- > 0;)
        if (s.lo[i] > 0) band << "L" << px(s.x[i]) << "," << py(s.lo[i]) << " ";
      if (!f2)
        os << "<path d=\"" << band.str() << "Z\" fill=\"" << s.colour
           << "\" fill-opacity=\"0.15\" stroke=\"none\"/>\n";
    }
    os << "<path d=\"" << path.str() << "\" fill=\"none\" stroke=\"" << s.colour
       << "\" stroke-width=\"1.6\"" << (s.dashed ? " stroke-dasharray=\"5,3\"" : "") << "/>\n";
    os << "<text x=\"" << ox + 6 << "\" y=\"" << oy + 14 + 13 * row++ << "\" fill=\"" << s.colour
       << "\">" << svg_escape(s.label) << "</text>\n";
  }
  os << "</g>\n";
}

std::string theory_svg(const TheoryResult& r) {
  static const char* colours[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd",
                                  "#ff7f0e", "#8c564b", "#e377c2", "#17becf"};
  std::ostringstream os;
  const double W = 1200, H = 900;
  os << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << H
     << "\" viewBox=\"0 0 " << W << " " << H << "\">\n<rect width=\"100%\" height=\"100%\" "
     << "fill=\"white\"/>\n";
  os << "<text x=\"20\" y=\"24\" font-family=\"sans-serif\" font-size=\"15\">"
     << svg_escape("Theory: " + r.capture_path + ", " + r.scope +
                   (r.info.synthetic ? " [SYNTHETIC]" : ""))
     << "</text>\n";
  int panel = 0;
  for (const char* measure : {"query", "kernel"}) {
    std::vector<Series> ss;
    int c = 0;
    for (const DiscRun& d : r.discrepancy)
      for (const char* inst : {"denominator", "numerator"}) {
        for (const char* signs : {"walk", "random"}) {
          const ScalingCurve* cu = d.find(inst, measure, signs);
          if (!cu) continue;
          Series s;
          s.label =
              d.walk.label + ", " + inst + ", " + signs + ": slope " + fit_text(cu->fit, false) +
              (std::string(signs) == "walk"
                   ? " (saturated " +
                         fmt("%.0f%%",
                             100 * (std::string(inst) == "numerator" ? d.saturation_numerator
                                                                     : d.saturation_denominator)) +
                         ")"
                   : "");
          s.colour = colours[c % 8];
          s.dashed = std::string(signs) == "random";
          s.x = cu->x;
          s.y = cu->mean;
          s.lo = cu->lo;
          s.hi = cu->hi;
          ss.push_back(s);
        }
        ++c;
      }
    svg_panel(
        os, 70 + panel * 580, 60, 520, 330,
        std::string("discrepancy ") +
            (std::string(measure) == "query" ? "along the evaluation queries" : "in kernel norm") +
            " (" + disc_sizes_name(r.spec.sizes) + ")",
        "n", ss);
    ++panel;
  }
  panel = 0;
  for (const char* measure : {"relative", "operator"}) {
    std::vector<Series> ss;
    int c = 0;
    for (const ErrorScaling& e : r.errors) {
      const ScalingCurve* cu = e.find(measure);
      if (!cu) continue;
      Series s;
      s.label = e.label + ": alpha " + fit_text(cu->fit, true);
      s.colour = colours[c++ % 8];
      s.x = cu->x;
      s.y = cu->mean;
      s.lo = cu->lo;
      s.hi = cu->hi;
      ss.push_back(s);
      if (c == 1 && !cu->x.empty() && cu->mean[0] > 0)
        for (double a : {0.5, 1.0}) {
          Series ref;
          ref.label = a == 0.5 ? "reference m^-1/2" : "reference m^-1";
          ref.colour = "#777777";
          ref.dashed = true;
          for (size_t i = 0; i < cu->x.size(); ++i) {
            ref.x.push_back(cu->x[i]);
            ref.y.push_back(cu->mean[0] * std::pow(cu->x[i] / cu->x[0], -a));
          }
          ss.push_back(ref);
        }
    }
    svg_panel(os, 70 + panel * 580, 500, 520, 330,
              std::string("error vs budget: ") +
                  (std::string(measure) == "relative"
                       ? "relative ||z - Attn|| / ||Attn||"
                       : "normalised by ||softmax|| ||V||_op (SubGen Eq. 3)"),
              "budget m", ss);
    ++panel;
  }
  os << "</svg>\n";
  return os.str();
}

void run_theory_command(const TheoryOptions& o) {
  for (const auto& [path, flag] :
       {std::pair{o.json_out, "--json"}, {o.csv_out, "--csv"}, {o.svg_out, "--svg"}})
    if (!path.empty()) check_output(path, {o.file}, flag);
  check_range(o.seeds, 1, 1000, "--seeds");
  check_range(o.disc_seeds, 1, 1000, "--disc-seeds");
  check_range(o.max_n, 4, 4096, "--max-n");
  check_range(o.queries, 1, 4096, "--queries");
  check_range_real(o.unsat_temp, 0, 10, "--unsat-temp");
  check_range_real(o.unsat_gamma, 0, 100, "--unsat-gamma");
  auto capture = CaptureFile::open(o.file);
  const CaptureInfo& info = capture->info();
  TheorySpec spec;
  if (!o.layers.empty())
    spec.layers = parse_bounded_index_list(o.layers, "--layers", info.num_layers, "layer");
  if (!o.heads.empty())
    spec.heads = parse_bounded_index_list(o.heads, "--heads", info.kv_heads, "kv head");
  spec.want_discrepancy = !o.no_discrepancy;
  spec.want_error = !o.no_error;
  if (o.sizes == "prefixes")
    spec.sizes = DiscSizes::Prefixes;
  else if (o.sizes == "blocks")
    spec.sizes = DiscSizes::WholeBlocks;
  else
    throw InputError("--sizes " + o.sizes + ": expected prefixes or blocks");
  spec.max_n = o.max_n;
  spec.disc_seeds = o.disc_seeds;
  spec.max_queries = o.queries;
  spec.walks = disc_walks(o.unsat_temp, o.unsat_gamma);
  spec.seeds = o.seeds;
  spec.base_seed = o.seed;
  spec.sink = o.sink;
  spec.eval = o.eval;
  spec.estimator = parse_estimator(o.estimator);
  spec.ratios = parse_number_list(o.ratios, "--ratios");
  if (spec.ratios.size() > 64) throw InputError("--ratios: at most 64 keep ratios");
  for (const Method* m : parse_method_list(o.methods)) spec.methods.push_back({m->name(), {}});
  for (const std::string& p : o.params) {
    const std::string flag = "--param " + p;
    const size_t dot = p.find('.'), eq = p.find('=');
    if (dot == std::string::npos || eq == std::string::npos || dot > eq)
      throw InputError(flag + ": expected method.name=value");
    const std::string method = p.substr(0, dot), name = p.substr(dot + 1, eq - dot - 1);
    auto it = std::find_if(spec.methods.begin(), spec.methods.end(),
                           [&](const TheoryMethod& t) { return t.name == method; });
    if (it == spec.methods.end())
      throw InputError(flag + ": method '" + method + "' is not among --methods");
    const Method* m = find_method(method);
    const std::vector<ParamSpec> specs = m->params();
    auto ps = std::find_if(specs.begin(), specs.end(),
                           [&](const ParamSpec& s) { return s.name == name; });
    if (ps == specs.end()) validate_method_params(*m, {{name, 0.0}});
    it->params[name] = parse_param_value(*ps, p.substr(eq + 1), flag);
  }
  // As in eval: `all` is the methods this capture can run, those left out named in a note; a
  // method asked for by name that the capture cannot run is a bad request (exit 1).
  std::vector<std::string> left_out;
  {
    std::vector<const Method*> chosen;
    std::map<std::string, ParamValues> params;
    for (const TheoryMethod& t : spec.methods) {
      chosen.push_back(find_method(t.name));
      params[t.name] = t.params;
    }
    if (o.methods != "all") require_runnable(chosen, info, params, "methods", "--methods");
    chosen = runnable_methods(chosen, info, params, left_out);
    std::erase_if(spec.methods, [&](const TheoryMethod& t) {
      return std::find(chosen.begin(), chosen.end(), find_method(t.name)) == chosen.end();
    });
  }
  TheoryProgress progress;
  if (isatty(2))
    progress = [](int done, int total) {
      std::fprintf(stderr, "\r%d/%d work items", done, total);
      if (done == total) std::fprintf(stderr, "\r%*s\r", 30, "");
    };
  TheoryResult r = run_theory(*capture, spec, progress);
  if (!left_out.empty()) r.notes.insert(r.notes.begin(), methods_left_out_note(left_out));

  std::printf("theory: %s (%s)%s, %s\n", printable(o.file).c_str(), printable(info.model).c_str(),
              info.synthetic ? " [SYNTHETIC]" : "", r.scope.c_str());
  std::printf("window: %s\n", r.window.c_str());
  for (const std::string& n : r.notes) std::printf("note: %s\n", printable(n).c_str());
  if (!r.discrepancy.empty()) {
    std::printf(
        "\ndiscrepancy vs n (%s, n = %d..%d, %d seeds; slope of log disc on log n, 95%% CI; "
        "random signs ~ n^0.5, the walk's theorem ~ log n)\n",
        disc_sizes_name(spec.sizes), r.sizes.front(), r.sizes.back(), spec.disc_seeds);
    std::printf("%-44s %-12s %-7s %-26s %-26s %s\n", "walk", "instance", "measure", "walk slope",
                "random slope", "saturated");
    for (const DiscRun& d : r.discrepancy) {
      const std::string label = d.walk.label + " (gamma " + fmt("%g", d.walk.params.gamma) +
                                ", temp " + fmt("%g", d.walk.params.temp) + ")";
      for (const char* inst : {"denominator", "numerator"})
        for (const char* meas : {"query", "kernel"}) {
          const ScalingCurve* w = d.find(inst, meas, "walk");
          const ScalingCurve* rs = d.find(inst, meas, "random");
          if (!w || !rs) continue;
          std::printf("%-44s %-12s %-7s %-26s %-26s %.1f%%\n", label.c_str(), inst, meas,
                      fit_text(w->fit, false).c_str(), fit_text(rs->fit, false).c_str(),
                      100 * (std::string(inst) == "numerator" ? d.saturation_numerator
                                                              : d.saturation_denominator));
        }
    }
  }
  if (!r.errors.empty()) {
    std::printf(
        "\nerror vs budget (%d seeds; alpha in error ~ m^-alpha, 95%% CI; uniform sampling's "
        "rate 1/2, BalanceKV's 1)\n",
        spec.seeds);
    std::printf("%-28s %-28s %-28s %-28s\n", "method", "alpha relative", "alpha Eq. 2 (Frobenius)",
                "alpha Eq. 3 (operator)");
    for (const ErrorScaling& e : r.errors) {
      std::printf("%-28s %-28s %-28s %-28s\n", e.label.c_str(),
                  fit_text(e.find("relative")->fit, true).c_str(),
                  fit_text(e.find("frobenius")->fit, true).c_str(),
                  fit_text(e.find("operator")->fit, true).c_str());
      if (!e.note.empty()) std::printf("  note: %s\n", printable(e.note).c_str());
    }
    std::printf("%-10s %-8s", "budget m", "");
    for (const ErrorScaling& e : r.errors) std::printf(" %-22s", e.method.c_str());
    std::printf("\n");
    for (size_t p = 0; p < spec.ratios.size(); ++p) {
      std::printf("%-10d %-8s", r.errors.empty() ? 0 : r.errors[0].budgets[p],
                  fmt("%g", spec.ratios[p]).c_str());
      for (const ErrorScaling& e : r.errors)
        std::printf(" %-22s", (fmt("%.4f", e.find("relative")->mean[p]) + " / " +
                               fmt("%.4f", e.find("operator")->mean[p]))
                                  .c_str());
      std::printf("\n");
    }
    std::printf("(each cell: mean relative error / mean error normalised as SubGen's Eq. 3)\n");
    std::printf(
        "bound: not drawn; the theorems give the budget only up to unstated constants (O*, O, "
        "Omega), see docs/theory.md\n");
  }
  if (!o.json_out.empty()) write_json_file(o.json_out, r.to_json(), "--json", {o.file});
  if (!o.csv_out.empty()) write_output(o.csv_out, r.to_csv(), "--csv", {o.file});
  if (!o.svg_out.empty()) write_output(o.svg_out, theory_svg(r), "--svg", {o.file});
}

}  // namespace

void add_theory_command(CLI::App& app) {
  auto* sub = app.add_subcommand(
      "theory",
      "discrepancy vs n (walk against random signs) and error vs budget with fitted exponents, "
      "under both normalisations (docs/theory.md)");
  auto o = std::make_shared<TheoryOptions>();
  sub->add_option("file", o->file, "capture file (.safetensors or .npz)")->required();
  sub->add_option("--layers", o->layers, "layers, e.g. 0,2-3 (default: all)");
  sub->add_option("--heads", o->heads, "kv heads (default: all)");
  sub->add_option("--methods", o->methods, "methods of the error-vs-budget figure")
      ->capture_default_str();
  sub->add_option("--param", o->params, "method parameter, method.name=value (repeatable)");
  sub->add_option("--ratios", o->ratios, "keep ratios of the error figure")->capture_default_str();
  sub->add_option("--seeds", o->seeds, "seeds of the error figure")->capture_default_str();
  sub->add_option("--seed", o->seed, "first seed")->capture_default_str();
  sub->add_option("--sink", o->sink, "sink tokens s (default: protocol)");
  sub->add_option("--eval", o->eval, "evaluation window E (default: protocol)");
  sub->add_option("--estimator", o->estimator, "weighted or authors")->capture_default_str();
  sub->add_option("--disc-seeds", o->disc_seeds, "seeds of the discrepancy figure")
      ->capture_default_str();
  sub->add_option("--max-n", o->max_n, "largest n of the discrepancy figure (a power of two)")
      ->capture_default_str();
  sub->add_option("--sizes", o->sizes,
                  "prefixes: one walk over the middle measured at n = 2^k; blocks: the first 2^k "
                  "middle tokens walked as one block each")
      ->capture_default_str();
  sub->add_option("--queries", o->queries, "evaluation queries the query measure averages over")
      ->capture_default_str();
  sub->add_option("--unsat-temp", o->unsat_temp, "temp of the second (unsaturated) walk")
      ->capture_default_str();
  sub->add_option("--unsat-gamma", o->unsat_gamma, "gamma of the second (unsaturated) walk")
      ->capture_default_str();
  sub->add_flag("--no-discrepancy", o->no_discrepancy, "skip the discrepancy figure");
  sub->add_flag("--no-error", o->no_error, "skip the error-vs-budget figure");
  sub->add_option("--json", o->json_out, "write the figures' numbers as JSON ('-': stdout)");
  sub->add_option("--csv", o->csv_out, "write one row per curve point as CSV");
  sub->add_option("--svg", o->svg_out, "write the four log-log panels as SVG");
  sub->callback([o] { run_theory_command(*o); });
}

}  // namespace kvscope::cli
