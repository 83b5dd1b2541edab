#include "api/iwarp_cm.hpp"

#include <arpa/inet.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "api/cm_id_impl.hpp"
#include "engine/log.hpp"

namespace peercm::detail {
namespace {

namespace iw = core::iwarp;

core::Time core_now() { return core::Time(std::chrono::steady_clock::now().time_since_epoch()); }

iw::Endpoint endpoint(const sockaddr_in& address) { return {ntohl(address.sin_addr.s_addr), ntohs(address.sin_port)}; }

sockaddr_in socket_address(const iw::Endpoint& endpoint) {
  sockaddr_in out{};
  out.sin_family = AF_INET;
  out.sin_addr.s_addr = htonl(endpoint.address);
  out.sin_port = htons(endpoint.port);
  return out;
}

IwarpIdState& state_of(CmIdImpl& id) { return static_cast<IwarpIdState&>(*id.transport_state); }

RejectReason reject_reason(iw::IwarpEndReason reason) {
  switch (reason) {
    case iw::IwarpEndReason::none: return RejectReason::none;
    case iw::IwarpEndReason::application: return RejectReason::application;
    case iw::IwarpEndReason::refused: return RejectReason::refused;
    case iw::IwarpEndReason::timeout: return RejectReason::timeout;
    case iw::IwarpEndReason::markers: return RejectReason::markers;
    case iw::IwarpEndReason::invalid: return RejectReason::invalid;
  }
  return RejectReason::invalid;
}

// Resources as the peer sees them (rdma_cm swaps them in events).
ConnParam event_param(const iw::IwarpCmEvent& event) {
  ConnParam param;
  param.private_data = event.private_data;
  param.responder_resources = static_cast<std::uint8_t>(std::min<int>(event.peer_ord, 255));
  param.initiator_depth = static_cast<std::uint8_t>(std::min<int>(event.peer_ird, 255));
  return param;
}

}  // namespace

IwarpIdState::~IwarpIdState() {
  if (reserved_fd >= 0) ::close(reserved_fd);
}

IwarpCm::IwarpCm(ContextImpl& ctx)
    : ctx_(ctx),
      agent_(iw::IwarpCmAgentConfig{.identity = core::NodeIdentity{ctx.node_guid, ctx.incarnation},
                                    .timewait = std::chrono::duration_cast<core::Duration>(ctx.timewait)}) {}

IwarpCm::~IwarpCm() {
  if (timer_) ctx_.reactor.cancel_timer(*timer_);
}

std::shared_ptr<CmIdImpl> IwarpCm::find(iw::IwarpCmId id) const {
  auto it = ids_.find(id);
  return it == ids_.end() ? nullptr : it->second.lock();
}

std::shared_ptr<Connection> IwarpCm::connection_of(iw::IwarpCmId id) const {
  if (id == 0) return nullptr;
  auto it = streams_.find(agent_.stream_of(id));
  return it == streams_.end() ? nullptr : it->second;
}

// The agent is done with this id: later events about its number are not ours.
void IwarpCm::end_agent_id(CmIdImpl& id) {
  IwarpIdState& state = state_of(id);
  if (state.agent_id == 0) return;
  ids_.erase(state.agent_id);
  state.agent_id = 0;
}

// --- the application's calls ---

Status<std::errc> IwarpCm::reserve_port(CmIdImpl& id, sockaddr_in& address) {
  auto& state = state_of(id);
  // Without SO_REUSEADDR first, so that the port conflicts with any socket holding it, another
  // id's reservation among them; when that fails, a socket that allows sharing and does not
  // listen (a connection in TIME_WAIT, one an earlier listener accepted) may be what holds it,
  // and no id does: rdma_cm's port is free, so bind beside it.
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return fail(static_cast<std::errc>(errno));
  const auto* raw = reinterpret_cast<const sockaddr*>(&address);
  bool bound = ::bind(fd, raw, sizeof address) == 0;
  if (!bound && errno == EADDRINUSE && address.sin_port != 0) {
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    bound = ::bind(fd, raw, sizeof address) == 0;
  }
  socklen_t length = sizeof address;
  if (!bound || ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    const int error = errno;
    ::close(fd);
    return fail(static_cast<std::errc>(error));
  }
  state.reserved_fd = fd;
  return {};
}

Status<std::errc> IwarpCm::listen(CmIdImpl& id, int backlog) {
  auto& state = state_of(id);
  // A port rdma_bind_addr reserved is listened on where it is bound.
  const bool reserved = state.reserved_fd >= 0;
  const int fd = reserved ? std::exchange(state.reserved_fd, -1)
                          : ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return fail(static_cast<std::errc>(errno));
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  set_socket_options(fd);  // inherited by every accepted socket
  sockaddr_in address = id.bound_address.value_or(sockaddr_in{.sin_family = AF_INET});
  if ((!reserved && ::bind(fd, reinterpret_cast<const sockaddr*>(&address), sizeof address) != 0) ||
      ::listen(fd, backlog) != 0) {
    const int err = errno;
    ::close(fd);
    return fail(static_cast<std::errc>(err));
  }
  socklen_t len = sizeof address;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &len);
  std::weak_ptr<CmIdImpl> weak = id.shared_from_this();
  auto added = ctx_.reactor.add(fd, EPOLLIN, [this, weak](std::uint32_t) { on_listen_readable(weak); });
  if (!added) {
    ::close(fd);
    return fail(added.error());
  }
  id.bound_address = address;
  state.listen_fd = fd;
  state.agent_id = agent_.listen({.port = ntohs(address.sin_port),
                                  .backlog = backlog,
                                  .crc = id.crc,
                                  .handshake_timeout = std::chrono::milliseconds(id.connect_timeout_ms)});
  ids_[state.agent_id] = weak;
  id.state = CmIdImpl::State::listening;
  return {};
}

void IwarpCm::resolve_addr(CmIdImpl& id, const sockaddr_in& destination) {
  id.destination = destination;
  id.state = CmIdImpl::State::addr_resolved;
  id.emit(CmEventType::addr_resolved);
}

void IwarpCm::before_connect(CmIdImpl& id, std::unique_lock<std::mutex>& lock) {
  // The peer's request for this key may be waiting in our listener or socket: handled now, it
  // is one this attempt can take instead of dialling a connection of its own (docs/p2p.md,
  // Rules, R5). The round releases the lock while it asks epoll.
  if (id.peer_to_peer && agent_.p2p_listen_port() != 0) ctx_.reactor.run_ready(lock);
}

Status<std::errc> IwarpCm::connect(CmIdImpl& id, const ConnParam& param, std::optional<CmEvent>& retracted) {
  if (!id.qp_impl) {
    if (!id.claim_qp(param.qp_num)) return fail(std::errc::invalid_argument);
    id.qp_by_number = true;
  }
  const core::Time now = core_now();
  iw::IwarpConnectParams params{.destination = endpoint(id.destination),
                                .peer_to_peer = id.peer_to_peer,
                                .tag = id.tag,
                                .number = id.number,
                                .crc = id.crc,
                                .ird = param.responder_resources,
                                .ord = param.initiator_depth,
                                .private_data = param.private_data,
                                .timeout = std::chrono::milliseconds(id.connect_timeout_ms)};
  // R5's unseen-request rule: the agent asks; only the event channel knows the answer.
  auto take_back = [this, &retracted](iw::IwarpCmId request) {
    auto child = find(request);
    if (!child || child->state != CmIdImpl::State::request_received) return false;
    retracted = child->channel->retract_request(child->owner);
    if (!retracted) return false;  // the application has it: rule 5's EALREADY stands
    child->state = CmIdImpl::State::idle;
    end_agent_id(*child);
    return true;
  };
  auto made = agent_.connect(params, now, take_back);
  if (!made) return fail(made.error());
  state_of(id).agent_id = *made;
  ids_[*made] = id.shared_from_this();
  id.state = CmIdImpl::State::connecting;
  pump();
  if (failed_open_) {
    // The socket could not even be made: the call fails, as connect(2) would.
    const std::errc error = failed_open_->second;
    failed_open_.reset();
    agent_.destroy(*made, now);
    end_agent_id(id);
    id.state = CmIdImpl::State::route_resolved;
    pump();
    return fail(error);
  }
  return {};
}

Status<std::errc> IwarpCm::accept(CmIdImpl& id, const ConnParam& param) {
  auto& state = state_of(id);
  if (id.state != CmIdImpl::State::request_received || state.agent_id == 0) return fail(std::errc::invalid_argument);
  if (param.private_data.size() > iw::kMaxPrivateData) return fail(std::errc::invalid_argument);
  if (!id.qp_impl && !id.claim_qp(param.qp_num)) return fail(std::errc::invalid_argument);
  id.state = CmIdImpl::State::accepting;
  auto accepted = agent_.accept(state.agent_id,
                                {.number = id.number,
                                 .ird = param.responder_resources,
                                 .ord = param.initiator_depth,
                                 .private_data = param.private_data},
                                core_now());
  pump();
  return accepted;
}

Status<std::errc> IwarpCm::reject(CmIdImpl& id, std::span<const std::uint8_t> private_data) {
  auto& state = state_of(id);
  if (id.state != CmIdImpl::State::request_received || state.agent_id == 0) return fail(std::errc::invalid_argument);
  auto rejected = agent_.reject(state.agent_id, private_data, core_now());
  if (!rejected) return rejected;
  id.state = CmIdImpl::State::idle;
  end_agent_id(id);
  pump();
  return {};
}

Status<std::errc> IwarpCm::disconnect(CmIdImpl& id) {
  auto& state = state_of(id);
  if (state.agent_id == 0) return fail(std::errc::not_connected);
  auto done = agent_.disconnect(state.agent_id, core_now());
  pump();
  return done;
}

Result<std::shared_ptr<QueuePairImpl>, std::errc> IwarpCm::create_qp(CmIdImpl& id, std::uint32_t pd,
                                                                      const QpInitAttr& attr) {
  // The QP takes the stream when the agent starts it (Action::start_stream).
  return std::make_shared<QueuePairImpl>(id.ctx, pd, attr);
}

Status<std::errc> IwarpCm::attach_qp(CmIdImpl&, const std::shared_ptr<QueuePairImpl>&) { return {}; }

void IwarpCm::release(CmIdImpl& id) {
  auto& state = state_of(id);
  if (state.agent_id != 0) {
    // The caller's QP outlives the id: it goes to ERROR with the connection, as iw_cm does.
    if (connection_of(state.agent_id) && !id.qp && id.qp_impl) id.qp_impl->engine->disconnect();
    agent_.destroy(state.agent_id, core_now());
    end_agent_id(id);
  }
  if (state.listen_pause_timer) ctx_.reactor.cancel_timer(*state.listen_pause_timer);
  state.listen_pause_timer.reset();
  if (state.listen_fd >= 0) {
    ctx_.reactor.remove(state.listen_fd);
    ::close(state.listen_fd);
    state.listen_fd = -1;
  }
  pump();
}

sockaddr_in IwarpCm::local_address(CmIdImpl& id) {
  if (auto conn = connection_of(state_of(id).agent_id); conn && conn->is_open()) return conn->local_address();
  return id.bound_address.value_or(sockaddr_in{});
}

void IwarpCm::add_stats(CmStats& stats) {
  const iw::IwarpCmAgentStats& s = agent_.stats();
  stats.collisions_won += s.collisions_won;
  stats.collisions_lost += s.collisions_lost;
  stats.delivered_requests += s.delivered_requests;
  stats.rejects_sent[static_cast<int>(RejectReason::collision)] += s.rejects_sent_collision;
  stats.rejects_sent[static_cast<int>(RejectReason::duplicate)] += s.rejects_sent_duplicate;
  stats.rejects_sent[static_cast<int>(RejectReason::application)] += s.rejects_sent_application;
  stats.rejects_received[static_cast<int>(RejectReason::collision)] += s.rejects_received_collision;
  stats.rejects_received[static_cast<int>(RejectReason::duplicate)] += s.rejects_received_duplicate;
  stats.rejects_received[static_cast<int>(RejectReason::application)] += s.rejects_received_application;
  stats.rejects_received[static_cast<int>(RejectReason::refused)] += s.rejects_received_refused;
  stats.accept_pauses += accept_pauses_;
  stats.backlog_refused += s.backlog_refused;
}

// --- the sockets ---

void IwarpCm::on_listen_readable(const std::weak_ptr<CmIdImpl>& weak) {
  auto listener = weak.lock();
  if (!listener) return;
  const int listen_fd = state_of(*listener).listen_fd;
  const iw::IwarpCmId agent_id = state_of(*listener).agent_id;
  for (;;) {
    sockaddr_in from{};
    socklen_t len = sizeof from;
    const int fd = ::accept4(listen_fd, reinterpret_cast<sockaddr*>(&from), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) pause_listener(*listener);
      return;  // EAGAIN, or a transient error (a connection reset in the queue): the next readiness retries
    }
    state_of(*listener).listen_pause = std::chrono::milliseconds(0);
    auto stream = agent_.handle_stream_accepted(agent_id, endpoint(from), core_now());
    pump();  // a stalled handshake the backlog displaced closes now
    if (!stream) {
      ::close(fd);  // over the backlog (B1): refuse rather than queue without bound
      continue;
    }
    auto conn = Connection::adopt(listener->ctx, fd, from, stream_callbacks(*stream));
    if (!conn) {
      agent_.handle_stream_closed(*stream, core_now());
      pump();
      continue;
    }
    streams_[*stream] = *conn;
    (*conn)->receive_pending();
  }
}

// Out of descriptors, the connection accept() could not take stays in the kernel's queue
// and the level-triggered listener would fire again at once: a spin for as long as the
// exhaustion lasts. The listener is unwatched instead and looked at again after a pause
// that doubles from 1 ms to 100 ms while accept() keeps failing. The connections that exist
// are served meanwhile; queued clients wait in the kernel's queue (docs/reliability.md,
// "Descriptor exhaustion").
void IwarpCm::pause_listener(CmIdImpl& listener) {
  auto& state = state_of(listener);
  if (state.listen_pause_timer || state.listen_fd < 0) return;
  ++accept_pauses_;
  state.listen_pause = std::clamp(state.listen_pause * 2, std::chrono::milliseconds(1), std::chrono::milliseconds(100));
  PEERCM_LOG(warn, "cm", "listener on port {}: out of descriptors at accept(); looking again in {} ms",
             ntohs(listener.bound_address.value_or(sockaddr_in{}).sin_port), state.listen_pause.count());
  (void)ctx_.reactor.modify(state.listen_fd, 0);
  std::weak_ptr<CmIdImpl> weak = listener.shared_from_this();
  state.listen_pause_timer =
      ctx_.reactor.add_timer(engine::Clock::now() + state.listen_pause, [this, weak] {
        auto id = weak.lock();
        if (!id) return;
        auto& resumed = state_of(*id);
        resumed.listen_pause_timer.reset();
        if (resumed.listen_fd >= 0) (void)ctx_.reactor.modify(resumed.listen_fd, EPOLLIN);
      });
}

Connection::Callbacks IwarpCm::stream_callbacks(StreamId stream) {
  Connection::Callbacks cb;
  cb.tcp_failed = [this, stream](int error) {
    agent_.handle_stream_failed(stream, error, core_now());
    pump();
  };
  cb.tcp_connected = [this, stream] { agent_.handle_stream_connected(stream); };
  cb.setup_bytes = [this, stream](std::span<const std::uint8_t> bytes) {
    const std::size_t used = agent_.handle_bytes(stream, bytes, core_now());
    pump();
    return used;
  };
  cb.qp_event = [this, stream](const core::QpEvent&) {
    agent_.handle_stream_down(stream, core_now());
    pump();
  };
  cb.closed = [this, stream] {
    streams_.erase(stream);
    agent_.handle_stream_closed(stream, core_now());
    pump();
  };
  return cb;
}

void IwarpCm::pump() {
  if (pumping_) return;
  pumping_ = true;
  for (;;) {
    if (auto action = agent_.poll_action()) {
      execute(*action);
      continue;
    }
    if (auto event = agent_.poll_event()) {
      deliver(*event);
      continue;
    }
    break;
  }
  pumping_ = false;
  arm_timer();
}

void IwarpCm::arm_timer() {
  const std::optional<core::Time> deadline = agent_.next_deadline();
  if (deadline == timer_deadline_) return;
  if (timer_) ctx_.reactor.cancel_timer(*timer_);
  timer_.reset();
  timer_deadline_ = deadline;
  if (!deadline) return;
  timer_ = ctx_.reactor.add_timer(std::chrono::steady_clock::time_point(deadline->time_since_epoch()), [this] {
    timer_.reset();
    timer_deadline_.reset();
    agent_.handle_timeout(core_now());
    pump();
  });
}

void IwarpCm::execute(iw::IwarpCmAction& action) {
  using Kind = iw::IwarpCmAction::Kind;
  if (action.kind == Kind::open_stream) {
    auto id = find(action.id);
    if (!id) {
      failed_open_ = {action.stream, std::errc::invalid_argument};
      return;
    }
    const int bound_fd = std::exchange(state_of(*id).reserved_fd, -1);
    auto conn = Connection::open(id->ctx, socket_address(action.destination),
                                 id->bound_address, stream_callbacks(action.stream), bound_fd);
    if (!conn) {
      failed_open_ = {action.stream, conn.error()};
      return;
    }
    streams_[action.stream] = *conn;
    return;
  }
  auto found = streams_.find(action.stream);
  if (found == streams_.end()) return;
  std::shared_ptr<Connection> conn = found->second;
  auto qp_of = [this](iw::IwarpCmId id) {
    auto cm_id = find(id);
    return cm_id ? cm_id->qp_impl : nullptr;
  };
  switch (action.kind) {
    case Kind::open_stream: break;
    case Kind::transmit: conn->send_setup(action.bytes); break;
    case Kind::start_stream: conn->start(qp_of(action.id), action.mpa, action.initiator); break;
    case Kind::terminate_stream: conn->terminate_setup(qp_of(action.id), action.mpa.crc, action.terminate_code); break;
    case Kind::close_stream:
      if (action.graceful) {
        conn->disconnect();
      } else {
        conn->abort();
      }
      break;
  }
}

void IwarpCm::deliver(iw::IwarpCmEvent& event) {
  using Kind = iw::IwarpCmEvent::Kind;
  if (event.kind == Kind::connect_request) {
    on_connect_request(event);
    return;
  }
  auto id = find(event.id);
  if (!id) return;  // its CmId is gone
  switch (event.kind) {
    case Kind::connect_request: break;
    case Kind::established: {
      id->state = CmIdImpl::State::established;
      id->peer = socket_address(event.peer);
      id->response_pending = id->qp_by_number;
      id->emit(id->qp_by_number ? CmEventType::connect_response : CmEventType::established, 0, event_param(event));
      break;
    }
    case Kind::rejected: {
      id->state = CmIdImpl::State::route_resolved;
      end_agent_id(*id);
      ConnParam param;
      param.private_data = std::move(event.private_data);
      id->emit(CmEventType::rejected, event.status, std::move(param), reject_reason(event.reason));
      break;
    }
    case Kind::unreachable:
      id->state = CmIdImpl::State::route_resolved;
      end_agent_id(*id);
      id->emit(CmEventType::unreachable, event.status);
      break;
    case Kind::connect_error: {
      const bool passive = id->state == CmIdImpl::State::accepting;
      id->state = passive ? CmIdImpl::State::disconnected : CmIdImpl::State::route_resolved;
      end_agent_id(*id);
      id->emit(CmEventType::connect_error, event.status, {}, reject_reason(event.reason));
      break;
    }
    case Kind::disconnected: id->emit_disconnected(); break;
    case Kind::timewait_exit: id->emit(CmEventType::timewait_exit); break;
  }
}

// CONNECT_REQUEST: a new CmId for the agent's new id, owned by the application from the event on.
void IwarpCm::on_connect_request(iw::IwarpCmEvent& event) {
  auto listener = find(event.listener);
  if (!listener || !listener->owner) {
    agent_.destroy(event.id, core_now());
    return;
  }
  auto child_impl = std::make_shared<CmIdImpl>(listener->ctx, listener->channel, listener->user_context, *this,
                                               std::make_unique<IwarpIdState>());
  child_impl->public_context = listener->public_context;
  child_impl->state = CmIdImpl::State::request_received;
  child_impl->peer_to_peer = event.peer_to_peer;
  child_impl->crc = listener->crc;
  child_impl->tag = event.tag;
  child_impl->connect_timeout_ms = listener->connect_timeout_ms;
  child_impl->peer = socket_address(event.peer);
  state_of(*child_impl).agent_id = event.id;
  ids_[event.id] = child_impl;
  listener->push_connect_request(child_impl, event_param(event),
                                 event.peer_to_peer ? "p2p, no colliding attempt" : "client/server");
}

core::iwarp::IwarpCmAgent::Backlog iwarp_backlog(CmId& listener) {
  CmIdImpl& impl = listener.impl();
  std::lock_guard lock(impl.ctx->mutex);
  auto* cm = dynamic_cast<IwarpCm*>(impl.cm);
  if (cm == nullptr) return {};
  return cm->agent().backlog_of(state_of(impl).agent_id);
}

}  // namespace peercm::detail
