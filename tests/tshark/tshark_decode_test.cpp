// Independent-decoder test: peercm's wire codecs encode an MPA startup exchange and a set
// of FPDUs (CRC on) covering every RDMAP opcode; the bytes go into a synthetic pcap of one
// TCP connection, and Wireshark's own iWARP dissectors (tshark, PDML output) must read back
// exactly the values we encoded, including a good CRC-32C on every FPDU.
// Running tshark, skipping or failing without it, and keeping captures: tshark_support.hpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "pcap_writer.hpp"
#include "tshark_support.hpp"
#include "wire/cm_header.hpp"
#include "wire/ddp_rdmap.hpp"
#include "wire/fpdu.hpp"
#include "wire/mpa_frame.hpp"

namespace {

namespace wire = peercm::wire;
namespace pcap = peercm::pcap;
namespace tshark = peercm::tshark;
using tshark::field_number;
using tshark::from_hex;
using tshark::Pdml;
using tshark::PdmlField;
using tshark::PdmlGroup;
using tshark::PdmlPacket;
using tshark::to_hex;
using Direction = pcap::TcpConversation::Direction;
using Bytes = std::vector<std::uint8_t>;

// 20049 (IANA "nfsrdma") has no TCP port dissector in tshark 4.0, so the iwarp_mpa
// heuristic dissector is what claims the stream. (iwarp_mpa is heuristic-only: it cannot
// be selected with "-d tcp.port==...,iwarp_mpa".)
constexpr pcap::Ipv4Endpoint kClient{.address = {10, 0, 0, 1}, .port = 40000};
constexpr pcap::Ipv4Endpoint kServer{.address = {10, 0, 0, 2}, .port = 20049};

// ---------------------------------------------------------------------------------------
// The conversation: what we encode, and what we therefore expect tshark to report.

struct ExpectedFpdu {
  std::string label;
  Direction from = Direction::client_to_server;
  wire::SegmentHeader header;
  Bytes payload;
  Bytes wire;  // the encoded FPDU
};

struct Scenario {
  Bytes request;
  Bytes reply;
  std::vector<ExpectedFpdu> fpdus;
};

Bytes pattern(std::size_t n, std::uint8_t seed) {
  Bytes out(n);
  for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<std::uint8_t>(seed + 7 * i);
  return out;
}

Bytes encode_mpa(const wire::MpaFrame& frame) {
  auto size = wire::mpa_frame_size(frame);
  if (!size) throw std::runtime_error("mpa_frame_size: " + std::string(wire::to_string(size.error())));
  Bytes out(*size);
  auto written = wire::encode_mpa_frame(frame, out);
  if (!written) throw std::runtime_error("encode_mpa_frame: " + std::string(wire::to_string(written.error())));
  out.resize(*written);
  return out;
}

Bytes encode_fpdu_crc(const wire::SegmentHeader& header, std::span<const std::uint8_t> payload) {
  Bytes out(wire::fpdu_wire_size(wire::segment_header_size(header) + payload.size()));
  auto written = wire::encode_fpdu(header, payload, /*with_crc=*/true, out);
  if (!written) throw std::runtime_error("encode_fpdu: " + std::string(wire::to_string(written.error())));
  out.resize(*written);
  return out;
}

// CM header + application bytes: the peer-to-peer connect request's private data.
constexpr wire::IrdOrdBlock kRequestBlock{
    .peer_to_peer = true, .send_rtr = false, .write_rtr = true, .read_rtr = true, .ird = 16, .ord = 8};
constexpr wire::IrdOrdBlock kReplyBlock{
    .peer_to_peer = true, .send_rtr = false, .write_rtr = true, .read_rtr = false, .ird = 8, .ord = 16};
// The same blocks written out by hand from iwarp-wire.md §4.2 (A=0x8000, B=0x4000 in the
// IRD word; C=0x8000, D=0x4000 in the ORD word; 14-bit values), so the check on tshark's
// private-data bytes does not depend on our encoder.
constexpr std::array<std::uint8_t, 4> kRequestBlockBytes = {0x80, 0x10, 0xC0, 0x08};
constexpr std::array<std::uint8_t, 4> kReplyBlockBytes = {0x80, 0x08, 0x80, 0x10};

const Bytes kRequestAppData = {'h', 'e', 'l', 'l', 'o', '!'};
const Bytes kReplyAppData = {'o', 'k'};

Bytes request_ulp_private_data() {
  const wire::CmHeader cm{.flags = wire::CmHeader::kFlagPeerToPeer,
                          .node_guid = 0x0011223344556677,
                          .incarnation = 0x0000000100000002,
                          .listen_port = kServer.port,
                          .tag = 0xCAFEF00D,
                          .cmid = 42};
  Bytes out(wire::kCmHeaderSize);
  auto written = wire::encode_cm_header(cm, out);
  if (!written) throw std::runtime_error("encode_cm_header: " + std::string(wire::to_string(written.error())));
  out.insert(out.end(), kRequestAppData.begin(), kRequestAppData.end());
  return out;
}

wire::SegmentHeader untagged(wire::RdmapOpcode op, std::uint32_t msn, std::uint32_t invalidate_stag = 0) {
  wire::SegmentHeader h;
  h.opcode = op;
  h.last = true;
  h.queue_number = wire::queue_number_for(op);
  h.msn = msn;
  h.message_offset = 0;
  h.invalidate_stag = invalidate_stag;
  return h;
}

wire::SegmentHeader tagged(wire::RdmapOpcode op, std::uint32_t stag, std::uint64_t offset, bool last) {
  wire::SegmentHeader h;
  h.opcode = op;
  h.last = last;
  h.stag = stag;
  h.tagged_offset = offset;
  return h;
}

Scenario build_scenario() {
  using wire::RdmapOpcode;
  Scenario s;
  const Bytes request_pd = request_ulp_private_data();
  s.request = encode_mpa(wire::MpaFrame{.kind = wire::MpaFrameKind::request,
                                        .markers = false,
                                        .crc = true,
                                        .rejected = false,
                                        .revision = 2,
                                        .enhanced = kRequestBlock,
                                        .private_data = request_pd});
  s.reply = encode_mpa(wire::MpaFrame{.kind = wire::MpaFrameKind::reply,
                                      .markers = false,
                                      .crc = true,
                                      .rejected = false,
                                      .revision = 2,
                                      .enhanced = kReplyBlock,
                                      .private_data = kReplyAppData});

  auto add = [&s](std::string label, Direction from, const wire::SegmentHeader& h, Bytes payload) {
    ExpectedFpdu e{.label = std::move(label), .from = from, .header = h, .payload = std::move(payload), .wire = {}};
    e.wire = encode_fpdu_crc(e.header, e.payload);
    s.fpdus.push_back(std::move(e));
  };
  constexpr auto c2s = Direction::client_to_server;
  constexpr auto s2c = Direction::server_to_client;

  // RFC 6581 RTR: zero-length RDMA Write (iwarp-wire.md §4.5: STag 1, TO 0).
  add("RTR zero-length Write", c2s, tagged(RdmapOpcode::rdma_write, 1, 0, true), {});
  // Payload lengths 7/6/5/8 give pads 1/2/3/0 after an 18-byte untagged header.
  add("Send", c2s, untagged(RdmapOpcode::send, 1), pattern(7, 0x10));
  add("Send with SE", s2c, untagged(RdmapOpcode::send_solicited, 1), pattern(6, 0x20));
  add("Send with Invalidate", c2s, untagged(RdmapOpcode::send_invalidate, 2, 0x11223344), pattern(5, 0x30));
  add("Send with SE and Invalidate", s2c, untagged(RdmapOpcode::send_solicited_invalidate, 2, 0x55667788),
      pattern(8, 0x40));
  // A three-segment RDMA Write: TO advances by each segment's payload, L only on the last.
  constexpr std::uint32_t kWriteStag = 0xA1B2C3D4;
  constexpr std::uint64_t kWriteTo = 0x00007F0000010000;
  add("RDMA Write segment 1/3", c2s, tagged(RdmapOpcode::rdma_write, kWriteStag, kWriteTo, false),
      pattern(100, 0x50));
  add("RDMA Write segment 2/3", c2s, tagged(RdmapOpcode::rdma_write, kWriteStag, kWriteTo + 100, false),
      pattern(100, 0x60));
  add("RDMA Write segment 3/3", c2s, tagged(RdmapOpcode::rdma_write, kWriteStag, kWriteTo + 200, true),
      pattern(37, 0x70));
  // Read Request from the client; the server answers with a two-segment Read Response.
  constexpr std::uint32_t kSinkStag = 0x00ABCD01;
  constexpr std::uint64_t kSinkTo = 0x00007F0000200000;
  wire::SegmentHeader read = untagged(RdmapOpcode::read_request, 1);
  read.read_request = wire::ReadRequestHeader{.sink_stag = kSinkStag,
                                              .sink_offset = kSinkTo,
                                              .size = 300,
                                              .source_stag = 0x00BEEF02,
                                              .source_offset = 0x0000000000002000};
  add("Read Request", c2s, read, {});
  add("Read Response segment 1/2", s2c, tagged(RdmapOpcode::read_response, kSinkStag, kSinkTo, false),
      pattern(200, 0x80));
  add("Read Response segment 2/2", s2c, tagged(RdmapOpcode::read_response, kSinkStag, kSinkTo + 200, true),
      pattern(100, 0x90));
  // Terminate from the server: DDP untagged-buffer error "MSN - no buffer" (0x1/0x2/0x02)
  // with M and D set, echoing the offending Send's DDP header and segment length.
  const ExpectedFpdu& offending = s.fpdus[1];
  wire::SegmentHeader term = untagged(RdmapOpcode::terminate, 1);
  term.terminate.code = wire::TerminateCode{.layer = wire::TerminateLayer::ddp, .error_type = 2, .error_code = 2};
  term.terminate.segment_length_valid = true;
  term.terminate.ddp_segment_length =
      static_cast<std::uint16_t>(wire::segment_header_size(offending.header) + offending.payload.size());
  term.terminate.ddp_header_length = static_cast<std::uint8_t>(wire::kUntaggedHeaderSize);
  std::copy_n(offending.wire.begin() + wire::kUlpduLengthSize, wire::kUntaggedHeaderSize,
              term.terminate.ddp_header.begin());
  add("Terminate", s2c, term, {});
  return s;
}

// The pcap: handshake, Request, Reply, every FPDU (one TCP segment each), FIN exchange.
// `corrupt_fpdu` flips one byte of that FPDU after its CRC was computed.
std::size_t write_capture(const std::filesystem::path& path, const Scenario& s,
                          std::optional<std::size_t> corrupt_fpdu = std::nullopt) {
  pcap::PcapFile file(path);
  if (!file.ok()) throw std::runtime_error("cannot create " + path.string());
  pcap::TcpConversation tcp(file, kClient, kServer, 0x10000000, 0xF0000000);
  tcp.handshake();
  tcp.send(Direction::client_to_server, s.request);
  tcp.send(Direction::server_to_client, s.reply);
  for (std::size_t i = 0; i < s.fpdus.size(); ++i) {
    Bytes bytes = s.fpdus[i].wire;
    if (corrupt_fpdu == i) bytes[bytes.size() - wire::kFpduCrcSize - 1] ^= 0x01;  // last PAD/payload byte
    tcp.send(s.fpdus[i].from, bytes);
  }
  tcp.close();
  file.flush();
  if (!file.ok()) throw std::runtime_error("write failed: " + path.string());
  return tcp.packets_written();
}

// ---------------------------------------------------------------------------------------
// Fixture

class TsharkDecodeTest : public tshark::TsharkTest {
 protected:
  std::optional<Pdml> dissect(const std::filesystem::path& capture) {
    // iwarp_mpa is heuristic-only; make sure it is on and runs before any port dissector.
    std::string options = "--enable-heuristic iwarp_mpa_tcp -o tcp.try_heuristic_first:TRUE";
    // Send payloads are opaque test bytes: keep the RPC-over-RDMA and SMB Direct heuristics
    // off them (tshark 4.0's RPCoRDMA heuristic claimed our 5- and 7-byte plain Sends and
    // threw "Malformed Packet").
    options += " --disable-heuristic rpcrdma_iwarp --disable-heuristic smb_direct_iwarp";
    // Also have tshark verify the writer's IPv4 and TCP checksums.
    options += " -o ip.check_checksum:TRUE -o tcp.check_checksum:TRUE";
    return TsharkTest::dissect(capture, options, "iwarp_mpa");
  }
};

// ---------------------------------------------------------------------------------------
// Checks

void expect_number(const PdmlGroup& pdu, std::string_view name, std::uint64_t expected) {
  const PdmlField* f = pdu.find(name);
  ASSERT_NE(f, nullptr) << "tshark did not report field " << name;
  const auto v = field_number(f);
  ASSERT_TRUE(v.has_value()) << name << " has non-numeric show=\"" << f->show << "\"";
  EXPECT_EQ(*v, expected) << name << " (tshark: " << f->showname << ")";
}

void expect_bytes(const PdmlGroup& pdu, std::string_view name, std::span<const std::uint8_t> expected) {
  const PdmlField* f = pdu.find(name);
  ASSERT_NE(f, nullptr) << "tshark did not report field " << name;
  EXPECT_EQ(f->value, to_hex(expected)) << name << " (tshark: " << f->showname << ")";
}

std::uint32_t crc_field_as_big_endian(const Bytes& fpdu) {
  const std::uint8_t* c = fpdu.data() + fpdu.size() - wire::kFpduCrcSize;
  return (std::uint32_t{c[0]} << 24) | (std::uint32_t{c[1]} << 16) | (std::uint32_t{c[2]} << 8) | c[3];
}

void check_startup_frame(const PdmlGroup& pdu, wire::MpaFrameKind kind, const Bytes& frame,
                         std::span<const std::uint8_t> block_bytes) {
  const bool request = kind == wire::MpaFrameKind::request;
  const std::string_view key = request ? "MPA ID Req Frame" : "MPA ID Rep Frame";
  EXPECT_NE(pdu.find(request ? "iwarp_mpa.req" : "iwarp_mpa.rep"), nullptr);
  expect_bytes(pdu, request ? "iwarp_mpa.key.req" : "iwarp_mpa.key.rep",
               std::span(reinterpret_cast<const std::uint8_t*>(key.data()), key.size()));
  expect_number(pdu, "iwarp_mpa.marker_flag", 0);
  expect_number(pdu, "iwarp_mpa.crc_flag", 1);
  expect_number(pdu, "iwarp_mpa.rej_flag", 0);
  // tshark 4.0 predates RFC 6581: its "Res" field is the low five bits (mask 0x1F), so our
  // S (enhanced) bit 0x10 shows up there; the other reserved bits must be 0.
  expect_number(pdu, "iwarp_mpa.res", 0x10);
  expect_number(pdu, "iwarp_mpa.rev", 2);
  const std::size_t pd_length = frame.size() - wire::kMpaFrameHeaderSize;
  expect_number(pdu, "iwarp_mpa.pdlength", pd_length);
  expect_bytes(pdu, "iwarp_mpa.privatedata", std::span(frame).subspan(wire::kMpaFrameHeaderSize));
  // The private data tshark delimited starts with the RFC 6581 block, as written by hand.
  if (const PdmlField* f = pdu.find("iwarp_mpa.privatedata"); f != nullptr) {
    const auto pd = from_hex(f->value);
    ASSERT_TRUE(pd.has_value());
    ASSERT_GE(pd->size(), block_bytes.size());
    EXPECT_EQ(to_hex(std::span(*pd).first(block_bytes.size())), to_hex(block_bytes)) << "IRD/ORD block";
    if (request) {
      // ... followed by a CM header our own decoder accepts.
      auto cm = wire::decode_cm_header(std::span(*pd).subspan(wire::kIrdOrdBlockSize));
      ASSERT_TRUE(cm.has_value());
      EXPECT_EQ(to_hex(cm->application_data), to_hex(kRequestAppData));
    }
  }
  EXPECT_EQ(pdu.count("iwarp_mpa.fpdu"), 0u);
}

void check_fpdu(const PdmlGroup& pdu, const ExpectedFpdu& e) {
  const wire::SegmentHeader& h = e.header;
  const std::size_t ulpdu_length = wire::segment_header_size(h) + e.payload.size();
  ASSERT_NE(pdu.find("iwarp_mpa.fpdu"), nullptr) << "not dissected as an FPDU";
  expect_number(pdu, "iwarp_mpa.ulpdulength", ulpdu_length);

  // CRC: tshark only adds iwarp_mpa.crc_check when it negotiated CRC from the startup
  // frames, and labels it "Good CRC32" when its own CRC-32C matches the received field.
  EXPECT_EQ(pdu.count("iwarp_mpa.crc"), 0u) << "tshark did not consider CRC negotiated";
  const PdmlField* crc = pdu.find("iwarp_mpa.crc_check");
  ASSERT_NE(crc, nullptr) << "no CRC check";
  EXPECT_NE(crc->showname.find("(Good CRC32)"), std::string::npos) << crc->showname;
  EXPECT_EQ(field_number(crc).value_or(~std::uint64_t{0}), crc_field_as_big_endian(e.wire)) << crc->showname;
  const std::size_t pad = wire::fpdu_padding(ulpdu_length);
  if (pad > 0) {
    expect_bytes(pdu, "iwarp_mpa.pad", Bytes(pad, 0));
  } else {
    EXPECT_EQ(pdu.count("iwarp_mpa.pad"), 0u);
  }

  const bool is_tagged = wire::is_tagged(h.opcode);
  expect_number(pdu, "iwarp_ddp.tagged_flag", is_tagged ? 1u : 0u);
  expect_number(pdu, "iwarp_ddp.last_flag", h.last ? 1u : 0u);
  expect_number(pdu, "iwarp_ddp.dv", 1);
  expect_number(pdu, "iwarp_rdma.version", 1);
  expect_number(pdu, "iwarp_rdma.opcode", static_cast<std::uint8_t>(h.opcode));
  if (is_tagged) {
    EXPECT_NE(pdu.find("iwarp_ddp.tagged"), nullptr);
    expect_number(pdu, "iwarp_ddp.stag", h.stag);
    expect_number(pdu, "iwarp_ddp.tagged_offset", h.tagged_offset);
    EXPECT_EQ(pdu.count("iwarp_ddp.qn"), 0u);
  } else {
    EXPECT_NE(pdu.find("iwarp_ddp.untagged"), nullptr);
    expect_number(pdu, "iwarp_ddp.qn", h.queue_number);
    expect_number(pdu, "iwarp_ddp.msn", h.msn);
    expect_number(pdu, "iwarp_ddp.mo", h.message_offset);
    EXPECT_EQ(pdu.count("iwarp_ddp.stag"), 0u);
  }
  if (wire::carries_invalidate(h.opcode)) expect_number(pdu, "iwarp_rdma.inval_stag", h.invalidate_stag);

  if (h.opcode == wire::RdmapOpcode::read_request) {
    const wire::ReadRequestHeader& r = h.read_request;
    expect_number(pdu, "iwarp_rdma.sinkstag", r.sink_stag);
    expect_number(pdu, "iwarp_rdma.sinkto", r.sink_offset);
    expect_number(pdu, "iwarp_rdma.rdmardsz", r.size);
    expect_number(pdu, "iwarp_rdma.srcstag", r.source_stag);
    expect_number(pdu, "iwarp_rdma.srcto", r.source_offset);
  }
  if (h.opcode == wire::RdmapOpcode::terminate) {
    const wire::TerminateHeader& t = h.terminate;
    expect_number(pdu, "iwarp_rdma.term_layer", static_cast<std::uint8_t>(t.code.layer));
    expect_number(pdu, "iwarp_rdma.term_etype_ddp", t.code.error_type);
    expect_number(pdu, "iwarp_rdma.term_errcode_ddp_untagged", t.code.error_code);
    expect_number(pdu, "iwarp_rdma.term_hdrct_m", t.segment_length_valid ? 1u : 0u);
    expect_number(pdu, "iwarp_rdma.hdrct_d", t.ddp_header_length != 0 ? 1u : 0u);
    expect_number(pdu, "iwarp_rdma.hdrct_r", t.has_rdma_header ? 1u : 0u);
    const std::array<std::uint8_t, 2> seg_len = {static_cast<std::uint8_t>(t.ddp_segment_length >> 8),
                                                 static_cast<std::uint8_t>(t.ddp_segment_length)};
    expect_bytes(pdu, "iwarp_rdma.term_ddp_seg_len", seg_len);
    expect_bytes(pdu, "iwarp_rdma.term_ddp_h", std::span(t.ddp_header).first(t.ddp_header_length));
    EXPECT_EQ(pdu.count("iwarp_rdma.term_rdma_h"), 0u);
  }
}

void check_tcp_packet(const PdmlPacket& packet, std::size_t index) {
  SCOPED_TRACE("frame " + std::to_string(index + 1));
  const PdmlField* ip_status = packet.find("ip.checksum.status");
  ASSERT_NE(ip_status, nullptr);
  EXPECT_NE(ip_status->showname.find("Good"), std::string::npos) << ip_status->showname;
  const PdmlField* tcp_status = packet.find("tcp.checksum.status");
  ASSERT_NE(tcp_status, nullptr);
  EXPECT_NE(tcp_status->showname.find("Good"), std::string::npos) << tcp_status->showname;
  // Lost segments, retransmissions, out-of-order data, bad ACKs: none in a consistent stream.
  const PdmlField* analysis = packet.find("tcp.analysis.flags");
  EXPECT_EQ(analysis, nullptr) << "TCP analysis warning: " << (analysis ? analysis->showname : "");
  // No dissector may have thrown, and no warning/error-level expert info.
  EXPECT_EQ(packet.find("_ws.malformed"), nullptr) << "malformed packet";
  for (const auto& f : packet.fields) {
    if (f.name != "_ws.expert") continue;
    const bool serious = f.showname.find("(Warning/") != std::string::npos ||
                         f.showname.find("(Error/") != std::string::npos;
    // tshark 4.0's MPA dissector knows RFC 5044 only: Rev 2 and the S bit are RFC 6581's.
    const bool pre_rfc6581 = f.showname.find("Rev field is NOT set to one") != std::string::npos ||
                             f.showname.find("Res field is NOT set to zero") != std::string::npos;
    EXPECT_FALSE(serious && !pre_rfc6581) << f.showname;
  }
}

std::uint16_t source_port(const PdmlPacket& packet) {
  return static_cast<std::uint16_t>(field_number(packet.find("tcp.srcport")).value_or(0));
}

std::uint16_t port_of(Direction from) {
  return from == Direction::client_to_server ? kClient.port : kServer.port;
}

// ---------------------------------------------------------------------------------------

TEST_F(TsharkDecodeTest, TsharkDecodesStartupAndEveryOpcodeAsEncoded) {
  const Scenario s = build_scenario();
  pcap_path_ = dir_ / "peercm-iwarp.pcap";
  SCOPED_TRACE("capture: " + pcap_path_.string());
  const std::size_t packets = write_capture(pcap_path_, s);

  const auto pdml = dissect(pcap_path_);
  ASSERT_TRUE(pdml.has_value());
  SCOPED_TRACE("dissector: " + pdml->creator);
  ASSERT_EQ(pdml->packets.size(), packets);
  for (std::size_t i = 0; i < pdml->packets.size(); ++i) check_tcp_packet(pdml->packets[i], i);

  // Frames 1-3 handshake, 4 Request, 5 Reply, then one FPDU per frame, then 3 FIN/ACK frames.
  constexpr std::size_t kFirstMpaFrame = 3;
  for (std::size_t i = 0; i < pdml->packets.size(); ++i) {
    const bool carries_mpa = i >= kFirstMpaFrame && i < kFirstMpaFrame + 2 + s.fpdus.size();
    EXPECT_EQ(pdml->packets[i].groups.size(), carries_mpa ? 1u : 0u) << "MPA PDUs in frame " << i + 1;
  }
  ASSERT_GE(pdml->packets.size(), kFirstMpaFrame + 2 + s.fpdus.size());

  {
    SCOPED_TRACE("MPA Request");
    const PdmlPacket& p = pdml->packets[kFirstMpaFrame];
    EXPECT_EQ(source_port(p), kClient.port);
    ASSERT_EQ(p.groups.size(), 1u);
    check_startup_frame(p.groups[0], wire::MpaFrameKind::request, s.request, kRequestBlockBytes);
  }
  {
    SCOPED_TRACE("MPA Reply");
    const PdmlPacket& p = pdml->packets[kFirstMpaFrame + 1];
    EXPECT_EQ(source_port(p), kServer.port);
    ASSERT_EQ(p.groups.size(), 1u);
    check_startup_frame(p.groups[0], wire::MpaFrameKind::reply, s.reply, kReplyBlockBytes);
  }
  for (std::size_t i = 0; i < s.fpdus.size(); ++i) {
    const ExpectedFpdu& e = s.fpdus[i];
    SCOPED_TRACE("FPDU " + std::to_string(i) + ": " + e.label);
    const PdmlPacket& p = pdml->packets[kFirstMpaFrame + 2 + i];
    EXPECT_EQ(source_port(p), port_of(e.from));
    ASSERT_EQ(p.groups.size(), 1u);
    check_fpdu(p.groups[0], e);
  }
}

// Negative control: the "Good CRC32" verdicts above mean something only if tshark really
// recomputes the CRC. One flipped byte must turn exactly that FPDU's verdict to "Bad".
TEST_F(TsharkDecodeTest, TsharkFlagsACorruptedFpdu) {
  const Scenario s = build_scenario();
  pcap_path_ = dir_ / "peercm-iwarp-corrupted.pcap";
  SCOPED_TRACE("capture: " + pcap_path_.string());
  constexpr std::size_t kCorrupted = 6;  // RDMA Write segment 2/3
  write_capture(pcap_path_, s, kCorrupted);

  const auto pdml = dissect(pcap_path_);
  ASSERT_TRUE(pdml.has_value());
  std::vector<const PdmlGroup*> fpdus;
  for (const auto& packet : pdml->packets)
    for (const auto& pdu : packet.groups)
      if (pdu.find("iwarp_mpa.fpdu") != nullptr) fpdus.push_back(&pdu);
  ASSERT_EQ(fpdus.size(), s.fpdus.size());
  for (std::size_t i = 0; i < fpdus.size(); ++i) {
    SCOPED_TRACE("FPDU " + std::to_string(i) + ": " + s.fpdus[i].label);
    const PdmlField* crc = fpdus[i]->find("iwarp_mpa.crc_check");
    ASSERT_NE(crc, nullptr);
    const char* verdict = i == kCorrupted ? "(Bad CRC32" : "(Good CRC32)";
    EXPECT_NE(crc->showname.find(verdict), std::string::npos) << crc->showname;
  }
}

}  // namespace
