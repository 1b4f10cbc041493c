// JSON from files parsed under limits: nesting depth, number of values, and duplicate object keys.
// nlohmann's parser itself is iterative, but a deeply nested document overflows the stack later
// (dump, copies, recursive walks), a small text can expand to a large DOM (a 100 MB array of
// zeros takes 2 GB), and duplicate keys are silently resolved to the last one. The limits are
// enforced by a parser callback while parsing, so nothing beyond them is ever built.
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace kvscope {

struct JsonLimits {
  int max_depth = 64;                // nested objects/arrays; the root is depth 1
  uint64_t max_values = 1ull << 22;  // every value (containers, keys excluded) counts once
  bool reject_duplicate_keys = true;
};

// Parses [begin, end) as JSON under `limits`. Throws InputError starting with `what` that names
// the limit that was hit ("nesting deeper than 64 levels", "more than N values",
// "duplicate key \"k\"") or the syntax error.
nlohmann::json parse_json_limited(const char* begin, const char* end, const JsonLimits& limits,
                                  const std::string& what);
inline nlohmann::json parse_json_limited(const std::string& text, const JsonLimits& limits,
                                         const std::string& what) {
  return parse_json_limited(text.data(), text.data() + text.size(), limits, what);
}

// Reads and parses a JSON file of at most `max_bytes` bytes (a regular file; FIFOs and devices
// are refused). Throws InputError naming the path.
nlohmann::json read_json_file_limited(const std::string& path, uint64_t max_bytes,
                                      const JsonLimits& limits);

}  // namespace kvscope
