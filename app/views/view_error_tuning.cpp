// The Error view's tuning panel: a method's error over a grid of two of its parameters (mean over
// seeds and the spread), planned as its own job (AppState::reconcile() runs it). The class is in
// app/views/view_error_view.h; the view's other panels are in app/views/view_error.cpp.

#include "app/views/view_error_view.h"
#include "app/views/view_jobs.h"
#include "engine/eval/capture_set.h"
#include "engine/eval/holdout.h"
#include "engine/eval/seed_stats.h"

namespace kvscope::app::error_view {

void ErrorView::draw_tuning(AppState& s) {
  const Method* m = s.method(0);
  if (!m) return;
  std::vector<std::string> names;
  for (const ParamSpec& p : m->params())
    if (p.type == ParamSpec::Type::Float || p.type == ParamSpec::Type::Int) names.push_back(p.name);
  if (names.size() < 2) {
    ImGui::TextWrapped("Method A (%s) has fewer than two numeric parameters to tune.",
                       m->name().c_str());
    return;
  }
  if (tune_method_ != m->name()) {  // defaults for a new method
    tune_method_ = m->name();
    const bool bkv = std::find(names.begin(), names.end(), "gamma") != names.end() &&
                     std::find(names.begin(), names.end(), "temp") != names.end();
    tune_rows_ = bkv ? "gamma" : names[0];
    tune_cols_ = bkv ? "temp" : names[1];
    auto around = [&](const std::string& n) {
      const double d = param_value(m->params(), {}, n);
      char buf[96];
      std::snprintf(buf, sizeof buf, "%g,%g,%g", d / 2, d, d * 2);
      return std::string(buf);
    };
    row_values_ = bkv ? "0,1,2,4" : around(tune_rows_);
    col_values_ = bkv ? "0.1,0.3,1" : around(tune_cols_);
  }
  bool changed = false;
  auto param_combo = [&](const char* label, std::string* v) {
    ImGui::SetNextItemWidth(px(110));
    if (ImGui::BeginCombo(label, v->c_str())) {
      for (const std::string& n : names)
        if (ImGui::Selectable(n.c_str(), n == *v)) *v = n, changed = true;
      ImGui::EndCombo();
    }
  };
  auto values_input = [&](const char* label, std::string* v) {
    char buf[256];
    std::snprintf(buf, sizeof buf, "%s", v->c_str());
    ImGui::SetNextItemWidth(px(130));
    if (ImGui::InputText(label, buf, sizeof buf, ImGuiInputTextFlags_EnterReturnsTrue))
      *v = buf, changed = true;
    if (ImGui::IsItemDeactivatedAfterEdit()) *v = buf, changed = true;
  };
  toolbar_next(labelled_width(px(110), "rows") + labelled_width(px(130), "##rv") + 8);
  param_combo("rows", &tune_rows_);
  ImGui::SameLine();
  values_input("##rv", &row_values_);
  toolbar_next(labelled_width(px(110), "columns") + labelled_width(px(130), "##cv") + 8);
  param_combo("columns", &tune_cols_);
  ImGui::SameLine();
  values_input("##cv", &col_values_);
  toolbar_next(labelled_width(px(80), "seeds"));
  ImGui::SetNextItemWidth(fit_width(80, "seeds"));
  changed |= ImGui::SliderInt("seeds", &tune_seeds_, 1, 10);
  toolbar_next(labelled_width(px(150), "scope"));
  ImGui::SetNextItemWidth(fit_width(150, "scope"));
  changed |= ImGui::Combo("scope", &tune_scope_,
                          "focused head\0focused layer\0whole capture\0set: tuning prompts\0");
  if (tune_scope_ == 3 && !s.result(kSetOpen).fresh())
    ImGui::TextDisabled("open a capture set in the Set view to tune on its prompts");
  (void)changed;  // every choice is part of the grid's key: reconcile() re-plans it
  // Run / Cancel / estimate: cheap grids run at once, costly ones wait for Run.
  draw_result_status(s, kTune, "tuning grid");
  const Result& res = s.result(kTune);
  mark_figure_top();
  const TuneResult* tr = res.get<TuneResult>();
  if (!tr) {
    ImGui::TextDisabled("%s", res.busy() ? "running the grid..." : "no grid yet");
    return;
  }
  const Grid2Result& g = tr->grid;
  const char* scope_name[] = {"the focused head", "the focused layer", "the whole capture",
                              "the set's tuning prompts"};
  ImGui::TextWrapped(
      "%s at keep ratio %s, %s (%zu head%s), %d seeds: mean relative error and its spread "
      "(std over seeds). Outlined white: best cell; dashed yellow: the defaults (%s=%g, "
      "%s=%g).",
      g.method.c_str(), ratio_label(g.ratios[0]).c_str(), scope_name[tr->scope], g.heads.size(),
      g.heads.size() == 1 ? "" : "s", g.seeds, g.rows.name.c_str(), g.default_row_value,
      g.cols.name.c_str(), g.default_col_value);
  if (tr->scope == 3) {
    const auto cell = [](double v) {
      char b[32];
      std::snprintf(b, sizeof b, "%.4f", v);
      return std::isnan(v) ? std::string("-") : std::string(b);
    };
    ImGui::TextWrapped(
        "Over %d tuning prompts of the set (each prompt's whole-capture mean; spread: std over "
        "prompts). On the %d held-out prompts: the best cell %s, the defaults %s.",
        tr->tuning_prompts, tr->held_out_prompts, cell(tr->held_out_best).c_str(),
        cell(tr->held_out_default).c_str());
  }
  const ImVec2 avail = ImGui::GetContentRegionAvail();
  const float gap = ImGui::GetStyle().ItemSpacing.x * 2;
  const float w = std::max(px(200), (avail.x - gap) / 2);
  draw_grid_panel("##tune_mean", g, g.mean[0], "mean relative error", "error", ImVec2(w, avail.y));
  ImGui::SameLine(0, gap);
  draw_grid_panel("##tune_std", g, g.seed_std[0],
                  tr->scope == 3 ? "spread: std over prompts" : "spread: std over seeds", "std",
                  ImVec2(w, avail.y));
}

namespace {

// What the tuning grid reads: method A with its parameters, the keep ratio, seed, window,
// estimator, backend and capture (common), the two swept parameters with their values as typed,
// the seeds, the scope, and the focused layer (scope <= 1) and head (scope 0), -1 otherwise.
struct TuneInput {
  EvalCommon common;
  std::string set;  // scope 3: the capture set's manifest or folder
  std::string method;
  ParamValues params;
  double keep_ratio = 0;
  uint64_t seed = 0;
  std::string rows, row_values, cols, col_values;
  int seeds = 0, scope = 0, layer = -1, kv_head = -1;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(TuneInput, common, set, method, params, keep_ratio, seed, rows,
                                   row_values, cols, col_values, seeds, scope, layer, kv_head)

// The grid's axes and fixed parameters; throws InputError for values that do not parse or a
// parameter's range.
Grid2Spec grid_of(const TuneInput& in) {
  Grid2Spec g;
  g.method = find_method(in.method);
  if (!g.method) throw InputError("unknown method '" + in.method + "'");
  if (in.rows == in.cols) throw InputError("rows and columns sweep the same parameter");
  g.rows = {in.rows, parse_values(in.row_values, in.rows)};
  g.cols = {in.cols, parse_values(in.col_values, in.cols)};
  for (double v : g.rows.values) validate_method_params(*g.method, {{g.rows.name, v}});
  for (double v : g.cols.values) validate_method_params(*g.method, {{g.cols.name, v}});
  // Other parameters as method A has them.
  for (const auto& [k, v] : in.params)
    if (k != g.rows.name && k != g.cols.name) g.fixed[k] = v;
  return g;
}

// What the tuning job reads besides its input: the open capture, the backend, and for scope 3 the
// set (the Set view's, kSetOpen).
struct TuneHandles {
  std::shared_ptr<CaptureFile> capture;
  Backend* backend = nullptr;
  std::shared_ptr<const CaptureSet> set;
};

// Scope 3: the grid on every capture of the set, its mean over the tuning prompts per cell (the
// std over them as the spread), and the held-out prompts' mean of the best and the default cell.
std::shared_ptr<const TuneResult> run_set_tuning(const TuneInput& in, const TuneHandles& h,
                                                 const Grid2Spec& g, const EvalSpec& spec,
                                                 JobContext& ctx) {
  if (!h.set) throw InputError("open a capture set in the Set view to tune on its prompts");
  const int n = static_cast<int>(h.set->entries.size());
  const PromptSplit split = split_prompts(n, 0.3, in.seed);
  std::vector<Grid2Result> grids;
  for (int c = 0; c < n; ++c) {
    std::unique_ptr<CaptureFile> capture = CaptureFile::open(h.set->entries[c].resolved);
    grids.push_back(run_grid2(
        *capture, spec, g,
        [&ctx, c, n](int d, int t) { ctx.progress(c * 1000 + (t ? d * 1000 / t : 0), n * 1000); },
        ctx.cancel_flag(), h.backend));
  }
  auto r = std::make_shared<TuneResult>();
  r->scope = 3;
  r->grid = grids[static_cast<size_t>(split.tuning[0])];
  // Per-head figures are a single prompt's: the set's grid has none (every cell's list is empty).
  r->grid.heads.clear();
  for (auto& rows : r->grid.head_mean)
    for (auto& row : rows)
      for (auto& cell : row) cell.clear();
  const auto over = [&](const std::vector<int>& prompts, int row, int col) {
    std::vector<double> v;
    for (int c : prompts) {
      const double x = grids[static_cast<size_t>(c)].mean[0][row][col];
      if (std::isfinite(x)) v.push_back(x);
    }
    return v;
  };
  const size_t R = g.rows.values.size(), C = g.cols.values.size();
  for (size_t row = 0; row < R; ++row)
    for (size_t col = 0; col < C; ++col) {
      const std::vector<double> v = over(split.tuning, int(row), int(col));
      const auto [mean, sd] = v.empty() ? std::pair<double, double>{NAN, NAN} : mean_std(v);
      r->grid.mean[0][row][col] = mean;
      r->grid.seed_std[0][row][col] = sd;
    }
  r->tuning_prompts = static_cast<int>(split.tuning.size());
  r->held_out_prompts = static_cast<int>(split.held_out.size());
  const auto held = [&](std::pair<int, int> cell) {
    if (cell.first < 0) return std::numeric_limits<double>::quiet_NaN();
    const std::vector<double> v = over(split.held_out, cell.first, cell.second);
    return v.empty() ? std::numeric_limits<double>::quiet_NaN() : mean_std(v).first;
  };
  r->held_out_best = held(r->grid.best(0));
  r->held_out_default = held(r->grid.default_cell());
  return r;
}

std::shared_ptr<const TuneResult> run_tuning(const TuneInput& in, const TuneHandles& h,
                                             JobContext& ctx, const JobPlan::PartialFn&) {
  const Grid2Spec g = grid_of(in);
  EvalSpec spec;
  spec.ratios = {in.keep_ratio};
  spec.seeds = in.seeds;
  spec.base_seed = in.seed;
  spec.sink = in.common.sink;
  spec.eval = in.common.eval;
  spec.estimator = parse_estimator(in.common.estimator);
  if (in.scope == 3) return run_set_tuning(in, h, g, spec, ctx);
  if (in.layer >= 0) spec.layers = {in.layer};
  if (in.kv_head >= 0) spec.heads = {in.kv_head};
  auto r = std::make_shared<TuneResult>();
  r->grid = run_grid2(
      *h.capture, spec, g, [&ctx](int d, int t) { ctx.progress(d, t); }, ctx.cancel_flag(),
      h.backend);
  r->scope = in.scope;
  return r;
}

}  // namespace

JobPlan ErrorView::plan_tuning(const AppState& s) const {
  JobPlan p;
  const Method* m = s.method(0);
  // Wanted while the tuning mode shows method A's grid (its axes are method A's).
  // Scope 3 runs on the set the Set view opened (its path is in the key), no capture needed.
  const int scope = tune_scope_;
  const Result& opened = s.result(kSetOpen);
  const auto set = scope == 3 && opened.fresh() ? opened.ptr<CaptureSet>() : nullptr;
  if (mode_ != 1 || !m || tune_method_ != m->name() || (!s.capture && !set)) return p;
  const CaptureInfo& ci = set ? set->shape : *s.info();
  const MethodSettings ms = s.method_settings(0);
  const Focus f = s.settings.focus;
  TuneInput in;
  in.common = s.eval_common();
  in.method = m->name();
  in.params = ms.params;
  in.keep_ratio = ms.keep_ratio;
  in.seed = static_cast<uint64_t>(s.settings.seed);
  in.rows = tune_rows_;
  in.row_values = row_values_;
  in.cols = tune_cols_;
  in.col_values = col_values_;
  in.seeds = tune_seeds_;
  in.scope = scope;
  in.layer = scope <= 1 ? f.layer : -1;
  in.kv_head = scope == 0 ? f.kv_head : -1;
  // The grid's size for the estimate (none when the values do not parse: the job says why).
  double cells = 0;
  try {
    const Grid2Spec g = grid_of(in);
    cells = static_cast<double>(g.rows.values.size() * g.cols.values.size());
  } catch (const InputError&) {
  }
  if (set) {
    // Each capture of the set gets the protocol's window (or the overrides), not the one fitted
    // to the capture open.
    in.set = set->source;
    in.common.sink = s.settings.sink_override;
    in.common.eval = s.settings.eval_override;
  }
  p.derive("tune", std::move(in), TuneHandles{s.capture, s.backend(), set}, &run_tuning);
  if (scope == 3 && !set) {
    p.waiting = "open a capture set in the Set view";
    return p;
  }
  p.lane = Lane::Analysis;
  p.label = "tuning grid";
  const double heads = scope == 0   ? 1.0
                       : scope == 1 ? ci.kv_heads
                       : scope == 2 ? static_cast<double>(ci.kv_heads) * ci.num_layers
                                    : static_cast<double>(ci.kv_heads) * ci.num_layers *
                                          static_cast<double>(set->entries.size());
  const EvalWindow w = set ? EvalWindow::fit(ci.num_tokens, ms.keep_ratio, s.settings.sink_override,
                                             s.settings.eval_override)
                                 .window
                           : s.window();
  p.cost_class = "eval:" + m->name();
  p.units = head_units(ci, w) * heads * (m->depends_on_seed() ? tune_seeds_ : 1) * cells;
  p.auto_limit_s = 3.0;
  return p;
}

void ErrorView::draw_grid_panel(const char* id, const Grid2Result& g,
                                const std::vector<std::vector<double>>& values, const char* what,
                                const char* bar_label, ImVec2 size) {
  ImGui::BeginGroup();
  const int R = static_cast<int>(g.rows.values.size()), C = static_cast<int>(g.cols.values.size());
  double lo = INFINITY, hi = -INFINITY;
  for (const auto& row : values)
    for (double v : row)
      if (std::isfinite(v)) lo = std::min(lo, v), hi = std::max(hi, v);
  if (!(hi > lo)) hi = lo + 1e-12;
  const float lh = ImGui::GetTextLineHeight();
  ImGui::TextUnformatted(what);
  const ImVec2 o = ImGui::GetCursorScreenPos();
  float label_w = ImGui::CalcTextSize(g.rows.name.c_str()).x;
  for (double v : g.rows.values) {
    char b[32];
    std::snprintf(b, sizeof b, "%g", v);
    label_w = std::max(label_w, ImGui::CalcTextSize(b).x);
  }
  label_w += px(8);
  const float bar_w = colour_bar_width(lo, hi, bar_label);
  const float map_w = std::max(px(60), size.x - label_w - bar_w - px(8));
  const float map_h = std::max(px(60), std::min(size.y - 3 * lh - px(16), map_w * 0.9f));
  ImDrawList* dl = ImGui::GetWindowDrawList();
  // Column header: the second parameter's name and values.
  dl->AddText(ImVec2(o.x, o.y), kColAxisText, (g.rows.name + " \\ " + g.cols.name).c_str());
  const float cw = map_w / static_cast<float>(C), ch = map_h / static_cast<float>(R);
  const float top = o.y + lh + px(4);
  for (int c = 0; c < C; ++c) {
    char b[32];
    std::snprintf(b, sizeof b, "%g", g.cols.values[static_cast<size_t>(c)]);
    const float tw = ImGui::CalcTextSize(b).x;
    dl->AddText(ImVec2(o.x + label_w + (c + 0.5f) * cw - tw / 2, top - lh - px(2) + lh),
                kColAxisText, b);
  }
  const float map_top = top + lh + px(2);
  for (int r = 0; r < R; ++r) {
    char b[32];
    std::snprintf(b, sizeof b, "%g", g.rows.values[static_cast<size_t>(r)]);
    dl->AddText(ImVec2(o.x + label_w - ImGui::CalcTextSize(b).x - px(6),
                       map_top + (r + 0.5f) * ch - lh / 2),
                kColAxisText, b);
  }
  ImGui::SetCursorScreenPos(ImVec2(o.x + label_w, map_top));
  auto colour = [&](int r, int c) {
    const double v = values[static_cast<size_t>(r)][static_cast<size_t>(c)];
    if (!std::isfinite(v)) return kColRefused;
    return colormap(Colormap::Viridis, (v - lo) / (hi - lo));
  };
  auto text = [&](int r, int c) {
    const double v = values[static_cast<size_t>(r)][static_cast<size_t>(c)];
    char b[32];
    std::snprintf(b, sizeof b, std::isfinite(v) ? "%.4f" : "failed", v);
    return std::string(b);
  };
  const HeatmapHit hit = heatmap(id, ImVec2(map_w, map_h), R, C, colour, text);
  auto outline = [&](std::pair<int, int> cell, ImU32 col, bool dashed) {
    if (cell.first < 0) return;
    const ImVec2 a(o.x + label_w + cell.second * cw + 1, map_top + cell.first * ch + 1);
    const ImVec2 b(a.x + cw - 2, a.y + ch - 2);
    if (!dashed) {
      dl->AddRect(a, b, col, 0, 0, px(3));
      return;
    }
    const float dash = px(6);
    const ImVec2 pts[5] = {a, ImVec2(b.x, a.y), b, ImVec2(a.x, b.y), a};
    for (int e = 0; e < 4; ++e) {
      const ImVec2 p = pts[e], q = pts[e + 1];
      const float len = std::hypot(q.x - p.x, q.y - p.y);
      for (float t = 0; t < len; t += 2 * dash) {
        const float t1 = std::min(len, t + dash);
        dl->AddLine(ImVec2(p.x + (q.x - p.x) * t / len, p.y + (q.y - p.y) * t / len),
                    ImVec2(p.x + (q.x - p.x) * t1 / len, p.y + (q.y - p.y) * t1 / len), col, px(2));
      }
    }
  };
  outline(g.best(0), IM_COL32(255, 255, 255, 255), false);
  outline(g.default_cell(), kColSelect, true);
  ImGui::SameLine(0, px(8));
  ImGui::SetCursorScreenPos(ImVec2(o.x + label_w + map_w + px(8), map_top - lh * 1.5f - 6));
  colour_bar((std::string(id) + "_bar").c_str(), ImVec2(bar_w, map_h + lh * 1.5f + 6),
             Colormap::Viridis, lo, hi, bar_label);
  ImGui::SetCursorScreenPos(ImVec2(o.x, map_top + map_h + px(4)));
  ImGui::TextDisabled("rows: %s, columns: %s", g.rows.name.c_str(), g.cols.name.c_str());
  if (hit.row >= 0) {
    ImGui::BeginTooltip();
    ImGui::Text("%s = %g, %s = %g", g.rows.name.c_str(), g.rows.values[hit.row],
                g.cols.name.c_str(), g.cols.values[hit.col]);
    ImGui::Text("mean %.5f, std over seeds %.5f", g.mean[0][hit.row][hit.col],
                g.seed_std[0][hit.row][hit.col]);
    ImGui::EndTooltip();
  }
  ImGui::EndGroup();
}

}  // namespace kvscope::app::error_view
