#include "app/overlap_grid.h"

#include <cmath>
#include <cstdio>

#include "app/views/view_jobs.h"
#include "engine/core/error.h"
#include "engine/eval/selection_check.h"
#include "engine/eval/selection_overlap.h"

namespace kvscope::app {

namespace {

// What the overlap job reads: the capture, the window's overrides, the keep ratio, the seed, and
// each slot's method with its own parameters (selections only: neither estimator nor backend).
struct OverlapSlot {
  std::string method;
  ParamValues params;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(OverlapSlot, method, params)
struct OverlapInput {
  uint64_t capture = 0;
  int sink = -1, eval = -1;
  double keep_ratio = 0;
  uint64_t seed = 0;
  OverlapSlot a, b;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(OverlapInput, capture, sink, eval, keep_ratio, seed, a, b)

std::shared_ptr<const OverlapGrid> run_overlap(const OverlapInput& in, const CaptureRef& h,
                                               JobContext& ctx, const JobPlan::PartialFn&) {
  const CaptureInfo& ci = h.capture->info();
  auto settings = [&](const OverlapSlot& sl) {
    return method_settings_of({sl.method, sl.params, in.keep_ratio, in.sink, in.eval});
  };
  const MethodSettings a = settings(in.a), b = settings(in.b);
  auto g = std::make_shared<OverlapGrid>();
  g->layers = ci.num_layers;
  g->heads = ci.kv_heads;
  g->method_a = in.a.method;
  g->method_b = in.b.method;
  const size_t cells = static_cast<size_t>(g->layers * g->heads);
  g->jaccard.assign(cells, NAN);
  g->a_kept.assign(cells, 0);
  g->b_kept.assign(cells, 0);
  g->both.assign(cells, 0);
  g->note.assign(cells, "");
  auto select = [&](const LayerData& layer, int kv, const MethodSettings& ms) {
    const EvalWindow win =
        EvalWindow::make(static_cast<int>(layer.keys[kv].rows()), ms.keep_ratio, ms.sink, ms.eval);
    MethodInput mi = make_method_input(layer, ci.num_layers, kv, win, ms, in.seed);
    mi.cancel = ctx.cancel_flag();
    Selection sel = ms.method->select(mi);
    check_selection(sel, win.mid_begin, win.mid_end, win.budget, *ms.method);
    return sel;
  };
  for (int l = 0; l < g->layers; ++l) {
    const std::shared_ptr<const LayerData> layer = h.capture->layer(l);
    for (int kv = 0; kv < g->heads; ++kv) {
      ctx.check_cancel();
      ctx.progress(l * g->heads + kv, static_cast<int>(cells));
      const size_t c = static_cast<size_t>(l * g->heads + kv);
      if (kv < static_cast<int>(layer->refused.size()) && !layer->refused[kv].empty()) {
        g->note[c] = layer->refused[kv];
        continue;
      }
      try {
        const KeptOverlap o = kept_overlap(select(*layer, kv, a), select(*layer, kv, b));
        g->jaccard[c] = o.jaccard();
        g->a_kept[c] = o.a;
        g->b_kept[c] = o.b;
        g->both[c] = o.both;
      } catch (const Cancelled&) {
        throw;
      } catch (const std::exception& e) {
        g->note[c] = e.what();
      }
    }
  }
  return g;
}

}  // namespace

JobPlan plan_overlap(const AppState& s) {
  JobPlan p;
  if (!s.capture || !s.settings.ab_enabled) return p;
  const CaptureInfo& ci = s.capture->info();
  const MethodSettings a = s.method_settings(0), b = s.method_settings(1);
  OverlapInput in;
  in.capture = s.capture_id;
  in.sink = a.sink;
  in.eval = a.eval;
  in.keep_ratio = s.settings.keep_ratio;
  in.seed = static_cast<uint64_t>(s.settings.seed);
  in.a = {s.method_name(0), a.params};
  in.b = {s.method_name(1), b.params};
  p.derive("overlap", std::move(in), CaptureRef{s.capture, nullptr}, &run_overlap);
  p.lane = Lane::Analysis;
  p.label = "A/B overlap of kept sets";
  p.cost_class = "overlap:" + s.method_name(0) + "+" + s.method_name(1);
  p.units = static_cast<double>(ci.num_tokens) * ci.head_dim * 64.0 * ci.num_layers * ci.kv_heads;
  p.auto_limit_s = 3.0;
  return p;
}

GridValues overlap_grid_values(const AppState& s) {
  GridValues gv;
  const CaptureInfo* ci = s.info();
  if (!ci) return gv;
  gv.layers = ci->num_layers;
  gv.heads = ci->kv_heads;
  const size_t cells = static_cast<size_t>(gv.layers * gv.heads);
  gv.mean.assign(cells, NAN);
  gv.spread.assign(cells, NAN);
  gv.note.assign(cells, "");
  gv.missing.assign(cells, 1);
  gv.unit = "Jaccard";
  gv.map = Colormap::Viridis;
  const Result& r = s.result(kOverlap);
  const OverlapGrid* g = r.get<OverlapGrid>();
  if (!s.settings.ab_enabled) {
    gv.caption = "the A/B overlap needs method B (Method view: compare with method B)";
  } else if (!r.error.empty()) {
    gv.caption = "overlap failed: " + r.error;
  } else if (!g) {
    gv.caption = r.busy() ? "selecting with A and B on every head..." : "no overlap yet";
  } else {
    gv.caption = "A/B overlap: Jaccard |A n B| / |A u B| of the kept middle tokens of " +
                 g->method_a + " (A) and " + g->method_b + " (B), seed " +
                 std::to_string(s.settings.seed) + " (1: the same tokens, 0: none in common)" +
                 (r.stale() ? " [stale: earlier settings]" : "");
    if (g->layers == gv.layers && g->heads == gv.heads)
      for (size_t c = 0; c < cells; ++c) {
        gv.mean[c] = g->jaccard[c];
        gv.missing[c] = 0;
        char buf[160];
        std::snprintf(buf, sizeof buf, "|A| = %d, |B| = %d, |A n B| = %d", g->a_kept[c],
                      g->b_kept[c], g->both[c]);
        gv.note[c] = g->note[c].empty() ? buf : g->note[c];
      }
  }
  gv.have_values = false;
  for (double v : gv.mean) gv.have_values = gv.have_values || std::isfinite(v);
  gv.vmin = 0;  // a fixed scale: overlaps compare across settings
  gv.vmax = 1;
  return gv;
}

nlohmann::json overlap_json(const AppState& s) {
  const OverlapGrid* g = s.result(kOverlap).get<OverlapGrid>();
  if (!g) return nullptr;
  nlohmann::json cells = nlohmann::json::array();
  for (int l = 0; l < g->layers; ++l)
    for (int h = 0; h < g->heads; ++h) {
      const size_t c = static_cast<size_t>(l * g->heads + h);
      cells.push_back(
          {{"layer", l},
           {"kv_head", h},
           {"jaccard", std::isfinite(g->jaccard[c]) ? nlohmann::json(g->jaccard[c]) : nullptr},
           {"a_kept", g->a_kept[c]},
           {"b_kept", g->b_kept[c]},
           {"both", g->both[c]},
           {"note", g->note[c]}});
    }
  return {{"method_a", g->method_a},
          {"method_b", g->method_b},
          {"measure", "jaccard = |A n B| / |A u B| of the kept middle tokens"},
          {"stale", s.result(kOverlap).stale()},
          {"cells", cells}};
}

}  // namespace kvscope::app
