// The iWARP CM agent (core/iwarp_cm) driven purely by inputs and virtual time: two or three
// agents joined by a message queue that stands in for TCP (streams open, carry bytes in order,
// close). No sockets, no clock: each test steps the queue and the time itself.
#include "core/iwarp_cm/iwarp_cm_agent.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cerrno>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <vector>

#include "wire/cm_header.hpp"

namespace peercm::core::iwarp {
namespace {

using namespace std::chrono_literals;
using EventKind = IwarpCmEvent::Kind;
using ActionKind = IwarpCmAction::Kind;

const Time kStart = Time{} + 1000s;

struct Node {
  std::unique_ptr<IwarpCmAgent> agent;
  Endpoint address;
  IwarpCmId listener = 0;
  std::vector<IwarpCmEvent> events;
  std::set<StreamId> started;
  std::uint16_t next_port = 40000;

  std::size_t count(EventKind kind, IwarpCmId id = 0) const {
    return static_cast<std::size_t>(std::count_if(events.begin(), events.end(), [&](const IwarpCmEvent& e) {
      return e.kind == kind && (id == 0 || e.id == id);
    }));
  }
  // A copy: `events` grows while a test goes on.
  std::optional<IwarpCmEvent> first(EventKind kind) const {
    auto it = std::find_if(events.begin(), events.end(), [&](const IwarpCmEvent& e) { return e.kind == kind; });
    if (it == events.end()) return std::nullopt;
    return *it;
  }
};

// TCP as the agents see it: open, bytes in order, close; FIFO over every stream.
class Wire {
 public:
  struct Message {
    enum class Kind : std::uint8_t { open, bytes, close } kind = Kind::bytes;
    std::size_t from = 0;
    StreamId stream = 0;
    Endpoint destination;
    std::vector<std::uint8_t> bytes;
  };

  std::size_t add(std::uint64_t guid, std::uint32_t address, std::uint16_t listen_port, int backlog = 16) {
    Node node;
    node.agent = std::make_unique<IwarpCmAgent>(IwarpCmAgentConfig{
        .identity = NodeIdentity{.guid = guid, .incarnation = guid * 7 + 1}, .timewait = 50ms});
    node.address = Endpoint{address, listen_port};
    if (listen_port != 0) node.listener = node.agent->listen({.port = listen_port, .backlog = backlog});
    nodes.push_back(std::move(node));
    return nodes.size() - 1;
  }

  IwarpConnectParams to(std::size_t node, bool p2p, AttemptId number, Duration timeout = 2s) const {
    return IwarpConnectParams{.destination = nodes[node].address,
                              .peer_to_peer = p2p,
                              .tag = 0,
                              .number = number,
                              .private_data = {1, 2, 3},
                              .timeout = timeout};
  }

  // Moves every node's actions to the wire and its events to its list.
  void collect() {
    for (std::size_t n = 0; n < nodes.size(); ++n) {
      Node& node = nodes[n];
      while (auto action = node.agent->poll_action()) {
        switch (action->kind) {
          case ActionKind::open_stream:
            queue.push_back({.kind = Message::Kind::open, .from = n, .stream = action->stream,
                             .destination = action->destination});
            break;
          case ActionKind::transmit:
            queue.push_back({.kind = Message::Kind::bytes, .from = n, .stream = action->stream,
                             .bytes = action->bytes});
            break;
          case ActionKind::start_stream: node.started.insert(action->stream); break;
          case ActionKind::terminate_stream:
          case ActionKind::close_stream:
            queue.push_back({.kind = Message::Kind::close, .from = n, .stream = action->stream});
            node.agent->handle_stream_closed(action->stream, now);
            break;
        }
      }
      while (auto event = node.agent->poll_event()) node.events.push_back(std::move(*event));
    }
  }

  // Delivers the oldest message.
  void step() {
    Message m = std::move(queue.front());
    queue.pop_front();
    Node& from = nodes[m.from];
    switch (m.kind) {
      case Message::Kind::open: {
        auto target = std::find_if(nodes.begin(), nodes.end(), [&](const Node& n) {
          return n.listener != 0 && n.address == m.destination;
        });
        if (target == nodes.end()) {
          from.agent->handle_stream_failed(m.stream, ECONNREFUSED, now);
          break;
        }
        const Endpoint source{from.address.address, from.next_port++};
        auto accepted = target->agent->handle_stream_accepted(target->listener, source, now);
        from.agent->handle_stream_connected(m.stream);
        if (!accepted) {
          from.agent->handle_stream_closed(m.stream, now);  // accepted by TCP, closed at once
          break;
        }
        const auto to = static_cast<std::size_t>(target - nodes.begin());
        pairs[{m.from, m.stream}] = {to, *accepted};
        pairs[{to, *accepted}] = {m.from, m.stream};
        break;
      }
      case Message::Kind::bytes: {
        auto peer = pairs.find({m.from, m.stream});
        if (peer == pairs.end()) break;
        Node& to = nodes[peer->second.first];
        if (!to.started.contains(peer->second.second)) to.agent->handle_bytes(peer->second.second, m.bytes, now);
        break;
      }
      case Message::Kind::close: {
        auto peer = pairs.find({m.from, m.stream});
        if (peer == pairs.end()) break;
        const auto other = peer->second;
        pairs.erase(peer);
        pairs.erase(other);
        nodes[other.first].agent->handle_stream_closed(other.second, now);
        break;
      }
    }
    collect();
  }

  void run() {
    collect();
    for (int i = 0; i < 10000 && !queue.empty(); ++i) step();
  }

  // Advances virtual time to `until`, firing every deadline on the way.
  void advance_to(Time until) {
    run();
    for (int i = 0; i < 10000; ++i) {
      std::optional<Time> next;
      for (Node& node : nodes) {
        auto d = node.agent->next_deadline();
        if (d && (!next || *d < *next)) next = d;
      }
      if (!next || *next > until) break;
      now = std::max(now, *next);
      for (Node& node : nodes) {
        if (auto d = node.agent->next_deadline(); d && *d <= now) node.agent->handle_timeout(now);
      }
      run();
    }
    now = until;
  }

  std::vector<Node> nodes;
  std::deque<Message> queue;
  std::map<std::pair<std::size_t, StreamId>, std::pair<std::size_t, StreamId>> pairs;
  Time now = kStart;
};

// --- client/server ---

// A server node and a client node without a listener; the client has connected and the
// server's application holds the CONNECT_REQUEST.
struct ClientServer : ::testing::Test {
  Wire wire;
  std::size_t server = wire.add(1, 0x0A000001, 7001);
  std::size_t client = wire.add(2, 0x0A000002, 0);
  IwarpCmId id = 0;
  std::optional<IwarpCmEvent> request;

  void SetUp() override {
    auto made = wire.nodes[client].agent->connect(wire.to(server, false, 1), wire.now);
    ASSERT_TRUE(made);
    id = *made;
    wire.run();
    request = wire.nodes[server].first(EventKind::connect_request);
    ASSERT_NE(request, std::nullopt);
  }
};

TEST_F(ClientServer, RequestIsDeliveredAcceptedAndEstablishedOnBothSides) {
  EXPECT_EQ(request->private_data, (std::vector<std::uint8_t>{1, 2, 3}));
  EXPECT_FALSE(request->peer_to_peer);
  EXPECT_EQ(wire.nodes[server].agent->backlog_of(wire.nodes[server].listener).pending, 1u);
  ASSERT_TRUE(wire.nodes[server].agent->accept(request->id, {.number = 9, .private_data = {7}}, wire.now));
  wire.run();
  EXPECT_EQ(wire.nodes[server].agent->backlog_of(wire.nodes[server].listener).pending, 0u);
  EXPECT_EQ(wire.nodes[server].count(EventKind::established, request->id), 1u);
  ASSERT_EQ(wire.nodes[client].count(EventKind::established, id), 1u);
  EXPECT_EQ(wire.nodes[client].first(EventKind::established)->private_data, std::vector<std::uint8_t>{7});
  EXPECT_EQ(wire.nodes[client].started.size(), 1u);
  EXPECT_EQ(wire.nodes[server].started.size(), 1u);
}

TEST_F(ClientServer, ApplicationRejectReachesTheInitiatorWithItsBytesAndFreesTheBacklog) {
  const std::vector<std::uint8_t> why{0xAB, 0xCD};
  ASSERT_TRUE(wire.nodes[server].agent->reject(request->id, why, wire.now));
  wire.run();
  const std::optional<IwarpCmEvent> rejected = wire.nodes[client].first(EventKind::rejected);
  ASSERT_NE(rejected, std::nullopt);
  EXPECT_EQ(rejected->id, id);
  EXPECT_EQ(rejected->status, ECONNREFUSED);
  EXPECT_EQ(rejected->reason, IwarpEndReason::application);
  EXPECT_EQ(rejected->private_data, why);
  EXPECT_EQ(wire.nodes[server].agent->backlog_of(wire.nodes[server].listener).pending, 0u);
  EXPECT_EQ(wire.nodes[server].agent->stats().rejects_sent_application, 1u);
  EXPECT_EQ(wire.nodes[client].agent->stats().rejects_received_application, 1u);
  // Both ids ended; only the listener is left.
  EXPECT_EQ(wire.nodes[client].agent->id_count(), 0u);
  EXPECT_EQ(wire.nodes[server].agent->id_count(), 1u);
  EXPECT_EQ(wire.nodes[server].agent->stream_count(), 0u);
}

TEST(IwarpCmAgent, NobodyListeningIsRejectedAsRefused) {
  Wire wire;
  const auto client = wire.add(2, 0x0A000002, 0);
  auto id = wire.nodes[client].agent->connect(
      IwarpConnectParams{.destination = {0x0A000009, 9}, .peer_to_peer = false, .number = 1}, wire.now);
  ASSERT_TRUE(id);
  wire.run();
  const std::optional<IwarpCmEvent> rejected = wire.nodes[client].first(EventKind::rejected);
  ASSERT_NE(rejected, std::nullopt);
  EXPECT_EQ(rejected->reason, IwarpEndReason::refused);
}

// --- B1: the backlog ---

TEST(IwarpCmAgent, BacklogHoldsAtMostItsBoundAndSilentHandshakesMakeRoomFirst) {
  IwarpCmAgent agent({.identity = {1, 2}});
  const IwarpCmId listener = agent.listen({.port = 7001, .backlog = 2});
  Time now = kStart;
  const Endpoint peer{0x0A000002, 50000};
  auto first = agent.handle_stream_accepted(listener, peer, now);
  auto second = agent.handle_stream_accepted(listener, peer, now);
  ASSERT_TRUE(first && second);
  EXPECT_EQ(agent.backlog_of(listener).pending, 2u);
  // The second one has started its Request: the first, silent, is displaced for the third.
  EXPECT_EQ(agent.handle_bytes(*second, std::vector<std::uint8_t>{'M'}, now), 1u);
  auto third = agent.handle_stream_accepted(listener, peer, now);
  ASSERT_TRUE(third);
  auto action = agent.poll_action();
  ASSERT_TRUE(action);
  EXPECT_EQ(action->kind, ActionKind::close_stream);
  EXPECT_EQ(action->stream, *first);
  EXPECT_FALSE(action->graceful);
  EXPECT_EQ(agent.backlog_of(listener).pending, 2u);
  EXPECT_EQ(agent.stats().backlog_displaced, 1u);
  // Nobody silent now, and nobody stalled past the grace period: refused.
  agent.handle_bytes(*third, std::vector<std::uint8_t>{'M'}, now);
  EXPECT_FALSE(agent.handle_stream_accepted(listener, peer, now + 50ms));
  EXPECT_EQ(agent.stats().backlog_refused, 1u);
  EXPECT_EQ(agent.backlog_of(listener).pending, 2u);
  // Past the grace period, the oldest incomplete Request makes room.
  auto fourth = agent.handle_stream_accepted(listener, peer, now + 150ms);
  ASSERT_TRUE(fourth);
  action = agent.poll_action();
  ASSERT_TRUE(action);
  EXPECT_EQ(action->stream, *second);
  EXPECT_LE(agent.backlog_of(listener).pending, 2u);
  EXPECT_EQ(agent.backlog_of(listener).handshaking, 2u);
}

TEST(IwarpCmAgent, UndecidedClientServerRequestsCountInTheBacklogUntilAccepted) {
  Wire wire;
  const auto server = wire.add(1, 0x0A000001, 7001, /*backlog=*/1);
  const auto client = wire.add(2, 0x0A000002, 0);
  auto first = wire.nodes[client].agent->connect(wire.to(server, false, 1), wire.now);
  wire.run();
  ASSERT_EQ(wire.nodes[server].count(EventKind::connect_request), 1u);
  // The backlog is full with an undecided request, which is no handshake to displace.
  auto second = wire.nodes[client].agent->connect(wire.to(server, false, 2), wire.now);
  ASSERT_TRUE(first && second);
  wire.run();
  EXPECT_EQ(wire.nodes[server].count(EventKind::connect_request), 1u);
  EXPECT_EQ(wire.nodes[server].agent->stats().backlog_refused, 1u);
  EXPECT_EQ(wire.nodes[client].count(EventKind::connect_error, *second), 1u);
}

// B1: the CM header must not buy a request room. A delivered p2p request the application has
// not decided holds its place like a client/server one (before, it left the count as soon as it
// was parsed, and a flood of them grew without bound).
TEST(IwarpCmAgent, UndecidedP2pRequestsCountInTheBacklogUntilAccepted) {
  Wire wire;
  const auto server = wire.add(1, 0x0A000001, 7001, /*backlog=*/1);
  const auto first_peer = wire.add(2, 0x0A000002, 7002);
  const auto second_peer = wire.add(3, 0x0A000003, 7003);
  auto first = wire.nodes[first_peer].agent->connect(wire.to(server, true, 1), wire.now);
  ASSERT_TRUE(first);
  wire.run();
  ASSERT_EQ(wire.nodes[server].count(EventKind::connect_request), 1u);
  EXPECT_EQ(wire.nodes[server].agent->backlog_of(wire.nodes[server].listener).pending, 1u);
  auto second = wire.nodes[second_peer].agent->connect(wire.to(server, true, 1), wire.now);
  ASSERT_TRUE(second);
  wire.run();
  EXPECT_EQ(wire.nodes[server].count(EventKind::connect_request), 1u) << "a p2p request got past a full backlog";
  EXPECT_EQ(wire.nodes[server].agent->stats().backlog_refused, 1u);
  EXPECT_EQ(wire.nodes[second_peer].count(EventKind::connect_error, *second), 1u);
  // Accepting the first makes room: the second peer's retry is delivered.
  const std::optional<IwarpCmEvent> request = wire.nodes[server].first(EventKind::connect_request);
  ASSERT_TRUE(request);
  ASSERT_TRUE(wire.nodes[server].agent->accept(request->id, {.number = 9}, wire.now));
  wire.run();
  EXPECT_EQ(wire.nodes[first_peer].count(EventKind::established, *first), 1u);
  EXPECT_EQ(wire.nodes[server].agent->backlog_of(wire.nodes[server].listener).pending, 0u);
  auto retry = wire.nodes[second_peer].agent->connect(wire.to(server, true, 2), wire.now);
  ASSERT_TRUE(retry);
  wire.run();
  EXPECT_EQ(wire.nodes[server].count(EventKind::connect_request), 2u);
}

// B1: a request bound to the application's own attempt (R3, passive peer) is held by the
// application: it leaves the backlog, and a full backlog never stops a collision resolving.
TEST(IwarpCmAgent, ACollisionResolvesThroughAFullBacklog) {
  Wire wire;
  const auto low = wire.add(1, 0x0A000001, 7001, /*backlog=*/1);
  const auto high = wire.add(2, 0x0A000002, 7002, /*backlog=*/1);
  const auto filler = wire.add(3, 0x0A000003, 0);
  // A client/server request the low node's application never decides fills its backlog.
  ASSERT_TRUE(wire.nodes[filler].agent->connect(wire.to(low, false, 1), wire.now));
  wire.run();
  ASSERT_EQ(wire.nodes[low].agent->backlog_of(wire.nodes[low].listener).pending, 1u);
  // Both connect to each other at once; the low node loses rule 3 and must take the high
  // node's request on behalf of its attempt, but its backlog has no room for a new stream.
  auto from_low = wire.nodes[low].agent->connect(wire.to(high, true, 1), wire.now);
  auto from_high = wire.nodes[high].agent->connect(wire.to(low, true, 1), wire.now);
  ASSERT_TRUE(from_low && from_high);
  wire.run();
  // The high node's stream was refused at the low node: its attempt ends, and the low node's
  // own request (which the high node holds, then rejects with a CM collision, R3) is not the
  // connection either. What must hold: at most one connection, and every attempt ends.
  wire.advance_to(wire.now + 3s);
  const std::size_t connections = wire.nodes[low].count(EventKind::established, *from_low) +
                                  wire.nodes[high].count(EventKind::established, *from_high);
  EXPECT_LE(connections, 1u);
  EXPECT_EQ(wire.nodes[low].count(EventKind::established, *from_low) +
                wire.nodes[low].count(EventKind::connect_error, *from_low) +
                wire.nodes[low].count(EventKind::rejected, *from_low),
            1u);
  EXPECT_EQ(wire.nodes[high].count(EventKind::established, *from_high) +
                wire.nodes[high].count(EventKind::connect_error, *from_high) +
                wire.nodes[high].count(EventKind::rejected, *from_high),
            1u);
}

// B1: one source holds at most its share (the backlog less a quarter); others still get in.
TEST(IwarpCmAgent, OneSourceHoldsAtMostItsShareOfTheBacklog) {
  IwarpCmAgent agent({.identity = {1, 2}});
  const IwarpCmId listener = agent.listen({.port = 7001, .backlog = 4});
  const Time now = kStart;
  const Endpoint flooder{0x0A000002, 50000};
  std::vector<StreamId> held;
  for (int i = 0; i < 3; ++i) {
    auto stream = agent.handle_stream_accepted(listener, flooder, now);
    ASSERT_TRUE(stream);
    // Each has started its Request: none is silent, none past the grace period.
    agent.handle_bytes(*stream, std::vector<std::uint8_t>{'M'}, now);
    held.push_back(*stream);
  }
  EXPECT_FALSE(agent.handle_stream_accepted(listener, flooder, now)) << "one source took the whole backlog";
  EXPECT_EQ(agent.stats().backlog_refused, 1u);
  // Another address finds the quarter kept for it.
  EXPECT_TRUE(agent.handle_stream_accepted(listener, Endpoint{0x0A000003, 50000}, now));
  EXPECT_EQ(agent.backlog_of(listener).pending, 4u);
  // Past the grace period, the flooder's newcomer displaces only its own stalled handshake.
  ASSERT_TRUE(agent.handle_stream_accepted(listener, flooder, now + 150ms));
  auto action = agent.poll_action();
  ASSERT_TRUE(action);
  EXPECT_EQ(action->kind, ActionKind::close_stream);
  EXPECT_EQ(action->stream, held.front());
  EXPECT_EQ(agent.backlog_of(listener).pending, 4u);
}

// --- handshake timeout ---

TEST(IwarpCmAgent, HandshakeWithoutAReplyEndsWithConnectErrorAtTheTimeout) {
  Wire wire;
  const auto server = wire.add(1, 0x0A000001, 7001);
  const auto client = wire.add(2, 0x0A000002, 0);
  auto id = wire.nodes[client].agent->connect(wire.to(server, false, 1, 500ms), wire.now);
  ASSERT_TRUE(id);
  wire.run();
  ASSERT_EQ(wire.nodes[server].count(EventKind::connect_request), 1u);  // and the server never answers
  wire.advance_to(kStart + 499ms);
  EXPECT_EQ(wire.nodes[client].count(EventKind::connect_error), 0u);
  wire.advance_to(kStart + 501ms);
  const std::optional<IwarpCmEvent> error = wire.nodes[client].first(EventKind::connect_error);
  ASSERT_NE(error, std::nullopt);
  EXPECT_EQ(error->id, *id);
  EXPECT_EQ(error->status, ETIMEDOUT);
  EXPECT_EQ(error->reason, IwarpEndReason::timeout);
}

TEST(IwarpCmAgent, SilentPeerIsClosedAtTheListenersHandshakeTimeout) {
  IwarpCmAgent agent({.identity = {1, 2}});
  const IwarpCmId listener = agent.listen({.port = 7001, .backlog = 4, .handshake_timeout = 1s});
  auto stream = agent.handle_stream_accepted(listener, {0x0A000002, 50000}, kStart);
  ASSERT_TRUE(stream);
  ASSERT_EQ(agent.next_deadline(), kStart + 1s);
  agent.handle_timeout(kStart + 1s);
  auto action = agent.poll_action();
  ASSERT_TRUE(action);
  EXPECT_EQ(action->kind, ActionKind::close_stream);
  EXPECT_EQ(action->stream, *stream);
  EXPECT_EQ(agent.backlog_of(listener).pending, 0u);
  EXPECT_FALSE(agent.poll_event());  // nothing reaches the application
  EXPECT_FALSE(agent.next_deadline());
}

TEST(IwarpCmAgent, UnansweredSynIsUnreachableAtTheTimeout) {
  IwarpCmAgent agent({.identity = {1, 2}});
  auto id = agent.connect({.destination = {0x0A000009, 9}, .peer_to_peer = false, .number = 1, .timeout = 1s}, kStart);
  ASSERT_TRUE(id);
  agent.handle_timeout(kStart + 1s);
  std::optional<IwarpCmEvent> event;
  while (auto e = agent.poll_event()) event = e;
  ASSERT_TRUE(event);
  EXPECT_EQ(event->kind, EventKind::unreachable);
  EXPECT_EQ(event->status, ETIMEDOUT);
}

// --- p2p (docs/p2p.md, Rules) ---

// Two listening nodes; a's node GUID is the larger (LargerA) or the smaller (SmallerA).
struct LargerA : ::testing::Test {
  Wire wire;
  std::size_t a = wire.add(0x20, 0x0A000001, 7001);
  std::size_t b = wire.add(0x10, 0x0A000002, 7002);
};
struct SmallerA : ::testing::Test {
  Wire wire;
  std::size_t a = wire.add(0x10, 0x0A000001, 7001);
  std::size_t b = wire.add(0x20, 0x0A000002, 7002);
};

// R3: simultaneous connects become exactly one connection, ESTABLISHED on each attempt's id.
TEST_F(LargerA, SimultaneousP2pConnectsMakeOneConnection) {
  auto at_a = wire.nodes[a].agent->connect(wire.to(b, true, 5), wire.now);
  auto at_b = wire.nodes[b].agent->connect(wire.to(a, true, 5), wire.now);
  ASSERT_TRUE(at_a && at_b);
  wire.run();
  EXPECT_EQ(wire.nodes[a].count(EventKind::established, *at_a), 1u);
  EXPECT_EQ(wire.nodes[b].count(EventKind::established, *at_b), 1u);
  EXPECT_EQ(wire.nodes[a].count(EventKind::connect_request), 0u);
  EXPECT_EQ(wire.nodes[b].count(EventKind::connect_request), 0u);
  EXPECT_EQ(wire.nodes[a].events.size(), 1u);
  EXPECT_EQ(wire.nodes[b].events.size(), 1u);
  // One stream, open at both ends: the larger node's request won.
  EXPECT_EQ(wire.pairs.size(), 2u);
  EXPECT_EQ(wire.nodes[b].agent->stats().collisions_lost, 1u);
  EXPECT_TRUE(wire.pairs.contains({a, wire.nodes[a].agent->stream_of(*at_a)}));
  EXPECT_TRUE(wire.pairs.contains({b, wire.nodes[b].agent->stream_of(*at_b)}));
  // R5: the key is connected.
  EXPECT_EQ(wire.nodes[a].agent->connect(wire.to(b, true, 6), wire.now).error(), std::errc::already_connected);
}

// R3, active peer: the losing request is parked (held) while our attempt is pending, reaches
// nobody, and goes on as a CONNECT_REQUEST once the attempt ends otherwise — after the attempt's
// own ending event.
TEST_F(LargerA, ParkedRequestReachesTheApplicationOnlyAfterTheAttemptEnds) {
  auto at_a = wire.nodes[a].agent->connect(wire.to(b, true, 5, 1s), wire.now);
  ASSERT_TRUE(at_a);
  wire.collect();
  wire.queue.clear();  // a's SYN and Request are lost
  auto at_b = wire.nodes[b].agent->connect(wire.to(a, true, 3, 5s), wire.now);
  ASSERT_TRUE(at_b);
  wire.run();
  // a (the larger node) holds b's request: no event, no answer.
  EXPECT_TRUE(wire.nodes[a].events.empty());
  EXPECT_TRUE(wire.nodes[b].events.empty());
  EXPECT_EQ(wire.nodes[a].agent->resolver().tracked_links(), 2u);
  wire.advance_to(kStart + 1s + 1ms);
  ASSERT_EQ(wire.nodes[a].events.size(), 2u);
  EXPECT_EQ(wire.nodes[a].events[0].kind, EventKind::unreachable);
  EXPECT_EQ(wire.nodes[a].events[0].id, *at_a);
  ASSERT_EQ(wire.nodes[a].events[1].kind, EventKind::connect_request);
  EXPECT_TRUE(wire.nodes[a].events[1].peer_to_peer);
  ASSERT_TRUE(wire.nodes[a].agent->accept(wire.nodes[a].events[1].id, {.number = 8}, wire.now));
  wire.run();
  EXPECT_EQ(wire.nodes[b].count(EventKind::established, *at_b), 1u);
  EXPECT_EQ(wire.nodes[a].agent->stats().delivered_requests, 1u);
}

// The same when the attempt's handshake fails (the peer reset its stream): CONNECT_ERROR first,
// then the held request as a CONNECT_REQUEST.
TEST_F(LargerA, ParkedRequestGoesOnWhenTheAttemptsHandshakeFails) {
  auto at_a = wire.nodes[a].agent->connect(wire.to(b, true, 5), wire.now);
  ASSERT_TRUE(at_a);
  wire.collect();
  ASSERT_EQ(wire.queue.size(), 2u);
  wire.step();          // a's stream reaches b's listener
  wire.queue.clear();   // its Request does not
  auto at_b = wire.nodes[b].agent->connect(wire.to(a, true, 3), wire.now);
  ASSERT_TRUE(at_b);
  wire.run();
  EXPECT_TRUE(wire.nodes[a].events.empty());  // b's request is held
  wire.nodes[a].agent->handle_stream_closed(wire.nodes[a].agent->stream_of(*at_a), wire.now);
  wire.run();
  ASSERT_GE(wire.nodes[a].events.size(), 2u);
  EXPECT_EQ(wire.nodes[a].events[0].kind, EventKind::connect_error);
  EXPECT_EQ(wire.nodes[a].events[0].id, *at_a);
  EXPECT_EQ(wire.nodes[a].events[1].kind, EventKind::connect_request);
}

// R3 and R6 on the wire: the CM reject is the CM's, never the application's.
TEST_F(LargerA, CollisionRejectIsNotReportedToTheApplication) {
  auto at_a = wire.nodes[a].agent->connect(wire.to(b, true, 5), wire.now);
  auto at_b = wire.nodes[b].agent->connect(wire.to(a, true, 5), wire.now);
  ASSERT_TRUE(at_a && at_b);
  wire.collect();
  // b's Request reaches a first (a holds it), then a's reaches b (b binds its attempt to it).
  std::stable_partition(wire.queue.begin(), wire.queue.end(), [&](const Wire::Message& m) { return m.from == b; });
  wire.run();
  EXPECT_EQ(wire.nodes[a].count(EventKind::established), 1u);
  EXPECT_EQ(wire.nodes[b].count(EventKind::established), 1u);
  EXPECT_EQ(wire.nodes[b].count(EventKind::rejected), 0u);
  EXPECT_EQ(wire.nodes[a].agent->resolver().tracked_links(), 1u);
  EXPECT_EQ(wire.nodes[b].agent->resolver().tracked_links(), 1u);
}

// R5 refined: a CONNECT_REQUEST the application has not fetched is taken back; when its sender
// wins R3, the attempt is bound to it at once and nothing is dialled.
TEST_F(SmallerA, UnseenRequestThatWinsBindsTheAttemptWithoutDialling) {
  ASSERT_TRUE(wire.nodes[b].agent->connect(wire.to(a, true, 5), wire.now));
  // Deliver b's open and Request, not a's answer.
  wire.collect();
  while (!wire.queue.empty() && wire.queue.front().from == b) wire.step();
  const std::optional<IwarpCmEvent> request = wire.nodes[a].first(EventKind::connect_request);
  ASSERT_NE(request, std::nullopt);
  const IwarpCmId unseen = request->id;
  IwarpCmId asked = 0;
  auto at_a = wire.nodes[a].agent->connect(wire.to(b, true, 3), wire.now, [&](IwarpCmId id) {
    asked = id;
    return true;
  });
  ASSERT_TRUE(at_a);
  EXPECT_EQ(asked, unseen);
  wire.collect();
  EXPECT_TRUE(std::none_of(wire.queue.begin(), wire.queue.end(), [&](const Wire::Message& m) {
    return m.from == a && m.kind == Wire::Message::Kind::open;
  }));
  wire.run();
  EXPECT_EQ(wire.nodes[a].count(EventKind::established, *at_a), 1u);
  EXPECT_EQ(wire.nodes[b].count(EventKind::established), 1u);
  EXPECT_EQ(wire.nodes[a].agent->stats().delivered_requests, 0u);
  EXPECT_EQ(wire.nodes[a].agent->stats().collisions_lost, 1u);
}

TEST_F(LargerA, UnseenRequestThatLosesIsHeldAndTheAttemptDials) {
  auto at_b = wire.nodes[b].agent->connect(wire.to(a, true, 5), wire.now);
  ASSERT_TRUE(at_b);
  wire.collect();
  while (!wire.queue.empty() && wire.queue.front().from == b) wire.step();
  ASSERT_NE(wire.nodes[a].first(EventKind::connect_request), std::nullopt);
  auto at_a = wire.nodes[a].agent->connect(wire.to(b, true, 3), wire.now, [](IwarpCmId) { return true; });
  ASSERT_TRUE(at_a);
  wire.run();
  EXPECT_EQ(wire.nodes[a].count(EventKind::established, *at_a), 1u);
  EXPECT_EQ(wire.nodes[b].count(EventKind::established, *at_b), 1u);
  // b's request lost: b bound its attempt to a's request and dropped its own stream.
  EXPECT_EQ(wire.nodes[a].agent->stats().delivered_requests, 0u);
  EXPECT_EQ(wire.nodes[b].agent->stats().collisions_lost, 1u);
  EXPECT_EQ(wire.nodes[a].events.size(), 2u);  // the taken-back CONNECT_REQUEST, then ESTABLISHED
  EXPECT_EQ(wire.pairs.size(), 2u);
}

TEST_F(SmallerA, FetchedRequestMakesConnectEalready) {
  ASSERT_TRUE(wire.nodes[b].agent->connect(wire.to(a, true, 5), wire.now));
  wire.run();
  ASSERT_NE(wire.nodes[a].first(EventKind::connect_request), std::nullopt);
  auto at_a = wire.nodes[a].agent->connect(wire.to(b, true, 3), wire.now, [](IwarpCmId) { return false; });
  ASSERT_FALSE(at_a);
  EXPECT_EQ(at_a.error(), std::errc::connection_already_in_progress);
  auto plain = wire.nodes[a].agent->connect(wire.to(b, true, 4), wire.now);
  ASSERT_FALSE(plain);
  EXPECT_EQ(plain.error(), std::errc::connection_already_in_progress);
}

// Disconnect: DISCONNECTED on both sides, then TIMEWAIT_EXIT; the resolver forgets the link.
TEST_F(LargerA, DisconnectEndsInTimewaitExitAndLeavesNothingTracked) {
  auto at_a = wire.nodes[a].agent->connect(wire.to(b, true, 5), wire.now);
  ASSERT_TRUE(at_a);
  wire.run();
  const std::optional<IwarpCmEvent> request = wire.nodes[b].first(EventKind::connect_request);
  ASSERT_NE(request, std::nullopt);
  const IwarpCmId at_b = request->id;
  ASSERT_TRUE(wire.nodes[b].agent->accept(at_b, {.number = 2}, wire.now));
  wire.run();
  ASSERT_EQ(wire.nodes[a].count(EventKind::established), 1u);
  ASSERT_TRUE(wire.nodes[a].agent->disconnect(*at_a, wire.now));
  wire.run();
  EXPECT_EQ(wire.nodes[a].count(EventKind::disconnected, *at_a), 1u);
  EXPECT_EQ(wire.nodes[b].count(EventKind::disconnected, at_b), 1u);
  wire.advance_to(wire.now + 100ms);
  EXPECT_EQ(wire.nodes[a].count(EventKind::timewait_exit, *at_a), 1u);
  EXPECT_EQ(wire.nodes[b].count(EventKind::timewait_exit, at_b), 1u);
  for (std::size_t n : {a, b}) {
    wire.nodes[n].agent->destroy(n == a ? *at_a : at_b, wire.now);
    EXPECT_EQ(wire.nodes[n].agent->resolver().tracked_links(), 0u);
    EXPECT_EQ(wire.nodes[n].agent->resolver().tracked_attempts(), 0u);
    EXPECT_EQ(wire.nodes[n].agent->stream_count(), 0u);
    EXPECT_FALSE(wire.nodes[n].agent->next_deadline());
  }
}

}  // namespace
}  // namespace peercm::core::iwarp
