// Malformed RoCEv2 packets, IP/UDP framing, CM MADs and rdma_cm private-data headers:
// table-driven cases, each mapped to the WireError it must produce (with positive controls
// beside them), and fixed-seed fuzzing of every decoder: random and mutated inputs never
// crash (ASan/UBSan builds check memory), and whatever is accepted re-encodes to something
// that decodes to the same fields.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <ostream>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "roce_ibcm_compare.hpp"
#include "roce_reference.hpp"
#include "wire/ibcm/cm_message.hpp"
#include "wire/ibcm/gsi.hpp"
#include "wire/ibcm/rdma_cm_ip.hpp"
#include "wire/roce/ip_udp.hpp"
#include "wire/roce/packet.hpp"

namespace peercm::wire {
namespace {

using test::Bytes;
using namespace roce;
using namespace ibcm;

const IcrcPseudoHeader kPseudo{.ip = Ipv4IcrcFields{.source = {10, 0, 0, 1}, .destination = {10, 0, 0, 2}},
                               .udp_source_port = 0xC123};

// A valid packet of `op` with `payload`.
Bytes packet(Opcode op, const Bytes& payload = {}) {
  PacketHeaders h;
  h.bth.opcode = op;
  h.bth.destination_qp = 0x42;
  h.bth.psn = 0x100;
  h.deth = Deth{.q_key = kGsiQkey, .source_qp = 1};
  Bytes out(packet_size(op, payload.size()));
  const auto size = encode_packet(h, payload, kPseudo, out);
  EXPECT_TRUE(size.has_value());
  return out;
}

// Recomputes the ICRC of edited bytes, so that the structural check is what fails.
Bytes resealed(Bytes b) {
  if (b.size() >= kMinPacketSize) {
    const auto icrc = compute_icrc(kPseudo, b);
    if (icrc) store_icrc(*icrc, std::span(b).last<kIcrcSize>());
  }
  return b;
}

Bytes with_byte(Bytes b, std::size_t at, std::uint8_t value) {
  b[at] = value;
  return b;
}

Bytes first(const Bytes& b, std::size_t n) { return Bytes(b.begin(), b.begin() + static_cast<std::ptrdiff_t>(n)); }

// Opcode `op` in front of `after_bth` extra bytes, then an ICRC: lengths a sender would not use.
Bytes raw(std::uint8_t op, std::uint8_t byte1, std::size_t after_bth) {
  Bytes b(kBthSize + after_bth + kIcrcSize, 0);
  b[0] = op;
  b[1] = byte1;
  b[2] = 0xFF;
  b[3] = 0xFF;
  return resealed(b);
}

// ---------------------------------------------------------------------------------------
// Packets

struct PacketCase {
  std::string name;
  Bytes bytes;
  WireError error;
};

void PrintTo(const PacketCase& c, std::ostream* os) { *os << c.name; }

std::vector<PacketCase> packet_cases() {
  using E = WireError;
  const Bytes send = packet(Opcode::rc_send_only, Bytes(8, 0x5A));
  std::vector<PacketCase> cases = {
      {"empty", {}, E::truncated},
      {"bth_only", first(send, kBthSize), E::truncated},
      {"bth_and_three_icrc_bytes", first(send, 15), E::truncated},
      {"length_17", resealed(first(send, 17)), E::roce_bad_length},
      {"length_18", resealed(first(send, 18)), E::roce_bad_length},
      {"length_19", resealed(first(send, 19)), E::roce_bad_length},
      {"length_not_multiple_of_4", resealed(first(send, send.size() - 1)), E::roce_bad_length},
      {"tver_1", resealed(with_byte(send, 1, 0x01)), E::roce_bad_transport_version},
      {"tver_15", resealed(with_byte(send, 1, 0x0F)), E::roce_bad_transport_version},
      {"tver_with_se_and_pad", resealed(with_byte(send, 1, 0xB8)), E::roce_bad_transport_version},
      {"opcode_reserved_0x15", raw(0x15, 0, 0), E::roce_unsupported_opcode},
      {"opcode_rc_reserved_0x18", raw(0x18, 0, 0), E::roce_unsupported_opcode},
      {"opcode_rc_0x1f", raw(0x1F, 0, 0), E::roce_unsupported_opcode},
      {"opcode_uc_reserved_0x2c", raw(0x2C, 0, 4), E::roce_unsupported_opcode},
      {"opcode_rd_send_first", raw(0x40, 0, 4), E::roce_unsupported_opcode},
      {"opcode_ud_0x66", raw(0x66, 0, 8), E::roce_unsupported_opcode},
      {"opcode_cnp_0x80", raw(0x80, 0, 16), E::roce_unsupported_opcode},
      {"opcode_0xff", raw(0xFF, 0, 0), E::roce_unsupported_opcode},
      {"write_only_without_room_for_reth", raw(0x0A, 0, 12), E::truncated},
      {"write_first_without_room_for_reth", raw(0x06, 0, 0), E::truncated},
      {"write_only_immediate_without_immdt", raw(0x0B, 0, 16), E::truncated},
      {"read_request_without_room_for_reth", raw(0x0C, 0, 12), E::truncated},
      {"ack_without_aeth", raw(0x11, 0, 0), E::truncated},
      {"atomic_ack_without_atomic_ack_eth", raw(0x12, 0, 4), E::truncated},
      {"compare_swap_without_room", raw(0x13, 0, 24), E::truncated},
      {"fetch_add_without_room", raw(0x14, 0, 8), E::truncated},
      {"send_last_immediate_without_immdt", raw(0x03, 0, 0), E::truncated},
      {"send_only_invalidate_without_ieth", raw(0x17, 0, 0), E::truncated},
      {"ud_send_only_without_deth", raw(0x64, 0, 4), E::truncated},
      {"ud_send_immediate_without_immdt", raw(0x65, 0, 8), E::truncated},
      {"cnp_without_reserved_bytes", raw(0x81, 0, 12), E::truncated},
      {"pad_1_no_payload", raw(0x04, 0x10, 0), E::roce_bad_pad_count},
      {"pad_3_no_payload", raw(0x04, 0x30, 0), E::roce_bad_pad_count},
      {"pad_on_write_only_without_payload", raw(0x0A, 0x20, 16), E::roce_bad_pad_count},
      {"pad_on_ack", raw(0x11, 0x10, 4), E::roce_bad_pad_count},
      {"payload_on_ack", raw(0x11, 0, 8), E::roce_unexpected_payload},
      {"pad_and_payload_on_ack", raw(0x11, 0x30, 8), E::roce_unexpected_payload},
      {"payload_on_read_request", raw(0x0C, 0, 20), E::roce_unexpected_payload},
      {"payload_on_atomic_ack", raw(0x12, 0, 16), E::roce_unexpected_payload},
      {"payload_on_fetch_add", raw(0x14, 0, 32), E::roce_unexpected_payload},
      {"payload_on_cnp", raw(0x81, 0, 20), E::roce_unexpected_payload},
      {"aeth_reserved_type", resealed(with_byte(packet(Opcode::rc_acknowledge), kBthSize, 0x40)), E::roce_bad_aeth},
      {"aeth_reserved_type_top_bit", resealed(with_byte(packet(Opcode::rc_acknowledge), kBthSize, 0xDF)),
       E::roce_bad_aeth},
      {"aeth_nak_code_5", resealed(with_byte(packet(Opcode::rc_acknowledge), kBthSize, 0x65)), E::roce_bad_aeth},
      {"aeth_nak_code_31", resealed(with_byte(packet(Opcode::rc_acknowledge), kBthSize, 0x7F)), E::roce_bad_aeth},
      {"read_response_aeth_reserved",
       resealed(with_byte(packet(Opcode::rc_rdma_read_response_only, Bytes(4, 1)), kBthSize, 0x5F)), E::roce_bad_aeth},
      {"atomic_ack_aeth_reserved", resealed(with_byte(packet(Opcode::rc_atomic_acknowledge), kBthSize, 0x68)),
       E::roce_bad_aeth},
  };
  return cases;
}

class MalformedRocePacket : public ::testing::TestWithParam<PacketCase> {};

TEST_P(MalformedRocePacket, Decode) {
  const PacketCase& c = GetParam();
  const auto view = decode_packet(c.bytes);
  ASSERT_FALSE(view.has_value());
  EXPECT_EQ(view.error(), c.error);
}

// With a correct ICRC over the bad structure, the verifying decoder reports the structure;
// with the ICRC broken as well, it reports the ICRC, which it checks first (§1.3).
TEST_P(MalformedRocePacket, VerifiedDecode) {
  const PacketCase& c = GetParam();
  const auto view = decode_verified_packet(c.bytes, kPseudo);
  ASSERT_FALSE(view.has_value());
  EXPECT_EQ(view.error(), c.error);
  if (c.bytes.size() >= kMinPacketSize) {
    Bytes broken = c.bytes;
    broken.back() ^= 0x01;
    const auto again = decode_verified_packet(broken, kPseudo);
    ASSERT_FALSE(again.has_value());
    EXPECT_EQ(again.error(), WireError::roce_bad_icrc);
  }
}

INSTANTIATE_TEST_SUITE_P(Table, MalformedRocePacket, ::testing::ValuesIn(packet_cases()),
                         [](const ::testing::TestParamInfo<PacketCase>& param_info) { return param_info.param.name; });

TEST(MalformedRocePacketControls, NeighboursOfTheMalformedCasesAreAccepted) {
  const Bytes valid[] = {
      raw(0x04, 0x00, 0),                            // empty SEND ONLY
      raw(0x04, 0x30, 4),                            // 1 payload byte, 3 pad
      raw(0x04, 0x00, 4),                            // 4 payload bytes
      raw(0x0A, 0x00, 16),                           // empty WRITE ONLY
      raw(0x11, 0x00, 4),                            // ACK
      raw(0x12, 0x00, 12),                           // ATOMIC ACK
      raw(0x81, 0x00, 16),                           // CNP
      raw(0x04, 0xC0, 0),                            // SE and M set
      resealed(with_byte(raw(0x04, 0x00, 4), 4, 0xFF)),  // FECN, BECN, reserved bits
      resealed(with_byte(raw(0x04, 0x00, 4), 8, 0xFF)),  // AckReq and reserved bits
      resealed(with_byte(packet(Opcode::rc_acknowledge), kBthSize, 0x9F)),  // syndrome's top bit ignored
      resealed(with_byte(packet(Opcode::rc_acknowledge), kBthSize, 0x64)),  // NAK invalid RD request
      resealed(with_byte(raw(0x64, 0x00, 8), kBthSize + 4, 0xFF)),         // DETH reserved byte
      resealed(with_byte(raw(0x81, 0x00, 16), kBthSize + 3, 0xFF)),        // CNP reserved bytes
      resealed(with_byte(raw(0x04, 0x20, 4), kBthSize + 3, 0xFF)),         // non-zero pad byte
  };
  for (const Bytes& b : valid) {
    const auto view = decode_verified_packet(b, kPseudo);
    EXPECT_TRUE(view.has_value()) << to_string(view.error());
  }
}

// ---------------------------------------------------------------------------------------
// IP / UDP framing

struct IpCase {
  std::string name;
  Bytes bytes;
  WireError error;
};

void PrintTo(const IpCase& c, std::ostream* os) { *os << c.name; }

Bytes v4() { return test::ipv4_datagram(test::Ipv4Shape{}, packet(Opcode::rc_send_only)); }
Bytes v6() { return test::ipv6_datagram(test::Ipv6Shape{}, packet(Opcode::rc_send_only)); }

std::vector<IpCase> ip_cases() {
  using E = WireError;
  const Bytes a = v4();
  const Bytes b = v6();
  Bytes total_short = a;
  test::put16(total_short, 2, 19);
  Bytes total_long = a;
  test::put16(total_long, 2, static_cast<std::uint16_t>(a.size() + 1));
  Bytes udp_too_short = a;
  test::put16(udp_too_short, 2, 27);
  Bytes udp_length_wrong = a;
  test::put16(udp_length_wrong, 24, static_cast<std::uint16_t>(a.size() - 20 - 4));
  Bytes v6_long = b;
  test::put16(v6_long, 4, static_cast<std::uint16_t>(b.size() - 40 + 4));
  Bytes v6_udp_wrong = b;
  test::put16(v6_udp_wrong, 44, 8);
  return {
      {"empty", {}, E::truncated},
      {"ipv4_19_bytes", first(a, 19), E::truncated},
      {"ipv6_39_bytes", first(b, 39), E::truncated},
      {"version_0", with_byte(a, 0, 0x05), E::roce_bad_ip_header},
      {"version_5", with_byte(a, 0, 0x55), E::roce_bad_ip_header},
      {"version_15", with_byte(a, 0, 0xF5), E::roce_bad_ip_header},
      {"ihl_6_options", with_byte(a, 0, 0x46), E::roce_bad_ip_header},
      {"ihl_4", with_byte(a, 0, 0x44), E::roce_bad_ip_header},
      {"protocol_tcp", with_byte(a, 9, 6), E::roce_bad_ip_header},
      {"more_fragments", with_byte(a, 6, 0x20), E::roce_bad_ip_header},
      {"fragment_offset", with_byte(a, 7, 0x01), E::roce_bad_ip_header},
      {"total_length_below_header", total_short, E::roce_bad_ip_header},
      {"total_length_beyond_bytes", total_long, E::truncated},
      {"udp_header_cut", udp_too_short, E::roce_bad_ip_header},
      {"udp_length_disagrees", udp_length_wrong, E::roce_bad_ip_header},
      {"ipv6_hop_by_hop_header", with_byte(b, 6, 0), E::roce_bad_ip_header},
      {"ipv6_next_header_tcp", with_byte(b, 6, 6), E::roce_bad_ip_header},
      {"ipv6_payload_beyond_bytes", v6_long, E::truncated},
      {"ipv6_udp_length_disagrees", v6_udp_wrong, E::roce_bad_ip_header},
  };
}

class MalformedIpUdp : public ::testing::TestWithParam<IpCase> {};

TEST_P(MalformedIpUdp, Decode) {
  const IpCase& c = GetParam();
  const auto d = decode_ip_udp(c.bytes);
  ASSERT_FALSE(d.has_value());
  EXPECT_EQ(d.error(), c.error);
}

INSTANTIATE_TEST_SUITE_P(Table, MalformedIpUdp, ::testing::ValuesIn(ip_cases()),
                         [](const ::testing::TestParamInfo<IpCase>& param_info) { return param_info.param.name; });

TEST(MalformedIpUdpControls, TheBuildersMakeValidDatagrams) {
  for (const Bytes& d : {v4(), v6(), with_byte(v4(), 6, 0x00), with_byte(v4(), 6, 0x80)}) {
    const auto ip = decode_ip_udp(d);
    ASSERT_TRUE(ip.has_value()) << to_string(ip.error());
    EXPECT_EQ(ip->udp_payload.size(), packet(Opcode::rc_send_only).size());
  }
}

// ---------------------------------------------------------------------------------------
// CM MADs

Bytes cm_mad(const CmMessage& message) {
  Bytes out(kMadSize);
  EXPECT_TRUE(encode_cm_mad(CmMad{.transaction_id = 5, .message = message}, out).has_value());
  return out;
}

Bytes with_attribute(std::uint16_t id) {
  Bytes b = cm_mad(CmRtu{});
  b[16] = static_cast<std::uint8_t>(id >> 8);
  b[17] = static_cast<std::uint8_t>(id);
  return b;
}

struct MadCase {
  std::string name;
  Bytes bytes;
  WireError error;
};

void PrintTo(const MadCase& c, std::ostream* os) { *os << c.name; }

std::vector<MadCase> mad_cases() {
  using E = WireError;
  const Bytes rtu = cm_mad(CmRtu{});
  Bytes longer = rtu;
  longer.push_back(0);
  return {
      {"empty", {}, E::mad_bad_length},
      {"header_only", first(rtu, kMadHeaderSize), E::mad_bad_length},
      {"length_255", first(rtu, 255), E::mad_bad_length},
      {"length_257", longer, E::mad_bad_length},
      {"base_version_0", with_byte(rtu, 0, 0), E::mad_bad_base_version},
      {"base_version_2", with_byte(rtu, 0, 2), E::mad_bad_base_version},
      {"class_subnet_admin", with_byte(rtu, 1, 0x03), E::mad_bad_class},
      {"class_performance", with_byte(rtu, 1, 0x04), E::mad_bad_class},
      {"class_version_1", with_byte(rtu, 2, 1), E::mad_bad_class_version},
      {"class_version_3", with_byte(rtu, 2, 3), E::mad_bad_class_version},
      {"method_get", with_byte(rtu, 3, 0x01), E::mad_bad_method},
      {"method_get_resp", with_byte(rtu, 3, 0x81), E::mad_bad_method},
      {"method_send_with_r_bit", with_byte(rtu, 3, 0x83), E::mad_bad_method},
      {"attribute_class_port_info", with_attribute(0x0001), E::ibcm_unknown_attribute},
      {"attribute_sidr_req", with_attribute(0x0017), E::ibcm_unknown_attribute},
      {"attribute_sidr_rep", with_attribute(0x0018), E::ibcm_unknown_attribute},
      {"attribute_lap", with_attribute(0x0019), E::ibcm_unknown_attribute},
      {"attribute_apr", with_attribute(0x001A), E::ibcm_unknown_attribute},
      {"attribute_0", with_attribute(0x0000), E::ibcm_unknown_attribute},
      {"attribute_0x0110", with_attribute(0x0110), E::ibcm_unknown_attribute},
      {"attribute_ffff", with_attribute(0xFFFF), E::ibcm_unknown_attribute},
      {"mra_message_mraed_3", with_byte(cm_mad(CmMra{}), 24 + 8, 0xC0), E::ibcm_reserved_value},
      {"rej_message_rejected_3", with_byte(cm_mad(CmRej{}), 24 + 8, 0xC0), E::ibcm_reserved_value},
      {"rej_info_length_73", with_byte(cm_mad(CmRej{}), 24 + 9, 73 << 1), E::ibcm_reserved_value},
      {"rej_info_length_127", with_byte(cm_mad(CmRej{}), 24 + 9, 0xFE), E::ibcm_reserved_value},
  };
}

class MalformedCmMad : public ::testing::TestWithParam<MadCase> {};

TEST_P(MalformedCmMad, Decode) {
  const MadCase& c = GetParam();
  const auto mad = decode_cm_mad(c.bytes);
  ASSERT_FALSE(mad.has_value());
  EXPECT_EQ(mad.error(), c.error);
}

INSTANTIATE_TEST_SUITE_P(Table, MalformedCmMad, ::testing::ValuesIn(mad_cases()),
                         [](const ::testing::TestParamInfo<MadCase>& param_info) { return param_info.param.name; });

TEST(MalformedCmMadControls, NeighboursOfTheMalformedCasesAreAccepted) {
  const Bytes valid[] = {
      cm_mad(CmReq{}), cm_mad(CmMra{}), cm_mad(CmRej{}), cm_mad(CmRep{}), cm_mad(CmRtu{}), cm_mad(CmDreq{}),
      cm_mad(CmDrep{}),
      with_byte(cm_mad(CmMra{}), 24 + 8, 0xBF),          // MRAed LAP, reserved bits set
      with_byte(cm_mad(CmMra{}), 24 + 9, 0xFF),          // service timeout 31, reserved bits set
      with_byte(cm_mad(CmRej{}), 24 + 8, 0x80),          // REJected "other"
      with_byte(cm_mad(CmRej{}), 24 + 9, (72 << 1) | 1),  // the full ARI, reserved bit set
      with_byte(cm_mad(CmRtu{}), 4, 0xFF),                // status: not checked
      with_byte(cm_mad(CmRtu{}), 7, 0xFF),                // class-specific: not checked
      with_byte(cm_mad(CmRtu{}), 18, 0xFF),               // reserved
  };
  for (const Bytes& b : valid) {
    const auto mad = decode_cm_mad(b);
    EXPECT_TRUE(mad.has_value()) << to_string(mad.error());
  }
}

// ---------------------------------------------------------------------------------------
// rdma_cm's private-data header

struct CmaCase {
  std::string name;
  Bytes bytes;
  WireError error;
};

void PrintTo(const CmaCase& c, std::ostream* os) { *os << c.name; }

Bytes cma_bytes() {
  Bytes out(kReqPrivateDataSize);
  EXPECT_TRUE(encode_cma_private_data(CmaHeader::ipv4({1, 2, 3, 4}, 5, {6, 7, 8, 9}), {}, out).has_value());
  return out;
}

std::vector<CmaCase> cma_cases() {
  using E = WireError;
  return {
      {"empty", {}, E::truncated},
      {"35_bytes", first(cma_bytes(), 35), E::truncated},
      {"version_1", with_byte(cma_bytes(), 0, 0x01), E::cma_unsupported_version},
      {"version_major_1", with_byte(cma_bytes(), 0, 0x10), E::cma_unsupported_version},
      {"version_ff", with_byte(cma_bytes(), 0, 0xFF), E::cma_unsupported_version},
      {"ip_version_0", with_byte(cma_bytes(), 1, 0x00), E::cma_bad_ip_version},
      {"ip_version_5", with_byte(cma_bytes(), 1, 0x50), E::cma_bad_ip_version},
      {"ip_version_15", with_byte(cma_bytes(), 1, 0xF0), E::cma_bad_ip_version},
  };
}

class MalformedCmaHeader : public ::testing::TestWithParam<CmaCase> {};

TEST_P(MalformedCmaHeader, Decode) {
  const CmaCase& c = GetParam();
  const auto cma = decode_cma_private_data(c.bytes);
  ASSERT_FALSE(cma.has_value());
  EXPECT_EQ(cma.error(), c.error);
}

INSTANTIATE_TEST_SUITE_P(Table, MalformedCmaHeader, ::testing::ValuesIn(cma_cases()),
                         [](const ::testing::TestParamInfo<CmaCase>& param_info) { return param_info.param.name; });

TEST(MalformedCmaHeaderControls, ReservedNibbleIgnoredAndExactHeaderAccepted) {
  EXPECT_TRUE(decode_cma_private_data(cma_bytes()).has_value());
  EXPECT_TRUE(decode_cma_private_data(with_byte(cma_bytes(), 1, 0x4F)).has_value());
  EXPECT_TRUE(decode_cma_private_data(with_byte(cma_bytes(), 1, 0x60)).has_value());
  EXPECT_TRUE(decode_cma_private_data(first(cma_bytes(), kCmaHeaderSize)).has_value());
}

TEST(WireErrorText, EveryRoceAndIbcmErrorHasADistinctDescription) {
  std::vector<std::string_view> seen;
  for (int e = 0; e <= static_cast<int>(WireError::cma_bad_ip_version); ++e) {
    const std::string_view text = to_string(static_cast<WireError>(e));
    EXPECT_NE(text, "unknown wire error") << e;
    for (const std::string_view other : seen) EXPECT_NE(text, other) << e;
    seen.push_back(text);
  }
}

// ---------------------------------------------------------------------------------------
// Fixed-seed fuzzing

constexpr int kFuzzRounds = 3000;

std::uint32_t r32(std::mt19937& rng) { return static_cast<std::uint32_t>(rng()); }

Bytes random_bytes(std::mt19937& rng, std::size_t max) {
  std::uniform_int_distribution<std::size_t> length(0, max);
  Bytes out(length(rng));
  for (auto& b : out) b = static_cast<std::uint8_t>(rng());
  return out;
}

// Flips, overwrites, truncates or extends a valid input.
Bytes mutate(Bytes b, std::mt19937& rng) {
  const int edits = static_cast<int>(rng() % 4) + 1;
  for (int i = 0; i < edits; ++i) {
    switch (rng() % 4) {
      case 0:
        if (!b.empty()) b[rng() % b.size()] ^= static_cast<std::uint8_t>(1u << (rng() % 8));
        break;
      case 1:
        if (!b.empty()) b[rng() % b.size()] = static_cast<std::uint8_t>(rng());
        break;
      case 2:
        if (!b.empty()) b.resize(rng() % b.size());
        break;
      default:
        for (std::size_t n = rng() % 8; n > 0; --n) b.push_back(static_cast<std::uint8_t>(rng()));
        break;
    }
  }
  return b;
}

constexpr Opcode kKnownOpcodes[] = {
    Opcode::rc_send_first,          Opcode::rc_send_middle,
    Opcode::rc_send_last,           Opcode::rc_send_last_immediate,
    Opcode::rc_send_only,           Opcode::rc_send_only_immediate,
    Opcode::rc_rdma_write_first,    Opcode::rc_rdma_write_middle,
    Opcode::rc_rdma_write_last,     Opcode::rc_rdma_write_last_immediate,
    Opcode::rc_rdma_write_only,     Opcode::rc_rdma_write_only_immediate,
    Opcode::rc_rdma_read_request,   Opcode::rc_rdma_read_response_first,
    Opcode::rc_rdma_read_response_middle, Opcode::rc_rdma_read_response_last,
    Opcode::rc_rdma_read_response_only,   Opcode::rc_acknowledge,
    Opcode::rc_atomic_acknowledge,  Opcode::rc_compare_swap,
    Opcode::rc_fetch_add,           Opcode::rc_send_last_invalidate,
    Opcode::rc_send_only_invalidate, Opcode::ud_send_only,
    Opcode::ud_send_only_immediate, Opcode::cnp,
};

Bytes valid_packet(std::mt19937& rng) {
  const Opcode op = kKnownOpcodes[rng() % std::size(kKnownOpcodes)];
  const bool payload = opcode_info(op).payload != PayloadRule::none;
  Bytes p = payload ? random_bytes(rng, 64) : Bytes{};
  PacketHeaders h;
  h.bth.opcode = op;
  h.bth.solicited_event = rng() % 2 == 0;
  h.bth.destination_qp = r32(rng) & kQpnMask;
  h.bth.psn = r32(rng) & kQpnMask;
  h.bth.ack_request = rng() % 2 == 0;
  h.reth = Reth{.virtual_address = rng(), .r_key = r32(rng), .dma_length = 7};
  h.aeth = Aeth::ack(static_cast<std::uint8_t>(rng() % 32), r32(rng) & kQpnMask);
  h.deth = Deth{.q_key = r32(rng), .source_qp = r32(rng) & kQpnMask};
  h.immediate = r32(rng);
  Bytes out(packet_size(op, p.size()));
  EXPECT_TRUE(encode_packet(h, p, kPseudo, out).has_value());
  return out;
}

TEST(Fuzz, RocePacketDecodeNeverMisbehaves) {
  std::mt19937 rng(0x5EED0101);
  int accepted = 0;
  int verified = 0;
  for (int round = 0; round < kFuzzRounds; ++round) {
    const Bytes input = rng() % 4 == 0 ? random_bytes(rng, 120) : mutate(valid_packet(rng), rng);
    const auto view = decode_packet(input);
    const auto checked = decode_verified_packet(input, kPseudo);
    if (checked) {
      ++verified;
      ASSERT_TRUE(view.has_value()) << round;
    }
    if (!view) continue;
    ++accepted;
    ASSERT_EQ(input.size() % 4, 0u) << round;
    ASSERT_GE(view->payload.data(), input.data()) << round;
    ASSERT_LE(view->payload.data() + view->payload.size(), input.data() + input.size()) << round;
    ASSERT_EQ(packet_size(view->headers.bth.opcode, view->payload.size()), input.size()) << round;
    // Re-encoding what was accepted gives a packet that decodes to the same fields.
    Bytes again(input.size());
    const auto size = encode_packet(view->headers, view->payload, kPseudo, again);
    ASSERT_TRUE(size.has_value()) << round << ": " << to_string(size.error());
    const auto twice = decode_verified_packet(again, kPseudo);
    ASSERT_TRUE(twice.has_value()) << round;
    ASSERT_TRUE(test::same_packet(*twice, *view)) << round;
  }
  EXPECT_GT(accepted, 0);
  EXPECT_GT(verified, 0);
}

TEST(Fuzz, IpUdpAndIcrcNeverMisbehave) {
  std::mt19937 rng(0x5EED0102);
  int accepted = 0;
  for (int round = 0; round < kFuzzRounds; ++round) {
    const Bytes p = valid_packet(rng);
    const Bytes datagram =
        rng() % 2 == 0 ? test::ipv4_datagram(test::Ipv4Shape{}, p) : test::ipv6_datagram(test::Ipv6Shape{}, p);
    const Bytes input = rng() % 4 == 0 ? random_bytes(rng, 160) : mutate(datagram, rng);
    const auto d = decode_ip_udp(input);
    if (!d) continue;
    ++accepted;
    ASSERT_GE(d->udp_payload.data(), input.data()) << round;
    ASSERT_LE(d->udp_payload.data() + d->udp_payload.size(), input.data() + input.size()) << round;
    const auto icrc = compute_icrc(d->pseudo, d->udp_payload);
    if (!icrc) continue;
    // The codec's ICRC from fields equals the reference's masking of the received bytes.
    const std::size_t ip_length = (input[0] >> 4) == 4 ? kIpv4HeaderSize : kIpv6HeaderSize;
    const Bytes exact(input.begin(), input.begin() + static_cast<std::ptrdiff_t>(ip_length + kUdpHeaderSize +
                                                                                 d->udp_payload.size()));
    ASSERT_EQ(*icrc, test::reference_icrc(exact)) << round;
  }
  EXPECT_GT(accepted, 0);
}

Bytes valid_cm_mad(std::mt19937& rng) {
  const Bytes pd = random_bytes(rng, 40);
  CmMessage message = CmRtu{};
  switch (rng() % 7) {
    case 0: {
      CmReq r;
      r.local_comm_id = r32(rng);
      r.service_id = rdma_ip_service_id(RdmaPortSpace::tcp, static_cast<std::uint16_t>(rng()));
      r.local_qpn = r32(rng) & 0xFFFFFF;
      r.starting_psn = r32(rng) & 0xFFFFFF;
      r.primary.flow_label = r32(rng) & 0xFFFFF;
      message = r;
      break;
    }
    case 1: message = CmMra{.message_mraed = static_cast<MraTarget>(rng() % 3), .service_timeout = 24}; break;
    case 2: message = CmRej{.message_rejected = static_cast<RejTarget>(rng() % 3), .ari = pd}; break;
    case 3: message = CmRep{.local_qpn = r32(rng) & 0xFFFFFF, .ece_vendor_id = r32(rng) & 0xFFFFFF}; break;
    case 4: message = CmRtu{}; break;
    case 5: message = CmDreq{.remote_qpn = r32(rng) & 0xFFFFFF}; break;
    default: message = CmDrep{}; break;
  }
  std::visit([&pd](auto& m) { m.private_data = pd; }, message);
  Bytes out(kMadSize);
  EXPECT_TRUE(encode_cm_mad(CmMad{.transaction_id = rng(), .message = message}, out).has_value());
  return out;
}

TEST(Fuzz, CmMadDecodeNeverMisbehaves) {
  std::mt19937 rng(0x5EED0103);
  int accepted = 0;
  for (int round = 0; round < kFuzzRounds; ++round) {
    Bytes input;
    if (rng() % 4 == 0) {
      input = random_bytes(rng, 300);
      if (rng() % 2 == 0) input.resize(kMadSize);
    } else {
      input = mutate(valid_cm_mad(rng), rng);
    }
    const auto mad = decode_cm_mad(input);
    if (!mad) continue;
    ++accepted;
    Bytes again(kMadSize);
    const auto size = encode_cm_mad(*mad, again);
    ASSERT_TRUE(size.has_value()) << round << ": " << to_string(size.error());
    const auto twice = decode_cm_mad(again);
    ASSERT_TRUE(twice.has_value()) << round;
    ASSERT_TRUE(test::same_cm_mad(*twice, *mad)) << round;
    // The header's checked bytes, the TID and the attribute ID survive unchanged.
    ASSERT_TRUE(std::equal(again.begin(), again.begin() + 4, input.begin())) << round;
    ASSERT_TRUE(std::equal(again.begin() + 8, again.begin() + 18, input.begin() + 8)) << round;
  }
  EXPECT_GT(accepted, 0);
}

TEST(Fuzz, CmaHeaderAndGsiNeverMisbehave) {
  std::mt19937 rng(0x5EED0104);
  int accepted = 0;
  for (int round = 0; round < kFuzzRounds; ++round) {
    const Bytes input = rng() % 3 == 0 ? random_bytes(rng, 100) : mutate(cma_bytes(), rng);
    const auto cma = decode_cma_private_data(input);
    if (cma) {
      ++accepted;
      Bytes again(kReqPrivateDataSize);
      const auto app = cma->application_data.first(std::min(cma->application_data.size(), kCmaReqUserPrivateDataSize));
      ASSERT_TRUE(encode_cma_private_data(cma->header, app, again).has_value()) << round;
      const auto twice = decode_cma_private_data(again);
      ASSERT_TRUE(twice.has_value()) << round;
      ASSERT_EQ(twice->header, cma->header) << round;
    }
    // Any decodable datagram either is a MAD for QP1 or says why not.
    const Bytes p = rng() % 2 == 0 ? mutate(valid_packet(rng), rng) : random_bytes(rng, 300);
    if (const auto view = decode_packet(p)) {
      const auto m = mad_of_gsi_packet(*view);
      if (m) {
        ASSERT_EQ(m->size(), kMadSize) << round;
      }
    }
  }
  EXPECT_GT(accepted, 0);
}

}  // namespace
}  // namespace peercm::wire
