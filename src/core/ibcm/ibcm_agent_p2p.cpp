// The IB CM binding of the p2p resolver (docs/p2p.md, Rules; roce-ibcm-wire.md §5): each p2p
// REQ is a resolver link, and each P2pAction becomes what the IB CM does with that REQ and the
// application's attempt. The decisions are the resolver's and core/p2p_executor runs them; only
// how they are carried out on the IB CM differs from the iWARP binding (R3's last sentence).
#include <cassert>
#include <variant>

#include "core/ibcm/ibcm_agent.hpp"
#include "core/ibcm/ibcm_p2p_header.hpp"
#include "wire/cm_header.hpp"
#include "wire/ibcm/rdma_cm_ip.hpp"

namespace peercm::core::ibcm {

namespace w = wire::ibcm;

namespace {

struct StoredReq {
  w::CmReq req;
  std::uint64_t tid = 0;
  std::uint64_t incarnation = 0;
};

// A pending REQ's MAD decoded again (it decoded when it arrived). Views point into `mad`.
std::optional<StoredReq> decode_stored(std::span<const std::uint8_t> mad) {
  auto decoded = w::decode_cm_mad(mad);
  if (!decoded || !std::holds_alternative<w::CmReq>(decoded->message)) return std::nullopt;
  StoredReq out{.req = std::get<w::CmReq>(decoded->message), .tid = decoded->transaction_id};
  if (auto cma = w::decode_cma_private_data(out.req.private_data)) {
    if (auto header = decode_p2p_header(cma->application_data)) out.incarnation = header->header.incarnation;
  }
  return out;
}

}  // namespace

void IbCmAgent::on_p2p_req(const w::CmReq& req, std::span<const std::uint8_t> mad, const P2pKey& key,
                           std::uint64_t incarnation, Time now) {
  const LinkId link = next_link_++;
  PendingRequest pending{.remote = {req.local_ca_guid, req.local_comm_id}};
  std::copy(mad.begin(), mad.end(), pending.mad.begin());
  pending_by_remote_[pending.remote] = link;
  pending_.emplace(link, pending);
  // Rule 3's order: (node GUID, attempt id) = the IB spec's (CA GUID, QPN), §5.
  resolver_.handle_request(key, link, NodeIdentity{.guid = req.local_ca_guid, .incarnation = incarnation},
                           req.local_qpn, now);
  // No action: the resolver holds the REQ (rule 3, active peer) — it stays pending, and its
  // copies are dropped (§5) until the resolver decides.
  drain_resolver(now);
}

// Rule 4: CONNECT_REQUEST on the listener, exactly as in client/server mode.
void IbCmAgent::deliver_request(const P2pAction& action, Time now) {
  auto pending = take_pending(action.link);
  if (!pending) return;
  auto stored = decode_stored(pending->mad);
  assert(stored);
  if (!stored) return;
  const IbCmId id = open_passive(stored->req, stored->tid, action.key, action.link, stored->incarnation, true, now);
  // R5's unseen-request rule may take it back while the application has not fetched it.
  if (Id* record = find_id(id); record != nullptr && record->conn != 0) conns_.at(record->conn).request_mad = std::make_unique<std::array<std::uint8_t, w::kMadSize>>(pending->mad);
}

// R5, the unseen-request rule: the delivered REQ on `link` goes back to waiting for the
// resolver, if the application has not fetched its connect_request. Its REQ_RCVD connection goes
// without a word (the sender's REQ just waits, as a held one does); copies of the REQ are held
// again meanwhile.
bool IbCmAgent::take_back_request(LinkId link, const TakeBack& take_back) {
  auto found = link_conn_.find(link);
  if (found == link_conn_.end()) return false;
  const std::uint32_t comm = found->second;
  Conn& conn = conns_.at(comm);
  const IbCmId request = conn.owner;
  Id* record = find_id(request);
  if (record == nullptr || record->phase != Id::Phase::requested || !conn.request_mad || !conn.indexed_remote ||
      conn.cm.state() != IbCmState::req_rcvd)
    return false;
  if (!take_back || !take_back(request)) return false;
  PendingRequest pending{.mad = *conn.request_mad, .remote = remote_of(conn)};
  detach(comm);
  ids_.erase(request);
  by_remote_.erase(pending.remote);
  if (conn.indexed_deadline) timers_.erase({*conn.indexed_deadline, comm});
  conns_.erase(comm);
  pending_by_remote_[pending.remote] = link;
  pending_.emplace(link, pending);
  return true;
}

// Rule 3 passive (§5): our attempt's REQ_SENT connection takes the peer's REQ — its REQ stops,
// its comm ID stays, so copies of our dead REQ look like duplicates of this connection at the
// peer — and answers it with a REP on the attempt's behalf. Without one (the attempt lost its
// REQ before), a new connection does the same.
void IbCmAgent::accept_into_attempt(const P2pAction& action, Time now) {
  auto pending = take_pending(action.link);
  auto at = attempts_.find(action.attempt);
  if (!pending || at == attempts_.end()) return;
  auto stored = decode_stored(pending->mad);
  assert(stored);
  if (!stored) return;
  const IbCmId id = at->second;
  Id& record = ids_.at(id);

  std::uint32_t comm = 0;
  if (action.aborted_link != 0) {
    if (auto own = link_conn_.find(action.aborted_link); own != link_conn_.end()) {
      const std::uint32_t own_comm = own->second;
      Conn& conn = conns_.at(own_comm);
      if (conn.cm.state() == IbCmState::req_sent || conn.cm.state() == IbCmState::mra_req_rcvd) {
        comm = own_comm;
        link_conn_.erase(own);
        conn.link = 0;
      } else {
        detach(own_comm);  // a bound REP_SENT connection of a replaced request: it goes
        conn.cm.abort(now);
        sync(own_comm, now);
      }
    }
  }
  if (comm == 0) comm = new_conn();
  Conn& conn = conns_.at(comm);
  conn.owner = id;
  conn.link = action.link;
  link_conn_[action.link] = comm;
  record.conn = comm;
  record.peer_incarnation = stored->incarnation;
  record.bound_request_data = request_app_data(stored->req.private_data, /*p2p=*/true);
  conn.cm.handle_req(stored->req, stored->tid, now);
  ++stats_.p2p_bound;
  assert(record.params);  // a pending attempt: not established yet
  const IbCmConnectParams& params = *record.params;
  (void)conn.cm.accept({.qpn = params.qpn,
                        .starting_psn = params.starting_psn,
                        .responder_resources = params.responder_resources,
                        .initiator_depth = params.initiator_depth,
                        .rnr_retry_count = params.rnr_retry_count,
                        .private_data = reply_private_data(params.tag, params.private_data)},
                       now);
  push_event(peer_event(IbCmAgentEvent::Kind::reply_sent, id, conn));
  sync(comm, now);
}

// Rules 3 and 6 over the IB CM: the losing REQ of a collision is dropped without a word (§5);
// a late duplicate gets REJ(consumer) carrying the CM reject "duplicate", as over iWARP, so its
// sender's attempt knows the CM — not the application — refused it.
void IbCmAgent::reject_request(const P2pAction& action, Time now) {
  auto pending = take_pending(action.link);
  if (!pending) return;
  remember_dropped(pending->remote, now);
  if (action.reason == P2pRejectReason::collision) {
    ++stats_.p2p_dropped;
    return;
  }
  ++stats_.p2p_duplicates;
  auto stored = decode_stored(pending->mad);
  if (!stored) return;
  std::array<std::uint8_t, wire::kCmRejectSize> reason{};
  if (!wire::encode_cm_reject(wire::CmRejectReason::duplicate, reason)) return;
  send_answer(w::CmRej{.remote_comm_id = stored->req.local_comm_id,
                       .message_rejected = w::RejTarget::req,
                       .reason = w::rej_reason::kConsumerReject,
                       .private_data = reason},
              stored->tid, stored->req.primary.local_gid);
}

// Rule 6: the peer restarted (or connects anew): the old connection goes, with DISCONNECTED on
// its id once the DREQ exchange ends; one not yet established ends its id at once.
void IbCmAgent::teardown_link(const P2pAction& action, Time now) {
  auto found = link_conn_.find(action.link);
  if (found == link_conn_.end()) return;
  const std::uint32_t comm = found->second;
  Conn& conn = conns_.at(comm);
  link_conn_.erase(found);
  conn.link = 0;
  switch (conn.cm.state()) {
    case IbCmState::established:
      // DISCONNECTED at once: the replacing request may establish before the DREQ exchange ends.
      if (Id* record = find_id(conn.owner)) {
        record->phase = Id::Phase::closing;
        record->disconnect_reported = true;
        push_event({.kind = IbCmAgentEvent::Kind::disconnected, .id = conn.owner});
      }
      (void)conn.cm.disconnect({}, now);
      break;
    case IbCmState::dreq_sent:
    case IbCmState::dreq_rcvd:
    case IbCmState::timewait:
    case IbCmState::idle:
      break;  // already going
    default: {
      const IbCmId id = conn.owner;
      detach(comm);
      conn.cm.abort(now);
      if (find_id(id) != nullptr) {
        end_id(id);
        push_event({.kind = IbCmAgentEvent::Kind::connect_error, .id = id});
      }
      break;
    }
  }
  sync(comm, now);
}

// Rule 8: CONNECT_ERROR at the deadline; whatever connection the attempt held is abandoned
// (REJ timeout to the peer, §4.9).
void IbCmAgent::attempt_failed(const P2pAction& action, Time now) {
  auto at = attempts_.find(action.attempt);
  if (at == attempts_.end()) return;
  const IbCmId id = at->second;
  if (const std::uint32_t comm = ids_.at(id).conn; comm != 0) {
    detach(comm);
    conns_.at(comm).cm.abort(now);
    sync(comm, now);
  }
  end_id(id);
  push_event({.kind = IbCmAgentEvent::Kind::connect_error, .id = id});
}

// R5b: only an established connection whose id is the application's can be checked, and only
// by whoever runs its QP (the caller's `check`).
bool IbCmAgent::check_connection(LinkId link, const CheckConnection& check) {
  auto found = link_conn_.find(link);
  if (found == link_conn_.end()) return false;
  const Conn& conn = conns_.at(found->second);
  const Id* record = find_id(conn.owner);
  if (record == nullptr || record->phase != Id::Phase::established || conn.cm.state() != IbCmState::established)
    return false;
  return check && check(conn.owner);
}

void IbCmAgent::handle_connection_alive(IbCmId id, Time now) {
  const Id* record = find_id(id);
  if (record == nullptr || !record->p2p || record->conn == 0) return;
  const LinkId link = conns_.at(record->conn).link;
  if (link == 0) return;
  resolver_.handle_link_alive(link);
  drain_resolver(now);
}

// R5b, outcome (c): the connection the attempt waited on ended without a new REQ: the attempt's
// own REQ goes out now, as connect() would have sent it.
void IbCmAgent::dial_attempt(const P2pAction& action, Time now) {
  auto at = attempts_.find(action.attempt);
  if (at == attempts_.end()) return;
  const IbCmId id = at->second;
  Id& record = ids_.at(id);
  assert(record.params);  // a pending attempt: not established yet
  const std::optional<IbCmRequestParams> req = request_of(*record.params);
  const std::uint32_t comm = new_conn();
  Conn& conn = conns_.at(comm);
  if (!req || !conn.cm.connect(*req, now)) {  // it fit at connect(): cannot fail now
    conns_.erase(comm);
    resolver_.handle_attempt_ended(action.attempt);
    end_id(id);
    push_event({.kind = IbCmAgentEvent::Kind::connect_error, .id = id});
    return;
  }
  conn.owner = id;
  conn.link = action.link;
  link_conn_[action.link] = comm;
  record.conn = comm;
  sync(comm, now);
}

// R5b, outcome (b): the peer answered on the connection, so it is the one we are connected to:
// the attempt ends as rule 5 says, EISCONN, as an event since connect() returned long ago.
void IbCmAgent::attempt_already_connected(const P2pAction& action, Time /*now*/) {
  auto at = attempts_.find(action.attempt);
  if (at == attempts_.end()) return;
  const IbCmId id = at->second;
  end_id(id);  // it held no connection of its own
  push_event({.kind = IbCmAgentEvent::Kind::connect_error, .id = id, .already_connected = true});
}

std::optional<IbCmAgent::PendingRequest> IbCmAgent::take_pending(LinkId link) {
  auto it = pending_.find(link);
  if (it == pending_.end()) return std::nullopt;
  PendingRequest out = it->second;
  pending_by_remote_.erase(out.remote);
  pending_.erase(it);
  return out;
}

// A p2p REP: the p2p header (the tag, and the incarnation rule 6 needs), then the
// application's bytes.
std::vector<std::uint8_t> IbCmAgent::reply_private_data(std::uint32_t tag,
                                                        std::span<const std::uint8_t> application) const {
  std::vector<std::uint8_t> out(kP2pHeaderSize);
  encode_p2p_header({.tag = tag, .incarnation = config_.identity.incarnation}, out);
  out.insert(out.end(), application.begin(), application.end());
  return out;
}

}  // namespace peercm::core::ibcm
