// MPA Request / Reply frames (RFC 5044 §7.1) with the RFC 6581 enhanced IRD/ORD block.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

#include "peercm/result.hpp"
#include "wire/wire_error.hpp"

namespace peercm::wire {

inline constexpr std::size_t kMpaFrameHeaderSize = 20;  // key(16) flags(1) rev(1) PD_Length(2)
inline constexpr std::size_t kMpaMaxPrivateData = 512;  // includes the IRD/ORD block (RFC 5044 §7.1)
inline constexpr std::size_t kMpaMaxFrameSize = kMpaFrameHeaderSize + kMpaMaxPrivateData;
inline constexpr std::size_t kIrdOrdBlockSize = 4;
inline constexpr std::uint16_t kIrdOrdMax = 0x3FFF;  // also "ULP negotiates" (RFC 6581 §9.1)

enum class MpaFrameKind : std::uint8_t { request, reply };

// RFC 6581 §9 IRD/ORD block: the first four bytes of private data when S=1.
struct IrdOrdBlock {
  bool peer_to_peer = false;  // A
  bool send_rtr = false;      // B: zero-length Send RTR
  bool write_rtr = false;     // C: zero-length RDMA Write RTR
  bool read_rtr = false;      // D: zero-length RDMA Read RTR
  std::uint16_t ird = 0;      // 14 bits
  std::uint16_t ord = 0;      // 14 bits

  bool operator==(const IrdOrdBlock&) const = default;
};

struct MpaFrame {
  MpaFrameKind kind = MpaFrameKind::request;
  bool markers = false;   // M
  bool crc = true;        // C
  bool rejected = false;  // R (Reply only)
  std::uint8_t revision = 2;
  std::optional<IrdOrdBlock> enhanced;      // present iff S=1
  std::span<const std::uint8_t> private_data;  // the ULP's bytes, after the IRD/ORD block
};

// Wire size of `frame`, or an error when it cannot be encoded.
Result<std::size_t, WireError> mpa_frame_size(const MpaFrame& frame);
// Encodes `frame` into `out`; returns the number of bytes written.
Result<std::size_t, WireError> encode_mpa_frame(const MpaFrame& frame, std::span<std::uint8_t> out);

// Checks the 20-byte header and returns the whole frame's length. `expected` picks the key.
Result<std::size_t, WireError> mpa_frame_length(std::span<const std::uint8_t> header,
                                                MpaFrameKind expected);
// Decodes one complete frame; `bytes` must be exactly the frame. private_data points into `bytes`.
Result<MpaFrame, WireError> decode_mpa_frame(std::span<const std::uint8_t> bytes, MpaFrameKind expected);

// Accumulates a frame from a byte stream split anywhere, without allocating.
class MpaFrameReader {
 public:
  explicit MpaFrameReader(MpaFrameKind expected) : expected_(expected) {}

  // Takes bytes up to the end of one frame and returns how many it took. Bytes after the
  // frame (the first FPDUs) are left for the caller.
  std::size_t feed(std::span<const std::uint8_t> in);
  bool complete() const { return frame_.has_value(); }
  // Set once the bytes seen cannot start a valid frame.
  std::optional<WireError> error() const { return error_; }
  // The decoded frame; its private_data points into this reader.
  const std::optional<MpaFrame>& frame() const { return frame_; }

 private:
  MpaFrameKind expected_;
  std::array<std::uint8_t, kMpaMaxFrameSize> buffer_{};
  std::size_t filled_ = 0;
  std::size_t frame_length_ = 0;  // known once the header is in
  std::optional<MpaFrame> frame_;
  std::optional<WireError> error_;
};

}  // namespace peercm::wire
