// A RoCE peer SIGKILLed while its connection idles: no TCP stream tells anyone, so the RC
// keepalive must (RoceOptions::keepalive_interval, docs/roce-transport.md "Dead peers").
// The survivor gets DISCONNECTED within the documented bound, its posted receive flushes
// once, and its listener goes on taking connections.
#include <arpa/inet.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>

#include "loopback_pair.hpp"
#include "peer_process.hpp"

namespace peercm::test {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

std::unique_ptr<CmId> roce_listener(Side& side, sockaddr_in& address) {
  auto listener = std::move(CmId::create(*side.context, *side.channel, nullptr, Transport::roce).value());
  address = random_loopback(7471);
  EXPECT_TRUE(listener->bind(address));
  EXPECT_TRUE(listener->listen(4));
  return listener;
}

void accept_peer(Side& server, PeerProcess& peer) {
  auto request = expect_event(*server.channel, CmEventType::connect_request);
  ASSERT_TRUE(request.new_id);
  server.id = std::move(request.new_id);
  server.qp = server.id->create_qp(*server.pd, server.qp_attr()).value();
  ASSERT_TRUE(server.id->accept({}));
  expect_event(*server.channel, CmEventType::established);
  ASSERT_TRUE(peer.expect("established"));
}

TEST(RoceDeadPeer, IdleConnectionToAKilledPeerEndsWithinTheKeepaliveBound) {
  const ContextOptions options;  // the defaults a user gets
  Side server(options);
  sockaddr_in address{};
  auto listener = roce_listener(server, address);
  char text[INET_ADDRSTRLEN];
  ::inet_ntop(AF_INET, &address.sin_addr, text, sizeof text);
  const std::string port = std::to_string(ntohs(address.sin_port));
  PeerProcess peer({"roce-client", text, port});
  ASSERT_TRUE(peer.running());
  accept_peer(server, peer);
  std::vector<std::uint8_t> buffer(64);
  auto mr = server.region(buffer);
  ASSERT_TRUE(server.qp->post_recv(RecvWr{.wr_id = 1, .sg_list = {mr->sge(0, 64)}}));

  peer.kill();
  const auto killed = Clock::now();
  auto event = server.channel->get_event(10s);
  ASSERT_TRUE(event.has_value()) << "no event within 10 s of the kill";
  EXPECT_EQ(to_string(event->type), to_string(CmEventType::disconnected));
  EXPECT_EQ(event->id, server.id.get());
  const auto detected = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - killed);
  std::printf("[reliability] RoCE dead peer: DISCONNECTED %lld ms after the kill\n",
              static_cast<long long>(detected.count()));
  // The bound: one interval of silence, then 8 probes 67 ms apart (4.096 us x 2^14).
  const auto bound = options.roce.keepalive_interval + 8 * 68ms;
  EXPECT_LE(detected, bound + 500ms);  // scheduling slack on a loaded machine
  const auto flushed = poll_n(*server.cq, 1, 2s);
  ASSERT_EQ(flushed.size(), 1u);
  EXPECT_EQ(flushed[0].wr_id, 1u);
  EXPECT_EQ(flushed[0].status, WcStatus::wr_flush_error);
  EXPECT_TRUE(poll_n(*server.cq, 1, 100ms).empty());

  // The listener still serves a new client.
  PeerProcess next({"roce-client", text, port});
  accept_peer(server, next);
}

}  // namespace
}  // namespace peercm::test
