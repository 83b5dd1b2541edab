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

#include "engine/progress_hand_off.hpp"
#include "peercm/result.hpp"

namespace peercm::engine {

// Where the reactor reads the time: the steady clock, or a test's virtual clock.
class TimeSource {
 public:
  virtual ~TimeSource() = default;
  virtual Clock::time_point now() const = 0;
};
const TimeSource& steady_time();

class Reactor {
 public:
  using IoCallback = std::function<void(std::uint32_t epoll_events)>;
  using TimerCallback = std::function<void()>;
  using TimerId = std::uint64_t;

  // Creates the epoll instance and the wake-up eventfd. Throws std::system_error if the
  // kernel refuses either (EMFILE, ENOMEM): the only exception this class raises.
  // `time`: the clock of every timer and wait (a test's virtual clock; the steady clock by
  // default). It must outlive the reactor. The progress thread parks on the steady clock, so
  // tests with a virtual clock drive the reactor themselves.
  explicit Reactor(std::mutex& owner_mutex, const TimeSource& time = steady_time());
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
  // Who drives the reactor in thread mode (docs/progress.md, "Who drives progress"): an
  // application thread that polls or waits in the library drives it itself, and the progress
  // thread stays parked while one does. Thread-safe, no lock needed.
  //
  // An application thread drove a pass, found the reactor taken, or did a poller's work.
  void note_application_progress() { hand_off_.note_application_progress(); }
  // The same, with the owner mutex held. Now and then it also pushes the parked thread's next
  // look back (ProgressHandOff::postpone_look), so that the thread sleeps while it polls.
  void note_application_progress_locked() {
    if (hand_off_.note_application_progress_locked()) postpone_look();
  }
  // The application stops driving and sleeps where the reactor cannot see it: the progress
  // thread takes over at once.
  void hand_back();
  // An application thread sleeps as the reactor's driver: on `fd` and on the reactor's fds at
  // once, up to `max_wait` or the next timer (to the nanosecond), the owner mutex released
  // meanwhile. The progress thread stays parked throughout. Then, unless `fd` alone ended the
  // sleep, one round that asks epoll without waiting. `lock` owns the owner mutex on entry and
  // on return. Returns whether `fd` is readable.
  bool wait_as_driver(std::unique_lock<std::mutex>& lock, int fd, std::chrono::milliseconds max_wait);
  const ProgressHandOff& hand_off() const { return hand_off_; }
  // The reactor's clock: every deadline it keeps is on it.
  Clock::time_point now() const { return time_.now(); }

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
  void thread_main(std::uint64_t generation);
  // Progress thread, owner mutex NOT held: sleeps until `until` (or later, when a poller
  // postpones the look), a hand_back() or a stop.
  void park_until(std::uint64_t generation, Clock::time_point until);
  // Moves the parked thread's timer to the look time postpone_look() gives, if it gives one.
  void postpone_look();
  // Sets the look timer to `at` on the reactor's clock, which reads `now`.
  void arm_look_timer(Clock::time_point at, Clock::time_point now);
  void wake_parked_thread();
  // Computes how long a sleep of up to `max_wait` may last (the next timer cuts it) and counts
  // the caller as a sleeper until then, so that add_timer() wakes it for an earlier deadline.
  // The caller lowers sleepers_ as soon as it wakes. Owner mutex held.
  std::chrono::nanoseconds begin_sleep(std::chrono::milliseconds max_wait);
  // epoll_wait up to `max_wait` (the mutex released), then the ready fds and due timers.
  void epoll_round(std::unique_lock<std::mutex>& lock, std::chrono::milliseconds max_wait);

  std::mutex& owner_;
  const TimeSource& time_;
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

  ProgressHandOff hand_off_;
  // The parked progress thread sleeps on both: a timerfd, its next look, which a poller moves
  // later with one system call and no wake-up, and an eventfd that hand_back() and
  // stop_thread() write.
  int look_timer_fd_ = -1;
  int park_fd_ = -1;
};

}  // namespace peercm::engine
