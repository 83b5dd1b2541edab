// The IB CM agent: application calls, MAD routing (roce-ibcm-wire.md §4.6), connection
// bookkeeping and the translation of connection events into application events. The p2p
// resolver binding is in ibcm_agent_p2p.cpp.
#include "core/ibcm/ibcm_agent.hpp"

#include <algorithm>
#include <variant>

#include "core/ibcm/ibcm_p2p_header.hpp"
#include "wire/byte_io.hpp"
#include "wire/cm_header.hpp"
#include "wire/ibcm/rdma_cm_ip.hpp"

namespace peercm::core::ibcm {

namespace w = wire::ibcm;
using EventKind = IbCmAgentEvent::Kind;

namespace {

template <class... F>
struct Overloaded : F... {
  using F::operator()...;
};
template <class... F>
Overloaded(F...) -> Overloaded<F...>;

std::uint32_t to_u32(const Ipv4Address& a) {
  return (std::uint32_t{a[0]} << 24) | (std::uint32_t{a[1]} << 16) | (std::uint32_t{a[2]} << 8) | a[3];
}

Ipv4Address to_ipv4(std::uint32_t v) {
  return {static_cast<std::uint8_t>(v >> 24), static_cast<std::uint8_t>(v >> 16),
          static_cast<std::uint8_t>(v >> 8), static_cast<std::uint8_t>(v)};
}


}  // namespace

IbCmAgent::IbCmAgent(const IbCmAgentConfig& config)
    : config_(config),
      gid_(w::ipv4_mapped_gid(config.address)),
      resolver_(config.identity),
      next_comm_id_(config.first_comm_id) {}

// ---------------------------------------------------------------------------------------------
// Application

void IbCmAgent::listen(std::uint16_t port) { listeners_.insert(port); }

void IbCmAgent::stop_listening(std::uint16_t port) { listeners_.erase(port); }

// The REQ of an attempt: none when its fields do not fit rdma_cm's header.
std::optional<IbCmRequestParams> IbCmAgent::request_of(const IbCmConnectParams& params) const {
  // §6: rdma_cm's header first; the p2p header and the application's bytes are its payload.
  std::vector<std::uint8_t> payload;
  if (params.peer_to_peer) {
    payload.resize(kP2pHeaderSize);
    encode_p2p_header({.tag = params.tag, .incarnation = config_.identity.incarnation}, payload);
  }
  payload.insert(payload.end(), params.private_data.begin(), params.private_data.end());
  IbCmRequestParams req{.service_id = w::rdma_ip_service_id(w::RdmaPortSpace::tcp, params.port),
                        .qpn = params.qpn,
                        .starting_psn = params.starting_psn,
                        .responder_resources = params.responder_resources,
                        .initiator_depth = params.initiator_depth,
                        .retry_count = params.retry_count,
                        .rnr_retry_count = params.rnr_retry_count,
                        .path_mtu = params.path_mtu,
                        .local_gid = gid_,
                        .remote_gid = w::ipv4_mapped_gid(params.destination)};
  req.private_data.resize(w::kReqPrivateDataSize);
  const std::uint16_t source_port = params.source_port != 0 ? params.source_port : params.port;
  if (!w::encode_cma_private_data(w::CmaHeader::ipv4(config_.address, source_port, params.destination),
                                  payload, req.private_data)) {
    return std::nullopt;
  }
  return req;
}

Result<IbCmId, std::errc> IbCmAgent::connect(const IbCmConnectParams& params, Time now, const TakeBack& take_back,
                                             const CheckConnection& check) {
  const std::size_t max = params.peer_to_peer ? kMaxP2pConnectPrivateData : kMaxConnectPrivateData;
  if (params.private_data.size() > max || params.qpn > 0xFFFFFF) return fail(std::errc::invalid_argument);
  if (params.peer_to_peer && attempts_.contains(params.qpn)) return fail(std::errc::invalid_argument);
  const std::optional<IbCmRequestParams> req = request_of(params);
  if (!req) return fail(std::errc::invalid_argument);

  Id record{.phase = Id::Phase::connecting,
            .active = true,
            .p2p = params.peer_to_peer,
            .key = {.address = to_u32(params.destination), .port = params.port, .tag = params.tag},
            .qpn = params.qpn,
            .params = std::make_unique<const IbCmConnectParams>(params)};
  LinkId link = 0;
  if (params.peer_to_peer) {
    // R5 (docs/p2p.md, Rules) before anything goes out: EISCONN / EALREADY, or the
    // unseen-request rule.
    link = next_link_++;
    const Duration timeout = params.connect_timeout.value_or(config_.connect_timeout);
    auto take_back_link = [this, &take_back](LinkId request_link) { return take_back_request(request_link, take_back); };
    // R5b: the established connection of the key is checked by whoever runs its QP.
    auto check_link = [this, &check](LinkId established) { return check_connection(established, check); };
    if (auto status = resolver_.connect(record.key, params.qpn, link, now + timeout, now, take_back_link,
                                        check ? P2pResolver::CheckLink(check_link) : P2pResolver::CheckLink());
        !status) {
      return fail(status.error());
    }
    if (!resolver_.attempt_dials(params.qpn, link)) {
      // A taken-back REQ that wins R3 binds the attempt at once, and an attempt waiting on a
      // check (R5b) dials only if the connection ends: our REQ does not go out now.
      const IbCmId id = next_id_++;
      attempts_[params.qpn] = id;
      record.pending_attempt = true;
      ids_.emplace(id, std::move(record));
      drain_resolver(now);
      return id;
    }
  }
  const std::uint32_t comm = new_conn();
  Conn& conn = conns_.at(comm);
  if (!conn.cm.connect(*req, now)) {
    conns_.erase(comm);
    if (link != 0) resolver_.handle_attempt_ended(params.qpn);
    drain_resolver(now);
    return fail(std::errc::invalid_argument);
  }
  const IbCmId id = next_id_++;
  conn.owner = id;
  conn.link = link;
  if (link != 0) {
    link_conn_[link] = comm;
    attempts_[params.qpn] = id;
    record.pending_attempt = true;
  }
  record.conn = comm;
  if (!params.peer_to_peer) {
    // One rule for every active attempt (CmOption::connect_timeout): the resolver bounds a p2p
    // one (R8); a client/server one ends here, even while the IB CM would still resend.
    record.connect_deadline = now + params.connect_timeout.value_or(config_.connect_timeout);
    connect_deadlines_.emplace(*record.connect_deadline, id);
  }
  ids_.emplace(id, std::move(record));
  sync(comm, now);
  drain_resolver(now);
  return id;
}

Status<std::errc> IbCmAgent::accept(IbCmId id, const IbCmAcceptParams& params, Time now) {
  if (sidr_in_.contains(id)) {
    if (params.private_data.size() > kMaxSidrReplyPrivateData || params.qpn > 0xFFFFFF)
      return fail(std::errc::invalid_argument);
    answer_sidr(id, w::SidrStatus::valid, params.qpn, params.qkey, params.private_data, now);
    return {};
  }
  Id* record = find_id(id);
  if (record == nullptr || record->active || record->phase != Id::Phase::requested || record->conn == 0) {
    return fail(std::errc::invalid_argument);
  }
  const std::size_t max = record->p2p ? kMaxP2pAcceptPrivateData : kMaxAcceptPrivateData;
  if (params.private_data.size() > max) return fail(std::errc::invalid_argument);
  IbCmReplyParams reply{.qpn = params.qpn,
                        .starting_psn = params.starting_psn,
                        .responder_resources = params.responder_resources,
                        .initiator_depth = params.initiator_depth,
                        .rnr_retry_count = params.rnr_retry_count,
                        .private_data = record->p2p ? reply_private_data(record->key.tag, params.private_data)
                                                    : params.private_data};
  const std::uint32_t comm = record->conn;
  Conn& conn = conns_.at(comm);
  if (auto status = conn.cm.accept(reply, now); !status) return status;
  record->phase = Id::Phase::accepted;
  push_event(peer_event(EventKind::reply_sent, id, conn));
  if (record->p2p && conn.link != 0) resolver_.handle_request_accepted(conn.link);
  sync(comm, now);
  drain_resolver(now);
  return {};
}

Status<std::errc> IbCmAgent::reject(IbCmId id, std::span<const std::uint8_t> private_data, Time now) {
  if (sidr_in_.contains(id)) {
    // The SIDR_REP's private data area is 136 bytes: more is cut, as rdma_reject's 255 allow.
    answer_sidr(id, w::SidrStatus::rejected, 0, 0, private_data.first(std::min(private_data.size(), kMaxSidrReplyPrivateData)), now);
    return {};
  }
  Id* record = find_id(id);
  if (record == nullptr || record->active || record->phase != Id::Phase::requested || record->conn == 0) {
    return fail(std::errc::invalid_argument);
  }
  const std::uint32_t comm = record->conn;
  Conn& conn = conns_.at(comm);
  // §6: rdma_reject is REJ reason 28 with the caller's private data.
  if (auto status = conn.cm.reject(w::rej_reason::kConsumerReject, private_data, now); !status) return status;
  if (record->p2p && conn.link != 0) resolver_.handle_request_rejected(conn.link);
  detach(comm);
  end_id(id);
  sync(comm, now);
  drain_resolver(now);
  return {};
}

Status<std::errc> IbCmAgent::disconnect(IbCmId id, Time now) {
  Id* record = find_id(id);
  if (record == nullptr || record->phase != Id::Phase::established || record->conn == 0) {
    return fail(std::errc::invalid_argument);
  }
  const std::uint32_t comm = record->conn;
  Conn& conn = conns_.at(comm);
  if (auto status = conn.cm.disconnect({}, now); !status) return status;
  record->phase = Id::Phase::closing;
  if (conn.link != 0) {
    // The application gave the connection up: its p2p key is free for a new connect at once
    // (docs/p2p.md R5 counts connections, not DREQ exchanges).
    if (record->p2p) resolver_.handle_link_closed(conn.link);
    link_conn_.erase(conn.link);
    conn.link = 0;
  }
  sync(comm, now);
  drain_resolver(now);
  return {};
}

void IbCmAgent::destroy(IbCmId id, Time now) {
  if (sidr_in_.contains(id)) {
    // ib_destroy_cm_id on an unanswered SIDR request rejects it.
    answer_sidr(id, w::SidrStatus::rejected, 0, 0, {}, now);
    return;
  }
  if (auto out = sidr_out_ids_.find(id); out != sidr_out_ids_.end()) {
    sidr_out_.erase(out->second);
    sidr_out_ids_.erase(out);
    return;
  }
  Id* record = find_id(id);
  if (record == nullptr) return;
  const std::uint32_t comm = record->conn;
  if (record->p2p) {
    // The resolver hears of the attempt before its link's close (its API's order).
    if (record->pending_attempt) resolver_.handle_attempt_ended(record->qpn);
    if (comm != 0) {
      Conn& conn = conns_.at(comm);
      if (conn.link != 0 && record->phase == Id::Phase::requested) {
        resolver_.handle_request_rejected(conn.link);
      } else if (conn.link != 0) {
        resolver_.handle_link_closed(conn.link);
      }
    }
  }
  if (comm != 0) conns_.at(comm).cm.abort(now);
  end_id(id);
  if (comm != 0) sync(comm, now);
  drain_resolver(now);
}

// ---------------------------------------------------------------------------------------------
// Network and time

void IbCmAgent::handle_mad(const Gid& from, std::span<const std::uint8_t> mad, Time now) {
  ++stats_.mads_received;
  if (w::is_sidr_mad(mad)) {
    handle_sidr_mad(from, mad, now);
    return;
  }
  auto decoded = w::decode_cm_mad(mad);
  if (!decoded) {
    ++stats_.malformed;  // §1.3: dropped and counted
    return;
  }
  const std::uint64_t tid = decoded->transaction_id;
  // Messages other than REQ name our comm ID and, once we know it, the peer's (§4.6).
  auto routed = [&](std::uint32_t local, std::uint32_t peer, auto&& handle) {
    Conn* conn = find_conn(local, peer);
    if (conn == nullptr) {
      ++stats_.unmatched;
      return;
    }
    const std::uint32_t comm = conn->cm.local_comm_id();
    handle(conn->cm);
    sync(comm, now);
  };
  std::visit(Overloaded{
                 [&](const w::CmReq& m) { on_req(m, tid, mad, from, now); },
                 [&](const w::CmRep& m) { on_rep(m, tid, from, now); },
                 [&](const w::CmRtu& m) {
                   routed(m.remote_comm_id, m.local_comm_id, [&](IbCmConnection& c) { c.handle_rtu(m, now); });
                 },
                 [&](const w::CmMra& m) {
                   routed(m.remote_comm_id, m.local_comm_id, [&](IbCmConnection& c) { c.handle_mra(m, now); });
                 },
                 [&](const w::CmRej& m) { on_rej(m, now); },
                 [&](const w::CmDreq& m) { on_dreq(m, tid, from, now); },
                 [&](const w::CmDrep& m) {
                   routed(m.remote_comm_id, m.local_comm_id, [&](IbCmConnection& c) { c.handle_drep(m, now); });
                 },
             },
             decoded->message);
  drain_resolver(now);
}

void IbCmAgent::on_req(const w::CmReq& req, std::uint64_t tid, std::span<const std::uint8_t> mad,
                       const Gid& from, Time now) {
  const RemoteKey remote{req.local_ca_guid, req.local_comm_id};
  // §4.6: a REQ whose (comm ID, CA GUID) we know is a duplicate of that connection's.
  if (auto it = by_remote_.find(remote); it != by_remote_.end()) {
    ++stats_.duplicate_reqs;
    const std::uint32_t comm = it->second;
    conns_.at(comm).cm.handle_req(req, tid, now);
    sync(comm, now);
    return;
  }
  // §5 active side: the losing REQ and every copy of it are discarded without a word.
  if (pending_by_remote_.contains(remote)) {
    ++stats_.p2p_dropped;
    return;
  }
  // A copy of a REQ whose exchange is over (dropped, rejected, or its connection ended): the
  // timewait rule for IDs (§4.6) applied to the peer's.
  if (auto it = tombstones_.find(remote); it != tombstones_.end() && it->second > now) {
    ++stats_.unmatched;
    return;
  }
  // docs/reliability.md, "CM answers": a REQ's path names the address it came from, or it
  // is refused. Every answer of this agent goes to the address a datagram came from, so a
  // REQ cannot aim them at a third party.
  const auto refuse_address = [&] {
    ++stats_.rejected_address;
    send_answer(w::CmRej{.remote_comm_id = req.local_comm_id,
                         .message_rejected = w::RejTarget::req,
                         .reason = w::rej_reason::kInvalidPrimaryGid},
                tid, from);
  };
  if (req.primary.local_gid != from) {
    refuse_address();
    return;
  }
  auto service = w::decode_rdma_ip_service_id(req.service_id);
  if (!service || service->port_space != w::RdmaPortSpace::tcp || !listeners_.contains(service->port)) {
    // §4.6: no listener for the Service ID → REJ 8.
    ++stats_.rejected_no_service;
    send_answer(w::CmRej{.remote_comm_id = req.local_comm_id,
                         .message_rejected = w::RejTarget::req,
                         .reason = w::rej_reason::kInvalidServiceId},
                tid, from);
    return;
  }
  auto cma = w::decode_cma_private_data(req.private_data);
  if (!cma || cma->header.ip_version != 4) {
    // §6: rdma_cm refuses an unknown header version or IP version; IPv6 is not done here.
    send_answer(w::CmRej{.remote_comm_id = req.local_comm_id,
                         .message_rejected = w::RejTarget::req,
                         .reason = w::rej_reason::kConsumerReject},
                tid, from);
    return;
  }
  const std::uint32_t source = to_u32(w::CmaHeader::ipv4_of(cma->header.source_ip));
  if (w::ipv4_mapped_gid(w::CmaHeader::ipv4_of(cma->header.source_ip)) != from) {  // rdma_cm's header too
    refuse_address();
    return;
  }
  if (auto p2p = decode_p2p_header(cma->application_data)) {
    // docs/p2p.md R2: the key is (source address, advertised listening port, tag).
    const P2pKey key{.address = source, .port = cma->header.source_port, .tag = p2p->header.tag};
    on_p2p_req(req, mad, key, p2p->header.incarnation, now);
    return;
  }
  // §4.9 stale connection: the REQ names a (QPN, CA GUID) we hold connected.
  if (stale(req.local_ca_guid, req.local_qpn, 0, now)) {
    send_answer(w::CmRej{.remote_comm_id = req.local_comm_id,
                         .message_rejected = w::RejTarget::req,
                         .reason = w::rej_reason::kStaleConnection},
                tid, from);
    return;
  }
  open_passive(req, tid, {.address = source, .port = cma->header.source_port}, 0, 0, false, now);
}

IbCmId IbCmAgent::open_passive(const w::CmReq& req, std::uint64_t tid, const P2pKey& key, LinkId link,
                               std::uint64_t incarnation, bool p2p, Time now) {
  const std::uint32_t comm = new_conn();
  Conn& conn = conns_.at(comm);
  conn.cm.handle_req(req, tid, now);  // §4.9 LISTEN: REQ → REQ_RCVD
  const IbCmId id = next_id_++;
  conn.owner = id;
  conn.link = link;
  if (link != 0) link_conn_[link] = comm;
  ids_.emplace(id, Id{.phase = Id::Phase::requested,
                      .active = false,
                      .p2p = p2p,
                      .key = key,
                      .conn = comm,
                      .peer_incarnation = incarnation});
  IbCmAgentEvent event = peer_event(EventKind::connect_request, id, conn);
  event.private_data = request_app_data(req.private_data, p2p);
  if (auto service = w::decode_rdma_ip_service_id(req.service_id)) event.service_port = service->port;
  push_event(std::move(event));
  sync(comm, now);
  return id;
}

void IbCmAgent::on_rep(const w::CmRep& rep, std::uint64_t tid, const Gid& from, Time now) {
  Conn* conn = find_conn(rep.remote_comm_id, rep.local_comm_id);
  if (conn == nullptr) {
    ++stats_.unmatched;
    return;
  }
  const std::uint32_t comm = conn->cm.local_comm_id();
  if (conn->cm.state() == IbCmState::req_sent || conn->cm.state() == IbCmState::mra_req_rcvd) {
    Id* owner = find_id(conn->owner);
    const auto header = decode_p2p_header(rep.private_data);
    if (owner != nullptr && owner->p2p && header) {
      // A p2p REP names the peer's incarnation: rule 6 replaces connections across
      // incarnations, so QPNs are only compared within one (the resolver does that).
      owner->peer_incarnation = header->header.incarnation;
    } else if (stale(rep.local_ca_guid, rep.local_qpn, comm, now)) {
      // §4.9 stale connection: REJ 10 to the REP; our REQ_SENT carries on (its timer decides).
      send_answer(w::CmRej{.local_comm_id = comm,
                           .remote_comm_id = rep.local_comm_id,
                           .message_rejected = w::RejTarget::rep,
                           .reason = w::rej_reason::kStaleConnection},
                  tid, from);
      return;
    }
  }
  conns_.at(comm).cm.handle_rep(rep, now);
  sync(comm, now);
}

void IbCmAgent::on_rej(const w::CmRej& rej, Time now) {
  Conn* conn = rej.remote_comm_id != 0 ? find_conn(rej.remote_comm_id, rej.local_comm_id) : nullptr;
  if (conn == nullptr && rej.reason == w::rej_reason::kTimeout && rej.ari.size() == 8) {
    // §4.6: a REJ(timeout) from a peer that never learnt our comm ID is found by (ARI = its CA
    // GUID, its comm ID).
    const RemoteKey remote{wire::load_be64(rej.ari.data()), rej.local_comm_id};
    if (auto it = by_remote_.find(remote); it != by_remote_.end()) {
      conn = &conns_.at(it->second);
    } else if (auto p = pending_by_remote_.find(remote); p != pending_by_remote_.end()) {
      // The sender of a REQ the resolver holds gave up on it (rule 8 at the peer).
      const LinkId link = p->second;
      take_pending(link);
      remember_dropped(remote, now);
      resolver_.handle_link_closed(link);
      return;
    }
  }
  if (conn == nullptr) {
    ++stats_.unmatched;
    return;
  }
  const std::uint32_t comm = conn->cm.local_comm_id();
  conn->cm.handle_rej(rej, now);
  sync(comm, now);
}

void IbCmAgent::on_dreq(const w::CmDreq& dreq, std::uint64_t tid, const Gid& from, Time now) {
  Conn* conn = find_conn(dreq.remote_comm_id, dreq.local_comm_id);
  if (conn == nullptr) {
    // §4.9: a DREQ for a connection we do not know gets a DREP built from it.
    ++stats_.unmatched;
    send_answer(w::CmDrep{.local_comm_id = dreq.remote_comm_id, .remote_comm_id = dreq.local_comm_id}, tid, from);
    return;
  }
  const std::uint32_t comm = conn->cm.local_comm_id();
  conn->cm.handle_dreq(dreq, tid, now);
  sync(comm, now);
}

void IbCmAgent::handle_timeout(Time now) {
  std::vector<std::uint32_t> due;
  for (const auto& [at, comm] : timers_) {
    if (at > now) break;
    due.push_back(comm);
  }
  for (std::uint32_t comm : due) {
    auto it = conns_.find(comm);
    if (it == conns_.end()) continue;
    it->second.cm.handle_timeout(now);
    sync(comm, now);
  }
  expire_connect_deadlines(now);
  resolver_.handle_timeout(now);
  sidr_timeout(now);
  expire_tombstones(now);
  drain_resolver(now);
}

// ---------------------------------------------------------------------------------------------
// Outputs

std::optional<OutboundMad> IbCmAgent::poll_mad() {
  if (next_mad_ == mads_.size()) {
    mads_.clear();
    next_mad_ = 0;
    return std::nullopt;
  }
  return mads_[next_mad_++];
}

std::optional<IbCmAgentEvent> IbCmAgent::poll_event() {
  if (next_event_ == events_.size()) {
    events_.clear();
    next_event_ = 0;
    return std::nullopt;
  }
  return std::move(events_[next_event_++]);
}

std::optional<Time> IbCmAgent::next_deadline() const {
  std::optional<Time> next = resolver_.next_deadline();
  auto earlier = [&next](Time t) {
    if (!next || t < *next) next = t;
  };
  if (!timers_.empty()) earlier(timers_.begin()->first);
  if (!tombstone_expiry_.empty()) earlier(tombstone_expiry_.begin()->first);
  if (!connect_deadlines_.empty()) earlier(connect_deadlines_.begin()->first);
  sidr_deadline(next);
  return next;
}

std::optional<IbCmState> IbCmAgent::state_of(IbCmId id) const {
  const IbCmConnection* conn = connection_of(id);
  if (conn == nullptr) return std::nullopt;
  return conn->state();
}

const IbCmConnection* IbCmAgent::connection_of(IbCmId id) const {
  auto it = ids_.find(id);
  if (it == ids_.end() || it->second.conn == 0) return nullptr;
  return &conns_.at(it->second.conn).cm;
}

// ---------------------------------------------------------------------------------------------
// Connections and ids

IbCmAgent::Conn* IbCmAgent::find_conn(std::uint32_t local_comm_id, std::uint32_t peer_comm_id) {
  auto it = conns_.find(local_comm_id);
  if (it == conns_.end()) return nullptr;
  const IbCmConnection& cm = it->second.cm;
  // §4.6: once the peer's comm ID is known, a message must carry it.
  if (cm.peer_known() && cm.peer().comm_id != peer_comm_id) return nullptr;
  return &it->second;
}

std::uint32_t IbCmAgent::take_comm_id() {
  const std::uint32_t fixed = config_.comm_id_fixed_bits;
  const auto advance = [&] { next_comm_id_ = (next_comm_id_ & fixed) | ((next_comm_id_ + 1) & ~fixed); };
  // At most one pass through the counting bits, should every ID there be in use.
  for (std::uint64_t tries = 0; tries <= (std::uint64_t{~fixed} + 1); ++tries) {
    if (next_comm_id_ != 0 && !conns_.contains(next_comm_id_) && !sidr_out_.contains(next_comm_id_)) break;
    advance();
  }
  const std::uint32_t comm = next_comm_id_;
  advance();
  return comm;
}

std::uint32_t IbCmAgent::new_conn() {
  // §4.6: a comm ID is not reused while messages of its connection may be in flight; counting
  // up through 2^32 IDs is that, and 0 stays "unknown".
  const std::uint32_t comm = take_comm_id();
  conns_.emplace(comm, Conn{.cm = IbCmConnection(comm, config_.identity.guid, config_.timing, config_.tid_high)});
  return comm;
}

void IbCmAgent::index_remote(std::uint32_t comm) {
  Conn& conn = conns_.at(comm);
  if (conn.indexed_remote || !conn.cm.peer_known()) return;
  conn.indexed_remote = by_remote_.emplace(remote_of(conn), comm).second;
}

// Passes a connection's MADs on and its events up, re-indexes its timer, frees it once done.
void IbCmAgent::handle_peer_unreachable(const Gid& peer, std::uint32_t local_comm_id, Time now) {
  auto it = conns_.find(local_comm_id);
  if (it == conns_.end()) return;
  const IbCmState before = it->second.cm.state();
  it->second.cm.handle_peer_unreachable(peer, now);
  if (it->second.cm.state() != before) ++stats_.peer_unreachable;
  sync(local_comm_id, now);
}

void IbCmAgent::sync(std::uint32_t comm, Time now) {
  for (;;) {
    auto it = conns_.find(comm);
    if (it == conns_.end()) return;
    while (auto mad = it->second.cm.poll_mad()) mads_.push_back(*mad);
    index_remote(comm);
    auto event = it->second.cm.poll_event();
    if (!event) break;
    on_conn_event(comm, *event, now);
  }
  auto it = conns_.find(comm);
  if (it == conns_.end()) return;
  Conn& conn = it->second;
  if (conn.indexed_deadline) timers_.erase({*conn.indexed_deadline, comm});
  conn.indexed_deadline = conn.cm.next_deadline();
  if (conn.indexed_deadline) timers_.emplace(*conn.indexed_deadline, comm);
  index_established(comm, conn);
  // R5's take-back needs the delivered REQ only in REQ_RCVD, which a connection never re-enters.
  if (conn.request_mad && conn.cm.state() != IbCmState::req_rcvd) conn.request_mad.reset();
  if (!conn.cm.finished()) return;
  if (conn.indexed_deadline) timers_.erase({*conn.indexed_deadline, comm});
  if (conn.indexed_remote) {
    by_remote_.erase(remote_of(conn));
    remember_dropped(remote_of(conn), now);
  }
  detach(comm);
  conns_.erase(it);
}

void IbCmAgent::on_conn_event(std::uint32_t comm, const IbCmEvent& event, Time now) {
  (void)now;
  Conn& conn = conns_.at(comm);
  Id* record = find_id(conn.owner);
  switch (event.kind) {
    case IbCmEvent::Kind::request_received:
    case IbCmEvent::Kind::reply_received:
      return;  // the agent acts where it handed the REQ in; it never asks to confirm a REP
    case IbCmEvent::Kind::established: {
      if (record == nullptr) return;
      record->phase = Id::Phase::established;
      unindex_connect_deadline(conn.owner, *record);
      if (record->pending_attempt) {
        attempts_.erase(record->qpn);
        record->pending_attempt = false;
      }
      record->params.reset();
      if (record->p2p && conn.link != 0) {
        resolver_.handle_established(record->key, conn.link, record->peer_incarnation, conn.cm.peer().qpn);
      }
      IbCmAgentEvent out = peer_event(EventKind::established, conn.owner, conn);
      if (conn.cm.active()) {
        // The REP's private data (the connection keeps none once established).
        const std::span<const std::uint8_t> rep_data = event.private_data;
        const auto header = record->p2p ? decode_p2p_header(rep_data) : std::nullopt;
        const auto app = header ? header->application_data : rep_data;
        out.private_data.assign(app.begin(), app.end());
      } else if (record->active) {
        // R3, passive peer: the attempt took over the peer's REQ and never sees its
        // CONNECT_REQUEST, so its ESTABLISHED carries the REQ's connect-time data (the RTU
        // has none), as the active peer's carries our REP's, and as over iWARP.
        out.private_data = std::move(record->bound_request_data);
        record->bound_request_data = {};
      } else {
        out.private_data = event.private_data;
      }
      push_event(std::move(out));
      return;
    }
    case IbCmEvent::Kind::rejected:
      conn_failed(comm, EventKind::rejected, event);
      return;
    case IbCmEvent::Kind::timed_out: {
      const bool unanswered = conn.cm.active() && (event.state == IbCmState::req_sent ||
                                                   event.state == IbCmState::mra_req_rcvd);
      conn_failed(comm, unanswered ? EventKind::unreachable : EventKind::connect_error, event);
      return;
    }
    case IbCmEvent::Kind::disconnected:
      if (record == nullptr) return;
      if (record->p2p && conn.link != 0) resolver_.handle_link_closed(conn.link);
      if (conn.link != 0) {
        link_conn_.erase(conn.link);
        conn.link = 0;
      }
      record->phase = Id::Phase::closing;
      if (!record->disconnect_reported) {
        record->disconnect_reported = true;
        push_event({.kind = EventKind::disconnected, .id = conn.owner, .private_data = event.private_data});
      }
      return;
    case IbCmEvent::Kind::timewait_exit: {
      if (record == nullptr) return;
      const IbCmId id = conn.owner;
      push_event({.kind = EventKind::timewait_exit, .id = id});
      detach(comm);
      end_id(id);
      return;
    }
  }
}

// Establishment failed on `comm`: the application hears of it unless docs/p2p.md R3 says
// the attempt lives on.
void IbCmAgent::conn_failed(std::uint32_t comm, EventKind kind, const IbCmEvent& event) {
  Conn& conn = conns_.at(comm);
  const IbCmId id = conn.owner;
  Id* record = find_id(id);
  if (record == nullptr) return;
  if (record->p2p && record->active) {
    if (!conn.cm.active()) {
      // Bound to the peer's REQ (rule 3 passive), which went away: the attempt waits for the
      // peer's next REQ until its deadline.
      resolver_.handle_link_closed(conn.link);
      detach(comm);
      return;
    }
    const bool cm_reject = kind == EventKind::rejected && event.reason == w::rej_reason::kConsumerReject &&
                           event.private_data.size() >= wire::kCmRejectSize &&
                           wire::decode_cm_reject(std::span(event.private_data).first(wire::kCmRejectSize));
    if (cm_reject) {
      // Rule 3 / 6: the peer's CM, not its application, turned our REQ down: never REJECTED.
      resolver_.handle_attempt_rejected_by_cm(record->qpn);
      detach(comm);
      return;
    }
    resolver_.handle_attempt_ended(record->qpn);  // before the link's close (resolver API)
  } else if (record->p2p && conn.link != 0) {
    resolver_.handle_link_closed(conn.link);
  }
  IbCmAgentEvent out{.kind = kind, .id = id, .reason = event.reason, .private_data = event.private_data,
                     .ari = event.ari};
  detach(comm);
  end_id(id);
  push_event(std::move(out));
}

void IbCmAgent::detach(std::uint32_t comm) {
  Conn& conn = conns_.at(comm);
  if (Id* record = find_id(conn.owner); record != nullptr && record->conn == comm) record->conn = 0;
  conn.owner = 0;
  if (conn.link != 0) {
    link_conn_.erase(conn.link);
    conn.link = 0;
  }
}

void IbCmAgent::end_id(IbCmId id) {
  auto it = ids_.find(id);
  if (it == ids_.end()) return;
  if (it->second.pending_attempt) attempts_.erase(it->second.qpn);
  unindex_connect_deadline(id, it->second);
  if (it->second.conn != 0) detach(it->second.conn);
  ids_.erase(it);
}

void IbCmAgent::unindex_connect_deadline(IbCmId id, Id& record) {
  if (!record.connect_deadline) return;
  connect_deadlines_.erase({*record.connect_deadline, id});
  record.connect_deadline.reset();
}

// A client/server attempt reached its connect timeout before ESTABLISHED: it ends as when its
// consumer gives up (§4.9: REJ(timeout) from REQ_SENT or MRA_REQ_RCVD, so that the passive side
// stops too), and as over iWARP: UNREACHABLE if the peer never spoke, CONNECT_ERROR after.
void IbCmAgent::expire_connect_deadlines(Time now) {
  while (!connect_deadlines_.empty() && connect_deadlines_.begin()->first <= now) {
    const IbCmId id = connect_deadlines_.begin()->second;
    Id& record = ids_.at(id);  // end_id and ESTABLISHED take the entry out
    const std::uint32_t comm = record.conn;
    const bool heard = comm != 0 && conns_.at(comm).cm.heard_from_peer();
    if (comm != 0) conns_.at(comm).cm.abort(now);
    end_id(id);
    if (comm != 0) sync(comm, now);
    push_event({.kind = heard ? EventKind::connect_error : EventKind::unreachable, .id = id});
  }
}

void IbCmAgent::push_event(IbCmAgentEvent event) { events_.push_back(std::move(event)); }

IbCmAgentEvent IbCmAgent::peer_event(EventKind kind, IbCmId id, const Conn& conn) const {
  const Id& record = ids_.at(id);
  return {.kind = kind,
          .id = id,
          .peer_address = to_ipv4(record.key.address),
          .port = record.key.port,
          .tag = record.key.tag,
          .peer_to_peer = record.p2p,
          .peer = conn.cm.peer(),
          .local_comm_id = conn.cm.local_comm_id()};
}

IbCmAgent::Id* IbCmAgent::find_id(IbCmId id) {
  auto it = ids_.find(id);
  return it == ids_.end() ? nullptr : &it->second;
}

void IbCmAgent::send_answer(const w::CmMessage& message, std::uint64_t tid, const Gid& to) {
  OutboundMad mad{.destination = to};
  // §3.3: an answer for no connection copies the received TID.
  if (w::encode_cm_mad({.transaction_id = tid, .message = message}, mad.bytes)) mads_.push_back(mad);
}

// §4.9: a REQ or REP naming a (QPN, CA GUID) we hold connected is stale: the old connection is
// disconnected (DREQ until DREP or retries, then TIMEWAIT).
bool IbCmAgent::stale(std::uint64_t guid, std::uint32_t qpn, std::uint32_t except_comm, Time now) {
  std::vector<std::uint32_t> old;
  for (auto it = established_by_qpn_.lower_bound({guid, qpn, 0});
       it != established_by_qpn_.end() && std::get<0>(*it) == guid && std::get<1>(*it) == qpn; ++it) {
    if (std::get<2>(*it) != except_comm) old.push_back(std::get<2>(*it));
  }
  for (std::uint32_t comm : old) {
    ++stats_.rejected_stale;
    Conn& conn = conns_.at(comm);
    if (Id* record = find_id(conn.owner)) {
      record->phase = Id::Phase::closing;
      record->disconnect_reported = true;  // the connection is gone for the application now
      push_event({.kind = EventKind::disconnected, .id = conn.owner});
    }
    if (conn.link != 0) {
      resolver_.handle_link_closed(conn.link);
      link_conn_.erase(conn.link);
      conn.link = 0;
    }
    (void)conn.cm.disconnect({}, now);
    sync(comm, now);
  }
  return !old.empty();
}

// Keeps established_by_qpn_ equal to the set of ESTABLISHED connections. A connection's peer
// (GUID, QPN) only changes on a REQ or REP, never while it is ESTABLISHED; every state change
// passes through sync(), which calls this.
void IbCmAgent::index_established(std::uint32_t comm, Conn& conn) {
  const bool established = conn.cm.state() == IbCmState::established && conn.cm.peer_known();
  if (established == conn.indexed_established) return;
  const auto entry = std::tuple{conn.cm.peer().guid, conn.cm.peer().qpn, comm};
  if (established) {
    established_by_qpn_.insert(entry);
  } else {
    established_by_qpn_.erase(entry);
  }
  conn.indexed_established = established;
}

void IbCmAgent::remember_dropped(const RemoteKey& remote, Time now) {
  const Time until = now + cm_time(config_.timing.timewait);
  auto [it, inserted] = tombstones_.try_emplace(remote, until);
  if (!inserted) {
    tombstone_expiry_.erase({it->second, remote});
    it->second = until;
  }
  tombstone_expiry_.emplace(until, remote);
  while (tombstones_.size() > kMaxTombstones) {
    ++stats_.tombstones_evicted;
    tombstones_.erase(tombstone_expiry_.begin()->second);
    tombstone_expiry_.erase(tombstone_expiry_.begin());
  }
}

void IbCmAgent::expire_tombstones(Time now) {
  while (!tombstone_expiry_.empty() && tombstone_expiry_.begin()->first <= now) {
    tombstones_.erase(tombstone_expiry_.begin()->second);
    tombstone_expiry_.erase(tombstone_expiry_.begin());
  }
}

}  // namespace peercm::core::ibcm
