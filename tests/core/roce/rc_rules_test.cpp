// The RC rules one at a time, on a wire the test drives by hand: segmentation and AckReq,
// ACK coalescing, PSN wrap, sequence-error NAK, RNR NAK and rnr_retry, retry exhaustion,
// remote access errors, READ retry and replay, ORD/IRD, Fence, duplicates, ICRC, flushing.
#include <arpa/inet.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>

#include "rc_test_support.hpp"
#include "wire/roce/psn.hpp"

namespace peercm::core::roce::test {
namespace {

using O = w::Opcode;

std::vector<w::PacketView> views(const std::vector<Bytes>& datagrams) {
  std::vector<w::PacketView> out;
  for (const Bytes& d : datagrams) out.push_back(Wire::view(d));
  return out;
}

TEST(RcRules, SegmentsAtPmtuWithAckRequestOnTheLastPacket) {
  Wire wire;  // PMTU 256
  Mr src = wire.a.reg(1000);
  Mr dst = wire.b.reg(1000);
  fill_pattern(src.bytes(0, 650), 1);
  ASSERT_TRUE(wire.b.recv(1, {dst.sge(0, 1000)}));
  ASSERT_TRUE(wire.a.post(7, WrOpcode::send, {src.sge(0, 300), src.sge(300, 350)}));
  const auto out = wire.drain(0);
  const auto v = views(out);
  ASSERT_EQ(v.size(), 3u);
  EXPECT_EQ(v[0].headers.bth.opcode, O::rc_send_first);
  EXPECT_EQ(v[1].headers.bth.opcode, O::rc_send_middle);
  EXPECT_EQ(v[2].headers.bth.opcode, O::rc_send_last);
  EXPECT_EQ(v[0].payload.size(), 256u);
  EXPECT_EQ(v[1].payload.size(), 256u);
  EXPECT_EQ(v[2].payload.size(), 138u);
  EXPECT_EQ(v[2].headers.bth.pad_count, 2);
  EXPECT_FALSE(v[0].headers.bth.ack_request);
  EXPECT_FALSE(v[1].headers.bth.ack_request);
  EXPECT_TRUE(v[2].headers.bth.ack_request);
  for (std::uint32_t i = 0; i < 3; ++i) {
    EXPECT_EQ(v[i].headers.bth.psn, 100 + i);
    EXPECT_EQ(v[i].headers.bth.destination_qp, 0x22u);
    EXPECT_EQ(v[i].headers.bth.partition_key, 0xFFFF);
  }
  for (const Bytes& d : out) wire.deliver(1, d);
  const auto acks = wire.drain(1);
  ASSERT_EQ(acks.size(), 1u);
  const auto ack = Wire::view(acks[0]);
  EXPECT_EQ(ack.headers.bth.opcode, O::rc_acknowledge);
  EXPECT_EQ(ack.headers.bth.psn, 102u);
  EXPECT_EQ(ack.headers.aeth.kind, w::AethKind::ack);
  EXPECT_EQ(ack.headers.aeth.msn, 1u);
  wire.deliver(0, acks[0]);
  ASSERT_EQ(wire.a.scq.wcs.size(), 1u);
  EXPECT_EQ(wire.a.scq.wcs[0].status, WcStatus::success);
  EXPECT_EQ(wire.a.scq.wcs[0].byte_len, 650u);
  ASSERT_EQ(wire.b.rcq.wcs.size(), 1u);
  EXPECT_EQ(wire.b.rcq.wcs[0].byte_len, 650u);
  EXPECT_TRUE(has_pattern(dst.bytes(0, 650), 1));
}

// verbs' RTR then RTS: B's responder runs from a connect() whose send PSN is a placeholder
// (it answers A while its requester waits), and set_requester() gives the RTS's PSN before
// B's first request; once B has sent, its requester can no longer be replaced.
TEST(RcRules, RequesterSetAfterTheResponderRanStartsAtTheRtsPsn) {
  PairParams params = pair_params(100, 0);
  params.a.recv_psn = 5000;  // A's RTR names the PSN B's RTS will bring
  Wire wire(params);
  Mr a_buf = wire.a.reg(64);
  Mr b_buf = wire.b.reg(64);
  ASSERT_TRUE(wire.b.recv(1, {b_buf.sge(0, 64)}));
  fill_pattern(a_buf.bytes(0, 32), 3);
  ASSERT_TRUE(wire.a.post(1, WrOpcode::send, {a_buf.sge(0, 32)}));
  wire.run();
  ASSERT_EQ(wire.a.scq.wcs.size(), 1u);
  EXPECT_EQ(wire.a.scq.wcs[0].status, WcStatus::success);  // B acknowledged from "RTR"
  ASSERT_EQ(wire.b.rcq.wcs.size(), 1u);
  EXPECT_TRUE(has_pattern(b_buf.bytes(0, 32), 3));

  ASSERT_TRUE(wire.b.qp.set_requester(RcRequesterParams{.send_psn = 5000, .local_ack_timeout = 12}));
  ASSERT_TRUE(wire.a.recv(2, {a_buf.sge(32, 32)}));
  ASSERT_TRUE(wire.b.post(2, WrOpcode::send, {b_buf.sge(0, 8)}));
  const auto out = wire.drain(1);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(Wire::view(out[0]).headers.bth.psn, 5000u);
  wire.deliver(0, out[0]);
  wire.run();
  ASSERT_EQ(wire.b.scq.wcs.size(), 1u);
  EXPECT_EQ(wire.b.scq.wcs[0].status, WcStatus::success);  // A expected PSN 5000
  ASSERT_EQ(wire.a.rcq.wcs.size(), 1u);
  EXPECT_EQ(wire.a.rcq.wcs[0].byte_len, 8u);
  EXPECT_EQ(wire.b.qp.set_requester(RcRequesterParams{.send_psn = 7}).error(), std::errc::invalid_argument);
}

TEST(RcRules, RequesterValuesOutsideTheirWireWidthsAreRefused) {
  Wire wire;
  EXPECT_EQ(wire.b.qp.set_requester(RcRequesterParams{.send_psn = 1u << 24}).error(), std::errc::invalid_argument);
  EXPECT_EQ(wire.b.qp.set_requester(RcRequesterParams{.retry_cnt = 8}).error(), std::errc::invalid_argument);
  Node alone(9);
  EXPECT_EQ(alone.qp.set_requester(RcRequesterParams{}).error(), std::errc::not_connected);
}

TEST(RcRules, ZeroLengthSendIsOneOnlyPacket) {
  Wire wire;
  Mr dst = wire.b.reg(16);
  ASSERT_TRUE(wire.b.recv(1, {dst.sge(0, 16)}));
  ASSERT_TRUE(wire.a.post(1, WrOpcode::send, {}));
  const auto out = wire.drain(0);
  ASSERT_EQ(out.size(), 1u);
  const auto v = Wire::view(out[0]);
  EXPECT_EQ(v.headers.bth.opcode, O::rc_send_only);
  EXPECT_TRUE(v.payload.empty());
  EXPECT_TRUE(v.headers.bth.ack_request);
  wire.deliver(1, out[0]);
  wire.settle();
  ASSERT_EQ(wire.b.rcq.wcs.size(), 1u);
  EXPECT_EQ(wire.b.rcq.wcs[0].byte_len, 0u);
  ASSERT_EQ(wire.a.scq.wcs.size(), 1u);
  EXPECT_EQ(wire.a.scq.wcs[0].status, WcStatus::success);
}

TEST(RcRules, AcksCoalesceUpToTheNewestPsn) {
  Wire wire;
  Mr src = wire.a.reg(64);
  Mr dst = wire.b.reg(64 * 5);
  for (std::size_t i = 0; i < 5; ++i) ASSERT_TRUE(wire.b.recv(10 + i, {dst.sge(i * 64, 64)}));
  for (std::size_t i = 0; i < 5; ++i) ASSERT_TRUE(wire.a.post(i, WrOpcode::send, {src.sge(0, 10)}));
  const auto out = wire.drain(0);
  ASSERT_EQ(out.size(), 5u);
  for (const Bytes& d : out) wire.deliver(1, d);  // all arrive before the responder sends
  const auto acks = views(wire.drain(1));
  ASSERT_EQ(acks.size(), 1u);
  EXPECT_EQ(acks[0].headers.bth.psn, 104u);
  EXPECT_EQ(acks[0].headers.aeth.msn, 5u);
}

TEST(RcRules, OneCoalescedAckCompletesEveryCoveredWr) {
  Wire wire;
  Mr src = wire.a.reg(64);
  Mr dst = wire.b.reg(64 * 5);
  for (std::size_t i = 0; i < 5; ++i) ASSERT_TRUE(wire.b.recv(10 + i, {dst.sge(i * 64, 64)}));
  for (std::size_t i = 0; i < 5; ++i) ASSERT_TRUE(wire.a.post(i, WrOpcode::send, {src.sge(0, 10)}));
  for (const Bytes& d : wire.drain(0)) wire.deliver(1, d);
  const auto acks = wire.drain(1);
  ASSERT_EQ(acks.size(), 1u);
  wire.deliver(0, acks[0]);
  ASSERT_EQ(wire.a.scq.wcs.size(), 5u);
  for (std::size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(wire.a.scq.wcs[i].wr_id, static_cast<std::uint64_t>(i));
    EXPECT_EQ(wire.a.scq.wcs[i].status, WcStatus::success);
  }
  EXPECT_EQ(wire.a.qp.next_deadline(), std::nullopt);  // nothing outstanding: no timer
}

TEST(RcRules, ResponderAcksLongMessagesAtABoundWithoutAckRequest) {
  Wire wire;
  Mr src = wire.a.reg(40 * 256);
  Mr dst = wire.b.reg(40 * 256);
  ASSERT_TRUE(wire.b.recv(1, {dst.sge(0, 40 * 256)}));
  ASSERT_TRUE(wire.a.post(1, WrOpcode::send, {src.sge(0, 40 * 256)}));
  const auto out = wire.drain(0);
  ASSERT_EQ(out.size(), 40u);
  std::vector<std::uint32_t> ack_request_psns;
  for (const auto& v : views(out))
    if (v.headers.bth.ack_request) ack_request_psns.push_back(v.headers.bth.psn);
  // Every 32nd packet and the last (§2.5).
  EXPECT_EQ(ack_request_psns, (std::vector<std::uint32_t>{131, 139}));
  std::vector<std::uint32_t> ack_psns;
  for (const Bytes& d : out) {
    wire.deliver(1, d);
    for (const auto& v : views(wire.drain(1))) ack_psns.push_back(v.headers.bth.psn);
  }
  // At least every 16 requests; AckReq and the message end on top.
  EXPECT_EQ(ack_psns, (std::vector<std::uint32_t>{115, 131, 139}));
}

TEST(RcRules, PsnsWrapAround2To24InBothDirections) {
  Wire wire(pair_params(w::kPsnMask - 2, w::kPsnMask - 1));
  std::vector<std::uint32_t> psns_from_a;
  wire.filter = [&](int from, const w::PacketView& v) {
    if (from == 0 && w::is_request(v.headers.bth.opcode)) psns_from_a.push_back(v.headers.bth.psn);
    return true;
  };
  Mr a_src = wire.a.reg(4096);
  Mr a_dst = wire.a.reg(4096);
  Mr b_src = wire.b.reg(4096);
  Mr b_dst = wire.b.reg(4096);
  fill_pattern(a_src.bytes(0, 4096), 11);
  fill_pattern(b_src.bytes(0, 4096), 22);
  ASSERT_TRUE(wire.b.recv(1, {b_dst.sge(0, 1200)}));
  ASSERT_TRUE(wire.a.recv(2, {a_dst.sge(0, 600)}));
  ASSERT_TRUE(wire.a.post(1, WrOpcode::send, {a_src.sge(0, 1200)}));                                 // 5 PSNs
  ASSERT_TRUE(wire.a.post(2, WrOpcode::rdma_write, {a_src.sge(0, 700)}, 0, b_dst.addr + 2000, b_dst.key));  // 3
  ASSERT_TRUE(wire.a.post(3, WrOpcode::rdma_read, {a_dst.sge(1000, 900)}, 0, b_src.addr, b_src.key));      // 4
  ASSERT_TRUE(wire.b.post(4, WrOpcode::send, {b_src.sge(0, 600)}));
  wire.run();
  ASSERT_EQ(wire.a.scq.wcs.size(), 3u);
  for (const auto& wc : wire.a.scq.wcs) EXPECT_EQ(wc.status, WcStatus::success);
  ASSERT_EQ(wire.b.scq.wcs.size(), 1u);
  EXPECT_EQ(wire.b.scq.wcs[0].status, WcStatus::success);
  EXPECT_TRUE(has_pattern(b_dst.bytes(0, 1200), 11));
  EXPECT_TRUE(has_pattern(b_dst.bytes(2000, 700), 11));
  EXPECT_TRUE(has_pattern(a_dst.bytes(1000, 900), 22));
  EXPECT_TRUE(has_pattern(a_dst.bytes(0, 600), 22));
  // FFFFFD FFFFFE FFFFFF 0 1 (send), 2 3 4 (write), 5 (read, 4 PSNs)
  EXPECT_EQ(psns_from_a, (std::vector<std::uint32_t>{0xFFFFFD, 0xFFFFFE, 0xFFFFFF, 0, 1, 2, 3, 4, 5}));
}

// `count` 16-byte Sends from a, patterned from `seed` on, each into a 64-byte receive of b's
// own (wr_id 10 + i): the packets a sends for them.
std::vector<Bytes> post_small_sends(Wire& wire, Mr& src, Mr& dst, std::size_t count, std::uint64_t seed) {
  for (std::size_t i = 0; i < count; ++i) {
    fill_pattern(src.bytes(i * 16, 16), seed + i);
    EXPECT_TRUE(wire.b.recv(10 + i, {dst.sge(i * 64, 64)}));
    EXPECT_TRUE(wire.a.post(i, WrOpcode::send, {src.sge(i * 16, 16)}));
  }
  return wire.drain(0);
}

TEST(RcRules, SequenceErrorIsNakedOncePerGapAndTheRequesterGoesBackToIt) {
  Wire wire;
  Mr src = wire.a.reg(64);
  Mr dst = wire.b.reg(64 * 4);
  const auto out = post_small_sends(wire, src, dst, 4, 40);
  ASSERT_EQ(out.size(), 4u);
  wire.deliver(1, out[0]);
  wire.deliver(1, out[2]);  // PSN 102 while 101 is expected
  wire.deliver(1, out[3]);  // still early: no second NAK
  const auto answers = wire.drain(1);
  const auto av = views(answers);
  ASSERT_EQ(av.size(), 2u);
  EXPECT_EQ(av[0].headers.aeth.kind, w::AethKind::ack);
  EXPECT_EQ(av[0].headers.bth.psn, 100u);
  EXPECT_EQ(av[1].headers.aeth.kind, w::AethKind::nak);
  EXPECT_EQ(av[1].headers.aeth.nak_code(), w::NakCode::psn_sequence_error);
  EXPECT_EQ(av[1].headers.bth.psn, 101u);
  EXPECT_EQ(wire.b.qp.stats().sequence_naks_sent, 1u);

  for (const Bytes& d : answers) wire.deliver(0, d);
  wire.deliver(0, answers[1]);  // a copy of the NAK is an echo, not a second go-back
  EXPECT_EQ(wire.a.qp.stats().sequence_naks_received, 2u);
  ASSERT_EQ(wire.a.scq.wcs.size(), 1u);  // the ACK of 100
  const auto resent = wire.drain(0);
  const auto rv = views(resent);
  ASSERT_EQ(rv.size(), 3u);
  EXPECT_EQ(rv[0].headers.bth.psn, 101u);
  EXPECT_EQ(rv[2].headers.bth.psn, 103u);
  EXPECT_EQ(wire.a.qp.stats().retransmitted_packets, 3u);
  for (const Bytes& d : resent) wire.deliver(1, d);
  wire.settle();
  ASSERT_EQ(wire.a.scq.wcs.size(), 4u);
  ASSERT_EQ(wire.b.rcq.wcs.size(), 4u);
  for (std::size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(wire.b.rcq.wcs[i].wr_id, 10u + static_cast<std::uint64_t>(i));
    EXPECT_TRUE(has_pattern(dst.bytes(i * 64, 16), 40 + static_cast<std::uint64_t>(i)));
  }
  EXPECT_EQ(wire.b.qp.stats().sequence_naks_sent, 1u);
  EXPECT_EQ(wire.b.qp.stats().duplicate_requests, 0u);  // the early 102 and 103 were dropped, not run
}

TEST(RcRules, RnrNakWaitsTheTimerAndRnrRetry7RetriesForever) {
  PairParams p = pair_params();
  p.a.rnr_retry = 7;
  p.b.min_rnr_timer = 14;  // 1.28 ms
  Wire wire(p);
  Mr src = wire.a.reg(64);
  Mr dst = wire.b.reg(64);
  ASSERT_TRUE(wire.a.post(1, WrOpcode::send, {src.sge(0, 32)}));
  for (int round = 0; round < 20; ++round) {
    const auto out = wire.drain(0);
    ASSERT_EQ(out.size(), 1u) << round;
    EXPECT_EQ(Wire::view(out[0]).headers.bth.psn, 100u);
    wire.deliver(1, out[0]);
    const auto nak = wire.drain(1);
    ASSERT_EQ(nak.size(), 1u);
    const auto v = Wire::view(nak[0]);
    EXPECT_EQ(v.headers.aeth.kind, w::AethKind::rnr_nak);
    EXPECT_EQ(v.headers.aeth.value, 14);
    EXPECT_EQ(v.headers.bth.psn, 100u);
    wire.deliver(0, nak[0]);
    ASSERT_EQ(wire.a.qp.next_deadline(), wire.now + std::chrono::microseconds(1280));
    EXPECT_TRUE(wire.drain(0).empty());  // waits out the timer
    wire.now = *wire.a.qp.next_deadline();
    wire.a.qp.handle_timeout(wire.now);
  }
  ASSERT_TRUE(wire.b.recv(2, {dst.sge(0, 64)}));
  wire.run();
  ASSERT_EQ(wire.a.scq.wcs.size(), 1u);
  EXPECT_EQ(wire.a.scq.wcs[0].status, WcStatus::success);
  EXPECT_EQ(wire.a.qp.stats().rnr_naks_received, 20u);
  EXPECT_EQ(wire.b.qp.stats().rnr_naks_sent, 20u);
}

TEST(RcRules, RnrRetryExhaustedFailsTheWrAndFlushesTheRest) {
  PairParams p = pair_params();
  p.a.rnr_retry = 2;
  Wire wire(p);
  Mr src = wire.a.reg(64);
  Mr own = wire.a.reg(64);
  ASSERT_TRUE(wire.a.recv(50, {own.sge(0, 64)}));
  ASSERT_TRUE(wire.a.post(1, WrOpcode::send, {src.sge(0, 32)}));
  ASSERT_TRUE(wire.a.post(2, WrOpcode::rdma_write, {src.sge(0, 32)}, 0, 0, 0));
  wire.run();
  EXPECT_EQ(wire.a.qp.stats().rnr_naks_received, 3u);  // the first try and two retries
  ASSERT_EQ(wire.a.scq.wcs.size(), 2u);
  EXPECT_EQ(wire.a.scq.wcs[0].wr_id, 1u);
  EXPECT_EQ(wire.a.scq.wcs[0].status, WcStatus::rnr_retry_exceeded);
  EXPECT_EQ(wire.a.scq.wcs[1].status, WcStatus::wr_flush_error);
  ASSERT_EQ(wire.a.rcq.wcs.size(), 1u);
  EXPECT_EQ(wire.a.rcq.wcs[0].status, WcStatus::wr_flush_error);
  const auto events = wire.a.events();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].cause, RcErrorCause::rnr_retry_exceeded);
  EXPECT_EQ(events[0].wr_id, 1u);
  EXPECT_EQ(wire.a.qp.state(), QpState::error);
}

// Keepalive: an idle pair probes each other and stays connected, with nothing completed,
// consumed or moved at either end; once B is gone, A ends with retry_exceeded after the
// interval and retry_cnt + 1 unanswered probes, one local ACK timeout apart.
// docs/reliability.md, "Dead peers (RoCE)": the peer's host reported our packets undeliverable.
// The requester fails at once as when its retries run out: the oldest WR completes with
// retry_exceeded, the rest flush, one event. Before the QP is connected, and once it is in
// ERROR, the input changes nothing.
TEST(RcRules, PeerUnreachableEndsTheQpAsRetriesExceeded) {
  PairParams p = pair_params();
  Wire wire(p);
  Mr src = wire.a.reg(64);
  ASSERT_TRUE(wire.a.recv(9, {src.sge(32, 32)}));
  wire.filter = [](int from, const w::PacketView&) { return from != 0; };  // A's packets are lost
  ASSERT_TRUE(wire.a.post(1, WrOpcode::send, {src.sge(0, 10)}, kSendSignaled));
  ASSERT_TRUE(wire.a.post(2, WrOpcode::send, {src.sge(10, 10)}, kSendSignaled));
  wire.settle();
  EXPECT_TRUE(wire.a.scq.wcs.empty());
  wire.a.qp.handle_peer_unreachable(wire.now);
  wire.settle();
  EXPECT_EQ(wire.a.qp.state(), QpState::error);
  const auto events = wire.a.events();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].cause, RcErrorCause::retry_exceeded);
  ASSERT_EQ(wire.a.scq.wcs.size(), 2u);
  EXPECT_EQ(wire.a.scq.wcs[0].wr_id, 1u);
  EXPECT_EQ(wire.a.scq.wcs[0].status, WcStatus::retry_exceeded);
  EXPECT_EQ(wire.a.scq.wcs[1].wr_id, 2u);
  EXPECT_EQ(wire.a.scq.wcs[1].status, WcStatus::wr_flush_error);
  ASSERT_EQ(wire.a.rcq.wcs.size(), 1u);
  EXPECT_EQ(wire.a.rcq.wcs[0].status, WcStatus::wr_flush_error);
  wire.a.qp.handle_peer_unreachable(wire.now);  // once in ERROR: nothing more
  wire.settle();
  EXPECT_TRUE(wire.a.events().empty());
  EXPECT_EQ(wire.a.scq.wcs.size(), 2u);
}

TEST(RcRules, KeepaliveProbesAnIdlePeerAndEndsTheQpOnceThePeerIsGone) {
  using std::chrono::milliseconds;
  PairParams p = pair_params();
  p.a.keepalive_interval = p.b.keepalive_interval = milliseconds(500);
  p.a.retry_cnt = 2;
  Wire wire(p);
  Mr own = wire.b.reg(64);
  ASSERT_TRUE(wire.b.recv(7, {own.sge(0, 64)}));
  wire.run(milliseconds(2200));  // four intervals: probes go both ways and are answered
  EXPECT_GE(wire.a.qp.stats().keepalive_probes, 3u);
  EXPECT_GE(wire.b.qp.stats().keepalive_probes, 3u);
  EXPECT_EQ(wire.b.qp.stats().duplicate_requests, wire.a.qp.stats().keepalive_probes);
  EXPECT_EQ(wire.a.qp.state(), QpState::rts);
  EXPECT_EQ(wire.b.qp.state(), QpState::rts);
  EXPECT_TRUE(wire.a.scq.wcs.empty() && wire.a.rcq.wcs.empty());
  EXPECT_TRUE(wire.b.scq.wcs.empty() && wire.b.rcq.wcs.empty());
  EXPECT_EQ(wire.b.qp.recv_queue_size(), 1u);  // the probe took no receive
  EXPECT_TRUE(wire.a.events().empty());
  // Then B stops answering; the traffic still works before that.
  Mr src = wire.a.reg(64);
  ASSERT_TRUE(wire.a.post(1, WrOpcode::send, {src.sge(0, 10)}, kSendSignaled));
  wire.settle();
  ASSERT_EQ(wire.a.scq.wcs.size(), 1u);
  ASSERT_EQ(wire.b.rcq.wcs.size(), 1u);
  const Time gone = wire.now;
  wire.filter = [](int from, const w::PacketView&) { return from != 1; };
  // Step deadline by deadline (B keeps probing) until A gives up.
  while (wire.a.qp.state() != QpState::error && wire.now - gone < std::chrono::seconds(10)) {
    wire.settle();
    std::optional<Time> next = wire.a.qp.next_deadline();
    if (auto nb = wire.b.qp.next_deadline(); nb && (!next || *nb < *next)) next = nb;
    if (!next) break;
    wire.now = std::max(wire.now, *next);
    wire.a.qp.handle_timeout(wire.now);
    wire.b.qp.handle_timeout(wire.now);
  }
  const auto events = wire.a.events();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].cause, RcErrorCause::retry_exceeded);
  EXPECT_EQ(wire.a.qp.state(), QpState::error);
  // The bound: the interval, then retry_cnt + 1 probes a local ACK timeout apart.
  const Duration bound = milliseconds(500) + 3 * local_ack_timeout_duration(12);
  EXPECT_LE(wire.now - gone, bound);
  EXPECT_GE(wire.now - gone, milliseconds(500));
}

// docs/p2p.md R5b: a connect asks the QP of a possibly stale connection whether its peer is
// there now. The keepalive's probe leaves at once, with or without a keepalive configured; an
// answer is reported once; no answer ends the QP after retry_cnt + 1 probes, as the keepalive.
TEST(RcRules, LivenessCheckProbesAtOnceAndReportsTheAnswerOnce) {
  for (const bool keepalive : {false, true}) {
    SCOPED_TRACE(keepalive ? "with keepalive" : "without keepalive");
    PairParams p = pair_params();
    if (keepalive) p.a.keepalive_interval = p.b.keepalive_interval = std::chrono::seconds(60);
    Wire wire(p);
    EXPECT_FALSE(wire.a.qp.poll_liveness_confirmed());
    ASSERT_TRUE(wire.a.qp.check_liveness(wire.now));
    wire.settle();
    EXPECT_EQ(wire.a.qp.stats().keepalive_probes, 1u);
    EXPECT_EQ(wire.b.qp.stats().duplicate_requests, 1u);  // answered, not executed
    EXPECT_TRUE(wire.a.qp.poll_liveness_confirmed());
    EXPECT_FALSE(wire.a.qp.poll_liveness_confirmed());  // once
    EXPECT_TRUE(wire.a.scq.wcs.empty() && wire.b.rcq.wcs.empty());
    // Answered: nothing more is due before the keepalive's own interval (none without one).
    if (keepalive) {
      ASSERT_TRUE(wire.a.qp.next_deadline().has_value());
      EXPECT_GE(*wire.a.qp.next_deadline() - wire.now, std::chrono::seconds(59));
    } else {
      EXPECT_EQ(wire.a.qp.next_deadline(), std::nullopt);
    }
  }
}

TEST(RcRules, UnansweredLivenessCheckEndsTheQpAsRetriesExceeded) {
  PairParams p = pair_params();
  p.a.retry_cnt = 2;
  Wire wire(p);
  wire.filter = [](int from, const w::PacketView&) { return from != 1; };  // B's answers are lost
  const Time asked = wire.now;
  ASSERT_TRUE(wire.a.qp.check_liveness(wire.now));
  while (wire.a.qp.state() != QpState::error) {
    wire.settle();
    const auto next = wire.a.qp.next_deadline();
    ASSERT_TRUE(next.has_value());
    wire.now = std::max(wire.now, *next);
    wire.a.qp.handle_timeout(wire.now);
  }
  EXPECT_FALSE(wire.a.qp.poll_liveness_confirmed());
  const auto events = wire.a.events();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].cause, RcErrorCause::retry_exceeded);
  EXPECT_EQ(wire.a.qp.stats().keepalive_probes, 3u);  // retry_cnt + 1
  EXPECT_EQ(wire.now - asked, 3 * local_ack_timeout_duration(p.a.local_ack_timeout));
  EXPECT_FALSE(wire.a.qp.check_liveness(wire.now));  // in ERROR: nothing to ask
}

TEST(RcRules, WithoutKeepaliveAnIdleQpSendsNothingAndHasNoDeadline) {
  Wire wire;
  wire.run(std::chrono::seconds(30));
  EXPECT_EQ(wire.a.qp.next_deadline(), std::nullopt);
  EXPECT_EQ(wire.a.qp.stats().datagrams_sent + wire.b.qp.stats().datagrams_sent, 0u);
}

// --- loss recovery on the measured round trip (docs/roce-transport.md, "Loss recovery") ---

// A three-packet Send (PSNs 100-102) whose datagrams the filter may drop, once each.
struct LossCase {
  Wire wire;
  Mr src = wire.a.reg(1000);
  Mr dst = wire.b.reg(1000);
  explicit LossCase(std::function<bool(int from, const w::PacketView&)> drop_once) {
    fill_pattern(src.bytes(0, 650), 9);
    EXPECT_TRUE(wire.b.recv(1, {dst.sge(0, 1000)}));
    EXPECT_TRUE(wire.a.post(1, WrOpcode::send, {src.sge(0, 650)}));
    wire.filter = [drop_once](int from, const w::PacketView& v) { return !drop_once(from, v); };
    wire.run();
  }
  void expect_delivered() {
    ASSERT_EQ(wire.a.scq.wcs.size(), 1u);
    EXPECT_EQ(wire.a.scq.wcs[0].status, WcStatus::success);
    ASSERT_EQ(wire.b.rcq.wcs.size(), 1u);
    EXPECT_TRUE(has_pattern(dst.bytes(0, 650), 9));
    EXPECT_EQ(wire.a.qp.stats().ack_timeouts, 0u);  // no retry spent, well before the ACK timer
  }
};

// Returns a filter that drops the first datagram matching `match` and lets the rest through.
template <class Match>
std::function<bool(int, const w::PacketView&)> once(Match match) {
  auto dropped = std::make_shared<bool>(false);
  return [dropped, match](int from, const w::PacketView& v) {
    if (*dropped || !match(from, v)) return false;
    *dropped = true;
    return true;
  };
}

// The last packet lost: nothing behind it makes the responder NAK. The probe's newest packet
// is the resend; its una packet (100) is a duplicate there.
TEST(RcRules, LostTailIsResentByTheRecoveryProbe) {
  LossCase c(once([](int from, const w::PacketView& v) { return from == 0 && v.headers.bth.psn == 102; }));
  c.expect_delivered();
  EXPECT_EQ(c.wire.a.qp.stats().recovery_timeouts, 1u);
  EXPECT_EQ(c.wire.a.qp.stats().recovery_probes, 1u);
  EXPECT_EQ(c.wire.a.qp.stats().retransmitted_packets, 2u);  // una and the newest, not the window
  EXPECT_LT(c.wire.now - Time{}, local_ack_timeout_duration(12) / 4);
}

// The ACK lost (or a peer too slow to answer in time): both probe packets are duplicates
// there, answered with an ACK of everything. Two packets are resent, not the window.
TEST(RcRules, LostAckCostsOneProbe) {
  LossCase c(once([](int from, const w::PacketView& v) { return from == 1 && v.headers.bth.opcode == O::rc_acknowledge; }));
  c.expect_delivered();
  EXPECT_EQ(c.wire.a.qp.stats().recovery_timeouts, 1u);
  EXPECT_EQ(c.wire.a.qp.stats().recovery_probes, 1u);
  EXPECT_EQ(c.wire.a.qp.stats().retransmitted_packets, 2u);
  EXPECT_EQ(c.wire.b.qp.stats().duplicate_requests, 2u);
}

// The first packet and the NAK it caused both lost: the responder NAKs a gap once and drops
// what follows, so the newest packet alone would go unanswered. The probe's una packet is the
// PSN the responder expects: it executes, and the newest behind it gets the next gap's NAK.
// One recovery timeout, not a probe and then a go-back.
TEST(RcRules, LostNakIsRecoveredWithinOneRecoveryTimeout) {
  auto first = once([](int from, const w::PacketView& v) { return from == 0 && v.headers.bth.psn == 100; });
  auto nak = once([](int from, const w::PacketView& v) {
    return from == 1 && v.headers.aeth.kind == w::AethKind::nak;
  });
  LossCase c([first, nak](int from, const w::PacketView& v) { return first(from, v) || nak(from, v); });
  c.expect_delivered();
  EXPECT_EQ(c.wire.b.qp.stats().sequence_naks_sent, 2u);  // 101 after the lost 100, then 101 again
  EXPECT_EQ(c.wire.a.qp.stats().recovery_timeouts, 1u);
  EXPECT_EQ(c.wire.a.qp.stats().recovery_probes, 1u);
  EXPECT_EQ(c.wire.a.qp.stats().retransmitted_packets, 4u);  // the probe (100, 102), then 101-102
  EXPECT_LT(c.wire.now - Time{}, local_ack_timeout_duration(12) / 4);
}

// A NAK answered, but the resend of the NAKed PSN lost as well: the responder has NAKed that
// gap and stays silent. One recovery timeout: the probe's una packet is that PSN.
TEST(RcRules, LostResendIsRecoveredWithinOneRecoveryTimeout) {
  auto sends_of_101 = std::make_shared<int>(0);
  LossCase c([sends_of_101](int from, const w::PacketView& v) {
    return from == 0 && v.headers.bth.psn == 101 && ++*sends_of_101 <= 2;  // the first two sends
  });
  c.expect_delivered();
  EXPECT_EQ(c.wire.a.qp.stats().sequence_naks_received, 1u);
  EXPECT_EQ(c.wire.a.qp.stats().recovery_timeouts, 1u);
  EXPECT_EQ(c.wire.a.qp.stats().retransmitted_packets, 4u);  // 101-102 after the NAK, the probe (101, 102)
  EXPECT_LT(c.wire.now - Time{}, local_ack_timeout_duration(12) / 4);
}

// One Send of 1000 packets from a into a receive of b's (PMTU 256, send_window 128), posted
// and not yet drained; its bytes are pattern 4.
struct LongSend {
  static constexpr std::uint32_t kPackets = 1000;
  Wire wire;
  Mr src = wire.a.reg(kPackets * 256);
  Mr dst = wire.b.reg(kPackets * 256);
  LongSend() {
    fill_pattern(src.bytes(0, kPackets * 256), 4);
    EXPECT_TRUE(wire.b.recv(1, {dst.sge(0, kPackets * 256)}));
    EXPECT_TRUE(wire.a.post(1, WrOpcode::send, {src.sge(0, kPackets * 256)}));
  }
};

// A long stream losing one packet in the middle: the NAK sends the requester back at once
// (no timer), with the window kept (the responder answered; halving it would cost a round
// trip per half window from then on), and what is resent is bounded by that window.
TEST(RcRules, LostPacketInMidStreamCostsNoTimerAndAtMostAWindowOfResends) {
  LongSend send;
  Wire& wire = send.wire;
  Mr& dst = send.dst;
  constexpr std::uint32_t kPackets = LongSend::kPackets;
  const auto first = wire.drain(0);
  ASSERT_EQ(first.size(), 128u);  // the full window
  for (const Bytes& d : first)
    if (Wire::view(d).headers.bth.psn != 150) wire.deliver(1, d);  // one lost in the middle
  const auto nak = wire.drain(1);
  ASSERT_EQ(nak.size(), 2u);  // the ACK of 100-149 (AckReq on 131), then the NAK of 150
  EXPECT_EQ(Wire::view(nak[1]).headers.aeth.kind, w::AethKind::nak);
  for (const Bytes& d : nak) wire.deliver(0, d);
  const auto resent = wire.drain(0);
  ASSERT_EQ(resent.size(), 128u);  // a full window again, from the lost PSN on
  EXPECT_EQ(Wire::view(resent.front()).headers.bth.psn, 150u);
  for (const Bytes& d : resent) wire.deliver(1, d);
  wire.run();
  ASSERT_EQ(wire.a.scq.wcs.size(), 1u);
  EXPECT_EQ(wire.a.scq.wcs[0].status, WcStatus::success);
  EXPECT_TRUE(has_pattern(dst.bytes(0, kPackets * 256), 4));
  EXPECT_EQ(wire.a.qp.stats().recovery_timeouts, 0u);
  EXPECT_EQ(wire.a.qp.stats().ack_timeouts, 0u);
  EXPECT_EQ(wire.a.qp.stats().retransmitted_packets, 128u - 50u);  // 150-227: sent twice
}

// A go-back that only the recovery timer could make (the wire went silent both ways: the
// probe unanswered as well) halves the window; ACKs grow it back to send_window.
TEST(RcRules, TimerGoBackHalvesTheWindowAndAcknowledgementsRestoreIt) {
  LongSend send;
  Wire& wire = send.wire;
  Mr& dst = send.dst;
  constexpr std::uint32_t kPackets = LongSend::kPackets;
  ASSERT_EQ(wire.drain(0).size(), 128u);  // the full window, all lost
  auto expire = [&] {
    const auto deadline = wire.a.qp.next_deadline();
    ASSERT_TRUE(deadline.has_value());
    wire.now = *deadline;
    wire.a.qp.handle_timeout(wire.now);
  };
  expire();
  const auto probe = wire.drain(0);
  ASSERT_EQ(probe.size(), 2u);  // una and the newest, lost as well
  EXPECT_EQ(Wire::view(probe[0]).headers.bth.psn, 100u);
  EXPECT_EQ(Wire::view(probe[1]).headers.bth.psn, 227u);
  expire();
  const auto resent = wire.drain(0);
  ASSERT_EQ(resent.size(), 64u);  // half the window, from una on
  EXPECT_EQ(Wire::view(resent.front()).headers.bth.psn, 100u);
  EXPECT_EQ(wire.a.qp.stats().recovery_timeouts, 2u);
  EXPECT_EQ(wire.a.qp.stats().ack_timeouts, 0u);
  for (const Bytes& d : resent) wire.deliver(1, d);
  wire.run();
  ASSERT_EQ(wire.a.scq.wcs.size(), 1u);
  EXPECT_EQ(wire.a.scq.wcs[0].status, WcStatus::success);
  EXPECT_TRUE(has_pattern(dst.bytes(0, kPackets * 256), 4));
  // Grown back: a second message goes out a full window at once.
  ASSERT_TRUE(wire.b.recv(2, {dst.sge(0, kPackets * 256)}));
  ASSERT_TRUE(wire.a.post(2, WrOpcode::send, {send.src.sge(0, kPackets * 256)}));
  EXPECT_EQ(wire.drain(0).size(), 128u);
}

TEST(RcRules, RetryExceededWhenThePeerIsGone) {
  PairParams p = pair_params();
  p.a.retry_cnt = 3;
  Wire wire(p);
  wire.filter = [](int from, const w::PacketView&) { return from != 0; };
  Mr src = wire.a.reg(1024);
  Mr own = wire.a.reg(64);
  ASSERT_TRUE(wire.a.recv(50, {own.sge(0, 64)}));
  ASSERT_TRUE(wire.a.post(1, WrOpcode::send, {src.sge(0, 600)}));
  ASSERT_TRUE(wire.a.post(2, WrOpcode::rdma_write, {src.sge(0, 100)}, 0, 0, 0));
  ASSERT_TRUE(wire.a.post(3, WrOpcode::rdma_read, {src.sge(0, 100)}, 0, 0, 0));
  wire.run();
  // The peer is declared gone at the same moment with loss recovery as without: its resends
  // spend no retry and leave the local ACK timer running.
  EXPECT_EQ(wire.a.qp.stats().ack_timeouts, 4u);  // the first timeout and three retries
  EXPECT_EQ(wire.now - Time{}, 4 * local_ack_timeout_duration(12));
  EXPECT_GT(wire.a.qp.stats().recovery_timeouts, 0u);
  // 3 + 1 + 1 PSNs each time: three retries and every recovery go-back; the one probe is
  // una's packet alone (the newest request is a READ, never probed)
  const RcStats& stats = wire.a.qp.stats();
  EXPECT_EQ(stats.recovery_probes, 1u);
  EXPECT_EQ(stats.retransmitted_packets, 5u * (3u + stats.recovery_timeouts - stats.recovery_probes) + 1u);
  ASSERT_EQ(wire.a.scq.wcs.size(), 3u);
  EXPECT_EQ(wire.a.scq.wcs[0].wr_id, 1u);
  EXPECT_EQ(wire.a.scq.wcs[0].status, WcStatus::retry_exceeded);
  EXPECT_EQ(wire.a.scq.wcs[1].status, WcStatus::wr_flush_error);
  EXPECT_EQ(wire.a.scq.wcs[2].status, WcStatus::wr_flush_error);
  ASSERT_EQ(wire.a.rcq.wcs.size(), 1u);
  EXPECT_EQ(wire.a.rcq.wcs[0].status, WcStatus::wr_flush_error);
  const auto events = wire.a.events();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].cause, RcErrorCause::retry_exceeded);
  EXPECT_EQ(events[0].psn, 100u);
  EXPECT_EQ(wire.a.qp.next_deadline(), std::nullopt);
  // In ERROR a new WR completes at once with a flush error.
  ASSERT_TRUE(wire.a.post(4, WrOpcode::send, {}));
  ASSERT_EQ(wire.a.scq.wcs.size(), 4u);
  EXPECT_EQ(wire.a.scq.wcs[3].status, WcStatus::wr_flush_error);
  EXPECT_TRUE(wire.drain(0).empty());
}

enum class Violation { bad_rkey, out_of_bounds, missing_right };

class RcAccessError : public ::testing::TestWithParam<std::tuple<WrOpcode, Violation>> {};

TEST_P(RcAccessError, IsNakedAsRemoteAccessErrorAndBothQpsEndInError) {
  const auto [opcode, violation] = GetParam();
  Wire wire;
  const bool write = opcode == WrOpcode::rdma_write;
  const std::uint32_t right = write ? kAccessRemoteWrite : kAccessRemoteRead;
  const std::uint32_t access = violation == Violation::missing_right ? kAllAccess & ~right : kAllAccess;
  Mr target = wire.b.reg(1024, access);
  fill_pattern(target.bytes(0, 1024), 5);
  Mr src = wire.a.reg(2048);
  fill_pattern(src.bytes(0, 2048), 6);
  std::uint64_t remote = target.addr;
  std::uint32_t rkey = target.key;
  std::uint32_t length = 600;
  if (violation == Violation::bad_rkey) rkey ^= 0x80;                   // wrong key byte
  if (violation == Violation::out_of_bounds) remote = target.addr + 500;  // 500 + 600 > 1024
  ASSERT_TRUE(wire.a.post(1, opcode, {src.sge(0, length)}, 0, remote, rkey));
  ASSERT_TRUE(wire.a.post(2, WrOpcode::send, {src.sge(0, 10)}));
  wire.run();
  ASSERT_EQ(wire.a.scq.wcs.size(), 2u);
  EXPECT_EQ(wire.a.scq.wcs[0].status, WcStatus::remote_access_error);
  EXPECT_EQ(wire.a.scq.wcs[1].status, WcStatus::wr_flush_error);
  const auto a_events = wire.a.events();
  ASSERT_EQ(a_events.size(), 1u);
  EXPECT_EQ(a_events[0].cause, RcErrorCause::remote_access_error);
  const auto b_events = wire.b.events();
  ASSERT_EQ(b_events.size(), 1u);
  EXPECT_EQ(b_events[0].cause, RcErrorCause::access_violation);
  EXPECT_EQ(wire.b.qp.state(), QpState::error);
  EXPECT_TRUE(has_pattern(target.bytes(0, 1024), 5));  // untouched
  if (!write) {
    EXPECT_TRUE(has_pattern(src.bytes(0, length), 6));  // nothing placed
  }
}

INSTANTIATE_TEST_SUITE_P(WriteAndRead, RcAccessError,
                         ::testing::Combine(::testing::Values(WrOpcode::rdma_write, WrOpcode::rdma_read),
                                            ::testing::Values(Violation::bad_rkey, Violation::out_of_bounds,
                                                              Violation::missing_right)));

TEST(RcRules, LostReadResponseReissuesTheRemainderAndTheResponderReadsMemoryAnew) {
  Wire wire;
  Mr source = wire.b.reg(768);
  fill_pattern(source.bytes(0, 768), 70);
  Mr sink = wire.a.reg(768);
  ASSERT_TRUE(wire.a.post(1, WrOpcode::rdma_read, {sink.sge(0, 400), sink.sge(400, 368)}, 0, source.addr, source.key));
  const auto request = wire.drain(0);
  ASSERT_EQ(request.size(), 1u);
  wire.deliver(1, request[0]);
  const auto responses = wire.drain(1);
  const auto rv = views(responses);
  ASSERT_EQ(rv.size(), 3u);
  EXPECT_EQ(rv[0].headers.bth.opcode, O::rc_rdma_read_response_first);
  EXPECT_EQ(rv[1].headers.bth.opcode, O::rc_rdma_read_response_middle);
  EXPECT_EQ(rv[2].headers.bth.opcode, O::rc_rdma_read_response_last);
  wire.deliver(0, responses[0]);
  wire.deliver(0, responses[2]);  // MIDDLE lost: LAST is beyond the gap
  const auto reissued = wire.drain(0);
  ASSERT_EQ(reissued.size(), 1u);
  const auto iv = Wire::view(reissued[0]);
  EXPECT_EQ(iv.headers.bth.opcode, O::rc_rdma_read_request);
  EXPECT_EQ(iv.headers.bth.psn, 101u);
  EXPECT_EQ(iv.headers.reth.virtual_address, source.addr + 256);
  EXPECT_EQ(iv.headers.reth.dma_length, 512u);
  // The responder executes the duplicate again: what it sends now is memory as it is now.
  fill_pattern(source.bytes(0, 768), 71);
  wire.deliver(1, reissued[0]);
  EXPECT_EQ(wire.b.qp.stats().read_replays, 1u);
  const auto replay = wire.drain(1);
  const auto pv = views(replay);
  ASSERT_EQ(pv.size(), 2u);
  EXPECT_EQ(pv[0].headers.bth.psn, 101u);
  EXPECT_EQ(pv[0].headers.bth.opcode, O::rc_rdma_read_response_first);
  EXPECT_EQ(pv[1].headers.bth.psn, 102u);
  EXPECT_EQ(pv[1].headers.bth.opcode, O::rc_rdma_read_response_last);
  for (const Bytes& d : replay) wire.deliver(0, d);
  ASSERT_EQ(wire.a.scq.wcs.size(), 1u);
  EXPECT_EQ(wire.a.scq.wcs[0].status, WcStatus::success);
  Bytes expected_new(768);
  fill_pattern(expected_new, 71);
  Bytes expected_old(768);
  fill_pattern(expected_old, 70);
  EXPECT_TRUE(std::equal(sink.data, sink.data + 256, expected_old.begin()));
  EXPECT_TRUE(std::equal(sink.data + 256, sink.data + 768, expected_new.begin() + 256));
}

TEST(RcRules, DuplicateSendIsAcknowledgedAgainNotExecutedAgain) {
  Wire wire;
  Mr src = wire.a.reg(64);
  Mr dst = wire.b.reg(128);
  ASSERT_TRUE(wire.b.recv(1, {dst.sge(0, 64)}));
  ASSERT_TRUE(wire.b.recv(2, {dst.sge(64, 64)}));
  ASSERT_TRUE(wire.a.post(1, WrOpcode::send, {src.sge(0, 20)}));
  const auto out = wire.drain(0);
  ASSERT_EQ(out.size(), 1u);
  wire.deliver(1, out[0]);
  const auto first = wire.drain(1);
  wire.deliver(1, out[0]);
  const auto second = views(wire.drain(1));
  ASSERT_EQ(first.size(), 1u);
  ASSERT_EQ(second.size(), 1u);
  EXPECT_EQ(second[0].headers.aeth.kind, w::AethKind::ack);
  EXPECT_EQ(second[0].headers.bth.psn, 100u);  // ePSN - 1
  EXPECT_EQ(wire.b.rcq.wcs.size(), 1u);
  EXPECT_EQ(wire.b.qp.recv_queue_size(), 1u);
  EXPECT_EQ(wire.b.qp.stats().duplicate_requests, 1u);
}

// Behind a NAKed gap, requests after it are dropped on their BTH, before their ICRC is
// computed: nothing answers them either way (§2.4, §1.3). The PSN the responder expects is
// still checked in full: a corrupted copy of it does not execute.
TEST(RcRules, RequestsBehindANakedGapAreDroppedUncheckedButTheExpectedPsnIsChecked) {
  Wire wire;
  Mr src = wire.a.reg(64);
  Mr dst = wire.b.reg(64 * 3);
  const auto out = post_small_sends(wire, src, dst, 3, 70);
  ASSERT_EQ(out.size(), 3u);
  wire.deliver(1, out[1]);  // 101 while 100 is expected: the NAK
  ASSERT_EQ(wire.drain(1).size(), 1u);
  auto corrupt = [](Bytes d) {
    d[w::kBthSize + 3] ^= 0x10;
    return d;
  };
  wire.deliver(1, corrupt(out[2]));  // ahead of the gap: dropped on its BTH
  wire.deliver(1, out[2]);
  EXPECT_EQ(wire.b.qp.stats().dropped_bad_icrc, 0u);
  EXPECT_EQ(wire.b.qp.stats().dropped_unexpected, 3u);
  wire.deliver(1, corrupt(out[0]));  // the expected PSN, corrupted: its ICRC is checked
  EXPECT_EQ(wire.b.qp.stats().dropped_bad_icrc, 1u);
  EXPECT_TRUE(wire.b.rcq.wcs.empty());
  EXPECT_TRUE(wire.drain(1).empty());  // no answer to any of them, no second NAK
  for (const Bytes& d : out) wire.deliver(1, d);  // the go-back
  ASSERT_EQ(wire.b.rcq.wcs.size(), 3u);
  for (std::size_t i = 0; i < 3; ++i) EXPECT_TRUE(has_pattern(dst.bytes(i * 64, 16), 70 + static_cast<std::uint64_t>(i)));
  EXPECT_EQ(wire.b.qp.stats().sequence_naks_sent, 1u);
}

TEST(RcRules, BadIcrcIsDroppedAndCounted) {
  Wire wire;
  Mr src = wire.a.reg(64);
  Mr dst = wire.b.reg(64);
  ASSERT_TRUE(wire.b.recv(1, {dst.sge(0, 64)}));
  ASSERT_TRUE(wire.a.post(1, WrOpcode::send, {src.sge(0, 20)}));
  const auto out = wire.drain(0);
  ASSERT_EQ(out.size(), 1u);
  Bytes corrupt = out[0];
  corrupt[w::kBthSize + 3] ^= 0x10;
  wire.deliver(1, corrupt);
  // The right bytes from another source port fail the ICRC too (§1.4: ports are covered).
  wire.b.qp.handle_datagram(out[0], kIpA, kPortA + 1, wire.now);
  EXPECT_EQ(wire.b.qp.stats().dropped_bad_icrc, 2u);
  EXPECT_TRUE(wire.b.rcq.wcs.empty());
  EXPECT_TRUE(wire.drain(1).empty());
  wire.deliver(1, out[0]);
  EXPECT_EQ(wire.b.rcq.wcs.size(), 1u);
}

// The whole packet, its ICRC computed for the peer's address, from another address: what
// an attacker who learned the QPN, PSN and R_Key sends (docs/reliability.md). It is
// dropped and counted before anything is decoded; the same bytes from the peer land.
TEST(RcRules, DatagramsFromAnAddressOtherThanThePeersAreDroppedWhateverTheirIcrc) {
  Wire wire;
  Mr src = wire.a.reg(64);
  Mr dst = wire.b.reg(64);
  fill_pattern(src.bytes(0, 64), 9);
  ASSERT_TRUE(wire.b.recv(1, {dst.sge(0, 64)}));
  ASSERT_TRUE(wire.a.post(1, WrOpcode::rdma_write, {src.sge(0, 48)}, 0, dst.addr, dst.key));
  const auto out = wire.drain(0);
  ASSERT_EQ(out.size(), 1u);
  constexpr std::array<std::uint8_t, 4> kIpElsewhere{10, 0, 0, 66};
  wire.b.qp.handle_datagram(out[0], kIpElsewhere, kPortA, wire.now);
  wire.b.qp.handle_datagram(out[0], kIpB, kPortA, wire.now);  // B's own address is foreign too
  EXPECT_EQ(wire.b.qp.stats().dropped_foreign_source, 2u);
  EXPECT_EQ(wire.b.qp.stats().dropped_bad_icrc, 0u);
  EXPECT_TRUE(std::all_of(dst.bytes(0, 64).begin(), dst.bytes(0, 64).end(), [](auto b) { return b == 0; }));
  EXPECT_TRUE(wire.drain(1).empty());  // not even an ACK or a NAK goes back
  wire.deliver(1, out[0]);
  EXPECT_TRUE(has_pattern(dst.bytes(0, 48), 9));
  EXPECT_EQ(wire.b.qp.stats().dropped_foreign_source, 2u);
}

TEST(RcRules, MaxRdAtomicBoundsReadsInFlight) {
  PairParams p = pair_params();
  p.a.max_rd_atomic = 2;
  Wire wire(p);
  Mr source = wire.b.reg(1000);
  Mr sink = wire.a.reg(1000);
  for (std::size_t i = 0; i < 5; ++i)
    ASSERT_TRUE(wire.a.post(i, WrOpcode::rdma_read, {sink.sge(i * 100, 100)}, 0, source.addr + i * 100, source.key));
  const auto first = views(wire.drain(0));
  ASSERT_EQ(first.size(), 2u);
  EXPECT_EQ(wire.a.qp.reads_in_flight(), 2u);
  std::size_t most = 0;
  wire.filter = [&](int, const w::PacketView&) {
    most = std::max(most, wire.a.qp.reads_in_flight());
    return true;
  };
  wire.run();  // the swallowed two come back through the ACK timer
  EXPECT_LE(most, 2u);
  ASSERT_EQ(wire.a.scq.wcs.size(), 5u);
  for (const auto& wc : wire.a.scq.wcs) EXPECT_EQ(wc.status, WcStatus::success);
}

TEST(RcRules, ResponderRefusesReadsBeyondItsResponderResources) {
  PairParams p = pair_params();
  p.a.max_rd_atomic = 4;
  p.b.max_dest_rd_atomic = 1;
  Wire wire(p);
  Mr source = wire.b.reg(1000);
  Mr sink = wire.a.reg(1000);
  ASSERT_TRUE(wire.a.post(1, WrOpcode::rdma_read, {sink.sge(0, 100)}, 0, source.addr, source.key));
  ASSERT_TRUE(wire.a.post(2, WrOpcode::rdma_read, {sink.sge(100, 100)}, 0, source.addr, source.key));
  const auto out = wire.drain(0);
  ASSERT_EQ(out.size(), 2u);
  wire.deliver(1, out[0]);
  wire.deliver(1, out[1]);  // the first's response has not left yet
  for (const Bytes& d : wire.drain(1)) wire.deliver(0, d);
  ASSERT_EQ(wire.a.scq.wcs.size(), 2u);
  EXPECT_EQ(wire.a.scq.wcs[0].status, WcStatus::success);
  EXPECT_EQ(wire.a.scq.wcs[1].status, WcStatus::remote_invalid_request_error);
  const auto events = wire.b.events();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].cause, RcErrorCause::invalid_request);
}

TEST(RcRules, FenceHoldsAWrUntilEarlierReadsComplete) {
  Wire wire;
  Mr source = wire.b.reg(100);
  Mr dst = wire.b.reg(100);
  Mr sink = wire.a.reg(200);
  ASSERT_TRUE(wire.b.recv(9, {dst.sge(0, 100)}));
  ASSERT_TRUE(wire.a.post(1, WrOpcode::rdma_read, {sink.sge(0, 100)}, 0, source.addr, source.key));
  ASSERT_TRUE(wire.a.post(2, WrOpcode::send, {sink.sge(100, 10)}, kSendFence));
  const auto out = views(wire.drain(0));
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].headers.bth.opcode, O::rc_rdma_read_request);
  wire.run();
  ASSERT_EQ(wire.a.scq.wcs.size(), 2u);
  EXPECT_EQ(wire.b.rcq.wcs.size(), 1u);
}

TEST(RcRules, SendWithInvalidateAndSolicitedEvent) {
  Wire wire;
  Mr src = wire.a.reg(64);
  Mr dst = wire.b.reg(64);
  Mr victim = wire.b.reg(64);
  ASSERT_TRUE(wire.b.recv(1, {dst.sge(0, 64)}));
  ASSERT_TRUE(wire.a.post(1, WrOpcode::send_with_invalidate, {src.sge(0, 30)}, kSendSolicited, 0, 0, victim.key));
  const auto v = views(wire.drain(0));
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].headers.bth.opcode, O::rc_send_only_invalidate);
  EXPECT_TRUE(v[0].headers.bth.solicited_event);
  EXPECT_EQ(v[0].headers.invalidate_rkey, victim.key);
  wire.run();  // the swallowed packet comes back through the ACK timer
  ASSERT_EQ(wire.b.rcq.wcs.size(), 1u);
  EXPECT_EQ(wire.b.rcq.wcs[0].wc_flags, kWcWithInvalidate | kWcSolicited);
  EXPECT_EQ(wire.b.rcq.wcs[0].invalidated_rkey, victim.key);
  EXPECT_EQ(wire.b.rcq.solicited_events, 1);
  EXPECT_EQ(wire.b.memory.find(victim.key), nullptr);
}

// ---------------------------------------------------------------- immediate data

// verbs imm_data is network byte order; ImmDt on the wire carries the same four bytes.
constexpr std::uint32_t kImmHost = 0x12345678;
const std::uint32_t kImm = htonl(kImmHost);

TEST(RcRules, SendWithImmediateOnlyPacketCompletesTheReceiveWithImm) {
  Wire wire;
  Mr src = wire.a.reg(64);
  Mr dst = wire.b.reg(64);
  fill_pattern(src.bytes(0, 10), 3);
  ASSERT_TRUE(wire.b.recv(1, {dst.sge(0, 64)}));
  ASSERT_TRUE(wire.a.post(7, WrOpcode::send_with_imm, {src.sge(0, 10)}, 0, 0, 0, 0, kImm));
  const auto out = wire.drain(0);
  ASSERT_EQ(out.size(), 1u);
  const auto v = Wire::view(out[0]);
  EXPECT_EQ(v.headers.bth.opcode, O::rc_send_only_immediate);
  EXPECT_EQ(v.headers.immediate, kImmHost);
  EXPECT_TRUE(v.headers.bth.ack_request);
  EXPECT_FALSE(v.headers.bth.solicited_event);
  // The ImmDt bytes follow the BTH in network order.
  EXPECT_EQ(std::memcmp(out[0].data() + w::kBthSize, &kImm, 4), 0);
  wire.deliver(1, out[0]);
  wire.settle();
  ASSERT_EQ(wire.b.rcq.wcs.size(), 1u);
  const WorkCompletion& rwc = wire.b.rcq.wcs[0];
  EXPECT_EQ(rwc.wr_id, 1u);
  EXPECT_EQ(rwc.status, WcStatus::success);
  EXPECT_EQ(rwc.opcode, WcOpcode::recv);
  EXPECT_EQ(rwc.byte_len, 10u);
  EXPECT_EQ(rwc.wc_flags, kWcWithImm);
  EXPECT_EQ(rwc.imm_data, kImm);
  EXPECT_TRUE(has_pattern(dst.bytes(0, 10), 3));
  ASSERT_EQ(wire.a.scq.wcs.size(), 1u);
  EXPECT_EQ(wire.a.scq.wcs[0].opcode, WcOpcode::send);
  EXPECT_EQ(wire.a.scq.wcs[0].status, WcStatus::success);
  EXPECT_EQ(wire.a.scq.wcs[0].wc_flags, 0u);
}

TEST(RcRules, MultiPacketSendWithImmediateCarriesImmDtOnlyOnTheLastPacket) {
  Wire wire;  // PMTU 256
  Mr src = wire.a.reg(1000);
  Mr dst = wire.b.reg(1000);
  fill_pattern(src.bytes(0, 600), 4);
  ASSERT_TRUE(wire.b.recv(1, {dst.sge(0, 1000)}));
  ASSERT_TRUE(wire.a.post(1, WrOpcode::send_with_imm, {src.sge(0, 600)}, kSendSolicited, 0, 0, 0, kImm));
  const auto out = wire.drain(0);
  const auto v = views(out);
  ASSERT_EQ(v.size(), 3u);
  EXPECT_EQ(v[0].headers.bth.opcode, O::rc_send_first);
  EXPECT_EQ(v[1].headers.bth.opcode, O::rc_send_middle);
  EXPECT_EQ(v[2].headers.bth.opcode, O::rc_send_last_immediate);
  EXPECT_EQ(v[2].headers.immediate, kImmHost);
  EXPECT_EQ(v[2].payload.size(), 600u - 512u);
  EXPECT_TRUE(v[2].headers.bth.ack_request);
  EXPECT_TRUE(v[2].headers.bth.solicited_event);
  EXPECT_FALSE(v[0].headers.bth.solicited_event);
  for (const Bytes& d : out) wire.deliver(1, d);
  wire.settle();
  ASSERT_EQ(wire.b.rcq.wcs.size(), 1u);
  EXPECT_EQ(wire.b.rcq.wcs[0].opcode, WcOpcode::recv);
  EXPECT_EQ(wire.b.rcq.wcs[0].byte_len, 600u);
  EXPECT_EQ(wire.b.rcq.wcs[0].wc_flags, kWcWithImm | kWcSolicited);
  EXPECT_EQ(wire.b.rcq.wcs[0].imm_data, kImm);
  EXPECT_EQ(wire.b.rcq.solicited_events, 1);
  EXPECT_TRUE(has_pattern(dst.bytes(0, 600), 4));
  ASSERT_EQ(wire.a.scq.wcs.size(), 1u);
  EXPECT_EQ(wire.a.scq.wcs[0].byte_len, 600u);
}

TEST(RcRules, ZeroLengthWriteWithImmediateIsOneOnlyPacketAndConsumesAReceive) {
  Wire wire;
  Mr dst = wire.b.reg(16);
  ASSERT_TRUE(wire.b.recv(5, {dst.sge(0, 16)}));
  // A zero-length WRITE needs no valid R_Key: address and key 0.
  ASSERT_TRUE(wire.a.post(2, WrOpcode::rdma_write_with_imm, {}, 0, 0, 0, 0, kImm));
  const auto out = wire.drain(0);
  ASSERT_EQ(out.size(), 1u);
  const auto v = Wire::view(out[0]);
  EXPECT_EQ(v.headers.bth.opcode, O::rc_rdma_write_only_immediate);
  EXPECT_EQ(v.headers.reth.dma_length, 0u);
  EXPECT_EQ(v.headers.immediate, kImmHost);
  EXPECT_TRUE(v.payload.empty());
  EXPECT_TRUE(v.headers.bth.ack_request);
  wire.deliver(1, out[0]);
  wire.settle();
  ASSERT_EQ(wire.b.rcq.wcs.size(), 1u);
  const WorkCompletion& rwc = wire.b.rcq.wcs[0];
  EXPECT_EQ(rwc.wr_id, 5u);
  EXPECT_EQ(rwc.status, WcStatus::success);
  EXPECT_EQ(rwc.opcode, WcOpcode::recv_rdma_with_imm);
  EXPECT_EQ(rwc.byte_len, 0u);
  EXPECT_EQ(rwc.wc_flags, kWcWithImm);
  EXPECT_EQ(rwc.imm_data, kImm);
  EXPECT_EQ(wire.b.qp.recv_queue_size(), 0u);
  ASSERT_EQ(wire.a.scq.wcs.size(), 1u);
  EXPECT_EQ(wire.a.scq.wcs[0].opcode, WcOpcode::rdma_write);
  EXPECT_EQ(wire.a.scq.wcs[0].status, WcStatus::success);
  EXPECT_EQ(wire.b.qp.state(), QpState::rts);
}

TEST(RcRules, MultiPacketWriteWithImmediatePlacesTheDataAndReportsItsLength) {
  Wire wire;  // PMTU 256
  Mr src = wire.a.reg(1000);
  Mr target = wire.b.reg(1000);
  Mr small = wire.b.reg(4);
  fill_pattern(src.bytes(0, 700), 5);
  // A plain WRITE first: it consumes no receive.
  ASSERT_TRUE(wire.b.recv(9, {small.sge(0, 4)}));  // smaller than the WRITE: only its wr_id counts
  ASSERT_TRUE(wire.a.post(1, WrOpcode::rdma_write, {src.sge(0, 10)}, 0, target.addr + 900, target.key));
  ASSERT_TRUE(wire.a.post(2, WrOpcode::rdma_write_with_imm, {src.sge(0, 300), src.sge(300, 400)}, 0,
                          target.addr + 100, target.key, 0, kImm));
  const auto out = wire.drain(0);
  const auto v = views(out);
  ASSERT_EQ(v.size(), 4u);
  EXPECT_EQ(v[0].headers.bth.opcode, O::rc_rdma_write_only);
  EXPECT_EQ(v[1].headers.bth.opcode, O::rc_rdma_write_first);
  EXPECT_EQ(v[1].headers.reth.dma_length, 700u);
  EXPECT_EQ(v[1].headers.reth.virtual_address, target.addr + 100);
  EXPECT_EQ(v[2].headers.bth.opcode, O::rc_rdma_write_middle);
  EXPECT_EQ(v[3].headers.bth.opcode, O::rc_rdma_write_last_immediate);
  EXPECT_EQ(v[3].headers.immediate, kImmHost);
  EXPECT_TRUE(v[3].headers.bth.ack_request);
  for (std::size_t i = 0; i < 3; ++i) {
    wire.deliver(1, out[i]);
    EXPECT_TRUE(wire.b.rcq.wcs.empty()) << i;  // nothing before the LAST packet
  }
  EXPECT_EQ(wire.b.qp.recv_queue_size(), 1u);
  wire.deliver(1, out[3]);
  wire.settle();
  ASSERT_EQ(wire.b.rcq.wcs.size(), 1u);
  const WorkCompletion& rwc = wire.b.rcq.wcs[0];
  EXPECT_EQ(rwc.wr_id, 9u);
  EXPECT_EQ(rwc.status, WcStatus::success);
  EXPECT_EQ(rwc.opcode, WcOpcode::recv_rdma_with_imm);
  EXPECT_EQ(rwc.byte_len, 700u);
  EXPECT_EQ(rwc.wc_flags, kWcWithImm);
  EXPECT_EQ(rwc.imm_data, kImm);
  EXPECT_TRUE(has_pattern(target.bytes(100, 700), 5));
  EXPECT_TRUE(has_pattern(target.bytes(900, 10), 5));
  EXPECT_EQ(small.bytes(0, 4)[0], 0);  // the receive's buffer is not written
  ASSERT_EQ(wire.a.scq.wcs.size(), 2u);
  EXPECT_EQ(wire.a.scq.wcs[1].wr_id, 2u);
  EXPECT_EQ(wire.a.scq.wcs[1].opcode, WcOpcode::rdma_write);
  EXPECT_EQ(wire.a.scq.wcs[1].byte_len, 700u);
}

TEST(RcRules, WriteWithImmediateWithoutAReceiveIsRnrNakedAtItsLastPacketThenSucceeds) {
  PairParams p = pair_params();
  p.a.rnr_retry = 7;
  p.b.min_rnr_timer = 14;  // 1.28 ms
  Wire wire(p);
  Mr src = wire.a.reg(1000);
  Mr target = wire.b.reg(1000);
  Mr rbuf = wire.b.reg(16);
  fill_pattern(src.bytes(0, 600), 6);
  ASSERT_TRUE(wire.a.post(1, WrOpcode::rdma_write_with_imm, {src.sge(0, 600)}, 0, target.addr, target.key, 0, kImm));
  const auto out = wire.drain(0);
  ASSERT_EQ(out.size(), 3u);
  for (const Bytes& d : out) wire.deliver(1, d);
  const auto nak_bytes = wire.drain(1);
  const auto nak = views(nak_bytes);
  ASSERT_EQ(nak.size(), 1u);
  EXPECT_EQ(nak[0].headers.aeth.kind, w::AethKind::rnr_nak);
  EXPECT_EQ(nak[0].headers.bth.psn, 102u);  // the LAST packet; FIRST and MIDDLE were placed
  EXPECT_EQ(nak[0].headers.aeth.msn, 0u);
  EXPECT_TRUE(wire.b.rcq.wcs.empty());
  wire.deliver(0, nak_bytes[0]);
  EXPECT_TRUE(wire.drain(0).empty());  // waits out the RNR timer
  // A second try still finds no receive.
  wire.now = *wire.a.qp.next_deadline();
  wire.a.qp.handle_timeout(wire.now);
  auto again = wire.drain(0);
  ASSERT_EQ(again.size(), 1u);
  EXPECT_EQ(Wire::view(again[0]).headers.bth.opcode, O::rc_rdma_write_last_immediate);
  EXPECT_EQ(Wire::view(again[0]).headers.bth.psn, 102u);
  wire.deliver(1, again[0]);
  const auto nak2 = wire.drain(1);
  ASSERT_EQ(nak2.size(), 1u);
  EXPECT_EQ(Wire::view(nak2[0]).headers.aeth.kind, w::AethKind::rnr_nak);
  EXPECT_EQ(Wire::view(nak2[0]).headers.bth.psn, 102u);
  wire.deliver(0, nak2[0]);
  EXPECT_TRUE(wire.a.scq.wcs.empty());
  EXPECT_TRUE(wire.b.rcq.wcs.empty());
  // Posting a receive lets the resend through.
  ASSERT_TRUE(wire.b.recv(4, {rbuf.sge(0, 16)}));
  std::vector<O> resent;
  wire.filter = [&](int from, const w::PacketView& pv) {
    if (from == 0) resent.push_back(pv.headers.bth.opcode);
    return true;
  };
  wire.now = *wire.a.qp.next_deadline();
  wire.a.qp.handle_timeout(wire.now);
  wire.run();
  EXPECT_EQ(resent, (std::vector<O>{O::rc_rdma_write_last_immediate}));
  ASSERT_EQ(wire.b.rcq.wcs.size(), 1u);
  EXPECT_EQ(wire.b.rcq.wcs[0].wr_id, 4u);
  EXPECT_EQ(wire.b.rcq.wcs[0].opcode, WcOpcode::recv_rdma_with_imm);
  EXPECT_EQ(wire.b.rcq.wcs[0].byte_len, 600u);
  EXPECT_EQ(wire.b.rcq.wcs[0].imm_data, kImm);
  EXPECT_TRUE(has_pattern(target.bytes(0, 600), 6));
  ASSERT_EQ(wire.a.scq.wcs.size(), 1u);
  EXPECT_EQ(wire.a.scq.wcs[0].status, WcStatus::success);
  EXPECT_EQ(wire.b.qp.stats().rnr_naks_sent, 2u);
  EXPECT_EQ(wire.a.qp.stats().rnr_naks_received, 2u);
}

TEST(RcRules, DuplicateLastPacketsWithImmediateDoNotCompleteTwice) {
  Wire wire;  // PMTU 256
  Mr src = wire.a.reg(1000);
  Mr target = wire.b.reg(1000);
  Mr dst = wire.b.reg(1000);
  for (std::uint64_t id = 1; id <= 4; ++id) ASSERT_TRUE(wire.b.recv(id, {dst.sge((id - 1) * 250, 250)}));
  ASSERT_TRUE(wire.a.post(1, WrOpcode::send_with_imm, {src.sge(0, 200)}, 0, 0, 0, 0, htonl(1)));
  ASSERT_TRUE(wire.a.post(2, WrOpcode::rdma_write_with_imm, {src.sge(0, 300)}, 0, target.addr, target.key, 0,
                          htonl(2)));
  ASSERT_TRUE(wire.a.post(3, WrOpcode::rdma_write_with_imm, {}, 0, 0, 0, 0, htonl(3)));
  const auto out = wire.drain(0);
  ASSERT_EQ(out.size(), 4u);  // SEND ONLY imm, WRITE FIRST + LAST imm, WRITE ONLY imm
  for (const Bytes& d : out) wire.deliver(1, d);
  wire.drain(1);  // the ACK is "lost"
  ASSERT_EQ(wire.b.rcq.wcs.size(), 3u);
  // Every packet again, as the requester's timeout would resend them: acknowledged, not
  // executed; no receive is consumed and nothing completes again.
  for (const Bytes& d : out) wire.deliver(1, d);
  const auto acks = views(wire.drain(1));
  ASSERT_FALSE(acks.empty());
  EXPECT_EQ(acks.back().headers.aeth.kind, w::AethKind::ack);
  EXPECT_EQ(acks.back().headers.bth.psn, 103u);
  EXPECT_EQ(acks.back().headers.aeth.msn, 3u);
  EXPECT_EQ(wire.b.qp.stats().duplicate_requests, 4u);
  ASSERT_EQ(wire.b.rcq.wcs.size(), 3u);
  EXPECT_EQ(wire.b.qp.recv_queue_size(), 1u);
  for (std::uint32_t i = 0; i < 3; ++i) {
    EXPECT_EQ(wire.b.rcq.wcs[i].wr_id, i + 1);
    EXPECT_EQ(wire.b.rcq.wcs[i].imm_data, htonl(i + 1));
  }
  EXPECT_EQ(wire.b.rcq.wcs[0].opcode, WcOpcode::recv);
  EXPECT_EQ(wire.b.rcq.wcs[1].opcode, WcOpcode::recv_rdma_with_imm);
  EXPECT_EQ(wire.b.rcq.wcs[2].opcode, WcOpcode::recv_rdma_with_imm);
  // And through the requester's own timer: still three receive completions.
  wire.run();
  EXPECT_EQ(wire.b.rcq.wcs.size(), 3u);
  ASSERT_EQ(wire.a.scq.wcs.size(), 3u);
  for (const WorkCompletion& wc : wire.a.scq.wcs) EXPECT_EQ(wc.status, WcStatus::success);
}

TEST(RcRules, ReceiveTooSmallIsALengthErrorAndAnInvalidRequestNak) {
  Wire wire;
  Mr src = wire.a.reg(512);
  Mr dst = wire.b.reg(512);
  ASSERT_TRUE(wire.b.recv(1, {dst.sge(0, 100)}));
  ASSERT_TRUE(wire.b.recv(2, {dst.sge(100, 100)}));
  ASSERT_TRUE(wire.a.post(1, WrOpcode::send, {src.sge(0, 300)}));
  wire.run();
  ASSERT_EQ(wire.b.rcq.wcs.size(), 2u);
  EXPECT_EQ(wire.b.rcq.wcs[0].status, WcStatus::local_length_error);
  EXPECT_EQ(wire.b.rcq.wcs[1].status, WcStatus::wr_flush_error);
  ASSERT_EQ(wire.a.scq.wcs.size(), 1u);
  EXPECT_EQ(wire.a.scq.wcs[0].status, WcStatus::remote_invalid_request_error);
}

TEST(RcRules, ModifyToErrorFlushesEveryWrExactlyOnce) {
  Wire wire;
  wire.filter = [](int, const w::PacketView&) { return false; };
  Mr buf = wire.a.reg(256);
  ASSERT_TRUE(wire.a.recv(10, {buf.sge(0, 64)}));
  ASSERT_TRUE(wire.a.recv(11, {buf.sge(64, 64)}));
  for (std::size_t i = 0; i < 3; ++i) ASSERT_TRUE(wire.a.post(i, WrOpcode::send, {buf.sge(128, 8)}));
  wire.settle();
  wire.a.qp.modify_to_error();
  wire.a.qp.modify_to_error();
  ASSERT_EQ(wire.a.scq.wcs.size(), 3u);
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(wire.a.scq.wcs[i].wr_id, static_cast<std::uint64_t>(i));
    EXPECT_EQ(wire.a.scq.wcs[i].status, WcStatus::wr_flush_error);
  }
  ASSERT_EQ(wire.a.rcq.wcs.size(), 2u);
  EXPECT_EQ(wire.a.rcq.wcs[0].wr_id, 10u);
  EXPECT_EQ(wire.a.rcq.wcs[1].wr_id, 11u);
  const auto events = wire.a.events();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].cause, RcErrorCause::modified_to_error);
  wire.run();
  EXPECT_EQ(wire.a.scq.wcs.size(), 3u);
}

// A region deregistered while a WR on it is outstanding: the resend does not read it (the
// application may have freed the memory), the WR fails with a local protection error and
// the QP goes to ERROR. Likewise a READ whose sink went before its response came.
TEST(RcRules, RegionDeregisteredUnderAnOutstandingWrFailsItWithoutTouchingTheMemory) {
  for (const bool read : {false, true}) {
    SCOPED_TRACE(read ? "READ" : "SEND");
    Wire wire;
    Mr local = wire.a.reg(512);
    Mr remote = wire.b.reg(512);
    std::fill(local.data, local.data + 512, std::uint8_t{0});
    std::fill(remote.data, remote.data + 512, std::uint8_t{0x5A});
    ASSERT_TRUE(wire.b.recv(1, {remote.sge(0, 512)}));
    if (read)
      ASSERT_TRUE(wire.a.post(7, WrOpcode::rdma_read, {local.sge(0, 300)}, 0, remote.addr, remote.key));
    else
      ASSERT_TRUE(wire.a.post(7, WrOpcode::send, {local.sge(0, 300)}));
    EXPECT_FALSE(wire.drain(0).empty());  // the first transmission is lost
    ASSERT_TRUE(wire.a.memory.deregister(local.key).has_value());
    std::size_t resent = 0;
    wire.filter = [&](int from, const w::PacketView&) {
      resent += from == 0;
      return true;
    };
    wire.run();
    if (read) {
      // The READ is asked again (a request carries no local data); its response is not placed.
      EXPECT_GE(resent, 1u);
      EXPECT_TRUE(std::all_of(local.data, local.data + 512, [](std::uint8_t x) { return x == 0; }));
    } else {
      EXPECT_EQ(resent, 0u) << "nothing is sent from the deregistered region";
    }
    ASSERT_EQ(wire.a.scq.wcs.size(), 1u);
    EXPECT_EQ(wire.a.scq.wcs[0].wr_id, 7u);
    EXPECT_EQ(wire.a.scq.wcs[0].status, WcStatus::local_protection_error);
    EXPECT_EQ(wire.a.qp.state(), QpState::error);
  }
}

TEST(RcRules, GatherFormCarriesTheSameBytesAsTheCopyForm) {
  Wire one;
  Wire two;
  Mr s1 = one.a.reg(1000);
  Mr s2 = two.a.reg(1000);
  fill_pattern(s1.bytes(0, 1000), 3);
  fill_pattern(s2.bytes(0, 1000), 3);
  ASSERT_TRUE(one.a.post(1, WrOpcode::send, {s1.sge(0, 100), s1.sge(500, 333)}));
  ASSERT_TRUE(two.a.post(1, WrOpcode::send, {s2.sge(0, 100), s2.sge(500, 333)}));
  const auto copied = one.drain(0);
  std::vector<Bytes> gathered;
  RcDatagram d;
  while (two.a.qp.poll_datagram(d)) {
    Bytes bytes(d.header.begin(), d.header.begin() + static_cast<std::ptrdiff_t>(d.header_size));
    for (const iovec& piece : d.payload) {
      const auto* p = static_cast<const std::uint8_t*>(piece.iov_base);
      bytes.insert(bytes.end(), p, p + piece.iov_len);
    }
    bytes.insert(bytes.end(), d.trailer.begin(), d.trailer.begin() + static_cast<std::ptrdiff_t>(d.trailer_size));
    EXPECT_EQ(bytes.size(), d.size());
    gathered.push_back(bytes);
  }
  EXPECT_EQ(copied, gathered);
  ASSERT_EQ(copied.size(), 2u);  // 433 bytes at PMTU 256
  for (const Bytes& b : copied) EXPECT_TRUE(w::decode_verified_packet(b, pseudo_from(one.params.a)).has_value());
}

TEST(RcRules, ConnectChecksParameterWidths) {
  Node node(1);
  RcConnectParams p = pair_params().a;
  p.send_psn = w::kPsnModulus;
  EXPECT_FALSE(node.qp.connect(p, Time{}).has_value());
  p = pair_params().a;
  p.pmtu = static_cast<w::PathMtu>(6);
  EXPECT_FALSE(node.qp.connect(p, Time{}).has_value());
  p = pair_params().a;
  EXPECT_TRUE(node.qp.connect(p, Time{}).has_value());
  EXPECT_EQ(node.qp.connect(p, Time{}).error(), std::errc::already_connected);
}

}  // namespace
}  // namespace peercm::core::roce::test
