// Teaching view: the self-balancing walk on a handful of 2-D vectors the user places with the
// mouse (or the talk's worked example: projections 0.1, 0.8, 0.5, 0.7, 0.3 on a direction z),
// stepped one sign at a time (engine/teaching/teaching_walk.h). Left: the plane with the vectors, z
// and the signed prefix sums chained head to tail; right: the prefix along z against the step, with
// the +-1 band the talk's proposition promises; below: the talk's table filling in.
// The talk's second half as further modes (engine/teaching/teaching_modes.h): the exp kernel's
// features with the numerator and denominator walks side by side, the random-signs race as n grows
// (with sqrt(n) and log n guides), and merge-and-reduce filling its levels as tokens stream in.
#include "app/colormap.h"
#include "app/play_bar.h"
#include "app/views/view_teaching_view.h"

namespace kvscope::app::teaching {

const char* TeachingView::help() const {
  return "The self-balancing walk on a handful of 2-D vectors you place (or the talk's worked "
         "example), one sign at a time with narration; and the talk's second half as modes: "
         "the exp kernel's numerator and denominator walks, random signs vs the walk as n "
         "grows, merge and reduce. Keys: right arrow steps, left arrow steps back, space "
         "plays.";
}

void TeachingView::draw(AppState& s) {
  if (!presenting_view()) draw_mode_bar(s);  // a presentation keeps the figure and playback
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
  // The prefix plot beside the plane while it keeps its least width; else under it (2x and
  // more in a panel): the view scrolls down, never sideways.
  const bool side_by_side =
      avail.x - plane_w - ImGui::GetStyle().ItemSpacing.x >= min_plot_size().x;
  draw_plane(ImVec2(side_by_side ? plane_w : avail.x, plot_h));
  if (side_by_side) ImGui::SameLine();
  draw_prefix_plot(ImVec2(0, side_by_side ? plot_h : std::max(min_plot_size().y, 0.6f * plot_h)));
  draw_table();
}

nlohmann::json TeachingView::export_json(const AppState&) const {
  nlohmann::json j = state_json();
  j["narration"] = mode_ == Mode::Balancing ? narration() : mode_narration();
  if (mode_ != Mode::Balancing) j["result"] = mode_result_json();
  return j;
}

nlohmann::json TeachingView::state_json() const {
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

std::string TeachingView::export_csv(const AppState&) const {
  if (!walk_) return {};
  std::ostringstream out;
  out << "i,u_x,u_y,along_z,p,uniform,sigma,prefix_x,prefix_y,prefix_along_z\n";
  for (const auto& st : walk_->steps())
    out << st.index + 1 << ',' << st.u[0] << ',' << st.u[1] << ',' << st.along_z << ',' << st.p
        << ',' << st.uniform << ',' << st.sigma << ',' << st.prefix[0] << ',' << st.prefix[1] << ','
        << st.prefix_along_z << '\n';
  return out.str();
}

void TeachingView::load_state(const nlohmann::json& j) {
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
      race_pos = race_pos_, mr_n = mr_n_, mr_budget = mr_budget_, mr_step = mr_ ? mr_->pushed() : 0;
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

void TeachingView::load_talk_example() {
  TeachingWalk ex = TeachingWalk::talk_example();
  vectors_ = ex.vectors();
  z_ = ex.z();
  rule_ = ex.rule();
  c_ = ex.c();
  rebuild(static_cast<int>(vectors_.size()));  // the worked example, filled in
  message_ = "The talk's example: <u_i, z> = 0.1, 0.8, 0.5, 0.7, 0.3 with z = (1, 0).";
}

// A new walk over the current vectors, signed up to `steps` vectors again.
void TeachingView::rebuild(int steps) {
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

// Replays the walk up to `steps` signed vectors (the draws are seeded, so back = replay).
void TeachingView::replay_to(int steps) {
  if (!walk_) return;
  walk_->reset();
  for (int i = 0; i < steps && walk_->step(); ++i) {
  }
}

// The toolbar: playback first, so it never moves when the rule or its settings change; c and
// seed are always there (greyed out for the known-direction rule).
void TeachingView::draw_controls() {
  PlayBar bar;
  bar.playing = playing_;
  bar.can_back = walk_ && signed_count() > 0;
  bar.can_forward = walk_ && !walk_->done();
  bar.first_label = "reset";
  bar.forward_label = "step >";
  bar.last_label = "run";
  bar.hint = "Keys: space = play / pause, right arrow = step, left arrow = back.";
  bar.first = [this] { walk_->reset(), playing_ = false; };
  bar.back = [this] { replay_to(signed_count() - 1), playing_ = false; };
  bar.toggle = [this] { playing_ = !playing_, timer_ = 0; };
  bar.forward = [this] { walk_->step(), playing_ = false; };
  bar.last = [this] { walk_->run(), playing_ = false; };
  draw_play_bar(nullptr, bar);
  if (presenting_view()) return;
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
  ImGui::SetNextItemWidth(fit_width(220, "rule"));
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
  ImGui::SetNextItemWidth(fit_width(120, "z angle"));
  float angle = static_cast<float>(std::atan2(z_[1], z_[0]) * 180.0 / M_PI);
  if (ImGui::SliderFloat("z angle", &angle, -180.0f, 180.0f, "%.0f deg")) {
    z_ = {std::cos(angle * M_PI / 180.0), std::sin(angle * M_PI / 180.0)};
    rebuild(signed_count());
  }
  if (!error_.empty())
    ImGui::TextColored(kTextError, "%s", error_.c_str());
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
void TeachingView::handle_keys() {
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
std::string TeachingView::narration() const {
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
                  st.p <= 0 || st.p >= 1 ? " (p clipped: the sign is forced)" : "", st.uniform, sg);
  }
  return buf;
}

void TeachingView::draw_narration() {
  const std::string line = narration();
  ImGui::PushStyleColor(ImGuiCol_Text, ImVec4(0.95f, 0.93f, 0.75f, 1));
  ImGui::TextWrapped("%s", line.c_str());
  ImGui::PopStyleColor();
}

void TeachingView::advance_playback() {
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
void TeachingView::content_bounds(double* x0, double* x1, double* y0, double* y1) const {
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
void TeachingView::draw_plane(ImVec2 size) {
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
  dl->AddLine(plot.to_screen(-z_[0] * far, -z_[1] * far), plot.to_screen(z_[0] * far, z_[1] * far),
              with_alpha(kColZ, 0.35f), 1.0f);
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
  plot.note_drawn(occupied);  // drawn on the draw list directly: the legend avoids them too
  plot.legend({{"u_i (unsigned)", kColVector},
               {"sigma = +1", kColPlus},
               {"sigma = -1", kColMinus},
               {"z", kColZ}},
              plot.emptiest_corner(occupied));
  ImGui::EndGroup();
}

void TeachingView::handle_plane_mouse(const Plot& plot) {
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
void TeachingView::draw_prefix_plot(ImVec2 size) {
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
void TeachingView::draw_table() {
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

}  // namespace kvscope::app::teaching

namespace kvscope::app {
std::unique_ptr<View> make_teaching_view() {
  return std::make_unique<teaching::TeachingView>();
}

}  // namespace kvscope::app
