#include "app/recent_files.h"

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

namespace kvscope::app {
namespace fs = std::filesystem;

fs::path config_dir() {
  if (const char* d = std::getenv("KVSCOPE_CONFIG_DIR"); d && *d) return fs::path(d);
  if (const char* x = std::getenv("XDG_CONFIG_HOME"); x && *x) return fs::path(x) / "kvscope";
  if (const char* h = std::getenv("HOME"); h && *h) return fs::path(h) / ".config" / "kvscope";
  return {};
}

RecentFiles::RecentFiles(fs::path file) : file_(std::move(file)) {
  if (file_.empty()) {
    const fs::path dir = config_dir();
    if (!dir.empty()) file_ = dir / "recent.json";
  }
}

std::string RecentFiles::load() {
  entries_.clear();
  if (file_.empty()) return "";
  std::error_code ec;
  if (!fs::exists(file_, ec)) return "";
  const std::string where = "recent files: " + file_.string() + ": ";
  constexpr uintmax_t kMaxBytes = 1 << 20;
  if (fs::file_size(file_, ec) > kMaxBytes || ec)
    return where + "larger than 1 MiB or unreadable; ignored";
  std::ifstream in(file_, std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<RecentEntry> read;
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    if (!j.is_object() || !j.contains("recent") || !j["recent"].is_array())
      return where + "not a list of recent files (no \"recent\" array); ignored";
    for (const nlohmann::json& e : j["recent"]) {
      if (!e.is_object() || !e.contains("path") || !e["path"].is_string() || !e.contains("kind") ||
          !e["kind"].is_string())
        return where + "an entry is not {\"path\": ..., \"kind\": ...}; ignored";
      RecentEntry r{e["path"].get<std::string>(), e["kind"].get<std::string>()};
      if (r.kind != "capture" && r.kind != "session")
        return where + "kind '" + r.kind + "' is not capture or session; ignored";
      if (r.path.empty()) continue;
      if (read.size() < kMax) read.push_back(r);
    }
  } catch (const nlohmann::json::exception& e) {
    return where + "not valid JSON (" + e.what() + "); ignored";
  }
  entries_ = std::move(read);
  return "";
}

std::string RecentFiles::add(const std::string& path, const std::string& kind) {
  std::error_code ec;
  fs::path abs = fs::absolute(path, ec);
  RecentEntry e{(ec ? fs::path(path) : abs.lexically_normal()).string(), kind};
  std::erase_if(entries_, [&](const RecentEntry& r) { return r.path == e.path; });
  entries_.insert(entries_.begin(), e);
  if (entries_.size() > kMax) entries_.resize(kMax);
  if (file_.empty()) return "";
  nlohmann::json list = nlohmann::json::array();
  for (const RecentEntry& r : entries_) list.push_back({{"path", r.path}, {"kind", r.kind}});
  const nlohmann::json j = {{"recent", list}};
  fs::create_directories(file_.parent_path(), ec);
  const fs::path tmp = file_.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << j.dump(2) << "\n";
    if (!out) {
      fs::remove(tmp, ec);
      return "recent files: cannot write " + tmp.string();
    }
  }
  fs::rename(tmp, file_, ec);
  if (ec) {
    fs::remove(tmp, ec);
    return "recent files: cannot write " + file_.string();
  }
  return "";
}

std::string RecentFiles::last_capture() const {
  std::error_code ec;
  for (const RecentEntry& e : entries_)
    if (e.kind == "capture" && std::filesystem::is_regular_file(e.path, ec)) return e.path;
  return {};
}

}  // namespace kvscope::app
