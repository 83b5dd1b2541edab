// Independent references for the RoCEv2 tests: a bit-at-a-time CRC-32 (not ISA-L), builders
// of whole IPv4/IPv6 + UDP datagrams, and the ICRC computed the way roce-ibcm-wire.md §1.4
// describes it — by masking a copy of the whole datagram — rather than by rebuilding the
// headers from fields as the codec does.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace peercm::wire::test {

using Bytes = std::vector<std::uint8_t>;

// CRC-32, reflected polynomial 0xEDB88320, preset and final complement (zlib's crc32()),
// continuing from `crc` (0 to start).
inline std::uint32_t reference_crc32(std::span<const std::uint8_t> bytes, std::uint32_t crc = 0) {
  crc = ~crc;
  for (const std::uint8_t b : bytes) {
    crc ^= b;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ ((crc & 1u) ? 0xEDB88320u : 0u);
  }
  return ~crc;
}

// Big-endian store into a fixed header (the headers are built in std::array, whose storage
// the optimizer knows to be non-null, then copied into the datagram).
template <std::size_t N>
void put16(std::array<std::uint8_t, N>& b, std::size_t at, std::uint16_t v) {
  b[at] = static_cast<std::uint8_t>(v >> 8);
  b[at + 1] = static_cast<std::uint8_t>(v);
}

inline void put16(Bytes& b, std::size_t at, std::uint16_t v) {
  if (at + 2 > b.size()) return;
  b.at(at) = static_cast<std::uint8_t>(v >> 8);
  b.at(at + 1) = static_cast<std::uint8_t>(v);
}

template <std::size_t N>
Bytes join(const std::array<std::uint8_t, N>& header, std::span<const std::uint8_t> payload) {
  Bytes d(header.begin(), header.end());
  d.insert(d.end(), payload.begin(), payload.end());
  return d;
}

struct Ipv4Shape {
  std::array<std::uint8_t, 4> source{};
  std::array<std::uint8_t, 4> destination{};
  std::uint8_t tos = 0;
  std::uint16_t identification = 0;
  std::uint16_t flags_fragment = 0x4000;
  std::uint8_t ttl = 64;
  std::uint16_t header_checksum = 0;  // not computed: the ICRC masks it
  std::uint16_t source_port = 0xC000;
  std::uint16_t destination_port = 4791;
  std::uint16_t udp_checksum = 0;
};

// IPv4 header | UDP header | udp_payload.
inline Bytes ipv4_datagram(const Ipv4Shape& s, std::span<const std::uint8_t> udp_payload) {
  std::array<std::uint8_t, 28> h{};
  h[0] = 0x45;
  h[1] = s.tos;
  put16(h, 2, static_cast<std::uint16_t>(28 + udp_payload.size()));
  put16(h, 4, s.identification);
  put16(h, 6, s.flags_fragment);
  h[8] = s.ttl;
  h[9] = 17;
  put16(h, 10, s.header_checksum);
  for (std::size_t i = 0; i < 4; ++i) {
    h[12 + i] = s.source[i];
    h[16 + i] = s.destination[i];
  }
  put16(h, 20, s.source_port);
  put16(h, 22, s.destination_port);
  put16(h, 24, static_cast<std::uint16_t>(8 + udp_payload.size()));
  put16(h, 26, s.udp_checksum);
  return join(h, udp_payload);
}

struct Ipv6Shape {
  std::array<std::uint8_t, 16> source{};
  std::array<std::uint8_t, 16> destination{};
  std::uint8_t traffic_class = 0;
  std::uint32_t flow_label = 0;
  std::uint8_t hop_limit = 64;
  std::uint16_t source_port = 0xC000;
  std::uint16_t destination_port = 4791;
  std::uint16_t udp_checksum = 0;
};

inline Bytes ipv6_datagram(const Ipv6Shape& s, std::span<const std::uint8_t> udp_payload) {
  std::array<std::uint8_t, 48> h{};
  const std::uint32_t word0 = (6u << 28) | (std::uint32_t{s.traffic_class} << 20) | (s.flow_label & 0xFFFFF);
  for (std::size_t i = 0; i < 4; ++i) h[i] = static_cast<std::uint8_t>(word0 >> (24 - 8 * i));
  put16(h, 4, static_cast<std::uint16_t>(8 + udp_payload.size()));
  h[6] = 17;
  h[7] = s.hop_limit;
  for (std::size_t i = 0; i < 16; ++i) {
    h[8 + i] = s.source[i];
    h[24 + i] = s.destination[i];
  }
  put16(h, 40, s.source_port);
  put16(h, 42, s.destination_port);
  put16(h, 44, static_cast<std::uint16_t>(8 + udp_payload.size()));
  put16(h, 46, s.udp_checksum);
  return join(h, udp_payload);
}

// roce-ibcm-wire.md §1.4 steps 1-4 over a whole datagram (IPv4 without options, or IPv6)
// whose last 4 bytes are the ICRC: copy the IP, UDP and BTH headers, overwrite the variant
// fields with ones, prepend eight 0xFF bytes, CRC the lot and the rest of the datagram.
inline std::uint32_t reference_icrc(std::span<const std::uint8_t> datagram) {
  const bool v4 = !datagram.empty() && (datagram[0] >> 4) == 4;
  const std::size_t ip = v4 ? 20 : 40;
  const std::size_t headers = ip + 8 + 12;
  if (datagram.size() < headers + 4) return 0;
  std::array<std::uint8_t, 8 + 40 + 8 + 12> m{};
  for (std::size_t i = 0; i < 8; ++i) m[i] = 0xFF;
  for (std::size_t i = 0; i < headers; ++i) m[8 + i] = datagram[i];
  std::uint8_t* p = m.data() + 8;
  if (v4) {
    p[1] = 0xFF;   // ToS
    p[8] = 0xFF;   // TTL
    p[10] = 0xFF;  // header checksum
    p[11] = 0xFF;
  } else {
    p[0] |= 0x0F;  // traffic class, flow label
    p[1] = 0xFF;
    p[2] = 0xFF;
    p[3] = 0xFF;
    p[7] = 0xFF;   // hop limit
  }
  p[ip + 6] = 0xFF;  // UDP checksum
  p[ip + 7] = 0xFF;
  p[ip + 8 + 4] = 0xFF;  // BTH: FECN, BECN, reserved
  const std::uint32_t crc = reference_crc32(std::span(m).first(8 + headers));
  return reference_crc32(datagram.subspan(headers, datagram.size() - headers - 4), crc);
}

// The ICRC bytes as they go on the wire: least-significant byte first.
inline std::array<std::uint8_t, 4> icrc_bytes(std::uint32_t icrc) {
  return {static_cast<std::uint8_t>(icrc), static_cast<std::uint8_t>(icrc >> 8), static_cast<std::uint8_t>(icrc >> 16),
          static_cast<std::uint8_t>(icrc >> 24)};
}

}  // namespace peercm::wire::test
