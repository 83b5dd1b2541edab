// Receive path of the queue-pair engine: FPDUs in (RFC 5044 §4), DDP sink checks before any
// byte is placed (RFC 5041 §7, RFC 5040 §7.2), placement into registered memory, delivery
// of Sends, Read Responses, Read Requests and Terminates in stream order.
//
// CRC off: a segment is checked at its header and its payload placed as it arrives, also
// straight from the socket (receive_target / handle_placed). CRC on: nothing is checked or
// placed before the FPDU's CRC verified (RFC 5044 §7.2). The payload waits where it was
// read as long as the caller's buffer holds it, and is placed from there; only the part of
// an FPDU that a read cut off is copied aside (staged) until the rest arrives.
//
// The common FPDU of a running stream (a whole single-segment Send or a Write's last segment)
// takes a shorter way, header prediction (take_predicted_fpdu); every other FPDU goes through
// the decoder and the segment life cycle, which stay the reference for both.
#include <algorithm>
#include <cstring>
#include <utility>

#include "core/qp_memory.hpp"
#include "core/queue_pair_engine.hpp"
#include "wire/byte_io.hpp"

namespace peercm::core {
namespace {

using wire::RdmapOpcode;
using wire::TerminateCode;
using wire::TerminateLayer;

constexpr TerminateCode ddp_untagged(std::uint8_t code) { return {TerminateLayer::ddp, 0x2, code}; }
constexpr TerminateCode ddp_tagged(std::uint8_t code) { return {TerminateLayer::ddp, 0x1, code}; }
constexpr TerminateCode rdmap_operation(std::uint8_t code) { return {TerminateLayer::rdmap, 0x2, code}; }

}  // namespace

// ---------------------------------------------------------------- stream input

std::size_t QueuePairEngine::handle_bytes(std::span<const std::uint8_t> bytes) {
  if (!connected_ || rx_dead_) return 0;
  std::size_t used = 0;
  while (used < bytes.size() && !rx_dead_ && !cq_overrun_) {
    const auto rest = bytes.subspan(used);
    if (const std::size_t taken = take_predicted_fpdu(rest)) {
      used += taken;
      continue;
    }
    const bool in_header = !raw_complete_;
    std::size_t consumed = 0;
    const wire::FpduEvent event = decoder_->next(rest, consumed);
    if (in_header) capture_raw(rest.first(consumed));
    if (in_header && event.kind == wire::FpduEvent::Kind::error && raw_filled_ >= wire::kUlpduLengthSize) {
      // The Terminate copies the rejected header too (RFC 5040 §7.1, iwarp-wire.md §3.8):
      // keep what the input holds of this ULPDU, not only the bytes the decoder looked at.
      const std::size_t ulpdu_end = wire::kUlpduLengthSize + wire::load_be16(raw_.data());
      if (ulpdu_end > raw_filled_)
        capture_raw(rest.subspan(consumed).first(std::min(rest.size() - consumed, ulpdu_end - raw_filled_)));
    }
    used += consumed;
    switch (event.kind) {
      case wire::FpduEvent::Kind::need_more:
        if (consumed == 0) used = bytes.size();  // cannot happen; never spin
        break;
      case wire::FpduEvent::Kind::header:
        raw_complete_ = true;
        on_segment_header(*event.header, event.payload_length);
        break;
      case wire::FpduEvent::Kind::payload:
        on_segment_payload(event.payload);
        break;
      case wire::FpduEvent::Kind::end:
        on_segment_end();
        raw_filled_ = 0;
        raw_complete_ = false;
        break;
      case wire::FpduEvent::Kind::whole:
        // The three events above from one decoder call, as most small FPDUs arrive.
        on_segment_header(*event.header, event.payload_length);
        if (rx_dead_) break;
        if (!event.payload.empty()) on_segment_payload(event.payload);
        on_segment_end();
        raw_filled_ = 0;
        break;
      case wire::FpduEvent::Kind::error:
        on_decode_error(event.error);
        break;
    }
  }
  // The caller's buffer is reused once this returns: keep what is still unchecked.
  if (rx_dead_) unchecked_ = {};
  stage_unchecked_payload();
  after_input();
  return used;
}

// Header prediction, as TCP's: while a stream runs, most FPDUs are a whole single-segment
// Send of the next MSN, or the last segment of a Write. One found whole at the start of `in`,
// its PAD and CRC right, is checked and delivered here in one step. Any other FPDU, or one
// whose fields ask for anything but the plain case, is left to the decoder and the segment
// life cycle below, which treat it alike and report its errors. Returns the bytes taken.
std::size_t QueuePairEngine::take_predicted_fpdu(std::span<const std::uint8_t> in) {
  if (state_ != QpState::rts || !first_fpdu_seen_ || recv_taken_ || !decoder_->at_fpdu_start() ||
      in.size() < wire::kUlpduLengthSize + wire::kUntaggedHeaderSize)
    return 0;
  const std::uint8_t* fpdu = in.data();
  const std::size_t ulpdu_length = wire::load_be16(fpdu);  // at most 0xFFFF, the decoder's limit too
  const std::size_t size = wire::fpdu_wire_size(ulpdu_length);
  if (size > in.size()) return 0;
  const std::uint8_t* header = fpdu + wire::kUlpduLengthSize;
  const std::uint16_t control = wire::load_be16(header);
  const bool send = control == wire::segment_control_bytes(RdmapOpcode::send, true);
  if (!send && control != wire::segment_control_bytes(RdmapOpcode::rdma_write, true)) return 0;
  // Checked before any field is trusted: RFC 5044 §7.2 places nothing of an FPDU whose CRC
  // fails (the decoded path then reports it).
  if (!wire::fpdu_trailer_valid(in.first(size), ulpdu_length, params_.crc)) return 0;
  if (send) {
    // RFC 5041 §5.3 fields: QN 0, the next MSN, MO 0 (a single-segment message).
    if (ulpdu_length < wire::kUntaggedHeaderSize || wire::load_be32(header + 6) != wire::kQueueSend ||
        wire::load_be32(header + 10) != expected_send_msn_ || wire::load_be32(header + 14) != 0)
      return 0;
    const std::size_t length = ulpdu_length - wire::kUntaggedHeaderSize;
    const PostedRecv* next = receive_source_->next();
    if (!next || length > next->capacity) return 0;
    recv_taken_ = receive_source_->take();
    rx_.kind = RxKind::send;
    rx_.recv = &*recv_taken_;
    rx_.sge_index = 0;
    rx_.sge_offset = 0;
    rx_.placed = 0;
    place(std::span(header + wire::kUntaggedHeaderSize, length));
    count_valid_segment(length, true);
    deliver_send(RdmapOpcode::send, 0, length);
  } else {
    // RFC 5041 §7.2 / RFC 5040 §7.2: the sink checks of handle_tagged_segment().
    if (ulpdu_length < wire::kTaggedHeaderSize) return 0;
    const std::size_t length = ulpdu_length - wire::kTaggedHeaderSize;
    const std::uint32_t stag = wire::load_be32(header + 2);
    const std::uint64_t offset = wire::load_be64(header + 6);
    if (length > 0 &&
        memory_.check_remote(stag, config_.pd, offset, length, MemoryTable::Direction::write_sink).has_value())
      return 0;
    rx_.kind = RxKind::write;
    rx_.tagged_target = detail::memory_at(offset);
    rx_.placed = 0;
    place(std::span(header + wire::kTaggedHeaderSize, length));
    count_valid_segment(length, true);
    memory_.note_remote_write_landed();
  }
  release_segment_targets();
  ++stats_.fpdus_predicted;
  return size;
}

// The offending segment's headers, kept for the Terminate (RFC 5040 §4.8).
void QueuePairEngine::capture_raw(std::span<const std::uint8_t> bytes) {
  const std::size_t n = std::min(bytes.size(), raw_.size() - raw_filled_);
  if (n > 0) std::memcpy(raw_.data() + raw_filled_, bytes.data(), n);
  raw_filled_ += n;
}

std::span<std::uint8_t> QueuePairEngine::receive_target() {
  if (!connected_ || rx_dead_ || params_.crc || !decoder_->in_payload()) return {};
  const std::size_t remaining = decoder_->payload_remaining();
  switch (rx_.kind) {
    case RxKind::write:
    case RxKind::read_response:
      if (!rx_.tagged_target) return {};
      return {rx_.tagged_target + rx_.placed, remaining};
    case RxKind::send: {
      const auto run = send_run();
      return run.first(std::min(run.size(), remaining));
    }
    default:
      return {};
  }
}

void QueuePairEngine::handle_placed(std::size_t n) {
  const auto target = receive_target();
  n = std::min(n, target.size());
  if (n == 0) return;
  decoder_->payload_placed(target.first(n));
  if (rx_.kind == RxKind::send) advance_send_cursor(n);
  rx_.placed += n;
  stats_.bytes_placed += n;
  after_input();
}

// ---------------------------------------------------------------- segment life cycle

namespace {
constexpr std::size_t kKeptStaging = 4096;  // small segments reuse their buffer
}  // namespace

void QueuePairEngine::on_segment_header(const wire::SegmentHeader& header, std::size_t payload_length) {
  rx_ = RxSegment{.header = header, .length = payload_length};
  staged_ = 0;
  unchecked_ = {};
  if (params_.crc) return;  // checked once the CRC is verified (on_segment_end)
  begin_segment(rx_.header, payload_length);
}

void QueuePairEngine::on_segment_payload(std::span<const std::uint8_t> payload) {
  if (!params_.crc) {
    place(payload);
    return;
  }
  // The decoder hands out consecutive slices of one input buffer: one span covers them.
  if (!unchecked_.empty() && unchecked_.data() + unchecked_.size() == payload.data()) {
    unchecked_ = std::span<const std::uint8_t>(unchecked_.data(), unchecked_.size() + payload.size());
    return;
  }
  stage_unchecked_payload();
  unchecked_ = payload;
}

void QueuePairEngine::stage_unchecked_payload() {
  if (unchecked_.empty()) return;
  if (staging_capacity_ < rx_.length) {
    staging_.reset(new std::uint8_t[rx_.length]);  // no zero fill: every byte is written first
    staging_capacity_ = rx_.length;
  }
  const std::size_t n = std::min(unchecked_.size(), staging_capacity_ - staged_);
  std::memcpy(staging_.get() + staged_, unchecked_.data(), n);
  staged_ += n;
  unchecked_ = {};
}

void QueuePairEngine::on_segment_end() {
  if (params_.crc) {
    const std::span<const std::uint8_t> unstaged = std::exchange(unchecked_, {});
    if (!begin_segment(rx_.header, rx_.length)) return;
    // Staged bytes came first in the stream, then those still in the input buffer.
    if (staged_ > 0) place(std::span<const std::uint8_t>(staging_.get(), staged_));
    place(unstaged);
    if (staging_capacity_ > kKeptStaging) {
      staging_.reset();
      staging_capacity_ = 0;
    }
  }
  count_valid_segment(rx_.length, rx_.header.last);
  const wire::SegmentHeader& header = rx_.header;
  switch (rx_.kind) {
    case RxKind::read_response:
      if (header.last) complete_read();
      break;
    case RxKind::send:
      if (header.last) deliver_send(header.opcode, header.invalidate_stag, header.message_offset + rx_.length);
      break;
    case RxKind::write:
      if (header.last) memory_.note_remote_write_landed();
      break;
    case RxKind::rtr_send:
      ++expected_send_msn_;  // the Send RTR used MSN n; no receive consumed, no completion
      break;
    case RxKind::read_request:
      // RFC 5040 §5.2: answered in arrival order, after everything that came before it.
      inbound_reads_.push_back(InboundRead{.request = header.read_request});
      ++expected_read_msn_;
      break;
    case RxKind::terminate:
      handle_terminate(header);
      return;
    case RxKind::none:
    case RxKind::rtr_write:
      break;
  }
  if (state_ != QpState::error) release_segment_targets();
}

// Nothing points into the finished segment's receive or target any more; the next header
// sets the rest.
void QueuePairEngine::release_segment_targets() {
  rx_.kind = RxKind::none;
  rx_.recv = nullptr;
  rx_.tagged_target = nullptr;
}

void QueuePairEngine::count_valid_segment(std::size_t length, bool last) {
  ++stats_.fpdus_received;
  first_fpdu_seen_ = true;
  message_largest_segment_ = std::max(message_largest_segment_, length);
  if (last) last_message_largest_segment_ = std::exchange(message_largest_segment_, 0);
  tx_fenced_ = false;  // RFC 5044 §7.1.2 rule 4: a valid FPDU arrived, the responder may send
}

// Validates a segment before any byte of it is placed and sets up its placement.
bool QueuePairEngine::begin_segment(const wire::SegmentHeader& header, std::size_t payload_length) {
  if (params_.expect_rtr != RtrType::none && !first_fpdu_seen_ && header.opcode != RdmapOpcode::terminate)
    return check_rtr(header, payload_length);
  switch (header.opcode) {
    case RdmapOpcode::rdma_write:
      return handle_tagged_segment(header, payload_length);
    case RdmapOpcode::read_response:
      return handle_read_response_segment(header, payload_length);
    case RdmapOpcode::send:
    case RdmapOpcode::send_invalidate:
    case RdmapOpcode::send_solicited:
    case RdmapOpcode::send_solicited_invalidate:
      return handle_send_segment(header, payload_length);
    case RdmapOpcode::read_request:
      return handle_read_request(header);
    case RdmapOpcode::terminate:
      rx_.kind = RxKind::terminate;
      return true;
  }
  terminate_inbound(rdmap_operation(0x06));
  return false;
}

// RFC 6581 §9.3 / iwarp-wire.md §4.5: the responder's first FPDU must be the negotiated
// RTR; it is absorbed without a completion and without consuming a posted receive.
bool QueuePairEngine::check_rtr(const wire::SegmentHeader& header, std::size_t payload_length) {
  bool ok = false;
  switch (params_.expect_rtr) {
    case RtrType::write:
      ok = header.opcode == RdmapOpcode::rdma_write && header.last && payload_length == 0;
      break;
    case RtrType::read:
      ok = header.opcode == RdmapOpcode::read_request && header.read_request.size == 0;
      break;
    case RtrType::send:
      ok = header.opcode == RdmapOpcode::send && header.last && payload_length == 0 && header.message_offset == 0;
      break;
    case RtrType::none:
      ok = true;
      break;
  }
  if (!ok) {
    terminate_inbound(TerminateCode{TerminateLayer::llp, 0x0, 0x07});  // RFC 6581 §8: no matching RTR
    return false;
  }
  switch (params_.expect_rtr) {
    case RtrType::read:
      return handle_read_request(header);  // answered with a zero-length Read Response
    case RtrType::send:
      if (header.msn != expected_send_msn_) {
        terminate_inbound(ddp_untagged(0x03));
        return false;
      }
      rx_.kind = RxKind::rtr_send;
      return true;
    case RtrType::write:
    case RtrType::none:
      break;
  }
  rx_.kind = RxKind::rtr_write;  // zero-length tagged: STag and TO are never checked
  return true;
}

// RFC 5041 §7.2 tagged sink checks (STag valid, same stream/PD, bounds, wrap) and RFC 5040
// §7.2 access rights, for non-zero-length segments only (RFC 5041 §5.4).
bool QueuePairEngine::handle_tagged_segment(const wire::SegmentHeader& header, std::size_t payload_length) {
  rx_.kind = RxKind::write;
  if (payload_length == 0) return true;
  if (auto error = memory_.check_remote(header.stag, config_.pd, header.tagged_offset, payload_length,
                                        MemoryTable::Direction::write_sink)) {
    terminate_inbound(*error);
    return false;
  }
  rx_.tagged_target = detail::memory_at(header.tagged_offset);
  return true;
}

// RFC 5040 §5.2: a Read Response is a tagged write into our sink (iWARP sinks carry remote
// write access); it must also fall inside the oldest outstanding Read's sink.
bool QueuePairEngine::handle_read_response_segment(const wire::SegmentHeader& header, std::size_t payload_length) {
  rx_.kind = RxKind::read_response;
  if (outbound_reads_.empty()) {
    terminate_inbound(rdmap_operation(0x06));  // a Read Response nobody asked for
    return false;
  }
  if (payload_length == 0) return true;
  if (auto error = memory_.check_remote(header.stag, config_.pd, header.tagged_offset, payload_length,
                                        MemoryTable::Direction::write_sink)) {
    terminate_inbound(*error);
    return false;
  }
  const OutboundRead& read = outbound_reads_.front();
  if (header.stag != read.sink_stag) {
    terminate_inbound(ddp_tagged(0x00));
    return false;
  }
  if (header.tagged_offset < read.sink_offset || header.tagged_offset - read.sink_offset + payload_length > read.size) {
    terminate_inbound(ddp_tagged(0x01));
    return false;
  }
  rx_.tagged_target = detail::memory_at(header.tagged_offset);
  return true;
}

// RFC 5041 §7.2 untagged sink checks for QN 0: the next MSN, a posted buffer (RFC 5040
// §5.3: a Send without a posted receive is an error; an empty SRQ is no different), MO and
// length inside it.
bool QueuePairEngine::handle_send_segment(const wire::SegmentHeader& header, std::size_t payload_length) {
  rx_.kind = RxKind::send;
  if (header.msn != expected_send_msn_) {
    terminate_inbound(ddp_untagged(0x03));  // MSN range not valid
    return false;
  }
  const PostedRecv* next = recv_taken_ ? &*recv_taken_ : receive_source_->next();
  if (!next) {
    terminate_inbound(ddp_untagged(0x02));  // MSN: no buffer
    return false;
  }
  if (header.message_offset > next->capacity) {
    terminate_inbound(ddp_untagged(0x04));  // invalid MO
    return false;
  }
  if (header.message_offset + std::uint64_t{payload_length} > next->capacity) {
    terminate_inbound(ddp_untagged(0x05));  // message too long for the buffer
    return false;
  }
  // The message owns its receive from its first segment on: other QPs draw from an SRQ
  // between this message's segments.
  if (!recv_taken_) recv_taken_ = receive_source_->take();
  PostedRecv& recv = *recv_taken_;
  rx_.recv = &recv;
  // Scatter cursor at MO.
  std::uint64_t offset = header.message_offset;
  std::size_t index = 0;
  while (index < recv.wr.sg_list.size() && offset >= recv.wr.sg_list[index].length) {
    offset -= recv.wr.sg_list[index].length;
    ++index;
  }
  rx_.sge_index = index;
  rx_.sge_offset = offset;
  return true;
}

// RFC 5040 §6.1 IRD, RFC 5041 §7.2 QN 1 MSN, RFC 5040 §7.2 source checks (non-zero size
// only, §5.2). A valid request is queued for its Read Response at the end of the FPDU.
bool QueuePairEngine::handle_read_request(const wire::SegmentHeader& header) {
  rx_.kind = RxKind::read_request;
  if (inbound_reads_.size() >= params_.ird) {
    terminate_inbound(ddp_untagged(0x02));  // iwarp-wire.md §3.7: no QN 1 buffer
    return false;
  }
  if (header.msn != expected_read_msn_) {
    terminate_inbound(ddp_untagged(0x03));
    return false;
  }
  const wire::ReadRequestHeader& request = header.read_request;
  if (request.size > 0) {
    if (auto error = memory_.check_remote(request.source_stag, config_.pd, request.source_offset, request.size,
                                          MemoryTable::Direction::read_source)) {
      terminate_inbound(*error);
      return false;
    }
  }
  return true;
}

// ---------------------------------------------------------------- placement

std::span<std::uint8_t> QueuePairEngine::send_run() {
  const SgeList& sges = rx_.recv->wr.sg_list;
  while (rx_.sge_index < sges.size() && rx_.sge_offset == sges[rx_.sge_index].length) {
    ++rx_.sge_index;
    rx_.sge_offset = 0;
  }
  if (rx_.sge_index == sges.size()) return {};
  const Sge& sge = sges[rx_.sge_index];
  return {detail::memory_at(sge.addr + rx_.sge_offset), static_cast<std::size_t>(sge.length - rx_.sge_offset)};
}

void QueuePairEngine::advance_send_cursor(std::size_t n) { rx_.sge_offset += n; }

void QueuePairEngine::place(std::span<const std::uint8_t> bytes) {
  if (bytes.empty()) return;
  switch (rx_.kind) {
    case RxKind::write:
    case RxKind::read_response:
      if (!rx_.tagged_target) return;
      std::memcpy(rx_.tagged_target + rx_.placed, bytes.data(), bytes.size());
      break;
    case RxKind::send: {
      // Scatter across the receive's SGEs (bounds checked in handle_send_segment).
      auto rest = bytes;
      while (!rest.empty()) {
        const auto run = send_run();
        if (run.empty()) return;
        const std::size_t n = std::min(run.size(), rest.size());
        std::memcpy(run.data(), rest.data(), n);
        advance_send_cursor(n);
        rest = rest.subspan(n);
      }
      break;
    }
    default:
      return;
  }
  rx_.placed += bytes.size();
  stats_.bytes_placed += bytes.size();
}

// ---------------------------------------------------------------- delivery

// RFC 5040 §5.3 / RFC 5041 §5.4: the message is delivered when its L segment arrived;
// length = MO + payload of that segment. Send with Invalidate invalidates first.
void QueuePairEngine::deliver_send(RdmapOpcode opcode, std::uint32_t invalidate_stag, std::uint64_t length) {
  const PostedRecv& recv = *recv_taken_;
  WorkCompletion wc;
  wc.wr_id = recv.wr.wr_id;
  wc.status = WcStatus::success;
  wc.opcode = WcOpcode::recv;
  wc.byte_len = static_cast<std::uint32_t>(length);
  wc.qp_num = config_.qp_num;
  if (wire::carries_invalidate(opcode)) {
    if (auto error = memory_.invalidate(invalidate_stag, config_.pd)) {
      terminate_inbound(*error);  // 0x0/0x1/0x09 STag cannot be invalidated
      return;
    }
    wc.wc_flags |= kWcWithInvalidate;
    wc.invalidated_rkey = invalidate_stag;
  }
  const bool solicited = wire::is_solicited(opcode);
  if (solicited) wc.wc_flags |= kWcSolicited;
  recv_taken_.reset();
  rx_.recv = nullptr;
  ++expected_send_msn_;
  push_recv_completion(wc, solicited);
}

// RFC 5040 §5.5: the Read completes when its Read Response was delivered; the RTR Read
// completes nothing visible.
void QueuePairEngine::complete_read() {
  const OutboundRead read = outbound_reads_.front();
  outbound_reads_.pop_front();
  if (!read.rtr && read.seq >= sq_base_ && read.seq < sq_base_ + sq_.size()) {
    SendEntry& entry = sq_[read.seq - sq_base_];
    entry.phase = SendEntry::Phase::done;
  }
  complete_ready_sends();
}

// RFC 5040 §6.2: a Terminate from the peer ends the stream; we send nothing more.
void QueuePairEngine::handle_terminate(const wire::SegmentHeader& header) {
  events_.push_back(QpEvent{.kind = QpEvent::Kind::terminate_received, .code = header.terminate.code});
  enter_error();
}

}  // namespace peercm::core
