// File > New capture and the Output view, driven headless through the software rasteriser: the
// frame is drawn exactly as in the app, the work runs on the worker lanes, and the PNGs land in
// build/gui_test_out (new_capture_dialog.png, output_view.png) for people to look at.
#include <gtest/gtest.h>
#include <stb_image.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "app/app_frame.h"
#include "app/app_state.h"
#include "app/export.h"
#include "app/new_capture_dialog.h"
#include "app/soft_render.h"
#include "app/views/view.h"
#include "engine/core/error.h"
#include "engine/io/capture.h"
#include "engine/model/llama2c.h"

namespace fs = std::filesystem;
using namespace kvscope;
using namespace kvscope::app;

namespace {

constexpr int kWidth = 1500, kHeight = 950;

// Draws frames until `done` holds or `seconds` pass.
template <typename Pred>
bool frames_until(AppState& s, AppUi& ui, Pred done, double seconds) {
  const auto t0 = std::chrono::steady_clock::now();
  while (true) {
    s.worker.drain(s);
    ImGui::GetIO().DeltaTime = 1.0f / 60.0f;
    ImGui::NewFrame();
    ui.draw();
    ImGui::Render();
    if (done()) return true;
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > seconds)
      return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

// Clicks a widget the last frame drew (AppState::ui_items) through ImGui's input: the press and
// the release each in a frame of their own, as a user's click arrives.
bool click(AppState& s, AppUi& ui, const std::string& item) {
  const auto it = s.ui_items.find(item);
  if (it == s.ui_items.end()) return false;
  const auto [x0, y0, x1, y1] = it->second;
  ImGuiIO& io = ImGui::GetIO();
  io.MousePos = ImVec2((x0 + x1) / 2, (y0 + y1) / 2);
  for (const bool down : {false, true, false}) {
    io.MouseDown[0] = down;
    frames_until(
        s, ui, [] { return true; }, 0);
  }
  return true;
}

// A frame's draw data kept past the next NewFrame (to draw its PNG later).
struct DrawCopy {
  std::vector<ImDrawList*> lists;
  ImDrawData data;
  explicit DrawCopy(const ImDrawData& d) : data(d) {
    for (int i = 0; i < d.CmdListsCount; ++i) lists.push_back(d.CmdLists[i]->CloneOutput());
    data.CmdLists = lists.data();
  }
  ~DrawCopy() {
    for (ImDrawList* l : lists) IM_DELETE(l);
  }
  DrawCopy(const DrawCopy&) = delete;
  DrawCopy& operator=(const DrawCopy&) = delete;
};

std::string out_dir() {
  fs::create_directories(KVSCOPE_GUI_OUT);
  return KVSCOPE_GUI_OUT;
}

// Fraction of pixels in the PNG that differ from the window background.
double non_background(const std::string& png) {
  int w = 0, h = 0, n = 0;
  unsigned char* img = stbi_load(png.c_str(), &w, &h, &n, 3);
  if (!img) return 0;
  size_t differ = 0;
  for (int i = 0; i < w * h; ++i)
    if (img[3 * i] != 23 || img[3 * i + 1] != 25 || img[3 * i + 2] != 28) ++differ;
  stbi_image_free(img);
  return static_cast<double>(differ) / (w * h);
}

}  // namespace

// One process, one ImGui context: the dialog makes a capture that opens and saves, then the
// Output view runs on that model and prompt.
TEST(GenerateUi, NewCaptureDialogThenOutputView) {
  const BundledModel* stories = find_bundled_model("stories260K");
  if (!stories || stories->tokenizer.empty())
    GTEST_SKIP() << "stories260K not found under " << models_dir();
  ASSERT_NE(find_bundled_model("kjv3M"), nullptr) << "the models folder lists kjv3M too";
  EXPECT_EQ(fs::path(find_bundled_model("kjv3M")->tokenizer).filename(), "tok1024.bin");
  EXPECT_EQ(fs::path(stories->tokenizer).filename(), "tok512.bin");

  SoftTexture font = soft_init(kWidth, kHeight);
  {
    AppState s;
    AppUi ui(s);
    // A bad tokenizer: the error is the kNewCapture result's, one message naming the file;
    // nothing opens. Asking only sets the request: reconcile() submits the job.
    NewCaptureSettings bad;
    bad.checkpoint = stories->checkpoint;
    bad.tokenizer = find_bundled_model("kjv3M")->tokenizer;  // 1024 entries for a 512 vocab
    open_new_capture_dialog();
    start_new_capture(s, bad);
    EXPECT_TRUE(s.new_capture_pending);
    EXPECT_FALSE(s.worker.busy(kNewCapture)) << "asking submitted a job";
    ASSERT_TRUE(frames_until(
        s, ui, [&] { return !s.new_capture_pending; }, 60));
    const std::string error = new_capture_error(s);
    EXPECT_NE(error.find("tok1024.bin"), std::string::npos) << error;
    EXPECT_EQ(error.find('\n'), std::string::npos) << error;
    EXPECT_FALSE(s.capture);
    // A failed request is done: it is not run again.
    frames_until(
        s, ui, [] { return false; }, 0.1);
    EXPECT_FALSE(s.worker.busy(kNewCapture));
    EXPECT_EQ(new_capture_error(s), error);
    std::vector<uint8_t> px;
    soft_render(ImGui::GetDrawData(), font, kWidth, kHeight, px, IM_COL32(23, 25, 28, 255));
    write_png(out_dir() + "/new_capture_error.png", px, kWidth, kHeight, false);

    // The dialog's Run: greedy, 96 positions.
    NewCaptureSettings ok;
    ok.checkpoint = stories->checkpoint;
    ok.tokenizer = stories->tokenizer;
    ok.prompt = "Once upon a time, there was a little dog";
    ok.steps = 96;
    ok.temperature = 0.0f;
    start_new_capture(s, ok);
    ASSERT_TRUE(frames_until(
        s, ui,
        [&] {
          return last_new_capture(s) && s.capture && s.capture_path == last_new_capture(s)->path &&
                 !s.worker.busy();
        },
        120))
        << s.load_error;
    // A few more frames so the dialog shows the result, then its screenshot.
    frames_until(
        s, ui, [] { return false; }, 0.2);
    soft_render(ImGui::GetDrawData(), font, kWidth, kHeight, px, IM_COL32(23, 25, 28, 255));
    const std::string dialog_png = out_dir() + "/new_capture_dialog.png";
    write_png(dialog_png, px, kWidth, kHeight, false);
    EXPECT_GT(non_background(dialog_png), 0.05);

    const CaptureInfo& info = *s.info();
    EXPECT_EQ(info.num_tokens, 96);
    EXPECT_EQ(info.model, "stories260K");
    EXPECT_EQ(info.prompt, ok.prompt);
    // The same tokens as a direct greedy generation.
    llama2c::Transformer model(stories->checkpoint);
    llama2c::Tokenizer tok(stories->tokenizer, model.config().vocab_size);
    llama2c::GenerateOptions options;
    options.steps = 96;
    const llama2c::Generation g = llama2c::generate(model, tok, ok.prompt, options);
    EXPECT_EQ(info.tokens, g.text);
    EXPECT_EQ(last_new_capture(s)->text, g.decoded);
    // Opening the capture cleared every result, the request's too; the request is done, so it is
    // not run again (the capture is not made and reopened once more).
    EXPECT_FALSE(s.new_capture_pending);
    EXPECT_FALSE(s.worker.busy(kNewCapture));
    EXPECT_TRUE(new_capture_error(s).empty());

    // Save: a safetensors copy that opens; never over an existing file; only .safetensors.
    const std::string saved = (fs::temp_directory_path() /
                               ("kvscope_saved_" + std::to_string(::getpid()) + ".safetensors"))
                                  .string();
    fs::remove(saved);
    const std::string temp = last_new_capture(s)->path;
    EXPECT_EQ(s.temp_captures.count(temp), 1u);
    save_new_capture(s, saved);
    EXPECT_EQ(CaptureFile::open(saved)->info().tokens, g.text);
    EXPECT_THROW(save_new_capture(s, saved), InputError);
    EXPECT_THROW(save_new_capture(s, saved + ".npz"), InputError);
    // The saved file is the capture's path from now on (window title, menu
    // bar, sessions); the temporary file is still the app's, never the saved one.
    EXPECT_EQ(s.capture_path, saved);
    EXPECT_EQ(s.to_session()["capture"], saved);
    EXPECT_EQ(s.temp_captures.count(saved), 0u);
    EXPECT_TRUE(fs::exists(temp));

    // Cancel: the dialog shows the long capture's progress; its Cancel button (a change of the
    // request, cancel_new_capture) stops the job and leaves the open capture as it was. kjv3M (a
    // dozen times stories260K's work per position) over its whole context, clicked at once: the
    // progress frame is copied and drawn into its PNG after the click.
    NewCaptureSettings longer = ok;
    longer.checkpoint = find_bundled_model("kjv3M")->checkpoint;
    longer.tokenizer = find_bundled_model("kjv3M")->tokenizer;
    longer.steps = 512;
    const std::string before = s.capture_path;
    start_new_capture(s, longer);
    const std::string cancelled_out = s.new_capture.out;
    ASSERT_TRUE(frames_until(
        s, ui,
        [&] { return s.progress(kNewCapture).first > 0 && s.ui_items.count("newcapture:Cancel"); },
        60));
    EXPECT_EQ(s.progress(kNewCapture).second, 512);
    DrawCopy progress_frame(*ImGui::GetDrawData());
    const int done_at_cancel = s.progress(kNewCapture).first;
    ASSERT_TRUE(click(s, ui, "newcapture:Cancel"));
    std::printf("Cancel clicked at %d/512 positions\n", done_at_cancel);
    EXPECT_FALSE(s.new_capture_pending);
    soft_render(&progress_frame.data, font, kWidth, kHeight, px, IM_COL32(23, 25, 28, 255));
    write_png(out_dir() + "/new_capture_progress.png", px, kWidth, kHeight, false);
    ASSERT_TRUE(frames_until(
        s, ui, [&] { return !s.worker.busy(kNewCapture); }, 60));
    frames_until(
        s, ui, [] { return false; }, 0.2);
    EXPECT_EQ(s.capture_path, before);
    EXPECT_FALSE(s.result(kNewCapture).busy());  // cancelled stays cancelled
    EXPECT_TRUE(new_capture_error(s).empty());
    EXPECT_FALSE(fs::exists(cancelled_out));
    EXPECT_TRUE(s.ui_items.count("newcapture:Run"));  // Run is back

    // The Output view starts with the open capture's model and prompt and runs by itself.
    close_new_capture_dialog();
    ui.show_view("output");
    ASSERT_TRUE(frames_until(
        s, ui, [&] { return ui.ready_for_screenshot("output"); }, 300));
    View* view = ui.find_view("output");
    ASSERT_NE(view, nullptr);
    const nlohmann::json j = view->export_json(s);
    ASSERT_TRUE(j.is_object()) << "the Output view has no report";
    EXPECT_EQ(j["prompt"], ok.prompt);
    EXPECT_EQ(j["compress_at"], 128);
    EXPECT_EQ(j["results"].size(), 4u);  // uniform, snapkv, balancekv, streaming at 1/4
    EXPECT_NE(view->export_csv(s).find("balancekv,0.25,"), std::string::npos);
    soft_render(ImGui::GetDrawData(), font, kWidth, kHeight, px, IM_COL32(23, 25, 28, 255));
    const std::string output_png = out_dir() + "/output_view.png";
    write_png(output_png, px, kWidth, kHeight, false, ui.view_rect("output"));
    EXPECT_GT(non_background(output_png), 0.05);

    // Opening another capture outdates the report at once. Until the new
    // capture's run replaces it, it is shown and exported as stale, never as the new prompt's.
    const std::string other =
        std::string(KVSCOPE_SOURCE_DIR) + "/sample_data/kjv3M_beginning.safetensors";
    s.request_open(other);
    int fresh_with_other_prompt = 0, stale_frames = 0;
    ASSERT_TRUE(frames_until(
        s, ui,
        [&] {
          const nlohmann::json e = view->export_json(s);
          if (s.capture_path == other && e.is_object()) {
            if (!e["fresh"].get<bool>())
              ++stale_frames;
            else if (e["prompt"] != s.info()->prompt)
              ++fresh_with_other_prompt;
          }
          return s.capture_path == other && ui.ready_for_screenshot("output");
        },
        300));
    // Opening a capture clears the results, so the old report is either gone or shown stale
    // (counted in stale_frames); it is never exported as fresh.
    EXPECT_EQ(fresh_with_other_prompt, 0) << stale_frames << " frames showed it stale";
    // Another capture opened: the new capture's temporary file is deleted, the saved one stays.
    EXPECT_FALSE(fs::exists(temp));
    EXPECT_TRUE(s.temp_captures.empty());
    EXPECT_TRUE(fs::exists(saved));
    fs::remove(saved);
    const nlohmann::json k = view->export_json(s);
    EXPECT_EQ(k["prompt"], s.info()->prompt);
    EXPECT_TRUE(k["fresh"].get<bool>());
    EXPECT_NE(k["model"].get<std::string>().find("kjv3M"), std::string::npos);
  }
  ImGui::DestroyContext();
}
