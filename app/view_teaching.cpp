// Teaching view: the self-balancing walk on a handful of 2-D vectors the user places with the
// mouse (or the talk's worked example: projections 0.1, 0.8, 0.5, 0.7, 0.3 on a direction z),
// stepped one sign at a time (engine/teaching_walk.h). Left: the plane with the vectors, z and
// the signed prefix sums chained head to tail; right: the prefix along z against the step, with
// the +-1 band the talk's proposition promises; below: the talk's table filling in.
// The talk's second half as further modes (engine/teaching_modes.h): the exp kernel's features
// with the numerator and denominator walks side by side, the random-signs race as n grows (with
// sqrt(n) and log n guides), and merge-and-reduce filling its levels as tokens stream in.
#include <imgui.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
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
#include "app/view.h"
#include "engine/error.h"
#include "engine/json_fields.h"
#include "engine/teaching_modes.h"
#include "engine/teaching_walk.h"

namespace kvscope::app {
namespace {

using Vec2 = TeachingWalk::Vec2;

constexpr ImU32 kColPlus = IM_COL32(76, 190, 110, 255);
constexpr ImU32 kColMinus = IM_COL32(230, 97, 92, 255);
constexpr ImU32 kColVector = IM_COL32(170, 175, 185, 255);
constexpr ImU32 kColZ = IM_COL32(240, 200, 80, 255);
constexpr ImU32 kColPrefix = IM_COL32(120, 200, 255, 255);
constexpr int kMaxVectors = 16;
constexpr double kExtent = 2.2;  // vectors are placed within [-kExtent, kExtent]^2

// The modes: the talk's first half (vector balancing) and its second half.
enum class Mode { Balancing = 0, ExpKernel = 1, Race = 2, MergeReduce = 3 };
constexpr int kNumModes = 4;
constexpr const char* kModeNames[] = {"balancing", "exp-kernel", "race", "merge-reduce"};
constexpr const char* kModeTitles =
    "vector balancing (talk, first half)\0exp kernel: numerator and denominator walks\0"
    "random signs vs the walk as n grows\0merge and reduce (streaming)\0";
constexpr int kMaxExpKernelN = 48;
constexpr ImU32 kColRandom = IM_COL32(160, 160, 170, 255);
constexpr ImU32 kColWalk = IM_COL32(120, 200, 255, 255);
constexpr ImU32 kColLevel[] = {IM_COL32(150, 150, 160, 255), IM_COL32(86, 160, 229, 255),
                               IM_COL32(120, 200, 90, 255),  IM_COL32(240, 180, 60, 255),
                               IM_COL32(190, 120, 240, 255), IM_COL32(70, 210, 200, 255),
                               IM_COL32(240, 130, 200, 255), IM_COL32(250, 160, 120, 255)};
constexpr ImU32 kColDroppedToken = IM_COL32(110, 60, 60, 255);
constexpr ImU32 kColFuture = IM_COL32(45, 48, 55, 255);

ImU32 level_colour(int l) {
  return kColLevel[std::min(l, 7)];
}

std::string fmt(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

void arrow(ImDrawList* dl, ImVec2 a, ImVec2 b, ImU32 col, float thickness) {
  dl->AddLine(a, b, col, thickness);
  const float dx = b.x - a.x, dy = b.y - a.y, len = std::sqrt(dx * dx + dy * dy);
  if (len < 4) return;
  const float ux = dx / len, uy = dy / len, head = std::min(px(10.0f), len * 0.4f);
  dl->AddTriangleFilled(
      b, ImVec2(b.x - head * ux + head * 0.45f * uy, b.y - head * uy - head * 0.45f * ux),
      ImVec2(b.x - head * ux - head * 0.45f * uy, b.y - head * uy + head * 0.45f * ux), col);
}

class TeachingView final : public View {
 public:
  TeachingView() { load_talk_example(); }

  const char* name() const override { return "teaching"; }
  const char* title() const override { return "Teaching"; }
  const char* help() const override {
    return "The self-balancing walk on a handful of 2-D vectors you place (or the talk's worked "
           "example), one sign at a time with narration; and the talk's second half as modes: "
           "the exp kernel's numerator and denominator walks, random signs vs the walk as n "
           "grows, merge and reduce. Keys: right arrow steps, left arrow steps back, space "
           "plays.";
  }

  void draw(AppState& s) override {
    draw_mode_bar(s);
    if (mode_ != Mode::Balancing) {
      draw_second_half(s);
      return;
    }
    draw_controls();
    handle_keys();
    advance_playback();
    draw_narration();
    mark_figure_top();
    const ImVec2 avail = ImGui::GetContentRegionAvail();
    const int rows = rule_ == TeachingWalk::Rule::SelfBalancing ? 6 : 5;
    const float table_h =
        ImGui::GetTextLineHeightWithSpacing() * (rows + 1.5f) + ImGui::GetStyle().ScrollbarSize;
    const float plot_h = std::max(px(200), avail.y - table_h);
    const float plane_w = std::max(px(200), std::min(avail.x * 0.55f, plot_h + px(80)));
    draw_plane(ImVec2(plane_w, plot_h));
    ImGui::SameLine();
    draw_prefix_plot(ImVec2(0, plot_h));
    draw_table();
  }

  nlohmann::json export_json(const AppState&) const override {
    nlohmann::json j = state_json();
    j["narration"] = mode_ == Mode::Balancing ? narration() : mode_narration();
    if (mode_ != Mode::Balancing) j["result"] = mode_result_json();
    return j;
  }

  nlohmann::json state_json() const {
    nlohmann::json j;
    j["view"] = "teaching";
    j["rule"] = rule_ == TeachingWalk::Rule::KnownDirection ? "known-direction" : "self-balancing";
    j["z"] = {z_[0], z_[1]};
    j["c"] = c_;
    j["seed"] = seed_;
    nlohmann::json steps = nlohmann::json::array();
    if (walk_)
      for (const auto& st : walk_->steps())
        steps.push_back({{"u", {st.u[0], st.u[1]}},
                         {"along_z", st.along_z},
                         {"p", st.p},
                         {"sigma", st.sigma},
                         {"prefix", {st.prefix[0], st.prefix[1]}},
                         {"prefix_along_z", st.prefix_along_z}});
    j["steps"] = steps;
    j["vectors"] = nlohmann::json::array();
    for (const Vec2& u : vectors_) j["vectors"].push_back({u[0], u[1]});
    j["mode"] = kModeNames[static_cast<int>(mode_)];
    j["speed"] = speed_;
    j["exp_kernel"] = {{"n", ek_n_}, {"seed", ek_seed_}, {"c", ek_c_}, {"step", ek_pos()}};
    j["race"] = {{"n_max", race_n_max_},
                 {"dim", race_dim_},
                 {"c", race_c_},
                 {"seed", race_seed_},
                 {"n", race_pos_}};
    j["merge_reduce"] = {{"n", mr_n_},
                         {"budget", mr_budget_},
                         {"c_scale", mr_c_scale_},
                         {"seed", mr_seed_},
                         {"step", mr_ ? mr_->pushed() : 0}};
    return j;
  }

  std::string export_csv(const AppState&) const override {
    if (!walk_) return {};
    std::ostringstream out;
    out << "i,u_x,u_y,along_z,p,uniform,sigma,prefix_x,prefix_y,prefix_along_z\n";
    for (const auto& st : walk_->steps())
      out << st.index + 1 << ',' << st.u[0] << ',' << st.u[1] << ',' << st.along_z << ',' << st.p
          << ',' << st.uniform << ',' << st.sigma << ',' << st.prefix[0] << ',' << st.prefix[1]
          << ',' << st.prefix_along_z << '\n';
    return out.str();
  }

  nlohmann::json save_state() const override { return state_json(); }

  void load_state(const nlohmann::json& j) override {
    // Every field is checked before anything changes; a wrong one throws InputError naming it
    // ("session field \"views.teaching.vectors[2][1]\": ..."), and AppUi::load_session refuses
    // the session. A walk the engine refuses (a zero z, say) shows its error as a typed one does.
    const JsonField f(j, "session", "views.teaching");
    auto vec2 = [](const JsonField& v) {
      if (v.size() != 2) v.fail("expected [x, y], got a list of " + std::to_string(v.size()));
      return Vec2{v.at(size_t{0}).number(), v.at(size_t{1}).number()};
    };
    const std::string view = f.get("view", "teaching");
    if (view != "teaching") f.at("view").fail("'" + view + "' is not teaching");
    std::vector<Vec2> vs = vectors_;
    if (const std::optional<JsonField> v = f.find("vectors")) {
      if (v->size() < 1 || v->size() > static_cast<size_t>(kMaxVectors))
        v->fail("holds " + std::to_string(v->size()) + " vectors, expected 1 to " +
                std::to_string(kMaxVectors));
      vs.clear();
      for (const JsonField& u : v->elements()) vs.push_back(vec2(u));
    }
    const Vec2 z = f.has("z") ? vec2(f.at("z")) : z_;
    const std::string rule = f.get("rule", "known-direction");
    if (rule != "known-direction" && rule != "self-balancing")
      f.at("rule").fail("'" + rule + "' is not known-direction or self-balancing");
    const double c = f.get("c", c_);
    if (!(c > 0 && c <= 1e6)) f.at("c").fail(f.at("c").json().dump() + " is not in (0, 1e6]");
    const uint64_t seed = f.has("seed") ? f.at("seed").unsigned_integer() : seed_;
    const size_t steps = f.has("steps") ? f.at("steps").size() : 0;
    // The second half's modes (each block optional; absent fields keep their values).
    Mode mode = mode_;
    if (const std::optional<JsonField> m = f.find("mode")) {
      const std::string name = m->string();
      int found = -1;
      for (int i = 0; i < kNumModes; ++i)
        if (name == kModeNames[i]) found = i;
      if (found < 0)
        m->fail("'" + name + "' is not a mode (balancing, exp-kernel, race or merge-reduce)");
      mode = static_cast<Mode>(found);
    }
    const double speed = f.get("speed", static_cast<double>(speed_), 0.25, 30.0);
    int ek_n = ek_n_, ek_step = ek_pos(), race_n_max = race_n_max_, race_dim = race_dim_,
        race_pos = race_pos_, mr_n = mr_n_, mr_budget = mr_budget_,
        mr_step = mr_ ? mr_->pushed() : 0;
    double ek_c = ek_c_, race_c = race_c_, mr_c_scale = mr_c_scale_;
    uint64_t ek_seed = ek_seed_, race_seed = race_seed_, mr_seed = mr_seed_;
    if (const std::optional<JsonField> e = f.find("exp_kernel")) {
      ek_n = e->get("n", ek_n, 2, kMaxExpKernelN);
      ek_c = e->get("c", ek_c, 0.05, 20.0);
      if (e->has("seed")) ek_seed = e->at("seed").unsigned_integer();
      ek_step = e->get("step", ek_step, 0, ek_n);
    }
    if (const std::optional<JsonField> r = f.find("race")) {
      race_n_max = r->get("n_max", race_n_max, 16, 1 << 14);
      race_dim = r->get("dim", race_dim, 1, 64);
      race_c = r->get("c", race_c, 0.05, 100.0);
      if (r->has("seed")) race_seed = r->at("seed").unsigned_integer();
      race_pos = r->get("n", race_pos, 1, race_n_max);
    }
    if (const std::optional<JsonField> m = f.find("merge_reduce")) {
      mr_n = m->get("n", mr_n, 8, 512);
      mr_budget = m->get("budget", mr_budget, 1, mr_n - 1);
      mr_c_scale = m->get("c_scale", mr_c_scale, 1e-4, 1.0);
      if (m->has("seed")) mr_seed = m->at("seed").unsigned_integer();
      mr_step = m->get("step", mr_step, 0, mr_n);
    }
    mode_ = mode;
    speed_ = static_cast<float>(speed);
    ek_n_ = ek_n, ek_c_ = ek_c, ek_seed_ = ek_seed;
    race_n_max_ = race_n_max, race_dim_ = race_dim, race_c_ = race_c, race_seed_ = race_seed;
    mr_n_ = mr_n, mr_budget_ = mr_budget, mr_c_scale_ = mr_c_scale, mr_seed_ = mr_seed;
    rebuild_exp_kernel(ek_step);
    rebuild_race();
    race_pos_ = race_pos;
    rebuild_merge_reduce(mr_step);
    playing_ = false;
    vectors_ = std::move(vs);
    z_ = z;
    rule_ = rule == "self-balancing" ? TeachingWalk::Rule::SelfBalancing
                                     : TeachingWalk::Rule::KnownDirection;
    c_ = c;
    seed_ = seed;
    rebuild(static_cast<int>(std::min(steps, vectors_.size())));
  }

 private:
  void load_talk_example() {
    TeachingWalk ex = TeachingWalk::talk_example();
    vectors_ = ex.vectors();
    z_ = ex.z();
    rule_ = ex.rule();
    c_ = ex.c();
    rebuild(static_cast<int>(vectors_.size()));  // the worked example, filled in
    message_ = "The talk's example: <u_i, z> = 0.1, 0.8, 0.5, 0.7, 0.3 with z = (1, 0).";
  }

  // A new walk over the current vectors, signed up to `steps` vectors again.
  void rebuild(int steps) {
    error_.clear();
    walk_.reset();
    if (vectors_.empty()) return;
    try {
      walk_ = std::make_unique<TeachingWalk>(vectors_, z_, rule_, c_, seed_);
      for (int i = 0; i < steps && walk_->step(); ++i) {
      }
    } catch (const InputError& e) {
      error_ = e.what();
    }
  }

  int signed_count() const { return walk_ ? static_cast<int>(walk_->steps().size()) : 0; }

  // Replays the walk up to `steps` signed vectors (the draws are seeded, so back = replay).
  void replay_to(int steps) {
    if (!walk_) return;
    walk_->reset();
    for (int i = 0; i < steps && walk_->step(); ++i) {
    }
  }

  // The toolbar: playback first, so it never moves when the rule or its settings change; c and
  // seed are always there (greyed out for the known-direction rule).
  void draw_controls() {
    const bool can_step = walk_ && !walk_->done();
    const bool can_back = walk_ && signed_count() > 0;
    if (!can_back) ImGui::BeginDisabled();
    if (ImGui::Button("reset")) walk_->reset(), playing_ = false;
    ImGui::SameLine();
    if (ImGui::Button("<")) replay_to(signed_count() - 1), playing_ = false;
    if (!can_back) ImGui::EndDisabled();
    ImGui::SameLine();
    const float play_w = ImGui::CalcTextSize("pause").x + ImGui::GetStyle().FramePadding.x * 2;
    if (!can_step && !playing_) ImGui::BeginDisabled();
    if (ImGui::Button(playing_ ? "pause" : "play", ImVec2(play_w, 0)))
      playing_ = !playing_, timer_ = 0;
    if (!can_step && !playing_) ImGui::EndDisabled();
    ImGui::SameLine();
    if (!can_step) ImGui::BeginDisabled();
    if (ImGui::Button("step >")) walk_->step(), playing_ = false;
    ImGui::SameLine();
    if (ImGui::Button("run")) walk_->run(), playing_ = false;
    if (!can_step) ImGui::EndDisabled();
    if (ImGui::IsItemHovered(ImGuiHoveredFlags_AllowWhenDisabled))
      ImGui::SetTooltip("Keys: space = play / pause, right arrow = step, left arrow = back.");
    toolbar_next(button_width("talk example") + button_width("clear") +
                 ImGui::GetStyle().ItemSpacing.x);
    if (ImGui::Button("talk example")) load_talk_example();
    ImGui::SameLine();
    if (ImGui::Button("clear")) {
      vectors_.clear();
      walk_.reset();
      playing_ = false;
      message_ = "Click in the plane to place vectors (up to 16).";
    }
    int rule = rule_ == TeachingWalk::Rule::KnownDirection ? 0 : 1;
    toolbar_next(labelled_width(px(220), "rule"));
    ImGui::SetNextItemWidth(px(220));
    if (ImGui::Combo("rule", &rule, "known direction z (talk)\0self-balancing (ALS walk)\0")) {
      rule_ = rule == 0 ? TeachingWalk::Rule::KnownDirection : TeachingWalk::Rule::SelfBalancing;
      rebuild(signed_count());
    }
    if (ImGui::IsItemHovered())
      ImGui::SetTooltip(
          "known direction: sigma_j = - when the prefix along z and <u_j, z> have the same sign\n"
          "(every prefix then stays within max |<u_i, z>|).\n"
          "self-balancing: p_j = 1/2 - <w_j, u_j> / (2c) with w_j the prefix sum; no z needed.");
    const bool sb = rule_ == TeachingWalk::Rule::SelfBalancing;
    toolbar_next(labelled_width(px(100), "c") + labelled_width(px(90), "seed") +
                 ImGui::GetStyle().ItemSpacing.x);
    if (!sb) ImGui::BeginDisabled();
    ImGui::SetNextItemWidth(px(100));
    float c = static_cast<float>(c_);
    if (ImGui::SliderFloat("c", &c, 0.1f, 5.0f, "%.2f")) {
      c_ = c;
      rebuild(signed_count());
    }
    ImGui::SameLine();
    ImGui::SetNextItemWidth(px(90));
    int seed = static_cast<int>(seed_);
    if (ImGui::InputInt("seed", &seed)) {
      seed_ = static_cast<uint64_t>(std::max(0, seed));
      rebuild(signed_count());
    }
    if (!sb) ImGui::EndDisabled();
    toolbar_next(labelled_width(px(120), "z angle"));
    ImGui::SetNextItemWidth(px(120));
    float angle = static_cast<float>(std::atan2(z_[1], z_[0]) * 180.0 / M_PI);
    if (ImGui::SliderFloat("z angle", &angle, -180.0f, 180.0f, "%.0f deg")) {
      z_ = {std::cos(angle * M_PI / 180.0), std::sin(angle * M_PI / 180.0)};
      rebuild(signed_count());
    }
    if (!error_.empty())
      ImGui::TextColored(ImVec4(1, 0.5f, 0.4f, 1), "%s", error_.c_str());
    else {
      ImGui::PushStyleColor(ImGuiCol_Text, ImGui::GetStyleColorVec4(ImGuiCol_TextDisabled));
      ImGui::TextWrapped(
          "%s  Left click: add a vector; drag a tip: move it; right click a tip: remove it. "
          "Keys: space = play, arrows = step.",
          message_.c_str());
      ImGui::PopStyleColor();
    }
  }

  // Space = play / pause, right arrow = step, left arrow = one step back (replay).
  void handle_keys() {
    const ImGuiIO& io = ImGui::GetIO();
    if (io.WantTextInput || io.KeyCtrl || !walk_) return;
    if (ImGui::IsKeyPressed(ImGui::GetKeyIndex(ImGuiKey_Space), false)) {
      playing_ = !playing_ && !walk_->done();
      timer_ = 0;
    }
    if (ImGui::IsKeyPressed(ImGui::GetKeyIndex(ImGuiKey_RightArrow))) {
      walk_->step();
      playing_ = false;
    }
    if (ImGui::IsKeyPressed(ImGui::GetKeyIndex(ImGuiKey_LeftArrow)) && signed_count() > 0) {
      replay_to(signed_count() - 1);
      playing_ = false;
    }
  }

  // One sentence on the last step: what the rule saw and what it did.
  std::string narration() const {
    const int n = signed_count();
    if (!walk_ || vectors_.empty()) return "Place vectors in the plane, then press play (space).";
    if (n == 0)
      return "Press play (space) or step (right arrow): the walk signs u1, u2, ... one at a time.";
    const TeachingWalk::Step& st = walk_->steps()[static_cast<size_t>(n - 1)];
    char buf[400];
    const char* sg = st.sigma > 0 ? "+1" : "-1";
    if (rule_ == TeachingWalk::Rule::KnownDirection) {
      if (st.inner == 0 || st.along_z == 0)
        std::snprintf(buf, sizeof buf,
                      "u%d: the prefix along z is %.2f, nothing to pull back, so sigma = +1; "
                      "prefix along z now %.2f.",
                      st.index + 1, st.inner, st.prefix_along_z);
      else
        std::snprintf(buf, sizeof buf,
                      "u%d: the prefix along z is %+.2f and <u%d, z> = %+.2f point %s, so sigma "
                      "= %s pulls the prefix back towards 0: %+.2f -> %+.2f.",
                      st.index + 1, st.inner, st.index + 1, st.along_z,
                      st.inner * st.along_z > 0 ? "the same way" : "opposite ways", sg, st.inner,
                      st.prefix_along_z);
    } else {
      const double pc = std::clamp(st.p, 0.0, 1.0);
      const char* lean = st.inner > 0   ? "leans towards +u"
                         : st.inner < 0 ? "leans towards -u"
                                        : "is square to u";
      const char* likely = pc < 0.5   ? "sigma = -1 is likely"
                           : pc > 0.5 ? "sigma = +1 is likely"
                                      : "both signs are even";
      std::snprintf(buf, sizeof buf,
                    "u%d: p = %.2f: the prefix %s%d (<w, u%d> = %+.2f), so %s%s; drew %.2f -> "
                    "sigma = %s.",
                    st.index + 1, st.p, lean, st.index + 1, st.index + 1, st.inner, likely,
                    st.p <= 0 || st.p >= 1 ? " (p clipped: the sign is forced)" : "", st.uniform,
                    sg);
    }
    return buf;
  }

  void draw_narration() {
    const std::string line = narration();
    ImGui::PushStyleColor(ImGuiCol_Text, ImVec4(0.95f, 0.93f, 0.75f, 1));
    ImGui::TextWrapped("%s", line.c_str());
    ImGui::PopStyleColor();
  }

  void advance_playback() {
    if (!playing_ || !walk_) return;
    timer_ += ImGui::GetIO().DeltaTime;
    if (timer_ >= 1.0f / speed_) {
      timer_ = 0;
      if (!walk_->step()) playing_ = false;
    }
    if (walk_->done()) playing_ = false;
    request_next_frame();
  }

  // Everything the plane will show during the whole walk (all vectors, z, every prefix of the
  // full run), so the axes fit the content and do not jump while the walk plays.
  void content_bounds(double* x0, double* x1, double* y0, double* y1) const {
    *x0 = *y0 = -1.1;
    *x1 = *y1 = 1.1;
    auto grow = [&](double x, double y) {
      *x0 = std::min(*x0, x), *x1 = std::max(*x1, x);
      *y0 = std::min(*y0, y), *y1 = std::max(*y1, y);
    };
    for (const Vec2& u : vectors_) grow(u[0], u[1]);
    grow(z_[0] * 1.2, z_[1] * 1.2);
    if (walk_) {
      TeachingWalk full = *walk_;
      full.run();
      for (const auto& st : full.steps()) grow(st.prefix[0], st.prefix[1]);
    }
    const double pad = 0.12 * std::max(*x1 - *x0, *y1 - *y0);
    *x0 -= pad, *x1 += pad, *y0 -= pad, *y1 += pad;
  }

  // The plane: vectors from the origin, z, and the signed prefix sums chained head to tail, on
  // equal-aspect axes (angles are true) that fit the content.
  void draw_plane(ImVec2 size) {
    ImGui::BeginGroup();
    double x0, x1, y0, y1;
    content_bounds(&x0, &x1, &y0, &y1);
    Plot plot("##teach_plane", size, "vectors u_i, direction z and the signed prefix sums",
              Axis{"x", x0, x1}, Axis{"y", y0, y1}, /*equal_aspect=*/true);
    ImDrawList* dl = plot.draw_list();
    dl->PushClipRect(plot.inner_min(), plot.inner_max(), true);
    const ImVec2 o = plot.to_screen(0, 0);
    const double far = 4 * std::max({std::abs(x0), std::abs(x1), std::abs(y0), std::abs(y1)});
    // z through the origin, both ways.
    dl->AddLine(plot.to_screen(-z_[0] * far, -z_[1] * far),
                plot.to_screen(z_[0] * far, z_[1] * far), with_alpha(kColZ, 0.35f), 1.0f);
    arrow(dl, o, plot.to_screen(z_[0], z_[1]), kColZ, px(2.0f));
    const int signed_n = signed_count();
    for (size_t i = 0; i < vectors_.size(); ++i) {
      const Vec2& u = vectors_[i];
      ImU32 col = kColVector;
      if (static_cast<int>(i) < signed_n) col = walk_->steps()[i].sigma > 0 ? kColPlus : kColMinus;
      arrow(dl, o, plot.to_screen(u[0], u[1]), with_alpha(col, 0.55f), px(1.5f));
    }
    // Prefix sums: sigma_1 u_1, then + sigma_2 u_2, ... head to tail.
    Vec2 at{0, 0};
    for (int i = 0; i < signed_n; ++i) {
      const auto& st = walk_->steps()[i];
      arrow(dl, plot.to_screen(at[0], at[1]), plot.to_screen(st.prefix[0], st.prefix[1]),
            st.sigma > 0 ? kColPlus : kColMinus, px(2.5f));
      at = st.prefix;
    }
    if (signed_n > 0) dl->AddCircle(plot.to_screen(at[0], at[1]), px(6), kColPrefix, 14, 2);
    dl->AddCircleFilled(o, px(3.5f), kColExact, 10);
    // Labels: each placed next to its tip, outward along its vector, at the first of a few
    // candidate spots that overlaps no label already placed (and no arrow tip).
    std::vector<ImVec2> tips;
    for (const Vec2& u : vectors_) tips.push_back(plot.to_screen(u[0], u[1]));
    std::vector<ImVec4> placed;
    auto place = [&](ImVec2 tip, ImVec2 dir, const char* text, ImU32 col) {
      const ImVec2 ts = ImGui::CalcTextSize(text);
      const float gap = px(4);
      const float len = std::sqrt(dir.x * dir.x + dir.y * dir.y);
      ImVec2 d = len > 0 ? ImVec2(dir.x / len, dir.y / len) : ImVec2(1, 0);
      ImVec4 best;
      float best_overlap = 1e30f;
      for (int k = 0; k < 12; ++k) {
        const float ang = std::atan2(d.y, d.x) + static_cast<float>(k / 2 + 1) * (k % 2 ? -1 : 1) *
                                                     static_cast<float>(M_PI) / 6 * (k > 0);
        const float r = (k < 8 ? 1.0f : 1.8f) * (gap + std::max(ts.x, ts.y) * 0.6f);
        const ImVec2 c(tip.x + std::cos(ang) * r, tip.y + std::sin(ang) * r);
        const ImVec4 box(c.x - ts.x / 2, c.y - ts.y / 2, c.x + ts.x / 2, c.y + ts.y / 2);
        float overlap = 0;
        auto add = [&](const ImVec4& b) {
          const float w = std::min(box.z, b.z) - std::max(box.x, b.x);
          const float h = std::min(box.w, b.w) - std::max(box.y, b.y);
          if (w > 0 && h > 0) overlap += w * h;
        };
        for (const ImVec4& b : placed) add(b);
        for (const ImVec2& t : tips) add(ImVec4(t.x - 3, t.y - 3, t.x + 3, t.y + 3));
        add(ImVec4(o.x - 4, o.y - 4, o.x + 4, o.y + 4));
        if (overlap < best_overlap) best_overlap = overlap, best = box;
        if (overlap == 0) break;
      }
      placed.push_back(best);
      dl->AddText(ImVec2(best.x, best.y), col, text);
    };
    const ImVec2 zt = plot.to_screen(z_[0], z_[1]);
    place(zt, ImVec2(zt.x - o.x, zt.y - o.y), "z", kColZ);
    for (size_t i = 0; i < vectors_.size(); ++i) {
      ImU32 col = kColVector;
      if (static_cast<int>(i) < signed_n) col = walk_->steps()[i].sigma > 0 ? kColPlus : kColMinus;
      char label[16];
      std::snprintf(label, sizeof label, "u%d", static_cast<int>(i) + 1);
      place(tips[i], ImVec2(tips[i].x - o.x, tips[i].y - o.y), label, col);
    }
    dl->PopClipRect();
    handle_plane_mouse(plot);
    // The legend goes where the drawing is not: the quarter with the fewest tips, prefixes
    // and labels.
    std::vector<ImVec2> occupied = tips;
    for (int i = 0; i < signed_n; ++i) {
      const auto& st = walk_->steps()[i];
      occupied.push_back(plot.to_screen(st.prefix[0], st.prefix[1]));
      occupied.push_back(plot.to_screen(st.prefix[0] - st.sigma * st.u[0] / 2,
                                        st.prefix[1] - st.sigma * st.u[1] / 2));
    }
    for (const ImVec4& b : placed) occupied.push_back(ImVec2((b.x + b.z) / 2, (b.y + b.w) / 2));
    for (const Vec2& u : vectors_) occupied.push_back(plot.to_screen(u[0] / 2, u[1] / 2));
    plot.legend({{"u_i (unsigned)", kColVector},
                 {"sigma = +1", kColPlus},
                 {"sigma = -1", kColMinus},
                 {"z", kColZ}},
                plot.emptiest_corner(occupied));
    ImGui::EndGroup();
  }

  void handle_plane_mouse(const Plot& plot) {
    const ImVec2 mouse = ImGui::GetIO().MousePos;
    auto tip_near_mouse = [&]() {
      for (size_t i = 0; i < vectors_.size(); ++i) {
        const ImVec2 t = plot.to_screen(vectors_[i][0], vectors_[i][1]);
        if ((t.x - mouse.x) * (t.x - mouse.x) + (t.y - mouse.y) * (t.y - mouse.y) < px(8) * px(8))
          return static_cast<int>(i);
      }
      return -1;
    };
    if (dragging_ >= 0) {
      if (ImGui::IsMouseDown(ImGuiMouseButton_Left)) {
        vectors_[dragging_] = {std::clamp(plot.data_x(mouse.x), -kExtent, kExtent),
                               std::clamp(plot.data_y(mouse.y), -kExtent, kExtent)};
        rebuild(signed_count());
      } else {
        dragging_ = -1;
      }
      return;
    }
    if (!plot.hovered()) return;
    const int tip = tip_near_mouse();
    if (tip >= 0) {
      ImGui::SetTooltip("u%d = (%.3f, %.3f), <u, z> = %.3f", tip + 1, vectors_[tip][0],
                        vectors_[tip][1], vectors_[tip][0] * z_[0] + vectors_[tip][1] * z_[1]);
      if (ImGui::IsMouseClicked(ImGuiMouseButton_Left)) dragging_ = tip;
      if (ImGui::IsMouseClicked(ImGuiMouseButton_Right)) {
        vectors_.erase(vectors_.begin() + tip);
        rebuild(std::min<int>(signed_count(), static_cast<int>(vectors_.size())));
      }
      return;
    }
    if (ImGui::IsMouseClicked(ImGuiMouseButton_Left) &&
        static_cast<int>(vectors_.size()) < kMaxVectors) {
      vectors_.push_back({plot.data_x(mouse.x), plot.data_y(mouse.y)});
      rebuild(signed_count());
      message_ = "Placed u" + std::to_string(vectors_.size()) + ".";
    }
  }

  // The prefix along z against the step: the quantity the talk bounds by 1.
  void draw_prefix_plot(ImVec2 size) {
    const int n = static_cast<int>(vectors_.size());
    double bound = 0;
    for (const Vec2& u : vectors_) bound = std::max(bound, std::abs(u[0] * z_[0] + u[1] * z_[1]));
    double lim = std::max(1.2, bound * 1.3);
    if (walk_)
      for (const auto& st : walk_->steps()) lim = std::max(lim, std::abs(st.prefix_along_z) * 1.1);
    Plot plot("##teach_prefix", size, "prefix along z:  sum_{i<=j} sigma_i <u_i, z>",
              Axis{"step j", -0.2, std::max(1.0, double(n)) + 0.2}, Axis{"<prefix, z>", -lim, lim});
    plot.hline(0, kColGrid, 1.5f);
    plot.hline(1, with_alpha(kColZ, 0.6f));
    plot.hline(-1, with_alpha(kColZ, 0.6f));
    std::vector<double> xs{0}, ys{0};
    if (walk_)
      for (const auto& st : walk_->steps()) {
        xs.push_back(st.index + 1);
        ys.push_back(st.prefix_along_z);
      }
    plot.line(xs, ys, kColPrefix, 2.0f);
    ImDrawList* dl = plot.draw_list();
    if (walk_)
      for (const auto& st : walk_->steps())
        dl->AddCircleFilled(plot.to_screen(st.index + 1, st.prefix_along_z), px(4.5f),
                            st.sigma > 0 ? kColPlus : kColMinus, 12);
    char text[160];
    std::snprintf(text, sizeof text, "max |prefix along z| = %.3f  (max |<u_i, z>| = %.3f)",
                  walk_ ? walk_->max_abs_prefix_along_z() : 0.0, bound);
    dl->AddText(ImVec2(plot.inner_min().x + 6, plot.inner_min().y + 4), kColAxisText,
                elide(text, plot.inner_max().x - plot.inner_min().x - 12).c_str());
    plot.legend({{"sigma = +1", kColPlus}, {"sigma = -1", kColMinus}, {"+-1", kColZ}},
                Plot::Corner::BottomRight);
  }

  // The talk's table: one column per vector, rows <u_i, z>, p, sigma and the prefix along z.
  void draw_table() {
    const int n = static_cast<int>(vectors_.size());
    if (n == 0) return;
    const int signed_n = signed_count();
    const bool self_balancing = rule_ == TeachingWalk::Rule::SelfBalancing;
    const ImGuiTableFlags flags = ImGuiTableFlags_Borders | ImGuiTableFlags_RowBg |
                                  ImGuiTableFlags_SizingFixedFit | ImGuiTableFlags_ScrollX;
    if (!ImGui::BeginTable("##teach_table", n + 1, flags)) return;
    ImGui::TableSetupColumn("", ImGuiTableColumnFlags_WidthFixed, px(200));
    for (int i = 0; i < n; ++i) {
      char h[16];
      std::snprintf(h, sizeof h, "i = %d", i + 1);
      ImGui::TableSetupColumn(h, ImGuiTableColumnFlags_WidthFixed, px(70));
    }
    ImGui::TableHeadersRow();
    auto row = [&](const char* label, auto cell) {
      ImGui::TableNextRow();
      ImGui::TableSetColumnIndex(0);
      ImGui::TextUnformatted(label);
      for (int i = 0; i < n; ++i) {
        ImGui::TableSetColumnIndex(i + 1);
        cell(i);
      }
    };
    row("<u_i, z>",
        [&](int i) { ImGui::Text("%.3f", vectors_[i][0] * z_[0] + vectors_[i][1] * z_[1]); });
    row(self_balancing ? "<w_i, u_i> (prefix . u)" : "prefix along z before", [&](int i) {
      if (i < signed_n) ImGui::Text("%.3f", walk_->steps()[i].inner);
    });
    row(self_balancing ? "p_i = 1/2 - <w,u>/(2c)" : "p_i (sign chosen)", [&](int i) {
      if (i < signed_n) ImGui::Text("%.3f", walk_->steps()[i].p);
    });
    if (self_balancing)
      row("uniform drawn", [&](int i) {
        if (i < signed_n) ImGui::Text("%.3f", walk_->steps()[i].uniform);
      });
    row("sigma_i", [&](int i) {
      if (i >= signed_n) return;
      const int s = walk_->steps()[i].sigma;
      ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(s > 0 ? kColPlus : kColMinus), "%s",
                         s > 0 ? "+" : "-");
    });
    row("prefix sum along z", [&](int i) {
      if (i < signed_n) ImGui::Text("%.3f", walk_->steps()[i].prefix_along_z);
    });
    ImGui::EndTable();
  }

  // ---- The talk's second half ------------------------------------------------------------

  // The mode picker and the playback speed (shared by every mode).
  void draw_mode_bar(AppState& s) {
    ImGui::SetNextItemWidth(px(330));
    const char* titles[kNumModes];
    {
      const char* t = kModeTitles;
      for (int i = 0; i < kNumModes; ++i, t += std::strlen(t) + 1) titles[i] = t;
    }
    // A list of Selectables (not Combo's string form) so that each option's rectangle is
    // recorded for the real-input tests ("combo:teaching mode:<name>").
    if (ImGui::BeginCombo("mode", titles[static_cast<int>(mode_)])) {
      for (int i = 0; i < kNumModes; ++i) {
        if (ImGui::Selectable(titles[i], i == static_cast<int>(mode_))) {
          mode_ = static_cast<Mode>(i);
          playing_ = false;
        }
        record_item(s, std::string("combo:teaching mode:") + kModeNames[i]);
      }
      ImGui::EndCombo();
    }
    record_item(s, "combo:teaching mode");
    if (ImGui::IsItemHovered())
      ImGui::SetTooltip(
          "vector balancing: the talk's worked example and the self-balancing rule.\n"
          "exp kernel: keys, values and a query in 2-D; the walk on phi(k) (denominator) and on\n"
          "phi(k) (x) v (numerator), phi = the Taylor series of exp(<k,q>/sqrt 2) cut at degree "
          "14.\n"
          "random signs race: |sum sigma_i u_i| as n grows, walk vs fair coins, sqrt(n) and log "
          "n.\n"
          "merge and reduce: balancekv-stream's levels filling as tokens stream in.");
    toolbar_next(labelled_width(px(120), "speed"));
    ImGui::SetNextItemWidth(px(120));
    ImGui::SliderFloat("speed", &speed_, 0.25f, 30.0f, "%.2f steps/s",
                       ImGuiSliderFlags_Logarithmic);
    if (ImGui::IsItemHovered()) ImGui::SetTooltip("Playback speed: steps per second.");
  }

  void draw_second_half(AppState& s) {
    ensure_mode_objects();
    draw_mode_controls(s);
    handle_mode_keys();
    advance_mode_playback();
    draw_mode_narration();
    mark_figure_top();
    if (!mode_error_.empty()) {
      ImGui::TextColored(ImVec4(1, 0.5f, 0.4f, 1), "%s", mode_error_.c_str());
      return;
    }
    switch (mode_) {
      case Mode::ExpKernel:
        draw_exp_kernel();
        break;
      case Mode::Race:
        draw_race();
        break;
      case Mode::MergeReduce:
        draw_merge_reduce();
        break;
      case Mode::Balancing:
        break;
    }
  }

  void ensure_mode_objects() {
    if (mode_ == Mode::ExpKernel && !ek_ && mode_error_.empty()) rebuild_exp_kernel(0);
    if (mode_ == Mode::Race && !race_ && mode_error_.empty()) rebuild_race();
    if (mode_ == Mode::MergeReduce && !mr_ && mode_error_.empty()) rebuild_merge_reduce(0);
  }

  void rebuild_exp_kernel(int steps) {
    mode_error_.clear();
    ek_.reset();
    try {
      ek_ = std::make_unique<ExpKernelWalk>(ek_n_, ek_seed_, ek_c_);
      for (int i = 0; i < steps && ek_->step(); ++i) {
      }
    } catch (const InputError& e) {
      mode_error_ = e.what();
    }
  }
  void rebuild_race() {
    mode_error_.clear();
    race_.reset();
    try {
      race_ = run_discrepancy_race(race_n_max_, race_dim_, race_c_, race_seed_);
      race_pos_ = std::clamp(race_pos_, 1, race_n_max_);
    } catch (const InputError& e) {
      mode_error_ = e.what();
    }
  }
  void rebuild_merge_reduce(int steps) {
    mode_error_.clear();
    mr_.reset();
    try {
      mr_budget_ = std::clamp(mr_budget_, 1, mr_n_ - 1);
      mr_ = std::make_unique<MergeReduceTeaching>(mr_n_, mr_budget_, mr_seed_, mr_c_scale_);
      for (int i = 0; i < steps && mr_->step(); ++i) {
      }
    } catch (const InputError& e) {
      mode_error_ = e.what();
    }
  }

  int ek_pos() const { return ek_ ? static_cast<int>(ek_->steps().size()) : 0; }
  // The race's n grows one at a time up to 16, then by about 10% a step.
  int race_next(int n) const { return std::min(race_n_max_, n < 16 ? n + 1 : (n * 11 + 9) / 10); }
  int race_prev(int n) const {
    int prev = 1;
    for (int x = 1; x < n; x = race_next(x)) prev = x;
    return prev;
  }

  int mode_pos() const {
    switch (mode_) {
      case Mode::ExpKernel:
        return ek_pos();
      case Mode::Race:
        return race_pos_;
      case Mode::MergeReduce:
        return mr_ ? mr_->pushed() : 0;
      case Mode::Balancing:
        break;
    }
    return 0;
  }
  bool mode_done() const {
    switch (mode_) {
      case Mode::ExpKernel:
        return !ek_ || ek_->done();
      case Mode::Race:
        return !race_ || race_pos_ >= race_n_max_;
      case Mode::MergeReduce:
        return !mr_ || mr_->done();
      case Mode::Balancing:
        break;
    }
    return true;
  }
  int mode_first() const { return mode_ == Mode::Race ? 1 : 0; }
  bool mode_step() {
    if (mode_done()) return false;
    if (mode_ == Mode::ExpKernel) return ek_->step();
    if (mode_ == Mode::MergeReduce) return mr_->step();
    race_pos_ = race_next(race_pos_);
    return true;
  }
  void mode_goto(int pos) {
    if (mode_ == Mode::ExpKernel) rebuild_exp_kernel(pos);
    if (mode_ == Mode::MergeReduce) rebuild_merge_reduce(pos);
    if (mode_ == Mode::Race) race_pos_ = std::clamp(pos, 1, race_n_max_);
  }
  void mode_back() {
    if (mode_ == Mode::Race)
      race_pos_ = race_prev(race_pos_);
    else
      mode_goto(mode_pos() - 1);
  }
  void mode_run() {
    while (mode_step()) {
    }
  }

  // Playback and the mode's own settings; changing a setting rebuilds the mode at the same step.
  void draw_mode_controls(AppState& s) {
    const bool can_step = !mode_done();
    const bool can_back = mode_pos() > mode_first();
    if (!can_back) ImGui::BeginDisabled();
    if (ImGui::Button("reset")) mode_goto(mode_first()), playing_ = false;
    ImGui::SameLine();
    if (ImGui::Button("<")) mode_back(), playing_ = false;
    if (!can_back) ImGui::EndDisabled();
    ImGui::SameLine();
    const float play_w = ImGui::CalcTextSize("pause").x + ImGui::GetStyle().FramePadding.x * 2;
    if (!can_step && !playing_) ImGui::BeginDisabled();
    if (ImGui::Button(playing_ ? "pause" : "play", ImVec2(play_w, 0)))
      playing_ = !playing_, timer_ = 0;
    if (!can_step && !playing_) ImGui::EndDisabled();
    ImGui::SameLine();
    if (!can_step) ImGui::BeginDisabled();
    if (ImGui::Button("step >")) mode_step(), playing_ = false;
    record_item(s, "button:teaching step");
    ImGui::SameLine();
    if (ImGui::Button("run")) mode_run(), playing_ = false;
    record_item(s, "button:teaching run");
    if (!can_step) ImGui::EndDisabled();
    if (ImGui::IsItemHovered(ImGuiHoveredFlags_AllowWhenDisabled))
      ImGui::SetTooltip("Keys: space = play / pause, right arrow = step, left arrow = back.");
    auto seed_input = [&](uint64_t* seed) {
      toolbar_next(labelled_width(px(90), "seed"));
      ImGui::SetNextItemWidth(px(90));
      int v = static_cast<int>(*seed);
      if (ImGui::InputInt("seed", &v)) {
        *seed = static_cast<uint64_t>(std::max(0, v));
        return true;
      }
      return false;
    };
    const int pos = mode_pos();
    if (mode_ == Mode::ExpKernel) {
      bool changed = seed_input(&ek_seed_);
      toolbar_next(labelled_width(px(110), "tokens"));
      ImGui::SetNextItemWidth(px(110));
      changed |= ImGui::SliderInt("tokens", &ek_n_, 2, kMaxExpKernelN);
      toolbar_next(labelled_width(px(110), "c / max|u|^2"));
      ImGui::SetNextItemWidth(px(110));
      float c = static_cast<float>(ek_c_);
      if (ImGui::SliderFloat("c / max|u|^2", &c, 0.05f, 5.0f, "%.2f", ImGuiSliderFlags_Logarithmic))
        ek_c_ = c, changed = true;
      if (ImGui::IsItemHovered())
        ImGui::SetTooltip(
            "Each walk's c in p_j = 1/2 - <w_j, u_j> / (2c), in units of its largest |u_i|^2.");
      if (changed) rebuild_exp_kernel(std::min(pos, ek_n_));
    } else if (mode_ == Mode::Race) {
      bool changed = seed_input(&race_seed_);
      int n_log = static_cast<int>(std::lround(std::log2(race_n_max_)));
      toolbar_next(labelled_width(px(110), "n max"));
      ImGui::SetNextItemWidth(px(110));
      if (ImGui::SliderInt("n max", &n_log, 6, 14,
                           ("2^%d = " + std::to_string(1 << n_log)).c_str()))
        race_n_max_ = 1 << n_log, changed = true;
      toolbar_next(labelled_width(px(90), "dim"));
      ImGui::SetNextItemWidth(px(90));
      changed |= ImGui::SliderInt("dim", &race_dim_, 1, 64);
      toolbar_next(labelled_width(px(100), "c"));
      ImGui::SetNextItemWidth(px(100));
      float c = static_cast<float>(race_c_);
      if (ImGui::SliderFloat("c", &c, 0.1f, 100.0f, "%.2f", ImGuiSliderFlags_Logarithmic))
        race_c_ = c, changed = true;
      if (changed) rebuild_race();
    } else if (mode_ == Mode::MergeReduce) {
      bool changed = seed_input(&mr_seed_);
      toolbar_next(labelled_width(px(110), "tokens"));
      ImGui::SetNextItemWidth(px(110));
      changed |= ImGui::SliderInt("tokens", &mr_n_, 8, 512);
      toolbar_next(labelled_width(px(110), "budget m"));
      ImGui::SetNextItemWidth(px(110));
      changed |= ImGui::SliderInt("budget m", &mr_budget_, 1, std::max(1, mr_n_ - 1));
      toolbar_next(labelled_width(px(110), "c_scale"));
      ImGui::SetNextItemWidth(px(110));
      float c = static_cast<float>(mr_c_scale_);
      if (ImGui::SliderFloat("c_scale", &c, 1e-4f, 1.0f, "%.4f", ImGuiSliderFlags_Logarithmic))
        mr_c_scale_ = c, changed = true;
      if (ImGui::IsItemHovered())
        ImGui::SetTooltip(
            "Multiplies the theorem's c = 30 log(n/delta), as balancekv-stream's c_scale: at 1\n"
            "every p stays near 1/2 (the walk is close to fair coins); smaller is a stronger "
            "walk.");
      if (changed) rebuild_merge_reduce(std::min(pos, mr_n_));
    }
  }

  void handle_mode_keys() {
    const ImGuiIO& io = ImGui::GetIO();
    if (io.WantTextInput || io.KeyCtrl) return;
    if (ImGui::IsKeyPressed(ImGui::GetKeyIndex(ImGuiKey_Space), false)) {
      playing_ = !playing_ && !mode_done();
      timer_ = 0;
    }
    if (ImGui::IsKeyPressed(ImGui::GetKeyIndex(ImGuiKey_RightArrow))) {
      mode_step();
      playing_ = false;
    }
    if (ImGui::IsKeyPressed(ImGui::GetKeyIndex(ImGuiKey_LeftArrow)) && mode_pos() > mode_first()) {
      mode_back();
      playing_ = false;
    }
  }

  void advance_mode_playback() {
    if (!playing_) return;
    timer_ += ImGui::GetIO().DeltaTime;
    if (timer_ >= 1.0f / speed_) {
      timer_ = 0;
      if (!mode_step()) playing_ = false;
    }
    if (mode_done()) playing_ = false;
    request_next_frame();
  }

  void draw_mode_narration() {
    const std::string line = mode_narration();
    ImGui::PushStyleColor(ImGuiCol_Text, ImVec4(0.95f, 0.93f, 0.75f, 1));
    ImGui::TextWrapped("%s", line.c_str());
    ImGui::PopStyleColor();
  }

  std::string mode_narration() const {
    char buf[900];
    if (mode_ == Mode::ExpKernel && ek_) {
      const int n = ek_pos();
      if (n == 0) {
        std::snprintf(
            buf, sizeof buf,
            "%d keys k_i and values v_i in 2-D, query q (yellow). phi is the Taylor series of "
            "exp(<k,q>/sqrt 2) cut after degree %d (%d features; not exact: on these keys "
            "|<phi(k_i),phi(q)> - exp(<k_i,q>/sqrt 2)| <= %.1e). The denominator walk balances "
            "u_i = phi(k_i), the numerator walk psi_i = phi(k_i) (x) v_i; both draw the same "
            "uniform per step, and so do the fair coins (grey). Press play (space).",
            ek_->n(), ek_->features().degree(), ek_->features().dim(), ek_->feature_error());
        return buf;
      }
      const auto& st = ek_->steps()[n - 1];
      if (!ek_->done()) {
        std::snprintf(
            buf, sizeof buf,
            "k%d: denominator <w, phi(k%d)> = %+.3f (the talk's sum_{i<j} sigma_i exp(<k_i,k_j>/"
            "sqrt 2) = %+.3f), p = %.2f; numerator <w, phi(k%d) (x) v%d> = %+.3f (kernel form "
            "%+.3f), p = %.2f; drew %.2f -> sigma = %+d (denominator), %+d (numerator), %+d "
            "(fair coin). Along q: denominator sum %+.3f (coins %+.3f), |numerator sum| %.3f "
            "(coins %.3f).",
            st.index + 1, st.index + 1, st.den_inner, st.den_inner_kernel, st.p_den, st.index + 1,
            st.index + 1, st.num_inner, st.num_inner_kernel, st.p_num, st.uniform, st.sigma_den,
            st.sigma_num, st.sigma_random, st.den_walk, st.den_random,
            std::hypot(st.num_walk[0], st.num_walk[1]),
            std::hypot(st.num_random[0], st.num_random[1]));
        return buf;
      }
      const double exact = ek_->exact_den();
      std::snprintf(buf, sizeof buf,
                    "All %d signed. Keeping the + tokens with weight 2 estimates sum_i "
                    "exp(<k_i,q>/sqrt 2) = %.3f by %.3f (walk) and %.3f (coins): the error is "
                    "exactly |sum sigma_i exp(<k_i,q>/sqrt 2)| = %.3f vs %.3f. The numerator's "
                    "error is |sum sigma_i exp(<k_i,q>/sqrt 2) v_i| = %.3f vs %.3f.",
                    ek_->n(), exact, exact + st.den_walk, exact + st.den_random,
                    std::abs(st.den_walk), std::abs(st.den_random),
                    std::hypot(st.num_walk[0], st.num_walk[1]),
                    std::hypot(st.num_random[0], st.num_random[1]));
      return buf;
    }
    if (mode_ == Mode::Race && race_) {
      const int n = race_pos_;
      const double w = race_->walk[n - 1], r = race_->random[n - 1];
      int clipped = 0;
      for (int i = 0; i < n; ++i) clipped += race_->clipped[i];
      std::snprintf(buf, sizeof buf,
                    "n = %d unit vectors in R^%d. Fair coins: |sum sigma_i u_i| = %.2f (E|.|^2 = "
                    "n, so about sqrt(n) = %.1f). The self-balancing walk (c = %.2f) on the same "
                    "vectors: %.2f now, at most %.2f over every prefix (log n = %.1f); p left "
                    "[0, 1] at %d of %d steps (the sign was then forced). %s",
                    n, race_->dim, r, std::sqrt(double(n)), race_->c, w,
                    DiscrepancyRace::max_upto(race_->walk, n), std::log(double(n)), clipped, n,
                    n < race_n_max_ ? "Play to let n grow." : "The race is over.");
      return buf;
    }
    if (mode_ == Mode::MergeReduce && mr_) {
      const int pushed = mr_->pushed();
      if (pushed == 0) {
        std::snprintf(
            buf, sizeof buf,
            "%d tokens will stream into C^0 with budget m = %d. balancekv-stream's budget search "
            "picks batch t = %d and T = %d levels (the hard bound if every merge kept half: %lld "
            "<= m). Every t tokens C^0 is reduced by SoftmaxBalance into C^1; while the batch "
            "count is divisible by 2^i, C^i is reduced into C^(i+1) as well. C^l weighs 2^l. "
            "c = %.3g, R = %.3g: p = 1/2 - y^T eta / (2 c R^2).",
            mr_->n(), mr_->budget(), mr_->batch(), mr_->levels(), mr_->size_bound(), mr_->c(),
            mr_->radius());
        return buf;
      }
      std::string text = "Token " + std::to_string(pushed - 1) + " arrived in C^0 (" +
                         std::to_string(mr_->level_sets()[0].size()) +
                         " of t = " + std::to_string(mr_->batch()) + ").";
      const auto& merges = mr_->merges();
      if (mr_->last_step_first_merge() < static_cast<int>(merges.size())) {
        text = "Token " + std::to_string(pushed - 1) + " completed batch " +
               std::to_string(pushed / mr_->batch()) + ":";
        for (size_t i = mr_->last_step_first_merge(); i < merges.size(); ++i) {
          const auto& m = merges[i];
          double pmin = 1, pmax = 0;
          int plus = 0;
          for (size_t k = 0; k < m.p.size(); ++k) {
            pmin = std::min(pmin, m.p[k]), pmax = std::max(pmax, m.p[k]);
            plus += m.sigma[k] > 0;
          }
          text += " C^" + std::to_string(m.level) + "'s " + std::to_string(m.input.size()) +
                  " tokens went through SoftmaxBalance (p in [" + fmt("%.3f", pmin) + ", " +
                  fmt("%.3f", pmax) + "], " + std::to_string(plus) + " +, " +
                  std::to_string(m.input.size() - plus) + " -); the smaller class (" +
                  std::to_string(m.kept.size()) + ") moved to C^" + std::to_string(m.level + 1) +
                  " with weight " + std::to_string(1 << (m.level + 1)) +
                  (m.kept.empty() ? " (nothing: the smaller sign class is empty)" : "") + ".";
        }
        if (mr_->levels() > 0 && merges.back().level + 1 < mr_->levels())
          text += " The batch count is odd at the next level, so merging stops there.";
      }
      if (mr_->done()) {
        size_t kept = 0;
        for (const auto& l : mr_->level_sets()) kept += l.size();
        text += " All " + std::to_string(mr_->n()) + " tokens seen: " + std::to_string(kept) +
                " kept (budget " + std::to_string(mr_->budget()) +
                ") -- balancekv-stream's denominator set for these keys.";
      }
      return text;
    }
    return mode_error_.empty() ? std::string() : mode_error_;
  }

  nlohmann::json mode_result_json() const {
    nlohmann::json j;
    if (mode_ == Mode::ExpKernel && ek_) {
      j["features"] = "truncated Taylor";
      j["degree"] = ek_->features().degree();
      j["feature_dim"] = ek_->features().dim();
      j["feature_error"] = ek_->feature_error();
      j["c_den"] = ek_->c_den();
      j["c_num"] = ek_->c_num();
      j["exact_den"] = ek_->exact_den();
      j["exact_num"] = {ek_->exact_num()[0], ek_->exact_num()[1]};
      nlohmann::json steps = nlohmann::json::array();
      for (const auto& st : ek_->steps())
        steps.push_back({{"k", {ek_->keys()[st.index][0], ek_->keys()[st.index][1]}},
                         {"p_den", st.p_den},
                         {"p_num", st.p_num},
                         {"sigma_den", st.sigma_den},
                         {"sigma_num", st.sigma_num},
                         {"sigma_random", st.sigma_random},
                         {"den_walk", st.den_walk},
                         {"den_random", st.den_random},
                         {"num_walk", {st.num_walk[0], st.num_walk[1]}},
                         {"num_random", {st.num_random[0], st.num_random[1]}}});
      j["steps"] = steps;
    } else if (mode_ == Mode::Race && race_) {
      const int n = race_pos_;
      j["n"] = n;
      j["walk"] = race_->walk[n - 1];
      j["random"] = race_->random[n - 1];
      j["walk_max"] = DiscrepancyRace::max_upto(race_->walk, n);
      j["sqrt_n"] = std::sqrt(double(n));
      j["log_n"] = std::log(double(n));
    } else if (mode_ == Mode::MergeReduce && mr_) {
      j["batch"] = mr_->batch();
      j["levels"] = mr_->levels();
      j["pushed"] = mr_->pushed();
      j["level_sets"] = mr_->level_sets();
      j["merges"] = mr_->merges().size();
      size_t kept = 0;
      for (const auto& l : mr_->level_sets()) kept += l.size();
      j["kept"] = kept;
      j["bound"] = mr_->size_bound();
    }
    return j;
  }

  // Exp kernel: the plane (keys, values, q), the denominator and the numerator along q.
  void draw_exp_kernel() {
    const ImVec2 avail = ImGui::GetContentRegionAvail();
    const float h = std::max(px(220), avail.y - ImGui::GetTextLineHeightWithSpacing() * 1.5f);
    const float plane_w = std::max(px(220), std::min(avail.x * 0.36f, h));
    const float plot_w =
        std::max(px(160), (avail.x - plane_w) / 2 - ImGui::GetStyle().ItemSpacing.x);
    const int signed_n = ek_pos();
    const auto& keys = ek_->keys();
    const auto& vals = ek_->values();
    const TeachVec2 q = ek_->query();
    constexpr double kValueScale = 0.25;  // values drawn as arrows a quarter of their length
    {
      double x0 = -0.5, x1 = 0.5, y0 = -0.5, y1 = 0.5;
      auto grow = [&](double x, double y) {
        x0 = std::min(x0, x), x1 = std::max(x1, x), y0 = std::min(y0, y), y1 = std::max(y1, y);
      };
      for (size_t i = 0; i < keys.size(); ++i) {
        grow(keys[i][0], keys[i][1]);
        grow(keys[i][0] + kValueScale * vals[i][0], keys[i][1] + kValueScale * vals[i][1]);
      }
      grow(q[0], q[1]);
      const double pad = 0.08 * std::max(x1 - x0, y1 - y0);
      Plot plot("##ek_plane", ImVec2(plane_w, h),
                "keys (fill: denominator sign, ring: numerator), values / 4, q",
                Axis{"x", x0 - pad, x1 + pad}, Axis{"y", y0 - pad, y1 + pad}, true);
      ImDrawList* dl = plot.draw_list();
      dl->PushClipRect(plot.inner_min(), plot.inner_max(), true);
      const ImVec2 o = plot.to_screen(0, 0);
      arrow(dl, o, plot.to_screen(q[0], q[1]), kColZ, px(2.5f));
      dl->AddText(ImVec2(plot.sx(q[0]) + px(4), plot.sy(q[1]) - px(16)), kColZ, "q");
      for (size_t i = 0; i < keys.size(); ++i) {
        const ImVec2 k = plot.to_screen(keys[i][0], keys[i][1]);
        arrow(dl, k,
              plot.to_screen(keys[i][0] + kValueScale * vals[i][0],
                             keys[i][1] + kValueScale * vals[i][1]),
              with_alpha(kColVector, 0.6f), px(1.2f));
        const bool done = static_cast<int>(i) < signed_n;
        ImU32 fill = kColVector, ring = kColVector;
        if (done) {
          const auto& st = ek_->steps()[i];
          fill = st.sigma_den > 0 ? kColPlus : kColMinus;
          ring = st.sigma_num > 0 ? kColPlus : kColMinus;
        }
        dl->AddCircleFilled(k, px(4.5f), done ? fill : with_alpha(fill, 0.5f), 12);
        dl->AddCircle(k, px(7.5f), done ? ring : with_alpha(ring, 0.4f), 14, px(2.0f));
        if (static_cast<int>(i) == signed_n - 1) dl->AddCircle(k, px(11), kColPrefix, 16, px(1.5f));
        if (keys.size() <= 16) {
          char label[16];
          std::snprintf(label, sizeof label, "k%d", static_cast<int>(i) + 1);
          dl->AddText(ImVec2(k.x + px(8), k.y + px(2)), kColAxisText, label);
        }
      }
      dl->PopClipRect();
      plot.legend({{"sigma = +1", kColPlus}, {"sigma = -1", kColMinus}, {"q", kColZ}},
                  Plot::Corner::BottomLeft);
    }
    const int n = ek_->n();
    std::vector<double> xs{0}, dw{0}, dr{0}, nw{0}, nr{0};
    for (const auto& st : ek_->steps()) {
      xs.push_back(st.index + 1);
      dw.push_back(st.den_walk);
      dr.push_back(st.den_random);
      nw.push_back(std::hypot(st.num_walk[0], st.num_walk[1]));
      nr.push_back(std::hypot(st.num_random[0], st.num_random[1]));
    }
    // Fixed y ranges from the whole run, so the axes do not jump while it plays.
    ExpKernelWalk full(ek_n_, ek_seed_, ek_c_);
    full.run();
    double dlim = 0.5, nlim = 0.5;
    for (const auto& st : full.steps()) {
      dlim = std::max({dlim, std::abs(st.den_walk), std::abs(st.den_random)});
      nlim = std::max({nlim, std::hypot(st.num_walk[0], st.num_walk[1]),
                       std::hypot(st.num_random[0], st.num_random[1])});
    }
    ImGui::SameLine();
    {
      Plot plot("##ek_den", ImVec2(plot_w, h), "denominator along q",
                Axis{"step j", 0, std::max(1.0, double(n))},
                Axis{"sum sigma_i exp(<k_i,q>/sqrt 2)", -dlim * 1.1, dlim * 1.1});
      plot.hline(0, kColGrid, 1.5f);
      plot.dashed_line(xs, dr, kColRandom, 1.5f);
      plot.line(xs, dw, kColWalk, 2.0f);
      plot.markers(std::vector<double>(xs.begin() + 1, xs.end()),
                   std::vector<double>(dw.begin() + 1, dw.end()), kColWalk, px(3));
      plot.legend({{"walk on phi(k)", kColWalk}, {"fair coins", kColRandom}},
                  Plot::Corner::TopLeft);
    }
    ImGui::SameLine();
    {
      Plot plot("##ek_num", ImVec2(plot_w, h), "numerator along q",
                Axis{"step j", 0, std::max(1.0, double(n))},
                Axis{"|sum sigma_i exp(<k_i,q>/sqrt 2) v_i|", 0, nlim * 1.1});
      plot.dashed_line(xs, nr, kColRandom, 1.5f);
      plot.line(xs, nw, kColWalk, 2.0f);
      plot.markers(std::vector<double>(xs.begin() + 1, xs.end()),
                   std::vector<double>(nw.begin() + 1, nw.end()), kColWalk, px(3));
      plot.legend({{"walk on phi(k) (x) v", kColWalk}, {"fair coins", kColRandom}},
                  Plot::Corner::TopLeft);
    }
    ImGui::TextDisabled(
        "phi: Taylor series of exp(<k,q>/sqrt 2) to degree %d (%d features), max error on these "
        "keys %.1e; c = %.3g (denominator), %.3g (numerator).",
        ek_->features().degree(), ek_->features().dim(), ek_->feature_error(), ek_->c_den(),
        ek_->c_num());
  }

  // The race: |sum sigma_i u_i| against n on log-log axes, with sqrt(n) and 1 + ln n guides.
  void draw_race() {
    const ImVec2 avail = ImGui::GetContentRegionAvail();
    const int n = race_pos_;
    double ymax = 2;
    for (double v : race_->random) ymax = std::max(ymax, v);
    for (double v : race_->walk) ymax = std::max(ymax, v);
    ymax = std::max(ymax, std::sqrt(double(race_n_max_))) * 1.3;
    Plot plot("##race", ImVec2(avail.x, std::max(px(240), avail.y)),
              "discrepancy |sum_{i<=n} sigma_i u_i| of unit vectors: self-balancing walk vs fair "
              "coins (log-log)",
              Axis{"n (log2)", 1, double(race_n_max_), Scale::Log2},
              Axis{"|sum sigma_i u_i| (log2)", 0.05, ymax, Scale::Log2});
    std::vector<double> xs, walk, rnd, gs, gl;
    for (int i = 1; i <= race_n_max_; i = i < 64 ? i + 1 : i + std::max(1, i / 64)) {
      gs.push_back(std::sqrt(double(i)));
      gl.push_back(1 + std::log(double(i)));
      xs.push_back(i);
    }
    plot.dashed_line(xs, gs, with_alpha(kColZ, 0.8f), 1.5f);
    plot.dashed_line(xs, gl, with_alpha(kColPlus, 0.8f), 1.5f);
    // Solid: the largest discrepancy over the prefixes so far (what the walk keeps small);
    // faint: the discrepancy at n itself.
    std::vector<double> xn, walk_max, rnd_max;
    double wm = 0, rm = 0;
    for (int i = 1; i <= n; ++i) {
      xn.push_back(i);
      walk.push_back(std::max(race_->walk[i - 1], 0.05));
      rnd.push_back(std::max(race_->random[i - 1], 0.05));
      wm = std::max(wm, race_->walk[i - 1]);
      rm = std::max(rm, race_->random[i - 1]);
      walk_max.push_back(std::max(wm, 0.05));
      rnd_max.push_back(std::max(rm, 0.05));
    }
    plot.line(xn, rnd, with_alpha(kColRandom, 0.35f), 1.0f);
    plot.line(xn, walk, with_alpha(kColWalk, 0.3f), 1.0f);
    plot.line(xn, rnd_max, kColRandom, 2.0f);
    plot.line(xn, walk_max, kColWalk, 2.5f);
    plot.vline(n, with_alpha(kColPrefix, 0.5f));
    plot.markers({double(n)}, {std::max(race_->walk[n - 1], 0.05)}, kColWalk, px(5));
    plot.markers({double(n)}, {std::max(race_->random[n - 1], 0.05)}, kColRandom, px(5));
    plot.legend({{"fair coins (max over prefixes; faint: at n)", kColRandom},
                 {"self-balancing walk (max over prefixes; faint: at n)", kColWalk},
                 {"sqrt(n)", kColZ},
                 {"1 + ln n", kColPlus}},
                Plot::Corner::TopLeft);
  }

  // Merge and reduce: the stream, the levels C^0..C^T, the last merges, and the keys.
  void draw_merge_reduce() {
    const ImVec2 avail = ImGui::GetContentRegionAvail();
    const float left_w = std::max(px(300), avail.x * 0.62f);
    const int n = mr_->n(), pushed = mr_->pushed();
    const auto& levels = mr_->level_sets();
    std::vector<int> level_of(n, -2);  // -2: not arrived, -1: dropped, l: in C^l
    for (int t = 0; t < pushed; ++t) level_of[t] = -1;
    for (size_t l = 0; l < levels.size(); ++l)
      for (int t : levels[l]) level_of[t] = static_cast<int>(l);
    auto token_colour = [&](int t) {
      const int l = level_of[t];
      return l == -2 ? kColFuture : l == -1 ? kColDroppedToken : level_colour(l);
    };
    ImGui::BeginGroup();
    ImDrawList* dl = ImGui::GetWindowDrawList();
    // The stream: one cell per token.
    ImGui::TextUnformatted("the stream (colour: where each token is now)");
    {
      const ImVec2 o = ImGui::GetCursorScreenPos();
      const float cell = std::max(1.0f, std::min(px(18), left_w / n));
      const float ch = px(18);
      for (int t = 0; t < n; ++t)
        dl->AddRectFilled(ImVec2(o.x + t * cell, o.y), ImVec2(o.x + (t + 1) * cell - 1, o.y + ch),
                          token_colour(t));
      if (pushed > 0)
        dl->AddRect(ImVec2(o.x + (pushed - 1) * cell - 1, o.y - 1),
                    ImVec2(o.x + pushed * cell, o.y + ch + 1), kColHover, 0, 0, px(2));
      ImGui::Dummy(ImVec2(left_w, ch + px(4)));
    }
    // The levels.
    const float chip_w = ImGui::CalcTextSize("0000").x + px(4);
    const float chip_h = ImGui::GetTextLineHeight() + px(2);
    auto chips = [&](const std::vector<int>& tokens, const std::function<ImU32(size_t)>& colour,
                     const std::function<bool(size_t)>& outline) {
      const ImVec2 o = ImGui::GetCursorScreenPos();
      const int per_row = std::max(1, static_cast<int>(left_w / (chip_w + px(2))));
      for (size_t i = 0; i < tokens.size(); ++i) {
        const float x = o.x + (i % per_row) * (chip_w + px(2));
        const float y = o.y + (i / per_row) * (chip_h + px(2));
        dl->AddRectFilled(ImVec2(x, y), ImVec2(x + chip_w, y + chip_h), colour(i), px(3));
        if (outline(i))
          dl->AddRect(ImVec2(x - 1, y - 1), ImVec2(x + chip_w + 1, y + chip_h + 1), kColHover,
                      px(3), 0, px(2));
        const std::string label = std::to_string(tokens[i]);
        dl->AddText(ImVec2(x + px(2), y + px(1)), IM_COL32(12, 12, 14, 255), label.c_str());
      }
      const int rows = tokens.empty() ? 1 : (static_cast<int>(tokens.size()) - 1) / per_row + 1;
      ImGui::Dummy(ImVec2(left_w, rows * (chip_h + px(2))));
    };
    for (size_t l = 0; l < levels.size(); ++l) {
      ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(level_colour(static_cast<int>(l))),
                         "C^%d  weight %d  (%zu tokens)%s", static_cast<int>(l), 1 << l,
                         levels[l].size(),
                         l + 1 == levels.size() ? "  top level: only accumulates" : "");
      const size_t lv = l;
      chips(
          levels[l], [&](size_t) { return level_colour(static_cast<int>(lv)); },
          [](size_t) { return false; });
    }
    // The last step's merges: every input token coloured by its sign, the kept ones outlined.
    const auto& merges = mr_->merges();
    for (size_t i = mr_->last_step_first_merge(); i < merges.size(); ++i) {
      const auto& m = merges[i];
      ImGui::Text(
          "merge: C^%d -> C^%d (call %d): SoftmaxBalance signs; outlined = kept (the "
          "smaller class)",
          m.level, m.level + 1, m.call);
      chips(
          m.input, [&](size_t k) { return m.sigma[k] > 0 ? kColPlus : kColMinus; },
          [&](size_t k) { return std::binary_search(m.kept.begin(), m.kept.end(), m.input[k]); });
    }
    ImGui::EndGroup();
    ImGui::SameLine();
    // The keys, coloured like the stream.
    const MatrixF& keys = mr_->keys();
    double x0 = -1, x1 = 1, y0 = -1, y1 = 1;
    for (int t = 0; t < n; ++t) {
      x0 = std::min(x0, double(keys(t, 0))), x1 = std::max(x1, double(keys(t, 0)));
      y0 = std::min(y0, double(keys(t, 1))), y1 = std::max(y1, double(keys(t, 1)));
    }
    Plot plot("##mr_keys", ImVec2(0, std::max(px(220), avail.y)),
              "the 2-D keys (colour: level; dark red: dropped)", Axis{"x", x0 - 0.2, x1 + 0.2},
              Axis{"y", y0 - 0.2, y1 + 0.2}, true);
    ImDrawList* pdl = plot.draw_list();
    pdl->PushClipRect(plot.inner_min(), plot.inner_max(), true);
    for (int t = 0; t < n; ++t) {
      if (level_of[t] == -2) continue;
      pdl->AddCircleFilled(plot.to_screen(keys(t, 0), keys(t, 1)), px(level_of[t] >= 1 ? 4.5f : 3),
                           token_colour(t), 12);
    }
    pdl->PopClipRect();
    std::vector<Plot::LegendEntry> legend{{"dropped", kColDroppedToken}};
    for (size_t l = 0; l < levels.size() && l < 8; ++l)
      legend.push_back({"C^" + std::to_string(l), level_colour(static_cast<int>(l))});
    plot.legend(legend, Plot::Corner::TopRight);
  }

  std::vector<Vec2> vectors_;
  Vec2 z_{1, 0};
  TeachingWalk::Rule rule_ = TeachingWalk::Rule::KnownDirection;
  double c_ = 1.0;
  uint64_t seed_ = 0;
  std::unique_ptr<TeachingWalk> walk_;
  std::string error_, message_;
  bool playing_ = false;
  float timer_ = 0;
  int dragging_ = -1;
  // The second half's modes.
  Mode mode_ = Mode::Balancing;
  float speed_ = 1.5f;  // steps per second
  std::string mode_error_;
  int ek_n_ = 12;
  double ek_c_ = 0.25;
  uint64_t ek_seed_ = 1;
  std::unique_ptr<ExpKernelWalk> ek_;
  int race_n_max_ = 1024, race_dim_ = 2, race_pos_ = 1;
  double race_c_ = 1.0;
  uint64_t race_seed_ = 1;
  std::optional<DiscrepancyRace> race_;
  int mr_n_ = 96, mr_budget_ = 16;  // balancekv-stream plans t = 10, T = 4 for these
  double mr_c_scale_ = 1.0;
  uint64_t mr_seed_ = 1;
  std::unique_ptr<MergeReduceTeaching> mr_;
};

}  // namespace

std::unique_ptr<View> make_teaching_view() {
  return std::make_unique<TeachingView>();
}

}  // namespace kvscope::app
