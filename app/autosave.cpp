#include "app/autosave.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>

#include "app/recent_files.h"
#include "engine/core/error.h"
#include "engine/io/json_limits.h"

namespace kvscope::app {
namespace fs = std::filesystem;

namespace {

std::string local_time(std::time_t t, const char* format) {
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, format, &tm);
  return buf;
}

std::string errno_text() {
  return std::strerror(errno);
}

}  // namespace

std::string write_file_atomic(const fs::path& file, const std::string& text) {
  std::error_code ec;
  const fs::path dir = file.parent_path().empty() ? fs::path(".") : file.parent_path();
  fs::create_directories(dir, ec);
  const fs::path tmp = file.string() + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return "cannot write " + tmp.string() + ": " + errno_text();
  std::string why;
  size_t done = 0;
  while (done < text.size() && why.empty()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      why = "cannot write " + tmp.string() + ": " + errno_text();
    else
      done += static_cast<size_t>(n);
  }
  if (why.empty() && ::fsync(fd) != 0) why = "cannot sync " + tmp.string() + ": " + errno_text();
  if (::close(fd) != 0 && why.empty()) why = "cannot write " + tmp.string() + ": " + errno_text();
  if (why.empty() && std::rename(tmp.c_str(), file.c_str()) != 0)
    why = "cannot rename " + tmp.string() + " to " + file.string() + ": " + errno_text();
  if (!why.empty()) {
    fs::remove(tmp, ec);
    return why;
  }
  // The rename itself reaches the disk with the folder's metadata.
  if (const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  return "";
}

Autosave::Autosave(fs::path file, double delay_s) : file_(std::move(file)), delay_s_(delay_s) {
  if (file_.empty()) {
    const fs::path dir = config_dir();
    if (!dir.empty()) file_ = dir / "autosave.json";
  }
}

Autosave::~Autosave() {
  collect(true, nullptr);
}

nlohmann::json Autosave::stamped(nlohmann::json session, bool clean_exit) {
  const std::time_t now = std::time(nullptr);
  session["autosave"] = {{"clean_exit", clean_exit},
                         {"saved_at", static_cast<long long>(now)},
                         {"saved_local", local_time(now, "%Y-%m-%d %H:%M:%S")}};
  return session;
}

void Autosave::collect(bool wait, std::string* error) {
  if (!inflight_.valid()) return;
  if (!wait && inflight_.wait_for(std::chrono::seconds(0)) != std::future_status::ready) return;
  const Outcome o = inflight_.get();
  ++writes_;
  last_s_ = o.seconds;
  if (error && !o.error.empty()) *error = "autosave: " + o.error;
}

void Autosave::start_write(const nlohmann::json& session, bool clean_exit) {
  // Serialised here (the UI thread); only the disk work runs in the background.
  std::string text = stamped(session, clean_exit).dump(2) + "\n";
  inflight_ = std::async(std::launch::async, [file = file_, text = std::move(text)] {
    const auto t0 = std::chrono::steady_clock::now();
    Outcome o;
    o.error = write_file_atomic(file, text);
    o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return o;
  });
}

std::string Autosave::update(const nlohmann::json& session, double now_s) {
  std::string error;
  collect(false, &error);
  if (file_.empty()) return error;
  std::string text = session.dump();
  if (text != last_text_) {
    last_text_ = std::move(text);
    last_session_ = session;
    last_change_s_ = now_s;
    dirty_ = true;
  }
  if (dirty_ && !held_ && !inflight_.valid() && now_s - last_change_s_ >= delay_s_) {
    dirty_ = false;
    last_delay_s_ = now_s - last_change_s_;
    start_write(last_session_, false);
  }
  return error;
}

std::string Autosave::finish(const nlohmann::json& session) {
  std::string error;
  collect(true, &error);
  if (file_.empty() || held_) return error;
  start_write(session, true);
  collect(true, &error);
  dirty_ = false;
  return error;
}

Autosave::Found Autosave::recover(const std::function<void(const nlohmann::json&)>& check) const {
  Found f;
  std::error_code ec;
  if (file_.empty() || !fs::exists(file_, ec)) return f;
  try {
    JsonLimits limits;
    nlohmann::json j = read_json_file_limited(file_.string(), 64ull << 20, limits);
    if (!j.is_object()) throw InputError("not a KVScope session (not a JSON object)");
    if (j.contains("autosave")) {
      const nlohmann::json& meta = j["autosave"];
      if (!meta.is_object() || !meta.contains("clean_exit") || !meta["clean_exit"].is_boolean())
        throw InputError("field \"autosave\" is not {\"clean_exit\": true|false, ...}");
      if (meta["clean_exit"].get<bool>()) return f;  // the last run quit cleanly
      if (meta.contains("saved_at") && meta["saved_at"].is_number_integer())
        f.saved = local_time(static_cast<std::time_t>(meta["saved_at"].get<long long>()), "%H:%M");
      j.erase("autosave");
    }
    // A capture that has gone is still offered: restoring goes through the session's load and
    // says that the file is missing. Everything else must pass the session's check.
    nlohmann::json probe = j;
    if (probe.contains("capture") && probe["capture"].is_string()) {
      f.capture = probe["capture"].get<std::string>();
      if (!fs::exists(f.capture, ec)) probe.erase("capture");
    }
    check(probe);
    f.session = std::move(j);
    f.offer = true;
  } catch (const std::exception& e) {
    // Set aside, never fatal: the next autosave writes a good file.
    f = Found{};
    const std::string stamp = local_time(std::time(nullptr), "%Y%m%d-%H%M%S");
    fs::path aside = file_.parent_path() / ("autosave.corrupt-" + stamp + ".json");
    for (int k = 2; fs::exists(aside, ec) && k < 100; ++k)
      aside =
          file_.parent_path() / ("autosave.corrupt-" + stamp + "-" + std::to_string(k) + ".json");
    fs::rename(file_, aside, ec);
    f.problem = "autosave: " + file_.string() + ": " + e.what();
    if (ec) {
      f.problem += "; could not be set aside (" + ec.message() + ")";
    } else {
      f.problem += "; set aside as " + aside.filename().string();
      f.set_aside = aside;
    }
  }
  return f;
}

}  // namespace kvscope::app
