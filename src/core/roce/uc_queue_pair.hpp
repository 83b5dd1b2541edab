// A RoCEv2 Unreliable Connected queue pair (IBTA Vol 1 §9.7.7 and §9.8 as verbs use them)
// as a sans-IO core: verbs, received UDP payloads in; datagrams and completions out. It
// never touches a socket, a clock or a lock.
//
// UC is RC's packet format (SEND and RDMA WRITE, First/Middle/Last/Only, with Immediate)
// under opcode prefix 001 and without everything that makes RC reliable: no ACK or NAK, no
// AckReq, no retransmission, no timers, no RDMA Read, no atomics, no Send with Invalidate,
// no RNR. That is most of RcQueuePair (its window, una/cursor bookkeeping, ACK coalescing,
// read contexts, duplicate replay, response queue, retry counters and deadlines), so UC is
// a core of its own rather than a mode of that one: what is left is segmentation, the ePSN
// of one message and the placement of its payload, each a few lines here.
//
// Requester: a WR's packets leave in order, one PSN each; the WR completes (success) as
// soon as its last packet has been handed to the wire, i.e. at the next poll_datagram()
// (the payload iovecs of the last packet stay valid until then).
//
// Responder, each drop silent and counted in UcStats:
//  - a datagram that does not decode, names another QPN, carries a non-UC opcode, a P_Key
//    other than RoCE's, fails its ICRC, or arrives before RTR / in ERROR is dropped;
//  - a First or Only packet always begins a new message, whatever its PSN (a partial message
//    in progress is discarded);
//  - a Middle or Last packet must carry the expected PSN and continue the message in
//    progress; otherwise that message is discarded and every packet is dropped until the
//    next First or Only;
//  - a Send (or Write with Immediate) that finds no receive posted is dropped (no RNR);
//  - a Write whose R_Key, bounds or rights fail, or whose payloads do not sum to its DMA
//    length, is dropped.
// A receive a discarded Send had begun to fill stays at the head of the queue and takes the
// next Send from its start. A receive too small for its Send, or one whose SGEs failed their
// checks, completes in error and the QP enters ERROR (verbs: a completion in error on a
// connected QP moves it to ERROR), as does a send WR whose SGEs fail their lkey checks.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <optional>
#include <span>
#include <system_error>
#include <vector>

#include "core/memory_table.hpp"
#include "core/queue_pair_engine.hpp"  // CompletionSink
#include "core/receive_queue.hpp"
#include "core/roce/rc_datagram.hpp"
#include "core/roce/rc_params.hpp"  // Ipv4Bytes
#include "peercm/result.hpp"
#include "peercm/verbs_types.hpp"
#include "wire/roce/packet.hpp"

namespace peercm::core::roce {

struct UcQpConfig {
  std::uint32_t qpn = 0;  // 24 bits: the DestQP our inbound packets carry
  std::uint32_t pd = 0;
  QpCaps caps;
  bool signal_all = true;  // sq_sig_all
  // A shared receive queue, as for RC (RcQpConfig::srq): post_recv() is EINVAL then.
  ReceiveQueue* srq = nullptr;
};

// What modify_qp to RTR gives a UC QP: the peer and the path. Values keep their wire widths.
struct UcPath {
  std::uint32_t remote_qpn = 0;  // 24 bits
  std::uint32_t recv_psn = 0;    // the peer's first PSN: our first ePSN
  wire::roce::PathMtu pmtu = wire::roce::PathMtu::mtu1024;
  // The ICRC pseudo-header (roce-ibcm-wire.md §1.4, §1.5), as for RC.
  std::array<std::uint8_t, 4> local_ip{};
  std::array<std::uint8_t, 4> remote_ip{};
  std::uint16_t udp_source_port = 0xC000;
};

struct UcStats {
  std::uint64_t datagrams_sent = 0;
  std::uint64_t datagrams_received = 0;   // every datagram handed in
  std::uint64_t messages_delivered = 0;   // Sends and Writes that completed at this responder
  std::uint64_t dropped_malformed = 0;    // decode errors, wrong QPN, P_Key, transport or length
  std::uint64_t dropped_bad_icrc = 0;
  std::uint64_t dropped_not_ready = 0;    // before RTR, or in ERROR
  std::uint64_t dropped_foreign_source = 0;  // from an address other than the peer's
  std::uint64_t dropped_out_of_sequence = 0;  // Middle/Last packets with a PSN gap or no message
  std::uint64_t messages_discarded = 0;   // partial messages given up on (a gap, a new First)
  std::uint64_t dropped_no_receive = 0;   // a Send or Write with Immediate found no receive
  std::uint64_t dropped_access = 0;       // a Write that failed its R_Key checks
};

class UcQueuePair {
 public:
  UcQueuePair(const UcQpConfig& config, MemoryTable& memory, CompletionSink& send_cq, CompletionSink& recv_cq);

  // --- state (modify_qp) ---
  // RESET -> INIT; EINVAL from any other state.
  Status<std::errc> to_init();
  // INIT -> RTR with the peer and the path; EINVAL from another state, a QPN or PSN over 24
  // bits, an unknown PMTU code.
  Status<std::errc> to_rtr(const UcPath& path);
  // RTR -> RTS with our first PSN; RTS -> RTS changes nothing. EINVAL otherwise.
  Status<std::errc> to_rts(std::uint32_t send_psn);
  // Everything outstanding flushes; later WRs are flushed at once.
  void modify_to_error();
  QpState state() const { return state_; }

  // --- verbs ---
  // EINVAL: not in RTS (ERROR flushes instead), an opcode UC lacks (RDMA Read, Send with
  // Invalidate), too many SGEs, inline too long, a message over kMaxMessageSize. ENOMEM:
  // the send queue is full. A bad lkey completes the WR with a local protection error and
  // moves the QP to ERROR.
  Status<std::errc> post_send(const SendWr& wr);
  // EINVAL: an SRQ feeds the QP, too many SGEs; ENOMEM: the receive queue is full. Allowed
  // from RESET on; in ERROR the WR is flushed at once.
  Status<std::errc> post_recv(const RecvWr& wr);
  // The SRQ goes before the QP: from now on no message takes a receive from it.
  void detach_srq();

  // --- inputs ---
  // One UDP payload that arrived from `source_ip`:`udp_source_port`; only the peer's
  // address is taken once in RTR (as RcQueuePair::handle_datagram).
  void handle_datagram(std::span<const std::uint8_t> udp_payload, const Ipv4Bytes& source_ip,
                       std::uint16_t udp_source_port);

  // --- outputs ---
  // The next datagram as header bytes + iovecs into registered memory (or a WR's inline
  // copy) + pad and ICRC; false when there is nothing to send. Completes the WR whose last
  // packet the previous call handed out.
  bool poll_datagram(RcDatagram& out);
  bool has_datagram() const;
  // The largest UDP payload this QP sends: PMTU + headers + pad + ICRC.
  std::size_t max_datagram_size() const;
  const UcStats& stats() const { return stats_; }
  std::uint32_t qpn() const { return config_.qpn; }
  std::size_t send_queue_size() const { return sq_.size(); }
  std::size_t recv_queue_size() const { return rq_.size() + (recv_taken_ ? 1 : 0); }

  // As for RC: bounds the PSNs of one message far below 2^23.
  static constexpr std::uint64_t kMaxMessageSize = std::uint64_t{1} << 30;

  UcQueuePair(const UcQueuePair&) = delete;
  UcQueuePair& operator=(const UcQueuePair&) = delete;

 private:
  struct SendEntry {
    SendWr wr;
    std::vector<std::uint8_t> inline_data;
    std::uint32_t length = 0;
    std::uint32_t npkts = 1;
    bool signaled = true;
    std::optional<WcStatus> status;  // set when the WR ends in error
  };

  enum class RxMessage : std::uint8_t { none, send, write };

  void handle_packet(const wire::roce::PacketView& packet);
  void discard_message();
  bool take_receive();
  void enter_error();
  void flush_all();
  void complete_handed_out();
  void push_send_completion(const SendEntry& entry);
  void push_recv_completion(const WorkCompletion& wc, bool solicited);
  void after_input();
  bool still_registered(const SendEntry& entry) const;

  UcQpConfig config_;
  MemoryTable& memory_;
  CompletionSink& send_cq_;
  CompletionSink& recv_cq_;
  UcPath path_;
  std::uint32_t pmtu_ = 1024;
  QpState state_ = QpState::reset;
  UcStats stats_;
  bool cq_overrun_ = false;
  bool flushing_ = false;

  // requester: sq_.front() is the WR whose packets are leaving
  std::deque<SendEntry> sq_;
  std::uint32_t tx_pkt_ = 0;  // the next packet of sq_.front()
  std::uint32_t tx_psn_ = 0;
  bool front_handed_out_ = false;  // sq_.front()'s last packet left at the previous poll

  // responder
  ReceiveQueue rq_;
  ReceiveQueue* receive_source_;  // &rq_, or the SRQ's queue
  std::optional<PostedRecv> recv_taken_;  // the receive the Send in progress fills
  RxMessage rx_message_ = RxMessage::none;  // none also while discarding to the next First
  std::uint64_t rx_offset_ = 0;
  wire::roce::Reth rx_reth_;
  std::uint32_t epsn_ = 0;
};

}  // namespace peercm::core::roce
