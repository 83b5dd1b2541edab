// The I/O engine: an epoll reactor with timers and a wake-up eventfd. It owns no protocol
// state; the API layer registers sockets and timers and runs protocol cores in callbacks.
//
// Threading: all methods except wake() and the blocking wait inside run_once() must be
// called with the owner's mutex held (the mutex given to the constructor). run_once()
// releases that mutex only while it sleeps in epoll_wait, so callbacks run with it held.
// Exception: stop_thread() (and the destructor) join the progress thread, which needs the
// mutex to finish its round, so they must be called WITHOUT it, except from a callback on
// the progress thread itself. start_thread() works with or without it.
//
// Callback safety: every registration gets a unique 64-bit id that rides in the epoll
// event, and each event is looked up by that id before dispatch. So remove(fd) or
// cancel_timer() from inside any callback (the one being dispatched, or one later in the
// same batch) means that callback is never invoked again, and a closed fd whose number is
// reused by a new registration never receives the old registration's stale events.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <vector>

#include "peercm/result.hpp"

namespace peercm::engine {

using Clock = std::chrono::steady_clock;

class Reactor {
 public:
  using IoCallback = std::function<void(std::uint32_t epoll_events)>;
  using TimerCallback = std::function<void()>;
  using TimerId = std::uint64_t;

  // Creates the epoll instance and the wake-up eventfd. Throws std::system_error if the
  // kernel refuses either (EMFILE, ENOMEM): the only exception this class raises.
  explicit Reactor(std::mutex& owner_mutex);
  // Stops and joins the progress thread if it still runs, so like stop_thread() it must
  // not be called with the owner mutex held nor on the progress thread.
  ~Reactor();
  Reactor(const Reactor&) = delete;
  Reactor& operator=(const Reactor&) = delete;

  // `epoll_events` is passed to epoll as is (EPOLLIN|EPOLLOUT|EPOLLRDHUP, EPOLLET, ...).
  // Errors: EBADF and the other epoll_ctl errnos; EEXIST if `fd` is registered already;
  // EINVAL for an empty callback. A registration whose fd was closed without remove() is
  // replaced silently when the fd number is added again.
  Status<std::errc> add(int fd, std::uint32_t epoll_events, IoCallback callback);
  // ENOENT if `fd` is not registered.
  Status<std::errc> modify(int fd, std::uint32_t epoll_events);
  // Poller passes (run_once with no wait) call this fd's callback with EPOLLIN themselves,
  // plus EPOLLOUT while its interest includes EPOLLOUT, without asking epoll, while at most
  // kMaxDirectFds fds are marked; every kEpollEvery-th pass still asks epoll for all fds. A
  // busy-polling thread then reads its data with one system call instead of two (epoll,
  // then the read). The callback must take an EPOLLIN that finds nothing to read and an
  // EPOLLOUT that finds no room. No-op for an unknown fd.
  void poll_directly(int fd, bool on);
  static constexpr std::size_t kMaxDirectFds = 2;
  static constexpr unsigned kEpollEvery = 8;
  // Safe to call from inside a callback, also for the fd being dispatched. No-op for an
  // unknown fd. Call it before close(fd).
  void remove(int fd);

  // Fires at the first round whose clock reading is >= deadline (never early); timers with
  // equal deadlines fire in the order they were added. Never returns 0, so 0 can mean
  // "no timer". A timer added from a callback fires in a later round at the earliest.
  TimerId add_timer(Clock::time_point deadline, TimerCallback callback);
  // No-op for an unknown, fired or cancelled id.
  void cancel_timer(TimerId id);

  // One round: wait (mutex released) up to `max_wait` or the next timer, then dispatch
  // ready fds and due timers (mutex held). `lock` must own the owner mutex.
  // A timer ends the wait to the nanosecond (epoll_pwait2); a negative `max_wait` means "poll".
  void run_once(std::unique_lock<std::mutex>& lock, std::chrono::milliseconds max_wait);
  // One round without waiting that asks epoll (never a direct pass only): everything ready
  // now, dispatched. `lock` as for run_once().
  void run_ready(std::unique_lock<std::mutex>& lock);
  // Interrupts a run_once() sleeping in another thread. Thread-safe, no lock needed.
  void wake();

  // Progress thread: runs run_once() in a loop until stop_thread(). No-op if running.
  void start_thread();
  // Sets the stop flag, wakes the thread and joins it: call it WITHOUT the owner mutex
  // (the thread needs it to finish its round). No-op if no thread runs. From a callback on
  // the progress thread itself it only requests the stop: the thread ends after the
  // current round and is joined by the next start_thread(), stop_thread() or destructor.
  void stop_thread();
  // Busy-poll hand-off. An application thread that keeps polling drives the reactor itself
  // (run_once with no wait); while its lease lasts the progress thread parks instead of
  // waking for every event only to race the poller for the mutex and the CPU. The lease
  // ends on its own, or at once when the poller is about to block. Thread-safe.
  void lend_to_poller(Clock::duration lease);
  // A poller's pass starts (owner mutex held) and ends: renew_poller_lease() runs the lease
  // from the reactor's last clock reading instead of a new one. That reading is at most
  // kEpollEvery - 1 direct passes old, and a pass that moves a stream's data (up to 1 MiB, some
  // 250 us) outlasts the lease it gives. So a parked progress thread also stays parked while
  // a pass is under way or one ended since its last look, whatever the lease's clock says.
  void begin_poller_pass();
  void renew_poller_lease(Clock::duration lease);
  // An application thread did work of its own under the owner mutex (posted and transmitted
  // a work request): while a lease is lent, that keeps a parked progress thread away too.
  void note_poller_work();
  // A poller found the owner mutex taken (not held): the progress thread, if that is who
  // holds it, parks after its round instead of keeping the reactor from the poller.
  void note_poller_waiting();
  void end_poller_lease();
  // When the current lease ends (the epoch when none is lent). Thread-safe.
  Clock::time_point poller_lease_end() const {
    return Clock::time_point(Clock::duration(poller_lease_until_.load(std::memory_order_relaxed)));
  }

  // True on the progress thread, and inside run_once() on the thread calling it.
  bool on_reactor_thread() const;

  // The epoll fd: readable when run_once() would find an fd ready. Lets a thread sleep on
  // the reactor and something else of its own in one poll().
  int pollable_fd() const { return epoll_fd_; }
  // The earliest timer deadline, if any (owner mutex held).
  std::optional<Clock::time_point> next_deadline() const;

  std::size_t registered_fds() const;
  std::size_t pending_timers() const;
  // Thread-safe counters, for tests: threads asleep in epoll now, and wake() calls so far.
  unsigned sleeping_threads() const { return sleepers_.load(std::memory_order_relaxed); }
  std::uint64_t wake_count() const { return wakes_.load(std::memory_order_relaxed); }

 private:
  struct Registration {
    int fd;
    std::uint32_t events;
    IoCallback callback;
  };
  // A poller pass that calls the poll_directly() fds' callbacks instead of epoll.
  void run_direct_pass();
  void forget_direct(std::uint64_t id);
  // Calls the registration's callback. One removed meanwhile (its own callback included)
  // is kept alive in retired_ until the outermost dispatch returns: a busy poller's passes
  // then take no reference count per callback.
  void dispatch(Registration& registration, std::uint32_t epoll_events);
  void erase_registration(std::uint64_t id);
  struct Timer {
    TimerId id;
    TimerCallback callback;
  };
  using TimerQueue = std::multimap<Clock::time_point, Timer>;

  void dispatch_timers(Clock::time_point now);
  // `heartbeat`: poller_heartbeat_ when the thread was started.
  void thread_main(std::uint64_t generation, std::uint64_t heartbeat);
  // Whether a poller drives the reactor: it has not ended its lease, and the lease is not over
  // by the clock, a pass is under way, or one started or ended since `heartbeat` (updated).
  bool poller_active(std::uint64_t& heartbeat) const;
  // Progress thread after a park: takes the owner mutex, unless an application thread holds it
  // while its lease lasts (false).
  bool take_owner_after_park(std::unique_lock<std::mutex>& lock);
  // Progress thread, owner mutex NOT held: sleeps while a poller is active, looking again
  // after `interval`, then at doubling intervals (the last one is left in `interval`).
  void park_during_lease(std::uint64_t generation, std::uint64_t& heartbeat, Clock::duration& interval);
  // epoll_wait up to `max_wait` (the mutex released), then the ready fds and due timers.
  void epoll_round(std::unique_lock<std::mutex>& lock, std::chrono::milliseconds max_wait);

  std::mutex& owner_;
  int epoll_fd_ = -1;
  int wake_fd_ = -1;

  // Guarded by owner_. Epoll data carries the registration id; id 0 is the wake eventfd.
  std::uint64_t next_registration_id_ = 1;
  std::unordered_map<std::uint64_t, std::shared_ptr<Registration>> registrations_;
  std::unordered_map<int, std::uint64_t> id_by_fd_;
  // poll_directly() registrations, in registration order. A set, not a vector: every
  // connection is marked while it sets up, and a burst of them must not leave its peak
  // capacity behind.
  std::set<std::uint64_t> direct_ids_;
  unsigned dispatch_depth_ = 0;
  std::vector<std::shared_ptr<Registration>> retired_;
  unsigned poller_passes_ = 0;
  // The latest Clock::now() a round took (guarded by owner_): renew_poller_lease() uses it.
  Clock::time_point clock_seen_{};

  // Guarded by owner_. Ordered by deadline (ties: insertion order); index for cancel.
  TimerId next_timer_id_ = 1;
  TimerQueue timers_;
  std::unordered_map<TimerId, TimerQueue::iterator> timer_index_;
  std::vector<TimerId> due_scratch_;

  // How many run_once() calls sleep in epoll_wait (raised under owner_ before the wait,
  // lowered as soon as it returns), and until when (guarded by owner_).
  std::atomic<unsigned> sleepers_{0};
  Clock::time_point sleep_deadline_{};
  std::atomic<std::uint64_t> wakes_{0};

  // Progress thread. thread_ and thread_generation_ are guarded by thread_mutex_ (never
  // held while joining); the thread runs while run_generation_ equals its generation, so a
  // stopped thread that has not been joined yet cannot be revived by a later start.
  std::mutex thread_mutex_;
  std::thread thread_;
  std::uint64_t thread_generation_ = 0;
  std::atomic<std::uint64_t> run_generation_{0};

  // End of the current poller lease (Clock ticks since its epoch; 0: none). The park
  // mutex only pairs the progress thread's sleep with end_poller_lease() and stop_thread().
  std::atomic<Clock::rep> poller_lease_until_{0};
  // Poller passes: odd while one is under way, moved by every start and end (written under
  // owner_, read by the parked thread), and by a poller that found owner_ taken (a relaxed
  // add outside owner_: a store under owner_ may overwrite it, which only loses one signal).
  std::atomic<std::uint64_t> poller_heartbeat_{0};
  // A parked progress thread checks the lease after kFirstParkCheck, then at doubling
  // intervals up to kLastParkCheck: the longest it stays away after a poller stops polling
  // without blocking (end_poller_lease() wakes it at once).
  static constexpr Clock::duration kFirstParkCheck = std::chrono::microseconds(200);
  static constexpr Clock::duration kLastParkCheck = std::chrono::microseconds(1600);
  std::mutex park_mutex_;
  std::condition_variable park_cv_;
};

}  // namespace peercm::engine
