// tshark decodes the live stack's RoCEv2 traffic: two peercm contexts talk over loopback
// (Transport::roce, docs/roce-transport.md) while dumpcap captures UDP port 4791 on `lo`, and
// Wireshark's InfiniBand dissector must find what the stack put on the wire:
//   * a REQ to a service nobody listens on, answered by REJ 8 (invalid service ID);
//   * a REQ the server's application rejects, answered by REJ 28 with its private data;
//   * REQ/REP/RTU of the connection that is accepted: service ID (rdma_cm TCP port space),
//     local CA GUIDs (ContextOptions::node_guid), local QPNs (what ConnParam::qp_num reports)
//     and starting PSNs, which the first data packet of each direction then carries;
//   * RC traffic on it: SEND FIRST/MIDDLE/LAST and ONLY, RDMA WRITE FIRST/MIDDLE/LAST and ONLY
//     (RETH on FIRST/ONLY), RDMA READ REQUEST (RETH) and READ RESPONSE FIRST/MIDDLE/LAST and
//     ONLY (AETH on FIRST/LAST/ONLY), ACKs (AETH), request PSNs consecutive from the REQ's
//     starting PSN (a READ takes one PSN per response packet);
//   * every frame: IPv4 DF set and identification 0 (the ICRC assumes both), not malformed.
// The expected values are written from the IBTA spec, not taken from our codecs.
//
// Capturing needs root or CAP_NET_RAW: without it the test skips and says why. Without
// dumpcap or tshark it skips too, except under CI (environment variable CI set), where it
// fails. DUMPCAP / TSHARK select the binaries; PEERCM_KEEP_PCAP=1 keeps the capture.
#include <arpa/inet.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <iostream>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "loopback_pair.hpp"
#include "tshark_support.hpp"

namespace {

using peercm::test::expect_event;
using peercm::test::poll_n;
using peercm::test::Side;
namespace tshark = peercm::tshark;
using tshark::field_number;
using tshark::PdmlField;
using tshark::PdmlPacket;
using namespace peercm;

constexpr std::uint64_t kServerGuid = 0x0002C90300A1B2C3;
constexpr std::uint64_t kClientGuid = 0x0002C90300D4E5F6;
constexpr std::uint16_t kServicePort = 7471;
constexpr std::uint16_t kNobodyPort = 7472;
constexpr std::uint16_t kMarkerPort = 9;  // discard: the capture's start and end markers
// IBA Annex A11: rdma_cm's TCP port space service ID is 0x0000000001060000 | port.
constexpr std::uint64_t kRdmaTcpServiceId = 0x0000000001060000;
constexpr std::uint32_t kQp1 = 1;
constexpr std::uint32_t kPsnMask = 0xFFFFFF;
constexpr std::size_t kPmtu = 4096;                 // loopback pair (docs/roce-transport.md)
constexpr std::size_t kLarge = 2 * kPmtu + 100;     // FIRST, MIDDLE, LAST
constexpr std::size_t kSmall = 10;                  // ONLY

// IBA CM attribute IDs.
constexpr std::uint64_t kAttrReq = 0x0010;
constexpr std::uint64_t kAttrRej = 0x0012;
constexpr std::uint64_t kAttrRep = 0x0013;
constexpr std::uint64_t kAttrRtu = 0x0014;

// IBA RC opcodes (BTH), and UD SEND ONLY for QP1.
namespace op {
constexpr std::uint64_t kSendFirst = 0x00, kSendMiddle = 0x01, kSendLast = 0x02, kSendOnly = 0x04;
constexpr std::uint64_t kWriteFirst = 0x06, kWriteMiddle = 0x07, kWriteLast = 0x08, kWriteOnly = 0x0A;
constexpr std::uint64_t kReadRequest = 0x0C, kReadResponseFirst = 0x0D, kReadResponseMiddle = 0x0E;
constexpr std::uint64_t kReadResponseLast = 0x0F, kReadResponseOnly = 0x10, kAcknowledge = 0x11;
constexpr std::uint64_t kUdSendOnly = 0x64;
}  // namespace op

std::uint32_t psn_add(std::uint32_t psn, std::uint32_t n) { return (psn + n) & kPsnMask; }

std::uint32_t random_loopback_address() {
  std::mt19937 random{std::random_device{}()};
  return (127u << 24) | (std::uniform_int_distribution<std::uint32_t>(1, 254)(random) << 16) |
         (std::uniform_int_distribution<std::uint32_t>(0, 255)(random) << 8) |
         std::uniform_int_distribution<std::uint32_t>(1, 254)(random);
}

std::string dotted(std::uint32_t host_order) {
  in_addr a{};
  a.s_addr = htonl(host_order);
  char text[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &a, text, sizeof text);
  return text;
}

sockaddr_in endpoint(std::uint32_t address, std::uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(address);
  return a;
}

std::optional<std::uint64_t> number(const PdmlPacket& p, std::string_view name) {
  return field_number(p.find(name));
}

std::string show(const PdmlPacket& p, std::string_view name) {
  const PdmlField* f = p.find(name);
  return f != nullptr ? f->show : std::string("<absent>");
}

// What the test did, to compare the capture with.
struct Expected {
  std::string server_ip;
  std::string client_ip;
  std::uint32_t nobody_qpn = 0;    // the client QP of the REQ that gets REJ 8
  std::uint32_t rejected_qpn = 0;  // the client QP of the REQ that gets REJ 28
  std::uint32_t client_qpn = 0;    // the accepted connection's client QP, as the server saw it
  std::uint32_t server_qpn = 0;    // its server QP, as the client saw it
  std::vector<std::uint8_t> reject_data;
  std::uint64_t write_large_va = 0, write_small_va = 0, read_large_va = 0, read_small_va = 0;
  std::uint32_t target_rkey = 0;
};

class RoceLiveCaptureTest : public tshark::TsharkTest {
 protected:
  void SetUp() override {
    TsharkTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    dumpcap_ = tshark::find_program("dumpcap", "DUMPCAP");
    if (!dumpcap_) {
      if (std::getenv("CI") != nullptr) GTEST_FAIL() << "dumpcap not found (PATH or $DUMPCAP) and CI is set";
      GTEST_SKIP() << "dumpcap not found (package wireshark-common; scripts/setup.sh installs it)";
    }
  }

  std::optional<std::string> dumpcap_;
};

TEST_F(RoceLiveCaptureTest, TsharkDecodesTheLiveCmExchangeAndRcTraffic) {
  const std::uint32_t server_address = random_loopback_address();
  Expected want;
  want.server_ip = dotted(server_address);
  pcap_path_ = dir_ / "peercm-roce-live.pcapng";
  SCOPED_TRACE("capture: " + pcap_path_.string());

  // One frame per RoCE packet: a coalesced (GSO) send would reach the capture as one frame.
  ContextOptions server_options{.node_guid = kServerGuid};
  ContextOptions client_options{.node_guid = kClientGuid};
  server_options.roce.coalesce = false;
  client_options.roce.coalesce = false;
  Side server(server_options);
  Side client(client_options);
  auto listener = std::move(CmId::create(*server.context, *server.channel, nullptr, Transport::roce).value());
  ASSERT_TRUE(listener->bind(endpoint(server_address, kServicePort)));
  ASSERT_TRUE(listener->listen(16));

  // Everything to or from the server's address on 4791, and the markers.
  const std::string filter = "udp and host " + want.server_ip + " and (port 4791 or port " +
                             std::to_string(kMarkerPort) + ")";
  tshark::LiveCapture capture;
  const auto started = capture.start(*dumpcap_, "lo", filter, pcap_path_, dir_ / "dumpcap.stderr");
  if (started.status == tshark::LiveCapture::Start::not_permitted) {
    GTEST_SKIP() << "capturing on lo is not permitted here (needs root or CAP_NET_RAW): " << started.message;
  }
  ASSERT_EQ(started.status, tshark::LiveCapture::Start::started) << capture.command() << "\n" << started.message;
  ASSERT_TRUE(capture.wait_for_marker(server_address, kMarkerPort, "peercm-capture-start"))
      << "dumpcap never wrote the start marker: " << capture.command();

  auto client_id = [&] {
    auto id = std::move(CmId::create(*client.context, *client.channel, nullptr, Transport::roce).value());
    EXPECT_TRUE(id->set_option(CmOption::peer_to_peer, 0));
    return id;
  };
  auto start_connect = [&](CmId& id, std::uint16_t port) -> QueuePair* {
    EXPECT_TRUE(id.resolve_addr(endpoint(server_address, port)));
    expect_event(*client.channel, CmEventType::addr_resolved);
    EXPECT_TRUE(id.resolve_route());
    expect_event(*client.channel, CmEventType::route_resolved);
    QueuePair* qp = id.create_qp(*client.pd, client.qp_attr()).value();
    EXPECT_TRUE(id.connect(ConnParam{}));
    return qp;
  };

  // 1. Nobody listens on the service: REJ 8.
  auto nobody = client_id();
  want.nobody_qpn = start_connect(*nobody, kNobodyPort)->qp_num();
  EXPECT_EQ(expect_event(*client.channel, CmEventType::rejected).reject_reason, RejectReason::refused);

  // 2. The server's application rejects: REJ 28 with its private data.
  auto refused = client_id();
  want.rejected_qpn = start_connect(*refused, kServicePort)->qp_num();
  {
    auto request = expect_event(*server.channel, CmEventType::connect_request);
    ASSERT_TRUE(request.new_id);
    want.reject_data = {0xDE, 0xAD, 0xBE, 0xEF};
    ASSERT_TRUE(request.new_id->reject(want.reject_data));
    EXPECT_EQ(expect_event(*client.channel, CmEventType::rejected).reject_reason, RejectReason::application);
  }

  // 3. The connection that is accepted.
  client.id = client_id();
  client.qp = start_connect(*client.id, kServicePort);
  auto request = expect_event(*server.channel, CmEventType::connect_request);
  ASSERT_TRUE(request.new_id);
  server.id = std::move(request.new_id);
  server.qp = server.id->create_qp(*server.pd, server.qp_attr()).value();
  ASSERT_TRUE(server.id->accept(ConnParam{}));
  const auto established = expect_event(*client.channel, CmEventType::established);
  expect_event(*server.channel, CmEventType::established);
  want.client_qpn = request.param.qp_num;
  want.server_qpn = established.param.qp_num;
  EXPECT_EQ(want.client_qpn, client.qp->qp_num());
  EXPECT_EQ(want.server_qpn, server.qp->qp_num());
  want.client_ip = dotted(ntohl(client.id->local_address().sin_addr.s_addr));

  // 4. Data, one operation at a time (each is complete before the next is posted, so no RNR
  //    NAK and one ACK per message): Sends, Writes and Reads, large and small, client to
  //    server; then one Send server to client, whose PSN is the REP's starting PSN.
  std::vector<std::uint8_t> source(kLarge), inbox(kLarge), target(kLarge + 64), readback(kLarge), client_inbox(64);
  for (std::size_t i = 0; i < source.size(); ++i) source[i] = static_cast<std::uint8_t>(i * 7 + 3);
  auto source_mr = client.region(source);
  auto readback_mr = client.region(readback);
  auto client_inbox_mr = client.region(client_inbox);
  auto inbox_mr = server.region(inbox);
  auto target_mr = server.region(target);
  want.target_rkey = target_mr->rkey();
  const auto target_va = reinterpret_cast<std::uintptr_t>(target.data());
  want.write_large_va = target_va;
  want.write_small_va = target_va + kLarge + 16;  // the small Read reads it back
  want.read_large_va = target_va;
  want.read_small_va = want.write_small_va;

  auto complete = [](CompletionQueue& cq, std::uint64_t wr_id) {
    const auto wcs = poll_n(cq, 1);
    ASSERT_EQ(wcs.size(), 1u) << "no completion for wr " << wr_id;
    EXPECT_EQ(wcs[0].wr_id, wr_id);
    EXPECT_EQ(wcs[0].status, WcStatus::success) << "wr " << wr_id;
  };
  ASSERT_TRUE(server.qp->post_recv(RecvWr{.wr_id = 100, .sg_list = {inbox_mr->sge()}}));
  ASSERT_TRUE(server.qp->post_recv(RecvWr{.wr_id = 101, .sg_list = {inbox_mr->sge()}}));
  ASSERT_TRUE(client.qp->post_recv(RecvWr{.wr_id = 200, .sg_list = {client_inbox_mr->sge()}}));
  const struct {
    std::uint64_t wr_id;
    WrOpcode opcode;
    std::size_t size;
    std::uint64_t remote;
  } ops[] = {
      {1, WrOpcode::send, kLarge, 0},
      {2, WrOpcode::send, kSmall, 0},
      {3, WrOpcode::rdma_write, kLarge, want.write_large_va},
      {4, WrOpcode::rdma_write, kSmall, want.write_small_va},
      {5, WrOpcode::rdma_read, kLarge, want.read_large_va},
      {6, WrOpcode::rdma_read, kSmall, want.read_small_va},
  };
  for (const auto& o : ops) {
    auto& mr = o.opcode == WrOpcode::rdma_read ? readback_mr : source_mr;
    ASSERT_TRUE(client.qp->post_send(SendWr{.wr_id = o.wr_id,
                                            .opcode = o.opcode,
                                            .sg_list = {mr->sge(0, o.size)},
                                            .remote_addr = o.remote,
                                            .rkey = o.remote != 0 ? want.target_rkey : 0}));
    complete(*client.cq, o.wr_id);
    if (o.opcode == WrOpcode::send) complete(*server.cq, o.wr_id == 1 ? 100 : 101);
  }
  EXPECT_TRUE(std::equal(source.begin(), source.end(), readback.begin()));
  ASSERT_TRUE(server.qp->post_send(SendWr{.wr_id = 7, .opcode = WrOpcode::send, .sg_list = {inbox_mr->sge(0, kSmall)}}));
  complete(*server.cq, 7);
  complete(*client.cq, 200);

  // Everything up to here is in the file once the end marker is.
  ASSERT_TRUE(capture.wait_for_marker(server_address, kMarkerPort, "peercm-capture-end"))
      << "dumpcap never wrote the end marker: " << capture.command();
  EXPECT_TRUE(capture.stop()) << "dumpcap did not exit cleanly: " << tshark::read_text_file(dir_ / "dumpcap.stderr");

  // UDP 4791 is the InfiniBand dissector's by default (infiniband.rroce.port); keep the
  // RPC-over-RDMA heuristic off our opaque Send payloads, and leave the markers out.
  const auto pdml = dissect(pcap_path_, "--disable-heuristic rpcrdma_infiniband -Y 'udp.port == 4791'", "infiniband");
  ASSERT_TRUE(pdml.has_value());
  SCOPED_TRACE("dissector: " + pdml->creator);
  ASSERT_FALSE(pdml->packets.empty()) << "nothing captured on UDP 4791";

  // ---- Every frame.
  std::vector<const PdmlPacket*> cm, from_client_rc, from_server_rc;
  std::set<std::uint64_t> client_rc_ports, server_rc_ports;
  for (std::size_t i = 0; i < pdml->packets.size(); ++i) {
    const PdmlPacket& p = pdml->packets[i];
    SCOPED_TRACE("frame " + std::to_string(i + 1));
    ASSERT_EQ(p.groups.size(), 1u) << "not dissected as InfiniBand";
    EXPECT_EQ(p.find("_ws.malformed"), nullptr) << "malformed frame";
    for (const auto& field : p.fields) {
      if (field.name != "_ws.expert") continue;
      EXPECT_EQ(field.showname.find("(Error/"), std::string::npos) << field.showname;
      EXPECT_EQ(field.showname.find("(Warning/"), std::string::npos) << field.showname;
    }
    EXPECT_EQ(number(p, "ip.flags.df"), 1u) << "IPv4 DF";
    EXPECT_EQ(number(p, "ip.id"), 0u) << "IPv4 identification";
    EXPECT_EQ(number(p, "udp.dstport"), 4791u);
    const std::string src = show(p, "ip.src");
    const std::string dst = show(p, "ip.dst");
    const bool from_server = src == want.server_ip;
    EXPECT_TRUE((from_server && dst == want.client_ip) || (src == want.client_ip && dst == want.server_ip))
        << src << " -> " << dst;
    EXPECT_TRUE(p.find("infiniband.invariant.crc") != nullptr) << "no ICRC";
    const auto destqp = number(p, "infiniband.bth.destqp");
    ASSERT_TRUE(destqp.has_value());
    if (*destqp == kQp1) {
      // A MAD on QP1: UD SEND ONLY with DETH (GSI Q_Key, source QP 1), from the 4791 socket.
      EXPECT_EQ(number(p, "infiniband.bth.opcode"), op::kUdSendOnly);
      EXPECT_EQ(number(p, "infiniband.deth.q_key"), 0x80010000u);
      EXPECT_EQ(number(p, "infiniband.deth.srcqp"), 1u);
      EXPECT_EQ(number(p, "udp.srcport"), 4791u);
      EXPECT_EQ(number(p, "infiniband.mad.mgmtclass"), 0x07u);
      cm.push_back(&p);
      continue;
    }
    // An RC packet: from the QP's own source port (0xC000-0xFFFF), to the peer's QP.
    const auto sport = number(p, "udp.srcport");
    ASSERT_TRUE(sport.has_value());
    EXPECT_GE(*sport, 0xC000u);
    if (from_server) {
      EXPECT_EQ(*destqp, want.client_qpn);
      server_rc_ports.insert(*sport);
      from_server_rc.push_back(&p);
    } else {
      EXPECT_EQ(*destqp, want.server_qpn);
      client_rc_ports.insert(*sport);
      from_client_rc.push_back(&p);
    }
  }
  EXPECT_EQ(client_rc_ports.size(), 1u) << "the client QP changed its UDP source port";
  EXPECT_EQ(server_rc_ports.size(), 1u) << "the server QP changed its UDP source port";

  // ---- The CM exchanges. Resends would repeat a message; each is looked up by its IDs.
  std::map<std::uint64_t, const PdmlPacket*> reqs;  // by local communication ID
  std::vector<const PdmlPacket*> reps, rtus, rejs;
  for (const PdmlPacket* p : cm) {
    const auto attribute = number(*p, "infiniband.mad.attributeid");
    ASSERT_TRUE(attribute.has_value());
    if (*attribute == kAttrReq) {
      EXPECT_EQ(show(*p, "ip.src"), want.client_ip);
      reqs.emplace(number(*p, "infiniband.cm.req").value_or(0), p);
    } else if (*attribute == kAttrRep) {
      reps.push_back(p);
    } else if (*attribute == kAttrRtu) {
      rtus.push_back(p);
    } else if (*attribute == kAttrRej) {
      rejs.push_back(p);
    }
  }
  ASSERT_EQ(reqs.size(), 3u) << "three connection attempts, three REQs";
  ASSERT_FALSE(reps.empty()) << "no REP";
  ASSERT_FALSE(rtus.empty()) << "no RTU";
  ASSERT_GE(rejs.size(), 2u) << "two REJs wanted";

  auto req_with_qpn = [&](std::uint32_t qpn) -> const PdmlPacket* {
    for (const auto& [comm_id, p] : reqs)
      if (number(*p, "infiniband.cm.req.localqpn") == qpn) return p;
    return nullptr;
  };
  for (const auto& [comm_id, p] : reqs) {
    SCOPED_TRACE("REQ " + std::to_string(comm_id));
    EXPECT_EQ(number(*p, "infiniband.cm.req.localcaguid"), kClientGuid);
    EXPECT_EQ(number(*p, "infiniband.cm.req.transpsvctype"), 0u) << "RC";
    EXPECT_EQ(number(*p, "infiniband.cm.req.serviceid.protocol"), 0x06u);
    // rdma_cm's private-data header: IPv4, the client's address to the server's.
    EXPECT_EQ(number(*p, "infiniband.cm.req.ip_cm.ipv"), 4u);
    EXPECT_EQ(show(*p, "infiniband.cm.req.ip_cm.sip4"), want.client_ip);
    EXPECT_EQ(show(*p, "infiniband.cm.req.ip_cm.dip4"), want.server_ip);
  }
  const PdmlPacket* req_nobody = req_with_qpn(want.nobody_qpn);
  const PdmlPacket* req_rejected = req_with_qpn(want.rejected_qpn);
  const PdmlPacket* req = req_with_qpn(want.client_qpn);
  ASSERT_NE(req_nobody, nullptr) << "no REQ with local QPN " << want.nobody_qpn;
  ASSERT_NE(req_rejected, nullptr) << "no REQ with local QPN " << want.rejected_qpn;
  ASSERT_NE(req, nullptr) << "no REQ with local QPN " << want.client_qpn;
  EXPECT_EQ(number(*req_nobody, "infiniband.cm.req.serviceid"), kRdmaTcpServiceId | kNobodyPort);
  EXPECT_EQ(number(*req_nobody, "infiniband.cm.req.serviceid.dport"), kNobodyPort);
  EXPECT_EQ(number(*req_rejected, "infiniband.cm.req.serviceid"), kRdmaTcpServiceId | kServicePort);
  EXPECT_EQ(number(*req, "infiniband.cm.req.serviceid"), kRdmaTcpServiceId | kServicePort);
  EXPECT_EQ(number(*req, "infiniband.cm.req.serviceid.dport"), kServicePort);
  const auto req_comm_id = number(*req, "infiniband.cm.req");
  const auto client_psn = number(*req, "infiniband.cm.req.startpsn");
  ASSERT_TRUE(req_comm_id && client_psn);

  // The REJs answer the right REQs with the right reasons, from the server.
  auto rej_for = [&](const PdmlPacket* r) -> const PdmlPacket* {
    const auto id = number(*r, "infiniband.cm.req");
    for (const PdmlPacket* p : rejs)
      if (number(*p, "infiniband.cm.rej.remotecommid") == id) return p;
    return nullptr;
  };
  const PdmlPacket* rej8 = rej_for(req_nobody);
  const PdmlPacket* rej28 = rej_for(req_rejected);
  ASSERT_NE(rej8, nullptr) << "no REJ answers the REQ to the unlistened service";
  ASSERT_NE(rej28, nullptr) << "no REJ answers the REQ the application rejected";
  EXPECT_EQ(rej_for(req), nullptr) << "the accepted REQ was rejected";
  EXPECT_EQ(number(*rej8, "infiniband.cm.rej.reason"), 8u) << "invalid service ID";
  EXPECT_EQ(number(*rej28, "infiniband.cm.rej.reason"), 28u) << "consumer reject";
  for (const PdmlPacket* p : {rej8, rej28}) {
    EXPECT_EQ(show(*p, "ip.src"), want.server_ip);
    EXPECT_EQ(number(*p, "infiniband.cm.rej.msgrej"), 0u) << "REJ of a REQ";
  }
  const PdmlField* rej_private = rej28->find("infiniband.cm.rej.private");
  ASSERT_NE(rej_private, nullptr);
  EXPECT_TRUE(rej_private->value.starts_with("deadbeef")) << rej_private->value;

  // REP and RTU of the accepted connection.
  const PdmlPacket* rep = nullptr;
  for (const PdmlPacket* p : reps)
    if (number(*p, "infiniband.cm.rep.remotecommid") == *req_comm_id) rep = p;
  ASSERT_NE(rep, nullptr) << "no REP answers REQ " << *req_comm_id;
  EXPECT_EQ(show(*rep, "ip.src"), want.server_ip);
  EXPECT_EQ(number(*rep, "infiniband.cm.rep.localcaguid"), kServerGuid);
  EXPECT_EQ(number(*rep, "infiniband.cm.rep.localqpn"), want.server_qpn);
  const auto rep_comm_id = number(*rep, "infiniband.cm.rep");
  const auto server_psn = number(*rep, "infiniband.cm.rep.startpsn");
  ASSERT_TRUE(rep_comm_id && server_psn);
  bool rtu_found = false;
  for (const PdmlPacket* p : rtus) {
    if (number(*p, "infiniband.cm.rtu.localcommid") != *req_comm_id) continue;
    rtu_found = true;
    EXPECT_EQ(show(*p, "ip.src"), want.client_ip);
    EXPECT_EQ(number(*p, "infiniband.cm.rtu.remotecommid"), *rep_comm_id);
  }
  EXPECT_TRUE(rtu_found) << "no RTU for REQ " << *req_comm_id;

  // ---- RC, client to server: the requests, PSNs consecutive from the REQ's starting PSN. A
  // resend repeats a PSN; the first copy of each PSN is compared.
  struct Want {
    std::uint64_t opcode;
    std::uint32_t psn_offset;
    std::optional<std::uint64_t> reth_va;
    std::uint64_t reth_length = 0;
  };
  const std::uint32_t cpsn = static_cast<std::uint32_t>(*client_psn);
  const std::vector<Want> requests = {
      {op::kSendFirst, 0, {}},
      {op::kSendMiddle, 1, {}},
      {op::kSendLast, 2, {}},
      {op::kSendOnly, 3, {}},
      {op::kWriteFirst, 4, want.write_large_va, kLarge},
      {op::kWriteMiddle, 5, {}},
      {op::kWriteLast, 6, {}},
      {op::kWriteOnly, 7, want.write_small_va, kSmall},
      {op::kReadRequest, 8, want.read_large_va, kLarge},  // three responses: PSNs 8, 9, 10
      {op::kReadRequest, 11, want.read_small_va, kSmall},
  };
  std::vector<const PdmlPacket*> client_requests, client_acks;
  std::set<std::uint64_t> seen_psns;
  for (const PdmlPacket* p : from_client_rc) {
    if (number(*p, "infiniband.bth.opcode") == op::kAcknowledge) {
      client_acks.push_back(p);
      continue;
    }
    if (seen_psns.insert(number(*p, "infiniband.bth.psn").value_or(~0ull)).second) client_requests.push_back(p);
  }
  ASSERT_EQ(client_requests.size(), requests.size()) << "client request packets (distinct PSNs)";
  ASSERT_EQ(number(*client_requests[0], "infiniband.bth.psn"), cpsn)
      << "the first data packet's PSN is not the REQ's starting PSN";
  for (std::size_t i = 0; i < requests.size(); ++i) {
    const PdmlPacket& p = *client_requests[i];
    const Want& w = requests[i];
    SCOPED_TRACE("client request " + std::to_string(i) + " (opcode " + std::to_string(w.opcode) + ")");
    EXPECT_EQ(number(p, "infiniband.bth.opcode"), w.opcode);
    EXPECT_EQ(number(p, "infiniband.bth.psn"), psn_add(cpsn, w.psn_offset));
    EXPECT_EQ(p.find("infiniband.aeth"), nullptr);
    EXPECT_EQ(p.find("infiniband.reth") != nullptr, w.reth_va.has_value());
    if (w.reth_va) {
      EXPECT_EQ(number(p, "infiniband.reth.va"), *w.reth_va);
      EXPECT_EQ(number(p, "infiniband.reth.r_key"), want.target_rkey);
      EXPECT_EQ(number(p, "infiniband.reth.dmalen"), w.reth_length);
    }
  }

  // ---- RC, server to client: ACKs of the client's Sends and Writes, READ RESPONSEs, and
  // the server's own Send, at the REP's starting PSN.
  std::map<std::uint64_t, std::uint64_t> responses;  // PSN -> opcode, first copy
  std::vector<const PdmlPacket*> server_requests;
  for (const PdmlPacket* p : from_server_rc) {
    const auto opcode = number(*p, "infiniband.bth.opcode").value_or(~0ull);
    const auto psn = number(*p, "infiniband.bth.psn").value_or(~0ull);
    const bool has_aeth = p->find("infiniband.aeth") != nullptr;
    if (opcode == op::kSendOnly) {
      server_requests.push_back(p);
      continue;
    }
    SCOPED_TRACE("server response opcode " + std::to_string(opcode) + " PSN " + std::to_string(psn));
    EXPECT_EQ(has_aeth, opcode != op::kReadResponseMiddle);
    EXPECT_EQ(p->find("infiniband.reth"), nullptr);
    if (has_aeth) {
      EXPECT_EQ(number(*p, "infiniband.aeth.syndrome.opcode"), 0u) << "AETH: ACK";
    }
    if (opcode == op::kAcknowledge) {
      EXPECT_EQ(p->find("data.data"), nullptr) << "ACK with a payload";
    }
    responses.emplace(psn, opcode);
  }
  const std::vector<std::pair<std::uint32_t, std::uint64_t>> want_responses = {
      {2, op::kAcknowledge},           // SEND LAST
      {3, op::kAcknowledge},           // SEND ONLY
      {6, op::kAcknowledge},           // RDMA WRITE LAST
      {7, op::kAcknowledge},           // RDMA WRITE ONLY
      {8, op::kReadResponseFirst},     {9, op::kReadResponseMiddle}, {10, op::kReadResponseLast},
      {11, op::kReadResponseOnly},
  };
  for (const auto& [offset, opcode] : want_responses) {
    const auto it = responses.find(psn_add(cpsn, offset));
    ASSERT_NE(it, responses.end()) << "no response at starting PSN + " << offset;
    EXPECT_EQ(it->second, opcode) << "at starting PSN + " << offset;
  }
  ASSERT_FALSE(server_requests.empty()) << "the server's SEND ONLY is missing";
  EXPECT_EQ(number(*server_requests[0], "infiniband.bth.psn"), *server_psn)
      << "the server's first data packet's PSN is not the REP's starting PSN";
  bool server_send_acked = false;
  for (const PdmlPacket* p : client_acks) {
    EXPECT_NE(p->find("infiniband.aeth"), nullptr);
    EXPECT_EQ(number(*p, "infiniband.aeth.syndrome.opcode"), 0u) << "AETH: ACK";
    if (number(*p, "infiniband.bth.psn") == *server_psn) server_send_acked = true;
  }
  EXPECT_TRUE(server_send_acked) << "the client did not ACK the server's Send";

  std::cout << "[ tshark   ] " << pdml->packets.size() << " frames on UDP 4791 (" << cm.size() << " CM, "
            << from_client_rc.size() << " RC client to server, " << from_server_rc.size()
            << " RC server to client), decoded by " << pdml->creator << "\n";
}

}  // namespace
