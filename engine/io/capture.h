// The capture file (docs/capture-format.md): keys, values and queries of one prompt run through one
// model. Format of record: safetensors (memory-mapped, layers read on demand); .npz is also read.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/core/rope.h"
#include "engine/core/tensor.h"

namespace kvscope {

enum class DType { F32, F16, BF16 };

// Limits of a capture the reader accepts, checked before anything is allocated and named in the
// error when hit. Far above real models (Llama 3 405B: 126 layers, 128 query heads, head dim 128)
// and contexts; low enough that a lying header cannot make the reader allocate gigabytes.
constexpr int kMaxCaptureLayers = 4096;
constexpr int kMaxCaptureHeads = 4096;      // query and kv heads each
constexpr int kMaxCaptureHeadDim = 65536;   // head_dim and value_dim
constexpr int kMaxCaptureTokens = 1 << 22;  // 4M tokens
// Keys, values and queries larger than this in magnitude make the float attention scores and
// norms overflow (|x|^2 * d beyond 3.4e38); such heads are refused like NaN/Inf heads.
constexpr double kMaxCaptureAbsValue = 1e15;
const char* dtype_name(DType t);

struct CaptureInfo {
  std::string path;
  std::string format = "kvscope/1";
  std::string model;
  std::string prompt;
  std::string
      source;  // what produced it (e.g. "kvscope-cli capture", "capture_hf.py", "synthetic")
  int num_layers = 0;
  int q_heads = 0;
  int kv_heads = 0;
  int head_dim = 0;
  int value_dim = 0;
  int num_tokens = 0;
  DType dtype = DType::F32;
  bool has_queries = false;
  // Each layer's output projection (`layers.L.wo`, optional: all layers or none), what CriticalKV
  // weighs values by; hidden_dim is the model's width (its output side).
  bool has_output_projection = false;
  int hidden_dim = 0;
  bool synthetic = false;  // metadata "synthetic" == "true": always labelled in the UI
  std::vector<std::string> tokens;
  std::map<std::string, std::string> metadata;  // every __metadata__ entry as stored
  RopeInfo rope;  // from rope_theta / rope_layout, or what made the file (engine/core/rope.h)
  std::string file_format;  // "safetensors" or "npz"
  long long file_bytes = 0;

  int group_size() const { return kv_heads > 0 ? q_heads / kv_heads : 1; }
  // Query head h reads kv head h / group_size (GQA).
  int kv_head_of(int q_head) const { return q_head / group_size(); }
};

// Names one loaded layer's data for the device backends' resident copies (docs/design.md,
// "Backend ops": layers resident on the device). CaptureFile::layer gives every load, a reload
// of an evicted layer included, a number never given before in this process (LayerId::fresh), so
// while a LayerData holding id x lives its matrices keep the contents they were loaded with, and
// no other LayerData is x. 0 names nothing: a layer built or changed in memory, whose arrays a
// device backend uploads at every call. A copy is new data that its owner may change, so it gets
// 0; a move takes the id along (and leaves 0 behind).
class LayerId {
 public:
  LayerId() = default;
  static LayerId fresh();  // the next number of a process-wide atomic counter, from 1
  LayerId(const LayerId&) noexcept {}
  LayerId& operator=(const LayerId&) noexcept {
    value_ = 0;
    return *this;
  }
  LayerId(LayerId&& other) noexcept : value_(other.value_) { other.value_ = 0; }
  LayerId& operator=(LayerId&& other) noexcept {
    if (this != &other) {
      value_ = other.value_;
      other.value_ = 0;
    }
    return *this;
  }
  uint64_t value() const { return value_; }

 private:
  uint64_t value_ = 0;
};

// One layer, converted to float32. keys/values are indexed by kv head, queries by query head.
struct LayerData {
  int layer = 0;
  // Set by CaptureFile::layer: the data is that load's and does not change (see LayerId).
  LayerId id;
  std::vector<MatrixF> keys;     // [kv_heads] n x d
  std::vector<MatrixF> values;   // [kv_heads] n x d_v
  std::vector<MatrixF> queries;  // [q_heads] n x d, empty when the capture has none
  // [q_heads] d_v x hidden: query head h's slice of the output projection, transposed (row c
  // is what value channel c of head h adds to the layer's output); empty when the capture has
  // none. y = sum_h W_O[h]^T o_h, o_h the head's attention output.
  std::vector<MatrixF> output_projection;
  // Per kv head: empty when usable, else why it is refused (e.g. NaN in layers.3.key head 1).
  std::vector<std::string> refused;
  RopeInfo rope;  // the capture's (CaptureInfo::rope)

  // The query heads of kv head `kv` (GQA group), as pointers into `queries`.
  std::vector<const MatrixF*> group_queries(int kv) const;
};

// An open capture. Opening parses and validates the header and every tensor's shape, dtype and
// byte range; tensor data is read (and checked for NaN/Inf) only when a layer is asked for.
// How many converted layers a capture keeps by default (CaptureFile::set_max_cached_layers): up
// to 4, fewer when they are large: as many as fit in about 2 GiB of float32, never under 2 (the
// layer a job reads and the one loading ahead). At Llama-3-8B's shapes that is 4 at 8192 tokens
// (192 MiB a layer) and 2 at 32768 (805 MiB), so the app's grid over a 32k capture stays under
// 6 GiB resident (docs/performance.md, "Large captures").
int default_cached_layers(const CaptureInfo& info);

class CaptureFile {
 public:
  virtual ~CaptureFile() = default;
  // Throws InputError naming the file, the tensor and the problem.
  static std::unique_ptr<CaptureFile> open(const std::string& path);

  virtual const CaptureInfo& info() const = 0;
  // Loads layer L (cached; at most `max_cached_layers` stay resident). Thread-safe.
  virtual std::shared_ptr<const LayerData> layer(int L) = 0;
  // Bytes of tensor data currently resident in the layer cache.
  virtual long long resident_bytes() const = 0;
  // Layers converted from the file so far (threads asking for a layer being loaded wait for that
  // load instead of converting it again).
  virtual long long layers_loaded() const = 0;
  virtual void set_max_cached_layers(int n) = 0;
};

// A whole capture in memory, for writers (capture command, synth, tests).
struct CaptureData {
  CaptureInfo info;
  std::vector<LayerData> layers;
};

// Writes .safetensors or .npz (chosen by extension) in `dtype`. Throws InputError on I/O failure.
void write_capture(const std::string& path, const CaptureData& data, DType dtype = DType::F32);

// Writes a capture one layer at a time, so memory stays bounded by one layer (synth, large
// captures). `info` fixes the shapes (num_layers, q_heads, kv_heads, head_dim, value_dim,
// num_tokens, has_queries), the tokens and the metadata; layers must then come in order 0, 1, ...
// The file appears under `path` only when finish() succeeds.
class CaptureWriter {
 public:
  static std::unique_ptr<CaptureWriter> create(const std::string& path, const CaptureInfo& info,
                                               DType dtype = DType::F32);
  virtual ~CaptureWriter() = default;
  virtual void write_layer(const LayerData& layer) = 0;  // throws InputError on shape mismatch
  virtual void finish() = 0;
};

// The __metadata__ strings a writer stores for `info` (format, model, shapes, rope, tokens,
// prompt, source, synthetic), on top of any extra keys in info.metadata.
std::map<std::string, std::string> capture_metadata(const CaptureInfo& info);

}  // namespace kvscope
