// Registered memory as the queue-pair engine touches it: verbs addresses are virtual
// addresses of this process, checked against the MemoryTable before any use.
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>

namespace peercm::core::detail {

inline std::uint8_t* memory_at(std::uint64_t addr) {
  return reinterpret_cast<std::uint8_t*>(static_cast<std::uintptr_t>(addr));
}

inline iovec make_iovec(const void* base, std::size_t length) {
  return iovec{const_cast<void*>(base), length};
}

}  // namespace peercm::core::detail
