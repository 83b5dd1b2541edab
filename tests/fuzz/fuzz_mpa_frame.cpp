// MPA Request/Reply frames (RFC 5044 §7.1, RFC 6581 §5) and MpaFrameReader on a stream
// split anywhere. Input: one control byte (bit 0: expect a Reply; bits 1-7: split seed), then
// the stream.
// Oracles: the frame codec is canonical (a decoded frame re-encodes to exactly its bytes);
// decode_mpa_frame accepts exactly the inputs whose mpa_frame_length is their size; the
// reader agrees with the one-shot decoder — complete iff a whole valid frame is at the
// start, taking exactly its bytes and no more, failing with the same error otherwise, and
// taking nothing after it finished.
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

#include "fuzz_support.hpp"
#include "wire/mpa_frame.hpp"

namespace {

using namespace peercm::wire;

bool same_frame(const MpaFrame& a, const MpaFrame& b) {
  return a.kind == b.kind && a.markers == b.markers && a.crc == b.crc && a.rejected == b.rejected &&
         a.revision == b.revision && a.enhanced == b.enhanced &&
         std::equal(a.private_data.begin(), a.private_data.end(), b.private_data.begin(), b.private_data.end());
}

void check_one_shot(std::span<const std::uint8_t> bytes, MpaFrameKind kind) {
  auto frame = decode_mpa_frame(bytes, kind);
  auto length = mpa_frame_length(bytes, kind);
  FUZZ_CHECK(frame.has_value() == (length.has_value() && *length == bytes.size()),
             "decode_mpa_frame and mpa_frame_length disagree");
  if (!frame) return;
  FUZZ_CHECK(frame->kind == kind, "frame of the wrong kind");
  FUZZ_CHECK(kind == MpaFrameKind::reply || !frame->rejected, "R=1 accepted in a Request");
  FUZZ_CHECK(!frame->enhanced || frame->revision == 2, "IRD/ORD block accepted without revision 2");
  FUZZ_CHECK(frame->private_data.size() <= kMpaMaxPrivateData, "private data over 512 bytes");
  FUZZ_CHECK(frame->private_data.data() + frame->private_data.size() == bytes.data() + bytes.size(),
             "private data is not the tail of the frame");
  auto size = mpa_frame_size(*frame);
  FUZZ_CHECK(size.has_value() && *size == bytes.size(), "a decoded frame reports another size");
  std::array<std::uint8_t, kMpaMaxFrameSize> encoded{};
  auto written = encode_mpa_frame(*frame, encoded);
  FUZZ_CHECK(written.has_value() && *written == bytes.size(), "a decoded frame does not encode to its size");
  FUZZ_CHECK(std::equal(bytes.begin(), bytes.end(), encoded.begin()), "MPA frame is not canonical");
}

void check_reader(std::span<const std::uint8_t> stream, MpaFrameKind kind, std::uint64_t seed) {
  MpaFrameReader reader(kind);
  peercm::fuzz::Splitter split(seed);
  std::size_t taken = 0;
  while (taken < stream.size() && !reader.complete() && !reader.error()) {
    const auto chunk = stream.subspan(taken, split.next(stream.size() - taken));
    const std::size_t n = reader.feed(chunk);
    FUZZ_CHECK(n <= chunk.size(), "reader took more than it was given");
    FUZZ_CHECK(n == chunk.size() || reader.complete() || reader.error(), "reader stopped short without a result");
    taken += n;
  }
  FUZZ_CHECK(reader.feed(stream.subspan(taken)) == 0, "reader took bytes after it finished");
  FUZZ_CHECK(!(reader.complete() && reader.error()), "reader both complete and failed");

  auto length = mpa_frame_length(stream, kind);
  const bool whole_frame = length.has_value() && stream.size() >= *length;
  FUZZ_CHECK(reader.complete() == whole_frame, "reader and one-shot decoder disagree on a complete frame");
  if (reader.complete()) {
    FUZZ_CHECK(taken == *length, "reader took bytes beyond its frame");
    auto frame = decode_mpa_frame(stream.first(taken), kind);
    FUZZ_CHECK(frame.has_value() && same_frame(*reader.frame(), *frame), "reader decoded another frame");
  } else if (reader.error()) {
    if (stream.size() >= kMpaFrameHeaderSize) {
      FUZZ_CHECK(!length && length.error() == *reader.error(), "reader and one-shot decoder report different errors");
    } else {
      FUZZ_CHECK(*reader.error() == WireError::mpa_bad_key, "reader failed a short prefix for a non-key reason");
    }
  } else {
    FUZZ_CHECK(taken == stream.size(), "an unfinished reader left input unread");
    FUZZ_CHECK(!length || stream.size() < *length, "reader still waiting with a whole frame in hand");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  peercm::fuzz::Input in(data, size);
  const std::uint8_t control = in.byte();
  const MpaFrameKind kind = (control & 1) ? MpaFrameKind::reply : MpaFrameKind::request;
  const auto stream = in.rest();
  check_one_shot(stream, kind);
  check_reader(stream, kind, control >> 1);
  return 0;
}
