#include "engine/model/synth.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numbers>

#include "engine/core/error.h"
#include "engine/core/random.h"

namespace kvscope {
namespace {

// Tags that keep the Philox streams of different quantities apart (counter word 3, low half).
enum SynthStream : uint32_t {
  kStreamHeadModel = 1,  // cluster centres, drifts, value centres, sink and position vectors
  kStreamKeyNoise = 2,
  kStreamValueNoise = 3,
  kStreamQueryNoise = 4,  // + q head index in counter word 2
  kStreamQueryFocus = 5,
  kStreamTopics = 6,
  kStreamOutliers = 7,
};

// Standard normals from Philox4x32: each counter value gives four 32-bit words, turned into
// four normals by Box-Muller. Deterministic per (seed, layer, head, stream).
class NormalStream {
 public:
  NormalStream(uint64_t seed, uint32_t layer, uint32_t head, uint32_t stream)
      : key0_(static_cast<uint32_t>(seed)), key1_(static_cast<uint32_t>(seed >> 32)) {
    word2_ = (layer & 0xFFFFu) | (head << 16);
    word3_ = (stream & 0xFFFFu) | (static_cast<uint32_t>(kRandMisc) << 16);
  }
  float next() {
    if (available_ == 0) refill();
    return buffer_[--available_];
  }

 private:
  void refill() {
    Philox4 c;
    c.v[0] = static_cast<uint32_t>(counter_);
    c.v[1] = static_cast<uint32_t>(counter_ >> 32);
    c.v[2] = word2_;
    c.v[3] = word3_;
    ++counter_;
    Philox4 r = philox4x32(c, key0_, key1_);
    for (int pair = 0; pair < 2; ++pair) {
      // (x + 0.5) / 2^32 lies in (0, 1): log never sees 0.
      double u1 = (static_cast<double>(r.v[2 * pair]) + 0.5) * (1.0 / 4294967296.0);
      double u2 = (static_cast<double>(r.v[2 * pair + 1]) + 0.5) * (1.0 / 4294967296.0);
      double radius = std::sqrt(-2.0 * std::log(u1));
      double angle = 2.0 * std::numbers::pi * u2;
      buffer_[2 * pair] = static_cast<float>(radius * std::cos(angle));
      buffer_[2 * pair + 1] = static_cast<float>(radius * std::sin(angle));
    }
    available_ = 4;
  }
  uint32_t key0_, key1_, word2_, word3_;
  uint64_t counter_ = 0;
  float buffer_[4] = {};
  int available_ = 0;
};

double synth_uniform(uint64_t seed, uint32_t stream, uint32_t layer, uint32_t head,
                     uint32_t index) {
  return counter_uniform(seed, kRandMisc, layer, head, stream, 0xFFFFFFF0u, index);
}

// Model constants, in units where logits are <q, k> / sqrt(d).
constexpr double kTopicLogit = 8.0;      // |centre|^2 / sqrt(d): same-topic attention logit
constexpr double kTopicSpread = 1.5;     // std of the logits within a topic (from key noise):
                                         // the attention inside a topic is lognormal, i.e.
                                         // peaked on ~100 tokens of a 1000-token topic
constexpr double kPositionLogit = 1.5;   // |p|^2 / sqrt(d): bonus for the query's own position
constexpr double kQueryNoise = 0.5;      // query noise norm relative to the centre norm
constexpr double kDrift = 0.5;           // centre drift over the whole capture, relative
constexpr double kValueNoise = 0.4;      // per channel, against unit-variance value centres
constexpr double kOutlierScale = 12.0;   // outlier channel offset in typical channel units
constexpr double kFocusOwnTopic = 0.65;  // P(query looks at its own token's topic)

// Per (layer, kv head): the fixed vectors the tokens are drawn around.
struct HeadModel {
  int d = 0, clusters = 0;
  std::vector<float> centres;         // [clusters, d]
  std::vector<float> drifts;          // [clusters, d]
  std::vector<float> value_centres;   // [clusters, d]
  std::vector<float> sink_direction;  // [d], unit
  std::vector<float> position;        // [d]
  double sink_key_scale = 0, sink_query_scale = 0;
};

// RoPE pair i (channels i and i + d/2) rotates with frequency theta^(-2i/d): large i is slow.
// The slowest pairs are reserved for the sink direction (it must line up with queries at any
// distance, and nothing else may project on it, or the sink key's large norm would turn every
// query's topic component into huge random logits). Topic signals sit mostly in the next-slowest
// pairs (they survive long distances), the positional component in fast pairs (it only lines up
// for nearby tokens).
int sink_pairs(int d) {
  return std::max(1, d / 16);
}
bool is_sink_channel(int d, int j) {
  return j % (d / 2) >= d / 2 - sink_pairs(d);
}

// Per-channel weights with mean square 1, zero on the sink pairs and on `excluded` channels
// (the layer's outlier pairs, which queries ignore).
std::vector<float> pair_envelope(int d, bool slow, const std::vector<int>& excluded) {
  const int half = d / 2;
  std::vector<float> env(d, 0.0f);
  double sum_squares = 0;
  for (int i = 0; i < half - sink_pairs(d); ++i) {
    if (std::find(excluded.begin(), excluded.end(), i) != excluded.end()) continue;
    double x = slow ? (i + 1.0) / half : 1.0 - static_cast<double>(i) / half;
    env[i] = env[i + half] = static_cast<float>(x * x);
    sum_squares += 2 * x * x * x * x;
  }
  const float norm = static_cast<float>(std::sqrt(d / sum_squares));  // mean square 1
  for (float& e : env) e *= norm;
  return env;
}

HeadModel make_head_model(const SynthSpec& spec, int layer, int kv_head,
                          const std::vector<int>& outliers) {
  HeadModel m;
  m.d = spec.head_dim;
  m.clusters = spec.clusters;
  const int d = m.d;
  const double sqrt_d = std::sqrt(static_cast<double>(d));
  const float centre_channel = static_cast<float>(std::sqrt(kTopicLogit * sqrt_d / d));
  NormalStream rng(spec.seed, layer, kv_head, kStreamHeadModel);
  const std::vector<float> slow = pair_envelope(d, true, outliers),
                           fast = pair_envelope(d, false, outliers);
  m.centres.resize(static_cast<size_t>(m.clusters) * d);
  m.drifts.resize(m.centres.size());
  m.value_centres.resize(m.centres.size());
  for (int c = 0; c < m.clusters; ++c)
    for (int j = 0; j < d; ++j) {
      m.centres[c * d + j] = rng.next() * slow[j] * centre_channel;
      m.drifts[c * d + j] = static_cast<float>(kDrift) * rng.next() * slow[j] * centre_channel;
      m.value_centres[c * d + j] = rng.next();
    }
  // Every centre gets exactly the intended norm, so each topic pulls with kTopicLogit (with few
  // effective channels, as for small head dims, Gaussian norms would vary several-fold).
  const double centre_norm = std::sqrt(kTopicLogit * sqrt_d);
  for (int c = 0; c < m.clusters; ++c) {
    double squares = 0;
    for (int j = 0; j < d; ++j) squares += m.centres[c * d + j] * m.centres[c * d + j];
    const float scale = static_cast<float>(centre_norm / std::sqrt(std::max(squares, 1e-30)));
    for (int j = 0; j < d; ++j) m.centres[c * d + j] *= scale;
  }
  // The sink direction: the reserved slowest pairs (they barely rotate over 8k tokens).
  m.sink_direction.assign(d, 0.0f);
  double norm = 0;
  for (int j = 0; j < d; ++j) {
    if (is_sink_channel(d, j)) m.sink_direction[j] = rng.next();
    norm += m.sink_direction[j] * m.sink_direction[j];
  }
  for (float& x : m.sink_direction) x = static_cast<float>(x / std::sqrt(norm));
  const float position_channel = static_cast<float>(std::sqrt(kPositionLogit * sqrt_d / d));
  m.position.resize(d);
  for (int j = 0; j < d; ++j) m.position[j] = rng.next() * fast[j] * position_channel;
  // Sink logit: above a topic's total pull (about n / clusters tokens at kTopicLogit), so the
  // sink takes roughly half the attention at any length.
  const double sink_logit =
      kTopicLogit + 0.5 * kTopicSpread * kTopicSpread +
      std::log(std::max(1.0, static_cast<double>(spec.num_tokens) / m.clusters));
  m.sink_query_scale = 0.5 * std::sqrt(kTopicLogit * sqrt_d);
  m.sink_key_scale = sink_logit * sqrt_d / m.sink_query_scale;
  return m;
}

void rotate(float* x, int d, const float* cos_row, const float* sin_row) {
  const int half = d / 2;
  for (int i = 0; i < half; ++i) {
    const float a = x[i], b = x[i + half];
    x[i] = a * cos_row[i] - b * sin_row[i];
    x[i + half] = b * cos_row[i] + a * sin_row[i];
  }
}

}  // namespace

SynthSpec synth_preset(const std::string& shape) {
  SynthSpec s;
  s.shape = shape;
  if (shape == "llama3-8b") return s;  // the struct's defaults
  if (shape == "small") {
    s.num_layers = 2;
    s.q_heads = 4;
    s.kv_heads = 2;
    s.head_dim = 16;
    s.num_tokens = 512;
    return s;
  }
  throw SettingError("shape", "--shape",
                     "unknown shape \"" + shape + "\" (known: llama3-8b, small)");
}

SynthGenerator::SynthGenerator(const SynthSpec& spec) : spec_(spec) {
  // Within what the capture reader accepts (engine/io/capture.h), so every synth file opens.
  if (spec.num_tokens < 2 || spec.num_tokens > kMaxCaptureTokens)
    throw SettingError("tokens", "--tokens",
                       std::to_string(spec.num_tokens) + " is out of range (2 to " +
                           std::to_string(kMaxCaptureTokens) + ")");
  if (spec.num_layers < 1 || spec.num_layers > kMaxCaptureLayers)
    throw SettingError("layers", "--layers",
                       std::to_string(spec.num_layers) + " is out of range (1 to " +
                           std::to_string(kMaxCaptureLayers) + ")");
  if (spec.kv_heads < 1 || spec.q_heads < spec.kv_heads || spec.q_heads % spec.kv_heads != 0)
    throw InputError("synth: q_heads must be a positive multiple of kv_heads");
  if (spec.head_dim < 8 || spec.head_dim % 2 != 0)
    throw InputError("synth: head_dim must be even (RoPE rotates channel pairs) and >= 8");
  if (spec.clusters < 1) throw InputError("synth: clusters must be >= 1");

  const int n = spec.num_tokens;
  info_.model = "synthetic-" + spec.shape;
  info_.source = "kvscope-cli synth (synthetic)";
  info_.prompt = "(synthetic: no prompt; " + std::to_string(spec.clusters) +
                 " drifting key clusters, attention sink at token 0, outlier channels, seed " +
                 std::to_string(spec.seed) + ")";
  info_.synthetic = true;
  info_.num_layers = spec.num_layers;
  info_.q_heads = spec.q_heads;
  info_.kv_heads = spec.kv_heads;
  info_.head_dim = spec.head_dim;
  info_.value_dim = spec.head_dim;
  info_.num_tokens = n;
  info_.has_queries = true;
  info_.metadata["synthetic_shape"] = spec.shape;
  info_.metadata["synthetic_seed"] = std::to_string(spec.seed);
  if (spec.apply_rope) {
    char theta[32];
    std::snprintf(theta, sizeof theta, "%.17g", spec.rope_theta);
    info_.metadata["rope_theta"] = theta;
    info_.metadata["rope_layout"] = "half";
    info_.rope.layout = RopeInfo::Layout::Half;
    info_.rope.theta = spec.rope_theta;
  }
  info_.tokens.reserve(n);
  for (int t = 0; t < n; ++t) info_.tokens.push_back("<syn " + std::to_string(t) + ">");

  // Topics arrive in runs (mean length ~32 tokens, shorter for short captures).
  const double stay = 1.0 - 1.0 / std::clamp(n / 16.0, 2.0, 32.0);
  topics_.resize(n);
  topics_[0] = 0;
  for (int t = 1; t < n; ++t) {
    if (t == 1 || synth_uniform(spec.seed, kStreamTopics, 0, 0, 2 * t) >= stay)
      topics_[t] = static_cast<int>(synth_uniform(spec.seed, kStreamTopics, 0, 0, 2 * t + 1) *
                                    spec.clusters);
    else
      topics_[t] = topics_[t - 1];
    topics_[t] = std::min(topics_[t], spec.clusters - 1);
  }

  const int half = spec.head_dim / 2;
  rope_cos_.resize(static_cast<size_t>(n) * half);
  rope_sin_.resize(rope_cos_.size());
  for (int i = 0; i < half; ++i) {
    const double frequency = std::pow(spec.rope_theta, -2.0 * i / spec.head_dim);
    for (int t = 0; t < n; ++t) {
      const double angle = spec.apply_rope ? t * frequency : 0.0;
      rope_cos_[static_cast<size_t>(t) * half + i] = static_cast<float>(std::cos(angle));
      rope_sin_[static_cast<size_t>(t) * half + i] = static_cast<float>(std::sin(angle));
    }
  }
}

std::vector<int> SynthGenerator::outlier_channels(int L) const {
  // Two pairs among the slowest quarter below the sink pairs: both channels of each pair carry
  // an offset.
  const int half = spec_.head_dim / 2;
  const int quarter = std::max(1, half / 4);
  std::vector<int> channels;
  for (int k = 0; k < 2; ++k) {
    int pair =
        half - sink_pairs(spec_.head_dim) - 1 -
        std::min(quarter - 1,
                 static_cast<int>(synth_uniform(spec_.seed, kStreamOutliers, L, 0, k) * quarter));
    if (std::find(channels.begin(), channels.end(), pair) != channels.end()) continue;
    channels.push_back(pair);
    channels.push_back(pair + half);
  }
  std::sort(channels.begin(), channels.end());
  return channels;
}

LayerData SynthGenerator::layer(int L) const {
  if (L < 0 || L >= spec_.num_layers)
    throw InputError("synth: layer " + std::to_string(L) + " out of range");
  const int n = spec_.num_tokens, d = spec_.head_dim, half = d / 2;
  const int group = spec_.q_heads / spec_.kv_heads;
  const double sqrt_d = std::sqrt(static_cast<double>(d));
  const float centre_norm = static_cast<float>(std::sqrt(kTopicLogit * sqrt_d));
  // Key noise per channel such that <q, noise> / sqrt(d) has std kTopicSpread, with |q| about
  // 1.1 centre norms (topic part plus the sink component).
  const float key_noise = static_cast<float>(kTopicSpread * sqrt_d / (1.1 * centre_norm));
  const float query_noise = static_cast<float>(kQueryNoise * centre_norm / sqrt_d);
  const float value_noise = static_cast<float>(kValueNoise);
  const float channel = centre_norm / static_cast<float>(sqrt_d);

  // Outlier channels: fixed per layer, signed, large against a typical channel.
  const std::vector<int> outliers = outlier_channels(L);
  std::vector<float> outlier_offset(d, 0.0f);
  for (size_t k = 0; k < outliers.size(); ++k) {
    const double u = synth_uniform(spec_.seed, kStreamOutliers, L, 1, static_cast<uint32_t>(k));
    outlier_offset[outliers[k]] =
        static_cast<float>((u < 0.5 ? -1.0 : 1.0) * kOutlierScale * channel * (0.75 + 0.5 * u));
  }

  // Queries are zero on the outlier channels: the outliers shape the key geometry (norms,
  // inner products between keys) but leave attention alone, as the large constant key channels
  // of real models mostly do. Without this, their slow RoPE rotation times their size would
  // swamp every logit.
  std::vector<float> query_mask(d, 1.0f);
  for (int c : outliers) query_mask[c] = 0.0f;

  LayerData out;
  out.layer = L;
  out.rope = info_.rope;
  out.refused.assign(spec_.kv_heads, std::string());
  out.keys.assign(spec_.kv_heads, MatrixF(n, d));
  out.values.assign(spec_.kv_heads, MatrixF(n, d));
  out.queries.assign(spec_.q_heads, MatrixF(n, d));
  for (int g = 0; g < spec_.kv_heads; ++g) {
    const HeadModel m = make_head_model(spec_, L, g, outliers);
    NormalStream key_rng(spec_.seed, L, g, kStreamKeyNoise);
    NormalStream value_rng(spec_.seed, L, g, kStreamValueNoise);
    MatrixF& K = out.keys[g];
    MatrixF& V = out.values[g];
    for (int t = 0; t < n; ++t) {
      float* k = K.row(t).data();
      float* v = V.row(t).data();
      const int z = topics_[t];
      const float drift = static_cast<float>(t) / n;
      if (t == 0) {
        // The sink: a key every query partly points at, with a small value.
        for (int j = 0; j < d; ++j) {
          k[j] = static_cast<float>(m.sink_key_scale) * m.sink_direction[j] + m.position[j] +
                 outlier_offset[j] + key_noise * key_rng.next();
          v[j] = 0.1f * value_rng.next();
        }
      } else {
        for (int j = 0; j < d; ++j) {
          k[j] = m.centres[z * d + j] + drift * m.drifts[z * d + j] + m.position[j] +
                 outlier_offset[j] + key_noise * key_rng.next();
          v[j] = m.value_centres[z * d + j] + value_noise * value_rng.next();
        }
      }
      rotate(k, d, &rope_cos_[static_cast<size_t>(t) * half],
             &rope_sin_[static_cast<size_t>(t) * half]);
    }
    for (int qh = g * group; qh < (g + 1) * group; ++qh) {
      NormalStream query_rng(spec_.seed, L, qh, kStreamQueryNoise);
      // Each query head weighs the topic signal a little differently.
      const float topic_weight =
          static_cast<float>(0.8 + 0.4 * synth_uniform(spec_.seed, kStreamQueryFocus, L, qh, 0));
      MatrixF& Q = out.queries[qh];
      for (int t = 0; t < n; ++t) {
        // Focus: this token's topic, or the topic of an earlier token (a look-back).
        int focus = topics_[t];
        const uint32_t index = 2u * static_cast<uint32_t>(t) + 1u;
        if (t > 1 && synth_uniform(spec_.seed, kStreamQueryFocus, L, qh, index) >= kFocusOwnTopic) {
          int earlier =
              1 + static_cast<int>(synth_uniform(spec_.seed, kStreamQueryFocus, L, qh, index + 1) *
                                   (t - 1));
          focus = topics_[std::min(earlier, t - 1)];
        }
        const float drift = static_cast<float>(t) / n;
        float* q = Q.row(t).data();
        for (int j = 0; j < d; ++j)
          q[j] = query_mask[j] *
                 (topic_weight * (m.centres[focus * d + j] + drift * m.drifts[focus * d + j]) +
                  static_cast<float>(m.sink_query_scale) * m.sink_direction[j] + m.position[j] +
                  (is_sink_channel(d, j) ? 0.0f : query_noise * query_rng.next()));
        rotate(q, d, &rope_cos_[static_cast<size_t>(t) * half],
               &rope_sin_[static_cast<size_t>(t) * half]);
      }
    }
  }
  return out;
}

void write_synth_capture(const std::string& path, const SynthSpec& spec, DType dtype,
                         const std::function<void(int)>& progress) {
  SynthGenerator generator(spec);
  auto writer = CaptureWriter::create(path, generator.info(), dtype);
  for (int L = 0; L < spec.num_layers; ++L) {
    writer->write_layer(generator.layer(L));
    if (progress) progress(L);
  }
  writer->finish();
}

}  // namespace kvscope
