// GIDs on RoCEv2 are IP addresses (roce-ibcm-wire.md §1.1): an IPv6 address as is, an IPv4
// address as the IPv4-mapped IPv6 address ::ffff:a.b.c.d (RFC 4291 §2.5.5.2).
#pragma once

#include <array>
#include <cstdint>
#include <optional>

namespace peercm::wire::ibcm {

using Gid = std::array<std::uint8_t, 16>;
using Ipv4Address = std::array<std::uint8_t, 4>;

constexpr Gid ipv4_mapped_gid(const Ipv4Address& address) {
  Gid gid{};
  gid[10] = 0xFF;
  gid[11] = 0xFF;
  for (std::size_t i = 0; i < 4; ++i) gid[12 + i] = address[i];
  return gid;
}

constexpr bool is_ipv4_mapped(const Gid& gid) {
  for (std::size_t i = 0; i < 10; ++i)
    if (gid[i] != 0) return false;
  return gid[10] == 0xFF && gid[11] == 0xFF;
}

// The IPv4 address of an IPv4-mapped GID; nullopt for any other GID.
constexpr std::optional<Ipv4Address> ipv4_of_gid(const Gid& gid) {
  if (!is_ipv4_mapped(gid)) return std::nullopt;
  return Ipv4Address{gid[12], gid[13], gid[14], gid[15]};
}

}  // namespace peercm::wire::ibcm
