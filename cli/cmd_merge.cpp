// kvscope-cli merge a.json b.json ... --json OUT: combines the shard reports of one
// `eval --shard i/N` run exactly (same spec, every shard once, every work item once) into the
// report an unsharded run writes; for the shards of `eval SET`, each capture's shards.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/eval_output.h"
#include "cli/output_file.h"
#include "engine/core/error.h"
#include "engine/core/printable.h"
#include "engine/eval/protocol.h"
#include "engine/eval/set_eval.h"

namespace kvscope::cli {
namespace {

struct MergeOptions {
  std::vector<std::string> inputs;
  std::string json_out;
  std::string csv_out, summary_csv_out;
  bool quiet = false;
};

void run_merge(const MergeOptions& o) {
  if (!o.json_out.empty()) check_output(o.json_out, o.inputs, "--json");
  if (!o.csv_out.empty()) check_output(o.csv_out, o.inputs, "--csv");
  if (!o.summary_csv_out.empty()) check_output(o.summary_csv_out, o.inputs, "--summary-csv");
  if (o.inputs.size() > static_cast<size_t>(kMaxShards))
    throw InputError("merge: " + std::to_string(o.inputs.size()) + " reports given, at most " +
                     std::to_string(kMaxShards));
  std::vector<nlohmann::json> docs;
  for (const std::string& path : o.inputs) docs.push_back(read_json_file(path));
  const auto named = [&](size_t i, const InputError& e) {
    const std::string msg = e.what();
    return InputError(msg.rfind(o.inputs[i], 0) == 0 ? msg : o.inputs[i] + ": " + msg);
  };
  if (is_set_report(docs[0])) {
    // The shards of `eval SET --shard i/N`: each capture's shards merged exactly.
    std::vector<SetEvalReport> parts;
    for (size_t i = 0; i < docs.size(); ++i) {
      if (!is_set_report(docs[i]))
        throw InputError(o.inputs[i] + ": an eval report of one capture among set reports");
      try {
        parts.push_back(SetEvalReport::from_json(docs[i]));
      } catch (const InputError& e) {
        throw named(i, e);
      }
    }
    const SetEvalReport merged = merge_set_reports(parts);
    if (!o.quiet)
      std::printf("set      %s: %zu captures merged from %zu shard reports\n",
                  printable(merged.source).c_str(), merged.entries.size(), parts.size());
    if (!o.json_out.empty()) write_json_file(o.json_out, merged.to_json(), "--json", o.inputs);
    if (!o.csv_out.empty()) write_output(o.csv_out, merged.captures_csv(), "--csv", o.inputs);
    if (!o.summary_csv_out.empty())
      write_output(o.summary_csv_out, merged.summary_csv(), "--summary-csv", o.inputs);
    return;
  }
  std::vector<EvalReport> parts;
  for (size_t i = 0; i < docs.size(); ++i) {
    if (is_set_report(docs[i]))
      throw InputError(o.inputs[i] + ": a set report among eval reports of one capture");
    try {
      parts.push_back(EvalReport::from_json(docs[i]));
    } catch (const InputError& e) {
      throw named(i, e);
    }
  }
  if (!o.summary_csv_out.empty())
    throw InputError("--summary-csv: only for the shards of a capture set");
  const EvalReport merged = merge_reports(parts);
  if (!o.quiet) print_report(merged);
  if (!o.json_out.empty()) write_json_file(o.json_out, merged.to_json(), "--json", o.inputs);
  if (!o.csv_out.empty()) write_csv_file(o.csv_out, merged, "--csv", o.inputs);
}

}  // namespace

void add_merge_command(CLI::App& app) {
  auto o = std::make_shared<MergeOptions>();
  auto* sub = app.add_subcommand(
      "merge", "combine `eval --shard i/N` reports exactly (of one capture or of a set)");
  sub->add_option("reports", o->inputs, "shard reports (JSON from eval --json)")->required();
  sub->add_option("--json", o->json_out, "write the merged report");
  sub->add_option("--csv", o->csv_out, "write the merged rows (for a set: per capture)");
  sub->add_option("--summary-csv", o->summary_csv_out,
                  "sets: write the rows across prompts (as eval SET --summary-csv)");
  sub->add_flag("--quiet", o->quiet, "do not print the tables");
  sub->callback([o] { run_merge(*o); });
}

}  // namespace kvscope::cli
