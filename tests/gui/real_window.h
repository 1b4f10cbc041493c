// The real KVScope window under Xvfb, driven by xdotool (mouse moves, clicks, drags, key presses
// through the XTEST extension, exactly as a user's), for the real-input GUI tests
// (test_gui_input.cpp, test_gui_oracle.cpp). The app runs with --export-dir: F9 writes every
// view's numbers and the app's state (settings, results with their status, the screen rectangles
// of the widgets a test clicks) as JSON, F10 a PNG of the active view.
//
// Built for a loaded 2-core CI machine: nothing waits a fixed time for the app; the start waits
// for the window to be viewable and the app to answer F9, every later wait polls the app's state
// (F9) with a generous limit, and a failure names the step and shows what the app reported
// last. Widgets are found from the rectangles the app records, not from fixed coordinates.
// Each click is made once: a lost click is a bug of the app, not of the machine.
#pragma once

#include <gtest/gtest.h>
#include <stb_image.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

namespace kvscope_gui_test {

namespace fs = std::filesystem;
using nlohmann::json;

const std::string kSampleDir = std::string(KVSCOPE_SOURCE_DIR) + "/sample_data";
const std::string kSample = kSampleDir + "/stories260K_lily.safetensors";

// Limits for waits: far above what the flow needs on an idle machine (each wait there is well
// under a second), so that a loaded CI machine does not fail it. kWaitS is for what the app does
// at once (a click answered, a widget drawn); kComputeWaitS for what it computes (a grid, a map,
// an evaluation), which a machine whose every core is busy with other work stretches tenfold
// and more (tools/check-under-load.sh).
constexpr double kWaitS = 60;
constexpr double kComputeWaitS = 600;

inline std::string sh(const std::string& cmd, int* rc = nullptr) {
  std::string out;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return out;
  char buf[4096];
  size_t got;
  while ((got = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, got);
  int status = pclose(p);
  if (rc) *rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

inline void pause_ms(int ms) {
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

// What the app reported, in a few lines: the settings the flow changes and each result's status.
inline std::string summary(const json& st) {
  if (!st.is_object() || !st.contains("session")) return "(no state)";
  const json& se = st["session"];
  std::string out = "capture " + st.value("capture_path", std::string()) + "\nload_error \"" +
                    st.value("load_error", std::string()) + "\"\ndialog_open " +
                    st["dialog_open"].dump() + ", active_view " + se["active_view"].dump() +
                    ", method_a " + se["method_a"].dump() + " params_a " + se["params_a"].dump() +
                    ", method_b " + se["method_b"].dump() + ", keep_ratio " +
                    se["keep_ratio"].dump() + ", seed " + se["seed"].dump() + ", focus " +
                    se["focus"].dump() + "\nresults:";
  for (const auto& [name, r] : st["results"].items()) {
    if (!r["wanted"].get<bool>()) continue;
    out += "\n  " + name + ": ";
    if (r["fresh"].get<bool>()) out += "fresh ";
    if (r["stale"].get<bool>()) out += "stale ";
    if (r["running"].get<bool>()) out += "running ";
    if (r["held_for_run"].get<bool>())
      out += "held for Run (estimate " + r["estimate_s"].dump() + " s) ";
    if (r["cancelled"].get<bool>()) out += "cancelled ";
    if (!r["waiting"].get<std::string>().empty()) out += "waiting: " + r["waiting"].dump() + " ";
    if (!r["error"].get<std::string>().empty()) out += "error: " + r["error"].dump();
  }
  return out;
}

class RealWindow : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::getenv("DISPLAY")) GTEST_SKIP() << "no X display (run under tools/with-xvfb.sh)";
    int rc = 0;
    sh("command -v xdotool", &rc);
    if (rc != 0) GTEST_SKIP() << "xdotool is not installed (tools/bootstrap.sh installs it)";
    t0_ = std::chrono::steady_clock::now();
    dir_ = fs::path(KVSCOPE_GUI_OUT) / out_name_;
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    broken_ = dir_ / "broken.safetensors";
    std::ofstream(broken_) << "this is not a safetensors file";
    launch("app.log");
  }

  // Starts the app on `capture_` in `dir_` (its log in `log_name` there) and waits for its window.
  // An app that exits at once because the X server refused its connection (seen under heavy
  // load: "Failed to open display", while the server still answered other clients) is started
  // again, up to three times, each noted: that is the display's failure, not the app's.
  void launch(const char* log_name) {
    for (int attempt = 1;; ++attempt) {
      start_app(log_name);
      window_ = wait_viewable_window(attempt < 3 ? log_name : nullptr);
      if (window_ >= 0) break;
      waitpid(pid_, nullptr, 0);
      note("the X server refused the app's connection (attempt " + std::to_string(attempt) +
           "); starting it again");
      pause_ms(1000);
    }
    ASSERT_GT(window_, 0);
    xdo("windowmove " + std::to_string(window_) + " 0 0");
    ASSERT_TRUE(focus_window());
    move_to(700, 450);
    // The app's own ready state: it answers F9, so its frame loop runs and takes the keys.
    // state() fails the test, naming the step, when it does not within its limit.
    ASSERT_TRUE(state().contains("session"));
  }

  void start_app(const char* log_name) {
    pid_ = fork();
    if (pid_ == 0) {
      if (chdir(dir_.c_str()) != 0) _exit(127);
      setenv("KVSCOPE_CONFIG_DIR", dir_.c_str(), 1);  // recent files etc.: not the user's home
      FILE* log = std::fopen(log_name, "w");
      if (log) {
        dup2(fileno(log), 1);
        dup2(fileno(log), 2);
      }
      const std::string w = std::to_string(width_), h = std::to_string(height_);
      execl(app_.c_str(), app_.c_str(), capture_.c_str(), "--export-dir", dir_.c_str(), "--width",
            w.c_str(), "--height", h.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    ASSERT_GT(pid_, 0);
  }

  // The app's window once X shows it. GLFW names the window before it maps it (it makes the GL
  // context in between, slowly under a sanitizer or on a busy machine): a window found by its
  // name alone may not be mapped yet, and X refuses the input focus to a window that is not
  // viewable (BadMatch in X_SetInputFocus). --onlyvisible lists only windows whose map state is
  // IsViewable; --pid keeps to this app's window (GLFW sets _NET_WM_PID). Polled rather than
  // `search --sync`, so that an app that exits is noticed at once. 0 (and a failure) when none
  // is shown within kComputeWaitS: starting is not something the app does at once (the sanitized
  // app on a loaded 2-core machine once took over 60 s to map its window). With `retry_log`
  // (the app's log): -1, and no failure, when the app exited because the X server refused its
  // connection (the caller starts it again).
  long wait_viewable_window(const char* retry_log = nullptr) {
    const auto t0 = std::chrono::steady_clock::now();
    const std::string cmd =
        "xdotool search --all --onlyvisible --pid " + std::to_string(pid_) + " --name KVScope";
    std::string out;
    for (;;) {
      if (app_exited()) {
        if (retry_log) {
          std::ifstream in(dir_ / retry_log);
          const std::string log((std::istreambuf_iterator<char>(in)),
                                std::istreambuf_iterator<char>());
          if (log.find("Failed to open display") != std::string::npos) return -1;
        }
        ADD_FAILURE() << "step " << step_ << ": the app exited before its window was shown";
        return 0;
      }
      int rc = 0;
      out = sh(cmd, &rc);
      char* end = nullptr;
      const long id = std::strtol(out.c_str(), &end, 10);
      if (rc == 0 && end != out.c_str() && id > 0) return id;
      if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() >
          kComputeWaitS) {
        ADD_FAILURE() << "step " << step_ << ": the app's window was not viewable within "
                      << kComputeWaitS
                      << " s (" << cmd << ": rc " << rc << ", \"" << out << "\"); its windows:\n"
                      << sh("xdotool search --pid " + std::to_string(pid_) +
                            " --name KVScope | xargs -r -n1 xwininfo -id | grep -E "
                            "'Window id|Map State'");
        return 0;
      }
      pause_ms(100);
    }
  }

  // Gives the window the keyboard focus (without a window manager nothing keeps it there). The
  // window is viewable once launch() has found it, so X grants the focus at once; a refusal
  // all the same is retried for a bounded time, then fails the test with xdotool's message and
  // the window's map state. False on a failure.
  bool focus_window() {
    const auto t0 = std::chrono::steady_clock::now();
    const std::string id = std::to_string(window_);
    for (;;) {
      int rc = 0;
      const std::string out = sh("xdotool windowfocus " + id, &rc);
      if (rc == 0) return true;
      if (app_exited()) {
        ADD_FAILURE() << "step " << step_ << ": the app has exited (xdotool windowfocus: " << out
                      << ")";
        return false;
      }
      if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > kWaitS) {
        ADD_FAILURE() << "step " << step_ << ": the window " << id
                      << " did not take the input focus within " << kWaitS
                      << " s: xdotool windowfocus " << id << ": " << out
                      << sh("xwininfo -id " + id + " | grep 'Map State'");
        return false;
      }
      pause_ms(100);
    }
  }

  void TearDown() override {
    if (HasFailure()) {
      std::ifstream log(dir_ / "app.log");
      std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
      std::fprintf(stderr, "[gui] failed in step %s; exports in %s\n[gui] app output:\n%s\n",
                   step_.c_str(), dir_.c_str(), text.c_str());
      int status = 0;
      if (pid_ > 0 && waitpid(pid_, &status, WNOHANG) == pid_) {
        std::fprintf(stderr, "[gui] the app exited (status %d)\n", status);
        pid_ = -1;
      } else if (pid_ > 0 && std::getenv("KVSCOPE_GUI_DEBUG")) {
        std::fprintf(stderr, "%s\n",
                     sh("gdb -p " + std::to_string(pid_) +
                        " -batch -ex 'thread 1' -ex 'bt 25' 2>/dev/null | grep '^#'")
                         .c_str());
      }
    }
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      int status = 0;
      for (int i = 0; i < 50 && waitpid(pid_, &status, WNOHANG) == 0; ++i) pause_ms(100);
      if (waitpid(pid_, &status, WNOHANG) == 0) {
        kill(pid_, SIGKILL);
        waitpid(pid_, &status, 0);
      }
    }
  }

  double elapsed() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  }
  // Names the step for the log and for every failure message after it.
  void step(const std::string& what) {
    step_ = what;
    std::fprintf(stderr, "[gui] %5.1f s  step %s\n", elapsed(), what.c_str());
  }
  void note(const std::string& what) {
    std::fprintf(stderr, "[gui] %5.1f s    %s\n", elapsed(), what.c_str());
  }

  void xdo(const std::string& args) {
    int rc = 0;
    std::string out = sh("xdotool " + args, &rc);
    ASSERT_EQ(rc, 0) << "step " << step_ << ": xdotool " << args << ": " << out;
  }
  // The pauses below pace the input as a hand does (a button held across frames); they are not
  // waits for the app, which are all polls of its state.
  void move_to(double x, double y) {
    xdo("mousemove --window " + std::to_string(window_) + " " + std::to_string(std::lround(x)) +
        " " + std::to_string(std::lround(y)));
    pause_ms(60);
  }
  void key(const std::string& k) {
    // Keys go to the window with the input focus: without a window manager nothing keeps it
    // there, so it is set before every key.
    if (!focus_window()) return;
    xdo("key " + k);
    pause_ms(120);
  }
  void type(const std::string& text) {
    xdo("type --delay 15 -- '" + text + "'");  // -- : text may start with '-'
    pause_ms(120);
  }

  // The app has exited. It is not reaped here (WNOWAIT): whoever waits for it still gets its
  // exit status.
  bool app_exited() const {
    if (pid_ <= 0) return true;
    siginfo_t info{};
    return waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
           info.si_pid == pid_;
  }
  // Called when the app, still running, has not answered F9 for a minute (the soak takes the
  // threads' stacks here).
  virtual void no_answer() {}

  // Presses F9 and reads the state the app wrote. An empty object when the app does not answer
  // within a minute, or has exited (both recorded as failures, at once for an exit).
  json state() {
    const fs::path p = dir_ / "state.json";
    fs::remove(p);
    // A frame can take long on a loaded machine (software GL): the key is pressed again after
    // 5 s without an answer, up to a minute in all.
    for (int attempt = 0; attempt < 12; ++attempt) {
      if (app_exited()) {
        ADD_FAILURE() << "step " << step_ << ": the app has exited (no state.json on F9)";
        return json::object();
      }
      // F8 and F9 both export; alternating them keeps two quick taps of one key from being
      // taken for an auto-repeat by GLFW on a loaded X server.
      key(export_key_++ % 2 ? "F8" : "F9");
      for (int i = 0; i < 100; ++i) {
        if (fs::exists(p)) {
          try {
            std::ifstream in(p);
            json j = json::parse(in);
            if (j.is_object() && j.contains("session")) return j;
          } catch (const json::exception&) {
          }
        }
        if (i % 20 == 19 && app_exited()) break;
        pause_ms(50);
      }
    }
    if (app_exited()) {
      ADD_FAILURE() << "step " << step_ << ": the app has exited (no state.json on F9)";
      return json::object();
    }
    no_answer();
    ADD_FAILURE() << "step " << step_ << ": the app wrote no state.json on F9 in 60 s";
    return json::object();
  }
  json view_json(const std::string& view) {
    std::ifstream in(dir_ / (view + ".json"));
    return json::parse(in);
  }
  // Waits until `pred(state)` holds (up to `seconds`); returns the last state. On a timeout the
  // failure names the step, what was awaited and what the app reported last.
  template <typename Pred>
  json wait_for(Pred pred, double seconds, const std::string& what) {
    const auto t0 = std::chrono::steady_clock::now();
    json st;
    for (;;) {
      st = state();
      if (!st.contains("session")) return st;  // exited or not answering: already a failure
      if (pred(st)) return st;
      if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > seconds) {
        ADD_FAILURE() << "step " << step_ << ": timed out after " << seconds << " s waiting for "
                      << what << "\nthe app reported:\n"
                      << summary(st) << "\nwidgets drawn: " << widget_names(st)
                      << "\nlast click: " << last_click_ << " now at "
                      << (st.contains("ui_items") && st["ui_items"].contains(last_click_item_)
                              ? st["ui_items"][last_click_item_].dump()
                              : "(not drawn)");
        return st;
      }
      pause_ms(150);
    }
  }
  static std::string widget_names(const json& st) {
    std::string out;
    if (st.contains("ui_items"))
      for (const auto& [name, r] : st["ui_items"].items()) out += name + "; ";
    return out;
  }
  // Waits until the widget is drawn (e.g. a combo's list, the frame after the click) and
  // returns that state.
  // A new popup is measured in a hidden frame at a provisional place first: the rectangle
  // counts once two frames agree.
  json with_item(const std::string& item) {
    json last;
    return wait_for(
        [&](const json& s) {
          if (!s["ui_items"].contains(item)) return false;
          const bool same = last == s["ui_items"][item];
          last = s["ui_items"][item];
          return same;
        },
        kWaitS, "widget '" + item + "' to be drawn");
  }
  // Centre of a recorded widget.
  std::pair<double, double> centre(const json& st, const std::string& item) {
    const json& it = st["ui_items"][item];
    EXPECT_TRUE(it.is_array()) << "step " << step_ << ": widget '" << item
                               << "' was not drawn; drawn: " << widget_names(st);
    if (!it.is_array()) return {0, 0};
    return {(it[0].get<double>() + it[2].get<double>()) / 2,
            (it[1].get<double>() + it[3].get<double>()) / 2};
  }
  void click(const json& st, const std::string& item) {
    note("click " + item);
    auto [x, y] = centre(st, item);
    remember_click(item, x, y);
    move_to(x, y);
    // Press and release as a hand does, with the button held across frames.
    xdo("mousedown 1");
    pause_ms(120);
    xdo("mouseup 1");
    pause_ms(150);
  }
  void double_click(const json& st, const std::string& item) {
    note("double-click " + item + " (two clicks 80 ms apart)");
    auto [x, y] = centre(st, item);
    remember_click(item, x, y);
    move_to(x, y);
    xdo("click --repeat 2 --delay 80 1");
    pause_ms(150);
  }
  void remember_click(const std::string& item, double x, double y) {
    last_click_item_ = item;
    last_click_ = item + " at (" + std::to_string(std::lround(x)) + ", " +
                  std::to_string(std::lround(y)) + ")";
  }
  // Drags a slider from 20 % of its width to `to_frac`.
  // Drags the slider `item` to `to_frac` of its width, where the widget is now: the state is read
  // until the widget's rectangle is the same in two reads in a row (a status line that appears
  // above it as a job starts moves it down, and a drag at the old place moves another slider).
  void drag(const json& st_in, const std::string& item, double to_frac) {
    note("drag " + item);
    json st = st_in;
    for (int look = 0; look < 20; ++look) {
      json again = state();
      if (!again.contains("ui_items")) break;
      const bool same = st.contains("ui_items") && st["ui_items"].contains(item) &&
                        again["ui_items"].contains(item) &&
                        st["ui_items"][item] == again["ui_items"][item];
      st = std::move(again);
      if (same) break;
    }
    const json& it = st["ui_items"][item];
    ASSERT_TRUE(it.is_array()) << "step " << step_ << ": widget '" << item
                               << "' was not drawn; drawn: " << widget_names(st);
    const double x0 = it[0].get<double>(), x1 = it[2].get<double>();
    const double y = (it[1].get<double>() + it[3].get<double>()) / 2;
    // The slider is the left part of the item (the label is on its right): 200 px wide at most.
    const double w = std::min(200.0, x1 - x0);
    move_to(x0 + 0.2 * w, y);
    xdo("mousedown 1");
    pause_ms(80);
    for (int i = 1; i <= 5; ++i) move_to(x0 + (0.2 + (to_frac - 0.2) * i / 5) * w, y);
    xdo("mouseup 1");
    pause_ms(150);
  }

  // Waits until no job runs, so that the layout (status lines) no longer moves under the mouse.
  json settled() {
    return wait_for(
        [](const json& s) {
          for (const auto& [name, r] : s["results"].items())
            if (r["running"].get<bool>()) return false;
          return true;
        },
        kWaitS, "the jobs to finish");
  }
  // Waits for a file the app writes (atomically: it exists only once complete).
  bool wait_file(const fs::path& p) {
    const auto t0 = std::chrono::steady_clock::now();
    while (!fs::exists(p)) {
      if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > kWaitS) {
        ADD_FAILURE() << "step " << step_ << ": the app did not write " << p << " in " << kWaitS
                      << " s";
        return false;
      }
      pause_ms(100);
    }
    return true;
  }

  static bool fresh(const json& st, const char* name) {
    return st["results"].contains(name) && st["results"][name]["fresh"].get<bool>();
  }

  // What a fixture derived from this one may set in its constructor.
  std::string out_name_ = "input";  // folder under KVSCOPE_GUI_OUT for exports and app.log
  std::string capture_ = kSample;   // the capture the app opens
  std::string app_ = KVSCOPE_APP;   // the app's executable (the soak runs a sanitized build)
  int width_ = 1400, height_ = 900;

  fs::path dir_, broken_;
  pid_t pid_ = -1;
  int export_key_ = 0;
  long window_ = 0;
  std::string step_ = "setup";
  std::string last_click_ = "(none)", last_click_item_;
  std::chrono::steady_clock::time_point t0_;
};

struct Png {
  int w = 0, h = 0;
  std::vector<unsigned char> px;
};
inline Png load_png(const fs::path& p) {
  Png im;
  int n = 0;
  unsigned char* d = stbi_load(p.c_str(), &im.w, &im.h, &n, 3);
  if (d) {
    im.px.assign(d, d + static_cast<size_t>(im.w) * im.h * 3);
    stbi_image_free(d);
  }
  return im;
}

}  // namespace kvscope_gui_test
