#include "api/roce/roce_cm.hpp"

#include <arpa/inet.h>

#include <algorithm>

#include "api/cm_id_impl.hpp"
#include "api/roce/roce_device.hpp"
#include "api/roce/roce_qp.hpp"
#include "engine/kernel_random.hpp"
#include "engine/log.hpp"

namespace peercm::detail::roce {

namespace {

using core::ibcm::IbCmAgentEvent;

// PMTU 4096 on loopback (lo's MTU is 64 KiB); 1024 elsewhere, so that a datagram fits a
// 1500-byte Ethernet MTU without fragmenting. Both ends apply the same rule to the same
// pair of addresses, so they agree without a field for it.
wire::roce::PathMtu path_mtu_between(Ipv4 local, Ipv4 remote) {
  return is_loopback(local) && is_loopback(remote) ? wire::roce::PathMtu::mtu4096 : wire::roce::PathMtu::mtu1024;
}

// The kernel's pool without a device to open: opening one per draw cost 8 % of 4000 connects.
std::uint32_t random_psn() { return engine::kernel_random_u32() & 0xFFFFFF; }

sockaddr_in socket_address(Ipv4 address, std::uint16_t port) {
  sockaddr_in out{};
  out.sin_family = AF_INET;
  out.sin_addr.s_addr = htonl(address);
  out.sin_port = htons(port);
  return out;
}

RoceIdState& st(CmIdImpl& id) { return static_cast<RoceIdState&>(*id.transport_state); }
const RoceIdState& st(const CmIdImpl& id) { return static_cast<const RoceIdState&>(*id.transport_state); }

// The listener's backlog no longer counts this id: its request is decided (or gone).
void release_pending(CmIdImpl& id) {
  RoceIdState& state = st(id);
  if (!state.counted_in_backlog) return;
  state.counted_in_backlog = false;
  if (auto l = state.listener.lock()) st(*l).backlog.release(state.peer_source);
}

RocePort* port_of(CmIdImpl& id) { return device_of(*id.ctx).find_port(st(id).address); }

// The agent is done with this id: later events about its number are not ours.
void end_agent_id(CmIdImpl& id) {
  if (st(id).agent_id == 0) return;
  device_of(*id.ctx).forget_id(st(id).address, st(id).agent_id);
  st(id).agent_id = 0;
}

void qp_to_error(CmIdImpl& id) {
  if (!id.qp_impl || !id.qp_impl->roce) return;
  id.qp_impl->roce->rc.modify_to_error();
  device_of(*id.ctx).touch(id.qp_impl->qp_num);
}

// RTR and RTS with what the REQ/REP exchange agreed: the active side when the REP arrives
// (ESTABLISHED), the passive side as its REP leaves (reply_sent), as rdma_accept does. A
// passive QP that waited for the RTU would drop the peer's first packets, which leave right
// behind the RTU and may overtake it, and the peer would resend them only on its local ACK
// timer (tens of milliseconds). Starting twice for the same peer is a no-op.
bool start_queue_pair(CmIdImpl& id, const IbCmAgentEvent& event) {
  if (!id.qp_impl && st(id).qpn_without_qp) return true;  // nothing to start
  if (!id.qp_impl || !id.qp_impl->roce) return false;
  // A QP runs for one peer QP: an R3 rebinding to a restarted peer's REQ cannot move it.
  if (st(id).started_for_qpn) return *st(id).started_for_qpn == event.peer.qpn;
  RoceQp& qp = *id.qp_impl->roce;
  qp.remote_address = from_bytes(event.peer_address);
  core::roce::RcConnectParams params;
  params.local_qpn = qp.qpn;
  params.remote_qpn = event.peer.qpn;
  params.send_psn = st(id).psn;
  params.recv_psn = event.peer.starting_psn;
  params.pmtu = path_mtu_between(qp.local_address, qp.remote_address);
  // Our reads in flight stay within what the peer keeps contexts for, and we keep as many
  // as we offered.
  params.max_rd_atomic = static_cast<std::uint8_t>(
      std::max(1, std::min<int>(st(id).param.initiator_depth, event.peer.responder_resources)));
  params.max_dest_rd_atomic = static_cast<std::uint8_t>(std::max<int>(1, st(id).param.responder_resources));
  params.rnr_retry = event.peer.rnr_retry_count & 7;
  params.local_ip = to_bytes(qp.local_address);
  params.remote_ip = event.peer_address;
  params.udp_source_port = qp.source_port;
  params.ack_delay = device_of(*id.ctx).options().ack_delay;
  params.keepalive_interval = device_of(*id.ctx).options().keepalive_interval;
  device_of(*id.ctx).touch(id.qp_impl->qp_num);
  if (!qp.rc.connect(params, now())) return false;
  st(id).started_for_qpn = event.peer.qpn;
  return true;
}

ConnParam event_param(const IbCmAgentEvent& event) {
  ConnParam param;
  param.private_data = event.private_data;
  // As the peer sees them (rdma_cm swaps them in events).
  param.responder_resources = event.peer.initiator_depth;
  param.initiator_depth = event.peer.responder_resources;
  param.qp_num = event.peer.qpn;
  return param;
}

void on_connect_request(RoceDevice& device, RocePort& port, IbCmAgentEvent& event) {
  // The listener of the service the REQ names (event.port is the peer's own listening port).
  auto listener = device.find_listener(port.address, event.service_port);
  if (!listener || !listener->owner) {
    (void)port.agent.reject(event.id, {}, now());
    return;
  }
  // B1: the backlog bounds the requests the application has not decided yet, client/server
  // and p2p alike, in total and per source; beyond it the REQ gets REJ 28, as the kernel's does
  // for librdmacm. (A p2p REQ that R3 holds or binds never gets here: it is bounded by our own
  // attempts.)
  const Ipv4 source = from_bytes(event.peer_address);
  if (!st(*listener).backlog.admit(source)) {
    (void)port.agent.reject(event.id, {}, now());
    listener->ctx->stats.rejects_sent[static_cast<int>(RejectReason::application)]++;
    listener->ctx->stats.backlog_refused++;
    return;
  }
  auto child_impl = std::make_shared<CmIdImpl>(listener->ctx, listener->channel, listener->user_context, *listener->cm,
                                                std::make_unique<RoceIdState>());
  child_impl->public_context = listener->public_context;
    child_impl->datagram = event.datagram;
  child_impl->state = CmIdImpl::State::request_received;
  child_impl->peer_to_peer = event.peer_to_peer;
  child_impl->tag = event.tag;
  st(*child_impl).listener = listener;
  st(*child_impl).counted_in_backlog = true;
  st(*child_impl).peer_source = source;
  st(*child_impl).agent_id = event.id;
  st(*child_impl).address = port.address;
  child_impl->bound_address = socket_address(port.address, event.service_port);
  child_impl->peer = socket_address(from_bytes(event.peer_address), event.port);
  device.track_id(port.address, event.id, child_impl);
  listener->push_connect_request(child_impl, event_param(event),
                                 event.datagram ? "SIDR" : event.peer_to_peer ? "p2p" : "client/server");
}

RejectReason reject_reason(std::uint16_t reason) {
  switch (reason) {
    case 28: return RejectReason::application;  // consumer reject (§6 rdma_reject)
    case 8: return RejectReason::refused;       // invalid service ID: nobody listens
    case 4: return RejectReason::timeout;
    default: return RejectReason::invalid;
  }
}

}  // namespace

RoceDevice& device_of(ContextImpl& ctx) {
  if (!ctx.roce) ctx.roce = std::make_unique<RoceDevice>(ctx, ctx.roce_options);
  return *ctx.roce;
}

Status<std::errc> listen(CmIdImpl& id, int backlog) {
  RoceDevice& device = device_of(*id.ctx);
  st(id).backlog = core::ListenBacklog(static_cast<std::size_t>(std::max(backlog, 1)));
  // Unbound: INADDR_ANY and a free port, as over iWARP.
  const sockaddr_in bound = id.bound_address.value_or(sockaddr_in{.sin_family = AF_INET});
  const Ipv4 address = ntohl(bound.sin_addr.s_addr);
  // INADDR_ANY: the REQs that reach any of our addresses, those of the host's interfaces
  // included (docs/roce-transport.md).
  std::vector<RocePort*> ports;
  if (address == RoceDevice::kAnyAddress) {
    if (auto opened = device.open_every_interface_port(); !opened) return fail(opened.error());
    ports = device.all_ports();
  } else {
    auto port = device.port(address);
    if (!port) return fail(port.error());
    ports.push_back(*port);
  }
  std::uint16_t service = ntohs(bound.sin_port);
  if (st(id).reserved_service != 0) {
    // The port its bind reserved becomes the listener's.
    device.release_service(st(id).reserved_address, std::exchange(st(id).reserved_service, 0), true);
  }
  const bool ephemeral = service == 0;
  for (int attempt = 0;; ++attempt) {
    if (ephemeral) service = device.ephemeral_service_port(address);
    if (service == 0 || device.service_taken(address, service)) return fail(std::errc::address_in_use);
    auto tracked = device.track_listener(address, service, id.shared_from_this());
    if (tracked) break;
    // Another context sharing the address listens there: a free port is looked for further on.
    if (!ephemeral || tracked.error() != std::errc::address_in_use || attempt >= 256) return fail(tracked.error());
  }
  for (RocePort* port : ports) {
    if (id.datagram) {
      port->agent.listen_datagram(service);
    } else {
      port->agent.listen(service);
    }
  }
  if (device.p2p_listen_port == 0 && !id.datagram) device.p2p_listen_port = service;
  st(id).address = address;
  st(id).listen_port = service;
  id.bound_address = socket_address(address, service);
  id.state = CmIdImpl::State::listening;
  return {};
}

void resolve_addr(CmIdImpl& id, const sockaddr_in& destination) {
  RoceDevice& device = device_of(*id.ctx);
  Ipv4 source = 0;
  if (id.bound_address && id.bound_address->sin_addr.s_addr != htonl(INADDR_ANY)) {
    source = ntohl(id.bound_address->sin_addr.s_addr);
  } else {
    auto chosen = device.source_for(ntohl(destination.sin_addr.s_addr));
    if (!chosen) {
      id.emit(CmEventType::addr_error, static_cast<int>(chosen.error()));
      return;
    }
    source = *chosen;
  }
  if (auto port = device.port(source); !port) {
    id.emit(CmEventType::addr_error, static_cast<int>(port.error()));
    return;
  }
  std::uint16_t service = id.bound_address ? ntohs(id.bound_address->sin_port) : 0;
  if (service == 0) {
    // rdma_cm binds an unbound id at resolution: its source port is known from ADDR_RESOLVED
    // on, and travels in the REQ.
    auto reserved = device.reserve_service(source, 0);
    if (!reserved) {
      id.emit(CmEventType::addr_error, static_cast<int>(reserved.error()));
      return;
    }
    service = *reserved;
    st(id).reserved_address = source;
    st(id).reserved_service = service;
  }
  st(id).address = source;
  id.bound_address = socket_address(source, service);
  id.destination = destination;
  id.state = CmIdImpl::State::addr_resolved;
  id.emit(CmEventType::addr_resolved);
}

Status<std::errc> attach_qp(CmIdImpl& id, const std::shared_ptr<QueuePairImpl>& qp) {
  // The QP's packets leave from the id's address: known once it is resolved or requested.
  if (st(id).address == 0 || qp->roce) return fail(std::errc::invalid_argument);
  if (qp->engine->state() != QpState::reset && qp->engine->state() != QpState::init)
    return fail(std::errc::invalid_argument);
  const core::roce::RcQpConfig config{.pd = qp->pd,
                                      .caps = qp->caps,
                                      .signal_all = qp->signal_all,
                                      .srq = qp->srq ? &qp->srq->queue : nullptr};
  auto roce = RoceQp::open(config,
                           id.ctx->memory, *qp->send_cq, *qp->recv_cq, qp->qp_num, st(id).address);
  if (!roce) return fail(roce.error());
  qp->roce = std::move(*roce);
  // rping -q posts its receives on the QP before connecting: they move to the RC core.
  qp->roce->rc.adopt_receives(qp->engine->take_posted_receives());
  qp->drop_idle_engine();
  qp->roce->owner = id.weak_from_this();
  device_of(*id.ctx).add_qp(qp);
  return {};
}

Result<std::shared_ptr<QueuePairImpl>, std::errc> create_qp(CmIdImpl& id, std::uint32_t pd, const QpInitAttr& attr) {
  // A datagram id's UD QP is made with the verbs (ibv_create_qp, as rdma_create_qp does) and
  // named by its number in connect()/accept(); the id carries no RC core.
  if (id.datagram) return fail(std::errc::operation_not_supported);
  auto impl = std::make_shared<QueuePairImpl>(id.ctx, pd, attr);
  if (auto attached = attach_qp(id, impl); !attached) return fail(attached.error());
  return impl;
}

namespace {

// The QPN our REQ or REP names: the id's QP's, or the number of a connection without one.
std::uint32_t local_qpn(const CmIdImpl& id) {
  return id.qp_impl && id.qp_impl->roce ? id.qp_impl->roce->qpn : st(id).qpn_without_qp.value_or(0);
}

// The REP's fields: the id's QP, a fresh starting PSN, and what the application offers.
core::ibcm::IbCmAcceptParams reply_params(const CmIdImpl& id, const ConnParam& param) {
  core::ibcm::IbCmAcceptParams reply;
  reply.qpn = local_qpn(id);
  reply.starting_psn = random_psn();
  reply.responder_resources = param.responder_resources;
  reply.initiator_depth = param.initiator_depth;
  reply.private_data = param.private_data;
  return reply;
}

// The agent's `agent_id` now carries the id's connect: track it until ESTABLISHED or failure.
void start_connecting(CmIdImpl& id, core::ibcm::IbCmId agent_id, std::uint32_t psn, const ConnParam& param) {
  RoceDevice& device = device_of(*id.ctx);
  st(id).agent_id = agent_id;
  st(id).psn = psn;
  st(id).param = param;
  id.peer = id.destination;
  device.track_id(st(id).address, st(id).agent_id, id.shared_from_this());
  id.state = CmIdImpl::State::connecting;
  device.pump();
}

// rdma_connect/rdma_accept without the id's own QP: the QueuePair::create one that
// `qp_num` names gets its RC core now (rping -q). A number that names no QP of the context
// makes a connection of the CM exchange alone, as rdma_cm over IB allows.
Status<std::errc> claim_qp_by_number(CmIdImpl& id, std::uint32_t qp_num) {
  if (!id.claim_qp(qp_num)) {
    if (id.ctx->standalone_qps.contains(qp_num)) return fail(std::errc::invalid_argument);  // taken
    st(id).qpn_without_qp = qp_num & 0xFFFFFF;
    return {};
  }
  if (auto attached = attach_qp(id, id.qp_impl); !attached) {
    id.qp_impl->claimed = false;
    id.qp_impl.reset();
    return fail(attached.error());
  }
  return {};
}

}  // namespace

// rdma_connect on a datagram id: a SIDR_REQ for the destination's UDP service. The exchange is
// bounded by the id's connect timeout: the REQ is resent within it, at most as often as the
// IB CM's own retry count allows and no slower than its response timeout.
Status<std::errc> connect_datagram(CmIdImpl& id, const ConnParam& param) {
  RocePort* port = port_of(id);
  if (!port) return fail(std::errc::invalid_argument);
  RoceDevice& device = device_of(*id.ctx);
  core::ibcm::IbCmSidrParams request;
  request.destination = to_bytes(ntohl(id.destination.sin_addr.s_addr));
  request.port = ntohs(id.destination.sin_port);
  request.source_port = ntohs(id.bound_address->sin_port);
  request.private_data = param.private_data;
  const std::uint8_t retries = device.options().cm_max_retries;
  const auto total = std::chrono::duration_cast<core::Duration>(std::chrono::milliseconds(id.connect_timeout_ms));
  request.max_retries = retries;
  request.retry_interval = std::min(core::ibcm::cm_time(device.options().cm_response_timeout), total / (retries + 1));
  auto agent_id = port->agent.sidr_request(request, now());
  if (!agent_id) return fail(agent_id.error());
  st(id).agent_id = *agent_id;
  st(id).param = param;
  id.peer = id.destination;
  device.track_id(st(id).address, st(id).agent_id, id.shared_from_this());
  id.state = CmIdImpl::State::connecting;
  device.pump();
  return {};
}

Status<std::errc> connect(CmIdImpl& id, const ConnParam& param, std::optional<CmEvent>& retracted) {
  if (id.datagram) return connect_datagram(id, param);
  if (!id.qp_impl) {
    if (auto claimed = claim_qp_by_number(id, param.qp_num); !claimed) return claimed;
    id.qp_by_number = true;  // CONNECT_RESPONSE, then establish(), as over iWARP
  }
  if (id.qp_impl && !id.qp_impl->roce) return fail(std::errc::invalid_argument);
  RocePort* port = port_of(id);
  if (!port) return fail(std::errc::invalid_argument);
  RoceDevice& device = device_of(*id.ctx);
  core::ibcm::IbCmConnectParams request;
  request.destination = to_bytes(ntohl(id.destination.sin_addr.s_addr));
  request.port = ntohs(id.destination.sin_port);
  // The rdma_cm header's source port: a p2p key's port is the node's listener (docs/p2p.md
  // R2); a client/server REQ carries the id's own port, the passive side's peer port.
  request.source_port = id.peer_to_peer ? device.p2p_listen_port : ntohs(id.bound_address->sin_port);
  request.tag = id.tag;
  request.peer_to_peer = id.peer_to_peer;
  request.qpn = local_qpn(id);
  request.starting_psn = random_psn();
  request.responder_resources = param.responder_resources;
  request.initiator_depth = param.initiator_depth;
  request.path_mtu = static_cast<std::uint8_t>(path_mtu_between(st(id).address, ntohl(id.destination.sin_addr.s_addr)));
  request.private_data = param.private_data;
  request.connect_timeout = std::chrono::milliseconds(id.connect_timeout_ms);  // CmOption::connect_timeout
  // R5's unseen-request rule (docs/p2p.md, Rules): the agent's resolver decides; taking the
  // CONNECT_REQUEST back from the application is the only part that is ours.
  auto take_back = [&device, &id, &retracted](core::ibcm::IbCmId request_id) {
    auto unseen = device.find_id(st(id).address, request_id);
    if (!unseen || unseen->state != CmIdImpl::State::request_received) return false;
    retracted = unseen->channel->retract_request(unseen->owner);
    if (!retracted) return false;  // the application has it: EALREADY stands
    release_pending(*unseen);      // B1: the agent holds it now, under R3, bounded by our attempt
    end_agent_id(*unseen);
    unseen->state = CmIdImpl::State::idle;
    return true;
  };
  // R5b (docs/p2p.md, Rules): a key's established connection may be to a peer that was killed
  // and restarted, which no reset tells us over UDP. Its QP probes the peer now; the agent's
  // resolver decides on the answer (on_qp_alive, on_qp_error) or on the restarted peer's REQ.
  auto check = [&device, &id](core::ibcm::IbCmId established) {
    auto connection = device.find_id(st(id).address, established);
    if (!connection || connection->state != CmIdImpl::State::established || !connection->qp_impl ||
        !connection->qp_impl->roce)
      return false;
    if (!connection->qp_impl->roce->rc.check_liveness(now())) return false;
    device.touch(connection->qp_impl->qp_num);
    return true;
  };
  auto agent_id = port->agent.connect(request, now(), take_back, check);
  if (!agent_id) return fail(agent_id.error());
  start_connecting(id, *agent_id, request.starting_psn, param);
  return {};
}

Status<std::errc> accept(CmIdImpl& id, const ConnParam& param) {
  if (id.state != CmIdImpl::State::request_received || st(id).agent_id == 0) return fail(std::errc::invalid_argument);
  if (id.datagram) {
    // SIDR_REP: the UD QP `qp_num` names, with rdma_cm's Q_Key for the UDP port space. The
    // exchange is over once it leaves; a copy of the request gets the same answer.
    RocePort* port = port_of(id);
    if (!port) return fail(std::errc::invalid_argument);
    core::ibcm::IbCmAcceptParams reply;
    reply.qpn = param.qp_num;
    reply.qkey = core::ibcm::kRdmaUdpQkey;
    reply.private_data = param.private_data;
    if (auto accepted = port->agent.accept(st(id).agent_id, reply, now()); !accepted) return fail(accepted.error());
    st(id).param = param;
    id.state = CmIdImpl::State::established;
    release_pending(id);
    end_agent_id(id);
    device_of(*id.ctx).pump();
    return {};
  }
  if (!id.qp_impl) {
    if (auto claimed = claim_qp_by_number(id, param.qp_num); !claimed) return claimed;
  }
  if (id.qp_impl && !id.qp_impl->roce) return fail(std::errc::invalid_argument);
  RocePort* port = port_of(id);
  if (!port) return fail(std::errc::invalid_argument);
  const core::ibcm::IbCmAcceptParams reply = reply_params(id, param);
  if (auto accepted = port->agent.accept(st(id).agent_id, reply, now()); !accepted) return fail(accepted.error());
  st(id).psn = reply.starting_psn;
  st(id).param = param;
  id.state = CmIdImpl::State::accepting;
  release_pending(id);
  device_of(*id.ctx).pump();
  return {};
}

Status<std::errc> reject(CmIdImpl& id, std::span<const std::uint8_t> private_data) {
  if (id.state != CmIdImpl::State::request_received || st(id).agent_id == 0) return fail(std::errc::invalid_argument);
  RocePort* port = port_of(id);
  if (!port) return fail(std::errc::invalid_argument);
  if (auto rejected = port->agent.reject(st(id).agent_id, private_data, now()); !rejected) return fail(rejected.error());
  id.ctx->stats.rejects_sent[static_cast<int>(RejectReason::application)]++;
  release_pending(id);
  end_agent_id(id);
  id.state = CmIdImpl::State::idle;
  device_of(*id.ctx).pump();
  return {};
}

Status<std::errc> disconnect(CmIdImpl& id) {
  if (id.datagram) return fail(std::errc::invalid_argument);  // no connection to end
  if (st(id).agent_id == 0) return fail(std::errc::not_connected);
  if (id.state != CmIdImpl::State::established && id.state != CmIdImpl::State::disconnected)
    return fail(std::errc::invalid_argument);
  RocePort* port = port_of(id);
  if (!port) return fail(std::errc::not_connected);
  // rdma_disconnect: the QP goes to ERROR now and its outstanding work flushes. The ACKs
  // it still owes leave before the DREQ, which makes the peer flush what they would complete.
  qp_to_error(id);
  device_of(*id.ctx).pump();
  if (id.state == CmIdImpl::State::established) (void)port->agent.disconnect(st(id).agent_id, now());
  id.emit_disconnected();
  device_of(*id.ctx).pump();
  return {};
}

void release(CmIdImpl& id) {
  if (!id.ctx->roce) return;
  RoceDevice& device = *id.ctx->roce;
  if (st(id).reserved_service != 0)
    device.release_service(st(id).reserved_address, std::exchange(st(id).reserved_service, 0));
  // A QP the id does not own outlives it, in ERROR as over iWARP; the ACKs it still owes
  // leave before the DREQ below.
  if (id.state == CmIdImpl::State::established) {
    qp_to_error(id);
    device.pump();
  }
  if (id.state == CmIdImpl::State::listening) {
    device.forget_listener(st(id).address, st(id).listen_port);
    // The context outlives its listeners (the C API keeps it for the process): it stops
    // advertising a port nobody listens on.
    if (device.p2p_listen_port == st(id).listen_port) device.p2p_listen_port = 0;
    for (RocePort* port : device.all_ports())
      if ((st(id).address == RoceDevice::kAnyAddress || port->address == st(id).address) &&
          !device.service_taken(port->address, st(id).listen_port)) {
        if (id.datagram) {
          port->agent.stop_listening_datagram(st(id).listen_port);
        } else {
          port->agent.stop_listening(st(id).listen_port);
        }
      }
  }
  if (RocePort* port = port_of(id)) {
    // rdma_destroy_id: a request is rejected, an attempt abandoned (REJ), a connection
    // disconnected; the agent finishes the exchange alone.
    if (st(id).agent_id != 0) port->agent.destroy(st(id).agent_id, now());
  }
  end_agent_id(id);
  device.pump();
}

namespace {

// The end of a SIDR exchange this id started: ESTABLISHED with the peer's UD QP, REJECTED when
// the service turned it down, UNREACHABLE when nobody serves the port (any other SIDR status)
// or no answer came.
void on_datagram_event(CmIdImpl& id, const IbCmAgentEvent& event) {
  using Kind = IbCmAgentEvent::Kind;
  end_agent_id(id);
  switch (event.kind) {
    case Kind::established: {
      id.state = CmIdImpl::State::established;
      id.peer = socket_address(from_bytes(event.peer_address), event.port);
      PEERCM_LOG(info, "ibcm", "id {} to {}: SIDR answered, remote QPN {} Q_Key {:#x}", id.number, log::address(id.peer),
                event.peer.qpn, event.qkey);
      ConnParam param;
      param.private_data = event.private_data;
      param.qp_num = event.peer.qpn;
      param.qkey = event.qkey;
      id.emit(CmEventType::established, 0, std::move(param));
      return;
    }
    case Kind::rejected: {
      id.state = CmIdImpl::State::route_resolved;
      ConnParam param;
      param.private_data = event.private_data;
      if (event.reason == static_cast<std::uint16_t>(wire::ibcm::SidrStatus::rejected)) {
        id.ctx->stats.rejects_received[static_cast<int>(RejectReason::application)]++;
        id.emit(CmEventType::rejected, ECONNREFUSED, std::move(param), RejectReason::application);
      } else {
        id.emit(CmEventType::unreachable, ECONNREFUSED, std::move(param));
      }
      return;
    }
    case Kind::unreachable:
      id.state = CmIdImpl::State::route_resolved;
      id.emit(CmEventType::unreachable, ETIMEDOUT);
      return;
    default:
      return;
  }
}

}  // namespace

void on_agent_event(RoceDevice& device, RocePort& port, IbCmAgentEvent& event) {
  using Kind = IbCmAgentEvent::Kind;
  if (event.kind == Kind::connect_request) {
    on_connect_request(device, port, event);
    return;
  }
  auto id = device.find_id(port.address, event.id);
  if (!id) return;  // its CmId is gone; the agent finishes the protocol alone
  release_pending(*id);  // a request the peer gave up or that ended is decided
  if (event.datagram) {
    on_datagram_event(*id, event);
    return;
  }
  switch (event.kind) {
    case Kind::connect_request: break;
    case Kind::reply_sent:
      if (!start_queue_pair(*id, event)) {
        // The peer of an R3 rebinding is not the one the QP runs for: the attempt ends
        // (REJ to the peer), and the application's retry makes a fresh QP meet the peer.
        port.agent.destroy(event.id, now());
        id->state = CmIdImpl::State::route_resolved;
        end_agent_id(*id);
        qp_to_error(*id);
        id->emit(CmEventType::connect_error, ECONNRESET);
      }
      return;
    case Kind::established: {
      if (!start_queue_pair(*id, event)) {
        (void)port.agent.disconnect(event.id, now());
        id->state = CmIdImpl::State::route_resolved;
        end_agent_id(*id);
        id->emit(CmEventType::connect_error, EINVAL);
        return;
      }
      id->state = CmIdImpl::State::established;
      id->peer = socket_address(from_bytes(event.peer_address), event.port);
      PEERCM_LOG(info, "ibcm", "id {} to {}: established, remote QPN {} starting PSN {}, resources {}/{}, RNR retry {}",
                id->number, log::address(id->peer), event.peer.qpn, event.peer.starting_psn,
                event.peer.responder_resources, event.peer.initiator_depth, event.peer.rnr_retry_count);
      ConnParam param = event_param(event);
      // The RTU already left: establish() only closes the exchange, as over iWARP.
      id->response_pending = id->qp_by_number;
      id->emit(id->qp_by_number ? CmEventType::connect_response : CmEventType::established, 0, std::move(param));
      return;
    }
    case Kind::rejected: {
      const RejectReason reason = reject_reason(event.reason);
      id->ctx->stats.rejects_received[static_cast<int>(reason)]++;
      id->state = CmIdImpl::State::route_resolved;
      end_agent_id(*id);
      if (st(*id).started_for_qpn) qp_to_error(*id);  // its posted work flushes
      ConnParam param;
      param.private_data = event.private_data;
      id->emit(CmEventType::rejected, ECONNREFUSED, std::move(param), reason);
      return;
    }
    case Kind::unreachable:
      id->state = CmIdImpl::State::route_resolved;
      end_agent_id(*id);
      id->emit(CmEventType::unreachable, ETIMEDOUT);
      return;
    case Kind::connect_error: {
      if (event.already_connected) {
        // R5b: the key's connection answered its check: rule 5's EISCONN, as an event.
        id->state = CmIdImpl::State::route_resolved;
        end_agent_id(*id);
        id->emit(CmEventType::connect_error, EISCONN);
        return;
      }
      const bool passive = id->state == CmIdImpl::State::accepting;
      id->state = passive ? CmIdImpl::State::disconnected : CmIdImpl::State::route_resolved;
      end_agent_id(*id);
      if (st(*id).started_for_qpn) qp_to_error(*id);  // its posted work flushes
      id->emit(CmEventType::connect_error, ETIMEDOUT, {}, RejectReason::timeout);
      return;
    }
    case Kind::disconnected:
      qp_to_error(*id);
      id->emit_disconnected();
      return;
    case Kind::timewait_exit:
      end_agent_id(*id);
      id->emit(CmEventType::timewait_exit);
      return;
  }
}

// --- RoceCm: the TransportCm of RoCE ids ---

Status<std::errc> RoceCm::reserve_port(CmIdImpl& id, sockaddr_in& address) {
  RoceDevice& device = device_of(ctx_);
  const Ipv4 host = ntohl(address.sin_addr.s_addr);
  if (host != RoceDevice::kAnyAddress) {
    if (auto opened = device.port(host); !opened) return fail(opened.error());
  }
  auto service = device.reserve_service(host, ntohs(address.sin_port), true);
  if (!service) return fail(service.error());
  address.sin_port = htons(*service);
  st(id).reserved_address = host;
  st(id).reserved_service = *service;
  return {};
}

Status<std::errc> RoceCm::listen(CmIdImpl& id, int backlog) { return roce::listen(id, backlog); }
void RoceCm::resolve_addr(CmIdImpl& id, const sockaddr_in& destination) { roce::resolve_addr(id, destination); }
Status<std::errc> RoceCm::connect(CmIdImpl& id, const ConnParam& param, std::optional<CmEvent>& retracted) {
  return roce::connect(id, param, retracted);
}
Status<std::errc> RoceCm::accept(CmIdImpl& id, const ConnParam& param) { return roce::accept(id, param); }
Status<std::errc> RoceCm::reject(CmIdImpl& id, std::span<const std::uint8_t> private_data) {
  return roce::reject(id, private_data);
}
Status<std::errc> RoceCm::disconnect(CmIdImpl& id) { return roce::disconnect(id); }
Result<std::shared_ptr<QueuePairImpl>, std::errc> RoceCm::create_qp(CmIdImpl& id, std::uint32_t pd,
                                                                     const QpInitAttr& attr) {
  return roce::create_qp(id, pd, attr);
}
Status<std::errc> RoceCm::attach_qp(CmIdImpl& id, const std::shared_ptr<QueuePairImpl>& qp) {
  return roce::attach_qp(id, qp);
}
void RoceCm::release(CmIdImpl& id) { roce::release(id); }
sockaddr_in RoceCm::local_address(CmIdImpl& id) { return id.bound_address.value_or(sockaddr_in{}); }
void RoceCm::add_stats(CmStats& stats) {
  if (ctx_.roce) ctx_.roce->add_stats(stats);
}

void on_qp_alive(RoceDevice& device, QueuePairImpl& qp) {
  auto id = qp.roce->owner.lock();
  if (!id || id->state != CmIdImpl::State::established || st(*id).agent_id == 0) return;
  if (RocePort* port = device.find_port(st(*id).address)) port->agent.handle_connection_alive(st(*id).agent_id, now());
}

void on_qp_error(RoceDevice& device, QueuePairImpl& qp, const core::roce::RcEvent& event) {
  PEERCM_LOG_AT(event.cause == core::roce::RcErrorCause::modified_to_error ? log::Level::info : log::Level::warn, "qp",
             "QP {} (RoCE RC): ERROR, {}{}; outstanding work requests flush", qp.qp_num,
             core::roce::to_string(event.cause), event.has_wr ? fmt::format(" (WR {})", event.wr_id) : std::string());
  if (event.cause == core::roce::RcErrorCause::modified_to_error) return;  // the CM did it
  auto id = qp.roce->owner.lock();
  if (!id || id->state != CmIdImpl::State::established || st(*id).agent_id == 0) return;
  // The connection is dead (the peer stopped answering or refused our work): tell the
  // peer's CM and the application, as iWARP does when its stream fails.
  if (RocePort* port = device.find_port(st(*id).address)) (void)port->agent.disconnect(st(*id).agent_id, now());
  id->emit_disconnected();
}

}  // namespace peercm::detail::roce
