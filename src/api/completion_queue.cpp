#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "api/completion_queue_impl.hpp"

namespace peercm {
namespace detail {

CompletionChannelImpl::CompletionChannelImpl() : event_fd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {}
CompletionChannelImpl::~CompletionChannelImpl() {
  if (event_fd >= 0) ::close(event_fd);
}

// As for CM events: the fd is readable exactly while notifications are queued.
void CompletionChannelImpl::notify(CompletionQueue* cq) {
  std::lock_guard lock(mutex);
  ready.push_back(cq);
  const std::uint64_t one = 1;
  [[maybe_unused]] auto n = ::write(event_fd, &one, sizeof one);
}

void CompletionChannelImpl::forget(CompletionQueue* cq) {
  std::lock_guard lock(mutex);
  // Read only when this empties the queue: the counter is then non-zero and the read cannot block.
  if (std::erase(ready, cq) == 0 || !ready.empty()) return;
  std::uint64_t drained;
  [[maybe_unused]] auto n = ::read(event_fd, &drained, sizeof drained);
}

CompletionQueueImpl::CompletionQueueImpl(std::shared_ptr<ContextImpl> ctx, std::uint32_t capacity,
                                         CompletionChannelImpl* chan)
    : context(std::move(ctx)), ring(capacity), channel(chan) {}

bool CompletionQueueImpl::push(const WorkCompletion& completion) {
  const std::size_t n = count.load(std::memory_order_relaxed);
  if (n == ring.size()) {
    overrun.store(true, std::memory_order_relaxed);
    return false;
  }
  // The capacity is the application's choice, not a power of two: wrap without dividing.
  const std::size_t at = head + n;
  ring[at < ring.size() ? at : at - ring.size()] = completion;
  count.store(n + 1, std::memory_order_release);
  if (arm == Arm::next && channel) {
    arm = Arm::none;
    channel->notify(owner);
  }
  return true;
}

void CompletionQueueImpl::discard_qp(std::uint32_t qp_num, std::size_t& removed, std::size_t& successful) {
  const std::size_t n = count.load(std::memory_order_relaxed);
  std::size_t kept = 0;
  auto slot = [&](std::size_t i) -> WorkCompletion& {
    const std::size_t at = head + i;
    return ring[at < ring.size() ? at : at - ring.size()];
  };
  for (std::size_t i = 0; i < n; ++i) {
    if (slot(i).qp_num == qp_num) {
      ++removed;
      if (slot(i).status == WcStatus::success) ++successful;
      continue;
    }
    if (kept != i) slot(kept) = slot(i);
    ++kept;
  }
  count.store(kept, std::memory_order_release);
}

void CompletionQueueImpl::solicited() {
  if (arm == Arm::solicited && channel) {
    arm = Arm::none;
    channel->notify(owner);
  }
}

}  // namespace detail

Result<std::unique_ptr<CompletionChannel>, std::errc> CompletionChannel::create(Context& context) {
  std::unique_ptr<CompletionChannel> channel(new CompletionChannel(context));
  if (channel->impl_->event_fd < 0) return fail(static_cast<std::errc>(errno));
  return channel;
}

CompletionChannel::CompletionChannel(Context& context)
    : context_(context), impl_(std::make_shared<detail::CompletionChannelImpl>()) {}
CompletionChannel::~CompletionChannel() = default;
int CompletionChannel::fd() const { return impl_->event_fd; }

Result<CompletionQueue*, std::errc> CompletionChannel::get_event(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    {
      std::lock_guard lock(impl_->mutex);
      if (!impl_->ready.empty()) {
        CompletionQueue* cq = impl_->ready.front();
        impl_->ready.erase(impl_->ready.begin());
        std::uint64_t drained;
        if (impl_->ready.empty()) [[maybe_unused]] auto n = ::read(impl_->event_fd, &drained, sizeof drained);
        return cq;
      }
    }
    auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (timeout.count() >= 0 && left.count() <= 0) return fail(std::errc::timed_out);
    if (context_.progress_mode() == ProgressMode::inline_) {
      context_.progress(std::chrono::milliseconds(timeout.count() < 0 ? 10 : std::min<long>(left.count(), 10)));
    } else {
      context_.impl().wait_as_poller(impl_->event_fd, timeout.count() < 0 ? detail::ContextImpl::kMaxPollerSlice : left);
    }
  }
}

void CompletionChannel::ack_events(CompletionQueue& cq, unsigned count) {
  std::lock_guard lock(cq.context().impl().mutex);
  cq.impl().acked += count;
}

Result<std::unique_ptr<CompletionQueue>, std::errc> CompletionQueue::create(Context& context, std::uint32_t capacity,
                                                                            CompletionChannel* channel) {
  if (capacity == 0 || capacity > (1u << 22)) return fail(std::errc::invalid_argument);
  auto impl = std::make_shared<detail::CompletionQueueImpl>(context.impl_shared(), capacity,
                                                            channel ? &channel->impl() : nullptr);
  std::unique_ptr<CompletionQueue> cq(new CompletionQueue(context, impl));
  impl->owner = cq.get();
  return cq;
}

CompletionQueue::CompletionQueue(Context& context, std::shared_ptr<detail::CompletionQueueImpl> impl)
    : context_(context), impl_(std::move(impl)) {}
CompletionQueue::~CompletionQueue() {
  std::lock_guard lock(impl_->context->mutex);
  // A notification still queued would hand get_event() a dangling CQ.
  if (impl_->channel) impl_->channel->forget(this);
  impl_->owner = nullptr;
  impl_->channel = nullptr;
}

std::size_t CompletionQueue::poll(std::span<WorkCompletion> out) {
  std::unique_lock lock(impl_->context->mutex, std::defer_lock);
  bool waited = false;
  if (impl_->count.load(std::memory_order_acquire) == 0) {
    impl_->context->poll_pass(lock);
    if (impl_->count.load(std::memory_order_acquire) == 0) return 0;
    waited = true;
  }
  // Taking completions that are there already drives nothing: only the pass above counts as
  // the application's progress.
  if (!lock.owns_lock()) lock.lock();
  auto& q = *impl_;
  const std::size_t n = std::min(out.size(), q.count.load(std::memory_order_relaxed));
  bool write_completed = false;
  for (std::size_t i = 0; i < n; ++i) {
    out[i] = q.ring[q.head];
    write_completed |= out[i].opcode == WcOpcode::rdma_write;
    if (++q.head == q.ring.size()) q.head = 0;
  }
  q.count.store(q.count.load(std::memory_order_relaxed) - n, std::memory_order_release);
  // This poll's own pass ended its wait with an RDMA Write's completion (an ACK over RoCE,
  // the last byte handed to TCP over iWARP): the program's next wait is, as a rule, for the
  // peer's Write, which it watches in memory without calling the library (perftest's
  // ib_write_lat). Its passes parked the progress thread, so that Write would wait for a
  // look; handing back lets the thread place it at once (docs/progress.md, hand-over 7).
  // Unless a Write of the peer's has landed since the program posted its own (over RoCE the
  // answer rides with the ACK the peer held for it): that wait is over before it starts, the
  // program's next call drives, and a hand-back would wake the thread for nothing.
  const bool answered = impl_->context->memory.remote_writes_landed() !=
                        impl_->context->landed_at_last_write_post.load(std::memory_order_relaxed);
  if (waited && write_completed && !answered && impl_->context->mode == ProgressMode::thread) {
    lock.unlock();
    impl_->context->reactor.hand_back();
  }
  return n;
}

Status<std::errc> CompletionQueue::request_notify(bool solicited_only) {
  std::lock_guard lock(impl_->context->mutex);
  if (!impl_->channel) return fail(std::errc::invalid_argument);
  impl_->arm = solicited_only ? detail::CompletionQueueImpl::Arm::solicited : detail::CompletionQueueImpl::Arm::next;
  return {};
}

std::uint32_t CompletionQueue::capacity() const { return static_cast<std::uint32_t>(impl_->ring.size()); }
bool CompletionQueue::overrun() const { return impl_->overrun.load(); }
std::uint64_t CompletionQueue::events_acked() const { return impl_->acked; }

}  // namespace peercm
