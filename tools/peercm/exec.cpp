// `peercm exec [--transport iwarp|roce] [--] PROGRAM ARGS...`: runs an unmodified RDMA
// program (one linked against rdma-core's libibverbs.so.1 / librdmacm.so.1) on peercm, by
// putting the drop-in libraries' directory first in LD_LIBRARY_PATH and exec'ing it
// (docs/drop-in.md says what it sets and how to do the same by hand).
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <fmt/core.h>

#include "subcommands.hpp"

namespace peercm::tool {
namespace {

namespace fs = std::filesystem;

struct ExecOptions {
  std::string transport;  // empty: leave PEERCM_TRANSPORT as the environment has it
};

bool holds_dropin(const fs::path& dir) {
  std::error_code ec;
  return fs::exists(dir / "libibverbs.so.1", ec) && fs::exists(dir / "librdmacm.so.1", ec);
}

// PEERCM_DROPIN_DIR if set; else the directory beside this executable where the install puts
// the libraries (<bindir>/<PEERCM_DROPIN_FROM_BINDIR>), else the build tree's.
std::optional<fs::path> dropin_dir() {
  if (const char* dir = std::getenv("PEERCM_DROPIN_DIR"); dir && *dir) {
    if (holds_dropin(dir)) return fs::path(dir);
    fmt::print(stderr, "peercm exec: PEERCM_DROPIN_DIR={} holds no libibverbs.so.1 and librdmacm.so.1\n", dir);
    return std::nullopt;
  }
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (ec) {
    fmt::print(stderr, "peercm exec: cannot find its own path: {}\n", ec.message());
    return std::nullopt;
  }
  for (const char* relative : {PEERCM_DROPIN_FROM_BINDIR, PEERCM_DROPIN_FROM_BUILD_TOOL}) {
    const fs::path candidate = (self.parent_path() / relative).lexically_normal();
    if (holds_dropin(candidate)) return candidate;
  }
  fmt::print(stderr, "peercm exec: no drop-in libraries beside {} (set PEERCM_DROPIN_DIR)\n", self.string());
  return std::nullopt;
}

int run_exec(const ExecOptions& options, std::vector<std::string> command) {
  if (command.empty()) {
    fmt::print(stderr, "peercm exec: no program given (peercm exec [--transport iwarp|roce] -- PROGRAM ARGS...)\n");
    return 2;
  }
  const auto dir = dropin_dir();
  if (!dir) return 1;
  std::string path = dir->string();
  if (const char* old = std::getenv("LD_LIBRARY_PATH"); old && *old) path += std::string(":") + old;
  ::setenv("LD_LIBRARY_PATH", path.c_str(), 1);
  if (!options.transport.empty()) ::setenv("PEERCM_TRANSPORT", options.transport.c_str(), 1);
  std::vector<char*> argv;
  for (std::string& arg : command) argv.push_back(arg.data());
  argv.push_back(nullptr);
  ::execvp(argv[0], argv.data());
  const int error = errno;
  fmt::print(stderr, "peercm exec: {}: {}\n", command.front(), std::strerror(error));
  return error == ENOENT ? 127 : 126;  // the shell's codes for "not found" and "cannot run"
}

}  // namespace

constexpr const char* kExecUsage =
    "usage: peercm exec [--transport iwarp|roce] [--] PROGRAM ARGS...\n"
    "Runs PROGRAM (built against rdma-core's libibverbs.so.1/librdmacm.so.1) on peercm:\n"
    "LD_LIBRARY_PATH starts with the drop-in libraries' directory, and --transport sets\n"
    "PEERCM_TRANSPORT (the transport of rdma_cm ids and the device listed first).\n";

// Parsed here rather than by CLI11, which would take the program's own options (and its
// `--`) for the tool's: everything from the program's name on is passed on untouched.
int exec_main(int argc, char** argv) {
  ExecOptions options;
  int i = 0;
  for (; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg == "-h" || arg == "--help") {
      fmt::print("{}", kExecUsage);
      return 0;
    }
    std::string value;
    if (arg == "--transport" && i + 1 < argc) {
      value = argv[++i];
    } else if (arg.rfind("--transport=", 0) == 0) {
      value = arg.substr(std::strlen("--transport="));
    } else if (arg.rfind("-", 0) == 0) {
      fmt::print(stderr, "peercm exec: unknown option {}\n{}", arg, kExecUsage);
      return 2;
    } else {
      break;
    }
    if (value != "iwarp" && value != "roce") {
      fmt::print(stderr, "peercm exec: --transport takes iwarp or roce, not '{}'\n", value);
      return 2;
    }
    options.transport = value;
  }
  return run_exec(options, std::vector<std::string>(argv + i, argv + argc));
}

void add_exec(CLI::App& app) {
  // Listed for `peercm --help`; main() hands `peercm exec ...` to exec_main() before parsing.
  app.add_subcommand("exec", "Run an unmodified program built against rdma-core on peercm (exec --help)");
}

}  // namespace peercm::tool
