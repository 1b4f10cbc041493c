// Theory view: the papers' scaling claims on the focused head or the whole capture
// (engine/teaching/theory.h, docs/theory.md). Discrepancy vs n of the self-balancing walk against
// random signs (denominator and numerator instances, along the evaluation queries or in kernel
// norm, at the authors' parameters and at an unsaturated setting, saturation beside each), error vs
// budget for the selected methods with the fitted exponent alpha and its interval, the reference
// slopes 1/2 and 1, and the normalised error under both normalisations (BalanceKV Eq. 2, SubGen Eq.
// 3). Everything is one planned result (plan(): AppState::reconcile runs it, with progress and
// cancel); draw() only draws it.
#include <imgui.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "app/app_state.h"
#include "app/colormap.h"
#include "app/method_list.h"
#include "app/plot.h"
#include "app/result_status.h"
#include "app/ui_layout.h"
#include "app/views/view.h"
#include "app/views/view_jobs.h"
#include "engine/teaching/theory.h"

namespace kvscope::app {
namespace {

constexpr const char* kTheory = "theory";
constexpr ImU32 kColRandom = IM_COL32(215, 215, 225, 255);
constexpr ImU32 kColAuthors = IM_COL32(255, 150, 80, 255);
constexpr ImU32 kColSoft = IM_COL32(90, 200, 255, 255);
constexpr ImU32 kColGuide = IM_COL32(150, 150, 160, 200);

std::string slope_text(const PowerFit& f, bool negate) {
  if (!f.ok) return "no fit";
  char b[96];
  const double v = negate ? -f.slope : f.slope;
  const double lo = negate ? -f.ci_high : f.ci_low, hi = negate ? -f.ci_low : f.ci_high;
  std::snprintf(b, sizeof b, "%.2f [%.2f, %.2f]", v, lo, hi);
  return b;
}

// "authors'" or "gamma 0.1, temp 0.02" for legends.
std::string short_label(const DiscRun& d) {
  if (d.walk.label.rfind("authors", 0) == 0) return "authors'";
  char b[64];
  std::snprintf(b, sizeof b, "gamma %g, temp %g", d.walk.params.gamma, d.walk.params.temp);
  return b;
}

struct ViewChoices {
  int scope = 0;  // 0 focused head, 1 whole capture
  std::vector<std::string> methods = default_methods().theory;
  int seeds = 5;
  int disc_seeds = 8;
  int sizes = 0;      // DiscSizes
  int max_n_log = 9;  // 2^9 = 512
  // Doubles end to end: a typed 0.05 reaches the walk as the CLI's --unsat-gamma 0.05 does.
  double unsat_temp = 0.02, unsat_gamma = 0.1;
  bool operator==(const ViewChoices&) const = default;
};

// What the theory job reads: the capture, the scope (with the focused head when it is one), the
// discrepancy's sizes, largest n, seeds and unsaturated walk, the methods (each with the
// parameters of the slot that runs it, defaults otherwise), the seeds and base seed, the
// window's overrides and the estimator.
struct TheoryMethodInput {
  std::string name;
  ParamValues params;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(TheoryMethodInput, name, params)
struct TheoryInput {
  uint64_t capture = 0;
  int scope = 0, layer = -1, kv_head = -1;
  int sizes = 0, max_n = 0, disc_seeds = 0;
  double unsat_temp = 0, unsat_gamma = 0;
  int seeds = 0;
  uint64_t base_seed = 0;
  int sink = -1, eval = -1;
  std::string estimator;
  std::vector<TheoryMethodInput> methods;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(TheoryInput, capture, scope, layer, kv_head, sizes, max_n,
                                   disc_seeds, unsat_temp, unsat_gamma, seeds, base_seed, sink,
                                   eval, estimator, methods)

TheorySpec theory_spec(const TheoryInput& in) {
  TheorySpec spec;
  if (in.layer >= 0) spec.layers = {in.layer};
  if (in.kv_head >= 0) spec.heads = {in.kv_head};
  spec.sizes = in.sizes == 0 ? DiscSizes::Prefixes : DiscSizes::WholeBlocks;
  spec.max_n = in.max_n;
  spec.disc_seeds = in.disc_seeds;
  spec.walks = disc_walks(in.unsat_temp, in.unsat_gamma);
  spec.seeds = in.seeds;
  spec.base_seed = in.base_seed;
  spec.sink = in.sink;
  spec.eval = in.eval;
  spec.estimator = parse_estimator(in.estimator);
  for (const TheoryMethodInput& m : in.methods) spec.methods.push_back({m.name, m.params});
  return spec;
}

std::shared_ptr<const TheoryResult> run_theory_job(const TheoryInput& in, const CaptureRef& h,
                                                   JobContext& ctx, const JobPlan::PartialFn&) {
  return std::make_shared<TheoryResult>(run_theory(
      *h.capture, theory_spec(in), [&ctx](int d, int t) { ctx.progress(d, t); },
      ctx.cancel_flag()));
}

class TheoryView final : public View {
 public:
  const char* name() const override { return "theory"; }
  const char* title() const override { return "Theory"; }
  const char* help() const override {
    return "The papers' scaling claims on real heads (docs/theory.md). Discrepancy vs n: the "
           "self-balancing walk against random signs on log-log axes (denominator and numerator "
           "instances, along the evaluation queries or in kernel norm), at the authors' "
           "parameters and at an unsaturated setting, with fitted slopes and the saturation "
           "share. Error vs budget: every selected method with the fitted alpha in error ~ "
           "m^-alpha (95% interval), the reference slopes 1/2 and 1, under the relative error, "
           "BalanceKV's Eq. 2 (Frobenius) or SubGen's Eq. 3 (operator norm). Focused head or "
           "the whole capture; long runs wait for Run.";
  }

  bool ready(const AppState& s) const override {
    const Result& r = s.result(kTheory);
    return !s.capture || r.want.empty() || r.fresh() || (!r.held.empty() && r.held == r.want);
  }

  void plan(const AppState& s, std::vector<NamedPlan>& out) const override {
    // Wanted while the view is shown in either panel (the run is not free).
    const auto& pv = s.settings.panel_view;
    if (std::find(pv.begin(), pv.end(), name()) == pv.end() && s.settings.active_view != name())
      return;
    out.emplace_back(kTheory, plan_theory(s));
  }

  JobPlan plan_theory(const AppState& s) const {
    JobPlan p;
    if (!s.capture || !s.info()) return p;
    const CaptureInfo& ci = *s.info();
    const ViewChoices c = c_;
    const Focus f = s.settings.focus;
    TheoryInput in;
    in.capture = s.capture_id;
    in.scope = c.scope;
    in.layer = c.scope == 0 ? f.layer : -1;
    in.kv_head = c.scope == 0 ? f.kv_head : -1;
    in.sizes = c.sizes;
    in.max_n = 1 << c.max_n_log;
    in.disc_seeds = c.disc_seeds;
    in.unsat_temp = c.unsat_temp;
    in.unsat_gamma = c.unsat_gamma;
    in.seeds = c.seeds;
    in.base_seed = static_cast<uint64_t>(s.settings.seed);
    in.sink = s.settings.sink_override;
    in.eval = s.settings.eval_override;
    in.estimator = estimator_name(s.settings.estimator);
    for (const std::string& m : c.methods) {
      if (!find_method(m)) continue;
      TheoryMethodInput tm{m, {}};
      // A method that is A or B runs with that slot's own parameters.
      for (int k = 0; k < 2; ++k)
        if (s.method_name(k) == m) tm.params = s.settings.method[static_cast<size_t>(k)].params;
      in.methods.push_back(tm);
    }
    const TheorySpec spec = theory_spec(in);
    p.derive("theory", std::move(in), CaptureRef{s.capture, nullptr}, &run_theory_job);
    p.lane = Lane::Analysis;
    p.label = "theory";
    const double heads = c.scope == 0 ? 1.0 : static_cast<double>(ci.num_layers) * ci.kv_heads;
    const double n_disc = std::min<double>(spec.max_n, ci.num_tokens);
    p.cost_class = "theory";
    p.units = heads * (static_cast<double>(spec.methods.size()) * spec.ratios.size() * c.seeds *
                           ci.num_tokens * ci.head_dim +
                       4.0 * c.disc_seeds * n_disc * n_disc * (ci.head_dim + 8));
    p.prior_per_unit = 2e-9;
    p.auto_limit_s = 4.0;
    return p;
  }

  void draw(AppState& s) override {
    if (!s.info()) {
      ImGui::TextDisabled("No capture open.");
      return;
    }
    if (!presenting_view()) draw_toolbar(s);  // a presentation shows the figures alone
    draw_result_status(s, kTheory, "theory");
    const Result& res = s.result(kTheory);
    const TheoryResult* r = res.get<TheoryResult>();
    if (!res.error.empty() && res.key == res.want)
      ImGui::TextColored(kTextError, "%s", res.error.c_str());
    if (!r) {
      if (!res.busy()) ImGui::TextDisabled("No result yet.");
      return;
    }
    const bool stale = res.stale();
    ImGui::TextWrapped("%s, %s; %s%s", r->scope.c_str(), r->window.c_str(),
                       r->info.synthetic ? "SYNTHETIC capture; " : "",
                       stale ? "[STALE: computed for earlier settings]" : "");
    for (const std::string& n : r->notes) ImGui::TextDisabled("note: %s", n.c_str());
    mark_figure_top();
    const ImVec2 avail = ImGui::GetContentRegionAvail();
    const float gap = px(8);
    const ImVec2 least = min_plot_size();
    // Presented (the projector), a panel holds a plot with room beside its data for a legend
    // column (five long entries): two columns of narrower panels put the legends in bands over
    // all but 60 px of the plots at 2.5x. In a panel the four stay in sight together (a figure
    // export holds what is in sight), the legends in bands where they must be.
    const float room = presenting_view() ? 1.6f : 1.0f;
    const ImVec2 panel_least(room * least.x + px(40), least.y + px(30));
    const bool two_columns = avail.x >= 2 * panel_least.x + gap;
    const float w2 = two_columns ? (avail.x - gap) / 2 : avail.x;
    // Presented in one column each panel takes the height in sight (the view scrolls from one
    // to the next): half of it left the plots' long legends all but the whole plot at 2.5x.
    const float h2 = std::max(
        panel_least.y, two_columns || !presenting_view() ? (avail.y - gap) / 2 : avail.y - gap);
    ImGui::BeginChild("##theory_den", ImVec2(w2, h2), true);
    draw_discrepancy(s, *r, "denominator", stale);
    ImGui::EndChild();
    if (two_columns) ImGui::SameLine(0, gap);
    ImGui::BeginChild("##theory_num", ImVec2(w2, h2), true);
    draw_discrepancy(s, *r, "numerator", stale);
    ImGui::EndChild();
    ImGui::BeginChild("##theory_err", ImVec2(w2, h2), true);
    draw_error(s, *r, stale);
    ImGui::EndChild();
    if (two_columns) ImGui::SameLine(0, gap);
    ImGui::BeginChild("##theory_table", ImVec2(w2, h2), true, ImGuiWindowFlags_HorizontalScrollbar);
    draw_table(*r);
    ImGui::EndChild();
  }

  nlohmann::json export_json(const AppState& s) const override {
    const Result& res = s.result(kTheory);
    const TheoryResult* r = res.get<TheoryResult>();
    if (!r) return nullptr;
    nlohmann::json j = r->to_json();
    j["stale"] = res.stale();
    j["view"] = save_state();
    return j;
  }
  std::string export_csv(const AppState& s) const override {
    const TheoryResult* r = s.result(kTheory).get<TheoryResult>();
    return r ? r->to_csv() : std::string();
  }

  nlohmann::json save_state() const override {
    return {{"scope", c_.scope},           {"methods", c_.methods},
            {"seeds", c_.seeds},           {"disc_seeds", c_.disc_seeds},
            {"sizes", c_.sizes},           {"max_n_log", c_.max_n_log},
            {"unsat_temp", c_.unsat_temp}, {"unsat_gamma", c_.unsat_gamma},
            {"measure", disc_measure_},    {"error_measure", err_measure_}};
  }
  void load_state(const nlohmann::json& j) override {
    if (!j.is_object()) return;
    auto get_int = [&](const char* k, int& v, int lo, int hi) {
      if (j.contains(k) && j[k].is_number_integer()) v = std::clamp(j[k].get<int>(), lo, hi);
    };
    auto get_double = [&](const char* k, double& v, double lo, double hi) {
      if (j.contains(k) && j[k].is_number()) v = std::clamp(j[k].get<double>(), lo, hi);
    };
    get_int("scope", c_.scope, 0, 1);
    get_int("seeds", c_.seeds, 1, 20);
    get_int("disc_seeds", c_.disc_seeds, 1, 32);
    get_int("sizes", c_.sizes, 0, 1);
    get_int("max_n_log", c_.max_n_log, 5, 12);
    get_double("unsat_temp", c_.unsat_temp, 0.0, 10.0);
    get_double("unsat_gamma", c_.unsat_gamma, 0.0, 100.0);
    get_int("measure", disc_measure_, 0, 1);
    get_int("error_measure", err_measure_, 0, 2);
    if (j.contains("methods") && j["methods"].is_array()) {
      c_.methods.clear();
      for (const auto& m : j["methods"])
        if (m.is_string() && find_method(m.get<std::string>())) c_.methods.push_back(m);
    }
  }

 private:
  void draw_toolbar(AppState& s) {
    ImGui::RadioButton("focused head", &c_.scope, 0);
    record_item(s, "theory:focused head");
    toolbar_next(ImGui::GetFrameHeight() + labelled_width(0, "whole capture"));
    ImGui::RadioButton("whole capture", &c_.scope, 1);
    record_item(s, "theory:whole capture");
    toolbar_next(button_width("methods..."));
    if (ImGui::Button("methods...")) ImGui::OpenPopup("##theory_methods");
    record_item(s, "theory:methods");
    if (ImGui::BeginPopup("##theory_methods")) {
      for (const Method* m : app_methods()) {
        bool on = std::find(c_.methods.begin(), c_.methods.end(), m->name()) != c_.methods.end();
        if (method_checkbox(s, *m, &on, "theory:method:" + m->name())) {
          if (on)
            c_.methods.push_back(m->name());
          else
            c_.methods.erase(std::find(c_.methods.begin(), c_.methods.end(), m->name()));
        }
      }
      ImGui::EndPopup();
    }
    toolbar_next(labelled_width(px(80), "seeds"));
    ImGui::SetNextItemWidth(fit_width(80, "seeds"));
    ImGui::SliderInt("seeds", &c_.seeds, 1, 20);
    record_item(s, "theory:seeds");
    toolbar_next(labelled_width(px(110), "error"));
    ImGui::SetNextItemWidth(fit_width(110, "error"));
    const char* err_items[] = {"relative", "Eq. 2 (Frobenius)", "Eq. 3 (operator)"};
    ImGui::Combo("error", &err_measure_, err_items, 3);
    record_item(s, "theory:error measure");
    // Second row: the discrepancy figure's settings.
    toolbar_next(labelled_width(px(120), "discrepancy"));
    ImGui::SetNextItemWidth(fit_width(120, "discrepancy"));
    const char* meas_items[] = {"along queries", "kernel norm"};
    ImGui::Combo("discrepancy", &disc_measure_, meas_items, 2);
    record_item(s, "theory:measure");
    toolbar_next(labelled_width(px(100), "sizes"));
    ImGui::SetNextItemWidth(fit_width(100, "sizes"));
    const char* size_items[] = {"prefixes", "whole blocks"};
    ImGui::Combo("sizes", &c_.sizes, size_items, 2);
    record_item(s, "theory:sizes");
    toolbar_next(labelled_width(px(80), "largest n"));
    ImGui::SetNextItemWidth(fit_width(80, "largest n"));
    const char* n_items[] = {"32", "64", "128", "256", "512", "1024", "2048", "4096"};
    int n_idx = c_.max_n_log - 5;
    if (ImGui::Combo("largest n", &n_idx, n_items, 8)) c_.max_n_log = n_idx + 5;
    record_item(s, "theory:largest n");
    toolbar_next(labelled_width(px(80), "walk seeds"));
    ImGui::SetNextItemWidth(fit_width(80, "walk seeds"));
    ImGui::SliderInt("walk seeds", &c_.disc_seeds, 1, 32);
    record_item(s, "theory:walk seeds");
    toolbar_next(labelled_width(px(80), "unsaturated temp"));
    ImGui::SetNextItemWidth(fit_width(80, "unsaturated temp"));
    double t = c_.unsat_temp;
    if (ImGui::InputDouble("unsaturated temp", &t, 0, 0, "%.6g",
                           ImGuiInputTextFlags_EnterReturnsTrue))
      c_.unsat_temp = std::clamp(t, 0.0, 10.0);
    record_item(s, "theory:unsat temp");
    toolbar_next(labelled_width(px(80), "gamma"));
    ImGui::SetNextItemWidth(fit_width(80, "gamma"));
    double g = c_.unsat_gamma;
    if (ImGui::InputDouble("gamma", &g, 0, 0, "%.6g", ImGuiInputTextFlags_EnterReturnsTrue))
      c_.unsat_gamma = std::clamp(g, 0.0, 100.0);
    record_item(s, "theory:unsat gamma");
  }

  void draw_discrepancy(AppState& s, const TheoryResult& r, const char* instance, bool stale) {
    const char* measure = disc_measure_ == 0 ? "query" : "kernel";
    if (r.discrepancy.empty()) {
      ImGui::TextDisabled("No discrepancy curves (middle too short, or none asked for).");
      return;
    }
    std::vector<double> all;
    for (const DiscRun& d : r.discrepancy)
      for (const char* sg : {"walk", "random"})
        if (const ScalingCurve* c = d.find(instance, measure, sg))
          for (size_t i = 0; i < c->x.size(); ++i)
            for (double v : {c->lo[i], c->hi[i]})
              if (v > 0 && std::isfinite(v)) all.push_back(v);
    double ylo = 1e-3, yhi = 10;
    if (!all.empty()) {
      ylo = *std::min_element(all.begin(), all.end()) / 1.5;
      yhi = *std::max_element(all.begin(), all.end()) * 1.5;
    }
    const std::vector<double>& xs =
        r.discrepancy[0].curves.empty() ? std::vector<double>{} : r.discrepancy[0].curves[0].x;
    if (xs.empty()) return;
    const std::string title =
        std::string(instance) + " instance: discrepancy " +
        (disc_measure_ == 0 ? "along the evaluation queries" : "in kernel norm") +
        (stale ? "  [STALE]" : "");
    Axis xa{"n (log2 axis)", xs.front() / 1.2, xs.back() * 1.2, Scale::Log2};
    Axis ya{std::string("||signed sum|| / largest term (log)"), ylo, yhi, Scale::Log10};
    Plot plot(instance, ImVec2(0, 0), title, xa, ya);
    std::vector<Plot::LegendEntry> legend;
    // Reference slopes through the random curve's first point: sqrt(n) (random signs) and
    // log2(n) (the walk's theorem, up to its constant).
    const ScalingCurve* rnd = r.discrepancy[0].find(instance, measure, "random");
    if (rnd && rnd->mean[0] > 0) {
      std::vector<double> sq, lg;
      for (double n : xs) {
        sq.push_back(rnd->mean[0] * std::sqrt(n / xs[0]));
        lg.push_back(rnd->mean[0] * std::log2(n) / std::log2(xs[0]));
      }
      plot.dashed_line(xs, sq, kColGuide, 1.2f, 3.0f);
      plot.dashed_line(xs, lg, with_alpha(kColGuide, 0.6f), 1.2f, 8.0f);
      legend.push_back({"sqrt n (short dashes), log n (long); slopes [95% CI]", kColGuide});
    }
    for (size_t k = 0; k < r.discrepancy.size(); ++k) {
      const DiscRun& d = r.discrepancy[k];
      const ImU32 col = k == 0 ? kColAuthors : kColSoft;
      // Random signs on the same vectors (each run measures in its own walk's geometry).
      if (const ScalingCurve* rs = d.find(instance, measure, "random")) {
        const ImU32 rc = lerp_colour(col, kColRandom, 0.55f);
        plot.band(rs->x, rs->lo, rs->hi, with_alpha(rc, 0.10f));
        plot.dashed_line(rs->x, rs->mean, stale ? with_alpha(rc, 0.4f) : rc, 2.0f);
        plot.markers(rs->x, rs->mean, rc, 2.5f);
        legend.push_back({"random, " + short_label(d) + ": " + slope_text(rs->fit, false), rc});
      }
      const ScalingCurve* w = d.find(instance, measure, "walk");
      if (!w) continue;
      plot.band(w->x, w->lo, w->hi, with_alpha(col, 0.15f));
      plot.line(w->x, w->mean, stale ? with_alpha(col, 0.4f) : col, 2.0f);
      plot.markers(w->x, w->mean, col, 3.0f);
      const double sat =
          std::string(instance) == "numerator" ? d.saturation_numerator : d.saturation_denominator;
      char b[160];
      std::snprintf(b, sizeof b, "walk, %s (%.0f%% sat.): %s", short_label(d).c_str(), 100 * sat,
                    slope_text(w->fit, false).c_str());
      legend.push_back({b, col});
    }
    plot.legend(legend, Plot::Corner::TopLeft);
    if (plot.hovered()) {
      const int i = plot.nearest_x(xs);
      if (i >= 0) {
        plot.vline(xs[static_cast<size_t>(i)], IM_COL32(255, 255, 255, 80));
        ImGui::BeginTooltip();
        ImGui::Text("n = %g (%s)", xs[static_cast<size_t>(i)], instance);
        for (const DiscRun& d : r.discrepancy)
          for (const char* sg : {"walk", "random"})
            if (const ScalingCurve* c = d.find(instance, measure, sg))
              ImGui::Text("%-22s %-6s mean %.4g  [%.4g, %.4g]", d.walk.label.c_str(), sg,
                          c->mean[static_cast<size_t>(i)], c->lo[static_cast<size_t>(i)],
                          c->hi[static_cast<size_t>(i)]);
        ImGui::EndTooltip();
      }
    }
    (void)s;
  }

  void draw_error(AppState& s, const TheoryResult& r, bool stale) {
    static const char* measures[] = {"relative", "frobenius", "operator"};
    const char* measure = measures[err_measure_];
    if (r.errors.empty()) {
      ImGui::TextDisabled("No methods selected (methods...).");
      return;
    }
    std::vector<double> all, xs;
    for (const ErrorScaling& e : r.errors)
      if (const ScalingCurve* c = e.find(measure))
        for (size_t i = 0; i < c->x.size(); ++i) {
          if (c->x[i] > 0) xs.push_back(c->x[i]);
          for (double v : {c->lo[i], c->hi[i]})
            if (v > 0 && std::isfinite(v)) all.push_back(v);
        }
    if (xs.empty() || all.empty()) {
      ImGui::TextDisabled("No errors (see the notes).");
      return;
    }
    const double xlo = *std::min_element(xs.begin(), xs.end()),
                 xhi = *std::max_element(xs.begin(), xs.end());
    const double ylo = *std::min_element(all.begin(), all.end()) / 1.5,
                 yhi = *std::max_element(all.begin(), all.end()) * 1.5;
    const char* ylabel = err_measure_ == 0   ? "||z - Attn|| / ||Attn|| (log)"
                         : err_measure_ == 1 ? "/ (||softmax|| ||V||_F): BalanceKV Eq. 2 (log)"
                                             : "/ (||softmax|| ||V||_op): SubGen Eq. 3 (log)";
    std::string title = "error vs budget m: mean, band min..max over " +
                        std::to_string(r.spec.seeds) + " seeds" +
                        (r.heads > 1 ? " x " + std::to_string(r.heads) + " heads" : "");
    if (stale) title += "  [STALE]";
    Plot plot("##theory_errplot", ImVec2(0, 0), title,
              Axis{"budget m (log2 axis)", xlo / 1.2, xhi * 1.2, Scale::Log2},
              Axis{ylabel, ylo, yhi, Scale::Log10});
    std::vector<Plot::LegendEntry> legend;
    // Reference slopes through the first method's largest budget.
    const ScalingCurve* first = r.errors[0].find(measure);
    if (first && !first->x.empty() && first->mean[0] > 0) {
      for (double a : {0.5, 1.0}) {
        std::vector<double> rx, ry;
        for (double m : first->x) {
          rx.push_back(m);
          ry.push_back(first->mean[0] * std::pow(m / first->x[0], -a));
        }
        plot.dashed_line(rx, ry, a == 0.5 ? kColGuide : with_alpha(kColGuide, 0.6f), 1.2f,
                         a == 0.5 ? 3.0f : 8.0f);
      }
      legend.push_back({"reference m^-1/2 (short dashes), m^-1 (long)", kColGuide});
    }
    std::vector<std::string> drawn;
    for (const ErrorScaling& e : r.errors) drawn.push_back(e.method);
    const MethodColours colours(drawn);
    for (const ErrorScaling& e : r.errors) {
      const ScalingCurve* c = e.find(measure);
      if (!c) continue;
      const ImU32 col = colours(e.method);
      plot.band(c->x, c->lo, c->hi, with_alpha(col, 0.15f));
      plot.line(c->x, c->mean, stale ? with_alpha(col, 0.4f) : col, 2.0f);
      plot.markers(c->x, c->mean, col, 3.0f);
      legend.push_back({e.label + ": alpha " + slope_text(c->fit, true), col});
    }
    plot.legend(legend, Plot::Corner::BottomLeft);
    if (plot.hovered() && first) {
      const int i = plot.nearest_x(first->x);
      if (i >= 0) {
        const size_t k = static_cast<size_t>(i);
        plot.vline(first->x[k], IM_COL32(255, 255, 255, 80));
        ImGui::BeginTooltip();
        ImGui::Text("budget m = %g (keep ratio %s)", first->x[k],
                    ratio_label(r.errors[0].ratios[k]).c_str());
        for (const ErrorScaling& e : r.errors)
          ImGui::Text("%-16s relative %.4f  Eq. 2 %.4g  Eq. 3 %.4g  kept %.1f", e.method.c_str(),
                      e.find("relative")->mean[k], e.find("frobenius")->mean[k],
                      e.find("operator")->mean[k], e.kept[k]);
        ImGui::EndTooltip();
      }
    }
    (void)s;
  }

  void draw_table(const TheoryResult& r) {
    // Wrapped at the child's visible width (it scrolls sideways: ImGui's default there is the
    // scrolled width, which cut "Student-t" at 2.5x).
    ImGui::PushTextWrapPos(ImGui::GetWindowContentRegionMax().x + ImGui::GetScrollX());
    ImGui::TextWrapped("%s",
                       "Fitted exponents (least squares on log-log over every seed and head "
                       "point; 95% Student-t interval)");
    ImGui::PopTextWrapPos();
    if (ImGui::BeginTable(
            "##theory_fits", 4,
            ImGuiTableFlags_Borders | ImGuiTableFlags_RowBg | ImGuiTableFlags_SizingFixedFit)) {
      ImGui::TableSetupColumn("method");
      ImGui::TableSetupColumn("alpha, relative");
      ImGui::TableSetupColumn("alpha, Eq. 2 (Frobenius)");
      ImGui::TableSetupColumn("alpha, Eq. 3 (operator)");
      ImGui::TableHeadersRow();
      for (const ErrorScaling& e : r.errors) {
        ImGui::TableNextRow();
        ImGui::TableNextColumn();
        ImGui::TextUnformatted(e.label.c_str());
        for (const char* m : {"relative", "frobenius", "operator"}) {
          ImGui::TableNextColumn();
          ImGui::TextUnformatted(slope_text(e.find(m)->fit, true).c_str());
        }
      }
      ImGui::EndTable();
    }
    for (const ErrorScaling& e : r.errors)
      if (!e.note.empty()) ImGui::TextDisabled("%s: %s", e.method.c_str(), e.note.c_str());
    if (ImGui::BeginTable(
            "##theory_disc", 4,
            ImGuiTableFlags_Borders | ImGuiTableFlags_RowBg | ImGuiTableFlags_SizingFixedFit)) {
      ImGui::TableSetupColumn("walk / instance");
      ImGui::TableSetupColumn("slope along queries");
      ImGui::TableSetupColumn("slope, kernel norm");
      ImGui::TableSetupColumn("saturated");
      ImGui::TableHeadersRow();
      auto row = [&](const std::string& label, const DiscRun& d, const char* inst,
                     const char* signs, double sat) {
        ImGui::TableNextRow();
        ImGui::TableNextColumn();
        ImGui::TextUnformatted(label.c_str());
        for (const char* m : {"query", "kernel"}) {
          ImGui::TableNextColumn();
          const ScalingCurve* c = d.find(inst, m, signs);
          ImGui::TextUnformatted(c ? slope_text(c->fit, false).c_str() : "-");
        }
        ImGui::TableNextColumn();
        if (sat >= 0)
          ImGui::Text("%.1f%%", 100 * sat);
        else
          ImGui::TextUnformatted("-");
      };
      // Short row labels so the numbers keep their room.
      auto tag = [](const DiscRun& d) {
        return std::string(d.walk.label.rfind("authors", 0) == 0 ? "authors'" : "unsat.");
      };
      for (const char* inst : {"denominator", "numerator"}) {
        const std::string inst_short = std::string(inst) == "numerator" ? "num." : "den.";
        for (const DiscRun& d : r.discrepancy) {
          row("walk, " + tag(d) + ", " + inst_short, d, inst, "walk",
              std::string(inst) == "numerator" ? d.saturation_numerator : d.saturation_denominator);
          row("random, " + tag(d) + ", " + inst_short, d, inst, "random", -1);
        }
      }
      ImGui::EndTable();
    }
    ImGui::TextWrapped(
        "Rates: random signs grow like sqrt n; the walk's theorem (BalanceKV Thm 3.2/3.4, from "
        "ALS21) bounds it by O(log n) along any fixed direction. Uniform sampling needs memory "
        "~ d/eps^2 (error ~ m^-1/2), BalanceKV ~ d^1.5/eps (error ~ m^-1; the talk, Thm 3.1).");
    ImGui::TextWrapped(
        "The theorems' bounds are not drawn: Thm 3.1-3.3 (BalanceKV) and Thm 1 (SubGen) give the "
        "budget with O*, O and Omega whose constants are not stated, so no absolute bound can be "
        "computed; only the rates are shown (docs/theory.md).");
    ImGui::TextWrapped(
        "Normalised error: Eq. 2 of BalanceKV divides by ||softmax|| ||V||_F; Eq. 3 of SubGen by "
        "||softmax|| ||V||_op (V_j: values of tokens 0..j). ||V||_op <= ||V||_F, so Eq. 3's "
        "figure is the larger.");
  }

  ViewChoices c_;
  int disc_measure_ = 0;  // 0 along queries, 1 kernel norm
  int err_measure_ = 0;   // relative, frobenius, operator
};

}  // namespace

std::unique_ptr<View> make_theory_view() {
  return std::make_unique<TheoryView>();
}

}  // namespace kvscope::app
