// FpduStreamDecoder (RFC 5044 §4) on any byte stream. Input: a control byte (bit 0: check
// CRC; bit 1: second pass reports payload through payload_placed(), the zero-copy path;
// bits 2-3: the ULPDU limit; bit 4: the first pass asks for `whole` events), a split seed,
// then the stream.
// The stream is decoded twice: in one call per event, and split into small pieces.
// Oracles: both passes report the same FPDUs, payload bytes, error and consumption (decoding
// does not depend on where TCP splits the stream); the decoder never consumes more than it
// is given and always makes progress; events come in header / payload / end order with
// payload views inside the caller's input (or one `whole` event); every FPDU that ends is well formed — its size
// follows from ULPDU_Length, its header decodes from the bytes to the reported header, its
// padding is zero, its CRC checks when CRC is on; after an error it stays failed.
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "fuzz_support.hpp"
#include "wire/byte_io.hpp"
#include "wire/crc32c.hpp"
#include "wire/fpdu.hpp"

namespace {

using namespace peercm::wire;
using peercm::fuzz::same_header;

struct Fpdu {
  SegmentHeader header;
  std::size_t payload_length = 0;
  std::vector<std::uint8_t> payload;
  bool ended = false;
};

struct Trace {
  std::vector<Fpdu> fpdus;
  std::optional<WireError> error;
  std::size_t consumed = 0;
};

struct Pass {
  bool check_crc = false;
  std::size_t max_ulpdu = kMaxUlpduLength;
  std::uint64_t split_seed = 0;
  bool zero_copy = false;
  bool whole_events = false;
};

// The FPDU that just ended occupies stream[start, end).
void check_ended_fpdu(std::span<const std::uint8_t> stream, std::size_t start, std::size_t end, const Fpdu& fpdu,
                      const Pass& pass) {
  const auto wire = stream.subspan(start, end - start);
  FUZZ_CHECK(wire.size() >= kUlpduLengthSize, "FPDU ended before its length");
  const std::size_t ulpdu_length = load_be16(wire.data());
  FUZZ_CHECK(ulpdu_length <= pass.max_ulpdu, "FPDU above the ULPDU limit accepted");
  FUZZ_CHECK(wire.size() == fpdu_wire_size(ulpdu_length), "FPDU size does not follow from ULPDU_Length");
  FUZZ_CHECK(fpdu.payload_length <= ulpdu_length, "payload longer than the ULPDU");
  const std::size_t header_size = ulpdu_length - fpdu.payload_length;
  auto header = decode_segment_header(wire.subspan(kUlpduLengthSize, header_size), ulpdu_length);
  FUZZ_CHECK(header.has_value() && same_header(*header, fpdu.header), "reported header is not the one on the wire");
  const auto payload = wire.subspan(kUlpduLengthSize + header_size, fpdu.payload_length);
  FUZZ_CHECK(fpdu.payload.size() == payload.size() && std::equal(payload.begin(), payload.end(), fpdu.payload.begin()),
             "reported payload is not the bytes on the wire");
  const std::size_t padding = fpdu_padding(ulpdu_length);
  for (std::size_t i = 0; i < padding; ++i)
    FUZZ_CHECK(wire[kUlpduLengthSize + ulpdu_length + i] == 0, "non-zero padding accepted");
  if (pass.check_crc) {
    const auto crc_field = wire.subspan(wire.size() - kFpduCrcSize);
    const std::uint32_t received = std::uint32_t{crc_field[0]} | (std::uint32_t{crc_field[1]} << 8) |
                                   (std::uint32_t{crc_field[2]} << 16) | (std::uint32_t{crc_field[3]} << 24);
    FUZZ_CHECK(received == crc32c(wire.first(wire.size() - kFpduCrcSize)), "FPDU with a bad CRC accepted");
  }
}

Trace decode(std::span<const std::uint8_t> stream, const Pass& pass) {
  FpduStreamDecoder decoder(pass.check_crc, pass.max_ulpdu);
  decoder.set_whole_events(pass.whole_events);
  peercm::fuzz::Splitter split(pass.split_seed);
  Trace trace;
  std::size_t pos = 0;
  std::size_t fpdu_start = 0;
  Fpdu* open = nullptr;  // the FPDU whose header was reported and that has not ended
  // Every call consumes a byte or reports an event that needs no byte; a header, its
  // payload and its end per FPDU bound the calls.
  std::size_t calls_left = 4 * stream.size() + 16;
  bool toggle = false;
  while (pos < stream.size()) {
    FUZZ_CHECK(calls_left-- > 0, "decoder makes no progress");
    const std::size_t n = split.next(stream.size() - pos);
    const auto in = stream.subspan(pos, n);
    if (pass.zero_copy && decoder.in_payload()) {
      FUZZ_CHECK(open != nullptr, "payload expected without a header");
      const std::size_t k = std::min(n, decoder.payload_remaining());
      FUZZ_CHECK(k > 0, "in payload with nothing remaining");
      decoder.payload_placed(in.first(k));
      open->payload.insert(open->payload.end(), in.begin(), in.begin() + static_cast<std::ptrdiff_t>(k));
      pos += k;
      continue;
    }
    toggle = !toggle;
    if (pass.zero_copy && toggle) {
      // Reported placement outside a payload must be ignored (no skipping to a trailer).
      decoder.payload_placed(in.first(std::min<std::size_t>(n, 2)));
    }
    std::size_t consumed = 0;
    const FpduEvent event = decoder.next(in, consumed);
    FUZZ_CHECK(consumed <= in.size(), "decoder consumed more than it was given");
    pos += consumed;
    switch (event.kind) {
      case FpduEvent::Kind::need_more:
        FUZZ_CHECK(consumed == in.size(), "need_more with input left");
        break;
      case FpduEvent::Kind::header:
        FUZZ_CHECK(open == nullptr, "a header inside an FPDU");
        trace.fpdus.push_back(Fpdu{.header = *event.header, .payload_length = event.payload_length});
        open = &trace.fpdus.back();
        FUZZ_CHECK(decoder.payload_remaining() == event.payload_length, "payload_remaining disagrees with the header");
        break;
      case FpduEvent::Kind::payload:
        FUZZ_CHECK(open != nullptr, "payload without a header");
        FUZZ_CHECK(!event.payload.empty(), "empty payload event");
        FUZZ_CHECK(event.payload.data() >= in.data() && event.payload.data() + event.payload.size() <= in.data() + in.size(),
                   "payload view outside the caller's input");
        open->payload.insert(open->payload.end(), event.payload.begin(), event.payload.end());
        FUZZ_CHECK(open->payload.size() <= open->payload_length, "more payload than the header announced");
        break;
      case FpduEvent::Kind::end:
        FUZZ_CHECK(open != nullptr, "an end without a header");
        FUZZ_CHECK(open->payload.size() == open->payload_length, "FPDU ended before its payload");
        open->ended = true;
        check_ended_fpdu(stream, fpdu_start, pos, *open, pass);
        open = nullptr;
        fpdu_start = pos;
        break;
      case FpduEvent::Kind::whole:
        FUZZ_CHECK(pass.whole_events, "a whole event not asked for");
        FUZZ_CHECK(open == nullptr, "a whole FPDU inside an FPDU");
        FUZZ_CHECK(event.payload.size() == event.payload_length, "whole FPDU with part of its payload");
        FUZZ_CHECK(event.payload.empty() || (event.payload.data() >= in.data() &&
                                             event.payload.data() + event.payload.size() <= in.data() + in.size()),
                   "payload view outside the caller's input");
        trace.fpdus.push_back(Fpdu{.header = *event.header,
                                   .payload_length = event.payload_length,
                                   .payload = {event.payload.begin(), event.payload.end()},
                                   .ended = true});
        check_ended_fpdu(stream, fpdu_start, pos, trace.fpdus.back(), pass);
        fpdu_start = pos;
        break;
      case FpduEvent::Kind::error:
        trace.error = event.error;
        break;
    }
    if (trace.error) break;
  }
  trace.consumed = pos;
  if (trace.error) {
    FUZZ_CHECK(decoder.failed(), "error reported but the decoder did not fail");
    std::size_t consumed = 0;
    const FpduEvent again = decoder.next(stream.subspan(pos), consumed);
    FUZZ_CHECK(again.kind == FpduEvent::Kind::error && again.error == *trace.error && consumed == 0,
               "a failed decoder recovered or changed its error");
  }
  return trace;
}

bool same_trace(const Trace& a, const Trace& b) {
  if (a.error != b.error || a.consumed != b.consumed || a.fpdus.size() != b.fpdus.size()) return false;
  for (std::size_t i = 0; i < a.fpdus.size(); ++i) {
    const Fpdu& x = a.fpdus[i];
    const Fpdu& y = b.fpdus[i];
    if (!same_header(x.header, y.header) || x.payload_length != y.payload_length || x.payload != y.payload ||
        x.ended != y.ended)
      return false;
  }
  return true;
}

constexpr std::array<std::size_t, 4> kLimits = {kMaxUlpduLength, kMaxMulpdu, 1454, kMinMulpdu};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  peercm::fuzz::Input in(data, size);
  const std::uint8_t control = in.byte();
  const std::uint8_t seed = in.byte();
  const auto stream = in.rest();
  Pass whole{.check_crc = (control & 1) != 0, .max_ulpdu = kLimits[(control >> 2) & 3]};
  Pass split = whole;
  whole.whole_events = (control & 16) != 0;
  split.split_seed = seed | 0x100u;  // never zero: always split
  split.zero_copy = (control & 2) != 0;
  const Trace a = decode(stream, whole);
  const Trace b = decode(stream, split);
  FUZZ_CHECK(same_trace(a, b), "decoding depends on where the stream is split");
  return 0;
}
