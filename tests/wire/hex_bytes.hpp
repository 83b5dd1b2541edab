// Byte strings written as hex in the wire tests (RFC and wire-sheet vectors).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <string_view>
#include <vector>

namespace peercm::wire::test {

using Bytes = std::vector<std::uint8_t>;

// Hex digits; spaces, '|' and other separators are ignored.
inline Bytes hex(std::string_view text) {
  Bytes out;
  int high = -1;
  for (const char c : text) {
    int digit = 0;
    if (c >= '0' && c <= '9') {
      digit = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      digit = c - 'a' + 10;
    } else if (c >= 'A' && c <= 'F') {
      digit = c - 'A' + 10;
    } else {
      continue;
    }
    if (high < 0) {
      high = digit;
    } else {
      out.push_back(static_cast<std::uint8_t>((high << 4) | digit));
      high = -1;
    }
  }
  EXPECT_LT(high, 0) << "odd number of hex digits in " << text;
  return out;
}

}  // namespace peercm::wire::test
