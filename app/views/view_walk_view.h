// The Walk view's class (app/views/view_walk.cpp: controls, playback, side by side, strip, export,
// state; app/views/view_walk_plots.cpp: its plots), shared by the two files that define it. Only
// make_walk_view() (app/views/view.h) is public.
#pragma once

#include <imgui.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "app/app_state.h"
#include "app/colormap.h"
#include "app/plot.h"
#include "app/point_renderer.h"
#include "app/token_marks.h"
#include "app/ui_layout.h"
#include "app/views/view.h"
#include "app/walk_advice.h"
#include "engine/attention/walk_trace.h"
#include "engine/core/error.h"
#include "engine/eval/protocol.h"
#include "engine/io/json_fields.h"

namespace kvscope::app::walk {

constexpr ImU32 kColPlus = IM_COL32(76, 190, 110, 255);
constexpr ImU32 kColMinus = IM_COL32(230, 97, 92, 255);
constexpr ImU32 kColRandom = IM_COL32(215, 215, 225, 255);
constexpr ImU32 kColRandomKernel = IM_COL32(200, 150, 110, 255);
constexpr ImU32 kColWalk = IM_COL32(120, 200, 255, 255);
constexpr ImU32 kColCut = IM_COL32(240, 200, 80, 255);

// Methods that record a walk (Method::produces_trace), asked of the registry, never by name.
inline bool is_walk_method(const std::string& name) {
  const Method* m = find_method(name);
  return m && m->produces_trace();
}

// The names of the methods that record a walk, in the registry's order (for the Walk view's
// offer when method A records none).
inline std::vector<std::string> walk_method_names() {
  std::vector<std::string> names;
  for (const Method* m : all_methods())
    if (m->produces_trace()) names.push_back(m->name());
  return names;
}

inline std::string short_text(const std::string& t, size_t max_chars = 12) {
  return t.size() <= max_chars ? t : t.substr(0, max_chars - 1) + "~";
}

template <class T>
inline T at(const std::vector<T>& v, size_t i) {
  return i < v.size() ? v[i] : T(0);
}

// Symmetric log transform sign(v) log10(1 + |v| / t): real kernels span many decades (one large
// <k_i, k_j> dominates a linear axis), while the sign and the order of magnitude are what the
// reader needs. t is a low percentile of the nonzero magnitudes, so small values stay linear.
struct SymLog {
  double t = 1;
  bool on = false;
  double operator()(double v) const {
    if (!on || !std::isfinite(v)) return v;
    return (v < 0 ? -1 : 1) * std::log10(1 + std::abs(v) / t);
  }
  std::vector<double> apply(const std::vector<double>& v) const {
    std::vector<double> out(v.size());
    for (size_t i = 0; i < v.size(); ++i) out[i] = (*this)(v[i]);
    return out;
  }
};

// Picks the scale of a series: linear unless its magnitudes span more than three decades.
inline SymLog choose_scale(const std::vector<const std::vector<double>*>& series, bool allow) {
  std::vector<double> mags;
  for (const auto* v : series)
    for (double x : *v)
      if (std::isfinite(x) && x != 0) mags.push_back(std::abs(x));
  SymLog s;
  if (!allow || mags.size() < 4) return s;
  std::sort(mags.begin(), mags.end());
  const double low = mags[mags.size() / 10], high = mags.back();
  if (high <= 1e3 * std::max(low, 1e-300)) return s;
  s.on = true;
  s.t = low;
  return s;
}

inline std::string scale_label(const std::string& what, const SymLog& s) {
  if (!s.on) return what;
  char buf[160];
  std::snprintf(buf, sizeof buf, "%s (symlog, t=%.2g)", what.c_str(), s.t);
  return buf;
}

inline std::vector<double> iota_steps(size_t n) {
  std::vector<double> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = static_cast<double>(i);
  return x;
}

// Share of steps whose p_i (recorded before clipping) is <= 0 or >= 1: their sign is forced.
struct Saturation {
  int clipped = 0, steps = 0;
  double share() const { return steps ? static_cast<double>(clipped) / steps : 0.0; }
};
inline Saturation saturation_of(const WalkBlockTrace& b) {
  Saturation s;
  for (double p : b.p) {
    if (!std::isfinite(p)) continue;
    ++s.steps;
    s.clipped += (p <= 0.0 || p >= 1.0);
  }
  return s;
}
inline Saturation saturation_of(const WalkTrace& t) {
  Saturation s;
  for (const auto& b : t.blocks) {
    const Saturation k = saturation_of(b);
    s.clipped += k.clipped;
    s.steps += k.steps;
  }
  return s;
}

// A walk of the focused head computed by this view itself: with another query along which the
// discrepancy is measured, or with other parameters for the side-by-side comparison.
struct OwnTrace {
  std::string wanted;  // what was asked for (settings + query + head); "" = nothing
  std::string have;    // what `trace` was computed for
  std::shared_ptr<const WalkTrace> trace;
  std::string error;
  bool pending() const { return !wanted.empty() && wanted != have; }
};

inline std::string describe_params(const Method& m, const ParamValues& v) {
  std::string out;
  for (const char* name : {"temp", "gamma", "block"}) {
    double x = 0;
    try {
      x = param_value(m.params(), v, name);
    } catch (const InputError&) {
      continue;
    }
    char buf[48];
    std::snprintf(buf, sizeof buf, "%s%s %g", out.empty() ? "" : ", ", name, x);
    out += buf;
  }
  return out;
}

class WalkView final : public View {
 public:
  const char* name() const override { return "walk"; }
  const char* title() const override { return "Walk"; }
  const char* help() const override;

  bool ready(const AppState& s) const override;

  void draw(AppState& s) override;

  nlohmann::json export_json(const AppState& s) const override;

  std::string export_csv(const AppState& s) const override;

  nlohmann::json save_state() const override;
  void load_state(const nlohmann::json& j) override;

 private:
  std::vector<int> blocks_of_round(const WalkTrace& t) const;
  void clamp_block(const WalkTrace& t);
  const WalkBlockTrace* current_block(const WalkTrace& t) const;
  const WalkBlockTrace* exported_block(const AppState& s) const;

  // This view's own walks of the focused head (another query for the discrepancy, other
  // parameters for the side by side) are derived results like the app's: keyed by the settings
  // they depend on, planned here every frame and run by AppState::reconcile().
  static constexpr const char* kWalkQuery = "walk.query";
  static constexpr const char* kWalkCompare = "walk.compare";
  // What each remedy for a saturated walk does to the focused head's error (app/walk_advice.h),
  // computed before the view offers one.
  static constexpr const char* kWalkAdvice = "walk.advice";
  JobPlan plan_advice(const AppState& s) const;

  struct OwnTrace {
    std::shared_ptr<const WalkTrace> trace;
    std::string error;
    bool pending = false;  // wanted and not (yet) computed for the current settings
  };
  static OwnTrace own(const AppState& s, const char* name);

  // The trace the main plots show: the app's run of method A, or this view's own walk when the
  // user picked another query for the discrepancy.
  std::shared_ptr<const WalkTrace> shown_trace(const AppState& s) const;

  // Method A's settings with a comparison's parameter overrides (only those the method has).
  static MethodSettings with_overrides(const AppState& s, const ParamValues& overrides);

  void plan(const AppState& s, std::vector<NamedPlan>& out) const override;

  JobPlan plan_trace(const AppState& s, bool needed, const ParamValues& overrides) const;

  void draw_controls(AppState& s, const WalkTrace& t);

  // The saturation line: how many p_i were clipped, what that means, and what to try.
  void draw_saturation(AppState& s, const WalkTrace& t, const WalkBlockTrace& b);

  void toggle_play(int len);
  void step_back(int len);
  void step_forward(int len);

  void hover_tooltip(AppState& s, const WalkBlockTrace& b, int hovered);

  // The same block walked with the current settings (left) and the comparison's (right): p_i,
  // the path and the discrepancy, each titled with its settings and saturation.
  void draw_side_by_side(AppState& s, const WalkTrace& t, const WalkBlockTrace& b, int cur);

  static std::vector<int> blocks_of_round_in(const WalkTrace& t, int round);

  void advance_playback(int len);

  // The walk's prefix sum on the block's top two kernel-PCA directions, against random signs.
  // Both share the axes (and the log scale); the random-sign path is drawn last, dashed, so it
  // stays visible where the two overlap.
  void draw_path_plot(const char* id, const WalkBlockTrace& b, int cur, ImVec2 size,
                      const std::string& title, bool with_legend = true);

  int draw_p_plot(const char* id, const WalkBlockTrace& b, int cur, ImVec2 size,
                  const std::string& title, bool with_legend = true);

  int draw_partial_plot(const WalkBlockTrace& b, int cur, ImVec2 size);

  int draw_discrepancy_plot(const char* id, const WalkTrace& t, const WalkBlockTrace& b, int cur,
                            ImVec2 size, const std::string& name, bool with_legend = true);

  void mark_cut_and_step(const Plot& plot, const WalkBlockTrace& b, int cur) const;

  // The block's tokens around the current step, coloured by the sign drawn so far.
  void draw_strip(AppState& s, const WalkBlockTrace& b, int cur);

  int round_ = 0, block_ = 0;
  int step_ = -1;  // -1: the whole walk
  bool playing_ = false;
  float speed_ = 20.0f, carry_ = 0;
  bool symlog_ = true;
  const WalkTrace* last_trace_ = nullptr;  // the trace last shown
  int query_ = -1;   // query position of the discrepancy (-1: the last one, the app's run)
  int compare_ = 0;  // index into walk_comparisons(); 0: no side by side
};

}  // namespace kvscope::app::walk
