// The Teaching view's class (app/views/view_teaching.cpp: the talk's first half, vector balancing;
// app/views/view_teaching_modes.cpp: its second half, the exp kernel, the race and merge and
// reduce), shared by the two files that define it. Only make_teaching_view() (app/views/view.h) is
// public.
#pragma once

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

#include "app/app_state.h"
#include "app/colormap.h"
#include "app/plot.h"
#include "app/point_renderer.h"
#include "app/result_status.h"
#include "app/ui_layout.h"
#include "app/views/view.h"
#include "engine/core/error.h"
#include "engine/io/json_fields.h"
#include "engine/teaching/teaching_modes.h"
#include "engine/teaching/teaching_walk.h"

namespace kvscope::app::teaching {

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

inline ImU32 level_colour(int l) {
  return kColLevel[std::min(l, 7)];
}

inline std::string fmt(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

inline void arrow(ImDrawList* dl, ImVec2 a, ImVec2 b, ImU32 col, float thickness) {
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
  const char* help() const override;

  void draw(AppState& s) override;

  nlohmann::json export_json(const AppState&) const override;

  nlohmann::json state_json() const;

  std::string export_csv(const AppState&) const override;

  nlohmann::json save_state() const override { return state_json(); }

  void load_state(const nlohmann::json& j) override;

 private:
  void load_talk_example();

  void rebuild(int steps);

  int signed_count() const { return walk_ ? static_cast<int>(walk_->steps().size()) : 0; }

  void replay_to(int steps);

  void draw_controls();

  void handle_keys();

  std::string narration() const;

  void draw_narration();

  void advance_playback();

  void content_bounds(double* x0, double* x1, double* y0, double* y1) const;

  void draw_plane(ImVec2 size);

  void handle_plane_mouse(const Plot& plot);

  void draw_prefix_plot(ImVec2 size);

  void draw_table();

  // ---- The talk's second half ------------------------------------------------------------

  void draw_mode_bar(AppState& s);

  void draw_second_half(AppState& s);

  void ensure_mode_objects();

  void rebuild_exp_kernel(int steps);
  void rebuild_race();
  void rebuild_merge_reduce(int steps);

  int ek_pos() const { return ek_ ? static_cast<int>(ek_->steps().size()) : 0; }
  // The race's n grows one at a time up to 16, then by about 10% a step.
  int race_next(int n) const { return std::min(race_n_max_, n < 16 ? n + 1 : (n * 11 + 9) / 10); }
  int race_prev(int n) const;

  int mode_pos() const;
  bool mode_done() const;
  int mode_first() const { return mode_ == Mode::Race ? 1 : 0; }
  bool mode_step();
  void mode_goto(int pos);
  void mode_back();
  void mode_run();

  void draw_mode_controls(AppState& s);

  void handle_mode_keys();

  void advance_mode_playback();

  void draw_mode_narration();

  std::string mode_narration() const;

  nlohmann::json mode_result_json() const;

  void draw_exp_kernel();

  void draw_race();

  void draw_merge_reduce();

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

}  // namespace kvscope::app::teaching
