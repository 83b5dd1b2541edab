#include "api/roce/fault_shim.hpp"

#include <sys/socket.h>

#include <cstring>

namespace peercm::detail::roce {

FaultShim::FaultShim(const RoceFaults& faults)
    : faults_(faults),
      active_(faults.drop > 0 || faults.duplicate > 0 || faults.reorder > 0),
      random_(faults.seed) {}

bool FaultShim::roll(double probability) {
  if (probability <= 0) return false;
  return std::uniform_real_distribution<double>(0.0, 1.0)(random_) < probability;
}

void FaultShim::transmit(int fd, const sockaddr_in& to, std::span<const iovec> pieces) {
  msghdr message{};
  message.msg_name = const_cast<sockaddr_in*>(&to);
  message.msg_namelen = sizeof to;
  message.msg_iov = const_cast<iovec*>(pieces.data());
  message.msg_iovlen = pieces.size();
  if (::sendmsg(fd, &message, MSG_DONTWAIT) < 0) ++send_failures_;
}

void FaultShim::send(int fd, const sockaddr_in& to, std::span<const iovec> pieces) {
  if (!active_) {
    transmit(fd, to, pieces);
    return;
  }
  if (roll(faults_.drop)) return;
  if (!held_ && roll(faults_.reorder)) {
    // The pieces point into registered memory that may change once the QP moves on: copy.
    Held held{.fd = fd, .to = to, .bytes = {}};
    for (const iovec& piece : pieces) {
      const auto* bytes = static_cast<const std::uint8_t*>(piece.iov_base);
      held.bytes.insert(held.bytes.end(), bytes, bytes + piece.iov_len);
    }
    held_ = std::move(held);
    return;
  }
  transmit(fd, to, pieces);
  if (roll(faults_.duplicate)) transmit(fd, to, pieces);
  release_held();
}

void FaultShim::release_held() {
  if (!held_) return;
  Held held = std::move(*held_);
  held_.reset();
  const iovec piece{held.bytes.data(), held.bytes.size()};
  transmit(held.fd, held.to, std::span(&piece, 1));
}

}  // namespace peercm::detail::roce
