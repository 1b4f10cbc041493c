// The Geometry view's jobs: the 2-D maps (PCA or t-SNE) and the greedy k-center results of the
// focused head's point sets, planned from the settings and the view's choices
// (AppState::reconcile() runs them; docs/geometry.md), and reading those results back. The class is
// in app/view_geometry_view.h; its drawing is in app/view_geometry.cpp.

#include "app/view_geometry_view.h"

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

void GeometryView::plan_kcenter(const AppState& s, ProjectionSource src,
                                std::vector<NamedPlan>& out) const {
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
  p.label =
      src == ProjectionSource::Values ? "Geometry: k-center (values)" : "Geometry: k-center (keys)";
  p.cost_class = "kcenter";
  // The prefixes 16, 32, ..., n sum to about 2n points, each counted against up to the cap of
  // centres twice (the backend's picks and the double-precision covering check).
  const double n = static_cast<double>(s.info()->num_tokens);
  p.units = 4.0 * n * std::min<double>(kKCenterCap, n);
  p.prior_per_unit = 2e-7;
  p.auto_limit_s = 10.0;
  p.returns<KCenterResult>([=](JobContext& ctx,
                               const JobPlan::PartialFn&) -> std::shared_ptr<const KCenterResult> {
    const auto t0 = std::chrono::steady_clock::now();
    const MatrixF& x = src == ProjectionSource::Values ? layer->values[head] : layer->keys[head];
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

void GeometryView::plan_projection(const AppState& s, ProjectionSource src,
                                   std::vector<NamedPlan>& out) const {
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
                   points > req.tsne.fft_threshold && !(backend && backend->parallel_in_one_call());
  p.cost_class = req.method == ProjectionMethod::Pca ? "pca" : fft ? "tsne-fft" : "tsne";
  // t-SNE (Barnes-Hut): about 1 us per point and iteration on the 2-core build machine (8192
  // keys, 1000 iterations: 7.4 s); FFT about 0.3 us (32768 keys: about 10 s); PCA is linear
  // in the points. Deliberately on the slow side; measured at run time after.
  p.prior_per_unit = req.method == ProjectionMethod::Pca ? 1e-6 : fft ? 0.5e-6 : 1.5e-6;
  p.units = cached ? 0 : points * (req.method == ProjectionMethod::Pca ? 1 : req.tsne.iterations);
  p.auto_limit_s = 3.0;
  p.returns<GeometryFrame>([=](JobContext& ctx, const JobPlan::PartialFn& partial)
                               -> std::shared_ptr<const GeometryFrame> {
    const auto t0 = std::chrono::steady_clock::now();
    auto base = std::make_shared<GeometryFrame>();
    base->key = key;
    base->method = req.method;
    base->source = src;
    MatrixF points = projection_input(info, *layer, head, req, &base->query_head);
    const MatrixF& own = src == ProjectionSource::Values ? layer->values[head] : layer->keys[head];
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
