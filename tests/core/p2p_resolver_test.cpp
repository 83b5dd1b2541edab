// The p2p collision resolver (docs/p2p.md, Rules), one rule at a time. The deterministic simulation in
// tests/sim drives the same core over hundreds of thousands of schedules; these pin each rule.
#include "core/p2p_resolver.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <system_error>
#include <vector>

namespace peercm::core {
namespace {

using namespace std::chrono_literals;
using Kind = P2pAction::Kind;

const Time kStart = Time{} + 100s;
const Time kDeadline = kStart + 10s;

// Node X (local) and node Y (peer); keys as each sees the other.
const P2pKey kToY{.address = 0x0A000002, .port = 7002, .tag = 5};
const P2pKey kToX{.address = 0x0A000001, .port = 7001, .tag = 5};

const NodeIdentity kSmall{.guid = 0x10, .incarnation = 0xA1};
const NodeIdentity kLarge{.guid = 0x20, .incarnation = 0xB1};

std::vector<P2pAction> drain(P2pResolver& resolver) {
  std::vector<P2pAction> actions;
  while (auto action = resolver.poll_action()) actions.push_back(*action);
  return actions;
}

P2pAction only_action(P2pResolver& resolver) {
  auto actions = drain(resolver);
  EXPECT_EQ(actions.size(), 1u);
  return actions.empty() ? P2pAction{} : actions.front();
}

void expect_idle(const P2pResolver& resolver) {
  EXPECT_EQ(resolver.tracked_links(), 0u);
  EXPECT_EQ(resolver.tracked_attempts(), 0u);
  EXPECT_FALSE(resolver.next_deadline().has_value());
}

// A connection on kToY established through a request from `peer` (attempt `peer_attempt`) on link 9.
void establish_delivered(P2pResolver& x, const NodeIdentity& peer, AttemptId peer_attempt) {
  x.handle_request(kToY, 9, peer, peer_attempt, kStart);
  ASSERT_EQ(only_action(x).kind, Kind::deliver_request);
  x.handle_request_accepted(9);
  x.handle_established(kToY, 9, peer.incarnation);
  ASSERT_EQ(x.established_link(kToY), std::optional<LinkId>(9));
}

// ---------------------------------------------------------------------------------------------
// Rule 4

TEST(P2pResolver, RequestWithoutLocalAttemptIsDeliveredToTheListener) {
  P2pResolver x(kSmall);
  x.handle_request(kToY, 9, kLarge, 3, kStart);
  const P2pAction action = only_action(x);
  EXPECT_EQ(action.kind, Kind::deliver_request);
  EXPECT_EQ(action.link, 9u);
  EXPECT_EQ(action.key, kToY);
  EXPECT_EQ(x.stats().delivered, 1u);
  EXPECT_EQ(x.tracked_links(), 1u);
}

// ---------------------------------------------------------------------------------------------
// Rule 3: the collision order

TEST(P2pResolver, LargerGuidIsTheActivePeerAndRejectsTheCollidingRequestOnceEstablished) {
  P2pResolver x(kLarge);
  ASSERT_TRUE(x.connect(kToX, 1, 7, kDeadline));
  x.handle_request(kToX, 9, kSmall, 50, kStart);  // the attempt id does not matter: GUID first
  EXPECT_TRUE(drain(x).empty());                  // held: O keeps waiting for its reply
  EXPECT_EQ(x.tracked_links(), 2u);
  EXPECT_EQ(x.connect(kToX, 2, 8, kDeadline).error(), std::errc::connection_already_in_progress);
  // O's own reply establishes it; the losing request then gets its collision reject.
  x.handle_established(kToX, 7, kSmall.incarnation);
  const P2pAction action = only_action(x);
  EXPECT_EQ(action.kind, Kind::reject_request);
  EXPECT_EQ(action.link, 9u);
  EXPECT_EQ(action.reason, P2pRejectReason::collision);
  EXPECT_EQ(x.established_link(kToX), std::optional<LinkId>(7));
  EXPECT_EQ(x.stats().collisions_won, 1u);
  EXPECT_EQ(x.stats().rejected_collision, 1u);
  EXPECT_EQ(x.tracked_attempts(), 0u);
  EXPECT_EQ(x.tracked_links(), 1u);
}

// Usually the passive peer aborts its losing request first: the held request just goes away.
TEST(P2pResolver, HeldRequestWhoseLinkClosesIsForgotten) {
  P2pResolver x(kLarge);
  ASSERT_TRUE(x.connect(kToX, 1, 7, kDeadline));
  x.handle_request(kToX, 9, kSmall, 50, kStart);
  x.handle_link_closed(9);
  EXPECT_EQ(x.tracked_links(), 1u);
  x.handle_established(kToX, 7, kSmall.incarnation, 50);
  EXPECT_TRUE(drain(x).empty());
  EXPECT_EQ(x.stats().collisions_won, 1u);
}

// The peer's application rejected an earlier request of ours and then connected itself: our
// attempt ends REJECTED, and the peer's losing attempt is waiting for exactly its own request.
TEST(P2pResolver, HeldRequestGoesOnWhenTheWinningAttemptEndsOtherwise) {
  P2pResolver x(kLarge);
  ASSERT_TRUE(x.connect(kToX, 1, 7, kDeadline));
  x.handle_request(kToX, 9, kSmall, 50, kStart);
  x.handle_attempt_ended(1);  // e.g. REJECTED by the peer's application
  const P2pAction action = only_action(x);
  EXPECT_EQ(action.kind, Kind::deliver_request);  // rule 4: no local attempt any more
  EXPECT_EQ(action.link, 9u);
  EXPECT_EQ(x.tracked_attempts(), 0u);
  EXPECT_EQ(x.connect(kToX, 2, 8, kDeadline).error(), std::errc::connection_already_in_progress);
  // ... and at the deadline as well.
  P2pResolver y(kLarge);
  ASSERT_TRUE(y.connect(kToX, 1, 7, kDeadline));
  y.handle_request(kToX, 9, kSmall, 50, kStart);
  y.handle_timeout(kDeadline);
  const auto actions = drain(y);
  ASSERT_EQ(actions.size(), 2u);
  EXPECT_EQ(actions[0].kind, Kind::attempt_failed);
  EXPECT_EQ(actions[0].link, 7u);
  EXPECT_EQ(actions[1].kind, Kind::deliver_request);
  EXPECT_EQ(actions[1].link, 9u);
}

// The peer accepted our request, closed that connection at once and connected again; its new
// request (held: we win) reached us before our Reply. The Reply names its CmId on the link (10),
// older than the held attempt (12): the link is dead at the peer, the held request is the one.
TEST(P2pResolver, HeldRequestOfANewerAttemptReplacesTheJustEstablishedLink) {
  P2pResolver x(kLarge);
  ASSERT_TRUE(x.connect(kToX, 1, 7, kDeadline));
  x.handle_request(kToX, 9, kSmall, 12, kStart);
  EXPECT_TRUE(drain(x).empty());
  x.handle_established(kToX, 7, kSmall.incarnation, 10);
  const auto actions = drain(x);
  ASSERT_EQ(actions.size(), 2u);
  EXPECT_EQ(actions[0].kind, Kind::teardown_link);
  EXPECT_EQ(actions[0].link, 7u);
  EXPECT_EQ(actions[1].kind, Kind::deliver_request);
  EXPECT_EQ(actions[1].link, 9u);
  EXPECT_EQ(x.stats().replaced_stale, 1u);
  EXPECT_EQ(x.tracked_links(), 1u);
  EXPECT_EQ(x.tracked_attempts(), 0u);
}

// Over the IB CM nothing resets a held request's link when its sender crashes: the peer held
// here crashed, restarted, and its new incarnation accepted our request. The held request comes
// from the incarnation that ended (rule 7: a restart outlasts any message in flight): it is a
// late duplicate, and the connection just established stays (found by tests/sim's RoCE world).
TEST(P2pResolver, HeldRequestOfAnEndedIncarnationIsADuplicateOnceTheRestartedPeerAccepts) {
  P2pResolver x(kLarge);
  ASSERT_TRUE(x.connect(kToX, 1, 7, kDeadline));
  x.handle_request(kToX, 9, kSmall, 50, kStart);
  EXPECT_TRUE(drain(x).empty());
  const NodeIdentity restarted{.guid = kSmall.guid, .incarnation = 0xA2};
  x.handle_established(kToX, 7, restarted.incarnation, 3);
  const P2pAction action = only_action(x);
  EXPECT_EQ(action.kind, Kind::reject_request);
  EXPECT_EQ(action.link, 9u);
  EXPECT_EQ(action.reason, P2pRejectReason::duplicate);
  EXPECT_EQ(x.established_link(kToX), std::optional<LinkId>(7));
  EXPECT_EQ(x.tracked_links(), 1u);
  EXPECT_EQ(x.tracked_attempts(), 0u);
}

TEST(P2pResolver, HeldRequestIsBoundWhenTheWinningAttemptLosesItsLink) {
  P2pResolver x(kLarge);
  ASSERT_TRUE(x.connect(kToX, 1, 7, kDeadline));
  x.handle_request(kToX, 9, kSmall, 50, kStart);
  x.handle_link_closed(7);
  const P2pAction action = only_action(x);
  EXPECT_EQ(action.kind, Kind::accept_into_attempt);
  EXPECT_EQ(action.link, 9u);
  EXPECT_EQ(action.aborted_link, 0u);
  EXPECT_EQ(action.attempt, 1u);
}

TEST(P2pResolver, SecondRequestWhileHoldingOneIsADuplicateOrReplacesIt) {
  P2pResolver x(kLarge);
  ASSERT_TRUE(x.connect(kToX, 10, 7, kDeadline));
  x.handle_request(kToX, 9, kSmall, 5, kStart);
  x.handle_request(kToX, 11, kSmall, 5, kStart);  // a copy of the held request
  P2pAction action = only_action(x);
  EXPECT_EQ(action.link, 11u);
  EXPECT_EQ(action.reason, P2pRejectReason::duplicate);
  x.handle_request(kToX, 12, kSmall, 6, kStart);  // a newer attempt: the held one is over
  action = only_action(x);
  EXPECT_EQ(action.kind, Kind::reject_request);
  EXPECT_EQ(action.link, 9u);
  EXPECT_EQ(x.tracked_links(), 2u);  // 7 and the newly held 12
  // A restarted peer: the held request of its old incarnation is over; the new one is held.
  const NodeIdentity restarted{.guid = kSmall.guid, .incarnation = kSmall.incarnation + 1};
  x.handle_request(kToX, 13, restarted, 1, kStart);
  action = only_action(x);
  EXPECT_EQ(action.kind, Kind::reject_request);
  EXPECT_EQ(action.link, 12u);
  EXPECT_EQ(x.stats().replaced_stale, 1u);
  EXPECT_EQ(x.stats().replaced_restarted, 1u);
  x.handle_established(kToX, 7, restarted.incarnation, 1);
  action = only_action(x);
  EXPECT_EQ(action.link, 13u);
  EXPECT_EQ(action.reason, P2pRejectReason::collision);
}

TEST(P2pResolver, SmallerGuidIsThePassivePeerAndAcceptsTheRequestIntoItsAttempt) {
  P2pResolver x(kSmall);
  ASSERT_TRUE(x.connect(kToY, 50, 7, kDeadline));
  x.handle_request(kToY, 9, kLarge, 1, kStart);
  const P2pAction action = only_action(x);
  EXPECT_EQ(action.kind, Kind::accept_into_attempt);
  EXPECT_EQ(action.link, 9u);
  EXPECT_EQ(action.aborted_link, 7u);
  EXPECT_EQ(action.attempt, 50u);
  EXPECT_EQ(x.stats().collisions_lost, 1u);
  // The aborted link is forgotten; its close changes nothing.
  x.handle_link_closed(7);
  EXPECT_EQ(x.tracked_links(), 1u);
  x.handle_established(kToY, 9, kLarge.incarnation);
  EXPECT_EQ(x.established_link(kToY), std::optional<LinkId>(9));
  EXPECT_EQ(x.tracked_attempts(), 0u);
  EXPECT_FALSE(x.next_deadline().has_value());
}

TEST(P2pResolver, EqualGuidsFallBackToTheAttemptId) {
  const NodeIdentity a{.guid = 0x33, .incarnation = 1};
  const NodeIdentity b{.guid = 0x33, .incarnation = 2};
  {
    P2pResolver x(a);  // our attempt 8 > their 4: active (the request is held)
    ASSERT_TRUE(x.connect(kToY, 8, 7, kDeadline));
    x.handle_request(kToY, 9, b, 4, kStart);
    EXPECT_TRUE(drain(x).empty());
    x.handle_established(kToY, 7, b.incarnation);
    EXPECT_EQ(only_action(x).kind, Kind::reject_request);
  }
  {
    P2pResolver x(a);  // our attempt 4 < their 8: passive
    ASSERT_TRUE(x.connect(kToY, 4, 7, kDeadline));
    x.handle_request(kToY, 9, b, 8, kStart);
    EXPECT_EQ(only_action(x).kind, Kind::accept_into_attempt);
  }
}

TEST(P2pResolver, EqualGuidsAndAttemptIdsFallBackToTheIncarnation) {
  const NodeIdentity a{.guid = 0x33, .incarnation = 1};
  const NodeIdentity b{.guid = 0x33, .incarnation = 2};
  P2pResolver x(a);
  P2pResolver y(b);
  ASSERT_TRUE(x.connect(kToY, 1, 7, kDeadline));
  ASSERT_TRUE(y.connect(kToX, 1, 8, kDeadline));
  x.handle_request(kToY, 8, b, 1, kStart);
  y.handle_request(kToX, 7, a, 1, kStart);
  EXPECT_EQ(only_action(x).kind, Kind::accept_into_attempt);  // smaller incarnation: passive
  EXPECT_TRUE(drain(y).empty());                               // larger: active, holds
}

// Both orders, for many identities: exactly one side accepts into its attempt, the other holds.
TEST(P2pResolver, BothPeersAlwaysReachOppositeDecisions) {
  const std::uint64_t guids[] = {1, 2, 0xFFFFFFFFFFFFFFFF};
  const AttemptId ids[] = {1, 2, 0xFFFFFFFF};
  const std::uint64_t incarnations[] = {5, 6};
  int cases = 0;
  for (auto gx : guids)
    for (auto gy : guids)
      for (auto ox : ids)
        for (auto oy : ids)
          for (auto ix : incarnations)
            for (auto iy : incarnations) {
              const NodeIdentity idx{gx, ix};
              const NodeIdentity idy{gy, iy};
              if (idx == idy) continue;  // one node
              P2pResolver x(idx);
              P2pResolver y(idy);
              ASSERT_TRUE(x.connect(kToY, ox, 7, kDeadline));
              ASSERT_TRUE(y.connect(kToX, oy, 8, kDeadline));
              x.handle_request(kToY, 8, idy, oy, kStart);
              y.handle_request(kToX, 7, idx, ox, kStart);
              const auto ax = drain(x);
              const auto ay = drain(y);
              ASSERT_EQ(ax.size() + ay.size(), 1u);
              EXPECT_EQ((ax.empty() ? ay : ax).front().kind, Kind::accept_into_attempt);
              ++cases;
            }
  EXPECT_EQ(cases, 270);  // 324 combinations less the 54 where X and Y are one node
}

// ---------------------------------------------------------------------------------------------
// Rule 3: the losing attempt that was rejected first

TEST(P2pResolver, LostAttemptWaitsSilentlyAndBindsThePeersRequest) {
  P2pResolver x(kSmall);
  ASSERT_TRUE(x.connect(kToY, 50, 7, kDeadline));
  x.handle_attempt_rejected_by_cm(50);  // Y was active and rejected our request
  EXPECT_TRUE(drain(x).empty());        // never REJECTED to the application
  x.handle_link_closed(7);
  EXPECT_EQ(x.tracked_links(), 0u);
  EXPECT_EQ(x.tracked_attempts(), 1u);
  EXPECT_EQ(x.connect(kToY, 51, 10, kDeadline).error(), std::errc::connection_already_in_progress);

  x.handle_request(kToY, 9, kLarge, 1, kStart + 1s);
  const P2pAction action = only_action(x);
  EXPECT_EQ(action.kind, Kind::accept_into_attempt);
  EXPECT_EQ(action.attempt, 50u);
  EXPECT_EQ(action.aborted_link, 0u);  // its link is already gone
  x.handle_established(kToY, 9, kLarge.incarnation);
  EXPECT_EQ(x.established_link(kToY), std::optional<LinkId>(9));
  x.handle_link_closed(9);
  expect_idle(x);
}

// A lost attempt has no request left in flight: it binds even a request it would otherwise win.
TEST(P2pResolver, LostAttemptBindsEvenASmallerPeersRequest) {
  P2pResolver x(kLarge);
  ASSERT_TRUE(x.connect(kToX, 1, 7, kDeadline));
  x.handle_attempt_rejected_by_cm(1);
  x.handle_request(kToX, 9, kSmall, 1, kStart);
  EXPECT_EQ(only_action(x).kind, Kind::accept_into_attempt);
}

TEST(P2pResolver, AttemptWhoseLinkClosedWaitsForThePeersRequest) {
  P2pResolver x(kLarge);
  ASSERT_TRUE(x.connect(kToX, 1, 7, kDeadline));
  x.handle_link_closed(7);  // e.g. the peer crashed before answering
  EXPECT_TRUE(drain(x).empty());
  EXPECT_EQ(x.tracked_attempts(), 1u);
  EXPECT_EQ(x.tracked_links(), 0u);
  const NodeIdentity restarted{.guid = kSmall.guid, .incarnation = 0xA2};
  x.handle_request(kToX, 9, restarted, 1, kStart);
  EXPECT_EQ(only_action(x).kind, Kind::accept_into_attempt);
}

// ---------------------------------------------------------------------------------------------
// Rule 5

TEST(P2pResolver, ConnectWhileARequestIsDeliveredFailsWithEalready) {
  P2pResolver x(kSmall);
  x.handle_request(kToY, 9, kLarge, 1, kStart);
  drain(x);
  EXPECT_EQ(x.connect(kToY, 50, 7, kDeadline).error(), std::errc::connection_already_in_progress);
  x.handle_request_accepted(9);
  EXPECT_EQ(x.connect(kToY, 50, 7, kDeadline).error(), std::errc::connection_already_in_progress);
  x.handle_established(kToY, 9, kLarge.incarnation);
  EXPECT_EQ(x.connect(kToY, 50, 7, kDeadline).error(), std::errc::already_connected);
  // Another tag is another key.
  EXPECT_TRUE(x.connect(P2pKey{kToY.address, kToY.port, kToY.tag + 1}, 50, 7, kDeadline));
}

TEST(P2pResolver, ConnectWhileAnAttemptIsPendingFailsWithEalready) {
  P2pResolver x(kSmall);
  ASSERT_TRUE(x.connect(kToY, 50, 7, kDeadline));
  EXPECT_EQ(x.connect(kToY, 51, 8, kDeadline).error(), std::errc::connection_already_in_progress);
  x.handle_established(kToY, 7, kLarge.incarnation);
  EXPECT_EQ(x.connect(kToY, 51, 8, kDeadline).error(), std::errc::already_connected);
  x.handle_link_closed(7);
  EXPECT_TRUE(x.connect(kToY, 51, 8, kDeadline));
}

TEST(P2pResolver, ConnectAfterTheAppRejectedTheRequestSucceeds) {
  P2pResolver x(kSmall);
  x.handle_request(kToY, 9, kLarge, 1, kStart);
  drain(x);
  x.handle_request_rejected(9);
  expect_idle(x);
  EXPECT_TRUE(x.connect(kToY, 50, 7, kDeadline));
}

TEST(P2pResolver, ConnectRefusesAReusedAttemptIdOrLink) {
  P2pResolver x(kSmall);
  ASSERT_TRUE(x.connect(kToY, 50, 7, kDeadline));
  const P2pKey other{kToY.address, kToY.port, 99};
  EXPECT_EQ(x.connect(other, 50, 8, kDeadline).error(), std::errc::invalid_argument);
  EXPECT_EQ(x.connect(other, 51, 7, kDeadline).error(), std::errc::invalid_argument);
  EXPECT_EQ(x.connect(other, 51, 0, kDeadline).error(), std::errc::invalid_argument);
}

// ---------------------------------------------------------------------------------------------
// Rule 6: late duplicates and restarted peers

TEST(P2pResolver, LateDuplicateOfTheEstablishedConnectionIsRejected) {
  P2pResolver x(kSmall);
  establish_delivered(x, kLarge, 3);
  x.handle_request(kToY, 11, kLarge, 3, kStart);
  const P2pAction action = only_action(x);
  EXPECT_EQ(action.kind, Kind::reject_request);
  EXPECT_EQ(action.reason, P2pRejectReason::duplicate);
  EXPECT_EQ(x.established_link(kToY), std::optional<LinkId>(9));
  EXPECT_EQ(x.stats().rejected_duplicate, 1u);
}

// The passive peer's aborted request reaching the active peer after its attempt established:
// the accept Reply named the passive peer's CmId (its attempt, now on our link).
TEST(P2pResolver, PassivePeersAbortedRequestArrivingAfterEstablishmentIsADuplicate) {
  P2pResolver x(kLarge);
  ASSERT_TRUE(x.connect(kToX, 1, 7, kDeadline));
  x.handle_established(kToX, 7, kSmall.incarnation, 50);
  x.handle_request(kToX, 9, kSmall, 50, kStart);
  EXPECT_EQ(only_action(x).reason, P2pRejectReason::duplicate);
  // Without the peer's CmId every request of that incarnation is a duplicate (plain rule 6).
  P2pResolver plain(kLarge);
  ASSERT_TRUE(plain.connect(kToX, 1, 7, kDeadline));
  plain.handle_established(kToX, 7, kSmall.incarnation);
  plain.handle_request(kToX, 9, kSmall, 51, kStart);
  EXPECT_EQ(only_action(plain).reason, P2pRejectReason::duplicate);
}

TEST(P2pResolver, DuplicateOfARequestBeingAcceptedIsRejected) {
  P2pResolver x(kSmall);
  x.handle_request(kToY, 9, kLarge, 3, kStart);
  drain(x);
  x.handle_request(kToY, 11, kLarge, 3, kStart);  // same incarnation, same attempt, other link
  EXPECT_EQ(only_action(x).reason, P2pRejectReason::duplicate);
  x.handle_request(kToY, 12, kLarge, 2, kStart);  // an older attempt: a late copy
  EXPECT_EQ(only_action(x).reason, P2pRejectReason::duplicate);
  EXPECT_EQ(x.tracked_links(), 1u);
}

TEST(P2pResolver, DuplicateWhileBindingIsRejected) {
  P2pResolver x(kSmall);
  ASSERT_TRUE(x.connect(kToY, 50, 7, kDeadline));
  x.handle_request(kToY, 9, kLarge, 3, kStart);
  ASSERT_EQ(only_action(x).kind, Kind::accept_into_attempt);
  x.handle_request(kToY, 11, kLarge, 3, kStart);
  EXPECT_EQ(only_action(x).reason, P2pRejectReason::duplicate);
}

// The peer closed the connection and connected again (a newer CmId) before its close reached us.
TEST(P2pResolver, NewerAttemptOfTheSameIncarnationReplacesTheStaleConnection) {
  P2pResolver x(kSmall);
  establish_delivered(x, kLarge, 3);
  x.handle_request(kToY, 11, kLarge, 4, kStart);
  const auto actions = drain(x);
  ASSERT_EQ(actions.size(), 2u);
  EXPECT_EQ(actions[0].kind, Kind::teardown_link);
  EXPECT_EQ(actions[0].link, 9u);
  EXPECT_EQ(actions[1].kind, Kind::deliver_request);
  EXPECT_EQ(actions[1].link, 11u);
  EXPECT_EQ(x.stats().replaced_stale, 1u);
  x.handle_link_closed(9);  // the teardown's close: already forgotten
  EXPECT_EQ(x.tracked_links(), 1u);
}

TEST(P2pResolver, RestartedPeerReplacesTheEstablishedConnection) {
  P2pResolver x(kSmall);
  establish_delivered(x, kLarge, 3);
  const NodeIdentity restarted{.guid = kLarge.guid, .incarnation = kLarge.incarnation + 1};
  x.handle_request(kToY, 11, restarted, 1, kStart);  // its CmId counter started again
  const auto actions = drain(x);
  ASSERT_EQ(actions.size(), 2u);
  EXPECT_EQ(actions[0].kind, Kind::teardown_link);
  EXPECT_EQ(actions[0].link, 9u);
  EXPECT_EQ(actions[1].kind, Kind::deliver_request);
  EXPECT_EQ(x.stats().replaced_restarted, 1u);
  x.handle_request_accepted(11);
  x.handle_established(kToY, 11, restarted.incarnation);
  EXPECT_EQ(x.established_link(kToY), std::optional<LinkId>(11));
}

TEST(P2pResolver, RestartedPeerReplacesAnUndecidedRequest) {
  P2pResolver x(kSmall);
  x.handle_request(kToY, 9, kLarge, 3, kStart);
  drain(x);
  const NodeIdentity restarted{.guid = kLarge.guid, .incarnation = kLarge.incarnation + 1};
  x.handle_request(kToY, 11, restarted, 3, kStart);
  const auto actions = drain(x);
  ASSERT_EQ(actions.size(), 2u);
  EXPECT_EQ(actions[0].kind, Kind::teardown_link);
  EXPECT_EQ(actions[1].kind, Kind::deliver_request);
  EXPECT_EQ(x.tracked_links(), 1u);
}

TEST(P2pResolver, RestartedPeerWhileBindingMovesTheAttemptToItsRequest) {
  P2pResolver x(kSmall);
  ASSERT_TRUE(x.connect(kToY, 50, 7, kDeadline));
  x.handle_request(kToY, 9, kLarge, 3, kStart);
  drain(x);
  const NodeIdentity restarted{.guid = kLarge.guid, .incarnation = kLarge.incarnation + 1};
  x.handle_request(kToY, 11, restarted, 1, kStart);
  const P2pAction action = only_action(x);
  EXPECT_EQ(action.kind, Kind::accept_into_attempt);
  EXPECT_EQ(action.attempt, 50u);
  EXPECT_EQ(action.link, 11u);
  EXPECT_EQ(action.aborted_link, 9u);
  EXPECT_EQ(x.stats().replaced_restarted, 1u);
  EXPECT_EQ(x.tracked_links(), 1u);
}

// ---------------------------------------------------------------------------------------------
// Rule 8: deadlines

TEST(P2pResolver, AttemptFailsAtItsDeadlineInEveryState) {
  // requesting
  P2pResolver x(kSmall);
  ASSERT_TRUE(x.connect(kToY, 50, 7, kDeadline));
  EXPECT_EQ(x.next_deadline(), std::optional<Time>(kDeadline));
  x.handle_timeout(kDeadline - 1ns);
  EXPECT_TRUE(drain(x).empty());
  x.handle_timeout(kDeadline);
  P2pAction action = only_action(x);
  EXPECT_EQ(action.kind, Kind::attempt_failed);
  EXPECT_EQ(action.attempt, 50u);
  EXPECT_EQ(action.link, 7u);
  EXPECT_EQ(x.stats().attempts_timed_out, 1u);
  expect_idle(x);

  // lost
  ASSERT_TRUE(x.connect(kToY, 51, 8, kDeadline));
  x.handle_attempt_rejected_by_cm(51);
  x.handle_timeout(kDeadline);
  action = only_action(x);
  EXPECT_EQ(action.kind, Kind::attempt_failed);
  EXPECT_EQ(action.link, 0u);
  expect_idle(x);

  // binding: the bound link goes with it
  ASSERT_TRUE(x.connect(kToY, 52, 10, kDeadline));
  x.handle_request(kToY, 11, kLarge, 1, kStart);
  drain(x);
  x.handle_timeout(kDeadline + 1s);
  action = only_action(x);
  EXPECT_EQ(action.kind, Kind::attempt_failed);
  EXPECT_EQ(action.link, 11u);
  expect_idle(x);
}

TEST(P2pResolver, EarliestDeadlineIsReportedAndOverdueAttemptsBindNothing) {
  P2pResolver x(kSmall);
  const P2pKey other{kToY.address, kToY.port, 6};
  ASSERT_TRUE(x.connect(kToY, 50, 7, kStart + 5s));
  ASSERT_TRUE(x.connect(other, 51, 8, kStart + 2s));
  EXPECT_EQ(x.next_deadline(), std::optional<Time>(kStart + 2s));
  // A request arriving after attempt 51's deadline (the timer has not fired yet): 51 fails first
  // and the request is delivered.
  x.handle_request(other, 9, kLarge, 1, kStart + 3s);
  const auto actions = drain(x);
  ASSERT_EQ(actions.size(), 2u);
  EXPECT_EQ(actions[0].kind, Kind::attempt_failed);
  EXPECT_EQ(actions[0].attempt, 51u);
  EXPECT_EQ(actions[1].kind, Kind::deliver_request);
  EXPECT_EQ(x.next_deadline(), std::optional<Time>(kStart + 5s));
}

// ---------------------------------------------------------------------------------------------
// No leak

TEST(P2pResolver, NothingIsTrackedOnceEveryLinkClosedAndEveryAttemptEnded) {
  P2pResolver x(kSmall);
  // An established attempt, a delivered request, an accepted one, a bound attempt, an ended one.
  const P2pKey k1{1, 1, 1}, k2{2, 2, 2}, k3{3, 3, 3}, k4{4, 4, 4}, k5{5, 5, 5};
  ASSERT_TRUE(x.connect(k1, 1, 101, kDeadline));
  x.handle_established(k1, 101, 77, 9);
  x.handle_request(k2, 102, kLarge, 1, kStart);
  x.handle_request(k3, 103, kLarge, 2, kStart);
  x.handle_request_accepted(103);
  ASSERT_TRUE(x.connect(k4, 2, 104, kDeadline));
  x.handle_request(k4, 105, kLarge, 3, kStart);
  ASSERT_TRUE(x.connect(k5, 3, 106, kDeadline));
  drain(x);
  EXPECT_EQ(x.tracked_attempts(), 2u);
  EXPECT_EQ(x.tracked_links(), 5u);  // 101, 102, 103, 105, 106 (104 was aborted)
  x.handle_attempt_ended(3);          // e.g. the peer's application rejected it
  for (LinkId link : {101u, 102u, 103u, 104u, 105u, 106u}) x.handle_link_closed(link);
  EXPECT_EQ(x.tracked_links(), 0u);
  EXPECT_EQ(x.tracked_attempts(), 1u);  // attempt 2 waits for its deadline (lost)
  x.handle_attempt_ended(2);
  expect_idle(x);
}

TEST(P2pResolver, ClosedLinksAndUnknownIdsAreIgnored) {
  P2pResolver x(kSmall);
  x.handle_link_closed(42);
  x.handle_request_accepted(42);
  x.handle_request_rejected(42);
  x.handle_attempt_ended(42);
  x.handle_attempt_rejected_by_cm(42);
  x.handle_established(kToY, 42, 1);
  EXPECT_TRUE(drain(x).empty());
  expect_idle(x);
}

TEST(P2pResolver, OwnLoopedBackRequestIsDeliveredUntracked) {
  P2pResolver x(kSmall);
  ASSERT_TRUE(x.connect(kToX, 1, 7, kDeadline));
  x.handle_request(kToX, 8, kSmall, 1, kStart);
  EXPECT_EQ(only_action(x).kind, Kind::deliver_request);
  EXPECT_EQ(x.tracked_links(), 1u);
}

// R5 refined (docs/p2p.md, Rules): a delivered request the application has not fetched is taken
// back and meets the new attempt under R3. The larger sender wins: the attempt is bound to it
// at once and never dials.
TEST(P2pResolver, UnseenRequestOfTheLargerNodeBindsTheAttemptWithoutDialling) {
  P2pResolver x(kSmall);
  x.handle_request(kToY, 101, kLarge, 9, kStart);
  ASSERT_EQ(only_action(x).kind, Kind::deliver_request);
  LinkId asked = 0;
  ASSERT_TRUE(x.connect(kToY, 3, 7, kDeadline, kStart, [&](LinkId link) {
    asked = link;
    return true;
  }));
  EXPECT_EQ(asked, 101u);
  const P2pAction bind = only_action(x);
  EXPECT_EQ(bind.kind, Kind::accept_into_attempt);
  EXPECT_EQ(bind.link, 101u);
  EXPECT_EQ(bind.attempt, 3u);
  EXPECT_EQ(bind.aborted_link, 7u);
  EXPECT_FALSE(x.attempt_dials(3, 7));
  EXPECT_EQ(x.stats().delivered, 0u);  // it never reached the application
  x.handle_established(kToY, 101, kLarge.incarnation);
  EXPECT_EQ(x.established_link(kToY), 101u);
}

// The smaller sender loses: our request goes out and the taken-back request is held (R3).
TEST(P2pResolver, UnseenRequestOfTheSmallerNodeIsHeldAndTheAttemptDials) {
  P2pResolver x(kLarge);
  x.handle_request(kToY, 101, kSmall, 9, kStart);
  ASSERT_EQ(only_action(x).kind, Kind::deliver_request);
  ASSERT_TRUE(x.connect(kToY, 3, 7, kDeadline, kStart, [](LinkId) { return true; }));
  EXPECT_TRUE(drain(x).empty());
  EXPECT_TRUE(x.attempt_dials(3, 7));
  EXPECT_EQ(x.tracked_links(), 2u);
  x.handle_established(kToY, 7, kSmall.incarnation, 9);
  const P2pAction reject = only_action(x);
  EXPECT_EQ(reject.kind, Kind::reject_request);
  EXPECT_EQ(reject.link, 101u);
  EXPECT_EQ(reject.reason, P2pRejectReason::collision);
}

// A request the application has fetched stands: EALREADY, and nothing changes.
TEST(P2pResolver, FetchedRequestKeepsConnectEalready) {
  P2pResolver x(kSmall);
  x.handle_request(kToY, 101, kLarge, 9, kStart);
  ASSERT_EQ(only_action(x).kind, Kind::deliver_request);
  auto refused = x.connect(kToY, 3, 7, kDeadline, kStart, [](LinkId) { return false; });
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error(), std::errc::connection_already_in_progress);
  EXPECT_EQ(x.tracked_attempts(), 0u);
  EXPECT_EQ(x.stats().delivered, 1u);
  x.handle_request_accepted(101);
  x.handle_established(kToY, 101, kLarge.incarnation);
  EXPECT_EQ(x.established_link(kToY), 101u);
}

// ---------------------------------------------------------------------------------------------
// R5b: a connect to a key whose connection may be stale waits on a check of that connection

// Checks the link it is asked about, and remembers it.
struct Checker {
  std::vector<LinkId> asked;
  bool can_check = true;
  P2pResolver::CheckLink function() {
    return [this](LinkId link) {
      asked.push_back(link);
      return can_check;
    };
  }
};

// x holds an established connection on link 9 to the peer `peer` (its CmId 3), and attempt 50
// (own link 7 if it dials) waits on the check of link 9.
void start_check(P2pResolver& x, Checker& checker, const NodeIdentity& peer) {
  establish_delivered(x, peer, 3);
  ASSERT_TRUE(x.connect(kToY, 50, 7, kDeadline, kStart, {}, checker.function()));
  ASSERT_EQ(checker.asked, std::vector<LinkId>{9});
  EXPECT_TRUE(drain(x).empty());
  EXPECT_FALSE(x.attempt_dials(50, 7));
  EXPECT_EQ(x.established_link(kToY), std::optional<LinkId>(9));  // still the connection
  EXPECT_EQ(x.next_deadline(), std::optional<Time>(kDeadline));
}

TEST(P2pResolver, ConnectToAnEstablishedKeyIsEisconnAtOnceUnlessTheTransportChecksIt) {
  P2pResolver x(kSmall);
  establish_delivered(x, kLarge, 3);
  // No checker (iWARP): rule 5 as ever.
  EXPECT_EQ(x.connect(kToY, 50, 7, kDeadline, kStart, {}).error(), std::errc::already_connected);
  // A checker that cannot check this connection (no QP, no ACK timeout): the same.
  Checker unable{.can_check = false};
  EXPECT_EQ(x.connect(kToY, 50, 7, kDeadline, kStart, {}, unable.function()).error(), std::errc::already_connected);
  EXPECT_EQ(unable.asked, std::vector<LinkId>{9});
  EXPECT_EQ(x.tracked_attempts(), 0u);
  EXPECT_FALSE(x.next_deadline().has_value());
  // One that can: the attempt waits, and a second connect meanwhile finds it pending.
  Checker checker;
  ASSERT_TRUE(x.connect(kToY, 50, 7, kDeadline, kStart, {}, checker.function()));
  EXPECT_EQ(x.tracked_attempts(), 1u);
  EXPECT_EQ(x.stats().links_checked, 1u);
  EXPECT_EQ(x.connect(kToY, 51, 8, kDeadline, kStart, {}, checker.function()).error(),
            std::errc::connection_already_in_progress);
  EXPECT_EQ(checker.asked.size(), 1u);
}

// Outcome (a): the restarted peer's REQ arrives while the attempt waits. The stale link goes
// first, then the attempt takes the request whatever the GUIDs (it sent nothing to collide).
TEST(P2pResolver, RestartedPeersRequestWhileCheckingEndsTheStaleLinkAndBindsTheWaitingAttempt) {
  for (const bool local_larger : {false, true}) {
    SCOPED_TRACE(local_larger ? "local GUID larger" : "local GUID smaller");
    P2pResolver x(local_larger ? kLarge : kSmall);
    const NodeIdentity peer = local_larger ? kSmall : kLarge;
    Checker checker;
    start_check(x, checker, peer);
    const NodeIdentity restarted{.guid = peer.guid, .incarnation = peer.incarnation + 1};
    x.handle_request(kToY, 11, restarted, 1, kStart);  // its CmId counter started again
    const auto actions = drain(x);
    ASSERT_EQ(actions.size(), 2u);
    EXPECT_EQ(actions[0].kind, Kind::teardown_link);  // DISCONNECTED on the old CmId first
    EXPECT_EQ(actions[0].link, 9u);
    EXPECT_EQ(actions[1].kind, Kind::accept_into_attempt);
    EXPECT_EQ(actions[1].attempt, 50u);
    EXPECT_EQ(actions[1].link, 11u);
    EXPECT_EQ(actions[1].aborted_link, 0u);  // the attempt never dialled
    EXPECT_EQ(x.stats().replaced_restarted, 1u);
    EXPECT_EQ(x.stats().delivered, 1u);  // only the first connection's request
    x.handle_link_closed(9);              // the teardown's close changes nothing
    x.handle_link_alive(9);               // nor a late answer of the old link
    EXPECT_TRUE(drain(x).empty());
    x.handle_established(kToY, 11, restarted.incarnation);
    EXPECT_EQ(x.established_link(kToY), std::optional<LinkId>(11));
    EXPECT_EQ(x.tracked_attempts(), 0u);
    EXPECT_EQ(x.tracked_links(), 1u);
    EXPECT_FALSE(x.next_deadline().has_value());
  }
}

TEST(P2pResolver, LateDuplicateWhileCheckingIsRejectedAndTheCheckGoesOn) {
  P2pResolver x(kSmall);
  Checker checker;
  start_check(x, checker, kLarge);
  x.handle_request(kToY, 11, kLarge, 3, kStart);  // the established connection's request again
  const P2pAction action = only_action(x);
  EXPECT_EQ(action.kind, Kind::reject_request);
  EXPECT_EQ(action.reason, P2pRejectReason::duplicate);
  EXPECT_EQ(x.established_link(kToY), std::optional<LinkId>(9));
  x.handle_link_alive(9);
  EXPECT_EQ(only_action(x).kind, Kind::attempt_already_connected);
}

// Outcome (b): the connection answers: the peer is the incarnation we know, rule 5 stands.
TEST(P2pResolver, ConnectionThatAnswersItsCheckEndsTheAttemptWithEisconn) {
  P2pResolver x(kSmall);
  Checker checker;
  start_check(x, checker, kLarge);
  x.handle_link_alive(10);  // another link: nothing
  EXPECT_TRUE(drain(x).empty());
  x.handle_link_alive(9);
  const P2pAction action = only_action(x);
  EXPECT_EQ(action.kind, Kind::attempt_already_connected);
  EXPECT_EQ(action.attempt, 50u);
  EXPECT_EQ(action.link, 9u);
  EXPECT_EQ(x.stats().checks_alive, 1u);
  EXPECT_EQ(x.established_link(kToY), std::optional<LinkId>(9));
  EXPECT_EQ(x.tracked_attempts(), 0u);
  EXPECT_FALSE(x.next_deadline().has_value());
  x.handle_link_alive(9);  // answered once only
  EXPECT_TRUE(drain(x).empty());
  // The connection is what it was: a later request of the peer is still a duplicate, and a
  // later connect is checked again.
  x.handle_request(kToY, 11, kLarge, 2, kStart);
  EXPECT_EQ(only_action(x).kind, Kind::reject_request);
  ASSERT_TRUE(x.connect(kToY, 51, 8, kDeadline, kStart, {}, checker.function()));
  EXPECT_EQ(checker.asked.size(), 2u);
}

// Outcome (c): the connection ends (probe unanswered, port unreachable, DREQ, the application)
// before any new request: the attempt goes on as a fresh connect on its own link.
TEST(P2pResolver, ConnectionThatEndsDuringItsCheckLetsTheAttemptDial) {
  P2pResolver x(kSmall);
  Checker checker;
  start_check(x, checker, kLarge);
  x.handle_link_closed(9);
  const P2pAction action = only_action(x);
  EXPECT_EQ(action.kind, Kind::dial_attempt);
  EXPECT_EQ(action.attempt, 50u);
  EXPECT_EQ(action.link, 7u);
  EXPECT_TRUE(x.attempt_dials(50, 7));
  EXPECT_FALSE(x.established_link(kToY).has_value());
  // From here it is an ordinary attempt: the restarted peer's request collides under rule 3
  // (its GUID is the larger: the attempt is bound to it, its own link aborted).
  const NodeIdentity restarted{.guid = kLarge.guid, .incarnation = kLarge.incarnation + 1};
  x.handle_request(kToY, 11, restarted, 1, kStart);
  const P2pAction bound = only_action(x);
  EXPECT_EQ(bound.kind, Kind::accept_into_attempt);
  EXPECT_EQ(bound.aborted_link, 7u);
  x.handle_established(kToY, 11, restarted.incarnation);
  EXPECT_EQ(x.established_link(kToY), std::optional<LinkId>(11));
  EXPECT_EQ(x.tracked_attempts(), 0u);
}

TEST(P2pResolver, ConnectionThatEndsDuringItsCheckLetsTheAttemptEstablishOnItsOwnRequest) {
  P2pResolver x(kSmall);
  Checker checker;
  start_check(x, checker, kLarge);
  x.handle_link_closed(9);
  ASSERT_EQ(only_action(x).kind, Kind::dial_attempt);
  x.handle_established(kToY, 7, kLarge.incarnation + 1, 1);
  EXPECT_EQ(x.established_link(kToY), std::optional<LinkId>(7));
  EXPECT_EQ(x.tracked_attempts(), 0u);
  EXPECT_FALSE(x.next_deadline().has_value());
}

// Rule 8 bounds the wait; the connection the attempt waited on is not the attempt's to close.
TEST(P2pResolver, CheckingAttemptFailsAtItsDeadlineAndTheConnectionStays) {
  P2pResolver x(kSmall);
  Checker checker;
  start_check(x, checker, kLarge);
  x.handle_timeout(kDeadline - 1ns);
  EXPECT_TRUE(drain(x).empty());
  x.handle_timeout(kDeadline);
  const P2pAction action = only_action(x);
  EXPECT_EQ(action.kind, Kind::attempt_failed);
  EXPECT_EQ(action.attempt, 50u);
  EXPECT_EQ(action.link, 0u);
  EXPECT_EQ(x.established_link(kToY), std::optional<LinkId>(9));
  EXPECT_EQ(x.tracked_attempts(), 0u);
  x.handle_link_closed(9);  // later: the key is free, nothing dials
  EXPECT_TRUE(drain(x).empty());
  expect_idle(x);
}

TEST(P2pResolver, CheckingAttemptEndedByTheApplicationLeavesTheConnection) {
  P2pResolver x(kSmall);
  Checker checker;
  start_check(x, checker, kLarge);
  x.handle_attempt_ended(50);
  EXPECT_TRUE(drain(x).empty());
  EXPECT_EQ(x.established_link(kToY), std::optional<LinkId>(9));
  EXPECT_EQ(x.tracked_attempts(), 0u);
  EXPECT_FALSE(x.next_deadline().has_value());
  x.handle_link_alive(9);
  EXPECT_TRUE(drain(x).empty());
}

}  // namespace
}  // namespace peercm::core
