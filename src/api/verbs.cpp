#include <cerrno>

#include "api/queue_pair_impl.hpp"
#include "engine/log.hpp"

namespace peercm {
namespace detail {

QueuePairImpl::QueuePairImpl(std::shared_ptr<ContextImpl> ctx, std::uint32_t pd_handle, const QpInitAttr& attr)
    : context(std::move(ctx)),
      send_cq(attr.send_cq->impl_shared()),
      recv_cq(attr.recv_cq->impl_shared()),
      srq(attr.srq ? attr.srq->impl_shared() : nullptr),
      caps(attr.caps),
      pd(pd_handle),
      signal_all(attr.sq_sig_all),
      qp_num(context->next_qp_num()),
      engine(std::make_unique<core::QueuePairEngine>(core::QpConfig{.qp_num = qp_num,
                                                                    .pd = pd_handle,
                                                                    .caps = attr.caps,
                                                                    .signal_all = attr.sq_sig_all,
                                                                    .srq = srq ? &srq->queue : nullptr},
                                                     context->memory, *send_cq, *recv_cq)) {
  if (srq) ++srq->qps;
}

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

// --- shared receive queue ---

Result<std::unique_ptr<SharedReceiveQueue>, std::errc> SharedReceiveQueue::create(ProtectionDomain& pd,
                                                                                  const SrqAttr& attr) {
  if (attr.max_wr == 0) return fail(std::errc::invalid_argument);
  auto impl = std::make_shared<detail::SharedReceiveQueueImpl>();
  impl->context = pd.context().impl_shared();
  impl->pd = pd.handle();
  impl->attr = SrqAttr{.max_wr = attr.max_wr, .max_sge = attr.max_sge, .srq_limit = 0};
  return std::unique_ptr<SharedReceiveQueue>(new SharedReceiveQueue(pd, std::move(impl)));
}

SharedReceiveQueue::SharedReceiveQueue(ProtectionDomain& pd, std::shared_ptr<detail::SharedReceiveQueueImpl> impl)
    : pd_(pd), impl_(std::move(impl)) {}

SharedReceiveQueue::~SharedReceiveQueue() = default;

Status<std::errc> SharedReceiveQueue::destroy(std::unique_ptr<SharedReceiveQueue>& srq) {
  if (!srq) return fail(std::errc::invalid_argument);
  {
    std::lock_guard lock(srq->impl_->context->mutex);
    if (srq->impl_->qps > 0) return fail(std::errc::device_or_resource_busy);
  }
  srq.reset();
  return {};
}

Status<std::errc> SharedReceiveQueue::post_recv(const RecvWr& wr) {
  auto& impl = *impl_;
  std::lock_guard lock(impl.context->mutex);
  if (wr.sg_list.size() > impl.attr.max_sge) return fail(std::errc::invalid_argument);
  if (impl.queue.size() >= impl.attr.max_wr) return fail(std::errc::not_enough_memory);
  // A QP's own receive with a bad SGE ends that QP's stream; an SRQ's WR has no stream yet,
  // so the post itself fails.
  core::PostedRecv posted = core::make_posted_recv(wr, impl.context->memory, impl.pd);
  if (posted.error) return fail(std::errc::invalid_argument);
  impl.queue.push(std::move(posted));
  return {};
}

Status<std::errc> SharedReceiveQueue::modify(std::uint32_t srq_limit) {
  std::lock_guard lock(impl_->context->mutex);
  if (srq_limit > impl_->attr.max_wr) return fail(std::errc::invalid_argument);
  impl_->attr.srq_limit = srq_limit;
  return {};
}

SrqAttr SharedReceiveQueue::query() const {
  std::lock_guard lock(impl_->context->mutex);
  return impl_->attr;
}

std::size_t SharedReceiveQueue::posted() const {
  std::lock_guard lock(impl_->context->mutex);
  return impl_->queue.size();
}

// --- queue pair ---

Result<std::unique_ptr<QueuePair>, std::errc> QueuePair::create(ProtectionDomain& pd, const QpInitAttr& attr) {
  if (!attr.send_cq || !attr.recv_cq) return fail(std::errc::invalid_argument);
  if (attr.srq && &attr.srq->pd().context() != &pd.context()) return fail(std::errc::invalid_argument);
  auto& ctx = pd.context().impl();
  std::lock_guard lock(ctx.mutex);
  auto impl = std::make_shared<detail::QueuePairImpl>(pd.context().impl_shared(), pd.handle(), attr);
  impl->standalone = true;
  ctx.standalone_qps[impl->qp_num] = impl;
  return std::unique_ptr<QueuePair>(new QueuePair(std::move(impl)));
}

QueuePair::QueuePair(std::shared_ptr<detail::QueuePairImpl> impl) : impl_(std::move(impl)) {}

QueuePair::~QueuePair() {
  std::lock_guard lock(impl_->context->mutex);
  impl_->kick_transmit = nullptr;
  if (impl_->standalone) impl_->context->standalone_qps.erase(impl_->qp_num);
  if (impl_->srq) {
    // A connection may still carry the engine: it must not take the SRQ's WRs any more.
    if (impl_->engine) impl_->engine->detach_srq();
    if (impl_->roce) impl_->roce->rc.detach_srq();
    if (impl_->roce_uc) impl_->roce_uc->uc.detach_srq();
    --impl_->srq->qps;
    impl_->srq.reset();
  }
  // A destroyed QP leaves nothing in its CQs, as on hardware, whose providers clean the QP's
  // entries out of the CQ rings as they destroy it (mlx5, mlx4, irdma). libfabric's verbs
  // provider is written for that: it destroys the QP, polls the CQ once and reports every WR
  // still outstanding as flushed itself; a completion left behind would reach ofi_rxm after
  // it freed the endpoint (docs/drop-in-middleware.md, "libfabric's verbs provider").
  std::size_t removed = 0, successful = 0;
  impl_->send_cq->discard_qp(impl_->qp_num, removed, successful);
  if (impl_->recv_cq != impl_->send_cq) impl_->recv_cq->discard_qp(impl_->qp_num, removed, successful);
  if (removed > 0 && log::enabled(log::Level::debug))
    PEERCM_LOG(debug, "qp", "QP {} destroyed: {} unpolled completions removed from its CQs, {} of them successful",
               impl_->qp_num, removed, successful);
}

std::uint32_t QueuePair::qp_num() const { return impl_->qp_num; }
const QpCaps& QueuePair::caps() const { return impl_->caps; }

QpState QueuePair::state() const {
  std::lock_guard lock(impl_->context->mutex);
  if (impl_->roce) return impl_->roce->rc.state();
  if (impl_->roce_ud) return impl_->roce_ud->ud.state();
  if (impl_->roce_uc) return impl_->roce_uc->uc.state();
  return impl_->engine->state();
}

Status<std::errc> QueuePair::post_send(const SendWr& wr) {
  std::lock_guard lock(impl_->context->mutex);
  if (wr.opcode == WrOpcode::rdma_write || wr.opcode == WrOpcode::rdma_write_with_imm)
    impl_->context->landed_at_last_write_post.store(impl_->context->memory.remote_writes_landed(),
                                                    std::memory_order_relaxed);
  if (impl_->send_direct && impl_->send_direct(wr)) return {};
  if (impl_->roce_ud) return fail(std::errc::invalid_argument);  // a UD send names its address: roce::post_ud_send
  if (impl_->roce_uc) {
    auto posted = impl_->roce_uc->uc.post_send(wr);
    if (posted && impl_->kick_transmit) impl_->kick_transmit();
    return posted;
  }
  auto posted = impl_->roce ? impl_->roce->rc.post_send(wr) : impl_->engine->post_send(wr);
  if (posted && impl_->kick_transmit) impl_->kick_transmit();
  if (posted && log::enabled(log::Level::debug) && !impl_->roce && impl_->engine->transmit_fenced())
    PEERCM_LOG(debug, "qp", "QP {}: send WR {} held until the initiator's first FPDU arrives", impl_->qp_num, wr.wr_id);
  return posted;
}

Status<std::errc> QueuePair::post_recv(const RecvWr& wr) {
  std::lock_guard lock(impl_->context->mutex);
  if (impl_->roce) {
    auto posted = impl_->roce->rc.post_recv(wr);
    // A receive may end an RNR wait or complete at once in ERROR.
    if (posted && impl_->kick_transmit) impl_->kick_transmit();
    return posted;
  }
  if (impl_->roce_ud) return impl_->roce_ud->ud.post_recv(wr);
  if (impl_->roce_uc) return impl_->roce_uc->uc.post_recv(wr);
  return impl_->engine->post_recv(wr);
}

void QueuePair::to_error() {
  std::lock_guard lock(impl_->context->mutex);
  if (impl_->roce) {
    impl_->roce->rc.modify_to_error();
  } else if (impl_->roce_ud) {
    impl_->roce_ud->ud.modify_to_error();
  } else if (impl_->roce_uc) {
    impl_->roce_uc->uc.modify_to_error();
  } else {
    impl_->engine->disconnect();
  }
  if (impl_->kick_transmit) impl_->kick_transmit();
}

}  // namespace peercm
