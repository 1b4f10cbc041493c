#include "app/token_marks.h"

#include <algorithm>
#include <cmath>

namespace kvscope::app {

TokenMarks token_marks(const HeadRun& run) {
  const EvalWindow& w = run.window;
  TokenMarks m;
  const size_t n = static_cast<size_t>(std::max(0, w.n));
  m.kind.assign(n, TokenKind::Dropped);
  m.weight.assign(n, 0.0);
  m.den_weight.assign(n, 0.0);
  m.score.assign(n, NAN);
  for (int i = 0; i < std::min(w.sink, w.n); ++i) {
    m.kind[static_cast<size_t>(i)] = TokenKind::Sink;
    m.weight[static_cast<size_t>(i)] = m.den_weight[static_cast<size_t>(i)] = 1;
  }
  for (int i = std::max(0, w.n - w.eval); i < w.n; ++i) {
    m.kind[static_cast<size_t>(i)] = TokenKind::Window;
    m.weight[static_cast<size_t>(i)] = m.den_weight[static_cast<size_t>(i)] = 1;
  }
  const Selection& sel = run.selection;
  m.separate = sel.separate;
  auto mark = [&](const std::vector<int>& idx, const std::vector<double>& wts, bool den) {
    for (size_t t = 0; t < idx.size(); ++t) {
      int i = idx[t];
      if (i < w.mid_begin || i >= w.mid_end) continue;
      double wt = t < wts.size() ? wts[t] : 1.0;
      m.kind[static_cast<size_t>(i)] = TokenKind::Kept;
      (den ? m.den_weight : m.weight)[static_cast<size_t>(i)] = wt;
      m.max_weight = std::max(m.max_weight, wt);
    }
  };
  mark(sel.indices, sel.weights, false);
  if (sel.separate)
    mark(sel.den_indices, sel.den_weights, true);
  else
    m.den_weight = m.weight;
  for (size_t t = 0; t < sel.middle_scores.size(); ++t) {
    size_t i = static_cast<size_t>(w.mid_begin) + t;
    if (i < n) m.score[i] = sel.middle_scores[t];
  }
  return m;
}

ImU32 token_colour(const TokenMarks& m, int i, int slot) {
  if (i < 0 || i >= static_cast<int>(m.kind.size())) return kColDropped;
  switch (m.kind[static_cast<size_t>(i)]) {
    case TokenKind::Sink:
      return kColSink;
    case TokenKind::Window:
      return kColWindow;
    case TokenKind::Dropped:
      return kColDropped;
    case TokenKind::Kept: {
      double w = std::max(m.weight[static_cast<size_t>(i)], m.den_weight[static_cast<size_t>(i)]);
      double t = m.max_weight > 1 ? std::log(std::max(w, 1e-9)) / std::log(m.max_weight) : 1.0;
      const float f = static_cast<float>(std::clamp(t, 0.0, 1.0));
      if (slot == 1)  // method B: its legend's purple, pale to full
        return lerp_colour(IM_COL32(225, 190, 240, 255), IM_COL32(150, 60, 190, 255), f);
      return lerp_colour(IM_COL32(150, 215, 165, 255), IM_COL32(20, 150, 60, 255), f);
    }
  }
  return kColDropped;
}

const char* token_kind_name(TokenKind k) {
  switch (k) {
    case TokenKind::Sink:
      return "sink (always kept)";
    case TokenKind::Window:
      return "evaluation window (kept as it arrives)";
    case TokenKind::Kept:
      return "kept";
    case TokenKind::Dropped:
      return "dropped";
  }
  return "?";
}

std::vector<OverviewBin> overview_bins(int n, int columns, const TokenMarks* a, const TokenMarks* b,
                                       const TokenHarm* harm) {
  std::vector<OverviewBin> bins;
  if (n <= 0 || columns <= 0) return bins;
  const int cols = std::min(n, columns);
  bins.resize(static_cast<size_t>(cols));
  const std::array<const TokenMarks*, 2> marks{a, b};
  const int harm_n = harm ? static_cast<int>(harm->harm.size()) : 0;
  const int mass_n = harm ? static_cast<int>(harm->mass.size()) : 0;
  for (int c = 0; c < cols; ++c) {
    OverviewBin& bin = bins[static_cast<size_t>(c)];
    bin.first = static_cast<int>(static_cast<long long>(c) * n / cols);
    bin.last = static_cast<int>(static_cast<long long>(c + 1) * n / cols);
    for (int i = bin.first; i < bin.last; ++i) {
      const size_t t = static_cast<size_t>(i);
      // The window and sinks by the harm's window when there are no marks.
      TokenKind k = TokenKind::Dropped;
      if (a && t < a->kind.size())
        k = a->kind[t];
      else if (harm && i < harm->sink)
        k = TokenKind::Sink;
      else if (harm && i >= harm->sink + harm_n)
        k = TokenKind::Window;
      if (k == TokenKind::Sink)
        ++bin.sinks;
      else if (k == TokenKind::Window)
        ++bin.window;
      else
        ++bin.middle;
      for (int s = 0; s < 2; ++s)
        if (marks[s] && t < marks[s]->kind.size() && marks[s]->kind[t] == TokenKind::Kept) {
          ++bin.kept[static_cast<size_t>(s)];
          if (s == 0) bin.weight_sum += std::max(a->weight[t], a->den_weight[t]);
        }
      if (i < mass_n) bin.mass += harm->mass[t];
      if (harm && i >= harm->sink && i < harm->sink + harm_n)
        bin.harm += harm->harm[static_cast<size_t>(i - harm->sink)];
    }
  }
  return bins;
}

ImU32 harm_colour(double harm, double lo, double hi) {
  if (!(hi > 0) || !(harm > lo)) return colormap(Colormap::Magma, 0.0);
  if (!std::isfinite(harm) || harm >= hi) return colormap(Colormap::Magma, 1.0);
  // Kept away from magma's near-black bottom so a harmless token still shows as a band.
  const double t = std::log(harm / lo) / std::log(hi / lo);
  return colormap(Colormap::Magma, 0.12 + 0.88 * t);
}

void harm_range(const TokenHarm& h, double* lo, double* hi) {
  double mx = 0, mn = 0;
  for (double v : h.harm)
    if (v > 0 && std::isfinite(v)) {
      mx = std::max(mx, v);
      mn = mn > 0 ? std::min(mn, v) : v;
    }
  *hi = mx;
  *lo = mx > 0 ? std::max(mn, mx * 1e-4) : 0;
  if (*lo >= *hi) *lo = *hi * 1e-4;
}

}  // namespace kvscope::app
