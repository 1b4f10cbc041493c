// kvscope-cli render: a PNG or SVG of one app view's figure without a window. The app's own view
// code draws into ImGui draw lists, which a small software rasteriser (app/soft_render.cpp) fills
// on the CPU, so no display, X server or GL context is needed. Built when the app is
// (KVSCOPE_BUILD_APP).
#include <memory>

#include "cli/commands.h"
#include "cli/output_file.h"
#include "engine/core/error.h"
#include "engine/eval/protocol.h"
#include "engine/io/capture.h"
#include "engine/methods/method.h"
#include "engine/ops/backend.h"

#ifdef KVSCOPE_HAVE_UI
#include "app/headless.h"
#include "app/views/view.h"
#endif

namespace kvscope::cli {

void add_render_command(CLI::App& app) {
  auto* sub = app.add_subcommand(
      "render", "Write a PNG (or SVG: --out X.svg) of one KVScope view's figure without a window");
#ifdef KVSCOPE_HAVE_UI
  auto opt = std::make_shared<app::HeadlessOptions>();
  sub->add_option("file", opt->capture, "capture file (.safetensors or .npz)")->required();
  sub->add_option("--view", opt->view, app::view_names_text())->default_val("capture");
  sub->add_option("--out", opt->out, "PNG to write, or SVG (vector figure) when it ends in .svg")
      ->required();
  sub->add_option("--method", opt->method, "method A (default balancekv)");
  sub->add_option("--method-b", opt->method_b, "method B of the A/B comparison");
  sub->add_option("--ratio", opt->keep_ratio, "keep ratio in (0, 1]");
  sub->add_option("--backend", opt->backend, backend_choices_text());
  sub->add_option("--session", opt->session, "session JSON to apply first");
  sub->add_option("--width", opt->width, "window width in pixels")->default_val(1600);
  sub->add_option("--height", opt->height, "window height in pixels")->default_val(1000);
  sub->add_option("--timeout", opt->timeout_s, "seconds to wait for the view's work")
      ->default_val(300);
  sub->add_flag("--full-window", opt->full_window, "whole window instead of the view's figure");
  sub->add_option("--ui-scale", opt->ui_scale,
                  "UI scale of fonts and sizes (for a projector), 1 to 2.5")
      ->default_val(1.0f);
  sub->add_option("--density", opt->density,
                  "pixels per layout pixel: 2 gives a 2x PNG of the same layout with crisp text")
      ->default_val(1.0f);
  sub->callback([opt] {
    // The PNG is written by the app's code; the path is checked here first (never an input, a
    // link, a FIFO or a device).
    check_output(opt->out, {opt->capture, opt->session}, "--out");
    // A method named by flag that this capture cannot run is a bad request, as in eval (the view
    // would only show it greyed out).
    if (!opt->method.empty() || !opt->method_b.empty()) {
      const CaptureInfo info = CaptureFile::open(opt->capture)->info();
      auto require = [&](const std::string& name, const char* setting, const char* flag) {
        if (const Method* m = name.empty() ? nullptr : find_method(name))
          require_runnable({m}, info, {}, setting, flag);
      };
      require(opt->method, "method A", "--method");
      require(opt->method_b, "method B", "--method-b");
    }
    int rc = app::render_view_software(*opt);
    if (rc != 0) throw InputError("render: the view was not ready before --timeout");
  });
#else
  sub->allow_extras();
  sub->callback([] {
    throw InputError(
        "render: this kvscope-cli was built without the app (configure with "
        "-DKVSCOPE_BUILD_APP=ON and the Debian packages libimgui-dev, libglfw3-dev, libstb-dev)");
  });
#endif
}

}  // namespace kvscope::cli
