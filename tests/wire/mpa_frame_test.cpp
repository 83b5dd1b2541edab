// MPA Request/Reply frames (RFC 5044 §7.1, RFC 6581 §5): exact layouts from
// iwarp-wire.md §1.2 and §4.2, encoder errors, and MpaFrameReader on a split stream.
#include "wire/mpa_frame.hpp"

#include <gtest/gtest.h>

#include "hex_bytes.hpp"

#include <algorithm>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace peercm::wire {
namespace {

using test::Bytes;
using test::hex;


Bytes concat(Bytes a, const Bytes& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

const Bytes kRequestKey = hex("4D 50 41 20 49 44 20 52 65 71 20 46 72 61 6D 65");  // "MPA ID Req Frame"
const Bytes kReplyKey = hex("4D 50 41 20 49 44 20 52 65 70 20 46 72 61 6D 65");    // "MPA ID Rep Frame"

Bytes encode(const MpaFrame& frame) {
  auto size = mpa_frame_size(frame);
  EXPECT_TRUE(size.has_value());
  if (!size) return {};
  Bytes out(*size);
  auto written = encode_mpa_frame(frame, out);
  EXPECT_TRUE(written.has_value());
  if (written) {
    EXPECT_EQ(*written, *size);
  }
  return out;
}

Bytes as_bytes(std::span<const std::uint8_t> s) { return Bytes(s.begin(), s.end()); }

TEST(MpaFrameEncode, PlainRev1RequestLayout) {
  MpaFrame f;
  f.kind = MpaFrameKind::request;
  f.markers = false;
  f.crc = true;
  f.revision = 1;
  EXPECT_EQ(encode(f), concat(kRequestKey, hex("40 01 0000")));
}

TEST(MpaFrameEncode, RequestWithMarkersAndPrivateData) {
  const Bytes pd = {'h', 'i', '!'};
  MpaFrame f;
  f.kind = MpaFrameKind::request;
  f.markers = true;
  f.crc = false;
  f.revision = 1;
  f.private_data = pd;
  EXPECT_EQ(encode(f), concat(kRequestKey, hex("80 01 0003 68 69 21")));
}

// iwarp-wire.md §4.2: A 0x8000 | B 0x4000 | IRD, C 0x8000 | D 0x4000 | ORD; PD_Length counts the block.
TEST(MpaFrameEncode, EnhancedReplyLayout) {
  const Bytes pd = {0xAA, 0xBB};
  MpaFrame f;
  f.kind = MpaFrameKind::reply;
  f.crc = true;
  f.revision = 2;
  f.enhanced = IrdOrdBlock{.peer_to_peer = true, .send_rtr = false, .write_rtr = true, .read_rtr = true,
                           .ird = 0x0010, .ord = kIrdOrdMax};
  f.private_data = pd;
  EXPECT_EQ(encode(f), concat(kReplyKey, hex("50 02 0006 | 80 10 FF FF | AA BB")));
}

TEST(MpaFrameEncode, EnhancedBlockSendRtrOnly) {
  MpaFrame f;
  f.kind = MpaFrameKind::request;
  f.crc = true;
  f.revision = 2;
  f.enhanced = IrdOrdBlock{.peer_to_peer = false, .send_rtr = true, .write_rtr = false, .read_rtr = false,
                           .ird = 0x3FFF, .ord = 1};
  EXPECT_EQ(encode(f), concat(kRequestKey, hex("50 02 0004 | 7F FF 00 01")));
}

TEST(MpaFrameEncode, RejectReplyCarriesR) {
  MpaFrame f;
  f.kind = MpaFrameKind::reply;
  f.crc = false;
  f.rejected = true;
  f.revision = 1;
  EXPECT_EQ(encode(f), concat(kReplyKey, hex("20 01 0000")));
}

TEST(MpaFrameEncode, RequestNeverCarriesR) {
  MpaFrame f;
  f.kind = MpaFrameKind::request;
  f.rejected = true;  // meaningless in a Request: not put on the wire
  f.revision = 2;
  const Bytes wire = encode(f);
  ASSERT_EQ(wire.size(), kMpaFrameHeaderSize);
  EXPECT_EQ(wire[16] & 0x20, 0);
  EXPECT_TRUE(decode_mpa_frame(wire, MpaFrameKind::request).has_value());
}

TEST(MpaFrameEncode, LargestPrivateData) {
  const Bytes pd(kMpaMaxPrivateData, 0x3C);
  MpaFrame f;
  f.revision = 1;
  f.private_data = pd;
  const Bytes wire = encode(f);
  ASSERT_EQ(wire.size(), kMpaMaxFrameSize);
  EXPECT_EQ(wire[18], 0x02);
  EXPECT_EQ(wire[19], 0x00);

  const Bytes enhanced_pd(kMpaMaxPrivateData - kIrdOrdBlockSize, 0x3C);
  f.revision = 2;
  f.enhanced = IrdOrdBlock{};
  f.private_data = enhanced_pd;
  EXPECT_EQ(encode(f).size(), kMpaMaxFrameSize);
}

TEST(MpaFrameEncode, Errors) {
  struct Row {
    const char* name;
    MpaFrame frame;
    WireError error;
  };
  static const Bytes too_much(kMpaMaxPrivateData + 1, 0);
  static const Bytes too_much_enhanced(kMpaMaxPrivateData - kIrdOrdBlockSize + 1, 0);
  MpaFrame base;
  base.revision = 2;
  std::vector<Row> rows;
  MpaFrame f = base;
  f.private_data = too_much;
  rows.push_back({"pd 513", f, WireError::mpa_private_data_too_long});
  f = base;
  f.enhanced = IrdOrdBlock{};
  f.private_data = too_much_enhanced;
  rows.push_back({"pd 509 + block", f, WireError::mpa_private_data_too_long});
  f = base;
  f.enhanced = IrdOrdBlock{};
  f.revision = 1;
  rows.push_back({"enhanced rev 1", f, WireError::mpa_enhanced_needs_rev2});
  f = base;
  f.revision = 0;
  rows.push_back({"rev 0", f, WireError::mpa_bad_revision});
  f.revision = 3;
  rows.push_back({"rev 3", f, WireError::mpa_bad_revision});
  f = base;
  f.enhanced = IrdOrdBlock{.ird = kIrdOrdMax + 1};
  rows.push_back({"ird 0x4000", f, WireError::mpa_ird_ord_out_of_range});
  f.enhanced = IrdOrdBlock{.ord = 0xFFFF};
  rows.push_back({"ord 0xffff", f, WireError::mpa_ird_ord_out_of_range});
  for (const Row& r : rows) {
    SCOPED_TRACE(r.name);
    auto size = mpa_frame_size(r.frame);
    ASSERT_FALSE(size.has_value());
    EXPECT_EQ(size.error(), r.error);
    Bytes out(kMpaMaxFrameSize + 64);
    auto written = encode_mpa_frame(r.frame, out);
    ASSERT_FALSE(written.has_value());
    EXPECT_EQ(written.error(), r.error);
  }
}

TEST(MpaFrameEncode, BufferTooSmall) {
  const Bytes pd(10, 1);
  MpaFrame f;
  f.revision = 1;
  f.private_data = pd;
  Bytes out(kMpaFrameHeaderSize + pd.size() - 1);
  auto written = encode_mpa_frame(f, out);
  ASSERT_FALSE(written.has_value());
  EXPECT_EQ(written.error(), WireError::buffer_too_small);
}

// ---------------------------------------------------------------------------------------
// Decoding.

TEST(MpaFrameDecode, EnhancedReplyFields) {
  const Bytes wire = concat(kReplyKey, hex("f0 02 0007 | C0 05 40 2A | 01 02 03"));
  auto frame = decode_mpa_frame(wire, MpaFrameKind::reply);
  ASSERT_TRUE(frame.has_value()) << to_string(frame.error());
  EXPECT_EQ(frame->kind, MpaFrameKind::reply);
  EXPECT_TRUE(frame->markers);
  EXPECT_TRUE(frame->crc);
  EXPECT_TRUE(frame->rejected);
  EXPECT_EQ(frame->revision, 2);
  ASSERT_TRUE(frame->enhanced.has_value());
  EXPECT_EQ(*frame->enhanced, (IrdOrdBlock{.peer_to_peer = true, .send_rtr = true, .write_rtr = false,
                                           .read_rtr = true, .ird = 5, .ord = 42}));
  EXPECT_EQ(as_bytes(frame->private_data), (Bytes{1, 2, 3}));
  // Zero copy: the private data is a view into the input.
  EXPECT_EQ(frame->private_data.data(), wire.data() + kMpaFrameHeaderSize + kIrdOrdBlockSize);
}

TEST(MpaFrameDecode, Rev2WithoutEnhancedBlock) {
  const Bytes wire = concat(kRequestKey, hex("00 02 0002 | 11 22"));
  auto frame = decode_mpa_frame(wire, MpaFrameKind::request);
  ASSERT_TRUE(frame.has_value());
  EXPECT_FALSE(frame->enhanced.has_value());
  EXPECT_FALSE(frame->crc);
  EXPECT_FALSE(frame->markers);
  EXPECT_EQ(as_bytes(frame->private_data), (Bytes{0x11, 0x22}));
}

TEST(MpaFrameDecode, EnhancedWithOnlyTheBlock) {
  const Bytes wire = concat(kRequestKey, hex("50 02 0004 | 3F FF 3F FF"));
  auto frame = decode_mpa_frame(wire, MpaFrameKind::request);
  ASSERT_TRUE(frame.has_value());
  ASSERT_TRUE(frame->enhanced.has_value());
  EXPECT_EQ(frame->enhanced->ird, kIrdOrdMax);
  EXPECT_EQ(frame->enhanced->ord, kIrdOrdMax);
  EXPECT_FALSE(frame->enhanced->peer_to_peer);
  EXPECT_TRUE(frame->private_data.empty());
}

TEST(MpaFrameLength, FromTheHeaderAlone) {
  const Bytes header = concat(kReplyKey, hex("40 01 0200"));
  auto length = mpa_frame_length(header, MpaFrameKind::reply);
  ASSERT_TRUE(length.has_value());
  EXPECT_EQ(*length, kMpaMaxFrameSize);
  auto wrong = mpa_frame_length(header, MpaFrameKind::request);
  ASSERT_FALSE(wrong.has_value());
  EXPECT_EQ(wrong.error(), WireError::mpa_bad_key);
  auto short_header = mpa_frame_length(std::span(header).first(19), MpaFrameKind::reply);
  ASSERT_FALSE(short_header.has_value());
  EXPECT_EQ(short_header.error(), WireError::truncated);
}

// ---------------------------------------------------------------------------------------
// MpaFrameReader.

Bytes sample_reply(std::size_t ulp_bytes) {
  Bytes pd(ulp_bytes);
  for (std::size_t i = 0; i < pd.size(); ++i) pd[i] = static_cast<std::uint8_t>(i * 13 + 1);
  MpaFrame f;
  f.kind = MpaFrameKind::reply;
  f.revision = 2;
  f.enhanced = IrdOrdBlock{.peer_to_peer = true, .write_rtr = true, .ird = 16, .ord = 8};
  f.private_data = pd;
  return encode(f);
}

void expect_sample(const MpaFrameReader& reader, std::size_t ulp_bytes) {
  ASSERT_TRUE(reader.complete());
  EXPECT_FALSE(reader.error().has_value());
  const MpaFrame& f = *reader.frame();
  EXPECT_EQ(f.kind, MpaFrameKind::reply);
  ASSERT_TRUE(f.enhanced.has_value());
  EXPECT_EQ(*f.enhanced, (IrdOrdBlock{.peer_to_peer = true, .write_rtr = true, .ird = 16, .ord = 8}));
  ASSERT_EQ(f.private_data.size(), ulp_bytes);
  for (std::size_t i = 0; i < ulp_bytes; ++i) ASSERT_EQ(f.private_data[i], static_cast<std::uint8_t>(i * 13 + 1));
}

TEST(MpaFrameReader, AllAtOnceLeavesTheFollowingBytes) {
  const Bytes frame = sample_reply(100);
  const Bytes trailing = {0x00, 0x0e, 0xc1, 0x40, 0x99};
  const Bytes stream = concat(frame, trailing);
  MpaFrameReader reader(MpaFrameKind::reply);
  EXPECT_EQ(reader.feed(stream), frame.size());
  expect_sample(reader, 100);
  // Once complete it takes nothing more.
  EXPECT_EQ(reader.feed(trailing), 0u);
}

TEST(MpaFrameReader, OneByteAtATimeStopsExactlyAtTheFrameEnd) {
  for (const std::size_t ulp : {std::size_t{0}, std::size_t{1}, std::size_t{508}}) {
    SCOPED_TRACE(ulp);
    const Bytes frame = sample_reply(ulp);
    const Bytes stream = concat(frame, Bytes(7, 0xEE));
    MpaFrameReader reader(MpaFrameKind::reply);
    std::size_t taken = 0;
    for (std::size_t i = 0; i < stream.size(); ++i) {
      const std::size_t n = reader.feed(std::span(stream).subspan(i, 1));
      taken += n;
      if (i < frame.size()) {
        ASSERT_EQ(n, 1u) << i;
        EXPECT_EQ(reader.complete(), i + 1 == frame.size()) << i;
      } else {
        ASSERT_EQ(n, 0u) << i;
      }
      ASSERT_FALSE(reader.error().has_value());
    }
    EXPECT_EQ(taken, frame.size());
    expect_sample(reader, ulp);
  }
}

TEST(MpaFrameReader, EmptyFeedsAreHarmless) {
  const Bytes frame = sample_reply(3);
  MpaFrameReader reader(MpaFrameKind::reply);
  EXPECT_EQ(reader.feed({}), 0u);
  EXPECT_EQ(reader.feed(std::span(frame).first(25)), 25u);
  EXPECT_EQ(reader.feed({}), 0u);
  EXPECT_FALSE(reader.complete());
  EXPECT_EQ(reader.feed(std::span(frame).subspan(25)), frame.size() - 25);
  expect_sample(reader, 3);
}

TEST(MpaFrameReader, PrivateDataIsCopiedIntoTheReader) {
  Bytes frame = sample_reply(40);
  MpaFrameReader reader(MpaFrameKind::reply);
  ASSERT_EQ(reader.feed(frame), frame.size());
  std::fill(frame.begin(), frame.end(), std::uint8_t{0});  // the caller reuses its receive buffer
  expect_sample(reader, 40);
}

TEST(MpaFrameReader, WrongKeyFailsAtTheFirstWrongByte) {
  // A Reply key where a Request is expected differs at byte 9 ('p' vs 'q').
  const Bytes stream = concat(kReplyKey, hex("40 01 0000"));
  MpaFrameReader reader(MpaFrameKind::request);
  for (std::size_t i = 0; i < 9; ++i) ASSERT_EQ(reader.feed(std::span(stream).subspan(i, 1)), 1u);
  EXPECT_FALSE(reader.error().has_value());
  EXPECT_EQ(reader.feed(std::span(stream).subspan(9)), 1u);
  ASSERT_TRUE(reader.error().has_value());
  EXPECT_EQ(*reader.error(), WireError::mpa_bad_key);
  EXPECT_FALSE(reader.complete());
  // Failed for good.
  EXPECT_EQ(reader.feed(stream), 0u);
  EXPECT_EQ(*reader.error(), WireError::mpa_bad_key);
}

TEST(MpaFrameReader, HeaderErrorIsReportedOnceTheHeaderIsIn) {
  const Bytes stream = concat(kRequestKey, hex("40 03 0000"));  // revision 3
  MpaFrameReader reader(MpaFrameKind::request);
  EXPECT_EQ(reader.feed(std::span(stream).first(19)), 19u);
  EXPECT_FALSE(reader.error().has_value());
  reader.feed(std::span(stream).subspan(19));
  ASSERT_TRUE(reader.error().has_value());
  EXPECT_EQ(*reader.error(), WireError::mpa_bad_revision);
  EXPECT_FALSE(reader.complete());
}

TEST(MpaFrameReader, OversizedPdLengthIsRefusedWithoutWaitingForTheData) {
  const Bytes stream = concat(kRequestKey, hex("40 01 FFFF"));
  MpaFrameReader reader(MpaFrameKind::request);
  reader.feed(stream);
  ASSERT_TRUE(reader.error().has_value());
  EXPECT_EQ(*reader.error(), WireError::mpa_private_data_too_long);
}

}  // namespace
}  // namespace peercm::wire
