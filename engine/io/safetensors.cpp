#include "engine/io/safetensors.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <nlohmann/json.hpp>

#include "engine/core/error.h"
#include "engine/io/json_limits.h"

namespace kvscope {
namespace {

static_assert(std::endian::native == std::endian::little,
              "capture I/O reads little-endian data in place");

using nlohmann::json;

// Safetensors dtype names that are valid but not float formats KVScope reads.
bool is_known_unsupported_dtype(const std::string& name) {
  static const char* kOthers[] = {"BOOL",    "U8",  "I8",      "I16",    "U16",     "I32",
                                  "U32",     "I64", "U64",     "F64",    "F8_E4M3", "F8_E5M2",
                                  "F8_E8M0", "F4",  "F6_E2M3", "F6_E3M2"};
  for (const char* other : kOthers)
    if (name == other) return true;
  return false;
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// Reads a JSON number as a non-negative integer that fits in 63 bits, or throws.
uint64_t non_negative_integer(const json& v, const std::string& what) {
  if (v.is_number_unsigned()) {
    uint64_t u = v.get<uint64_t>();
    if (u <= static_cast<uint64_t>(INT64_MAX)) return u;
  } else if (v.is_number_integer()) {
    int64_t i = v.get<int64_t>();
    if (i >= 0) return static_cast<uint64_t>(i);
  }
  std::string text = v.dump(-1, ' ', false, json::error_handler_t::replace);
  if (text.size() > 40) text = text.substr(0, 40) + "...";
  throw InputError(what + " must be a non-negative integer below 2^63, got " + text);
}

SafetensorsEntry parse_entry(const std::string& name, const json& entry, uint64_t data_begin,
                             uint64_t data_size, const std::string& file) {
  const std::string where = file + ": tensor " + name;
  if (!entry.is_object()) throw InputError(where + ": header entry is not a JSON object");
  auto dtype_it = entry.find("dtype");
  auto shape_it = entry.find("shape");
  auto offsets_it = entry.find("data_offsets");
  if (dtype_it == entry.end()) throw InputError(where + ": header entry has no dtype");
  if (shape_it == entry.end()) throw InputError(where + ": header entry has no shape");
  if (offsets_it == entry.end()) throw InputError(where + ": header entry has no data_offsets");

  SafetensorsEntry out;
  out.desc.name = name;
  if (!dtype_it->is_string()) throw InputError(where + ": dtype is not a string");
  const std::string dtype = dtype_it->get<std::string>();
  if (dtype == "F32") {
    out.desc.dtype = DType::F32;
  } else if (dtype == "F16") {
    out.desc.dtype = DType::F16;
  } else if (dtype == "BF16") {
    out.desc.dtype = DType::BF16;
  } else if (is_known_unsupported_dtype(dtype)) {
    throw InputError(where + ": dtype " + dtype +
                     " is not supported (KVScope reads F32, F16, BF16)");
  } else {
    throw InputError(where + ": unknown dtype \"" + dtype + "\" (KVScope reads F32, F16, BF16)");
  }

  if (!shape_it->is_array()) throw InputError(where + ": shape is not an array");
  if (shape_it->size() > 8)
    throw InputError(where + ": shape has rank " + std::to_string(shape_it->size()) +
                     " (at most 8)");
  // Element count with overflow checks: a hostile header must not wrap the size around.
  uint64_t elements = 1;
  bool overflow = false;
  for (const json& dim : *shape_it) {
    uint64_t d = non_negative_integer(dim, where + ": shape dimension");
    out.desc.shape.push_back(static_cast<int64_t>(d));
    if (d != 0 && elements > kMaxTensorElements / d) overflow = true;
    elements = overflow ? kMaxTensorElements : elements * d;
  }
  if (overflow)
    throw InputError(where + ": shape " + shape_string(out.desc.shape) +
                     " has more elements than the limit of 2^40 per tensor");
  out.desc.num_elements = elements;
  const uint64_t element_size = dtype_size(out.desc.dtype);

  if (!offsets_it->is_array() || offsets_it->size() != 2)
    throw InputError(where + ": data_offsets must be an array [begin, end]");
  uint64_t begin = non_negative_integer((*offsets_it)[0], where + ": data_offsets begin");
  uint64_t end = non_negative_integer((*offsets_it)[1], where + ": data_offsets end");
  std::string range = "[";  // built by appending: GCC 12 warns falsely on "lit" + string&&
  range += std::to_string(begin) + ", " + std::to_string(end) + "]";
  if (end < begin) throw InputError(where + ": data_offsets " + range + " end before begin");
  if (end > data_size)
    throw InputError(where + ": data_offsets " + range + " out of range: the data section has " +
                     std::to_string(data_size) + " bytes (truncated file?)");
  if (overflow || elements > UINT64_MAX / element_size || elements * element_size != end - begin)
    throw InputError(where + ": shape " + shape_string(out.desc.shape) + " of " + dtype +
                     (overflow ? " is too large"
                               : " needs " + std::to_string(elements * element_size) + " bytes") +
                     " but data_offsets " + range + " span " + std::to_string(end - begin));
  out.data_begin = data_begin + begin;
  out.data_end = data_begin + end;
  return out;
}

class SafetensorsArchive final : public TensorArchive {
 public:
  SafetensorsArchive(std::shared_ptr<const MappedFile> file, SafetensorsHeader header)
      : file_(std::move(file)), header_(std::move(header)) {
    for (const SafetensorsEntry& e : header_.tensors) descs_.push_back(e.desc);
  }
  const std::string& path() const override { return file_->path(); }
  const char* format_name() const override { return "safetensors"; }
  uint64_t file_bytes() const override { return file_->size(); }
  bool has_metadata() const override { return header_.has_metadata; }
  const std::map<std::string, std::string>& metadata() const override { return header_.metadata; }
  const std::vector<TensorDesc>& tensors() const override { return descs_; }
  const uint8_t* tensor_bytes(size_t i, std::vector<uint8_t>& scratch) const override {
    const SafetensorsEntry& e = header_.tensors.at(i);
    file_->will_need(e.data_begin, e.data_end - e.data_begin);
    scratch.resize(e.data_end - e.data_begin);
    file_->copy(e.data_begin, scratch.size(), scratch.data());
    return scratch.data();
  }
  const MappedFile* plain_location(size_t i, uint64_t* offset) const override {
    const SafetensorsEntry& e = header_.tensors.at(i);
    file_->will_need(e.data_begin, e.data_end - e.data_begin);
    *offset = e.data_begin;
    return file_.get();
  }
  void release(size_t i) const override {
    const SafetensorsEntry& e = header_.tensors.at(i);
    file_->release(e.data_begin, e.data_end - e.data_begin);
  }

 private:
  std::shared_ptr<const MappedFile> file_;
  SafetensorsHeader header_;
  std::vector<TensorDesc> descs_;
};

class SafetensorsWriter final : public TensorFileWriter {
 public:
  SafetensorsWriter(const std::string& path, const std::map<std::string, std::string>& metadata,
                    const std::vector<TensorPlan>& plan)
      : path_(path), out_(path) {
    json header = json::object();
    header["__metadata__"] = metadata;
    for (const TensorPlan& t : plan) {
      uint64_t bytes = dtype_size(t.dtype);
      for (int64_t d : t.shape) bytes *= static_cast<uint64_t>(d);
      header[t.name] = {{"dtype", dtype_name(t.dtype)},
                        {"shape", t.shape},
                        {"data_offsets", {planned_bytes_, planned_bytes_ + bytes}}};
      planned_bytes_ += bytes;
    }
    // Invalid UTF-8 in a prompt or path is replaced (U+FFFD), not an exception.
    std::string text = header.dump(-1, ' ', false, json::error_handler_t::replace);
    // Pad with spaces so the data section starts 8-byte aligned (as the reference writer does).
    text.append((8 - text.size() % 8) % 8, ' ');
    uint64_t length = text.size();
    out_.write(&length, 8);
    out_.write(text.data(), text.size());
    data_begin_ = out_.position();
  }
  void append(const void* bytes, size_t n) override {
    if (out_.position() - data_begin_ + n > planned_bytes_)
      throw InputError(path_ + ": writer given more data than the planned tensors hold");
    out_.write(bytes, n);
  }
  void finish() override {
    if (out_.position() - data_begin_ != planned_bytes_)
      throw InputError(path_ + ": writer finished with " +
                       std::to_string(out_.position() - data_begin_) + " of " +
                       std::to_string(planned_bytes_) + " data bytes written");
    out_.commit();
  }

 private:
  std::string path_;
  OutputFile out_;
  uint64_t planned_bytes_ = 0;
  uint64_t data_begin_ = 0;
};

}  // namespace

namespace {

// Checks the 8-byte length prefix against the file and the limits.
uint64_t checked_header_length(const uint8_t prefix[8], size_t size, const std::string& file) {
  if (size < 8)
    throw InputError(file + ": file is " + std::to_string(size) +
                     " bytes, too short for a safetensors header (truncated file?)");
  uint64_t header_length;
  std::memcpy(&header_length, prefix, 8);
  // A safetensors file begins with a little-endian length, whose high bytes are zero; eight
  // bytes of text (a text file, a CSV, a JSON file) give a length of exabytes that says nothing.
  bool text = true;
  for (int i = 0; i < 8; ++i)
    text = text && ((prefix[i] >= 0x20 && prefix[i] < 0x7f) || prefix[i] == '\n' ||
                    prefix[i] == '\r' || prefix[i] == '\t');
  if (text && header_length > size - 8) {
    std::string start(reinterpret_cast<const char*>(prefix), 8);
    for (char& c : start)
      if (c == '\n' || c == '\r' || c == '\t') c = ' ';
    throw InputError(file + ": not a safetensors file: it begins with the text \"" + start +
                     "\", where a safetensors file begins with an 8-byte header length");
  }
  if (header_length > size - 8)
    throw InputError(file + ": safetensors header length " + std::to_string(header_length) +
                     " exceeds the file (" + std::to_string(size) +
                     " bytes): truncated file or not a safetensors file");
  if (header_length > kMaxSafetensorsHeaderBytes)
    throw InputError(file + ": safetensors header length " + std::to_string(header_length) +
                     " exceeds the limit of " + std::to_string(kMaxSafetensorsHeaderBytes) +
                     " bytes (100 MiB)");
  if (header_length < 2) throw InputError(file + ": safetensors header is empty");
  return header_length;
}

SafetensorsHeader parse_header_text(const uint8_t* text, uint64_t header_length, size_t size,
                                    const std::string& file) {
  JsonLimits limits;
  limits.max_depth = kMaxSafetensorsHeaderDepth;
  limits.max_values = kMaxSafetensorsHeaderValues;
  const json header = parse_json_limited(reinterpret_cast<const char*>(text),
                                         reinterpret_cast<const char*>(text) + header_length,
                                         limits, file + ": safetensors header");
  if (!header.is_object()) throw InputError(file + ": safetensors header is not a JSON object");
  const size_t tensor_count = header.size() - (header.contains("__metadata__") ? 1 : 0);
  if (tensor_count > kMaxSafetensorsTensors)
    throw InputError(file + ": safetensors header lists " + std::to_string(tensor_count) +
                     " tensors, more than the limit of " + std::to_string(kMaxSafetensorsTensors));

  SafetensorsHeader out;
  out.data_section_begin = 8 + header_length;
  const uint64_t data_size = size - out.data_section_begin;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it->is_object()) throw InputError(file + ": __metadata__ is not a JSON object");
      out.has_metadata = true;
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string())
          throw InputError(file + ": __metadata__ entry \"" + m.key() + "\" is not a string");
        out.metadata[m.key()] = m->get<std::string>();
      }  // duplicate keys were refused by the parser
      continue;
    }
    out.tensors.push_back(parse_entry(it.key(), *it, out.data_section_begin, data_size, file));
  }

  std::sort(out.tensors.begin(), out.tensors.end(),
            [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
              return a.data_begin != b.data_begin ? a.data_begin < b.data_begin
                                                  : a.data_end < b.data_end;
            });
  const SafetensorsEntry* previous = nullptr;
  for (const SafetensorsEntry& e : out.tensors) {
    if (e.data_begin == e.data_end) continue;  // empty tensors occupy no bytes
    if (previous && e.data_begin < previous->data_end)
      throw InputError(file + ": tensors " + previous->desc.name + " and " + e.desc.name +
                       " overlap (data_offsets [" +
                       std::to_string(previous->data_begin - out.data_section_begin) + ", " +
                       std::to_string(previous->data_end - out.data_section_begin) + "] and [" +
                       std::to_string(e.data_begin - out.data_section_begin) + ", " +
                       std::to_string(e.data_end - out.data_section_begin) + "])");
    previous = &e;
  }
  return out;
}

}  // namespace

SafetensorsHeader parse_safetensors_header(const uint8_t* bytes, size_t size,
                                           const std::string& file) {
  const uint64_t header_length = checked_header_length(bytes, size, file);
  return parse_header_text(bytes + 8, header_length, size, file);
}

std::unique_ptr<TensorArchive> open_safetensors(std::shared_ptr<const MappedFile> file) {
  // Copied out of the mapping (copy() turns a file shrinking under us into InputError).
  uint8_t prefix[8] = {};
  file->copy(0, std::min<size_t>(8, file->size()), prefix);
  const uint64_t header_length = checked_header_length(prefix, file->size(), file->path());
  const std::vector<uint8_t> text = file->bytes(8, header_length);
  SafetensorsHeader header =
      parse_header_text(text.data(), header_length, file->size(), file->path());
  return std::make_unique<SafetensorsArchive>(std::move(file), std::move(header));
}

std::unique_ptr<TensorFileWriter> create_safetensors_writer(
    const std::string& path, const std::map<std::string, std::string>& metadata,
    const std::vector<TensorPlan>& plan) {
  return std::make_unique<SafetensorsWriter>(path, metadata, plan);
}

}  // namespace kvscope
