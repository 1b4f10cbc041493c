// The KVScope window's menu bar, status bar, dialogs (open, export, session, path) and Help
// window: AppUi's members that draw them (app/app_frame.h). The frame, panels, keys, sessions and
// exports are in app/app_frame.cpp.
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "app/app_frame.h"
#include "app/app_state.h"
#include "app/autosave.h"
#include "app/colormap.h"
#include "app/export.h"
#include "app/memory_stats.h"
#include "app/new_capture_dialog.h"
#include "app/recent_files.h"
#include "app/result_status.h"
#include "app/views/view.h"
#include "engine/core/error.h"
#include "engine/eval/reference_cache.h"
#include "engine/io/json_fields.h"

namespace kvscope::app {
namespace fs = std::filesystem;

namespace {

std::string human_bytes(long long b) {
  char buf[64];
  if (b >= (1LL << 30))
    std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(b) / (1LL << 30));
  else if (b >= (1LL << 20))
    std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(b) / (1LL << 20));
  else
    std::snprintf(buf, sizeof buf, "%.1f KiB", static_cast<double>(b) / 1024.0);
  return buf;
}

// xdg-open on PATH ("" when there is none).
std::string find_xdg_open() {
  const char* path = std::getenv("PATH");
  if (!path) return "";
  std::string all = path;
  size_t start = 0;
  while (start <= all.size()) {
    size_t end = all.find(':', start);
    if (end == std::string::npos) end = all.size();
    const fs::path p = fs::path(all.substr(start, end - start)) / "xdg-open";
    std::error_code ec;
    if (end > start && fs::exists(p, ec) && ::access(p.c_str(), X_OK) == 0) return p.string();
    start = end + 1;
  }
  return "";
}

// Opens a file with xdg-open without a shell; the child is reaped on a detached thread.
bool open_with_xdg(const std::string& xdg, const std::string& file) {
  std::string a0 = xdg, a1 = file;
  char* argv[] = {a0.data(), a1.data(), nullptr};
  pid_t pid = 0;
  if (::posix_spawn(&pid, xdg.c_str(), nullptr, nullptr, argv, environ) != 0) return false;
  std::thread([pid] {
    int status = 0;
    ::waitpid(pid, &status, 0);
  }).detach();
  return true;
}

}  // namespace

void AppUi::draw_menu() {
  if (!ImGui::BeginMenuBar()) return;
  bool open_capture = false, save_session = false, export_png = false;
  const bool file_menu = ImGui::BeginMenu("File");
  record_item(s_, "menu:File");
  if (file_menu) {
    open_capture |= ImGui::MenuItem("Open capture...", "Ctrl+O");
    record_item(s_, "menu:Open capture");
    const bool open_set = ImGui::MenuItem("Open set...");
    record_item(s_, "menu:Open set");
    if (open_set)
      browser_.open("Open set (manifest.jsonl)", "", {".jsonl"},
                    [this](const std::string& p) { s_.request_open(p); });
    const bool new_capture = ImGui::MenuItem("New capture...");
    record_item(s_, "menu:New capture");
    if (new_capture) open_new_capture_dialog();
    draw_recent_menu();
    const bool open_session = ImGui::MenuItem("Open session...");
    record_item(s_, "menu:Open session");
    if (open_session) {
      browser_.open("Open session", "", {".json"}, [this](const std::string& p) {
        try {
          load_session(p);
          s_.status_message = "session loaded from " + p;
        } catch (const std::exception& e) {
          s_.load_error = e.what();  // names the field; nothing of the session was applied
        }
      });
    }
    save_session |= ImGui::MenuItem("Save session...", "Ctrl+S");
    ImGui::Separator();
    export_png |= ImGui::MenuItem("Export view as PNG...", "Ctrl+E");
    if (ImGui::MenuItem("Export view as PNG at 2x...")) {
      path_action_ = PathAction::ExportPng2x;
      path_buf_ = "kvscope_" + s_.settings.active_view + "@2x.png";
      open_path_popup_ = true;
    }
    if (ImGui::MenuItem("Export view as SVG (vector figure)...")) {
      path_action_ = PathAction::ExportSvg;
      path_buf_ = "kvscope_" + s_.settings.active_view + ".svg";
      open_path_popup_ = true;
    }
    if (ImGui::MenuItem("Export view numbers (CSV/JSON)...")) {
      path_action_ = PathAction::ExportData;
      path_buf_ = "kvscope_" + s_.settings.active_view + ".csv";
      open_path_popup_ = true;
    }
    if (on_quit) {
      ImGui::Separator();
      const bool quit = ImGui::MenuItem("Quit");
      record_item(s_, "menu:Quit");
      if (quit) on_quit();
    }
    ImGui::EndMenu();
  }
  if (open_capture) run_command(Command::OpenCapture);
  if (save_session) run_command(Command::SaveSession);
  if (export_png) run_command(Command::ExportPng);
  if (ImGui::BeginMenu("View")) {
    for (const auto& v : views_)
      if (ImGui::MenuItem(v->title(), nullptr, s_.settings.active_view == v->name())) {
        show_view(v->name());
        s_.settings.active_view = v->name();
      }
    ImGui::Separator();
    char scale_text[48];
    std::snprintf(scale_text, sizeof scale_text, "UI scale: %.2fx", ui_scale_);
    ImGui::TextDisabled("%s", scale_text);
    if (ImGui::MenuItem("Larger (for a projector)", "Ctrl +", false, ui_scale_ < kMaxUiScale))
      set_ui_scale(ui_scale_ + 0.25f);
    if (ImGui::MenuItem("Smaller", "Ctrl -", false, ui_scale_ > kMinUiScale))
      set_ui_scale(ui_scale_ - 0.25f);
    if (ImGui::MenuItem("Reset scale", "Ctrl 0")) set_ui_scale(1.0f);
    if (ImGui::MenuItem("Reset panel split")) left_w_ = 0;
    ImGui::Separator();
    if (ImGui::MenuItem("Presentation (this view alone)", "F11")) run_command(Command::Present);
    ImGui::EndMenu();
  }
  const bool help_menu = ImGui::BeginMenu("Help");
  record_item(s_, "menu:Help");
  if (help_menu) {
    if (ImGui::MenuItem("KVScope help", "F1")) run_command(Command::Help);
    record_item(s_, "menu:KVScope help");
    ImGui::EndMenu();
  }
  // Right side: what is open.
  std::string right;
  if (const CaptureInfo* ci = s_.info())
    right = fs::path(s_.capture_path).filename().string() + (ci->synthetic ? "  [SYNTHETIC]" : "");
  if (!s_.loading_path.empty())
    right = "opening " + fs::path(s_.loading_path).filename().string() + "...";
  if (!right.empty()) {
    float w = ImGui::CalcTextSize(right.c_str()).x;
    const float at = ImGui::GetWindowWidth() - w - px(20);
    if (at > ImGui::GetCursorPosX() + px(10)) {  // on small windows the menus keep the room
      ImGui::SameLine(at);
      ImGui::TextDisabled("%s", right.c_str());
    }
  }
  ImGui::EndMenuBar();
}

void AppUi::draw_status_bar() {
  ImGui::Separator();
  if (presenting_) {
    // The presentation's line: how to leave, then the running jobs (below).
    ImGui::TextDisabled("presentation: F11 or Escape leaves");
  } else if (const CaptureInfo* ci = s_.info()) {
    // The engine's exact reference cache (engine/eval/reference_cache.h): what it holds of its
    // budget.
    const ReferenceCacheStats rc = ReferenceCache::global().stats();
    ImGui::Text("%s | L%d H%d | resident %s | reference cache %s / %s | backend %s",
                ci->model.c_str(), s_.settings.focus.layer, s_.settings.focus.kv_head,
                human_bytes(s_.capture->resident_bytes()).c_str(),
                human_bytes(static_cast<long long>(rc.bytes)).c_str(),
                human_bytes(static_cast<long long>(rc.budget)).c_str(), s_.backend_active.c_str());
    if (ImGui::IsItemHovered())
      ImGui::SetTooltip(
          "reference cache: the exact attention of each (layer, kv head, window), computed once "
          "and reused by every method, ratio, seed and parameter\n%d heads held, %lld hits, %lld "
          "built, %lld dropped for the budget (KVSCOPE_REFERENCE_CACHE_MB sets it)",
          rc.entries, rc.hits, rc.misses, rc.evictions);
  } else {
    ImGui::TextDisabled("no capture open (File > Open capture, or drop a file on the window)");
  }
  auto jobs = s_.worker.jobs();
  for (const auto& j : jobs) {
    if (!j.running) continue;
    ImGui::SameLine();
    ImGui::TextDisabled("|");
    ImGui::SameLine();
    float frac = j.total > 0 ? static_cast<float>(j.done) / static_cast<float>(j.total) : 0.0f;
    char overlay[160];
    const double left = time_left_s(j);
    if (left >= 0)
      std::snprintf(overlay, sizeof overlay, "%s %d/%d, about %s left", j.label.c_str(), j.done,
                    j.total, fmt_seconds(left).c_str());
    else if (j.total > 0)
      std::snprintf(overlay, sizeof overlay, "%s %d/%d", j.label.c_str(), j.done, j.total);
    else
      std::snprintf(overlay, sizeof overlay, "%s...", j.label.c_str());
    ImGui::ProgressBar(j.total > 0 ? frac : 0.0f,
                       ImVec2(std::max(px(220), ImGui::CalcTextSize(overlay).x + px(12)), 0),
                       overlay);
    ImGui::SameLine();
    ImGui::PushID(j.key.c_str());
    if (ImGui::SmallButton("cancel")) {
      if (s_.results.count(j.key))
        s_.cancel_job(j.key);  // stays cancelled until Run
      else
        s_.worker.cancel(j.key);
    }
    ImGui::PopID();
  }
  int queued = 0;
  for (const auto& j : jobs) queued += j.running ? 0 : 1;
  if (queued) {
    ImGui::SameLine();
    ImGui::TextDisabled("(+%d queued)", queued);
  }
  if (!s_.status_message.empty()) {
    ImGui::SameLine();
    ImGui::TextDisabled("| %s", s_.status_message.c_str());
  }
}

void AppUi::draw_dialogs() {
  browser_.draw(&s_.ui_items);
  draw_new_capture_dialog(s_);
  if (open_path_popup_) {
    ImGui::OpenPopup("Save as");
    open_path_popup_ = false;
    focus_path_field_ = true;
  }
  ImGui::SetNextWindowSize(ImVec2(std::min(px(620), ImGui::GetMainViewport()->Size.x - px(20)), 0),
                           ImGuiCond_Appearing);
  fit_next_dialog_to_display();
  save_dialog_open_ = ImGui::BeginPopupModal("Save as", nullptr, ImGuiWindowFlags_AlwaysAutoResize);
  if (save_dialog_open_) {
    keep_dialog_on_screen();
    const char* what =
        path_action_ == PathAction::ExportPng2x  ? "2x PNG of the active view's figure"
        : path_action_ == PathAction::ExportPng  ? "PNG of the active view's figure"
        : path_action_ == PathAction::ExportSvg  ? "SVG of the active view's figure"
        : path_action_ == PathAction::ExportData ? "numbers of the active view (.csv or .json)"
                                                 : "session (.json)";
    ImGui::Text("Write the %s to:", what);
    char buf[1024];
    std::snprintf(buf, sizeof buf, "%s", path_buf_.c_str());
    ImGui::SetNextItemWidth(std::min(px(600), ImGui::GetMainViewport()->Size.x - px(60)));
    if (focus_path_field_) {
      ImGui::SetKeyboardFocusHere();
      focus_path_field_ = false;
    }
    // Enter saves, Escape cancels.
    const bool enter =
        ImGui::InputText("##savepath", buf, sizeof buf,
                         ImGuiInputTextFlags_EnterReturnsTrue | ImGuiInputTextFlags_AutoSelectAll);
    path_buf_ = buf;
    const bool escape = ImGui::IsKeyPressed(ImGui::GetKeyIndex(ImGuiKey_Escape), false);
    if (ImGui::Button("Save", ImVec2(dialog_button_width("Cancel"), 0)) || enter) {
      try {
        View* v = find_view(s_.settings.active_view);
        if (path_action_ == PathAction::ExportPng) {
          // Two frames later, when this dialog is gone; the rectangle is taken then.
          png_requests_.push_back(
              {path_buf_, v ? view_rect(v->name()) : ScreenRect{}, 2, 1.0f, v ? v->name() : ""});
        } else if (path_action_ == PathAction::ExportPng2x) {
          if (!v) throw InputError("export: no active view");
          png_requests_.push_back({path_buf_, {}, 2, 2.0f, v->name()});
        } else if (path_action_ == PathAction::ExportSvg) {
          if (!v) throw InputError("export: no active view");
          request_svg(path_buf_, v->name());
        } else if (path_action_ == PathAction::ExportData) {
          if (!v) throw InputError("export: no active view");
          export_view_data(*v, s_, path_buf_);
          s_.status_message = "wrote " + path_buf_;
        } else {
          save_session(path_buf_);
          s_.status_message = "session saved to " + path_buf_;
        }
      } catch (const std::exception& e) {
        s_.status_message = e.what();
      }
      ImGui::CloseCurrentPopup();
    }
    ImGui::SameLine();
    if (ImGui::Button("Cancel", ImVec2(dialog_button_width("Cancel"), 0)) || escape)
      ImGui::CloseCurrentPopup();
    ImGui::EndPopup();
  }
}

void AppUi::draw_recent_menu() {
  const bool any = recent_ && !recent_->entries().empty();
  const bool open = ImGui::BeginMenu("Open recent", any);
  record_item(s_, "menu:Open recent");
  if (!open) return;
  std::optional<RecentEntry> pick;
  int i = 0;
  for (const RecentEntry& e : recent_->entries()) {
    std::error_code ec;
    const bool there = fs::exists(e.path, ec);
    const fs::path p(e.path);
    const std::string label = p.filename().string() + (e.kind == "session" ? "  (session)" : "");
    ImGui::PushID(i++);
    // A file that is gone stays listed, disabled, so the list does not jump around.
    if (ImGui::MenuItem(label.c_str(), p.parent_path().string().c_str(), false, there)) pick = e;
    record_item(s_, "recent:" + e.path);
    if (!there && ImGui::IsItemHovered(ImGuiHoveredFlags_AllowWhenDisabled))
      ImGui::SetTooltip("%s is not there any more", e.path.c_str());
    ImGui::PopID();
  }
  ImGui::EndMenu();
  if (!pick) return;
  if (pick->kind == "capture") {
    s_.request_open(pick->path);
  } else {
    try {
      load_session(pick->path);
      s_.status_message = "session loaded from " + pick->path;
    } catch (const std::exception& e) {
      s_.load_error = e.what();
    }
  }
}

void AppUi::draw_help() {
  if (!help_open_) return;
  const ImGuiViewport* vp = ImGui::GetMainViewport();
  const ImVec2 size(std::min(px(760), vp->Size.x - px(40)), std::min(px(640), vp->Size.y - px(60)));
  ImGui::SetNextWindowSize(size, ImGuiCond_Appearing);
  ImGui::SetNextWindowPos(
      ImVec2(vp->Pos.x + (vp->Size.x - size.x) * 0.5f, vp->Pos.y + (vp->Size.y - size.y) * 0.5f),
      ImGuiCond_Appearing);
  if (help_focus_) {
    ImGui::SetNextWindowFocus();
    help_focus_ = false;
  }
  const bool shown = ImGui::Begin("KVScope help", &help_open_,
                                  ImGuiWindowFlags_NoCollapse | ImGuiWindowFlags_NoSavedSettings);
  if (shown) {
    const ImVec2 wp = ImGui::GetWindowPos(), ws = ImGui::GetWindowSize();
    s_.ui_items["help:window"] = {wp.x, wp.y, wp.x + ws.x, wp.y + ws.y};
    ImGui::TextWrapped(
        "KVScope shows what KV-cache compression keeps and what it costs. Open a capture (File > "
        "Open capture, or drop a .safetensors / .npz file on the window), pick methods in the "
        "Method view, click a grid cell in the Capture view to focus a layer and kv head. Every "
        "change recomputes what it outdates: the focused head at once, the rest in the "
        "background (status bar: progress and cancel).");
    if (ImGui::CollapsingHeader("Keyboard shortcuts", ImGuiTreeNodeFlags_DefaultOpen)) {
      if (ImGui::BeginTable("##shortcuts", 2,
                            ImGuiTableFlags_RowBg | ImGuiTableFlags_BordersInnerV)) {
        ImGui::TableSetupColumn("key", ImGuiTableColumnFlags_WidthFixed, px(110));
        ImGui::TableSetupColumn("action", ImGuiTableColumnFlags_WidthStretch);
        for (const Shortcut& sc : shortcuts()) {
          ImGui::TableNextRow();
          ImGui::TableNextColumn();
          ImGui::TextUnformatted(sc.label);
          ImGui::TableNextColumn();
          if (sc.export_dir)
            ImGui::TextWrapped("%s (kvscope --export-dir DIR)", sc.action);
          else
            ImGui::TextWrapped("%s", sc.action);
        }
        ImGui::EndTable();
      }
      ImGui::TextDisabled(
          "Open dialog: Enter, Up/Down, double-click, Escape. Teaching view: arrows, space.");
    }
    if (ImGui::CollapsingHeader("Views", ImGuiTreeNodeFlags_DefaultOpen)) {
      for (const auto& v : views_) {
        ImGui::PushID(v->name());
        if (ImGui::SmallButton(v->title())) {
          show_view(v->name());
          s_.settings.active_view = v->name();
        }
        ImGui::SameLine();
        ImGui::TextDisabled("(%s panel)", v->panel() == Panel::Left ? "left" : "main");
        ImGui::Indent();
        ImGui::TextWrapped("%s", v->help());
        ImGui::Unindent();
        ImGui::PopID();
      }
    }
    if (ImGui::CollapsingHeader("Documents to read", ImGuiTreeNodeFlags_DefaultOpen)) {
      static const std::string xdg = find_xdg_open();
      ImGui::TextDisabled("Paths are relative to the KVScope repository.");
      for (const HelpDoc& d : help_docs()) {
        ImGui::PushID(d.path.c_str());
        const std::string file = help_doc_file(d);
        if (ImGui::SmallButton("copy path")) {
          ImGui::SetClipboardText(file.empty() ? d.path.c_str() : file.c_str());
          s_.status_message = std::string("copied ") + (file.empty() ? d.path : file);
        }
        if (!xdg.empty() && !file.empty()) {
          ImGui::SameLine();
          if (ImGui::SmallButton("open"))
            s_.status_message =
                open_with_xdg(xdg, file) ? "opened " + file : "xdg-open could not start";
        }
        ImGui::SameLine();
        ImGui::Text("%s", d.path.c_str());
        ImGui::SameLine();
        ImGui::TextDisabled("%s", d.what.c_str());
        ImGui::PopID();
      }
    }
  }
  ImGui::End();
}

}  // namespace kvscope::app
