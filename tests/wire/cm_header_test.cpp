// The peercm CM header carried in MPA private data (design.md §3 rule 1): layout, round
// trip, encoder errors and its place after the RFC 6581 IRD/ORD block.
#include "wire/cm_header.hpp"

#include <gtest/gtest.h>

#include "hex_bytes.hpp"

#include <array>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "wire/mpa_frame.hpp"

namespace peercm::wire {
namespace {

using test::Bytes;
using test::hex;


const CmHeader kSample{.flags = CmHeader::kFlagPeerToPeer,
                       .node_guid = 0x0011223344556677,
                       .incarnation = 0x8899AABBCCDDEEFF,
                       .listen_port = 4791,
                       .tag = 0xFEEDF00D,
                       .cmid = 42};

// magic(4) version(1) flags(1) header_length(2) node_guid(8) incarnation(8) listen_port(2)
// reserved(2) tag(4) cmid(4), big-endian.
const Bytes kSampleWire = hex("50434D48 01 01 0024 0011223344556677 8899AABBCCDDEEFF 12B7 0000 FEEDF00D 0000002A");

TEST(CmHeader, EncodeLayout) {
  ASSERT_EQ(kSampleWire.size(), kCmHeaderSize);
  Bytes out(kCmHeaderSize);
  auto written = encode_cm_header(kSample, out);
  ASSERT_TRUE(written.has_value());
  EXPECT_EQ(*written, kCmHeaderSize);
  EXPECT_EQ(out, kSampleWire);
}

TEST(CmHeader, MagicSpellsPcmh) {
  EXPECT_EQ(kSampleWire[0], 'P');
  EXPECT_EQ(kSampleWire[1], 'C');
  EXPECT_EQ(kSampleWire[2], 'M');
  EXPECT_EQ(kSampleWire[3], 'H');
}

TEST(CmHeader, DecodeWithoutApplicationData) {
  auto view = decode_cm_header(kSampleWire);
  ASSERT_TRUE(view.has_value()) << to_string(view.error());
  EXPECT_EQ(view->header, kSample);
  EXPECT_TRUE(view->application_data.empty());
}

TEST(CmHeader, ApplicationDataFollowsTheHeader) {
  Bytes pd = kSampleWire;
  const Bytes app = {'h', 'e', 'l', 'l', 'o'};
  pd.insert(pd.end(), app.begin(), app.end());
  auto view = decode_cm_header(pd);
  ASSERT_TRUE(view.has_value());
  EXPECT_EQ(view->header, kSample);
  EXPECT_EQ(Bytes(view->application_data.begin(), view->application_data.end()), app);
  EXPECT_EQ(view->application_data.data(), pd.data() + kCmHeaderSize);
}

TEST(CmHeader, ClientServerFlagsAndZeroFields) {
  const CmHeader h{.flags = 0, .node_guid = 0, .incarnation = 0, .listen_port = 0, .tag = 0, .cmid = 0};
  Bytes out(kCmHeaderSize + 3, 0xEE);
  auto written = encode_cm_header(h, out);
  ASSERT_TRUE(written.has_value());
  EXPECT_EQ(out[5], 0);
  EXPECT_EQ(out[kCmHeaderSize], 0xEE);  // nothing written past the header
  auto view = decode_cm_header(std::span(out).first(kCmHeaderSize));
  ASSERT_TRUE(view.has_value());
  EXPECT_EQ(view->header, h);
}

TEST(CmHeader, EncodeErrors) {
  Bytes small(kCmHeaderSize - 1);
  auto r = encode_cm_header(kSample, small);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error(), WireError::buffer_too_small);

  Bytes out(kCmHeaderSize);
  CmHeader unknown_flag = kSample;
  unknown_flag.flags = 0x02;
  r = encode_cm_header(unknown_flag, out);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error(), WireError::cm_reserved_bits_set);
}

// The whole stack of a peer-to-peer connect request: MPA Request (rev 2, S=1) whose private
// data is IRD/ORD block | CM header | application data.
TEST(CmHeader, InsideAnEnhancedMpaRequest) {
  Bytes pd(kCmHeaderSize);
  ASSERT_TRUE(encode_cm_header(kSample, pd).has_value());
  const Bytes app(200, 0x61);
  pd.insert(pd.end(), app.begin(), app.end());
  MpaFrame request;
  request.kind = MpaFrameKind::request;
  request.revision = 2;
  request.enhanced = IrdOrdBlock{.peer_to_peer = true, .write_rtr = true, .read_rtr = true, .ird = 4, .ord = 4};
  request.private_data = pd;
  Bytes wire(kMpaMaxFrameSize);
  auto size = encode_mpa_frame(request, wire);
  ASSERT_TRUE(size.has_value());
  wire.resize(*size);

  MpaFrameReader reader(MpaFrameKind::request);
  ASSERT_EQ(reader.feed(wire), wire.size());
  ASSERT_TRUE(reader.complete());
  auto view = decode_cm_header(reader.frame()->private_data);
  ASSERT_TRUE(view.has_value());
  EXPECT_EQ(view->header, kSample);
  EXPECT_EQ(Bytes(view->application_data.begin(), view->application_data.end()), app);
}

}  // namespace
}  // namespace peercm::wire

namespace peercm::wire {
namespace {

TEST(CmReject, RoundTripsEveryReason) {
  for (CmRejectReason reason : {CmRejectReason::collision, CmRejectReason::duplicate}) {
    std::array<std::uint8_t, kCmRejectSize> bytes{};
    ASSERT_TRUE(encode_cm_reject(reason, bytes));
    auto decoded = decode_cm_reject(bytes);
    ASSERT_TRUE(decoded);
    EXPECT_EQ(*decoded, reason);
  }
}

TEST(CmReject, ApplicationPrivateDataIsNotACmReject) {
  const std::array<std::uint8_t, 8> app = {'n', 'o', ' ', 't', 'h', 'a', 'n', 'k'};
  EXPECT_EQ(decode_cm_reject(app).error(), WireError::cm_bad_magic);
  EXPECT_EQ(decode_cm_reject(std::span<const std::uint8_t>{}).error(), WireError::truncated);
  std::array<std::uint8_t, kCmRejectSize> bad{};
  ASSERT_TRUE(encode_cm_reject(CmRejectReason::collision, bad));
  bad[5] = 9;
  EXPECT_EQ(decode_cm_reject(bad).error(), WireError::cm_reserved_bits_set);
  std::array<std::uint8_t, kCmRejectSize + 1> longer{};
  ASSERT_TRUE(encode_cm_reject(CmRejectReason::collision, longer));
  EXPECT_EQ(decode_cm_reject(longer).error(), WireError::cm_bad_length);
}

}  // namespace
}  // namespace peercm::wire
