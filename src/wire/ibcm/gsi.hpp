// MADs travel to and from the General Services Interface, QP1, as UD datagrams (IBTA Vol 1
// ch. 13; roce-ibcm-wire.md §3.1): BTH (UD SEND ONLY, destination QP 1) | DETH (the GSI's
// Q_Key, source QP 1) | one 256-byte MAD | ICRC.
#pragma once

#include <cstdint>
#include <span>

#include "peercm/result.hpp"
#include "wire/roce/packet.hpp"
#include "wire/wire_error.hpp"

namespace peercm::wire::ibcm {

inline constexpr std::uint32_t kGsiQpn = 1;
inline constexpr std::uint32_t kGsiQkey = 0x80010000;

// Headers of a MAD datagram to QP `destination_qp` (1 for the peer's GSI). UD receivers do
// not check the PSN; rxe increments it per datagram.
roce::PacketHeaders gsi_packet_headers(std::uint32_t psn, std::uint32_t destination_qp = kGsiQpn);

// The MAD in a decoded datagram. Fails with gsi_not_a_mad_datagram unless it is a UD SEND
// ONLY to QP1, with gsi_bad_qkey for another Q_Key, with mad_bad_length unless the payload is
// 256 bytes.
Result<std::span<const std::uint8_t>, WireError> mad_of_gsi_packet(const roce::PacketView& packet);

}  // namespace peercm::wire::ibcm
