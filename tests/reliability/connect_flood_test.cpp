// A flood of 10,000 TCP connects at the target's listener, 5,000 a second, the latest 256
// held open and silent. The listener holds at most `backlog` of them; what it holds costs a
// bounded amount of memory; legitimate clients still get in, during the flood and after.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <thread>

#include "api/iwarp_cm.hpp"
#include "fault_fixture.hpp"
#include "peer_process.hpp"

namespace peercm::test {
namespace {

using namespace std::chrono_literals;

class ConnectFlood : public FaultTest {
 protected:
  // A whole client/server connection from the partner plus one Send.
  enum class Outcome { delivered, turned_away, no_outcome };
  Outcome legitimate_connection() {
    const std::int64_t heap_at_start = heap_bytes();
    auto id = std::move(CmId::create(*partner.context, *partner.channel).value());
    (void)id->set_option(CmOption::peer_to_peer, 0);
    (void)id->resolve_addr(loopback(port));
    if (auto e = partner.channel->get_event(2s); !e || e->type != CmEventType::addr_resolved) return Outcome::no_outcome;
    (void)id->resolve_route();
    if (auto e = partner.channel->get_event(2s); !e || e->type != CmEventType::route_resolved) return Outcome::no_outcome;
    QpInitAttr attr = partner.qp_attr();
    QueuePair* qp = id->create_qp(*partner.pd, attr).value();
    (void)id->set_option(CmOption::connect_timeout, 5000);
    if (!id->connect({})) return Outcome::no_outcome;
    std::unique_ptr<CmId> accepted;
    bool established = false, failed = false;
    // While the kernel's accept queue is full it drops SYNs (TCP resends after 1 s, then 3 s);
    // the connect timeout ends the attempt in any case.
    const auto deadline = Clock::now() + 6s;
    while (!established && !failed && Clock::now() < deadline) {
      if (auto e = target.channel->get_event(1ms)) {
        if (e->type == CmEventType::connect_request && e->new_id) {
          accepted = std::move(e->new_id);
          accepted->create_qp(*target.pd, target.qp_attr()).value();
          (void)accepted->accept({});
        }
      }
      if (auto e = partner.channel->get_event(1ms)) {
        if (e->id != id.get()) continue;
        established = e->type == CmEventType::established;
        failed = !established;
      }
    }
    bool delivered = false;
    if (established && accepted) {
      legitimate_cost = std::max(legitimate_cost, heap_bytes() - heap_at_start);
      std::vector<std::uint8_t> msg(32, 0x61), sink(32, 0);
      auto msg_mr = partner.region(msg);
      auto sink_mr = target.region(sink);
      (void)accepted->qp()->post_recv(RecvWr{.wr_id = 7, .sg_list = {sink_mr->sge()}});
      (void)qp->post_send(SendWr{.wr_id = 8, .opcode = WrOpcode::send, .sg_list = {msg_mr->sge()}});
      auto got = poll_n(*target.cq, 1, 3s);
      auto sent = poll_n(*partner.cq, 1, 3s);
      delivered = got.size() == 1 && sent.size() == 1 && got[0].status == WcStatus::success && sink == msg;
      (void)id->disconnect();
      for (auto e = partner.channel->get_event(2s); e && !(e->type == CmEventType::disconnected && e->id == id.get());
           e = partner.channel->get_event(2s)) {
      }
    }
    accepted.reset();
    id.reset();
    // Events about ids that are gone now (CONNECT_ERROR of a request the target turned away).
    while (target.channel->get_event(0ms)) {
    }
    if (delivered) return Outcome::delivered;
    return failed ? Outcome::turned_away : Outcome::no_outcome;
  }

  std::int64_t legitimate_cost = 0;  // heap of one established legitimate connection
  static constexpr std::uint32_t kFloodSources[2] = {0x7F000002, 0x7F000003};  // 127.0.0.2, .3

  struct Sample {
    std::size_t fds = 0;
    std::int64_t heap = 0;
    std::size_t pending = 0;
    std::size_t handshaking = 0;
  };
  Sample sample() {
    Sample s;
    const auto backlog = detail::iwarp_backlog(*listener);
    s.pending = backlog.pending;
    s.handshaking = backlog.handshaking;
    s.fds = open_fds();
    s.heap = heap_bytes();
    return s;
  }
};

TEST_F(ConnectFlood, BacklogHoldsMemoryIsBoundedAndLegitimateClientsGetIn) {
  constexpr std::size_t kTotal = 10000, kWindow = 256, kRate = 5000;
  const Sample before = sample();
  // What the listener spends on one silent handshake: `backlog` of them, measured.
  std::int64_t per_handshake = 0;
  {
    std::vector<RawSocket> silent;
    // From two addresses: one source holds at most three quarters of the backlog (B1).
    for (int i = 0; i < kBacklog; ++i) silent.push_back(RawSocket::connect_to(port, kFloodSources[i % 2]));
    const auto deadline = Clock::now() + 2s;
    while (sample().handshaking < static_cast<std::size_t>(kBacklog) && Clock::now() < deadline)
      std::this_thread::sleep_for(1ms);
    ASSERT_EQ(sample().handshaking, static_cast<std::size_t>(kBacklog));
    per_handshake = (sample().heap - before.heap) / kBacklog;
  }
  for (const auto deadline = Clock::now() + 2s; sample().handshaking > 0 && Clock::now() < deadline;)
    std::this_thread::sleep_for(1ms);
  ASSERT_EQ(sample().handshaking, 0u);
  ASSERT_EQ(legitimate_connection(), Outcome::delivered);
  PeerProcess flood({"flood", std::to_string(port), std::to_string(kTotal), std::to_string(kWindow),
                     std::to_string(kRate)});
  // Sampled on its own thread, so that a legitimate connection held up by a dropped SYN
  // does not leave the flood unobserved.
  Sample peak = before;
  std::atomic<bool> sampling{true};
  std::thread sampler([&] {
    while (sampling.load()) {
      const Sample s = sample();
      peak.fds = std::max(peak.fds, s.fds);
      peak.heap = std::max(peak.heap, s.heap);
      peak.pending = std::max(peak.pending, s.pending);
      peak.handshaking = std::max(peak.handshaking, s.handshaking);
      std::this_thread::sleep_for(1ms);
    }
  });
  int legit_ok = 0, legit_refused = 0, legit_stuck = 0;
  std::optional<std::string> done;
  bool started = false;
  double first_ok_ms = -1;
  const auto start = Clock::now();
  while (!done && Clock::now() - start < 60s) {
    if (auto line = flood.read_line(started ? 0ms : 10s)) {
      if (line->rfind("done", 0) == 0) done = line;
      if (*line == "started") started = true;
      continue;
    }
    if (!started) break;
    switch (legitimate_connection()) {
      case Outcome::delivered:
        if (++legit_ok == 1) first_ok_ms = ms_since(start);
        break;
      case Outcome::turned_away: ++legit_refused; break;
      case Outcome::no_outcome: ++legit_stuck; break;
    }
  }
  const double flood_ms = ms_since(start);
  sampling = false;
  sampler.join();
  ASSERT_TRUE(done) << "the flood did not finish";
  report(*done + " (reached the listener, connect() calls) in " + std::to_string(flood_ms) + " ms; peak pending " +
         std::to_string(peak.pending) + ", handshaking " + std::to_string(peak.handshaking) + ", fds +" +
         std::to_string(peak.fds - before.fds) + ", heap +" + std::to_string(peak.heap - before.heap) +
         " B (one handshake " + std::to_string(per_handshake) + " B, one legitimate connection " +
         std::to_string(legitimate_cost) + " B); legitimate during: " + std::to_string(legit_ok) + " ok (first after " +
         std::to_string(first_ok_ms) + " ms), " + std::to_string(legit_refused) + " turned away");
  EXPECT_GT(peak.handshaking, static_cast<std::size_t>(kBacklog / 2)) << "the flood never filled the backlog";
  // The backlog holds: never more handshakes than it allows, so never more sockets than the
  // helper's two pipes, the backlog, and a few in passing (the partner's end of a legitimate
  // connection, the one before it closing, a socket accepted while another makes room).
  EXPECT_LE(peak.pending, static_cast<std::size_t>(kBacklog));
  EXPECT_LE(peak.handshaking, static_cast<std::size_t>(kBacklog));
  EXPECT_LE(peak.fds - before.fds, 2u + kBacklog + 4u);
  // Bounded memory: a full backlog of handshakes and one legitimate connection, as measured
  // above, plus what the churn of legitimate connections holds for a moment: the previous
  // connection still closing while the next one is set up, at most one more legitimate
  // connection (ASan runs on a loaded machine peaked 10.9 KiB and 33.0 KiB over the backlog
  // and one connection). 10,000 connects kept would need 10,000 handshakes' worth, some 220
  // times this bound.
  EXPECT_LE(peak.heap - before.heap, kBacklog * per_handshake + 2 * legitimate_cost + kHeapSlack)
      << per_handshake << " B per handshake";
  // The window holds 16 times the backlog in silent connections: legitimate clients get in
  // because a silent handshake gives way to a newcomer. Measured: more than 95% of them, and
  // about one in ten without that rule; a client whose Request is slower than 16 newcomers
  // (a loaded machine) can still lose its place.
  EXPECT_GE(legit_ok, 1) << "no legitimate connection got through during the flood";
  EXPECT_GT(legit_ok * 2, legit_ok + legit_refused) << "legitimate clients were mostly turned away";
  EXPECT_EQ(legit_stuck, 0) << "a legitimate attempt neither got in nor failed";
  flood.kill();
  int after_ok = 0;
  for (int i = 0; i < 10; ++i) after_ok += legitimate_connection() == Outcome::delivered ? 1 : 0;
  EXPECT_EQ(after_ok, 10) << "legitimate connections after the flood";
}

// Slow drippers: each sent the first bytes of a Request and nothing more. With the backlog
// full of them and a handshake timeout far away, a complete Request still gets in, and the
// listener never holds more than its backlog.
TEST_F(ConnectFlood, PartialRequestsGiveWayToACompleteOne) {
  ASSERT_TRUE(listener->set_option(CmOption::connect_timeout, 30000));
  const auto request = mpa_request_bytes(true);
  std::vector<RawSocket> drips;
  for (int i = 0; i < kBacklog; ++i) {
    drips.push_back(RawSocket::connect_to(port, kFloodSources[i % 2]));  // two addresses fill it (B1)
    ASSERT_GE(drips.back().fd(), 0);
    ASSERT_TRUE(drips.back().send_all(std::span(request).first(4)));
  }
  const auto full_by = Clock::now() + 5s;
  while (sample().pending < static_cast<std::size_t>(kBacklog) && Clock::now() < full_by) std::this_thread::sleep_for(1ms);
  ASSERT_EQ(sample().pending, static_cast<std::size_t>(kBacklog)) << "the drippers never filled the backlog";
  std::this_thread::sleep_for(150ms);  // past the grace a partial Request gets
  EXPECT_EQ(legitimate_connection(), Outcome::delivered);
  std::size_t cut_off = 0;
  for (auto& drip : drips) {
    bool eof = false;
    drip.read_for(10ms, &eof);
    cut_off += eof ? 1 : 0;
  }
  EXPECT_GE(cut_off, 1u) << "no dripper gave way";
  EXPECT_LE(sample().pending, static_cast<std::size_t>(kBacklog));
  report(std::to_string(cut_off) + " of " + std::to_string(kBacklog) + " drippers closed to let one client in");
}

}  // namespace
}  // namespace peercm::test
