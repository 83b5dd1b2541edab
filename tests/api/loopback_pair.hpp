// Test fixture: two contexts connected over loopback through the public API, as an
// application would do it (listen / resolve / connect / accept with events), over iWARP
// (127.0.0.1) or RoCEv2 (a random 127/8 server address: a RoCE node is one address, and
// parallel test processes must not share (address, 4791)).
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>

#include <chrono>
#include <initializer_list>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "peercm/cm.hpp"
#include "peercm/verbs.hpp"

namespace peercm::test {

using namespace std::chrono_literals;

inline sockaddr_in loopback(std::uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return a;
}

inline sockaddr_in random_loopback(std::uint16_t port) {
  static std::mt19937 random{std::random_device{}()};
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  const std::uint32_t host = (127u << 24) | (std::uniform_int_distribution<std::uint32_t>(1, 254)(random) << 16) |
                             (std::uniform_int_distribution<std::uint32_t>(0, 255)(random) << 8) |
                             std::uniform_int_distribution<std::uint32_t>(1, 254)(random);
  a.sin_addr.s_addr = htonl(host);
  return a;
}

// Waits for the next event and checks its type.
inline CmEvent expect_event(EventChannel& channel, CmEventType type, std::chrono::milliseconds timeout = 5s) {
  auto event = channel.get_event(timeout);
  EXPECT_TRUE(event.has_value()) << "no event, wanted " << to_string(type);
  if (!event) return CmEvent{};
  EXPECT_EQ(to_string(event->type), to_string(type)) << "status " << event->status;
  return std::move(*event);
}

// Polls until `n` completions arrived or the timeout passed.
inline std::vector<WorkCompletion> poll_n(CompletionQueue& cq, std::size_t n, std::chrono::milliseconds timeout = 10s) {
  std::vector<WorkCompletion> out;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  WorkCompletion batch[16];
  while (out.size() < n && std::chrono::steady_clock::now() < deadline) {
    const std::size_t got = cq.poll(std::span(batch, std::min<std::size_t>(16, n - out.size())));
    out.insert(out.end(), batch, batch + got);
  }
  return out;
}

// One side of a connection: its context, PD, CQ and CmId.
struct Side {
  std::unique_ptr<Context> context;
  std::unique_ptr<EventChannel> channel;
  std::unique_ptr<ProtectionDomain> pd;
  std::unique_ptr<CompletionQueue> cq;
  std::unique_ptr<CmId> id;
  QueuePair* qp = nullptr;

  explicit Side(ContextOptions options = {}) {
    context = std::move(Context::open(options).value());
    channel = std::move(EventChannel::create().value());
    pd = std::move(ProtectionDomain::allocate(*context).value());
    cq = std::move(CompletionQueue::create(*context, 4096).value());
  }
  QpInitAttr qp_attr() const {
    QpInitAttr attr;
    attr.send_cq = cq.get();
    attr.recv_cq = cq.get();
    attr.caps.max_send_wr = 512;
    attr.caps.max_recv_wr = 512;
    attr.caps.max_send_sge = 4;
    attr.caps.max_recv_sge = 4;
    return attr;
  }
  std::unique_ptr<MemoryRegion> region(std::vector<std::uint8_t>& buffer,
                                       std::uint32_t access = kAccessLocalWrite | kAccessRemoteWrite | kAccessRemoteRead) {
    return std::move(MemoryRegion::register_memory(*pd, buffer.data(), buffer.size(), access).value());
  }
};

// A CmId of `side` with `options` set, its address and route to `to` resolved (both events
// taken from the side's channel) and a QP of side.qp_attr(): what a test does before connect().
// `source` (host order, 0: the stack's choice) is bound first, as rdma_resolve_addr's src_addr.
inline std::unique_ptr<CmId> routed_id(Side& side, const sockaddr_in& to,
                                       std::initializer_list<std::pair<CmOption, std::int64_t>> options = {},
                                       Transport transport = Transport::iwarp, std::uint32_t source = 0) {
  auto id = std::move(CmId::create(*side.context, *side.channel, nullptr, transport).value());
  for (const auto& [option, value] : options) EXPECT_TRUE(id->set_option(option, value));
  if (source != 0) {
    sockaddr_in from{};
    from.sin_family = AF_INET;
    from.sin_addr.s_addr = htonl(source);
    EXPECT_TRUE(id->bind(from));
  }
  EXPECT_TRUE(id->resolve_addr(to));
  expect_event(*side.channel, CmEventType::addr_resolved);
  EXPECT_TRUE(id->resolve_route());
  expect_event(*side.channel, CmEventType::route_resolved);
  id->create_qp(*side.pd, side.qp_attr()).value();
  return id;
}

// Test-name suffix of a suite parameterized on the transport.
inline std::string transport_name(const testing::TestParamInfo<Transport>& info) {
  return std::string(to_string(info.param));
}

struct Options {
  bool peer_to_peer = false;
  std::int64_t crc = 1;  // preferred
  ConnParam client_param;
  ConnParam server_param;
  ContextOptions context;
  Transport transport = Transport::iwarp;
};

// A listening server and a client connected to it.
struct LoopbackPair {
  Side server;
  Side client;
  std::unique_ptr<CmId> listener;
  sockaddr_in address{};  // the listener's
  std::uint16_t port = 0;
  CmEvent request;  // the CONNECT_REQUEST the server saw
  ConnParam client_established;

  explicit LoopbackPair(const Options& options = {}) : server(options.context), client(options.context) {
    listener = std::move(CmId::create(*server.context, *server.channel, nullptr, options.transport).value());
    EXPECT_TRUE(listener->set_option(CmOption::crc, options.crc));
    const bool roce = options.transport == Transport::roce;
    EXPECT_TRUE(listener->bind(roce ? random_loopback(0) : loopback(0)));
    EXPECT_TRUE(listener->listen(16));
    address = listener->local_address();
    port = ntohs(address.sin_port);
  }

  // Starts the client side up to connect(); returns false on a setup failure.
  void start_client(const Options& options) {
    client.id = std::move(CmId::create(*client.context, *client.channel, nullptr, options.transport).value());
    EXPECT_TRUE(client.id->set_option(CmOption::peer_to_peer, options.peer_to_peer ? 1 : 0));
    EXPECT_TRUE(client.id->set_option(CmOption::crc, options.crc));
    EXPECT_TRUE(client.id->resolve_addr(address));
    expect_event(*client.channel, CmEventType::addr_resolved);
    EXPECT_TRUE(client.id->resolve_route());
    expect_event(*client.channel, CmEventType::route_resolved);
    client.qp = client.id->create_qp(*client.pd, client.qp_attr()).value();
    EXPECT_TRUE(client.id->connect(options.client_param));
  }

  // The server takes the request and accepts it; both sides see ESTABLISHED.
  void accept(const Options& options) {
    request = expect_event(*server.channel, CmEventType::connect_request);
    ASSERT_TRUE(request.new_id);
    server.id = std::move(request.new_id);
    server.qp = server.id->create_qp(*server.pd, server.qp_attr()).value();
    ASSERT_TRUE(server.id->accept(options.server_param));
    auto established = expect_event(*client.channel, CmEventType::established);
    client_established = established.param;
    expect_event(*server.channel, CmEventType::established);
  }

  static std::unique_ptr<LoopbackPair> connected(const Options& options = {}) {
    auto pair = std::make_unique<LoopbackPair>(options);
    pair->start_client(options);
    pair->accept(options);
    return pair;
  }
};

}  // namespace peercm::test
