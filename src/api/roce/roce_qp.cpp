#include "api/roce/roce_qp.hpp"

#include <arpa/inet.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

#include "engine/kernel_random.hpp"

namespace peercm::detail::roce {

namespace {

// A datagram must never fragment (PMTU + 47 bytes is what RC sends, roce-wire.md).
void forbid_fragments(int fd) {
  int mode = IP_PMTUDISC_DO;
  ::setsockopt(fd, IPPROTO_IP, IP_MTU_DISCOVER, &mode, sizeof mode);
}

// Linux picks RoCE source ports from 0xC000-0xFFFF (wire sheet §1); a few random tries
// there, then any free port: entropy is all that matters.
Result<std::uint16_t, std::errc> bind_source_port(int fd, std::uint32_t local_address) {
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(local_address);
  bool bound = false;
  for (int attempt = 0; attempt < 8 && !bound; ++attempt) {
    address.sin_port = htons(static_cast<std::uint16_t>(0xC000 | (engine::kernel_random_u32() & 0x3FFF)));
    bound = ::bind(fd, reinterpret_cast<const sockaddr*>(&address), sizeof address) == 0;
  }
  if (!bound) {
    address.sin_port = 0;
    if (::bind(fd, reinterpret_cast<const sockaddr*>(&address), sizeof address) != 0)
      return fail(static_cast<std::errc>(errno));
  }
  socklen_t length = sizeof address;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  return ntohs(address.sin_port);
}

}  // namespace

RoceQp::RoceQp(const core::roce::RcQpConfig& config, core::MemoryTable& memory, core::CompletionSink& send_cq,
               core::CompletionSink& recv_cq)
    : rc(config, memory, send_cq, recv_cq) {}

RoceQp::~RoceQp() {
  if (send_fd >= 0) ::close(send_fd);
}

Result<std::unique_ptr<RoceQp>, std::errc> RoceQp::open(const core::roce::RcQpConfig& config,
                                                        core::MemoryTable& memory, core::CompletionSink& send_cq,
                                                        core::CompletionSink& recv_cq, std::uint32_t qpn,
                                                        std::uint32_t local_address) {
  auto qp = std::make_unique<RoceQp>(config, memory, send_cq, recv_cq);
  qp->qpn = qpn;
  qp->local_address = local_address;
  qp->send_fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (qp->send_fd < 0) return fail(static_cast<std::errc>(errno));
  forbid_fragments(qp->send_fd);
  // ICMP errors for our packets wait in the socket's error queue (RoceDevice reads it when
  // the QP's timer fires; docs/reliability.md, "Dead peers").
  int on = 1;
  ::setsockopt(qp->send_fd, IPPROTO_IP, IP_RECVERR, &on, sizeof on);
  int buffer = 4 << 20;
  if (::setsockopt(qp->send_fd, SOL_SOCKET, SO_SNDBUFFORCE, &buffer, sizeof buffer) != 0)
    ::setsockopt(qp->send_fd, SOL_SOCKET, SO_SNDBUF, &buffer, sizeof buffer);
  auto port = bind_source_port(qp->send_fd, local_address);
  if (!port) return fail(port.error());
  qp->source_port = *port;
  return qp;
}

RoceUdQp::~RoceUdQp() {
  if (send_fd >= 0) ::close(send_fd);
}

Status<std::errc> RoceUdQp::send_from(std::uint32_t address) {
  if (send_fd >= 0) {
    if (address != local_address) return fail(std::errc::invalid_argument);
    return {};
  }
  const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return fail(static_cast<std::errc>(errno));
  forbid_fragments(fd);
  auto port = bind_source_port(fd, address);
  if (!port) {
    ::close(fd);
    return fail(port.error());
  }
  send_fd = fd;
  local_address = address;
  ud.set_udp_source_port(*port);
  return {};
}

RoceUcQp::~RoceUcQp() {
  if (send_fd >= 0) ::close(send_fd);
}

Result<std::uint16_t, std::errc> RoceUcQp::open_socket(std::uint32_t address) {
  if (send_fd >= 0) return fail(std::errc::invalid_argument);
  const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return fail(static_cast<std::errc>(errno));
  forbid_fragments(fd);
  int buffer = 4 << 20;
  if (::setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &buffer, sizeof buffer) != 0)
    ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buffer, sizeof buffer);
  auto port = bind_source_port(fd, address);
  if (!port) {
    ::close(fd);
    return fail(port.error());
  }
  send_fd = fd;
  local_address = address;
  return *port;
}

}  // namespace peercm::detail::roce
