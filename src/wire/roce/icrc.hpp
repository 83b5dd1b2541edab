// The RoCEv2 invariant CRC (IBTA Vol 1 ICRC, Annex A17; roce-ibcm-wire.md §1.4): the
// Ethernet CRC-32 over 8 bytes of 0xFF (standing in for the LRH), the IP and UDP headers and
// the BTH with every field that may change in flight set to ones, then the rest of the
// packet up to the last pad byte. It travels least-significant byte first.
//
// The IP and UDP headers are not part of the UDP payload a socket sees, so the caller gives
// the covered fields that its packets carry: the addresses and, on IPv4, identification and
// flags/fragment offset. ToS/traffic class, TTL/hop limit, IPv6 flow label and both
// checksums are masked; lengths follow from the UDP payload length.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <variant>

#include "peercm/result.hpp"
#include "wire/roce/bth.hpp"
#include "wire/wire_error.hpp"

namespace peercm::wire::roce {

inline constexpr std::uint16_t kRoceUdpPort = 4791;  // IANA "roce" (Annex A17)
inline constexpr std::size_t kIcrcSize = 4;
inline constexpr std::size_t kIpv4HeaderSize = 20;
inline constexpr std::size_t kIpv6HeaderSize = 40;
inline constexpr std::size_t kUdpHeaderSize = 8;
inline constexpr std::uint16_t kIpv4DontFragment = 0x4000;  // flags/fragment-offset word, DF set

// The IPv4 fields the ICRC covers beyond addresses. A UDP socket does not report them on
// receive (§1.5): between peercm stacks they are fixed by the sender (unconnected socket,
// IP_PMTUDISC_DO: ID 0, DF), and the receiver verifies with the same values.
struct Ipv4IcrcFields {
  std::array<std::uint8_t, 4> source{};
  std::array<std::uint8_t, 4> destination{};
  std::uint16_t identification = 0;
  std::uint16_t flags_fragment = kIpv4DontFragment;
  bool operator==(const Ipv4IcrcFields&) const = default;
};

struct Ipv6IcrcFields {
  std::array<std::uint8_t, 16> source{};
  std::array<std::uint8_t, 16> destination{};
  bool operator==(const Ipv6IcrcFields&) const = default;
};

// What the ICRC covers outside the UDP payload.
struct IcrcPseudoHeader {
  std::variant<Ipv4IcrcFields, Ipv6IcrcFields> ip;
  std::uint16_t udp_source_port = 0;
  std::uint16_t udp_destination_port = kRoceUdpPort;
  bool operator==(const IcrcPseudoHeader&) const = default;
};

// Incremental ICRC for a packet sent from several buffers (headers, then payload pieces,
// then pad): begin() with the masked IP/UDP headers and the BTH, update() with every byte
// after the BTH up to the last pad byte, finish().
class Icrc {
 public:
  // `udp_payload_length` counts BTH through ICRC; fails with roce_bad_length when it is
  // below BTH + ICRC or the IP length fields cannot hold it.
  static Result<Icrc, WireError> begin(const IcrcPseudoHeader& pseudo, std::size_t udp_payload_length,
                                       std::span<const std::uint8_t, kBthSize> bth);
  void update(std::span<const std::uint8_t> bytes);
  std::uint32_t finish() const { return crc_; }

 private:
  Icrc() = default;
  std::uint32_t crc_ = 0;  // zlib convention: the finished CRC of the bytes so far
};

// ICRC of a whole UDP payload (`udp_payload` includes the 4-byte ICRC field, not read).
// Fails with truncated below BTH + ICRC, roce_bad_length when the IP length cannot hold it.
Result<std::uint32_t, WireError> compute_icrc(const IcrcPseudoHeader& pseudo,
                                              std::span<const std::uint8_t> udp_payload);
// Fails with roce_bad_icrc when the last four bytes do not hold the ICRC of the rest.
Status<WireError> verify_icrc(const IcrcPseudoHeader& pseudo, std::span<const std::uint8_t> udp_payload);

// The ICRC field is little-endian on the wire, unlike every other field (§1.4 step 5).
std::uint32_t load_icrc(std::span<const std::uint8_t, kIcrcSize> bytes);
void store_icrc(std::uint32_t icrc, std::span<std::uint8_t, kIcrcSize> out);

// Standard reflected CRC-32 (Ethernet, zlib), continuing from `crc` (0 to start), by ISA-L.
std::uint32_t crc32_ethernet(std::span<const std::uint8_t> bytes, std::uint32_t crc = 0);

}  // namespace peercm::wire::roce
