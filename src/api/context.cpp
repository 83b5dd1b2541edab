#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <random>
#include <utility>

#include "api/context_impl.hpp"
#include "api/roce/address_share.hpp"
#include "api/roce/roce_device.hpp"
#include "engine/descriptor_table.hpp"

namespace peercm {
namespace detail {

namespace {
std::uint64_t random_u64() {
  std::random_device rd;
  return (std::uint64_t{rd()} << 32) ^ rd();
}
}  // namespace

ContextImpl::ContextImpl(const ContextOptions& options)
    : memory(random_u64()),
      node_guid(options.node_guid ? options.node_guid : random_u64()),
      incarnation(random_u64()),
      mode(options.progress),
      timewait(options.timewait),
      qp_numbers(random_u64()),
      slot_qp_numbers(random_u64()),
      roce_options(options.roce) {
  // Before the progress thread starts: a process still single-threaded grows it for free.
  engine::reserve_descriptor_table(options.reserved_descriptors);
  if (mode == ProgressMode::thread) reactor.start_thread();
}

ContextImpl::~ContextImpl() {
  reactor.stop_thread();
  std::lock_guard lock(mutex);  // the reactor's rule for remove() and cancel_timer()
  for (auto& cm : cms) cm.reset();
  roce.reset();
  if (roce_slot_fd_ >= 0) ::close(roce_slot_fd_);  // frees the slot's name
}

void ContextImpl::want_roce_slot() {
  if (std::exchange(roce_slot_tried_, true)) return;
  if (auto claim = roce::claim_slot()) {
    roce_slot_fd_ = claim->listen_fd;
    roce_slot_.store(claim->slot, std::memory_order_release);
  }
}

std::uint32_t ContextImpl::next_qp_num() {
  if (const int slot = roce_slot(); slot >= 0) {
    for (;;) {
      // Cycle walking: the permutation of 2^18 values, applied again until the value is below
      // 2^17, is a permutation of 2^17 values (about two steps on average).
      std::uint32_t low = slot_qp_numbers.forward(qp_counter++ & roce::kQpnLowMask);
      while (low > roce::kQpnLowMask) low = slot_qp_numbers.forward(low);
      const std::uint32_t qpn = static_cast<std::uint32_t>(slot) << roce::kQpnSlotShift | low;
      if (qpn > 1 && qpn != core::Permutation24::kMask) return qpn;
    }
  }
  for (;;) {
    const std::uint32_t qpn = qp_numbers.forward(qp_counter++ & core::Permutation24::kMask);
    if (qpn > 1 && qpn != core::Permutation24::kMask) return qpn;
  }
}

void ContextImpl::progress(std::chrono::milliseconds max_wait) {
  if (mode != ProgressMode::inline_) return;
  std::unique_lock lock(mutex);
  reactor.run_once(lock, max_wait);
}

void ContextImpl::poll_pass(std::unique_lock<std::mutex>& lock) {
  if (mode == ProgressMode::inline_) {
    lock.lock();
    reactor.run_once(lock, std::chrono::milliseconds(0));
    return;
  }
  if (!lock.try_lock()) {
    // The reactor is taken (by the progress thread, at work, if by anyone): the activity
    // parks that thread after its round.
    reactor.note_application_progress();
    return;
  }
  reactor.note_application_progress_locked();
  reactor.run_once(lock, std::chrono::milliseconds(0));
}

void ContextImpl::wait_as_poller(int fd, std::chrono::milliseconds max_wait) {
  const std::chrono::milliseconds slice = std::min(max_wait, kMaxPollerSlice);
  std::unique_lock lock(mutex, std::try_to_lock);
  if (lock.owns_lock()) {
    reactor.wait_as_driver(lock, fd, slice);
    return;
  }
  // The progress thread is at work: it drives while this thread sleeps on `fd` alone.
  reactor.hand_back();
  pollfd alone{fd, POLLIN, 0};
  ::poll(&alone, 1, static_cast<int>(slice.count()));
}

}  // namespace detail

Result<std::unique_ptr<Context>, std::errc> Context::open(const ContextOptions& options) {
  return std::unique_ptr<Context>(new Context(std::make_shared<detail::ContextImpl>(options)));
}

Context::Context(std::shared_ptr<detail::ContextImpl> impl) : impl_(std::move(impl)) {}
Context::~Context() = default;
std::uint64_t Context::node_guid() const { return impl_->node_guid; }
std::uint64_t Context::incarnation() const { return impl_->incarnation; }
ProgressMode Context::progress_mode() const { return impl_->mode; }
void Context::progress(std::chrono::milliseconds max_wait) { impl_->progress(max_wait); }

}  // namespace peercm
