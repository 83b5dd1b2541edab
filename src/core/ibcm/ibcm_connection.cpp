// The per-connection IB CM state machine: one function per input, each transition beside the
// row of roce-ibcm-wire.md §4.9 (or §5 for the peer REQ) it implements.
#include "core/ibcm/ibcm_connection.hpp"

#include <algorithm>
#include <array>
#include <cassert>
#include <variant>

namespace peercm::core::ibcm {

namespace w = wire::ibcm;
using Kind = IbCmEvent::Kind;

namespace {
// A REJ that ended establishment, with the peer's reason, private data and ARI.
IbCmEvent rejected_event(const w::CmRej& rej, IbCmState was) {
  return {.kind = Kind::rejected,
          .state = was,
          .reason = rej.reason,
          .private_data = {rej.private_data.begin(), rej.private_data.end()},
          .ari = {rej.ari.begin(), rej.ari.end()}};
}
}  // namespace

const char* to_string(IbCmState state) {
  switch (state) {
    case IbCmState::idle: return "IDLE";
    case IbCmState::req_sent: return "REQ_SENT";
    case IbCmState::req_rcvd: return "REQ_RCVD";
    case IbCmState::mra_req_sent: return "MRA_REQ_SENT";
    case IbCmState::mra_req_rcvd: return "MRA_REQ_RCVD";
    case IbCmState::rep_sent: return "REP_SENT";
    case IbCmState::rep_rcvd: return "REP_RCVD";
    case IbCmState::mra_rep_sent: return "MRA_REP_SENT";
    case IbCmState::mra_rep_rcvd: return "MRA_REP_RCVD";
    case IbCmState::established: return "ESTABLISHED";
    case IbCmState::dreq_sent: return "DREQ_SENT";
    case IbCmState::dreq_rcvd: return "DREQ_RCVD";
    case IbCmState::timewait: return "TIMEWAIT";
  }
  return "?";
}

IbCmConnection::IbCmConnection(std::uint32_t local_comm_id, std::uint64_t local_guid,
                               const IbCmTiming& timing, std::uint32_t tid_high)
    : local_comm_id_(local_comm_id), local_guid_(local_guid), timing_(timing), tid_high_(tid_high) {}

// ---------------------------------------------------------------------------------------------
// Application

Status<std::errc> IbCmConnection::connect(const IbCmRequestParams& params, Time now) {
  if (started_) return fail(std::errc::invalid_argument);
  const w::CmReq req{
      .local_comm_id = local_comm_id_,
      .service_id = params.service_id,
      .local_ca_guid = local_guid_,
      .local_qpn = params.qpn,
      .responder_resources = params.responder_resources,
      .initiator_depth = params.initiator_depth,
      .remote_cm_response_timeout = timing_.cm_response_timeout,
      .transport_service_type = w::TransportServiceType::rc,
      .starting_psn = params.starting_psn,
      .local_cm_response_timeout = timing_.cm_response_timeout,
      .retry_count = params.retry_count,
      .partition_key = 0xFFFF,
      .path_mtu = params.path_mtu,
      .rnr_retry_count = params.rnr_retry_count,
      .max_cm_retries = timing_.max_cm_retries,
      // §4.7: RoCEv2 paths: LIDs 0xFFFF, GIDs are the IP addresses, hop limit of a routed path.
      .primary = {.local_lid = 0xFFFF,
                  .remote_lid = 0xFFFF,
                  .local_gid = params.local_gid,
                  .remote_gid = params.remote_gid,
                  .packet_rate = 3,
                  .hop_limit = 64,
                  .local_ack_timeout = 19},
      .private_data = params.private_data,
  };
  req_tid_ = (std::uint64_t{tid_high_} << 32) | local_comm_id_;  // §3.3: agent << 32 | comm ID
  OutboundMad mad{.destination = params.remote_gid};
  if (!w::encode_cm_mad({.transaction_id = req_tid_, .message = req}, mad.bytes)) {
    return fail(std::errc::invalid_argument);
  }
  started_ = true;
  active_ = true;
  confirm_reply_ = params.confirm_reply;
  local_qpn_ = params.qpn;
  service_id_ = params.service_id;
  peer_.gid = params.remote_gid;
  // §4.6: the active side resends after 2 × packet lifetime + the remote CM response timeout.
  resend_interval_ = 2 * cm_time(timing_.packet_lifetime) + cm_time(timing_.cm_response_timeout);
  max_retries_ = timing_.max_cm_retries;
  keep_for_resend(mad);
  outbox().mads.push_back(mad);
  enter(IbCmState::req_sent);
  retries_left_ = max_retries_;
  arm_resend(now);
  return {};
}

Status<std::errc> IbCmConnection::accept(const IbCmReplyParams& params, Time now) {
  if (state_ == IbCmState::rep_rcvd || state_ == IbCmState::mra_rep_sent) {
    if (params.private_data.size() > w::kRtuPrivateDataSize) return fail(std::errc::invalid_argument);
    send_rtu(params.private_data);  // §4.9 REP_RCVD: consumer accepts → RTU → ESTABLISHED
    deadline_.reset();
    enter(IbCmState::established);
    emit(Kind::established);
    return {};
  }
  if (state_ != IbCmState::req_rcvd && state_ != IbCmState::mra_req_sent) {
    return fail(std::errc::invalid_argument);
  }
  const w::CmRep rep{.local_comm_id = local_comm_id_,
                     .remote_comm_id = peer_.comm_id,
                     .local_qpn = params.qpn,
                     .starting_psn = params.starting_psn,
                     .responder_resources = params.responder_resources,
                     .initiator_depth = params.initiator_depth,
                     .target_ack_delay = 15,
                     .rnr_retry_count = params.rnr_retry_count,
                     .local_ca_guid = local_guid_,
                     .private_data = params.private_data};
  OutboundMad mad{.destination = peer_.gid};
  if (!w::encode_cm_mad({.transaction_id = req_tid_, .message = rep}, mad.bytes)) {
    return fail(std::errc::invalid_argument);
  }
  local_qpn_ = params.qpn;
  keep_for_resend(mad);
  if (may_answer()) outbox().mads.push_back(mad);
  // §4.9: REP resent on the REQ's local CM response timeout, up to the REQ's Max CM Retries.
  enter(IbCmState::rep_sent);
  retries_left_ = max_retries_;
  arm_resend(now);
  return {};
}

Status<std::errc> IbCmConnection::reject(std::uint16_t reason, std::span<const std::uint8_t> private_data,
                                         Time) {
  if (private_data.size() > w::kRejPrivateDataSize) return fail(std::errc::invalid_argument);
  switch (state_) {
    case IbCmState::req_rcvd:
    case IbCmState::mra_req_sent:
      send_rej(reason, w::RejTarget::req, {}, private_data);  // §4.9: REJ (REJected = REQ) → IDLE
      break;
    case IbCmState::rep_rcvd:
    case IbCmState::mra_rep_sent:
      send_rej(reason, w::RejTarget::rep, {}, private_data);  // §4.9: REJ (REJected = REP) → IDLE
      break;
    default:
      return fail(std::errc::invalid_argument);
  }
  deadline_.reset();
  enter(IbCmState::idle);
  return {};
}

Status<std::errc> IbCmConnection::disconnect(std::span<const std::uint8_t> private_data, Time now) {
  if (state_ != IbCmState::established) return fail(std::errc::invalid_argument);
  const w::CmDreq dreq{.local_comm_id = local_comm_id_,
                       .remote_comm_id = peer_.comm_id,
                       .remote_qpn = peer_.qpn,  // §4.9: Remote QPN = the peer's QPN
                       .private_data = private_data};
  dreq_tid_ = (std::uint64_t{tid_high_} << 32) | local_comm_id_;
  OutboundMad mad{.destination = peer_.gid};
  if (!w::encode_cm_mad({.transaction_id = dreq_tid_, .message = dreq}, mad.bytes)) {
    return fail(std::errc::invalid_argument);
  }
  keep_for_resend(mad);
  outbox().mads.push_back(mad);
  enter(IbCmState::dreq_sent);
  retries_left_ = max_retries_;  // §4.6: the passive side uses the REQ's Max CM Retries here too
  arm_resend(now);
  return {};
}

void IbCmConnection::abort(Time now) {
  // REJ reason 4 carries the sender's CA GUID as ARI (§4.8), so that a peer that never learnt
  // our comm ID can still find the connection (§4.6 lookup).
  const auto ari = guid_ari();
  switch (state_) {
    case IbCmState::req_sent:
    case IbCmState::mra_req_rcvd:
      // §4.9: REQ_SENT abandoned → REJ(timeout, ARI = our CA GUID) → IDLE (Linux).
      send_rej(w::rej_reason::kTimeout, w::RejTarget::other, ari, {});
      deadline_.reset();
      enter(IbCmState::idle);
      return;
    case IbCmState::req_rcvd:
    case IbCmState::mra_req_sent:
    case IbCmState::rep_rcvd:
    case IbCmState::mra_rep_sent:
      (void)reject(w::rej_reason::kConsumerReject, {}, now);
      return;
    case IbCmState::rep_sent:
    case IbCmState::mra_rep_rcvd:
      // §4.9: REP_SENT, consumer rejects → REJ → TIMEWAIT.
      send_rej(w::rej_reason::kTimeout, w::RejTarget::other, ari, {});
      to_timewait(now);
      return;
    case IbCmState::established:
      (void)disconnect({}, now);
      return;
    case IbCmState::idle:
    case IbCmState::dreq_sent:
    case IbCmState::dreq_rcvd:
    case IbCmState::timewait:
      return;
  }
}

// ---------------------------------------------------------------------------------------------
// Network

void IbCmConnection::take_request(const w::CmReq& req, std::uint64_t tid, Time now) {
  started_ = true;
  active_ = false;
  req_tid_ = tid;
  service_id_ = req.service_id;
  peer_ = IbCmPeer{.guid = req.local_ca_guid,
                   .comm_id = req.local_comm_id,
                   .qpn = req.local_qpn,
                   .starting_psn = req.starting_psn,
                   .responder_resources = req.responder_resources,
                   .initiator_depth = req.initiator_depth,
                   .rnr_retry_count = req.rnr_retry_count,
                   .gid = req.primary.local_gid};
  peer_known_ = true;
  peer_private_data_.assign(req.private_data.begin(), req.private_data.end());
  // The REQ's timers are the unauthenticated sender's word: clamped (docs/reliability.md).
  const auto clamp_timeout = [&](std::uint8_t exponent) {
    return std::clamp(exponent, kMinPeerTimeout, std::max(kMinPeerTimeout, timing_.cm_response_timeout));
  };
  peer_response_timeout_ = clamp_timeout(req.remote_cm_response_timeout);
  own_response_timeout_ = clamp_timeout(req.local_cm_response_timeout);
  // §4.6: the passive side resends its REP (and DREQ) after the REQ's local CM response timeout,
  // up to the REQ's Max CM Retries; the round trip's two packet lifetimes are added (Linux
  // omits them, which makes a slow path look like a lost REP).
  resend_interval_ = cm_time(own_response_timeout_) + 2 * cm_time(timing_.packet_lifetime);
  max_retries_ = std::min(req.max_cm_retries, timing_.max_cm_retries);
  enter(IbCmState::req_rcvd);
  // §4.9 REQ_RCVD, consumer slow → MRA: sent once half the time the peer waits for an answer
  // (its Remote CM Response Timeout) has gone without one.
  deadline_ = now + cm_time(peer_response_timeout_) / 2;
  emit(Kind::request_received);
}

void IbCmConnection::handle_req(const w::CmReq& req, std::uint64_t tid, Time now) {
  peer_spoke();
  switch (state_) {
    case IbCmState::idle:
      if (!started_) take_request(req, tid, now);  // §4.9 LISTEN: REQ → REQ_RCVD
      return;
    case IbCmState::req_sent:
    case IbCmState::mra_req_rcvd:
      // §5 passive side: our REQ is dead (the active side drops it); stop resending it and handle
      // the peer's REQ like a listener's, keeping our local comm ID.
      take_request(req, tid, now);
      return;
    case IbCmState::mra_req_sent:
      send_mra(w::MraTarget::req);  // §4.9 duplicate REQ: resend the MRA
      return;
    case IbCmState::timewait:
      send_rej(w::rej_reason::kStaleConnection, w::RejTarget::req, {}, {});  // §4.9: REJ 10
      return;
    default:
      return;  // §4.9 duplicate REQ: ignored (the REP timer covers REP_SENT)
  }
}

void IbCmConnection::take_reply(const w::CmRep& rep) {
  peer_.guid = rep.local_ca_guid;
  peer_.comm_id = rep.local_comm_id;
  peer_.qpn = rep.local_qpn;
  peer_.starting_psn = rep.starting_psn;
  peer_.responder_resources = rep.responder_resources;
  peer_.initiator_depth = rep.initiator_depth;
  peer_.rnr_retry_count = rep.rnr_retry_count;
  peer_known_ = true;
  peer_private_data_.assign(rep.private_data.begin(), rep.private_data.end());
}

void IbCmConnection::handle_rep(const w::CmRep& rep, Time now) {
  peer_spoke();
  switch (state_) {
    case IbCmState::req_sent:
    case IbCmState::mra_req_rcvd:
      take_reply(rep);
      if (confirm_reply_) {
        // §4.9 REP_RCVD: the consumer answers; an MRA goes out once half our own local CM
        // response timeout (what the REQ promised the peer) has passed without an answer.
        enter(IbCmState::rep_rcvd);
        deadline_ = now + cm_time(timing_.cm_response_timeout) / 2;
        emit(Kind::reply_received, 0, peer_private_data_);
        return;
      }
      send_rtu({});  // §6: rdma_cm sends the RTU itself when the REP arrives
      deadline_.reset();
      {
        const std::vector<std::uint8_t> reply_data = std::move(peer_private_data_);  // the event's now
        enter(IbCmState::established);
        emit(Kind::established, 0, reply_data);
      }
      return;
    case IbCmState::established:
      if (active_) send_rtu({});  // §4.9 duplicate REP: resend the RTU
      return;
    case IbCmState::mra_rep_sent:
      send_mra(w::MraTarget::rep);  // §4.9 duplicate REP: resend the MRA
      return;
    default:
      return;
  }
}

void IbCmConnection::handle_rtu(const w::CmRtu& rtu, Time) {
  peer_spoke();
  if (state_ != IbCmState::rep_sent && state_ != IbCmState::mra_rep_rcvd) {
    return;  // §4.9 duplicate RTU: ignored
  }
  deadline_.reset();
  enter(IbCmState::established);  // §4.9 REP_SENT, MRA_REP_RCVD: RTU → ESTABLISHED
  emit(Kind::established, 0, rtu.private_data);
}

void IbCmConnection::handle_rej(const w::CmRej& rej, Time now) {
  peer_spoke();
  switch (state_) {
    case IbCmState::req_sent:
    case IbCmState::mra_req_rcvd:
    case IbCmState::rep_sent:
    case IbCmState::mra_rep_rcvd:
    case IbCmState::req_rcvd:
    case IbCmState::mra_req_sent: {
      const IbCmState was = state_;
      // §4.9: → IDLE; → TIMEWAIT if reason 10 (stale connection).
      if (rej.reason == w::rej_reason::kStaleConnection) {
        to_timewait(now);
      } else {
        deadline_.reset();
        enter(IbCmState::idle);
      }
      outbox().events.push_back(rejected_event(rej, was));
      return;
    }
    case IbCmState::rep_rcvd:
    case IbCmState::mra_rep_sent: {
      const IbCmState was = state_;
      to_timewait(now);  // §4.9 [impl]: REP_RCVD, MRA_REP_SENT: REJ → TIMEWAIT
      outbox().events.push_back(rejected_event(rej, was));
      return;
    }
    case IbCmState::established:
    case IbCmState::dreq_sent: {
      const IbCmState was = state_;
      to_timewait(now);  // §4.9 [impl]: ESTABLISHED, DREQ_SENT: REJ → TIMEWAIT
      outbox().events.push_back({.kind = Kind::disconnected, .state = was, .reason = rej.reason});
      return;
    }
    default:
      return;
  }
}

void IbCmConnection::handle_mra(const w::CmMra& mra, Time now) {
  peer_spoke();
  // §4.9 MRA: stop resending; wait service timeout + packet lifetime, then resume.
  const Time until = now + cm_time(mra.service_timeout) + cm_time(timing_.packet_lifetime);
  if (state_ == IbCmState::req_sent && mra.message_mraed == w::MraTarget::req) {
    enter(IbCmState::mra_req_rcvd);
    deadline_ = until;
  } else if (state_ == IbCmState::rep_sent && mra.message_mraed == w::MraTarget::rep) {
    enter(IbCmState::mra_rep_rcvd);
    deadline_ = until;
  }
  // §4.9 duplicate MRA: ignored.
}

void IbCmConnection::handle_dreq(const w::CmDreq& dreq, std::uint64_t tid, Time now) {
  peer_spoke();
  if (dreq.remote_qpn != local_qpn_) return;  // §4.6: a DREQ must name our QPN, else ignored
  switch (state_) {
    case IbCmState::rep_sent:
    case IbCmState::mra_rep_rcvd:
      // The peer could only disconnect after our REP reached it: the RTU was lost. The
      // connection was established at both ends, so it is reported before it goes.
      emit(Kind::established);
      [[fallthrough]];
    case IbCmState::established:
    case IbCmState::dreq_sent: {
      const IbCmState was = state_;
      enter(IbCmState::dreq_rcvd);
      send_drep(tid);  // §6: rdma_cm answers a DREQ with a DREP at once
      to_timewait(now);
      outbox().events.push_back({.kind = Kind::disconnected,
                         .state = was,
                         .private_data = {dreq.private_data.begin(), dreq.private_data.end()}});
      return;
    }
    case IbCmState::timewait:
      send_drep(tid);  // §4.9 duplicate DREQ: resend the DREP
      return;
    default:
      return;
  }
}

void IbCmConnection::handle_drep(const w::CmDrep& drep, Time now) {
  peer_spoke();
  if (state_ != IbCmState::dreq_sent) return;
  to_timewait(now);  // §4.9 DREQ_SENT: DREP → TIMEWAIT
  emit(Kind::disconnected, 0, drep.private_data);
}

void IbCmConnection::handle_timeout(Time now) {
  if (!deadline_ || *deadline_ > now) return;
  deadline_.reset();
  switch (state_) {
    case IbCmState::req_sent:
    case IbCmState::mra_req_rcvd:
    case IbCmState::rep_sent:
    case IbCmState::mra_rep_rcvd:
    case IbCmState::dreq_sent:
      resend_or_give_up(now);
      return;
    case IbCmState::req_rcvd:
      send_mra(w::MraTarget::req);  // §4.9 REQ_RCVD, consumer slow → MRA_REQ_SENT
      enter(IbCmState::mra_req_sent);
      deadline_ = now + cm_time(timing_.service_timeout);
      return;
    case IbCmState::rep_rcvd:
      send_mra(w::MraTarget::rep);  // §4.9 REP_RCVD, consumer slow → MRA_REP_SENT
      enter(IbCmState::mra_rep_sent);
      deadline_ = now + cm_time(timing_.service_timeout);
      return;
    case IbCmState::mra_req_sent:
    case IbCmState::mra_rep_sent: {
      // Our MRA promised an answer within the service timeout and the consumer gave none: the
      // peer would wait in vain, so it learns at once (REJ timeout, §4.8).
      const IbCmState was = state_;
      send_rej(w::rej_reason::kTimeout, was == IbCmState::mra_req_sent ? w::RejTarget::req : w::RejTarget::rep,
               guid_ari(), {});
      enter(IbCmState::idle);
      outbox().events.push_back({.kind = Kind::timed_out, .state = was});
      return;
    }
    case IbCmState::timewait:
      enter(IbCmState::idle);  // §4.9 TIMEWAIT: timer → IDLE
      emit(Kind::timewait_exit);
      return;
    case IbCmState::idle:
    case IbCmState::established:
    case IbCmState::dreq_rcvd:
      return;
  }
}

void IbCmConnection::handle_peer_unreachable(const Gid& peer, Time now) {
  if (resend_ == nullptr || resend_->destination != peer) return;  // only the states that resend keep it
  switch (state_) {
    case IbCmState::req_sent:
    case IbCmState::mra_req_rcvd:
    case IbCmState::rep_sent:
    case IbCmState::mra_rep_rcvd:
    case IbCmState::dreq_sent:
      retries_left_ = 0;
      deadline_.reset();
      resend_or_give_up(now);
      return;
    default:
      return;
  }
}

void IbCmConnection::resend_or_give_up(Time now) {
  assert(resend_ != nullptr);  // every state that resends kept its MAD on entry
  if (retries_left_ > 0 && may_answer()) {
    --retries_left_;
    outbox().mads.push_back(*resend_);  // §3.3: the identical MAD, same TID
    // After an MRA's wait the resend logic resumes where it was (§4.9).
    if (state_ == IbCmState::mra_req_rcvd) enter(IbCmState::req_sent);
    if (state_ == IbCmState::mra_rep_rcvd) enter(IbCmState::rep_sent);
    arm_resend(now);
    return;
  }
  const IbCmState was = state_;
  if (state_ == IbCmState::dreq_sent) {
    to_timewait(now);  // §4.9 DREQ_SENT: retries exhausted → TIMEWAIT
    emit(Kind::disconnected);
    return;
  }
  // §4.9: retries exhausted → report failure; the peer is told with REJ(timeout) (Linux sends it
  // when the consumer then abandons, which rdma_cm always does).
  abort(now);
  outbox().events.push_back({.kind = Kind::timed_out, .state = was});
}

// ---------------------------------------------------------------------------------------------
// Outputs and helpers

std::optional<OutboundMad> IbCmConnection::poll_mad() {
  if (!outbox_) return std::nullopt;
  if (outbox_->next_mad == outbox_->mads.size()) {
    release_outbox_if_drained();
    return std::nullopt;
  }
  return outbox_->mads[outbox_->next_mad++];
}

std::optional<IbCmEvent> IbCmConnection::poll_event() {
  if (!outbox_) return std::nullopt;
  if (outbox_->next_event == outbox_->events.size()) {
    release_outbox_if_drained();
    return std::nullopt;
  }
  return std::move(outbox_->events[outbox_->next_event++]);
}

IbCmConnection::Outbox& IbCmConnection::outbox() {
  if (!outbox_) outbox_ = std::make_unique<Outbox>();
  return *outbox_;
}

// Freed, not cleared, once both queues are read: a kept capacity would cost every connection of
// a large mesh a MAD or two for nothing.
void IbCmConnection::release_outbox_if_drained() {
  if (outbox_->next_mad == outbox_->mads.size() && outbox_->next_event == outbox_->events.size()) outbox_.reset();
}

void IbCmConnection::enter(IbCmState state) {
  state_ = state;
  switch (state) {
    case IbCmState::req_sent:
    case IbCmState::mra_req_rcvd:
    case IbCmState::rep_sent:
    case IbCmState::mra_rep_rcvd:
    case IbCmState::dreq_sent:
      return;  // the timer resends resend_ here (§4.9)
    case IbCmState::established:
      confirmed_ = true;
      // The REQ/REP's private data went up with the established event; nothing reads it again.
      std::vector<std::uint8_t>().swap(peer_private_data_);
      break;
    default:
      break;
  }
  resend_.reset();  // no state from here resends the MAD it held: a new one is kept if needed
}

std::array<std::uint8_t, 8> IbCmConnection::guid_ari() const {
  std::array<std::uint8_t, 8> ari{};
  for (std::size_t i = 0; i < ari.size(); ++i) {
    ari[i] = static_cast<std::uint8_t>(local_guid_ >> (8 * (ari.size() - 1 - i)));
  }
  return ari;
}

void IbCmConnection::send(const w::CmMessage& message, std::uint64_t tid, bool keep_for_resend) {
  OutboundMad mad{.destination = peer_.gid};
  const auto encoded = w::encode_cm_mad({.transaction_id = tid, .message = message}, mad.bytes);
  assert(encoded.has_value());  // every field comes from a message that decoded or encoded
  if (!encoded) return;
  if (keep_for_resend) this->keep_for_resend(mad);
  if (may_answer()) outbox().mads.push_back(mad);
}

void IbCmConnection::peer_spoke() {
  sent_since_heard_ = 0;  // it may be answered again
  heard_from_peer_ = true;
}

bool IbCmConnection::may_answer() {
  if (active_ || confirmed_) return true;
  if (sent_since_heard_ >= kMaxUnpromptedAnswers) return false;
  ++sent_since_heard_;
  return true;
}

void IbCmConnection::arm_resend(Time now) { deadline_ = now + resend_interval_; }

void IbCmConnection::send_rej(std::uint16_t reason, w::RejTarget target, std::span<const std::uint8_t> ari,
                              std::span<const std::uint8_t> private_data) {
  send(w::CmRej{.local_comm_id = local_comm_id_,
                .remote_comm_id = peer_known_ ? peer_.comm_id : 0,
                .message_rejected = target,
                .reason = reason,
                .ari = ari,
                .private_data = private_data},
       req_tid_, false);
}

void IbCmConnection::send_mra(w::MraTarget target) {
  send(w::CmMra{.local_comm_id = local_comm_id_,
                .remote_comm_id = peer_.comm_id,
                .message_mraed = target,
                .service_timeout = timing_.service_timeout},
       req_tid_, false);
}

void IbCmConnection::send_rtu(std::span<const std::uint8_t> private_data) {
  send(w::CmRtu{.local_comm_id = local_comm_id_, .remote_comm_id = peer_.comm_id, .private_data = private_data},
       req_tid_, false);
}

void IbCmConnection::send_drep(std::uint64_t tid) {
  // §3.3: the DREP reuses the DREQ's TID.
  send(w::CmDrep{.local_comm_id = local_comm_id_, .remote_comm_id = peer_.comm_id}, tid, false);
}

void IbCmConnection::to_timewait(Time now) {
  enter(IbCmState::timewait);
  deadline_ = now + cm_time(timing_.timewait);  // §4.9: the IDs stay taken for the timewait
}

void IbCmConnection::emit(Kind kind, std::uint16_t reason, std::span<const std::uint8_t> private_data,
                          std::span<const std::uint8_t> ari) {
  outbox().events.push_back({.kind = kind,
                     .state = state_,
                     .reason = reason,
                     .private_data = {private_data.begin(), private_data.end()},
                     .ari = {ari.begin(), ari.end()}});
}

}  // namespace peercm::core::ibcm
