// The Geometry view's class (app/views/view_geometry.cpp: drawing, export, state;
// app/views/view_geometry_jobs.cpp: planning its projection and k-center jobs and reading their
// results), shared by the two files that define it. Only make_geometry_view() (app/views/view.h) is
// public.
#pragma once

#include <imgui.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "app/app_state.h"
#include "app/colormap.h"
#include "app/plot.h"
#include "app/point_renderer.h"
#include "app/result_status.h"
#include "app/token_marks.h"
#include "app/ui_layout.h"
#include "app/views/view.h"
#include "engine/core/error.h"
#include "engine/geometry/kcenter.h"
#include "engine/geometry/projection_cache.h"
#include "engine/io/json_fields.h"
#include "engine/ops/backend.h"

namespace kvscope::app::geometry {

enum class ColourBy { Kept = 0, Position = 1, Cluster = 2, Norm = 3 };
const char* const kColourNames[] = {"kept / dropped (method A)", "position", "cluster", "norm"};
// Which point sets are mapped: SubGen's Figure 1 has one row of keys and one of values.
enum class Points { Keys = 0, Values = 1, Both = 2 };
const char* const kPointsNames[] = {"keys", "values", "both"};

struct GeometrySettings {
  ProjectionMethod method = ProjectionMethod::Tsne;
  bool with_queries = false;
  int perplexity = 30;
  int iterations = 1000;
  int clusters = 8;  // k of the view's own k-center centres and colouring (SubGen's Fig. 1: 16)
  Points points = Points::Keys;
  bool centres = true;         // mark the k-center centres
  double radius_factor = 0.5;  // cluster radius for the counts, in units of rms_spread
};

// One map, swapped in whole (intermediate t-SNE frames included).
struct GeometryFrame {
  std::string key;
  MatrixF coords;  // (num_keys + num_queries) x 2
  int num_keys = 0, num_queries = 0, query_head = -1;
  ProjectionMethod method = ProjectionMethod::Tsne;
  int iteration = 0, total = 0;
  bool done = false;
  bool from_cache = false;
  double kl = std::numeric_limits<double>::quiet_NaN();
  double perplexity = 0, theta = 0, explained[2] = {0, 0};
  std::string gradient;  // "exact gradient", "Barnes-Hut" or "FFT interpolation"
  double seconds = 0;
  ProjectionSource source = ProjectionSource::Keys;
  std::vector<float> key_norm;  // per point of the source: its norm (keys' or values')
};

// The k-center result of one point set (planned on its own, through the backend).
struct KCenterResult {
  std::string key;
  ProjectionSource source = ProjectionSource::Keys;
  KCenterFigure fig;
  double spread = 0;  // rms_spread of the points
  double seconds = 0;
};

constexpr int kKCenterCap = 256;  // counts stop here (reported as ">= 256")

// The names of this view's derived results (AppState::results): the keys' and the values' maps,
// and their k-center results.
constexpr const char* kProjection = "geometry.projection";
constexpr const char* kProjectionValues = "geometry.projection.values";
constexpr const char* kKCenterKeys = "geometry.kcenter.keys";
constexpr const char* kKCenterValues = "geometry.kcenter.values";
inline const char* projection_result(ProjectionSource s) {
  return s == ProjectionSource::Values ? kProjectionValues : kProjection;
}
inline const char* kcenter_result(ProjectionSource s) {
  return s == ProjectionSource::Values ? kKCenterValues : kKCenterKeys;
}
constexpr ImU32 kColCentre = IM_COL32(60, 230, 90, 255);  // SubGen's figure: green centres

// Queries of the joint map: light rings, distinct from every category and cluster colour.
constexpr ImU32 kColQueryPoint = IM_COL32(225, 228, 235, 190);

constexpr ImU32 kClusterPalette[] = {
    IM_COL32(230, 97, 92, 255),   IM_COL32(86, 160, 229, 255),  IM_COL32(120, 200, 90, 255),
    IM_COL32(240, 180, 60, 255),  IM_COL32(190, 120, 240, 255), IM_COL32(70, 210, 200, 255),
    IM_COL32(240, 130, 200, 255), IM_COL32(170, 140, 100, 255), IM_COL32(150, 220, 240, 255),
    IM_COL32(220, 220, 120, 255), IM_COL32(140, 150, 250, 255), IM_COL32(250, 160, 120, 255)};
constexpr int kPaletteSize = sizeof(kClusterPalette) / sizeof(kClusterPalette[0]);

inline ImU32 cluster_colour(int c) {
  return c < 0 ? kColDropped : kClusterPalette[c % kPaletteSize];
}

inline std::string short_text(const std::string& t, size_t max_chars = 14) {
  return t.size() <= max_chars ? t : t.substr(0, max_chars - 1) + "~";
}

class GeometryView final : public View {
 public:
  const char* name() const override { return "geometry"; }
  const char* title() const override { return "Geometry"; }
  const char* help() const override;

  bool ready(const AppState& s) const override;

  void draw(AppState& s) override;

  nlohmann::json export_json(const AppState& s) const override;

  std::string export_csv(const AppState& s) const override;

  nlohmann::json save_state() const override;

  void load_state(const nlohmann::json& j) override;

 private:
  std::vector<ProjectionSource> sources() const;

  void draw_controls(AppState& s);

  // Clusters from method A when it reports them (subgen, subgen-kcenter), else null.
  const std::vector<int>* method_clusters(const AppState& s) const;

  ProjectionRequest request_for(const AppState& s, ProjectionSource src) const;

  // The maps and k-center results of the focused head, planned from the settings and this view's
  // choices; AppState::reconcile() runs them (intermediate t-SNE frames arrive as partial values).
  // A point set not shown is not wanted (its key is empty).
  void plan(const AppState& s, std::vector<NamedPlan>& out) const override;

  // Greedy k-center on the point set, through the backend: the centres, their Voronoi cells and
  // the clusters found at the radius for prefixes 16, 32, ... (engine/geometry/kcenter.h).
  void plan_kcenter(const AppState& s, ProjectionSource src, std::vector<NamedPlan>& out) const;

  void plan_projection(const AppState& s, ProjectionSource src, std::vector<NamedPlan>& out) const;

  std::shared_ptr<const GeometryFrame> frame_of(const AppState& s, ProjectionSource src) const;
  // The k-center result when it belongs to the current settings (else null: nothing marked).
  std::shared_ptr<const KCenterResult> kcenter_of(const AppState& s, ProjectionSource src) const;
  std::string error_of(const AppState& s, ProjectionSource src) const;

  void draw_status(const AppState& s, ProjectionSource src);

  ImU32 point_colour(const AppState& s, const GeometryFrame& f, const KCenterResult* kc,
                     const TokenMarks* marks, int token, bool query) const;

  void draw_canvas(AppState& s, const GeometryFrame& f, ImVec2 size, bool stale);

  template <class ToCanvas>
  void handle_mouse(AppState& s, const GeometryFrame& f, ImVec2 p0, const ToCanvas& to_canvas);

  void hover_tooltip(const AppState& s, const GeometryFrame& f, const KCenterResult* kc,
                     const TokenMarks* marks, int i);

  // The map's legend: what each colour and shape means under the current colouring.
  struct LegendEntry {
    ImU32 colour;
    std::string text;
  };
  std::vector<LegendEntry> legend_entries(const AppState& s, const GeometryFrame& f,
                                          const KCenterResult* kc) const;
  // Its two shapes: a column at the right of the map, or rows across the canvas's width, each
  // with its box's size and every entry's place in it; draw_canvas takes the one it uses out of
  // the points' area.
  struct LegendLayout {
    float column_w = 0, column_h = 0, rows_w = 0, rows_h = 0;
    std::vector<ImVec2> in_column, in_rows;
    bool column = true;  // the shape chosen
  };
  static LegendLayout layout_legend(const std::vector<LegendEntry>& entries, float canvas_w);
  static void draw_legend(const std::vector<LegendEntry>& entries, const LegendLayout& lay,
                          ImVec2 at);

  // Clusters found vs n: how many greedy k-center centres cover the first n points within the
  // radius, for keys and values (SubGen's Definition 1: m clusters, sublinear in n), beside a
  // table of the same numbers.
  void draw_counts(const AppState& s, ImVec2 size);

  // A one-line token strip around the hovered (else clicked, else first selected) token, in the
  // Tokens view's colours, so hover in the map shows the token in its context.
  void draw_token_strip(const AppState& s);

  GeometrySettings settings_;
  int edit_perplexity_ = 30, edit_iterations_ = 1000, edit_clusters_ = 8;
  float edit_radius_ = 0.5f;
  int canvas_ = 0, drag_canvas_ = -1;  // the map being drawn, the map a drag started in
  ColourBy colour_ = ColourBy::Kept;
  float point_px_ = 3.0f;
  // One renderer per map: each draws into its own offscreen framebuffer, which its map shows.
  PointRenderer renderers_[2];
  std::vector<PointInstance> points_;
  std::vector<int> order_;
  int hovered_ = -1;
  bool dragging_ = false;
  ImVec2 drag_start_;
  float norm_lo_ = 0, norm_hi_ = 1;
};

}  // namespace kvscope::app::geometry
