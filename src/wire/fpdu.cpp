#include "wire/fpdu.hpp"

#include <algorithm>
#include <cstring>

#include "wire/byte_io.hpp"

namespace peercm::wire {

std::size_t mulpdu_for_emss(std::size_t emss) {
  if (emss < 6) return kMinMulpdu;
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
  crc_.update(prefix());
  return {};
}

std::span<const std::uint8_t> FpduFramer::finish(bool with_crc) {
  std::fill(trailer_.begin(), trailer_.end(), std::uint8_t{0});
  crc_.update(std::span(trailer_).first(padding_));
  const std::uint32_t crc = with_crc ? crc_.finish() : 0;
  // The one little-endian field of iWARP (RFC 5044 §4.4, worked examples in Figs. 5-6).
  for (std::size_t i = 0; i < kFpduCrcSize; ++i)
    trailer_[padding_ + i] = static_cast<std::uint8_t>(crc >> (8 * i));
  return std::span(trailer_).first(padding_ + kFpduCrcSize);
}

Result<std::size_t, WireError> encode_fpdu(const SegmentHeader& header, std::span<const std::uint8_t> payload,
                                           bool with_crc, std::span<std::uint8_t> out) {
  FpduFramer framer;
  if (auto ok = framer.begin(header, payload.size()); !ok) return fail(ok.error());
  const std::size_t total = fpdu_wire_size(framer.prefix().size() - kUlpduLengthSize + payload.size());
  if (out.size() < total) return fail(WireError::buffer_too_small);
  std::uint8_t* p = out.data();
  std::memcpy(p, framer.prefix().data(), framer.prefix().size());
  p += framer.prefix().size();
  if (!payload.empty()) std::memcpy(p, payload.data(), payload.size());
  p += payload.size();
  framer.add_payload(payload);
  auto trailer = framer.finish(with_crc);
  std::memcpy(p, trailer.data(), trailer.size());
  return total;
}

FpduEvent FpduStreamDecoder::fail_with(WireError error) {
  phase_ = Phase::failed;
  FpduEvent event;
  event.kind = FpduEvent::Kind::error;
  event.error = error;
  return event;
}

void FpduStreamDecoder::payload_placed(std::span<const std::uint8_t> bytes) {
  const std::size_t n = std::min(bytes.size(), payload_left_);
  if (check_crc_) crc_.update(bytes.first(n));
  payload_left_ -= n;
  if (payload_left_ == 0) phase_ = Phase::trailer;
}

FpduEvent FpduStreamDecoder::finish_trailer() {
  // RFC 5044 §4.1: PAD is sent as zero; peercm treats anything else as a broken stream.
  for (std::size_t i = 0; i + kFpduCrcSize < trailer_size_; ++i)
    if (trailer_[i] != 0) return fail_with(WireError::fpdu_bad_padding);
  if (check_crc_) {
    crc_.update(std::span(trailer_).first(trailer_size_ - kFpduCrcSize));
    const std::uint8_t* c = trailer_.data() + trailer_size_ - kFpduCrcSize;
    const std::uint32_t received = std::uint32_t{c[0]} | (std::uint32_t{c[1]} << 8) |
                                   (std::uint32_t{c[2]} << 16) | (std::uint32_t{c[3]} << 24);
    if (received != crc_.finish()) return fail_with(WireError::fpdu_bad_crc);
  }
  phase_ = Phase::length;
  header_filled_ = 0;
  trailer_filled_ = 0;
  FpduEvent event;
  event.kind = FpduEvent::Kind::end;
  return event;
}

FpduEvent FpduStreamDecoder::next(std::span<const std::uint8_t> in, std::size_t& consumed) {
  consumed = 0;
  auto take_header_bytes = [&](std::size_t target) {
    const std::size_t n = std::min(in.size() - consumed, target - header_filled_);
    if (n > 0) std::memcpy(header_.data() + header_filled_, in.data() + consumed, n);
    header_filled_ += n;
    consumed += n;
    return header_filled_ == target;
  };
  for (;;) {
    switch (phase_) {
      case Phase::failed:
        return fail_with(WireError::truncated);  // the stream already broke; nothing more is decoded
      case Phase::length: {
        // ULPDU_Length plus the two control bytes tell how long the header is.
        if (!take_header_bytes(kUlpduLengthSize + 2)) return {};
        ulpdu_length_ = load_be16(header_.data());
        if (ulpdu_length_ > max_ulpdu_) return fail_with(WireError::fpdu_ulpdu_too_long);
        auto size = peek_segment_header_size(header_[2], header_[3], ulpdu_length_);
        if (!size) return fail_with(size.error());
        header_size_ = *size;
        phase_ = Phase::header;
        break;
      }
      case Phase::header: {
        if (!take_header_bytes(kUlpduLengthSize + header_size_)) return {};
        auto header = decode_segment_header(std::span(header_).subspan(kUlpduLengthSize, header_size_),
                                            ulpdu_length_);
        if (!header) return fail_with(header.error());
        if (check_crc_) {
          crc_.reset();
          crc_.update(std::span(header_).first(header_filled_));
        }
        payload_left_ = ulpdu_length_ - header_size_;
        trailer_size_ = fpdu_padding(ulpdu_length_) + kFpduCrcSize;
        phase_ = payload_left_ > 0 ? Phase::payload : Phase::trailer;
        FpduEvent event;
        event.kind = FpduEvent::Kind::header;
        event.header = *header;
        event.payload_length = payload_left_;
        return event;
      }
      case Phase::payload: {
        const std::size_t n = std::min(in.size() - consumed, payload_left_);
        if (n == 0) return {};
        FpduEvent event;
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
        if (trailer_filled_ < trailer_size_) return {};
        return finish_trailer();
      }
    }
  }
}

}  // namespace peercm::wire
