#include "app/plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <unordered_map>

namespace kvscope::app {

namespace {
// The legend bands plots keep outside their data area, by plot id (Plot::legend), kept for as
// long as the app runs. The UI thread's only.
std::unordered_map<ImGuiID, Plot::LegendBand>& legend_bands() {
  static std::unordered_map<ImGuiID, Plot::LegendBand> bands;
  return bands;
}
}  // namespace
namespace {

// Margins follow the font (UI scale): the left one is fitted to the widest y tick label.
constexpr float kRightMargin = 12.0f;  // x font / 15
// A legend's rows above the data leave the data at least this share of its height: the rows
// hide none of it, where a box inside covering data (the alternative) hides what is under it.
constexpr float kBandKeepsRows = 0.4f;

}  // namespace

std::string elide(const std::string& text, float width) {
  if (ImGui::CalcTextSize(text.c_str()).x <= width) return text;
  std::string t = text;
  t.append("...");
  while (t.size() > 3 && ImGui::CalcTextSize(t.c_str()).x > width) t.erase(t.size() - 4, 1);
  return t;
}

namespace {

std::string format_tick(double v) {
  char buf[32];
  double a = std::fabs(v);
  if (v == 0)
    std::snprintf(buf, sizeof buf, "0");
  else if (a >= 1e4 || a < 1e-3)
    std::snprintf(buf, sizeof buf, "%.0e", v);
  else if (a >= 100)
    std::snprintf(buf, sizeof buf, "%.0f", v);
  else
    std::snprintf(buf, sizeof buf, "%.3g", v);
  return buf;
}

// A power of two on a log2 axis (token counts, budgets): 16384 as "16k" (binary k and M, as token
// counts are written), below 1024 as format_tick.
std::string pow2_tick(double v) {
  char buf[32];
  if (v >= 1048576)
    std::snprintf(buf, sizeof buf, "%gM", v / 1048576);
  else if (v >= 1024)
    std::snprintf(buf, sizeof buf, "%gk", v / 1024);
  else
    return format_tick(v);
  return buf;
}

// "Nice" linear ticks (1, 2, 5 x 10^k steps), about `target` of them.
std::vector<double> linear_ticks(double lo, double hi, int target) {
  std::vector<double> t;
  if (!(hi > lo)) return t;
  double raw = (hi - lo) / std::max(1, target);
  double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * mag >= raw) {
      step = m * mag;
      break;
    }
  for (double v = std::ceil(lo / step) * step; v <= hi + step * 1e-9; v += step)
    t.push_back(std::fabs(v) < step * 1e-9 ? 0.0 : v);
  return t;
}

}  // namespace

// Where a log10 axis puts its labels: the powers of ten, and while fewer than three of them fit
// in [lo, hi] (a curve between 0.1 and 0.6 spans less than a decade), 2 and 5 times them, then
// every 1..9 times them; neighbours at least `min_gap` pixels apart (`px_per_decade` pixels per
// factor of ten). Values are increasing.
std::vector<double> log10_labels(double lo, double hi, double px_per_decade, double min_gap) {
  std::vector<double> out;
  if (!(lo > 0) || !(hi > lo)) return out;
  const int k0 = static_cast<int>(std::floor(std::log10(lo))) - 1;
  const int k1 = static_cast<int>(std::ceil(std::log10(hi))) + 1;
  const std::vector<std::vector<int>> mantissas{{1}, {1, 2, 5}, {1, 2, 3, 4, 5, 6, 7, 8, 9}};
  for (const std::vector<int>& ms : mantissas) {
    out.clear();
    double last = -INFINITY;
    for (int k = k0; k <= k1; ++k)
      for (int m : ms) {
        const double v = m * std::pow(10.0, k);
        if (v < lo * (1 - 1e-9) || v > hi * (1 + 1e-9)) continue;
        const double at = std::log10(v) * px_per_decade;
        if (at - last < min_gap) continue;
        out.push_back(v);
        last = at;
      }
    if (out.size() >= 3) break;
  }
  if (out.size() < 2) out = {lo, hi};  // a very short axis: its two ends
  return out;
}

ImVec2 min_plot_size() {
  const float f = ImGui::GetFontSize();
  return ImVec2(16 * f, 9 * f);
}

std::string ratio_label(double r) {
  if (r > 0) {
    double inv = 1.0 / r;
    double k = std::round(inv);
    if (std::fabs(inv - k) < 1e-6 && k >= 1) {
      char buf[32];
      if (k == 1) return "1";
      std::snprintf(buf, sizeof buf, "1/%.0f", k);
      return buf;
    }
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", r);
  return buf;
}

void finite_range(const std::vector<double>& v, double* lo, double* hi, double pad) {
  double a = INFINITY, b = -INFINITY;
  for (double x : v)
    if (std::isfinite(x)) {
      a = std::min(a, x);
      b = std::max(b, x);
    }
  if (!std::isfinite(a)) {
    *lo = 0;
    *hi = 1;
    return;
  }
  double span = b - a;
  if (span <= 0) span = a != 0 ? std::fabs(a) * 0.2 : 1.0;
  *lo = a - span * pad;
  *hi = b + span * pad;
}

double Plot::tx(double v, const Axis& a) const {
  switch (a.scale) {
    case Scale::Log2:
      return v > 0 ? std::log2(v) : -INFINITY;
    case Scale::Log10:
      return v > 0 ? std::log10(v) : -INFINITY;
    default:
      return v;
  }
}

float Plot::sx(double x) const {
  double a = tx(x_.min, x_), b = tx(x_.max, x_);
  double t = b != a ? (tx(x, x_) - a) / (b - a) : 0.5;
  return p0_.x + static_cast<float>(t) * (p1_.x - p0_.x);
}

float Plot::sy(double y) const {
  double a = tx(y_.min, y_), b = tx(y_.max, y_);
  double t = b != a ? (tx(y, y_) - a) / (b - a) : 0.5;
  return p1_.y - static_cast<float>(t) * (p1_.y - p0_.y);
}

double Plot::data_x(float px) const {
  double a = tx(x_.min, x_), b = tx(x_.max, x_);
  double v = a + (px - p0_.x) / std::max(1.0f, p1_.x - p0_.x) * (b - a);
  if (x_.scale == Scale::Log2) return std::exp2(v);
  if (x_.scale == Scale::Log10) return std::pow(10.0, v);
  return v;
}

double Plot::data_y(float py) const {
  double a = tx(y_.min, y_), b = tx(y_.max, y_);
  double v = a + (p1_.y - py) / std::max(1.0f, p1_.y - p0_.y) * (b - a);
  if (y_.scale == Scale::Log2) return std::exp2(v);
  if (y_.scale == Scale::Log10) return std::pow(10.0, v);
  return v;
}

ImVec2 Plot::mouse_data() const {
  ImVec2 m = ImGui::GetIO().MousePos;
  return ImVec2(static_cast<float>(data_x(m.x)), static_cast<float>(data_y(m.y)));
}

// Log axes need positive ranges.
void Plot::make_ranges_valid() {
  for (Axis* a : {&x_, &y_}) {
    if (a->scale != Scale::Linear) {
      if (!(a->min > 0)) a->min = a->max > 0 ? a->max / 1000 : 1e-3;
      if (!(a->max > a->min)) a->max = a->min * 10;
    } else if (!(a->max > a->min)) {
      a->max = a->min + 1;
    }
  }
}

// The y ticks and their labels for the inner rectangle's height; a log10 axis with room also
// gets unlabelled minor ticks in `minor`.
Plot::Ticks Plot::y_ticks(float font, float unit, std::vector<double>* minor) const {
  Ticks yt;
  if (y_.scale == Scale::Linear) {
    for (double v :
         linear_ticks(y_.min, y_.max, std::max(2, static_cast<int>((p1_.y - p0_.y) / (40 * unit)))))
      yt.emplace_back(v, format_tick(v));
  } else if (y_.scale == Scale::Log10) {
    const double per_decade = (p1_.y - p0_.y) / std::max(1e-9, tx(y_.max, y_) - tx(y_.min, y_));
    const std::vector<double> labels = log10_labels(y_.min, y_.max, per_decade, 1.3 * font);
    for (double v : labels) yt.emplace_back(v, y_.fraction_ticks ? ratio_label(v) : format_tick(v));
    // Unlabelled minor ticks at 2..9 x 10^k help reading values between the labels.
    if (per_decade > 4 * font)
      for (int k = static_cast<int>(std::floor(tx(y_.min, y_)));
           k <= static_cast<int>(std::ceil(tx(y_.max, y_))); ++k)
        for (int m = 2; m <= 9; ++m) {
          const double v = m * std::pow(10.0, k);
          if (v > y_.min && v < y_.max &&
              std::find(labels.begin(), labels.end(), v) == labels.end())
            minor->push_back(v);
        }
  } else {
    double base = 2.0;
    int a = static_cast<int>(std::ceil(tx(y_.min, y_) - 1e-9));
    int b = static_cast<int>(std::floor(tx(y_.max, y_) + 1e-9));
    if (b < a) {  // less than one decade: label the ends instead
      yt.emplace_back(y_.min, format_tick(y_.min));
      yt.emplace_back(y_.max, format_tick(y_.max));
    }
    // Every `stride`-th power so labels stay at least 1.3 lines apart.
    const double per_power = (p1_.y - p0_.y) / std::max(1e-9, tx(y_.max, y_) - tx(y_.min, y_));
    const int stride =
        std::max(1, static_cast<int>(std::ceil(1.3 * font / std::max(1e-9, per_power))));
    for (int k = a; k <= b; ++k) {
      double v = std::pow(base, k);
      if (((k % stride) + stride) % stride != 0) continue;
      yt.emplace_back(v, y_.fraction_ticks ? ratio_label(v) : format_tick(v));
    }
  }
  return yt;
}

// Grows the axis ranges around their centres so one data unit is as long on both axes, and
// ticks the grown y axis again.
void Plot::fit_equal_aspect(float unit, Ticks* yt) {
  // Data units per pixel: the larger of the two, applied to both around the centres.
  const double w = p1_.x - p0_.x, h = p1_.y - p0_.y;
  const double upp = std::max((x_.max - x_.min) / w, (y_.max - y_.min) / h);
  const double cx = (x_.min + x_.max) / 2, cy = (y_.min + y_.max) / 2;
  x_.min = cx - upp * w / 2, x_.max = cx + upp * w / 2;
  y_.min = cy - upp * h / 2, y_.max = cy + upp * h / 2;
  yt->clear();
  for (double v : linear_ticks(y_.min, y_.max, std::max(2, static_cast<int>(h / (40 * unit)))))
    yt->emplace_back(v, format_tick(v));
}

// The x ticks and their labels for the inner rectangle's width; a label left empty marks a grid
// line drawn without one.
Plot::Ticks Plot::x_ticks(float font, float unit) const {
  Ticks xt;
  if (x_.scale == Scale::Linear) {
    for (double v :
         linear_ticks(x_.min, x_.max, std::max(2, static_cast<int>((p1_.x - p0_.x) / (80 * unit)))))
      xt.emplace_back(v, format_tick(v));
  } else if (x_.scale == Scale::Log10) {
    const double per_decade = (p1_.x - p0_.x) / std::max(1e-9, tx(x_.max, x_) - tx(x_.min, x_));
    for (double v : log10_labels(x_.min, x_.max, per_decade, 4.5 * font))
      xt.emplace_back(v, x_.fraction_ticks ? ratio_label(v) : format_tick(v));
  } else {
    const int a = static_cast<int>(std::ceil(tx(x_.min, x_) - 1e-9));
    const int b = static_cast<int>(std::floor(tx(x_.max, x_) + 1e-9));
    for (int k = a; k <= b; ++k) {
      const double v = std::exp2(k);
      xt.emplace_back(v, x_.fraction_ticks ? ratio_label(v) : pow2_tick(v));
    }
    // Every power has its grid line; where the labels would run into each other only every
    // second (fourth, ...) one is written.
    float widest = 0;
    for (const auto& t : xt) widest = std::max(widest, ImGui::CalcTextSize(t.second.c_str()).x);
    const float spacing = b > a ? (sx(std::exp2(b)) - sx(std::exp2(a))) / (b - a) : 1e9f;
    int every = 1;
    while (every < b - a + 1 && spacing * every < widest + 4 * unit) every *= 2;
    for (size_t i = 0; i < xt.size(); ++i)
      if (static_cast<int>(xt.size() - 1 - i) % every != 0) xt[i].second.clear();
  }
  return xt;
}

// Grid lines across the data area with their tick labels below (x) and left of it (y).
void Plot::draw_grid(const Ticks& xt, const Ticks& yt) const {
  for (auto& [v, s] : xt) {
    float px = sx(v);
    dl_->AddLine(ImVec2(px, p0_.y), ImVec2(px, p1_.y), kColGrid);
    if (s.empty()) continue;
    ImVec2 ts = ImGui::CalcTextSize(s.c_str());
    dl_->AddText(ImVec2(px - ts.x / 2, p1_.y + 3), kColAxisText, s.c_str());
  }
  for (auto& [v, s] : yt) {
    float py = sy(v);
    dl_->AddLine(ImVec2(p0_.x, py), ImVec2(p1_.x, py), kColGrid);
    ImVec2 ts = ImGui::CalcTextSize(s.c_str());
    dl_->AddText(ImVec2(p0_.x - ts.x - 4, py - ts.y / 2), kColAxisText, s.c_str());
  }
}

// Labels: x centred below the ticks, y above the axis (ImGui cannot rotate text), and the title
// in the frame at `o` of `size`; two_lines puts the y label on a line below the title's.
void Plot::draw_labels(ImVec2 o, ImVec2 size, const std::string& title, bool two_lines,
                       float ylabel_w, float font, float unit) const {
  if (!x_.label.empty()) {
    ImVec2 ts = ImGui::CalcTextSize(x_.label.c_str());
    dl_->AddText(ImVec2((p0_.x + p1_.x - ts.x) / 2, p1_.y + font + 4), kColAxisText,
                 x_.label.c_str());
  }
  const float ylabel_y = two_lines ? o.y + 3 + font + 4 * unit : o.y + 3;
  dl_->PushClipRect(o, ImVec2(o.x + size.x, o.y + size.y), true);
  if (!y_.label.empty())
    dl_->AddText(ImVec2(o.x + 2, ylabel_y), kColAxisText, elide(y_.label, size.x - 4).c_str());
  if (!title.empty()) {
    // Centred over the data area when it fits, else after the y label (or on its own line);
    // never cut: shortened with "..." when the frame is narrower than the title.
    const float after_label =
        two_lines || y_.label.empty() ? o.x + 2 : o.x + 2 + ylabel_w + 16 * unit;
    const std::string shown = elide(title, o.x + size.x - 2 - after_label);
    const ImVec2 ts = ImGui::CalcTextSize(shown.c_str());
    const float x =
        std::min(std::max(after_label, (p0_.x + p1_.x - ts.x) / 2), o.x + size.x - ts.x - 2);
    dl_->AddText(ImVec2(std::max(o.x + 2, x), o.y + 3), IM_COL32(235, 235, 240, 255),
                 shown.c_str());
  }
  dl_->PopClipRect();
}

Plot::Plot(const char* id, ImVec2 size, const std::string& title, Axis x, Axis y, bool equal_aspect)
    : x_(std::move(x)), y_(std::move(y)) {
  make_ranges_valid();
  ImVec2 avail = ImGui::GetContentRegionAvail();
  if (size.x <= 0) size.x = avail.x + size.x;
  if (size.y <= 0) size.y = avail.y + size.y;
  // Never smaller than a readable plot at the current UI scale: a panel too small for it
  // scrolls instead of squeezing the plot to a sliver (2x on a projector).
  const ImVec2 least = min_plot_size();
  size.x = std::max(size.x, least.x);
  size.y = std::max(size.y, least.y);
  ImVec2 o = ImGui::GetCursorScreenPos();
  id_ = ImGui::GetID(id);
  dl_ = ImGui::GetWindowDrawList();
  const float font = ImGui::GetFontSize();
  const float unit = font / 15.0f;
  // Title and y label share the top line when both fit, else the title gets a line of its own.
  const float title_w = ImGui::CalcTextSize(title.c_str()).x;
  const float ylabel_w = ImGui::CalcTextSize(y_.label.c_str()).x;
  // Short plots keep one line (the title is shortened with "..." after the y label instead).
  const bool two_lines = !title.empty() && !y_.label.empty() &&
                         ylabel_w + 16 * unit + title_w > size.x - 4 && size.y > 11 * font;
  const float top = (two_lines ? 2 * font + 6 * unit : font) + 7 * unit;
  const float bottom = 2 * font + 6 * unit;
  p0_ = ImVec2(o.x, o.y + top);
  p1_ = ImVec2(o.x + size.x - kRightMargin * unit, o.y + size.y - bottom);
  // The legend's band, when an earlier frame found no place in the data area that covers
  // nothing (legend()). Rows take the top of the data area while it keeps kBandKeepsRows of its
  // height; else the plot grows by them (as it does to min_plot_size: a panel too small for it
  // scrolls). A column is kept while the data area keeps 60% of its width.
  if (const auto it = legend_bands().find(id_); it != legend_bands().end()) {
    const LegendBand& b = it->second;
    if (!b.right) {
      band_ = b;
      if (b.size > (1 - kBandKeepsRows) * (p1_.y - p0_.y)) {
        size.y += b.size;
        p1_.y += b.size;
        band_grew_ = true;
      }
      p0_.y += b.size;
    } else if (p1_.x - p0_.x > 2.5f * b.size) {
      band_ = b;
      p1_.x -= b.size;
    }
  }
  ImGui::InvisibleButton(id, size);
  log_figure(ImGui::GetItemRectMin(), ImGui::GetItemRectMax());
  hovered_ = ImGui::IsItemHovered();
  clicked_ = ImGui::IsItemClicked(ImGuiMouseButton_Left);
  // y ticks first: the left margin is the widest tick label.
  std::vector<double> y_minor;
  Ticks yt = y_ticks(font, unit, &y_minor);
  float tick_w = 0;
  for (const auto& t : yt) tick_w = std::max(tick_w, ImGui::CalcTextSize(t.second.c_str()).x);
  p0_.x = o.x + std::max(30 * unit, tick_w + 10 * unit);
  if (p1_.x < p0_.x + 10) p1_.x = p0_.x + 10;
  if (p1_.y < p0_.y + 10) p1_.y = p0_.y + 10;
  if (equal_aspect && x_.scale == Scale::Linear && y_.scale == Scale::Linear)
    fit_equal_aspect(unit, &yt);
  hovered_ = hovered_ && ImGui::IsMouseHoveringRect(p0_, p1_);

  dl_->AddRectFilled(p0_, p1_, kColPlotBg);
  for (double mv : y_minor)
    dl_->AddLine(ImVec2(p0_.x, sy(mv)), ImVec2(p0_.x + 4, sy(mv)), kColAxisText);

  draw_grid(x_ticks(font, unit), yt);
  dl_->AddRect(p0_, p1_, kColAxisText);
  draw_labels(o, size, title, two_lines, ylabel_w, font, unit);
}

void Plot::dashed_line(const std::vector<double>& x, const std::vector<double>& y, ImU32 col,
                       float thickness, float dash) const {
  dl_->PushClipRect(p0_, p1_, true);
  const double on = dash * ImGui::GetFontSize() / 15.0, period = 2 * on;
  double phase = 0;  // distance along the polyline, so dashes run on across vertices
  const size_t n = std::min(x.size(), y.size());
  for (size_t i = 1; i < n; ++i) {
    if (!std::isfinite(x[i - 1]) || !std::isfinite(y[i - 1]) || !std::isfinite(x[i]) ||
        !std::isfinite(y[i]))
      continue;
    const ImVec2 a = to_screen(x[i - 1], y[i - 1]), b = to_screen(x[i], y[i]);
    const double dx = b.x - a.x, dy = b.y - a.y, len = std::hypot(dx, dy);
    if (!(len > 0) || !std::isfinite(len)) continue;
    note_segment(a, b);
    // Only the part inside the plot is dashed (Liang-Barsky): a segment far outside it would
    // otherwise cost one line per dash over its whole length.
    double t0 = 0, t1 = 1;
    const double ps[4] = {-dx, dx, -dy, dy};
    const double qs[4] = {a.x - p0_.x, p1_.x - a.x, a.y - p0_.y, p1_.y - a.y};
    for (int k = 0; k < 4 && t0 <= t1; ++k) {
      if (ps[k] == 0) {
        if (qs[k] < 0) t1 = -1;  // parallel to this edge and outside it
        continue;
      }
      const double r = qs[k] / ps[k];
      if (ps[k] < 0)
        t0 = std::max(t0, r);
      else
        t1 = std::min(t1, r);
    }
    for (double t = t0 * len; t < t1 * len;) {
      const double in_period = std::fmod(phase + t, period);
      const double run = std::max(in_period < on ? on - in_period : period - in_period, 1e-3);
      const double te = std::min(t1 * len, t + run);
      if (in_period < on)
        dl_->AddLine(
            ImVec2(static_cast<float>(a.x + dx * t / len), static_cast<float>(a.y + dy * t / len)),
            ImVec2(static_cast<float>(a.x + dx * te / len),
                   static_cast<float>(a.y + dy * te / len)),
            col, thickness);
      t = te;
    }
    phase += len;
  }
  dl_->PopClipRect();
}

void Plot::line(const std::vector<double>& x, const std::vector<double>& y, ImU32 col,
                float thickness) const {
  dl_->PushClipRect(p0_, p1_, true);
  std::vector<ImVec2> pts;
  // Segment by segment: ImGui's polyline joins average the normals of neighbouring segments,
  // and on zig-zag data (partial sums, per-query errors) near-reversals collapse the join and
  // leave gaps. Separate segments have no joins to collapse.
  auto flush = [&] {
    for (size_t i = 1; i < pts.size(); ++i) {
      dl_->AddLine(pts[i - 1], pts[i], col, thickness);
      note_segment(pts[i - 1], pts[i]);
    }
    if (pts.size() == 1) drawn_.push_back(pts[0]);
    pts.clear();
  };
  size_t n = std::min(x.size(), y.size());
  for (size_t i = 0; i < n; ++i) {
    bool ok = std::isfinite(x[i]) && std::isfinite(y[i]) &&
              (y_.scale == Scale::Linear || y[i] > 0) && (x_.scale == Scale::Linear || x[i] > 0);
    if (!ok) {
      flush();
      continue;
    }
    pts.push_back(to_screen(x[i], y[i]));
  }
  flush();
  dl_->PopClipRect();
}

void Plot::markers(const std::vector<double>& x, const std::vector<double>& y, ImU32 col,
                   float radius) const {
  dl_->PushClipRect(p0_, p1_, true);
  size_t n = std::min(x.size(), y.size());
  for (size_t i = 0; i < n; ++i)
    if (std::isfinite(x[i]) && std::isfinite(y[i])) {
      const ImVec2 c = to_screen(x[i], y[i]);
      dl_->AddCircleFilled(c, radius, col, 12);
      drawn_.push_back(c);
    }
  dl_->PopClipRect();
}

void Plot::band(const std::vector<double>& x, const std::vector<double>& lo,
                const std::vector<double>& hi, ImU32 col) const {
  dl_->PushClipRect(p0_, p1_, true);
  size_t n = std::min({x.size(), lo.size(), hi.size()});
  auto safe = [&](double v) { return y_.scale == Scale::Linear ? v : std::max(v, y_.min); };
  for (size_t i = 0; i + 1 < n; ++i) {
    if (!std::isfinite(lo[i]) || !std::isfinite(hi[i]) || !std::isfinite(lo[i + 1]) ||
        !std::isfinite(hi[i + 1]))
      continue;
    // One convex quad per segment (the band need not be convex overall): two triangles would
    // draw their anti-aliased shared edge as a diagonal line across a translucent band.
    const ImVec2 quad[4] = {to_screen(x[i], safe(lo[i])), to_screen(x[i], safe(hi[i])),
                            to_screen(x[i + 1], safe(hi[i + 1])),
                            to_screen(x[i + 1], safe(lo[i + 1]))};
    dl_->AddConvexPolyFilled(quad, 4, col);
    note_segment(quad[0], quad[3]);
    note_segment(quad[1], quad[2]);
  }
  dl_->PopClipRect();
}

void Plot::bars(const std::vector<double>& x, const std::vector<double>& y, double w,
                ImU32 col) const {
  dl_->PushClipRect(p0_, p1_, true);
  double base = y_.scale == Scale::Linear ? std::max(y_.min, 0.0) : y_.min;
  size_t n = std::min(x.size(), y.size());
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(y[i])) continue;
    float xa = sx(x[i] - w / 2), xb = sx(x[i] + w / 2);
    if (xb - xa < 1) xb = xa + 1;
    dl_->AddRectFilled(ImVec2(xa, sy(y[i])), ImVec2(xb, sy(base)), col);
    note_segment(ImVec2((xa + xb) / 2, sy(y[i])), ImVec2((xa + xb) / 2, sy(base)));
  }
  dl_->PopClipRect();
}

void Plot::vline(double x, ImU32 col, float thickness) const {
  float px = sx(x);
  if (px >= p0_.x && px <= p1_.x)
    dl_->AddLine(ImVec2(px, p0_.y), ImVec2(px, p1_.y), col, thickness);
}

void Plot::hline(double y, ImU32 col, float thickness) const {
  float py = sy(y);
  if (py >= p0_.y && py <= p1_.y)
    dl_->AddLine(ImVec2(p0_.x, py), ImVec2(p1_.x, py), col, thickness);
}

int Plot::nearest_x(const std::vector<double>& x) const {
  if (!hovered_) return -1;
  float mx = ImGui::GetIO().MousePos.x;
  int best = -1;
  float bd = 1e30f;
  for (size_t i = 0; i < x.size(); ++i) {
    if (!std::isfinite(x[i])) continue;
    float d = std::fabs(sx(x[i]) - mx);
    if (d < bd) {
      bd = d;
      best = static_cast<int>(i);
    }
  }
  return best;
}

Plot::Corner Plot::emptiest_corner(const std::vector<ImVec2>& points) const {
  // Points in each quarter of the data area; ties keep the order TR, TL, BR, BL.
  int count[4] = {0, 0, 0, 0};
  const float mx = (p0_.x + p1_.x) / 2, my = (p0_.y + p1_.y) / 2;
  for (const ImVec2& p : points) {
    if (p.x < p0_.x || p.x > p1_.x || p.y < p0_.y || p.y > p1_.y) continue;
    const bool right = p.x >= mx, top = p.y < my;
    ++count[top ? (right ? 0 : 1) : (right ? 2 : 3)];
  }
  int best = 0;
  for (int k = 1; k < 4; ++k)
    if (count[k] < count[best]) best = k;
  const Corner order[4] = {Corner::TopRight, Corner::TopLeft, Corner::BottomRight,
                           Corner::BottomLeft};
  return order[best];
}

namespace {
std::vector<PlacedLegend> g_legends;  // since clear_legend_log(); the UI thread's only
std::vector<ImVec4> g_figures;        // the same for figures (log_figure)
bool g_log_legends = false;           // off until a test asks (clear_legend_log)
}  // namespace

void log_figure(ImVec2 min, ImVec2 max) {
  if (g_log_legends && g_figures.size() < 10000) g_figures.push_back({min.x, min.y, max.x, max.y});
}
const std::vector<ImVec4>& figure_log() {
  return g_figures;
}

namespace {
// One legend entry's width: its swatch, the gap and its label.
float entry_width(const Plot::LegendEntry& e, float u) {
  return 22 * u + ImGui::CalcTextSize(e.label.c_str()).x;
}
// The gap between two entries on one row of a band.
float entry_gap(float u) {
  return 14 * u;
}
}  // namespace

float Plot::legend_band_height(const std::vector<LegendEntry>& entries, float width) {
  const float line = ImGui::GetTextLineHeight() + 2;
  const float u = ImGui::GetFontSize() / 15.0f;
  int rows = entries.empty() ? 0 : 1;
  float x = 0;
  for (const LegendEntry& e : entries) {
    const float w = entry_width(e, u);  // the gap only between entries: none at a row's end
    if (x > 0 && x + w > width) ++rows, x = 0;
    x += w + entry_gap(u);
  }
  return line * static_cast<float>(rows) + 4 * u;
}

float Plot::legend_column_width(const std::vector<LegendEntry>& entries) {
  const float u = ImGui::GetFontSize() / 15.0f;
  float w = 0;
  for (const LegendEntry& e : entries) w = std::max(w, entry_width(e, u));
  return w + 10 * u;
}

// Rows above the data area while they take at most a quarter of its height; else a column right
// of it where it takes at most 40% of its width and its entries fit the data's height; else rows
// (inside while the data keep kBandKeepsRows of their height, else the plot grows by them:
// Plot::Plot). Long labels (the Theory view's fitted slopes) made five rows that took all but
// 60 px of a wide plot at 2.5x, where a column beside the data fitted.
void Plot::keep_band(const std::vector<LegendEntry>& entries) const {
  const float rows = legend_band_height(entries, p1_.x - p0_.x);
  const float column = legend_column_width(entries);
  const float column_h = (ImGui::GetTextLineHeight() + 2) * static_cast<float>(entries.size());
  const bool rows_thin = rows <= 0.25f * (p1_.y - p0_.y);
  if (!rows_thin && p1_.x - p0_.x > 2.5f * column && p1_.y - p0_.y >= column_h)
    legend_bands()[id_] = LegendBand{true, column};
  else
    legend_bands()[id_] = LegendBand{false, rows};
}

ImVec4 Plot::legend_in_band(const std::vector<LegendEntry>& entries) const {
  const float line = ImGui::GetTextLineHeight() + 2;
  const float u = ImGui::GetFontSize() / 15.0f;
  // Longer labels or a narrower plot than when it was kept: the next frame keeps what they need.
  const float need =
      band_.right ? legend_column_width(entries) : legend_band_height(entries, p1_.x - p0_.x);
  if (need > band_.size + 0.5f) legend_bands()[id_] = LegendBand{band_.right, need};
  ImVec4 box;
  if (band_.right) {
    box = ImVec4(p1_.x, p0_.y, p1_.x + band_.size, p0_.y + line * entries.size());
    for (size_t i = 0; i < entries.size(); ++i) {
      const float x = p1_.x + 6 * u, y = p0_.y + line * static_cast<float>(i);
      dl_->AddRectFilled(ImVec2(x, y + 3 * u), ImVec2(x + 12 * u, y + line - 4 * u),
                         entries[i].colour);
      dl_->AddText(ImVec2(x + 17 * u, y), IM_COL32(230, 230, 235, 255), entries[i].label.c_str());
    }
  } else {
    const float top = p0_.y - band_.size;
    box = ImVec4(p0_.x, top, p1_.x, p0_.y);
    float x = p0_.x, y = top + 2 * u;
    bool shortened = false;
    for (const LegendEntry& e : entries) {  // as legend_band_height lays them out
      const float w = entry_width(e, u);
      if (x > p0_.x && x + w > p1_.x) x = p0_.x, y += line;
      dl_->AddRectFilled(ImVec2(x + 2 * u, y + 3 * u), ImVec2(x + 14 * u, y + line - 4 * u),
                         e.colour);
      // A label wider than the whole row (a narrow plot at a projector's scale) is shortened
      // with "..."; the band's tooltip gives it whole.
      const std::string shown = elide(e.label, p1_.x - x - 19 * u);
      shortened = shortened || shown != e.label;
      dl_->AddText(ImVec2(x + 19 * u, y), IM_COL32(230, 230, 235, 255), shown.c_str());
      x += w + entry_gap(u);
    }
    if (shortened && ImGui::IsMouseHoveringRect(ImVec2(box.x, box.y), ImVec2(box.z, box.w))) {
      std::string all;
      for (const LegendEntry& e : entries) all += (all.empty() ? "" : "\n") + e.label;
      ImGui::SetTooltip("%s", all.c_str());
    }
  }
  if (g_log_legends && g_legends.size() < 10000) g_legends.push_back({box, 0});
  return box;
}

void clear_legend_log() {
  g_legends.clear();
  g_figures.clear();
  g_log_legends = true;
}
const std::vector<PlacedLegend>& legend_log() {
  return g_legends;
}

void Plot::note_segment(ImVec2 a, ImVec2 b) const {
  // A point every 4 px along the part inside the data area (clipped, so a far-off segment costs
  // no more than the plot's width).
  const float len = std::hypot(b.x - a.x, b.y - a.y);
  if (!std::isfinite(len)) return;
  const int steps = std::min(2000, static_cast<int>(len / 4.0f) + 1);
  for (int k = 0; k <= steps; ++k) {
    const float t = static_cast<float>(k) / static_cast<float>(steps);
    const ImVec2 p(a.x + (b.x - a.x) * t, a.y + (b.y - a.y) * t);
    if (p.x >= p0_.x && p.x <= p1_.x && p.y >= p0_.y && p.y <= p1_.y) drawn_.push_back(p);
  }
}

void Plot::note_drawn(const std::vector<ImVec2>& points) const {
  drawn_.insert(drawn_.end(), points.begin(), points.end());
}

namespace {
// How many of `points` lie in the screen rectangle [a, b] or within `pad` pixels of it.
int count_in(const std::vector<ImVec2>& points, ImVec2 a, ImVec2 b, float pad) {
  int n = 0;
  for (const ImVec2& p : points)
    n += p.x >= a.x - pad && p.x <= b.x + pad && p.y >= a.y - pad && p.y <= b.y + pad;
  return n;
}
}  // namespace

int Plot::drawn_in(ImVec2 a, ImVec2 b) const {
  // Points are the centres of what was drawn: a marker (radius up to 3 px at scale 1) or a thick
  // line whose centre lies just outside the rectangle still shows inside it.
  return count_in(drawn_, a, b, 3 * ImGui::GetFontSize() / 15.0f);
}

ImVec2 Plot::place_legend(ImVec2 q0, ImVec2 q1, ImVec2 box, Corner corner,
                          const std::vector<ImVec2>& points, float pad, int* covered) {
  const float w = box.x, h = box.y;
  auto box_at = [&](Corner c) {
    const bool right = c == Corner::TopRight || c == Corner::BottomRight;
    const bool top = c == Corner::TopRight || c == Corner::TopLeft;
    return ImVec2(right ? q1.x - w - 6 : q0.x + 6, top ? q0.y + 6 : q1.y - h - 6);
  };
  // The asked corner unless its box covers drawn data; then the other corners, then the middles
  // of the edges and the centre (a curve across the whole width often leaves a free band), the
  // first place covering nothing, else the one covering the least.
  ImVec2 a = box_at(corner);
  *covered = count_in(points, a, ImVec2(a.x + w, a.y + h), pad);
  std::vector<ImVec2> places;
  for (Corner c : {Corner::TopRight, Corner::TopLeft, Corner::BottomRight, Corner::BottomLeft})
    places.push_back(box_at(c));
  const float xs[3] = {q0.x + 6, (q0.x + q1.x - w) / 2, q1.x - w - 6};
  const float ys[3] = {q0.y + 6, (q0.y + q1.y - h) / 2, q1.y - h - 6};
  for (float y : ys)
    for (float x : xs) places.push_back(ImVec2(x, y));
  for (const ImVec2& at : places) {
    if (*covered == 0) break;
    const int n = count_in(points, at, ImVec2(at.x + w, at.y + h), pad);
    if (n < *covered) a = at, *covered = n;
  }
  return a;
}

ImVec4 Plot::legend(const std::vector<LegendEntry>& entries, Corner corner) const {
  if (entries.empty()) return ImVec4(0, 0, 0, 0);
  const float line = ImGui::GetTextLineHeight() + 2;
  const float u = ImGui::GetFontSize() / 15.0f;
  float w = 0;
  for (const auto& e : entries) w = std::max(w, ImGui::CalcTextSize(e.label.c_str()).x);
  w += 26 * u;
  float h = line * static_cast<float>(entries.size()) + 6;
  if (band_.size > 0) {
    // The band stays while the legend would find no free place in the data area without it.
    // Data that changed since it was kept (a sweep filling in, a walk played on) may leave one:
    // the legend goes back inside from the next frame on, so what a plot shows does not depend
    // on the order its data arrived in. The test is on the points mapped to the data area
    // without the band, with twice the margin, so that the two placements never alternate.
    ImVec2 q0 = p0_, q1 = p1_;
    std::vector<ImVec2> points = drawn_;
    if (band_.right) {
      q1.x = p1_.x + band_.size;
      const float k = (q1.x - q0.x) / std::max(1.0f, p1_.x - p0_.x);
      for (ImVec2& p : points) p.x = p0_.x + (p.x - p0_.x) * k;
    } else if (band_grew_) {  // the data area had its height: it moves up by the band
      q0.y -= band_.size, q1.y -= band_.size;
      for (ImVec2& p : points) p.y -= band_.size;
    } else {
      q0.y = p0_.y - band_.size;
      const float k = (q1.y - q0.y) / std::max(1.0f, p1_.y - p0_.y);
      for (ImVec2& p : points) p.y = p1_.y - (p1_.y - p.y) * k;
    }
    int covered = 1;
    if (w * h <= 0.5f * (q1.x - q0.x) * (q1.y - q0.y))
      place_legend(q0, q1, ImVec2(w, h), corner, points, 6 * u, &covered);
    const ImVec4 box = legend_in_band(entries);
    if (covered == 0) legend_bands().erase(id_);
    return box;
  }
  // A legend that would hide half the data (a small plot on a small window, a projector's
  // scale) takes a band outside it from the next frame on.
  if (w * h > 0.5f * (p1_.x - p0_.x) * (p1_.y - p0_.y)) {
    keep_band(entries);
    return ImVec4(0, 0, 0, 0);
  }
  int covered = 0;
  const ImVec2 a = place_legend(p0_, p1_, ImVec2(w, h), corner, drawn_, 3 * u, &covered);
  ImVec2 b(a.x + w, a.y + h);
  if (g_log_legends && g_legends.size() < 10000)
    g_legends.push_back({ImVec4(a.x, a.y, b.x, b.y), covered});
  // No free place: from the next frame on the plot keeps a band for it above the data.
  if (covered > 0) keep_band(entries);
  dl_->AddRectFilled(a, b, IM_COL32(16, 18, 22, 220));
  dl_->AddRect(a, b, kColGrid);
  for (size_t i = 0; i < entries.size(); ++i) {
    float y = a.y + 3 + line * static_cast<float>(i);
    dl_->AddRectFilled(ImVec2(a.x + 5 * u, y + 3 * u), ImVec2(a.x + 17 * u, y + line - 4 * u),
                       entries[i].colour);
    dl_->AddText(ImVec2(a.x + 22 * u, y), IM_COL32(230, 230, 235, 255), entries[i].label.c_str());
  }
  return ImVec4(a.x, a.y, b.x, b.y);
}

HeatmapHit heatmap(const char* id, ImVec2 size, int rows, int cols,
                   const std::function<ImU32(int, int)>& colour,
                   const std::function<std::string(int, int)>& cell_text) {
  HeatmapHit hit;
  ImVec2 avail = ImGui::GetContentRegionAvail();
  if (size.x <= 0) size.x = std::max(40.0f, avail.x + size.x);
  if (size.y <= 0) size.y = std::max(40.0f, avail.y + size.y);
  ImVec2 o = ImGui::GetCursorScreenPos();
  ImGui::InvisibleButton(id, size);
  log_figure(ImGui::GetItemRectMin(), ImGui::GetItemRectMax());
  bool hovered = ImGui::IsItemHovered();
  bool clicked = ImGui::IsItemClicked(ImGuiMouseButton_Left);
  if (rows <= 0 || cols <= 0) return hit;
  ImDrawList* dl = ImGui::GetWindowDrawList();
  const float cw = size.x / static_cast<float>(cols), ch = size.y / static_cast<float>(rows);
  const float gap = (cw > 12 && ch > 12) ? 2.0f : 0.0f;
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) {
      ImVec2 a(o.x + c * cw + gap / 2, o.y + r * ch + gap / 2);
      ImVec2 b(o.x + (c + 1) * cw - gap / 2, o.y + (r + 1) * ch - gap / 2);
      ImU32 col = colour(r, c);
      dl->AddRectFilled(a, b, col);
      if (cell_text && cw > 10 && ch > 0.55f * ImGui::GetFontSize()) {
        std::string t = cell_text(r, c);
        if (!t.empty()) {
          ImVec2 ts = ImGui::CalcTextSize(t.c_str());
          // Text that does not fit is drawn smaller (down to 55% of the font) rather than left
          // out: on a 32 x 8 grid the best cells are the ones people want to read.
          const float scale =
              std::min({1.0f, (cw - 4) / std::max(1.0f, ts.x), ch / std::max(1.0f, ts.y)});
          // Dark text on light cells, light text on dark cells.
          float lum = 0.299f * ((col >> IM_COL32_R_SHIFT) & 0xFF) +
                      0.587f * ((col >> IM_COL32_G_SHIFT) & 0xFF) +
                      0.114f * ((col >> IM_COL32_B_SHIFT) & 0xFF);
          ImU32 tc = lum > 140 ? IM_COL32(10, 10, 10, 255) : IM_COL32(240, 240, 240, 255);
          if (scale >= 0.55f) {
            const float fs = ImGui::GetFontSize() * scale;
            dl->AddText(ImGui::GetFont(), fs,
                        ImVec2((a.x + b.x - ts.x * scale) / 2, (a.y + b.y - ts.y * scale) / 2), tc,
                        t.c_str());
          }
        }
      }
    }
  if (hovered) {
    ImVec2 m = ImGui::GetIO().MousePos;
    int c = static_cast<int>((m.x - o.x) / cw), r = static_cast<int>((m.y - o.y) / ch);
    if (r >= 0 && r < rows && c >= 0 && c < cols) {
      hit.row = r;
      hit.col = c;
      hit.clicked = clicked;
      dl->AddRect(ImVec2(o.x + c * cw, o.y + r * ch),
                  ImVec2(o.x + (c + 1) * cw, o.y + (r + 1) * ch), kColHover, 0, 0, 2.0f);
    }
  }
  return hit;
}

void colour_bar(const char* id, ImVec2 size, Colormap map, double vmin, double vmax,
                const std::string& label) {
  ImVec2 avail = ImGui::GetContentRegionAvail();
  if (size.x <= 0) size.x = std::max(40.0f, avail.x + size.x);
  if (size.y <= 0) size.y = std::max(40.0f, avail.y + size.y);
  ImVec2 o = ImGui::GetCursorScreenPos();
  ImGui::Dummy(size);
  ImDrawList* dl = ImGui::GetWindowDrawList();
  const float lh = ImGui::GetTextLineHeight();
  const float bar_w = 14 * ImGui::GetFontSize() / 15.0f;
  // The title (wrapped at spaces to the width) sits half a line above the bar's top value label
  // (which is centred on the top).
  const float wrap = std::max(size.x, 1.0f);
  const float title_h = ImGui::CalcTextSize(label.c_str(), nullptr, false, wrap).y;
  ImVec2 a(o.x, o.y + std::max(lh, title_h) + lh / 2 + 6), b(o.x + bar_w, o.y + size.y - lh / 2);
  if (b.y < a.y + 10) b.y = a.y + 10;
  dl->PushClipRect(o, ImVec2(o.x + wrap, o.y + size.y), true);
  dl->AddText(ImGui::GetFont(), ImGui::GetFontSize(), o, kColAxisText, label.c_str(), nullptr,
              wrap);
  dl->PopClipRect();
  const int steps = 48;
  for (int i = 0; i < steps; ++i) {
    float y0 = b.y - (b.y - a.y) * static_cast<float>(i + 1) / steps;
    float y1 = b.y - (b.y - a.y) * static_cast<float>(i) / steps;
    dl->AddRectFilled(ImVec2(a.x, y0), ImVec2(b.x, y1 + 1),
                      colormap(map, (i + 0.5) / static_cast<double>(steps)));
  }
  dl->AddRect(a, b, kColAxisText);
  // Five labels where they fit at least 1.2 lines apart, else three, else the two ends: a short
  // bar (a 4-layer grid at 2x) had its labels written over each other.
  const float bar_h = b.y - a.y;
  const int intervals = bar_h >= 4 * 1.2f * lh ? 4 : bar_h >= 2 * 1.2f * lh ? 2 : 1;
  for (int k = 0; k <= intervals; ++k) {
    double v = vmin + (vmax - vmin) * k / intervals;
    float y = b.y - bar_h * static_cast<float>(k) / static_cast<float>(intervals);
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.3g", v);
    dl->AddLine(ImVec2(b.x, y), ImVec2(b.x + 4, y), kColAxisText);
    dl->AddText(ImVec2(b.x + 6, y - lh / 2), kColAxisText, buf);
  }
  (void)id;
}

float colour_bar_width(double vmin, double vmax, const std::string& label) {
  const float u = ImGui::GetFontSize() / 15.0f;
  float ticks = 0;
  for (int k = 0; k <= 4; ++k) {  // the labels colour_bar may write ("%.3g")
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.3g", vmin + (vmax - vmin) * k / 4);
    ticks = std::max(ticks, ImGui::CalcTextSize(buf).x);
  }
  float word = 0;
  for (size_t at = 0; at < label.size();) {
    const size_t end = std::min(label.find(' ', at), label.size());
    word = std::max(word, ImGui::CalcTextSize(label.c_str() + at, label.c_str() + end).x);
    at = end + 1;
  }
  return std::max(14 * u + 6 + ticks, word) + 4 * u;
}

void legend_swatch(ImU32 colour, const char* text) {
  ImVec2 p = ImGui::GetCursorScreenPos();
  float h = ImGui::GetTextLineHeight();
  ImGui::GetWindowDrawList()->AddRectFilled(ImVec2(p.x, p.y + 2), ImVec2(p.x + h - 2, p.y + h - 2),
                                            colour);
  ImGui::Dummy(ImVec2(h, h));
  ImGui::SameLine(0, 4);
  ImGui::TextUnformatted(text);
}

}  // namespace kvscope::app
