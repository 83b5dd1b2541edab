// What the connection layer relies on from TCP sockets: the EMSS that sizes FPDUs (the
// path's, also while Linux still bounds a new connection's MSS by half of the handshake's
// unscaled window), and TCP_NODELAY passing from a listener to the sockets it accepts.
#include "engine/tcp_mss.hpp"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/tcp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

namespace peercm::engine {
namespace {

TEST(EffectiveMss, BelowTheWindowBoundTheSocketsMssStands) {
  EXPECT_EQ(effective_mss(1448, 1500), 1448u);
  EXPECT_EQ(effective_mss(8948, 9000), 8948u);
  EXPECT_EQ(effective_mss(1448, 65536), 1448u) << "a peer's smaller MSS is not overridden";
}

TEST(EffectiveMss, AtTheWindowBoundThePathMtuDecides) {
  EXPECT_EQ(effective_mss(32768, 65536), static_cast<std::size_t>(65536 - kTcpIpHeaders));
  EXPECT_EQ(effective_mss(32768, std::nullopt), 32768u);
  EXPECT_EQ(effective_mss(32768, 16000), 32768u) << "never below what TCP reports";
}

// A connected loopback pair: the listener, the connecting end and the accepted end.
struct LoopbackPair {
  int listener = -1;
  int client = -1;
  int accepted = -1;
  explicit LoopbackPair(bool listener_nodelay = false) {
    listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    if (listener_nodelay) ::setsockopt(listener, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof address;
    if (::bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 || ::listen(listener, 1) != 0 ||
        ::getsockname(listener, reinterpret_cast<sockaddr*>(&address), &len) != 0)
      return;
    client = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (::connect(client, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) return;
    accepted = ::accept(listener, nullptr, nullptr);
  }
  ~LoopbackPair() {
    for (const int fd : {accepted, client, listener})
      if (fd >= 0) ::close(fd);
  }
  LoopbackPair(const LoopbackPair&) = delete;
  LoopbackPair& operator=(const LoopbackPair&) = delete;
};

// Loopback's MTU is 64 KiB: a fresh connection reports 32 KiB, its path allows twice that.
TEST(EffectiveMss, LoopbackConnectionGetsItsPathsMss) {
  const LoopbackPair pair;
  ASSERT_GE(pair.accepted, 0);
  int mtu = 0;
  socklen_t len = sizeof mtu;
  ASSERT_EQ(::getsockopt(pair.client, IPPROTO_IP, IP_MTU, &mtu, &len), 0);
  if (mtu <= 2 * kHandshakeWindowBoundMss) GTEST_SKIP() << "loopback MTU " << mtu << " is not above 60 KB";
  EXPECT_EQ(effective_mss(pair.client), static_cast<std::size_t>(mtu - kTcpIpHeaders));
  EXPECT_EQ(effective_mss(pair.accepted), static_cast<std::size_t>(mtu - kTcpIpHeaders));
}

TEST(EffectiveMss, NotASocketFallsBackTo1460) { EXPECT_EQ(effective_mss(-1), 1460u); }

TEST(EmssCache, ReadsEachPeerOncePerLifetime) {
  int queries = 0;
  std::size_t answer = 9000;
  EmssCache cache([&](int) {
    ++queries;
    return answer;
  });
  const auto t0 = EmssCache::Clock::now();
  EXPECT_EQ(cache.get(3, 0x7f000001, t0), 9000u);
  EXPECT_EQ(cache.get(4, 0x7f000001, t0 + EmssCache::kLifetime / 2), 9000u);
  EXPECT_EQ(queries, 1) << "a second connection to the same peer asks nothing";
  answer = 1448;
  EXPECT_EQ(cache.get(5, 0x0a000002, t0), 1448u) << "another peer has its own";
  EXPECT_EQ(queries, 2);
  EXPECT_EQ(cache.get(6, 0x7f000001, t0 + EmssCache::kLifetime), 1448u) << "an old reading is taken again";
  EXPECT_EQ(queries, 3);
}

// api/connection.cpp sets TCP_NODELAY on listeners only; accepted sockets must inherit it.
TEST(AcceptedSocket, InheritsNodelayFromItsListener) {
  const LoopbackPair pair(/*listener_nodelay=*/true);
  ASSERT_GE(pair.accepted, 0);
  int nodelay = 0;
  socklen_t len = sizeof nodelay;
  ASSERT_EQ(::getsockopt(pair.accepted, IPPROTO_TCP, TCP_NODELAY, &nodelay, &len), 0);
  EXPECT_NE(nodelay, 0);
}

}  // namespace
}  // namespace peercm::engine
