#include "app/file_browser.h"

#include <imgui.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>

namespace kvscope::app {
namespace fs = std::filesystem;

void FileBrowser::open(const std::string& title, const std::string& start_dir,
                       std::vector<std::string> exts,
                       std::function<void(const std::string&)> on_pick) {
  title_ = title;
  std::error_code ec;
  fs::path d = start_dir.empty() ? fs::current_path(ec) : fs::path(start_dir);
  if (!fs::is_directory(d, ec)) d = d.parent_path();
  if (d.empty() || !fs::is_directory(d, ec)) d = fs::current_path(ec);
  dir_ = fs::weakly_canonical(d, ec).string();
  exts_ = std::move(exts);
  on_pick_ = std::move(on_pick);
  open_next_ = true;
  visible_ = true;
  selected_ = -1;
  path_buf_[0] = 0;
  refresh();
}

void FileBrowser::refresh() {
  entries_.clear();
  error_.clear();
  std::error_code ec;
  fs::directory_iterator it(dir_, fs::directory_options::skip_permission_denied, ec);
  if (ec) {
    error_ = "cannot list " + dir_ + ": " + ec.message();
    return;
  }
  for (const auto& e : it) {
    Entry en;
    en.name = e.path().filename().string();
    if (en.name.empty() || en.name[0] == '.') continue;
    en.dir = e.is_directory(ec);
    if (!en.dir) {
      std::string ext = e.path().extension().string();
      if (!exts_.empty() && std::find(exts_.begin(), exts_.end(), ext) == exts_.end()) continue;
      en.bytes = static_cast<long long>(e.file_size(ec));
    }
    entries_.push_back(en);
  }
  std::sort(entries_.begin(), entries_.end(), [](const Entry& a, const Entry& b) {
    return a.dir != b.dir ? a.dir : a.name < b.name;
  });
}

void FileBrowser::draw() {
  if (!visible_) return;
  if (open_next_) {
    ImGui::OpenPopup(title_.c_str());
    open_next_ = false;
  }
  ImGui::SetNextWindowSize(ImVec2(720, 480), ImGuiCond_Appearing);
  bool keep = true;
  if (!ImGui::BeginPopupModal(title_.c_str(), &keep)) {
    visible_ = keep && ImGui::IsPopupOpen(title_.c_str());
    return;
  }
  std::string pick;
  if (ImGui::Button("Up")) {
    fs::path p(dir_);
    if (p.has_parent_path()) dir_ = p.parent_path().string();
    selected_ = -1;
    refresh();
  }
  ImGui::SameLine();
  ImGui::TextUnformatted(dir_.c_str());
  if (!error_.empty()) ImGui::TextColored(ImVec4(1, 0.4f, 0.4f, 1), "%s", error_.c_str());
  std::string filter;
  for (const auto& e : exts_) filter += (filter.empty() ? "" : " ") + e;
  ImGui::TextDisabled("showing folders and %s", filter.empty() ? "all files" : filter.c_str());
  float footer = ImGui::GetFrameHeightWithSpacing() * 2 + 4;
  if (ImGui::BeginChild("##entries", ImVec2(0, -footer), true)) {
    for (int i = 0; i < static_cast<int>(entries_.size()); ++i) {
      const Entry& e = entries_[static_cast<size_t>(i)];
      char label[600];
      if (e.dir)
        std::snprintf(label, sizeof label, "[dir]  %s", e.name.c_str());
      else
        std::snprintf(label, sizeof label, "       %s   (%.1f KiB)", e.name.c_str(),
                      static_cast<double>(e.bytes) / 1024.0);
      if (ImGui::Selectable(label, selected_ == i, ImGuiSelectableFlags_AllowDoubleClick)) {
        selected_ = i;
        if (!e.dir)
          std::snprintf(path_buf_, sizeof path_buf_, "%s", (fs::path(dir_) / e.name).c_str());
        if (ImGui::IsMouseDoubleClicked(ImGuiMouseButton_Left)) {
          if (e.dir) {
            dir_ = (fs::path(dir_) / e.name).string();
            selected_ = -1;
            refresh();
            break;
          }
          pick = (fs::path(dir_) / e.name).string();
        }
      }
    }
  }
  ImGui::EndChild();
  ImGui::SetNextItemWidth(-140);
  ImGui::InputText("##path", path_buf_, sizeof path_buf_);
  ImGui::SameLine();
  if (ImGui::Button("Open", ImVec2(60, 0)) && path_buf_[0]) pick = path_buf_;
  ImGui::SameLine();
  if (ImGui::Button("Cancel", ImVec2(60, 0))) {
    visible_ = false;
    ImGui::CloseCurrentPopup();
  }
  if (!pick.empty()) {
    std::error_code ec;
    if (fs::is_directory(pick, ec)) {
      dir_ = pick;
      refresh();
    } else {
      visible_ = false;
      ImGui::CloseCurrentPopup();
      if (on_pick_) on_pick_(pick);
    }
  }
  ImGui::EndPopup();
  if (!keep) visible_ = false;
}

}  // namespace kvscope::app
