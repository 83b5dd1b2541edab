#include "api/port_reservation.hpp"

#include <arpa/inet.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

#include "api/cm_id_impl.hpp"

namespace peercm::detail {
namespace {

Status<std::errc> bind_locked(CmIdImpl& impl, sockaddr_in address) {
  if (address.sin_family != AF_INET) return fail(std::errc::address_family_not_supported);
  if (impl.state != CmIdImpl::State::idle) return fail(std::errc::invalid_argument);
  if (auto reserved = impl.cm->reserve_port(impl, address); !reserved) return reserved;
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
  if (!impl.cm->binds_route_source() || destination.sin_family != AF_INET || destination.sin_port == 0 ||
      destination.sin_addr.s_addr == htonl(INADDR_ANY))
    return {};
  std::lock_guard lock(impl.ctx->mutex);
  if (impl.state != CmIdImpl::State::idle) return {};  // bound already, or resolve_addr's to refuse
  auto source = route_source(destination);
  if (!source) return fail(source.error());
  return bind_locked(impl, sockaddr_in{.sin_family = AF_INET, .sin_port = 0, .sin_addr = *source, .sin_zero = {}});
}

}  // namespace peercm::detail
