// The RDMA data path over loopback through the public API: every operation at sizes from
// 0 B to 16 MiB, over iWARP with CRC on and off and over RoCEv2, plus the error paths that
// end in a Terminate.
#include <arpa/inet.h>
#include <gtest/gtest.h>

#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <tuple>

#include "api/context_impl.hpp"
#include "api/roce/roce_verbs.hpp"
#include "loopback_pair.hpp"

namespace peercm::test {
namespace {

std::vector<std::uint8_t> pattern(std::size_t size, unsigned seed) {
  std::vector<std::uint8_t> v(size);
  std::mt19937 rng(seed);
  for (auto& b : v) b = static_cast<std::uint8_t>(rng());
  return v;
}

struct SizeCase {
  std::size_t size;
  bool crc;  // iWARP's MPA CRC; RoCE always has its ICRC
  Transport transport = Transport::iwarp;
};

std::string name_of(const testing::TestParamInfo<SizeCase>& info) {
  if (info.param.transport == Transport::roce) return std::to_string(info.param.size) + "_roce";
  return std::to_string(info.param.size) + (info.param.crc ? "_crc" : "_nocrc");
}

class DataPath : public testing::TestWithParam<SizeCase> {
 protected:
  void SetUp() override {
    Options options;
    options.crc = GetParam().crc ? 0 : 2;
    options.transport = GetParam().transport;
    pair_ = LoopbackPair::connected(options);
  }
  std::unique_ptr<LoopbackPair> pair_;
};

// A message scattered over three SGEs arrives in a receive with three SGEs of other sizes.
TEST_P(DataPath, SendRecvWithMultipleSges) {
  const std::size_t size = GetParam().size;
  auto source = pattern(size, 1);
  std::vector<std::uint8_t> sink(size + 64, 0xCC);
  auto src_mr = pair_->client.region(source);
  auto sink_mr = pair_->server.region(sink);
  const std::size_t a = size / 3, b = size / 2;
  const std::size_t c = size + 64 - a - b;
  ASSERT_TRUE(pair_->server.qp->post_recv(
      RecvWr{.wr_id = 10, .sg_list = {sink_mr->sge(0, b), sink_mr->sge(b, a), sink_mr->sge(a + b, c)}}));
  ASSERT_TRUE(pair_->client.qp->post_send(SendWr{
      .wr_id = 20,
      .opcode = WrOpcode::send,
      .sg_list = {src_mr->sge(0, a), src_mr->sge(a, size / 4), src_mr->sge(a + size / 4, size - a - size / 4)}}));
  auto recv = poll_n(*pair_->server.cq, 1, 30s);
  auto sent = poll_n(*pair_->client.cq, 1, 30s);
  ASSERT_EQ(recv.size(), 1u);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(recv[0].status, WcStatus::success);
  EXPECT_EQ(recv[0].opcode, WcOpcode::recv);
  EXPECT_EQ(recv[0].byte_len, size);
  EXPECT_EQ(sent[0].wr_id, 20u);
  EXPECT_EQ(sent[0].status, WcStatus::success);
  // Receive SGE order: [0,b) then [b,b+a) then the rest.
  std::vector<std::uint8_t> got(sink.begin(), sink.begin() + static_cast<std::ptrdiff_t>(size));
  EXPECT_TRUE(got == source);
  EXPECT_EQ(sink[size], 0xCC) << "nothing written past the message";
}

TEST_P(DataPath, RdmaWrite) {
  const std::size_t size = GetParam().size;
  auto source = pattern(size, 2);
  std::vector<std::uint8_t> target(size + 16, 0);
  auto src_mr = pair_->client.region(source);
  auto dst_mr = pair_->server.region(target);
  ASSERT_TRUE(pair_->client.qp->post_send(SendWr{.wr_id = 1,
                                                 .opcode = WrOpcode::rdma_write,
                                                 .sg_list = {src_mr->sge()},
                                                 .remote_addr = reinterpret_cast<std::uintptr_t>(target.data()) + 8,
                                                 .rkey = dst_mr->rkey()}));
  auto done = poll_n(*pair_->client.cq, 1, 30s);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].status, WcStatus::success);
  EXPECT_EQ(done[0].opcode, WcOpcode::rdma_write);
  // A following Send makes the Write visible (RFC 5040 §5.5).
  std::vector<std::uint8_t> note(4, 1), note_sink(4);
  auto note_mr = pair_->client.region(note);
  auto note_sink_mr = pair_->server.region(note_sink);
  ASSERT_TRUE(pair_->server.qp->post_recv(RecvWr{.wr_id = 2, .sg_list = {note_sink_mr->sge()}}));
  ASSERT_TRUE(pair_->client.qp->post_send(SendWr{.wr_id = 3, .opcode = WrOpcode::send, .sg_list = {note_mr->sge()}}));
  ASSERT_EQ(poll_n(*pair_->server.cq, 1, 30s).size(), 1u);
  EXPECT_TRUE(std::equal(source.begin(), source.end(), target.begin() + 8));
  EXPECT_EQ(target[0], 0);
}

// perftest's ib_write_lat takes its Write's completion and then waits for the peer's Write by
// watching memory, calling nothing. A poll whose own pass completes an RDMA Write therefore
// hands the reactor back to the progress thread (docs/progress.md, hand-over 7); a Send's
// completion, after which a program polls for its receive, does not.
TEST(WriteCompletion, APollWhosePassCompletesAWriteHandsTheReactorBack) {
  Options options;
  options.transport = Transport::roce;  // a Write completes on the peer's ACK, read by a pass
  auto pair = LoopbackPair::connected(options);
  const engine::ProgressHandOff& hand_off = pair->client.context->impl().reactor.hand_off();
  std::vector<std::uint8_t> source(4096, 7), target(4096), sink(4096);
  auto src_mr = pair->client.region(source);
  auto dst_mr = pair->server.region(target);
  auto sink_mr = pair->server.region(sink);
  auto operations = [&](WrOpcode opcode, std::uint64_t count, auto done_early) {
    for (std::uint64_t i = 0; i < count && !done_early(); ++i) {
      // Empty polls first: passes of this thread, which park the progress thread.
      WorkCompletion none[1];
      for (int pass = 0; pass < 200; ++pass) ASSERT_EQ(pair->client.cq->poll(none), 0u);
      if (opcode == WrOpcode::send) {
        ASSERT_TRUE(pair->server.qp->post_recv(RecvWr{.wr_id = i, .sg_list = {sink_mr->sge()}}));
      }
      ASSERT_TRUE(pair->client.qp->post_send(SendWr{.wr_id = i,
                                                    .opcode = opcode,
                                                    .sg_list = {src_mr->sge()},
                                                    .remote_addr = reinterpret_cast<std::uintptr_t>(target.data()),
                                                    .rkey = dst_mr->rkey()}));
      const auto done = poll_n(*pair->client.cq, 1, 30s);
      ASSERT_EQ(done.size(), 1u);
      ASSERT_EQ(done[0].status, WcStatus::success);
      if (opcode == WrOpcode::send) {
        ASSERT_EQ(poll_n(*pair->server.cq, 1, 30s).size(), 1u);
      }
    }
  };
  const std::uint64_t before_sends = hand_off.hand_backs();
  operations(WrOpcode::send, 20, [] { return false; });
  EXPECT_EQ(hand_off.hand_backs(), before_sends) << "a Send's completion handed back";
  const std::uint64_t before_writes = hand_off.hand_backs();
  // Not every Write hands back: one whose ACK the progress thread read (it drives for a while
  // after each hand-back) is complete before the poll comes.
  operations(WrOpcode::rdma_write, 200, [&] { return hand_off.hand_backs() - before_writes >= 3; });
  EXPECT_GE(hand_off.hand_backs() - before_writes, 1u) << "Write completions found by a pass did not hand back";
}

// ib_write_lat over RoCE: each side answers the peer's Write with its own, and the ACK it
// held for the peer's Write leaves right behind that answer. So when a poll's pass completes
// a Write, the answer the program will watch for in memory has landed already, and handing
// the reactor back would only wake the progress thread for nothing (docs/progress.md,
// hand-over 7). The peer reads its memory under the context's mutex, where perftest spins on
// it: the same order of events, without a data race for the sanitizers. A round in which the
// client's recovery or ACK timer fired (the peer was slow: a loaded machine, a sanitizer) is
// exempt: its probe is a duplicate there, which is ACKed at once, ahead of the answer.
TEST(WriteCompletion, AWriteWhoseAnswerLandedBeforeItsAckDoesNotHandBack) {
  Options options;
  options.transport = Transport::roce;
  options.context.roce.ack_delay = std::chrono::milliseconds(200);  // no hold runs out on a slow run
  auto pair = LoopbackPair::connected(options);
  const engine::ProgressHandOff& hand_off = pair->client.context->impl().reactor.hand_off();
  std::vector<std::uint8_t> client_buf(64), server_buf(64);
  auto client_mr = pair->client.region(client_buf);
  auto server_mr = pair->server.region(server_buf);
  constexpr int kRounds = 100;
  constexpr int kWarmUp = 3;  // the first Writes are ACKed at once: the traffic has not alternated yet
  auto write = [](Side& side, MemoryRegion& local, MemoryRegion& remote, std::vector<std::uint8_t>& buf, int round) {
    // The first half is what a side writes, into the second half of the peer's buffer, whose
    // last byte the peer watches.
    buf[31] = static_cast<std::uint8_t>(round);
    ASSERT_TRUE(side.qp->post_send(SendWr{.wr_id = static_cast<std::uint64_t>(round),
                                          .opcode = WrOpcode::rdma_write,
                                          .sg_list = {local.sge(0, 32)},
                                          .remote_addr = reinterpret_cast<std::uintptr_t>(remote.addr()) + 32,
                                          .rkey = remote.rkey()}));
  };
  auto landed = [](Side& side, std::vector<std::uint8_t>& buf) {
    std::lock_guard lock(side.context->impl().mutex);
    return buf[63];
  };
  std::thread server([&] {
    WorkCompletion wc[4];
    for (int round = 1; round <= kRounds; ++round) {
      const auto deadline = std::chrono::steady_clock::now() + 30s;
      while (landed(pair->server, server_buf) != static_cast<std::uint8_t>(round)) {
        ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "round " << round;
        for (std::size_t n = pair->server.cq->poll(wc), i = 0; i < n; ++i) ASSERT_EQ(wc[i].status, WcStatus::success);
      }
      write(pair->server, *server_mr, *client_mr, server_buf, round);
    }
  });
  auto timer_expiries = [&] {
    const core::roce::RcStats stats = detail::roce::rc_stats(*pair->client.qp);
    return stats.recovery_timeouts + stats.ack_timeouts;
  };
  std::uint64_t hand_backs_after_warm_up = 0;
  int exempt_rounds = 0;
  for (int round = 1; round <= kRounds; ++round) {
    if (round == kWarmUp + 1) hand_backs_after_warm_up = hand_off.hand_backs();
    const std::uint64_t expiries_before = timer_expiries();
    write(pair->client, *client_mr, *server_mr, client_buf, round);
    const auto done = poll_n(*pair->client.cq, 1, 30s);
    ASSERT_EQ(done.size(), 1u);
    ASSERT_EQ(done[0].status, WcStatus::success);
    const bool exempt = timer_expiries() != expiries_before;
    if (round > kWarmUp && exempt) ++exempt_rounds;
    if (round > kWarmUp && !exempt) {
      EXPECT_EQ(landed(pair->client, client_buf), static_cast<std::uint8_t>(round))
          << "round " << round << ": the Write completed before the answer it was ACKed behind";
    }
    const auto deadline = std::chrono::steady_clock::now() + 30s;
    while (landed(pair->client, client_buf) != static_cast<std::uint8_t>(round)) {
      ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "round " << round;
      WorkCompletion none[1];
      ASSERT_EQ(pair->client.cq->poll(none), 0u);
    }
  }
  server.join();
  EXPECT_LE(hand_off.hand_backs() - hand_backs_after_warm_up, static_cast<std::uint64_t>(exempt_rounds))
      << "Write completions whose answer had landed handed the reactor back";
  EXPECT_LT(exempt_rounds, kRounds / 2) << "too few rounds without a timer to show anything";
}

TEST_P(DataPath, RdmaRead) {
  const std::size_t size = GetParam().size;
  auto remote = pattern(size, 3);
  std::vector<std::uint8_t> local(size, 0);
  auto remote_mr = pair_->server.region(remote);
  auto local_mr = pair_->client.region(local);
  ASSERT_TRUE(pair_->client.qp->post_send(SendWr{.wr_id = 9,
                                                 .opcode = WrOpcode::rdma_read,
                                                 .sg_list = {local_mr->sge()},
                                                 .remote_addr = reinterpret_cast<std::uintptr_t>(remote.data()),
                                                 .rkey = remote_mr->rkey()}));
  auto done = poll_n(*pair_->client.cq, 1, 30s);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].status, WcStatus::success);
  EXPECT_EQ(done[0].opcode, WcOpcode::rdma_read);
  EXPECT_TRUE(local == remote);
}

INSTANTIATE_TEST_SUITE_P(Sizes, DataPath,
                         testing::Values(SizeCase{0, true}, SizeCase{1, false}, SizeCase{4095, true},
                                         SizeCase{65536 + 7, false}, SizeCase{65536 + 7, true},
                                         SizeCase{1 << 20, false}, SizeCase{(1 << 20) + 3, true},
                                         SizeCase{16 << 20, false}, SizeCase{16 << 20, true}),
                         name_of);
INSTANTIATE_TEST_SUITE_P(RoceSizes, DataPath,
                         testing::Values(SizeCase{0, true, Transport::roce}, SizeCase{1, true, Transport::roce},
                                         SizeCase{4095, true, Transport::roce},
                                         SizeCase{65536 + 7, true, Transport::roce},
                                         SizeCase{(1 << 20) + 3, true, Transport::roce},
                                         SizeCase{16 << 20, true, Transport::roce}),
                         name_of);

// The ordering, feature and error tests run on both transports.
Options options_for(Transport transport) {
  Options options;
  options.transport = transport;
  return options;
}

class DataPathOrdering : public testing::TestWithParam<Transport> {};
class DataPathFeatures : public testing::TestWithParam<Transport> {};
class DataPathErrors : public testing::TestWithParam<Transport> {};

TEST_P(DataPathOrdering, ReadsBeyondOrdWaitAndCompleteInOrder) {
  Options options = options_for(GetParam());
  options.client_param.initiator_depth = 1;  // ORD 1
  options.server_param.responder_resources = 1;
  auto pair = LoopbackPair::connected(options);
  auto remote = pattern(4096, 4);
  std::vector<std::uint8_t> local(4096 * 8, 0);
  auto remote_mr = pair->server.region(remote);
  auto local_mr = pair->client.region(local);
  for (std::uint64_t i = 0; i < 8; ++i) {
    ASSERT_TRUE(pair->client.qp->post_send(SendWr{.wr_id = i,
                                                  .opcode = WrOpcode::rdma_read,
                                                  .sg_list = {local_mr->sge(i * 4096, 4096)},
                                                  .remote_addr = reinterpret_cast<std::uintptr_t>(remote.data()),
                                                  .rkey = remote_mr->rkey()}));
  }
  auto done = poll_n(*pair->client.cq, 8);
  ASSERT_EQ(done.size(), 8u);
  for (std::uint64_t i = 0; i < 8; ++i) {
    EXPECT_EQ(done[i].wr_id, i);
    EXPECT_EQ(done[i].status, WcStatus::success);
    EXPECT_TRUE(std::equal(remote.begin(), remote.end(), local.begin() + static_cast<std::ptrdiff_t>(i * 4096)));
  }
}

TEST_P(DataPathOrdering, ManyQueuePairsAtOnce) {
  Options options = options_for(GetParam());
  LoopbackPair pair(options);
  constexpr int kPairs = 16;
  std::vector<std::unique_ptr<CmId>> clients, servers;
  for (int i = 0; i < kPairs; ++i) {
    auto id = std::move(CmId::create(*pair.client.context, *pair.client.channel, nullptr, GetParam()).value());
    // One connection per p2p key (docs/p2p.md R5): each pair of ids uses its own tag.
    ASSERT_TRUE(id->set_option(CmOption::p2p_tag, i));
    ASSERT_TRUE(id->resolve_addr(pair.address));
    expect_event(*pair.client.channel, CmEventType::addr_resolved);
    ASSERT_TRUE(id->resolve_route());
    expect_event(*pair.client.channel, CmEventType::route_resolved);
    id->create_qp(*pair.client.pd, pair.client.qp_attr()).value();
    ASSERT_TRUE(id->connect({}));
    auto request = expect_event(*pair.server.channel, CmEventType::connect_request);
    request.new_id->create_qp(*pair.server.pd, pair.server.qp_attr()).value();
    ASSERT_TRUE(request.new_id->accept({}));
    expect_event(*pair.server.channel, CmEventType::established);
    expect_event(*pair.client.channel, CmEventType::established);
    clients.push_back(std::move(id));
    servers.push_back(std::move(request.new_id));
  }
  constexpr std::size_t kSize = 100000;
  std::vector<std::vector<std::uint8_t>> sources, sinks;
  std::vector<std::unique_ptr<MemoryRegion>> mrs;
  for (int i = 0; i < kPairs; ++i) {
    sources.push_back(pattern(kSize, 100 + static_cast<unsigned>(i)));
    sinks.emplace_back(kSize, 0);
  }
  for (int i = 0; i < kPairs; ++i) {
    mrs.push_back(pair.server.region(sinks[static_cast<std::size_t>(i)]));
    ASSERT_TRUE(servers[static_cast<std::size_t>(i)]->qp()->post_recv(
        RecvWr{.wr_id = static_cast<std::uint64_t>(i), .sg_list = {mrs.back()->sge()}}));
    mrs.push_back(pair.client.region(sources[static_cast<std::size_t>(i)]));
    ASSERT_TRUE(clients[static_cast<std::size_t>(i)]->qp()->post_send(
        SendWr{.wr_id = static_cast<std::uint64_t>(i), .opcode = WrOpcode::send, .sg_list = {mrs.back()->sge()}}));
  }
  auto recvs = poll_n(*pair.server.cq, kPairs);
  ASSERT_EQ(recvs.size(), static_cast<std::size_t>(kPairs));
  for (int i = 0; i < kPairs; ++i) EXPECT_TRUE(sinks[static_cast<std::size_t>(i)] == sources[static_cast<std::size_t>(i)]);
  // The sources stay registered until every Send completed: over RoCE that is when its ACK
  // arrived, and a Send waiting for one may still be resent from them.
  auto sends = poll_n(*pair.client.cq, kPairs);
  ASSERT_EQ(sends.size(), static_cast<std::size_t>(kPairs));
  for (const WorkCompletion& wc : sends) EXPECT_EQ(wc.status, WcStatus::success);
}

TEST_P(DataPathFeatures, SendWithInvalidateRevokesTheRegion) {
  auto pair = LoopbackPair::connected(options_for(GetParam()));
  std::vector<std::uint8_t> exposed(128, 0), msg(16, 7), sink(16);
  auto exposed_mr = pair->server.region(exposed);
  auto msg_mr = pair->client.region(msg);
  auto sink_mr = pair->server.region(sink);
  ASSERT_TRUE(pair->server.qp->post_recv(RecvWr{.wr_id = 1, .sg_list = {sink_mr->sge()}}));
  ASSERT_TRUE(pair->client.qp->post_send(SendWr{.wr_id = 2,
                                                .opcode = WrOpcode::send_with_invalidate,
                                                .sg_list = {msg_mr->sge()},
                                                .invalidate_rkey = exposed_mr->rkey()}));
  auto recv = poll_n(*pair->server.cq, 1);
  ASSERT_EQ(recv.size(), 1u);
  EXPECT_TRUE(recv[0].wc_flags & kWcWithInvalidate);
  EXPECT_EQ(recv[0].invalidated_rkey, exposed_mr->rkey());
  // The invalidated STag no longer admits a Write: the server terminates the stream.
  ASSERT_TRUE(pair->client.qp->post_send(SendWr{.wr_id = 3,
                                                .opcode = WrOpcode::rdma_write,
                                                .sg_list = {msg_mr->sge()},
                                                .remote_addr = reinterpret_cast<std::uintptr_t>(exposed.data()),
                                                .rkey = exposed_mr->rkey()}));
  expect_event(*pair->server.channel, CmEventType::disconnected);
  expect_event(*pair->client.channel, CmEventType::disconnected);
  EXPECT_EQ(exposed[0], 0) << "nothing placed through an invalidated STag";
}

TEST_P(DataPathFeatures, SolicitedEventWakesOnlyOnSolicitedSends) {
  Options options = options_for(GetParam());
  LoopbackPair pair(options);
  auto channel = std::move(CompletionChannel::create(*pair.server.context).value());
  pair.server.cq = std::move(CompletionQueue::create(*pair.server.context, 64, channel.get()).value());
  pair.start_client(options);
  pair.accept(options);
  std::vector<std::uint8_t> msg(8, 3), sink(64);
  auto msg_mr = pair.client.region(msg);
  auto sink_mr = pair.server.region(sink);
  for (std::uint64_t i = 0; i < 2; ++i)
    ASSERT_TRUE(pair.server.qp->post_recv(RecvWr{.wr_id = i, .sg_list = {sink_mr->sge(i * 8, 8)}}));
  ASSERT_TRUE(pair.server.cq->request_notify(/*solicited_only=*/true));
  ASSERT_TRUE(pair.client.qp->post_send(SendWr{.wr_id = 1, .opcode = WrOpcode::send, .sg_list = {msg_mr->sge()}}));
  EXPECT_FALSE(channel->get_event(300ms).has_value()) << "a plain Send must not wake a solicited-only waiter";
  ASSERT_TRUE(pair.client.qp->post_send(
      SendWr{.wr_id = 2, .opcode = WrOpcode::send, .flags = kSendSolicited, .sg_list = {msg_mr->sge()}}));
  auto woke = channel->get_event(3s);
  ASSERT_TRUE(woke.has_value());
  EXPECT_EQ(*woke, pair.server.cq.get());
  channel->ack_events(**woke, 1);
  auto recvs = poll_n(*pair.server.cq, 2);
  ASSERT_EQ(recvs.size(), 2u);
  EXPECT_TRUE(recvs[1].wc_flags & kWcSolicited);
  EXPECT_EQ(poll_n(*pair.client.cq, 2).size(), 2u) << "both Sends complete before their buffer goes";
  pair.server.id.reset();
  pair.server.cq.reset();
}

TEST_P(DataPathFeatures, InlineSendCopiesAtPostTime) {
  auto pair = LoopbackPair::connected(options_for(GetParam()));
  std::vector<std::uint8_t> msg(48, 9), sink(48);
  auto sink_mr = pair->server.region(sink);
  ASSERT_TRUE(pair->server.qp->post_recv(RecvWr{.wr_id = 1, .sg_list = {sink_mr->sge()}}));
  const Sge unregistered{.addr = reinterpret_cast<std::uintptr_t>(msg.data()), .length = 48, .lkey = 0};
  ASSERT_TRUE(pair->client.qp->post_send(
      SendWr{.wr_id = 2, .opcode = WrOpcode::send, .flags = kSendInline, .sg_list = {unregistered}}));
  std::fill(msg.begin(), msg.end(), 0);  // the copy was taken at post time
  ASSERT_EQ(poll_n(*pair->server.cq, 1).size(), 1u);
  EXPECT_EQ(sink, std::vector<std::uint8_t>(48, 9));
}

// --- error paths: each ends in a Terminate, both QPs in ERROR, every WR completed once ---

struct Violation {
  std::string name;
  std::uint32_t access;       // of the exposed region
  WrOpcode opcode;            // what the client tries
  std::int64_t offset;        // from the region start
  std::size_t length;
  bool wrong_key;
};

class RemoteAccessViolation : public testing::TestWithParam<std::tuple<Violation, Transport>> {};

TEST_P(RemoteAccessViolation, TerminatesAndFlushesEverything) {
  const Violation& v = std::get<0>(GetParam());
  auto pair = LoopbackPair::connected(options_for(std::get<1>(GetParam())));
  std::vector<std::uint8_t> exposed(4096, 0x42), local(8192, 0x17), recv_buf(64);
  auto exposed_mr = pair->server.region(exposed, v.access);
  auto local_mr = pair->client.region(local);
  auto recv_mr = pair->server.region(recv_buf);
  auto client_recv_mr = pair->client.region(recv_buf);
  // Outstanding receives on both sides must come back flushed.
  ASSERT_TRUE(pair->server.qp->post_recv(RecvWr{.wr_id = 100, .sg_list = {recv_mr->sge()}}));
  ASSERT_TRUE(pair->client.qp->post_recv(RecvWr{.wr_id = 200, .sg_list = {client_recv_mr->sge(0, 8)}}));
  std::uint32_t rkey = exposed_mr->rkey();
  if (v.wrong_key) rkey = (rkey & ~0xFFu) | ((rkey + 1) & 0xFFu);
  const std::uint64_t remote = reinterpret_cast<std::uintptr_t>(exposed.data()) + static_cast<std::uint64_t>(v.offset);
  ASSERT_TRUE(pair->client.qp->post_send(SendWr{.wr_id = 1,
                                                .opcode = v.opcode,
                                                .sg_list = {local_mr->sge(0, v.length)},
                                                .remote_addr = remote,
                                                .rkey = rkey}));
  expect_event(*pair->server.channel, CmEventType::disconnected);
  expect_event(*pair->client.channel, CmEventType::disconnected);
  auto server_done = poll_n(*pair->server.cq, 1);
  ASSERT_EQ(server_done.size(), 1u);
  EXPECT_EQ(server_done[0].wr_id, 100u);
  EXPECT_EQ(server_done[0].status, WcStatus::wr_flush_error);
  auto client_done = poll_n(*pair->client.cq, 2);
  ASSERT_EQ(client_done.size(), 2u);
  EXPECT_EQ(pair->server.qp->state(), QpState::error);
  EXPECT_EQ(pair->client.qp->state(), QpState::error);
  EXPECT_TRUE(std::all_of(exposed.begin(), exposed.end(), [](std::uint8_t b) { return b == 0x42; }))
      << "the remote side never touches a byte it was not given";
  if (v.opcode == WrOpcode::rdma_read) {
    EXPECT_TRUE(std::all_of(local.begin(), local.begin() + static_cast<std::ptrdiff_t>(v.length),
                            [](std::uint8_t b) { return b == 0x17; }));
  }
}

const std::uint32_t kAll = kAccessLocalWrite | kAccessRemoteWrite | kAccessRemoteRead;

INSTANTIATE_TEST_SUITE_P(
    Cases, RemoteAccessViolation,
    testing::Combine(testing::Values(Violation{"WriteWrongKey", kAll, WrOpcode::rdma_write, 0, 64, true},
                    Violation{"WritePastEnd", kAll, WrOpcode::rdma_write, 4000, 200, false},
                    Violation{"WriteBeforeStart", kAll, WrOpcode::rdma_write, -8, 16, false},
                    Violation{"WriteWithoutRight", kAccessLocalWrite | kAccessRemoteRead, WrOpcode::rdma_write, 0, 64, false},
                    Violation{"ReadWrongKey", kAll, WrOpcode::rdma_read, 0, 64, true},
                    Violation{"ReadPastEnd", kAll, WrOpcode::rdma_read, 4090, 64, false},
                    Violation{"ReadWithoutRight", kAccessLocalWrite | kAccessRemoteWrite, WrOpcode::rdma_read, 0, 64, false}),
                     testing::Values(Transport::iwarp, Transport::roce)),
    [](const testing::TestParamInfo<std::tuple<Violation, Transport>>& param_info) {
      return std::get<0>(param_info.param).name + "_" + std::string(to_string(std::get<1>(param_info.param)));
    });

TEST(DataPathIwarpErrors, SendWithoutPostedReceiveTerminatesBothSides) {
  auto pair = LoopbackPair::connected();
  std::vector<std::uint8_t> msg(32, 1), client_recv(8);
  auto msg_mr = pair->client.region(msg);
  auto client_recv_mr = pair->client.region(client_recv);
  ASSERT_TRUE(pair->client.qp->post_recv(RecvWr{.wr_id = 50, .sg_list = {client_recv_mr->sge()}}));
  ASSERT_TRUE(pair->client.qp->post_send(SendWr{.wr_id = 51, .opcode = WrOpcode::send, .sg_list = {msg_mr->sge()}}));
  expect_event(*pair->server.channel, CmEventType::disconnected);
  expect_event(*pair->client.channel, CmEventType::disconnected);
  auto done = poll_n(*pair->client.cq, 2);
  ASSERT_EQ(done.size(), 2u);
  bool flushed_recv = false;
  for (auto& wc : done) flushed_recv |= wc.wr_id == 50 && wc.status == WcStatus::wr_flush_error;
  EXPECT_TRUE(flushed_recv);
}

// RC over RoCE answers a Send with no receive posted with an RNR NAK and, with rnr_retry 7,
// retries until one is posted: the Send is late, not lost, and nothing fails.
TEST(DataPathRoce, SendWithoutPostedReceiveWaitsForTheReceive) {
  auto pair = LoopbackPair::connected(options_for(Transport::roce));
  std::vector<std::uint8_t> msg(32, 1), sink(32, 0);
  auto msg_mr = pair->client.region(msg);
  auto sink_mr = pair->server.region(sink);
  ASSERT_TRUE(pair->client.qp->post_send(SendWr{.wr_id = 51, .opcode = WrOpcode::send, .sg_list = {msg_mr->sge()}}));
  std::this_thread::sleep_for(50ms);
  EXPECT_TRUE(poll_n(*pair->server.cq, 1, 10ms).empty()) << "nothing can arrive without a receive";
  ASSERT_TRUE(pair->server.qp->post_recv(RecvWr{.wr_id = 52, .sg_list = {sink_mr->sge()}}));
  auto recv = poll_n(*pair->server.cq, 1);
  auto sent = poll_n(*pair->client.cq, 1);
  ASSERT_EQ(recv.size(), 1u);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(recv[0].status, WcStatus::success);
  EXPECT_EQ(sent[0].status, WcStatus::success);
  EXPECT_EQ(sink, msg);
  EXPECT_EQ(pair->client.qp->state(), QpState::rts);
}

TEST_P(DataPathErrors, PeerGoneMidTransferDisconnectsAndFlushes) {
  auto pair = LoopbackPair::connected(options_for(GetParam()));
  std::vector<std::uint8_t> big(8 << 20, 1), sink(8 << 20);
  auto big_mr = pair->client.region(big);
  auto sink_mr = pair->server.region(sink);
  ASSERT_TRUE(pair->server.qp->post_recv(RecvWr{.wr_id = 1, .sg_list = {sink_mr->sge()}}));
  ASSERT_TRUE(pair->server.qp->post_recv(RecvWr{.wr_id = 2, .sg_list = {sink_mr->sge(0, 8)}}));
  for (std::uint64_t i = 0; i < 4; ++i)
    ASSERT_TRUE(pair->client.qp->post_send(SendWr{.wr_id = 10 + i,
                                                  .opcode = WrOpcode::rdma_write,
                                                  .sg_list = {big_mr->sge()},
                                                  .remote_addr = reinterpret_cast<std::uintptr_t>(sink.data()),
                                                  .rkey = sink_mr->rkey()}));
  pair->client.id.reset();  // the client vanishes (abortive close)
  expect_event(*pair->server.channel, CmEventType::disconnected, 5s);
  auto done = poll_n(*pair->server.cq, 2);
  ASSERT_EQ(done.size(), 2u);
  for (auto& wc : done) EXPECT_EQ(wc.status, WcStatus::wr_flush_error);
}

TEST_P(DataPathErrors, BadWorkRequestsAreRejectedAtPost) {
  auto pair = LoopbackPair::connected(options_for(GetParam()));
  std::vector<std::uint8_t> buf(64);
  auto mr = pair->client.region(buf);
  SendWr too_many_sges{.wr_id = 1, .opcode = WrOpcode::send, .sg_list = std::vector<Sge>(9, mr->sge(0, 1))};
  EXPECT_EQ(pair->client.qp->post_send(too_many_sges).error(), std::errc::invalid_argument);
  std::vector<std::uint8_t> big(4096);
  const Sge huge_inline{.addr = reinterpret_cast<std::uintptr_t>(big.data()), .length = 4096, .lkey = 0};
  EXPECT_EQ(pair->client.qp->post_send(SendWr{.wr_id = 2, .opcode = WrOpcode::send, .flags = kSendInline, .sg_list = {huge_inline}})
                .error(),
            std::errc::invalid_argument);
}

TEST(DataPathIwarpErrors, ImmediateDataIsRefusedOnIwarp) {
  // RFC 5040 has no immediate data: EINVAL at post, not a plain Send or Write on the wire.
  auto pair = LoopbackPair::connected();
  std::vector<std::uint8_t> buf(64), inbox(64);
  auto mr = pair->client.region(buf);
  auto inbox_mr = pair->server.region(inbox);
  EXPECT_EQ(pair->client.qp->post_send(SendWr{.wr_id = 1,
                                              .opcode = WrOpcode::send_with_imm,
                                              .sg_list = {mr->sge(0, 8)},
                                              .imm_data = htonl(7)})
                .error(),
            std::errc::invalid_argument);
  EXPECT_EQ(pair->client.qp->post_send(SendWr{.wr_id = 2,
                                              .opcode = WrOpcode::rdma_write_with_imm,
                                              .sg_list = {mr->sge(0, 8)},
                                              .remote_addr = reinterpret_cast<std::uintptr_t>(inbox.data()),
                                              .rkey = inbox_mr->rkey(),
                                              .imm_data = htonl(8)})
                .error(),
            std::errc::invalid_argument);
  // Nothing was queued and the QP is unharmed: a plain Send still goes through.
  ASSERT_TRUE(pair->server.qp->post_recv(RecvWr{.wr_id = 10, .sg_list = {inbox_mr->sge()}}));
  ASSERT_TRUE(pair->client.qp->post_send(SendWr{.wr_id = 3, .opcode = WrOpcode::send, .sg_list = {mr->sge(0, 8)}}));
  auto client_wcs = poll_n(*pair->client.cq, 1);
  ASSERT_EQ(client_wcs.size(), 1u);
  EXPECT_EQ(client_wcs[0].wr_id, 3u);
  EXPECT_EQ(client_wcs[0].status, WcStatus::success);
  auto server_wcs = poll_n(*pair->server.cq, 1);
  ASSERT_EQ(server_wcs.size(), 1u);
  EXPECT_EQ(server_wcs[0].opcode, WcOpcode::recv);
  EXPECT_EQ(server_wcs[0].wc_flags & kWcWithImm, 0u);
  EXPECT_EQ(pair->client.qp->state(), QpState::rts);
}

TEST_P(DataPathErrors, CompletionQueueOverrunIsReportedNotCorrupting) {
  Options options = options_for(GetParam());
  LoopbackPair pair(options);
  pair.client.cq = std::move(CompletionQueue::create(*pair.client.context, 2).value());
  pair.start_client(options);
  pair.accept(options);
  std::vector<std::uint8_t> buf(8, 1), sink(64);
  auto mr = pair.client.region(buf);
  auto sink_mr = pair.server.region(sink);
  for (std::uint64_t i = 0; i < 8; ++i)
    ASSERT_TRUE(pair.server.qp->post_recv(RecvWr{.wr_id = i, .sg_list = {sink_mr->sge(i * 8, 8)}}));
  for (std::uint64_t i = 0; i < 8; ++i)
    (void)pair.client.qp->post_send(SendWr{.wr_id = i, .opcode = WrOpcode::send, .sg_list = {mr->sge()}});
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (!pair.client.cq->overrun() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(5ms);
  EXPECT_TRUE(pair.client.cq->overrun());
  WorkCompletion wcs[8];
  EXPECT_LE(pair.client.cq->poll(wcs), 2u);
  // Close both ends before the buffers the server still has posted go away.
  pair.client.id.reset();
  pair.server.id.reset();
  pair.client.cq.reset();
}

INSTANTIATE_TEST_SUITE_P(Transports, DataPathOrdering, testing::Values(Transport::iwarp, Transport::roce),
                         transport_name);
INSTANTIATE_TEST_SUITE_P(Transports, DataPathFeatures, testing::Values(Transport::iwarp, Transport::roce),
                         transport_name);
INSTANTIATE_TEST_SUITE_P(Transports, DataPathErrors, testing::Values(Transport::iwarp, Transport::roce),
                         transport_name);

}  // namespace
}  // namespace peercm::test
