// kvscope: the desktop app. One GLFW window with an OpenGL 3.3 core context; Dear ImGui draws the
// views (app/app_frame.cpp), a worker computes (app/worker.cpp). With --screenshot it renders the
// chosen view once its work has finished, writes the PNG and exits.
#include <GLFW/glfw3.h>

#include <CLI/CLI.hpp>
#include <cfloat>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "app/app_frame.h"
#include "app/app_state.h"
#include "app/export.h"
#include "app/headless.h"
#include "app/input_queue.h"
#include "app/memory_stats.h"
#include "app/recent_files.h"
#include "app/screenshot.h"
#include "app/soft_render.h"
#include "app/views/view.h"
#include "backends/imgui_impl_glfw.h"
#include "backends/imgui_impl_opengl3.h"
#include "engine/core/error.h"
#include "engine/eval/reference_cache.h"
#include "engine/ops/backend.h"

namespace {

kvscope::app::AppState* g_state = nullptr;
// Frames still to draw without waiting, because input arrived. ImGui answers some input only on
// the frame after it (a combo's list, a popup, a double-click, the end of a drag), so a frame
// that sees input is followed by a few more before the loop may sleep again.
int g_input_frames = 0;
constexpr int kFramesAfterInput = 4;

void note_input() {
  g_input_frames = kFramesAfterInput;
}
// Keys and mouse buttons reach ImGui through this queue (see app/input_queue.h): one change per
// key or button per frame, so taps and double-clicks between two frames are not lost.
kvscope::app::InputQueue g_input;

// Installed before ImGui's callbacks, which chain to them.
void on_mouse_button(GLFWwindow*, int button, int action, int) {
  note_input();
  g_input.button(button, action, glfwGetTime());
}
void on_scroll(GLFWwindow*, double, double) {
  note_input();
}
void on_key(GLFWwindow*, int key, int, int action, int) {
  note_input();
  g_input.key(key, action);
}
void on_char(GLFWwindow*, unsigned int c) {
  note_input();
  g_input.character(c);
}
void on_cursor(GLFWwindow*, double x, double y) {
  note_input();
  g_input.cursor(x, y);
}

void on_drop(GLFWwindow*, int count, const char** paths) {
  // Several files dropped at once: the last one wins (one capture is open at a time).
  if (g_state && count > 0) g_state->request_open(paths[count - 1]);
}

void on_glfw_error(int code, const char* what) {
  std::fprintf(stderr, "kvscope: GLFW error %d: %s\n", code, what);
}

// A cheap fingerprint of a frame's geometry. When a frame differs from the previous one without
// any input (a view playing back a walk, a caret blinking) the loop keeps drawing; when the
// picture is still, it sleeps until input or a worker result arrives.
uint64_t frame_fingerprint(const ImDrawData* dd) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](uint64_t v) { h = (h ^ v) * 1099511628211ull; };
  if (!dd) return h;
  for (int l = 0; l < dd->CmdListsCount; ++l) {
    const ImDrawList* list = dd->CmdLists[l];
    mix(static_cast<uint64_t>(list->VtxBuffer.Size));
    for (const ImDrawVert& v : list->VtxBuffer) {
      uint32_t x, y;
      std::memcpy(&x, &v.pos.x, 4);
      std::memcpy(&y, &v.pos.y, 4);
      mix((static_cast<uint64_t>(x) << 32) ^ y ^ (static_cast<uint64_t>(v.col) << 17));
    }
  }
  return h;
}

// A PNG at `req.density` pixels per layout pixel: the same layout drawn again with the UI scale
// and the window size multiplied (fonts rebuilt at that size, so text is crisp), rasterised on
// the CPU (app/soft_render.h) without being shown, then the window's own scale and font texture
// come back. Two frames, so auto-sized items settle at the new size.
void save_dense_png(kvscope::app::AppUi& ui, const kvscope::app::AppUi::PngRequest& req) {
  using namespace kvscope::app;
  ImGuiIO& io = ImGui::GetIO();
  const float base = ui.ui_scale(), d = req.density;
  const float left = ui.left_panel_width();
  if (left > 0) ui.set_left_panel_width(left * d);
  setup_style_and_fonts(base * d);
  ImGui::GetStyle().AntiAliasedLinesUseTex = false;  // the rasteriser samples nearest
  const SoftTexture font = soft_font_texture();
  int w = 0, h = 0;
  for (int frame = 0; frame < 2; ++frame) {
    ImGui_ImplGlfw_NewFrame();
    g_input.hold(io);  // no press or release seen in these frames
    w = static_cast<int>(std::lround(io.DisplaySize.x * d));
    h = static_cast<int>(std::lround(io.DisplaySize.y * d));
    io.DisplaySize = ImVec2(static_cast<float>(w), static_cast<float>(h));
    io.DisplayFramebufferScale = ImVec2(1, 1);
    io.MousePos = ImVec2(-FLT_MAX, -FLT_MAX);  // no hover highlights in the picture
    ImGui::NewFrame();
    ui.draw();
    ImGui::Render();
  }
  std::vector<uint8_t> px;
  soft_render(ImGui::GetDrawData(), font, w, h, px, IM_COL32(23, 25, 28, 255));
  const ScreenRect rect = ui.view_rect(req.view);
  if (left > 0) ui.set_left_panel_width(left);
  setup_style_and_fonts(base);
  ImGui_ImplOpenGL3_DestroyFontsTexture();
  ImGui_ImplOpenGL3_CreateFontsTexture();
  write_png(req.path, px, w, h, false, rect);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace kvscope::app;
  // References of captures seen before are read back from the user's cache folder instead of
  // computed again (docs/performance.md, "Exact reference cache"; KVSCOPE_CACHE_DIR=off: never).
  kvscope::ReferenceCache::global().set_disk(kvscope::ReferenceCache::default_disk_dir(),
                                             kvscope::ReferenceCache::kDefaultDiskBudget);
  CLI::App cli{"kvscope: look inside KV-cache compression (BalanceKV, SubGen, BUZZ, baselines)"};
  HeadlessOptions opt;
  opt.view = "";
  std::string screenshot;
  cli.add_option("file", opt.capture,
                 "capture to open (.safetensors or .npz); default: the "
                 "bundled stories260K sample");
  cli.add_option("--view", opt.view, "view to show: " + view_names_text());
  cli.add_option("--screenshot", screenshot,
                 "render the view once its work has finished, write this PNG and exit");
  cli.add_option("--method", opt.method, "method A");
  cli.add_option("--method-b", opt.method_b, "method B of the A/B comparison");
  cli.add_option("--ratio", opt.keep_ratio, "keep ratio in (0, 1]");
  cli.add_option("--backend", opt.backend, kvscope::backend_choices_text());
  cli.add_option("--session", opt.session, "session JSON to open");
  cli.add_option("--then-open", opt.then_open,
                 "scripted session: open this file after the first one (tests the error path)");
  cli.add_option("--width", opt.width, "window width")->default_val(1600);
  cli.add_option("--height", opt.height, "window height")->default_val(1000);
  cli.add_option("--timeout", opt.timeout_s, "screenshot: seconds to wait for the view's work")
      ->default_val(300);
  cli.add_flag("--full-window", opt.full_window, "screenshot the whole window");
  cli.add_option("--density", opt.density,
                 "screenshot: pixels per layout pixel (2: a crisp 2x PNG of the same layout)")
      ->default_val(1.0f);
  float ui_scale = 0;
  cli.add_option("--ui-scale", ui_scale,
                 "presentation scale 1 to 2.5 (default: the last one used, Ctrl +/- to change; "
                 "screenshots: 1)");
  std::string export_dir;
  cli.add_option("--export-dir", export_dir,
                 "folder for keyboard exports: F9 writes every view's numbers and the app's "
                 "state as JSON, F10 a PNG of the active view (used by the GUI test)");
  CLI11_PARSE(cli, argc, argv);

  const bool headless = !screenshot.empty();
  if (opt.view.empty()) opt.view = "capture";
  // The remembered scale applies to interactive sessions; screenshots are reproducible (1x
  // unless --ui-scale says otherwise).
  opt.ui_scale = ui_scale > 0 ? ui_scale : headless ? 1.0f : load_ui_scale_pref();
  // No file named: the capture opened last (File > Open recent's first capture), so a clean quit
  // and a restart come back to it; the bundled sample when there is none. Screenshots stay
  // reproducible: always the sample.
  if (opt.capture.empty() && opt.session.empty() && !headless) {
    kvscope::app::RecentFiles recent;
    if (recent.load().empty()) opt.capture = recent.last_capture();
  }
  if (opt.capture.empty() && opt.session.empty()) opt.capture = default_capture_path(argv[0]);
  try {
    validate_options(opt);
  } catch (const kvscope::InputError& e) {
    std::fprintf(stderr, "kvscope: error: %s\n", e.what());
    return 1;
  }

  glfwSetErrorCallback(on_glfw_error);
  if (!glfwInit()) {
    std::fprintf(stderr,
                 "kvscope: cannot initialise GLFW (no display? try xvfb-run, or "
                 "kvscope-cli render for PNGs without a window)\n");
    return 1;
  }
  glfwWindowHint(GLFW_CONTEXT_VERSION_MAJOR, 3);
  glfwWindowHint(GLFW_CONTEXT_VERSION_MINOR, 3);
  glfwWindowHint(GLFW_OPENGL_PROFILE, GLFW_OPENGL_CORE_PROFILE);
  glfwWindowHint(GLFW_OPENGL_FORWARD_COMPAT, GLFW_TRUE);
  GLFWwindow* window = glfwCreateWindow(opt.width, opt.height, "KVScope", nullptr, nullptr);
  if (!window) {
    std::fprintf(stderr, "kvscope: cannot create an OpenGL 3.3 core window\n");
    glfwTerminate();
    return 1;
  }
  glfwMakeContextCurrent(window);
  glfwSwapInterval(headless ? 0 : 1);

  glfwSetMouseButtonCallback(window, on_mouse_button);
  glfwSetScrollCallback(window, on_scroll);
  glfwSetKeyCallback(window, on_key);
  glfwSetCharCallback(window, on_char);
  glfwSetCursorPosCallback(window, on_cursor);

  IMGUI_CHECKVERSION();
  ImGui::CreateContext();
  setup_style_and_fonts(opt.ui_scale);
  ImGui_ImplGlfw_InitForOpenGL(window, true);
  // Characters go through the input queue, in order with the keys (app/input_queue.h), not
  // straight to ImGui as the backend's own callback would send them.
  glfwSetCharCallback(window, on_char);
  ImGui_ImplOpenGL3_Init("#version 330 core");

  int rc = 0;
  {
    AppState state;
    g_state = &state;
    state.worker.set_wakeup([] { glfwPostEmptyEvent(); });
    AppUi ui(state);
    ui.set_ui_scale(opt.ui_scale);
    ui.take_font_rebuild();  // built at this scale above
    ui.export_dir = export_dir;
    // File > Open recent, remembered in recent.json of the config folder (app/recent_files.h).
    if (!headless) ui.enable_recent_files();
    // Autosave and recovery (app/autosave.h): never for screenshots.
    if (!headless) ui.enable_autosave();
    bool quit = false;
    ui.on_quit = [&quit] { quit = true; };
    glfwSetDropCallback(window, on_drop);
    try {
      apply_options(state, ui, opt);
    } catch (const kvscope::InputError& e) {
      if (headless) {
        std::fprintf(stderr, "kvscope: error: %s\n", e.what());
        quit = true;
        rc = 1;
      } else {
        state.load_error = e.what();
      }
    }
    auto t0 = std::chrono::steady_clock::now();
    auto last_change = t0;
    auto last_input = t0;  // the last frame that saw input
    auto last_frame_start = t0;
    uint64_t last_fingerprint = 0;
    std::string window_title_path;
    // Free memory is given back once the app has gone still after activity (app/memory_stats.h).
    bool active_since_trim = false;
    auto last_trim = t0;
    while (!quit && !glfwWindowShouldClose(window)) {
      const auto frame_start = std::chrono::steady_clock::now();
      bool busy = state.worker.busy() || state.worker.pending_applies() > 0;
      bool animating = std::chrono::duration<double>(frame_start - last_change).count() < 0.25;
      const bool input_pending = g_input_frames > 0;
      if (g_input_frames > 0) --g_input_frames;
      if (input_pending) last_input = frame_start;
      const bool interacting =
          std::chrono::duration<double>(frame_start - last_input).count() < 0.5;
      if (busy && !interacting) {
        // Only background work running (the grid filling, a sweep), nobody at the controls:
        // about 10 frames a second show its progress and leave the cores to the work. Drawn at
        // full rate, a software rasteriser (Xvfb, a VM without a GPU) took nearly all the CPU
        // from the work's nice +19 threads (docs/app.md, "How the grid fills"). Input still
        // draws at once.
        active_since_trim = true;
        const auto until = last_frame_start + std::chrono::milliseconds(100);
        for (auto now = frame_start; now < until && g_input_frames == 0;
             now = std::chrono::steady_clock::now())
          glfwWaitEventsTimeout(std::chrono::duration<double>(until - now).count());
      } else if (headless || busy || animating || input_pending) {
        active_since_trim = true;
        glfwPollEvents();
      } else {
        if (active_since_trim &&
            std::chrono::duration<double>(frame_start - last_trim).count() >= 2.0) {
          return_free_memory();  // nothing to draw: the few milliseconds delay no frame
          active_since_trim = false;
          last_trim = frame_start;
        }
        glfwWaitEventsTimeout(0.5);  // still picture: sleep until input or a worker result
      }
      last_frame_start = std::chrono::steady_clock::now();
      const auto work_start = last_frame_start;  // the frame's work from here
      state.worker.drain(state);
      if (state.capture_path != window_title_path) {
        window_title_path = state.capture_path;
        std::string title = "KVScope - " + window_title_path;
        if (state.info() && state.info()->synthetic) title += " [SYNTHETIC]";
        glfwSetWindowTitle(window, title.c_str());
      }
      if (ui.take_font_rebuild()) {
        // Presentation mode: glyphs rasterised at the new size (crisp), not stretched.
        setup_style_and_fonts(ui.ui_scale());
        ImGui_ImplOpenGL3_DestroyFontsTexture();
        ImGui_ImplOpenGL3_CreateFontsTexture();
        if (!headless) save_ui_scale_pref(ui.ui_scale());
      }
      ui.before_frame();
      if (headless && is_svg_path(screenshot))
        ImGui::GetStyle().AntiAliasedLines = ImGui::GetStyle().AntiAliasedFill = false;
      ImGui_ImplOpenGL3_NewFrame();
      ImGui_ImplGlfw_NewFrame();
      g_input.feed(ImGui::GetIO());
      if (g_input.pending()) note_input();  // the rest in the next frame, drawn at once
      // Screenshots show no hover state: Xvfb parks its pointer in the middle of the screen.
      if (headless) ImGui::GetIO().MousePos = ImVec2(-FLT_MAX, -FLT_MAX);
      ImGui::NewFrame();
      g_input.after_new_frame(ImGui::GetIO());
      ui.draw();
      ImGui::Render();
      ui.after_render(ImGui::GetDrawData());
      const auto app_end = std::chrono::steady_clock::now();  // GL from here
      int fw = 0, fh = 0;
      glfwGetFramebufferSize(window, &fw, &fh);
      glViewport(0, 0, fw, fh);
      glClearColor(0.09f, 0.10f, 0.11f, 1.0f);
      glClear(GL_COLOR_BUFFER_BIT);
      ImGui_ImplOpenGL3_RenderDrawData(ImGui::GetDrawData());
      uint64_t fp = frame_fingerprint(ImGui::GetDrawData());
      if (fp != last_fingerprint) last_change = std::chrono::steady_clock::now();
      last_fingerprint = fp;
      const ImVec2 scale = ImGui::GetIO().DisplayFramebufferScale;
      std::vector<AppUi::PngRequest> dense;
      for (const auto& req : ui.take_png_requests()) {
        if (req.density > 1) {
          dense.push_back(req);  // after this frame is shown
          continue;
        }
        try {
          save_framebuffer_png(req.path, fw, fh, scale.x, scale.y, req.rect);
          state.status_message = "wrote " + req.path;
        } catch (const std::exception& e) {
          state.status_message = e.what();
        }
      }
      if (headless) {
        bool ready = ui.ready_for_screenshot(opt.view);
        double waited =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (ready && !state.load_error.empty() && !state.capture) {
          std::fprintf(stderr, "kvscope: error: %s\n", state.load_error.c_str());
          rc = 1;
          quit = true;
        } else if (ready || waited > opt.timeout_s) {
          if (!ready) {
            std::fprintf(stderr, "kvscope: the %s view's work did not finish in %.0f s\n",
                         opt.view.c_str(), opt.timeout_s);
            rc = 3;
          }
          try {
            const ScreenRect rect = opt.full_window ? ScreenRect{} : ui.view_rect(opt.view);
            if (is_svg_path(screenshot))
              write_svg(screenshot, ImGui::GetDrawData(), rect, IM_COL32(28, 31, 33, 255));
            else if (opt.density > 1)
              save_dense_png(ui, {screenshot, {}, 0, opt.density, opt.view});
            else
              save_framebuffer_png(screenshot, fw, fh, scale.x, scale.y, rect);
            std::printf("kvscope: wrote %s\n", screenshot.c_str());
          } catch (const std::exception& e) {
            std::fprintf(stderr, "kvscope: error: %s\n", e.what());
            rc = 1;
          }
          quit = true;
        }
      }
      glfwSwapBuffers(window);
      for (const auto& req : dense) {
        try {
          save_dense_png(ui, req);
          state.status_message = "wrote " + req.path;
        } catch (const std::exception& e) {
          state.status_message = e.what();
        }
      }
      ui.note_frame_time(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - work_start)
              .count(),
          std::chrono::duration<double, std::milli>(app_end - work_start).count());
      // Without vsync (e.g. under Xvfb) cap interactive frames at about 60 per second.
      if (!headless) {
        auto spent = std::chrono::steady_clock::now() - frame_start;
        if (spent < std::chrono::milliseconds(16))
          std::this_thread::sleep_for(std::chrono::milliseconds(16) - spent);
      }
    }
    // A clean quit (File > Quit, the window closed): the autosave says so, and the next start
    // offers nothing.
    if (!headless) ui.finish_autosave();
    state.worker.cancel("");
    g_state = nullptr;
  }
  ImGui_ImplOpenGL3_Shutdown();
  ImGui_ImplGlfw_Shutdown();
  ImGui::DestroyContext();
  glfwDestroyWindow(window);
  glfwTerminate();
  return rc;
}
