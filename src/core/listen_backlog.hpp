#pragma once
// B1, the backlog rule (docs/p2p.md): what one listener holds for peers nobody has vouched for.
// Both transports' CMs charge a request here from the moment it arrives until the application
// holds it (accepted, or bound to the application's own attempt under R3) or it has been
// answered (rejected, taken back, torn down). Client/server and p2p requests count alike: a
// peer chooses which header it sends, so the header must not buy it room.

#include <cstddef>
#include <cstdint>
#include <unordered_map>

namespace peercm::core {

class ListenBacklog {
 public:
  // `bound`: listen(backlog), at least 1.
  explicit ListenBacklog(std::size_t bound = 1) : bound_(bound == 0 ? 1 : bound) {}

  // The most one source address may hold: a quarter of the backlog (rounded down) stays for
  // the others, so one flooding address cannot lock every other client out.
  std::size_t per_source_bound() const { return bound_ - bound_ / 4; }
  std::size_t bound() const { return bound_; }

  // Whether a request from `source` fits now.
  bool has_room(std::uint32_t source) const {
    return held_ < bound_ && held_by(source) < per_source_bound();
  }
  // Whether `source` is what stops it: it holds its share (as opposed to the listener being full).
  bool source_is_full(std::uint32_t source) const { return held_by(source) >= per_source_bound(); }

  // Charges a request from `source`; false (nothing charged) when it does not fit.
  bool admit(std::uint32_t source) {
    if (!has_room(source)) return false;
    ++held_;
    ++per_source_[source];
    return true;
  }
  // Ends the charge admit() made for a request from `source`.
  void release(std::uint32_t source) {
    auto it = per_source_.find(source);
    if (it == per_source_.end()) return;
    --held_;
    if (--it->second == 0) per_source_.erase(it);
  }

  std::size_t held() const { return held_; }
  std::size_t held_by(std::uint32_t source) const {
    auto it = per_source_.find(source);
    return it == per_source_.end() ? 0 : it->second;
  }

 private:
  std::size_t bound_;
  std::size_t held_ = 0;
  // At most `bound_` entries: a source appears only while it holds a request.
  std::unordered_map<std::uint32_t, std::size_t> per_source_;
};

}  // namespace peercm::core
