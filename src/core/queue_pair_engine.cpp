// Queue-pair engine: verbs inputs (post_send / post_recv), connection life cycle, state,
// events and completions. The transmit path is in qp_transmit.cpp, the receive path in
// qp_receive.cpp, Terminate generation in qp_terminate.cpp.
#include <algorithm>
#include <cstring>

#include "core/qp_memory.hpp"
#include "core/queue_pair_engine.hpp"

namespace peercm::core {
namespace {

WcOpcode wc_opcode(WrOpcode op) {
  switch (op) {
    case WrOpcode::rdma_write: return WcOpcode::rdma_write;
    case WrOpcode::rdma_read: return WcOpcode::rdma_read;
    case WrOpcode::send:
    case WrOpcode::send_with_invalidate:
    case WrOpcode::send_with_imm: break;
    case WrOpcode::rdma_write_with_imm: return WcOpcode::rdma_write;  // refused by post_send
  }
  return WcOpcode::send;
}

}  // namespace

QueuePairEngine::QueuePairEngine(const QpConfig& config, MemoryTable& memory, CompletionSink& send_cq,
                                 CompletionSink& recv_cq)
    : config_(config),
      memory_(memory),
      send_cq_(send_cq),
      recv_cq_(recv_cq),
      receive_source_(config.srq ? config.srq : &rq_) {
  // Slots come into being as the ring first reaches them (ring_at): creating a QP, which
  // connection setup does N times, allocates and touches only the table of 64 pointers.
}

// ---------------------------------------------------------------- verbs inputs

Status<std::errc> QueuePairEngine::check_send_wr(const SendWr& wr, std::uint64_t& length) const {
  if (wr.sg_list.size() > config_.caps.max_send_sge) return fail(std::errc::invalid_argument);
  // RFC 5040 has no immediate data: refused rather than sent as a plain Send or Write.
  if (wr.opcode == WrOpcode::send_with_imm || wr.opcode == WrOpcode::rdma_write_with_imm)
    return fail(std::errc::invalid_argument);
  const bool is_inline = wr.flags & kSendInline;
  if (wr.opcode == WrOpcode::rdma_read) {
    // An iWARP Read has exactly one sink buffer (RFC 5040 §4.4: one Data Sink STag/TO).
    if (wr.sg_list.size() != 1 || is_inline) return fail(std::errc::invalid_argument);
  }
  length = 0;
  for (const Sge& sge : wr.sg_list) length += sge.length;
  // RFC 5041 §5.4: a ULP message is shorter than 2^32 bytes.
  if (length > 0xFFFFFFFFu) return fail(std::errc::invalid_argument);
  if (is_inline && length > config_.caps.max_inline_data) return fail(std::errc::invalid_argument);
  return {};
}

Status<std::errc> QueuePairEngine::post_send(const SendWr& wr) {
  std::uint64_t length = 0;
  if (auto ok = check_send_wr(wr, length); !ok) return ok;
  const bool signaled = config_.signal_all || (wr.flags & kSendSignaled);
  if (state_ == QpState::error) {
    SendEntry flushed{.wr = wr, .length = length, .status = WcStatus::wr_flush_error};
    push_send_completion(completion_for(flushed));
    after_input();
    return {};
  }
  if (sq_.size() >= config_.caps.max_send_wr) return fail(std::errc::not_enough_memory);

  SendEntry& entry = sq_.emplace_back(wr);
  entry.length = length;
  entry.signaled = signaled;
  bool local_ok = true;
  if (wr.flags & kSendInline) {
    // The payload is copied now; the SGEs' lkeys are ignored (verbs IBV_SEND_INLINE).
    entry.inline_data.resize(length);
    std::size_t at = 0;
    for (const Sge& sge : wr.sg_list) {
      if (sge.length == 0) continue;
      std::memcpy(entry.inline_data.data() + at, detail::memory_at(sge.addr), sge.length);
      at += sge.length;
    }
  } else {
    const bool needs_write = wr.opcode == WrOpcode::rdma_read;  // the Read sink is written locally
    for (const Sge& sge : wr.sg_list) local_ok = local_ok && memory_.check_local(sge, config_.pd, needs_write);
  }
  if (!local_ok) {
    // verbs: a bad local SGE completes the WR in error and moves the QP to ERROR; the
    // stream ends with a local-catastrophic Terminate (RFC 5040 §7.1: error while building).
    entry.phase = SendEntry::Phase::done;
    entry.status = WcStatus::local_protection_error;
    send_terminate(wire::TerminateHeader{.code = {wire::TerminateLayer::rdmap, 0x0, 0x00}});
  }
  after_input();
  return {};
}

Status<std::errc> QueuePairEngine::post_recv(const RecvWr& wr) {
  // verbs: a QP with an SRQ has no receive queue of its own.
  if (config_.srq) return fail(std::errc::invalid_argument);
  if (wr.sg_list.size() > config_.caps.max_recv_sge) return fail(std::errc::invalid_argument);
  if (state_ == QpState::error) {
    push_recv_completion(WorkCompletion{.wr_id = wr.wr_id,
                                        .status = WcStatus::wr_flush_error,
                                        .opcode = WcOpcode::recv,
                                        .qp_num = config_.qp_num},
                         false);
    after_input();
    return {};
  }
  if (recv_queue_size() >= config_.caps.max_recv_wr) return fail(std::errc::not_enough_memory);
  const bool local_ok = !rq_.post(wr, memory_, config_.pd).error;
  if (!local_ok) send_terminate(wire::TerminateHeader{.code = {wire::TerminateLayer::rdmap, 0x0, 0x00}});
  after_input();
  return {};
}

void QueuePairEngine::detach_srq() { receive_source_ = &rq_; }

// ---------------------------------------------------------------- connection inputs

void QueuePairEngine::connect(const StreamParams& params) {
  if (connected_) return;
  connected_ = true;
  params_ = params;
  // RFC 5044 §4.5: MULPDU stays within 128..64768.
  mulpdu_ = std::clamp(params.mulpdu, wire::kMinMulpdu, wire::kMaxMulpdu);
  decoder_.emplace(params.crc);
  decoder_->set_whole_events(true);
  if (state_ == QpState::error) {
    // Failed before the stream existed: only the Terminate (if any) goes out.
    if (terminate_ && !terminate_framed_) queue_terminate_fpdu();
    return;
  }
  state_ = QpState::rts;
  tx_fenced_ = params.responder;                       // RFC 5044 §7.1.2 rule 4
  rtr_pending_ = params.send_rtr != RtrType::none;     // RFC 6581 §9.3: the RTR is the first FPDU
  after_input();
}

void QueuePairEngine::handle_peer_closed() {
  if (llp_closed_) return;
  llp_closed_ = true;
  // RFC 5041 §6: after a graceful close by the peer nothing more may arrive.
  events_.push_back(QpEvent{.kind = QpEvent::Kind::peer_closed});
  enter_error();
}

void QueuePairEngine::handle_connection_lost() {
  const bool report = !llp_closed_;
  llp_closed_ = true;
  if (report) events_.push_back(QpEvent{.kind = QpEvent::Kind::connection_lost});
  enter_error();
  // The socket is gone: nothing more can be written, not even the rest of an FPDU.
  ring_count_ = 0;
  ring_unsent_ = 0;
  terminate_framed_ = true;
}

void QueuePairEngine::disconnect() { enter_error(); }

void QueuePairEngine::terminate(wire::TerminateCode code) {
  send_terminate(wire::TerminateHeader{.code = code});
  after_input();
}

// ---------------------------------------------------------------- outputs

std::optional<QpEvent> QueuePairEngine::poll_event() {
  if (events_.empty()) return std::nullopt;
  QpEvent event = events_.front();
  events_.pop_front();
  return event;
}

QpState QueuePairEngine::state() const { return state_; }

const QpStats& QueuePairEngine::stats() const { return stats_; }

// ---------------------------------------------------------------- errors and flushing

// Verbs ERROR state (RFC 5040 §6.2, iwarp-wire.md §3.10): stop receiving, stop framing new
// FPDUs (the one on the wire is finished), complete everything outstanding in error.
void QueuePairEngine::enter_error() {
  if (state_ == QpState::error) return;
  state_ = QpState::error;
  rx_dead_ = true;
  stop_transmit();
  flush_all();
}

WorkCompletion QueuePairEngine::completion_for(const SendWr& wr, std::uint64_t length, WcStatus status) const {
  WorkCompletion wc;
  wc.wr_id = wr.wr_id;
  wc.status = status;
  wc.opcode = wc_opcode(wr.opcode);
  wc.byte_len = status == WcStatus::success ? static_cast<std::uint32_t>(length) : 0;
  wc.qp_num = config_.qp_num;
  return wc;
}

WorkCompletion QueuePairEngine::completion_for(const SendEntry& entry) const {
  return completion_for(entry.wr, entry.length, entry.status);
}

// Every outstanding WR completes exactly once, in submission order: those already done
// with their own status, the others with a flush error.
void QueuePairEngine::flush_all() {
  flushing_ = true;
  for (SendEntry& entry : sq_) {
    if (entry.phase != SendEntry::Phase::done) {
      entry.status = WcStatus::wr_flush_error;
      entry.phase = SendEntry::Phase::done;
    }
  }
  complete_ready_sends();
  sq_next_ = sq_base_;
  outbound_reads_.clear();
  inbound_base_ += inbound_reads_.size();
  inbound_reads_.clear();
  inbound_next_ = inbound_base_;
  rx_ = RxSegment{};
  // The receive of the message in progress was posted before everything still in rq_. An
  // SRQ keeps its WRs: they were never this QP's.
  if (recv_taken_) flush_recv(*recv_taken_);
  recv_taken_.reset();
  while (!rq_.empty()) flush_recv(rq_.take());
  flushing_ = false;
}

void QueuePairEngine::flush_recv(const PostedRecv& posted) {
  push_recv_completion(WorkCompletion{.wr_id = posted.wr.wr_id,
                                      .status = posted.error.value_or(WcStatus::wr_flush_error),
                                      .opcode = WcOpcode::recv,
                                      .qp_num = config_.qp_num},
                       false);
}

void QueuePairEngine::push_send_completion(const WorkCompletion& wc) {
  if (!send_cq_.push(wc) && !flushing_) cq_overrun_ = true;
}

void QueuePairEngine::push_recv_completion(const WorkCompletion& wc, bool solicited) {
  if (!recv_cq_.push(wc)) {
    if (!flushing_) cq_overrun_ = true;
    return;
  }
  if (solicited) recv_cq_.solicited();
}

// A CQ overrun is a local catastrophic error (verbs IBV_EVENT_CQ_ERR; RFC 5040 §7.1
// Terminate 0x0/0x0). The completion that did not fit is lost; nothing else is.
void QueuePairEngine::after_input() {
  if (!cq_overrun_) return;
  cq_overrun_ = false;
  if (state_ != QpState::error)
    send_terminate(wire::TerminateHeader{.code = {wire::TerminateLayer::rdmap, 0x0, 0x00}});
}

}  // namespace peercm::core
