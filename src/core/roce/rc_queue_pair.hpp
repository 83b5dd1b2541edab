// A RoCEv2 Reliable Connected queue pair (IBTA Vol 1 ch. 9 as summarised by
// roce-ibcm-wire.md §2) as a sans-IO core, the RC counterpart of QueuePairEngine: verbs,
// received UDP payloads and time in; datagrams, completions, one error event and one
// deadline out. It never touches a socket, a clock or a lock.
//
// Files: rc_queue_pair.cpp (verbs, connection, dispatch, errors and flushing),
// rc_requester.cpp (segmentation, window, ACK/NAK handling, retries, read responses),
// rc_responder.cpp (ePSN, execution, duplicates, ACK/NAK and read response generation),
// rc_transmit.cpp (packet building, ICRC, both output forms).
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
#include "core/roce/rc_events.hpp"
#include "core/roce/rc_params.hpp"
#include "core/time.hpp"
#include "peercm/result.hpp"
#include "peercm/verbs_types.hpp"
#include "wire/roce/packet.hpp"

namespace peercm::core::roce {

class RcQueuePair {
 public:
  RcQueuePair(const RcQpConfig& config, MemoryTable& memory, CompletionSink& send_cq, CompletionSink& recv_cq);

  // --- verbs ---
  // EINVAL: too many SGEs, inline too long or on a READ, a message over kMaxMessageSize.
  // ENOMEM: the send queue is full. In ERROR the WR is accepted and flushed at once. Work
  // posted before connect() waits for it.
  Status<std::errc> post_send(const SendWr& wr);
  Status<std::errc> post_recv(const RecvWr& wr);
  // The SRQ goes before the QP: from now on no message takes a receive (they are RNR NAKed).
  void detach_srq();
  // Receives posted (and checked) elsewhere before this core existed, in their order.
  void adopt_receives(ReceiveQueue&& posted);

  // --- connection and time ---
  // RTR and RTS at once. EINVAL when a parameter does not fit its wire width or the PMTU
  // code is unknown; EISCONN when called twice.
  Status<std::errc> connect(const RcConnectParams& params, Time now);
  // verbs take a QP to RTR (its responder runs: a receive-only QP stays there) before RTS
  // (its requester's PSN, timer and retries): after a connect() made at RTR, the RTS's
  // values replace the requester's. ENOTCONN before connect(); EINVAL when a value does not
  // fit its wire width or a request has already gone out.
  Status<std::errc> set_requester(const RcRequesterParams& params);
  // One UDP payload that arrived from `source_ip`:`udp_source_port`. A connected QP takes
  // datagrams from its peer's address alone (docs/reliability.md, "Packets from outside a
  // connection"): the rest are dropped and counted (dropped_foreign_source), whatever their
  // ICRC, which an attacker computes as easily as the peer.
  void handle_datagram(std::span<const std::uint8_t> udp_payload, const Ipv4Bytes& source_ip,
                       std::uint16_t udp_source_port, Time now);
  // Time passed: fires the local ACK timer and ends an RNR wait that are due.
  void handle_timeout(Time now);
  // The owner moves the QP to ERROR (modify_qp): everything outstanding flushes.
  void modify_to_error();
  // The peer's host reported a packet of ours undeliverable because nobody receives RoCE on
  // it any more (an ICMP port unreachable; docs/reliability.md, "Dead peers"). Every resend
  // would meet the same closed port, so the requester fails now as when its retries run out:
  // ERROR with retry_exceeded, the oldest unacknowledged WR completing with that status.
  // No-op before the QP is connected or once it is in ERROR.
  void handle_peer_unreachable(Time now);
  // Asks whether the peer is still there now rather than after keepalive_interval of silence
  // (docs/p2p.md R5b: a connect to a key whose connection may be stale). An idle QP sends the
  // keepalive probe at once and counts it as one; one with requests awaiting their ACK lets the
  // ACK timer watch, as the keepalive does. The next valid packet from the peer makes
  // poll_liveness_confirmed() true once; no answer ends the QP as the keepalive does (ERROR,
  // retry_exceeded). False (nothing asked) before connect(), in ERROR, or without a local
  // ACK timeout, which is what would bound the wait.
  bool check_liveness(Time now);

  // --- outputs ---
  // The next datagram as one UDP payload, copied into `out` (at least max_datagram_size()
  // bytes, else ENOBUFS); 0 when there is nothing to send now.
  Result<std::size_t, std::errc> poll_datagram(std::span<std::uint8_t> out);
  // The next datagram as header bytes + iovecs into registered memory + pad and ICRC;
  // false when there is nothing to send now.
  bool poll_datagram(RcDatagram& out);
  bool has_datagram() const;
  // The largest UDP payload this QP sends: PMTU + headers + pad + ICRC.
  std::size_t max_datagram_size() const;
  std::optional<Time> next_deadline() const;
  // The QP entered ERROR (reported once).
  std::optional<RcEvent> poll_event();
  // The peer answered since check_liveness() (reported once per check).
  bool poll_liveness_confirmed();
  QpState state() const { return state_; }
  const RcStats& stats() const { return stats_; }
  // The peer's QPN once connected (0 before).
  std::uint32_t remote_qpn() const { return connected_ ? params_.remote_qpn : 0; }

  // Driver contract: call poll_datagram() until it yields nothing after every input, and
  // handle_timeout() at next_deadline(). Time only moves forward; each input carries it.

  std::size_t send_queue_size() const { return sq_.size(); }
  std::size_t recv_queue_size() const { return rq_.size() + (recv_taken_ ? 1 : 0); }
  std::size_t reads_in_flight() const { return reads_in_flight_; }

  // Bounds PSNs per message so that far fewer than 2^23 are ever outstanding (§2.4): 2^22
  // packets at the smallest PMTU.
  static constexpr std::uint64_t kMaxMessageSize = std::uint64_t{1} << 30;

  RcQueuePair(const RcQueuePair&) = delete;
  RcQueuePair& operator=(const RcQueuePair&) = delete;

 private:
  struct SendEntry {
    SendWr wr;
    std::vector<std::uint8_t> inline_data;
    std::uint32_t length = 0;
    bool signaled = true;
    bool assigned = false;       // has its PSNs
    std::uint32_t first_psn = 0;
    std::uint32_t npkts = 0;     // request packets; for a READ its response packets (§2.9)
    std::uint32_t read_next = 0; // READ: the next response PSN expected
    std::optional<WcStatus> status;  // set when the WR ends in error
  };

  // One answer the responder owes, in the order it must leave (§2.5: responses carry the
  // PSN they answer and acknowledge everything before it).
  struct Response {
    enum class Kind : std::uint8_t { ack, nak, rnr_nak, read } kind = Kind::ack;
    std::uint32_t psn = 0;    // ACK/NAK: the PSN; read: the next response to send
    std::uint32_t msn = 0;    // ACK/NAK
    std::uint8_t value = 0;   // NAK code or RNR timer code
    // read: the original request's first PSN and RETH, and where this execution ends
    std::uint32_t read_first = 0;
    std::uint32_t read_start = 0;  // the PSN this (re-)execution starts at
    std::uint32_t read_end = 0;
    wire::roce::Reth reth;
    bool new_read = false;  // counts against IRD until its last response left
  };

  // A READ the peer made: kept for replaying duplicates (§2.10), up to IRD of them.
  struct ReadContext {
    std::uint32_t first_psn = 0;
    std::uint32_t npkts = 0;
    wire::roce::Reth reth;
  };

  // The next packet to send, before encoding.
  struct TxPlan {
    wire::roce::PacketHeaders headers;
    std::span<const Sge> sges;
    const std::uint8_t* contiguous = nullptr;
    std::uint64_t offset = 0;
    std::uint32_t length = 0;
  };

  // rc_transmit.cpp
  bool next_packet(TxPlan& plan);
  wire::roce::IcrcPseudoHeader tx_pseudo() const;
  template <class F>
  void for_each_payload_piece(const TxPlan& plan, F&& f) const;

  // rc_requester.cpp
  bool requester_ready() const;
  bool next_request(TxPlan& plan);
  void handle_response(const wire::roce::PacketView& packet);
  void handle_read_response(const wire::roce::PacketView& packet);
  void handle_ack(std::uint32_t psn, const wire::roce::Aeth& aeth);
  bool advance_una(std::uint32_t target);
  void complete_acked();
  void set_cursor(std::uint32_t psn);
  void go_back(std::uint32_t psn, bool counts_as_retry);
  SendEntry* entry_with_psn(std::uint32_t psn);
  std::uint32_t entry_end(const SendEntry& entry) const;
  bool still_registered(const SendEntry& entry) const;
  void fail_requester(RcErrorCause cause, std::uint32_t psn);
  void requester_timeout();
  void restart_ack_timer();
  void recovery_timeout();
  void shrink_window();
  bool next_recovery_probe(TxPlan& plan);
  void arm_recovery_timer();
  void take_rtt_sample(std::uint32_t acknowledged_end);
  void heard_from_peer();
  void keepalive_timeout();
  bool next_keepalive_probe(TxPlan& plan);

  // rc_responder.cpp
  void handle_request(const wire::roce::PacketView& packet);
  bool behind_naked_gap(std::span<const std::uint8_t> udp_payload) const;
  void execute_request(const wire::roce::PacketView& packet);
  void handle_duplicate(const wire::roce::PacketView& packet);
  enum class AckTiming : std::uint8_t { now, may_wait_for_reply };
  void queue_ack(std::uint32_t psn, AckTiming timing = AckTiming::now);
  bool ack_held() const;
  void queue_nak(wire::roce::NakCode code, std::uint32_t psn);
  void queue_rnr_nak(std::uint32_t psn);
  void responder_error(RcErrorCause cause, wire::roce::NakCode code, std::uint32_t psn,
                       std::optional<WcStatus> recv_status);
  bool next_response(TxPlan& plan);
  std::uint32_t read_packets(std::uint32_t length) const;

  // rc_queue_pair.cpp
  void enter_error(const RcEvent& event);
  void flush_all();
  void push_send_completion(const SendEntry& entry);
  void push_recv_completion(const WorkCompletion& wc, bool solicited);
  void after_input();

  RcQpConfig config_;
  MemoryTable& memory_;
  CompletionSink& send_cq_;
  CompletionSink& recv_cq_;
  RcConnectParams params_;
  std::uint32_t pmtu_ = 1024;
  Duration ack_timeout_{};
  bool connected_ = false;
  QpState state_ = QpState::init;
  Time now_{};
  RcStats stats_;
  std::optional<RcEvent> event_;
  bool event_reported_ = false;
  bool cq_overrun_ = false;
  bool flushing_ = false;

  // requester
  std::deque<SendEntry> sq_;
  std::uint64_t sq_base_ = 0;     // sequence number of sq_.front()
  std::uint64_t tx_seq_ = 0;      // the entry the next request packet belongs to
  std::uint32_t tx_pkt_ = 0;      // its packet index (READ: responses already received)
  std::uint32_t tx_psn_ = 0;      // its PSN
  std::uint32_t una_psn_ = 0;     // oldest PSN not acknowledged
  std::uint32_t sent_end_psn_ = 0;  // one past the newest PSN ever sent
  std::uint32_t reads_in_flight_ = 0;
  std::uint8_t retries_left_ = 7;
  std::uint8_t rnr_retries_left_ = 7;
  std::optional<Time> ack_deadline_;
  std::optional<Time> rnr_until_;
  // Loss recovery on the measured round trip (docs/roce-transport.md, "Loss recovery"): a
  // loss that no NAK reports (the tail of a burst, the NAK itself, a resend lost again) gets,
  // after the RTT-based timeout, first a probe (una's packet and the newest again, with
  // AckReq), then go-back-N from una; each spends no retry and doubles the timeout, and the
  // local ACK timer above still decides when the peer is gone.
  std::optional<Time> recovery_deadline_;
  std::uint32_t recovery_backoff_ = 0;
  // The probe's packets still to send (recovery_timeout): una's, then the newest's.
  std::array<std::uint32_t, 2> recovery_probe_psns_{};
  std::uint8_t recovery_probes_owed_ = 0;
  // The PSNs kept unacknowledged at most: send_window, less after the recovery timer's
  // go-backs (shrink_window).
  std::uint32_t window_ = 0;
  std::uint32_t window_credit_ = 0;
  bool recovery_probed_ = false;  // since the last progress
  // RFC 6298-style estimator over AckReq packets sent once (Karn: a resend voids the sample).
  std::optional<std::uint32_t> rtt_sample_psn_;
  Time rtt_sample_sent_{};
  std::optional<Duration> srtt_;
  Duration rttvar_{};
  // Where the last NAK, timeout or implicit NAK sent us back: further ones for the same
  // PSN before progress are echoes of the same loss and are not retried again.
  std::optional<std::uint32_t> went_back_to_;
  // keepalive (RcConnectParams::keepalive_interval)
  std::optional<Time> keepalive_due_;
  std::uint32_t probes_unanswered_ = 0;
  bool probe_owed_ = false;
  // check_liveness(): asked, and answered since
  bool liveness_asked_ = false;
  bool liveness_confirmed_ = false;

  // responder
  ReceiveQueue rq_;
  ReceiveQueue* receive_source_;  // &rq_, or the SRQ's queue
  std::optional<PostedRecv> recv_taken_;
  enum class RxMessage : std::uint8_t { none, send, write } rx_message_ = RxMessage::none;
  std::uint64_t rx_offset_ = 0;
  wire::roce::Reth rx_reth_;
  std::uint32_t epsn_ = 0;
  std::uint32_t msn_ = 0;
  bool sequence_nak_sent_ = false;
  std::uint32_t unacked_requests_ = 0;
  std::uint32_t unacked_before_message_ = 0;  // of them, before the message now arriving
  std::deque<ReadContext> read_contexts_;
  std::deque<Response> responses_;
  std::uint32_t pending_new_reads_ = 0;
  // ACK coalescing with our replies (RcConnectParams::ack_delay): the one queued ACK, when
  // it is all responses_ holds, waits until this time or our next request.
  std::optional<Time> ack_hold_until_;
  bool ack_riding_ = false;  // the held ACK leaves once the requests being sent have gone
  bool alternating_ = false;            // our last request answered a message of the peer
  bool message_since_request_ = false;  // a message ended since our last request
};

}  // namespace peercm::core::roce
