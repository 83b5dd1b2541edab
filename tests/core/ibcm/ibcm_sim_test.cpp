// The IB CM p2p simulation over PEERCM_IBCM_SIM_SEEDS seeds: the four properties of docs/p2p-resolver.md
// under loss, duplication, delays, simultaneous connects and a crash/restart. A failing seed
// prints itself and the trace of its replay.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <iostream>

#include "ibcm_sim.hpp"

#ifndef PEERCM_IBCM_SIM_SEEDS
#define PEERCM_IBCM_SIM_SEEDS 4000
#endif

namespace peercm::core::ibcm::sim {
namespace {

constexpr int kMaxReported = 3;

IbSimStats run_seeds(std::uint64_t first, std::uint64_t count, const IbSimConfig& config) {
  IbSimStats total;
  int failures = 0;
  for (std::uint64_t seed = first; seed < first + count && failures < kMaxReported; ++seed) {
    const IbSimResult result = run_ibcm_simulation(seed, config);
    total.attempts += result.stats.attempts;
    total.established += result.stats.established;
    total.bound += result.stats.bound;
    total.dropped += result.stats.dropped;
    total.duplicates += result.stats.duplicates;
    total.replaced += result.stats.replaced;
    total.mras += result.stats.mras;
    total.failed += result.stats.failed;
    total.crashes += result.stats.crashes;
    if (result.ok) continue;
    ++failures;
    IbSimConfig verbose = config;
    verbose.verbose = true;
    const IbSimResult replay = run_ibcm_simulation(seed, verbose);
    ADD_FAILURE() << "seed " << seed << " (nodes " << config.nodes << ") FAILED " << result.violation << "\n"
                  << replay.trace;
  }
  return total;
}

TEST(IbCmSimulation, RandomSchedulesKeepUniquenessLivenessIntegrityAndNoLeak) {
  const auto began = std::chrono::steady_clock::now();
  const IbSimStats total = run_seeds(1, PEERCM_IBCM_SIM_SEEDS, IbSimConfig{});
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
  std::cout << "[ ibcm sim ] " << PEERCM_IBCM_SIM_SEEDS << " seeds in " << seconds << " s: " << total.attempts
            << " attempts, " << total.established << " established, " << total.bound << " collisions bound, "
            << total.dropped << " REQs dropped, " << total.duplicates << " duplicates, " << total.replaced
            << " replaced, " << total.mras << " MRAs, " << total.failed << " failed, " << total.crashes
            << " crashes\n";
  // The schedules exercise what they are meant to.
  EXPECT_GT(total.bound, PEERCM_IBCM_SIM_SEEDS / 10);
  EXPECT_GT(total.dropped, PEERCM_IBCM_SIM_SEEDS / 10);
  EXPECT_GT(total.replaced, 0u);
  EXPECT_GT(total.mras, 0u);
  EXPECT_GT(total.crashes, PEERCM_IBCM_SIM_SEEDS / 10);
}

TEST(IbCmSimulation, TwoNodesOnly) { run_seeds(1'000'000, PEERCM_IBCM_SIM_SEEDS / 4, IbSimConfig{.nodes = 2}); }

// PEERCM_IBCM_SIM_SEED=S [PEERCM_IBCM_SIM_NODES=K] replays one seed with its trace.
TEST(IbCmSimulation, ReplayOneSeedFromTheEnvironment) {
  const char* seed = std::getenv("PEERCM_IBCM_SIM_SEED");
  if (seed == nullptr) GTEST_SKIP() << "set PEERCM_IBCM_SIM_SEED to replay a seed";
  const char* nodes = std::getenv("PEERCM_IBCM_SIM_NODES");
  const IbSimConfig config{.nodes = nodes ? std::atoi(nodes) : 0, .verbose = true};
  const IbSimResult result = run_ibcm_simulation(std::strtoull(seed, nullptr, 10), config);
  std::cout << result.trace;
  EXPECT_TRUE(result.ok) << result.violation;
}

TEST(IbCmSimulation, SameSeedReplaysTheSameRun) {
  for (std::uint64_t seed : {3ULL, 77ULL}) {
    const IbSimResult a = run_ibcm_simulation(seed, IbSimConfig{.verbose = true});
    const IbSimResult b = run_ibcm_simulation(seed, IbSimConfig{.verbose = true});
    EXPECT_FALSE(a.trace.empty());
    EXPECT_EQ(a.trace, b.trace);
    EXPECT_EQ(a.stats.events, b.stats.events);
  }
}

}  // namespace
}  // namespace peercm::core::ibcm::sim
