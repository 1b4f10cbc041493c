// A capture set: captures of one model over many prompts, the unit of evidence across prompts
// (docs/evaluation.md, "Capture sets"). A set is a manifest (manifest.jsonl: one JSON object per
// line, {"path": ..., "label": ..., "prompt": ...}, paths relative to the manifest, only "path"
// required) or a folder (its *.safetensors, sorted by name).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "engine/io/capture.h"

namespace kvscope {

struct CaptureSetEntry {
  std::string path;      // as the manifest lists it (a folder's entries: the file name)
  std::string resolved;  // the file opened: `path` relative to the manifest's folder
  std::string label;     // the manifest's label, else the file name without its extension
  std::string prompt;    // the manifest's prompt, else the capture's own (may be "")
  int num_tokens = 0;    // n of this capture (token counts may differ across a set)
};

struct CaptureSet {
  std::string source;  // the manifest or folder as given
  std::vector<CaptureSetEntry> entries;
  // The shapes every entry shares (the first entry's info: layers, heads, head and value dims,
  // model); num_tokens is the first entry's.
  CaptureInfo shape;
};

// True when `path` names a set rather than one capture: a folder, or a file ending in .jsonl.
bool is_capture_set_path(const std::string& path);

// Called after each entry is checked (done, total).
using SetProgressFn = std::function<void(int done, int total)>;

// Opens a manifest or folder. Every entry's header is read (no tensor is loaded), its shapes
// compared with the first entry's, and its bytes hashed to find the same capture listed twice.
// Throws InputError naming the manifest line or the file and what is wrong: a line that is not a
// JSON object or lacks "path", a missing or unreadable file, a file that is not a capture, a
// capture of another model or shape, the same capture twice (by content), an empty set.
CaptureSet open_capture_set(const std::string& path, const SetProgressFn& progress = {});

// The manifest.jsonl text of `entries` (one object per line: path, label, prompt when set).
std::string manifest_text(const std::vector<CaptureSetEntry>& entries);

}  // namespace kvscope
