// The effective MSS of a connected TCP socket, from which MPA sizes its FPDUs (RFC 5044 §4.5:
// MULPDU = EMSS minus the framing, so that an FPDU fits one segment).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <unordered_map>

namespace peercm::engine {

// Linux bounds a new connection's MSS by half the largest window seen so far, and the
// windows of the handshake are unscaled (at most 64 KiB): the bound is 32741-32768 on
// loopback, depending on the first window. An MSS that large (only paths with an MTU above
// 30 KB have one, loopback among them) is the window's, not the path's, and grows as soon
// as the windows do: the path's MTU then gives the EMSS.
inline constexpr int kHandshakeWindowBoundMss = 30000;
inline constexpr int kTcpIpHeaders = 20 + 20 + 12;  // IPv4, TCP, the timestamp option

// `tcp_maxseg`: TCP_MAXSEG of the socket; `path_mtu`: IP_MTU, if known.
std::size_t effective_mss(int tcp_maxseg, std::optional<int> path_mtu);
// Reads both from a connected socket (1460 when even TCP_MAXSEG fails).
std::size_t effective_mss(int fd);

// The EMSS per peer address, read from a socket at most once per kLifetime: every
// connection to one peer has the same (both ends' MTUs decide it), and the two calls it
// takes were a tenth of a connection's setup in a burst of connections. A path MTU that
// changes is seen within kLifetime. Not thread-safe (the owner's lock guards it).
class EmssCache {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr Clock::duration kLifetime = std::chrono::seconds(1);
  using Query = std::function<std::size_t(int fd)>;
  explicit EmssCache(Query query = [](int fd) { return effective_mss(fd); }) : query_(std::move(query)) {}
  std::size_t get(int fd, std::uint32_t peer_ipv4, Clock::time_point now);

 private:
  struct Entry {
    std::size_t emss;
    Clock::time_point read_at;
  };
  Query query_;
  std::unordered_map<std::uint32_t, Entry> entries_;
};

}  // namespace peercm::engine
