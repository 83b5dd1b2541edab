// What the socket micro-benchmarks share: a connected loopback TCP pair and memory whose
// pages are already faulted in (a first touch inside a timed copy would be measured too).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace peercm::bench {

struct LoopbackPair {
  int listener = -1;
  int sender = -1;
  int receiver = -1;

  void close_all() const {
    ::close(sender);
    ::close(receiver);
    ::close(listener);
  }
};

// buffer_size > 0 fixes the sender's SO_SNDBUF (before it connects) and the receiver's SO_RCVBUF;
// 0 leaves both to the kernel's autotuning. Exits with a message if loopback cannot connect.
inline LoopbackPair connect_loopback_pair(int buffer_size = 0) {
  LoopbackPair pair;
  pair.listener = ::socket(AF_INET, SOCK_STREAM, 0);
  pair.sender = ::socket(AF_INET, SOCK_STREAM, 0);
  if (buffer_size > 0) ::setsockopt(pair.sender, SOL_SOCKET, SO_SNDBUF, &buffer_size, sizeof buffer_size);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof address;
  if (::bind(pair.listener, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
      ::listen(pair.listener, 1) != 0 ||
      ::getsockname(pair.listener, reinterpret_cast<sockaddr*>(&address), &length) != 0 ||
      ::connect(pair.sender, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
      (pair.receiver = ::accept(pair.listener, nullptr, nullptr)) < 0) {
    std::perror("loopback connection");
    std::exit(1);
  }
  if (buffer_size > 0) ::setsockopt(pair.receiver, SOL_SOCKET, SO_RCVBUF, &buffer_size, sizeof buffer_size);
  return pair;
}

inline std::uint8_t* touched_area(std::size_t size) {
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    std::perror("mmap");
    std::exit(1);
  }
  std::memset(p, 1, size);
  return static_cast<std::uint8_t*>(p);
}

}  // namespace peercm::bench
