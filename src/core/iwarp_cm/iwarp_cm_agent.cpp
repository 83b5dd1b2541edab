// The iWARP CM agent: ids, streams, the listener backlog and the MPA handshakes. The p2p
// binding (what each resolver action means over MPA) is iwarp_cm_agent_p2p.cpp.
#include "core/iwarp_cm/iwarp_cm_agent.hpp"

#include <algorithm>
#include <cerrno>

#include "wire/cm_header.hpp"

namespace peercm::core::iwarp {

IwarpCmAgent::IwarpCmAgent(const IwarpCmAgentConfig& config) : config_(config), resolver_(config.identity) {}

MpaConfig IwarpCmAgent::mpa_config(CrcPolicy crc, std::uint16_t ird, std::uint16_t ord, Duration timeout) {
  MpaConfig config;
  config.crc = crc;
  config.enhanced = true;
  // R9 (docs/p2p.md, "RTR on every connection"): every enhanced Request offers the RFC 6581 RTR
  // types, whatever the id's collision model, so the passive side may speak first on
  // client/server connections too. The collision model travels in the CM header (R1).
  config.peer_to_peer = true;
  config.ird = ird;
  config.ord = ord;
  config.timeout = timeout;
  return config;
}

std::vector<std::uint8_t> IwarpCmAgent::cm_header(std::uint32_t tag, AttemptId number,
                                                  std::span<const std::uint8_t> application) const {
  std::vector<std::uint8_t> bytes(wire::kCmHeaderSize);
  const wire::CmHeader header{.node_guid = config_.identity.guid,
                              .incarnation = config_.identity.incarnation,
                              .listen_port = p2p_listen_port_,
                              .tag = tag,
                              .cmid = number};
  [[maybe_unused]] auto n = wire::encode_cm_header(header, bytes);
  bytes.insert(bytes.end(), application.begin(), application.end());
  return bytes;
}

IwarpCmAgent::Id* IwarpCmAgent::find_id(IwarpCmId id) {
  auto it = ids_.find(id);
  return it == ids_.end() ? nullptr : &it->second;
}

IwarpCmAgent::Stream* IwarpCmAgent::find_stream(StreamId stream) {
  auto it = streams_.find(stream);
  return it == streams_.end() ? nullptr : &it->second;
}

StreamId IwarpCmAgent::stream_of(IwarpCmId id) const {
  auto it = ids_.find(id);
  return it == ids_.end() ? 0 : it->second.stream;
}

IwarpCmAgent::Backlog IwarpCmAgent::backlog_of(IwarpCmId listener) const {
  auto it = ids_.find(listener);
  if (it == ids_.end()) return {};
  return {.pending = it->second.backlog.held(), .handshaking = it->second.handshaking.size()};
}

// ---------------------------------------------------------------------------------------------
// Inputs: the application

IwarpCmId IwarpCmAgent::listen(const IwarpListenParams& params) {
  const IwarpCmId id = next_id_++;
  Id record;
  record.state = IdState::listening;
  record.listen = params;
  if (record.listen.backlog <= 0) record.listen.backlog = 1;
  record.backlog = ListenBacklog(static_cast<std::size_t>(record.listen.backlog));
  ids_.emplace(id, std::move(record));
  // R2: the node advertises its first listener's port in every CM header.
  if (p2p_listen_port_ == 0) {
    p2p_listen_port_ = params.port;
    p2p_listener_ = id;
  }
  return id;
}

Result<IwarpCmId, std::errc> IwarpCmAgent::connect(const IwarpConnectParams& params, Time now,
                                                   const TakeBack& take_back) {
  const std::size_t limit = kMaxPrivateData - (params.peer_to_peer ? wire::kCmHeaderSize : 0);
  if (params.private_data.size() > limit || params.ird > 0x3FFF || params.ord > 0x3FFF)
    return fail(std::errc::invalid_argument);
  const IwarpCmId id = next_id_++;
  const StreamId stream = new_stream();
  Id record;
  record.state = IdState::connecting;
  record.peer_to_peer = params.peer_to_peer;
  record.connect = params;
  if (params.peer_to_peer) {
    // R2: an attempt's key is (destination address, destination port, tag).
    record.key = P2pKey{params.destination.address, params.destination.port, params.tag};
    record.p2p_attempt = true;
    // R5 and its unseen-request refinement: the resolver decides; taking the CONNECT_REQUEST
    // back from the application is the only part that is the API's.
    auto take_back_request = [&](LinkId link) {
      Stream* s = find_stream(link);
      if (s == nullptr || s->phase != StreamPhase::requested || s->owner == 0) return false;
      const IwarpCmId request = s->owner;
      if (!take_back || !take_back(request)) return false;
      ids_.erase(request);
      s->owner = 0;
      s->phase = StreamPhase::parked;
      if (stats_.delivered_requests > 0) --stats_.delivered_requests;
      return true;
    };
    auto admitted = resolver_.connect(record.key, params.number, stream, now + params.timeout, now, take_back_request);
    if (!admitted) return fail(admitted.error());
    attempts_[params.number] = id;
    ids_.emplace(id, std::move(record));
    // A taken-back request that wins rule 3 binds the attempt now: nothing is dialled.
    run_resolver(now);
    if (!resolver_.attempt_dials(params.number, stream)) return id;
  } else {
    ids_.emplace(id, std::move(record));
  }
  Id& placed = ids_.at(id);
  placed.stream = stream;
  Stream s;
  s.phase = StreamPhase::connecting;
  s.owner = id;
  s.peer = params.destination;
  s.opened_at = now;
  s.p2p = params.peer_to_peer;
  s.key = placed.key;
  // R1: the CM header leads the private data of a p2p request.
  const std::vector<std::uint8_t> private_data =
      params.peer_to_peer ? cm_header(params.tag, params.number, params.private_data) : params.private_data;
  s.initiator.emplace(mpa_config(params.crc, params.ird, params.ord, params.timeout), private_data, now);
  auto& inserted = streams_.emplace(stream, std::move(s)).first->second;
  push(IwarpCmAction{.kind = IwarpCmAction::Kind::open_stream, .stream = stream, .id = id,
                     .destination = params.destination});
  sync_deadline(stream, inserted);
  drain_handshake(stream, now);
  return id;
}

Status<std::errc> IwarpCmAgent::accept(IwarpCmId id, const IwarpAcceptParams& params, Time now) {
  Id* record = find_id(id);
  if (record == nullptr || record->state != IdState::requested) return fail(std::errc::invalid_argument);
  Stream* s = find_stream(record->stream);
  if (s == nullptr || !s->responder) return fail(std::errc::invalid_argument);
  if (params.private_data.size() > kMaxPrivateData) return fail(std::errc::invalid_argument);
  record->state = IdState::accepting;
  release_charge(*s);  // B1: the application holds it now
  const StreamId stream = record->stream;
  // R1: a p2p requester learns our identity and CmId number from the Reply.
  const std::vector<std::uint8_t> reply =
      record->peer_to_peer ? cm_header(record->key.tag, params.number, params.private_data) : params.private_data;
  if (record->peer_to_peer) resolver_.handle_request_accepted(stream);
  s->phase = StreamPhase::requested;
  s->responder->accept(params.ird, params.ord, reply);
  drain_handshake(stream, now);
  if (record->peer_to_peer) run_resolver(now);
  return {};
}

Status<std::errc> IwarpCmAgent::reject(IwarpCmId id, std::span<const std::uint8_t> private_data, Time now) {
  Id* record = find_id(id);
  if (record == nullptr || record->state != IdState::requested) return fail(std::errc::invalid_argument);
  Stream* s = find_stream(record->stream);
  if (s == nullptr || !s->responder) return fail(std::errc::invalid_argument);
  if (private_data.size() > kMaxPrivateData) return fail(std::errc::invalid_argument);
  ++stats_.rejects_sent_application;
  const StreamId stream = record->stream;
  s->responder->reject(private_data);
  flush_transmit(stream, *s);
  if (record->peer_to_peer) {
    resolver_.handle_request_rejected(stream);
    resolver_.handle_link_closed(stream);
  }
  abandon(stream, /*graceful=*/true);
  ids_.erase(id);
  run_resolver(now);
  return {};
}

Status<std::errc> IwarpCmAgent::disconnect(IwarpCmId id, Time /*now*/) {
  Id* record = find_id(id);
  if (record == nullptr) return fail(std::errc::not_connected);
  switch (record->state) {
    case IdState::listening:
    case IdState::requested: return fail(std::errc::invalid_argument);
    case IdState::disconnected: return {};
    case IdState::connecting:
    case IdState::accepting:
    case IdState::established: break;
  }
  Stream* s = find_stream(record->stream);
  if (s == nullptr) return fail(std::errc::not_connected);
  emit_disconnected(id, *record);
  close_stream(record->stream, *s, /*graceful=*/true);
  return {};
}

void IwarpCmAgent::destroy(IwarpCmId id, Time now) {
  Id* record = find_id(id);
  if (record == nullptr) return;
  if (record->state == IdState::listening) {
    for (const StreamId stream : std::vector<StreamId>(record->handshaking)) abandon(stream, /*graceful=*/false);
    // The node stops advertising a port nobody listens on (R2).
    if (p2p_listener_ == id) {
      p2p_listener_ = 0;
      p2p_listen_port_ = 0;
    }
    ids_.erase(id);
    return;
  }
  // The attempt's end goes to the resolver before its link's close (docs/p2p-resolver.md, 5).
  end_p2p(id);
  record = find_id(id);
  if (record == nullptr) return;
  if (record->stream != 0 && find_stream(record->stream) != nullptr) abandon(record->stream, /*graceful=*/false);
  ids_.erase(id);
  run_resolver(now);
}

// ---------------------------------------------------------------------------------------------
// Inputs: the streams

std::optional<StreamId> IwarpCmAgent::handle_stream_accepted(IwarpCmId listener, const Endpoint& peer, Time now) {
  Id* l = find_id(listener);
  if (l == nullptr || l->state != IdState::listening) return std::nullopt;
  // B1: the stream counts from now until its request is held by the application or answered;
  // without room (in total, or in the source's share) it makes room only by closing a stalled
  // handshake, else it is refused.
  if (!l->backlog.has_room(peer.address) && !displace_stalled_handshake(*l, peer.address, now)) {
    ++stats_.backlog_refused;
    return std::nullopt;
  }
  l->backlog.admit(peer.address);
  const StreamId stream = new_stream();
  Stream s;
  s.phase = StreamPhase::handshaking;
  s.listener = listener;
  s.peer = peer;
  s.opened_at = now;
  s.tcp_connected = true;
  s.charged = true;
  s.responder.emplace(mpa_config(l->listen.crc, 16, 16, l->listen.handshake_timeout), now);
  auto& inserted = streams_.emplace(stream, std::move(s)).first->second;
  l->handshaking.push_back(stream);
  sync_deadline(stream, inserted);
  return stream;
}

void IwarpCmAgent::handle_stream_connected(StreamId stream) {
  if (Stream* s = find_stream(stream)) s->tcp_connected = true;
}

void IwarpCmAgent::handle_stream_failed(StreamId stream, int error, Time now) {
  Stream* s = find_stream(stream);
  if (s == nullptr || s->phase != StreamPhase::connecting) return;
  const IwarpCmId id = s->owner;
  forget_stream(stream);
  tcp_failed(id, error, now);
}

// The TCP connect of an id's Request failed: REJECTED when refused (nobody listens), else
// UNREACHABLE; the attempt ends after its event (docs/p2p.md, Rules, R3).
void IwarpCmAgent::tcp_failed(IwarpCmId id, int error, Time now) {
  Id* record = find_id(id);
  if (record == nullptr) return;
  record->stream = 0;
  if (error == ECONNREFUSED) {
    ++stats_.rejects_received_refused;
    push(IwarpCmEvent{.kind = IwarpCmEvent::Kind::rejected, .id = id, .status = ECONNREFUSED,
                      .reason = IwarpEndReason::refused});
  } else {
    push(IwarpCmEvent{.kind = IwarpCmEvent::Kind::unreachable, .id = id, .status = error});
  }
  end_p2p(id);
  ids_.erase(id);
  run_resolver(now);
}

std::size_t IwarpCmAgent::handle_bytes(StreamId stream, std::span<const std::uint8_t> bytes, Time now) {
  Stream* s = find_stream(stream);
  if (s == nullptr || s->phase == StreamPhase::running || s->phase == StreamPhase::closing) return 0;
  s->heard = true;
  s->tcp_connected = true;
  const std::size_t used = s->initiator ? s->initiator->handle_bytes(bytes) : s->responder->handle_bytes(bytes);
  drain_handshake(stream, now);
  return used;
}

void IwarpCmAgent::handle_stream_down(StreamId stream, Time /*now*/) {
  Stream* s = find_stream(stream);
  if (s == nullptr || s->owner == 0) return;
  if (Id* record = find_id(s->owner)) emit_disconnected(s->owner, *record);
}

void IwarpCmAgent::handle_stream_closed(StreamId stream, Time now) {
  Stream* s = find_stream(stream);
  if (s == nullptr) return;
  if (s->phase != StreamPhase::running && s->phase != StreamPhase::closing) {
    // During setup: the handshake fails (connection_closed), which ends whatever it served.
    if (s->initiator) s->initiator->handle_connection_closed();
    if (s->responder) s->responder->handle_connection_closed();
    drain_handshake(stream, now);
    if (find_stream(stream) != nullptr) forget_stream(stream);
    run_resolver(now);
    return;
  }
  const IwarpCmId id = s->owner;
  const bool p2p = s->p2p;
  forget_stream(stream);
  Id* record = find_id(id);
  if (record != nullptr) {
    if (record->state == IdState::established) emit_disconnected(id, *record);
    if (record->disconnected_reported && !record->timewait_until) {
      record->timewait_until = now + config_.timewait;
      timewaits_.emplace(*record->timewait_until, id);
    }
  }
  if (p2p) resolver_.handle_link_closed(stream);
  run_resolver(now);
}

void IwarpCmAgent::handle_timeout(Time now) {
  while (!handshake_deadlines_.empty() && handshake_deadlines_.begin()->first <= now) {
    const StreamId stream = handshake_deadlines_.begin()->second;
    handshake_deadlines_.erase(handshake_deadlines_.begin());
    Stream* s = find_stream(stream);
    if (s == nullptr) continue;
    s->deadline.reset();
    if (s->initiator && !s->tcp_connected) {
      // The connect timeout bounds the TCP connect too: nobody answered the SYN.
      const IwarpCmId id = s->owner;
      abandon(stream, /*graceful=*/false);
      tcp_failed(id, ETIMEDOUT, now);
      continue;
    }
    if (s->initiator) s->initiator->handle_timeout(now);
    if (s->responder) s->responder->handle_timeout(now);
    drain_handshake(stream, now);
  }
  resolver_.handle_timeout(now);
  run_resolver(now);
  while (!timewaits_.empty() && timewaits_.begin()->first <= now) {
    const IwarpCmId id = timewaits_.begin()->second;
    timewaits_.erase(timewaits_.begin());
    if (find_id(id) != nullptr) push(IwarpCmEvent{.kind = IwarpCmEvent::Kind::timewait_exit, .id = id});
  }
}

// ---------------------------------------------------------------------------------------------
// Outputs

std::optional<IwarpCmAction> IwarpCmAgent::poll_action() {
  if (actions_.empty()) return std::nullopt;
  IwarpCmAction action = std::move(actions_.front());
  actions_.pop_front();
  return action;
}

std::optional<IwarpCmEvent> IwarpCmAgent::poll_event() {
  if (events_.empty()) return std::nullopt;
  IwarpCmEvent event = std::move(events_.front());
  events_.pop_front();
  return event;
}

std::optional<Time> IwarpCmAgent::next_deadline() const {
  std::optional<Time> next = resolver_.next_deadline();
  auto consider = [&next](Time t) {
    if (!next || t < *next) next = t;
  };
  if (!handshake_deadlines_.empty()) consider(handshake_deadlines_.begin()->first);
  if (!timewaits_.empty()) consider(timewaits_.begin()->first);
  return next;
}

// ---------------------------------------------------------------------------------------------
// Handshakes

void IwarpCmAgent::sync_deadline(StreamId stream, Stream& s) {
  const std::optional<Time> deadline = s.initiator ? s.initiator->deadline() : s.responder->deadline();
  if (deadline == s.deadline) return;
  if (s.deadline) handshake_deadlines_.erase({*s.deadline, stream});
  s.deadline = deadline;
  if (deadline) handshake_deadlines_.emplace(*deadline, stream);
}

void IwarpCmAgent::flush_transmit(StreamId stream, Stream& s) {
  const std::span<const std::uint8_t> pending =
      s.initiator ? s.initiator->pending_transmit() : s.responder->pending_transmit();
  if (pending.empty()) return;
  push(IwarpCmAction{.kind = IwarpCmAction::Kind::transmit, .stream = stream, .id = s.owner,
                     .bytes = std::vector<std::uint8_t>(pending.begin(), pending.end())});
  if (s.initiator) {
    s.initiator->consume_transmit(pending.size());
  } else {
    s.responder->consume_transmit(pending.size());
  }
}

void IwarpCmAgent::drain_handshake(StreamId stream, Time now) {
  for (;;) {
    Stream* s = find_stream(stream);
    if (s == nullptr) return;
    sync_deadline(stream, *s);
    std::optional<MpaEvent> event = s->initiator ? s->initiator->poll_event() : s->responder->poll_event();
    if (!event) {
      flush_transmit(stream, *s);
      return;
    }
    // The frame that ends the handshake (a Reply, a reject Reply) leaves before anything else.
    flush_transmit(stream, *s);
    switch (event->kind) {
      case MpaEvent::Kind::request_received: on_request(stream, now); break;
      case MpaEvent::Kind::established: on_established(stream, event->result, now); break;
      case MpaEvent::Kind::rejected: on_rejected(stream, event->result, now); return;
      case MpaEvent::Kind::failed: on_failed(stream, *event, now); return;
    }
  }
}

// A complete Request on a listener's stream. R1: a p2p request names its sender in the CM
// header (whatever its RFC 6581 A flag says); the resolver places it. Any other request is
// client/server: CONNECT_REQUEST. Either stays charged to the backlog until held or answered (B1).
void IwarpCmAgent::on_request(StreamId stream, Time now) {
  Stream& s = streams_.at(stream);
  Id* l = find_id(s.listener);
  if (l != nullptr) std::erase(l->handshaking, stream);
  if (l == nullptr || l->state != IdState::listening) {
    abandon(stream, /*graceful=*/false);
    return;
  }
  const MpaResult& request = s.responder->request();
  if (auto header = wire::decode_cm_header(request.peer_private_data)) {
    const std::uint16_t port = header->header.listen_port;
    // R2: (TCP source address, advertised listening port, tag); a sender without a listener
    // is told apart by its node.
    s.key = P2pKey{s.peer.address, port, header->header.tag, port == 0 ? header->header.node_guid : 0};
    s.p2p = true;
    s.peer_node = NodeIdentity{header->header.node_guid, header->header.incarnation};
    s.peer_cmid = header->header.cmid;
    s.phase = StreamPhase::parked;
    resolver_.handle_request(s.key, stream, s.peer_node, s.peer_cmid, now);
    run_resolver(now);
    return;
  }
  deliver(stream, s.listener, request.peer_private_data);
}

// CONNECT_REQUEST: a new id for the request on `stream`.
void IwarpCmAgent::deliver(StreamId stream, IwarpCmId listener, std::span<const std::uint8_t> app_data) {
  Stream& s = streams_.at(stream);
  const IwarpCmId id = next_id_++;
  Id record;
  record.state = IdState::requested;
  record.stream = stream;
  record.listener = listener;
  record.peer_to_peer = s.p2p;
  record.key = s.key;
  record.peer_incarnation = s.peer_node.incarnation;
  ids_.emplace(id, std::move(record));
  s.owner = id;
  s.phase = StreamPhase::requested;
  const MpaResult& request = s.responder->request();
  push(IwarpCmEvent{.kind = IwarpCmEvent::Kind::connect_request,
                    .id = id,
                    .listener = listener,
                    .private_data = std::vector<std::uint8_t>(app_data.begin(), app_data.end()),
                    .peer_ird = request.peer_ird,
                    .peer_ord = request.peer_ord,
                    .peer = s.peer,
                    .peer_to_peer = s.p2p,
                    .tag = s.key.tag,
                    .stream = stream});
}

void IwarpCmAgent::on_established(StreamId stream, const MpaResult& result, Time now) {
  Stream& s = streams_.at(stream);
  const IwarpCmId id = s.owner;
  Id* record = find_id(id);
  if (record == nullptr) {
    abandon(stream, /*graceful=*/false);
    return;
  }
  s.phase = StreamPhase::running;
  push(IwarpCmAction{.kind = IwarpCmAction::Kind::start_stream, .stream = stream, .id = id, .mpa = result,
                     .initiator = s.initiator.has_value()});
  IwarpCmEvent event{.kind = IwarpCmEvent::Kind::established,
                     .id = id,
                     .private_data = result.peer_private_data,
                     .peer_ird = result.peer_ird,
                     .peer_ord = result.peer_ord,
                     .peer = s.peer,
                     .stream = stream};
  record->state = IdState::established;
  if (s.p2p) {
    // R1, R6: a p2p peer's accepting Reply (or its request, on the passive side) starts with
    // its CM header: its incarnation and CmId number on this link.
    std::optional<AttemptId> peer_cmid;
    if (auto header = wire::decode_cm_header(result.peer_private_data)) {
      record->peer_incarnation = header->header.incarnation;
      peer_cmid = header->header.cmid;
      event.private_data.assign(header->application_data.begin(), header->application_data.end());
    } else if (record->p2p_attempt) {
      event.private_data.clear();
    }
    if (record->p2p_attempt) {
      record->p2p_attempt = false;
      attempts_.erase(record->connect.number);
    }
    if (peer_cmid) {
      resolver_.handle_established(record->key, stream, record->peer_incarnation, *peer_cmid);
    } else {
      resolver_.handle_established(record->key, stream, record->peer_incarnation);
    }
  }
  push(std::move(event));
  if (s.p2p) run_resolver(now);
}

void IwarpCmAgent::on_rejected(StreamId stream, const MpaResult& result, Time now) {
  const IwarpCmId id = streams_.at(stream).owner;
  Id* record = find_id(id);
  abandon(stream, /*graceful=*/true);
  if (record == nullptr) return;
  record->stream = 0;
  if (record->p2p_attempt) {
    if (auto reason = wire::decode_cm_reject(result.peer_private_data)) {
      // R3, R6: a collision (or duplicate) reject is the CM's business, not the application's:
      // the attempt waits for the peer's own request.
      ++(*reason == wire::CmRejectReason::collision ? stats_.rejects_received_collision
                                                    : stats_.rejects_received_duplicate);
      resolver_.handle_attempt_rejected_by_cm(record->connect.number);
      run_resolver(now);
      return;
    }
  }
  ++stats_.rejects_received_application;
  push(IwarpCmEvent{.kind = IwarpCmEvent::Kind::rejected, .id = id, .status = ECONNREFUSED,
                    .reason = IwarpEndReason::application, .private_data = result.peer_private_data});
  end_p2p(id);  // after the ending event (R3: a request the attempt held goes on after it)
  ids_.erase(id);
  run_resolver(now);
}

void IwarpCmAgent::on_failed(StreamId stream, const MpaEvent& event, Time now) {
  Stream& s = streams_.at(stream);
  const IwarpCmId id = s.owner;
  const StreamPhase phase = s.phase;
  const bool p2p = s.p2p;
  if (event.send_terminate) {
    // RFC 6581 §8: 2/0/6 or 2/0/7 go out as a Terminate before the connection closes.
    push(IwarpCmAction{.kind = IwarpCmAction::Kind::terminate_stream, .stream = stream, .id = id,
                       .mpa = event.result,
                       .terminate_code = static_cast<std::uint8_t>(
                           event.failure == MpaFailure::insufficient_ird ? 0x06 : 0x07)});
    forget_stream(stream);
  } else {
    abandon(stream, /*graceful=*/true);
  }
  if (phase == StreamPhase::parked && p2p) {
    resolver_.handle_link_closed(stream);
    run_resolver(now);
    return;
  }
  Id* record = find_id(id);
  if (id == 0 || record == nullptr) return;
  record->stream = 0;
  const IwarpEndReason reason = event.failure == MpaFailure::timeout             ? IwarpEndReason::timeout
                                : event.failure == MpaFailure::markers_requested ? IwarpEndReason::markers
                                                                                 : IwarpEndReason::invalid;
  push(IwarpCmEvent{.kind = IwarpCmEvent::Kind::connect_error, .id = id,
                    .status = event.failure == MpaFailure::timeout ? ETIMEDOUT : ECONNRESET, .reason = reason});
  // After the ending event, as above; the attempt's end before its link's close
  // (docs/p2p-resolver.md, decision 5: a close alone would leave the attempt waiting).
  end_p2p(id);
  if (p2p) resolver_.handle_link_closed(stream);
  ids_.erase(id);
  run_resolver(now);
}

// B1: peers that connect and say nothing, or drip their Request byte by byte, would hold a full
// backlog until the handshake timeout and lock legitimate clients out (a slowloris flood): the
// oldest silent handshake makes room, else the oldest whose Request is still incomplete after
// the grace period. When `source` is over its own share, only its own handshakes are candidates:
// closing another peer's would not make room for it.
bool IwarpCmAgent::displace_stalled_handshake(Id& listener, std::uint32_t source, Time now) {
  const bool own_only = listener.backlog.source_is_full(source);
  auto candidate = [&](const Stream& s) { return !own_only || s.peer.address == source; };
  std::optional<StreamId> victim;
  for (const StreamId stream : listener.handshaking) {
    const Stream& s = streams_.at(stream);
    if (candidate(s) && !s.heard) {
      victim = stream;
      break;
    }
  }
  if (!victim) {
    for (const StreamId stream : listener.handshaking) {
      const Stream& s = streams_.at(stream);
      if (candidate(s) && s.opened_at + config_.partial_request_grace < now) {
        victim = stream;
        break;
      }
    }
  }
  if (!victim) return false;
  ++stats_.backlog_displaced;
  abandon(*victim, /*graceful=*/false);
  return listener.backlog.has_room(source);
}

// B1: the stream's request is held by the application or answered; it leaves the backlog.
void IwarpCmAgent::release_charge(Stream& s) {
  if (!s.charged) return;
  s.charged = false;
  if (Id* l = find_id(s.listener); l != nullptr && l->state == IdState::listening) l->backlog.release(s.peer.address);
}

// ---------------------------------------------------------------------------------------------
// Streams and ids

// Forgets a stream's record: its handshake deadline, and its place in a listener's backlog
// while it is still a handshake.
void IwarpCmAgent::forget_stream(StreamId stream) {
  auto it = streams_.find(stream);
  if (it == streams_.end()) return;
  Stream& s = it->second;
  if (s.deadline) handshake_deadlines_.erase({*s.deadline, stream});
  if (s.phase == StreamPhase::handshaking) {
    if (Id* l = find_id(s.listener)) std::erase(l->handshaking, stream);
  }
  release_charge(s);
  streams_.erase(it);
}

// Closes a stream the agent is done with; nothing more is heard of it.
void IwarpCmAgent::abandon(StreamId stream, bool graceful) {
  push(IwarpCmAction{.kind = IwarpCmAction::Kind::close_stream, .stream = stream, .graceful = graceful});
  forget_stream(stream);
}

// Closes a started stream and waits for handle_stream_closed (TIMEWAIT follows).
void IwarpCmAgent::close_stream(StreamId stream, Stream& s, bool graceful) {
  if (s.phase != StreamPhase::running) {
    // Not started: there is no data path to flush; its close is heard like any other.
    if (s.initiator) s.initiator->handle_connection_closed();
    if (s.responder) s.responder->handle_connection_closed();
    // Drop the handshake's event: the id already reported DISCONNECTED.
    while ((s.initiator ? s.initiator->poll_event() : s.responder->poll_event())) {
    }
    if (s.deadline) handshake_deadlines_.erase({*s.deadline, stream});
    s.deadline.reset();
  }
  s.phase = StreamPhase::closing;
  push(IwarpCmAction{.kind = IwarpCmAction::Kind::close_stream, .stream = stream, .id = s.owner, .graceful = graceful});
}

// The id's p2p attempt ends (R8: reported before its link closes) and its link leaves the
// resolver.
void IwarpCmAgent::end_p2p(IwarpCmId id) {
  Id* record = find_id(id);
  if (record == nullptr) return;
  if (record->p2p_attempt) {
    record->p2p_attempt = false;
    attempts_.erase(record->connect.number);
    resolver_.handle_attempt_ended(record->connect.number);
  }
  if (record->stream != 0) {
    Stream* s = find_stream(record->stream);
    if (s != nullptr && s->p2p) resolver_.handle_link_closed(record->stream);
  }
}

void IwarpCmAgent::emit_disconnected(IwarpCmId id, Id& record) {
  if (record.disconnected_reported) return;
  record.disconnected_reported = true;
  record.state = IdState::disconnected;
  push(IwarpCmEvent{.kind = IwarpCmEvent::Kind::disconnected, .id = id, .stream = record.stream});
}

}  // namespace peercm::core::iwarp
