// File > New capture's request and result (docs/app.md): a llama2.c checkpoint run on a prompt,
// its capture written to a temporary file and opened. The dialog (app/new_capture_dialog.h) only
// sets the request (AppState::new_capture); reconcile() derives the kNewCapture job from it
// (AppState::plan_new_capture, app/new_capture.cpp) like every other job, and once the job is
// done opens the capture it made (AppState::finish_new_capture).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace kvscope::app {

struct AppState;

// The name of the result (and its worker job key).
inline constexpr const char* kNewCapture = "newcapture";

// What the dialog's fields ask for.
struct NewCaptureSettings {
  std::string checkpoint, tokenizer, prompt;
  int steps = 256;
  float temperature = 0.8f;
  float topp = 0.9f;
  uint64_t seed = 0;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(NewCaptureSettings, checkpoint, tokenizer, prompt, steps,
                                   temperature, topp, seed)

// One Run click: the input of the kNewCapture job (its key is derived from all of it).
struct NewCaptureRequest {
  uint64_t serial = 0;  // counts Run clicks (0: none yet), so the same settings run twice
  NewCaptureSettings settings;
  std::string out;  // the temporary file the capture is written to
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(NewCaptureRequest, serial, settings, out)

// The kNewCapture job's value.
struct NewCaptureResult {
  std::string path;  // the temporary capture that was opened
  std::string model, prompt, text;
  int tokens = 0;
  double seconds = 0;
};

// The key of a request's result (JobPlan::derive's).
std::string new_capture_key(const NewCaptureRequest& request);
// Asks for a capture (what the dialog's Run does): a new request with its own temporary file,
// pending until reconcile() has made it, it failed, or it was cancelled.
void ask_new_capture(AppState& s, const NewCaptureSettings& settings);
// Cancels the pending request (what the dialog's Cancel does): a change of the request, so
// reconcile() cancels its job. Nothing opens.
void cancel_new_capture(AppState& s);
// Why the last request failed ("" when it did not, or has not finished).
std::string new_capture_error(const AppState& s);

}  // namespace kvscope::app
