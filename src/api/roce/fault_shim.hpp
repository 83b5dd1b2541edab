// The RoceFaults test hook: every datagram a context sends passes through here, and may be
// dropped, sent twice, or held back until the next one left (a lossy shim between contexts).
#pragma once

#include <netinet/in.h>
#include <sys/uio.h>

#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <vector>

#include "api/roce/udp_sender.hpp"
#include "peercm/verbs.hpp"

namespace peercm::detail::roce {

class FaultShim {
 public:
  // What passes the faults goes on to `sender`.
  FaultShim(const RoceFaults& faults, UdpSender& sender);

  // One datagram to `to` from socket `fd`; `alone` as UdpSender::add.
  void send(int fd, const sockaddr_in& to, std::span<const iovec> pieces, bool alone = false);
  // A datagram held back for reordering leaves now if nothing followed it: the end of each
  // round of sending, so a hold never turns into a loss (nor outlives its socket).
  void release_held();

 private:
  struct Held {
    int fd = -1;
    sockaddr_in to{};
    std::vector<std::uint8_t> bytes;
    bool alone = false;
  };

  bool roll(double probability);

  RoceFaults faults_;
  UdpSender& sender_;
  bool active_;
  std::mt19937_64 random_;
  std::optional<Held> held_;
};

}  // namespace peercm::detail::roce
