// Property tests (rapidcheck): every frame type survives encode -> decode with randomized
// fields, and FpduStreamDecoder / MpaFrameReader give the same results however the byte
// stream is split (all at once, byte by byte, random split points, zero-copy placement).
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "wire/byte_io.hpp"
#include "wire/cm_header.hpp"
#include "wire/ddp_rdmap.hpp"
#include "wire/fpdu.hpp"
#include "wire/mpa_frame.hpp"

namespace peercm::wire {
namespace {

// RC_ASSERT builds two std::strings per use even when it passes, which ASan makes slow in
// per-byte loops; this one costs nothing unless it fails.
#define WIRE_CHECK(condition)                  \
  do {                                         \
    if (!(condition)) RC_FAIL(#condition);     \
  } while (false)

using Bytes = std::vector<std::uint8_t>;

// Payload contents come from a generated seed: cheap to generate, reproducible, and the
// shrinker still minimizes lengths.
Bytes seeded_bytes(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  Bytes out(n);
  for (auto& b : out) b = static_cast<std::uint8_t>(rng());
  return out;
}

std::size_t gen_length(std::size_t max) {
  return *rc::gen::oneOf(rc::gen::just(std::size_t{0}), rc::gen::just(max),
                         rc::gen::inRange<std::size_t>(0, max + 1));
}

Bytes gen_bytes(std::size_t max) {
  const std::size_t n = gen_length(max);
  return seeded_bytes(n, *rc::gen::arbitrary<std::uint32_t>());
}

std::uint16_t gen_ird_ord() {
  return *rc::gen::oneOf(rc::gen::just(std::uint16_t{0}), rc::gen::just(kIrdOrdMax),
                         rc::gen::inRange<std::uint16_t>(0, kIrdOrdMax + 1));
}

// ---------------------------------------------------------------------------------------
// MPA Request / Reply / Reject, rev 1 and rev 2, with and without the IRD/ORD block.

struct MpaShape {
  const char* name;
  MpaFrameKind kind;
  bool rejected;
  std::uint8_t revision;
  bool enhanced;
};

bool same_frame(const MpaFrame& a, const MpaFrame& b) {
  return a.kind == b.kind && a.markers == b.markers && a.crc == b.crc && a.rejected == b.rejected &&
         a.revision == b.revision && a.enhanced == b.enhanced &&
         std::equal(a.private_data.begin(), a.private_data.end(), b.private_data.begin(), b.private_data.end());
}

// Feeds `stream` to a reader at the given sorted cut points; returns the bytes it took.
std::size_t feed_reader(MpaFrameReader& reader, std::span<const std::uint8_t> stream, std::vector<std::size_t> cuts) {
  cuts.push_back(stream.size());
  std::sort(cuts.begin(), cuts.end());
  std::size_t at = 0;
  std::size_t taken = 0;
  for (const std::size_t cut : cuts) {
    if (cut < at) continue;
    std::span<const std::uint8_t> piece = stream.subspan(at, cut - at);
    const std::size_t n = reader.feed(piece);
    WIRE_CHECK(n <= piece.size());
    taken += n;
    if (n < piece.size()) {
      // Only a finished (or failed) reader leaves bytes behind.
      WIRE_CHECK(reader.complete() || reader.error().has_value());
    }
    at = cut;
  }
  return taken;
}

void mpa_round_trip(const MpaShape& shape) {
  MpaFrame frame;
  frame.kind = shape.kind;
  frame.markers = *rc::gen::arbitrary<bool>();
  frame.crc = *rc::gen::arbitrary<bool>();
  frame.rejected = shape.rejected;
  frame.revision = shape.revision;
  if (shape.enhanced) {
    frame.enhanced = IrdOrdBlock{.peer_to_peer = *rc::gen::arbitrary<bool>(),
                                 .send_rtr = *rc::gen::arbitrary<bool>(),
                                 .write_rtr = *rc::gen::arbitrary<bool>(),
                                 .read_rtr = *rc::gen::arbitrary<bool>(),
                                 .ird = gen_ird_ord(),
                                 .ord = gen_ird_ord()};
  }
  const Bytes pd = gen_bytes(kMpaMaxPrivateData - (shape.enhanced ? kIrdOrdBlockSize : 0));
  frame.private_data = pd;

  const auto size = mpa_frame_size(frame);
  RC_ASSERT(size.has_value());
  const std::size_t pd_length = pd.size() + (shape.enhanced ? kIrdOrdBlockSize : 0);
  RC_ASSERT(*size == kMpaFrameHeaderSize + pd_length);
  Bytes wire(*size);
  const auto written = encode_mpa_frame(frame, wire);
  RC_ASSERT(written.has_value());
  RC_ASSERT(*written == *size);

  // Header fields as RFC 5044 §7.1 / RFC 6581 lay them out.
  RC_ASSERT(std::size_t{load_be16(wire.data() + 18)} == pd_length);
  RC_ASSERT(wire[17] == shape.revision);
  const std::uint8_t expected_flags = static_cast<std::uint8_t>(
      (frame.markers ? 0x80 : 0) | (frame.crc ? 0x40 : 0) | (shape.rejected ? 0x20 : 0) | (shape.enhanced ? 0x10 : 0));
  RC_ASSERT(wire[16] == expected_flags);
  RC_ASSERT(wire[9] == (shape.kind == MpaFrameKind::request ? 'q' : 'p'));

  const auto decoded = decode_mpa_frame(wire, shape.kind);
  RC_ASSERT(decoded.has_value());
  RC_ASSERT(same_frame(*decoded, frame));

  const MpaFrameKind other = shape.kind == MpaFrameKind::request ? MpaFrameKind::reply : MpaFrameKind::request;
  const auto wrong_kind = decode_mpa_frame(wire, other);
  RC_ASSERT(!wrong_kind.has_value());
  RC_ASSERT(wrong_kind.error() == WireError::mpa_bad_key);

  // The reader, split at random points, with the first FPDU bytes right behind the frame.
  const Bytes trailing = gen_bytes(16);
  Bytes stream = wire;
  stream.insert(stream.end(), trailing.begin(), trailing.end());
  const auto cuts = *rc::gen::container<std::vector<std::size_t>>(rc::gen::inRange<std::size_t>(0, stream.size() + 1));
  MpaFrameReader reader(shape.kind);
  RC_ASSERT(feed_reader(reader, stream, cuts) == wire.size());
  RC_ASSERT(reader.complete());
  RC_ASSERT(!reader.error().has_value());
  RC_ASSERT(same_frame(*reader.frame(), frame));
}

TEST(RoundTripProperty, MpaFramesOfEveryShape) {
  const MpaShape shapes[] = {
      {"request rev1", MpaFrameKind::request, false, 1, false},
      {"request rev2", MpaFrameKind::request, false, 2, false},
      {"request rev2 enhanced", MpaFrameKind::request, false, 2, true},
      {"reply rev1", MpaFrameKind::reply, false, 1, false},
      {"reply rev2", MpaFrameKind::reply, false, 2, false},
      {"reply rev2 enhanced", MpaFrameKind::reply, false, 2, true},
      {"reject rev1", MpaFrameKind::reply, true, 1, false},
      {"reject rev2", MpaFrameKind::reply, true, 2, false},
      {"reject rev2 enhanced", MpaFrameKind::reply, true, 2, true},
  };
  for (const MpaShape& shape : shapes) {
    EXPECT_TRUE(rc::check(std::string("MPA round trip: ") + shape.name, [&shape] { mpa_round_trip(shape); }))
        << shape.name;
  }
}

// ---------------------------------------------------------------------------------------
// FPDUs of every RDMAP opcode.

constexpr std::array<RdmapOpcode, 8> kAllOpcodes = {
    RdmapOpcode::rdma_write,    RdmapOpcode::read_request,   RdmapOpcode::read_response,
    RdmapOpcode::send,          RdmapOpcode::send_invalidate, RdmapOpcode::send_solicited,
    RdmapOpcode::send_solicited_invalidate, RdmapOpcode::terminate};

bool same_header(const SegmentHeader& a, const SegmentHeader& b) {
  return a.opcode == b.opcode && a.last == b.last && a.stag == b.stag && a.tagged_offset == b.tagged_offset &&
         a.invalidate_stag == b.invalidate_stag && a.queue_number == b.queue_number && a.msn == b.msn &&
         a.message_offset == b.message_offset && a.read_request == b.read_request && a.terminate == b.terminate;
}

// Which optional parts a Terminate carries: M, D (none / tagged / untagged copy), R.
struct TerminateShape {
  bool length_valid;
  std::uint8_t ddp_header_length;  // 0, 14 or 18
  bool rdma_header;
};

TerminateHeader gen_terminate(const TerminateShape& shape) {
  TerminateHeader t;
  t.code = TerminateCode{static_cast<TerminateLayer>(*rc::gen::inRange<std::uint8_t>(0, 3)),
                         *rc::gen::inRange<std::uint8_t>(0, 16), *rc::gen::arbitrary<std::uint8_t>()};
  t.segment_length_valid = shape.length_valid;
  t.ddp_header_length = shape.ddp_header_length;
  if (shape.ddp_header_length != 0) {
    // The segment length field travels with the copied header (present if D, valid if M).
    t.ddp_segment_length = *rc::gen::arbitrary<std::uint16_t>();
    const Bytes copy = seeded_bytes(shape.ddp_header_length, *rc::gen::arbitrary<std::uint32_t>());
    std::copy(copy.begin(), copy.end(), t.ddp_header.begin());
    // The copied header's own T bit tells its length.
    if (shape.ddp_header_length == kTaggedHeaderSize) {
      t.ddp_header[0] = static_cast<std::uint8_t>(t.ddp_header[0] | 0x80);
    } else {
      t.ddp_header[0] = static_cast<std::uint8_t>(t.ddp_header[0] & 0x7F);
    }
  }
  t.has_rdma_header = shape.rdma_header;
  if (shape.rdma_header) {
    const Bytes copy = seeded_bytes(kReadRequestHeaderSize, *rc::gen::arbitrary<std::uint32_t>());
    std::copy(copy.begin(), copy.end(), t.rdma_header.begin());
  }
  return t;
}

TerminateShape gen_terminate_shape() {
  return TerminateShape{*rc::gen::arbitrary<bool>(),
                        *rc::gen::element(std::uint8_t{0}, std::uint8_t{kTaggedHeaderSize},
                                          std::uint8_t{kUntaggedHeaderSize}),
                        *rc::gen::arbitrary<bool>()};
}

// A header exactly as the decoder reports it (fields a segment does not carry stay zero).
SegmentHeader gen_header(RdmapOpcode op, const TerminateShape& terminate_shape) {
  SegmentHeader h;
  h.opcode = op;
  if (is_tagged(op)) {
    h.last = *rc::gen::arbitrary<bool>();
    h.stag = *rc::gen::arbitrary<std::uint32_t>();
    h.tagged_offset = *rc::gen::arbitrary<std::uint64_t>();
    return h;
  }
  h.queue_number = queue_number_for(op);
  h.msn = *rc::gen::arbitrary<std::uint32_t>();
  if (carries_invalidate(op)) h.invalidate_stag = *rc::gen::arbitrary<std::uint32_t>();
  if (op == RdmapOpcode::read_request) {
    h.read_request = ReadRequestHeader{.sink_stag = *rc::gen::arbitrary<std::uint32_t>(),
                                       .sink_offset = *rc::gen::arbitrary<std::uint64_t>(),
                                       .size = *rc::gen::arbitrary<std::uint32_t>(),
                                       .source_stag = *rc::gen::arbitrary<std::uint32_t>(),
                                       .source_offset = *rc::gen::arbitrary<std::uint64_t>()};
  } else if (op == RdmapOpcode::terminate) {
    h.terminate = gen_terminate(terminate_shape);
  } else {
    h.last = *rc::gen::arbitrary<bool>();
    h.message_offset = *rc::gen::arbitrary<std::uint32_t>();
  }
  return h;
}

struct Segment {
  SegmentHeader header;
  Bytes payload;
};

bool carries_payload(RdmapOpcode op) { return op != RdmapOpcode::read_request && op != RdmapOpcode::terminate; }

Segment gen_segment(RdmapOpcode op, std::size_t max_payload) {
  Segment s{gen_header(op, gen_terminate_shape()), {}};
  if (carries_payload(op)) s.payload = gen_bytes(max_payload);
  return s;
}

Segment gen_any_segment(std::size_t max_payload) { return gen_segment(*rc::gen::elementOf(kAllOpcodes), max_payload); }

Bytes encode_segments(const std::vector<Segment>& segments, bool with_crc) {
  Bytes out;
  for (const Segment& s : segments) {
    const std::size_t at = out.size();
    out.resize(at + fpdu_wire_size(segment_header_size(s.header) + s.payload.size()));
    const auto written = encode_fpdu(s.header, s.payload, with_crc, std::span(out).subspan(at));
    WIRE_CHECK(written.has_value());
    WIRE_CHECK(at + *written == out.size());
  }
  return out;
}

// What a stream decoded into.
struct Item {
  SegmentHeader header;
  std::size_t payload_length = 0;
  Bytes payload;
  bool ended = false;
};

struct Decoded {
  std::vector<Item> items;
  std::optional<WireError> error;
};

// Drives a FpduStreamDecoder and checks its contract on every event (RC_ASSERT).
class Collector {
 public:
  Collector(bool check_crc, bool zero_copy, std::uint32_t seed, bool whole_events = false)
      : decoder_(check_crc), zero_copy_(zero_copy), rng_(seed) {
    decoder_.set_whole_events(whole_events);
  }

  void feed(std::span<const std::uint8_t> in) {
    for (;;) {
      if (decoded_.error) return;
      if (zero_copy_ && decoder_.in_payload() && !in.empty()) {
        // Our own "recv" straight into the target, in random-sized pieces.
        WIRE_CHECK(!decoded_.items.empty());
        std::uniform_int_distribution<std::size_t> piece(1, decoder_.payload_remaining());
        const std::size_t n = std::min(in.size(), piece(rng_));
        Item& item = decoded_.items.back();
        item.payload.insert(item.payload.end(), in.begin(), in.begin() + static_cast<std::ptrdiff_t>(n));
        const std::size_t before = decoder_.payload_remaining();
        decoder_.payload_placed(in.first(n));
        WIRE_CHECK(decoder_.payload_remaining() == before - n);
        in = in.subspan(n);
        continue;
      }
      std::size_t consumed = 0;
      const FpduEvent event = decoder_.next(in, consumed);
      WIRE_CHECK(consumed <= in.size());
      in = in.subspan(consumed);
      switch (event.kind) {
        case FpduEvent::Kind::need_more:
          WIRE_CHECK(in.empty());
          return;
        case FpduEvent::Kind::header:
          WIRE_CHECK(decoded_.items.empty() || decoded_.items.back().ended);
          WIRE_CHECK(decoder_.payload_remaining() == event.payload_length);
          decoded_.items.push_back(Item{*event.header, event.payload_length, {}, false});
          break;
        case FpduEvent::Kind::payload: {
          WIRE_CHECK(!zero_copy_);
          WIRE_CHECK(!decoded_.items.empty());
          Item& item = decoded_.items.back();
          WIRE_CHECK(!item.ended);
          WIRE_CHECK(!event.payload.empty());
          WIRE_CHECK(item.payload.size() + event.payload.size() <= item.payload_length);
          item.payload.insert(item.payload.end(), event.payload.begin(), event.payload.end());
          break;
        }
        case FpduEvent::Kind::end: {
          WIRE_CHECK(!decoded_.items.empty());
          Item& item = decoded_.items.back();
          WIRE_CHECK(!item.ended);
          WIRE_CHECK(item.payload.size() == item.payload_length);
          item.ended = true;
          break;
        }
        case FpduEvent::Kind::whole:
          WIRE_CHECK(decoded_.items.empty() || decoded_.items.back().ended);
          WIRE_CHECK(event.payload.size() == event.payload_length);
          WIRE_CHECK(!decoder_.in_payload());
          decoded_.items.push_back(
              Item{*event.header, event.payload_length, {event.payload.begin(), event.payload.end()}, true});
          ++wholes_;
          break;
        case FpduEvent::Kind::error:
          WIRE_CHECK(decoder_.failed());
          decoded_.error = event.error;
          return;
      }
    }
  }

  const Decoded& decoded() const { return decoded_; }
  std::size_t wholes() const { return wholes_; }

 private:
  FpduStreamDecoder decoder_;
  std::size_t wholes_ = 0;
  bool zero_copy_;
  std::mt19937 rng_;
  Decoded decoded_;
};

void assert_matches(const Decoded& d, const std::vector<Segment>& segments) {
  WIRE_CHECK(!d.error.has_value());
  WIRE_CHECK(d.items.size() == segments.size());
  for (std::size_t i = 0; i < segments.size(); ++i) {
    WIRE_CHECK(same_header(d.items[i].header, segments[i].header));
    WIRE_CHECK(d.items[i].payload_length == segments[i].payload.size());
    WIRE_CHECK(d.items[i].payload == segments[i].payload);
    WIRE_CHECK(d.items[i].ended);
  }
}

void assert_same(const Decoded& a, const Decoded& b) {
  WIRE_CHECK(a.error == b.error);
  WIRE_CHECK(a.items.size() == b.items.size());
  for (std::size_t i = 0; i < a.items.size(); ++i) {
    WIRE_CHECK(same_header(a.items[i].header, b.items[i].header));
    WIRE_CHECK(a.items[i].payload_length == b.items[i].payload_length);
    WIRE_CHECK(a.items[i].payload == b.items[i].payload);
    WIRE_CHECK(a.items[i].ended == b.items[i].ended);
  }
}

Decoded decode_in_chunks(std::span<const std::uint8_t> wire, bool check_crc, const std::vector<std::size_t>& sizes,
                         bool zero_copy = false, std::uint32_t seed = 1) {
  Collector collector(check_crc, zero_copy, seed);
  std::size_t at = 0;
  for (std::size_t i = 0; at < wire.size(); ++i) {
    const std::size_t n = std::min(wire.size() - at, sizes.empty() ? wire.size() : std::max<std::size_t>(1, sizes[i % sizes.size()]));
    collector.feed(wire.subspan(at, n));
    at += n;
  }
  return collector.decoded();
}

// One random segment of `op`, encoded with CRC and without, through the decoder.
void fpdu_round_trip(RdmapOpcode op, std::optional<TerminateShape> terminate_shape) {
  Segment s{gen_header(op, terminate_shape ? *terminate_shape : gen_terminate_shape()), {}};
  if (carries_payload(op)) s.payload = gen_bytes(1500);
  const std::vector<Segment> segments = {s};
  const std::size_t ulpdu_length = segment_header_size(s.header) + s.payload.size();
  const std::size_t split = *rc::gen::inRange<std::size_t>(1, fpdu_wire_size(ulpdu_length));
  for (const bool with_crc : {true, false}) {
    const Bytes wire = encode_segments(segments, with_crc);
    WIRE_CHECK(wire.size() == fpdu_wire_size(ulpdu_length));
    WIRE_CHECK(wire.size() % 4 == 0);
    WIRE_CHECK(std::size_t{load_be16(wire.data())} == ulpdu_length);
    if (!with_crc) {
      WIRE_CHECK(std::all_of(wire.end() - 4, wire.end(), [](std::uint8_t b) { return b == 0; }));
    }
    assert_matches(decode_in_chunks(wire, with_crc, {}), segments);
    // A CRC-protected FPDU also decodes for a receiver that does not check.
    if (with_crc) assert_matches(decode_in_chunks(wire, false, {}), segments);
    // Split once at a random point.
    assert_matches(decode_in_chunks(wire, with_crc, {split, wire.size()}), segments);
  }
}

TEST(RoundTripProperty, FpduOfEveryOpcodeWithCrcOnAndOff) {
  for (const RdmapOpcode op : kAllOpcodes) {
    const std::string name = "FPDU round trip, opcode " + std::to_string(static_cast<int>(op));
    EXPECT_TRUE(rc::check(name, [op] { fpdu_round_trip(op, std::nullopt); })) << name;
  }
}

TEST(RoundTripProperty, TerminateWithEveryCombinationOfCopiedHeaders) {
  for (const bool m : {false, true}) {
    for (const std::uint8_t d : {std::uint8_t{0}, std::uint8_t{kTaggedHeaderSize}, std::uint8_t{kUntaggedHeaderSize}}) {
      for (const bool r : {false, true}) {
        const TerminateShape shape{m, d, r};
        const std::string name = std::string("Terminate round trip, M=") + (m ? "1" : "0") +
                                 " D=" + std::to_string(d) + " R=" + (r ? "1" : "0");
        EXPECT_TRUE(rc::check(name, [shape] { fpdu_round_trip(RdmapOpcode::terminate, shape); })) << name;
      }
    }
  }
}

// ---------------------------------------------------------------------------------------
// Chunking invariance of FpduStreamDecoder.

RC_GTEST_PROP(RoundTripProperty, FpduStreamIsIndependentOfChunking, ()) {
  const std::size_t count = *rc::gen::inRange<std::size_t>(1, 17);
  std::vector<Segment> segments;
  for (std::size_t i = 0; i < count; ++i) segments.push_back(gen_any_segment(*rc::gen::element(std::size_t{8}, std::size_t{300}, std::size_t{1500})));
  const bool with_crc = *rc::gen::arbitrary<bool>();
  const Bytes wire = encode_segments(segments, with_crc);

  // (a) all at once
  const Decoded whole = decode_in_chunks(wire, with_crc, {});
  assert_matches(whole, segments);
  // (b) one byte at a time
  assert_same(decode_in_chunks(wire, with_crc, {1}), whole);
  // (c) random split points
  auto cuts = *rc::gen::container<std::vector<std::size_t>>(rc::gen::inRange<std::size_t>(0, wire.size() + 1));
  cuts.push_back(wire.size());
  std::sort(cuts.begin(), cuts.end());
  std::vector<std::size_t> sizes;
  std::size_t previous = 0;
  Collector collector(with_crc, false, 0);
  for (const std::size_t cut : cuts) {
    collector.feed(std::span(wire).subspan(previous, cut - previous));
    previous = cut;
  }
  assert_same(collector.decoded(), whole);
  // (c') many small random chunks, to hit every position inside headers and trailers
  const std::uint32_t seed = *rc::gen::arbitrary<std::uint32_t>();
  std::mt19937 rng(seed);
  std::uniform_int_distribution<std::size_t> small(1, 9);
  for (std::size_t i = 0; i < 64; ++i) sizes.push_back(small(rng));
  assert_same(decode_in_chunks(wire, with_crc, sizes), whole);
  // (d) zero-copy placement of every payload, fed in random chunks
  assert_same(decode_in_chunks(wire, with_crc, sizes, /*zero_copy=*/true, seed), whole);
  assert_same(decode_in_chunks(wire, with_crc, {}, /*zero_copy=*/true, seed), whole);
  // (e) `whole` events: all at once, every FPDU is one; in small chunks, the same segments
  Collector at_once(with_crc, false, 0, /*whole_events=*/true);
  at_once.feed(wire);
  assert_same(at_once.decoded(), whole);
  WIRE_CHECK(at_once.wholes() == segments.size());
  Collector chunked(with_crc, false, 0, /*whole_events=*/true);
  std::size_t at = 0;
  for (std::size_t i = 0; at < wire.size(); ++i) {
    const std::size_t n = std::min(wire.size() - at, sizes[i % sizes.size()]);
    chunked.feed(std::span(wire).subspan(at, n));
    at += n;
  }
  assert_same(chunked.decoded(), whole);
}

// Corrupting one byte of a CRC-protected stream never yields a different complete segment:
// every segment that completes is one of the originals, in order.
RC_GTEST_PROP(RoundTripProperty, CorruptionNeverDeliversAForgedSegment, ()) {
  const std::size_t count = *rc::gen::inRange<std::size_t>(1, 6);
  std::vector<Segment> segments;
  for (std::size_t i = 0; i < count; ++i) segments.push_back(gen_any_segment(200));
  Bytes wire = encode_segments(segments, true);
  const std::size_t at = *rc::gen::inRange<std::size_t>(0, wire.size());
  const int mask = *rc::gen::inRange<int>(1, 256);
  wire[at] = static_cast<std::uint8_t>(wire[at] ^ mask);
  const Decoded d = decode_in_chunks(wire, true, {});
  for (std::size_t i = 0; i < d.items.size(); ++i) {
    if (!d.items[i].ended) continue;
    RC_ASSERT(i < segments.size());
    RC_ASSERT(same_header(d.items[i].header, segments[i].header));
    RC_ASSERT(d.items[i].payload == segments[i].payload);
  }
  // The damaged FPDU itself never completes.
  std::size_t damaged = 0;
  for (std::size_t end = 0; damaged < segments.size(); ++damaged) {
    end += fpdu_wire_size(segment_header_size(segments[damaged].header) + segments[damaged].payload.size());
    if (at < end) break;
  }
  RC_ASSERT((d.items.size() <= damaged || !d.items[damaged].ended));
}

// ---------------------------------------------------------------------------------------
// MpaFrameReader: byte at a time vs all at once.

RC_GTEST_PROP(RoundTripProperty, MpaReaderByteByByteEqualsAllAtOnce, ()) {
  MpaFrame frame;
  frame.kind = *rc::gen::element(MpaFrameKind::request, MpaFrameKind::reply);
  frame.markers = *rc::gen::arbitrary<bool>();
  frame.crc = *rc::gen::arbitrary<bool>();
  frame.rejected = frame.kind == MpaFrameKind::reply && *rc::gen::arbitrary<bool>();
  frame.revision = *rc::gen::element(std::uint8_t{1}, std::uint8_t{2});
  if (frame.revision == 2 && *rc::gen::arbitrary<bool>()) {
    frame.enhanced = IrdOrdBlock{.peer_to_peer = *rc::gen::arbitrary<bool>(), .ird = gen_ird_ord(), .ord = gen_ird_ord()};
  }
  const Bytes pd = gen_bytes(frame.enhanced ? 508 : 512);
  frame.private_data = pd;
  Bytes stream(kMpaMaxFrameSize);
  const auto size = encode_mpa_frame(frame, stream);
  RC_ASSERT(size.has_value());
  stream.resize(*size);
  const Bytes trailing = gen_bytes(64);
  stream.insert(stream.end(), trailing.begin(), trailing.end());

  MpaFrameReader at_once(frame.kind);
  RC_ASSERT(at_once.feed(stream) == *size);
  RC_ASSERT(at_once.complete());

  MpaFrameReader bytewise(frame.kind);
  std::size_t taken = 0;
  for (std::size_t i = 0; i < stream.size(); ++i) {
    const std::size_t n = bytewise.feed(std::span(stream).subspan(i, 1));
    RC_ASSERT(n == (i < *size ? 1u : 0u));
    RC_ASSERT(bytewise.complete() == (i + 1 >= *size));
    taken += n;
  }
  RC_ASSERT(taken == *size);
  RC_ASSERT(same_frame(*bytewise.frame(), *at_once.frame()));
  RC_ASSERT(same_frame(*bytewise.frame(), frame));
}

// ---------------------------------------------------------------------------------------
// CM header.

RC_GTEST_PROP(RoundTripProperty, CmHeaderWithApplicationData, ()) {
  const CmHeader header{.flags = *rc::gen::element(std::uint8_t{0}, CmHeader::kFlagPeerToPeer),
                        .node_guid = *rc::gen::arbitrary<std::uint64_t>(),
                        .incarnation = *rc::gen::arbitrary<std::uint64_t>(),
                        .listen_port = *rc::gen::arbitrary<std::uint16_t>(),
                        .tag = *rc::gen::arbitrary<std::uint32_t>(),
                        .cmid = *rc::gen::arbitrary<std::uint32_t>()};
  const Bytes app = gen_bytes(kMpaMaxPrivateData - kIrdOrdBlockSize - kCmHeaderSize);
  Bytes pd(kCmHeaderSize);
  const auto written = encode_cm_header(header, pd);
  RC_ASSERT(written.has_value());
  RC_ASSERT(*written == kCmHeaderSize);
  pd.insert(pd.end(), app.begin(), app.end());

  const auto view = decode_cm_header(pd);
  RC_ASSERT(view.has_value());
  RC_ASSERT(view->header == header);
  RC_ASSERT(Bytes(view->application_data.begin(), view->application_data.end()) == app);

  // And through an enhanced MPA Request, as a connect request carries it.
  MpaFrame frame;
  frame.kind = MpaFrameKind::request;
  frame.revision = 2;
  frame.enhanced = IrdOrdBlock{.peer_to_peer = true, .ird = gen_ird_ord(), .ord = gen_ird_ord()};
  frame.private_data = pd;
  Bytes wire(kMpaMaxFrameSize);
  const auto size = encode_mpa_frame(frame, wire);
  RC_ASSERT(size.has_value());
  const auto mpa = decode_mpa_frame(std::span(wire).first(*size), MpaFrameKind::request);
  RC_ASSERT(mpa.has_value());
  const auto inner = decode_cm_header(mpa->private_data);
  RC_ASSERT(inner.has_value());
  RC_ASSERT(inner->header == header);
  RC_ASSERT(inner->application_data.size() == app.size());
}

}  // namespace
}  // namespace peercm::wire
