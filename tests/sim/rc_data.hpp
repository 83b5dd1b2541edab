// Integrity past the CM over RoCE: two production RC queue pairs (src/core/roce) set up with
// exactly what each end's IB CM agent negotiated (its own QPN and starting PSN, the peer's QPN
// and starting PSN from the REQ/REP), exchanging Sends over the simulator's network with its
// loss, duplication and reordering. Every message must arrive exactly once, in order and
// unmodified, and every work request complete once with success.
#pragma once

#include <cstdint>
#include <string>

#include "core/time.hpp"
#include "network.hpp"
#include "sim_rng.hpp"

namespace peercm::sim {

// One end of a connection as its CM left it.
struct RcEnd {
  int node = 0;
  std::uint32_t qpn = 0;
  std::uint32_t psn = 0;
  std::uint32_t peer_qpn = 0;
  std::uint32_t peer_psn = 0;
};

struct RcDataResult {
  std::string failure;  // empty: every message arrived once, in order, intact
  std::uint64_t messages = 0;
  std::uint64_t packets = 0;
};

// Runs the exchange from `start` in its own virtual time; `network` and `rng` are the run's.
RcDataResult check_rc_data(Rng& rng, Network& network, const RcEnd& a, const RcEnd& b, core::Time start);

}  // namespace peercm::sim
