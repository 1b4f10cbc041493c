// File > New capture's job, derived by reconcile() from the request the dialog sets
// (app/new_capture.h): the request is the input, the job writes the capture to the request's
// temporary file, and reconcile() opens it once the job is done.
#include "app/new_capture.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>

#include "app/app_state.h"
#include "engine/io/capture.h"
#include "engine/model/llama2c.h"

namespace kvscope::app {
namespace fs = std::filesystem;

namespace {

struct NoHandles {};

// Runs the checkpoint on the prompt (progress per position, cancellable between positions) and
// writes the capture to request.out.
std::shared_ptr<const NewCaptureResult> make_new_capture(const NewCaptureRequest& request,
                                                         const NoHandles&, JobContext& ctx,
                                                         const JobPlan::PartialFn&) {
  const NewCaptureSettings& settings = request.settings;
  const auto t0 = std::chrono::steady_clock::now();
  llama2c::Transformer model(settings.checkpoint);
  llama2c::Tokenizer tokenizer(settings.tokenizer, model.config().vocab_size);
  llama2c::GenerateOptions options;
  options.steps = settings.steps;
  options.temperature = settings.temperature;
  options.topp = settings.topp;
  options.seed = settings.seed;
  options.cancel = ctx.cancel_flag();
  options.on_token = [&](int pos, int, const std::string&) {
    ctx.progress(pos + 1, settings.steps);
  };
  const llama2c::Generation g = llama2c::generate(model, tokenizer, settings.prompt, options);
  const std::string name = llama2c::model_name_from_path(settings.checkpoint);
  CaptureData data = llama2c::make_capture(
      model, g, name, settings.prompt, "KVScope app, File > New capture (llama2.c forward pass)");
  char sampling[160];
  if (settings.temperature == 0.0f)
    std::snprintf(sampling, sizeof sampling, "greedy (temperature 0)");
  else
    std::snprintf(sampling, sizeof sampling, "temperature %g, top-p %g, seed %llu (Philox)",
                  settings.temperature, settings.topp,
                  static_cast<unsigned long long>(settings.seed));
  data.info.metadata["sampling"] = sampling;
  data.info.metadata["steps"] = std::to_string(settings.steps);
  data.info.metadata["bos_restarts"] = std::to_string(g.restarts);
  ctx.check_cancel();
  write_capture(request.out, data, DType::F32);
  auto r = std::make_shared<NewCaptureResult>();
  r->path = request.out;
  r->model = name;
  r->prompt = settings.prompt;
  r->text = g.decoded;
  r->tokens = static_cast<int>(g.tokens.size());
  r->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace

std::string new_capture_key(const NewCaptureRequest& request) {
  return JobPlan::derived_key(kNewCapture, request);
}

void ask_new_capture(AppState& s, const NewCaptureSettings& settings) {
  static int files = 0;  // one temporary file per request of the process (UI thread only)
  NewCaptureRequest request;
  request.serial = s.new_capture.serial + 1;
  request.settings = settings;
  request.out = (fs::temp_directory_path() / ("kvscope_new_capture_" + std::to_string(::getpid()) +
                                              "_" + std::to_string(++files) + ".safetensors"))
                    .string();
  s.new_capture = request;
  s.new_capture_pending = true;
}

void cancel_new_capture(AppState& s) {
  if (s.new_capture_pending) s.new_capture_discard = s.new_capture.out;
  s.new_capture_pending = false;
}

std::string new_capture_error(const AppState& s) {
  const Result& r = s.result(kNewCapture);
  return !s.new_capture_pending && r.key == new_capture_key(s.new_capture) ? r.error : "";
}

JobPlan AppState::plan_new_capture() const {
  JobPlan p;
  if (!new_capture_pending) return p;  // none asked, or done
  p.derive<NewCaptureResult>(kNewCapture, new_capture, NoHandles{}, &make_new_capture);
  p.lane = Lane::Analysis;
  p.label = "new capture";
  p.auto_limit_s = 1e30;  // asked for by a Run click
  return p;
}

void AppState::finish_new_capture() {
  // A cancelled request's job has ended: a capture it wrote just before the cancel reached it
  // (the last positions can run faster than a click) is not wanted.
  if (!new_capture_discard.empty() && !worker.busy(kNewCapture)) {
    std::error_code ec;
    fs::remove(new_capture_discard, ec);
    new_capture_discard.clear();
  }
  if (!new_capture_pending) return;
  const Result& r = result(kNewCapture);
  const std::string key = new_capture_key(new_capture);
  if (r.cancelled == key) {  // the status bar's cancel (cancel_job) stops it too
    new_capture_pending = false;
    new_capture_discard = new_capture.out;
    return;
  }
  if (r.busy() || r.partial || r.key != key) return;
  // Done, made or failed (the error stays in the result, new_capture_error): not run again, also
  // once the capture's opening clears every result.
  new_capture_pending = false;
  const auto made = r.ptr<NewCaptureResult>();
  if (!made) return;
  new_capture_made = made;
  temp_captures.insert(made->path);  // deleted on exit or when another capture opens
  request_open(made->path);
  char msg[200];
  std::snprintf(msg, sizeof msg, "new capture: %d tokens of %s in %.1f s (not saved yet)",
                made->tokens, made->model.c_str(), made->seconds);
  status_message = msg;
}

}  // namespace kvscope::app
