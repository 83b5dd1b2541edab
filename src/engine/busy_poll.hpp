// How an application thread that busy-polls a CQ gives the CPU away (docs/progress.md,
// "Waiting"): it spins for a budget after its last completion, then yields every few dozen
// empty polls. While it polls it drives its own progress (the progress thread is parked), so
// spinning starves nothing of its own process; the budget covers a reply's round trip, and
// past it the peer it waits for may be waiting for this CPU.
#pragma once

#include <chrono>
#include <cstdint>

#include "engine/progress_hand_off.hpp"

namespace peercm::engine {

class BusyPollBudget {
 public:
  // Long enough for a round trip on loopback under load (6-20 us): a ping-pong never yields.
  static constexpr std::chrono::microseconds kSpin{50};
  // The clock is read only every so many empty polls.
  static constexpr std::uint32_t kCheckEvery = 64;

  explicit BusyPollBudget(std::chrono::microseconds spin = kSpin) : spin_(spin) {}

  // After each poll (`found`: it took completions). True when the caller should yield now.
  bool should_yield(bool found) {
    if (found) {
      empty_ = 0;
      return false;
    }
    if (++empty_ % kCheckEvery != 0) return false;
    const Clock::time_point now = Clock::now();
    if (empty_ == kCheckEvery) spinning_since_ = now;
    return now - spinning_since_ >= spin_;
  }

 private:
  std::chrono::microseconds spin_;
  std::uint32_t empty_ = 0;
  Clock::time_point spinning_since_{};
};

}  // namespace peercm::engine
