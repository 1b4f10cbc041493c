#include "app/headless.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <thread>

#include "app/app_frame.h"
#include "app/app_state.h"
#include "app/export.h"
#include "app/soft_render.h"
#include "app/views/view.h"
#include "engine/core/error.h"
#include "engine/methods/method.h"

namespace kvscope::app {

void validate_options(const HeadlessOptions& o) {
  const std::vector<std::string> names = view_names();
  if (std::find(names.begin(), names.end(), o.view) == names.end())
    throw InputError("--view: '" + o.view + "' is not one of " + view_names_text());
  if (o.keep_ratio != -1 && !(o.keep_ratio > 0 && o.keep_ratio <= 1))
    throw InputError("--ratio: " + std::to_string(o.keep_ratio) + " is not in (0, 1]");
  if (!o.method.empty() && !find_method(o.method))
    throw InputError("--method: unknown method '" + o.method + "'");
  if (!o.method_b.empty() && !find_method(o.method_b))
    throw InputError("--method-b: unknown method '" + o.method_b + "'");
  if (!(o.ui_scale >= kMinUiScale && o.ui_scale <= kMaxUiScale))
    throw InputError("--ui-scale: " + std::to_string(o.ui_scale) + " is not in [1, 2.5]");
  if (!(o.density >= 1 && o.ui_scale * o.density <= kMaxUiScale + 1e-6))
    throw InputError("--density: " + std::to_string(o.density) +
                     " must be >= 1 with ui-scale x density <= 2.5");
  if (o.width < 320 || o.height < 240 || o.width > 8192 || o.height > 8192)
    throw InputError("--size: " + std::to_string(o.width) + "x" + std::to_string(o.height) +
                     " is outside 320x240 .. 8192x8192");
}

void apply_options(AppState& s, AppUi& ui, const HeadlessOptions& o) {
  if (!o.session.empty()) ui.load_session(o.session);
  if (!o.method.empty()) s.settings.method[0] = MethodChoice{o.method, {}};
  if (!o.method_b.empty()) {
    s.settings.method[1] = MethodChoice{o.method_b, {}};
    s.settings.ab_enabled = true;
  }
  if (o.keep_ratio > 0) s.settings.keep_ratio = o.keep_ratio;
  if (!o.backend.empty()) {
    s.settings.backend = o.backend;
    s.reconcile();  // resolves the backend (and says why when it cannot)
    if (s.settings.backend != o.backend) throw InputError(s.backend_note);
  }
  s.settings.active_view = o.view;
  ui.show_view(o.view);
  if (!o.capture.empty()) s.request_open(o.capture, !o.session.empty());
  // Asked for once the first open has ended (opened or failed), like a second File > Open.
  if (!o.then_open.empty()) s.request_open_after(o.then_open);
}

int render_view_software(const HeadlessOptions& opt) {
  validate_options(opt);
  HeadlessOptions o = opt;
  const float scale = o.ui_scale * o.density;
  o.width = static_cast<int>(std::lround(o.width * o.density));
  o.height = static_cast<int>(std::lround(o.height * o.density));
  SoftTexture font = soft_init(o.width, o.height, scale);
  const bool svg = is_svg_path(o.out);
  int rc = 0;
  {
    AppState s;
    AppUi ui(s);
    ui.set_ui_scale(scale);
    ui.take_font_rebuild();  // soft_init built the atlas at this scale already
    apply_options(s, ui, o);
    auto t0 = std::chrono::steady_clock::now();
    bool ready = false;
    while (!ready) {
      ImGui::GetIO().DeltaTime = 1.0f / 60.0f;
      // An SVG is taken from a frame without anti-aliasing (plain polygons, solid lines).
      ImGuiStyle& st = ImGui::GetStyle();
      st.AntiAliasedLines = st.AntiAliasedFill = !svg;
      ImGui::NewFrame();
      ui.draw();
      ImGui::Render();
      ready = ui.ready_for_screenshot(o.view);
      double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (!ready && waited > o.timeout_s) {
        std::fprintf(stderr,
                     "render: the %s view's work did not finish in %.0f s; writing what "
                     "is there\n",
                     o.view.c_str(), o.timeout_s);
        rc = 3;
        break;
      }
      if (!ready) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (!s.load_error.empty() && !s.capture) {
      std::string msg = s.load_error;
      ImGui::DestroyContext();
      throw InputError(msg);
    }
    ScreenRect rect = o.full_window ? ScreenRect{} : ui.view_rect(o.view);
    if (svg) {
      write_svg(o.out, ImGui::GetDrawData(), rect, IM_COL32(28, 31, 33, 255));
    } else {
      std::vector<uint8_t> pixels;
      soft_render(ImGui::GetDrawData(), font, o.width, o.height, pixels, IM_COL32(23, 25, 28, 255));
      write_png(o.out, pixels, o.width, o.height, false, rect);
    }
  }
  ImGui::DestroyContext();
  return rc;
}

}  // namespace kvscope::app
