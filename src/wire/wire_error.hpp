// Typed decode/encode errors of the wire codecs.
#pragma once

#include <cstdint>
#include <string_view>

namespace peercm::wire {

enum class WireError : std::uint8_t {
  truncated,                  // input ends inside a field (pure decoders only)
  buffer_too_small,           // encoder output buffer too small
  // MPA startup frames (RFC 5044 §7.1, RFC 6581 §5)
  mpa_bad_key,
  mpa_bad_revision,
  mpa_reserved_bits_set,
  mpa_private_data_too_long,
  mpa_enhanced_needs_rev2,    // S=1 with Rev 1
  mpa_length_mismatch,        // PD_Length disagrees with the bytes present
  mpa_reject_in_request,      // R=1 in a Request
  mpa_ird_ord_out_of_range,   // IRD or ORD above 14 bits (encoder)
  // FPDU framing (RFC 5044 §4)
  fpdu_ulpdu_too_short,
  fpdu_ulpdu_too_long,
  fpdu_bad_padding,
  fpdu_bad_crc,
  // DDP / RDMAP headers (RFC 5041 §7, RFC 5040 §7)
  ddp_bad_version,
  ddp_bad_queue_number,
  rdmap_bad_version,
  rdmap_unknown_opcode,
  rdmap_opcode_tag_mismatch,  // tagged opcode in an untagged segment or the reverse
  rdmap_bad_read_request,     // Read Request with the wrong length or MO/L fields
  rdmap_bad_terminate,
  // peercm CM header (design.md §3 rule 1)
  cm_bad_magic,
  cm_unsupported_version,
  cm_bad_length,
  cm_reserved_bits_set,
};

std::string_view to_string(WireError error);

}  // namespace peercm::wire
