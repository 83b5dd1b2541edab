// IB CM MADs against layouts written byte by byte from roce-ibcm-wire.md §3-4 and §6: the
// MAD header, REQ (with both paths), REP, MRA, REJ, RTU, DREQ, DREP, rdma_cm's service IDs and
// private-data header, IPv4-mapped GIDs, and the QP1 datagram around a MAD.
#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <variant>
#include <vector>

#include "hex_bytes.hpp"
#include "wire/ibcm/cm_message.hpp"
#include "wire/ibcm/gid.hpp"
#include "wire/ibcm/gsi.hpp"
#include "wire/ibcm/rdma_cm_ip.hpp"
#include "wire/roce/packet.hpp"

namespace peercm::wire::ibcm {
namespace {

using test::Bytes;
using test::hex;

Bytes pattern(std::size_t n, std::uint8_t seed) {
  Bytes out(n);
  for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<std::uint8_t>(seed + 3 * i);
  return out;
}

// Expected MADs are built by writing fields at "MAD byte 24 + offset" (§4.2), big-endian.
struct MadBytes {
  Bytes b = Bytes(kMadSize, 0);
  void u8(std::size_t off, unsigned v) { b[24 + off] = static_cast<std::uint8_t>(v); }
  void be(std::size_t off, std::uint64_t v, std::size_t width) {
    for (std::size_t i = 0; i < width; ++i) b[24 + off + i] = static_cast<std::uint8_t>(v >> (8 * (width - 1 - i)));
  }
  void bytes(std::size_t off, const Bytes& v) {
    for (std::size_t i = 0; i < v.size(); ++i) b[24 + off + i] = v[i];
  }
  void header(std::uint16_t attribute, std::uint64_t tid, std::uint32_t modifier = 0) {
    const Bytes h = hex("01 07 02 03 0000 0000");
    for (std::size_t i = 0; i < h.size(); ++i) b[i] = h[i];
    for (std::size_t i = 0; i < 8; ++i) b[8 + i] = static_cast<std::uint8_t>(tid >> (56 - 8 * i));
    b[16] = static_cast<std::uint8_t>(attribute >> 8);
    b[17] = static_cast<std::uint8_t>(attribute);
    for (std::size_t i = 0; i < 4; ++i) b[20 + i] = static_cast<std::uint8_t>(modifier >> (24 - 8 * i));
  }
};

Bytes encode(const CmMad& mad) {
  Bytes out(kMadSize);
  const auto size = encode_cm_mad(mad, out);
  EXPECT_TRUE(size.has_value()) << to_string(size.error());
  return out;
}

template <class T>
const T& decoded_as(const Result<CmMad, WireError>& mad) {
  EXPECT_TRUE(mad.has_value());
  EXPECT_TRUE(std::holds_alternative<T>(mad->message));
  return std::get<T>(mad->message);
}

// ---------------------------------------------------------------------------------------

TEST(Mad, CommonHeaderLayout) {
  const MadHeader h{.method = method::kGetResp, .status = 0x0102, .class_specific = 0x0304,
                    .transaction_id = 0x1122334455667788, .attribute_id = 0x0001, .attribute_modifier = 0xA0B0C0D0};
  std::array<std::uint8_t, kMadHeaderSize> out{};
  encode_mad_header(h, out);
  EXPECT_EQ(Bytes(out.begin(), out.end()), hex("01 07 02 81 0102 0304 1122334455667788 0001 0000 a0b0c0d0"));
  EXPECT_EQ(decode_mad_header(out), h);
  out[18] = 0xFF;  // reserved: ignored
  EXPECT_EQ(decode_mad_header(out), h);
}

TEST(CmAttributes, IdsOfTheSheet) {
  EXPECT_EQ(attribute_of(CmReq{}), CmAttribute::req);
  EXPECT_EQ(static_cast<std::uint16_t>(CmAttribute::req), 0x0010);
  EXPECT_EQ(static_cast<std::uint16_t>(CmAttribute::mra), 0x0011);
  EXPECT_EQ(static_cast<std::uint16_t>(CmAttribute::rej), 0x0012);
  EXPECT_EQ(static_cast<std::uint16_t>(CmAttribute::rep), 0x0013);
  EXPECT_EQ(static_cast<std::uint16_t>(CmAttribute::rtu), 0x0014);
  EXPECT_EQ(static_cast<std::uint16_t>(CmAttribute::dreq), 0x0015);
  EXPECT_EQ(static_cast<std::uint16_t>(CmAttribute::drep), 0x0016);
  EXPECT_EQ(attribute_of(CmDrep{}), CmAttribute::drep);
  EXPECT_EQ(timeout_ns(0), 4096u);
  EXPECT_EQ(timeout_ns(20), 4096ull << 20);  // ≈ 4.3 s, mainline's CM response timeout
}

// ---------------------------------------------------------------------------------------
// REQ

CmPath sample_path(std::uint8_t seed) {
  return CmPath{.local_lid = 0xFFFF,
                .remote_lid = static_cast<std::uint16_t>(0x1200 + seed),
                .local_gid = ipv4_mapped_gid({10, 0, 0, seed}),
                .remote_gid = ipv4_mapped_gid({10, 0, 1, seed}),
                .flow_label = 0xABCDE,
                .packet_rate = 0x2A,
                .traffic_class = 0xB8,
                .hop_limit = 64,
                .sl = 0x9,
                .subnet_local = true,
                .local_ack_timeout = 19};
}

void expect_path_bytes(MadBytes& m, std::size_t off, const CmPath& p) {
  m.be(off, p.local_lid, 2);
  m.be(off + 2, p.remote_lid, 2);
  m.bytes(off + 4, Bytes(p.local_gid.begin(), p.local_gid.end()));
  m.bytes(off + 20, Bytes(p.remote_gid.begin(), p.remote_gid.end()));
  // flow label in bytes 88-89 and the high nibble of 90; rate in the low 6 bits of 91
  m.u8(off + 36, p.flow_label >> 12);
  m.u8(off + 37, (p.flow_label >> 4) & 0xFF);
  m.u8(off + 38, (p.flow_label & 0xF) << 4);
  m.u8(off + 39, p.packet_rate);
  m.u8(off + 40, p.traffic_class);
  m.u8(off + 41, p.hop_limit);
  m.u8(off + 42, (p.sl << 4) | (p.subnet_local ? 0x08 : 0));
  m.u8(off + 43, p.local_ack_timeout << 3);
}

TEST(CmReq, EveryFieldAtItsSheetOffset) {
  const Bytes pd = pattern(kReqPrivateDataSize, 0x40);
  CmReq req;
  req.local_comm_id = 0x11223344;
  req.ece_vendor_id = 0x0002C9;
  req.service_id = rdma_ip_service_id(RdmaPortSpace::tcp, 7471);
  req.local_ca_guid = 0x0002C90300A1B2C3;
  req.local_qkey = 0x01020304;
  req.local_qpn = 0x000ABC;
  req.responder_resources = 16;
  req.local_eecn = 0x00DEF0;
  req.initiator_depth = 8;
  req.remote_eecn = 0x123456;
  req.remote_cm_response_timeout = 20;
  req.transport_service_type = TransportServiceType::uc;
  req.end_to_end_flow_control = true;
  req.starting_psn = 0xC0FFEE;
  req.local_cm_response_timeout = 22;
  req.retry_count = 7;
  req.partition_key = 0xFFFF;
  req.path_mtu = 3;
  req.rdc_exists = true;
  req.rnr_retry_count = 6;
  req.max_cm_retries = 15;
  req.srq = true;
  req.extended_transport_type = 1;
  req.primary = sample_path(1);
  req.alternate = sample_path(2);
  req.private_data = pd;

  MadBytes m;
  m.header(0x0010, 0xAABBCCDD00000001, 0x00000003);
  m.be(0, 0x11223344, 4);
  m.be(5, 0x0002C9, 3);
  m.bytes(8, hex("00000000 0106 1d2f"));  // §6: TCP-space port 7471
  m.be(16, 0x0002C90300A1B2C3, 8);
  m.be(28, 0x01020304, 4);
  m.be(32, 0x000ABC, 3);
  m.u8(35, 16);
  m.be(36, 0x00DEF0, 3);
  m.u8(39, 8);
  m.be(40, 0x123456, 3);
  m.u8(43, (20 << 3) | (1 << 1) | 1);
  m.be(44, 0xC0FFEE, 3);
  m.u8(47, (22 << 3) | 7);
  m.be(48, 0xFFFF, 2);
  m.u8(50, (3 << 4) | 0x08 | 6);
  m.u8(51, (15 << 4) | 0x08 | 1);
  expect_path_bytes(m, 52, req.primary);
  expect_path_bytes(m, 96, req.alternate);
  m.bytes(140, pd);

  const Bytes wire = encode(CmMad{.transaction_id = 0xAABBCCDD00000001, .attribute_modifier = 3, .message = req});
  EXPECT_EQ(wire, m.b);

  const auto mad = decode_cm_mad(wire);
  const CmReq& d = decoded_as<CmReq>(mad);
  EXPECT_EQ(mad->transaction_id, 0xAABBCCDD00000001u);
  EXPECT_EQ(mad->attribute_modifier, 3u);
  EXPECT_EQ(d.local_comm_id, req.local_comm_id);
  EXPECT_EQ(d.ece_vendor_id, req.ece_vendor_id);
  EXPECT_EQ(d.service_id, 0x0000000001061D2Fu);
  EXPECT_EQ(d.local_ca_guid, req.local_ca_guid);
  EXPECT_EQ(d.local_qkey, req.local_qkey);
  EXPECT_EQ(d.local_qpn, req.local_qpn);
  EXPECT_EQ(d.responder_resources, req.responder_resources);
  EXPECT_EQ(d.local_eecn, req.local_eecn);
  EXPECT_EQ(d.initiator_depth, req.initiator_depth);
  EXPECT_EQ(d.remote_eecn, req.remote_eecn);
  EXPECT_EQ(d.remote_cm_response_timeout, req.remote_cm_response_timeout);
  EXPECT_EQ(d.transport_service_type, req.transport_service_type);
  EXPECT_EQ(d.end_to_end_flow_control, req.end_to_end_flow_control);
  EXPECT_EQ(d.starting_psn, req.starting_psn);
  EXPECT_EQ(d.local_cm_response_timeout, req.local_cm_response_timeout);
  EXPECT_EQ(d.retry_count, req.retry_count);
  EXPECT_EQ(d.partition_key, req.partition_key);
  EXPECT_EQ(d.path_mtu, req.path_mtu);
  EXPECT_EQ(d.rdc_exists, req.rdc_exists);
  EXPECT_EQ(d.rnr_retry_count, req.rnr_retry_count);
  EXPECT_EQ(d.max_cm_retries, req.max_cm_retries);
  EXPECT_EQ(d.srq, req.srq);
  EXPECT_EQ(d.extended_transport_type, req.extended_transport_type);
  EXPECT_EQ(d.primary, req.primary);
  EXPECT_EQ(d.alternate, req.alternate);
  EXPECT_EQ(Bytes(d.private_data.begin(), d.private_data.end()), pd);
}

TEST(CmReq, ShortPrivateDataIsZeroFilledAndReservedBitsIgnored) {
  CmReq req;
  const Bytes pd = hex("0102");
  req.private_data = pd;
  Bytes wire = encode(CmMad{.message = req});
  for (std::size_t i = 24 + 140 + 2; i < kMadSize; ++i) EXPECT_EQ(wire[i], 0) << i;
  // Reserved: byte 4, 24-27, the path's reserved bits (90 low nibble, 91 top two, 94 low
  // three, 95 low three: byte 139 bit 5 is "SAP supported" in newer kernels).
  for (const std::size_t off : {4u, 24u, 25u, 26u, 27u}) wire[24 + off] = 0xFF;
  wire[24 + 90] = 0x0F;
  wire[24 + 91] = 0xC0;
  wire[24 + 94] = 0x07;
  wire[24 + 95] = 0x07;
  wire[24 + 139] = 0x04;
  const auto mad = decode_cm_mad(wire);
  const CmReq& d = decoded_as<CmReq>(mad);
  EXPECT_EQ(d.primary, CmPath{});
  EXPECT_EQ(d.alternate, CmPath{});
  EXPECT_EQ(d.ece_vendor_id, 0u);
  EXPECT_EQ(d.local_qkey, 0u);
}

// ---------------------------------------------------------------------------------------
// REP

TEST(CmRep, EveryFieldAtItsSheetOffset) {
  const Bytes pd = pattern(kRepPrivateDataSize, 0x10);
  const CmRep rep{.local_comm_id = 0x55667788,
                  .remote_comm_id = 0x11223344,
                  .local_qkey = 0x0A0B0C0D,
                  .local_qpn = 0x000DEF,
                  .local_eecn = 0x00ABCD,
                  .starting_psn = 0x7654321 & 0xFFFFFF,
                  .ece_vendor_id = 0xA1B2C3,
                  .responder_resources = 4,
                  .initiator_depth = 2,
                  .target_ack_delay = 15,
                  .failover_accepted = 2,
                  .end_to_end_flow_control = true,
                  .rnr_retry_count = 7,
                  .srq = true,
                  .local_ca_guid = 0x0011223344556677,
                  .private_data = pd};
  MadBytes m;
  m.header(0x0013, 42);
  m.be(0, 0x55667788, 4);
  m.be(4, 0x11223344, 4);
  m.be(8, 0x0A0B0C0D, 4);
  m.be(12, 0x000DEF, 3);
  m.u8(15, 0xA1);
  m.be(16, 0x00ABCD, 3);
  m.u8(19, 0xB2);
  m.be(20, 0x654321, 3);
  m.u8(23, 0xC3);
  m.u8(24, 4);
  m.u8(25, 2);
  m.u8(26, (15 << 3) | (2 << 1) | 1);
  m.u8(27, (7 << 5) | 0x10);
  m.be(28, 0x0011223344556677, 8);
  m.bytes(36, pd);
  const Bytes wire = encode(CmMad{.transaction_id = 42, .message = rep});
  EXPECT_EQ(wire, m.b);

  const auto mad = decode_cm_mad(wire);
  const CmRep& d = decoded_as<CmRep>(mad);
  EXPECT_EQ(d.local_comm_id, rep.local_comm_id);
  EXPECT_EQ(d.remote_comm_id, rep.remote_comm_id);
  EXPECT_EQ(d.local_qkey, rep.local_qkey);
  EXPECT_EQ(d.local_qpn, rep.local_qpn);
  EXPECT_EQ(d.local_eecn, rep.local_eecn);
  EXPECT_EQ(d.starting_psn, rep.starting_psn);
  EXPECT_EQ(d.ece_vendor_id, rep.ece_vendor_id);
  EXPECT_EQ(d.responder_resources, rep.responder_resources);
  EXPECT_EQ(d.initiator_depth, rep.initiator_depth);
  EXPECT_EQ(d.target_ack_delay, rep.target_ack_delay);
  EXPECT_EQ(d.failover_accepted, rep.failover_accepted);
  EXPECT_EQ(d.end_to_end_flow_control, rep.end_to_end_flow_control);
  EXPECT_EQ(d.rnr_retry_count, rep.rnr_retry_count);
  EXPECT_EQ(d.srq, rep.srq);
  EXPECT_EQ(d.local_ca_guid, rep.local_ca_guid);
  EXPECT_EQ(Bytes(d.private_data.begin(), d.private_data.end()), pd);
}

// ---------------------------------------------------------------------------------------
// MRA, REJ, RTU, DREQ, DREP

TEST(CmMra, Layout) {
  const Bytes pd = pattern(kMraPrivateDataSize, 1);
  const CmMra mra{.local_comm_id = 1, .remote_comm_id = 2, .message_mraed = MraTarget::rep, .service_timeout = 24,
                  .private_data = pd};
  MadBytes m;
  m.header(0x0011, 7);
  m.be(0, 1, 4);
  m.be(4, 2, 4);
  m.u8(8, 1 << 6);
  m.u8(9, 24 << 3);
  m.bytes(10, pd);
  const Bytes wire = encode(CmMad{.transaction_id = 7, .message = mra});
  EXPECT_EQ(wire, m.b);
  const auto mad = decode_cm_mad(wire);
  const CmMra& d = decoded_as<CmMra>(mad);
  EXPECT_EQ(d.message_mraed, MraTarget::rep);
  EXPECT_EQ(d.service_timeout, 24);
  EXPECT_EQ(Bytes(d.private_data.begin(), d.private_data.end()), pd);
}

TEST(CmRej, LayoutWithAriAndPrivateData) {
  const Bytes pd = pattern(kRejPrivateDataSize, 2);
  const Bytes ari = hex("0002c90300a1b2c3");  // reason 4 (timeout): the sender's CA GUID
  const CmRej rej{.local_comm_id = 0, .remote_comm_id = 0x99, .message_rejected = RejTarget::rep,
                  .reason = rej_reason::kTimeout, .ari = ari, .private_data = pd};
  MadBytes m;
  m.header(0x0012, 8);
  m.be(4, 0x99, 4);
  m.u8(8, 1 << 6);
  m.u8(9, 8 << 1);
  m.be(10, 4, 2);
  m.bytes(12, ari);
  m.bytes(84, pd);
  const Bytes wire = encode(CmMad{.transaction_id = 8, .message = rej});
  EXPECT_EQ(wire, m.b);
  const auto mad = decode_cm_mad(wire);
  const CmRej& d = decoded_as<CmRej>(mad);
  EXPECT_EQ(d.message_rejected, RejTarget::rep);
  EXPECT_EQ(d.reason, rej_reason::kTimeout);
  EXPECT_EQ(Bytes(d.ari.begin(), d.ari.end()), ari);
  EXPECT_EQ(Bytes(d.private_data.begin(), d.private_data.end()), pd);
}

TEST(CmRej, ConsumerRejectWithTheFullAri) {
  const Bytes ari = pattern(kMaxRejectInfoSize, 9);
  const CmRej rej{.message_rejected = RejTarget::req, .reason = rej_reason::kConsumerReject, .ari = ari};
  const Bytes wire = encode(CmMad{.message = rej});
  EXPECT_EQ(wire[24 + 9], 72 << 1);
  EXPECT_EQ(wire[24 + 11], 28);
  const auto mad = decode_cm_mad(wire);
  EXPECT_EQ(decoded_as<CmRej>(mad).ari.size(), kMaxRejectInfoSize);
}

TEST(CmRtuDreqDrep, Layouts) {
  const Bytes pd = pattern(kRtuPrivateDataSize, 3);
  {
    MadBytes m;
    m.header(0x0014, 9);
    m.be(0, 0xA, 4);
    m.be(4, 0xB, 4);
    m.bytes(8, pd);
    const Bytes wire = encode(CmMad{.transaction_id = 9, .message = CmRtu{0xA, 0xB, pd}});
    EXPECT_EQ(wire, m.b);
    const auto mad = decode_cm_mad(wire);
    EXPECT_EQ(decoded_as<CmRtu>(mad).remote_comm_id, 0xBu);
  }
  {
    const Bytes dreq_pd(pd.begin(), pd.begin() + kDreqPrivateDataSize);
    MadBytes m;
    m.header(0x0015, 10);
    m.be(0, 0xC, 4);
    m.be(4, 0xD, 4);
    m.be(8, 0xFEDCBA, 3);
    m.bytes(12, dreq_pd);
    const Bytes wire = encode(CmMad{.transaction_id = 10, .message = CmDreq{0xC, 0xD, 0xFEDCBA, dreq_pd}});
    EXPECT_EQ(wire, m.b);
    Bytes reserved = wire;
    reserved[24 + 11] = 0xFF;  // reserved byte after the QPN: ignored
    const auto mad = decode_cm_mad(reserved);
    EXPECT_EQ(decoded_as<CmDreq>(mad).remote_qpn, 0xFEDCBAu);
  }
  {
    MadBytes m;
    m.header(0x0016, 10);
    m.be(0, 0xD, 4);
    m.be(4, 0xC, 4);
    m.bytes(8, pd);
    const Bytes wire = encode(CmMad{.transaction_id = 10, .message = CmDrep{0xD, 0xC, pd}});
    EXPECT_EQ(wire, m.b);
    const auto mad = decode_cm_mad(wire);
    EXPECT_EQ(Bytes(decoded_as<CmDrep>(mad).private_data.begin(), decoded_as<CmDrep>(mad).private_data.end()), pd);
  }
}

TEST(CmEncoders, RefuseValuesWiderThanTheirFields) {
  Bytes out(kMadSize);
  const Bytes too_long(kReqPrivateDataSize + 1, 0);
  CmReq req;
  req.private_data = too_long;
  EXPECT_EQ(encode_cm_mad(CmMad{.message = req}, out).error(), WireError::ibcm_private_data_too_long);
  const auto out_of_range = [&out](const CmMessage& msg) {
    const auto r = encode_cm_mad(CmMad{.message = msg}, out);
    return !r.has_value() && r.error() == WireError::ibcm_field_out_of_range;
  };
  CmReq r;
  r.local_qpn = 0x1000000;
  EXPECT_TRUE(out_of_range(r));
  r = CmReq{};
  r.starting_psn = 0x1000000;
  EXPECT_TRUE(out_of_range(r));
  r = CmReq{};
  r.remote_cm_response_timeout = 32;
  EXPECT_TRUE(out_of_range(r));
  r = CmReq{};
  r.retry_count = 8;
  EXPECT_TRUE(out_of_range(r));
  r = CmReq{};
  r.path_mtu = 16;
  EXPECT_TRUE(out_of_range(r));
  r = CmReq{};
  r.primary.flow_label = 0x100000;
  EXPECT_TRUE(out_of_range(r));
  r = CmReq{};
  r.alternate.packet_rate = 64;
  EXPECT_TRUE(out_of_range(r));
  r = CmReq{};
  r.transport_service_type = static_cast<TransportServiceType>(4);
  EXPECT_TRUE(out_of_range(r));
  CmRep rep;
  rep.rnr_retry_count = 8;
  EXPECT_TRUE(out_of_range(rep));
  rep = CmRep{};
  rep.ece_vendor_id = 0x1000000;
  EXPECT_TRUE(out_of_range(rep));
  EXPECT_TRUE(out_of_range(CmMra{.service_timeout = 32}));
  const Bytes ari(kMaxRejectInfoSize + 1, 0);
  EXPECT_TRUE(out_of_range(CmRej{.ari = ari}));
  EXPECT_TRUE(out_of_range(CmDreq{.remote_qpn = 0x1000000}));
  EXPECT_EQ(encode_cm_mad(CmMad{.message = CmMra{.message_mraed = static_cast<MraTarget>(3)}}, out).error(),
            WireError::ibcm_reserved_value);
  EXPECT_EQ(encode_cm_mad(CmMad{.message = CmRej{.message_rejected = static_cast<RejTarget>(3)}}, out).error(),
            WireError::ibcm_reserved_value);
  Bytes small(kMadSize - 1);
  EXPECT_EQ(encode_cm_mad(CmMad{.message = CmRtu{}}, small).error(), WireError::buffer_too_small);
}

// ---------------------------------------------------------------------------------------
// rdma_cm over the IB CM (§6)

TEST(RdmaCm, ServiceIds) {
  EXPECT_EQ(rdma_ip_service_id(RdmaPortSpace::tcp, 7471), 0x0000000001061D2Fu);
  EXPECT_EQ(rdma_ip_service_id(RdmaPortSpace::udp, 1), 0x0000000001110001u);
  EXPECT_EQ(rdma_ip_service_id(RdmaPortSpace::ib, 0xFFFF), 0x00000000013FFFFFu);
  EXPECT_EQ(rdma_ip_service_id(RdmaPortSpace::ipoib, 2), 0x0000000000020002u);
  for (const RdmaPortSpace ps : {RdmaPortSpace::tcp, RdmaPortSpace::udp, RdmaPortSpace::ib, RdmaPortSpace::ipoib}) {
    const auto id = decode_rdma_ip_service_id(rdma_ip_service_id(ps, 4791));
    ASSERT_TRUE(id.has_value());
    EXPECT_EQ(*id, (RdmaIpServiceId{ps, 4791}));
  }
  EXPECT_EQ(decode_rdma_ip_service_id(0x0000000101061D2F).error(), WireError::ibcm_not_ip_service_id);
  EXPECT_EQ(decode_rdma_ip_service_id(0x0000000001071D2F).error(), WireError::ibcm_not_ip_service_id);
  EXPECT_EQ(decode_rdma_ip_service_id(0).error(), WireError::ibcm_not_ip_service_id);
}

TEST(RdmaCm, CmaHeaderIpv4InTheReqPrivateData) {
  const Bytes app = pattern(kCmaReqUserPrivateDataSize, 0x70);
  const CmaHeader h = CmaHeader::ipv4({192, 168, 1, 10}, 0xC350, {192, 168, 1, 20});
  std::array<std::uint8_t, kReqPrivateDataSize> pd{};
  const auto size = encode_cma_private_data(h, app, pd);
  ASSERT_TRUE(size.has_value());
  EXPECT_EQ(*size, kReqPrivateDataSize);
  EXPECT_EQ(kCmaReqUserPrivateDataSize, 56u);
  Bytes expected = hex("00 40 c350 000000000000000000000000 c0a8010a 000000000000000000000000 c0a80114");
  expected.insert(expected.end(), app.begin(), app.end());
  EXPECT_EQ(Bytes(pd.begin(), pd.end()), expected);

  // In a REQ: source IPv4 at REQ offsets 156-159, destination at 172-175 (§6).
  CmReq req;
  req.private_data = pd;
  const Bytes wire = encode(CmMad{.message = req});
  EXPECT_EQ(Bytes(wire.begin() + 24 + 156, wire.begin() + 24 + 160), hex("c0a8010a"));
  EXPECT_EQ(Bytes(wire.begin() + 24 + 172, wire.begin() + 24 + 176), hex("c0a80114"));

  const auto mad = decode_cm_mad(wire);
  const auto cma = decode_cma_private_data(decoded_as<CmReq>(mad).private_data);
  ASSERT_TRUE(cma.has_value());
  EXPECT_EQ(cma->header, h);
  EXPECT_EQ(CmaHeader::ipv4_of(cma->header.source_ip), (Ipv4Address{192, 168, 1, 10}));
  EXPECT_EQ(CmaHeader::ipv4_of(cma->header.destination_ip), (Ipv4Address{192, 168, 1, 20}));
  EXPECT_EQ(Bytes(cma->application_data.begin(), cma->application_data.end()), app);
}

TEST(RdmaCm, CmaHeaderIpv6AndRefusals) {
  CmaHeader h;
  h.ip_version = 6;
  h.source_port = 1;
  h.source_ip = {0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
  h.destination_ip = {0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2};
  std::array<std::uint8_t, kReqPrivateDataSize> pd{};
  ASSERT_TRUE(encode_cma_private_data(h, {}, pd).has_value());
  EXPECT_EQ(pd[1], 0x60);
  const auto back = decode_cma_private_data(pd);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->header, h);

  const Bytes too_long(57, 0);
  EXPECT_EQ(encode_cma_private_data(h, too_long, pd).error(), WireError::ibcm_private_data_too_long);
  std::array<std::uint8_t, kReqPrivateDataSize - 1> small{};
  EXPECT_EQ(encode_cma_private_data(h, {}, small).error(), WireError::buffer_too_small);
  h.ip_version = 5;
  EXPECT_EQ(encode_cma_private_data(h, {}, pd).error(), WireError::cma_bad_ip_version);
}

TEST(Gid, Ipv4Mapped) {
  const Gid gid = ipv4_mapped_gid({10, 1, 2, 3});
  EXPECT_EQ(Bytes(gid.begin(), gid.end()), hex("00000000000000000000ffff0a010203"));
  EXPECT_TRUE(is_ipv4_mapped(gid));
  EXPECT_EQ(ipv4_of_gid(gid), (Ipv4Address{10, 1, 2, 3}));
  Gid v6 = gid;
  v6[10] = 0;
  EXPECT_FALSE(ipv4_of_gid(v6).has_value());
  v6 = gid;
  v6[0] = 0xFE;
  EXPECT_FALSE(ipv4_of_gid(v6).has_value());
}

// ---------------------------------------------------------------------------------------
// The QP1 datagram (§0, §3.1)

TEST(Gsi, AMadDatagramHasTheSheetsSizesAndHeaders) {
  Bytes mad(kMadSize);
  ASSERT_TRUE(encode_cm_mad(CmMad{.transaction_id = 1, .message = CmRtu{1, 2, {}}}, mad).has_value());
  const roce::PacketHeaders h = gsi_packet_headers(0x1000001);
  EXPECT_EQ(h.bth.psn, 1u);
  const roce::IcrcPseudoHeader pseudo{.ip = roce::Ipv4IcrcFields{.source = {10, 0, 0, 1}, .destination = {10, 0, 0, 2}},
                                      .udp_source_port = 0xC001};
  Bytes udp(roce::packet_size(roce::Opcode::ud_send_only, kMadSize));
  ASSERT_TRUE(roce::encode_packet(h, mad, pseudo, udp).has_value());
  EXPECT_EQ(udp.size() + 8, 288u);        // UDP length
  EXPECT_EQ(udp.size() + 8 + 20, 308u);   // IPv4 total length
  EXPECT_EQ(Bytes(udp.begin(), udp.begin() + 20), hex("64 00 ffff 00 000001 00 000001 | 80010000 00 000001"));

  const auto view = roce::decode_verified_packet(udp, pseudo);
  ASSERT_TRUE(view.has_value());
  const auto payload = mad_of_gsi_packet(*view);
  ASSERT_TRUE(payload.has_value());
  EXPECT_EQ(Bytes(payload->begin(), payload->end()), mad);
  EXPECT_TRUE(decode_cm_mad(*payload).has_value());
}

TEST(Gsi, RefusesWhatIsNotAMadForQp1) {
  roce::PacketView view;
  view.headers = gsi_packet_headers(0);
  const Bytes mad(kMadSize);
  view.payload = mad;
  EXPECT_TRUE(mad_of_gsi_packet(view).has_value());
  roce::PacketView v = view;
  v.headers.bth.destination_qp = 2;
  EXPECT_EQ(mad_of_gsi_packet(v).error(), WireError::gsi_not_a_mad_datagram);
  v = view;
  v.headers.bth.opcode = roce::Opcode::ud_send_only_immediate;
  EXPECT_EQ(mad_of_gsi_packet(v).error(), WireError::gsi_not_a_mad_datagram);
  v = view;
  v.headers.deth.q_key = 0x80010001;
  EXPECT_EQ(mad_of_gsi_packet(v).error(), WireError::gsi_bad_qkey);
  v = view;
  v.payload = std::span(mad).first(kMadSize - 4);
  EXPECT_EQ(mad_of_gsi_packet(v).error(), WireError::mad_bad_length);
}

}  // namespace
}  // namespace peercm::wire::ibcm
