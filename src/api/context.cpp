#include <random>

#include "api/context_impl.hpp"

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
      p2p(std::make_unique<P2pDriver>(*this)) {
  if (mode == ProgressMode::thread) reactor.start_thread();
}

ContextImpl::~ContextImpl() { reactor.stop_thread(); }

void ContextImpl::progress(std::chrono::milliseconds max_wait) {
  if (mode != ProgressMode::inline_) return;
  std::unique_lock lock(mutex);
  reactor.run_once(lock, max_wait);
}

void ContextImpl::try_progress() {
  std::unique_lock lock(mutex, std::try_to_lock);
  if (!lock.owns_lock()) return;  // the progress thread is at work: nothing to gain
  reactor.run_once(lock, std::chrono::milliseconds(0));
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
