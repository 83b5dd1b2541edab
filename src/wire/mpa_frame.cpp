#include "wire/mpa_frame.hpp"

#include <algorithm>
#include <cstring>

#include "wire/byte_io.hpp"

namespace peercm::wire {
namespace {

constexpr std::array<std::uint8_t, 16> kRequestKey = {'M', 'P', 'A', ' ', 'I', 'D', ' ', 'R',
                                                      'e', 'q', ' ', 'F', 'r', 'a', 'm', 'e'};
constexpr std::array<std::uint8_t, 16> kReplyKey = {'M', 'P', 'A', ' ', 'I', 'D', ' ', 'R',
                                                    'e', 'p', ' ', 'F', 'r', 'a', 'm', 'e'};
constexpr std::uint8_t kFlagMarkers = 0x80;
constexpr std::uint8_t kFlagCrc = 0x40;
constexpr std::uint8_t kFlagReject = 0x20;
constexpr std::uint8_t kFlagEnhanced = 0x10;
constexpr std::uint8_t kFlagReserved = 0x0F;
constexpr std::uint16_t kIrdOrdFlagHigh = 0x8000;
constexpr std::uint16_t kIrdOrdFlagLow = 0x4000;

const std::array<std::uint8_t, 16>& key_for(MpaFrameKind kind) {
  return kind == MpaFrameKind::request ? kRequestKey : kReplyKey;
}

}  // namespace

Result<std::size_t, WireError> mpa_frame_size(const MpaFrame& frame) {
  const std::size_t pd = frame.private_data.size() + (frame.enhanced ? kIrdOrdBlockSize : 0);
  if (pd > kMpaMaxPrivateData) return fail(WireError::mpa_private_data_too_long);
  if (frame.enhanced && frame.revision < 2) return fail(WireError::mpa_enhanced_needs_rev2);
  if (frame.revision < 1 || frame.revision > 2) return fail(WireError::mpa_bad_revision);
  if (frame.enhanced && (frame.enhanced->ird > kIrdOrdMax || frame.enhanced->ord > kIrdOrdMax))
    return fail(WireError::mpa_ird_ord_out_of_range);
  return kMpaFrameHeaderSize + pd;
}

Result<std::size_t, WireError> encode_mpa_frame(const MpaFrame& frame, std::span<std::uint8_t> out) {
  auto size = mpa_frame_size(frame);
  if (!size) return size;
  if (out.size() < *size) return fail(WireError::buffer_too_small);
  std::uint8_t* p = out.data();
  std::memcpy(p, key_for(frame.kind).data(), 16);
  std::uint8_t flags = 0;
  if (frame.markers) flags |= kFlagMarkers;
  if (frame.crc) flags |= kFlagCrc;
  if (frame.rejected && frame.kind == MpaFrameKind::reply) flags |= kFlagReject;
  if (frame.enhanced) flags |= kFlagEnhanced;
  p[16] = flags;
  p[17] = frame.revision;
  store_be16(p + 18, static_cast<std::uint16_t>(*size - kMpaFrameHeaderSize));
  std::uint8_t* pd = p + kMpaFrameHeaderSize;
  if (frame.enhanced) {
    const IrdOrdBlock& b = *frame.enhanced;
    store_be16(pd, static_cast<std::uint16_t>((b.peer_to_peer ? kIrdOrdFlagHigh : 0) |
                                               (b.send_rtr ? kIrdOrdFlagLow : 0) | b.ird));
    store_be16(pd + 2, static_cast<std::uint16_t>((b.write_rtr ? kIrdOrdFlagHigh : 0) |
                                                   (b.read_rtr ? kIrdOrdFlagLow : 0) | b.ord));
    pd += kIrdOrdBlockSize;
  }
  if (!frame.private_data.empty()) std::memcpy(pd, frame.private_data.data(), frame.private_data.size());
  return *size;
}

// RFC 5044 §7.1.2: wrong key, unsupported revision or oversized PD_Length all close the
// connection; peercm also refuses reserved bits (every known stack sends them as zero).
Result<std::size_t, WireError> mpa_frame_length(std::span<const std::uint8_t> header,
                                                MpaFrameKind expected) {
  if (header.size() < kMpaFrameHeaderSize) return fail(WireError::truncated);
  if (!std::equal(key_for(expected).begin(), key_for(expected).end(), header.begin()))
    return fail(WireError::mpa_bad_key);
  const std::uint8_t flags = header[16];
  const std::uint8_t revision = header[17];
  if (revision < 1 || revision > 2) return fail(WireError::mpa_bad_revision);
  if (flags & kFlagReserved) return fail(WireError::mpa_reserved_bits_set);
  if (expected == MpaFrameKind::request && (flags & kFlagReject))
    return fail(WireError::mpa_reject_in_request);
  if ((flags & kFlagEnhanced) && revision < 2) return fail(WireError::mpa_enhanced_needs_rev2);
  const std::size_t pd_length = load_be16(header.data() + 18);
  if (pd_length > kMpaMaxPrivateData) return fail(WireError::mpa_private_data_too_long);
  if ((flags & kFlagEnhanced) && pd_length < kIrdOrdBlockSize) return fail(WireError::mpa_length_mismatch);
  return kMpaFrameHeaderSize + pd_length;
}

Result<MpaFrame, WireError> decode_mpa_frame(std::span<const std::uint8_t> bytes, MpaFrameKind expected) {
  auto length = mpa_frame_length(bytes, expected);
  if (!length) return fail(length.error());
  if (bytes.size() != *length) {
    return fail(bytes.size() < *length ? WireError::truncated : WireError::mpa_length_mismatch);
  }
  const std::uint8_t flags = bytes[16];
  MpaFrame frame;
  frame.kind = expected;
  frame.markers = flags & kFlagMarkers;
  frame.crc = flags & kFlagCrc;
  frame.rejected = flags & kFlagReject;
  frame.revision = bytes[17];
  std::span<const std::uint8_t> pd = bytes.subspan(kMpaFrameHeaderSize);
  if (flags & kFlagEnhanced) {
    const std::uint16_t ird_word = load_be16(pd.data());
    const std::uint16_t ord_word = load_be16(pd.data() + 2);
    frame.enhanced = IrdOrdBlock{
        .peer_to_peer = (ird_word & kIrdOrdFlagHigh) != 0,
        .send_rtr = (ird_word & kIrdOrdFlagLow) != 0,
        .write_rtr = (ord_word & kIrdOrdFlagHigh) != 0,
        .read_rtr = (ord_word & kIrdOrdFlagLow) != 0,
        .ird = static_cast<std::uint16_t>(ird_word & kIrdOrdMax),
        .ord = static_cast<std::uint16_t>(ord_word & kIrdOrdMax),
    };
    pd = pd.subspan(kIrdOrdBlockSize);
  }
  frame.private_data = pd;
  return frame;
}

std::size_t MpaFrameReader::feed(std::span<const std::uint8_t> in) {
  if (frame_ || error_) return 0;
  std::size_t taken = 0;
  if (filled_ < kMpaFrameHeaderSize) {
    // Check the key byte by byte so a wrong stream fails as early as possible.
    const std::size_t n = std::min(in.size(), kMpaFrameHeaderSize - filled_);
    if (n > 0) std::memcpy(buffer_.data() + filled_, in.data(), n);
    const auto& key = key_for(expected_);
    for (std::size_t i = filled_; i < std::min<std::size_t>(filled_ + n, key.size()); ++i) {
      if (buffer_[i] != key[i]) {
        error_ = WireError::mpa_bad_key;
        return i - filled_ + 1;
      }
    }
    filled_ += n;
    taken += n;
    if (filled_ < kMpaFrameHeaderSize) return taken;
    auto length = mpa_frame_length(std::span(buffer_).first(kMpaFrameHeaderSize), expected_);
    if (!length) {
      error_ = length.error();
      return taken;
    }
    frame_length_ = *length;
  }
  const std::size_t n = std::min(in.size() - taken, frame_length_ - filled_);
  if (n > 0) std::memcpy(buffer_.data() + filled_, in.data() + taken, n);
  filled_ += n;
  taken += n;
  if (filled_ == frame_length_) {
    auto frame = decode_mpa_frame(std::span(buffer_).first(frame_length_), expected_);
    if (frame) {
      frame_ = *frame;
    } else {
      error_ = frame.error();
    }
  }
  return taken;
}

}  // namespace peercm::wire
