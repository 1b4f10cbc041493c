// libFuzzer target: arbitrary bytes as a session file (File > Open session, kvscope --session,
// kvscope-cli render --session). The bytes are parsed under the JSON limits the app reads
// sessions with, then the whole session is checked as AppUi::load_session does before it
// changes anything: AppState::parse_session (every setting) and every view's load_state on fresh
// views (AppUi::check_session). It must succeed or throw InputError naming a field, never crash.
// An accepted session must check again once written back: the settings through to_session(),
// each view's state through load_state then save_state.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "app/app_frame.h"
#include "app/app_state.h"
#include "app/views/view.h"
#include "engine/core/error.h"
#include "engine/io/json_limits.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvscope;
  using namespace kvscope::app;
  // One window state for the whole run (an AppState owns worker threads); nothing is applied to
  // it, so every input sees the same state.
  static AppState* state = new AppState();
  static AppUi* ui = new AppUi(*state);
  static AppState* echo = new AppState();
  nlohmann::json j;
  try {
    const char* text = reinterpret_cast<const char*>(data);
    j = parse_json_limited(text, text + size, JsonLimits{}, "fuzz.json");
  } catch (const InputError&) {
    return 0;
  }
  std::string capture;
  try {
    ui->check_session(j);
    echo->settings = state->parse_session(j, &capture);
  } catch (const InputError&) {
    return 0;  // refused with a message: the expected outcome for almost every input
  }
  // Accepted: written back the way AppUi::save_session writes it, it must be accepted again.
  echo->capture_path = state->capture_path;  // the file check is the same as for `capture`
  nlohmann::json again = echo->to_session();
  again["capture"] = capture;
  if (j.contains("views")) {
    const std::vector<std::unique_ptr<View>> views = make_views();
    for (const auto& v : views)
      if (j["views"].contains(v->name())) {
        v->load_state(j["views"][v->name()]);
        const nlohmann::json st = v->save_state();
        if (!st.is_null()) again["views"][v->name()] = st;
      }
  }
  try {
    ui->check_session(again);
    if (!(state->parse_session(again, nullptr) == echo->settings)) {
      std::fprintf(stderr, "an accepted session reads back with other settings\n");
      std::abort();
    }
  } catch (const InputError& e) {
    std::fprintf(stderr, "an accepted session is refused once written back: %s\n", e.what());
    std::abort();
  }
  return 0;
}
