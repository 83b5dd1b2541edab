#include "wire/fpdu.hpp"

#include <algorithm>
#include <cstring>

#include "wire/byte_io.hpp"

namespace peercm::wire {
namespace {

// RFC 5044 §4.1: PAD is sent as zero; peercm treats anything else as a broken stream.
bool padding_is_zero(const std::uint8_t* pad, std::size_t n) {
  return std::all_of(pad, pad + n, [](std::uint8_t b) { return b == 0; });
}

}  // namespace

std::size_t mulpdu_for_emss(std::size_t emss) {
  if (emss < kMinMulpdu + 6 + emss % 4) return kMinMulpdu;  // also keeps the subtraction from wrapping
  const std::size_t mulpdu = emss - (6 + emss % 4);
  return std::clamp(mulpdu, kMinMulpdu, kMaxMulpdu);
}

Status<WireError> FpduFramer::begin(const SegmentHeader& header, std::size_t payload_length) {
  const std::size_t header_size = segment_header_size(header);
  const std::size_t ulpdu_length = header_size + payload_length;
  if (ulpdu_length > kMaxUlpduLength) return fail(WireError::fpdu_ulpdu_too_long);
  store_be16(prefix_.data(), static_cast<std::uint16_t>(ulpdu_length));
  auto written = encode_segment_header(header, std::span(prefix_).subspan(kUlpduLengthSize));
  if (!written) return fail(written.error());
  prefix_size_ = kUlpduLengthSize + header_size;
  padding_ = fpdu_padding(ulpdu_length);
  crc_.reset();
  prefix_in_crc_ = false;
  return {};
}

void FpduFramer::absorb_prefix() {
  crc_.update(prefix());
  prefix_in_crc_ = true;
}

std::span<const std::uint8_t> FpduFramer::finish(bool with_crc) {
  std::fill(trailer_.begin(), trailer_.end(), std::uint8_t{0});
  std::uint32_t crc = 0;
  if (with_crc) {
    if (!prefix_in_crc_) absorb_prefix();
    crc_.update(std::span(trailer_).first(padding_));
    crc = crc_.finish();
  }
  store_crc_field(crc, trailer_.data() + padding_);
  return std::span(trailer_).first(padding_ + kFpduCrcSize);
}

// Same bytes and errors as FpduFramer + copies, but encoded in place: no 100-byte framer to
// zero, no prefix/trailer copies, and one CRC pass over the finished FPDU.
Result<std::size_t, WireError> encode_fpdu(const SegmentHeader& header, std::span<const std::uint8_t> payload,
                                           bool with_crc, std::span<std::uint8_t> out) {
  const std::size_t header_size = segment_header_size(header);
  const std::size_t ulpdu_length = header_size + payload.size();
  if (ulpdu_length > kMaxUlpduLength) return fail(WireError::fpdu_ulpdu_too_long);
  const std::size_t total = fpdu_wire_size(ulpdu_length);
  if (out.size() < total) {
    // A header the encoder rejects is reported before a short buffer.
    std::array<std::uint8_t, kMaxSegmentHeaderSize> scratch;
    if (auto written = encode_segment_header(header, scratch); !written) return fail(written.error());
    return fail(WireError::buffer_too_small);
  }
  // encode_segment_header writes nothing when it fails, so `out` is untouched on error.
  if (auto written = encode_segment_header(header, out.subspan(kUlpduLengthSize, header_size)); !written)
    return fail(written.error());
  std::uint8_t* p = out.data();
  store_be16(p, static_cast<std::uint16_t>(ulpdu_length));
  p += kUlpduLengthSize + header_size;
  if (!payload.empty()) std::memcpy(p, payload.data(), payload.size());
  p += payload.size();
  const std::size_t padding = fpdu_padding(ulpdu_length);
  for (std::size_t i = 0; i < padding; ++i) *p++ = 0;
  const std::uint32_t crc = with_crc ? crc32c(out.first(total - kFpduCrcSize)) : 0;
  store_crc_field(crc, p);
  return total;
}

void FpduStreamDecoder::fail_with(FpduEvent& event, WireError error) {
  phase_ = Phase::failed;
  error_ = error;
  event.kind = FpduEvent::Kind::error;
  event.error = error;
}

void FpduStreamDecoder::payload_placed(std::span<const std::uint8_t> bytes) {
  if (phase_ != Phase::payload) return;  // nothing expected: must not skip to (or revive) a trailer
  const std::size_t n = std::min(bytes.size(), payload_left_);
  if (check_crc_) crc_.update(bytes.first(n));
  payload_left_ -= n;
  if (payload_left_ == 0) phase_ = Phase::trailer;
}

void FpduStreamDecoder::finish_trailer(FpduEvent& event) {
  const std::size_t padding = trailer_size_ - kFpduCrcSize;
  if (!padding_is_zero(trailer_.data(), padding)) return fail_with(event, WireError::fpdu_bad_padding);
  if (check_crc_) {
    crc_.update(std::span(trailer_).first(padding));
    if (load_crc_field(trailer_.data() + padding) != crc_.finish()) return fail_with(event, WireError::fpdu_bad_crc);
  }
  phase_ = Phase::length;
  header_filled_ = 0;
  trailer_filled_ = 0;
  event.kind = FpduEvent::Kind::end;
}

bool fpdu_trailer_valid(std::span<const std::uint8_t> fpdu, std::size_t ulpdu_length, bool check_crc) {
  const std::size_t padding = fpdu_padding(ulpdu_length);
  const std::size_t crc_at = kUlpduLengthSize + ulpdu_length + padding;
  if (!padding_is_zero(fpdu.data() + crc_at - padding, padding)) return false;
  return !check_crc || load_crc_field(fpdu.data() + crc_at) == crc32c(fpdu.first(crc_at));
}

bool FpduStreamDecoder::whole_fpdu_in(std::span<const std::uint8_t> in, std::size_t at,
                                      const std::uint8_t* fpdu) const {
  if (in.size() - at < payload_left_ + trailer_size_) return false;
  return fpdu_trailer_valid(std::span(fpdu, fpdu_wire_size(ulpdu_length_)), ulpdu_length_, check_crc_);
}

// Every path returns the one `event`, built in the caller's storage (NRVO).
FpduEvent FpduStreamDecoder::next(std::span<const std::uint8_t> in, std::size_t& consumed) {
  FpduEvent event;  // need_more until a phase says otherwise
  consumed = 0;
  auto take_header_bytes = [&](std::size_t target) {
    const std::size_t n = std::min(in.size() - consumed, target - header_filled_);
    if (n > 0) std::memcpy(header_.data() + header_filled_, in.data() + consumed, n);
    header_filled_ += n;
    consumed += n;
    return header_filled_ == target;
  };
  // Set when this call found the FPDU's first bytes at in[consumed]: if the whole header is
  // there too it is decoded where it lies instead of being copied into header_ first.
  const std::uint8_t* fpdu_start = nullptr;
  for (;;) {
    switch (phase_) {
      case Phase::failed:
        // The stream already broke; nothing more is decoded, the first error is repeated.
        fail_with(event, error_);
        return event;
      case Phase::length: {
        // ULPDU_Length plus the two control bytes tell how long the header is.
        if (header_filled_ == 0 && in.size() - consumed >= kUlpduLengthSize + 2) {
          fpdu_start = in.data() + consumed;  // same as take_header_bytes, with a fixed-size copy
          std::memcpy(header_.data(), fpdu_start, kUlpduLengthSize + 2);
          header_filled_ = kUlpduLengthSize + 2;
          consumed += kUlpduLengthSize + 2;
        } else if (!take_header_bytes(kUlpduLengthSize + 2)) {
          return event;
        }
        ulpdu_length_ = load_be16(header_.data());
        if (ulpdu_length_ > max_ulpdu_) {
          fail_with(event, WireError::fpdu_ulpdu_too_long);
          return event;
        }
        // Shorter than any DDP header: the "control bytes" just taken would be PAD or CRC.
        if (ulpdu_length_ < kTaggedHeaderSize) {
          fail_with(event, WireError::fpdu_ulpdu_too_short);
          return event;
        }
        auto size = peek_segment_header_size(header_[2], header_[3], ulpdu_length_);
        if (!size) {
          fail_with(event, size.error());
          return event;
        }
        header_size_ = *size;
        phase_ = Phase::header;
        break;
      }
      case Phase::header: {
        const std::size_t fpdu_header_size = kUlpduLengthSize + header_size_;
        std::span<const std::uint8_t> bytes;  // ULPDU_Length and the segment header
        if (fpdu_start != nullptr && header_filled_ + (in.size() - consumed) >= fpdu_header_size) {
          bytes = std::span(fpdu_start, fpdu_header_size);
          consumed += fpdu_header_size - header_filled_;
          header_filled_ = fpdu_header_size;
        } else if (take_header_bytes(fpdu_header_size)) {
          bytes = std::span(header_).first(fpdu_header_size);
        } else {
          return event;
        }
        decoded_ = SegmentHeader{};
        if (auto ok = detail::decode_sized_segment_header_into(bytes.subspan(kUlpduLengthSize), header_size_, decoded_);
            !ok) {
          fail_with(event, ok.error());
          return event;
        }
        payload_left_ = ulpdu_length_ - header_size_;
        trailer_size_ = fpdu_padding(ulpdu_length_) + kFpduCrcSize;
        event.header = &decoded_;
        event.payload_length = payload_left_;
        if (whole_events_ && fpdu_start != nullptr && whole_fpdu_in(in, consumed, fpdu_start)) {
          event.kind = FpduEvent::Kind::whole;
          event.payload = in.subspan(consumed, payload_left_);
          consumed += payload_left_ + trailer_size_;
          payload_left_ = 0;
          phase_ = Phase::length;
          header_filled_ = 0;
          return event;
        }
        if (check_crc_) {
          crc_.reset();
          crc_.update(bytes);
        }
        phase_ = payload_left_ > 0 ? Phase::payload : Phase::trailer;
        event.kind = FpduEvent::Kind::header;
        return event;
      }
      case Phase::payload: {
        const std::size_t n = std::min(in.size() - consumed, payload_left_);
        if (n == 0) return event;
        event.kind = FpduEvent::Kind::payload;
        event.payload = in.subspan(consumed, n);
        consumed += n;
        payload_placed(event.payload);
        return event;
      }
      case Phase::trailer: {
        const std::size_t n = std::min(in.size() - consumed, trailer_size_ - trailer_filled_);
        if (n > 0) std::memcpy(trailer_.data() + trailer_filled_, in.data() + consumed, n);
        trailer_filled_ += n;
        consumed += n;
        if (trailer_filled_ < trailer_size_) return event;
        finish_trailer(event);
        return event;
      }
    }
  }
}

}  // namespace peercm::wire
