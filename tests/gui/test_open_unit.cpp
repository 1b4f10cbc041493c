// Opening a capture goes through reconcile() like every other job: asking sets
// a request in the app state (AppState::request_open), reconcile() plans the kOpen job keyed by
// it, and a request that is done is ended, never run again (also after its opening clears every
// result); the same file asked for twice opens twice. A bad file leaves the open capture and one
// message naming the file. Part of test_app_unit; no window.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "app/app_state.h"
#include "app/open_capture.h"
#include "tests/gui/app_pump.h"

namespace fs = std::filesystem;
using namespace kvscope;
using namespace kvscope::app;

namespace {

template <typename Pred>
bool pump(AppState& s, Pred done, int seconds = 30) {
  return kvscope::app::testing::pump_until(s, done, seconds);
}

const std::string kLily =
    std::string(KVSCOPE_SOURCE_DIR) + "/sample_data/stories260K_lily.safetensors";
const std::string kDragon =
    std::string(KVSCOPE_SOURCE_DIR) + "/sample_data/stories260K_dragon.safetensors";

// Some reconcile() calls with the worker given time to finish whatever was started.
template <typename Check>
void settle(AppState& s, Check check, int frames = 40) {
  for (int i = 0; i < frames; ++i) {
    s.reconcile();
    check();
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

}  // namespace

TEST(Open, AskingPlansAJobKeyedByTheRequest) {
  AppState s;
  s.reconcile();
  EXPECT_TRUE(s.result(kOpen).want.empty()) << "nothing asked, nothing planned";

  s.request_open(kLily);
  ASSERT_TRUE(s.open_pending);
  EXPECT_EQ(s.loading_path, kLily) << "the window says what is opening from the request on";
  EXPECT_FALSE(s.worker.busy()) << "asking submitted work; only reconcile() may";
  s.reconcile();
  const std::string first = open_key(s.open_request);
  EXPECT_EQ(s.result(kOpen).want, first);
  EXPECT_EQ(s.result(kOpen).running, first);
  EXPECT_NE(first.find(kLily), std::string::npos) << first;

  // The same file asked again is a new request: the first job is outdated, the second runs.
  s.request_open(kLily);
  s.reconcile();
  const std::string second = open_key(s.open_request);
  EXPECT_NE(second, first);
  EXPECT_EQ(s.result(kOpen).want, second);
  EXPECT_EQ(s.result(kOpen).running, second);

  ASSERT_TRUE(pump(s, [&] { return s.capture != nullptr; })) << s.load_error;
  EXPECT_EQ(s.capture_path, kLily);
  EXPECT_EQ(s.capture_id, 1u) << "the outdated first request opened too";
  EXPECT_FALSE(s.open_pending);
  EXPECT_TRUE(s.loading_path.empty());
  EXPECT_TRUE(s.load_error.empty());
}

TEST(Open, AFinishedRequestIsNotRunAgainAndTheSameFileOpensTwiceOnPurpose) {
  AppState s;
  s.request_open(kLily);
  ASSERT_TRUE(pump(s, [&] { return s.capture != nullptr; })) << s.load_error;
  // The opening cleared every result, the request's own too: a request still asked for would
  // now run again and reopen its file, every frame.
  const auto first = s.capture;
  settle(s, [&] {
    EXPECT_FALSE(s.worker.busy(kOpen));
    EXPECT_TRUE(s.result(kOpen).want.empty());
  });
  EXPECT_EQ(s.capture_id, 1u);
  EXPECT_EQ(s.capture, first);

  // Asked again on purpose (File > Open of the same file): it opens once more, then stays.
  s.request_open(kLily);
  ASSERT_TRUE(pump(s, [&] { return s.capture_id == 2; })) << s.load_error;
  EXPECT_NE(s.capture, first) << "the file was opened again";
  settle(s, [&] { EXPECT_FALSE(s.worker.busy(kOpen)); });
  EXPECT_EQ(s.capture_id, 2u);
}

TEST(Open, ABadFileKeepsTheOpenCaptureAndGivesOneMessageNamingIt) {
  AppState s;
  s.request_open(kLily);
  ASSERT_TRUE(pump(s, [&] { return s.capture != nullptr; })) << s.load_error;
  const auto good = s.capture;
  s.settings.selected_query = 100;

  const fs::path bad = fs::temp_directory_path() / "kvscope_open_unit_bad.safetensors";
  {
    std::ofstream f(bad, std::ios::binary);
    f << "this is not a safetensors file";
  }
  for (const std::string& path :
       {bad.string(),
        (fs::temp_directory_path() / "kvscope_open_unit_missing.safetensors").string()}) {
    SCOPED_TRACE(path);
    s.request_open(path);
    ASSERT_TRUE(pump(s, [&] { return !s.open_pending; }));
    const std::string error = s.load_error;
    EXPECT_NE(error.find(fs::path(path).filename().string()), std::string::npos) << error;
    EXPECT_EQ(error.find('\n'), std::string::npos) << error;
    if (path == bad.string()) {  // text, not a length of exabytes
      EXPECT_NE(error.find("not a safetensors file"), std::string::npos) << error;
    }
    EXPECT_EQ(s.capture, good);
    EXPECT_EQ(s.capture_path, kLily);
    EXPECT_EQ(s.capture_id, 1u);
    EXPECT_TRUE(s.loading_path.empty());
    EXPECT_EQ(s.settings.selected_query, 100) << "a failed open changed a setting";
    // Ended: not tried again, and the message stays until dismissed or the next open.
    settle(s, [&] { EXPECT_FALSE(s.worker.busy(kOpen)); });
    EXPECT_EQ(s.load_error, error);
  }
  fs::remove(bad);

  // The next good open clears the message.
  s.request_open(kDragon);
  ASSERT_TRUE(pump(s, [&] { return s.capture_path == kDragon; })) << s.load_error;
  EXPECT_TRUE(s.load_error.empty());
}

TEST(Open, CancellingEndsTheRequestAndKeepsWhatWasOpen) {
  AppState s;
  s.request_open(kLily);
  s.reconcile();
  ASSERT_TRUE(s.result(kOpen).busy());
  s.cancel_job(kOpen);  // the status bar's cancel
  s.reconcile();
  EXPECT_FALSE(s.open_pending) << "the window would say 'opening' for ever";
  EXPECT_TRUE(s.loading_path.empty());
  // The file's checks are not interrupted: the job ends by itself, and is thrown away.
  ASSERT_TRUE(pump(s, [&] { return !s.worker.busy(kOpen); }));
  settle(s, [&] {
    EXPECT_FALSE(s.worker.busy(kOpen));
    EXPECT_FALSE(s.capture) << "a cancelled open was applied";
  });
  EXPECT_TRUE(s.load_error.empty());
}

TEST(Open, AnOpenAskedAfterAnotherFollowsItOpenedOrFailed) {
  // --then-open: the second file is asked for once the first request has ended.
  AppState s;
  s.request_open(kLily);
  s.request_open_after(kDragon);
  EXPECT_EQ(s.open_request.path, kLily);
  EXPECT_FALSE(s.worker.busy());
  ASSERT_TRUE(pump(s, [&] { return s.capture_path == kDragon; })) << s.load_error;
  EXPECT_EQ(s.capture_id, 2u) << "the first file was not opened first";

  // After a failed first open too; nothing pending: at once.
  s.request_open(kLily + ".missing");
  s.request_open_after(kLily);
  ASSERT_TRUE(pump(s, [&] { return s.capture_path == kLily; })) << s.load_error;
  EXPECT_EQ(s.capture_id, 3u);
  EXPECT_TRUE(s.load_error.empty()) << "the second open succeeded: " << s.load_error;
  s.request_open_after(kDragon);
  EXPECT_TRUE(s.open_pending);
  EXPECT_EQ(s.open_request.path, kDragon);
}

TEST(Open, EveryFileOfTheMalformedCorpusThatFailsToOpenIsOneMessageAndKeepsTheCapture) {
  AppState s;
  s.request_open(kLily);
  ASSERT_TRUE(pump(s, [&] { return s.capture != nullptr; })) << s.load_error;
  const fs::path dir = fs::path(KVSCOPE_SOURCE_DIR) / "tests" / "malformed";
  int refused = 0, files = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string ext = e.path().extension().string();
    if (ext != ".safetensors" && ext != ".npz") continue;
    ++files;
    SCOPED_TRACE(e.path().string());
    const auto before = s.capture;
    const uint64_t id = s.capture_id;
    s.request_open(e.path().string());
    ASSERT_TRUE(pump(s, [&] { return !s.open_pending; }));
    if (s.capture_id != id) {  // the damage is in tensor data, read when a layer is asked for
      EXPECT_TRUE(s.load_error.empty()) << s.load_error;
      s.request_open(kLily);
      ASSERT_TRUE(pump(s, [&] { return !s.open_pending; }));
      ASSERT_EQ(s.capture_path, kLily);
      continue;
    }
    ++refused;
    const std::string error = s.load_error;
    EXPECT_NE(error.find(e.path().filename().string()), std::string::npos) << error;
    EXPECT_EQ(error.find('\n'), std::string::npos) << error;
    EXPECT_EQ(s.capture, before);
    EXPECT_EQ(s.capture_path, kLily);
  }
  EXPECT_GT(files, 20) << "the corpus is missing: tests/malformed/make_corpus.py";
  EXPECT_GT(refused, files / 2) << "most of the corpus is refused when opened";
}
