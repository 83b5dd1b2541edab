// A hand-driven peer for the API tests: plain TCP sockets plus the wire codecs, so a test
// can play a misbehaving or old-revision peer byte by byte.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <optional>
#include <vector>

#include "wire/cm_header.hpp"
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

  // CLOEXEC: a helper process spawned meanwhile must not hold the connection open.
  // From `source` (host order; 0: the kernel's choice) to 127.0.0.1:`port`.
  static RawSocket connect_to(std::uint16_t port, std::uint32_t source = 0) {
    RawSocket s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (source != 0) {
      sockaddr_in from{};
      from.sin_family = AF_INET;
      from.sin_addr.s_addr = htonl(source);
      if (::bind(s.fd_, reinterpret_cast<sockaddr*>(&from), sizeof from) != 0) s.reset();
    }
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (s.fd_ >= 0 && ::connect(s.fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) s.reset();
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

  // Closes with an RST instead of a FIN, as a crashed host's stack would.
  void abort() {
    if (fd_ < 0) return;
    linger hard{1, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_LINGER, &hard, sizeof hard);
    reset();
  }

  // Exactly `n` bytes, or fewer when the timeout passes or EOF comes first.
  std::vector<std::uint8_t> read_exact(std::size_t n, std::chrono::milliseconds timeout, bool* eof = nullptr) {
    std::vector<std::uint8_t> out(n);
    std::size_t filled = 0;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    if (eof) *eof = false;
    while (filled < n) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) break;
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) break;
      const ssize_t got = ::recv(fd_, out.data() + filled, n - filled, 0);
      if (got <= 0) {
        if (eof) *eof = true;
        break;
      }
      filled += static_cast<std::size_t>(got);
    }
    out.resize(filled);
    return out;
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
  // `backlog` 0: the kernel's accept queue holds one connection, and drops later SYNs.
  explicit RawListener(int backlog = 16) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a);
    ::listen(fd_, backlog);
    socklen_t len = sizeof a;
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
  }
  ~RawListener() { ::close(fd_); }
  std::uint16_t port() const { return port_; }
  RawSocket accept_one(std::chrono::milliseconds timeout) {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(timeout.count())) <= 0) return RawSocket();
    return RawSocket(::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC));
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

// A client/server MPA Request (Rev 2 with the IRD/ORD block, no RTR), as an RFC 6581 peer
// without peer-to-peer mode sends it.
inline std::vector<std::uint8_t> mpa_request_bytes(bool crc, std::span<const std::uint8_t> private_data = {}) {
  return mpa_bytes(wire::MpaFrame{.kind = wire::MpaFrameKind::request,
                                  .crc = crc,
                                  .revision = 2,
                                  .enhanced = wire::IrdOrdBlock{.ird = 16, .ord = 16},
                                  .private_data = private_data});
}

// A p2p MPA Request as another peercm node sends it: CRC on, RFC 6581 peer-to-peer mode with a
// Write RTR offered, and the CM header (docs/p2p.md R1) naming the sender.
inline std::vector<std::uint8_t> p2p_request_bytes(const wire::CmHeader& header) {
  std::array<std::uint8_t, wire::kCmHeaderSize> encoded{};
  if (!wire::encode_cm_header(header, encoded)) return {};
  return mpa_bytes(wire::MpaFrame{
      .kind = wire::MpaFrameKind::request,
      .crc = true,
      .revision = 2,
      .enhanced = wire::IrdOrdBlock{.peer_to_peer = true, .write_rtr = true, .ird = 16, .ord = 16},
      .private_data = encoded});
}

// One whole MPA frame (header, then PD_Length bytes); empty when it does not come in time.
inline std::vector<std::uint8_t> read_mpa_frame(RawSocket& socket, std::chrono::milliseconds timeout) {
  auto frame = socket.read_exact(wire::kMpaFrameHeaderSize, timeout);
  if (frame.size() < wire::kMpaFrameHeaderSize) return {};
  const std::size_t pd_length = (std::size_t{frame[18]} << 8) | frame[19];
  const auto private_data = socket.read_exact(pd_length, timeout);
  if (private_data.size() < pd_length) return {};
  frame.insert(frame.end(), private_data.begin(), private_data.end());
  return frame;
}

// Decodes every complete FPDU in `bytes`; returns the segment headers.
inline std::vector<wire::SegmentHeader> decode_fpdus(std::span<const std::uint8_t> bytes, bool crc) {
  std::vector<wire::SegmentHeader> headers;
  wire::FpduStreamDecoder decoder(crc);
  while (!bytes.empty()) {
    std::size_t used = 0;
    auto event = decoder.next(bytes, used);
    bytes = bytes.subspan(used);
    if (event.kind == wire::FpduEvent::Kind::header) headers.push_back(*event.header);
    if (event.kind == wire::FpduEvent::Kind::error || (used == 0 && event.kind == wire::FpduEvent::Kind::need_more))
      break;
  }
  return headers;
}

// What a peer sent until it closed, read FPDU by FPDU from the raw bytes (not through the
// decoder under test): the RDMAP opcodes in order and, for the first Terminate, its
// Terminate Control bytes (RFC 5040 §4.8: Layer<<4 | EType, Error Code, HdrCt) and the
// headers it copied.
struct PeerStream {
  std::vector<std::uint8_t> opcodes;
  bool terminate = false;
  std::array<std::uint8_t, 3> terminate_control{};
  std::vector<std::uint8_t> terminate_body;  // from the Terminate Control field to the ULPDU's end
  bool well_formed = true;                   // every byte belonged to a whole FPDU
};

inline PeerStream parse_peer_stream(std::span<const std::uint8_t> bytes) {
  PeerStream out;
  while (!bytes.empty()) {
    if (bytes.size() < wire::kUlpduLengthSize + 2) {
      out.well_formed = false;
      break;
    }
    const std::size_t ulpdu_length = (std::size_t{bytes[0]} << 8) | bytes[1];
    const std::size_t size = wire::fpdu_wire_size(ulpdu_length);
    if (bytes.size() < size || ulpdu_length < 2) {
      out.well_formed = false;
      break;
    }
    const auto ulpdu = bytes.subspan(wire::kUlpduLengthSize, ulpdu_length);
    const std::uint8_t opcode = ulpdu[1] & 0x0F;
    out.opcodes.push_back(opcode);
    constexpr std::size_t kControlAt = wire::kUntaggedHeaderSize;
    if (opcode == static_cast<std::uint8_t>(wire::RdmapOpcode::terminate) && !out.terminate &&
        ulpdu.size() >= kControlAt + 3) {
      out.terminate = true;
      out.terminate_control = {ulpdu[kControlAt], ulpdu[kControlAt + 1], ulpdu[kControlAt + 2]};
      out.terminate_body.assign(ulpdu.begin() + kControlAt, ulpdu.end());
    }
    bytes = bytes.subspan(size);
  }
  return out;
}

}  // namespace peercm::test
