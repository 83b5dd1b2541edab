// CRC-32C (Castagnoli) as MPA uses it (RFC 5044 §4.4, iSCSI's digest), computed by ISA-L.
#pragma once

#include <cstdint>
#include <span>

namespace peercm::wire {

// Incremental CRC-32C: feed any split of the input, then finish(); the value equals
// crc32c() of the concatenation.
class Crc32c {
 public:
  void update(std::span<const std::uint8_t> bytes);
  std::uint32_t finish() const { return ~register_; }
  void reset() { register_ = 0xFFFFFFFFu; }

 private:
  // ISA-L's crc32_iscsi takes and returns the un-inverted register; the standard value
  // is its bitwise complement (checked against RFC 3720 B.4 vectors in the tests).
  std::uint32_t register_ = 0xFFFFFFFFu;
};

std::uint32_t crc32c(std::span<const std::uint8_t> bytes);

}  // namespace peercm::wire
