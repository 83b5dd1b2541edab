// The plain-TCP baseline of `peercm perf`: the same traffic pattern over a blocking
// TCP_NODELAY socket, so that peercm's numbers can be read as a ratio to the kernel's.
//   lat send/write: ping-pong of `size` bytes, one-way = RTT/2.
//   lat read:       a 16-byte request answered by `size` bytes, full round trip.
//   bw send/write:  the client streams `iters` writes of `size` bytes, the server acks the end.
//   bw read:        the server streams `iters` x `size` bytes after a 1-byte request.
#pragma once

#include <netinet/in.h>

#include <chrono>

#include "perf_common.hpp"

namespace peercm::tool {

// An owned socket descriptor.
class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket();
  Socket(Socket&& other) noexcept : fd_(other.release()) {}
  Socket& operator=(Socket&& other) noexcept;
  int fd() const { return fd_; }
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }
  explicit operator bool() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

Socket tcp_listen(const sockaddr_in& address);
std::uint16_t local_port(const Socket& socket);
// Waits at most `timeout` for a connection.
Socket tcp_accept(const Socket& listener, std::chrono::milliseconds timeout = kWaitTimeout);
Socket tcp_connect(const sockaddr_in& destination, std::chrono::milliseconds timeout = kWaitTimeout);

// How a receiving end waits for data: in a blocking recv() (the baseline), or by calling
// recv(MSG_DONTWAIT) in a loop, as a busy-polling stack finds its data (the latency floor of
// any stack over TCP sockets).
enum class TcpWait { block, spin };

Measurement tcp_client(Socket& socket, const PerfParams& params, TcpWait wait = TcpWait::block);
void tcp_server(Socket& socket, const PerfParams& params, TcpWait wait = TcpWait::block);

}  // namespace peercm::tool
