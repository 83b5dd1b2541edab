// The deterministic p2p simulation as part of the default suite: design.md §3's four properties
// over PEERCM_SIM_SEEDS random schedules. A failing seed reports the command that replays it and
// the trace of the run.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <iostream>

#include "p2p_sim.hpp"

#ifndef PEERCM_SIM_SEEDS
#define PEERCM_SIM_SEEDS 100000
#endif
#ifndef PEERCM_P2P_SIM_PATH
#define PEERCM_P2P_SIM_PATH "p2p_sim"
#endif

namespace peercm::sim {
namespace {

constexpr int kMaxReportedFailures = 3;

// Runs [first, first + count) and reports the first few failures with replay and trace.
void run_seeds(std::uint64_t first, std::uint64_t count, const SimConfig& config) {
  int failures = 0;
  for (std::uint64_t seed = first; seed < first + count && failures < kMaxReportedFailures; ++seed) {
    const SimResult result = run_p2p_simulation(seed, config);
    if (result.ok) continue;
    ++failures;
    SimConfig verbose = config;
    verbose.verbose = true;
    const SimResult replay = run_p2p_simulation(seed, verbose);
    ADD_FAILURE() << "seed " << seed << " FAILED " << result.violation << "\n  replay: "
                  << replay_command(PEERCM_P2P_SIM_PATH, seed, config) << "\n"
                  << replay.trace;
  }
}

TEST(P2pSimulation, RandomSchedulesKeepUniquenessLivenessIntegrityAndNoLeak) {
  const auto began = std::chrono::steady_clock::now();
  run_seeds(1, PEERCM_SIM_SEEDS, SimConfig{});
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
  std::cout << "[ p2p sim  ] " << PEERCM_SIM_SEEDS << " seeds in " << seconds << " s ("
            << static_cast<double>(PEERCM_SIM_SEEDS) / seconds << " seeds/s)\n";
}

// Every node count, with seeds the main run does not use.
TEST(P2pSimulation, EveryNodeCountFromTwoToSix) {
  for (int nodes = 2; nodes <= 6; ++nodes) {
    run_seeds(1'000'000'000ULL + static_cast<std::uint64_t>(nodes) * 1'000'000, PEERCM_SIM_SEEDS / 50,
              SimConfig{.nodes = nodes});
  }
}

// A seed names a run: the same seed gives the same trace, event for event.
TEST(P2pSimulation, SameSeedReplaysTheSameRun) {
  for (std::uint64_t seed : {7ULL, 4242ULL, 99991ULL}) {
    const SimResult first = run_p2p_simulation(seed, SimConfig{.verbose = true});
    const SimResult second = run_p2p_simulation(seed, SimConfig{.verbose = true});
    EXPECT_FALSE(first.trace.empty());
    EXPECT_EQ(first.trace, second.trace);
    EXPECT_EQ(first.stats.events, second.stats.events);
  }
}

// The schedules do exercise what they are meant to: collisions, duplicates, replacements,
// crashes, timeouts and posted work requests all occur across a few thousand seeds.
TEST(P2pSimulation, SchedulesCoverCollisionsDuplicatesRestartsAndTimeouts) {
  SimStats total;
  for (std::uint64_t seed = 1; seed <= 5000; ++seed) {
    const SimResult result = run_p2p_simulation(seed, SimConfig{});
    total.collisions += result.stats.collisions;
    total.taken_back += result.stats.taken_back;
    total.rejected_duplicate += result.stats.rejected_duplicate;
    total.replaced += result.stats.replaced;
    total.crashes += result.stats.crashes;
    total.timed_out += result.stats.timed_out;
    total.work_requests += result.stats.work_requests;
  }
  EXPECT_GT(total.collisions, 100u);
  EXPECT_GT(total.taken_back, 100u);
  EXPECT_GT(total.rejected_duplicate, 10u);
  EXPECT_GT(total.replaced, 10u);
  EXPECT_GT(total.crashes, 100u);
  EXPECT_GT(total.timed_out, 10u);
  EXPECT_GT(total.work_requests, 1000u);
}

}  // namespace
}  // namespace peercm::sim
