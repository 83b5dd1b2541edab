// What the IB CM core's pieces share: the connection states (roce-ibcm-wire.md §4.9), the
// timer settings (4.096 µs × 2^n exponents, §4.6), the parameters of a REQ and a REP, the
// connection-level events and the MADs to send.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/time.hpp"
#include "wire/ibcm/cm_common.hpp"
#include "wire/ibcm/gid.hpp"
#include "wire/ibcm/mad.hpp"

namespace peercm::core::ibcm {

using wire::ibcm::Gid;
using wire::ibcm::Ipv4Address;

// §4.9: the spec's state names. IDLE is both the start and the end: a connection back in IDLE
// after it left it is finished and its owner frees it.
enum class IbCmState : std::uint8_t {
  idle,
  req_sent,
  req_rcvd,
  mra_req_sent,
  mra_req_rcvd,
  rep_sent,
  rep_rcvd,
  mra_rep_sent,
  mra_rep_rcvd,
  established,
  dreq_sent,
  dreq_rcvd,
  timewait,
};

const char* to_string(IbCmState state);

// A CM time exponent n stands for 4.096 µs × 2^n (§4.6).
constexpr Duration cm_time(std::uint8_t exponent) {
  return Duration{static_cast<Duration::rep>(wire::ibcm::timeout_ns(exponent))};
}

// Timer settings of one node's CM. Defaults follow Linux rdma_cm on RoCE (§4.7).
struct IbCmTiming {
  std::uint8_t packet_lifetime = 16;      // the path's packet lifetime (≈ 268 ms)
  std::uint8_t cm_response_timeout = 20;  // what our REQs state for both CM response timeouts
  std::uint8_t max_cm_retries = 15;       // our REQs' Max CM Retries
  std::uint8_t service_timeout = 20;      // what our MRAs promise
  std::uint8_t timewait = 19;             // TIMEWAIT length (Linux: ≈ the local ACK timeout)
};

// What a REQ says besides the IDs (§4.3, §4.7). `private_data` is the whole 92-byte area as
// the caller composed it (rdma_cm header first on the TCP port space, §6).
struct IbCmRequestParams {
  std::uint64_t service_id = 0;
  std::uint32_t qpn = 0;           // 24 bits
  std::uint32_t starting_psn = 0;  // 24 bits
  std::uint8_t responder_resources = 0;
  std::uint8_t initiator_depth = 0;
  std::uint8_t retry_count = 7;
  std::uint8_t rnr_retry_count = 7;
  std::uint8_t path_mtu = 3;  // 1024
  Gid local_gid{};
  Gid remote_gid{};
  // false: the REP is answered with an RTU at once (rdma_cm, §6); true: the owner confirms it
  // with accept() (REP_RCVD, and an MRA when it is slow, §4.9).
  bool confirm_reply = false;
  std::vector<std::uint8_t> private_data;
};

// What a REP says besides the IDs (§4.4), and the RTU's private data when confirming a REP.
struct IbCmReplyParams {
  std::uint32_t qpn = 0;
  std::uint32_t starting_psn = 0;
  std::uint8_t responder_resources = 0;
  std::uint8_t initiator_depth = 0;
  std::uint8_t rnr_retry_count = 7;
  std::vector<std::uint8_t> private_data;
};

// The peer's side of a connection, as its REQ or REP stated it.
struct IbCmPeer {
  std::uint64_t guid = 0;
  std::uint32_t comm_id = 0;
  std::uint32_t qpn = 0;
  std::uint32_t starting_psn = 0;
  std::uint8_t responder_resources = 0;
  std::uint8_t initiator_depth = 0;
  std::uint8_t rnr_retry_count = 0;
  Gid gid{};
};

// A connection-level event for the connection's owner.
struct IbCmEvent {
  enum class Kind : std::uint8_t {
    request_received,  // a REQ (new, or a peer REQ taken over by our REQ_SENT, §5): answer it
    reply_received,    // confirm_reply: a REP; answer with accept() or reject()
    established,
    rejected,          // a REJ ended establishment; `reason`, `private_data`, `ari`
    timed_out,         // retries exhausted, or our MRA's promise ran out; `state` says where
    disconnected,      // left ESTABLISHED (DREQ/DREP exchange, REJ, or DREQ retries exhausted)
    timewait_exit,     // TIMEWAIT over: back to IDLE, the IDs may be reused
  };
  Kind kind = Kind::established;
  IbCmState state = IbCmState::idle;  // the state the event happened in
  std::uint16_t reason = 0;
  std::vector<std::uint8_t> private_data;
  std::vector<std::uint8_t> ari;
};

// One 256-byte CM MAD for QP1 at `destination` (§3.1).
struct OutboundMad {
  Gid destination{};
  std::array<std::uint8_t, wire::ibcm::kMadSize> bytes{};
};

}  // namespace peercm::core::ibcm
