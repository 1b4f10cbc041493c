// Capture sets (engine/eval/capture_set.h, docs/evaluation.md "Capture sets").
#include "engine/eval/capture_set.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "engine/core/error.h"
#include "engine/eval/reference_cache.h"
#include "engine/io/mapped_file.h"

namespace kvscope {
namespace fs = std::filesystem;

namespace {

constexpr size_t kMaxManifestLine = 1 << 20;  // a prompt of a million bytes is not a prompt
constexpr int kMaxSetEntries = 100000;

std::string file_stem(const std::string& path) {
  return fs::path(path).stem().string();
}

// The shapes a set's captures must share, in words, or "" when `b` matches `a`.
std::string shape_mismatch(const CaptureInfo& a, const CaptureInfo& b) {
  auto differs = [](const char* what, long long x, long long y) {
    return std::string(what) + " " + std::to_string(y) + " where the set's first capture has " +
           std::to_string(x);
  };
  if (!a.model.empty() && !b.model.empty() && a.model != b.model)
    return "model '" + b.model + "' where the set's first capture has '" + a.model + "'";
  if (a.num_layers != b.num_layers) return differs("layers", a.num_layers, b.num_layers);
  if (a.q_heads != b.q_heads) return differs("query heads", a.q_heads, b.q_heads);
  if (a.kv_heads != b.kv_heads) return differs("kv heads", a.kv_heads, b.kv_heads);
  if (a.head_dim != b.head_dim) return differs("head dim", a.head_dim, b.head_dim);
  if (a.value_dim != b.value_dim) return differs("value dim", a.value_dim, b.value_dim);
  if (a.has_queries != b.has_queries)
    return std::string(b.has_queries ? "queries" : "no queries") +
           " where the set's first capture has " + (a.has_queries ? "them" : "none");
  if (a.has_output_projection != b.has_output_projection)
    return std::string(b.has_output_projection ? "W_O" : "no W_O") +
           " where the set's first capture has " + (a.has_output_projection ? "it" : "none");
  return "";
}

std::vector<CaptureSetEntry> read_manifest(const std::string& manifest) {
  std::ifstream in(manifest, std::ios::binary);
  if (!in) throw InputError(manifest + ": cannot open the manifest");
  const fs::path folder = fs::path(manifest).parent_path();
  std::vector<CaptureSetEntry> entries;
  std::string line;
  int number = 0;
  while (std::getline(in, line)) {
    ++number;
    const std::string where = manifest + " line " + std::to_string(number);
    if (line.size() > kMaxManifestLine)
      throw InputError(where + ": longer than " + std::to_string(kMaxManifestLine) + " bytes");
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;  // blank lines are allowed
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      throw InputError(where + ": not JSON (" + e.what() + ")");
    }
    if (!j.is_object()) throw InputError(where + ": expected a JSON object {\"path\": ...}");
    const auto path = j.find("path");
    if (path == j.end() || !path->is_string() || path->get<std::string>().empty())
      throw InputError(where + ": no \"path\" (the capture's file, relative to the manifest)");
    for (const char* key : {"label", "prompt"}) {
      const auto it = j.find(key);
      if (it != j.end() && !it->is_string())
        throw InputError(where + ": \"" + key + "\" is not a string");
    }
    CaptureSetEntry e;
    e.path = path->get<std::string>();
    const fs::path p(e.path);
    e.resolved = (p.is_absolute() ? p : folder / p).lexically_normal().string();
    e.label = j.value("label", file_stem(e.path));
    e.prompt = j.value("prompt", std::string());
    entries.push_back(std::move(e));
    if (static_cast<int>(entries.size()) > kMaxSetEntries)
      throw InputError(manifest + ": more than " + std::to_string(kMaxSetEntries) + " entries");
  }
  if (in.bad()) throw InputError(manifest + ": read failed");
  return entries;
}

std::vector<CaptureSetEntry> read_folder(const std::string& folder) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const fs::directory_entry& d : fs::directory_iterator(folder, ec))
    if (d.path().extension() == ".safetensors") names.push_back(d.path().filename().string());
  if (ec) throw InputError(folder + ": cannot list the folder (" + ec.message() + ")");
  std::sort(names.begin(), names.end());
  std::vector<CaptureSetEntry> entries;
  for (const std::string& name : names) {
    CaptureSetEntry e;
    e.path = name;
    e.resolved = (fs::path(folder) / name).string();
    e.label = file_stem(name);
    entries.push_back(std::move(e));
  }
  return entries;
}

constexpr size_t kQuickBytes = 1 << 20;

// The size and a hash of the first and last MiB: equal for byte-identical files.
uint64_t quick_key(const MappedFile& f) {
  const size_t head = std::min(f.size(), kQuickBytes);
  const size_t tail_at = f.size() - std::min(f.size() - head, kQuickBytes);
  const std::vector<uint8_t> first = f.bytes(0, head), last = f.bytes(tail_at, f.size() - tail_at);
  return content_hash(first.data(), first.size(), f.size()) ^
         (content_hash(last.data(), last.size(), 1) * 0x9E3779B97F4A7C15ull);
}

bool same_bytes(const MappedFile& a, const MappedFile& b) {
  if (a.size() != b.size()) return false;
  constexpr size_t kChunk = 16 << 20;
  for (size_t at = 0; at < a.size(); at += kChunk) {
    const size_t n = std::min(kChunk, a.size() - at);
    if (a.bytes(at, n) != b.bytes(at, n)) return false;
  }
  return true;
}

}  // namespace

bool is_capture_set_path(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) return true;
  return fs::path(path).extension() == ".jsonl";
}

CaptureSet open_capture_set(const std::string& path, const SetProgressFn& progress) {
  std::error_code ec;
  CaptureSet set;
  set.source = path;
  if (fs::is_directory(path, ec)) {
    set.entries = read_folder(path);
    if (set.entries.empty()) throw InputError(path + ": the folder holds no *.safetensors capture");
  } else {
    if (!fs::exists(path, ec)) throw InputError(path + ": no such manifest");
    set.entries = read_manifest(path);
    if (set.entries.empty()) throw InputError(path + ": the manifest lists no capture");
  }
  std::map<uint64_t, std::vector<size_t>> seen;  // quick_key -> the entries with it
  for (size_t i = 0; i < set.entries.size(); ++i) {
    CaptureSetEntry& e = set.entries[i];
    const std::string who =
        "capture set " + path + ", entry " + std::to_string(i + 1) + " (" + e.path + ")";
    if (!fs::is_regular_file(e.resolved, ec))
      throw InputError(who + ": " +
                       (fs::exists(e.resolved, ec) ? "not a regular file" : "no such file") +
                       " at " + e.resolved);
    CaptureInfo info;
    try {
      info = CaptureFile::open(e.resolved)->info();  // the header only; tensors load lazily
    } catch (const InputError& err) {
      throw InputError(who + ": " + err.what());
    }
    if (i == 0) {
      set.shape = info;
    } else if (const std::string why = shape_mismatch(set.shape, info); !why.empty()) {
      throw InputError(who + ": " + why + " (a set holds captures of one model and shape)");
    }
    if (e.prompt.empty()) e.prompt = info.prompt;
    e.num_tokens = info.num_tokens;
    // Duplicates by content without reading every tensor: files are compared byte for byte only
    // when their sizes and first and last bytes (the header with its shapes, prompt and tokens)
    // agree, so opening a set of hundreds of large captures reads two MiB of each.
    const std::shared_ptr<const MappedFile> bytes = MappedFile::open(e.resolved);
    std::vector<size_t>& alike = seen[quick_key(*bytes)];
    for (size_t j : alike) {
      const CaptureSetEntry& first = set.entries[j];
      if (same_bytes(*bytes, *MappedFile::open(first.resolved)))
        throw InputError(who + ": the same capture as entry " + std::to_string(j + 1) + " (" +
                         first.path + "), byte for byte; a set lists each capture once");
    }
    alike.push_back(i);
    if (progress) progress(static_cast<int>(i + 1), static_cast<int>(set.entries.size()));
  }
  return set;
}

std::string manifest_text(const std::vector<CaptureSetEntry>& entries) {
  std::string out;
  for (const CaptureSetEntry& e : entries) {
    nlohmann::json j = {{"path", e.path}, {"label", e.label}};
    if (!e.prompt.empty()) j["prompt"] = e.prompt;
    out += j.dump() + "\n";
  }
  return out;
}

}  // namespace kvscope
