// The MAD (management datagram) common header (IBTA Vol 1 ch. 13; roce-ibcm-wire.md §3.2):
// 24 bytes at the start of every 256-byte MAD that QP1 carries.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace peercm::wire::ibcm {

inline constexpr std::size_t kMadSize = 256;
inline constexpr std::size_t kMadHeaderSize = 24;
inline constexpr std::size_t kMadDataSize = kMadSize - kMadHeaderSize;  // the CM message: 232

inline constexpr std::uint8_t kMadBaseVersion = 1;
inline constexpr std::uint8_t kMgmtClassCm = 0x07;
inline constexpr std::uint8_t kCmClassVersion = 2;

// Method codes (byte 3: the R bit 0x80 marks a response, the low 7 bits the method).
namespace method {
inline constexpr std::uint8_t kGet = 0x01;
inline constexpr std::uint8_t kSet = 0x02;
inline constexpr std::uint8_t kSend = 0x03;  // every CM message (§3.2)
inline constexpr std::uint8_t kTrap = 0x05;
inline constexpr std::uint8_t kReport = 0x06;
inline constexpr std::uint8_t kTrapRepress = 0x07;
inline constexpr std::uint8_t kResponse = 0x80;  // R bit
inline constexpr std::uint8_t kGetResp = kGet | kResponse;
inline constexpr std::uint8_t kReportResp = kReport | kResponse;
}  // namespace method

struct MadHeader {
  std::uint8_t base_version = kMadBaseVersion;
  std::uint8_t management_class = kMgmtClassCm;
  std::uint8_t class_version = kCmClassVersion;
  std::uint8_t method = method::kSend;  // with the R bit
  std::uint16_t status = 0;
  std::uint16_t class_specific = 0;
  std::uint64_t transaction_id = 0;
  std::uint16_t attribute_id = 0;
  std::uint32_t attribute_modifier = 0;  // ECE options in newer kernels (§4.7), else 0

  bool operator==(const MadHeader&) const = default;
};

// Total: every byte pattern is a header. Bytes 18-19 are reserved and ignored.
MadHeader decode_mad_header(std::span<const std::uint8_t, kMadHeaderSize> bytes);
void encode_mad_header(const MadHeader& header, std::span<std::uint8_t, kMadHeaderSize> out);

}  // namespace peercm::wire::ibcm
