// Checks shared by the kvscope-cli commands: numeric flag ranges (the limits are in the message),
// index lists bounded by the capture before anything is allocated, shard specs, memory estimates
// against what the machine (and `ulimit -v`) allows, and text from files made safe to print.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "engine/core/printable.h"  // printable(): text from files made safe to print

namespace kvscope::cli {

// Throws InputError "FLAG VALUE: must be between LO and HI" unless lo <= value <= hi.
void check_range(long long value, long long lo, long long hi, const std::string& flag);
void check_range_real(double value, double lo, double hi, const std::string& flag);

// `text` cut at every `sep`, empty pieces kept ("a,,b" -> "a", "", "b").
std::vector<std::string> split(const std::string& text, char sep);

// "0,2,5-7" -> {0, 2, 5, 6, 7}, every index < `count` (the capture's layers or kv heads; `what`
// is "layer" or "kv head" in the message), checked before the list is expanded; duplicates are
// refused.
std::vector<int> parse_bounded_index_list(const std::string& text, const std::string& flag,
                                          int count, const std::string& what);

// --budget "512,1024": whole numbers of tokens in [0, max_tokens], at most 64 of them; `unit`
// names what a budget counts in the message ("tokens", "cache entries"). Refused together with
// --ratios (`ratios_given`). Whether a budget fits the capture is the engine's check.
std::vector<int> parse_budget_list(const std::string& text, bool ratios_given, long long max_tokens,
                                   const std::string& unit);

// "i/N" with 0 <= i < N <= max_count; the message quotes the text and the limits.
std::pair<int, int> parse_shard(const std::string& text, int max_count);
// --shard auto: the shard of an array job from its environment: Slurm (SLURM_ARRAY_TASK_ID minus
// SLURM_ARRAY_TASK_MIN, of SLURM_ARRAY_TASK_COUNT), a Kubernetes indexed job
// (JOB_COMPLETION_INDEX of KVSCOPE_SHARD_COUNT), or KVSCOPE_SHARD_INDEX of KVSCOPE_SHARD_COUNT.
// Throws InputError naming the variables when none is set or they name no shard.
std::pair<int, int> shard_from_environment(int max_count);

// Bytes this process may still allocate: MemAvailable from /proc/meminfo, lowered to the
// address-space limit (ulimit -v) when one is set. `source` says which one bounded it.
uint64_t available_memory_bytes(std::string* source = nullptr);
// Throws InputError "WHAT needs about X GiB of memory (DETAIL) but only Y GiB is available
// (SOURCE)" when `bytes` exceeds what is available.
void require_memory(double bytes, const std::string& what, const std::string& detail);
std::string gib(double bytes);

}  // namespace kvscope::cli
