// The peercm p2p header of the IB CM binding (docs/p2p.md R1): what a p2p REQ and its REP
// carry beyond the IB CM's own fields. The node GUID is the REQ/REP Local CA GUID, the attempt id
// the Local QPN and the listening port the Service ID's port (§6), so only the tag and the
// incarnation need room. They travel in the application's part of the private data: in a REQ
// right after rdma_cm's 36-byte header, in a REP at the start of its 196 bytes.
//
// Layout (big-endian, 20 bytes): magic "pcmI"(4) version(1) flags(1) reserved(2) tag(4)
// incarnation(8). A REQ then leaves the application 56 - 20 = 36 bytes, a REP 176.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

namespace peercm::core::ibcm {

inline constexpr std::uint32_t kP2pHeaderMagic = 0x70636D49;  // "pcmI"
inline constexpr std::uint8_t kP2pHeaderVersion = 1;
inline constexpr std::size_t kP2pHeaderSize = 20;

struct P2pHeader {
  std::uint32_t tag = 0;
  std::uint64_t incarnation = 0;
  bool operator==(const P2pHeader&) const = default;
};

struct P2pHeaderView {
  P2pHeader header;
  std::span<const std::uint8_t> application_data;  // what follows the header
};

// Writes the header into out[0, 20); false when `out` is shorter.
bool encode_p2p_header(const P2pHeader& header, std::span<std::uint8_t> out);
// The header at the start of `data`, or nullopt: a request without it (a plain rdma_cm client,
// or p2p off) is client/server. An unknown version is treated as no header.
std::optional<P2pHeaderView> decode_p2p_header(std::span<const std::uint8_t> data);

// The application's bytes of a REQ's private data: after rdma_cm's header (§6) and, in a p2p
// REQ, after the p2p header. Empty when rdma_cm's header does not decode.
std::vector<std::uint8_t> request_app_data(std::span<const std::uint8_t> private_data, bool p2p);

}  // namespace peercm::core::ibcm
