// The evaluation report (engine/eval/protocol.h): failures, the per-point split, the summary over
// heads and seeds, its JSON (written and read back with every field checked) and the merge of
// shards. The run itself is engine/eval/protocol.cpp.
#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "engine/core/error.h"
#include "engine/eval/protocol.h"
#include "engine/eval/protocol_detail.h"
#include "engine/eval/seed_stats.h"
#include "engine/io/json_fields.h"

namespace kvscope {
namespace {

using protocol_detail::all_items;
using protocol_detail::fmt_double;
using protocol_detail::item_params;
using protocol_detail::join;
using protocol_detail::WorkItem;

nlohmann::json params_json(const std::map<std::string, ParamValues>& p) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [method, values] : p) {
    nlohmann::json v = nlohmann::json::object();
    for (const auto& [name, value] : values) v[name] = value;
    j[method] = v;
  }
  return j;
}

std::vector<std::string> method_names(const std::vector<const Method*>& methods) {
  std::vector<std::string> names;
  for (const Method* m : methods) names.push_back(m->name());
  return names;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Summary and JSON

std::vector<std::string> EvalReport::failures() const {
  std::vector<std::string> out;
  for (const Method* m : spec.methods) {
    int failed = 0, of = 0;
    std::string first;
    for (const HeadEval& he : results) {
      if (he.method != m->name()) continue;
      ++of;
      if (!he.error.empty() && failed++ == 0) first = he.error;
    }
    if (failed)
      out.push_back(m->name() + " failed on " + std::to_string(failed) + " of " +
                    std::to_string(of) + " work items: " + first);
  }
  return out;
}

std::vector<EvalReport> EvalReport::split_points() const {
  if (spec.points.empty()) return {*this};
  std::vector<EvalReport> out(spec.points.size());
  for (size_t pt = 0; pt < out.size(); ++pt) {
    EvalReport& r = out[pt];
    r.capture_path = capture_path;
    r.info = info;
    r.spec = spec;
    r.spec.points.clear();
    r.spec.params[spec.methods[0]->name()] = item_params(spec, *spec.methods[0], int(pt));
    r.window_example = window_example;
    r.proxy_queries = proxy_queries;
    r.notes = notes;
  }
  for (const HeadEval& h : results) {
    HeadEval copy = h;
    copy.point = 0;
    out.at(h.point).results.push_back(std::move(copy));
  }
  return out;
}

std::vector<EvalSummary> EvalReport::summary() const {
  std::vector<EvalSummary> out;
  for (const Method* m : spec.methods) {
    for (double ratio : spec.ratios) {
      EvalSummary s;
      s.method = m->name();
      s.ratio = ratio;
      std::vector<const HeadEval*> heads;
      for (const HeadEval& he : results)
        if (he.method == s.method && he.ratio == ratio && !he.refused && he.error.empty())
          heads.push_back(&he);
      s.heads = static_cast<int>(heads.size());
      if (!heads.empty()) {
        double mean = 0;
        for (const HeadEval* he : heads) mean += he->mean;
        s.mean = mean / static_cast<double>(heads.size());
        // Spread over seeds: the mean over heads, one value per seed.
        std::vector<double> per_seed(heads[0]->per_seed.size(), 0.0);
        for (const HeadEval* he : heads)
          for (size_t r = 0; r < per_seed.size() && r < he->per_seed.size(); ++r)
            per_seed[r] += he->per_seed[r] / static_cast<double>(heads.size());
        s.std = mean_std(per_seed).second;
        // Harm kept vs dropped: means over the heads that have it.
        double kept = 0, dropped = 0, share = 0;
        int with_harm = 0, with_share = 0;
        for (const HeadEval* he : heads) {
          if (!he->has_harm()) continue;
          ++with_harm;
          kept += he->harm_kept;
          dropped += he->harm_dropped;
          if (he->harm_kept + he->harm_dropped > 0) {
            share += he->harm_dropped / (he->harm_kept + he->harm_dropped);
            ++with_share;
          }
        }
        if (with_harm > 0) {
          s.harm_kept = kept / with_harm;
          s.harm_dropped = dropped / with_harm;
          s.harm_dropped_share = with_share > 0 ? share / with_share : 0.0;
        }
      }
      out.push_back(s);
    }
  }
  return out;
}

nlohmann::json EvalReport::to_json() const {
  if (!spec.points.empty())
    throw std::logic_error("EvalReport::to_json: a report with points is written by point");
  using nlohmann::json;
  json j;
  j["format"] = "kvscope-eval/1";
  j["capture"] = {{"path", capture_path},           {"model", info.model},
                  {"source", info.source},          {"synthetic", info.synthetic},
                  {"num_layers", info.num_layers},  {"q_heads", info.q_heads},
                  {"kv_heads", info.kv_heads},      {"head_dim", info.head_dim},
                  {"value_dim", info.value_dim},    {"num_tokens", info.num_tokens},
                  {"has_queries", info.has_queries}};
  const EvalWindow& w = window_example;
  json budgets = json::array();
  for (double r : spec.ratios)
    if (w.n > 0) budgets.push_back(static_cast<int>(std::llround(r * w.n_mid)));
  j["window"] = {{"n", w.n},
                 {"s", w.sink},
                 {"E", w.eval},
                 {"n_mid", w.n_mid},
                 {"budgets", budgets},
                 {"scaled_down", w.scaled_down()},
                 {"describe", w.describe()}};
  j["spec"] = {{"methods", method_names(spec.methods)},
               {"ratios", spec.ratios},
               {"seeds", spec.seeds},
               {"base_seed", spec.base_seed},
               {"layers", spec.layers},
               {"heads", spec.heads},
               {"params", params_json(spec.params)},
               {"sink", spec.sink},
               {"eval", spec.eval},
               {"shard_index", spec.shard_index},
               {"shard_count", spec.shard_count},
               {"estimator", estimator_name(spec.estimator)}};
  if (!spec.budgets.empty()) j["spec"]["budgets"] = spec.budgets;
  j["proxy_queries"] = proxy_queries;
  j["notes"] = notes;
  j["failures"] = failures();
  json sum = json::array();
  const std::vector<EvalSummary> summary_rows = summary();
  for (const EvalSummary& s : summary_rows)
    sum.push_back({{"method", s.method},
                   {"ratio", s.ratio},
                   {"mean", s.mean},
                   {"std", s.std},
                   {"heads", s.heads}});
  if (spec.harm)
    for (size_t i = 0; i < sum.size(); ++i) {
      const EvalSummary& s = summary_rows[i];
      if (std::isnan(s.harm_kept)) continue;
      sum[i]["harm_kept"] = s.harm_kept;
      sum[i]["harm_dropped"] = s.harm_dropped;
      sum[i]["harm_dropped_share"] = s.harm_dropped_share;
    }
  if (spec.harm) j["spec"]["harm"] = true;
  j["summary"] = sum;
  json res = json::array();
  for (const HeadEval& he : results) {
    json r = {{"method", he.method},
              {"ratio", he.ratio},
              {"layer", he.layer},
              {"kv_head", he.kv_head},
              {"mean", he.mean},
              {"std", he.std},
              {"normalized_mean", he.normalized_mean},
              {"mass_mean", he.mass_mean},
              {"per_seed", he.per_seed},
              {"per_query", he.per_query},
              {"refused", he.refused}};
    if (!he.note.empty()) r["note"] = he.note;
    if (!he.refused && he.error.empty()) {
      r["kept"] = he.kept;
      r["budget"] = he.budget;
    }
    if (he.saturation >= 0) r["saturation"] = he.saturation;
    if (he.has_harm()) {
      r["harm_kept"] = he.harm_kept;
      r["harm_dropped"] = he.harm_dropped;
    }
    if (!he.error.empty()) r["error"] = he.error;
    res.push_back(r);
  }
  j["results"] = res;
  return j;
}

namespace {
constexpr long long kMaxWorkItems = 1 << 24;  // of a report read back (EvalReport::from_json)
}  // namespace

EvalReport EvalReport::from_json(const nlohmann::json& j) {
  // Every field is read through JsonField: a wrong type, a missing field or a value out of range
  // throws InputError naming the field's path ("eval report field \"results[3].mean\": expected a
  // number, got null"). Ranges are checked before anything is sized by them (merge allocates per
  // shard and per work item).
  EvalReport rep;
  const JsonField doc(j, "eval report");
  if (!j.is_object() || !j.contains("format") || !j["format"].is_string() ||
      j["format"].get<std::string>() != "kvscope-eval/1")
    doc.fail("not a kvscope eval report (\"format\" is not \"kvscope-eval/1\")");

  const JsonField c = doc.at("capture");
  rep.capture_path = c.at("path").string();
  rep.info.path = rep.capture_path;
  rep.info.model = c.at("model").string();
  rep.info.source = c.get("source", "");
  rep.info.synthetic = c.get("synthetic", false);
  rep.info.num_layers = c.at("num_layers").integer(1, kMaxCaptureLayers);
  rep.info.q_heads = c.at("q_heads").integer(1, kMaxCaptureHeads);
  rep.info.kv_heads = c.at("kv_heads").integer(1, kMaxCaptureHeads);
  rep.info.head_dim = c.at("head_dim").integer(1, kMaxCaptureHeadDim);
  rep.info.value_dim = c.get("value_dim", rep.info.head_dim, 1, kMaxCaptureHeadDim);
  rep.info.num_tokens = c.at("num_tokens").integer(1, kMaxCaptureTokens);
  rep.info.has_queries = c.at("has_queries").boolean();

  const JsonField s = doc.at("spec");
  for (const JsonField& name : s.at("methods").elements()) {
    const Method* m = find_method(name.string());
    if (!m) name.fail("unknown method '" + name.string() + "'");
    rep.spec.methods.push_back(m);
  }
  const JsonField ratios = s.at("ratios");
  if (ratios.size() < 1 || ratios.size() > 1000)
    ratios.fail("holds " + std::to_string(ratios.size()) + " ratios, expected 1 to 1000");
  rep.spec.ratios.clear();  // EvalSpec's default ratios are not the report's
  for (const JsonField& r : ratios.elements()) {
    const double x = r.number();
    if (!(x > 0 && x <= 1)) r.fail(fmt_double(x) + " is not a keep ratio in (0, 1]");
    rep.spec.ratios.push_back(x);
  }
  if (const std::optional<JsonField> b = s.find("budgets")) {
    if (b->size() > 1000)
      b->fail("holds " + std::to_string(b->size()) + " budgets, more than 1000");
    rep.spec.budgets = b->integers(1, kMaxCaptureTokens);
    if (!rep.spec.budgets.empty() && rep.spec.budgets.size() != rep.spec.ratios.size())
      b->fail("holds " + std::to_string(rep.spec.budgets.size()) + " budgets for " +
              std::to_string(rep.spec.ratios.size()) + " ratios");
  }
  rep.spec.harm = s.get("harm", false);
  rep.spec.seeds = s.at("seeds").integer(1, kMaxSeeds);
  rep.spec.base_seed = s.at("base_seed").unsigned_integer();
  rep.spec.layers = s.at("layers").integers(0, rep.info.num_layers - 1);
  rep.spec.heads = s.at("heads").integers(0, rep.info.kv_heads - 1);
  if (rep.spec.layers.size() > static_cast<size_t>(rep.info.num_layers) ||
      rep.spec.heads.size() > static_cast<size_t>(rep.info.kv_heads))
    s.fail("lists more layers or heads than the capture has");
  // merge lays out every work item of the spec: bounded before anything is sized by it (an
  // eval of a llama3-8b capture with every method at 4 ratios has about 10^4).
  const double work_items =
      static_cast<double>(rep.spec.methods.size()) * static_cast<double>(rep.spec.ratios.size()) *
      static_cast<double>(rep.spec.layers.size()) * static_cast<double>(rep.spec.heads.size());
  if (work_items > static_cast<double>(kMaxWorkItems))
    s.fail("asks for " + std::to_string(static_cast<long long>(work_items)) +
           " work items (methods x ratios x layers x heads), more than " +
           std::to_string(kMaxWorkItems));
  for (const auto& [method, values] : s.at("params").members())
    for (const auto& [name, value] : values.members())
      rep.spec.params[method][name] = value.number();
  rep.spec.sink = s.at("sink").integer(-1, kMaxCaptureTokens);
  rep.spec.eval = s.at("eval").integer(-1, kMaxCaptureTokens);
  rep.spec.shard_count = s.at("shard_count").integer(1, kMaxShards);
  rep.spec.shard_index = s.at("shard_index").integer(0, rep.spec.shard_count - 1);
  if (const std::optional<JsonField> e = s.find("estimator")) {
    const std::string name = e->string();
    if (name != "weighted" && name != "authors")
      e->fail("'" + name + "' is not weighted or authors");
    rep.spec.estimator = parse_estimator(name);
  }
  try {
    rep.window_example =
        EvalWindow::make(rep.info.num_tokens, rep.spec.ratios[0], rep.spec.sink, rep.spec.eval);
  } catch (const InputError& e) {
    s.fail(std::string("its window does not fit the capture: ") + e.what());
  }

  rep.proxy_queries = doc.get("proxy_queries", false);
  if (const std::optional<JsonField> notes = doc.find("notes")) rep.notes = notes->strings();
  const JsonField results = doc.at("results");
  const size_t max_results = static_cast<size_t>(rep.spec.methods.size()) * rep.spec.ratios.size() *
                             std::max<size_t>(1, rep.spec.layers.size()) *
                             std::max<size_t>(1, rep.spec.heads.size());
  if (results.size() > max_results)
    results.fail("holds " + std::to_string(results.size()) + " entries, more than the spec's " +
                 std::to_string(max_results) + " work items");
  for (const JsonField& r : results.elements()) {
    HeadEval he;
    he.method = r.at("method").string();
    he.ratio = r.at("ratio").number();
    he.layer = r.at("layer").integer(0, rep.info.num_layers - 1);
    he.kv_head = r.at("kv_head").integer(0, rep.info.kv_heads - 1);
    he.mean = r.at("mean").number();
    he.std = r.at("std").number();
    he.normalized_mean = r.get("normalized_mean", 0.0);
    he.mass_mean = r.get("mass_mean", 0.0);
    if (const std::optional<JsonField> v = r.find("per_seed")) he.per_seed = v->numbers();
    if (const std::optional<JsonField> v = r.find("per_query")) he.per_query = v->numbers();
    he.refused = r.get("refused", false);
    he.note = r.get("note", "");
    he.error = r.get("error", "");
    he.kept = r.get("kept", 0, 0, kMaxCaptureTokens);
    he.budget = r.get("budget", 0, 0, kMaxCaptureTokens);
    he.saturation = r.get("saturation", -1.0);
    if (r.has("harm_kept")) he.harm_kept = r.at("harm_kept").number();
    if (r.has("harm_dropped")) he.harm_dropped = r.at("harm_dropped").number();
    rep.results.push_back(std::move(he));
  }
  return rep;
}

// ---------------------------------------------------------------------------------------------
// Merge

EvalReport merge_reports(const std::vector<EvalReport>& parts) {
  if (parts.empty()) throw InputError("merge: no reports given");
  const EvalReport& first = parts[0];
  const EvalSpec& fs = first.spec;
  auto same_spec = [&](const EvalSpec& s) {
    return method_names(s.methods) == method_names(fs.methods) && s.ratios == fs.ratios &&
           s.budgets == fs.budgets && s.harm == fs.harm && s.seeds == fs.seeds &&
           s.base_seed == fs.base_seed && s.layers == fs.layers && s.heads == fs.heads &&
           s.params == fs.params && s.sink == fs.sink && s.eval == fs.eval &&
           s.shard_count == fs.shard_count && s.estimator == fs.estimator;
  };
  std::set<int> shards;
  for (size_t p = 0; p < parts.size(); ++p) {
    const EvalReport& r = parts[p];
    const std::string which = "merge: report " + std::to_string(p + 1);
    if (r.info.model != first.info.model || r.info.num_tokens != first.info.num_tokens ||
        r.info.num_layers != first.info.num_layers || r.info.kv_heads != first.info.kv_heads ||
        r.info.q_heads != first.info.q_heads)
      throw InputError(which + " is of a different capture (" + r.info.model + ", " +
                       std::to_string(r.info.num_tokens) + " tokens) than report 1 (" +
                       first.info.model + ", " + std::to_string(first.info.num_tokens) +
                       " tokens)");
    if (!same_spec(r.spec))
      throw InputError(which +
                       " was run with a different spec (methods, ratios, seeds, layers, "
                       "heads, params, window or shard count) than report 1");
    if (!shards.insert(r.spec.shard_index).second)
      throw InputError(which + ": shard " + std::to_string(r.spec.shard_index) + "/" +
                       std::to_string(fs.shard_count) + " is given twice");
  }
  std::vector<std::string> missing;
  for (int i = 0; i < fs.shard_count; ++i)
    if (!shards.count(i)) {
      if (missing.size() == 10) {
        missing.push_back("... (" + std::to_string(fs.shard_count - shards.size()) + " in all)");
        break;
      }
      missing.push_back(std::to_string(i) + "/" + std::to_string(fs.shard_count));
    }
  if (!missing.empty()) throw InputError("merge: missing shard(s) " + join(missing));

  EvalReport out = first;
  out.spec.shard_index = 0;
  out.spec.shard_count = 1;
  out.results.clear();
  out.notes.clear();

  // Put every result at its canonical position; each must be filled exactly once.
  EvalSpec canon = fs;
  const std::vector<WorkItem> items = all_items(canon);
  auto pos = [](const auto& list, const auto& v) {
    return static_cast<int>(std::find(list.begin(), list.end(), v) - list.begin());
  };
  const std::vector<std::string> names = method_names(fs.methods);
  std::vector<HeadEval> slots(items.size());
  std::vector<char> filled(items.size(), 0);
  const size_t nr = fs.ratios.size(), nm = names.size(), nh = fs.heads.size();
  for (const EvalReport& r : parts) {
    for (const std::string& note : r.notes)
      if (std::find(out.notes.begin(), out.notes.end(), note) == out.notes.end())
        out.notes.push_back(note);
    for (const HeadEval& he : r.results) {
      const size_t l = pos(fs.layers, he.layer), h = pos(fs.heads, he.kv_head),
                   m = pos(names, he.method), q = pos(fs.ratios, he.ratio);
      if (l >= fs.layers.size() || h >= nh || m >= nm || q >= nr)
        throw InputError("merge: result " + he.method + " ratio " + fmt_double(he.ratio) +
                         " layer " + std::to_string(he.layer) + " kv head " +
                         std::to_string(he.kv_head) + " is not part of the spec");
      const size_t index = ((l * nh + h) * nm + m) * nr + q;
      if (filled[index]++)
        throw InputError("merge: result " + he.method + " ratio " + fmt_double(he.ratio) +
                         " layer " + std::to_string(he.layer) + " kv head " +
                         std::to_string(he.kv_head) + " appears in more than one report");
      slots[index] = he;
    }
  }
  for (size_t i = 0; i < items.size(); ++i)
    if (!filled[i])
      throw InputError("merge: no result for " + names[items[i].method] + " ratio " +
                       fmt_double(fs.ratios[items[i].ratio]) + " layer " +
                       std::to_string(fs.layers[items[i].layer]) + " kv head " +
                       std::to_string(fs.heads[items[i].head]) + " (a shard is incomplete)");
  out.results = std::move(slots);
  return out;
}

std::string EvalReport::csv_header() {
  return "method,ratio,layer,kv_head,mean,std,normalized_mean,mass_mean,refused,error\n";
}

std::string EvalReport::csv_rows() const {
  std::ostringstream out;
  out.precision(17);
  for (const HeadEval& he : results) {
    std::string err = he.error;
    for (char& c : err)
      if (c == '"') c = '\'';
    out << he.method << ',' << he.ratio << ',' << he.layer << ',' << he.kv_head << ',' << he.mean
        << ',' << he.std << ',' << he.normalized_mean << ',' << he.mass_mean << ','
        << (he.refused ? 1 : 0) << ",\"" << err << "\"\n";
  }
  return out.str();
}

}  // namespace kvscope
