// The one network model of the simulator, shared by both transports and driven by the run's one
// Rng. It decides when (and whether) a message arrives; the worlds keep the messages.
//  - Streams (iWARP: TCP connections): in order per direction and reliable while the path is up.
//    A segment arrives after a random delay, never before the one sent ahead of it.
//  - Datagrams (RoCE: CM MADs, RC packets): each copy is delayed independently, so datagrams
//    overtake one another; a fraction is lost and a fraction duplicated.
//  - Partitions: a pair of nodes cut off from each other during a window. A datagram sent across
//    a cut is lost; a stream across a cut is reset, as TCP's retransmissions run out.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/time.hpp"
#include "sim_rng.hpp"

namespace peercm::sim {

struct Faults {
  core::Duration max_delay{};      // one-way delay: uniform in [0, max_delay]
  unsigned zero_delay_percent = 10;  // messages that take no time at all (same-instant races)
  unsigned loss_percent = 0;       // datagrams only
  unsigned duplicate_percent = 0;  // datagrams only: delivered twice, independently delayed
};

struct Partition {
  int a = 0;
  int b = 0;
  core::Time from{};
  core::Time until{};
};

class Network {
 public:
  Network(Rng& rng, const Faults& faults) : rng_(&rng), faults_(faults) {}

  const Faults& faults() const { return faults_; }
  void set_faults(const Faults& faults) { faults_ = faults; }

  core::Duration delay() {
    if (faults_.max_delay == core::Duration::zero() || rng_->percent(faults_.zero_delay_percent)) {
      return core::Duration::zero();
    }
    return core::Duration(static_cast<core::Duration::rep>(
        rng_->between(std::uint64_t{0}, static_cast<std::uint64_t>(faults_.max_delay.count()))));
  }

  // A stream segment sent now: it arrives in order, after `last` (the arrival of the segment ahead
  // of it in the same direction), which it updates.
  core::Time stream_arrival(core::Time now, core::Time& last) {
    const core::Time at = std::max(now + delay(), last);
    last = at;
    return at;
  }

  // A datagram sent now: the arrival of each copy (none: lost). Copies travel independently, so
  // datagrams reorder.
  std::vector<core::Time> datagram_arrivals(int from, int to, core::Time now) {
    std::vector<core::Time> out;
    if (cut(from, to, now) || rng_->percent(faults_.loss_percent)) return out;
    const int copies = rng_->percent(faults_.duplicate_percent) ? 2 : 1;
    for (int c = 0; c < copies; ++c) out.push_back(now + delay());
    return out;
  }

  void partition(const Partition& window) { partitions_.push_back(window); }
  void heal_all() { partitions_.clear(); }
  const std::vector<Partition>& partitions() const { return partitions_; }

  // Whether a and b cannot reach each other at `at`.
  bool cut(int a, int b, core::Time at) const {
    for (const Partition& p : partitions_) {
      if (((p.a == a && p.b == b) || (p.a == b && p.b == a)) && p.from <= at && at < p.until) return true;
    }
    return false;
  }

 private:
  Rng* rng_;
  Faults faults_;
  std::vector<Partition> partitions_;
};

}  // namespace peercm::sim
