#include "wire/roce/packet.hpp"

#include <algorithm>

namespace peercm::wire::roce {

Result<std::size_t, WireError> encode_headers(const PacketHeaders& h, std::size_t payload_length,
                                              std::span<std::uint8_t> out) {
  const OpcodeInfo info = opcode_info(h.bth.opcode);
  if (!info.known) return fail(WireError::roce_unsupported_opcode);
  if (info.payload == PayloadRule::none && payload_length != 0) return fail(WireError::roce_unexpected_payload);
  const std::size_t size = headers_size(h.bth.opcode);
  if (out.size() < size) return fail(WireError::buffer_too_small);

  Bth bth = h.bth;
  bth.pad_count = static_cast<std::uint8_t>(pad_for(payload_length));
  if (auto ok = encode_bth(bth, out.first<kBthSize>()); !ok) return fail(ok.error());
  std::size_t at = kBthSize;
  // Wire order of the extension headers (roce-ibcm-wire.md §2.1).
  if (info.headers & ext::kDeth) {
    if (auto ok = encode_deth(h.deth, out.subspan(at).first<kDethSize>()); !ok) return fail(ok.error());
    at += kDethSize;
  }
  if (info.headers & ext::kReth) {
    encode_reth(h.reth, out.subspan(at).first<kRethSize>());
    at += kRethSize;
  }
  if (info.headers & ext::kAtomicEth) {
    encode_atomic_eth(h.atomic, out.subspan(at).first<kAtomicEthSize>());
    at += kAtomicEthSize;
  }
  if (info.headers & ext::kAeth) {
    if (auto ok = encode_aeth(h.aeth, out.subspan(at).first<kAethSize>()); !ok) return fail(ok.error());
    at += kAethSize;
  }
  if (info.headers & ext::kAtomicAckEth) {
    encode_atomic_ack_eth(h.atomic_ack, out.subspan(at).first<kAtomicAckEthSize>());
    at += kAtomicAckEthSize;
  }
  if (info.headers & ext::kImmDt) {
    encode_word(h.immediate, out.subspan(at).first<kImmDtSize>());
    at += kImmDtSize;
  }
  if (info.headers & ext::kIeth) {
    encode_word(h.invalidate_rkey, out.subspan(at).first<kIethSize>());
    at += kIethSize;
  }
  if (info.headers & ext::kCnpReserved) {
    std::fill_n(out.begin() + static_cast<std::ptrdiff_t>(at), kCnpReservedSize, std::uint8_t{0});
    at += kCnpReservedSize;
  }
  return at;
}

Result<std::size_t, WireError> encode_packet(const PacketHeaders& headers, std::span<const std::uint8_t> payload,
                                             const IcrcPseudoHeader& pseudo, std::span<std::uint8_t> out) {
  if (!opcode_info(headers.bth.opcode).known) return fail(WireError::roce_unsupported_opcode);
  const std::size_t size = packet_size(headers.bth.opcode, payload.size());
  if (out.size() < size) return fail(WireError::buffer_too_small);
  auto header_bytes = encode_headers(headers, payload.size(), out);
  if (!header_bytes) return fail(header_bytes.error());
  std::uint8_t* p = out.data() + *header_bytes;
  p = std::copy(payload.begin(), payload.end(), p);
  std::fill_n(p, pad_for(payload.size()), std::uint8_t{0});  // pad is sent as zero (§2.3)
  auto icrc = compute_icrc(pseudo, out.first(size));
  if (!icrc) return fail(icrc.error());
  store_icrc(*icrc, out.subspan(size - kIcrcSize).first<kIcrcSize>());
  return size;
}

Result<PacketView, WireError> decode_packet(std::span<const std::uint8_t> in) {
  if (in.size() < kMinPacketSize) return fail(WireError::truncated);
  // Every header is a multiple of 4 bytes and PadCnt pads the payload to one (§2.3).
  if (in.size() % 4 != 0) return fail(WireError::roce_bad_length);
  auto bth = decode_bth(in.first<kBthSize>());
  if (!bth) return fail(bth.error());
  const OpcodeInfo info = opcode_info(bth->opcode);
  if (!info.known) return fail(WireError::roce_unsupported_opcode);
  const std::size_t header_bytes = headers_size(bth->opcode);
  if (in.size() < header_bytes + kIcrcSize) return fail(WireError::truncated);
  const std::size_t after_headers = in.size() - header_bytes - kIcrcSize;
  if (bth->pad_count > after_headers) return fail(WireError::roce_bad_pad_count);
  if (info.payload == PayloadRule::none && after_headers != 0) return fail(WireError::roce_unexpected_payload);

  PacketView view;
  PacketHeaders& h = view.headers;
  h.bth = *bth;
  std::size_t at = kBthSize;
  if (info.headers & ext::kDeth) {
    h.deth = decode_deth(in.subspan(at).first<kDethSize>());
    at += kDethSize;
  }
  if (info.headers & ext::kReth) {
    h.reth = decode_reth(in.subspan(at).first<kRethSize>());
    at += kRethSize;
  }
  if (info.headers & ext::kAtomicEth) {
    h.atomic = decode_atomic_eth(in.subspan(at).first<kAtomicEthSize>());
    at += kAtomicEthSize;
  }
  if (info.headers & ext::kAeth) {
    auto aeth = decode_aeth(in.subspan(at).first<kAethSize>());
    if (!aeth) return fail(aeth.error());
    h.aeth = *aeth;
    at += kAethSize;
  }
  if (info.headers & ext::kAtomicAckEth) {
    h.atomic_ack = decode_atomic_ack_eth(in.subspan(at).first<kAtomicAckEthSize>());
    at += kAtomicAckEthSize;
  }
  if (info.headers & ext::kImmDt) {
    h.immediate = decode_word(in.subspan(at).first<kImmDtSize>());
    at += kImmDtSize;
  }
  if (info.headers & ext::kIeth) {
    h.invalidate_rkey = decode_word(in.subspan(at).first<kIethSize>());
    at += kIethSize;
  }
  if (info.headers & ext::kCnpReserved) at += kCnpReservedSize;  // reserved: ignored

  view.payload = in.subspan(at, after_headers - bth->pad_count);
  view.icrc = load_icrc(in.last<kIcrcSize>());
  return view;
}

Result<PacketView, WireError> decode_verified_packet(std::span<const std::uint8_t> udp_payload,
                                                     const IcrcPseudoHeader& pseudo) {
  // roce-ibcm-wire.md §1.3: the ICRC is checked before any header field is trusted.
  if (auto ok = verify_icrc(pseudo, udp_payload); !ok) return fail(ok.error());
  return decode_packet(udp_payload);
}

}  // namespace peercm::wire::roce
