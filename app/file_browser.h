// A small in-app file browser (ImGui modal): directories, then files with the wanted extensions;
// double-click, Enter or Open picks a file (or enters a folder), Up/Down move the selection,
// Escape cancels. Used for captures (.safetensors, .npz) and sessions (.json).
#pragma once

#include <array>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace kvscope::app {

class FileBrowser {
 public:
  // Opens the dialog next frame. `exts` like {".safetensors", ".npz"}; empty = every file.
  void open(const std::string& title, const std::string& start_dir, std::vector<std::string> exts,
            std::function<void(const std::string&)> on_pick);
  // Call every frame. `items` (optional) receives the screen rectangles of the entries
  // ("browser:<name>") and the path field ("browser:path"), for the GUI test.
  void draw(std::map<std::string, std::array<float, 4>>* items = nullptr);
  bool is_open() const { return visible_; }

 private:
  void refresh();
  // `scroll`: bring the entry into view (keyboard); a click leaves the list where it is.
  void select(int i, bool scroll);
  struct Entry {
    std::string name;
    bool dir = false;
    long long bytes = 0;
  };
  std::string title_, dir_, error_;
  std::vector<std::string> exts_;
  std::vector<Entry> entries_;
  std::function<void(const std::string&)> on_pick_;
  bool visible_ = false, open_next_ = false;
  int selected_ = -1;
  bool scroll_to_selected_ = false;
  char path_buf_[1024] = {};
};

}  // namespace kvscope::app
