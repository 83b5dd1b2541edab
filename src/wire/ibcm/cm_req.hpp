// CM REQ, the connect request (IBTA Vol 1 ch. 12; roce-ibcm-wire.md §4.3, §4.6-4.7).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "peercm/result.hpp"
#include "wire/ibcm/cm_common.hpp"
#include "wire/ibcm/gid.hpp"
#include "wire/wire_error.hpp"

namespace peercm::wire::ibcm {

inline constexpr std::size_t kCmPathSize = 44;  // REQ bytes 52-95 (primary), 96-139 (alternate)

enum class TransportServiceType : std::uint8_t { rc = 0, uc = 1, rd = 2, extended = 3 };

// One path of a REQ. On RoCEv2 the GIDs are the IPv4-mapped (or IPv6) addresses and the
// LIDs 0xFFFF (§4.7); an alternate path of all zeros means "none".
struct CmPath {
  std::uint16_t local_lid = 0;
  std::uint16_t remote_lid = 0;
  Gid local_gid{};
  Gid remote_gid{};
  std::uint32_t flow_label = 0;     // 20 bits
  std::uint8_t packet_rate = 0;     // 6 bits, IB rate code
  std::uint8_t traffic_class = 0;
  std::uint8_t hop_limit = 0;
  std::uint8_t sl = 0;              // 4 bits
  bool subnet_local = false;
  std::uint8_t local_ack_timeout = 0;  // 5 bits

  bool operator==(const CmPath&) const = default;
};

struct CmReq {
  std::uint32_t local_comm_id = 0;
  std::uint32_t ece_vendor_id = 0;  // 24 bits in the reserved word (§4.7); 0 = no ECE
  std::uint64_t service_id = 0;
  std::uint64_t local_ca_guid = 0;
  std::uint32_t local_qkey = 0;     // RD only
  std::uint32_t local_qpn = 0;      // 24 bits
  std::uint8_t responder_resources = 0;
  std::uint32_t local_eecn = 0;     // 24 bits
  std::uint8_t initiator_depth = 0;
  std::uint32_t remote_eecn = 0;    // 24 bits
  std::uint8_t remote_cm_response_timeout = 0;  // 5 bits
  TransportServiceType transport_service_type = TransportServiceType::rc;
  bool end_to_end_flow_control = false;
  std::uint32_t starting_psn = 0;   // 24 bits
  std::uint8_t local_cm_response_timeout = 0;  // 5 bits
  std::uint8_t retry_count = 0;     // 3 bits
  std::uint16_t partition_key = 0xFFFF;
  std::uint8_t path_mtu = 0;        // 4 bits, PathMtu code (roce/opcode.hpp)
  bool rdc_exists = false;
  std::uint8_t rnr_retry_count = 0;  // 3 bits
  std::uint8_t max_cm_retries = 0;   // 4 bits
  bool srq = false;
  std::uint8_t extended_transport_type = 0;  // 3 bits
  CmPath primary;
  CmPath alternate;
  // Encode: up to 92 bytes, zero-filled. Decode: all 92 bytes, a view into the MAD.
  std::span<const std::uint8_t> private_data;
};

// Total: any 232 bytes decode (value checks are the state machine's: REJ reasons 9, 26...).
CmReq decode_cm_req(std::span<const std::uint8_t, kCmMessageSize> bytes);
// Fails with ibcm_field_out_of_range when a field exceeds its width, or
// ibcm_private_data_too_long.
Status<WireError> encode_cm_req(const CmReq& req, std::span<std::uint8_t, kCmMessageSize> out);

}  // namespace peercm::wire::ibcm
