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
#include <ctime>
#include <string>
#include <thread>
#include <vector>

#include "app/app_frame.h"
#include "app/app_state.h"
#include "app/export.h"
#include "app/headless.h"
#include "app/input_queue.h"
#include "app/memory_stats.h"
#include "app/point_renderer.h"
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

// Set when the window system asks for the window's contents again (uncovered, restored): the
// next frame is presented even when it equals the one presented last.
bool g_window_exposed = true;
void on_window_refresh(GLFWwindow*) {
  g_window_exposed = true;
}

void on_glfw_error(int code, const char* what) {
  std::fprintf(stderr, "kvscope: GLFW error %d: %s\n", code, what);
}

// A cheap fingerprint of a frame's picture: its size, geometry, colours, texture coordinates and
// textures, and the revision of the point textures (drawn outside the draw data). When a frame
// differs from the previous one without any input (a view playing back a walk, a caret
// blinking) the loop keeps drawing; when the picture is still, it sleeps until input or a worker
// result arrives, and a frame equal to the one on screen is not rendered again.
uint64_t frame_fingerprint(const ImDrawData* dd) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](uint64_t v) { h = (h ^ v) * 1099511628211ull; };
  auto bits = [](float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return static_cast<uint64_t>(u);
  };
  mix(kvscope::app::points_texture_revision());
  if (!dd) return h;
  mix((bits(dd->DisplaySize.x) << 32) ^ bits(dd->DisplaySize.y));
  mix((bits(dd->FramebufferScale.x) << 32) ^ bits(dd->FramebufferScale.y));
  for (int l = 0; l < dd->CmdListsCount; ++l) {
    const ImDrawList* list = dd->CmdLists[l];
    mix(static_cast<uint64_t>(list->VtxBuffer.Size));
    for (const ImDrawVert& v : list->VtxBuffer) {
      mix((bits(v.pos.x) << 32) ^ bits(v.pos.y) ^ (static_cast<uint64_t>(v.col) << 17));
      mix((bits(v.uv.x) << 32) ^ bits(v.uv.y));
    }
    for (const ImDrawCmd& cmd : list->CmdBuffer) {
      mix(static_cast<uint64_t>(reinterpret_cast<uintptr_t>(cmd.TextureId)));
      mix((static_cast<uint64_t>(cmd.ElemCount) << 32) ^ cmd.IdxOffset ^
          (uint64_t{cmd.VtxOffset} << 20));
      mix((bits(cmd.ClipRect.x) << 32) ^ bits(cmd.ClipRect.y));
      mix((bits(cmd.ClipRect.z) << 32) ^ bits(cmd.ClipRect.w));
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

// The app's command line (the same options as a headless render, plus the window's own).
struct AppOptions {
  kvscope::app::HeadlessOptions view;  // file, view, methods, ratio, backend, session, sizes
  std::string screenshot;              // non-empty: render once the view is ready, then exit
  float ui_scale = 0;                  // 0: the remembered one (screenshots: 1)
  std::string export_dir;
  bool headless() const { return !screenshot.empty(); }
};

// Parses the command line into `o`; returns -1 to go on, or the exit status (help, a bad flag).
int parse_options(int argc, char** argv, AppOptions& o) {
  using namespace kvscope::app;
  CLI::App cli{"kvscope: look inside KV-cache compression (BalanceKV, SubGen, BUZZ, baselines)"};
  HeadlessOptions& opt = o.view;
  opt.view = "";
  cli.add_option("file", opt.capture,
                 "capture to open (.safetensors or .npz), or a capture set (a manifest .jsonl "
                 "or a folder: the Set view); default: the bundled stories260K sample");
  cli.add_option("--view", opt.view, "view to show: " + view_names_text());
  cli.add_option("--screenshot", o.screenshot,
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
  cli.add_option(
      "--ui-scale", o.ui_scale,
      "UI scale 1 to 2.5 for a projector (default: the last one used, Ctrl +/- to change; "
      "screenshots: 1)");
  cli.add_option("--export-dir", o.export_dir,
                 "folder for keyboard exports: F9 writes every view's numbers and the app's "
                 "state as JSON, F10 a PNG of the active view (used by the GUI test)");
  try {
    cli.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return cli.exit(e);
  }
  if (opt.view.empty()) opt.view = "capture";
  // The remembered scale applies to interactive sessions; screenshots are reproducible (1x
  // unless --ui-scale says otherwise).
  opt.ui_scale = o.ui_scale > 0 ? o.ui_scale : o.headless() ? 1.0f : load_ui_scale_pref();
  // No file named: the capture opened last (File > Open recent's first capture), so a clean quit
  // and a restart come back to it; the bundled sample when there is none. Screenshots stay
  // reproducible: always the sample.
  if (opt.capture.empty() && opt.session.empty() && !o.headless()) {
    RecentFiles recent;
    if (recent.load().empty()) opt.capture = recent.last_capture();
  }
  if (opt.capture.empty() && opt.session.empty()) opt.capture = default_capture_path(argv[0]);
  try {
    validate_options(opt);
  } catch (const kvscope::InputError& e) {
    std::fprintf(stderr, "kvscope: error: %s\n", e.what());
    return 1;
  }
  return -1;
}

// The window with an OpenGL 3.3 core context and the input callbacks, or null (said on stderr).
GLFWwindow* create_window(const AppOptions& o) {
  glfwSetErrorCallback(on_glfw_error);
  if (!glfwInit()) {
    std::fprintf(stderr,
                 "kvscope: cannot initialise GLFW (no display? try xvfb-run, or "
                 "kvscope-cli render for PNGs without a window)\n");
    return nullptr;
  }
  glfwWindowHint(GLFW_CONTEXT_VERSION_MAJOR, 3);
  glfwWindowHint(GLFW_CONTEXT_VERSION_MINOR, 3);
  glfwWindowHint(GLFW_OPENGL_PROFILE, GLFW_OPENGL_CORE_PROFILE);
  glfwWindowHint(GLFW_OPENGL_FORWARD_COMPAT, GLFW_TRUE);
  GLFWwindow* window = glfwCreateWindow(o.view.width, o.view.height, "KVScope", nullptr, nullptr);
  if (!window) {
    std::fprintf(stderr, "kvscope: cannot create an OpenGL 3.3 core window\n");
    glfwTerminate();
    return nullptr;
  }
  glfwMakeContextCurrent(window);
  glfwSwapInterval(o.headless() ? 0 : 1);
  glfwSetMouseButtonCallback(window, on_mouse_button);
  glfwSetScrollCallback(window, on_scroll);
  glfwSetKeyCallback(window, on_key);
  glfwSetCharCallback(window, on_char);
  glfwSetCursorPosCallback(window, on_cursor);
  return window;
}

// The CPU time this thread has used, in milliseconds.
double thread_cpu_ms() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) * 1e3 + static_cast<double>(t.tv_nsec) * 1e-6;
}

// The frame loop: wait for something to draw, draw, show, and (for --screenshot) write the picture
// once the view is ready.
class FrameLoop {
 public:
  using Clock = std::chrono::steady_clock;
  FrameLoop(GLFWwindow* window, kvscope::app::AppState& state, kvscope::app::AppUi& ui,
            const AppOptions& o)
      : window_(window), state_(state), ui_(ui), o_(o), headless_(o.headless()) {}

  // Until the app quits (File > Quit, the window closed, a screenshot written); the exit status.
  int run() {
    while (!quit_ && !glfwWindowShouldClose(window_)) {
      const Clock::time_point frame_start = Clock::now();
      wait_for_events(frame_start);
      last_frame_start_ = Clock::now();
      const Clock::time_point work_start = last_frame_start_;  // the frame's work from here
      const double work_start_cpu = thread_cpu_ms();
      before_frame();
      draw_frame();
      const Clock::time_point app_end = Clock::now();  // GL from here
      const double app_cpu = thread_cpu_ms() - work_start_cpu;
      present_and_capture();
      ui_.note_frame_time(
          std::chrono::duration<double, std::milli>(Clock::now() - work_start).count(),
          std::chrono::duration<double, std::milli>(app_end - work_start).count(), app_cpu);
      // Without vsync (e.g. under Xvfb) cap interactive frames at about 60 per second.
      if (!headless_) {
        const auto spent = Clock::now() - frame_start;
        if (spent < std::chrono::milliseconds(16))
          std::this_thread::sleep_for(std::chrono::milliseconds(16) - spent);
      }
    }
    return rc_;
  }
  void quit() { quit_ = true; }
  void fail(int rc) { rc_ = rc, quit_ = true; }

 private:
  static double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

  // Sleeps until there is something to draw: input, a worker's result, an animation; about 10
  // frames a second while only background work runs.
  void wait_for_events(Clock::time_point frame_start) {
    const bool busy = state_.worker.busy() || state_.worker.pending_applies() > 0;
    const bool animating = seconds(frame_start - last_change_) < 0.25;
    const bool input_pending = g_input_frames > 0;
    if (g_input_frames > 0) --g_input_frames;
    if (input_pending) last_input_ = frame_start;
    const bool interacting = seconds(frame_start - last_input_) < 0.5;
    if (busy && !interacting) {
      // Only background work running (the grid filling, a sweep), nobody at the controls:
      // about 10 frames a second show its progress and leave the cores to the work. Drawn at
      // full rate, a software rasteriser (Xvfb, a VM without a GPU) took nearly all the CPU
      // from the work's nice +19 threads (docs/app.md, "How the grid fills"). Input still
      // draws at once.
      active_since_trim_ = true;
      const auto until = last_frame_start_ + std::chrono::milliseconds(100);
      for (auto now = frame_start; now < until && g_input_frames == 0; now = Clock::now())
        glfwWaitEventsTimeout(seconds(until - now));
    } else if (headless_ || busy || animating || input_pending) {
      active_since_trim_ = true;
      glfwPollEvents();
    } else {
      if (active_since_trim_ && seconds(frame_start - last_trim_) >= 2.0) {
        kvscope::app::return_free_memory();  // nothing to draw: the few milliseconds delay no frame
        active_since_trim_ = false;
        last_trim_ = frame_start;
      }
      glfwWaitEventsTimeout(0.5);  // still picture: sleep until input or a worker result
    }
  }

  // Finished jobs applied, the title and the fonts brought up to date.
  void before_frame() {
    using namespace kvscope::app;
    state_.worker.drain(state_);
    if (state_.capture_path != window_title_path_) {
      window_title_path_ = state_.capture_path;
      std::string title = "KVScope - " + window_title_path_;
      if (state_.info() && state_.info()->synthetic) title += " [SYNTHETIC]";
      glfwSetWindowTitle(window_, title.c_str());
    }
    if (ui_.take_font_rebuild()) {
      // A new UI scale: glyphs rasterised at the new size (crisp), not stretched.
      setup_style_and_fonts(ui_.ui_scale());
      ImGui_ImplOpenGL3_DestroyFontsTexture();
      ImGui_ImplOpenGL3_CreateFontsTexture();
      if (!headless_) save_ui_scale_pref(ui_.ui_scale());
    }
    ui_.before_frame();
    if (headless_ && is_svg_path(o_.screenshot))
      ImGui::GetStyle().AntiAliasedLines = ImGui::GetStyle().AntiAliasedFill = false;
  }

  // One ImGui frame of the app, with this frame's input.
  void draw_frame() {
    ImGui_ImplOpenGL3_NewFrame();
    ImGui_ImplGlfw_NewFrame();
    g_input.feed(ImGui::GetIO());
    if (g_input.pending()) note_input();  // the rest in the next frame, drawn at once
    // Screenshots show no hover state: Xvfb parks its pointer in the middle of the screen.
    if (headless_) ImGui::GetIO().MousePos = ImVec2(-FLT_MAX, -FLT_MAX);
    ImGui::NewFrame();
    g_input.after_new_frame(ImGui::GetIO());
    ui_.draw();
    ImGui::Render();
    ui_.after_render(ImGui::GetDrawData());
  }

  // Renders with GL, writes the PNGs asked for (F10, a --screenshot once ready), swaps.
  void present_and_capture() {
    using namespace kvscope::app;
    const uint64_t fp = frame_fingerprint(ImGui::GetDrawData());
    if (fp != last_fingerprint_) last_change_ = Clock::now();
    last_fingerprint_ = fp;
    std::vector<AppUi::PngRequest> requests = ui_.take_png_requests();
    // The picture on screen already: rendering it again would only spend the CPU (a software
    // rasteriser took about 10% of a core for the idle app's two frames a second).
    if (!headless_ && requests.empty() && fp == presented_fingerprint_ && !g_window_exposed) return;
    g_window_exposed = false;
    presented_fingerprint_ = fp;
    ui_.note_frame_presented();
    int fw = 0, fh = 0;
    glfwGetFramebufferSize(window_, &fw, &fh);
    glViewport(0, 0, fw, fh);
    glClearColor(0.09f, 0.10f, 0.11f, 1.0f);
    glClear(GL_COLOR_BUFFER_BIT);
    ImGui_ImplOpenGL3_RenderDrawData(ImGui::GetDrawData());
    const ImVec2 scale = ImGui::GetIO().DisplayFramebufferScale;
    std::vector<AppUi::PngRequest> dense;
    for (const auto& req : requests) {
      if (req.density > 1) {
        dense.push_back(req);  // after this frame is shown
        continue;
      }
      try {
        save_framebuffer_png(req.path, fw, fh, scale.x, scale.y, req.rect);
        state_.status_message = "wrote " + req.path;
      } catch (const std::exception& e) {
        state_.status_message = e.what();
      }
    }
    if (headless_) screenshot_when_ready(fw, fh, scale);
    glfwSwapBuffers(window_);
    for (const auto& req : dense) {
      try {
        save_dense_png(ui_, req);
        state_.status_message = "wrote " + req.path;
      } catch (const std::exception& e) {
        state_.status_message = e.what();
      }
    }
  }

  // --screenshot: once the view is ready (or the timeout has passed), the picture and the end.
  void screenshot_when_ready(int fw, int fh, ImVec2 scale) {
    using namespace kvscope::app;
    const HeadlessOptions& opt = o_.view;
    // Ready in two frames running: a frame may still move what the one before placed (a legend
    // that found no free place in its plot draws outside the data from the next frame on).
    ready_frames_ = ui_.ready_for_screenshot(opt.view) ? ready_frames_ + 1 : 0;
    const bool ready = ready_frames_ >= 2;
    const double waited = seconds(Clock::now() - t0_);
    if (ready && !state_.load_error.empty() && !state_.capture) {
      std::fprintf(stderr, "kvscope: error: %s\n", state_.load_error.c_str());
      fail(1);
      return;
    }
    if (!ready && waited <= opt.timeout_s) return;
    if (!ready) {
      std::fprintf(stderr, "kvscope: the %s view's work did not finish in %.0f s\n",
                   opt.view.c_str(), opt.timeout_s);
      rc_ = 3;
    }
    try {
      const ScreenRect rect = opt.full_window ? ScreenRect{} : ui_.view_rect(opt.view);
      if (is_svg_path(o_.screenshot))
        write_svg(o_.screenshot, ImGui::GetDrawData(), rect, IM_COL32(28, 31, 33, 255));
      else if (opt.density > 1)
        save_dense_png(ui_, {o_.screenshot, {}, 0, opt.density, opt.view});
      else
        save_framebuffer_png(o_.screenshot, fw, fh, scale.x, scale.y, rect);
      std::printf("kvscope: wrote %s\n", o_.screenshot.c_str());
    } catch (const std::exception& e) {
      std::fprintf(stderr, "kvscope: error: %s\n", e.what());
      rc_ = 1;
    }
    quit_ = true;
  }

  GLFWwindow* window_;
  kvscope::app::AppState& state_;
  kvscope::app::AppUi& ui_;
  const AppOptions& o_;
  const bool headless_;
  bool quit_ = false;
  int rc_ = 0;
  int ready_frames_ = 0;  // frames in a row the view was ready for its screenshot
  const Clock::time_point t0_ = Clock::now();
  Clock::time_point last_change_ = t0_;
  Clock::time_point last_input_ = t0_;  // the last frame that saw input
  Clock::time_point last_frame_start_ = t0_;
  uint64_t last_fingerprint_ = 0;
  uint64_t presented_fingerprint_ = 0;  // of the frame on screen
  std::string window_title_path_;
  // Free memory is given back once the app has gone still after activity (app/memory_stats.h).
  bool active_since_trim_ = false;
  Clock::time_point last_trim_ = t0_;
};

}  // namespace

int main(int argc, char** argv) {
  using namespace kvscope::app;
  // References of captures seen before are read back from the user's cache folder instead of
  // computed again (docs/performance.md, "Exact reference cache"; KVSCOPE_CACHE_DIR=off: never).
  kvscope::ReferenceCache::global().set_disk(kvscope::ReferenceCache::default_disk_dir(),
                                             kvscope::ReferenceCache::kDefaultDiskBudget);
  AppOptions o;
  if (const int rc = parse_options(argc, argv, o); rc >= 0) return rc;
  GLFWwindow* window = create_window(o);
  if (!window) return 1;

  IMGUI_CHECKVERSION();
  ImGui::CreateContext();
  setup_style_and_fonts(o.view.ui_scale);
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
    ui.set_ui_scale(o.view.ui_scale);
    ui.take_font_rebuild();  // built at this scale above
    ui.export_dir = o.export_dir;
    // File > Open recent, remembered in recent.json of the config folder (app/recent_files.h).
    if (!o.headless()) ui.enable_recent_files();
    // Autosave and recovery (app/autosave.h): never for screenshots.
    if (!o.headless()) ui.enable_autosave();
    FrameLoop loop(window, state, ui, o);
    ui.on_quit = [&loop] { loop.quit(); };
    glfwSetDropCallback(window, on_drop);
    glfwSetWindowRefreshCallback(window, on_window_refresh);
    try {
      apply_options(state, ui, o.view);
    } catch (const kvscope::InputError& e) {
      if (o.headless()) {
        std::fprintf(stderr, "kvscope: error: %s\n", e.what());
        loop.fail(1);
      } else {
        state.load_error = e.what();
      }
    }
    rc = loop.run();
    // A clean quit (File > Quit, the window closed): the autosave says so, and the next start
    // offers nothing.
    if (!o.headless()) ui.finish_autosave();
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
