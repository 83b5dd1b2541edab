// docs/p2p.md B1 under a flood: whole connection requests (not silent handshakes) at a listener
// whose application decides none of them, client/server and p2p, over both transports. The
// listener holds at most its backlog of them; descriptors and heap stay bounded by that, not by
// the size of the flood; the rest are refused, and the refusals are counted. Before B1 charged
// p2p requests, a p2p flood grew the listener by one descriptor (iWARP) or ~1.8 KiB (RoCE) per
// request.
#include <arpa/inet.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <thread>

#include "loopback_pair.hpp"
#include "peer_process.hpp"
#include "resource_probe.hpp"

namespace peercm::test {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

struct FloodCase {
  Transport transport;
  bool p2p;
};

std::string case_name(const testing::TestParamInfo<FloodCase>& info) {
  return std::string(info.param.transport == Transport::roce ? "Roce" : "Iwarp") +
         (info.param.p2p ? "PeerToPeer" : "ClientServer");
}

std::string transport_name(const testing::TestParamInfo<Transport>& info) {
  return info.param == Transport::roce ? "Roce" : "Iwarp";
}

class RequestFlood : public testing::TestWithParam<FloodCase> {};

TEST_P(RequestFlood, TheListenerHoldsItsBacklogAndRefusesTheRest) {
  constexpr int kBacklog = 16;
  constexpr std::size_t kTotal = 600;
  // What one undecided request may cost the listener's process, generously: a CmId with its
  // event and transport state, a stream's buffers (measured: about 2 KiB).
  constexpr std::int64_t kPerRequest = 16 * 1024;
  constexpr std::int64_t kSlack = 512 * 1024;  // measured peaks: 220-330 KiB in all, buffers in passing
  const FloodCase flood_case = GetParam();
  Side server;
  auto listener = std::move(CmId::create(*server.context, *server.channel, nullptr, flood_case.transport).value());
  const sockaddr_in bind_to = flood_case.transport == Transport::roce ? random_loopback(7611) : loopback(0);
  ASSERT_TRUE(listener->bind(bind_to));
  ASSERT_TRUE(listener->listen(kBacklog));
  const sockaddr_in address = listener->local_address();
  char text[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &address.sin_addr, text, sizeof text);

  const std::size_t fds_before = open_fds();
  const std::int64_t heap_before = heap_bytes();
  std::atomic<bool> sampling{true};
  std::size_t peak_fds = fds_before;
  std::int64_t peak_heap = heap_before;
  std::thread sampler([&] {
    while (sampling.load()) {
      peak_fds = std::max(peak_fds, open_fds());
      peak_heap = std::max(peak_heap, heap_bytes());
      std::this_thread::sleep_for(2ms);
    }
  });
  PeerProcess flood({"request-flood", flood_case.transport == Transport::roce ? "roce" : "iwarp",
                     flood_case.p2p ? "p2p" : "cs", text, std::to_string(ntohs(address.sin_port)),
                     std::to_string(kTotal)});
  // The application takes the requests it is given and decides none of them. A request it
  // holds ends on its own once the listener's connect timeout passes (CONNECT_ERROR), and
  // stops being the listener's: what must stay within the backlog is the number alive at once.
  std::map<const CmId*, std::unique_ptr<CmId>> undecided;
  std::size_t delivered = 0, peak_alive = 0;
  std::optional<std::string> done;
  const auto start = Clock::now();
  while (!done && Clock::now() - start < 90s) {
    if (auto line = flood.read_line(1ms)) {
      if (line->rfind("done", 0) == 0) done = line;
      if (line->rfind("error", 0) == 0) break;
    }
    while (auto event = server.channel->get_event(0ms)) {
      if (event->type == CmEventType::connect_request && event->new_id) {
        ++delivered;
        const CmId* id = event->new_id.get();
        undecided.emplace(id, std::move(event->new_id));
      } else if (event->type != CmEventType::connect_request) {
        undecided.erase(event->id);  // its request ended without a decision
      }
      peak_alive = std::max(peak_alive, undecided.size());
    }
  }
  sampling = false;
  sampler.join();
  ASSERT_TRUE(done) << "the flood did not finish";
  const CmStats stats = cm_stats(*server.context);
  std::printf("[reliability] %s: %s; %zu requests delivered, at most %zu at once, %llu refused; fds +%zu, heap +%lld B\n",
              testing::UnitTest::GetInstance()->current_test_info()->name(), done->c_str(), delivered, peak_alive,
              static_cast<unsigned long long>(stats.backlog_refused), peak_fds - fds_before,
              static_cast<long long>(peak_heap - heap_before));
  EXPECT_LE(peak_alive, static_cast<std::size_t>(kBacklog)) << "requests got past the backlog";
  EXPECT_GE(delivered, 1u) << "no request reached the application";
  EXPECT_GT(stats.backlog_refused, kTotal / 2) << "the flood was not refused";
  // One descriptor per request held (iWARP's streams), one per request being refused at the
  // moment, the sampler's own /proc read: nothing grows with the flood.
  EXPECT_LE(peak_fds - fds_before, static_cast<std::size_t>(kBacklog) + 8);
  EXPECT_LE(peak_heap - heap_before, kBacklog * kPerRequest + kSlack);
  flood.kill();
}

// p2p exactness under a flood: while one address floods X with p2p requests that X's
// application never decides (they fill that address's share of X's backlog), X and Y, at
// another address, connect to each other at the same moment. The quarter of the backlog kept
// for other sources takes Y's request; rule 3 resolves the collision; exactly one connection.
struct Peer {
  Side side;
  std::unique_ptr<CmId> listener;
  sockaddr_in address{};
  Transport transport;
  Peer(std::uint64_t guid, Transport t, std::uint32_t host) : side(ContextOptions{.node_guid = guid}), transport(t) {
    listener = std::move(CmId::create(*side.context, *side.channel, nullptr, transport).value());
    sockaddr_in bind_to{};
    bind_to.sin_family = AF_INET;
    bind_to.sin_addr.s_addr = htonl(host);
    bind_to.sin_port = htons(transport == Transport::roce ? 7612 : 0);
    EXPECT_TRUE(listener->bind(bind_to));
    EXPECT_TRUE(listener->listen(16));
    address = listener->local_address();
  }
  // An id from this peer's own address to `to`, resolved, with a QP.
  std::unique_ptr<CmId> attempt_to(const sockaddr_in& to) {
    auto id = std::move(CmId::create(*side.context, *side.channel, nullptr, transport).value());
    sockaddr_in from = address;
    from.sin_port = 0;
    EXPECT_TRUE(id->bind(from));
    EXPECT_TRUE(id->resolve_addr(to));
    for (auto type : {CmEventType::addr_resolved, CmEventType::route_resolved}) {
      for (auto e = side.channel->get_event(5s); e; e = side.channel->get_event(5s)) {
        if (e->id != id.get()) continue;
        EXPECT_EQ(e->type, type) << to_string(e->type);
        break;
      }
      if (type == CmEventType::addr_resolved) {
        EXPECT_TRUE(id->resolve_route());
      }
    }
    id->create_qp(*side.pd, side.qp_attr()).value();
    return id;
  }
};

struct Outcome {
  bool established = false;
  int requests_from_the_peer = 0;
};

// Connects `id` and waits for its ESTABLISHED; counts CONNECT_REQUESTs from `peer`'s address
// (the flood's requests come from elsewhere and stay undecided).
Outcome run_attempt(Peer& self, CmId& id, const sockaddr_in& peer, std::vector<std::unique_ptr<CmId>>& held) {
  Outcome out;
  if (!id.connect({})) return out;
  const auto deadline = Clock::now() + 8s;
  while (!out.established && Clock::now() < deadline) {
    auto e = self.side.channel->get_event(100ms);
    if (!e) continue;
    if (e->type == CmEventType::connect_request && e->new_id) {
      if (e->new_id->peer_address().sin_addr.s_addr == peer.sin_addr.s_addr) ++out.requests_from_the_peer;
      held.push_back(std::move(e->new_id));
    } else if (e->id == &id) {
      if (e->type != CmEventType::established) {
        ADD_FAILURE() << "the attempt ended " << to_string(e->type) << " status " << e->status;
        return out;
      }
      out.established = true;
    }
  }
  return out;
}

class FloodedCollision : public testing::TestWithParam<Transport> {};

TEST_P(FloodedCollision, ASimultaneousConnectUnderAP2pFloodMakesExactlyOneConnection) {
  const Transport transport = GetParam();
  const std::uint32_t base = ntohl(random_loopback(0).sin_addr.s_addr) & 0xFFFFFF00u;
  Peer x(0x1000, transport, base | 1), y(0x2000, transport, base | 2);
  char text[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &x.address.sin_addr, text, sizeof text);
  // The flood comes from the flooder's own address (not y's): a peercm node or raw TCP
  // socket with the kernel's choice of source.
  PeerProcess flood({"request-flood", transport == Transport::roce ? "roce" : "iwarp", "p2p", text,
                     std::to_string(ntohs(x.address.sin_port)), "400"});
  std::vector<std::unique_ptr<CmId>> held_by_x, held_by_y;
  // Wait until the flood holds its whole share of x's backlog (12 of 16).
  const auto full_by = Clock::now() + 20s;
  while (held_by_x.size() < 12 && Clock::now() < full_by) {
    if (auto e = x.side.channel->get_event(10ms); e && e->type == CmEventType::connect_request && e->new_id)
      held_by_x.push_back(std::move(e->new_id));
  }
  ASSERT_EQ(held_by_x.size(), 12u) << "the flood never filled its share of the backlog";
  auto from_x = x.attempt_to(y.address);
  auto from_y = y.attempt_to(x.address);
  std::vector<std::uint8_t> message(32, 0x5A), inbox(32, 0);
  auto message_mr = x.side.region(message);
  auto inbox_mr = y.side.region(inbox);
  ASSERT_TRUE(from_y->qp()->post_recv(RecvWr{.wr_id = 1, .sg_list = {inbox_mr->sge()}}));
  Outcome at_x, at_y;
  std::thread other([&] { at_y = run_attempt(y, *from_y, x.address, held_by_y); });
  at_x = run_attempt(x, *from_x, y.address, held_by_x);
  other.join();
  ASSERT_TRUE(at_x.established && at_y.established);
  EXPECT_EQ(at_x.requests_from_the_peer + at_y.requests_from_the_peer, 0) << "the losing request reached an application";
  // One connection, between these two ids' queue pairs: what x sends, y receives.
  ASSERT_TRUE(from_x->qp()->post_send(SendWr{.wr_id = 2, .opcode = WrOpcode::send, .sg_list = {message_mr->sge()}}));
  const auto received = poll_n(*y.side.cq, 1, 5s);
  ASSERT_EQ(received.size(), 1u);
  EXPECT_EQ(received[0].status, WcStatus::success);
  EXPECT_EQ(inbox, message);
  flood.kill();
}

INSTANTIATE_TEST_SUITE_P(BothTransportsBothModels, RequestFlood,
                         testing::Values(FloodCase{Transport::iwarp, false}, FloodCase{Transport::iwarp, true},
                                         FloodCase{Transport::roce, false}, FloodCase{Transport::roce, true}),
                         case_name);
INSTANTIATE_TEST_SUITE_P(BothTransports, FloodedCollision, testing::Values(Transport::iwarp, Transport::roce),
                         transport_name);

}  // namespace
}  // namespace peercm::test
