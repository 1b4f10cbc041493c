#include "engine/geometry/projection_cache.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>

#include "engine/core/error.h"
#include "engine/geometry/pca.h"

namespace kvscope {

const char* projection_method_name(ProjectionMethod m) {
  return m == ProjectionMethod::Pca ? "pca" : "tsne";
}

ProjectionMethod parse_projection_method(const std::string& name, const std::string& flag) {
  if (name == "pca") return ProjectionMethod::Pca;
  if (name == "tsne" || name == "t-sne") return ProjectionMethod::Tsne;
  throw InputError(flag + ": '" + name + "' is not a projection (use pca or tsne)");
}

MatrixF projection_input(const CaptureInfo& info, const LayerData& layer, int kv_head,
                         const ProjectionRequest& req, int* query_head_used) {
  const std::string where = "layer " + std::to_string(layer.layer);
  const int kv_heads = static_cast<int>(layer.keys.size());
  if (kv_head < 0 || kv_head >= kv_heads)
    throw SettingError("kv head " + std::to_string(kv_head), "--head " + std::to_string(kv_head),
                       where + " has kv heads 0.." + std::to_string(kv_heads - 1));
  if (kv_head < static_cast<int>(layer.refused.size()) && !layer.refused[kv_head].empty())
    throw InputError(where + " kv head " + std::to_string(kv_head) +
                     " is refused: " + layer.refused[kv_head]);
  if (req.source == ProjectionSource::Values) {
    if (req.with_queries)
      throw InputError("a map of the values cannot be joint with the queries (keys only)");
    if (kv_head >= static_cast<int>(layer.values.size()))
      throw InputError(where + " has no values for kv head " + std::to_string(kv_head));
    return layer.values[kv_head];
  }
  const MatrixF& keys = layer.keys[kv_head];
  if (!req.with_queries) return keys;

  if (layer.queries.empty())
    throw SettingError("with queries", "--with-queries",
                       info.path + " has no queries (layers." + std::to_string(layer.layer) +
                           ".query is missing)");
  const int group = info.group_size() > 0 ? info.group_size() : 1;
  const int first = kv_head * group;
  const int q_head = req.query_head < 0 ? first : req.query_head;
  if (q_head < first || q_head >= first + group || q_head >= static_cast<int>(layer.queries.size()))
    throw SettingError("query head " + std::to_string(q_head),
                       "--query-head " + std::to_string(q_head),
                       "kv head " + std::to_string(kv_head) + " is read by query heads " +
                           std::to_string(first) + ".." + std::to_string(first + group - 1));
  const MatrixF& queries = layer.queries[q_head];
  if (!queries.allFinite())
    throw InputError(where + " query head " + std::to_string(q_head) + " holds NaN or Inf");
  if (query_head_used) *query_head_used = q_head;
  return joint_keys_queries(keys, queries, req.joint);
}

const char* projection_source_name(ProjectionSource s) {
  return s == ProjectionSource::Values ? "values" : "keys";
}

std::string projection_key(const std::string& capture_path, int layer, int kv_head,
                           const ProjectionRequest& req) {
  char buf[512];
  std::string key = capture_path + "|L" + std::to_string(layer) + "|H" + std::to_string(kv_head) +
                    "|" + projection_method_name(req.method);
  if (req.source == ProjectionSource::Values) key += "|values";
  if (req.method == ProjectionMethod::Tsne) {
    const TsneParams& t = req.tsne;
    std::snprintf(
        buf, sizeof buf,
        "|perp=%.17g|it=%d|ee=%.17g|eeit=%d|lr=%.17g|m=%.17g,%.17g|g=%.17g|th=%.17g|ex=%d|fft=%d",
        t.perplexity, t.iterations, t.early_exaggeration, t.exaggeration_iterations,
        t.learning_rate, t.momentum_early, t.momentum_late, t.min_gain, t.theta, t.exact_threshold,
        t.fft_threshold);
    key += buf;
  }
  if (req.with_queries) {
    std::snprintf(buf, sizeof buf, "|q=%d|tr=%d|sc=%d", req.query_head, req.joint.translate ? 1 : 0,
                  req.joint.scale ? 1 : 0);
    key += buf;
  }
  return key;
}

namespace {

// What a finished t-SNE run puts into a Projection, for both the one-shot and the stepped path.
void take_tsne_result(const TsneRun& run, Projection& out) {
  out.coords = run.embedding();
  out.kl = run.kl();
  out.iterations = run.iteration();
  out.perplexity = run.perplexity();
  out.theta = run.theta();
  out.gradient = run.gradient_name();
  out.learning_rate = run.learning_rate();
}

}  // namespace

Projection compute_projection(const CaptureInfo& info, const LayerData& layer, int kv_head,
                              const ProjectionRequest& req, Backend* backend,
                              const std::atomic<bool>* cancel) {
  Projection out;
  out.method = req.method;
  const MatrixF points = projection_input(info, layer, kv_head, req, &out.query_head);
  out.num_keys = static_cast<int>(layer.keys[kv_head].rows());
  out.num_queries = static_cast<int>(points.rows()) - out.num_keys;
  if (req.method == ProjectionMethod::Pca) {
    const PcaResult r = pca(points, 2);
    out.coords = MatrixF::Zero(points.rows(), 2);
    out.coords.leftCols(r.coords.cols()) = r.coords;
    for (int c = 0; c < r.explained_variance.size() && c < 2; ++c)
      out.explained[c] = r.total_variance > 0 ? r.explained_variance(c) / r.total_variance : 0;
    out.kl = std::numeric_limits<double>::quiet_NaN();
    return out;
  }
  TsneRun run(points, req.tsne, backend, cancel);
  run.run_to_end();
  take_tsne_result(run, out);
  return out;
}

Projection run_tsne_projection(const MatrixF& points, const TsneParams& params, Backend* backend,
                               const std::atomic<bool>* cancel, double frame_interval_s,
                               const std::function<void(const TsneRun&)>& on_frame) {
  TsneRun run(points, params, backend, cancel);
  auto last = std::chrono::steady_clock::now();
  while (!run.done()) {
    run.step(10);
    const auto now = std::chrono::steady_clock::now();
    if (on_frame && !run.done() &&
        std::chrono::duration<double>(now - last).count() > frame_interval_s) {
      last = now;
      on_frame(run);
    }
  }
  if (cancel && cancel->load()) throw Cancelled();
  Projection out;
  out.num_keys = static_cast<int>(points.rows());
  out.method = ProjectionMethod::Tsne;
  take_tsne_result(run, out);
  return out;
}

std::shared_ptr<const Projection> ProjectionCache::find(const std::string& key) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (it->first == key) {
      entries_.splice(entries_.begin(), entries_, it);
      return entries_.front().second;
    }
  }
  return nullptr;
}

void ProjectionCache::put(const std::string& key, std::shared_ptr<const Projection> value) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (it->first == key) {
      entries_.erase(it);
      break;
    }
  }
  entries_.emplace_front(key, std::move(value));
  while (entries_.size() > max_entries_) entries_.pop_back();
}

void ProjectionCache::clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  entries_.clear();
}

std::size_t ProjectionCache::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return entries_.size();
}

ProjectionCache& projection_cache() {
  static ProjectionCache cache;
  return cache;
}

}  // namespace kvscope
