#include "api/roce/roce_verbs.hpp"

#include <mutex>

#include "api/context_impl.hpp"
#include "api/queue_pair_impl.hpp"
#include "api/roce/roce_cm.hpp"
#include "api/roce/roce_device.hpp"

namespace peercm::detail::roce {

namespace {

std::optional<wire::roce::PathMtu> path_mtu_of(std::uint32_t bytes) {
  switch (bytes) {
    case 256: return wire::roce::PathMtu::mtu256;
    case 512: return wire::roce::PathMtu::mtu512;
    case 1024: return wire::roce::PathMtu::mtu1024;
    case 2048: return wire::roce::PathMtu::mtu2048;
    case 4096: return wire::roce::PathMtu::mtu4096;
    default: return std::nullopt;
  }
}

// The QueuePairImpl of a QP made with QueuePair::create, shared (the device keeps it weakly).
std::shared_ptr<QueuePairImpl> standalone(QueuePair& qp) {
  QueuePairImpl& impl = qp.impl();
  auto found = impl.context->standalone_qps.find(impl.qp_num);
  if (found == impl.context->standalone_qps.end()) return nullptr;
  return found->second.lock();
}

}  // namespace

Result<Ipv4Address, std::errc> gid_address(Context& context, int index) {
  ContextImpl& ctx = context.impl();
  std::lock_guard lock(ctx.mutex);
  return device_of(ctx).gid_address(index);
}

int gid_index_of(Context& context, Ipv4Address address) {
  ContextImpl& ctx = context.impl();
  std::lock_guard lock(ctx.mutex);
  return device_of(ctx).gid_index_of(address);
}

Status<std::errc> connect_rc(QueuePair& qp, const RcPath& path) {
  QueuePairImpl& impl = qp.impl();
  ContextImpl& ctx = *impl.context;
  std::lock_guard lock(ctx.mutex);
  auto shared = standalone(qp);
  if (!shared || shared->claimed || impl.roce || impl.roce_ud || impl.roce_uc) return fail(std::errc::invalid_argument);
  if (impl.engine->state() != QpState::reset && impl.engine->state() != QpState::init)
    return fail(std::errc::invalid_argument);
  const auto pmtu = path_mtu_of(path.path_mtu);
  if (!pmtu || path.remote_qpn > wire::roce::kQpnMask || path.rq_psn > wire::roce::kQpnMask ||
      path.sq_psn > wire::roce::kQpnMask || path.remote == 0)
    return fail(std::errc::invalid_argument);
  RoceDevice& device = device_of(ctx);
  if (device.gid_index_of(path.local) < 0) return fail(std::errc::invalid_argument);
  if (auto port = device.port(path.local); !port) return fail(port.error());
  const core::roce::RcQpConfig config{.pd = impl.pd,
                                      .caps = impl.caps,
                                      .signal_all = impl.signal_all,
                                      .srq = impl.srq ? &impl.srq->queue : nullptr};
  auto roce = RoceQp::open(config, ctx.memory, *impl.send_cq, *impl.recv_cq, impl.qp_num, path.local);
  if (!roce) return fail(roce.error());
  core::roce::RcConnectParams params;
  params.local_qpn = impl.qp_num;
  params.remote_qpn = path.remote_qpn;
  params.send_psn = path.sq_psn;
  params.recv_psn = path.rq_psn;
  params.pmtu = *pmtu;
  params.local_ack_timeout = path.timeout;
  params.retry_cnt = path.retry_cnt & 7;
  params.rnr_retry = path.rnr_retry & 7;
  params.min_rnr_timer = path.min_rnr_timer & 0x1F;
  // Zero outstanding Reads would stall every Read; verbs' 0 means "none offered", which the
  // peer's IRD then bounds anyway.
  params.max_rd_atomic = std::max<std::uint8_t>(1, path.max_rd_atomic);
  params.max_dest_rd_atomic = std::max<std::uint8_t>(1, path.max_dest_rd_atomic);
  params.local_ip = to_bytes(path.local);
  params.remote_ip = to_bytes(path.remote);
  params.udp_source_port = (*roce)->source_port;
  params.ack_delay = device.options().ack_delay;
  (*roce)->remote_address = path.remote;
  // Receives posted in INIT (rc_pingpong posts them before connecting) move to the RC core.
  (*roce)->rc.adopt_receives(impl.engine->take_posted_receives());
  if (auto connected = (*roce)->rc.connect(params, now()); !connected) return fail(connected.error());
  impl.roce = std::move(*roce);
  impl.drop_idle_engine();
  shared->claimed = true;  // no CmId takes it by number any more
  device.add_qp(shared);
  device.pump();
  return {};
}

Status<std::errc> start_rc_requester(QueuePair& qp, const RcPath& path) {
  QueuePairImpl& impl = qp.impl();
  ContextImpl& ctx = *impl.context;
  std::lock_guard lock(ctx.mutex);
  if (!impl.roce) return fail(std::errc::invalid_argument);
  const core::roce::RcRequesterParams params{.send_psn = path.sq_psn,
                                             .local_ack_timeout = path.timeout,
                                             .retry_cnt = static_cast<std::uint8_t>(path.retry_cnt & 7),
                                             .rnr_retry = static_cast<std::uint8_t>(path.rnr_retry & 7),
                                             .max_rd_atomic = std::max<std::uint8_t>(1, path.max_rd_atomic)};
  if (auto set = impl.roce->rc.set_requester(params); !set) return fail(std::errc::invalid_argument);
  device_of(ctx).touch(impl.qp_num);
  device_of(ctx).pump();
  return {};
}

Status<std::errc> make_ud(QueuePair& qp) {
  QueuePairImpl& impl = qp.impl();
  ContextImpl& ctx = *impl.context;
  std::lock_guard lock(ctx.mutex);
  auto shared = standalone(qp);
  if (!shared || shared->claimed || impl.roce || impl.roce_ud || impl.srq) return fail(std::errc::invalid_argument);
  const core::roce::UdQpConfig config{
      .qpn = impl.qp_num, .pd = impl.pd, .caps = impl.caps, .signal_all = impl.signal_all};
  impl.roce_ud = std::make_unique<RoceUdQp>(config, ctx.memory, *impl.send_cq, *impl.recv_cq);
  impl.drop_idle_engine();
  shared->claimed = true;  // a UD QP never carries a connection
  device_of(ctx).add_qp(shared);
  return {};
}

bool is_ud(QueuePair& qp) {
  std::lock_guard lock(qp.impl().context->mutex);
  return qp.impl().roce_ud != nullptr;
}

Status<std::errc> modify_ud(QueuePair& qp, UdState state, std::uint32_t qkey, bool set_qkey, std::uint32_t sq_psn) {
  QueuePairImpl& impl = qp.impl();
  std::lock_guard lock(impl.context->mutex);
  if (!impl.roce_ud) return fail(std::errc::invalid_argument);
  core::roce::UdQueuePair& ud = impl.roce_ud->ud;
  if (set_qkey) ud.set_qkey(qkey);
  const QpState now_in = ud.state();
  switch (state) {
    case UdState::keep: return {};
    case UdState::init:
      if (now_in != QpState::reset && now_in != QpState::init) return fail(std::errc::invalid_argument);
      ud.to_init(ud.qkey());
      return {};
    case UdState::rtr:
      if (now_in != QpState::init && now_in != QpState::rtr) return fail(std::errc::invalid_argument);
      ud.to_rtr();
      return {};
    case UdState::rts:
      if (now_in != QpState::rtr && now_in != QpState::rts) return fail(std::errc::invalid_argument);
      ud.to_rts(sq_psn);
      return {};
    case UdState::error:
      ud.modify_to_error();
      return {};
  }
  return fail(std::errc::invalid_argument);
}

std::uint32_t ud_qkey(QueuePair& qp) {
  std::lock_guard lock(qp.impl().context->mutex);
  return qp.impl().roce_ud ? qp.impl().roce_ud->ud.qkey() : 0;
}

Status<std::errc> post_ud_send(QueuePair& qp, const SendWr& wr, const core::roce::UdDestination& destination) {
  QueuePairImpl& impl = qp.impl();
  ContextImpl& ctx = *impl.context;
  std::lock_guard lock(ctx.mutex);
  if (!impl.roce_ud) return fail(std::errc::invalid_argument);
  const Ipv4Address local = from_bytes(destination.local_ip);
  const Ipv4Address remote = from_bytes(destination.remote_ip);
  if (auto bound = impl.roce_ud->send_from(local); !bound) return fail(bound.error());
  const std::uint32_t max_payload = is_loopback(local) && is_loopback(remote) ? 4096 : 1024;
  auto posted = impl.roce_ud->ud.post_send(wr, destination, max_payload);
  if (posted) {
    device_of(ctx).touch(impl.qp_num);
    device_of(ctx).pump();
  }
  return posted;
}

core::roce::UdStats ud_stats(QueuePair& qp) {
  std::lock_guard lock(qp.impl().context->mutex);
  return qp.impl().roce_ud ? qp.impl().roce_ud->ud.stats() : core::roce::UdStats{};
}

Status<std::errc> make_uc(QueuePair& qp) {
  QueuePairImpl& impl = qp.impl();
  ContextImpl& ctx = *impl.context;
  std::lock_guard lock(ctx.mutex);
  auto shared = standalone(qp);
  if (!shared || shared->claimed || impl.roce || impl.roce_ud || impl.roce_uc) return fail(std::errc::invalid_argument);
  const core::roce::UcQpConfig config{.qpn = impl.qp_num,
                                      .pd = impl.pd,
                                      .caps = impl.caps,
                                      .signal_all = impl.signal_all,
                                      .srq = impl.srq ? &impl.srq->queue : nullptr};
  impl.roce_uc = std::make_unique<RoceUcQp>(config, ctx.memory, *impl.send_cq, *impl.recv_cq);
  impl.drop_idle_engine();
  shared->claimed = true;  // a UC QP never carries a CM connection
  device_of(ctx).add_qp(shared);
  return {};
}

Status<std::errc> modify_uc(QueuePair& qp, const UcModify& change) {
  QueuePairImpl& impl = qp.impl();
  ContextImpl& ctx = *impl.context;
  std::lock_guard lock(ctx.mutex);
  if (!impl.roce_uc) return fail(std::errc::invalid_argument);
  RoceUcQp& roce = *impl.roce_uc;
  switch (change.state) {
    case UcState::init: return roce.uc.to_init();
    case UcState::rtr: {
      const auto pmtu = path_mtu_of(change.path_mtu);
      if (!pmtu || change.remote == 0 || roce.uc.state() != QpState::init ||
          change.remote_qpn > wire::roce::kQpnMask || change.rq_psn > wire::roce::kQpnMask)
        return fail(std::errc::invalid_argument);
      RoceDevice& device = device_of(ctx);
      if (device.gid_index_of(change.local) < 0) return fail(std::errc::invalid_argument);
      // Our packets arrive on (local, 4791); they leave from a socket of the QP's own.
      if (auto port = device.port(change.local); !port) return fail(port.error());
      core::roce::UcPath path{.remote_qpn = change.remote_qpn,
                              .recv_psn = change.rq_psn,
                              .pmtu = *pmtu,
                              .local_ip = to_bytes(change.local),
                              .remote_ip = to_bytes(change.remote)};
      auto source_port = roce.open_socket(change.local);
      if (!source_port) return fail(source_port.error());
      path.udp_source_port = *source_port;
      roce.remote_address = change.remote;
      return roce.uc.to_rtr(path);
    }
    case UcState::rts: return roce.uc.to_rts(change.sq_psn);  // sends are refused before RTS
    case UcState::error:
      roce.uc.modify_to_error();
      device_of(ctx).touch(impl.qp_num);
      device_of(ctx).pump();
      return {};
  }
  return fail(std::errc::invalid_argument);
}

core::roce::UcStats uc_stats(QueuePair& qp) {
  std::lock_guard lock(qp.impl().context->mutex);
  return qp.impl().roce_uc ? qp.impl().roce_uc->uc.stats() : core::roce::UcStats{};
}

core::roce::RcStats rc_stats(QueuePair& qp) {
  std::lock_guard lock(qp.impl().context->mutex);
  return qp.impl().roce ? qp.impl().roce->rc.stats() : core::roce::RcStats{};
}

std::uint64_t dropped_unknown_qp(Context& context) {
  ContextImpl& ctx = context.impl();
  std::lock_guard lock(ctx.mutex);
  return ctx.roce ? ctx.roce->dropped_unknown_qp : 0;
}

std::uint64_t qp_drains(Context& context) {
  ContextImpl& ctx = context.impl();
  std::lock_guard lock(ctx.mutex);
  return ctx.roce ? ctx.roce->qp_drains() : 0;
}

PortUnreachableCounts port_unreachable_counts(Context& context) {
  ContextImpl& ctx = context.impl();
  std::lock_guard lock(ctx.mutex);
  if (!ctx.roce) return {};
  return {.taken = ctx.roce->port_unreachable_taken, .ignored = ctx.roce->port_unreachable_ignored};
}

void run_timer(Context& context) {
  ContextImpl& ctx = context.impl();
  std::lock_guard lock(ctx.mutex);
  if (ctx.roce) ctx.roce->run_timer();
}

ShareCounts share_counts(Context& context) {
  ContextImpl& ctx = context.impl();
  std::lock_guard lock(ctx.mutex);
  if (!ctx.roce) return {.slot = ctx.roce_slot()};
  const RoceDevice& device = *ctx.roce;
  return {.slot = device.slot(),
          .forwarded_out = device.forwarded_out,
          .forwarded_in = device.forwarded_in,
          .dropped_no_owner = device.dropped_no_owner,
          .dropped_forward_full = device.dropped_forward_full};
}

}  // namespace peercm::detail::roce
