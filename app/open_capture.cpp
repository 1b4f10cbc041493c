// Opening a capture, derived by reconcile() from the request (app/open_capture.h): the request is
// the input, the job opens and checks the file, and reconcile() swaps it in once the job is done.
#include "app/open_capture.h"

#include <filesystem>

#include "app/app_state.h"
#include "app/sides_record.h"
#include "engine/eval/capture_set.h"
#include "engine/eval/reference_cache.h"
#include "engine/io/capture.h"

namespace kvscope::app {
namespace fs = std::filesystem;

namespace {

struct NoHandles {};

// Opens the file (header, shapes, dtypes and byte ranges checked; CaptureFile::open throws an
// InputError naming the file and the field).
std::shared_ptr<const OpenedCapture> open_file(const OpenRequest& request, const NoHandles&,
                                               JobContext&, const JobPlan::PartialFn&) {
  auto opened = std::make_shared<OpenedCapture>();
  opened->file = CaptureFile::open(request.path);
  opened->sides_record = sides_record_file(ReferenceCache::global().stats().disk_dir, request.path);
  opened->sides_on_disk = read_sides_record(opened->sides_record);
  return opened;
}

}  // namespace

std::string open_key(const OpenRequest& request) {
  return JobPlan::derived_key(kOpen, request);
}

void AppState::request_open(const std::string& path, bool from_session) {
  if (is_capture_set_path(path)) {
    set_request = path;  // reconcile() opens it (plan_set_open); the frame shows the Set view
    set_error.clear();
    set_shown = false;
    return;
  }
  OpenRequest request;
  request.serial = open_request.serial + 1;
  request.path = path;
  request.from_session = from_session;
  open_request = request;
  open_pending = true;
  loading_path = path;
}

void AppState::request_open_after(const std::string& path) {
  if (open_pending)
    open_next = path;
  else
    request_open(path);
}

JobPlan AppState::plan_open() const {
  JobPlan p;
  if (!open_pending) return p;  // none asked, or done
  p.derive<OpenedCapture>(kOpen, open_request, NoHandles{}, &open_file);
  p.lane = Lane::Focus;
  p.label = "opening " + fs::path(open_request.path).filename().string();
  p.auto_limit_s = 1e30;  // asked for by the user
  return p;
}

void AppState::finish_open() {
  if (!open_pending) return;
  const Result& r = result(kOpen);
  const std::string key = open_key(open_request);
  const std::string path = open_request.path;
  const std::string name = fs::path(path).filename().string();
  if (r.cancelled == key) {  // the status bar's cancel: the current capture stays
    open_pending = false;
    loading_path.clear();
    status_message = "opening " + name + " cancelled";
  } else {
    if (r.busy() || r.partial || r.key != key) return;
    // Done, opened or failed: the request ends here, so it is not run again once the opening
    // has cleared every result (its own too).
    open_pending = false;
    loading_path.clear();
    if (const auto opened = r.ptr<OpenedCapture>(); opened && opened->file) {
      // Results of the previous capture index its tokens: drop them all.
      for (auto& [result_name, res] : results)
        if (!res.running.empty()) worker.cancel(result_name);
      results.clear();
      grid_cells.clear();
      exact_sides_seen.clear();  // keyed by the previous opening's id
      sides_seen_recorded = 0;
      exact_sides_on_disk = opened->sides_on_disk;
      sides_record = opened->sides_record;
      // Notes were about the previous capture (its focus, its window): this one says its own.
      notes.clear();
      capture = opened->file;
      capture_path = path;
      ++capture_id;
      load_error.clear();
      selected_tokens.clear();
      selected_token = -1;
      if (!open_request.from_session) settings.selected_query = -1;
      fit_settings_to_capture(true);
      // A temporary capture that is no longer open (saved or not) is deleted.
      remove_temp_captures(path);
    } else {
      // One message naming the file (the loader's names it and the field); the capture that
      // was open stays open.
      std::string error = r.error.empty() ? "could not be opened" : r.error;
      if (error.find(path) == std::string::npos && error.find(name) == std::string::npos)
        error = path + ": " + error;
      load_error = error;
    }
  }
  if (!open_next.empty()) {  // a scripted second open (--then-open) follows this one
    const std::string next = open_next;
    open_next.clear();
    request_open(next);
  }
}

namespace {

struct SetOpenInput {
  std::string path;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(SetOpenInput, path)

std::shared_ptr<const CaptureSet> open_set_job(const SetOpenInput& in, const NoHandles&,
                                               JobContext& ctx, const JobPlan::PartialFn&) {
  return std::make_shared<CaptureSet>(
      open_capture_set(in.path, [&ctx](int done, int total) { ctx.progress(done, total); }));
}

}  // namespace

JobPlan AppState::plan_set_open() const {
  JobPlan p;
  const std::string& path = set_request.empty() ? set_path : set_request;
  if (path.empty()) return p;
  p.derive<CaptureSet>(kSetOpen, SetOpenInput{path}, NoHandles{}, &open_set_job);
  p.lane = Lane::Analysis;
  p.label = "opening the set " + fs::path(path).filename().string();
  p.auto_limit_s = 1e30;  // asked for by the user; it reads each capture's header only
  return p;
}

void AppState::finish_set_open() {
  if (set_request.empty()) return;
  const Result& r = result(kSetOpen);
  if (r.key != JobPlan::derived_key(kSetOpen, SetOpenInput{set_request}) || r.partial) return;
  if (r.error.empty() && r.value) {
    set_path = set_request;
  } else {
    const std::string error = r.error.empty() ? "could not be opened" : r.error;
    set_error = error.find(set_request) == std::string::npos ? set_request + ": " + error : error;
  }
  set_request.clear();  // a failed request: the set open (if any) is planned and shown again
}

void AppState::record_exact_sides() {
  if (sides_record.empty() || exact_sides_seen.size() == sides_seen_recorded) return;
  std::set<std::string> all = exact_sides_on_disk;
  const std::string ours = std::to_string(capture_id) + '|';  // not a late cell of the last one
  for (const std::string& id : exact_sides_seen)
    if (id.rfind(ours, 0) == 0) all.insert(id.substr(ours.size()));
  if (sides_writer.write(sides_record, all)) sides_seen_recorded = exact_sides_seen.size();
}

}  // namespace kvscope::app
