// One RoCEv2 datagram ready for the socket, in scatter-gather form: header bytes, payload
// pieces in registered memory, then pad and ICRC (roce-ibcm-wire.md §0).
#pragma once

#include <sys/uio.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "wire/roce/packet.hpp"

namespace peercm::core::roce {

struct RcDatagram {
  std::array<std::uint8_t, wire::roce::kMaxHeadersSize> header{};
  std::size_t header_size = 0;
  // Into registered memory, or into a WR's inline copy. Valid until the queue pair's next
  // input; the vector keeps its capacity from one datagram to the next.
  std::vector<iovec> payload;
  std::array<std::uint8_t, 3 + wire::roce::kIcrcSize> trailer{};  // zero pad (§2.3), ICRC (§1.4)
  std::size_t trailer_size = 0;

  std::size_t size() const {
    std::size_t n = header_size + trailer_size;
    for (const iovec& piece : payload) n += piece.iov_len;
    return n;
  }
};

}  // namespace peercm::core::roce
