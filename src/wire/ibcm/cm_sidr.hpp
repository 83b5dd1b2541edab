// SIDR_REQ and SIDR_REP, Service ID Resolution (IBTA Vol 1 ch. 12.11; docs/roce-wire.md): how
// a UD client learns a service's QPN and Q_Key. A SIDR MAD is a CM MAD (class CM, version 2,
// method Send) whose attribute is 0x0017 or 0x0018; decode_cm_mad() refuses both and
// decode_sidr_mad() takes nothing else.
//
// SIDR_REQ, offsets after the 24-byte MAD header:  0 Request ID (32) | 4 P_Key (16) |
//   6 reserved (16) | 8 Service ID (64) | 16 private data (216)
// SIDR_REP:  0 Request ID (32) | 4 Status (8) | 5 Additional Information Length (8) |
//   6 reserved (16) | 8 QPN (24) + reserved (8) | 12 Service ID (64) | 20 Q_Key (32) |
//   24 Additional Information (72) | 96 private data (136)
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <variant>

#include "peercm/result.hpp"
#include "wire/ibcm/cm_common.hpp"
#include "wire/wire_error.hpp"

namespace peercm::wire::ibcm {

inline constexpr std::size_t kSidrReqPrivateDataSize = 216;
inline constexpr std::size_t kSidrRepPrivateDataSize = 136;
inline constexpr std::size_t kSidrRepAdditionalInfoSize = 72;

// SIDR_REP Status values.
enum class SidrStatus : std::uint8_t {
  valid = 0,                // the QPN and Q_Key are the service's
  service_unsupported = 1,  // no service by that ID at this port
  rejected = 2,             // the service turned the request down
  no_qp = 3,                // the service has no QP to give
  redirect = 4,             // the additional information names another port (not followed here)
  version_unsupported = 5,  // the service ID names an unsupported version
};
inline constexpr std::uint8_t kMaxSidrStatus = 5;

struct CmSidrReq {
  std::uint32_t request_id = 0;
  std::uint16_t partition_key = 0xFFFF;
  std::uint64_t service_id = 0;
  // Encode: up to 216 bytes, zero-filled. Decode: all 216 bytes, a view into the MAD.
  std::span<const std::uint8_t> private_data;
};

struct CmSidrRep {
  std::uint32_t request_id = 0;
  SidrStatus status = SidrStatus::valid;
  std::uint32_t qpn = 0;  // 24 bits
  std::uint64_t service_id = 0;
  std::uint32_t qkey = 0;
  std::span<const std::uint8_t> additional_info;  // ≤ 72 bytes; its length travels in byte 5
  // Encode: up to 136 bytes, zero-filled. Decode: all 136 bytes, a view into the MAD.
  std::span<const std::uint8_t> private_data;
};

using SidrMessage = std::variant<CmSidrReq, CmSidrRep>;

struct SidrMad {
  std::uint64_t transaction_id = 0;  // a SIDR_REP carries its SIDR_REQ's
  SidrMessage message;
};

// Writes the 256-byte MAD. Fails with buffer_too_small, ibcm_private_data_too_long, or
// ibcm_field_out_of_range (a QPN over 24 bits, additional information over 72 bytes).
Result<std::size_t, WireError> encode_sidr_mad(const SidrMad& mad, std::span<std::uint8_t> out);

// Decodes exactly one 256-byte MAD holding a SIDR_REQ or SIDR_REP, with decode_cm_mad()'s
// header checks (mad_bad_length, mad_bad_base_version, mad_bad_class, mad_bad_class_version,
// mad_bad_method; ibcm_unknown_attribute for any other attribute), then ibcm_reserved_value for
// a status above 5 or an additional information length above 72. Views point into `mad`.
Result<SidrMad, WireError> decode_sidr_mad(std::span<const std::uint8_t> mad);

// True when the MAD's attribute ID (bytes 16-17) names SIDR_REQ or SIDR_REP; the bytes may be
// anything else (a short MAD is false).
bool is_sidr_mad(std::span<const std::uint8_t> mad);

}  // namespace peercm::wire::ibcm
