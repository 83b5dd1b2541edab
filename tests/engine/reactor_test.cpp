// Reactor: fd dispatch, timers, callback safety, wake-ups and the progress thread.
// Timing asserts are one-sided where possible (never early) and loose otherwise.
#include "engine/reactor.hpp"

#include <fcntl.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace peercm::engine {
namespace {

using namespace std::chrono_literals;

constexpr std::uint32_t kIn = static_cast<std::uint32_t>(EPOLLIN);
constexpr std::uint32_t kOut = static_cast<std::uint32_t>(EPOLLOUT);
constexpr std::uint32_t kEt = static_cast<std::uint32_t>(EPOLLET);
constexpr std::uint32_t kHup = static_cast<std::uint32_t>(EPOLLHUP);

// A non-blocking pipe that closes what it still owns.
struct Pipe {
  int r = -1;
  int w = -1;
  Pipe() {
    int fds[2] = {-1, -1};
    if (::pipe2(fds, O_NONBLOCK | O_CLOEXEC) == 0) {
      r = fds[0];
      w = fds[1];
    }
  }
  ~Pipe() {
    close_read();
    close_write();
  }
  Pipe(const Pipe&) = delete;
  Pipe& operator=(const Pipe&) = delete;

  void put() const {
    const char byte = 'x';
    EXPECT_EQ(::write(w, &byte, 1), 1);
  }
  // Whether there was anything to read.
  bool drain() const {
    char buf[64];
    bool any = false;
    while (::read(r, buf, sizeof buf) > 0) any = true;
    return any;
  }
  void close_read() {
    if (r >= 0) ::close(r);
    r = -1;
  }
  void close_write() {
    if (w >= 0) ::close(w);
    w = -1;
  }
};

class ReactorTest : public ::testing::Test {
 protected:
  void TearDown() override {
    if (lock.owns_lock()) lock.unlock();
    reactor.stop_thread();  // joins: called without the owner mutex
    lock.lock();
    EXPECT_EQ(reactor.registered_fds(), 0u);
    EXPECT_EQ(reactor.pending_timers(), 0u);
  }

  // Runs rounds until `done()` or a generous limit, so a loaded machine only slows it.
  template <class Pred>
  bool run_until(Pred done, std::chrono::milliseconds limit = 2000ms) {
    const auto end = Clock::now() + limit;
    while (!done()) {
      if (Clock::now() > end) return false;
      reactor.run_once(lock, 50ms);
    }
    return true;
  }

  // Declaration order matters: lock unlocks first, then the reactor goes, then the mutex.
  std::mutex mu;
  Reactor reactor{mu};
  std::unique_lock<std::mutex> lock{mu};
};

// --- fds ---------------------------------------------------------------------------------

TEST_F(ReactorTest, ReadablePipeDispatchesItsCallbackWithTheEvents) {
  Pipe p;
  int calls = 0;
  std::uint32_t seen = 0;
  ASSERT_TRUE(reactor.add(p.r, kIn, [&](std::uint32_t ev) {
    ++calls;
    seen = ev;
    p.drain();
  }));
  EXPECT_EQ(reactor.registered_fds(), 1u);

  reactor.run_once(lock, 0ms);
  EXPECT_EQ(calls, 0);

  p.put();
  reactor.run_once(lock, 1000ms);
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(seen & kIn);

  reactor.remove(p.r);
  EXPECT_EQ(reactor.registered_fds(), 0u);
}

TEST_F(ReactorTest, LevelTriggeredRepeatsUntilDrainedEdgeTriggeredDoesNot) {
  Pipe level;
  Pipe edge;
  int level_calls = 0;
  int edge_calls = 0;
  ASSERT_TRUE(reactor.add(level.r, kIn, [&](std::uint32_t) { ++level_calls; }));
  ASSERT_TRUE(reactor.add(edge.r, kIn | kEt, [&](std::uint32_t) { ++edge_calls; }));
  level.put();
  edge.put();
  reactor.run_once(lock, 1000ms);
  reactor.run_once(lock, 0ms);
  reactor.run_once(lock, 0ms);
  EXPECT_EQ(level_calls, 3);
  EXPECT_EQ(edge_calls, 1);
  reactor.remove(level.r);
  reactor.remove(edge.r);
}

TEST_F(ReactorTest, ModifyChangesTheInterestSet) {
  Pipe p;
  std::uint32_t seen = 0;
  // A pipe's write end is always writable, never readable.
  ASSERT_TRUE(reactor.add(p.w, kIn, [&](std::uint32_t ev) { seen |= ev; }));
  reactor.run_once(lock, 0ms);
  EXPECT_EQ(seen, 0u);
  ASSERT_TRUE(reactor.modify(p.w, kOut));
  reactor.run_once(lock, 1000ms);
  EXPECT_TRUE(seen & kOut);
  reactor.remove(p.w);
}

TEST_F(ReactorTest, HangupIsReported) {
  Pipe p;
  std::uint32_t seen = 0;
  ASSERT_TRUE(reactor.add(p.r, kIn, [&](std::uint32_t ev) { seen |= ev; }));
  p.close_write();
  reactor.run_once(lock, 1000ms);
  EXPECT_TRUE(seen & kHup);
  reactor.remove(p.r);
}

TEST_F(ReactorTest, AddAndModifyReportErrorsAsValues) {
  auto noop = [](std::uint32_t) {};
  auto bad = reactor.add(-1, kIn, noop);
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error(), std::errc::bad_file_descriptor);

  int closed = -1;
  {
    Pipe gone;
    closed = gone.r;
  }
  auto stale = reactor.add(closed, kIn, noop);
  ASSERT_FALSE(stale);
  EXPECT_EQ(stale.error(), std::errc::bad_file_descriptor);

  Pipe p;
  auto empty = reactor.add(p.r, kIn, Reactor::IoCallback{});
  ASSERT_FALSE(empty);
  EXPECT_EQ(empty.error(), std::errc::invalid_argument);

  ASSERT_TRUE(reactor.add(p.r, kIn, noop));
  auto twice = reactor.add(p.r, kIn, noop);
  ASSERT_FALSE(twice);
  EXPECT_EQ(twice.error(), std::errc::file_exists);

  auto unknown = reactor.modify(p.w, kOut);
  ASSERT_FALSE(unknown);
  EXPECT_EQ(unknown.error(), std::errc::no_such_file_or_directory);

  reactor.remove(p.w);  // unknown: no-op
  EXPECT_EQ(reactor.registered_fds(), 1u);
  reactor.remove(p.r);
  reactor.remove(p.r);  // twice: no-op
  EXPECT_EQ(reactor.registered_fds(), 0u);
}

// --- callback safety ---------------------------------------------------------------------

TEST_F(ReactorTest, RemoveInsideItsOwnCallbackIsSafeAndFinal) {
  Pipe p;
  int calls = 0;
  auto payload = std::make_shared<std::string>("callback state");
  ASSERT_TRUE(reactor.add(p.r, kIn, [&, payload](std::uint32_t) {
    ++calls;
    reactor.remove(p.r);
    // The closure (and `payload` in it) must still be alive after remove(): ASan checks.
    EXPECT_EQ(*payload, "callback state");
  }));
  payload.reset();
  p.put();  // never drained: level-triggered would fire every round if still registered
  reactor.run_once(lock, 1000ms);
  reactor.run_once(lock, 0ms);
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(reactor.registered_fds(), 0u);
}

TEST_F(ReactorTest, RemovingAnotherReadyFdInTheSameBatchSuppressesItsCallback) {
  Pipe a;
  Pipe b;
  int a_calls = 0;
  int b_calls = 0;
  // Whichever is dispatched first removes the other, whose event is in the same batch.
  ASSERT_TRUE(reactor.add(a.r, kIn, [&](std::uint32_t) {
    ++a_calls;
    reactor.remove(b.r);
    reactor.remove(a.r);
  }));
  ASSERT_TRUE(reactor.add(b.r, kIn, [&](std::uint32_t) {
    ++b_calls;
    reactor.remove(a.r);
    reactor.remove(b.r);
  }));
  a.put();
  b.put();
  // Both readable before the wait, so both events arrive in one epoll_wait.
  reactor.run_once(lock, 1000ms);
  reactor.run_once(lock, 0ms);
  EXPECT_EQ(a_calls + b_calls, 1);
  EXPECT_EQ(reactor.registered_fds(), 0u);
}

TEST_F(ReactorTest, ReusedFdNumberDoesNotReceiveTheOldRegistrationsStaleEvent) {
  Pipe a;
  auto b = std::make_unique<Pipe>();
  auto fresh = std::make_unique<Pipe>();
  fresh->close_read();
  fresh->close_write();
  int old_calls = 0;
  int new_calls = 0;
  int reused_fd = -1;
  bool renumbered = false;
  auto replace = [&](int victim) {
    // Remove and close the other (ready) fd, then take its number for a fresh pipe
    // that is NOT readable: the pending event for the old number must not reach it.
    reactor.remove(victim);
    if (victim == b->r) {
      b->close_read();
    } else {
      a.close_read();
    }
    fresh = std::make_unique<Pipe>();  // lowest free numbers: reuses `victim`
    renumbered = fresh->r == victim;
    reused_fd = fresh->r;
    ASSERT_TRUE(reactor.add(fresh->r, kIn, [&](std::uint32_t) {
      ++new_calls;
      fresh->drain();
    }));
  };
  int a_fd = a.r;
  int b_fd = b->r;
  ASSERT_TRUE(reactor.add(a_fd, kIn, [&, b_fd](std::uint32_t) {
    ++old_calls;
    replace(b_fd);
    reactor.remove(a_fd);
  }));
  ASSERT_TRUE(reactor.add(b_fd, kIn, [&, a_fd](std::uint32_t) {
    ++old_calls;
    replace(a_fd);
    reactor.remove(b_fd);
  }));
  a.put();
  b->put();
  reactor.run_once(lock, 1000ms);
  EXPECT_TRUE(renumbered) << "test precondition: the fd number was not reused";
  EXPECT_EQ(old_calls, 1);
  EXPECT_EQ(new_calls, 0);

  fresh->put();
  reactor.run_once(lock, 1000ms);
  EXPECT_EQ(new_calls, 1);
  reactor.remove(reused_fd);
  EXPECT_EQ(reactor.registered_fds(), 0u);
}

TEST_F(ReactorTest, FdClosedWithoutRemoveCanBeRegisteredAgainUnderItsNumber) {
  int old_calls = 0;
  int new_calls = 0;
  auto first = std::make_unique<Pipe>();
  const int number = first->r;
  ASSERT_TRUE(reactor.add(number, kIn, [&](std::uint32_t) { ++old_calls; }));
  first.reset();  // closed behind the reactor's back: the kernel drops it from epoll

  Pipe second;
  ASSERT_EQ(second.r, number);
  ASSERT_TRUE(reactor.add(second.r, kIn, [&](std::uint32_t) {
    ++new_calls;
    second.drain();
  }));
  EXPECT_EQ(reactor.registered_fds(), 1u);
  second.put();
  reactor.run_once(lock, 1000ms);
  EXPECT_EQ(old_calls, 0);
  EXPECT_EQ(new_calls, 1);
  reactor.remove(second.r);
}

TEST_F(ReactorTest, CallbacksCanAddFdsAndTimers) {
  Pipe a;
  Pipe b;
  bool b_called = false;
  bool timer_fired = false;
  ASSERT_TRUE(reactor.add(a.r, kIn, [&](std::uint32_t) {
    a.drain();
    reactor.remove(a.r);
    ASSERT_TRUE(reactor.add(b.r, kIn, [&](std::uint32_t) {
      b_called = true;
      reactor.remove(b.r);
    }));
    reactor.add_timer(Clock::now(), [&] { timer_fired = true; });
  }));
  a.put();
  b.put();
  EXPECT_TRUE(run_until([&] { return b_called && timer_fired; }));
}

// --- timers ------------------------------------------------------------------------------

// A reactor on a virtual clock: rounds that do not wait, at times the test sets.
class ManualTime final : public TimeSource {
 public:
  Clock::time_point now() const override { return now_; }
  void advance(Clock::duration by) { now_ += by; }

 private:
  Clock::time_point now_{std::chrono::hours(1)};
};

class VirtualTimeReactorTest : public ::testing::Test {
 protected:
  void TearDown() override { EXPECT_EQ(reactor.pending_timers(), 0u); }
  ManualTime time;
  std::mutex mu;
  Reactor reactor{mu, time};
  std::unique_lock<std::mutex> lock{mu};
};

TEST_F(VirtualTimeReactorTest, TimersFireInDeadlineOrderFifoOnTiesAndNeverEarly) {
  const auto t0 = time.now();
  std::vector<int> fired;
  auto arm = [&](int tag, std::chrono::microseconds offset) {
    return reactor.add_timer(t0 + offset, [&fired, tag] { fired.push_back(tag); });
  };
  const auto id30 = arm(30, 15ms);
  const auto id10 = arm(10, 5ms);
  const auto id20 = arm(20, 10ms);
  const auto id11 = arm(11, 5ms);  // same deadline as 10: fires after it
  const auto id5 = arm(5, 1500us);
  EXPECT_NE(id30, 0u);
  EXPECT_EQ(reactor.pending_timers(), 5u);
  for (auto id : {id10, id20, id11, id5}) EXPECT_NE(id, id30);

  EXPECT_EQ(reactor.next_deadline(), t0 + 1500us);
  time.advance(1499us);
  reactor.run_once(lock, 0ms);
  EXPECT_TRUE(fired.empty()) << "a timer fired early";
  time.advance(1us);
  reactor.run_once(lock, 0ms);
  EXPECT_EQ(fired, (std::vector<int>{5}));
  time.advance(8500us);  // t0 + 10 ms: three due at once, in deadline order, FIFO on the tie
  reactor.run_once(lock, 0ms);
  EXPECT_EQ(fired, (std::vector<int>{5, 10, 11, 20}));
  time.advance(5ms);
  reactor.run_once(lock, 0ms);
  EXPECT_EQ(fired, (std::vector<int>{5, 10, 11, 20, 30}));
}

TEST_F(VirtualTimeReactorTest, CancelledTimerNeverFires) {
  bool cancelled_fired = false;
  bool kept_fired = false;
  const auto cancelled = reactor.add_timer(time.now() + 2ms, [&] { cancelled_fired = true; });
  reactor.add_timer(time.now() + 5ms, [&] { kept_fired = true; });
  reactor.cancel_timer(cancelled);
  reactor.cancel_timer(cancelled);  // twice: no-op
  reactor.cancel_timer(0);          // never issued: no-op
  EXPECT_EQ(reactor.pending_timers(), 1u);
  time.advance(5ms);
  reactor.run_once(lock, 0ms);
  EXPECT_TRUE(kept_fired);
  EXPECT_FALSE(cancelled_fired);
}

TEST_F(ReactorTest, SubMillisecondDeadlinesFireInOneRoundNeverEarly) {
  // The wait ends at the deadline to the nanosecond (epoll_pwait2), or rounded up to a whole
  // ms where the kernel lacks it: either way one round fires the timer, never early.
  for (auto offset : {100us, 300us, 999us, 1001us, 1700us}) {
    const auto deadline = Clock::now() + offset;
    Clock::time_point at{};
    bool fired = false;
    reactor.add_timer(deadline, [&] {
      fired = true;
      at = Clock::now();
    });
    reactor.run_once(lock, 1000ms);
    EXPECT_TRUE(fired) << "offset " << offset.count() << "us";
    if (fired) {
      EXPECT_GE(at, deadline);
    } else {
      EXPECT_TRUE(run_until([&] { return fired; }));
    }
  }
}

// --- poll_directly ------------------------------------------------------------------------

TEST_F(ReactorTest, PollerPassesCallADirectFdWithoutAskingEpoll) {
  Pipe p;
  int calls = 0;
  int bytes = 0;
  ASSERT_TRUE(reactor.add(p.r, kIn, [&](std::uint32_t ev) {
    ++calls;
    EXPECT_TRUE(ev & kIn);
    char buf[8];
    while (::read(p.r, buf, sizeof buf) > 0) ++bytes;
  }));
  reactor.poll_directly(p.r, true);
  // Nothing to read: the direct passes call it anyway (the callback finds EAGAIN); the
  // epoll pass among them does not.
  for (unsigned i = 0; i < Reactor::kEpollEvery; ++i) reactor.run_once(lock, 0ms);
  EXPECT_EQ(calls, static_cast<int>(Reactor::kEpollEvery) - 1);
  p.put();
  reactor.run_once(lock, 0ms);
  EXPECT_EQ(bytes, 1);
  reactor.poll_directly(p.r, false);
  calls = 0;
  for (unsigned i = 0; i < 2 * Reactor::kEpollEvery; ++i) reactor.run_once(lock, 0ms);
  EXPECT_EQ(calls, 0) << "unmarked: only readiness calls it";
  reactor.remove(p.r);
}

TEST_F(ReactorTest, DirectPassesOfferEpolloutOnlyWhileItIsInTheInterest) {
  Pipe p;
  std::vector<std::uint32_t> seen;
  ASSERT_TRUE(reactor.add(p.r, kIn, [&](std::uint32_t ev) { seen.push_back(ev); }));
  reactor.poll_directly(p.r, true);
  reactor.run_once(lock, 0ms);
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0], kIn);
  // A sender waiting for room: its direct passes try to write as well as to read.
  ASSERT_TRUE(reactor.modify(p.r, kIn | kOut));
  reactor.run_once(lock, 0ms);
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[1], kIn | kOut);
  ASSERT_TRUE(reactor.modify(p.r, kIn));
  reactor.run_once(lock, 0ms);
  ASSERT_EQ(seen.size(), 3u);
  EXPECT_EQ(seen[2], kIn);
  reactor.remove(p.r);
}

// run_ready() asks epoll on every call: an fd that is not read directly (a listener, say) is
// dispatched even where run_once(0) would make a direct pass only.
TEST_F(ReactorTest, RunReadyAsksEpollWhereAPollerPassWouldNot) {
  Pipe direct, other;
  int other_calls = 0;
  ASSERT_TRUE(reactor.add(direct.r, kIn, [&](std::uint32_t) { direct.drain(); }));
  ASSERT_TRUE(reactor.add(other.r, kIn, [&](std::uint32_t) {
    other.drain();
    ++other_calls;
  }));
  reactor.poll_directly(direct.r, true);
  other.put();
  reactor.run_once(lock, 0ms);  // a direct pass (not the kEpollEvery-th)
  EXPECT_EQ(other_calls, 0);
  reactor.run_ready(lock);
  EXPECT_EQ(other_calls, 1);
  reactor.remove(direct.r);
  reactor.remove(other.r);
}

TEST_F(ReactorTest, OtherFdsAndTimersStillRunDuringDirectPasses) {
  Pipe direct, other;
  ASSERT_TRUE(reactor.add(direct.r, kIn, [&](std::uint32_t) { direct.drain(); }));
  reactor.poll_directly(direct.r, true);
  int other_calls = 0;
  ASSERT_TRUE(reactor.add(other.r, kIn, [&](std::uint32_t) {
    ++other_calls;
    other.drain();
  }));
  bool fired = false;
  reactor.add_timer(Clock::now(), [&] { fired = true; });
  other.put();
  for (unsigned i = 0; i < Reactor::kEpollEvery; ++i) reactor.run_once(lock, 0ms);
  EXPECT_EQ(other_calls, 1) << "one pass in kEpollEvery asks epoll";
  EXPECT_TRUE(fired);
  reactor.remove(direct.r);
  reactor.remove(other.r);
}

TEST_F(ReactorTest, TooManyDirectFdsFallBackToEpoll) {
  std::vector<std::unique_ptr<Pipe>> pipes;
  int calls = 0;
  for (std::size_t i = 0; i <= Reactor::kMaxDirectFds; ++i) {
    pipes.push_back(std::make_unique<Pipe>());
    ASSERT_TRUE(reactor.add(pipes.back()->r, kIn, [&](std::uint32_t) { ++calls; }));
    reactor.poll_directly(pipes.back()->r, true);
  }
  for (unsigned i = 0; i < Reactor::kEpollEvery; ++i) reactor.run_once(lock, 0ms);
  EXPECT_EQ(calls, 0) << "more than kMaxDirectFds: every pass asks epoll, nothing is ready";
  for (const auto& pipe : pipes) reactor.remove(pipe->r);
}

TEST_F(ReactorTest, DirectCallbackMayRemoveTheOtherDirectFd) {
  Pipe a, b;
  int b_calls = 0;
  ASSERT_TRUE(reactor.add(a.r, kIn, [&](std::uint32_t) { reactor.remove(b.r); }));
  ASSERT_TRUE(reactor.add(b.r, kIn, [&](std::uint32_t) { ++b_calls; }));
  reactor.poll_directly(a.r, true);
  reactor.poll_directly(b.r, true);
  reactor.run_once(lock, 0ms);  // the first pass is a direct one
  EXPECT_EQ(b_calls, 0);
  EXPECT_EQ(reactor.registered_fds(), 1u);
  reactor.remove(a.r);
}

TEST_F(ReactorTest, DirectCallbackMayRemoveItselfAndItsClosureDiesAfterThePass) {
  Pipe p;
  int calls = 0;
  auto payload = std::make_shared<std::string>("callback state");
  const std::weak_ptr<std::string> watch = payload;
  ASSERT_TRUE(reactor.add(p.r, kIn, [&, payload](std::uint32_t) {
    ++calls;
    reactor.remove(p.r);
    // Still alive after remove(), to the end of this callback: ASan checks.
    EXPECT_EQ(*payload, "callback state");
  }));
  reactor.poll_directly(p.r, true);
  payload.reset();
  reactor.run_once(lock, 0ms);  // the first pass is a direct one
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(watch.expired()) << "the removed registration is released once the pass returns";
  reactor.run_once(lock, 0ms);
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(reactor.registered_fds(), 0u);
}

TEST_F(ReactorTest, BlockingRoundsNeverCallDirectFdsSpuriously) {
  Pipe p;
  int calls = 0;
  ASSERT_TRUE(reactor.add(p.r, kIn, [&](std::uint32_t) { ++calls; }));
  reactor.poll_directly(p.r, true);
  for (int i = 0; i < 3; ++i) reactor.run_once(lock, 1ms);
  EXPECT_EQ(calls, 0);
  reactor.remove(p.r);
}

TEST_F(ReactorTest, MaxWaitBoundsTheSleepWithoutTimers) {
  const auto t0 = Clock::now();
  reactor.run_once(lock, 20ms);
  EXPECT_GE(Clock::now() - t0, 20ms);
}

TEST_F(ReactorTest, TimerCancelledByAnEarlierTimerOfTheSameRoundDoesNotFire) {
  const auto past = Clock::now() - 1ms;
  Reactor::TimerId second = 0;
  Reactor::TimerId third = 0;
  std::vector<int> fired;
  reactor.add_timer(past, [&] {
    fired.push_back(1);
    reactor.cancel_timer(second);
  });
  second = reactor.add_timer(past, [&] { fired.push_back(2); });
  third = reactor.add_timer(past, [&] {
    fired.push_back(3);
    reactor.cancel_timer(third);  // its own id: already retired, no-op
  });
  reactor.run_once(lock, 0ms);
  EXPECT_EQ(fired, (std::vector<int>{1, 3}));
}

TEST_F(ReactorTest, TimerAddedFromATimerCallbackFiresInALaterRound) {
  int fired = 0;
  std::function<void()> rearm = [&] {
    if (++fired < 3) reactor.add_timer(Clock::now() - 1ms, rearm);
  };
  reactor.add_timer(Clock::now() - 1ms, rearm);
  reactor.run_once(lock, 0ms);
  EXPECT_EQ(fired, 1);
  reactor.run_once(lock, 0ms);
  EXPECT_EQ(fired, 2);
  reactor.run_once(lock, 0ms);
  EXPECT_EQ(fired, 3);
}

TEST_F(ReactorTest, FdCallbackCanCancelATimerDueInTheSameRound) {
  Pipe p;
  bool timer_fired = false;
  const auto id = reactor.add_timer(Clock::now() - 1ms, [&] { timer_fired = true; });
  ASSERT_TRUE(reactor.add(p.r, kIn, [&](std::uint32_t) {
    reactor.cancel_timer(id);
    reactor.remove(p.r);
  }));
  p.put();
  reactor.run_once(lock, 0ms);
  EXPECT_FALSE(timer_fired);
}

// --- wake-ups and threads ----------------------------------------------------------------

TEST_F(ReactorTest, WakeFromAnotherThreadInterruptsALongWait) {
  std::thread waker([this] {
    std::this_thread::sleep_for(20ms);
    reactor.wake();
  });
  const auto t0 = Clock::now();
  reactor.run_once(lock, 10s);
  const auto elapsed = Clock::now() - t0;
  waker.join();
  EXPECT_LT(elapsed, 1s);
}

TEST_F(ReactorTest, WakeBeforeTheWaitIsNotLostAndIsDrained) {
  reactor.wake();
  reactor.wake();
  auto t0 = Clock::now();
  reactor.run_once(lock, 10s);
  EXPECT_LT(Clock::now() - t0, 1s);
  // Drained: the next round sleeps its full time.
  t0 = Clock::now();
  reactor.run_once(lock, 30ms);
  EXPECT_GE(Clock::now() - t0, 30ms);
}

TEST_F(ReactorTest, OnReactorThreadInsideRunOnceOnly) {
  EXPECT_FALSE(reactor.on_reactor_thread());
  bool inside = false;
  reactor.add_timer(Clock::now(), [&] { inside = reactor.on_reactor_thread(); });
  EXPECT_TRUE(run_until([&] { return inside; }));
  EXPECT_FALSE(reactor.on_reactor_thread());
}

TEST_F(ReactorTest, ProgressThreadRunsCallbacksAndStopsCleanly) {
  std::condition_variable cv;
  Pipe p;
  int calls = 0;
  bool on_thread = false;
  bool timer_on_thread = false;
  ASSERT_TRUE(reactor.add(p.r, kIn, [&](std::uint32_t) {
    p.drain();
    ++calls;
    on_thread = reactor.on_reactor_thread();
    cv.notify_all();
  }));
  reactor.start_thread();
  reactor.start_thread();  // already running: no-op
  EXPECT_FALSE(reactor.on_reactor_thread());

  p.put();
  ASSERT_TRUE(cv.wait_for(lock, 2s, [&] { return calls == 1; }));
  EXPECT_TRUE(on_thread);

  reactor.add_timer(Clock::now() + 1ms, [&] {
    timer_on_thread = reactor.on_reactor_thread();
    cv.notify_all();
  });
  ASSERT_TRUE(cv.wait_for(lock, 2s, [&] { return timer_on_thread; }));

  lock.unlock();
  reactor.stop_thread();
  reactor.stop_thread();  // not running: no-op
  p.put();
  std::this_thread::sleep_for(20ms);
  lock.lock();
  EXPECT_EQ(calls, 1);  // nobody runs the reactor any more

  reactor.run_once(lock, 1000ms);  // the caller can drive it again
  EXPECT_EQ(calls, 2);
  reactor.remove(p.r);
}

// --- who drives: the progress thread and application threads (docs/progress.md) ----------
// The hand-off's decisions are tested in virtual time (progress_hand_off_test.cpp); these
// test the threads that act on them, with loose bounds.

// Where the pipe's callback ran.
struct DispatchLog {
  std::mutex mutex;
  std::vector<std::thread::id> threads;
  void add() {
    const std::lock_guard<std::mutex> guard(mutex);
    threads.push_back(std::this_thread::get_id());
  }
  std::size_t count() {
    const std::lock_guard<std::mutex> guard(mutex);
    return threads.size();
  }
  std::size_t on(std::thread::id thread) {
    const std::lock_guard<std::mutex> guard(mutex);
    return static_cast<std::size_t>(std::count(threads.begin(), threads.end(), thread));
  }
};

template <class Pred>
bool wait_for(Pred done, std::chrono::milliseconds limit = 2000ms) {
  const auto end = Clock::now() + limit;
  while (!done()) {
    if (Clock::now() > end) return false;
    std::this_thread::sleep_for(100us);
  }
  return true;
}

// An application thread polls (passes of its own): the progress thread parks rather than
// racing it for the pipe, then takes over once the polling stops, unannounced or handed back.
void PollThenStop(Reactor& reactor, std::unique_lock<std::mutex>& lock, bool hand_back) {
  Pipe p;
  DispatchLog log;
  // Two threads woken for the same byte: only the one that reads it counts.
  ASSERT_TRUE(reactor.add(p.r, kIn, [&](std::uint32_t) {
    if (p.drain()) log.add();
  }));
  reactor.note_application_progress();
  reactor.start_thread();  // its first look, once it has the mutex, sees the activity: it parks
  lock.unlock();
  const auto poll_until = Clock::now() + 30ms;
  std::size_t puts = 0;
  while (Clock::now() < poll_until) {
    if (log.count() == puts) {
      p.put();
      ++puts;
    }
    reactor.note_application_progress();
    lock.lock();
    reactor.run_once(lock, 0ms);
    lock.unlock();
  }
  ASSERT_TRUE(wait_for([&] { return log.count() == puts; }));
  EXPECT_GT(reactor.hand_off().parked_looks(), 0u);
  // Loose: a loaded machine may keep this thread off the CPU past an interval, and the
  // progress thread then rightly takes a message over.
  EXPECT_GE(log.on(std::this_thread::get_id()), puts / 2) << "the progress thread raced the poller";
  if (hand_back) reactor.hand_back();
  p.put();
  EXPECT_TRUE(wait_for([&] { return log.count() == puts + 1; })) << "nobody took over from the poller";
  {
    const std::lock_guard<std::mutex> guard(log.mutex);
    EXPECT_NE(log.threads.back(), std::this_thread::get_id());
  }
  lock.lock();
  reactor.remove(p.r);
}

TEST_F(ReactorTest, ProgressThreadParksWhileAnApplicationThreadPollsAndTakesOverWhenItStops) {
  PollThenStop(reactor, lock, false);
}

TEST_F(ReactorTest, ProgressThreadTakesOverWhenThePollerHandsBack) { PollThenStop(reactor, lock, true); }

// A poller that drives with the mutex held (ContextImpl::poll_pass) moves the parked thread's
// timer ahead of it: the thread sleeps through the polling instead of waking once per
// interval to find it, and still takes over once the polling stops.
TEST_F(ReactorTest, APollerHoldingTheMutexKeepsTheProgressThreadAsleep) {
  Pipe p;
  DispatchLog log;
  ASSERT_TRUE(reactor.add(p.r, kIn, [&](std::uint32_t) {
    if (p.drain()) log.add();
  }));
  reactor.note_application_progress();
  reactor.start_thread();
  lock.unlock();
  ASSERT_TRUE(wait_for([&] { return reactor.hand_off().parked_looks() > 0; }));
  const std::uint64_t looks_before = reactor.hand_off().parked_looks();
  const auto poll_for = 40 * ProgressHandOff::kLookInterval;
  const auto poll_until = Clock::now() + poll_for;
  while (Clock::now() < poll_until) {
    lock.lock();
    reactor.note_application_progress_locked();
    reactor.run_once(lock, 0ms);
    lock.unlock();
  }
  // Without the postponing this is one look per interval, 40. Loose: a loaded machine may
  // keep this thread off the CPU past half an interval now and then (and the thread then
  // rightly drives for a round).
  EXPECT_LE(reactor.hand_off().parked_looks() - looks_before, 20u) << "the parked thread woke to look";
  p.put();
  EXPECT_TRUE(wait_for([&] { return log.count() == 1; })) << "nobody took over from the poller";
  lock.lock();
  reactor.remove(p.r);
}

// CompletionChannel::get_event: an application thread sleeps on the reactor and drives it; the
// progress thread, started while it sleeps, stays parked, so the waiter takes the pipe itself
// and is woken once for it.
TEST_F(ReactorTest, BlockingWaiterDrivesTheReactorWhileTheProgressThreadStaysParked) {
  Pipe p, own;
  DispatchLog log;
  // Two threads woken for the same byte: only the one that reads it counts.
  ASSERT_TRUE(reactor.add(p.r, kIn, [&](std::uint32_t) {
    if (p.drain()) log.add();
  }));
  lock.unlock();
  std::thread::id waiter_id;
  bool own_ready = true;
  std::thread waiter([&] {
    waiter_id = std::this_thread::get_id();
    std::unique_lock<std::mutex> waiter_lock(mu);
    own_ready = reactor.wait_as_driver(waiter_lock, own.r, 2000ms);
  });
  ASSERT_TRUE(wait_for([&] { return reactor.sleeping_threads() == 1; }));
  reactor.start_thread();
  ASSERT_TRUE(wait_for([&] { return reactor.hand_off().parked_looks() > 0; }));
  p.put();
  waiter.join();
  EXPECT_FALSE(own_ready);
  ASSERT_EQ(log.count(), 1u);
  EXPECT_EQ(log.on(waiter_id), 1u) << "the parked progress thread took the waiter's event";
  lock.lock();
  reactor.remove(p.r);
}

TEST_F(ReactorTest, WaitAsDriverReturnsAtOnceOnItsOwnFdWithoutARound) {
  Pipe own;
  own.put();
  const auto t0 = Clock::now();
  EXPECT_TRUE(reactor.wait_as_driver(lock, own.r, 2000ms));
  EXPECT_LT(Clock::now() - t0, 1000ms);
  EXPECT_TRUE(lock.owns_lock());
}

TEST_F(ReactorTest, WaitAsDriverEndsAtTheNextTimerAndFiresIt) {
  Pipe own;
  bool fired = false;
  const auto deadline = Clock::now() + 300us;
  reactor.add_timer(deadline, [&] { fired = true; });
  EXPECT_FALSE(reactor.wait_as_driver(lock, own.r, 2000ms));
  EXPECT_TRUE(fired);
  EXPECT_GE(Clock::now(), deadline);
}

// A timer added by another thread while the driver sleeps, earlier than the sleep's end,
// wakes it (as it wakes a progress thread asleep in epoll).
TEST_F(ReactorTest, TimerAddedDuringAWaitAsDriverWakesTheWaiter) {
  Pipe own;
  bool fired = false;
  std::thread adder([&] {
    ASSERT_TRUE(wait_for([&] { return reactor.sleeping_threads() == 1; }));
    const std::lock_guard<std::mutex> guard(mu);
    reactor.add_timer(Clock::now() + 1ms, [&] { fired = true; });
  });
  const auto t0 = Clock::now();
  while (!fired && Clock::now() - t0 < 1500ms) reactor.wait_as_driver(lock, own.r, 2000ms);
  adder.join();
  EXPECT_TRUE(fired);
  EXPECT_LT(Clock::now() - t0, 1500ms) << "the waiter slept through the new timer";
}

TEST_F(ReactorTest, StopThreadEndsAParkedProgressThreadAtOnce) {
  reactor.note_application_progress();
  reactor.start_thread();
  lock.unlock();
  ASSERT_TRUE(wait_for([&] { return reactor.hand_off().parked_looks() > 0; }));
  const auto t0 = Clock::now();
  reactor.stop_thread();
  EXPECT_LT(Clock::now() - t0, 1000ms);
  lock.lock();
}

TEST_F(ReactorTest, EarlierTimerWakesTheSleepingProgressThread) {
  std::condition_variable cv;
  const auto far = reactor.add_timer(Clock::now() + 10s, [] { ADD_FAILURE() << "far timer fired"; });
  reactor.start_thread();
  // Let the thread go to sleep on the 10 s deadline.
  lock.unlock();
  std::this_thread::sleep_for(20ms);
  lock.lock();

  const auto t0 = Clock::now();
  const auto deadline = t0 + 20ms;
  bool fired = false;
  Clock::time_point at{};
  reactor.add_timer(deadline, [&] {
    fired = true;
    at = Clock::now();
    cv.notify_all();
  });
  ASSERT_TRUE(cv.wait_for(lock, 3s, [&] { return fired; }));
  EXPECT_GE(at, deadline);
  EXPECT_LT(at - t0, 500ms);  // loose: without the wake-up it would be 10 s

  reactor.cancel_timer(far);
  lock.unlock();
  reactor.stop_thread();
  lock.lock();
}

// A thread woken by an fd that waits for the mutex computes its next sleep after taking it:
// timers added meanwhile need no wake-up of their own (a burst of connects would otherwise
// write the eventfd once per connect), and still fire on time.
TEST_F(ReactorTest, TimersAddedWhileTheWokenThreadWaitsForTheMutexFireWithoutMoreWakeUps) {
  Pipe pipe;
  bool read = false;
  ASSERT_TRUE(reactor.add(pipe.r, kIn, [&](std::uint32_t) {
    pipe.drain();
    read = true;
  }));
  reactor.start_thread();
  lock.unlock();
  const auto asleep_by = Clock::now() + 2s;
  while (reactor.sleeping_threads() == 0 && Clock::now() < asleep_by) std::this_thread::sleep_for(1ms);
  lock.lock();
  ASSERT_EQ(reactor.sleeping_threads(), 1u);
  pipe.put();  // the thread leaves epoll and blocks on the mutex we hold
  const auto awake_by = Clock::now() + 2s;
  while (reactor.sleeping_threads() != 0 && Clock::now() < awake_by) std::this_thread::sleep_for(1ms);
  ASSERT_EQ(reactor.sleeping_threads(), 0u);

  const std::uint64_t wakes_before = reactor.wake_count();
  std::condition_variable cv;
  const auto t0 = Clock::now();
  const auto deadline = t0 + 20ms;
  int fired = 0;
  Clock::time_point first{};
  for (int i = 0; i < 50; ++i) {
    reactor.add_timer(deadline + std::chrono::microseconds(i), [&] {
      if (fired++ == 0) first = Clock::now();
      cv.notify_all();
    });
  }
  EXPECT_EQ(reactor.wake_count(), wakes_before);
  ASSERT_TRUE(cv.wait_for(lock, 3s, [&] { return fired == 50; }));
  EXPECT_TRUE(read);
  EXPECT_GE(first, deadline);
  EXPECT_LT(first - t0, 500ms);  // loose: a lost wake-up would leave them unfired

  reactor.remove(pipe.r);
  lock.unlock();
  reactor.stop_thread();
  lock.lock();
}

TEST_F(ReactorTest, StopThreadFromItsOwnCallbackThenRestartFromOutside) {
  std::condition_variable cv;
  bool stopped = false;
  reactor.start_thread();
  reactor.add_timer(Clock::now(), [&] {
    reactor.stop_thread();  // on the progress thread: request only
    stopped = true;
    cv.notify_all();
  });
  ASSERT_TRUE(cv.wait_for(lock, 2s, [&] { return stopped; }));

  // Restart joins the finished thread and runs a new one.
  bool ran = false;
  reactor.start_thread();
  reactor.add_timer(Clock::now(), [&] {
    ran = true;
    cv.notify_all();
  });
  ASSERT_TRUE(cv.wait_for(lock, 2s, [&] { return ran; }));
  lock.unlock();
  reactor.stop_thread();
  lock.lock();
}

TEST_F(ReactorTest, StopThenStartFromTheSameCallbackKeepsTheThreadRunning) {
  std::condition_variable cv;
  int rounds = 0;
  bool later_on_thread = false;
  reactor.start_thread();
  reactor.add_timer(Clock::now(), [&] {
    reactor.stop_thread();
    reactor.start_thread();
    ++rounds;
    reactor.add_timer(Clock::now(), [&] {
      later_on_thread = reactor.on_reactor_thread();
      ++rounds;
      cv.notify_all();
    });
  });
  ASSERT_TRUE(cv.wait_for(lock, 2s, [&] { return rounds == 2; }));
  EXPECT_TRUE(later_on_thread);
}

TEST(ReactorLifetime, ThreadStartedAndStoppedWithoutTheOwnerMutex) {
  // The API layer starts the thread in a constructor and stops it in a destructor.
  std::mutex mu;
  Reactor reactor(mu);
  reactor.start_thread();
  std::atomic<bool> ran{false};
  {
    const std::lock_guard<std::mutex> guard(mu);
    reactor.add_timer(Clock::now(), [&] { ran = true; });
  }
  const auto end = Clock::now() + 2s;
  while (!ran && Clock::now() < end) std::this_thread::sleep_for(1ms);
  reactor.stop_thread();
  EXPECT_TRUE(ran);
}

TEST(ReactorLifetime, DestructorStopsARunningProgressThread) {
  std::mutex mu;
  bool ran = false;
  {
    Reactor reactor(mu);
    std::unique_lock<std::mutex> lock(mu);
    std::condition_variable cv;
    reactor.add_timer(Clock::now(), [&] {
      ran = true;
      cv.notify_all();
    });
    reactor.start_thread();
    ASSERT_TRUE(cv.wait_for(lock, 2s, [&] { return ran; }));
    lock.unlock();
  }  // ~Reactor with the thread sleeping and the mutex free
  EXPECT_TRUE(ran);
}

TEST_F(ReactorTest, CountsReturnToZeroAfterRemoveCancelAndFire) {
  std::vector<std::unique_ptr<Pipe>> pipes;
  for (int i = 0; i < 8; ++i) {
    pipes.push_back(std::make_unique<Pipe>());
    ASSERT_TRUE(reactor.add(pipes.back()->r, kIn, [](std::uint32_t) {}));
  }
  std::vector<Reactor::TimerId> ids;
  int fired = 0;
  for (int i = 0; i < 8; ++i) ids.push_back(reactor.add_timer(Clock::now() + 1h, [] {}));
  for (int i = 0; i < 4; ++i) reactor.add_timer(Clock::now() - 1ms, [&] { ++fired; });
  EXPECT_EQ(reactor.registered_fds(), 8u);
  EXPECT_EQ(reactor.pending_timers(), 12u);

  reactor.run_once(lock, 0ms);
  EXPECT_EQ(fired, 4);
  EXPECT_EQ(reactor.pending_timers(), 8u);
  for (auto id : ids) reactor.cancel_timer(id);
  for (auto& p : pipes) reactor.remove(p->r);
  EXPECT_EQ(reactor.registered_fds(), 0u);
  EXPECT_EQ(reactor.pending_timers(), 0u);
}

}  // namespace
}  // namespace peercm::engine
