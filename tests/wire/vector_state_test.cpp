// The CRC wrappers leave no dirty upper vector halves behind (wire/vector_state.hpp).
#include "wire/vector_state.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "wire/crc32c.hpp"
#include "wire/roce/icrc.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace peercm::wire {
namespace {

// XINUSE (XGETBV with ECX = 1, Intel SDM vol. 1 §13.6): the register states that are not in
// their initial configuration. nullopt where the CPU cannot tell.
std::optional<std::uint64_t> state_components_in_use() {
#if defined(__x86_64__) || defined(__i386__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d) || (c & bit_OSXSAVE) == 0) return std::nullopt;
  if (!__get_cpuid_count(0xD, 1, &a, &b, &c, &d) || (a & (1u << 2)) == 0) return std::nullopt;
  std::uint32_t low = 0, high = 0;
  asm volatile("xgetbv" : "=a"(low), "=d"(high) : "c"(1));
  return (std::uint64_t{high} << 32) | low;
#else
  return std::nullopt;
#endif
}

// YMM_Hi128 (bits 255:128 of registers 0-15) and ZMM_Hi256 (bits 511:256 of registers 0-15):
// the halves a legacy-SSE instruction would have to merge with.
constexpr std::uint64_t kUpperHalves = (1u << 2) | (1u << 6);

const std::vector<std::uint8_t> kFourKiB(4096, 0x5A);

TEST(VectorState, Crc32cLeavesTheUpperHalvesClean) {
  const std::uint32_t crc = crc32c(kFourKiB);
  const auto in_use = state_components_in_use();
  if (!in_use) GTEST_SKIP() << "this CPU does not report XINUSE";
  EXPECT_EQ(*in_use & kUpperHalves, 0u);
  EXPECT_NE(crc, 0u);
}

TEST(VectorState, EthernetCrcLeavesTheUpperHalvesClean) {
  const std::uint32_t crc = roce::crc32_ethernet(kFourKiB);
  const auto in_use = state_components_in_use();
  if (!in_use) GTEST_SKIP() << "this CPU does not report XINUSE";
  EXPECT_EQ(*in_use & kUpperHalves, 0u);
  EXPECT_NE(crc, 0u);
}

}  // namespace
}  // namespace peercm::wire
