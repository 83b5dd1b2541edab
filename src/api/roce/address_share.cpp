#include "api/roce/address_share.hpp"

#include <fmt/core.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "wire/ibcm/gsi.hpp"
#include "wire/roce/bth.hpp"
#include "wire/roce/ext_headers.hpp"

namespace peercm::detail::roce {

namespace {

// The abstract address of `name` (a leading NUL, no file), and its length.
socklen_t abstract_address(const std::string& name, sockaddr_un& out) {
  out = sockaddr_un{};
  out.sun_family = AF_UNIX;
  const std::size_t length = std::min(name.size(), sizeof out.sun_path - 1);
  std::memcpy(out.sun_path + 1, name.data(), length);
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + length);
}

std::string address_text(std::uint32_t address) {
  return fmt::format("{}.{}.{}.{}", address >> 24, (address >> 16) & 0xFF, (address >> 8) & 0xFF, address & 0xFF);
}

std::uint32_t be32(const std::uint8_t* bytes) {
  return std::uint32_t{bytes[0]} << 24 | std::uint32_t{bytes[1]} << 16 | std::uint32_t{bytes[2]} << 8 | bytes[3];
}

}  // namespace

// The names carry the user: SO_REUSEPORT groups only sockets of one user, so users never share
// an address, and one user's contexts must not use up another's slots.
std::string slot_name(int slot) { return fmt::format("peercm-roce/{}/slot/{}", ::getuid(), slot); }

std::string slot_name(std::uint32_t address, int slot) {
  return fmt::format("peercm-roce/{}/{}/slot/{}", ::getuid(), address_text(address), slot);
}

std::string service_name(std::uint32_t address, std::uint16_t service) {
  return fmt::format("peercm-roce/{}/{}/port/{}", ::getuid(), address_text(address), service);
}

int listen_on_name(const std::string& name, std::errc& error, bool listening) {
  const int fd = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    error = static_cast<std::errc>(errno);
    return -1;
  }
  sockaddr_un address;
  const socklen_t length = abstract_address(name, address);
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&address), length) != 0 ||
      (listening && ::listen(fd, SOMAXCONN) != 0)) {
    error = static_cast<std::errc>(errno);
    ::close(fd);
    return -1;
  }
  return fd;
}

std::optional<SlotClaim> claim_slot() {
  // The first free slot wins; two contexts racing for one are ordered by bind().
  for (int slot = 0; slot < kSlots; ++slot) {
    std::errc error{};
    const int fd = listen_on_name(slot_name(slot), error);
    if (fd >= 0) return SlotClaim{.slot = slot, .listen_fd = fd};
    if (error != std::errc::address_in_use) return std::nullopt;
  }
  return std::nullopt;
}

Route route_of(std::span<const std::uint8_t> datagram) {
  if (datagram.size() < wire::roce::kBthSize) return {};
  const std::uint32_t destination_qp = be32(datagram.data() + 4) & 0xFFFFFF;
  if (destination_qp != wire::ibcm::kGsiQpn) return Route{.kind = Route::Kind::slot, .slot = slot_of_qpn(destination_qp)};
  // BTH, DETH, then the MAD: its common header (24 bytes: management class at byte 1,
  // attribute ID at 16-17), then the CM message (IB spec §12.6).
  constexpr std::size_t kMad = wire::roce::kBthSize + wire::roce::kDethSize;
  constexpr std::size_t kData = kMad + 24;
  if (datagram.size() < kData + 16) return {};
  const std::uint8_t* mad = datagram.data() + kMad;
  constexpr std::uint8_t kCmClass = 0x07;
  if (mad[1] != kCmClass) return {};
  const std::uint8_t* data = datagram.data() + kData;
  const std::uint16_t attribute = static_cast<std::uint16_t>(mad[16] << 8 | mad[17]);
  switch (attribute) {
    case 0x0010:  // REQ: Local Comm ID, reserved, Service ID (bytes 8-15)
    case 0x0017:  // SIDR_REQ: Request ID, P_Key, reserved, Service ID (bytes 8-15)
      // rdma_cm's service IDs end in the port (0x0000000001060000 | port for TCP, ...).
      return Route{.kind = Route::Kind::service, .service = static_cast<std::uint16_t>(data[14] << 8 | data[15])};
    case 0x0011:  // MRA
    case 0x0012:  // REJ
    case 0x0013:  // REP
    case 0x0014:  // RTU
    case 0x0015:  // DREQ
    case 0x0016:  // DREP
    case 0x0019:  // LAP
    case 0x001A: {  // APR: Local Comm ID (the sender's), Remote Comm ID (ours)
      const std::uint32_t ours = be32(data + 4);
      if (ours == 0) return {};
      return Route{.kind = Route::Kind::slot, .slot = slot_of_comm_id(ours)};
    }
    case 0x0018:  // SIDR_REP: the Request ID we sent
      return Route{.kind = Route::Kind::slot, .slot = slot_of_comm_id(be32(data))};
    default: return {};
  }
}

Forwarder::~Forwarder() {
  for (const auto& [name, connection] : connections_) ::close(connection.fd);
}

int Forwarder::connect_to(const std::string& name) {
  const int fd = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  // A window of full-PMTU datagrams may be queued at once; the plain option is capped by
  // net.core.wmem_max.
  int buffer = 4 << 20;
  if (::setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &buffer, sizeof buffer) != 0)
    ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buffer, sizeof buffer);
  sockaddr_un address;
  const socklen_t length = abstract_address(name, address);
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&address), length) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

bool Forwarder::queue(const std::string& name, const ForwardHeader& header, std::span<const std::uint8_t> bytes) {
  auto found = connections_.find(name);
  if (found == connections_.end()) {
    const int fd = connect_to(name);
    if (fd < 0) return false;
    found = connections_.emplace(name, Connection{.fd = fd}).first;
  }
  Connection& connection = found->second;
  ForwardHeader framed = header;
  framed.length = static_cast<std::uint32_t>(bytes.size());
  const std::size_t record = sizeof framed + bytes.size();
  const std::size_t offset = connection.arena.size();
  const auto* head = reinterpret_cast<const std::uint8_t*>(&framed);
  connection.arena.insert(connection.arena.end(), head, head + sizeof framed);
  connection.arena.insert(connection.arena.end(), bytes.begin(), bytes.end());
  // Appended to the last message while it has room: the records are contiguous in the arena.
  if (!connection.messages.empty() && connection.messages.back().second + record <= kMaxForwardMessage) {
    connection.messages.back().second += record;
  } else {
    connection.messages.emplace_back(offset, record);
  }
  return true;
}

void Forwarder::flush(std::uint64_t& dropped_full, std::uint64_t& dropped_no_owner) {
  for (auto it = connections_.begin(); it != connections_.end();) {
    Connection& connection = it->second;
    std::size_t next = 0;
    bool reconnected = false;
    while (next < connection.messages.size()) {
      const std::size_t count = connection.messages.size() - next;
      headers_.assign(count, mmsghdr{});
      pieces_.resize(count);
      for (std::size_t i = 0; i < count; ++i) {
        const auto [offset, size] = connection.messages[next + i];
        pieces_[i] = iovec{connection.arena.data() + offset, size};
        headers_[i].msg_hdr.msg_iov = &pieces_[i];
        headers_[i].msg_hdr.msg_iovlen = 1;
      }
      const int sent = ::sendmmsg(connection.fd, headers_.data(), static_cast<unsigned>(count),
                                  MSG_DONTWAIT | MSG_NOSIGNAL);
      if (sent > 0) {
        next += static_cast<std::size_t>(sent);
        continue;
      }
      if (sent < 0 && errno == EINTR) continue;
      if (sent < 0 && (errno == EAGAIN || errno == ENOBUFS)) {
        dropped_full += connection.messages.size() - next;  // messages, each of one or more datagrams
        break;
      }
      // The owner went away; a process that took its name since gets the rest.
      ::close(connection.fd);
      connection.fd = reconnected ? -1 : connect_to(it->first);
      reconnected = true;
      if (connection.fd < 0) {
        dropped_no_owner += connection.messages.size() - next;
        break;
      }
    }
    connection.arena.clear();
    connection.messages.clear();
    if (connection.fd < 0) {
      it = connections_.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace peercm::detail::roce
