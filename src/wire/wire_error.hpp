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
  // RoCEv2 transport packets (IBTA Vol 1 ch. 9, Annex A17; roce-ibcm-wire.md §1-2)
  roce_bad_transport_version,   // BTH TVer is not 0
  roce_unsupported_opcode,      // not an RC, UC, UD or CNP opcode of the table
  roce_bad_length,              // packet not a multiple of 4 bytes, or shorter than its headers
  roce_bad_pad_count,           // PadCnt larger than the bytes after the headers
  roce_unexpected_payload,      // payload on an opcode that carries none
  roce_bad_aeth,                // AETH syndrome with a reserved type or NAK code
  roce_bad_icrc,
  roce_field_out_of_range,      // encoder: a value wider than its wire field
  roce_bad_ip_header,           // not IPv4/IPv6 + UDP, IP options, or lengths that disagree
  // GSI MADs on QP1 and the IB CM (IBTA Vol 1 ch. 12-13; roce-ibcm-wire.md §3-4, §6)
  gsi_not_a_mad_datagram,       // not UD SEND ONLY to QP1
  gsi_bad_qkey,
  mad_bad_length,               // a MAD is exactly 256 bytes
  mad_bad_base_version,
  mad_bad_class,                // management class is not CM (0x07)
  mad_bad_class_version,
  mad_bad_method,               // CM messages use Send (0x03)
  ibcm_unknown_attribute,       // not REQ, MRA, REJ, REP, RTU, DREQ or DREP
  ibcm_reserved_value,          // a field holds a value the spec reserves
  ibcm_field_out_of_range,      // encoder: a value wider than its wire field
  ibcm_private_data_too_long,
  ibcm_not_ip_service_id,       // service ID outside rdma_cm's IP port spaces
  cma_unsupported_version,      // rdma_cm private-data header version is not 0
  cma_bad_ip_version,
};

std::string_view to_string(WireError error);

}  // namespace peercm::wire
