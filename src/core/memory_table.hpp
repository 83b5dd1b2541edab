// Registered memory and its STags: the table every inbound tagged access is checked against
// (RFC 5040 §7.2, RFC 5041 §7). An STag is a 24-bit index, passed through the table's own
// keyed permutation so that STags follow no order, and a random 8-bit key.
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <random>
#include <system_error>
#include <vector>

#include "core/permutation24.hpp"
#include "peercm/result.hpp"
#include "peercm/verbs_types.hpp"
#include "wire/ddp_rdmap.hpp"

namespace peercm::core {

struct Region {
  std::uint64_t addr = 0;
  std::uint64_t length = 0;
  std::uint32_t access = 0;
  std::uint32_t pd = 0;
  std::uint32_t stag = 0;  // lkey == rkey
};

class MemoryTable {
 public:
  explicit MemoryTable(std::uint64_t seed = std::random_device{}());

  Result<std::uint32_t, std::errc> register_region(std::uint32_t pd, std::uint64_t addr, std::uint64_t length,
                                                   std::uint32_t access);
  Status<std::errc> deregister(std::uint32_t stag);
  // Valid (registered, not invalidated, key matching) region of `stag`, if any.
  const Region* find(std::uint32_t stag) const;
  std::size_t live_regions() const { return live_; }

  // Remote tagged access: RDMA Write (sink) or RDMA Read (source). Returns the Terminate code
  // of the first failed check, in RFC 5041 §7.2 / RFC 5040 §7.2 order. Zero-length accesses
  // are never checked (RFC 5041 §5.4).
  enum class Direction : std::uint8_t { write_sink, read_source };
  std::optional<wire::TerminateCode> check_remote(std::uint32_t stag, std::uint32_t pd, std::uint64_t offset,
                                                  std::uint64_t length, Direction direction) const;
  // Local access through an SGE: lkey valid, same PD, bounds, and local write when needed.
  bool check_local(const Sge& sge, std::uint32_t pd, bool needs_local_write) const;
  // Send with Invalidate (RFC 5040 §5.3): invalidates `stag` or returns the Terminate code.
  std::optional<wire::TerminateCode> invalidate(std::uint32_t stag, std::uint32_t pd);

  // Inbound RDMA Write messages whose last byte has landed in this table's memory, on any QP,
  // over either transport. Counted by the owner of the table's lock; readable from any thread.
  // A CQ poll compares it across its pass to tell whether the peer's Write that a program
  // may watch for in memory next has already landed (docs/progress.md, hand-over 7).
  void note_remote_write_landed() {
    remote_writes_landed_.store(remote_writes_landed_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  }
  std::uint64_t remote_writes_landed() const { return remote_writes_landed_.load(std::memory_order_relaxed); }

 private:
  struct Slot {
    Region region;
    bool in_use = false;
    bool valid = false;  // false after remote invalidation
  };
  // A slot's STag is permutation_.forward(index) << 8 | key.
  std::uint32_t index_of(std::uint32_t stag) const { return permutation_.inverse(stag >> 8); }
  // The slot whose STags would be 0x000000xx: never handed out, since STag 0 is special to
  // some peers.
  bool usable(std::uint32_t index) const { return index != reserved_index_ && index < slots_.size(); }

  std::vector<Slot> slots_;
  std::vector<std::uint32_t> free_indices_;
  std::mt19937_64 rng_;
  Permutation24 permutation_;
  std::uint32_t reserved_index_;
  std::size_t live_ = 0;
  std::atomic<std::uint64_t> remote_writes_landed_{0};
};

}  // namespace peercm::core
