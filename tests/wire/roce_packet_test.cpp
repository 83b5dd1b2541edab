// RoCEv2 packets and the ICRC: the ConnectX-4 Lx vector of roce-ibcm-wire.md §1.4, the
// choice of ISA-L function, IPv6, which bits the ICRC masks and which it covers (one flipped
// bit anywhere else is detected), and whole packets of every shape encoded to hand-written
// bytes and decoded back.
#include <gtest/gtest.h>
#include <isa-l/crc.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "hex_bytes.hpp"
#include "roce_reference.hpp"
#include "wire/roce/icrc.hpp"
#include "wire/roce/ip_udp.hpp"
#include "wire/roce/packet.hpp"

namespace peercm::wire::roce {
namespace {

using test::Bytes;
using test::hex;

// roce-ibcm-wire.md §1.4: IPv4 header through ICRC of a CNP captured from a ConnectX-4 Lx.
const Bytes kCnpDatagram = hex(
    "45c2 003c 718c 4000 4011 9161 0a00 1101 0a00 1201"
    "0000 12b7 0028 0000"
    "8100 ffff 4000 0118 0000 0000"
    "0000 0000 0000 0000 0000 0000 0000 0000"
    "82fd 002a");

Bytes udp_payload_of(const Bytes& datagram, std::size_t ip_header = kIpv4HeaderSize) {
  return Bytes(datagram.begin() + static_cast<std::ptrdiff_t>(ip_header + kUdpHeaderSize), datagram.end());
}

IcrcPseudoHeader cnp_pseudo() {
  return IcrcPseudoHeader{
      .ip = Ipv4IcrcFields{.source = {10, 0, 17, 1}, .destination = {10, 0, 18, 1}, .identification = 0x718C,
                           .flags_fragment = 0x4000},
      .udp_source_port = 0,
      .udp_destination_port = 4791};
}

// ---------------------------------------------------------------------------------------
// ICRC known answers

TEST(Icrc, ReproducesTheConnectX4CnpVector) {
  const Bytes udp = udp_payload_of(kCnpDatagram);
  const auto icrc = compute_icrc(cnp_pseudo(), udp);
  ASSERT_TRUE(icrc.has_value());
  EXPECT_EQ(*icrc, 0x2A00FD82u);  // "82fd 002a" read least-significant byte first
  EXPECT_TRUE(verify_icrc(cnp_pseudo(), udp).has_value());
  EXPECT_EQ(load_icrc(std::span(udp).last<kIcrcSize>()), 0x2A00FD82u);
  // The test's own masking of the whole datagram and bitwise CRC agree.
  EXPECT_EQ(test::reference_icrc(kCnpDatagram), 0x2A00FD82u);
}

TEST(Icrc, TheVectorProvesTheIdentificationIsCoveredNotMasked) {
  IcrcPseudoHeader pseudo = cnp_pseudo();
  std::get<Ipv4IcrcFields>(pseudo.ip).identification = 0xFFFF;
  const auto icrc = compute_icrc(pseudo, udp_payload_of(kCnpDatagram));
  ASSERT_TRUE(icrc.has_value());
  EXPECT_NE(*icrc, 0x2A00FD82u);
  pseudo = cnp_pseudo();
  std::get<Ipv4IcrcFields>(pseudo.ip).flags_fragment = 0xFFFF;
  EXPECT_NE(*compute_icrc(pseudo, udp_payload_of(kCnpDatagram)), 0x2A00FD82u);
}

TEST(Icrc, IsaLGzipReflectedIsTheEthernetCrcAndIeeeIsNot) {
  const Bytes check = {'1', '2', '3', '4', '5', '6', '7', '8', '9'};
  EXPECT_EQ(crc32_ethernet(check), 0xCBF43926u);  // CRC-32/ISO-HDLC check value
  EXPECT_EQ(test::reference_crc32(check), 0xCBF43926u);
  EXPECT_NE(crc32_ieee(0, check.data(), check.size()), 0xCBF43926u);
  // rxe seeds its CRC with the register after eight 0xFF bytes (§1.4 step 4).
  const Bytes lrh(8, 0xFF);
  EXPECT_EQ(~crc32_ethernet(lrh), 0xDEBB20E3u);
  // Continuing a CRC equals computing it over the concatenation.
  Bytes joined = lrh;
  joined.insert(joined.end(), check.begin(), check.end());
  EXPECT_EQ(crc32_ethernet(check, crc32_ethernet(lrh)), crc32_ethernet(joined));
}

TEST(Icrc, StoredLeastSignificantByteFirst) {
  std::array<std::uint8_t, kIcrcSize> out{};
  store_icrc(0x2A00FD82, out);
  EXPECT_EQ(Bytes(out.begin(), out.end()), hex("82fd002a"));
}

TEST(Icrc, IncrementalEqualsWhole) {
  const Bytes udp = udp_payload_of(kCnpDatagram);
  auto icrc = Icrc::begin(cnp_pseudo(), udp.size(), std::span(udp).first<kBthSize>());
  ASSERT_TRUE(icrc.has_value());
  const std::span<const std::uint8_t> rest = std::span(udp).subspan(kBthSize, udp.size() - kBthSize - kIcrcSize);
  for (std::size_t i = 0; i < rest.size(); i += 3) {
    icrc->update(rest.subspan(i, std::min<std::size_t>(3, rest.size() - i)));
  }
  EXPECT_EQ(icrc->finish(), 0x2A00FD82u);
}

Bytes sample_packet_ipv6(const Ipv6IcrcFields& fields, std::uint16_t sport) {
  PacketHeaders h;
  h.bth = Bth{.opcode = Opcode::rc_send_only, .destination_qp = 0x12, .ack_request = true, .psn = 0xABCDEF};
  const Bytes payload = hex("68656c6c6f");
  Bytes out(packet_size(h.bth.opcode, payload.size()));
  const auto size = encode_packet(h, payload, IcrcPseudoHeader{.ip = fields, .udp_source_port = sport}, out);
  EXPECT_TRUE(size.has_value());
  return out;
}

TEST(Icrc, Ipv6MatchesTheMaskedDatagram) {
  Ipv6IcrcFields fields;
  fields.source = {0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x02, 0x11, 0x22, 0xff, 0xfe, 0x33, 0x44, 0x55};
  fields.destination = {0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x02};
  const Bytes udp = sample_packet_ipv6(fields, 0xC123);
  for (const std::uint8_t tc : {std::uint8_t{0}, std::uint8_t{0xB8}}) {
    for (const std::uint32_t flow : {0u, 0xABCDEu}) {
      for (const std::uint8_t hops : {std::uint8_t{1}, std::uint8_t{64}}) {
        test::Ipv6Shape shape{.source = fields.source, .destination = fields.destination, .traffic_class = tc,
                              .flow_label = flow, .hop_limit = hops, .source_port = 0xC123, .udp_checksum = 0x1234};
        const Bytes datagram = test::ipv6_datagram(shape, udp);
        EXPECT_EQ(test::reference_icrc(datagram), load_icrc(std::span(udp).last<kIcrcSize>()));
        const auto decoded = decode_ip_udp(datagram);
        ASSERT_TRUE(decoded.has_value());
        EXPECT_EQ(decoded->traffic_class, tc);
        EXPECT_EQ(decoded->flow_label, flow);
        EXPECT_EQ(decoded->hop_limit, hops);
        EXPECT_TRUE(verify_icrc(decoded->pseudo, decoded->udp_payload).has_value());
      }
    }
  }
}

// ---------------------------------------------------------------------------------------
// What the ICRC masks and what it covers, bit by bit on the CNP datagram

enum class Region { masked, covered, icrc };

Region region_of(std::size_t offset) {
  switch (offset) {
    case 1:            // ToS
    case 8:            // TTL
    case 10: case 11:  // IPv4 header checksum
    case 26: case 27:  // UDP checksum
    case 32:           // BTH byte 4: FECN, BECN, reserved
      return Region::masked;
    default:
      return offset >= kCnpDatagram.size() - kIcrcSize ? Region::icrc : Region::covered;
  }
}

TEST(Icrc, EveryCoveredBitFlipIsDetectedAndMaskedBitsAreNot) {
  std::size_t detected = 0;
  for (std::size_t at = 0; at < kCnpDatagram.size(); ++at) {
    for (int bit = 0; bit < 8; ++bit) {
      Bytes d = kCnpDatagram;
      d[at] = static_cast<std::uint8_t>(d[at] ^ (1u << bit));
      SCOPED_TRACE("byte " + std::to_string(at) + " bit " + std::to_string(bit));
      // The receiver's view of this datagram, as a raw socket would give it. Flips that break
      // the IP/UDP framing itself are refused before the ICRC is looked at.
      const auto ip = decode_ip_udp(d);
      if (!ip) {
        ASSERT_LT(at, kIpv4HeaderSize + kUdpHeaderSize);
        ++detected;
        continue;
      }
      const auto verdict = verify_icrc(ip->pseudo, ip->udp_payload);
      if (region_of(at) == Region::masked) {
        EXPECT_TRUE(verdict.has_value());
      } else {
        ASSERT_FALSE(verdict.has_value());
        EXPECT_EQ(verdict.error(), WireError::roce_bad_icrc);
        ++detected;
      }
      // The bitwise reference agrees on every verdict.
      EXPECT_EQ(test::reference_icrc(d) == load_icrc(std::span(d).last<kIcrcSize>()),
                region_of(at) == Region::masked);
    }
  }
  EXPECT_EQ(detected, 8 * (kCnpDatagram.size() - 7));
}

TEST(Icrc, UdpSourcePortIsCovered) {
  IcrcPseudoHeader pseudo = cnp_pseudo();
  pseudo.udp_source_port = 0xC000;
  EXPECT_EQ(verify_icrc(pseudo, udp_payload_of(kCnpDatagram)).error(), WireError::roce_bad_icrc);
}

TEST(Icrc, LengthLimits) {
  const Bytes tiny(15, 0);
  EXPECT_EQ(compute_icrc(cnp_pseudo(), tiny).error(), WireError::truncated);
  const Bytes huge(0xFFFF - 28 + 1, 0);  // one byte beyond the IPv4 total length
  EXPECT_EQ(compute_icrc(cnp_pseudo(), huge).error(), WireError::roce_bad_length);
  const Bytes largest(0xFFFF - 28, 0);
  EXPECT_TRUE(compute_icrc(cnp_pseudo(), largest).has_value());
  const IcrcPseudoHeader v6{.ip = Ipv6IcrcFields{}};
  EXPECT_TRUE(compute_icrc(v6, Bytes(0xFFFF - 8, 0)).has_value());  // IPv6 length excludes the header
  EXPECT_EQ(compute_icrc(v6, Bytes(0xFFFF - 7, 0)).error(), WireError::roce_bad_length);
}

// ---------------------------------------------------------------------------------------
// IP / UDP framing

TEST(IpUdp, DecodesTheCnpDatagram) {
  const auto d = decode_ip_udp(kCnpDatagram);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->pseudo, cnp_pseudo());
  EXPECT_EQ(d->traffic_class, 0xC2);
  EXPECT_EQ(d->hop_limit, 64);
  EXPECT_EQ(Bytes(d->udp_payload.begin(), d->udp_payload.end()), udp_payload_of(kCnpDatagram));
  // Ethernet minimum-frame fill after the IP datagram is not UDP payload.
  Bytes padded = kCnpDatagram;
  padded.insert(padded.end(), {0, 0, 0, 0});
  const auto again = decode_ip_udp(padded);
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(again->udp_payload.size(), d->udp_payload.size());
}

// ---------------------------------------------------------------------------------------
// Whole packets

const IcrcPseudoHeader kPseudo{
    .ip = Ipv4IcrcFields{.source = {192, 168, 7, 1}, .destination = {192, 168, 7, 2}},
    .udp_source_port = 0xC00D,
    .udp_destination_port = kRoceUdpPort};

struct PacketCase {
  const char* name;
  PacketHeaders headers;
  Bytes payload;
  const char* expected_without_icrc;  // hand-written from §1.2 and §2.2
};

PacketHeaders with(Opcode op, std::uint32_t psn) {
  PacketHeaders h;
  h.bth.opcode = op;
  h.bth.destination_qp = 0x000111;
  h.bth.psn = psn;
  return h;
}

std::vector<PacketCase> packet_cases() {
  std::vector<PacketCase> cases;
  {
    PacketHeaders h = with(Opcode::rc_send_only, 0x10);
    h.bth.solicited_event = true;
    h.bth.ack_request = true;
    cases.push_back({"send_only_pad_3", h, hex("414243444546474849"),
                     "04 b0 ffff 00 000111 80 000010 | 414243444546474849 000000"});
  }
  {
    PacketHeaders h = with(Opcode::rc_send_only_immediate, 0x11);
    h.immediate = 0xCAFEBABE;
    cases.push_back({"send_only_immediate_empty", h, {}, "05 00 ffff 00 000111 00 000011 | cafebabe"});
  }
  {
    PacketHeaders h = with(Opcode::rc_send_last_invalidate, 0x12);
    h.invalidate_rkey = 0x00A0B0C0;
    cases.push_back({"send_last_invalidate_pad_2", h, hex("0102"),
                     "16 20 ffff 00 000111 00 000012 | 00a0b0c0 | 0102 0000"});
  }
  {
    PacketHeaders h = with(Opcode::rc_rdma_write_first, 0x13);
    h.reth = Reth{.virtual_address = 0x7F0000010000, .r_key = 0x1234, .dma_length = 0x2000};
    cases.push_back({"write_first", h, hex("deadbeef"),
                     "06 00 ffff 00 000111 00 000013 | 00007f0000010000 00001234 00002000 | deadbeef"});
  }
  {
    PacketHeaders h = with(Opcode::rc_rdma_write_only_immediate, 0x14);
    h.reth = Reth{.virtual_address = 1, .r_key = 2, .dma_length = 1};
    h.immediate = 7;
    cases.push_back({"write_only_immediate_pad_3", h, hex("aa"),
                     "0b 30 ffff 00 000111 00 000014 | 0000000000000001 00000002 00000001 | 00000007 | aa000000"});
  }
  {
    PacketHeaders h = with(Opcode::rc_rdma_read_request, 0xFFFFFF);
    h.bth.ack_request = true;
    h.reth = Reth{.virtual_address = 0x1000, .r_key = 0x77, .dma_length = 3000};
    cases.push_back({"read_request", h, {}, "0c 00 ffff 00 000111 80 ffffff | 0000000000001000 00000077 00000bb8"});
  }
  {
    PacketHeaders h = with(Opcode::rc_rdma_read_response_first, 0);
    h.aeth = Aeth::ack(kNoCreditInformation, 3);
    cases.push_back({"read_response_first", h, hex("01020304"),
                     "0d 00 ffff 00 000111 00 000000 | 1f000003 | 01020304"});
  }
  cases.push_back({"read_response_middle", with(Opcode::rc_rdma_read_response_middle, 1), hex("05060708"),
                   "0e 00 ffff 00 000111 00 000001 | 05060708"});
  {
    PacketHeaders h = with(Opcode::rc_acknowledge, 0x20);
    h.aeth = Aeth::nak(NakCode::psn_sequence_error, 0x000042);
    cases.push_back({"nak_sequence_error", h, {}, "11 00 ffff 00 000111 00 000020 | 60000042"});
  }
  {
    PacketHeaders h = with(Opcode::rc_atomic_acknowledge, 0x21);
    h.aeth = Aeth::ack(0, 1);
    h.atomic_ack = AtomicAckEth{0x0102030405060708};
    cases.push_back({"atomic_ack", h, {}, "12 00 ffff 00 000111 00 000021 | 00000001 | 0102030405060708"});
  }
  {
    PacketHeaders h = with(Opcode::rc_compare_swap, 0x22);
    h.atomic = AtomicEth{.virtual_address = 8, .r_key = 9, .swap_or_add_data = 10, .compare_data = 11};
    cases.push_back({"compare_swap", h, {},
                     "13 00 ffff 00 000111 00 000022 | 0000000000000008 00000009 000000000000000a 000000000000000b"});
  }
  {
    PacketHeaders h = with(Opcode::ud_send_only_immediate, 5);
    h.bth.destination_qp = 1;
    h.deth = Deth{.q_key = 0x80010000, .source_qp = 0x000ABC};
    h.immediate = 0x01020304;
    cases.push_back({"ud_send_only_immediate", h, hex("ff"),
                     "65 30 ffff 00 000001 00 000005 | 80010000 00000abc | 01020304 | ff000000"});
  }
  {
    PacketHeaders h = with(Opcode::cnp, 0);
    h.bth.becn = true;
    cases.push_back({"cnp", h, {}, "81 00 ffff 40 000111 00 000000 | 00000000000000000000000000000000"});
  }
  return cases;
}

TEST(Packet, EncodesEveryShapeToTheHandWrittenBytesAndBack) {
  for (const PacketCase& c : packet_cases()) {
    SCOPED_TRACE(c.name);
    const Bytes expected = hex(c.expected_without_icrc);
    Bytes out(packet_size(c.headers.bth.opcode, c.payload.size()));
    ASSERT_EQ(out.size(), expected.size() + kIcrcSize);
    auto size = encode_packet(c.headers, c.payload, kPseudo, out);
    ASSERT_TRUE(size.has_value()) << to_string(size.error());
    ASSERT_EQ(*size, out.size());
    EXPECT_EQ(Bytes(out.begin(), out.end() - kIcrcSize), expected);

    // The ICRC is the one the independent reference computes over the whole datagram.
    const Bytes datagram = test::ipv4_datagram(
        test::Ipv4Shape{.source = {192, 168, 7, 1}, .destination = {192, 168, 7, 2}, .tos = 0x02, .ttl = 9,
                        .header_checksum = 0xBEEF, .source_port = 0xC00D},
        out);
    EXPECT_EQ(test::reference_icrc(datagram), load_icrc(std::span(out).last<kIcrcSize>()));

    auto view = decode_verified_packet(out, kPseudo);
    ASSERT_TRUE(view.has_value()) << to_string(view.error());
    PacketHeaders want = c.headers;
    want.bth.pad_count = static_cast<std::uint8_t>(pad_for(c.payload.size()));
    const std::uint8_t headers = opcode_info(want.bth.opcode).headers;
    EXPECT_EQ(view->headers.bth, want.bth);
    if (headers & ext::kDeth) {
      EXPECT_EQ(view->headers.deth, want.deth);
    }
    if (headers & ext::kReth) {
      EXPECT_EQ(view->headers.reth, want.reth);
    }
    if (headers & ext::kAtomicEth) {
      EXPECT_EQ(view->headers.atomic, want.atomic);
    }
    if (headers & ext::kAeth) {
      EXPECT_EQ(view->headers.aeth, want.aeth);
    }
    if (headers & ext::kAtomicAckEth) {
      EXPECT_EQ(view->headers.atomic_ack, want.atomic_ack);
    }
    if (headers & ext::kImmDt) {
      EXPECT_EQ(view->headers.immediate, want.immediate);
    }
    if (headers & ext::kIeth) {
      EXPECT_EQ(view->headers.invalidate_rkey, want.invalidate_rkey);
    }
    EXPECT_EQ(Bytes(view->payload.begin(), view->payload.end()), c.payload);
    EXPECT_EQ(view->icrc, load_icrc(std::span(out).last<kIcrcSize>()));
    // The payload view points into the input.
    if (!c.payload.empty()) {
      EXPECT_GE(view->payload.data(), out.data());
      EXPECT_LE(view->payload.data() + view->payload.size(), out.data() + out.size());
    }
  }
}

TEST(Packet, HeadersThenScatteredPayloadGiveTheSameBytes) {
  PacketHeaders h = with(Opcode::rc_rdma_write_only, 0x99);
  h.reth = Reth{.virtual_address = 0x4000, .r_key = 0x55, .dma_length = 11};
  const Bytes payload = hex("000102030405060708090a");
  Bytes whole(packet_size(h.bth.opcode, payload.size()));
  ASSERT_TRUE(encode_packet(h, payload, kPseudo, whole).has_value());

  std::array<std::uint8_t, kMaxHeadersSize> head{};
  const auto head_size = encode_headers(h, payload.size(), head);
  ASSERT_TRUE(head_size.has_value());
  auto icrc = Icrc::begin(kPseudo, whole.size(), std::span<const std::uint8_t>(head).first<kBthSize>());
  ASSERT_TRUE(icrc.has_value());
  icrc->update(std::span<const std::uint8_t>(head).subspan(kBthSize, *head_size - kBthSize));
  icrc->update(std::span(payload).first(4));
  icrc->update(std::span(payload).subspan(4));
  const std::array<std::uint8_t, 3> pad{};
  icrc->update(std::span(pad).first(pad_for(payload.size())));
  EXPECT_EQ(icrc->finish(), load_icrc(std::span(whole).last<kIcrcSize>()));
  EXPECT_EQ(Bytes(head.begin(), head.begin() + static_cast<std::ptrdiff_t>(*head_size)),
            Bytes(whole.begin(), whole.begin() + static_cast<std::ptrdiff_t>(*head_size)));
}

TEST(Packet, DecodesTheSheetsCnpDatagram) {
  const Bytes udp = udp_payload_of(kCnpDatagram);
  const auto view = decode_verified_packet(udp, cnp_pseudo());
  ASSERT_TRUE(view.has_value());
  EXPECT_EQ(view->headers.bth.opcode, Opcode::cnp);
  EXPECT_TRUE(view->headers.bth.becn);
  EXPECT_EQ(view->headers.bth.destination_qp, 0x118u);
  EXPECT_TRUE(view->payload.empty());
}

TEST(Packet, EncoderRefusals) {
  Bytes out(64);
  PacketHeaders h = with(static_cast<Opcode>(0x15), 0);
  EXPECT_EQ(encode_packet(h, {}, kPseudo, out).error(), WireError::roce_unsupported_opcode);
  EXPECT_EQ(encode_headers(h, 0, out).error(), WireError::roce_unsupported_opcode);
  h = with(Opcode::rc_acknowledge, 0);
  const Bytes one = {1};
  EXPECT_EQ(encode_packet(h, one, kPseudo, out).error(), WireError::roce_unexpected_payload);
  h = with(Opcode::rc_send_only, 0x1000000);
  EXPECT_EQ(encode_packet(h, {}, kPseudo, out).error(), WireError::roce_field_out_of_range);
  h = with(Opcode::ud_send_only, 0);
  h.deth.source_qp = 0x1000000;
  EXPECT_EQ(encode_packet(h, {}, kPseudo, out).error(), WireError::roce_field_out_of_range);
  h = with(Opcode::rc_acknowledge, 0);
  h.aeth = Aeth::ack(40, 0);
  EXPECT_EQ(encode_packet(h, {}, kPseudo, out).error(), WireError::roce_field_out_of_range);
  h = with(Opcode::rc_send_only, 0);
  Bytes small(packet_size(Opcode::rc_send_only, 5) - 1);
  EXPECT_EQ(encode_packet(h, hex("0102030405"), kPseudo, small).error(), WireError::buffer_too_small);
  std::array<std::uint8_t, kBthSize - 1> tiny{};
  EXPECT_EQ(encode_headers(h, 0, tiny).error(), WireError::buffer_too_small);
}

}  // namespace
}  // namespace peercm::wire::roce
