#include <cerrno>

#include "api/queue_pair_impl.hpp"

namespace peercm {
namespace detail {

QueuePairImpl::QueuePairImpl(std::shared_ptr<ContextImpl> ctx, std::uint32_t pd, const QpInitAttr& attr)
    : context(std::move(ctx)),
      send_cq(attr.send_cq->impl_shared()),
      recv_cq(attr.recv_cq->impl_shared()),
      caps(attr.caps),
      qp_num(context->next_qp_num()),
      engine(core::QpConfig{.qp_num = qp_num, .pd = pd, .caps = attr.caps, .signal_all = attr.sq_sig_all},
             context->memory, *send_cq, *recv_cq) {}

}  // namespace detail

// --- protection domain ---

Result<std::unique_ptr<ProtectionDomain>, std::errc> ProtectionDomain::allocate(Context& context) {
  std::lock_guard lock(context.impl().mutex);
  return std::unique_ptr<ProtectionDomain>(new ProtectionDomain(context, context.impl().next_pd()));
}

ProtectionDomain::~ProtectionDomain() = default;

// --- memory region ---

Result<std::unique_ptr<MemoryRegion>, std::errc> MemoryRegion::register_memory(ProtectionDomain& pd, void* addr,
                                                                                std::size_t length,
                                                                                std::uint32_t access) {
  if (addr == nullptr && length != 0) return fail(std::errc::invalid_argument);
  auto& ctx = pd.context().impl();
  std::lock_guard lock(ctx.mutex);
  auto stag = ctx.memory.register_region(pd.handle(), reinterpret_cast<std::uintptr_t>(addr), length, access);
  if (!stag) return fail(stag.error());
  return std::unique_ptr<MemoryRegion>(new MemoryRegion(pd, addr, length, access, *stag));
}

MemoryRegion::~MemoryRegion() {
  auto& ctx = pd_.context().impl();
  std::lock_guard lock(ctx.mutex);
  [[maybe_unused]] auto ok = ctx.memory.deregister(stag_);
}

Sge MemoryRegion::sge(std::size_t offset, std::size_t length) const {
  return Sge{.addr = reinterpret_cast<std::uintptr_t>(addr_) + offset,
             .length = static_cast<std::uint32_t>(length),
             .lkey = stag_};
}

// --- queue pair ---

QueuePair::QueuePair(std::shared_ptr<detail::QueuePairImpl> impl) : impl_(std::move(impl)) {}

QueuePair::~QueuePair() {
  std::lock_guard lock(impl_->context->mutex);
  impl_->kick_transmit = nullptr;
}

std::uint32_t QueuePair::qp_num() const { return impl_->qp_num; }
const QpCaps& QueuePair::caps() const { return impl_->caps; }

QpState QueuePair::state() const {
  std::lock_guard lock(impl_->context->mutex);
  return impl_->engine.state();
}

Status<std::errc> QueuePair::post_send(const SendWr& wr) {
  std::lock_guard lock(impl_->context->mutex);
  auto posted = impl_->engine.post_send(wr);
  if (posted && impl_->kick_transmit) impl_->kick_transmit();
  return posted;
}

Status<std::errc> QueuePair::post_recv(const RecvWr& wr) {
  std::lock_guard lock(impl_->context->mutex);
  return impl_->engine.post_recv(wr);
}

void QueuePair::to_error() {
  std::lock_guard lock(impl_->context->mutex);
  impl_->engine.disconnect();
  if (impl_->kick_transmit) impl_->kick_transmit();
}

}  // namespace peercm
