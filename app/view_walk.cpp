// Walk view: the self-balancing walk of BalanceKV (method A's trace, engine/walk_trace.h) for one
// block of one halving round, step by step: the 2-D walk path (prefix signed sum on the block's
// top two kernel-PCA directions) against random signs, p_i with the drawn signs, the partial sums
// sum_{j<i} K_ij sigma_j, and the discrepancy along the trace query and in kernel norm, walk vs
// random signs. Play / pause / step / scrub; the token being walked is shown in the strip below
// and becomes the app's selected token, so the Tokens view follows.
#include <imgui.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "app/app_state.h"
#include "app/colormap.h"
#include "app/plot.h"
#include "app/point_renderer.h"
#include "app/token_marks.h"
#include "app/view.h"
#include "engine/walk_trace.h"

namespace kvscope::app {
namespace {

constexpr ImU32 kColPlus = IM_COL32(76, 190, 110, 255);
constexpr ImU32 kColMinus = IM_COL32(230, 97, 92, 255);
constexpr ImU32 kColRandom = IM_COL32(150, 150, 160, 255);
constexpr ImU32 kColCut = IM_COL32(240, 200, 80, 255);

bool is_walk_method(const std::string& name) {
  return name == "balancekv" || name == "balancekv-stream";
}

std::string short_text(const std::string& t, size_t max_chars = 12) {
  return t.size() <= max_chars ? t : t.substr(0, max_chars - 1) + "~";
}

template <class T>
T at(const std::vector<T>& v, size_t i) {
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
SymLog choose_scale(const std::vector<const std::vector<double>*>& series, bool allow) {
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

std::string scale_label(const std::string& what, const SymLog& s) {
  if (!s.on) return what;
  char buf[160];
  std::snprintf(buf, sizeof buf, "%s (symlog, t=%.2g)", what.c_str(), s.t);
  return buf;
}

std::vector<double> iota_steps(size_t n) {
  std::vector<double> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = static_cast<double>(i);
  return x;
}

class WalkView final : public View {
 public:
  const char* name() const override { return "walk"; }
  const char* title() const override { return "Walk"; }

  bool ready(const AppState& s) const override {
    if (!s.capture || !is_walk_method(s.method_name(0))) return true;
    return s.run(0) || !s.run_error(0).empty();
  }

  void draw(AppState& s) override {
    if (!s.info()) {
      ImGui::TextDisabled("No capture open.");
      return;
    }
    if (!is_walk_method(s.method_name(0))) {
      ImGui::TextWrapped(
          "Walk traces come from the self-balancing walk of balancekv (and balancekv-stream). "
          "Method A is %s.",
          s.method_name(0).c_str());
      if (ImGui::Button("Use balancekv as method A")) {
        s.settings.method[0].name = "balancekv";
      }
      return;
    }
    if (!s.run_error(0).empty()) {
      ImGui::TextColored(ImVec4(1, 0.5f, 0.4f, 1), "%s: %s", s.method_name(0).c_str(),
                         s.run_error(0).c_str());
      return;
    }
    if (!s.run(0)) {
      ImGui::TextDisabled("Running %s on layer %d, kv head %d ...", s.method_name(0).c_str(),
                          s.settings.focus.layer, s.settings.focus.kv_head);
      return;
    }
    const auto trace = s.run(0)->selection.trace;
    if (!trace || trace->blocks.empty()) {
      ImGui::TextDisabled("%s returned no walk trace for this head%s%s", s.method_name(0).c_str(),
                          trace && !trace->note.empty() ? ": " : ".",
                          trace ? trace->note.c_str() : "");
      return;
    }
    if (s.result(kFocusA).key != last_run_key_) {
      // A new run (settings, head or seed changed): keep round/block when they still exist.
      last_run_key_ = s.result(kFocusA).key;
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
    const int len = static_cast<int>(b->sigma.size());
    if (step_ >= len) step_ = len - 1;
    advance_playback(len);
    const int cur = step_ < 0 ? len - 1 : step_;
    if (playing_ || step_ >= 0) s.selected_token = b->tokens[cur];

    const float strip_h = ImGui::GetTextLineHeightWithSpacing() * 2.4f;
    const ImVec2 avail = ImGui::GetContentRegionAvail();
    const float plot_w = std::max(200.0f, (avail.x - 8) / 2);
    const float plot_h = std::max(150.0f, (avail.y - strip_h - 8) / 2);
    int hovered = -1;
    draw_path_plot(*b, cur, ImVec2(plot_w, plot_h));
    ImGui::SameLine();
    hovered = std::max(hovered, draw_p_plot(*b, cur, ImVec2(plot_w, plot_h)));
    hovered = std::max(hovered, draw_partial_plot(*b, cur, ImVec2(plot_w, plot_h)));
    ImGui::SameLine();
    hovered = std::max(hovered, draw_discrepancy_plot(*trace, *b, cur, ImVec2(plot_w, plot_h)));
    if (hovered >= 0 && hovered < len) {
      s.hovered_token = b->tokens[hovered];
      ImGui::BeginTooltip();
      ImGui::Text("step %d: token %d \"%s\"", hovered, b->tokens[hovered],
                  s.token_text(b->tokens[hovered]).c_str());
      ImGui::Text("p = %.4f, sigma = %+d, partial sum = %.4g", b->p[hovered], b->sigma[hovered],
                  b->partial[hovered]);
      if (hovered < static_cast<int>(b->kept.size()))
        ImGui::Text("%s this round", b->kept[hovered] ? "kept" : "dropped");
      ImGui::TextDisabled("click: go to this step");
      ImGui::EndTooltip();
      if (ImGui::IsMouseClicked(ImGuiMouseButton_Left)) {
        step_ = hovered;
        playing_ = false;
      }
    }
    draw_strip(s, *b, cur);
  }

  nlohmann::json export_json(const AppState& s) const override {
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
    j["trace_query"] = s.run(0)->selection.trace->trace_query;
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

  std::string export_csv(const AppState& s) const override {
    const WalkBlockTrace* b = exported_block(s);
    if (!b) return {};
    std::ostringstream out;
    out << "step,token,p,sigma,partial,disc_query,disc_kernel,random_disc_query,"
           "random_disc_kernel,path_x,path_y,random_path_x,random_path_y,kept\n";
    for (size_t i = 0; i < b->sigma.size(); ++i) {
      const auto path = i < b->path.size() ? b->path[i] : std::array<double, 2>{0, 0};
      const auto rpath =
          i < b->random_path.size() ? b->random_path[i] : std::array<double, 2>{0, 0};
      out << i << ',' << at(b->tokens, i) << ',' << at(b->p, i) << ',' << at(b->sigma, i) << ','
          << at(b->partial, i) << ',' << at(b->disc_query, i) << ',' << at(b->disc_kernel, i) << ','
          << at(b->random_disc_query, i) << ',' << at(b->random_disc_kernel, i) << ',' << path[0]
          << ',' << path[1] << ',' << rpath[0] << ',' << rpath[1] << ',' << at(b->kept, i) << '\n';
    }
    return out.str();
  }

  nlohmann::json save_state() const override {
    return {{"round", round_}, {"block", block_}, {"speed", speed_}, {"log_scales", symlog_}};
  }
  void load_state(const nlohmann::json& j) override {
    if (!j.is_object()) return;
    round_ = std::max(0, j.value("round", 0));
    block_ = std::max(0, j.value("block", 0));
    speed_ = std::clamp(j.value("speed", speed_), 1.0f, 200.0f);
    symlog_ = j.value("log_scales", symlog_);
  }

 private:
  std::vector<int> blocks_of_round(const WalkTrace& t) const {
    std::vector<int> out;
    for (size_t i = 0; i < t.blocks.size(); ++i)
      if (t.blocks[i].round == round_) out.push_back(static_cast<int>(i));
    return out;
  }
  void clamp_block(const WalkTrace& t) {
    const int count = static_cast<int>(blocks_of_round(t).size());
    block_ = std::clamp(block_, 0, std::max(0, count - 1));
  }
  const WalkBlockTrace* current_block(const WalkTrace& t) const {
    const auto idx = blocks_of_round(t);
    if (idx.empty() || block_ < 0 || block_ >= static_cast<int>(idx.size())) return nullptr;
    return &t.blocks[static_cast<size_t>(idx[block_])];
  }
  const WalkBlockTrace* exported_block(const AppState& s) const {
    if (!s.run(0) || !s.run(0)->selection.trace) return nullptr;
    return current_block(*s.run(0)->selection.trace);
  }

  void draw_controls(AppState& s, const WalkTrace& t) {
    ImGui::SetNextItemWidth(120);
    if (ImGui::SliderInt("round", &round_, 0, std::max(0, t.rounds - 1))) {
      clamp_block(t);
      step_ = -1;
    }
    ImGui::SameLine();
    const int blocks = static_cast<int>(blocks_of_round(t).size());
    ImGui::SetNextItemWidth(160);
    if (ImGui::SliderInt("block", &block_, 0, std::max(0, blocks - 1))) step_ = -1;
    const WalkBlockTrace* b = current_block(t);
    const int len = b ? static_cast<int>(b->sigma.size()) : 0;
    ImGui::SameLine(0, 18);
    if (ImGui::Button("|<")) step_ = 0, playing_ = false;
    ImGui::SameLine();
    if (ImGui::Button("<"))
      step_ = std::max(0, (step_ < 0 ? len - 1 : step_) - 1), playing_ = false;
    ImGui::SameLine();
    if (ImGui::Button(playing_ ? "pause" : "play", ImVec2(52, 0))) {
      playing_ = !playing_;
      if (playing_ && (step_ < 0 || step_ >= len - 1)) step_ = 0;
      carry_ = 0;
    }
    ImGui::SameLine();
    if (ImGui::Button(">"))
      step_ = std::min(len - 1, (step_ < 0 ? len - 1 : step_) + 1), playing_ = false;
    ImGui::SameLine();
    if (ImGui::Button(">|")) step_ = len - 1, playing_ = false;
    ImGui::SameLine();
    int scrub = step_ < 0 ? len - 1 : step_;
    ImGui::SetNextItemWidth(std::max(120.0f, ImGui::GetContentRegionAvail().x - 300));
    if (ImGui::SliderInt("step", &scrub, 0, std::max(0, len - 1))) step_ = scrub, playing_ = false;
    ImGui::SameLine();
    ImGui::SetNextItemWidth(90);
    ImGui::SliderFloat("steps/s", &speed_, 1.0f, 120.0f, "%.0f");
    ImGui::SameLine();
    ImGui::Checkbox("log scales", &symlog_);
    if (ImGui::IsItemHovered())
      ImGui::SetTooltip(
          "Kernel entries exp(<k_i,k_j>/sqrt d) of real keys span many decades. When a series\n"
          "spans more than three, draw it on a symmetric log (sums, path) or log (norms) axis.");

    std::string info = "layer " + std::to_string(s.settings.focus.layer) + ", kv head " +
                       std::to_string(s.settings.focus.kv_head) + ", " + s.method_name(0) + ": " +
                       std::to_string(t.rounds) + " round(s), " + std::to_string(blocks) +
                       " block(s) in round " + std::to_string(round_) + "; " + std::to_string(len) +
                       " tokens walked in this block";
    if (t.trace_query >= 0) info += "; discrepancy along query " + std::to_string(t.trace_query);
    ImGui::TextUnformatted(info.c_str());
    if (!t.note.empty()) {
      ImGui::SameLine();
      ImGui::TextDisabled("(%s)", t.note.c_str());
    }
  }

  void advance_playback(int len) {
    if (!playing_) return;
    carry_ += ImGui::GetIO().DeltaTime * speed_;
    const int adv = static_cast<int>(carry_);
    carry_ -= adv;
    step_ = std::min(len - 1, std::max(0, step_) + adv);
    if (step_ >= len - 1) playing_ = false;
    request_next_frame();
  }

  // The walk's prefix sum on the block's top two kernel-PCA directions, against random signs.
  void draw_path_plot(const WalkBlockTrace& b, int cur, ImVec2 size) {
    const int n = std::min<int>(cur + 1, static_cast<int>(b.path.size()));
    std::vector<double> px, py, rpx, rpy;
    for (const auto& q : b.path) px.push_back(q[0]), py.push_back(q[1]);
    for (const auto& q : b.random_path) rpx.push_back(q[0]), rpy.push_back(q[1]);
    const SymLog sc = choose_scale({&px, &py, &rpx, &rpy}, symlog_);
    std::vector<double> all_x{0}, all_y{0};
    for (double v : sc.apply(px)) all_x.push_back(v);
    for (double v : sc.apply(rpx)) all_x.push_back(v);
    for (double v : sc.apply(py)) all_y.push_back(v);
    for (double v : sc.apply(rpy)) all_y.push_back(v);
    double x0, x1, y0, y1;
    finite_range(all_x, &x0, &x1, 0.08);
    finite_range(all_y, &y0, &y1, 0.08);
    Plot plot("##walk_path", size, "walk path: prefix sum, top-2 kernel PCA",
              Axis{scale_label("PC 1", sc), x0, x1}, Axis{scale_label("PC 2", sc), y0, y1});
    std::vector<double> xs{0}, ys{0}, rx{0}, ry{0};
    for (int i = 0; i < std::min<int>(cur + 1, static_cast<int>(b.random_path.size())); ++i)
      rx.push_back(sc(rpx[i])), ry.push_back(sc(rpy[i]));
    plot.line(rx, ry, with_alpha(kColRandom, 0.7f), 1.5f);
    for (int i = 0; i < n; ++i) xs.push_back(sc(px[i])), ys.push_back(sc(py[i]));
    plot.line(xs, ys, IM_COL32(120, 200, 255, 255), 2.0f);
    ImDrawList* dl = plot.draw_list();
    dl->PushClipRect(plot.inner_min(), plot.inner_max(), true);
    // Each step's sign as a dot on the path, the current position as a ring.
    for (int i = 0; i < n; ++i)
      dl->AddCircleFilled(plot.to_screen(xs[i + 1], ys[i + 1]), 2.5f,
                          b.sigma[i] > 0 ? kColPlus : kColMinus, 8);
    dl->AddCircleFilled(plot.to_screen(0, 0), 3.5f, kColExact, 10);
    if (n > 0) dl->AddCircle(plot.to_screen(xs[n], ys[n]), 7, kColHover, 14, 2);
    dl->PopClipRect();
    plot.legend({{"walk (dot: sign + / -)", IM_COL32(120, 200, 255, 255)},
                 {"random signs", kColRandom},
                 {"origin", kColExact}},
                Plot::Corner::TopLeft);
  }

  int draw_p_plot(const WalkBlockTrace& b, int cur, ImVec2 size) {
    std::vector<double> x = iota_steps(b.p.size());
    // p_i outside [0, 1] only means "sign forced"; values far outside are drawn at the edge.
    constexpr double kLo = -0.5, kHi = 1.5;
    int outside = 0;
    for (double v : b.p) outside += (v < kLo || v > kHi);
    Plot plot("##walk_p", size, "p_i before clipping",
              Axis{"step i", 0, std::max(1.0, double(b.p.size()) - 1)},
              Axis{outside ? "p_i (clamped to [-0.5, 1.5])" : "p_i", kLo - 0.05, kHi + 0.05});
    plot.hline(0.5, kColGrid, 1.5f);
    plot.hline(0, with_alpha(kColAxisText, 0.5f));
    plot.hline(1, with_alpha(kColAxisText, 0.5f));
    std::vector<double> px, py, mx, my;
    for (int i = 0; i <= cur && i < static_cast<int>(b.p.size()); ++i) {
      const double v = std::clamp(b.p[i], kLo, kHi);
      (b.sigma[i] > 0 ? px : mx).push_back(i);
      (b.sigma[i] > 0 ? py : my).push_back(v);
    }
    plot.markers(px, py, kColPlus, 2.5f);
    plot.markers(mx, my, kColMinus, 2.5f);
    mark_cut_and_step(plot, b, cur);
    plot.legend({{"sigma = +1", kColPlus}, {"sigma = -1", kColMinus}, {"halving cut", kColCut}});
    return plot.hovered() ? plot.nearest_x(x) : -1;
  }

  int draw_partial_plot(const WalkBlockTrace& b, int cur, ImVec2 size) {
    std::vector<double> x = iota_steps(b.partial.size());
    const SymLog sc = choose_scale({&b.partial}, symlog_);
    const std::vector<double> shown = sc.apply(b.partial);
    double lo, hi;
    finite_range(shown, &lo, &hi);
    Plot plot("##walk_partial", size, "sum_{j<i} K_ij sigma_j",
              Axis{"step i", 0, std::max(1.0, double(b.partial.size()) - 1)},
              Axis{scale_label("partial sum", sc), lo, hi});
    plot.hline(0, kColGrid, 1.5f);
    std::vector<double> xs(x.begin(), x.begin() + std::min<size_t>(x.size(), cur + 1));
    std::vector<double> ys(shown.begin(), shown.begin() + std::min<size_t>(shown.size(), cur + 1));
    plot.line(xs, ys, IM_COL32(120, 200, 255, 255), 1.5f);
    mark_cut_and_step(plot, b, cur);
    return plot.hovered() ? plot.nearest_x(x) : -1;
  }

  int draw_discrepancy_plot(const WalkTrace& t, const WalkBlockTrace& b, int cur, ImVec2 size) {
    std::vector<double> x = iota_steps(b.disc_query.size());
    std::vector<double> all;
    for (const auto* v :
         {&b.disc_query, &b.random_disc_query, &b.disc_kernel, &b.random_disc_kernel})
      all.insert(all.end(), v->begin(), v->end());
    // Norms over several decades: log axis, zeros (the empty prefix) left out.
    double lo = 0, hi = 0;
    for (double v : all)
      if (std::isfinite(v) && v > 0) lo = lo > 0 ? std::min(lo, v) : v, hi = std::max(hi, v);
    const bool log_axis = symlog_ && lo > 0 && hi > 100 * lo;
    if (!log_axis) finite_range(all, &lo, &hi);
    Axis y{log_axis ? "prefix norm (log)" : "prefix norm", log_axis ? lo / 1.5 : std::min(0.0, lo),
           log_axis ? hi * 1.5 : hi};
    if (log_axis) y.scale = Scale::Log10;
    Plot plot("##walk_disc", size, "discrepancy vs random signs",
              Axis{"step i", 0, std::max(1.0, double(b.disc_query.size()) - 1)}, y);
    auto upto = [&](const std::vector<double>& v) {
      std::vector<double> out(v.begin(), v.begin() + std::min<size_t>(v.size(), cur + 1));
      if (log_axis)
        for (double& e : out)
          if (!(e > 0)) e = std::nan("");
      return out;
    };
    const std::vector<double> xs = upto(x);
    constexpr ImU32 kColQueryLine = IM_COL32(120, 200, 255, 255);
    constexpr ImU32 kColKernelLine = IM_COL32(230, 160, 60, 255);
    plot.line(xs, upto(b.random_disc_query), with_alpha(kColRandom, 0.9f), 1.5f);
    plot.line(xs, upto(b.random_disc_kernel), with_alpha(kColRandom, 0.5f), 1.5f);
    plot.line(xs, upto(b.disc_query), kColQueryLine, 2.0f);
    plot.line(xs, upto(b.disc_kernel), kColKernelLine, 2.0f);
    mark_cut_and_step(plot, b, cur);
    const std::string q = t.trace_query >= 0 ? std::to_string(t.trace_query) : "last";
    plot.legend({{"along query " + q + " (walk)", kColQueryLine},
                 {"kernel norm sqrt(s^T K s) (walk)", kColKernelLine},
                 {"random signs: along query / kernel norm", kColRandom}},
                Plot::Corner::TopLeft);
    ImDrawList* dl = plot.draw_list();
    const char* note = "balance holds per direction, not in norm: the kernel norm still grows";
    const ImVec2 ts = ImGui::CalcTextSize(note);
    dl->AddText(ImVec2(plot.inner_max().x - ts.x - 6, plot.inner_max().y - ts.y - 4), kColAxisText,
                note);
    return plot.hovered() ? plot.nearest_x(x) : -1;
  }

  void mark_cut_and_step(const Plot& plot, const WalkBlockTrace& b, int cur) const {
    if (b.halving_cut >= 0) plot.vline(b.halving_cut, kColCut, 1.5f);
    plot.vline(cur, with_alpha(kColHover, 0.6f), 1.0f);
  }

  // The block's tokens around the current step, coloured by the sign drawn so far.
  void draw_strip(AppState& s, const WalkBlockTrace& b, int cur) {
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
    ImGui::Text(
        "step %d/%d: token %d \"%s\"  p = %.3f  sigma = %+d%s", cur, len - 1, tok,
        s.token_text(tok).c_str(), b.p[cur], b.sigma[cur],
        cur < static_cast<int>(b.kept.size()) ? (b.kept[cur] ? "  (kept)" : "  (dropped)") : "");
  }

  int round_ = 0, block_ = 0;
  int step_ = -1;  // -1: the whole walk
  bool playing_ = false;
  float speed_ = 20.0f, carry_ = 0;
  bool symlog_ = true;
  std::string last_run_key_ = "(none)";  // key of the run last shown
};

}  // namespace

std::unique_ptr<View> make_walk_view() {
  return std::make_unique<WalkView>();
}

}  // namespace kvscope::app
