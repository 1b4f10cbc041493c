// A llama2.c model on the CPU (Karpathy's run.c, legacy "version 0" checkpoint format): loader,
// SentencePiece-style BPE tokenizer, forward pass with a capture hook, greedy/temperature
// sampling, and conversion of the recorded activations into a KVScope capture (docs/capturing.md).
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
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/core/tensor.h"
#include "engine/io/capture.h"

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

// One (layer, kv head) of a compressed cache: the cache entries that stand for the positions
// before CompressedCache::covered, in position order, each with the logit biases it enters
// attention with (log of the method's weight; numerator and denominator differ only for methods
// with separate selections, -infinity = absent from that sum).
struct CompressedHead {
  std::vector<int> positions;
  std::vector<float> num_logw, den_logw;
  bool separate = false;  // some entry has num_logw != den_logw
};

// A compressed KV cache: positions [0, covered) are read through heads[layer][kv head]; positions
// from `covered` on (run after the compression) are read in full at weight 1.
struct CompressedCache {
  int covered = 0;
  std::vector<std::vector<CompressedHead>> heads;  // [layer][kv head]
};

class Transformer {
 public:
  // Reads and validates a checkpoint. Throws InputError naming `path` and the problem (missing
  // file, truncated header, impossible config, file size that does not match the config).
  explicit Transformer(const std::string& path);
  // Copies share the (read-only) weights and copy the cache, so a run can branch at a position:
  // compressed continuations start from copies of the exact run.
  Transformer(const Transformer&) = default;
  Transformer& operator=(const Transformer&) = default;

  const Config& config() const { return config_; }
  const std::string& path() const { return path_; }

  // Runs `token` at position `pos` and returns the logits (vocab_size floats). Positions are
  // fed in order: pos must be <= positions() (re-running a position drops everything after it).
  // Throws InputError for a token or position out of range.
  const std::vector<float>& forward(int token, int pos);

  // Number of positions whose keys/values (and recorded activations) are valid.
  int positions() const { return positions_; }

  // From now on attention reads the cache through `cache` (see CompressedCache); every key and
  // value stays stored, the compression only decides what attention sees. cache.covered must be
  // <= positions() and every entry's position < covered. Throws std::invalid_argument otherwise.
  // Re-running a position below `covered` is not allowed while a compressed cache is set.
  void set_compressed_cache(CompressedCache cache);
  // Back to the full cache.
  void clear_compressed_cache() { compressed_ = {}; }
  const CompressedCache& compressed_cache() const { return compressed_; }
  bool is_compressed() const { return !compressed_.heads.empty(); }

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
  // Query head h's slice of the layer's output projection, transposed: head_size x dim, row c
  // is what channel c of the head's output adds to the residual stream (the capture's
  // layers.L.wo, docs/capture-format.md).
  MatrixF output_projection(int layer, int head) const;

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

  // Attention of one query head (qh, head_size floats) at `pos` through the compressed cache.
  void attend_compressed(int layer, int kv_head, const float* qh, int pos, float* out);

  std::string path_;
  Config config_;
  std::shared_ptr<const std::vector<float>> data_;  // every float after the header, file order
  const float* token_embedding_ = nullptr;
  const float* rms_final_ = nullptr;
  const float* classifier_ = nullptr;
  std::vector<LayerWeights> layers_;

  int positions_ = 0;
  CompressedCache compressed_;
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
  const std::string& path() const { return path_; }
  const std::string& piece(int token) const { return pieces_.at(token); }
  float score(int token) const { return scores_.at(token); }

  // run.c's encode: optional BOS, the dummy-prefix space (for non-empty text), one token per
  // UTF-8 code point (byte-fallback tokens <0xXX> for code points not in the vocabulary), then
  // greedy merges of the adjacent pair whose merged piece has the highest score.
  std::vector<int> encode(const std::string& text, bool bos, bool eos) const;
  // Text that follows an already encoded prompt: encode() without BOS and without the dummy
  // prefix (the text is taken verbatim, so a continuation after a word starts with its space).
  std::vector<int> encode_continuation(const std::string& text) const;

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
  // run.c's BPE merges, in run.c's order (O(n log n) instead of its O(n^2) rescans).
  void merge_pairs(std::vector<int>& tokens) const;
  std::vector<int> encode_text(const std::string& text, bool bos, bool eos,
                               bool dummy_prefix) const;
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
