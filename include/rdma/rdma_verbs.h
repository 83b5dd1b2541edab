/* rdma_verbs.h: the inline helpers of librdmacm that wrap verbs around an rdma_cm_id (its PD,
 * QP and the CQs rdma_create_qp() made for it, whose cq_context is the id). They return 0
 * (or a completion count) on success, -1 with errno on failure. */
#ifndef PEERCM_RDMA_VERBS_H
#define PEERCM_RDMA_VERBS_H

#include <assert.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#ifdef __cplusplus
extern "C" {
#endif

static inline int rdma_seterrno(int ret)
{
	if (ret) {
		errno = ret;
		ret = -1;
	}
	return ret;
}

int rdma_create_srq(struct rdma_cm_id *id, struct ibv_pd *pd, struct ibv_srq_init_attr *attr);
void rdma_destroy_srq(struct rdma_cm_id *id);

/* --- memory registration on the id's protection domain --- */

static inline struct ibv_mr *rdma_reg_msgs(struct rdma_cm_id *id, void *addr, size_t length)
{
	return ibv_reg_mr(id->pd, addr, length, IBV_ACCESS_LOCAL_WRITE);
}

static inline struct ibv_mr *rdma_reg_read(struct rdma_cm_id *id, void *addr, size_t length)
{
	return ibv_reg_mr(id->pd, addr, length, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
}

static inline struct ibv_mr *rdma_reg_write(struct rdma_cm_id *id, void *addr, size_t length)
{
	return ibv_reg_mr(id->pd, addr, length, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
}

static inline int rdma_dereg_mr(struct ibv_mr *mr)
{
	return rdma_seterrno(ibv_dereg_mr(mr));
}

/* --- work requests from scatter/gather lists --- */

static inline int rdma_post_recvv(struct rdma_cm_id *id, void *context, struct ibv_sge *sgl, int nsge)
{
	struct ibv_recv_wr wr, *bad;

	wr.wr_id = (uintptr_t)context;
	wr.next = NULL;
	wr.sg_list = sgl;
	wr.num_sge = nsge;
	if (id->srq)
		return rdma_seterrno(ibv_post_srq_recv(id->srq, &wr, &bad));
	return rdma_seterrno(ibv_post_recv(id->qp, &wr, &bad));
}

static inline int peercm_post_one_send(struct rdma_cm_id *id, void *context, struct ibv_sge *sgl, int nsge,
				     int flags, enum ibv_wr_opcode opcode, uint64_t remote_addr, uint32_t rkey)
{
	struct ibv_send_wr wr, *bad;

	memset(&wr, 0, sizeof(wr));
	wr.wr_id = (uintptr_t)context;
	wr.sg_list = sgl;
	wr.num_sge = nsge;
	wr.opcode = opcode;
	wr.send_flags = (unsigned int)flags;
	wr.wr.rdma.remote_addr = remote_addr;
	wr.wr.rdma.rkey = rkey;
	return rdma_seterrno(ibv_post_send(id->qp, &wr, &bad));
}

static inline int rdma_post_sendv(struct rdma_cm_id *id, void *context, struct ibv_sge *sgl, int nsge, int flags)
{
	return peercm_post_one_send(id, context, sgl, nsge, flags, IBV_WR_SEND, 0, 0);
}

static inline int rdma_post_readv(struct rdma_cm_id *id, void *context, struct ibv_sge *sgl, int nsge, int flags,
				  uint64_t remote_addr, uint32_t rkey)
{
	return peercm_post_one_send(id, context, sgl, nsge, flags, IBV_WR_RDMA_READ, remote_addr, rkey);
}

static inline int rdma_post_writev(struct rdma_cm_id *id, void *context, struct ibv_sge *sgl, int nsge, int flags,
				   uint64_t remote_addr, uint32_t rkey)
{
	return peercm_post_one_send(id, context, sgl, nsge, flags, IBV_WR_RDMA_WRITE, remote_addr, rkey);
}

/* --- work requests on one buffer --- */

static inline struct ibv_sge peercm_one_sge(void *addr, size_t length, struct ibv_mr *mr)
{
	struct ibv_sge sge;

	sge.addr = (uint64_t)(uintptr_t)addr;
	sge.length = (uint32_t)length;
	sge.lkey = mr ? mr->lkey : 0; /* no MR: an inline send */
	return sge;
}

static inline int rdma_post_recv(struct rdma_cm_id *id, void *context, void *addr, size_t length,
				 struct ibv_mr *mr)
{
	struct ibv_sge sge = peercm_one_sge(addr, length, mr);

	assert((uint8_t *)addr >= (uint8_t *)mr->addr &&
	       (uint8_t *)addr + length <= (uint8_t *)mr->addr + mr->length);
	return rdma_post_recvv(id, context, &sge, 1);
}

static inline int rdma_post_send(struct rdma_cm_id *id, void *context, void *addr, size_t length,
				 struct ibv_mr *mr, int flags)
{
	struct ibv_sge sge = peercm_one_sge(addr, length, mr);

	return rdma_post_sendv(id, context, &sge, 1, flags);
}

static inline int rdma_post_read(struct rdma_cm_id *id, void *context, void *addr, size_t length,
				 struct ibv_mr *mr, int flags, uint64_t remote_addr, uint32_t rkey)
{
	struct ibv_sge sge = peercm_one_sge(addr, length, mr);

	return rdma_post_readv(id, context, &sge, 1, flags, remote_addr, rkey);
}

static inline int rdma_post_write(struct rdma_cm_id *id, void *context, void *addr, size_t length,
				  struct ibv_mr *mr, int flags, uint64_t remote_addr, uint32_t rkey)
{
	struct ibv_sge sge = peercm_one_sge(addr, length, mr);

	return rdma_post_writev(id, context, &sge, 1, flags, remote_addr, rkey);
}

/* UD sends need address handles, which an iWARP device has not: -1, errno EOPNOTSUPP. */
static inline int rdma_post_ud_send(struct rdma_cm_id *id, void *context, void *addr, size_t length,
				    struct ibv_mr *mr, int flags, struct ibv_ah *ah, uint32_t remote_qpn)
{
	(void)id, (void)context, (void)addr, (void)length, (void)mr, (void)flags, (void)ah, (void)remote_qpn;
	return rdma_seterrno(EOPNOTSUPP);
}

/* --- waiting for one completion on the id's CQ ---
 * Poll; if empty, arm and poll again (a completion may have slipped in before the arm);
 * then sleep on the completion channel. Returns the number of completions (1), or -1. */
static inline int peercm_wait_comp(struct rdma_cm_id *id, struct ibv_cq *id_cq,
				 struct ibv_comp_channel *channel, struct ibv_wc *wc)
{
	struct ibv_cq *cq;
	void *context;
	int ret;

	for (;;) {
		ret = ibv_poll_cq(id_cq, 1, wc);
		if (ret)
			break;
		ret = ibv_req_notify_cq(id_cq, 0);
		if (ret)
			return rdma_seterrno(ret);
		ret = ibv_poll_cq(id_cq, 1, wc);
		if (ret)
			break;
		ret = ibv_get_cq_event(channel, &cq, &context);
		if (ret)
			return ret;
		assert(cq == id_cq && context == id);
		(void)id;
		ibv_ack_cq_events(id_cq, 1);
	}
	return ret < 0 ? rdma_seterrno(-ret) : ret;
}

static inline int rdma_get_send_comp(struct rdma_cm_id *id, struct ibv_wc *wc)
{
	return peercm_wait_comp(id, id->send_cq, id->send_cq_channel, wc);
}

static inline int rdma_get_recv_comp(struct rdma_cm_id *id, struct ibv_wc *wc)
{
	return peercm_wait_comp(id, id->recv_cq, id->recv_cq_channel, wc);
}

#ifdef __cplusplus
}
#endif

#endif /* PEERCM_RDMA_VERBS_H */
