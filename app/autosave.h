// Autosave and recovery (docs/app.md, "Autosave and recovery"): the interactive app keeps its
// session (the JSON of File > Save session, views' states included) in the user's config folder,
// file autosave.json, a few seconds after the session last changed. The file says whether the
// app that wrote it is still running ("clean_exit": false) or quit cleanly; after a crash or a
// kill the next start offers to restore it. Headless runs (--screenshot, kvscope-cli render)
// never create an Autosave.
//
// The UI thread serialises the session (cheap) and hands the text to one background write at a
// time (temporary file in the same folder, fsync, rename, fsync of the folder): a frame never
// waits for the disk, and a crash mid-write leaves the previous autosave whole.
#pragma once

#include <filesystem>
#include <functional>
#include <future>
#include <nlohmann/json.hpp>
#include <string>

namespace kvscope::app {

// Writes `text` to `file` atomically: `file`.tmp in the same folder, fsync, rename over `file`,
// fsync of the folder. Returns "" or why not (then `file` is as it was and no temporary is left).
std::string write_file_atomic(const std::filesystem::path& file, const std::string& text);

class Autosave {
 public:
  static constexpr double kDelayS = 3.0;
  // `file` empty: config_dir() / "autosave.json" (nothing is saved when that is empty too).
  explicit Autosave(std::filesystem::path file = {}, double delay_s = kDelayS);
  ~Autosave();  // waits for the write in flight

  // Once per frame: the current session (without the "autosave" field) and a steady clock in
  // seconds. A write starts `delay_s` after the session last changed, never while another is in
  // flight or while held. Returns why a finished write failed ("" when none did).
  std::string update(const nlohmann::json& session, double now_s);
  // While the restore prompt is up nothing is written (the file is the crashed run's session).
  void hold(bool held) { held_ = held; }
  bool held() const { return held_; }
  // Clean quit: waits for the write in flight, then writes the last session marked
  // "clean_exit": true (nothing while held: the crashed run's session is offered again).
  std::string finish(const nlohmann::json& session);

  const std::filesystem::path& file() const { return file_; }
  bool writing() const { return inflight_.valid(); }
  int writes() const { return writes_; }           // writes finished (good or not)
  double last_write_s() const { return last_s_; }  // wall time of the last finished write
  // Seconds from the session's last change to the start of the last write, on the clock
  // update() is given (at least delay_s: the debounce, as the app itself measured it).
  double last_delay_s() const { return last_delay_s_; }

  // What the previous run left. `offer`: it did not quit cleanly and its session passes `check`
  // (AppUi::check_session; a capture that is not there any more is still offered: restoring
  // says so). A file that is not JSON, not a session or that `check` refuses is renamed to
  // autosave.corrupt-<timestamp>.json and `problem` names the file, the problem and the new name.
  struct Found {
    bool offer = false;
    nlohmann::json session;  // without the "autosave" field
    std::string saved;       // "HH:MM" (local time) when it was written
    std::string capture;     // the session's capture path
    std::string problem;
    std::filesystem::path set_aside;
  };
  Found recover(const std::function<void(const nlohmann::json&)>& check) const;

  // The JSON written: the session plus {"autosave": {"clean_exit", "saved_at" (Unix seconds),
  // "saved_local"}}.
  static nlohmann::json stamped(nlohmann::json session, bool clean_exit);

 private:
  void collect(bool wait, std::string* error);
  void start_write(const nlohmann::json& session, bool clean_exit);

  std::filesystem::path file_;
  double delay_s_;
  bool held_ = false;
  std::string last_text_;  // the session last seen (its dump)
  nlohmann::json last_session_;
  double last_change_s_ = 0;
  double last_delay_s_ = 0;
  bool dirty_ = false;  // last_text_ not written yet
  struct Outcome {
    std::string error;
    double seconds = 0;
  };
  std::future<Outcome> inflight_;
  int writes_ = 0;
  double last_s_ = 0;
};

}  // namespace kvscope::app
