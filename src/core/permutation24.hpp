// A keyed bijection on 24-bit values, so that numbers a peer sees (QPNs, the index half of an
// STag) follow no order an attacker could extrapolate from the ones it has seen
// (docs/reliability.md, "Numbers a peer can see"). Four rounds of a balanced Feistel network
// over 12-bit halves; each round mixes the half with its own 64-bit round key. It is a
// bijection whatever the round function, so allocating from a counter through it never
// repeats a value before 2^24 allocations. It hides order from an off-path observer; it is
// not a cipher meant to resist one who can query it.
#pragma once

#include <array>
#include <cstdint>

namespace peercm::core {

class Permutation24 {
 public:
  static constexpr std::uint32_t kMask = 0xFFFFFF;

  explicit Permutation24(std::uint64_t key) {
    for (std::size_t i = 0; i < round_keys_.size(); ++i) round_keys_[i] = mix(key + 0x9E3779B97F4A7C15ull * (i + 1));
  }

  std::uint32_t forward(std::uint32_t value) const {
    std::uint32_t left = (value >> 12) & 0xFFF;
    std::uint32_t right = value & 0xFFF;
    for (std::size_t i = 0; i < round_keys_.size(); ++i) {
      const std::uint32_t next = left ^ round(i, right);
      left = right;
      right = next;
    }
    return left << 12 | right;
  }

  std::uint32_t inverse(std::uint32_t value) const {
    std::uint32_t left = (value >> 12) & 0xFFF;
    std::uint32_t right = value & 0xFFF;
    for (std::size_t i = round_keys_.size(); i-- > 0;) {
      const std::uint32_t previous = right ^ round(i, left);
      right = left;
      left = previous;
    }
    return left << 12 | right;
  }

 private:
  // splitmix64's finaliser: every input bit reaches every output bit.
  static constexpr std::uint64_t mix(std::uint64_t x) {
    x ^= x >> 30;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 27;
    x *= 0x94D049BB133111EBull;
    return x ^ (x >> 31);
  }
  std::uint32_t round(std::size_t i, std::uint32_t half) const {
    return static_cast<std::uint32_t>(mix(round_keys_[i] ^ half) & 0xFFF);
  }

  std::array<std::uint64_t, 4> round_keys_{};
};

}  // namespace peercm::core
