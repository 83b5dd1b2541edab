// What the fuzz harnesses share: the oracle check (a violation prints and aborts, in every
// build type, so libFuzzer and the replay driver both see it), a cursor over the fuzzer's
// bytes, a deterministic chunk splitter, and the comparison of DDP/RDMAP headers that
// knows which received bits the decoder ignores.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>

#include "wire/ddp_rdmap.hpp"

namespace peercm::fuzz {

[[noreturn]] inline void violation(const char* file, int line, const char* what) {
  std::fprintf(stderr, "%s:%d: fuzz oracle violated: %s\n", file, line, what);
  std::fflush(stderr);
  std::abort();
}

#define FUZZ_CHECK(condition, what)                                          \
  do {                                                                       \
    if (!(condition)) ::peercm::fuzz::violation(__FILE__, __LINE__, (what)); \
  } while (false)

// Reads the fuzzer's input front to back; past the end every read yields zero, so a short
// input is still a valid (if dull) configuration.
class Input {
 public:
  Input(const std::uint8_t* data, std::size_t size) : bytes_(data, size) {}

  std::uint8_t byte() { return at_ < bytes_.size() ? bytes_[at_++] : 0; }
  std::span<const std::uint8_t> take(std::size_t n) {
    const std::size_t k = n < remaining() ? n : remaining();
    const auto out = bytes_.subspan(at_, k);
    at_ += k;
    return out;
  }
  std::span<const std::uint8_t> rest() { return take(remaining()); }
  std::size_t remaining() const { return bytes_.size() - at_; }

 private:
  std::span<const std::uint8_t> bytes_;
  std::size_t at_ = 0;
};

// Chunk sizes for splitting a byte stream (splitmix64). Seed 0 means "no split": the whole
// remainder each time, so every harness also runs the one-call path.
class Splitter {
 public:
  explicit Splitter(std::uint64_t seed) : state_(seed), split_(seed != 0) {}

  std::size_t next(std::size_t left) {
    if (!split_ || left <= 1) return left;
    state_ += 0x9E3779B97F4A7C15ull;
    std::uint64_t z = state_;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    // Mostly small pieces (the hard cases), sometimes the rest.
    if ((z & 7) == 0) return left;
    const std::size_t n = 1 + static_cast<std::size_t>((z >> 3) % 23);
    return n < left ? n : left;
  }

 private:
  std::uint64_t state_;
  bool split_;
};

inline bool same_header(const wire::SegmentHeader& a, const wire::SegmentHeader& b) {
  return a.opcode == b.opcode && a.last == b.last && a.stag == b.stag && a.tagged_offset == b.tagged_offset &&
         a.invalidate_stag == b.invalidate_stag && a.queue_number == b.queue_number && a.msn == b.msn &&
         a.message_offset == b.message_offset && a.read_request == b.read_request && a.terminate == b.terminate;
}

// Bits of header byte `i` that survive decode + encode. The rest are "send 0, ignore on
// receive": DDP control reserved bits (RFC 5041 §5.1), RDMAP control reserved bits and the
// Invalidate STag slot of opcodes without one (RFC 5040 §4.2), the Terminate's reserved
// HdrCt bits and reserved byte (RFC 5040 §4.8).
inline std::uint8_t significant_bits(const wire::SegmentHeader& h, std::size_t i) {
  if (i == 0) return 0xC3;
  if (i == 1) return 0xCF;
  if (wire::is_tagged(h.opcode)) return 0xFF;
  if (i >= 2 && i < 6) return wire::carries_invalidate(h.opcode) ? 0xFF : 0x00;
  if (h.opcode == wire::RdmapOpcode::terminate) {
    if (i == wire::kUntaggedHeaderSize + 2) return 0xE0;
    if (i == wire::kUntaggedHeaderSize + 3) return 0x00;
  }
  return 0xFF;
}

// True when `encoded` (the encoder's bytes for `h`) equals `received` in every bit the
// decoder looked at.
inline bool matches_received(const wire::SegmentHeader& h, std::span<const std::uint8_t> received,
                             std::span<const std::uint8_t> encoded) {
  if (received.size() < encoded.size()) return false;
  for (std::size_t i = 0; i < encoded.size(); ++i) {
    const std::uint8_t mask = significant_bits(h, i);
    if ((received[i] & mask) != (encoded[i] & mask)) return false;
  }
  return true;
}

}  // namespace peercm::fuzz
