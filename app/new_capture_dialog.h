// File > New capture: run a llama2.c checkpoint on a typed prompt (the request the dialog sets is
// run by reconcile() on a worker lane, with progress and cancel; app/new_capture.h), open the
// capture it makes, and save it as safetensors. Also the list of
// bundled llama2.c models, shared with the Output view.
#pragma once

#include <string>
#include <vector>

#include "app/new_capture.h"

namespace kvscope::app {

// A llama2.c checkpoint with the tokenizer whose vocabulary matches it.
struct BundledModel {
  std::string name;        // file stem, e.g. "kjv3M"
  std::string checkpoint;  // path
  std::string tokenizer;   // path, "" when no tokenizer in the folder matches
  std::string summary;     // "4 layers, 4 q / 2 kv heads, head dim 64, vocab 1024, context 512"
};

// The models folder: $KVSCOPE_MODELS, else ../shared/models from the working directory, else
// next to the source tree. "" when none exists.
std::string models_dir();
// Checkpoints (*.bin that are not tokenizers) in models_dir(), by name; scanned once.
const std::vector<BundledModel>& bundled_models();
// The bundled model of that name (e.g. a capture's "model" metadata), nullptr when none.
const BundledModel* find_bundled_model(const std::string& name);

// The File menu calls open; the frame calls draw every frame (it draws nothing when closed).
void open_new_capture_dialog();
void close_new_capture_dialog();
void draw_new_capture_dialog(AppState& s);

// What the dialog's Run button does, for scripts and tests: shows `settings` in the dialog and
// asks for the capture (ask_new_capture, app/new_capture.h). reconcile() runs it on the Analysis
// lane (result kNewCapture); when it finishes the capture is written to a temporary safetensors
// file and opened.
void start_new_capture(AppState& s, const NewCaptureSettings& settings);

// The last capture made (nullptr before the first).
const NewCaptureResult* last_new_capture(const AppState& s);
// Copies the last capture to `path` (must end in .safetensors and not exist yet); when that
// capture is the open one, `path` becomes its path (AppState::capture_saved_as). The temporary
// file stays the app's (AppState::temp_captures) and is deleted later. Throws InputError naming
// the path and the problem.
void save_new_capture(AppState& s, const std::string& path);

}  // namespace kvscope::app
