// The peercm CM header: carried in MPA private data after the RFC 6581 IRD/ORD block by
// every peer-to-peer connect request (design.md §3 rule 1), before the application's bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "peercm/result.hpp"
#include "wire/wire_error.hpp"

namespace peercm::wire {

inline constexpr std::uint32_t kCmHeaderMagic = 0x50434D48;  // "PCMH"
inline constexpr std::uint8_t kCmHeaderVersion = 1;
inline constexpr std::size_t kCmHeaderSize = 36;

// Layout (big-endian): magic(4) version(1) flags(1) header_length(2) node_guid(8)
// incarnation(8) listen_port(2) reserved(2) tag(4) cmid(4).
struct CmHeader {
  static constexpr std::uint8_t kFlagPeerToPeer = 0x01;  // the sender wants p2p collision handling
  static constexpr std::uint8_t kKnownFlags = kFlagPeerToPeer;

  std::uint8_t flags = kFlagPeerToPeer;
  std::uint64_t node_guid = 0;
  std::uint64_t incarnation = 0;
  std::uint16_t listen_port = 0;  // where the sender accepts connections (0: nowhere)
  std::uint32_t tag = 0;
  std::uint32_t cmid = 0;  // the sender's CmId number: the collision tie-breaker

  bool operator==(const CmHeader&) const = default;
};

struct CmHeaderView {
  CmHeader header;
  std::span<const std::uint8_t> application_data;  // what follows the header
};

Result<std::size_t, WireError> encode_cm_header(const CmHeader& header, std::span<std::uint8_t> out);
// Decodes the header at the start of `private_data`; the rest is the application's.
Result<CmHeaderView, WireError> decode_cm_header(std::span<const std::uint8_t> private_data);

}  // namespace peercm::wire
