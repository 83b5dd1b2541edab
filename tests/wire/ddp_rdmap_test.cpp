// DDP segment headers (RFC 5041 §5) and RDMAP headers (RFC 5040 §4): exact byte layouts
// from iwarp-wire.md §2-§3, opcode predicates and the header-size peek.
#include "wire/ddp_rdmap.hpp"

#include <gtest/gtest.h>

#include "hex_bytes.hpp"

#include <array>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace peercm::wire {
namespace {

using test::Bytes;
using test::hex;


bool same_header(const SegmentHeader& a, const SegmentHeader& b) {
  return a.opcode == b.opcode && a.last == b.last && a.stag == b.stag && a.tagged_offset == b.tagged_offset &&
         a.invalidate_stag == b.invalidate_stag && a.queue_number == b.queue_number && a.msn == b.msn &&
         a.message_offset == b.message_offset && a.read_request == b.read_request && a.terminate == b.terminate;
}

Bytes encode(const SegmentHeader& h) {
  Bytes out(segment_header_size(h));
  auto written = encode_segment_header(h, out);
  EXPECT_TRUE(written.has_value());
  if (written) {
    EXPECT_EQ(*written, out.size());
  }
  return out;
}

constexpr std::array<RdmapOpcode, 8> kAllOpcodes = {
    RdmapOpcode::rdma_write,    RdmapOpcode::read_request,   RdmapOpcode::read_response,
    RdmapOpcode::send,          RdmapOpcode::send_invalidate, RdmapOpcode::send_solicited,
    RdmapOpcode::send_solicited_invalidate, RdmapOpcode::terminate};

TEST(DdpRdmapConstants, HeaderSizes) {
  EXPECT_EQ(kTaggedHeaderSize, 14u);
  EXPECT_EQ(kUntaggedHeaderSize, 18u);
  EXPECT_EQ(kReadRequestHeaderSize, 28u);
  EXPECT_EQ(kReadRequestUlpduSize, 46u);
  EXPECT_EQ(kMaxTerminateUlpduSize, 18u + 4u + 2u + 18u + 28u);
}

// iwarp-wire.md §3.1 table: T, QN, and the predicates.
TEST(DdpRdmapOpcodes, PredicatesAndQueues) {
  struct Row {
    RdmapOpcode op;
    bool tagged, send, invalidate, solicited;
    std::uint32_t qn;
  };
  const Row rows[] = {
      {RdmapOpcode::rdma_write, true, false, false, false, 0},
      {RdmapOpcode::read_request, false, false, false, false, 1},
      {RdmapOpcode::read_response, true, false, false, false, 0},
      {RdmapOpcode::send, false, true, false, false, 0},
      {RdmapOpcode::send_invalidate, false, true, true, false, 0},
      {RdmapOpcode::send_solicited, false, true, false, true, 0},
      {RdmapOpcode::send_solicited_invalidate, false, true, true, true, 0},
      {RdmapOpcode::terminate, false, false, false, false, 2},
  };
  for (const Row& r : rows) {
    SCOPED_TRACE(static_cast<int>(r.op));
    EXPECT_EQ(is_tagged(r.op), r.tagged);
    EXPECT_EQ(is_send(r.op), r.send);
    EXPECT_EQ(carries_invalidate(r.op), r.invalidate);
    EXPECT_EQ(is_solicited(r.op), r.solicited);
    if (!r.tagged) {
      EXPECT_EQ(queue_number_for(r.op), r.qn);
    }
  }
}

// "typical ctrl word (L=1)" column of iwarp-wire.md §3.1; L=0 clears 0x4000.
TEST(DdpRdmapEncode, ControlWordsForEveryOpcode) {
  const std::uint16_t words[] = {0xC140, 0x4141, 0xC142, 0x4143, 0x4144, 0x4145, 0x4146, 0x4147};
  for (std::size_t i = 0; i < kAllOpcodes.size(); ++i) {
    SegmentHeader h;
    h.opcode = kAllOpcodes[i];
    h.queue_number = is_tagged(h.opcode) ? 0 : queue_number_for(h.opcode);
    const Bytes bytes = encode(h);
    ASSERT_GE(bytes.size(), 2u);
    EXPECT_EQ((bytes[0] << 8) | bytes[1], words[i]) << i;
    if (h.opcode != RdmapOpcode::read_request && h.opcode != RdmapOpcode::terminate) {
      h.last = false;
      const Bytes middle = encode(h);
      EXPECT_EQ((middle[0] << 8) | middle[1], words[i] & ~0x4000) << i;
    }
  }
}

TEST(DdpRdmapEncode, TaggedLayout) {
  SegmentHeader h;
  h.opcode = RdmapOpcode::rdma_write;
  h.last = false;
  h.stag = 0x11223344;
  h.tagged_offset = 0x0102030405060708;
  h.msn = 77;  // untagged fields are not on the wire of a tagged segment
  EXPECT_EQ(encode(h), hex("81 40 11223344 0102030405060708"));
}

TEST(DdpRdmapEncode, UntaggedLayoutWithInvalidateStag) {
  SegmentHeader h;
  h.opcode = RdmapOpcode::send_solicited_invalidate;
  h.invalidate_stag = 0xA1B2C3D4;
  h.queue_number = 0;
  h.msn = 0x01020304;
  h.message_offset = 0x0000FFEE;
  EXPECT_EQ(encode(h), hex("41 46 A1B2C3D4 00000000 01020304 0000FFEE"));
}

TEST(DdpRdmapEncode, PlainSendSendsZeroInTheInvalidateSlot) {
  for (const RdmapOpcode op : {RdmapOpcode::send, RdmapOpcode::send_solicited}) {
    SegmentHeader h;
    h.opcode = op;
    h.invalidate_stag = 0xFFFFFFFF;
    h.msn = 1;
    const Bytes bytes = encode(h);
    EXPECT_EQ(Bytes(bytes.begin() + 2, bytes.begin() + 6), Bytes(4, 0));
  }
}

// iwarp-wire.md §3.3: sink STag at ULPDU 18, sink TO 22, size 30, source STag 34, source TO 38.
TEST(DdpRdmapEncode, ReadRequestLayout) {
  SegmentHeader h;
  h.opcode = RdmapOpcode::read_request;
  h.queue_number = kQueueReadRequest;
  h.msn = 5;
  h.read_request = ReadRequestHeader{.sink_stag = 0x0A0B0C0D,
                                     .sink_offset = 0x1112131415161718,
                                     .size = 0x00100000,
                                     .source_stag = 0xDEADBEEF,
                                     .source_offset = 0x2122232425262728};
  EXPECT_EQ(encode(h), hex("41 41 00000000 00000001 00000005 00000000"
                           "0A0B0C0D 1112131415161718 00100000 DEADBEEF 2122232425262728"));
}

// iwarp-wire.md §3.8: layer/type, code, HdrCt (M 0x80, D 0x40, R 0x20), reserved, then the
// optional segment length, copied DDP header and copied Read Request header.
TEST(DdpRdmapEncode, TerminateWithoutCopiedHeaders) {
  SegmentHeader h;
  h.opcode = RdmapOpcode::terminate;
  h.queue_number = kQueueTerminate;
  h.msn = 1;
  h.terminate.code = TerminateCode{TerminateLayer::llp, 0x0, 0x02};
  EXPECT_EQ(encode(h), hex("41 47 00000000 00000002 00000001 00000000 | 20 02 00 00"));
}

TEST(DdpRdmapEncode, TerminateWithAllCopiedHeaders) {
  SegmentHeader h;
  h.opcode = RdmapOpcode::terminate;
  h.queue_number = kQueueTerminate;
  h.msn = 1;
  TerminateHeader& t = h.terminate;
  t.code = TerminateCode{TerminateLayer::rdmap, 0x1, 0x00};
  t.segment_length_valid = true;
  t.ddp_segment_length = 46;
  t.ddp_header_length = kUntaggedHeaderSize;
  const Bytes copied = hex("41 41 00000000 00000001 00000002 00000000");
  std::copy(copied.begin(), copied.end(), t.ddp_header.begin());
  t.has_rdma_header = true;
  for (std::size_t i = 0; i < t.rdma_header.size(); ++i) t.rdma_header[i] = static_cast<std::uint8_t>(i + 1);
  const Bytes bytes = encode(h);
  ASSERT_EQ(bytes.size(), kMaxTerminateUlpduSize);
  EXPECT_EQ(Bytes(bytes.begin() + 18, bytes.begin() + 24), hex("01 00 e0 00 002e"));
  EXPECT_EQ(Bytes(bytes.begin() + 24, bytes.begin() + 42), copied);
  EXPECT_EQ(bytes[42], 1);
  EXPECT_EQ(bytes.back(), 28);
}

TEST(DdpRdmapEncode, TerminateWithTaggedCopyAndNoLengthValidFlag) {
  SegmentHeader h;
  h.opcode = RdmapOpcode::terminate;
  h.queue_number = kQueueTerminate;
  h.msn = 1;
  TerminateHeader& t = h.terminate;
  t.code = TerminateCode{TerminateLayer::ddp, 0x1, 0x01};
  t.ddp_segment_length = 0x1234;  // present because D is set, although M is clear
  t.ddp_header_length = kTaggedHeaderSize;
  const Bytes copied = hex("c1 40 00000007 0000000000001000");
  std::copy(copied.begin(), copied.end(), t.ddp_header.begin());
  EXPECT_EQ(encode(h), hex("41 47 00000000 00000002 00000001 00000000 | 11 01 40 00 1234 "
                           "c1 40 00000007 0000000000001000"));
}

// "DDP Segment Length ... present if D; valid if M" (iwarp-wire.md §3.8): M alone adds no field.
TEST(DdpRdmapEncode, TerminateLengthValidWithoutCopiedHeaderAddsNoField) {
  SegmentHeader h;
  h.opcode = RdmapOpcode::terminate;
  h.queue_number = kQueueTerminate;
  h.msn = 1;
  h.terminate.code = TerminateCode{TerminateLayer::ddp, 0x2, 0x05};
  h.terminate.segment_length_valid = true;
  EXPECT_EQ(segment_header_size(h), kUntaggedHeaderSize + kTerminateFixedSize);
  const Bytes bytes = encode(h);
  EXPECT_EQ(bytes, hex("41 47 00000000 00000002 00000001 00000000 | 12 05 80 00"));
  auto decoded = decode_segment_header(bytes, bytes.size());
  ASSERT_TRUE(decoded.has_value());
  EXPECT_TRUE(decoded->terminate.segment_length_valid);
  EXPECT_EQ(decoded->terminate.ddp_header_length, 0);
}

TEST(DdpRdmapEncode, Errors) {
  SegmentHeader h;
  Bytes small(kUntaggedHeaderSize - 1);
  auto r = encode_segment_header(h, small);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error(), WireError::buffer_too_small);

  Bytes out(kMaxSegmentHeaderSize);
  h.opcode = static_cast<RdmapOpcode>(8);
  r = encode_segment_header(h, out);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error(), WireError::rdmap_unknown_opcode);

  h.opcode = RdmapOpcode::terminate;
  h.terminate.ddp_header_length = 10;
  r = encode_segment_header(h, out);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error(), WireError::rdmap_bad_terminate);
}

// ---------------------------------------------------------------------------------------
// Decoding.

TEST(DdpRdmapDecode, EncodedHeadersDecodeToThemselves) {
  for (const RdmapOpcode op : kAllOpcodes) {
    SCOPED_TRACE(static_cast<int>(op));
    SegmentHeader h;
    h.opcode = op;
    if (is_tagged(op)) {
      h.stag = 0x55;
      h.tagged_offset = 0xFFFFFFFFFFFFFFF0;
    } else {
      h.queue_number = queue_number_for(op);
      h.msn = 0xFFFFFFFF;
      if (carries_invalidate(op)) h.invalidate_stag = 0x99;
      if (op == RdmapOpcode::read_request) h.read_request.size = 4096;
      if (op == RdmapOpcode::terminate) h.terminate.code = TerminateCode{TerminateLayer::rdmap, 2, 6};
    }
    const Bytes bytes = encode(h);
    auto decoded =
        decode_segment_header(bytes, bytes.size() + (is_tagged(op) || is_send(op) ? std::size_t{100} : std::size_t{0}));
    ASSERT_TRUE(decoded.has_value()) << to_string(decoded.error());
    EXPECT_TRUE(same_header(*decoded, h));
  }
}

TEST(DdpRdmapDecode, ReservedBitsAreIgnored) {
  // DDP reserved 0x3C and RDMAP reserved 0x30: "send 0, don't check".
  const Bytes bytes = hex("7d 73 00000000 00000000 00000001 00000000");
  auto decoded = decode_segment_header(bytes, bytes.size());
  ASSERT_TRUE(decoded.has_value());
  EXPECT_EQ(decoded->opcode, RdmapOpcode::send);
  EXPECT_TRUE(decoded->last);
}

TEST(DdpRdmapDecode, InvalidateSlotIgnoredForOpcodesWithoutInvalidate) {
  const Bytes bytes = hex("41 43 12345678 00000000 00000001 00000000");
  auto decoded = decode_segment_header(bytes, bytes.size());
  ASSERT_TRUE(decoded.has_value());
  EXPECT_EQ(decoded->invalidate_stag, 0u);
  const Bytes with_inv = hex("41 44 12345678 00000000 00000001 00000000");
  decoded = decode_segment_header(with_inv, with_inv.size());
  ASSERT_TRUE(decoded.has_value());
  EXPECT_EQ(decoded->invalidate_stag, 0x12345678u);
}

TEST(DdpRdmapDecode, TerminateAcceptsZeroFilledTrailer) {
  // No HdrCt flags, but the peer zero-fills the header fields (iwarp-wire.md §3.8).
  Bytes bytes = hex("41 47 00000000 00000002 00000001 00000000 | 12 06 00 00");
  bytes.resize(kMaxTerminateUlpduSize, 0);
  auto decoded = decode_segment_header(bytes, bytes.size());
  ASSERT_TRUE(decoded.has_value());
  const TerminateHeader& t = decoded->terminate;
  EXPECT_EQ(t.code, (TerminateCode{TerminateLayer::ddp, 2, 6}));
  EXPECT_FALSE(t.segment_length_valid);
  EXPECT_EQ(t.ddp_header_length, 0);
  EXPECT_FALSE(t.has_rdma_header);
}

TEST(DdpRdmapDecode, TerminateCopiedHeaderLengthFollowsItsTaggedBit) {
  Bytes tagged = hex("41 47 00000000 00000002 00000001 00000000 | 11 00 40 00 0020 "
                     "c1 40 00000009 0000000000000040");
  auto decoded = decode_segment_header(tagged, tagged.size());
  ASSERT_TRUE(decoded.has_value());
  EXPECT_EQ(decoded->terminate.ddp_header_length, kTaggedHeaderSize);
  EXPECT_EQ(decoded->terminate.ddp_segment_length, 0x20);
  EXPECT_EQ(decoded->terminate.ddp_header[5], 0x09);
  EXPECT_EQ(decoded->terminate.ddp_header[14], 0);
}

TEST(DdpRdmapDecode, TruncatedBytes) {
  const Bytes bytes = hex("41 43 00000000 00000000 00000001 00000000");
  for (std::size_t n = 0; n < bytes.size(); ++n) {
    auto decoded = decode_segment_header(std::span(bytes).first(n), bytes.size());
    ASSERT_FALSE(decoded.has_value()) << n;
    EXPECT_EQ(decoded.error(), WireError::truncated) << n;
  }
}

TEST(DdpRdmapPeek, SizesFromTheControlBytes) {
  auto size = peek_segment_header_size(0xC1, 0x40, 14);
  ASSERT_TRUE(size.has_value());
  EXPECT_EQ(*size, kTaggedHeaderSize);
  size = peek_segment_header_size(0x81, 0x42, 5000);
  ASSERT_TRUE(size.has_value());
  EXPECT_EQ(*size, kTaggedHeaderSize);
  size = peek_segment_header_size(0x41, 0x43, 18);
  ASSERT_TRUE(size.has_value());
  EXPECT_EQ(*size, kUntaggedHeaderSize);
  size = peek_segment_header_size(0x41, 0x41, 46);
  ASSERT_TRUE(size.has_value());
  EXPECT_EQ(*size, kReadRequestUlpduSize);
  // A Terminate is all header.
  for (std::size_t len = kUntaggedHeaderSize + kTerminateFixedSize; len <= kMaxTerminateUlpduSize; ++len) {
    size = peek_segment_header_size(0x41, 0x47, len);
    ASSERT_TRUE(size.has_value()) << len;
    EXPECT_EQ(*size, len);
  }
}

TEST(DdpRdmapPeek, Errors) {
  struct Row {
    std::uint8_t ddp, rdmap;
    std::size_t len;
    WireError error;
  };
  const Row rows[] = {
      {0x40, 0x43, 18, WireError::ddp_bad_version},
      {0x42, 0x43, 18, WireError::ddp_bad_version},
      {0xC3, 0x40, 14, WireError::ddp_bad_version},
      {0x41, 0x03, 18, WireError::rdmap_bad_version},
      {0x41, 0x83, 18, WireError::rdmap_bad_version},
      {0x41, 0x48, 18, WireError::rdmap_unknown_opcode},
      {0xC1, 0x4F, 14, WireError::rdmap_unknown_opcode},
      {0x41, 0x40, 18, WireError::rdmap_opcode_tag_mismatch},
      {0xC1, 0x43, 18, WireError::rdmap_opcode_tag_mismatch},
      {0xC1, 0x40, 13, WireError::fpdu_ulpdu_too_short},
      {0x41, 0x43, 17, WireError::fpdu_ulpdu_too_short},
      {0x41, 0x41, 45, WireError::rdmap_bad_read_request},
      {0x41, 0x41, 47, WireError::rdmap_bad_read_request},
      {0x41, 0x47, 21, WireError::rdmap_bad_terminate},
      {0x41, 0x47, kMaxTerminateUlpduSize + 1, WireError::rdmap_bad_terminate},
  };
  for (const Row& r : rows) {
    auto size = peek_segment_header_size(r.ddp, r.rdmap, r.len);
    ASSERT_FALSE(size.has_value()) << int{r.ddp} << " " << int{r.rdmap} << " " << r.len;
    EXPECT_EQ(size.error(), r.error) << to_string(size.error());
  }
}

TEST(WireErrorText, EveryErrorHasADistinctDescription) {
  std::vector<std::string_view> seen;
  for (int e = 0; e <= static_cast<int>(WireError::cm_reserved_bits_set); ++e) {
    const std::string_view text = to_string(static_cast<WireError>(e));
    EXPECT_NE(text, "unknown wire error") << e;
    for (const std::string_view other : seen) EXPECT_NE(text, other) << e;
    seen.push_back(text);
  }
  EXPECT_EQ(to_string(static_cast<WireError>(0xFF)), "unknown wire error");
}

}  // namespace
}  // namespace peercm::wire
