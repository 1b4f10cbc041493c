// kvscope-cli subcommands, one file each (cli/cmd_*.cpp). A command reports bad input by throwing
// kvscope::InputError; main prints "kvscope-cli: error: <message>" and exits 1.
#pragma once

#include <CLI/CLI.hpp>

namespace kvscope::cli {

void add_info_command(CLI::App& app);     // cmd_info.cpp
void add_capture_command(CLI::App& app);  // cmd_capture.cpp
void add_eval_command(CLI::App& app);     // cmd_eval.cpp (eval, sweep)
void add_merge_command(CLI::App& app);    // cmd_merge.cpp
void add_bench_command(CLI::App& app);    // cmd_bench.cpp
void add_render_command(CLI::App& app);   // cmd_render.cpp
void add_embed_command(CLI::App& app);    // cmd_embed.cpp
void add_synth_command(CLI::App& app);    // cmd_synth.cpp
void add_theory_command(CLI::App& app);   // cmd_theory.cpp
// cmd_generate.cpp
void add_generate_command(CLI::App& app);

}  // namespace kvscope::cli
