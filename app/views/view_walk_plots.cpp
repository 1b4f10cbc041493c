// The Walk view's plots of one block's walk: the path in 2-D, the probabilities, the partial sum
// and the discrepancy at the query, each marking the cut and the current step. The class is in
// app/views/view_walk_view.h; the rest of the view is in app/views/view_walk.cpp.

#include <limits>

#include "app/views/view_walk_view.h"

namespace kvscope::app::walk {

void WalkView::draw_path_plot(const char* id, const WalkBlockTrace& b, int cur, ImVec2 size,
                              const std::string& title, bool with_legend) {
  const int n = std::min<int>(cur + 1, static_cast<int>(b.path.size()));
  std::vector<double> px_, py, rpx, rpy;
  for (const auto& q : b.path) px_.push_back(q[0]), py.push_back(q[1]);
  for (const auto& q : b.random_path) rpx.push_back(q[0]), rpy.push_back(q[1]);
  const SymLog sc = choose_scale({&px_, &py, &rpx, &rpy}, symlog_);
  std::vector<double> all_x{0}, all_y{0};
  for (double v : sc.apply(px_)) all_x.push_back(v);
  for (double v : sc.apply(rpx)) all_x.push_back(v);
  for (double v : sc.apply(py)) all_y.push_back(v);
  for (double v : sc.apply(rpy)) all_y.push_back(v);
  double x0, x1, y0, y1;
  finite_range(all_x, &x0, &x1, 0.08);
  finite_range(all_y, &y0, &y1, 0.08);
  Plot plot(id, size, title.empty() ? "walk path: prefix sum, top-2 kernel PCA" : title,
            Axis{scale_label("PC 1", sc), x0, x1}, Axis{scale_label("PC 2", sc), y0, y1});
  std::vector<double> xs{0}, ys{0}, rx{0}, ry{0};
  for (int i = 0; i < std::min<int>(cur + 1, static_cast<int>(b.random_path.size())); ++i)
    rx.push_back(sc(rpx[i])), ry.push_back(sc(rpy[i]));
  for (int i = 0; i < n; ++i) xs.push_back(sc(px_[i])), ys.push_back(sc(py[i]));
  plot.line(xs, ys, kColWalk, 2.0f);
  ImDrawList* dl = plot.draw_list();
  dl->PushClipRect(plot.inner_min(), plot.inner_max(), true);
  // Each step's sign as a dot on the path, the current position as a ring.
  for (int i = 0; i < n; ++i)
    dl->AddCircleFilled(plot.to_screen(xs[i + 1], ys[i + 1]), px(2.5f),
                        b.sigma[i] > 0 ? kColPlus : kColMinus, 8);
  dl->PopClipRect();
  plot.dashed_line(rx, ry, kColRandom, 1.5f);
  dl->PushClipRect(plot.inner_min(), plot.inner_max(), true);
  dl->AddCircleFilled(plot.to_screen(0, 0), px(3.5f), kColExact, 10);
  if (n > 0) dl->AddCircle(plot.to_screen(xs[n], ys[n]), px(7), kColHover, 14, 2);
  dl->PopClipRect();
  std::vector<ImVec2> occupied;
  for (size_t i = 0; i < xs.size(); ++i) occupied.push_back(plot.to_screen(xs[i], ys[i]));
  for (size_t i = 0; i < rx.size(); ++i) occupied.push_back(plot.to_screen(rx[i], ry[i]));
  plot.note_drawn(occupied);  // the path is drawn on the draw list: the legend avoids it too
  if (with_legend)
    plot.legend({{"walk (dot: sign + / -)", kColWalk},
                 {"random signs (dashed)", kColRandom},
                 {"origin", kColExact}},
                plot.emptiest_corner(occupied));
}

int WalkView::draw_p_plot(const char* id, const WalkBlockTrace& b, int cur, ImVec2 size,
                          const std::string& title, bool with_legend) {
  std::vector<double> x = iota_steps(b.p.size());
  // p_i outside [0, 1] only means "sign forced"; values far outside are drawn at the edge.
  constexpr double kLo = -0.5, kHi = 1.5;
  int outside = 0;
  for (double v : b.p) outside += (v < kLo || v > kHi);
  Plot plot(id, size, title.empty() ? "p_i before clipping" : title,
            Axis{"step i", 0, std::max(1.0, double(b.p.size()) - 1)},
            Axis{outside ? "p_i (clamped to [-0.5, 1.5])" : "p_i", kLo - 0.05, kHi + 0.05});
  // The clipped zones, shaded: a dot there is a forced sign.
  ImDrawList* dl = plot.draw_list();
  dl->AddRectFilled(plot.to_screen(0, kHi + 0.05), ImVec2(plot.inner_max().x, plot.sy(1)),
                    IM_COL32(240, 200, 80, 28));
  dl->AddRectFilled(ImVec2(plot.inner_min().x, plot.sy(0)), plot.inner_max(),
                    IM_COL32(240, 200, 80, 28));
  plot.hline(0.5, kColGrid, 1.5f);
  plot.hline(0, with_alpha(kColAxisText, 0.5f));
  plot.hline(1, with_alpha(kColAxisText, 0.5f));
  std::vector<double> pxs, pys, mx, my;
  for (int i = 0; i <= cur && i < static_cast<int>(b.p.size()); ++i) {
    const double v = std::clamp(b.p[i], kLo, kHi);
    (b.sigma[i] > 0 ? pxs : mx).push_back(i);
    (b.sigma[i] > 0 ? pys : my).push_back(v);
  }
  plot.markers(pxs, pys, kColPlus, px(2.5f));
  plot.markers(mx, my, kColMinus, px(2.5f));
  mark_cut_and_step(plot, b, cur);
  if (with_legend)
    plot.legend({{"sigma = +1", kColPlus},
                 {"sigma = -1", kColMinus},
                 {"clipped: sign forced", IM_COL32(240, 200, 80, 90)},
                 {"halving cut", kColCut}});
  return plot.hovered() ? plot.nearest_x(x) : -1;
}

int WalkView::draw_partial_plot(const WalkBlockTrace& b, int cur, ImVec2 size) {
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
  plot.line(xs, ys, kColWalk, 1.5f);
  mark_cut_and_step(plot, b, cur);
  return plot.hovered() ? plot.nearest_x(x) : -1;
}

int WalkView::draw_discrepancy_plot(const char* id, const WalkTrace& t, const WalkBlockTrace& b,
                                    int cur, ImVec2 size, const std::string& name,
                                    bool with_legend) {
  std::vector<double> x = iota_steps(b.disc_query.size());
  std::vector<double> all;
  for (const auto* v : {&b.disc_query, &b.random_disc_query, &b.disc_kernel, &b.random_disc_kernel})
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
  Plot plot(id, size,
            name.empty() ? std::string("discrepancy vs random signs") : "discrepancy, " + name,
            Axis{"step i", 0, std::max(1.0, double(b.disc_query.size()) - 1)}, y);
  auto upto = [&](const std::vector<double>& v) {
    std::vector<double> out(v.begin(), v.begin() + std::min<size_t>(v.size(), cur + 1));
    if (log_axis)
      for (double& e : out)
        if (!(e > 0)) e = std::nan("");
    return out;
  };
  const std::vector<double> xs = upto(x);
  constexpr ImU32 kColQueryLine = kColWalk;
  constexpr ImU32 kColKernelLine = IM_COL32(230, 160, 60, 255);
  // The walk solid, random signs dashed on top in the same hue family, same axis.
  plot.line(xs, upto(b.disc_query), kColQueryLine, 2.0f);
  plot.line(xs, upto(b.disc_kernel), kColKernelLine, 2.0f);
  plot.dashed_line(xs, upto(b.random_disc_query), with_alpha(kColRandom, 0.95f), 1.5f);
  plot.dashed_line(xs, upto(b.random_disc_kernel), with_alpha(kColRandomKernel, 0.95f), 1.5f);
  mark_cut_and_step(plot, b, cur);
  const std::string q = t.trace_query >= 0 ? std::to_string(t.trace_query) : "last";
  std::vector<ImVec2> occupied;
  for (const auto* v : {&b.disc_query, &b.random_disc_query, &b.disc_kernel, &b.random_disc_kernel})
    for (size_t i = 0; i < v->size() && i < xs.size(); ++i)
      if (!log_axis || (*v)[i] > 0) occupied.push_back(plot.to_screen(xs[i], (*v)[i]));
  const Plot::Corner legend_at = plot.emptiest_corner(occupied);
  // The note sits in a bottom corner the legend does not ask for, and is noted as drawn so that
  // the legend, wherever it goes, does not cover it.
  // Of the corners the legend does not ask for, the one whose box covers the fewest curve points
  // (in a short plot a fixed bottom corner put it on the walk's curve); on a dark box, as a
  // legend, where every corner covers some.
  const char* note = "balance holds per direction, not in norm";
  const ImVec2 ts = ImGui::CalcTextSize(note);
  const bool show_note = ts.x < plot.inner_max().x - plot.inner_min().x - 12;
  const ImVec2 in0 = plot.inner_min(), in1 = plot.inner_max();
  ImVec2 note_at(in0.x + 6, in1.y - ts.y - 4);
  int note_covers = std::numeric_limits<int>::max();
  for (Plot::Corner c : {Plot::Corner::BottomLeft, Plot::Corner::BottomRight, Plot::Corner::TopLeft,
                         Plot::Corner::TopRight}) {
    if (c == legend_at) continue;
    const bool right = c == Plot::Corner::BottomRight || c == Plot::Corner::TopRight;
    const bool top = c == Plot::Corner::TopLeft || c == Plot::Corner::TopRight;
    const ImVec2 at(right ? in1.x - ts.x - 6 : in0.x + 6, top ? in0.y + 4 : in1.y - ts.y - 4);
    int n = 0;
    for (const ImVec2& p : occupied)
      n += p.x >= at.x - 3 && p.x <= at.x + ts.x + 3 && p.y >= at.y - 3 && p.y <= at.y + ts.y + 3;
    if (n < note_covers) note_covers = n, note_at = at;
  }
  if (show_note) {
    std::vector<ImVec2> note_box;
    for (float fx = 0; fx <= 1.0f; fx += 0.05f)
      for (float fy : {0.0f, 0.5f, 1.0f})
        note_box.emplace_back(note_at.x + fx * ts.x, note_at.y + fy * ts.y);
    plot.note_drawn(note_box);
  }
  if (with_legend)
    plot.legend({{"along query " + q + " (walk)", kColQueryLine},
                 {"kernel norm sqrt(s^T K s) (walk)", kColKernelLine},
                 {"random signs, along query (dashed)", kColRandom},
                 {"random signs, kernel norm (dashed)", kColRandomKernel}},
                legend_at);
  if (show_note) {
    if (note_covers > 0)
      plot.draw_list()->AddRectFilled(ImVec2(note_at.x - 3, note_at.y - 1),
                                      ImVec2(note_at.x + ts.x + 3, note_at.y + ts.y + 1),
                                      IM_COL32(16, 18, 22, 220));
    plot.draw_list()->AddText(note_at, kColAxisText, note);
  }
  return plot.hovered() ? plot.nearest_x(x) : -1;
}

void WalkView::mark_cut_and_step(const Plot& plot, const WalkBlockTrace& b, int cur) const {
  if (b.halving_cut >= 0) plot.vline(b.halving_cut, kColCut, 1.5f);
  plot.vline(cur, with_alpha(kColHover, 0.6f), 1.0f);
}

}  // namespace kvscope::app::walk
