// What every IB CM message shares (IBTA Vol 1 ch. 12; roce-ibcm-wire.md §4.1-4.2): the
// attribute IDs, the 232-byte message area after the MAD header, the private data sizes and
// the 4.096 µs × 2^n timeout encoding.
#pragma once

#include <cstddef>
#include <cstdint>

#include "wire/ibcm/mad.hpp"

namespace peercm::wire::ibcm {

enum class CmAttribute : std::uint16_t {
  class_port_info = 0x0001,
  req = 0x0010,
  mra = 0x0011,
  rej = 0x0012,
  rep = 0x0013,
  rtu = 0x0014,
  dreq = 0x0015,
  drep = 0x0016,
  sidr_req = 0x0017,
  sidr_rep = 0x0018,
  lap = 0x0019,
  apr = 0x001A,
};

inline constexpr std::size_t kCmMessageSize = kMadDataSize;

// Private data bytes per message (§4.5).
inline constexpr std::size_t kReqPrivateDataSize = 92;
inline constexpr std::size_t kMraPrivateDataSize = 222;
inline constexpr std::size_t kRejPrivateDataSize = 148;
inline constexpr std::size_t kRepPrivateDataSize = 196;
inline constexpr std::size_t kRtuPrivateDataSize = 224;
inline constexpr std::size_t kDreqPrivateDataSize = 220;
inline constexpr std::size_t kDrepPrivateDataSize = 224;

// CM response timeouts, the MRA service timeout, the REP target ACK delay and the path's
// local ACK timeout are 5-bit exponents of 4.096 µs (§4.6).
inline constexpr std::uint8_t kMaxTimeoutExponent = 31;
constexpr std::uint64_t timeout_ns(std::uint8_t exponent) {
  return std::uint64_t{4096} << (exponent & kMaxTimeoutExponent);
}

}  // namespace peercm::wire::ibcm
