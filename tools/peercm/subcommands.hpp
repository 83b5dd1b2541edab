// Each subcommand of the `peercm` tool registers itself on the CLI11 app and returns the
// exit status through the callback it installs.
#pragma once

#include <CLI/CLI.hpp>

namespace peercm::tool {

// Set by a subcommand's callback; main() returns it.
inline int exit_status = 0;

void add_selfcheck(CLI::App& app);
void add_ping(CLI::App& app);
void add_perf(CLI::App& app);
void add_mesh(CLI::App& app);
void add_cmtime(CLI::App& app);
void add_exec(CLI::App& app);
// `peercm exec`'s own parser (exec.cpp): argv after "exec".
int exec_main(int argc, char** argv);

}  // namespace peercm::tool
