// The registered memory of the queue-pair receive harness, shared with the seed generator:
// regions with different rights and protection domains, each between guard bytes, in one
// arena at a fixed address (tagged offsets are virtual addresses, so a seed can only name a
// region if the region is at the same place in every run), and the STags that a MemoryTable
// with a fixed seed hands out for them.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "core/memory_table.hpp"
#include "peercm/verbs_types.hpp"
#include "wire/ddp_rdmap.hpp"

namespace peercm::fuzz {

// In the high half of user space on x86-64, above ASan's shadow and below its allocator and
// the mmap area, so the same address is free in the plain, ASan and libFuzzer builds.
inline constexpr std::uint64_t kArenaAddress = 0x3F0000000000ull;
inline constexpr std::size_t kArenaSize = 4096;
inline constexpr std::size_t kGuard = 64;
inline constexpr std::uint32_t kPd = 7;
inline constexpr std::uint32_t kForeignPd = 99;
inline constexpr std::uint64_t kTableSeed = 1;

enum Region : std::size_t {
  kRemoteWrite,     // every right: the one place a peer's RDMA Write may land
  kRemoteRead,      // local write + remote read: a Read source, never written by the peer
  kLocalOnly,       // local write: neither read nor written by the peer
  kForeign,         // every right, but another PD
  kInvalidatable,   // every right until a Send with Invalidate names it
  kReceive,         // local write: the posted receives scatter into parts of it
  kReadSink,        // local + remote write: the sink of our outstanding RDMA Read
  kStale,           // registered, then deregistered: its STag names nothing
  kRegionCount,
};

struct RegionSpec {
  std::size_t length;
  std::uint32_t access;
  std::uint32_t pd;
};

inline constexpr std::uint32_t kAllAccess = kAccessLocalWrite | kAccessRemoteWrite | kAccessRemoteRead;
inline constexpr std::array<RegionSpec, kRegionCount> kRegionSpecs = {{
    {256, kAllAccess, kPd},
    {256, kAccessLocalWrite | kAccessRemoteRead, kPd},
    {256, kAccessLocalWrite, kPd},
    {256, kAllAccess, kForeignPd},
    {256, kAllAccess, kPd},
    {512, kAccessLocalWrite, kPd},
    {256, kAccessLocalWrite | kAccessRemoteWrite, kPd},
    {256, kAllAccess, kPd},
}};

// Region i starts after the guards and regions before it, and a guard follows the last.
constexpr std::size_t region_offset(std::size_t index) {
  std::size_t at = kGuard;
  for (std::size_t i = 0; i < index; ++i) at += kRegionSpecs[i].length + kGuard;
  return at;
}
static_assert(region_offset(kRegionCount) <= kArenaSize, "regions and guards must fit the arena");

// Posted receives: two SGEs each with a gap between them, so scattering past the first SGE
// shows.
inline constexpr std::size_t kReceives = 3;
inline constexpr std::size_t kReceiveStride = 160;
inline constexpr std::array<std::size_t, 2> kReceiveSgeOffset = {0, 64};
inline constexpr std::array<std::size_t, 2> kReceiveSgeLength = {48, 64};
inline constexpr std::size_t kReceiveCapacity = kReceiveSgeLength[0] + kReceiveSgeLength[1];
// Our RDMA Read's sink: the middle of its region, so a Read Response beside it is refused.
inline constexpr std::size_t kReadSinkOffset = 64;
inline constexpr std::size_t kReadSinkLength = 128;
inline constexpr std::uint64_t kReadWrId = 1;
inline constexpr std::uint64_t kFirstRecvWrId = 100;

class QpFixture {
 public:
  explicit QpFixture(std::uint64_t arena) : arena_(arena), memory_(kTableSeed) {
    for (std::size_t i = 0; i < kRegionCount; ++i) {
      const RegionSpec& spec = kRegionSpecs[i];
      auto stag = memory_.register_region(spec.pd, address(static_cast<Region>(i)), spec.length, spec.access);
      stags_[i] = stag ? *stag : 0;
    }
    (void)memory_.deregister(stags_[kStale]);
  }

  std::uint64_t address(Region r) const { return arena_ + region_offset(r); }
  std::uint32_t stag(Region r) const { return stags_[r]; }
  core::MemoryTable& memory() { return memory_; }

  Sge receive_sge(std::size_t receive, std::size_t piece) const {
    return Sge{address(kReceive) + receive * kReceiveStride + kReceiveSgeOffset[piece],
               static_cast<std::uint32_t>(kReceiveSgeLength[piece]), stag(kReceive)};
  }
  RecvWr receive(std::size_t index) const {
    return RecvWr{.wr_id = kFirstRecvWrId + index, .sg_list = {receive_sge(index, 0), receive_sge(index, 1)}};
  }
  Sge read_sink() const {
    return Sge{address(kReadSink) + kReadSinkOffset, static_cast<std::uint32_t>(kReadSinkLength), stag(kReadSink)};
  }
  SendWr read() const {
    return SendWr{.wr_id = kReadWrId,
                  .opcode = WrOpcode::rdma_read,
                  .sg_list = {read_sink()},
                  .remote_addr = 0x1000,
                  .rkey = 0x00AB12CD};
  }

 private:
  std::uint64_t arena_;
  core::MemoryTable memory_;
  std::array<std::uint32_t, kRegionCount> stags_{};
};

// The harness input: two configuration bytes, then either the raw stream or records
// [2 bytes: bit 15 corrupts the CRC, bits 0-14 ULPDU length][the ULPDU], which the harness
// frames into FPDUs (length, padding, CRC), so mutations reach the DDP and RDMAP rules with
// CRC on.
struct QpConfigBits {
  static constexpr std::uint8_t kCrc = 0x01;
  static constexpr std::uint8_t kResponder = 0x02;
  static constexpr unsigned kRtrShift = 2;      // 2 bits: none, write, read, send
  static constexpr unsigned kReceivesShift = 4;  // 2 bits: 0..3 posted receives
  static constexpr std::uint8_t kPostRead = 0x40;
  static constexpr std::uint8_t kRaw = 0x80;
  // second byte
  static constexpr std::uint8_t kZeroCopy = 0x01;  // CRC off only
  static constexpr std::uint8_t kSmallRecvCq = 0x02;
  static constexpr unsigned kIrdShift = 2;    // 2 bits: IRD 1..4
  static constexpr unsigned kSplitShift = 4;  // 4 bits: split seed (0: one call per FPDU)
};

inline void append_record(std::vector<std::uint8_t>& out, std::span<const std::uint8_t> ulpdu, bool corrupt_crc = false) {
  const auto word = static_cast<std::uint16_t>((corrupt_crc ? 0x8000 : 0) | (ulpdu.size() & 0x7FFF));
  out.push_back(static_cast<std::uint8_t>(word >> 8));
  out.push_back(static_cast<std::uint8_t>(word));
  out.insert(out.end(), ulpdu.begin(), ulpdu.end());
}

}  // namespace peercm::fuzz
