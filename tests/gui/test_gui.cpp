// GUI test: scripted sessions of the real app under Xvfb (skipped with a message when Xvfb
// is missing) and of kvscope-cli render (software rasteriser, needs no display). Each opens the
// bundled stories260K capture, shows one view, writes a PNG, and the PNG is checked for content:
// not blank, enough distinct colours, and for the Capture view one heatmap cell per (layer, kv
// head) found by colour sampling (5 x 4 = 20 for the sample).
#include <gtest/gtest.h>
#include <stb_image.h>  // implementation in Debian's libstb

#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "app/views/view.h"

namespace fs = std::filesystem;

namespace {

const std::string kSample =
    std::string(KVSCOPE_SOURCE_DIR) + "/sample_data/stories260K_lily.safetensors";
// stories260K: 5 layers x 4 kv heads.
constexpr int kSampleCells = 5 * 4;
// What each view is shown on: the sample capture, and for the Set view the sample set.
std::string input_for(const std::string& view) {
  if (view == "set") return std::string(KVSCOPE_SOURCE_DIR) + "/sample_data/stories260K_set.jsonl";
  return kSample;
}

struct Image {
  int w = 0, h = 0;
  std::vector<unsigned char> px;  // RGB
  std::array<int, 3> at(int x, int y) const {
    const unsigned char* p = &px[(static_cast<size_t>(y) * w + x) * 3];
    return {p[0], p[1], p[2]};
  }
};

Image load_png(const std::string& path) {
  Image im;
  int n = 0;
  unsigned char* data = stbi_load(path.c_str(), &im.w, &im.h, &n, 3);
  if (!data) return im;
  im.px.assign(data, data + static_cast<size_t>(im.w) * im.h * 3);
  stbi_image_free(data);
  return im;
}

fs::path out_dir() {
  fs::path d = fs::path(KVSCOPE_GUI_OUT);
  fs::create_directories(d);
  return d;
}

struct RunResult {
  int rc = -1;
  std::string output;
};

RunResult run(const std::string& cmd) {
  RunResult r;
  std::string full = cmd + " 2>&1";
  FILE* p = popen(full.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t got;
  while ((got = fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, got);
  int status = pclose(p);
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

bool have_xvfb() {
  return run("command -v Xvfb").rc == 0;
}

// Fraction of pixels that differ clearly from the most common colour (the background).
double content_ratio(const Image& im) {
  std::vector<int> hist(4096, 0);
  for (int y = 0; y < im.h; ++y)
    for (int x = 0; x < im.w; ++x) {
      auto c = im.at(x, y);
      ++hist[(c[0] >> 4) << 8 | (c[1] >> 4) << 4 | (c[2] >> 4)];
    }
  int bg = 0;
  for (int i = 1; i < 4096; ++i)
    if (hist[i] > hist[bg]) bg = i;
  long other = 0;
  for (int i = 0; i < 4096; ++i)
    if (i != bg) other += hist[i];
  return static_cast<double>(other) / (static_cast<double>(im.w) * im.h);
}

int distinct_colours(const Image& im) {
  std::set<int> s;
  for (int y = 0; y < im.h; ++y)
    for (int x = 0; x < im.w; ++x) {
      auto c = im.at(x, y);
      s.insert((c[0] >> 3) << 10 | (c[1] >> 3) << 5 | (c[2] >> 3));
    }
  return static_cast<int>(s.size());
}

// Distance of a colour to the viridis curve the Capture grid uses (9 control points, linear).
double viridis_distance(const std::array<int, 3>& c) {
  static const double cp[9][3] = {{68, 1, 84},    {71, 44, 122},  {59, 81, 139},
                                  {44, 113, 142}, {33, 144, 141}, {39, 173, 129},
                                  {92, 200, 99},  {170, 220, 50}, {253, 231, 37}};
  double best = 1e9;
  for (int i = 0; i < 8; ++i)
    for (int k = 0; k <= 16; ++k) {
      double t = k / 16.0, d = 0;
      for (int ch = 0; ch < 3; ++ch) {
        double v = cp[i][ch] + (cp[i + 1][ch] - cp[i][ch]) * t - c[ch];
        d += v * v;
      }
      best = std::min(best, std::sqrt(d));
    }
  return best;
}

// Connected regions of viridis-coloured pixels that look like grid cells (a square-ish block of
// at least 20 x 20 pixels; the colour bar is a thin tall strip and is not counted).
int count_grid_cells(const Image& im) {
  std::vector<uint8_t> mask(static_cast<size_t>(im.w) * im.h, 0);
  for (int y = 0; y < im.h; ++y)
    for (int x = 0; x < im.w; ++x) {
      auto c = im.at(x, y);
      int spread = std::max({c[0], c[1], c[2]}) - std::min({c[0], c[1], c[2]});
      // Greys (background, text) are never cells; viridis colours are saturated.
      if (spread > 40 && viridis_distance(c) < 10) mask[static_cast<size_t>(y) * im.w + x] = 1;
    }
  int cells = 0;
  std::vector<int> stack;
  for (int y0 = 0; y0 < im.h; ++y0)
    for (int x0 = 0; x0 < im.w; ++x0) {
      if (mask[static_cast<size_t>(y0) * im.w + x0] != 1) continue;
      int minx = x0, maxx = x0, miny = y0, maxy = y0;
      long area = 0;
      stack.assign(1, y0 * im.w + x0);
      mask[static_cast<size_t>(y0) * im.w + x0] = 2;
      while (!stack.empty()) {
        int p = stack.back();
        stack.pop_back();
        ++area;
        int x = p % im.w, y = p / im.w;
        minx = std::min(minx, x);
        maxx = std::max(maxx, x);
        miny = std::min(miny, y);
        maxy = std::max(maxy, y);
        const int nx[4] = {x - 1, x + 1, x, x}, ny[4] = {y, y, y - 1, y + 1};
        for (int k = 0; k < 4; ++k) {
          if (nx[k] < 0 || ny[k] < 0 || nx[k] >= im.w || ny[k] >= im.h) continue;
          size_t q = static_cast<size_t>(ny[k]) * im.w + nx[k];
          if (mask[q] == 1) {
            mask[q] = 2;
            stack.push_back(ny[k] * im.w + nx[k]);
          }
        }
      }
      int bw = maxx - minx + 1, bh = maxy - miny + 1;
      double aspect = static_cast<double>(bw) / bh;
      if (bw >= 20 && bh >= 20 && aspect > 0.33 && aspect < 3.0 && area > 0.5 * bw * bh) ++cells;
    }
  return cells;
}

void expect_content(const Image& im, const std::string& what) {
  ASSERT_GT(im.w, 200) << what << ": PNG missing or unreadable";
  ASSERT_GT(im.h, 200) << what;
  EXPECT_GT(content_ratio(im), 0.03) << what << ": looks blank";
  EXPECT_GT(distinct_colours(im), 40) << what << ": too few colours for a drawn view";
}

// Every view the app has: the registry's list (app/views/view.h), never typed again here.
const std::vector<std::string> kViews = kvscope::app::view_names();

class SoftwareRender : public ::testing::TestWithParam<std::string> {};

TEST_P(SoftwareRender, ViewShowsContent) {
  const std::string view = GetParam();
  const fs::path png = out_dir() / ("render_" + view + ".png");
  fs::remove(png);
  RunResult r = run(std::string("\"") + KVSCOPE_CLI + "\" render \"" + input_for(view) +
                    "\" --view " + view + " --out \"" + png.string() + "\" --timeout 240");
  ASSERT_EQ(r.rc, 0) << r.output;
  Image im = load_png(png.string());
  expect_content(im, png.string());
  if (view == "capture") {
    EXPECT_EQ(count_grid_cells(im), kSampleCells) << png;
  }
}

INSTANTIATE_TEST_SUITE_P(Views, SoftwareRender, ::testing::ValuesIn(kViews));

TEST(SoftwareRender, BadFileIsAnError) {
  const fs::path bad = out_dir() / "truncated.safetensors";
  {
    std::ofstream f(bad, std::ios::binary);
    // Header length 64, then a header cut short: the file ends inside the JSON.
    const char bytes[] = "\x40\x00\x00\x00\x00\x00\x00\x00{\"__metadata__\":";
    f.write(bytes, sizeof bytes - 1);
  }
  RunResult r = run(std::string("\"") + KVSCOPE_CLI + "\" render \"" + bad.string() +
                    "\" --view capture --out \"" + (out_dir() / "bad.png").string() + "\"");
  EXPECT_EQ(r.rc, 1) << r.output;
  EXPECT_NE(r.output.find("truncated.safetensors"), std::string::npos) << r.output;
}

TEST(SoftwareRender, UnknownViewIsAnError) {
  RunResult r =
      run(std::string("\"") + KVSCOPE_CLI + "\" render \"" + kSample +
          "\" --view nosuchview --out \"" + (out_dir() / "nosuchview.png").string() + "\"");
  EXPECT_EQ(r.rc, 1) << r.output;
  EXPECT_NE(r.output.find("--view"), std::string::npos) << r.output;
}

class AppUnderXvfb : public ::testing::TestWithParam<std::string> {};

std::string app_cmd(const std::string& args) {
  // An Xvfb server of its own per run: xvfb-run -a races for a display number under ctest -j.
  return std::string("\"") + KVSCOPE_SOURCE_DIR + "/tools/with-xvfb.sh\" \"" + KVSCOPE_APP + "\" " +
         args;
}

TEST_P(AppUnderXvfb, ViewShowsContent) {
  if (!have_xvfb()) {
    GTEST_SKIP() << "Xvfb not found: the windowed app test needs it";
  }
  const std::string view = GetParam();
  const fs::path png = out_dir() / ("app_" + view + ".png");
  fs::remove(png);
  RunResult r = run(app_cmd(std::string("\"") + input_for(view) + "\" --view " + view +
                            " --screenshot \"" + png.string() + "\" --timeout 240"));
  ASSERT_EQ(r.rc, 0) << r.output;
  Image im = load_png(png.string());
  expect_content(im, png.string());
  if (view == "capture") {
    EXPECT_EQ(count_grid_cells(im), kSampleCells) << png;
  }
}

INSTANTIATE_TEST_SUITE_P(Views, AppUnderXvfb, ::testing::ValuesIn(kViews));

// A bad file opened after a good one: the window shows the loader's message and keeps the good
// capture (its grid is still there).
TEST(AppUnderXvfbSession, BadFileKeepsCurrentCapture) {
  if (!have_xvfb()) {
    GTEST_SKIP() << "Xvfb not found: the windowed app test needs it";
  }
  const fs::path bad = out_dir() / "not_a_capture.safetensors";
  {
    std::ofstream f(bad, std::ios::binary);
    f << "this is not a safetensors file";
  }
  const fs::path png = out_dir() / "app_bad_file.png";
  fs::remove(png);
  RunResult r =
      run(app_cmd("\"" + kSample + "\" --then-open \"" + bad.string() +
                  "\" --view capture --full-window --screenshot \"" + png.string() + "\""));
  ASSERT_EQ(r.rc, 0) << r.output;
  Image im = load_png(png.string());
  expect_content(im, png.string());
  EXPECT_EQ(count_grid_cells(im), kSampleCells) << "the good capture should stay open";
  // The error banner is dark red (0.35, 0.08, 0.08).
  long red = 0;
  for (int y = 0; y < im.h; ++y)
    for (int x = 0; x < im.w; ++x) {
      auto c = im.at(x, y);
      if (std::abs(c[0] - 89) < 6 && std::abs(c[1] - 20) < 6 && std::abs(c[2] - 20) < 6) ++red;
    }
  EXPECT_GT(red, 2000) << "no error banner in " << png;
}

}  // namespace
