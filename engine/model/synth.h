// Synthetic captures for scale and speed tests (docs/capturing.md: always labelled synthetic).
// Llama-3-8B shapes by default. Not a model run: a generative sketch of the structure real KV
// caches show, so compression methods have something non-trivial to do:
//  - keys drawn from a few clusters ("topics") whose centres drift with position, with tokens
//    arriving in runs of one topic;
//  - a strong attention sink at token 0 (every query has a component along the sink key);
//  - a few key channels with large constant magnitude (outlier channels, placed in low-frequency
//    RoPE pairs as in real Llama caches);
//  - values correlated with the topics; queries near the centre of their own or an earlier
//    token's topic, so attention is peaked but spread over many tokens;
//  - RoPE (rotate-half, theta 500000) applied to queries and keys, with the topic signal in the
//    low-frequency pairs and a shared positional component in the high-frequency pairs, so
//    nearby tokens score higher and position matters.
// Every draw comes from Philox (engine/core/random.h): the same seed gives the same bytes.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/io/capture.h"

namespace kvscope {

struct SynthSpec {
  std::string shape = "llama3-8b";
  int num_layers = 32;
  int q_heads = 32;
  int kv_heads = 8;
  int head_dim = 128;
  int num_tokens = 8192;
  uint64_t seed = 0;
  int clusters = 8;            // topics per kv head
  double rope_theta = 500000;  // Llama 3
  bool apply_rope = true;      // off only for tests that compare against the un-rotated keys
};

// The named shape ("llama3-8b": 32 layers, 32 q heads, 8 kv heads, d 128; "small": 2 layers,
// 4 q heads, 2 kv heads, d 16) with the default token count. Throws InputError naming --shape.
SynthSpec synth_preset(const std::string& shape);

// Generates layers on demand; a layer depends only on (spec, layer index).
class SynthGenerator {
 public:
  explicit SynthGenerator(const SynthSpec& spec);  // throws InputError on bad sizes
  const SynthSpec& spec() const { return spec_; }
  // Metadata for the file: synthetic = true, model "synthetic-llama3-8b" (or -small), token
  // strings "<syn i>".
  const CaptureInfo& info() const { return info_; }
  // Topic of each token (shared by all layers and heads, like the text would be).
  const std::vector<int>& topics() const { return topics_; }
  // Channels of layer L's keys that carry an outlier offset.
  std::vector<int> outlier_channels(int L) const;
  LayerData layer(int L) const;

 private:
  SynthSpec spec_;
  CaptureInfo info_;
  std::vector<int> topics_;
  std::vector<float> rope_cos_, rope_sin_;  // [num_tokens, head_dim / 2]
};

// Writes the capture layer by layer (memory bounded by one layer). `progress(L)` is called after
// layer L is written. Throws InputError.
void write_synth_capture(const std::string& path, const SynthSpec& spec, DType dtype,
                         const std::function<void(int)>& progress = {});

}  // namespace kvscope
