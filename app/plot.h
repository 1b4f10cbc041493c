// Plot helpers drawn by hand with ImDrawList (ImGui 1.86 has no ImPlot): a plot frame with
// axes, ticks, labels, linear or log axes, and lines, markers, bands, bars, heatmaps, colour bars,
// legends and hover lookup on top. Pure ImGui, so plots also render headless.
#pragma once

#include <imgui.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "app/colormap.h"

namespace kvscope::app {

enum class Scale { Linear, Log2, Log10 };

struct Axis {
  std::string label;  // with units, e.g. "keep ratio (log2)"
  double min = 0, max = 1;
  Scale scale = Scale::Linear;
  bool fraction_ticks = false;  // Log2 axis ticks written as 1/2, 1/4, ... (keep ratios)
};

// min/max of finite values, padded by `pad` of the span (span 0 gets +-0.5 or +-10%).
void finite_range(const std::vector<double>& v, double* lo, double* hi, double pad = 0.05);

class Plot {
 public:
  // Reserves `size` in the layout (a component <= 0 fills the available region), draws the
  // background, grid, ticks, axis labels and the title. The id must be unique in the window.
  // equal_aspect: one data unit is as long on both axes (angles are true); the axis ranges
  // given are grown around their centres to fill the frame (linear axes only).
  Plot(const char* id, ImVec2 size, const std::string& title, Axis x, Axis y,
       bool equal_aspect = false);

  ImDrawList* draw_list() const { return dl_; }
  ImVec2 inner_min() const { return p0_; }
  ImVec2 inner_max() const { return p1_; }
  const Axis& x_axis() const { return x_; }
  const Axis& y_axis() const { return y_; }

  float sx(double x) const;  // data -> screen
  float sy(double y) const;
  ImVec2 to_screen(double x, double y) const { return ImVec2(sx(x), sy(y)); }
  double data_x(float screen_x) const;
  double data_y(float screen_y) const;

  bool hovered() const { return hovered_; }
  bool clicked() const { return clicked_; }
  ImVec2 mouse_data() const;  // data coordinates of the mouse (valid when hovered)

  // Series. Non-finite points break a line; points outside the axes are clipped.
  void line(const std::vector<double>& x, const std::vector<double>& y, ImU32 col,
            float thickness = 2.0f) const;
  // Dashed polyline (a reference drawn over or under a solid one): dashes of `dash` px at
  // scale 1, running on across vertices.
  void dashed_line(const std::vector<double>& x, const std::vector<double>& y, ImU32 col,
                   float thickness = 1.5f, float dash = 6.0f) const;
  void markers(const std::vector<double>& x, const std::vector<double>& y, ImU32 col,
               float radius = 3.0f) const;
  void band(const std::vector<double>& x, const std::vector<double>& lo,
            const std::vector<double>& hi, ImU32 col) const;
  // Vertical bars from the x axis baseline (y = max(y_min, 0)) centred on x with data width w.
  void bars(const std::vector<double>& x, const std::vector<double>& y, double w, ImU32 col) const;
  void vline(double x, ImU32 col, float thickness = 1.0f) const;
  void hline(double y, ImU32 col, float thickness = 1.0f) const;
  // Index of the point whose x is nearest the mouse in screen space, -1 when not hovered.
  int nearest_x(const std::vector<double>& x) const;

  struct LegendEntry {
    std::string label;
    ImU32 colour;
  };
  enum class Corner { TopRight, TopLeft, BottomRight, BottomLeft };
  // A boxed legend inside the data area, at `corner` unless its box would cover what this plot
  // drew there (lines, markers, bands, bars: every series method notes where it drew): then at
  // the first free place of the other corners, the edges' middles and the centre. Where every
  // place covers data, or the box would take half the data area, the plot keeps a band for it
  // outside its data area from the next frame on (rows above the data; a column right of it on
  // a short plot; else rows with the plot grown by them; by the plot's id, for as long as the app
  // runs). Returns the box drawn (x0, y0, x1, y1), all zero when none was drawn this frame.
  ImVec4 legend(const std::vector<LegendEntry>& entries, Corner corner = Corner::TopRight) const;
  // The corner of the data area with the fewest of these screen points (for the legend).
  Corner emptiest_corner(const std::vector<ImVec2>& points) const;
  // Notes screen points drawn on the plot's draw list directly (arrows, paths), so that the
  // legend avoids them too.
  void note_drawn(const std::vector<ImVec2>& points) const;
  // How many of the drawn points lie in the screen rectangle [a, b] or within 3 px (at 1x) of
  // it: points are the centres of markers and thick lines.
  int drawn_in(ImVec2 a, ImVec2 b) const;

  // The legend's rows above the data area (legend()): their height for `width` pixels; and the
  // width of its column right of the data area.
  static float legend_band_height(const std::vector<LegendEntry>& entries, float width);
  static float legend_column_width(const std::vector<LegendEntry>& entries);
  // Where a plot keeps its legend outside the data area (by plot id): a band of `size` pixels
  // above it, or a column of `size` pixels right of it.
  struct LegendBand {
    bool right = false;
    float size = 0;
  };

 private:
  ImDrawList* dl_ = nullptr;
  ImVec2 p0_, p1_;  // inner (data) rectangle
  ImGuiID id_ = 0;
  LegendBand band_;  // the band this frame keeps for the legend (size 0: none)
  bool band_grew_ = false;  // the plot grew by band_ (its data area kept its height)
  // Where a legend box of size `box` goes in the data area [q0, q1] (see legend()), given what
  // was drawn there; `covered` gets how many of `points` it covers (within `pad` pixels).
  static ImVec2 place_legend(ImVec2 q0, ImVec2 q1, ImVec2 box, Corner corner,
                             const std::vector<ImVec2>& points, float pad, int* covered);
  ImVec4 legend_in_band(const std::vector<LegendEntry>& entries) const;
  void keep_band(const std::vector<LegendEntry>& entries) const;
  Axis x_, y_;
  bool hovered_ = false, clicked_ = false;
  // Screen points of what the series drew inside the data area (segments sampled every few
  // pixels), for the legend's placement.
  mutable std::vector<ImVec2> drawn_;
  void note_segment(ImVec2 a, ImVec2 b) const;
  double tx(double v, const Axis& a) const;  // axis transform (log for log axes)

  // Tick positions in data units, each with its label.
  using Ticks = std::vector<std::pair<double, std::string>>;
  // Steps of the constructor, in the order it runs them.
  void make_ranges_valid();
  Ticks y_ticks(float font, float unit, std::vector<double>* minor) const;
  void fit_equal_aspect(float unit, Ticks* yt);
  Ticks x_ticks(float font, float unit) const;
  void draw_grid(const Ticks& xt, const Ticks& yt) const;
  void draw_labels(ImVec2 o, ImVec2 size, const std::string& title, bool two_lines, float ylabel_w,
                   float font, float unit) const;
};

// Heatmap of rows x cols cells in [p0, p1]: value(r, c) -> colour. Returns the hovered cell as
// (row, col) or (-1, -1). Draws cell borders when cells are large enough.
struct HeatmapHit {
  int row = -1, col = -1;
  bool clicked = false;
};
HeatmapHit heatmap(const char* id, ImVec2 size, int rows, int cols,
                   const std::function<ImU32(int, int)>& colour,
                   const std::function<std::string(int, int)>& cell_text = {});

// Vertical colour bar with min/max/mid labels; `size` as for Plot. The label is wrapped at
// spaces to the width (the bar starts below it).
void colour_bar(const char* id, ImVec2 size, Colormap map, double vmin, double vmax,
                const std::string& label);
// The width colour_bar needs at the current UI scale: the bar and its widest value label, or the
// label's longest word. (Fixed pixel widths cut "rel. error" to "rel. e" at 2.5x.)
float colour_bar_width(double vmin, double vmax, const std::string& label);

// Every legend Plot::legend drew since the last clear_legend_log(), with how many of its plot's
// drawn points its box covers (0 unless every place tried holds data): the layout test counts
// them. Nothing is logged before the first clear_legend_log() (the app never calls it).
struct PlacedLegend {
  ImVec4 box;
  int covered = 0;
};
void clear_legend_log();
const std::vector<PlacedLegend>& legend_log();
// The figures drawn since the last clear_legend_log(): every Plot's rectangle, and the other
// figures' that call log_figure (the Geometry view's maps). The layout test checks that each
// view's largest figure keeps a readable share of the view at every size and scale.
void log_figure(ImVec2 min, ImVec2 max);
const std::vector<ImVec4>& figure_log();

// Small coloured square + text on one line (for legends outside plots).
void legend_swatch(ImU32 colour, const char* text);

// `text` shortened with "..." to fit `width` pixels.
std::string elide(const std::string& text, float width);

// Where a log10 axis puts its labels: the powers of ten, and while fewer than three of them fit
// in [lo, hi], 2 and 5 times them, then every 1..9 times them; neighbours at least `min_gap`
// pixels apart at `px_per_decade` pixels per factor of ten. Increasing; [lo, hi] when too short.
std::vector<double> log10_labels(double lo, double hi, double px_per_decade, double min_gap);

// The smallest plot the app draws at the current UI scale (16 x 9 lines of text); panels that
// cannot hold it scroll. Views size their panels from it.
ImVec2 min_plot_size();

// Keep-ratio labels: 0.25 -> "1/4", 0.3 -> "0.3".
std::string ratio_label(double r);

}  // namespace kvscope::app
