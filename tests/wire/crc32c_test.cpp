#include "wire/crc32c.hpp"

#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <numeric>
#include <string_view>
#include <vector>

namespace peercm::wire {
namespace {

std::vector<std::uint8_t> filled(std::size_t n, std::uint8_t value) { return std::vector<std::uint8_t>(n, value); }

// RFC 3720 Appendix B.4 vectors, which MPA's CRC (RFC 5044 §4.4) inherits.
TEST(Crc32c, ThirtyTwoZeroBytes) { EXPECT_EQ(crc32c(filled(32, 0x00)), 0x8A9136AAu); }
TEST(Crc32c, ThirtyTwoOnesBytes) { EXPECT_EQ(crc32c(filled(32, 0xFF)), 0x62A8AB43u); }

TEST(Crc32c, IncreasingBytes) {
  std::vector<std::uint8_t> bytes(32);
  std::iota(bytes.begin(), bytes.end(), std::uint8_t{0});
  EXPECT_EQ(crc32c(bytes), 0x46DD794Eu);
}

TEST(Crc32c, DecreasingBytes) {
  std::vector<std::uint8_t> bytes(32);
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<std::uint8_t>(31 - i);
  EXPECT_EQ(crc32c(bytes), 0x113FDB5Cu);
}

TEST(Crc32c, StandardCheckValue) {
  constexpr std::string_view text = "123456789";
  std::vector<std::uint8_t> bytes(text.begin(), text.end());
  EXPECT_EQ(crc32c(bytes), 0xE3069283u);
}

TEST(Crc32c, IncrementalEqualsOneShotForEverySplit) {
  std::vector<std::uint8_t> bytes(97);
  std::iota(bytes.begin(), bytes.end(), std::uint8_t{3});
  const std::uint32_t whole = crc32c(bytes);
  for (std::size_t split = 0; split <= bytes.size(); ++split) {
    Crc32c crc;
    crc.update(std::span(bytes).first(split));
    crc.update(std::span(bytes).subspan(split));
    EXPECT_EQ(crc.finish(), whole) << "split at " << split;
  }
}

TEST(Crc32c, EmptyInputIsZero) { EXPECT_EQ(crc32c({}), 0u); }

}  // namespace
}  // namespace peercm::wire
