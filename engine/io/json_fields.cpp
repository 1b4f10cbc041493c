#include "engine/io/json_fields.h"

#include <climits>
#include <cmath>
#include <sstream>

#include "engine/core/error.h"

namespace kvscope {

namespace {

std::string shown(const nlohmann::json& v) {
  std::string s = v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (s.size() > 40) s = s.substr(0, 37) + "...";
  return s;
}

std::string number_text(double x) {
  std::ostringstream o;
  o << x;
  return o.str();
}

}  // namespace

std::string json_kind(const nlohmann::json& v) {
  switch (v.type()) {
    case nlohmann::json::value_t::null:
      return "null";
    case nlohmann::json::value_t::object:
      return "an object";
    case nlohmann::json::value_t::array:
      return "a list";
    case nlohmann::json::value_t::string:
      return "a string (" + shown(v) + ")";
    case nlohmann::json::value_t::boolean:
      return v.get<bool>() ? "true" : "false";
    case nlohmann::json::value_t::number_integer:
    case nlohmann::json::value_t::number_unsigned:
      return "an integer (" + shown(v) + ")";
    case nlohmann::json::value_t::number_float:
      return "a number (" + shown(v) + ")";
    default:
      return std::string("a ") + v.type_name();
  }
}

void JsonField::fail(const std::string& problem) const {
  if (path_.empty()) throw InputError(doc_ + ": " + problem);
  throw InputError(doc_ + " field \"" + path_ + "\": " + problem);
}

std::string JsonField::child(const std::string& field) const {
  return path_.empty() ? field : path_ + "." + field;
}

void JsonField::expect_object() const {
  if (!v_->is_object()) fail("expected an object, got " + json_kind(*v_));
}

void JsonField::expect_array() const {
  if (!v_->is_array()) fail("expected a list, got " + json_kind(*v_));
}

long long JsonField::integer(long long lo, long long hi) const {
  if (!v_->is_number_integer()) fail("expected an integer, got " + json_kind(*v_));
  const bool too_big =
      v_->is_number_unsigned() && v_->get<uint64_t>() > static_cast<uint64_t>(LLONG_MAX);
  const long long x = too_big ? LLONG_MAX : v_->get<long long>();
  if (too_big || x < lo || x > hi)
    fail(shown(*v_) + " is outside [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return x;
}

uint64_t JsonField::unsigned_integer() const {
  if (!v_->is_number_integer()) fail("expected an integer, got " + json_kind(*v_));
  if (!v_->is_number_unsigned() && v_->get<long long>() < 0)
    fail(shown(*v_) + " is negative, expected an integer >= 0");
  return v_->get<uint64_t>();
}

double JsonField::number() const {
  if (!v_->is_number()) fail("expected a number, got " + json_kind(*v_));
  return v_->get<double>();
}

double JsonField::number(double lo, double hi) const {
  const double x = number();
  if (!(x >= lo && x <= hi))
    fail(shown(*v_) + " is outside [" + number_text(lo) + ", " + number_text(hi) + "]");
  return x;
}

bool JsonField::boolean() const {
  if (!v_->is_boolean()) fail("expected true or false, got " + json_kind(*v_));
  return v_->get<bool>();
}

std::string JsonField::string() const {
  if (!v_->is_string()) fail("expected a string, got " + json_kind(*v_));
  return v_->get<std::string>();
}

bool JsonField::has(const std::string& field) const {
  expect_object();
  return v_->contains(field);
}

std::optional<JsonField> JsonField::find(const std::string& field) const {
  expect_object();
  auto it = v_->find(field);
  if (it == v_->end()) return std::nullopt;
  return JsonField(*it, doc_, child(field));
}

JsonField JsonField::at(const std::string& field) const {
  std::optional<JsonField> f = find(field);
  if (!f) JsonField(*v_, doc_, child(field)).fail("is missing");
  return *f;
}

std::vector<std::pair<std::string, JsonField>> JsonField::members() const {
  expect_object();
  std::vector<std::pair<std::string, JsonField>> out;
  for (auto it = v_->begin(); it != v_->end(); ++it)
    out.emplace_back(it.key(), JsonField(it.value(), doc_, child(it.key())));
  return out;
}

int JsonField::get(const std::string& field, int fallback, int lo, int hi) const {
  std::optional<JsonField> f = find(field);
  return f ? f->integer(lo, hi) : fallback;
}

double JsonField::get(const std::string& field, double fallback) const {
  std::optional<JsonField> f = find(field);
  return f ? f->number() : fallback;
}

double JsonField::get(const std::string& field, double fallback, double lo, double hi) const {
  std::optional<JsonField> f = find(field);
  return f ? f->number(lo, hi) : fallback;
}

bool JsonField::get(const std::string& field, bool fallback) const {
  std::optional<JsonField> f = find(field);
  return f ? f->boolean() : fallback;
}

std::string JsonField::get(const std::string& field, const std::string& fallback) const {
  std::optional<JsonField> f = find(field);
  return f ? f->string() : fallback;
}

size_t JsonField::size() const {
  expect_array();
  return v_->size();
}

JsonField JsonField::at(size_t i) const {
  if (i >= size()) fail("has no element " + std::to_string(i));
  return JsonField((*v_)[i], doc_, path_ + "[" + std::to_string(i) + "]");
}

std::vector<JsonField> JsonField::elements() const {
  std::vector<JsonField> out;
  const size_t n = size();
  out.reserve(n);
  for (size_t i = 0; i < n; ++i)
    out.emplace_back((*v_)[i], doc_, path_ + "[" + std::to_string(i) + "]");
  return out;
}

std::vector<double> JsonField::numbers() const {
  std::vector<double> out;
  for (const JsonField& e : elements()) out.push_back(e.number());
  return out;
}

std::vector<std::string> JsonField::strings() const {
  std::vector<std::string> out;
  for (const JsonField& e : elements()) out.push_back(e.string());
  return out;
}

std::vector<int> JsonField::integers(int lo, int hi) const {
  std::vector<int> out;
  for (const JsonField& e : elements()) out.push_back(e.integer(lo, hi));
  return out;
}

}  // namespace kvscope
