// p2p_sim: run the deterministic p2p simulation from the command line.
//   --transport iwarp|roce                the transport (default iwarp)
//   p2p_sim --seed S [--verbose]          one seed (with its trace; --trace is the same)
//   p2p_sim --seeds N [--start S]         N seeds from S (default 1)
//   p2p_sim --duration-seconds T          soak: random seeds until T seconds passed
//   --nodes K                             fix the node count (2..6) instead of letting the seed pick
//   --max-reported K                      print at most K failing seeds (default: all)
// A failing seed prints the command line that replays it. Exit status 1 on any failure.
#include <fmt/format.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <random>
#include <string>
#include <string_view>

#include "p2p_sim.hpp"

namespace {

using peercm::sim::SimConfig;
using peercm::sim::SimResult;
using peercm::sim::SimStats;

struct Options {
  std::optional<std::uint64_t> seed;
  std::uint64_t seeds = 1000;
  std::optional<std::uint64_t> start;
  double duration_seconds = 0;
  std::uint64_t max_reported = UINT64_MAX;
  SimConfig config;
};

[[noreturn]] void usage(int status) {
  std::fputs(
      "usage: p2p_sim [--transport iwarp|roce] [--seed S | --seeds N [--start S] | --duration-seconds T] "
      "[--nodes K] [--max-reported K] [--verbose]\n",
      status == 0 ? stdout : stderr);
  std::exit(status);
}

std::uint64_t number(std::string_view text) {
  try {
    std::size_t used = 0;
    const auto value = std::stoull(std::string(text), &used, 0);
    if (used != text.size()) usage(2);
    return value;
  } catch (const std::exception&) {
    usage(2);
  }
}

Options parse(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    auto value = [&]() -> std::string_view {
      if (i + 1 >= argc) usage(2);
      return argv[++i];
    };
    if (arg == "--seed") {
      options.seed = number(value());
    } else if (arg == "--seeds") {
      options.seeds = number(value());
    } else if (arg == "--start") {
      options.start = number(value());
    } else if (arg == "--nodes") {
      options.config.nodes = static_cast<int>(number(value()));
      if (options.config.nodes < 2 || options.config.nodes > 6) usage(2);
    } else if (arg == "--max-reported") {
      options.max_reported = number(value());
    } else if (arg == "--duration-seconds") {
      options.duration_seconds = static_cast<double>(number(value()));
    } else if (arg == "--transport") {
      const std::string_view name = value();
      if (name == "iwarp") {
        options.config.transport = peercm::sim::Transport::iwarp;
      } else if (name == "roce") {
        options.config.transport = peercm::sim::Transport::roce;

      } else {
        usage(2);
      }
    } else if (arg == "--verbose" || arg == "--trace") {
      options.config.verbose = true;
    } else if (arg == "--help" || arg == "-h") {
      usage(0);
    } else {
      usage(2);
    }
  }
  return options;
}

void add(SimStats& total, const SimStats& run) {
  total.events += run.events;
  total.attempts += run.attempts;
  total.established += run.established;
  total.collisions += run.collisions;
  total.rejected_duplicate += run.rejected_duplicate;
  total.replaced += run.replaced;
  total.timed_out += run.timed_out;
  total.crashes += run.crashes;
  total.work_requests += run.work_requests;
  total.dropped += run.dropped;
  total.mras += run.mras;
  total.partitions += run.partitions;
  total.taken_back += run.taken_back;
  total.checks += run.checks;
  total.check_replaced += run.check_replaced;
  total.check_replaced_restarted += run.check_replaced_restarted;
  total.check_alive += run.check_alive;
  total.check_dialed += run.check_dialed;
  total.check_deadline += run.check_deadline;
  total.probes_answered += run.probes_answered;
  total.probes_failed += run.probes_failed;
}

// Runs one seed quietly; on failure prints the violation and the replay command.
bool run_seed(const char* program, std::uint64_t seed, const Options& options, SimStats& total, bool report) {
  SimConfig quiet = options.config;
  quiet.verbose = false;
  const SimResult result = peercm::sim::run_p2p_simulation(seed, quiet);
  add(total, result.stats);
  if (result.ok) return true;
  if (!report) return false;
  fmt::print(stderr, "p2p_sim: seed {} FAILED {}\n  replay: {}\n", seed, result.violation,
             peercm::sim::replay_command(program, seed, options.config));
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  const Options options = parse(argc, argv);
  const char* program = argv[0];

  if (options.seed) {
    const SimResult result = peercm::sim::run_p2p_simulation(*options.seed, options.config);
    if (options.config.verbose) std::fputs(result.trace.c_str(), stdout);
    if (!result.ok) {
      fmt::print(stderr, "p2p_sim: seed {} FAILED {}\n  replay: {}\n", *options.seed, result.violation,
                 peercm::sim::replay_command(program, *options.seed, options.config));
      return 1;
    }
    fmt::print("p2p_sim: seed {} ok ({} events, {} attempts, {} established, {} collisions, {} duplicates "
               "rejected, {} replaced)\n",
               *options.seed, result.stats.events, result.stats.attempts, result.stats.established,
               result.stats.collisions, result.stats.rejected_duplicate, result.stats.replaced);
    return 0;
  }

  const bool soak = options.duration_seconds > 0;
  // A soak starts somewhere new each time (and says where, so any seed can be replayed).
  const std::uint64_t start = options.start.value_or(soak ? std::random_device{}() : 1);
  const auto began = std::chrono::steady_clock::now();
  const auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
  };
  SimStats total;
  std::uint64_t ran = 0;
  std::uint64_t failures = 0;
  std::optional<std::uint64_t> first_failure;
  for (std::uint64_t seed = start;; ++seed) {
    if (soak ? ((ran % 256) == 0 && elapsed() >= options.duration_seconds) : ran == options.seeds) break;
    if (!run_seed(program, seed, options, total, failures < options.max_reported)) {
      ++failures;
      if (!first_failure) first_failure = seed;
    }
    ++ran;
  }
  const double seconds = elapsed();
  fmt::print("p2p_sim ({}): {} seeds from {} in {:.2f}s ({:.0f} seeds/s), {} failed\n"
             "  {} events, {} attempts, {} established, {} collisions resolved by binding, "
             "{} unseen requests taken, {} duplicates rejected, {} links replaced, {} attempts failed, "
             "{} crashes, {} partitions, {} work requests, {} losing requests dropped, {} MRAs\n",
             peercm::sim::transport_name(options.config.transport), ran, start, seconds,
             seconds > 0 ? static_cast<double>(ran) / seconds : 0.0, failures, total.events, total.attempts,
             total.established, total.collisions, total.taken_back, total.rejected_duplicate, total.replaced,
             total.timed_out, total.crashes, total.partitions, total.work_requests, total.dropped, total.mras);
  if (total.checks > 0) {
    fmt::print("  R5b: {} connects waited on a check: (a) {} replaced by the peer's newer REQ ({} of a restarted peer), (b) {} EISCONN "
               "(connection answered), (c) {} dialled after the connection ended, (d) {} ended otherwise; "
               "{} checks answered, {} unanswered\n",
               total.checks, total.check_replaced, total.check_replaced_restarted, total.check_alive, total.check_dialed, total.check_deadline,
               total.probes_answered, total.probes_failed);
  }
  if (first_failure) fmt::print("  first failing seed: {}\n", *first_failure);
  return failures == 0 ? 0 : 1;
}
