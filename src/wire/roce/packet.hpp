// A whole RoCEv2 transport packet, i.e. one UDP payload (IBTA Vol 1 ch. 9, Annex A17;
// roce-ibcm-wire.md §0, §2): BTH | extension headers | payload | pad | ICRC.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "peercm/result.hpp"
#include "wire/roce/aeth.hpp"
#include "wire/roce/bth.hpp"
#include "wire/roce/ext_headers.hpp"
#include "wire/roce/icrc.hpp"
#include "wire/roce/opcode.hpp"
#include "wire/wire_error.hpp"

namespace peercm::wire::roce {

// Largest header block: BTH + AtomicETH (CMP&SWAP, FETCH&ADD).
inline constexpr std::size_t kMaxHeadersSize = kBthSize + kAtomicEthSize;
inline constexpr std::size_t kMinPacketSize = kBthSize + kIcrcSize;

// Every header a packet may carry. Which extension headers are meaningful follows from
// bth.opcode (opcode_info().headers); the others are ignored by the encoder and left at
// their defaults by the decoder.
struct PacketHeaders {
  Bth bth;
  Deth deth;
  Reth reth;
  AtomicEth atomic;
  Aeth aeth;
  AtomicAckEth atomic_ack;
  std::uint32_t immediate = 0;       // ImmDt
  std::uint32_t invalidate_rkey = 0;  // IETH
};

struct PacketView {
  PacketHeaders headers;
  std::span<const std::uint8_t> payload;  // without pad; points into the input
  std::uint32_t icrc = 0;                 // as received, not verified
};

constexpr std::size_t pad_for(std::size_t payload_length) { return (4 - payload_length % 4) % 4; }

// BTH + extension headers of an opcode (BTH alone for an unknown one).
inline std::size_t headers_size(Opcode op) { return kBthSize + extension_headers_size(op); }
// UDP payload size of a packet: headers, payload, pad, ICRC.
inline std::size_t packet_size(Opcode op, std::size_t payload_length) {
  return headers_size(op) + payload_length + pad_for(payload_length) + kIcrcSize;
}

// Writes the BTH (PadCnt computed from `payload_length`, replacing headers.bth.pad_count)
// and the opcode's extension headers; returns their size. Fails with buffer_too_small,
// roce_unsupported_opcode, roce_unexpected_payload (payload on an opcode that carries
// none), or the header encoders' errors. For packets sent from scattered buffers: the
// payload, pad_for() zero bytes and the ICRC (Icrc) follow.
Result<std::size_t, WireError> encode_headers(const PacketHeaders& headers, std::size_t payload_length,
                                              std::span<std::uint8_t> out);

// Writes the whole packet (headers, payload, zero pad, ICRC for `pseudo`); returns its size.
Result<std::size_t, WireError> encode_packet(const PacketHeaders& headers, std::span<const std::uint8_t> payload,
                                             const IcrcPseudoHeader& pseudo, std::span<std::uint8_t> out);

// Decodes a UDP payload. Checks, in order (§1.3, §2.3): at least BTH + ICRC
// (truncated), a multiple of 4 bytes (roce_bad_length), TVer, a known opcode, room for the
// extension headers (roce_bad_length), PadCnt within the remaining bytes, no payload or pad
// where the opcode carries none, a valid AETH syndrome. Does not verify the ICRC (that needs
// the IP header: verify_icrc / decode_verified_packet) nor P_Key, QPN or PMTU, which belong
// to the queue pair. Pad contents are ignored.
Result<PacketView, WireError> decode_packet(std::span<const std::uint8_t> udp_payload);

// decode_packet, then verify_icrc against `pseudo`.
Result<PacketView, WireError> decode_verified_packet(std::span<const std::uint8_t> udp_payload,
                                                     const IcrcPseudoHeader& pseudo);

}  // namespace peercm::wire::roce
