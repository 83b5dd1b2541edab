#include "api/port_reservation.hpp"

#include <arpa/inet.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

#include "api/cm_id_impl.hpp"
#include "api/roce/roce_cm.hpp"
#include "api/roce/roce_device.hpp"

namespace peercm::detail {
namespace {

// A TCP socket bound to `address`. Without SO_REUSEADDR first, so that the port conflicts with
// any socket holding it, another id's reservation among them; when that fails, a socket that
// allows sharing and does not listen (a connection in TIME_WAIT, one an earlier listener
// accepted) may be what holds it, and no id does: rdma_cm's port is free, so bind beside it.
Result<int, std::errc> tcp_reservation(sockaddr_in& address) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return fail(static_cast<std::errc>(errno));
  const auto* raw = reinterpret_cast<const sockaddr*>(&address);
  bool bound = ::bind(fd, raw, sizeof address) == 0;
  if (!bound && errno == EADDRINUSE && address.sin_port != 0) {
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    bound = ::bind(fd, raw, sizeof address) == 0;
  }
  socklen_t length = sizeof address;
  if (!bound || ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    const int error = errno;
    ::close(fd);
    return fail(static_cast<std::errc>(error));
  }
  return fd;
}

Status<std::errc> reserve_roce(CmIdImpl& impl, sockaddr_in& address) {
  roce::RoceDevice& device = roce::device_of(*impl.ctx);
  const roce::Ipv4 host = ntohl(address.sin_addr.s_addr);
  if (host != roce::RoceDevice::kAnyAddress) {
    if (auto opened = device.port(host); !opened) return fail(opened.error());
  }
  auto service = device.reserve_service(host, ntohs(address.sin_port));
  if (!service) return fail(service.error());
  address.sin_port = htons(*service);
  impl.roce_reserved_address = host;
  impl.roce_reserved_service = *service;
  return {};
}

Status<std::errc> bind_locked(CmIdImpl& impl, sockaddr_in address) {
  if (address.sin_family != AF_INET) return fail(std::errc::address_family_not_supported);
  if (impl.state != CmIdImpl::State::idle) return fail(std::errc::invalid_argument);
  if (impl.transport == Transport::roce) {
    if (auto reserved = reserve_roce(impl, address); !reserved) return reserved;
  } else {
    auto fd = tcp_reservation(address);
    if (!fd) return fail(fd.error());
    impl.reserved_fd = *fd;
  }
  impl.bound_address = address;
  impl.state = CmIdImpl::State::bound;
  return {};
}

// The source address the kernel's routes pick towards `destination` (a connected UDP socket
// tells it without sending anything).
Result<in_addr, std::errc> route_source(const sockaddr_in& destination) {
  const int probe = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (probe < 0) return fail(static_cast<std::errc>(errno));
  sockaddr_in local{};
  socklen_t length = sizeof local;
  const bool ok = ::connect(probe, reinterpret_cast<const sockaddr*>(&destination), sizeof destination) == 0 &&
                  ::getsockname(probe, reinterpret_cast<sockaddr*>(&local), &length) == 0;
  const int error = errno;
  ::close(probe);
  if (!ok) return fail(static_cast<std::errc>(error));
  return local.sin_addr;
}

}  // namespace

Status<std::errc> bind_reserving_port(CmId& id, const sockaddr_in& address) {
  CmIdImpl& impl = id.impl();
  std::lock_guard lock(impl.ctx->mutex);
  return bind_locked(impl, address);
}

Status<std::errc> bind_source_towards(CmId& id, const sockaddr_in& destination) {
  CmIdImpl& impl = id.impl();
  // resolve_addr() refuses these itself (ADDR_ERROR).
  if (impl.transport != Transport::iwarp || destination.sin_family != AF_INET || destination.sin_port == 0 ||
      destination.sin_addr.s_addr == htonl(INADDR_ANY))
    return {};
  std::lock_guard lock(impl.ctx->mutex);
  if (impl.state != CmIdImpl::State::idle) return {};  // bound already, or resolve_addr's to refuse
  auto source = route_source(destination);
  if (!source) return fail(source.error());
  return bind_locked(impl, sockaddr_in{.sin_family = AF_INET, .sin_port = 0, .sin_addr = *source, .sin_zero = {}});
}

}  // namespace peercm::detail
