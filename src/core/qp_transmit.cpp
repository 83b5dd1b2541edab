// Transmit path of the queue-pair engine: schedules outbound messages (RTR, send queue,
// Read Responses), segments them into DDP segments (RFC 5041 §5.4), frames FPDUs around
// payload that stays in registered memory (RFC 5044 §4) and completes Sends and Writes
// once their last byte went to the socket (RFC 5040 §5.5). A small WR posted while nothing
// waits to go out skips the send queue's schedule (direct transmit, frame_direct).
#include <algorithm>
#include <cstring>

#include "core/qp_memory.hpp"
#include "core/queue_pair_engine.hpp"

namespace peercm::core {
namespace {

// Framed ahead of the socket: bounded in FPDUs and bytes, never a whole large message. 1 MiB
// (16 full FPDUs, 49-51 iovecs: one sendmsg) streams 1 MiB messages 5-23 % faster than
// 256 KiB did in order-alternating pairs (docs/performance.md, "Streams").
constexpr std::size_t kTxBudgetBytes = 1024 * 1024;

wire::RdmapOpcode send_opcode(const SendWr& wr) {
  const bool solicited = wr.flags & kSendSolicited;
  if (wr.opcode == WrOpcode::send_with_invalidate)
    return solicited ? wire::RdmapOpcode::send_solicited_invalidate : wire::RdmapOpcode::send_invalidate;
  return solicited ? wire::RdmapOpcode::send_solicited : wire::RdmapOpcode::send;
}

}  // namespace

// ---------------------------------------------------------------- scheduling

// The head of the send queue may start: ORD (RFC 5040 §6.1) and the verbs Fence (wait for
// earlier Reads) hold it, and everything behind it, until Reads complete.
bool QueuePairEngine::send_queue_head_ready() const {
  if (sq_next_ >= sq_base_ + sq_.size()) return false;
  const SendEntry& entry = sq_[sq_next_ - sq_base_];
  if ((entry.wr.flags & kSendFence) && !outbound_reads_.empty()) return false;
  if (entry.wr.opcode == WrOpcode::rdma_read && outbound_reads_.size() >= params_.ord) return false;
  return true;
}

bool QueuePairEngine::message_ready() const {
  if (!connected_ || tx_stopped_) return false;
  if (tx_msg_.owner != TxOwner::none || rtr_pending_) return true;
  if (tx_fenced_) return false;
  return inbound_next_ < inbound_base_ + inbound_reads_.size() || send_queue_head_ready();
}

// Picks the next message at a message boundary: the RTR first (RFC 6581 §9.3), then Read
// Responses (in request order, RFC 5040 §5.5) and our own work alternately, so that
// neither starves the other.
bool QueuePairEngine::start_next_message() {
  if (rtr_pending_) {
    start_rtr();
    return true;
  }
  if (tx_fenced_) return false;  // RFC 5044 §7.1.2 rule 4
  const bool response = inbound_next_ < inbound_base_ + inbound_reads_.size();
  const bool own = send_queue_head_ready();
  if (response && (!own || !last_was_response_)) {
    last_was_response_ = true;
    start_read_response();
    return true;
  }
  if (own) {
    last_was_response_ = false;
    start_send_queue_message();
    return true;
  }
  return false;
}

// The fields every segment of a Send (RFC 5040 §5.3: untagged, QN 0) or a Write (§5.1:
// tagged to the peer's STag) shares; the MSN is the caller's to take.
wire::SegmentHeader QueuePairEngine::message_header(const SendWr& wr) {
  wire::SegmentHeader header;
  if (wr.opcode == WrOpcode::rdma_write) {
    header.opcode = wire::RdmapOpcode::rdma_write;
    header.stag = wr.rkey;
  } else {
    header.opcode = send_opcode(wr);
    header.queue_number = wire::kQueueSend;
    header.invalidate_stag = wr.invalidate_rkey;
  }
  return header;
}

void QueuePairEngine::start_send_queue_message() {
  const std::uint64_t seq = sq_next_++;
  SendEntry& entry = sq_[seq - sq_base_];
  entry.phase = SendEntry::Phase::transmitting;
  tx_msg_ = TxMessage{};
  TxMessage& m = tx_msg_;
  m.owner = TxOwner::send_queue;
  m.seq = seq;
  m.length = entry.length;
  if (entry.wr.flags & kSendInline) m.contiguous = entry.inline_data.data();  // its heap block never moves
  switch (entry.wr.opcode) {
    case WrOpcode::send:
    case WrOpcode::send_with_invalidate:
      m.header = message_header(entry.wr);
      m.header.msn = next_send_msn_++;  // RFC 5041 §5.3: one MSN per message
      break;
    case WrOpcode::rdma_write:
      m.header = message_header(entry.wr);
      m.base_offset = entry.wr.remote_addr;  // RFC 5040 §5.1: TO advancing per segment
      break;
    case WrOpcode::send_with_imm:
    case WrOpcode::rdma_write_with_imm:
      break;  // never queued: check_send_wr refuses immediate data (RFC 5040 has none)
    case WrOpcode::rdma_read: {
      // RFC 5040 §4.4: Read Request on QN 1 naming our sink and the peer's source.
      const Sge& sink = entry.wr.sg_list.front();
      m.header.opcode = wire::RdmapOpcode::read_request;
      m.header.queue_number = wire::kQueueReadRequest;
      m.header.msn = next_read_msn_++;
      m.header.read_request = wire::ReadRequestHeader{.sink_stag = sink.lkey,
                                                      .sink_offset = sink.addr,
                                                      .size = sink.length,
                                                      .source_stag = entry.wr.rkey,
                                                      .source_offset = entry.wr.remote_addr};
      m.length = 0;
      entry.phase = SendEntry::Phase::awaiting_response;
      outbound_reads_.push_back(OutboundRead{.seq = seq, .sink_stag = sink.lkey, .sink_offset = sink.addr,
                                             .size = sink.length, .rtr = false});
      break;
    }
  }
}

// RFC 5040 §5.2: the Read Response is tagged, STag and TO from the request's sink fields,
// payload read from the registered source memory (checked when the request arrived).
void QueuePairEngine::start_read_response() {
  const std::uint64_t seq = inbound_next_++;
  const InboundRead& read = inbound_reads_[seq - inbound_base_];
  TxMessage m;
  m.owner = TxOwner::read_response;
  m.seq = seq;
  m.header.opcode = wire::RdmapOpcode::read_response;
  m.header.stag = read.request.sink_stag;
  m.base_offset = read.request.sink_offset;
  m.length = read.request.size;
  if (m.length > 0) m.contiguous = detail::memory_at(read.request.source_offset);
  tx_msg_ = m;
}

// RFC 6581 §9.3 / iwarp-wire.md §4.5: the RTR the initiator sends as its first FPDU.
void QueuePairEngine::start_rtr() {
  rtr_pending_ = false;
  TxMessage m;
  m.owner = TxOwner::rtr;
  switch (params_.send_rtr) {
    case RtrType::write:
      m.header.opcode = wire::RdmapOpcode::rdma_write;
      m.header.stag = 1;  // free; STag 0 is special to some peers
      break;
    case RtrType::read:
      m.header.opcode = wire::RdmapOpcode::read_request;
      m.header.queue_number = wire::kQueueReadRequest;
      m.header.msn = next_read_msn_++;
      m.header.read_request = wire::ReadRequestHeader{.sink_stag = 0, .source_stag = 1};
      outbound_reads_.push_back(OutboundRead{.rtr = true});  // one ORD slot, like any Read
      break;
    case RtrType::send:
      m.header.opcode = wire::RdmapOpcode::send;
      m.header.queue_number = wire::kQueueSend;
      m.header.msn = next_send_msn_++;
      break;
    case RtrType::none:
      return;
  }
  tx_msg_ = m;
}

// ---------------------------------------------------------------- framing

// One FPDU into the ring's next slot: the prefix for `header`, the `n` payload bytes that
// `gather` hands to its argument piece by piece, the trailer. The payload is not copied: its
// iovecs point at the registered buffers (or the inline copy); only the CRC reads it here.
// False (nothing framed) when the framer refuses the header.
template <typename Gather>
bool QueuePairEngine::frame_into_next_slot(const wire::SegmentHeader& header, std::size_t n, TxOwner owner,
                                           std::uint64_t seq, Gather&& gather) {
  TxSlot& slot = ring_at(ring_count_);
  if (!slot.framer.begin(header, n)) return false;
  slot.pieces.clear();
  const auto prefix = slot.framer.prefix();
  slot.pieces.push_back(detail::make_iovec(prefix.data(), prefix.size()));
  gather([&](const std::uint8_t* data, std::size_t length) {
    slot.pieces.push_back(detail::make_iovec(data, length));
    if (params_.crc) slot.framer.add_payload(std::span(data, length));
  });
  const auto trailer = slot.framer.finish(params_.crc);
  slot.pieces.push_back(detail::make_iovec(trailer.data(), trailer.size()));
  slot.size = prefix.size() + n + trailer.size();
  slot.sent = 0;
  slot.owner = owner;
  slot.seq = seq;
  slot.last = header.last;
  ++ring_count_;
  ring_unsent_ += slot.size;
  return true;
}

// One DDP segment of the current message (RFC 5041 §5.4): at most MULPDU bytes of ULPDU,
// MO/TO advancing, L on the last one only.
void QueuePairEngine::frame_segment() {
  TxMessage& m = tx_msg_;
  wire::SegmentHeader header = m.header;
  const std::size_t header_size = wire::segment_header_size(header);
  const std::uint64_t max_payload = mulpdu_ > header_size ? mulpdu_ - header_size : 1;
  const std::uint64_t left = m.length - m.offset;
  const auto n = static_cast<std::size_t>(std::min(left, max_payload));
  header.last = n == left;
  if (wire::is_tagged(header.opcode))
    header.tagged_offset = m.base_offset + m.offset;
  else if (wire::is_send(header.opcode))
    header.message_offset = static_cast<std::uint32_t>(m.offset);
  const bool framed = frame_into_next_slot(header, n, m.owner, m.seq, [&](auto&& add) {
    if (n == 0) return;
    if (m.contiguous) {
      add(m.contiguous + m.offset, n);
      return;
    }
    const SgeList& sges = sq_[m.seq - sq_base_].wr.sg_list;
    std::size_t want = n;
    while (want > 0) {
      const Sge& sge = sges[m.sge_index];
      const std::uint64_t room = sge.length - m.sge_offset;
      if (room == 0) {
        ++m.sge_index;
        m.sge_offset = 0;
        continue;
      }
      const auto k = static_cast<std::size_t>(std::min<std::uint64_t>(room, want));
      add(detail::memory_at(sge.addr + m.sge_offset), k);
      m.sge_offset += k;
      want -= k;
    }
  });
  if (!framed) {
    // Cannot happen with a clamped MULPDU; treat as a local error while building.
    tx_msg_ = TxMessage{};
    send_terminate(wire::TerminateHeader{.code = {wire::TerminateLayer::rdmap, 0x0, 0x00}});
    return;
  }
  m.offset += n;
  if (header.last) tx_msg_.owner = TxOwner::none;  // the next start_*() resets the rest
}

// A single-FPDU message outside the normal schedule (the Terminate).
void QueuePairEngine::frame_whole(const wire::SegmentHeader& header, TxOwner owner) {
  if (ring_count_ == ring_.size()) return;  // cannot happen: stop_transmit() left at most one
  TxSlot& slot = ring_at(ring_count_);
  if (!slot.framer.begin(header, 0)) return;
  slot.pieces.clear();
  const auto prefix = slot.framer.prefix();
  slot.pieces.push_back(detail::make_iovec(prefix.data(), prefix.size()));
  const auto trailer = slot.framer.finish(params_.crc);
  slot.pieces.push_back(detail::make_iovec(trailer.data(), trailer.size()));
  slot.size = prefix.size() + trailer.size();
  slot.sent = 0;
  slot.owner = owner;
  slot.seq = 0;
  slot.last = true;
  ++ring_count_;
  ring_unsent_ += slot.size;
}

void QueuePairEngine::fill_pipeline() {
  while (connected_ && !tx_stopped_ && ring_count_ < ring_.size() && ring_unsent_ < kTxBudgetBytes) {
    if (tx_msg_.owner == TxOwner::none && !start_next_message()) break;
    if (tx_msg_.owner == TxOwner::none) break;
    frame_segment();
  }
}

std::size_t QueuePairEngine::gather_transmit(std::span<iovec> out) {
  if (!connected_) return 0;
  fill_pipeline();
  std::size_t count = 0;
  for (std::size_t i = 0; i < ring_count_ && count < out.size(); ++i) {
    const TxSlot& slot = ring_at(i);
    std::size_t skip = i == 0 ? slot.sent : 0;
    for (const iovec& piece : slot.pieces) {
      if (count == out.size()) break;
      if (piece.iov_len <= skip) {
        skip -= piece.iov_len;
        continue;
      }
      out[count++] = detail::make_iovec(static_cast<const std::uint8_t*>(piece.iov_base) + skip, piece.iov_len - skip);
      skip = 0;
    }
  }
  return count;
}

void QueuePairEngine::handle_transmitted(std::size_t n) {
  while (n > 0 && ring_count_ > 0) {
    TxSlot& slot = ring_at(0);
    const std::size_t k = std::min(n, slot.size - slot.sent);
    slot.sent += k;
    ring_unsent_ -= k;
    n -= k;
    if (slot.sent < slot.size) break;
    const TxOwner owner = slot.owner;
    const std::uint64_t seq = slot.seq;
    const bool last = slot.last;
    ring_head_ = (ring_head_ + 1) & (kTxSlots - 1);
    --ring_count_;
    ++stats_.fpdus_sent;
    on_message_transmitted(owner, seq, last);
  }
  complete_ready_sends();
  after_input();
}

// RFC 5040 §5.5: a Send or Write is complete once the LLP accepted its last byte; a Read
// only when its Read Response arrived (qp_receive.cpp). A Read Response frees its IRD slot.
void QueuePairEngine::on_message_transmitted(TxOwner owner, std::uint64_t seq, bool last) {
  if (!last) return;
  switch (owner) {
    case TxOwner::send_queue: {
      if (seq < sq_base_ || seq >= sq_base_ + sq_.size()) return;
      SendEntry& entry = sq_[seq - sq_base_];
      if (entry.phase == SendEntry::Phase::transmitting) entry.phase = SendEntry::Phase::done;
      break;
    }
    case TxOwner::read_response:
      if (!inbound_reads_.empty() && seq == inbound_base_) {
        inbound_reads_.pop_front();
        ++inbound_base_;
      }
      break;
    case TxOwner::none:
    case TxOwner::rtr:
    case TxOwner::terminate:
      break;
  }
}

// Completions leave in submission order (RFC 5040 §5.5): a finished WR waits behind an
// earlier unfinished one. Unsignaled successes complete silently.
void QueuePairEngine::complete_ready_sends() {
  while (!sq_.empty() && sq_.front().phase == SendEntry::Phase::done) {
    const SendEntry& entry = sq_.front();
    if (entry.signaled || entry.status != WcStatus::success) push_send_completion(completion_for(entry));
    sq_.pop_front();
    ++sq_base_;
  }
}

// ---------------------------------------------------------------- direct transmit

// Nothing is queued, framed or owed to the peer, and the QP may send: a WR posted now
// would be the next FPDU on the wire whichever path it took.
bool QueuePairEngine::transmit_idle() const {
  return connected_ && state_ == QpState::rts && !tx_stopped_ && ring_count_ == 0 && sq_.empty() &&
         tx_msg_.owner == TxOwner::none && !rtr_pending_ && !tx_fenced_ &&
         inbound_next_ == inbound_base_ + inbound_reads_.size();
}

// The send queue's schedule, for a WR it would frame at once anyway: the same FPDU, framed
// into the ring's first slot, without the queue entry and the scheduling around it.
std::span<const iovec> QueuePairEngine::frame_direct(const SendWr& wr) {
  if (!transmit_idle()) return {};
  if (wr.opcode != WrOpcode::send && wr.opcode != WrOpcode::send_with_invalidate &&
      wr.opcode != WrOpcode::rdma_write)
    return {};
  // Inline data must outlive a partial write: only the queue keeps a copy of it.
  if (wr.flags & kSendInline) return {};
  std::uint64_t length = 0;
  if (!check_send_wr(wr, length)) return {};
  // A bad SGE takes the queue, which completes it in error and terminates the stream.
  for (const Sge& sge : wr.sg_list)
    if (!memory_.check_local(sge, config_.pd, false)) return {};
  wire::SegmentHeader header = message_header(wr);
  if (length > mulpdu_ - wire::segment_header_size(header)) return {};  // one FPDU only
  // The one segment: L set, MO 0 or TO at the first byte (RFC 5041 §5.4).
  if (wire::is_send(header.opcode)) header.msn = next_send_msn_;
  if (wire::is_tagged(header.opcode)) header.tagged_offset = wr.remote_addr;
  // Its send-queue sequence number: the entry it becomes if the socket takes only part.
  const bool framed = frame_into_next_slot(header, length, TxOwner::send_queue, sq_next_, [&](auto&& add) {
    for (const Sge& sge : wr.sg_list)
      if (sge.length > 0) add(detail::memory_at(sge.addr), sge.length);
  });
  if (!framed) return {};  // cannot happen (one FPDU, checked above); post_send() would say so
  if (wire::is_send(header.opcode)) ++next_send_msn_;
  return ring_at(0).pieces;
}

void QueuePairEngine::finish_direct(const SendWr& wr, std::size_t written) {
  const bool whole = written >= ring_at(0).size;
  const bool signaled = config_.signal_all || (wr.flags & kSendSignaled);
  std::uint64_t length = 0;
  for (const Sge& sge : wr.sg_list) length += sge.length;
  if (whole) {
    // RFC 5040 §5.5: complete once the LLP accepted the last byte.
    if (signaled) push_send_completion(completion_for(wr, length, WcStatus::success));
  } else {
    // The rest goes out as any queued WR's would, and it completes then.
    SendEntry& entry = sq_.emplace_back(wr);
    entry.length = length;
    entry.signaled = signaled;
    entry.phase = SendEntry::Phase::transmitting;
    ++sq_next_;
  }
  handle_transmitted(written);
}

// Teardown: nothing new is framed; an FPDU already partly on the wire is finished from a
// private copy (its buffers are handed back to the application by the flush), never cut.
void QueuePairEngine::stop_transmit() {
  tx_stopped_ = true;
  rtr_pending_ = false;
  tx_msg_ = TxMessage{};
  if (ring_count_ > 0 && ring_at(0).sent > 0) {
    TxSlot& slot = ring_at(0);
    const std::size_t remaining = slot.size - slot.sent;
    std::vector<std::uint8_t> copy(remaining);
    std::size_t skip = slot.sent;
    std::size_t at = 0;
    for (const iovec& piece : slot.pieces) {
      if (piece.iov_len <= skip) {
        skip -= piece.iov_len;
        continue;
      }
      const std::size_t k = piece.iov_len - skip;
      std::memcpy(copy.data() + at, static_cast<const std::uint8_t*>(piece.iov_base) + skip, k);
      at += k;
      skip = 0;
    }
    tail_ = std::move(copy);
    slot.pieces.clear();
    slot.pieces.push_back(detail::make_iovec(tail_.data(), tail_.size()));
    slot.size = tail_.size();
    slot.sent = 0;
    slot.owner = TxOwner::none;
    slot.last = false;
    ring_count_ = 1;
    ring_unsent_ = slot.size;
  } else {
    ring_count_ = 0;
    ring_unsent_ = 0;
  }
}

}  // namespace peercm::core
