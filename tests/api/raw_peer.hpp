// A hand-driven peer for the API tests: plain TCP sockets plus the wire codecs, so a test
// can play a misbehaving or old-revision peer byte by byte.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <vector>

#include "wire/fpdu.hpp"
#include "wire/mpa_frame.hpp"

namespace peercm::test {

class RawSocket {
 public:
  explicit RawSocket(int fd = -1) : fd_(fd) {}
  ~RawSocket() { reset(); }
  RawSocket(RawSocket&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  RawSocket& operator=(RawSocket&& o) noexcept {
    reset();
    fd_ = o.fd_;
    o.fd_ = -1;
    return *this;
  }
  void reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  int fd() const { return fd_; }

  static RawSocket connect_to(std::uint16_t port) {
    RawSocket s(::socket(AF_INET, SOCK_STREAM, 0));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(s.fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) s.reset();
    int one = 1;
    if (s.fd_ >= 0) ::setsockopt(s.fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return s;
  }

  bool send_all(std::span<const std::uint8_t> bytes) {
    while (!bytes.empty()) {
      const ssize_t n = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
      if (n <= 0) return false;
      bytes = bytes.subspan(static_cast<std::size_t>(n));
    }
    return true;
  }

  // Reads whatever arrives within `timeout`; stops early at EOF. `eof` tells whether it came.
  std::vector<std::uint8_t> read_for(std::chrono::milliseconds timeout, bool* eof = nullptr,
                                     std::size_t stop_after = SIZE_MAX) {
    std::vector<std::uint8_t> out;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    if (eof) *eof = false;
    while (out.size() < stop_after) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) break;
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) break;
      std::uint8_t buf[65536];
      const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) {
        if (eof) *eof = true;
        break;
      }
      out.insert(out.end(), buf, buf + n);
    }
    return out;
  }

 private:
  int fd_;
};

class RawListener {
 public:
  RawListener() {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a);
    ::listen(fd_, 16);
    socklen_t len = sizeof a;
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
  }
  ~RawListener() { ::close(fd_); }
  std::uint16_t port() const { return port_; }
  RawSocket accept_one(std::chrono::milliseconds timeout) {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(timeout.count())) <= 0) return RawSocket();
    return RawSocket(::accept(fd_, nullptr, nullptr));
  }

 private:
  int fd_;
  std::uint16_t port_ = 0;
};

inline std::vector<std::uint8_t> mpa_bytes(const wire::MpaFrame& frame) {
  std::vector<std::uint8_t> out(wire::kMpaMaxFrameSize);
  auto n = wire::encode_mpa_frame(frame, out);
  out.resize(n ? *n : 0);
  return out;
}

inline std::vector<std::uint8_t> fpdu_bytes(const wire::SegmentHeader& header, std::span<const std::uint8_t> payload,
                                            bool crc) {
  std::vector<std::uint8_t> out(wire::fpdu_wire_size(wire::kMaxSegmentHeaderSize + payload.size()));
  auto n = wire::encode_fpdu(header, payload, crc, out);
  out.resize(n ? *n : 0);
  return out;
}

// Decodes every complete FPDU in `bytes`; returns the segment headers.
inline std::vector<wire::SegmentHeader> decode_fpdus(std::span<const std::uint8_t> bytes, bool crc) {
  std::vector<wire::SegmentHeader> headers;
  wire::FpduStreamDecoder decoder(crc);
  while (!bytes.empty()) {
    std::size_t used = 0;
    auto event = decoder.next(bytes, used);
    bytes = bytes.subspan(used);
    if (event.kind == wire::FpduEvent::Kind::header) headers.push_back(event.header);
    if (event.kind == wire::FpduEvent::Kind::error || (used == 0 && event.kind == wire::FpduEvent::Kind::need_more))
      break;
  }
  return headers;
}

}  // namespace peercm::test
