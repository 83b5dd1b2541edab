#include "wire/wire_error.hpp"

namespace peercm::wire {

std::string_view to_string(WireError error) {
  switch (error) {
    case WireError::truncated: return "input truncated";
    case WireError::buffer_too_small: return "output buffer too small";
    case WireError::mpa_bad_key: return "MPA frame has a wrong key";
    case WireError::mpa_bad_revision: return "MPA revision not supported";
    case WireError::mpa_reserved_bits_set: return "MPA frame has reserved bits set";
    case WireError::mpa_private_data_too_long: return "MPA private data longer than 512 bytes";
    case WireError::mpa_enhanced_needs_rev2: return "MPA enhanced frame (S=1) with revision < 2";
    case WireError::mpa_length_mismatch: return "MPA PD_Length does not match the data present";
    case WireError::mpa_reject_in_request: return "MPA Request with the reject bit set";
    case WireError::mpa_ird_ord_out_of_range: return "MPA IRD/ORD value above 0x3FFF";
    case WireError::fpdu_ulpdu_too_short: return "FPDU ULPDU shorter than its DDP header";
    case WireError::fpdu_ulpdu_too_long: return "FPDU ULPDU longer than the receiver accepts";
    case WireError::fpdu_bad_padding: return "FPDU padding is not zero";
    case WireError::fpdu_bad_crc: return "FPDU CRC32C mismatch";
    case WireError::ddp_bad_version: return "DDP version is not 1";
    case WireError::ddp_bad_queue_number: return "DDP queue number invalid for the opcode";
    case WireError::rdmap_bad_version: return "RDMAP version is not 1";
    case WireError::rdmap_unknown_opcode: return "RDMAP opcode unknown";
    case WireError::rdmap_opcode_tag_mismatch: return "RDMAP opcode disagrees with the DDP tagged flag";
    case WireError::rdmap_bad_read_request: return "RDMA Read Request malformed";
    case WireError::rdmap_bad_terminate: return "Terminate message malformed";
    case WireError::cm_bad_magic: return "CM header magic wrong";
    case WireError::cm_unsupported_version: return "CM header version not supported";
    case WireError::cm_bad_length: return "CM header length wrong";
    case WireError::cm_reserved_bits_set: return "CM header has reserved bits set";
    case WireError::roce_bad_transport_version: return "RoCE BTH transport version is not 0";
    case WireError::roce_unsupported_opcode: return "RoCE opcode not supported";
    case WireError::roce_bad_length: return "RoCE packet length invalid";
    case WireError::roce_bad_pad_count: return "RoCE pad count larger than the data present";
    case WireError::roce_unexpected_payload: return "RoCE payload on an opcode that carries none";
    case WireError::roce_bad_aeth: return "RoCE AETH syndrome reserved";
    case WireError::roce_bad_icrc: return "RoCE ICRC mismatch";
    case WireError::roce_field_out_of_range: return "RoCE field value wider than its wire field";
    case WireError::roce_bad_ip_header: return "IP/UDP header of a RoCEv2 datagram invalid";
    case WireError::gsi_not_a_mad_datagram: return "not a UD SEND ONLY to QP1";
    case WireError::gsi_bad_qkey: return "GSI datagram with a Q_Key other than 0x80010000";
    case WireError::mad_bad_length: return "MAD is not 256 bytes";
    case WireError::mad_bad_base_version: return "MAD base version is not 1";
    case WireError::mad_bad_class: return "MAD management class is not CM";
    case WireError::mad_bad_class_version: return "CM class version is not 2";
    case WireError::mad_bad_method: return "CM MAD method is not Send";
    case WireError::ibcm_unknown_attribute: return "CM attribute ID not supported";
    case WireError::ibcm_reserved_value: return "CM field holds a reserved value";
    case WireError::ibcm_field_out_of_range: return "CM field value wider than its wire field";
    case WireError::ibcm_private_data_too_long: return "CM private data too long for the message";
    case WireError::ibcm_not_ip_service_id: return "service ID is not an rdma_cm IP service ID";
    case WireError::cma_unsupported_version: return "rdma_cm private-data header version not supported";
    case WireError::cma_bad_ip_version: return "rdma_cm private-data header IP version is not 4 or 6";
  }
  return "unknown wire error";
}

}  // namespace peercm::wire
