// File > Open recent: the last captures and sessions opened, remembered across runs in the
// user's config folder, file recent.json. A missing file is an empty list; a damaged one is
// ignored (load() says why), never fatal.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace kvscope::app {

// The user's KVScope config folder: $KVSCOPE_CONFIG_DIR, else $XDG_CONFIG_HOME/kvscope, else
// ~/.config/kvscope ("" when none of them is set). Tests point KVSCOPE_CONFIG_DIR at a temporary
// folder so they never write to the real home.
std::filesystem::path config_dir();

struct RecentEntry {
  std::string path;  // absolute
  std::string kind;  // "capture" or "session"
  bool operator==(const RecentEntry&) const = default;
};

class RecentFiles {
 public:
  static constexpr size_t kMax = 10;
  // `file` empty: config_dir() / "recent.json" (nothing is remembered when that is empty too).
  explicit RecentFiles(std::filesystem::path file = {});

  // Reads the list. Returns "" when it was read or is not there yet, else why it was ignored
  // (the list is then empty and the next add() writes a good file).
  std::string load();
  // Puts `path` (made absolute) first as `kind`, drops an older entry of the same file, keeps the
  // newest kMax and writes the file (temporary file + rename). Returns "" or why it could not be
  // written (the list in memory is updated anyway).
  std::string add(const std::string& path, const std::string& kind);
  const std::vector<RecentEntry>& entries() const { return entries_; }
  // The capture opened last that is still there ("" when none): what a start without a file
  // reopens after a clean quit.
  std::string last_capture() const;
  const std::filesystem::path& file() const { return file_; }

 private:
  std::filesystem::path file_;
  std::vector<RecentEntry> entries_;
};

}  // namespace kvscope::app
