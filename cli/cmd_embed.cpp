// PLACEHOLDER: replaced by the real command.
#include "cli/commands.h"
#include "engine/error.h"

namespace kvscope::cli {
void add_embed_command(CLI::App& app) {
  auto* sub = app.add_subcommand("embed", "(not implemented yet)");
  sub->allow_extras();
  sub->callback([] { throw InputError("embed: not implemented yet"); });
}
}  // namespace kvscope::cli
