// Evidence across prompts (engine/eval/set_eval.h, docs/evaluation.md "Capture sets").
#include "engine/eval/set_eval.h"

#include <algorithm>
#include <cmath>
#include <atomic>
#include <chrono>
#include <exception>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>

#include "engine/core/error.h"
#include "engine/core/student_t.h"
#include "engine/core/thread_pool.h"
#include "engine/eval/seed_stats.h"
#include "engine/ops/backend.h"

namespace kvscope {
namespace {

// Quoted CSV field: paths and labels may hold commas; a double quote is doubled.
std::string csv_field(const std::string& s) {
  std::string out = "\"";
  for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

// The figure of each (method, column, layer, kv head) of one complete capture report: the head's
// mean relative error; and the whole capture's (kAllLayers): EvalReport::summary's mean.
using FigureKey = std::tuple<std::string, int, int, int>;

std::map<FigureKey, double> figures_of(const EvalReport& rep) {
  std::map<FigureKey, double> out;
  std::map<double, int> column_of;
  for (size_t r = 0; r < rep.spec.ratios.size(); ++r) column_of[rep.spec.ratios[r]] = int(r);
  for (const HeadEval& he : rep.results)
    if (!he.refused && he.error.empty())
      out[{he.method, column_of.at(he.ratio), he.layer, he.kv_head}] = he.mean;
  for (const EvalSummary& s : rep.summary())
    if (s.heads > 0) out[{s.method, column_of.at(s.ratio), kAllLayers, kAllLayers}] = s.mean;
  return out;
}

void require_complete(const SetEvalReport& rep, const char* what) {
  if (rep.shard_count > 1)
    throw InputError(std::string(what) + ": the report is shard " +
                     std::to_string(rep.shard_index) + " of " + std::to_string(rep.shard_count) +
                     "; merge every shard first (kvscope-cli merge)");
}

}  // namespace

std::string set_column_label(const EvalSpec& spec, int column) {
  std::string label = spec.budgets.empty() ? "" : "B";  // "B256": a budget of 256 middle tokens
  if (!spec.budgets.empty()) return label.append(std::to_string(spec.budgets[column]));
  // The shortest form that reads back as the same double ("0.1", not "0.10000000000000001").
  for (int digits = 15;; ++digits) {
    std::ostringstream os;
    os.precision(digits);
    os << spec.ratios[column];
    if (digits == 17 || std::stod(os.str()) == spec.ratios[column]) return os.str();
  }
}

std::vector<SetRow> SetEvalReport::summary() const {
  require_complete(*this, "the set's summary");
  if (captures.empty()) return {};
  const EvalSpec& spec = captures[0].spec;
  std::vector<std::map<FigureKey, double>> figures;
  for (const EvalReport& rep : captures) figures.push_back(figures_of(rep));
  // Every key any capture has, whole-capture rows first.
  std::vector<FigureKey> keys;
  for (const auto& f : figures)
    for (const auto& [key, v] : f) keys.push_back(key);
  std::sort(keys.begin(), keys.end(), [&](const FigureKey& a, const FigureKey& b) {
    const auto rank = [&](const FigureKey& k) {
      const int m = static_cast<int>(
          std::find_if(spec.methods.begin(), spec.methods.end(),
                       [&](const Method* x) { return x->name() == std::get<0>(k); }) -
          spec.methods.begin());
      return std::make_tuple(std::get<2>(k) != kAllLayers, std::get<2>(k), std::get<3>(k), m,
                             std::get<1>(k));
    };
    return rank(a) < rank(b);
  });
  keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  std::vector<SetRow> rows;
  for (const FigureKey& key : keys) {
    const auto& [method, column, layer, head] = key;
    SetRow row;
    row.method = method;
    row.column = column;
    row.label = set_column_label(spec, column);
    row.layer = layer;
    row.kv_head = head;
    std::vector<double> values;
    double rank_sum = 0;
    for (const auto& f : figures) {
      const auto it = f.find(key);
      if (it == f.end()) continue;
      values.push_back(it->second);
      // The other methods' figures on this prompt at this column, layer and head.
      int better = 0;
      bool best = true;
      for (const Method* other : spec.methods) {
        const auto o = f.find({other->name(), column, layer, head});
        if (o == f.end() || other->name() == method) continue;
        if (o->second < it->second) better += 1, best = false;
      }
      row.wins += best ? 1 : 0;
      rank_sum += 1 + better;
    }
    row.prompts = static_cast<int>(values.size());
    if (values.empty()) continue;
    const auto [mean, sd] = mean_std(values);
    row.mean = mean;
    row.mean_rank = rank_sum / row.prompts;
    if (row.prompts > 1) {
      const double half =
          student_t_quantile(0.975, row.prompts - 1) * sd / std::sqrt(double(row.prompts));
      row.ci_low = mean - half;
      row.ci_high = mean + half;
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

std::vector<PromptLoss> SetEvalReport::worst_prompts(int per_method) const {
  require_complete(*this, "the set's worst prompts");
  if (captures.empty()) return {};
  const EvalSpec& spec = captures[0].spec;
  std::vector<std::map<FigureKey, double>> figures;  // each capture's, computed once
  for (const EvalReport& rep : captures) figures.push_back(figures_of(rep));
  std::vector<PromptLoss> out;
  for (const Method* m : spec.methods)
    for (int column = 0; column < static_cast<int>(spec.ratios.size()); ++column) {
      std::vector<PromptLoss> losses;
      for (size_t c = 0; c < captures.size(); ++c) {
        const std::map<FigureKey, double>& f = figures[c];
        const auto mine = f.find({m->name(), column, kAllLayers, kAllLayers});
        if (mine == f.end()) continue;
        PromptLoss loss{m->name(),           column,    set_column_label(spec, column),
                        static_cast<int>(c), m->name(), 0};
        double best = mine->second;
        for (const Method* other : spec.methods) {
          const auto o = f.find({other->name(), column, kAllLayers, kAllLayers});
          if (o != f.end() && o->second < best) best = o->second, loss.best = other->name();
        }
        loss.loss = mine->second - best;
        losses.push_back(loss);
      }
      std::stable_sort(losses.begin(), losses.end(),
                       [](const PromptLoss& a, const PromptLoss& b) { return a.loss > b.loss; });
      for (int i = 0; i < per_method && i < static_cast<int>(losses.size()); ++i)
        if (losses[i].loss > 0) out.push_back(losses[i]);
    }
  return out;
}

std::string SetEvalReport::captures_csv() const {
  std::ostringstream out;
  out << "capture," << EvalReport::csv_header();
  for (size_t c = 0; c < captures.size(); ++c) {
    std::istringstream rows(captures[c].csv_rows());
    for (std::string line; std::getline(rows, line);)
      out << csv_field(entries[c].path) << ',' << line << '\n';
  }
  return out.str();
}

std::string SetEvalReport::summary_csv() const {
  std::ostringstream out;
  out.precision(17);
  out << "method,ratio,layer,kv_head,mean,ci_low,ci_high,prompts,wins\n";
  for (const SetRow& r : summary()) {
    const auto where = [](int v) {
      return v == kAllLayers ? std::string("all") : std::to_string(v);
    };
    out << r.method << ',' << r.label << ',' << where(r.layer) << ',' << where(r.kv_head) << ','
        << r.mean << ',';
    if (std::isnan(r.ci_low))
      out << ",,";
    else
      out << r.ci_low << ',' << r.ci_high << ',';
    out << r.prompts << ',' << r.wins << '\n';
  }
  return out.str();
}

nlohmann::json SetEvalReport::to_json() const {
  nlohmann::json j;
  j["format"] = "kvscope-set-report/1";
  j["set"] = source;
  j["shard_index"] = shard_index;
  j["shard_count"] = shard_count;
  j["entries"] = nlohmann::json::array();
  for (const CaptureSetEntry& e : entries)
    j["entries"].push_back({{"path", e.path},
                            {"resolved", e.resolved},
                            {"label", e.label},
                            {"prompt", e.prompt},
                            {"num_tokens", e.num_tokens}});
  j["captures"] = nlohmann::json::array();
  for (const EvalReport& rep : captures) j["captures"].push_back(rep.to_json());
  if (shard_count == 1) {
    const auto num = [](double v) { return std::isnan(v) ? nlohmann::json() : nlohmann::json(v); };
    j["summary"] = nlohmann::json::array();
    for (const SetRow& r : summary())
      j["summary"].push_back(
          {{"method", r.method},
           {"column", r.column},
           {"ratio", r.label},
           {"layer", r.layer == kAllLayers ? nlohmann::json("all") : nlohmann::json(r.layer)},
           {"kv_head", r.kv_head == kAllLayers ? nlohmann::json("all") : nlohmann::json(r.kv_head)},
           {"mean", r.mean},
           {"ci_low", num(r.ci_low)},
           {"ci_high", num(r.ci_high)},
           {"interval", "95% Student t across prompts"},
           {"prompts", r.prompts},
           {"wins", r.wins},
           {"mean_rank", r.mean_rank}});
    j["worst_prompts"] = nlohmann::json::array();
    for (const PromptLoss& l : worst_prompts())
      j["worst_prompts"].push_back({{"method", l.method},
                                    {"column", l.column},
                                    {"ratio", l.label},
                                    {"capture", entries[l.capture].path},
                                    {"label", entries[l.capture].label},
                                    {"best", l.best},
                                    {"loss", l.loss}});
  }
  return j;
}

bool is_set_report(const nlohmann::json& j) {
  const auto format = j.is_object() ? j.find("format") : j.end();
  return j.is_object() && format != j.end() && format->is_string() &&
         *format == "kvscope-set-report/1";
}

SetEvalReport SetEvalReport::from_json(const nlohmann::json& j) {
  const auto fail = [](const std::string& why) { throw InputError("set report: " + why); };
  if (!is_set_report(j)) fail("format is not kvscope-set-report/1");
  SetEvalReport rep;
  try {
    rep.source = j.at("set").get<std::string>();
    rep.shard_index = j.at("shard_index").get<int>();
    rep.shard_count = j.at("shard_count").get<int>();
    for (const nlohmann::json& e : j.at("entries")) {
      CaptureSetEntry entry;
      entry.path = e.at("path").get<std::string>();
      entry.resolved = e.at("resolved").get<std::string>();
      entry.label = e.at("label").get<std::string>();
      entry.prompt = e.at("prompt").get<std::string>();
      entry.num_tokens = e.at("num_tokens").get<int>();
      rep.entries.push_back(std::move(entry));
    }
  } catch (const nlohmann::json::exception& e) {
    fail(e.what());
  }
  if (rep.shard_count < 1 || rep.shard_count > kMaxShards || rep.shard_index < 0 ||
      rep.shard_index >= rep.shard_count)
    fail("shard " + std::to_string(rep.shard_index) + " of " + std::to_string(rep.shard_count) +
         " is not a shard");
  const auto found = j.find("captures");
  if (found == j.end()) fail("no \"captures\"");
  const nlohmann::json& caps = *found;
  if (!caps.is_array() || caps.size() != rep.entries.size())
    fail("holds " + std::to_string(caps.is_array() ? caps.size() : 0) + " capture reports for " +
         std::to_string(rep.entries.size()) + " entries");
  for (size_t c = 0; c < caps.size(); ++c) {
    try {
      rep.captures.push_back(EvalReport::from_json(caps[c]));
    } catch (const InputError& e) {
      fail("capture " + rep.entries[c].path + ": " + e.what());
    }
  }
  return rep;
}

int set_eval_lanes(const CaptureSet& set, const EvalSpec& spec, const Backend* backend) {
  const int threads = spec.threads > 0 ? spec.threads : hardware_threads();
  const bool cpu_scoring = !(backend && backend->parallel_in_one_call());
  return cpu_scoring && threads >= 2 && set.entries.size() >= 2 ? 2 : 1;
}

SetEvalReport run_set_eval(const CaptureSet& set, const EvalSpec& spec,
                           const SetEvalProgress& progress, const std::atomic<bool>* cancel,
                           Backend* backend) {
  SetEvalReport rep;
  rep.source = set.source;
  rep.entries = set.entries;
  rep.shard_index = spec.shard_index;
  rep.shard_count = spec.shard_count;
  const int n = static_cast<int>(set.entries.size());
  rep.captures.resize(static_cast<size_t>(n));

  // Two captures at a time on the CPU, each on half the threads: one capture's serial parts
  // (opening it, its first layer's load, the tail of each layer's work) leave cores idle that the
  // other capture's work fills. A capture's report does not depend on its thread count, so the
  // figures are those of one capture at a time. A device backend takes the captures one by one.
  const int lanes = set_eval_lanes(set, spec, backend);
  EvalSpec lane_spec = spec;
  if (lanes > 1)
    lane_spec.threads = std::max(1, (spec.threads > 0 ? spec.threads : hardware_threads()) / lanes);

  std::mutex mu;  // guards next, permille and progress calls
  int next = 0;
  std::vector<int> permille(static_cast<size_t>(n), 0);
  std::vector<std::exception_ptr> errors(static_cast<size_t>(n));
  // Set when a capture fails or the caller cancels, so the other lane stops too.
  std::atomic<bool> stop{false};
  auto lane = [&] {
    while (true) {
      int c = 0;
      {
        std::lock_guard<std::mutex> lock(mu);
        if (next >= n || stop.load() || (cancel && cancel->load())) return;
        c = next++;
      }
      try {
        // Each capture is open only while it is evaluated: its layers leave memory after it.
        std::unique_ptr<CaptureFile> capture = CaptureFile::open(set.entries[c].resolved);
        const ProgressFn each = [&, c](int done, int total) {
          if (cancel && cancel->load()) stop = true;
          std::lock_guard<std::mutex> lock(mu);
          permille[c] = total > 0 ? done * 1000 / total : 1000;
          int sum = 0;
          for (int p : permille) sum += p;
          if (progress) progress(sum, n * 1000);
        };
        EvalReport one = run_eval(*capture, lane_spec, each, &stop, backend);
        // The report names the file as the set lists it, so reports of one set compare across
        // machines and folders; its spec is the set's (the lanes' thread count aside).
        one.capture_path = set.entries[c].path;
        one.spec.threads = spec.threads;
        rep.captures[c] = std::move(one);
      } catch (...) {
        errors[c] = std::current_exception();
        stop = true;
      }
    }
  };
  // The caller's cancel reaches the captures being evaluated within 20 ms (run_eval reads `stop`,
  // which a failing capture sets too).
  std::atomic<bool> finished{false};
  std::thread watcher;
  if (cancel)
    watcher = std::thread([&] {
      while (!finished.load()) {
        if (cancel->load()) stop = true;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    });
  if (lanes == 1) {
    lane();
  } else {
    std::thread other(lane);
    lane();
    other.join();
  }
  finished = true;
  if (watcher.joinable()) watcher.join();
  if (cancel && cancel->load()) throw Cancelled();
  // The first failure in set order; a capture stopped only because the other lane's capture
  // failed threw Cancelled and is not a failure of its own.
  for (const std::exception_ptr& e : errors) {
    if (!e) continue;
    try {
      std::rethrow_exception(e);
    } catch (const Cancelled&) {
    }
  }
  return rep;
}

SetEvalReport merge_set_reports(const std::vector<SetEvalReport>& parts) {
  if (parts.empty()) throw InputError("merge: no set reports given");
  const SetEvalReport& first = parts[0];
  for (const SetEvalReport& p : parts) {
    if (p.source != first.source || p.entries.size() != first.entries.size())
      throw InputError("merge: the reports are of different sets (" + first.source + ", " +
                       p.source + ")");
    for (size_t c = 0; c < p.entries.size(); ++c)
      if (p.entries[c].path != first.entries[c].path)
        throw InputError("merge: entry " + std::to_string(c + 1) + " is " + p.entries[c].path +
                         " in one report and " + first.entries[c].path + " in another");
  }
  SetEvalReport out;
  out.source = first.source;
  out.entries = first.entries;
  for (size_t c = 0; c < first.entries.size(); ++c) {
    std::vector<EvalReport> shards;
    for (const SetEvalReport& p : parts) shards.push_back(p.captures[c]);
    try {
      out.captures.push_back(merge_reports(shards));
    } catch (const InputError& e) {
      throw InputError("merge: capture " + first.entries[c].path + ": " + e.what());
    }
  }
  return out;
}

}  // namespace kvscope
