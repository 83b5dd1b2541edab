/* The extended verbs as programs written for rdma-core use them (rc_pingpong's -N, perftest's
 * new post-send API and extended CQs):
 *
 * - ibv_query_device_ex: orig_attr is ibv_query_device's, a non-zero node GUID, and zeros
 *   for the capabilities peercm lacks; the GID entry and its type (IB on iWARP, RoCE v2 with
 *   PEERCM_TRANSPORT=roce); ibv_get_device_guid non-zero.
 * - ibv_create_cq_ex / ibv_create_qp_ex / ibv_create_srq_ex refusals (EOPNOTSUPP for
 *   timestamps, atomics, XRC, tag matching), ibv_get_srq_num, ibv_qp_to_qp_ex.
 * - the calls for what peercm has not (XRC domains, device memory, parent and thread domains,
 *   flow steering, multicast, memory windows, work queues): NULL with errno EOPNOTSUPP or
 *   EOPNOTSUPP returned.
 * - over a real connection (the client's QP made by ibv_create_qp_ex and named by qp_num in
 *   rdma_connect, as rping -q does; the server's by rdma_create_qp_ex with send_ops_flags,
 *   as perftest -R does): Sends (an SGE, inline data copied at the builder call),
 *   an RDMA Write of two SGEs, an RDMA Read, built with ibv_wr_* and posted by
 *   ibv_wr_complete; completions read with ibv_start_poll / ibv_next_poll / ibv_end_poll and
 *   the ibv_wc_read_* accessors on both sides; a batch with an operation the QP was not made
 *   with fails whole with EOPNOTSUPP and posts nothing, and ibv_wr_abort drops a batch. With
 *   PEERCM_TRANSPORT=roce also Send with Immediate through ibv_wr_send_imm. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <infiniband/driver.h>
#include <stdlib.h>
#include <time.h>

#include "capi_test.h"

enum { LEN = 4096, SMALL = 100, INLINE_LEN = 32, RECVS = 8 };

struct region {
	uint64_t target; /* for the client's RDMA Write */
	uint64_t readable; /* for the client's RDMA Read */
	uint32_t rkey;
};

struct endpoint {
	struct rdma_event_channel *cm;
	struct rdma_cm_id *id;
	struct ibv_pd *pd;
	struct ibv_cq_ex *cq;
	struct ibv_qp *qp;
	struct ibv_mr *mr;
	uint8_t inbox[RECVS][LEN];
	uint8_t target[LEN], readable[LEN], source[LEN], sink[LEN];
};

/* A completion as read through the extended accessors. */
struct polled {
	uint64_t wr_id;
	enum ibv_wc_status status;
	enum ibv_wc_opcode opcode;
	uint32_t byte_len;
	uint32_t qp_num;
	unsigned int wc_flags;
	uint32_t imm_data;
};

static struct sockaddr_in server_address; /* chosen before the fork: both sides know it */
static int roce;

static long long now_ms(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (long long)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

static void read_current(struct ibv_cq_ex *cq, struct polled *out)
{
	out->wr_id = cq->wr_id;
	out->status = cq->status;
	out->opcode = ibv_wc_read_opcode(cq);
	out->byte_len = ibv_wc_read_byte_len(cq);
	out->qp_num = ibv_wc_read_qp_num(cq);
	out->wc_flags = ibv_wc_read_wc_flags(cq);
	out->imm_data = (out->wc_flags & IBV_WC_WITH_IMM) ? ntohl(ibv_wc_read_imm_data(cq)) : 0;
	CHECK_EQ(ibv_wc_read_vendor_err(cq), 0);
	CHECK_EQ(ibv_wc_read_src_qp(cq), 0);
	CHECK_EQ(ibv_wc_read_slid(cq), 0);
	CHECK_EQ(ibv_wc_read_sl(cq), 0);
	CHECK_EQ(ibv_wc_read_dlid_path_bits(cq), 0);
}

/* Exactly `want` completions, taken in as few start/next/end rounds as they arrive in;
 * ENOENT from an empty CQ means no round was opened (so no ibv_end_poll). */
static void poll_ex(struct ibv_cq_ex *cq, struct polled *out, int want)
{
	struct ibv_poll_cq_attr attr = { .comp_mask = 0 };
	long long deadline = now_ms() + TEST_TIMEOUT_MS;
	int got = 0;

	while (got < want) {
		int rc = ibv_start_poll(cq, &attr);

		if (rc == ENOENT) {
			CHECK(now_ms() < deadline);
			usleep(200);
			continue;
		}
		CHECK_EQ(rc, 0);
		read_current(cq, &out[got++]);
		while (got < want && (rc = ibv_next_poll(cq)) == 0)
			read_current(cq, &out[got++]);
		if (got < want)
			CHECK_EQ(rc, ENOENT);
		ibv_end_poll(cq);
	}
}

/* Nothing more arrives on `cq` within `ms` milliseconds. */
static void expect_quiet(struct ibv_cq_ex *cq, int ms)
{
	long long deadline = now_ms() + ms;

	while (now_ms() < deadline) {
		struct ibv_poll_cq_attr attr = { .comp_mask = 0 };
		int rc = ibv_start_poll(cq, &attr);

		if (rc == 0) {
			fprintf(stderr, "unexpected completion wr_id %llu\n", (unsigned long long)cq->wr_id);
			exit(1);
		}
		CHECK_EQ(rc, ENOENT);
		usleep(1000);
	}
}

static struct ibv_cq_ex *make_cq(struct ibv_context *verbs)
{
	struct ibv_cq_init_attr_ex attr;
	struct ibv_cq_ex *cq;

	memset(&attr, 0, sizeof attr);
	attr.cqe = 32;
	attr.wc_flags = IBV_WC_STANDARD_FLAGS;
	CHECK((cq = ibv_create_cq_ex(verbs, &attr)) != NULL);
	CHECK(ibv_cq_ex_to_cq(cq)->context == verbs);
	CHECK_EQ(ibv_cq_ex_to_cq(cq)->cqe, 32);
	return cq;
}

static struct ibv_qp *make_qp(struct endpoint *e, uint64_t send_ops)
{
	struct ibv_qp_init_attr_ex attr;
	struct ibv_qp *qp;

	memset(&attr, 0, sizeof attr);
	attr.send_cq = attr.recv_cq = ibv_cq_ex_to_cq(e->cq);
	attr.qp_type = IBV_QPT_RC;
	attr.sq_sig_all = 0;
	attr.cap.max_send_wr = attr.cap.max_recv_wr = 16;
	attr.cap.max_send_sge = attr.cap.max_recv_sge = 2;
	attr.cap.max_inline_data = 64;
	attr.comp_mask = IBV_QP_INIT_ATTR_PD;
	attr.pd = e->pd;
	if (send_ops) {
		attr.comp_mask |= IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
		attr.send_ops_flags = send_ops;
	}
	CHECK((qp = ibv_create_qp_ex(e->id->verbs, &attr)) != NULL);
	CHECK(attr.cap.max_inline_data >= 64); /* the caller learns what it got */
	CHECK(send_ops ? ibv_qp_to_qp_ex(qp) != NULL : ibv_qp_to_qp_ex(qp) == NULL);
	return qp;
}

static void make_resources(struct endpoint *e, uint64_t send_ops)
{
	CHECK((e->pd = ibv_alloc_pd(e->id->verbs)) != NULL);
	e->cq = make_cq(e->id->verbs);
	e->qp = make_qp(e, send_ops);
	CHECK((e->mr = ibv_reg_mr(e->pd, e, sizeof *e,
				  IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)) != NULL);
}

/* The server's QP: rdma_create_qp_ex with send_ops_flags makes the id's QP an extended one. */
static void make_server_resources(struct endpoint *e)
{
	struct ibv_qp_init_attr_ex attr;

	CHECK((e->pd = ibv_alloc_pd(e->id->verbs)) != NULL);
	e->cq = make_cq(e->id->verbs);
	memset(&attr, 0, sizeof attr);
	attr.send_cq = attr.recv_cq = ibv_cq_ex_to_cq(e->cq);
	attr.qp_type = IBV_QPT_RC;
	attr.cap.max_send_wr = attr.cap.max_recv_wr = 16;
	attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
	attr.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	attr.pd = e->pd;
	attr.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP;
	errno = 0;
	CHECK_EQ(rdma_create_qp_ex(e->id, &attr), -1);
	CHECK_EQ(errno, EOPNOTSUPP);
	CHECK(e->id->qp == NULL);
	attr.send_ops_flags = IBV_QP_EX_WITH_SEND;
	CHECK_EQ(rdma_create_qp_ex(e->id, &attr), 0);
	e->qp = e->id->qp;
	CHECK(ibv_qp_to_qp_ex(e->qp) != NULL);
	CHECK((e->mr = ibv_reg_mr(e->pd, e, sizeof *e,
				  IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)) != NULL);
}

static void free_resources(struct endpoint *e)
{
	CHECK_EQ(ibv_dereg_mr(e->mr), 0);
	if (e->id->qp == e->qp)
		rdma_destroy_qp(e->id);
	else
		CHECK_EQ(ibv_destroy_qp(e->qp), 0);
	CHECK_EQ(ibv_destroy_cq(ibv_cq_ex_to_cq(e->cq)), 0);
	CHECK_EQ(ibv_dealloc_pd(e->pd), 0);
}

/* ---------------------------------------------------------------- without a connection */

static void check_queries(struct ibv_context *verbs)
{
	struct ibv_device_attr attr;
	struct ibv_device_attr_ex ex;
	struct ibv_query_device_ex_input input = { .comp_mask = 1 };
	struct ibv_gid_entry entry, table[4];
	union ibv_gid gid;
	enum ibv_gid_type_sysfs sysfs_type;
	uint64_t speed = 0;

	CHECK_EQ(ibv_query_device(verbs, &attr), 0);
	CHECK(attr.node_guid != 0);
	CHECK_EQ(ibv_query_device_ex(verbs, &input, &ex), EINVAL);
	memset(&ex, 0xa5, sizeof ex);
	CHECK_EQ(ibv_query_device_ex(verbs, NULL, &ex), 0);
	CHECK(memcmp(&ex.orig_attr, &attr, sizeof attr) == 0);
	CHECK_EQ(ex.phys_port_cnt_ex, 1);
	CHECK_EQ(ex.device_cap_flags_ex, attr.device_cap_flags);
	CHECK_EQ(ex.odp_caps.general_caps, 0);
	CHECK_EQ(ex.odp_caps.per_transport_caps.rc_odp_caps, 0);
	CHECK_EQ(ex.completion_timestamp_mask, 0);
	CHECK_EQ(ex.hca_core_clock, 0);
	CHECK_EQ(ex.tso_caps.max_tso, 0);
	CHECK_EQ(ex.rss_caps.max_rwq_indirection_tables, 0);
	CHECK_EQ(ex.max_wq_type_rq, 0);
	CHECK_EQ(ex.packet_pacing_caps.qp_rate_limit_max, 0);
	CHECK_EQ(ex.tm_caps.max_num_tags, 0);
	CHECK_EQ(ex.cq_mod_caps.max_cq_count, 0);
	CHECK_EQ(ex.max_dm_size, 0);
	CHECK_EQ(ex.xrc_odp_caps, 0);
	CHECK(!(ex.orig_attr.device_cap_flags & (IBV_DEVICE_XRC | IBV_DEVICE_MEM_WINDOW)));

	CHECK_EQ(ibv_query_gid(verbs, 1, 0, &gid), 0);
	CHECK_EQ(ibv_query_gid_ex(verbs, 1, 0, &entry, 0), 0);
	CHECK(memcmp(&entry.gid, &gid, sizeof gid) == 0);
	CHECK_EQ(entry.gid_index, 0);
	CHECK_EQ(entry.port_num, 1);
	CHECK_EQ(entry.gid_type, roce ? IBV_GID_TYPE_ROCE_V2 : IBV_GID_TYPE_IB);
	CHECK_EQ(ibv_query_gid_ex(verbs, 1, 1, &entry, 0), ENODATA);
	CHECK_EQ(ibv_query_gid_ex(verbs, 2, 0, &entry, 0), EINVAL);
	CHECK_EQ(ibv_query_gid_ex(verbs, 1, 0, &entry, 1), EINVAL);
	CHECK_EQ(ibv_query_gid_table(verbs, table, 4, 0), 1);
	CHECK(memcmp(&table[0].gid, &gid, sizeof gid) == 0);
	CHECK_EQ(ibv_query_gid_type(verbs, 1, 0, &sysfs_type), 0);
	CHECK_EQ(sysfs_type, roce ? IBV_GID_TYPE_SYSFS_ROCE_V2 : IBV_GID_TYPE_SYSFS_IB_ROCE_V1);
	CHECK_EQ(ibv_query_port_speed(verbs, 1, &speed), 0);
	CHECK(speed > 0);
}

static void check_unsupported(struct ibv_context *verbs, struct ibv_pd *pd, struct ibv_qp *qp, struct ibv_cq *cq)
{
	struct ibv_xrcd_init_attr xrcd_attr = { .comp_mask = IBV_XRCD_INIT_ATTR_OFLAGS, .fd = -1, .oflags = O_CREAT };
	struct ibv_alloc_dm_attr dm_attr = { .length = 4096 };
	struct ibv_parent_domain_init_attr pd_attr = { .pd = pd };
	struct ibv_td_init_attr td_attr = { .comp_mask = 0 };
	struct ibv_wq_init_attr wq_attr = { .wq_type = IBV_WQT_RQ, .max_wr = 1, .max_sge = 1, .pd = pd, .cq = cq };
	struct ibv_rwq_ind_table_init_attr table_attr = { .log_ind_tbl_size = 0 };
	struct ibv_modify_cq_attr moderate = { .attr_mask = IBV_CQ_ATTR_MODERATE };
	struct {
		struct ibv_flow_attr attr;
		struct ibv_flow_spec_eth eth;
	} flow = { .attr = { .type = IBV_FLOW_ATTR_NORMAL, .size = sizeof flow, .num_of_specs = 1, .port = 1 },
		   .eth = { .type = IBV_FLOW_SPEC_ETH, .size = sizeof(struct ibv_flow_spec_eth) } };
	struct ibv_sge sge = { .addr = 0, .length = 0, .lkey = 0 };
	union ibv_gid gid;
	struct ibv_comp_cntr_caps cntr;
	struct ibv_comp_cntr_init_attr cntr_attr = { .type = IBV_COMP_CNTR_TYPE_WRS };
	struct ibv_ece ece = { .vendor_id = 0x02c9, .options = 1 };

#define CHECK_NULL_EOPNOTSUPP(call)             \
	do {                                    \
		errno = 0;                      \
		CHECK((call) == NULL);          \
		CHECK_EQ(errno, EOPNOTSUPP);    \
	} while (0)
	CHECK_NULL_EOPNOTSUPP(ibv_open_xrcd(verbs, &xrcd_attr));
	CHECK_NULL_EOPNOTSUPP(ibv_alloc_dm(verbs, &dm_attr));
	CHECK_NULL_EOPNOTSUPP(ibv_alloc_parent_domain(verbs, &pd_attr));
	CHECK_NULL_EOPNOTSUPP(ibv_alloc_td(verbs, &td_attr));
	CHECK_NULL_EOPNOTSUPP(ibv_create_flow(qp, &flow.attr));
	CHECK_NULL_EOPNOTSUPP(ibv_alloc_mw(pd, IBV_MW_TYPE_2));
	CHECK_NULL_EOPNOTSUPP(ibv_create_wq(verbs, &wq_attr));
	CHECK_NULL_EOPNOTSUPP(ibv_create_rwq_ind_table(verbs, &table_attr));
	CHECK_NULL_EOPNOTSUPP(ibv_alloc_null_mr(pd));
	CHECK_NULL_EOPNOTSUPP(ibv_create_comp_cntr(verbs, &cntr_attr));
#undef CHECK_NULL_EOPNOTSUPP
	memset(&gid, 0, sizeof gid);
	gid.raw[0] = 0xff;
	CHECK_EQ(ibv_attach_mcast(qp, &gid, 0), EOPNOTSUPP);
	CHECK_EQ(ibv_detach_mcast(qp, &gid, 0), EOPNOTSUPP);
	CHECK_EQ(ibv_modify_cq(cq, &moderate), EOPNOTSUPP);
	CHECK_EQ(ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &sge, 1), EOPNOTSUPP);
	CHECK_EQ(ibv_query_comp_cntr_caps(verbs, &cntr), 0);
	CHECK_EQ(cntr.max_counters, 0);
	CHECK_EQ(ibv_set_ece(qp, &ece), EOPNOTSUPP);
	CHECK_EQ(ibv_query_ece(qp, &ece), EOPNOTSUPP);
}

static void check_refusals(struct ibv_context *verbs, struct ibv_pd *pd, struct ibv_cq *cq)
{
	struct ibv_cq_init_attr_ex cq_attr;
	struct ibv_qp_init_attr_ex qp_attr;
	struct ibv_srq_init_attr_ex srq_attr;
	struct ibv_srq *srq, *other;
	uint32_t number = 0, other_number = 0;

	/* A channel, a context and the flags hints pass through to the CQ. */
	{
		struct ibv_comp_channel *channel;
		struct ibv_cq_ex *cqx;
		struct ibv_poll_cq_attr poll_attr = { .comp_mask = 0 };

		CHECK((channel = ibv_create_comp_channel(verbs)) != NULL);
		memset(&cq_attr, 0, sizeof cq_attr);
		cq_attr.cqe = 4;
		cq_attr.cq_context = &cq_attr;
		cq_attr.channel = channel;
		cq_attr.wc_flags = IBV_WC_EX_WITH_BYTE_LEN;
		cq_attr.comp_mask = IBV_CQ_INIT_ATTR_MASK_FLAGS;
		cq_attr.flags = IBV_CREATE_CQ_ATTR_SINGLE_THREADED;
		CHECK((cqx = ibv_create_cq_ex(verbs, &cq_attr)) != NULL);
		CHECK(ibv_cq_ex_to_cq(cqx)->channel == channel);
		CHECK(ibv_cq_ex_to_cq(cqx)->cq_context == &cq_attr);
		CHECK_EQ(ibv_req_notify_cq(ibv_cq_ex_to_cq(cqx), 0), 0);
		CHECK_EQ(ibv_start_poll(cqx, &poll_attr), ENOENT);
		poll_attr.comp_mask = 1;
		CHECK_EQ(ibv_start_poll(cqx, &poll_attr), EINVAL);
		CHECK_EQ(ibv_destroy_comp_channel(channel), EBUSY);
		CHECK_EQ(ibv_destroy_cq(ibv_cq_ex_to_cq(cqx)), 0);
		CHECK_EQ(ibv_destroy_comp_channel(channel), 0);
	}

	memset(&cq_attr, 0, sizeof cq_attr);
	cq_attr.cqe = 4;
	cq_attr.wc_flags = IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP;
	errno = 0;
	CHECK(ibv_create_cq_ex(verbs, &cq_attr) == NULL);
	CHECK_EQ(errno, EOPNOTSUPP);

	memset(&qp_attr, 0, sizeof qp_attr);
	qp_attr.send_cq = qp_attr.recv_cq = cq;
	qp_attr.qp_type = IBV_QPT_RC;
	qp_attr.cap.max_send_wr = qp_attr.cap.max_recv_wr = 1;
	qp_attr.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	qp_attr.pd = pd;
	qp_attr.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD;
	errno = 0;
	CHECK(ibv_create_qp_ex(verbs, &qp_attr) == NULL);
	CHECK_EQ(errno, EOPNOTSUPP);
	qp_attr.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM;
	errno = 0;
	if (roce) {
		struct ibv_qp *qp = ibv_create_qp_ex(verbs, &qp_attr);

		CHECK(qp != NULL);
		CHECK_EQ(ibv_destroy_qp(qp), 0);
	} else {
		CHECK(ibv_create_qp_ex(verbs, &qp_attr) == NULL); /* iWARP has no immediate data */
		CHECK_EQ(errno, EOPNOTSUPP);
	}
	qp_attr.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_XRCD;
	errno = 0;
	CHECK(ibv_create_qp_ex(verbs, &qp_attr) == NULL);
	CHECK_EQ(errno, EOPNOTSUPP);
	qp_attr.comp_mask = IBV_QP_INIT_ATTR_PD;
	qp_attr.qp_type = IBV_QPT_XRC_SEND;
	errno = 0;
	CHECK(ibv_create_qp_ex(verbs, &qp_attr) == NULL);
	CHECK_EQ(errno, EOPNOTSUPP);

	memset(&srq_attr, 0, sizeof srq_attr);
	srq_attr.attr.max_wr = 4;
	srq_attr.attr.max_sge = 1;
	srq_attr.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD;
	srq_attr.srq_type = IBV_SRQT_XRC;
	srq_attr.pd = pd;
	errno = 0;
	CHECK(ibv_create_srq_ex(verbs, &srq_attr) == NULL);
	CHECK_EQ(errno, EOPNOTSUPP);
	srq_attr.srq_type = IBV_SRQT_TM;
	srq_attr.comp_mask |= IBV_SRQ_INIT_ATTR_TM;
	errno = 0;
	CHECK(ibv_create_srq_ex(verbs, &srq_attr) == NULL);
	CHECK_EQ(errno, EOPNOTSUPP);
	srq_attr.srq_type = IBV_SRQT_BASIC;
	srq_attr.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD;
	srq_attr.srq_context = &srq_attr;
	CHECK((srq = ibv_create_srq_ex(verbs, &srq_attr)) != NULL);
	CHECK(srq->srq_context == &srq_attr);
	CHECK(srq->pd == pd);
	CHECK_EQ(srq_attr.attr.max_wr, 4);
	CHECK((other = ibv_create_srq_ex(verbs, &srq_attr)) != NULL);
	CHECK_EQ(ibv_get_srq_num(srq, &number), 0);
	CHECK_EQ(ibv_get_srq_num(other, &other_number), 0);
	CHECK(number != other_number);
	CHECK_EQ(ibv_destroy_srq(other), 0);
	CHECK_EQ(ibv_destroy_srq(srq), 0);
}

/* A batch over an extended QP that never connects: only the builders' bookkeeping runs. */
static void check_batch_errors(struct ibv_qp_ex *qpx, struct ibv_mr *mr)
{
	/* Without ibv_wr_start there is no batch. */
	CHECK_EQ(ibv_wr_complete(qpx), EINVAL);
	ibv_wr_start(qpx);
	qpx->wr_id = 9;
	qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(qpx);
	ibv_wr_set_sge(qpx, mr->lkey, (uintptr_t)mr->addr, 8);
	ibv_wr_atomic_cmp_swp(qpx, mr->rkey, (uintptr_t)mr->addr, 0, 1);
	CHECK_EQ(ibv_wr_complete(qpx), EOPNOTSUPP);
	ibv_wr_start(qpx);
	ibv_wr_set_sge(qpx, mr->lkey, (uintptr_t)mr->addr, 8); /* no WR to set it on */
	CHECK_EQ(ibv_wr_complete(qpx), EINVAL);
	ibv_wr_start(qpx);
	ibv_wr_send_inv(qpx, mr->rkey); /* not among this QP's send_ops_flags */
	CHECK_EQ(ibv_wr_complete(qpx), EOPNOTSUPP);
	ibv_wr_start(qpx);
	ibv_wr_local_inv(qpx, mr->rkey);
	CHECK_EQ(ibv_wr_complete(qpx), EOPNOTSUPP);
	ibv_wr_start(qpx);
	ibv_wr_rdma_write(qpx, mr->rkey, (uintptr_t)mr->addr);
	ibv_wr_set_inline_data(qpx, mr->addr, 4096); /* above max_inline_data */
	CHECK_EQ(ibv_wr_complete(qpx), EINVAL);
}

static void offline_checks(void)
{
	struct ibv_device **list;
	struct ibv_context *verbs;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *plain, *extended;
	struct ibv_qp_init_attr attr;
	struct ibv_qp_init_attr_ex attr_ex;
	struct ibv_mr *mr;
	static uint8_t buffer[4096];
	int count = 0;

	CHECK((list = ibv_get_device_list(&count)) != NULL);
	CHECK(count >= 1);
	CHECK(ibv_get_device_guid(list[0]) != 0);
	CHECK((verbs = ibv_open_device(list[0])) != NULL);
	check_queries(verbs);
	CHECK((pd = ibv_alloc_pd(verbs)) != NULL);
	CHECK((cq = ibv_create_cq(verbs, 8, NULL, NULL, 0)) != NULL);
	memset(&attr, 0, sizeof attr);
	attr.send_cq = attr.recv_cq = cq;
	attr.qp_type = IBV_QPT_RC;
	attr.cap.max_send_wr = attr.cap.max_recv_wr = 4;
	attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
	CHECK((plain = ibv_create_qp(pd, &attr)) != NULL);
	CHECK(ibv_qp_to_qp_ex(plain) == NULL); /* made without send_ops_flags */
	{
		struct ibv_qp_init_attr_ex pd_only;
		struct ibv_qp *qp;

		memset(&pd_only, 0, sizeof pd_only);
		memcpy(&pd_only, &attr, sizeof attr);
		pd_only.comp_mask = IBV_QP_INIT_ATTR_PD;
		pd_only.pd = pd;
		CHECK((qp = ibv_create_qp_ex(verbs, &pd_only)) != NULL);
		CHECK(ibv_qp_to_qp_ex(qp) == NULL);
		CHECK_EQ(ibv_destroy_qp(qp), 0);
	}
	memset(&attr_ex, 0, sizeof attr_ex);
	memcpy(&attr_ex, &attr, sizeof attr);
	attr_ex.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	attr_ex.pd = pd;
	attr_ex.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_WRITE;
	CHECK((extended = ibv_create_qp_ex(verbs, &attr_ex)) != NULL);
	CHECK(ibv_qp_to_qp_ex(extended) != NULL);
	CHECK(&ibv_qp_to_qp_ex(extended)->qp_base == extended);
	CHECK((mr = ibv_reg_mr(pd, buffer, sizeof buffer, IBV_ACCESS_LOCAL_WRITE)) != NULL);
	check_batch_errors(ibv_qp_to_qp_ex(extended), mr);
	check_unsupported(verbs, pd, plain, cq);
	check_refusals(verbs, pd, cq);
	CHECK_EQ(ibv_dereg_mr(mr), 0);
	CHECK_EQ(ibv_destroy_qp(extended), 0);
	CHECK_EQ(ibv_destroy_qp(plain), 0);
	CHECK_EQ(ibv_destroy_cq(cq), 0);
	CHECK_EQ(ibv_dealloc_pd(pd), 0);
	CHECK_EQ(ibv_close_device(verbs), 0);
	ibv_free_device_list(list);
}

/* ---------------------------------------------------------------- the exchange */

static void post_receives(struct endpoint *e)
{
	for (uint64_t i = 0; i < RECVS; i++) {
		struct ibv_sge sge = { .addr = (uintptr_t)e->inbox[i], .length = LEN, .lkey = e->mr->lkey };
		struct ibv_recv_wr wr = { .wr_id = 100 + i, .sg_list = &sge, .num_sge = 1 }, *bad;

		CHECK_EQ(ibv_post_recv(e->qp, &wr, &bad), 0);
	}
}

static void expect_recv(struct endpoint *e, uint64_t wr_id, uint32_t byte_len)
{
	struct polled wc;

	poll_ex(e->cq, &wc, 1);
	CHECK_EQ(wc.status, IBV_WC_SUCCESS);
	CHECK_EQ(wc.wr_id, wr_id);
	CHECK_EQ(wc.opcode, IBV_WC_RECV);
	CHECK_EQ(wc.byte_len, byte_len);
	CHECK_EQ(wc.qp_num, e->qp->qp_num);
	CHECK(!(wc.wc_flags & IBV_WC_WITH_IMM));
}

static int server(int port_fd)
{
	static struct endpoint e;
	struct rdma_cm_id *listener;
	struct region exposed;
	struct rdma_conn_param param;
	struct polled wc;

	CHECK((e.cm = rdma_create_event_channel()) != NULL);
	e.id = take_one_request(e.cm, &server_address, port_fd, &listener);
	make_server_resources(&e);
	post_receives(&e);
	fill_pattern(e.readable, LEN, 3);
	exposed.target = (uintptr_t)e.target;
	exposed.readable = (uintptr_t)e.readable;
	exposed.rkey = e.mr->rkey;
	memset(&param, 0, sizeof param);
	param.private_data = &exposed;
	param.private_data_len = sizeof exposed;
	param.responder_resources = param.initiator_depth = 1;
	CHECK_EQ(rdma_accept(e.id, &param), 0);
	CHECK_EQ(rdma_ack_cm_event(expect_event(e.cm, RDMA_CM_EVENT_ESTABLISHED)), 0);

	expect_recv(&e, 100, SMALL); /* the Send of an SGE */
	CHECK(check_pattern(e.inbox[0], SMALL, 1));
	expect_recv(&e, 101, INLINE_LEN); /* the inline Send: the bytes as they were at the call */
	CHECK(check_pattern(e.inbox[1], INLINE_LEN, 2));
	expect_recv(&e, 102, 4); /* "done" after the RDMA Write */
	CHECK(memcmp(e.inbox[2], "done", 4) == 0);
	CHECK(check_pattern(e.target, LEN, 4));
	expect_recv(&e, 103, 3); /* after the failed and the aborted batch, the next Send */
	CHECK(memcmp(e.inbox[3], "end", 3) == 0);
	if (roce) {
		poll_ex(e.cq, &wc, 1);
		CHECK_EQ(wc.status, IBV_WC_SUCCESS);
		CHECK_EQ(wc.wr_id, 104);
		CHECK_EQ(wc.opcode, IBV_WC_RECV);
		CHECK(wc.wc_flags & IBV_WC_WITH_IMM);
		CHECK_EQ(wc.imm_data, 0x0a0b0c0d);
		CHECK_EQ(wc.byte_len, 0);
	}
	/* The answer, built on the QP rdma_create_qp_ex made. */
	{
		struct ibv_qp_ex *qpx = ibv_qp_to_qp_ex(e.qp);

		ibv_wr_start(qpx);
		qpx->wr_id = 50;
		qpx->wr_flags = IBV_SEND_SIGNALED;
		ibv_wr_send(qpx);
		ibv_wr_set_inline_data(qpx, (void *)"bye", 3);
		CHECK_EQ(ibv_wr_complete(qpx), 0);
		poll_ex(e.cq, &wc, 1);
		CHECK_EQ(wc.status, IBV_WC_SUCCESS);
		CHECK_EQ(wc.wr_id, 50);
		CHECK_EQ(wc.opcode, IBV_WC_SEND);
	}

	CHECK_EQ(rdma_ack_cm_event(expect_event(e.cm, RDMA_CM_EVENT_DISCONNECTED)), 0);
	free_resources(&e);
	CHECK_EQ(rdma_destroy_id(e.id), 0);
	CHECK_EQ(rdma_destroy_id(listener), 0);
	rdma_destroy_event_channel(e.cm);
	return 0;
}

static void expect_sent(struct endpoint *e, uint64_t wr_id, enum ibv_wc_opcode opcode)
{
	struct polled wc;

	poll_ex(e->cq, &wc, 1);
	CHECK_EQ(wc.status, IBV_WC_SUCCESS);
	CHECK_EQ(wc.wr_id, wr_id);
	CHECK_EQ(wc.opcode, opcode);
	CHECK_EQ(wc.qp_num, e->qp->qp_num);
}

static void client_exchange(struct endpoint *e, const struct region *remote)
{
	struct ibv_qp_ex *qpx = ibv_qp_to_qp_ex(e->qp);
	struct polled two[2];
	uint8_t scratch[INLINE_LEN];
	struct ibv_sge halves[2];
	struct ibv_data_buf pieces[2] = { { .addr = (void *)"do", .length = 2 }, { .addr = (void *)"ne", .length = 2 } };

	CHECK(qpx != NULL);

	/* Two Sends in one batch: one from registered memory, one inline whose source is
	 * overwritten right after the builder call. Only the second is signaled. */
	fill_pattern(e->source, SMALL, 1);
	fill_pattern(scratch, INLINE_LEN, 2);
	ibv_wr_start(qpx);
	qpx->wr_id = 1;
	qpx->wr_flags = 0;
	ibv_wr_send(qpx);
	ibv_wr_set_sge(qpx, e->mr->lkey, (uintptr_t)e->source, SMALL);
	qpx->wr_id = 2;
	qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(qpx);
	ibv_wr_set_inline_data(qpx, scratch, INLINE_LEN);
	memset(scratch, 0, sizeof scratch);
	CHECK_EQ(ibv_wr_complete(qpx), 0);
	expect_sent(e, 2, IBV_WC_SEND);

	/* An RDMA Write of two SGEs, then a Send (inline, from a list) telling it is done;
	 * both signaled, read in one round when they are both there. */
	fill_pattern(e->source, LEN, 4);
	halves[0] = (struct ibv_sge){ .addr = (uintptr_t)e->source, .length = LEN / 2, .lkey = e->mr->lkey };
	halves[1] = (struct ibv_sge){ .addr = (uintptr_t)e->source + LEN / 2, .length = LEN / 2, .lkey = e->mr->lkey };
	ibv_wr_start(qpx);
	qpx->wr_id = 3;
	qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_write(qpx, remote->rkey, remote->target);
	ibv_wr_set_sge_list(qpx, 2, halves);
	qpx->wr_id = 4;
	ibv_wr_send(qpx);
	ibv_wr_set_inline_data_list(qpx, 2, pieces);
	CHECK_EQ(ibv_wr_complete(qpx), 0);
	poll_ex(e->cq, two, 2);
	CHECK_EQ(two[0].wr_id, 3);
	CHECK_EQ(two[0].opcode, IBV_WC_RDMA_WRITE);
	CHECK_EQ(two[0].status, IBV_WC_SUCCESS);
	CHECK_EQ(two[1].wr_id, 4);
	CHECK_EQ(two[1].opcode, IBV_WC_SEND);
	CHECK_EQ(two[1].status, IBV_WC_SUCCESS);

	/* An RDMA Read of the server's pattern. */
	memset(e->sink, 0, LEN);
	ibv_wr_start(qpx);
	qpx->wr_id = 5;
	qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_read(qpx, remote->rkey, remote->readable);
	ibv_wr_set_sge(qpx, e->mr->lkey, (uintptr_t)e->sink, LEN);
	CHECK_EQ(ibv_wr_complete(qpx), 0);
	expect_sent(e, 5, IBV_WC_RDMA_READ);
	CHECK(check_pattern(e->sink, LEN, 3));

	/* A batch with an operation the QP lacks fails whole: its Send never leaves. An aborted
	 * batch posts nothing either. */
	ibv_wr_start(qpx);
	qpx->wr_id = 6;
	qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(qpx);
	ibv_wr_set_inline_data(qpx, (void *)"lost", 4);
	ibv_wr_atomic_fetch_add(qpx, remote->rkey, remote->target, 1);
	CHECK_EQ(ibv_wr_complete(qpx), EOPNOTSUPP);
	ibv_wr_start(qpx);
	qpx->wr_id = 7;
	ibv_wr_send(qpx);
	ibv_wr_set_inline_data(qpx, (void *)"gone", 4);
	ibv_wr_abort(qpx);
	if (!roce) {
		/* iWARP: immediate data is not among the QP's operations. */
		ibv_wr_start(qpx);
		qpx->wr_id = 8;
		ibv_wr_send_imm(qpx, htonl(1));
		CHECK_EQ(ibv_wr_complete(qpx), EOPNOTSUPP);
	}
	expect_quiet(e->cq, 100);
	ibv_wr_start(qpx);
	qpx->wr_id = 9;
	qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(qpx);
	ibv_wr_set_inline_data(qpx, (void *)"end", 3);
	CHECK_EQ(ibv_wr_complete(qpx), 0);
	expect_sent(e, 9, IBV_WC_SEND);

	if (roce) {
		ibv_wr_start(qpx);
		qpx->wr_id = 10;
		qpx->wr_flags = IBV_SEND_SIGNALED;
		ibv_wr_send_imm(qpx, htonl(0x0a0b0c0d));
		ibv_wr_set_sge_list(qpx, 0, NULL);
		CHECK_EQ(ibv_wr_complete(qpx), 0);
		expect_sent(e, 10, IBV_WC_SEND);
	}
	/* The server's answer lands in the receive posted before connecting. */
	expect_recv(e, 100, 3);
	CHECK(memcmp(e->inbox[0], "bye", 3) == 0);
}

int main(void)
{
	static struct endpoint e;
	struct rdma_cm_event *event;
	struct rdma_conn_param param;
	struct region remote;
	const char *transport = getenv("PEERCM_TRANSPORT");
	uint64_t send_ops = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_READ;
	uint16_t port;
	pid_t peer;

	roce = transport != NULL && strcmp(transport, "roce") == 0;
	if (roce)
		send_ops |= IBV_QP_EX_WITH_SEND_WITH_IMM;
	/* A RoCE node is one address: the server takes a random 127/8 one, so that parallel
	 * tests never share (address, 4791). */
	srand((unsigned)time(NULL) ^ (unsigned)getpid());
	server_address = loopback(0);
	server_address.sin_addr.s_addr =
		htonl((127u << 24) | ((unsigned)(rand() % 254 + 1) << 16) | ((unsigned)(rand() % 256) << 8) |
		      (unsigned)(rand() % 254 + 1));
	peer = spawn_peer(server, &port);
	server_address.sin_port = htons(port);

	offline_checks();

	/* As rping -q: the QP is made with verbs and named in rdma_connect; the reply comes as
	 * CONNECT_RESPONSE and rdma_establish ends the exchange. */
	CHECK((e.cm = rdma_create_event_channel()) != NULL);
	e.id = resolve_towards(e.cm, &server_address);
	make_resources(&e, send_ops);
	{
		struct ibv_sge sge = { .addr = (uintptr_t)e.inbox[0], .length = LEN, .lkey = e.mr->lkey };
		struct ibv_recv_wr wr = { .wr_id = 100, .sg_list = &sge, .num_sge = 1 }, *bad;

		CHECK_EQ(ibv_post_recv(e.qp, &wr, &bad), 0);
	}
	memset(&param, 0, sizeof param);
	param.responder_resources = param.initiator_depth = 1;
	param.qp_num = e.qp->qp_num;
	CHECK_EQ(rdma_connect(e.id, &param), 0);
	event = expect_event(e.cm, RDMA_CM_EVENT_CONNECT_RESPONSE);
	CHECK(event->param.conn.private_data_len >= sizeof remote);
	memcpy(&remote, event->param.conn.private_data, sizeof remote);
	CHECK_EQ(rdma_ack_cm_event(event), 0);
	CHECK_EQ(rdma_establish(e.id), 0);

	client_exchange(&e, &remote);

	CHECK_EQ(rdma_disconnect(e.id), 0);
	CHECK_EQ(rdma_ack_cm_event(expect_event(e.cm, RDMA_CM_EVENT_DISCONNECTED)), 0);
	free_resources(&e);
	CHECK_EQ(rdma_destroy_id(e.id), 0);
	rdma_destroy_event_channel(e.cm);
	CHECK_EQ(join_peer(peer), 0);
	printf("extended verbs over %s: query_device_ex, refusals, ibv_wr_* Send/Write/Read and extended polls\n",
	       roce ? "RoCEv2" : "iWARP");
	return 0;
}
