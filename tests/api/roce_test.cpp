// The RoCE transport through the public API, over real UDP sockets on loopback: each node
// is a random 127/8 address (parallel test processes never share (address, 4791)).
#include <arpa/inet.h>
#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <barrier>
#include <cstring>
#include <numeric>
#include <random>
#include <thread>

#include "api/roce/address_share.hpp"
#include "api/roce/roce_verbs.hpp"
#include "loopback_pair.hpp"

namespace peercm::test {
namespace {

std::size_t open_fds() {
  std::size_t n = 0;
  if (DIR* dir = ::opendir("/proc/self/fd")) {
    while (::readdir(dir) != nullptr) ++n;
    ::closedir(dir);
  }
  return n;
}

std::unique_ptr<CmId> roce_id(Side& side) {
  return std::move(CmId::create(*side.context, *side.channel, nullptr, Transport::roce).value());
}

// A client-server (p2p off) RoCE connect from `client` to `address`, up to connect().
void start_roce_client(Side& client, const sockaddr_in& address, const ConnParam& param = {}) {
  client.id = roce_id(client);
  EXPECT_EQ(client.id->transport(), Transport::roce);
  EXPECT_TRUE(client.id->set_option(CmOption::peer_to_peer, 0));
  EXPECT_TRUE(client.id->resolve_addr(address));
  expect_event(*client.channel, CmEventType::addr_resolved);
  EXPECT_TRUE(client.id->resolve_route());
  expect_event(*client.channel, CmEventType::route_resolved);
  client.qp = client.id->create_qp(*client.pd, client.qp_attr()).value();
  EXPECT_TRUE(client.id->connect(param));
}

// An id of `client` resolved towards `to` (a random 127/8 address where nobody is), with
// its QP.
void resolve_towards_nobody(Side& client, bool p2p, const sockaddr_in& to = random_loopback(7471)) {
  client.id = roce_id(client);
  ASSERT_TRUE(client.id->set_option(CmOption::peer_to_peer, p2p ? 1 : 0));
  ASSERT_TRUE(client.id->resolve_addr(to));
  expect_event(*client.channel, CmEventType::addr_resolved);
  ASSERT_TRUE(client.id->resolve_route());
  expect_event(*client.channel, CmEventType::route_resolved);
  client.qp = client.id->create_qp(*client.pd, client.qp_attr()).value();
}

// A RoCE server listening on a random loopback address and a client connected to it.
struct RocePair {
  Side server;
  Side client;
  std::unique_ptr<CmId> listener;
  sockaddr_in address{};
  CmEvent request;

  explicit RocePair(const ContextOptions& server_options = {}, const ContextOptions& client_options = {})
      : server(server_options), client(client_options) {
    listener = roce_id(server);
    address = random_loopback(7471);
    EXPECT_TRUE(listener->bind(address));
    EXPECT_TRUE(listener->listen(16));
  }

  void start_client(const ConnParam& param = {}) { start_roce_client(client, address, param); }

  void take_request() {
    request = expect_event(*server.channel, CmEventType::connect_request);
    ASSERT_TRUE(request.new_id);
    server.id = std::move(request.new_id);
    EXPECT_EQ(server.id->transport(), Transport::roce);
  }

  void accept(const ConnParam& param = {}) {
    take_request();
    server.qp = server.id->create_qp(*server.pd, server.qp_attr()).value();
    ASSERT_TRUE(server.id->accept(param));
    expect_event(*client.channel, CmEventType::established);
    expect_event(*server.channel, CmEventType::established);
  }
};

TEST(Roce, ConnectsWithPrivateDataAndSwappedResources) {
  RocePair pair;
  pair.start_client(ConnParam{.private_data = {1, 2, 3}, .responder_resources = 4, .initiator_depth = 8});
  pair.take_request();
  // IB CM private data has a fixed size per message: it arrives zero-padded (as rdma_cm's).
  ASSERT_GE(pair.request.param.private_data.size(), 3u);
  EXPECT_EQ(pair.request.param.private_data[2], 3);
  EXPECT_EQ(pair.request.param.responder_resources, 8);
  EXPECT_EQ(pair.request.param.initiator_depth, 4);
  pair.server.qp = pair.server.id->create_qp(*pair.server.pd, pair.server.qp_attr()).value();
  ASSERT_TRUE(pair.server.id->accept(ConnParam{.private_data = {9, 8}}));
  auto established = expect_event(*pair.client.channel, CmEventType::established);
  ASSERT_GE(established.param.private_data.size(), 2u);
  EXPECT_EQ(established.param.private_data[0], 9);
  EXPECT_EQ(established.param.private_data[1], 8);
  expect_event(*pair.server.channel, CmEventType::established);
  EXPECT_EQ(pair.client.qp->state(), QpState::rts);
  EXPECT_EQ(pair.client.id->peer_address().sin_addr.s_addr, pair.address.sin_addr.s_addr);
  // The addressing rule: the client runs from a loopback address of its own.
  const sockaddr_in local = pair.client.id->local_address();
  EXPECT_EQ(ntohl(local.sin_addr.s_addr) >> 24, 127u);
  EXPECT_NE(local.sin_addr.s_addr, pair.address.sin_addr.s_addr);
}

// Send, Write and Read of `size` bytes, each checked byte for byte.
void move_data(RocePair& pair, std::size_t size) {
  std::vector<std::uint8_t> source(size), inbox(size + 1, 0), target(size + 1, 0), readback(size + 1, 0);
  std::iota(source.begin(), source.end(), static_cast<std::uint8_t>(size));
  auto source_mr = pair.client.region(source);
  auto readback_mr = pair.client.region(readback);
  auto inbox_mr = pair.server.region(inbox);
  auto target_mr = pair.server.region(target);
  ASSERT_TRUE(pair.server.qp->post_recv(RecvWr{.wr_id = 10, .sg_list = {inbox_mr->sge()}}));
  ASSERT_TRUE(pair.client.qp->post_send(
      SendWr{.wr_id = 1, .opcode = WrOpcode::send, .sg_list = {source_mr->sge(0, size)}}));
  ASSERT_TRUE(pair.client.qp->post_send(SendWr{.wr_id = 2,
                                               .opcode = WrOpcode::rdma_write,
                                               .sg_list = {source_mr->sge(0, size)},
                                               .remote_addr = reinterpret_cast<std::uintptr_t>(target.data()),
                                               .rkey = target_mr->rkey()}));
  auto client_wcs = poll_n(*pair.client.cq, 2);
  ASSERT_EQ(client_wcs.size(), 2u);
  for (const auto& wc : client_wcs) EXPECT_EQ(wc.status, WcStatus::success) << wc.wr_id;
  auto server_wcs = poll_n(*pair.server.cq, 1);
  ASSERT_EQ(server_wcs.size(), 1u);
  EXPECT_EQ(server_wcs[0].status, WcStatus::success);
  EXPECT_EQ(server_wcs[0].byte_len, size);
  EXPECT_TRUE(std::equal(source.begin(), source.end(), inbox.begin()));
  EXPECT_TRUE(std::equal(source.begin(), source.end(), target.begin()));
  // Read back what the Write put there.
  ASSERT_TRUE(pair.client.qp->post_send(SendWr{.wr_id = 3,
                                               .opcode = WrOpcode::rdma_read,
                                               .sg_list = {readback_mr->sge(0, size)},
                                               .remote_addr = reinterpret_cast<std::uintptr_t>(target.data()),
                                               .rkey = target_mr->rkey()}));
  auto read_wc = poll_n(*pair.client.cq, 1);
  ASSERT_EQ(read_wc.size(), 1u);
  EXPECT_EQ(read_wc[0].status, WcStatus::success);
  EXPECT_TRUE(std::equal(source.begin(), source.end(), readback.begin()));
}

TEST(Roce, SendWriteReadOfEverySize) {
  RocePair pair;
  pair.start_client();
  pair.accept();
  for (std::size_t size : {std::size_t{0}, std::size_t{1}, std::size_t{4096}, std::size_t{1} << 20}) {
    SCOPED_TRACE(size);
    move_data(pair, size);
  }
}

TEST(Roce, SendAndWriteWithImmediateEndToEnd) {
  RocePair pair;
  pair.start_client();
  pair.accept();
  constexpr std::size_t kSize = 10000;  // several packets at any PMTU
  std::vector<std::uint8_t> source(kSize), inbox(kSize + 1, 0), target(kSize + 1, 0), spare(8, 0);
  std::iota(source.begin(), source.end(), std::uint8_t{17});
  auto source_mr = pair.client.region(source);
  auto inbox_mr = pair.server.region(inbox);
  auto target_mr = pair.server.region(target);
  auto spare_mr = pair.server.region(spare);
  ASSERT_TRUE(pair.server.qp->post_recv(RecvWr{.wr_id = 10, .sg_list = {inbox_mr->sge()}}));
  ASSERT_TRUE(pair.server.qp->post_recv(RecvWr{.wr_id = 11, .sg_list = {spare_mr->sge()}}));
  ASSERT_TRUE(pair.server.qp->post_recv(RecvWr{.wr_id = 12, .sg_list = {spare_mr->sge()}}));
  ASSERT_TRUE(pair.client.qp->post_send(SendWr{.wr_id = 1,
                                               .opcode = WrOpcode::send_with_imm,
                                               .sg_list = {source_mr->sge(0, kSize)},
                                               .imm_data = htonl(0xA1B2C3D4)}));
  ASSERT_TRUE(pair.client.qp->post_send(SendWr{.wr_id = 2,
                                               .opcode = WrOpcode::rdma_write_with_imm,
                                               .sg_list = {source_mr->sge(0, kSize)},
                                               .remote_addr = reinterpret_cast<std::uintptr_t>(target.data()),
                                               .rkey = target_mr->rkey(),
                                               .imm_data = htonl(0x01020304)}));
  // Zero bytes: a notification carrying only its immediate value.
  ASSERT_TRUE(pair.client.qp->post_send(
      SendWr{.wr_id = 3, .opcode = WrOpcode::rdma_write_with_imm, .imm_data = htonl(0xFFFFFFFE)}));
  auto client_wcs = poll_n(*pair.client.cq, 3);
  ASSERT_EQ(client_wcs.size(), 3u);
  const WcOpcode sender_opcodes[] = {WcOpcode::send, WcOpcode::rdma_write, WcOpcode::rdma_write};
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(client_wcs[i].wr_id, i + 1);
    EXPECT_EQ(client_wcs[i].status, WcStatus::success);
    EXPECT_EQ(client_wcs[i].opcode, sender_opcodes[i]);
    EXPECT_EQ(client_wcs[i].wc_flags & kWcWithImm, 0u);
  }
  auto server_wcs = poll_n(*pair.server.cq, 3);
  ASSERT_EQ(server_wcs.size(), 3u);
  for (const auto& wc : server_wcs) {
    EXPECT_EQ(wc.status, WcStatus::success) << wc.wr_id;
    EXPECT_NE(wc.wc_flags & kWcWithImm, 0u) << wc.wr_id;
  }
  EXPECT_EQ(server_wcs[0].wr_id, 10u);
  EXPECT_EQ(server_wcs[0].opcode, WcOpcode::recv);
  EXPECT_EQ(server_wcs[0].byte_len, kSize);
  EXPECT_EQ(server_wcs[0].imm_data, htonl(0xA1B2C3D4));
  EXPECT_EQ(server_wcs[1].wr_id, 11u);
  EXPECT_EQ(server_wcs[1].opcode, WcOpcode::recv_rdma_with_imm);
  EXPECT_EQ(server_wcs[1].byte_len, kSize);
  EXPECT_EQ(server_wcs[1].imm_data, htonl(0x01020304));
  EXPECT_EQ(server_wcs[2].wr_id, 12u);
  EXPECT_EQ(server_wcs[2].opcode, WcOpcode::recv_rdma_with_imm);
  EXPECT_EQ(server_wcs[2].byte_len, 0u);
  EXPECT_EQ(server_wcs[2].imm_data, htonl(0xFFFFFFFE));
  EXPECT_TRUE(std::equal(source.begin(), source.end(), inbox.begin()));
  EXPECT_TRUE(std::equal(source.begin(), source.end(), target.begin()));
  EXPECT_EQ(spare, std::vector<std::uint8_t>(8, 0));  // a Write with Immediate's receive stays unwritten
  EXPECT_EQ(pair.server.qp->state(), QpState::rts);
}

TEST(Roce, RejectCarriesPrivateData) {
  RocePair pair;
  pair.start_client();
  pair.take_request();
  const std::vector<std::uint8_t> why{0xDE, 0xAD};
  ASSERT_TRUE(pair.server.id->reject(why));
  auto rejected = expect_event(*pair.client.channel, CmEventType::rejected);
  ASSERT_GE(rejected.param.private_data.size(), why.size());
  EXPECT_TRUE(std::equal(why.begin(), why.end(), rejected.param.private_data.begin()));
  EXPECT_EQ(rejected.reject_reason, RejectReason::application);
}

TEST(Roce, DisconnectFlushesAPostedReceiveOnBothSides) {
  RocePair pair;
  pair.start_client();
  pair.accept();
  std::vector<std::uint8_t> a(64), b(64);
  auto a_mr = pair.client.region(a);
  auto b_mr = pair.server.region(b);
  ASSERT_TRUE(pair.client.qp->post_recv(RecvWr{.wr_id = 21, .sg_list = {a_mr->sge()}}));
  ASSERT_TRUE(pair.server.qp->post_recv(RecvWr{.wr_id = 22, .sg_list = {b_mr->sge()}}));
  ASSERT_TRUE(pair.client.id->disconnect());
  expect_event(*pair.client.channel, CmEventType::disconnected);
  expect_event(*pair.server.channel, CmEventType::disconnected);
  auto client_wc = poll_n(*pair.client.cq, 1);
  ASSERT_EQ(client_wc.size(), 1u);
  EXPECT_EQ(client_wc[0].wr_id, 21u);
  EXPECT_EQ(client_wc[0].status, WcStatus::wr_flush_error);
  auto server_wc = poll_n(*pair.server.cq, 1);
  ASSERT_EQ(server_wc.size(), 1u);
  EXPECT_EQ(server_wc[0].wr_id, 22u);
  EXPECT_EQ(server_wc[0].status, WcStatus::wr_flush_error);
  EXPECT_EQ(pair.server.qp->state(), QpState::error);
  expect_event(*pair.client.channel, CmEventType::timewait_exit);
  expect_event(*pair.server.channel, CmEventType::timewait_exit);
}

TEST(Roce, NoListenerOnTheServiceIsRejected) {
  RocePair pair;
  pair.address.sin_port = htons(ntohs(pair.address.sin_port) + 1);  // the node is there, the service is not
  pair.start_client();
  auto rejected = expect_event(*pair.client.channel, CmEventType::rejected);
  EXPECT_EQ(rejected.reject_reason, RejectReason::refused);
}

// A requester that listens itself advertises its own listening port in the REQ (the p2p key's
// port); the request still goes to the listener of the service it names, and the new id's
// local port is that service. (It was looked up by the advertised port: a node with a listener
// on another port was rejected, which broke every Mesh of more than one rank.)
TEST(Roce, RequestFromANodeThatListensReachesTheServiceListener) {
  for (const bool p2p : {false, true}) {
    SCOPED_TRACE(p2p ? "p2p" : "client/server");
    RocePair pair;
    auto own_listener = roce_id(pair.client);
    ASSERT_TRUE(own_listener->bind(random_loopback(7481)));
    ASSERT_TRUE(own_listener->listen(16));
    pair.client.id = roce_id(pair.client);
    ASSERT_TRUE(pair.client.id->set_option(CmOption::peer_to_peer, p2p ? 1 : 0));
    ASSERT_TRUE(pair.client.id->resolve_addr(pair.address));
    expect_event(*pair.client.channel, CmEventType::addr_resolved);
    ASSERT_TRUE(pair.client.id->resolve_route());
    expect_event(*pair.client.channel, CmEventType::route_resolved);
    pair.client.qp = pair.client.id->create_qp(*pair.client.pd, pair.client.qp_attr()).value();
    ASSERT_TRUE(pair.client.id->connect(ConnParam{.private_data = {5}}));
    pair.take_request();
    EXPECT_EQ(pair.request.listen_id, pair.listener.get());
    EXPECT_EQ(pair.server.id->local_address().sin_port, pair.address.sin_port);
    ASSERT_GE(pair.request.param.private_data.size(), 1u);
    EXPECT_EQ(pair.request.param.private_data[0], 5);
    pair.server.qp = pair.server.id->create_qp(*pair.server.pd, pair.server.qp_attr()).value();
    ASSERT_TRUE(pair.server.id->accept({}));
    expect_event(*pair.client.channel, CmEventType::established);
    expect_event(*pair.server.channel, CmEventType::established);
    move_data(pair, 4096);
  }
}

// listen() on INADDR_ANY (rdma_server, rping -s without -a): REQs reaching any of the
// context's addresses, opened before or after, find the listener; a listener on one address
// with the same port is EADDRINUSE; once it goes, the service is refused again.
TEST(Roce, ListenerOnAnyAddressTakesRequestsAtEveryAddress) {
  Side server;
  auto any = roce_id(server);
  ASSERT_TRUE(any->bind(sockaddr_in{.sin_family = AF_INET}));
  ASSERT_TRUE(any->listen(16));
  const sockaddr_in bound = any->local_address();
  EXPECT_EQ(bound.sin_addr.s_addr, htonl(INADDR_ANY));
  ASSERT_NE(bound.sin_port, 0);
  // Another listener of this node, on an address of its own: a port opened after the
  // INADDR_ANY listener.
  sockaddr_in address = random_loopback(7491);
  if (address.sin_port == bound.sin_port) address.sin_port = htons(7492);
  auto specific = roce_id(server);
  ASSERT_TRUE(specific->bind(address));
  ASSERT_TRUE(specific->listen(16));
  auto clash = roce_id(server);
  ASSERT_TRUE(clash->bind(sockaddr_in{.sin_family = AF_INET, .sin_port = bound.sin_port, .sin_addr = address.sin_addr}));
  EXPECT_EQ(clash->listen(16).error(), std::errc::address_in_use);

  address.sin_port = bound.sin_port;
  Side client;
  start_roce_client(client, address);
  auto request = expect_event(*server.channel, CmEventType::connect_request);
  EXPECT_EQ(request.listen_id, any.get());
  ASSERT_TRUE(request.new_id);
  server.id = std::move(request.new_id);
  EXPECT_EQ(server.id->local_address().sin_addr.s_addr, address.sin_addr.s_addr);
  server.qp = server.id->create_qp(*server.pd, server.qp_attr()).value();
  ASSERT_TRUE(server.id->accept({}));
  expect_event(*client.channel, CmEventType::established);
  expect_event(*server.channel, CmEventType::established);

  std::vector<std::uint8_t> message(64, 0x5A), sink(64, 0);
  auto message_mr = client.region(message);
  auto sink_mr = server.region(sink);
  ASSERT_TRUE(server.qp->post_recv(RecvWr{.wr_id = 1, .sg_list = {sink_mr->sge()}}));
  ASSERT_TRUE(client.qp->post_send(SendWr{.wr_id = 2, .opcode = WrOpcode::send, .sg_list = {message_mr->sge()}}));
  ASSERT_EQ(poll_n(*server.cq, 1).size(), 1u);
  EXPECT_EQ(sink, message);

  any.reset();
  Side late;
  start_roce_client(late, address);
  EXPECT_EQ(expect_event(*late.channel, CmEventType::rejected).reject_reason, RejectReason::refused);
}

TEST(Roce, NobodyAtTheAddressIsUnreachable) {
  // Short CM timers: 4.096 us * 2^14 = 67 ms per try, two retries. (The host's port
  // unreachable for the first REQ ends it sooner.)
  ContextOptions options;
  options.roce.cm_packet_lifetime = 10;
  options.roce.cm_response_timeout = 14;
  options.roce.cm_max_retries = 2;
  Side client(options);
  resolve_towards_nobody(client, false);
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(client.id->connect({}));
  expect_event(*client.channel, CmEventType::unreachable);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 3s);
}

// listen(backlog) bounds the requests the application has not decided yet; the REQ beyond
// it is rejected (REJ 28, as Linux's rdma_ucm does); deciding one makes room again.
TEST(Roce, BacklogBoundsUndecidedRequests) {
  Side server;
  auto listener = roce_id(server);
  const sockaddr_in address = random_loopback(7501);
  ASSERT_TRUE(listener->bind(address));
  ASSERT_TRUE(listener->listen(2));
  Side a, b, c, d;
  start_roce_client(a, address);
  auto first = expect_event(*server.channel, CmEventType::connect_request);
  start_roce_client(b, address);
  auto second = expect_event(*server.channel, CmEventType::connect_request);
  start_roce_client(c, address);
  EXPECT_EQ(expect_event(*c.channel, CmEventType::rejected).reject_reason, RejectReason::application)
      << "two undecided requests fill a backlog of 2";
  ASSERT_TRUE(first.new_id->reject({}));
  EXPECT_EQ(expect_event(*a.channel, CmEventType::rejected).reject_reason, RejectReason::application);
  start_roce_client(d, address);
  auto third = expect_event(*server.channel, CmEventType::connect_request);
  ASSERT_TRUE(third.new_id);
  server.qp = third.new_id->create_qp(*server.pd, server.qp_attr()).value();
  ASSERT_TRUE(third.new_id->accept({}));
  expect_event(*d.channel, CmEventType::established);
  expect_event(*server.channel, CmEventType::established);
  EXPECT_EQ(cm_stats(*server.context).rejects_sent[static_cast<int>(RejectReason::application)], 2u);
  second.new_id.reset();
}

// A RoCE id of `side` from `source` (0: the device picks) to `to`, resolved, with its QP.
std::unique_ptr<CmId> roce_routed(Side& side, const sockaddr_in& to, std::uint32_t source,
                                  std::initializer_list<std::pair<CmOption, std::int64_t>> options) {
  return routed_id(side, to, options, Transport::roce, source);
}

// The next event of `channel` about `id`, others skipped.
CmEvent event_of(EventChannel& channel, const CmId* id) {
  for (auto e = channel.get_event(5s); e; e = channel.get_event(5s))
    if (e->id == id) return std::move(*e);
  ADD_FAILURE() << "no event for the id";
  return {};
}

// B1 (docs/p2p.md): a p2p REQ holds its place in the backlog like a client/server one, and
// beyond the backlog gets REJ 28. Before, p2p REQs were never counted: 20,000 of them cost the
// server 35 MiB and got no answer.
TEST(Roce, P2pRequestsCountInTheBacklog) {
  Side server;
  auto listener = roce_id(server);
  const sockaddr_in address = random_loopback(7502);
  ASSERT_TRUE(listener->bind(address));
  ASSERT_TRUE(listener->listen(2));
  Side client;
  std::vector<std::unique_ptr<CmId>> ids, undecided;
  for (int tag = 1; tag <= 3; ++tag) {
    ids.push_back(roce_routed(client, address, 0, {{CmOption::peer_to_peer, 1}, {CmOption::p2p_tag, tag}}));
    ASSERT_TRUE(ids.back()->connect({}));
    if (tag <= 2) {
      auto request = expect_event(*server.channel, CmEventType::connect_request);
      ASSERT_TRUE(request.new_id);
      EXPECT_TRUE(request.new_id->option(CmOption::peer_to_peer));
      undecided.push_back(std::move(request.new_id));
    }
  }
  const CmEvent third = event_of(*client.channel, ids[2].get());
  EXPECT_EQ(third.type, CmEventType::rejected) << to_string(third.type);
  EXPECT_EQ(third.reject_reason, RejectReason::application);
  EXPECT_EQ(cm_stats(*server.context).backlog_refused, 1u);
  EXPECT_FALSE(server.channel->get_event(100ms)) << "a p2p request got past a full backlog";
}

// B1: one source address holds at most the backlog less a quarter; a request from another
// address still finds room.
TEST(Roce, OneSourceHoldsAtMostItsShareOfTheBacklog) {
  Side server;
  auto listener = roce_id(server);
  const sockaddr_in address = random_loopback(7503);
  ASSERT_TRUE(listener->bind(address));
  ASSERT_TRUE(listener->listen(4));
  Side flooder, other;
  const std::uint32_t flood_source = ntohl(random_loopback(0).sin_addr.s_addr);
  std::vector<std::unique_ptr<CmId>> ids;
  std::vector<CmEvent> requests;
  for (int i = 0; i < 4; ++i) {
    ids.push_back(roce_routed(flooder, address, flood_source, {{CmOption::peer_to_peer, 0}}));
    ASSERT_TRUE(ids.back()->connect({}));
    if (i < 3) requests.push_back(expect_event(*server.channel, CmEventType::connect_request));
  }
  const CmEvent fourth = event_of(*flooder.channel, ids[3].get());
  EXPECT_EQ(fourth.type, CmEventType::rejected) << to_string(fourth.type);
  auto legitimate = roce_routed(other, address, ntohl(random_loopback(0).sin_addr.s_addr), {{CmOption::peer_to_peer, 0}});
  ASSERT_TRUE(legitimate->connect({}));
  auto request = expect_event(*server.channel, CmEventType::connect_request);
  ASSERT_TRUE(request.new_id);
  server.qp = request.new_id->create_qp(*server.pd, server.qp_attr()).value();
  ASSERT_TRUE(request.new_id->accept({}));
  expect_event(*other.channel, CmEventType::established);
  EXPECT_EQ(cm_stats(*server.context).backlog_refused, 1u);
}

// CmOption::connect_timeout bounds a p2p attempt over RoCE too (docs/p2p.md R8): nobody
// answers the REQ, and CONNECT_ERROR comes at the id's deadline, long before the agent's
// 10 s default or the end of the CM's REQ retries.
TEST(Roce, P2pAttemptEndsAtTheIdsConnectTimeout) {
  // A socket holds the RoCE port there and reads nothing: the REQs vanish. (Where nobody
  // holds it, the host's port unreachable ends the attempt at once: RoceDeadPeer.*.)
  const sockaddr_in silent = random_loopback(7471);
  const int holder = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(holder, 0);
  sockaddr_in port = silent;
  port.sin_port = htons(4791);
  ASSERT_EQ(::bind(holder, reinterpret_cast<const sockaddr*>(&port), sizeof port), 0);
  Side client;
  resolve_towards_nobody(client, true, silent);
  ASSERT_TRUE(client.id->set_option(CmOption::connect_timeout, 300));
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(client.id->connect({}));
  const CmEvent failed = expect_event(*client.channel, CmEventType::connect_error);
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(failed.reject_reason, RejectReason::timeout);
  EXPECT_GE(took, 300ms);
  EXPECT_LT(took, 5s);
  ::close(holder);
}

// The same bound for a client/server attempt: the id's connect timeout, not the IB CM's REQ
// retries (≈ 4.8 s each by default), ends it; UNREACHABLE, since the peer never spoke.
TEST(Roce, ClientServerAttemptEndsAtTheIdsConnectTimeout) {
  const sockaddr_in silent = random_loopback(7471);
  const int holder = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(holder, 0);
  sockaddr_in port = silent;
  port.sin_port = htons(4791);
  ASSERT_EQ(::bind(holder, reinterpret_cast<const sockaddr*>(&port), sizeof port), 0);
  Side client;
  resolve_towards_nobody(client, false, silent);
  ASSERT_TRUE(client.id->set_option(CmOption::connect_timeout, 300));
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(client.id->connect({}));
  const CmEvent failed = expect_event(*client.channel, CmEventType::unreachable);
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(failed.status, ETIMEDOUT);
  EXPECT_GE(took, 300ms);
  EXPECT_LT(took, 3s);
  ::close(holder);
}

TEST(Roce, SocketsCloseWithTheirContexts) {
  const std::size_t before = open_fds();
  {
    RocePair pair;  // one context each: sockets on 4791, one per QP, reactor fds
    pair.start_client();
    pair.accept();
    move_data(pair, 4096);
    ASSERT_TRUE(pair.client.id->disconnect());
    expect_event(*pair.server.channel, CmEventType::disconnected);
  }
  EXPECT_EQ(open_fds(), before);
}

TEST(Roce, IwarpStaysTheDefault) {
  Side side;
  auto id = std::move(CmId::create(*side.context, *side.channel).value());
  EXPECT_EQ(id->transport(), Transport::iwarp);
}

// --- peer to peer ---

struct P2pNode {
  Side side;
  std::unique_ptr<CmId> listener;
  sockaddr_in address{};
  explicit P2pNode(std::uint64_t guid) : side(ContextOptions{.node_guid = guid}) {
    listener = roce_id(side);
    address = random_loopback(7472);
    EXPECT_TRUE(listener->bind(address));
    EXPECT_TRUE(listener->listen(64));
  }
};

struct P2pRound {
  bool established = false;
  int connect_requests = 0;
  std::uint32_t peer_qp = 0;
  std::uint32_t local_qp = 0;
  std::vector<std::uint8_t> peer_data;  // ESTABLISHED's private data
  std::string error;
  // with traffic: the RC core's counters once the messages arrived
  std::uint64_t ack_timeouts = 0;
  std::uint64_t dropped_early = 0;
};

// Each node's connect carries its own bytes: the round and a mark of the node.
std::vector<std::uint8_t> connect_data(std::uint32_t round, std::uint8_t mark) {
  return {mark, static_cast<std::uint8_t>(round), static_cast<std::uint8_t>(round >> 8), 0x5A};
}

// Traffic: each node posts kEarlySends receives before connect() and kMessages Sends of
// 64 bytes of its mark right after it, and waits for all of them before the closing barrier.
constexpr std::size_t kEarlySends = 8;
struct Traffic {
  std::uint8_t peer_mark = 0;  // what the peer's Sends carry
};

P2pRound p2p_round(P2pNode& node, const sockaddr_in& peer, std::uint32_t tag, std::barrier<>& start,
                   std::uint8_t mark = 0, std::optional<Traffic> traffic = {}) {
  P2pRound r;
  Side& s = node.side;
  auto id = roce_id(s);
  (void)id->set_option(CmOption::p2p_tag, tag);
  auto next_for_id = [&](CmEventType type) {
    for (auto e = s.channel->get_event(5s); e; e = s.channel->get_event(5s)) {
      if (e->id == id.get()) return e->type == type;
      if (e->type == CmEventType::connect_request) ++r.connect_requests;
    }
    return false;
  };
  (void)id->resolve_addr(peer);
  if (!next_for_id(CmEventType::addr_resolved)) r.error = "addr";
  (void)id->resolve_route();
  if (!next_for_id(CmEventType::route_resolved)) r.error = "route";
  QueuePair* qp = id->create_qp(*s.pd, s.qp_attr()).value();
  r.local_qp = qp->qp_num();
  std::vector<std::uint8_t> outbox(64, mark), inbox(64 * kEarlySends, 0);
  auto outbox_mr = s.region(outbox);
  auto inbox_mr = s.region(inbox);
  if (traffic) {
    for (std::size_t i = 0; i < kEarlySends; ++i)
      (void)qp->post_recv(RecvWr{.wr_id = 100 + i, .sg_list = {inbox_mr->sge(i * 64, 64)}});
  }
  start.arrive_and_wait();
  ConnParam param;
  param.private_data = connect_data(tag, mark);
  if (auto ok = id->connect(param); !ok) r.error = "connect: " + std::make_error_code(ok.error()).message();
  if (traffic) {
    for (std::size_t i = 0; i < kEarlySends; ++i)
      (void)qp->post_send(SendWr{.wr_id = i, .opcode = WrOpcode::send, .sg_list = {outbox_mr->sge()}});
  }
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (!r.established && r.error.empty() && std::chrono::steady_clock::now() < deadline) {
    auto e = s.channel->get_event(1s);
    if (!e) continue;
    if (e->type == CmEventType::connect_request) {
      ++r.connect_requests;
    } else if (e->type == CmEventType::established && e->id == id.get()) {
      r.established = true;
      r.peer_qp = e->param.qp_num;
      r.peer_data = e->param.private_data;
    } else if (e->id == id.get()) {
      r.error = std::string("unexpected ") + std::string(to_string(e->type)) + " " +
                std::string(to_string(e->reject_reason)) + " status " + std::to_string(e->status);
    }
  }
  if (!r.established && r.error.empty()) r.error = "no ESTABLISHED";
  if (traffic && r.established) {
    const auto done = poll_n(*s.cq, 2 * kEarlySends, 5s);
    std::size_t good = 0;
    for (const auto& wc : done) good += wc.status == WcStatus::success;
    if (good != 2 * kEarlySends) r.error = std::to_string(good) + " of the messages completed";
    if (inbox != std::vector<std::uint8_t>(inbox.size(), traffic->peer_mark)) r.error = "wrong bytes";
    r.ack_timeouts = detail::roce::rc_stats(*qp).ack_timeouts;
    r.dropped_early = detail::roce::rc_stats(*qp).dropped_not_connected;
  }
  start.arrive_and_wait();  // both saw the outcome before anyone disconnects
  if (r.established) {
    (void)id->disconnect();
    const auto close_deadline = std::chrono::steady_clock::now() + 5s;
    for (bool closed = false; !closed && std::chrono::steady_clock::now() < close_deadline;) {
      auto e = s.channel->get_event(1s);
      closed = e && e->type == CmEventType::disconnected && e->id == id.get();
    }
  }
  return r;
}

// One round of both nodes connecting at once (a's side on a thread of its own), a's connect
// data marked 0xA1 and b's 0xB2.
constexpr std::uint8_t kMarkA = 0xA1, kMarkB = 0xB2;
std::pair<P2pRound, P2pRound> connect_both(P2pNode& a, P2pNode& b, std::uint32_t round, std::barrier<>& start,
                                           bool traffic = false) {
  P2pRound ra, rb;
  const auto expect = [traffic](std::uint8_t peer_mark) {
    return traffic ? std::optional<Traffic>(Traffic{.peer_mark = peer_mark}) : std::nullopt;
  };
  std::thread ta([&] { ra = p2p_round(a, b.address, round, start, kMarkA, expect(kMarkB)); });
  rb = p2p_round(b, a.address, round, start, kMarkB, expect(kMarkA));
  ta.join();
  return {std::move(ra), std::move(rb)};
}

TEST(Roce, SimultaneousConnectsMakeExactlyOneConnection) {
  P2pNode a(0x1000), b(0x2000);
  std::barrier start(2);
  constexpr std::uint32_t kRounds = 100;
  for (std::uint32_t round = 0; round < kRounds; ++round) {
    const auto [ra, rb] = connect_both(a, b, round, start);
    ASSERT_TRUE(ra.error.empty()) << "round " << round << " a: " << ra.error;
    ASSERT_TRUE(rb.error.empty()) << "round " << round << " b: " << rb.error;
    ASSERT_EQ(ra.connect_requests + rb.connect_requests, 0) << "round " << round;
    // Both ends learn the other's connect-time data, whichever side's request became the
    // connection (before, the passive peer's ESTABLISHED carried the RTU's zeros).
    const auto from_a = connect_data(round, kMarkA), from_b = connect_data(round, kMarkB);
    ASSERT_GE(ra.peer_data.size(), from_b.size()) << "round " << round;
    ASSERT_GE(rb.peer_data.size(), from_a.size()) << "round " << round;
    ASSERT_TRUE(std::equal(from_b.begin(), from_b.end(), ra.peer_data.begin())) << "round " << round << ": a got b's data wrong";
    ASSERT_TRUE(std::equal(from_a.begin(), from_a.end(), rb.peer_data.begin())) << "round " << round << ": b got a's data wrong";
    // One connection: each end's peer QP is the other's QP that connected.
    ASSERT_EQ(ra.peer_qp, rb.local_qp) << "round " << round;
    ASSERT_EQ(rb.peer_qp, ra.local_qp) << "round " << round;
  }
  // Every round met the peer's REQ somewhere: held or bound in a collision, or answered by
  // the attempt as an undelivered request (rule 4); cm_stats counts each of those.
  const CmStats sa = cm_stats(*a.side.context), sb = cm_stats(*b.side.context);
  EXPECT_GE(sa.collisions_won + sa.collisions_lost + sa.delivered_requests + sb.collisions_won +
                sb.collisions_lost + sb.delivered_requests,
            kRounds);
}

// Both nodes connect at once and post Sends right after connect(). The node whose attempt
// answers the other's REQ (R3) sent a REP, so its QP receives from then on: the first
// Sends, which may overtake the RTU, are neither dropped nor resent on the ACK timer.
TEST(Roce, SimultaneousConnectsSendRightAwayWithoutResends) {
  P2pNode a(0x1000), b(0x2000);
  std::barrier start(2);
  constexpr std::uint32_t kRounds = 30;
  for (std::uint32_t round = 0; round < kRounds; ++round) {
    const auto [ra, rb] = connect_both(a, b, round, start, /*traffic=*/true);
    ASSERT_TRUE(ra.error.empty()) << "round " << round << " a: " << ra.error;
    ASSERT_TRUE(rb.error.empty()) << "round " << round << " b: " << rb.error;
    EXPECT_EQ(ra.dropped_early + rb.dropped_early, 0u) << "round " << round;
    EXPECT_EQ(ra.ack_timeouts + rb.ack_timeouts, 0u) << "round " << round;
  }
}

// A QP made on its own joins a RoCE id once the id has an address (its packets leave from
// it): before that attach_qp is EINVAL; after, the QP carries the connection and its number
// is the wire QPN the peer sees.
TEST(Roce, AttachedQueuePairCarriesTheConnection) {
  RocePair pair;
  pair.client.id = roce_id(pair.client);
  ASSERT_TRUE(pair.client.id->set_option(CmOption::peer_to_peer, 0));
  auto own = std::move(QueuePair::create(*pair.client.pd, pair.client.qp_attr()).value());
  EXPECT_EQ(pair.client.id->attach_qp(*own).error(), std::errc::invalid_argument);
  ASSERT_TRUE(pair.client.id->resolve_addr(pair.address));
  expect_event(*pair.client.channel, CmEventType::addr_resolved);
  ASSERT_TRUE(pair.client.id->resolve_route());
  expect_event(*pair.client.channel, CmEventType::route_resolved);
  ASSERT_TRUE(pair.client.id->attach_qp(*own));
  ASSERT_TRUE(pair.client.id->connect({}));
  pair.take_request();
  EXPECT_EQ(pair.request.param.qp_num, own->qp_num());
  pair.server.qp = pair.server.id->create_qp(*pair.server.pd, pair.server.qp_attr()).value();
  ASSERT_TRUE(pair.server.id->accept({}));
  expect_event(*pair.client.channel, CmEventType::established);
  expect_event(*pair.server.channel, CmEventType::established);

  std::vector<std::uint8_t> message(5000, 0x5A), sink(5000, 0);
  auto message_mr = pair.client.region(message);
  auto sink_mr = pair.server.region(sink);
  ASSERT_TRUE(pair.server.qp->post_recv(RecvWr{.wr_id = 1, .sg_list = {sink_mr->sge()}}));
  ASSERT_TRUE(own->post_send(SendWr{.wr_id = 2, .opcode = WrOpcode::send, .sg_list = {message_mr->sge()}}));
  auto received = poll_n(*pair.server.cq, 1);
  auto sent = poll_n(*pair.client.cq, 1);
  ASSERT_EQ(received.size(), 1u);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(received[0].status, WcStatus::success);
  EXPECT_EQ(sent[0].status, WcStatus::success);
  EXPECT_EQ(sent[0].qp_num, own->qp_num());
  EXPECT_EQ(sink, message);
  pair.client.id->detach_qp();
  pair.client.id.reset();
}

// cmtime's "no QPs" round: a qp_num that names no QP of the context makes a connection of the
// IB CM exchange alone, each side's REQ/REP carrying the number it named.
TEST(Roce, ConnectionWithoutAQueuePairRunsTheCmExchangeAlone) {
  RocePair pair;
  pair.client.id = roce_id(pair.client);
  ASSERT_TRUE(pair.client.id->set_option(CmOption::peer_to_peer, 0));
  ASSERT_TRUE(pair.client.id->resolve_addr(pair.address));
  expect_event(*pair.client.channel, CmEventType::addr_resolved);
  ASSERT_TRUE(pair.client.id->resolve_route());
  expect_event(*pair.client.channel, CmEventType::route_resolved);
  ASSERT_TRUE(pair.client.id->connect(ConnParam{.qp_num = 0x7FFFFF}));
  pair.take_request();
  EXPECT_EQ(pair.request.param.qp_num, 0x7FFFFFu);
  ASSERT_TRUE(pair.server.id->accept(ConnParam{.qp_num = 0x123456}));
  auto response = expect_event(*pair.client.channel, CmEventType::connect_response);
  EXPECT_EQ(response.param.qp_num, 0x123456u);
  ASSERT_TRUE(pair.client.id->establish());
  expect_event(*pair.server.channel, CmEventType::established);
  ASSERT_TRUE(pair.client.id->disconnect());
  expect_event(*pair.client.channel, CmEventType::disconnected);
  expect_event(*pair.server.channel, CmEventType::disconnected);
}

// rping -q over RoCE: both ends name a QueuePair::create QP by number in connect/accept;
// the active side gets CONNECT_RESPONSE and completes with establish(), as over iWARP, and a
// receive posted before the connection serves its first Send.
TEST(Roce, QueuePairsNamedByNumberCarryTheConnection) {
  RocePair pair;
  pair.client.id = roce_id(pair.client);
  ASSERT_TRUE(pair.client.id->set_option(CmOption::peer_to_peer, 0));
  auto client_qp = std::move(QueuePair::create(*pair.client.pd, pair.client.qp_attr()).value());
  auto server_qp = std::move(QueuePair::create(*pair.server.pd, pair.server.qp_attr()).value());
  // Posted before the QP has a transport (rping -q does this): it moves to the RC core.
  std::vector<std::uint8_t> message(5000, 0x3C), sink(5000, 0);
  auto message_mr = pair.client.region(message);
  auto sink_mr = pair.server.region(sink);
  ASSERT_TRUE(server_qp->post_recv(RecvWr{.wr_id = 1, .sg_list = {sink_mr->sge()}}));
  ASSERT_TRUE(pair.client.id->resolve_addr(pair.address));
  expect_event(*pair.client.channel, CmEventType::addr_resolved);
  ASSERT_TRUE(pair.client.id->resolve_route());
  expect_event(*pair.client.channel, CmEventType::route_resolved);
  EXPECT_EQ(pair.client.id->establish().error(), std::errc::invalid_argument) << "nothing to establish yet";
  ASSERT_TRUE(pair.client.id->connect(ConnParam{.qp_num = client_qp->qp_num()}));
  pair.take_request();
  EXPECT_EQ(pair.request.param.qp_num, client_qp->qp_num());
  ASSERT_TRUE(pair.server.id->accept(ConnParam{.qp_num = server_qp->qp_num()}));
  const CmEvent response = expect_event(*pair.client.channel, CmEventType::connect_response);
  EXPECT_EQ(response.param.qp_num, server_qp->qp_num());
  ASSERT_TRUE(pair.client.id->establish());
  EXPECT_EQ(pair.client.id->establish().error(), std::errc::invalid_argument) << "only once";
  expect_event(*pair.server.channel, CmEventType::established);

  ASSERT_TRUE(client_qp->post_send(SendWr{.wr_id = 2, .opcode = WrOpcode::send, .sg_list = {message_mr->sge()}}));
  auto received = poll_n(*pair.server.cq, 1);
  ASSERT_EQ(received.size(), 1u);
  EXPECT_EQ(received[0].status, WcStatus::success);
  EXPECT_EQ(received[0].qp_num, server_qp->qp_num());
  EXPECT_EQ(sink, message);
  auto sent = poll_n(*pair.client.cq, 1);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].status, WcStatus::success);
  // A claimed QP carries one connection in its life.
  auto second = roce_id(pair.client);
  ASSERT_TRUE(second->set_option(CmOption::peer_to_peer, 0));
  ASSERT_TRUE(second->resolve_addr(pair.address));
  expect_event(*pair.client.channel, CmEventType::addr_resolved);
  ASSERT_TRUE(second->resolve_route());
  expect_event(*pair.client.channel, CmEventType::route_resolved);
  EXPECT_EQ(second->connect(ConnParam{.qp_num = client_qp->qp_num()}).error(), std::errc::invalid_argument);
  pair.client.id->detach_qp();
  pair.server.id->detach_qp();
}

// Sends posted right after connect() leave as soon as the REP makes the client's QP ready to
// send, possibly before the server has the RTU. The server's QP receives from the moment it
// sent its REP (IB CM: the passive side is at RTR by then), so none of them is dropped and
// none waits for the local ACK timer.
TEST(Roce, SendsPostedBeforeEstablishedNeedNoResend) {
  for (int round = 0; round < 10; ++round) {
    SCOPED_TRACE(round);
    RocePair pair;
    std::vector<std::uint8_t> source(64, 7), inbox(64 * 8, 0);
    pair.start_client();
    auto source_mr = pair.client.region(source);
    for (std::uint64_t i = 0; i < 8; ++i)
      ASSERT_TRUE(pair.client.qp->post_send(SendWr{.wr_id = i, .opcode = WrOpcode::send, .sg_list = {source_mr->sge()}}));
    pair.take_request();
    pair.server.qp = pair.server.id->create_qp(*pair.server.pd, pair.server.qp_attr()).value();
    auto inbox_mr = pair.server.region(inbox);
    for (std::uint64_t i = 0; i < 8; ++i)
      ASSERT_TRUE(pair.server.qp->post_recv(RecvWr{.wr_id = i, .sg_list = {inbox_mr->sge(i * 64, 64)}}));
    ASSERT_TRUE(pair.server.id->accept({}));
    auto sent = poll_n(*pair.client.cq, 8, 5s);
    ASSERT_EQ(sent.size(), 8u);
    for (const auto& wc : sent) EXPECT_EQ(wc.status, WcStatus::success);
    auto received = poll_n(*pair.server.cq, 8, 5s);
    ASSERT_EQ(received.size(), 8u);
    EXPECT_EQ(inbox, std::vector<std::uint8_t>(inbox.size(), 7));
    EXPECT_EQ(detail::roce::rc_stats(*pair.client.qp).ack_timeouts, 0u);
    EXPECT_EQ(detail::roce::rc_stats(*pair.server.qp).dropped_not_connected, 0u);
  }
}

// --- a lossy wire ---

TEST(Roce, LossyWireDeliversEveryByteOnceInOrder) {
  ContextOptions lossy;
  lossy.roce.faults = RoceFaults{.drop = 0.10, .duplicate = 0.05, .reorder = 0.10, .seed = 0};
  lossy.roce.cm_packet_lifetime = 10;
  lossy.roce.cm_response_timeout = 14;
  ContextOptions server_options = lossy;
  lossy.roce.faults.seed = 1;
  server_options.roce.faults.seed = 2;
  RocePair pair(server_options, lossy);
  pair.start_client();
  pair.accept();
  constexpr std::size_t kMessage = 64 * 1024;
  constexpr std::size_t kMessages = 32;  // 2 MiB by Send, 2 MiB by Write
  std::vector<std::uint8_t> source(kMessage * kMessages), inbox(source.size(), 0), target(source.size(), 0);
  std::mt19937 random(7);
  for (auto& byte : source) byte = static_cast<std::uint8_t>(random());
  auto source_mr = pair.client.region(source);
  auto inbox_mr = pair.server.region(inbox);
  auto target_mr = pair.server.region(target);
  for (std::size_t i = 0; i < kMessages; ++i)
    ASSERT_TRUE(pair.server.qp->post_recv(RecvWr{.wr_id = 1000 + i, .sg_list = {inbox_mr->sge(i * kMessage, kMessage)}}));
  for (std::size_t i = 0; i < kMessages; ++i) {
    ASSERT_TRUE(pair.client.qp->post_send(
        SendWr{.wr_id = i, .opcode = WrOpcode::send, .sg_list = {source_mr->sge(i * kMessage, kMessage)}}));
    ASSERT_TRUE(pair.client.qp->post_send(
        SendWr{.wr_id = 100 + i,
               .opcode = WrOpcode::rdma_write,
               .sg_list = {source_mr->sge(i * kMessage, kMessage)},
               .remote_addr = reinterpret_cast<std::uintptr_t>(target.data() + i * kMessage),
               .rkey = target_mr->rkey()}));
  }
  auto sent = poll_n(*pair.client.cq, 2 * kMessages, 60s);
  ASSERT_EQ(sent.size(), 2 * kMessages);
  std::vector<int> seen(200, 0);
  for (const auto& wc : sent) {
    EXPECT_EQ(wc.status, WcStatus::success) << wc.wr_id;
    ASSERT_LT(wc.wr_id, 200u);
    ++seen[wc.wr_id];
  }
  auto received = poll_n(*pair.server.cq, kMessages, 60s);
  ASSERT_EQ(received.size(), kMessages);
  for (std::size_t i = 0; i < kMessages; ++i) {
    EXPECT_EQ(received[i].status, WcStatus::success);
    EXPECT_EQ(received[i].wr_id, 1000 + i);  // in posting order
    EXPECT_EQ(received[i].byte_len, kMessage);
  }
  for (std::size_t i = 0; i < kMessages; ++i) {
    EXPECT_EQ(seen[i], 1);
    EXPECT_EQ(seen[100 + i], 1);
  }
  WorkCompletion extra[4];
  EXPECT_EQ(pair.client.cq->poll(extra), 0u);
  EXPECT_EQ(pair.server.cq->poll(extra), 0u);
  EXPECT_EQ(inbox, source);
  EXPECT_EQ(target, source);
}

// Whether a context holds the abstract unix name `name` (address_share.hpp).
bool name_held(const std::string& name) {
  const int fd = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path + 1, name.data(), name.size());
  const bool held = ::connect(fd, reinterpret_cast<const sockaddr*>(&address),
                              static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size())) == 0;
  ::close(fd);
  return held;
}

// Several contexts on one address (docs/roce-transport.md, "Several processes on one
// address"): a context is there what a process is, with a slot of its own. A client bound to
// the server's address connects to it client/server, moves a Send and a Write, disconnects
// and goes; its slot's name goes with it, and a new context on the address connects again.
TEST(RoceSharedAddress, ContextsOnOneAddressConnectAndOneThatLeavesFreesItsSlot) {
  namespace share = detail::roce;
  Side server;
  auto listener = roce_id(server);
  const sockaddr_in address = random_loopback(7471);
  ASSERT_TRUE(listener->bind(address));
  ASSERT_TRUE(listener->listen(16));
  const int server_slot = share::share_counts(*server.context).slot;
  ASSERT_GE(server_slot, 0);
  const std::uint32_t host = ntohl(address.sin_addr.s_addr);
  EXPECT_TRUE(name_held(share::slot_name(host, server_slot)));
  EXPECT_TRUE(name_held(share::service_name(host, 7471)));
  for (int round = 0; round < 2; ++round) {
    int client_slot = -1;
    {
      Side client;
      client.id = roce_id(client);
      ASSERT_TRUE(client.id->set_option(CmOption::peer_to_peer, 0));
      sockaddr_in source = address;
      source.sin_port = 0;
      ASSERT_TRUE(client.id->bind(source));
      ASSERT_TRUE(client.id->resolve_addr(address));
      expect_event(*client.channel, CmEventType::addr_resolved);
      ASSERT_TRUE(client.id->resolve_route());
      expect_event(*client.channel, CmEventType::route_resolved);
      client.qp = client.id->create_qp(*client.pd, client.qp_attr()).value();
      ASSERT_TRUE(client.id->connect({}));
      auto request = expect_event(*server.channel, CmEventType::connect_request);
      ASSERT_TRUE(request.new_id);
      server.id = std::move(request.new_id);
      server.qp = server.id->create_qp(*server.pd, server.qp_attr()).value();
      ASSERT_TRUE(server.id->accept({}));
      expect_event(*client.channel, CmEventType::established);
      expect_event(*server.channel, CmEventType::established);
      EXPECT_EQ(client.id->local_address().sin_addr.s_addr, address.sin_addr.s_addr);
      client_slot = share::share_counts(*client.context).slot;
      ASSERT_GE(client_slot, 0);
      EXPECT_NE(client_slot, server_slot);
      // Each QPN carries its context's slot: that is how a datagram finds its owner.
      EXPECT_EQ(static_cast<int>(client.qp->qp_num() >> share::kQpnSlotShift), client_slot);
      EXPECT_EQ(static_cast<int>(server.qp->qp_num() >> share::kQpnSlotShift), server_slot);

      const std::size_t size = 3 * 4096 + 17;
      std::vector<std::uint8_t> data(size), inbox(size, 0), target(size, 0);
      std::iota(data.begin(), data.end(), static_cast<std::uint8_t>(round + 1));
      auto data_mr = client.region(data);
      auto inbox_mr = server.region(inbox);
      auto target_mr = server.region(target);
      ASSERT_TRUE(server.qp->post_recv(RecvWr{.wr_id = 10, .sg_list = {inbox_mr->sge()}}));
      ASSERT_TRUE(client.qp->post_send(SendWr{.wr_id = 1, .opcode = WrOpcode::send, .sg_list = {data_mr->sge()}}));
      ASSERT_TRUE(client.qp->post_send(SendWr{.wr_id = 2,
                                              .opcode = WrOpcode::rdma_write,
                                              .sg_list = {data_mr->sge()},
                                              .remote_addr = reinterpret_cast<std::uintptr_t>(target.data()),
                                              .rkey = target_mr->rkey()}));
      auto client_wcs = poll_n(*client.cq, 2);
      ASSERT_EQ(client_wcs.size(), 2u);
      for (const auto& wc : client_wcs) EXPECT_EQ(wc.status, WcStatus::success) << wc.wr_id;
      auto server_wcs = poll_n(*server.cq, 1);
      ASSERT_EQ(server_wcs.size(), 1u);
      EXPECT_EQ(server_wcs[0].status, WcStatus::success);
      EXPECT_EQ(server_wcs[0].byte_len, size);
      EXPECT_EQ(inbox, data);
      EXPECT_EQ(target, data);
      // The two went to each other over their unix names, never through a foreign socket.
      EXPECT_GT(share::share_counts(*client.context).forwarded_out, 0u);
      EXPECT_GT(share::share_counts(*server.context).forwarded_in, 0u);
      EXPECT_EQ(share::share_counts(*server.context).dropped_no_owner, 0u);

      ASSERT_TRUE(client.id->disconnect());
      expect_event(*client.channel, CmEventType::disconnected);
      expect_event(*server.channel, CmEventType::disconnected);
      EXPECT_TRUE(name_held(share::slot_name(host, client_slot)));
      server.id.reset();
      server.qp = nullptr;
    }
    // The context is gone, and its slot's name with it: the kernel frees an abstract name
    // with its socket, so a process that dies leaves nothing behind either.
    EXPECT_FALSE(name_held(share::slot_name(host, client_slot)));
    EXPECT_FALSE(name_held(share::slot_name(client_slot)));
  }
}

// A node elsewhere connecting to one of several contexts on an address: the kernel hands
// each flow (a QP's source port, the CM's) to any context there, and a bystander passes what
// is not its own to the owner, REQs by their service port. 16 connections with a Send each:
// every one arrives; the bystander passed datagrams on (that no flow of 17 reached it is a
// chance of 2^-17) and dropped none.
TEST(RoceSharedAddress, DatagramsReachingAnotherContextOnTheAddressArePassedOn) {
  namespace share = detail::roce;
  Side server;
  Side bystander;
  const sockaddr_in address = random_loopback(7471);
  auto listener = roce_id(server);
  ASSERT_TRUE(listener->bind(address));
  ASSERT_TRUE(listener->listen(64));
  auto other_listener = roce_id(bystander);
  sockaddr_in other = address;
  other.sin_port = htons(7472);
  ASSERT_TRUE(other_listener->bind(other));
  ASSERT_TRUE(other_listener->listen(16));
  Side client;
  constexpr int kConnections = 16;
  std::vector<std::unique_ptr<CmId>> client_ids, server_ids;
  std::vector<QueuePair*> client_qps, server_qps;
  std::vector<std::vector<std::uint8_t>> inboxes(kConnections, std::vector<std::uint8_t>(5000, 0));
  std::vector<std::unique_ptr<MemoryRegion>> inbox_mrs;
  for (int i = 0; i < kConnections; ++i) {
    start_roce_client(client, address);
    auto request = expect_event(*server.channel, CmEventType::connect_request);
    ASSERT_TRUE(request.new_id);
    auto id = std::move(request.new_id);
    QueuePair* qp = id->create_qp(*server.pd, server.qp_attr()).value();
    inbox_mrs.push_back(server.region(inboxes[static_cast<std::size_t>(i)]));
    ASSERT_TRUE(qp->post_recv(RecvWr{.wr_id = static_cast<std::uint64_t>(i), .sg_list = {inbox_mrs.back()->sge()}}));
    ASSERT_TRUE(id->accept({}));
    expect_event(*client.channel, CmEventType::established);
    expect_event(*server.channel, CmEventType::established);
    client_ids.push_back(std::move(client.id));
    client_qps.push_back(client.qp);
    server_ids.push_back(std::move(id));
    server_qps.push_back(qp);
  }
  std::vector<std::uint8_t> data(5000);
  std::iota(data.begin(), data.end(), std::uint8_t{7});
  auto data_mr = client.region(data);
  for (int i = 0; i < kConnections; ++i)
    ASSERT_TRUE(client_qps[static_cast<std::size_t>(i)]->post_send(
        SendWr{.wr_id = static_cast<std::uint64_t>(i), .opcode = WrOpcode::send, .sg_list = {data_mr->sge()}}));
  auto client_wcs = poll_n(*client.cq, kConnections);
  ASSERT_EQ(client_wcs.size(), static_cast<std::size_t>(kConnections));
  for (const auto& wc : client_wcs) EXPECT_EQ(wc.status, WcStatus::success) << wc.wr_id;
  auto server_wcs = poll_n(*server.cq, kConnections);
  ASSERT_EQ(server_wcs.size(), static_cast<std::size_t>(kConnections));
  for (const auto& wc : server_wcs) {
    EXPECT_EQ(wc.status, WcStatus::success);
    EXPECT_EQ(wc.byte_len, data.size());
  }
  for (const auto& inbox : inboxes) EXPECT_EQ(inbox, data);
  const auto passed_on = share::share_counts(*bystander.context);
  EXPECT_GT(passed_on.forwarded_out, 0u);
  EXPECT_EQ(passed_on.dropped_no_owner, 0u);
  EXPECT_EQ(passed_on.dropped_forward_full, 0u);
  EXPECT_GT(share::share_counts(*server.context).forwarded_in, 0u);
  EXPECT_EQ(share::share_counts(*bystander.context).forwarded_in, 0u);
}

}  // namespace
}  // namespace peercm::test
