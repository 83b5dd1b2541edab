// SIDR in the IB CM agent (IBTA ch. 12.11, rdma_cm's UDP port space) over the test fabric: the
// exchange, reject, no listener, lost and duplicated MADs, retries running out, and hostile
// input (malformed SIDR MADs, unknown request IDs, a foreign sender, a flood).
#include <gtest/gtest.h>

#include "ibcm_fabric.hpp"
#include "wire/ibcm/cm_sidr.hpp"
#include "wire/ibcm/rdma_cm_ip.hpp"

namespace peercm::core::ibcm::test {
namespace {

constexpr int kClient = 0;
constexpr int kServer = 1;
constexpr std::uint16_t kService = 7174;

struct Sidr : ::testing::Test {
  Fabric net;
  void SetUp() override {
    net.add(0x1111);
    net.add(0x2222);
    net.agent(kServer).listen_datagram(kService);
  }
  IbCmSidrParams params(int to = kServer, std::uint16_t port = kService) {
    return {.destination = Fabric::address(to), .port = port, .source_port = 5555, .private_data = {'u', 'd'}};
  }
  IbCmId request(IbCmSidrParams p) {
    auto id = net.agent(kClient).sidr_request(p, net.now);
    EXPECT_TRUE(id.has_value());
    return id ? *id : 0;
  }
  // A SIDR MAD from `from` straight into the server's agent.
  void inject(int from, const w::SidrMad& mad) {
    std::array<std::uint8_t, w::kMadSize> bytes{};
    ASSERT_TRUE(w::encode_sidr_mad(mad, bytes));
    net.agent(kServer).handle_mad(w::ipv4_mapped_gid(Fabric::address(from)), bytes, net.now);
  }
};

TEST_F(Sidr, RequestAcceptedGivesQpnQkeyAndPrivateData) {
  const IbCmId id = request(params());
  net.run_for(5ms);
  const IbCmAgentEvent* req = net.find(kServer, EventKind::connect_request);
  ASSERT_NE(req, nullptr);
  EXPECT_TRUE(req->datagram);
  EXPECT_EQ(req->service_port, kService);
  EXPECT_EQ(req->port, 5555);
  EXPECT_EQ(req->peer_address, Fabric::address(kClient));
  ASSERT_EQ(req->private_data.size(), kMaxSidrRequestPrivateData);  // 216 - rdma_cm's 36
  EXPECT_EQ(req->private_data[0], 'u');
  EXPECT_EQ(req->private_data[1], 'd');
  EXPECT_EQ(net.agent(kServer).sidr_count(), 1u);

  IbCmAcceptParams accept{.qpn = 0x345, .qkey = kRdmaUdpQkey, .private_data = {'o', 'k'}};
  ASSERT_TRUE(net.agent(kServer).accept(req->id, accept, net.now));
  net.run_for(5ms);
  const IbCmAgentEvent* est = net.find(kClient, EventKind::established, id);
  ASSERT_NE(est, nullptr);
  EXPECT_TRUE(est->datagram);
  EXPECT_EQ(est->peer.qpn, 0x345u);
  EXPECT_EQ(est->qkey, 0x01234567u);
  EXPECT_EQ(est->peer_address, Fabric::address(kServer));
  ASSERT_EQ(est->private_data.size(), w::kSidrRepPrivateDataSize);
  EXPECT_EQ(est->private_data[0], 'o');
  EXPECT_EQ(net.sent[w::CmAttribute::sidr_req], 1);
  EXPECT_EQ(net.sent[w::CmAttribute::sidr_rep], 1);
  EXPECT_EQ(net.agent(kClient).sidr_count(), 0u);
  EXPECT_EQ(net.agent(kServer).sidr_count(), 0u);
  // A second accept of the finished id is refused; the remembered REP expires.
  EXPECT_FALSE(net.agent(kServer).accept(req->id, accept, net.now));
  net.run_for(1s);
  net.expect_quiet(kClient);
  net.expect_quiet(kServer);
}

TEST_F(Sidr, RejectIsStatusRejectedWithPrivateData) {
  const IbCmId id = request(params());
  net.run_for(5ms);
  const IbCmAgentEvent* req = net.find(kServer, EventKind::connect_request);
  ASSERT_NE(req, nullptr);
  const std::vector<std::uint8_t> why{'n', 'o'};
  ASSERT_TRUE(net.agent(kServer).reject(req->id, why, net.now));
  net.run_for(5ms);
  const IbCmAgentEvent* rej = net.find(kClient, EventKind::rejected, id);
  ASSERT_NE(rej, nullptr);
  EXPECT_EQ(rej->reason, static_cast<std::uint16_t>(w::SidrStatus::rejected));
  ASSERT_GE(rej->private_data.size(), 2u);
  EXPECT_EQ(rej->private_data[0], 'n');
  EXPECT_EQ(net.count(kClient, EventKind::established), 0);
}

TEST_F(Sidr, NoListenerAnswersServiceUnsupported) {
  const IbCmId id = request(params(kServer, 9999));
  net.run_for(5ms);
  EXPECT_EQ(net.count(kServer, EventKind::connect_request), 0);
  const IbCmAgentEvent* rej = net.find(kClient, EventKind::rejected, id);
  ASSERT_NE(rej, nullptr);
  EXPECT_EQ(rej->reason, static_cast<std::uint16_t>(w::SidrStatus::service_unsupported));
  EXPECT_EQ(net.agent(kServer).stats().sidr_no_service, 1u);
  // A TCP-port-space listener on the same port does not take SIDR_REQs.
  net.agent(kServer).listen(9998);
  const IbCmId tcp = request(params(kServer, 9998));
  net.run_for(5ms);
  EXPECT_NE(net.find(kClient, EventKind::rejected, tcp), nullptr);
}

TEST_F(Sidr, LostRequestsAreResent) {
  int dropped = 0;
  net.filter = [&](int, int, const OutboundMad& mad) {
    if (attribute(mad) == w::CmAttribute::sidr_req && dropped < 2) {
      ++dropped;
      return 0;
    }
    return 1;
  };
  const IbCmId id = request(params());
  // The third copy gets through after two retry intervals (≈ 8.4 ms each, fast_timing()).
  for (int i = 0; i < 30 && net.count(kServer, EventKind::connect_request) == 0; ++i) net.run_for(1ms);
  const IbCmAgentEvent* req = net.find(kServer, EventKind::connect_request);
  ASSERT_NE(req, nullptr);
  ASSERT_TRUE(net.agent(kServer).accept(req->id, {.qpn = 7}, net.now));
  net.run_for(5ms);
  EXPECT_NE(net.find(kClient, EventKind::established, id), nullptr);
  EXPECT_EQ(net.sent[w::CmAttribute::sidr_req], 3);
}

TEST_F(Sidr, UnansweredRequestIsUnreachableAfterItsRetries) {
  const IbCmId id = request({.destination = {10, 0, 0, 99},
                             .port = kService,
                             .retry_interval = 10ms,
                             .max_retries = 4});
  net.run_for(45ms);
  EXPECT_EQ(net.count(kClient, EventKind::unreachable), 0);
  net.run_for(10ms);
  const IbCmAgentEvent* gone = net.find(kClient, EventKind::unreachable, id);
  ASSERT_NE(gone, nullptr);
  EXPECT_TRUE(gone->datagram);
  EXPECT_EQ(net.sent[w::CmAttribute::sidr_req], 5);  // the first and four retries
  net.expect_quiet(kClient);
}

TEST_F(Sidr, CopiesOfARequestMakeOneRequestAndALostReplyIsSentAgain) {
  bool rep_dropped = false;
  net.filter = [&](int, int, const OutboundMad& mad) {
    if (attribute(mad) == w::CmAttribute::sidr_req) return 2;
    if (attribute(mad) == w::CmAttribute::sidr_rep && !rep_dropped) {
      rep_dropped = true;
      return 0;
    }
    return 1;
  };
  const IbCmId id = request(params());
  net.run_for(2ms);
  ASSERT_EQ(net.count(kServer, EventKind::connect_request), 1);
  EXPECT_EQ(net.agent(kServer).stats().sidr_duplicates, 1u);
  const IbCmAgentEvent* req = net.find(kServer, EventKind::connect_request);
  ASSERT_TRUE(net.agent(kServer).accept(req->id, {.qpn = 9}, net.now));
  net.run_for(30ms);  // the REP was lost: the client's resent REQ gets it again
  EXPECT_EQ(net.count(kServer, EventKind::connect_request), 1);
  const IbCmAgentEvent* est = net.find(kClient, EventKind::established, id);
  ASSERT_NE(est, nullptr);
  EXPECT_EQ(est->peer.qpn, 9u);
  EXPECT_EQ(net.count(kClient, EventKind::established), 1);  // later REPs match nothing
}

TEST_F(Sidr, DestroyingAnUndecidedRequestRejectsIt) {
  const IbCmId id = request(params());
  net.run_for(2ms);
  const IbCmAgentEvent* req = net.find(kServer, EventKind::connect_request);
  ASSERT_NE(req, nullptr);
  net.agent(kServer).destroy(req->id, net.now);
  net.run_for(2ms);
  EXPECT_NE(net.find(kClient, EventKind::rejected, id), nullptr);
  // And the client side forgets a destroyed request without an event.
  const IbCmId other = request(params(kServer, 9999));
  net.agent(kClient).destroy(other, net.now);
  net.run_for(1s);
  EXPECT_EQ(net.find(kClient, EventKind::rejected, other), nullptr);
  EXPECT_EQ(net.agent(kClient).sidr_count(), 0u);
}

TEST_F(Sidr, HostileInputIsDroppedAndCounted) {
  IbCmAgent& server = net.agent(kServer);
  // A SIDR_REP with a reserved status, and one truncated MAD.
  std::array<std::uint8_t, w::kMadSize> bad{};
  ASSERT_TRUE(w::encode_sidr_mad({.message = w::CmSidrRep{.request_id = 1}}, bad));
  bad[w::kMadHeaderSize + 4] = 9;
  server.handle_mad(w::ipv4_mapped_gid(Fabric::address(kClient)), bad, net.now);
  server.handle_mad(w::ipv4_mapped_gid(Fabric::address(kClient)), std::span(bad).first(100), net.now);
  EXPECT_EQ(server.stats().sidr_malformed, 2u);
  // SIDR_REPs for no request.
  inject(kClient, {.message = w::CmSidrRep{.request_id = 0x4242, .qpn = 5}});
  EXPECT_EQ(server.stats().sidr_unmatched, 1u);
  // A valid-looking REP from a node the request did not go to.
  const IbCmId id = request(params());
  auto sent = net.agent(kClient).poll_mad();  // take the REQ off the client before the fabric does
  ASSERT_TRUE(sent.has_value());
  auto decoded = w::decode_sidr_mad(sent->bytes);
  ASSERT_TRUE(decoded);
  const std::uint32_t request_id = std::get<w::CmSidrReq>(decoded->message).request_id;
  std::array<std::uint8_t, w::kMadSize> spoof{};
  ASSERT_TRUE(w::encode_sidr_mad({.message = w::CmSidrRep{.request_id = request_id, .qpn = 66}}, spoof));
  net.agent(kClient).handle_mad(w::ipv4_mapped_gid({10, 0, 0, 77}), spoof, net.now);
  EXPECT_EQ(net.agent(kClient).stats().sidr_unmatched, 1u);
  net.pump();
  EXPECT_EQ(net.find(kClient, EventKind::established, id), nullptr);
  // A flood of distinct requests: kMaxSidrPending are held, the rest dropped without state.
  std::array<std::uint8_t, w::kReqPrivateDataSize> header{};
  ASSERT_TRUE(w::encode_cma_private_data(
      w::CmaHeader::ipv4(Fabric::address(kClient), 1, Fabric::address(kServer)), {}, header));
  const std::size_t flood = kMaxSidrPending + 36;
  for (std::uint32_t i = 0; i < flood; ++i) {
    inject(kClient, {.transaction_id = i,
                     .message = w::CmSidrReq{.request_id = 0x9000 + i,
                                             .service_id = w::rdma_ip_service_id(w::RdmaPortSpace::udp, kService),
                                             .private_data = std::span(header).first(w::kCmaHeaderSize)}});
  }
  EXPECT_EQ(server.sidr_count(), kMaxSidrPending);
  EXPECT_EQ(server.stats().sidr_flood_dropped, 36u);
  // A request without rdma_cm's header is refused, not delivered.
  inject(kClient, {.message = w::CmSidrReq{.request_id = 1,
                                           .service_id = w::rdma_ip_service_id(w::RdmaPortSpace::udp, kService)}});
  EXPECT_EQ(server.stats().sidr_malformed, 3u);
}

// docs/reliability.md, "CM answers": a SIDR_REQ whose rdma_cm header names another address
// than the one it came from is refused to its source, never delivered; the application would
// otherwise answer (and send its datagrams to) whatever address the header claims.
TEST_F(Sidr, RequestNamingAnotherAddressIsRefusedToItsSource) {
  IbCmAgent& server = net.agent(kServer);
  std::array<std::uint8_t, w::kReqPrivateDataSize> header{};
  ASSERT_TRUE(w::encode_cma_private_data(
      w::CmaHeader::ipv4(Ipv4Address{10, 0, 0, 99}, 1, Fabric::address(kServer)), {}, header));
  inject(kClient, {.transaction_id = 5,
                   .message = w::CmSidrReq{.request_id = 0x77,
                                           .service_id = w::rdma_ip_service_id(w::RdmaPortSpace::udp, kService),
                                           .private_data = std::span(header).first(w::kCmaHeaderSize)}});
  EXPECT_EQ(server.stats().rejected_address, 1u);
  EXPECT_EQ(server.sidr_count(), 0u);
  auto answer = server.poll_mad();
  ASSERT_TRUE(answer.has_value());
  EXPECT_EQ(answer->destination, w::ipv4_mapped_gid(Fabric::address(kClient)));
  auto decoded = w::decode_sidr_mad(answer->bytes);
  ASSERT_TRUE(decoded);
  EXPECT_EQ(std::get<w::CmSidrRep>(decoded->message).status, w::SidrStatus::rejected);
  EXPECT_FALSE(server.poll_mad().has_value());
  EXPECT_FALSE(server.poll_event().has_value());
}

TEST_F(Sidr, RequestsOutAreBounded) {
  for (std::size_t i = 0; i < kMaxSidrPending; ++i) request(params(5));
  auto refused = net.agent(kClient).sidr_request(params(5), net.now);
  ASSERT_FALSE(refused.has_value());
  EXPECT_EQ(refused.error(), std::errc::no_buffer_space);
  IbCmSidrParams big = params();
  big.private_data.assign(kMaxSidrRequestPrivateData + 1, 1);
  EXPECT_FALSE(net.agent(kClient).sidr_request(big, net.now).has_value());
}

}  // namespace
}  // namespace peercm::core::ibcm::test
