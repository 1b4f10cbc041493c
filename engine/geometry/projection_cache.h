// 2-D maps of one head's keys (and optionally its queries), shared by `kvscope-cli embed` and the
// Geometry view: what goes into the projection, a canonical cache key per (capture path, layer,
// kv head, parameters), and a small thread-safe in-memory cache so revisiting a head is instant.
#pragma once

#include <atomic>
#include <cstddef>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "engine/geometry/tsne.h"
#include "engine/io/capture.h"

namespace kvscope {

class Backend;

enum class ProjectionMethod { Pca, Tsne };
const char* projection_method_name(ProjectionMethod m);  // "pca" / "tsne"
// "pca" or "tsne"; throws InputError naming `flag` otherwise.
ProjectionMethod parse_projection_method(const std::string& name, const std::string& flag);

// What a map embeds: the kv head's keys (the default) or its values (SubGen's Figure 1 shows
// both, one row each).
enum class ProjectionSource { Keys, Values };
const char* projection_source_name(ProjectionSource s);  // "keys" / "values"

struct ProjectionRequest {
  ProjectionMethod method = ProjectionMethod::Tsne;
  ProjectionSource source = ProjectionSource::Keys;  // values: with_queries must be false
  TsneParams tsne;                                   // used when method == Tsne
  bool with_queries = false;  // joint map of keys and one query head (AttentionViz)
  int query_head = -1;        // -1: the first query head of the kv head's GQA group
  JointOptions joint;         // how keys and queries are brought into one space
};

// The points a request projects: the kv head's keys (n x d) -- or its values (n x d_v) when
// source is Values -- followed by the query head's queries
// (n x d) in the joint space when with_queries. `query_head_used` (optional) receives the query
// head. Throws InputError naming the layer/head: head out of range, head refused (NaN/Inf),
// queries requested but not captured or asked for with values, query head not in the kv head's
// group.
MatrixF projection_input(const CaptureInfo& info, const LayerData& layer, int kv_head,
                         const ProjectionRequest& req, int* query_head_used = nullptr);

// Canonical key: path, layer, head and every parameter that changes the result.
std::string projection_key(const std::string& capture_path, int layer, int kv_head,
                           const ProjectionRequest& req);

struct Projection {
  MatrixF coords;  // (num_keys + num_queries) x 2, keys first
  int num_keys = 0;
  int num_queries = 0;
  int query_head = -1;  // when num_queries > 0
  ProjectionMethod method = ProjectionMethod::Tsne;
  // t-SNE only (NaN / 0 for PCA):
  double kl = 0;
  int iterations = 0;
  double perplexity = 0, theta = 0, learning_rate = 0;
  std::string gradient;  // t-SNE: "exact gradient", "Barnes-Hut" or "FFT interpolation"
  // PCA only: share of the variance the two axes show.
  double explained[2] = {0, 0};
};

// Runs a request to the end (PCA, or t-SNE through `backend`; nullptr = CPU). Throws InputError
// for bad input and Cancelled when `cancel` is set.
Projection compute_projection(const CaptureInfo& info, const LayerData& layer, int kv_head,
                              const ProjectionRequest& req, Backend* backend = nullptr,
                              const std::atomic<bool>* cancel = nullptr);

// t-SNE of `points` to the end, stepping in blocks of 10 iterations and calling `on_frame` with
// the run at most every `frame_interval_s` seconds (an animation of the map converging), never
// for the final state. Throws Cancelled when `cancel` is set.
Projection run_tsne_projection(const MatrixF& points, const TsneParams& params, Backend* backend,
                               const std::atomic<bool>* cancel, double frame_interval_s,
                               const std::function<void(const TsneRun&)>& on_frame);

// Least-recently-used cache of finished projections. All members are thread-safe.
class ProjectionCache {
 public:
  explicit ProjectionCache(std::size_t max_entries = 32) : max_entries_(max_entries) {}
  std::shared_ptr<const Projection> find(const std::string& key);
  void put(const std::string& key, std::shared_ptr<const Projection> value);
  void clear();
  std::size_t size() const;

 private:
  using Entry = std::pair<std::string, std::shared_ptr<const Projection>>;
  mutable std::mutex mutex_;
  std::size_t max_entries_;
  std::list<Entry> entries_;  // most recent first
};

// The process-wide cache the CLI and the app share.
ProjectionCache& projection_cache();

}  // namespace kvscope
