#include "app/app_frame.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "app/app_state.h"
#include "app/colormap.h"
#include "app/export.h"
#include "app/result_status.h"
#include "app/view.h"
#include "engine/error.h"

namespace kvscope::app {
namespace fs = std::filesystem;

namespace {

// GLFW key codes of F9 and F10 (ImGui 1.86's GLFW backend indexes KeysDown by GLFW key code).
constexpr int GLFW_KEY_F8_CODE = 297;
constexpr int GLFW_KEY_F9_CODE = 298;
constexpr int GLFW_KEY_F10_CODE = 299;

constexpr float kLeftPanelWidth = 470.0f;

// A clear empty panel for a view whose source file has not been written yet.
class PendingView final : public View {
 public:
  PendingView(const char* name, const char* title, const char* what)
      : name_(name), title_(title), what_(what) {}
  const char* name() const override { return name_; }
  const char* title() const override { return title_; }
  void draw(AppState&) override {
    ImGui::TextDisabled("The %s view is not part of this build yet.", title_);
    ImGui::TextWrapped("%s", what_);
  }

 private:
  const char *name_, *title_, *what_;
};

std::string human_bytes(long long b) {
  char buf[64];
  if (b >= (1LL << 30))
    std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(b) / (1LL << 30));
  else if (b >= (1LL << 20))
    std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(b) / (1LL << 20));
  else
    std::snprintf(buf, sizeof buf, "%.1f KiB", static_cast<double>(b) / 1024.0);
  return buf;
}

}  // namespace

std::vector<std::unique_ptr<View>> make_views() {
  std::vector<std::unique_ptr<View>> v;
  v.push_back(make_capture_view());
  v.push_back(make_method_view());
  v.push_back(make_tokens_view());
#ifdef KVSCOPE_HAVE_VIEW_GEOMETRY
  v.push_back(make_geometry_view());
#else
  v.push_back(std::make_unique<PendingView>(
      "geometry", "Geometry",
      "2-D maps of the focused head's keys (PCA, t-SNE), coloured by kept/dropped, position, "
      "cluster or norm."));
#endif
#ifdef KVSCOPE_HAVE_VIEW_WALK
  v.push_back(make_walk_view());
#else
  v.push_back(std::make_unique<PendingView>(
      "walk", "Walk",
      "The self-balancing walk of BalanceKV block by block: path, p_i, partial sums and "
      "discrepancy against random signs."));
#endif
  v.push_back(make_error_view());
#ifdef KVSCOPE_HAVE_VIEW_TEACHING
  v.push_back(make_teaching_view());
#endif
  return v;
}

void setup_style_and_fonts(float font_px) {
  ImGuiIO& io = ImGui::GetIO();
  io.IniFilename = nullptr;  // layout is fixed; sessions hold what persists
  ImGui::StyleColorsDark();
  ImGuiStyle& st = ImGui::GetStyle();
  st.WindowRounding = 0;
  st.FrameRounding = 3;
  st.TabRounding = 3;
  st.GrabRounding = 3;
  st.WindowPadding = ImVec2(8, 8);
  st.ItemSpacing = ImVec2(8, 5);
  st.Colors[ImGuiCol_WindowBg] = ImVec4(0.09f, 0.10f, 0.11f, 1.0f);
  st.Colors[ImGuiCol_ChildBg] = ImVec4(0.11f, 0.12f, 0.13f, 1.0f);
  const char* candidates[] = {
#ifdef KVSCOPE_SOURCE_DIR
      KVSCOPE_SOURCE_DIR "/assets/DejaVuSans.ttf",
#endif
      "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"};
  for (const char* path : candidates) {
    std::error_code ec;
    if (fs::exists(path, ec)) {
      ImFontConfig cfg;
      cfg.OversampleH = 2;
      if (io.Fonts->AddFontFromFileTTF(path, font_px, &cfg, io.Fonts->GetGlyphRangesDefault()))
        return;
    }
  }
  io.Fonts->AddFontDefault();  // ImGui's built-in ProggyClean
}

AppUi::AppUi(AppState& s) : s_(s), views_(make_views()) {
  rects_.resize(views_.size());
  drawn_frames_.assign(views_.size(), 0);
  for (const std::string& v : s.settings.panel_view) show_view(v);
  show_view(s.settings.active_view);
}

View* AppUi::find_view(const std::string& name) const {
  for (const auto& v : views_)
    if (name == v->name()) return v.get();
  return nullptr;
}

void AppUi::show_view(const std::string& name) {
  View* v = find_view(name);
  if (!v) return;
  requested_[v->panel() == Panel::Left ? 0 : 1] = name;
}

ScreenRect AppUi::view_rect(const std::string& name) const {
  for (size_t i = 0; i < views_.size(); ++i)
    if (name == views_[i]->name()) return rects_[i];
  return {};
}

bool AppUi::ready_for_screenshot(const std::string& view_name) {
  View* v = find_view(view_name);
  if (!v) return true;
  size_t i = 0;
  while (views_[i].get() != v) ++i;
  bool idle = !s_.worker.busy() && s_.worker.pending_applies() == 0 && s_.loading_path.empty();
  idle_frames_ = idle ? idle_frames_ + 1 : 0;
  // Several idle frames: a view may queue work on its first draw, and ImGui needs a frame or
  // two to settle sizes of auto-fitting items.
  return idle_frames_ >= 4 && drawn_frames_[i] >= 4 && v->ready(s_);
}

std::vector<AppUi::PngRequest> AppUi::take_png_requests() {
  std::vector<PngRequest> out;
  for (auto& [req, frames] : png_requests_)
    if (--frames <= 0) out.push_back(req);
  std::erase_if(png_requests_, [](const auto& p) { return p.second <= 0; });
  return out;
}

void AppUi::save_session(const std::string& path) const {
  nlohmann::json j = s_.to_session();
  nlohmann::json vs = nlohmann::json::object();
  for (const auto& v : views_) {
    nlohmann::json st = v->save_state();
    if (!st.is_null()) vs[v->name()] = st;
  }
  j["views"] = vs;
  std::ofstream f(path);
  if (!f) throw InputError(path + ": cannot open for writing");
  f << j.dump(2) << "\n";
  if (!f) throw InputError(path + ": write failed");
}

void AppUi::load_session(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw InputError(path + ": cannot open session file");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    throw InputError(path + ": not valid JSON: " + e.what());
  }
  // Validate the whole session first: nothing changes when any field is wrong.
  try {
    s_.parse_session(j, nullptr);
    auto known_view = [&](const nlohmann::json& v) {
      return v.is_string() && find_view(v.get<std::string>()) != nullptr;
    };
    if (j.contains("active_view") && !known_view(j["active_view"]))
      throw InputError("session field \"active_view\": " + j["active_view"].dump() +
                       " is not a view of this build");
    if (j.contains("panels"))
      for (const auto& p : j["panels"])
        if (!known_view(p))
          throw InputError("session field \"panels\": " + p.dump() +
                           " is not a view of this build");
  } catch (const InputError& e) {
    throw InputError(path + ": " + e.what());
  }
  s_.apply_session(j);
  // Views' own choices: an entry a view cannot read is skipped (and said), the rest applies.
  if (j.contains("views")) {
    if (!j["views"].is_object()) {
      s_.notes.push_back("session field \"views\": not an object, view choices left as they were");
    } else {
      for (const auto& v : views_) {
        if (!j["views"].contains(v->name())) continue;
        const nlohmann::json before = v->save_state();
        try {
          v->load_state(j["views"][v->name()]);
        } catch (const std::exception& e) {
          if (!before.is_null()) v->load_state(before);
          s_.notes.push_back("session field \"views." + std::string(v->name()) + "\": ignored (" +
                             e.what() + ")");
        }
      }
    }
  }
  for (const std::string& p : s_.settings.panel_view) show_view(p);
  show_view(s_.settings.active_view);
}

void AppUi::export_all_json(const std::string& dir) const {
  fs::create_directories(dir);
  for (const auto& v : views_) {
    nlohmann::json j = v->export_json(s_);
    std::ofstream f(fs::path(dir) / (std::string(v->name()) + ".json"));
    f << j.dump(2) << "\n";
  }
  nlohmann::json st;
  st["session"] = s_.to_session();
  st["capture_path"] = s_.capture_path;
  st["load_error"] = s_.load_error;
  st["notes"] = s_.notes;
  st["loading"] = !s_.loading_path.empty();
  st["dialog_open"] = browser_.is_open() || save_dialog_open_;
  nlohmann::json rs = nlohmann::json::object();
  for (const auto& [name, r] : s_.results)
    rs[name] = {{"wanted", !r.want.empty()},
                {"fresh", r.fresh()},
                {"stale", r.stale()},
                {"has_value", r.has_value()},
                {"running", r.busy()},
                {"held_for_run", !r.held.empty()},
                {"cancelled", !r.cancelled.empty()},
                {"error", r.error},
                {"waiting", r.waiting},
                {"estimate_s", r.estimate_s},
                {"seconds", r.seconds}};
  st["results"] = rs;
  st["seconds_per_unit"] = s_.costs.measured_table();
  nlohmann::json items = nlohmann::json::object();
  for (const auto& [name, rect] : s_.ui_items) items[name] = rect;
  st["ui_items"] = items;
  std::ofstream f(fs::path(dir) / "state.json");
  f << st.dump(2) << "\n";
}

void AppUi::draw() {
  // One state model: finished jobs are applied, then every result's key is compared with the
  // settings (the views' own plans included) before anything is drawn.
  std::vector<NamedPlan> plans;
  for (const auto& v : views_)  // a view's own results are wanted while it is shown
    if (v->name() == s_.settings.panel_view[0] || v->name() == s_.settings.panel_view[1])
      v->plan(s_, plans);
  s_.reconcile(plans);
  s_.hovered_token = -1;
  s_.ui_items.clear();  // only what this frame draws
  const ImGuiViewport* vp = ImGui::GetMainViewport();
  ImGui::SetNextWindowPos(vp->Pos);
  ImGui::SetNextWindowSize(vp->Size);
  ImGuiWindowFlags flags = ImGuiWindowFlags_NoDecoration | ImGuiWindowFlags_NoMove |
                           ImGuiWindowFlags_NoBringToFrontOnFocus | ImGuiWindowFlags_MenuBar |
                           ImGuiWindowFlags_NoSavedSettings;
  ImGui::PushStyleVar(ImGuiStyleVar_WindowPadding, ImVec2(6, 6));
  ImGui::Begin("KVScope", nullptr, flags);
  ImGui::PopStyleVar();
  draw_menu();

  // Load errors stay visible until dismissed; the capture that was open stays open.
  if (!s_.load_error.empty()) {
    ImGui::PushStyleColor(ImGuiCol_ChildBg, ImVec4(0.35f, 0.08f, 0.08f, 1.0f));
    float h = ImGui::GetTextLineHeightWithSpacing() * 2 + 8;
    ImGui::BeginChild("##loaderror", ImVec2(0, h), true);
    ImGui::TextWrapped("Could not open: %s", s_.load_error.c_str());
    ImGui::SameLine();
    if (ImGui::SmallButton("Dismiss")) s_.load_error.clear();
    ImGui::EndChild();
    ImGui::PopStyleColor();
  }
  // Settings adjusted to fit the capture (or skipped session entries) are said once.
  if (!s_.notes.empty()) {
    ImGui::PushStyleColor(ImGuiCol_ChildBg, ImVec4(0.30f, 0.24f, 0.06f, 1.0f));
    float h = ImGui::GetTextLineHeightWithSpacing() * (std::min<size_t>(s_.notes.size(), 4) + 1);
    ImGui::BeginChild("##notes", ImVec2(0, h), true);
    for (const std::string& n : s_.notes) ImGui::TextWrapped("note: %s", n.c_str());
    if (ImGui::SmallButton("Dismiss notes")) s_.notes.clear();
    ImGui::EndChild();
    ImGui::PopStyleColor();
  }

  const float status_h = ImGui::GetFrameHeightWithSpacing() + 6;
  ImVec2 avail = ImGui::GetContentRegionAvail();
  draw_panel(Panel::Left, "##left", ImVec2(kLeftPanelWidth, avail.y - status_h));
  ImGui::SameLine();
  draw_panel(Panel::Main, "##main", ImVec2(0, avail.y - status_h));
  draw_status_bar();
  draw_dialogs();
  ImGui::End();
  if (export_json_pending_) {
    export_json_pending_ = false;
    try {
      export_all_json(export_dir);
      s_.status_message = "exported JSON to " + export_dir;
    } catch (const std::exception& e) {
      s_.status_message = e.what();
    }
  }
}

void AppUi::draw_menu() {
  if (!ImGui::BeginMenuBar()) return;
  // Ctrl+O / Ctrl+S / Ctrl+E. With the GLFW backend of ImGui 1.86, key indices are GLFW key
  // codes, which are the ASCII capitals for letters.
  const ImGuiIO& io = ImGui::GetIO();
  const bool ctrl = io.KeyCtrl && !io.WantTextInput;
  const bool key_open = ctrl && ImGui::IsKeyPressed('O', false);
  const bool key_save = ctrl && ImGui::IsKeyPressed('S', false);
  const bool key_export = ctrl && ImGui::IsKeyPressed('E', false);
  bool open_capture = key_open, save_session = key_save, export_png = key_export;
  if (!export_dir.empty()) {  // function keys type nothing: they work while a field is active
    // Written at the end of the frame, so widget rectangles are this frame's.
    // F8 does the same as F9, so a script can alternate keys (two quick taps of one key can
    // reach GLFW as an auto-repeat on a loaded X server).
    if (ImGui::IsKeyPressed(GLFW_KEY_F9_CODE, false) ||
        ImGui::IsKeyPressed(GLFW_KEY_F8_CODE, false))
      export_json_pending_ = true;
    if (ImGui::IsKeyPressed(GLFW_KEY_F10_CODE, false)) {
      View* v = find_view(s_.settings.active_view);
      png_requests_.push_back(
          {{(fs::path(export_dir) / (s_.settings.active_view + ".png")).string(),
            v ? view_rect(v->name()) : ScreenRect{}},
           1});
    }
  }
  const bool file_menu = ImGui::BeginMenu("File");
  record_item(s_, "menu:File");
  if (file_menu) {
    open_capture |= ImGui::MenuItem("Open capture...", "Ctrl+O");
    const bool open_session = ImGui::MenuItem("Open session...");
    record_item(s_, "menu:Open session");
    if (open_session) {
      browser_.open("Open session", "", {".json"}, [this](const std::string& p) {
        try {
          load_session(p);
          s_.status_message = "session loaded from " + p;
        } catch (const std::exception& e) {
          s_.load_error = e.what();  // names the field; nothing of the session was applied
        }
      });
    }
    save_session |= ImGui::MenuItem("Save session...", "Ctrl+S");
    ImGui::Separator();
    export_png |= ImGui::MenuItem("Export view as PNG...", "Ctrl+E");
    if (ImGui::MenuItem("Export view numbers (CSV/JSON)...")) {
      path_action_ = PathAction::ExportData;
      path_buf_ = "kvscope_" + s_.settings.active_view + ".csv";
      open_path_popup_ = true;
    }
    if (on_quit) {
      ImGui::Separator();
      if (ImGui::MenuItem("Quit")) on_quit();
    }
    ImGui::EndMenu();
  }
  if (open_capture) {
    std::string start =
        s_.capture_path.empty() ? "" : fs::path(s_.capture_path).parent_path().string();
    browser_.open("Open capture", start, {".safetensors", ".npz"},
                  [this](const std::string& p) { s_.request_open(p); });
  }
  if (save_session) {
    path_action_ = PathAction::SaveSession;
    path_buf_ = "kvscope_session.json";
    open_path_popup_ = true;
  }
  if (export_png) {
    path_action_ = PathAction::ExportPng;
    path_buf_ = "kvscope_" + s_.settings.active_view + ".png";
    open_path_popup_ = true;
  }
  if (ImGui::BeginMenu("View")) {
    for (const auto& v : views_)
      if (ImGui::MenuItem(v->title(), nullptr, s_.settings.active_view == v->name())) {
        show_view(v->name());
        s_.settings.active_view = v->name();
      }
    ImGui::EndMenu();
  }
  if (ImGui::BeginMenu("Help")) {
    ImGui::TextUnformatted("KVScope: looking inside KV-cache compression.");
    ImGui::TextDisabled("Drop a .safetensors / .npz capture on the window to open it.");
    ImGui::TextDisabled("Click a grid cell (Capture) to focus a layer and kv head.");
    ImGui::TextDisabled("Every setting change re-runs the focused head at once and the grid");
    ImGui::TextDisabled("in the background (status bar: progress and cancel).");
    ImGui::EndMenu();
  }
  // Right side: what is open.
  std::string right;
  if (const CaptureInfo* ci = s_.info())
    right = fs::path(s_.capture_path).filename().string() + (ci->synthetic ? "  [SYNTHETIC]" : "");
  if (!s_.loading_path.empty())
    right = "opening " + fs::path(s_.loading_path).filename().string() + "...";
  if (!right.empty()) {
    float w = ImGui::CalcTextSize(right.c_str()).x;
    ImGui::SameLine(ImGui::GetWindowWidth() - w - 20);
    ImGui::TextDisabled("%s", right.c_str());
  }
  ImGui::EndMenuBar();
}

void AppUi::draw_panel(Panel panel, const char* id, ImVec2 size) {
  ImGui::BeginChild(id, size, true);
  const size_t pi = panel == Panel::Left ? 0 : 1;
  if (ImGui::BeginTabBar(id)) {
    for (size_t i = 0; i < views_.size(); ++i) {
      View& v = *views_[i];
      if (v.panel() != panel) continue;
      ImGuiTabItemFlags tf = requested_[pi] == v.name() ? ImGuiTabItemFlags_SetSelected : 0;
      const bool open = ImGui::BeginTabItem(v.title(), nullptr, tf);
      record_item(s_, std::string("tab:") + v.name());
      if (open) {
        std::string& shown = s_.settings.panel_view[pi];
        if (requested_[pi] == v.name()) {
          requested_[pi].clear();  // shown by show_view: settings.active_view is already set
          shown = v.name();
        } else if (requested_[pi].empty()) {
          if (shown != v.name()) s_.settings.active_view = v.name();  // the user picked a tab
          shown = v.name();
        }  // else: another tab is being brought up; the settings already name it
        ImVec2 p0 = ImGui::GetCursorScreenPos();
        ImVec2 av = ImGui::GetContentRegionAvail();
        // The rectangle covers the panel (tab bar included) so exported PNGs read on their own.
        ImVec2 wp = ImGui::GetWindowPos(), ws = ImGui::GetWindowSize();
        rects_[i] = {wp.x, wp.y, wp.x + ws.x, wp.y + ws.y};
        (void)p0;
        (void)av;
        ImGui::BeginChild("##view", ImVec2(0, 0), false);
        v.draw(s_);
        ImGui::EndChild();
        ++drawn_frames_[i];
        ImGui::EndTabItem();
      } else {
        drawn_frames_[i] = 0;
      }
    }
    ImGui::EndTabBar();
  }
  ImGui::EndChild();
}

void AppUi::draw_status_bar() {
  ImGui::Separator();
  if (const CaptureInfo* ci = s_.info()) {
    ImGui::Text("%s | L%d H%d | resident %s | backend %s", ci->model.c_str(),
                s_.settings.focus.layer, s_.settings.focus.kv_head,
                human_bytes(s_.capture->resident_bytes()).c_str(), s_.backend_active.c_str());
  } else {
    ImGui::TextDisabled("no capture open (File > Open capture, or drop a file on the window)");
  }
  auto jobs = s_.worker.jobs();
  for (const auto& j : jobs) {
    if (!j.running) continue;
    ImGui::SameLine();
    ImGui::TextDisabled("|");
    ImGui::SameLine();
    float frac = j.total > 0 ? static_cast<float>(j.done) / static_cast<float>(j.total) : 0.0f;
    char overlay[160];
    if (j.total > 0)
      std::snprintf(overlay, sizeof overlay, "%s %d/%d", j.label.c_str(), j.done, j.total);
    else
      std::snprintf(overlay, sizeof overlay, "%s...", j.label.c_str());
    ImGui::ProgressBar(j.total > 0 ? frac : 0.0f, ImVec2(220, 0), overlay);
    ImGui::SameLine();
    ImGui::PushID(j.key.c_str());
    if (ImGui::SmallButton("cancel")) {
      if (s_.results.count(j.key))
        s_.cancel_job(j.key);  // stays cancelled until Run
      else
        s_.worker.cancel(j.key);
    }
    ImGui::PopID();
  }
  int queued = 0;
  for (const auto& j : jobs) queued += j.running ? 0 : 1;
  if (queued) {
    ImGui::SameLine();
    ImGui::TextDisabled("(+%d queued)", queued);
  }
  if (!s_.status_message.empty()) {
    ImGui::SameLine();
    ImGui::TextDisabled("| %s", s_.status_message.c_str());
  }
}

void AppUi::draw_dialogs() {
  browser_.draw(&s_.ui_items);
  if (open_path_popup_) {
    ImGui::OpenPopup("Save as");
    open_path_popup_ = false;
    focus_path_field_ = true;
  }
  ImGui::SetNextWindowSize(ImVec2(620, 0), ImGuiCond_Appearing);
  save_dialog_open_ = ImGui::BeginPopupModal("Save as", nullptr, ImGuiWindowFlags_AlwaysAutoResize);
  if (save_dialog_open_) {
    const char* what = path_action_ == PathAction::ExportPng ? "PNG of the active view"
                       : path_action_ == PathAction::ExportData
                           ? "numbers of the active view (.csv or .json)"
                           : "session (.json)";
    ImGui::Text("Write the %s to:", what);
    char buf[1024];
    std::snprintf(buf, sizeof buf, "%s", path_buf_.c_str());
    ImGui::SetNextItemWidth(600);
    if (focus_path_field_) {
      ImGui::SetKeyboardFocusHere();
      focus_path_field_ = false;
    }
    // Enter saves, Escape cancels.
    const bool enter =
        ImGui::InputText("##savepath", buf, sizeof buf,
                         ImGuiInputTextFlags_EnterReturnsTrue | ImGuiInputTextFlags_AutoSelectAll);
    path_buf_ = buf;
    const bool escape = ImGui::IsKeyPressed(ImGui::GetKeyIndex(ImGuiKey_Escape), false);
    if (ImGui::Button("Save", ImVec2(90, 0)) || enter) {
      try {
        View* v = find_view(s_.settings.active_view);
        if (path_action_ == PathAction::ExportPng) {
          png_requests_.push_back({{path_buf_, v ? view_rect(v->name()) : ScreenRect{}}, 2});
        } else if (path_action_ == PathAction::ExportData) {
          if (!v) throw InputError("export: no active view");
          export_view_data(*v, s_, path_buf_);
          s_.status_message = "wrote " + path_buf_;
        } else {
          save_session(path_buf_);
          s_.status_message = "session saved to " + path_buf_;
        }
      } catch (const std::exception& e) {
        s_.status_message = e.what();
      }
      ImGui::CloseCurrentPopup();
    }
    ImGui::SameLine();
    if (ImGui::Button("Cancel", ImVec2(90, 0)) || escape) ImGui::CloseCurrentPopup();
    ImGui::EndPopup();
  }
}

}  // namespace kvscope::app
