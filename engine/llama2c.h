// A llama2.c model on the CPU (Karpathy's run.c, legacy "version 0" checkpoint format): loader,
// SentencePiece-style BPE tokenizer, forward pass with a capture hook, greedy/temperature
// sampling, and conversion of the recorded activations into a KVScope capture (DESIGN.md 2.2).
//
// The forward pass follows run.c operation by operation (RMSNorm with eps 1e-5, RoPE on
// adjacent pairs (i, i+1) inside each head with frequency 1 / 10000^(i_in_head / head_size),
// GQA, SwiGLU FFN, float32 throughout), so it produces run.c's greedy text. Matrix-vector
// products go through Eigen, so float sums are reassociated: logits agree with run.c to
// rounding, not bit for bit.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/capture.h"
#include "engine/tensor.h"

namespace kvscope::llama2c {

// The 7 int32 header of a llama2.c checkpoint.
struct Config {
  int dim = 0;
  int hidden_dim = 0;
  int n_layers = 0;
  int n_heads = 0;
  int n_kv_heads = 0;
  int vocab_size = 0;  // absolute value of the stored field
  int seq_len = 0;
  bool shared_classifier = true;  // stored vocab_size > 0: the classifier reuses the embedding

  int head_size() const { return dim / n_heads; }
  int kv_dim() const { return head_size() * n_kv_heads; }
  int kv_group() const { return n_heads / n_kv_heads; }  // query heads per kv head
};

// Token ids fixed by the llama2.c / SentencePiece convention.
constexpr int kBosToken = 1;
constexpr int kEosToken = 2;

class Transformer {
 public:
  // Reads and validates a checkpoint. Throws InputError naming `path` and the problem (missing
  // file, truncated header, impossible config, file size that does not match the config).
  explicit Transformer(const std::string& path);

  const Config& config() const { return config_; }
  const std::string& path() const { return path_; }

  // Runs `token` at position `pos` and returns the logits (vocab_size floats). Positions are
  // fed in order: pos must be <= positions() (re-running a position drops everything after it).
  // Throws InputError for a token or position out of range.
  const std::vector<float>& forward(int token, int pos);

  // Number of positions whose keys/values (and recorded activations) are valid.
  int positions() const { return positions_; }

  // Per layer, row t = position t (the matrices grow as positions run; only the first
  // positions() rows are valid):
  // keys/values after RoPE as attention uses them, columns = kv head * head_size + i.
  const MatrixF& keys(int layer) const { return key_cache_[layer]; }
  const MatrixF& values(int layer) const { return value_cache_[layer]; }
  // Queries after RoPE, columns = query head * head_size + i. Recorded at every forward.
  const MatrixF& queries(int layer) const { return query_record_[layer]; }
  // Each head's attention output softmax(q k^T / sqrt(d)) v (before the output projection),
  // columns = query head * head_size + i. Kept so tests can check captures against the model.
  const MatrixF& head_outputs(int layer) const { return head_output_record_[layer]; }

 private:
  struct LayerWeights {
    const float* rms_att;  // dim
    const float* wq;       // (n_heads * head_size) x dim, row-major
    const float* wk;       // kv_dim x dim
    const float* wv;       // kv_dim x dim
    const float* wo;       // dim x (n_heads * head_size)
    const float* rms_ffn;  // dim
    const float* w1;       // hidden_dim x dim
    const float* w2;       // dim x hidden_dim
    const float* w3;       // hidden_dim x dim
  };

  std::string path_;
  Config config_;
  std::vector<float> data_;  // every float after the header, in file order
  const float* token_embedding_ = nullptr;
  const float* rms_final_ = nullptr;
  const float* classifier_ = nullptr;
  std::vector<LayerWeights> layers_;

  int positions_ = 0;
  std::vector<MatrixF> key_cache_, value_cache_, query_record_, head_output_record_;
  // Scratch buffers, sized once.
  std::vector<float> x_, xb_, xb2_, hb_, hb2_, q_, att_, logits_;
};

// llama2.c's tokenizer file (tokenizer.bin / tok512.bin): int32 max_token_length, then for each
// of vocab_size tokens: float score, int32 byte length, the bytes.
class Tokenizer {
 public:
  // `vocab_size` comes from the model's config; the file must hold exactly that many tokens.
  // Throws InputError naming `path` and the problem.
  Tokenizer(const std::string& path, int vocab_size);

  int vocab_size() const { return static_cast<int>(pieces_.size()); }
  const std::string& piece(int token) const { return pieces_.at(token); }
  float score(int token) const { return scores_.at(token); }

  // run.c's encode: optional BOS, the dummy-prefix space (for non-empty text), one token per
  // UTF-8 code point (byte-fallback tokens <0xXX> for code points not in the vocabulary), then
  // greedy merges of the adjacent pair whose merged piece has the highest score.
  std::vector<int> encode(const std::string& text, bool bos, bool eos) const;

  // run.c's decode: the piece's bytes, with the leading space dropped right after BOS and
  // <0xXX> byte tokens turned into that raw byte.
  std::string decode(int prev_token, int token) const;

  // Text shown for a token in a capture: decode(), except that BOS/EOS read "<s>"/"</s>" and a
  // byte token that is not a complete UTF-8 character on its own stays "<0xXX>" (a capture's
  // token list is JSON and must be valid UTF-8).
  std::string token_text(int prev_token, int token) const;

 private:
  std::string path_;
  int max_token_length_ = 0;
  std::vector<std::string> pieces_;
  std::vector<float> scores_;
  std::unordered_map<std::string, int> lookup_;  // piece -> lowest id with that piece
  int byte_token_[256];                          // id of "<0xXX>", -1 when absent

  int find(const std::string& s) const;
};

struct GenerateOptions {
  int steps = 256;          // positions in total, BOS and prompt included (as run.c's -n)
  float temperature = 0.f;  // 0: greedy (argmax)
  float topp = 0.9f;        // nucleus sampling when temperature > 0 (run.c's default); 1 = off
  uint64_t seed = 0;        // Philox stream (random.h) for temperature sampling
  // Called after each position has been run: position, its token, its decoded text.
  std::function<void(int pos, int token, const std::string& text)> on_token;
  const std::atomic<bool>* cancel = nullptr;
};

struct Generation {
  std::vector<int> tokens;        // the token fed at each position (tokens[0] = BOS)
  std::vector<std::string> text;  // token_text() of each position
  std::string decoded;            // run.c-style decoded text of the whole run
  int prompt_tokens = 0;          // BOS + encoded prompt
  int restarts = 0;               // times the model emitted BOS and generation went on after it
};

// Feeds BOS + encode(prompt) through the model, then samples until `steps` positions have run.
// Unlike run.c, which stops when the model emits BOS (end of a story), generation continues
// after it: the BOS is fed at the next position and the model starts a new story with the old
// one still in context, so a capture always has `steps` positions. Throws InputError when
// steps is out of [1, seq_len] or shorter than the prompt.
Generation generate(Transformer& model, const Tokenizer& tokenizer, const std::string& prompt,
                    const GenerateOptions& options);

// The activations of positions [0, model.positions()) as a capture: per layer keys/values per kv
// head, queries per query head, token strings, metadata (format kvscope/1, rope applied).
CaptureData make_capture(const Transformer& model, const Generation& generation,
                         const std::string& model_name, const std::string& prompt,
                         const std::string& source);

// Model name for a checkpoint path: the file name without directory and extension.
std::string model_name_from_path(const std::string& path);

}  // namespace kvscope::llama2c
