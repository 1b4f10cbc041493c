// The KVScope window, drawn the same way by the GL app (app/main.cpp) and by the headless
// software renderer (kvscope-cli render): menu bar, a left panel (Capture, Method), a main panel
// (Tokens, Geometry, Walk, Error, ...), the status bar with job progress, and the file browser,
// export and session dialogs. No GL in here.
#pragma once

#include <imgui.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "app/file_browser.h"
#include "app/ui_layout.h"
#include "app/views/view.h"

namespace kvscope::app {

struct AppState;

struct ScreenRect {
  float x0 = 0, y0 = 0, x1 = 0, y1 = 0;
  bool empty() const { return x1 <= x0 || y1 <= y0; }
};

// ImGui style and fonts shared by the app and the headless renderer (DejaVu Sans when present),
// at a UI scale (for a projector): the font atlas is rebuilt with glyphs rasterised at
// 15 px x scale, so large text stays crisp, and the style's sizes are scaled to match. The GL
// app must recreate its font texture afterwards (ImGui_ImplOpenGL3_DestroyFontsTexture /
// CreateFontsTexture); the software renderer re-reads it (soft_font_texture).
constexpr float kBaseFontPx = 15.0f;
constexpr float kMinUiScale = 1.0f, kMaxUiScale = 2.5f;
void setup_style_and_fonts(float ui_scale = 1.0f);

// UI preferences remembered across runs of the app (the UI scale), in
// $KVSCOPE_CONFIG_DIR or $XDG_CONFIG_HOME/kvscope or ~/.config/kvscope, file ui.json.
float load_ui_scale_pref();
void save_ui_scale_pref(float scale);

// The app's keyboard shortcuts: one table that the key handling reads every frame and the Help
// window lists, so the two cannot drift. Keys are ImGui 1.86 key indices, which with the GLFW
// backend are GLFW key codes (ASCII capitals for letters).
enum class Command {
  OpenCapture,
  SaveSession,
  ExportPng,
  Larger,
  Smaller,
  ResetScale,
  Help,
  CloseMenu,
  ExportJson,
  ExportPngNow,
  Present
};
struct Shortcut {
  Command command;
  bool ctrl;                // with Ctrl held and no text field taking the keys
  std::vector<int> keys;    // any of these
  const char* label;        // "Ctrl+O"
  const char* action;       // what it does
  bool export_dir = false;  // only with kvscope --export-dir DIR
};
const std::vector<Shortcut>& shortcuts();

// The repository's documents the Help window points to (paths relative to the repository):
// README.md and every docs/*.md of this build's source tree, each described by its title (its
// first "# " line), read from the folder so a new document is listed without naming it here.
struct HelpDoc {
  std::string path;  // "docs/app.md"
  std::string what;
};
const std::vector<HelpDoc>& help_docs();
// The document's absolute path in this build's source tree ("" when it is not there).
std::string help_doc_file(const HelpDoc& doc);

class RecentFiles;
class Autosave;

class AppUi {
 public:
  explicit AppUi(AppState& s);
  ~AppUi();

  // Draws one frame (between ImGui::NewFrame and ImGui::Render).
  void draw();

  View* find_view(const std::string& name) const;
  const std::vector<std::unique_ptr<View>>& views() const { return views_; }
  // Brings a view's tab to the front (next frame).
  void show_view(const std::string& name);
  // Screen rectangle where the named view was last drawn (empty if it has not been drawn): the
  // view's own area (no tab bar), from its figure top (mark_figure_top) down when it set one.
  ScreenRect view_rect(const std::string& name) const;
  // The whole area of the view including its toolbar (still without the tab bar).
  ScreenRect view_area(const std::string& name) const;
  // How far the named view scrolled sideways could go when last drawn (0: it fits its width).
  float view_scroll_max_x(const std::string& name) const;

  // UI scale (for a projector, 1x..2.5x; Ctrl +/- and Ctrl 0). A change takes effect at the
  // next frame: the renderer calls take_font_rebuild() before NewFrame and, when it returns
  // true, calls setup_style_and_fonts(ui_scale()) and rebuilds its font texture.
  float ui_scale() const { return ui_scale_; }
  void set_ui_scale(float scale);
  bool take_font_rebuild();
  // Presentation (F11; Escape or F11 leaves): the active view alone over the whole window, no
  // menu, panels or tabs; views keep their figure and playback controls and drop their settings
  // rows (presenting_view(), app/ui_layout.h).
  bool presenting() const { return presenting_; }
  void set_presenting(bool on) { presenting_ = on; }
  // Left panel width in pixels (the draggable splitter); <= 0: the default for the window.
  float left_panel_width() const { return left_w_; }
  void set_left_panel_width(float w) { left_w_ = w; }

  // SVG exports: call before_frame() before ImGui::NewFrame() (turns anti-aliasing off for a
  // frame an SVG was asked for) and after_render() after ImGui::Render() (writes the SVGs from
  // that frame's draw lists and restores anti-aliasing).
  void before_frame();
  void after_render(const ImDrawData* dd);
  void request_svg(const std::string& path, const std::string& view_name);

  // Headless screenshots: true once the shown view has been drawn for a few frames with the
  // worker idle, nothing left to apply and the view saying it is ready.
  bool ready_for_screenshot(const std::string& view_name);

  // A keyboard command, as its shortcut or menu item runs it (tests open the dialogs so).
  void run_command(Command c);

  // A PNG export the UI asked for this frame; the renderer (GL or software) performs it after
  // the frame is rendered. `rect` empty: whole window.
  struct PngRequest {
    std::string path;
    ScreenRect rect;
    int wait_frames = 0;  // frames to let a closing dialog disappear before the capture
    // > 1: the renderer draws the frame again at this many pixels per layout pixel (UI scale
    // and window size multiplied, fonts rebuilt: crisp) and rasterises it on the CPU; `view`
    // names the view whose figure to cut out of that frame.
    float density = 1.0f;
    std::string view;
  };
  std::vector<PngRequest> take_png_requests();
  // Set by the app so File > Quit works; not set headless.
  std::function<void()> on_quit;

  // Session save / load with the views' own states. load_session validates the whole file
  // before changing anything and throws InputError naming the file, the field and the problem.
  void save_session(const std::string& path) const;
  void load_session(const std::string& path);
  // The same for a parsed session (kvscope-cli render --session goes through load_session):
  // check_session checks every field of the settings and of the views' own states and throws
  // InputError naming the field ("session field \"views.geometry.perplexity\": ..."), changing
  // nothing; load_session_json checks, then applies.
  void check_session(const nlohmann::json& j) const;
  void load_session_json(const nlohmann::json& j);

  // Help window (Help > KVScope help, F1): shortcuts, the views, the documents to read.
  bool help_open() const { return help_open_; }
  void set_help_open(bool open) { help_open_ = open; }
  // File > Open recent: remembers the captures and sessions opened from now on in
  // config_dir()/recent.json (the interactive app turns it on; tests and headless renders leave
  // it off unless they ask). A damaged list is ignored with a status message.
  void enable_recent_files();
  const RecentFiles* recent_files() const { return recent_.get(); }
  // Autosave and recovery (app/autosave.h): the interactive app turns it on. Reads what the last
  // run left in config_dir()/autosave.json (`file` empty) and offers to restore it when that run
  // did not quit cleanly; a damaged file is set aside with a status message. From then on every
  // frame hands the session to the autosave (written a few seconds after it last changed).
  void enable_autosave(const std::string& file = "", double delay_s = 3.0);
  // Clean quit: the last session written with "clean_exit": true (the app calls it).
  void finish_autosave();
  const Autosave* autosave() const { return autosave_.get(); }
  bool restore_prompt_open() const { return restore_pending_; }
  // The session as File > Save session writes it: settings plus the views' own states.
  nlohmann::json session_json() const;

  // With a folder set (kvscope --export-dir DIR): F9 writes every view's numbers and the app's
  // state as JSON there, F10 a PNG of the active view (what the GUI test reads).
  std::string export_dir;
  void export_all_json(const std::string& dir) const;
  // Frame times (the soak test, docs/testing.md): the renderer reports each frame's work, from
  // the end of its wait for events to the buffer swap (`ms`), and the app's own part of it
  // (`app_ms`: applying results, reconcile(), the views' drawing and ImGui's draw lists, before
  // any GL call; under Xvfb the rest is the software rasteriser, which a GPU does instead), both
  // wall time, and the CPU time the UI thread spent on that own part (`app_cpu_ms`: what the app
  // costs whatever else the machine runs; a loaded machine stretches the wall times, not this).
  // state.json exports how many frames were drawn (a heartbeat) and the last kFrameRing of each.
  static constexpr size_t kFrameRing = 1024;
  void note_frame_time(double ms, double app_ms, double app_cpu_ms);
  // A frame was rendered and shown; the frame loop skips frames equal to the one on screen
  // (state.json: frames.presented of frames.count).
  void note_frame_presented() { ++presented_frames_; }

 private:
  void draw_menu();
  void draw_panel(Panel panel, const char* id, ImVec2 size);
  // Draws views_[i] into the current child window and notes where (areas_, rects_).
  void draw_view_in_child(size_t i);
  // The active view alone over `size` (presentation).
  void draw_presented(ImVec2 size);
  void draw_status_bar();
  void draw_dialogs();
  void handle_keys();
  // AppState::reconcile with the plans of the views shown.
  void reconcile();
  void close_popups_and_menus();
  void draw_help();
  void draw_recent_menu();
  void note_recent();

  AppState& s_;
  std::vector<std::unique_ptr<View>> views_;
  std::vector<ScreenRect> rects_;  // per view
  std::vector<int> drawn_frames_;  // consecutive frames each view was drawn
  std::string requested_[2];       // tab to select next frame, per panel
  int idle_frames_ = 0;
  FileBrowser browser_;
  std::vector<PngRequest> png_requests_;
  struct SvgRequest {
    std::string path, view;
    int wait_frames = 2;
  };
  std::vector<SvgRequest> svg_requests_;
  bool svg_frame_ = false;  // this frame is drawn without anti-aliasing for an SVG
  bool saved_aa_lines_ = true, saved_aa_fill_ = true;
  std::vector<ScreenRect> areas_;    // per view: the view's whole area
  std::vector<float> scroll_max_x_;  // per view: ImGui's ScrollMaxX of its child window
  float ui_scale_ = 1.0f;
  bool font_rebuild_ = false;
  float left_w_ = 0;  // <= 0: default
  bool presenting_ = false;
  void draw_splitter(float height);
  // Export / session path dialog
  enum class PathAction { None, ExportPng, ExportPng2x, ExportSvg, ExportData, SaveSession };
  PathAction path_action_ = PathAction::None;
  std::string path_buf_;
  bool open_path_popup_ = false;
  bool focus_path_field_ = false;
  bool export_json_pending_ = false;
  bool save_dialog_open_ = false;  // the "Save as" popup was drawn this frame
  bool help_open_ = false;
  bool help_focus_ = false;  // bring the Help window to the front next frame
  std::unique_ptr<RecentFiles> recent_;
  std::string recent_seen_path_;  // capture path last noted in the recent list
  std::unique_ptr<Autosave> autosave_;
  uint64_t frames_ = 0;             // frames reported by note_frame_time
  uint64_t presented_frames_ = 0;   // of those, rendered and shown (note_frame_presented)
  std::vector<float> frame_ms_;     // ring: frame i at i % kFrameRing
  std::vector<float> app_ms_;       // the same frames' own work (note_frame_time)
  std::vector<float> app_cpu_ms_;   // ... and its CPU time on the UI thread
  nlohmann::json restore_session_;  // what the restore prompt offers
  std::string restore_text_;        // the prompt's line: when it was saved, which capture
  bool restore_pending_ = false;    // the prompt is up (opened at the next frame)
  bool restore_open_popup_ = false;
  void draw_restore_prompt();
  void tick_autosave();
};

}  // namespace kvscope::app
