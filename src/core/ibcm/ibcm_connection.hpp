// One IB CM connection as a sans-IO state machine (roce-ibcm-wire.md §4.9): decoded CM messages,
// application calls and time in; MADs to send, events and one deadline out. It never looks
// anything up: the agent (ibcm_agent.hpp) finds the connection a MAD belongs to, checks for
// duplicates across connections and stale QPNs, and frees the connection once it is back in IDLE.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <system_error>
#include <vector>

#include "core/ibcm/ibcm_types.hpp"
#include "core/time.hpp"
#include "peercm/result.hpp"
#include "wire/ibcm/cm_message.hpp"

namespace peercm::core::ibcm {

class IbCmConnection {
 public:
  // `tid_high`: the upper 32 bits of the TIDs this connection starts (§3.3).
  IbCmConnection(std::uint32_t local_comm_id, std::uint64_t local_guid, const IbCmTiming& timing,
                 std::uint32_t tid_high);

  // --- inputs: the application ---
  // IDLE → REQ_SENT. EINVAL in another state or when a field does not fit the REQ.
  Status<std::errc> connect(const IbCmRequestParams& params, Time now);
  // REQ_RCVD / MRA_REQ_SENT: send the REP → REP_SENT. REP_RCVD / MRA_REP_SENT (confirm_reply):
  // send the RTU (only `private_data` is used) → ESTABLISHED. EINVAL otherwise.
  Status<std::errc> accept(const IbCmReplyParams& params, Time now);
  // REQ_RCVD / MRA_REQ_SENT → IDLE, REP_RCVD / MRA_REP_SENT → IDLE: a REJ with `reason`.
  Status<std::errc> reject(std::uint16_t reason, std::span<const std::uint8_t> private_data, Time now);
  // ESTABLISHED → DREQ_SENT. EINVAL otherwise.
  Status<std::errc> disconnect(std::span<const std::uint8_t> private_data, Time now);
  // The owner gives the connection up without an event: REJ(timeout) while it waits for the
  // peer (§4.9, Linux abandons REQ_SENT so), REJ(consumer) while the peer waits for us, DREQ
  // when established. Nothing in IDLE, TIMEWAIT or while already disconnecting.
  void abort(Time now);

  // --- inputs: the network (the agent routed the message here) ---
  // IDLE: a new REQ from a listener → REQ_RCVD. REQ_SENT / MRA_REQ_RCVD: the peer's REQ of a
  // p2p collision this side lost (§5 passive): our REQ stops, the connection turns passive and
  // keeps its local comm ID → REQ_RCVD. Else a duplicate (§4.9).
  void handle_req(const wire::ibcm::CmReq& req, std::uint64_t tid, Time now);
  void handle_rep(const wire::ibcm::CmRep& rep, Time now);
  void handle_rtu(const wire::ibcm::CmRtu& rtu, Time now);
  void handle_rej(const wire::ibcm::CmRej& rej, Time now);
  void handle_mra(const wire::ibcm::CmMra& mra, Time now);
  void handle_dreq(const wire::ibcm::CmDreq& dreq, std::uint64_t tid, Time now);
  void handle_drep(const wire::ibcm::CmDrep& drep, Time now);
  void handle_timeout(Time now);
  // The host of `peer` says nobody holds its CM port any more: an ICMP port unreachable that
  // quotes a MAD of this connection (docs/reliability.md, "Dead peers"). Resending would only
  // hear that again, so a connection waiting for `peer` gives up now, as when its retries run
  // out (§4.9: REQ_SENT/MRA_REQ_RCVD → timed_out, REP_SENT/MRA_REP_RCVD → timed_out, DREQ_SENT →
  // TIMEWAIT). Any other state, or another peer, is left alone.
  void handle_peer_unreachable(const Gid& peer, Time now);

  // --- outputs ---
  std::optional<OutboundMad> poll_mad();
  std::optional<IbCmEvent> poll_event();
  std::optional<Time> next_deadline() const { return deadline_; }

  // --- introspection ---
  IbCmState state() const { return state_; }
  // Left IDLE once and is back: the owner frees it.
  bool finished() const { return started_ && state_ == IbCmState::idle; }
  bool active() const { return active_; }
  std::uint32_t local_comm_id() const { return local_comm_id_; }
  std::uint32_t local_qpn() const { return local_qpn_; }
  const IbCmPeer& peer() const { return peer_; }
  bool peer_known() const { return peer_known_; }
  // Some MAD of this exchange came from the peer (an MRA too, which names no comm ID).
  bool heard_from_peer() const { return heard_from_peer_; }
  // The private data of the REQ (passive) or REP (active) that brought the peer, until the
  // connection is ESTABLISHED: the established event carries what the owner needs of it, and an
  // established connection keeps no copy (docs/p2p-scale.md, memory per connection).
  std::span<const std::uint8_t> peer_private_data() const { return peer_private_data_; }
  std::uint64_t service_id() const { return service_id_; }

 // At most this many packets answer one datagram of a peer that has not confirmed the
  // exchange, whatever timers and retry count its REQ named (docs/reliability.md).
  static constexpr std::uint32_t kMaxUnpromptedAnswers = 3;
  // The REQ's CM response timeouts are clamped to [kMinPeerTimeout, our cm_response_timeout]:
  // a sender cannot make us resend every few microseconds, nor hold state for hours.
  static constexpr std::uint8_t kMinPeerTimeout = 12;  // 16.8 ms

 private:
  void enter(IbCmState state);
  void keep_for_resend(const OutboundMad& mad) { resend_ = std::make_unique<OutboundMad>(mad); }
  std::array<std::uint8_t, 8> guid_ari() const;  // REJ(timeout)'s ARI: our CA GUID (§4.8)
  void send(const wire::ibcm::CmMessage& message, std::uint64_t tid, bool keep_for_resend);
  // A MAD of this exchange came from the peer.
  void peer_spoke();
  // docs/reliability.md, "CM answers": false once a passive connection the peer has not
  // confirmed has sent kMaxUnpromptedAnswers packets since the peer's last datagram.
  bool may_answer();
  void arm_resend(Time now);
  void resend_or_give_up(Time now);
  void send_rej(std::uint16_t reason, wire::ibcm::RejTarget target, std::span<const std::uint8_t> ari,
                std::span<const std::uint8_t> private_data);
  void send_mra(wire::ibcm::MraTarget target);
  void send_rtu(std::span<const std::uint8_t> private_data);
  void send_drep(std::uint64_t tid);
  void to_timewait(Time now);
  void emit(IbCmEvent::Kind kind, std::uint16_t reason = 0, std::span<const std::uint8_t> private_data = {},
            std::span<const std::uint8_t> ari = {});
  void take_request(const wire::ibcm::CmReq& req, std::uint64_t tid, Time now);
  void take_reply(const wire::ibcm::CmRep& rep);

  std::uint32_t local_comm_id_;
  std::uint64_t local_guid_;
  IbCmTiming timing_;
  std::uint32_t tid_high_;

  IbCmState state_ = IbCmState::idle;
  bool started_ = false;
  bool active_ = false;
  bool confirm_reply_ = false;
  std::uint32_t local_qpn_ = 0;
  std::uint64_t service_id_ = 0;
  IbCmPeer peer_;
  bool peer_known_ = false;
  std::vector<std::uint8_t> peer_private_data_;

  std::uint64_t req_tid_ = 0;   // the REQ's: REP, MRA, REJ and RTU reuse it (§3.3)
  std::uint64_t dreq_tid_ = 0;  // our DREQ's
  std::uint8_t peer_response_timeout_ = 0;  // the REQ's remote CM response timeout (passive), clamped
  std::uint8_t own_response_timeout_ = 0;   // the REQ's local CM response timeout, clamped
  // Packets a passive connection sent since the peer's last datagram, until it is confirmed
  // (ESTABLISHED once): an unauthenticated REQ buys at most kMaxUnpromptedAnswers of them.
  std::uint32_t sent_since_heard_ = 0;
  bool heard_from_peer_ = false;
  bool confirmed_ = false;
  Duration resend_interval_{};
  std::uint8_t max_retries_ = 0;
  std::uint8_t retries_left_ = 0;
  // The MAD the timer resends, identical each time (§3.3); held only in the states that resend
  // (REQ_SENT, REP_SENT, DREQ_SENT and their MRA waits), freed on leaving them.
  std::unique_ptr<OutboundMad> resend_;
  std::optional<Time> deadline_;

  // What waits for the owner's poll_mad() / poll_event(); allocated while anything does. The
  // owner drains it at once, so a connection that waits for the peer (and every established
  // one) holds none.
  struct Outbox {
    std::vector<OutboundMad> mads;
    std::vector<IbCmEvent> events;
    std::size_t next_mad = 0;
    std::size_t next_event = 0;
  };
  Outbox& outbox();
  void release_outbox_if_drained();
  std::unique_ptr<Outbox> outbox_;
};

}  // namespace peercm::core::ibcm
