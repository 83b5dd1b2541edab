// rdma_cm over the C++ CM: event channels, ids, their events, and the calls that move an id
// through its life. Synchronous ids (no channel) get a private channel and wait on it.
#include <arpa/inet.h>
#include <fcntl.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <span>
#include <unordered_map>

#include "api/event_channel_impl.hpp"
#include "api/port_reservation.hpp"
#include "api/roce/roce_verbs.hpp"
#include "capi/handles.hpp"

namespace peercm::capi {
namespace {

using std::chrono::milliseconds;

// Events name C++ ids; this finds their rdma_cm_id.
struct IdRegistry {
  std::mutex mutex;
  std::unordered_map<const CmId*, rdma_cm_id*> ids;
};
IdRegistry g_ids;

IdState& st(rdma_cm_id* id) { return *state_of<IdState>(id); }

// rdma_cm over TCP speaks IPv4; an AF_INET6 or AF_IB address is refused, not mistranslated.
Result<sockaddr_in, std::errc> ipv4(const sockaddr* address) {
  if (!address) return fail(std::errc::invalid_argument);
  if (address->sa_family != AF_INET) return fail(std::errc::address_family_not_supported);
  sockaddr_in in;
  std::memcpy(&in, address, sizeof in);
  return in;
}

rdma_cm_event_type event_type(CmEventType type) {
  switch (type) {
    case CmEventType::addr_resolved: return RDMA_CM_EVENT_ADDR_RESOLVED;
    case CmEventType::addr_error: return RDMA_CM_EVENT_ADDR_ERROR;
    case CmEventType::route_resolved: return RDMA_CM_EVENT_ROUTE_RESOLVED;
    case CmEventType::route_error: return RDMA_CM_EVENT_ROUTE_ERROR;
    case CmEventType::connect_request: return RDMA_CM_EVENT_CONNECT_REQUEST;
    case CmEventType::connect_response: return RDMA_CM_EVENT_CONNECT_RESPONSE;
    case CmEventType::established: return RDMA_CM_EVENT_ESTABLISHED;
    case CmEventType::rejected: return RDMA_CM_EVENT_REJECTED;
    case CmEventType::unreachable: return RDMA_CM_EVENT_UNREACHABLE;
    case CmEventType::connect_error: return RDMA_CM_EVENT_CONNECT_ERROR;
    case CmEventType::disconnected: return RDMA_CM_EVENT_DISCONNECTED;
    case CmEventType::timewait_exit: return RDMA_CM_EVENT_TIMEWAIT_EXIT;
  }
  return RDMA_CM_EVENT_CONNECT_ERROR;
}

rdma_event_channel* new_channel() {
  auto channel = EventChannel::create();
  if (!channel) {
    errno = errno_of(channel.error());
    return nullptr;
  }
  auto* shell = new EventChannelShell{};
  shell->state = new EventChannelState{};
  shell->state->cpp = std::move(*channel);
  shell->pub.fd = shell->state->cpp->fd();
  make_blocking(shell->pub.fd);
  return &shell->pub;
}

void delete_channel(rdma_event_channel* channel) {
  delete state_of<EventChannelState>(channel);
  delete reinterpret_cast<EventChannelShell*>(channel);
}

// A new rdma_cm_id around `cpp`, reporting to `channel` (or to a private one when null).
rdma_cm_id* wrap_id(std::unique_ptr<CmId> cpp, ibv_context* context, rdma_event_channel* channel, bool sync,
                    void* user_context, rdma_port_space ps) {
  auto* shell = new IdShell{};
  shell->state = new IdState{};
  IdState& state = *shell->state;
  state.cpp = std::move(cpp);
  state.context = context;
  state.sync = sync;
  rdma_cm_id& pub = shell->pub;
  pub.channel = channel;
  pub.context = user_context;
  pub.ps = ps;
  pub.qp_type = ps == RDMA_PS_UDP ? IBV_QPT_UD : IBV_QPT_RC;
  {
    std::lock_guard lock(g_ids.mutex);
    g_ids.ids[state.cpp.get()] = &pub;
  }
  return &pub;
}

void bind_to_device(rdma_cm_id* id) {
  id->verbs = st(id).context;
  id->port_num = 1;
}

// A CONNECT_REQUEST's new id: it inherits the listener's device, channel (or, for a
// synchronous listener, becomes synchronous itself) and user context.
rdma_cm_id* adopt_request(rdma_cm_id* listener, std::unique_ptr<CmId> cpp, const ConnParam& param) {
  IdState& ls = st(listener);
  ibv_context* context = ls.context;  // the listener's device: the transport the request came by
  rdma_event_channel* channel = listener->channel;
  if (ls.sync) {
    channel = new_channel();
    if (!channel || !cpp->migrate(*state_of<EventChannelState>(channel)->cpp)) {
      if (channel) delete_channel(channel);
      return nullptr;
    }
  }
  rdma_cm_id* child = wrap_id(std::move(cpp), context, channel, ls.sync, listener->context, listener->ps);
  IdState& cs = st(child);
  cs.request_responder_resources = std::min(param.responder_resources, kMaxRdAtom);
  cs.request_initiator_depth = std::min(param.initiator_depth, kMaxRdAtom);
  cs.peer_to_peer = ls.peer_to_peer;
  bind_to_device(child);
  fill_route(child);
  return child;
}

// RDMA_PS_UDP: the event's rdma_ud_param. ESTABLISHED names the peer's UD QP as rdma_cm does:
// an address vector with the peer's GID (::ffff:a.b.c.d) and the GID index of our address,
// its QPN and Q_Key. The union's connection fields are not filled for a UD id.
void fill_ud_param(rdma_cm_event& pub, const CmEvent& event, const std::vector<std::uint8_t>& private_data) {
  pub.param.ud = rdma_ud_param{};
  pub.param.ud.private_data = private_data.empty() ? nullptr : private_data.data();
  pub.param.ud.private_data_len = static_cast<std::uint8_t>(private_data.size());
  if (pub.event != RDMA_CM_EVENT_ESTABLISHED || !pub.id) return;
  ibv_ah_attr& ah = pub.param.ud.ah_attr;
  ah.is_global = 1;
  ah.port_num = 1;
  ah.grh.hop_limit = 64;
  ah.grh.dgid.raw[10] = 0xFF;
  ah.grh.dgid.raw[11] = 0xFF;
  std::memcpy(ah.grh.dgid.raw + 12, &pub.id->route.addr.dst_sin.sin_addr, 4);
  Context& context = cpp_context(st(pub.id).context);
  const int index = detail::roce::gid_index_of(context, ntohl(pub.id->route.addr.src_sin.sin_addr.s_addr));
  ah.grh.sgid_index = static_cast<std::uint8_t>(std::max(index, 0));
  pub.param.ud.qp_num = event.param.qp_num;
  pub.param.ud.qkey = event.param.qkey;
}

// One event of `id` acked (or dropped before it reached the application).
void uncount_event(IdState& id) {
  // Notify under the lock: once the count reaches 0, rdma_destroy_id() may free the id
  // (and this condition variable) as soon as it can take the lock.
  std::lock_guard lock(id.mutex);
  --id.events_out;
  id.events_done.notify_all();
}

// The C event for a C++ one, counted against the id whose queue it came from (the listener
// for a CONNECT_REQUEST, as librdmacm counts it). Null for an event of an id already gone.
rdma_cm_event* translate(CmEvent event) {
  auto* shell = new EventShell{};
  shell->state = new EventState{};
  EventState& state = *shell->state;
  rdma_cm_event& pub = shell->pub;
  pub.event = event_type(event.type);
  pub.status = -event.status;  // rdma_cm reports iWARP errors as negative errno values
  const std::size_t length = std::min<std::size_t>(event.param.private_data.size(), UINT8_MAX);
  state.private_data.assign(event.param.private_data.begin(), event.param.private_data.begin() + static_cast<std::ptrdiff_t>(length));
  pub.param.conn.private_data = length ? state.private_data.data() : nullptr;
  pub.param.conn.private_data_len = static_cast<std::uint8_t>(length);
  pub.param.conn.responder_resources = event.param.responder_resources;
  pub.param.conn.initiator_depth = event.param.initiator_depth;
  pub.param.conn.qp_num = event.param.qp_num;

  // The event is counted against its id (the listener for a CONNECT_REQUEST, as librdmacm
  // does) before the id is used: from then on rdma_destroy_id() waits for the ack instead
  // of freeing the id under us. Looked up and counted under the registry lock, which
  // rdma_destroy_id() takes to unregister.
  const bool request = event.type == CmEventType::connect_request;
  rdma_cm_id* counted = nullptr;
  {
    std::lock_guard lock(g_ids.mutex);
    if (auto it = g_ids.ids.find(request ? event.listen_id : event.id); it != g_ids.ids.end()) {
      counted = it->second;
      std::lock_guard id_lock(st(counted).mutex);
      ++st(counted).events_out;
    }
  }
  if (counted && request) {
    pub.listen_id = counted;
    pub.id = event.new_id ? adopt_request(counted, std::move(event.new_id), event.param) : nullptr;
  } else if (counted) {
    pub.id = counted;
    fill_route(pub.id);
  }
  if (counted && !pub.id) {
    uncount_event(st(counted));
    counted = nullptr;
  }
  if (!counted) {
    delete shell->state;
    delete shell;
    return nullptr;
  }
  if (pub.id && pub.id->ps == RDMA_PS_UDP) fill_ud_param(pub, event, state.private_data);
  state.counted = counted;
  return &pub;
}

// An id connects peer-to-peer only when the application turned the option on: a program
// written for rdma_cm expects its semantics, and the symmetric ones (libfabric's ofi_rxm,
// MPI) settle simultaneous connects themselves (docs/c-api.md, "The peer-to-peer option").
bool effective_peer_to_peer(rdma_cm_id* id) { return st(id).peer_to_peer == 1; }

Result<ConnParam, std::errc> to_conn_param(rdma_cm_id* id, const rdma_conn_param* in, std::uint8_t default_ird,
                                        std::uint8_t default_ord) {
  ConnParam out;
  out.responder_resources = default_ird;
  out.initiator_depth = default_ord;
  if (!in) return out;
  if (in->private_data_len && !in->private_data) return fail(std::errc::invalid_argument);
  if ((in->responder_resources > kMaxRdAtom && in->responder_resources != RDMA_MAX_RESP_RES) ||
      (in->initiator_depth > kMaxRdAtom && in->initiator_depth != RDMA_MAX_INIT_DEPTH))
    return fail(std::errc::invalid_argument);
  const auto* bytes = static_cast<const std::uint8_t*>(in->private_data);
  out.private_data.assign(bytes, bytes + in->private_data_len);
  out.responder_resources = std::min(in->responder_resources, kMaxRdAtom);
  out.initiator_depth = std::min(in->initiator_depth, kMaxRdAtom);
  if (!id->qp) out.qp_num = in->qp_num;
  return out;
}

// rdma_cm names a UD id's QP in its SIDR_REP: the id's own, else the caller's qp_num.
void name_ud_qp(rdma_cm_id* id, ConnParam& param) {
  if (id->ps == RDMA_PS_UDP && id->qp) param.qp_num = id->qp->qp_num;
}

int finish(rdma_cm_id* id, Status<std::errc> started) {
  if (!started) return fail_errno(started.error());
  return st(id).sync ? sync_complete(id) : 0;
}

}  // namespace

rdma_cm_id* id_of(CmId* cpp) {
  std::lock_guard lock(g_ids.mutex);
  auto it = g_ids.ids.find(cpp);
  return it == g_ids.ids.end() ? nullptr : it->second;
}

void fill_route(rdma_cm_id* id) {
  const sockaddr_in local = st(id).cpp->local_address();
  if (local.sin_family == AF_INET) std::memcpy(&id->route.addr.src_sin, &local, sizeof local);
  const sockaddr_in peer = st(id).cpp->peer_address();
  if (peer.sin_family == AF_INET) std::memcpy(&id->route.addr.dst_sin, &peer, sizeof peer);
}

int sync_complete(rdma_cm_id* id) {
  if (id->event) {
    rdma_ack_cm_event(id->event);
    id->event = nullptr;
  }
  rdma_cm_event* event = nullptr;
  if (rdma_get_cm_event(id->channel, &event) != 0) return -1;
  id->event = event;
  if (event->status == 0) return 0;
  return fail_errno(event->event == RDMA_CM_EVENT_REJECTED ? ECONNREFUSED : -event->status);
}

// A program whose event thread saw the channel readable, while another thread destroys the
// id the event is about, would block in rdma_get_cm_event() once the event is purged (rping's
// cm_thread and main do exactly this at exit). When another thread consumes the channel, it
// gets a bounded moment to fetch the id's queued events first; they are then acked before the
// id goes, as rdma_cm requires. A program fetching its events on the destroying thread never
// waits here.
void let_consumer_fetch_queued_events(rdma_cm_id* id) {
  constexpr milliseconds kMaxWait{50};
  EventChannelState& channel = *state_of<EventChannelState>(id->channel);
  const std::thread::id consumer = channel.consumer.load(std::memory_order_relaxed);
  if (consumer == std::thread::id{} || consumer == std::this_thread::get_id()) return;
  const auto deadline = std::chrono::steady_clock::now() + kMaxWait;
  while (channel.cpp->impl().holds_events_for(st(id).cpp.get()) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::microseconds(200));
}

}  // namespace peercm::capi

using namespace peercm;
using namespace peercm::capi;

// --- event channels ---

rdma_event_channel* rdma_create_event_channel() { return new_channel(); }

void rdma_destroy_event_channel(rdma_event_channel* channel) {
  if (channel) delete_channel(channel);
}

int rdma_get_cm_event(rdma_event_channel* channel, rdma_cm_event** event) {
  if (!channel || !event) return fail_errno(EINVAL);
  EventChannelState& channel_state = *state_of<EventChannelState>(channel);
  channel_state.consumer.store(std::this_thread::get_id(), std::memory_order_relaxed);
  EventChannel& cpp = *channel_state.cpp;
  const milliseconds wait = nonblocking(channel->fd) ? milliseconds(0) : milliseconds(-1);
  for (;;) {
    auto got = cpp.get_event(wait);
    if (!got) return fail_errno(got.error() == std::errc::timed_out ? EAGAIN : errno_of(got.error()));
    if (rdma_cm_event* translated = translate(std::move(*got))) {
      *event = translated;
      return 0;
    }
  }
}

int rdma_ack_cm_event(rdma_cm_event* event) {
  if (!event) return fail_errno(EINVAL);
  EventState* state = state_of<EventState>(event);
  uncount_event(st(state->counted));
  delete state;
  delete reinterpret_cast<EventShell*>(event);
  return 0;
}

const char* rdma_event_str(rdma_cm_event_type event) {
  switch (event) {
    case RDMA_CM_EVENT_ADDR_RESOLVED: return "RDMA_CM_EVENT_ADDR_RESOLVED";
    case RDMA_CM_EVENT_ADDR_ERROR: return "RDMA_CM_EVENT_ADDR_ERROR";
    case RDMA_CM_EVENT_ROUTE_RESOLVED: return "RDMA_CM_EVENT_ROUTE_RESOLVED";
    case RDMA_CM_EVENT_ROUTE_ERROR: return "RDMA_CM_EVENT_ROUTE_ERROR";
    case RDMA_CM_EVENT_CONNECT_REQUEST: return "RDMA_CM_EVENT_CONNECT_REQUEST";
    case RDMA_CM_EVENT_CONNECT_RESPONSE: return "RDMA_CM_EVENT_CONNECT_RESPONSE";
    case RDMA_CM_EVENT_CONNECT_ERROR: return "RDMA_CM_EVENT_CONNECT_ERROR";
    case RDMA_CM_EVENT_UNREACHABLE: return "RDMA_CM_EVENT_UNREACHABLE";
    case RDMA_CM_EVENT_REJECTED: return "RDMA_CM_EVENT_REJECTED";
    case RDMA_CM_EVENT_ESTABLISHED: return "RDMA_CM_EVENT_ESTABLISHED";
    case RDMA_CM_EVENT_DISCONNECTED: return "RDMA_CM_EVENT_DISCONNECTED";
    case RDMA_CM_EVENT_DEVICE_REMOVAL: return "RDMA_CM_EVENT_DEVICE_REMOVAL";
    case RDMA_CM_EVENT_MULTICAST_JOIN: return "RDMA_CM_EVENT_MULTICAST_JOIN";
    case RDMA_CM_EVENT_MULTICAST_ERROR: return "RDMA_CM_EVENT_MULTICAST_ERROR";
    case RDMA_CM_EVENT_ADDR_CHANGE: return "RDMA_CM_EVENT_ADDR_CHANGE";
    case RDMA_CM_EVENT_TIMEWAIT_EXIT: return "RDMA_CM_EVENT_TIMEWAIT_EXIT";
  }
  return "UNKNOWN EVENT";
}

// --- devices as rdma_cm sees them ---

// The contexts the ids share, in ibv_get_device_list()'s order (PEERCM_TRANSPORT's first);
// they stay open after rdma_free_devices(), as librdmacm's do.
ibv_context** rdma_get_devices(int* num_devices) {
  auto** list = static_cast<ibv_context**>(std::calloc(3, sizeof(ibv_context*)));
  if (!list) return nullptr;
  const Transport first = default_transport();
  list[0] = cm_context(first);
  list[1] = cm_context(first == Transport::roce ? Transport::iwarp : Transport::roce);
  if (!list[0] || !list[1]) {
    std::free(list);
    return nullptr;
  }
  if (num_devices) *num_devices = 2;
  return list;
}

void rdma_free_devices(ibv_context** list) { std::free(list); }

// --- ids ---

int rdma_create_id(rdma_event_channel* channel, rdma_cm_id** id, void* context, rdma_port_space ps) {
  if (!id) return fail_errno(EINVAL);
  if (ps != RDMA_PS_TCP && ps != RDMA_PS_IB && ps != RDMA_PS_UDP) return fail_errno(EPROTONOSUPPORT);
  // PEERCM_TRANSPORT picks the device, hence the transport, as an address picks the device
  // under librdmacm.
  ibv_context* device = cm_context(default_transport());
  if (!device) return -1;
  // RDMA_PS_UDP is SIDR and UD QPs: RoCE only; iWARP has no datagram service.
  if (ps == RDMA_PS_UDP && transport_of(device) != Transport::roce) return fail_errno(EPROTONOSUPPORT);
  const bool sync = channel == nullptr;
  rdma_event_channel* reports_to = sync ? new_channel() : channel;
  if (!reports_to) return -1;
  auto cpp = CmId::create(cpp_context(device), *state_of<EventChannelState>(reports_to)->cpp, nullptr,
                          transport_of(device));
  if (!cpp) {
    if (sync) delete_channel(reports_to);
    return fail_errno(cpp.error());
  }
  if (ps == RDMA_PS_UDP) {
    if (auto set = (*cpp)->set_option(CmOption::datagram, 1); !set) {
      cpp->reset();
      if (sync) delete_channel(reports_to);
      return fail_errno(set.error());
    }
  }
  *id = wrap_id(std::move(*cpp), device, reports_to, sync, context, ps);
  return 0;
}

int rdma_destroy_id(rdma_cm_id* id) {
  if (!id) return fail_errno(EINVAL);
  IdState* state = state_of<IdState>(id);
  if (id->event) {
    rdma_ack_cm_event(id->event);
    id->event = nullptr;
  }
  if (!state->sync) let_consumer_fetch_queued_events(id);
  {
    std::lock_guard lock(g_ids.mutex);
    g_ids.ids.erase(state->cpp.get());
  }
  {
    // rdma_cm: events the application holds for this id must be acked before it goes.
    std::unique_lock lock(state->mutex);
    state->events_done.wait(lock, [state] { return state->events_out == 0; });
  }
  // A QP still attached stays the application's; the id's end moves it to ERROR if it ran.
  if (id->qp) state_of<QpHandleState>(id->qp)->id = nullptr;
  state->cpp.reset();
  if (state->sync) delete_channel(id->channel);
  delete state;
  delete reinterpret_cast<IdShell*>(id);
  return 0;
}

int rdma_migrate_id(rdma_cm_id* id, rdma_event_channel* channel) {
  if (!id) return fail_errno(EINVAL);
  IdState& state = st(id);
  if (state.sync && !channel) return fail_errno(EINVAL);
  rdma_event_channel* target = channel ? channel : new_channel();
  if (!target) return -1;
  if (id->event) {
    rdma_ack_cm_event(id->event);
    id->event = nullptr;
  }
  {
    // Events already handed out must not be processed on the old channel after this returns.
    std::unique_lock lock(state.mutex);
    state.events_done.wait(lock, [&state] { return state.events_out == 0; });
  }
  if (auto moved = state.cpp->migrate(*state_of<EventChannelState>(target)->cpp); !moved) {
    if (!channel) delete_channel(target);
    return fail_errno(moved.error());
  }
  rdma_event_channel* old = id->channel;
  const bool old_private = state.sync;
  id->channel = target;
  state.sync = channel == nullptr;
  if (old_private) delete_channel(old);
  return 0;
}

int rdma_bind_addr(rdma_cm_id* id, sockaddr* addr) {
  if (!id) return fail_errno(EINVAL);
  auto address = ipv4(addr);
  if (!address) return fail_errno(address.error());
  // The port is the id's from here on (EADDRINUSE now, not at rdma_listen), as with the
  // kernel's rdma_cm; port 0 takes a free one, which rdma_get_src_port() then reads.
  if (auto bound = detail::bind_reserving_port(*st(id).cpp, *address); !bound) return fail_errno(bound.error());
  fill_route(id);
  bind_to_device(id);
  return 0;
}

int rdma_resolve_addr(rdma_cm_id* id, sockaddr* src_addr, sockaddr* dst_addr, int timeout_ms) {
  if (!id) return fail_errno(EINVAL);
  auto destination = ipv4(dst_addr);
  if (!destination) return fail_errno(destination.error());
  IdState& state = st(id);
  const bool bound = state.cpp->local_address().sin_family == AF_INET;
  if (src_addr && src_addr->sa_family != AF_UNSPEC && !bound) {
    if (rdma_bind_addr(id, src_addr) != 0) return -1;
  }
  std::memcpy(&id->route.addr.dst_sin, &*destination, sizeof *destination);
  // An unbound id is bound now, to the route's source and a free port, as rdma_cm binds it.
  // Should that fail, resolve_addr() reports the destination's problem as ADDR_ERROR.
  (void)detail::bind_source_towards(*state.cpp, *destination);
  auto started = state.cpp->resolve_addr(*destination, milliseconds(std::max(timeout_ms, 0)));
  if (started) bind_to_device(id);
  return finish(id, started);
}

int rdma_resolve_route(rdma_cm_id* id, int timeout_ms) {
  if (!id) return fail_errno(EINVAL);
  return finish(id, st(id).cpp->resolve_route(milliseconds(std::max(timeout_ms, 0))));
}

int rdma_listen(rdma_cm_id* id, int backlog) {
  if (!id) return fail_errno(EINVAL);
  IdState& state = st(id);
  // A listener meets the p2p requests of peers whose ids opted in (collisions, duplicates),
  // and takes plain requests as rdma_cm does: on unless turned off.
  if (auto set = state.cpp->set_option(CmOption::peer_to_peer, state.peer_to_peer == 0 ? 0 : 1); !set)
    return fail_errno(set.error());
  if (auto listening = state.cpp->listen(backlog); !listening) return fail_errno(listening.error());
  bind_to_device(id);
  fill_route(id);
  return 0;
}

int rdma_connect(rdma_cm_id* id, rdma_conn_param* conn_param) {
  if (!id) return fail_errno(EINVAL);
  IdState& state = st(id);
  auto param = to_conn_param(id, conn_param, kMaxRdAtom, kMaxRdAtom);
  if (!param) return fail_errno(param.error());
  if (auto set = state.cpp->set_option(CmOption::peer_to_peer, effective_peer_to_peer(id) ? 1 : 0); !set)
    return fail_errno(set.error());
  return finish(id, state.cpp->connect(*param));
}

int rdma_accept(rdma_cm_id* id, rdma_conn_param* conn_param) {
  if (!id) return fail_errno(EINVAL);
  IdState& state = st(id);
  // Without parameters the answer matches what the request asked for.
  auto param = to_conn_param(id, conn_param, state.request_responder_resources, state.request_initiator_depth);
  if (!param) return fail_errno(param.error());
  name_ud_qp(id, *param);
  return finish(id, state.cpp->accept(*param));
}

int rdma_reject(rdma_cm_id* id, const void* private_data, uint8_t private_data_len) {
  if (!id || (private_data_len && !private_data)) return fail_errno(EINVAL);
  const std::span bytes(static_cast<const std::uint8_t*>(private_data), private_data_len);
  auto rejected = st(id).cpp->reject(bytes);
  return rejected ? 0 : fail_errno(rejected.error());
}

int rdma_reject_ece(rdma_cm_id* id, const void* private_data, uint8_t private_data_len) {
  return rdma_reject(id, private_data, private_data_len);
}

int rdma_establish(rdma_cm_id* id) {
  if (!id || id->qp) return fail_errno(EINVAL);  // rdma_cm: only for an id without a QP
  auto established = st(id).cpp->establish();
  return established ? 0 : fail_errno(established.error());
}

int rdma_disconnect(rdma_cm_id* id) {
  if (!id) return fail_errno(EINVAL);
  auto done = st(id).cpp->disconnect();
  if (!done) return fail_errno(done.error() == std::errc::not_connected ? EINVAL : errno_of(done.error()));
  return st(id).sync ? sync_complete(id) : 0;
}

int rdma_notify(rdma_cm_id* id, ibv_event_type) { return id ? 0 : fail_errno(EINVAL); }

// --- options ---

int rdma_set_option(rdma_cm_id* id, int level, int optname, void* optval, size_t optlen) {
  if (!id || (!optval && optlen)) return fail_errno(EINVAL);
  IdState& state = st(id);
  if (level == RDMA_OPTION_ID) {
    switch (optname) {
      // Accepted with rdma_cm's sizes; they change nothing for MPA over TCP (the listening
      // socket always reuses its address, the stack speaks IPv4 only).
      case RDMA_OPTION_ID_TOS:
      case RDMA_OPTION_ID_ACK_TIMEOUT:
        return optlen == sizeof(std::uint8_t) ? 0 : fail_errno(EINVAL);
      case RDMA_OPTION_ID_REUSEADDR:
      case RDMA_OPTION_ID_AFONLY:
        return optlen == sizeof(int) ? 0 : fail_errno(EINVAL);
      case RDMA_OPTION_ID_PEER_TO_PEER: {
        if (optlen != sizeof(int)) return fail_errno(EINVAL);
        int on;
        std::memcpy(&on, optval, sizeof on);
        if (on != 0 && on != 1) return fail_errno(EINVAL);
        if (auto set = state.cpp->set_option(CmOption::peer_to_peer, on); !set) return fail_errno(set.error());
        state.peer_to_peer = on;
        return 0;
      }
      case RDMA_OPTION_ID_P2P_TAG: {
        if (optlen != sizeof(std::uint32_t)) return fail_errno(EINVAL);
        std::uint32_t tag;
        std::memcpy(&tag, optval, sizeof tag);
        auto set = state.cpp->set_option(CmOption::p2p_tag, tag);
        return set ? 0 : fail_errno(set.error());
      }
      default:
        return fail_errno(ENOSYS);
    }
  }
  // RDMA_OPTION_IB carries IB path records: there are none over TCP.
  return fail_errno(ENOSYS);
}

__be16 rdma_get_src_port(rdma_cm_id* id) { return id ? id->route.addr.src_sin.sin_port : 0; }
__be16 rdma_get_dst_port(rdma_cm_id* id) { return id ? id->route.addr.dst_sin.sin_port : 0; }

// --- not offered: multicast (an iWARP device has none) and IB's ECE ---

int rdma_join_multicast(rdma_cm_id*, sockaddr*, void*) { return fail_errno(ENOSYS); }
int rdma_leave_multicast(rdma_cm_id*, sockaddr*) { return fail_errno(ENOSYS); }
int rdma_join_multicast_ex(rdma_cm_id*, rdma_cm_join_mc_attr_ex*, void*) { return fail_errno(ENOSYS); }
int rdma_set_local_ece(rdma_cm_id*, ibv_ece*) { return fail_errno(EOPNOTSUPP); }
int rdma_get_remote_ece(rdma_cm_id*, ibv_ece*) { return fail_errno(EOPNOTSUPP); }
