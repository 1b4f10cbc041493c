#include "app/grid_values.h"

#include <imgui.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "app/plot.h"
#include "app/result_status.h"

namespace kvscope::app {

namespace {

// Empty cells shaped like the capture's layer x kv-head grid.
GridValues empty_grid(const CaptureInfo& ci) {
  GridValues gv;
  gv.layers = ci.num_layers;
  gv.heads = ci.kv_heads;
  const size_t cells = static_cast<size_t>(gv.layers * gv.heads);
  gv.mean.assign(cells, NAN);
  gv.spread.assign(cells, NAN);
  gv.note.assign(cells, "");
  gv.missing.assign(cells, 0);
  return gv;
}

// Cells of `method` at `ratio` from a report; cells the report does not cover are `missing`.
void fill_from_report(GridValues& gv, const EvalReport& rep, const std::string& method,
                      double ratio) {
  std::fill(gv.missing.begin(), gv.missing.end(), 1);
  for (const HeadEval& h : rep.results) {
    if (h.method != method || std::fabs(h.ratio - ratio) > 1e-12) continue;
    if (h.layer < 0 || h.layer >= gv.layers || h.kv_head < 0 || h.kv_head >= gv.heads) continue;
    size_t i = static_cast<size_t>(h.layer * gv.heads + h.kv_head);
    gv.mean[i] = h.refused ? NAN : h.mean;
    gv.spread[i] = h.refused ? NAN : h.std;
    gv.note[i] = h.note;
    gv.missing[i] = 0;
  }
}

}  // namespace

void finish_range(GridValues& gv) {
  std::vector<double> finite;
  for (double v : gv.mean)
    if (std::isfinite(v)) finite.push_back(v);
  gv.have_values = !finite.empty();
  if (gv.have_values) {
    gv.vmin = *std::min_element(finite.begin(), finite.end());
    gv.vmax = *std::max_element(finite.begin(), finite.end());
    if (gv.vmax - gv.vmin < 1e-12) {
      gv.vmin -= 0.5 * std::max(1e-6, std::fabs(gv.vmin));
      gv.vmax += 0.5 * std::max(1e-6, std::fabs(gv.vmax));
    }
  }
}

GridValues grid_values_from_report(const AppState& s, const EvalReport& rep,
                                   const std::string& method, double ratio) {
  const CaptureInfo* ci = s.info();
  if (!ci) return {};
  GridValues gv = empty_grid(*ci);
  gv.unit = "rel. error";
  gv.map = Colormap::Viridis;
  fill_from_report(gv, rep, method, ratio);
  char buf[256];
  const auto pit = rep.spec.params.find(method);
  const std::string label =
      method_label(method, pit == rep.spec.params.end() ? ParamValues{} : pit->second);
  std::snprintf(buf, sizeof buf, "%s at keep ratio %s (sweep): relative error, mean of %d seed%s",
                label.c_str(), ratio_label(ratio).c_str(), rep.spec.seeds,
                rep.spec.seeds == 1 ? "" : "s");
  gv.caption = buf;
  finish_range(gv);
  return gv;
}

GridValues grid_values(const AppState& s, GridMetric metric, int slot) {
  const CaptureInfo* ci = s.info();
  if (!ci) return {};
  GridValues gv = empty_grid(*ci);
  const size_t cells = gv.mean.size();
  if (metric == GridMetric::Entropy) {
    gv.unit = "nats";
    gv.map = Colormap::Magma;
    if (!ci->has_queries) {
      gv.caption = "attention entropy needs queries; this capture has none";
    } else if (!s.entropy()) {
      gv.caption = s.result(kEntropy).busy() ? "computing attention entropy..." : "no entropy yet";
    } else {
      gv.caption = "mean attention entropy of the evaluation queries (nats)";
      if (s.result(kEntropy).stale()) gv.caption += " [stale]";
      const EntropyGrid& eg = *s.entropy();
      if (eg.layers == gv.layers && eg.heads == gv.heads)
        for (size_t i = 0; i < cells && i < eg.values.size(); ++i) gv.mean[i] = eg.values[i];
    }
  } else {
    gv.unit = "rel. error";
    gv.map = Colormap::Viridis;
    const Result& r = s.result(kGrid);
    const GridReport* grid = s.grid_report();
    const size_t k = slot == 1 ? 1 : 0;
    if (!r.error.empty()) {
      gv.caption = "grid failed: " + r.error;
    } else if (!grid || grid->methods[k].empty()) {
      gv.caption = r.busy() ? "running " + s.method_name(static_cast<int>(k)) + " on every head..."
                            : "no grid yet";
    } else {
      // The method as the grid computed it, non-default parameters named.
      const std::string label = method_label(grid->methods[k], grid->params[k]);
      const double ratio =
          grid->report.spec.ratios.empty() ? s.settings.keep_ratio : grid->report.spec.ratios[0];
      char buf[320];
      std::snprintf(buf, sizeof buf, "%s%s at keep ratio %s: relative error, mean of %d seed%s%s",
                    k == 1 ? "B: " : "", label.c_str(), ratio_label(ratio).c_str(), grid->seeds,
                    grid->seeds == 1 ? "" : "s", r.stale() ? " [stale: earlier settings]" : "");
      gv.caption = buf;
      if (grid->slot_done[k] < grid->slot_total[k]) {  // this method's runs, not both
        std::snprintf(buf, sizeof buf, " [%d of %d seed runs so far]", grid->slot_done[k],
                      grid->slot_total[k]);
        gv.caption += buf;
      }
      gv.seeds = grid->seeds;
      gv.state.assign(cells, static_cast<uint8_t>(CellState::Missing));
      gv.seeds_done.assign(cells, 0);
      std::fill(gv.missing.begin(), gv.missing.end(), 1);
      if (grid->report.info.num_layers == gv.layers && grid->report.info.kv_heads == gv.heads)
        for (size_t i = 0; i < grid->entries.size() && i < grid->report.results.size(); ++i) {
          const GridEntry& e = grid->entries[i];
          const HeadEval& h = grid->report.results[i];
          if (e.slot != static_cast<int>(k) || e.state == CellState::Missing) continue;
          if (h.layer < 0 || h.layer >= gv.layers || h.kv_head < 0 || h.kv_head >= gv.heads)
            continue;
          const size_t c = static_cast<size_t>(h.layer * gv.heads + h.kv_head);
          const bool bad = h.refused || !h.error.empty();
          gv.mean[c] = bad ? NAN : h.mean;
          gv.spread[c] = bad || e.seeds_done < 2 ? NAN : h.std;
          gv.note[c] = h.error.empty() ? h.note : h.error;
          // This head's own count where it is not m: a wrapper's per-head budget (adakv), or
          // a method that keeps less (a walk's halvings).
          if (!bad && h.kept != h.budget)
            gv.note[c] += (gv.note[c].empty() ? "" : "\n") + std::string("kept ") +
                          std::to_string(h.kept) + " of m = " + std::to_string(h.budget) +
                          " middle tokens";
          gv.missing[c] = 0;
          gv.state[c] = static_cast<uint8_t>(e.state);
          gv.seeds_done[c] = e.seeds_done;
        }
    }
  }
  finish_range(gv);
  return gv;
}

void draw_grid(AppState& s, const GridValues& gv, const char* id, float max_height) {
  if (gv.layers <= 0 || gv.heads <= 0) return;
  ImGui::PushID(id);
  const float lh = ImGui::GetTextLineHeight();
  // The row labels' and the colour bar's widths follow the text at the UI's scale (fixed pixels
  // put "L0" under the cells and cut the bar's "rel. error" at 2.5x).
  char last_row[16];
  std::snprintf(last_row, sizeof last_row, "L%d", gv.layers - 1);
  const float label_w = ImGui::CalcTextSize(last_row).x + 0.6f * ImGui::GetFontSize();
  const float bar_w = colour_bar_width(gv.vmin, gv.vmax, gv.unit);
  ImVec2 avail = ImGui::GetContentRegionAvail();
  float grid_w = std::max(60.0f, avail.x - label_w - bar_w - 8);
  float cell = grid_w / static_cast<float>(gv.heads);
  // The column labels' row (lh + 2) and the spacing after it (scaled with the UI) come first.
  const float labels_row = lh + 2 + ImGui::GetStyle().ItemSpacing.y;
  float grid_h =
      std::min({cell * gv.layers, max_height, std::max(60.0f, avail.y - labels_row - 1)});
  // Every row tall enough for its label and its numbers: a tall grid (32 layers, or 2x scale)
  // makes its panel scroll instead of squeezing rows below a line of text.
  grid_h = std::max(grid_h, gv.layers * (lh + 2));
  float cell_h = grid_h / static_cast<float>(gv.layers);
  // Column labels.
  ImVec2 o = ImGui::GetCursorScreenPos();
  ImDrawList* dl = ImGui::GetWindowDrawList();
  for (int h = 0; h < gv.heads; ++h) {
    char b[16];
    std::snprintf(b, sizeof b, "H%d", h);
    float w = ImGui::CalcTextSize(b).x;
    if (cell > w + 2)
      dl->AddText(ImVec2(o.x + label_w + (h + 0.5f) * cell - w / 2, o.y), kColAxisText, b);
  }
  ImGui::Dummy(ImVec2(grid_w + label_w, lh + 2));
  ImVec2 g0 = ImGui::GetCursorScreenPos();
  for (int l = 0; l < gv.layers; ++l) {
    char b[16];
    std::snprintf(b, sizeof b, "L%d", l);
    if (cell_h > lh)
      dl->AddText(ImVec2(g0.x, g0.y + (l + 0.5f) * cell_h - lh / 2), kColAxisText, b);
  }
  ImGui::SetCursorScreenPos(ImVec2(g0.x + label_w, g0.y));
  auto norm = [&](double v) { return (v - gv.vmin) / (gv.vmax - gv.vmin); };
  HeatmapHit hit = heatmap(
      "##cells", ImVec2(grid_w, grid_h), gv.layers, gv.heads,
      [&](int r, int c) -> ImU32 {
        double v = gv.mean[static_cast<size_t>(r * gv.heads + c)];
        if (!gv.have_values || (!gv.missing.empty() && gv.missing[r * gv.heads + c]))
          return IM_COL32(45, 48, 54, 255);
        const ImU32 col = std::isfinite(v) ? colormap(gv.map, norm(v)) : kColRefused;
        // A value of earlier settings, shown until its cell is computed again: dimmed.
        if (!gv.state.empty() && gv.state[static_cast<size_t>(r * gv.heads + c)] ==
                                     static_cast<uint8_t>(CellState::Stale))
          return (col & 0x00FFFFFFu) | (static_cast<ImU32>(90) << IM_COL32_A_SHIFT);
        return col;
      },
      [&](int r, int c) -> std::string {
        double v = gv.mean[static_cast<size_t>(r * gv.heads + c)];
        if (!gv.missing.empty() && gv.missing[r * gv.heads + c]) return "";
        if (!std::isfinite(v)) return gv.have_values ? "n/a" : "";
        // Three significant digits when the cell is wide enough, else two.
        char b[32];
        std::snprintf(b, sizeof b, "%.3g", v);
        if (ImGui::CalcTextSize(b).x > cell - 6) std::snprintf(b, sizeof b, "%.2g", v);
        return b;
      });
  // The cells' rectangle, for the real-input tests that click a cell as a user does.
  record_item(s, std::string("grid:") + (id[0] == '#' && id[1] == '#' ? id + 2 : id));
  // The rows on screen: the progressive grid computes them first (AppState::grid_priority).
  if (!gv.state.empty()) {
    const ImVec2 c0 = ImGui::GetWindowDrawList()->GetClipRectMin(),
                 c1 = ImGui::GetWindowDrawList()->GetClipRectMax();
    const int first = std::clamp(static_cast<int>((c0.y - g0.y) / cell_h), 0, gv.layers - 1);
    const int last = std::clamp(static_cast<int>((c1.y - g0.y) / cell_h), 0, gv.layers - 1);
    s.grid_rows_visible = {first, last};
  }
  // Outline the focused head.
  {
    int l = s.settings.focus.layer, h = s.settings.focus.kv_head;
    if (l >= 0 && l < gv.layers && h >= 0 && h < gv.heads) {
      ImVec2 a(g0.x + label_w + h * (grid_w / gv.heads), g0.y + l * cell_h);
      // A dark ring outside a light one: visible on every colour of the map, yellow included.
      const ImVec2 b(a.x + grid_w / gv.heads, a.y + cell_h);
      dl->AddRect(ImVec2(a.x - 1, a.y - 1), ImVec2(b.x + 1, b.y + 1), IM_COL32(0, 0, 0, 255), 0, 0,
                  4.0f);
      dl->AddRect(ImVec2(a.x + 1.5f, a.y + 1.5f), ImVec2(b.x - 1.5f, b.y - 1.5f),
                  IM_COL32(255, 255, 255, 255), 0, 0, 2.0f);
    }
  }
  if (hit.row >= 0) {
    size_t i = static_cast<size_t>(hit.row * gv.heads + hit.col);
    ImGui::BeginTooltip();
    ImGui::Text("layer %d, kv head %d", hit.row, hit.col);
    if (std::isfinite(gv.mean[i])) {
      if (std::isfinite(gv.spread[i]))
        ImGui::Text("%s %.4g  (std over seeds %.2g)", gv.unit.c_str(), gv.mean[i], gv.spread[i]);
      else
        ImGui::Text("%s %.4g", gv.unit.c_str(), gv.mean[i]);
    } else if (!gv.missing.empty() && gv.missing[i]) {
      ImGui::TextDisabled(gv.state.empty() ? "not evaluated" : "not computed yet");
    } else if (gv.have_values) {
      ImGui::TextDisabled("no value (head refused or method not applicable)");
    }
    if (!gv.state.empty() && gv.state[i] == static_cast<uint8_t>(CellState::Stale))
      ImGui::TextDisabled("from earlier settings: being computed again");
    else if (!gv.state.empty() && gv.state[i] == static_cast<uint8_t>(CellState::Partial))
      ImGui::TextDisabled("%d of %d seeds so far", gv.seeds_done[i], gv.seeds);
    if (!gv.note[i].empty()) ImGui::TextWrapped("%s", gv.note[i].c_str());
    ImGui::TextDisabled("click to focus");
    ImGui::EndTooltip();
    if (hit.clicked) s.set_focus(Focus{hit.row, hit.col});
  }
  ImGui::SameLine(0, 8);
  if (gv.have_values)
    colour_bar("##bar", ImVec2(bar_w, grid_h), gv.map, gv.vmin, gv.vmax, gv.unit);
  else
    ImGui::Dummy(ImVec2(bar_w, grid_h));
  ImGui::PopID();
}

nlohmann::json grid_json(const AppState& s) {
  // error_grid: method A's cells (what the Capture view shows); error_grid_b: method B's. Each
  // cell says how far it has come (state, seeds) and the serial of each seed run it shows (the
  // n-th cell the app computed): a cell recomputed after a change has new serials.
  nlohmann::json cells = nlohmann::json::array(), cells_b = nlohmann::json::array();
  if (const GridReport* g = s.grid_report())
    for (size_t i = 0; i < g->entries.size() && i < g->report.results.size(); ++i) {
      const GridEntry& e = g->entries[i];
      const HeadEval& h = g->report.results[i];
      if (e.state == CellState::Missing) continue;
      nlohmann::json serials = nlohmann::json::array();
      for (const std::string& key : e.keys) {
        const GridCell* c = s.grid_cells.find(key);
        serials.push_back(c ? nlohmann::json(c->serial) : nlohmann::json());
      }
      (e.slot == 0 ? cells : cells_b)
          .push_back({{"layer", h.layer},
                      {"kv_head", h.kv_head},
                      {"method", h.method},
                      {"ratio", h.ratio},
                      {"relative_error_mean", h.mean},
                      {"relative_error_std", h.std},
                      {"normalized_mean", h.normalized_mean},
                      {"mass_mean", h.mass_mean},
                      {"refused", h.refused},
                      {"note", h.note},
                      {"state", cell_state_name(e.state)},
                      {"seeds_done", e.seeds_done},
                      {"serials", serials}});
    }
  nlohmann::json ent = nlohmann::json::array();
  if (const EntropyGrid* eg = s.entropy())
    for (int l = 0; l < eg->layers; ++l)
      for (int h = 0; h < eg->heads; ++h) {
        double v = eg->at(l, h);
        ent.push_back({{"layer", l},
                       {"kv_head", h},
                       {"entropy_nats", std::isfinite(v) ? nlohmann::json(v) : nlohmann::json()}});
      }
  const Result& r = s.result(kGrid);
  auto [done, total] = s.progress(kGrid);
  const GridReport* g = s.grid_report();
  return {{"error_grid", cells},
          {"error_grid_b", cells_b},
          {"entropy_grid", ent},
          {"seeds", s.grid_seeds()},
          {"caption", grid_values(s, s.settings.grid_metric).caption},
          {"stale", r.stale()},
          {"running", r.busy()},
          {"complete", g && g->complete()},
          {"cells_done", g ? g->cells_done : 0},
          {"cells_total", g ? g->cells_total : 0},
          {"progress", {done, total}},
          {"cells_computed", s.grid_cells.computed()},
          {"cancelled", !r.cancelled.empty() && r.cancelled == r.want},
          {"held_for_run", !r.held.empty() && r.held == r.want},
          {"estimate_s", r.estimate_s},
          {"error", r.error}};
}

std::string grid_csv(const AppState& s) {
  const GridReport* grid = s.grid_report();
  const EntropyGrid* eg = s.entropy();
  if (!grid && !eg) return {};
  std::ostringstream o;
  o << "layer,kv_head,method,keep_ratio,relative_error_mean,relative_error_std,entropy_nats\n";
  const CaptureInfo* ci = s.info();
  if (!ci) return {};
  for (int l = 0; l < ci->num_layers; ++l)
    for (int h = 0; h < ci->kv_heads; ++h) {
      o << l << "," << h << ",";
      const GridEntry* e = nullptr;
      const HeadEval* he = grid ? grid->find(0, l, h, &e) : nullptr;
      if (he && e && e->state != CellState::Missing && !he->refused)
        o << he->method << "," << he->ratio << "," << he->mean << "," << he->std;
      else
        o << s.method_name(0) << "," << s.settings.keep_ratio << ",,";
      o << ",";
      if (eg && l < eg->layers && h < eg->heads && std::isfinite(eg->at(l, h))) o << eg->at(l, h);
      o << "\n";
    }
  return o.str();
}

}  // namespace kvscope::app
