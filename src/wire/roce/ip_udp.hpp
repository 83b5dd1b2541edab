// The IPv4 / IPv6 and UDP headers around a RoCEv2 packet (RFC 791, RFC 8200, RFC 768;
// roce-ibcm-wire.md §1.1), for receivers that see whole IP datagrams (raw or packet sockets,
// captures): they yield the UDP payload and the fields the ICRC covers, including the IPv4
// identification that a UDP socket hides (§1.5).
#pragma once

#include <cstdint>
#include <span>

#include "peercm/result.hpp"
#include "wire/roce/icrc.hpp"
#include "wire/wire_error.hpp"

namespace peercm::wire::roce {

struct IpUdpDatagram {
  IcrcPseudoHeader pseudo;
  std::uint8_t traffic_class = 0;  // IPv4 ToS / IPv6 traffic class (DSCP << 2 | ECN)
  std::uint8_t hop_limit = 0;      // IPv4 TTL / IPv6 hop limit
  std::uint32_t flow_label = 0;    // IPv6 only
  std::span<const std::uint8_t> udp_payload;  // points into the datagram
};

// Decodes an IPv4 (no options, not a fragment) or IPv6 (no extension headers) datagram
// carrying UDP. Bytes after the IP length (Ethernet minimum-frame fill) are ignored.
// Fails with truncated, or with roce_bad_ip_header when the headers are not of that form or
// their lengths disagree. Checksums are not checked (the ICRC covers what matters).
Result<IpUdpDatagram, WireError> decode_ip_udp(std::span<const std::uint8_t> datagram);

}  // namespace peercm::wire::roce
