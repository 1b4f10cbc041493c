// Printing and writing evaluation reports, shared by `eval`, `sweep` and `merge`.
#pragma once

#include <string>
#include <vector>

#include "engine/eval/protocol.h"

namespace kvscope::cli {

// Capture line, window (s, E, scaled-down note), notes, the method x ratio table (mean +- std
// over seeds) and the per-layer means, on stdout. Failures go to stderr.
void print_report(const EvalReport& report);

// "0.5,0.25,1/8" -> {0.5, 0.25, 0.125}; throws InputError naming `flag`.
std::vector<double> parse_number_list(const std::string& text, const std::string& flag);
// "0,2,5-7" -> {0, 2, 5, 6, 7}; throws InputError naming `flag`.
std::vector<int> parse_index_list(const std::string& text, const std::string& flag);
// Parses one parameter value: a number, or for Choice/Bool params a choice name/true/false.
double parse_param_value(const ParamSpec& spec, const std::string& text, const std::string& flag);

// Written through write_output (cli/output_file.h): '-' is stdout; never over one of `inputs`.
// Invalid UTF-8 (a path, a prompt) is replaced by U+FFFD, not an error.
void write_json_file(const std::string& path, const nlohmann::json& j, const std::string& flag,
                     const std::vector<std::string>& inputs = {});
// One row per (method, ratio, layer, kv head).
void write_csv_file(const std::string& path, const EvalReport& report, const std::string& flag,
                    const std::vector<std::string>& inputs = {});
// A JSON file under limits (size, nesting depth, value count, no duplicate keys).
nlohmann::json read_json_file(const std::string& path);

// The note naming the methods `--methods all` left out because the capture cannot run them
// (runnable_methods' `left_out`, engine/eval/protocol.h): printed with the report's notes and
// written in its JSON.
std::string methods_left_out_note(const std::vector<std::string>& left_out);

// A method's failures make the command fail (exit 2) after its outputs are written: with the
// methods a capture cannot run left out or refused before any work, a method that throws is a
// defect in KVScope.
void fail_on_method_errors(const EvalReport& report);

}  // namespace kvscope::cli
