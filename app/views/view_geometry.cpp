// Geometry view: the focused head's keys, values or both in 2-D (PCA or t-SNE; keys optionally
// joint with one query head's queries, as AttentionViz does), coloured by what method A kept, by
// position, by cluster or by norm, with the greedy k-center centres marked and the clusters
// found at a radius as the prefix grows (SubGen's Figure 1 and Definition 1; docs/geometry.md).
// The k-center work is its own planned result per point set, run through the backend. t-SNE runs on
// the worker's Geometry lane and posts frames while it converges, so the map animates; finished
// maps are cached per (capture, layer, head, parameters). Hover names the token and shows it in the
// context strip below the map; dragging a box selects tokens (shared with the Tokens view through
// AppState::selected_tokens).

#include "app/colormap.h"
#include "app/views/view_geometry_view.h"

namespace kvscope::app::geometry {

const char* GeometryView::help() const {
  return "A 2-D map (PCA or t-SNE) of the focused head's keys, values or both side by side "
         "(SubGen's Figure 1), keys optionally joint with their queries, coloured by "
         "kept/dropped, position, cluster or norm, with the greedy k-center centres marked and "
         "the clusters found vs n below. Hover a point for its token; box-select points to "
         "outline those tokens in the Tokens view.";
}

namespace {
// Held for a Run click (its estimate over the limit) or cancelled: nothing is computing it.
bool waits_for_run(const Result& r) {
  return (!r.held.empty() && r.held == r.want) || (!r.cancelled.empty() && r.cancelled == r.want);
}
}  // namespace

bool GeometryView::ready(const AppState& s) const {
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

void GeometryView::draw(AppState& s) {
  if (!s.info()) {
    ImGui::TextDisabled("No capture open.");
    return;
  }
  if (!presenting_view()) draw_controls(s);  // a presentation shows the maps alone
  std::string why;
  if (s.focus_refused(&why)) {
    ImGui::TextColored(kTextError, "This head is refused: %s", why.c_str());
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
  // The token strip's height (draw_token_strip: a row of tokens and a line under it), and each
  // item's spacing below it, so that the maps take what is left exactly.
  const float spacing = ImGui::GetStyle().ItemSpacing.y;
  const float strip_h =
      ImGui::GetTextLineHeight() + px(6) + spacing + ImGui::GetTextLineHeightWithSpacing();
  const float counts_h = px(150);
  ImVec2 avail = ImGui::GetContentRegionAvail();
  const float gap = ImGui::GetStyle().ItemSpacing.x;
  const float each_w =
      std::max(px(100), (avail.x - gap * (srcs.size() - 1)) / static_cast<float>(srcs.size()));
  // The maps are the figure: in a panel at least 60% of the height (at 2x the counts and the
  // strip took all but 100 px), what does not fit below them scrolling; presented (F11) the
  // view has the room for all of it.
  const float least_h = presenting_view() ? px(160) : std::max(px(160), 0.6f * avail.y);
  const ImVec2 canvas_size(each_w, std::max(least_h, avail.y - strip_h - counts_h - spacing));
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
          !error_of(s, srcs[i]).empty()    ? "No map (see the message above)."
          : waits_for_run(s.result(rname)) ? "The map waits for Run (above)."
                                           : "Computing the map ...");
      if (frame) draw_canvas(s, *frame, canvas_size, /*stale=*/true);
    } else {
      draw_canvas(s, *frame, canvas_size, false);
    }
    ImGui::PopID();
  }
  draw_counts(s, ImVec2(avail.x, counts_h - ImGui::GetStyle().ItemSpacing.y));
  draw_token_strip(s);
}

nlohmann::json GeometryView::export_json(const AppState& s) const {
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

std::string GeometryView::export_csv(const AppState& s) const {
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

nlohmann::json GeometryView::save_state() const {
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

void GeometryView::load_state(const nlohmann::json& j) {
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

std::vector<ProjectionSource> GeometryView::sources() const {
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

void GeometryView::draw_controls(AppState& s) {
  // The toolbar wraps on narrow windows (toolbar_next).
  ImGui::SetNextItemWidth(px(90));
  int m = settings_.method == ProjectionMethod::Pca ? 0 : 1;
  if (ImGui::Combo("map", &m, "PCA\0t-SNE\0"))
    settings_.method = m == 0 ? ProjectionMethod::Pca : ProjectionMethod::Tsne;
  toolbar_next(labelled_width(px(100), "points"));
  ImGui::SetNextItemWidth(fit_width(100, "points"));
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
  ImGui::SetNextItemWidth(fit_width(215, "colour"));
  int c = static_cast<int>(colour_);
  if (ImGui::Combo("colour", &c, kColourNames, 4)) colour_ = static_cast<ColourBy>(c);
  if (settings_.method == ProjectionMethod::Tsne) {
    toolbar_next(labelled_width(px(110), "perplexity"));
    ImGui::SetNextItemWidth(fit_width(110, "perplexity"));
    ImGui::SliderInt("perplexity", &edit_perplexity_, 2, 100);
    if (ImGui::IsItemDeactivatedAfterEdit()) settings_.perplexity = edit_perplexity_;
    toolbar_next(labelled_width(px(110), "iterations"));
    ImGui::SetNextItemWidth(fit_width(110, "iterations"));
    ImGui::SliderInt("iterations", &edit_iterations_, 250, 5000);
    if (ImGui::IsItemDeactivatedAfterEdit()) settings_.iterations = edit_iterations_;
  }
  toolbar_next(ImGui::GetFrameHeight() + labelled_width(0, "centres"));
  ImGui::Checkbox("centres", &settings_.centres);
  if (ImGui::IsItemHovered())
    ImGui::SetTooltip("Mark the greedy k-center centres (green squares), as SubGen's Figure 1.");
  toolbar_next(labelled_width(px(90), "k"));
  ImGui::SetNextItemWidth(fit_width(90, "k"));
  ImGui::SliderInt("k", &edit_clusters_, 2, 32);
  if (ImGui::IsItemDeactivatedAfterEdit()) settings_.clusters = edit_clusters_;
  if (ImGui::IsItemHovered())
    ImGui::SetTooltip("Greedy k-center centres to mark and colour by (SubGen's Figure 1: 16).");
  toolbar_next(labelled_width(px(110), "radius"));
  ImGui::SetNextItemWidth(fit_width(110, "radius"));
  ImGui::SliderFloat("radius", &edit_radius_, 0.05f, 2.0f, "%.2f x spread");
  if (ImGui::IsItemDeactivatedAfterEdit()) settings_.radius_factor = edit_radius_;
  if (ImGui::IsItemHovered())
    ImGui::SetTooltip(
        "The radius delta of the clusters-vs-n counts, in units of each point set's spread\n"
        "(root mean square distance to its mean), so keys and values are compared alike.");
  toolbar_next(labelled_width(px(80), "point"));
  ImGui::SetNextItemWidth(fit_width(80, "point"));
  ImGui::SliderFloat("point", &point_px_, 1.0f, 8.0f, "%.1f px");
  if (!s.selected_tokens.empty()) {
    toolbar_next(ImGui::CalcTextSize("clear selection").x + ImGui::GetStyle().FramePadding.x * 2);
    if (ImGui::SmallButton("clear selection")) s.selected_tokens.clear();
  }
}

const std::vector<int>* GeometryView::method_clusters(const AppState& s) const {
  if (!s.run(0) || s.run(0)->selection.cluster.empty()) return nullptr;
  return &s.run(0)->selection.cluster;
}

void GeometryView::draw_status(const AppState& s, ProjectionSource src) {
  const auto f = frame_of(s, src);
  if (!error_of(s, src).empty()) {
    ImGui::TextColored(kTextError, "%s", error_of(s, src).c_str());
    return;
  }
  if (!f || f->key != s.result(projection_result(src)).want) {
    ImGui::TextDisabled(
        "layer %d, kv head %d, %s: %s", s.settings.focus.layer, s.settings.focus.kv_head,
        projection_source_name(src),
        waits_for_run(s.result(projection_result(src))) ? "not computed yet" : "computing ...");
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
  ImGui::TextWrapped("%s; points drawn with %s", line,
                     renderers_[static_cast<int>(src) & 1].path_description().c_str());
  if (!f->done) {  // its own line: the wrapped text may take the whole width
    ImGui::ProgressBar(f->total > 0 ? float(f->iteration) / f->total : 0.f, ImVec2(px(120), 0));
  }
}

ImU32 GeometryView::point_colour(const AppState& s, const GeometryFrame& f, const KCenterResult* kc,
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

void GeometryView::draw_canvas(AppState& s, const GeometryFrame& f, ImVec2 size, bool stale) {
  const int total = static_cast<int>(f.coords.rows());
  if (total == 0) return;
  if (!stale) {
    ImGui::InvisibleButton("##geometry_canvas", size,
                           ImGuiButtonFlags_MouseButtonLeft | ImGuiButtonFlags_MouseButtonRight);
  }
  const ImVec2 p0 = ImGui::GetItemRectMin();
  const ImVec2 p1(p0.x + size.x, p0.y + size.y);
  log_figure(p0, p1);
  ImDrawList* dl = ImGui::GetWindowDrawList();
  dl->AddRectFilled(p0, p1, kColPlotBg);
  const auto kc_ptr = kcenter_of(s, f.source);
  const KCenterResult* kc = kc_ptr.get();

  // The map's frame: its title above the points and the legend in a column at the right or in
  // rows under the title, whichever leaves the larger square for the (equal-aspect) map, so
  // that neither text nor legend ever covers a point.
  const std::vector<LegendEntry> legend = legend_entries(s, f, kc);
  const float line_h = ImGui::GetTextLineHeight();
  ImVec2 d0(px(4), line_h + px(8)), d1(size.x - px(4), size.y - px(4));
  LegendLayout lay = layout_legend(legend, size.x);
  lay.column = std::min(d1.x - d0.x - lay.column_w - px(6), d1.y - d0.y) >=
               std::min(d1.x - d0.x, d1.y - d0.y - lay.rows_h - px(4));
  ImVec2 legend_at;
  if (lay.column) {
    legend_at = ImVec2(size.x - lay.column_w - px(6), d0.y);
    d1.x -= lay.column_w + px(6);
  } else {
    legend_at = ImVec2(px(6), d0.y);
    d0.y += lay.rows_h + px(4);
  }
  d1.y = std::max(d1.y, d0.y + 1), d1.x = std::max(d1.x, d0.x + 1);
  // Equal-aspect fit with a margin (a point's radius): distances on screen mean the same in x
  // and y.
  float xmin = f.coords.col(0).minCoeff(), xmax = f.coords.col(0).maxCoeff();
  float ymin = f.coords.col(1).minCoeff(), ymax = f.coords.col(1).maxCoeff();
  const float margin = point_px_ + px(5);
  const float span = std::max({xmax - xmin, ymax - ymin, 1e-12f});
  const float data_w = std::max(1.0f, d1.x - d0.x - 2 * margin);
  const float data_h = std::max(1.0f, d1.y - d0.y - 2 * margin);
  const float scale = std::min(data_w / std::max(xmax - xmin, 1e-12f * span),
                               data_h / std::max(ymax - ymin, 1e-12f * span));
  const float cx = 0.5f * (xmin + xmax), cy = 0.5f * (ymin + ymax);
  const ImVec2 mid(0.5f * (d0.x + d1.x), 0.5f * (d0.y + d1.y));
  auto to_canvas = [&](int i) {
    return ImVec2(mid.x + (f.coords(i, 0) - cx) * scale, mid.y - (f.coords(i, 1) - cy) * scale);
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
  draw_legend(legend, lay, ImVec2(p0.x + legend_at.x, p0.y + legend_at.y));
  // The map's title: which row of SubGen's figure it is.
  const std::string title =
      std::string(f.source == ProjectionSource::Values ? "values" : "keys") +
      (kc && settings_.centres ? "  (green squares: " + std::to_string(kc->fig.centres.size()) +
                                     " greedy k-center centres)"
                               : std::string());
  dl->AddText(ImVec2(p0.x + px(6), p0.y + px(4)), kColAxisText,
              elide(title, size.x - px(12)).c_str());
}

template <class ToCanvas>
void GeometryView::handle_mouse(AppState& s, const GeometryFrame& f, ImVec2 p0,
                                const ToCanvas& to_canvas) {
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
    const ImVec2 a(std::min(drag_start_.x, io.MousePos.x), std::min(drag_start_.y, io.MousePos.y));
    const ImVec2 b(std::max(drag_start_.x, io.MousePos.x), std::max(drag_start_.y, io.MousePos.y));
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

void GeometryView::hover_tooltip(const AppState& s, const GeometryFrame& f, const KCenterResult* kc,
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

std::vector<GeometryView::LegendEntry> GeometryView::legend_entries(const AppState& s,
                                                                    const GeometryFrame& f,
                                                                    const KCenterResult* kc) const {
  std::vector<LegendEntry> entries;
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
  return entries;
}

GeometryView::LegendLayout GeometryView::layout_legend(const std::vector<LegendEntry>& entries,
                                                       float canvas_w) {
  // Each entry's place in both shapes, from its box's corner: draw_legend draws what this
  // measured, so the box always holds its entries.
  LegendLayout lay;
  const float lh = ImGui::GetTextLineHeight() + px(3), mark = px(22), pad = px(8);
  const float row_w = canvas_w - px(12);  // the rows' box spans the canvas
  float text_w = 0, x = 0, y = px(4);
  for (size_t i = 0; i < entries.size(); ++i) {
    const float w = ImGui::CalcTextSize(entries[i].text.c_str()).x;
    text_w = std::max(text_w, w);
    if (x > 0 && x + mark + w > row_w - pad) x = 0, y += lh;  // on to the next row
    lay.in_rows.emplace_back(x, y);
    lay.in_column.emplace_back(0.0f, px(4) + lh * static_cast<float>(i));
    x += mark + w + pad;
  }
  lay.column_w = text_w + mark + pad;
  lay.column_h = lh * static_cast<float>(entries.size()) + px(8);
  lay.rows_w = row_w;
  lay.rows_h = y + lh + px(4);
  return lay;
}

void GeometryView::draw_legend(const std::vector<LegendEntry>& entries, const LegendLayout& lay,
                               ImVec2 at) {
  ImDrawList* dl = ImGui::GetWindowDrawList();
  const float lh = ImGui::GetTextLineHeight() + px(3), mark = px(22);
  const ImVec2 box =
      lay.column ? ImVec2(lay.column_w, lay.column_h) : ImVec2(lay.rows_w, lay.rows_h);
  dl->AddRectFilled(at, ImVec2(at.x + box.x, at.y + box.y), IM_COL32(16, 17, 20, 220), px(3));
  const std::vector<ImVec2>& places = lay.column ? lay.in_column : lay.in_rows;
  for (size_t i = 0; i < entries.size(); ++i) {
    const ImVec2 e(at.x + places[i].x, at.y + places[i].y);
    dl->AddCircleFilled(ImVec2(e.x + px(12), e.y + lh * 0.5f), px(4.5f), entries[i].colour, 10);
    dl->AddText(ImVec2(e.x + mark, e.y), kColAxisText, entries[i].text.c_str());
  }
}

void GeometryView::draw_counts(const AppState& s, ImVec2 size) {
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
  // The numbers beside the plot while they keep 160 px (at 1x) of the width; else under it.
  const float gap = ImGui::GetStyle().ItemSpacing.x;
  const bool beside = size.x - std::max(px(260), size.x * 0.45f) - gap >= px(160);
  const float plot_w = beside ? std::max(px(260), size.x * 0.45f) : size.x;
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
  if (beside) ImGui::SameLine();
  // An explicit width a little inside the view, so wrapped text never reaches its edge.
  ImGui::BeginChild("##geometry_counts_table",
                    ImVec2(std::max(px(60), ImGui::GetContentRegionAvail().x - px(8)),
                           beside ? size.y : 4 * ImGui::GetTextLineHeightWithSpacing()));
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

void GeometryView::draw_token_strip(const AppState& s) {
  const int n = s.num_tokens();
  int centre = s.hovered_token >= 0 ? s.hovered_token : s.selected_token;
  if (centre < 0 && !s.selected_tokens.empty()) centre = *s.selected_tokens.begin();
  if (centre < 0 || centre >= n) {
    ImGui::TextDisabled("Hover a point to see its token in context; drag a box to select tokens.");
    return;
  }
  std::unique_ptr<TokenMarks> marks;
  if (s.run(0)) marks = std::make_unique<TokenMarks>(token_marks(*s.run(0)));
  ImDrawList* dl = ImGui::GetWindowDrawList();
  const float width = ImGui::GetContentRegionAvail().x;
  const float h = ImGui::GetTextLineHeight() + px(6);
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

}  // namespace kvscope::app::geometry

namespace kvscope::app {

std::unique_ptr<View> make_geometry_view() {
  return std::make_unique<geometry::GeometryView>();
}

}  // namespace kvscope::app
