#include "wire/roce/ip_udp.hpp"

#include <algorithm>

#include "wire/byte_io.hpp"

namespace peercm::wire::roce {
namespace {

constexpr std::uint8_t kIpProtocolUdp = 17;
constexpr std::uint16_t kMoreFragments = 0x2000;
constexpr std::uint16_t kFragmentOffsetMask = 0x1FFF;

Status<WireError> decode_udp(std::span<const std::uint8_t> udp, IpUdpDatagram& out) {
  if (udp.size() < kUdpHeaderSize) return fail(WireError::roce_bad_ip_header);
  // RFC 768: the UDP length must agree with what the IP header delimited.
  if (load_be16(udp.data() + 4) != udp.size()) return fail(WireError::roce_bad_ip_header);
  out.pseudo.udp_source_port = load_be16(udp.data());
  out.pseudo.udp_destination_port = load_be16(udp.data() + 2);
  out.udp_payload = udp.subspan(kUdpHeaderSize);
  return {};
}

Result<IpUdpDatagram, WireError> decode_ipv4(std::span<const std::uint8_t> d) {
  if (d.size() < kIpv4HeaderSize) return fail(WireError::truncated);
  const std::uint8_t* p = d.data();
  // RoCEv2 senders use no IP options; the ICRC's masked header is exactly 20 bytes.
  if ((p[0] & 0x0F) != kIpv4HeaderSize / 4) return fail(WireError::roce_bad_ip_header);
  if (p[9] != kIpProtocolUdp) return fail(WireError::roce_bad_ip_header);
  const std::uint16_t flags_fragment = load_be16(p + 6);
  // §1.5: RoCEv2 datagrams are never fragmented, and a fragment's UDP payload is partial.
  if ((flags_fragment & (kMoreFragments | kFragmentOffsetMask)) != 0) return fail(WireError::roce_bad_ip_header);
  const std::size_t total_length = load_be16(p + 2);
  if (total_length < kIpv4HeaderSize) return fail(WireError::roce_bad_ip_header);
  if (total_length > d.size()) return fail(WireError::truncated);
  IpUdpDatagram out;
  Ipv4IcrcFields fields{.identification = load_be16(p + 4), .flags_fragment = flags_fragment};
  std::copy_n(p + 12, 4, fields.source.begin());
  std::copy_n(p + 16, 4, fields.destination.begin());
  out.pseudo.ip = fields;
  out.traffic_class = p[1];
  out.hop_limit = p[8];
  if (auto ok = decode_udp(d.subspan(kIpv4HeaderSize, total_length - kIpv4HeaderSize), out); !ok)
    return fail(ok.error());
  return out;
}

Result<IpUdpDatagram, WireError> decode_ipv6(std::span<const std::uint8_t> d) {
  if (d.size() < kIpv6HeaderSize) return fail(WireError::truncated);
  const std::uint8_t* p = d.data();
  // RoCEv2 puts UDP right after the fixed header (RFC 8200 §4: no extension headers here).
  if (p[6] != kIpProtocolUdp) return fail(WireError::roce_bad_ip_header);
  const std::size_t payload_length = load_be16(p + 4);
  if (kIpv6HeaderSize + payload_length > d.size()) return fail(WireError::truncated);
  IpUdpDatagram out;
  Ipv6IcrcFields fields;
  std::copy_n(p + 8, 16, fields.source.begin());
  std::copy_n(p + 24, 16, fields.destination.begin());
  out.pseudo.ip = fields;
  const std::uint32_t word0 = load_be32(p);
  out.traffic_class = static_cast<std::uint8_t>(word0 >> 20);
  out.flow_label = word0 & 0x000FFFFF;
  out.hop_limit = p[7];
  if (auto ok = decode_udp(d.subspan(kIpv6HeaderSize, payload_length), out); !ok) return fail(ok.error());
  return out;
}

}  // namespace

Result<IpUdpDatagram, WireError> decode_ip_udp(std::span<const std::uint8_t> datagram) {
  if (datagram.empty()) return fail(WireError::truncated);
  switch (datagram[0] >> 4) {
    case 4: return decode_ipv4(datagram);
    case 6: return decode_ipv6(datagram);
    default: return fail(WireError::roce_bad_ip_header);
  }
}

}  // namespace peercm::wire::roce
