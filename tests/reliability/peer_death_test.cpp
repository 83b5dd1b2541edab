// A peer process SIGKILLed at chosen moments: during the MPA exchange (on either side),
// in the middle of a 64 MiB RDMA Write and RDMA Read, and in the middle of a p2p collision.
// The target must notice, end the affected connection with the right event, complete every
// work request exactly once, free everything, and go on serving its healthy connection.
#include <gtest/gtest.h>

#include <cstring>

#include "fault_fixture.hpp"
#include "peer_process.hpp"

namespace peercm::test {
namespace {

using namespace std::chrono_literals;

constexpr std::size_t kBig = 64u << 20;

struct Exposed {
  std::uint64_t addr = 0;
  std::uint32_t rkey = 0;
  std::uint64_t length = 0;
};

Exposed exposed_of(const ConnParam& param) {
  Exposed e;
  if (param.private_data.size() < 20) return e;
  std::memcpy(&e.addr, param.private_data.data(), 8);
  std::memcpy(&e.rkey, param.private_data.data() + 8, 4);
  std::memcpy(&e.length, param.private_data.data() + 12, 8);
  return e;
}

class PeerDeath : public FaultTest {
 protected:
  // The next event about `id` (events of other ids are a failure: nothing else is going on).
  CmEvent next_for(CmId* id, std::chrono::milliseconds timeout = 3s) {
    auto event = target.channel->get_event(timeout);
    EXPECT_TRUE(event.has_value()) << "no event";
    if (!event) return CmEvent{};
    EXPECT_EQ(event->id, id) << "event " << to_string(event->type) << " about another id";
    return std::move(*event);
  }

  // Connects to a peer process that exposes a kBig region in its Accept private data.
  void connect_to_exposing_peer(PeerProcess& peer, std::int64_t crc, std::unique_ptr<CmId>& id, Exposed& remote) {
    const auto peer_port = peer.expect("port");
    ASSERT_TRUE(peer_port);
    id = target_id(static_cast<std::uint16_t>(std::stoi(*peer_port)), false, crc);
    ASSERT_TRUE(id->connect({}));
    auto established = next_for(id.get(), 5s);
    ASSERT_EQ(to_string(established.type), to_string(CmEventType::established));
    remote = exposed_of(established.param);
    ASSERT_EQ(remote.length, kBig);
    ASSERT_TRUE(peer.expect("established"));
  }
};

std::vector<std::uint8_t> small_buffer() { return std::vector<std::uint8_t>(64, 0x5C); }

TEST_F(PeerDeath, ResponderKilledWhileHoldingOurRequestEndsTheAttempt) {
  PeerProcess peer({"mpa-responder"});
  const auto peer_port = peer.expect("port");
  ASSERT_TRUE(peer_port);
  auto id = target_id(static_cast<std::uint16_t>(std::stoi(*peer_port)), /*peer_to_peer=*/false);
  auto buffer = small_buffer();
  auto mr = target.region(buffer);
  // Work posted before the connection exists waits for it.
  ASSERT_TRUE(id->qp()->post_recv(RecvWr{.wr_id = 1, .sg_list = {mr->sge(0, 32)}}));
  ASSERT_TRUE(id->qp()->post_send(SendWr{.wr_id = 2, .opcode = WrOpcode::send, .sg_list = {mr->sge(32, 32)}}));
  ASSERT_TRUE(id->connect({}));
  ASSERT_TRUE(peer.expect("request"));
  peer.kill();
  const auto killed = Clock::now();
  auto event = next_for(id.get());
  EXPECT_EQ(to_string(event.type), to_string(CmEventType::connect_error));
  EXPECT_EQ(event.status, ECONNRESET);
  report("detected in " + std::to_string(ms_since(killed)) + " ms");
  // A failed attempt leaves the QP's work queued (the id may connect again); moving the QP
  // to ERROR hands every WR back, once.
  if (id->qp()->state() != QpState::error) id->qp()->to_error();
  expect_each_once({1, 2}, {WcStatus::wr_flush_error});
}

TEST_F(PeerDeath, InitiatorKilledWhileTheApplicationDecidesEndsTheRequest) {
  PeerProcess peer({"mpa-initiator", std::to_string(port)});
  ASSERT_TRUE(peer.expect("connecting"));
  auto request = expect_event(*target.channel, CmEventType::connect_request);
  ASSERT_TRUE(request.new_id);
  auto id = std::move(request.new_id);
  QueuePair* qp = id->create_qp(*target.pd, target.qp_attr()).value();
  auto buffer = small_buffer();
  auto mr = target.region(buffer);
  ASSERT_TRUE(qp->post_recv(RecvWr{.wr_id = 1, .sg_list = {mr->sge()}}));
  peer.kill();
  const auto killed = Clock::now();
  auto event = next_for(id.get());
  EXPECT_EQ(to_string(event.type), to_string(CmEventType::connect_error));
  report("detected in " + std::to_string(ms_since(killed)) + " ms");
  EXPECT_FALSE(id->accept({})) << "a request whose initiator is gone cannot be accepted";
  qp->to_error();
  expect_each_once({1}, {WcStatus::wr_flush_error});
}

TEST_F(PeerDeath, InitiatorKilledAfterTheAcceptEndsTheConnection) {
  PeerProcess peer({"mpa-initiator", std::to_string(port)});
  ASSERT_TRUE(peer.expect("connecting"));
  auto request = expect_event(*target.channel, CmEventType::connect_request);
  ASSERT_TRUE(request.new_id);
  auto id = std::move(request.new_id);
  QueuePair* qp = id->create_qp(*target.pd, target.qp_attr()).value();
  auto buffer = small_buffer();
  auto mr = target.region(buffer);
  ASSERT_TRUE(qp->post_recv(RecvWr{.wr_id = 1, .sg_list = {mr->sge(0, 32)}}));
  // Held by the responder until the initiator's RTR, which a peercm initiator sends right
  // after the Reply (docs/p2p.md "RTR on every connection"): it goes out when the RTR comes
  // before the kill, else it flushes. Either way it completes exactly once.
  ASSERT_TRUE(qp->post_send(SendWr{.wr_id = 2, .opcode = WrOpcode::send, .sg_list = {mr->sge(32, 32)}}));
  ASSERT_TRUE(id->accept({}));
  auto established = next_for(id.get());
  EXPECT_EQ(to_string(established.type), to_string(CmEventType::established));
  peer.kill();
  const auto killed = Clock::now();
  auto event = next_for(id.get());
  EXPECT_EQ(to_string(event.type), to_string(CmEventType::disconnected));
  report("DISCONNECTED " + std::to_string(ms_since(killed)) + " ms after the kill");
  EXPECT_EQ(qp->state(), QpState::error);
  expect_each_once({{1, {WcStatus::wr_flush_error}}, {2, {WcStatus::success, WcStatus::wr_flush_error}}});
}

TEST_F(PeerDeath, InitiatorKilledInsideItsRequestFreesTheHandshakeAtOnce) {
  const std::size_t before = open_fds();
  PeerProcess peer({"half-request", std::to_string(port)});
  const std::size_t with_pipes = before + 2;
  ASSERT_TRUE(peer.expect("sent"));
  // The listener took the connection: one descriptor more than the helper's two pipes.
  const auto taken_deadline = Clock::now() + 1s;
  while (open_fds() != with_pipes + 1 && Clock::now() < taken_deadline) std::this_thread::sleep_for(1ms);
  ASSERT_EQ(open_fds(), with_pipes + 1) << "the listener never accepted";
  peer.kill();
  const auto killed = Clock::now();
  const auto freed_deadline = killed + 2s;
  while (open_fds() != with_pipes && Clock::now() < freed_deadline) std::this_thread::sleep_for(1ms);
  const double freed_ms = ms_since(killed);
  EXPECT_EQ(open_fds(), with_pipes);
  // The close is what frees it, not the handshake timeout.
  EXPECT_LT(freed_ms, static_cast<double>(kHandshakeTimeout.count()));
  report("socket freed " + std::to_string(freed_ms) + " ms after the kill");
  EXPECT_FALSE(target.channel->get_event(50ms).has_value()) << "a half Request reached the application";
}

// --- 64 MiB transfers: the peer stops in the middle (its progress is inline) and dies ---

TEST_F(PeerDeath, KilledInTheMiddleOfA64MiBRdmaWrite) {
  PeerProcess peer({"rdma-server", "write", std::to_string(kBig), std::to_string(1u << 20)});
  std::unique_ptr<CmId> id;
  Exposed remote;
  connect_to_exposing_peer(peer, /*crc off=*/2, id, remote);
  if (HasFatalFailure()) return;
  std::vector<std::uint8_t> source(kBig, 0xA7), small(64, 1);
  auto source_mr = target.region(source);
  auto small_mr = target.region(small);
  QueuePair* qp = id->qp();
  ASSERT_TRUE(qp->post_recv(RecvWr{.wr_id = 1, .sg_list = {small_mr->sge()}}));
  ASSERT_TRUE(qp->post_send(SendWr{.wr_id = 2,
                                   .opcode = WrOpcode::rdma_write,
                                   .sg_list = {source_mr->sge()},
                                   .remote_addr = remote.addr,
                                   .rkey = remote.rkey}));
  ASSERT_TRUE(qp->post_send(SendWr{.wr_id = 3, .opcode = WrOpcode::send, .sg_list = {small_mr->sge(0, 8)}}));
  const auto midway = peer.expect("midway");
  ASSERT_TRUE(midway) << "the Write never started";
  peer.kill();
  const auto killed = Clock::now();
  auto event = next_for(id.get());
  EXPECT_EQ(to_string(event.type), to_string(CmEventType::disconnected));
  report("peer had placed " + *midway + " B; DISCONNECTED " + std::to_string(ms_since(killed)) + " ms after the kill");
  EXPECT_EQ(qp->state(), QpState::error);
  // The Write cannot have completed: the peer stopped reading after ~1 MiB of 64.
  expect_each_once({1, 2, 3}, {WcStatus::wr_flush_error});
  id.reset();
}

TEST_F(PeerDeath, KilledInTheMiddleOfA64MiBRdmaRead) {
  // The peer stops once its first Read Response FPDU is out: with the target stalled below,
  // the socket buffers may hold little more than that.
  PeerProcess peer({"rdma-server", "read", std::to_string(kBig), "1"});
  std::unique_ptr<CmId> id;
  Exposed remote;
  connect_to_exposing_peer(peer, /*crc on=*/0, id, remote);
  if (HasFatalFailure()) return;
  std::vector<std::uint8_t> sink(kBig, 0), small(64, 1);
  auto sink_mr = target.region(sink);
  auto small_mr = target.region(small);
  QueuePair* qp = id->qp();
  ASSERT_TRUE(qp->post_recv(RecvWr{.wr_id = 1, .sg_list = {small_mr->sge()}}));
  ASSERT_TRUE(qp->post_send(SendWr{.wr_id = 2,
                                   .opcode = WrOpcode::rdma_read,
                                   .sg_list = {sink_mr->sge()},
                                   .remote_addr = remote.addr,
                                   .rkey = remote.rkey}));
  ASSERT_TRUE(qp->post_send(SendWr{.wr_id = 3, .opcode = WrOpcode::send, .sg_list = {small_mr->sge(0, 8)}}));
  std::optional<std::string> midway;
  {
    // The Read Request is out (posting transmits it). Holding the target's lock stalls its
    // receive side, so the peer's Read Response stops at the socket buffers and the kill
    // lands with most of the 64 MiB unsent.
    std::lock_guard stall(target.context->impl().mutex);
    midway = peer.expect("midway");
    peer.kill();
  }
  ASSERT_TRUE(midway) << "the Read Response never started";
  const auto killed = Clock::now();
  auto event = next_for(id.get());
  EXPECT_EQ(to_string(event.type), to_string(CmEventType::disconnected));
  report("peer had sent " + *midway + " FPDUs; DISCONNECTED " + std::to_string(ms_since(killed)) + " ms after the kill");
  // The Send behind the Read went out whole before the peer died: it may complete as a
  // success (after the Read, completions keep their order); the Read itself cannot.
  expect_each_once({{1, {WcStatus::wr_flush_error}},
                    {2, {WcStatus::wr_flush_error}},
                    {3, {WcStatus::wr_flush_error, WcStatus::success}}});
  settle();
  EXPECT_EQ(sink[kBig - 1], 0) << "the Read cannot have finished";
  id.reset();
}

// --- p2p collision (design.md §3 rule 3) with a hand-driven peer that dies mid-way ---

struct Collision {
  const char* name;
  std::uint64_t peer_guid;  // vs kTargetGuid: larger makes the target the passive peer
  bool after_answer;        // kill after the peer read the target's answer to its request
};

void PrintTo(const Collision& c, std::ostream* os) { *os << c.name; }

class PeerDeathInCollision : public PeerDeath, public testing::WithParamInterface<Collision> {};

TEST_P(PeerDeathInCollision, AttemptEndsOnceAndEveryWrIsReturned) {
  const Collision& c = GetParam();
  constexpr std::uint32_t kTag = 42;
  PeerProcess peer({"p2p-collide", std::to_string(port), std::to_string(c.peer_guid), std::to_string(kTag)});
  const auto peer_port = peer.expect("port");
  ASSERT_TRUE(peer_port);
  auto id = target_id(static_cast<std::uint16_t>(std::stoi(*peer_port)), /*peer_to_peer=*/true);
  ASSERT_TRUE(id->set_option(CmOption::p2p_tag, kTag));
  auto buffer = small_buffer();
  auto mr = target.region(buffer);
  ASSERT_TRUE(id->qp()->post_recv(RecvWr{.wr_id = 1, .sg_list = {mr->sge(0, 32)}}));
  ASSERT_TRUE(id->qp()->post_send(SendWr{.wr_id = 2, .opcode = WrOpcode::send, .sg_list = {mr->sge(32, 32)}}));
  ASSERT_TRUE(id->connect({}));
  ASSERT_TRUE(peer.expect("got-request"));
  ASSERT_TRUE(peer.expect("sent-request"));
  std::string answer = "not awaited";
  if (c.after_answer) {
    auto line = peer.expect("answer");
    ASSERT_TRUE(line);
    answer = *line;
  }
  peer.kill();
  const auto killed = Clock::now();
  // The attempt's id gets exactly one ending: CONNECT_ERROR, or ESTABLISHED then
  // DISCONNECTED. The peer's request may surface as a CONNECT_REQUEST only if the attempt
  // ended first (rule 3: a held request then proceeds as under rule 4).
  std::vector<std::string> seen;
  std::vector<std::unique_ptr<CmId>> requests;
  bool ended = false;
  double ended_ms = 0;
  int established = 0, endings = 0;
  const auto deadline = Clock::now() + 4s;
  while (Clock::now() < deadline) {
    auto e = target.channel->get_event(ended ? 200ms : 1000ms);
    if (!e) {
      if (ended) break;
      continue;
    }
    seen.push_back(std::string(to_string(e->type)));
    if (e->type == CmEventType::connect_request) {
      EXPECT_TRUE(ended) << "the colliding request reached the application while the attempt was alive";
      requests.push_back(std::move(e->new_id));
      continue;
    }
    if (e->id != id.get()) continue;  // a surfaced request failing
    if (e->type == CmEventType::established) ++established;
    if (e->type == CmEventType::connect_error || e->type == CmEventType::disconnected ||
        e->type == CmEventType::rejected || e->type == CmEventType::unreachable) {
      ++endings;
      if (!ended) ended_ms = ms_since(killed);
      ended = true;
    }
  }
  std::string trace;
  for (auto& s : seen) trace += s + " ";
  report("answer '" + answer + "', events: " + trace + "(ended " + std::to_string(ended_ms) + " ms after the kill)");
  EXPECT_EQ(endings, 1) << trace;
  EXPECT_LE(established, 1) << trace;
  if (c.peer_guid > kTargetGuid && c.after_answer) {
    EXPECT_EQ(answer, "accept") << "the passive target accepts the peer's request into its attempt";
    EXPECT_EQ(established, 1);
  }
  if (c.peer_guid < kTargetGuid) {
    EXPECT_EQ(established, 0) << "the active target waits for its own reply";
  }
  if (id->qp()->state() != QpState::error) id->qp()->to_error();
  expect_each_once({1, 2}, {WcStatus::wr_flush_error});
}

INSTANTIATE_TEST_SUITE_P(
    Cases, PeerDeathInCollision,
    testing::Values(Collision{"TargetActive", 0x10, false},
                    Collision{"TargetPassiveBeforeItsAnswer", 0xF000'0000'0000'0000ull, false},
                    Collision{"TargetPassiveAfterItsAnswer", 0xF000'0000'0000'0000ull, true}),
    [](const testing::TestParamInfo<Collision>& param_info) { return std::string(param_info.param.name); });

}  // namespace
}  // namespace peercm::test
