// peercm: the command-line tool (design.md §5).
#include <CLI/CLI.hpp>
#include <string_view>

#include "peercm/version.hpp"
#include "subcommands.hpp"

int main(int argc, char** argv) {
  if (argc > 1 && std::string_view(argv[1]) == "exec") return peercm::tool::exec_main(argc - 2, argv + 2);
  CLI::App app{"peercm: userspace iWARP RDMA over TCP with a peer-to-peer connection manager"};
  app.set_version_flag("--version", std::string(peercm::version()));
  app.require_subcommand(1);
  peercm::tool::add_selfcheck(app);
  peercm::tool::add_ping(app);
  peercm::tool::add_perf(app);
  peercm::tool::add_mesh(app);
  peercm::tool::add_cmtime(app);
  peercm::tool::add_exec(app);
  CLI11_PARSE(app, argc, argv);
  return peercm::tool::exit_status;
}
