// What the protocol's two files share (engine/protocol.cpp: the window, the estimators and
// run_eval; engine/protocol_report.cpp: the report's summary, JSON and merge): the work items in
// their canonical order and two text helpers.
#pragma once

#include <sstream>
#include <string>
#include <vector>

#include "engine/protocol.h"

namespace kvscope::protocol_detail {

inline std::string fmt_double(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

inline std::string join(const std::vector<std::string>& items, const char* sep = ", ") {
  std::string out;
  for (const std::string& s : items) out += (out.empty() ? "" : sep) + s;
  return out;
}

struct WorkItem {
  int method = 0, ratio = 0, layer = 0, head = 0;  // positions in the spec's lists
  int point = 0;                                   // position in spec.points (0 without)
};

// Work items in canonical order: layer, kv head, point, method, ratio (layer-major, so
// concurrent workers share the loader's layer cache). Results are always reported in this order.
inline std::vector<WorkItem> all_items(const EvalSpec& spec) {
  std::vector<WorkItem> items;
  const int points = std::max<int>(1, static_cast<int>(spec.points.size()));
  for (int l = 0; l < static_cast<int>(spec.layers.size()); ++l)
    for (int h = 0; h < static_cast<int>(spec.heads.size()); ++h)
      for (int pt = 0; pt < points; ++pt)
        for (int m = 0; m < static_cast<int>(spec.methods.size()); ++m)
          for (int r = 0; r < static_cast<int>(spec.ratios.size()); ++r)
            items.push_back({m, r, l, h, pt});
  return items;
}

// The parameters method `method` of the spec runs with at point `point`.
inline ParamValues item_params(const EvalSpec& spec, const Method& method, int point) {
  ParamValues params;
  if (auto p = spec.params.find(method.name()); p != spec.params.end()) params = p->second;
  if (!spec.points.empty())
    for (const auto& [name, v] : spec.points[point]) params[name] = v;
  return params;
}

}  // namespace kvscope::protocol_detail
