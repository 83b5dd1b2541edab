#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "api/context_impl.hpp"
#include "api/event_channel_impl.hpp"

namespace peercm {
namespace detail {

EventChannelImpl::EventChannelImpl() : event_fd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {}
EventChannelImpl::~EventChannelImpl() {
  if (event_fd >= 0) ::close(event_fd);
}

// The fd is readable exactly while the queue holds events: it is written and drained under
// the queue's lock, so an application that polls it never blocks in get_event() after a
// wake-up (rdma_cm programs poll the fd, then fetch one event).
void EventChannelImpl::push(CmEvent event) {
  std::lock_guard lock(mutex);
  events.push_back(std::move(event));
  if (events.size() > 1) return;  // already readable: drain_if_empty() has not read it since
  const std::uint64_t one = 1;
  [[maybe_unused]] auto n = ::write(event_fd, &one, sizeof one);
}

// Called when the queue may just have become empty: the counter is then non-zero, so the
// read never blocks, even on an fd the application made blocking.
void EventChannelImpl::drain_if_empty() {
  if (!events.empty()) return;
  std::uint64_t drained;
  [[maybe_unused]] auto n = ::read(event_fd, &drained, sizeof drained);
}

namespace {
// An event is about an id when the id is its subject or, for a CONNECT_REQUEST, its listener.
bool is_about(const CmEvent& event, const CmId* id) { return event.id == id || event.listen_id == id; }
}  // namespace

std::vector<CmEvent> EventChannelImpl::purge(CmId* id) {
  std::vector<CmEvent> removed;
  std::lock_guard lock(mutex);
  if (events.empty()) return removed;
  for (auto it = events.begin(); it != events.end();) {
    if (is_about(*it, id)) {
      removed.push_back(std::move(*it));
      it = events.erase(it);
    } else {
      ++it;
    }
  }
  drain_if_empty();
  return removed;
}

bool EventChannelImpl::holds_events_for(const CmId* id) {
  std::lock_guard lock(mutex);
  return std::any_of(events.begin(), events.end(), [id](const CmEvent& event) { return is_about(event, id); });
}

std::optional<CmEvent> EventChannelImpl::retract_request(CmId* id) {
  std::lock_guard lock(mutex);
  for (auto it = events.begin(); it != events.end(); ++it) {
    if (it->type == CmEventType::connect_request && it->id == id) {
      CmEvent event = std::move(*it);
      events.erase(it);
      drain_if_empty();
      return event;
    }
  }
  return std::nullopt;
}

void EventChannelImpl::attach(const std::shared_ptr<ContextImpl>& context) {
  if (context->mode != ProgressMode::inline_) return;
  std::lock_guard lock(mutex);
  for (auto& weak : inline_contexts)
    if (weak.lock() == context) return;
  inline_contexts.push_back(context);
}

}  // namespace detail

Result<std::unique_ptr<EventChannel>, std::errc> EventChannel::create() {
  std::unique_ptr<EventChannel> channel(new EventChannel());
  if (channel->impl_->event_fd < 0) return fail(static_cast<std::errc>(errno));
  return channel;
}

EventChannel::EventChannel() : impl_(std::make_shared<detail::EventChannelImpl>()) {}
EventChannel::~EventChannel() = default;
int EventChannel::fd() const { return impl_->event_fd; }

Result<CmEvent, std::errc> EventChannel::get_event(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    std::vector<std::shared_ptr<detail::ContextImpl>> inline_contexts;
    {
      std::lock_guard lock(impl_->mutex);
      if (!impl_->events.empty()) {
        CmEvent event = std::move(impl_->events.front());
        impl_->events.pop_front();
        impl_->drain_if_empty();
        return event;
      }
      for (auto& weak : impl_->inline_contexts)
        if (auto ctx = weak.lock()) inline_contexts.push_back(std::move(ctx));
    }
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (timeout.count() >= 0 && left.count() <= 0) return fail(std::errc::timed_out);
    const long slice = timeout.count() < 0 ? 10 : std::clamp<long>(left.count(), 0, 10);
    if (!inline_contexts.empty()) {
      for (auto& ctx : inline_contexts) ctx->progress(std::chrono::milliseconds(slice / static_cast<long>(inline_contexts.size())));
    } else {
      pollfd pfd{impl_->event_fd, POLLIN, 0};
      ::poll(&pfd, 1, timeout.count() < 0 ? -1 : static_cast<int>(left.count()));
    }
  }
}

void EventChannel::ack_event(CmEvent&& event) { [[maybe_unused]] CmEvent released = std::move(event); }

}  // namespace peercm
