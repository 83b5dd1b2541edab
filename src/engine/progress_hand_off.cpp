#include "engine/progress_hand_off.hpp"

namespace peercm::engine {

ProgressHandOff::Look ProgressHandOff::look(Clock::time_point now) {
  const std::uint64_t activity = activity_.load(std::memory_order_relaxed);
  const std::uint64_t hand_backs = hand_backs_.load(std::memory_order_relaxed);
  const bool moved = activity != activity_seen_;
  const bool handed_back = hand_backs != hand_backs_seen_;
  activity_seen_ = activity;
  hand_backs_seen_ = hand_backs;
  // A hand-back wins over activity: the application said it stops driving, and what it did
  // before saying so is over. A blocking waiter that comes after it still parks the thread.
  const bool waiting = blocking_waiters_.load(std::memory_order_relaxed) != 0;
  if (waiting || (moved && !handed_back)) {
    parked_looks_.store(parked_looks_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    const Clock::time_point look_again = now + kLookInterval;
    next_look_.store(look_again.time_since_epoch().count(), std::memory_order_relaxed);
    parked_.store(true, std::memory_order_relaxed);
    return {Decision::park, look_again};
  }
  parked_.store(false, std::memory_order_relaxed);
  driving_looks_.store(driving_looks_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  return {Decision::drive, now};
}

std::optional<Clock::time_point> ProgressHandOff::postpone_look(Clock::time_point now) {
  if (!parked_.load(std::memory_order_relaxed)) return std::nullopt;
  const Clock::time_point next_look{Clock::duration(next_look_.load(std::memory_order_relaxed))};
  if (next_look - now > kLookInterval / 2) return std::nullopt;
  // A racing look() may store its own time over this one: the thread then looks once more
  // than it needed, never later than an interval from now.
  const Clock::time_point look_again = now + kLookInterval;
  next_look_.store(look_again.time_since_epoch().count(), std::memory_order_relaxed);
  return look_again;
}

}  // namespace peercm::engine
