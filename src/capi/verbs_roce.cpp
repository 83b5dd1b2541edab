// Verbs without the connection manager over RoCEv2, as RoCE hardware offers them: GIDs that
// name the context's IPv4 addresses (::ffff:a.b.c.d), RC queue pairs connected through
// ibv_modify_qp with the peer's GID, QPN and PSNs, UC queue pairs connected the same way,
// UD queue pairs, and the address handles UD sends name (docs/c-api.md, "RoCE without the
// CM"). Over iWARP a QP only runs on the CM's TCP stream: address handles and UC/UD QPs are
// EOPNOTSUPP and an RTS that no connection backs EINVAL.
#include <arpa/inet.h>

#include <cstdlib>
#include <cstring>

#include "api/roce/roce_verbs.hpp"
#include "capi/handles.hpp"

namespace peercm::capi {
namespace {

namespace roce = peercm::detail::roce;

struct AhState {
  std::uint32_t local = 0;   // host order
  std::uint32_t remote = 0;  // host order
};
using AhShell = Shell<ibv_ah, AhState>;

std::atomic<std::uint32_t> g_ah_handles{0};

template <class T>
T* fail_null(int error) {
  errno = error;
  return nullptr;
}

// ::ffff:a.b.c.d, the RoCEv2 GID of an IPv4 address.
ibv_gid gid_of(std::uint32_t address) {
  ibv_gid gid{};
  gid.raw[10] = 0xFF;
  gid.raw[11] = 0xFF;
  const std::uint32_t be = htonl(address);
  std::memcpy(gid.raw + 12, &be, 4);
  return gid;
}

// The IPv4 address of an IPv4-mapped GID, else nullopt (IPv6 GIDs have no route here).
std::optional<std::uint32_t> address_of(const ibv_gid& gid) {
  for (int i = 0; i < 10; ++i)
    if (gid.raw[i] != 0) return std::nullopt;
  if (gid.raw[10] != 0xFF || gid.raw[11] != 0xFF) return std::nullopt;
  std::uint32_t be = 0;
  std::memcpy(&be, gid.raw + 12, 4);
  return ntohl(be);
}

core::roce::Ipv4Bytes bytes_of(std::uint32_t address) {
  return {static_cast<std::uint8_t>(address >> 24), static_cast<std::uint8_t>(address >> 16),
          static_cast<std::uint8_t>(address >> 8), static_cast<std::uint8_t>(address)};
}

std::uint32_t mtu_bytes(ibv_mtu mtu) {
  switch (mtu) {
    case IBV_MTU_256: return 256;
    case IBV_MTU_512: return 512;
    case IBV_MTU_1024: return 1024;
    case IBV_MTU_2048: return 2048;
    case IBV_MTU_4096: return 4096;
  }
  return 0;
}

// UD QPs: every state change goes to the UD core.
int modify_ud_qp(ibv_qp* qp, const ibv_qp_attr& attr, int attr_mask) {
  QpHandleState& state = *state_of<QpHandleState>(qp);
  roce::UdState target = roce::UdState::keep;
  if (attr_mask & IBV_QP_STATE) {
    switch (attr.qp_state) {
      case IBV_QPS_INIT: target = roce::UdState::init; break;
      case IBV_QPS_RTR: target = roce::UdState::rtr; break;
      case IBV_QPS_RTS: target = roce::UdState::rts; break;
      case IBV_QPS_ERR: target = roce::UdState::error; break;
      default: return EINVAL;  // RESET, SQD, SQE: a UD QP is not reused
    }
  }
  const std::uint32_t sq_psn = (attr_mask & IBV_QP_SQ_PSN) ? attr.sq_psn : 0;
  auto modified = roce::modify_ud(*state.cpp, target, attr.qkey, (attr_mask & IBV_QP_QKEY) != 0, sq_psn);
  if (!modified) return errno_of(modified.error());
  if (attr_mask & IBV_QP_STATE) state.recorded = attr.qp_state;
  qp->state = state.recorded;
  return 0;
}

// UC QPs: every state change goes to the UC core. The attributes are UC's (IBA 11.2.4.2):
// RC's timers, retry counts and Read/atomic depths, and UD's Q_Key, are EINVAL, as a RoCE
// provider's modify_qp refuses attributes outside the QP type's mask.
int modify_uc_qp(ibv_qp* qp, const ibv_qp_attr& attr, int attr_mask) {
  QpHandleState& state = *state_of<QpHandleState>(qp);
  constexpr int kNotUc = IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC |
                         IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER | IBV_QP_QKEY;
  if (attr_mask & kNotUc) return EINVAL;
  if (!(attr_mask & IBV_QP_STATE)) return 0;  // P_Key, port, access flags: nothing to keep
  roce::UcModify change;
  switch (attr.qp_state) {
    case IBV_QPS_INIT: change.state = roce::UcState::init; break;
    case IBV_QPS_RTR: {
      change.state = roce::UcState::rtr;
      // RoCE names the peer by GID: the address vector and the QPN are required.
      if (!(attr_mask & IBV_QP_AV) || !(attr_mask & IBV_QP_DEST_QPN) || !attr.ah_attr.is_global) return EINVAL;
      const auto remote = address_of(attr.ah_attr.grh.dgid);
      if (!remote) return EINVAL;
      auto local = roce::gid_address(cpp_context(qp->context), attr.ah_attr.grh.sgid_index);
      if (!local) return EINVAL;
      change.local = *local;
      change.remote = *remote;
      change.remote_qpn = attr.dest_qp_num;
      change.rq_psn = (attr_mask & IBV_QP_RQ_PSN) ? attr.rq_psn : 0;
      change.path_mtu = (attr_mask & IBV_QP_PATH_MTU) ? mtu_bytes(attr.path_mtu) : 1024;
      break;
    }
    case IBV_QPS_RTS:
      change.state = roce::UcState::rts;
      change.sq_psn = (attr_mask & IBV_QP_SQ_PSN) ? attr.sq_psn : 0;
      break;
    case IBV_QPS_ERR: change.state = roce::UcState::error; break;
    default: return EINVAL;  // RESET, SQD, SQE: a UC QP is not reused
  }
  auto modified = roce::modify_uc(*state.cpp, change);
  if (!modified) return errno_of(modified.error());
  state.recorded = attr.qp_state;
  qp->state = state.recorded;
  return 0;
}

}  // namespace

bool uses_roce(ibv_context* context) { return transport_of(context) == Transport::roce; }

int roce_query_gid(ibv_context* context, int index, ibv_gid* gid) {
  auto address = roce::gid_address(cpp_context(context), index);
  if (!address) {
    errno = errno_of(address.error());
    return -1;
  }
  *gid = gid_of(*address);
  return 0;
}

namespace {

roce::RcPath rc_path_of(const PendingRtr& rtr) {
  roce::RcPath path;
  path.local = rtr.local;
  path.remote = rtr.remote;
  path.remote_qpn = rtr.remote_qpn;
  path.rq_psn = rtr.rq_psn;
  path.path_mtu = rtr.path_mtu;
  path.max_dest_rd_atomic = rtr.max_dest_rd_atomic;
  path.min_rnr_timer = rtr.min_rnr_timer;
  return path;
}

}  // namespace

std::optional<int> modify_qp_without_cm(ibv_qp* qp, const ibv_qp_attr& attr, int attr_mask) {
  if (qp->qp_type == IBV_QPT_UD) return modify_ud_qp(qp, attr, attr_mask);
  if (qp->qp_type == IBV_QPT_UC) return modify_uc_qp(qp, attr, attr_mask);
  QpHandleState& state = *state_of<QpHandleState>(qp);
  if (state.id != nullptr || !(attr_mask & IBV_QP_STATE)) return std::nullopt;  // the CM's QP
  const bool roce_context = uses_roce(qp->context);
  if (attr.qp_state == IBV_QPS_RTR && (attr_mask & IBV_QP_AV) && (attr_mask & IBV_QP_DEST_QPN)) {
    // The peer named by GID and QPN, as RoCE and IB programs connect without the CM.
    // A QP a connection already runs keeps ibv_modify_qp's recording rule.
    if (state.cpp->state() != peercm::QpState::reset && state.cpp->state() != peercm::QpState::init)
      return std::nullopt;
    if (state.recorded != IBV_QPS_INIT) return EINVAL;  // verbs: RTR comes from INIT
    PendingRtr rtr;
    if (roce_context) {
      const ibv_ah_attr& ah = attr.ah_attr;
      if (!ah.is_global) return EINVAL;  // RoCE addresses by GID: no GRH, no route
      const auto remote = address_of(ah.grh.dgid);
      if (!remote) return EINVAL;
      auto local = roce::gid_address(cpp_context(qp->context), ah.grh.sgid_index);
      if (!local) return EINVAL;
      rtr.local = *local;
      rtr.remote = *remote;
      rtr.remote_qpn = attr.dest_qp_num;
      rtr.rq_psn = (attr_mask & IBV_QP_RQ_PSN) ? attr.rq_psn : 0;
      rtr.path_mtu = (attr_mask & IBV_QP_PATH_MTU) ? mtu_bytes(attr.path_mtu) : 1024;
      if (rtr.path_mtu == 0 || rtr.remote_qpn > 0xFFFFFF || rtr.rq_psn > 0xFFFFFF) return EINVAL;
      if (attr_mask & IBV_QP_MAX_DEST_RD_ATOMIC) rtr.max_dest_rd_atomic = attr.max_dest_rd_atomic;
      if (attr_mask & IBV_QP_MIN_RNR_TIMER) rtr.min_rnr_timer = attr.min_rnr_timer;
      // The responder runs from RTR on: a QP that only receives (perftest's bandwidth
      // servers) stays in RTR and must acknowledge, answer Reads and take Writes there.
      // The requester's values wait for RTS (start_rc_requester).
      if (auto connected = roce::connect_rc(*state.cpp, rc_path_of(rtr)); !connected)
        return errno_of(connected.error());
    }
    // Over iWARP RTR is accepted and recorded, as siw does; the RTS after it fails below.
    state.rtr = rtr;
    state.recorded = IBV_QPS_RTR;
    qp->state = IBV_QPS_RTR;
    return 0;
  }
  if (attr.qp_state == IBV_QPS_RTS && state.rtr) {
    // iWARP: a QP runs only on the TCP stream the CM set up (MPA), which modify_qp cannot
    // make. siw answers an RTS without its socket with EINVAL; so does this.
    if (!roce_context || state.rtr->remote == 0) return EINVAL;
    roce::RcPath path = rc_path_of(*state.rtr);
    path.sq_psn = (attr_mask & IBV_QP_SQ_PSN) ? attr.sq_psn : 0;
    if (attr_mask & IBV_QP_TIMEOUT) path.timeout = attr.timeout;
    if (attr_mask & IBV_QP_RETRY_CNT) path.retry_cnt = attr.retry_cnt;
    if (attr_mask & IBV_QP_RNR_RETRY) path.rnr_retry = attr.rnr_retry;
    if (attr_mask & IBV_QP_MAX_QP_RD_ATOMIC) path.max_rd_atomic = attr.max_rd_atomic;
    if (path.sq_psn > 0xFFFFFF) return EINVAL;
    if (auto started = roce::start_rc_requester(*state.cpp, path); !started) return errno_of(started.error());
    state.rtr.reset();
    state.recorded = IBV_QPS_RTS;
    qp->state = IBV_QPS_RTS;
    return 0;
  }
  if (attr.qp_state == IBV_QPS_RESET || attr.qp_state == IBV_QPS_ERR) state.rtr.reset();
  return std::nullopt;
}

int make_ud_qp(ibv_qp* qp) {
  auto made = roce::make_ud(*state_of<QpHandleState>(qp)->cpp);
  return made ? 0 : errno_of(made.error());
}

int make_uc_qp(ibv_qp* qp) {
  auto made = roce::make_uc(*state_of<QpHandleState>(qp)->cpp);
  return made ? 0 : errno_of(made.error());
}

std::uint32_t ud_qkey(ibv_qp* qp) { return roce::ud_qkey(*state_of<QpHandleState>(qp)->cpp); }

int post_ud_send(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad_wr) {
  QueuePair& cpp = *state_of<QpHandleState>(qp)->cpp;
  SendWr converted;
  for (ibv_send_wr* at = wr; at; at = at->next) {
    Status<std::errc> ok;
    if (at->opcode != IBV_WR_SEND && at->opcode != IBV_WR_SEND_WITH_IMM) ok = fail(std::errc::invalid_argument);
    if (ok && (!at->wr.ud.ah || at->wr.ud.ah->context != qp->context)) ok = fail(std::errc::invalid_argument);
    if (ok) ok = convert_sge_list(at->sg_list, at->num_sge, converted.sg_list);
    if (ok) {
      converted.wr_id = at->wr_id;
      converted.opcode = at->opcode == IBV_WR_SEND_WITH_IMM ? WrOpcode::send_with_imm : WrOpcode::send;
      converted.flags = at->send_flags & (IBV_SEND_SIGNALED | IBV_SEND_SOLICITED | IBV_SEND_INLINE);
      converted.imm_data = at->opcode == IBV_WR_SEND_WITH_IMM ? at->imm_data : 0;
      const AhState& ah = *state_of<AhState>(at->wr.ud.ah);
      const core::roce::UdDestination destination{.local_ip = bytes_of(ah.local),
                                                  .remote_ip = bytes_of(ah.remote),
                                                  .remote_qpn = at->wr.ud.remote_qpn,
                                                  .remote_qkey = at->wr.ud.remote_qkey};
      ok = roce::post_ud_send(cpp, converted, destination);
    }
    if (!ok) {
      if (bad_wr) *bad_wr = at;
      return errno_of(ok.error());
    }
  }
  return 0;
}

}  // namespace peercm::capi

using namespace peercm;
using namespace peercm::capi;

// --- address handles ---

ibv_ah* ibv_create_ah(ibv_pd* pd, ibv_ah_attr* attr) {
  if (!pd || !attr) return fail_null<ibv_ah>(EINVAL);
  if (!uses_roce(pd->context)) return fail_null<ibv_ah>(EOPNOTSUPP);  // iWARP has no UD
  // RoCE routes by GID: an address vector without a GRH names nothing (rdma-core's RoCE
  // providers refuse it too).
  if (!attr->is_global) return fail_null<ibv_ah>(EINVAL);
  const auto remote = address_of(attr->grh.dgid);
  if (!remote) return fail_null<ibv_ah>(EINVAL);
  auto local = detail::roce::gid_address(cpp_context(pd->context), attr->grh.sgid_index);
  if (!local) return fail_null<ibv_ah>(EINVAL);
  auto* shell = new AhShell{};
  shell->state = new AhState{.local = *local, .remote = *remote};
  shell->pub.context = pd->context;
  shell->pub.pd = pd;
  shell->pub.handle = ++g_ah_handles;
  state_of<PdState>(pd)->users.fetch_add(1);
  return &shell->pub;
}

int ibv_destroy_ah(ibv_ah* ah) {
  if (!ah) return EINVAL;
  ibv_pd* pd = ah->pd;
  delete state_of<AhState>(ah);
  delete reinterpret_cast<AhShell*>(ah);
  release_pd_user(pd);
  return 0;
}

int ibv_init_ah_from_wc(ibv_context* context, uint8_t port_num, ibv_wc* wc, ibv_grh* grh, ibv_ah_attr* ah_attr) {
  if (!context || !wc || !ah_attr) return EINVAL;
  *ah_attr = ibv_ah_attr{};
  ah_attr->dlid = wc->slid;
  ah_attr->sl = wc->sl;
  ah_attr->src_path_bits = wc->dlid_path_bits;
  ah_attr->port_num = port_num;
  // RoCE needs the GRH: the sender is known by its address only.
  if (!(wc->wc_flags & IBV_WC_GRH) || !grh || !uses_roce(context)) return EINVAL;
  // Over IPv4 the GRH area holds 20 unused bytes and the IPv4 header (ud_queue_pair.hpp).
  std::array<std::uint8_t, core::roce::kGrhSize> area{};
  std::memcpy(area.data(), grh, area.size());
  const auto source = core::roce::ipv4_source_of_grh(area);
  if (!source) return EINVAL;
  const std::uint32_t sender = std::uint32_t{(*source)[0]} << 24 | std::uint32_t{(*source)[1]} << 16 |
                               std::uint32_t{(*source)[2]} << 8 | (*source)[3];
  const std::uint32_t receiver = std::uint32_t{area[36]} << 24 | std::uint32_t{area[37]} << 16 |
                                 std::uint32_t{area[38]} << 8 | area[39];
  const int index = detail::roce::gid_index_of(cpp_context(context), receiver);
  if (index < 0) return EINVAL;
  ah_attr->is_global = 1;
  ah_attr->grh.dgid = gid_of(sender);
  ah_attr->grh.sgid_index = static_cast<std::uint8_t>(index);
  ah_attr->grh.hop_limit = 0xFF;
  ah_attr->grh.traffic_class = area[21];
  return 0;
}

ibv_ah* ibv_create_ah_from_wc(ibv_pd* pd, ibv_wc* wc, ibv_grh* grh, uint8_t port_num) {
  if (!pd) return fail_null<ibv_ah>(EINVAL);
  ibv_ah_attr attr{};
  if (const int made = ibv_init_ah_from_wc(pd->context, port_num, wc, grh, &attr); made != 0)
    return fail_null<ibv_ah>(made);
  return ibv_create_ah(pd, &attr);
}
