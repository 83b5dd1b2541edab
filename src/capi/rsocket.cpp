// rsockets over the kernel's TCP, framed once connected (capi/rsocket_link.hpp,
// docs/c-api.md "rsockets"): a connected rsocket's descriptor is the application's end of a
// socket pair that the agent fills with the stream's bytes, so rrecv, rpoll and rselect are the
// kernel's calls; the sending calls frame what they write onto the TCP connection; riomap and
// riowrite place bytes in the peer's memory with no call on the peer's side.
#include <fcntl.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cstdarg>
#include <mutex>
#include <unordered_set>
#include <vector>

#include "capi/rsocket_link.hpp"

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wold-style-cast"
#include <rdma/rsocket.h>
#pragma GCC diagnostic pop

namespace {

namespace rsock = peercm::capi::rsock;

// Non-blocking connects still under way: made framed rsockets once they are connected.
std::mutex g_connecting_mutex;
std::unordered_set<int> g_connecting;

// The link of a connected rsocket, attaching one whose non-blocking connect has finished.
std::shared_ptr<rsock::Link> link_of(int socket) {
  if (auto link = rsock::find(socket)) return link;
  {
    std::lock_guard lock(g_connecting_mutex);
    if (!g_connecting.contains(socket)) return nullptr;
  }
  int error = 0;
  socklen_t length = sizeof error;
  if (::getsockopt(socket, SOL_SOCKET, SO_ERROR, &error, &length) != 0 || error != 0) return nullptr;
  auto link = rsock::attach(socket);
  if (link) {
    std::lock_guard lock(g_connecting_mutex);
    g_connecting.erase(socket);
  }
  return link;
}

std::shared_ptr<rsock::Link> require_link(int socket) {
  auto link = link_of(socket);
  if (!link) errno = ENOTCONN;
  return link;
}

// Datagram rsockets (udpong) are the kernel's UDP sockets, unframed.
bool is_datagram(int socket) {
  int type = 0;
  socklen_t length = sizeof type;
  return ::getsockopt(socket, SOL_SOCKET, SO_TYPE, &type, &length) == 0 && type == SOCK_DGRAM;
}

ssize_t send_iov(int socket, const iovec* iov, int iovcnt, int flags, const sockaddr* to = nullptr,
                 socklen_t to_length = 0) {
  auto link = link_of(socket);
  if (!link) {
    if (is_datagram(socket)) {
      msghdr msg{};
      msg.msg_name = const_cast<sockaddr*>(to);
      msg.msg_namelen = to_length;
      msg.msg_iov = const_cast<iovec*>(iov);
      msg.msg_iovlen = static_cast<std::size_t>(iovcnt);
      return ::sendmsg(socket, &msg, flags | MSG_NOSIGNAL);
    }
    errno = ENOTCONN;
    return -1;
  }
  // One frame per call: gather the iovec (rsend's callers pass one buffer; writev's few).
  std::size_t total = 0;
  for (int i = 0; i < iovcnt; ++i) total += iov[i].iov_len;
  if (iovcnt == 1) return link->send_data(static_cast<const std::uint8_t*>(iov[0].iov_base), total, flags);
  std::vector<std::uint8_t> gathered;
  gathered.reserve(std::min<std::size_t>(total, rsock::kMaxFramePayload));
  for (int i = 0; i < iovcnt && gathered.size() < rsock::kMaxFramePayload; ++i) {
    const auto* base = static_cast<const std::uint8_t*>(iov[i].iov_base);
    const std::size_t take = std::min(iov[i].iov_len, rsock::kMaxFramePayload - gathered.size());
    gathered.insert(gathered.end(), base, base + take);
  }
  return link->send_data(gathered.data(), gathered.size(), flags);
}

// The descriptor the kernel call takes for an option or an address: the TCP connection's
// once framed, else the socket itself.
int tcp_of(int socket) {
  auto link = rsock::find(socket);
  return link ? link->tcp_fd() : socket;
}

}  // namespace

int rsocket(int domain, int type, int protocol) { return ::socket(domain, type, protocol); }
int rbind(int socket, const sockaddr* addr, socklen_t addrlen) { return ::bind(socket, addr, addrlen); }
int rlisten(int socket, int backlog) { return ::listen(socket, backlog); }

int raccept(int socket, sockaddr* addr, socklen_t* addrlen) {
  const int fd = ::accept4(socket, addr, addrlen, SOCK_CLOEXEC);
  if (fd < 0) return fd;
  if (!rsock::attach(fd)) {
    const int error = errno;
    ::close(fd);
    errno = error;
    return -1;
  }
  return fd;
}

int rconnect(int socket, const sockaddr* addr, socklen_t addrlen) {
  if (::connect(socket, addr, addrlen) == 0) return rsock::attach(socket) || is_datagram(socket) ? 0 : -1;
  if (errno == EINPROGRESS) {
    std::lock_guard lock(g_connecting_mutex);
    g_connecting.insert(socket);
    errno = EINPROGRESS;
  }
  return -1;
}

int rshutdown(int socket, int how) {
  auto link = rsock::find(socket);
  if (!link) return ::shutdown(socket, how);
  // Our writes end on the TCP connection (the peer reads EOF); our reads on the pair.
  if (how == SHUT_WR || how == SHUT_RDWR) ::shutdown(link->tcp_fd(), SHUT_WR);
  if (how == SHUT_RD || how == SHUT_RDWR) ::shutdown(socket, SHUT_RD);
  return 0;
}

int rclose(int socket) {
  {
    std::lock_guard lock(g_connecting_mutex);
    g_connecting.erase(socket);
  }
  rsock::detach(socket);  // the link closes its TCP connection once the agent lets go of it
  return ::close(socket);
}

ssize_t rrecv(int socket, void* buf, size_t len, int flags) {
  link_of(socket);  // a non-blocking connect that finished since: its bytes come through the pair
  return ::recv(socket, buf, len, flags);
}
ssize_t rrecvfrom(int socket, void* buf, size_t len, int flags, sockaddr* src_addr, socklen_t* addrlen) {
  link_of(socket);
  return ::recvfrom(socket, buf, len, flags, src_addr, addrlen);
}
ssize_t rrecvmsg(int socket, msghdr* msg, int flags) {
  link_of(socket);
  return ::recvmsg(socket, msg, flags);
}
ssize_t rsend(int socket, const void* buf, size_t len, int flags) {
  const iovec iov{const_cast<void*>(buf), len};
  return send_iov(socket, &iov, 1, flags);
}
ssize_t rsendto(int socket, const void* buf, size_t len, int flags, const sockaddr* dest_addr, socklen_t addrlen) {
  // A connected stream ignores the address, as TCP does; a datagram socket sends to it.
  const iovec iov{const_cast<void*>(buf), len};
  return send_iov(socket, &iov, 1, flags, dest_addr, addrlen);
}
ssize_t rsendmsg(int socket, const msghdr* msg, int flags) {
  return send_iov(socket, msg->msg_iov, static_cast<int>(msg->msg_iovlen), flags,
                  static_cast<const sockaddr*>(msg->msg_name), msg->msg_namelen);
}
ssize_t rread(int socket, void* buf, size_t count) { return rrecv(socket, buf, count, 0); }
ssize_t rreadv(int socket, const iovec* iov, int iovcnt) {
  link_of(socket);
  return ::readv(socket, iov, iovcnt);
}
ssize_t rwrite(int socket, const void* buf, size_t count) { return rsend(socket, buf, count, 0); }
ssize_t rwritev(int socket, const iovec* iov, int iovcnt) { return send_iov(socket, iov, iovcnt, 0); }

int rpoll(pollfd* fds, nfds_t nfds, int timeout) {
  // Readable means stream bytes in the pair; writable means room on the TCP connection the
  // frames go to, so POLLOUT of a framed rsocket is asked of that connection.
  std::vector<pollfd> polled(fds, fds + nfds);
  std::vector<std::shared_ptr<rsock::Link>> links(nfds);
  for (nfds_t i = 0; i < nfds; ++i) {
    links[i] = link_of(fds[i].fd);
    if (links[i] && (fds[i].events & POLLOUT)) {
      polled[i].events = static_cast<short>(fds[i].events & ~POLLOUT);
      polled.push_back(pollfd{links[i]->tcp_fd(), POLLOUT, 0});
    }
  }
  const int n = ::poll(polled.data(), polled.size(), timeout);
  if (n < 0) return n;
  int ready = 0;
  for (nfds_t i = 0, extra = nfds; i < nfds; ++i) {
    fds[i].revents = polled[i].revents;
    if (links[i] && (fds[i].events & POLLOUT)) fds[i].revents |= static_cast<short>(polled[extra++].revents & (POLLOUT | POLLERR | POLLHUP));
    if (fds[i].revents != 0) ++ready;
  }
  return ready;
}

int rselect(int nfds, fd_set* readfds, fd_set* writefds, fd_set* exceptfds, timeval* timeout) {
  return ::select(nfds, readfds, writefds, exceptfds, timeout);
}

int rgetpeername(int socket, sockaddr* addr, socklen_t* addrlen) { return ::getpeername(tcp_of(socket), addr, addrlen); }
int rgetsockname(int socket, sockaddr* addr, socklen_t* addrlen) { return ::getsockname(tcp_of(socket), addr, addrlen); }

int rsetsockopt(int socket, int level, int optname, const void* optval, socklen_t optlen) {
  if (level == SOL_RDMA) return 0;  // queue sizes, inline and iomap limits of a transport not used here
  return ::setsockopt(tcp_of(socket), level, optname, optval, optlen);
}

int rgetsockopt(int socket, int level, int optname, void* optval, socklen_t* optlen) {
  if (level == SOL_RDMA) {
    errno = ENOPROTOOPT;
    return -1;
  }
  return ::getsockopt(tcp_of(socket), level, optname, optval, optlen);
}

int rfcntl(int socket, int cmd, ...) {
  va_list args;
  va_start(args, cmd);
  const long arg = va_arg(args, long);  // every fcntl command rsockets use takes an int or nothing
  va_end(args);
  const int result = ::fcntl(socket, cmd, arg);
  if (result == 0 && cmd == F_SETFL) {
    if (auto link = rsock::find(socket)) link->set_nonblocking((arg & O_NONBLOCK) != 0);
  }
  return result;
}

off_t riomap(int socket, void* buf, size_t len, int prot, int, off_t offset) {
  if (!(prot & PROT_WRITE)) {
    errno = EINVAL;  // a mapping is for the peer to write into
    return -1;
  }
  auto link = require_link(socket);
  return link ? link->map(buf, len, offset) : -1;
}

int riounmap(int socket, void* buf, size_t len) {
  auto link = require_link(socket);
  return link ? link->unmap(buf, len) : -1;
}

size_t riowrite(int socket, const void* buf, size_t count, off_t offset, int flags) {
  auto link = require_link(socket);
  if (!link) return static_cast<size_t>(-1);
  if (offset < 0) {
    errno = EINVAL;
    return static_cast<size_t>(-1);
  }
  const ssize_t n =
      link->write_remote(static_cast<const std::uint8_t*>(buf), count, static_cast<std::uint64_t>(offset), flags);
  return static_cast<size_t>(n);
}
