// PLACEHOLDER: replaced by the real command.
#include "cli/commands.h"
#include "engine/error.h"

namespace kvscope::cli {
void add_info_command(CLI::App& app) {
  auto* sub = app.add_subcommand("info", "(not implemented yet)");
  sub->allow_extras();
  sub->callback([] { throw InputError("info: not implemented yet"); });
}
}  // namespace kvscope::cli
