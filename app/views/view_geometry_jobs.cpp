// The Geometry view's jobs: the 2-D maps (PCA or t-SNE) and the greedy k-center results of the
// focused head's point sets, planned from the settings and the view's choices
// (AppState::reconcile() runs them; docs/geometry.md), and reading those results back. The class is
// in app/views/view_geometry_view.h; its drawing is in app/views/view_geometry.cpp.

#include "app/views/view_geometry_view.h"
#include "app/views/view_jobs.h"

namespace kvscope::app::geometry {

ProjectionRequest GeometryView::request_for(const AppState& s, ProjectionSource src) const {
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

void GeometryView::plan(const AppState& s, std::vector<NamedPlan>& out) const {
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

namespace {

// What a k-center job reads: the focused head's points (capture, layer, head, keys or values),
// k, the radius factor, the count cap, and the backend that picks the centres.
struct KCenterInput {
  uint64_t capture = 0;
  int layer = 0, kv_head = 0, source = 0;  // source: ProjectionSource
  int clusters = 0;
  double radius_factor = 0;
  int cap = 0;
  std::string backend;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(KCenterInput, capture, layer, kv_head, source, clusters,
                                   radius_factor, cap, backend)

std::shared_ptr<const KCenterResult> run_kcenter(const KCenterInput& in, const LayerRef& h,
                                                 JobContext& ctx, const JobPlan::PartialFn&) {
  const auto t0 = std::chrono::steady_clock::now();
  const ProjectionSource src = static_cast<ProjectionSource>(in.source);
  const size_t head = static_cast<size_t>(in.kv_head);
  const MatrixF& x = src == ProjectionSource::Values ? h.layer->values[head] : h.layer->keys[head];
  auto r = std::make_shared<KCenterResult>();
  r->key = JobPlan::derived_key("kcenter", in);
  r->source = src;
  r->spread = rms_spread(x);
  Backend& b = h.backend ? *h.backend : cpu_backend();
  r->fig = kcenter_figure(b, x, in.clusters, std::max(in.radius_factor * r->spread, 1e-12), in.cap,
                          ctx.cancel_flag());
  r->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

// What a map reads: the focused head's points (capture, layer, head, source; the capture's path
// names it in the process-wide projection cache), the view's projection choices
// (GeometryView::request_for) and the backend.
struct MapInput {
  uint64_t capture = 0;
  std::string capture_path;
  int layer = 0, kv_head = 0;
  int method = 0, source = 0;  // ProjectionMethod, ProjectionSource
  double perplexity = 0;
  int iterations = 0, exaggeration_iterations = 0;
  bool with_queries = false;
  int query_head = -1;
  std::string backend;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(MapInput, capture, capture_path, layer, kv_head, method, source,
                                   perplexity, iterations, exaggeration_iterations, with_queries,
                                   query_head, backend)
struct MapHandles {
  CaptureInfo info;  // of the input's capture
  std::shared_ptr<const LayerData> layer;
  Backend* backend = nullptr;
};

// The input of a request; PCA reads none of t-SNE's parameters.
MapInput map_input(const ProjectionRequest& r) {
  MapInput in;
  in.method = static_cast<int>(r.method);
  in.source = static_cast<int>(r.source);
  if (r.method == ProjectionMethod::Tsne) {
    in.perplexity = r.tsne.perplexity;
    in.iterations = r.tsne.iterations;
    in.exaggeration_iterations = r.tsne.exaggeration_iterations;
  }
  in.with_queries = r.with_queries;
  in.query_head = r.query_head;
  return in;
}

ProjectionRequest map_request(const MapInput& in) {
  ProjectionRequest r;
  r.method = static_cast<ProjectionMethod>(in.method);
  r.source = static_cast<ProjectionSource>(in.source);
  if (r.method == ProjectionMethod::Tsne) {
    r.tsne.perplexity = in.perplexity;
    r.tsne.iterations = in.iterations;
    r.tsne.exaggeration_iterations = in.exaggeration_iterations;
  }
  r.with_queries = in.with_queries;
  r.query_head = in.query_head;
  return r;
}

std::string cache_key(const MapInput& in) {
  return projection_key(in.capture_path, in.layer, in.kv_head, map_request(in));
}

std::shared_ptr<const GeometryFrame> run_map(const MapInput& in, const MapHandles& h,
                                             JobContext& ctx, const JobPlan::PartialFn& partial) {
  const auto t0 = std::chrono::steady_clock::now();
  const ProjectionRequest req = map_request(in);
  const std::string pkey = cache_key(in);
  const int head = in.kv_head;
  const LayerData& layer = *h.layer;
  auto base = std::make_shared<GeometryFrame>();
  base->key = JobPlan::derived_key("map", in);
  base->method = req.method;
  base->source = req.source;
  MatrixF points = projection_input(h.info, layer, head, req, &base->query_head);
  const MatrixF& own =
      req.source == ProjectionSource::Values ? layer.values[head] : layer.keys[head];
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
        compute_projection(h.info, layer, head, req, h.backend, ctx.cancel_flag()));
    projection_cache().put(pkey, pr);
    auto f = finished(*pr);
    f->seconds = seconds();
    return f;
  }
  // The engine steps t-SNE and reports frames about 20 times a second for the animation.
  auto pr = std::make_shared<Projection>(run_tsne_projection(
      points, req.tsne, h.backend, ctx.cancel_flag(), 0.05, [&](const TsneRun& run) {
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
}

}  // namespace

void GeometryView::plan_kcenter(const AppState& s, ProjectionSource src,
                                std::vector<NamedPlan>& out) const {
  JobPlan p;
  const char* name = kcenter_result(src);
  if (!s.capture) {
    out.emplace_back(name, p);
    return;
  }
  const Focus f = s.settings.focus;
  KCenterInput in{s.capture_id,       f.layer,
                  f.kv_head,          static_cast<int>(src),
                  settings_.clusters, settings_.radius_factor,
                  kKCenterCap,        s.backend_active};
  auto layer = s.focus_layer();
  p.derive("kcenter", std::move(in), LayerRef{layer, s.backend()}, &run_kcenter);
  if (!layer) {
    p.waiting = "loading layer " + std::to_string(f.layer);
    out.emplace_back(name, p);
    return;
  }
  if (s.focus_refused()) {
    p = JobPlan{};  // the view says why; nothing to compute
    out.emplace_back(name, p);
    return;
  }
  p.lane = Lane::Geometry;
  p.label =
      src == ProjectionSource::Values ? "Geometry: k-center (values)" : "Geometry: k-center (keys)";
  p.cost_class = "kcenter";
  // The prefixes 16, 32, ..., n sum to about 2n points, each counted against up to the cap of
  // centres twice (the backend's picks and the double-precision covering check).
  const double n = static_cast<double>(s.info()->num_tokens);
  p.units = 4.0 * n * std::min<double>(kKCenterCap, n);
  p.prior_per_unit = 2e-7;
  p.auto_limit_s = 10.0;
  out.emplace_back(name, p);
}

void GeometryView::plan_projection(const AppState& s, ProjectionSource src,
                                   std::vector<NamedPlan>& out) const {
  JobPlan p;
  const char* name = projection_result(src);
  if (!s.capture) {
    out.emplace_back(name, p);
    return;
  }
  const ProjectionRequest req = request_for(s, src);
  MapInput in = map_input(req);
  in.capture = s.capture_id;
  in.capture_path = s.capture_path;
  in.layer = s.settings.focus.layer;
  in.kv_head = s.settings.focus.kv_head;
  in.backend = s.backend_active;
  const std::string pkey = cache_key(in);
  auto layer = s.focus_layer();
  Backend* backend = s.backend();
  p.derive("map", std::move(in), MapHandles{*s.info(), layer, backend}, &run_map);
  if (!layer) {
    p.waiting = "loading layer " + std::to_string(s.settings.focus.layer);
    out.emplace_back(name, p);
    return;
  }
  if (s.focus_refused()) {
    p = JobPlan{};  // the view says why; nothing to compute
    out.emplace_back(name, p);
    return;
  }
  const CaptureInfo& info = *s.info();
  p.lane = Lane::Geometry;
  const std::string what = src == ProjectionSource::Values ? " (values)" : "";
  p.label = (req.method == ProjectionMethod::Pca ? "Geometry: PCA" : "Geometry: t-SNE") + what;
  const double points = static_cast<double>(info.num_tokens) * (req.with_queries ? 2 : 1);
  const bool cached = projection_cache().find(pkey) != nullptr;
  // Long maps on the CPU take the FFT-interpolated repulsion (TsneRun's automatic choice), whose
  // cost per point and iteration is a third of Barnes-Hut's: its own cost class, so a measured
  // 8k-point Barnes-Hut map does not set the estimate of a 32k-point FFT one.
  const bool fft = req.method == ProjectionMethod::Tsne && req.tsne.theta < 0 &&
                   points > req.tsne.fft_threshold && !(backend && backend->parallel_in_one_call());
  p.cost_class = req.method == ProjectionMethod::Pca ? "pca" : fft ? "tsne-fft" : "tsne";
  // t-SNE (Barnes-Hut): about 1 us per point and iteration on the 2-core build machine (8192
  // keys, 1000 iterations: 7.4 s); FFT about 0.3 us (32768 keys: about 10 s); PCA is linear
  // in the points. Deliberately on the slow side; measured at run time after.
  p.prior_per_unit = req.method == ProjectionMethod::Pca ? 1e-6 : fft ? 0.5e-6 : 1.5e-6;
  p.units = cached ? 0 : points * (req.method == ProjectionMethod::Pca ? 1 : req.tsne.iterations);
  p.auto_limit_s = 3.0;
  out.emplace_back(name, p);
}

std::shared_ptr<const GeometryFrame> GeometryView::frame_of(const AppState& s,
                                                            ProjectionSource src) const {
  return s.result(projection_result(src)).ptr<GeometryFrame>();
}

std::shared_ptr<const KCenterResult> GeometryView::kcenter_of(const AppState& s,
                                                              ProjectionSource src) const {
  const Result& r = s.result(kcenter_result(src));
  if (r.key != r.want || r.want.empty()) return nullptr;
  return r.ptr<KCenterResult>();
}

std::string GeometryView::error_of(const AppState& s, ProjectionSource src) const {
  const Result& r = s.result(projection_result(src));
  return r.key == r.want ? r.error : std::string();
}

}  // namespace kvscope::app::geometry
