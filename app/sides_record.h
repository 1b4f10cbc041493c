// The exact sides of a capture that the reference cache's disk tier holds, as this app last saw
// them (docs/app.md, "Estimates"). Reopening a capture reads its exact sides from disk instead of
// building them again (engine/eval/reference_cache.h), so a grid's first estimate must not cost
// them as builds: it said 25 s for a 13 s grid on a reopened 8192-token capture. The disk files
// are named by a hash of the tensors' bytes, which the app does not read to plan; so the app
// keeps its own record per capture file beside them: a text file named by a hash of the file's
// path, size and modification time (an edited capture gets a new record), one side per line as
// "sink|eval|layer|kv_head". The tier evicts its oldest files without telling the record: a side
// evicted since makes the first estimate low by one build, which the grid's own pace corrects
// from its first cells (app/grid_pace.h).
#pragma once

#include <future>
#include <set>
#include <string>

namespace kvscope::app {

// The record of `capture_path` in the disk tier's folder `disk_dir`: "" when either is "" or the
// capture cannot be stat'ed.
std::string sides_record_file(const std::string& disk_dir, const std::string& capture_path);

// Its sides ("sink|eval|layer|kv_head"); none when the file is missing or unreadable. Lines that
// are not four integers joined by '|' are skipped (a torn or foreign file costs an estimate, not
// a failure).
std::set<std::string> read_sides_record(const std::string& file);

// Writes the record in the background, one write at a time (write_file_atomic): the UI thread
// never waits for the disk. Returns false, writing nothing, while a write is in flight (call
// again later); true once these sides are written or being written (or were already).
class SidesRecordWriter {
 public:
  ~SidesRecordWriter();  // waits for the write in flight
  bool write(const std::string& file, const std::set<std::string>& sides);

 private:
  std::future<void> inflight_;
  std::string last_file_;
  size_t last_count_ = 0;
};

}  // namespace kvscope::app
