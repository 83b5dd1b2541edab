// The fixed-layout extension transport headers (IBTA Vol 1 ch. 9; roce-ibcm-wire.md §2.2):
// RETH, DETH, ImmDt, IETH, AtomicETH, AtomicAckETH. AETH has its own file (its syndrome has
// rules).
// Each decoder takes at least the header's bytes; each encoder writes exactly them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "peercm/result.hpp"
#include "wire/wire_error.hpp"

namespace peercm::wire::roce {

inline constexpr std::size_t kRethSize = 16;
inline constexpr std::size_t kDethSize = 8;
inline constexpr std::size_t kImmDtSize = 4;
inline constexpr std::size_t kIethSize = 4;
inline constexpr std::size_t kAtomicEthSize = 28;
inline constexpr std::size_t kAtomicAckEthSize = 8;
inline constexpr std::size_t kAethSize = 4;
inline constexpr std::size_t kCnpReservedSize = 16;  // after a CNP's BTH (Annex A17; §2.1)

// RDMA Extended Transport Header: on WRITE FIRST/ONLY and READ REQUEST. dma_length is the
// whole message's length, not the packet's (§2.2).
struct Reth {
  std::uint64_t virtual_address = 0;
  std::uint32_t r_key = 0;
  std::uint32_t dma_length = 0;
  bool operator==(const Reth&) const = default;
};

// Datagram Extended Transport Header: UD only; byte 4 is reserved (§2.2).
struct Deth {
  std::uint32_t q_key = 0;
  std::uint32_t source_qp = 0;  // 24 bits
  bool operator==(const Deth&) const = default;
};

// Atomic Extended Transport Header; compare_data is used by CMP&SWAP only (§2.2).
struct AtomicEth {
  std::uint64_t virtual_address = 0;
  std::uint32_t r_key = 0;
  std::uint64_t swap_or_add_data = 0;
  std::uint64_t compare_data = 0;
  bool operator==(const AtomicEth&) const = default;
};

// ATOMIC ACKNOWLEDGE: the remote location's value before the operation (§2.2).
struct AtomicAckEth {
  std::uint64_t original_remote_data = 0;
  bool operator==(const AtomicAckEth&) const = default;
};

Reth decode_reth(std::span<const std::uint8_t, kRethSize> bytes);
void encode_reth(const Reth& reth, std::span<std::uint8_t, kRethSize> out);

Deth decode_deth(std::span<const std::uint8_t, kDethSize> bytes);
// Fails with roce_field_out_of_range when the source QP does not fit 24 bits.
Status<WireError> encode_deth(const Deth& deth, std::span<std::uint8_t, kDethSize> out);

AtomicEth decode_atomic_eth(std::span<const std::uint8_t, kAtomicEthSize> bytes);
void encode_atomic_eth(const AtomicEth& atomic, std::span<std::uint8_t, kAtomicEthSize> out);

AtomicAckEth decode_atomic_ack_eth(std::span<const std::uint8_t, kAtomicAckEthSize> bytes);
void encode_atomic_ack_eth(const AtomicAckEth& ack, std::span<std::uint8_t, kAtomicAckEthSize> out);

// ImmDt and IETH are one big-endian 32-bit word each: immediate data, or the R_Key to
// invalidate (§2.2).
std::uint32_t decode_word(std::span<const std::uint8_t, 4> bytes);
void encode_word(std::uint32_t value, std::span<std::uint8_t, 4> out);

}  // namespace peercm::wire::roce
