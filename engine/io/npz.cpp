#include "engine/io/npz.h"

#include <zlib.h>

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

constexpr uint32_t kLocalHeaderSig = 0x04034b50;
constexpr uint32_t kCentralHeaderSig = 0x02014b50;
constexpr uint32_t kEndOfCentralDirSig = 0x06054b50;
constexpr uint32_t kZip64EndSig = 0x06064b50;
constexpr uint32_t kZip64LocatorSig = 0x07064b50;
constexpr size_t kEndOfCentralDirSize = 22;
constexpr size_t kCentralHeaderSize = 46;
constexpr size_t kLocalHeaderSize = 30;
// How much of a deflated member is inflated to read its .npy header (numpy pads headers to
// 64 bytes and keeps them short; 1 MiB leaves room for any real shape).
constexpr size_t kNpyHeaderPrefix = 1 << 20;
// Limits, each named in the error when hit (see npz.h for the inflation limits).
constexpr uint64_t kMaxMetadataBytes = kMaxNpzMetadataBytes;
constexpr uint64_t kMaxCentralDirectoryBytes = 64ull << 20;
constexpr uint64_t kMaxMembers = 65537;  // 65536 tensors (the safetensors limit) + metadata.json
// Compressed input is copied out of the mapping (MappedFile::copy catches a shrinking file) in
// chunks of this size.
constexpr size_t kInflateInputChunk = 1 << 20;

uint16_t le16(const uint8_t* p) {
  return static_cast<uint16_t>(p[0] | (p[1] << 8));
}
uint32_t le32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
uint64_t le64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// ---- .npy header: a Python dict literal {'descr': '<f4', 'fortran_order': False, 'shape': (..)}

class PyLiteralParser {
 public:
  PyLiteralParser(const char* begin, const char* end, const std::string& what)
      : p_(begin), end_(end), what_(what) {}

  void skip_space() {
    while (p_ < end_ && (*p_ == ' ' || *p_ == '\t' || *p_ == '\n' || *p_ == '\r')) ++p_;
  }
  bool consume(char c) {
    skip_space();
    if (p_ < end_ && *p_ == c) {
      ++p_;
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (!consume(c)) fail(std::string("expected '") + c + "'");
  }
  bool at_end() {
    skip_space();
    return p_ >= end_;
  }
  std::string string_literal() {
    skip_space();
    if (p_ >= end_ || (*p_ != '\'' && *p_ != '"')) fail("expected a string");
    const char quote = *p_++;
    std::string out;
    while (p_ < end_ && *p_ != quote) {
      if (*p_ == '\\') fail("escapes are not expected in an .npy header");
      out += *p_++;
    }
    if (p_ >= end_) fail("unterminated string");
    ++p_;
    return out;
  }
  bool boolean() {
    skip_space();
    if (match_word("True")) return true;
    if (match_word("False")) return false;
    fail("expected True or False");
  }
  std::vector<int64_t> int_tuple() {
    expect('(');
    std::vector<int64_t> out;
    while (!consume(')')) {
      skip_space();
      if (p_ >= end_ || *p_ < '0' || *p_ > '9') fail("shape must be a tuple of non-negative ints");
      int64_t v = 0;
      while (p_ < end_ && *p_ >= '0' && *p_ <= '9') {
        if (v > (INT64_MAX - 9) / 10) fail("shape dimension too large");
        v = v * 10 + (*p_++ - '0');
      }
      skip_space();
      if (p_ < end_ && *p_ == 'L') ++p_;  // Python 2 longs
      out.push_back(v);
      if (out.size() > 8) fail("shape has more than 8 dimensions");
      if (!consume(',')) {
        expect(')');
        break;
      }
    }
    return out;
  }
  [[noreturn]] void fail(const std::string& problem) const {
    throw InputError(what_ + ": .npy header is malformed: " + problem);
  }

 private:
  bool match_word(const char* word) {
    size_t n = std::strlen(word);
    if (static_cast<size_t>(end_ - p_) >= n && std::memcmp(p_, word, n) == 0) {
      p_ += n;
      return true;
    }
    return false;
  }
  const char* p_;
  const char* end_;
  const std::string& what_;
};

// ---- zip members

struct ZipMember {
  std::string name;
  uint16_t method = 0;
  uint32_t crc = 0;
  uint64_t compressed_size = 0;
  uint64_t uncompressed_size = 0;
  uint64_t data_begin = 0;  // absolute offset of the (compressed) member data
};

std::string mib(uint64_t bytes) {
  return std::to_string(bytes >> 20) + " MiB";
}

// A deflated member's claimed size must be within the absolute cap and, above a small floor,
// within kMaxNpzDeflateRatio times its compressed size: checked before anything is allocated.
void check_inflated_size(const ZipMember& m, const std::string& what) {
  if (m.method != 8) return;
  if (m.uncompressed_size > kMaxNpzMemberBytes)
    throw InputError(what + ": inflates to " + std::to_string(m.uncompressed_size) +
                     " bytes, beyond the limit of " + mib(kMaxNpzMemberBytes) + " per member");
  if (m.uncompressed_size > kNpzRatioFloorBytes &&
      m.uncompressed_size / kMaxNpzDeflateRatio > m.compressed_size)
    throw InputError(what + ": inflates " + std::to_string(m.compressed_size) + " bytes to " +
                     std::to_string(m.uncompressed_size) + ", a ratio beyond the limit of " +
                     std::to_string(kMaxNpzDeflateRatio) + ":1 (a deflate bomb?)");
}

// Inflates up to `limit` bytes of a raw-deflate member into `out`; with `limit` equal to the
// member's size, also checks the stream ends exactly there and its CRC matches.
void inflate_member(const MappedFile& file, const ZipMember& m, size_t limit,
                    std::vector<uint8_t>* out, const std::string& what) {
  out->resize(limit);
  if (limit == 0 && m.compressed_size == 0) return;
  check_inflated_size(m, what);
  z_stream zs{};
  if (inflateInit2(&zs, -MAX_WBITS) != Z_OK) throw InputError(what + ": cannot start inflate");
  // zlib's avail_in/avail_out are 32-bit: feed and drain in chunks. The input is copied out of
  // the mapping chunk by chunk; the output never grows past `limit` (itself within the caps).
  std::vector<uint8_t> in_buffer(
      static_cast<size_t>(std::min<uint64_t>(m.compressed_size, kInflateInputChunk)));
  uint64_t in_offset = m.data_begin;
  uint64_t in_left = m.compressed_size;
  auto refill = [&] {
    const size_t chunk = static_cast<size_t>(std::min<uint64_t>(in_left, in_buffer.size()));
    try {
      file.copy(in_offset, chunk, in_buffer.data());
    } catch (...) {
      inflateEnd(&zs);
      throw;
    }
    zs.next_in = in_buffer.data();
    zs.avail_in = static_cast<uInt>(chunk);
    in_offset += chunk;
    in_left -= chunk;
  };
  size_t produced = 0;
  int rc = Z_OK;
  while (produced < limit) {
    if (zs.avail_in == 0 && in_left > 0) refill();
    zs.next_out = out->data() + produced;
    zs.avail_out = static_cast<uInt>(std::min<size_t>(limit - produced, 1u << 30));
    const uInt before = zs.avail_out;
    rc = inflate(&zs, Z_NO_FLUSH);
    produced += before - zs.avail_out;
    if (rc == Z_STREAM_END) break;
    if (rc != Z_OK && rc != Z_BUF_ERROR) break;
    if (rc == Z_BUF_ERROR && zs.avail_in == 0 && in_left == 0) break;  // input exhausted
  }
  const bool whole = limit == m.uncompressed_size;
  if (whole && rc == Z_OK && produced == limit) {
    // Everything expected has come out; the stream must end here.
    uint8_t extra;
    zs.next_out = &extra;
    zs.avail_out = 1;
    if (zs.avail_in == 0 && in_left > 0) refill();
    rc = inflate(&zs, Z_NO_FLUSH);
    if (zs.avail_out == 0) rc = Z_DATA_ERROR;  // more data than the directory says
  }
  const char* msg = zs.msg;
  inflateEnd(&zs);
  if (rc != Z_STREAM_END && !(rc == Z_OK && !whole) && !(rc == Z_BUF_ERROR && !whole)) {
    if (rc == Z_DATA_ERROR || rc == Z_STREAM_ERROR || rc == Z_MEM_ERROR || rc == Z_NEED_DICT)
      throw InputError(what + ": deflate data is corrupt" +
                       (msg ? std::string(" (") + msg + ")" : ""));
    throw InputError(what + ": deflate data ends early (truncated file?)");
  }
  if (produced < limit)
    throw InputError(what + ": inflates to " + std::to_string(produced) +
                     " bytes, the zip directory says " + std::to_string(m.uncompressed_size));
  if (whole && crc32_z(0, out->data(), out->size()) != m.crc)
    throw InputError(what + ": CRC mismatch (corrupt data)");
}

// Where the central directory lies and how many entries it lists.
struct CentralDirectory {
  uint64_t entries = 0, size = 0, offset = 0;
};

// The central directory of a zip archive, from its end record (or the zip64 end record that one
// points at), checked to lie in the file and within the limits.
CentralDirectory find_central_directory(const MappedFile& file) {
  const std::string& path = file.path();
  const size_t size = file.size();
  if (size < kEndOfCentralDirSize)
    throw InputError(path + ": file is " + std::to_string(size) +
                     " bytes, too short for a zip (.npz) archive (truncated file?)");
  // The end record sits at the end, possibly followed by a comment of up to 64 KiB.
  const size_t tail_begin =
      size > kEndOfCentralDirSize + 0xFFFF ? size - kEndOfCentralDirSize - 0xFFFF : 0;
  const std::vector<uint8_t> tail = file.bytes(tail_begin, size - tail_begin);
  size_t eocd_in_tail = SIZE_MAX;
  for (size_t pos = tail.size() - kEndOfCentralDirSize + 1; pos-- > 0;) {
    if (le32(tail.data() + pos) == kEndOfCentralDirSig) {
      eocd_in_tail = pos;
      break;
    }
  }
  if (eocd_in_tail == SIZE_MAX)
    throw InputError(path + ": no zip end-of-central-directory record: not an .npz or truncated");
  const uint8_t* end_record = tail.data() + eocd_in_tail;
  const size_t eocd = tail_begin + eocd_in_tail;
  CentralDirectory cd;
  cd.entries = le16(end_record + 10);
  cd.size = le32(end_record + 12);
  cd.offset = le32(end_record + 16);
  if (le16(end_record + 4) != 0 || le16(end_record + 6) != 0)
    throw InputError(path + ": multi-disk zip archives are not supported");
  if (cd.entries == 0xFFFF || cd.size == 0xFFFFFFFF || cd.offset == 0xFFFFFFFF) {
    // zip64: the locator sits just before the end record and points at the zip64 end record.
    if (eocd < 20) throw InputError(path + ": zip64 end-of-central-directory locator missing");
    const std::vector<uint8_t> locator = file.bytes(eocd - 20, 20);
    if (le32(locator.data()) != kZip64LocatorSig)
      throw InputError(path + ": zip64 end-of-central-directory locator missing");
    uint64_t z64 = le64(locator.data() + 8);
    if (z64 > size || size - z64 < 56)
      throw InputError(path + ": zip64 end-of-central-directory record out of range or corrupt");
    const std::vector<uint8_t> record = file.bytes(z64, 56);
    if (le32(record.data()) != kZip64EndSig)
      throw InputError(path + ": zip64 end-of-central-directory record out of range or corrupt");
    cd.entries = le64(record.data() + 32);
    cd.size = le64(record.data() + 40);
    cd.offset = le64(record.data() + 48);
  }
  if (cd.offset > size || cd.size > size - cd.offset)
    throw InputError(path + ": zip central directory [" + std::to_string(cd.offset) + ", +" +
                     std::to_string(cd.size) + ") lies outside the file (" + std::to_string(size) +
                     " bytes; truncated?)");
  if (cd.entries > cd.size / kCentralHeaderSize)
    throw InputError(path + ": zip central directory claims " + std::to_string(cd.entries) +
                     " entries but holds at most " + std::to_string(cd.size / kCentralHeaderSize));
  if (cd.entries > kMaxMembers)
    throw InputError(path + ": zip central directory lists " + std::to_string(cd.entries) +
                     " members, more than the limit of " + std::to_string(kMaxMembers));
  if (cd.size > kMaxCentralDirectoryBytes)
    throw InputError(path + ": zip central directory of " + std::to_string(cd.size) +
                     " bytes exceeds the limit of " + mib(kMaxCentralDirectoryBytes));
  return cd;
}

// The zip64 extra field [x, x_end) of a central directory entry: the 64-bit values of whichever
// fields are saturated, in this order.
void read_zip64_extra(const uint8_t* x, const uint8_t* x_end, const std::string& where,
                      ZipMember& m, uint64_t& local_offset) {
  while (x_end - x >= 4) {
    const uint16_t id = le16(x), len = le16(x + 2);
    if (static_cast<size_t>(x_end - x - 4) < len) break;
    if (id == 0x0001) {
      const uint8_t* f = x + 4;
      const uint8_t* f_end = f + len;
      auto take = [&](uint64_t* field) {
        if (f_end - f < 8) throw InputError(where + ": zip64 extra field too short");
        *field = le64(f);
        f += 8;
      };
      if (m.uncompressed_size == 0xFFFFFFFF) take(&m.uncompressed_size);
      if (m.compressed_size == 0xFFFFFFFF) take(&m.compressed_size);
      if (local_offset == 0xFFFFFFFF) take(&local_offset);
    }
    x += 4 + len;
  }
}

// Where the data of member m (general purpose flags `flags`, local header at local_offset)
// begins in the file, after checking that it is readable: not encrypted, stored or deflated, its
// local header and data within the file, and its claimed size within the limits.
uint64_t member_data_begin(const MappedFile& file, const ZipMember& m, uint16_t flags,
                           uint64_t local_offset, const std::string& where) {
  const size_t size = file.size();
  if (flags & 1) throw InputError(where + ": encrypted zip members are not supported");
  if (m.method != 0 && m.method != 8)
    throw InputError(where + ": compression method " + std::to_string(m.method) +
                     " is not supported (stored or deflated only)");
  if (m.method == 0 && m.compressed_size != m.uncompressed_size)
    throw InputError(where + ": stored member with compressed size " +
                     std::to_string(m.compressed_size) + " != size " +
                     std::to_string(m.uncompressed_size));
  if (local_offset > size || size - local_offset < kLocalHeaderSize)
    throw InputError(where + ": local header at offset " + std::to_string(local_offset) +
                     " is out of range or corrupt");
  uint8_t local[kLocalHeaderSize];
  file.copy(local_offset, kLocalHeaderSize, local);
  if (le32(local) != kLocalHeaderSig)
    throw InputError(where + ": local header at offset " + std::to_string(local_offset) +
                     " is out of range or corrupt");
  const uint64_t data_begin = local_offset + kLocalHeaderSize + le16(local + 26) + le16(local + 28);
  if (data_begin > size || m.compressed_size > size - data_begin)
    throw InputError(where + ": data [" + std::to_string(data_begin) + ", +" +
                     std::to_string(m.compressed_size) + ") runs past the end of the file (" +
                     std::to_string(size) + " bytes; truncated?)");
  // Deflate expands at most ~1032:1; a larger claim is a lie that would make us allocate it.
  if (m.method == 8 && m.uncompressed_size / 1032 > m.compressed_size + 1)
    throw InputError(where + ": claims " + std::to_string(m.uncompressed_size) + " bytes from " +
                     std::to_string(m.compressed_size) +
                     " deflated bytes, beyond deflate's own limit of 1032:1");
  check_inflated_size(m, where);
  return data_begin;
}

// Members must not overlap (a crafted archive could alias one tensor's bytes with another's)
// nor share a name (which one would be the tensor?).
void check_members_distinct(const std::vector<ZipMember>& members, const std::string& path) {
  std::vector<const ZipMember*> order;
  for (const ZipMember& m : members) order.push_back(&m);
  std::sort(order.begin(), order.end(), [](const ZipMember* a, const ZipMember* b) {
    return a->name != b->name ? a->name < b->name : a->data_begin < b->data_begin;
  });
  for (size_t i = 1; i < order.size(); ++i)
    if (order[i]->name == order[i - 1]->name)
      throw InputError(path + ": member " + order[i]->name + " appears twice");
  std::sort(order.begin(), order.end(),
            [](const ZipMember* a, const ZipMember* b) { return a->data_begin < b->data_begin; });
  const ZipMember* furthest = nullptr;  // the member reaching furthest so far
  for (const ZipMember* m : order) {
    if (m->compressed_size == 0) continue;
    if (furthest && m->data_begin < furthest->data_begin + furthest->compressed_size)
      throw InputError(path + ": members " + furthest->name + " and " + m->name + " overlap");
    if (!furthest ||
        m->data_begin + m->compressed_size > furthest->data_begin + furthest->compressed_size)
      furthest = m;
  }
}

struct NpzTensor {
  size_t member = 0;
  NpyHeader npy;
};

class NpzArchive final : public TensorArchive {
 public:
  explicit NpzArchive(std::shared_ptr<const MappedFile> file) : file_(std::move(file)) {
    read_directory();
    for (size_t i = 0; i < members_.size(); ++i) {
      const ZipMember& m = members_[i];
      if (m.name == "metadata.json") {
        read_metadata(m);
      } else if (m.name.size() > 4 && m.name.compare(m.name.size() - 4, 4, ".npy") == 0) {
        read_tensor_header(i);
      }
    }
  }
  const std::string& path() const override { return file_->path(); }
  const char* format_name() const override { return "npz"; }
  uint64_t file_bytes() const override { return file_->size(); }
  bool has_metadata() const override { return has_metadata_; }
  const std::map<std::string, std::string>& metadata() const override { return metadata_; }
  const std::vector<TensorDesc>& tensors() const override { return descs_; }

  const uint8_t* tensor_bytes(size_t i, std::vector<uint8_t>& scratch) const override {
    const NpzTensor& t = tensors_.at(i);
    const ZipMember& m = members_[t.member];
    if (m.method == 0) {
      file_->will_need(m.data_begin, m.compressed_size);
      scratch.resize(m.uncompressed_size);
      file_->copy(m.data_begin, scratch.size(), scratch.data());
      if (crc32_z(0, scratch.data(), scratch.size()) != m.crc)
        throw InputError(member_where(m) + ": CRC mismatch (corrupt data)");
      return scratch.data() + t.npy.data_offset;
    }
    inflate_member(*file_, m, m.uncompressed_size, &scratch, member_where(m));
    return scratch.data() + t.npy.data_offset;
  }
  void release(size_t i) const override {
    const ZipMember& m = members_[tensors_.at(i).member];
    if (m.method == 0) file_->release(m.data_begin, m.compressed_size);
  }

 private:
  std::string member_where(const ZipMember& m) const {
    return file_->path() + ": member " + m.name;
  }

  // Every structure is copied out of the mapping before it is read (MappedFile::copy turns a file
  // shrinking under us into InputError instead of SIGBUS).
  void read_directory() {
    const std::string& path = file_->path();
    const CentralDirectory cd = find_central_directory(*file_);
    const std::vector<uint8_t> directory = file_->bytes(cd.offset, cd.size);

    size_t pos = 0;
    const size_t cd_end = cd.size;
    for (uint64_t e = 0; e < cd.entries; ++e) {
      if (cd_end - pos < kCentralHeaderSize || le32(directory.data() + pos) != kCentralHeaderSig)
        throw InputError(path + ": zip central directory entry " + std::to_string(e) +
                         " is corrupt");
      const uint8_t* h = directory.data() + pos;
      ZipMember m;
      const uint16_t flags = le16(h + 8);
      m.method = le16(h + 10);
      m.crc = le32(h + 16);
      m.compressed_size = le32(h + 20);
      m.uncompressed_size = le32(h + 24);
      const size_t name_len = le16(h + 28), extra_len = le16(h + 30), comment_len = le16(h + 32);
      uint64_t local_offset = le32(h + 42);
      if (cd_end - pos - kCentralHeaderSize < name_len + extra_len + comment_len)
        throw InputError(path + ": zip central directory entry " + std::to_string(e) +
                         " runs past the directory");
      m.name.assign(reinterpret_cast<const char*>(h + kCentralHeaderSize), name_len);
      const std::string where = path + ": member " + m.name;
      const uint8_t* extra = h + kCentralHeaderSize + name_len;
      read_zip64_extra(extra, extra + extra_len, where, m, local_offset);
      pos += kCentralHeaderSize + name_len + extra_len + comment_len;

      m.data_begin = member_data_begin(*file_, m, flags, local_offset, where);
      members_.push_back(std::move(m));
    }
    check_members_distinct(members_, path);
  }

  void read_metadata(const ZipMember& m) {
    const std::string where = member_where(m);
    if (m.uncompressed_size > kMaxMetadataBytes)
      throw InputError(where + ": " + std::to_string(m.uncompressed_size) +
                       " bytes exceeds the limit of " + mib(kMaxMetadataBytes) + " for metadata");
    std::vector<uint8_t> bytes;
    if (m.method == 0) {
      bytes = file_->bytes(m.data_begin, m.uncompressed_size);
    } else {
      inflate_member(*file_, m, m.uncompressed_size, &bytes, where);
    }
    JsonLimits limits;
    limits.max_depth = 16;
    limits.max_values = kMaxNpzMetadataValues;
    const json doc = parse_json_limited(reinterpret_cast<const char*>(bytes.data()),
                                        reinterpret_cast<const char*>(bytes.data()) + bytes.size(),
                                        limits, where);
    if (!doc.is_object()) throw InputError(where + " is not a JSON object");
    // Same keys as __metadata__; numbers and arrays (e.g. tokens as a real JSON array) are
    // accepted and kept in their JSON text form, which is what __metadata__ would hold.
    for (auto it = doc.begin(); it != doc.end(); ++it)
      metadata_[it.key()] = it->is_string()
                                ? it->get<std::string>()
                                : it->dump(-1, ' ', false, json::error_handler_t::replace);
    has_metadata_ = true;
  }

  void read_tensor_header(size_t member_index) {
    const ZipMember& m = members_[member_index];
    const std::string where = member_where(m);
    NpzTensor t;
    t.member = member_index;
    if (m.method == 0) {
      // Only the header's bytes are needed: the prefix numpy could have written.
      const size_t want =
          static_cast<size_t>(std::min<uint64_t>(m.uncompressed_size, kNpyHeaderPrefix));
      const std::vector<uint8_t> prefix = file_->bytes(m.data_begin, want);
      t.npy = parse_npy_header(prefix.data(), prefix.size(), where);
    } else {
      std::vector<uint8_t> prefix;
      size_t want = static_cast<size_t>(std::min<uint64_t>(m.uncompressed_size, kNpyHeaderPrefix));
      inflate_member(*file_, m, want, &prefix, where);
      t.npy = parse_npy_header(prefix.data(), prefix.size(), where);
    }
    const uint64_t element_size = dtype_size(t.npy.dtype);
    const uint64_t available = m.uncompressed_size - t.npy.data_offset;
    if (t.npy.num_elements > available / element_size ||
        t.npy.num_elements * element_size != available)
      throw InputError(where + ": shape " + shape_string(t.npy.shape) + " of " +
                       dtype_name(t.npy.dtype) + " needs " +
                       (t.npy.num_elements > UINT64_MAX / element_size
                            ? std::string("too many")
                            : std::to_string(t.npy.num_elements * element_size)) +
                       " bytes but the member holds " + std::to_string(available));
    TensorDesc desc;
    desc.name = m.name.substr(0, m.name.size() - 4);
    desc.dtype = t.npy.dtype;
    desc.shape = t.npy.shape;
    desc.num_elements = t.npy.num_elements;
    descs_.push_back(std::move(desc));
    tensors_.push_back(std::move(t));
  }

  std::shared_ptr<const MappedFile> file_;
  std::vector<ZipMember> members_;
  std::vector<TensorDesc> descs_;
  std::vector<NpzTensor> tensors_;
  bool has_metadata_ = false;
  std::map<std::string, std::string> metadata_;
};

// ---- writer

std::string npy_header(const TensorPlan& t) {
  std::string dict = std::string("{'descr': '") + (t.dtype == DType::F32 ? "<f4" : "<f2") +
                     "', 'fortran_order': False, 'shape': (";
  // Python tuple syntax: "()", "(3,)", "(2, 3)".
  for (size_t i = 0; i < t.shape.size(); ++i) dict += (i ? ", " : "") + std::to_string(t.shape[i]);
  dict += t.shape.size() == 1 ? ",), }" : "), }";
  // Pad with spaces and a final newline so magic + length + dict is a multiple of 64 bytes.
  size_t total = 10 + dict.size() + 1;
  dict.append((64 - total % 64) % 64, ' ');
  dict += '\n';
  std::string out("\x93NUMPY\x01\x00", 8);
  const uint16_t len = static_cast<uint16_t>(dict.size());
  out += static_cast<char>(len & 0xFF);
  out += static_cast<char>(len >> 8);
  return out + dict;
}

void put16(std::string& s, uint16_t v) {
  s += static_cast<char>(v & 0xFF);
  s += static_cast<char>(v >> 8);
}
void put32(std::string& s, uint32_t v) {
  put16(s, static_cast<uint16_t>(v & 0xFFFF));
  put16(s, static_cast<uint16_t>(v >> 16));
}

class NpzWriter final : public TensorFileWriter {
 public:
  NpzWriter(const std::string& path, const std::map<std::string, std::string>& metadata,
            const std::vector<TensorPlan>& plan)
      : path_(path), out_(path) {
    for (const TensorPlan& t : plan) {
      if (t.dtype == DType::BF16)
        throw InputError(path +
                         ": .npz cannot hold BF16 (numpy has no bfloat16); write F32 or "
                         "F16, or use .safetensors");
      Member m;
      m.name = t.name + ".npy";
      m.header = npy_header(t);
      m.data_bytes = dtype_size(t.dtype);
      for (int64_t d : t.shape) m.data_bytes *= static_cast<uint64_t>(d);
      members_.push_back(std::move(m));
    }
    // metadata.json first, written whole.
    json doc = metadata;
    Member meta;
    meta.name = "metadata.json";
    meta.header = doc.dump(1, ' ', false, json::error_handler_t::replace);
    members_.insert(members_.begin(), std::move(meta));
    begin_member();
    advance();
  }

  void append(const void* bytes, size_t n) override {
    const uint8_t* p = static_cast<const uint8_t*>(bytes);
    while (n > 0) {
      if (current_ >= members_.size())
        throw InputError(path_ + ": writer given more data than the planned tensors hold");
      const size_t take = static_cast<size_t>(std::min<uint64_t>(n, remaining_));
      write_member_bytes(p, take);
      remaining_ -= take;
      p += take;
      n -= take;
      advance();
    }
  }

  void finish() override {
    if (current_ < members_.size())
      throw InputError(path_ + ": writer finished before writing " + members_[current_].name);
    const uint64_t cd_offset = out_.position();
    std::string cd;
    for (const Member& m : members_) {
      put32(cd, kCentralHeaderSig);
      put16(cd, 20);    // made by: version 2.0
      put16(cd, 20);    // needed
      put16(cd, 0);     // flags
      put16(cd, 0);     // stored
      put16(cd, 0);     // time
      put16(cd, 0x21);  // date: 1980-01-01
      put32(cd, m.crc);
      put32(cd, static_cast<uint32_t>(m.size));
      put32(cd, static_cast<uint32_t>(m.size));
      put16(cd, static_cast<uint16_t>(m.name.size()));
      put16(cd, 0);
      put16(cd, 0);
      put16(cd, 0);
      put16(cd, 0);
      put32(cd, 0);
      put32(cd, static_cast<uint32_t>(m.offset));
      cd += m.name;
    }
    const uint64_t cd_size = cd.size();
    check_32bit(cd_offset + cd_size, "the archive");
    if (members_.size() >= 0xFFFF) throw InputError(path_ + ": too many tensors for an .npz");
    put32(cd, kEndOfCentralDirSig);
    put16(cd, 0);
    put16(cd, 0);
    put16(cd, static_cast<uint16_t>(members_.size()));
    put16(cd, static_cast<uint16_t>(members_.size()));
    put32(cd, static_cast<uint32_t>(cd_size));
    put32(cd, static_cast<uint32_t>(cd_offset));
    put16(cd, 0);
    out_.write(cd.data(), cd.size());
    out_.commit();
  }

 private:
  struct Member {
    std::string name;
    std::string header;  // .npy header, or the whole metadata.json
    uint64_t data_bytes = 0;
    uint64_t offset = 0;  // local header offset
    uint64_t size = 0;
    uint32_t crc = 0;
  };

  void check_32bit(uint64_t value, const std::string& what) const {
    if (value >= 0xFFFFFFFFull)
      throw InputError(path_ + ": " + what +
                       " would exceed 4 GiB, which the .npz writer does not "
                       "support (no zip64); use .safetensors for large captures");
  }

  void begin_member() {
    Member& m = members_[current_];
    m.offset = out_.position();
    check_32bit(m.offset, "the archive");
    check_32bit(m.header.size() + m.data_bytes, "member " + m.name);
    std::string local;
    put32(local, kLocalHeaderSig);
    put16(local, 20);
    put16(local, 0);
    put16(local, 0);
    put16(local, 0);
    put16(local, 0x21);
    put32(local, 0);  // CRC and sizes are patched when the member is complete
    put32(local, 0);
    put32(local, 0);
    put16(local, static_cast<uint16_t>(m.name.size()));
    put16(local, 0);
    local += m.name;
    out_.write(local.data(), local.size());
    crc_ = 0;
    write_member_bytes(reinterpret_cast<const uint8_t*>(m.header.data()), m.header.size());
    remaining_ = m.data_bytes;
  }

  void write_member_bytes(const uint8_t* p, size_t n) {
    crc_ = crc32_z(crc_, p, n);
    out_.write(p, n);
  }

  void end_member() {
    Member& m = members_[current_];
    m.crc = static_cast<uint32_t>(crc_);
    m.size = m.header.size() + m.data_bytes;
    std::string patch;
    put32(patch, m.crc);
    put32(patch, static_cast<uint32_t>(m.size));
    put32(patch, static_cast<uint32_t>(m.size));
    out_.write_at(m.offset + 14, patch.data(), patch.size());
  }

  // Closes every complete member and opens the next, so zero-sized tensors need no data.
  void advance() {
    while (current_ < members_.size() && remaining_ == 0) {
      end_member();
      ++current_;
      if (current_ < members_.size()) begin_member();
    }
  }

  std::string path_;
  OutputFile out_;
  std::vector<Member> members_;
  size_t current_ = 0;
  uint64_t remaining_ = 0;
  uLong crc_ = 0;
};

}  // namespace

NpyHeader parse_npy_header(const uint8_t* bytes, size_t size, const std::string& what) {
  static const uint8_t kMagic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};
  if (size < 10 || std::memcmp(bytes, kMagic, 6) != 0)
    throw InputError(what + ": not an .npy array (bad magic or too short)");
  const uint8_t major = bytes[6];
  size_t header_len, header_begin;
  if (major == 1) {
    header_len = le16(bytes + 8);
    header_begin = 10;
  } else if (major == 2 || major == 3) {
    if (size < 12) throw InputError(what + ": .npy header truncated");
    header_len = le32(bytes + 8);
    header_begin = 12;
  } else {
    throw InputError(what + ": .npy format version " + std::to_string(major) +
                     " is not supported (1, 2 or 3)");
  }
  if (header_len > size - header_begin)
    throw InputError(what + ": .npy header length " + std::to_string(header_len) +
                     " runs past the member (" + std::to_string(size) + " bytes)");
  const char* text = reinterpret_cast<const char*>(bytes + header_begin);
  PyLiteralParser parser(text, text + header_len, what);
  parser.expect('{');
  std::string descr;
  bool have_descr = false, have_order = false, have_shape = false, fortran = false;
  NpyHeader out;
  while (!parser.consume('}')) {
    const std::string key = parser.string_literal();
    parser.expect(':');
    if (key == "descr") {
      descr = parser.string_literal();
      have_descr = true;
    } else if (key == "fortran_order") {
      fortran = parser.boolean();
      have_order = true;
    } else if (key == "shape") {
      out.shape = parser.int_tuple();
      have_shape = true;
    } else {
      parser.fail("unexpected key '" + key + "'");
    }
    if (!parser.consume(',')) {
      parser.expect('}');
      break;
    }
  }
  if (!parser.at_end()) parser.fail("text after the closing '}'");
  if (!have_descr || !have_order || !have_shape)
    parser.fail("needs 'descr', 'fortran_order' and 'shape'");
  if (descr == "<f4") {
    out.dtype = DType::F32;
  } else if (descr == "<f2") {
    out.dtype = DType::F16;
  } else {
    throw InputError(what + ": .npy dtype '" + descr +
                     "' is not supported (KVScope reads '<f4' and '<f2')");
  }
  if (fortran && out.shape.size() > 1)
    throw InputError(what + ": .npy array is in Fortran order; save it C-contiguous");
  uint64_t elements = 1;
  for (int64_t d : out.shape) {
    if (d != 0 && elements > (1ull << 40) / static_cast<uint64_t>(d))
      throw InputError(what + ": .npy shape " + shape_string(out.shape) +
                       " has more elements than the limit of 2^40 per tensor");
    elements *= static_cast<uint64_t>(d);
  }
  out.num_elements = elements;
  out.data_offset = header_begin + header_len;
  return out;
}

std::unique_ptr<TensorArchive> open_npz(std::shared_ptr<const MappedFile> file) {
  return std::make_unique<NpzArchive>(std::move(file));
}

std::unique_ptr<TensorFileWriter> create_npz_writer(
    const std::string& path, const std::map<std::string, std::string>& metadata,
    const std::vector<TensorPlan>& plan) {
  return std::make_unique<NpzWriter>(path, metadata, plan);
}

}  // namespace kvscope
