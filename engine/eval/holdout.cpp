// Held-out tuning (engine/eval/holdout.h, docs/evaluation.md "Held-out tuning").
#include "engine/eval/holdout.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>

#include "engine/core/error.h"
#include "engine/core/random.h"
#include "engine/core/student_t.h"
#include "engine/eval/seed_stats.h"

namespace kvscope {
namespace {

// Capture figures at one point: whole capture (layer kAllLayers) or per layer, per column.
double capture_figure(const EvalReport& rep, int column, int layer) {
  const double ratio = rep.spec.ratios[column];
  if (layer == kAllLayers) {
    for (const EvalSummary& s : rep.summary())
      if (s.ratio == ratio && s.heads > 0) return s.mean;
    return std::numeric_limits<double>::quiet_NaN();
  }
  std::vector<double> heads;
  for (const HeadEval& he : rep.results)
    if (he.ratio == ratio && he.layer == layer && !he.refused && he.error.empty())
      heads.push_back(he.mean);
  if (heads.empty()) return std::numeric_limits<double>::quiet_NaN();
  return mean_std(heads).first;
}

PromptFigure over_prompts(const std::vector<std::vector<EvalReport>>& reports,
                          const std::vector<int>& prompts, int point, int column, int layer) {
  std::vector<double> values;
  for (int c : prompts) {
    const double v = capture_figure(reports[c][point], column, layer);
    if (!std::isnan(v)) values.push_back(v);
  }
  PromptFigure f;
  f.prompts = static_cast<int>(values.size());
  if (values.empty()) return f;
  const auto [mean, sd] = mean_std(values);
  f.mean = mean;
  if (f.prompts > 1) {
    const double half =
        student_t_quantile(0.975, f.prompts - 1) * sd / std::sqrt(double(f.prompts));
    f.ci_low = mean - half;
    f.ci_high = mean + half;
  }
  return f;
}

nlohmann::json figure_json(const PromptFigure& f) {
  const auto num = [](double v) { return std::isnan(v) ? nlohmann::json() : nlohmann::json(v); };
  return {{"mean", num(f.mean)},
          {"ci_low", num(f.ci_low)},
          {"ci_high", num(f.ci_high)},
          {"prompts", f.prompts}};
}

}  // namespace

PromptSplit split_prompts(int count, double holdout, uint64_t seed) {
  if (!(holdout >= 0 && holdout < 1))
    throw SettingError("held-out share", "--holdout", "must be in [0, 1)");
  PromptSplit split;
  std::vector<int> order(count);
  std::iota(order.begin(), order.end(), 0);
  if (holdout == 0) {
    split.tuning = order;
    return split;
  }
  if (count < 2)
    throw SettingError("held-out share", "--holdout",
                       "the set has " + std::to_string(count) +
                           " prompt: a split needs at least two (one to tune on, one to judge)");
  const int held = std::clamp(static_cast<int>(std::lround(holdout * count)), 1, count - 1);
  // Fisher-Yates from the back, one counter-based uniform per swap.
  for (int i = count - 1; i > 0; --i) {
    const double u = counter_uniform(seed, kRandPromptSplit, 0, 0, 0, 0, static_cast<uint32_t>(i));
    const int j = std::min(i, static_cast<int>(u * (i + 1)));
    std::swap(order[i], order[j]);
  }
  split.held_out.assign(order.begin(), order.begin() + held);
  split.tuning.assign(order.begin() + held, order.end());
  std::sort(split.held_out.begin(), split.held_out.end());
  std::sort(split.tuning.begin(), split.tuning.end());
  return split;
}

HoldoutReport holdout_tuning(const std::vector<std::vector<EvalReport>>& reports,
                             const std::vector<ParamValues>& points, int default_point,
                             const PromptSplit& split, bool per_layer) {
  if (reports.empty() || points.empty())
    throw std::invalid_argument("holdout_tuning: no captures or no points");
  HoldoutReport out;
  out.split = split;
  out.points = points;
  out.default_point = default_point;
  const EvalReport& first = reports[0][0];
  const int columns = static_cast<int>(first.spec.ratios.size());
  std::vector<int> layers{kAllLayers};
  if (per_layer) {
    std::vector<int> seen;
    for (const HeadEval& he : first.results) seen.push_back(he.layer);
    std::sort(seen.begin(), seen.end());
    seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
    layers.insert(layers.end(), seen.begin(), seen.end());
  }
  const int num_points = static_cast<int>(points.size());
  out.tuning_by_point.assign(num_points, std::vector<PromptFigure>(columns));
  for (int p = 0; p < num_points; ++p)
    for (int c = 0; c < columns; ++c)
      out.tuning_by_point[p][c] = over_prompts(reports, split.tuning, p, c, kAllLayers);
  for (int layer : layers)
    for (int c = 0; c < columns; ++c) {
      HoldoutRow row;
      row.column = c;
      row.label = set_column_label(first.spec, c);
      row.layer = layer;
      for (int p = 0; p < num_points; ++p) {
        const PromptFigure f = layer == kAllLayers
                                   ? out.tuning_by_point[p][c]
                                   : over_prompts(reports, split.tuning, p, c, layer);
        // Lowest tuning mean; ties go to the earlier point (the grid's order).
        if (!std::isnan(f.mean) && (row.best_point < 0 || f.mean < row.best_tuning.mean)) {
          row.best_point = p;
          row.best_tuning = f;
        }
      }
      row.default_tuning = over_prompts(reports, split.tuning, default_point, c, layer);
      row.default_held_out = over_prompts(reports, split.held_out, default_point, c, layer);
      if (row.best_point >= 0)
        row.best_held_out = over_prompts(reports, split.held_out, row.best_point, c, layer);
      out.rows.push_back(std::move(row));
    }
  return out;
}

nlohmann::json HoldoutReport::to_json() const {
  nlohmann::json j;
  j["tuning_prompts"] = split.tuning;
  j["held_out_prompts"] = split.held_out;
  j["points"] = nlohmann::json::array();
  for (size_t p = 0; p < points.size(); ++p) {
    nlohmann::json tuning = nlohmann::json::array();
    for (const PromptFigure& f : tuning_by_point[p]) tuning.push_back(figure_json(f));
    j["points"].push_back({{"params", points[p]},
                           {"default", static_cast<int>(p) == default_point},
                           {"tuning", tuning}});
  }
  j["rows"] = nlohmann::json::array();
  for (const HoldoutRow& r : rows) {
    const auto num = [](double v) { return std::isnan(v) ? nlohmann::json() : nlohmann::json(v); };
    j["rows"].push_back(
        {{"column", r.column},
         {"ratio", r.label},
         {"layer", r.layer == kAllLayers ? nlohmann::json("all") : nlohmann::json(r.layer)},
         {"best_params",
          r.best_point >= 0 ? nlohmann::json(points[r.best_point]) : nlohmann::json()},
         {"best_tuning", figure_json(r.best_tuning)},
         {"best_held_out", figure_json(r.best_held_out)},
         {"default_tuning", figure_json(r.default_tuning)},
         {"default_held_out", figure_json(r.default_held_out)},
         {"held_out_gain", num(r.held_out_gain())}});
  }
  return j;
}

}  // namespace kvscope
