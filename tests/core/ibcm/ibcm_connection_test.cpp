// IbCmConnection alone: two connections wired back to back (every MAD decoded and handed to
// the other's handler), checking states, timers and answers of roce-ibcm-wire.md §4.9.
#include "core/ibcm/ibcm_connection.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <variant>
#include <vector>

#include "ibcm_fabric.hpp"

namespace peercm::core::ibcm::test {
namespace {

using Kind = IbCmEvent::Kind;

struct Pair : ::testing::Test {
  Time now = Time{} + 1s;
  IbCmConnection active{0x11, 0xAAAA, fast_timing(), 1};
  IbCmConnection passive{0x22, 0xBBBB, fast_timing(), 2};
  std::vector<IbCmEvent> active_events;
  std::vector<IbCmEvent> passive_events;
  std::vector<w::CmAttribute> to_passive;  // what the active side sent, in order
  std::vector<w::CmAttribute> to_active;
  bool drop = false;

  static void deliver(IbCmConnection& c, const OutboundMad& mad, Time now) {
    auto decoded = w::decode_cm_mad(mad.bytes);
    ASSERT_TRUE(decoded.has_value());
    const std::uint64_t tid = decoded->transaction_id;
    std::visit(
        [&](const auto& m) {
          using M = std::decay_t<decltype(m)>;
          if constexpr (std::is_same_v<M, w::CmReq>) c.handle_req(m, tid, now);
          if constexpr (std::is_same_v<M, w::CmRep>) c.handle_rep(m, now);
          if constexpr (std::is_same_v<M, w::CmRtu>) c.handle_rtu(m, now);
          if constexpr (std::is_same_v<M, w::CmRej>) c.handle_rej(m, now);
          if constexpr (std::is_same_v<M, w::CmMra>) c.handle_mra(m, now);
          if constexpr (std::is_same_v<M, w::CmDreq>) c.handle_dreq(m, tid, now);
          if constexpr (std::is_same_v<M, w::CmDrep>) c.handle_drep(m, now);
        },
        decoded->message);
  }

  // Exchanges MADs until both are silent.
  void flow() {
    for (bool moved = true; moved;) {
      moved = false;
      while (auto mad = active.poll_mad()) {
        to_passive.push_back(attribute(*mad));
        if (!drop) deliver(passive, *mad, now);
        moved = true;
      }
      while (auto mad = passive.poll_mad()) {
        to_active.push_back(attribute(*mad));
        if (!drop) deliver(active, *mad, now);
        moved = true;
      }
    }
    while (auto e = active.poll_event()) active_events.push_back(*e);
    while (auto e = passive.poll_event()) passive_events.push_back(*e);
  }
  void advance(Duration d) {
    const Time until = now + d;
    for (;;) {
      std::optional<Time> next = active.next_deadline();
      if (auto p = passive.next_deadline(); p && (!next || *p < *next)) next = p;
      if (!next || *next > until) break;
      now = *next;
      active.handle_timeout(now);
      passive.handle_timeout(now);
      flow();
    }
    now = until;
  }
  IbCmRequestParams request(bool confirm = false) {
    return {.service_id = 0x01061D2F,
            .qpn = 0x101,
            .starting_psn = 0x5000,
            .local_gid = w::ipv4_mapped_gid({10, 0, 0, 1}),
            .remote_gid = w::ipv4_mapped_gid({10, 0, 0, 2}),
            .confirm_reply = confirm,
            .private_data = {1, 2, 3}};
  }
};

TEST_F(Pair, StatesThroughEstablishmentAndRelease) {
  ASSERT_TRUE(active.connect(request(), now));
  EXPECT_EQ(active.state(), IbCmState::req_sent);
  EXPECT_FALSE(active.connect(request(), now));  // once
  flow();
  EXPECT_EQ(passive.state(), IbCmState::req_rcvd);
  ASSERT_EQ(passive_events.size(), 1u);
  EXPECT_EQ(passive_events[0].kind, Kind::request_received);
  EXPECT_EQ(passive.peer().qpn, 0x101u);
  EXPECT_EQ(passive.peer().starting_psn, 0x5000u);
  EXPECT_EQ(passive.peer_private_data()[2], 3);
  ASSERT_TRUE(passive.accept({.qpn = 0x202, .starting_psn = 0x6000}, now));
  flow();
  EXPECT_EQ(active.state(), IbCmState::established);
  EXPECT_EQ(passive.state(), IbCmState::established);
  EXPECT_EQ(active.peer().comm_id, 0x22u);
  EXPECT_EQ(active.peer().qpn, 0x202u);
  EXPECT_EQ(passive.peer().comm_id, 0x11u);
  EXPECT_FALSE(active.next_deadline().has_value());
  ASSERT_TRUE(passive.disconnect({}, now));
  flow();
  EXPECT_EQ(active.state(), IbCmState::timewait);
  EXPECT_EQ(passive.state(), IbCmState::timewait);
  advance(1s);
  EXPECT_TRUE(active.finished());
  EXPECT_TRUE(passive.finished());
  EXPECT_EQ(active_events.back().kind, Kind::timewait_exit);
}

// §4.9 REP_RCVD: a slow consumer on the active side MRAs the REP; the passive side waits.
TEST_F(Pair, ConfirmedReplyWithMraRep) {
  ASSERT_TRUE(active.connect(request(true), now));
  flow();
  ASSERT_TRUE(passive.accept({.qpn = 0x202}, now));
  flow();
  EXPECT_EQ(active.state(), IbCmState::rep_rcvd);
  ASSERT_FALSE(active_events.empty());
  EXPECT_EQ(active_events.back().kind, Kind::reply_received);
  advance(6ms);  // half our local CM response timeout (≈ 4.2 ms) → MRA
  EXPECT_EQ(active.state(), IbCmState::mra_rep_sent);
  EXPECT_EQ(passive.state(), IbCmState::mra_rep_rcvd);
  advance(60ms);  // the passive side waits service timeout + lifetime (≈ 135 ms): no REP resend
  EXPECT_EQ(std::count(to_active.begin(), to_active.end(), w::CmAttribute::rep), 1);
  ASSERT_TRUE(active.accept({.private_data = {9}}, now));
  flow();
  EXPECT_EQ(active.state(), IbCmState::established);
  EXPECT_EQ(passive.state(), IbCmState::established);
  EXPECT_EQ(passive_events.back().kind, Kind::established);
  EXPECT_EQ(passive_events.back().private_data[0], 9);
}

TEST_F(Pair, RejectingAConfirmedReplyEndsBoth) {
  ASSERT_TRUE(active.connect(request(true), now));
  flow();
  ASSERT_TRUE(passive.accept({.qpn = 0x202}, now));
  flow();
  ASSERT_TRUE(active.reject(w::rej_reason::kConsumerReject, {}, now));
  flow();
  EXPECT_TRUE(active.finished());
  EXPECT_TRUE(passive.finished());
  EXPECT_EQ(passive_events.back().kind, Kind::rejected);
  EXPECT_EQ(passive_events.back().state, IbCmState::rep_sent);
}

TEST_F(Pair, DreqRetriesRunOutIntoTimewait) {
  ASSERT_TRUE(active.connect(request(), now));
  flow();
  ASSERT_TRUE(passive.accept({.qpn = 0x202}, now));
  flow();
  drop = true;
  ASSERT_TRUE(active.disconnect({}, now));
  flow();
  advance(45ms);  // four DREQs ≈ 10.5 ms apart, then TIMEWAIT (≈ 33.5 ms)
  EXPECT_EQ(std::count(to_passive.begin(), to_passive.end(), w::CmAttribute::dreq), 1 + 3);
  EXPECT_EQ(active.state(), IbCmState::timewait);
  EXPECT_EQ(active_events.back().kind, Kind::disconnected);
}

TEST_F(Pair, DuplicateReqInTimewaitGetsStaleRej) {
  ASSERT_TRUE(active.connect(request(), now));
  std::optional<OutboundMad> req = active.poll_mad();
  ASSERT_TRUE(req.has_value());
  deliver(passive, *req, now);
  flow();
  ASSERT_TRUE(passive.accept({.qpn = 0x202}, now));
  flow();
  ASSERT_TRUE(passive.disconnect({}, now));
  flow();
  ASSERT_EQ(passive.state(), IbCmState::timewait);
  to_active.clear();
  deliver(passive, *req, now);  // a late copy of the REQ
  flow();
  ASSERT_EQ(to_active.size(), 1u);
  EXPECT_EQ(to_active[0], w::CmAttribute::rej);
}

TEST_F(Pair, DreqNamingAnotherQpnIsIgnored) {
  ASSERT_TRUE(active.connect(request(), now));
  flow();
  ASSERT_TRUE(passive.accept({.qpn = 0x202}, now));
  flow();
  passive.handle_dreq({.local_comm_id = 0x11, .remote_comm_id = 0x22, .remote_qpn = 0x999}, 7, now);
  EXPECT_EQ(passive.state(), IbCmState::established);
  EXPECT_FALSE(passive.poll_mad().has_value());
}

TEST_F(Pair, FieldsThatDoNotFitAreRefused) {
  IbCmRequestParams params = request();
  params.qpn = 0x1000000;
  EXPECT_FALSE(active.connect(params, now));
  params = request();
  params.private_data.assign(93, 0);
  EXPECT_FALSE(active.connect(params, now));
  EXPECT_EQ(active.state(), IbCmState::idle);
  EXPECT_FALSE(active.finished());
}

}  // namespace
}  // namespace peercm::core::ibcm::test
