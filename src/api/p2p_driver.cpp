#include "api/p2p_driver.hpp"

#include "api/cm_id_impl.hpp"
#include "api/connection.hpp"
#include "api/context_impl.hpp"
#include "wire/cm_header.hpp"

namespace peercm::detail {
namespace {

core::Time core_now() { return core::Time(std::chrono::steady_clock::now().time_since_epoch()); }

RejectReason reason_of(core::P2pRejectReason reason) {
  return reason == core::P2pRejectReason::collision ? RejectReason::collision : RejectReason::duplicate;
}

}  // namespace

P2pDriver::P2pDriver(ContextImpl& ctx)
    : ctx_(ctx), resolver_(core::NodeIdentity{ctx.node_guid, ctx.incarnation}) {}

void P2pDriver::park_request(core::LinkId link, std::shared_ptr<Connection> conn, std::shared_ptr<CmIdImpl> listener,
                             core::NodeIdentity peer, core::AttemptId peer_cmid) {
  parked_[link] = ParkedRequest{std::move(conn), listener, peer, peer_cmid};
}

P2pDriver::Reclaimed P2pDriver::reclaim_unseen_request(const core::P2pKey& key, std::optional<CmEvent>& retracted) {
  auto [first, last] = delivered_.equal_range(key);
  for (auto it = first; it != last;) {
    const core::LinkId link = it->second;
    auto child = unseen_request_owner(link);
    if (!child) {
      it = delivered_.erase(it);  // accepted, rejected or gone: never an unseen request again
      continue;
    }
    retracted = child->channel->retract_request(child->owner);
    if (!retracted) return {};  // the application has it: rule 5's EALREADY stands
    delivered_.erase(it);
    auto conn = std::move(child->connection);
    child->link = 0;
    child->state = CmIdImpl::State::idle;
    link_owners_.erase(link);
    resolver_.handle_request_rejected(link);
    resolver_.handle_link_closed(link);
    if (ctx_.stats.delivered_requests > 0) ctx_.stats.delivered_requests--;  // it never reached the app
    Reclaimed reclaimed{new_link(), child->peer_node, child->peer_cmid};
    park_request(reclaimed.link, conn, child->listener.lock(), reclaimed.peer, reclaimed.peer_cmid);
    Connection::Callbacks parked;
    parked.closed = [this, link = reclaimed.link] { link_closed(link); };
    conn->set_callbacks(std::move(parked));
    return reclaimed;
  }
  return {};
}

std::shared_ptr<CmIdImpl> P2pDriver::unseen_request_owner(core::LinkId link) const {
  const auto owner = link_owners_.find(link);
  if (owner == link_owners_.end()) return nullptr;
  auto child = owner->second.lock();
  if (!child || child->state != CmIdImpl::State::request_received || !child->connection) return nullptr;
  return child;
}

void P2pDriver::remember_delivered(const core::P2pKey& key, core::LinkId link) {
  // Entries go stale once their request is accepted, rejected or closed; sweep them when they
  // outnumber the live links, so the index stays proportional to them.
  if (delivered_.size() >= 2 * link_owners_.size() + 64)
    std::erase_if(delivered_, [this](const auto& entry) { return !unseen_request_owner(entry.second); });
  delivered_.emplace(key, link);
}

void P2pDriver::link_closed(core::LinkId link) {
  if (link == 0) return;
  parked_.erase(link);
  link_owners_.erase(link);
  resolver_.handle_link_closed(link);
  run();
}

void P2pDriver::run() {
  if (running_) return;
  running_ = true;
  while (auto action = resolver_.poll_action()) execute(*action);
  running_ = false;
  arm_timer();
}

void P2pDriver::arm_timer() {
  const std::optional<core::Time> deadline = resolver_.next_deadline();
  if (deadline == timer_deadline_) return;
  if (timer_) ctx_.reactor.cancel_timer(*timer_);
  timer_.reset();
  timer_deadline_ = deadline;
  if (!deadline) return;
  timer_ = ctx_.reactor.add_timer(std::chrono::steady_clock::time_point(deadline->time_since_epoch()), [this] {
    timer_.reset();
    timer_deadline_.reset();
    resolver_.handle_timeout(core_now());
    run();
  });
}

void P2pDriver::execute(const core::P2pAction& action) {
  switch (action.kind) {
    case core::P2pAction::Kind::deliver_request: deliver_request(action); break;
    case core::P2pAction::Kind::reject_request: reject_request(action); break;
    case core::P2pAction::Kind::accept_into_attempt: accept_into_attempt(action); break;
    case core::P2pAction::Kind::teardown_link: teardown_link(action); break;
    case core::P2pAction::Kind::attempt_failed: attempt_failed(action); break;
  }
}

// Rule 4: no local attempt for the key: the listener's application decides.
void P2pDriver::deliver_request(const core::P2pAction& action) {
  auto parked = parked_.find(action.link);
  if (parked == parked_.end()) return;
  ParkedRequest request = std::move(parked->second);
  parked_.erase(parked);
  auto listener = request.listener.lock();
  if (!listener || !request.connection->responder()) {
    request.connection->abort();
    resolver_.handle_link_closed(action.link);
    return;
  }
  ctx_.stats.delivered_requests++;
  auto app_data = wire::decode_cm_header(request.connection->responder()->request().peer_private_data);
  listener->deliver_request(request.connection,
                            app_data ? app_data->application_data : std::span<const std::uint8_t>{}, action.link,
                            action.key, request.peer, request.peer_cmid);
  remember_delivered(action.key, action.link);
}

// Rules 3 and 6: the losing or duplicate request is answered by the CM, never by the application.
void P2pDriver::reject_request(const core::P2pAction& action) {
  auto parked = parked_.find(action.link);
  if (parked == parked_.end()) return;
  auto conn = std::move(parked->second.connection);
  parked_.erase(parked);
  const RejectReason reason = reason_of(action.reason);
  ctx_.stats.rejects_sent[static_cast<int>(reason)]++;
  if (reason == RejectReason::collision) ctx_.stats.collisions_won++;
  std::array<std::uint8_t, wire::kCmRejectSize> reject{};
  [[maybe_unused]] auto n = wire::encode_cm_reject(
      action.reason == core::P2pRejectReason::collision ? wire::CmRejectReason::collision
                                                        : wire::CmRejectReason::duplicate,
      reject);
  conn->set_callbacks({});
  conn->reject(reject);
  resolver_.handle_link_closed(action.link);
}

// Rule 3, passive side: our attempt lost; its CmId and QP take over the peer's request (rule 7:
// work posted on that QP meanwhile runs on this connection).
void P2pDriver::accept_into_attempt(const core::P2pAction& action) {
  auto parked = parked_.find(action.link);
  auto attempt_it = attempts_.find(action.attempt);
  std::shared_ptr<CmIdImpl> id = attempt_it != attempts_.end() ? attempt_it->second.lock() : nullptr;
  if (parked == parked_.end() || !id) {
    if (parked != parked_.end()) {
      parked->second.connection->abort();
      parked_.erase(parked);
    }
    resolver_.handle_link_closed(action.link);
    if (id == nullptr) resolver_.handle_attempt_ended(action.attempt);
    return;
  }
  ParkedRequest request = std::move(parked->second);
  parked_.erase(parked);
  ctx_.stats.collisions_lost++;
  if (id->connection) {
    // The attempt's own connection ends silently; the QP it was to carry stays untouched.
    auto old = std::move(id->connection);
    old->set_callbacks({});
    old->bind_qp(nullptr);
    old->abort();
  }
  if (action.aborted_link) {
    link_owners_.erase(action.aborted_link);
    resolver_.handle_link_closed(action.aborted_link);
  }
  id->connection = request.connection;
  id->link = action.link;
  id->peer_incarnation = request.peer.incarnation;
  id->peer = request.connection->peer_address();
  link_owners_[action.link] = id;
  request.connection->set_callbacks(id->connection_callbacks(action.link));
  const auto reply = id->cm_header(id->connect_param.private_data);
  request.connection->accept(id->qp_impl, id->connect_param.responder_resources, id->connect_param.initiator_depth,
                             reply);
}

// Rule 6: the peer restarted; its old connection goes.
void P2pDriver::teardown_link(const core::P2pAction& action) {
  auto owner_it = link_owners_.find(action.link);
  if (owner_it == link_owners_.end()) return;
  auto id = owner_it->second.lock();
  link_owners_.erase(owner_it);
  if (!id || !id->connection) return;
  auto conn = id->connection;
  id->emit_disconnected();
  conn->disconnect();
}

// Rule 8: the attempt's deadline passed.
void P2pDriver::attempt_failed(const core::P2pAction& action) {
  auto attempt_it = attempts_.find(action.attempt);
  auto id = attempt_it != attempts_.end() ? attempt_it->second.lock() : nullptr;
  attempts_.erase(action.attempt);
  if (action.link) link_owners_.erase(action.link);
  if (!id) return;
  id->p2p_attempt = false;
  id->link = 0;
  if (id->connection) {
    auto conn = std::move(id->connection);
    conn->set_callbacks({});
    conn->bind_qp(nullptr);
    conn->abort();
  }
  id->state = CmIdImpl::State::route_resolved;
  id->emit(CmEventType::connect_error, ETIMEDOUT, {}, RejectReason::timeout);
}

}  // namespace peercm::detail
