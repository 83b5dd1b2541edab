// Peer-to-peer over the IB CM (docs/p2p.md, roce-ibcm-wire.md §5): REQ/REQ collisions resolved
// by (CA GUID, QPN) through the P2pResolver, the silent drop and the passive takeover, rule 5,
// restarts (new incarnation) and late duplicates (rule 6).
#include <gtest/gtest.h>

#include <ostream>

#include "core/ibcm/ibcm_p2p_header.hpp"
#include "ibcm_fabric.hpp"
#include "wire/byte_io.hpp"

namespace peercm::core::ibcm::test {
namespace {

constexpr int kA = 0;
constexpr int kB = 1;

struct Order {
  const char* name;
  std::uint64_t guid_a, guid_b;
  std::uint32_t qpn_a, qpn_b;
  bool a_active;  // (guid, qpn) of A is the larger
};

void PrintTo(const Order& order, std::ostream* out) { *out << order.name; }

class Collision : public ::testing::TestWithParam<Order> {};

TEST_P(Collision, SimultaneousReqsEndInExactlyOneConnection) {
  const Order o = GetParam();
  Fabric net;
  net.add(o.guid_a, 0xA1);
  net.add(o.guid_b, 0xB1);
  net.agent(kA).listen(7471);
  net.agent(kB).listen(7471);
  const std::vector<std::uint8_t> data_a{'a'};
  auto pa = connect_params(kB, o.qpn_a, true);
  pa.private_data = data_a;
  auto ida = net.agent(kA).connect(pa, net.now);
  auto idb = net.agent(kB).connect(connect_params(kA, o.qpn_b, true), net.now);
  ASSERT_TRUE(ida.has_value());
  ASSERT_TRUE(idb.has_value());
  net.run_for(100ms);

  const IbCmAgentEvent* ea = net.find(kA, EventKind::established, *ida);
  const IbCmAgentEvent* eb = net.find(kB, EventKind::established, *idb);
  ASSERT_NE(ea, nullptr);
  ASSERT_NE(eb, nullptr);
  // One connection: each side's peer is the other's connection.
  EXPECT_EQ(ea->peer.comm_id, eb->local_comm_id);
  EXPECT_EQ(eb->peer.comm_id, ea->local_comm_id);
  EXPECT_EQ(ea->peer.qpn, o.qpn_b);
  EXPECT_EQ(eb->peer.qpn, o.qpn_a);
  const int active = o.a_active ? kA : kB;
  const int passive = o.a_active ? kB : kA;
  // No REQUEST, no REJECTED. The passive peer's attempt answered the winner's REQ, so it
  // heard that its REP left, naming the winner's QP (its QP receives from then on).
  EXPECT_EQ(net.events[static_cast<std::size_t>(active)].size(), 1u);
  EXPECT_EQ(net.events[static_cast<std::size_t>(passive)].size(), 2u);
  const IbCmAgentEvent* reply = net.find(passive, EventKind::reply_sent, passive == kA ? *ida : *idb);
  ASSERT_NE(reply, nullptr);
  EXPECT_EQ(reply->peer.qpn, passive == kA ? o.qpn_b : o.qpn_a);
  EXPECT_EQ(net.sent[w::CmAttribute::rep], 1);  // the passive peer answered the winner's REQ
  EXPECT_EQ(net.sent[w::CmAttribute::rej], 0);  // §5: the losing REQ is dropped silently
  EXPECT_EQ(net.sent[w::CmAttribute::rtu], 1);
  EXPECT_EQ(net.agent(active).stats().p2p_dropped, 1u);
  EXPECT_EQ(net.agent(passive).stats().p2p_bound, 1u);
  EXPECT_EQ(net.agent(passive).resolver().stats().collisions_lost, 1u);
  EXPECT_EQ(net.agent(active).resolver().stats().collisions_won, 1u);
  // The passive peer kept its comm ID: the connection is the one its own REQ named (§5).
  const IbCmAgentEvent* ep = passive == kA ? ea : eb;
  EXPECT_EQ(ep->local_comm_id, 0x1000u * static_cast<std::uint32_t>(passive + 1));
  // The active side got the passive side's REP private data stripped of the p2p header, and
  // the passive side answered on behalf of its attempt with the attempt's QPN.
  EXPECT_EQ(net.agent(kA).state_of(*ida), IbCmState::established);
  EXPECT_EQ(net.agent(kB).state_of(*idb), IbCmState::established);

  ASSERT_TRUE(net.agent(kA).disconnect(*ida, net.now));
  net.run_for(1s);
  EXPECT_EQ(net.count(kA, EventKind::timewait_exit), 1);
  EXPECT_EQ(net.count(kB, EventKind::timewait_exit), 1);
  net.expect_quiet(kA);
  net.expect_quiet(kB);
}

INSTANTIATE_TEST_SUITE_P(
    BothOrders, Collision,
    ::testing::Values(Order{"GuidAGreater", 0x20, 0x10, 0x100, 0x200, true},
                      Order{"GuidBGreater", 0x10, 0x20, 0x200, 0x100, false},
                      Order{"SameGuidQpnAGreater", 0x30, 0x30, 0x300, 0x100, true},
                      Order{"SameGuidQpnBGreater", 0x30, 0x30, 0x100, 0x300, false}),
    [](const auto& param_info) { return std::string(param_info.param.name); });

struct P2p : ::testing::Test {
  Fabric net;
  void SetUp() override {
    net.add(0x10, 0xA1);
    net.add(0x20, 0xB1);
    net.agent(kA).listen(7471);
    net.agent(kB).listen(7471);
  }
  void accept_requests(int node, std::uint32_t qpn) {
    for (const auto& e : net.events[static_cast<std::size_t>(node)]) {
      if (e.kind == EventKind::connect_request && net.agent(node).state_of(e.id) == IbCmState::req_rcvd) {
        EXPECT_TRUE(net.agent(node).accept(e.id, accept_params(qpn), net.now));
      }
    }
  }
};

// R5's unseen-request rule (docs/p2p.md, Rules), the same as over iWARP: a CONNECT_REQUEST the
// application has not fetched is taken back and meets the attempt under R3. Here the REQ's
// sender (B, GUID 0x20) is the larger: A's attempt is bound to it and A sends no REQ of its own.
TEST_F(P2p, UnseenRequestOfTheLargerNodeBindsTheAttemptWithoutAReq) {
  auto idb = net.agent(kB).connect(connect_params(kA, 0x200, true, 3), net.now);
  ASSERT_TRUE(idb.has_value());
  net.run_for(2ms);
  const IbCmAgentEvent* request = net.find(kA, EventKind::connect_request);
  ASSERT_NE(request, nullptr);
  const IbCmId unseen = request->id;
  const int reqs_before = net.sent[w::CmAttribute::req];
  IbCmId asked = 0;
  auto ida = net.agent(kA).connect(connect_params(kB, 0x100, true, 3), net.now, [&](IbCmId id) {
    asked = id;
    return true;
  });
  ASSERT_TRUE(ida.has_value());
  EXPECT_EQ(asked, unseen);
  net.run_for(100ms);
  EXPECT_EQ(net.sent[w::CmAttribute::req], reqs_before);
  ASSERT_NE(net.find(kA, EventKind::established, *ida), nullptr);
  ASSERT_NE(net.find(kB, EventKind::established, *idb), nullptr);
  EXPECT_EQ(net.agent(kA).resolver().stats().delivered, 0u);
}

// The REQ's sender (A) is the smaller: B's attempt wins R3, its REQ goes out and A's taken-back
// REQ is held; A binds its own attempt to B's REQ, and the held REQ is dropped without a REJ.
TEST_F(P2p, UnseenRequestOfTheSmallerNodeIsHeldAndTheAttemptSendsItsReq) {
  auto ida = net.agent(kA).connect(connect_params(kB, 0x100, true, 3), net.now);
  ASSERT_TRUE(ida.has_value());
  net.run_for(2ms);
  ASSERT_NE(net.find(kB, EventKind::connect_request), nullptr);
  auto idb = net.agent(kB).connect(connect_params(kA, 0x200, true, 3), net.now, [](IbCmId) { return true; });
  ASSERT_TRUE(idb.has_value());
  net.run_for(100ms);
  ASSERT_NE(net.find(kA, EventKind::established, *ida), nullptr);
  ASSERT_NE(net.find(kB, EventKind::established, *idb), nullptr);
  EXPECT_EQ(net.sent[w::CmAttribute::rej], 0);
  EXPECT_EQ(net.agent(kA).stats().p2p_bound, 1u);
}

// Rule 4 and 5: a REQ with no local attempt is a CONNECT_REQUEST; connecting to its key then
// fails with EALREADY; once it is established, with EISCONN.
TEST_F(P2p, RequestWithoutAttemptIsDeliveredAndRuleFiveHolds) {
  auto ida = net.agent(kA).connect(connect_params(kB, 0x100, true, 3), net.now);
  ASSERT_TRUE(ida.has_value());
  net.run_for(2ms);
  const IbCmAgentEvent* request = net.find(kB, EventKind::connect_request);
  ASSERT_NE(request, nullptr);
  EXPECT_TRUE(request->peer_to_peer);
  EXPECT_EQ(request->tag, 3u);
  auto again = net.agent(kB).connect(connect_params(kA, 0x200, true, 3), net.now);
  ASSERT_FALSE(again.has_value());
  EXPECT_EQ(again.error(), std::errc::connection_already_in_progress);
  accept_requests(kB, 0x200);
  net.run_for(5ms);
  ASSERT_NE(net.find(kA, EventKind::established, *ida), nullptr);
  auto connected = net.agent(kB).connect(connect_params(kA, 0x201, true, 3), net.now);
  ASSERT_FALSE(connected.has_value());
  EXPECT_EQ(connected.error(), std::errc::already_connected);
  auto other_tag = net.agent(kB).connect(connect_params(kA, 0x202, true, 4), net.now);
  EXPECT_TRUE(other_tag.has_value());  // one connection per p2p key, and the tag is in the key
}

// Rule 5 counts live attempts: destroying a pending attempt or an undecided request frees
// the key at once, and nothing of either is left behind.
TEST_F(P2p, DestroyedAttemptOrRequestFreesTheKey) {
  auto ida = net.agent(kA).connect(connect_params(kB, 0x100, true, 3), net.now);
  ASSERT_TRUE(ida.has_value());
  net.run_for(2ms);
  const IbCmAgentEvent* request = net.find(kB, EventKind::connect_request);
  ASSERT_NE(request, nullptr);
  net.agent(kB).destroy(request->id, net.now);
  auto from_b = net.agent(kB).connect(connect_params(kA, 0x200, true, 3), net.now);
  ASSERT_TRUE(from_b.has_value());
  net.agent(kA).destroy(*ida, net.now);
  auto from_a = net.agent(kA).connect(connect_params(kB, 0x101, true, 3), net.now);
  ASSERT_TRUE(from_a.has_value());
  net.run_for(20ms);
  accept_requests(kA, 0x102);
  accept_requests(kB, 0x201);
  net.run_for(20ms);
  const int established_a = net.count(kA, EventKind::established);
  const int established_b = net.count(kB, EventKind::established);
  EXPECT_EQ(established_a, 1);
  EXPECT_EQ(established_b, 1);
  net.agent(kA).destroy(*from_a, net.now);
  net.agent(kB).destroy(*from_b, net.now);
  net.run_for(1s);
  net.expect_quiet(kA);
  net.expect_quiet(kB);
}

// Rule 6: A restarts (new incarnation, its QPNs start over) and connects again: B tears the old
// connection down (DISCONNECTED) and the new REQ proceeds.
TEST_F(P2p, NewIncarnationReplacesTheOldConnection) {
  auto ida = net.agent(kA).connect(connect_params(kB, 0x100, true), net.now);
  net.run_for(2ms);
  accept_requests(kB, 0x200);
  net.run_for(5ms);
  ASSERT_NE(net.find(kA, EventKind::established, *ida), nullptr);
  const IbCmAgentEvent* old = net.find(kB, EventKind::established);
  ASSERT_NE(old, nullptr);
  const IbCmId old_id = old->id;

  net.restart(kA, 0xA2);
  net.agent(kA).listen(7471);
  net.events[kA].clear();
  auto again = net.agent(kA).connect(connect_params(kB, 0x050, true), net.now);
  ASSERT_TRUE(again.has_value());
  net.run_for(2ms);
  accept_requests(kB, 0x201);
  net.run_for(20ms);
  EXPECT_NE(net.find(kB, EventKind::disconnected, old_id), nullptr);
  EXPECT_NE(net.find(kA, EventKind::established, *again), nullptr);
  EXPECT_EQ(net.agent(kB).resolver().stats().replaced_restarted, 1u);
  EXPECT_EQ(net.count(kB, EventKind::established), 2);
}

// R5b (docs/p2p.md, Rules): B is connected to A; A restarts. B's connect to A, made before A's
// new REQ arrives, asks for a check of the connection instead of failing with EISCONN, sends no
// REQ, and is bound to A's REQ when it comes: DISCONNECTED on the old id first, then ESTABLISHED
// on the connecting id; A's attempt ends ESTABLISHED too, and A's REQ is never a CONNECT_REQUEST.
TEST_F(P2p, ConnectWaitingOnACheckIsBoundToTheRestartedPeersRequest) {
  auto ida = net.agent(kA).connect(connect_params(kB, 0x100, true), net.now);
  net.run_for(2ms);
  accept_requests(kB, 0x200);
  net.run_for(5ms);
  ASSERT_NE(net.find(kA, EventKind::established, *ida), nullptr);
  const IbCmAgentEvent* old = net.find(kB, EventKind::established);
  ASSERT_NE(old, nullptr);
  const IbCmId old_id = old->id;

  net.restart(kA, 0xA2);
  net.agent(kA).listen(7471);
  net.events[kA].clear();
  net.events[kB].clear();
  const int reqs_before = net.sent[w::CmAttribute::req];
  std::vector<IbCmId> checked;
  auto waiting = net.agent(kB).connect(connect_params(kA, 0x201, true), net.now, {}, [&](IbCmId id) {
    checked.push_back(id);
    return true;
  });
  ASSERT_TRUE(waiting.has_value());
  EXPECT_EQ(checked, std::vector<IbCmId>{old_id});
  net.run_for(5ms);
  EXPECT_EQ(net.sent[w::CmAttribute::req], reqs_before);  // it waits; nothing dialled
  EXPECT_TRUE(net.events[kB].empty());
  // A second connect meanwhile: an attempt is pending.
  auto second = net.agent(kB).connect(connect_params(kA, 0x202, true), net.now, {}, [](IbCmId) { return true; });
  ASSERT_FALSE(second.has_value());
  EXPECT_EQ(second.error(), std::errc::connection_already_in_progress);

  auto again = net.agent(kA).connect(connect_params(kB, 0x050, true), net.now);
  ASSERT_TRUE(again.has_value());
  net.run_for(20ms);
  ASSERT_FALSE(net.events[kB].empty());
  EXPECT_EQ(net.events[kB].front().kind, EventKind::disconnected);
  EXPECT_EQ(net.events[kB].front().id, old_id);
  EXPECT_NE(net.find(kB, EventKind::established, *waiting), nullptr);
  EXPECT_EQ(net.find(kB, EventKind::connect_request), nullptr);
  EXPECT_NE(net.find(kA, EventKind::established, *again), nullptr);
  EXPECT_EQ(net.agent(kB).resolver().stats().replaced_restarted, 1u);
  EXPECT_EQ(net.agent(kB).stats().p2p_bound, 1u);
}

// R5b: the connection answers its check (its QP heard from the peer): the waiting attempt ends
// with connect_error, `already_connected`; the connection and the peer see nothing.
TEST_F(P2p, ConnectWaitingOnACheckEndsAlreadyConnectedWhenTheConnectionAnswers) {
  auto ida = net.agent(kA).connect(connect_params(kB, 0x100, true), net.now);
  net.run_for(2ms);
  accept_requests(kB, 0x200);
  net.run_for(5ms);
  ASSERT_NE(net.find(kA, EventKind::established, *ida), nullptr);
  const IbCmAgentEvent* old = net.find(kB, EventKind::established);
  ASSERT_NE(old, nullptr);
  const IbCmId old_id = old->id;
  net.events[kA].clear();
  net.events[kB].clear();
  const int mads_before = net.sent[w::CmAttribute::req] + net.sent[w::CmAttribute::dreq];
  auto waiting = net.agent(kB).connect(connect_params(kA, 0x201, true), net.now, {}, [](IbCmId) { return true; });
  ASSERT_TRUE(waiting.has_value());
  net.agent(kB).handle_connection_alive(*waiting, net.now);  // not the checked connection: nothing
  net.run_for(5ms);
  EXPECT_TRUE(net.events[kB].empty());
  net.agent(kB).handle_connection_alive(old_id, net.now);
  net.run_for(1ms);  // the fabric collects events and MADs as time runs
  ASSERT_EQ(net.events[kB].size(), 1u);
  EXPECT_EQ(net.events[kB][0].kind, EventKind::connect_error);
  EXPECT_EQ(net.events[kB][0].id, *waiting);
  EXPECT_TRUE(net.events[kB][0].already_connected);
  EXPECT_EQ(net.agent(kB).state_of(old_id), IbCmState::established);
  EXPECT_EQ(net.sent[w::CmAttribute::req] + net.sent[w::CmAttribute::dreq], mads_before);
  EXPECT_TRUE(net.events[kA].empty());
  // Without a way to check (no QP): EISCONN at once, as over iWARP.
  auto unchecked = net.agent(kB).connect(connect_params(kA, 0x202, true), net.now, {}, [](IbCmId) { return false; });
  ASSERT_FALSE(unchecked.has_value());
  EXPECT_EQ(unchecked.error(), std::errc::already_connected);
}

// R5b: the connection ends while the attempt waits (here the application disconnects it; a
// keepalive verdict does the same through the same call): the attempt's REQ goes out then, and
// it establishes as a fresh connect.
TEST_F(P2p, ConnectWaitingOnACheckDialsOnceTheConnectionEnds) {
  auto ida = net.agent(kA).connect(connect_params(kB, 0x100, true), net.now);
  net.run_for(2ms);
  accept_requests(kB, 0x200);
  net.run_for(5ms);
  ASSERT_NE(net.find(kA, EventKind::established, *ida), nullptr);
  const IbCmAgentEvent* old = net.find(kB, EventKind::established);
  ASSERT_NE(old, nullptr);
  const IbCmId old_id = old->id;
  net.events[kA].clear();
  const int reqs_before = net.sent[w::CmAttribute::req];
  auto waiting = net.agent(kB).connect(connect_params(kA, 0x201, true), net.now, {}, [](IbCmId) { return true; });
  ASSERT_TRUE(waiting.has_value());
  net.run_for(5ms);
  EXPECT_EQ(net.sent[w::CmAttribute::req], reqs_before);
  ASSERT_TRUE(net.agent(kB).disconnect(old_id, net.now));
  net.run_for(5ms);
  EXPECT_EQ(net.sent[w::CmAttribute::req], reqs_before + 1);
  // A's side of the old connection ended with B's DREQ, so B's REQ is simply delivered there.
  accept_requests(kA, 0x101);
  net.run_for(20ms);
  EXPECT_NE(net.find(kB, EventKind::established, *waiting), nullptr);
}

// Rule 6: a REQ of the same incarnation from an attempt no newer than the connection's (a late
// copy under another comm ID) is rejected as a duplicate — by the CM, never delivered.
TEST_F(P2p, SameIncarnationLateDuplicateIsRejectedNotDelivered) {
  std::optional<OutboundMad> first_req;
  net.filter = [&](int, int, const OutboundMad& mad) {
    if (attribute(mad) == w::CmAttribute::req && !first_req) first_req = mad;
    return 1;
  };
  auto ida = net.agent(kA).connect(connect_params(kB, 0x100, true), net.now);
  net.run_for(2ms);
  accept_requests(kB, 0x200);
  net.run_for(5ms);
  ASSERT_NE(net.find(kA, EventKind::established, *ida), nullptr);
  ASSERT_TRUE(first_req.has_value());

  OutboundMad copy = *first_req;
  wire::store_be32(copy.bytes.data() + w::kMadHeaderSize, 0x7777);  // another local comm ID
  const int requests_before = net.count(kB, EventKind::connect_request);
  net.agent(kB).handle_mad(w::ipv4_mapped_gid(Fabric::address(kA)), copy.bytes, net.now);
  net.run_for(5ms);
  EXPECT_EQ(net.count(kB, EventKind::connect_request), requests_before);
  EXPECT_EQ(net.agent(kB).stats().p2p_duplicates, 1u);
  EXPECT_EQ(net.agent(kB).resolver().stats().rejected_duplicate, 1u);
  EXPECT_EQ(net.sent[w::CmAttribute::rej], 1);
  // The exact copy (same comm ID) is a plain duplicate of the live connection: ignored.
  net.agent(kB).handle_mad(w::ipv4_mapped_gid(Fabric::address(kA)), first_req->bytes, net.now);
  net.run_for(5ms);
  EXPECT_EQ(net.sent[w::CmAttribute::rej], 1);
  EXPECT_EQ(net.agent(kA).state_of(*ida), IbCmState::established);
}

// The passive peer's own REQ reaches the active peer only after the connection is up (its
// copies were delayed): the active peer treats it as a duplicate of the connection (same comm
// ID, §5) and stays quiet.
TEST_F(P2p, DeadReqOfThePassivePeerArrivingLateIsIgnored) {
  // A (GUID 0x10) is passive against B (0x20). Hold A's REQ back.
  std::optional<OutboundMad> held;
  net.filter = [&](int from, int, const OutboundMad& mad) {
    if (from == kA && attribute(mad) == w::CmAttribute::req && !held) {
      held = mad;
      return 0;
    }
    return 1;
  };
  auto ida = net.agent(kA).connect(connect_params(kB, 0x100, true), net.now);
  auto idb = net.agent(kB).connect(connect_params(kA, 0x200, true), net.now);
  net.run_for(5ms);  // before A's REQ timer fires
  ASSERT_NE(net.find(kA, EventKind::established, *ida), nullptr);
  ASSERT_NE(net.find(kB, EventKind::established, *idb), nullptr);
  ASSERT_TRUE(held.has_value());
  net.agent(kB).handle_mad(w::ipv4_mapped_gid(Fabric::address(kA)), held->bytes, net.now);
  net.run_for(50ms);
  EXPECT_EQ(net.sent[w::CmAttribute::rej], 0);
  EXPECT_EQ(net.sent[w::CmAttribute::req], 2);  // A stopped resending its REQ
  EXPECT_EQ(net.count(kA, EventKind::connect_request) + net.count(kB, EventKind::connect_request), 0);
}

TEST(P2pHeader, RoundTripAndRefusals) {
  std::array<std::uint8_t, kP2pHeaderSize + 2> bytes{};
  ASSERT_TRUE(encode_p2p_header({.tag = 0x01020304, .incarnation = 0x1122334455667788}, bytes));
  bytes[kP2pHeaderSize] = 0xEE;
  auto view = decode_p2p_header(bytes);
  ASSERT_TRUE(view.has_value());
  EXPECT_EQ(view->header.tag, 0x01020304u);
  EXPECT_EQ(view->header.incarnation, 0x1122334455667788u);
  EXPECT_EQ(view->application_data.size(), 2u);
  EXPECT_EQ(view->application_data[0], 0xEE);
  EXPECT_FALSE(decode_p2p_header(std::span(bytes).first(kP2pHeaderSize - 1)).has_value());
  bytes[4] = 2;  // unknown version: no header
  EXPECT_FALSE(decode_p2p_header(bytes).has_value());
  std::array<std::uint8_t, kP2pHeaderSize - 1> small{};
  EXPECT_FALSE(encode_p2p_header({}, small));
}

}  // namespace
}  // namespace peercm::core::ibcm::test
