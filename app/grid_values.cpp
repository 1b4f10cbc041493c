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

}  // namespace

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

GridValues grid_values(const AppState& s, GridMetric metric) {
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
    const EvalReport* grid = s.grid();
    if (!r.error.empty()) {
      gv.caption = "grid failed: " + r.error;
    } else if (!grid) {
      gv.caption = r.busy() ? "running " + s.method_name(0) + " on every head..." : "no grid yet";
    } else {
      const HeadEval* first = grid->results.empty() ? nullptr : &grid->results.front();
      char buf[256];
      // The method as the grid computed it, non-default parameters named.
      std::string label = "?";
      if (first) {
        const auto pit = grid->spec.params.find(first->method);
        label = method_label(first->method,
                             pit == grid->spec.params.end() ? ParamValues{} : pit->second);
      }
      std::snprintf(buf, sizeof buf, "%s at keep ratio %s: relative error, mean of %d seed%s%s",
                    label.c_str(),
                    ratio_label(first ? first->ratio : s.settings.keep_ratio).c_str(),
                    grid->spec.seeds, grid->spec.seeds == 1 ? "" : "s",
                    r.stale() ? " [stale: earlier settings]" : "");
      gv.caption = buf;
      if (first && grid->info.num_layers == gv.layers && grid->info.kv_heads == gv.heads)
        fill_from_report(gv, *grid, first->method, first->ratio);
    }
  }
  finish_range(gv);
  return gv;
}

void draw_grid(AppState& s, const GridValues& gv, const char* id, float max_height) {
  if (gv.layers <= 0 || gv.heads <= 0) return;
  ImGui::PushID(id);
  const float label_w = 34, bar_w = 84;
  const float lh = ImGui::GetTextLineHeight();
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
        return std::isfinite(v) ? colormap(gv.map, norm(v)) : kColRefused;
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
      ImGui::TextDisabled("not evaluated");
    } else if (gv.have_values) {
      ImGui::TextDisabled("no value (head refused or method not applicable)");
    }
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
  nlohmann::json cells = nlohmann::json::array();
  if (const EvalReport* grid = s.grid())
    for (const HeadEval& h : grid->results)
      cells.push_back({{"layer", h.layer},
                       {"kv_head", h.kv_head},
                       {"method", h.method},
                       {"ratio", h.ratio},
                       {"relative_error_mean", h.mean},
                       {"relative_error_std", h.std},
                       {"normalized_mean", h.normalized_mean},
                       {"mass_mean", h.mass_mean},
                       {"refused", h.refused},
                       {"note", h.note}});
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
  return {{"error_grid", cells},
          {"entropy_grid", ent},
          {"seeds", s.grid_seeds()},
          {"caption", grid_values(s, s.settings.grid_metric).caption},
          {"stale", r.stale()},
          {"running", r.busy()},
          {"held_for_run", !r.held.empty() && r.held == r.want},
          {"estimate_s", r.estimate_s},
          {"error", r.error}};
}

std::string grid_csv(const AppState& s) {
  const EvalReport* grid = s.grid();
  const EntropyGrid* eg = s.entropy();
  if (!grid && !eg) return {};
  std::ostringstream o;
  o << "layer,kv_head,method,keep_ratio,relative_error_mean,relative_error_std,entropy_nats\n";
  const CaptureInfo* ci = s.info();
  if (!ci) return {};
  for (int l = 0; l < ci->num_layers; ++l)
    for (int h = 0; h < ci->kv_heads; ++h) {
      o << l << "," << h << ",";
      const HeadEval* he = nullptr;
      if (grid)
        for (const HeadEval& x : grid->results)
          if (x.layer == l && x.kv_head == h) he = &x;
      if (he && !he->refused)
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
