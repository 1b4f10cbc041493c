// Error view (docs/app.md): error against keep ratio per method (mean and spread over seeds, log2
// x axis), error per layer and head (heatmap), error against query position for the focused head,
// and exact vs approximate attention for one chosen query (weights over keys and output vector).

#include "app/views/view_error_view.h"

namespace kvscope::app::error_view {

const char* ErrorView::help() const {
  return "What compression costs: relative attention error vs keep ratio per method (mean and "
         "spread over seeds), per layer and kv head, vs query position, and exact vs "
         "approximate attention for one query. 'Tune two parameters' sweeps two of method A's "
         "parameters as heatmaps.";
}

bool ErrorView::ready(const AppState& s) const {
  if (!s.capture) return true;
  auto done = [&](const char* n) {
    const Result& r = s.result(n);
    return r.want.empty() || r.fresh() || (!r.held.empty() && r.held == r.want);
  };
  if (mode_ == 1) return done(kTune);
  return done(kSweep) && done(kFocusA) && done(kGrid) && !s.sweep_request().methods.empty() &&
         (!shows_set(s) || set_eval_settled(s));
}

void ErrorView::draw(AppState& s) {
  if (!s.info()) {
    ImGui::TextDisabled("No capture open.");
    return;
  }
  if (!presenting_view()) {  // a presentation shows the figures of the mode chosen
    ImGui::RadioButton("overview", &mode_, 0);
    toolbar_next(ImGui::GetFrameHeight() + labelled_width(0, "tune two parameters"));
    ImGui::RadioButton("tune two parameters", &mode_, 1);
  }
  if (mode_ == 1) {
    draw_tuning(s);
    return;
  }
  mark_figure_top();
  // Four panels, two by two; where two columns of readable plots do not fit (a projector's 2x
  // scale) one column, and the view scrolls rather than shrinking the plots.
  const ImVec2 avail = ImGui::GetContentRegionAvail();
  const float gap = px(8);
  const ImVec2 least = min_plot_size();
  // Presented, room beside a plot's data for its legend's column (the sweep's five methods), as
  // in Theory.
  const float room = presenting_view() ? 1.6f : 1.0f;
  const ImVec2 panel_least(room * least.x + px(40),
                           least.y + 4 * ImGui::GetFrameHeightWithSpacing());
  const bool two_columns = avail.x >= 2 * panel_least.x + gap;
  const float w2 = two_columns ? (avail.x - gap) / 2 : avail.x;
  const float h2 = std::max(panel_least.y, (avail.y - gap) / 2);
  // A switch, not a table of member-function pointers: GCC 12's UBSan instrumentation of
  // (this->*panels[i].draw)(s) at -O1 read an uninitialised copy of i for its bounds check
  // and stopped the sanitized app the first time this view was drawn (the soak test).
  const char* ids[] = {"##sweep", "##heat", "##position", "##query"};
  for (int i = 0; i < 4; ++i) {
    if (two_columns && i % 2 == 1) ImGui::SameLine(0, gap);
    ImGui::BeginChild(ids[i], ImVec2(w2, h2), true);
    switch (i) {
      case 0:
        draw_sweep(s);
        break;
      case 1:
        draw_heatmap(s);
        break;
      case 2:
        draw_positions(s);
        break;
      default:
        draw_query(s);
    }
    ImGui::EndChild();
  }
}

nlohmann::json ErrorView::export_json(const AppState& s) const {
  nlohmann::json j;
  if (s.sweep()) {
    nlohmann::json sum = nlohmann::json::array();
    for (const EvalSummary& e : s.sweep()->summary())
      sum.push_back({{"method", e.method},
                     {"ratio", e.ratio},
                     {"mean", e.mean},
                     {"std", e.std},
                     {"heads", e.heads},
                     {"harm_kept", finite_or_null(e.harm_kept)},
                     {"harm_dropped", finite_or_null(e.harm_dropped)},
                     {"harm_dropped_share", finite_or_null(e.harm_dropped_share)}});
    j["sweep_summary"] = sum;
    j["sweep_stale"] = s.result(kSweep).stale();
    j["sweep_report"] = s.sweep()->to_json();
  }
  j["grid"] = grid_json(s);
  j["overlap"] = overlap_json(s);
  j["sweep_status"] = {{"running", s.result(kSweep).busy()},
                       {"held_for_run", !s.result(kSweep).held.empty()},
                       {"estimate_s", s.result(kSweep).estimate_s},
                       {"error", s.result(kSweep).error}};
  nlohmann::json runs = nlohmann::json::array();
  for (int k = 0; k < 2; ++k) {
    if (!s.run(k)) continue;
    std::vector<double> x, y;
    per_position(*s.run(k), &x, &y);
    runs.push_back({{"method", s.method_name(k)}, {"position", x}, {"relative_error", y}});
  }
  j["focused_head"] = {{"layer", s.settings.focus.layer},
                       {"kv_head", s.settings.focus.kv_head},
                       {"by_position", runs}};
  if (s.query_cmp()) {
    const QueryComparison& q = *s.query_cmp();
    j["query"] = {{"position", q.position},
                  {"q_head", q.q_head},
                  {"exact_weights", q.exact_weights},
                  {"approx_weights", q.approx_weights},
                  {"exact_output", q.exact_output},
                  {"approx_output", q.approx_output},
                  {"relative_error", q.relative_error}};
  }
  if (shows_set(s)) {  // the sweep panel's figures over the set's prompts
    const Result& r = s.result(kSetEval);
    if (const SetEvalReport* rep = r.get<SetEvalReport>()) {
      nlohmann::json rows = nlohmann::json::array();
      for (const SetRow& row : rep->summary())
        if (row.layer == kAllLayers)
          rows.push_back({{"method", row.method},
                          {"ratio", rep->captures.at(0).spec.ratios.at(row.column)},
                          {"mean", row.mean},
                          {"ci_low", row.ci_low},
                          {"ci_high", row.ci_high},
                          {"prompts", row.prompts}});
      j["set_sweep"] = {{"rows", rows}, {"fresh", r.fresh()}};
    }
  }
  if (const TuneResult* t = s.result(kTune).get<TuneResult>()) {
    j["tuning"] = t->grid.to_json();
    if (t->scope == 3) {
      const auto num = [](double v) {
        return std::isnan(v) ? nlohmann::json() : nlohmann::json(v);
      };
      j["tuning"]["set"] = {{"tuning_prompts", t->tuning_prompts},
                            {"held_out_prompts", t->held_out_prompts},
                            {"held_out_best", num(t->held_out_best)},
                            {"held_out_default", num(t->held_out_default)}};
    }
  }
  if (j.is_null()) return nullptr;
  return j;
}

nlohmann::json ErrorView::save_state() const {
  return {{"log_attention", log_attention_},
          {"heatmap_method", heat_source_.first},
          {"heatmap_ratio", heat_source_.second},
          {"mode", mode_ == 1 ? "tune" : "overview"},
          {"sweep_y", sweep_y_ == 2   ? "set"
                      : sweep_y_ == 1 ? "harm"
                                      : "error"},
          {"tune",
           {{"method", tune_method_},  // the method whose parameters the axes name
            {"rows", tune_rows_},
            {"row_values", row_values_},
            {"cols", tune_cols_},
            {"col_values", col_values_},
            {"seeds", tune_seeds_},
            {"scope", tune_scope_}}}};
}

void ErrorView::load_state(const nlohmann::json& j) {
  // Every field is checked before anything changes; a wrong one throws InputError naming it
  // ("session field \"views.error.tune.seeds\": ..."), and AppUi::load_session refuses the
  // session.
  const JsonField f(j, "session", "views.error");
  const bool log_attention = f.get("log_attention", log_attention_);
  std::pair<std::string, double> heat{f.get("heatmap_method", ""), f.get("heatmap_ratio", 0.0)};
  const std::string mode = f.get("mode", "overview");
  const std::string sweep_y = f.get("sweep_y", "error");
  if (sweep_y != "error" && sweep_y != "harm" && sweep_y != "set")
    f.at("sweep_y").fail("'" + sweep_y + "' is not error, harm or set");
  if (mode != "overview" && mode != "tune")
    f.at("mode").fail("'" + mode + "' is not overview or tune");
  std::string method = tune_method_, rows = tune_rows_, row_values = row_values_, cols = tune_cols_,
              col_values = col_values_;
  int seeds = tune_seeds_, scope = tune_scope_;
  if (const std::optional<JsonField> t = f.find("tune")) {
    method = t->get("method", method);
    rows = t->get("rows", rows);
    row_values = t->get("row_values", row_values);
    cols = t->get("cols", cols);
    col_values = t->get("col_values", col_values);
    seeds = t->get("seeds", seeds, 1, 10);
    scope = t->get("scope", scope, 0, 3);
  }
  log_attention_ = log_attention;
  heat_source_ = std::move(heat);
  mode_ = mode == "tune" ? 1 : 0;
  sweep_y_ = sweep_y == "set" ? 2 : sweep_y == "harm" ? 1 : 0;
  tune_method_ = std::move(method);
  tune_rows_ = std::move(rows);
  row_values_ = std::move(row_values);
  tune_cols_ = std::move(cols);
  col_values_ = std::move(col_values);
  tune_seeds_ = seeds;
  tune_scope_ = scope;
}

std::string ErrorView::export_csv(const AppState& s) const {
  if (!s.sweep()) return {};
  std::ostringstream o;
  o << "method,keep_ratio,relative_error_mean,relative_error_std,heads\n";
  for (const EvalSummary& e : s.sweep()->summary())
    o << e.method << "," << e.ratio << "," << e.mean << "," << e.std << "," << e.heads << "\n";
  return o.str();
}

void ErrorView::plan(const AppState& s, std::vector<NamedPlan>& out) const {
  out.emplace_back(kTune, plan_tuning(s));
  if (mode_ == 0 && shows_set(s)) plan_set_eval(s, out);
  // The A/B overlap while the heatmap shows it.
  out.emplace_back(kOverlap,
                   mode_ == 0 && heat_source_ == kOverlapSource ? plan_overlap(s) : JobPlan{});
}

// The sweep's toolbar: methods, ratio preset, seeds, the y combo and the focused-layer switch; a
// change becomes the sweep setting.
void ErrorView::draw_sweep_toolbar(AppState& s) {
  // The controls show the sweep asked for (the default until the user changes it); a change
  // makes it the setting.
  const SweepRequest asked = s.sweep_request();
  SweepRequest req = asked;
  if (ImGui::Button("methods...")) ImGui::OpenPopup("##methods");
  if (ImGui::BeginPopup("##methods")) {
    for (const Method* m : app_methods()) {
      bool on = std::find(req.methods.begin(), req.methods.end(), m->name()) != req.methods.end();
      if (method_checkbox(s, *m, &on, "sweep:method:" + m->name())) {
        if (on)
          req.methods.push_back(m->name());
        else
          req.methods.erase(std::find(req.methods.begin(), req.methods.end(), m->name()));
      }
    }
    ImGui::EndPopup();
  }
  // The keep ratios swept: the protocol's, or kvpress's (keep 3/4 .. 1/8: it counts the
  // fraction removed, 0.25 .. 0.875).
  {
    const std::vector<double>& kvp = *parse_ratio_preset("kvpress");
    const char* names[] = {"protocol ratios", "kvpress ratios"};
    int preset = req.ratios == kvp ? 1 : 0;
    toolbar_next(px(150));
    ImGui::SetNextItemWidth(px(150));
    if (ImGui::Combo("##sweep_ratios", &preset, names, 2))
      req.ratios = *parse_ratio_preset(preset == 1 ? "kvpress" : "protocol");
    record_item(s, "sweep:ratios");
  }
  toolbar_next(labelled_width(px(90), "seeds"));
  ImGui::SetNextItemWidth(fit_width(90, "seeds"));
  ImGui::SliderInt("seeds", &req.seeds, 1, 10);
  // Why a method loses, per token: the share of the middle's harm (each token's exact output
  // change when evicted alone, engine/eval/token_harm.h) that the method dropped.
  // With a capture set open: methods A and B over the set's prompts, with the 95% interval.
  {
    const char* ys[] = {"relative error", "harm dropped", "over the set's prompts"};
    const int y = shows_set(s) ? 2 : std::min(sweep_y_, 1);
    // As wide as the choice shown, so that "over the set's prompts" is read whole.
    const float w = std::max(px(140), ImGui::CalcTextSize(ys[y]).x + ImGui::GetFrameHeight() +
                                          2 * ImGui::GetStyle().FramePadding.x);
    toolbar_next(w);
    ImGui::SetNextItemWidth(w);
    if (ImGui::BeginCombo("##sweep_y", ys[y])) {
      for (int i = 0; i < (s.set_path.empty() ? 2 : 3); ++i) {
        if (ImGui::Selectable(ys[i], i == y)) sweep_y_ = i;
        record_item(s, std::string("combo:sweep y:") + ys[i]);
      }
      ImGui::EndCombo();
    }
    record_item(s, "sweep:y");
  }
  toolbar_next(ImGui::GetFrameHeight() + labelled_width(0, "focused layer only"));
  ImGui::Checkbox("focused layer only", &req.focused_layer_only);
  if (req != asked) s.settings.sweep = req;
}

// The sweep's curves from its summary, in the order the methods were asked for: mean over heads,
// spread = std over seeds of the head mean (or, for the harm, the share dropped).
std::vector<ErrorView::SweepSeries> ErrorView::sweep_series(const AppState& s,
                                                            std::vector<double>* all_y,
                                                            std::vector<double>* ratios) const {
  const SweepRequest asked = s.sweep_request();
  std::vector<SweepSeries> series;
  if (s.sweep()) {
    std::map<std::string, SweepSeries> by;
    for (const EvalSummary& e : s.sweep()->summary()) {
      if (sweep_y_ == 1) {  // harm dropped: share of the middle's total, no spread
        if (e.heads == 0 || std::isnan(e.harm_dropped_share)) continue;
        SweepSeries& sr = by[e.method];
        sr.method = e.method;
        sr.x.push_back(e.ratio);
        sr.y.push_back(e.harm_dropped_share);
        sr.sd.push_back(e.harm_kept);  // shown in the tooltip as the harm kept
        sr.lo.push_back(e.harm_dropped_share);
        sr.hi.push_back(e.harm_dropped);  // the tooltip's harm dropped
        ratios->push_back(e.ratio);
        all_y->push_back(e.harm_dropped_share);
        continue;
      }
      SweepSeries& sr = by[e.method];
      sr.method = e.method;
      sr.x.push_back(e.ratio);
      sr.y.push_back(e.mean);
      sr.sd.push_back(e.std);
      sr.lo.push_back(std::max(e.mean - e.std, e.mean * 0.05));
      sr.hi.push_back(e.mean + e.std);
      all_y->push_back(sr.lo.back());
      all_y->push_back(sr.hi.back());
      ratios->push_back(e.ratio);
    }
    for (const std::string& m : asked.methods)
      if (by.count(m)) {
        SweepSeries sr = by[m];
        std::vector<size_t> ord(sr.x.size());
        for (size_t i = 0; i < ord.size(); ++i) ord[i] = i;
        std::sort(ord.begin(), ord.end(), [&](size_t a, size_t b) { return sr.x[a] < sr.x[b]; });
        SweepSeries sorted;
        sorted.method = m;
        for (size_t i : ord) {
          sorted.x.push_back(sr.x[i]);
          sorted.y.push_back(sr.y[i]);
          sorted.lo.push_back(sr.lo[i]);
          sorted.hi.push_back(sr.hi[i]);
          sorted.sd.push_back(sr.sd[i]);
        }
        series.push_back(sorted);
      }
  }
  return series;
}

void ErrorView::draw_sweep(AppState& s) {
  // Presented, the sweep's settings go (one F11 away): at 2x their three rows took half of the
  // panel, leaving the curves 100 px.
  if (!presenting_view()) draw_sweep_toolbar(s);
  if (shows_set(s)) {
    draw_set_sweep(s);
    return;
  }
  draw_result_status(s, kSweep, "sweep");
  std::vector<double> all_y, ratios;
  const std::vector<SweepSeries> series = sweep_series(s, &all_y, &ratios);
  double ylo = 1e-3, yhi = 1;
  std::vector<double> pos;
  for (double v : all_y)
    if (v > 0 && std::isfinite(v)) pos.push_back(v);
  if (!pos.empty()) {
    ylo = *std::min_element(pos.begin(), pos.end()) / 1.3;
    yhi = *std::max_element(pos.begin(), pos.end()) * 1.3;
  }
  double xlo = 1.0 / 16, xhi = 0.5;
  if (!ratios.empty()) {
    xlo = *std::min_element(ratios.begin(), ratios.end());
    xhi = *std::max_element(ratios.begin(), ratios.end());
  }
  Axis xa{"keep ratio (log2 axis)", xlo / 1.25, xhi * 1.25, Scale::Log2, true};
  Axis ya{"relative error", ylo, yhi, Scale::Log10};
  if (sweep_y_ == 1) ya = Axis{"share of the middle's harm dropped", 0.0, 1.0, Scale::Linear};
  const Result& res = s.result(kSweep);
  std::string title =
      s.sweep() ? "error vs keep ratio: mean over heads, band = +-1 std over " +
                      std::to_string(s.sweep()->spec.seeds) + " seeds"
                : (res.busy() ? "error vs keep ratio (running...)" : "error vs keep ratio");
  if (sweep_y_ == 1)
    title =
        "harm dropped vs keep ratio: share of the middle's per-token harm (exact output change "
        "of evicting each token alone) a method dropped, mean over heads";
  // Curves computed for other settings stay visible, faded and labelled stale.
  const bool stale = res.stale();
  if (stale) title += "  [STALE: earlier settings]";
  Plot plot("##sweepplot", ImVec2(0, 0), title, xa, ya);
  std::vector<Plot::LegendEntry> legend;
  // Legends name the parameters the sweep ran with (its own record, not the settings now).
  const std::map<std::string, ParamValues> sweep_params =
      s.sweep() ? s.sweep()->spec.params : std::map<std::string, ParamValues>{};
  std::vector<std::string> drawn;
  for (const SweepSeries& sr : series) drawn.push_back(sr.method);
  const MethodColours colours(drawn);
  for (const SweepSeries& sr : series) {
    if (sweep_y_ == 1) break;  // no spread band for the harm
    ImU32 c = colours(sr.method);
    plot.band(sr.x, sr.lo, sr.hi, with_alpha(c, stale ? 0.08f : 0.18f));
  }
  for (const SweepSeries& sr : series) {
    ImU32 c = colours(sr.method);
    if (stale) c = with_alpha(c, 0.4f);
    plot.line(sr.x, sr.y, c, 2.0f);
    plot.markers(sr.x, sr.y, c, 3.5f);
    const auto pit = sweep_params.find(sr.method);
    legend.push_back(
        {method_label(sr.method, pit == sweep_params.end() ? ParamValues{} : pit->second), c});
  }
  // Errors are largest at small ratios (top left): the legend goes bottom left.
  plot.legend(legend, Plot::Corner::BottomLeft);
  if (plot.hovered() && !series.empty()) {
    int i = plot.nearest_x(series[0].x);
    if (i >= 0) {
      double r = series[0].x[static_cast<size_t>(i)];
      plot.vline(r, IM_COL32(255, 255, 255, 90));
      ImGui::BeginTooltip();
      ImGui::Text("keep ratio %s", ratio_label(r).c_str());
      for (const SweepSeries& sr : series)
        for (size_t t = 0; t < sr.x.size(); ++t)
          if (std::fabs(sr.x[t] - r) < 1e-12) {
            const ImVec4 col = ImGui::ColorConvertU32ToFloat4(colours(sr.method));
            if (sweep_y_ == 1)
              ImGui::TextColored(col, "%-16s harm kept %.4g, dropped %.4g (%.0f%%)",
                                 sr.method.c_str(), sr.sd[t], sr.hi[t], 100 * sr.y[t]);
            else
              ImGui::TextColored(col, "%-16s %.4f +- %.4f", sr.method.c_str(), sr.y[t], sr.sd[t]);
          }
      ImGui::EndTooltip();
    }
  }
}

bool ErrorView::shows_set(const AppState& s) const {
  return sweep_y_ == 2 && !s.set_path.empty();
}

// Error against keep ratio over the set's prompts (the keep ratios the sweep asks for, and the
// current one), methods A and B, the 95% interval across prompts as a band.
void ErrorView::draw_set_sweep(AppState& s) {
  draw_result_status(s, kSetEval, "the set's evaluation");
  const Result& r = s.result(kSetEval);
  if (!r.error.empty() && r.key == r.want) ImGui::TextColored(kTextError, "%s", r.error.c_str());
  set_figures_.update(s);
  if (!set_figures_.report) return;
  if (r.stale()) ImGui::TextDisabled("[STALE: earlier settings]");
  set_figures_.draw_plot(s, "##setsweep");
}

void ErrorView::draw_heatmap(AppState& s) {
  // Source: the background grid (method A at the current ratio) or any (method, ratio) of
  // the sweep.
  std::vector<std::pair<std::string, double>> options;
  if (s.sweep())
    for (const EvalSummary& e : s.sweep()->summary()) options.emplace_back(e.method, e.ratio);
  auto label = [](const std::pair<std::string, double>& o) {
    return o.first + " at " + ratio_label(o.second) + " (sweep)";
  };
  bool from_sweep = false;
  for (const auto& o : options) from_sweep = from_sweep || o == heat_source_;
  // The grid holds method B's cells too (app/grid_cells.h): "B" picks them.
  const bool grid_b = !from_sweep && heat_source_.first == "B" && s.settings.ab_enabled;
  // The grid's A/B mode also shows how far A and B keep the same tokens (app/overlap_grid.h).
  const bool overlap = !from_sweep && heat_source_ == kOverlapSource && s.settings.ab_enabled;
  auto grid_label = [&](int k) {
    return std::string(k ? "B: " : "A: ") + s.method_name(k) + " at " +
           ratio_label(s.settings.keep_ratio) + " (grid)";
  };
  const std::string overlap_label = "A/B overlap of kept sets (Jaccard)";
  std::string current = from_sweep ? label(heat_source_)
                        : overlap  ? overlap_label
                                   : grid_label(grid_b ? 1 : 0);
  ImGui::TextUnformatted("error per layer and kv head");
  toolbar_next(px(160));
  ImGui::SetNextItemWidth(-1);
  if (ImGui::BeginCombo("##heatsrc", current.c_str())) {
    if (ImGui::Selectable(grid_label(0).c_str(), !from_sweep && !grid_b && !overlap))
      heat_source_ = {};
    if (s.settings.ab_enabled && ImGui::Selectable(grid_label(1).c_str(), grid_b))
      heat_source_ = {"B", -1.0};
    if (s.settings.ab_enabled && ImGui::Selectable(overlap_label.c_str(), overlap))
      heat_source_ = kOverlapSource;
    record_item(s, "error:heat:overlap");
    for (const auto& o : options)
      if (ImGui::Selectable(label(o).c_str(), from_sweep && o == heat_source_)) heat_source_ = o;
    ImGui::EndCombo();
  }
  GridValues gv =
      from_sweep ? grid_values_from_report(s, *s.sweep(), heat_source_.first, heat_source_.second)
      : overlap  ? overlap_grid_values(s)
                 : grid_values(s, GridMetric::Error, grid_b ? 1 : 0);
  if (overlap) draw_result_status(s, kOverlap, "overlap");
  ImGui::PushStyleColor(ImGuiCol_Text, ImGui::GetStyleColorVec4(ImGuiCol_TextDisabled));
  ImGui::TextWrapped("%s", gv.caption.c_str());
  ImGui::PopStyleColor();
  draw_grid(s, gv, "##errgrid", 10000.0f);
}

void ErrorView::draw_positions(AppState& s) {
  std::vector<std::vector<double>> xs(2), ys(2);
  std::vector<double> all;
  double xmin = 0, xmax = 1;
  for (int k = 0; k < 2; ++k)
    if (s.run(k) && (k == 0 || s.settings.ab_enabled)) {
      per_position(*s.run(k), &xs[k], &ys[k]);
      for (double v : ys[k])
        if (v > 0 && std::isfinite(v)) all.push_back(v);
      if (!xs[k].empty()) {
        xmin = xs[k].front();
        xmax = xs[k].back();
      }
    }
  double ylo = 1e-3, yhi = 1;
  if (!all.empty()) {
    ylo = *std::min_element(all.begin(), all.end()) / 1.3;
    yhi = *std::max_element(all.begin(), all.end()) * 1.3;
  }
  char title[160];
  std::snprintf(title, sizeof title, "error vs query position (L%d H%d, mean over the GQA group)",
                s.settings.focus.layer, s.settings.focus.kv_head);
  Plot plot("##posplot", ImVec2(0, 0), title,
            Axis{"query position j (token index)", xmin - 0.5, xmax + 0.5},
            Axis{"relative error", ylo, yhi, Scale::Log10});
  std::vector<Plot::LegendEntry> legend;
  for (int k = 0; k < 2; ++k) {
    if (xs[k].empty()) continue;
    plot.line(xs[k], ys[k], kColSlot[k], 1.5f);
    legend.push_back(
        {std::string(k == 0 ? "A " : "B ") +
             method_label(s.method_name(k), s.settings.method[static_cast<size_t>(k)].params),
         kColSlot[k]});
  }
  int q = s.effective_query();
  plot.vline(q, kColQuery, 1.5f);
  plot.legend(legend);
  if (plot.hovered() && !xs[0].empty()) {
    int i = plot.nearest_x(xs[0]);
    if (i >= 0) {
      int j = static_cast<int>(xs[0][static_cast<size_t>(i)]);
      plot.vline(j, IM_COL32(255, 255, 255, 90));
      ImGui::BeginTooltip();
      ImGui::Text("query %d \"%s\"", j, s.token_text(j).c_str());
      for (int k = 0; k < 2; ++k)
        if (static_cast<size_t>(i) < ys[k].size())
          ImGui::Text("%s %s: %.4f", k == 0 ? "A" : "B", s.method_name(k).c_str(),
                      ys[k][static_cast<size_t>(i)]);
      ImGui::TextDisabled("click: compare exact and approximate attention for this query");
      ImGui::EndTooltip();
      if (plot.clicked()) {
        s.settings.selected_query = j;
      }
    }
  }
  if (!s.run_error(0).empty())
    plot.draw_list()->AddText(ImVec2(plot.inner_min().x + 8, plot.inner_min().y + 8),
                              IM_COL32(255, 120, 120, 255), s.run_error(0).c_str());
}

void ErrorView::draw_query(AppState& s) {
  if (!s.info()->has_queries) {
    ImGui::TextWrapped("This capture has no queries: exact attention needs them.");
    return;
  }
  int group = s.info()->group_size();
  if (group > 1) {
    ImGui::SetNextItemWidth(px(80));
    ImGui::SliderInt("query head", &s.settings.selected_q_head, 0, group - 1);
    if (ImGui::IsItemHovered()) ImGui::SetTooltip("query head within the GQA group");
  }
  char qtext[160];
  std::snprintf(qtext, sizeof qtext, "query %d \"%s\"", s.effective_query(),
                s.token_text(s.effective_query()).c_str());
  if (group > 1) toolbar_next(ImGui::CalcTextSize(qtext).x);
  ImGui::TextDisabled("%s", qtext);
  toolbar_next(ImGui::GetFrameHeight() + labelled_width(0, "log scale"));
  ImGui::Checkbox("log scale", &log_attention_);
  if (!s.query_cmp()) {
    if (!s.result(kQuery).error.empty())
      ImGui::TextColored(ImVec4(1, 0.45f, 0.45f, 1), "%s", s.result(kQuery).error.c_str());
    else
      ImGui::TextDisabled("computing...");
    return;
  }
  const QueryComparison& qc = *s.query_cmp();
  ImVec2 avail = ImGui::GetContentRegionAvail();
  // The attention plot over the output plot; each at least a readable plot (the panel scrolls).
  const float top_h = std::max(avail.y * 0.55f, min_plot_size().y);
  {
    const size_t n = qc.exact_weights.size();
    std::vector<double> x(n);
    for (size_t i = 0; i < n; ++i) x[i] = static_cast<double>(i);
    double ymax = 0, ymin_pos = 1;
    for (size_t i = 0; i < n; ++i) {
      ymax = std::max({ymax, qc.exact_weights[i], qc.approx_weights[i]});
      if (qc.exact_weights[i] > 0) ymin_pos = std::min(ymin_pos, qc.exact_weights[i]);
    }
    char title[200];
    std::snprintf(title, sizeof title,
                  "attention of query %d (q head %d) over keys: rel. error %.4g", qc.position,
                  qc.q_head, qc.relative_error);
    // Log scale by default: a few keys (sinks, the query itself) take most of the mass and
    // would flatten everything else on a linear axis.
    Axis ya = log_attention_
                  ? Axis{"weight (log)", std::max(ymin_pos, 1e-7) / 2, ymax * 2, Scale::Log10}
                  : Axis{"weight", 0, ymax * 1.1};
    Plot plot("##attn", ImVec2(0, top_h), title, Axis{"key position", -0.5, n - 0.5}, ya);
    plot.bars(x, qc.exact_weights, 1.0, with_alpha(kColExact, 0.55f));
    // Dots: dropped keys have no approximate weight, so a line would mislead.
    std::vector<double> kx, ky;
    for (size_t i = 0; i < n; ++i)
      if (qc.approx_weights[i] > 0) {
        kx.push_back(x[i]);
        ky.push_back(qc.approx_weights[i]);
      }
    plot.markers(kx, ky, kColSlot[0], 2.0f);
    plot.legend(
        {{"exact softmax", with_alpha(kColExact, 0.8f)}, {"approx (A): w e^s / sum", kColSlot[0]}});
    int i = plot.nearest_x(x);
    if (i >= 0) {
      s.hovered_token = i;
      plot.vline(i, IM_COL32(255, 255, 255, 90));
      ImGui::SetTooltip("key %d \"%s\"\nexact %.4g\napprox %.4g", i, s.token_text(i).c_str(),
                        qc.exact_weights[static_cast<size_t>(i)],
                        qc.approx_weights[static_cast<size_t>(i)]);
    }
  }
  {
    const size_t d = qc.exact_output.size();
    std::vector<double> xe(d), xa(d);
    double lo = 0, hi = 0;
    for (size_t c = 0; c < d; ++c) {
      xe[c] = c - 0.2;
      xa[c] = c + 0.2;
      lo = std::min({lo, qc.exact_output[c], qc.approx_output[c]});
      hi = std::max({hi, qc.exact_output[c], qc.approx_output[c]});
    }
    double pad = (hi - lo) * 0.1 + 1e-9;
    Plot plot("##out", ImVec2(0, 0), "output vector: exact Attn_j vs approximation z_j",
              Axis{"value dimension", -0.7, d - 0.3}, Axis{"value", lo - pad, hi + pad});
    plot.hline(0, kColAxisText);
    // Bars grow from the zero line: draw them as thin rectangles by hand for negative values.
    for (size_t c = 0; c < d; ++c) {
      for (int k = 0; k < 2; ++k) {
        double xc = k == 0 ? xe[c] : xa[c];
        double v = k == 0 ? qc.exact_output[c] : qc.approx_output[c];
        ImVec2 a = plot.to_screen(xc - 0.18, std::max(v, 0.0)),
               b = plot.to_screen(xc + 0.18, std::min(v, 0.0));
        plot.draw_list()->AddRectFilled(a, b, k == 0 ? with_alpha(kColExact, 0.7f) : kColSlot[0]);
        plot.note_drawn({a, b, ImVec2(a.x, b.y), ImVec2(b.x, a.y),
                         ImVec2((a.x + b.x) / 2, (a.y + b.y) / 2)});  // the legend avoids it
      }
    }
    plot.legend({{"exact", kColExact}, {"approx (A)", kColSlot[0]}});
    int c = plot.nearest_x(std::vector<double>(xe.begin(), xe.end()));
    if (c >= 0)
      ImGui::SetTooltip("dimension %d\nexact %.5g\napprox %.5g", c,
                        qc.exact_output[static_cast<size_t>(c)],
                        qc.approx_output[static_cast<size_t>(c)]);
  }
}

}  // namespace kvscope::app::error_view

namespace kvscope::app {

std::unique_ptr<View> make_error_view() {
  return std::make_unique<error_view::ErrorView>();
}

}  // namespace kvscope::app
