// libFuzzer target: arbitrary bytes as an eval report read back by `kvscope-cli merge`. The bytes
// are parsed under merge's JSON limits, then EvalReport::from_json must succeed or throw
// InputError (a field of the wrong type named, never nlohmann's own exception). An accepted
// report goes through what merge does with it (summary, failures, merge_reports of itself) and
// must read back from its own to_json().
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "engine/core/error.h"
#include "engine/eval/protocol.h"
#include "engine/io/json_limits.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvscope;
  JsonLimits limits;  // cli/eval_output.cpp read_json_file
  limits.max_depth = 32;
  limits.max_values = 1ull << 24;
  nlohmann::json j;
  try {
    const char* text = reinterpret_cast<const char*>(data);
    j = parse_json_limited(text, text + size, limits, "fuzz.json");
  } catch (const InputError&) {
    return 0;
  }
  EvalReport rep;
  try {
    rep = EvalReport::from_json(j);
  } catch (const InputError&) {
    return 0;  // refused with a message: the expected outcome for almost every input
  }
  rep.summary();
  rep.failures();
  try {
    merge_reports({rep});
  } catch (const InputError&) {
  }
  // What this build writes, it reads.
  try {
    EvalReport::from_json(rep.to_json());
  } catch (const InputError& e) {
    std::fprintf(stderr, "an accepted report does not read back from its to_json(): %s\n",
                 e.what());
    std::abort();
  }
  return 0;
}
