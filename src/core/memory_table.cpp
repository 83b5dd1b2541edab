#include "core/memory_table.hpp"

namespace peercm::core {
namespace {

constexpr std::uint32_t kMaxIndex = 0x00FFFFFF;

wire::TerminateCode rdmap_protection(std::uint8_t code) {
  return {wire::TerminateLayer::rdmap, 0x1, code};
}
wire::TerminateCode ddp_tagged(std::uint8_t code) { return {wire::TerminateLayer::ddp, 0x1, code}; }

}  // namespace

MemoryTable::MemoryTable(std::uint64_t seed)
    : rng_(seed), permutation_(rng_()), reserved_index_(permutation_.inverse(0)) {}

Result<std::uint32_t, std::errc> MemoryTable::register_region(std::uint32_t pd, std::uint64_t addr,
                                                              std::uint64_t length, std::uint32_t access) {
  if (addr + length < addr) return fail(std::errc::invalid_argument);
  if (access & ~(kAccessLocalWrite | kAccessRemoteWrite | kAccessRemoteRead)) return fail(std::errc::invalid_argument);
  // verbs rule: remote write needs local write too.
  if ((access & kAccessRemoteWrite) && !(access & kAccessLocalWrite)) return fail(std::errc::invalid_argument);
  std::uint32_t index;
  if (!free_indices_.empty()) {
    index = free_indices_.back();
    free_indices_.pop_back();
  } else {
    if (slots_.size() >= kMaxIndex) return fail(std::errc::not_enough_memory);
    index = static_cast<std::uint32_t>(slots_.size());
    slots_.emplace_back();
    if (index == reserved_index_) {
      index = static_cast<std::uint32_t>(slots_.size());
      slots_.emplace_back();
    }
  }
  // A fresh random key each time, so a stale or guessed STag of a reused index misses.
  const auto key = static_cast<std::uint32_t>(rng_() & 0xFF);
  const std::uint32_t stag = permutation_.forward(index) << 8 | key;
  slots_[index] = Slot{Region{addr, length, access, pd, stag}, true, true};
  ++live_;
  return stag;
}

Status<std::errc> MemoryTable::deregister(std::uint32_t stag) {
  const std::uint32_t index = index_of(stag);
  if (!usable(index) || !slots_[index].in_use || slots_[index].region.stag != stag)
    return fail(std::errc::invalid_argument);
  slots_[index] = Slot{};
  free_indices_.push_back(index);
  --live_;
  return {};
}

const Region* MemoryTable::find(std::uint32_t stag) const {
  const std::uint32_t index = index_of(stag);
  if (!usable(index)) return nullptr;
  const Slot& slot = slots_[index];
  if (!slot.in_use || !slot.valid || slot.region.stag != stag) return nullptr;
  return &slot.region;
}

std::optional<wire::TerminateCode> MemoryTable::check_remote(std::uint32_t stag, std::uint32_t pd,
                                                             std::uint64_t offset, std::uint64_t length,
                                                             Direction direction) const {
  if (length == 0) return std::nullopt;
  const bool sink = direction == Direction::write_sink;
  const Region* region = find(stag);
  // RFC 5041 §7.2 (tagged sink) and RFC 5040 §7.2 (read source) codes.
  if (!region) return sink ? ddp_tagged(0x00) : rdmap_protection(0x00);
  if (region->pd != pd) return sink ? ddp_tagged(0x02) : rdmap_protection(0x03);
  if (offset + length < offset) return sink ? ddp_tagged(0x03) : rdmap_protection(0x04);
  if (offset < region->addr || offset + length > region->addr + region->length)
    return sink ? ddp_tagged(0x01) : rdmap_protection(0x01);
  const std::uint32_t needed = sink ? kAccessRemoteWrite : kAccessRemoteRead;
  if (!(region->access & needed)) return rdmap_protection(0x02);
  return std::nullopt;
}

bool MemoryTable::check_local(const Sge& sge, std::uint32_t pd, bool needs_local_write) const {
  if (sge.length == 0) return true;
  const Region* region = find(sge.lkey);
  if (!region || region->pd != pd) return false;
  if (sge.addr + sge.length < sge.addr) return false;
  if (sge.addr < region->addr || sge.addr + sge.length > region->addr + region->length) return false;
  return !needs_local_write || (region->access & kAccessLocalWrite);
}

std::optional<wire::TerminateCode> MemoryTable::invalidate(std::uint32_t stag, std::uint32_t pd) {
  const std::uint32_t index = index_of(stag);
  if (!usable(index)) return rdmap_protection(0x09);
  Slot& slot = slots_[index];
  if (!slot.in_use || !slot.valid || slot.region.stag != stag || slot.region.pd != pd) return rdmap_protection(0x09);
  slot.valid = false;
  return std::nullopt;
}

}  // namespace peercm::core
