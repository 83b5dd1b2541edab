// The simulator's entry points: a seed and a transport name one run of one world.
#include <fmt/format.h>

#include "worlds.hpp"

namespace peercm::sim {

SimResult run_p2p_simulation(std::uint64_t seed, const SimConfig& config) {
  return config.transport == Transport::roce ? run_roce_simulation(seed, config) : run_iwarp_simulation(seed, config);
}

const char* transport_name(Transport transport) { return transport == Transport::roce ? "roce" : "iwarp"; }

std::string replay_command(std::string_view program, std::uint64_t seed, const SimConfig& config) {
  std::string command = fmt::format("{} --transport {} --seed {}", program, transport_name(config.transport), seed);
  if (config.nodes != 0) command += fmt::format(" --nodes {}", config.nodes);
  return command + " --verbose";
}

}  // namespace peercm::sim
