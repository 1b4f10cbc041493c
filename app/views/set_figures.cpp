// A capture set's figures as the views draw them (app/views/set_figures.h).
#include "app/views/set_figures.h"

#include <imgui.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

#include "app/plot.h"
#include "app/ui_layout.h"
#include "app/views/view_jobs.h"
#include "engine/eval/capture_set.h"

namespace kvscope::app {
namespace {

// Everything the set's evaluation reads: the set (by its path, opened by kSetOpen), methods A and
// B with their parameters, the ratios, seeds, window, estimator and backend.
struct SetEvalInput {
  std::string path;
  std::vector<MethodRunInput> methods;
  std::vector<double> ratios;
  int seeds = 1;
  uint64_t base_seed = 0;
  int sink = -1, eval = -1;
  std::string estimator, backend;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(SetEvalInput, path, methods, ratios, seeds, base_seed, sink,
                                   eval, estimator, backend)

struct SetHandles {
  std::shared_ptr<const CaptureSet> set;
  Backend* backend = nullptr;
};

std::shared_ptr<const SetEvalReport> eval_set_job(const SetEvalInput& in, const SetHandles& h,
                                                  JobContext& ctx, const JobPlan::PartialFn&) {
  EvalSpec spec;
  for (const MethodRunInput& m : in.methods) {
    const MethodSettings ms = method_settings_of(m);
    spec.methods.push_back(ms.method);
    spec.params[m.method] = m.params;
  }
  spec.ratios = in.ratios;
  spec.seeds = in.seeds;
  spec.base_seed = in.base_seed;
  spec.sink = in.sink;
  spec.eval = in.eval;
  spec.estimator = parse_estimator(in.estimator);
  return std::make_shared<SetEvalReport>(run_set_eval(
      *h.set, spec, [&ctx](int done, int total) { ctx.progress(done, total); }, ctx.cancel_flag(),
      h.backend));
}

int column_of(const SetEvalReport& r, double ratio) {
  const std::vector<double>& ratios = r.captures.at(0).spec.ratios;
  for (size_t i = 0; i < ratios.size(); ++i)
    if (ratios[i] == ratio) return static_cast<int>(i);
  return -1;
}

}  // namespace

void plan_set_eval(const AppState& s, std::vector<NamedPlan>& out) {
  if (s.set_path.empty()) return;
  JobPlan ev;
  const Result& opened = s.result(kSetOpen);
  const auto set = opened.fresh() ? opened.ptr<CaptureSet>() : nullptr;
  SetEvalInput in;
  in.path = s.set_path;
  // Each method with its own parameters only: the ratio and window are the set's (below), not
  // those fitted to the capture open, which a click on a prompt changes.
  for (int k = 0; k < (s.settings.ab_enabled ? 2 : 1); ++k)
    if (s.method(k))
      in.methods.push_back(
          {s.method_name(k), s.settings.method[static_cast<size_t>(k)].params, 0.0, -1, -1});
  if (in.methods.size() == 2 && in.methods[0].method == in.methods[1].method)
    in.methods.pop_back();
  in.ratios = s.settings.sweep.ratios;
  if (std::find(in.ratios.begin(), in.ratios.end(), s.settings.keep_ratio) == in.ratios.end())
    in.ratios.push_back(s.settings.keep_ratio);
  std::sort(in.ratios.rbegin(), in.ratios.rend());
  // The grid's seeds, by the set's longest capture (not the one open, which a click changes).
  int longest = 0;
  if (set)
    for (const CaptureSetEntry& e : set->entries) longest = std::max(longest, e.num_tokens);
  in.seeds = s.grid_seeds_for(longest);
  in.base_seed = static_cast<uint64_t>(s.settings.seed);
  in.sink = s.settings.sink_override;
  in.eval = s.settings.eval_override;
  in.estimator = estimator_name(s.settings.estimator);
  in.backend = s.backend_active;
  if (!set) {
    ev.key = JobPlan::derived_key("set.eval", in);
    ev.waiting = "opening the set";
    out.emplace_back(kSetEval, std::move(ev));
    return;
  }
  // A run of every head of every capture per method, ratio and seed, each at its method's
  // measured evaluation cost (as the grid's cells): head_units of each capture's window.
  double heads_units = 0;
  for (const CaptureSetEntry& e : set->entries) {
    CaptureInfo ci = set->shape;
    ci.num_tokens = e.num_tokens;
    const EvalWindow w = EvalWindow::fit(e.num_tokens, 0.5, in.sink, in.eval).window;
    heads_units += head_units(ci, w) * ci.num_layers * ci.kv_heads;
  }
  double seconds = 0;
  for (const MethodRunInput& m : in.methods)
    seconds += heads_units * static_cast<double>(in.ratios.size()) * in.seeds *
               s.costs.per_unit("eval:" + m.method);
  ev.derive("set.eval", std::move(in), SetHandles{set, s.backend()}, &eval_set_job);
  ev.lane = Lane::Analysis;
  ev.label = "set";
  ev.cost_class = "";
  ev.units = seconds / kPriorPerUnit;
  out.emplace_back(kSetEval, std::move(ev));
}

bool set_eval_settled(const AppState& s) {
  const Result& open = s.result(kSetOpen);
  if (!open.error.empty() && open.key == open.want) return true;
  const Result& r = s.result(kSetEval);
  return !r.want.empty() && (r.fresh() || (!r.held.empty() && r.held == r.want) ||
                             (!r.error.empty() && r.key == r.want));
}

ImU32 set_slot_colour(const AppState& s, const std::string& method) {
  return method == s.method_name(0) ? kColSlot[0] : kColSlot[1];
}

void SetFigures::update(const AppState& s) {
  const std::shared_ptr<const SetEvalReport> held = s.result(kSetEval).ptr<SetEvalReport>();
  if (!held || held->captures.empty()) {
    *this = {};
    return;
  }
  const SetEvalReport& rep = *held;
  const int col = column_of(rep, s.settings.keep_ratio);
  if (report == held && column == col) return;
  *this = {};
  report = held;
  column = col;
  rows = rep.summary();
  const EvalSpec& spec = rep.captures[0].spec;
  layers = rep.captures[0].info.num_layers;
  heads = rep.captures[0].info.kv_heads;
  const size_t cells = static_cast<size_t>(layers) * heads;
  cell.assign(cells, nullptr);
  lo.assign(cells, NAN);
  hi.assign(cells, NAN);
  if (column < 0 || spec.methods.empty()) return;
  const std::string a = spec.methods[0]->name();
  const std::string b = spec.methods.size() > 1 ? spec.methods[1]->name() : "";
  for (const SetRow& r : rows)
    if (r.method == a && r.column == column && r.layer != kAllLayers &&
        r.layer < layers && r.kv_head < heads)
      cell[static_cast<size_t>(r.layer * heads + r.kv_head)] = &r;
  for (size_t c = 0; c < rep.captures.size(); ++c) {
    const EvalReport& cap = rep.captures[c];
    const double ratio = cap.spec.ratios[column];
    for (const HeadEval& he : cap.results) {
      if (he.method != a || he.ratio != ratio || he.refused || !he.error.empty()) continue;
      const size_t i = static_cast<size_t>(he.layer * heads + he.kv_head);
      if (i >= cells) continue;
      lo[i] = std::isnan(lo[i]) ? he.mean : std::min(lo[i], he.mean);
      hi[i] = std::isnan(hi[i]) ? he.mean : std::max(hi[i], he.mean);
    }
    PromptRow p;
    p.entry = static_cast<int>(c);
    for (const EvalSummary& sum : cap.summary()) {
      if (sum.ratio != ratio || sum.heads == 0) continue;
      if (sum.method == a) p.a = sum.mean;
      if (!b.empty() && sum.method == b) p.b = sum.mean;
    }
    prompts.push_back(p);
  }
  std::stable_sort(prompts.begin(), prompts.end(),
                   [](const PromptRow& x, const PromptRow& y) {
                     const double lx = std::isnan(x.loss()) ? -INFINITY : x.loss();
                     const double ly = std::isnan(y.loss()) ? -INFINITY : y.loss();
                     return lx > ly;
                   });
}

GridValues SetFigures::grid(const AppState& s, bool by_interval) const {
  GridValues gv;
  gv.layers = layers;
  gv.heads = heads;
  const size_t cells = static_cast<size_t>(layers) * heads;
  gv.mean.assign(cells, NAN);
  gv.spread.assign(cells, NAN);
  gv.note.assign(cells, "");
  gv.missing.assign(cells, 1);
  gv.unit = by_interval ? "interval width" : "mean error";
  gv.map = Colormap::Viridis;
  char buf[512];
  if (!report || column < 0) {
    gv.caption = report ? "the keep ratio is not among the set's ratios: Run the set again"
                        : "the set's figures are not computed yet";
    return gv;
  }
  for (size_t i = 0; i < cells; ++i) {
    const SetRow* r = cell[i];
    if (!r) continue;
    gv.missing[i] = 0;
    gv.mean[i] = by_interval ? (std::isnan(r->ci_low) ? NAN : r->ci_high - r->ci_low) : r->mean;
    std::snprintf(buf, sizeof buf,
                  "mean over %d prompts %.17g\n95%% interval [%.17g, %.17g]\nover prompts: "
                  "%.17g .. %.17g",
                  r->prompts, r->mean, r->ci_low, r->ci_high, lo[i], hi[i]);
    gv.note[i] = buf;
  }
  std::snprintf(buf, sizeof buf, "%s at keep ratio %s over %zu prompts: %s per layer and kv head",
                s.method_name(0).c_str(),
                ratio_label(report->captures[0].spec.ratios[static_cast<size_t>(column)]).c_str(),
                report->entries.size(),
                by_interval ? "width of the 95% interval of the mean" : "mean relative error");
  gv.caption = buf;
  finish_range(gv);
  return gv;
}

void SetFigures::draw_plot(const AppState& s, const char* id) const {
  if (!report) return;
  const std::vector<double>& ratios = report->captures[0].spec.ratios;
  std::map<std::string, std::vector<double>> mean, lo, hi;
  std::vector<double> all;
  for (const SetRow& r : rows) {
    if (r.layer != kAllLayers) continue;
    for (auto* v : {&mean[r.method], &lo[r.method], &hi[r.method]}) v->resize(ratios.size(), NAN);
    mean[r.method][r.column] = r.mean;
    lo[r.method][r.column] = std::isnan(r.ci_low) ? r.mean : r.ci_low;
    hi[r.method][r.column] = std::isnan(r.ci_high) ? r.mean : r.ci_high;
    all.insert(all.end(), {lo[r.method][r.column], hi[r.method][r.column]});
  }
  double ymin = 0, ymax = 1;
  finite_range(all, &ymin, &ymax);
  Axis x{"keep ratio (log2)", ratios.back(), ratios.front(), Scale::Log2, true};
  Axis y{"mean relative error over prompts", std::max(0.0, ymin), ymax};
  Plot plot(id, ImVec2(0, std::max(px(180), min_plot_size().y)),
            "error against keep ratio, 95% interval across prompts", x, y);
  std::vector<Plot::LegendEntry> legend;
  std::vector<ImVec2> points;
  for (const auto& [method, m] : mean) {
    const ImU32 col = set_slot_colour(s, method);
    plot.band(ratios, lo[method], hi[method], with_alpha(col, 0.25f));
    plot.line(ratios, m, col);
    plot.markers(ratios, m, col);
    legend.push_back({method, col});
    for (size_t i = 0; i < ratios.size(); ++i) points.push_back(plot.to_screen(ratios[i], m[i]));
  }
  plot.legend(legend, plot.emptiest_corner(points));
}

}  // namespace kvscope::app
