// RC responder: the expected PSN, execution of SEND/WRITE/READ requests against posted
// receives and registered memory, duplicates, and the ACKs, NAKs and read responses owed
// in return (roce-ibcm-wire.md §2.3-2.10).
#include <arpa/inet.h>

#include <algorithm>
#include <cstring>

#include "core/qp_memory.hpp"
#include "core/roce/rc_queue_pair.hpp"
#include "core/roce/sge_span.hpp"
#include "wire/roce/psn.hpp"

namespace peercm::core::roce {

namespace w = wire::roce;

namespace {

// §2.5: an ACK at least every this many requests even when none asked; one in flight per
// 16 packets keeps a long unacknowledged stream from waiting for the requester's timer.
constexpr std::uint32_t kAckCoalesceBound = 16;

enum class Family : std::uint8_t { send, write, read, unsupported };

struct RequestShape {
  Family family = Family::unsupported;
  bool starts = false;  // FIRST or ONLY: opens a message
  bool ends = false;    // LAST or ONLY
  bool invalidate = false;
  bool immediate = false;  // carries ImmDt; on a WRITE it consumes a receive (§2.3)
};

RequestShape shape_of(w::Opcode op) {
  using O = w::Opcode;
  switch (op) {
    case O::rc_send_first: return {Family::send, true, false, false, false};
    case O::rc_send_middle: return {Family::send, false, false, false, false};
    case O::rc_send_last: return {Family::send, false, true, false, false};
    case O::rc_send_last_invalidate: return {Family::send, false, true, true, false};
    case O::rc_send_last_immediate: return {Family::send, false, true, false, true};
    case O::rc_send_only: return {Family::send, true, true, false, false};
    case O::rc_send_only_invalidate: return {Family::send, true, true, true, false};
    case O::rc_send_only_immediate: return {Family::send, true, true, false, true};
    case O::rc_rdma_write_first: return {Family::write, true, false, false, false};
    case O::rc_rdma_write_middle: return {Family::write, false, false, false, false};
    case O::rc_rdma_write_last: return {Family::write, false, true, false, false};
    case O::rc_rdma_write_last_immediate: return {Family::write, false, true, false, true};
    case O::rc_rdma_write_only: return {Family::write, true, true, false, false};
    case O::rc_rdma_write_only_immediate: return {Family::write, true, true, false, true};
    case O::rc_rdma_read_request: return {Family::read, true, true, false, false};
    default: break;
  }
  // Atomics: peercm's verbs have none, so they cannot be completed.
  return {};
}

}  // namespace

void RcQueuePair::handle_request(const w::PacketView& packet) {
  const std::uint32_t psn = packet.headers.bth.psn;
  switch (w::classify_psn(psn, epsn_)) {
    case w::PsnOrder::ahead:
      // §2.4: one PSN-sequence-error NAK carrying ePSN per gap; later early packets are
      // dropped without another until ePSN arrives.
      ++stats_.dropped_unexpected;
      if (!sequence_nak_sent_) {
        sequence_nak_sent_ = true;
        ++stats_.sequence_naks_sent;
        queue_nak(w::NakCode::psn_sequence_error, epsn_);
      }
      return;
    case w::PsnOrder::duplicate: handle_duplicate(packet); return;
    case w::PsnOrder::expected: break;
  }
  sequence_nak_sent_ = false;
  execute_request(packet);
}

// §2.4: once a gap is NAKed, every request after it is dropped with no answer and no
// effect until ePSN arrives; §1.3: so is a packet whose ICRC is wrong. Such a request is
// therefore dropped on its BTH alone, before its ICRC is computed: after a loss the peer
// sends up to a window of them (go-back-N), and a bad ICRC would end the same way. It is not
// a sign of life (heard_from_peer): nothing about it was verified.
bool RcQueuePair::behind_naked_gap(std::span<const std::uint8_t> udp_payload) const {
  if (!sequence_nak_sent_ || udp_payload.size() < w::kBthSize) return false;
  const auto bth = w::decode_bth(udp_payload.first<w::kBthSize>());
  return bth && bth->destination_qp == params_.local_qpn && w::opcode_transport(bth->opcode) == w::kTransportRc &&
         w::is_request(bth->opcode) && w::classify_psn(bth->psn, epsn_) == w::PsnOrder::ahead;
}

void RcQueuePair::execute_request(const w::PacketView& packet) {
  const w::PacketHeaders& h = packet.headers;
  const std::uint32_t psn = h.bth.psn;
  const std::span<const std::uint8_t> payload = packet.payload;
  const RequestShape shape = shape_of(h.bth.opcode);
  if (shape.family == Family::unsupported) {
    responder_error(RcErrorCause::invalid_request, w::NakCode::invalid_request, psn, std::nullopt);
    return;
  }
  // §2.3: messages do not interleave; FIRST/ONLY only between messages, MIDDLE/LAST only
  // inside one of their kind; payload lengths per opcode against the PMTU.
  const RxMessage kind = shape.family == Family::write ? RxMessage::write : RxMessage::send;
  const bool sequence_ok = shape.starts ? rx_message_ == RxMessage::none : rx_message_ == kind;
  if (!sequence_ok || !w::payload_length_allowed(h.bth.opcode, payload.size(), pmtu_)) {
    responder_error(RcErrorCause::invalid_request, w::NakCode::invalid_request, psn, std::nullopt);
    return;
  }

  if (shape.family == Family::read) {
    const w::Reth& reth = h.reth;
    if (reth.dma_length > kMaxMessageSize) {
      responder_error(RcErrorCause::invalid_request, w::NakCode::invalid_request, psn, std::nullopt);
      return;
    }
    // §2.3: read access for READ (R_Key, bounds, remote-read right).
    if (memory_.check_remote(reth.r_key, config_.pd, reth.virtual_address, reth.dma_length,
                             MemoryTable::Direction::read_source)) {
      responder_error(RcErrorCause::access_violation, w::NakCode::remote_access_error, psn, std::nullopt);
      return;
    }
    // §2.9: the requester keeps its READs within our responder resources (IRD).
    if (pending_new_reads_ >= std::max<std::uint32_t>(1, params_.max_dest_rd_atomic)) {
      responder_error(RcErrorCause::invalid_request, w::NakCode::invalid_request, psn, std::nullopt);
      return;
    }
    const std::uint32_t npkts = read_packets(reth.dma_length);
    read_contexts_.push_back(ReadContext{psn, npkts, reth});
    if (read_contexts_.size() > std::max<std::size_t>(1, params_.max_dest_rd_atomic)) read_contexts_.pop_front();
    Response response{.kind = Response::Kind::read,
                      .psn = psn,
                      .read_first = psn,
                      .read_start = psn,
                      .read_end = w::psn_add(psn, npkts),
                      .reth = reth,
                      .new_read = true};
    responses_.push_back(response);
    ++pending_new_reads_;
    // §2.9: ePSN moves past every response PSN; §2.6: MSN counts the READ when accepted.
    epsn_ = w::psn_add(psn, npkts);
    msn_ = w::psn_next(msn_);
    unacked_requests_ = 0;  // the responses acknowledge everything before them
    unacked_before_message_ = 0;
    return;
  }

  if (shape.family == Family::send) {
    if (shape.starts) {
      if (receive_source_->empty()) {
        queue_rnr_nak(psn);  // §2.7: no receive WQE
        return;
      }
      recv_taken_ = receive_source_->take();
      rx_message_ = RxMessage::send;
      rx_offset_ = 0;
      if (recv_taken_->error) {
        // §2.11: a receive WR that failed its checks: remote operational error.
        responder_error(RcErrorCause::operational_error, w::NakCode::remote_operational_error, psn,
                        recv_taken_->error);
        return;
      }
    }
    if (rx_offset_ + payload.size() > recv_taken_->capacity) {
      responder_error(RcErrorCause::invalid_request, w::NakCode::invalid_request, psn,
                      WcStatus::local_length_error);
      return;
    }
    const std::uint8_t* source = payload.data();
    for_each_piece(recv_taken_->wr.sg_list, rx_offset_, payload.size(), [&](std::uint8_t* target, std::size_t n) {
      std::memcpy(target, source, n);
      source += n;
    });
    rx_offset_ += payload.size();
    if (shape.ends) {
      WorkCompletion wc{.wr_id = recv_taken_->wr.wr_id,
                        .status = WcStatus::success,
                        .opcode = WcOpcode::recv,
                        .byte_len = static_cast<std::uint32_t>(rx_offset_),
                        .qp_num = params_.local_qpn};
      if (shape.immediate) {
        // verbs imm_data is big-endian in memory; the codec holds ImmDt as a host value.
        wc.wc_flags |= kWcWithImm;
        wc.imm_data = htonl(h.immediate);
      }
      if (shape.invalidate) {
        if (memory_.invalidate(h.invalidate_rkey, config_.pd)) {
          responder_error(RcErrorCause::invalid_request, w::NakCode::invalid_request, psn,
                          WcStatus::remote_invalid_request_error);
          return;
        }
        wc.wc_flags |= kWcWithInvalidate;
        wc.invalidated_rkey = h.invalidate_rkey;
      }
      if (h.bth.solicited_event) wc.wc_flags |= kWcSolicited;
      recv_taken_.reset();
      rx_message_ = RxMessage::none;
      msn_ = w::psn_next(msn_);
      push_recv_completion(wc, h.bth.solicited_event);
    }
  } else {
    // §2.3, §2.7: a WRITE with Immediate consumes a receive WQE on its LAST/ONLY packet;
    // without one it is RNR NAKed like a SEND (checked first, as rxe does), the packet
    // dropped and ePSN kept, so that its resend finds the message where it was.
    if (shape.immediate && receive_source_->empty()) {
      queue_rnr_nak(psn);
      return;
    }
    if (shape.starts) {
      // §2.3: WRITE payloads inside a region whose R_Key grants remote write; a
      // zero-length WRITE needs no valid R_Key.
      const w::Reth& reth = h.reth;
      if (memory_.check_remote(reth.r_key, config_.pd, reth.virtual_address, reth.dma_length,
                               MemoryTable::Direction::write_sink)) {
        responder_error(RcErrorCause::access_violation, w::NakCode::remote_access_error, psn, std::nullopt);
        return;
      }
      rx_reth_ = reth;
      rx_offset_ = 0;
      rx_message_ = RxMessage::write;
    }
    // §2.3: the payloads sum to the RETH's DMA length.
    const bool fits = rx_offset_ + payload.size() <= rx_reth_.dma_length;
    if (!fits || (shape.ends && rx_offset_ + payload.size() != rx_reth_.dma_length)) {
      responder_error(RcErrorCause::invalid_request, w::NakCode::invalid_request, psn, std::nullopt);
      return;
    }
    if (!payload.empty())
      std::memcpy(detail::memory_at(rx_reth_.virtual_address + rx_offset_), payload.data(), payload.size());
    rx_offset_ += payload.size();
    if (shape.ends) {
      rx_message_ = RxMessage::none;
      msn_ = w::psn_next(msn_);
      memory_.note_remote_write_landed();
      if (shape.immediate) {
        // The receive gives only its wr_id: the data went where the WRITE put it, so its
        // SGEs are neither used nor checked (as rxe), and byte_len is the WRITE's length.
        const PostedRecv posted = receive_source_->take();
        WorkCompletion wc{.wr_id = posted.wr.wr_id,
                          .status = WcStatus::success,
                          .opcode = WcOpcode::recv_rdma_with_imm,
                          .byte_len = rx_reth_.dma_length,
                          .qp_num = params_.local_qpn,
                          .wc_flags = kWcWithImm,
                          .imm_data = htonl(h.immediate)};
        if (h.bth.solicited_event) wc.wc_flags |= kWcSolicited;
        push_recv_completion(wc, h.bth.solicited_event);
      }
    }
  }
  epsn_ = w::psn_next(psn);
  if (shape.starts) unacked_before_message_ = unacked_requests_;
  ++unacked_requests_;
  if (shape.ends) message_since_request_ = true;
  // §2.5: ACK what asked for one, and at least every kAckCoalesceBound requests. The bound
  // is about requests piling up across messages: a message alone since the last ACK, however
  // many packets long, asks for its ACK on its last packet and may wait for our reply as a
  // one-packet message does (a 64 KiB Write is 16 packets at a 4096-byte MTU).
  const bool alone = unacked_before_message_ == 0;
  if (h.bth.ack_request && shape.ends && (alone || unacked_requests_ < kAckCoalesceBound))
    queue_ack(psn, AckTiming::may_wait_for_reply);
  else if (h.bth.ack_request || unacked_requests_ >= kAckCoalesceBound)
    queue_ack(psn);
}

// §2.10: duplicates never move ePSN or MSN.
void RcQueuePair::handle_duplicate(const w::PacketView& packet) {
  const w::PacketHeaders& h = packet.headers;
  const std::uint32_t psn = h.bth.psn;
  ++stats_.duplicate_requests;
  if (h.bth.opcode != w::Opcode::rc_rdma_read_request) {
    // §2.10: a SEND/WRITE is not executed again; an ACK with ePSN - 1 and the current MSN
    // answers the copy that asked for one (its ACK was lost).
    if (h.bth.ack_request) queue_ack(w::psn_sub(epsn_, 1));
    return;
  }
  // §2.10: a READ runs again from its saved context, memory read anew, responses from the
  // duplicate's PSN. The duplicate asks for exactly the remainder from that PSN (§2.9).
  for (const ReadContext& context : read_contexts_) {
    if (!w::psn_in_range(psn, context.first_psn, context.npkts)) continue;
    const std::uint64_t offset = std::uint64_t{w::psn_distance(context.first_psn, psn)} * pmtu_;
    if (h.reth.r_key != context.reth.r_key || h.reth.virtual_address != context.reth.virtual_address + offset ||
        h.reth.dma_length + offset != context.reth.dma_length ||
        memory_.check_remote(h.reth.r_key, config_.pd, h.reth.virtual_address, h.reth.dma_length,
                             MemoryTable::Direction::read_source)) {
      ++stats_.dropped_unexpected;
      return;
    }
    ++stats_.read_replays;
    // An execution still queued restarts there rather than queueing a second copy.
    for (Response& queued : responses_) {
      if (queued.kind != Response::Kind::read || queued.read_first != context.first_psn) continue;
      if (w::psn_before(psn, queued.psn)) queued.psn = queued.read_start = psn;
      return;
    }
    responses_.push_back(Response{.kind = Response::Kind::read,
                                  .psn = psn,
                                  .read_first = context.first_psn,
                                  .read_start = psn,
                                  .read_end = w::psn_add(context.first_psn, context.npkts),
                                  .reth = context.reth,
                                  .new_read = false});
    return;
  }
  ++stats_.dropped_unexpected;  // no saved context: dropped silently (§2.10)
}

// §2.5: ACKs coalesce: one still queued last is moved forward instead of adding another.
// While the traffic alternates it may also wait for our reply (RcConnectParams::ack_delay):
// one datagram fewer each way, and the peer reads reply and ACK in one batch. A hold that
// started keeps its deadline, so a stream of messages cannot postpone it.
void RcQueuePair::queue_ack(std::uint32_t psn, AckTiming timing) {
  if (!responses_.empty() && responses_.back().kind == Response::Kind::ack) {
    responses_.back().psn = psn;
    responses_.back().msn = msn_;
  } else {
    responses_.push_back(Response{.kind = Response::Kind::ack, .psn = psn, .msn = msn_});
  }
  const bool hold = timing == AckTiming::may_wait_for_reply && alternating_ &&
                    params_.ack_delay > Duration::zero() && responses_.size() == 1;
  if (hold) {
    // Requests keep counting towards kAckCoalesceBound until an ACK really leaves.
    if (!ack_hold_until_) {
      ack_hold_until_ = now_ + params_.ack_delay;
      ack_riding_ = false;
    }
    return;
  }
  ack_hold_until_.reset();
  unacked_requests_ = 0;
  unacked_before_message_ = 0;
}

bool RcQueuePair::ack_held() const {
  return ack_hold_until_ && responses_.size() == 1 && responses_.front().kind == Response::Kind::ack;
}

// §2.7: an RNR NAK with our timer; the packet is dropped and ePSN stays, so that its resend
// finds the message where it was.
void RcQueuePair::queue_rnr_nak(std::uint32_t psn) {
  ++stats_.rnr_naks_sent;
  responses_.push_back(Response{.kind = Response::Kind::rnr_nak, .psn = psn, .msn = msn_, .value = params_.min_rnr_timer});
}

void RcQueuePair::queue_nak(w::NakCode code, std::uint32_t psn) {
  responses_.push_back(
      Response{.kind = Response::Kind::nak, .psn = psn, .msn = msn_, .value = static_cast<std::uint8_t>(code)});
}

// §2.7: invalid-request, access and operational errors NAK the request and move the QP to
// ERROR; the receive in use completes with its status, the rest flush.
void RcQueuePair::responder_error(RcErrorCause cause, w::NakCode code, std::uint32_t psn,
                                  std::optional<WcStatus> recv_status) {
  if (recv_taken_ && recv_status) {
    push_recv_completion(WorkCompletion{.wr_id = recv_taken_->wr.wr_id,
                                        .status = *recv_status,
                                        .opcode = WcOpcode::recv,
                                        .qp_num = params_.local_qpn},
                         false);
    recv_taken_.reset();
  }
  queue_nak(code, psn);
  enter_error(RcEvent{cause, psn, 0, false});
}

bool RcQueuePair::next_response(TxPlan& plan) {
  while (!responses_.empty()) {
    Response& r = responses_.front();
    plan = TxPlan{};
    w::PacketHeaders& h = plan.headers;
    h.bth.destination_qp = params_.remote_qpn;
    h.bth.psn = r.psn;
    switch (r.kind) {
      case Response::Kind::ack:
        h.bth.opcode = w::Opcode::rc_acknowledge;
        // §2.6: no end-to-end credits (code 31), as rxe.
        h.aeth = w::Aeth::ack(w::kNoCreditInformation, r.msn);
        ++stats_.acks_sent;
        responses_.pop_front();
        // The last response queued is moved forward to every request since (queue_ack): it
        // acknowledges them all, a held one included, so the bound counts from here.
        if (responses_.empty()) unacked_requests_ = unacked_before_message_ = 0;
        return true;
      case Response::Kind::nak:
        h.bth.opcode = w::Opcode::rc_acknowledge;
        h.aeth = w::Aeth::nak(static_cast<w::NakCode>(r.value), r.msn);
        responses_.pop_front();
        return true;
      case Response::Kind::rnr_nak:
        h.bth.opcode = w::Opcode::rc_acknowledge;
        h.aeth = w::Aeth::rnr_nak(r.value, r.msn);
        responses_.pop_front();
        return true;
      case Response::Kind::read: break;
    }
    const std::uint32_t index = w::psn_distance(r.read_first, r.psn);
    const std::uint64_t offset = std::uint64_t{index} * pmtu_;
    const auto length = static_cast<std::uint32_t>(std::min<std::uint64_t>(pmtu_, r.reth.dma_length - offset));
    // The region may have gone since the READ was checked: its responses are not sent,
    // and the requester's retries end in retry-exceeded.
    if (memory_.check_remote(r.reth.r_key, config_.pd, r.reth.virtual_address + offset, length,
                             MemoryTable::Direction::read_source)) {
      if (r.new_read) --pending_new_reads_;
      responses_.pop_front();
      continue;
    }
    // §2.9: FIRST/MIDDLE.../LAST or ONLY counted from the PSN this execution started at;
    // FIRST/LAST/ONLY carry an AETH.
    const std::uint32_t count = w::psn_distance(r.read_start, r.read_end);
    const std::uint32_t at = w::psn_distance(r.read_start, r.psn);
    if (count == 1)
      h.bth.opcode = w::Opcode::rc_rdma_read_response_only;
    else if (at == 0)
      h.bth.opcode = w::Opcode::rc_rdma_read_response_first;
    else if (at + 1 == count)
      h.bth.opcode = w::Opcode::rc_rdma_read_response_last;
    else
      h.bth.opcode = w::Opcode::rc_rdma_read_response_middle;
    h.aeth = w::Aeth::ack(w::kNoCreditInformation, msn_);
    plan.contiguous = detail::memory_at(r.reth.virtual_address);
    plan.offset = offset;
    plan.length = length;
    r.psn = w::psn_next(r.psn);
    if (r.psn == r.read_end) {
      if (r.new_read) --pending_new_reads_;
      responses_.pop_front();
    }
    return true;
  }
  return false;
}

}  // namespace peercm::core::roce
