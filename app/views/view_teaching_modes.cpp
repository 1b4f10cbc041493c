// The Teaching view's modes for the talk's second half (engine/teaching/teaching_modes.h): the exp
// kernel's features with the numerator and denominator walks side by side, the random-signs race
// as n grows (with sqrt(n) and log n guides), and merge-and-reduce filling its levels as tokens
// stream in. The class and the first half: app/views/view_teaching_view.h,
// app/views/view_teaching.cpp.
#include "app/colormap.h"
#include "app/play_bar.h"
#include "app/views/view_teaching_view.h"

namespace kvscope::app::teaching {

// The mode picker and the playback speed (shared by every mode).
void TeachingView::draw_mode_bar(AppState& s) {
  ImGui::SetNextItemWidth(fit_width(330, "mode"));
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
  ImGui::SetNextItemWidth(fit_width(120, "speed"));
  ImGui::SliderFloat("speed", &speed_, 0.25f, 30.0f, "%.2f steps/s", ImGuiSliderFlags_Logarithmic);
  if (ImGui::IsItemHovered()) ImGui::SetTooltip("Playback speed: steps per second.");
}

void TeachingView::draw_second_half(AppState& s) {
  ensure_mode_objects();
  draw_mode_controls(s);
  handle_mode_keys();
  advance_mode_playback();
  draw_mode_narration();
  mark_figure_top();
  if (!mode_error_.empty()) {
    ImGui::TextColored(kTextError, "%s", mode_error_.c_str());
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

void TeachingView::ensure_mode_objects() {
  if (mode_ == Mode::ExpKernel && !ek_ && mode_error_.empty()) rebuild_exp_kernel(0);
  if (mode_ == Mode::Race && !race_ && mode_error_.empty()) rebuild_race();
  if (mode_ == Mode::MergeReduce && !mr_ && mode_error_.empty()) rebuild_merge_reduce(0);
}

void TeachingView::rebuild_exp_kernel(int steps) {
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

void TeachingView::rebuild_race() {
  mode_error_.clear();
  race_.reset();
  try {
    race_ = run_discrepancy_race(race_n_max_, race_dim_, race_c_, race_seed_);
    race_pos_ = std::clamp(race_pos_, 1, race_n_max_);
  } catch (const InputError& e) {
    mode_error_ = e.what();
  }
}

void TeachingView::rebuild_merge_reduce(int steps) {
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

int TeachingView::race_prev(int n) const {
  int prev = 1;
  for (int x = 1; x < n; x = race_next(x)) prev = x;
  return prev;
}

int TeachingView::mode_pos() const {
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

bool TeachingView::mode_done() const {
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

bool TeachingView::mode_step() {
  if (mode_done()) return false;
  if (mode_ == Mode::ExpKernel) return ek_->step();
  if (mode_ == Mode::MergeReduce) return mr_->step();
  race_pos_ = race_next(race_pos_);
  return true;
}

void TeachingView::mode_goto(int pos) {
  if (mode_ == Mode::ExpKernel) rebuild_exp_kernel(pos);
  if (mode_ == Mode::MergeReduce) rebuild_merge_reduce(pos);
  if (mode_ == Mode::Race) race_pos_ = std::clamp(pos, 1, race_n_max_);
}

void TeachingView::mode_back() {
  if (mode_ == Mode::Race)
    race_pos_ = race_prev(race_pos_);
  else
    mode_goto(mode_pos() - 1);
}

void TeachingView::mode_run() {
  while (mode_step()) {
  }
}

// Playback and the mode's own settings; changing a setting rebuilds the mode at the same step.
void TeachingView::draw_mode_controls(AppState& s) {
  PlayBar bar;
  bar.playing = playing_;
  bar.can_back = mode_pos() > mode_first();
  bar.can_forward = !mode_done();
  bar.first_label = "reset";
  bar.forward_label = "step >";
  bar.last_label = "run";
  bar.hint = "Keys: space = play / pause, right arrow = step, left arrow = back.";
  bar.record = "teaching";
  bar.first = [this] { mode_goto(mode_first()), playing_ = false; };
  bar.back = [this] { mode_back(), playing_ = false; };
  bar.toggle = [this] { playing_ = !playing_, timer_ = 0; };
  bar.forward = [this] { mode_step(), playing_ = false; };
  bar.last = [this] { mode_run(), playing_ = false; };
  draw_play_bar(&s, bar);
  if (presenting_view()) return;  // a presentation keeps the playback only
  auto seed_input = [&](uint64_t* seed) {
    toolbar_next(labelled_width(px(90), "seed"));
    ImGui::SetNextItemWidth(fit_width(90, "seed"));
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
    ImGui::SetNextItemWidth(fit_width(110, "tokens"));
    changed |= ImGui::SliderInt("tokens", &ek_n_, 2, kMaxExpKernelN);
    toolbar_next(labelled_width(px(110), "c / max|u|^2"));
    ImGui::SetNextItemWidth(fit_width(110, "c / max|u|^2"));
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
    ImGui::SetNextItemWidth(fit_width(110, "n max"));
    if (ImGui::SliderInt("n max", &n_log, 6, 14, ("2^%d = " + std::to_string(1 << n_log)).c_str()))
      race_n_max_ = 1 << n_log, changed = true;
    toolbar_next(labelled_width(px(90), "dim"));
    ImGui::SetNextItemWidth(fit_width(90, "dim"));
    changed |= ImGui::SliderInt("dim", &race_dim_, 1, 64);
    toolbar_next(labelled_width(px(100), "c"));
    ImGui::SetNextItemWidth(fit_width(100, "c"));
    float c = static_cast<float>(race_c_);
    if (ImGui::SliderFloat("c", &c, 0.1f, 100.0f, "%.2f", ImGuiSliderFlags_Logarithmic))
      race_c_ = c, changed = true;
    if (changed) rebuild_race();
  } else if (mode_ == Mode::MergeReduce) {
    bool changed = seed_input(&mr_seed_);
    toolbar_next(labelled_width(px(110), "tokens"));
    ImGui::SetNextItemWidth(fit_width(110, "tokens"));
    changed |= ImGui::SliderInt("tokens", &mr_n_, 8, 512);
    toolbar_next(labelled_width(px(110), "budget m"));
    ImGui::SetNextItemWidth(fit_width(110, "budget m"));
    changed |= ImGui::SliderInt("budget m", &mr_budget_, 1, std::max(1, mr_n_ - 1));
    toolbar_next(labelled_width(px(110), "c_scale"));
    ImGui::SetNextItemWidth(fit_width(110, "c_scale"));
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

void TeachingView::handle_mode_keys() {
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

void TeachingView::advance_mode_playback() {
  if (!playing_) return;
  timer_ += ImGui::GetIO().DeltaTime;
  if (timer_ >= 1.0f / speed_) {
    timer_ = 0;
    if (!mode_step()) playing_ = false;
  }
  if (mode_done()) playing_ = false;
  request_next_frame();
}

void TeachingView::draw_mode_narration() {
  const std::string line = mode_narration();
  ImGui::PushStyleColor(ImGuiCol_Text, ImVec4(0.95f, 0.93f, 0.75f, 1));
  ImGui::TextWrapped("%s", line.c_str());
  ImGui::PopStyleColor();
}

std::string TeachingView::mode_narration() const {
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

nlohmann::json TeachingView::mode_result_json() const {
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
void TeachingView::draw_exp_kernel() {
  const ImVec2 avail = ImGui::GetContentRegionAvail();
  const float h = std::max(px(220), avail.y - ImGui::GetTextLineHeightWithSpacing() * 1.5f);
  const float plane_w = std::max(px(220), std::min(avail.x * 0.36f, h));
  // The two sums beside the plane while they keep their least width, else in a row under it.
  const float gap = ImGui::GetStyle().ItemSpacing.x;
  const bool one_row = (avail.x - plane_w) / 2 - gap >= min_plot_size().x;
  const float plot_w = one_row ? (avail.x - plane_w) / 2 - gap : (avail.x - gap) / 2;
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
  if (one_row) ImGui::SameLine();
  {
    Plot plot("##ek_den", ImVec2(plot_w, h), "denominator along q",
              Axis{"step j", 0, std::max(1.0, double(n))},
              Axis{"sum sigma_i exp(<k_i,q>/sqrt 2)", -dlim * 1.1, dlim * 1.1});
    plot.hline(0, kColGrid, 1.5f);
    plot.dashed_line(xs, dr, kColRandom, 1.5f);
    plot.line(xs, dw, kColWalk, 2.0f);
    plot.markers(std::vector<double>(xs.begin() + 1, xs.end()),
                 std::vector<double>(dw.begin() + 1, dw.end()), kColWalk, px(3));
    plot.legend({{"walk on phi(k)", kColWalk}, {"fair coins", kColRandom}}, Plot::Corner::TopLeft);
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
void TeachingView::draw_race() {
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
void TeachingView::draw_merge_reduce() {
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
        dl->AddRect(ImVec2(x - 1, y - 1), ImVec2(x + chip_w + 1, y + chip_h + 1), kColHover, px(3),
                    0, px(2));
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
  // Where the weight went: each token streams in with weight 1, and a merge keeps the smaller
  // signed class at twice its level's weight, so it gives up the difference of the two classes.
  // The held weight estimates the stream's (the discrepancy bound), it does not keep it.
  const auto& merges = mr_->merges();
  {
    long held_tokens = 0, held_weight = 0, given_up = 0;
    for (size_t l = 0; l < levels.size(); ++l) {
      held_tokens += static_cast<long>(levels[l].size());
      held_weight += static_cast<long>(levels[l].size()) << l;
    }
    for (const auto& m : merges)
      given_up += (static_cast<long>(m.input.size()) << m.level) -
                  (static_cast<long>(m.kept.size()) << (m.level + 1));
    // Wrapped at the left column's edge (the keys' plot is beside it), not the window's.
    ImGui::PushTextWrapPos(ImGui::GetCursorPos().x + left_w);
    ImGui::Text(
        "streamed %d tokens (weight %d); held %ld tokens of weight %ld. The %zu merges gave up "
        "%ld of weight: each keeps the smaller signed class at twice the weight, so the "
        "difference of the two classes leaves; the held weight estimates the stream's.",
        pushed, pushed, held_tokens, held_weight, merges.size(), given_up);
    ImGui::PopTextWrapPos();
  }
  // The last step's merges: every input token coloured by its sign, the kept ones outlined.
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

}  // namespace kvscope::app::teaching
