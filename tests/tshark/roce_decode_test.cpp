// Independent-decoder test for RoCEv2 and the IB CM: peercm's codecs encode a CM exchange
// (REQ with rdma_cm's private-data header, MRA, REP, RTU, a rejected REQ, DREQ, DREP) as
// MADs on QP1, and RC traffic on the connection it sets up (Sends with and without
// immediate and invalidate, a three-packet RDMA Write, a Write with immediate, an RDMA Read
// with a three-packet response, ACK, RNR NAK and NAK). Each goes into an Ethernet/IPv4/UDP
// frame to port 4791 of a pcap, and Wireshark's InfiniBand dissector (tshark, PDML) must
// read back the values we encoded.
//
// The ICRC: tshark 4.0 reports the field (infiniband.invariant.crc) without checking it, so
// the test checks that tshark finds our ICRC where roce-ibcm-wire.md §1.4 puts it; it checks
// tshark's verdict only when the dissector offers one, and otherwise says so. Sections "§n"
// below are roce-ibcm-wire.md's.
// Running tshark, skipping or failing without it, and keeping captures: tshark_support.hpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <iostream>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "pcap_writer.hpp"
#include "tshark_support.hpp"
#include "wire/ibcm/cm_message.hpp"
#include "wire/ibcm/gsi.hpp"
#include "wire/ibcm/rdma_cm_ip.hpp"
#include "wire/roce/packet.hpp"
#include "wire/roce/psn.hpp"

namespace {

namespace roce = peercm::wire::roce;
namespace ibcm = peercm::wire::ibcm;
namespace pcap = peercm::pcap;
namespace tshark = peercm::tshark;
using tshark::Bytes;
using tshark::field_number;
using tshark::PdmlField;
using tshark::PdmlGroup;
using tshark::PdmlPacket;
using tshark::to_hex;

// Two hosts; each QP (and QP1) keeps one UDP source port in 0xC000-0xFFFF (§1.1).
constexpr pcap::MacAddress kMacA = {0x02, 0x00, 0x00, 0x00, 0x00, 0x0A};
constexpr pcap::MacAddress kMacB = {0x02, 0x00, 0x00, 0x00, 0x00, 0x0B};
constexpr std::array<std::uint8_t, 4> kIpA = {10, 0, 0, 1};
constexpr std::array<std::uint8_t, 4> kIpB = {10, 0, 0, 2};
constexpr std::uint16_t kGsiPortA = 0xC001;
constexpr std::uint16_t kGsiPortB = 0xC002;
constexpr std::uint16_t kQpPortA = 0xD123;
constexpr std::uint16_t kQpPortB = 0xE456;

constexpr std::uint32_t kQpnA = 0x000123;
constexpr std::uint32_t kQpnB = 0x000456;
constexpr std::uint64_t kGuidA = 0x0002C90300A1B2C3;
constexpr std::uint64_t kGuidB = 0x0002C90300D4E5F6;
constexpr std::array<std::uint8_t, 8> kGuidABytes = {0x00, 0x02, 0xC9, 0x03, 0x00, 0xA1, 0xB2, 0xC3};
constexpr std::uint32_t kCommIdA = 0x1A2B3C4D;
constexpr std::uint32_t kCommIdB = 0x5E6F7081;
constexpr std::uint32_t kPsnA = 0xABCDEF;  // REQ's starting PSN: what B sends with
constexpr std::uint32_t kPsnB = 0xFFFFFE;  // REP's starting PSN: A's requests wrap through 0
constexpr std::uint16_t kRdmaPort = 7471;
constexpr std::uint16_t kActivePort = 0xC350;
constexpr std::size_t kPmtu = 256;

enum class Host : std::uint8_t { a, b };

// One frame of the capture and what tshark should find in it.
struct Frame {
  std::string label;
  Host from = Host::a;
  std::uint16_t source_port = 0;
  roce::PacketHeaders headers;
  Bytes payload;                  // the transport payload (a MAD for CM frames)
  std::optional<ibcm::CmMad> cm;  // the decoded CM message, for CM frames
  Bytes udp;                      // BTH .. ICRC as sent
};

Bytes text(std::string_view s) { return Bytes(s.begin(), s.end()); }

Bytes pattern(std::size_t n, std::uint8_t seed) {
  Bytes out(n);
  for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<std::uint8_t>(seed + 7 * i);
  return out;
}

roce::IcrcPseudoHeader pseudo_for(Host from, std::uint16_t source_port) {
  // The ICRC decision (docs/roce-wire.md): IPv4 identification 0 with DF, which the frames
  // below carry too.
  return roce::IcrcPseudoHeader{
      .ip = roce::Ipv4IcrcFields{.source = from == Host::a ? kIpA : kIpB,
                                 .destination = from == Host::a ? kIpB : kIpA,
                                 .identification = 0,
                                 .flags_fragment = roce::kIpv4DontFragment},
      .udp_source_port = source_port,
      .udp_destination_port = roce::kRoceUdpPort};
}

Bytes encode_udp(const roce::PacketHeaders& headers, const Bytes& payload, Host from, std::uint16_t port) {
  Bytes out(roce::packet_size(headers.bth.opcode, payload.size()));
  const auto size = roce::encode_packet(headers, payload, pseudo_for(from, port), out);
  if (!size) throw std::runtime_error("encode_packet: " + std::string(to_string(size.error())));
  return out;
}

struct Scenario {
  std::vector<Frame> frames;
  Bytes req_private_data;  // the REQ's 92 bytes: cma header + application bytes
  std::uint32_t gsi_psn_a = 0;
  std::uint32_t gsi_psn_b = 0;

  void cm(std::string label, Host from, std::uint64_t tid, ibcm::CmMessage message) {
    Bytes mad(ibcm::kMadSize);
    const ibcm::CmMad cm_mad{.transaction_id = tid, .message = std::move(message)};
    const auto size = ibcm::encode_cm_mad(cm_mad, mad);
    if (!size) throw std::runtime_error("encode_cm_mad: " + std::string(to_string(size.error())));
    std::uint32_t& psn = from == Host::a ? gsi_psn_a : gsi_psn_b;
    const roce::PacketHeaders h = ibcm::gsi_packet_headers(psn++);
    const std::uint16_t port = from == Host::a ? kGsiPortA : kGsiPortB;
    Frame f{.label = std::move(label), .from = from, .source_port = port, .headers = h, .payload = mad, .cm = {},
            .udp = {}};
    f.udp = encode_udp(h, mad, from, port);
    // Keep the decoded message (its spans point into the frame's own MAD bytes).
    frames.push_back(std::move(f));
    auto decoded = ibcm::decode_cm_mad(frames.back().payload);
    if (!decoded) throw std::runtime_error("decode_cm_mad: " + std::string(to_string(decoded.error())));
    frames.back().cm = *decoded;
  }

  void rc(std::string label, Host from, roce::PacketHeaders h, Bytes payload) {
    h.bth.destination_qp = from == Host::a ? kQpnB : kQpnA;
    const std::uint16_t port = from == Host::a ? kQpPortA : kQpPortB;
    Frame f{.label = std::move(label), .from = from, .source_port = port, .headers = h, .payload = std::move(payload),
            .cm = {}, .udp = {}};
    f.udp = encode_udp(f.headers, f.payload, from, port);
    f.headers.bth.pad_count = static_cast<std::uint8_t>(roce::pad_for(f.payload.size()));
    frames.push_back(std::move(f));
  }
};

roce::PacketHeaders request(roce::Opcode op, std::uint32_t psn, bool ack_request = false) {
  roce::PacketHeaders h;
  h.bth.opcode = op;
  h.bth.psn = psn;
  h.bth.ack_request = ack_request;
  return h;
}

roce::PacketHeaders response(roce::Opcode op, std::uint32_t psn, roce::Aeth aeth) {
  roce::PacketHeaders h;
  h.bth.opcode = op;
  h.bth.psn = psn;
  h.aeth = aeth;
  return h;
}

ibcm::CmPath primary_path() {
  return ibcm::CmPath{.local_lid = 0xFFFF,
                      .remote_lid = 0xFFFF,
                      .local_gid = ibcm::ipv4_mapped_gid(kIpA),
                      .remote_gid = ibcm::ipv4_mapped_gid(kIpB),
                      .flow_label = 0,
                      .packet_rate = 3,
                      .traffic_class = 0,
                      .hop_limit = 64,
                      .sl = 0,
                      .subnet_local = false,
                      .local_ack_timeout = 19};
}

std::uint64_t tid_of(std::uint32_t comm_id) { return (std::uint64_t{0x00000001} << 32) | comm_id; }

Scenario build_scenario() {
  using roce::Opcode;
  Scenario s;
  constexpr Host A = Host::a;
  constexpr Host B = Host::b;

  // --- CM on QP1 (§4): REQ (rdma_cm, TCP port space), MRA, REP, RTU.
  s.req_private_data.resize(ibcm::kReqPrivateDataSize);
  const auto cma = ibcm::encode_cma_private_data(ibcm::CmaHeader::ipv4(kIpA, kActivePort, kIpB), text("hello"),
                                                 s.req_private_data);
  if (!cma) throw std::runtime_error("encode_cma_private_data");
  ibcm::CmReq req;
  req.local_comm_id = kCommIdA;
  req.service_id = ibcm::rdma_ip_service_id(ibcm::RdmaPortSpace::tcp, kRdmaPort);
  req.local_ca_guid = kGuidA;
  req.local_qpn = kQpnA;
  req.responder_resources = 16;
  req.initiator_depth = 8;
  req.remote_cm_response_timeout = 20;
  req.transport_service_type = ibcm::TransportServiceType::rc;
  req.end_to_end_flow_control = true;
  req.starting_psn = kPsnA;
  req.local_cm_response_timeout = 21;
  req.retry_count = 7;
  req.partition_key = 0xFFFF;
  req.path_mtu = static_cast<std::uint8_t>(roce::PathMtu::mtu256);
  req.rnr_retry_count = 6;
  req.max_cm_retries = 15;
  req.primary = primary_path();
  req.private_data = s.req_private_data;
  s.cm("CM REQ", A, tid_of(kCommIdA), req);
  s.cm("CM MRA", B, tid_of(kCommIdA),
       ibcm::CmMra{.local_comm_id = kCommIdB, .remote_comm_id = kCommIdA, .message_mraed = ibcm::MraTarget::req,
                   .service_timeout = 24, .private_data = {}});
  const Bytes rep_pd = text("ok");
  s.cm("CM REP", B, tid_of(kCommIdA),
       ibcm::CmRep{.local_comm_id = kCommIdB, .remote_comm_id = kCommIdA, .local_qkey = 0, .local_qpn = kQpnB,
                   .local_eecn = 0, .starting_psn = kPsnB, .ece_vendor_id = 0, .responder_resources = 8,
                   .initiator_depth = 16, .target_ack_delay = 15, .failover_accepted = 0,
                   .end_to_end_flow_control = true, .rnr_retry_count = 5, .srq = true, .local_ca_guid = kGuidB,
                   .private_data = rep_pd});
  s.cm("CM RTU", A, tid_of(kCommIdA), ibcm::CmRtu{.local_comm_id = kCommIdA, .remote_comm_id = kCommIdB});

  // --- RC traffic (§2): A's requests start at the REP's PSN and wrap through 0.
  std::uint32_t psn = kPsnB;
  auto next = [&psn] {
    const std::uint32_t p = psn;
    psn = roce::psn_next(psn);
    return p;
  };
  {
    roce::PacketHeaders h = request(Opcode::rc_send_only, next(), true);
    h.bth.solicited_event = true;
    s.rc("SEND ONLY", A, h, text("hello, RoCE!!"));  // 13 bytes: pad 3
  }
  s.rc("ACK", B, response(Opcode::rc_acknowledge, kPsnB, roce::Aeth::ack(roce::kNoCreditInformation, 1)), {});
  {
    roce::PacketHeaders h = request(Opcode::rc_send_only_immediate, next(), true);
    h.immediate = 0xCAFEBABE;
    s.rc("SEND ONLY with Immediate", A, h, pattern(8, 0x10));
  }
  {
    roce::PacketHeaders h = request(Opcode::rc_send_only_invalidate, next(), true);
    h.invalidate_rkey = 0x00A0B0C0;
    s.rc("SEND ONLY with Invalidate", A, h, pattern(6, 0x20));  // pad 2
  }
  const roce::Reth write_reth{.virtual_address = 0x00007F0000010000, .r_key = 0xA1B2C3D4,
                              .dma_length = 2 * kPmtu + 37};
  {
    roce::PacketHeaders h = request(Opcode::rc_rdma_write_first, next());
    h.reth = write_reth;
    s.rc("RDMA WRITE FIRST", A, h, pattern(kPmtu, 0x30));
  }
  s.rc("RDMA WRITE MIDDLE", A, request(Opcode::rc_rdma_write_middle, next()), pattern(kPmtu, 0x40));
  s.rc("RDMA WRITE LAST", A, request(Opcode::rc_rdma_write_last, next(), true), pattern(37, 0x50));  // pad 3
  {
    roce::PacketHeaders h = request(Opcode::rc_rdma_write_only_immediate, next(), true);
    h.reth = roce::Reth{.virtual_address = 0x00007F0000020000, .r_key = 0x0BADF00D, .dma_length = 5};
    h.immediate = 0x01020304;
    s.rc("RDMA WRITE ONLY with Immediate", A, h, pattern(5, 0x60));  // pad 3
  }
  const std::uint32_t last_write = roce::psn_sub(psn, 1);
  s.rc("ACK (coalesced)", B, response(Opcode::rc_acknowledge, last_write, roce::Aeth::ack(12, 5)), {});
  // A READ of 600 bytes at PMTU 256 takes three PSNs and three responses (§2.9).
  const std::uint32_t read_psn = psn;
  {
    roce::PacketHeaders h = request(Opcode::rc_rdma_read_request, read_psn, true);
    h.reth = roce::Reth{.virtual_address = 0x00007F0000200000, .r_key = 0x00ABCD01, .dma_length = 600};
    s.rc("RDMA READ REQUEST", A, h, {});
    psn = roce::psn_add(psn, 3);
  }
  s.rc("RDMA READ RESPONSE FIRST", B,
       response(Opcode::rc_rdma_read_response_first, read_psn, roce::Aeth::ack(roce::kNoCreditInformation, 6)),
       pattern(kPmtu, 0x70));
  s.rc("RDMA READ RESPONSE MIDDLE", B, request(Opcode::rc_rdma_read_response_middle, roce::psn_add(read_psn, 1)),
       pattern(kPmtu, 0x80));
  s.rc("RDMA READ RESPONSE LAST", B,
       response(Opcode::rc_rdma_read_response_last, roce::psn_add(read_psn, 2),
                roce::Aeth::ack(roce::kNoCreditInformation, 6)),
       pattern(600 - 2 * kPmtu, 0x90));
  const std::uint32_t rnr_psn = next();
  s.rc("SEND ONLY (no receive posted)", A, request(Opcode::rc_send_only, rnr_psn, true), pattern(4, 0xA0));
  s.rc("RNR NAK", B, response(Opcode::rc_acknowledge, rnr_psn, roce::Aeth::rnr_nak(14, 6)), {});
  s.rc("NAK PSN sequence error", B,
       response(Opcode::rc_acknowledge, rnr_psn, roce::Aeth::nak(roce::NakCode::psn_sequence_error, 6)), {});

  // --- Release, then a second attempt that B rejects.
  // Older kernels put a 2-bit sequence (2 for DREQ) in TID bits 31-30 (§3.3).
  s.cm("CM DREQ", A, tid_of(kCommIdA) | 0x80000000,
       ibcm::CmDreq{.local_comm_id = kCommIdA, .remote_comm_id = kCommIdB, .remote_qpn = kQpnB});
  s.cm("CM DREP", B, tid_of(kCommIdA) | 0x80000000,
       ibcm::CmDrep{.local_comm_id = kCommIdB, .remote_comm_id = kCommIdA});
  ibcm::CmReq again = req;
  again.local_comm_id = kCommIdA + 1;
  again.local_qpn = kQpnA + 1;
  again.starting_psn = 0x000001;
  s.cm("CM REQ (second)", A, tid_of(kCommIdA + 1), again);
  const Bytes rej_pd = text("busy");
  s.cm("CM REJ", B, tid_of(kCommIdA + 1),
       ibcm::CmRej{.local_comm_id = 0, .remote_comm_id = kCommIdA + 1, .message_rejected = ibcm::RejTarget::req,
                   .reason = ibcm::rej_reason::kConsumerReject, .ari = {}, .private_data = rej_pd});
  // A REJ with additional reject information: reason 4 (timeout) carries the sender's CA
  // GUID (§4.8).
  s.cm("CM REJ (timeout, with ARI)", A, tid_of(kCommIdA + 2),
       ibcm::CmRej{.local_comm_id = kCommIdA + 2, .remote_comm_id = kCommIdB + 2,
                   .message_rejected = ibcm::RejTarget::rep, .reason = ibcm::rej_reason::kTimeout,
                   .ari = kGuidABytes, .private_data = {}});
  return s;
}

// Each frame: Ethernet | IPv4 (ID 0, DF, TTL 64) | UDP (correct checksum) | our bytes.
// `corrupt_frame` flips one payload byte after the ICRC was computed.
std::size_t write_capture(const std::filesystem::path& path, const Scenario& s,
                          std::optional<std::size_t> corrupt_frame = std::nullopt) {
  pcap::PcapFile file(path, pcap::kLinktypeEthernet);
  if (!file.ok()) throw std::runtime_error("cannot create " + path.string());
  std::uint64_t clock_us = 1'700'000'000'000'000;
  for (std::size_t i = 0; i < s.frames.size(); ++i) {
    const Frame& f = s.frames[i];
    Bytes udp = f.udp;
    if (corrupt_frame == i) udp[udp.size() - roce::kIcrcSize - 1] ^= 0x01;
    const bool from_a = f.from == Host::a;
    const Bytes ip = pcap::build_ipv4_udp_packet(pcap::UdpDatagram{
        .source = {.address = from_a ? kIpA : kIpB, .port = f.source_port},
        .destination = {.address = from_a ? kIpB : kIpA, .port = roce::kRoceUdpPort},
        .ip_id = 0,
        .dont_fragment = true,
        .payload = udp});
    file.write_packet(pcap::build_ethernet_frame(from_a ? kMacA : kMacB, from_a ? kMacB : kMacA,
                                                 pcap::kEthertypeIpv4, ip),
                      clock_us);
    clock_us += 100;
  }
  file.flush();
  if (!file.ok()) throw std::runtime_error("write failed: " + path.string());
  return s.frames.size();
}

// ---------------------------------------------------------------------------------------

class RoceDecodeTest : public tshark::TsharkTest {
 protected:
  std::optional<tshark::Pdml> dissect(const std::filesystem::path& capture) {
    // UDP 4791 is the InfiniBand dissector's by default (infiniband.rroce.port); keep the
    // RPC-over-RDMA heuristic off our opaque Send payloads (§8), and have tshark
    // verify the writer's IPv4 and UDP checksums.
    const std::string options =
        "--disable-heuristic rpcrdma_infiniband -o ip.check_checksum:TRUE -o udp.check_checksum:TRUE";
    return TsharkTest::dissect(capture, options, "infiniband");
  }
};

// ---------------------------------------------------------------------------------------
// Checks

void expect_number(const PdmlPacket& p, std::string_view name, std::uint64_t expected) {
  const PdmlField* f = p.find(name);
  ASSERT_NE(f, nullptr) << "tshark did not report field " << name;
  const auto v = field_number(f);
  ASSERT_TRUE(v.has_value()) << name << " has non-numeric show=\"" << f->show << "\"";
  EXPECT_EQ(*v, expected) << name << " (tshark: " << f->showname << ")";
}

void expect_show(const PdmlPacket& p, std::string_view name, std::string_view expected) {
  const PdmlField* f = p.find(name);
  ASSERT_NE(f, nullptr) << "tshark did not report field " << name;
  EXPECT_EQ(f->show, expected) << name << " (tshark: " << f->showname << ")";
}

void expect_bytes(const PdmlPacket& p, std::string_view name, std::span<const std::uint8_t> expected) {
  const PdmlField* f = p.find(name);
  ASSERT_NE(f, nullptr) << "tshark did not report field " << name;
  EXPECT_EQ(f->value, to_hex(expected)) << name << " (tshark: " << f->showname << ")";
}

void expect_status_good(const PdmlPacket& p, std::string_view name) {
  const PdmlField* f = p.find(name);
  ASSERT_NE(f, nullptr) << "tshark did not report " << name;
  EXPECT_NE(f->showname.find("Good"), std::string::npos) << f->showname;
}

Bytes padded(const Bytes& payload) {
  Bytes out = payload;
  out.resize(payload.size() + roce::pad_for(payload.size()), 0);
  return out;
}

// The frame around our bytes: what the ICRC decision and §1.1 and §7 rows 1-2 require.
void check_ip_udp(const PdmlPacket& p, const Frame& f) {
  expect_status_good(p, "ip.checksum.status");
  expect_status_good(p, "udp.checksum.status");
  expect_number(p, "ip.id", 0);
  expect_number(p, "ip.flags.df", 1);
  expect_number(p, "ip.len", 28 + f.udp.size());
  expect_number(p, "udp.length", 8 + f.udp.size());
  expect_number(p, "udp.dstport", roce::kRoceUdpPort);
  expect_number(p, "udp.srcport", f.source_port);
  EXPECT_GE(f.source_port, 0xC000);
  EXPECT_EQ(p.find("_ws.malformed"), nullptr) << "malformed packet";
  for (const auto& field : p.fields) {
    if (field.name != "_ws.expert") continue;
    EXPECT_EQ(field.showname.find("(Warning/"), std::string::npos) << field.showname;
    EXPECT_EQ(field.showname.find("(Error/"), std::string::npos) << field.showname;
  }
}

// tshark reads the four ICRC bytes as a big-endian number (§8); we store the CRC
// least-significant byte first (§1.4 step 5).
std::uint32_t icrc_as_tshark_reads_it(const Bytes& udp) {
  const std::uint8_t* c = udp.data() + udp.size() - roce::kIcrcSize;
  return (std::uint32_t{c[0]} << 24) | (std::uint32_t{c[1]} << 16) | (std::uint32_t{c[2]} << 8) | c[3];
}

void check_transport(const PdmlPacket& p, const Frame& f) {
  const roce::PacketHeaders& h = f.headers;
  const roce::Bth& b = h.bth;
  expect_number(p, "infiniband.bth.opcode", static_cast<std::uint8_t>(b.opcode));
  expect_number(p, "infiniband.bth.se", b.solicited_event ? 1 : 0);
  expect_number(p, "infiniband.bth.m", b.migration_request ? 1 : 0);
  expect_number(p, "infiniband.bth.padcnt", b.pad_count);
  expect_number(p, "infiniband.bth.tver", 0);
  expect_number(p, "infiniband.bth.p_key", b.partition_key);
  expect_number(p, "infiniband.bth.destqp", b.destination_qp);
  expect_number(p, "infiniband.bth.a", b.ack_request ? 1 : 0);
  expect_number(p, "infiniband.bth.reserved7", 0);
  expect_number(p, "infiniband.bth.psn", b.psn);
  expect_number(p, "infiniband.invariant.crc", icrc_as_tshark_reads_it(f.udp));

  const std::uint8_t ext = roce::opcode_info(b.opcode).headers;
  EXPECT_EQ(p.find("infiniband.deth") != nullptr, (ext & roce::ext::kDeth) != 0);
  EXPECT_EQ(p.find("infiniband.reth") != nullptr, (ext & roce::ext::kReth) != 0);
  EXPECT_EQ(p.find("infiniband.aeth") != nullptr, (ext & roce::ext::kAeth) != 0);
  EXPECT_EQ(p.find("infiniband.immdt") != nullptr, (ext & roce::ext::kImmDt) != 0);
  EXPECT_EQ(p.find("infiniband.ieth") != nullptr, (ext & roce::ext::kIeth) != 0);
  if (ext & roce::ext::kDeth) {
    expect_number(p, "infiniband.deth.q_key", h.deth.q_key);
    expect_number(p, "infiniband.deth.srcqp", h.deth.source_qp);
  }
  if (ext & roce::ext::kReth) {
    expect_number(p, "infiniband.reth.va", h.reth.virtual_address);
    expect_number(p, "infiniband.reth.r_key", h.reth.r_key);
    expect_number(p, "infiniband.reth.dmalen", h.reth.dma_length);
  }
  if (ext & roce::ext::kAeth) {
    expect_number(p, "infiniband.aeth.syndrome", h.aeth.syndrome());
    expect_number(p, "infiniband.aeth.syndrome.opcode", static_cast<std::uint8_t>(h.aeth.kind));
    switch (h.aeth.kind) {
      case roce::AethKind::ack: expect_number(p, "infiniband.aeth.syndrome.credit_count", h.aeth.value); break;
      case roce::AethKind::rnr_nak: expect_number(p, "infiniband.aeth.syndrome.timer", h.aeth.value); break;
      case roce::AethKind::nak: expect_number(p, "infiniband.aeth.syndrome.error_code", h.aeth.value); break;
    }
    expect_number(p, "infiniband.aeth.msn", h.aeth.msn);
  }
  if (ext & roce::ext::kImmDt) {
    const std::array<std::uint8_t, 4> imm = {static_cast<std::uint8_t>(h.immediate >> 24),
                                             static_cast<std::uint8_t>(h.immediate >> 16),
                                             static_cast<std::uint8_t>(h.immediate >> 8),
                                             static_cast<std::uint8_t>(h.immediate)};
    expect_bytes(p, "infiniband.immdt", imm);
  }
  if (ext & roce::ext::kIeth) {
    const std::array<std::uint8_t, 4> rkey = {static_cast<std::uint8_t>(h.invalidate_rkey >> 24),
                                              static_cast<std::uint8_t>(h.invalidate_rkey >> 16),
                                              static_cast<std::uint8_t>(h.invalidate_rkey >> 8),
                                              static_cast<std::uint8_t>(h.invalidate_rkey)};
    expect_bytes(p, "infiniband.ieth", rkey);
  }
  if (!f.cm) {
    // tshark 4.0 hands the payload to "data" with the pad bytes still on.
    if (f.payload.empty()) {
      EXPECT_EQ(p.find("data.data"), nullptr);
    } else {
      expect_bytes(p, "data.data", padded(f.payload));
    }
  }
}

void check_mad_header(const PdmlPacket& p, const ibcm::CmMad& mad) {
  expect_number(p, "infiniband.mad.baseversion", 1);
  expect_number(p, "infiniband.mad.mgmtclass", 0x07);
  expect_number(p, "infiniband.mad.classversion", 2);
  expect_number(p, "infiniband.mad.method", 0x03);
  expect_number(p, "infiniband.mad.status", 0);
  expect_number(p, "infiniband.mad.classspecific", 0);
  expect_number(p, "infiniband.mad.transactionid", mad.transaction_id);
  expect_number(p, "infiniband.mad.attributeid", static_cast<std::uint16_t>(ibcm::attribute_of(mad.message)));
  expect_number(p, "infiniband.mad.attributemodifier", mad.attribute_modifier);
}

void check_req(const PdmlPacket& p, const ibcm::CmReq& r, const Bytes& mad) {
  expect_number(p, "infiniband.cm.req", r.local_comm_id);
  expect_number(p, "infiniband.cm.req.serviceid", r.service_id);
  // Annex A11 IP-CM service ID: prefix 0000000001, protocol 0x06 (TCP), port.
  expect_bytes(p, "infiniband.cm.req.serviceid.prefix", Bytes{0, 0, 0, 0, 1});
  expect_number(p, "infiniband.cm.req.serviceid.protocol", 0x06);
  expect_number(p, "infiniband.cm.req.serviceid.dport", kRdmaPort);
  expect_number(p, "infiniband.cm.req.localcaguid", r.local_ca_guid);
  expect_number(p, "infiniband.cm.req.localqkey", r.local_qkey);
  expect_number(p, "infiniband.cm.req.localqpn", r.local_qpn);
  expect_number(p, "infiniband.cm.req.responderres", r.responder_resources);
  expect_number(p, "infiniband.cm.req.localeecn", r.local_eecn);
  expect_number(p, "infiniband.cm.req.initdepth", r.initiator_depth);
  expect_number(p, "infiniband.cm.req.remoteeecn", r.remote_eecn);
  expect_number(p, "infiniband.cm.req.remoteresptout", r.remote_cm_response_timeout);
  expect_number(p, "infiniband.cm.req.transpsvctype", static_cast<std::uint8_t>(r.transport_service_type));
  expect_number(p, "infiniband.cm.req.e2eflowctrl", r.end_to_end_flow_control ? 1 : 0);
  expect_number(p, "infiniband.cm.req.startpsn", r.starting_psn);
  expect_number(p, "infiniband.cm.req.localresptout", r.local_cm_response_timeout);
  expect_number(p, "infiniband.cm.req.retrcount", r.retry_count);
  expect_number(p, "infiniband.cm.req.pkey", r.partition_key);
  expect_number(p, "infiniband.cm.req.pppmtu", r.path_mtu);
  expect_number(p, "infiniband.cm.req.rdcexist", r.rdc_exists ? 1 : 0);
  expect_number(p, "infiniband.cm.req.rnrretrcount", r.rnr_retry_count);
  expect_number(p, "infiniband.cm.req.maxcmretr", r.max_cm_retries);
  expect_number(p, "infiniband.cm.req.srq", r.srq ? 1 : 0);
  expect_number(p, "infiniband.cm.req.ext_transport", r.extended_transport_type);
  expect_number(p, "infiniband.cm.req.prim_locallid", r.primary.local_lid);
  expect_number(p, "infiniband.cm.req.prim_remotelid", r.primary.remote_lid);
  // IPv4-mapped GIDs, which tshark shows as IPv4 addresses (§4.7).
  expect_show(p, "infiniband.cm.req.prim_localgid_ipv4", "10.0.0.1");
  expect_show(p, "infiniband.cm.req.prim_remotegid_ipv4", "10.0.0.2");
  expect_number(p, "infiniband.cm.req.prim_tfcclass", r.primary.traffic_class);
  expect_number(p, "infiniband.cm.req.prim_hoplim", r.primary.hop_limit);
  expect_number(p, "infiniband.cm.req.prim_sl", r.primary.sl);
  expect_number(p, "infiniband.cm.req.prim_subnetlocal", r.primary.subnet_local ? 1 : 0);
  expect_number(p, "infiniband.cm.req.prim_localacktout", r.primary.local_ack_timeout);
  // tshark 4.0 misdecodes the flow label / packet rate word (§8), so those four bytes
  // (REQ 88-91) are checked raw in the MAD data it delimited.
  const PdmlField* data = p.find("infiniband.mad.data");
  ASSERT_NE(data, nullptr);
  const Bytes word(mad.begin() + ibcm::kMadHeaderSize + 88, mad.begin() + ibcm::kMadHeaderSize + 92);
  EXPECT_EQ(data->value.substr(2 * 88, 8), to_hex(word));
  EXPECT_EQ(to_hex(word), "00000003");  // flow label 0, packet rate 3 (10 Gb/s)
  // rdma_cm's private-data header (§6), as tshark's IP-CM decoder reads it.
  expect_number(p, "infiniband.cm.req.ip_cm.majv", 0);
  expect_number(p, "infiniband.cm.req.ip_cm.minv", 0);
  expect_number(p, "infiniband.cm.req.ip_cm.ipv", 4);
  expect_number(p, "infiniband.cm.req.ip_cm.sport", kActivePort);
  expect_show(p, "infiniband.cm.req.ip_cm.sip4", "10.0.0.1");
  expect_show(p, "infiniband.cm.req.ip_cm.dip4", "10.0.0.2");
  Bytes user = text("hello");
  user.resize(ibcm::kCmaReqUserPrivateDataSize, 0);
  expect_bytes(p, "infiniband.cm.req.ip_cm.private", user);
}

void check_rep(const PdmlPacket& p, const ibcm::CmRep& r) {
  expect_number(p, "infiniband.cm.rep", r.local_comm_id);
  expect_number(p, "infiniband.cm.rep.remotecommid", r.remote_comm_id);
  expect_number(p, "infiniband.cm.rep.localqkey", r.local_qkey);
  expect_number(p, "infiniband.cm.rep.localqpn", r.local_qpn);
  expect_number(p, "infiniband.cm.rep.localeecn", r.local_eecn);
  expect_number(p, "infiniband.cm.rep.startpsn", r.starting_psn);
  expect_number(p, "infiniband.cm.rep.respres", r.responder_resources);
  expect_number(p, "infiniband.cm.rep.initdepth", r.initiator_depth);
  expect_number(p, "infiniband.cm.rep.tgtackdelay", r.target_ack_delay);
  expect_number(p, "infiniband.cm.rep.failoveracc", r.failover_accepted);
  expect_number(p, "infiniband.cm.rep.e2eflowctrl", r.end_to_end_flow_control ? 1 : 0);
  expect_number(p, "infiniband.cm.rep.rnrretrcount", r.rnr_retry_count);
  expect_number(p, "infiniband.cm.rep.srq", r.srq ? 1 : 0);
  expect_number(p, "infiniband.cm.rep.localcaguid", r.local_ca_guid);
  expect_bytes(p, "infiniband.cm.rep.private", r.private_data);
}

void check_rej(const PdmlPacket& p, const ibcm::CmRej& r) {
  expect_number(p, "infiniband.cm.rej.localcommid", r.local_comm_id);
  expect_number(p, "infiniband.cm.rej.remotecommid", r.remote_comm_id);
  expect_number(p, "infiniband.cm.rej.msgrej", static_cast<std::uint8_t>(r.message_rejected));
  expect_number(p, "infiniband.cm.rej.rejinfolen", r.ari.size());
  expect_number(p, "infiniband.cm.rej.reason", r.reason);
  Bytes ari(r.ari.begin(), r.ari.end());
  ari.resize(ibcm::kMaxRejectInfoSize, 0);
  expect_bytes(p, "infiniband.cm.rej.ari", ari);
  expect_bytes(p, "infiniband.cm.rej.private", r.private_data);
}

void check_cm(const PdmlPacket& p, const Frame& f) {
  const ibcm::CmMad& mad = *f.cm;
  check_mad_header(p, mad);
  // The 232 bytes after the MAD header, as tshark delimits them, are ours.
  expect_bytes(p, "infiniband.mad.data", std::span(f.payload).subspan(ibcm::kMadHeaderSize));
  if (const auto* req = std::get_if<ibcm::CmReq>(&mad.message)) {
    check_req(p, *req, f.payload);
  } else if (const auto* rep = std::get_if<ibcm::CmRep>(&mad.message)) {
    check_rep(p, *rep);
  } else if (const auto* rtu = std::get_if<ibcm::CmRtu>(&mad.message)) {
    expect_number(p, "infiniband.cm.rtu.localcommid", rtu->local_comm_id);
    expect_number(p, "infiniband.cm.rtu.remotecommid", rtu->remote_comm_id);
    expect_bytes(p, "infiniband.cm.rtu.private", rtu->private_data);
  } else if (const auto* rej = std::get_if<ibcm::CmRej>(&mad.message)) {
    check_rej(p, *rej);
  } else if (const auto* dreq = std::get_if<ibcm::CmDreq>(&mad.message)) {
    expect_number(p, "infiniband.cm.dreq.localcommid", dreq->local_comm_id);
    expect_number(p, "infiniband.cm.dreq.remotecommid", dreq->remote_comm_id);
    // tshark files the DREQ's Remote QPN under "req" (§8).
    expect_number(p, "infiniband.cm.req.remoteqpneecn", dreq->remote_qpn);
    expect_bytes(p, "infiniband.cm.dreq.private", dreq->private_data);
  } else if (const auto* drep = std::get_if<ibcm::CmDrep>(&mad.message)) {
    expect_number(p, "infiniband.cm.drsp.localcommid", drep->local_comm_id);
    expect_number(p, "infiniband.cm.drsp.remotecommid", drep->remote_comm_id);
    expect_bytes(p, "infiniband.cm.drsp.private", drep->private_data);
  } else {
    // MRA: tshark 4.0 has no MRA decoder ("Dissector Not Implemented", §8); the
    // attribute ID and the raw data above are what it confirms.
    ASSERT_TRUE(std::holds_alternative<ibcm::CmMra>(mad.message));
  }
}

// ---------------------------------------------------------------------------------------

TEST_F(RoceDecodeTest, TsharkDecodesCmAndRcTrafficAsEncoded) {
  const Scenario s = build_scenario();
  pcap_path_ = dir_ / "peercm-roce.pcap";
  SCOPED_TRACE("capture: " + pcap_path_.string());
  const std::size_t frames = write_capture(pcap_path_, s);
  const auto pdml = dissect(pcap_path_);
  ASSERT_TRUE(pdml.has_value());
  SCOPED_TRACE("dissector: " + pdml->creator);
  ASSERT_EQ(pdml->packets.size(), frames);
  std::size_t cm_frames = 0;
  for (std::size_t i = 0; i < frames; ++i) {
    const Frame& f = s.frames[i];
    const PdmlPacket& p = pdml->packets[i];
    SCOPED_TRACE("frame " + std::to_string(i + 1) + ": " + f.label);
    ASSERT_EQ(p.groups.size(), 1u) << "not dissected as InfiniBand";
    check_ip_udp(p, f);
    check_transport(p, f);
    if (f.cm) {
      ++cm_frames;
      check_cm(p, f);
    }
  }
  EXPECT_EQ(cm_frames, 9u);
}

// Where tshark can verify the ICRC, one flipped payload byte must turn exactly that frame's
// verdict to bad. tshark 4.0 cannot (it shows infiniband.invariant.crc and nothing else), so
// there the test confirms that tshark still reads the ICRC field we sent and skips with the
// reason; the ICRC itself is checked by the unit tests against a ConnectX-4 Lx capture.
TEST_F(RoceDecodeTest, TsharkChecksTheIcrcWhenItCan) {
  const Scenario s = build_scenario();
  pcap_path_ = dir_ / "peercm-roce-corrupted.pcap";
  SCOPED_TRACE("capture: " + pcap_path_.string());
  constexpr std::size_t kCorrupted = 4;  // SEND ONLY
  ASSERT_EQ(s.frames[kCorrupted].headers.bth.opcode, roce::Opcode::rc_send_only);
  write_capture(pcap_path_, s, kCorrupted);
  const auto pdml = dissect(pcap_path_);
  ASSERT_TRUE(pdml.has_value());
  ASSERT_EQ(pdml->packets.size(), s.frames.size());

  bool has_verdict = false;
  for (std::size_t i = 0; i < s.frames.size(); ++i) {
    SCOPED_TRACE("frame " + std::to_string(i + 1) + ": " + s.frames[i].label);
    const PdmlPacket& p = pdml->packets[i];
    expect_number(p, "infiniband.invariant.crc", icrc_as_tshark_reads_it(s.frames[i].udp));
    const PdmlField* crc = p.find("infiniband.invariant.crc");
    ASSERT_NE(crc, nullptr);
    // Wireshark marks checked checksums "[correct]" / "[incorrect ...]" and adds a status field.
    const PdmlField* status = p.find("infiniband.invariant.crc.status");
    const bool correct = crc->showname.find("[correct]") != std::string::npos;
    const bool incorrect = crc->showname.find("[incorrect") != std::string::npos;
    if (status == nullptr && !correct && !incorrect) continue;
    has_verdict = true;
    const bool good = status != nullptr ? status->showname.find("Good") != std::string::npos : correct;
    EXPECT_EQ(good, i != kCorrupted) << crc->showname;
  }
  if (!has_verdict) {
    GTEST_SKIP() << pdml->creator << " reports the ICRC (infiniband.invariant.crc) without checking it";
  }
}

}  // namespace
