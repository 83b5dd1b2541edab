#include "wire/ddp_rdmap.hpp"

#include <cstring>

#include "wire/byte_io.hpp"

namespace peercm::wire {
namespace {

constexpr std::uint8_t kDdpTagged = 0x80;  // T
constexpr std::uint8_t kDdpLast = 0x40;    // L
constexpr std::uint8_t kDdpVersionMask = 0x03;
constexpr std::uint8_t kDdpVersion = 1;
constexpr std::uint8_t kRdmapVersionMask = 0xC0;
constexpr std::uint8_t kRdmapVersion = 0x40;  // RV = 1
constexpr std::uint8_t kOpcodeMask = 0x0F;
constexpr std::uint8_t kTermSegmentLengthValid = 0x80;  // M
constexpr std::uint8_t kTermDdpHeader = 0x40;           // D
constexpr std::uint8_t kTermRdmaHeader = 0x20;          // R

std::size_t terminate_size(const TerminateHeader& t) {
  std::size_t size = kUntaggedHeaderSize + kTerminateFixedSize;
  if (t.ddp_header_length != 0) size += 2;  // present with D; M only says it is valid
  size += t.ddp_header_length;
  if (t.has_rdma_header) size += kReadRequestHeaderSize;
  return size;
}

void encode_read_request(const ReadRequestHeader& r, std::uint8_t* p) {
  store_be32(p, r.sink_stag);
  store_be64(p + 4, r.sink_offset);
  store_be32(p + 12, r.size);
  store_be32(p + 16, r.source_stag);
  store_be64(p + 20, r.source_offset);
}

ReadRequestHeader decode_read_request(const std::uint8_t* p) {
  return ReadRequestHeader{.sink_stag = load_be32(p),
                           .sink_offset = load_be64(p + 4),
                           .size = load_be32(p + 12),
                           .source_stag = load_be32(p + 16),
                           .source_offset = load_be64(p + 20)};
}

// RFC 5040 §4.8: fields follow the HdrCt flags; trailing zero fill from peers is accepted.
Result<TerminateHeader, WireError> decode_terminate(std::span<const std::uint8_t> body) {
  if (body.size() < kTerminateFixedSize) return fail(WireError::rdmap_bad_terminate);
  TerminateHeader t;
  const std::uint8_t layer = body[0] >> 4;
  if (layer > 2) return fail(WireError::rdmap_bad_terminate);
  t.code = TerminateCode{static_cast<TerminateLayer>(layer), static_cast<std::uint8_t>(body[0] & 0x0F), body[1]};
  const std::uint8_t hdrct = body[2];
  t.segment_length_valid = hdrct & kTermSegmentLengthValid;
  const bool has_ddp = hdrct & kTermDdpHeader;
  t.has_rdma_header = hdrct & kTermRdmaHeader;
  std::size_t at = kTerminateFixedSize;
  if (has_ddp) {
    if (body.size() < at + 2) return fail(WireError::rdmap_bad_terminate);
    t.ddp_segment_length = load_be16(body.data() + at);
    at += 2;
  }
  if (has_ddp) {
    if (body.size() < at + 1) return fail(WireError::rdmap_bad_terminate);
    t.ddp_header_length = static_cast<std::uint8_t>((body[at] & kDdpTagged) ? kTaggedHeaderSize : kUntaggedHeaderSize);
    if (body.size() < at + t.ddp_header_length) return fail(WireError::rdmap_bad_terminate);
    std::memcpy(t.ddp_header.data(), body.data() + at, t.ddp_header_length);
    at += t.ddp_header_length;
  }
  if (t.has_rdma_header) {
    if (body.size() < at + kReadRequestHeaderSize) return fail(WireError::rdmap_bad_terminate);
    std::memcpy(t.rdma_header.data(), body.data() + at, kReadRequestHeaderSize);
  }
  return t;
}

}  // namespace

std::uint32_t queue_number_for(RdmapOpcode op) {
  switch (op) {
    case RdmapOpcode::read_request: return kQueueReadRequest;
    case RdmapOpcode::terminate: return kQueueTerminate;
    default: return kQueueSend;
  }
}

std::size_t segment_header_size(const SegmentHeader& header) {
  if (is_tagged(header.opcode)) return kTaggedHeaderSize;
  if (header.opcode == RdmapOpcode::read_request) return kReadRequestUlpduSize;
  if (header.opcode == RdmapOpcode::terminate) return terminate_size(header.terminate);
  return kUntaggedHeaderSize;
}

Result<std::size_t, WireError> encode_segment_header(const SegmentHeader& h, std::span<std::uint8_t> out) {
  const std::size_t size = segment_header_size(h);
  if (out.size() < size) return fail(WireError::buffer_too_small);
  if (static_cast<std::uint8_t>(h.opcode) > static_cast<std::uint8_t>(RdmapOpcode::terminate))
    return fail(WireError::rdmap_unknown_opcode);
  const TerminateHeader& t = h.terminate;
  if (h.opcode == RdmapOpcode::terminate &&
      (t.ddp_header_length != 0 && t.ddp_header_length != kTaggedHeaderSize &&
       t.ddp_header_length != kUntaggedHeaderSize))
    return fail(WireError::rdmap_bad_terminate);
  std::uint8_t* p = out.data();
  const bool tagged = is_tagged(h.opcode);
  store_be16(p, segment_control_bytes(h.opcode, h.last));
  if (tagged) {
    store_be32(p + 2, h.stag);
    store_be64(p + 6, h.tagged_offset);
    return size;
  }
  store_be32(p + 2, carries_invalidate(h.opcode) ? h.invalidate_stag : 0);
  store_be32(p + 6, h.queue_number);
  store_be32(p + 10, h.msn);
  store_be32(p + 14, h.message_offset);
  std::uint8_t* body = p + kUntaggedHeaderSize;
  if (h.opcode == RdmapOpcode::read_request) {
    encode_read_request(h.read_request, body);
  } else if (h.opcode == RdmapOpcode::terminate) {
    body[0] = static_cast<std::uint8_t>((static_cast<std::uint8_t>(t.code.layer) << 4) | (t.code.error_type & 0x0F));
    body[1] = t.code.error_code;
    body[2] = static_cast<std::uint8_t>((t.segment_length_valid ? kTermSegmentLengthValid : 0) |
                                        (t.ddp_header_length ? kTermDdpHeader : 0) |
                                        (t.has_rdma_header ? kTermRdmaHeader : 0));
    body[3] = 0;
    std::size_t at = kTerminateFixedSize;
    if (t.ddp_header_length) {
      store_be16(body + at, t.ddp_segment_length);
      at += 2;
    }
    if (t.ddp_header_length) {
      std::memcpy(body + at, t.ddp_header.data(), t.ddp_header_length);
      at += t.ddp_header_length;
    }
    if (t.has_rdma_header) std::memcpy(body + at, t.rdma_header.data(), kReadRequestHeaderSize);
  }
  return size;
}

// RFC 5041 §7.2 and RFC 5040 §7.2: version, opcode and tagged-flag checks, before any placement.
Result<std::size_t, WireError> peek_segment_header_size(std::uint8_t ddp_control, std::uint8_t rdmap_control,
                                                        std::size_t ulpdu_length) {
  if ((ddp_control & kDdpVersionMask) != kDdpVersion) return fail(WireError::ddp_bad_version);
  if ((rdmap_control & kRdmapVersionMask) != kRdmapVersion) return fail(WireError::rdmap_bad_version);
  const std::uint8_t raw_opcode = rdmap_control & kOpcodeMask;
  if (raw_opcode > static_cast<std::uint8_t>(RdmapOpcode::terminate)) return fail(WireError::rdmap_unknown_opcode);
  const auto opcode = static_cast<RdmapOpcode>(raw_opcode);
  const bool tagged = ddp_control & kDdpTagged;
  if (tagged != is_tagged(opcode)) return fail(WireError::rdmap_opcode_tag_mismatch);
  if (tagged) {
    if (ulpdu_length < kTaggedHeaderSize) return fail(WireError::fpdu_ulpdu_too_short);
    return kTaggedHeaderSize;
  }
  if (ulpdu_length < kUntaggedHeaderSize) return fail(WireError::fpdu_ulpdu_too_short);
  if (opcode == RdmapOpcode::read_request) {
    if (ulpdu_length != kReadRequestUlpduSize) return fail(WireError::rdmap_bad_read_request);
    return kReadRequestUlpduSize;
  }
  if (opcode == RdmapOpcode::terminate) {
    if (ulpdu_length < kUntaggedHeaderSize + kTerminateFixedSize || ulpdu_length > kMaxTerminateUlpduSize)
      return fail(WireError::rdmap_bad_terminate);
    return ulpdu_length;  // a Terminate carries no payload: the whole ULPDU is header
  }
  return kUntaggedHeaderSize;
}

Status<WireError> detail::decode_sized_segment_header_into(std::span<const std::uint8_t> bytes,
                                                           std::size_t header_size, SegmentHeader& h) {
  const std::uint8_t* p = bytes.data();
  h.opcode = static_cast<RdmapOpcode>(p[1] & kOpcodeMask);
  h.last = p[0] & kDdpLast;
  if (is_tagged(h.opcode)) {
    h.stag = load_be32(p + 2);
    h.tagged_offset = load_be64(p + 6);
    return {};
  }
  h.invalidate_stag = carries_invalidate(h.opcode) ? load_be32(p + 2) : 0;
  h.queue_number = load_be32(p + 6);
  h.msn = load_be32(p + 10);
  h.message_offset = load_be32(p + 14);
  if (h.queue_number != queue_number_for(h.opcode)) return fail(WireError::ddp_bad_queue_number);
  if (h.opcode == RdmapOpcode::read_request) {
    // A Read Request is a single-segment message (RFC 5040 §4.4).
    if (!h.last || h.message_offset != 0) return fail(WireError::rdmap_bad_read_request);
    h.read_request = decode_read_request(p + kUntaggedHeaderSize);
  } else if (h.opcode == RdmapOpcode::terminate) {
    if (!h.last || h.message_offset != 0) return fail(WireError::rdmap_bad_terminate);
    auto term = decode_terminate(bytes.subspan(kUntaggedHeaderSize, header_size - kUntaggedHeaderSize));
    if (!term) return fail(term.error());
    h.terminate = *term;
  }
  return {};
}

Result<SegmentHeader, WireError> decode_segment_header(std::span<const std::uint8_t> bytes,
                                                       std::size_t ulpdu_length) {
  if (bytes.size() < 2) return fail(WireError::truncated);
  auto size = peek_segment_header_size(bytes[0], bytes[1], ulpdu_length);
  if (!size) return fail(size.error());
  if (bytes.size() < *size) return fail(WireError::truncated);
  SegmentHeader h;
  if (auto ok = detail::decode_sized_segment_header_into(bytes, *size, h); !ok) return fail(ok.error());
  return h;
}

}  // namespace peercm::wire
