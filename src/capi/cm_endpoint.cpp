// The QP side of rdma_cm: rdma_create_qp (with the CQs it makes for an id that brings none,
// their cq_context being the id) and the synchronous endpoint calls rdma_create_ep,
// rdma_get_request and rdma_destroy_ep.
#include <algorithm>
#include <cstring>

#include "capi/handles.hpp"

namespace peercm::capi {
namespace {

IdState& st(rdma_cm_id* id) { return *state_of<IdState>(id); }

// A CQ with its own completion channel, as rdma_create_qp() makes for rdma_get_*_comp().
bool make_id_cq(rdma_cm_id* id, std::uint32_t depth, ibv_comp_channel** channel, ibv_cq** cq) {
  *channel = ibv_create_comp_channel(id->verbs);
  if (!*channel) return false;
  *cq = ibv_create_cq(id->verbs, static_cast<int>(std::max(depth, 1u)), id, *channel, 0);
  if (*cq) return true;
  ibv_destroy_comp_channel(*channel);
  *channel = nullptr;
  return false;
}

// rdma_cm hands a UD id's QP over ready to use: INIT with the UDP port space's Q_Key, RTR, RTS.
// It stays the verbs' QP (the CM never drives it); the id names it in its SIDR_REP.
int ready_ud_qp(ibv_qp* qp) {
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_INIT;
  attr.port_num = 1;
  attr.qkey = RDMA_UDP_QKEY;
  if (const int ret = ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY); ret != 0)
    return ret;
  attr = ibv_qp_attr{};
  attr.qp_state = IBV_QPS_RTR;
  if (const int ret = ibv_modify_qp(qp, &attr, IBV_QP_STATE); ret != 0) return ret;
  attr.qp_state = IBV_QPS_RTS;
  attr.sq_psn = 0;
  return ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_SQ_PSN);
}

void destroy_id_cqs(rdma_cm_id* id) {
  if (id->recv_cq) ibv_destroy_cq(id->recv_cq);
  if (id->send_cq && id->send_cq != id->recv_cq) ibv_destroy_cq(id->send_cq);
  if (id->recv_cq_channel) ibv_destroy_comp_channel(id->recv_cq_channel);
  if (id->send_cq_channel && id->send_cq_channel != id->recv_cq_channel) ibv_destroy_comp_channel(id->send_cq_channel);
  id->recv_cq = id->send_cq = nullptr;
  id->recv_cq_channel = id->send_cq_channel = nullptr;
}

}  // namespace
}  // namespace peercm::capi

using namespace peercm;
using namespace peercm::capi;

int rdma_create_qp(rdma_cm_id* id, ibv_pd* pd, ibv_qp_init_attr* qp_init_attr) {
  if (!id || !qp_init_attr || id->qp) return fail_errno(EINVAL);
  // The id's port space decides the QP type; a zeroed attr (qp_type 0) takes it.
  if (qp_init_attr->qp_type != 0 && qp_init_attr->qp_type != id->qp_type) return fail_errno(EOPNOTSUPP);
  qp_init_attr->qp_type = id->qp_type;
  IdState& state = st(id);
  if (!id->verbs) id->verbs = state.context;
  if (!pd) pd = cm_default_pd(state.context);  // librdmacm's per-device PD
  if (!pd) return -1;
  if (pd->context != id->verbs) return fail_errno(EINVAL);
  // librdmacm: the id's SRQ (rdma_create_srq) unless the attributes name one.
  if (!qp_init_attr->srq) qp_init_attr->srq = id->srq;
  std::uint32_t recv_depth = qp_init_attr->cap.max_recv_wr;
  if (ibv_srq_attr srq_attr{}; qp_init_attr->srq && ibv_query_srq(qp_init_attr->srq, &srq_attr) == 0)
    recv_depth = std::max(recv_depth, srq_attr.max_wr);  // every WR of the SRQ may complete here
  const bool own_send = qp_init_attr->send_cq == nullptr;
  const bool own_recv = qp_init_attr->recv_cq == nullptr;
  if (own_recv && !make_id_cq(id, recv_depth, &id->recv_cq_channel, &id->recv_cq)) return -1;
  if (own_send && !make_id_cq(id, qp_init_attr->cap.max_send_wr, &id->send_cq_channel, &id->send_cq)) {
    destroy_id_cqs(id);
    return -1;
  }
  if (own_send) qp_init_attr->send_cq = id->send_cq;
  if (own_recv) qp_init_attr->recv_cq = id->recv_cq;
  ibv_qp* qp = ibv_create_qp(pd, qp_init_attr);
  const bool ud = id->qp_type == IBV_QPT_UD;
  if (qp && ud) {
    if (const int ret = ready_ud_qp(qp); ret != 0) {
      ibv_destroy_qp(qp);
      qp = nullptr;
      errno = ret;
    }
  } else if (qp) {
    if (auto attached = state.cpp->attach_qp(*state_of<QpHandleState>(qp)->cpp); !attached) {
      ibv_destroy_qp(qp);
      qp = nullptr;
      errno = errno_of(attached.error());
    }
  }
  if (!qp) {
    const int error = errno;
    destroy_id_cqs(id);
    return fail_errno(error);
  }
  if (!ud) {
    // librdmacm hands the QP over in INIT: the CM takes it from there.
    state_of<QpHandleState>(qp)->recorded = IBV_QPS_INIT;
    qp->state = IBV_QPS_INIT;
  }
  state_of<QpHandleState>(qp)->id = id;
  id->qp = qp;
  id->pd = pd;
  return 0;
}

int rdma_create_qp_ex(rdma_cm_id* id, ibv_qp_init_attr_ex* attr) {
  if (!id || !attr) return fail_errno(EINVAL);
  constexpr std::uint32_t understood = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
  if (attr->comp_mask & ~understood) return fail_errno(EOPNOTSUPP);
  const bool extended = (attr->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) != 0;
  if (extended && (!id->verbs || !send_ops_supported(id->verbs, attr->send_ops_flags))) return fail_errno(EOPNOTSUPP);
  ibv_qp_init_attr plain{};
  plain.qp_context = attr->qp_context;
  plain.send_cq = attr->send_cq;
  plain.recv_cq = attr->recv_cq;
  plain.srq = attr->srq;
  plain.cap = attr->cap;
  plain.qp_type = attr->qp_type;
  plain.sq_sig_all = attr->sq_sig_all;
  const int ret = rdma_create_qp(id, (attr->comp_mask & IBV_QP_INIT_ATTR_PD) ? attr->pd : nullptr, &plain);
  if (ret == 0) {
    attr->send_cq = plain.send_cq;
    attr->recv_cq = plain.recv_cq;
    attr->cap = plain.cap;
    if (extended) make_qp_extended(id->qp, attr->send_ops_flags);  // ibv_qp_to_qp_ex(id->qp) finds it
  }
  return ret;
}

void rdma_destroy_qp(rdma_cm_id* id) {
  if (!id || !id->qp) return;
  ibv_destroy_qp(id->qp);
  id->qp = nullptr;
  destroy_id_cqs(id);
}

// iWARP's answer (the kernel's iw_cm): INIT and RTR set the access flags; RTS is the CM's
// business, so nothing is left for the application to change.
int rdma_init_qp_attr(rdma_cm_id* id, ibv_qp_attr* qp_attr, int* qp_attr_mask) {
  if (!id || !qp_attr || !qp_attr_mask) return fail_errno(EINVAL);
  if (id->ps == RDMA_PS_UDP) {
    // rdma_cm's UD attributes: the UDP port space's Q_Key in INIT, the first PSN in RTS.
    switch (qp_attr->qp_state) {
      case IBV_QPS_INIT:
        qp_attr->pkey_index = 0;
        qp_attr->qkey = RDMA_UDP_QKEY;
        *qp_attr_mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY;
        break;
      case IBV_QPS_RTR:
        *qp_attr_mask = IBV_QP_STATE;
        break;
      case IBV_QPS_RTS:
        qp_attr->sq_psn = 0;
        *qp_attr_mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
        break;
      default:
        return fail_errno(EINVAL);
    }
    qp_attr->port_num = 1;
    return 0;
  }
  switch (qp_attr->qp_state) {
    case IBV_QPS_INIT:
    case IBV_QPS_RTR:
      qp_attr->qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
      *qp_attr_mask = IBV_QP_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_PORT;
      break;
    case IBV_QPS_RTS:
      *qp_attr_mask = IBV_QP_PORT;
      break;
    default:
      return fail_errno(EINVAL);
  }
  qp_attr->port_num = 1;
  return 0;
}

int rdma_create_ep(rdma_cm_id** id, rdma_addrinfo* res, ibv_pd* pd, ibv_qp_init_attr* qp_init_attr) {
  if (!id || !res || (res->ai_flags & RAI_PASSIVE ? !res->ai_src_addr : !res->ai_dst_addr))
    return fail_errno(EINVAL);
  rdma_cm_id* made = nullptr;
  if (rdma_create_id(nullptr, &made, nullptr, static_cast<rdma_port_space>(res->ai_port_space ? res->ai_port_space : RDMA_PS_TCP)) != 0)
    return -1;
  int ret = 0;
  if (res->ai_flags & RAI_PASSIVE) {
    ret = rdma_bind_addr(made, res->ai_src_addr);
    if (ret == 0 && qp_init_attr) {
      // Every request taken with rdma_get_request() gets a QP made like this.
      st(made).child_qp_attr = std::make_unique<ibv_qp_init_attr>(*qp_init_attr);
      st(made).child_pd = pd;
    }
  } else {
    ret = rdma_resolve_addr(made, res->ai_src_addr, res->ai_dst_addr, 2000);
    if (ret == 0) ret = rdma_resolve_route(made, 2000);
    if (ret == 0 && qp_init_attr) ret = rdma_create_qp(made, pd, qp_init_attr);
  }
  if (ret != 0) {
    const int error = errno;
    rdma_destroy_ep(made);
    return fail_errno(error);
  }
  *id = made;
  return 0;
}

void rdma_destroy_ep(rdma_cm_id* id) {
  if (!id) return;
  if (id->qp) rdma_destroy_qp(id);
  if (id->srq) rdma_destroy_srq(id);
  rdma_destroy_id(id);
}

int rdma_get_request(rdma_cm_id* listen, rdma_cm_id** id) {
  if (!listen || !id || !st(listen).sync) return fail_errno(EINVAL);
  if (listen->event) {
    rdma_ack_cm_event(listen->event);
    listen->event = nullptr;
  }
  rdma_cm_event* event = nullptr;
  if (rdma_get_cm_event(listen->channel, &event) != 0) return -1;
  int error = 0;
  if (event->event == RDMA_CM_EVENT_REJECTED) {
    error = ECONNREFUSED;
  } else if (event->status) {
    error = -event->status;
  } else if (event->event != RDMA_CM_EVENT_CONNECT_REQUEST) {
    error = EINVAL;
  } else if (st(listen).child_qp_attr) {
    ibv_qp_init_attr attr = *st(listen).child_qp_attr;
    if (rdma_create_qp(event->id, st(listen).child_pd, &attr) != 0) error = errno;
  }
  if (error) {
    listen->event = event;  // kept for the application to look at, as librdmacm does
    return fail_errno(error);
  }
  *id = event->id;
  (*id)->event = event;
  return 0;
}

// --- the shared receive queue of an id ---

// The QPs rdma_create_qp() makes on this id use it, and rdma_post_recv() posts to it. With no
// PD it is made on the id's PD, else on rdma_cm's per-device PD, which the id then keeps.
int rdma_create_srq(rdma_cm_id* id, ibv_pd* pd, ibv_srq_init_attr* attr) {
  if (!id || !attr || id->srq) return fail_errno(EINVAL);  // one SRQ per id
  IdState& state = st(id);
  if (!id->verbs) id->verbs = state.context;
  if (!pd) pd = id->pd ? id->pd : cm_default_pd(state.context);
  if (!pd) return -1;
  if (pd->context != id->verbs) return fail_errno(EINVAL);
  ibv_srq* srq = ibv_create_srq(pd, attr);
  if (!srq) return -1;
  if (!id->pd) id->pd = pd;
  id->srq = srq;
  return 0;
}

// librdmacm's contract: the id's QP goes first. While a QP still uses it, the SRQ stays with
// the id (ibv_destroy_srq's EBUSY) rather than leak.
void rdma_destroy_srq(rdma_cm_id* id) {
  if (!id || !id->srq) return;
  if (ibv_destroy_srq(id->srq) == 0) id->srq = nullptr;
}
