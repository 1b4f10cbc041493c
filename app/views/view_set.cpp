// Set view: evidence across the prompts of a capture set (docs/app.md, "Set view";
// docs/evaluation.md, "Capture sets"). Methods A and B on every capture of the set: the mean over
// prompts with its 95% interval per layer and kv head and for the whole capture, error against
// keep ratio with the interval as a band, and the prompts ranked by how much A loses to B; a click
// on a prompt opens its capture in every view.
#include <imgui.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "app/app_state.h"
#include "app/colormap.h"
#include "app/plot.h"
#include "app/result_status.h"
#include "app/ui_layout.h"
#include "app/views/view.h"
#include "app/views/view_jobs.h"
#include "engine/eval/capture_set.h"
#include "engine/eval/set_eval.h"

namespace kvscope::app {
namespace {

inline constexpr const char* kSetEval = "set.eval";

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

// One prompt's whole-capture figures of A and B at the current ratio, for the prompt list.
struct PromptRow {
  int entry = 0;
  double a = NAN, b = NAN;
  double loss() const { return a - b; }  // how much A loses to B (positive: B is better)
};

// What the view draws of a report, derived once per report and ratio.
struct SetFigures {
  std::shared_ptr<const SetEvalReport> report;  // held, so that the cache never outlives it
  int column = -1;
  std::vector<SetRow> rows;  // SetEvalReport::summary()
  // Per (layer, kv head) of method A at the column: the summary row and the spread over prompts.
  int layers = 0, heads = 0;
  std::vector<const SetRow*> cell;  // [layer * heads + head], null when missing
  std::vector<double> lo, hi;       // min and max over prompts
  std::vector<PromptRow> prompts;   // sorted by loss, largest first
};

int column_of(const SetEvalReport& r, double ratio) {
  const std::vector<double>& ratios = r.captures.at(0).spec.ratios;
  for (size_t i = 0; i < ratios.size(); ++i)
    if (ratios[i] == ratio) return static_cast<int>(i);
  return -1;
}

class SetView final : public View {
 public:
  const char* name() const override { return "set"; }
  const char* title() const override { return "Set"; }
  const char* help() const override {
    return "Evidence across the prompts of a capture set (File > Open set, or a manifest .jsonl "
           "or folder on the command line): methods A and B run on every capture of the set. The "
           "table gives each method's mean relative error over the prompts with its 95% Student-t "
           "interval, its wins and mean rank; the plot, error against keep ratio with the "
           "interval as a band; the grid, method A's mean per layer and kv head (hover: interval "
           "and the spread over prompts; or colour by the interval's width). The prompt list "
           "ranks the prompts by how much A loses to B; click one to open its capture in every "
           "view. The set's evaluation waits for Run when it is long; it shows progress and "
           "cancels.";
  }

  // Screenshots wait for the set's figures (or the reason there are none).
  bool ready(const AppState& s) const override {
    if (!pending_.empty()) return false;
    if (s.set_path.empty()) return true;
    const Result& open = s.result(kSetOpen);
    if (!open.error.empty() && open.key == open.want) return true;
    const Result& r = s.result(kSetEval);
    return !r.want.empty() && (r.fresh() || (!r.held.empty() && r.held == r.want) ||
                               (!r.error.empty() && r.key == r.want));
  }

  void plan(const AppState& s, std::vector<NamedPlan>& out) const override {
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

  void draw(AppState& s) override {
    if (!pending_.empty()) s.request_open(pending_), pending_.clear();  // a session's set
    if (s.set_path != path_) {  // opened elsewhere (menu, command line, a drop)
      path_ = s.set_path;
      std::snprintf(path_buf_, sizeof path_buf_, "%s", path_.c_str());
      figures_ = {};
    }
    draw_header(s);
    if (path_.empty()) return;
    const Result& opened = s.result(kSetOpen);
    if (!opened.error.empty() && opened.key == opened.want) {
      ImGui::TextColored(kTextError, "%s", opened.error.c_str());
      return;
    }
    const CaptureSet* set = opened.get<CaptureSet>();
    if (!set) {
      draw_result_status(s, kSetOpen, "the set");
      return;
    }
    ImGui::TextWrapped(
        "%zu captures of %s: %d layers, %d query / %d kv heads, head dim %d", set->entries.size(),
        set->shape.model.empty() ? "a model not recorded" : set->shape.model.c_str(),
        set->shape.num_layers, set->shape.q_heads, set->shape.kv_heads, set->shape.head_dim);
    draw_result_status(s, kSetEval, "the set's evaluation");
    const Result& res = s.result(kSetEval);
    if (!res.error.empty() && res.key == res.want)
      ImGui::TextColored(kTextError, "%s", res.error.c_str());
    const std::shared_ptr<const SetEvalReport> rep = res.ptr<SetEvalReport>();
    if (!rep || rep->captures.empty()) {
      draw_prompt_list(s, *set, nullptr);
      return;
    }
    derive(rep, s);
    draw_summary(s);
    draw_plot(s);
    draw_grid(s);
    draw_prompt_list(s, *set, rep.get());
  }

  nlohmann::json export_json(const AppState& s) const override {
    const SetEvalReport* rep = s.result(kSetEval).get<SetEvalReport>();
    if (path_.empty() || !rep) return nullptr;
    nlohmann::json j = rep->to_json();
    // The spec the set ran with (methods, ratios, seeds, params): every capture's is the same.
    j["spec"] = j["captures"].at(0)["spec"];
    j.erase("captures");  // every capture's own report: `kvscope-cli eval SET --json` has them
    j["fresh"] = s.result(kSetEval).fresh();
    j["colour_by_interval"] = by_interval_;
    return j;
  }
  std::string export_csv(const AppState& s) const override {
    const SetEvalReport* rep = s.result(kSetEval).get<SetEvalReport>();
    return rep ? rep->summary_csv() : std::string();
  }

  nlohmann::json save_state() const override {
    return {{"path", path_}, {"colour_by_interval", by_interval_}};
  }
  void load_state(const nlohmann::json& j) override {
    if (!j.is_object()) return;
    pending_ = j.value("path", std::string());  // opened by the next frame (request_open)
    by_interval_ = j.value("colour_by_interval", false);
  }

 private:
  void draw_header(AppState& s) {
    ImGui::SetNextItemWidth(fit_width(420, "set"));
    ImGui::InputTextWithHint("set", "manifest.jsonl or a folder of captures", path_buf_,
                             sizeof path_buf_);
    record_item(s, "set:path");
    toolbar_next(button_width("Open set"));
    if (ImGui::Button("Open set") || (ImGui::IsItemDeactivatedAfterEdit() && path_buf_[0]))
      s.request_open(path_buf_);
    record_item(s, "set:open");
    mark_figure_top();  // figure exports: what is below the set's field, not the field
    if (path_.empty())
      ImGui::TextWrapped(
          "No set open. A set is a manifest.jsonl (one {\"path\": ...} per line) or a folder of "
          ".safetensors captures of one model: kvscope-cli capture --prompts FILE.jsonl "
          "--out-dir DIR makes one (docs/evaluation.md, \"Capture sets\").");
  }

  void derive(const std::shared_ptr<const SetEvalReport>& held, const AppState& s) {
    const SetEvalReport& rep = *held;
    const int column = column_of(rep, s.settings.keep_ratio);
    if (figures_.report == held && figures_.column == column) return;
    figures_ = {};
    figures_.report = held;
    figures_.column = column;
    figures_.rows = rep.summary();
    const EvalSpec& spec = rep.captures[0].spec;
    figures_.layers = rep.captures[0].info.num_layers;
    figures_.heads = rep.captures[0].info.kv_heads;
    const size_t cells = static_cast<size_t>(figures_.layers) * figures_.heads;
    figures_.cell.assign(cells, nullptr);
    figures_.lo.assign(cells, NAN);
    figures_.hi.assign(cells, NAN);
    if (column < 0 || spec.methods.empty()) return;
    const std::string a = spec.methods[0]->name();
    const std::string b = spec.methods.size() > 1 ? spec.methods[1]->name() : "";
    for (const SetRow& r : figures_.rows)
      if (r.method == a && r.column == column && r.layer != kAllLayers &&
          r.layer < figures_.layers && r.kv_head < figures_.heads)
        figures_.cell[static_cast<size_t>(r.layer * figures_.heads + r.kv_head)] = &r;
    for (size_t c = 0; c < rep.captures.size(); ++c) {
      const EvalReport& cap = rep.captures[c];
      const double ratio = cap.spec.ratios[column];
      for (const HeadEval& he : cap.results) {
        if (he.method != a || he.ratio != ratio || he.refused || !he.error.empty()) continue;
        const size_t i = static_cast<size_t>(he.layer * figures_.heads + he.kv_head);
        if (i >= cells) continue;
        figures_.lo[i] = std::isnan(figures_.lo[i]) ? he.mean : std::min(figures_.lo[i], he.mean);
        figures_.hi[i] = std::isnan(figures_.hi[i]) ? he.mean : std::max(figures_.hi[i], he.mean);
      }
      PromptRow p;
      p.entry = static_cast<int>(c);
      for (const EvalSummary& sum : cap.summary()) {
        if (sum.ratio != ratio || sum.heads == 0) continue;
        if (sum.method == a) p.a = sum.mean;
        if (!b.empty() && sum.method == b) p.b = sum.mean;
      }
      figures_.prompts.push_back(p);
    }
    std::stable_sort(figures_.prompts.begin(), figures_.prompts.end(),
                     [](const PromptRow& x, const PromptRow& y) {
                       const double lx = std::isnan(x.loss()) ? -INFINITY : x.loss();
                       const double ly = std::isnan(y.loss()) ? -INFINITY : y.loss();
                       return lx > ly;
                     });
  }

  void draw_summary(AppState& s) {
    const Result& res = s.result(kSetEval);
    if (figures_.column < 0) {
      ImGui::TextDisabled("keep ratio %s is not among the set's ratios: Run the set again",
                          ratio_label(s.settings.keep_ratio).c_str());
      return;
    }
    ImGui::Text("At keep ratio %s, over %zu prompts%s:", ratio_label(s.settings.keep_ratio).c_str(),
                figures_.report->entries.size(), res.fresh() ? "" : " (stale: settings changed)");
    if (!ImGui::BeginTable("##setsummary", 5,
                           ImGuiTableFlags_RowBg | ImGuiTableFlags_SizingFixedFit))
      return;
    for (const char* h : {"method", "mean", "95% interval", "wins", "mean rank"})
      ImGui::TableSetupColumn(h);
    ImGui::TableHeadersRow();
    for (const SetRow& r : figures_.rows) {
      if (r.layer != kAllLayers || r.column != figures_.column) continue;
      ImGui::TableNextRow();
      ImGui::TableSetColumnIndex(0);
      ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(slot_colour(s, r.method)), "%s",
                         r.method.c_str());
      ImGui::TableSetColumnIndex(1);
      ImGui::Text("%.6g", r.mean);
      ImGui::TableSetColumnIndex(2);
      if (std::isnan(r.ci_low))
        ImGui::TextDisabled("one prompt");
      else
        ImGui::Text("[%.6g, %.6g]", r.ci_low, r.ci_high);
      ImGui::TableSetColumnIndex(3);
      ImGui::Text("%d of %d", r.wins, r.prompts);
      ImGui::TableSetColumnIndex(4);
      ImGui::Text("%.3g", r.mean_rank);
    }
    ImGui::EndTable();
  }

  ImU32 slot_colour(const AppState& s, const std::string& method) const {
    return method == s.method_name(0) ? kColSlot[0] : kColSlot[1];
  }

  void draw_plot(AppState& s) {
    const std::vector<double>& ratios = figures_.report->captures[0].spec.ratios;
    std::map<std::string, std::vector<double>> mean, lo, hi;
    std::vector<double> all;
    for (const SetRow& r : figures_.rows) {
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
    Plot plot("##setplot", ImVec2(0, std::max(px(180), min_plot_size().y)),
              "error against keep ratio, 95% interval across prompts", x, y);
    std::vector<Plot::LegendEntry> legend;
    std::vector<ImVec2> points;
    for (const auto& [method, m] : mean) {
      const ImU32 col = slot_colour(s, method);
      plot.band(ratios, lo[method], hi[method], with_alpha(col, 0.25f));
      plot.line(ratios, m, col);
      plot.markers(ratios, m, col);
      legend.push_back({method, col});
      for (size_t i = 0; i < ratios.size(); ++i) points.push_back(plot.to_screen(ratios[i], m[i]));
    }
    plot.legend(legend, plot.emptiest_corner(points));
  }

  void draw_grid(AppState& s) {
    if (figures_.layers == 0 || figures_.column < 0) return;
    ImGui::Checkbox("colour by the interval's width", &by_interval_);
    record_item(s, "set:by_interval");
    std::vector<double> values(figures_.cell.size(), NAN);
    for (size_t i = 0; i < values.size(); ++i)
      if (const SetRow* r = figures_.cell[i])
        values[i] = by_interval_ ? (std::isnan(r->ci_low) ? NAN : r->ci_high - r->ci_low) : r->mean;
    double vmin = 0, vmax = 1;
    finite_range(values, &vmin, &vmax, 0);
    ImGui::TextDisabled("method A (%s): %s per layer (rows) and kv head (columns)",
                        s.method_name(0).c_str(),
                        by_interval_ ? "width of the 95% interval" : "mean over prompts");
    const float h = std::min(px(260), std::max(px(80), px(18) * figures_.layers));
    const HeatmapHit hit = heatmap(
        "##setgrid", ImVec2(ImGui::GetContentRegionAvail().x - px(90), h), figures_.layers,
        figures_.heads, [&](int r, int c) {
          const double v = values[static_cast<size_t>(r * figures_.heads + c)];
          if (std::isnan(v)) return kColRefused;
          return colormap(Colormap::Viridis, vmax > vmin ? (v - vmin) / (vmax - vmin) : 0.5);
        });
    ImGui::SameLine();
    colour_bar("##setbar", ImVec2(px(80), h), Colormap::Viridis, vmin, vmax,
               by_interval_ ? "interval width" : "mean error");
    if (hit.row >= 0) {
      const size_t i = static_cast<size_t>(hit.row * figures_.heads + hit.col);
      const SetRow* r = figures_.cell[i];
      if (r)
        ImGui::SetTooltip(
            "layer %d, kv head %d\nmean over %d prompts %.17g\n95%% interval [%.17g, %.17g]\n"
            "over prompts: %.17g .. %.17g\nclick: focus this head",
            hit.row, hit.col, r->prompts, r->mean, r->ci_low, r->ci_high, figures_.lo[i],
            figures_.hi[i]);
      if (hit.clicked) s.set_focus({hit.row, hit.col});
    }
  }

  void draw_prompt_list(AppState& s, const CaptureSet& set, const SetEvalReport* rep) {
    const bool ranked = rep && !figures_.prompts.empty();
    ImGui::TextDisabled(ranked ? "prompts, by how much A loses to B (click: open the capture)"
                               : "prompts (click: open the capture)");
    if (!ImGui::BeginTable(
            "##setprompts", ranked ? 5 : 2,
            ImGuiTableFlags_RowBg | ImGuiTableFlags_ScrollY | ImGuiTableFlags_SizingStretchProp,
            ImVec2(0, std::max(px(120), ImGui::GetContentRegionAvail().y))))
      return;
    ImGui::TableSetupScrollFreeze(0, 1);
    ImGui::TableSetupColumn("prompt");
    ImGui::TableSetupColumn("tokens");
    if (ranked) {
      // The columns name the methods, so the table reads without the toolbar.
      const std::string a = "A: " + s.method_name(0), b = "B: " + s.method_name(1);
      ImGui::TableSetupColumn(a.c_str());
      ImGui::TableSetupColumn(b.c_str());
      ImGui::TableSetupColumn("A - B");
    }
    ImGui::TableHeadersRow();
    std::vector<PromptRow> order = figures_.prompts;
    if (!ranked)
      for (size_t i = 0; i < set.entries.size(); ++i) order.push_back({static_cast<int>(i)});
    for (const PromptRow& p : order) {
      const CaptureSetEntry& e = set.entries[static_cast<size_t>(p.entry)];
      ImGui::TableNextRow();
      ImGui::TableSetColumnIndex(0);
      const bool open = s.capture_path == e.resolved;
      const std::string label = e.label + (e.prompt.empty() ? "" : ": " + e.prompt);
      ImGui::PushID(p.entry);
      if (ImGui::Selectable(elide(label, px(360)).c_str(), open,
                            ImGuiSelectableFlags_SpanAllColumns) &&
          !open)
        s.request_open(e.resolved);
      record_item(s, "set:prompt:" + std::to_string(p.entry));
      if (ImGui::IsItemHovered() && !e.prompt.empty()) ImGui::SetTooltip("%s", e.prompt.c_str());
      ImGui::PopID();
      ImGui::TableSetColumnIndex(1);
      ImGui::Text("%d", e.num_tokens);
      if (!ranked) continue;
      ImGui::TableSetColumnIndex(2);
      ImGui::Text("%.6g", p.a);
      ImGui::TableSetColumnIndex(3);
      ImGui::Text("%.6g", p.b);
      ImGui::TableSetColumnIndex(4);
      ImGui::Text("%+.6g", p.loss());
    }
    ImGui::EndTable();
  }

  std::string path_;     // the set shown (AppState::set_path), for sessions
  std::string pending_;  // a session's set, opened by the next frame
  char path_buf_[1024] = {};
  bool by_interval_ = false;
  SetFigures figures_;
};

}  // namespace

std::unique_ptr<View> make_set_view() {
  return std::make_unique<SetView>();
}

}  // namespace kvscope::app
