// The malformed-capture corpus (tests/malformed/, made by make_corpus.py): every damaged file
// gives one InputError naming the file, the tensor (or member/metadata entry) and the problem,
// never a crash; NaN/Inf refuse only the affected kv head; `kvscope-cli info` exits non-zero
// with the same message.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "engine/capture.h"
#include "engine/error.h"
#include "engine/mapped_file.h"
#include "engine/npz.h"
#include "engine/safetensors.h"
#include "engine/tensor_archive.h"

namespace fs = std::filesystem;
using namespace kvscope;

namespace {

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

std::string run_cli(const std::string& args, int* exit_code) {
  const std::string command = std::string(KVSCOPE_CLI) + " " + args + " 2>&1";
  FILE* pipe = ::popen(command.c_str(), "r");
  std::string output;
  std::array<char, 4096> buffer;
  while (size_t n = std::fread(buffer.data(), 1, buffer.size(), pipe))
    output.append(buffer.data(), n);
  int status = ::pclose(pipe);
  *exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return output;
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

}  // namespace
