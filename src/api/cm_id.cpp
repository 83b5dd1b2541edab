// CmId: rdma_cm semantics over MPA/TCP connections; ids of Transport::roce hand each call to
// api/roce/roce_cm.cpp.
#include <arpa/inet.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>

#include "api/cm_id_impl.hpp"
#include "api/roce/roce_cm.hpp"
#include "api/roce/roce_device.hpp"
#include "engine/log.hpp"
#include "wire/cm_header.hpp"

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

CmIdImpl::CmIdImpl(std::shared_ptr<ContextImpl> context, std::shared_ptr<EventChannelImpl> chan, void* user)
    : ctx(std::move(context)),
      channel(std::move(chan)),
      user_context(user),
      number(ctx->next_cmid()),
      peer_to_peer(default_peer_to_peer()) {}

CmIdImpl::~CmIdImpl() {
  if (listen_fd >= 0) {
    ctx->reactor.remove(listen_fd);
    ::close(listen_fd);
  }
  if (reserved_fd >= 0) ::close(reserved_fd);
}

void CmIdImpl::emit(CmEventType type, int status, ConnParam param, RejectReason reason) {
  if (!owner) return;
  PEERCM_LOG(info, "cm", "id {} ({}): {} status {}{}", number, to_string(transport), to_string(type), status,
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

core::MpaConfig CmIdImpl::mpa_config(std::uint16_t ird, std::uint16_t ord) const {
  core::MpaConfig config;
  config.crc = crc;
  config.enhanced = true;
  // docs/p2p.md "RTR on every connection": every enhanced Request offers the RFC 6581 RTR
  // types, whatever the CmId's collision model, so the passive side may speak first on
  // client/server connections too. The collision model travels in the CM header, not here.
  config.peer_to_peer = true;
  config.ird = ird;
  config.ord = ord;
  config.timeout = std::chrono::milliseconds(connect_timeout_ms);
  return config;
}

std::vector<std::uint8_t> CmIdImpl::cm_header(std::span<const std::uint8_t> application_data) const {
  std::vector<std::uint8_t> bytes(wire::kCmHeaderSize);
  const wire::CmHeader header{.node_guid = ctx->node_guid,
                              .incarnation = ctx->incarnation,
                              .listen_port = ctx->p2p_listen_port,
                              .tag = tag,
                              .cmid = number};
  [[maybe_unused]] auto n = wire::encode_cm_header(header, bytes);
  bytes.insert(bytes.end(), application_data.begin(), application_data.end());
  return bytes;
}

void CmIdImpl::end_p2p() {
  if (p2p_attempt) {
    p2p_attempt = false;
    ctx->p2p->forget_attempt(number);
    ctx->p2p->resolver().handle_attempt_ended(number);
  }
  if (link != 0) {
    const core::LinkId closed = link;
    link = 0;
    ctx->p2p->link_closed(closed);
  }
  ctx->p2p->run();
}

Connection::Callbacks CmIdImpl::connection_callbacks(core::LinkId link_id) {
  std::weak_ptr<CmIdImpl> weak = weak_from_this();
  Connection::Callbacks cb;
  cb.tcp_failed = [weak](int error) {
    auto self = weak.lock();
    if (!self) return;
    self->state = State::route_resolved;
    self->connection.reset();
    if (error == ECONNREFUSED) {
      self->ctx->stats.rejects_received[static_cast<int>(RejectReason::refused)]++;
      self->emit(CmEventType::rejected, ECONNREFUSED, {}, RejectReason::refused);
    } else {
      self->emit(CmEventType::unreachable, error);
    }
    // After the attempt's own ending: a request it held may now reach the application (rule 3).
    self->end_p2p();
  };
  cb.mpa_event = [weak, link_id](core::MpaEvent& event) {
    auto self = weak.lock();
    if (!self) return;
    ConnParam param;
    param.private_data = event.result.peer_private_data;
    // Resources as the peer sees them (rdma_cm swaps them in events).
    param.responder_resources = static_cast<std::uint8_t>(std::min<int>(event.result.peer_ord, 255));
    param.initiator_depth = static_cast<std::uint8_t>(std::min<int>(event.result.peer_ird, 255));
    switch (event.kind) {
      case core::MpaEvent::Kind::established: {
        self->state = State::established;
        if (self->connection) self->peer = self->connection->peer_address();
        if (link_id != 0) {
          // A p2p peer's accepting Reply starts with its CM header (design.md §3 rule 1).
          std::optional<std::uint32_t> reply_cmid;
          if (auto header = wire::decode_cm_header(param.private_data)) {
            self->peer_incarnation = header->header.incarnation;
            reply_cmid = header->header.cmid;
            param.private_data.assign(header->application_data.begin(), header->application_data.end());
          } else if (self->p2p_attempt) {
            param.private_data.clear();
          }
          if (self->p2p_attempt) {
            self->p2p_attempt = false;
            self->ctx->p2p->forget_attempt(self->number);
          }
          if (reply_cmid) {
            self->ctx->p2p->resolver().handle_established(self->key, link_id, self->peer_incarnation, *reply_cmid);
          } else {
            self->ctx->p2p->resolver().handle_established(self->key, link_id, self->peer_incarnation);
          }
        }
        self->response_pending = self->qp_by_number;
        self->emit(self->qp_by_number ? CmEventType::connect_response : CmEventType::established, 0,
                   std::move(param));
        if (link_id != 0) self->ctx->p2p->run();
        break;
      }
      case core::MpaEvent::Kind::rejected:
        if (self->p2p_attempt && wire::decode_cm_reject(param.private_data)) {
          // Rule 3: a collision (or duplicate) reject is the CM's business, not the
          // application's: the attempt waits for the peer's own request.
          self->ctx->stats.rejects_received[static_cast<int>(
              *wire::decode_cm_reject(param.private_data) == wire::CmRejectReason::collision
                  ? RejectReason::collision
                  : RejectReason::duplicate)]++;
          self->ctx->p2p->resolver().handle_attempt_rejected_by_cm(self->number);
          self->ctx->p2p->run();
          break;
        }
        self->state = State::route_resolved;
        self->ctx->stats.rejects_received[static_cast<int>(RejectReason::application)]++;
        self->emit(CmEventType::rejected, ECONNREFUSED, std::move(param), RejectReason::application);
        self->end_p2p();  // after the ending, as above
        break;
      case core::MpaEvent::Kind::failed: {
        const bool passive = self->state == State::accepting;
        self->state = passive ? State::disconnected : State::route_resolved;
        const int status = event.failure == core::MpaFailure::timeout ? ETIMEDOUT : ECONNRESET;
        const RejectReason reason = event.failure == core::MpaFailure::timeout ? RejectReason::timeout
                                    : event.failure == core::MpaFailure::markers_requested ? RejectReason::markers
                                                                                          : RejectReason::invalid;
        self->emit(CmEventType::connect_error, status, {}, reason);
        self->end_p2p();  // after the ending, as above
        break;
      }
      case core::MpaEvent::Kind::request_received:
        break;  // handled by the listener
    }
  };
  cb.qp_event = [weak](const core::QpEvent&) {
    auto self = weak.lock();
    if (!self) return;
    self->emit_disconnected();
  };
  cb.closed = [weak, link_id] {
    auto self = weak.lock();
    if (!self) return;
    if (self->state == State::established) self->emit_disconnected();
    if (self->disconnected_emitted && !self->timewait_emitted) {
      self->timewait_emitted = true;
      self->timewait_timer = self->ctx->reactor.add_timer(
          engine::Clock::now() + self->ctx->timewait, [weak] {
            auto id = weak.lock();
            if (!id) return;
            id->timewait_timer.reset();
            id->emit(CmEventType::timewait_exit);
          });
    }
    self->release_pending();
    if (link_id != 0 && self->link == link_id) {
      self->link = 0;
      self->ctx->p2p->link_closed(link_id);
    }
  };
  return cb;
}

void CmIdImpl::release_pending() {
  if (!counted_in_backlog) return;
  counted_in_backlog = false;
  if (auto l = listener.lock()) {
    if (l->pending > 0) --l->pending;
  }
}

void CmIdImpl::on_listen_readable() {
  for (;;) {
    sockaddr_in from{};
    socklen_t len = sizeof from;
    const int fd = ::accept4(listen_fd, reinterpret_cast<sockaddr*>(&from), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;  // EAGAIN, or a transient error: the next readiness retries
    if (pending >= static_cast<std::size_t>(backlog) && !displace_stalled_handshake()) {
      ::close(fd);  // over the backlog: refuse rather than queue without bound
      continue;
    }
    ++pending;
    // The handshake runs before any CmId exists; a holder keeps the connection alive.
    auto holder = std::make_shared<std::shared_ptr<Connection>>();
    std::weak_ptr<CmIdImpl> weak = weak_from_this();
    Connection::Callbacks cb;
    cb.mpa_event = [weak, holder](core::MpaEvent& event) {
      auto self = weak.lock();
      if (!self || !*holder) return;
      if (event.kind == core::MpaEvent::Kind::request_received) self->on_incoming_request(*holder);
    };
    cb.closed = [weak, holder] {
      // Closed before a CmId took it over (timeout, garbage, peer gone).
      if (auto self = weak.lock()) {
        std::erase(self->handshaking, *holder);
        if (self->pending > 0) --self->pending;
      }
      holder->reset();
    };
    auto conn = Connection::adopt(ctx, fd, from, mpa_config(16, 16), std::move(cb));
    if (!conn) {
      --pending;
      continue;
    }
    *holder = *conn;
    handshaking.push_back(*conn);
    (*conn)->receive_pending();
  }
}

// Peers that connect and then say nothing, or drip their Request byte by byte, would hold a
// full backlog until the handshake timeout, locking legitimate clients out (a slowloris
// flood): the oldest silent one makes room, else the oldest whose Request is still incomplete
// after kPartialRequestGrace (a real client's Request arrives in one segment, at once).
bool CmIdImpl::displace_stalled_handshake() {
  constexpr std::chrono::milliseconds kPartialRequestGrace{100};
  std::shared_ptr<Connection> victim;
  for (const auto& conn : handshaking) {
    if (conn->silent()) {
      victim = conn;
      break;
    }
  }
  if (!victim) {
    const auto stalled_before = std::chrono::steady_clock::now() - kPartialRequestGrace;
    for (const auto& conn : handshaking) {
      if (conn->opened_at() < stalled_before) {
        victim = conn;
        break;
      }
    }
  }
  if (!victim) return false;
  victim->abort();  // its `closed` callback gives its place back
  return pending < static_cast<std::size_t>(backlog);
}

void CmIdImpl::on_incoming_request(const std::shared_ptr<Connection>& conn) {
  std::erase(handshaking, conn);
  const core::MpaResult& request = conn->responder()->request();
  // docs/p2p.md rules 1-2: a p2p request names its sender in the CM header (whatever the
  // Request's RFC 6581 A flag says: every peercm Request sets it); the resolver decides.
  if (auto header = wire::decode_cm_header(request.peer_private_data)) {
    const sockaddr_in from = conn->peer_address();
    const std::uint16_t port = header->header.listen_port;
    const core::P2pKey request_key{ntohl(from.sin_addr.s_addr), port, header->header.tag,
                                   port == 0 ? header->header.node_guid : 0};
    const core::LinkId link_id = ctx->p2p->new_link();
    const core::NodeIdentity sender{header->header.node_guid, header->header.incarnation};
    if (pending > 0) --pending;  // the resolver's verdict, not the backlog, governs it now
    ctx->p2p->park_request(link_id, conn, shared_from_this(), sender, header->header.cmid);
    Connection::Callbacks parked;
    P2pDriver* driver = ctx->p2p.get();
    parked.closed = [driver, link_id] { driver->link_closed(link_id); };
    conn->set_callbacks(std::move(parked));
    const core::Time now(std::chrono::steady_clock::now().time_since_epoch());
    ctx->p2p->resolver().handle_request(request_key, link_id, sender, header->header.cmid, now);
    ctx->p2p->run();
    return;
  }
  deliver_request(conn, request.peer_private_data, 0, {}, {}, 0);
}

void CmIdImpl::deliver_request(const std::shared_ptr<Connection>& conn, std::span<const std::uint8_t> app_data,
                               core::LinkId link_id, const core::P2pKey& request_key,
                               const core::NodeIdentity& peer_identity, core::AttemptId request_cmid) {
  const core::MpaResult& request = conn->responder()->request();
  auto child_impl = std::make_shared<CmIdImpl>(ctx, channel, user_context);
  child_impl->public_context = public_context;
  child_impl->state = State::request_received;
  child_impl->peer_to_peer = link_id != 0;  // the request carried a CM header
  child_impl->crc = crc;
  child_impl->tag = request_key.tag;
  child_impl->connect_timeout_ms = connect_timeout_ms;
  child_impl->listener = weak_from_this();
  if (link_id == 0) {
    child_impl->counted_in_backlog = true;
  }
  child_impl->connection = conn;
  child_impl->peer = conn->peer_address();
  child_impl->key = request_key;
  child_impl->link = link_id;
  child_impl->peer_incarnation = peer_identity.incarnation;
  child_impl->peer_node = peer_identity;
  child_impl->peer_cmid = request_cmid;
  if (link_id != 0) ctx->p2p->own_link(link_id, child_impl);
  std::unique_ptr<CmId> child(new CmId(child_impl));
  child_impl->owner = child.get();
  // The connection now reports to the child id.
  conn->set_callbacks(child_impl->connection_callbacks(link_id));

  CmEvent event;
  event.type = CmEventType::connect_request;
  event.id = child.get();
  event.listen_id = owner;
  event.param.private_data.assign(app_data.begin(), app_data.end());
  event.param.responder_resources = static_cast<std::uint8_t>(std::min<int>(request.peer_ord, 255));
  event.param.initiator_depth = static_cast<std::uint8_t>(std::min<int>(request.peer_ird, 255));
  event.new_id = std::move(child);
  PEERCM_LOG(info, "cm", "id {} (iwarp, listener): CONNECT_REQUEST from {} as new id {} ({})", number,
            log::address(child_impl->peer), child_impl->number, link_id != 0 ? "p2p, no colliding attempt" : "client/server");
  channel->push(std::move(event));
}

std::unique_ptr<CmId> CmIdImpl::make_public(const std::shared_ptr<CmIdImpl>& impl) {
  std::unique_ptr<CmId> id(new CmId(impl));
  impl->owner = id.get();
  return id;
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
  if (transport != Transport::iwarp && transport != Transport::roce) return fail(std::errc::invalid_argument);
  auto impl = std::make_shared<detail::CmIdImpl>(context.impl_shared(), channel.impl_shared(), user_context);
  impl->transport = transport;
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
  if (impl_->timewait_timer) ctx->reactor.cancel_timer(*std::exchange(impl_->timewait_timer, std::nullopt));
  impl_->end_p2p();
  if (impl_->transport == Transport::roce) detail::roce::release(*impl_);
  if (impl_->connection) {
    // The caller's QP outlives the id: it goes to ERROR with the connection, as iw_cm does.
    if (!impl_->qp && impl_->qp_impl) impl_->qp_impl->engine.disconnect();
    impl_->connection->set_callbacks({});
    impl_->connection->abort();
    impl_->connection.reset();
  }
  impl_->release_pending();
  // abort() runs the handshake's `closed` callback, which erases from `handshaking`: iterate
  // over a copy taken out of the member.
  auto handshaking = std::move(impl_->handshaking);
  impl_->handshaking.clear();
  for (auto& conn : handshaking) conn->abort();
  if (impl_->listen_fd >= 0) {
    ctx->reactor.remove(impl_->listen_fd);
    ::close(impl_->listen_fd);
    impl_->listen_fd = -1;
    // The context outlives its listeners (the C API keeps it for the process): it stops
    // advertising a port nobody listens on.
    if (impl_->bound_address && ctx->p2p_listen_port == ntohs(impl_->bound_address->sin_port))
      ctx->p2p_listen_port = 0;
  }
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
      if (value == 1 && impl_->transport != Transport::roce) return fail(std::errc::protocol_not_supported);
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
  if (impl.transport == Transport::roce) {
    impl.backlog = backlog <= 0 ? SOMAXCONN : backlog;
    return detail::roce::listen(impl);
  }
  // A port rdma_bind_addr reserved is listened on where it is bound.
  const bool reserved = impl.reserved_fd >= 0;
  const int fd = reserved ? std::exchange(impl.reserved_fd, -1)
                          : ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return fail(static_cast<std::errc>(errno));
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  detail::set_socket_options(fd);  // inherited by every accepted socket
  sockaddr_in address = impl.bound_address.value_or(sockaddr_in{.sin_family = AF_INET});
  if (backlog <= 0) backlog = SOMAXCONN;
  if ((!reserved && ::bind(fd, reinterpret_cast<const sockaddr*>(&address), sizeof address) != 0) ||
      ::listen(fd, backlog) != 0) {
    const int err = errno;
    ::close(fd);
    return fail(static_cast<std::errc>(err));
  }
  socklen_t len = sizeof address;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &len);
  impl.bound_address = address;
  if (impl.ctx->p2p_listen_port == 0) impl.ctx->p2p_listen_port = ntohs(address.sin_port);
  impl.listen_fd = fd;
  impl.backlog = backlog;
  impl.state = detail::CmIdImpl::State::listening;
  std::weak_ptr<detail::CmIdImpl> weak = impl_;
  auto added = impl.ctx->reactor.add(fd, EPOLLIN, [weak](std::uint32_t) {
    if (auto self = weak.lock()) self->on_listen_readable();
  });
  if (!added) return fail(added.error());
  return {};
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
  if (impl_->transport == Transport::roce) {
    detail::roce::resolve_addr(*impl_, destination);
    return {};
  }
  impl_->destination = destination;
  impl_->state = detail::CmIdImpl::State::addr_resolved;
  impl_->emit(CmEventType::addr_resolved);
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
  detail::P2pDriver::Reclaimed reclaimed;
  std::unique_lock lock(impl.ctx->mutex);
  if (impl.peer_to_peer && impl.transport == Transport::iwarp && impl.ctx->p2p_listen_port != 0) {
    // The peer's request for this key may be waiting in our listener or socket: handled now,
    // it is one this attempt can take instead of dialling a connection of its own (rule 5
    // refined). Before the checks below: the round releases the lock while it asks epoll.
    impl.ctx->reactor.run_ready(lock);
  }
  if (impl.state == detail::CmIdImpl::State::established) return fail(std::errc::already_connected);
  if (impl.state == detail::CmIdImpl::State::connecting) return fail(std::errc::connection_already_in_progress);
  if (impl.state != detail::CmIdImpl::State::route_resolved) return fail(std::errc::invalid_argument);
  PEERCM_LOG(info, "cm", "id {} ({}): connect to {}, {}", impl.number, to_string(impl.transport),
            log::address(impl.destination),
            impl.peer_to_peer ? fmt::format("p2p, tag {}", impl.tag) : std::string("client/server"));
  if (impl.transport == Transport::roce) return detail::roce::connect(impl, param, retracted);
  if (!impl.qp_impl) {
    if (!impl.claim_qp(param.qp_num)) return fail(std::errc::invalid_argument);
    impl.qp_by_number = true;
  }
  const std::size_t limit = wire::kMpaMaxPrivateData - wire::kIrdOrdBlockSize -
                            (impl.peer_to_peer ? wire::kCmHeaderSize : 0);
  if (param.private_data.size() > limit) return fail(std::errc::invalid_argument);
  // design.md §3 rule 1: the CM header leads the private data of a p2p request.
  std::vector<std::uint8_t> private_data =
      impl.peer_to_peer ? impl.cm_header(param.private_data) : param.private_data;
  core::LinkId link_id = 0;
  if (impl.peer_to_peer) {
    // Rules 2, 5: the attempt's key is (destination, tag); the resolver may refuse it.
    const core::P2pKey key{ntohl(impl.destination.sin_addr.s_addr), ntohs(impl.destination.sin_port), impl.tag};
    link_id = impl.ctx->p2p->new_link();
    const core::Time deadline(std::chrono::steady_clock::now().time_since_epoch() +
                              std::chrono::milliseconds(impl.connect_timeout_ms));
    auto admitted = impl.ctx->p2p->resolver().connect(key, impl.number, link_id, deadline);
    if (!admitted && admitted.error() == std::errc::connection_already_in_progress) {
      reclaimed = impl.ctx->p2p->reclaim_unseen_request(key, retracted);
      if (reclaimed.link != 0) admitted = impl.ctx->p2p->resolver().connect(key, impl.number, link_id, deadline);
    }
    if (!admitted) return fail(admitted.error());
    impl.p2p_attempt = true;
    impl.key = key;
    impl.link = link_id;
    impl.connect_param = param;
    impl.ctx->p2p->track_attempt(impl.number, impl_);
    impl.ctx->p2p->own_link(link_id, impl_);
    impl.state = detail::CmIdImpl::State::connecting;
    if (reclaimed.link != 0) {
      // The reclaimed request meets our attempt like any colliding request (rule 3), before
      // our own request exists: when it wins, the attempt is bound to it and our request,
      // a TCP connection the peer would have to reject, never goes out.
      const core::Time now(std::chrono::steady_clock::now().time_since_epoch());
      impl.ctx->p2p->resolver().handle_request(key, reclaimed.link, reclaimed.peer, reclaimed.peer_cmid, now);
      impl.ctx->p2p->run();
      if (impl.link != link_id) return {};  // bound to the peer's request (or ended)
    }
  }
  impl.state = detail::CmIdImpl::State::connecting;
  auto conn = detail::Connection::open(impl.ctx, impl.destination, impl.bound_address,
                                       impl.mpa_config(param.responder_resources, param.initiator_depth),
                                       std::move(private_data), impl.connection_callbacks(link_id),
                                       std::exchange(impl.reserved_fd, -1));
  if (!conn) {
    impl.state = detail::CmIdImpl::State::route_resolved;
    impl.end_p2p();
    return fail(conn.error());
  }
  impl.connection = *conn;
  impl.connection->bind_qp(impl.qp_impl);
  if (link_id != 0) impl.ctx->p2p->run();
  return {};
}

Status<std::errc> CmId::accept(const ConnParam& param) {
  auto& impl = *impl_;
  std::lock_guard lock(impl.ctx->mutex);
  if (impl.transport == Transport::roce) return detail::roce::accept(impl, param);
  if (impl.state != detail::CmIdImpl::State::request_received || !impl.connection) return fail(std::errc::invalid_argument);
  if (param.private_data.size() > wire::kMpaMaxPrivateData - wire::kIrdOrdBlockSize)
    return fail(std::errc::invalid_argument);
  if (!impl.qp_impl && !impl.claim_qp(param.qp_num)) return fail(std::errc::invalid_argument);
  impl.state = detail::CmIdImpl::State::accepting;
  impl.release_pending();
  // A p2p requester learns our identity from the Reply (design.md §3 rules 1, 6).
  const std::vector<std::uint8_t> reply = impl.link != 0 ? impl.cm_header(param.private_data) : param.private_data;
  if (impl.link != 0) impl.ctx->p2p->resolver().handle_request_accepted(impl.link);
  impl.connection->accept(impl.qp_impl, param.responder_resources, param.initiator_depth, reply);
  if (impl.link != 0) impl.ctx->p2p->run();
  return {};
}

Status<std::errc> CmId::reject(std::span<const std::uint8_t> private_data) {
  auto& impl = *impl_;
  std::lock_guard lock(impl.ctx->mutex);
  if (impl.transport == Transport::roce) return detail::roce::reject(impl, private_data);
  if (impl.state != detail::CmIdImpl::State::request_received || !impl.connection) return fail(std::errc::invalid_argument);
  if (private_data.size() > wire::kMpaMaxPrivateData - wire::kIrdOrdBlockSize) return fail(std::errc::invalid_argument);
  impl.ctx->stats.rejects_sent[static_cast<int>(RejectReason::application)]++;
  impl.release_pending();
  auto conn = std::move(impl.connection);
  conn->set_callbacks({});
  conn->reject(private_data);
  impl.state = detail::CmIdImpl::State::idle;
  if (impl.link != 0) {
    impl.ctx->p2p->resolver().handle_request_rejected(impl.link);
    impl.end_p2p();
  }
  return {};
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
  if (impl.transport == Transport::roce) return detail::roce::disconnect(impl);
  if (!impl.connection) return fail(std::errc::not_connected);
  if (impl.state != detail::CmIdImpl::State::established && impl.state != detail::CmIdImpl::State::disconnected &&
      impl.state != detail::CmIdImpl::State::accepting && impl.state != detail::CmIdImpl::State::connecting)
    return fail(std::errc::invalid_argument);
  auto conn = impl.connection;
  impl.emit_disconnected();
  conn->disconnect();
  return {};
}

Result<QueuePair*, std::errc> CmId::create_qp(ProtectionDomain& pd, const QpInitAttr& attr) {
  if (!attr.send_cq || !attr.recv_cq) return fail(std::errc::invalid_argument);
  if (attr.srq && &attr.srq->pd().context().impl() != impl_->ctx.get()) return fail(std::errc::invalid_argument);
  auto& impl = *impl_;
  std::lock_guard lock(impl.ctx->mutex);
  if (impl.qp) return fail(std::errc::invalid_argument);
  if (impl.transport == Transport::roce) {
    auto made = detail::roce::create_qp(impl, pd.handle(), attr);
    if (!made) return fail(made.error());
    impl.qp_impl = std::move(*made);
    impl.qp.reset(new QueuePair(impl.qp_impl));
    return impl.qp.get();
  }
  impl.qp_impl = std::make_shared<detail::QueuePairImpl>(impl.ctx, pd.handle(), attr);
  impl.qp.reset(new QueuePair(impl.qp_impl));
  if (impl.connection && impl.state == detail::CmIdImpl::State::connecting) impl.connection->bind_qp(impl.qp_impl);
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
  if (impl.transport == Transport::roce) {
    if (auto attached = detail::roce::attach_qp(impl, qp.impl_); !attached) return attached;
  }
  qp.impl_->claimed = true;
  impl.qp_impl = qp.impl_;
  if (impl.connection && impl.state == detail::CmIdImpl::State::connecting) impl.connection->bind_qp(impl.qp_impl);
  return {};
}

void CmId::detach_qp() {
  auto& impl = *impl_;
  std::lock_guard lock(impl.ctx->mutex);
  if (impl.qp) return;
  if (impl.connection && impl.state == detail::CmIdImpl::State::connecting) impl.connection->bind_qp(nullptr);
  impl.qp_impl.reset();
  impl.qp_by_number = false;
  impl.response_pending = false;
}

QueuePair* CmId::qp() const { return impl_->qp.get(); }
Context& CmId::context() const { return *impl_->public_context; }
Transport CmId::transport() const { return impl_->transport; }
void* CmId::user_context() const { return impl_->user_context; }
std::uint32_t CmId::number() const { return impl_->number; }

sockaddr_in CmId::local_address() const {
  std::lock_guard lock(impl_->ctx->mutex);
  if (impl_->connection && impl_->connection->is_open()) return impl_->connection->local_address();
  return impl_->bound_address.value_or(sockaddr_in{});
}

sockaddr_in CmId::peer_address() const {
  std::lock_guard lock(impl_->ctx->mutex);
  return impl_->peer;
}

CmStats cm_stats(Context& context) {
  std::lock_guard lock(context.impl().mutex);
  CmStats stats = context.impl().stats;
  if (context.impl().roce) context.impl().roce->add_stats(stats);
  return stats;
}

}  // namespace peercm
