// MPA FPDU framing (RFC 5044 §4): ULPDU_Length | ULPDU | PAD | CRC32C. Markers are not used.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

#include "peercm/result.hpp"
#include "wire/crc32c.hpp"
#include "wire/ddp_rdmap.hpp"
#include "wire/wire_error.hpp"

namespace peercm::wire {

inline constexpr std::size_t kUlpduLengthSize = 2;
inline constexpr std::size_t kFpduCrcSize = 4;
inline constexpr std::size_t kMinMulpdu = 128;     // RFC 5044 §4.5
inline constexpr std::size_t kMaxMulpdu = 64768;   // RFC 5044 §4.5
inline constexpr std::size_t kMaxUlpduLength = 0xFFFF;

constexpr std::size_t fpdu_padding(std::size_t ulpdu_length) {
  return (4 - ((kUlpduLengthSize + ulpdu_length) % 4)) % 4;
}
constexpr std::size_t fpdu_wire_size(std::size_t ulpdu_length) {
  return kUlpduLengthSize + ulpdu_length + fpdu_padding(ulpdu_length) + kFpduCrcSize;
}

// RFC 5044 §4.5 without markers: MULPDU = EMSS - (6 + EMSS mod 4), within [128, 64768].
std::size_t mulpdu_for_emss(std::size_t emss);

// The CRC field, the one little-endian field of iWARP (RFC 5044 §4.4, worked examples in
// Figs. 5-6).
inline std::uint32_t load_crc_field(const std::uint8_t* field) {
  return std::uint32_t{field[0]} | (std::uint32_t{field[1]} << 8) | (std::uint32_t{field[2]} << 16) |
         (std::uint32_t{field[3]} << 24);
}
inline void store_crc_field(std::uint32_t crc, std::uint8_t* field) {
  for (std::size_t i = 0; i < kFpduCrcSize; ++i) field[i] = static_cast<std::uint8_t>(crc >> (8 * i));
}

// The trailer of a whole FPDU (`fpdu`: ULPDU_Length through the CRC field, fpdu_wire_size()
// bytes of a ULPDU of `ulpdu_length`): its PAD is zero (RFC 5044 §4.1) and, when `check_crc`,
// its CRC field matches the bytes before it (§4.4).
bool fpdu_trailer_valid(std::span<const std::uint8_t> fpdu, std::size_t ulpdu_length, bool check_crc);

// Builds the bytes around a payload that is sent from where it lies: the prefix
// (ULPDU_Length and the segment header) and the trailer (pad and CRC).
class FpduFramer {
 public:
  Status<WireError> begin(const SegmentHeader& header, std::size_t payload_length);
  std::span<const std::uint8_t> prefix() const { return std::span(prefix_).first(prefix_size_); }
  // Feed each payload piece in order (only needed with CRC on).
  void add_payload(std::span<const std::uint8_t> payload) {
    if (!prefix_in_crc_) absorb_prefix();
    crc_.update(payload);
  }
  // Pad and CRC; with CRC off the CRC field is sent as zero (RFC 5044 §4.4 lets it hold anything).
  std::span<const std::uint8_t> finish(bool with_crc);

 private:
  // The prefix enters the CRC lazily (first add_payload or finish(true)), so the CRC-off
  // path computes no CRC at all.
  void absorb_prefix();

  std::array<std::uint8_t, kUlpduLengthSize + kMaxSegmentHeaderSize> prefix_{};
  std::size_t prefix_size_ = 0;
  std::size_t padding_ = 0;
  bool prefix_in_crc_ = false;
  Crc32c crc_;
  std::array<std::uint8_t, 3 + kFpduCrcSize> trailer_{};
};

// Encodes a whole FPDU (copying the payload) into `out`; returns its size.
Result<std::size_t, WireError> encode_fpdu(const SegmentHeader& header, std::span<const std::uint8_t> payload,
                                           bool with_crc, std::span<std::uint8_t> out);

// What the stream decoder produced.
struct FpduEvent {
  enum class Kind : std::uint8_t {
    need_more,  // all input consumed, nothing to report
    header,     // a segment header is parsed; payload_length bytes of payload follow
    payload,    // a piece of payload (view into the caller's input)
    end,        // the FPDU's trailer checked out: the segment is complete
    whole,      // header, payload and a trailer that checked out, all in one input: the
                // three events above at once (only with set_whole_events(true))
    error,      // the stream is broken; the decoder stays in error
  };
  Kind kind = Kind::need_more;
  // `header`: the decoded segment header, owned by the decoder and valid until its next
  // call (null for the other kinds). An event is returned several times per FPDU; a pointer
  // keeps it small where a copy of the header would not be.
  const SegmentHeader* header = nullptr;
  std::size_t payload_length = 0;
  std::span<const std::uint8_t> payload;
  WireError error = WireError::truncated;
};

// Incremental FPDU decoder for a TCP byte stream split at any boundary.
// Zero-copy use: after a `header` event, receive payload_remaining() bytes straight into the
// target buffer and report them with payload_placed(); the decoder only checks them (CRC).
class FpduStreamDecoder {
 public:
  explicit FpduStreamDecoder(bool check_crc, std::size_t max_ulpdu = kMaxUlpduLength)
      : check_crc_(check_crc), max_ulpdu_(max_ulpdu) {}

  // Consumes a prefix of `in` (reported in `consumed`) and returns at most one event.
  FpduEvent next(std::span<const std::uint8_t> in, std::size_t& consumed);

  bool in_payload() const { return phase_ == Phase::payload; }
  // No byte of the next FPDU has been consumed yet.
  bool at_fpdu_start() const { return phase_ == Phase::length && header_filled_ == 0; }
  std::size_t payload_remaining() const { return phase_ == Phase::payload ? payload_left_ : 0; }
  // Reports payload bytes the caller received directly (zero-copy path).
  void payload_placed(std::span<const std::uint8_t> bytes);
  bool failed() const { return phase_ == Phase::failed; }
  void set_check_crc(bool on) { check_crc_ = on; }
  // An FPDU that lies whole in one input, and whose trailer checks out, is reported as one
  // `whole` event. One that does not is reported in parts as usual, so the events and errors
  // of a broken FPDU do not depend on how the stream was split.
  void set_whole_events(bool on) { whole_events_ = on; }

 private:
  enum class Phase : std::uint8_t { length, header, payload, trailer, failed };
  // Both fill in the event next() returns (one FpduEvent per call, built in place).
  void fail_with(FpduEvent& event, WireError error);
  void finish_trailer(FpduEvent& event);
  // The FPDU starting at `fpdu` (its header decoded) is whole in `in` from `at` on, with a
  // zero PAD and, if checked, the right CRC.
  bool whole_fpdu_in(std::span<const std::uint8_t> in, std::size_t at, const std::uint8_t* fpdu) const;

  bool check_crc_;
  bool whole_events_ = false;
  std::size_t max_ulpdu_;
  Phase phase_ = Phase::length;
  std::array<std::uint8_t, kUlpduLengthSize + kMaxSegmentHeaderSize> header_{};
  SegmentHeader decoded_;  // what the last `header` event points at
  std::size_t header_filled_ = 0;
  std::size_t header_size_ = 0;  // bytes of ULPDU that are header, once known
  std::size_t ulpdu_length_ = 0;
  std::size_t payload_left_ = 0;
  std::array<std::uint8_t, 3 + kFpduCrcSize> trailer_{};
  std::size_t trailer_filled_ = 0;
  std::size_t trailer_size_ = 0;
  Crc32c crc_;
  WireError error_ = WireError::truncated;  // the error that failed the stream, repeated after
};

}  // namespace peercm::wire
