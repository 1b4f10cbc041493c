#include "app/file_browser.h"

#include <imgui.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "app/app_frame.h"

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

void FileBrowser::select(int i, bool scroll) {
  if (i < 0 || i >= static_cast<int>(entries_.size())) return;
  selected_ = i;
  scroll_to_selected_ = scroll;
  const Entry& e = entries_[static_cast<size_t>(i)];
  if (!e.dir) std::snprintf(path_buf_, sizeof path_buf_, "%s", (fs::path(dir_) / e.name).c_str());
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

void FileBrowser::draw(std::map<std::string, std::array<float, 4>>* items) {
  auto record = [&](const std::string& name) {
    if (!items) return;
    const ImVec2 a = ImGui::GetItemRectMin(), b = ImGui::GetItemRectMax();
    (*items)[name] = {a.x, a.y, b.x, b.y};
  };
  if (!visible_) return;
  if (open_next_) {
    ImGui::OpenPopup(title_.c_str());
    open_next_ = false;
  }
  // Scaled with the UI, within the display.
  const ImVec2 display = ImGui::GetIO().DisplaySize;
  ImGui::SetNextWindowSize(
      ImVec2(std::min(px(720), display.x * 0.9f), std::min(px(480), display.y * 0.9f)),
      ImGuiCond_Appearing);
  bool keep = true;
  fit_next_dialog_to_display();
  if (!ImGui::BeginPopupModal(title_.c_str(), &keep)) {
    visible_ = keep && ImGui::IsPopupOpen(title_.c_str());
    return;
  }
  keep_dialog_on_screen();
  std::string pick;
  bool activate = false;
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
  // Long names scroll sideways rather than run past the list's edge.
  if (ImGui::BeginChild("##entries", ImVec2(0, -footer), true,
                        ImGuiWindowFlags_HorizontalScrollbar)) {
    for (int i = 0; i < static_cast<int>(entries_.size()); ++i) {
      const Entry& e = entries_[static_cast<size_t>(i)];
      char label[600];
      if (e.dir)
        std::snprintf(label, sizeof label, "[dir]  %s", e.name.c_str());
      else
        std::snprintf(label, sizeof label, "       %s   (%.1f KiB)", e.name.c_str(),
                      static_cast<double>(e.bytes) / 1024.0);
      const bool clicked =
          ImGui::Selectable(label, selected_ == i, ImGuiSelectableFlags_AllowDoubleClick);
      record("browser:" + e.name);
      // The second press of a double-click (app/input_queue.h decides it from event times).
      const bool double_clicked =
          ImGui::IsItemHovered() && ImGui::IsMouseDoubleClicked(ImGuiMouseButton_Left);
      if (selected_ == i && scroll_to_selected_) {
        ImGui::SetScrollHereY();
        scroll_to_selected_ = false;
      }
      // A click never scrolls the list: the second click of a double-click must land on the
      // same entry.
      if (clicked || double_clicked) select(i, false);
      if (double_clicked) {
        activate = true;
        break;
      }
    }
  }
  ImGui::EndChild();
  // Keyboard: Up/Down move the selection, Enter opens it (or the typed path), Escape cancels.
  const bool typing = ImGui::GetIO().WantTextInput;
  if (!typing && !entries_.empty()) {
    if (ImGui::IsKeyPressed(ImGui::GetKeyIndex(ImGuiKey_DownArrow)))
      select(std::min(static_cast<int>(entries_.size()) - 1, selected_ + 1), true);
    if (ImGui::IsKeyPressed(ImGui::GetKeyIndex(ImGuiKey_UpArrow)))
      select(std::max(0, selected_ - 1), true);
  }
  const bool enter = ImGui::IsKeyPressed(ImGui::GetKeyIndex(ImGuiKey_Enter), false) ||
                     ImGui::IsKeyPressed(ImGui::GetKeyIndex(ImGuiKey_KeyPadEnter), false);
  const bool escape = ImGui::IsKeyPressed(ImGui::GetKeyIndex(ImGuiKey_Escape), false);
  // The path field leaves room for the two buttons at any UI scale.
  const float button_w = dialog_button_width("Cancel");
  ImGui::SetNextItemWidth(-(2 * button_w + 2 * ImGui::GetStyle().ItemSpacing.x));
  const bool typed_enter =
      ImGui::InputText("##path", path_buf_, sizeof path_buf_, ImGuiInputTextFlags_EnterReturnsTrue);
  record("browser:path");
  ImGui::SameLine();
  const bool open_clicked = ImGui::Button("Open", ImVec2(button_w, 0));
  record("browser:Open");
  if ((open_clicked || typed_enter) && path_buf_[0]) pick = path_buf_;
  if (activate || (enter && !typing && pick.empty())) {
    if (selected_ >= 0 && selected_ < static_cast<int>(entries_.size())) {
      const Entry& e = entries_[static_cast<size_t>(selected_)];
      pick = (fs::path(dir_) / e.name).string();
    } else if (path_buf_[0]) {
      pick = path_buf_;
    }
  }
  ImGui::SameLine();
  const bool cancel_clicked = ImGui::Button("Cancel", ImVec2(button_w, 0));
  record("browser:Cancel");
  if (cancel_clicked || escape) {
    visible_ = false;
    ImGui::CloseCurrentPopup();
    ImGui::EndPopup();
    return;
  }
  if (!pick.empty()) {
    std::error_code ec;
    if (fs::is_directory(pick, ec)) {
      dir_ = fs::weakly_canonical(pick, ec).string();
      selected_ = -1;
      path_buf_[0] = 0;
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
