#include "app/new_capture_dialog.h"

#include <imgui.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>

#include "app/app_frame.h"
#include "app/app_state.h"
#include "app/result_status.h"
#include "engine/core/error.h"
#include "engine/model/llama2c.h"

namespace kvscope::app {
namespace fs = std::filesystem;

namespace {

// The dialog's fields and the last result; UI thread only.
struct DialogState {
  bool open_requested = false;
  bool close_requested = false;
  int model_index = -1;  // into bundled_models(), -1: the path fields
  char checkpoint[1024] = "";
  char tokenizer[1024] = "";
  char prompt[2048] = "In the beginning";
  int steps = 256;
  float temperature = 0.8f;
  float topp = 0.9f;
  int seed = 0;
  char save_path[1024] = "my_capture.safetensors";
  std::string save_message;
  std::shared_ptr<const NewCaptureResult> shown;  // the capture the save fields are for
};

DialogState& dialog() {
  static DialogState d;
  return d;
}

void copy_to(char* buf, size_t size, const std::string& s) {
  std::snprintf(buf, size, "%s", s.c_str());
}

void pick_model(int index) {
  DialogState& d = dialog();
  const auto& models = bundled_models();
  if (index < 0 || index >= static_cast<int>(models.size())) return;
  d.model_index = index;
  copy_to(d.checkpoint, sizeof d.checkpoint, models[index].checkpoint);
  copy_to(d.tokenizer, sizeof d.tokenizer, models[index].tokenizer);
  d.steps = std::min(d.steps, 512);
}

// llama2.c header: dim, hidden, layers, heads, kv heads, vocab (sign: shared classifier), seq_len.
bool read_header(const std::string& path, int32_t (&h)[7]) {
  std::ifstream in(path, std::ios::binary);
  return static_cast<bool>(in.read(reinterpret_cast<char*>(h), sizeof h));
}

std::vector<BundledModel> scan_models() {
  std::vector<BundledModel> out;
  const std::string dir = models_dir();
  if (dir.empty()) return out;
  std::vector<fs::path> checkpoints, tokenizers;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (!e.is_regular_file() || e.path().extension() != ".bin") continue;
    (e.path().stem().string().rfind("tok", 0) == 0 ? tokenizers : checkpoints).push_back(e.path());
  }
  std::sort(checkpoints.begin(), checkpoints.end());
  for (const fs::path& p : checkpoints) {
    int32_t h[7];
    if (!read_header(p.string(), h) || h[0] <= 0 || h[3] <= 0 || h[4] <= 0) continue;
    BundledModel m;
    m.name = p.stem().string();
    m.checkpoint = p.string();
    const int vocab = std::abs(h[5]);
    char summary[160];
    std::snprintf(summary, sizeof summary,
                  "%d layers, %d query / %d kv heads, head dim %d, vocab %d, context %d", h[2],
                  h[3], h[4], h[0] / h[3], vocab, h[6]);
    m.summary = summary;
    // The tokenizer whose entry count matches the vocabulary (the loader checks the count).
    for (const fs::path& t : tokenizers) {
      try {
        llama2c::Tokenizer tok(t.string(), vocab);
        m.tokenizer = t.string();
        break;
      } catch (const InputError&) {
      }
    }
    out.push_back(m);
  }
  return out;
}

}  // namespace

std::string models_dir() {
  std::error_code ec;
  if (const char* env = std::getenv("KVSCOPE_MODELS"); env && fs::is_directory(env, ec)) return env;
  for (const char* candidate : {"../shared/models", KVSCOPE_SOURCE_DIR "/../shared/models"})
    if (fs::is_directory(candidate, ec)) return fs::weakly_canonical(candidate, ec).string();
  return "";
}

const std::vector<BundledModel>& bundled_models() {
  static const std::vector<BundledModel> models = scan_models();
  return models;
}

const BundledModel* find_bundled_model(const std::string& name) {
  for (const BundledModel& m : bundled_models())
    if (m.name == name) return &m;
  return nullptr;
}

void start_new_capture(AppState& s, const NewCaptureSettings& settings) {
  // The dialog shows what runs (also when a script or test starts the capture).
  DialogState& d = dialog();
  d.model_index = -1;
  for (size_t i = 0; i < bundled_models().size(); ++i)
    if (bundled_models()[i].checkpoint == settings.checkpoint &&
        bundled_models()[i].tokenizer == settings.tokenizer)
      d.model_index = static_cast<int>(i);
  copy_to(d.checkpoint, sizeof d.checkpoint, settings.checkpoint);
  copy_to(d.tokenizer, sizeof d.tokenizer, settings.tokenizer);
  copy_to(d.prompt, sizeof d.prompt, settings.prompt);
  d.steps = settings.steps;
  d.temperature = settings.temperature;
  d.topp = settings.topp;
  d.seed = static_cast<int>(settings.seed);
  ask_new_capture(s, settings);
}

const NewCaptureResult* last_new_capture(const AppState& s) {
  return s.new_capture_made.get();
}

void save_new_capture(AppState& s, const std::string& path) {
  const NewCaptureResult* r = last_new_capture(s);
  if (!r) throw InputError("save capture: no new capture has been made yet");
  std::error_code ec;
  if (!fs::exists(r->path, ec))
    throw InputError(path +
                     ": the new capture is gone (its temporary file is deleted when "
                     "another capture opens); run it again to save it");
  if (path.size() < 12 || path.compare(path.size() - 12, 12, ".safetensors") != 0)
    throw InputError(path +
                     ": the capture is saved as safetensors; the name must end in "
                     ".safetensors");
  if (fs::exists(path, ec))
    throw InputError(path + ": already exists; choose another name (nothing is overwritten)");
  fs::copy_file(r->path, path, ec);
  if (ec) throw InputError(path + ": cannot write: " + ec.message());
  // The open capture is now the saved file: window title, sessions and exports name it.
  s.capture_saved_as(r->path, path);
}

void open_new_capture_dialog() {
  DialogState& d = dialog();
  d.open_requested = true;
  if (d.checkpoint[0] == '\0' && !bundled_models().empty()) {
    // Prefer the model with real heads (kjv3M) when it is there.
    int pick = 0;
    for (size_t i = 0; i < bundled_models().size(); ++i)
      if (bundled_models()[i].name == "kjv3M") pick = static_cast<int>(i);
    pick_model(pick);
  }
}

void close_new_capture_dialog() {
  dialog().close_requested = true;
}

void draw_new_capture_dialog(AppState& s) {
  DialogState& d = dialog();
  if (d.open_requested) {
    ImGui::OpenPopup("New capture");
    d.open_requested = false;
    d.close_requested = false;
  }
  ImGui::SetNextWindowSize(ImVec2(px(760), 0), ImGuiCond_Appearing);
  fit_next_dialog_to_display();
  if (!ImGui::BeginPopupModal("New capture", nullptr, ImGuiWindowFlags_AlwaysAutoResize)) return;
  keep_dialog_on_screen();
  // Text fields 600 px wide at 1x, narrower where the display is (2.5x on a 1600 px screen).
  const float field_w = std::min(
      px(600), ImGui::GetIO().DisplaySize.x * 0.9f - labelled_width(0, "checkpoint") - px(40));

  ImGui::TextWrapped(
      "Run a llama2.c model on the CPU and capture every layer's queries, keys and values for "
      "BOS + prompt + generated tokens.");
  ImGui::Separator();
  const auto& models = bundled_models();
  const char* preview = d.model_index >= 0 && d.model_index < static_cast<int>(models.size())
                            ? models[d.model_index].name.c_str()
                            : "(paths below)";
  ImGui::SetNextItemWidth(px(240));
  if (ImGui::BeginCombo("model", preview)) {
    for (size_t i = 0; i < models.size(); ++i)
      if (ImGui::Selectable(models[i].name.c_str(), d.model_index == static_cast<int>(i)))
        pick_model(static_cast<int>(i));
    if (ImGui::Selectable("(paths below)", d.model_index < 0)) d.model_index = -1;
    ImGui::EndCombo();
  }
  // Under the combo, wrapped: beside it the summary ran off the dialog at 2.5x.
  const char* model_note = d.model_index >= 0 && d.model_index < static_cast<int>(models.size())
                               ? models[static_cast<size_t>(d.model_index)].summary.c_str()
                           : models.empty()
                               ? "no bundled models found (../shared/models or $KVSCOPE_MODELS)"
                               : nullptr;
  if (model_note) {
    ImGui::PushStyleColor(ImGuiCol_Text, ImGui::GetStyleColorVec4(ImGuiCol_TextDisabled));
    ImGui::PushTextWrapPos(ImGui::GetCursorPosX() + field_w);
    ImGui::TextWrapped("%s", model_note);
    ImGui::PopTextWrapPos();
    ImGui::PopStyleColor();
  }
  ImGui::SetNextItemWidth(field_w);
  if (ImGui::InputText("checkpoint", d.checkpoint, sizeof d.checkpoint)) d.model_index = -1;
  ImGui::SetNextItemWidth(field_w);
  if (ImGui::InputText("tokenizer", d.tokenizer, sizeof d.tokenizer)) d.model_index = -1;
  // One line, like the Output view's prompt (a multi-line box cut off long lines at its edge).
  ImGui::SetNextItemWidth(field_w);
  ImGui::InputText("prompt", d.prompt, sizeof d.prompt);
  ImGui::SetNextItemWidth(px(140));
  ImGui::InputInt("steps (positions, BOS and prompt included)", &d.steps);
  d.steps = std::clamp(d.steps, 1, 4096);
  ImGui::SetNextItemWidth(px(140));
  ImGui::SliderFloat("temperature (0 = greedy)", &d.temperature, 0.0f, 1.5f, "%.2f");
  if (d.temperature > 0.0f) {
    ImGui::SetNextItemWidth(px(140));
    ImGui::SliderFloat("top-p", &d.topp, 0.05f, 1.0f, "%.2f");
    ImGui::SetNextItemWidth(px(140));
    ImGui::InputInt("seed", &d.seed);
    d.seed = std::max(d.seed, 0);
  }

  ImGui::Separator();
  // The request runs while it is pending (reconcile() submits it); Cancel changes the request.
  const bool pending = s.new_capture_pending;
  if (pending) {
    const Result& r = s.result(kNewCapture);
    const auto [done, total] = s.progress(kNewCapture);
    char overlay[64];
    std::snprintf(overlay, sizeof overlay, "%d/%d positions", done, total);
    ImGui::ProgressBar(total > 0 ? static_cast<float>(done) / total : 0.0f, ImVec2(px(400), 0),
                       total > 0  ? overlay
                       : r.busy() ? "queued"
                                  : "starting");
    ImGui::SameLine();
    const bool cancel = ImGui::Button("Cancel run");
    record_item(s, "newcapture:Cancel");
    if (cancel) cancel_new_capture(s);
  } else {
    const bool run = ImGui::Button("Run", ImVec2(dialog_button_width("Close"), 0));
    record_item(s, "newcapture:Run");
    if (run) {
      NewCaptureSettings settings;
      settings.checkpoint = d.checkpoint;
      settings.tokenizer = d.tokenizer;
      settings.prompt = d.prompt;
      settings.steps = d.steps;
      settings.temperature = d.temperature;
      settings.topp = d.topp;
      settings.seed = static_cast<uint64_t>(d.seed);
      start_new_capture(s, settings);
    }
  }
  if (const std::string error = new_capture_error(s); !error.empty()) {
    ImGui::PushStyleColor(ImGuiCol_Text, ImVec4(1.0f, 0.45f, 0.4f, 1.0f));
    ImGui::TextWrapped("%s", error.c_str());
    ImGui::PopStyleColor();
  }

  // A capture made since the dialog last drew: its save fields start afresh.
  if (s.new_capture_made && s.new_capture_made != d.shown) {
    d.shown = s.new_capture_made;
    d.save_message.clear();
    copy_to(d.save_path, sizeof d.save_path, d.shown->model + "_capture.safetensors");
  }
  if (const NewCaptureResult* made = last_new_capture(s)) {
    ImGui::Separator();
    ImGui::Text("Opened: %d tokens of %s in %.1f s", made->tokens, made->model.c_str(),
                made->seconds);
    ImGui::BeginChild("##newcapturetext", ImVec2(field_w + px(120), px(110)), true);
    ImGui::TextWrapped("%s", made->text.c_str());
    ImGui::EndChild();
    ImGui::SetNextItemWidth(480);
    ImGui::InputText("##savepath", d.save_path, sizeof d.save_path);
    ImGui::SameLine();
    if (ImGui::Button("Save as safetensors")) {
      try {
        save_new_capture(s, d.save_path);
        d.save_message = std::string("saved ") + d.save_path;
        s.status_message = d.save_message;
      } catch (const InputError& e) {
        d.save_message = e.what();
      }
    }
    if (!d.save_message.empty()) ImGui::TextWrapped("%s", d.save_message.c_str());
  }
  ImGui::Separator();
  const bool close = ImGui::Button("Close", ImVec2(dialog_button_width("Close"), 0));
  record_item(s, "newcapture:Close");
  // Escape closes it like the other dialogs (docs/app.md, shortcuts); a list open in it takes
  // the Escape first (AppUi::close_popups_and_menus spends it).
  const bool escape = ImGui::IsKeyPressed(ImGui::GetKeyIndex(ImGuiKey_Escape), false);
  if (close || escape || d.close_requested) {
    d.close_requested = false;
    ImGui::CloseCurrentPopup();
  }
  ImGui::EndPopup();
}

}  // namespace kvscope::app
