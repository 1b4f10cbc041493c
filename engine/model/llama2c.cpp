#include "engine/model/llama2c.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <queue>
#include <stdexcept>

#include "engine/core/error.h"
#include "engine/core/random.h"

namespace kvscope::llama2c {

namespace {

// llama2.c's newer export formats (version 1 and 2) start with this magic instead of a Config.
constexpr uint32_t kLlama2cMagic = 0x616b3432;  // "ak42"

// Opens `path` positioned at its end (tellg() = size). A directory would open on Linux and
// report a bogus size, so anything but a regular file is refused up front.
std::ifstream open_at_end(const std::string& path, const char* what) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    throw InputError(path + ": cannot open " + what + ": " +
                     (std::filesystem::exists(path, ec) ? "not a regular file" : "no such file"));
  }
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw InputError(path + ": cannot open " + what);
  return in;
}

std::vector<char> read_whole_file(const std::string& path, const char* what) {
  std::ifstream in = open_at_end(path, what);
  const std::streamoff size = in.tellg();
  std::vector<char> bytes(static_cast<size_t>(size));
  in.seekg(0);
  if (size > 0 && !in.read(bytes.data(), size)) throw InputError(path + ": cannot read " + what);
  return bytes;
}

std::string config_string(const Config& c) {
  return "dim " + std::to_string(c.dim) + ", hidden_dim " + std::to_string(c.hidden_dim) +
         ", n_layers " + std::to_string(c.n_layers) + ", n_heads " + std::to_string(c.n_heads) +
         ", n_kv_heads " + std::to_string(c.n_kv_heads) + ", vocab_size " +
         std::to_string(c.shared_classifier ? c.vocab_size : -c.vocab_size) + ", seq_len " +
         std::to_string(c.seq_len);
}

// run.c's rmsnorm, float for float.
void rmsnorm(float* out, const float* x, const float* weight, int size) {
  float ss = 0.0f;
  for (int j = 0; j < size; ++j) ss += x[j] * x[j];
  ss /= static_cast<float>(size);
  ss += 1e-5f;
  ss = 1.0f / std::sqrt(ss);
  for (int j = 0; j < size; ++j) out[j] = weight[j] * (ss * x[j]);
}

// out (d) = W (d x n, row-major) x (n).
void matmul(float* out, const float* x, const float* w, int n, int d) {
  using RowMajorMap = Eigen::Map<const MatrixF>;
  Eigen::Map<VectorF>(out, d).noalias() = RowMajorMap(w, d, n) * Eigen::Map<const VectorF>(x, n);
}

// run.c's softmax, in place over x[0, size).
void softmax(float* x, int size) {
  float max_val = x[0];
  for (int i = 1; i < size; ++i) max_val = std::max(max_val, x[i]);
  float sum = 0.0f;
  for (int i = 0; i < size; ++i) {
    x[i] = std::exp(x[i] - max_val);
    sum += x[i];
  }
  for (int i = 0; i < size; ++i) x[i] /= sum;
}

// "<0xAB>" -> 0xAB, else -1.
int parse_byte_piece(const std::string& piece) {
  if (piece.size() != 6 || piece.compare(0, 3, "<0x") != 0 || piece[5] != '>') return -1;
  int value = 0;
  for (int i = 3; i < 5; ++i) {
    const char c = piece[i];
    int digit;
    if (c >= '0' && c <= '9') {
      digit = c - '0';
    } else if (c >= 'A' && c <= 'F') {
      digit = c - 'A' + 10;
    } else if (c >= 'a' && c <= 'f') {
      digit = c - 'a' + 10;
    } else {
      return -1;
    }
    value = value * 16 + digit;
  }
  return value;
}

// run.c's samplers. `coin` is uniform in [0, 1).
int sample_argmax(const std::vector<float>& p) {
  return static_cast<int>(std::max_element(p.begin(), p.end()) - p.begin());
}

int sample_mult(const std::vector<float>& probabilities, float coin) {
  float cdf = 0.0f;
  const int n = static_cast<int>(probabilities.size());
  for (int i = 0; i < n; ++i) {
    cdf += probabilities[i];
    if (coin < cdf) return i;
  }
  return n - 1;  // rounding errors
}

int sample_topp(const std::vector<float>& probabilities, float topp, float coin) {
  // Nucleus sampling: the smallest set of tokens whose probability exceeds topp. Tokens below
  // (1 - topp) / (n - 1) can never be part of it and are dropped before sorting (as run.c).
  const int n = static_cast<int>(probabilities.size());
  const float cutoff = (1.0f - topp) / static_cast<float>(std::max(1, n - 1));
  std::vector<std::pair<float, int>> candidates;
  for (int i = 0; i < n; ++i) {
    if (probabilities[i] >= cutoff) candidates.emplace_back(probabilities[i], i);
  }
  std::stable_sort(candidates.begin(), candidates.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  float cumulative = 0.0f;
  size_t last = candidates.size() - 1;
  for (size_t i = 0; i < candidates.size(); ++i) {
    cumulative += candidates[i].first;
    if (cumulative > topp) {
      last = i;
      break;
    }
  }
  const float r = coin * cumulative;
  float cdf = 0.0f;
  for (size_t i = 0; i <= last; ++i) {
    cdf += candidates[i].first;
    if (r < cdf) return candidates[i].second;
  }
  return candidates[last].second;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Transformer

Transformer::Transformer(const std::string& path) : path_(path) {
  // The weights are read straight into data_ (no second copy: stories110M is 440 MB).
  std::ifstream in = open_at_end(path, "llama2.c checkpoint");
  const uint64_t file_bytes = static_cast<uint64_t>(in.tellg());
  in.seekg(0);
  constexpr size_t kHeaderBytes = 7 * sizeof(int32_t);
  if (file_bytes < kHeaderBytes) {
    throw InputError(path + ": truncated llama2.c checkpoint: " + std::to_string(file_bytes) +
                     " bytes, shorter than the 28-byte Config header");
  }
  int32_t header[7];
  if (!in.read(reinterpret_cast<char*>(header), kHeaderBytes)) {
    throw InputError(path + ": cannot read the llama2.c Config header");
  }
  if (static_cast<uint32_t>(header[0]) == kLlama2cMagic) {
    throw InputError(path +
                     ": llama2.c version 1/2 export (magic \"ak42\"); KVScope reads the legacy "
                     "version 0 format that run.c reads (export with --version 0)");
  }
  Config& c = config_;
  c.dim = header[0];
  c.hidden_dim = header[1];
  c.n_layers = header[2];
  c.n_heads = header[3];
  c.n_kv_heads = header[4];
  c.shared_classifier = header[5] > 0;
  c.vocab_size = header[5] == INT32_MIN ? 0 : std::abs(header[5]);
  c.seq_len = header[6];

  // Bounds far above any llama2.c model, so garbage headers fail here and sizes cannot overflow.
  auto check = [&](bool ok, const std::string& problem) {
    if (!ok) {
      throw InputError(path + ": bad llama2.c Config header (" + config_string(c) +
                       "): " + problem);
    }
  };
  check(c.dim > 0 && c.dim <= (1 << 16), "dim must be in [1, 65536]");
  check(c.hidden_dim > 0 && c.hidden_dim <= (1 << 18), "hidden_dim must be in [1, 262144]");
  check(c.n_layers > 0 && c.n_layers <= 1024, "n_layers must be in [1, 1024]");
  check(c.n_heads > 0 && c.n_heads <= c.dim, "n_heads must be in [1, dim]");
  check(c.dim % c.n_heads == 0, "dim must be a multiple of n_heads");
  check(c.head_size() % 2 == 0, "head size dim / n_heads must be even for RoPE");
  check(c.n_kv_heads > 0 && c.n_kv_heads <= c.n_heads && c.n_heads % c.n_kv_heads == 0,
        "n_kv_heads must divide n_heads");
  check(c.vocab_size > 0 && c.vocab_size <= (1 << 22), "|vocab_size| must be in [1, 4194304]");
  check(c.seq_len > 0 && c.seq_len <= (1 << 20), "seq_len must be in [1, 1048576]");

  // Float counts in run.c's memory_map_weights order.
  const uint64_t dim = c.dim, hidden = c.hidden_dim, layers = c.n_layers, vocab = c.vocab_size;
  const uint64_t q_dim = static_cast<uint64_t>(c.n_heads) * c.head_size();
  const uint64_t kv_dim = c.kv_dim();
  const uint64_t head_size = c.head_size(), seq_len = c.seq_len;
  const uint64_t per_layer = dim /*rms_att*/ + dim * q_dim + 2 * dim * kv_dim + q_dim * dim +
                             dim /*rms_ffn*/ + 3 * dim * hidden;
  const uint64_t expected_floats = vocab * dim + layers * per_layer + dim /*rms_final*/ +
                                   seq_len * head_size /*unused freq_cis_real + freq_cis_imag*/ +
                                   (c.shared_classifier ? 0 : vocab * dim);
  const uint64_t expected_bytes = kHeaderBytes + expected_floats * sizeof(float);
  if (file_bytes != expected_bytes) {
    const std::string what = file_bytes < expected_bytes ? "truncated or config mismatch"
                                                         : "trailing bytes or config mismatch";
    throw InputError(path + ": " + what + ": the file has " + std::to_string(file_bytes) +
                     " bytes but its Config (" + config_string(c) + ") needs " +
                     std::to_string(expected_bytes));
  }
  auto weights = std::make_shared<std::vector<float>>(expected_floats);
  if (!in.read(reinterpret_cast<char*>(weights->data()),
               static_cast<std::streamsize>(expected_floats * sizeof(float)))) {
    throw InputError(path + ": cannot read the checkpoint weights");
  }
  for (float v : *weights) {
    if (!std::isfinite(v)) throw InputError(path + ": checkpoint weights contain NaN or Inf");
  }
  data_ = weights;

  // Weights are stored tensor by tensor, each tensor holding all layers.
  const float* ptr = data_->data();
  auto take = [&ptr](uint64_t count) {
    const float* p = ptr;
    ptr += count;
    return p;
  };
  token_embedding_ = take(vocab * dim);
  layers_.resize(c.n_layers);
  for (auto& l : layers_) l.rms_att = take(dim);
  for (auto& l : layers_) l.wq = take(dim * q_dim);
  for (auto& l : layers_) l.wk = take(dim * kv_dim);
  for (auto& l : layers_) l.wv = take(dim * kv_dim);
  for (auto& l : layers_) l.wo = take(q_dim * dim);
  for (auto& l : layers_) l.rms_ffn = take(dim);
  for (auto& l : layers_) l.w1 = take(dim * hidden);
  for (auto& l : layers_) l.w2 = take(hidden * dim);
  for (auto& l : layers_) l.w3 = take(dim * hidden);
  rms_final_ = take(dim);
  take(seq_len * head_size);  // freq_cis_real and freq_cis_imag: RoPE is computed instead
  classifier_ = c.shared_classifier ? token_embedding_ : take(vocab * dim);

  // The per-position records start empty and grow with the positions actually run (a header may
  // claim a long seq_len that no capture uses).
  key_cache_.assign(c.n_layers, MatrixF(0, c.kv_dim()));
  value_cache_.assign(c.n_layers, MatrixF(0, c.kv_dim()));
  query_record_.assign(c.n_layers, MatrixF(0, q_dim));
  head_output_record_.assign(c.n_layers, MatrixF(0, q_dim));
  x_.resize(c.dim);
  xb_.resize(std::max<uint64_t>(dim, q_dim));
  xb2_.resize(c.dim);
  hb_.resize(c.hidden_dim);
  hb2_.resize(c.hidden_dim);
  q_.resize(q_dim);
  att_.resize(c.seq_len);
  logits_.resize(c.vocab_size);
}

const std::vector<float>& Transformer::forward(int token, int pos) {
  const Config& c = config_;
  if (token < 0 || token >= c.vocab_size) {
    throw InputError(path_ + ": token id " + std::to_string(token) + " out of range [0, " +
                     std::to_string(c.vocab_size) + ")");
  }
  if (pos < 0 || pos >= c.seq_len) {
    throw InputError(path_ + ": position " + std::to_string(pos) +
                     " is outside the model's context [0, seq_len " + std::to_string(c.seq_len) +
                     ")");
  }
  if (pos > positions_) {
    throw std::invalid_argument("llama2c::Transformer::forward: position " + std::to_string(pos) +
                                " run before position " + std::to_string(positions_));
  }
  if (is_compressed() && pos < compressed_.covered) {
    throw std::invalid_argument("llama2c::Transformer::forward: position " + std::to_string(pos) +
                                " is inside the compressed part of the cache");
  }
  if (pos >= key_cache_[0].rows()) {
    // Double the rows (capped at seq_len); row-major conservativeResize keeps earlier rows.
    const Eigen::Index rows =
        std::min<Eigen::Index>(c.seq_len, std::max<Eigen::Index>(64, 2 * key_cache_[0].rows()));
    for (int l = 0; l < c.n_layers; ++l) {
      key_cache_[l].conservativeResize(rows, Eigen::NoChange);
      value_cache_[l].conservativeResize(rows, Eigen::NoChange);
      query_record_[l].conservativeResize(rows, Eigen::NoChange);
      head_output_record_[l].conservativeResize(rows, Eigen::NoChange);
    }
  }

  const int dim = c.dim, kv_dim = c.kv_dim(), head_size = c.head_size();
  const int q_dim = c.n_heads * head_size, hidden = c.hidden_dim, kv_mul = c.kv_group();
  const float inv_sqrt_head = 1.0f / std::sqrt(static_cast<float>(head_size));
  float* x = x_.data();
  std::memcpy(x, token_embedding_ + static_cast<size_t>(token) * dim, dim * sizeof(float));

  for (int l = 0; l < c.n_layers; ++l) {
    const LayerWeights& w = layers_[l];
    float* xb = xb_.data();
    float* q = q_.data();
    float* k = key_cache_[l].row(pos).data();
    float* v = value_cache_[l].row(pos).data();
    rmsnorm(xb, x, w.rms_att, dim);
    matmul(q, xb, w.wq, dim, q_dim);
    matmul(k, xb, w.wk, dim, kv_dim);
    matmul(v, xb, w.wv, dim, kv_dim);

    // RoPE as run.c applies it: rotate pairs (i, i+1); the angle depends on i's offset inside
    // its head. Keys occupy the first kv_dim entries, so pairs beyond that rotate q only.
    for (int i = 0; i < q_dim; i += 2) {
      const int head_dim = i % head_size;
      const float freq =
          1.0f / std::pow(10000.0f, static_cast<float>(head_dim) / static_cast<float>(head_size));
      const float angle = static_cast<float>(pos) * freq;
      const float fcr = std::cos(angle), fci = std::sin(angle);
      const int rotations = i < kv_dim ? 2 : 1;
      for (int r = 0; r < rotations; ++r) {
        float* vec = r == 0 ? q : k;
        const float v0 = vec[i], v1 = vec[i + 1];
        vec[i] = v0 * fcr - v1 * fci;
        vec[i + 1] = v0 * fci + v1 * fcr;
      }
    }
    std::memcpy(query_record_[l].row(pos).data(), q, q_dim * sizeof(float));

    // Causal multi-head attention with GQA: query head h reads kv head h / kv_mul.
    for (int h = 0; h < c.n_heads; ++h) {
      const float* qh = q + h * head_size;
      if (is_compressed()) {
        attend_compressed(l, h / kv_mul, qh, pos, xb + h * head_size);
        continue;
      }
      const int kv_offset = (h / kv_mul) * head_size;
      float* att = att_.data();
      for (int t = 0; t <= pos; ++t) {
        const float* kt = key_cache_[l].row(t).data() + kv_offset;
        float score = 0.0f;
        for (int i = 0; i < head_size; ++i) score += qh[i] * kt[i];
        att[t] = score * inv_sqrt_head;
      }
      softmax(att, pos + 1);
      float* out = xb + h * head_size;
      std::fill(out, out + head_size, 0.0f);
      for (int t = 0; t <= pos; ++t) {
        const float* vt = value_cache_[l].row(t).data() + kv_offset;
        for (int i = 0; i < head_size; ++i) out[i] += att[t] * vt[i];
      }
    }
    std::memcpy(head_output_record_[l].row(pos).data(), xb, q_dim * sizeof(float));

    matmul(xb2_.data(), xb, w.wo, q_dim, dim);
    for (int i = 0; i < dim; ++i) x[i] += xb2_[i];

    // SwiGLU feed-forward: w2(silu(w1 x) * w3 x).
    rmsnorm(xb, x, w.rms_ffn, dim);
    matmul(hb_.data(), xb, w.w1, dim, hidden);
    matmul(hb2_.data(), xb, w.w3, dim, hidden);
    for (int i = 0; i < hidden; ++i) {
      float val = hb_[i];
      val *= 1.0f / (1.0f + std::exp(-val));
      hb_[i] = val * hb2_[i];
    }
    matmul(xb, hb_.data(), w.w2, hidden, dim);
    for (int i = 0; i < dim; ++i) x[i] += xb[i];
  }
  rmsnorm(x, x, rms_final_, dim);
  matmul(logits_.data(), x, classifier_, dim, c.vocab_size);
  positions_ = pos + 1;
  return logits_;
}

void Transformer::set_compressed_cache(CompressedCache cache) {
  const Config& c = config_;
  if (cache.covered < 0 || cache.covered > positions_)
    throw std::invalid_argument("set_compressed_cache: covered " + std::to_string(cache.covered) +
                                " outside [0, positions " + std::to_string(positions_) + "]");
  if (static_cast<int>(cache.heads.size()) != c.n_layers)
    throw std::invalid_argument("set_compressed_cache: one entry list per layer expected");
  for (auto& layer : cache.heads) {
    if (static_cast<int>(layer.size()) != c.n_kv_heads)
      throw std::invalid_argument("set_compressed_cache: one entry list per kv head expected");
    for (CompressedHead& head : layer) {
      const size_t count = head.positions.size();
      if (head.num_logw.size() != count || head.den_logw.size() != count)
        throw std::invalid_argument("set_compressed_cache: positions and log weights differ");
      head.separate = false;
      for (size_t i = 0; i < count; ++i) {
        if (head.positions[i] < 0 || head.positions[i] >= cache.covered ||
            (i > 0 && head.positions[i] <= head.positions[i - 1]))
          throw std::invalid_argument(
              "set_compressed_cache: positions must increase inside [0, covered)");
        if (head.num_logw[i] != head.den_logw[i]) head.separate = true;
      }
    }
  }
  compressed_ = std::move(cache);
}

void Transformer::attend_compressed(int layer, int kv_head, const float* qh, int pos, float* out) {
  // The same float operations as the full-cache loop in forward(), with the entries' log
  // weights added to the scaled scores: with every position present at log weight 0 the result
  // is bit for bit the full cache's.
  const int head_size = config_.head_size();
  const float inv_sqrt_head = 1.0f / std::sqrt(static_cast<float>(head_size));
  const CompressedHead& entries = compressed_.heads[layer][kv_head];
  const int kept = static_cast<int>(entries.positions.size());
  const int count = kept + (pos + 1 - compressed_.covered);
  const int kv_offset = kv_head * head_size;
  const MatrixF& keys = key_cache_[layer];
  const MatrixF& values = value_cache_[layer];
  auto position_of = [&](int i) {
    return i < kept ? entries.positions[i] : compressed_.covered + (i - kept);
  };
  float* att = att_.data();
  for (int i = 0; i < count; ++i) {
    const float* kt = keys.row(position_of(i)).data() + kv_offset;
    float score = 0.0f;
    for (int d = 0; d < head_size; ++d) score += qh[d] * kt[d];
    att[i] = score * inv_sqrt_head;
  }
  std::fill(out, out + head_size, 0.0f);
  if (!entries.separate) {
    for (int i = 0; i < kept; ++i) att[i] += entries.num_logw[i];
    softmax(att, count);
    for (int i = 0; i < count; ++i) {
      const float* vt = values.row(position_of(i)).data() + kv_offset;
      for (int d = 0; d < head_size; ++d) out[d] += att[i] * vt[d];
    }
    return;
  }
  // Separate numerator and denominator sets: sum_N w e^s v / sum_D w' e^s, shifted by the
  // largest biased score over both.
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  float shift = kNegInf;
  for (int i = 0; i < count; ++i) {
    const float nb = i < kept ? entries.num_logw[i] : 0.0f;
    const float db = i < kept ? entries.den_logw[i] : 0.0f;
    shift = std::max(shift, att[i] + std::max(nb, db));
  }
  float denominator = 0.0f;
  for (int i = 0; i < count; ++i) {
    const float nb = i < kept ? entries.num_logw[i] : 0.0f;
    const float db = i < kept ? entries.den_logw[i] : 0.0f;
    if (db != kNegInf) denominator += std::exp(att[i] + db - shift);
    if (nb == kNegInf) continue;
    const float a = std::exp(att[i] + nb - shift);
    const float* vt = values.row(position_of(i)).data() + kv_offset;
    for (int d = 0; d < head_size; ++d) out[d] += a * vt[d];
  }
  if (denominator > 0.0f)
    for (int d = 0; d < head_size; ++d) out[d] /= denominator;
}

// ---------------------------------------------------------------------------------------------
// Tokenizer

Tokenizer::Tokenizer(const std::string& path, int vocab_size) : path_(path) {
  const std::vector<char> bytes = read_whole_file(path, "llama2.c tokenizer");
  if (vocab_size <= 0) {
    throw InputError(path + ": cannot read a tokenizer for vocab_size " +
                     std::to_string(vocab_size));
  }
  size_t offset = 0;
  auto read_i32 = [&](int32_t* out) {
    if (bytes.size() - offset < 4) return false;
    std::memcpy(out, bytes.data() + offset, 4);
    offset += 4;
    return true;
  };
  int32_t max_len = 0;
  if (!read_i32(&max_len)) {
    throw InputError(path + ": truncated tokenizer: " + std::to_string(bytes.size()) +
                     " bytes, no max_token_length header");
  }
  if (max_len <= 0 || max_len > (1 << 16)) {
    throw InputError(path + ": bad tokenizer header: max_token_length " + std::to_string(max_len) +
                     " (expected 1..65536)");
  }
  max_token_length_ = max_len;
  pieces_.reserve(vocab_size);
  scores_.reserve(vocab_size);
  for (int i = 0; i < vocab_size; ++i) {
    const std::string where = path + ": token " + std::to_string(i) + " of " +
                              std::to_string(vocab_size) + " (the model's vocab_size)";
    float score = 0.0f;
    int32_t len = 0;
    if (bytes.size() - offset < 8) throw InputError(where + ": file truncated before its entry");
    std::memcpy(&score, bytes.data() + offset, 4);
    offset += 4;
    read_i32(&len);
    if (len < 0 || len > max_token_length_) {
      throw InputError(where + ": byte length " + std::to_string(len) +
                       " outside [0, max_token_length " + std::to_string(max_token_length_) + "]");
    }
    if (bytes.size() - offset < static_cast<size_t>(len)) {
      throw InputError(where + ": file truncated inside its " + std::to_string(len) + " bytes");
    }
    if (!std::isfinite(score)) throw InputError(where + ": score is NaN or Inf");
    pieces_.emplace_back(bytes.data() + offset, static_cast<size_t>(len));
    scores_.push_back(score);
    offset += len;
  }
  if (offset != bytes.size()) {
    throw InputError(path + ": " + std::to_string(bytes.size() - offset) + " bytes left after " +
                     std::to_string(vocab_size) +
                     " tokens: the tokenizer does not match the model's vocab_size");
  }
  std::fill(std::begin(byte_token_), std::end(byte_token_), -1);
  for (int i = 0; i < vocab_size; ++i) {
    lookup_.emplace(pieces_[i], i);  // keeps the lowest id of duplicated pieces
    const int b = parse_byte_piece(pieces_[i]);
    if (b >= 0 && byte_token_[b] < 0) byte_token_[b] = i;
  }
}

int Tokenizer::find(const std::string& s) const {
  auto it = lookup_.find(s);
  return it == lookup_.end() ? -1 : it->second;
}

std::vector<int> Tokenizer::encode(const std::string& text, bool bos, bool eos) const {
  return encode_text(text, bos, eos, /*dummy_prefix=*/true);
}

std::vector<int> Tokenizer::encode_continuation(const std::string& text) const {
  return encode_text(text, /*bos=*/false, /*eos=*/false, /*dummy_prefix=*/false);
}

void Tokenizer::merge_pairs(std::vector<int>& tokens) const {
  const size_t n = tokens.size();
  if (n < 2) return;
  // A doubly linked list over the initial tokens; a merge keeps the left node and unlinks the
  // right one. version[i] changes whenever node i changes or is unlinked, so a heap entry made
  // before that is recognised as stale.
  constexpr size_t kNone = static_cast<size_t>(-1);
  std::vector<size_t> prev(n), next(n);
  std::vector<uint32_t> version(n, 0);
  std::vector<char> alive(n, 1);
  for (size_t i = 0; i < n; ++i) {
    prev[i] = i == 0 ? kNone : i - 1;
    next[i] = i + 1 < n ? i + 1 : kNone;
  }
  struct Candidate {
    float score;
    int id;
    size_t left, right;
    uint32_t left_version, right_version;
  };
  // Highest score first; among equal scores the leftmost pair (list order is index order).
  auto later = [](const Candidate& a, const Candidate& b) {
    return a.score != b.score ? a.score < b.score : a.left > b.left;
  };
  std::priority_queue<Candidate, std::vector<Candidate>, decltype(later)> heap(later);
  auto consider = [&](size_t left) {
    if (left == kNone || next[left] == kNone) return;
    const size_t right = next[left];
    const int id = find(pieces_[tokens[left]] + pieces_[tokens[right]]);
    if (id >= 0 && scores_[id] > -1e10f)
      heap.push({scores_[id], id, left, right, version[left], version[right]});
  };
  for (size_t i = 0; i + 1 < n; ++i) consider(i);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    if (!alive[c.left] || !alive[c.right] || next[c.left] != c.right ||
        version[c.left] != c.left_version || version[c.right] != c.right_version)
      continue;
    tokens[c.left] = c.id;
    ++version[c.left];
    alive[c.right] = 0;
    ++version[c.right];
    next[c.left] = next[c.right];
    if (next[c.right] != kNone) prev[next[c.right]] = c.left;
    consider(prev[c.left]);
    consider(c.left);
  }
  size_t kept = 0;
  for (size_t i = 0; i < n; ++i)
    if (alive[i]) tokens[kept++] = tokens[i];
  tokens.resize(kept);
}

std::vector<int> Tokenizer::encode_text(const std::string& text, bool bos, bool eos,
                                        bool dummy_prefix) const {
  std::vector<int> tokens;
  if (bos) tokens.push_back(kBosToken);
  // SentencePiece's add_dummy_prefix: the text is read as if it began with a space.
  if (dummy_prefix && !text.empty()) {
    const int dummy_prefix = find(" ");
    if (dummy_prefix < 0) {
      throw InputError(path_ + ": tokenizer has no \" \" piece for the dummy prefix");
    }
    tokens.push_back(dummy_prefix);
  }
  // One token per UTF-8 code point (at most 4 bytes); code points not in the vocabulary fall
  // back to one <0xXX> token per byte.
  std::string buffer;
  for (size_t i = 0; i < text.size(); ++i) {
    const unsigned char ch = static_cast<unsigned char>(text[i]);
    if ((ch & 0xC0) != 0x80) buffer.clear();  // not a continuation byte: a new code point
    buffer.push_back(static_cast<char>(ch));
    const bool next_continues =
        i + 1 < text.size() && (static_cast<unsigned char>(text[i + 1]) & 0xC0) == 0x80;
    if (next_continues && buffer.size() < 4) continue;
    const int id = find(buffer);
    if (id >= 0) {
      tokens.push_back(id);
    } else {
      for (unsigned char b : buffer) {
        if (byte_token_[b] < 0) {
          char hex[8];
          std::snprintf(hex, sizeof hex, "<0x%02X>", b);
          throw InputError(path_ + ": cannot encode the prompt: no byte-fallback token " + hex);
        }
        tokens.push_back(byte_token_[b]);
      }
    }
    buffer.clear();
  }
  // Merge the adjacent pair with the best-scoring merged piece until no pair merges: run.c's
  // rule (the highest score above -1e10, the leftmost pair on ties). run.c rescans every pair
  // after each merge, O(n^2) lookups, so a long prompt or --continuation took hours; here the
  // candidate pairs wait in a heap ordered the same way (score, then position), entries made
  // stale by a merge are skipped, and the merges and their order are exactly run.c's.
  merge_pairs(tokens);
  if (eos) tokens.push_back(kEosToken);
  return tokens;
}

std::string Tokenizer::decode(int prev_token, int token) const {
  std::string piece = pieces_.at(token);
  // After BOS, SentencePiece's decoder strips the leading space (run.c, PR #89).
  if (prev_token == kBosToken && !piece.empty() && piece[0] == ' ') piece.erase(0, 1);
  const int byte = parse_byte_piece(piece);
  if (byte >= 0) return std::string(1, static_cast<char>(byte));
  return piece;
}

std::string Tokenizer::token_text(int prev_token, int token) const {
  if (token == kBosToken) return "<s>";
  if (token == kEosToken) return "</s>";
  const std::string piece = pieces_.at(token);
  const int byte = parse_byte_piece(piece);
  if (byte >= 0x80) return piece;  // a lone UTF-8 fragment: keep the readable <0xXX> form
  return decode(prev_token, token);
}

// ---------------------------------------------------------------------------------------------
// Generation and capture

Generation generate(Transformer& model, const Tokenizer& tokenizer, const std::string& prompt,
                    const GenerateOptions& options) {
  const Config& c = model.config();
  if (tokenizer.vocab_size() != c.vocab_size) {
    throw SettingError("tokenizer", "--tokenizer",
                       "has " + std::to_string(tokenizer.vocab_size()) +
                           " tokens but the model's vocab_size is " + std::to_string(c.vocab_size));
  }
  if (options.steps < 1 || options.steps > c.seq_len) {
    throw SettingError("steps", "--steps",
                       std::to_string(options.steps) + " is not in [1, " +
                           std::to_string(c.seq_len) + "] (the model's context seq_len)");
  }
  if (!(options.temperature >= 0.0f) || !std::isfinite(options.temperature)) {
    throw SettingError("temperature", "--temperature", "must be a finite number >= 0");
  }
  if (!(options.topp > 0.0f && options.topp <= 1.0f)) {
    throw SettingError("top-p", "--topp", "must be in (0, 1]");
  }
  const std::vector<int> prompt_tokens = tokenizer.encode(prompt, /*bos=*/true, /*eos=*/false);
  if (static_cast<int>(prompt_tokens.size()) > options.steps) {
    throw SettingError("prompt", "--prompt",
                       std::to_string(prompt_tokens.size()) +
                           " tokens (BOS included), more than the " +
                           std::to_string(options.steps) + " steps");
  }

  Generation g;
  g.prompt_tokens = static_cast<int>(prompt_tokens.size());
  CounterRng rng(options.seed, kRandMisc, 0, 0);
  std::vector<float> probabilities(c.vocab_size);
  int token = prompt_tokens[0];
  int prev = -1;
  for (int pos = 0; pos < options.steps; ++pos) {
    if (options.cancel && options.cancel->load()) throw Cancelled();
    const std::vector<float>& logits = model.forward(token, pos);
    g.tokens.push_back(token);
    g.text.push_back(tokenizer.token_text(prev, token));
    if (pos > 0) g.decoded += tokenizer.decode(prev, token);
    if (options.on_token) options.on_token(pos, token, g.text.back());

    int next;
    if (pos + 1 < g.prompt_tokens) {
      next = prompt_tokens[pos + 1];  // still inside the prompt: force its next token
    } else if (options.temperature == 0.0f) {
      next = sample_argmax(logits);
    } else {
      for (int i = 0; i < c.vocab_size; ++i) probabilities[i] = logits[i] / options.temperature;
      softmax(probabilities.data(), c.vocab_size);
      const float coin = static_cast<float>(rng.uniform());
      next = options.topp >= 1.0f ? sample_mult(probabilities, coin)
                                  : sample_topp(probabilities, options.topp, coin);
    }
    if (next == kBosToken && pos + 1 < options.steps) ++g.restarts;
    prev = token;
    token = next;
  }
  return g;
}

CaptureData make_capture(const Transformer& model, const Generation& generation,
                         const std::string& model_name, const std::string& prompt,
                         const std::string& source) {
  const Config& c = model.config();
  const int n = model.positions();
  if (static_cast<int>(generation.tokens.size()) != n) {
    throw std::invalid_argument("llama2c::make_capture: generation and model positions differ");
  }
  const int hs = c.head_size();
  CaptureData data;
  CaptureInfo& info = data.info;
  info.format = "kvscope/1";
  info.model = model_name;
  info.prompt = prompt;
  info.source = source;
  info.num_layers = c.n_layers;
  info.q_heads = c.n_heads;
  info.kv_heads = c.n_kv_heads;
  info.head_dim = hs;
  info.value_dim = hs;
  info.num_tokens = n;
  info.dtype = DType::F32;
  info.has_queries = true;
  info.has_output_projection = true;
  info.hidden_dim = c.dim;
  info.synthetic = false;
  info.tokens = generation.text;
  info.metadata["format"] = info.format;
  info.metadata["model"] = model_name;
  info.metadata["prompt"] = prompt;
  info.metadata["source"] = source;
  info.metadata["rope"] = "applied";
  info.metadata["num_layers"] = std::to_string(c.n_layers);
  info.metadata["q_heads"] = std::to_string(c.n_heads);
  info.metadata["kv_heads"] = std::to_string(c.n_kv_heads);
  info.metadata["head_dim"] = std::to_string(hs);
  info.metadata["llama2c_config"] = config_string(c);
  // run.c's RoPE (forward() above), written out (docs/capture-format.md) so that a reader needs
  // no knowledge of llama2.c to undo it (the loader would also derive it from llama2c_config).
  info.metadata["rope_theta"] = "10000";
  info.metadata["rope_layout"] = "interleaved";
  info.rope.layout = RopeInfo::Layout::Interleaved;
  info.rope.theta = 10000;

  data.layers.resize(c.n_layers);
  for (int l = 0; l < c.n_layers; ++l) {
    LayerData& layer = data.layers[l];
    layer.layer = l;
    layer.rope.layout = RopeInfo::Layout::Interleaved;
    layer.rope.theta = 10000;
    for (int kv = 0; kv < c.n_kv_heads; ++kv) {
      layer.keys.push_back(model.keys(l).block(0, kv * hs, n, hs));
      layer.values.push_back(model.values(l).block(0, kv * hs, n, hs));
    }
    for (int h = 0; h < c.n_heads; ++h) {
      layer.queries.push_back(model.queries(l).block(0, h * hs, n, hs));
      layer.output_projection.push_back(model.output_projection(l, h));
    }
    layer.refused.assign(c.n_kv_heads, std::string());
  }
  return data;
}

MatrixF Transformer::output_projection(int layer, int head) const {
  // run.c's wo is dim x (n_heads * head_size), row-major: out[i] = sum_j wo[i][j] x[j].
  const Config& c = config_;
  const int hs = c.head_size(), q_dim = c.n_heads * hs;
  const float* wo = layers_.at(static_cast<size_t>(layer)).wo;
  MatrixF m(hs, c.dim);
  for (int ch = 0; ch < hs; ++ch)
    for (int i = 0; i < c.dim; ++i)
      m(ch, i) = wo[static_cast<size_t>(i) * q_dim + static_cast<size_t>(head) * hs + ch];
  return m;
}

std::string model_name_from_path(const std::string& path) {
  return std::filesystem::path(path).stem().string();
}

}  // namespace kvscope::llama2c
