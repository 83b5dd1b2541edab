// What a RoCEv2 RC queue pair is created with and what the connection manager hands it
// when the connection is established (roce-ibcm-wire.md §2, §4.6).
#pragma once

#include <array>
#include <cstdint>

#include "core/receive_queue.hpp"
#include "core/time.hpp"
#include "peercm/verbs_types.hpp"
#include "wire/roce/icrc.hpp"
#include "wire/roce/opcode.hpp"

namespace peercm::core::roce {

// An IPv4 address in network byte order, as the ICRC pseudo-header carries it.
using Ipv4Bytes = std::array<std::uint8_t, 4>;

struct RcQpConfig {
  std::uint32_t pd = 0;
  QpCaps caps;
  bool signal_all = true;  // sq_sig_all
  // A shared receive queue: Sends and Writes with Immediate take their receives from it, in
  // posting order, and post_recv() is EINVAL. It outlives the QP, or detach_srq() comes first.
  ReceiveQueue* srq = nullptr;
};

// Everything both ends agreed on through the CM (REQ/REP). Values keep their wire widths.
struct RcConnectParams {
  std::uint32_t local_qpn = 0;   // 24 bits: the DestQP our inbound packets carry
  std::uint32_t remote_qpn = 0;  // 24 bits: the DestQP we send to
  std::uint32_t send_psn = 0;    // our first request PSN
  std::uint32_t recv_psn = 0;    // the peer's first request PSN: our responder's first ePSN
  wire::roce::PathMtu pmtu = wire::roce::PathMtu::mtu1024;
  // Local ACK timeout exponent T: 4.096 us * 2^T; 0 disables the timer (§2.8).
  std::uint8_t local_ack_timeout = 14;
  std::uint8_t retry_cnt = 7;    // 3 bits; 7 is seven retries, not infinite (§2.8)
  std::uint8_t rnr_retry = 7;    // 3 bits; 7 retries forever (§2.8)
  std::uint8_t min_rnr_timer = 1;  // the RNR timer code our RNR NAKs carry (§2.7)
  std::uint8_t max_rd_atomic = 16;       // ORD: our RDMA Reads in flight
  std::uint8_t max_dest_rd_atomic = 16;  // IRD: the peer's Reads we keep contexts for
  // Request PSNs we keep unacknowledged at most (rxe keeps 128, §2.4); after a loss, fewer
  // for a while (docs/roce-transport.md, "Loss recovery").
  std::uint32_t send_window = 128;
  // §2.5 ACK coalescing: while the traffic alternates (the peer's message, our request, ...)
  // the ACK a message asked for waits for our next request and leaves right behind it, in
  // the same batch; it leaves after this long at the latest. Zero: every ACK at once.
  Duration ack_delay{};
  // Keepalive (docs/roce-transport.md, "Dead peers"): after this long without a valid
  // packet from the peer while no request of ours awaits an ACK, the requester sends a probe
  // every local ACK timeout: a zero-length RDMA WRITE with the PSN before its next one,
  // which any responder takes for a duplicate and answers with an ACK (§2.10), and which
  // changes nothing at either end. retry_cnt + 1 probes unanswered move the QP to ERROR
  // with retry_exceeded. Zero: no keepalive, as RC hardware.
  Duration keepalive_interval{};
  // The ICRC pseudo-header (§1.4, §1.5): our packets leave from local_ip:udp_source_port
  // to remote_ip:4791 with IPv4 identification 0 and DF; inbound ones are verified the same
  // way, with the source port the datagram arrived from.
  std::array<std::uint8_t, 4> local_ip{};
  std::array<std::uint8_t, 4> remote_ip{};
  std::uint16_t udp_source_port = 0xC000;
};

// What an RTS adds to a QP whose responder an RTR started (RcQueuePair::set_requester).
struct RcRequesterParams {
  std::uint32_t send_psn = 0;
  std::uint8_t local_ack_timeout = 14;
  std::uint8_t retry_cnt = 7;
  std::uint8_t rnr_retry = 7;
  std::uint8_t max_rd_atomic = 16;
};

// §2.8: 4.096 us * 2^T; zero (no timer) for T = 0.
inline Duration local_ack_timeout_duration(std::uint8_t t) {
  if (t == 0) return Duration::zero();
  return Duration(std::int64_t{4096} << (t & 0x1F));
}

}  // namespace peercm::core::roce
