#include "engine/tcp_mss.hpp"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <algorithm>

namespace peercm::engine {

std::size_t effective_mss(int tcp_maxseg, std::optional<int> path_mtu) {
  int mss = tcp_maxseg;
  if (mss >= kHandshakeWindowBoundMss && path_mtu) mss = std::max(mss, *path_mtu - kTcpIpHeaders);
  return static_cast<std::size_t>(std::max(mss, 1));
}

std::size_t effective_mss(int fd) {
  int mss = 0;
  socklen_t len = sizeof mss;
  if (::getsockopt(fd, IPPROTO_TCP, TCP_MAXSEG, &mss, &len) != 0 || mss <= 0) return 1460;
  std::optional<int> mtu;
  if (mss >= kHandshakeWindowBoundMss) {  // only then does the MTU matter: one call fewer
    int value = 0;
    len = sizeof value;
    if (::getsockopt(fd, IPPROTO_IP, IP_MTU, &value, &len) == 0 && value > 0) mtu = value;
  }
  return effective_mss(mss, mtu);
}

std::size_t EmssCache::get(int fd, std::uint32_t peer_ipv4, Clock::time_point now) {
  const auto it = entries_.find(peer_ipv4);
  if (it != entries_.end() && now - it->second.read_at < kLifetime) return it->second.emss;
  const std::size_t emss = query_(fd);
  entries_.insert_or_assign(peer_ipv4, Entry{emss, now});
  return emss;
}

}  // namespace peercm::engine
