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
#include "app/view.h"

namespace kvscope::app {

struct AppState;

struct ScreenRect {
  float x0 = 0, y0 = 0, x1 = 0, y1 = 0;
  bool empty() const { return x1 <= x0 || y1 <= y0; }
};

// ImGui style and fonts shared by the app and the headless renderer (DejaVu Sans when present).
void setup_style_and_fonts(float font_px = 15.0f);

class AppUi {
 public:
  explicit AppUi(AppState& s);

  // Draws one frame (between ImGui::NewFrame and ImGui::Render).
  void draw();

  View* find_view(const std::string& name) const;
  const std::vector<std::unique_ptr<View>>& views() const { return views_; }
  // Brings a view's tab to the front (next frame).
  void show_view(const std::string& name);
  // Screen rectangle where the named view was last drawn (empty if it has not been drawn).
  ScreenRect view_rect(const std::string& name) const;

  // Headless screenshots: true once the shown view has been drawn for a few frames with the
  // worker idle, nothing left to apply and the view saying it is ready.
  bool ready_for_screenshot(const std::string& view_name);

  // A PNG export the UI asked for this frame; the renderer (GL or software) performs it after
  // the frame is rendered. `rect` empty: whole window.
  struct PngRequest {
    std::string path;
    ScreenRect rect;
  };
  std::vector<PngRequest> take_png_requests();
  // Set by the app so File > Quit works; not set headless.
  std::function<void()> on_quit;

  // Session save / load with the views' own states. load_session validates the whole file
  // before changing anything and throws InputError naming the field and the problem.
  void save_session(const std::string& path) const;
  void load_session(const std::string& path);

  // With a folder set (kvscope --export-dir DIR): F9 writes every view's numbers and the app's
  // state as JSON there, F10 a PNG of the active view (what the GUI test reads).
  std::string export_dir;
  void export_all_json(const std::string& dir) const;

 private:
  void draw_menu();
  void draw_panel(Panel panel, const char* id, ImVec2 size);
  void draw_status_bar();
  void draw_dialogs();

  AppState& s_;
  std::vector<std::unique_ptr<View>> views_;
  std::vector<ScreenRect> rects_;  // per view
  std::vector<int> drawn_frames_;  // consecutive frames each view was drawn
  std::string requested_[2];       // tab to select next frame, per panel
  int idle_frames_ = 0;
  FileBrowser browser_;
  // PNG exports wait two frames, so that the dialog that asked for them is gone.
  std::vector<std::pair<PngRequest, int>> png_requests_;
  // Export / session path dialog
  enum class PathAction { None, ExportPng, ExportData, SaveSession };
  PathAction path_action_ = PathAction::None;
  std::string path_buf_;
  bool open_path_popup_ = false;
  bool focus_path_field_ = false;
  bool export_json_pending_ = false;
  bool save_dialog_open_ = false;  // the "Save as" popup was drawn this frame
};

}  // namespace kvscope::app
