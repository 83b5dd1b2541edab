// Sub-byte and 24-bit field access for the CM layouts, which give a field as (byte, MSB-first
// starting bit, width): the IBTA's Byte[Bit] notation (roce-ibcm-wire.md conventions).
#pragma once

#include <cstdint>

namespace peercm::wire::ibcm::detail {

constexpr std::uint8_t field_mask(unsigned width) { return static_cast<std::uint8_t>((1u << width) - 1); }

// The `width`-bit field starting at MSB-first bit `bit` of `byte`.
constexpr std::uint8_t get_bits(std::uint8_t byte, unsigned bit, unsigned width) {
  return static_cast<std::uint8_t>((byte >> (8 - bit - width)) & field_mask(width));
}
// `value` placed at MSB-first bit `bit`, to be ORed into a byte; callers check the width.
constexpr std::uint8_t put_bits(unsigned value, unsigned bit, unsigned width) {
  return static_cast<std::uint8_t>((value & field_mask(width)) << (8 - bit - width));
}
constexpr bool fits(std::uint32_t value, unsigned width) { return (value >> width) == 0; }

inline std::uint32_t load_be24(const std::uint8_t* p) {
  return (std::uint32_t{p[0]} << 16) | (std::uint32_t{p[1]} << 8) | std::uint32_t{p[2]};
}
inline void store_be24(std::uint8_t* p, std::uint32_t v) {
  p[0] = static_cast<std::uint8_t>(v >> 16);
  p[1] = static_cast<std::uint8_t>(v >> 8);
  p[2] = static_cast<std::uint8_t>(v);
}

}  // namespace peercm::wire::ibcm::detail
