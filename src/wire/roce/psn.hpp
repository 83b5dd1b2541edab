// 24-bit packet sequence number arithmetic (IBTA Vol 1 ch. 9; roce-ibcm-wire.md §2.4).
// PSNs wrap modulo 2^24; two PSNs compare by their signed 24-bit difference, so at most
// 2^23 PSNs may be outstanding for "ahead" and "behind" to stay unambiguous.
#pragma once

#include <cstdint>

namespace peercm::wire::roce {

inline constexpr std::uint32_t kPsnModulus = 0x01000000;
inline constexpr std::uint32_t kPsnMask = kPsnModulus - 1;
// Half the PSN space: a PSN fewer than this many ahead is ahead, one this many or more is
// behind (§2.4).
inline constexpr std::uint32_t kPsnWindow = kPsnModulus / 2;

constexpr std::uint32_t psn_add(std::uint32_t psn, std::uint32_t n) { return (psn + n) & kPsnMask; }
constexpr std::uint32_t psn_next(std::uint32_t psn) { return psn_add(psn, 1); }
constexpr std::uint32_t psn_sub(std::uint32_t psn, std::uint32_t n) { return (psn - n) & kPsnMask; }

// Signed distance from b to a in [-2^23, 2^23): positive when a is ahead of b. Shifting the
// 24-bit difference into the top of a 32-bit word lets the sign bit do the wrap (rxe's
// psn_compare); C++20 makes the conversion and arithmetic shift well defined.
constexpr std::int32_t psn_diff(std::uint32_t a, std::uint32_t b) {
  return static_cast<std::int32_t>((a - b) << 8) >> 8;
}
constexpr bool psn_before(std::uint32_t a, std::uint32_t b) { return psn_diff(a, b) < 0; }
constexpr bool psn_after(std::uint32_t a, std::uint32_t b) { return psn_diff(a, b) > 0; }

// Unsigned forward distance from `from` to `to`, modulo 2^24.
constexpr std::uint32_t psn_distance(std::uint32_t from, std::uint32_t to) { return (to - from) & kPsnMask; }

// Whether `psn` lies in the `count` PSNs starting at `first` (a READ's response range, §2.9).
constexpr bool psn_in_range(std::uint32_t psn, std::uint32_t first, std::uint32_t count) {
  return psn_distance(first, psn) < count;
}

// How a responder classifies an incoming request PSN against its expected PSN (§2.4).
enum class PsnOrder : std::uint8_t {
  expected,   // PSN = ePSN: a new request
  ahead,      // 0 < d < 2^23: a gap; PSN sequence error NAK
  duplicate,  // -2^23 <= d < 0: already seen (§2.10)
};

constexpr PsnOrder classify_psn(std::uint32_t psn, std::uint32_t expected) {
  const std::int32_t d = psn_diff(psn, expected);
  if (d == 0) return PsnOrder::expected;
  return d > 0 ? PsnOrder::ahead : PsnOrder::duplicate;
}

}  // namespace peercm::wire::roce
