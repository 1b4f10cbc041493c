// CaptureFile (docs/capture-format.md): validates the capture layout on top of a container reader
// (safetensors.cpp, npz.cpp), converts one layer at a time to float on demand and keeps the
// most recently used layers in a small LRU cache.
#include "engine/io/capture.h"

#include <malloc.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <future>
#include <list>
#include <nlohmann/json.hpp>

#include "engine/core/error.h"
#include "engine/core/half.h"
#include "engine/io/json_limits.h"
#include "engine/io/npz.h"
#include "engine/io/safetensors.h"
#include "engine/io/tensor_archive.h"

namespace kvscope {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32:
      return "F32";
    case DType::F16:
      return "F16";
    case DType::BF16:
      return "BF16";
  }
  return "?";
}

LayerId LayerId::fresh() {
  static std::atomic<uint64_t> next{1};
  LayerId id;
  id.value_ = next.fetch_add(1, std::memory_order_relaxed);
  return id;
}

std::vector<const MatrixF*> LayerData::group_queries(int kv) const {
  std::vector<const MatrixF*> out;
  if (queries.empty() || keys.empty() || kv < 0 || kv >= static_cast<int>(keys.size())) return out;
  const int group = static_cast<int>(queries.size() / keys.size());
  for (int h = kv * group; h < (kv + 1) * group && h < static_cast<int>(queries.size()); ++h)
    out.push_back(&queries[h]);
  return out;
}

int default_cached_layers(const CaptureInfo& info) {
  const long long layer_bytes = 4LL * info.num_tokens * info.head_dim *
                                (2LL * info.kv_heads + (info.has_queries ? info.q_heads : 0));
  constexpr long long kLayerCacheBytes = 2LL << 30;
  if (layer_bytes <= 0) return 4;
  return static_cast<int>(std::clamp<long long>(kLayerCacheBytes / layer_bytes, 2, 4));
}

namespace {

using nlohmann::json;

enum class TensorKind { Key, Value, Query, OutputProjection };

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// "layers.{L}.{key,value,query,wo}" -> (L, kind); other names are not capture tensors.
bool parse_tensor_name(const std::string& name, int* layer, TensorKind* kind) {
  static const std::string prefix = "layers.";
  if (name.compare(0, prefix.size(), prefix) != 0) return false;
  size_t dot = name.find('.', prefix.size());
  if (dot == std::string::npos || dot == prefix.size()) return false;
  const char* first = name.data() + prefix.size();
  const char* last = name.data() + dot;
  if (last - first > 1 && *first == '0') return false;  // "layers.01.key" is not layer 1
  auto [end, ec] = std::from_chars(first, last, *layer);
  if (ec != std::errc() || end != last || *layer < 0) return false;
  std::string rest = name.substr(dot + 1);
  if (rest == "key")
    *kind = TensorKind::Key;
  else if (rest == "value")
    *kind = TensorKind::Value;
  else if (rest == "query")
    *kind = TensorKind::Query;
  else if (rest == "wo")
    *kind = TensorKind::OutputProjection;
  else
    return false;
  return true;
}

class MetadataReader {
 public:
  MetadataReader(const TensorArchive& archive) : archive_(archive) {
    where_ = archive.path() + ": " +
             (std::string(archive.format_name()) == "npz" ? "metadata.json" : "__metadata__");
  }
  const std::string* find(const std::string& key) const {
    auto it = archive_.metadata().find(key);
    return it == archive_.metadata().end() ? nullptr : &it->second;
  }
  const std::string& required(const std::string& key) const {
    const std::string* v = find(key);
    if (!v) throw InputError(where_ + " has no \"" + key + "\" entry");
    return *v;
  }
  // A positive integer of at most `limit`; the message names the limit when it is exceeded.
  int positive_int(const std::string& key, int limit) const {
    const std::string& text = required(key);
    long long value = 0;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    const std::string shown = text.size() > 40 ? text.substr(0, 40) + "..." : text;
    if (ec == std::errc::result_out_of_range || (ec == std::errc() && value > limit))
      throw InputError(where_ + " entry \"" + key + "\" = " + shown + " exceeds the limit of " +
                       std::to_string(limit));
    if (ec != std::errc() || end != text.data() + text.size() || value <= 0)
      throw InputError(where_ + " entry \"" + key + "\" = \"" + shown +
                       "\" is not a positive integer");
    return static_cast<int>(value);
  }
  const std::string& where() const { return where_; }

 private:
  const TensorArchive& archive_;
  std::string where_;
};

// RoPE of the keys and queries (engine/core/rope.h): `rope_theta` (a positive number) and
// `rope_layout`
// ("interleaved" | "half") when stored; otherwise what made the file fixes them: llama2.c's run.c
// (engine/model/llama2c.cpp, metadata `llama2c_config`) always rotates pairs (2i, 2i+1) with theta
// 10000, and `kvscope-cli synth` (engine/model/synth.cpp, metadata `synthetic_shape`) rotate-half
// with theta 500000. Anything else stays unknown, and methods that need it refuse.
RopeInfo read_rope(const MetadataReader& meta, int head_dim) {
  RopeInfo rope;
  const std::string* theta = meta.find("rope_theta");
  const std::string* layout = meta.find("rope_layout");
  if (theta) {
    const std::string shown = theta->size() > 40 ? theta->substr(0, 40) + "..." : *theta;
    double value = 0;
    auto [end, ec] = std::from_chars(theta->data(), theta->data() + theta->size(), value);
    if (ec != std::errc() || end != theta->data() + theta->size() || !std::isfinite(value) ||
        value <= 1)
      throw InputError(meta.where() + " entry \"rope_theta\" = \"" + shown +
                       "\" is not a number above 1");
    rope.theta = value;
  }
  if (layout) {
    if (*layout == "interleaved")
      rope.layout = RopeInfo::Layout::Interleaved;
    else if (*layout == "half")
      rope.layout = RopeInfo::Layout::Half;
    else
      throw InputError(meta.where() + " entry \"rope_layout\" = \"" +
                       (layout->size() > 40 ? layout->substr(0, 40) + "..." : *layout) +
                       "\", expected \"interleaved\" or \"half\"");
  }
  if (!theta && !layout) {
    if (meta.find("llama2c_config")) {
      rope.layout = RopeInfo::Layout::Interleaved;
      rope.theta = 10000;
    } else if (meta.find("synthetic_shape")) {
      rope.layout = RopeInfo::Layout::Half;
      rope.theta = 500000;
    }
  }
  if (head_dim % 2 != 0) {
    rope = RopeInfo();
    rope.missing = "head_dim " + std::to_string(head_dim) + " is odd, so RoPE cannot apply";
  } else if (!rope.known()) {
    rope.layout = RopeInfo::Layout::Unknown;
    rope.missing = std::string("the capture metadata has no ") +
                   (!theta ? (!layout ? "\"rope_theta\" and \"rope_layout\"" : "\"rope_theta\"")
                           : "\"rope_layout\"") +
                   " (docs/capture-format.md)";
  }
  return rope;
}

// True when some value is NaN or +-Inf (exponent bits all ones) or larger in magnitude than
// kMaxCaptureAbsValue (compared on the bits of |x|: for non-negative floats the bit patterns order
// like the values). Written as a branch-free reduction so it vectorises; Eigen's allFinite() runs
// scalar and cost more than the conversion.
bool any_unusable(const float* values, size_t count) {
  static const uint32_t limit_bits = [] {
    const float limit = static_cast<float>(kMaxCaptureAbsValue);
    uint32_t bits;
    std::memcpy(&bits, &limit, 4);
    return bits;
  }();
  uint32_t found = 0;
  for (size_t i = 0; i < count; ++i) {
    uint32_t bits;
    std::memcpy(&bits, values + i, 4);
    found |= static_cast<uint32_t>((bits & 0x7FFFFFFFu) > limit_bits);
  }
  return found != 0;
}

struct LayerTensors {
  int key = -1, value = -1, query = -1, wo = -1;  // indices into archive tensors()
};

class ArchiveCapture final : public CaptureFile {
 public:
  explicit ArchiveCapture(std::unique_ptr<TensorArchive> archive) : archive_(std::move(archive)) {
    validate();
    max_cached_ = default_cached_layers(info_);
  }

  const CaptureInfo& info() const override { return info_; }

  std::shared_ptr<const LayerData> layer(int L) override {
    if (L < 0 || L >= info_.num_layers)
      throw InputError(info_.path + ": layer " + std::to_string(L) + " out of range (capture has " +
                       std::to_string(info_.num_layers) + " layers)");
    std::promise<std::shared_ptr<LayerData>> mine;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      auto it = cache_.find(L);
      if (it != cache_.end()) {
        touch(L);
        return it->second;
      }
      // Another thread is loading it (the grid's threads reach a new layer together): wait for
      // that load rather than convert the same layer twice.
      auto in_flight = loading_.find(L);
      if (in_flight != loading_.end()) {
        std::shared_future<std::shared_ptr<LayerData>> other = in_flight->second;
        lock.unlock();
        return other.get();  // its InputError too
      }
      loading_[L] = mine.get_future().share();
    }
    // Load outside the lock so other layers stay available meanwhile.
    std::shared_ptr<LayerData> loaded;
    try {
      loaded = load(L);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      loading_.erase(L);
      mine.set_exception(std::current_exception());
      throw;
    }
    std::lock_guard<std::mutex> lock(mutex_);
    ++loads_;
    loading_.erase(L);
    mine.set_value(loaded);
    if (max_cached_ > 0) {
      cache_[L] = loaded;
      lru_.push_front(L);
      evict();
    }
    return loaded;
  }

  long long layers_loaded() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return loads_;
  }

  long long resident_bytes() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    long long total = 0;
    for (const auto& [index, data] : cache_) {
      for (const MatrixF& m : data->keys) total += static_cast<long long>(m.size()) * 4;
      for (const MatrixF& m : data->values) total += static_cast<long long>(m.size()) * 4;
      for (const MatrixF& m : data->queries) total += static_cast<long long>(m.size()) * 4;
    }
    return total;
  }

  void set_max_cached_layers(int n) override {
    std::lock_guard<std::mutex> lock(mutex_);
    max_cached_ = std::max(0, n);
    evict();
  }

 private:
  void touch(int L) {
    lru_.remove(L);
    lru_.push_front(L);
  }
  void evict() {
    bool freed = false;
    while (static_cast<int>(lru_.size()) > max_cached_) {
      auto it = cache_.find(lru_.back());
      // A layer only the cache holds gives its matrices to the next load: a layer is 100-800 MB
      // of fresh pages otherwise, and mapping and clearing them cost the kernel more than the
      // conversion itself (docs/performance.md, "Large captures"). One layer's worth is kept.
      if (it->second.use_count() == 1) {
        spare_.clear();
        for (auto* list : {&it->second->keys, &it->second->values, &it->second->queries})
          for (MatrixF& m : *list) spare_.push_back(std::move(m));
      } else {
        freed = true;
      }
      cache_.erase(it);
      lru_.pop_back();
    }
    // Evicted layers are ~100 MB blocks; glibc raises its mmap threshold after freeing mapped
    // blocks, so later layers land on the heap and freed ones are not returned to the system.
    // Trimming keeps the process RSS bounded by the layers in use and the spare.
    if (freed) ::malloc_trim(0);
  }

  // A rows x cols matrix: a spare one of that shape when there is one (contents undefined).
  MatrixF take_matrix(int64_t rows, int64_t cols) const {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (size_t i = 0; i < spare_.size(); ++i)
        if (spare_[i].rows() == rows && spare_[i].cols() == cols) {
          MatrixF m = std::move(spare_[i]);
          spare_[i] = std::move(spare_.back());
          spare_.pop_back();
          return m;
        }
    }
    return MatrixF(rows, cols);
  }

  std::string tensor_where(int index) const {
    return info_.path + ": tensor " + archive_->tensors()[index].name;
  }

  // Checks a tensor's shape is [heads, n, dim]; n < 0 means "learn it from this tensor".
  // `dim_source` says where the expected dim comes from, for the message.
  // layers.L.wo: [q_heads, value_dim, hidden], the same hidden in every layer.
  void check_output_projection(int index) {
    const TensorDesc& t = archive_->tensors()[index];
    const std::string where = tensor_where(index) + ": shape " + shape_string(t.shape);
    if (t.shape.size() != 3)
      throw InputError(where + " has rank " + std::to_string(t.shape.size()) +
                       ", expected 3 [q_heads, value_dim, hidden]");
    if (t.shape[0] != info_.q_heads || t.shape[1] != info_.value_dim)
      throw InputError(where + " is not [q_heads = " + std::to_string(info_.q_heads) +
                       ", value_dim = " + std::to_string(info_.value_dim) + ", hidden]");
    if (t.shape[2] <= 0 || t.shape[2] > kMaxCaptureHeadDim)
      throw InputError(where + " has hidden size " + std::to_string(t.shape[2]) +
                       ", expected 1 to " + std::to_string(kMaxCaptureHeadDim));
    if (info_.hidden_dim == 0)
      info_.hidden_dim = static_cast<int>(t.shape[2]);
    else if (t.shape[2] != info_.hidden_dim)
      throw InputError(where + " has hidden size " + std::to_string(t.shape[2]) +
                       " but layers.0.wo has " + std::to_string(info_.hidden_dim));
  }

  void check_shape(int index, int heads, const char* heads_key, int* n, int* dim,
                   const char* dim_what, const char* dim_source) const {
    const TensorDesc& t = archive_->tensors()[index];
    const std::string where = tensor_where(index);
    if (t.shape.size() != 3)
      throw InputError(where + ": shape " + shape_string(t.shape) + " has rank " +
                       std::to_string(t.shape.size()) + ", expected 3 [heads, tokens, dim]");
    if (t.shape[0] != heads)
      throw InputError(where + ": shape " + shape_string(t.shape) + " has " +
                       std::to_string(t.shape[0]) + " heads but metadata " + heads_key + " = " +
                       std::to_string(heads));
    if (t.shape[1] > kMaxCaptureTokens)
      throw InputError(where + ": shape " + shape_string(t.shape) + " has " +
                       std::to_string(t.shape[1]) + " tokens, more than the limit of " +
                       std::to_string(kMaxCaptureTokens));
    if (t.shape[2] > kMaxCaptureHeadDim)
      throw InputError(where + ": shape " + shape_string(t.shape) + " has dim " +
                       std::to_string(t.shape[2]) + ", more than the limit of " +
                       std::to_string(kMaxCaptureHeadDim));
    if (*n < 0) {
      *n = static_cast<int>(t.shape[1]);
    } else if (t.shape[1] != *n) {
      throw InputError(where + ": shape " + shape_string(t.shape) + " has " +
                       std::to_string(t.shape[1]) + " tokens but layers.0.key has " +
                       std::to_string(*n));
    }
    if (*dim < 0) {
      *dim = static_cast<int>(t.shape[2]);
    } else if (t.shape[2] != *dim) {
      throw InputError(where + ": shape " + shape_string(t.shape) + " has " + dim_what + " " +
                       std::to_string(t.shape[2]) + " but " + dim_source + " " +
                       std::to_string(*dim));
    }
  }

  void validate() {
    const TensorArchive& a = *archive_;
    info_.path = a.path();
    info_.file_format = a.format_name();
    info_.file_bytes = static_cast<long long>(a.file_bytes());
    MetadataReader meta(a);
    if (!a.has_metadata())
      throw InputError(meta.where() +
                       " is missing: a KVScope capture needs format, num_layers, q_heads, "
                       "kv_heads, head_dim and tokens");
    info_.metadata = a.metadata();
    const std::string& format = meta.required("format");
    if (format != "kvscope/1")
      throw InputError(meta.where() + " entry \"format\" = \"" + format +
                       "\", expected \"kvscope/1\"");
    info_.format = format;
    info_.num_layers = meta.positive_int("num_layers", kMaxCaptureLayers);
    info_.q_heads = meta.positive_int("q_heads", kMaxCaptureHeads);
    info_.kv_heads = meta.positive_int("kv_heads", kMaxCaptureHeads);
    info_.head_dim = meta.positive_int("head_dim", kMaxCaptureHeadDim);
    if (info_.q_heads % info_.kv_heads != 0)
      throw InputError(meta.where() + ": q_heads = " + std::to_string(info_.q_heads) +
                       " is not a multiple of kv_heads = " + std::to_string(info_.kv_heads));
    if (const std::string* rope = meta.find("rope"); rope && *rope != "applied")
      throw InputError(meta.where() + " entry \"rope\" = \"" + *rope +
                       "\": KVScope needs keys and queries after RoPE (\"applied\")");
    info_.rope = read_rope(meta, info_.head_dim);
    if (const std::string* v = meta.find("model")) info_.model = *v;
    if (const std::string* v = meta.find("prompt")) info_.prompt = *v;
    if (const std::string* v = meta.find("source")) info_.source = *v;
    if (const std::string* v = meta.find("synthetic")) info_.synthetic = (*v == "true");

    const std::string& tokens_text = meta.required("tokens");
    {
      JsonLimits limits;
      limits.max_depth = 2;  // deeper nesting cannot be an array of strings anyway
      limits.max_values = static_cast<uint64_t>(kMaxCaptureTokens) + 1;
      json tokens;
      try {
        tokens = parse_json_limited(tokens_text, limits, meta.where() + " entry \"tokens\"");
      } catch (const InputError& e) {
        const std::string why = e.what();
        throw InputError(why.find("(limit)") != std::string::npos
                             ? why + " (at most " + std::to_string(kMaxCaptureTokens) + " tokens)"
                             : meta.where() + " entry \"tokens\" is not a JSON array of strings");
      }
      if (!tokens.is_array())
        throw InputError(meta.where() + " entry \"tokens\" is not a JSON array of strings");
      info_.tokens.reserve(tokens.size());
      for (json& t : tokens) {
        if (!t.is_string())
          throw InputError(meta.where() + " entry \"tokens\" is not a JSON array of strings");
        info_.tokens.push_back(std::move(t.get_ref<std::string&>()));
      }
    }

    // Sort the tensors into layers. (Every layer needs two tensors: checking that first keeps a
    // huge num_layers in a tiny file from allocating a huge table.)
    if (static_cast<size_t>(info_.num_layers) > a.tensors().size() / 2)
      throw InputError(info_.path + ": metadata num_layers = " + std::to_string(info_.num_layers) +
                       " but the file holds only " + std::to_string(a.tensors().size()) +
                       " tensors (missing layers?)");
    layers_.assign(info_.num_layers, LayerTensors{});
    bool any_query = false, any_wo = false;
    for (size_t i = 0; i < a.tensors().size(); ++i) {
      int L = 0;
      TensorKind kind{};
      if (!parse_tensor_name(a.tensors()[i].name, &L, &kind)) continue;  // extra tensors: ignored
      if (L >= info_.num_layers)
        throw InputError(tensor_where(static_cast<int>(i)) + ": layer " + std::to_string(L) +
                         " but metadata num_layers = " + std::to_string(info_.num_layers));
      int& slot = kind == TensorKind::Key     ? layers_[L].key
                  : kind == TensorKind::Value ? layers_[L].value
                  : kind == TensorKind::Query ? layers_[L].query
                                              : layers_[L].wo;
      slot = static_cast<int>(i);
      any_query |= kind == TensorKind::Query;
      any_wo |= kind == TensorKind::OutputProjection;
    }
    for (int L = 0; L < info_.num_layers; ++L) {
      const std::string missing = info_.path + ": missing tensor layers." + std::to_string(L) + ".";
      const std::string why = " (metadata num_layers = " + std::to_string(info_.num_layers) + ")";
      if (layers_[L].key < 0) throw InputError(missing + "key" + why);
      if (layers_[L].value < 0) throw InputError(missing + "value" + why);
      if (any_query && layers_[L].query < 0)
        throw InputError(missing + "query (other layers have queries; all or none must)");
      if (any_wo && layers_[L].wo < 0)
        throw InputError(missing + "wo (other layers have an output projection; all or none must)");
    }
    info_.has_queries = any_query;
    info_.has_output_projection = any_wo;

    int n = -1, d = info_.head_dim, dv = -1;
    for (int L = 0; L < info_.num_layers; ++L) {
      check_shape(layers_[L].key, info_.kv_heads, "kv_heads", &n, &d, "head dim",
                  "metadata head_dim =");
      check_shape(layers_[L].value, info_.kv_heads, "kv_heads", &n, &dv, "value dim",
                  "layers.0.value has");
      if (any_query)
        check_shape(layers_[L].query, info_.q_heads, "q_heads", &n, &d, "head dim",
                    "metadata head_dim =");
    }
    if (n <= 0) throw InputError(tensor_where(layers_[0].key) + ": capture has no tokens");
    if (dv <= 0) throw InputError(tensor_where(layers_[0].value) + ": value dim is 0");
    info_.num_tokens = n;
    info_.value_dim = dv;
    if (any_wo)
      for (int L = 0; L < info_.num_layers; ++L) check_output_projection(layers_[L].wo);
    if (static_cast<int>(info_.tokens.size()) != n)
      throw InputError(meta.where() + " entry \"tokens\" has " +
                       std::to_string(info_.tokens.size()) +
                       " token strings but the tensors have " + std::to_string(n) + " tokens");
    info_.dtype = a.tensors()[layers_[0].key].dtype;
  }

  // Converts tensor `index` ([heads, n, dim]) to one float matrix per head, recording heads with
  // NaN/Inf in `bad` (message per head, empty when finite).
  void convert(int index, std::vector<MatrixF>* out, std::vector<std::string>* bad) const {
    const TensorDesc& t = archive_->tensors()[index];
    const int heads = static_cast<int>(t.shape[0]);
    const int64_t rows = t.shape[1], cols = t.shape[2];
    std::vector<uint8_t> scratch;
    // Plain data is copied head by head straight out of the file (MappedFile::copy turns a file
    // shrinking under the mapping into InputError); other data is decoded into `scratch` first.
    uint64_t file_offset = 0;
    const MappedFile* plain = archive_->plain_location(index, &file_offset);
    const uint8_t* bytes = plain ? nullptr : archive_->tensor_bytes(index, scratch);
    const size_t per_head = static_cast<size_t>(rows * cols);
    const size_t head_bytes = per_head * dtype_size(t.dtype);
    std::vector<uint8_t> half_buffer;
    out->assign(heads, MatrixF());
    bad->assign(heads, std::string());
    for (int h = 0; h < heads; ++h) {
      MatrixF& m = (*out)[h];
      m = take_matrix(rows, cols);
      float* dst = m.data();
      const size_t head_offset = static_cast<size_t>(h) * head_bytes;
      bool unusable = false;  // a NaN, Inf or huge value somewhere in the head
      if (t.dtype == DType::F32) {
        if (plain)
          plain->copy(file_offset + head_offset, head_bytes, dst);
        else
          std::memcpy(dst, bytes + head_offset, head_bytes);
        unusable = any_unusable(dst, per_head);
      } else {
        // In pieces that stay in the core's cache between the copy and the conversion.
        constexpr size_t kPiece = size_t{1} << 15;  // values
        for (size_t i0 = 0; i0 < per_head; i0 += kPiece) {
          const size_t count = std::min(kPiece, per_head - i0);
          const uint8_t* src;
          if (plain) {
            half_buffer.resize(2 * kPiece);
            plain->copy(file_offset + head_offset + 2 * i0, 2 * count, half_buffer.data());
            src = half_buffer.data();
          } else {
            src = bytes + head_offset + 2 * i0;
          }
          float* out_piece = dst + i0;
          if (t.dtype == DType::F16) {
            for (size_t i = 0; i < count; ++i) {
              uint16_t half;
              std::memcpy(&half, src + 2 * i, 2);
              out_piece[i] = f16_to_float(half);
            }
          } else {
            for (size_t i = 0; i < count; ++i) {
              uint16_t half;
              std::memcpy(&half, src + 2 * i, 2);
              out_piece[i] = bf16_to_float(half);
            }
          }
          unusable = unusable || any_unusable(out_piece, count);  // while the piece is in cache
        }
      }
      if (unusable) {
        for (size_t i = 0; i < per_head; ++i) {
          const std::string at =
              " at token " + std::to_string(i / cols) + ", channel " + std::to_string(i % cols);
          if (!std::isfinite(dst[i])) {
            (*bad)[h] = std::string(std::isnan(dst[i]) ? "NaN" : "Inf") + at;
            break;
          }
          if (std::fabs(dst[i]) > kMaxCaptureAbsValue) {
            char value[32];
            std::snprintf(value, sizeof value, "%g", static_cast<double>(dst[i]));
            (*bad)[h] = std::string("magnitude ") + value + at +
                        " (beyond 1e15, attention scores would overflow float)";
            break;
          }
        }
      }
    }
    archive_->release(index);
  }

  std::shared_ptr<LayerData> load(int L) const {
    auto data = std::make_shared<LayerData>();
    data->layer = L;
    // A fresh id at every load: matrices recycled from an evicted layer (spare_) hold new
    // contents, so they must never be named by the id of the layer that had them before.
    data->id = LayerId::fresh();
    data->rope = info_.rope;
    data->refused.assign(info_.kv_heads, std::string());
    auto refuse = [&](int kv, const std::string& reason) {
      std::string& r = data->refused[kv];
      r += (r.empty() ? "" : "; ") + reason;
    };
    std::vector<std::string> bad;
    const LayerTensors& t = layers_[L];
    convert(t.key, &data->keys, &bad);
    for (int h = 0; h < info_.kv_heads; ++h)
      if (!bad[h].empty())
        refuse(h, tensor_where(t.key) + ": kv head " + std::to_string(h) + " has " + bad[h] +
                      "; head refused");
    convert(t.value, &data->values, &bad);
    for (int h = 0; h < info_.kv_heads; ++h)
      if (!bad[h].empty())
        refuse(h, tensor_where(t.value) + ": kv head " + std::to_string(h) + " has " + bad[h] +
                      "; head refused");
    if (t.query >= 0) {
      convert(t.query, &data->queries, &bad);
      for (int h = 0; h < info_.q_heads; ++h)
        if (!bad[h].empty())
          refuse(info_.kv_head_of(h), tensor_where(t.query) + ": query head " + std::to_string(h) +
                                          " has " + bad[h] + "; kv head " +
                                          std::to_string(info_.kv_head_of(h)) + " refused");
    }
    if (t.wo >= 0) {
      convert(t.wo, &data->output_projection, &bad);
      for (int h = 0; h < info_.q_heads; ++h)
        if (!bad[h].empty())
          refuse(info_.kv_head_of(h), tensor_where(t.wo) + ": query head " + std::to_string(h) +
                                          " has " + bad[h] + "; kv head " +
                                          std::to_string(info_.kv_head_of(h)) + " refused");
    }
    return data;
  }

  std::unique_ptr<TensorArchive> archive_;
  CaptureInfo info_;
  std::vector<LayerTensors> layers_;

  mutable std::mutex mutex_;
  std::map<int, std::shared_ptr<LayerData>> cache_;
  // The matrices of the last evicted layer that nobody else held, reused by the next load
  // (guarded by mutex_): see evict().
  mutable std::vector<MatrixF> spare_;
  // Layers being loaded, for the threads that ask for them meanwhile (guarded by mutex_).
  std::map<int, std::shared_future<std::shared_ptr<LayerData>>> loading_;
  long long loads_ = 0;
  std::list<int> lru_;  // most recently used first
  int max_cached_ = 4;
};

bool ends_with(const std::string& s, const std::string& suffix) {
  if (s.size() < suffix.size()) return false;
  for (size_t i = 0; i < suffix.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(s[s.size() - suffix.size() + i])) != suffix[i])
      return false;
  return true;
}

bool is_npz_path(const std::string& path) {
  return ends_with(path, ".npz");
}

// ---- writing

void append_converted(TensorFileWriter& out, const MatrixF& m, DType dtype,
                      std::vector<uint16_t>& buffer) {
  const size_t count = static_cast<size_t>(m.size());
  if (dtype == DType::F32) {
    out.append(m.data(), count * 4);
    return;
  }
  buffer.resize(count);
  const float* src = m.data();
  if (dtype == DType::F16) {
    for (size_t i = 0; i < count; ++i) buffer[i] = float_to_f16(src[i]);
  } else {
    for (size_t i = 0; i < count; ++i) buffer[i] = float_to_bf16(src[i]);
  }
  out.append(buffer.data(), count * 2);
}

class StreamingCaptureWriter final : public CaptureWriter {
 public:
  StreamingCaptureWriter(const std::string& path, const CaptureInfo& info, DType dtype)
      : path_(path), info_(info), dtype_(dtype) {
    const std::string where = path + ": cannot write capture: ";
    if (info_.value_dim <= 0) info_.value_dim = info_.head_dim;
    if (info_.num_layers <= 0 || info_.kv_heads <= 0 || info_.q_heads <= 0 || info_.head_dim <= 0 ||
        info_.num_tokens <= 0)
      throw InputError(where + "num_layers, q_heads, kv_heads, head_dim and tokens must be > 0");
    if (info_.q_heads % info_.kv_heads != 0)
      throw InputError(where + "q_heads = " + std::to_string(info_.q_heads) +
                       " is not a multiple of kv_heads = " + std::to_string(info_.kv_heads));
    if (info_.has_output_projection && info_.hidden_dim <= 0)
      throw InputError(where + "an output projection needs hidden_dim > 0");
    if (static_cast<int>(info_.tokens.size()) != info_.num_tokens)
      throw InputError(where + std::to_string(info_.tokens.size()) + " token strings for " +
                       std::to_string(info_.num_tokens) + " tokens");
    std::vector<TensorPlan> plan;
    const int64_t n = info_.num_tokens;
    for (int L = 0; L < info_.num_layers; ++L) {
      const std::string prefix = "layers." + std::to_string(L) + ".";
      plan.push_back({prefix + "key", dtype, {info_.kv_heads, n, info_.head_dim}});
      plan.push_back({prefix + "value", dtype, {info_.kv_heads, n, info_.value_dim}});
      if (info_.has_queries)
        plan.push_back({prefix + "query", dtype, {info_.q_heads, n, info_.head_dim}});
      if (info_.has_output_projection)
        plan.push_back({prefix + "wo", dtype, {info_.q_heads, info_.value_dim, info_.hidden_dim}});
    }
    const auto metadata = capture_metadata(info_);
    out_ = is_npz_path(path) ? create_npz_writer(path, metadata, plan)
                             : create_safetensors_writer(path, metadata, plan);
  }

  void write_layer(const LayerData& layer) override {
    const std::string where = path_ + ": cannot write layer " + std::to_string(next_layer_) + ": ";
    if (next_layer_ >= info_.num_layers)
      throw InputError(where + "all " + std::to_string(info_.num_layers) +
                       " layers already written");
    check(layer.keys, info_.kv_heads, info_.head_dim, "key", where);
    check(layer.values, info_.kv_heads, info_.value_dim, "value", where);
    if (info_.has_queries) check(layer.queries, info_.q_heads, info_.head_dim, "query", where);
    if (info_.has_output_projection)
      check(layer.output_projection, info_.q_heads, info_.hidden_dim, "wo", where, info_.value_dim);
    for (const MatrixF& m : layer.keys) append_converted(*out_, m, dtype_, buffer_);
    for (const MatrixF& m : layer.values) append_converted(*out_, m, dtype_, buffer_);
    if (info_.has_queries)
      for (const MatrixF& m : layer.queries) append_converted(*out_, m, dtype_, buffer_);
    if (info_.has_output_projection)
      for (const MatrixF& m : layer.output_projection) append_converted(*out_, m, dtype_, buffer_);
    ++next_layer_;
  }

  void finish() override {
    if (next_layer_ != info_.num_layers)
      throw InputError(path_ + ": cannot finish capture: " + std::to_string(next_layer_) + " of " +
                       std::to_string(info_.num_layers) + " layers written");
    out_->finish();
  }

 private:
  // Each head rows x cols; rows = the tokens unless given (the output projection's rows are
  // the value channels).
  void check(const std::vector<MatrixF>& heads, int count, int cols, const char* what,
             const std::string& where, int rows = -1) const {
    if (rows < 0) rows = info_.num_tokens;
    if (static_cast<int>(heads.size()) != count)
      throw InputError(where + std::to_string(heads.size()) + " " + what + " heads, expected " +
                       std::to_string(count));
    for (size_t h = 0; h < heads.size(); ++h)
      if (heads[h].rows() != rows || heads[h].cols() != cols)
        throw InputError(where + what + " head " + std::to_string(h) + " is " +
                         std::to_string(heads[h].rows()) + " x " + std::to_string(heads[h].cols()) +
                         ", expected " + std::to_string(rows) + " x " + std::to_string(cols));
  }

  std::string path_;
  CaptureInfo info_;
  DType dtype_;
  std::unique_ptr<TensorFileWriter> out_;
  std::vector<uint16_t> buffer_;
  int next_layer_ = 0;
};

}  // namespace

std::unique_ptr<CaptureFile> open_capture_archive(std::unique_ptr<TensorArchive> archive) {
  return std::make_unique<ArchiveCapture>(std::move(archive));
}

std::unique_ptr<CaptureFile> CaptureFile::open(const std::string& path) {
  std::shared_ptr<const MappedFile> file = MappedFile::open(path);
  // Zip archives start with a local file header (or, when empty, the end record).
  uint8_t magic[4] = {};
  if (file->size() >= 4) file->copy(0, 4, magic);
  const bool zip_magic = file->size() >= 4 && magic[0] == 'P' && magic[1] == 'K' &&
                         ((magic[2] == 3 && magic[3] == 4) || (magic[2] == 5 && magic[3] == 6));
  const bool npz = is_npz_path(path) || (!ends_with(path, ".safetensors") && zip_magic);
  return open_capture_archive(npz ? open_npz(std::move(file)) : open_safetensors(std::move(file)));
}

std::map<std::string, std::string> capture_metadata(const CaptureInfo& info) {
  std::map<std::string, std::string> m = info.metadata;
  const bool synthetic = info.synthetic || (m.count("synthetic") && m["synthetic"] == "true");
  m["format"] = "kvscope/1";
  m["model"] = info.model;
  m["num_layers"] = std::to_string(info.num_layers);
  m["q_heads"] = std::to_string(info.q_heads);
  m["kv_heads"] = std::to_string(info.kv_heads);
  m["head_dim"] = std::to_string(info.head_dim);
  m["rope"] = "applied";
  // Token strings may hold partial UTF-8 (byte tokens); replace invalid bytes rather than fail.
  m["tokens"] = json(info.tokens).dump(-1, ' ', false, json::error_handler_t::replace);
  m["prompt"] = info.prompt;
  m["source"] = info.source;
  if (synthetic)
    m["synthetic"] = "true";
  else
    m.erase("synthetic");
  return m;
}

std::unique_ptr<CaptureWriter> CaptureWriter::create(const std::string& path,
                                                     const CaptureInfo& info, DType dtype) {
  return std::make_unique<StreamingCaptureWriter>(path, info, dtype);
}

void write_capture(const std::string& path, const CaptureData& data, DType dtype) {
  // Shapes come from the tensors themselves; info supplies the text fields (and q_heads when
  // there are no queries to count).
  CaptureInfo info = data.info;
  const std::string where = path + ": cannot write capture: ";
  if (data.layers.empty()) throw InputError(where + "no layers");
  const LayerData& first = data.layers[0];
  if (first.keys.empty() || first.values.empty()) throw InputError(where + "layer 0 has no heads");
  info.num_layers = static_cast<int>(data.layers.size());
  info.kv_heads = static_cast<int>(first.keys.size());
  info.head_dim = static_cast<int>(first.keys[0].cols());
  info.value_dim = static_cast<int>(first.values[0].cols());
  info.num_tokens = static_cast<int>(first.keys[0].rows());
  info.has_queries = !first.queries.empty();
  info.has_output_projection = !first.output_projection.empty();
  info.hidden_dim =
      info.has_output_projection ? static_cast<int>(first.output_projection[0].cols()) : 0;
  if (info.has_queries)
    info.q_heads = static_cast<int>(first.queries.size());
  else if (info.q_heads <= 0)
    info.q_heads = info.kv_heads;
  auto writer = CaptureWriter::create(path, info, dtype);
  for (const LayerData& layer : data.layers) writer->write_layer(layer);
  writer->finish();
}

}  // namespace kvscope
