// The Mesh's own little protocol on top of Send/Recv: the connect/accept private data that
// names a rank, and the 16-byte header in front of every message. Little-endian.
//
// Private data (connect and accept, 24 bytes):
//   u32 magic "PCMM" | u8 version | u8 model | u16 reserved | u32 rank | u32 size
//   | u32 max_message_size | u32 recv_depth
// Message header (16 bytes):
//   u8 type | u8 reserved | u16 credits returned | u32 sender rank | u32 sequence | u32 reserved
//   hello   first message on every connection, from both sides (it also releases an MPA
//           responder's hold in client/server mode, RFC 5044 §7.1.2)
//   data    an application message; sequence = per sender->receiver count, from 1
//   region  a region announcement: u32 id | u32 rkey | u64 address | u64 length
//   credit  credits only; takes no credit itself (see mesh.hpp, flow control)
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <vector>

namespace peercm::mesh_wire {

inline constexpr std::uint32_t kMagic = 0x4D4D4350;  // "PCMM" little-endian
inline constexpr std::uint8_t kVersion = 1;
inline constexpr std::size_t kHelloSize = 24;
inline constexpr std::size_t kHeaderSize = 16;
inline constexpr std::size_t kRegionSize = 24;

enum class Type : std::uint8_t { hello = 1, data = 2, region = 3, credit = 4 };

inline void put16(std::uint8_t* p, std::uint16_t v) {
  p[0] = static_cast<std::uint8_t>(v);
  p[1] = static_cast<std::uint8_t>(v >> 8);
}
inline void put32(std::uint8_t* p, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<std::uint8_t>(v >> (8 * i));
}
inline void put64(std::uint8_t* p, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<std::uint8_t>(v >> (8 * i));
}
inline std::uint16_t get16(const std::uint8_t* p) {
  return static_cast<std::uint16_t>(p[0] | (p[1] << 8));
}
inline std::uint32_t get32(const std::uint8_t* p) {
  std::uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
inline std::uint64_t get64(const std::uint8_t* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

struct Hello {
  std::uint8_t model = 0;
  std::uint32_t rank = 0;
  std::uint32_t size = 0;
  std::uint32_t max_message_size = 0;
  std::uint32_t recv_depth = 0;
};

inline std::vector<std::uint8_t> encode_hello(const Hello& h) {
  std::vector<std::uint8_t> out(kHelloSize, 0);
  put32(&out[0], kMagic);
  out[4] = kVersion;
  out[5] = h.model;
  put32(&out[8], h.rank);
  put32(&out[12], h.size);
  put32(&out[16], h.max_message_size);
  put32(&out[20], h.recv_depth);
  return out;
}

inline std::optional<Hello> decode_hello(std::span<const std::uint8_t> in) {
  if (in.size() < kHelloSize || get32(&in[0]) != kMagic || in[4] != kVersion) return std::nullopt;
  Hello h;
  h.model = in[5];
  h.rank = get32(&in[8]);
  h.size = get32(&in[12]);
  h.max_message_size = get32(&in[16]);
  h.recv_depth = get32(&in[20]);
  return h;
}

struct Header {
  Type type = Type::data;
  std::uint16_t credits = 0;
  std::uint32_t rank = 0;
  std::uint32_t sequence = 0;
};

// Writes the header over the first kHeaderSize bytes of `out` (false when it is shorter).
inline bool encode_header(const Header& h, std::span<std::uint8_t> out) {
  if (out.size() < kHeaderSize) return false;
  std::uint8_t* p = out.data();
  std::memset(p, 0, kHeaderSize);
  p[0] = static_cast<std::uint8_t>(h.type);
  put16(p + 2, h.credits);
  put32(p + 4, h.rank);
  put32(p + 8, h.sequence);
  return true;
}

inline std::optional<Header> decode_header(std::span<const std::uint8_t> in) {
  if (in.size() < kHeaderSize || in[0] < 1 || in[0] > 4) return std::nullopt;
  Header h;
  h.type = static_cast<Type>(in[0]);
  h.credits = get16(&in[2]);
  h.rank = get32(&in[4]);
  h.sequence = get32(&in[8]);
  return h;
}

struct Region {
  std::uint32_t id = 0;
  std::uint32_t rkey = 0;
  std::uint64_t address = 0;
  std::uint64_t length = 0;
};

inline bool encode_region(const Region& r, std::span<std::uint8_t> bytes) {
  if (bytes.size() < kRegionSize) return false;
  std::uint8_t* out = bytes.data();
  put32(out, r.id);
  put32(out + 4, r.rkey);
  put64(out + 8, r.address);
  put64(out + 16, r.length);
  return true;
}

inline std::optional<Region> decode_region(std::span<const std::uint8_t> in) {
  if (in.size() < kRegionSize) return std::nullopt;
  return Region{get32(&in[0]), get32(&in[4]), get64(&in[8]), get64(&in[16])};
}

}  // namespace peercm::mesh_wire
