// The two worlds of the simulator, one per transport, over the one network model (network.hpp)
// and the one random source (sim_rng.hpp) of a run. run_p2p_simulation() (p2p_sim.cpp) picks one.
#pragma once

#include <cstdint>

#include "core/time.hpp"
#include "network.hpp"
#include "p2p_sim.hpp"
#include "sim_rng.hpp"

namespace peercm::sim {

using core::Duration;
using core::Time;

// roce_world.cpp: production IbCmAgents (src/core/ibcm) over CM MAD datagrams.
SimResult run_roce_simulation(std::uint64_t seed, const SimConfig& config);
// iwarp_world.cpp: production IwarpCmAgents (src/core/iwarp_cm) over TCP-like streams.
SimResult run_iwarp_simulation(std::uint64_t seed, const SimConfig& config);

}  // namespace peercm::sim
