// Layout and figure-export tests without a window (the software renderer's ImGui context):
//  - every view, drawn at 1000x700, 1600x1000 and 2560x1440 at UI scales 1 to 2.5, and in
//    presentation (F11: the view alone over the window) at 1x, 2x and 2.5x, has no clipped item:
//    every ImGui window's items lie inside it or it scrolls (app/layout_check.h); the frames
//    are written as PNGs to look at;
//  - SVG figures: the Error, Walk and Teaching views written as SVG parse as XML (a small
//    well-formedness check here; tests/gui/check_svg.py does the same with xml.etree on
//    kvscope-cli's output) and hold their plots' elements: paths and the titles as <text>;
//  - 2x PNGs have twice the pixels of 1x ones;
//  - the Teaching view's keyboard (space, arrows) and narration.
#include <gtest/gtest.h>
#include <imgui.h>
#include <stb_image.h>

#include <cctype>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "app/app_frame.h"
#include "app/app_state.h"
#include "app/export.h"
#include "app/headless.h"
#include "app/layout_check.h"
#include "app/new_capture_dialog.h"
#include "app/plot.h"
#include "app/soft_render.h"
#include "app/views/view.h"
#include "engine/core/error.h"

namespace fs = std::filesystem;
using namespace kvscope;
using namespace kvscope::app;

namespace {

const std::string kSample =
    std::string(KVSCOPE_SOURCE_DIR) + "/sample_data/stories260K_lily.safetensors";

fs::path out_dir() {
  fs::path d = fs::path(KVSCOPE_GUI_OUT);
  fs::create_directories(d);
  return d;
}

// Draws frames until the view is ready (its work done) or 120 s pass.
bool draw_until_ready(AppState& s, AppUi& ui, const std::string& view) {
  const auto t0 = std::chrono::steady_clock::now();
  for (;;) {
    s.worker.drain(s);
    ImGui::GetIO().DeltaTime = 1.0f / 60.0f;
    ImGui::NewFrame();
    ui.draw();
    ImGui::Render();
    if (ui.ready_for_screenshot(view)) return true;
    if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(120)) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

struct LayoutCase {
  int w, h;
  float scale;
  bool presenting = false;  // F11: the active view alone over the whole window
};

// One app state for all sizes (the views' results are computed once); the window size and the
// UI scale change between cases as they do when the user resizes or zooms.
TEST(Layout, EveryViewFitsTheWindowAtEverySize) {
  // The smallest window, and a projector's scales on a laptop's and a 1440p screen.
  const LayoutCase cases[] = {
      {1000, 700, 1.0f},        {1600, 1000, 1.5f},      {1600, 1000, 2.0f},
      {1600, 1000, 2.5f},       {2560, 1440, 1.0f},      {2560, 1440, 2.0f},
      {2560, 1440, 2.5f},       {1000, 700, 1.0f, true}, {1600, 1000, 2.0f, true},
      {1600, 1000, 2.5f, true}, {1920, 1080, 2.5f, true}};
  soft_init(1000, 700, 1.0f);
  int legends_drawn = 0, legends_covering = 0;
  {
    AppState s;
    AppUi ui(s);
    s.settings.grid_seeds = 1;
    s.request_open(kSample);
    for (const LayoutCase& c : cases) {
      ImGuiIO& io = ImGui::GetIO();
      io.DisplaySize = ImVec2(static_cast<float>(c.w), static_cast<float>(c.h));
      ui.set_ui_scale(c.scale);
      ui.set_presenting(c.presenting);
      if (ui.take_font_rebuild()) {
        setup_style_and_fonts(c.scale);
        ImGui::GetStyle().AntiAliasedLinesUseTex = false;  // as soft_init sets it
      }
      const SoftTexture font = soft_font_texture();
      // Every view, plus the Error view's tuning grid and the Walk view's side by side.
      std::vector<std::pair<std::string, nlohmann::json>> shown;
      for (const auto& v : ui.views()) shown.emplace_back(v->name(), nullptr);
      shown.emplace_back("error", nlohmann::json{{"mode", "tune"}});
      shown.emplace_back("walk", nlohmann::json{{"compare", 1}});
      for (const auto& [view_name, state] : shown) {
        const std::string name = view_name;
        const auto t0 = std::chrono::steady_clock::now();
        if (!state.is_null()) ui.find_view(name)->load_state(state);
        ui.show_view(name);
        s.settings.active_view = name;
        ASSERT_TRUE(draw_until_ready(s, ui, name)) << name << " never became ready";
        // One more frame after readiness, as a user would see it.
        clear_legend_log();
        ImGui::NewFrame();
        ui.draw();
        ImGui::Render();
        const auto problems = find_clipped_items();
        // Legends over data: where every place in a plot holds some, the plot keeps a band for
        // the legend outside its data from the next frame on (Plot::legend), unless the band
        // would take more than half the data area (counted and bounded below; docs/app.md).
        for (const PlacedLegend& l : legend_log()) {
          ++legends_drawn, legends_covering += l.covered > 0;
          if (l.covered > 0)
            std::printf("legend over data: %s at %dx%d scale %.1f%s\n", name.c_str(), c.w, c.h,
                        c.scale, c.presenting ? " presenting" : "");
        }
        {  // The view's largest figure: its visible height against the view's.
          const ScreenRect area = ui.view_area(name);
          float best = 0;
          for (const ImVec4& f : figure_log()) {
            if (f.x > area.x1 || f.z < area.x0) continue;
            best = std::max(best, std::min(f.w, area.y1) - std::max(f.y, area.y0));
          }
          const float share = best / (area.y1 - area.y0);
          std::printf("figure: %s%s at %dx%d scale %.1f%s: %.0f of %.0f px (%.2f), sideways %.0f\n",
                      name.c_str(), state.is_null() ? "" : "_alt", c.w, c.h, c.scale,
                      c.presenting ? " presenting" : "", best, area.y1 - area.y0, share,
                      ui.view_scroll_max_x(name));
          // Presented (F11, the projector), a view with a figure shows it: at least 28% of the
          // window's height in sight (the Geometry map had 100 px of 786 at 2x, in a panel).
          if (c.presenting && !figure_log().empty()) {
            EXPECT_GE(share, 0.28f) << name << " presenting at " << c.w << "x" << c.h << " scale "
                                    << c.scale << ": its figure is out of sight";
          }
          // Never sideways, presented or in a panel up to 2x (plots that no longer fit side by
          // side go under each other): at 2.5x in a panel some toolbars still scroll.
          if (c.presenting || c.scale <= 2.0f) {
            EXPECT_EQ(ui.view_scroll_max_x(name), 0.0f)
                << name << " at " << c.w << "x" << c.h << " scale " << c.scale
                << (c.presenting ? " presenting" : "") << " scrolls sideways";
          }
        }
        if (!state.is_null()) {  // back to the default state for the next view and size
          nlohmann::json back = name == "error" ? nlohmann::json{{"mode", "overview"}}
                                                : nlohmann::json{{"compare", 0}};
          ui.find_view(name)->load_state(back);
        }
        std::string text;
        for (const auto& p : problems) text += "\n  " + p.window + ": " + p.what;
        EXPECT_TRUE(problems.empty()) << name << " at " << c.w << "x" << c.h << " scale " << c.scale
                                      << (c.presenting ? " presenting" : "") << ":" << text;
        if (c.presenting) {  // the view alone, across the whole window: no panel, no tabs
          const ScreenRect area = ui.view_area(name);
          EXPECT_LT(area.x0, px(20)) << name << " presenting at " << c.w << "x" << c.h;
          EXPECT_GT(area.x1, c.w - px(20)) << name << " presenting at " << c.w << "x" << c.h;
          EXPECT_LT(area.y0, px(20)) << name << " presenting at " << c.w << "x" << c.h;
        }
        // Pictures to look at: always the small window; large ones when they fail or when
        // KVSCOPE_LAYOUT_PNGS is set (rasterising 2560x1440 on the CPU takes seconds),
        // and the projector's presentation (1600x1000 at 2.5x).
        const bool projector = c.presenting && c.w == 1600 && c.scale == 2.5f;
        if (c.w > 1000 && !projector && problems.empty() && !std::getenv("KVSCOPE_LAYOUT_PNGS"))
          continue;
        std::vector<uint8_t> px;
        soft_render(ImGui::GetDrawData(), font, c.w, c.h, px, IM_COL32(23, 25, 28, 255));
        char file[128];
        std::snprintf(file, sizeof file, "layout_%s%s_%dx%d_s%.0f%s.png", name.c_str(),
                      state.is_null() ? "" : "_alt", c.w, c.h, c.scale * 100,
                      c.presenting ? "_present" : "");
        write_png((out_dir() / file).string(), px, c.w, c.h, false);
        std::printf("%s: %.1f s\n", file,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
      // The dialogs at this size and scale: nothing clipped, and the Open dialog's buttons
      // hold their labels (fixed pixel widths cut them to "Ope" and "Can" at 2x).
      auto frames = [&](int n) {
        for (int f = 0; f < n; ++f) {
          ImGui::NewFrame();
          ui.draw();
          ImGui::Render();
        }
      };
      ui.run_command(Command::OpenCapture);
      frames(3);
      {
        const auto problems = find_clipped_items();
        std::string text;
        for (const auto& p : problems) text += "\n  " + p.window + ": " + p.what;
        EXPECT_TRUE(problems.empty())
            << "Open dialog at " << c.w << "x" << c.h << " scale " << c.scale << ":" << text;
        for (const char* b : {"Open", "Cancel"}) {
          const auto it = s.ui_items.find(std::string("browser:") + b);
          ASSERT_NE(it, s.ui_items.end()) << b << " button not drawn at scale " << c.scale;
          const float need = ImGui::CalcTextSize(b).x + 2 * ImGui::GetStyle().FramePadding.x - 0.5f;
          EXPECT_GE(it->second[2] - it->second[0], need)
              << "the " << b << " button cuts its label at " << c.w << "x" << c.h << " scale "
              << c.scale;
        }
      }
      {  // Cancel closes it, clicked as a user does
        const auto& r = s.ui_items["browser:Cancel"];
        ImGuiIO& io = ImGui::GetIO();
        io.MousePos = ImVec2((r[0] + r[2]) / 2, (r[1] + r[3]) / 2);
        frames(1);
        io.MouseDown[0] = true;
        frames(1);
        io.MouseDown[0] = false;
        frames(2);
        EXPECT_EQ(s.ui_items.count("browser:Cancel"), 0u) << "the Open dialog did not close";
      }
      open_new_capture_dialog();
      frames(3);
      {
        const auto problems = find_clipped_items();
        std::string text;
        for (const auto& p : problems) text += "\n  " + p.window + ": " + p.what;
        EXPECT_TRUE(problems.empty())
            << "New capture dialog at " << c.w << "x" << c.h << " scale " << c.scale << ":" << text;
        if (!problems.empty()) {
          std::vector<uint8_t> px;
          soft_render(ImGui::GetDrawData(), font, c.w, c.h, px, IM_COL32(23, 25, 28, 255));
          char file[128];
          std::snprintf(file, sizeof file, "layout_newcapture_%dx%d_s%.0f.png", c.w, c.h,
                        c.scale * 100);
          write_png((out_dir() / file).string(), px, c.w, c.h, false);
        }
      }
      close_new_capture_dialog();
      frames(2);
    }
  }
  std::printf("legends: %d drawn, %d over data\n", legends_drawn, legends_covering);
  EXPECT_GT(legends_drawn, 100) << "the views drew fewer legends than they have";
  // 59 of 148 before the bands, 9 with bands only where they took at most half the data's
  // height; none since a plot grows by a band that does not fit (docs/app.md).
  EXPECT_EQ(legends_covering, 0) << "legends over data (listed above)";
  ImGui::DestroyContext();
}

// A small XML well-formedness check: tags balance, names are names, attribute values are
// quoted, entities are known. Returns "" when well-formed, else what is wrong. (Hand-written:
// std::regex recurses per character and overflows the stack on long path data.)
std::string xml_problem(const std::string& x) {
  auto is_name_char = [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == ':' || c == '-' || c == '_' ||
           c == '.';
  };
  auto entity_ok = [&](size_t at) {
    for (const char* e : {"&amp;", "&lt;", "&gt;", "&quot;", "&apos;"})
      if (x.compare(at, std::strlen(e), e) == 0) return true;
    return false;
  };
  std::vector<std::string> open;
  size_t i = 0;
  if (x.compare(0, 5, "<?xml") == 0) i = x.find("?>") + 2;
  while (i < x.size()) {
    if (x[i] == '&' && !entity_ok(i)) return "bad entity at " + std::to_string(i);
    if (x[i] != '<') {
      ++i;
      continue;
    }
    const bool closing = i + 1 < x.size() && x[i + 1] == '/';
    size_t j = i + (closing ? 2 : 1);
    const size_t name_start = j;
    while (j < x.size() && is_name_char(x[j])) ++j;
    const std::string name = x.substr(name_start, j - name_start);
    if (name.empty()) return "tag without a name at " + std::to_string(i);
    if (closing) {
      if (j >= x.size() || x[j] != '>') return "malformed </" + name + ">";
      if (open.empty() || open.back() != name) return "</" + name + "> closes nothing open";
      open.pop_back();
      i = j + 1;
      continue;
    }
    // Attributes: name="value" ...
    for (;;) {
      while (j < x.size() && std::isspace(static_cast<unsigned char>(x[j]))) ++j;
      if (j >= x.size()) return "unterminated <" + name + ">";
      if (x[j] == '>' || (x[j] == '/' && j + 1 < x.size() && x[j + 1] == '>')) break;
      const size_t a0 = j;
      while (j < x.size() && is_name_char(x[j])) ++j;
      if (j == a0 || j + 1 >= x.size() || x[j] != '=' || x[j + 1] != '"')
        return "malformed attribute in <" + name + "> at " + std::to_string(a0);
      j += 2;
      for (; j < x.size() && x[j] != '"'; ++j) {
        if (x[j] == '<') return "'<' in an attribute of <" + name + ">";
        if (x[j] == '&' && !entity_ok(j)) return "bad entity in <" + name + ">";
      }
      if (j >= x.size()) return "unterminated attribute in <" + name + ">";
      ++j;
    }
    if (x[j] == '>') {
      open.push_back(name);
      i = j + 1;
    } else {
      i = j + 2;  // "/>"
    }
  }
  if (!open.empty()) return "unclosed <" + open.back() + ">";
  return "";
}

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

int count(const std::string& hay, const std::string& needle) {
  int n = 0;
  for (size_t a = hay.find(needle); a != std::string::npos; a = hay.find(needle, a + 1)) ++n;
  return n;
}

struct SvgCase {
  const char* view;
  std::vector<const char*> texts;  // strings the figure must hold as <text>
};

class SvgFigure : public ::testing::TestWithParam<SvgCase> {};

TEST_P(SvgFigure, ParsesAndHoldsThePlot) {
  const SvgCase c = GetParam();
  HeadlessOptions o;
  o.capture = kSample;
  o.view = c.view;
  o.width = 1400;
  o.height = 900;
  o.out = (out_dir() / (std::string("figure_") + c.view + ".svg")).string();
  ASSERT_EQ(render_view_software(o), 0);
  const std::string svg = read_file(o.out);
  ASSERT_GT(svg.size(), 1000u);
  EXPECT_EQ(xml_problem(svg), "");
  EXPECT_NE(svg.find("<svg xmlns=\"http://www.w3.org/2000/svg\""), std::string::npos);
  EXPECT_GT(count(svg, "<path "), 20) << "plot shapes missing";
  EXPECT_GT(count(svg, "<text "), 10) << "labels missing";
  for (const char* t : c.texts) EXPECT_NE(svg.find(std::string(">") + t), std::string::npos) << t;
  // No menu bar or tab bar text: the figure is the view's content only.
  EXPECT_EQ(svg.find(">File<"), std::string::npos);
  EXPECT_EQ(svg.find(">Tokens<"), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(
    Views, SvgFigure,
    ::testing::Values(SvgCase{"error", {"relative error", "keep ratio (log2 axis)"}},
                      SvgCase{"walk", {"p_i before clipping", "discrepancy vs random signs"}},
                      SvgCase{"teaching",
                              {"vectors u_i, direction z and the signed prefix sums", "u1", "u5"}}),
    [](const auto& info) { return std::string(info.param.view); });

// File > Export view as SVG in the app: the request waits two frames (the dialog closes), the
// frame it is taken from is drawn without anti-aliasing, and anti-aliasing comes back after.
TEST(SvgFigure, AppRequestIsWrittenFromALaterFrame) {
  soft_init(1200, 800);
  const fs::path out = out_dir() / "app_request_teaching.svg";
  fs::remove(out);
  {
    AppState s;
    AppUi ui(s);
    s.request_open(kSample);
    ui.show_view("teaching");
    s.settings.active_view = "teaching";
    ASSERT_TRUE(draw_until_ready(s, ui, "teaching"));
    ui.request_svg(out.string(), "teaching");
    bool saw_aa_off = false;
    for (int frame = 0; frame < 4; ++frame) {
      ui.before_frame();
      saw_aa_off = saw_aa_off || !ImGui::GetStyle().AntiAliasedLines;
      ImGui::NewFrame();
      ui.draw();
      ImGui::Render();
      ui.after_render(ImGui::GetDrawData());
      if (frame < 2) {
        EXPECT_FALSE(fs::exists(out)) << "written before the dialog closed";
      }
    }
    EXPECT_TRUE(saw_aa_off);
    EXPECT_TRUE(ImGui::GetStyle().AntiAliasedLines);  // restored
    ASSERT_TRUE(fs::exists(out));
    const std::string svg = read_file(out);
    EXPECT_EQ(xml_problem(svg), "");
    EXPECT_NE(svg.find(">u1<"), std::string::npos);
    EXPECT_NE(svg.find(">vectors u_i, direction z and the signed prefix sums<"), std::string::npos);
  }
  ImGui::DestroyContext();
}

TEST(PngDensity, TwoXHasTwiceThePixels) {
  int w[2], h[2];
  for (int k = 0; k < 2; ++k) {
    HeadlessOptions o;
    o.capture = kSample;
    o.view = "teaching";
    o.width = 1000;
    o.height = 700;
    o.density = k == 0 ? 1.0f : 2.0f;
    o.out = (out_dir() / (k == 0 ? "density_1x.png" : "density_2x.png")).string();
    ASSERT_EQ(render_view_software(o), 0);
    int n = 0;
    unsigned char* px = stbi_load(o.out.c_str(), &w[k], &h[k], &n, 3);
    ASSERT_NE(px, nullptr);
    stbi_image_free(px);
  }
  // The same layout at twice the pixels: within 1.5% (style sizes are rounded to whole pixels
  // when scaled, so a few rows and columns differ).
  EXPECT_NEAR(w[1], 2 * w[0], 0.015 * w[1]);
  EXPECT_NEAR(h[1], 2 * h[0], 0.015 * h[1]);
}

TEST(UiScale, OutOfRangeIsAnError) {
  HeadlessOptions o;
  o.capture = kSample;
  o.out = "x.png";
  o.ui_scale = 3.0f;
  EXPECT_THROW(validate_options(o), InputError);
  o.ui_scale = 2.0f;
  o.density = 2.0f;
  EXPECT_THROW(validate_options(o), InputError);
}

TEST(UiScale, PreferenceIsRemembered) {
  const fs::path dir = fs::temp_directory_path() / "kvscope_prefs_test";
  fs::remove_all(dir);
  setenv("KVSCOPE_CONFIG_DIR", dir.c_str(), 1);
  EXPECT_EQ(load_ui_scale_pref(), 1.0f);
  save_ui_scale_pref(1.75f);
  EXPECT_EQ(load_ui_scale_pref(), 1.75f);
  {
    std::ofstream f(dir / "ui.json");
    f << "{ not json";
  }
  EXPECT_EQ(load_ui_scale_pref(), 1.0f);  // damaged file: the default, no crash
  fs::remove_all(dir);
  unsetenv("KVSCOPE_CONFIG_DIR");
}

// The Teaching view through its keys: right arrow signs one vector, space plays, left arrow
// steps back; the narration names the step.
TEST(Teaching, KeysStepAndPlay) {
  soft_init(1200, 800);
  {
    AppState s;
    AppUi ui(s);
    ui.show_view("teaching");
    View* v = ui.find_view("teaching");
    ASSERT_NE(v, nullptr);
    auto frame = [&](int key = -1) {
      ImGuiIO& io = ImGui::GetIO();
      for (bool& down : io.KeysDown) down = false;
      if (key >= 0) io.KeysDown[key] = true;
      ImGui::NewFrame();
      ui.draw();
      ImGui::Render();
      if (key >= 0) {  // release
        io.KeysDown[key] = false;
        ImGui::NewFrame();
        ui.draw();
        ImGui::Render();
      }
    };
    ImGuiIO& io = ImGui::GetIO();
    // The software context has no backend key map; map the keys the view asks for.
    io.KeyMap[ImGuiKey_Space] = 32;
    io.KeyMap[ImGuiKey_RightArrow] = 262;
    io.KeyMap[ImGuiKey_LeftArrow] = 263;
    frame();
    frame();
    auto signed_steps = [&]() { return v->export_json(s)["steps"].size(); };
    const size_t all = v->export_json(s)["vectors"].size();
    ASSERT_EQ(all, 5u);
    // The talk example opens filled in; reset via left arrows down to 0.
    for (size_t i = 0; i < all; ++i) frame(263);
    EXPECT_EQ(signed_steps(), 0u);
    frame(262);
    EXPECT_EQ(signed_steps(), 1u);
    frame(262);
    EXPECT_EQ(signed_steps(), 2u);
    const nlohmann::json j = v->export_json(s);
    EXPECT_EQ(j["steps"][1]["sigma"], -1);  // talk example: + - + + -
    const std::string said = j["narration"];
    EXPECT_NE(said.find("u2"), std::string::npos) << said;
    EXPECT_NE(said.find("sigma = -1"), std::string::npos) << said;
    frame(263);
    EXPECT_EQ(signed_steps(), 1u);
    frame(32);  // play: advances by itself over the next frames
    for (int i = 0; i < 300 && signed_steps() < all; ++i) frame();
    EXPECT_EQ(signed_steps(), all);
  }
  ImGui::DestroyContext();
}

}  // namespace
