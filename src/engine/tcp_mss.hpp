// The effective MSS of a connected TCP socket, from which MPA sizes its FPDUs (RFC 5044 §4.5:
// MULPDU = EMSS minus the framing, so that an FPDU fits one segment).
#pragma once

#include <cstddef>
#include <optional>

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

}  // namespace peercm::engine
