// The IB CM agent in client/server mode over the test fabric: the happy path, lost MADs at every
// step, retries running out, duplicates, stale connections, MRA, and REJ with private data
// (roce-ibcm-wire.md §4.9, §6).
#include <gtest/gtest.h>

#include "ibcm_fabric.hpp"
#include "wire/ibcm/rdma_cm_ip.hpp"

namespace peercm::core::ibcm::test {
namespace {

constexpr int kClient = 0;
constexpr int kServer = 1;

struct ClientServer : ::testing::Test {
  Fabric net;
  void SetUp() override {
    net.add(0x1111);
    net.add(0x2222);
    net.agent(kServer).listen(7471);
  }

  IbCmId connect(std::vector<std::uint8_t> data = {}) {
    IbCmConnectParams params = connect_params(kServer, 0x100, false);
    params.private_data = std::move(data);
    auto id = net.agent(kClient).connect(params, net.now);
    EXPECT_TRUE(id.has_value());
    return id ? *id : 0;
  }
  // Accepts every connect_request as soon as it shows up.
  void accept_all(Duration step = 1ms, int rounds = 200) {
    for (int i = 0; i < rounds; ++i) {
      net.run_for(step);
      for (const auto& e : net.events[kServer]) {
        if (e.kind == EventKind::connect_request && accepted_.insert(e.id).second) {
          EXPECT_TRUE(net.agent(kServer).accept(e.id, accept_params(0x200), net.now));
        }
      }
    }
  }
  void expect_everything_gone() {
    net.run_for(1s);
    net.expect_quiet(kClient);
    net.expect_quiet(kServer);
  }
  std::set<IbCmId> accepted_;
};

TEST_F(ClientServer, HappyPathReqRepRtuDreqDrepTimewait) {
  const std::vector<std::uint8_t> hello{'h', 'i'};
  const IbCmId id = connect(hello);
  accept_all();
  const IbCmAgentEvent* request = net.find(kServer, EventKind::connect_request);
  ASSERT_NE(request, nullptr);
  EXPECT_EQ(request->peer.qpn, 0x100u);
  EXPECT_EQ(request->peer.guid, 0x1111u);
  EXPECT_EQ(request->peer_address, Fabric::address(kClient));
  EXPECT_FALSE(request->peer_to_peer);
  ASSERT_GE(request->private_data.size(), 2u);
  EXPECT_EQ(request->private_data[0], 'h');
  EXPECT_EQ(request->private_data.size(), kMaxConnectPrivateData);  // §6: 56 application bytes

  const IbCmAgentEvent* client = net.find(kClient, EventKind::established, id);
  const IbCmAgentEvent* server = net.find(kServer, EventKind::established, request->id);
  ASSERT_NE(client, nullptr);
  ASSERT_NE(server, nullptr);
  EXPECT_EQ(client->peer.qpn, 0x200u);
  EXPECT_EQ(client->peer.comm_id, server->local_comm_id);
  EXPECT_EQ(server->peer.comm_id, client->local_comm_id);
  EXPECT_EQ(net.agent(kClient).state_of(id), IbCmState::established);
  // The passive side hears that its REP left (its QP receives from then on), the active not.
  const IbCmAgentEvent* reply = net.find(kServer, EventKind::reply_sent, request->id);
  ASSERT_NE(reply, nullptr);
  EXPECT_EQ(reply->peer.qpn, 0x100u);
  EXPECT_EQ(reply->peer.starting_psn, request->peer.starting_psn);
  EXPECT_EQ(net.count(kServer, EventKind::reply_sent), 1);
  EXPECT_EQ(net.count(kClient, EventKind::reply_sent), 0);
  EXPECT_EQ(net.sent[w::CmAttribute::req], 1);
  EXPECT_EQ(net.sent[w::CmAttribute::rep], 1);
  EXPECT_EQ(net.sent[w::CmAttribute::rtu], 1);

  ASSERT_TRUE(net.agent(kClient).disconnect(id, net.now));
  EXPECT_EQ(net.agent(kClient).state_of(id), IbCmState::dreq_sent);
  net.run_for(5ms);
  EXPECT_EQ(net.count(kClient, EventKind::disconnected), 1);
  EXPECT_EQ(net.count(kServer, EventKind::disconnected), 1);
  EXPECT_EQ(net.agent(kClient).state_of(id), IbCmState::timewait);
  EXPECT_EQ(net.count(kClient, EventKind::timewait_exit), 0);
  net.run_for(50ms);  // timewait ≈ 33.5 ms
  EXPECT_EQ(net.count(kClient, EventKind::timewait_exit), 1);
  EXPECT_EQ(net.count(kServer, EventKind::timewait_exit), 1);
  EXPECT_EQ(net.sent[w::CmAttribute::dreq], 1);
  EXPECT_EQ(net.sent[w::CmAttribute::drep], 1);
  expect_everything_gone();
}

// Each establishment and release MAD lost once (its first copy): retransmission recovers.
class LostMad : public ClientServer, public ::testing::WithParamInterface<w::CmAttribute> {};

TEST_P(LostMad, FirstCopyLostIsRecovered) {
  const w::CmAttribute lost = GetParam();
  bool dropped = false;
  net.filter = [&](int, int, const OutboundMad& mad) {
    if (attribute(mad) == lost && !dropped) {
      dropped = true;
      return 0;
    }
    return 1;
  };
  const IbCmId id = connect();
  accept_all(1ms, 100);
  ASSERT_NE(net.find(kClient, EventKind::established, id), nullptr);
  const IbCmAgentEvent* request = net.find(kServer, EventKind::connect_request);
  ASSERT_NE(request, nullptr);
  if (lost != w::CmAttribute::rtu) {
    ASSERT_NE(net.find(kServer, EventKind::established), nullptr);
  }
  ASSERT_TRUE(net.agent(kClient).disconnect(id, net.now));
  net.run_for(200ms);
  EXPECT_TRUE(dropped);
  EXPECT_EQ(net.count(kClient, EventKind::established), 1);
  EXPECT_EQ(net.count(kServer, EventKind::established), 1);  // a lost RTU: the DREQ proves it
  EXPECT_EQ(net.count(kClient, EventKind::disconnected), 1);
  EXPECT_EQ(net.count(kServer, EventKind::disconnected), 1);
  EXPECT_EQ(net.count(kServer, EventKind::connect_request), 1);
  EXPECT_GE(net.sent[lost], 2);
  expect_everything_gone();
}

INSTANTIATE_TEST_SUITE_P(EveryStep, LostMad,
                         ::testing::Values(w::CmAttribute::req, w::CmAttribute::rep, w::CmAttribute::dreq,
                                           w::CmAttribute::drep, w::CmAttribute::rtu),
                         [](const auto& param_info) {
                           switch (param_info.param) {
                             case w::CmAttribute::req: return std::string("Req");
                             case w::CmAttribute::rep: return std::string("Rep");
                             case w::CmAttribute::dreq: return std::string("Dreq");
                             case w::CmAttribute::drep: return std::string("Drep");
                             default: return std::string("Rtu");
                           }
                         });

TEST_F(ClientServer, UnansweredReqEndsUnreachableAfterMaxRetriesWithRejTimeout) {
  net.filter = [](int from, int, const OutboundMad&) { return from == kClient ? 0 : 1; };
  const IbCmId id = connect();
  net.run_for(41ms);  // four waits of 2 × lifetime + response timeout ≈ 10.5 ms each
  EXPECT_EQ(net.find(kClient, EventKind::unreachable, id), nullptr);
  net.run_for(2ms);
  const IbCmAgentEvent* gone = net.find(kClient, EventKind::unreachable, id);
  ASSERT_NE(gone, nullptr);
  EXPECT_EQ(net.sent[w::CmAttribute::req], 1 + 3);  // Max CM Retries = 3
  EXPECT_EQ(net.sent[w::CmAttribute::rej], 1);      // §4.9: REJ(timeout) to the peer
  expect_everything_gone();
}

// docs/reliability.md, "Dead peers (RoCE)": the server's host reports our REQ undeliverable
// (ICMP port unreachable). The attempt ends UNREACHABLE at once, without a resend; an error that
// names another peer or another exchange changes nothing.
TEST_F(ClientServer, PortUnreachableFromThePeerEndsTheAttemptAtOnce) {
  net.filter = [](int from, int, const OutboundMad&) { return from == kClient ? 0 : 1; };
  const IbCmId id = connect();
  net.run_for(1ms);
  const IbCmConnection* connection = net.agent(kClient).connection_of(id);
  ASSERT_NE(connection, nullptr);
  const std::uint32_t comm = connection->local_comm_id();
  const Gid server = w::ipv4_mapped_gid(Fabric::address(kServer));
  const Gid elsewhere = w::ipv4_mapped_gid(Fabric::address(7));
  net.agent(kClient).handle_peer_unreachable(elsewhere, comm, net.now);
  net.agent(kClient).handle_peer_unreachable(server, comm + 1, net.now);
  net.run_for(1ms);
  EXPECT_EQ(net.find(kClient, EventKind::unreachable, id), nullptr);
  EXPECT_EQ(net.agent(kClient).stats().peer_unreachable, 0u);

  net.agent(kClient).handle_peer_unreachable(server, comm, net.now);
  net.run_for(1ms);
  EXPECT_NE(net.find(kClient, EventKind::unreachable, id), nullptr);
  EXPECT_EQ(net.agent(kClient).stats().peer_unreachable, 1u);
  EXPECT_EQ(net.sent[w::CmAttribute::req], 1);  // no resend
  expect_everything_gone();
}

// The same for an accepted request whose REP bounces: CONNECT_ERROR on the server at once.
TEST_F(ClientServer, PortUnreachableForTheRepEndsTheAcceptedRequest) {
  net.filter = [](int from, int, const OutboundMad&) { return from == kServer ? 0 : 1; };
  connect();
  accept_all(1ms, 3);
  ASSERT_EQ(accepted_.size(), 1u);
  const IbCmId request = *accepted_.begin();
  const IbCmConnection* connection = net.agent(kServer).connection_of(request);
  ASSERT_NE(connection, nullptr);
  net.agent(kServer).handle_peer_unreachable(w::ipv4_mapped_gid(Fabric::address(kClient)),
                                             connection->local_comm_id(), net.now);
  net.run_for(1ms);
  EXPECT_EQ(net.count(kServer, EventKind::connect_error), 1);
  EXPECT_EQ(net.sent[w::CmAttribute::rep], 1);
}

TEST_F(ClientServer, DeadPathAfterReqTimesOutBothSides) {
  bool dead = false;
  net.filter = [&](int, int, const OutboundMad& mad) {
    if (attribute(mad) == w::CmAttribute::req && !dead) {
      dead = true;
      return 1;  // the first REQ arrives; nothing after it does
    }
    return dead ? 0 : 1;
  };
  const IbCmId id = connect();
  accept_all(1ms, 400);
  EXPECT_NE(net.find(kClient, EventKind::unreachable, id), nullptr);
  EXPECT_EQ(net.count(kServer, EventKind::connect_error), 1);  // REP retries exhausted
  // Max CM Retries is 3, but a REQ its sender never followed up buys three packets in all
  // (docs/reliability.md, "CM answers"): the REP and two resends; no REJ follows.
  EXPECT_EQ(net.sent[w::CmAttribute::rep], 3);
  expect_everything_gone();
}

TEST_F(ClientServer, DuplicateReqIsOneRequestAndDuplicateRepResendsRtu) {
  net.filter = [](int, int, const OutboundMad& mad) {
    const auto a = attribute(mad);
    return a == w::CmAttribute::req || a == w::CmAttribute::rep ? 2 : 1;
  };
  const IbCmId id = connect();
  accept_all(1ms, 50);
  EXPECT_EQ(net.count(kServer, EventKind::connect_request), 1);
  EXPECT_EQ(net.agent(kServer).stats().duplicate_reqs, 1u);
  EXPECT_EQ(net.count(kClient, EventKind::established), 1);
  EXPECT_EQ(net.count(kServer, EventKind::established), 1);
  EXPECT_EQ(net.sent[w::CmAttribute::rtu], 2);  // §4.9 duplicate REP in ESTABLISHED: RTU again
  ASSERT_TRUE(net.agent(kClient).disconnect(id, net.now));
  expect_everything_gone();
}

TEST_F(ClientServer, SlowAcceptSendsMraAndTheClientWaits) {
  const IbCmId id = connect();
  net.run_for(60ms);  // far beyond the client's REQ timer (≈ 10.5 ms) without the MRA
  ASSERT_EQ(net.count(kServer, EventKind::connect_request), 1);
  EXPECT_EQ(net.sent[w::CmAttribute::mra], 1);
  EXPECT_EQ(net.sent[w::CmAttribute::req], 1);  // the MRA stopped the resends
  const IbCmId request = net.find(kServer, EventKind::connect_request)->id;
  EXPECT_EQ(net.agent(kServer).state_of(request), IbCmState::mra_req_sent);
  EXPECT_EQ(net.agent(kClient).state_of(id), IbCmState::mra_req_rcvd);
  ASSERT_TRUE(net.agent(kServer).accept(request, accept_params(0x200), net.now));
  net.run_for(10ms);
  EXPECT_NE(net.find(kClient, EventKind::established, id), nullptr);
  EXPECT_NE(net.find(kServer, EventKind::established, request), nullptr);
}

TEST_F(ClientServer, MraWithoutAnAnswerEndsWithRejTimeout) {
  const IbCmId id = connect();
  net.run_for(1s);
  const IbCmAgentEvent* request = net.find(kServer, EventKind::connect_request);
  ASSERT_NE(request, nullptr);
  const IbCmId request_id = request->id;
  EXPECT_NE(net.find(kServer, EventKind::connect_error, request_id), nullptr);
  const IbCmAgentEvent* rejected = net.find(kClient, EventKind::rejected, id);
  ASSERT_NE(rejected, nullptr);
  EXPECT_EQ(rejected->reason, w::rej_reason::kTimeout);
  EXPECT_FALSE(net.agent(kServer).accept(request_id, accept_params(0x200), net.now));
  expect_everything_gone();
}

// CmOption::connect_timeout bounds a client/server attempt as it bounds a p2p one (docs/p2p.md
// R8): the attempt ends at connect() + its timeout even while the IB CM would still wait for
// an answer, as a consumer giving up ends it (§4.9: REJ(timeout) to the peer).
struct ClientServerConnectTimeout : ::testing::Test {
  static constexpr Duration kTimeout = 300ms;
  Fabric net;
  void start(IbCmTiming client, IbCmTiming server) {
    net.add(0x1111, 0, client);
    net.add(0x2222, 0, server);
    net.agent(kServer).listen(7471);
  }
  IbCmId connect() {
    IbCmConnectParams params = connect_params(kServer, 0x100, false);
    params.connect_timeout = kTimeout;
    auto id = net.agent(kClient).connect(params, net.now);
    EXPECT_TRUE(id.has_value());
    return id ? *id : 0;
  }
};

TEST_F(ClientServerConnectTimeout, UnansweredReqEndsUnreachableAtTheDeadline) {
  IbCmTiming slow_answers = fast_timing();
  slow_answers.cm_response_timeout = 20;  // each REQ waits ≈ 4.3 s: the retries would end after 17 s
  start(slow_answers, fast_timing());
  net.filter = [](int from, int, const OutboundMad&) { return from == kClient ? 0 : 1; };
  const IbCmId id = connect();
  net.run_for(kTimeout - 1ms);
  EXPECT_EQ(net.count(kClient, EventKind::unreachable), 0);
  EXPECT_EQ(net.agent(kClient).state_of(id), IbCmState::req_sent);
  net.run_for(2ms);
  EXPECT_NE(net.find(kClient, EventKind::unreachable, id), nullptr) << "nothing was heard from the server";
  EXPECT_EQ(net.count(kClient, EventKind::connect_error), 0);
  EXPECT_EQ(net.sent[w::CmAttribute::req], 1);  // no resend was due yet
  EXPECT_EQ(net.sent[w::CmAttribute::rej], 1);  // REJ(timeout), in case the REQ did arrive
  net.run_for(1s);
  net.expect_quiet(kClient);
  net.expect_quiet(kServer);
}

TEST_F(ClientServerConnectTimeout, MraWithoutAnAnswerEndsConnectErrorAtTheDeadline) {
  IbCmTiming long_promise = fast_timing();
  long_promise.service_timeout = 20;  // the server's MRA asks for ≈ 4.3 s more
  start(fast_timing(), long_promise);
  const IbCmId id = connect();
  net.run_for(60ms);
  const IbCmAgentEvent* request = net.find(kServer, EventKind::connect_request);
  ASSERT_NE(request, nullptr);
  const IbCmId request_id = request->id;  // the server never answers it
  EXPECT_EQ(net.sent[w::CmAttribute::mra], 1);
  EXPECT_EQ(net.agent(kClient).state_of(id), IbCmState::mra_req_rcvd);
  net.run_for(kTimeout - 61ms);
  EXPECT_EQ(net.count(kClient, EventKind::connect_error), 0);
  net.run_for(2ms);
  EXPECT_NE(net.find(kClient, EventKind::connect_error, id), nullptr) << "the server had answered with an MRA";
  EXPECT_EQ(net.count(kClient, EventKind::unreachable), 0);
  EXPECT_EQ(net.sent[w::CmAttribute::rej], 1);
  net.run_for(5ms);
  EXPECT_FALSE(net.agent(kServer).state_of(request_id).has_value()) << "the REJ(timeout) ended the request";
  EXPECT_FALSE(net.agent(kServer).accept(request_id, accept_params(0x200), net.now));
  EXPECT_EQ(net.count(kServer, EventKind::established), 0);
  net.run_for(1s);
  net.expect_quiet(kClient);
  net.expect_quiet(kServer);
}

// Established before its deadline, a connection outlives it.
TEST_F(ClientServerConnectTimeout, EstablishedConnectionOutlivesTheDeadline) {
  start(fast_timing(), fast_timing());
  const IbCmId id = connect();
  net.run_for(3ms);
  const IbCmAgentEvent* request = net.find(kServer, EventKind::connect_request);
  ASSERT_NE(request, nullptr);
  ASSERT_TRUE(net.agent(kServer).accept(request->id, accept_params(0x200), net.now));
  net.run_for(2 * kTimeout);
  EXPECT_NE(net.find(kClient, EventKind::established, id), nullptr);
  EXPECT_EQ(net.agent(kClient).state_of(id), IbCmState::established);
  EXPECT_FALSE(net.agent(kClient).next_deadline().has_value());
  EXPECT_EQ(net.count(kClient, EventKind::unreachable) + net.count(kClient, EventKind::connect_error), 0);
}

TEST_F(ClientServer, RejectCarriesPrivateDataToTheClient) {
  const IbCmId id = connect();
  net.run_for(3ms);
  const IbCmAgentEvent* request = net.find(kServer, EventKind::connect_request);
  ASSERT_NE(request, nullptr);
  const std::vector<std::uint8_t> why{'b', 'u', 's', 'y'};
  ASSERT_TRUE(net.agent(kServer).reject(request->id, why, net.now));
  net.run_for(5ms);
  const IbCmAgentEvent* rejected = net.find(kClient, EventKind::rejected, id);
  ASSERT_NE(rejected, nullptr);
  EXPECT_EQ(rejected->reason, w::rej_reason::kConsumerReject);
  ASSERT_GE(rejected->private_data.size(), why.size());
  EXPECT_TRUE(std::equal(why.begin(), why.end(), rejected->private_data.begin()));
  expect_everything_gone();
}

TEST_F(ClientServer, NoListenerIsRejectedWithInvalidServiceId) {
  net.agent(kServer).stop_listening(7471);
  const IbCmId id = connect();
  net.run_for(5ms);
  const IbCmAgentEvent* rejected = net.find(kClient, EventKind::rejected, id);
  ASSERT_NE(rejected, nullptr);
  EXPECT_EQ(rejected->reason, w::rej_reason::kInvalidServiceId);
}

// §4.9: the client restarts and connects with the QPN the server still holds connected.
TEST_F(ClientServer, StaleQpnIsRejectedAndTheOldConnectionDisconnected) {
  const IbCmId first = connect();
  accept_all(1ms, 10);
  ASSERT_NE(net.find(kClient, EventKind::established, first), nullptr);
  const IbCmAgentEvent* old = net.find(kServer, EventKind::established);
  ASSERT_NE(old, nullptr);
  const IbCmId old_id = old->id;

  net.restart(kClient, 0x9999);
  net.events[kClient].clear();
  const IbCmId second = connect();
  net.run_for(100ms);
  const IbCmAgentEvent* rejected = net.find(kClient, EventKind::rejected, second);
  ASSERT_NE(rejected, nullptr);
  EXPECT_EQ(rejected->reason, w::rej_reason::kStaleConnection);
  EXPECT_EQ(net.agent(kServer).stats().rejected_stale, 1u);
  EXPECT_NE(net.find(kServer, EventKind::disconnected, old_id), nullptr);  // its DREQ ran out
  expect_everything_gone();
}

// §4.9 counts only ESTABLISHED connections as holding a QPN: once the old one has left
// ESTABLISHED (here TIMEWAIT after the DREQ/DREP exchange), its QPN connects again at once.
TEST_F(ClientServer, QpnOfADisconnectedConnectionIsNotStale) {
  const IbCmId first = connect();
  accept_all(1ms, 10);
  ASSERT_NE(net.find(kClient, EventKind::established, first), nullptr);
  ASSERT_TRUE(net.agent(kClient).disconnect(first, net.now));
  net.run_for(5ms);
  const IbCmAgentEvent* old = net.find(kServer, EventKind::disconnected);
  ASSERT_NE(old, nullptr);
  EXPECT_EQ(net.agent(kServer).state_of(old->id), IbCmState::timewait);

  net.restart(kClient, 0x9999);  // same CA GUID and QPN, new comm IDs
  net.events[kClient].clear();
  const IbCmId second = connect();
  accept_all(1ms, 10);
  EXPECT_NE(net.find(kClient, EventKind::established, second), nullptr);
  EXPECT_EQ(net.agent(kServer).stats().rejected_stale, 0u);
  // The new connection holds the QPN now: a third incarnation's REQ is stale again.
  net.restart(kClient, 0x7777);
  net.events[kClient].clear();
  const IbCmId third = connect();
  net.run_for(100ms);
  const IbCmAgentEvent* rejected = net.find(kClient, EventKind::rejected, third);
  ASSERT_NE(rejected, nullptr);
  EXPECT_EQ(rejected->reason, w::rej_reason::kStaleConnection);
  EXPECT_EQ(net.agent(kServer).stats().rejected_stale, 1u);
}

TEST_F(ClientServer, UnknownDreqIsAnsweredWithDrep) {
  const IbCmId id = connect();
  accept_all(1ms, 10);
  ASSERT_NE(net.find(kClient, EventKind::established, id), nullptr);
  net.restart(kServer, 0x4242);  // the server forgets everything
  ASSERT_TRUE(net.agent(kClient).disconnect(id, net.now));
  net.run_for(5ms);
  EXPECT_EQ(net.count(kClient, EventKind::disconnected), 1);
  EXPECT_EQ(net.sent[w::CmAttribute::dreq], 1);
  EXPECT_EQ(net.sent[w::CmAttribute::drep], 1);
}

TEST_F(ClientServer, TooMuchPrivateDataIsRefused) {
  IbCmConnectParams params = connect_params(kServer, 0x100, false);
  params.private_data.assign(kMaxConnectPrivateData + 1, 0);
  EXPECT_FALSE(net.agent(kClient).connect(params, net.now).has_value());
  params.peer_to_peer = true;
  params.private_data.assign(kMaxP2pConnectPrivateData + 1, 0);
  EXPECT_FALSE(net.agent(kClient).connect(params, net.now).has_value());
  net.expect_quiet(kClient);
}

// ib_destroy_cm_id while the REQ waits for an answer: REJ(timeout) ends the server's request.
TEST_F(ClientServer, DestroyWhileConnectingRejectsWithTimeout) {
  const IbCmId id = connect();
  net.run_for(3ms);
  const IbCmAgentEvent* request = net.find(kServer, EventKind::connect_request);
  ASSERT_NE(request, nullptr);
  const IbCmId server_id = request->id;
  net.agent(kClient).destroy(id, net.now);
  EXPECT_FALSE(net.agent(kClient).state_of(id).has_value());
  net.run_for(5ms);
  EXPECT_EQ(net.sent[w::CmAttribute::rej], 1);
  EXPECT_FALSE(net.agent(kServer).state_of(server_id).has_value());
  EXPECT_FALSE(net.agent(kServer).accept(server_id, accept_params(0x200), net.now));
  EXPECT_EQ(net.count(kClient, EventKind::established), 0);
  EXPECT_EQ(net.count(kClient, EventKind::rejected), 0);  // destroyed ids hear nothing
  expect_everything_gone();
}

// A request the application destroys instead of answering is rejected as rdma_reject does.
TEST_F(ClientServer, DestroyingAnUnansweredRequestRejectsIt) {
  const IbCmId id = connect();
  net.run_for(3ms);
  const IbCmAgentEvent* request = net.find(kServer, EventKind::connect_request);
  ASSERT_NE(request, nullptr);
  net.agent(kServer).destroy(request->id, net.now);
  net.run_for(5ms);
  const IbCmAgentEvent* rejected = net.find(kClient, EventKind::rejected, id);
  ASSERT_NE(rejected, nullptr);
  EXPECT_EQ(rejected->reason, w::rej_reason::kConsumerReject);
  expect_everything_gone();
}

// Destroying an established id disconnects it: the peer sees DISCONNECTED, both sides pass
// through timewait and forget the connection.
TEST_F(ClientServer, DestroyingAnEstablishedIdDisconnectsThePeer) {
  const IbCmId id = connect();
  accept_all();
  ASSERT_NE(net.find(kClient, EventKind::established, id), nullptr);
  net.agent(kClient).destroy(id, net.now);
  net.run_for(100ms);
  EXPECT_EQ(net.sent[w::CmAttribute::dreq], 1);
  EXPECT_EQ(net.count(kServer, EventKind::disconnected), 1);
  EXPECT_EQ(net.count(kClient, EventKind::disconnected), 0);
  EXPECT_EQ(net.count(kClient, EventKind::timewait_exit), 0);
  expect_everything_gone();
}

TEST_F(ClientServer, MalformedMadIsDroppedAndCounted) {
  std::array<std::uint8_t, 256> junk{};
  net.agent(kServer).handle_mad(w::ipv4_mapped_gid(Fabric::address(kClient)), junk, net.now);
  EXPECT_EQ(net.agent(kServer).stats().malformed, 1u);
  EXPECT_FALSE(net.agent(kServer).poll_mad().has_value());
}

// docs/reliability.md, "CM answers": a REQ is an unauthenticated datagram. One that names
// another address than its source (in its path or in rdma_cm's header) is refused with REJ 12
// to its source, and nothing goes anywhere else; one that names tiny timers and 15 retries
// still buys at most three packets, all to its source.
struct CmAnswers : ::testing::Test {
  Fabric net;
  std::vector<std::uint8_t> private_data;
  void SetUp() override {
    net.add(0x1111);
    net.add(0x2222);
    net.agent(kServer).listen(7471);
  }
  // The REQ the client would send, decoded (its private data copied into `private_data`).
  w::CmReq client_req() {
    EXPECT_TRUE(net.agent(kClient).connect(connect_params(kServer, 0x100, false), net.now));
    auto mad = net.agent(kClient).poll_mad();
    EXPECT_TRUE(mad.has_value());
    auto decoded = w::decode_cm_mad(mad->bytes);
    EXPECT_TRUE(decoded.has_value());
    w::CmReq req = std::get<w::CmReq>(decoded->message);
    private_data.assign(req.private_data.begin(), req.private_data.end());
    req.private_data = private_data;
    return req;
  }
  // `req` handed to the server as if it came from the client's address; what it sends back.
  std::vector<OutboundMad> deliver(const w::CmReq& req) {
    OutboundMad mad;
    EXPECT_TRUE(w::encode_cm_mad({.transaction_id = 0x77, .message = req}, mad.bytes));
    net.agent(kServer).handle_mad(w::ipv4_mapped_gid(Fabric::address(kClient)), mad.bytes, net.now);
    return drain_server();
  }
  std::vector<OutboundMad> drain_server() {
    std::vector<OutboundMad> out;
    while (auto mad = net.agent(kServer).poll_mad()) out.push_back(*mad);
    return out;
  }
  static constexpr Ipv4Address kVictim{10, 0, 0, 99};
};

TEST_F(CmAnswers, RequestNamingAnotherAddressInItsPathIsRefusedToItsSource) {
  w::CmReq req = client_req();
  req.primary.local_gid = w::ipv4_mapped_gid(kVictim);
  const auto answers = deliver(req);
  ASSERT_EQ(answers.size(), 1u);
  EXPECT_EQ(answers[0].destination, w::ipv4_mapped_gid(Fabric::address(kClient)));
  auto rej = w::decode_cm_mad(answers[0].bytes);
  ASSERT_TRUE(rej.has_value());
  EXPECT_EQ(std::get<w::CmRej>(rej->message).reason, w::rej_reason::kInvalidPrimaryGid);
  EXPECT_EQ(net.agent(kServer).stats().rejected_address, 1u);
  while (auto e = net.agent(kServer).poll_event()) ADD_FAILURE() << "the application heard of it";
}

TEST_F(CmAnswers, RequestNamingAnotherAddressInRdmaCmsHeaderIsRefusedToItsSource) {
  w::CmReq req = client_req();
  auto cma = w::decode_cma_private_data(private_data);
  ASSERT_TRUE(cma.has_value());
  std::vector<std::uint8_t> forged(private_data.size());
  ASSERT_TRUE(w::encode_cma_private_data(w::CmaHeader::ipv4(kVictim, cma->header.source_port, Fabric::address(kServer)),
                                         cma->application_data, forged));
  private_data = forged;
  req.private_data = private_data;
  const auto answers = deliver(req);
  ASSERT_EQ(answers.size(), 1u);
  EXPECT_EQ(answers[0].destination, w::ipv4_mapped_gid(Fabric::address(kClient)));
  EXPECT_EQ(net.agent(kServer).stats().rejected_address, 1u);
}

TEST_F(CmAnswers, OneUnansweredRequestBuysAtMostThreePacketsWhateverItsTimersSay) {
  w::CmReq req = client_req();
  req.local_cm_response_timeout = 0;   // "resend at once"
  req.remote_cm_response_timeout = 0;  // "MRA at once"
  req.max_cm_retries = 15;
  auto answers = deliver(req);
  IbCmId request = 0;
  while (auto e = net.agent(kServer).poll_event())
    if (e->kind == EventKind::connect_request) request = e->id;
  ASSERT_NE(request, 0u);
  // The application is slow (an MRA may go), then accepts; the source never answers.
  net.now += 20ms;
  net.agent(kServer).handle_timeout(net.now);
  for (auto& mad : drain_server()) answers.push_back(mad);
  ASSERT_TRUE(net.agent(kServer).accept(request, accept_params(0x200), net.now));
  for (int step = 0; step < 2000 && net.agent(kServer).next_deadline(); ++step) {
    net.now = std::max(net.now, *net.agent(kServer).next_deadline());
    net.agent(kServer).handle_timeout(net.now);
    for (auto& mad : drain_server()) answers.push_back(mad);
  }
  EXPECT_GE(answers.size(), 1u);
  EXPECT_LE(answers.size(), 3u);
  for (const auto& mad : answers) EXPECT_EQ(mad.destination, w::ipv4_mapped_gid(Fabric::address(kClient)));
  EXPECT_EQ(net.agent(kServer).next_deadline(), std::nullopt) << "the request is not forgotten";
}

// docs/reliability.md, "Requests a listener holds": every REQ whose exchange ends is
// remembered for TIMEWAIT (2.1 s) to drop its late copies. A sender that makes thousands of
// REQs end (here: each rejected by the application) must not buy memory for each: at most
// kMaxTombstones are kept, the first to expire forgotten first.
TEST_F(CmAnswers, EndedRequestsAreRememberedUpToABound) {
  w::CmReq req = client_req();
  const std::size_t flood = kMaxTombstones + 500;
  for (std::uint32_t i = 0; i < flood; ++i) {
    req.local_comm_id = 0x10000 + i;
    deliver(req);
    auto request = net.agent(kServer).poll_event();
    ASSERT_TRUE(request.has_value());
    ASSERT_EQ(request->kind, EventKind::connect_request);
    ASSERT_TRUE(net.agent(kServer).reject(request->id, {}, net.now));
    drain_server();
  }
  EXPECT_EQ(net.agent(kServer).connection_count(), 0u);
  EXPECT_EQ(net.agent(kServer).pending_request_count(), kMaxTombstones);
  EXPECT_EQ(net.agent(kServer).stats().tombstones_evicted, 500u);
  // The newest are the ones remembered: a late copy of the last REQ is still dropped.
  EXPECT_TRUE(deliver(req).empty());
  EXPECT_FALSE(net.agent(kServer).poll_event().has_value());
}

}  // namespace
}  // namespace peercm::core::ibcm::test
