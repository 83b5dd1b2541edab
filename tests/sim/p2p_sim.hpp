// Deterministic simulation of the peer-to-peer connection model (design.md §3) on either
// transport: N nodes over one simulated network (network.hpp) with a virtual clock. One seed
// decides every delay, loss, duplicate, reorder, partition, connect, close, crash and restart;
// the four properties of design.md §3 are checked during and after every run. No sockets, no
// sleeps, no threads.
//  - iwarp: each node is the production IwarpCmAgent (src/core/iwarp_cm, with its MPA handshakes
//    and P2pResolver) over TCP-like streams (iwarp_world.cpp).
//  - roce: each node is the production IbCmAgent (src/core/ibcm, with its P2pResolver) over MAD
//    datagrams (roce_world.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace peercm::sim {

enum class Transport : std::uint8_t { iwarp, roce };

struct SimConfig {
  Transport transport = Transport::iwarp;
  int nodes = 0;         // 2..6; 0: the seed picks
  bool verbose = false;  // keep a readable trace of the run in SimResult::trace
};

struct SimStats {
  std::uint64_t events = 0;
  std::uint64_t attempts = 0;            // connects the resolver took (not EISCONN/EALREADY)
  std::uint64_t established = 0;         // attempts that ended ESTABLISHED
  std::uint64_t collisions = 0;          // accept_into_attempt, summed over nodes
  std::uint64_t taken_back = 0;          // unanswered requests a connect took back from the app
  std::uint64_t rejected_duplicate = 0;  // reject(duplicate), summed over nodes
  std::uint64_t replaced = 0;            // rule 6 replacements (restart or stale)
  std::uint64_t timed_out = 0;           // attempt_failed
  std::uint64_t crashes = 0;
  std::uint64_t work_requests = 0;
  std::uint64_t dropped = 0;      // roce: losing REQs (and copies) dropped silently (rule 3)
  std::uint64_t mras = 0;         // roce: MRAs sent
  std::uint64_t partitions = 0;   // partition windows
  // roce, R5b: connects that waited on a check of the key's connection, and how each ended:
  // (a) the restarted peer's REQ replaced it, (b) it answered (EISCONN), (c) it ended first and
  // the attempt's own REQ went out, (d) the deadline or another error.
  std::uint64_t checks = 0;
  std::uint64_t check_replaced = 0;
  std::uint64_t check_replaced_restarted = 0;  // of which by a restarted peer (the rest: it reconnected)
  std::uint64_t check_alive = 0;
  std::uint64_t check_dialed = 0;
  std::uint64_t check_deadline = 0;
  std::uint64_t probes_answered = 0;
  std::uint64_t probes_failed = 0;  // checks that found no live QP: the connection ended
};

struct SimResult {
  bool ok = true;
  std::string violation;  // the first property that failed, with the virtual time
  std::string trace;      // with SimConfig::verbose
  SimStats stats;
};

SimResult run_p2p_simulation(std::uint64_t seed, const SimConfig& config);

const char* transport_name(Transport transport);

// The command line that replays `seed` exactly, with a trace:
// "<program> --transport T --seed S [--nodes K] --verbose".
std::string replay_command(std::string_view program, std::uint64_t seed, const SimConfig& config);

}  // namespace peercm::sim
