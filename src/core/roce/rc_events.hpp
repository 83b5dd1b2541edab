// Why a RoCEv2 RC queue pair went to ERROR, its counters, and the completion status each
// failure maps to (roce-ibcm-wire.md §2.7, §2.11).
#pragma once

#include <cstdint>
#include <string_view>

#include "peercm/verbs_types.hpp"

namespace peercm::core::roce {

enum class RcErrorCause : std::uint8_t {
  // requester side: the peer told us, or stopped answering
  retry_exceeded,            // local ACK timeouts / sequence NAKs beyond retry_cnt
  rnr_retry_exceeded,        // RNR NAKs beyond rnr_retry
  remote_invalid_request,    // NAK invalid request
  remote_access_error,       // NAK remote access error
  remote_operational_error,  // NAK remote operational error
  bad_response,              // a read response of the wrong length or position
  // responder side: we NAKed the peer and stopped
  invalid_request,     // opcode sequence, length or unsupported operation
  access_violation,    // R_Key, bounds or access right
  operational_error,   // a receive WR whose SGEs failed their checks
  // local
  local_protection,  // a send WR's SGE failed its lkey checks
  cq_overrun,
  modified_to_error,  // the owner moved the QP to ERROR
};

// The QP entered ERROR. wr_id names the WR that failed when one did.
struct RcEvent {
  RcErrorCause cause = RcErrorCause::modified_to_error;
  std::uint32_t psn = 0;
  std::uint64_t wr_id = 0;
  bool has_wr = false;
};

struct RcStats {
  std::uint64_t datagrams_sent = 0;
  std::uint64_t datagrams_received = 0;
  std::uint64_t dropped_bad_icrc = 0;    // §1.3: dropped silently and counted
  std::uint64_t dropped_malformed = 0;   // decode errors, wrong QPN or P_Key
  std::uint64_t dropped_unexpected = 0;  // stale or bogus responses, early requests
  std::uint64_t dropped_not_connected = 0;  // arrived before connect() (or in ERROR)
  std::uint64_t dropped_foreign_source = 0;  // from an address other than the peer's
  std::uint64_t retransmitted_packets = 0;
  std::uint64_t ack_timeouts = 0;
  std::uint64_t recovery_timeouts = 0;  // the measured-RTT timer fired (no retry spent)
  std::uint64_t recovery_probes = 0;    // of which answered by a probe, not go-back-N
  std::uint64_t acks_sent = 0;
  std::uint64_t sequence_naks_sent = 0;
  std::uint64_t sequence_naks_received = 0;
  std::uint64_t rnr_naks_sent = 0;
  std::uint64_t rnr_naks_received = 0;
  std::uint64_t duplicate_requests = 0;
  std::uint64_t read_replays = 0;
  std::uint64_t keepalive_probes = 0;
};

// The send-CQ status of the WR that failed. peercm's WcStatus has no RETRY_EXC_ERR /
// RNR_RETRY_EXC_ERR (iWARP never needed them): both map to fatal_error, and the event's
// cause tells them apart.
constexpr WcStatus wc_status_for(RcErrorCause cause) {
  switch (cause) {
    case RcErrorCause::remote_invalid_request: return WcStatus::remote_invalid_request_error;
    case RcErrorCause::remote_access_error: return WcStatus::remote_access_error;
    case RcErrorCause::remote_operational_error: return WcStatus::remote_operation_error;
    case RcErrorCause::local_protection: return WcStatus::local_protection_error;
    case RcErrorCause::retry_exceeded: return WcStatus::retry_exceeded;
    case RcErrorCause::rnr_retry_exceeded: return WcStatus::rnr_retry_exceeded;
    case RcErrorCause::bad_response:
    case RcErrorCause::invalid_request:
    case RcErrorCause::access_violation:
    case RcErrorCause::operational_error:
    case RcErrorCause::cq_overrun:
    case RcErrorCause::modified_to_error: break;
  }
  return WcStatus::fatal_error;
}

std::string_view to_string(RcErrorCause cause);

}  // namespace peercm::core::roce
