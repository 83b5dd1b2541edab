#include "tcp_baseline.hpp"

#include <fmt/core.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>
#include <vector>

namespace peercm::tool {
namespace {

[[noreturn]] void throw_errno(std::string_view what) {
  const int err = errno;
  if (err == EAGAIN || err == EWOULDBLOCK)
    throw ToolError(fmt::format("tcp {}: timed out after {} ms", what, kWaitTimeout.count()));
  throw ToolError(fmt::format("tcp {}: {}", what, std::generic_category().message(err)));
}

void set_options(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  timeval tv{};
  tv.tv_sec = kWaitTimeout.count() / 1000;
  tv.tv_usec = static_cast<suseconds_t>((kWaitTimeout.count() % 1000) * 1000);
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

void write_all(int fd, const std::uint8_t* data, std::size_t n) {
  while (n > 0) {
    const ssize_t w = ::send(fd, data, n, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR) continue;
      throw_errno("send");
    }
    data += w;
    n -= static_cast<std::size_t>(w);
  }
}

void read_all(int fd, std::uint8_t* data, std::size_t n, TcpWait wait = TcpWait::block) {
  const int flags = wait == TcpWait::spin ? MSG_DONTWAIT : 0;
  std::uint64_t empty_reads = 0;
  Clock::time_point spinning_since{};  // read only after many empty reads: no clock on the message path
  while (n > 0) {
    const ssize_t r = ::recv(fd, data, n, flags);
    if (r < 0) {
      if (errno == EINTR) continue;
      // Spinning: SO_RCVTIMEO cannot end the wait, so look at the clock now and then; and
      // yield now and then, as peercm's pollers do, in case the other end shares the CPU.
      if (wait == TcpWait::spin && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        if (++empty_reads % 64 == 0) std::this_thread::yield();
        if (empty_reads % 4096 != 0) continue;
        const auto now = Clock::now();
        if (spinning_since == Clock::time_point{}) spinning_since = now;
        if (now - spinning_since < kWaitTimeout) continue;
      }
      throw_errno("recv");
    }
    if (r == 0) throw ToolError("tcp recv: the peer closed the connection");
    data += r;
    n -= static_cast<std::size_t>(r);
  }
}

// Reads and discards `n` bytes with large reads.
void drain(int fd, std::vector<std::uint8_t>& buffer, std::uint64_t n) {
  while (n > 0) {
    const std::size_t want = static_cast<std::size_t>(std::min<std::uint64_t>(n, buffer.size()));
    const ssize_t r = ::recv(fd, buffer.data(), want, 0);
    if (r < 0) {
      if (errno == EINTR) continue;
      throw_errno("recv");
    }
    if (r == 0) throw ToolError("tcp recv: the peer closed the connection");
    n -= static_cast<std::uint64_t>(r);
  }
}

double micros(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

constexpr std::size_t kRequestSize = 16;

}  // namespace

Socket::~Socket() {
  if (fd_ >= 0) ::close(fd_);
}

Socket& Socket::operator=(Socket&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.release();
  }
  return *this;
}

Socket tcp_listen(const sockaddr_in& address) {
  Socket s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!s) throw_errno("socket");
  int one = 1;
  ::setsockopt(s.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(s.fd(), reinterpret_cast<const sockaddr*>(&address), sizeof address) != 0)
    throw_errno(fmt::format("bind {}", format_address(address)));
  if (::listen(s.fd(), 16) != 0) throw_errno("listen");
  return s;
}

std::uint16_t local_port(const Socket& socket) {
  sockaddr_in a{};
  socklen_t len = sizeof a;
  ::getsockname(socket.fd(), reinterpret_cast<sockaddr*>(&a), &len);
  return ntohs(a.sin_port);
}

Socket tcp_accept(const Socket& listener, std::chrono::milliseconds timeout) {
  pollfd pfd{listener.fd(), POLLIN, 0};
  const int ready = ::poll(&pfd, 1, static_cast<int>(timeout.count()));
  if (ready < 0) throw_errno("poll");
  if (ready == 0) throw ToolError(fmt::format("tcp accept: no connection within {} ms", timeout.count()));
  Socket s(::accept4(listener.fd(), nullptr, nullptr, SOCK_CLOEXEC));
  if (!s) throw_errno("accept");
  set_options(s.fd());
  return s;
}

Socket tcp_connect(const sockaddr_in& destination, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    Socket s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!s) throw_errno("socket");
    set_options(s.fd());
    if (::connect(s.fd(), reinterpret_cast<const sockaddr*>(&destination), sizeof destination) == 0) return s;
    // The server may still be finishing the peercm half: retry a refused connect briefly.
    if (errno != ECONNREFUSED || Clock::now() >= deadline)
      throw_errno(fmt::format("connect {}", format_address(destination)));
    ::usleep(20000);
  }
}

Measurement tcp_client(Socket& socket, const PerfParams& p, TcpWait wait) {
  const int fd = socket.fd();
  Measurement m;
  std::vector<std::uint8_t> buffer(std::max<std::size_t>(p.size, 1 << 20), 0xA5);
  std::uint8_t request[kRequestSize] = {1};
  if (p.mode == PerfMode::lat) {
    m.samples.reserve(p.iters);
    for (std::uint64_t i = 0; i < p.warmup + p.iters; ++i) {
      const auto t0 = Clock::now();
      if (p.op == PerfOp::read) {
        write_all(fd, request, sizeof request);
        read_all(fd, buffer.data(), p.size, wait);
      } else {
        write_all(fd, buffer.data(), p.size);
        read_all(fd, buffer.data(), p.size, wait);
      }
      const double us = micros(Clock::now() - t0);
      if (i >= p.warmup) m.samples.push_back(p.op == PerfOp::read ? us : us / 2);
    }
    return m;
  }
  // The warm-up messages, then the measured ones; each batch ends with a round trip, so the
  // clock starts with nothing in flight (as the peercm run's does).
  const auto batch = [&](std::uint64_t messages) {
    if (p.op == PerfOp::read) {
      write_all(fd, request, 1);
      drain(fd, buffer, messages * p.size);
    } else {
      for (std::uint64_t i = 0; i < messages; ++i) write_all(fd, buffer.data(), p.size);
      read_all(fd, request, 1);  // the server has everything
    }
  };
  if (p.warmup > 0) batch(p.warmup);
  const std::uint64_t total = p.iters * p.size;
  const auto t0 = Clock::now();
  batch(p.iters);
  m.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  m.bytes = total;
  return m;
}

void tcp_server(Socket& socket, const PerfParams& p, TcpWait wait) {
  const int fd = socket.fd();
  std::vector<std::uint8_t> buffer(std::max<std::size_t>(p.size, 1 << 20), 0x5A);
  std::uint8_t request[kRequestSize] = {};
  if (p.mode == PerfMode::lat) {
    for (std::uint64_t i = 0; i < p.warmup + p.iters; ++i) {
      read_all(fd, p.op == PerfOp::read ? request : buffer.data(), p.op == PerfOp::read ? sizeof request : p.size,
               wait);
      write_all(fd, buffer.data(), p.size);
    }
  } else {
    for (const std::uint64_t messages : {std::uint64_t{p.warmup}, p.iters}) {
      if (messages == 0) continue;
      if (p.op == PerfOp::read) {
        read_all(fd, request, 1);
        for (std::uint64_t i = 0; i < messages; ++i) write_all(fd, buffer.data(), p.size);
      } else {
        drain(fd, buffer, messages * p.size);
        write_all(fd, request, 1);
      }
    }
  }
  // Wait for the client to close first so that nothing is cut off by a reset.
  std::uint8_t byte;
  [[maybe_unused]] const ssize_t r = ::recv(fd, &byte, 1, 0);
}

}  // namespace peercm::tool
