// Opening a capture (docs/app.md, "How work flows in the app"): File > Open, Open recent,
// sessions, a dropped file, the command line and a New capture's result only set the request
// (AppState::request_open); reconcile() derives the kOpen job from it (AppState::plan_open,
// app/open_capture.cpp) like every other job and, once the job is done, swaps in the capture it
// opened or says why it could not (AppState::finish_open).
#pragma once

#include <cstdint>
#include <memory>
#include <set>
#include <nlohmann/json.hpp>
#include <string>

namespace kvscope {
class CaptureFile;
}

namespace kvscope::app {

struct AppState;

// The name of the result (and its worker job key).
inline constexpr const char* kOpen = "open";

// One request to open a file: the input of the kOpen job (its key is derived from all of it).
struct OpenRequest {
  uint64_t serial = 0;  // counts requests (0: none yet), so the same file can be opened twice
  std::string path;
  bool from_session = false;  // a session's open keeps the selected query
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(OpenRequest, serial, path, from_session)

// The kOpen job's value: the opened file (not yet the app's capture until finish_open).
struct OpenedCapture {
  std::shared_ptr<CaptureFile> file;
  // The record of its exact sides in the reference cache's disk tier, and what it holds
  // (app/sides_record.h): read here, off the UI thread.
  std::string sides_record;
  std::set<std::string> sides_on_disk;
};

// The key of a request's result (JobPlan::derive's).
std::string open_key(const OpenRequest& request);

}  // namespace kvscope::app
