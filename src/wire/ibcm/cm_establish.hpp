// The CM messages that answer a REQ or REP during establishment (IBTA Vol 1 ch. 12;
// roce-ibcm-wire.md §4.5, §4.8): MRA, REJ and RTU.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "peercm/result.hpp"
#include "wire/ibcm/cm_common.hpp"
#include "wire/wire_error.hpp"

namespace peercm::wire::ibcm {

// The message an MRA acknowledges (2 bits; 3 is reserved).
enum class MraTarget : std::uint8_t { req = 0, rep = 1, lap = 2 };
// The message a REJ rejects (2 bits; 3 is reserved).
enum class RejTarget : std::uint8_t { req = 0, rep = 1, other = 2 };

// REJ reasons (§4.8); the wire field is 16 bits and other values pass through.
namespace rej_reason {
inline constexpr std::uint16_t kNoQp = 1;
inline constexpr std::uint16_t kNoEec = 2;
inline constexpr std::uint16_t kNoResources = 3;
inline constexpr std::uint16_t kTimeout = 4;
inline constexpr std::uint16_t kUnsupportedRequest = 5;
inline constexpr std::uint16_t kInvalidCommId = 6;
inline constexpr std::uint16_t kInvalidCommInstance = 7;
inline constexpr std::uint16_t kInvalidServiceId = 8;
inline constexpr std::uint16_t kInvalidTransportType = 9;
inline constexpr std::uint16_t kStaleConnection = 10;
inline constexpr std::uint16_t kRdcNotExist = 11;
inline constexpr std::uint16_t kInvalidPrimaryGid = 12;
inline constexpr std::uint16_t kInvalidPrimaryLid = 13;
inline constexpr std::uint16_t kInvalidPrimarySl = 14;
inline constexpr std::uint16_t kInvalidPrimaryTrafficClass = 15;
inline constexpr std::uint16_t kInvalidPrimaryHopLimit = 16;
inline constexpr std::uint16_t kInvalidPrimaryPacketRate = 17;
inline constexpr std::uint16_t kInvalidAlternateGid = 18;
inline constexpr std::uint16_t kInvalidAlternateLid = 19;
inline constexpr std::uint16_t kInvalidAlternateSl = 20;
inline constexpr std::uint16_t kInvalidAlternateTrafficClass = 21;
inline constexpr std::uint16_t kInvalidAlternateHopLimit = 22;
inline constexpr std::uint16_t kInvalidAlternatePacketRate = 23;
inline constexpr std::uint16_t kPortCmRedirect = 24;
inline constexpr std::uint16_t kPortRedirect = 25;
inline constexpr std::uint16_t kInvalidPathMtu = 26;
inline constexpr std::uint16_t kInsufficientResponderResources = 27;
inline constexpr std::uint16_t kConsumerReject = 28;
inline constexpr std::uint16_t kInvalidRnrRetry = 29;
inline constexpr std::uint16_t kDuplicateLocalCommId = 30;
inline constexpr std::uint16_t kInvalidClassVersion = 31;
inline constexpr std::uint16_t kInvalidFlowLabel = 32;
inline constexpr std::uint16_t kInvalidAlternateFlowLabel = 33;
inline constexpr std::uint16_t kVendorOptionNotSupported = 35;
}  // namespace rej_reason

inline constexpr std::size_t kMaxRejectInfoSize = 72;  // ARI

struct CmMra {
  std::uint32_t local_comm_id = 0;
  std::uint32_t remote_comm_id = 0;
  MraTarget message_mraed = MraTarget::req;
  std::uint8_t service_timeout = 0;  // 5 bits
  // Encode: up to 222 bytes, zero-filled. Decode: all 222 bytes, a view into the MAD.
  std::span<const std::uint8_t> private_data;
};

struct CmRej {
  std::uint32_t local_comm_id = 0;
  std::uint32_t remote_comm_id = 0;
  RejTarget message_rejected = RejTarget::req;
  std::uint16_t reason = rej_reason::kConsumerReject;
  // Additional Reject Information: its size is the Reject Info Length field (0-72). The
  // ARI bytes beyond that length are not part of it.
  std::span<const std::uint8_t> ari;
  // Encode: up to 148 bytes, zero-filled. Decode: all 148 bytes, a view into the MAD.
  std::span<const std::uint8_t> private_data;
};

struct CmRtu {
  std::uint32_t local_comm_id = 0;
  std::uint32_t remote_comm_id = 0;
  // Encode: up to 224 bytes, zero-filled. Decode: all 224 bytes, a view into the MAD.
  std::span<const std::uint8_t> private_data;
};

// Fails with ibcm_reserved_value for Message MRAed = 3.
Result<CmMra, WireError> decode_cm_mra(std::span<const std::uint8_t, kCmMessageSize> bytes);
Status<WireError> encode_cm_mra(const CmMra& mra, std::span<std::uint8_t, kCmMessageSize> out);

// Fails with ibcm_reserved_value for Message REJected = 3 or a Reject Info Length above 72.
Result<CmRej, WireError> decode_cm_rej(std::span<const std::uint8_t, kCmMessageSize> bytes);
// Fails with ibcm_field_out_of_range for more than 72 ARI bytes.
Status<WireError> encode_cm_rej(const CmRej& rej, std::span<std::uint8_t, kCmMessageSize> out);

CmRtu decode_cm_rtu(std::span<const std::uint8_t, kCmMessageSize> bytes);
Status<WireError> encode_cm_rtu(const CmRtu& rtu, std::span<std::uint8_t, kCmMessageSize> out);

}  // namespace peercm::wire::ibcm
