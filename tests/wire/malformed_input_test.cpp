// Malformed input: table-driven cases, each mapped to the WireError it must produce, for
// MPA frames (decode_mpa_frame and MpaFrameReader), FPDUs (FpduStreamDecoder) and the CM
// header; the decoder's sticky failure; and fixed-seed fuzzing that must never crash.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <ostream>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "wire/byte_io.hpp"
#include "wire/cm_header.hpp"
#include "wire/crc32c.hpp"
#include "wire/ddp_rdmap.hpp"
#include "wire/fpdu.hpp"
#include "wire/mpa_frame.hpp"

namespace peercm::wire {
namespace {

using Bytes = std::vector<std::uint8_t>;

Bytes concat(Bytes a, const Bytes& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

Bytes text(std::string_view s) { return Bytes(s.begin(), s.end()); }

const Bytes kRequestKey = text("MPA ID Req Frame");
const Bytes kReplyKey = text("MPA ID Rep Frame");

// ---------------------------------------------------------------------------------------
// MPA frames.

Bytes mpa(const Bytes& key, std::uint8_t flags, std::uint8_t revision, std::uint16_t pd_length,
          std::size_t pd_present) {
  Bytes out = key;
  out.push_back(flags);
  out.push_back(revision);
  out.push_back(static_cast<std::uint8_t>(pd_length >> 8));
  out.push_back(static_cast<std::uint8_t>(pd_length));
  for (std::size_t i = 0; i < pd_present; ++i) out.push_back(static_cast<std::uint8_t>(i));
  return out;
}

// What MpaFrameReader makes of the same bytes.
enum class ReaderExpect : std::uint8_t {
  same_error,       // fails with the same error
  incomplete,       // no error yet: waits for more bytes
  completes_early,  // PD_Length says less than present: frame done, the rest left unconsumed
};

struct MpaCase {
  std::string name;
  MpaFrameKind expected;
  Bytes bytes;
  WireError error;
  ReaderExpect reader;
};

void PrintTo(const MpaCase& c, std::ostream* os) { *os << c.name; }

std::vector<MpaCase> mpa_cases() {
  using K = MpaFrameKind;
  using E = WireError;
  using R = ReaderExpect;
  const Bytes valid = mpa(kRequestKey, 0x40, 1, 0, 0);
  std::vector<MpaCase> cases = {
      {"truncated_empty", K::request, {}, E::truncated, R::incomplete},
      {"truncated_inside_key", K::request, Bytes(valid.begin(), valid.begin() + 10), E::truncated, R::incomplete},
      {"truncated_header_19_bytes", K::request, Bytes(valid.begin(), valid.begin() + 19), E::truncated,
       R::incomplete},
      {"truncated_private_data", K::reply, mpa(kReplyKey, 0x40, 1, 10, 4), E::truncated, R::incomplete},
      {"truncated_enhanced_block", K::reply, mpa(kReplyKey, 0x50, 2, 4, 2), E::truncated, R::incomplete},
      {"request_key_when_reply_expected", K::reply, mpa(kRequestKey, 0x40, 1, 0, 0), E::mpa_bad_key,
       R::same_error},
      {"reply_key_when_request_expected", K::request, mpa(kReplyKey, 0x40, 1, 0, 0), E::mpa_bad_key,
       R::same_error},
      {"garbage_key", K::request, concat(text("GET / HTTP/1.1\r\nHost: x\r\n"), Bytes(8, 0)), E::mpa_bad_key,
       R::same_error},
      {"lowercase_key", K::request, mpa(text("mpa id req frame"), 0x40, 1, 0, 0), E::mpa_bad_key,
       R::same_error},
      {"key_with_nul", K::reply, mpa(concat(text("MPA ID Rep Fram"), Bytes(1, 0)), 0x40, 1, 0, 0), E::mpa_bad_key,
       R::same_error},
      {"pd_length_513", K::request, mpa(kRequestKey, 0x40, 1, 513, 513), E::mpa_private_data_too_long,
       R::same_error},
      {"pd_length_ffff", K::reply, mpa(kReplyKey, 0x40, 2, 0xFFFF, 0), E::mpa_private_data_too_long,
       R::same_error},
      {"pd_length_below_bytes_present", K::request, mpa(kRequestKey, 0x40, 1, 4, 6), E::mpa_length_mismatch,
       R::completes_early},
      {"pd_length_zero_with_one_byte", K::reply, mpa(kReplyKey, 0x00, 1, 0, 1), E::mpa_length_mismatch,
       R::completes_early},
      {"enhanced_pd_length_below_block", K::request, mpa(kRequestKey, 0x50, 2, 3, 3), E::mpa_length_mismatch,
       R::same_error},
      {"enhanced_pd_length_zero", K::reply, mpa(kReplyKey, 0x10, 2, 0, 0), E::mpa_length_mismatch,
       R::same_error},
      {"reserved_bit_0x01", K::request, mpa(kRequestKey, 0x41, 1, 0, 0), E::mpa_reserved_bits_set, R::same_error},
      {"reserved_bit_0x02", K::reply, mpa(kReplyKey, 0x42, 2, 0, 0), E::mpa_reserved_bits_set, R::same_error},
      {"reserved_bit_0x04", K::request, mpa(kRequestKey, 0x04, 1, 0, 0), E::mpa_reserved_bits_set, R::same_error},
      {"reserved_bit_0x08", K::reply, mpa(kReplyKey, 0xF8, 2, 4, 4), E::mpa_reserved_bits_set, R::same_error},
      {"revision_0", K::request, mpa(kRequestKey, 0x40, 0, 0, 0), E::mpa_bad_revision, R::same_error},
      {"revision_3", K::reply, mpa(kReplyKey, 0x40, 3, 0, 0), E::mpa_bad_revision, R::same_error},
      {"revision_255", K::request, mpa(kRequestKey, 0x40, 255, 0, 0), E::mpa_bad_revision, R::same_error},
      {"enhanced_with_rev_1_request", K::request, mpa(kRequestKey, 0x50, 1, 4, 4), E::mpa_enhanced_needs_rev2,
       R::same_error},
      {"enhanced_with_rev_1_reply", K::reply, mpa(kReplyKey, 0x10, 1, 4, 4), E::mpa_enhanced_needs_rev2,
       R::same_error},
      {"reject_bit_in_request", K::request, mpa(kRequestKey, 0x60, 1, 0, 0), E::mpa_reject_in_request,
       R::same_error},
      {"reject_bit_in_enhanced_request", K::request, mpa(kRequestKey, 0x70, 2, 4, 4), E::mpa_reject_in_request,
       R::same_error},
  };
  return cases;
}

class MalformedMpa : public ::testing::TestWithParam<MpaCase> {};

TEST_P(MalformedMpa, DecodeMpaFrame) {
  const MpaCase& c = GetParam();
  auto frame = decode_mpa_frame(c.bytes, c.expected);
  ASSERT_FALSE(frame.has_value());
  EXPECT_EQ(frame.error(), c.error);
}

TEST_P(MalformedMpa, MpaFrameReaderAllAtOnceAndByteByByte) {
  const MpaCase& c = GetParam();
  for (const bool bytewise : {false, true}) {
    SCOPED_TRACE(bytewise ? "byte by byte" : "all at once");
    MpaFrameReader reader(c.expected);
    std::size_t taken = 0;
    if (bytewise) {
      for (std::size_t i = 0; i < c.bytes.size(); ++i) taken += reader.feed(std::span(c.bytes).subspan(i, 1));
    } else {
      taken = reader.feed(c.bytes);
    }
    ASSERT_LE(taken, c.bytes.size());
    switch (c.reader) {
      case ReaderExpect::same_error:
        ASSERT_TRUE(reader.error().has_value());
        EXPECT_EQ(*reader.error(), c.error);
        EXPECT_FALSE(reader.complete());
        break;
      case ReaderExpect::incomplete:
        EXPECT_FALSE(reader.error().has_value());
        EXPECT_FALSE(reader.complete());
        EXPECT_EQ(taken, c.bytes.size());
        break;
      case ReaderExpect::completes_early: {
        EXPECT_FALSE(reader.error().has_value());
        EXPECT_TRUE(reader.complete());
        ASSERT_GE(c.bytes.size(), kMpaFrameHeaderSize);
        const std::size_t frame_size = kMpaFrameHeaderSize + load_be16(c.bytes.data() + 18);
        EXPECT_EQ(taken, frame_size);
        break;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Table, MalformedMpa, ::testing::ValuesIn(mpa_cases()),
                         [](const ::testing::TestParamInfo<MpaCase>& param_info) { return param_info.param.name; });

// The positive counterparts of some cases above, so the table cannot pass by rejecting everything.
TEST(MalformedMpaControls, NeighboursOfTheMalformedCasesAreAccepted) {
  EXPECT_TRUE(decode_mpa_frame(mpa(kRequestKey, 0x40, 1, 0, 0), MpaFrameKind::request).has_value());
  EXPECT_TRUE(decode_mpa_frame(mpa(kReplyKey, 0x60, 1, 0, 0), MpaFrameKind::reply).has_value());  // R in a Reply
  EXPECT_TRUE(decode_mpa_frame(mpa(kRequestKey, 0x40, 1, 512, 512), MpaFrameKind::request).has_value());
  EXPECT_TRUE(decode_mpa_frame(mpa(kRequestKey, 0x50, 2, 4, 4), MpaFrameKind::request).has_value());
  EXPECT_TRUE(decode_mpa_frame(mpa(kReplyKey, 0xF0, 2, 4, 4), MpaFrameKind::reply).has_value());
  EXPECT_TRUE(decode_mpa_frame(mpa(kReplyKey, 0x00, 2, 6, 6), MpaFrameKind::reply).has_value());
}

// ---------------------------------------------------------------------------------------
// FPDUs.

// ULPDU_Length | ulpdu | PAD | CRC, with a correct CRC over whatever bytes are given.
Bytes fpdu_from_ulpdu(const Bytes& ulpdu, std::uint8_t last_pad_byte = 0) {
  Bytes out(kUlpduLengthSize);
  store_be16(out.data(), static_cast<std::uint16_t>(ulpdu.size()));
  out = concat(out, ulpdu);
  const std::size_t pad = fpdu_padding(ulpdu.size());
  out.resize(out.size() + pad, 0);
  if (pad > 0) out.back() = last_pad_byte;
  const std::uint32_t crc = crc32c(out);
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<std::uint8_t>(crc >> (8 * i)));
  return out;
}

Bytes untagged_ulpdu(std::uint8_t ddp, std::uint8_t rdmap, std::uint32_t qn, std::uint32_t msn, std::uint32_t mo,
                     const Bytes& rest = {}) {
  Bytes out(kUntaggedHeaderSize);
  out[0] = ddp;
  out[1] = rdmap;
  store_be32(out.data() + 6, qn);
  store_be32(out.data() + 10, msn);
  store_be32(out.data() + 14, mo);
  return concat(out, rest);
}

Bytes tagged_ulpdu(std::uint8_t ddp, std::uint8_t rdmap, std::uint32_t stag, std::uint64_t offset,
                   const Bytes& payload = {}) {
  Bytes out(kTaggedHeaderSize);
  out[0] = ddp;
  out[1] = rdmap;
  store_be32(out.data() + 2, stag);
  store_be64(out.data() + 6, offset);
  return concat(out, payload);
}

Bytes first(const Bytes& b, std::size_t n) { return Bytes(b.begin(), b.begin() + static_cast<std::ptrdiff_t>(n)); }

Bytes flipped(Bytes b, std::size_t at) {
  b[at] = static_cast<std::uint8_t>(b[at] ^ 0x20);
  return b;
}

// Terminate body after the untagged header: layer/type, code, HdrCt, reserved, then `rest`.
Bytes terminate_ulpdu(std::uint8_t layer_type, std::uint8_t hdrct, const Bytes& rest = {},
                      std::uint8_t ddp = 0x41, std::uint32_t mo = 0) {
  return untagged_ulpdu(ddp, 0x47, kQueueTerminate, 1, mo, concat({layer_type, 0x00, hdrct, 0x00}, rest));
}

struct FpduCase {
  std::string name;
  Bytes bytes;
  WireError error;
  bool check_crc = true;
  std::size_t max_ulpdu = kMaxUlpduLength;
};

void PrintTo(const FpduCase& c, std::ostream* os) { *os << c.name; }

const Bytes kValidSend = fpdu_from_ulpdu(untagged_ulpdu(0x41, 0x43, 0, 1, 0, Bytes(37, 0x5A)));  // pad 3
const Bytes kValidWrite = fpdu_from_ulpdu(tagged_ulpdu(0xC1, 0x40, 1, 0));  // ULPDU 14

std::vector<FpduCase> fpdu_cases() {
  using E = WireError;
  const Bytes send_header = untagged_ulpdu(0x41, 0x43, 0, 1, 0);
  const Bytes write_header = tagged_ulpdu(0xC1, 0x40, 1, 0);
  const Bytes read_request = untagged_ulpdu(0x41, 0x41, kQueueReadRequest, 1, 0, Bytes(kReadRequestHeaderSize, 0));
  const Bytes untagged_copy = untagged_ulpdu(0x41, 0x43, 0, 1, 0);
  std::vector<FpduCase> cases = {
      {"ulpdu_length_0", fpdu_from_ulpdu({}), E::fpdu_ulpdu_too_short},
      {"ulpdu_length_1", fpdu_from_ulpdu({0x41}), E::fpdu_ulpdu_too_short},
      {"untagged_ulpdu_shorter_than_header", fpdu_from_ulpdu(first(send_header, 17)), E::fpdu_ulpdu_too_short},
      {"tagged_ulpdu_shorter_than_header", fpdu_from_ulpdu(first(write_header, 13)), E::fpdu_ulpdu_too_short},
      {"read_request_shorter_than_ddp_header", fpdu_from_ulpdu(first(read_request, 10)), E::fpdu_ulpdu_too_short},
      {"ulpdu_longer_than_max_ulpdu", kValidSend, E::fpdu_ulpdu_too_long, true, 54},
      {"ulpdu_longer_than_max_ulpdu_crc_off", kValidSend, E::fpdu_ulpdu_too_long, false, kTaggedHeaderSize},
      {"bad_crc_field", flipped(kValidSend, kValidSend.size() - 1), E::fpdu_bad_crc},
      {"bad_crc_payload_corrupted", flipped(kValidSend, 30), E::fpdu_bad_crc},
      {"bad_crc_msn_corrupted", flipped(kValidSend, 13), E::fpdu_bad_crc},
      {"bad_crc_reserved_control_bit", flipped(fpdu_from_ulpdu(write_header), 2), E::fpdu_bad_crc},
      {"bad_crc_zero_length_write", flipped(fpdu_from_ulpdu(write_header), 17), E::fpdu_bad_crc},
      {"nonzero_padding", fpdu_from_ulpdu(untagged_ulpdu(0x41, 0x43, 0, 1, 0, {0xAA}), 0x01), E::fpdu_bad_padding},
      {"nonzero_padding_crc_off", fpdu_from_ulpdu(untagged_ulpdu(0x41, 0x43, 0, 1, 0, {0xAA}), 0x80),
       E::fpdu_bad_padding, false},
      {"ddp_version_0", fpdu_from_ulpdu(untagged_ulpdu(0x40, 0x43, 0, 1, 0)), E::ddp_bad_version},
      {"ddp_version_2", fpdu_from_ulpdu(untagged_ulpdu(0x42, 0x43, 0, 1, 0)), E::ddp_bad_version},
      {"ddp_version_3_tagged", fpdu_from_ulpdu(tagged_ulpdu(0xC3, 0x40, 1, 0)), E::ddp_bad_version},
      {"rdmap_version_0", fpdu_from_ulpdu(untagged_ulpdu(0x41, 0x03, 0, 1, 0)), E::rdmap_bad_version},
      {"rdmap_version_2", fpdu_from_ulpdu(untagged_ulpdu(0x41, 0x83, 0, 1, 0)), E::rdmap_bad_version},
      {"rdmap_version_3_tagged", fpdu_from_ulpdu(tagged_ulpdu(0xC1, 0xC0, 1, 0)), E::rdmap_bad_version},
      {"write_in_untagged_segment", fpdu_from_ulpdu(untagged_ulpdu(0x41, 0x40, 0, 1, 0)),
       E::rdmap_opcode_tag_mismatch},
      {"read_response_in_untagged_segment", fpdu_from_ulpdu(untagged_ulpdu(0x41, 0x42, 0, 1, 0)),
       E::rdmap_opcode_tag_mismatch},
      {"send_in_tagged_segment", fpdu_from_ulpdu(tagged_ulpdu(0xC1, 0x43, 1, 0, Bytes(4, 0))),
       E::rdmap_opcode_tag_mismatch},
      {"read_request_in_tagged_segment", fpdu_from_ulpdu(concat(tagged_ulpdu(0xC1, 0x41, 0, 0), Bytes(32, 0))),
       E::rdmap_opcode_tag_mismatch},
      {"terminate_in_tagged_segment", fpdu_from_ulpdu(tagged_ulpdu(0xC1, 0x47, 0, 0, Bytes(8, 0))),
       E::rdmap_opcode_tag_mismatch},
      {"send_on_queue_1", fpdu_from_ulpdu(untagged_ulpdu(0x41, 0x43, 1, 1, 0)), E::ddp_bad_queue_number},
      {"send_invalidate_on_queue_2", fpdu_from_ulpdu(untagged_ulpdu(0x41, 0x44, 2, 1, 0)), E::ddp_bad_queue_number},
      {"send_solicited_on_queue_3", fpdu_from_ulpdu(untagged_ulpdu(0x41, 0x45, 3, 1, 0)), E::ddp_bad_queue_number},
      {"send_se_invalidate_on_queue_ffffffff", fpdu_from_ulpdu(untagged_ulpdu(0x41, 0x46, 0xFFFFFFFF, 1, 0)),
       E::ddp_bad_queue_number},
      {"read_request_on_queue_0",
       fpdu_from_ulpdu(untagged_ulpdu(0x41, 0x41, 0, 1, 0, Bytes(kReadRequestHeaderSize, 0))),
       E::ddp_bad_queue_number},
      {"terminate_on_queue_0",
       fpdu_from_ulpdu(untagged_ulpdu(0x41, 0x47, 0, 1, 0, Bytes(kTerminateFixedSize, 0))),
       E::ddp_bad_queue_number},
      {"terminate_on_queue_1",
       fpdu_from_ulpdu(untagged_ulpdu(0x41, 0x47, 1, 1, 0, Bytes(kTerminateFixedSize, 0))),
       E::ddp_bad_queue_number},
      {"read_request_45_bytes", fpdu_from_ulpdu(first(read_request, 45)), E::rdmap_bad_read_request},
      {"read_request_47_bytes", fpdu_from_ulpdu(concat(read_request, {0})), E::rdmap_bad_read_request},
      {"read_request_with_payload", fpdu_from_ulpdu(concat(read_request, Bytes(100, 1))), E::rdmap_bad_read_request},
      {"read_request_header_only", fpdu_from_ulpdu(first(read_request, 18)), E::rdmap_bad_read_request},
      {"read_request_not_last",
       fpdu_from_ulpdu(untagged_ulpdu(0x01, 0x41, kQueueReadRequest, 1, 0, Bytes(kReadRequestHeaderSize, 0))),
       E::rdmap_bad_read_request},
      {"read_request_nonzero_mo",
       fpdu_from_ulpdu(untagged_ulpdu(0x41, 0x41, kQueueReadRequest, 1, 4, Bytes(kReadRequestHeaderSize, 0))),
       E::rdmap_bad_read_request},
      {"terminate_too_short_21", fpdu_from_ulpdu(first(terminate_ulpdu(0x20, 0x00), 21)), E::rdmap_bad_terminate},
      {"terminate_too_short_header_only", fpdu_from_ulpdu(first(terminate_ulpdu(0x20, 0x00), 18)),
       E::rdmap_bad_terminate},
      {"terminate_too_long_71", fpdu_from_ulpdu(terminate_ulpdu(0x20, 0x00, Bytes(kMaxTerminateUlpduSize - 21, 0))),
       E::rdmap_bad_terminate},
      {"terminate_too_long_1000", fpdu_from_ulpdu(terminate_ulpdu(0x20, 0x00, Bytes(1000, 0))), E::rdmap_bad_terminate},
      {"terminate_d_without_copied_header", fpdu_from_ulpdu(terminate_ulpdu(0x10, 0x40, {0x00, 0x12})),
       E::rdmap_bad_terminate},
      {"terminate_d_untagged_copy_cut_short",
       fpdu_from_ulpdu(terminate_ulpdu(0x10, 0xC0, concat({0x00, 0x12}, first(untagged_copy, 14)))),
       E::rdmap_bad_terminate},
      {"terminate_r_without_read_request_header", fpdu_from_ulpdu(terminate_ulpdu(0x00, 0x20, Bytes(27, 0))),
       E::rdmap_bad_terminate},
      {"terminate_d_and_r_missing_read_request",
       fpdu_from_ulpdu(terminate_ulpdu(0x01, 0xE0, concat({0x00, 0x2e}, untagged_copy))), E::rdmap_bad_terminate},
      {"terminate_layer_3", fpdu_from_ulpdu(terminate_ulpdu(0x30, 0x00)), E::rdmap_bad_terminate},
      {"terminate_layer_15", fpdu_from_ulpdu(terminate_ulpdu(0xF0, 0x00)), E::rdmap_bad_terminate},
      {"terminate_not_last", fpdu_from_ulpdu(terminate_ulpdu(0x20, 0x00, {}, 0x01)), E::rdmap_bad_terminate},
      {"terminate_nonzero_mo", fpdu_from_ulpdu(terminate_ulpdu(0x20, 0x00, {}, 0x41, 8)), E::rdmap_bad_terminate},
  };
  for (std::uint8_t op = 8; op <= 15; ++op) {
    cases.push_back({"unknown_opcode_" + std::to_string(op) + "_untagged",
                     fpdu_from_ulpdu(untagged_ulpdu(0x41, static_cast<std::uint8_t>(0x40 | op), 0, 1, 0)),
                     E::rdmap_unknown_opcode});
    cases.push_back({"unknown_opcode_" + std::to_string(op) + "_tagged",
                     fpdu_from_ulpdu(tagged_ulpdu(0xC1, static_cast<std::uint8_t>(0x40 | op), 1, 0)),
                     E::rdmap_unknown_opcode});
  }
  return cases;
}

struct Outcome {
  std::size_t ended = 0;   // complete segments (`end` or `whole` events)
  std::size_t headers = 0;
  std::optional<WireError> error;
};

// Feeds `in` in chunks of `chunk` bytes (0: all at once) until the decoder reports an error.
Outcome run(FpduStreamDecoder& decoder, std::span<const std::uint8_t> in, std::size_t chunk) {
  Outcome out;
  if (chunk == 0) chunk = std::max<std::size_t>(in.size(), 1);
  for (std::size_t at = 0; at < in.size() && !out.error; at += chunk) {
    std::span<const std::uint8_t> rest = in.subspan(at, std::min(chunk, in.size() - at));
    for (;;) {
      std::size_t consumed = 0;
      const FpduEvent event = decoder.next(rest, consumed);
      EXPECT_LE(consumed, rest.size());
      rest = rest.subspan(std::min(consumed, rest.size()));
      if (event.kind == FpduEvent::Kind::need_more) break;
      if (event.kind == FpduEvent::Kind::header) ++out.headers;
      if (event.kind == FpduEvent::Kind::end || event.kind == FpduEvent::Kind::whole) ++out.ended;
      if (event.kind == FpduEvent::Kind::error) {
        out.error = event.error;
        break;
      }
    }
  }
  return out;
}

class MalformedFpdu : public ::testing::TestWithParam<FpduCase> {};

// A broken FPDU gives the same error with `whole` events on: they are only for FPDUs that
// check out.
TEST_P(MalformedFpdu, AllAtOnceAndByteByByte) {
  const FpduCase& c = GetParam();
  for (const bool whole_events : {false, true}) {
    for (const std::size_t chunk : {std::size_t{0}, std::size_t{1}}) {
      SCOPED_TRACE(chunk == 0 ? "all at once" : "byte by byte");
      SCOPED_TRACE(whole_events ? "whole events" : "events in parts");
      FpduStreamDecoder decoder(c.check_crc, c.max_ulpdu);
      decoder.set_whole_events(whole_events);
      const Outcome o = run(decoder, c.bytes, chunk);
      ASSERT_TRUE(o.error.has_value());
      EXPECT_EQ(*o.error, c.error);
      EXPECT_EQ(o.ended, 0u);
      EXPECT_TRUE(decoder.failed());
    }
  }
}

TEST_P(MalformedFpdu, AfterAValidFpdu) {
  const FpduCase& c = GetParam();
  // A valid FPDU the decoder accepts first (the zero-length Write RTR when max_ulpdu is tiny).
  const Bytes& valid = load_be16(kValidSend.data()) <= c.max_ulpdu ? kValidSend : kValidWrite;
  for (const bool whole_events : {false, true}) {
    for (const std::size_t chunk : {std::size_t{7}, std::size_t{0}}) {
      FpduStreamDecoder decoder(c.check_crc, c.max_ulpdu);
      decoder.set_whole_events(whole_events);
      const Outcome o = run(decoder, concat(valid, c.bytes), chunk);
      ASSERT_TRUE(o.error.has_value());
      EXPECT_EQ(*o.error, c.error);
      EXPECT_EQ(o.ended, 1u);
    }
  }
}

TEST_P(MalformedFpdu, StaysFailedWithTheSameError) {
  const FpduCase& c = GetParam();
  FpduStreamDecoder decoder(c.check_crc, c.max_ulpdu);
  ASSERT_TRUE(run(decoder, c.bytes, 0).error.has_value());
  for (int i = 0; i < 3; ++i) {
    std::size_t consumed = 99;
    const FpduEvent event = decoder.next(kValidSend, consumed);
    EXPECT_EQ(event.kind, FpduEvent::Kind::error);
    EXPECT_EQ(event.error, c.error);
    EXPECT_EQ(consumed, 0u);
    EXPECT_TRUE(decoder.failed());
    EXPECT_FALSE(decoder.in_payload());
    EXPECT_EQ(decoder.payload_remaining(), 0u);
  }
}

INSTANTIATE_TEST_SUITE_P(Table, MalformedFpdu, ::testing::ValuesIn(fpdu_cases()),
                         [](const ::testing::TestParamInfo<FpduCase>& param_info) { return param_info.param.name; });

TEST(MalformedFpduControls, TheBuildersMakeValidFpdus) {
  const Bytes read_request = untagged_ulpdu(0x41, 0x41, kQueueReadRequest, 1, 0, Bytes(kReadRequestHeaderSize, 0));
  const Bytes untagged_copy = untagged_ulpdu(0x41, 0x43, 0, 1, 0);
  const Bytes valid[] = {
      kValidSend,
      fpdu_from_ulpdu(tagged_ulpdu(0xC1, 0x40, 1, 0)),
      fpdu_from_ulpdu(tagged_ulpdu(0x81, 0x42, 1, 0, Bytes(3, 9))),
      fpdu_from_ulpdu(read_request),
      fpdu_from_ulpdu(terminate_ulpdu(0x20, 0x00)),
      fpdu_from_ulpdu(terminate_ulpdu(0x10, 0x80)),  // M alone: no length field
      fpdu_from_ulpdu(terminate_ulpdu(0x10, 0x80, {0x00, 0x12})),  // ... or a zero-filled one
      fpdu_from_ulpdu(terminate_ulpdu(0x10, 0xC0, concat({0x00, 0x12}, untagged_copy))),
      fpdu_from_ulpdu(terminate_ulpdu(0x01, 0xE0, concat(concat({0x00, 0x2e}, untagged_copy), Bytes(28, 3)))),
      fpdu_from_ulpdu(untagged_ulpdu(0x7D, 0x73, 0, 1, 0)),  // reserved bits are not checked
  };
  for (const Bytes& bytes : valid) {
    FpduStreamDecoder decoder(true);
    const Outcome o = run(decoder, bytes, 0);
    EXPECT_FALSE(o.error.has_value()) << to_string(*o.error);
    EXPECT_EQ(o.ended, 1u);
  }
}

TEST(FpduStickyFailure, PayloadPlacedDoesNotRevive) {
  FpduStreamDecoder decoder(true);
  ASSERT_TRUE(run(decoder, fpdu_from_ulpdu(untagged_ulpdu(0x41, 0x4A, 0, 1, 0)), 0).error.has_value());
  decoder.payload_placed({});
  decoder.payload_placed(kValidSend);
  EXPECT_TRUE(decoder.failed());
  std::size_t consumed = 0;
  const FpduEvent event = decoder.next(kValidSend, consumed);
  EXPECT_EQ(event.kind, FpduEvent::Kind::error);
  EXPECT_EQ(event.error, WireError::rdmap_unknown_opcode);
  EXPECT_EQ(consumed, 0u);
}

TEST(FpduStickyFailure, ErrorInsideAPayloadStopsEverything) {
  Bytes stream = concat(flipped(kValidSend, 25), kValidSend);
  FpduStreamDecoder decoder(true);
  const Outcome o = run(decoder, stream, 3);
  ASSERT_TRUE(o.error.has_value());
  EXPECT_EQ(*o.error, WireError::fpdu_bad_crc);
  EXPECT_EQ(o.headers, 1u);
  EXPECT_EQ(o.ended, 0u);
  EXPECT_TRUE(decoder.failed());
}

// ---------------------------------------------------------------------------------------
// CM header.

Bytes cm_bytes() {
  Bytes out(kCmHeaderSize);
  const CmHeader h{.flags = CmHeader::kFlagPeerToPeer, .node_guid = 1, .incarnation = 2, .listen_port = 3, .tag = 4,
                   .cmid = 5};
  EXPECT_TRUE(encode_cm_header(h, out).has_value());
  return out;
}

Bytes cm_with(std::size_t at, std::uint8_t value) {
  Bytes b = cm_bytes();
  b[at] = value;
  return b;
}

struct CmCase {
  std::string name;
  Bytes bytes;
  WireError error;
};

void PrintTo(const CmCase& c, std::ostream* os) { *os << c.name; }

std::vector<CmCase> cm_cases() {
  using E = WireError;
  return {
      {"truncated_empty", {}, E::truncated},
      {"truncated_7_bytes", first(cm_bytes(), 7), E::truncated},
      {"truncated_8_bytes", first(cm_bytes(), 8), E::truncated},
      {"truncated_35_bytes", first(cm_bytes(), 35), E::truncated},
      {"bad_magic", cm_with(3, 'X'), E::cm_bad_magic},
      {"bad_magic_all_zero", Bytes(kCmHeaderSize, 0), E::cm_bad_magic},
      {"bad_magic_short_input", first(cm_with(0, 'Q'), 8), E::cm_bad_magic},
      {"version_0", cm_with(4, 0), E::cm_unsupported_version},
      {"version_2", cm_with(4, 2), E::cm_unsupported_version},
      {"length_0", cm_with(7, 0), E::cm_bad_length},
      {"length_35", cm_with(7, 35), E::cm_bad_length},
      {"length_37", cm_with(7, 37), E::cm_bad_length},
      {"length_high_byte", cm_with(6, 1), E::cm_bad_length},
      {"flag_0x02", cm_with(5, 0x03), E::cm_reserved_bits_set},
      {"flag_0x80", cm_with(5, 0x80), E::cm_reserved_bits_set},
      {"reserved_field_low", cm_with(27, 0x01), E::cm_reserved_bits_set},
      {"reserved_field_high", cm_with(26, 0x80), E::cm_reserved_bits_set},
  };
}

class MalformedCmHeader : public ::testing::TestWithParam<CmCase> {};

TEST_P(MalformedCmHeader, Decode) {
  const CmCase& c = GetParam();
  auto view = decode_cm_header(c.bytes);
  ASSERT_FALSE(view.has_value());
  EXPECT_EQ(view.error(), c.error);
}

INSTANTIATE_TEST_SUITE_P(Table, MalformedCmHeader, ::testing::ValuesIn(cm_cases()),
                         [](const ::testing::TestParamInfo<CmCase>& param_info) { return param_info.param.name; });

TEST(MalformedCmHeaderControls, UnmodifiedBytesDecode) {
  EXPECT_TRUE(decode_cm_header(cm_bytes()).has_value());
  EXPECT_TRUE(decode_cm_header(cm_with(5, 0)).has_value());
}

// ---------------------------------------------------------------------------------------
// Fuzz-ish robustness with a fixed seed: random and mutated inputs never crash (ASan/UBSan
// builds check memory), and whatever is accepted re-encodes to the same bytes.

constexpr int kFuzzRounds = 3000;

Bytes random_bytes(std::mt19937& rng, std::size_t max) {
  std::uniform_int_distribution<std::size_t> length(0, max);
  Bytes out(length(rng));
  for (auto& b : out) b = static_cast<std::uint8_t>(rng());
  return out;
}

// Flips, overwrites, truncates or extends a valid input.
Bytes mutate(Bytes b, std::mt19937& rng) {
  const int edits = static_cast<int>(rng() % 4) + 1;
  for (int i = 0; i < edits; ++i) {
    switch (rng() % 4) {
      case 0:
        if (!b.empty()) b[rng() % b.size()] ^= static_cast<std::uint8_t>(1u << (rng() % 8));
        break;
      case 1:
        if (!b.empty()) b[rng() % b.size()] = static_cast<std::uint8_t>(rng());
        break;
      case 2:
        if (!b.empty()) b.resize(rng() % b.size());
        break;
      default:
        for (std::size_t n = rng() % 8; n > 0; --n) b.push_back(static_cast<std::uint8_t>(rng()));
        break;
    }
  }
  return b;
}

Bytes valid_mpa(std::mt19937& rng, MpaFrameKind kind) {
  MpaFrame f;
  f.kind = kind;
  f.markers = rng() % 2 == 0;
  f.crc = rng() % 2 == 0;
  f.rejected = kind == MpaFrameKind::reply && rng() % 2 == 0;
  f.revision = static_cast<std::uint8_t>(1 + rng() % 2);
  if (f.revision == 2 && rng() % 2 == 0) {
    f.enhanced = IrdOrdBlock{.peer_to_peer = rng() % 2 == 0, .send_rtr = rng() % 2 == 0,
                             .ird = static_cast<std::uint16_t>(rng() & kIrdOrdMax),
                             .ord = static_cast<std::uint16_t>(rng() & kIrdOrdMax)};
  }
  const Bytes pd = random_bytes(rng, 64);
  f.private_data = pd;
  Bytes out(kMpaMaxFrameSize);
  auto size = encode_mpa_frame(f, out);
  EXPECT_TRUE(size.has_value());
  out.resize(size ? *size : 0);
  return out;
}

TEST(Fuzz, MpaDecodeAndReaderNeverMisbehave) {
  std::mt19937 rng(0x5EED0001);
  int accepted = 0;
  for (int round = 0; round < kFuzzRounds; ++round) {
    const MpaFrameKind kind = rng() % 2 == 0 ? MpaFrameKind::request : MpaFrameKind::reply;
    const Bytes input = rng() % 3 == 0 ? random_bytes(rng, 600) : mutate(valid_mpa(rng, kind), rng);
    const auto frame = decode_mpa_frame(input, kind);
    if (frame) {
      ++accepted;
      // Everything an accepted frame holds is represented: it re-encodes to the same bytes.
      Bytes again(kMpaMaxFrameSize);
      const auto size = encode_mpa_frame(*frame, again);
      ASSERT_TRUE(size.has_value()) << round;
      again.resize(*size);
      ASSERT_EQ(again, input) << round;
    }
    // The reader over random split points.
    MpaFrameReader reader(kind);
    std::size_t taken = 0;
    while (taken < input.size()) {
      const std::size_t piece = std::min<std::size_t>(input.size() - taken, 1 + rng() % 40);
      const std::size_t n = reader.feed(std::span(input).subspan(taken, piece));
      ASSERT_LE(n, piece) << round;
      taken += n;
      if (n < piece) break;
    }
    ASSERT_FALSE(reader.complete() && reader.error().has_value()) << round;
    if (reader.complete()) {
      const auto whole = decode_mpa_frame(std::span(input).first(taken), kind);
      ASSERT_TRUE(whole.has_value()) << round;
      ASSERT_EQ(reader.frame()->private_data.size(), whole->private_data.size()) << round;
      ASSERT_TRUE(std::equal(whole->private_data.begin(), whole->private_data.end(),
                             reader.frame()->private_data.begin()))
          << round;
      if (frame) {
        ASSERT_EQ(taken, input.size()) << round;
      }
    } else if (reader.error()) {
      ASSERT_FALSE(frame.has_value()) << round;
    } else {
      ASSERT_EQ(taken, input.size()) << round;
      ASSERT_FALSE(frame.has_value()) << round;
    }
  }
  EXPECT_GT(accepted, 0);  // the mutator leaves some frames valid
}

Bytes valid_fpdu_stream(std::mt19937& rng) {
  Bytes out;
  const std::size_t count = 1 + rng() % 4;
  for (std::size_t i = 0; i < count; ++i) {
    SegmentHeader h;
    h.opcode = static_cast<RdmapOpcode>(rng() % 8);
    h.queue_number = is_tagged(h.opcode) ? 0 : queue_number_for(h.opcode);
    h.msn = static_cast<std::uint32_t>(rng());
    if (h.opcode == RdmapOpcode::terminate) {
      h.terminate.segment_length_valid = rng() % 2 == 0;
      h.terminate.ddp_header_length = static_cast<std::uint8_t>(rng() % 2 == 0 ? 0 : kUntaggedHeaderSize);
      h.terminate.has_rdma_header = rng() % 2 == 0;
    }
    const bool has_payload = h.opcode != RdmapOpcode::read_request && h.opcode != RdmapOpcode::terminate;
    const Bytes payload = has_payload ? random_bytes(rng, 100) : Bytes{};
    const std::size_t at = out.size();
    out.resize(at + fpdu_wire_size(segment_header_size(h) + payload.size()));
    EXPECT_TRUE(encode_fpdu(h, payload, true, std::span(out).subspan(at)).has_value());
  }
  return out;
}

TEST(Fuzz, FpduStreamDecoderNeverMisbehaves) {
  std::mt19937 rng(0x5EED0002);
  int completed = 0;
  int errors = 0;
  for (int round = 0; round < kFuzzRounds; ++round) {
    const bool check_crc = rng() % 4 != 0;
    const std::size_t max_ulpdu = rng() % 2 == 0 ? kMaxUlpduLength : 14 + rng() % 200;
    const Bytes input = rng() % 3 == 0 ? random_bytes(rng, 400) : mutate(valid_fpdu_stream(rng), rng);
    FpduStreamDecoder decoder(check_crc, max_ulpdu);
    std::size_t at = 0;
    std::size_t payload_left = 0;
    bool in_segment = false;
    bool failed = false;
    std::size_t steps = 0;
    while (at < input.size() && !failed) {
      const std::size_t piece = std::min<std::size_t>(input.size() - at, 1 + rng() % 64);
      std::span<const std::uint8_t> rest = std::span(input).subspan(at, piece);
      at += piece;
      for (;;) {
        ASSERT_LT(++steps, 100000u) << "no progress in round " << round;
        std::size_t consumed = 0;
        const FpduEvent event = decoder.next(rest, consumed);
        ASSERT_LE(consumed, rest.size()) << round;
        rest = rest.subspan(consumed);
        if (event.kind == FpduEvent::Kind::need_more) {
          ASSERT_TRUE(rest.empty()) << round;
          break;
        }
        if (event.kind == FpduEvent::Kind::error) {
          ASSERT_TRUE(decoder.failed()) << round;
          failed = true;
          ++errors;
          break;
        }
        if (event.kind == FpduEvent::Kind::header) {
          ASSERT_FALSE(in_segment) << round;
          ASSERT_LE(event.payload_length, max_ulpdu) << round;
          in_segment = true;
          payload_left = event.payload_length;
        } else if (event.kind == FpduEvent::Kind::payload) {
          ASSERT_TRUE(in_segment) << round;
          ASSERT_FALSE(event.payload.empty()) << round;
          ASSERT_LE(event.payload.size(), payload_left) << round;
          // The view lies inside the caller's input.
          ASSERT_GE(event.payload.data(), input.data()) << round;
          ASSERT_LE(event.payload.data() + event.payload.size(), input.data() + input.size()) << round;
          payload_left -= event.payload.size();
        } else {
          ASSERT_TRUE(in_segment) << round;
          ASSERT_EQ(payload_left, 0u) << round;
          in_segment = false;
          ++completed;
        }
      }
    }
    if (failed) {
      std::size_t consumed = 1;
      ASSERT_EQ(decoder.next(input, consumed).kind, FpduEvent::Kind::error) << round;
      ASSERT_EQ(consumed, 0u) << round;
    }
  }
  EXPECT_GT(completed, 0);
  EXPECT_GT(errors, 0);
}

TEST(Fuzz, SegmentHeaderDecodeNeverMisbehaves) {
  std::mt19937 rng(0x5EED0003);
  for (int round = 0; round < kFuzzRounds; ++round) {
    Bytes input = random_bytes(rng, kMaxSegmentHeaderSize + 8);
    if (input.size() >= 2 && rng() % 2 == 0) {
      input[0] = static_cast<std::uint8_t>((input[0] & 0xFC) | 0x01);  // DV 1
      input[1] = static_cast<std::uint8_t>((input[1] & 0x0F) | 0x40);  // RV 1
    }
    const std::size_t ulpdu_length = rng() % 2 == 0 ? input.size() : rng() % 200;
    const auto header = decode_segment_header(input, ulpdu_length);
    if (!header) continue;
    ASSERT_LE(segment_header_size(*header), ulpdu_length) << round;
    // Re-encoding an accepted header is stable.
    Bytes again(kMaxSegmentHeaderSize);
    const auto size = encode_segment_header(*header, again);
    ASSERT_TRUE(size.has_value()) << round;
    const auto twice = decode_segment_header(std::span(again).first(*size),
                                             header->opcode == RdmapOpcode::terminate ? *size : ulpdu_length);
    ASSERT_TRUE(twice.has_value()) << round;
    ASSERT_EQ(twice->opcode, header->opcode) << round;
    ASSERT_EQ(twice->msn, header->msn) << round;
    ASSERT_EQ(twice->stag, header->stag) << round;
    ASSERT_EQ(twice->read_request, header->read_request) << round;
    ASSERT_EQ(twice->terminate, header->terminate) << round;
  }
}

TEST(Fuzz, CmHeaderDecodeNeverMisbehaves) {
  std::mt19937 rng(0x5EED0004);
  int accepted = 0;
  for (int round = 0; round < kFuzzRounds; ++round) {
    const Bytes input = rng() % 3 == 0 ? random_bytes(rng, 80) : mutate(concat(cm_bytes(), random_bytes(rng, 16)), rng);
    const auto view = decode_cm_header(input);
    if (!view) continue;
    ++accepted;
    Bytes again(kCmHeaderSize);
    ASSERT_TRUE(encode_cm_header(view->header, again).has_value()) << round;
    again.insert(again.end(), view->application_data.begin(), view->application_data.end());
    ASSERT_EQ(again, input) << round;
  }
  EXPECT_GT(accepted, 0);
}

}  // namespace
}  // namespace peercm::wire
