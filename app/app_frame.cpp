#include "app/app_frame.h"

#include <imgui_internal.h>  // the open popup stack (Escape closes menus and lists)
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>

#include "app/app_state.h"
#include "app/autosave.h"
#include "app/colormap.h"
#include "app/export.h"
#include "app/memory_stats.h"
#include "app/new_capture_dialog.h"
#include "app/recent_files.h"
#include "app/result_status.h"
#include "app/views/view.h"
#include "engine/core/error.h"
#include "engine/eval/reference_cache.h"
#include "engine/io/json_fields.h"
#include "engine/io/json_limits.h"

namespace kvscope::app {
namespace fs = std::filesystem;

namespace {

constexpr float kLeftPanelWidth = 470.0f;  // default at scale 1 on a wide window
constexpr float kSplitterWidth = 6.0f;

// GLFW key codes (ImGui 1.86's GLFW backend indexes KeysDown by GLFW key code).
constexpr int GLFW_KEY_ESCAPE_CODE = 256;
constexpr int GLFW_KEY_F1_CODE = 290;
constexpr int GLFW_KEY_F8_CODE = 297;
constexpr int GLFW_KEY_F9_CODE = 298;
constexpr int GLFW_KEY_F10_CODE = 299;
constexpr int GLFW_KEY_F11_CODE = 300;
constexpr int GLFW_KEY_KP_SUBTRACT_CODE = 333;
constexpr int GLFW_KEY_KP_ADD_CODE = 334;

}  // namespace

const std::vector<Shortcut>& shortcuts() {
  static const std::vector<Shortcut> table = {
      {Command::OpenCapture, true, {'O'}, "Ctrl+O", "open a capture (.safetensors, .npz)"},
      {Command::SaveSession, true, {'S'}, "Ctrl+S", "save the session (every setting) as JSON"},
      {Command::ExportPng, true, {'E'}, "Ctrl+E", "export the active view's figure as PNG"},
      {Command::Larger,
       true,
       {'=', GLFW_KEY_KP_ADD_CODE},
       "Ctrl +",
       "larger UI (for a projector, up to 2.5x)"},
      {Command::Smaller, true, {'-', GLFW_KEY_KP_SUBTRACT_CODE}, "Ctrl -", "smaller UI"},
      {Command::ResetScale, true, {'0'}, "Ctrl 0", "UI scale back to 1x"},
      {Command::Help, false, {GLFW_KEY_F1_CODE}, "F1", "this help"},
      {Command::CloseMenu,
       false,
       {GLFW_KEY_ESCAPE_CODE},
       "Escape",
       "close the open menu or list, else the dialog, this help or the presentation"},
      {Command::ExportJson,
       false,
       {GLFW_KEY_F9_CODE, GLFW_KEY_F8_CODE},
       "F9 (or F8)",
       "write every view's numbers and state.json to the export folder",
       true},
      {Command::ExportPngNow,
       false,
       {GLFW_KEY_F10_CODE},
       "F10",
       "write a PNG of the active view's figure to the export folder",
       true},
      {Command::Present,
       false,
       {GLFW_KEY_F11_CODE},
       "F11",
       "presentation: the active view's figure and its playback controls over the whole window "
       "(F11 or Escape leaves)"},
  };
  return table;
}

const std::vector<HelpDoc>& help_docs() {
  static const std::vector<HelpDoc> docs = [] {
    std::vector<HelpDoc> out;
#ifdef KVSCOPE_SOURCE_DIR
    const fs::path root(KVSCOPE_SOURCE_DIR);
    // A document's title: its first "# " line.
    auto title = [&](const std::string& rel) {
      std::ifstream in(root / rel);
      std::string line;
      while (std::getline(in, line))
        if (line.rfind("# ", 0) == 0) return line.substr(2);
      return std::string();
    };
    std::error_code ec;
    if (fs::exists(root / "README.md", ec)) out.push_back({"README.md", title("README.md")});
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(root / "docs", ec))
      if (e.is_regular_file() && e.path().extension() == ".md")
        names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    // docs/app.md (this app) first, the others by name.
    std::stable_partition(names.begin(), names.end(),
                          [](const std::string& n) { return n == "app.md"; });
    for (const std::string& n : names) out.push_back({"docs/" + n, title("docs/" + n)});
#endif
    return out;
  }();
  return docs;
}

std::string help_doc_file(const HelpDoc& doc) {
#ifdef KVSCOPE_SOURCE_DIR
  std::error_code ec;
  const fs::path p = fs::path(KVSCOPE_SOURCE_DIR) / doc.path;
  if (fs::exists(p, ec)) return p.string();
#endif
  return "";
}

std::vector<std::unique_ptr<View>> make_views() {
  // The one list of views: tabs, --view, render, the help window, sessions and the tests all
  // come from it (view_names()).
  std::vector<std::unique_ptr<View>> v;
  v.push_back(make_capture_view());
  v.push_back(make_method_view());
  v.push_back(make_tokens_view());
  v.push_back(make_geometry_view());
  v.push_back(make_walk_view());
  v.push_back(make_error_view());
  v.push_back(make_output_view());
  v.push_back(make_teaching_view());
  v.push_back(make_theory_view());
  v.push_back(make_set_view());
  for (const ViewFactory& make : registered_views()) v.push_back(make());  // register_view
  return v;
}

std::vector<std::string> view_names() {
  std::vector<std::string> out;
  for (const auto& v : make_views()) out.push_back(v->name());
  return out;
}

std::string view_names_text() {
  std::string out;
  for (const std::string& n : view_names()) out += (out.empty() ? "" : ", ") + n;
  return out;
}

void setup_style_and_fonts(float ui_scale) {
  ui_scale = std::clamp(ui_scale, kMinUiScale, kMaxUiScale);
  set_ui_scale(ui_scale);
  ImGuiIO& io = ImGui::GetIO();
  io.IniFilename = nullptr;  // layout is fixed; sessions hold what persists
  ImGuiStyle& st = ImGui::GetStyle();
  st = ImGuiStyle();  // from the defaults, so repeated rescaling does not compound
  ImGui::StyleColorsDark();
  st.WindowRounding = 0;
  st.FrameRounding = 3;
  st.TabRounding = 3;
  st.GrabRounding = 3;
  st.WindowPadding = ImVec2(8, 8);
  st.ItemSpacing = ImVec2(8, 5);
  st.Colors[ImGuiCol_WindowBg] = ImVec4(0.09f, 0.10f, 0.11f, 1.0f);
  st.Colors[ImGuiCol_ChildBg] = ImVec4(0.11f, 0.12f, 0.13f, 1.0f);
  st.ScaleAllSizes(ui_scale);
  io.Fonts->Clear();
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
      if (io.Fonts->AddFontFromFileTTF(path, std::round(kBaseFontPx * ui_scale), &cfg,
                                       io.Fonts->GetGlyphRangesDefault())) {
        io.Fonts->Build();
        return;
      }
    }
  }
  ImFontConfig cfg;
  cfg.SizePixels = std::round(13.0f * ui_scale);
  io.Fonts->AddFontDefault(&cfg);  // ImGui's built-in ProggyClean
  io.Fonts->Build();
}

namespace {
fs::path prefs_file() {
  if (const char* d = std::getenv("KVSCOPE_CONFIG_DIR"); d && *d) return fs::path(d) / "ui.json";
  if (const char* x = std::getenv("XDG_CONFIG_HOME"); x && *x)
    return fs::path(x) / "kvscope" / "ui.json";
  if (const char* h = std::getenv("HOME"); h && *h)
    return fs::path(h) / ".config" / "kvscope" / "ui.json";
  return {};
}
}  // namespace

float load_ui_scale_pref() {
  const fs::path p = prefs_file();
  if (p.empty()) return 1.0f;
  std::ifstream f(p);
  if (!f) return 1.0f;
  try {
    nlohmann::json j = nlohmann::json::parse(f);
    return std::clamp(j.value("ui_scale", 1.0f), kMinUiScale, kMaxUiScale);
  } catch (const std::exception&) {
    return 1.0f;  // a damaged preferences file only loses the preference
  }
}

void save_ui_scale_pref(float scale) {
  const fs::path p = prefs_file();
  if (p.empty()) return;
  std::error_code ec;
  fs::create_directories(p.parent_path(), ec);
  nlohmann::json j;
  {
    std::ifstream in(p);
    if (in) try {
        j = nlohmann::json::parse(in);
      } catch (const std::exception&) {
        j = nlohmann::json::object();
      }
  }
  if (!j.is_object()) j = nlohmann::json::object();
  j["ui_scale"] = scale;
  std::ofstream out(p);
  if (out) out << j.dump(2) << "\n";
}

AppUi::AppUi(AppState& s) : s_(s), views_(make_views()) {
  rects_.resize(views_.size());
  areas_.resize(views_.size());
  scroll_max_x_.assign(views_.size(), 0.0f);
  drawn_frames_.assign(views_.size(), 0);
  for (const std::string& v : s.settings.panel_view) show_view(v);
  show_view(s.settings.active_view);
}

AppUi::~AppUi() = default;

void AppUi::enable_recent_files() {
  recent_ = std::make_unique<RecentFiles>();
  const std::string why = recent_->load();
  if (!why.empty()) s_.status_message = why;  // a damaged list is only lost, never fatal
  // A first start (nothing opened before): the status line says where to begin.
  else if (recent_->entries().empty())
    s_.status_message =
        "first steps: the grid on the left is method A's error per layer and kv head (click a "
        "cell to focus it); the Method tab changes the method and keep ratio; F1: help";
  recent_seen_path_.clear();
}

void AppUi::enable_autosave(const std::string& file, double delay_s) {
  autosave_ = std::make_unique<Autosave>(fs::path(file), delay_s);
  const Autosave::Found found =
      autosave_->recover([this](const nlohmann::json& j) { check_session(j); });
  if (!found.problem.empty()) s_.status_message = found.problem;  // set aside, never fatal
  if (!found.offer) return;
  restore_session_ = found.session;
  restore_text_ =
      "saved " + (found.saved.empty() ? std::string("?") : found.saved) + ", capture " +
      (found.capture.empty() ? std::string("(none)") : fs::path(found.capture).filename().string());
  restore_pending_ = restore_open_popup_ = true;
  autosave_->hold(true);  // the file is the crashed run's session until the user answers
}

void AppUi::finish_autosave() {
  if (!autosave_) return;
  const std::string why = autosave_->finish(session_json());
  if (!why.empty()) std::fprintf(stderr, "kvscope: %s\n", why.c_str());
}

void AppUi::tick_autosave() {
  if (!autosave_) return;
  const double now =
      std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  const std::string why = autosave_->update(session_json(), now);
  if (!why.empty()) s_.status_message = why;
}

void AppUi::draw_restore_prompt() {
  if (!restore_pending_) return;
  if (restore_open_popup_) {
    ImGui::OpenPopup("Restore the last session?");
    restore_open_popup_ = false;
  }
  fit_next_dialog_to_display();
  if (!ImGui::BeginPopupModal("Restore the last session?", nullptr,
                              ImGuiWindowFlags_AlwaysAutoResize))
    return;
  keep_dialog_on_screen();
  ImGui::Text("KVScope did not quit cleanly last time.");
  ImGui::Text("Restore the last session? (%s)", restore_text_.c_str());
  const float w = dialog_button_width("Discard");
  const bool restore = ImGui::Button("Restore", ImVec2(w, 0));
  record_item(s_, "button:Restore autosave");
  ImGui::SameLine();
  const bool discard = ImGui::Button("Discard", ImVec2(w, 0));
  record_item(s_, "button:Discard autosave");
  if (restore) {
    try {
      load_session_json(restore_session_);
      s_.status_message = "restored the last session (" + restore_text_ + ")";
    } catch (const std::exception& e) {
      // e.g. its capture is not there any more: the load error says which file.
      s_.load_error = autosave_->file().string() + ": " + e.what();
    }
  } else if (discard) {
    s_.status_message = "discarded the last session (" + restore_text_ + ")";
  }
  if (restore || discard) {
    restore_pending_ = false;
    restore_session_ = nullptr;
    autosave_->hold(false);
    ImGui::CloseCurrentPopup();
  }
  ImGui::EndPopup();
}

void AppUi::note_recent() {
  if (!recent_ || !s_.capture || s_.capture_path == recent_seen_path_) return;
  recent_seen_path_ = s_.capture_path;
  // The app's own temporary captures are deleted later: not worth remembering.
  if (s_.temp_captures.count(s_.capture_path)) return;
  const std::string why = recent_->add(s_.capture_path, "capture");
  if (!why.empty()) s_.status_message = why;
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

ScreenRect AppUi::view_area(const std::string& name) const {
  for (size_t i = 0; i < views_.size(); ++i)
    if (name == views_[i]->name()) return areas_[i];
  return {};
}

float AppUi::view_scroll_max_x(const std::string& name) const {
  for (size_t i = 0; i < views_.size(); ++i)
    if (name == views_[i]->name()) return scroll_max_x_[i];
  return 0;
}

std::vector<AppUi::PngRequest> AppUi::take_png_requests() {
  std::vector<PngRequest> out, later;
  for (PngRequest& r : png_requests_) {
    if (r.wait_frames-- > 0) {
      later.push_back(r);
      continue;
    }
    // The rectangle as the view is drawn now (the dialog that asked has gone).
    out.push_back(r);
  }
  png_requests_.swap(later);
  return out;
}

void AppUi::set_ui_scale(float scale) {
  scale = std::clamp(std::round(scale * 4.0f) / 4.0f, kMinUiScale, kMaxUiScale);
  if (scale == ui_scale_) return;
  if (left_w_ > 0) left_w_ *= scale / ui_scale_;
  ui_scale_ = scale;
  font_rebuild_ = true;
}

bool AppUi::take_font_rebuild() {
  const bool r = font_rebuild_;
  font_rebuild_ = false;
  return r;
}

void AppUi::request_svg(const std::string& path, const std::string& view_name) {
  svg_requests_.push_back({path, view_name, 2});
}

void AppUi::before_frame() {
  svg_frame_ = false;
  for (const SvgRequest& r : svg_requests_)
    if (r.wait_frames <= 0) svg_frame_ = true;
  if (!svg_frame_) return;
  ImGuiStyle& st = ImGui::GetStyle();
  saved_aa_lines_ = st.AntiAliasedLines;
  saved_aa_fill_ = st.AntiAliasedFill;
  st.AntiAliasedLines = st.AntiAliasedFill = false;
}

void AppUi::after_render(const ImDrawData* dd) {
  std::vector<SvgRequest> later;
  for (SvgRequest& r : svg_requests_) {
    if (!svg_frame_ || r.wait_frames > 0) {
      --r.wait_frames;
      later.push_back(r);
      continue;
    }
    try {
      write_svg(r.path, dd, view_rect(r.view), IM_COL32(28, 31, 33, 255));
      s_.status_message = "wrote " + r.path;
    } catch (const std::exception& e) {
      s_.status_message = e.what();
    }
  }
  svg_requests_.swap(later);
  if (svg_frame_) {
    ImGuiStyle& st = ImGui::GetStyle();
    st.AntiAliasedLines = saved_aa_lines_;
    st.AntiAliasedFill = saved_aa_fill_;
    svg_frame_ = false;
  }
}

nlohmann::json AppUi::session_json() const {
  nlohmann::json j = s_.to_session();
  nlohmann::json vs = nlohmann::json::object();
  for (const auto& v : views_) {
    nlohmann::json st = v->save_state();
    if (!st.is_null()) vs[v->name()] = st;
  }
  j["views"] = vs;
  return j;
}

void AppUi::save_session(const std::string& path) const {
  const nlohmann::json j = session_json();
  std::ofstream f(path);
  if (!f) throw InputError(path + ": cannot open for writing");
  f << j.dump(2) << "\n";
  if (!f) throw InputError(path + ": write failed");
}

void AppUi::load_session(const std::string& path) {
  // A session file is user input: parsed under the JSON limits (nesting, values, duplicate keys).
  JsonLimits limits;
  const nlohmann::json j = read_json_file_limited(path, 64ull << 20, limits);
  try {
    load_session_json(j);
  } catch (const InputError& e) {
    throw InputError(path + ": " + e.what());
  }
  if (recent_) {
    const std::string why = recent_->add(path, "session");
    if (!why.empty()) s_.status_message = why;
  }
}

void AppUi::check_session(const nlohmann::json& j) const {
  s_.parse_session(j, nullptr);  // the settings, and `views` an object of objects
  const JsonField doc(j, "session");
  auto known_view = [&](const JsonField& v) {
    const std::string name = v.string();
    if (!find_view(name)) v.fail("'" + name + "' is not a view of this build");
  };
  if (const std::optional<JsonField> a = doc.find("active_view")) known_view(*a);
  if (const std::optional<JsonField> p = doc.find("panels"))
    for (const JsonField& v : p->elements()) known_view(v);
  // The views' own choices: each view's load_state checks its fields and names the wrong one.
  // Fresh views read them here, so nothing of this window changes when one is wrong.
  if (const std::optional<JsonField> vs = doc.find("views")) {
    const std::vector<std::unique_ptr<View>> probes = make_views();
    for (const auto& member : vs->members()) {
      const std::string& name = member.first;
      auto it = std::find_if(probes.begin(), probes.end(),
                             [&](const auto& v) { return name == v->name(); });
      if (it == probes.end()) member.second.fail("'" + name + "' is not a view of this build");
      (*it)->load_state(member.second.json());
    }
  }
}

void AppUi::load_session_json(const nlohmann::json& j) {
  check_session(j);  // the whole session first: nothing changes when any field is wrong
  s_.apply_session(j);
  if (j.contains("views"))
    for (const auto& v : views_)
      if (j["views"].contains(v->name())) v->load_state(j["views"][v->name()]);
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
  st["popups_open"] = ImGui::GetCurrentContext()->OpenPopupStack.Size;  // menus, lists, dialogs
  st["help_open"] = help_open_;
  st["presenting"] = presenting_;
  st["restore_prompt"] = {{"open", restore_pending_}, {"text", restore_text_}};
  if (autosave_)
    st["autosave"] = {{"file", autosave_->file().string()},
                      {"writes", autosave_->writes()},
                      {"last_write_s", autosave_->last_write_s()},
                      {"last_delay_s", autosave_->last_delay_s()},
                      {"held", autosave_->held()}};
  st["backend_active"] = s_.backend_active;
  st["backend_note"] = s_.backend_note;
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
  // The rectangle an export of the active view covers (the GUI test checks a PNG has its size).
  const ScreenRect r = view_rect(s_.settings.active_view);
  st["view_rect"] = {r.x0, r.y0, r.x1, r.y1};
  const ReferenceCacheStats rc = ReferenceCache::global().stats();
  st["reference_cache"] = {
      {"bytes", rc.bytes},   {"budget", rc.budget}, {"entries", rc.entries},    {"hits", rc.hits},
      {"misses", rc.misses}, {"waits", rc.waits},   {"evictions", rc.evictions}};
  // What a script driving the window needs besides the widgets: the open popups (menus, lists,
  // dialogs; the top-most last) with their rectangles, the UI scale, the display size, and the
  // frame heartbeat with the latest frame times, oldest first.
  nlohmann::json popups = nlohmann::json::array();
  for (const ImGuiPopupData& p : ImGui::GetCurrentContext()->OpenPopupStack) {
    if (!p.Window) continue;
    const ImVec2 a = p.Window->Pos, b(a.x + p.Window->Size.x, a.y + p.Window->Size.y);
    nlohmann::json popup = nlohmann::json::object();
    popup["name"] = p.Window->Name;
    popup["modal"] = (p.Window->Flags & ImGuiWindowFlags_Modal) != 0;
    popup["rect"] = {a.x, a.y, b.x, b.y};
    popups.push_back(popup);
  }
  st["popups"] = popups;
  st["ui_scale"] = ui_scale_;
  st["text_input"] = ImGui::GetIO().WantTextInput;  // a text field takes the keys
  st["display"] = {ImGui::GetIO().DisplaySize.x, ImGui::GetIO().DisplaySize.y};
  nlohmann::json recent = nlohmann::json::array(), recent_app = nlohmann::json::array(),
                 recent_app_cpu = nlohmann::json::array();
  const uint64_t n = std::min<uint64_t>(frames_, kFrameRing);
  for (uint64_t i = frames_ - n; i < frames_; ++i) {
    recent.push_back(frame_ms_[i % kFrameRing]);
    recent_app.push_back(app_ms_[i % kFrameRing]);
    recent_app_cpu.push_back(app_cpu_ms_[i % kFrameRing]);
  }
  st["frames"] = {{"count", frames_},
                  {"presented", presented_frames_},
                  {"recent_ms", recent},
                  {"recent_app_ms", recent_app},
                  {"recent_app_cpu_ms", recent_app_cpu}};
  const MemoryStats mem = memory_stats();  // the soak tells retention from the allocator's own
  st["memory"] = {{"rss_kb", mem.rss_kb},
                  {"heap_live", mem.heap_live},
                  {"heap_mapped", mem.heap_mapped},
                  {"allocator", mem.allocator}};
  std::ofstream f(fs::path(dir) / "state.json");
  f << st.dump(2) << "\n";
}

void AppUi::note_frame_time(double ms, double app_ms, double app_cpu_ms) {
  if (frame_ms_.size() < kFrameRing) frame_ms_.resize(kFrameRing);
  if (app_ms_.size() < kFrameRing) app_ms_.resize(kFrameRing);
  if (app_cpu_ms_.size() < kFrameRing) app_cpu_ms_.resize(kFrameRing);
  frame_ms_[frames_ % kFrameRing] = static_cast<float>(ms);
  app_ms_[frames_ % kFrameRing] = static_cast<float>(app_ms);
  app_cpu_ms_[frames_ % kFrameRing] = static_cast<float>(app_cpu_ms);
  ++frames_;
}

void AppUi::reconcile() {
  s_.reconcile([this](const AppState& s, std::vector<NamedPlan>& plans) {
    for (const auto& v : views_) {  // a view's own results are wanted while it is shown
      if (v->name() != s.settings.panel_view[0] && v->name() != s.settings.panel_view[1]) continue;
      std::vector<NamedPlan> mine;
      v->plan(s, mine);
      // A result two views show (the set's evaluation) is planned once: both plan it alike.
      for (NamedPlan& p : mine)
        if (std::none_of(plans.begin(), plans.end(),
                         [&](const NamedPlan& q) { return q.first == p.first; }))
          plans.push_back(std::move(p));
    }
  });
}

void AppUi::draw() {
  // One state model: finished jobs are applied, then every result's key is compared with the
  // settings (the views' own plans included) before anything is drawn.
  reconcile();
  // A capture set just opened (AppState::set_path): the Set view shows it.
  if (!s_.set_shown) {
    s_.set_shown = true;
    show_view("set");
    s_.settings.active_view = "set";
  }
  s_.hovered_token = -1;
  s_.ui_items.clear();  // only what this frame draws
  const ImGuiViewport* vp = ImGui::GetMainViewport();
  ImGui::SetNextWindowPos(vp->Pos);
  ImGui::SetNextWindowSize(vp->Size);
  ImGuiWindowFlags flags = ImGuiWindowFlags_NoDecoration | ImGuiWindowFlags_NoMove |
                           ImGuiWindowFlags_NoBringToFrontOnFocus |
                           ImGuiWindowFlags_NoSavedSettings;
  if (!presenting_) flags |= ImGuiWindowFlags_MenuBar;
  ImGui::PushStyleVar(ImGuiStyleVar_WindowPadding, ImVec2(px(6), px(6)));
  ImGui::Begin("KVScope", nullptr, flags);
  ImGui::PopStyleVar();
  handle_keys();  // the shortcuts() table, with or without the menu bar (a presentation)
  if (!presenting_) draw_menu();

  // Load errors stay visible until dismissed; the capture that was open stays open.
  if (!s_.load_error.empty()) {
    ImGui::PushStyleColor(ImGuiCol_ChildBg, ImVec4(0.35f, 0.08f, 0.08f, 1.0f));
    float h = ImGui::GetTextLineHeightWithSpacing() * 2 + 8;
    ImGui::BeginChild("##loaderror", ImVec2(0, h), true);
    // The button first: after wrapped text it would sit past the right edge, cut to "Di".
    if (ImGui::SmallButton("Dismiss")) s_.load_error.clear();
    record_item(s_, "button:dismiss load error");
    ImGui::SameLine();
    ImGui::TextWrapped("Could not open: %s", s_.load_error.c_str());
    ImGui::EndChild();
    ImGui::PopStyleColor();
  }
  // Settings adjusted to fit the capture (or skipped session entries) are said once.
  if (!s_.notes.empty()) {
    ImGui::PushStyleColor(ImGuiCol_ChildBg, ImVec4(0.30f, 0.24f, 0.06f, 1.0f));
    float h = ImGui::GetTextLineHeightWithSpacing() * (std::min<size_t>(s_.notes.size(), 4) + 1);
    ImGui::BeginChild("##notes", ImVec2(0, h), true);
    // The button first, where wrapped notes cannot push it out of the box.
    if (ImGui::SmallButton("Dismiss notes")) s_.notes.clear();
    record_item(s_, "button:dismiss notes");
    for (const std::string& n : s_.notes) ImGui::TextWrapped("note: %s", n.c_str());
    ImGui::EndChild();
    ImGui::PopStyleColor();
  }

  const float status_h = ImGui::GetFrameHeightWithSpacing() + px(6);
  ImVec2 avail = ImGui::GetContentRegionAvail();
  // The left panel: the user's splitter position, else a share of the window that leaves the
  // main panel room on small windows; always at least 240 px and leaves the main panel 320 px.
  const float min_left = px(240), min_main = px(320);
  float left = left_w_ > 0 ? left_w_ : std::clamp(avail.x * 0.33f, px(300), px(kLeftPanelWidth));
  left = std::max(std::min(left, avail.x - min_main - px(kSplitterWidth)), min_left);
  const float panel_h = std::max(px(100), avail.y - status_h);
  if (presenting_) {
    draw_presented(ImVec2(0, panel_h));
  } else {
    draw_panel(Panel::Left, "##left", ImVec2(left, panel_h));
    ImGui::SameLine(0, 0);
    draw_splitter(panel_h);
    ImGui::SameLine(0, 0);
    draw_panel(Panel::Main, "##main", ImVec2(0, panel_h));
  }
  draw_status_bar();
  draw_dialogs();
  draw_restore_prompt();
  ImGui::End();
  draw_help();
  note_recent();
  tick_autosave();
  if (export_json_pending_) {
    export_json_pending_ = false;
    // A view may have changed a setting while this frame drew: the export must already mark
    // what that change outdates, so the results learn their new keys first.
    reconcile();
    try {
      export_all_json(export_dir);
      s_.status_message = "exported JSON to " + export_dir;
    } catch (const std::exception& e) {
      s_.status_message = e.what();
    }
  }
}

void AppUi::draw_splitter(float height) {
  ImGui::InvisibleButton("##splitter", ImVec2(px(kSplitterWidth), height));
  const bool active = ImGui::IsItemActive(), hovered = ImGui::IsItemHovered();
  if (active || hovered) ImGui::SetMouseCursor(ImGuiMouseCursor_ResizeEW);
  const ImVec2 a = ImGui::GetItemRectMin(), b = ImGui::GetItemRectMax();
  const float cx = (a.x + b.x) * 0.5f;
  ImGui::GetWindowDrawList()->AddLine(ImVec2(cx, a.y + 2), ImVec2(cx, b.y - 2),
                                      ImGui::GetColorU32(active    ? ImGuiCol_SeparatorActive
                                                         : hovered ? ImGuiCol_SeparatorHovered
                                                                   : ImGuiCol_Separator),
                                      active || hovered ? 3.0f : 1.0f);
  if (active) {
    const float left_now = a.x - ImGui::GetWindowPos().x - ImGui::GetStyle().WindowPadding.x;
    left_w_ = std::max(px(240), left_now + ImGui::GetIO().MouseDelta.x);
  }
  if (hovered && ImGui::IsMouseDoubleClicked(ImGuiMouseButton_Left)) left_w_ = 0;  // default
}

void AppUi::handle_keys() {
  const ImGuiIO& io = ImGui::GetIO();
  const bool ctrl = io.KeyCtrl && !io.WantTextInput;
  for (const Shortcut& sc : shortcuts()) {
    if (sc.ctrl && !ctrl) continue;
    // Function keys and Escape type nothing: they work while a field is active.
    if (sc.export_dir && export_dir.empty()) continue;
    for (int key : sc.keys)
      if (ImGui::IsKeyPressed(key, false)) {
        run_command(sc.command);
        break;
      }
  }
}

void AppUi::run_command(Command c) {
  switch (c) {
    case Command::OpenCapture: {
      std::string start =
          s_.capture_path.empty() ? "" : fs::path(s_.capture_path).parent_path().string();
      browser_.open("Open capture", start, {".safetensors", ".npz"},
                    [this](const std::string& p) { s_.request_open(p); });
      break;
    }
    case Command::SaveSession:
      path_action_ = PathAction::SaveSession;
      path_buf_ = "kvscope_session.json";
      open_path_popup_ = true;
      break;
    case Command::ExportPng:
      path_action_ = PathAction::ExportPng;
      path_buf_ = "kvscope_" + s_.settings.active_view + ".png";
      open_path_popup_ = true;
      break;
    case Command::Larger:
      set_ui_scale(ui_scale_ + 0.25f);
      break;
    case Command::Smaller:
      set_ui_scale(ui_scale_ - 0.25f);
      break;
    case Command::ResetScale:
      set_ui_scale(1.0f);
      break;
    case Command::Help:
      help_open_ = true;
      help_focus_ = true;
      break;
    case Command::CloseMenu:
      close_popups_and_menus();
      break;
    case Command::Present:
      presenting_ = !presenting_;
      break;
    case Command::ExportJson:
      // Written at the end of the frame, so widget rectangles are this frame's. F8 does the
      // same as F9, so a script can alternate keys (two quick taps of one key can reach GLFW as
      // an auto-repeat on a loaded X server).
      export_json_pending_ = true;
      break;
    case Command::ExportPngNow: {
      View* v = find_view(s_.settings.active_view);
      png_requests_.push_back({(fs::path(export_dir) / (s_.settings.active_view + ".png")).string(),
                               v ? view_rect(v->name()) : ScreenRect{}, 0, 1.0f,
                               v ? v->name() : ""});
      break;
    }
  }
}

// Escape: ImGui 1.86 closes popups on Escape only with keyboard navigation on, which the app
// leaves off (arrow keys belong to the views). The menus, combo lists and other non-modal popups
// above the top-most modal dialog close here; when there are none, the dialogs (Open, Save as)
// take the Escape themselves, and with no dialog either it closes the Help window.
void AppUi::close_popups_and_menus() {
  ImGuiContext& g = *ImGui::GetCurrentContext();
  int keep = g.OpenPopupStack.Size;
  while (keep > 0) {
    const ImGuiWindow* w = g.OpenPopupStack[keep - 1].Window;
    if (!w || (w->Flags & ImGuiWindowFlags_Modal)) break;
    --keep;
  }
  if (keep < g.OpenPopupStack.Size) {
    ImGui::ClosePopupToLevel(keep, true);
    // This Escape is spent: the dialog under the closed list stays open.
    ImGui::GetIO().KeysDownDuration[GLFW_KEY_ESCAPE_CODE] = 1e-6f;
    return;
  }
  if (g.OpenPopupStack.Size != 0 || open_path_popup_) return;
  if (help_open_)
    help_open_ = false;
  else
    presenting_ = false;
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
          // A tab the user picked is the active (exported) view: a newly selected tab, and a
          // click on the tab already shown (each panel shows one, and the active view may be
          // the other panel's).
          if (shown != v.name() || ImGui::IsItemClicked(ImGuiMouseButton_Left))
            s_.settings.active_view = v.name();
          shown = v.name();
        }  // else: another tab is being brought up; the settings already name it
        draw_view_in_child(i);
        ImGui::EndTabItem();
      } else {
        drawn_frames_[i] = 0;
      }
    }
    ImGui::EndTabBar();
  }
  ImGui::EndChild();
}

void AppUi::draw_view_in_child(size_t i) {
  // At a projector's scale a view's toolbars and plots can be wider than its panel: the view
  // scrolls sideways then, rather than cutting them off or squeezing the plots.
  ImGui::BeginChild("##view", ImVec2(0, 0), false, ImGuiWindowFlags_HorizontalScrollbar);
  // Exports cover the view's own area (no tab bar); from its figure top when it has one.
  const ImVec2 wp = ImGui::GetWindowPos(), ws = ImGui::GetWindowSize();
  clear_figure_top();
  set_presenting_view(presenting_);
  // Text wraps at the view's visible width. ImGui's own default in a window that scrolls
  // sideways is the scrolled width, which a line too wide once then keeps wide (the Geometry
  // view's status line cut at 2x, with a scrollbar under the whole view); and a plain Text
  // longer than the view wraps too instead of running off its edge.
  ImGui::PushTextWrapPos(ImGui::GetWindowContentRegionMax().x + ImGui::GetScrollX());
  views_[i]->draw(s_);
  ImGui::PopTextWrapPos();
  set_presenting_view(false);
  areas_[i] = {wp.x, wp.y, wp.x + ws.x, wp.y + ws.y};
  scroll_max_x_[i] = ImGui::GetScrollMaxX();
  rects_[i] = areas_[i];
  const float top = figure_top();
  if (top > wp.y && top < wp.y + ws.y) rects_[i].y0 = top;
  ImGui::EndChild();
  ++drawn_frames_[i];
}

void AppUi::draw_presented(ImVec2 size) {
  // The active view (any panel's), else the main panel's shown one.
  size_t shown = views_.size();
  for (size_t i = 0; i < views_.size(); ++i)
    if (views_[i]->name() == s_.settings.active_view) shown = i;
  for (size_t i = 0; i < views_.size() && shown == views_.size(); ++i)
    if (views_[i]->name() == s_.settings.panel_view[1]) shown = i;
  for (size_t i = 0; i < views_.size(); ++i)
    if (i != shown) drawn_frames_[i] = 0;
  if (shown < views_.size()) {
    // Shown in its panel as far as the plans go (reconcile plans the shown views' results), and
    // its tab is the one brought up when the presentation ends.
    const size_t pi = views_[shown]->panel() == Panel::Left ? 0 : 1;
    s_.settings.panel_view[pi] = views_[shown]->name();
    requested_[pi] = views_[shown]->name();
  }
  ImGui::BeginChild("##present", size, false);
  if (shown < views_.size()) draw_view_in_child(shown);
  ImGui::EndChild();
}

}  // namespace kvscope::app
