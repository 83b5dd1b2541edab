// RoCE peers that die (docs/reliability.md, "Dead peers"; docs/roce-transport.md "Dead peers"):
// - SIGKILLed while its connection idles: no TCP stream tells anyone, so the RC keepalive must
//   (RoceOptions::keepalive_interval). The survivor gets DISCONNECTED within the documented
//   bound, its posted receive flushes once, and its listener goes on taking connections.
// - Gone while we send to it (a REQ, RC packets): its host answers with ICMP port unreachable,
//   which ends the exchange at once instead of after every resend.
// - Restarted on its address (a new incarnation) and connecting again: its REQ ends the stale
//   connection first (docs/p2p.md R6), and our own connect then ends ESTABLISHED on its id,
//   whether it was made after that or before the REQ arrived (R5b: the connect waits on a check
//   of the connection). A connect to a live connected peer still ends with EISCONN, as an event.
#include <arpa/inet.h>
#include <netinet/ip.h>
#include <netinet/ip_icmp.h>
#include <netinet/udp.h>
#include <sys/socket.h>
#include <unistd.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <cstdio>
#include <optional>
#include <vector>

#include "api/roce/roce_verbs.hpp"
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
  // An id the test is done with may still report (its TIMEWAIT_EXIT can come before the next
  // peer's request on a slow machine): only the request matters here.
  CmEvent request;
  for (auto e = server.channel->get_event(10s); e; e = server.channel->get_event(10s)) {
    if (e->type == CmEventType::connect_request) {
      request = std::move(*e);
      break;
    }
  }
  ASSERT_TRUE(request.new_id) << "no CONNECT_REQUEST";
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

std::string text_of(const sockaddr_in& address) {
  char text[INET_ADDRSTRLEN];
  ::inet_ntop(AF_INET, &address.sin_addr, text, sizeof text);
  return text;
}

std::string port_of(const sockaddr_in& address) { return std::to_string(ntohs(address.sin_port)); }

// A RoCE id of `side` whose address and route to `to` are resolved, with a QP.
std::unique_ptr<CmId> routed_roce_id(Side& side, const sockaddr_in& to) {
  auto id = std::move(CmId::create(*side.context, *side.channel, nullptr, Transport::roce).value());
  EXPECT_TRUE(id->resolve_addr(to));
  expect_event(*side.channel, CmEventType::addr_resolved);
  EXPECT_TRUE(id->resolve_route());
  expect_event(*side.channel, CmEventType::route_resolved);
  EXPECT_TRUE(id->create_qp(*side.pd, side.qp_attr()));
  return id;
}

// The next event that is not the TIMEWAIT_EXIT of a connection that ended earlier.
std::optional<CmEvent> next_event(EventChannel& channel, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    auto event = channel.get_event(std::max(left, 0ms));
    if (!event) return std::nullopt;
    if (event->type != CmEventType::timewait_exit) return std::move(*event);
  }
}

std::chrono::milliseconds since(Clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
}

// The peer's node is gone before our REQ reaches it: its host answers the REQ with ICMP port
// unreachable, and the attempt ends UNREACHABLE at once. Without that it would wait out the
// REQ's resends (CM response timeout 4.3 s each, docs/roce-transport.md) or its connect timeout.
TEST(RoceDeadPeer, ConnectToAKilledPeerEndsUnreachableWithinASecond) {
  Side survivor;
  for (const bool peer_to_peer : {true, false}) {
    SCOPED_TRACE(peer_to_peer ? "p2p" : "client/server");
    const sockaddr_in dead = random_loopback(7472);
    PeerProcess peer({"roce-p2p", text_of(dead), port_of(dead)});
    ASSERT_TRUE(peer.expect("listening"));
    auto id = routed_roce_id(survivor, dead);
    ASSERT_TRUE(id->set_option(CmOption::peer_to_peer, peer_to_peer ? 1 : 0));
    const auto before = detail::roce::port_unreachable_counts(*survivor.context);
    peer.kill();
    const auto killed = Clock::now();
    ASSERT_TRUE(id->connect({}));
    auto event = survivor.channel->get_event(10s);
    ASSERT_TRUE(event.has_value());
    const auto detected = since(killed);
    std::printf("[reliability] RoCE connect to a killed peer (%s): %s %lld ms after the kill\n",
                peer_to_peer ? "p2p" : "client/server", std::string(to_string(event->type)).c_str(),
                static_cast<long long>(detected.count()));
    EXPECT_EQ(to_string(event->type), to_string(CmEventType::unreachable));
    EXPECT_EQ(event->id, id.get());
    EXPECT_LT(detected, 1000ms);
    EXPECT_GT(detail::roce::port_unreachable_counts(*survivor.context).taken, before.taken);
  }
}

// A connection that carries traffic when its peer dies: our packets bounce off the closed port,
// and the QP ends when its ACK timer first fires (67 ms), not after all retry_cnt + 1 of them;
// the Send completes with a retry error and the receive flushes, once each.
TEST(RoceDeadPeer, BusyConnectionToAKilledPeerEndsOnItsPortUnreachable) {
  ContextOptions options;
  options.roce.keepalive_interval = std::chrono::milliseconds(60000);  // only the traffic may tell
  Side server(options);
  sockaddr_in address{};
  auto listener = roce_listener(server, address);
  PeerProcess peer({"roce-client", text_of(address), port_of(address)});
  ASSERT_TRUE(peer.running());
  accept_peer(server, peer);
  std::vector<std::uint8_t> buffer(128);
  auto mr = server.region(buffer);
  ASSERT_TRUE(server.qp->post_recv(RecvWr{.wr_id = 1, .sg_list = {mr->sge(0, 64)}}));

  peer.kill();
  const auto killed = Clock::now();
  ASSERT_TRUE(server.qp->post_send(SendWr{.wr_id = 2, .opcode = WrOpcode::send, .sg_list = {mr->sge(64, 64)}}));
  auto event = server.channel->get_event(10s);
  ASSERT_TRUE(event.has_value());
  const auto detected = since(killed);
  std::printf("[reliability] RoCE busy connection to a killed peer: %s %lld ms after the kill\n",
              std::string(to_string(event->type)).c_str(), static_cast<long long>(detected.count()));
  EXPECT_EQ(to_string(event->type), to_string(CmEventType::disconnected));
  EXPECT_EQ(event->id, server.id.get());
  EXPECT_LT(detected, 1000ms);
  EXPECT_GE(detail::roce::port_unreachable_counts(*server.context).taken, 1u);
  auto completions = poll_n(*server.cq, 2, 2s);
  ASSERT_EQ(completions.size(), 2u);
  for (const auto& completion : completions) {
    if (completion.wr_id == 1) {
      EXPECT_EQ(completion.status, WcStatus::wr_flush_error);
    } else {
      EXPECT_EQ(completion.wr_id, 2u);
      EXPECT_EQ(completion.status, WcStatus::retry_exceeded);
    }
  }
  EXPECT_NE(completions[0].wr_id, completions[1].wr_id);
  EXPECT_TRUE(poll_n(*server.cq, 1, 100ms).empty());
}

// docs/p2p.md R6 over the IB CM: a node connected to us is SIGKILLed and restarted on its
// address (a new context: a new incarnation), and connects again. Its REQ finds our connection
// to its dead incarnation still established (nothing told us of the death): the REQ ends it
// first (DISCONNECTED on the old id), and our own connect, made once we saw that, meets the
// restarted peer's request under R5a/R3 and ends ESTABLISHED on the id we connected with, on
// both sides; the request never reaches our listener as CONNECT_REQUEST. As over iWARP, where
// the dead stream's reset ends the old connection and the two connects then collide.
TEST(RoceDeadPeer, RestartedPeersRequestEndsTheStaleConnectionAndOurConnectEstablishes) {
  ContextOptions options;
  options.roce.keepalive_interval = std::chrono::milliseconds(60000);  // only the REQ may tell
  Side survivor(options);
  sockaddr_in own{};
  auto listener = roce_listener(survivor, own);
  const sockaddr_in peer_address = random_loopback(7473);
  auto peer = std::make_unique<PeerProcess>(std::vector<std::string>{"roce-p2p", text_of(peer_address), port_of(peer_address)});
  ASSERT_TRUE(peer->expect("listening"));
  auto connected = routed_roce_id(survivor, peer_address);
  ASSERT_TRUE(connected->connect({}));
  expect_event(*survivor.channel, CmEventType::established);
  ASSERT_TRUE(peer->expect("established accepted"));

  constexpr int kRounds = 20;
  for (int round = 0; round < kRounds; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    // Resolved now: its events must not be fetched after the peer's CONNECT_REQUEST arrived,
    // which the connect could then no longer take back (R5a: delivered means fetched).
    auto reconnecting = routed_roce_id(survivor, peer_address);
    peer.reset();  // SIGKILL
    peer = std::make_unique<PeerProcess>(std::vector<std::string>{"roce-p2p", text_of(peer_address), port_of(peer_address)});
    ASSERT_TRUE(peer->expect("listening"));
    ASSERT_TRUE(peer->send_line("connect " + text_of(own) + " " + port_of(own)));
    const auto asked = Clock::now();
    auto ended = next_event(*survivor.channel, 5s);
    ASSERT_TRUE(ended.has_value()) << "the stale connection outlived the restarted peer's REQ";
    EXPECT_EQ(to_string(ended->type), to_string(CmEventType::disconnected));
    EXPECT_EQ(ended->id, connected.get());
    EXPECT_LT(since(asked), 2000ms);
    // The restarted peer's CONNECT_REQUEST, if the request was delivered, is still on the
    // channel: the connect takes it back (R5a) and the two attempts resolve (R3).
    ASSERT_TRUE(reconnecting->connect({})) << "the connect found the key still connected";
    auto event = next_event(*survivor.channel, 5s);
    ASSERT_TRUE(event.has_value());
    EXPECT_EQ(to_string(event->type), to_string(CmEventType::established));
    EXPECT_EQ(event->id, reconnecting.get());
    ASSERT_TRUE(peer->expect("established connecting"));
    EXPECT_FALSE(next_event(*survivor.channel, 50ms).has_value());  // no CONNECT_REQUEST, nothing else
    connected = std::move(reconnecting);
  }
}

// docs/p2p.md R5b over the IB CM: the survivor connects while its connection to the killed
// and restarted peer still counts as established (the peer's REQ is still to come). The connect
// does not fail with EISCONN: the connection is checked (a probe on its QP, which the new
// incarnation drops), and the restarted peer's REQ, arriving meanwhile, ends the stale
// connection (DISCONNECTED on the old id) and is bound to the waiting attempt, which ends
// ESTABLISHED on the id the survivor connected with. Even rounds connect before the peer is
// asked to connect (the REQ surely comes second); odd rounds right after (either order).
TEST(RoceDeadPeer, ConnectBeforeTheRestartedPeersRequestEndsEstablishedOnTheConnectingId) {
  ContextOptions options;
  options.roce.keepalive_interval = std::chrono::milliseconds(60000);  // only the check and the REQ may tell
  Side survivor(options);
  sockaddr_in own{};
  auto listener = roce_listener(survivor, own);
  const sockaddr_in peer_address = random_loopback(7475);
  const std::vector<std::string> peer_arguments{"roce-p2p", text_of(peer_address), port_of(peer_address)};
  auto peer = std::make_unique<PeerProcess>(peer_arguments);
  ASSERT_TRUE(peer->expect("listening"));
  std::unique_ptr<CmId> connected = routed_roce_id(survivor, peer_address);
  ASSERT_TRUE(connected->connect({}));
  expect_event(*survivor.channel, CmEventType::established);
  ASSERT_TRUE(peer->expect("established accepted"));

  constexpr int kRounds = 20;
  int on_connecting_id = 0;
  std::vector<double> connect_to_established_ms;
  for (int round = 0; round < kRounds; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    auto reconnecting = routed_roce_id(survivor, peer_address);
    peer.reset();  // SIGKILL
    peer = std::make_unique<PeerProcess>(peer_arguments);
    ASSERT_TRUE(peer->expect("listening"));
    const bool connect_first = round % 2 == 0;
    const std::string ask = "connect " + text_of(own) + " " + port_of(own);
    if (!connect_first) {
      ASSERT_TRUE(peer->send_line(ask));
    }
    const auto asked = Clock::now();
    const auto connecting = reconnecting->connect({});
    if (connect_first) {
      ASSERT_TRUE(peer->send_line(ask));
    }
    auto ended = next_event(*survivor.channel, 5s);
    ASSERT_TRUE(ended.has_value()) << "the stale connection outlived the restarted peer's REQ";
    EXPECT_EQ(to_string(ended->type), to_string(CmEventType::disconnected));
    EXPECT_EQ(ended->id, connected.get());
    if (!connecting) {
      // What R5b replaces: EISCONN at once; the peer's request then reaches the listener.
      ADD_FAILURE() << "connect() failed: " << std::make_error_code(connecting.error()).message();
      accept_peer(survivor, *peer);
      connected = std::move(survivor.id);
      continue;
    }
    auto event = next_event(*survivor.channel, 5s);
    ASSERT_TRUE(event.has_value());
    EXPECT_EQ(to_string(event->type), to_string(CmEventType::established));
    EXPECT_EQ(event->id, reconnecting.get());
    if (event->type == CmEventType::established && event->id == reconnecting.get()) {
      ++on_connecting_id;
      connect_to_established_ms.push_back(
          std::chrono::duration<double, std::milli>(Clock::now() - asked).count());
    }
    ASSERT_TRUE(peer->expect("established connecting"));
    EXPECT_FALSE(next_event(*survivor.channel, 50ms).has_value());  // no CONNECT_REQUEST, nothing else
    connected = std::move(reconnecting);
  }
  std::sort(connect_to_established_ms.begin(), connect_to_established_ms.end());
  const std::size_t n = connect_to_established_ms.size();
  std::printf("[reliability] RoCE restart, connect before the peer's REQ: %d/%d rounds ESTABLISHED on the connecting id; "
              "connect() to ESTABLISHED median %.1f ms, worst %.1f ms\n",
              on_connecting_id, kRounds, n ? connect_to_established_ms[n / 2] : 0.0,
              n ? connect_to_established_ms.back() : 0.0);
  EXPECT_EQ(on_connecting_id, kRounds);
}

// R5b, outcome (b): a connect to a key whose connection is alive fails with EISCONN as over
// iWARP, but over RoCE as an event: connect() returns, the connection is checked, the peer
// answers the probe, and CONNECT_ERROR with status EISCONN follows on the connecting id. The
// connection itself is untouched, and asking again gives the same answer.
TEST(RoceDeadPeer, ConnectToALiveConnectedPeerEndsWithEisconnAsAnEvent) {
  ContextOptions options;
  options.roce.keepalive_interval = std::chrono::milliseconds(60000);
  Side survivor(options);
  sockaddr_in own{};
  auto listener = roce_listener(survivor, own);
  const sockaddr_in peer_address = random_loopback(7477);
  PeerProcess peer({"roce-p2p", text_of(peer_address), port_of(peer_address)});
  ASSERT_TRUE(peer.expect("listening"));
  auto connected = routed_roce_id(survivor, peer_address);
  ASSERT_TRUE(connected->connect({}));
  expect_event(*survivor.channel, CmEventType::established);
  ASSERT_TRUE(peer.expect("established accepted"));
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    auto again = routed_roce_id(survivor, peer_address);
    const auto asked = Clock::now();
    ASSERT_TRUE(again->connect({})) << "RoCE answers R5 after the check, as an event";
    auto event = next_event(*survivor.channel, 5s);
    ASSERT_TRUE(event.has_value());
    EXPECT_EQ(to_string(event->type), to_string(CmEventType::connect_error));
    EXPECT_EQ(event->status, EISCONN);
    EXPECT_EQ(event->id, again.get());
    const auto answered = std::chrono::duration<double, std::milli>(Clock::now() - asked).count();
    EXPECT_LT(since(asked), 1000ms);  // one round trip to the peer; generous for a loaded host
    std::printf("[reliability] RoCE connect to a live connected peer: CONNECT_ERROR (EISCONN) %.2f ms after connect()\n",
                answered);
    EXPECT_FALSE(next_event(*survivor.channel, 100ms).has_value());  // the connection stays
  }
  EXPECT_FALSE(peer.read_line(100ms).has_value());  // nothing reached the peer's application
}

// R5b, outcome (c): the peer was killed and nothing took its place. The check's probe bounces
// off the closed port (ICMP port unreachable), which ends the stale connection (DISCONNECTED on
// the old id); the attempt then goes on as a fresh connect, whose REQ bounces too: UNREACHABLE.
TEST(RoceDeadPeer, ConnectToAKilledConnectedPeerEndsTheStaleConnectionAndGoesOn) {
  ContextOptions options;
  options.roce.keepalive_interval = std::chrono::milliseconds(60000);
  Side survivor(options);
  sockaddr_in own{};
  auto listener = roce_listener(survivor, own);
  const sockaddr_in peer_address = random_loopback(7479);
  auto peer = std::make_unique<PeerProcess>(std::vector<std::string>{"roce-p2p", text_of(peer_address), port_of(peer_address)});
  ASSERT_TRUE(peer->expect("listening"));
  auto connected = routed_roce_id(survivor, peer_address);
  ASSERT_TRUE(connected->connect({}));
  expect_event(*survivor.channel, CmEventType::established);
  ASSERT_TRUE(peer->expect("established accepted"));
  auto again = routed_roce_id(survivor, peer_address);
  peer.reset();  // SIGKILL
  const auto asked = Clock::now();
  ASSERT_TRUE(again->connect({}));
  auto ended = next_event(*survivor.channel, 5s);
  ASSERT_TRUE(ended.has_value());
  EXPECT_EQ(to_string(ended->type), to_string(CmEventType::disconnected));
  EXPECT_EQ(ended->id, connected.get());
  const auto disconnected = since(asked);
  // One local ACK timeout (67 ms) until the probe's bounce is read; 8 of them (0.54 s) if the
  // host drops that ICMP error (the kernel rate-limits them host-wide).
  EXPECT_LT(disconnected, 1500ms);
  // The attempt went on: its own REQ went out and bounced at once. It leaves beside the DREQ
  // to the same dead peer, each MAD in a datagram of its own, so each bounce names its own
  // exchange (in one GSO send only the DREQ's came back, and the REQ waited for its first
  // resend, 4.8 s).
  auto event = next_event(*survivor.channel, 10s);
  ASSERT_TRUE(event.has_value());
  EXPECT_EQ(to_string(event->type), to_string(CmEventType::unreachable));
  EXPECT_EQ(event->id, again.get());
  EXPECT_LT(since(asked), 1500ms);
  std::printf("[reliability] RoCE connect to a killed connected peer: DISCONNECTED %lld ms, UNREACHABLE %lld ms after connect()\n",
              static_cast<long long>(disconnected.count()), static_cast<long long>(since(asked).count()));
}

std::uint16_t internet_checksum(std::span<const std::uint8_t> bytes) {
  std::uint32_t sum = 0;
  for (std::size_t i = 0; i + 1 < bytes.size(); i += 2) sum += std::uint32_t{bytes[i]} << 8 | bytes[i + 1];
  if (bytes.size() % 2) sum += std::uint32_t{bytes.back()} << 8;
  while (sum >> 16) sum = (sum & 0xFFFF) + (sum >> 16);
  return static_cast<std::uint16_t>(~sum);
}

// Sends, from `claimed_source` (a raw socket writes any source address), an ICMP port
// unreachable to `to` that quotes the datagram `to`:4791 sent to `about`:4791.
bool forge_port_unreachable(int raw, std::uint32_t claimed_source, std::uint32_t to, std::uint32_t about,
                            std::span<const std::uint8_t> quoted) {
  const std::size_t inner_udp = sizeof(udphdr) + quoted.size();
  std::array<std::uint8_t, 2 * sizeof(iphdr) + 8 + sizeof(udphdr) + 512> storage{};
  if (quoted.size() > 512) return false;
  const std::span<std::uint8_t> packet(storage.data(), sizeof(iphdr) + 8 + sizeof(iphdr) + inner_udp);
  iphdr outer{};
  outer.version = 4;
  outer.ihl = 5;
  outer.ttl = 64;
  outer.protocol = IPPROTO_ICMP;
  outer.tot_len = htons(static_cast<std::uint16_t>(packet.size()));
  outer.saddr = htonl(claimed_source);
  outer.daddr = htonl(to);
  std::memcpy(packet.data(), &outer, sizeof outer);
  const std::size_t icmp = sizeof(iphdr);
  packet[icmp] = ICMP_DEST_UNREACH;
  packet[icmp + 1] = ICMP_PORT_UNREACH;
  iphdr inner{};
  inner.version = 4;
  inner.ihl = 5;
  inner.ttl = 64;
  inner.protocol = IPPROTO_UDP;
  inner.tot_len = htons(static_cast<std::uint16_t>(sizeof(iphdr) + inner_udp));
  inner.saddr = htonl(to);
  inner.daddr = htonl(about);
  std::array<std::uint8_t, sizeof(iphdr)> inner_bytes{};
  std::memcpy(inner_bytes.data(), &inner, sizeof inner);
  inner.check = htons(internet_checksum(inner_bytes));
  std::memcpy(packet.data() + icmp + 8, &inner, sizeof inner);
  udphdr udp{};
  udp.source = htons(4791);
  udp.dest = htons(4791);
  udp.len = htons(static_cast<std::uint16_t>(inner_udp));
  std::memcpy(packet.data() + icmp + 8 + sizeof(iphdr), &udp, sizeof udp);
  std::memcpy(packet.data() + icmp + 8 + sizeof(iphdr) + sizeof(udphdr), quoted.data(), quoted.size());
  const std::uint16_t checksum = internet_checksum(packet.subspan(icmp));
  packet[icmp + 2] = static_cast<std::uint8_t>(checksum >> 8);
  packet[icmp + 3] = static_cast<std::uint8_t>(checksum);
  sockaddr_in destination{};
  destination.sin_family = AF_INET;
  destination.sin_addr.s_addr = htonl(to);
  return ::sendto(raw, packet.data(), packet.size(), 0, reinterpret_cast<const sockaddr*>(&destination),
                  sizeof destination) == static_cast<ssize_t>(packet.size());
}

// What is trusted (docs/reliability.md, "Dead peers (RoCE)"): our REQ sits unanswered at a
// socket that holds the peer's RoCE port. A port unreachable that quotes it exactly but comes
// from a third address changes nothing and is counted as ignored; the same error from the
// peer's own address ends the attempt at once. The second half is the trade-off the page
// states: whoever can send with the peer's address (here a raw socket, CAP_NET_RAW) can end
// an attempt of ours to that peer, and only that.
TEST(RoceDeadPeer, PortUnreachableCountsOnlyFromThePeersOwnAddress) {
  const int raw = ::socket(AF_INET, SOCK_RAW | SOCK_CLOEXEC, IPPROTO_RAW);
  if (raw < 0) GTEST_SKIP() << "no raw socket (needs CAP_NET_RAW) to forge ICMP errors with";
  const sockaddr_in peer = random_loopback(7474);
  const int holder = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(holder, 0);
  sockaddr_in port = peer;
  port.sin_port = htons(4791);
  ASSERT_EQ(::bind(holder, reinterpret_cast<const sockaddr*>(&port), sizeof port), 0);
  timeval wait{.tv_sec = 5, .tv_usec = 0};
  ::setsockopt(holder, SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof wait);

  Side survivor;
  auto id = routed_roce_id(survivor, peer);
  ASSERT_TRUE(id->connect({}));
  std::array<std::uint8_t, 512> request{};
  sockaddr_in from{};
  socklen_t length = sizeof from;
  const ssize_t size = ::recvfrom(holder, request.data(), request.size(), 0, reinterpret_cast<sockaddr*>(&from), &length);
  ASSERT_GT(size, 64);
  const auto quoted = std::span<const std::uint8_t>(request.data(), static_cast<std::size_t>(size));
  const std::uint32_t us = ntohl(from.sin_addr.s_addr);
  const std::uint32_t them = ntohl(peer.sin_addr.s_addr);

  const auto before = detail::roce::port_unreachable_counts(*survivor.context);
  ASSERT_TRUE(forge_port_unreachable(raw, (127u << 24) | 0x090909, us, them, quoted));
  EXPECT_FALSE(survivor.channel->get_event(300ms).has_value()) << "an error from a third address ended the attempt";
  const auto third = detail::roce::port_unreachable_counts(*survivor.context);
  EXPECT_EQ(third.taken, before.taken);
  EXPECT_EQ(third.ignored, before.ignored + 1);

  ASSERT_TRUE(forge_port_unreachable(raw, them, us, them, quoted));
  auto event = survivor.channel->get_event(2s);
  ASSERT_TRUE(event.has_value());
  EXPECT_EQ(to_string(event->type), to_string(CmEventType::unreachable));
  EXPECT_EQ(event->id, id.get());
  EXPECT_EQ(detail::roce::port_unreachable_counts(*survivor.context).taken, third.taken + 1);
  ::close(holder);
  ::close(raw);
}

}  // namespace
}  // namespace peercm::test
