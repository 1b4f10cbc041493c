// The record of a capture's exact sides on disk (app/sides_record.h).
#include "app/sides_record.h"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "app/autosave.h"
#include "engine/eval/reference_cache.h"

namespace kvscope::app {
namespace fs = std::filesystem;

std::string sides_record_file(const std::string& disk_dir, const std::string& capture_path) {
  if (disk_dir.empty() || capture_path.empty()) return "";
  std::error_code ec;
  const fs::path path = fs::weakly_canonical(capture_path, ec);
  if (ec) return "";
  const auto size = fs::file_size(path, ec);
  if (ec) return "";
  const auto mtime = fs::last_write_time(path, ec);
  if (ec) return "";
  const std::string identity = path.string() + '\n' + std::to_string(size) + '\n' +
                               std::to_string(mtime.time_since_epoch().count());
  char name[40];
  std::snprintf(name, sizeof name, "sides-%016llx.txt",
                static_cast<unsigned long long>(content_hash(identity.data(), identity.size())));
  return (fs::path(disk_dir) / name).string();
}

std::set<std::string> read_sides_record(const std::string& file) {
  std::set<std::string> sides;
  if (file.empty()) return sides;
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line)) {
    // Four runs of digits, joined by '|'.
    int runs = 0, digits = 0;
    bool ok = line.size() < 64;
    for (size_t i = 0; ok && i <= line.size(); ++i) {
      if (i == line.size() || line[i] == '|') {
        ok = digits > 0;
        ++runs, digits = 0;
      } else {
        ok = line[i] >= '0' && line[i] <= '9';
        ++digits;
      }
    }
    if (ok && runs == 4) sides.insert(line);
  }
  return sides;
}

SidesRecordWriter::~SidesRecordWriter() {
  if (inflight_.valid()) inflight_.wait();
}

bool SidesRecordWriter::write(const std::string& file, const std::set<std::string>& sides) {
  if (file.empty()) return true;
  if (inflight_.valid()) {
    if (inflight_.wait_for(std::chrono::seconds(0)) != std::future_status::ready) return false;
    inflight_.get();
  }
  // The set only grows while a capture is open; a new file (another capture) is written anew.
  if (file == last_file_ && sides.size() == last_count_) return true;
  std::string text;
  for (const std::string& s : sides) text += s + '\n';
  last_file_ = file;
  last_count_ = sides.size();
  inflight_ = std::async(std::launch::async, [file, text = std::move(text)] {
    // A folder that cannot be written costs the next opening's first estimate only.
    (void)write_file_atomic(file, text);
  });
  return true;
}

}  // namespace kvscope::app
