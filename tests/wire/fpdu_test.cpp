// FPDU framing (RFC 5044 §4): golden vectors from iwarp-wire.md §1.6 and §4.5, the
// incremental decoder (copying and zero-copy paths), padding/size helpers and MULPDU.
#include "wire/fpdu.hpp"

#include <gtest/gtest.h>

#include "hex_bytes.hpp"

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "wire/crc32c.hpp"
#include "wire/ddp_rdmap.hpp"

namespace peercm::wire {
namespace {

using test::Bytes;
using test::hex;


Bytes concat(Bytes a, const Bytes& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

bool same_header(const SegmentHeader& a, const SegmentHeader& b) {
  return a.opcode == b.opcode && a.last == b.last && a.stag == b.stag && a.tagged_offset == b.tagged_offset &&
         a.invalidate_stag == b.invalidate_stag && a.queue_number == b.queue_number && a.msn == b.msn &&
         a.message_offset == b.message_offset && a.read_request == b.read_request && a.terminate == b.terminate;
}

Bytes encode(const SegmentHeader& header, std::span<const std::uint8_t> payload, bool with_crc) {
  Bytes out(fpdu_wire_size(segment_header_size(header) + payload.size()));
  auto written = encode_fpdu(header, payload, with_crc, out);
  EXPECT_TRUE(written.has_value());
  if (written) {
    EXPECT_EQ(*written, out.size());
  }
  return out;
}

// One decoded segment.
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

// Runs `decoder` over `in` in chunks of `chunk` bytes (0: all at once), copying payload events.
Decoded decode(FpduStreamDecoder& decoder, std::span<const std::uint8_t> in, std::size_t chunk = 0) {
  Decoded out;
  if (chunk == 0) chunk = std::max<std::size_t>(in.size(), 1);
  for (std::size_t at = 0; at < in.size() && !out.error; at += chunk) {
    std::span<const std::uint8_t> rest = in.subspan(at, std::min(chunk, in.size() - at));
    for (;;) {
      std::size_t consumed = 0;
      const FpduEvent event = decoder.next(rest, consumed);
      EXPECT_LE(consumed, rest.size());
      rest = rest.subspan(std::min(consumed, rest.size()));
      if (event.kind == FpduEvent::Kind::need_more) {
        EXPECT_TRUE(rest.empty()) << "need_more left input unconsumed";
        break;
      }
      if (event.kind == FpduEvent::Kind::error) {
        out.error = event.error;
        break;
      }
      if (event.kind == FpduEvent::Kind::header) {
        out.items.push_back(Item{*event.header, event.payload_length, {}, false});
      } else if (event.kind == FpduEvent::Kind::payload) {
        EXPECT_FALSE(out.items.empty());
        if (out.items.empty()) break;
        out.items.back().payload.insert(out.items.back().payload.end(), event.payload.begin(), event.payload.end());
      } else {
        EXPECT_FALSE(out.items.empty());
        if (out.items.empty()) break;
        out.items.back().ended = true;
      }
    }
  }
  return out;
}

Decoded decode(std::span<const std::uint8_t> in, bool check_crc, std::size_t chunk = 0) {
  FpduStreamDecoder decoder(check_crc);
  return decode(decoder, in, chunk);
}

// ---------------------------------------------------------------------------------------
// Golden vectors (iwarp-wire.md §1.6 "Same Send without a Marker" and §4.5 RTR messages).

struct Golden {
  const char* name;
  SegmentHeader header;
  Bytes payload;
  Bytes wire;  // with CRC
};

SegmentHeader untagged(RdmapOpcode op, std::uint32_t qn, std::uint32_t msn) {
  SegmentHeader h;
  h.opcode = op;
  h.queue_number = qn;
  h.msn = msn;
  return h;
}

SegmentHeader tagged(RdmapOpcode op, std::uint32_t stag, std::uint64_t offset) {
  SegmentHeader h;
  h.opcode = op;
  h.stag = stag;
  h.tagged_offset = offset;
  return h;
}

std::vector<Golden> golden_vectors() {
  SegmentHeader read_rtr = untagged(RdmapOpcode::read_request, kQueueReadRequest, 1);
  read_rtr.read_request = ReadRequestHeader{.sink_stag = 0, .sink_offset = 0, .size = 0, .source_stag = 1, .source_offset = 0};
  return {
      {"send_24_zero_bytes_rfc5044_fig5_without_marker", untagged(RdmapOpcode::send, kQueueSend, 1), Bytes(24, 0),
       concat(hex("00 2a 41 43 00000000 00000000 00000001 00000000"),
              concat(Bytes(24, 0), hex("b7 24 3e c3")))},
      {"zero_length_write_rtr", tagged(RdmapOpcode::rdma_write, 1, 0), {},
       hex("00 0e c1 40 00 00 00 01 00 00 00 00 00 00 00 00 | eb d3 4c 5f")},
      {"zero_length_read_request_rtr", read_rtr, {},
       hex("00 2e 41 41 00000000 00000001 00000001 00000000"
           "00000000 0000000000000000 00000000 00000001 0000000000000000 | ba 10 e3 c9")},
      {"zero_length_read_response", tagged(RdmapOpcode::read_response, 0, 0), {},
       hex("00 0e c1 42 00000000 0000000000000000 | 69 75 d6 ca")},
      {"zero_length_send_rtr", untagged(RdmapOpcode::send, kQueueSend, 1), {},
       hex("00 12 41 43 00000000 00000000 00000001 00000000 | 58 7b e8 c4")},
  };
}

TEST(FpduGolden, EncodeMatchesByteForByte) {
  for (const Golden& g : golden_vectors()) {
    SCOPED_TRACE(g.name);
    EXPECT_EQ(encode(g.header, g.payload, /*with_crc=*/true), g.wire);
  }
}

TEST(FpduGolden, EncodeWithoutCrcDiffersOnlyInTheZeroedCrcField) {
  for (const Golden& g : golden_vectors()) {
    SCOPED_TRACE(g.name);
    Bytes expected = g.wire;
    std::fill(expected.end() - 4, expected.end(), std::uint8_t{0});
    EXPECT_EQ(encode(g.header, g.payload, /*with_crc=*/false), expected);
  }
}

TEST(FpduGolden, DecodeAllAtOnceAndByteByByte) {
  for (const Golden& g : golden_vectors()) {
    for (const std::size_t chunk : {std::size_t{0}, std::size_t{1}, std::size_t{3}}) {
      SCOPED_TRACE(std::string(g.name) + " chunk " + std::to_string(chunk));
      const Decoded d = decode(g.wire, /*check_crc=*/true, chunk);
      EXPECT_FALSE(d.error.has_value());
      ASSERT_EQ(d.items.size(), 1u);
      EXPECT_TRUE(same_header(d.items[0].header, g.header));
      EXPECT_EQ(d.items[0].payload_length, g.payload.size());
      EXPECT_EQ(d.items[0].payload, g.payload);
      EXPECT_TRUE(d.items[0].ended);
    }
  }
}

TEST(FpduGolden, ConcatenatedGoldenVectorsDecodeInOrder) {
  Bytes stream;
  const auto vectors = golden_vectors();
  for (const Golden& g : vectors) stream = concat(stream, g.wire);
  const Decoded d = decode(stream, /*check_crc=*/true, 5);
  EXPECT_FALSE(d.error.has_value());
  ASSERT_EQ(d.items.size(), vectors.size());
  for (std::size_t i = 0; i < vectors.size(); ++i) {
    EXPECT_TRUE(same_header(d.items[i].header, vectors[i].header)) << vectors[i].name;
    EXPECT_TRUE(d.items[i].ended);
  }
}

TEST(FpduGolden, Rfc5044Figure5CrcCoversTheLeadingMarker) {
  // RFC 5044 Fig. 5: Marker (FPDUPTR 0) + the Send above; CRC value 0x83992352.
  const Bytes fpdu = encode(untagged(RdmapOpcode::send, kQueueSend, 1), Bytes(24, 0), true);
  Bytes covered = concat(Bytes(4, 0), Bytes(fpdu.begin(), fpdu.end() - 4));
  EXPECT_EQ(crc32c(covered), 0x83992352u);
}

TEST(FpduGolden, NoSingleBitFlipYieldsACompletedSegment) {
  for (const Golden& g : golden_vectors()) {
    for (std::size_t byte = 0; byte < g.wire.size(); ++byte) {
      for (int bit = 0; bit < 8; ++bit) {
        Bytes broken = g.wire;
        broken[byte] = static_cast<std::uint8_t>(broken[byte] ^ (1 << bit));
        const Decoded d = decode(broken, /*check_crc=*/true);
        // Either an error, or (a longer ULPDU_Length) still waiting for bytes: never an `end`.
        const bool ended = !d.items.empty() && d.items.back().ended;
        EXPECT_FALSE(ended) << g.name << ": flipped bit " << bit << " of byte " << byte;
      }
    }
  }
}

// Hand-built FPDU with 3 pad bytes, CRC computed independently with crc32c().
TEST(FpduEncode, PaddingAndLittleEndianCrcPlacement) {
  SegmentHeader h = untagged(RdmapOpcode::send_solicited, kQueueSend, 7);
  h.message_offset = 0x10;
  const Bytes payload = {0xAB};
  Bytes expected = hex("00 13 41 45 00000000 00000000 00000007 00000010 ab 000000");
  ASSERT_EQ(expected.size(), 24u);
  const std::uint32_t crc = crc32c(expected);
  for (int i = 0; i < 4; ++i) expected.push_back(static_cast<std::uint8_t>(crc >> (8 * i)));
  EXPECT_EQ(encode(h, payload, true), expected);
  const Decoded d = decode(expected, true, 1);
  EXPECT_FALSE(d.error.has_value());
  ASSERT_EQ(d.items.size(), 1u);
  EXPECT_EQ(d.items[0].payload, payload);
  EXPECT_TRUE(d.items[0].ended);
}

TEST(FpduEncode, BufferTooSmall) {
  const SegmentHeader h = untagged(RdmapOpcode::send, kQueueSend, 1);
  const Bytes payload(10, 0x11);
  Bytes out(fpdu_wire_size(kUntaggedHeaderSize + payload.size()) - 1);
  auto written = encode_fpdu(h, payload, true, out);
  ASSERT_FALSE(written.has_value());
  EXPECT_EQ(written.error(), WireError::buffer_too_small);
}

TEST(FpduEncode, LargestUlpduFitsAndOneMoreIsRefused) {
  const SegmentHeader h = untagged(RdmapOpcode::send, kQueueSend, 1);
  Bytes payload(kMaxUlpduLength - kUntaggedHeaderSize, 0x5C);
  const Bytes wire = encode(h, payload, true);
  ASSERT_EQ(wire.size(), fpdu_wire_size(kMaxUlpduLength));
  EXPECT_EQ(wire[0], 0xFF);
  EXPECT_EQ(wire[1], 0xFF);
  const Decoded d = decode(wire, true);
  EXPECT_FALSE(d.error.has_value());
  ASSERT_EQ(d.items.size(), 1u);
  EXPECT_EQ(d.items[0].payload, payload);

  payload.push_back(0);
  Bytes out(fpdu_wire_size(kMaxUlpduLength) + 8);
  auto too_long = encode_fpdu(h, payload, true, out);
  ASSERT_FALSE(too_long.has_value());
  EXPECT_EQ(too_long.error(), WireError::fpdu_ulpdu_too_long);
}

TEST(FpduFramer, PiecewisePayloadEqualsEncodeFpdu) {
  SegmentHeader h = tagged(RdmapOpcode::rdma_write, 0x1234, 0x10000);
  h.last = false;
  Bytes payload(101);
  for (std::size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<std::uint8_t>(i * 7);
  FpduFramer framer;
  ASSERT_TRUE(framer.begin(h, payload.size()).has_value());
  EXPECT_EQ(framer.prefix().size(), kUlpduLengthSize + kTaggedHeaderSize);
  Bytes wire(framer.prefix().begin(), framer.prefix().end());
  const std::span<const std::uint8_t> all(payload);
  framer.add_payload(all.first(40));
  framer.add_payload(all.subspan(40, 1));
  framer.add_payload(all.subspan(41));
  wire = concat(wire, payload);
  const auto trailer = framer.finish(true);
  EXPECT_EQ(trailer.size(), fpdu_padding(kTaggedHeaderSize + payload.size()) + kFpduCrcSize);
  wire.insert(wire.end(), trailer.begin(), trailer.end());
  EXPECT_EQ(wire, encode(h, payload, true));
}

TEST(FpduFramer, ReusedFramerStartsAFreshCrc) {
  FpduFramer framer;
  const SegmentHeader h = untagged(RdmapOpcode::send, kQueueSend, 1);
  ASSERT_TRUE(framer.begin(h, 3).has_value());
  const Bytes junk = {1, 2, 3};
  framer.add_payload(junk);
  (void)framer.finish(true);
  ASSERT_TRUE(framer.begin(h, 0).has_value());
  const auto trailer = framer.finish(true);
  const Bytes golden = golden_vectors()[4].wire;
  EXPECT_TRUE(std::equal(trailer.begin(), trailer.end(), golden.end() - 4, golden.end()));
}

TEST(FpduFramer, RefusesAnUnencodableHeader) {
  SegmentHeader h = untagged(RdmapOpcode::terminate, kQueueTerminate, 1);
  h.terminate.ddp_header_length = 10;
  FpduFramer framer;
  auto status = framer.begin(h, 0);
  ASSERT_FALSE(status.has_value());
  EXPECT_EQ(status.error(), WireError::rdmap_bad_terminate);
}

// ---------------------------------------------------------------------------------------
// Decoder behaviour.

TEST(FpduDecoder, CrcOffIgnoresTheCrcField) {
  Bytes wire = golden_vectors()[0].wire;
  wire[wire.size() - 1] ^= 0xFF;
  EXPECT_FALSE(decode(wire, /*check_crc=*/false).error.has_value());
  const Decoded checked = decode(wire, /*check_crc=*/true);
  ASSERT_TRUE(checked.error.has_value());
  EXPECT_EQ(*checked.error, WireError::fpdu_bad_crc);
}

TEST(FpduDecoder, HeaderEventReportsPayloadLengthBeforeAnyPayloadArrives) {
  const Bytes payload(100, 0x42);
  const Bytes wire = encode(untagged(RdmapOpcode::send_invalidate, kQueueSend, 3), payload, true);
  FpduStreamDecoder decoder(true);
  std::size_t consumed = 0;
  const FpduEvent event = decoder.next(std::span(wire).first(kUlpduLengthSize + kUntaggedHeaderSize), consumed);
  EXPECT_EQ(event.kind, FpduEvent::Kind::header);
  EXPECT_EQ(consumed, kUlpduLengthSize + kUntaggedHeaderSize);
  EXPECT_EQ(event.payload_length, payload.size());
  EXPECT_TRUE(decoder.in_payload());
  EXPECT_EQ(decoder.payload_remaining(), payload.size());
}

TEST(FpduDecoder, PayloadEventsAreViewsIntoTheCallersInput) {
  const Bytes payload(64, 0x99);
  const Bytes wire = encode(untagged(RdmapOpcode::send, kQueueSend, 1), payload, true);
  FpduStreamDecoder decoder(true);
  std::size_t consumed = 0;
  std::span<const std::uint8_t> rest(wire);
  FpduEvent event = decoder.next(rest, consumed);
  ASSERT_EQ(event.kind, FpduEvent::Kind::header);
  rest = rest.subspan(consumed);
  event = decoder.next(rest, consumed);
  ASSERT_EQ(event.kind, FpduEvent::Kind::payload);
  EXPECT_EQ(event.payload.data(), rest.data());
  EXPECT_EQ(event.payload.size(), payload.size());
  EXPECT_FALSE(decoder.in_payload());
  rest = rest.subspan(consumed);
  event = decoder.next(rest, consumed);
  EXPECT_EQ(event.kind, FpduEvent::Kind::end);
  EXPECT_EQ(consumed, rest.size());
}

TEST(FpduDecoder, EmptyInputNeedsMore) {
  FpduStreamDecoder decoder(true);
  std::size_t consumed = 99;
  const FpduEvent event = decoder.next({}, consumed);
  EXPECT_EQ(event.kind, FpduEvent::Kind::need_more);
  EXPECT_EQ(consumed, 0u);
  EXPECT_FALSE(decoder.failed());
}

TEST(FpduDecoder, MaxUlpduIsInclusive) {
  const Bytes payload(46, 1);
  const Bytes wire = encode(untagged(RdmapOpcode::send, kQueueSend, 1), payload, true);  // ULPDU 64
  FpduStreamDecoder at_limit(true, 64);
  EXPECT_FALSE(decode(at_limit, wire).error.has_value());
  FpduStreamDecoder below(true, 63);
  const Decoded d = decode(below, wire);
  ASSERT_TRUE(d.error.has_value());
  EXPECT_EQ(*d.error, WireError::fpdu_ulpdu_too_long);
  EXPECT_TRUE(d.items.empty());
}

TEST(FpduDecoder, CrcCheckCanBeSwitchedOffBetweenFpdus) {
  Bytes bad = golden_vectors()[4].wire;
  bad[bad.size() - 2] ^= 0x10;
  const Bytes stream = concat(golden_vectors()[1].wire, bad);
  FpduStreamDecoder decoder(true);
  const Decoded first = decode(decoder, std::span(stream).first(golden_vectors()[1].wire.size()));
  EXPECT_EQ(first.items.size(), 1u);
  decoder.set_check_crc(false);
  const Decoded second = decode(decoder, std::span(stream).subspan(golden_vectors()[1].wire.size()));
  EXPECT_FALSE(second.error.has_value());
  ASSERT_EQ(second.items.size(), 1u);
  EXPECT_TRUE(second.items[0].ended);
}

// ---------------------------------------------------------------------------------------
// Zero-copy path: payload received straight into the target, reported with payload_placed().

struct ZeroCopyResult {
  Bytes target;
  FpduEvent last;
};

ZeroCopyResult zero_copy(const Bytes& wire, bool check_crc, std::size_t piece) {
  ZeroCopyResult r;
  FpduStreamDecoder decoder(check_crc);
  std::size_t consumed = 0;
  std::span<const std::uint8_t> rest(wire);
  r.last = decoder.next(rest, consumed);
  EXPECT_EQ(r.last.kind, FpduEvent::Kind::header);
  if (r.last.kind != FpduEvent::Kind::header) return r;
  rest = rest.subspan(consumed);
  EXPECT_TRUE(decoder.in_payload());
  EXPECT_EQ(decoder.payload_remaining(), r.last.payload_length);
  // Our own "recv" into the target buffer, in pieces.
  r.target.resize(decoder.payload_remaining());
  std::size_t placed = 0;
  while (decoder.payload_remaining() > 0) {
    const std::size_t n = std::min(piece, decoder.payload_remaining());
    std::copy_n(rest.begin(), n, r.target.begin() + static_cast<std::ptrdiff_t>(placed));
    decoder.payload_placed(std::span(r.target).subspan(placed, n));
    rest = rest.subspan(n);
    placed += n;
    EXPECT_EQ(decoder.payload_remaining(), r.target.size() - placed);
  }
  EXPECT_FALSE(decoder.in_payload());
  r.last = decoder.next(rest, consumed);
  EXPECT_EQ(consumed, rest.size());
  return r;
}

TEST(FpduZeroCopy, PlacedPayloadEndsWithVerifiedCrc) {
  Bytes payload(1001);
  for (std::size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<std::uint8_t>(i ^ 0x5A);
  const Bytes wire = encode(tagged(RdmapOpcode::read_response, 0xCAFE, 0x2000), payload, true);
  for (const std::size_t piece : {std::size_t{1}, std::size_t{7}, std::size_t{4096}}) {
    SCOPED_TRACE(piece);
    const ZeroCopyResult r = zero_copy(wire, true, piece);
    EXPECT_EQ(r.last.kind, FpduEvent::Kind::end);
    EXPECT_EQ(r.target, payload);
  }
}

TEST(FpduZeroCopy, CorruptedPayloadIsCaughtByTheCrc) {
  const Bytes payload(333, 0x77);
  Bytes wire = encode(untagged(RdmapOpcode::send_solicited_invalidate, kQueueSend, 9), payload, true);
  wire[kUlpduLengthSize + kUntaggedHeaderSize + 200] ^= 0x04;
  const ZeroCopyResult r = zero_copy(wire, true, 50);
  EXPECT_EQ(r.last.kind, FpduEvent::Kind::error);
  EXPECT_EQ(r.last.error, WireError::fpdu_bad_crc);
  // With CRC off the same bytes pass.
  const ZeroCopyResult unchecked = zero_copy(wire, false, 50);
  EXPECT_EQ(unchecked.last.kind, FpduEvent::Kind::end);
}

TEST(FpduZeroCopy, PlacedBeyondTheSegmentIsClamped) {
  const Bytes payload(10, 0x01);
  const Bytes wire = encode(untagged(RdmapOpcode::send, kQueueSend, 1), payload, true);
  FpduStreamDecoder decoder(true);
  std::size_t consumed = 0;
  std::span<const std::uint8_t> rest(wire);
  ASSERT_EQ(decoder.next(rest, consumed).kind, FpduEvent::Kind::header);
  rest = rest.subspan(consumed);
  // The caller hands over more than the segment holds: only the segment's bytes count.
  decoder.payload_placed(rest.first(payload.size() + 2));
  EXPECT_EQ(decoder.payload_remaining(), 0u);
  rest = rest.subspan(payload.size());
  EXPECT_EQ(decoder.next(rest, consumed).kind, FpduEvent::Kind::end);
}

TEST(FpduZeroCopy, PayloadPlacedOutsideAPayloadDoesNothing) {
  const Bytes stream = concat(golden_vectors()[1].wire, golden_vectors()[0].wire);
  FpduStreamDecoder decoder(true);
  // Before anything arrived, after the header of a zero-length segment, and after its end:
  // an empty payload_placed() (a natural "place payload_remaining() bytes" loop) is harmless.
  decoder.payload_placed({});
  std::size_t consumed = 0;
  std::span<const std::uint8_t> rest(stream);
  FpduEvent event = decoder.next(rest, consumed);
  ASSERT_EQ(event.kind, FpduEvent::Kind::header);
  rest = rest.subspan(consumed);
  decoder.payload_placed({});
  event = decoder.next(rest, consumed);
  ASSERT_EQ(event.kind, FpduEvent::Kind::end);
  rest = rest.subspan(consumed);
  decoder.payload_placed({});
  const Decoded d = decode(decoder, rest);
  EXPECT_FALSE(d.error.has_value());
  ASSERT_EQ(d.items.size(), 1u);
  EXPECT_EQ(d.items[0].payload, Bytes(24, 0));
  EXPECT_TRUE(d.items[0].ended);
}

// ---------------------------------------------------------------------------------------
// Size helpers and MULPDU (iwarp-wire.md §1.6, §1.7).

TEST(FpduSizes, PaddingTable) {
  // pad = (4 - ((2 + len) mod 4)) mod 4
  EXPECT_EQ(fpdu_padding(0), 2u);
  EXPECT_EQ(fpdu_padding(1), 1u);
  EXPECT_EQ(fpdu_padding(2), 0u);
  EXPECT_EQ(fpdu_padding(3), 3u);
  EXPECT_EQ(fpdu_padding(14), 0u);
  EXPECT_EQ(fpdu_padding(18), 0u);
  EXPECT_EQ(fpdu_padding(19), 3u);
  EXPECT_EQ(fpdu_padding(42), 0u);
  EXPECT_EQ(fpdu_padding(46), 0u);
  EXPECT_EQ(fpdu_padding(1454), 0u);
}

TEST(FpduSizes, WireSizeIsAlwaysAlignedAndMinimal) {
  EXPECT_EQ(fpdu_wire_size(0), 8u);
  EXPECT_EQ(fpdu_wire_size(14), 20u);
  EXPECT_EQ(fpdu_wire_size(18), 24u);
  EXPECT_EQ(fpdu_wire_size(42), 48u);
  EXPECT_EQ(fpdu_wire_size(1454), 1460u);
  for (std::size_t len = 0; len <= kMaxUlpduLength; ++len) {
    const std::size_t pad = fpdu_padding(len);
    ASSERT_LT(pad, 4u) << len;
    ASSERT_EQ(fpdu_wire_size(len), 2 + len + pad + 4) << len;
    ASSERT_EQ(fpdu_wire_size(len) % 4, 0u) << len;
  }
}

TEST(Mulpdu, Emss1460Gives1454) { EXPECT_EQ(mulpdu_for_emss(1460), 1454u); }

TEST(Mulpdu, KnownValues) {
  EXPECT_EQ(mulpdu_for_emss(1461), 1454u);
  EXPECT_EQ(mulpdu_for_emss(1463), 1454u);
  EXPECT_EQ(mulpdu_for_emss(1464), 1458u);
  EXPECT_EQ(mulpdu_for_emss(8960), 8954u);
  EXPECT_EQ(mulpdu_for_emss(136), 130u);
}

TEST(Mulpdu, ClampsToTheRfcRange) {
  for (const std::size_t emss : std::initializer_list<std::size_t>{0, 1, 5, 6, 7, 8, 9, 100, 133, 134, 135}) {
    EXPECT_EQ(mulpdu_for_emss(emss), kMinMulpdu) << emss;
  }
  EXPECT_EQ(mulpdu_for_emss(64774), 64766u);
  EXPECT_EQ(mulpdu_for_emss(64776), kMaxMulpdu);
  EXPECT_EQ(mulpdu_for_emss(65535), kMaxMulpdu);
  EXPECT_EQ(mulpdu_for_emss(1u << 20), kMaxMulpdu);
}

TEST(Mulpdu, MatchesTheFormulaForEveryEmss) {
  for (std::size_t emss = 0; emss <= 70000; ++emss) {
    const long long raw = static_cast<long long>(emss) - (6 + static_cast<long long>(emss % 4));
    const std::size_t expected = static_cast<std::size_t>(
        std::clamp(raw, static_cast<long long>(kMinMulpdu), static_cast<long long>(kMaxMulpdu)));
    const std::size_t mulpdu = mulpdu_for_emss(emss);
    ASSERT_EQ(mulpdu, expected) << "emss " << emss;
    // An unclamped MULPDU makes an FPDU that exactly fills the aligned part of a segment.
    if (raw >= static_cast<long long>(kMinMulpdu) && raw <= static_cast<long long>(kMaxMulpdu)) {
      ASSERT_EQ(fpdu_wire_size(mulpdu), emss - emss % 4) << "emss " << emss;
    }
  }
}

}  // namespace
}  // namespace peercm::wire
