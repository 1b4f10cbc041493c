// Runs kvscope-cli from a test: the one helper every CLI test uses.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <string>

namespace kvscope::testing {

struct CliRun {
  int code = -1;       // the exit status; -1 when the CLI did not exit (a signal) or did not start
  std::string output;  // stdout and stderr together
};

// Runs `"KVSCOPE_CLI" args` through the shell (args may quote, redirect or set variables).
inline CliRun run_cli(const std::string& args) {
  const std::string cmd = std::string("\"") + KVSCOPE_CLI + "\" " + args + " 2>&1";
  CliRun r;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t got;
  while ((got = std::fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, got);
  const int status = ::pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// The same, for tests that read the output as the value: the exit status goes to *code.
inline std::string run_cli(const std::string& args, int* code) {
  CliRun r = run_cli(args);
  *code = r.code;
  return r.output;
}

}  // namespace kvscope::testing
