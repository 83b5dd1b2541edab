// The CRC wrappers leave no dirty upper vector halves behind (wire/vector_state.hpp).
#include "wire/vector_state.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <span>
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

// 4 KiB: ISA-L's AVX-512 kernels take inputs of 256 bytes and more.
std::vector<std::uint8_t> four_kib() {
  std::vector<std::uint8_t> bytes(4096);
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<std::uint8_t>(i * 7 + 1);
  return bytes;
}
constexpr std::size_t kSmallPiece = 64;  // below that size: the reference, computed first

TEST(VectorState, Crc32cLeavesTheUpperHalvesClean) {
  const auto bytes = four_kib();
  Crc32c piecewise;
  for (std::size_t at = 0; at < bytes.size(); at += kSmallPiece)
    piecewise.update(std::span(bytes).subspan(at, kSmallPiece));
  const std::uint32_t whole = crc32c(bytes);
  const auto in_use = state_components_in_use();
  EXPECT_EQ(whole, piecewise.finish());
  if (!in_use) GTEST_SKIP() << "this CPU does not report XINUSE";
  EXPECT_EQ(*in_use & kUpperHalves, 0u);
}

TEST(VectorState, EthernetCrcLeavesTheUpperHalvesClean) {
  const auto bytes = four_kib();
  std::uint32_t piecewise = 0;
  for (std::size_t at = 0; at < bytes.size(); at += kSmallPiece)
    piecewise = roce::crc32_ethernet(std::span(bytes).subspan(at, kSmallPiece), piecewise);
  const std::uint32_t whole = roce::crc32_ethernet(bytes);
  const auto in_use = state_components_in_use();
  EXPECT_EQ(whole, piecewise);
  if (!in_use) GTEST_SKIP() << "this CPU does not report XINUSE";
  EXPECT_EQ(*in_use & kUpperHalves, 0u);
}

}  // namespace
}  // namespace peercm::wire
