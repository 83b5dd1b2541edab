#include "api/roce/fault_shim.hpp"

namespace peercm::detail::roce {

FaultShim::FaultShim(const RoceFaults& faults, UdpSender& sender)
    : faults_(faults),
      sender_(sender),
      active_(faults.drop > 0 || faults.duplicate > 0 || faults.reorder > 0),
      random_(faults.seed) {}

bool FaultShim::roll(double probability) {
  if (probability <= 0) return false;
  return std::uniform_real_distribution<double>(0.0, 1.0)(random_) < probability;
}

void FaultShim::send(int fd, const sockaddr_in& to, std::span<const iovec> pieces, bool alone) {
  if (!active_) {
    sender_.add(fd, to, pieces, alone);
    return;
  }
  if (roll(faults_.drop)) return;
  if (!held_ && roll(faults_.reorder)) {
    Held held{.fd = fd, .to = to, .bytes = {}, .alone = alone};
    for (const iovec& piece : pieces) {
      const auto* bytes = static_cast<const std::uint8_t*>(piece.iov_base);
      held.bytes.insert(held.bytes.end(), bytes, bytes + piece.iov_len);
    }
    held_ = std::move(held);
    return;
  }
  sender_.add(fd, to, pieces, alone);
  if (roll(faults_.duplicate)) sender_.add(fd, to, pieces, alone);
  release_held();
}

void FaultShim::release_held() {
  if (!held_) return;
  Held held = std::move(*held_);
  held_.reset();
  const iovec piece{held.bytes.data(), held.bytes.size()};
  sender_.add(held.fd, held.to, std::span(&piece, 1), held.alone);
}

}  // namespace peercm::detail::roce
