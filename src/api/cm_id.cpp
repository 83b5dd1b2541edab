// CmId: rdma_cm's life cycle and its checks, the same on every transport. Each call that needs
// the transport goes to the id's TransportCm (api/transport_cm.hpp): api/iwarp_cm.* or
// api/roce/roce_cm.*.
#include <arpa/inet.h>
#include <sys/socket.h>

#include <atomic>
#include <cerrno>

#include "api/cm_id_impl.hpp"
#include "engine/log.hpp"

namespace peercm {
namespace {

std::atomic<bool> g_default_peer_to_peer{true};

}  // namespace

void set_default_peer_to_peer(bool on) { g_default_peer_to_peer.store(on); }
bool default_peer_to_peer() { return g_default_peer_to_peer.load(); }

std::string_view to_string(Transport transport) {
  switch (transport) {
    case Transport::iwarp: return "iwarp";
    case Transport::roce: return "roce";
  }
  return "unknown";
}

std::string_view to_string(CmEventType type) {
  switch (type) {
    case CmEventType::addr_resolved: return "ADDR_RESOLVED";
    case CmEventType::addr_error: return "ADDR_ERROR";
    case CmEventType::route_resolved: return "ROUTE_RESOLVED";
    case CmEventType::route_error: return "ROUTE_ERROR";
    case CmEventType::connect_request: return "CONNECT_REQUEST";
    case CmEventType::connect_response: return "CONNECT_RESPONSE";
    case CmEventType::established: return "ESTABLISHED";
    case CmEventType::rejected: return "REJECTED";
    case CmEventType::unreachable: return "UNREACHABLE";
    case CmEventType::connect_error: return "CONNECT_ERROR";
    case CmEventType::disconnected: return "DISCONNECTED";
    case CmEventType::timewait_exit: return "TIMEWAIT_EXIT";
  }
  return "UNKNOWN";
}

std::string_view to_string(RejectReason reason) {
  switch (reason) {
    case RejectReason::none: return "none";
    case RejectReason::application: return "application";
    case RejectReason::refused: return "refused";
    case RejectReason::collision: return "p2p collision";
    case RejectReason::duplicate: return "duplicate";
    case RejectReason::timeout: return "timeout";
    case RejectReason::markers: return "markers";
    case RejectReason::invalid: return "invalid";
  }
  return "unknown";
}

namespace detail {

CmIdImpl::CmIdImpl(std::shared_ptr<ContextImpl> context, std::shared_ptr<EventChannelImpl> chan, void* user,
                   TransportCm& transport_cm, std::unique_ptr<TransportIdState> transport_id_state)
    : ctx(std::move(context)),
      channel(std::move(chan)),
      user_context(user),
      number(ctx->next_cmid()),
      peer_to_peer(default_peer_to_peer()),
      cm(&transport_cm),
      transport_state(std::move(transport_id_state)) {}

CmIdImpl::~CmIdImpl() = default;

void CmIdImpl::emit(CmEventType type, int status, ConnParam param, RejectReason reason) {
  if (!owner) return;
  PEERCM_LOG(info, "cm", "id {} ({}): {} status {}{}", number, to_string(cm->transport()), to_string(type), status,
            type == CmEventType::rejected ? fmt::format(" reason {}", to_string(reason)) : std::string());
  CmEvent event;
  event.type = type;
  event.id = owner;
  event.status = status;
  event.param = std::move(param);
  event.reject_reason = reason;
  channel->push(std::move(event));
}

void CmIdImpl::emit_disconnected() {
  if (disconnected_emitted) return;
  disconnected_emitted = true;
  state = State::disconnected;
  emit(CmEventType::disconnected);
}

std::unique_ptr<CmId> CmIdImpl::make_public(const std::shared_ptr<CmIdImpl>& impl) {
  std::unique_ptr<CmId> id(new CmId(impl));
  impl->owner = id.get();
  return id;
}

void CmIdImpl::push_connect_request(const std::shared_ptr<CmIdImpl>& child, ConnParam param, std::string_view what) {
  std::unique_ptr<CmId> id = make_public(child);
  CmEvent out;
  out.type = CmEventType::connect_request;
  out.id = id.get();
  out.listen_id = owner;
  out.param = std::move(param);
  out.new_id = std::move(id);
  PEERCM_LOG(info, "cm", "id {} ({}, listener): CONNECT_REQUEST from {} as new id {} ({})", number,
             to_string(cm->transport()), log::address(child->peer), child->number, what);
  child->channel->push(std::move(out));
}

bool CmIdImpl::claim_qp(std::uint32_t qp_num) {
  auto found = ctx->standalone_qps.find(qp_num);
  if (found == ctx->standalone_qps.end()) return false;
  auto qp_found = found->second.lock();
  if (!qp_found || qp_found->claimed) return false;
  qp_found->claimed = true;
  qp_impl = std::move(qp_found);
  return true;
}

}  // namespace detail

// --- CmId ---

Result<std::unique_ptr<CmId>, std::errc> CmId::create(Context& context, EventChannel& channel, void* user_context,
                                                      Transport transport) {
  std::shared_ptr<detail::CmIdImpl> impl;
  {
    std::lock_guard lock(context.impl().mutex);
    detail::TransportCm* cm = detail::transport_cm(context.impl(), transport);
    if (cm == nullptr) return fail(std::errc::invalid_argument);
    impl = std::make_shared<detail::CmIdImpl>(context.impl_shared(), channel.impl_shared(), user_context, *cm,
                                              cm->new_id_state());
  }
  channel.impl().attach(context.impl_shared());
  impl->public_context = &context;
  std::unique_ptr<CmId> id(new CmId(impl));
  impl->owner = id.get();
  return id;
}

CmId::CmId(std::shared_ptr<detail::CmIdImpl> impl) : impl_(std::move(impl)) {}

CmId::~CmId() {
  auto ctx = impl_->ctx;
  std::unique_ptr<QueuePair> qp;  // destroyed after the lock is released: it takes the lock itself
  std::vector<CmEvent> orphaned;  // queued events about this id; same reason
  std::lock_guard lock(ctx->mutex);
  orphaned = impl_->channel->purge(this);
  impl_->owner = nullptr;
  impl_->cm->release(*impl_);
  qp = std::move(impl_->qp);
  impl_->qp_impl.reset();
}

Status<std::errc> CmId::set_option(CmOption option, std::int64_t value) {
  std::lock_guard lock(impl_->ctx->mutex);
  switch (option) {
    case CmOption::peer_to_peer:
      if (value != 0 && value != 1) return fail(std::errc::invalid_argument);
      if (impl_->state != detail::CmIdImpl::State::idle && impl_->state != detail::CmIdImpl::State::bound &&
          impl_->state != detail::CmIdImpl::State::addr_resolved &&
          impl_->state != detail::CmIdImpl::State::route_resolved)
        return fail(std::errc::operation_in_progress);
      impl_->peer_to_peer = value == 1;
      return {};
    case CmOption::connect_timeout:
      if (value <= 0) return fail(std::errc::invalid_argument);
      impl_->connect_timeout_ms = value;
      return {};
    case CmOption::crc:
      if (value < 0 || value > 2) return fail(std::errc::invalid_argument);
      impl_->crc = static_cast<core::CrcPolicy>(value);
      return {};
    case CmOption::p2p_tag:
      if (value < 0 || value > 0xFFFFFFFF) return fail(std::errc::invalid_argument);
      impl_->tag = static_cast<std::uint32_t>(value);
      return {};
    case CmOption::datagram:
      if (value != 0 && value != 1) return fail(std::errc::invalid_argument);
      if (value == 1 && !impl_->cm->supports_datagram()) return fail(std::errc::protocol_not_supported);
      if (impl_->state != detail::CmIdImpl::State::idle) return fail(std::errc::operation_in_progress);
      impl_->datagram = value == 1;
      return {};
  }
  return fail(std::errc::function_not_supported);
}

std::int64_t CmId::option(CmOption option) const {
  std::lock_guard lock(impl_->ctx->mutex);
  switch (option) {
    case CmOption::peer_to_peer: return impl_->peer_to_peer ? 1 : 0;
    case CmOption::connect_timeout: return impl_->connect_timeout_ms;
    case CmOption::crc: return static_cast<std::int64_t>(impl_->crc);
    case CmOption::p2p_tag: return impl_->tag;
    case CmOption::datagram: return impl_->datagram ? 1 : 0;
  }
  return -1;
}

Status<std::errc> CmId::bind(const sockaddr_in& address) {
  std::lock_guard lock(impl_->ctx->mutex);
  if (address.sin_family != AF_INET) return fail(std::errc::address_family_not_supported);
  if (impl_->state != detail::CmIdImpl::State::idle) return fail(std::errc::invalid_argument);
  impl_->bound_address = address;
  impl_->state = detail::CmIdImpl::State::bound;
  return {};
}

Status<std::errc> CmId::listen(int backlog) {
  auto& impl = *impl_;
  std::lock_guard lock(impl.ctx->mutex);
  if (impl.state != detail::CmIdImpl::State::bound && impl.state != detail::CmIdImpl::State::idle)
    return fail(std::errc::invalid_argument);
  return impl.cm->listen(impl, backlog <= 0 ? SOMAXCONN : backlog);
}

Status<std::errc> CmId::resolve_addr(const sockaddr_in& destination, std::chrono::milliseconds) {
  std::lock_guard lock(impl_->ctx->mutex);
  if (impl_->state != detail::CmIdImpl::State::idle && impl_->state != detail::CmIdImpl::State::bound)
    return fail(std::errc::invalid_argument);
  if (destination.sin_family != AF_INET) {
    impl_->emit(CmEventType::addr_error, EAFNOSUPPORT);
    return {};
  }
  if (destination.sin_addr.s_addr == htonl(INADDR_ANY) || destination.sin_port == 0) {
    impl_->emit(CmEventType::addr_error, EADDRNOTAVAIL);
    return {};
  }
  impl_->cm->resolve_addr(*impl_, destination);
  return {};
}

Status<std::errc> CmId::resolve_route(std::chrono::milliseconds) {
  std::lock_guard lock(impl_->ctx->mutex);
  if (impl_->state != detail::CmIdImpl::State::addr_resolved) return fail(std::errc::invalid_argument);
  impl_->state = detail::CmIdImpl::State::route_resolved;
  impl_->emit(CmEventType::route_resolved);
  return {};
}

Status<std::errc> CmId::connect(const ConnParam& param) {
  auto& impl = *impl_;
  std::optional<CmEvent> retracted;  // destroyed after the lock is released (it may own a CmId)
  std::unique_lock lock(impl.ctx->mutex);
  impl.cm->before_connect(impl, lock);
  if (impl.state == detail::CmIdImpl::State::established) return fail(std::errc::already_connected);
  if (impl.state == detail::CmIdImpl::State::connecting) return fail(std::errc::connection_already_in_progress);
  if (impl.state != detail::CmIdImpl::State::route_resolved) return fail(std::errc::invalid_argument);
  PEERCM_LOG(info, "cm", "id {} ({}): connect to {}, {}", impl.number, to_string(impl.cm->transport()),
            log::address(impl.destination),
            impl.peer_to_peer ? fmt::format("p2p, tag {}", impl.tag) : std::string("client/server"));
  return impl.cm->connect(impl, param, retracted);
}

Status<std::errc> CmId::accept(const ConnParam& param) {
  auto& impl = *impl_;
  std::lock_guard lock(impl.ctx->mutex);
  return impl.cm->accept(impl, param);
}

Status<std::errc> CmId::reject(std::span<const std::uint8_t> private_data) {
  auto& impl = *impl_;
  std::lock_guard lock(impl.ctx->mutex);
  return impl.cm->reject(impl, private_data);
}

Status<std::errc> CmId::establish() {
  std::lock_guard lock(impl_->ctx->mutex);
  if (!impl_->response_pending) return fail(std::errc::invalid_argument);
  // MPA has no third message: the stream already runs; this only closes the exchange.
  impl_->response_pending = false;
  return {};
}

Status<std::errc> CmId::migrate(EventChannel& channel) {
  std::lock_guard lock(impl_->ctx->mutex);
  if (channel.impl_shared() == impl_->channel) return {};
  // Queued events keep their order; a listener's undelivered requests move with it.
  std::vector<CmEvent> moved = impl_->channel->purge(this);
  impl_->channel = channel.impl_shared();
  channel.impl().attach(impl_->ctx);
  for (auto& event : moved) impl_->channel->push(std::move(event));
  return {};
}

Status<std::errc> CmId::disconnect() {
  auto& impl = *impl_;
  std::lock_guard lock(impl.ctx->mutex);
  return impl.cm->disconnect(impl);
}

Result<QueuePair*, std::errc> CmId::create_qp(ProtectionDomain& pd, const QpInitAttr& attr) {
  if (!attr.send_cq || !attr.recv_cq) return fail(std::errc::invalid_argument);
  if (attr.srq && &attr.srq->pd().context().impl() != impl_->ctx.get()) return fail(std::errc::invalid_argument);
  auto& impl = *impl_;
  std::lock_guard lock(impl.ctx->mutex);
  if (impl.qp) return fail(std::errc::invalid_argument);
  auto made = impl.cm->create_qp(impl, pd.handle(), attr);
  if (!made) return fail(made.error());
  impl.qp_impl = std::move(*made);
  impl.qp.reset(new QueuePair(impl.qp_impl));
  return impl.qp.get();
}

void CmId::destroy_qp() {
  std::unique_ptr<QueuePair> qp;
  {
    std::lock_guard lock(impl_->ctx->mutex);
    qp = std::move(impl_->qp);
  }
  qp.reset();
}

Status<std::errc> CmId::attach_qp(QueuePair& qp) {
  auto& impl = *impl_;
  std::lock_guard lock(impl.ctx->mutex);
  if (impl.qp || impl.qp_impl || qp.impl_->context != impl.ctx || qp.impl_->claimed)
    return fail(std::errc::invalid_argument);
  if (auto attached = impl.cm->attach_qp(impl, qp.impl_); !attached) return attached;
  qp.impl_->claimed = true;
  impl.qp_impl = qp.impl_;
  return {};
}

void CmId::detach_qp() {
  auto& impl = *impl_;
  std::lock_guard lock(impl.ctx->mutex);
  if (impl.qp) return;
  impl.qp_impl.reset();
  impl.qp_by_number = false;
  impl.response_pending = false;
}

QueuePair* CmId::qp() const { return impl_->qp.get(); }
Context& CmId::context() const { return *impl_->public_context; }
Transport CmId::transport() const { return impl_->cm->transport(); }
void* CmId::user_context() const { return impl_->user_context; }
std::uint32_t CmId::number() const { return impl_->number; }

sockaddr_in CmId::local_address() const {
  std::lock_guard lock(impl_->ctx->mutex);
  return impl_->cm->local_address(*impl_);
}

sockaddr_in CmId::peer_address() const {
  std::lock_guard lock(impl_->ctx->mutex);
  return impl_->peer;
}

CmStats cm_stats(Context& context) {
  std::lock_guard lock(context.impl().mutex);
  CmStats stats = context.impl().stats;
  for (auto& cm : context.impl().cms)
    if (cm) cm->add_stats(stats);
  return stats;
}

}  // namespace peercm
