// Who drives a thread-mode context's reactor: the progress thread, or an application thread
// that polls or waits in the library. The model of docs/progress.md ("Who drives progress"),
// as a state machine that takes inputs and time and answers the progress thread's one
// question: drive the reactor now, or stay parked until when. It reads no clock and owns no
// thread, so its tests run in virtual time.
//
// Inputs from application threads are lock-free and may come from any thread; look() is the
// progress thread's alone.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>

namespace peercm::engine {

using Clock = std::chrono::steady_clock;

class ProgressHandOff {
 public:
  // How long the progress thread stays parked before it looks again. It bounds how late the
  // thread takes over from an application that stops polling without saying so: at most two
  // intervals after its last activity (activity just after a look is seen at the next one,
  // which parks once more).
  static constexpr Clock::duration kLookInterval = std::chrono::milliseconds(1);
  // How often a driving application thread asks postpone_look(): every so many activities.
  static constexpr std::uint64_t kPostponeCheckEvery = 16;

  // An application thread drove the reactor or did work that a poller does: a pass of its
  // own, a post that transmitted, a CQ poll that took completions, or a poll that found the
  // reactor taken (its owner then parks after the round).
  void note_application_progress() { activity_.fetch_add(1, std::memory_order_relaxed); }
  // The same, from a thread that holds the reactor's owner mutex: no locked instruction on a
  // busy poller's every pass. A concurrent note_application_progress() may be overwritten;
  // the counter still moves, which is all a look asks. True every kPostponeCheckEvery-th
  // time: the caller then asks postpone_look() (a clock reading every pass would cost a busy
  // poller more than the pass).
  bool note_application_progress_locked() {
    const std::uint64_t activity = activity_.load(std::memory_order_relaxed) + 1;
    activity_.store(activity, std::memory_order_relaxed);
    return activity % kPostponeCheckEvery == 0;
  }
  // A driving application thread pushes the parked progress thread's next look back, so that
  // while it polls the thread does not wake at all: each look that finds activity is a
  // wake-up, a context switch that on a machine with no idle CPU preempts a poller (the
  // latency tail of docs/progress.md, "Bounds"). Returns the new look time when the thread is
  // parked and its look is less than half an interval away (the caller moves the thread's
  // timer there: one system call per half interval at most); nothing otherwise. The
  // takeover bound stays two intervals after the last activity: a postponed look still finds
  // activity since the previous one and parks once more.
  std::optional<Clock::time_point> postpone_look(Clock::time_point now);
  // An application thread sleeps on the reactor itself (CompletionChannel::get_event) from
  // begin to end: the progress thread stays parked throughout, whatever the activity says.
  void begin_blocking_wait() { blocking_waiters_.fetch_add(1, std::memory_order_relaxed); }
  void end_blocking_wait() {
    blocking_waiters_.fetch_sub(1, std::memory_order_relaxed);
    activity_.fetch_add(1, std::memory_order_relaxed);
  }
  // The application stops driving and will sleep where the reactor cannot see it: the
  // progress thread drives from its next look, without waiting out an interval. The caller
  // wakes a parked thread (Reactor::hand_back).
  void hand_back() { hand_backs_.fetch_add(1, std::memory_order_relaxed); }

  enum class Decision { drive, park };
  struct Look {
    Decision decision;
    // For park: when to look again (a hand_back() may come first).
    Clock::time_point look_again;
  };
  // The progress thread's question, asked before each round and after each park. Drives when
  // the application handed back since the last look, or did nothing since the last look and
  // no application thread sleeps on the reactor; parks for kLookInterval otherwise (until
  // postpone_look() moves the look later).
  Look look(Clock::time_point now);

  // Whether hand_back() came since the last look: ends a park early (Reactor::hand_back).
  bool handed_back_since_look() const { return hand_backs_.load(std::memory_order_relaxed) != hand_backs_seen_; }

  // For tests: how many looks parked, and how many drove (readable from any thread).
  std::uint64_t parked_looks() const { return parked_looks_.load(std::memory_order_relaxed); }
  std::uint64_t driving_looks() const { return driving_looks_.load(std::memory_order_relaxed); }
  // For tests: hand_back() calls so far.
  std::uint64_t hand_backs() const { return hand_backs_.load(std::memory_order_relaxed); }

 private:
  // Its own cache line: application threads write it at every pass, and the reactor's fields
  // beside it are written by whoever drives.
  alignas(64) std::atomic<std::uint64_t> activity_{0};
  alignas(64) std::atomic<std::uint32_t> blocking_waiters_{0};
  std::atomic<std::uint64_t> hand_backs_{0};
  // Whether the last look parked, and until when the thread stays parked (the steady clock's
  // ticks): written by look() and postpone_look().
  std::atomic<bool> parked_{false};
  std::atomic<Clock::rep> next_look_{0};
  // The progress thread's own: what the last look saw.
  std::uint64_t activity_seen_ = 0;
  std::uint64_t hand_backs_seen_ = 0;
  std::atomic<std::uint64_t> parked_looks_{0};
  std::atomic<std::uint64_t> driving_looks_{0};
};

}  // namespace peercm::engine
