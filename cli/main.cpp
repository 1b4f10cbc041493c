#include <cstdio>
#include <exception>
#include <new>

#include "cli/commands.h"
#include "cli/output_file.h"
#include "cli/validate.h"
#include "engine/core/error.h"
#include "engine/eval/reference_cache.h"

// Exit status, the same for every subcommand (README.md, docs/evaluation.md): 0 done; 1 bad
// input or a bad setting, the file, flag or method named (a malformed or unreadable file, a flag
// that does not parse or is out of range, a method the capture cannot run, output that cannot be
// written, not enough memory for what was asked); 2 a defect in KVScope (an unexpected exception,
// or a method that failed on some heads after the others' figures were written); 130 cancelled.
int main(int argc, char** argv) {
  // References of captures seen before are read back from the user's cache folder instead of
  // computed again (docs/performance.md, "Exact reference cache"; KVSCOPE_CACHE_DIR=off: never).
  kvscope::ReferenceCache::global().set_disk(kvscope::ReferenceCache::default_disk_dir(),
                                             kvscope::ReferenceCache::kDefaultDiskBudget);
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
  kvscope::cli::add_theory_command(app);
  // Messages may quote file contents (metadata values, tensor names): escaped for the terminal.
  using kvscope::printable;
  try {
    app.parse(argc, argv);
    kvscope::cli::check_stdout();  // exit 0 only when the printed output arrived
  } catch (const CLI::ParseError& e) {
    // CLI11 prints the message (or the help, status 0) and gives its own codes (104 for a value
    // that does not convert, 106 for a missing argument, ...): every one of them is a bad flag.
    return app.exit(e) == 0 ? 0 : 1;
  } catch (const kvscope::SettingError& e) {
    // The engine names the setting in words (for the app); here it is the flag.
    std::fprintf(stderr, "kvscope-cli: error: %s\n", printable(e.cli_message(), true).c_str());
    return 1;
  } catch (const kvscope::InputError& e) {
    std::fprintf(stderr, "kvscope-cli: error: %s\n", printable(e.what(), true).c_str());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr,
                 "kvscope-cli: error: out of memory (the input or the flags ask for more "
                 "than this machine or ulimit -v allows)\n");
    return 1;
  } catch (const kvscope::Cancelled&) {
    std::fprintf(stderr, "kvscope-cli: cancelled\n");
    return 130;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kvscope-cli: internal error: %s\n", printable(e.what(), true).c_str());
    return 2;
  } catch (...) {
    std::fprintf(stderr, "kvscope-cli: internal error: an exception of unknown type\n");
    return 2;
  }
  return 0;
}
