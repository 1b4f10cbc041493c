// Part of test_app_unit: a new capture saved under a name becomes that
// capture; the app's temporary captures are deleted; the Help window (F1) and its shortcuts
// table; Escape closes menus and lists; File > Open recent; figure exports without toolbars.
#include <gtest/gtest.h>
#include <imgui.h>
#include <imgui_internal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include "app/app_frame.h"
#include "app/app_state.h"
#include "app/grid_values.h"
#include "app/recent_files.h"
#include "app/soft_render.h"
#include "app/views/view.h"
#include "app/walk_advice.h"
#include "engine/eval/capture_set.h"
#include "engine/eval/holdout.h"
#include "engine/eval/sweep_grid.h"
#include "engine/model/synth.h"
#include "tests/gui/app_pump.h"

namespace fs = std::filesystem;
using namespace kvscope;
using namespace kvscope::app;

using kvscope::app::testing::pump_until;

namespace {

constexpr int kEscape = 256, kF1 = 290;  // GLFW key codes (the app's key indices)

fs::path scratch_dir(const std::string& name) {
  const fs::path d =
      fs::temp_directory_path() / ("kvscope_polish_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::string small_capture(const fs::path& dir, const std::string& name, int n) {
  const fs::path p = dir / name;
  SynthSpec spec = synth_preset("small");
  spec.num_tokens = n;
  write_synth_capture(p.string(), spec, DType::F16);
  return p.string();
}

// One frame of the window with the given keys held (pressed this frame when they were not in
// the last one), the pointer at `mouse` and the left button as given.
void frame(AppState& s, AppUi& ui, std::set<int> keys = {}, bool ctrl = false,
           ImVec2 mouse = ImVec2(-FLT_MAX, -FLT_MAX), bool left = false) {
  s.worker.drain(s);
  ImGuiIO& io = ImGui::GetIO();
  io.DeltaTime = 1.0f / 60.0f;
  io.KeyMap[ImGuiKey_Escape] = kEscape;
  for (int k = 0; k < 512; ++k) io.KeysDown[k] = keys.count(k) > 0;
  io.KeyCtrl = ctrl;
  io.MousePos = mouse;
  io.MouseDown[0] = left;
  ImGui::NewFrame();
  ui.draw();
  ImGui::Render();
}

int open_popups() {
  return ImGui::GetCurrentContext()->OpenPopupStack.Size;
}

ImVec2 centre(const AppState& s, const std::string& item) {
  const auto it = s.ui_items.find(item);
  if (it == s.ui_items.end()) return ImVec2(-1, -1);
  const auto& r = it->second;
  return ImVec2((r[0] + r[2]) / 2, (r[1] + r[3]) / 2);
}

void click(AppState& s, AppUi& ui, const std::string& item) {
  const ImVec2 at = centre(s, item);
  ASSERT_GE(at.x, 0) << item << " was not drawn";
  frame(s, ui, {}, false, at, false);
  frame(s, ui, {}, false, at, true);
  frame(s, ui, {}, false, at, false);
}

void tap(AppState& s, AppUi& ui, int key, bool ctrl = false) {
  frame(s, ui, {key}, ctrl);
  frame(s, ui, {}, false);
}

// The config folder of these tests: never the user's home.
struct ConfigDir {
  fs::path dir;
  explicit ConfigDir(const std::string& name) : dir(scratch_dir(name)) {
    ::setenv("KVSCOPE_CONFIG_DIR", dir.c_str(), 1);
  }
  ~ConfigDir() {
    ::unsetenv("KVSCOPE_CONFIG_DIR");
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
};

}  // namespace

// Item 7: after Save as, the saved file is the capture's path (window title, menu bar, sessions);
// the temporary file is deleted when another capture opens and when the app ends, never the
// file the user saved.
TEST(NewCaptureFiles, SavedNameBecomesTheCapturesPathAndTemporaryFilesGo) {
  const fs::path dir = scratch_dir("newcapture");
  const std::string temp = small_capture(dir, "kvscope_new_capture_1.safetensors", 48);
  const std::string saved = (dir / "mine.safetensors").string();
  const std::string other = small_capture(dir, "other.safetensors", 40);
  {
    AppState s;
    s.temp_captures.insert(temp);  // what File > New capture does when its run finishes
    s.request_open(temp);
    ASSERT_TRUE(pump_until(s, [&] { return s.capture && s.capture_path == temp; })) << s.load_error;
    const uint64_t id = s.capture_id;
    fs::copy_file(temp, saved);  // save_new_capture copies, then:
    s.capture_saved_as(temp, saved);
    EXPECT_EQ(s.capture_path, saved);
    EXPECT_EQ(s.capture_id, id) << "the same capture: nothing reloads or recomputes";
    EXPECT_EQ(s.to_session()["capture"], saved);
    EXPECT_TRUE(fs::exists(temp)) << "deleted only once the capture is closed";
    // Another capture opens: the temporary file goes, the saved one stays.
    s.request_open(other);
    ASSERT_TRUE(pump_until(s, [&] { return s.capture_path == other; })) << s.load_error;
    EXPECT_FALSE(fs::exists(temp));
    EXPECT_TRUE(fs::exists(saved));
    EXPECT_TRUE(s.temp_captures.empty());
  }
  // Never saved, still open when the app quits: deleted with the AppState.
  const std::string temp2 = small_capture(dir, "kvscope_new_capture_2.safetensors", 48);
  {
    AppState s;
    s.temp_captures.insert(temp2);
    s.request_open(temp2);
    ASSERT_TRUE(pump_until(s, [&] { return s.capture_path == temp2; })) << s.load_error;
    // A failed open keeps the temporary capture open, and its file.
    s.request_open((dir / "missing.safetensors").string());
    ASSERT_TRUE(pump_until(s, [&] { return !s.load_error.empty(); }));
    EXPECT_TRUE(fs::exists(temp2));
  }
  EXPECT_FALSE(fs::exists(temp2));
  EXPECT_TRUE(fs::exists(saved));
  fs::remove_all(dir);
}

// Item 8: the Help window opens from F1 and from Help > KVScope help, lists the shortcuts of the
// table the key handling reads, a paragraph for every view and documents that exist.
TEST(Help, F1OpensItAndEscapeClosesIt) {
  [[maybe_unused]] SoftTexture font = soft_init(1600, 1000);
  {
    AppState s;
    AppUi ui(s);
    frame(s, ui);
    EXPECT_FALSE(ui.help_open());
    tap(s, ui, kF1);
    EXPECT_TRUE(ui.help_open());
    frame(s, ui);
    EXPECT_EQ(s.ui_items.count("help:window"), 1u);
    tap(s, ui, kEscape);
    EXPECT_FALSE(ui.help_open());
    frame(s, ui);
    EXPECT_EQ(s.ui_items.count("help:window"), 0u);
    // From the menu.
    click(s, ui, "menu:Help");
    ASSERT_GT(open_popups(), 0);
    click(s, ui, "menu:KVScope help");
    EXPECT_TRUE(ui.help_open());
    EXPECT_EQ(open_popups(), 0);
    // A shortcut of the table works through the same table (Ctrl + is the UI scale).
    const float scale = ui.ui_scale();
    tap(s, ui, '=', true);
    EXPECT_FLOAT_EQ(ui.ui_scale(), scale + 0.25f);
  }
  ImGui::DestroyContext();
}

TEST(Help, TableViewsAndDocuments) {
  std::set<std::string> labels;
  std::set<std::pair<bool, int>> bound;
  for (const Shortcut& sc : shortcuts()) {
    EXPECT_TRUE(labels.insert(sc.label).second) << sc.label << " listed twice";
    for (int k : sc.keys) EXPECT_TRUE(bound.insert({sc.ctrl, k}).second) << sc.label;
    EXPECT_GT(std::string(sc.action).size(), 5u) << sc.label;
  }
  for (const char* must : {"Ctrl+O", "Ctrl+S", "Ctrl+E", "F1", "Escape", "F10"})
    EXPECT_EQ(labels.count(must), 1u) << must;
  for (const auto& v : make_views())
    EXPECT_GT(std::string(v->help()).size(), 60u) << v->name() << " has no help paragraph";
  bool app_md = false;
  std::set<std::string> listed;
  for (const HelpDoc& d : help_docs()) {
    EXPECT_FALSE(help_doc_file(d).empty()) << d.path << " is not in the repository";
    EXPECT_FALSE(d.what.empty()) << d.path << " has no title";
    app_md |= std::string(d.path) == "docs/app.md";
    listed.insert(d.path);
  }
  EXPECT_TRUE(app_md);
  // Every document of the docs folder is listed (docs/theory.md was left out of a typed list).
  for (const auto& e : fs::directory_iterator(fs::path(KVSCOPE_SOURCE_DIR) / "docs")) {
    if (e.path().extension() == ".md") {
      EXPECT_EQ(listed.count("docs/" + e.path().filename().string()), 1u) << e.path();
    }
  }
  EXPECT_EQ(listed.count("docs/theory.md"), 1u);
}

// The active view (the one F10 and File > Export write, and the state export names) is the view
// whose tab the user clicked last. Each panel shows a tab of its own, so the active view can be
// the other panel's: a click on a tab already shown must make it the active view all the same.
TEST(Tabs, TheTabClickedLastIsTheActiveViewEvenWhenItWasAlreadyShown) {
  [[maybe_unused]] SoftTexture font = soft_init(1600, 1000);
  {
    AppState s;
    AppUi ui(s);
    frame(s, ui);
    frame(s, ui);
    ASSERT_EQ(s.settings.panel_view[0], "capture");
    click(s, ui, "tab:geometry");  // not shown yet: it is brought up and becomes active
    frame(s, ui);
    EXPECT_EQ(s.settings.panel_view[1], "geometry");
    EXPECT_EQ(s.settings.active_view, "geometry");
    click(s, ui, "tab:capture");  // shown on the left all along
    frame(s, ui);
    EXPECT_EQ(s.settings.panel_view[0], "capture");
    EXPECT_EQ(s.settings.active_view, "capture") << "a click on the shown left tab was ignored";
    click(s, ui, "tab:geometry");  // shown on the right all along
    frame(s, ui);
    EXPECT_EQ(s.settings.active_view, "geometry") << "a click on the shown main tab was ignored";
    click(s, ui, "tab:method");  // the left panel's other tab
    frame(s, ui);
    EXPECT_EQ(s.settings.panel_view[0], "method");
    EXPECT_EQ(s.settings.active_view, "method");
    // Only a click does it: the pointer resting on another shown tab changes nothing.
    const ImVec2 over = centre(s, "tab:geometry");
    for (int f = 0; f < 3; ++f) frame(s, ui, {}, false, over, false);
    EXPECT_EQ(s.settings.active_view, "method");
  }
  ImGui::DestroyContext();
}

// Item 8: Escape closes an open menu (ImGui 1.86 does so only with keyboard navigation on), and
// still closes the Open dialog.
TEST(Escape, ClosesMenusAndTheOpenDialog) {
  [[maybe_unused]] SoftTexture font = soft_init(1600, 1000);
  {
    AppState s;
    AppUi ui(s);
    frame(s, ui);
    click(s, ui, "menu:File");
    ASSERT_GT(open_popups(), 0) << "the File menu did not open";
    tap(s, ui, kEscape);
    EXPECT_EQ(open_popups(), 0) << "Escape left the File menu open";
    tap(s, ui, 'O', true);  // Ctrl+O: the Open dialog (a modal)
    frame(s, ui);
    ASSERT_GT(open_popups(), 0) << "Ctrl+O did not open the dialog";
    tap(s, ui, kEscape);
    frame(s, ui);
    EXPECT_EQ(open_popups(), 0) << "Escape left the Open dialog open";
  }
  ImGui::DestroyContext();
}

// Item 8: File > Open recent, remembered in $KVSCOPE_CONFIG_DIR/recent.json.
TEST(RecentFiles, KeepsTheLastTenAndIgnoresADamagedFile) {
  ConfigDir cfg("recent_list");
  EXPECT_EQ(config_dir(), cfg.dir);
  RecentFiles r;
  EXPECT_EQ(r.file(), cfg.dir / "recent.json");
  EXPECT_EQ(r.load(), "");  // missing: empty, no message
  EXPECT_TRUE(r.entries().empty());
  for (int i = 0; i < 12; ++i) {
    fs::path p = cfg.dir / "c";
    p += std::to_string(i);
    p += ".safetensors";
    EXPECT_EQ(r.add(p.string(), "capture"), "");
  }
  r.add((cfg.dir / "c5.safetensors").string(), "capture");  // again: moves to the front
  r.add((cfg.dir / "s.json").string(), "session");
  ASSERT_EQ(r.entries().size(), RecentFiles::kMax);
  EXPECT_EQ(r.entries()[0].path, (cfg.dir / "s.json").string());
  EXPECT_EQ(r.entries()[0].kind, "session");
  EXPECT_EQ(r.entries()[1].path, (cfg.dir / "c5.safetensors").string());
  RecentFiles again;
  EXPECT_EQ(again.load(), "");
  EXPECT_EQ(again.entries(), r.entries());
  // Damaged files are ignored with a message.
  for (const char* bad : {"{", "[1,2]", R"({"recent": [{"path": 3, "kind": "capture"}]})",
                          R"({"recent": [{"path": "/x", "kind": "movie"}]})"}) {
    std::ofstream(r.file()) << bad;
    RecentFiles d;
    const std::string why = d.load();
    EXPECT_NE(why.find("recent.json"), std::string::npos) << bad;
    EXPECT_NE(why.find("ignored"), std::string::npos) << why;
    EXPECT_TRUE(d.entries().empty());
  }
}

TEST(RecentFiles, TheAppRemembersOpenedCapturesAndSessionsButNotTemporaryOnes) {
  ConfigDir cfg("recent_app");
  [[maybe_unused]] SoftTexture font = soft_init(1600, 1000);
  const std::string cap = small_capture(cfg.dir, "a.safetensors", 40);
  const std::string temp = small_capture(cfg.dir, "kvscope_new_capture_9.safetensors", 40);
  std::ofstream(cfg.dir / "recent.json") << "not json";
  {
    AppState s;
    AppUi ui(s);
    ui.enable_recent_files();
    EXPECT_NE(s.status_message.find("ignored"), std::string::npos) << s.status_message;
    ASSERT_NE(ui.recent_files(), nullptr);
    EXPECT_TRUE(ui.recent_files()->entries().empty());
    s.request_open(cap);
    for (int i = 0; i < 2000 && s.capture_path != cap; ++i) {
      frame(s, ui);
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    frame(s, ui);
    ASSERT_EQ(ui.recent_files()->entries().size(), 1u);
    EXPECT_EQ(ui.recent_files()->entries()[0].path, cap);
    s.temp_captures.insert(temp);
    s.request_open(temp);
    for (int i = 0; i < 2000 && s.capture_path != temp; ++i) {
      frame(s, ui);
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    frame(s, ui);
    EXPECT_EQ(ui.recent_files()->entries().size(), 1u) << "a temporary capture was remembered";
    const std::string session = (cfg.dir / "s.json").string();
    s.request_open(cap);
    for (int i = 0; i < 2000 && s.capture_path != cap; ++i) {
      frame(s, ui);
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    ui.save_session(session);
    ui.load_session(session);
    ASSERT_EQ(ui.recent_files()->entries().size(), 2u);
    EXPECT_EQ(ui.recent_files()->entries()[0].kind, "session");
  }
  RecentFiles r;
  EXPECT_EQ(r.load(), "");  // the damaged file was replaced by a good one
  EXPECT_EQ(r.entries().size(), 2u);
  ImGui::DestroyContext();
}

// Item 8: figure exports (PNG, SVG, F10) cover the view's figure, not its toolbar. Widgets are
// found in the frame's draw lists by their fill colours (frames of combos, sliders, fields and
// checkboxes; buttons): every view but Method (all controls, no figure: exported whole) marks
// where its figure starts below its toolbar, and no widget of the toolbar is inside the
// exported rectangle. The Error and Output views keep the pickers that belong to one plot
// (which layer/head, which query, which run) inside their figure; the others have none.
namespace {

struct WidgetBoxes {
  std::vector<ImVec4> boxes;  // x0, y0, x1, y1 of each widget-coloured quad
};

WidgetBoxes widget_boxes(const ImDrawData* dd) {
  const ImGuiStyle& st = ImGui::GetStyle();
  std::set<ImU32> colours;
  for (ImGuiCol c : {ImGuiCol_FrameBg, ImGuiCol_Button})
    colours.insert(ImGui::ColorConvertFloat4ToU32(st.Colors[c]));
  WidgetBoxes out;
  for (int l = 0; l < dd->CmdListsCount; ++l) {
    const ImDrawList* list = dd->CmdLists[l];
    const auto& idx = list->IdxBuffer;
    const auto& vtx = list->VtxBuffer;
    for (int i = 0; i + 2 < idx.Size; i += 3) {
      const ImDrawVert &a = vtx[idx[i]], &b = vtx[idx[i + 1]], &c = vtx[idx[i + 2]];
      if (!colours.count(a.col) || a.col != b.col || a.col != c.col) continue;
      out.boxes.push_back(
          ImVec4(std::min({a.pos.x, b.pos.x, c.pos.x}), std::min({a.pos.y, b.pos.y, c.pos.y}),
                 std::max({a.pos.x, b.pos.x, c.pos.x}), std::max({a.pos.y, b.pos.y, c.pos.y})));
    }
  }
  return out;
}

bool inside(const ImVec4& b, const ScreenRect& r) {
  return b.x >= r.x0 - 0.5f && b.z <= r.x1 + 0.5f && b.y >= r.y0 - 0.5f && b.w <= r.y1 + 0.5f;
}

}  // namespace

TEST(FigureExport, ToolbarsAreNotInTheExportedRectangle) {
  [[maybe_unused]] SoftTexture font = soft_init(1600, 1000);
  {
    AppState s;
    AppUi ui(s);
    s.request_open(std::string(KVSCOPE_SOURCE_DIR) + "/sample_data/stories260K_lily.safetensors");
    for (int i = 0; i < 3000 && !s.capture; ++i) {
      frame(s, ui);
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    ASSERT_TRUE(s.capture) << s.load_error;
    const std::set<std::string> pickers_in_figure = {"error", "output"};
    for (const auto& v : ui.views()) {
      const std::string name = v->name();
      if (name == "method") continue;  // all controls: exported whole (docs/app.md)
      ui.show_view(name);
      s.settings.active_view = name;
      for (int f = 0; f < 3000 && !ui.ready_for_screenshot(name); ++f) {
        frame(s, ui);
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
      frame(s, ui);
      const ScreenRect area = ui.view_area(name), fig = ui.view_rect(name);
      ASSERT_FALSE(area.empty()) << name;
      EXPECT_GT(fig.y0, area.y0 + 4) << name << ": the figure export starts at the toolbar";
      int toolbar = 0, in_figure = 0;
      for (const ImVec4& b : widget_boxes(ImGui::GetDrawData()).boxes) {
        if (!inside(b, area)) continue;
        if (b.w <= fig.y0 + 0.5f)
          ++toolbar;
        else if (b.y < fig.y0 - 0.5f)
          ADD_FAILURE() << name << ": a widget straddles the figure's top edge at y " << fig.y0;
        else
          ++in_figure;
      }
      EXPECT_GT(toolbar, 0) << name << ": no toolbar found above the figure";
      if (!pickers_in_figure.count(name)) {
        EXPECT_EQ(in_figure, 0) << name << ": widgets inside the exported figure";
      }
    }
  }
  ImGui::DestroyContext();
}

// File > Open recent opens a remembered capture; an entry whose file is gone is listed but
// disabled (a click on it does nothing).
TEST(RecentFiles, TheMenuOpensAnEntryAndAVanishedOneIsDisabled) {
  ConfigDir cfg("recent_menu");
  [[maybe_unused]] SoftTexture font = soft_init(1600, 1000);
  const std::string cap = small_capture(cfg.dir, "a.safetensors", 40);
  const std::string gone = (cfg.dir / "gone.safetensors").string();
  {
    RecentFiles r;
    r.add(gone, "capture");
    r.add(cap, "capture");
  }
  {
    AppState s;
    AppUi ui(s);
    ui.enable_recent_files();
    ASSERT_EQ(ui.recent_files()->entries().size(), 2u);
    auto open_submenu = [&] {
      frame(s, ui);
      click(s, ui, "menu:File");
      const ImVec2 at = centre(s, "menu:Open recent");
      ASSERT_GE(at.x, 0) << "File > Open recent was not drawn";
      for (int f = 0; f < 4; ++f) frame(s, ui, {}, false, at);
    };
    open_submenu();
    ASSERT_EQ(s.ui_items.count("recent:" + gone), 1u) << "the vanished file is not listed";
    click(s, ui, "recent:" + gone);
    for (int f = 0; f < 20; ++f) frame(s, ui);
    EXPECT_EQ(s.loading_path, "");
    EXPECT_EQ(s.load_error, "") << "the vanished entry was clickable";
    EXPECT_FALSE(s.capture) << "a vanished entry opened something";
    if (open_popups() == 0) open_submenu();
    ASSERT_EQ(s.ui_items.count("recent:" + cap), 1u);
    click(s, ui, "recent:" + cap);
    for (int i = 0; i < 2000 && s.capture_path != cap; ++i) {
      frame(s, ui);
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    EXPECT_EQ(s.capture_path, cap) << s.load_error;
  }
  ImGui::DestroyContext();
}

// Opening a view changes no setting. The Error view's sweep is derived (an empty
// settings.sweep is the default request while the view is shown), not written on the first visit.
TEST(ErrorView, OpeningItChangesNoSettingAndAsksForTheDefaultSweep) {
  [[maybe_unused]] SoftTexture font = soft_init(1600, 1000);
  {
    AppState s;
    AppUi ui(s);
    s.request_open(std::string(KVSCOPE_SOURCE_DIR) + "/sample_data/stories260K_lily.safetensors");
    for (int i = 0; i < 3000 && !s.capture; ++i) {
      frame(s, ui);
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    ASSERT_TRUE(s.capture) << s.load_error;
    EXPECT_TRUE(s.sweep_request().methods.empty()) << "a sweep is asked for with no Error view";
    EXPECT_EQ(s.result(kSweep).want, "");
    ui.show_view("error");  // as a tab click does: the panel's view is a setting
    for (int f = 0; f < 10 && !s.ui_items.count("sweep:ratios"); ++f) frame(s, ui);
    ASSERT_TRUE(s.ui_items.count("sweep:ratios")) << "the Error view was not drawn";
    EXPECT_TRUE(s.settings.sweep.methods.empty()) << "the first visit wrote the sweep setting";
    const Settings before = s.settings;
    for (int f = 0; f < 60; ++f) frame(s, ui);
    EXPECT_TRUE(s.settings == before) << "drawing the Error view changed a setting";
    EXPECT_TRUE(s.settings.sweep.methods.empty());
    const std::vector<std::string> asked = s.sweep_request().methods;
    for (const std::string& m : default_sweep_methods())
      EXPECT_NE(std::find(asked.begin(), asked.end(), m), asked.end()) << m;
    EXPECT_NE(std::find(asked.begin(), asked.end(), s.method_name(0)), asked.end());
    EXPECT_NE(s.result(kSweep).want, "") << "the default sweep is not planned";
  }
  ImGui::DestroyContext();
}

namespace {

// Characters typed into the focused text field this frame.
void type_text(AppState& s, AppUi& ui, const std::string& text) {
  for (char c : text) ImGui::GetIO().AddInputCharacter(static_cast<unsigned>(c));
  frame(s, ui);
}

}  // namespace

// A value typed into a method parameter (Ctrl+click on its slider, "0.05", Enter) is the double
// 0.05 the CLI parses, in the settings, the session and the grid's caption: the field is a
// double, never rounded through a float (0.05000000074505806).
TEST(Settings, ATypedParameterStaysExactly) {
  [[maybe_unused]] SoftTexture font = soft_init(1600, 1000);
  {
    constexpr int kEnter = 257;  // GLFW_KEY_ENTER, the app's key index
    ImGui::GetIO().KeyMap[ImGuiKey_Enter] = kEnter;
    AppState s;
    AppUi ui(s);
    ui.show_view("method");
    s.request_open(std::string(KVSCOPE_SOURCE_DIR) + "/sample_data/stories260K_lily.safetensors");
    // Until the focused runs are in: their figures above the parameters move them down.
    for (int i = 0; i < 5000 && !(s.capture && s.result(kFocusA).fresh() &&
                                  s.result(kFocusB).fresh() && s.ui_items.count("param:A:gamma"));
         ++i) {
      frame(s, ui);
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    frame(s, ui);
    ASSERT_EQ(s.settings.method[0].name, "balancekv");
    ASSERT_EQ(s.ui_items.count("param:A:gamma"), 1u) << "the gamma slider was not drawn";
    const auto r = s.ui_items.at("param:A:gamma");
    const ImVec2 at(r[0] + 10, (r[1] + r[3]) / 2);
    frame(s, ui, {}, true, at, false);
    frame(s, ui, {}, true, at, true);
    frame(s, ui, {}, true, at, false);
    frame(s, ui, {}, false, at, false);
    ASSERT_TRUE(ImGui::GetIO().WantTextInput)
        << "Ctrl+click did not open the text field at " << at.x << "," << at.y << " rect " << r[0]
        << "," << r[1] << "," << r[2] << "," << r[3] << " active "
        << ImGui::GetCurrentContext()->ActiveId << " hovered "
        << ImGui::GetCurrentContext()->HoveredIdPreviousFrame << " window "
        << (ImGui::GetCurrentContext()->HoveredWindow
                ? ImGui::GetCurrentContext()->HoveredWindow->Name
                : "none");
    type_text(s, ui, "0.05");
    frame(s, ui, {kEnter}, false, at, false);
    frame(s, ui, {}, false, at, false);
    ASSERT_EQ(s.settings.method[0].params.count("gamma"), 1u);
    EXPECT_EQ(s.settings.method[0].params.at("gamma"), 0.05);
    EXPECT_EQ(s.to_session()["params_a"]["gamma"].get<double>(), 0.05);
    for (int i = 0; i < 3000 && !s.grid_report(); ++i) {
      frame(s, ui);
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    ASSERT_TRUE(s.grid_report());
    const std::string caption = grid_json(s)["caption"];
    EXPECT_NE(caption.find("gamma 0.05"), std::string::npos) << caption;
  }
  ImGui::DestroyContext();
}

// On kjv3M L0 H0 (saturated at the defaults) the Walk view offers a remedy only once its effect
// on the head's error is computed, and that effect is run_head's under the remedy's parameters.
TEST(WalkAdvice, TheOfferedRemedyLowersTheErrorComputedBeforeItIsOffered) {
  [[maybe_unused]] SoftTexture font = soft_init(1600, 1000);
  {
    AppState s;
    AppUi ui(s);
    s.settings.method[0] = MethodChoice{"balancekv", {}};
    s.request_open(std::string(KVSCOPE_SOURCE_DIR) + "/sample_data/kjv3M_beginning.safetensors");
    ui.show_view("walk");
    s.settings.active_view = "walk";
    nlohmann::json walk;
    for (int i = 0; i < 20000; ++i) {
      frame(s, ui);
      walk = ui.find_view("walk")->export_json(s);
      if (walk.is_object() && walk.contains("advice")) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    ASSERT_TRUE(walk.is_object() && walk.contains("advice")) << walk.dump().substr(0, 400);
    ASSERT_GT(walk["saturation"]["share"].get<double>(), 0.5);
    const nlohmann::json& advice = walk["advice"];
    ASSERT_FALSE(advice["effects"].empty());
    double lowest = advice["error_now"].get<double>();
    std::string best;
    for (const nlohmann::json& e : advice["effects"]) {
      ParamValues params = e["params"].get<ParamValues>();
      EXPECT_GT(params.count("gamma") ? params["gamma"] : 4.0, 0) << e.dump();
      MethodSettings ms = s.method_settings(0);
      ms.params = params;
      const HeadRun r = run_head(*s.focus_layer(), s.info()->num_layers, 0, ms,
                                 static_cast<uint64_t>(s.settings.seed));
      EXPECT_EQ(r.mean_relative, e["error"].get<double>()) << e.dump();
      if (r.mean_relative < lowest) lowest = r.mean_relative, best = e["remedy"];
    }
    if (best.empty()) {
      EXPECT_TRUE(advice["offered"].is_null());
    } else {
      EXPECT_EQ(advice["offered"], best);
    }
    // Taken (a click on "use ..."): the settings change to the remedy, the head is computed again,
    // and what is offered next (if anything) is another remedy that lowers the new error.
    ASSERT_FALSE(best.empty()) << "kjv3M L0 H0 had a remedy that helps (0.3059 -> 0.2753)";
    const ImVec2 use = centre(s, "walk:use remedy");
    ASSERT_GE(use.x, 0) << "no 'use' button";
    frame(s, ui, {}, false, use, true);
    frame(s, ui, {}, false, use, false);
    EXPECT_EQ(s.settings.method[0].params.at("temp"), 0.1);
    nlohmann::json after;
    for (int i = 0; i < 20000; ++i) {
      frame(s, ui);
      after = ui.find_view("walk")->export_json(s);
      if (after.is_object() && after.contains("advice") &&
          after["advice"]["error_now"].is_number() &&
          after["advice"]["error_now"].get<double>() != advice["error_now"].get<double>())
        break;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    ASSERT_TRUE(after.is_object() && after.contains("advice")) << after.dump().substr(0, 400);
    const double now = after["advice"]["error_now"].get<double>();
    EXPECT_NEAR(now, lowest, 1e-15) << "the error after taking the remedy is the one it promised";
    for (const nlohmann::json& e : after["advice"]["effects"])
      EXPECT_NE(e["remedy"], best) << "the remedy taken is offered again";
    if (!after["advice"]["offered"].is_null()) {
      for (const nlohmann::json& e : after["advice"]["effects"])
        if (e["remedy"] == after["advice"]["offered"]) {
          EXPECT_LT(e["error"].get<double>(), now);
        }
    }
  }
  ImGui::DestroyContext();
}

// A set asked for that cannot be opened leaves the set open as it was and says which file is
// wrong and why (a typo in the Set view's field replaced the open set with an error).
TEST(SetOpen, ABadSetAskedForKeepsTheOpenOneAndNamesTheFile) {
  [[maybe_unused]] SoftTexture font = soft_init(1600, 1000);
  {
    AppState s;
    AppUi ui(s);
    const std::string good = std::string(KVSCOPE_SOURCE_DIR) + "/sample_data/stories260K_set.jsonl";
    const fs::path bad = fs::temp_directory_path() / "kvscope_bad_set_manifest.jsonl";
    std::ofstream(bad) << "{\"path\": \"no_such_capture.safetensors\"}\n";
    auto settle = [&](auto done) {
      for (int i = 0; i < 20000 && !done(); ++i) {
        frame(s, ui);
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
      return done();
    };
    s.request_open(good);
    ASSERT_TRUE(settle([&] { return s.set_path == good && s.result(kSetOpen).fresh(); }))
        << s.set_error;
    s.request_open(bad.string());
    ASSERT_TRUE(settle([&] { return s.set_request.empty() && s.result(kSetOpen).fresh(); }));
    EXPECT_EQ(s.set_path, good);
    EXPECT_NE(s.set_error.find(bad.string()), std::string::npos) << s.set_error;
    EXPECT_NE(s.set_error.find("no_such_capture.safetensors"), std::string::npos) << s.set_error;
    const auto* set = s.result(kSetOpen).get<CaptureSet>();
    ASSERT_NE(set, nullptr);
    EXPECT_EQ(set->entries.size(), 2u);
    // With no set open, a bad one opens nothing and says why.
    AppState fresh_state;
    AppUi fresh_ui(fresh_state);
    fresh_state.request_open(bad.string());
    for (int i = 0; i < 20000 && !fresh_state.set_request.empty(); ++i) {
      frame(fresh_state, fresh_ui);
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    EXPECT_EQ(fresh_state.set_path, "");
    EXPECT_NE(fresh_state.set_error.find("no_such_capture.safetensors"), std::string::npos)
        << fresh_state.set_error;
    fs::remove(bad);
  }
  ImGui::DestroyContext();
}

// The Error view's tuning grid on a capture set's tuning prompts (scope 3): each cell is the mean
// over the tuning prompts of run_grid2's whole-capture figure, and the held-out prompts' figures of
// the best and the default cell are reported beside it.
TEST(SetTuning, TheGridRunsOnTheTuningPromptsAndReportsTheHeldOutOnes) {
  [[maybe_unused]] SoftTexture font = soft_init(1600, 1000);
  {
    AppState s;
    AppUi ui(s);
    const std::string set_path =
        std::string(KVSCOPE_SOURCE_DIR) + "/sample_data/stories260K_set.jsonl";
    s.request_open(set_path);
    for (int i = 0; i < 20000 && !s.result(kSetOpen).fresh(); ++i) {
      frame(s, ui);
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    ASSERT_TRUE(s.result(kSetOpen).fresh()) << s.result(kSetOpen).error;
    ui.find_view("error")->load_state({{"mode", "tune"},
                                       {"tune",
                                        {{"method", "balancekv"},
                                         {"rows", "gamma"},
                                         {"row_values", "1,4"},
                                         {"cols", "temp"},
                                         {"col_values", "0.3,1"},
                                         {"seeds", 1},
                                         {"scope", 3}}}});
    s.settings.method[0] = MethodChoice{"balancekv", {}};
    ui.show_view("error");
    s.settings.active_view = "error";
    nlohmann::json tuning;
    for (int i = 0; i < 30000; ++i) {
      frame(s, ui);
      const Result& r = s.result("tune2");
      if (!r.held.empty() && r.held == r.want) s.run_now("tune2");
      if (r.fresh()) {
        tuning = ui.find_view("error")->export_json(s)["tuning"];
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    ASSERT_TRUE(tuning.is_object() && tuning.contains("set"))
        << "wanted " << !s.result("tune2").want.empty() << ", waiting '"
        << s.result("tune2").waiting << "', error '" << s.result("tune2").error << "', view "
        << s.settings.active_view << ", set open " << s.result(kSetOpen).fresh() << ", state "
        << ui.find_view("error")->save_state().dump();
    EXPECT_EQ(tuning["set"]["tuning_prompts"], 1);
    EXPECT_EQ(tuning["set"]["held_out_prompts"], 1);
    // Recompute: the same split, each capture's grid, and the figures the view reports.
    const PromptSplit split = split_prompts(2, 0.3, static_cast<uint64_t>(s.settings.seed));
    const CaptureSet set = open_capture_set(set_path);
    Grid2Spec g;
    g.method = find_method("balancekv");
    g.rows = {"gamma", {1, 4}};
    g.cols = {"temp", {0.3, 1}};
    EvalSpec spec;
    spec.ratios = {s.settings.keep_ratio};
    spec.seeds = 1;
    spec.base_seed = static_cast<uint64_t>(s.settings.seed);
    std::vector<Grid2Result> grids;
    for (const CaptureSetEntry& e : set.entries) {
      auto capture = CaptureFile::open(e.resolved);
      grids.push_back(run_grid2(*capture, spec, g));
    }
    const Grid2Result& tune = grids[static_cast<size_t>(split.tuning[0])];
    const Grid2Result& held = grids[static_cast<size_t>(split.held_out[0])];
    for (int r = 0; r < 2; ++r)
      for (int c = 0; c < 2; ++c)
        EXPECT_EQ(tuning["ratios"][0]["mean"][r][c].get<double>(), tune.mean[0][r][c])
            << r << "," << c;
    const auto best = tune.best(0);
    EXPECT_EQ(tuning["set"]["held_out_best"].get<double>(), held.mean[0][best.first][best.second]);
    const auto def = tune.default_cell();
    ASSERT_GE(def.first, 0);
    EXPECT_EQ(tuning["set"]["held_out_default"].get<double>(), held.mean[0][def.first][def.second]);
  }
  ImGui::DestroyContext();
}
