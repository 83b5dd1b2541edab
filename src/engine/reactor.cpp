// epoll reactor: registrations keyed by a never-reused 64-bit id carried in epoll_event
// data, a deadline-ordered timer queue, an eventfd for cross-thread wake-ups and an
// optional progress thread. See reactor.hpp for the threading contract.
#include "engine/reactor.hpp"

#include <sys/epoll.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cassert>
#include <cerrno>
#include <climits>
#include <utility>

namespace peercm::engine {
namespace {

class SteadyTime final : public TimeSource {
 public:
  Clock::time_point now() const override { return Clock::now(); }
};

// Epoll data of the wake eventfd; registration ids start at 1.
constexpr std::uint64_t kWakeId = 0;
// Events taken per epoll_wait; more stay pending (level-triggered) or queued (edge).
constexpr int kMaxEvents = 64;
// The progress thread sleeps until an fd, a timer or wake() needs it.
constexpr std::chrono::milliseconds kForever = std::chrono::milliseconds::max();

// The reactor whose run_once() (or progress thread) is running on this thread. Set and
// restored on every pass: initial-exec spares a busy poller two __tls_get_addr calls a pass.
[[gnu::tls_model("initial-exec")]] thread_local const Reactor* t_current_reactor = nullptr;

class CurrentReactorScope {
 public:
  explicit CurrentReactorScope(const Reactor* reactor) : saved_(t_current_reactor) {
    t_current_reactor = reactor;
  }
  ~CurrentReactorScope() { t_current_reactor = saved_; }
  CurrentReactorScope(const CurrentReactorScope&) = delete;
  CurrentReactorScope& operator=(const CurrentReactorScope&) = delete;

 private:
  const Reactor* saved_;
};

}  // namespace

const TimeSource& steady_time() {
  // Never destroyed: a context that lives as long as the process (the C API's devices) keeps
  // its progress thread reading the clock while static objects are destroyed at exit.
  static const TimeSource* const time = new SteadyTime();
  return *time;
}

namespace {

std::errc last_errc() { return static_cast<std::errc>(errno); }

[[noreturn]] void throw_errno(int error, const char* what) {
  throw std::system_error(error, std::system_category(), what);
}

// How long to wait: `max_wait` capped by `deadline` (if any). A timer of an RC transport
// (an ACK held for a reply, tens of microseconds) needs better than epoll_wait's ms.
std::chrono::nanoseconds wait_timeout(Clock::time_point now, std::chrono::milliseconds max_wait,
                                      const Clock::time_point* deadline) {
  std::chrono::nanoseconds wait = std::chrono::milliseconds(std::clamp<std::int64_t>(max_wait.count(), 0, INT_MAX));
  if (deadline != nullptr) {
    if (*deadline <= now) return std::chrono::nanoseconds::zero();
    wait = std::min(wait, std::chrono::duration_cast<std::chrono::nanoseconds>(*deadline - now));
  }
  return wait;
}

timespec to_timespec(std::chrono::nanoseconds duration) {
  const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(duration);
  return {.tv_sec = static_cast<time_t>(seconds.count()), .tv_nsec = static_cast<long>((duration - seconds).count())};
}

// epoll_pwait2 (Linux 5.11) sleeps to the nanosecond; where it fails, epoll_wait's milliseconds,
// rounded UP so that a timer is never found not-yet-due because the wait ended too soon.
int wait_for_events(int epoll_fd, epoll_event* events, int max_events, std::chrono::nanoseconds timeout) {
  static std::atomic<bool> has_pwait2{true};
  if (has_pwait2.load(std::memory_order_relaxed)) {
    const timespec ts = to_timespec(timeout);
    const int ready = ::epoll_pwait2(epoll_fd, events, max_events, &ts, nullptr);
    if (ready >= 0 || errno == EINTR) return ready;
    // ENOSYS (kernel < 5.11), or EPERM from a seccomp filter that does not know the call.
    has_pwait2.store(false, std::memory_order_relaxed);
  }
  const auto ms = std::chrono::ceil<std::chrono::milliseconds>(timeout);
  return ::epoll_wait(epoll_fd, events, max_events, static_cast<int>(std::min<std::int64_t>(ms.count(), INT_MAX)));
}

}  // namespace

Reactor::Reactor(std::mutex& owner_mutex, const TimeSource& time) : owner_(owner_mutex), time_(time) {
  epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
  if (epoll_fd_ < 0) throw_errno(errno, "epoll_create1");
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) {
    const int error = errno;
    ::close(epoll_fd_);
    throw_errno(error, "eventfd");
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kWakeId;
  if (::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &ev) != 0) {
    const int error = errno;
    ::close(wake_fd_);
    ::close(epoll_fd_);
    throw_errno(error, "epoll_ctl(eventfd)");
  }
  look_timer_fd_ = ::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  park_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (look_timer_fd_ < 0 || park_fd_ < 0) {
    const int error = errno;
    if (look_timer_fd_ >= 0) ::close(look_timer_fd_);
    ::close(wake_fd_);
    ::close(epoll_fd_);
    throw_errno(error, look_timer_fd_ < 0 ? "timerfd_create" : "eventfd");
  }
}

Reactor::~Reactor() {
  std::thread thread;
  {
    const std::lock_guard<std::mutex> guard(thread_mutex_);
    run_generation_.fetch_add(1);
    thread = std::move(thread_);
  }
  if (thread.joinable()) {
    wake();
    wake_parked_thread();
    assert(thread.get_id() != std::this_thread::get_id() && "~Reactor on its own thread");
    if (thread.get_id() == std::this_thread::get_id()) {
      thread.detach();
    } else {
      thread.join();
    }
  }
  ::close(park_fd_);
  ::close(look_timer_fd_);
  ::close(wake_fd_);
  ::close(epoll_fd_);
}

Status<std::errc> Reactor::add(int fd, std::uint32_t epoll_events, IoCallback callback) {
  if (!callback) return fail(std::errc::invalid_argument);
  if (fd < 0) return fail(std::errc::bad_file_descriptor);
  const std::uint64_t id = next_registration_id_;
  epoll_event ev{};
  ev.events = epoll_events;
  ev.data.u64 = id;
  if (::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) return fail(last_errc());
  ++next_registration_id_;
  if (const auto old = id_by_fd_.find(fd); old != id_by_fd_.end()) {
    // The kernel accepted the fd, so the registration we still hold for this number is
    // stale: its fd was closed without remove(). Its queued events die with its id.
    erase_registration(old->second);
    id_by_fd_.erase(old);
  }
  registrations_.emplace(id, std::make_shared<Registration>(
                                 Registration{fd, epoll_events, std::move(callback)}));
  id_by_fd_.emplace(fd, id);
  return {};
}

Status<std::errc> Reactor::modify(int fd, std::uint32_t epoll_events) {
  const auto it = id_by_fd_.find(fd);
  if (it == id_by_fd_.end()) return fail(std::errc::no_such_file_or_directory);
  epoll_event ev{};
  ev.events = epoll_events;
  ev.data.u64 = it->second;
  if (::epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, fd, &ev) != 0) return fail(last_errc());
  const auto registration = registrations_.find(it->second);
  assert(registration != registrations_.end());
  registration->second->events = epoll_events;
  return {};
}

void Reactor::remove(int fd) {
  const auto it = id_by_fd_.find(fd);
  if (it == id_by_fd_.end()) return;
  // Fails with EBADF/ENOENT if the fd was closed already; the id lookup below is what
  // guarantees no further dispatch, so the result does not matter.
  (void)::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
  erase_registration(it->second);
  id_by_fd_.erase(it);
}

void Reactor::erase_registration(std::uint64_t id) {
  forget_direct(id);
  const auto it = registrations_.find(id);
  if (it == registrations_.end()) return;
  if (dispatch_depth_ > 0) retired_.push_back(std::move(it->second));  // may be running now
  registrations_.erase(it);
}

void Reactor::dispatch(Registration& registration, std::uint32_t epoll_events) {
  // A guard, so that a callback that throws does not leave the depth raised for good.
  struct Depth {
    Reactor& reactor;
    explicit Depth(Reactor& r) : reactor(r) { ++reactor.dispatch_depth_; }
    ~Depth() {
      // Released, not cleared: a listener's callback may close hundreds of connections in
      // one dispatch, and the list must not keep what it grew to.
      if (--reactor.dispatch_depth_ == 0 && !reactor.retired_.empty()) {
        std::vector<std::shared_ptr<Registration>>().swap(reactor.retired_);
      }
    }
    Depth(const Depth&) = delete;
    Depth& operator=(const Depth&) = delete;
  } depth(*this);
  registration.callback(epoll_events);
}

void Reactor::poll_directly(int fd, bool on) {
  const auto it = id_by_fd_.find(fd);
  if (it == id_by_fd_.end()) return;
  forget_direct(it->second);
  if (on) direct_ids_.insert(it->second);
}

void Reactor::forget_direct(std::uint64_t id) { direct_ids_.erase(id); }

void Reactor::run_direct_pass() {
  // Callbacks may remove registrations (their own included): take the ids first.
  std::array<std::uint64_t, kMaxDirectFds> ids{};
  const std::size_t count = std::min(direct_ids_.size(), ids.size());
  std::copy_n(direct_ids_.begin(), count, ids.begin());
  for (std::size_t i = 0; i < count; ++i) {
    const auto it = registrations_.find(ids[i]);
    if (it == registrations_.end()) continue;  // removed by an earlier callback
    Registration& registration = *it->second;
    // A sender waiting for room (EPOLLOUT in its interest) tries again too: a responder
    // streaming Read Responses would otherwise send only on every kEpollEvery-th pass.
    dispatch(registration, EPOLLIN | (registration.events & EPOLLOUT));
  }
}

Reactor::TimerId Reactor::add_timer(Clock::time_point deadline, TimerCallback callback) {
  const TimerId id = next_timer_id_++;
  // multimap inserts at the upper bound of equal keys: equal deadlines fire FIFO.
  const auto it = timers_.emplace(deadline, Timer{id, std::move(callback)});
  timer_index_.emplace(id, it);
  // A run_once() sleeping past this deadline must recompute its timeout. We hold the owner
  // mutex: no thread can start sleeping meanwhile, and one that stopped (sleepers_ lowered)
  // recomputes its timeout under the mutex, after this timer is in.
  if (sleepers_.load(std::memory_order_relaxed) > 0 && deadline < sleep_deadline_) wake();
  return id;
}

void Reactor::cancel_timer(TimerId id) {
  const auto it = timer_index_.find(id);
  if (it == timer_index_.end()) return;
  timers_.erase(it->second);
  timer_index_.erase(it);
}

void Reactor::run_once(std::unique_lock<std::mutex>& lock, std::chrono::milliseconds max_wait) {
  assert(lock.owns_lock() && lock.mutex() == &owner_);
  const CurrentReactorScope scope(this);

  if (max_wait.count() <= 0 && !direct_ids_.empty() && direct_ids_.size() <= kMaxDirectFds &&
      ++poller_passes_ % kEpollEvery != 0) {
    run_direct_pass();
    // A busy poller makes millions of these passes: no clock read (50 ns on a guest) when
    // no timer can be due.
    if (!timers_.empty()) dispatch_timers(time_.now());
    return;
  }
  epoll_round(lock, max_wait);
}

void Reactor::run_ready(std::unique_lock<std::mutex>& lock) {
  assert(lock.owns_lock() && lock.mutex() == &owner_);
  const CurrentReactorScope scope(this);
  epoll_round(lock, std::chrono::milliseconds(0));
}

std::chrono::nanoseconds Reactor::begin_sleep(std::chrono::milliseconds max_wait) {
  const Clock::time_point before = time_.now();
  const std::chrono::nanoseconds timeout =
      wait_timeout(before, max_wait, timers_.empty() ? nullptr : &timers_.begin()->first);
  const Clock::time_point my_deadline = before + std::chrono::duration_cast<Clock::duration>(timeout);
  const bool first_sleeper = sleepers_.load(std::memory_order_relaxed) == 0;
  sleep_deadline_ = first_sleeper ? my_deadline : std::max(sleep_deadline_, my_deadline);
  sleepers_.fetch_add(1, std::memory_order_relaxed);
  return timeout;
}

void Reactor::epoll_round(std::unique_lock<std::mutex>& lock, std::chrono::milliseconds max_wait) {
  const std::chrono::nanoseconds timeout = begin_sleep(max_wait);
  std::array<epoll_event, kMaxEvents> events;
  lock.unlock();
  int ready = wait_for_events(epoll_fd_, events.data(), kMaxEvents, timeout);
  // Awake from here on: whatever is added while this thread waits for the mutex, it sees
  // when it computes its next timeout, so add_timer() need not wake it again (it would, for
  // every timer added by a thread holding the mutex meanwhile).
  sleepers_.fetch_sub(1, std::memory_order_relaxed);
  lock.lock();
  if (ready < 0) ready = 0;  // EINTR: just run the due timers and return

  for (int i = 0; i < ready; ++i) {
    const epoll_event& ev = events[static_cast<std::size_t>(i)];
    if (ev.data.u64 == kWakeId) {
      std::uint64_t count = 0;
      if (::read(wake_fd_, &count, sizeof count) < 0) {
        // EAGAIN: a concurrent round drained it first. Either way the counter is reset.
      }
      continue;
    }
    // Removed (possibly by an earlier callback of this batch) or replaced: skip.
    const auto it = registrations_.find(ev.data.u64);
    if (it == registrations_.end()) continue;
    dispatch(*it->second, ev.events);
  }

  dispatch_timers(time_.now());
}

void Reactor::dispatch_timers(Clock::time_point now) {
  // Snapshot the due ids first: a callback may cancel a later one of them (which must then
  // not fire) or add a new due timer (which fires next round, so a timer re-arming itself
  // for "now" cannot starve the fds).
  due_scratch_.clear();
  for (auto it = timers_.begin(); it != timers_.end() && it->first <= now; ++it) {
    due_scratch_.push_back(it->second.id);
  }
  for (std::size_t i = 0; i < due_scratch_.size(); ++i) {
    const auto index = timer_index_.find(due_scratch_[i]);
    if (index == timer_index_.end()) continue;  // cancelled by an earlier callback
    TimerCallback callback = std::move(index->second->second.callback);
    timers_.erase(index->second);
    timer_index_.erase(index);
    if (callback) callback();
  }
}

void Reactor::wake() {
  wakes_.fetch_add(1, std::memory_order_relaxed);
  const std::uint64_t one = 1;
  ssize_t written = 0;
  do {
    written = ::write(wake_fd_, &one, sizeof one);
  } while (written < 0 && errno == EINTR);
  // EAGAIN: the counter is saturated, so the eventfd is readable anyway.
}

void Reactor::start_thread() {
  std::thread finished;
  {
    const std::lock_guard<std::mutex> guard(thread_mutex_);
    if (thread_.joinable()) {
      if (run_generation_.load() == thread_generation_) return;  // running
      if (thread_.get_id() == std::this_thread::get_id()) {
        // stop_thread() then start_thread() from the same callback: keep running.
        run_generation_.store(thread_generation_);
        return;
      }
      // Stopped from its own callback and not joined yet. It needs no lock to finish
      // (it exits straight from its loop), so joining it below cannot deadlock.
      finished = std::move(thread_);
    }
    thread_generation_ = run_generation_.fetch_add(1) + 1;
    thread_ = std::thread(&Reactor::thread_main, this, thread_generation_);
  }
  if (finished.joinable()) finished.join();
}

void Reactor::stop_thread() {
  std::thread thread;
  {
    const std::lock_guard<std::mutex> guard(thread_mutex_);
    if (!thread_.joinable()) return;
    run_generation_.fetch_add(1);
    if (thread_.get_id() == std::this_thread::get_id()) return;  // joined later
    thread = std::move(thread_);
  }
  wake();
  wake_parked_thread();
  // Its final round needs the owner mutex: the caller must not hold it.
  thread.join();
}

void Reactor::thread_main(std::uint64_t generation) {
  const CurrentReactorScope scope(this);
  std::unique_lock<std::mutex> lock(owner_);
  while (run_generation_.load() == generation) {
    ProgressHandOff::Look look = hand_off_.look(time_.now());
    if (look.decision == ProgressHandOff::Decision::park) {
      // Parked without the owner mutex: the looks need none, and taking it only to look would
      // queue this thread behind the driving application thread's passes.
      lock.unlock();
      do {
        park_until(generation, look.look_again);
        if (run_generation_.load() != generation) return;
        look = hand_off_.look(time_.now());
      } while (look.decision == ProgressHandOff::Decision::park);
      lock.lock();
    }
    run_once(lock, kForever);
  }
}

void Reactor::park_until(std::uint64_t generation, Clock::time_point until) {
  arm_look_timer(until, time_.now());
  while (run_generation_.load() == generation && !hand_off_.handed_back_since_look()) {
    std::array<pollfd, 2> fds{pollfd{look_timer_fd_, POLLIN, 0}, pollfd{park_fd_, POLLIN, 0}};
    if (::ppoll(fds.data(), fds.size(), nullptr, nullptr) < 0) continue;  // EINTR
    std::uint64_t count = 0;
    // Drained so that the next park sleeps; EAGAIN when not readable.
    if (::read(park_fd_, &count, sizeof count) < 0) count = 0;
    if ((fds[0].revents & POLLIN) != 0 && ::read(look_timer_fd_, &count, sizeof count) > 0) return;
  }
}

void Reactor::arm_look_timer(Clock::time_point at, Clock::time_point now) {
  // On the steady clock whatever the reactor's clock: a test's virtual time does not pass
  // while the thread sleeps.
  itimerspec spec{};
  // Zero would disarm the timer: a look already due fires after a nanosecond.
  spec.it_value = to_timespec(std::max<std::chrono::nanoseconds>(at - now, std::chrono::nanoseconds(1)));
  ::timerfd_settime(look_timer_fd_, 0, &spec, nullptr);
}

void Reactor::postpone_look() {
  const Clock::time_point now = time_.now();
  if (const std::optional<Clock::time_point> look_again = hand_off_.postpone_look(now)) {
    arm_look_timer(*look_again, now);
  }
}

void Reactor::wake_parked_thread() {
  const std::uint64_t one = 1;
  // EAGAIN: the counter is saturated, so the eventfd is readable anyway.
  while (::write(park_fd_, &one, sizeof one) < 0 && errno == EINTR) {
  }
}

void Reactor::hand_back() {
  hand_off_.hand_back();
  wake_parked_thread();
}

bool Reactor::wait_as_driver(std::unique_lock<std::mutex>& lock, int fd, std::chrono::milliseconds max_wait) {
  assert(lock.owns_lock() && lock.mutex() == &owner_);
  const CurrentReactorScope scope(this);
  // A sleeper like an epoll round's: add_timer() wakes it for an earlier deadline.
  const std::chrono::nanoseconds timeout = begin_sleep(max_wait);
  hand_off_.begin_blocking_wait();
  lock.unlock();
  std::array<pollfd, 2> fds{pollfd{fd, POLLIN, 0}, pollfd{epoll_fd_, POLLIN, 0}};
  const timespec ts = to_timespec(timeout);
  const int ready = ::ppoll(fds.data(), fds.size(), &ts, nullptr);
  sleepers_.fetch_sub(1, std::memory_order_relaxed);
  lock.lock();
  hand_off_.end_blocking_wait();
  const bool fd_ready = ready > 0 && (fds[0].revents & POLLIN) != 0;
  // Woken by `fd` alone (the caller's own event): nothing of the reactor's is due.
  if (!fd_ready || (fds[1].revents & POLLIN) != 0) epoll_round(lock, std::chrono::milliseconds(0));
  return fd_ready;
}

bool Reactor::on_reactor_thread() const { return t_current_reactor == this; }

std::optional<Clock::time_point> Reactor::next_deadline() const {
  if (timers_.empty()) return std::nullopt;
  return timers_.begin()->first;
}

std::size_t Reactor::registered_fds() const { return registrations_.size(); }

std::size_t Reactor::pending_timers() const { return timers_.size(); }

}  // namespace peercm::engine
