// Hex text to bytes, free of any test framework (shared by the wire tests and the fuzz seed
// generator).
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace peercm::wire::test {

// Hex digits; spaces, '|' and other separators are ignored. `odd_digits` (if given) tells
// whether a digit was left over.
inline std::vector<std::uint8_t> parse_hex(std::string_view text, bool* odd_digits = nullptr) {
  std::vector<std::uint8_t> out;
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
  if (odd_digits) *odd_digits = high >= 0;
  return out;
}

}  // namespace peercm::wire::test
