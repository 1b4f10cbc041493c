// The soak test: the app built with AddressSanitizer + UBSan
// (-DKVSCOPE_SANITIZE=ON), its real window under Xvfb, driven for minutes by a seeded random
// stream of real input (xdotool through tests/gui/real_window.h): clicks, double clicks and drags
// anywhere in every view of the registry (the tabs the app draws, checked against `kvscope
// --help`), on the widgets it records and inside whatever popup is open, slider drags, wheel
// scrolls, keys and typed text, tab switches, window resizes, UI scale changes (Ctrl +, Ctrl -,
// Ctrl 0), good captures and every malformed file of tests/malformed/ opened through the real
// File > Open dialog (typed into its path field), File > New capture runs, exports (F9, F10,
// Ctrl+E). Nothing is aimed at fixed pixels: every target comes from the state the app exports.
//
// Pass (checked here, written to soak_report.json and soak_report.txt):
// - no sanitizer report (ASAN_OPTIONS / UBSAN_OPTIONS halt on the first error and log to files
//   in the export folder; LeakSanitizer is off because Mesa's GL driver leaks at start-up, see
//   docs/testing.md: resident memory is checked instead), no crash, and a clean File > Quit;
// - no hang: every F9 is answered (the state's frame counter is the heartbeat) within a minute;
// - every malformed file answered by its error, naming the file, while the open capture stays;
//   every good capture opened;
// - resident memory flat after warm-up: under 10 % growth from the warm-up to the end (median
//   of 5 s of 1 s samples of VmRSS at each end), judged in runs of 5 minutes or more (tools/
//   soak.sh), reported in shorter ones;
// - frame times recorded (median and 99th percentile in the report);
// - every exported number still eval's (tests/gui/numbers_oracle.h), checked every so often and
//   at the end, after the app has settled.
//
// Environment: KVSCOPE_SOAK_SECONDS (60), KVSCOPE_SOAK_SEED (1), KVSCOPE_SOAK_WARMUP_S (120 for
// runs of 5 minutes or more, else a third of the run), KVSCOPE_SOAK_REPORT (folder for the
// report; default the export folder), KVSCOPE_SANITIZED_APP (the sanitized app; default the
// build folder tools/run-tests.sh makes). Without a sanitized app the test skips and says how
// to build one. tools/soak.sh runs it for people (10 minutes by default); CI runs 60 s.
#include <sys/types.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "tests/gui/numbers_oracle.h"

using namespace kvscope_gui_test;

namespace {

double env_double(const char* name, double fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atof(v) : fallback;
}
std::string env_string(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : fallback;
}

std::string sanitized_app() {
  return env_string("KVSCOPE_SANITIZED_APP", KVSCOPE_SANITIZED_APP_DEFAULT);
}

double median_of(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}
// The q-quantile (nearest rank).
double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t rank = static_cast<size_t>(std::ceil(q * static_cast<double>(v.size())));
  return v[std::min(v.size() - 1, rank > 0 ? rank - 1 : 0)];
}

// VmRSS of a process, sampled once a second on a thread.
class RssSampler {
 public:
  void start(pid_t pid, std::chrono::steady_clock::time_point t0) {
    pid_ = pid;
    t0_ = t0;
    thread_ = std::thread([this] {
      while (!stop_) {
        const long kb = read_kb();
        if (kb > 0) {
          std::lock_guard<std::mutex> lock(mu_);
          samples_.push_back(
              {std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count(),
               static_cast<double>(kb)});
        }
        for (int i = 0; i < 10 && !stop_; ++i) pause_ms(100);
      }
    });
  }
  void stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  ~RssSampler() { stop(); }
  std::vector<std::pair<double, double>> samples() {
    std::lock_guard<std::mutex> lock(mu_);
    return samples_;
  }

 private:
  long read_kb() const {
    std::ifstream in("/proc/" + std::to_string(pid_) + "/status");
    std::string line;
    while (std::getline(in, line))
      if (line.rfind("VmRSS:", 0) == 0) return std::atol(line.c_str() + 6);
    return -1;
  }
  pid_t pid_ = -1;
  std::chrono::steady_clock::time_point t0_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::vector<std::pair<double, double>> samples_;  // (seconds, kB)
};

// Every failure gtest records during the soak, for the report.
class FailureLog : public ::testing::EmptyTestEventListener {
 public:
  explicit FailureLog(std::vector<std::string>* out) : out_(out) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (r.failed()) out_->push_back(r.message() ? r.message() : "(no message)");
  }

 private:
  std::vector<std::string>* out_;
};

class Soak : public NumbersOracle {
 protected:
  Soak() {
    out_name_ = "soak";
    width_ = 1400;
    height_ = 900;
    settle_s_ = 300;  // the sanitized app computes several times slower than Release
  }

  void SetUp() override {
    app_ = sanitized_app();
    if (!fs::exists(app_))
      GTEST_SKIP()
          << "no sanitized app at " << app_
          << ": the soak runs the app built with -DKVSCOPE_SANITIZE=ON (tools/run-tests.sh "
             "and tools/soak.sh build it into build-sanitized-app; "
             "KVSCOPE_SANITIZED_APP names another)";
    // The sanitizers stop at the first report and write it to a file in the export folder
    // (the app's own stderr goes to app.log as well). The child inherits these.
    const fs::path dir = fs::path(KVSCOPE_GUI_OUT) / out_name_;
    const std::string asan =
        "halt_on_error=1:abort_on_error=0:detect_leaks=0:log_path=" + (dir / "asan").string() +
        ":malloc_context_size=20";
    const std::string ubsan =
        "halt_on_error=1:print_stacktrace=1:log_path=" + (dir / "ubsan").string();
    setenv("ASAN_OPTIONS", asan.c_str(), 1);
    setenv("UBSAN_OPTIONS", ubsan.c_str(), 1);
    asan_options_ = asan;
    RealWindow::SetUp();
  }

  // ---- bookkeeping
  double soak_t() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - soak_t0_).count();
  }
  void event(const std::string& kind, const std::string& detail) {
    ++by_kind_[kind];
    events_log_.push_back(
        {{"t", std::round(soak_t() * 10) / 10}, {"kind", kind}, {"detail", detail}});
    note("event " + std::to_string(events_log_.size()) + " " + kind + " " + detail);
  }
  // The app is still running (reaps it and records how it ended when not).
  bool alive() {
    if (pid_ <= 0) return false;
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      // A quit through the app's own exit path says so in its autosave (clean_exit); a crash,
      // a sanitizer's halt or a kill leave the last periodic autosave.
      bool clean = false;
      try {
        std::ifstream in(dir_ / "autosave.json");
        const json a = json::parse(in);
        clean = a.contains("autosave") && a["autosave"].value("clean_exit", false);
      } catch (const std::exception&) {
      }
      const json last = events_log_.empty() ? json() : events_log_.back();
      exit_ = {{"how", clean ? "quit during the soak (its own exit path: the autosave says "
                               "clean_exit)"
                             : "died during the soak"},
               {"status", WIFEXITED(status) ? WEXITSTATUS(status) : -1},
               {"signal", WIFSIGNALED(status) ? WTERMSIG(status) : 0},
               {"noticed_at_s", soak_t()},
               {"last_event", last}};
      ADD_FAILURE() << "the app " << (clean ? "quit" : "died") << " during the soak, noticed at "
                    << soak_t() << " s (" << exit_.dump()
                    << "); see the sanitizer reports and app.log in " << dir_;
      return false;
    }
    return true;
  }
  // No answer to F9 for a minute from a running app: a hang. Every thread's stack goes into
  // the report (gdb attaches to the app; the sanitized build has line tables).
  void no_answer() override {
    ++hangs_;
    exit_ = {{"how", "hang: no answer to F9 in 60 s"}, {"at_s", soak_t()}};
    hang_stack_ = sh("timeout 120 gdb -p " + std::to_string(pid_) +
                     " -batch -ex 'thread apply all bt 30' 2>&1 | grep -E '^#|^Thread|ptrace'");
    note("hang: every thread's stack:\n" + hang_stack_);
  }
  // F9, with the frame heartbeat and the frame times taken from the answer. An empty object
  // when the app did not answer (a hang; no_answer has taken the stacks) or has exited.
  json poll() {
    if (!alive()) return json::object();
    json st = state();
    if (!st.contains("session")) {
      alive();  // an exit is recorded with its status
      return st;
    }
    take_frames(st);
    if (st.contains("memory") && st["memory"]["heap_live"].get<int64_t>() >= 0)
      heap_.push_back({soak_t(), st["memory"]["heap_live"].get<double>() / 1024,
                       st["memory"]["heap_mapped"].get<double>() / 1024});
    return st;
  }
  void take_frames(const json& st) {
    if (!st.contains("frames")) {
      ADD_FAILURE() << "state.json has no frame heartbeat (frames)";
      return;
    }
    const uint64_t count = st["frames"]["count"].get<uint64_t>();
    const json& recent = st["frames"]["recent_ms"];
    if (count <= frames_seen_ && frames_seen_ > 0)
      ADD_FAILURE() << "the frame counter did not advance (" << count << " after " << frames_seen_
                    << ")";
    const uint64_t fresh_frames = count - std::min(count, frames_seen_);
    const size_t take = static_cast<size_t>(std::min<uint64_t>(fresh_frames, recent.size()));
    frames_lost_ += fresh_frames - take;
    for (size_t i = recent.size() - take; i < recent.size(); ++i)
      frame_ms_.push_back({soak_t(), recent[i].get<double>()});
    frames_seen_ = std::max(frames_seen_, count);
  }

  // ---- helpers on the exported state
  static bool has(const json& st, const std::string& item) {
    return st.contains("ui_items") && st["ui_items"].contains(item);
  }
  static std::array<double, 4> rect_of(const json& r) {
    return {r[0].get<double>(), r[1].get<double>(), r[2].get<double>(), r[3].get<double>()};
  }
  double uniform(double a, double b) { return std::uniform_real_distribution<double>(a, b)(rng_); }
  int pick(int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng_); }
  bool chance(double p) { return uniform(0, 1) < p; }
  // A point inside a rectangle, a few pixels in from its edges.
  std::pair<double, double> point_in(const std::array<double, 4>& r) {
    const double mx = std::min(4.0, (r[2] - r[0]) / 4), my = std::min(4.0, (r[3] - r[1]) / 4);
    return {uniform(r[0] + mx, r[2] - mx), uniform(r[1] + my, r[3] - my)};
  }
  // A point of the area for a press or a release, away from File > Quit (a random click inside
  // the open File menu quit the app at step 794 of a 10-minute run: docs/testing.md). False
  // when the area has no such point.
  bool safe_point_in(const json& st, const std::array<double, 4>& area, double* x, double* y) {
    const bool quit_drawn = has(st, "menu:Quit");
    const std::array<double, 4> quit =
        quit_drawn ? rect_of(st["ui_items"]["menu:Quit"]) : std::array<double, 4>{};
    for (int i = 0; i < 20; ++i) {
      std::tie(*x, *y) = point_in(area);
      // A margin: the pointer is where xdotool puts it, give or take a rounding.
      if (!quit_drawn || *x < quit[0] - 3 || *x > quit[2] + 3 || *y < quit[1] - 3 ||
          *y > quit[3] + 3)
        return true;
    }
    return false;
  }
  // Where random pointer events go: inside the top-most popup when one is open (a modal dialog
  // takes all input), else the active view's area.
  std::array<double, 4> target_area(const json& st, std::string* what) {
    if (st.contains("popups") && !st["popups"].empty() && chance(0.8)) {
      const json& top = st["popups"].back();
      *what = "popup " + top["name"].get<std::string>();
      return rect_of(top["rect"]);
    }
    *what = "view " + st["session"]["active_view"].get<std::string>();
    std::array<double, 4> r = rect_of(st["view_rect"]);
    if (r[2] - r[0] < 8 || r[3] - r[1] < 8) {  // not drawn yet: the whole window
      *what = "window";
      r = {0, 0, st["display"][0].get<double>(), st["display"][1].get<double>()};
    }
    return r;
  }
  void press(int button) {
    xdo("mousedown " + std::to_string(button));
    pause_ms(90);
    xdo("mouseup " + std::to_string(button));
    pause_ms(60);
  }

  // Closes menus, lists, dialogs and the Help window (Escape; the New capture dialog by its
  // Close button), and leaves any text field: the state from which a scripted flow starts.
  json calm() {
    json st;
    for (int i = 0; i < 8; ++i) {
      st = poll();
      if (!st.contains("session")) return st;
      const bool popups = st.contains("popups") && !st["popups"].empty();
      if (!popups && !st["dialog_open"].get<bool>() && !st["help_open"].get<bool>() &&
          !st.value("text_input", false) && !st["restore_prompt"]["open"].get<bool>())
        return st;
      if (st["restore_prompt"]["open"].get<bool>() && has(st, "button:Discard autosave")) {
        click(st, "button:Discard autosave");
        continue;
      }
      if (i >= 2 && has(st, "newcapture:Close")) {
        click(st, "newcapture:Close");
        continue;
      }
      if (i >= 3 && has(st, "browser:Cancel")) {
        click(st, "browser:Cancel");
        continue;
      }
      key("Escape");
    }
    ADD_FAILURE() << "step " << step_
                  << ": menus, dialogs or a text field still open after 8 tries: "
                  << (st.contains("popups") ? st["popups"].dump() : "?");
    return st;
  }

  // ---- the events
  void ev_click(const json& st) {
    std::string what;
    const auto area = target_area(st, &what);
    double x = 0, y = 0;
    if (!safe_point_in(st, area, &x, &y)) return;
    const int kind = pick(10);
    move_to(x, y);
    if (kind < 7) {
      press(1);
    } else if (kind < 9) {
      xdo("click --repeat 2 --delay 80 1");
      pause_ms(60);
    } else {
      press(3);
    }
    event(kind < 7   ? "click"
          : kind < 9 ? "double_click"
                     : "right_click",
          what + " at " + std::to_string(std::lround(x)) + "," + std::to_string(std::lround(y)));
    count_view(st);
  }
  void ev_drag(const json& st) {
    std::string what;
    const auto area = target_area(st, &what);
    double x0 = 0, y0 = 0, x1 = 0, y1 = 0;
    if (!safe_point_in(st, area, &x0, &y0) || !safe_point_in(st, area, &x1, &y1)) return;
    move_to(x0, y0);
    xdo("mousedown 1");
    pause_ms(80);
    for (int i = 1; i <= 6; ++i) move_to(x0 + (x1 - x0) * i / 6, y0 + (y1 - y0) * i / 6);
    xdo("mouseup 1");
    pause_ms(80);
    event("drag", what);
    count_view(st);
  }
  void ev_scroll(const json& st) {
    std::string what;
    auto [x, y] = point_in(target_area(st, &what));
    move_to(x, y);
    const bool up = chance(0.5);
    const int n = 1 + pick(5);
    xdo(std::string("click --repeat ") + std::to_string(n) + " --delay 40 " + (up ? "4" : "5"));
    pause_ms(60);
    event("scroll", what + (up ? " up " : " down ") + std::to_string(n));
    count_view(st);
  }
  // A recorded widget (combo, slider, grid, list entry, tab, menu, button), any but Quit.
  void ev_widget(const json& st) {
    std::vector<std::string> names;
    for (const auto& [name, r] : st["ui_items"].items())
      if (name != "menu:Quit") names.push_back(name);
    if (names.empty()) return ev_click(st);
    const std::string name = names[static_cast<size_t>(pick(static_cast<int>(names.size())))];
    auto [x, y] = point_in(rect_of(st["ui_items"][name]));
    move_to(x, y);
    press(1);
    event("widget", name);
    count_view(st);
  }
  void ev_slider(const json& st) {
    std::vector<std::string> names;
    for (const auto& [name, r] : st["ui_items"].items())
      if (name.rfind("slider:", 0) == 0 || name.rfind("input:", 0) == 0) names.push_back(name);
    if (names.empty()) return ev_drag(st);
    const std::string name = names[static_cast<size_t>(pick(static_cast<int>(names.size())))];
    const auto r = rect_of(st["ui_items"][name]);
    const double w = std::min(200.0, r[2] - r[0]), y = (r[1] + r[3]) / 2;
    const double from = uniform(0.05, 0.95), to = uniform(0.0, 1.0);
    move_to(r[0] + from * w, y);
    xdo("mousedown 1");
    pause_ms(80);
    for (int i = 1; i <= 5; ++i) move_to(r[0] + (from + (to - from) * i / 5) * w, y);
    xdo("mouseup 1");
    pause_ms(80);
    event("slider", name + " " + std::to_string(from) + " -> " + std::to_string(to));
    count_view(st);
  }
  void ev_key() {
    static const char* keys[] = {
        "Left",   "Right",     "Up",        "Down",   "space",  "Return",     "Escape",
        "Tab",    "shift+Tab", "BackSpace", "Delete", "Home",   "End",        "Prior",
        "Next",   "a",         "s",         "d",      "w",      "n",          "p",
        "r",      "1",         "2",         "plus",   "minus",  "F1",         "F10",
        "ctrl+a", "ctrl+z",    "ctrl+s",    "ctrl+e", "ctrl+o", "shift+Left", "ctrl+Right"};
    const std::string k = keys[pick(static_cast<int>(std::size(keys)))];
    key(k);
    event("key", k);
  }
  void ev_type() {
    static const char alphabet[] = "abcxyz0123456789 .-_/";
    std::string text;
    const int n = 1 + pick(12);
    for (int i = 0; i < n; ++i) text += alphabet[pick(static_cast<int>(sizeof alphabet - 1))];
    type(text);
    event("type", "'" + text + "'");
  }
  void ev_tab(const json& st) {
    std::vector<std::string> tabs;
    for (const std::string& v : views_)
      if (has(st, "tab:" + v)) tabs.push_back(v);
    if (tabs.empty()) return ev_click(st);
    // The view least visited first half the time: every view gets its share.
    std::string v = tabs[static_cast<size_t>(pick(static_cast<int>(tabs.size())))];
    if (chance(0.5))
      for (const std::string& t : tabs)
        if (view_events_[t] < view_events_[v]) v = t;
    click(st, "tab:" + v);
    ++view_tabs_[v];
    event("tab", v);
  }
  void ev_resize() {
    // The sizes the layout is made for (test_layout: 1000 x 700 to the 1600 x 1000 screen).
    const int w = 1000 + 40 * pick(16), h = 700 + 20 * pick(16);
    xdo("windowsize " + std::to_string(window_) + " " + std::to_string(w) + " " +
        std::to_string(h));
    pause_ms(200);
    event("resize", std::to_string(w) + "x" + std::to_string(h));
    json st = poll();
    if (st.contains("display") && (st["display"][0] != w || st["display"][1] != h)) {
      // The resize reaches the app as an event: give it a few frames.
      for (int i = 0;
           i < 10 && st.contains("display") && (st["display"][0] != w || st["display"][1] != h);
           ++i) {
        pause_ms(200);
        st = poll();
      }
    }
    if (st.contains("display") && st["display"][0] == w && st["display"][1] == h)
      sizes_seen_.insert(std::to_string(w) + "x" + std::to_string(h));
    else
      ++resizes_unapplied_;
  }
  void ev_scale() {
    static const char* keys[] = {"ctrl+equal", "ctrl+minus", "ctrl+0", "ctrl+KP_Add"};
    const int k = pick(4);
    key(keys[k]);
    event("ui_scale", keys[k]);
    const json after = poll();
    if (after.contains("ui_scale")) scales_seen_.insert(after["ui_scale"].get<double>());
  }
  void ev_export() {
    const int k = pick(3);
    if (k == 0) {
      key("F10");
      event("export", "F10 (PNG of the active view)");
    } else if (k == 1) {
      key(chance(0.5) ? "F9" : "F8");
      event("export", "F9 (every view's JSON and state.json)");
    } else {
      json st = calm();
      if (!st.contains("session")) return;
      key("ctrl+e");
      // Return must reach the dialog, not the view under it: wait for the app to show it.
      st = wait_for([](const json& s) { return s["dialog_open"].get<bool>(); }, kWaitS,
                    "the Save as dialog after Ctrl+E");
      if (!st.contains("session") || !st["dialog_open"].get<bool>()) return;
      key("Return");
      event("export", "Ctrl+E, Return (PNG through the Save as dialog)");
    }
    ++exports_;
  }

  // File > Open (Ctrl+O or the menu), the path typed into the dialog's field, Enter.
  bool open_dialog() {
    json st = calm();
    if (!st.contains("session")) return false;
    if (chance(0.5) || !has(st, "menu:File")) {
      key("ctrl+o");
    } else {
      click(st, "menu:File");
      st = with_item("menu:Open capture");
      if (!has(st, "menu:Open capture")) return false;
      click(st, "menu:Open capture");
    }
    st = with_item("browser:path");
    if (!has(st, "browser:path")) return false;
    click(st, "browser:path");
    key("ctrl+a");
    return true;
  }
  void ev_open_good() {
    open_good(good_[static_cast<size_t>(pick(static_cast<int>(good_.size())))]);
  }
  void open_good(const std::string& path) {
    step("open " + path);
    const auto t0 = std::chrono::steady_clock::now();
    if (!open_dialog()) return;
    type(path);
    key("Return");
    event("open_good", path);
    json st = wait_for(
        [&](const json& s) { return s["capture_path"] == path && !s["loading"].get<bool>(); },
        settle_s_, "the capture " + path + " to open");
    const bool ok = st.contains("session") && st["capture_path"] == path;
    opens_good_.push_back(
        {{"file", path},
         {"opened", ok},
         {"seconds",
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()}});
  }
  void ev_open_bad() {
    if (bad_queue_.empty()) {  // every malformed file once per pass, in a seeded order
      bad_queue_ = bad_;
      std::shuffle(bad_queue_.begin(), bad_queue_.end(), rng_);
    }
    const std::string path = bad_queue_.back();
    bad_queue_.pop_back();
    step("open the malformed " + path);
    json st = calm();
    if (!st.contains("session")) return;
    const std::string before = st["capture_path"];
    if (!open_dialog()) return;
    type(path);
    key("Return");
    event("open_malformed", path);
    st = wait_for(
        [&](const json& s) {
          return !s["loading"].get<bool>() &&
                 (s["load_error"].get<std::string>().find(path) != std::string::npos ||
                  s["capture_path"] != before);
        },
        settle_s_, "the error for " + path);
    if (!st.contains("session")) return;
    const std::string message = st["load_error"];
    const bool named = message.find(path) != std::string::npos;
    const bool kept = st["capture_path"] == before;
    EXPECT_TRUE(named) << "step " << step_ << ": the error does not name the file: " << message;
    EXPECT_TRUE(kept) << "step " << step_ << ": the open capture changed from " << before << " to "
                      << st["capture_path"];
    opens_bad_.push_back(
        {{"file", path}, {"message", message}, {"names_file", named}, {"capture_kept", kept}});
  }
  // File > New capture, Run with the dialog's settings, then Close: the new capture opens.
  void ev_new_capture() {
    step("File > New capture");
    json st = calm();
    if (!st.contains("session") || !has(st, "menu:File")) return;
    const std::string before = st["capture_path"];
    const auto t0 = std::chrono::steady_clock::now();
    click(st, "menu:File");
    st = with_item("menu:New capture");
    if (!has(st, "menu:New capture")) return;
    click(st, "menu:New capture");
    st = with_item("newcapture:Run");
    if (!has(st, "newcapture:Run")) return;
    click(st, "newcapture:Run");
    event("new_capture", "Run with the dialog's settings");
    st = wait_for(
        [&](const json& s) {
          return s["capture_path"] != before && !s["loading"].get<bool>() &&
                 has(s, "newcapture:Run");  // the run is over: Run is back
        },
        settle_s_, "the new capture to open");
    const bool ok = st.contains("session") && st["capture_path"] != before;
    new_captures_.push_back(
        {{"opened", ok},
         {"path", st.value("capture_path", std::string())},
         {"seconds",
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()}});
    if (has(st, "newcapture:Close")) click(st, "newcapture:Close");
  }

  void count_view(const json& st) {
    if (st.contains("popups") && !st["popups"].empty()) return;
    ++view_events_[st["session"]["active_view"].get<std::string>()];
  }

  // ---- the oracle: the app settled on its settings, every exported number against eval
  json run_held(json st) {
    // A result that waits for Run (its estimate is above the auto-run limit: the sanitized app
    // measures slow) or was cancelled by a random click: Run, as a user does.
    for (int round = 0; round < 6; ++round) {
      std::string need;
      for (const char* n : {"focus.A", "focus.B", "grid"}) {
        if (!st["results"].contains(n)) continue;
        const json& r = st["results"][n];
        if (r["wanted"].get<bool>() &&
            (r["held_for_run"].get<bool>() || r["cancelled"].get<bool>()) &&
            !r["fresh"].get<bool>())
          need = n;
      }
      if (need.empty()) return st;
      st = show_tab(st, need == "grid" ? "capture" : "method");
      st = state();
      if (!has(st, "run:" + need)) st = reveal(st, "run:" + need);
      if (!has(st, "run:" + need)) return st;
      click(st, "run:" + need);
      st = poll();
    }
    return st;
  }
  void oracle_check(const std::string& why) {
    step("oracle (" + why + ")");
    json st = calm();
    if (!st.contains("session")) return;
    // The Tokens view in the main panel: the other views' own results (a t-SNE, a generation)
    // are not wanted while the numbers are compared.
    if (has(st, "tab:tokens") && st["session"]["panels"][1] != "tokens") {
      click(st, "tab:tokens");
      st = wait_for([](const json& s) { return s["session"]["panels"][1] == "tokens"; }, kWaitS,
                    "the Tokens view in the main panel");
    }
    st = run_held(st);
    st = quiet();
    if (!st.contains("session")) return;
    ++oracle_checks_;
    // A slot whose run failed has no numbers: eval must refuse the same settings.
    bool errors = false;
    for (const char* slot : {"A", "B"}) {
      const std::string name = std::string("focus.") + slot;
      if (!st["results"].contains(name) || !st["results"][name]["wanted"].get<bool>()) continue;
      const std::string error = st["results"][name]["error"];
      if (error.empty()) continue;
      errors = true;
      const bool refused = eval_refuses(st, slot);
      oracle_log_.push_back({{"t", soak_t()},
                             {"capture", st["capture_path"]},
                             {"slot", slot},
                             {"app_error", error},
                             {"eval_refused", refused}});
      EXPECT_TRUE(refused) << "step " << step_ << ": the app reports \"" << error
                           << "\" for method " << slot << " but eval gives numbers for the same "
                           << "settings\n"
                           << summary(st);
    }
    if (errors) return;
    const long before = numbers_compared_, differing = numbers_differing_;
    check_numbers(st);
    oracle_log_.push_back({{"t", soak_t()},
                           {"capture", st["capture_path"]},
                           {"method_a", st["session"]["method_a"]},
                           {"method_b", st["session"]["method_b"]},
                           {"keep_ratio", st["session"]["keep_ratio"]},
                           {"focus", st["session"]["focus"]},
                           {"numbers", numbers_compared_ - before},
                           {"differing", numbers_differing_ - differing}});
  }
  // eval of the focused head with the slot's method and settings: true when it refuses them.
  bool eval_refuses(const json& st, const char* slot) {
    const json& se = st["session"];
    const bool a = slot[0] == 'A';
    std::ostringstream cmd;
    cmd.precision(17);
    const std::string method = se[a ? "method_a" : "method_b"];
    cmd << KVSCOPE_CLI << " eval '" << st["capture_path"].get<std::string>() << "' --methods '"
        << method << "' --ratios " << se["keep_ratio"].get<double>() << " --seeds 1 --base-seed "
        << se["seed"].get<int>() << " --threads 1 --layers " << se["focus"]["layer"].get<int>()
        << " --heads " << se["focus"]["kv_head"].get<int>();
    for (const auto& [k, v] : se[a ? "params_a" : "params_b"].items())
      cmd << " --param '" << method << "." << k << "=" << v << "'";
    if (se["sink"].get<int>() >= 0) cmd << " --sink " << se["sink"].get<int>();
    if (se["eval"].get<int>() >= 0) cmd << " --eval " << se["eval"].get<int>();
    cmd << " --estimator " << se["estimator"].get<std::string>();
    int rc = 0;
    sh(cmd.str() + " --json '" + (dir_ / "eval_refused.json").string() + "'", &rc);
    ++evals_;
    return rc != 0;
  }

  // The views of this build, as `kvscope --help` lists them for --view.
  std::vector<std::string> help_views() {
    const std::string help = sh("'" + app_ + "' --help");
    std::vector<std::string> out;
    const size_t at = help.find("view to show:");
    if (at == std::string::npos) return out;
    size_t end = help.find("\n  -", at);
    std::string list =
        help.substr(at + 13, end == std::string::npos ? std::string::npos : end - at - 13);
    std::string word;
    for (char c : list + ",") {
      if (c == ',' || c == '\n') {
        word.erase(0, word.find_first_not_of(' '));
        word.erase(word.find_last_not_of(' ') + 1);
        if (!word.empty()) out.push_back(word);
        word.clear();
      } else {
        word += c;
      }
    }
    return out;
  }

  // The captures to open: the samples and the corpus files the reader accepts (kvscope-cli info,
  // which opens a file as the app does) are good; the others must be refused with their error.
  void sort_corpus() {
    for (const auto& e : fs::directory_iterator(kSampleDir))
      if (e.path().extension() == ".safetensors") good_.push_back(e.path().string());
    for (const auto& e : fs::directory_iterator(fs::path(KVSCOPE_SOURCE_DIR) / "tests/malformed")) {
      const std::string ext = e.path().extension().string();
      if (ext != ".safetensors" && ext != ".npz") continue;
      int rc = 0;
      sh(std::string(KVSCOPE_CLI) + " info '" + e.path().string() + "' >/dev/null", &rc);
      (rc == 0 ? good_ : bad_).push_back(e.path().string());
    }
    std::sort(good_.begin(), good_.end());
    std::sort(bad_.begin(), bad_.end());
  }

  void write_report(double seconds, double ran, uint64_t seed, double warmup);

  // Sanitizer reports: the files the runtimes wrote (log_path), and any report in the app's
  // output (GCC's UBSan runtime beside ASan writes to stderr).
  json sanitizer_reports() const {
    json reports = json::array();
    for (const auto& e : fs::directory_iterator(dir_)) {
      const std::string name = e.path().filename().string();
      const bool log = name == "app.log";
      if (!log && name.rfind("asan.", 0) != 0 && name.rfind("ubsan.", 0) != 0) continue;
      std::ifstream in(e.path());
      std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      size_t at = 0;
      if (log) {
        at = std::string::npos;
        for (const char* mark : {"runtime error:", "ERROR: AddressSanitizer",
                                 "ERROR: LeakSanitizer", "SUMMARY: UndefinedBehaviorSanitizer"})
          at = std::min(at, text.find(mark));
        if (at == std::string::npos) continue;
        at = text.rfind('\n', at);
        at = at == std::string::npos ? 0 : at + 1;
      }
      reports.push_back({{"file", e.path().string()}, {"text", text.substr(at, 8000)}});
    }
    return reports;
  }

  std::chrono::steady_clock::time_point soak_t0_;
  std::string asan_options_;
  std::vector<std::string> views_, good_, bad_, bad_queue_;
  std::map<std::string, int> by_kind_, view_events_, view_tabs_;
  json events_log_ = json::array(), opens_good_ = json::array(), opens_bad_ = json::array(),
       new_captures_ = json::array(), oracle_log_ = json::array(), exit_ = json::object();
  std::vector<std::pair<double, double>> frame_ms_;  // (soak seconds, ms)
  // The allocator's figures at each answer to F9 (state.json's memory): (soak seconds, kB in
  // live heap blocks, kB the allocator holds from the system).
  std::vector<std::array<double, 3>> heap_;
  uint64_t frames_seen_ = 0, frames_lost_ = 0;
  int hangs_ = 0, oracle_checks_ = 0, exports_ = 0, resizes_unapplied_ = 0;
  std::set<std::string> sizes_seen_;
  std::set<double> scales_seen_;
  std::string hang_stack_;
  RssSampler rss_;
  std::vector<std::string> failures_;
};

void Soak::write_report(double seconds, double ran, uint64_t seed, double warmup) {
  json rep;
  rep["seed"] = seed;
  rep["seconds_planned"] = seconds;
  rep["seconds_of_events"] = ran;
  rep["seconds_in_all"] = soak_t();
  rep["warmup_s"] = warmup;
  rep["app"] = app_;
  rep["asan_options"] = asan_options_;
  int total = 0;
  for (const auto& [k, n] : by_kind_) total += n;
  rep["events"] = {{"total", total},
                   {"by_kind", by_kind_},
                   {"in_views", view_events_},
                   {"tab_clicks", view_tabs_},
                   {"views", views_}};
  rep["window_sizes_seen"] = sizes_seen_;
  rep["resizes_not_applied"] = resizes_unapplied_;
  rep["ui_scales_seen"] = scales_seen_;
  const json reports = sanitizer_reports();
  rep["sanitizer_reports"] = reports;
  rep["exit"] = exit_;
  rep["hangs"] = hangs_;
  if (!hang_stack_.empty()) rep["hang_stack"] = hang_stack_;

  // Resident memory: 1 s samples; the median of the first 5 s after the warm-up against the
  // median of the last 5 s.
  const auto samples = rss_.samples();
  json curve = json::array();
  double last_t = -1e9;
  for (const auto& [t, kb] : samples)
    if (t - last_t >= (seconds > 300 ? 5.0 : 1.0)) {
      curve.push_back({std::round(t * 10) / 10, kb});
      last_t = t;
    }
  std::vector<double> warm, end_, after;
  const double t_end = samples.empty() ? 0 : samples.back().first;
  for (const auto& [t, kb] : samples) {
    if (t >= warmup && t < warmup + 5) warm.push_back(kb);
    if (t >= t_end - 5) end_.push_back(kb);
    if (t >= warmup) after.push_back(kb);
  }
  const double warm_kb = median_of(warm), end_kb = median_of(end_);
  const double growth = warm_kb > 0 ? 100.0 * (end_kb - warm_kb) / warm_kb : 0;
  rep["rss"] = {
      {"samples", samples.size()},
      {"at_warmup_kb", warm_kb},
      {"end_kb", end_kb},
      {"max_after_warmup_kb", after.empty() ? 0 : *std::max_element(after.begin(), after.end())},
      {"growth_pct", growth},
      {"curve_kb", curve}};

  // The live heap (what the program keeps) beside resident memory: medians of the answers in
  // the 10 s after the warm-up and in the last 10 s.
  std::vector<double> heap_warm, heap_end, mapped_warm, mapped_end;
  const double heap_t_end = heap_.empty() ? 0 : heap_.back()[0];
  json heap_curve = json::array();
  last_t = -1e9;
  for (const auto& h : heap_) {
    if (h[0] >= warmup && h[0] < warmup + 10) {
      heap_warm.push_back(h[1]);
      mapped_warm.push_back(h[2]);
    }
    if (h[0] >= heap_t_end - 10) {
      heap_end.push_back(h[1]);
      mapped_end.push_back(h[2]);
    }
    if (h[0] - last_t >= (seconds > 300 ? 5.0 : 1.0)) {
      heap_curve.push_back({std::round(h[0] * 10) / 10, h[1], h[2]});
      last_t = h[0];
    }
  }
  const double hw = median_of(heap_warm), he = median_of(heap_end);
  rep["heap"] = {{"answers", heap_.size()},
                 {"live_at_warmup_kb", hw},
                 {"live_end_kb", he},
                 {"live_growth_pct", hw > 0 ? 100.0 * (he - hw) / hw : 0},
                 {"held_at_warmup_kb", median_of(mapped_warm)},
                 {"held_end_kb", median_of(mapped_end)},
                 {"curve_kb", heap_curve}};

  std::vector<double> ms;
  for (const auto& [t, v] : frame_ms_) ms.push_back(v);
  rep["frames"] = {{"count", frames_seen_},
                   {"sampled", ms.size()},
                   {"not_sampled", frames_lost_},
                   {"median_ms", median_of(ms)},
                   {"p99_ms", quantile(ms, 0.99)},
                   {"max_ms", ms.empty() ? 0 : *std::max_element(ms.begin(), ms.end())}};
  rep["oracle"] = {{"checks", oracle_checks_},
                   {"numbers_compared", numbers_compared_},
                   {"numbers_differing", numbers_differing_},
                   {"eval_runs", evals_},
                   {"log", oracle_log_}};
  int named = 0, kept = 0;
  for (const json& o : opens_bad_) {
    named += o["names_file"].get<bool>();
    kept += o["capture_kept"].get<bool>();
  }
  int good_ok = 0;
  for (const json& o : opens_good_) good_ok += o["opened"].get<bool>();
  rep["opens"] = {{"malformed", opens_bad_},
                  {"malformed_count", opens_bad_.size()},
                  {"malformed_named", named},
                  {"malformed_capture_kept", kept},
                  {"malformed_files_in_corpus", bad_.size()},
                  {"good", opens_good_},
                  {"good_count", opens_good_.size()},
                  {"good_opened", good_ok}};
  rep["new_captures"] = new_captures_;
  rep["exports"] = exports_;
  rep["failures"] = failures_;
  rep["events_log"] = events_log_;
  rep["pass"] = failures_.empty();

  const fs::path out = env_string("KVSCOPE_SOAK_REPORT", dir_.string());
  fs::create_directories(out);
  std::ofstream(out / "soak_report.json") << rep.dump(1) << "\n";

  std::ostringstream t;
  t.precision(4);
  t << "KVScope soak: seed " << seed << ", " << std::lround(ran) << " s of events (" << seconds
    << " s planned), " << std::lround(soak_t()) << " s in all, app " << app_ << "\n";
  t << "result: " << (failures_.empty() ? "PASS" : "FAIL") << "\n";
  t << "events: " << total << " (";
  bool first = true;
  for (const auto& [k, n] : by_kind_) {
    t << (first ? "" : ", ") << k << " " << n;
    first = false;
  }
  t << ")\nevents per view:";
  for (const auto& v : views_) t << " " << v << " " << view_events_[v];
  t << "\nwindow sizes: " << sizes_seen_.size() << " (" << resizes_unapplied_
    << " resizes not applied); UI scales:";
  for (double s : scales_seen_) t << " " << s;
  t << "\nsanitizer reports: " << reports.size() << "\n";
  for (const json& r : reports) t << "  " << r["file"].get<std::string>() << "\n";
  t << "exit: " << exit_.dump() << "; hangs: " << hangs_ << "\n";
  t << "resident memory: " << std::lround(warm_kb / 1024) << " MiB at " << warmup << " s, "
    << std::lround(end_kb / 1024) << " MiB at the end (" << (growth >= 0 ? "+" : "") << growth
    << " %), max " << std::lround(rep["rss"]["max_after_warmup_kb"].get<double>() / 1024)
    << " MiB after warm-up\n";
  t << "live heap: " << std::lround(hw / 1024) << " MiB at " << warmup << " s, "
    << std::lround(he / 1024) << " MiB at the end (" << rep["heap"]["live_growth_pct"].get<double>()
    << " %); the allocator holds " << std::lround(median_of(mapped_warm) / 1024) << " -> "
    << std::lround(median_of(mapped_end) / 1024) << " MiB\n";
  t << "frame times: " << ms.size() << " of " << frames_seen_ << " frames sampled, median "
    << median_of(ms) << " ms, p99 " << quantile(ms, 0.99) << " ms, max "
    << rep["frames"]["max_ms"].get<double>() << " ms\n";
  t << "oracle: " << oracle_checks_ << " checks, " << numbers_compared_
    << " numbers compared with kvscope-cli eval, " << numbers_differing_ << " differing, " << evals_
    << " eval runs\n";
  t << "malformed files opened: " << opens_bad_.size() << " (of " << bad_.size()
    << " in the corpus), " << named << " errors name the file, " << kept
    << " left the open capture in place\n";
  t << "good captures opened: " << good_ok << " of " << opens_good_.size()
    << "; new captures: " << new_captures_.size() << "; exports: " << exports_ << "\n";
  for (const std::string& f : failures_) t << "FAILURE: " << f << "\n";
  if (!hang_stack_.empty()) t << "the threads' stacks at the hang:\n" << hang_stack_ << "\n";
  std::ofstream(out / "soak_report.txt") << t.str();
  std::fprintf(stderr, "\n%s\nreport: %s\n", t.str().c_str(), (out / "soak_report.json").c_str());
}

TEST_F(Soak, SanitizedAppSurvivesRandomRealInput) {
  const double seconds = env_double("KVSCOPE_SOAK_SECONDS", 60);
  const uint64_t seed = static_cast<uint64_t>(env_double("KVSCOPE_SOAK_SEED", 1));
  const double warmup = env_double("KVSCOPE_SOAK_WARMUP_S", seconds >= 300 ? 120 : seconds / 3);
  const double oracle_every = seconds >= 300 ? 60 : seconds / 2;
  rng_.seed(seed);
  FailureLog* log = new FailureLog(&failures_);
  ::testing::UnitTest::GetInstance()->listeners().Append(log);

  soak_t0_ = std::chrono::steady_clock::now();
  rss_.start(pid_, soak_t0_);
  note("soak: seed " + std::to_string(seed) + ", " + std::to_string(seconds) + " s, app " + app_);
  views_ = help_views();
  EXPECT_FALSE(views_.empty()) << "kvscope --help lists no views";
  sort_corpus();
  EXPECT_FALSE(bad_.empty()) << "no malformed files found in tests/malformed";

  step("start: the sample opens");
  json st = wait_for([](const json& s) { return fresh(s, "focus.A"); }, settle_s_,
                     "the first focused run");
  for (const std::string& v : views_)
    EXPECT_TRUE(has(st, "tab:" + v)) << "view " << v << " of --help has no tab";
  // Warm-up: every view drawn once, so that what a view computes the first time it is shown
  // comes before the resident-memory baseline.
  for (const std::string& v : views_) {
    st = poll();
    if (!st.contains("session") || !has(st, "tab:" + v)) continue;
    click(st, "tab:" + v);
    ++view_tabs_[v];
    event("tab", v + " (warm-up)");
    pause_ms(500);
  }
  oracle_check("start");
  double next_oracle = soak_t() + oracle_every;

  // The rare events come on a schedule (so that even the 60 s run has one of each), the others
  // at random with these weights.
  struct Kind {
    const char* name;
    int weight;
  };
  const Kind kinds[] = {{"click", 20}, {"drag", 10}, {"widget", 16},   {"slider", 6},
                        {"scroll", 6}, {"key", 12},  {"type", 3},      {"tab", 12},
                        {"resize", 4}, {"scale", 4}, {"open_good", 2}, {"open_bad", 5},
                        {"export", 3}};
  int weight_sum = 0;
  for (const Kind& k : kinds) weight_sum += k.weight;
  const char* scheduled[] = {"open_bad", "resize", "scale", "new_capture", "open_good", "export"};
  size_t next_scheduled = 0;
  int n = 0;
  const double t_loop = soak_t(), t_stop = t_loop + seconds;
  while (soak_t() < t_stop && alive() && hangs_ == 0 && !HasFatalFailure()) {
    ++n;
    std::string kind;
    if (n % 6 == 0 && next_scheduled < std::size(scheduled)) {
      kind = scheduled[next_scheduled++];
    } else {
      int r = pick(weight_sum);
      for (const Kind& k : kinds)
        if ((r -= k.weight) < 0) {
          kind = k.name;
          break;
        }
    }
    step(std::to_string(n) + ": " + kind);
    st = poll();
    if (!st.contains("session")) break;
    if (kind == "click")
      ev_click(st);
    else if (kind == "drag")
      ev_drag(st);
    else if (kind == "widget")
      ev_widget(st);
    else if (kind == "slider")
      ev_slider(st);
    else if (kind == "scroll")
      ev_scroll(st);
    else if (kind == "key")
      ev_key();
    else if (kind == "type")
      ev_type();
    else if (kind == "tab")
      ev_tab(st);
    else if (kind == "resize")
      ev_resize();
    else if (kind == "scale")
      ev_scale();
    else if (kind == "open_good")
      ev_open_good();
    else if (kind == "open_bad")
      ev_open_bad();
    else if (kind == "new_capture")
      ev_new_capture();
    else if (kind == "export")
      ev_export();
    // A New capture now and then in long runs.
    if (seconds >= 300 && n % 150 == 0) ev_new_capture();
    if (soak_t() >= next_oracle && alive() && hangs_ == 0) {
      oracle_check("at " + std::to_string(std::lround(soak_t())) + " s");
      next_oracle = soak_t() + oracle_every;
    }
  }
  const double ran = soak_t() - t_loop;
  if (alive() && hangs_ == 0) {
    oracle_check("end");
    // A clean quit through the menu: the exit path under the sanitizers too.
    step("File > Quit");
    st = calm();
    if (st.contains("session")) {
      click(st, "menu:File");
      st = with_item("menu:Quit");
      if (has(st, "menu:Quit")) click(st, "menu:Quit");
    }
    int status = 0;
    pid_t got = 0;
    for (int i = 0; i < 600 && (got = waitpid(pid_, &status, WNOHANG)) == 0; ++i) pause_ms(100);
    if (got == pid_) {
      pid_ = -1;
      exit_ = {{"how", "File > Quit"},
               {"status", WIFEXITED(status) ? WEXITSTATUS(status) : -1},
               {"signal", WIFSIGNALED(status) ? WTERMSIG(status) : 0},
               {"at_s", soak_t()}};
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
          << "the app's exit after File > Quit: " << exit_.dump();
    } else {
      exit_ = {{"how", "did not exit within 60 s of File > Quit"}};
      ADD_FAILURE() << "the app did not exit within 60 s of File > Quit";
    }
  }
  rss_.stop();
  note("soak: " + std::to_string(n) + " event steps in " + std::to_string(ran) + " s");

  // The criteria the loop does not check as it goes.
  for (const json& r : sanitizer_reports())
    ADD_FAILURE() << "sanitizer report in " << r["file"].get<std::string>() << ":\n"
                  << r["text"].get<std::string>().substr(0, 3000);
  EXPECT_EQ(hangs_, 0) << "the app stopped answering";
  EXPECT_GE(ran, seconds * 0.95) << "the soak ended early";
  const auto samples = rss_.samples();
  std::vector<double> warm, end_;
  const double t_end = samples.empty() ? 0 : samples.back().first;
  for (const auto& [t, kb] : samples) {
    if (t >= warmup && t < warmup + 5) warm.push_back(kb);
    if (t >= t_end - 5) end_.push_back(kb);
  }
  if (!warm.empty() && !end_.empty()) {
    const double growth = (median_of(end_) - median_of(warm)) / median_of(warm);
    // The flat-memory criterion is the "from minute 2 to the end" of a long run: in a
    // short run (CI's minute) the first New capture, the first larger capture and the Output
    // view's first generation still allocate for the first time after the warm-up (docs/
    // testing.md), so there the growth is reported, not judged.
    if (seconds >= 300)
      EXPECT_LT(growth, 0.10) << "resident memory grew " << 100 * growth << " % from " << warmup
                              << " s to the end";
    else
      note("soak: resident memory grew " + std::to_string(100 * growth) + " % from " +
           std::to_string(warmup) + " s to the end (judged only in runs of 5 minutes or more)");
  } else {
    ADD_FAILURE() << "no resident-memory samples after the warm-up";
  }
  EXPECT_FALSE(frame_ms_.empty()) << "no frame times recorded";
  EXPECT_GT(numbers_compared_, 0) << "the oracle compared no number";
  ::testing::UnitTest::GetInstance()->listeners().Release(log);
  delete log;
  write_report(seconds, ran, seed, warmup);
}

// Retention or first use (docs/testing.md): the same cycle of work again and again -- every
// sample capture opened, a New capture, every view shown, the numbers exported -- with the
// memory figures taken once the app is quiet after each cycle. What a cycle allocates for the
// first time shows after cycle 1; what it keeps shows as growth from one cycle to the next.
// Passes when the live heap after the last cycle is within 10 % of its value after cycle 2.
// Run by hand only (DISABLED_: CTest runs the binary whole, and a skipped test in it would mark
// gui_soak itself skipped; KVSCOPE_SOAK_CYCLES=N, 0 skips; KVSCOPE_SANITIZED_APP may name the
// Release app):
//   KVSCOPE_SOAK_CYCLES=8 tools/with-xvfb.sh BUILD/app/test_gui_soak
//     --gtest_also_run_disabled_tests --gtest_filter=Soak.DISABLED_RepeatedCyclesKeepNoMemory
TEST_F(Soak, DISABLED_RepeatedCyclesKeepNoMemory) {
  const int cycles = static_cast<int>(env_double("KVSCOPE_SOAK_CYCLES", 0));
  if (cycles <= 0) GTEST_SKIP() << "set KVSCOPE_SOAK_CYCLES to run the memory cycles";
  soak_t0_ = std::chrono::steady_clock::now();
  views_ = help_views();
  sort_corpus();
  json st = wait_for([](const json& s) { return fresh(s, "focus.A"); }, settle_s_,
                     "the first focused run");
  std::vector<std::string> samples;
  for (const std::string& g : good_)
    if (g.find("/sample_data/") != std::string::npos) samples.push_back(g);
  json rows = json::array();
  std::ostringstream t;
  for (int c = 1; c <= cycles && !HasFailure(); ++c) {
    for (const std::string& path : samples) {
      open_good(path);
      for (const std::string& v : views_) {
        st = calm();
        if (!st.contains("session") || !has(st, "tab:" + v)) continue;
        click(st, "tab:" + v);
        pause_ms(400);
      }
    }
    ev_new_capture();
    open_good(samples.front());
    st = calm();
    if (has(st, "tab:tokens")) click(st, "tab:tokens");
    st = quiet();
    pause_ms(3000);  // the app goes still: its idle release of free memory
    st = poll();
    if (!st.contains("memory")) break;
    const json& m = st["memory"];
    rows.push_back({{"cycle", c},
                    {"t", soak_t()},
                    {"rss_kb", m["rss_kb"]},
                    {"heap_live_kb", m["heap_live"].get<double>() / 1024},
                    {"heap_held_kb", m["heap_mapped"].get<double>() / 1024},
                    {"reference_cache_bytes", st["reference_cache"]["bytes"]}});
    note("cycle " + std::to_string(c) + ": " + rows.back().dump());
    t << rows.back().dump() << "\n";
  }
  const fs::path out = env_string("KVSCOPE_SOAK_REPORT", dir_.string());
  fs::create_directories(out);
  std::ofstream(out / "cycles.json") << rows.dump(1) << "\n";
  std::fprintf(stderr, "memory after each cycle (%s):\n%s", app_.c_str(), t.str().c_str());
  ASSERT_GE(rows.size(), 3u) << "fewer than 3 cycles completed";
  const double second = rows[1]["heap_live_kb"].get<double>();
  const double last = rows.back()["heap_live_kb"].get<double>();
  EXPECT_LT(last, 1.10 * second) << "the live heap grew from cycle 2 to cycle " << rows.size();
}

}  // namespace
