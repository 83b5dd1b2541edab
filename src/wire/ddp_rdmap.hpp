// DDP segment headers (RFC 5041 §5) and the RDMAP headers they carry (RFC 5040 §4).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

#include "peercm/result.hpp"
#include "wire/wire_error.hpp"

namespace peercm::wire {

inline constexpr std::size_t kTaggedHeaderSize = 14;    // RFC 5041 §5.2
inline constexpr std::size_t kUntaggedHeaderSize = 18;  // RFC 5041 §5.3
inline constexpr std::size_t kReadRequestHeaderSize = 28;  // RFC 5040 §4.4
inline constexpr std::size_t kReadRequestUlpduSize = kUntaggedHeaderSize + kReadRequestHeaderSize;
inline constexpr std::size_t kTerminateFixedSize = 4;   // layer/type, code, HdrCt, reserved
// Largest Terminate: untagged header + fixed part + segment length + DDP copy + RDMA copy.
inline constexpr std::size_t kMaxTerminateUlpduSize =
    kUntaggedHeaderSize + kTerminateFixedSize + 2 + kUntaggedHeaderSize + kReadRequestHeaderSize;
inline constexpr std::size_t kMaxSegmentHeaderSize = kMaxTerminateUlpduSize;

// RFC 5040 §4.3 opcodes; 0x8..0xF are reserved here.
enum class RdmapOpcode : std::uint8_t {
  rdma_write = 0x0,
  read_request = 0x1,
  read_response = 0x2,
  send = 0x3,
  send_invalidate = 0x4,
  send_solicited = 0x5,
  send_solicited_invalidate = 0x6,
  terminate = 0x7,
};

// RFC 5040 §5.1: untagged queue numbers.
inline constexpr std::uint32_t kQueueSend = 0;
inline constexpr std::uint32_t kQueueReadRequest = 1;
inline constexpr std::uint32_t kQueueTerminate = 2;

constexpr bool is_tagged(RdmapOpcode op) {
  return op == RdmapOpcode::rdma_write || op == RdmapOpcode::read_response;
}
constexpr bool is_send(RdmapOpcode op) {
  return op >= RdmapOpcode::send && op <= RdmapOpcode::send_solicited_invalidate;
}
constexpr bool carries_invalidate(RdmapOpcode op) {
  return op == RdmapOpcode::send_invalidate || op == RdmapOpcode::send_solicited_invalidate;
}
constexpr bool is_solicited(RdmapOpcode op) {
  return op == RdmapOpcode::send_solicited || op == RdmapOpcode::send_solicited_invalidate;
}
// The queue an untagged opcode travels on (RFC 5040 §5.1).
std::uint32_t queue_number_for(RdmapOpcode op);

// The first two bytes of a segment header: DDP control (RFC 5041 §5.1: T, L, DV = 1) and
// RDMAP control (RFC 5040 §4.2: RV = 1, opcode), reserved bits zero, as a big-endian pair.
constexpr std::uint16_t segment_control_bytes(RdmapOpcode opcode, bool last) {
  const unsigned ddp = (is_tagged(opcode) ? 0x80u : 0u) | (last ? 0x40u : 0u) | 0x01u;
  const unsigned rdmap = 0x40u | static_cast<unsigned>(opcode);
  return static_cast<std::uint16_t>(ddp << 8 | rdmap);
}

struct ReadRequestHeader {
  std::uint32_t sink_stag = 0;
  std::uint64_t sink_offset = 0;
  std::uint32_t size = 0;
  std::uint32_t source_stag = 0;
  std::uint64_t source_offset = 0;
  bool operator==(const ReadRequestHeader&) const = default;
};

// Terminate error layers and types (RFC 5040 §4.8, RFC 6580).
enum class TerminateLayer : std::uint8_t { rdmap = 0x0, ddp = 0x1, llp = 0x2 };

struct TerminateCode {
  TerminateLayer layer = TerminateLayer::rdmap;
  std::uint8_t error_type = 0;  // 4 bits
  std::uint8_t error_code = 0;
  bool operator==(const TerminateCode&) const = default;
};

// RFC 5040 §4.8 Terminate header plus the copied headers of the offending segment.
struct TerminateHeader {
  TerminateCode code;
  bool segment_length_valid = false;  // M
  std::uint16_t ddp_segment_length = 0;
  std::uint8_t ddp_header_length = 0;  // 0 (D clear), 14 or 18
  std::array<std::uint8_t, kUntaggedHeaderSize> ddp_header{};
  bool has_rdma_header = false;  // R: the offending Read Request header
  std::array<std::uint8_t, kReadRequestHeaderSize> rdma_header{};
  bool operator==(const TerminateHeader&) const = default;
};

// Everything before the payload in one DDP segment. Tagged fields apply to Write and Read
// Response, untagged fields to the others.
struct SegmentHeader {
  RdmapOpcode opcode = RdmapOpcode::send;
  bool last = true;  // DDP L flag
  // tagged (RFC 5041 §5.2)
  std::uint32_t stag = 0;
  std::uint64_t tagged_offset = 0;
  // untagged (RFC 5041 §5.3)
  std::uint32_t invalidate_stag = 0;  // Send with Invalidate only
  std::uint32_t queue_number = 0;
  std::uint32_t msn = 0;
  std::uint32_t message_offset = 0;
  ReadRequestHeader read_request;  // opcode read_request
  TerminateHeader terminate;       // opcode terminate
};

// Bytes `header` occupies in the ULPDU.
std::size_t segment_header_size(const SegmentHeader& header);
Result<std::size_t, WireError> encode_segment_header(const SegmentHeader& header, std::span<std::uint8_t> out);

// Header size implied by the first two ULPDU bytes (DDP and RDMAP control) and the ULPDU
// length, or the error those bytes already prove.
Result<std::size_t, WireError> peek_segment_header_size(std::uint8_t ddp_control, std::uint8_t rdmap_control,
                                                        std::size_t ulpdu_length);
// Decodes the header at the start of a ULPDU of `ulpdu_length` bytes; `bytes` holds at
// least the header (more is ignored).
Result<SegmentHeader, WireError> decode_segment_header(std::span<const std::uint8_t> bytes,
                                                       std::size_t ulpdu_length);

namespace detail {
// decode_segment_header after its peek_segment_header_size() (whose result is `header_size`,
// for the same bytes and length), writing straight into `out`, which must hold a
// default-constructed SegmentHeader: the FPDU receive path sized the header already and
// decodes into its event without copying a Result. `bytes` holds at least `header_size`
// bytes. On failure `out` holds partial fields and is to be discarded.
Status<WireError> decode_sized_segment_header_into(std::span<const std::uint8_t> bytes, std::size_t header_size,
                                                   SegmentHeader& out);
}  // namespace detail

}  // namespace peercm::wire
