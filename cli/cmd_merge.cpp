// kvscope-cli merge a.json b.json ... --json OUT: combines the shard reports of one
// `eval --shard i/N` run exactly (same spec, every shard once, every work item once) into the
// report an unsharded run writes.
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/eval_output.h"
#include "cli/output_file.h"
#include "engine/error.h"
#include "engine/protocol.h"

namespace kvscope::cli {
namespace {

struct MergeOptions {
  std::vector<std::string> inputs;
  std::string json_out;
  bool quiet = false;
};

void run_merge(const MergeOptions& o) {
  if (!o.json_out.empty()) check_output(o.json_out, o.inputs, "--json");
  if (o.inputs.size() > static_cast<size_t>(kMaxShards))
    throw InputError("merge: " + std::to_string(o.inputs.size()) + " reports given, at most " +
                     std::to_string(kMaxShards));
  std::vector<EvalReport> parts;
  for (const std::string& path : o.inputs) {
    try {
      parts.push_back(EvalReport::from_json(read_json_file(path)));
    } catch (const InputError& e) {
      const std::string msg = e.what();
      throw InputError(msg.rfind(path, 0) == 0 ? msg : path + ": " + msg);
    }
  }
  const EvalReport merged = merge_reports(parts);
  if (!o.quiet) print_report(merged);
  if (!o.json_out.empty()) write_json_file(o.json_out, merged.to_json(), "--json", o.inputs);
}

}  // namespace

void add_merge_command(CLI::App& app) {
  auto o = std::make_shared<MergeOptions>();
  auto* sub = app.add_subcommand("merge", "combine `eval --shard i/N` reports exactly");
  sub->add_option("reports", o->inputs, "shard reports (JSON from eval --json)")->required();
  sub->add_option("--json", o->json_out, "write the merged report");
  sub->add_flag("--quiet", o->quiet, "do not print the tables");
  sub->callback([o] { run_merge(*o); });
}

}  // namespace kvscope::cli
