// RC queue pair: verbs inputs, connection, inbound dispatch, time, ERROR and flushing.
#include <algorithm>
#include <cstring>

#include "core/qp_memory.hpp"
#include "core/roce/rc_queue_pair.hpp"
#include "wire/roce/psn.hpp"

namespace peercm::core::roce {

namespace w = wire::roce;

std::string_view to_string(RcErrorCause cause) {
  switch (cause) {
    case RcErrorCause::retry_exceeded: return "retry_exceeded";
    case RcErrorCause::rnr_retry_exceeded: return "rnr_retry_exceeded";
    case RcErrorCause::remote_invalid_request: return "remote_invalid_request";
    case RcErrorCause::remote_access_error: return "remote_access_error";
    case RcErrorCause::remote_operational_error: return "remote_operational_error";
    case RcErrorCause::bad_response: return "bad_response";
    case RcErrorCause::invalid_request: return "invalid_request";
    case RcErrorCause::access_violation: return "access_violation";
    case RcErrorCause::operational_error: return "operational_error";
    case RcErrorCause::local_protection: return "local_protection";
    case RcErrorCause::cq_overrun: return "cq_overrun";
    case RcErrorCause::modified_to_error: return "modified_to_error";
  }
  return "unknown";
}

RcQueuePair::RcQueuePair(const RcQpConfig& config, MemoryTable& memory, CompletionSink& send_cq,
                         CompletionSink& recv_cq)
    : config_(config),
      memory_(memory),
      send_cq_(send_cq),
      recv_cq_(recv_cq),
      receive_source_(config.srq ? config.srq : &rq_) {}

// ---------------------------------------------------------------- verbs

Status<std::errc> RcQueuePair::post_send(const SendWr& wr) {
  if (wr.sg_list.size() > config_.caps.max_send_sge) return fail(std::errc::invalid_argument);
  const bool is_inline = wr.flags & kSendInline;
  if (wr.opcode == WrOpcode::rdma_read && is_inline) return fail(std::errc::invalid_argument);
  std::uint64_t length = 0;
  for (const Sge& sge : wr.sg_list) length += sge.length;
  if (length > kMaxMessageSize) return fail(std::errc::invalid_argument);
  if (is_inline && length > config_.caps.max_inline_data) return fail(std::errc::invalid_argument);
  if (state_ != QpState::error && sq_.size() >= config_.caps.max_send_wr) return fail(std::errc::not_enough_memory);

  SendEntry entry;
  entry.wr = wr;
  entry.length = static_cast<std::uint32_t>(length);
  entry.signaled = config_.signal_all || (wr.flags & kSendSignaled);
  if (state_ == QpState::error) {
    entry.status = WcStatus::wr_flush_error;
    push_send_completion(entry);
    after_input();
    return {};
  }
  bool local_ok = true;
  if (is_inline) {
    // Copied now; the lkeys are ignored (verbs IBV_SEND_INLINE).
    entry.inline_data.resize(length);
    std::size_t at = 0;
    for (const Sge& sge : wr.sg_list) {
      if (sge.length == 0) continue;
      std::memcpy(entry.inline_data.data() + at, detail::memory_at(sge.addr), sge.length);
      at += sge.length;
    }
  } else {
    // A READ's sink is written locally; RC needs no remote right on it (unlike iWARP).
    const bool needs_write = wr.opcode == WrOpcode::rdma_read;
    for (const Sge& sge : wr.sg_list) local_ok = local_ok && memory_.check_local(sge, config_.pd, needs_write);
  }
  sq_.push_back(std::move(entry));
  if (!local_ok) {
    // verbs: the WR completes with a local protection error and the QP goes to ERROR.
    SendEntry& bad = sq_.back();
    bad.status = WcStatus::local_protection_error;
    enter_error(RcEvent{RcErrorCause::local_protection, 0, wr.wr_id, true});
  }
  after_input();
  return {};
}

void RcQueuePair::adopt_receives(ReceiveQueue&& posted) {
  while (!posted.empty()) rq_.push(posted.take());
}

// The QP's own queue stays empty while it has an SRQ (post_recv refuses).
void RcQueuePair::detach_srq() { receive_source_ = &rq_; }

Status<std::errc> RcQueuePair::post_recv(const RecvWr& wr) {
  if (config_.srq) return fail(std::errc::invalid_argument);
  if (wr.sg_list.size() > config_.caps.max_recv_sge) return fail(std::errc::invalid_argument);
  if (state_ == QpState::error) {
    push_recv_completion(WorkCompletion{.wr_id = wr.wr_id,
                                        .status = WcStatus::wr_flush_error,
                                        .opcode = WcOpcode::recv,
                                        .qp_num = params_.local_qpn},
                         false);
    after_input();
    return {};
  }
  if (recv_queue_size() >= config_.caps.max_recv_wr) return fail(std::errc::not_enough_memory);
  // A receive failing its lkey checks is found when a Send lands in it (§2.11: the
  // responder NAKs remote operational error).
  rq_.post(wr, memory_, config_.pd);
  return {};
}

// ---------------------------------------------------------------- connection and time

Status<std::errc> RcQueuePair::connect(const RcConnectParams& params, Time now) {
  if (connected_) return fail(std::errc::already_connected);
  const std::size_t pmtu = w::path_mtu_bytes(static_cast<std::uint8_t>(params.pmtu));
  if (pmtu == 0 || params.local_qpn > w::kQpnMask || params.remote_qpn > w::kQpnMask ||
      params.send_psn > w::kPsnMask || params.recv_psn > w::kPsnMask || params.local_ack_timeout > 31 ||
      params.retry_cnt > 7 || params.rnr_retry > 7 || params.min_rnr_timer > 31 || params.send_window == 0 ||
      params.send_window >= w::kPsnWindow)
    return fail(std::errc::invalid_argument);
  params_ = params;
  pmtu_ = static_cast<std::uint32_t>(pmtu);
  ack_timeout_ = local_ack_timeout_duration(params.local_ack_timeout);
  now_ = std::max(now_, now);
  connected_ = true;
  tx_psn_ = una_psn_ = sent_end_psn_ = params.send_psn;
  window_ = params.send_window;
  tx_seq_ = sq_base_;
  tx_pkt_ = 0;
  retries_left_ = params.retry_cnt;
  rnr_retries_left_ = params.rnr_retry;
  epsn_ = params.recv_psn;
  if (state_ != QpState::error) state_ = QpState::rts;
  heard_from_peer();
  return {};
}

Status<std::errc> RcQueuePair::set_requester(const RcRequesterParams& params) {
  if (!connected_) return fail(std::errc::not_connected);
  if (params.send_psn > w::kPsnMask || params.local_ack_timeout > 31 || params.retry_cnt > 7 || params.rnr_retry > 7)
    return fail(std::errc::invalid_argument);
  const bool nothing_sent = tx_psn_ == params_.send_psn && una_psn_ == params_.send_psn &&
                            sent_end_psn_ == params_.send_psn && tx_seq_ == sq_base_ && tx_pkt_ == 0;
  if (!nothing_sent) return fail(std::errc::invalid_argument);
  params_.send_psn = params.send_psn;
  params_.local_ack_timeout = params.local_ack_timeout;
  params_.retry_cnt = params.retry_cnt;
  params_.rnr_retry = params.rnr_retry;
  params_.max_rd_atomic = params.max_rd_atomic;
  ack_timeout_ = local_ack_timeout_duration(params.local_ack_timeout);
  tx_psn_ = una_psn_ = sent_end_psn_ = params.send_psn;
  window_ = params_.send_window;
  retries_left_ = params.retry_cnt;
  rnr_retries_left_ = params.rnr_retry;
  return {};
}

void RcQueuePair::handle_datagram(std::span<const std::uint8_t> udp_payload, const Ipv4Bytes& source_ip,
                                  std::uint16_t udp_source_port, Time now) {
  now_ = std::max(now_, now);
  ++stats_.datagrams_received;
  if (!connected_ || state_ == QpState::error) {
    ++stats_.dropped_not_connected;
    return;
  }
  if (source_ip != params_.remote_ip) {
    ++stats_.dropped_foreign_source;
    return;
  }
  if (behind_naked_gap(udp_payload)) {
    ++stats_.dropped_unexpected;
    return;
  }
  // §1.4, §1.5: the sender used ID 0 with DF, from its address to ours.
  const w::IcrcPseudoHeader pseudo{
      .ip = w::Ipv4IcrcFields{.source = params_.remote_ip, .destination = params_.local_ip},
      .udp_source_port = udp_source_port};
  auto packet = w::decode_verified_packet(udp_payload, pseudo);
  if (!packet) {
    // §1.3: dropped silently and counted.
    if (packet.error() == wire::WireError::roce_bad_icrc)
      ++stats_.dropped_bad_icrc;
    else
      ++stats_.dropped_malformed;
    return;
  }
  const w::Bth& bth = packet->headers.bth;
  // §1.3: known DestQP, RoCE's P_Key (low 15 bits all ones), RC only.
  if (bth.destination_qp != params_.local_qpn || (bth.partition_key & 0x7FFF) != 0x7FFF ||
      w::opcode_transport(bth.opcode) != w::kTransportRc) {
    ++stats_.dropped_malformed;
    return;
  }
  heard_from_peer();  // only a packet that passed every check above
  if (w::is_request(bth.opcode))
    handle_request(*packet);
  else
    handle_response(*packet);
  after_input();
}

void RcQueuePair::handle_timeout(Time now) {
  now_ = std::max(now_, now);
  if (state_ == QpState::error) return;
  if (rnr_until_ && now_ >= *rnr_until_) rnr_until_.reset();
  if (ack_deadline_ && now_ >= *ack_deadline_) requester_timeout();
  if (recovery_deadline_ && now_ >= *recovery_deadline_) recovery_timeout();
  if (keepalive_due_ && now_ >= *keepalive_due_) keepalive_timeout();
  after_input();
}

void RcQueuePair::handle_peer_unreachable(Time now) {
  now_ = std::max(now_, now);
  if (state_ == QpState::error || !connected_) return;
  fail_requester(RcErrorCause::retry_exceeded, una_psn_);
  after_input();
}

void RcQueuePair::modify_to_error() {
  enter_error(RcEvent{RcErrorCause::modified_to_error});
  after_input();
}

std::optional<Time> RcQueuePair::next_deadline() const {
  if (state_ == QpState::error) return std::nullopt;
  std::optional<Time> next = ack_deadline_;
  if (rnr_until_ && (!next || *rnr_until_ < *next)) next = rnr_until_;
  if (recovery_deadline_ && (!next || *recovery_deadline_ < *next)) next = recovery_deadline_;
  if (ack_held() && (!next || *ack_hold_until_ < *next)) next = ack_hold_until_;
  if (keepalive_due_ && (!next || *keepalive_due_ < *next)) next = keepalive_due_;
  return next;
}

std::optional<RcEvent> RcQueuePair::poll_event() {
  if (!event_ || event_reported_) return std::nullopt;
  event_reported_ = true;
  return event_;
}

// ---------------------------------------------------------------- ERROR and flushing

// §2.11: the first error moves the QP to ERROR; every WR still queued completes, those
// with a status of their own with it, the rest with a flush error. Responses already owed
// (and a final NAK) still leave; no request does.
void RcQueuePair::enter_error(const RcEvent& event) {
  if (state_ == QpState::error) return;
  state_ = QpState::error;
  event_ = event;
  ack_deadline_.reset();
  recovery_deadline_.reset();
  rnr_until_.reset();
  keepalive_due_.reset();
  probe_owed_ = false;
  recovery_probes_owed_ = 0;
  // Answers the responder already owes (and its final NAK) still leave after its own
  // error, so that the peer learns why; any other error ends the conversation.
  const bool responder_cause = event.cause == RcErrorCause::invalid_request ||
                               event.cause == RcErrorCause::access_violation ||
                               event.cause == RcErrorCause::operational_error;
  if (!responder_cause) {
    // Queued ACKs still leave: they tell the peer what we executed, so that its WRs
    // complete as they did (a held ACK would otherwise make a delivered message flush).
    std::erase_if(responses_, [](const Response& r) { return r.kind != Response::Kind::ack; });
    pending_new_reads_ = 0;
  }
  ack_hold_until_.reset();
  flush_all();
}

void RcQueuePair::flush_all() {
  flushing_ = true;
  while (!sq_.empty()) {
    SendEntry& entry = sq_.front();
    if (!entry.status) entry.status = WcStatus::wr_flush_error;
    push_send_completion(entry);
    sq_.pop_front();
    ++sq_base_;
  }
  tx_seq_ = sq_base_;
  reads_in_flight_ = 0;
  flush_receives(recv_taken_, rq_, params_.local_qpn, [this](const WorkCompletion& wc) { push_recv_completion(wc, false); });
  rx_message_ = RxMessage::none;
  flushing_ = false;
}

void RcQueuePair::push_send_completion(const SendEntry& entry) {
  const WcStatus status = entry.status.value_or(WcStatus::success);
  // An error completion is reported even for an unsignaled WR (§2.11).
  if (status == WcStatus::success && !entry.signaled) return;
  WorkCompletion wc;
  wc.wr_id = entry.wr.wr_id;
  wc.status = status;
  switch (entry.wr.opcode) {
    case WrOpcode::rdma_write:
    case WrOpcode::rdma_write_with_imm: wc.opcode = WcOpcode::rdma_write; break;
    case WrOpcode::rdma_read: wc.opcode = WcOpcode::rdma_read; break;
    case WrOpcode::send:
    case WrOpcode::send_with_invalidate:
    case WrOpcode::send_with_imm: wc.opcode = WcOpcode::send; break;
  }
  wc.byte_len = status == WcStatus::success ? entry.length : 0;
  wc.qp_num = params_.local_qpn;
  if (!send_cq_.push(wc) && !flushing_) cq_overrun_ = true;
}

void RcQueuePair::push_recv_completion(const WorkCompletion& wc, bool solicited) {
  if (!recv_cq_.push(wc)) {
    if (!flushing_) cq_overrun_ = true;
    return;
  }
  if (solicited) recv_cq_.solicited();
}

// A CQ overrun is a local catastrophic error: the completion that did not fit is lost,
// everything else flushes.
void RcQueuePair::after_input() {
  if (!cq_overrun_) return;
  cq_overrun_ = false;
  enter_error(RcEvent{RcErrorCause::cq_overrun});
}

}  // namespace peercm::core::roce
