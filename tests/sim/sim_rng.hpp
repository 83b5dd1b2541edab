// The one source of randomness of a simulated run: xoshiro256** seeded through SplitMix64, so a
// seed names a run exactly and replays it bit for bit on any machine.
#pragma once

#include <cstdint>

namespace peercm::sim {

class Rng {
 public:
  explicit Rng(std::uint64_t seed) {
    for (auto& word : state_) word = splitmix(seed);
  }

  std::uint64_t next() {
    const std::uint64_t result = rotl(state_[1] * 5, 7) * 9;
    const std::uint64_t t = state_[1] << 17;
    state_[2] ^= state_[0];
    state_[3] ^= state_[1];
    state_[1] ^= state_[2];
    state_[0] ^= state_[3];
    state_[2] ^= t;
    state_[3] = rotl(state_[3], 45);
    return result;
  }

  // Uniform in [lo, hi] (inclusive); the modulo bias is irrelevant at these ranges.
  std::uint64_t between(std::uint64_t lo, std::uint64_t hi) {
    return hi <= lo ? lo : lo + next() % (hi - lo + 1);
  }
  int between(int lo, int hi) {
    return hi <= lo ? lo
                    : lo + static_cast<int>(next() % static_cast<std::uint64_t>(hi - lo + 1));
  }
  // True with probability `percent`/100.
  bool percent(unsigned percent) { return next() % 100 < percent; }

 private:
  static std::uint64_t rotl(std::uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  static std::uint64_t splitmix(std::uint64_t& x) {
    std::uint64_t z = (x += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }

  std::uint64_t state_[4] = {};
};

}  // namespace peercm::sim
