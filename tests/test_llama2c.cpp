// The llama2.c path (docs/capturing.md): checkpoint and tokenizer loading, run.c's greedy text,
// captures that reproduce the model's own attention, and clear errors for malformed files.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "engine/core/error.h"
#include "engine/io/capture.h"
#include "engine/model/llama2c.h"
#include "tests/llama2c_reference.h"

namespace fs = std::filesystem;
using namespace kvscope;

namespace {

const std::string kModelPath = std::string(KVSCOPE_SHARED_DIR) + "/models/stories260K.bin";
const std::string kTokenizerPath = std::string(KVSCOPE_SHARED_DIR) + "/models/tok512.bin";

#define REQUIRE_STORIES260K()                                                            \
  do {                                                                                   \
    if (!fs::exists(kModelPath) || !fs::exists(kTokenizerPath)) {                        \
      GTEST_SKIP() << "stories260K.bin / tok512.bin not found under " KVSCOPE_SHARED_DIR \
                      "/models; skipping the real-model tests";                          \
    }                                                                                    \
  } while (0)

std::vector<char> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(in), {});
}

// A scratch file in the test's temp directory, removed at the end of the test.
class TempFile {
 public:
  explicit TempFile(const std::string& name)
      : path_((fs::temp_directory_path() /
               ("kvscope_llama2c_" + std::to_string(::getpid()) + "_" + name))
                  .string()) {}
  ~TempFile() {
    std::error_code ec;
    fs::remove(path_, ec);
  }
  const std::string& path() const { return path_; }
  void write(const std::vector<char>& bytes) const {
    std::ofstream out(path_, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }

 private:
  std::string path_;
};

// Expects an InputError whose message names `path` and contains `needle`.
template <typename F>
void expect_input_error(F&& f, const std::string& path, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no InputError for " << path << " (expected \"" << needle << "\")";
  } catch (const InputError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find(path), std::string::npos) << message;
    EXPECT_NE(message.find(needle), std::string::npos) << message;
  }
}

// softmax(q_j k_{0..j}^T / sqrt(d)) v_{0..j} in double, from captured tensors.
std::vector<double> reference_attention(const MatrixF& q, const MatrixF& k, const MatrixF& v,
                                        int j) {
  const int d = static_cast<int>(q.cols());
  std::vector<double> logits(j + 1);
  double max_logit = -INFINITY;
  for (int t = 0; t <= j; ++t) {
    double dot = 0;
    for (int i = 0; i < d; ++i) dot += static_cast<double>(q(j, i)) * k(t, i);
    logits[t] = dot / std::sqrt(static_cast<double>(d));
    max_logit = std::max(max_logit, logits[t]);
  }
  double sum = 0;
  for (double& l : logits) sum += (l = std::exp(l - max_logit));
  std::vector<double> out(v.cols(), 0.0);
  for (int t = 0; t <= j; ++t) {
    for (int i = 0; i < v.cols(); ++i) out[i] += logits[t] / sum * v(t, i);
  }
  return out;
}

}  // namespace

TEST(Llama2cModel, ReadsTheStories260KConfig) {
  REQUIRE_STORIES260K();
  llama2c::Transformer model(kModelPath);
  const llama2c::Config& c = model.config();
  EXPECT_EQ(c.dim, 64);
  EXPECT_EQ(c.hidden_dim, 172);
  EXPECT_EQ(c.n_layers, 5);
  EXPECT_EQ(c.n_heads, 8);
  EXPECT_EQ(c.n_kv_heads, 4);
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_EQ(c.seq_len, 512);
  EXPECT_TRUE(c.shared_classifier);
  EXPECT_EQ(c.head_size(), 8);
  EXPECT_EQ(llama2c::model_name_from_path(kModelPath), "stories260K");
}

TEST(Llama2cModel, GreedyFromBosTellsTheKnownStory) {
  REQUIRE_STORIES260K();
  llama2c::Transformer model(kModelPath);
  llama2c::Tokenizer tokenizer(kTokenizerPath, model.config().vocab_size);
  llama2c::GenerateOptions options;
  options.steps = 40;
  const llama2c::Generation g = llama2c::generate(model, tokenizer, "", options);
  ASSERT_EQ(g.tokens.size(), 40u);
  EXPECT_EQ(g.tokens[0], llama2c::kBosToken);
  EXPECT_EQ(g.prompt_tokens, 1);
  EXPECT_EQ(g.decoded.rfind("Once upon a time, there was a little girl named Lily", 0), 0u)
      << g.decoded;
  // The token strings concatenate to the decoded text.
  EXPECT_EQ(g.text[0], "<s>");
  std::string joined;
  for (size_t i = 1; i < g.text.size(); ++i) joined += g.text[i];
  EXPECT_EQ(joined, g.decoded);
}

TEST(Llama2cModel, PromptIsForcedThenContinued) {
  REQUIRE_STORIES260K();
  llama2c::Transformer model(kModelPath);
  llama2c::Tokenizer tokenizer(kTokenizerPath, model.config().vocab_size);
  const std::string prompt = "Once upon a time, there was a brave little dragon";
  const std::vector<int> encoded = tokenizer.encode(prompt, true, false);
  llama2c::GenerateOptions options;
  options.steps = static_cast<int>(encoded.size()) + 12;
  const llama2c::Generation g = llama2c::generate(model, tokenizer, prompt, options);
  ASSERT_EQ(g.prompt_tokens, static_cast<int>(encoded.size()));
  for (size_t i = 0; i < encoded.size(); ++i) EXPECT_EQ(g.tokens[i], encoded[i]) << i;
  EXPECT_EQ(g.decoded.rfind(prompt, 0), 0u) << g.decoded;
  EXPECT_GT(g.decoded.size(), prompt.size());
}

TEST(Llama2cModel, CapturedQkvReproduceTheModelsAttentionOutputs) {
  REQUIRE_STORIES260K();
  llama2c::Transformer model(kModelPath);
  llama2c::Tokenizer tokenizer(kTokenizerPath, model.config().vocab_size);
  llama2c::GenerateOptions options;
  options.steps = 160;
  const llama2c::Generation g = llama2c::generate(model, tokenizer, "", options);
  const CaptureData capture = llama2c::make_capture(model, g, "stories260K", "", "test_llama2c");
  const CaptureInfo& info = capture.info;
  ASSERT_EQ(info.num_tokens, 160);
  ASSERT_EQ(info.num_layers, 5);
  ASSERT_EQ(info.q_heads, 8);
  ASSERT_EQ(info.kv_heads, 4);
  ASSERT_EQ(info.head_dim, 8);
  EXPECT_TRUE(info.has_queries);
  EXPECT_EQ(info.metadata.at("rope"), "applied");
  EXPECT_EQ(info.metadata.at("format"), "kvscope/1");
  ASSERT_EQ(info.tokens.size(), 160u);
  ASSERT_EQ(capture.layers.size(), 5u);

  const int hs = info.head_dim;
  double worst = 0;
  for (int l = 0; l < info.num_layers; ++l) {
    const LayerData& layer = capture.layers[l];
    ASSERT_EQ(layer.keys.size(), 4u);
    ASSERT_EQ(layer.values.size(), 4u);
    ASSERT_EQ(layer.queries.size(), 8u);
    for (int h = 0; h < info.q_heads; ++h) {
      const int kv = info.kv_head_of(h);  // GQA: query heads 2kv, 2kv+1 read kv head kv
      ASSERT_EQ(layer.queries[h].rows(), 160);
      ASSERT_EQ(layer.keys[kv].cols(), hs);
      for (int j = 0; j < info.num_tokens; ++j) {
        const std::vector<double> ref =
            reference_attention(layer.queries[h], layer.keys[kv], layer.values[kv], j);
        for (int i = 0; i < hs; ++i) {
          const double model_out = model.head_outputs(l)(j, h * hs + i);
          worst = std::max(worst, std::abs(model_out - ref[i]) / std::max(1.0, std::abs(ref[i])));
        }
      }
    }
  }
  EXPECT_LT(worst, 1e-5) << "captured q/k/v do not reproduce the model's attention outputs";

  // Mapping query heads to the wrong kv head must break the match (the check has teeth).
  const LayerData& layer1 = capture.layers[1];
  double wrong = 0;
  for (int j = 1; j < 40; ++j) {
    const std::vector<double> ref =
        reference_attention(layer1.queries[0], layer1.keys[1], layer1.values[1], j);
    for (int i = 0; i < hs; ++i)
      wrong = std::max(wrong, std::abs(model.head_outputs(1)(j, i) - ref[i]));
  }
  EXPECT_GT(wrong, 1e-3);
}

TEST(Llama2cModel, KeysCarryRotaryPositions) {
  REQUIRE_STORIES260K();
  // With RoPE applied, the same token at two positions gets different keys, but their pair norms
  // (each rotated (i, i+1) pair keeps its length) agree.
  llama2c::Transformer model(kModelPath);
  const int token = 300;
  model.forward(token, 0);
  model.forward(token, 1);
  model.forward(token, 2);
  // Layer 0 sees the same normalised embedding at every position, so its key at position 2 is
  // its key at position 0 (unrotated) turned by 2 * freq in every pair.
  const MatrixF& k = model.keys(0);
  const int hs = model.config().head_size();
  for (int pair = 0; pair < model.config().kv_dim(); pair += 2) {
    const double n0 = std::hypot(k(0, pair), k(0, pair + 1));
    const double n2 = std::hypot(k(2, pair), k(2, pair + 1));
    EXPECT_NEAR(n0, n2, 1e-5 * std::max(1.0, n0));
    // Angle advanced by 2 * freq between positions 0 and 2.
    const double freq = 1.0 / std::pow(10000.0, static_cast<double>(pair % hs) / hs);
    const double a0 = std::atan2(k(0, pair + 1), k(0, pair));
    const double a2 = std::atan2(k(2, pair + 1), k(2, pair));
    const double diff = std::remainder(a2 - a0 - 2.0 * freq, 2.0 * M_PI);
    if (n0 > 1e-3) {
      EXPECT_NEAR(diff, 0.0, 1e-3) << "pair " << pair;
    }
  }
}

TEST(Llama2cModel, TemperatureSamplingIsReproduciblePerSeed) {
  REQUIRE_STORIES260K();
  llama2c::Transformer model(kModelPath);
  llama2c::Tokenizer tokenizer(kTokenizerPath, model.config().vocab_size);
  llama2c::GenerateOptions options;
  options.steps = 64;
  options.temperature = 1.0f;
  options.seed = 7;
  const auto a = llama2c::generate(model, tokenizer, "", options).tokens;
  const auto b = llama2c::generate(model, tokenizer, "", options).tokens;
  options.seed = 8;
  const auto c = llama2c::generate(model, tokenizer, "", options).tokens;
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
}

TEST(Llama2cModel, RejectsStepsBeyondContextAndPromptLongerThanSteps) {
  REQUIRE_STORIES260K();
  llama2c::Transformer model(kModelPath);
  llama2c::Tokenizer tokenizer(kTokenizerPath, model.config().vocab_size);
  llama2c::GenerateOptions options;
  options.steps = 513;
  // The setting in words (the New capture dialog shows it); the CLI prints the flag.
  expect_input_error([&] { llama2c::generate(model, tokenizer, "", options); }, "steps: 513",
                     "[1, 512]");
  options.steps = 3;
  expect_input_error([&] { llama2c::generate(model, tokenizer, "Once upon a time", options); },
                     "prompt: ", "more than the 3 steps");
  EXPECT_THROW(model.forward(512, 0), InputError);  // token out of vocab
}

TEST(Llama2cModel, CaptureSurvivesWriteAndReopen) {
  REQUIRE_STORIES260K();
  llama2c::Transformer model(kModelPath);
  llama2c::Tokenizer tokenizer(kTokenizerPath, model.config().vocab_size);
  llama2c::GenerateOptions options;
  options.steps = 48;
  const auto g = llama2c::generate(model, tokenizer, "", options);
  const CaptureData capture = llama2c::make_capture(model, g, "stories260K", "", "test_llama2c");
  TempFile file("roundtrip.safetensors");
  write_capture(file.path(), capture, DType::F32);
  auto opened = CaptureFile::open(file.path());
  const CaptureInfo& info = opened->info();
  EXPECT_EQ(info.model, "stories260K");
  EXPECT_EQ(info.num_tokens, 48);
  EXPECT_EQ(info.num_layers, 5);
  EXPECT_EQ(info.q_heads, 8);
  EXPECT_EQ(info.kv_heads, 4);
  EXPECT_EQ(info.head_dim, 8);
  EXPECT_TRUE(info.has_queries);
  EXPECT_EQ(info.tokens, g.text);
  auto layer = opened->layer(3);
  for (int kv = 0; kv < 4; ++kv) {
    EXPECT_EQ(layer->keys[kv], capture.layers[3].keys[kv]);
    EXPECT_EQ(layer->values[kv], capture.layers[3].values[kv]);
  }
  for (int h = 0; h < 8; ++h) EXPECT_EQ(layer->queries[h], capture.layers[3].queries[h]);
}

TEST(Llama2cModel, UnsharedClassifierIsReadFromTheEndOfTheFile) {
  REQUIRE_STORIES260K();
  // The same model stored with vocab_size = -512 and the embedding appended as its own
  // classifier must give the same logits as the shared original.
  std::vector<char> bytes = read_bytes(kModelPath);
  const size_t embedding_bytes = 512 * 64 * sizeof(float);
  const std::vector<char> embedding(bytes.begin() + 28, bytes.begin() + 28 + embedding_bytes);
  const int32_t unshared = -512;
  std::memcpy(bytes.data() + 20, &unshared, 4);
  bytes.insert(bytes.end(), embedding.begin(), embedding.end());
  TempFile file("unshared.bin");
  file.write(bytes);
  llama2c::Transformer shared(kModelPath), separate(file.path());
  EXPECT_FALSE(separate.config().shared_classifier);
  for (int pos = 0; pos < 4; ++pos) {
    const int token = pos == 0 ? llama2c::kBosToken : 300 + pos;
    const std::vector<float> a = shared.forward(token, pos);
    const std::vector<float> b = separate.forward(token, pos);
    EXPECT_EQ(a, b) << pos;
  }
}

// ---- tokenizer

TEST(Llama2cTokenizer, EncodeDecodeRoundTrip) {
  REQUIRE_STORIES260K();
  llama2c::Tokenizer tokenizer(kTokenizerPath, 512);
  EXPECT_EQ(tokenizer.encode("", true, false), std::vector<int>{llama2c::kBosToken});
  for (const std::string text :
       {"Once upon a time, there was a little girl named Lily.", "Tom said: \"Hi!\"\nBye.",
        "caf\xc3\xa9 \xe2\x98\x83 \xe6\x97\xa5\xe6\x9c\xac", "  two  spaces"}) {
    const std::vector<int> tokens = tokenizer.encode(text, true, true);
    ASSERT_GE(tokens.size(), 3u);
    EXPECT_EQ(tokens.front(), llama2c::kBosToken);
    EXPECT_EQ(tokens.back(), llama2c::kEosToken);
    std::string decoded;
    for (size_t i = 1; i + 1 < tokens.size(); ++i)
      decoded += tokenizer.decode(tokens[i - 1], tokens[i]);
    EXPECT_EQ(decoded, text);
    // The pieces (before byte decoding) spell the text with SentencePiece's dummy-prefix space.
    std::string spelled;
    for (size_t i = 1; i + 1 < tokens.size(); ++i) {
      const std::string piece = tokenizer.piece(tokens[i]);
      spelled += piece.size() == 6 && piece.rfind("<0x", 0) == 0
                     ? std::string(1, static_cast<char>(std::stoi(piece.substr(3, 2), nullptr, 16)))
                     : piece;
    }
    EXPECT_EQ(spelled, " " + text);
  }
}

TEST(Llama2cTokenizer, MergesByScoreAndFallsBackToBytes) {
  REQUIRE_STORIES260K();
  llama2c::Tokenizer tokenizer(kTokenizerPath, 512);
  // Common words merge into few tokens; " the" is one piece in tok512.
  const std::vector<int> the = tokenizer.encode("the", false, false);
  ASSERT_EQ(the.size(), 1u);
  EXPECT_EQ(tokenizer.piece(the[0]), " the");
  // Japanese text is not in the 512-piece vocabulary: each byte becomes a <0xXX> token.
  const std::vector<int> nihon = tokenizer.encode("\xe6\x97\xa5", false, false);
  ASSERT_EQ(nihon.size(), 4u);  // dummy space + 3 bytes
  EXPECT_EQ(tokenizer.piece(nihon[1]), "<0xE6>");
  EXPECT_EQ(tokenizer.piece(nihon[2]), "<0x97>");
  EXPECT_EQ(tokenizer.piece(nihon[3]), "<0xA5>");
  // In capture token strings, lone UTF-8 fragments stay readable and BOS is "<s>".
  EXPECT_EQ(tokenizer.token_text(-1, nihon[1]), "<0xE6>");
  EXPECT_EQ(tokenizer.token_text(-1, llama2c::kBosToken), "<s>");
  EXPECT_EQ(tokenizer.token_text(llama2c::kBosToken, the[0]), "the");
}

TEST(Llama2cTokenizer, HeapMergesEqualRunCsRescans) {
  REQUIRE_STORIES260K();
  const std::string tok1024 = std::string(KVSCOPE_SHARED_DIR) + "/models/tok1024.bin";
  std::vector<std::pair<std::string, int>> tokenizers = {{kTokenizerPath, 512}};
  if (fs::exists(tok1024)) tokenizers.push_back({tok1024, 1024});
  const std::vector<std::string> words = {
      "Once",         " upon",  " a",    " time", ",",          " there", " was",     " little",
      " girl",        " named", " Lily", ".",     "\n",         " ",      "  ",       "the",
      "aaaa",         "ababab", "In",    " the",  " beginning", " God",   " created", "caf\xc3\xa9",
      "\xe6\x97\xa5", "\xff",   "\x80",  "\xc3",  "!!"};
  uint64_t state = 12345;
  auto next = [&state] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<uint32_t>(state >> 33);
  };
  for (const auto& [path, vocab] : tokenizers) {
    llama2c::Tokenizer tokenizer(path, vocab);
    for (int trial = 0; trial < 200; ++trial) {
      std::string text;
      const int parts = static_cast<int>(next() % 40);
      for (int p = 0; p < parts; ++p) {
        if (next() % 8 == 0)
          text.push_back(static_cast<char>(next() % 256));  // any byte, UTF-8 or not
        else
          text += words[next() % words.size()];
      }
      EXPECT_EQ(tokenizer.encode(text, true, false),
                llama2c::reference::run_c_encode(tokenizer, text, true, true).value())
          << path << " text '" << text << "'";
      EXPECT_EQ(tokenizer.encode_continuation(text),
                llama2c::reference::run_c_encode(tokenizer, text, false, false).value())
          << path << " continuation '" << text << "'";
    }
  }
}

TEST(Llama2cTokenizer, LongTextEncodesWithoutQuadraticRescans) {
  // 256 KiB of text: run.c's rescans would take hours (a 1 MiB --continuation, or a 120 KiB
  // --prompt, hung generate and capture); the heap-ordered merges take a fraction of a second.
  // The ctest timeout is the hang guard.
  REQUIRE_STORIES260K();
  llama2c::Tokenizer tokenizer(kTokenizerPath, 512);
  std::string text;
  while (text.size() < (1u << 18)) text += "Once upon a time, there was a little girl. ";
  const std::vector<int> tokens = tokenizer.encode_continuation(text);
  std::string decoded;
  for (size_t i = 0; i < tokens.size(); ++i)
    decoded += tokenizer.decode(i == 0 ? -1 : tokens[i - 1], tokens[i]);
  EXPECT_EQ(decoded, text);
  EXPECT_LT(tokens.size(), text.size() / 2);  // merged, not one token per byte
}

// ---- malformed files

TEST(Llama2cMalformed, MissingFiles) {
  const std::string missing = (fs::temp_directory_path() / "kvscope_no_such_model.bin").string();
  expect_input_error([&] { llama2c::Transformer m(missing); }, missing, "cannot open");
  expect_input_error([&] { llama2c::Tokenizer t(missing, 512); }, missing, "cannot open");
  const std::string directory = fs::temp_directory_path().string();
  expect_input_error([&] { llama2c::Transformer m(directory); }, directory, "not a regular file");
}

TEST(Llama2cMalformed, CheckpointErrorsNameTheFileAndProblem) {
  REQUIRE_STORIES260K();
  const std::vector<char> good = read_bytes(kModelPath);
  ASSERT_GT(good.size(), 1000u);
  TempFile file("bad_model.bin");
  auto load = [&] { llama2c::Transformer m(file.path()); };

  file.write(std::vector<char>(good.begin(), good.begin() + 10));
  expect_input_error(load, file.path(), "shorter than the 28-byte Config header");

  file.write(std::vector<char>(good.begin(), good.end() - 100));
  expect_input_error(load, file.path(), "truncated");

  std::vector<char> longer = good;
  longer.resize(good.size() + 4, 0);
  file.write(longer);
  expect_input_error(load, file.path(), "trailing bytes");

  auto with_field = [&](int index, int32_t value) {
    std::vector<char> bytes = good;
    std::memcpy(bytes.data() + 4 * index, &value, 4);
    return bytes;
  };
  file.write(with_field(3, 3));  // n_heads 3 does not divide dim 64
  expect_input_error(load, file.path(), "dim must be a multiple of n_heads");
  file.write(with_field(4, 3));  // n_kv_heads 3 does not divide n_heads 8
  expect_input_error(load, file.path(), "n_kv_heads must divide n_heads");
  file.write(with_field(0, -64));
  expect_input_error(load, file.path(), "dim must be");
  file.write(with_field(2, 6));  // one layer more than the weights hold
  expect_input_error(load, file.path(), "needs");
  file.write(with_field(5, -512));  // unshared classifier: needs vocab * dim more floats
  expect_input_error(load, file.path(), "truncated or config mismatch");
  file.write(with_field(0, 0x616b3432));
  expect_input_error(load, file.path(), "version 1/2 export");

  std::vector<char> nan_weights = good;
  const float nan = NAN;
  std::memcpy(nan_weights.data() + 28 + 4 * 100, &nan, 4);
  file.write(nan_weights);
  expect_input_error(load, file.path(), "NaN");
}

TEST(Llama2cMalformed, TokenizerErrorsNameTheFileAndProblem) {
  REQUIRE_STORIES260K();
  const std::vector<char> good = read_bytes(kTokenizerPath);
  TempFile file("bad_tok.bin");
  auto load = [&] { llama2c::Tokenizer t(file.path(), 512); };

  file.write(std::vector<char>(good.begin(), good.begin() + 2));
  expect_input_error(load, file.path(), "no max_token_length header");

  file.write(std::vector<char>(good.begin(), good.end() - 3));
  expect_input_error(load, file.path(), "token 511 of 512");

  file.write(std::vector<char>(good.begin(), good.begin() + 4 + 8 + 2));
  expect_input_error(load, file.path(), "truncated inside");

  std::vector<char> bad_header = good;
  const int32_t negative = -1;
  std::memcpy(bad_header.data(), &negative, 4);
  file.write(bad_header);
  expect_input_error(load, file.path(), "max_token_length");

  std::vector<char> bad_length = good;
  const int32_t huge = 1 << 20;
  std::memcpy(bad_length.data() + 4 + 4, &huge, 4);  // token 0's length
  file.write(bad_length);
  expect_input_error(load, file.path(), "token 0 of 512");

  file.write(good);  // a 512-token file read for a 256-token model leaves bytes over
  expect_input_error([&] { llama2c::Tokenizer t(file.path(), 256); }, file.path(),
                     "does not match the model's vocab_size");
}

// ---- the CLI command

TEST(Llama2cCli, CaptureCommandWritesAnOpenableCapture) {
  REQUIRE_STORIES260K();
  TempFile out("cli.safetensors");
  const std::string command = std::string(KVSCOPE_CLI) + " capture --model " + kModelPath +
                              " --tokenizer " + kTokenizerPath +
                              " --prompt \"Once upon a time\" --steps 32 --quiet --out " +
                              out.path() + " > /dev/null 2>&1";
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
  auto opened = CaptureFile::open(out.path());
  EXPECT_EQ(opened->info().num_tokens, 32);
  EXPECT_EQ(opened->info().prompt, "Once upon a time");
  EXPECT_EQ(opened->info().source, "kvscope-cli capture (llama2.c forward pass)");

  const std::string bad = std::string(KVSCOPE_CLI) + " capture --model " + kModelPath +
                          " --tokenizer " + kTokenizerPath + " --steps 9999 --quiet --out " +
                          out.path() + " > /dev/null 2>&1";
  const int status = std::system(bad.c_str());
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << status;
}

// The sample captures are reproducible: `kvscope-cli capture` with the commands of
// sample_data/README.md writes the committed files byte for byte (greedy stories260K, and kjv3M
// sampled with a fixed Philox seed), so a change to the forward pass or the writer that would
// silently alter them (and the golden data derived from them) fails here.
TEST(Llama2cCli, RegeneratesTheSampleCapturesByteForByte) {
  const std::string models = std::string(KVSCOPE_SHARED_DIR) + "/models/";
  if (!fs::exists(models + "kjv3M.bin")) GTEST_SKIP() << models << "kjv3M.bin not found";
  struct Sample {
    const char* file;
    std::string args;
  };
  const Sample samples[] = {
      {"stories260K_lily.safetensors", "--model " + models + "stories260K.bin --tokenizer " +
                                           models + "tok512.bin --prompt '' --steps 480"},
      {"stories260K_dragon.safetensors",
       "--model " + models + "stories260K.bin --tokenizer " + models +
           "tok512.bin --prompt 'Once upon a time, there was a brave little dragon' --steps 480"},
      {"kjv3M_beginning.safetensors",
       "--model " + models + "kjv3M.bin --tokenizer " + models +
           "tok1024.bin --prompt 'In the beginning' --steps 512 --temperature 0.8 --topp 0.9 "
           "--seed 0 --dtype f16"},
  };
  for (const Sample& s : samples) {
    TempFile out(std::string("regen_") + s.file);
    const std::string command = std::string(KVSCOPE_CLI) + " capture " + s.args +
                                " --quiet --out " + out.path() + " > /dev/null 2>&1";
    ASSERT_EQ(std::system(command.c_str()), 0) << command;
    const std::vector<char> made = read_bytes(out.path());
    const std::vector<char> committed =
        read_bytes(std::string(KVSCOPE_SOURCE_DIR) + "/sample_data/" + s.file);
    ASSERT_FALSE(committed.empty()) << s.file << " is missing from sample_data/";
#ifdef KVSCOPE_NATIVE_BUILD
    // The sample captures were written by the portable build. A -march=native build runs the
    // forward pass's GEMVs through Eigen's wider SIMD path, which sums in another order, so its
    // floats differ in the last bits: the same tokens and header, tensors equal to float rounding.
    auto a = CaptureFile::open(out.path());
    auto b = CaptureFile::open(std::string(KVSCOPE_SOURCE_DIR) + "/sample_data/" + s.file);
    EXPECT_EQ(a->info().tokens, b->info().tokens) << s.file;
    EXPECT_EQ(made.size(), committed.size()) << s.file;
    ASSERT_EQ(a->info().num_layers, b->info().num_layers);
    for (int L = 0; L < a->info().num_layers; ++L) {
      auto la = a->layer(L), lb = b->layer(L);
      for (size_t h = 0; h < la->keys.size(); ++h) {
        EXPECT_LE((la->keys[h] - lb->keys[h]).norm(), 1e-3 * lb->keys[h].norm()) << s.file;
        EXPECT_LE((la->values[h] - lb->values[h]).norm(), 1e-3 * lb->values[h].norm()) << s.file;
      }
      for (size_t h = 0; h < la->queries.size(); ++h)
        EXPECT_LE((la->queries[h] - lb->queries[h]).norm(), 1e-3 * lb->queries[h].norm()) << s.file;
    }
#else
    EXPECT_TRUE(made == committed) << s.file << " differs when regenerated (" << made.size()
                                   << " vs " << committed.size() << " bytes)";
#endif
  }
}
