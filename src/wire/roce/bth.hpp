// Base Transport Header, the 12 bytes that start every RoCEv2 UDP payload (IBTA Vol 1
// ch. 9; roce-ibcm-wire.md §1.2).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "peercm/result.hpp"
#include "wire/roce/opcode.hpp"
#include "wire/wire_error.hpp"

namespace peercm::wire::roce {

inline constexpr std::size_t kBthSize = 12;
inline constexpr std::uint16_t kDefaultPartitionKey = 0xFFFF;  // RoCE's only P_Key (§1.2)
inline constexpr std::uint32_t kQpnMask = 0x00FFFFFF;
// Offset in the BTH of the FECN/BECN/reserved byte, which the ICRC masks (§1.4).
inline constexpr std::size_t kBthVariantByte = 4;

struct Bth {
  Opcode opcode = Opcode::rc_send_only;
  bool solicited_event = false;    // SE
  bool migration_request = false;  // M
  std::uint8_t pad_count = 0;      // 2 bits
  std::uint8_t transport_version = 0;  // TVer, 4 bits
  std::uint16_t partition_key = kDefaultPartitionKey;
  bool fecn = false;  // 0 on RoCEv2: congestion travels in the IP ECN bits
  bool becn = false;  // set only in CNPs
  std::uint32_t destination_qp = 0;  // 24 bits
  bool ack_request = false;          // A
  std::uint32_t psn = 0;             // 24 bits

  bool operator==(const Bth&) const = default;
};

// Reads the 12 bytes; fails with roce_bad_transport_version when TVer is not 0. Reserved
// bits (byte 4 low six, byte 8 low seven) are ignored. The opcode is not checked here.
Result<Bth, WireError> decode_bth(std::span<const std::uint8_t, kBthSize> bytes);
// Writes the 12 bytes with reserved bits zero; fails with roce_field_out_of_range when a
// field does not fit its width (pad 2 bits, TVer 4, QPN and PSN 24).
Status<WireError> encode_bth(const Bth& bth, std::span<std::uint8_t, kBthSize> out);

}  // namespace peercm::wire::roce
