// Walk view: the self-balancing walk of BalanceKV (method A's trace, engine/attention/walk_trace.h)
// for one block of one halving round, step by step: the 2-D walk path (prefix signed sum on the
// block's top two kernel-PCA directions) against random signs, p_i with the drawn signs, the
// partial sums sum_{j<i} K_ij sigma_j, and the discrepancy along the trace query and in kernel
// norm, walk vs random signs. Play / pause / step / scrub; the token being walked is shown in the
// strip below and becomes the app's selected token, so the Tokens view follows.

#include <stdexcept>

#include "app/colormap.h"
#include "app/play_bar.h"
#include "app/result_status.h"
#include "app/views/view_jobs.h"
#include "app/views/view_walk_view.h"

namespace kvscope::app::walk {

const char* WalkView::help() const {
  return "BalanceKV's self-balancing walk for one block and round: the 2-D path of the signed "
         "partial sums, the probabilities p_i, and the discrepancy against random signs. Play, "
         "step or scrub through the walk.";
}

bool WalkView::ready(const AppState& s) const {
  if (!s.capture || !is_walk_method(s.method_name(0))) return true;
  return (s.run(0) || !s.run_error(0).empty()) && !own(s, kWalkQuery).pending &&
         !own(s, kWalkCompare).pending;
}

void WalkView::draw(AppState& s) {
  if (!s.info()) {
    ImGui::TextDisabled("No capture open.");
    return;
  }
  if (!is_walk_method(s.method_name(0))) {
    const std::vector<std::string> walkers = walk_method_names();
    ImGui::TextWrapped(
        "Walk traces come from the self-balancing walk of these methods. Method "
        "A is %s.",
        s.method_name(0).c_str());
    for (const std::string& w : walkers) {
      char label[128];
      std::snprintf(label, sizeof label, "Use %s as method A", w.c_str());
      if (ImGui::Button(label)) s.settings.method[0].name = w;
      record_item(s, "walk:use:" + w);
    }
    return;
  }
  if (!s.run_error(0).empty()) {
    ImGui::TextColored(kTextError, "%s: %s", s.method_name(0).c_str(), s.run_error(0).c_str());
    return;
  }
  if (!s.run(0)) {
    ImGui::TextDisabled("Running %s on layer %d, kv head %d ...", s.method_name(0).c_str(),
                        s.settings.focus.layer, s.settings.focus.kv_head);
    return;
  }
  const OwnTrace main = own(s, kWalkQuery);
  const auto trace = shown_trace(s);
  if (!trace || trace->blocks.empty()) {
    if (main.pending) {
      ImGui::TextDisabled("Walking with discrepancy along query %d ...", query_);
      return;
    }
    const std::string why = !main.error.empty() ? main.error : trace ? trace->note : std::string();
    ImGui::TextDisabled("%s returned no walk trace for this head%s%s", s.method_name(0).c_str(),
                        why.empty() ? "." : ": ", why.c_str());
    return;
  }
  if (trace.get() != last_trace_) {
    // A new run (settings, head, seed or query changed): keep round/block when they still exist.
    last_trace_ = trace.get();
    round_ = std::clamp(round_, 0, std::max(0, trace->rounds - 1));
    clamp_block(*trace);
    step_ = -1;  // show the whole walk until the user plays or scrubs
  }
  draw_controls(s, *trace);
  const WalkBlockTrace* b = current_block(*trace);
  if (!b || b->sigma.empty()) {
    ImGui::TextDisabled("No block %d in round %d.", block_, round_);
    return;
  }
  if (!presenting_view()) draw_saturation(s, *trace, *b);  // advice: one F11 away
  const int len = static_cast<int>(b->sigma.size());
  if (step_ >= len) step_ = len - 1;
  advance_playback(len);
  const int cur = step_ < 0 ? len - 1 : step_;
  if (playing_ || step_ >= 0) s.selected_token = b->tokens[cur];

  mark_figure_top();
  if (compare_ > 0) {
    draw_side_by_side(s, *trace, *b, cur);
    return;
  }
  const float strip_h = ImGui::GetTextLineHeightWithSpacing() * 2.4f;
  const ImVec2 avail = ImGui::GetContentRegionAvail();
  const float gap = ImGui::GetStyle().ItemSpacing.x;
  // Two columns of two plots; one column of four when two plots side by side would not keep
  // their least width (2x and more in a panel): the view scrolls down, never sideways.
  const bool two_columns = (avail.x - gap) / 2 >= min_plot_size().x;
  const float plot_w = two_columns ? (avail.x - gap) / 2 : avail.x;
  const float plot_h = std::max(px(130), (avail.y - strip_h - ImGui::GetStyle().ItemSpacing.y) / 2);
  auto next = [&] {
    if (two_columns) ImGui::SameLine();
  };
  int hovered = -1;
  draw_path_plot("##walk_path", *b, cur, ImVec2(plot_w, plot_h), "");
  next();
  hovered = std::max(hovered, draw_p_plot("##walk_p", *b, cur, ImVec2(plot_w, plot_h), ""));
  hovered = std::max(hovered, draw_partial_plot(*b, cur, ImVec2(plot_w, plot_h)));
  next();
  hovered = std::max(
      hovered, draw_discrepancy_plot("##walk_disc", *trace, *b, cur, ImVec2(plot_w, plot_h), ""));
  hover_tooltip(s, *b, hovered);
  draw_strip(s, *b, cur);
}

nlohmann::json WalkView::export_json(const AppState& s) const {
  const WalkBlockTrace* b = exported_block(s);
  if (!b) return nullptr;
  nlohmann::json j;
  j["view"] = "walk";
  j["capture"] = s.capture_path;
  j["layer"] = s.settings.focus.layer;
  j["kv_head"] = s.settings.focus.kv_head;
  j["method"] = s.method_name(0);
  j["round"] = b->round;
  j["block"] = b->block;
  j["trace_query"] = shown_trace(s)->trace_query;
  const Saturation sat = saturation_of(*b);
  j["saturation"] = {{"clipped_steps", sat.clipped},
                     {"steps", sat.steps},
                     {"share", sat.share()},
                     {"whole_walk_share", saturation_of(*shown_trace(s)).share()}};
  const Result& ar = s.result(kWalkAdvice);
  if (const WalkAdvice* a = ar.fresh() ? ar.get<WalkAdvice>() : nullptr) {
    nlohmann::json effects = nlohmann::json::array();
    for (const RemedyEffect& e : a->effects)
      effects.push_back(
          {{"remedy", walk_comparisons()[static_cast<size_t>(e.comparison)].short_label},
           {"params",
            with_walk_overrides(*s.method(0), s.method_settings(0).params,
                                walk_comparisons()[static_cast<size_t>(e.comparison)].overrides)},
           {"error", e.error},
           {"saturation", e.saturation}});
    const HeadRun* run = s.result(kFocusA).fresh() ? s.run(0) : nullptr;
    const int best = run ? best_remedy(*a, run->mean_relative) : -1;
    j["advice"] = {
        {"error_now", run ? nlohmann::json(run->mean_relative) : nlohmann::json()},
        {"effects", effects},
        {"offered", best > 0
                        ? nlohmann::json(walk_comparisons()[static_cast<size_t>(best)].short_label)
                        : nlohmann::json()}};
  }
  j["halving_cut"] = b->halving_cut;
  j["tokens"] = b->tokens;
  j["p"] = b->p;
  j["sigma"] = b->sigma;
  j["partial"] = b->partial;
  j["disc_query"] = b->disc_query;
  j["disc_kernel"] = b->disc_kernel;
  j["random_disc_query"] = b->random_disc_query;
  j["random_disc_kernel"] = b->random_disc_kernel;
  j["kept"] = b->kept;
  return j;
}

std::string WalkView::export_csv(const AppState& s) const {
  const WalkBlockTrace* b = exported_block(s);
  if (!b) return {};
  std::ostringstream out;
  out << "step,token,p,sigma,partial,disc_query,disc_kernel,random_disc_query,"
         "random_disc_kernel,path_x,path_y,random_path_x,random_path_y,kept\n";
  for (size_t i = 0; i < b->sigma.size(); ++i) {
    const auto path = i < b->path.size() ? b->path[i] : std::array<double, 2>{0, 0};
    const auto rpath = i < b->random_path.size() ? b->random_path[i] : std::array<double, 2>{0, 0};
    out << i << ',' << at(b->tokens, i) << ',' << at(b->p, i) << ',' << at(b->sigma, i) << ','
        << at(b->partial, i) << ',' << at(b->disc_query, i) << ',' << at(b->disc_kernel, i) << ','
        << at(b->random_disc_query, i) << ',' << at(b->random_disc_kernel, i) << ',' << path[0]
        << ',' << path[1] << ',' << rpath[0] << ',' << rpath[1] << ',' << at(b->kept, i) << '\n';
  }
  return out.str();
}

nlohmann::json WalkView::save_state() const {
  return {{"round", round_},       {"block", block_}, {"speed", speed_},
          {"log_scales", symlog_}, {"query", query_}, {"compare", compare_}};
}

void WalkView::load_state(const nlohmann::json& j) {
  // Every field is checked before anything changes; a wrong one throws InputError naming it
  // ("session field \"views.walk.speed\": ..."), and AppUi::load_session refuses the session.
  const JsonField f(j, "session", "views.walk");
  const int round = f.get("round", 0, 0, 1 << 20);
  const int block = f.get("block", 0, 0, 1 << 20);
  const double speed = f.get("speed", static_cast<double>(speed_), 1.0, 200.0);
  const bool symlog = f.get("log_scales", symlog_);
  const int query = f.get("query", -1, -1, 1 << 30);
  const int compare = f.get("compare", 0, 0, static_cast<int>(walk_comparisons().size()) - 1);
  round_ = round;
  block_ = block;
  speed_ = static_cast<float>(speed);
  symlog_ = symlog;
  query_ = query;
  compare_ = compare;
}

std::vector<int> WalkView::blocks_of_round(const WalkTrace& t) const {
  std::vector<int> out;
  for (size_t i = 0; i < t.blocks.size(); ++i)
    if (t.blocks[i].round == round_) out.push_back(static_cast<int>(i));
  return out;
}

void WalkView::clamp_block(const WalkTrace& t) {
  const int count = static_cast<int>(blocks_of_round(t).size());
  block_ = std::clamp(block_, 0, std::max(0, count - 1));
}

const WalkBlockTrace* WalkView::current_block(const WalkTrace& t) const {
  const auto idx = blocks_of_round(t);
  if (idx.empty() || block_ < 0 || block_ >= static_cast<int>(idx.size())) return nullptr;
  return &t.blocks[static_cast<size_t>(idx[block_])];
}

const WalkBlockTrace* WalkView::exported_block(const AppState& s) const {
  const auto t = shown_trace(s);
  return t ? current_block(*t) : nullptr;
}

WalkView::OwnTrace WalkView::own(const AppState& s, const char* name) {
  OwnTrace o;
  const Result& r = s.result(name);
  if (r.want.empty()) return o;
  if (r.key != r.want || r.partial) {
    o.pending = true;
    return o;
  }
  o.trace = r.ptr<WalkTrace>();
  o.error = r.error;
  return o;
}

std::shared_ptr<const WalkTrace> WalkView::shown_trace(const AppState& s) const {
  if (query_ >= 0) return own(s, kWalkQuery).trace;
  return s.run(0) ? s.run(0)->selection.trace : nullptr;
}

MethodSettings WalkView::with_overrides(const AppState& s, const ParamValues& overrides) {
  MethodSettings ms = s.method_settings(0);
  if (ms.method) ms.params = with_walk_overrides(*ms.method, ms.params, overrides);
  return ms;
}

void WalkView::plan(const AppState& s, std::vector<NamedPlan>& out) const {
  out.emplace_back(kWalkAdvice, plan_advice(s));
  out.emplace_back(kWalkQuery, plan_trace(s, query_ >= 0, {}));
  out.emplace_back(
      kWalkCompare,
      plan_trace(s, compare_ > 0,
                 walk_comparisons()[static_cast<size_t>(std::max(0, compare_))].overrides));
}

namespace {

// What a walk trace reads: method A's settings with the comparison's overrides, the window, the
// estimator and backend (common), the focused head, the seed and the traced query.
struct TraceInput {
  EvalCommon common;
  int layer = 0, kv_head = 0, num_layers = 0;
  MethodRunInput run;
  uint64_t seed = 0;
  int query = -1;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(TraceInput, common, layer, kv_head, num_layers, run, seed, query)

std::shared_ptr<const WalkTrace> run_trace(const TraceInput& in, const LayerRef& h, JobContext& ctx,
                                           const JobPlan::PartialFn&) {
  const MethodSettings ms = method_settings_of(in.run, parse_estimator(in.common.estimator));
  const MatrixF& K = h.layer->keys.at(static_cast<size_t>(in.kv_head));
  const EvalWindow w =
      EvalWindow::make(static_cast<int>(K.rows()), ms.keep_ratio, ms.sink, ms.eval);
  MethodInput mi = make_method_input(*h.layer, in.num_layers, in.kv_head, w, ms, in.seed);
  mi.want_trace = true;
  mi.trace_query = in.query;
  mi.cancel = ctx.cancel_flag();
  mi.backend = h.backend;
  std::shared_ptr<const WalkTrace> tr = ms.method->select(mi).trace;
  if (!tr) throw InputError(ms.method->name() + " returned no walk trace");
  return tr;
}

// What the advice reads: a trace's input and the remedies to try (walk_comparisons() indices).
struct AdviceInput {
  TraceInput trace;
  std::vector<int> remedies;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(AdviceInput, trace, remedies)

// Each remedy on the focused head, as the focused run of method A with its overrides: the error
// the view would show after "use ...", and the walk's saturation then.
std::shared_ptr<const WalkAdvice> run_advice(const AdviceInput& in, const LayerRef& h,
                                             JobContext& ctx, const JobPlan::PartialFn&) {
  if (!h.layer) throw std::logic_error("walk.advice: planned without its layer");
  const MethodSettings base =
      method_settings_of(in.trace.run, parse_estimator(in.trace.common.estimator));
  auto advice = std::make_shared<WalkAdvice>();
  for (size_t i = 0; i < in.remedies.size(); ++i) {
    MethodSettings ms = base;
    ms.params =
        with_walk_overrides(*ms.method, ms.params,
                            walk_comparisons().at(static_cast<size_t>(in.remedies[i])).overrides);
    const HeadRun r = run_head(*h.layer, in.trace.num_layers, in.trace.kv_head, ms, in.trace.seed,
                               false, h.backend, ctx.cancel_flag());
    advice->effects.push_back({in.remedies[i], r.mean_relative, r.selection.saturation});
    ctx.progress(static_cast<int>(i + 1), static_cast<int>(in.remedies.size()));
  }
  return advice;
}

}  // namespace

JobPlan WalkView::plan_advice(const AppState& s) const {
  JobPlan p;
  // Wanted while the block shown is saturated, as the advice line says (draw_saturation).
  // Only for method A's run of the settings shown (a stale run is another head's or parameters').
  const WalkBlockTrace* b = s.result(kFocusA).fresh() ? exported_block(s) : nullptr;
  const Method* m = s.method(0);
  if (!b || !m || query_ >= 0 || saturation_of(*b).share() <= 0.5) return p;
  const MethodSettings ms = s.method_settings(0);
  const std::vector<int> remedies = saturation_remedies(*m, ms.params);
  if (remedies.empty()) return p;
  const Focus f = s.settings.focus;
  const CaptureInfo& ci = *s.info();
  AdviceInput in{{s.eval_common(), f.layer, f.kv_head, ci.num_layers,
                  method_run_input(m->name(), ms), static_cast<uint64_t>(s.settings.seed), -1},
                 remedies};
  std::shared_ptr<const LayerData> layer = s.focus_layer();
  p.derive("walk.advice", std::move(in), LayerRef{layer, s.backend()}, &run_advice);
  if (!layer) {
    p.waiting = "loading layer " + std::to_string(f.layer);
    return p;
  }
  if (s.focus_refused()) return JobPlan{};
  const EvalWindow w0 = s.window();
  p.lane = Lane::Geometry;
  p.label = "remedies for the saturated walk";
  p.cost_class = "head:" + m->name();
  p.units = static_cast<double>(remedies.size()) * head_units(ci, w0);
  p.auto_limit_s = 20.0;
  return p;
}

JobPlan WalkView::plan_trace(const AppState& s, bool needed, const ParamValues& overrides) const {
  JobPlan p;
  if (!needed || !s.capture || !is_walk_method(s.method_name(0)) || !s.method(0)) return p;
  const MethodSettings ms = with_overrides(s, overrides);
  const Focus f = s.settings.focus;
  const CaptureInfo& ci = *s.info();
  std::shared_ptr<const LayerData> layer = s.focus_layer();
  TraceInput in{s.eval_common(),
                f.layer,
                f.kv_head,
                ci.num_layers,
                method_run_input(ms.method->name(), ms),
                static_cast<uint64_t>(s.settings.seed),
                query_};
  p.derive("walk", std::move(in), LayerRef{layer, s.backend()}, &run_trace);
  if (!layer) {
    p.waiting = "loading layer " + std::to_string(f.layer);
    return p;
  }
  if (s.focus_refused()) return JobPlan{};  // the view says why; nothing to compute
  const EvalWindow w0 = s.window();
  p.lane = Lane::Geometry;
  p.label = "walk " + describe_params(*ms.method, ms.params);
  // Same work as a focused run (which also records the trace): same cost class and units.
  p.cost_class = "head:" + ms.method->name();
  p.units = head_units(ci, w0);
  p.auto_limit_s = 20.0;
  return p;
}

void WalkView::draw_controls(AppState& s, const WalkTrace& t) {
  // One toolbar that wraps on narrow windows; every control keeps its place across frames. In a
  // presentation only the playback: the play bar and the step.
  const bool settings = !presenting_view();
  if (settings) {
    ImGui::SetNextItemWidth(px(110));
    if (ImGui::SliderInt("round", &round_, 0, std::max(0, t.rounds - 1))) {
      clamp_block(t);
      step_ = -1;
    }
  }
  const int blocks = static_cast<int>(blocks_of_round(t).size());
  if (settings) {
    toolbar_next(labelled_width(px(140), "block"));
    ImGui::SetNextItemWidth(fit_width(140, "block"));
    if (ImGui::SliderInt("block", &block_, 0, std::max(0, blocks - 1))) step_ = -1;
  }
  const WalkBlockTrace* b = current_block(t);
  const int len = b ? static_cast<int>(b->sigma.size()) : 0;
  PlayBar bar;
  bar.playing = playing_;
  bar.first = [this] { step_ = 0, playing_ = false; };
  bar.back = [this, len] { step_back(len); };
  bar.toggle = [this, len] { toggle_play(len); };
  bar.forward = [this, len] { step_forward(len); };
  bar.last = [this, len] { step_ = len - 1, playing_ = false; };
  if (settings) toolbar_next(play_bar_width(bar));
  draw_play_bar(nullptr, bar);
  int scrub = step_ < 0 ? len - 1 : step_;
  toolbar_next(labelled_width(px(200), "step"));
  ImGui::SetNextItemWidth(fit_width(200, "step"));
  if (ImGui::SliderInt("step", &scrub, 0, std::max(0, len - 1))) step_ = scrub, playing_ = false;
  if (!settings) {
    ImGui::TextWrapped("L%d H%d, %s: round %d, block %d, %d tokens", s.settings.focus.layer,
                       s.settings.focus.kv_head, s.method_name(0).c_str(), round_, block_, len);
    return;
  }
  toolbar_next(labelled_width(px(80), "steps/s"));
  ImGui::SetNextItemWidth(fit_width(80, "steps/s"));
  ImGui::SliderFloat("steps/s", &speed_, 1.0f, 120.0f, "%.0f");
  toolbar_next(ImGui::GetFrameHeight() + labelled_width(0, "log scales"));
  ImGui::Checkbox("log scales", &symlog_);
  if (ImGui::IsItemHovered())
    ImGui::SetTooltip(
        "Kernel entries exp(<k_i,k_j>/sqrt d) of real keys span many decades. When a series\n"
        "spans more than three, draw it on a symmetric log (sums, path) or log (norms) axis.");
  // The query along which the discrepancy is measured: the last one, or any position.
  const int n = s.num_tokens();
  const EvalWindow w = s.window();
  const int qlo = std::max(0, n - std::max(1, w.eval));
  bool last = query_ < 0;
  toolbar_next(ImGui::GetFrameHeight() + labelled_width(0, "last query") + px(150) +
               labelled_width(0, "query"));
  if (ImGui::Checkbox("last query", &last)) query_ = last ? -1 : std::max(qlo, n - 2);
  if (ImGui::IsItemHovered())
    ImGui::SetTooltip(
        "The discrepancy plot measures the prefix along one query q:\n"
        "|sum_j sigma_j exp(<k_j,q>/sqrt d) v_j|. Untick to choose the query position.");
  ImGui::SameLine();
  ImGui::SetNextItemWidth(px(150));
  int qpos = query_ < 0 ? n - 1 : query_;
  if (last) ImGui::BeginDisabled();
  if (ImGui::SliderInt("query", &qpos, qlo, std::max(qlo, n - 1))) query_ = qpos;
  if (last) ImGui::EndDisabled();
  toolbar_next(labelled_width(px(210), "compare with"));
  ImGui::SetNextItemWidth(fit_width(210, "compare with"));
  const auto& cmp = walk_comparisons();
  if (ImGui::BeginCombo("compare with", cmp[static_cast<size_t>(compare_)].label)) {
    for (size_t i = 0; i < cmp.size(); ++i)
      if (ImGui::Selectable(cmp[i].label, static_cast<int>(i) == compare_))
        compare_ = static_cast<int>(i);
    ImGui::EndCombo();
  }
  if (ImGui::IsItemHovered())
    ImGui::SetTooltip(
        "Side by side: the same block walked with the current settings and with these.");

  // Printed in parts (one long chain of string + made GCC 12 warn, -Wrestrict, falsely).
  const std::string params = describe_params(*s.method(0), s.method_settings(0).params);
  char where[160];
  std::snprintf(where, sizeof where,
                "): %d round(s), %d block(s) in round %d, %d tokens in this block", t.rounds,
                static_cast<int>(blocks), static_cast<int>(round_), static_cast<int>(len));
  const std::string query = t.trace_query >= 0 ? std::to_string(t.trace_query) : "";
  ImGui::TextWrapped("L%d H%d, %s (%s%s%s%s%s%s", s.settings.focus.layer, s.settings.focus.kv_head,
                     s.method_name(0).c_str(), params.c_str(), where,
                     query.empty() ? "" : "; discrepancy along query ", query.c_str(),
                     t.note.empty() ? "" : ". ", t.note.c_str());
}

void WalkView::draw_saturation(AppState& s, const WalkTrace& t, const WalkBlockTrace& b) {
  const Saturation blk = saturation_of(b), all = saturation_of(t);
  char line[512];
  std::snprintf(line, sizeof line,
                "Saturation: %.0f%% of this block's %d steps (%.0f%% of the whole walk) have "
                "p_i <= 0 or >= 1 before clipping.",
                100 * blk.share(), blk.steps, 100 * all.share());
  const bool high = blk.share() > 0.5;
  const Method* m = s.method(0);
  // A remedy is offered only once its effect on this head's error is computed (walk.advice),
  // and only when it lowers it; it always changes the settings and keeps the walk balancing.
  const Result& res = s.result(kWalkAdvice);
  const WalkAdvice* advice = res.fresh() ? res.get<WalkAdvice>() : nullptr;
  const HeadRun* run = s.result(kFocusA).fresh() ? s.run(0) : nullptr;  // the error now
  const double now = run ? run->mean_relative : NAN;
  const int remedy = high && advice && run ? best_remedy(*advice, now) : -1;
  const auto label_of = [](int i) {
    return walk_comparisons()[static_cast<size_t>(i)].short_label;
  };
  std::string advice_text = "Most signs are drawn at random with a bias: the walk balances.";
  if (high) {
    advice_text =
        "Those signs are forced: the walk is deterministic there and does no random balancing "
        "(one or two huge kernel entries decide). ";
    if (!m || saturation_remedies(*m, s.method_settings(0).params).empty()) {
      advice_text +=
          "None of this view's remedies (temp 0.1 with block 256, temp 0.1, temp "
          "0.02 with gamma 0.1) changes these settings.";
    } else if (!advice) {
      advice_text += "Computing what each remedy does to this head's error...";
    } else {
      std::string tried;
      for (const RemedyEffect& e : advice->effects) {
        char buf[96];
        std::snprintf(buf, sizeof buf, "%s%s: %.4f", tried.empty() ? "" : ", ",
                      label_of(e.comparison), e.error);
        tried += buf;
      }
      char now_text[32], to_text[32];
      std::snprintf(now_text, sizeof now_text, "%.4f", now);
      if (remedy > 0) {
        double to = NAN;
        for (const RemedyEffect& e : advice->effects)
          if (e.comparison == remedy) to = e.error;
        std::snprintf(to_text, sizeof to_text, "%.4f", to);
        advice_text += std::string("Try ") + label_of(remedy) + ": this head's error goes from " +
                       now_text + " to " + to_text + " (computed on this head: " + tried + ").";
      } else {
        advice_text += std::string("No remedy lowers this head's error (now ") + now_text + "; " +
                       tried + "): the saturation is what this head's keys give.";
      }
    }
  }
  ImGui::PushStyleColor(ImGuiCol_Text,
                        high ? ImVec4(1.0f, 0.78f, 0.35f, 1) : ImVec4(0.75f, 0.77f, 0.8f, 1));
  ImGui::TextWrapped("%s %s", line, advice_text.c_str());
  ImGui::PopStyleColor();
  if (high && !advice) draw_result_status(s, kWalkAdvice, "the remedies' effect");
  if (remedy > 0) {
    const std::string use = std::string("use ") + label_of(remedy);
    toolbar_next(button_width(use.c_str()));
    if (ImGui::Button(use.c_str())) {
      // A settings edit: reconcile() re-runs method A (and everything keyed on its params).
      ParamValues& pv = s.settings.method[0].params;
      pv = with_walk_overrides(*m, pv, walk_comparisons()[static_cast<size_t>(remedy)].overrides);
      if (compare_ == remedy) compare_ = 0;  // it would compare the settings with themselves
    }
    record_item(s, "walk:use remedy");
    if (compare_ != remedy) {
      toolbar_next(button_width("compare side by side"));
      if (ImGui::Button("compare side by side")) compare_ = remedy;
    }
  }
}

void WalkView::toggle_play(int len) {
  playing_ = !playing_;
  if (playing_ && (step_ < 0 || step_ >= len - 1)) step_ = 0;
  carry_ = 0;
}

void WalkView::step_back(int len) {
  step_ = std::max(0, (step_ < 0 ? len - 1 : step_) - 1);
  playing_ = false;
}

void WalkView::step_forward(int len) {
  step_ = std::min(len - 1, (step_ < 0 ? len - 1 : step_) + 1);
  playing_ = false;
}

void WalkView::hover_tooltip(AppState& s, const WalkBlockTrace& b, int hovered) {
  const int len = static_cast<int>(b.sigma.size());
  if (hovered < 0 || hovered >= len) return;
  s.hovered_token = b.tokens[hovered];
  ImGui::BeginTooltip();
  ImGui::Text("step %d: token %d \"%s\"", hovered, b.tokens[hovered],
              s.token_text(b.tokens[hovered]).c_str());
  ImGui::Text("p = %.4f, sigma = %+d, partial sum = %.4g", b.p[hovered], b.sigma[hovered],
              b.partial[hovered]);
  if (hovered < static_cast<int>(b.kept.size()))
    ImGui::Text("%s this round", b.kept[hovered] ? "kept" : "dropped");
  ImGui::TextDisabled("click: go to this step");
  ImGui::EndTooltip();
  if (ImGui::IsMouseClicked(ImGuiMouseButton_Left)) {
    step_ = hovered;
    playing_ = false;
  }
}

void WalkView::draw_side_by_side(AppState& s, const WalkTrace& t, const WalkBlockTrace& b,
                                 int cur) {
  const WalkComparison& c = walk_comparisons()[static_cast<size_t>(compare_)];
  const Method* m = s.method(0);
  const std::string left_name = describe_params(*m, s.method_settings(0).params);
  const std::string right_name =
      describe_params(*m, with_overrides(s, c.overrides).params) +
      (walk_overrides_change(*m, s.method_settings(0).params, c.overrides)
           ? ""
           : " (the same as the current settings)");
  const OwnTrace other = own(s, kWalkCompare);
  const WalkBlockTrace* ob = nullptr;
  if (other.trace) {
    const auto idx = blocks_of_round_in(*other.trace, round_);
    if (block_ < static_cast<int>(idx.size()))
      ob = &other.trace->blocks[static_cast<size_t>(idx[block_])];
  }
  const ImVec2 avail = ImGui::GetContentRegionAvail();
  const float gap = ImGui::GetStyle().ItemSpacing.x;
  // A beside B while both keep a plot's least width; else B under A (2x and more in a panel),
  // each plot titled with its method: the view scrolls down, never sideways.
  const bool beside = (avail.x - gap) / 2 >= min_plot_size().x;
  const float w = beside ? (avail.x - gap) / 2 : avail.x;
  auto next = [&] {
    if (beside) ImGui::SameLine();
  };
  const bool three = avail.y > px(3 * 150);
  const float h =
      std::max(px(120), (avail.y - 2 * ImGui::GetStyle().ItemSpacing.y) / (three ? 3 : 2));
  auto title = [](const std::string& name, const WalkBlockTrace& blk) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "%s: %.0f%% clipped", name.c_str(),
                  100 * saturation_of(blk).share());
    return std::string(buf);
  };
  int hovered = -1;
  const int ocur = ob ? std::min(cur, static_cast<int>(ob->sigma.size()) - 1) : 0;
  auto placeholder = [&](const char* id) {
    ImGui::BeginChild(id, ImVec2(w, h), true);
    if (!other.error.empty())
      ImGui::TextWrapped("%s", other.error.c_str());
    else if (other.pending)
      ImGui::TextDisabled("walking with %s ...", right_name.c_str());
    else
      ImGui::TextDisabled("no block %d in round %d with %s", block_, round_, right_name.c_str());
    ImGui::EndChild();
  };
  if (three) {
    hovered =
        std::max(hovered, draw_p_plot("##cmp_p_a", b, cur, ImVec2(w, h), title(left_name, b)));
    next();
    if (ob)
      draw_p_plot("##cmp_p_b", *ob, ocur, ImVec2(w, h), title(right_name, *ob), false);
    else
      placeholder("##cmp_p_b");
  }
  draw_path_plot("##cmp_path_a", b, cur, ImVec2(w, h), three && beside ? "" : title(left_name, b));
  next();
  if (ob)
    draw_path_plot("##cmp_path_b", *ob, ocur, ImVec2(w, h),
                   three && beside ? "" : title(right_name, *ob), false);
  else
    placeholder("##cmp_path_b");
  hovered =
      std::max(hovered, draw_discrepancy_plot("##cmp_disc_a", t, b, cur, ImVec2(w, h), left_name));
  next();
  if (ob)
    draw_discrepancy_plot("##cmp_disc_b", *other.trace, *ob, ocur, ImVec2(w, h), right_name, false);
  else
    placeholder("##cmp_disc_b");
  hover_tooltip(s, b, hovered);
}

std::vector<int> WalkView::blocks_of_round_in(const WalkTrace& t, int round) {
  std::vector<int> out;
  for (size_t i = 0; i < t.blocks.size(); ++i)
    if (t.blocks[i].round == round) out.push_back(static_cast<int>(i));
  return out;
}

void WalkView::advance_playback(int len) {
  if (!playing_) return;
  carry_ += ImGui::GetIO().DeltaTime * speed_;
  const int adv = static_cast<int>(carry_);
  carry_ -= adv;
  step_ = std::min(len - 1, std::max(0, step_) + adv);
  if (step_ >= len - 1) playing_ = false;
  request_next_frame();
}

void WalkView::draw_strip(AppState& s, const WalkBlockTrace& b, int cur) {
  const int len = static_cast<int>(b.tokens.size());
  ImDrawList* dl = ImGui::GetWindowDrawList();
  const float width = ImGui::GetContentRegionAvail().x;
  const float h = ImGui::GetTextLineHeight() + 6;
  const ImVec2 origin = ImGui::GetCursorScreenPos();
  auto token_w = [&](int i) {
    return ImGui::CalcTextSize(short_text(s.token_text(b.tokens[i])).c_str()).x + 8;
  };
  int lo = cur, hi = cur;
  float left = origin.x + width * 0.5f - token_w(cur) * 0.5f;
  float right = origin.x + width * 0.5f + token_w(cur) * 0.5f;
  while (true) {
    bool grew = false;
    if (lo > 0 && left - token_w(lo - 1) - 2 > origin.x) left -= token_w(--lo) + 2, grew = true;
    if (hi < len - 1 && right + token_w(hi + 1) + 2 < origin.x + width)
      right += token_w(++hi) + 2, grew = true;
    if (!grew) break;
  }
  float x = left;
  for (int i = lo; i <= hi; ++i) {
    const float w = token_w(i);
    const ImVec2 a(x, origin.y), c(x + w, origin.y + h);
    const ImU32 bg = i <= cur ? (b.sigma[i] > 0 ? kColPlus : kColMinus) : kColDropped;
    dl->AddRectFilled(a, c, with_alpha(bg, i <= cur ? 0.85f : 0.6f), 3.0f);
    dl->AddText(ImVec2(a.x + 4, a.y + 3), i <= cur ? IM_COL32(10, 10, 12, 255) : kColAxisText,
                short_text(s.token_text(b.tokens[i])).c_str());
    if (i == cur) dl->AddRect(a, c, kColHover, 3.0f, 0, 2.0f);
    if (i == b.halving_cut)
      dl->AddLine(ImVec2(a.x - 1, a.y - 2), ImVec2(a.x - 1, c.y + 2), kColCut, 2);
    x += w + 2;
  }
  ImGui::Dummy(ImVec2(width, h));
  const int tok = b.tokens[cur];
  ImGui::TextWrapped(
      "step %d/%d: token %d \"%s\"  p = %.3f  sigma = %+d%s", cur, len - 1, tok,
      s.token_text(tok).c_str(), b.p[cur], b.sigma[cur],
      cur < static_cast<int>(b.kept.size()) ? (b.kept[cur] ? "  (kept)" : "  (dropped)") : "");
}

}  // namespace kvscope::app::walk

namespace kvscope::app {

std::unique_ptr<View> make_walk_view() {
  return std::make_unique<walk::WalkView>();
}

}  // namespace kvscope::app
