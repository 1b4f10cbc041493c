#include "engine/io/json_limits.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <unordered_set>
#include <vector>

#include "engine/core/error.h"

namespace kvscope {
namespace {

using nlohmann::json;

// nlohmann's own DOM builder (linear; its callback variant rescans the parent object after every
// child, which is quadratic in a 100k-entry header) with the limits checked on every event.
class LimitedDomParser : public nlohmann::detail::json_sax_dom_parser<json> {
  using Base = nlohmann::detail::json_sax_dom_parser<json>;

 public:
  LimitedDomParser(json& result, const JsonLimits& limits) : Base(result, true), limits_(limits) {}

  bool null() { return count() && Base::null(); }
  bool boolean(bool v) { return count() && Base::boolean(v); }
  bool number_integer(json::number_integer_t v) { return count() && Base::number_integer(v); }
  bool number_unsigned(json::number_unsigned_t v) { return count() && Base::number_unsigned(v); }
  bool number_float(json::number_float_t v, const json::string_t& s) {
    return count() && Base::number_float(v, s);
  }
  bool string(json::string_t& v) { return count() && Base::string(v); }
  bool binary(json::binary_t& v) { return count() && Base::binary(v); }
  bool start_object(std::size_t n) {
    open(true);
    return Base::start_object(n);
  }
  bool key(json::string_t& k) {
    if (limits_.reject_duplicate_keys && !open_.empty() && open_.back().object &&
        !open_.back().keys.insert(k).second) {
      problem_ = "duplicate key \"" + (k.size() > 80 ? k.substr(0, 80) + "..." : k) + "\"";
      return false;
    }
    return Base::key(k);
  }
  bool end_object() {
    open_.pop_back();
    return Base::end_object();
  }
  bool start_array(std::size_t n) {
    open(false);
    return Base::start_array(n);
  }
  bool end_array() {
    open_.pop_back();
    return Base::end_array();
  }
  // Returning false from an event stops the parse; the message says which limit.
  const std::string& problem() const { return problem_; }

 private:
  bool count() {
    if (++values_ > limits_.max_values) {
      problem_ = "more than " + std::to_string(limits_.max_values) + " values (limit)";
      return false;
    }
    return true;
  }
  void open(bool object) {
    // A container counts as a value; the depth check comes first so a deep document stops
    // before it is built.
    if (static_cast<int>(open_.size()) + 1 > limits_.max_depth) {
      problem_ = "nesting deeper than " + std::to_string(limits_.max_depth) + " levels (limit)";
      throw LimitHit{};
    }
    if (!count()) throw LimitHit{};
    open_.push_back({object, {}});
  }
  struct LimitHit {};
  struct Open {
    bool object = false;
    std::unordered_set<std::string> keys;
  };
  const JsonLimits& limits_;
  std::vector<Open> open_;
  uint64_t values_ = 0;
  std::string problem_;

 public:
  using Hit = LimitHit;
};

}  // namespace

nlohmann::json parse_json_limited(const char* begin, const char* end, const JsonLimits& limits,
                                  const std::string& what) {
  json result;
  LimitedDomParser parser(result, limits);
  try {
    const bool ok = json::sax_parse(begin, end, &parser);
    if (!ok || !parser.problem().empty())
      throw InputError(
          what + ": " +
          (parser.problem().empty() ? std::string("not valid JSON") : parser.problem()));
  } catch (const LimitedDomParser::Hit&) {
    throw InputError(what + ": " + parser.problem());
  } catch (const json::exception& e) {
    throw InputError(what + " is not valid JSON: " + e.what());
  }
  return result;
}

nlohmann::json read_json_file_limited(const std::string& path, uint64_t max_bytes,
                                      const JsonLimits& limits) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused below anyway.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw InputError(path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw InputError(path + ": not a regular file");
  }
  if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    ::close(fd);
    throw InputError(path + ": " + std::to_string(st.st_size) + " bytes exceeds the " +
                     std::to_string(max_bytes >> 20) + " MiB limit for this file");
  }
  std::string text(static_cast<size_t>(st.st_size), '\0');
  size_t got = 0;
  while (got < text.size()) {
    const ssize_t r = ::pread(fd, text.data() + got, text.size() - got, static_cast<off_t>(got));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += static_cast<size_t>(r);
  }
  ::close(fd);
  text.resize(got);  // a file that shrank meanwhile is parsed as it now is
  return parse_json_limited(text, limits, path);
}

}  // namespace kvscope
