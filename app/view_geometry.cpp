// Geometry view: the focused head's keys, values or both in 2-D (PCA or t-SNE; keys optionally
// joint with one query head's queries, as AttentionViz does), coloured by what method A kept, by
// position, by cluster or by norm, with the greedy k-center centres marked and the clusters
// found at a radius as the prefix grows (SubGen's Figure 1 and Definition 1; docs/geometry.md).
// The k-center work is its own planned result per point set, run through the backend. t-SNE runs on
// the worker's Geometry lane and posts frames while it converges, so the map animates; finished
// maps are cached per (capture, layer, head, parameters). Hover names the token and shows it in the
// context strip below the map; dragging a box selects tokens (shared with the Tokens view through
// AppState::selected_tokens).
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

#include "app/app_frame.h"
#include "app/app_state.h"
#include "app/colormap.h"
#include "app/plot.h"
#include "app/point_renderer.h"
#include "app/result_status.h"
#include "app/token_marks.h"
#include "app/view.h"
#include "engine/backend.h"
#include "engine/error.h"
#include "engine/json_fields.h"
#include "engine/kcenter.h"
#include "engine/projection_cache.h"

namespace kvscope::app {
namespace {

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
const char* projection_result(ProjectionSource s) {
  return s == ProjectionSource::Values ? kProjectionValues : kProjection;
}
const char* kcenter_result(ProjectionSource s) {
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

ImU32 cluster_colour(int c) {
  return c < 0 ? kColDropped : kClusterPalette[c % kPaletteSize];
}

std::string short_text(const std::string& t, size_t max_chars = 14) {
  return t.size() <= max_chars ? t : t.substr(0, max_chars - 1) + "~";
}

class GeometryView final : public View {
 public:
  const char* name() const override { return "geometry"; }
  const char* title() const override { return "Geometry"; }
  const char* help() const override {
    return "A 2-D map (PCA or t-SNE) of the focused head's keys, values or both side by side "
           "(SubGen's Figure 1), keys optionally joint with their queries, coloured by "
           "kept/dropped, position, cluster or norm, with the greedy k-center centres marked and "
           "the clusters found vs n below. Hover a point for its token; box-select points to "
           "outline those tokens in the Tokens view.";
  }

  bool ready(const AppState& s) const override {
    if (!s.capture || !s.focus_layer() || s.focus_refused()) return true;
    for (ProjectionSource src : sources()) {
      for (const char* name : {projection_result(src), kcenter_result(src)}) {
        const Result& r = s.result(name);
        if (r.want.empty()) return false;  // not planned yet
        if (!r.error.empty() && r.key == r.want) continue;
        if (!r.held.empty() && r.held == r.want) continue;
        if (!r.fresh()) return false;
      }
      const auto f = frame_of(s, src);
      if (!f || !f->done) return false;
    }
    return colour_ != ColourBy::Kept || s.run(0) || !s.run_error(0).empty();
  }

  void draw(AppState& s) override {
    if (!s.info()) {
      ImGui::TextDisabled("No capture open.");
      return;
    }
    draw_controls(s);
    std::string why;
    if (s.focus_refused(&why)) {
      ImGui::TextColored(ImVec4(1, 0.5f, 0.4f, 1), "This head is refused: %s", why.c_str());
      return;
    }
    if (!s.focus_layer()) {
      ImGui::TextDisabled("Loading layer %d ...", s.settings.focus.layer);
      return;
    }
    const std::vector<ProjectionSource> srcs = sources();
    for (ProjectionSource src : srcs) {
      draw_status(s, src);
      draw_result_status(s, projection_result(src),
                         src == ProjectionSource::Values ? "values map" : "map");
      draw_result_status(s, kcenter_result(src),
                         src == ProjectionSource::Values ? "values k-center" : "k-center");
    }
    mark_figure_top();  // figure exports: the maps, the counts and the token strip
    const float strip_h = ImGui::GetTextLineHeightWithSpacing() * 2.6f;
    const float counts_h = px(150);
    ImVec2 avail = ImGui::GetContentRegionAvail();
    const float gap = ImGui::GetStyle().ItemSpacing.x;
    const float each_w =
        std::max(100.0f, (avail.x - gap * (srcs.size() - 1)) / static_cast<float>(srcs.size()));
    const ImVec2 canvas_size(each_w, std::max(100.0f, avail.y - strip_h - counts_h));
    for (size_t i = 0; i < srcs.size(); ++i) {
      if (i > 0) ImGui::SameLine();
      ImGui::PushID(static_cast<int>(srcs[i]));
      canvas_ = static_cast<int>(srcs[i]);
      const auto frame = frame_of(s, srcs[i]);
      const char* rname = projection_result(srcs[i]);
      if (!frame || frame->key != s.result(rname).want) {
        // Nothing for this head yet (first t-SNE frame pending): keep the space, say so.
        ImGui::Dummy(canvas_size);
        ImGui::GetWindowDrawList()->AddText(
            ImVec2(ImGui::GetItemRectMin().x + 10, ImGui::GetItemRectMin().y + 10), kColAxisText,
            error_of(s, srcs[i]).empty() ? "Computing the map ..."
                                         : "No map (see the message above).");
        if (frame) draw_canvas(s, *frame, canvas_size, /*stale=*/true);
      } else {
        draw_canvas(s, *frame, canvas_size, false);
      }
      ImGui::PopID();
    }
    draw_counts(s, ImVec2(avail.x, counts_h - ImGui::GetStyle().ItemSpacing.y));
    draw_token_strip(s);
  }

  nlohmann::json export_json(const AppState& s) const override {
    const std::vector<ProjectionSource> srcs = sources();
    const auto f = frame_of(s, srcs.front());
    if (!f) return nullptr;
    nlohmann::json j;
    j["view"] = "geometry";
    j["capture"] = s.capture_path;
    j["layer"] = s.settings.focus.layer;
    j["kv_head"] = s.settings.focus.kv_head;
    j["projection"] = projection_method_name(f->method);
    j["points"] = kPointsNames[static_cast<int>(settings_.points)];
    j["k"] = settings_.clusters;
    j["num_keys"] = f->num_keys;
    j["num_queries"] = f->num_queries;
    if (f->num_queries > 0) j["query_head"] = f->query_head;
    if (f->method == ProjectionMethod::Tsne) {
      j["perplexity"] = f->perplexity;
      j["iterations"] = f->iteration;
      j["theta"] = f->theta;
      j["gradient"] = f->gradient;
      j["kl"] = std::isfinite(f->kl) ? nlohmann::json(f->kl) : nlohmann::json(nullptr);
    } else {
      j["explained_variance_share"] = {f->explained[0], f->explained[1]};
    }
    // One entry per map (SubGen's Figure 1 rows): its centres and its clusters vs n.
    nlohmann::json maps = nlohmann::json::array();
    for (ProjectionSource src : srcs) {
      nlohmann::json m;
      m["source"] = projection_source_name(src);
      const auto fr = frame_of(s, src);
      m["num_points"] = fr ? fr->num_keys : 0;
      m["done"] = fr && fr->done;
      if (const auto kc = kcenter_of(s, src)) {
        m["k"] = kc->fig.centres.size();
        m["centres"] = kc->fig.centres;
        if (fr && fr->key == s.result(projection_result(src)).want) {
          nlohmann::json xy = nlohmann::json::array();
          for (int c : kc->fig.centres)
            if (c < fr->coords.rows()) xy.push_back({fr->coords(c, 0), fr->coords(c, 1)});
          m["centre_coords"] = xy;
        }
        m["covering_radius"] = kc->fig.covering;
        m["radius"] = kc->fig.radius;
        m["radius_factor"] = settings_.radius_factor;
        m["spread"] = kc->spread;
        nlohmann::json counts = nlohmann::json::array();
        for (size_t i = 0; i < kc->fig.prefix.size(); ++i)
          counts.push_back({{"n", kc->fig.prefix[i]},
                            {"clusters", kc->fig.clusters[i]},
                            {"capped", kc->fig.capped[i] != 0}});
        m["clusters_vs_n"] = counts;
      }
      maps.push_back(m);
    }
    j["maps"] = maps;
    j["selected_tokens"] = std::vector<int>(s.selected_tokens.begin(), s.selected_tokens.end());
    return j;
  }

  std::string export_csv(const AppState& s) const override {
    std::unique_ptr<TokenMarks> marks;
    if (s.run(0)) marks = std::make_unique<TokenMarks>(token_marks(*s.run(0)));
    std::ostringstream out;
    out << "token,kind,x,y,status,cluster,norm,centre\n";
    for (ProjectionSource src : sources()) {
      const auto f = frame_of(s, src);
      if (!f) continue;
      const auto kc = kcenter_of(s, src);
      const char* kind = src == ProjectionSource::Values ? "value" : "key";
      for (int i = 0; i < f->coords.rows(); ++i) {
        const bool query = i >= f->num_keys;
        const int t = query ? i - f->num_keys : i;
        out << t << ',' << (query ? "query" : kind) << ',' << f->coords(i, 0) << ','
            << f->coords(i, 1) << ',';
        out << (marks && t < static_cast<int>(marks->kind.size()) ? token_kind_name(marks->kind[t])
                                                                  : "")
            << ',';
        const bool has = !query && kc && t < static_cast<int>(kc->fig.owner.size());
        out << (has ? kc->fig.owner[t] : -1) << ',';
        out << (query || f->key_norm.empty() ? 0.f : f->key_norm[t]) << ',';
        out << (has && std::find(kc->fig.centres.begin(), kc->fig.centres.end(), t) !=
                            kc->fig.centres.end()
                    ? 1
                    : 0)
            << '\n';
      }
    }
    return out.str();
  }

  nlohmann::json save_state() const override {
    return {{"projection", projection_method_name(settings_.method)},
            {"with_queries", settings_.with_queries},
            {"perplexity", settings_.perplexity},
            {"iterations", settings_.iterations},
            {"clusters", settings_.clusters},
            {"points", kPointsNames[static_cast<int>(settings_.points)]},
            {"centres", settings_.centres},
            {"radius_factor", settings_.radius_factor},
            {"colour", static_cast<int>(colour_)},
            {"point_px", point_px_}};
  }

  void load_state(const nlohmann::json& j) override {
    // Every field is checked before anything changes; a wrong one throws InputError naming it
    // ("session field \"views.geometry.perplexity\": ..."), and AppUi::load_session refuses the
    // session.
    const JsonField f(j, "session", "views.geometry");
    GeometrySettings st = settings_;
    if (const std::optional<JsonField> p = f.find("projection")) {
      const std::string name = p->string();
      if (name != "pca" && name != "tsne" && name != "t-sne")
        p->fail("'" + name + "' is not a projection (pca or tsne)");
      st.method = parse_projection_method(name, "projection");
    }
    st.with_queries = f.get("with_queries", st.with_queries);
    st.perplexity = f.get("perplexity", st.perplexity, 2, 200);
    st.iterations = f.get("iterations", st.iterations, 0, 20000);
    st.clusters = f.get("clusters", st.clusters, 1, 64);
    if (const std::optional<JsonField> p = f.find("points")) {
      const std::string name = p->string();
      int found = -1;
      for (int i = 0; i < 3; ++i)
        if (name == kPointsNames[i]) found = i;
      if (found < 0) p->fail("'" + name + "' is not keys, values or both");
      st.points = static_cast<Points>(found);
    }
    st.centres = f.get("centres", st.centres);
    st.radius_factor = f.get("radius_factor", st.radius_factor, 0.01, 4.0);
    const int colour = f.get("colour", 0, 0, 3);
    const double point_px = f.get("point_px", static_cast<double>(point_px_), 1.0, 12.0);
    settings_ = st;
    colour_ = static_cast<ColourBy>(colour);
    point_px_ = static_cast<float>(point_px);
    edit_perplexity_ = settings_.perplexity;
    edit_iterations_ = settings_.iterations;
    edit_clusters_ = settings_.clusters;
    edit_radius_ = static_cast<float>(settings_.radius_factor);
  }

 private:
  std::vector<ProjectionSource> sources() const {
    switch (settings_.points) {
      case Points::Keys:
        return {ProjectionSource::Keys};
      case Points::Values:
        return {ProjectionSource::Values};
      case Points::Both:
        break;
    }
    return {ProjectionSource::Keys, ProjectionSource::Values};
  }

  void draw_controls(AppState& s) {
    // The toolbar wraps on narrow windows (toolbar_next).
    ImGui::SetNextItemWidth(px(90));
    int m = settings_.method == ProjectionMethod::Pca ? 0 : 1;
    if (ImGui::Combo("map", &m, "PCA\0t-SNE\0"))
      settings_.method = m == 0 ? ProjectionMethod::Pca : ProjectionMethod::Tsne;
    toolbar_next(labelled_width(px(100), "points"));
    ImGui::SetNextItemWidth(px(100));
    if (ImGui::BeginCombo("points", kPointsNames[static_cast<int>(settings_.points)])) {
      for (int i = 0; i < 3; ++i) {
        if (ImGui::Selectable(kPointsNames[i], i == static_cast<int>(settings_.points)))
          settings_.points = static_cast<Points>(i);
        record_item(s, std::string("combo:geometry points:") + kPointsNames[i]);
      }
      ImGui::EndCombo();
    }
    record_item(s, "combo:geometry points");
    if (ImGui::IsItemHovered())
      ImGui::SetTooltip(
          "What the map embeds: the head's keys, its values, or both side by side (SubGen's\n"
          "Figure 1: a row of keys and a row of values, greedy k-center centres marked).");
    toolbar_next(ImGui::GetFrameHeight() + labelled_width(0, "with queries"));
    const bool has_queries = s.info() && s.info()->has_queries;
    if (!has_queries) ImGui::BeginDisabled();
    ImGui::Checkbox("with queries", &settings_.with_queries);
    if (ImGui::IsItemHovered(ImGuiHoveredFlags_AllowWhenDisabled))
      ImGui::SetTooltip(
          "Embed the keys together with the queries of the selected query head (AttentionViz):\n"
          "keys are translated so their centroid meets the queries', and both are rescaled to\n"
          "the same mean norm. Neither changes any query's softmax over the keys. (Keys only.)");
    if (!has_queries) {
      ImGui::EndDisabled();
      settings_.with_queries = false;
    }
    toolbar_next(labelled_width(px(215), "colour"));
    ImGui::SetNextItemWidth(px(215));
    int c = static_cast<int>(colour_);
    if (ImGui::Combo("colour", &c, kColourNames, 4)) colour_ = static_cast<ColourBy>(c);
    if (settings_.method == ProjectionMethod::Tsne) {
      toolbar_next(labelled_width(px(110), "perplexity"));
      ImGui::SetNextItemWidth(px(110));
      ImGui::SliderInt("perplexity", &edit_perplexity_, 2, 100);
      if (ImGui::IsItemDeactivatedAfterEdit()) settings_.perplexity = edit_perplexity_;
      toolbar_next(labelled_width(px(110), "iterations"));
      ImGui::SetNextItemWidth(px(110));
      ImGui::SliderInt("iterations", &edit_iterations_, 250, 5000);
      if (ImGui::IsItemDeactivatedAfterEdit()) settings_.iterations = edit_iterations_;
    }
    toolbar_next(ImGui::GetFrameHeight() + labelled_width(0, "centres"));
    ImGui::Checkbox("centres", &settings_.centres);
    if (ImGui::IsItemHovered())
      ImGui::SetTooltip("Mark the greedy k-center centres (green squares), as SubGen's Figure 1.");
    toolbar_next(labelled_width(px(90), "k"));
    ImGui::SetNextItemWidth(px(90));
    ImGui::SliderInt("k", &edit_clusters_, 2, 32);
    if (ImGui::IsItemDeactivatedAfterEdit()) settings_.clusters = edit_clusters_;
    if (ImGui::IsItemHovered())
      ImGui::SetTooltip("Greedy k-center centres to mark and colour by (SubGen's Figure 1: 16).");
    toolbar_next(labelled_width(px(110), "radius"));
    ImGui::SetNextItemWidth(px(110));
    ImGui::SliderFloat("radius", &edit_radius_, 0.05f, 2.0f, "%.2f x spread");
    if (ImGui::IsItemDeactivatedAfterEdit()) settings_.radius_factor = edit_radius_;
    if (ImGui::IsItemHovered())
      ImGui::SetTooltip(
          "The radius delta of the clusters-vs-n counts, in units of each point set's spread\n"
          "(root mean square distance to its mean), so keys and values are compared alike.");
    toolbar_next(labelled_width(px(80), "point"));
    ImGui::SetNextItemWidth(px(80));
    ImGui::SliderFloat("point", &point_px_, 1.0f, 8.0f, "%.1f px");
    if (!s.selected_tokens.empty()) {
      toolbar_next(ImGui::CalcTextSize("clear selection").x + ImGui::GetStyle().FramePadding.x * 2);
      if (ImGui::SmallButton("clear selection")) s.selected_tokens.clear();
    }
  }

  // Clusters from method A when it reports them (subgen, subgen-kcenter), else null.
  const std::vector<int>* method_clusters(const AppState& s) const {
    if (!s.run(0) || s.run(0)->selection.cluster.empty()) return nullptr;
    return &s.run(0)->selection.cluster;
  }

  ProjectionRequest request_for(const AppState& s, ProjectionSource src) const {
    ProjectionRequest r;
    r.method = settings_.method;
    r.source = src;
    r.tsne.perplexity = settings_.perplexity;
    r.tsne.iterations = settings_.iterations;
    r.tsne.exaggeration_iterations = std::min(250, settings_.iterations);
    r.with_queries = settings_.with_queries && src == ProjectionSource::Keys;
    if (r.with_queries && s.info())
      r.query_head = s.settings.focus.kv_head * s.info()->group_size() + s.settings.selected_q_head;
    return r;
  }

  // The maps and k-center results of the focused head, planned from the settings and this view's
  // choices; AppState::reconcile() runs them (intermediate t-SNE frames arrive as partial values).
  // A point set not shown is not wanted (its key is empty).
  void plan(const AppState& s, std::vector<NamedPlan>& out) const override {
    const std::vector<ProjectionSource> srcs = sources();
    for (ProjectionSource src : {ProjectionSource::Keys, ProjectionSource::Values}) {
      if (std::find(srcs.begin(), srcs.end(), src) == srcs.end()) {
        out.emplace_back(projection_result(src), JobPlan{});
        out.emplace_back(kcenter_result(src), JobPlan{});
        continue;
      }
      plan_projection(s, src, out);
      plan_kcenter(s, src, out);
    }
  }

  // Greedy k-center on the point set, through the backend: the centres, their Voronoi cells and
  // the clusters found at the radius for prefixes 16, 32, ... (engine/kcenter.h).
  void plan_kcenter(const AppState& s, ProjectionSource src, std::vector<NamedPlan>& out) const {
    JobPlan p;
    const char* name = kcenter_result(src);
    if (!s.capture) {
      out.emplace_back(name, p);
      return;
    }
    char params[96];
    std::snprintf(params, sizeof params, "|k=%d|r=%.17g|cap=%d", settings_.clusters,
                  settings_.radius_factor, kKCenterCap);
    p.key = s.capture_path + "|L" + std::to_string(s.settings.focus.layer) + "|H" +
            std::to_string(s.settings.focus.kv_head) + "|" + projection_source_name(src) + params +
            "|id=" + std::to_string(s.capture_id);
    auto layer = s.focus_layer();
    if (!layer) {
      p.waiting = "loading layer " + std::to_string(s.settings.focus.layer);
      out.emplace_back(name, p);
      return;
    }
    if (s.focus_refused()) {
      p.key.clear();
      out.emplace_back(name, p);
      return;
    }
    const int head = s.settings.focus.kv_head;
    const int k = settings_.clusters;
    const double factor = settings_.radius_factor;
    Backend* backend = s.backend();
    const std::string key = p.key;
    p.lane = Lane::Geometry;
    p.label = src == ProjectionSource::Values ? "Geometry: k-center (values)"
                                              : "Geometry: k-center (keys)";
    p.cost_class = "kcenter";
    // The prefixes 16, 32, ..., n sum to about 2n points, each counted against up to the cap of
    // centres twice (the backend's picks and the double-precision covering check).
    const double n = static_cast<double>(s.info()->num_tokens);
    p.units = 4.0 * n * std::min<double>(kKCenterCap, n);
    p.prior_per_unit = 2e-7;
    p.auto_limit_s = 10.0;
    p.returns<KCenterResult>(
        [=](JobContext& ctx, const JobPlan::PartialFn&) -> std::shared_ptr<const KCenterResult> {
          const auto t0 = std::chrono::steady_clock::now();
          const MatrixF& x =
              src == ProjectionSource::Values ? layer->values[head] : layer->keys[head];
          auto r = std::make_shared<KCenterResult>();
          r->key = key;
          r->source = src;
          r->spread = rms_spread(x);
          Backend& b = backend ? *backend : cpu_backend();
          r->fig = kcenter_figure(b, x, k, std::max(factor * r->spread, 1e-12), kKCenterCap,
                                  ctx.cancel_flag());
          r->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          return r;
        });
    out.emplace_back(name, p);
  }

  void plan_projection(const AppState& s, ProjectionSource src, std::vector<NamedPlan>& out) const {
    JobPlan p;
    const char* name = projection_result(src);
    if (!s.capture) {
      out.emplace_back(name, p);
      return;
    }
    const ProjectionRequest req = request_for(s, src);
    const std::string pkey =
        projection_key(s.capture_path, s.settings.focus.layer, s.settings.focus.kv_head, req);
    const std::string key = pkey + "|cap=" + std::to_string(s.capture_id);
    p.key = key;
    auto layer = s.focus_layer();
    std::string why;
    if (!layer) {
      p.waiting = "loading layer " + std::to_string(s.settings.focus.layer);
      out.emplace_back(name, p);
      return;
    }
    if (s.focus_refused(&why)) {
      p.key.clear();  // the view says why; nothing to compute
      out.emplace_back(name, p);
      return;
    }
    const CaptureInfo info = *s.info();
    const int head = s.settings.focus.kv_head;
    Backend* backend = s.backend();
    p.lane = Lane::Geometry;
    const std::string what = src == ProjectionSource::Values ? " (values)" : "";
    p.label = (req.method == ProjectionMethod::Pca ? "Geometry: PCA" : "Geometry: t-SNE") + what;
    const double points = static_cast<double>(info.num_tokens) * (req.with_queries ? 2 : 1);
    const bool cached = projection_cache().find(pkey) != nullptr;
    // Long maps on the CPU take the FFT-interpolated repulsion (TsneRun's automatic choice), whose
    // cost per point and iteration is a third of Barnes-Hut's: its own cost class, so a measured
    // 8k-point Barnes-Hut map does not set the estimate of a 32k-point FFT one.
    const bool fft = req.method == ProjectionMethod::Tsne && req.tsne.theta < 0 &&
                     points > req.tsne.fft_threshold &&
                     !(backend && backend->parallel_in_one_call());
    p.cost_class = req.method == ProjectionMethod::Pca ? "pca" : fft ? "tsne-fft" : "tsne";
    // t-SNE (Barnes-Hut): about 1 us per point and iteration on the 2-core build machine (8192
    // keys, 1000 iterations: 7.4 s); FFT about 0.3 us (32768 keys: about 10 s); PCA is linear
    // in the points. Deliberately on the slow side; measured at run time after.
    p.prior_per_unit = req.method == ProjectionMethod::Pca ? 1e-6 : fft ? 0.5e-6 : 1.5e-6;
    p.units = cached ? 0 : points * (req.method == ProjectionMethod::Pca ? 1 : req.tsne.iterations);
    p.auto_limit_s = 3.0;
    p.returns<GeometryFrame>(
        [=](JobContext& ctx,
            const JobPlan::PartialFn& partial) -> std::shared_ptr<const GeometryFrame> {
          const auto t0 = std::chrono::steady_clock::now();
          auto base = std::make_shared<GeometryFrame>();
          base->key = key;
          base->method = req.method;
          base->source = src;
          MatrixF points = projection_input(info, *layer, head, req, &base->query_head);
          const MatrixF& own =
              src == ProjectionSource::Values ? layer->values[head] : layer->keys[head];
          base->num_keys = static_cast<int>(own.rows());
          base->num_queries = static_cast<int>(points.rows()) - base->num_keys;
          base->key_norm.resize(own.rows());
          for (int i = 0; i < own.rows(); ++i) base->key_norm[i] = own.row(i).norm();
          // The finished map of a projection, from the cache or just computed.
          auto finished = [&](const Projection& pr) {
            auto f = std::make_shared<GeometryFrame>(*base);
            f->coords = pr.coords;
            f->iteration = f->total = pr.iterations;
            f->kl = pr.kl;
            f->perplexity = pr.perplexity;
            f->theta = pr.theta;
            f->gradient = pr.gradient;
            f->explained[0] = pr.explained[0];
            f->explained[1] = pr.explained[1];
            f->done = true;
            return f;
          };
          if (auto cached = projection_cache().find(pkey)) {
            auto f = finished(*cached);
            f->from_cache = true;
            return f;
          }
          auto seconds = [&] {
            return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          };
          if (req.method == ProjectionMethod::Pca) {
            auto pr = std::make_shared<Projection>(
                compute_projection(info, *layer, head, req, backend, ctx.cancel_flag()));
            projection_cache().put(pkey, pr);
            auto f = finished(*pr);
            f->seconds = seconds();
            return f;
          }
          // The engine steps t-SNE and reports frames about 20 times a second for the animation.
          auto pr = std::make_shared<Projection>(run_tsne_projection(
              points, req.tsne, backend, ctx.cancel_flag(), 0.05, [&](const TsneRun& run) {
                ctx.progress(run.iteration(), run.total_iterations());
                auto f = std::make_shared<GeometryFrame>(*base);
                f->coords = run.embedding();
                f->iteration = run.iteration();
                f->total = run.total_iterations();
                f->kl = run.kl();
                f->perplexity = run.perplexity();
                f->theta = run.theta();
                f->gradient = run.gradient_name();
                f->seconds = seconds();
                partial(f);
              }));
          ctx.check_cancel();
          pr->num_keys = base->num_keys;
          pr->num_queries = base->num_queries;
          pr->query_head = base->query_head;
          projection_cache().put(pkey, pr);
          auto f = finished(*pr);
          f->seconds = seconds();
          return f;
        });
    out.emplace_back(name, p);
  }

  std::shared_ptr<const GeometryFrame> frame_of(const AppState& s, ProjectionSource src) const {
    return s.result(projection_result(src)).ptr<GeometryFrame>();
  }
  // The k-center result when it belongs to the current settings (else null: nothing marked).
  std::shared_ptr<const KCenterResult> kcenter_of(const AppState& s, ProjectionSource src) const {
    const Result& r = s.result(kcenter_result(src));
    if (r.key != r.want || r.want.empty()) return nullptr;
    return r.ptr<KCenterResult>();
  }
  std::string error_of(const AppState& s, ProjectionSource src) const {
    const Result& r = s.result(projection_result(src));
    return r.key == r.want ? r.error : std::string();
  }

  void draw_status(const AppState& s, ProjectionSource src) {
    const auto f = frame_of(s, src);
    if (!error_of(s, src).empty()) {
      ImGui::TextColored(ImVec4(1, 0.5f, 0.4f, 1), "%s", error_of(s, src).c_str());
      return;
    }
    if (!f || f->key != s.result(projection_result(src)).want) {
      ImGui::TextDisabled("layer %d, kv head %d, %s: computing ...", s.settings.focus.layer,
                          s.settings.focus.kv_head, projection_source_name(src));
      return;
    }
    char line[512];
    const char* synth = s.info()->synthetic ? "  [synthetic capture]" : "";
    std::string points = std::to_string(f->num_keys) + " " + projection_source_name(src);
    if (f->num_queries > 0)
      points += " + " + std::to_string(f->num_queries) + " queries (q head " +
                std::to_string(f->query_head) + ", joint space)";
    if (f->method == ProjectionMethod::Pca) {
      std::snprintf(line, sizeof line,
                    "layer %d, kv head %d: %s. PCA: the axes show %.1f%% and %.1f%% of the "
                    "variance.%s",
                    s.settings.focus.layer, s.settings.focus.kv_head, points.c_str(),
                    100 * f->explained[0], 100 * f->explained[1], synth);
    } else {
      std::snprintf(line, sizeof line,
                    "layer %d, kv head %d: %s. t-SNE perplexity %g, %s, iteration %d/%d%s, KL "
                    "%.3f%s%s",
                    s.settings.focus.layer, s.settings.focus.kv_head, points.c_str(), f->perplexity,
                    f->gradient.c_str(), f->iteration, f->total,
                    f->iteration < 250 ? " (early exaggeration)" : "", f->kl,
                    f->from_cache ? " (cached)" : "", synth);
    }
    ImGui::TextUnformatted(line);
    if (!f->done) {
      ImGui::SameLine();
      ImGui::ProgressBar(f->total > 0 ? float(f->iteration) / f->total : 0.f, ImVec2(120, 0));
    }
  }

  ImU32 point_colour(const AppState& s, const GeometryFrame& f, const KCenterResult* kc,
                     const TokenMarks* marks, int token, bool query) const {
    const int n = f.num_keys;
    switch (colour_) {
      case ColourBy::Kept:
        if (query) return kColQueryPoint;
        return marks ? token_colour(*marks, token) : IM_COL32(150, 150, 150, 255);
      case ColourBy::Position:
        return colormap(Colormap::Viridis, n > 1 ? double(token) / (n - 1) : 0.0);
      case ColourBy::Cluster: {
        if (query) return kColQueryPoint;
        if (const auto* mc = method_clusters(s); mc && f.source == ProjectionSource::Keys) {
          const int mid = token - s.run(0)->window.mid_begin;
          return mid >= 0 && mid < static_cast<int>(mc->size()) ? cluster_colour((*mc)[mid])
                                                                : kColDropped;
        }
        return kc && token < static_cast<int>(kc->fig.owner.size())
                   ? cluster_colour(kc->fig.owner[token])
                   : kColDropped;
      }
      case ColourBy::Norm: {
        if (query) return kColQueryPoint;
        return colormap(
            Colormap::Viridis,
            norm_hi_ > norm_lo_ ? (f.key_norm[token] - norm_lo_) / (norm_hi_ - norm_lo_) : 0.5);
      }
    }
    return kColDropped;
  }

  void draw_canvas(AppState& s, const GeometryFrame& f, ImVec2 size, bool stale) {
    const int total = static_cast<int>(f.coords.rows());
    if (total == 0) return;
    if (!stale) {
      ImGui::InvisibleButton("##geometry_canvas", size,
                             ImGuiButtonFlags_MouseButtonLeft | ImGuiButtonFlags_MouseButtonRight);
    }
    const ImVec2 p0 = ImGui::GetItemRectMin();
    const ImVec2 p1(p0.x + size.x, p0.y + size.y);
    ImDrawList* dl = ImGui::GetWindowDrawList();
    dl->AddRectFilled(p0, p1, kColPlotBg);
    const auto kc_ptr = kcenter_of(s, f.source);
    const KCenterResult* kc = kc_ptr.get();

    // Equal-aspect fit with a margin: distances on screen mean the same in x and y.
    float xmin = f.coords.col(0).minCoeff(), xmax = f.coords.col(0).maxCoeff();
    float ymin = f.coords.col(1).minCoeff(), ymax = f.coords.col(1).maxCoeff();
    const float margin = 14;
    const float span = std::max({xmax - xmin, ymax - ymin, 1e-12f});
    const float scale = std::min((size.x - 2 * margin) / std::max(xmax - xmin, 1e-12f * span),
                                 (size.y - 2 * margin) / std::max(ymax - ymin, 1e-12f * span));
    const float cx = 0.5f * (xmin + xmax), cy = 0.5f * (ymin + ymax);
    auto to_canvas = [&](int i) {
      return ImVec2(size.x * 0.5f + (f.coords(i, 0) - cx) * scale,
                    size.y * 0.5f - (f.coords(i, 1) - cy) * scale);
    };

    std::unique_ptr<TokenMarks> marks;
    if (s.run(0)) marks = std::make_unique<TokenMarks>(token_marks(*s.run(0)));
    if (!f.key_norm.empty()) {
      norm_lo_ = *std::min_element(f.key_norm.begin(), f.key_norm.end());
      norm_hi_ = *std::max_element(f.key_norm.begin(), f.key_norm.end());
    }

    // Draw order: queries, then dropped keys, then everything else, so kept tokens stay visible.
    auto layer_of = [&](int i) {
      if (i >= f.num_keys) return 0;
      if (colour_ == ColourBy::Kept && marks && i < static_cast<int>(marks->kind.size()) &&
          marks->kind[i] == TokenKind::Dropped)
        return 1;
      return 2;
    };
    order_.resize(total);
    for (int i = 0; i < total; ++i) order_[i] = i;
    std::stable_sort(order_.begin(), order_.end(),
                     [&](int a, int b) { return layer_of(a) < layer_of(b); });

    points_.clear();
    points_.reserve(total + 8);
    const float r = point_px_;
    for (int i : order_) {
      const bool query = i >= f.num_keys;
      const int token = query ? i - f.num_keys : i;
      PointInstance p;
      const ImVec2 c = to_canvas(i);
      p.x = c.x;
      p.y = c.y;
      p.colour = point_colour(s, f, kc, marks.get(), token, query);
      p.radius = query ? r * 0.9f : r;
      p.shape = query ? PointShape::Ring : PointShape::Disc;
      if (stale) p.colour = with_alpha(p.colour, 0.35f);
      points_.push_back(p);
    }
    // The k-center centres: green squares with a dark rim, above every point.
    if (settings_.centres && kc && !stale)
      for (int c : kc->fig.centres)
        if (c < f.num_keys) {
          const ImVec2 q = to_canvas(c);
          points_.push_back({q.x, q.y, IM_COL32(10, 12, 14, 255), r + 4.5f, PointShape::Square});
          points_.push_back({q.x, q.y, kColCentre, r + 3.0f, PointShape::Square});
        }
    // Linked highlights on top: the box selection, the clicked token, the hovered token.
    for (int t : s.selected_tokens)
      if (t >= 0 && t < f.num_keys) {
        const ImVec2 c = to_canvas(t);
        points_.push_back({c.x, c.y, kColSelect, r + 2.5f, PointShape::Ring});
      }
    hovered_ = -1;
    if (!stale && ImGui::IsItemHovered()) {
      const ImVec2 mouse = ImGui::GetIO().MousePos;
      float best = std::max(8.0f, r + 3) * std::max(8.0f, r + 3);
      for (int i = 0; i < total; ++i) {
        const ImVec2 c = to_canvas(i);
        const float dx = c.x + p0.x - mouse.x, dy = c.y + p0.y - mouse.y;
        if (dx * dx + dy * dy < best) best = dx * dx + dy * dy, hovered_ = i;
      }
    }
    const int hovered_token = hovered_ < 0 ? -1 : hovered_ % std::max(1, f.num_keys);
    if (hovered_token >= 0) s.hovered_token = hovered_token;
    const int highlight = s.hovered_token >= 0 ? s.hovered_token : s.selected_token;
    if (highlight >= 0 && highlight < f.num_keys) {
      const ImVec2 c = to_canvas(highlight);
      points_.push_back({c.x, c.y, kColHover, r + 4.0f, PointShape::Ring});
      if (f.num_queries > 0) {
        const ImVec2 q = to_canvas(f.num_keys + highlight);
        points_.push_back({q.x, q.y, kColHover, r + 3.0f, PointShape::Ring});
      }
    }
    renderers_[canvas_ & 1].draw(dl, p0, p1, points_);

    if (!stale) handle_mouse(s, f, p0, to_canvas);
    if (hovered_ >= 0 && !dragging_) hover_tooltip(s, f, kc, marks.get(), hovered_);
    draw_legend(s, f, kc, p0, p1);
    // The map's title (which row of SubGen's figure it is) and the renderer's path.
    const std::string title =
        std::string(f.source == ProjectionSource::Values ? "values" : "keys") +
        (kc && settings_.centres ? "  (green squares: " + std::to_string(kc->fig.centres.size()) +
                                       " greedy k-center centres)"
                                 : std::string());
    dl->AddText(ImVec2(p0.x + 6, p0.y + 4), kColAxisText, title.c_str());
    dl->AddText(ImVec2(p0.x + 6, p1.y - ImGui::GetTextLineHeight() - 4), kColAxisText,
                renderers_[canvas_ & 1].path_description().c_str());
  }

  template <class ToCanvas>
  void handle_mouse(AppState& s, const GeometryFrame& f, ImVec2 p0, const ToCanvas& to_canvas) {
    ImGuiIO& io = ImGui::GetIO();
    if (ImGui::IsItemClicked(ImGuiMouseButton_Left)) {
      drag_start_ = io.MousePos;
      dragging_ = false;
      drag_canvas_ = canvas_;
    }
    if (drag_canvas_ != canvas_) return;  // a drag belongs to the map it started in
    if (ImGui::IsItemActive() && ImGui::IsMouseDragging(ImGuiMouseButton_Left, 3.0f))
      dragging_ = true;
    if (dragging_) {
      const ImVec2 a(std::min(drag_start_.x, io.MousePos.x),
                     std::min(drag_start_.y, io.MousePos.y));
      const ImVec2 b(std::max(drag_start_.x, io.MousePos.x),
                     std::max(drag_start_.y, io.MousePos.y));
      ImDrawList* dl = ImGui::GetWindowDrawList();
      dl->AddRectFilled(a, b, with_alpha(kColSelect, 0.12f));
      dl->AddRect(a, b, kColSelect);
      if (ImGui::IsMouseReleased(ImGuiMouseButton_Left)) {
        if (!io.KeyShift) s.selected_tokens.clear();
        for (int i = 0; i < f.num_keys; ++i) {
          const ImVec2 c = to_canvas(i);
          const float x = c.x + p0.x, y = c.y + p0.y;
          if (x >= a.x && x <= b.x && y >= a.y && y <= b.y) s.selected_tokens.insert(i);
        }
        if (f.num_queries > 0)  // a query inside the box selects its position's token
          for (int i = f.num_keys; i < f.coords.rows(); ++i) {
            const ImVec2 c = to_canvas(i);
            const float x = c.x + p0.x, y = c.y + p0.y;
            if (x >= a.x && x <= b.x && y >= a.y && y <= b.y)
              s.selected_tokens.insert(i - f.num_keys);
          }
        dragging_ = false;
      }
    } else if (ImGui::IsItemDeactivated() && hovered_ >= 0) {
      s.selected_token = hovered_ % std::max(1, f.num_keys);
    }
    if (ImGui::IsItemClicked(ImGuiMouseButton_Right)) {
      s.selected_tokens.clear();
      s.selected_token = -1;
    }
  }

  void hover_tooltip(const AppState& s, const GeometryFrame& f, const KCenterResult* kc,
                     const TokenMarks* marks, int i) {
    const bool query = i >= f.num_keys;
    const int t = query ? i - f.num_keys : i;
    const bool values = f.source == ProjectionSource::Values;
    ImGui::BeginTooltip();
    ImGui::Text("%s of token %d  \"%s\"",
                query    ? "query"
                : values ? "value"
                         : "key",
                t, s.token_text(t).c_str());
    if (!query) {
      if (marks && t < static_cast<int>(marks->kind.size())) {
        const TokenKind k = marks->kind[t];
        if (k == TokenKind::Kept)
          ImGui::Text("kept by %s, weight %.3g", s.method_name(0).c_str(), marks->weight[t]);
        else
          ImGui::Text("%s (%s)", token_kind_name(k), s.method_name(0).c_str());
      }
      if (t < static_cast<int>(f.key_norm.size()))
        ImGui::Text("|%s| = %.3f", values ? "v" : "k", f.key_norm[t]);
      if (kc && t < static_cast<int>(kc->fig.owner.size())) {
        const int owner = kc->fig.owner[t];
        ImGui::Text("k-center cluster %d (centre: token %d)%s", owner, kc->fig.centres[owner],
                    kc->fig.centres[owner] == t ? " -- a centre" : "");
      }
    }
    ImGui::TextDisabled("drag: box-select, right click: clear");
    ImGui::EndTooltip();
  }

  void draw_legend(const AppState& s, const GeometryFrame& f, const KCenterResult* kc, ImVec2 p0,
                   ImVec2 p1) {
    struct Entry {
      ImU32 colour;
      std::string text;
    };
    std::vector<Entry> entries;
    switch (colour_) {
      case ColourBy::Kept:
        entries = {{kColSink, "sink"},
                   {kColWindow, "eval window"},
                   {IM_COL32(150, 215, 165, 255), "kept (weight 1)"},
                   {IM_COL32(20, 150, 60, 255), "kept (max weight)"},
                   {kColDropped, "dropped"}};
        if (!s.run(0)) entries.push_back({IM_COL32(150, 150, 150, 255), "(method A not run yet)"});
        break;
      case ColourBy::Position:
        entries = {{colormap(Colormap::Viridis, 0), "token 0"},
                   {colormap(Colormap::Viridis, 0.5), "middle"},
                   {colormap(Colormap::Viridis, 1), "token " + std::to_string(f.num_keys - 1)}};
        break;
      case ColourBy::Cluster: {
        if (method_clusters(s) && f.source == ProjectionSource::Keys) {
          entries = {{kClusterPalette[0], s.method_name(0) + "'s clusters (middle tokens)"},
                     {kColDropped, "outside the middle"}};
        } else {
          entries = {
              {kClusterPalette[0], "greedy k-center, k = " + std::to_string(settings_.clusters) +
                                       " (" + projection_source_name(f.source) + ")"}};
        }
        break;
      }
      case ColourBy::Norm: {
        char lo[64], hi[64];
        const char* v = f.source == ProjectionSource::Values ? "v" : "k";
        std::snprintf(lo, sizeof lo, "|%s| = %.3g", v, norm_lo_);
        std::snprintf(hi, sizeof hi, "|%s| = %.3g", v, norm_hi_);
        entries = {{colormap(Colormap::Viridis, 0), lo}, {colormap(Colormap::Viridis, 1), hi}};
        break;
      }
    }
    if (settings_.centres && kc) entries.push_back({kColCentre, "k-center centre (square)"});
    if (f.num_queries > 0) entries.push_back({kColQueryPoint, "query (ring)"});
    if (!s.selected_tokens.empty())
      entries.push_back({kColSelect, std::to_string(s.selected_tokens.size()) + " selected"});
    ImDrawList* dl = ImGui::GetWindowDrawList();
    const float lh = ImGui::GetTextLineHeight() + 3;
    float w = 0;
    for (const auto& e : entries) w = std::max(w, ImGui::CalcTextSize(e.text.c_str()).x);
    const ImVec2 a(p1.x - w - 34, p0.y + 6);
    const ImVec2 b(p1.x - 6, p0.y + 10 + lh * entries.size());
    dl->AddRectFilled(a, b, IM_COL32(16, 17, 20, 220), 3.0f);
    for (size_t i = 0; i < entries.size(); ++i) {
      const ImVec2 c(a.x + 12, a.y + 4 + lh * (i + 0.5f));
      dl->AddCircleFilled(c, 4.5f, entries[i].colour, 10);
      dl->AddText(ImVec2(a.x + 22, a.y + 4 + lh * i), kColAxisText, entries[i].text.c_str());
    }
  }

  // Clusters found vs n: how many greedy k-center centres cover the first n points within the
  // radius, for keys and values (SubGen's Definition 1: m clusters, sublinear in n), beside a
  // table of the same numbers.
  void draw_counts(const AppState& s, ImVec2 size) {
    const std::vector<ProjectionSource> srcs = sources();
    std::vector<std::shared_ptr<const KCenterResult>> kcs;
    int n_max = 16, c_max = 1;
    for (ProjectionSource src : srcs) {
      kcs.push_back(kcenter_of(s, src));
      if (kcs.back())
        for (size_t i = 0; i < kcs.back()->fig.prefix.size(); ++i) {
          n_max = std::max(n_max, kcs.back()->fig.prefix[i]);
          c_max = std::max(c_max, kcs.back()->fig.clusters[i]);
        }
    }
    const float plot_w = std::max(px(260), size.x * 0.45f);
    char title[160];
    std::snprintf(title, sizeof title, "clusters found vs n (radius %.2f x spread)",
                  settings_.radius_factor);
    Plot plot("##geometry_counts", ImVec2(plot_w, size.y), title,
              Axis{"n (log2)", 16, double(std::max(n_max, 32)), Scale::Log2},
              Axis{"clusters", 0, c_max * 1.15 + 1});
    const ImU32 cols[2] = {IM_COL32(86, 160, 229, 255), IM_COL32(240, 180, 60, 255)};
    std::vector<Plot::LegendEntry> legend;
    for (size_t i = 0; i < srcs.size(); ++i) {
      if (!kcs[i]) continue;
      std::vector<double> x(kcs[i]->fig.prefix.begin(), kcs[i]->fig.prefix.end());
      std::vector<double> y(kcs[i]->fig.clusters.begin(), kcs[i]->fig.clusters.end());
      const ImU32 col = cols[static_cast<int>(srcs[i])];
      plot.line(x, y, col, 2.0f);
      plot.markers(x, y, col, px(3));
      legend.push_back({projection_source_name(srcs[i]), col});
    }
    if (!legend.empty()) plot.legend(legend, Plot::Corner::TopLeft);
    ImGui::SameLine();
    // An explicit width a little inside the view, so wrapped text never reaches its edge.
    ImGui::BeginChild("##geometry_counts_table",
                      ImVec2(std::max(px(60), ImGui::GetContentRegionAvail().x - px(8)), size.y));
    ImGui::PushTextWrapPos(ImGui::GetCursorPosX() + ImGui::GetContentRegionAvail().x - px(4));
    for (size_t i = 0; i < srcs.size(); ++i) {
      const auto& kc = kcs[i];
      if (!kc) {
        ImGui::TextDisabled("%s: k-center pending ...", projection_source_name(srcs[i]));
        continue;
      }
      std::string row;
      for (size_t k = 0; k < kc->fig.prefix.size(); ++k) {
        row += (k ? ", " : "") + std::to_string(kc->fig.prefix[k]) + ": " +
               (kc->fig.capped[k] ? ">=" : "") + std::to_string(kc->fig.clusters[k]);
      }
      ImGui::Text(  // wrapped at the position pushed above
          "%s: radius %.3g (spread %.3g); %zu centres cover within %.3g. Clusters at n = %s",
          projection_source_name(srcs[i]), kc->fig.radius, kc->spread, kc->fig.centres.size(),
          kc->fig.covering, row.c_str());
    }
    ImGui::PopTextWrapPos();
    ImGui::EndChild();
  }

  // A one-line token strip around the hovered (else clicked, else first selected) token, in the
  // Tokens view's colours, so hover in the map shows the token in its context.
  void draw_token_strip(const AppState& s) {
    const int n = s.num_tokens();
    int centre = s.hovered_token >= 0 ? s.hovered_token : s.selected_token;
    if (centre < 0 && !s.selected_tokens.empty()) centre = *s.selected_tokens.begin();
    if (centre < 0 || centre >= n) {
      ImGui::TextDisabled(
          "Hover a point to see its token in context; drag a box to select tokens.");
      return;
    }
    std::unique_ptr<TokenMarks> marks;
    if (s.run(0)) marks = std::make_unique<TokenMarks>(token_marks(*s.run(0)));
    ImDrawList* dl = ImGui::GetWindowDrawList();
    const float width = ImGui::GetContentRegionAvail().x;
    const float h = ImGui::GetTextLineHeight() + 6;
    const ImVec2 origin = ImGui::GetCursorScreenPos();
    // Lay out tokens left and right of the centre until the row is full.
    float x_centre = origin.x + width * 0.5f;
    auto token_w = [&](int i) {
      return ImGui::CalcTextSize(short_text(s.token_text(i)).c_str()).x + 8;
    };
    int lo = centre, hi = centre;
    float left = x_centre - token_w(centre) * 0.5f, right = x_centre + token_w(centre) * 0.5f;
    while (true) {
      bool grew = false;
      if (lo > 0 && left - token_w(lo - 1) - 2 > origin.x) left -= token_w(--lo) + 2, grew = true;
      if (hi < n - 1 && right + token_w(hi + 1) + 2 < origin.x + width)
        right += token_w(++hi) + 2, grew = true;
      if (!grew) break;
    }
    float x = left;
    for (int i = lo; i <= hi; ++i) {
      const std::string text = short_text(s.token_text(i));
      const float w = token_w(i);
      const ImVec2 a(x, origin.y), b(x + w, origin.y + h);
      const ImU32 bg = marks ? token_colour(*marks, i) : IM_COL32(80, 80, 90, 255);
      dl->AddRectFilled(a, b, with_alpha(bg, 0.85f), 3.0f);
      dl->AddText(ImVec2(a.x + 4, a.y + 3), IM_COL32(10, 10, 12, 255), text.c_str());
      if (s.selected_tokens.count(i)) dl->AddRect(a, b, kColSelect, 3.0f, 0, 2.0f);
      if (i == centre) dl->AddRect(a, b, kColHover, 3.0f, 0, 2.0f);
      x += w + 2;
    }
    ImGui::Dummy(ImVec2(width, h));
    ImGui::TextDisabled(
        "token %d of %d%s", centre, n,
        s.selected_tokens.empty()
            ? ""
            : ("; " + std::to_string(s.selected_tokens.size()) + " selected").c_str());
  }

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

}  // namespace

std::unique_ptr<View> make_geometry_view() {
  return std::make_unique<GeometryView>();
}

}  // namespace kvscope::app
