// Shared receive queues through the public API: one SRQ on a server serving the QPs of
// several connections (peercm clients, and a hand-driven peer where a test needs a message
// stopped halfway), with the verbs rules for ordering, completions, flushing and lifetime.
#include <gtest/gtest.h>

#include <functional>
#include <thread>

#include "loopback_pair.hpp"
#include "raw_peer.hpp"

namespace peercm::test {
namespace {

constexpr std::size_t kSlot = 64;  // bytes of receive buffer per SRQ WR

struct Link {
  Side client;
  std::unique_ptr<CmId> server_id;
  QueuePair* server_qp = nullptr;
};

// A listening server whose accepted QPs take their receives from one SRQ, and receive
// buffers of kSlot bytes for it. `crc`: the CmOption::crc of both ends; required by
// default, so that a one-segment Send takes its WR and completes in one step.
struct SrqServer {
  explicit SrqServer(std::int64_t crc_policy = 0, std::size_t slot_count = 128,
                     Transport transport_kind = Transport::iwarp)
      : crc(crc_policy), transport(transport_kind), slots(slot_count * kSlot, 0) {
    listener = std::move(CmId::create(*server.context, *server.channel, nullptr, transport).value());
    EXPECT_TRUE(listener->set_option(CmOption::crc, crc));
    EXPECT_TRUE(listener->bind(transport == Transport::roce ? random_loopback(0) : loopback(0)));
    EXPECT_TRUE(listener->listen(16));
    address = listener->local_address();
    port = ntohs(address.sin_port);
    srq = std::move(SharedReceiveQueue::create(*server.pd, SrqAttr{.max_wr = 256, .max_sge = 2}).value());
    slots_mr = server.region(slots);
  }

  QpInitAttr qp_attr() const {
    QpInitAttr attr = server.qp_attr();
    attr.srq = srq.get();
    return attr;
  }
  Status<std::errc> post(std::uint64_t wr_id, std::size_t slot) {
    return srq->post_recv(RecvWr{.wr_id = wr_id, .sg_list = {slots_mr->sge(slot * kSlot, kSlot)}});
  }
  std::span<const std::uint8_t> slot(std::size_t i) const { return std::span(slots).subspan(i * kSlot, kSlot); }

  // Takes the next CONNECT_REQUEST and accepts it on a QP with the SRQ.
  QueuePair* accept_next(std::unique_ptr<CmId>& id) {
    auto request = expect_event(*server.channel, CmEventType::connect_request);
    EXPECT_TRUE(request.new_id);
    if (!request.new_id) return nullptr;
    id = std::move(request.new_id);
    QueuePair* qp = id->create_qp(*server.pd, qp_attr()).value();
    EXPECT_TRUE(id->accept({}));
    expect_event(*server.channel, CmEventType::established);
    return qp;
  }

  std::unique_ptr<Link> connect_client() {
    auto link = std::make_unique<Link>();
    Side& c = link->client;
    c.id = std::move(CmId::create(*c.context, *c.channel, nullptr, transport).value());
    EXPECT_TRUE(c.id->set_option(CmOption::peer_to_peer, 0));
    EXPECT_TRUE(c.id->set_option(CmOption::crc, crc));
    EXPECT_TRUE(c.id->resolve_addr(address));
    expect_event(*c.channel, CmEventType::addr_resolved);
    EXPECT_TRUE(c.id->resolve_route());
    expect_event(*c.channel, CmEventType::route_resolved);
    c.qp = c.id->create_qp(*c.pd, c.qp_attr()).value();
    EXPECT_TRUE(c.id->connect({}));
    link->server_qp = accept_next(link->server_id);
    expect_event(*c.channel, CmEventType::established);
    return link;
  }

  std::int64_t crc;
  Transport transport;
  Side server;
  std::unique_ptr<CmId> listener;
  sockaddr_in address{};
  std::uint16_t port = 0;
  std::unique_ptr<SharedReceiveQueue> srq;
  std::vector<std::uint8_t> slots;
  std::unique_ptr<MemoryRegion> slots_mr;
};

// A raw peer through the MPA exchange with CRC (RFC 5044 §7.1.2), accepted by `server`.
struct RawLink {
  RawSocket socket;
  std::unique_ptr<CmId> server_id;
  QueuePair* server_qp = nullptr;
};

std::unique_ptr<RawLink> connect_raw(SrqServer& server) {
  auto link = std::make_unique<RawLink>();
  link->socket = RawSocket::connect_to(server.port);
  EXPECT_GE(link->socket.fd(), 0);
  EXPECT_TRUE(link->socket.send_all(mpa_request_bytes(true)));
  link->server_qp = server.accept_next(link->server_id);
  EXPECT_FALSE(read_mpa_frame(link->socket, 2s).empty()) << "no MPA Reply";
  return link;
}

std::vector<std::uint8_t> send_fpdu(std::uint32_t msn, bool last, std::span<const std::uint8_t> payload) {
  return fpdu_bytes(wire::SegmentHeader{.opcode = wire::RdmapOpcode::send, .last = last, .queue_number = 0, .msn = msn},
                    payload, true);
}

// A signaled Send of `size` bytes of `fill` from `side`, waited for.
void send_message(Side& side, std::uint8_t fill, std::size_t size = 24) {
  std::vector<std::uint8_t> payload(size, fill);
  auto mr = side.region(payload);
  ASSERT_TRUE(side.qp->post_send(SendWr{.wr_id = fill, .opcode = WrOpcode::send, .sg_list = {mr->sge()}}));
  auto sent = poll_n(*side.cq, 1);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].status, WcStatus::success);
}

bool wait_until(const std::function<bool()>& condition, std::chrono::milliseconds timeout = 5s) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!condition()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

// The tests that run on both transports: RoCE's RC responder takes an SRQ's receives the
// same way (rc_queue_pair.hpp).
class SharedReceiveQueueOn : public ::testing::TestWithParam<Transport> {};

TEST_P(SharedReceiveQueueOn, ReceivesAreTakenInPostingOrderAcrossQueuePairs) {
  SrqServer s(0, 128, GetParam());
  auto a = s.connect_client();
  auto b = s.connect_client();
  ASSERT_NE(a->server_qp->qp_num(), b->server_qp->qp_num());
  for (std::size_t i = 0; i < 6; ++i) ASSERT_TRUE(s.post(100 + i, i));
  EXPECT_EQ(s.srq->posted(), 6u);
  Link* order[] = {a.get(), b.get(), b.get(), a.get(), b.get(), a.get()};
  for (std::size_t i = 0; i < 6; ++i) {
    SCOPED_TRACE(i);
    Link& from = *order[i];
    const auto fill = static_cast<std::uint8_t>(0x10 + i);
    send_message(from.client, fill, 8 + i);
    auto got = poll_n(*s.server.cq, 1);
    ASSERT_EQ(got.size(), 1u);
    EXPECT_EQ(got[0].status, WcStatus::success);
    EXPECT_EQ(got[0].opcode, WcOpcode::recv);
    EXPECT_EQ(got[0].wr_id, 100 + i) << "the oldest WR, whichever QP the Send came through";
    EXPECT_EQ(got[0].qp_num, from.server_qp->qp_num());
    EXPECT_EQ(got[0].byte_len, 8 + i);
    const auto slot = s.slot(i);
    EXPECT_TRUE(std::all_of(slot.begin(), slot.begin() + static_cast<std::ptrdiff_t>(8 + i),
                            [fill](std::uint8_t x) { return x == fill; }));
    EXPECT_EQ(slot[8 + i], 0) << "nothing written past the message";
  }
  EXPECT_EQ(s.srq->posted(), 0u);
}

// Both clients stream at once: every Send still takes the oldest WR at its arrival, so each
// client's messages sit in its slots in its own order and the CQ names the right QP.
TEST_P(SharedReceiveQueueOn, ConcurrentSendersShareOneQueueInArrivalOrder) {
  constexpr std::size_t kPerClient = 48;
  SrqServer s(0, 128, GetParam());
  auto a = s.connect_client();
  auto b = s.connect_client();
  for (std::size_t i = 0; i < 2 * kPerClient; ++i) ASSERT_TRUE(s.post(i, i));
  auto stream = [&](Link& link, std::uint8_t tag) {
    std::vector<std::uint8_t> payload(2 * kPerClient);
    auto mr = link.client.region(payload);
    for (std::size_t i = 0; i < kPerClient; ++i) {
      payload[2 * i] = tag;
      payload[2 * i + 1] = static_cast<std::uint8_t>(i);
      ASSERT_TRUE(link.client.qp->post_send(
          SendWr{.wr_id = i, .opcode = WrOpcode::send, .sg_list = {mr->sge(2 * i, 2)}}));
    }
    EXPECT_EQ(poll_n(*link.client.cq, kPerClient).size(), kPerClient);
  };
  std::thread ta(stream, std::ref(*a), std::uint8_t{'a'});
  std::thread tb(stream, std::ref(*b), std::uint8_t{'b'});
  ta.join();
  tb.join();
  auto got = poll_n(*s.server.cq, 2 * kPerClient);
  ASSERT_EQ(got.size(), 2 * kPerClient);
  std::size_t next_a = 0, next_b = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(got[i].status, WcStatus::success);
    EXPECT_EQ(got[i].wr_id, i) << "one-segment messages complete in the order they took their WRs";
    const auto slot = s.slot(got[i].wr_id);
    if (slot[0] == 'a') {
      EXPECT_EQ(got[i].qp_num, a->server_qp->qp_num());
      EXPECT_EQ(slot[1], next_a++);
    } else {
      EXPECT_EQ(slot[0], 'b');
      EXPECT_EQ(got[i].qp_num, b->server_qp->qp_num());
      EXPECT_EQ(slot[1], next_b++);
    }
  }
  EXPECT_EQ(next_a, kPerClient);
  EXPECT_EQ(next_b, kPerClient);
}

// CRC off, so segments are checked at their headers and placed straight from the socket:
// messages of many segments from two QPs interleave at the SRQ, and each one keeps the WR
// its first segment took.
TEST_P(SharedReceiveQueueOn, MultiSegmentMessagesKeepTheReceiveTheyTook) {
  constexpr std::size_t kSize = 256 * 1024;
  constexpr std::size_t kEach = 4;
  SrqServer s(2, 128, GetParam());
  auto a = s.connect_client();
  auto b = s.connect_client();
  std::vector<std::uint8_t> sink(2 * kEach * kSize, 0);
  auto sink_mr = s.server.region(sink);
  for (std::size_t i = 0; i < 2 * kEach; ++i) {
    const std::size_t at = i * kSize;
    ASSERT_TRUE(s.srq->post_recv(RecvWr{
        .wr_id = i, .sg_list = {sink_mr->sge(at, kSize / 3), sink_mr->sge(at + kSize / 3, kSize - kSize / 3)}}));
  }
  auto byte_of = [](std::uint8_t tag, std::size_t seq, std::size_t k) {
    return static_cast<std::uint8_t>(tag * 31u + seq * 7u + k * 131u + (k >> 9));
  };
  auto stream = [&](Link& link, std::uint8_t tag) {
    std::vector<std::uint8_t> payload(kEach * kSize);
    for (std::size_t seq = 0; seq < kEach; ++seq)
      for (std::size_t k = 0; k < kSize; ++k) payload[seq * kSize + k] = byte_of(tag, seq, k);
    auto mr = link.client.region(payload);
    for (std::size_t seq = 0; seq < kEach; ++seq)
      ASSERT_TRUE(link.client.qp->post_send(
          SendWr{.wr_id = seq, .opcode = WrOpcode::send, .sg_list = {mr->sge(seq * kSize, kSize)}}));
    EXPECT_EQ(poll_n(*link.client.cq, kEach, 30s).size(), kEach);
  };
  std::thread ta(stream, std::ref(*a), std::uint8_t{1});
  std::thread tb(stream, std::ref(*b), std::uint8_t{2});
  ta.join();
  tb.join();
  auto got = poll_n(*s.server.cq, 2 * kEach, 30s);
  ASSERT_EQ(got.size(), 2 * kEach);
  std::size_t next[2] = {0, 0};
  std::uint64_t last_wr[2] = {0, 0};
  for (const WorkCompletion& wc : got) {
    SCOPED_TRACE(wc.wr_id);
    ASSERT_EQ(wc.status, WcStatus::success);
    EXPECT_EQ(wc.byte_len, kSize);
    const bool from_a = wc.qp_num == a->server_qp->qp_num();
    ASSERT_TRUE(from_a || wc.qp_num == b->server_qp->qp_num());
    const int who = from_a ? 0 : 1;
    if (next[who] > 0) {
      EXPECT_GT(wc.wr_id, last_wr[who]) << "a QP's messages take WRs in its own order";
    }
    last_wr[who] = wc.wr_id;
    const std::size_t seq = next[who]++;
    const auto tag = static_cast<std::uint8_t>(who + 1);
    std::size_t wrong = 0;
    for (std::size_t k = 0; k < kSize; ++k) wrong += sink[wc.wr_id * kSize + k] != byte_of(tag, seq, k);
    EXPECT_EQ(wrong, 0u) << "message " << seq << " of QP " << wc.qp_num;
  }
  EXPECT_EQ(next[0], kEach);
  EXPECT_EQ(next[1], kEach);
}

TEST_P(SharedReceiveQueueOn, QueuePairWithAnSrqRejectsItsOwnPostRecv) {
  SrqServer s(0, 128, GetParam());
  auto a = s.connect_client();
  std::vector<std::uint8_t> buffer(16);
  auto mr = s.server.region(buffer);
  EXPECT_EQ(a->server_qp->post_recv(RecvWr{.wr_id = 1, .sg_list = {mr->sge()}}).error(), std::errc::invalid_argument);
  auto standalone = std::move(QueuePair::create(*s.server.pd, s.qp_attr()).value());
  EXPECT_EQ(standalone->post_recv(RecvWr{.wr_id = 2, .sg_list = {mr->sge()}}).error(), std::errc::invalid_argument);
  // An SRQ serves the QPs of its own context only.
  Side other;
  QpInitAttr foreign = other.qp_attr();
  foreign.srq = s.srq.get();
  EXPECT_EQ(QueuePair::create(*other.pd, foreign).error(), std::errc::invalid_argument);
}

// RoCE (IBTA 9.7.5.2.8): a Send finding the SRQ empty is RNR NAKed and retried (rnr_retry
// 7: forever) until a receive is posted; nothing fails, and the other QP is not held up.
TEST(SharedReceiveQueue, RoceSendFindingTheQueueEmptyWaitsForAReceive) {
  SrqServer s(0, 128, Transport::roce);
  auto a = s.connect_client();
  auto b = s.connect_client();
  std::vector<std::uint8_t> payload(24, 0x77);
  auto mr = a->client.region(payload);
  ASSERT_TRUE(a->client.qp->post_send(SendWr{.wr_id = 1, .opcode = WrOpcode::send, .sg_list = {mr->sge()}}));
  EXPECT_TRUE(poll_n(*a->client.cq, 1, 100ms).empty()) << "the Send waits, it does not fail";
  EXPECT_TRUE(poll_n(*s.server.cq, 1, 50ms).empty());
  ASSERT_TRUE(s.post(500, 3));
  auto got = poll_n(*s.server.cq, 1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].wr_id, 500u);
  EXPECT_EQ(got[0].status, WcStatus::success);
  EXPECT_EQ(got[0].qp_num, a->server_qp->qp_num());
  EXPECT_EQ(got[0].byte_len, 24u);
  EXPECT_TRUE(std::all_of(s.slot(3).begin(), s.slot(3).begin() + 24, [](std::uint8_t x) { return x == 0x77; }));
  auto sent = poll_n(*a->client.cq, 1);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].status, WcStatus::success);
  // The other connection is unaffected.
  ASSERT_TRUE(s.post(501, 4));
  send_message(b->client, 0x33);
  got = poll_n(*s.server.cq, 1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].wr_id, 501u);
  EXPECT_EQ(got[0].qp_num, b->server_qp->qp_num());
}

// RoCE: a QP leaving (its id destroyed) takes no more receives from the SRQ.
TEST(SharedReceiveQueue, RoceQueuePairGoneTakesNoMoreReceives) {
  SrqServer s(0, 128, Transport::roce);
  auto a = s.connect_client();
  auto b = s.connect_client();
  ASSERT_TRUE(s.post(1, 0));
  a->server_id.reset();  // its QP goes with it
  send_message(b->client, 0x21);
  auto got = poll_n(*s.server.cq, 1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].wr_id, 1u);
  EXPECT_EQ(got[0].qp_num, b->server_qp->qp_num());
  EXPECT_EQ(s.srq->posted(), 0u);
  EXPECT_EQ(SharedReceiveQueue::destroy(s.srq).error(), std::errc::device_or_resource_busy) << "b's QP uses it";
}

TEST(SharedReceiveQueue, PostingChecksAndAttributes) {
  Side side;
  EXPECT_EQ(SharedReceiveQueue::create(*side.pd, SrqAttr{.max_wr = 0}).error(), std::errc::invalid_argument);
  auto srq =
      std::move(SharedReceiveQueue::create(*side.pd, SrqAttr{.max_wr = 2, .max_sge = 1, .srq_limit = 1}).value());
  EXPECT_EQ(srq->query().srq_limit, 0u) << "create does not apply the limit (ibv_create_srq)";
  std::vector<std::uint8_t> buffer(64);
  auto mr = side.region(buffer);
  auto read_only = side.region(buffer, kAccessRemoteRead);
  auto other_pd = std::move(ProtectionDomain::allocate(*side.context).value());
  auto foreign_mr = std::move(MemoryRegion::register_memory(*other_pd, buffer.data(), 8, kAccessLocalWrite).value());
  EXPECT_EQ(srq->post_recv(RecvWr{.wr_id = 1, .sg_list = {mr->sge(0, 8), mr->sge(8, 8)}}).error(),
            std::errc::invalid_argument);
  EXPECT_EQ(srq->post_recv(RecvWr{.wr_id = 1, .sg_list = {Sge{.addr = 1, .length = 8, .lkey = 0x1234}}}).error(),
            std::errc::invalid_argument);
  EXPECT_EQ(srq->post_recv(RecvWr{.wr_id = 1, .sg_list = {read_only->sge(0, 8)}}).error(), std::errc::invalid_argument);
  EXPECT_EQ(srq->post_recv(RecvWr{.wr_id = 1, .sg_list = {foreign_mr->sge()}}).error(), std::errc::invalid_argument);
  EXPECT_EQ(srq->posted(), 0u);
  EXPECT_TRUE(srq->post_recv(RecvWr{.wr_id = 1, .sg_list = {mr->sge(0, 8)}}));
  EXPECT_TRUE(srq->post_recv(RecvWr{.wr_id = 2, .sg_list = {}}));
  EXPECT_EQ(srq->post_recv(RecvWr{.wr_id = 3, .sg_list = {mr->sge(16, 8)}}).error(), std::errc::not_enough_memory);
  EXPECT_EQ(srq->posted(), 2u);
  EXPECT_EQ(srq->modify(3).error(), std::errc::invalid_argument);
  EXPECT_TRUE(srq->modify(1));
  const SrqAttr attr = srq->query();
  EXPECT_EQ(attr.max_wr, 2u);
  EXPECT_EQ(attr.max_sge, 1u);
  EXPECT_EQ(attr.srq_limit, 1u);
}

TEST(SharedReceiveQueue, DestroyIsEbusyWhileAQueuePairUsesIt) {
  SrqServer s;
  auto a = s.connect_client();
  auto standalone = std::move(QueuePair::create(*s.server.pd, s.qp_attr()).value());
  EXPECT_EQ(SharedReceiveQueue::destroy(s.srq).error(), std::errc::device_or_resource_busy);
  ASSERT_TRUE(s.srq);
  ASSERT_TRUE(s.post(1, 0)) << "still fully usable";
  a->server_id.reset();  // its QP goes with it
  EXPECT_EQ(SharedReceiveQueue::destroy(s.srq).error(), std::errc::device_or_resource_busy);
  standalone.reset();
  EXPECT_TRUE(SharedReceiveQueue::destroy(s.srq));
  EXPECT_FALSE(s.srq);
}

// A QP's error flushes the WR its message in progress had taken, and only that one: the
// rest stays in the SRQ and keeps serving the other QP.
TEST(SharedReceiveQueue, QueuePairErrorFlushesOnlyTheReceiveItHadTaken) {
  SrqServer s;
  auto b = s.connect_client();
  auto raw = connect_raw(s);
  for (std::size_t i = 0; i < 3; ++i) ASSERT_TRUE(s.post(200 + i, i));
  // The first segment of a two-segment Send (RFC 5041 §5.3: MSN 1, MO 0, no L).
  const std::vector<std::uint8_t> part(16, 0xAB);
  ASSERT_TRUE(raw->socket.send_all(send_fpdu(1, false, part)));
  ASSERT_TRUE(wait_until([&] { return s.srq->posted() == 2; })) << "the segment took no WR";
  EXPECT_TRUE(poll_n(*s.server.cq, 1, 100ms).empty());
  // The other QP's Send meanwhile takes the next WR.
  send_message(b->client, 0x42);
  auto got = poll_n(*s.server.cq, 1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].wr_id, 201u);
  EXPECT_EQ(got[0].qp_num, b->server_qp->qp_num());
  EXPECT_TRUE(std::equal(part.begin(), part.end(), s.slot(0).begin())) << "the first segment was placed";

  raw->server_qp->to_error();
  auto flushed = poll_n(*s.server.cq, 1);
  ASSERT_EQ(flushed.size(), 1u);
  EXPECT_EQ(flushed[0].wr_id, 200u);
  EXPECT_EQ(flushed[0].status, WcStatus::wr_flush_error);
  EXPECT_EQ(flushed[0].qp_num, raw->server_qp->qp_num());
  EXPECT_TRUE(poll_n(*s.server.cq, 1, 200ms).empty()) << "the SRQ's other WRs are not flushed";
  EXPECT_EQ(s.srq->posted(), 1u);

  send_message(b->client, 0x43);
  got = poll_n(*s.server.cq, 1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].wr_id, 202u);
  EXPECT_EQ(got[0].status, WcStatus::success);
  EXPECT_EQ(got[0].qp_num, b->server_qp->qp_num());
}

// RFC 5040 §5.3 / RFC 5041 §7.2: a Send finding the SRQ empty ends the stream with
// Terminate DDP 0x2/0x02 (no buffer), as on a QP without a posted receive.
TEST(SharedReceiveQueue, SendFindingTheQueueEmptyIsASendWithoutAPostedReceive) {
  SrqServer s;
  auto a = s.connect_client();
  auto b = s.connect_client();
  auto raw = connect_raw(s);
  const std::vector<std::uint8_t> payload(16, 0x5C);
  ASSERT_TRUE(raw->socket.send_all(send_fpdu(1, true, payload)));
  bool eof = false;
  const auto stream = parse_peer_stream(raw->socket.read_for(3s, &eof));
  EXPECT_TRUE(eof);
  ASSERT_TRUE(stream.terminate);
  EXPECT_EQ(stream.terminate_control[0], 0x12);  // layer DDP, type untagged buffer error
  EXPECT_EQ(stream.terminate_control[1], 0x02);  // no buffer
  EXPECT_EQ(raw->server_qp->state(), QpState::error);

  // Between two peercm ends: both see the connection end.
  std::vector<std::uint8_t> client_sink(8), message(8, 0x61);
  auto client_sink_mr = a->client.region(client_sink);
  auto message_mr = a->client.region(message);
  ASSERT_TRUE(a->client.qp->post_recv(RecvWr{.wr_id = 7, .sg_list = {client_sink_mr->sge()}}));
  ASSERT_TRUE(a->client.qp->post_send(SendWr{.wr_id = 8, .opcode = WrOpcode::send, .sg_list = {message_mr->sge()}}));
  expect_event(*a->client.channel, CmEventType::disconnected);
  const auto done = poll_n(*a->client.cq, 2);
  ASSERT_EQ(done.size(), 2u);
  EXPECT_TRUE(std::any_of(done.begin(), done.end(), [](const WorkCompletion& wc) {
    return wc.wr_id == 7 && wc.status == WcStatus::wr_flush_error;
  }));
  ASSERT_TRUE(wait_until([&] { return a->server_qp->state() == QpState::error; }));
  EXPECT_TRUE(poll_n(*s.server.cq, 1, 100ms).empty()) << "no receive was taken, none completes";

  ASSERT_TRUE(s.post(300, 0));
  send_message(b->client, 0x62);
  auto got = poll_n(*s.server.cq, 1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].wr_id, 300u);
  EXPECT_EQ(got[0].status, WcStatus::success);
  EXPECT_EQ(got[0].qp_num, b->server_qp->qp_num());
}

INSTANTIATE_TEST_SUITE_P(Transports, SharedReceiveQueueOn, ::testing::Values(Transport::iwarp, Transport::roce),
                         transport_name);

}  // namespace
}  // namespace peercm::test
