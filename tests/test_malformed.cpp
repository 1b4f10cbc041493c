// The malformed-capture corpus (tests/malformed/, made by make_corpus.py): every damaged file
// gives one InputError naming the file, the tensor (or member/metadata entry) and the problem,
// never a crash; NaN/Inf refuse only the affected kv head; `kvscope-cli info` exits non-zero
// with the same message.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <array>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "engine/core/error.h"
#include "engine/io/capture.h"
#include "engine/io/mapped_file.h"
#include "engine/io/npz.h"
#include "engine/io/safetensors.h"
#include "engine/io/tensor_archive.h"
#include "tests/cli_runner.h"

namespace fs = std::filesystem;
using namespace kvscope;

namespace {

using kvscope::testing::run_cli;

std::string corpus(const std::string& name) {
  return std::string(KVSCOPE_SOURCE_DIR) + "/tests/malformed/" + name;
}

// Opens the file and loads every layer; returns the InputError message ("" when it all worked).
std::string open_error(const std::string& path) {
  try {
    auto cap = CaptureFile::open(path);
    for (int L = 0; L < cap->info().num_layers; ++L) cap->layer(L);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

struct MalformedCase {
  const char* file;
  std::vector<const char*> expected;  // substrings of the message besides the file path
};

class Malformed : public ::testing::TestWithParam<MalformedCase> {};

TEST_P(Malformed, GivesOneClearError) {
  const MalformedCase& c = GetParam();
  const std::string path = corpus(c.file);
  ASSERT_TRUE(fs::exists(path)) << path << " missing: run tests/malformed/make_corpus.py";
  const std::string message = open_error(path);
  ASSERT_FALSE(message.empty()) << c.file << " opened without error";
  EXPECT_NE(message.find(path), std::string::npos) << "message does not name the file: " << message;
  for (const char* part : c.expected)
    EXPECT_NE(message.find(part), std::string::npos)
        << "message lacks \"" << part << "\": " << message;
}

const MalformedCase kCases[] = {
    // container: safetensors
    {"too_short.safetensors", {"3 bytes", "too short"}},
    {"truncated.safetensors", {"tensor layers.1.query", "out of range", "truncated"}},
    {"header_too_long.safetensors", {"header length 1099511627776", "exceeds the file"}},
    {"text_file.safetensors", {"not a safetensors file", "\"Once upo\""}},
    {"invalid_json.safetensors", {"header is not valid JSON"}},
    {"header_not_object.safetensors", {"header is not a JSON object"}},
    {"offsets_out_of_range.safetensors",
     {"tensor layers.1.query", "data_offsets [384, 10000]", "out of range"}},
    {"offsets_negative.safetensors",
     {"tensor layers.0.value", "data_offsets begin", "non-negative integer"}},
    {"overlapping.safetensors", {"tensors layers.0.key and layers.0.value overlap"}},
    {"size_mismatch.safetensors",
     {"tensor layers.0.key", "shape [2, 4, 3]", "needs 96 bytes", "span 64"}},
    {"unknown_dtype.safetensors", {"tensor layers.1.value", "unknown dtype \"Q7\""}},
    {"unsupported_dtype_f64.safetensors", {"dtype F64 is not supported"}},
    {"metadata_not_string.safetensors", {"__metadata__ entry \"num_layers\" is not a string"}},
    // capture layout
    {"wrong_rank.safetensors", {"tensor layers.1.key", "rank 2, expected 3"}},
    {"tokens_mismatch_between_layers.safetensors",
     {"tensor layers.1.value", "has 2 tokens", "layers.0.key has 4"}},
    {"head_dim_mismatch.safetensors",
     {"tensor layers.0.key", "head dim 2 but metadata head_dim = 4"}},
    {"missing_layer.safetensors", {"missing tensor layers.1.key", "num_layers = 3"}},
    {"missing_value.safetensors", {"missing tensor layers.1.value"}},
    {"missing_query_in_one_layer.safetensors", {"missing tensor layers.1.query"}},
    {"layer_beyond_num_layers.safetensors", {"tensor layers.2.", "num_layers = 2"}},
    {"kv_heads_mismatch.safetensors", {"tensor layers.0.key", "2 heads", "kv_heads = 1"}},
    {"q_heads_not_multiple.safetensors", {"q_heads = 3", "not a multiple of kv_heads = 2"}},
    {"no_metadata.safetensors", {"__metadata__ is missing"}},
    {"wrong_format.safetensors", {"\"format\" = \"kvscope/2\"", "expected \"kvscope/1\""}},
    {"missing_head_dim.safetensors", {"__metadata__ has no \"head_dim\" entry"}},
    {"num_layers_not_integer.safetensors", {"\"num_layers\" = \"two\"", "not a positive integer"}},
    {"rope_not_applied.safetensors", {"\"rope\" = \"none\"", "after RoPE"}},
    {"tokens_count_mismatch.safetensors", {"\"tokens\" has 3 token strings", "4 tokens"}},
    {"tokens_not_json.safetensors", {"\"tokens\" is not a JSON array of strings"}},
    // container: npz
    {"truncated.npz", {"end-of-central-directory", "truncated"}},
    {"not_a_zip.npz", {"end-of-central-directory"}},
    {"missing_metadata_json.npz", {"metadata.json is missing"}},
    {"metadata_json_invalid.npz", {"member metadata.json is not valid JSON"}},
    {"npy_bad_magic.npz", {"member layers.0.key.npy", "not an .npy array"}},
    {"npy_f8.npz", {"member layers.0.value.npy", "dtype '<f8' is not supported"}},
    {"npy_fortran.npz", {"member layers.1.key.npy", "Fortran order"}},
    {"npy_size_mismatch.npz", {"member layers.1.query.npy", "needs 128 bytes", "member holds 132"}},
    {"npy_header_garbage.npz", {"member layers.0.key.npy", ".npy header"}},
    {"bad_crc.npz", {"member layers.1.value.npy", "CRC mismatch"}},
    {"corrupt_deflate.npz", {"member layers.0.query.npy"}},
    {"unsupported_compression.npz", {"member metadata.json", "compression method 12"}},
};

INSTANTIATE_TEST_SUITE_P(Corpus, Malformed, ::testing::ValuesIn(kCases), [](const auto& info) {
  std::string name = info.param.file;
  for (char& ch : name)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return name;
});

TEST(Corpus, ValidSeedsOpenInEveryContainerVariant) {
  const char* files[] = {"valid_f32.safetensors", "valid_f16.safetensors", "valid_stored.npz",
                         "valid_deflated.npz",    "valid_zip64.npz",       "npy_v2_header.npz"};
  std::shared_ptr<const LayerData> reference;
  for (const char* f : files) {
    SCOPED_TRACE(f);
    auto cap = CaptureFile::open(corpus(f));
    const CaptureInfo& info = cap->info();
    EXPECT_EQ(info.num_layers, 2);
    EXPECT_EQ(info.q_heads, 4);
    EXPECT_EQ(info.kv_heads, 2);
    EXPECT_EQ(info.head_dim, 2);
    EXPECT_EQ(info.num_tokens, 4);
    EXPECT_EQ(info.tokens.at(1), "Once");
    EXPECT_EQ(info.model, "corpus-model");
    auto layer = cap->layer(1);
    if (!reference) reference = layer;
    // All variants hold the same (F16-exact) numbers.
    for (int h = 0; h < 2; ++h) {
      EXPECT_EQ(layer->keys[h], reference->keys[h]);
      EXPECT_EQ(layer->values[h], reference->values[h]);
      EXPECT_TRUE(layer->refused[h].empty());
    }
    for (int h = 0; h < 4; ++h) EXPECT_EQ(layer->queries[h], reference->queries[h]);
  }
}

TEST(Corpus, NanInAKeyRefusesOnlyThatKvHead) {
  const std::string path = corpus("nan_key.safetensors");
  auto cap = CaptureFile::open(path);  // opening does not read tensor data
  auto clean = cap->layer(0);
  EXPECT_TRUE(clean->refused[0].empty());
  EXPECT_TRUE(clean->refused[1].empty());
  auto layer = cap->layer(1);
  // Element N*D + 3 of [kv, n, d] = head 1, token 1, channel 1.
  ASSERT_EQ(layer->refused.size(), 2u);
  EXPECT_TRUE(layer->refused[0].empty()) << layer->refused[0];
  const std::string& why = layer->refused[1];
  EXPECT_NE(why.find(path), std::string::npos) << why;
  EXPECT_NE(why.find("tensor layers.1.key"), std::string::npos) << why;
  EXPECT_NE(why.find("kv head 1 has NaN at token 1, channel 1"), std::string::npos) << why;
  EXPECT_NE(why.find("refused"), std::string::npos) << why;
  EXPECT_TRUE(layer->keys[0].allFinite());
}

TEST(Corpus, InfInAQueryRefusesItsGqaGroup) {
  auto cap = CaptureFile::open(corpus("inf_query.safetensors"));
  auto layer = cap->layer(0);
  // Element 3*N*D = query head 3, token 0: group size 2, so kv head 1 is refused.
  EXPECT_TRUE(layer->refused[0].empty()) << layer->refused[0];
  EXPECT_NE(layer->refused[1].find("tensor layers.0.query: query head 3 has Inf at token 0"),
            std::string::npos)
      << layer->refused[1];
  EXPECT_NE(layer->refused[1].find("kv head 1 refused"), std::string::npos);
}

// Every prefix of a valid file is a truncated file: each must fail cleanly, never crash.
TEST(Corpus, EveryTruncationOfAValidFileFailsCleanly) {
  for (const char* name : {"valid_f16.safetensors", "valid_deflated.npz"}) {
    std::ifstream in(corpus(name), std::ios::binary);
    std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), {});
    ASSERT_GT(bytes.size(), 100u);
    const bool npz = std::string(name).ends_with(".npz");
    for (size_t cut = 0; cut < bytes.size(); ++cut) {
      const fs::path path =
          fs::temp_directory_path() /
          ("kvscope_trunc_" + std::to_string(::getpid()) + (npz ? ".npz" : ".safetensors"));
      {
        std::ofstream out(path, std::ios::binary);
        out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(cut));
      }
      const std::string message = open_error(path.string());
      EXPECT_FALSE(message.empty()) << name << " cut at " << cut << " opened";
      fs::remove(path);
    }
  }
}

// Flipping any single byte of a valid file either still opens or gives an InputError.
TEST(Corpus, EverySingleByteCorruptionIsHandled) {
  for (const char* name : {"valid_f32.safetensors", "valid_stored.npz"}) {
    std::ifstream in(corpus(name), std::ios::binary);
    std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), {});
    for (size_t i = 0; i < bytes.size(); ++i) {
      std::vector<uint8_t> damaged = bytes;
      damaged[i] ^= 0x5A;
      auto file = MappedFile::from_bytes(std::move(damaged), name);
      try {
        auto cap = std::string(name).ends_with(".npz")
                       ? open_capture_archive(open_npz(file))
                       : open_capture_archive(open_safetensors(file));
        for (int L = 0; L < cap->info().num_layers; ++L) cap->layer(L);
      } catch (const InputError& e) {
        EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
      }
    }
  }
}

TEST(CliInfo, MalformedFileExitsNonZeroWithTheMessage) {
  int code = 0;
  const std::string path = corpus("overlapping.safetensors");
  std::string out = run_cli("info " + path, &code);
  EXPECT_EQ(code, 1) << out;
  EXPECT_NE(out.find("kvscope-cli: error: " + path), std::string::npos) << out;
  EXPECT_NE(out.find("layers.0.key and layers.0.value overlap"), std::string::npos) << out;

  out = run_cli("info " + corpus("npy_f8.npz"), &code);
  EXPECT_EQ(code, 1) << out;
  EXPECT_NE(out.find("member layers.0.value.npy"), std::string::npos) << out;

  out = run_cli("info " + corpus("does_not_exist.safetensors"), &code);
  EXPECT_EQ(code, 1) << out;
  EXPECT_NE(out.find("cannot open"), std::string::npos) << out;
}

TEST(CliInfo, RefusedHeadsAreReported) {
  int code = 0;
  std::string out = run_cli("info --check " + corpus("nan_key.safetensors"), &code);
  EXPECT_EQ(code, 1) << out;
  EXPECT_NE(out.find("kv head 1 has NaN"), std::string::npos) << out;
}

// ---- limits and duplicate keys: each error names the limit or the key

std::vector<uint8_t> safetensors_bytes(const std::string& header, size_t data_bytes = 0) {
  std::string text = header;
  text.append((8 - text.size() % 8) % 8, ' ');
  std::vector<uint8_t> out(8 + text.size() + data_bytes, 0);
  const uint64_t length = text.size();
  std::memcpy(out.data(), &length, 8);
  std::memcpy(out.data() + 8, text.data(), text.size());
  return out;
}

std::string header_error(const std::string& header, size_t data_bytes = 0) {
  const std::vector<uint8_t> bytes = safetensors_bytes(header, data_bytes);
  try {
    parse_safetensors_header(bytes.data(), bytes.size(), "h.safetensors");
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(Limits, DuplicateTensorNamesAndMetadataKeysAreRefused) {
  const std::string t = R"({"dtype": "F32", "shape": [1], "data_offsets": [0, 4]})";
  std::string msg = header_error(R"({"a": )" + t + R"(, "a": )" + t + "}", 4);
  EXPECT_NE(msg.find("duplicate key \"a\""), std::string::npos) << msg;
  msg = header_error(R"({"__metadata__": {"k": "1", "k": "2"}})");
  EXPECT_NE(msg.find("duplicate key \"k\""), std::string::npos) << msg;
}

TEST(Limits, DeepNestingIsRefusedWithoutRecursion) {
  const int depth = 200000;  // a recursive parser or walk would overflow the stack
  const std::string header = R"({"a": )" + std::string(depth, '[') + std::string(depth, ']') + "}";
  const std::string msg = header_error(header);
  EXPECT_NE(msg.find("nesting deeper than 16 levels (limit)"), std::string::npos) << msg;
}

TEST(Limits, TensorCountValueCountAndElementCountAreBounded) {
  std::string many = "{";
  for (size_t i = 0; i <= kMaxSafetensorsTensors; ++i)
    many += (i ? ", " : "") + ("\"t" + std::to_string(i)) +
            R"(": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]})";
  many += "}";
  std::string msg = header_error(many);
  EXPECT_NE(msg.find("more than the limit of 65536"), std::string::npos) << msg;

  std::string zeros = R"({"a": [0)";
  for (uint64_t i = 0; i < kMaxSafetensorsHeaderValues; ++i) zeros += ",0";
  zeros += "]}";
  msg = header_error(zeros);
  EXPECT_NE(msg.find("values (limit)"), std::string::npos) << msg;

  msg = header_error(
      R"({"t": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 0]}})");
  EXPECT_NE(msg.find("more elements than the limit of 2^40"), std::string::npos) << msg;
}

// A zip with one deflated member whose directory claims `claimed` bytes.
std::vector<uint8_t> zip_one_member(const std::string& name, const std::vector<uint8_t>& raw,
                                    uint32_t claimed) {
  std::vector<uint8_t> out;
  auto put16 = [&](uint16_t v) {
    out.push_back(v & 0xFF);
    out.push_back(v >> 8);
  };
  auto put32 = [&](uint32_t v) {
    put16(v & 0xFFFF);
    put16(v >> 16);
  };
  put32(0x04034b50);
  for (uint16_t v : {20, 0, 8, 0, 0x21}) put16(v);
  put32(0);
  put32(static_cast<uint32_t>(raw.size()));
  put32(claimed);
  put16(static_cast<uint16_t>(name.size()));
  put16(0);
  out.insert(out.end(), name.begin(), name.end());
  out.insert(out.end(), raw.begin(), raw.end());
  const uint32_t cd = static_cast<uint32_t>(out.size());
  put32(0x02014b50);
  for (uint16_t v : {20, 20, 0, 8, 0, 0x21}) put16(v);
  put32(0);
  put32(static_cast<uint32_t>(raw.size()));
  put32(claimed);
  put16(static_cast<uint16_t>(name.size()));
  for (int i = 0; i < 4; ++i) put16(0);
  put32(0);
  put32(0);
  out.insert(out.end(), name.begin(), name.end());
  const uint32_t cd_size = static_cast<uint32_t>(out.size()) - cd;
  put32(0x06054b50);
  for (uint16_t v : {0, 0, 1, 1}) put16(v);
  put32(cd_size);
  put32(cd);
  put16(0);
  return out;
}

std::string npz_error(const std::vector<uint8_t>& bytes) {
  try {
    open_capture_archive(open_npz(MappedFile::from_bytes(bytes, "bomb.npz")));
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(Limits, DeflateBombsAreRefusedBeforeInflating) {
  // 16 MiB of zeros deflate to ~16 KiB: a ratio of ~1000:1, beyond the 100:1 limit.
  const size_t inflated = 16u << 20;
  std::vector<uint8_t> zeros(inflated, 0), raw(compressBound(inflated));
  z_stream zs{};
  ASSERT_EQ(deflateInit2(&zs, 9, Z_DEFLATED, -MAX_WBITS, 8, Z_DEFAULT_STRATEGY), Z_OK);
  zs.next_in = zeros.data();
  zs.avail_in = static_cast<uInt>(zeros.size());
  zs.next_out = raw.data();
  zs.avail_out = static_cast<uInt>(raw.size());
  ASSERT_EQ(deflate(&zs, Z_FINISH), Z_STREAM_END);
  raw.resize(zs.total_out);
  deflateEnd(&zs);
  std::string msg = npz_error(zip_one_member("layers.0.key.npy", raw, inflated));
  EXPECT_NE(msg.find("ratio beyond the limit of 100:1"), std::string::npos) << msg;
  msg = npz_error(zip_one_member("metadata.json", raw, inflated));
  EXPECT_NE(msg.find("limit"), std::string::npos) << msg;
  // A metadata.json with duplicate keys is refused like a safetensors __metadata__ one.
  const std::string dup = R"({"format": "kvscope/1", "format": "x"})";
  std::vector<uint8_t> dup_raw(compressBound(dup.size()));
  uLongf dup_size = dup_raw.size();
  ASSERT_EQ(compress2(dup_raw.data(), &dup_size, reinterpret_cast<const Bytef*>(dup.data()),
                      dup.size(), 9),
            Z_OK);
  // compress2 writes a zlib stream: strip its 2-byte header and 4-byte trailer for raw deflate.
  std::vector<uint8_t> dup_deflate(dup_raw.begin() + 2, dup_raw.begin() + dup_size - 4);
  std::vector<uint8_t> zip =
      zip_one_member("metadata.json", dup_deflate, static_cast<uint32_t>(dup.size()));
  const uint32_t crc = crc32(0, reinterpret_cast<const Bytef*>(dup.data()), dup.size());
  std::memcpy(zip.data() + 14, &crc, 4);                                 // local header CRC
  std::memcpy(zip.data() + 30 + 13 + dup_deflate.size() + 16, &crc, 4);  // central directory CRC
  msg = npz_error(zip);
  EXPECT_NE(msg.find("duplicate key \"format\""), std::string::npos) << msg;
}

TEST(Limits, MetadataCountsBeyondTheLimitsAreNamed) {
  const std::string t = R"({"dtype": "F32", "shape": [1, 1, 1], "data_offsets": [0, 4]})";
  for (const auto& [key, value] :
       std::vector<std::pair<std::string, std::string>>{{"num_layers", "5000000"},
                                                        {"kv_heads", "2000000"},
                                                        {"q_heads", "99999999999999999999"}}) {
    std::string meta = R"({"format": "kvscope/1", "num_layers": "1", "q_heads": "1",
        "kv_heads": "1", "head_dim": "1", "tokens": "[\"a\"]"})";
    const size_t at = meta.find("\"" + key + "\": \"");
    const size_t begin = meta.find('"', at + key.size() + 3) + 1;
    meta.replace(begin, meta.find('"', begin) - begin, value);
    const std::vector<uint8_t> bytes =
        safetensors_bytes(R"({"__metadata__": )" + meta + R"(, "layers.0.key": )" + t + "}", 4);
    std::string msg;
    try {
      open_capture_archive(open_safetensors(MappedFile::from_bytes(bytes, "m.safetensors")));
    } catch (const InputError& e) {
      msg = e.what();
    }
    EXPECT_NE(msg.find("\"" + key + "\" = " + value + " exceeds the limit of"), std::string::npos)
        << msg;
  }
}

}  // namespace
