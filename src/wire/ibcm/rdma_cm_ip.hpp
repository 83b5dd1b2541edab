// rdma_cm's IP addressing over the IB CM (IBTA Annex A11 IP-CM service IDs; Linux cma.c;
// roce-ibcm-wire.md §6): the service ID that names a port in a port space, and the 36-byte
// header ("cma_hdr") at the start of a REQ's private data carrying the IP version, the
// active side's source port and both addresses.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

#include "peercm/result.hpp"
#include "wire/ibcm/cm_common.hpp"
#include "wire/ibcm/gid.hpp"
#include "wire/wire_error.hpp"

namespace peercm::wire::ibcm {

enum class RdmaPortSpace : std::uint16_t { ipoib = 0x0002, tcp = 0x0106, udp = 0x0111, ib = 0x013F };

// (port_space << 16) | port, carried big-endian like every service ID.
constexpr std::uint64_t rdma_ip_service_id(RdmaPortSpace space, std::uint16_t port) {
  return (std::uint64_t{static_cast<std::uint16_t>(space)} << 16) | port;
}

struct RdmaIpServiceId {
  RdmaPortSpace port_space = RdmaPortSpace::tcp;
  std::uint16_t port = 0;
  bool operator==(const RdmaIpServiceId&) const = default;
};

// Fails with ibcm_not_ip_service_id unless the top 48 bits name one of the four port spaces.
Result<RdmaIpServiceId, WireError> decode_rdma_ip_service_id(std::uint64_t service_id);

inline constexpr std::size_t kCmaHeaderSize = 36;
inline constexpr std::uint8_t kCmaVersion = 0;
// What a REQ on RDMA_PS_TCP leaves the application: 92 - 36.
inline constexpr std::size_t kCmaReqUserPrivateDataSize = kReqPrivateDataSize - kCmaHeaderSize;

// The address fields are 16 bytes; an IPv4 address sits in the last four after twelve zero
// bytes (not the ::ffff form of a GID).
struct CmaHeader {
  std::uint8_t ip_version = 4;  // 4 or 6
  std::uint16_t source_port = 0;
  std::array<std::uint8_t, 16> source_ip{};
  std::array<std::uint8_t, 16> destination_ip{};

  static CmaHeader ipv4(const Ipv4Address& source, std::uint16_t source_port, const Ipv4Address& destination);
  // The IPv4 address in an address field (its last four bytes).
  static Ipv4Address ipv4_of(const std::array<std::uint8_t, 16>& field);

  bool operator==(const CmaHeader&) const = default;
};

struct CmaPrivateData {
  CmaHeader header;
  std::span<const std::uint8_t> application_data;  // what follows the header
};

// Writes the header and up to 56 application bytes into the REQ's 92 private-data bytes
// (zero-filled); returns 92. Fails with buffer_too_small, ibcm_private_data_too_long, or
// cma_bad_ip_version for an IP version other than 4 and 6.
Result<std::size_t, WireError> encode_cma_private_data(const CmaHeader& header,
                                                       std::span<const std::uint8_t> application_data,
                                                       std::span<std::uint8_t> out);
// Decodes a REQ's private data. Fails with truncated, cma_unsupported_version (rdma_cm
// refuses any version but 0) or cma_bad_ip_version; the low nibble of byte 1 is reserved
// and ignored.
Result<CmaPrivateData, WireError> decode_cma_private_data(std::span<const std::uint8_t> private_data);

}  // namespace peercm::wire::ibcm
