// A message laid out over a scatter/gather list: the pieces of registered memory that hold
// its bytes [offset, offset + length). Used to gather request and response payloads and to
// scatter inbound ones. The SGEs were checked against the MemoryTable before any use.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>

#include "core/qp_memory.hpp"
#include "peercm/verbs_types.hpp"

namespace peercm::core::roce {

// Calls f(std::uint8_t* addr, std::size_t n) for each piece, in order. Returns false when the
// list holds fewer than offset + length bytes (nothing is visited then).
template <class F>
bool for_each_piece(std::span<const Sge> sges, std::uint64_t offset, std::uint64_t length, F&& f) {
  std::uint64_t total = 0;
  for (const Sge& sge : sges) total += sge.length;
  if (offset > total || length > total - offset) return false;
  for (const Sge& sge : sges) {
    if (length == 0) break;
    if (offset >= sge.length) {
      offset -= sge.length;
      continue;
    }
    const std::uint64_t n = std::min<std::uint64_t>(sge.length - offset, length);
    f(detail::memory_at(sge.addr + offset), static_cast<std::size_t>(n));
    length -= n;
    offset = 0;
  }
  return true;
}

}  // namespace peercm::core::roce
