// ACK Extended Transport Header (IBTA Vol 1 ch. 9; roce-ibcm-wire.md §2.6-2.7): a syndrome
// byte (ACK with a credit code, RNR NAK with a timer code, or NAK with an error code) and
// the 24-bit MSN.
#pragma once

#include <cstdint>
#include <optional>
#include <span>

#include "peercm/result.hpp"
#include "wire/roce/ext_headers.hpp"
#include "wire/wire_error.hpp"

namespace peercm::wire::roce {

enum class AethKind : std::uint8_t { ack = 0, rnr_nak = 1, nak = 3 };  // syndrome bits 6-5

enum class NakCode : std::uint8_t {
  psn_sequence_error = 0,
  invalid_request = 1,
  remote_access_error = 2,
  remote_operational_error = 3,
  invalid_rd_request = 4,  // RD only; decoded, never sent by an RC responder
};

inline constexpr std::uint8_t kNoCreditInformation = 31;  // credit code "no credit count"
inline constexpr std::uint8_t kMaxAethValue = 31;         // 5-bit credit / timer / NAK field

struct Aeth {
  AethKind kind = AethKind::ack;
  std::uint8_t value = kNoCreditInformation;  // credit code, RNR timer code or NakCode
  std::uint32_t msn = 0;                      // 24 bits

  static constexpr Aeth ack(std::uint8_t credit_code, std::uint32_t msn) { return {AethKind::ack, credit_code, msn}; }
  static constexpr Aeth rnr_nak(std::uint8_t timer_code, std::uint32_t msn) {
    return {AethKind::rnr_nak, timer_code, msn};
  }
  static constexpr Aeth nak(NakCode code, std::uint32_t msn) {
    return {AethKind::nak, static_cast<std::uint8_t>(code), msn};
  }
  NakCode nak_code() const { return static_cast<NakCode>(value); }
  std::uint8_t syndrome() const {
    return static_cast<std::uint8_t>((static_cast<std::uint8_t>(kind) << 5) | (value & kMaxAethValue));
  }

  bool operator==(const Aeth&) const = default;
};

// Fails with roce_bad_aeth for the reserved syndrome type 10 and NAK codes 5-31; the top
// syndrome bit is reserved and ignored.
Result<Aeth, WireError> decode_aeth(std::span<const std::uint8_t, kAethSize> bytes);
// Fails with roce_field_out_of_range for a value above 31 or an MSN above 24 bits, and with
// roce_bad_aeth for a reserved NAK code.
Status<WireError> encode_aeth(const Aeth& aeth, std::span<std::uint8_t, kAethSize> out);

// Receive WQEs a credit code grants (0, 1, 2, 3, 4, 6, 8, 12, ... 32768); nullopt for code 31
// (no credit information) and for values above 31.
std::optional<std::uint32_t> credit_count(std::uint8_t credit_code);
// The largest credit code whose count does not exceed `available` WQEs.
std::uint8_t credit_code_for(std::uint32_t available);

// The minimum RNR NAK timer of a timer code, in microseconds (code 0 is 655.36 ms, the
// longest); 0 for values above 31.
std::uint32_t rnr_timer_us(std::uint8_t timer_code);

}  // namespace peercm::wire::roce
