// Terminate generation (RFC 5040 §4.8, §6.2, §7; iwarp-wire.md §3.8): the error code, the
// copied headers of the offending segment, the one Terminate FPDU of the stream.
#include <cstring>

#include "core/queue_pair_engine.hpp"
#include "wire/byte_io.hpp"

namespace peercm::core {
namespace {

using wire::TerminateCode;
using wire::TerminateLayer;

constexpr std::uint8_t kDdpTaggedBit = 0x80;
constexpr std::uint8_t kOpcodeMask = 0x0F;

}  // namespace

// An inbound segment broke a rule. RFC 5040 §7.1 (Fig. 10) says what the Terminate copies:
// DDP/RDMAP errors carry the segment length and its DDP header, RDMAP protection errors on a
// Read Request also the Read Request header; local catastrophic and LLP errors nothing.
void QueuePairEngine::terminate_inbound(TerminateCode code) {
  wire::TerminateHeader t;
  t.code = code;
  const bool llp = code.layer == TerminateLayer::llp;
  const bool local = code.layer == TerminateLayer::rdmap && code.error_type == 0x0;
  if (!llp && !local && raw_filled_ >= wire::kUlpduLengthSize + 2) {
    const bool tagged = raw_[2] & kDdpTaggedBit;
    const std::size_t header_length = tagged ? wire::kTaggedHeaderSize : wire::kUntaggedHeaderSize;
    if (raw_filled_ >= wire::kUlpduLengthSize + header_length) {
      // iwarp-wire.md §3.8: the full DDP segment length (the offending ULPDU_Length).
      t.segment_length_valid = true;
      t.ddp_segment_length = wire::load_be16(raw_.data());
      t.ddp_header_length = static_cast<std::uint8_t>(header_length);
      std::memcpy(t.ddp_header.data(), raw_.data() + wire::kUlpduLengthSize, header_length);
    }
    const bool read_request =
        !tagged && (raw_[3] & kOpcodeMask) == static_cast<std::uint8_t>(wire::RdmapOpcode::read_request);
    if (code.layer == TerminateLayer::rdmap && code.error_type == 0x1 && read_request &&
        raw_filled_ >= wire::kUlpduLengthSize + wire::kReadRequestUlpduSize) {
      t.has_rdma_header = true;
      std::memcpy(t.rdma_header.data(), raw_.data() + wire::kUlpduLengthSize + wire::kUntaggedHeaderSize,
                  wire::kReadRequestHeaderSize);
    }
  }
  send_terminate(t);
}

// The FPDU decoder found the stream broken (RFC 5044 §7.2, RFC 5041 §7.2, RFC 5040 §7.2);
// every later inbound byte is dropped.
void QueuePairEngine::on_decode_error(wire::WireError error) {
  TerminateCode code{TerminateLayer::rdmap, 0x2, 0xFF};  // unspecified remote operation error
  switch (error) {
    case wire::WireError::fpdu_bad_crc:
      code = {TerminateLayer::llp, 0x0, 0x02};  // MPA CRC error
      break;
    case wire::WireError::ddp_bad_version: {
      const bool tagged = raw_filled_ > wire::kUlpduLengthSize && (raw_[2] & kDdpTaggedBit);
      code = tagged ? TerminateCode{TerminateLayer::ddp, 0x1, 0x04} : TerminateCode{TerminateLayer::ddp, 0x2, 0x06};
      break;
    }
    case wire::WireError::rdmap_bad_version:
      code = {TerminateLayer::rdmap, 0x2, 0x05};
      break;
    case wire::WireError::rdmap_unknown_opcode:
    case wire::WireError::rdmap_opcode_tag_mismatch:
      code = {TerminateLayer::rdmap, 0x2, 0x06};  // unexpected opcode
      break;
    case wire::WireError::ddp_bad_queue_number:
      code = {TerminateLayer::ddp, 0x2, 0x01};
      break;
    default:
      break;
  }
  rx_dead_ = true;
  terminate_inbound(code);
}

// We detected an error: report the first one only, stop, flush, and queue the Terminate
// behind the FPDU now on the wire (RFC 5040 §6.2: nothing is sent after it).
void QueuePairEngine::send_terminate(const wire::TerminateHeader& terminate) {
  if (state_ == QpState::error) return;
  terminate_ = terminate;
  events_.push_back(QpEvent{.kind = QpEvent::Kind::terminate_sent, .code = terminate.code});
  enter_error();
  if (connected_) queue_terminate_fpdu();
}

// iwarp-wire.md §3.8: untagged, QN 2, MSN 1 (one Terminate per stream), MO 0, L.
void QueuePairEngine::queue_terminate_fpdu() {
  wire::SegmentHeader header;
  header.opcode = wire::RdmapOpcode::terminate;
  header.last = true;
  header.queue_number = wire::kQueueTerminate;
  header.msn = 1;
  header.message_offset = 0;
  header.terminate = *terminate_;
  frame_whole(header, TxOwner::terminate);
  terminate_framed_ = true;
}

}  // namespace peercm::core
