// Property tests (rapidcheck): every RoCEv2 header, every packet shape (IPv4 and IPv6), every
// CM message, the MAD header, rdma_cm's service ID and private-data header survive
// encode -> decode with randomized fields; PSN arithmetic obeys its window rules.
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "roce_ibcm_compare.hpp"
#include "roce_reference.hpp"
#include "wire/ibcm/cm_message.hpp"
#include "wire/ibcm/rdma_cm_ip.hpp"
#include "wire/roce/ip_udp.hpp"
#include "wire/roce/packet.hpp"
#include "wire/roce/psn.hpp"

namespace peercm::wire {
namespace {

using test::Bytes;
using namespace roce;
using namespace ibcm;

#define WIRE_CHECK(condition)              \
  do {                                     \
    if (!(condition)) RC_FAIL(#condition); \
  } while (false)

Bytes seeded_bytes(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  Bytes out(n);
  for (auto& b : out) b = static_cast<std::uint8_t>(rng());
  return out;
}

std::size_t gen_length(std::size_t max) {
  return *rc::gen::oneOf(rc::gen::just(std::size_t{0}), rc::gen::just(max), rc::gen::inRange<std::size_t>(0, max + 1));
}

Bytes gen_bytes(std::size_t max) { return seeded_bytes(gen_length(max), *rc::gen::arbitrary<std::uint32_t>()); }

template <class T>
T gen_bits(unsigned width) {
  return static_cast<T>(*rc::gen::inRange<std::uint64_t>(0, std::uint64_t{1} << width));
}

bool gen_bool() { return *rc::gen::arbitrary<bool>(); }
std::uint32_t gen_u32() { return *rc::gen::arbitrary<std::uint32_t>(); }
std::uint64_t gen_u64() { return *rc::gen::arbitrary<std::uint64_t>(); }

// ---------------------------------------------------------------------------------------
// RoCEv2 headers

Bth gen_bth(Opcode op) {
  return Bth{.opcode = op,
             .solicited_event = gen_bool(),
             .migration_request = gen_bool(),
             .pad_count = gen_bits<std::uint8_t>(2),
             .transport_version = 0,
             .partition_key = *rc::gen::arbitrary<std::uint16_t>(),
             .fecn = gen_bool(),
             .becn = gen_bool(),
             .destination_qp = gen_bits<std::uint32_t>(24),
             .ack_request = gen_bool(),
             .psn = gen_bits<std::uint32_t>(24)};
}

Aeth gen_aeth() {
  const auto kind = *rc::gen::element(AethKind::ack, AethKind::rnr_nak, AethKind::nak);
  const std::uint8_t value = kind == AethKind::nak ? *rc::gen::inRange<std::uint8_t>(0, 5) : gen_bits<std::uint8_t>(5);
  return Aeth{kind, value, gen_bits<std::uint32_t>(24)};
}

TEST(RoceRoundTrip, BthAndExtensionHeaders) {
  EXPECT_TRUE(rc::check("BTH", [] {
    const Bth bth = gen_bth(static_cast<Opcode>(*rc::gen::arbitrary<std::uint8_t>()));
    std::array<std::uint8_t, kBthSize> out{};
    RC_ASSERT(encode_bth(bth, out).has_value());
    const auto back = decode_bth(out);
    RC_ASSERT(back.has_value());
    RC_ASSERT(*back == bth);
  }));
  EXPECT_TRUE(rc::check("RETH, DETH, AtomicETH, AtomicAckETH, ImmDt", [] {
    const Reth reth{gen_u64(), gen_u32(), gen_u32()};
    std::array<std::uint8_t, kRethSize> r{};
    encode_reth(reth, r);
    RC_ASSERT(decode_reth(r) == reth);
    const Deth deth{gen_u32(), gen_bits<std::uint32_t>(24)};
    std::array<std::uint8_t, kDethSize> d{};
    RC_ASSERT(encode_deth(deth, d).has_value());
    RC_ASSERT(decode_deth(d) == deth);
    const AtomicEth atomic{gen_u64(), gen_u32(), gen_u64(), gen_u64()};
    std::array<std::uint8_t, kAtomicEthSize> a{};
    encode_atomic_eth(atomic, a);
    RC_ASSERT(decode_atomic_eth(a) == atomic);
    const AtomicAckEth ack{gen_u64()};
    std::array<std::uint8_t, kAtomicAckEthSize> k{};
    encode_atomic_ack_eth(ack, k);
    RC_ASSERT(decode_atomic_ack_eth(k) == ack);
    const std::uint32_t word = gen_u32();
    std::array<std::uint8_t, 4> w{};
    encode_word(word, w);
    RC_ASSERT(decode_word(w) == word);
  }));
  EXPECT_TRUE(rc::check("AETH", [] {
    const Aeth aeth = gen_aeth();
    std::array<std::uint8_t, kAethSize> out{};
    RC_ASSERT(encode_aeth(aeth, out).has_value());
    const auto back = decode_aeth(out);
    RC_ASSERT(back.has_value());
    RC_ASSERT(*back == aeth);
  }));
}

constexpr Opcode kAllOpcodes[] = {
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
    Opcode::rc_send_only_invalidate, Opcode::uc_send_first,
    Opcode::uc_send_middle,         Opcode::uc_send_last,
    Opcode::uc_send_last_immediate, Opcode::uc_send_only,
    Opcode::uc_send_only_immediate, Opcode::uc_rdma_write_first,
    Opcode::uc_rdma_write_middle,   Opcode::uc_rdma_write_last,
    Opcode::uc_rdma_write_last_immediate, Opcode::uc_rdma_write_only,
    Opcode::uc_rdma_write_only_immediate, Opcode::ud_send_only,
    Opcode::ud_send_only_immediate, Opcode::cnp,
};

IcrcPseudoHeader gen_pseudo(bool v4) {
  IcrcPseudoHeader p;
  if (v4) {
    Ipv4IcrcFields f;
    for (auto& b : f.source) b = *rc::gen::arbitrary<std::uint8_t>();
    for (auto& b : f.destination) b = *rc::gen::arbitrary<std::uint8_t>();
    f.identification = *rc::gen::arbitrary<std::uint16_t>();
    f.flags_fragment = *rc::gen::element(std::uint16_t{0x4000}, std::uint16_t{0x0000}, std::uint16_t{0x8000});
    p.ip = f;
  } else {
    Ipv6IcrcFields f;
    for (auto& b : f.source) b = *rc::gen::arbitrary<std::uint8_t>();
    for (auto& b : f.destination) b = *rc::gen::arbitrary<std::uint8_t>();
    p.ip = f;
  }
  p.udp_source_port = *rc::gen::arbitrary<std::uint16_t>();
  p.udp_destination_port = *rc::gen::element(std::uint16_t{kRoceUdpPort}, *rc::gen::arbitrary<std::uint16_t>());
  return p;
}

// The datagram a receiver would see for `udp` sent with `pseudo`, with arbitrary values in
// every field the ICRC masks.
Bytes datagram_for(const IcrcPseudoHeader& pseudo, const Bytes& udp) {
  if (const auto* v4 = std::get_if<Ipv4IcrcFields>(&pseudo.ip)) {
    return test::ipv4_datagram(test::Ipv4Shape{.source = v4->source,
                                               .destination = v4->destination,
                                               .tos = *rc::gen::arbitrary<std::uint8_t>(),
                                               .identification = v4->identification,
                                               .flags_fragment = v4->flags_fragment,
                                               .ttl = *rc::gen::arbitrary<std::uint8_t>(),
                                               .header_checksum = *rc::gen::arbitrary<std::uint16_t>(),
                                               .source_port = pseudo.udp_source_port,
                                               .destination_port = pseudo.udp_destination_port,
                                               .udp_checksum = *rc::gen::arbitrary<std::uint16_t>()},
                               udp);
  }
  const auto& v6 = std::get<Ipv6IcrcFields>(pseudo.ip);
  return test::ipv6_datagram(test::Ipv6Shape{.source = v6.source,
                                             .destination = v6.destination,
                                             .traffic_class = *rc::gen::arbitrary<std::uint8_t>(),
                                             .flow_label = gen_bits<std::uint32_t>(20),
                                             .hop_limit = *rc::gen::arbitrary<std::uint8_t>(),
                                             .source_port = pseudo.udp_source_port,
                                             .destination_port = pseudo.udp_destination_port,
                                             .udp_checksum = *rc::gen::arbitrary<std::uint16_t>()},
                             udp);
}

void packet_round_trip(Opcode op) {
  PacketHeaders h;
  h.bth = gen_bth(op);
  h.deth = Deth{gen_u32(), gen_bits<std::uint32_t>(24)};
  h.reth = Reth{gen_u64(), gen_u32(), gen_u32()};
  h.atomic = AtomicEth{gen_u64(), gen_u32(), gen_u64(), gen_u64()};
  h.aeth = gen_aeth();
  h.atomic_ack = AtomicAckEth{gen_u64()};
  h.immediate = gen_u32();
  h.invalidate_rkey = gen_u32();
  const Bytes payload = opcode_info(op).payload == PayloadRule::none ? Bytes{} : gen_bytes(300);
  const IcrcPseudoHeader pseudo = gen_pseudo(gen_bool());

  Bytes out(packet_size(op, payload.size()));
  const auto size = encode_packet(h, payload, pseudo, out);
  RC_ASSERT(size.has_value());
  RC_ASSERT(*size == out.size());
  WIRE_CHECK(out.size() % 4 == 0);
  const auto view = decode_verified_packet(out, pseudo);
  RC_ASSERT(view.has_value());
  h.bth.pad_count = static_cast<std::uint8_t>(pad_for(payload.size()));
  RC_ASSERT(test::same_headers(view->headers, h));
  RC_ASSERT(test::same_bytes(view->payload, payload));

  // A receiver with the whole datagram gets the same pseudo-header and verdict, and the
  // reference ICRC over the masked datagram agrees.
  const Bytes datagram = datagram_for(pseudo, out);
  RC_ASSERT(test::reference_icrc(datagram) == view->icrc);
  const auto ip = decode_ip_udp(datagram);
  RC_ASSERT(ip.has_value());
  RC_ASSERT(ip->pseudo == pseudo);
  RC_ASSERT(verify_icrc(ip->pseudo, ip->udp_payload).has_value());
}

TEST(RoceRoundTrip, PacketsOfEveryOpcode) {
  for (const Opcode op : kAllOpcodes) {
    const std::string name(opcode_info(op).name);
    EXPECT_TRUE(rc::check("packet round trip: " + name, [op] { packet_round_trip(op); })) << name;
  }
}

TEST(RoceRoundTrip, PsnArithmetic) {
  EXPECT_TRUE(rc::check("PSN add / diff / classify", [] {
    const std::uint32_t a = gen_bits<std::uint32_t>(24);
    const std::uint32_t n = *rc::gen::inRange<std::uint32_t>(0, kPsnWindow);
    const std::uint32_t b = psn_add(a, n);
    RC_ASSERT(b <= kPsnMask);
    RC_ASSERT(psn_diff(b, a) == static_cast<std::int32_t>(n));
    RC_ASSERT(psn_diff(a, b) == -static_cast<std::int32_t>(n));
    RC_ASSERT(psn_sub(b, n) == a);
    RC_ASSERT(psn_distance(a, b) == n);
    RC_ASSERT(classify_psn(b, a) == (n == 0 ? PsnOrder::expected : PsnOrder::ahead));
    if (n != 0) RC_ASSERT(classify_psn(a, b) == PsnOrder::duplicate);
    RC_ASSERT(psn_in_range(b, a, n + 1));
    RC_ASSERT(!psn_in_range(b, a, n));
  }));
}

// ---------------------------------------------------------------------------------------
// CM MADs

CmPath gen_path() {
  CmPath p;
  p.local_lid = *rc::gen::arbitrary<std::uint16_t>();
  p.remote_lid = *rc::gen::arbitrary<std::uint16_t>();
  for (auto& b : p.local_gid) b = *rc::gen::arbitrary<std::uint8_t>();
  for (auto& b : p.remote_gid) b = *rc::gen::arbitrary<std::uint8_t>();
  p.flow_label = gen_bits<std::uint32_t>(20);
  p.packet_rate = gen_bits<std::uint8_t>(6);
  p.traffic_class = *rc::gen::arbitrary<std::uint8_t>();
  p.hop_limit = *rc::gen::arbitrary<std::uint8_t>();
  p.sl = gen_bits<std::uint8_t>(4);
  p.subnet_local = gen_bool();
  p.local_ack_timeout = gen_bits<std::uint8_t>(5);
  return p;
}

CmMessage gen_message(CmAttribute which, const Bytes& pd, const Bytes& ari) {
  switch (which) {
    case CmAttribute::req: {
      CmReq r;
      r.local_comm_id = gen_u32();
      r.ece_vendor_id = gen_bits<std::uint32_t>(24);
      r.service_id = gen_u64();
      r.local_ca_guid = gen_u64();
      r.local_qkey = gen_u32();
      r.local_qpn = gen_bits<std::uint32_t>(24);
      r.responder_resources = *rc::gen::arbitrary<std::uint8_t>();
      r.local_eecn = gen_bits<std::uint32_t>(24);
      r.initiator_depth = *rc::gen::arbitrary<std::uint8_t>();
      r.remote_eecn = gen_bits<std::uint32_t>(24);
      r.remote_cm_response_timeout = gen_bits<std::uint8_t>(5);
      r.transport_service_type = gen_bits<TransportServiceType>(2);
      r.end_to_end_flow_control = gen_bool();
      r.starting_psn = gen_bits<std::uint32_t>(24);
      r.local_cm_response_timeout = gen_bits<std::uint8_t>(5);
      r.retry_count = gen_bits<std::uint8_t>(3);
      r.partition_key = *rc::gen::arbitrary<std::uint16_t>();
      r.path_mtu = gen_bits<std::uint8_t>(4);
      r.rdc_exists = gen_bool();
      r.rnr_retry_count = gen_bits<std::uint8_t>(3);
      r.max_cm_retries = gen_bits<std::uint8_t>(4);
      r.srq = gen_bool();
      r.extended_transport_type = gen_bits<std::uint8_t>(3);
      r.primary = gen_path();
      r.alternate = gen_path();
      r.private_data = std::span(pd).first(std::min(pd.size(), kReqPrivateDataSize));
      return r;
    }
    case CmAttribute::mra:
      return CmMra{gen_u32(), gen_u32(), *rc::gen::element(MraTarget::req, MraTarget::rep, MraTarget::lap),
                   gen_bits<std::uint8_t>(5), std::span(pd).first(std::min(pd.size(), kMraPrivateDataSize))};
    case CmAttribute::rej:
      return CmRej{gen_u32(),
                   gen_u32(),
                   *rc::gen::element(RejTarget::req, RejTarget::rep, RejTarget::other),
                   *rc::gen::arbitrary<std::uint16_t>(),
                   ari,
                   std::span(pd).first(std::min(pd.size(), kRejPrivateDataSize))};
    case CmAttribute::rep:
      return CmRep{gen_u32(),
                   gen_u32(),
                   gen_u32(),
                   gen_bits<std::uint32_t>(24),
                   gen_bits<std::uint32_t>(24),
                   gen_bits<std::uint32_t>(24),
                   gen_bits<std::uint32_t>(24),
                   *rc::gen::arbitrary<std::uint8_t>(),
                   *rc::gen::arbitrary<std::uint8_t>(),
                   gen_bits<std::uint8_t>(5),
                   gen_bits<std::uint8_t>(2),
                   gen_bool(),
                   gen_bits<std::uint8_t>(3),
                   gen_bool(),
                   gen_u64(),
                   std::span(pd).first(std::min(pd.size(), kRepPrivateDataSize))};
    case CmAttribute::rtu:
      return CmRtu{gen_u32(), gen_u32(), std::span(pd).first(std::min(pd.size(), kRtuPrivateDataSize))};
    case CmAttribute::dreq:
      return CmDreq{gen_u32(), gen_u32(), gen_bits<std::uint32_t>(24),
                    std::span(pd).first(std::min(pd.size(), kDreqPrivateDataSize))};
    default:
      return CmDrep{gen_u32(), gen_u32(), std::span(pd).first(std::min(pd.size(), kDrepPrivateDataSize))};
  }
}

// The decoded private data is the whole area: the sent bytes, then zeros.
bool private_data_matches(std::span<const std::uint8_t> sent, std::span<const std::uint8_t> received) {
  if (received.size() < sent.size()) return false;
  return std::equal(sent.begin(), sent.end(), received.begin()) &&
         std::all_of(received.begin() + static_cast<std::ptrdiff_t>(sent.size()), received.end(),
                     [](std::uint8_t b) { return b == 0; });
}

void cm_round_trip(CmAttribute which) {
  const Bytes pd = gen_bytes(kRtuPrivateDataSize);
  const Bytes ari = gen_bytes(kMaxRejectInfoSize);
  const CmMad mad{.transaction_id = gen_u64(), .attribute_modifier = gen_u32(), .message = gen_message(which, pd, ari)};
  Bytes wire(kMadSize);
  const auto size = encode_cm_mad(mad, wire);
  RC_ASSERT(size.has_value());
  RC_ASSERT(*size == kMadSize);
  RC_ASSERT(wire[16] == 0 && wire[17] == static_cast<std::uint8_t>(which));
  const auto back = decode_cm_mad(wire);
  RC_ASSERT(back.has_value());
  RC_ASSERT(back->message.index() == mad.message.index());
  // Compare with private data widened to what the receiver sees.
  std::visit(
      [&back](const auto& sent) {
        using T = std::decay_t<decltype(sent)>;
        const T& got = std::get<T>(back->message);
        RC_ASSERT(private_data_matches(sent.private_data, got.private_data));
        T widened = sent;
        widened.private_data = got.private_data;
        RC_ASSERT(test::same_message(widened, got));
      },
      mad.message);
  RC_ASSERT(back->transaction_id == mad.transaction_id);
  RC_ASSERT(back->attribute_modifier == mad.attribute_modifier);
  // Re-encoding what was decoded reproduces the bytes.
  Bytes again(kMadSize);
  RC_ASSERT(encode_cm_mad(*back, again).has_value());
  RC_ASSERT(again == wire);
}

TEST(IbcmRoundTrip, EveryCmMessage) {
  const std::pair<CmAttribute, const char*> kinds[] = {
      {CmAttribute::req, "REQ"},   {CmAttribute::mra, "MRA"},   {CmAttribute::rej, "REJ"}, {CmAttribute::rep, "REP"},
      {CmAttribute::rtu, "RTU"}, {CmAttribute::dreq, "DREQ"}, {CmAttribute::drep, "DREP"}};
  for (const auto& [which, name] : kinds) {
    EXPECT_TRUE(rc::check(std::string("CM round trip: ") + name, [which] { cm_round_trip(which); })) << name;
  }
}

TEST(IbcmRoundTrip, MadHeaderServiceIdAndCmaHeader) {
  EXPECT_TRUE(rc::check("MAD header", [] {
    const MadHeader h{*rc::gen::arbitrary<std::uint8_t>(),  *rc::gen::arbitrary<std::uint8_t>(),
                      *rc::gen::arbitrary<std::uint8_t>(),  *rc::gen::arbitrary<std::uint8_t>(),
                      *rc::gen::arbitrary<std::uint16_t>(), *rc::gen::arbitrary<std::uint16_t>(),
                      gen_u64(),                            *rc::gen::arbitrary<std::uint16_t>(),
                      gen_u32()};
    std::array<std::uint8_t, kMadHeaderSize> out{};
    encode_mad_header(h, out);
    RC_ASSERT(decode_mad_header(out) == h);
  }));
  EXPECT_TRUE(rc::check("rdma_cm service ID", [] {
    const auto space =
        *rc::gen::element(RdmaPortSpace::tcp, RdmaPortSpace::udp, RdmaPortSpace::ib, RdmaPortSpace::ipoib);
    const auto port = *rc::gen::arbitrary<std::uint16_t>();
    const auto id = decode_rdma_ip_service_id(rdma_ip_service_id(space, port));
    RC_ASSERT(id.has_value());
    RC_ASSERT(*id == (RdmaIpServiceId{space, port}));
  }));
  EXPECT_TRUE(rc::check("cma header", [] {
    CmaHeader h;
    h.ip_version = *rc::gen::element(std::uint8_t{4}, std::uint8_t{6});
    h.source_port = *rc::gen::arbitrary<std::uint16_t>();
    for (auto& b : h.source_ip) b = *rc::gen::arbitrary<std::uint8_t>();
    for (auto& b : h.destination_ip) b = *rc::gen::arbitrary<std::uint8_t>();
    const Bytes app = gen_bytes(kCmaReqUserPrivateDataSize);
    std::array<std::uint8_t, kReqPrivateDataSize> pd{};
    RC_ASSERT(encode_cma_private_data(h, app, pd).has_value());
    const auto back = decode_cma_private_data(pd);
    RC_ASSERT(back.has_value());
    RC_ASSERT(back->header == h);
    RC_ASSERT(private_data_matches(app, back->application_data));
    RC_ASSERT(back->application_data.size() == kCmaReqUserPrivateDataSize);
  }));
}

}  // namespace
}  // namespace peercm::wire
