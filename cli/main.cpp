#include <cstdio>
#include <exception>

#include "cli/commands.h"
#include "engine/error.h"

int main(int argc, char** argv) {
  CLI::App app{"kvscope-cli: KV-cache compression, headless (the engine of the KVScope app)"};
  app.require_subcommand(1);
  kvscope::cli::add_info_command(app);
  kvscope::cli::add_capture_command(app);
  kvscope::cli::add_eval_command(app);
  kvscope::cli::add_merge_command(app);
  kvscope::cli::add_bench_command(app);
  kvscope::cli::add_render_command(app);
  kvscope::cli::add_embed_command(app);
  kvscope::cli::add_synth_command(app);
  kvscope::cli::add_generate_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const kvscope::InputError& e) {
    std::fprintf(stderr, "kvscope-cli: error: %s\n", e.what());
    return 1;
  } catch (const kvscope::Cancelled&) {
    std::fprintf(stderr, "kvscope-cli: cancelled\n");
    return 130;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kvscope-cli: internal error: %s\n", e.what());
    return 2;
  }
  return 0;
}
