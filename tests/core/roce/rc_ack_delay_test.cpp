// ACK coalescing with replies (RcConnectParams::ack_delay): while the traffic alternates,
// the ACK a message asked for waits for our next request and leaves right behind it; a
// hold ends at its deadline, which stops holding until the traffic alternates again;
// duplicates, the coalescing bound and ERROR never wait.
#include <gtest/gtest.h>

#include <algorithm>

#include "rc_test_support.hpp"

namespace peercm::core::roce::test {
namespace {

constexpr Duration kDelay = std::chrono::microseconds(50);

PairParams delayed_pair() {
  PairParams p = pair_params();
  p.a.ack_delay = kDelay;
  p.b.ack_delay = kDelay;
  return p;
}

bool is_ack(const Bytes& datagram) {
  const auto v = Wire::view(datagram);
  return v.headers.bth.opcode == w::Opcode::rc_acknowledge && v.headers.aeth.kind == w::AethKind::ack;
}

// A sends one 8-byte message to B, B one to A, each delivered at once: after the first
// exchange both sides have seen the traffic alternate.
class AckDelay : public ::testing::Test {
 protected:
  AckDelay() : wire(delayed_pair()) {
    a_buf = wire.a.reg(4096);
    b_buf = wire.b.reg(4096);
    for (std::uint64_t i = 0; i < 32; ++i) {
      EXPECT_TRUE(wire.a.recv(100 + i, {a_buf.sge(2048, 64)}));
      EXPECT_TRUE(wire.b.recv(200 + i, {b_buf.sge(2048, 64)}));
    }
  }
  void post_from(int side, std::uint64_t id) {
    Node& n = side == 0 ? wire.a : wire.b;
    const Mr& buf = side == 0 ? a_buf : b_buf;
    ASSERT_TRUE(n.post(id, WrOpcode::send, {buf.sge(0, 8)}));
  }
  // A message from A whose ACK B sends at once (B holds none).
  void send_and_expect_ack_at_once(std::uint64_t id) {
    post_from(0, id);
    for (const Bytes& d : wire.drain(0)) wire.deliver(1, d);
    const auto out = wire.drain(1);
    ASSERT_EQ(out.size(), 1u);
    EXPECT_TRUE(is_ack(out[0]));
    wire.deliver(0, out[0]);
  }
  // One message each way with immediate delivery of everything.
  void ping_pong(std::uint64_t id) {
    post_from(0, id);
    wire.settle();
    post_from(1, id);
    wire.settle();
  }

  Wire wire;
  Mr a_buf;
  Mr b_buf;
};

TEST_F(AckDelay, FirstMessagesAreAckedAtOnceThenTheAckLeavesRightBehindTheReply) {
  // Nothing alternated yet: the ACK leaves at once.
  send_and_expect_ack_at_once(1);
  post_from(1, 1);
  wire.settle();

  post_from(0, 2);
  for (const Bytes& d : wire.drain(0)) wire.deliver(1, d);
  EXPECT_TRUE(wire.drain(1).empty());  // held for the reply
  ASSERT_TRUE(wire.b.qp.next_deadline().has_value());
  EXPECT_EQ(*wire.b.qp.next_deadline(), wire.now + kDelay);
  ASSERT_EQ(wire.b.rcq.wcs.size(), 2u);  // the message itself completed at once
  post_from(1, 2);
  const auto out = wire.drain(1);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(Wire::view(out[0]).headers.bth.opcode, w::Opcode::rc_send_only);
  EXPECT_TRUE(is_ack(out[1]));
  EXPECT_EQ(Wire::view(out[1]).headers.bth.psn, 101u);
  for (const Bytes& d : out) wire.deliver(0, d);
  ASSERT_EQ(wire.a.scq.wcs.size(), 2u);
  EXPECT_EQ(wire.a.scq.wcs[1].wr_id, 2u);
  EXPECT_EQ(wire.a.scq.wcs[1].status, WcStatus::success);
  EXPECT_EQ(wire.a.rcq.wcs.size(), 2u);
}

TEST_F(AckDelay, AHoldEndsAtItsDeadlineAndHoldingStopsUntilTheTrafficAlternatesAgain) {
  ping_pong(1);
  post_from(0, 2);
  for (const Bytes& d : wire.drain(0)) wire.deliver(1, d);
  EXPECT_TRUE(wire.drain(1).empty());
  wire.now += kDelay - std::chrono::microseconds(1);
  wire.b.qp.handle_timeout(wire.now);
  EXPECT_TRUE(wire.drain(1).empty());
  wire.now += std::chrono::microseconds(1);
  wire.b.qp.handle_timeout(wire.now);
  auto out = wire.drain(1);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_TRUE(is_ack(out[0]));
  wire.deliver(0, out[0]);
  EXPECT_EQ(wire.a.scq.wcs.back().wr_id, 2u);

  // Nobody replied: the next message is acknowledged at once.
  send_and_expect_ack_at_once(3);
  // A reply makes the traffic alternate again: the next ACK waits.
  post_from(1, 3);
  wire.settle();
  post_from(0, 4);
  for (const Bytes& d : wire.drain(0)) wire.deliver(1, d);
  EXPECT_TRUE(wire.drain(1).empty());
}

TEST_F(AckDelay, LaterMessagesDoNotPostponeAHeldAck) {
  ping_pong(1);
  const Time start = wire.now;
  post_from(0, 2);
  for (const Bytes& d : wire.drain(0)) wire.deliver(1, d);
  wire.now += std::chrono::microseconds(30);
  post_from(0, 3);
  for (const Bytes& d : wire.drain(0)) wire.deliver(1, d);
  EXPECT_TRUE(wire.drain(1).empty());
  EXPECT_EQ(wire.b.qp.next_deadline(), std::optional<Time>(start + kDelay));
  wire.now = start + kDelay;
  wire.b.qp.handle_timeout(wire.now);
  const auto out = wire.drain(1);
  ASSERT_EQ(out.size(), 1u);  // one ACK covers both
  EXPECT_EQ(Wire::view(out[0]).headers.bth.psn, 102u);
  wire.deliver(0, out[0]);
  EXPECT_EQ(wire.a.scq.wcs.size(), 3u);
}

TEST_F(AckDelay, ADuplicateIsAckedAtOnce) {
  ping_pong(1);
  post_from(0, 2);
  const auto sent = wire.drain(0);
  ASSERT_EQ(sent.size(), 1u);
  wire.deliver(1, sent[0]);
  EXPECT_TRUE(wire.drain(1).empty());
  wire.deliver(1, sent[0]);  // the requester resent it: it waits for this ACK
  const auto out = wire.drain(1);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_TRUE(is_ack(out[0]));
  EXPECT_EQ(wire.b.qp.stats().duplicate_requests, 1u);
}

TEST_F(AckDelay, TheCoalescingBoundIsNeverHeld) {
  ping_pong(1);
  // 16 one-packet messages in one go: the 16th request reaches the bound.
  for (std::uint64_t i = 0; i < 16; ++i) post_from(0, 10 + i);
  for (const Bytes& d : wire.drain(0)) wire.deliver(1, d);
  const auto out = wire.drain(1);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_TRUE(is_ack(out[0]));
  EXPECT_EQ(Wire::view(out[0]).headers.bth.psn, 116u);
}

// A reply of several packets carries the held ACK behind its last one: the peer has read the
// whole reply when the ACK completes its message (a program that watches memory for the reply,
// as perftest's ib_write_lat, finds it landed).
TEST_F(AckDelay, TheHeldAckLeavesBehindTheWholeReply) {
  ping_pong(1);
  post_from(0, 2);
  for (const Bytes& d : wire.drain(0)) wire.deliver(1, d);
  EXPECT_TRUE(wire.drain(1).empty());
  // 600 bytes at a path MTU of 256: FIRST, MIDDLE, LAST.
  for (std::size_t i = 0; i < 600; ++i) b_buf.data[i] = static_cast<std::uint8_t>(i * 7 + 1);
  ASSERT_TRUE(wire.b.post(3, WrOpcode::rdma_write, {b_buf.sge(0, 600)}, 0, a_buf.addr + 1024, a_buf.key));
  const auto out = wire.drain(1);
  ASSERT_EQ(out.size(), 4u);
  EXPECT_EQ(Wire::view(out[0]).headers.bth.opcode, w::Opcode::rc_rdma_write_first);
  EXPECT_EQ(Wire::view(out[1]).headers.bth.opcode, w::Opcode::rc_rdma_write_middle);
  EXPECT_EQ(Wire::view(out[2]).headers.bth.opcode, w::Opcode::rc_rdma_write_last);
  EXPECT_TRUE(is_ack(out[3]));
  EXPECT_EQ(Wire::view(out[3]).headers.bth.psn, 101u);
  for (const Bytes& d : out) wire.deliver(0, d);
  ASSERT_EQ(wire.a.scq.wcs.back().wr_id, 2u);
  EXPECT_EQ(wire.a.memory.remote_writes_landed(), 1u);
  EXPECT_TRUE(std::equal(b_buf.data, b_buf.data + 600, a_buf.data + 1024));
  // Holding goes on: A holds its ACK of the Write for its own next message.
  EXPECT_TRUE(wire.drain(0).empty());
}

// A held ACK that leaves behind a reply acknowledges every request before it, so the
// coalescing bound counts from there: in a long ping-pong no ACK ever leaves alone. (When the
// bound counted only ACKs sent at once, every 16th message's ACK did, ahead of the reply, and
// the requester took its completion before the answer had come.)
TEST_F(AckDelay, AckThatLeftBehindAReplyRestartsTheCoalescingBound) {
  ping_pong(1);
  for (std::uint64_t id = 2; id < 31; ++id) {  // 30 messages each way, within the 32 receives
    post_from(0, id);
    for (const Bytes& d : wire.drain(0)) wire.deliver(1, d);
    ASSERT_TRUE(wire.drain(1).empty()) << "message " << id << ": its ACK left before the reply";
    post_from(1, id);
    const auto out = wire.drain(1);
    ASSERT_EQ(out.size(), 2u) << "message " << id;
    EXPECT_EQ(Wire::view(out[0]).headers.bth.opcode, w::Opcode::rc_send_only);
    EXPECT_TRUE(is_ack(out[1]));
    for (const Bytes& d : out) wire.deliver(0, d);
    // A's next message carries B's held ACK the same way.
    ASSERT_EQ(wire.a.scq.wcs.back().wr_id, id);
  }
}

// The bound counts requests piling up across messages, not one message's own packets: a
// 16-packet Write alone since the last ACK (64 KiB at a 4096-byte MTU) waits for the reply
// like a one-packet message.
TEST_F(AckDelay, AMessageOfBoundManyPacketsWaitsForTheReply) {
  ping_pong(1);
  ASSERT_TRUE(wire.a.post(2, WrOpcode::rdma_write, {a_buf.sge(0, 16 * 256)}, 0, b_buf.addr, b_buf.key));
  const auto request = wire.drain(0);
  ASSERT_EQ(request.size(), 16u);
  for (const Bytes& d : request) wire.deliver(1, d);
  EXPECT_TRUE(wire.drain(1).empty()) << "the ACK of a lone 16-packet message left before the reply";
  post_from(1, 2);
  const auto out = wire.drain(1);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(Wire::view(out[0]).headers.bth.opcode, w::Opcode::rc_send_only);
  EXPECT_TRUE(is_ack(out[1]));
  EXPECT_EQ(Wire::view(out[1]).headers.bth.psn, Wire::view(request.back()).headers.bth.psn);
}

TEST_F(AckDelay, AHeldAckStillLeavesWhenTheQpIsModifiedToError) {
  ping_pong(1);
  post_from(0, 2);
  for (const Bytes& d : wire.drain(0)) wire.deliver(1, d);
  EXPECT_TRUE(wire.drain(1).empty());
  wire.b.qp.modify_to_error();
  const auto out = wire.drain(1);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_TRUE(is_ack(out[0]));
  wire.deliver(0, out[0]);
  EXPECT_EQ(wire.a.scq.wcs.back().wr_id, 2u);
  EXPECT_EQ(wire.a.scq.wcs.back().status, WcStatus::success);
}

TEST(AckDelayOff, ZeroDelayAcksEveryMessageAtOnce) {
  Wire wire;  // ack_delay zero
  Mr a_buf = wire.a.reg(256);
  Mr b_buf = wire.b.reg(256);
  for (std::uint64_t i = 0; i < 4; ++i) {
    ASSERT_TRUE(wire.a.recv(i, {a_buf.sge(128, 64)}));
    ASSERT_TRUE(wire.b.recv(i, {b_buf.sge(128, 64)}));
  }
  for (std::uint64_t i = 0; i < 3; ++i) {
    ASSERT_TRUE(wire.a.post(i, WrOpcode::send, {a_buf.sge(0, 8)}));
    for (const Bytes& d : wire.drain(0)) wire.deliver(1, d);
    const auto out = wire.drain(1);
    ASSERT_EQ(out.size(), 1u);
    EXPECT_TRUE(is_ack(out[0]));
    wire.deliver(0, out[0]);
    ASSERT_TRUE(wire.b.post(i, WrOpcode::send, {b_buf.sge(0, 8)}));
    wire.settle();
  }
  EXPECT_EQ(wire.a.scq.wcs.size(), 3u);
  EXPECT_EQ(wire.b.scq.wcs.size(), 3u);
}

}  // namespace
}  // namespace peercm::core::roce::test
