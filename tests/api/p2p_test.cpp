// The peer-to-peer connection model over real sockets (docs/p2p.md, Rules): two contexts connect to
// each other at the same moment, again and again, and always end with one connection.
#include <gtest/gtest.h>

#include <barrier>
#include <thread>

#include "loopback_pair.hpp"
#include "raw_peer.hpp"
#include "wire/cm_header.hpp"

namespace peercm::test {
namespace {

struct Node {
  Side side;
  std::unique_ptr<CmId> listener;
  std::uint16_t port = 0;
  std::vector<std::unique_ptr<CmId>> accepted;

  explicit Node(std::uint64_t guid) : side(ContextOptions{.node_guid = guid}) {
    listener = std::move(CmId::create(*side.context, *side.channel).value());
    EXPECT_TRUE(listener->bind(loopback(0)));
    EXPECT_TRUE(listener->listen(64));
    port = ntohs(listener->local_address().sin_port);
  }
};

// A CmId of `from` with its tag, its route to 127.0.0.1:`to_port` resolved and a QP: ready to connect.
std::unique_ptr<CmId> routed_id(Node& from, std::uint16_t to_port, std::uint32_t tag) {
  return routed_id(from.side, loopback(to_port), {{CmOption::p2p_tag, tag}});
}

// What one node saw in one round.
struct RoundResult {
  bool established = false;
  std::vector<std::uint8_t> peer_data;  // ESTABLISHED's private data
  int connect_requests = 0;
  bool data_ok = false;
  sockaddr_in local{}, peer{};
  std::string error;
};

// One node's half of a round: connect to `peer_port` with `tag` at the barrier, expect
// ESTABLISHED on that very CmId, then exchange a message (the passive node speaks first).
RoundResult run_round(Node& node, std::uint16_t peer_port, std::uint32_t tag, bool speaks_first,
                      std::barrier<>& start) {
  RoundResult r;
  Side& s = node.side;
  auto id = std::move(CmId::create(*s.context, *s.channel).value());
  (void)id->set_option(CmOption::p2p_tag, tag);
  // Events of the previous round's ids (TIMEWAIT_EXIT) may still be queued: skip them.
  auto next_for_id = [&](CmEventType type) {
    for (auto e = s.channel->get_event(5s); e; e = s.channel->get_event(5s)) {
      if (e->id == id.get()) return e->type == type;
      if (e->type == CmEventType::connect_request) ++r.connect_requests;
    }
    return false;
  };
  (void)id->resolve_addr(loopback(peer_port));
  if (!next_for_id(CmEventType::addr_resolved)) r.error = "addr";
  (void)id->resolve_route();
  if (!next_for_id(CmEventType::route_resolved)) r.error = "route";
  QueuePair* qp = id->create_qp(*s.pd, s.qp_attr()).value();
  std::vector<std::uint8_t> inbox(16, 0), outbox(16, speaks_first ? 0xA1 : 0xB2);
  auto in_mr = s.region(inbox);
  auto out_mr = s.region(outbox);
  (void)qp->post_recv(RecvWr{.wr_id = 1, .sg_list = {in_mr->sge()}});
  start.arrive_and_wait();
  ConnParam param;
  param.private_data = {speaks_first ? std::uint8_t{0xA1} : std::uint8_t{0xB2}, static_cast<std::uint8_t>(tag), 0x5A};
  if (auto ok = id->connect(param); !ok) r.error = "connect: " + std::make_error_code(ok.error()).message();
  // Every event until ours is ESTABLISHED; a CONNECT_REQUEST would mean the CM let the
  // losing request through to the application.
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (!r.established && r.error.empty() && std::chrono::steady_clock::now() < deadline) {
    auto e = s.channel->get_event(1s);
    if (!e) continue;
    if (e->type == CmEventType::connect_request) {
      ++r.connect_requests;
    } else if (e->type == CmEventType::established && e->id == id.get()) {
      r.established = true;
      r.peer_data = e->param.private_data;
    } else if (e->id != id.get()) {
      continue;  // the previous round's ids winding down
    } else {
      r.error = std::string("unexpected ") + std::string(to_string(e->type));
    }
  }
  if (!r.established) {
    if (r.error.empty()) r.error = "no ESTABLISHED";
    return r;
  }
  r.local = id->local_address();
  r.peer = id->peer_address();
  // Data both ways; the passive side's send goes first (rule 9: RTR lifts its fence).
  auto send = [&] {
    return qp->post_send(SendWr{.wr_id = 2, .opcode = WrOpcode::send, .sg_list = {out_mr->sge()}}).has_value();
  };
  bool ok = true;
  if (speaks_first) ok = send();
  bool received = false, sent = false;
  const auto data_deadline = std::chrono::steady_clock::now() + 5s;
  while (ok && !(received && sent) && std::chrono::steady_clock::now() < data_deadline) {
    WorkCompletion wc[4];
    const std::size_t n = s.cq->poll(wc);
    for (std::size_t i = 0; i < n; ++i) {
      if (wc[i].status != WcStatus::success) ok = false;
      if (wc[i].opcode == WcOpcode::recv) {
        received = true;
        if (!speaks_first) ok = ok && send();
      } else {
        sent = true;
      }
    }
  }
  r.data_ok = ok && received && sent && inbox[0] == (speaks_first ? 0xB2 : 0xA1);
  start.arrive_and_wait();  // both finished the exchange before anyone disconnects
  (void)id->disconnect();
  const auto close_deadline = std::chrono::steady_clock::now() + 5s;
  for (bool closed = false; !closed && std::chrono::steady_clock::now() < close_deadline;) {
    auto e = s.channel->get_event(1s);
    closed = e && e->type == CmEventType::disconnected && e->id == id.get();
  }
  WorkCompletion drain[16];
  while (s.cq->poll(drain) > 0) {
  }
  return r;
}

TEST(PeerToPeer, SimultaneousConnectsAlwaysMakeExactlyOneConnection) {
  Node a(/*guid=*/0x1000), b(/*guid=*/0x2000);  // a has the smaller GUID: a is the passive peer
  std::barrier start(2);
  constexpr std::uint32_t kRounds = 1000;
  for (std::uint32_t round = 0; round < kRounds; ++round) {
    RoundResult ra, rb;
    std::thread ta([&] { ra = run_round(a, b.port, round, /*speaks_first=*/true, start); });
    rb = run_round(b, a.port, round, /*speaks_first=*/false, start);
    ta.join();
    ASSERT_TRUE(ra.error.empty()) << "round " << round << " a: " << ra.error;
    ASSERT_TRUE(rb.error.empty()) << "round " << round << " b: " << rb.error;
    ASSERT_TRUE(ra.established && rb.established) << "round " << round;
    ASSERT_EQ(ra.connect_requests + rb.connect_requests, 0) << "round " << round;
    // Both ids sit on the same TCP connection: one connection for the pair.
    ASSERT_EQ(ra.local.sin_port, rb.peer.sin_port) << "round " << round;
    ASSERT_EQ(rb.local.sin_port, ra.peer.sin_port) << "round " << round;
    ASSERT_TRUE(ra.data_ok && rb.data_ok) << "round " << round;
    // Both ends learn the other's connect-time data, whichever request became the connection.
    const std::vector<std::uint8_t> from_a{0xA1, static_cast<std::uint8_t>(round), 0x5A};
    const std::vector<std::uint8_t> from_b{0xB2, static_cast<std::uint8_t>(round), 0x5A};
    ASSERT_GE(ra.peer_data.size(), 3u) << "round " << round;
    ASSERT_GE(rb.peer_data.size(), 3u) << "round " << round;
    ASSERT_TRUE(std::equal(from_b.begin(), from_b.end(), ra.peer_data.begin())) << "round " << round;
    ASSERT_TRUE(std::equal(from_a.begin(), from_a.end(), rb.peer_data.begin())) << "round " << round;
  }
  const CmStats sa = cm_stats(*a.side.context), sb = cm_stats(*b.side.context);
  EXPECT_EQ(sa.delivered_requests + sb.delivered_requests, 0u);
  // The larger node's request wins every round (rule 3): the smaller node, a, is the passive
  // peer and binds its attempt to b's request each time; b never has to.
  EXPECT_EQ(sa.collisions_lost, kRounds);
  EXPECT_EQ(sb.collisions_lost, 0u);
  // The losing side's attempt is never reported as REJECTED by an application.
  EXPECT_EQ(sa.rejects_received[static_cast<int>(RejectReason::application)], 0u);
  EXPECT_EQ(sb.rejects_received[static_cast<int>(RejectReason::application)], 0u);
}

TEST(PeerToPeer, ConnectWhileARequestIsUndecidedIsEalready) {
  Node a(0x1), b(0x2);
  // b connects to a; a's application holds the CONNECT_REQUEST without deciding.
  auto bid = routed_id(b.side, loopback(a.port));
  ASSERT_TRUE(bid->connect({}));
  auto request = expect_event(*a.side.channel, CmEventType::connect_request);
  ASSERT_TRUE(request.new_id);
  // a now connects to b: the undecided request is the connection (rule 5).
  auto aid = routed_id(a.side, loopback(b.port));
  EXPECT_EQ(aid->connect({}).error(), std::errc::connection_already_in_progress);
  // Accepting it establishes; a second connect is then EISCONN.
  request.new_id->create_qp(*a.side.pd, a.side.qp_attr()).value();
  ASSERT_TRUE(request.new_id->accept({}));
  expect_event(*a.side.channel, CmEventType::established);
  expect_event(*b.side.channel, CmEventType::established);
  EXPECT_EQ(aid->connect({}).error(), std::errc::already_connected);
}

// docs/p2p.md, rule 5 refined: a CONNECT_REQUEST still queued and unseen by the application is
// taken back by a connect() for its key, and only for its key: two requests (tags 7 and 8)
// wait, a connects with tag 8, and only the tag-8 request becomes a's connection.
TEST(PeerToPeer, ConnectReclaimsTheUnseenRequestOfItsOwnKeyOnly) {
  Node a(0x1), b(0x2);
  std::vector<std::unique_ptr<CmId>> from_b;
  for (std::uint32_t tag : {7u, 8u}) {
    from_b.push_back(routed_id(b, a.port, tag));
    ASSERT_TRUE(from_b.back()->connect({}));
  }
  // Both requests reach a's channel; a's application does not look.
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (cm_stats(*a.side.context).delivered_requests < 2 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(1ms);
  ASSERT_EQ(cm_stats(*a.side.context).delivered_requests, 2u);

  // Not routed_id(): waiting for ADDR_RESOLVED on a's channel would take the requests off it.
  auto aid = std::move(CmId::create(*a.side.context, *a.side.channel).value());
  ASSERT_TRUE(aid->set_option(CmOption::p2p_tag, 8u));
  ASSERT_TRUE(aid->resolve_addr(loopback(b.port)));
  ASSERT_TRUE(aid->resolve_route());
  aid->create_qp(*a.side.pd, a.side.qp_attr()).value();
  ASSERT_TRUE(aid->connect({}));  // not EALREADY: the unseen tag-8 request is reclaimed
  EXPECT_EQ(cm_stats(*a.side.context).delivered_requests, 1u);

  // a's application sees its own id established and the tag-7 request, never the tag-8 one.
  bool established = false;
  int requests = 0;
  while (!(established && requests == 1)) {
    auto e = a.side.channel->get_event(2s);
    if (!e) break;
    if (e->type == CmEventType::established) {
      EXPECT_EQ(e->id, aid.get());
      established = true;
    }
    if (e->type == CmEventType::connect_request) {
      ++requests;
      ASSERT_TRUE(e->new_id);
      a.accepted.push_back(std::move(e->new_id));
    }
  }
  EXPECT_TRUE(established);
  EXPECT_EQ(requests, 1);
  auto tag8_event = [&] {
    for (auto e = b.side.channel->get_event(2s); e; e = b.side.channel->get_event(2s))
      if (e->id == from_b[1].get()) return e->type;
    return CmEventType::connect_error;  // none came
  };
  EXPECT_EQ(tag8_event(), CmEventType::established);
}

// Rule 3 applied to a reclaimed request before our own exists: when the peer's request wins,
// our attempt is bound to it at once and never dials. A raw peer with the larger GUID sends
// its request; a's application connects to the raw peer's listener only afterwards; the
// listener must see no connection, and the raw peer's request gets an MPA Reply.
TEST(PeerToPeer, AttemptThatWouldLoseToAnUnseenRequestNeverDials) {
  Node a(0x1);
  RawListener raw_listener;
  constexpr std::uint32_t kTag = 9;
  auto raw = RawSocket::connect_to(a.port);
  ASSERT_GE(raw.fd(), 0);
  ASSERT_TRUE(raw.send_all(p2p_request_bytes(wire::CmHeader{
      .node_guid = ~std::uint64_t{0}, .incarnation = 7, .listen_port = raw_listener.port(), .tag = kTag, .cmid = 1})));
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (cm_stats(*a.side.context).delivered_requests < 1 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(1ms);
  ASSERT_EQ(cm_stats(*a.side.context).delivered_requests, 1u);

  // Not routed_id(): waiting for ADDR_RESOLVED on a's channel would take the request off it.
  auto aid = std::move(CmId::create(*a.side.context, *a.side.channel).value());
  ASSERT_TRUE(aid->set_option(CmOption::p2p_tag, kTag));
  ASSERT_TRUE(aid->resolve_addr(loopback(raw_listener.port())));
  ASSERT_TRUE(aid->resolve_route());
  aid->create_qp(*a.side.pd, a.side.qp_attr()).value();
  ASSERT_TRUE(aid->connect({}));
  EXPECT_EQ(cm_stats(*a.side.context).collisions_lost, 1u);
  EXPECT_EQ(cm_stats(*a.side.context).delivered_requests, 0u);

  const auto reply = read_mpa_frame(raw, 5s);
  ASSERT_FALSE(reply.empty());
  auto decoded = wire::decode_mpa_frame(reply, wire::MpaFrameKind::reply);
  ASSERT_TRUE(decoded);
  EXPECT_FALSE(decoded->rejected);
  EXPECT_LT(raw_listener.accept_one(200ms).fd(), 0);  // a never dialled
}

// connect() first handles what the context's sockets already hold: with inline progress and
// nobody driving it, the raw peer's request still sits in a's accept queue when a connects,
// and a's attempt still takes it (rule 3 makes it the winner) instead of dialling.
TEST(PeerToPeer, ConnectFindsARequestTheProgressHasNotReadYet) {
  Side inline_side(ContextOptions{.node_guid = 0x1, .progress = ProgressMode::inline_});
  auto listener = std::move(CmId::create(*inline_side.context, *inline_side.channel).value());
  ASSERT_TRUE(listener->bind(loopback(0)));
  ASSERT_TRUE(listener->listen(16));
  const std::uint16_t port = ntohs(listener->local_address().sin_port);
  RawListener raw_listener;
  constexpr std::uint32_t kTag = 3;
  auto raw = RawSocket::connect_to(port);
  ASSERT_GE(raw.fd(), 0);
  ASSERT_TRUE(raw.send_all(p2p_request_bytes(wire::CmHeader{
      .node_guid = ~std::uint64_t{0}, .incarnation = 7, .listen_port = raw_listener.port(), .tag = kTag, .cmid = 1})));

  // Nothing drives inline progress until connect(): resolve_addr and resolve_route only queue
  // their events.
  auto id = std::move(CmId::create(*inline_side.context, *inline_side.channel).value());
  ASSERT_TRUE(id->set_option(CmOption::p2p_tag, kTag));
  ASSERT_TRUE(id->resolve_addr(loopback(raw_listener.port())));
  ASSERT_TRUE(id->resolve_route());
  id->create_qp(*inline_side.pd, inline_side.qp_attr()).value();
  EXPECT_EQ(cm_stats(*inline_side.context).delivered_requests, 0u);
  ASSERT_TRUE(id->connect({}));
  EXPECT_EQ(cm_stats(*inline_side.context).collisions_lost, 1u);
  EXPECT_LT(raw_listener.accept_one(200ms).fd(), 0);  // never dialled
  inline_side.context->progress(std::chrono::milliseconds(0));  // sends what connect() queued, if anything
  const auto reply = read_mpa_frame(raw, 2s);
  ASSERT_FALSE(reply.empty());
  auto decoded = wire::decode_mpa_frame(reply, wire::MpaFrameKind::reply);
  ASSERT_TRUE(decoded);
  EXPECT_FALSE(decoded->rejected);
}

// Rule 3, active side: the request our attempt holds proceeds (rule 4) only once the attempt
// has ended, and the application hears of that ending first. A raw peer with the smaller GUID
// takes a's attempt, sends its own colliding request, then resets a's attempt.
TEST(PeerToPeer, HeldRequestReachesTheApplicationOnlyAfterTheAttemptsEnding) {
  Node a(0x10);
  RawListener raw_listener;
  constexpr std::uint32_t kTag = 5;
  auto aid = routed_id(a, raw_listener.port(), kTag);
  ASSERT_TRUE(aid->connect({}));
  auto attempt = raw_listener.accept_one(5s);
  ASSERT_GE(attempt.fd(), 0);
  ASSERT_FALSE(read_mpa_frame(attempt, 5s).empty());  // a's request

  auto colliding = RawSocket::connect_to(a.port);
  ASSERT_GE(colliding.fd(), 0);
  ASSERT_TRUE(colliding.send_all(p2p_request_bytes(wire::CmHeader{
      .node_guid = 0x1, .incarnation = 3, .listen_port = raw_listener.port(), .tag = kTag, .cmid = 1})));
  // a holds it (a's attempt wins): nothing answers it yet.
  EXPECT_TRUE(colliding.read_for(200ms).empty());

  attempt.abort();
  std::vector<CmEventType> seen;
  for (auto e = a.side.channel->get_event(2s); e; e = a.side.channel->get_event(300ms)) {
    seen.push_back(e->type);
    if (e->type == CmEventType::connect_request) a.accepted.push_back(std::move(e->new_id));
  }
  ASSERT_FALSE(seen.empty());
  EXPECT_TRUE(seen.front() == CmEventType::connect_error || seen.front() == CmEventType::unreachable)
      << "first event: " << to_string(seen.front());
  for (std::size_t i = 0; i + 1 < seen.size(); ++i)
    EXPECT_NE(seen[i], CmEventType::connect_request) << "a CONNECT_REQUEST before the attempt's ending";
}

TEST(PeerToPeer, OptionOffKeepsTheClientServerWire) {
  // With the option off no CM header travels: the listener sees exactly the app's bytes and
  // a simultaneous connect gives two connections (the "naive" model).
  Node a(0x1), b(0x2);
  auto bid = std::move(CmId::create(*b.side.context, *b.side.channel).value());
  ASSERT_TRUE(bid->set_option(CmOption::peer_to_peer, 0));
  EXPECT_EQ(bid->option(CmOption::peer_to_peer), 0);
  ASSERT_TRUE(bid->resolve_addr(loopback(a.port)));
  expect_event(*b.side.channel, CmEventType::addr_resolved);
  ASSERT_TRUE(bid->resolve_route());
  expect_event(*b.side.channel, CmEventType::route_resolved);
  bid->create_qp(*b.side.pd, b.side.qp_attr()).value();
  ConnParam param;
  param.private_data = {1, 2, 3};
  ASSERT_TRUE(bid->connect(param));
  auto request = expect_event(*a.side.channel, CmEventType::connect_request);
  EXPECT_EQ(request.param.private_data, param.private_data);
}

TEST(PeerToPeer, ProcessWideDefaultApplesToNewIds) {
  Side s;
  EXPECT_TRUE(default_peer_to_peer());
  set_default_peer_to_peer(false);
  auto off = std::move(CmId::create(*s.context, *s.channel).value());
  set_default_peer_to_peer(true);
  auto on = std::move(CmId::create(*s.context, *s.channel).value());
  EXPECT_EQ(off->option(CmOption::peer_to_peer), 0);
  EXPECT_EQ(on->option(CmOption::peer_to_peer), 1);
}

}  // namespace
}  // namespace peercm::test

namespace peercm::test {
namespace {

TEST(PeerToPeer, OneConnectionPerKeyUnlessTheTagDiffers) {
  Node a(0x1), b(0x2);
  auto connect_to_b = [&](std::uint32_t tag) { return routed_id(a, b.port, tag); };
  auto first = connect_to_b(7);
  ASSERT_TRUE(first->connect({}));
  auto second = connect_to_b(7);
  EXPECT_EQ(second->connect({}).error(), std::errc::connection_already_in_progress) << "same key while resolving";
  auto other_tag = connect_to_b(8);
  EXPECT_TRUE(other_tag->connect({})) << "another tag is another key";
  // b sees exactly two requests (tags 7 and 8); ESTABLISHED events may come in between.
  int requests = 0;
  for (auto e = b.side.channel->get_event(2s); e; e = b.side.channel->get_event(300ms)) {
    if (e->type != CmEventType::connect_request) continue;
    ++requests;
    ASSERT_TRUE(e->new_id);
    e->new_id->create_qp(*b.side.pd, b.side.qp_attr()).value();
    ASSERT_TRUE(e->new_id->accept({}));
    b.accepted.push_back(std::move(e->new_id));
  }
  EXPECT_EQ(requests, 2);
}

// Two nodes without listeners share the key (host, port 0, tag) a server would derive from
// their requests; the node GUID keeps them apart, so the second is neither a duplicate nor
// a restart of the first (rules 2 and 6).
TEST(PeerToPeer, NonListeningClientsOnOneHostAreDistinctPeers) {
  Node server(0x10);
  Side client_a(ContextOptions{.node_guid = 0x20}), client_b(ContextOptions{.node_guid = 0x30});
  std::vector<std::unique_ptr<CmId>> ids;
  int established = 0;
  for (Side* c : {&client_a, &client_b}) {
    auto id = std::move(CmId::create(*c->context, *c->channel).value());
    ASSERT_TRUE(id->set_option(CmOption::peer_to_peer, 1));
    ASSERT_TRUE(id->set_option(CmOption::p2p_tag, 5));
    ASSERT_TRUE(id->resolve_addr(loopback(server.port)));
    expect_event(*c->channel, CmEventType::addr_resolved);
    ASSERT_TRUE(id->resolve_route());
    expect_event(*c->channel, CmEventType::route_resolved);
    id->create_qp(*c->pd, c->qp_attr()).value();
    ASSERT_TRUE(id->connect({}));
    auto request = server.side.channel->get_event(5s);
    if (request && request->type == CmEventType::established) {
      ++established;  // the previous client's connection
      request = server.side.channel->get_event(5s);
    }
    ASSERT_TRUE(request);
    ASSERT_EQ(request->type, CmEventType::connect_request);
    request->new_id->create_qp(*server.side.pd, server.side.qp_attr()).value();
    ASSERT_TRUE(request->new_id->accept({}));
    server.accepted.push_back(std::move(request->new_id));
    expect_event(*c->channel, CmEventType::established);
    ids.push_back(std::move(id));
  }
  for (auto e = server.side.channel->get_event(2s); e; e = server.side.channel->get_event(300ms)) {
    EXPECT_NE(e->type, CmEventType::disconnected) << "the second client replaced the first";
    if (e->type == CmEventType::established) ++established;
  }
  EXPECT_EQ(established, 2);
  EXPECT_EQ(cm_stats(*server.side.context).rejects_sent[static_cast<int>(RejectReason::duplicate)], 0u);
  // Both connections still carry data.
  for (std::size_t i = 0; i < 2; ++i) EXPECT_EQ(ids[i]->qp()->state(), QpState::rts);
}

}  // namespace
}  // namespace peercm::test
