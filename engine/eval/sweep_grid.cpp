#include "engine/eval/sweep_grid.h"

#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>

#include "engine/core/error.h"
#include "engine/io/capture.h"

namespace kvscope {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

std::string cell_label(const Grid2Result& r, size_t i, size_t j) {
  char buf[128];
  std::snprintf(buf, sizeof buf, "%s=%g %s=%g", r.rows.name.c_str(), r.rows.values[i],
                r.cols.name.c_str(), r.cols.values[j]);
  return buf;
}

}  // namespace

std::pair<int, int> Grid2Result::best(size_t r, int head) const {
  std::pair<int, int> at{-1, -1};
  double lo = INFINITY;
  if (r >= mean.size()) return at;
  for (size_t i = 0; i < rows.values.size(); ++i)
    for (size_t j = 0; j < cols.values.size(); ++j) {
      const double v = head < 0 ? mean[r][i][j] : head_mean[r][i][j][static_cast<size_t>(head)];
      if (std::isfinite(v) && v < lo) lo = v, at = {static_cast<int>(i), static_cast<int>(j)};
    }
  return at;
}

std::pair<int, int> Grid2Result::default_cell() const {
  std::pair<int, int> at{-1, -1};
  for (size_t i = 0; i < rows.values.size(); ++i)
    if (rows.values[i] == default_row_value) at.first = static_cast<int>(i);
  for (size_t j = 0; j < cols.values.size(); ++j)
    if (cols.values[j] == default_col_value) at.second = static_cast<int>(j);
  if (at.first < 0 || at.second < 0) return {-1, -1};
  return at;
}

nlohmann::json Grid2Result::to_json() const {
  auto num = [](double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(); };
  nlohmann::json j;
  j["format"] = "kvscope-sweep-grid2/1";
  j["method"] = method;
  j["rows"] = {{"param", rows.name}, {"values", rows.values}, {"default", default_row_value}};
  j["cols"] = {{"param", cols.name}, {"values", cols.values}, {"default", default_col_value}};
  j["fixed"] = fixed;
  j["seeds"] = seeds;
  j["notes"] = notes;
  j["failures"] = failures;
  nlohmann::json hs = nlohmann::json::array();
  for (const auto& [l, h] : heads) hs.push_back({{"layer", l}, {"kv_head", h}});
  j["heads"] = hs;
  const auto def = default_cell();
  j["ratios"] = nlohmann::json::array();
  for (size_t r = 0; r < ratios.size(); ++r) {
    nlohmann::json jr;
    jr["ratio"] = ratios[r];
    nlohmann::json m = nlohmann::json::array(), sd = nlohmann::json::array(),
                   hm = nlohmann::json::array();
    for (size_t i = 0; i < rows.values.size(); ++i) {
      nlohmann::json mr = nlohmann::json::array(), sr = nlohmann::json::array(),
                     hr = nlohmann::json::array();
      for (size_t c = 0; c < cols.values.size(); ++c) {
        mr.push_back(num(mean[r][i][c]));
        sr.push_back(num(seed_std[r][i][c]));
        nlohmann::json per = nlohmann::json::array();
        for (double v : head_mean[r][i][c]) per.push_back(num(v));
        hr.push_back(per);
      }
      m.push_back(mr);
      sd.push_back(sr);
      hm.push_back(hr);
    }
    jr["mean"] = m;        // [row][col]
    jr["seed_std"] = sd;   // [row][col]
    jr["head_mean"] = hm;  // [row][col][head]
    const auto b = best(r);
    jr["best"] = b.first < 0 ? nlohmann::json()
                             : nlohmann::json{{"row", b.first},
                                              {"col", b.second},
                                              {rows.name, rows.values[b.first]},
                                              {cols.name, cols.values[b.second]},
                                              {"mean", mean[r][b.first][b.second]}};
    jr["default"] = def.first < 0 ? nlohmann::json()
                                  : nlohmann::json{{"row", def.first},
                                                   {"col", def.second},
                                                   {"mean", num(mean[r][def.first][def.second])}};
    j["ratios"].push_back(jr);
  }
  return j;
}

std::string Grid2Result::to_csv(bool per_head) const {
  std::ostringstream out;
  out.precision(9);
  out << "ratio," << rows.name << ',' << cols.name;
  out << (per_head ? ",layer,kv_head,mean\n" : ",mean,seed_std,is_best,is_default\n");
  const auto def = default_cell();
  auto cell = [](double v) {
    std::ostringstream s;
    s.precision(9);
    if (std::isfinite(v)) s << v;
    return s.str();
  };
  for (size_t r = 0; r < ratios.size(); ++r) {
    const auto b = best(r);
    for (size_t i = 0; i < rows.values.size(); ++i)
      for (size_t c = 0; c < cols.values.size(); ++c) {
        if (per_head) {
          for (size_t h = 0; h < heads.size(); ++h)
            out << ratios[r] << ',' << rows.values[i] << ',' << cols.values[c] << ','
                << heads[h].first << ',' << heads[h].second << ',' << cell(head_mean[r][i][c][h])
                << '\n';
        } else {
          const std::pair<int, int> here{static_cast<int>(i), static_cast<int>(c)};
          out << ratios[r] << ',' << rows.values[i] << ',' << cols.values[c] << ','
              << cell(mean[r][i][c]) << ',' << cell(seed_std[r][i][c]) << ',' << (here == b ? 1 : 0)
              << ',' << (here == def ? 1 : 0) << '\n';
        }
      }
  }
  return out.str();
}

Grid2Result run_grid2(CaptureFile& capture, const EvalSpec& base, const Grid2Spec& g,
                      const std::function<void(int, int)>& progress,
                      const std::atomic<bool>* cancel, Backend* backend) {
  if (!g.method) throw SettingError("two-parameter grid", "--grid2", "no method");
  if (g.rows.name == g.cols.name)
    throw SettingError("two-parameter grid", "--grid2",
                       "both axes sweep '" + g.rows.name + "'; give two different parameters");
  if (g.rows.values.empty() || g.cols.values.empty())
    throw SettingError("two-parameter grid", "--grid2", "each axis needs at least one value");
  const std::vector<ParamSpec> specs = g.method->params();
  Grid2Result res;
  res.method = g.method->name();
  res.rows = g.rows;
  res.cols = g.cols;
  res.fixed = g.fixed;
  res.ratios = base.ratios;
  res.seeds = base.seeds;
  res.default_row_value = param_value(specs, {}, g.rows.name);  // throws on unknown names
  res.default_col_value = param_value(specs, {}, g.cols.name);
  for (const auto& [name, v] : g.fixed)
    if (name == g.rows.name || name == g.cols.name)
      throw SettingError(g.method->name() + "." + name, "--param " + g.method->name() + "." + name,
                         "this parameter is swept by the two-parameter grid");
  const size_t R = base.ratios.size(), I = g.rows.values.size(), J = g.cols.values.size();
  res.mean.assign(R, std::vector<std::vector<double>>(I, std::vector<double>(J, kNaN)));
  res.seed_std = res.mean;
  res.head_mean.assign(
      R, std::vector<std::vector<std::vector<double>>>(I, std::vector<std::vector<double>>(J)));
  // One run for every cell (EvalSpec::points, rows major): each layer is loaded and each head's
  // exact reference built once for the whole grid.
  EvalSpec spec = base;
  spec.methods = {g.method};
  spec.params.clear();
  spec.points.clear();
  for (size_t i = 0; i < I; ++i)
    for (size_t j = 0; j < J; ++j) {
      ParamValues pv = g.fixed;
      pv[g.rows.name] = g.rows.values[i];
      pv[g.cols.name] = g.cols.values[j];
      validate_method_params(*g.method, pv);
      spec.points.push_back(pv);
    }
  const std::vector<EvalReport> reports =
      run_eval(capture, spec, progress, cancel, backend).split_points();
  for (size_t i = 0; i < I; ++i)
    for (size_t j = 0; j < J; ++j) {
      const EvalReport& rep = reports[i * J + j];
      if (res.heads.empty()) {
        for (const HeadEval& h : rep.results)
          if (h.ratio == base.ratios.front()) res.heads.emplace_back(h.layer, h.kv_head);
        res.notes = rep.notes;
      }
      const std::vector<EvalSummary> sum = rep.summary();
      for (size_t r = 0; r < R && r < sum.size(); ++r)
        if (sum[r].heads > 0) {
          res.mean[r][i][j] = sum[r].mean;
          res.seed_std[r][i][j] = sum[r].std;
        }
      for (size_t r = 0; r < R; ++r) {
        std::vector<double>& per = res.head_mean[r][i][j];
        per.assign(res.heads.size(), kNaN);
        for (const HeadEval& h : rep.results) {
          if (h.ratio != base.ratios[r] || h.refused || !h.error.empty()) continue;
          for (size_t k = 0; k < res.heads.size(); ++k)
            if (res.heads[k] == std::pair<int, int>(h.layer, h.kv_head)) per[k] = h.mean;
        }
      }
      for (const std::string& f : rep.failures())
        res.failures.push_back(cell_label(res, i, j) + ": " + f);
    }
  return res;
}

}  // namespace kvscope
