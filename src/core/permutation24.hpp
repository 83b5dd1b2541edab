// A keyed bijection on 24-bit values, so that numbers a peer sees (QPNs, the index half of an
// STag) follow no order an attacker could extrapolate from the ones it has seen
// (docs/reliability.md, "Numbers a peer can see"). Four rounds of a balanced Feistel network
// over 12-bit halves (KeyedPermutation<12>; other widths for smaller spaces, such as the QPNs
// of a context that shares its RoCE address); each round mixes the half with its own 64-bit
// round key. It is a
// bijection whatever the round function, so allocating from a counter through it never
// repeats a value before 2^24 allocations. It hides order from an off-path observer; it is
// not a cipher meant to resist one who can query it.
#pragma once

#include <array>
#include <cstdint>

namespace peercm::core {

template <unsigned HalfBits>
class KeyedPermutation {
 public:
  static_assert(HalfBits >= 1 && HalfBits <= 15);
  static constexpr unsigned kBits = 2 * HalfBits;
  static constexpr std::uint32_t kMask = (std::uint32_t{1} << kBits) - 1;

  explicit KeyedPermutation(std::uint64_t key) {
    for (std::size_t i = 0; i < round_keys_.size(); ++i) round_keys_[i] = mix(key + 0x9E3779B97F4A7C15ull * (i + 1));
  }

  std::uint32_t forward(std::uint32_t value) const {
    std::uint32_t left = (value >> HalfBits) & kHalfMask;
    std::uint32_t right = value & kHalfMask;
    for (std::size_t i = 0; i < round_keys_.size(); ++i) {
      const std::uint32_t next = left ^ round(i, right);
      left = right;
      right = next;
    }
    return left << HalfBits | right;
  }

  std::uint32_t inverse(std::uint32_t value) const {
    std::uint32_t left = (value >> HalfBits) & kHalfMask;
    std::uint32_t right = value & kHalfMask;
    for (std::size_t i = round_keys_.size(); i-- > 0;) {
      const std::uint32_t previous = right ^ round(i, left);
      right = left;
      left = previous;
    }
    return left << HalfBits | right;
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
    return static_cast<std::uint32_t>(mix(round_keys_[i] ^ half) & kHalfMask);
  }

  static constexpr std::uint32_t kHalfMask = (std::uint32_t{1} << HalfBits) - 1;
  std::array<std::uint64_t, 4> round_keys_{};
};

using Permutation24 = KeyedPermutation<12>;

}  // namespace peercm::core
