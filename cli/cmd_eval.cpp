// PLACEHOLDER: replaced by the real command.
#include "cli/commands.h"
#include "engine/error.h"

namespace kvscope::cli {
void add_eval_command(CLI::App& app) {
  auto* sub = app.add_subcommand("eval", "(not implemented yet)");
  sub->allow_extras();
  sub->callback([] { throw InputError("eval: not implemented yet"); });
}
}  // namespace kvscope::cli
