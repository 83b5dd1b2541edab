// DDP/RDMAP segment headers (RFC 5041 §5, RFC 5040 §4) from any bytes and any ULPDU length.
// Input: ULPDU_Length (2 bytes, big-endian), then the ULPDU's first bytes.
// Oracles: decode agrees with peek_segment_header_size; a header never claims more than the
// ULPDU or the input; a decoded header re-encodes to the received bytes in every bit the
// decoder reads, and that encoding decodes to the same header; bytes past the header change
// nothing.
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

#include "fuzz_support.hpp"
#include "wire/byte_io.hpp"
#include "wire/ddp_rdmap.hpp"

namespace {

using namespace peercm::wire;

bool is_content_error(WireError e) {
  return e == WireError::ddp_bad_queue_number || e == WireError::rdmap_bad_read_request ||
         e == WireError::rdmap_bad_terminate;
}

void check_decoded(const SegmentHeader& h, std::size_t claimed, std::span<const std::uint8_t> bytes,
                   std::size_t ulpdu_length) {
  FUZZ_CHECK(claimed <= ulpdu_length, "header longer than its ULPDU");
  FUZZ_CHECK(claimed <= bytes.size(), "header decoded from bytes that were not there");
  const std::size_t size = segment_header_size(h);
  if (h.opcode == RdmapOpcode::terminate) {
    // A Terminate is all header; its optional fields may leave zero fill unused.
    FUZZ_CHECK(size <= claimed, "Terminate encodes longer than it was received");
  } else {
    FUZZ_CHECK(size == claimed, "header size disagrees with peek_segment_header_size");
  }
  FUZZ_CHECK(h.queue_number == (is_tagged(h.opcode) ? 0 : queue_number_for(h.opcode)), "wrong queue number");

  std::array<std::uint8_t, kMaxSegmentHeaderSize> encoded{};
  auto written = encode_segment_header(h, encoded);
  FUZZ_CHECK(written.has_value(), "a decoded header does not encode");
  FUZZ_CHECK(*written == size, "encoder wrote another size than segment_header_size");
  const auto wire = std::span<const std::uint8_t>(encoded).first(size);
  FUZZ_CHECK(peercm::fuzz::matches_received(h, bytes, wire), "re-encoding differs from the received header");

  const std::size_t again_length = h.opcode == RdmapOpcode::terminate ? size : ulpdu_length;
  auto again = decode_segment_header(wire, again_length);
  FUZZ_CHECK(again.has_value(), "re-encoded header does not decode");
  FUZZ_CHECK(peercm::fuzz::same_header(*again, h), "re-encoded header decodes differently");

  auto exact = decode_segment_header(bytes.first(claimed), ulpdu_length);
  FUZZ_CHECK(exact.has_value() && peercm::fuzz::same_header(*exact, h), "bytes after the header changed the result");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 2) return 0;
  const std::size_t ulpdu_length = load_be16(data);
  const std::span<const std::uint8_t> bytes(data + 2, size - 2);
  auto decoded = decode_segment_header(bytes, ulpdu_length);
  if (bytes.size() < 2) {
    FUZZ_CHECK(!decoded && decoded.error() == WireError::truncated, "decoded a header from under two bytes");
    return 0;
  }
  auto peek = peek_segment_header_size(bytes[0], bytes[1], ulpdu_length);
  if (!peek) {
    FUZZ_CHECK(!decoded && decoded.error() == peek.error(), "decode and peek disagree on the control bytes");
    return 0;
  }
  if (!decoded) {
    if (bytes.size() < *peek) {
      FUZZ_CHECK(decoded.error() == WireError::truncated, "short input not reported as truncated");
    } else {
      FUZZ_CHECK(is_content_error(decoded.error()), "unexpected error for a complete header");
    }
    return 0;
  }
  check_decoded(*decoded, *peek, bytes, ulpdu_length);
  return 0;
}
