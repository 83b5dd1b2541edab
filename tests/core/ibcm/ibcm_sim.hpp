// A deterministic simulation of IB CM agents in peer-to-peer mode (docs/p2p.md over the IB CM
// binding): N nodes on a MAD network with a virtual clock. One seed decides every delay, loss,
// duplicate, connect (often from both sides at once), answer, close, crash and restart. The four
// properties are checked during and after every run:
//  - uniqueness: no node ever has two established connections for one (peer, tag);
//  - liveness: every attempt ends within its connect timeout; after a final round without loss
//    every pair and tag that asked holds exactly one connection;
//  - integrity: at quiescence both ends agree on every connection (each one's peer comm ID is
//    the other's local comm ID);
//  - no leak: once everything is closed and every timer ran out, agents hold no connection,
//    id, pending REQ, timer or resolver state.
#pragma once

#include <cstdint>
#include <string>

namespace peercm::core::ibcm::sim {

struct IbSimConfig {
  int nodes = 0;         // 2..4; 0: the seed picks
  bool verbose = false;  // keep a trace
};

struct IbSimStats {
  std::uint64_t events = 0;
  std::uint64_t attempts = 0;
  std::uint64_t established = 0;
  std::uint64_t bound = 0;        // p2p attempts bound to the peer's REQ (collisions)
  std::uint64_t dropped = 0;      // losing REQs and copies dropped silently
  std::uint64_t duplicates = 0;   // late duplicates rejected
  std::uint64_t replaced = 0;     // rule 6 replacements
  std::uint64_t mras = 0;
  std::uint64_t failed = 0;       // attempts ending without a connection
  std::uint64_t crashes = 0;
};

struct IbSimResult {
  bool ok = true;
  std::string violation;
  std::string trace;
  IbSimStats stats;
};

IbSimResult run_ibcm_simulation(std::uint64_t seed, const IbSimConfig& config);

}  // namespace peercm::core::ibcm::sim
