// The deterministic p2p simulation as part of the default suite: design.md §3's four properties
// over PEERCM_SIM_SEEDS random schedules per transport. A failing seed reports the command that
// replays it and the trace of the run.
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

// Seeds 1..PEERCM_SIM_SEEDS per transport, in two shards (two CTest tests) so that each stays
// well under a minute on two busy cores.
void run_shard(const SimConfig& config, int shard) {
  const std::uint64_t half = PEERCM_SIM_SEEDS / 2;
  const std::uint64_t first = shard == 0 ? 1 : 1 + half;
  const std::uint64_t count = shard == 0 ? half : PEERCM_SIM_SEEDS - half;
  const auto began = std::chrono::steady_clock::now();
  run_seeds(first, count, config);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
  std::cout << "[ p2p sim  ] " << transport_name(config.transport) << ": seeds " << first << ".." << first + count - 1
            << " in " << seconds << " s (" << static_cast<double>(count) / seconds << " seeds/s)\n";
}

TEST(P2pSimulation, RandomSchedulesKeepUniquenessLivenessIntegrityAndNoLeak) { run_shard(SimConfig{}, 0); }
TEST(P2pSimulation, RandomSchedulesKeepUniquenessLivenessIntegrityAndNoLeakSecondHalf) {
  run_shard(SimConfig{}, 1);
}

TEST(P2pSimulationRoce, RandomSchedulesKeepUniquenessLivenessIntegrityAndNoLeak) {
  run_shard(SimConfig{.transport = Transport::roce}, 0);
}
TEST(P2pSimulationRoce, RandomSchedulesKeepUniquenessLivenessIntegrityAndNoLeakSecondHalf) {
  run_shard(SimConfig{.transport = Transport::roce}, 1);
}

TEST(P2pSimulationRoce, EveryNodeCountFromTwoToSix) {
  for (int nodes = 2; nodes <= 6; ++nodes) {
    run_seeds(1'000'000'000ULL + static_cast<std::uint64_t>(nodes) * 1'000'000, PEERCM_SIM_SEEDS / 50,
              SimConfig{.transport = Transport::roce, .nodes = nodes});
  }
}

TEST(P2pSimulationRoce, SameSeedReplaysTheSameRun) {
  for (std::uint64_t seed : {3ULL, 77ULL, 41038ULL}) {
    const SimConfig config{.transport = Transport::roce, .verbose = true};
    const SimResult first = run_p2p_simulation(seed, config);
    const SimResult second = run_p2p_simulation(seed, config);
    EXPECT_FALSE(first.trace.empty());
    EXPECT_EQ(first.trace, second.trace);
    EXPECT_EQ(first.stats.events, second.stats.events);
  }
}

// The RoCE schedules exercise what they are meant to: collisions bound and dropped, unseen
// requests taken, replacements, MRAs, crashes and partitions, and every outcome of R5b's check
// (docs/p2p.md): (a) a restarted peer's REQ replaces the checked connection, (b) the connection
// answers (EISCONN), (c) it ends first and the attempt dials, over a few thousand seeds.
TEST(P2pSimulationRoce, SchedulesCoverCollisionsRestartsMrasAndPartitions) {
  SimStats total;
  for (std::uint64_t seed = 1; seed <= 5000; ++seed) {
    const SimResult result = run_p2p_simulation(seed, SimConfig{.transport = Transport::roce});
    total.collisions += result.stats.collisions;
    total.dropped += result.stats.dropped;
    total.taken_back += result.stats.taken_back;
    total.replaced += result.stats.replaced;
    total.mras += result.stats.mras;
    total.crashes += result.stats.crashes;
    total.partitions += result.stats.partitions;
    total.timed_out += result.stats.timed_out;
    total.work_requests += result.stats.work_requests;
    total.check_replaced_restarted += result.stats.check_replaced_restarted;
    total.check_alive += result.stats.check_alive;
    total.check_dialed += result.stats.check_dialed;
    total.probes_failed += result.stats.probes_failed;
  }
  EXPECT_GT(total.collisions, 500u);
  EXPECT_GT(total.dropped, 500u);
  EXPECT_GT(total.taken_back, 100u);
  EXPECT_GT(total.replaced, 100u);
  EXPECT_GT(total.mras, 100u);
  EXPECT_GT(total.crashes, 500u);
  EXPECT_GT(total.partitions, 500u);
  EXPECT_GT(total.timed_out, 100u);
  EXPECT_GT(total.work_requests, 10000u);  // Sends checked end to end on the RC queue pairs
  EXPECT_GT(total.check_replaced_restarted, 100u);
  EXPECT_GT(total.check_alive, 1000u);
  EXPECT_GT(total.check_dialed, 100u);
  EXPECT_GT(total.probes_failed, 100u);
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

// The iWARP schedules exercise what they are meant to: collisions, unseen requests taken back,
// duplicates, replacements, crashes, partitions and failed attempts all occur across a few
// thousand seeds.
TEST(P2pSimulation, SchedulesCoverCollisionsDuplicatesRestartsAndTimeouts) {
  SimStats total;
  for (std::uint64_t seed = 1; seed <= 5000; ++seed) {
    const SimResult result = run_p2p_simulation(seed, SimConfig{});
    total.collisions += result.stats.collisions;
    total.taken_back += result.stats.taken_back;
    total.rejected_duplicate += result.stats.rejected_duplicate;
    total.replaced += result.stats.replaced;
    total.crashes += result.stats.crashes;
    total.partitions += result.stats.partitions;
    total.timed_out += result.stats.timed_out;
    total.work_requests += result.stats.work_requests;
  }
  EXPECT_GT(total.collisions, 1000u);
  EXPECT_GT(total.taken_back, 100u);
  EXPECT_GT(total.rejected_duplicate, 100u);
  EXPECT_GT(total.replaced, 100u);
  EXPECT_GT(total.crashes, 1000u);
  EXPECT_GT(total.partitions, 1000u);
  EXPECT_GT(total.timed_out, 1000u);
  EXPECT_GT(total.work_requests, 10000u);  // Sends checked end to end on the queue-pair engines
}

}  // namespace
}  // namespace peercm::sim
