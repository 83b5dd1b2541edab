#include "wire/roce/icrc.hpp"

#include <isa-l/crc.h>

#include <algorithm>
#include <cstring>

#include "wire/byte_io.hpp"
#include "wire/vector_state.hpp"

namespace peercm::wire::roce {
namespace {

constexpr std::uint8_t kIpProtocolUdp = 17;
constexpr std::size_t kLrhStandIn = 8;  // §1.4 step 3: eight 0xFF bytes in place of the LRH
constexpr std::size_t kMaxPseudoSize = kLrhStandIn + kIpv6HeaderSize + kUdpHeaderSize + kBthSize;
constexpr std::size_t kMaxIpPayload = 0xFFFF;

// §1.4 step 2, IPv4: ToS (byte 1), TTL (byte 8) and the header checksum are masked; version,
// IHL, total length, identification, flags, fragment offset, protocol and addresses are not.
std::size_t masked_ipv4(const Ipv4IcrcFields& f, std::size_t udp_length, std::uint8_t* p) {
  p[0] = 0x45;  // version 4, IHL 5: RoCEv2 sends no IP options
  p[1] = 0xFF;
  store_be16(p + 2, static_cast<std::uint16_t>(kIpv4HeaderSize + udp_length));
  store_be16(p + 4, f.identification);
  store_be16(p + 6, f.flags_fragment);
  p[8] = 0xFF;
  p[9] = kIpProtocolUdp;
  p[10] = 0xFF;
  p[11] = 0xFF;
  std::memcpy(p + 12, f.source.data(), 4);
  std::memcpy(p + 16, f.destination.data(), 4);
  return kIpv4HeaderSize;
}

// §1.4 step 2, IPv6: traffic class and flow label (the 28 bits after the version) and the
// hop limit are masked; payload length, next header and addresses are not.
std::size_t masked_ipv6(const Ipv6IcrcFields& f, std::size_t udp_length, std::uint8_t* p) {
  p[0] = 0x6F;
  p[1] = 0xFF;
  p[2] = 0xFF;
  p[3] = 0xFF;
  store_be16(p + 4, static_cast<std::uint16_t>(udp_length));
  p[6] = kIpProtocolUdp;
  p[7] = 0xFF;
  std::memcpy(p + 8, f.source.data(), 16);
  std::memcpy(p + 24, f.destination.data(), 16);
  return kIpv6HeaderSize;
}

}  // namespace

std::uint32_t crc32_ethernet(std::span<const std::uint8_t> bytes, std::uint32_t crc) {
  // crc32_gzip_refl is ISA-L's reflected CRC-32 (0xEDB88320) with zlib's pre/post inversion;
  // crc32_ieee is the non-reflected variant and does not match (checked in the tests).
  const std::uint32_t result = crc32_gzip_refl(crc, bytes.data(), bytes.size());
  leave_vector_kernel();
  return result;
}

Result<Icrc, WireError> Icrc::begin(const IcrcPseudoHeader& pseudo, std::size_t udp_payload_length,
                                    std::span<const std::uint8_t, kBthSize> bth) {
  if (udp_payload_length < kBthSize + kIcrcSize) return fail(WireError::roce_bad_length);
  const std::size_t udp_length = kUdpHeaderSize + udp_payload_length;
  const bool v4 = std::holds_alternative<Ipv4IcrcFields>(pseudo.ip);
  // IPv4 total length counts its own header; IPv6 payload length does not.
  if (udp_length + (v4 ? kIpv4HeaderSize : 0) > kMaxIpPayload) return fail(WireError::roce_bad_length);

  std::array<std::uint8_t, kMaxPseudoSize> buffer{};
  std::uint8_t* p = buffer.data();
  std::memset(p, 0xFF, kLrhStandIn);
  std::size_t at = kLrhStandIn;
  at += v4 ? masked_ipv4(std::get<Ipv4IcrcFields>(pseudo.ip), udp_length, p + at)
           : masked_ipv6(std::get<Ipv6IcrcFields>(pseudo.ip), udp_length, p + at);
  store_be16(p + at, pseudo.udp_source_port);
  store_be16(p + at + 2, pseudo.udp_destination_port);
  store_be16(p + at + 4, static_cast<std::uint16_t>(udp_length));
  store_be16(p + at + 6, 0xFFFF);  // UDP checksum, masked
  at += kUdpHeaderSize;
  std::copy(bth.begin(), bth.end(), p + at);
  p[at + kBthVariantByte] = 0xFF;  // FECN, BECN and six reserved bits, masked
  at += kBthSize;

  Icrc icrc;
  icrc.crc_ = crc32_ethernet(std::span(buffer).first(at));
  return icrc;
}

void Icrc::update(std::span<const std::uint8_t> bytes) { crc_ = crc32_ethernet(bytes, crc_); }

Result<std::uint32_t, WireError> compute_icrc(const IcrcPseudoHeader& pseudo,
                                              std::span<const std::uint8_t> udp_payload) {
  if (udp_payload.size() < kBthSize + kIcrcSize) return fail(WireError::truncated);
  auto icrc = Icrc::begin(pseudo, udp_payload.size(), udp_payload.first<kBthSize>());
  if (!icrc) return fail(icrc.error());
  icrc->update(udp_payload.subspan(kBthSize, udp_payload.size() - kBthSize - kIcrcSize));
  return icrc->finish();
}

Status<WireError> verify_icrc(const IcrcPseudoHeader& pseudo, std::span<const std::uint8_t> udp_payload) {
  auto computed = compute_icrc(pseudo, udp_payload);
  if (!computed) return fail(computed.error());
  if (*computed != load_icrc(udp_payload.last<kIcrcSize>())) return fail(WireError::roce_bad_icrc);
  return {};
}

std::uint32_t load_icrc(std::span<const std::uint8_t, kIcrcSize> b) {
  return std::uint32_t{b[0]} | (std::uint32_t{b[1]} << 8) | (std::uint32_t{b[2]} << 16) | (std::uint32_t{b[3]} << 24);
}

void store_icrc(std::uint32_t icrc, std::span<std::uint8_t, kIcrcSize> out) {
  for (std::size_t i = 0; i < kIcrcSize; ++i) out[i] = static_cast<std::uint8_t>(icrc >> (8 * i));
}

}  // namespace peercm::wire::roce
