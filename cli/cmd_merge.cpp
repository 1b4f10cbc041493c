// PLACEHOLDER: replaced by the real command.
#include "cli/commands.h"
#include "engine/error.h"

namespace kvscope::cli {
void add_merge_command(CLI::App& app) {
  auto* sub = app.add_subcommand("merge", "(not implemented yet)");
  sub->allow_extras();
  sub->callback([] { throw InputError("merge: not implemented yet"); });
}
}  // namespace kvscope::cli
