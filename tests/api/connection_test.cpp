// Client/server connection management through the public API (rdma_cm semantics).
#include <gtest/gtest.h>

#include <array>
#include <optional>
#include <string>

#include "loopback_pair.hpp"
#include "raw_peer.hpp"

namespace peercm::test {
namespace {

std::vector<std::uint8_t> bytes_of(std::string_view s) { return {s.begin(), s.end()}; }

TEST(Connection, ConnectAcceptCarriesPrivateDataBothWays) {
  Options options;
  options.client_param.private_data = bytes_of("hello from the client");
  options.client_param.initiator_depth = 3;
  options.client_param.responder_resources = 5;
  options.server_param.private_data = bytes_of("and hello back");
  auto pair = LoopbackPair::connected(options);
  EXPECT_EQ(pair->request.param.private_data, options.client_param.private_data);
  // rdma_cm gives the peer's resources as the listener sees them: swapped.
  EXPECT_EQ(pair->request.param.responder_resources, 3);
  EXPECT_EQ(pair->request.param.initiator_depth, 5);
  EXPECT_EQ(pair->client_established.private_data, options.server_param.private_data);
  EXPECT_EQ(pair->client.qp->state(), QpState::rts);
  EXPECT_EQ(pair->server.qp->state(), QpState::rts);
}

TEST(Connection, PeerToPeerRequestHidesTheCmHeaderFromTheListener) {
  Options options;
  options.peer_to_peer = true;
  options.client_param.private_data = bytes_of("app bytes");
  auto pair = LoopbackPair::connected(options);
  EXPECT_EQ(pair->request.param.private_data, options.client_param.private_data);
}

TEST(Connection, RejectWithPrivateDataReachesInitiator) {
  Options options;
  LoopbackPair pair(options);
  pair.start_client(options);
  auto request = expect_event(*pair.server.channel, CmEventType::connect_request);
  ASSERT_TRUE(request.new_id);
  const auto why = bytes_of("not today");
  ASSERT_TRUE(request.new_id->reject(why));
  auto rejected = expect_event(*pair.client.channel, CmEventType::rejected);
  EXPECT_EQ(rejected.status, ECONNREFUSED);
  EXPECT_EQ(rejected.reject_reason, RejectReason::application);
  EXPECT_EQ(rejected.param.private_data, why);
}

TEST(Connection, ConnectToClosedPortIsRejectedAsRefused) {
  Side client;
  client.id = std::move(CmId::create(*client.context, *client.channel).value());
  std::uint16_t closed_port;
  {
    RawListener probe;  // a port that was just free
    closed_port = probe.port();
  }
  ASSERT_TRUE(client.id->resolve_addr(loopback(closed_port)));
  expect_event(*client.channel, CmEventType::addr_resolved);
  ASSERT_TRUE(client.id->resolve_route());
  expect_event(*client.channel, CmEventType::route_resolved);
  client.qp = client.id->create_qp(*client.pd, client.qp_attr()).value();
  ASSERT_TRUE(client.id->connect({}));
  auto event = expect_event(*client.channel, CmEventType::rejected);
  EXPECT_EQ(event.status, ECONNREFUSED);
  EXPECT_EQ(event.reject_reason, RejectReason::refused);
}

TEST(Connection, ResolveAddrWithoutPortIsAnAddressError) {
  Side client;
  client.id = std::move(CmId::create(*client.context, *client.channel).value());
  ASSERT_TRUE(client.id->resolve_addr(loopback(0)));
  auto event = expect_event(*client.channel, CmEventType::addr_error);
  EXPECT_NE(event.status, 0);
}

TEST(Connection, WrongCallOrderIsAnError) {
  Side client;
  client.id = std::move(CmId::create(*client.context, *client.channel).value());
  EXPECT_EQ(client.id->connect({}).error(), std::errc::invalid_argument);       // no route
  EXPECT_EQ(client.id->resolve_route().error(), std::errc::invalid_argument);   // no address
  EXPECT_EQ(client.id->accept({}).error(), std::errc::invalid_argument);        // no request
  EXPECT_EQ(client.id->disconnect().error(), std::errc::not_connected);
  EXPECT_EQ(client.id->set_option(CmOption::peer_to_peer, 7).error(), std::errc::invalid_argument);
}

TEST(Connection, ConnectWhenConnectedIsEisconn) {
  auto pair = LoopbackPair::connected();
  EXPECT_EQ(pair->client.id->connect({}).error(), std::errc::already_connected);
}

TEST(Connection, DisconnectReachesBothSidesAndFlushesReceives) {
  auto pair = LoopbackPair::connected();
  std::vector<std::uint8_t> buffer(64);
  auto mr = pair->server.region(buffer);
  ASSERT_TRUE(pair->server.qp->post_recv(RecvWr{.wr_id = 77, .sg_list = {mr->sge()}}));
  ASSERT_TRUE(pair->client.id->disconnect());
  expect_event(*pair->client.channel, CmEventType::disconnected);
  expect_event(*pair->server.channel, CmEventType::disconnected);
  auto flushed = poll_n(*pair->server.cq, 1);
  ASSERT_EQ(flushed.size(), 1u);
  EXPECT_EQ(flushed[0].wr_id, 77u);
  EXPECT_EQ(flushed[0].status, WcStatus::wr_flush_error);
  expect_event(*pair->client.channel, CmEventType::timewait_exit);
  EXPECT_EQ(pair->server.qp->state(), QpState::error);
}

// rdma_cm reports TIMEWAIT_EXIT after the timewait, not at the close: a program that destroys
// its id right after DISCONNECTED must find no event of that id left behind (rping does this
// while another thread polls the channel).
TEST(Connection, TimewaitExitWaitsForTheTimewaitAndNeverOutlivesItsId) {
  auto pair = LoopbackPair::connected();
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(pair->client.id->disconnect());
  expect_event(*pair->client.channel, CmEventType::disconnected);
  expect_event(*pair->server.channel, CmEventType::disconnected);
  pair->server.id.reset();  // the server's timewait is still running
  expect_event(*pair->client.channel, CmEventType::timewait_exit);
  EXPECT_GE(std::chrono::steady_clock::now() - start, ContextOptions{}.timewait);
  auto stray = pair->server.channel->get_event(2 * ContextOptions{}.timewait);
  EXPECT_FALSE(stray.has_value()) << "event " << to_string(stray->type) << " of a destroyed id";
}

TEST(Connection, ResponderTimesOutASilentClient) {
  Options options;
  LoopbackPair pair(options);
  ASSERT_TRUE(pair.listener->set_option(CmOption::connect_timeout, 200));
  // set_option on the listener only affects later handshakes: reopen the listener.
  pair.listener = std::move(CmId::create(*pair.server.context, *pair.server.channel).value());
  ASSERT_TRUE(pair.listener->set_option(CmOption::connect_timeout, 200));
  ASSERT_TRUE(pair.listener->bind(loopback(0)));
  ASSERT_TRUE(pair.listener->listen(4));
  auto silent = RawSocket::connect_to(ntohs(pair.listener->local_address().sin_port));
  ASSERT_GE(silent.fd(), 0);
  bool eof = false;
  const auto start = std::chrono::steady_clock::now();
  silent.read_for(3s, &eof);
  EXPECT_TRUE(eof) << "the responder must close a connection that never sends a Request";
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);
  EXPECT_FALSE(pair.server.channel->get_event(100ms).has_value()) << "no CmId ever existed for it";
}

TEST(Connection, InitiatorTimesOutASilentServer) {
  RawListener silent;
  Side client;
  client.id = routed_id(client, loopback(silent.port()), {{CmOption::connect_timeout, 200}});
  client.qp = client.id->qp();
  ASSERT_TRUE(client.id->connect({}));
  auto accepted = silent.accept_one(2s);
  ASSERT_GE(accepted.fd(), 0);
  auto event = expect_event(*client.channel, CmEventType::connect_error, 3s);
  EXPECT_EQ(event.status, ETIMEDOUT);
  EXPECT_EQ(event.reject_reason, RejectReason::timeout);
  bool eof = false;
  accepted.read_for(2s, &eof);
  EXPECT_TRUE(eof) << "the initiator closes the socket after its timeout";
}

// The same bound without p2p (one rule for both models, cm.hpp CmOption::connect_timeout):
// the TCP connect completed, so the attempt ends CONNECT_ERROR, not UNREACHABLE.
TEST(Connection, ClientServerInitiatorTimesOutASilentServer) {
  RawListener silent;
  Side client;
  client.id = routed_id(client, loopback(silent.port()), {{CmOption::peer_to_peer, 0}, {CmOption::connect_timeout, 200}});
  client.qp = client.id->qp();
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(client.id->connect({}));
  auto accepted = silent.accept_one(2s);
  ASSERT_GE(accepted.fd(), 0);
  auto event = expect_event(*client.channel, CmEventType::connect_error, 3s);
  EXPECT_GE(std::chrono::steady_clock::now() - start, 200ms);
  EXPECT_EQ(event.status, ETIMEDOUT);
  EXPECT_EQ(event.reject_reason, RejectReason::timeout);
  bool eof = false;
  accepted.read_for(2s, &eof);
  EXPECT_TRUE(eof) << "the initiator closes the socket after its timeout";
}

// A connect whose SYN is dropped stays in SYN_SENT. A busy-polling application drives the
// reactor's direct passes, which offer EPOLLOUT to sockets waiting for room; a connecting
// socket must not take that for "connected": it ends as a TCP connect that timed out.
TEST(Connection, PollerDoesNotTakeAConnectStillInSynSentForConnected) {
  RawListener full(/*backlog=*/0);
  auto filler = RawSocket::connect_to(full.port());  // the accept queue's one place
  ASSERT_GE(filler.fd(), 0);
  Side client;
  // Client-server: a p2p attempt's own deadline would end it as CONNECT_ERROR either way.
  client.id = routed_id(client, loopback(full.port()),
                        {{CmOption::peer_to_peer, 0}, {CmOption::connect_timeout, 300}});
  client.qp = client.id->qp();
  ASSERT_TRUE(client.id->connect({}));
  std::array<WorkCompletion, 4> wc{};
  const auto deadline = std::chrono::steady_clock::now() + 3s;
  std::optional<CmEvent> event;
  while (!event && std::chrono::steady_clock::now() < deadline) {
    for (int i = 0; i < 1000; ++i) EXPECT_EQ(client.cq->poll(wc), 0u);  // direct passes
    if (auto e = client.channel->get_event(0ms)) event = std::move(*e);
  }
  ASSERT_TRUE(event) << "the attempt never ended";
  EXPECT_EQ(event->type, CmEventType::unreachable) << to_string(event->type);
  EXPECT_EQ(event->status, ETIMEDOUT);
}

TEST(Connection, FallsBackToRevisionOneWhenThePeerAnswersWithIt) {
  RawListener old_peer;
  Side client;
  client.id = routed_id(client, loopback(old_peer.port()), {{CmOption::peer_to_peer, 0}});
  client.qp = client.id->qp();
  ASSERT_TRUE(client.id->connect({}));
  auto sock = old_peer.accept_one(2s);
  ASSERT_GE(sock.fd(), 0);
  auto request = sock.read_for(2s, nullptr, wire::kMpaFrameHeaderSize + 4);
  ASSERT_GE(request.size(), wire::kMpaFrameHeaderSize);
  EXPECT_EQ(request[17], 2) << "peercm asks for revision 2 first";
  const std::vector<std::uint8_t> reply_pd = {'v', '1'};
  ASSERT_TRUE(sock.send_all(mpa_bytes(wire::MpaFrame{.kind = wire::MpaFrameKind::reply,
                                                     .crc = true,
                                                     .revision = 1,
                                                     .private_data = reply_pd})));
  auto established = expect_event(*client.channel, CmEventType::established);
  EXPECT_EQ(established.param.private_data, reply_pd);
  // As a revision-1 responder we must hear the initiator's first FPDU before sending: post a send.
  std::vector<std::uint8_t> payload(10, 0x5A);
  auto mr = client.region(payload);
  ASSERT_TRUE(client.qp->post_send(SendWr{.wr_id = 1, .opcode = WrOpcode::send, .sg_list = {mr->sge()}}));
  auto fpdus = decode_fpdus(sock.read_for(1s, nullptr, 2 + 18 + 10 + 4), true);
  ASSERT_EQ(fpdus.size(), 1u);
  EXPECT_EQ(fpdus[0].opcode, wire::RdmapOpcode::send);
  EXPECT_EQ(fpdus[0].msn, 1u);
}

// docs/p2p.md "RTR on every connection": a client/server connection lets the passive side
// speak first, as rdma-core's cmatose and perftest's write_lat -R expect: the server writes
// and sends right after ESTABLISHED while the client only receives.
class PassiveSideFirst : public ::testing::TestWithParam<Transport> {};

TEST_P(PassiveSideFirst, ServerWritesAndSendsWhileTheClientOnlyReceives) {
  Options options;
  options.peer_to_peer = false;
  options.transport = GetParam();
  auto pair = LoopbackPair::connected(options);
  std::vector<std::uint8_t> written(64, 0xA7), target(64, 0), early(32, 0xE1), landing(32, 0);
  auto target_mr = pair->client.region(target);
  auto landing_mr = pair->client.region(landing);
  auto written_mr = pair->server.region(written);
  auto early_mr = pair->server.region(early);
  ASSERT_TRUE(pair->client.qp->post_recv(RecvWr{.wr_id = 5, .sg_list = {landing_mr->sge()}}));
  ASSERT_TRUE(pair->server.qp->post_send(SendWr{.wr_id = 1,
                                                .opcode = WrOpcode::rdma_write,
                                                .sg_list = {written_mr->sge()},
                                                .remote_addr = reinterpret_cast<std::uint64_t>(target.data()),
                                                .rkey = target_mr->rkey()}));
  ASSERT_TRUE(pair->server.qp->post_send(SendWr{.wr_id = 2, .opcode = WrOpcode::send, .sg_list = {early_mr->sge()}}));
  auto received = poll_n(*pair->client.cq, 1, 5s);
  ASSERT_EQ(received.size(), 1u) << "the passive side's first messages were held";
  EXPECT_EQ(received[0].status, WcStatus::success);
  EXPECT_EQ(received[0].wr_id, 5u);
  EXPECT_EQ(landing, early);
  EXPECT_EQ(target, written) << "the Write was placed before the Send that followed it";
  auto sent = poll_n(*pair->server.cq, 2, 5s);
  ASSERT_EQ(sent.size(), 2u);
  for (const WorkCompletion& wc : sent) EXPECT_EQ(wc.status, WcStatus::success);
}

INSTANTIATE_TEST_SUITE_P(BothTransports, PassiveSideFirst, ::testing::Values(Transport::iwarp, Transport::roce),
                         transport_name);

// A strict RFC 5044 initiator (revision 1, or revision 2 with A=0) offers no RTR: the
// responder keeps the RFC 5044 §7.1.2 rule-4 fence, and its early Send goes out only after
// the initiator's first FPDU.
class StrictInitiator : public ::testing::TestWithParam<int> {};

TEST_P(StrictInitiator, HoldsTheResponderUntilItsFirstFpdu) {
  const int revision = GetParam();
  LoopbackPair pair;
  auto raw = RawSocket::connect_to(pair.port);
  ASSERT_GE(raw.fd(), 0);
  wire::MpaFrame request{.kind = wire::MpaFrameKind::request, .crc = true, .revision = static_cast<std::uint8_t>(revision)};
  if (revision == 2) request.enhanced = wire::IrdOrdBlock{.peer_to_peer = false, .ird = 16, .ord = 16};
  ASSERT_TRUE(raw.send_all(mpa_bytes(request)));
  auto event = expect_event(*pair.server.channel, CmEventType::connect_request);
  ASSERT_TRUE(event.new_id);
  pair.server.id = std::move(event.new_id);
  pair.server.qp = pair.server.id->create_qp(*pair.server.pd, pair.server.qp_attr()).value();
  ASSERT_TRUE(pair.server.id->accept({}));
  expect_event(*pair.server.channel, CmEventType::established);
  const auto reply = read_mpa_frame(raw, 2s);
  ASSERT_FALSE(reply.empty()) << "no MPA Reply";
  EXPECT_EQ(reply[17], revision) << "the Reply follows the Request's revision";
  if (revision == 2) {
    EXPECT_EQ(reply[20] & 0x80, 0) << "A=0 in the Request gets A=0 in the Reply (RFC 6581 §9.2)";
  }

  std::vector<std::uint8_t> early(10, 0x5A), sink(8, 0);
  auto early_mr = pair.server.region(early);
  auto sink_mr = pair.server.region(sink);
  ASSERT_TRUE(pair.server.qp->post_recv(RecvWr{.wr_id = 8, .sg_list = {sink_mr->sge()}}));
  ASSERT_TRUE(pair.server.qp->post_send(SendWr{.wr_id = 6, .opcode = WrOpcode::send, .sg_list = {early_mr->sge()}}));
  EXPECT_TRUE(raw.read_for(300ms).empty()) << "the responder spoke before the initiator's first FPDU";

  const std::vector<std::uint8_t> hello(8, 0x11);
  ASSERT_TRUE(raw.send_all(fpdu_bytes(
      wire::SegmentHeader{.opcode = wire::RdmapOpcode::send, .last = true, .queue_number = 0, .msn = 1}, hello, true)));
  auto fpdus = decode_fpdus(raw.read_for(2s, nullptr, 2 + 18 + 10 + 4), true);
  ASSERT_EQ(fpdus.size(), 1u) << "the held Send did not follow the initiator's first FPDU";
  EXPECT_EQ(fpdus[0].opcode, wire::RdmapOpcode::send);
  auto received = poll_n(*pair.server.cq, 2, 5s);
  ASSERT_EQ(received.size(), 2u);
  EXPECT_EQ(sink, hello);
}

INSTANTIATE_TEST_SUITE_P(Revisions, StrictInitiator, ::testing::Values(1, 2),
                         [](const testing::TestParamInfo<int>& revision) { return "Revision" + std::to_string(revision.param); });

TEST(Connection, PeerToPeerResponderMaySpeakFirst) {
  // docs/p2p.md R9: the RTR lifts the fence, so the passive side's send flows at once.
  Options options;
  options.peer_to_peer = true;
  auto pair = LoopbackPair::connected(options);
  std::vector<std::uint8_t> early(32, 0xE2), landing(32, 0);
  auto early_mr = pair->server.region(early);
  auto landing_mr = pair->client.region(landing);
  ASSERT_TRUE(pair->client.qp->post_recv(RecvWr{.wr_id = 5, .sg_list = {landing_mr->sge()}}));
  ASSERT_TRUE(pair->server.qp->post_send(SendWr{.wr_id = 6, .opcode = WrOpcode::send, .sg_list = {early_mr->sge()}}));
  auto got = poll_n(*pair->client.cq, 1, 5s);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].status, WcStatus::success);
  EXPECT_EQ(landing, early);
}

TEST(Connection, ThousandConnectionsBetweenTwoContexts) {
  Options options;
  LoopbackPair pair(options);
  constexpr int kConnections = 1000;
  std::vector<std::unique_ptr<CmId>> clients, servers;
  std::vector<QueuePair*> qps;
  for (int i = 0; i < kConnections; ++i) {
    auto id = std::move(CmId::create(*pair.client.context, *pair.client.channel).value());
    ASSERT_TRUE(id->set_option(CmOption::peer_to_peer, 0));
    ASSERT_TRUE(id->resolve_addr(loopback(pair.port)));
    expect_event(*pair.client.channel, CmEventType::addr_resolved);
    ASSERT_TRUE(id->resolve_route());
    expect_event(*pair.client.channel, CmEventType::route_resolved);
    QpInitAttr attr = pair.client.qp_attr();
    attr.caps.max_send_wr = 4;
    attr.caps.max_recv_wr = 4;
    id->create_qp(*pair.client.pd, attr).value();
    ASSERT_TRUE(id->connect({}));
    auto request = expect_event(*pair.server.channel, CmEventType::connect_request);
    ASSERT_TRUE(request.new_id);
    request.new_id->create_qp(*pair.server.pd, attr).value();
    ASSERT_TRUE(request.new_id->accept({}));
    expect_event(*pair.server.channel, CmEventType::established);
    expect_event(*pair.client.channel, CmEventType::established);
    servers.push_back(std::move(request.new_id));
    clients.push_back(std::move(id));
  }
  EXPECT_EQ(clients.size(), static_cast<std::size_t>(kConnections));
  for (auto& id : clients) ASSERT_TRUE(id->disconnect());
  int disconnected = 0;
  while (disconnected < kConnections) {
    auto event = pair.server.channel->get_event(5s);
    ASSERT_TRUE(event.has_value());
    if (event->type == CmEventType::disconnected) ++disconnected;
  }
}

}  // namespace
}  // namespace peercm::test
