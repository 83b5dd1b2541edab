// CM REP, the connect reply (IBTA Vol 1 ch. 12; roce-ibcm-wire.md §4.4, §4.6).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "peercm/result.hpp"
#include "wire/ibcm/cm_common.hpp"
#include "wire/wire_error.hpp"

namespace peercm::wire::ibcm {

struct CmRep {
  std::uint32_t local_comm_id = 0;
  std::uint32_t remote_comm_id = 0;  // the REQ's local communication ID
  std::uint32_t local_qkey = 0;      // RD only
  std::uint32_t local_qpn = 0;       // 24 bits
  std::uint32_t local_eecn = 0;      // 24 bits
  std::uint32_t starting_psn = 0;    // 24 bits
  // 24 bits spread over the low bytes of the three words above in newer kernels (§4.7).
  std::uint32_t ece_vendor_id = 0;
  std::uint8_t responder_resources = 0;
  std::uint8_t initiator_depth = 0;
  std::uint8_t target_ack_delay = 0;   // 5 bits
  std::uint8_t failover_accepted = 0;  // 2 bits
  bool end_to_end_flow_control = false;
  std::uint8_t rnr_retry_count = 0;  // 3 bits
  bool srq = false;
  std::uint64_t local_ca_guid = 0;
  // Encode: up to 196 bytes, zero-filled. Decode: all 196 bytes, a view into the MAD.
  std::span<const std::uint8_t> private_data;
};

CmRep decode_cm_rep(std::span<const std::uint8_t, kCmMessageSize> bytes);
Status<WireError> encode_cm_rep(const CmRep& rep, std::span<std::uint8_t, kCmMessageSize> out);

}  // namespace peercm::wire::ibcm
