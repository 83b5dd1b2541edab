#include "wire/crc32c.hpp"

#include <isa-l/crc.h>

#include <climits>

#include "wire/vector_state.hpp"

namespace peercm::wire {

void Crc32c::update(std::span<const std::uint8_t> bytes) {
  if (bytes.empty()) return;  // a framer's empty PAD: no kernel to leave
  // crc32_iscsi takes an int length and a non-const pointer it does not write through.
  auto* data = const_cast<std::uint8_t*>(bytes.data());
  std::size_t left = bytes.size();
  while (left > 0) {
    const int chunk = left > INT_MAX ? INT_MAX : static_cast<int>(left);
    register_ = crc32_iscsi(data, chunk, register_);
    data += chunk;
    left -= static_cast<std::size_t>(chunk);
  }
  leave_vector_kernel();
}

std::uint32_t crc32c(std::span<const std::uint8_t> bytes) {
  Crc32c crc;
  crc.update(bytes);
  return crc.finish();
}

}  // namespace peercm::wire
