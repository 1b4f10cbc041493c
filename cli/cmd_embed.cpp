// kvscope-cli embed: the 2-D map of one kv head's keys (PCA or t-SNE), optionally joint with one
// query head's queries as AttentionViz does, written as CSV (one row per point).
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <sstream>
#include <string>

#include "cli/commands.h"
#include "cli/output_file.h"
#include "cli/validate.h"
#include "engine/core/error.h"
#include "engine/geometry/projection_cache.h"
#include "engine/io/capture.h"
#include "engine/ops/backend.h"

namespace kvscope::cli {
namespace {

struct EmbedOptions {
  std::string file, out, method = "tsne", backend = "cpu";
  int layer = 0, head = 0, query_head = -1;
  double perplexity = 30, theta = -1, learning_rate = 0;
  int iterations = 1000;
  long long fft_above = -1;  // -1: the engine's default (TsneParams::fft_threshold)
  bool with_queries = false, no_translate = false, no_scale = false;
};

void run_embed(const EmbedOptions& o) {
  ProjectionRequest req;
  req.method = parse_projection_method(o.method, "--method");
  check_output(o.out, {o.file}, "--out");
  check_range_real(o.perplexity, 1e-3, 1e6, "--perplexity");
  check_range(o.iterations, 0, 1000000, "--iterations");
  if (!std::isfinite(o.theta) || o.theta > 2)
    throw InputError("--theta: must be in [0, 2] (or negative for automatic)");
  check_range_real(o.learning_rate, -1e12, 1e12, "--learning-rate");
  req.tsne.perplexity = o.perplexity;
  req.tsne.iterations = o.iterations;
  req.tsne.exaggeration_iterations = std::min(req.tsne.exaggeration_iterations, o.iterations);
  req.tsne.theta = o.theta;
  if (o.fft_above >= 0) {
    check_range(o.fft_above, 0, TsneParams::kFftOff, "--fft-above");
    req.tsne.fft_threshold = static_cast<int>(o.fft_above);
  }
  req.tsne.learning_rate = o.learning_rate;
  req.with_queries = o.with_queries;
  req.query_head = o.query_head;
  req.joint.translate = !o.no_translate;
  req.joint.scale = !o.no_scale;
  Backend& backend = select_backend(o.backend);

  auto capture = CaptureFile::open(o.file);
  const CaptureInfo& info = capture->info();
  if (o.layer < 0 || o.layer >= info.num_layers)
    throw InputError("--layer " + std::to_string(o.layer) + ": " + o.file + " has layers 0.." +
                     std::to_string(info.num_layers - 1));
  if (o.head < 0 || o.head >= info.kv_heads)
    throw InputError("--head " + std::to_string(o.head) + ": " + o.file + " has kv heads 0.." +
                     std::to_string(info.kv_heads - 1));
  auto layer = capture->layer(o.layer);

  const auto start = std::chrono::steady_clock::now();
  const Projection p = compute_projection(info, *layer, o.head, req, &backend);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  // A non-finite coordinate is an error naming the head, never a row of the CSV.
  for (int i = 0; i < p.coords.rows(); ++i)
    if (!std::isfinite(p.coords(i, 0)) || !std::isfinite(p.coords(i, 1)))
      throw InputError("embed: " + printable(o.file) + " layer " + std::to_string(o.layer) +
                       " kv head " + std::to_string(o.head) + ": the " + o.method +
                       " map has a non-finite coordinate at row " + std::to_string(i) +
                       " (values too large or degenerate); nothing written");
  std::ostringstream csv;
  csv << (p.num_queries > 0 ? "token,x,y,kind\n" : "token,x,y\n");
  char line[128];
  for (int i = 0; i < p.coords.rows(); ++i) {
    const bool query = i >= p.num_keys;
    const int token = query ? i - p.num_keys : i;
    std::snprintf(line, sizeof line, "%d,%.9g,%.9g%s\n", token, p.coords(i, 0), p.coords(i, 1),
                  p.num_queries > 0 ? (query ? ",query" : ",key") : "");
    csv << line;
  }
  write_output(o.out, csv.str(), "--out", {o.file});

  std::printf("embed: %s layer %d kv head %d: %d keys", printable(o.file).c_str(), o.layer, o.head,
              p.num_keys);
  if (p.num_queries > 0)
    std::printf(" + %d queries of query head %d (joint space%s%s)", p.num_queries, p.query_head,
                req.joint.translate ? ", keys translated" : "",
                req.joint.scale ? ", norms matched" : "");
  if (info.synthetic) std::printf(" [synthetic capture]");
  std::printf("\n");
  if (p.method == ProjectionMethod::Pca) {
    std::printf("pca: axes show %.1f%% and %.1f%% of the variance; %.3f s\n", 100 * p.explained[0],
                100 * p.explained[1], seconds);
  } else {
    // The opening angle means something only for Barnes-Hut.
    char theta[32] = "";
    if (p.gradient == "Barnes-Hut") std::snprintf(theta, sizeof theta, " (theta %g)", p.theta);
    std::printf(
        "tsne: perplexity %g, %d iterations, %s%s, learning rate %g, KL %.4f; %.3f s on %s\n",
        p.perplexity, p.iterations, p.gradient.c_str(), theta, p.learning_rate, p.kl, seconds,
        backend.name().c_str());
  }
  std::printf("wrote %s (%lld rows)\n", printable(o.out).c_str(),
              static_cast<long long>(p.coords.rows()));
}

}  // namespace

void add_embed_command(CLI::App& app) {
  auto* sub = app.add_subcommand(
      "embed", "2-D map (t-SNE or PCA) of one head's keys, optionally joint with its queries");
  auto o = std::make_shared<EmbedOptions>();
  sub->add_option("file", o->file, "capture file (.safetensors or .npz)")->required();
  sub->add_option("--layer", o->layer, "layer index")->required();
  sub->add_option("--head", o->head, "kv head index")->required();
  sub->add_option("--out", o->out, "CSV to write: token,x,y (plus kind with --with-queries)")
      ->required();
  sub->add_option("--method", o->method, "tsne or pca")->capture_default_str();
  sub->add_option("--perplexity", o->perplexity, "t-SNE perplexity")->capture_default_str();
  sub->add_option("--iterations", o->iterations, "t-SNE iterations (250 of them exaggerated)")
      ->capture_default_str();
  sub->add_option("--theta", o->theta,
                  "Barnes-Hut angle; 0 = exact; negative = automatic: exact up to 2000 points, "
                  "Barnes-Hut 0.5 above (or FFT interpolation above --fft-above)")
      ->capture_default_str();
  sub->add_option("--fft-above", o->fft_above,
                  "automatic mode on the CPU: FFT-interpolated repulsion (FIt-SNE) above this many "
                  "points (default 10000; 1073741824 = never)");
  sub->add_option("--learning-rate", o->learning_rate,
                  "t-SNE learning rate; <= 0 = max(n / 12 / 4, 50)")
      ->capture_default_str();
  sub->add_flag("--with-queries", o->with_queries,
                "embed the keys together with one query head's queries (AttentionViz joint space)");
  sub->add_option("--query-head", o->query_head,
                  "query head for --with-queries (default: the first of the kv head's group)");
  sub->add_flag("--no-translate", o->no_translate,
                "with --with-queries: do not move the key centroid onto the query centroid");
  sub->add_flag("--no-scale", o->no_scale,
                "with --with-queries: do not rescale queries and keys to equal mean norm");
  sub->add_option("--backend", o->backend, backend_choices_text() + " (t-SNE gradient)")
      ->capture_default_str();
  sub->callback([o] { run_embed(*o); });
}

}  // namespace kvscope::cli
