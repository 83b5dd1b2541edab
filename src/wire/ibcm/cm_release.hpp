// The CM messages that release a connection (IBTA Vol 1 ch. 12; roce-ibcm-wire.md §4.5):
// DREQ and DREP.
#pragma once

#include <cstdint>
#include <span>

#include "peercm/result.hpp"
#include "wire/ibcm/cm_common.hpp"
#include "wire/wire_error.hpp"

namespace peercm::wire::ibcm {

struct CmDreq {
  std::uint32_t local_comm_id = 0;
  std::uint32_t remote_comm_id = 0;
  std::uint32_t remote_qpn = 0;  // 24 bits: the receiver's QPN, else the DREQ is ignored (§4.6)
  // Encode: up to 220 bytes, zero-filled. Decode: all 220 bytes, a view into the MAD.
  std::span<const std::uint8_t> private_data;
};

struct CmDrep {
  std::uint32_t local_comm_id = 0;
  std::uint32_t remote_comm_id = 0;
  // Encode: up to 224 bytes, zero-filled. Decode: all 224 bytes, a view into the MAD.
  std::span<const std::uint8_t> private_data;
};

CmDreq decode_cm_dreq(std::span<const std::uint8_t, kCmMessageSize> bytes);
Status<WireError> encode_cm_dreq(const CmDreq& dreq, std::span<std::uint8_t, kCmMessageSize> out);

CmDrep decode_cm_drep(std::span<const std::uint8_t, kCmMessageSize> bytes);
Status<WireError> encode_cm_drep(const CmDrep& drep, std::span<std::uint8_t, kCmMessageSize> out);

}  // namespace peercm::wire::ibcm
