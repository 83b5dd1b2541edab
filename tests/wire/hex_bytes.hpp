// Byte strings written as hex in the wire tests (RFC and wire-sheet vectors).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <string_view>
#include <vector>

#include "hex_parse.hpp"

namespace peercm::wire::test {

using Bytes = std::vector<std::uint8_t>;

// Hex digits; spaces, '|' and other separators are ignored.
inline Bytes hex(std::string_view text) {
  bool odd = false;
  Bytes out = parse_hex(text, &odd);
  EXPECT_FALSE(odd) << "odd number of hex digits in " << text;
  return out;
}

}  // namespace peercm::wire::test
