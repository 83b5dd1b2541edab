// Verbs over RoCEv2 without the connection manager, as programs written for RoCE hardware
// use them (ibv_rc_pingpong, ibv_ud_pingpong, perftest, UCX): GIDs that name the context's
// addresses, RC queue pairs connected by modify_qp with the peer's GID, QPN and PSNs, and UD
// queue pairs that send to address handles (docs/roce-transport.md, "Verbs without the CM").
// Each call takes the context lock.
#pragma once

#include <array>
#include <cstdint>
#include <system_error>

#include "core/roce/rc_events.hpp"
#include "core/roce/uc_queue_pair.hpp"
#include "core/roce/ud_queue_pair.hpp"
#include "peercm/result.hpp"
#include "peercm/verbs.hpp"

namespace peercm::detail::roce {

using Ipv4Address = std::uint32_t;  // host order

// The address of the port's GID `index` (RoceDevice::gid_address), opening the context's
// RoCE device if needed.
Result<Ipv4Address, std::errc> gid_address(Context& context, int index);
// The GID index of a local address; -1 when it has none.
int gid_index_of(Context& context, Ipv4Address address);

// What modify_qp to RTR and RTS gives an RC queue pair, with the GIDs already turned into
// addresses. Values keep their verbs widths; they are checked here.
struct RcPath {
  Ipv4Address local = 0;   // the source GID's address
  Ipv4Address remote = 0;  // the destination GID's address
  std::uint32_t remote_qpn = 0;
  std::uint32_t rq_psn = 0;
  std::uint32_t sq_psn = 0;
  std::uint32_t path_mtu = 1024;  // bytes: 256, 512, 1024, 2048 or 4096
  std::uint8_t timeout = 14;
  std::uint8_t retry_cnt = 7;
  std::uint8_t rnr_retry = 7;
  std::uint8_t min_rnr_timer = 12;
  std::uint8_t max_rd_atomic = 1;
  std::uint8_t max_dest_rd_atomic = 1;
};

// Gives a QP made with QueuePair::create its RC core on `path.local` and connects it: its
// responder runs at once, its requester with `path`'s send values (start_rc_requester()
// replaces them before the first request when an RTS follows an RTR). EINVAL for a QP a CmId carries or that already ran, a QPN or PSN over 24
// bits, an unknown MTU, a local address that is not the context's; the port's errors
// (EADDRINUSE) when `path.local` cannot be opened.
Status<std::errc> connect_rc(QueuePair& qp, const RcPath& path);

// RTS after a connect_rc() made at RTR: the requester's PSN, timer, retries and Read depth
// (`path`'s other fields are the RTR's and stay). EINVAL for a QP connect_rc() did not
// connect or whose requester has already sent.
Status<std::errc> start_rc_requester(QueuePair& qp, const RcPath& path);

// Makes a QP made with QueuePair::create (no SRQ) a UD queue pair in RESET.
Status<std::errc> make_ud(QueuePair& qp);
bool is_ud(QueuePair& qp);
// UD state changes (modify_qp): INIT with its Q_Key, RTR, RTS with its first PSN, ERROR.
enum class UdState : std::uint8_t { keep, init, rtr, rts, error };  // keep: the Q_Key alone
Status<std::errc> modify_ud(QueuePair& qp, UdState state, std::uint32_t qkey, bool set_qkey, std::uint32_t sq_psn);
std::uint32_t ud_qkey(QueuePair& qp);
// A UD send to `destination` (UdQueuePair::post_send; the datagram leaves at once). The
// payload may be one PMTU: 4096 bytes between loopback addresses, else 1024.
Status<std::errc> post_ud_send(QueuePair& qp, const SendWr& wr, const core::roce::UdDestination& destination);
core::roce::UdStats ud_stats(QueuePair& qp);

// Makes a QP made with QueuePair::create a UC queue pair in RESET (an SRQ may feed it).
Status<std::errc> make_uc(QueuePair& qp);
// UC state changes (modify_qp): INIT, RTR with the peer and the path, RTS with the first
// PSN, ERROR. Values keep their verbs widths; they are checked here.
enum class UcState : std::uint8_t { init, rtr, rts, error };
struct UcModify {
  UcState state = UcState::init;
  Ipv4Address local = 0;   // RTR: the source GID's address
  Ipv4Address remote = 0;  // RTR: the destination GID's address
  std::uint32_t remote_qpn = 0;
  std::uint32_t rq_psn = 0;
  std::uint32_t path_mtu = 1024;  // bytes
  std::uint32_t sq_psn = 0;       // RTS
};
// EINVAL for a QP that is not UC, a transition from the wrong state, a QPN or PSN over 24
// bits, an unknown MTU, an address that is not the context's; the port's errors
// (EADDRINUSE) when `local` cannot be opened.
Status<std::errc> modify_uc(QueuePair& qp, const UcModify& change);
core::roce::UcStats uc_stats(QueuePair& qp);
// The RC core's counters of a QP connect_rc() or the CM gave one; zeros otherwise.
core::roce::RcStats rc_stats(QueuePair& qp);
// Datagrams the context dropped because no QP of it has their QPN.
std::uint64_t dropped_unknown_qp(Context& context);
// Queue pairs the context's pumps have drained so far (RoceDevice::qp_drains): a pump looks
// at the QPs that took an input only, so this grows with the traffic, not with the QP count.
std::uint64_t qp_drains(Context& context);
// ICMP port unreachable errors the context took as a sign that a peer is gone (CM and QP
// sockets; docs/reliability.md, "Dead peers"), and those it ignored.
struct PortUnreachableCounts {
  std::uint64_t taken = 0;
  std::uint64_t ignored = 0;
};
PortUnreachableCounts port_unreachable_counts(Context& context);
// Test hook: the device's timer callback, run now as the reactor runs it once a deadline has
// passed, without reading the sockets first (a pass whose reads ended before more arrived).
void run_timer(Context& context);
// Sharing an address (docs/roce-transport.md, "Several processes on one address"): the
// context's slot (-1 without one) and RoceDevice's counters.
struct ShareCounts {
  int slot = -1;
  std::uint64_t forwarded_out = 0;
  std::uint64_t forwarded_in = 0;
  std::uint64_t dropped_no_owner = 0;
  std::uint64_t dropped_forward_full = 0;
};
ShareCounts share_counts(Context& context);

}  // namespace peercm::detail::roce
