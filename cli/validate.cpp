#include "cli/validate.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>

#include "engine/core/error.h"

namespace kvscope::cli {

void check_range(long long value, long long lo, long long hi, const std::string& flag) {
  if (value < lo || value > hi)
    throw InputError(flag + " " + std::to_string(value) + ": must be between " +
                     std::to_string(lo) + " and " + std::to_string(hi));
}

void check_range_real(double value, double lo, double hi, const std::string& flag) {
  if (!(value >= lo && value <= hi)) {
    char buf[128];
    std::snprintf(buf, sizeof buf, " %g: must be between %g and %g", value, lo, hi);
    throw InputError(flag + buf);
  }
}

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    const size_t p = text.find(sep, start);
    out.push_back(text.substr(start, p == std::string::npos ? std::string::npos : p - start));
    if (p == std::string::npos) return out;
    start = p + 1;
  }
}

namespace {

// A whole non-negative decimal integer, or -1 (also for values beyond 2^31).
long long to_index(const std::string& s) {
  if (s.empty() || s.size() > 10) return -1;
  long long v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return -1;
    v = v * 10 + (c - '0');
  }
  return v;
}

}  // namespace

std::vector<int> parse_budget_list(const std::string& text, bool ratios_given, long long max_tokens,
                                   const std::string& unit) {
  if (ratios_given) throw InputError("--budget: give --ratios or --budget, not both");
  std::vector<int> budgets;
  for (const std::string& item : split(text, ',')) {
    size_t used = 0;
    long long b = -1;
    try {
      b = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (item.empty() || used != item.size() || b < 0 || b > max_tokens)
      throw InputError("--budget: '" + printable(item) + "' is not a whole number of " + unit +
                       " (in '" + printable(text) + "')");
    budgets.push_back(static_cast<int>(b));
  }
  if (budgets.size() > 64)
    throw InputError("--budget: " + std::to_string(budgets.size()) + " budgets given, at most 64");
  return budgets;
}

std::vector<int> parse_bounded_index_list(const std::string& text, const std::string& flag,
                                          int count, const std::string& what) {
  const std::string shown = printable(text.size() > 60 ? text.substr(0, 60) + "..." : text);
  const std::vector<std::string> items = split(text, ',');
  if (items.size() > static_cast<size_t>(count))
    throw InputError(flag + " '" + shown + "': lists " + std::to_string(items.size()) +
                     " items but there are only " + std::to_string(count) + " " + what);
  std::vector<int> out;
  std::set<int> seen;
  for (const std::string& item : items) {
    const size_t dash = item.find('-');
    const std::string a_text = item.substr(0, dash);
    const std::string b_text = dash == std::string::npos ? a_text : item.substr(dash + 1);
    const long long a = to_index(a_text), b = to_index(b_text);
    if (a < 0 || b < 0)
      throw InputError(flag + " '" + shown + "': '" + printable(item) +
                       "' is not an index or a range a-b of non-negative integers");
    if (b < a) throw InputError(flag + " '" + shown + "': range '" + item + "' runs backwards");
    if (b >= count)
      throw InputError(flag + ": " + what + " " + std::to_string(std::max<long long>(a, count)) +
                       " out of range: the capture has " + what + "s 0.." +
                       std::to_string(count - 1) + " (in '" + shown + "')");
    for (long long v = a; v <= b; ++v) {
      if (!seen.insert(static_cast<int>(v)).second)
        throw InputError(flag + " '" + shown + "': " + std::to_string(v) + " is given twice");
      out.push_back(static_cast<int>(v));
    }
  }
  return out;
}

std::pair<int, int> parse_shard(const std::string& text, int max_count) {
  if (text == "auto") return shard_from_environment(max_count);
  const std::string shown = printable(text);
  const std::string usage = "--shard '" + shown +
                            "': expected i/N with 0 <= i < N <= " + std::to_string(max_count) +
                            " (e.g. 0/4)";
  const size_t slash = text.find('/');
  if (slash == std::string::npos || text.find('/', slash + 1) != std::string::npos)
    throw InputError(usage);
  const long long i = to_index(text.substr(0, slash)), n = to_index(text.substr(slash + 1));
  if (i < 0 || n < 0) throw InputError(usage);
  if (n < 1 || n > max_count || i >= n) throw InputError(usage);
  return {static_cast<int>(i), static_cast<int>(n)};
}

std::pair<int, int> shard_from_environment(int max_count) {
  const auto env = [](const char* name) -> long long {
    const char* v = std::getenv(name);
    return v && *v ? to_index(v) : -2;  // -2: not set; to_index gives -1 for a non-number
  };
  const auto check = [&](long long i, long long n, const std::string& from) {
    if (i < 0 || n < 1 || n > max_count || i >= n)
      throw InputError("--shard auto: " + from + " do not name a shard (index " +
                       std::to_string(i) + " of " + std::to_string(n) + "; expected 0 <= index < " +
                       "count <= " + std::to_string(max_count) + ")");
    return std::pair<int, int>{static_cast<int>(i), static_cast<int>(n)};
  };
  // Slurm job arrays: the task's id, counted from the array's first id (--array=1-8 starts at 1).
  if (const long long id = env("SLURM_ARRAY_TASK_ID"); id != -2) {
    const long long first = env("SLURM_ARRAY_TASK_MIN"), count = env("SLURM_ARRAY_TASK_COUNT");
    if (first == -2 || count == -2)
      throw InputError(
          "--shard auto: SLURM_ARRAY_TASK_ID is set but SLURM_ARRAY_TASK_MIN or "
          "SLURM_ARRAY_TASK_COUNT is not (Slurm sets all three for an array task)");
    return check(id - first, count, "SLURM_ARRAY_TASK_ID, _MIN and _COUNT");
  }
  // Kubernetes indexed jobs set the index; the count is the job's completions, which the pod
  // does not see unless the job passes it (docs/evaluation.md: KVSCOPE_SHARD_COUNT).
  if (const long long index = env("JOB_COMPLETION_INDEX"); index != -2) {
    const long long count = env("KVSCOPE_SHARD_COUNT");
    if (count == -2)
      throw InputError(
          "--shard auto: JOB_COMPLETION_INDEX is set but KVSCOPE_SHARD_COUNT is not "
          "(set it to the indexed job's completions)");
    return check(index, count, "JOB_COMPLETION_INDEX and KVSCOPE_SHARD_COUNT");
  }
  if (const long long index = env("KVSCOPE_SHARD_INDEX"); index != -2)
    return check(index, env("KVSCOPE_SHARD_COUNT"), "KVSCOPE_SHARD_INDEX and KVSCOPE_SHARD_COUNT");
  throw InputError(
      "--shard auto: no array index in the environment (Slurm's "
      "SLURM_ARRAY_TASK_ID, Kubernetes' JOB_COMPLETION_INDEX, or "
      "KVSCOPE_SHARD_INDEX with KVSCOPE_SHARD_COUNT)");
}

uint64_t available_memory_bytes(std::string* source) {
  uint64_t available = 0;
  std::string from;
  std::ifstream meminfo("/proc/meminfo");
  std::string line;
  while (std::getline(meminfo, line)) {
    unsigned long long kib = 0;
    if (std::sscanf(line.c_str(), "MemAvailable: %llu kB", &kib) == 1) {
      available = kib * 1024ull;
      from = "MemAvailable";
      break;
    }
  }
  if (available == 0) {
    const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0) {
      available = static_cast<uint64_t>(pages) * static_cast<uint64_t>(page);
      from = "physical memory";
    }
  }
  rlimit limit{};
  if (::getrlimit(RLIMIT_AS, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY &&
      (available == 0 || limit.rlim_cur < available)) {
    available = limit.rlim_cur;
    from = "the address-space limit (ulimit -v)";
  }
  if (source) *source = from;
  return available;
}

std::string gib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", bytes / 1073741824.0);
  return buf;
}

void require_memory(double bytes, const std::string& what, const std::string& detail) {
  std::string source;
  const uint64_t available = available_memory_bytes(&source);
  if (available > 0 && bytes > static_cast<double>(available))
    throw InputError(what + " needs about " + gib(bytes) + " of memory (" + detail + ") but only " +
                     gib(static_cast<double>(available)) + " is available (" + source + ")");
}

}  // namespace kvscope::cli
