// Typed access to the fields of a JSON document read from a file (sessions, eval reports). Every
// read checks the value's type (and range where one is given); a wrong one throws InputError that
// names the field's path and what was found instead, e.g.
//   session field "views.geometry": expected an object, got a number
//   eval report field "results[3].mean": expected a number, got null
// so no reader hands a wrong type to nlohmann's get<T>() (whose message names no field) or skips
// it silently.
//
//   JsonField doc(j, "session");                  // the document itself
//   doc.expect_object();
//   int seed = doc.get("seed", 0, 0, 1 << 30);    // optional: absent gives the default
//   JsonField focus = doc.at("focus");            // required: absent is an error
//   for (const JsonField& x : doc.at("ratios").elements()) x.number();
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace kvscope {

// What a JSON value is, for messages: "a number (1.5)", "a string", "null", "an object", ...
std::string json_kind(const nlohmann::json& v);

class JsonField {
 public:
  // `doc` names the document in messages ("session", "eval report"); `path` is where `value`
  // is in it ("" for the document itself, "focus", "results[3]").
  JsonField(const nlohmann::json& value, std::string doc, std::string path = "")
      : v_(&value), doc_(std::move(doc)), path_(std::move(path)) {}

  const nlohmann::json& json() const { return *v_; }
  const std::string& path() const { return path_; }
  // Throws InputError: `<doc> field "<path>": <problem>` (`<doc>: <problem>` for the document).
  [[noreturn]] void fail(const std::string& problem) const;

  // ---- this value, checked
  void expect_object() const;
  void expect_array() const;
  long long integer(long long lo, long long hi) const;  // an integer within [lo, hi]
  int integer(int lo, int hi) const {
    return static_cast<int>(integer(static_cast<long long>(lo), static_cast<long long>(hi)));
  }
  uint64_t unsigned_integer() const;          // a non-negative integer up to 2^64 - 1
  double number() const;                      // any number (integers included)
  double number(double lo, double hi) const;  // within [lo, hi]
  bool boolean() const;
  std::string string() const;

  // ---- members of an object (this must be one)
  bool has(const std::string& field) const;
  std::optional<JsonField> find(const std::string& field) const;  // absent: nullopt
  JsonField at(const std::string& field) const;                   // absent: "is missing"
  // Every member, in the document's order.
  std::vector<std::pair<std::string, JsonField>> members() const;
  // Optional members: absent gives `fallback`; present must have the type (and range).
  int get(const std::string& field, int fallback, int lo, int hi) const;
  double get(const std::string& field, double fallback) const;
  double get(const std::string& field, double fallback, double lo, double hi) const;
  bool get(const std::string& field, bool fallback) const;
  std::string get(const std::string& field, const std::string& fallback) const;
  std::string get(const std::string& field, const char* fallback) const {
    return get(field, std::string(fallback));
  }

  // ---- elements of an array (this must be one)
  size_t size() const;
  JsonField at(size_t i) const;
  std::vector<JsonField> elements() const;
  std::vector<double> numbers() const;              // every element a number
  std::vector<std::string> strings() const;         // every element a string
  std::vector<int> integers(int lo, int hi) const;  // every element an integer in [lo, hi]

 private:
  std::string child(const std::string& field) const;
  const nlohmann::json* v_;
  std::string doc_, path_;
};

}  // namespace kvscope
