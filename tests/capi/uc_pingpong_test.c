/* A UC pair connected without the CM, as ibv_uc_pingpong connects: each process queries its
 * GID, the two swap (GID, QPN, PSN, buffer address, rkey) over a pipe, and ibv_modify_qp
 * takes each QP through INIT, RTR (the peer's GID in the GRH, its QPN and PSN, path MTU;
 * none of RC's attributes, which are EINVAL) and RTS (the send PSN alone). Then rounds of
 * verified multi-packet Sends both ways, an RDMA Write followed by a Send with Immediate,
 * and an RDMA Write with Immediate; an RDMA Read is refused at post (EINVAL). UC never
 * resends: each side posts its receive before telling the other it may send.
 * Over RoCEv2 (PEERCM_TRANSPORT=roce). Without it (iWARP) a UC QP is EOPNOTSUPP. */
#include "capi_test.h"

enum { BUFFER = 1 << 18, SEND_SIZE = 10000, ROUNDS = 20, WRITE_SIZE = 60000, WRITE_IMM_SIZE = 5000 };

struct side {
	struct ibv_context *context;
	struct ibv_pd *pd;
	struct ibv_mr *mr;
	struct ibv_comp_channel *channel;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	unsigned char *buf;
	int to_peer;
	int from_peer;
};

/* One byte over the pipe: "my receive is posted, you may send". */
static void tell(struct side *s, char what)
{
	write_all(s->to_peer, &what, 1);
}

static void hear(struct side *s, char what)
{
	char got = 0;
	read_all(s->from_peer, &got, 1);
	CHECK_EQ(got, what);
}

static struct ibv_qp *create_uc_qp(struct side *s)
{
	struct ibv_qp_init_attr init = {
		.send_cq = s->cq,
		.recv_cq = s->cq,
		.cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_UC,
	};
	return ibv_create_qp(s->pd, &init);
}

static void open_side(struct side *s)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	CHECK(list && list[0]);
	s->context = ibv_open_device(list[0]);
	CHECK(s->context);
	ibv_free_device_list(list);
	s->pd = ibv_alloc_pd(s->context);
	CHECK(s->pd);
	s->buf = calloc(1, BUFFER);
	CHECK(s->buf);
	s->mr = ibv_reg_mr(s->pd, s->buf, BUFFER, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	CHECK(s->mr);
	s->channel = ibv_create_comp_channel(s->context);
	CHECK(s->channel);
	s->cq = ibv_create_cq(s->context, 64, NULL, s->channel, 0);
	CHECK(s->cq);
}

static void close_side(struct side *s)
{
	CHECK_EQ(ibv_destroy_qp(s->qp), 0);
	CHECK_EQ(ibv_destroy_cq(s->cq), 0);
	CHECK_EQ(ibv_destroy_comp_channel(s->channel), 0);
	CHECK_EQ(ibv_dereg_mr(s->mr), 0);
	CHECK_EQ(ibv_dealloc_pd(s->pd), 0);
	CHECK_EQ(ibv_close_device(s->context), 0);
	free(s->buf);
}

static int rtr(struct side *s, const struct peer_info *peer, int extra_mask)
{
	struct ibv_qp_attr attr = {
		.qp_state = IBV_QPS_RTR,
		.path_mtu = IBV_MTU_1024,
		.dest_qp_num = peer->qpn,
		.rq_psn = peer->psn,
		.max_dest_rd_atomic = 1,
		.min_rnr_timer = 12,
		.ah_attr = { .is_global = 1, .port_num = 1,
			     .grh = { .dgid = peer->gid, .sgid_index = 0, .hop_limit = 1 } },
	};
	return ibv_modify_qp(s->qp, &attr,
			     IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | extra_mask);
}

static int rts(struct side *s, uint32_t psn, int extra_mask)
{
	struct ibv_qp_attr attr = { .qp_state = IBV_QPS_RTS, .sq_psn = psn, .timeout = 14, .retry_cnt = 7 };
	return ibv_modify_qp(s->qp, &attr, IBV_QP_STATE | IBV_QP_SQ_PSN | extra_mask);
}

static void post_recv(struct side *s, uint64_t id, size_t offset, uint32_t length)
{
	struct ibv_sge sge = { .addr = (uintptr_t)s->buf + offset, .length = length, .lkey = s->mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = id, .sg_list = &sge, .num_sge = 1 }, *bad;
	CHECK_EQ(ibv_post_recv(s->qp, &wr, &bad), 0);
}

static int post_send(struct side *s, uint64_t id, enum ibv_wr_opcode opcode, size_t offset, uint32_t length,
		     uint64_t remote_addr, uint32_t rkey, uint32_t imm)
{
	struct ibv_sge sge = { .addr = (uintptr_t)s->buf + offset, .length = length, .lkey = s->mr->lkey };
	struct ibv_send_wr wr = { .wr_id = id, .sg_list = &sge, .num_sge = 1, .opcode = opcode,
				  .send_flags = IBV_SEND_SIGNALED, .imm_data = htonl(imm) }, *bad = NULL;
	wr.wr.rdma.remote_addr = remote_addr;
	wr.wr.rdma.rkey = rkey;
	const int rc = ibv_post_send(s->qp, &wr, &bad);
	if (rc != 0)
		CHECK(bad == &wr);
	return rc;
}

static struct ibv_wc expect_wc(struct side *s, uint64_t id, enum ibv_wc_opcode opcode)
{
	struct ibv_wc wc = wait_wc(s->cq, s->channel);
	if (wc.status != IBV_WC_SUCCESS || wc.wr_id != id)
		fprintf(stderr, "wr %llu: %s (wanted wr %llu)\n", (unsigned long long)wc.wr_id,
			ibv_wc_status_str(wc.status), (unsigned long long)id);
	CHECK_EQ(wc.status, IBV_WC_SUCCESS);
	CHECK_EQ(wc.wr_id, id);
	CHECK_EQ(wc.opcode, opcode);
	CHECK_EQ(wc.qp_num, s->qp->qp_num);
	return wc;
}

/* Both processes: open, create, swap, connect by modify_qp with UC's attributes. */
static struct peer_info connect_side(struct side *s, int to_peer, int from_peer, uint32_t my_psn)
{
	s->to_peer = to_peer;
	s->from_peer = from_peer;
	open_side(s);
	s->qp = create_uc_qp(s);
	CHECK(s->qp);
	CHECK_EQ(s->qp->qp_type, IBV_QPT_UC);
	struct ibv_qp_attr attr = {
		.qp_state = IBV_QPS_INIT,
		.pkey_index = 0,
		.port_num = 1,
		.qp_access_flags = IBV_ACCESS_REMOTE_WRITE,
	};
	CHECK_EQ(ibv_modify_qp(s->qp, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS), 0);
	CHECK_EQ(s->qp->state, IBV_QPS_INIT);

	struct peer_info me = { .qpn = s->qp->qp_num, .psn = my_psn, .addr = (uintptr_t)s->buf, .rkey = s->mr->rkey };
	CHECK_EQ(ibv_query_gid(s->context, 1, 0, &me.gid), 0);
	write_all(to_peer, &me, sizeof me);
	struct peer_info peer;
	read_all(from_peer, &peer, sizeof peer);
	CHECK(memcmp(me.gid.raw, peer.gid.raw, 16) != 0); /* two processes, two addresses */

	/* RC's attributes are not UC's: refused, the QP stays in INIT. */
	CHECK_EQ(rtr(s, &peer, IBV_QP_MAX_DEST_RD_ATOMIC), EINVAL);
	CHECK_EQ(rtr(s, &peer, IBV_QP_MIN_RNR_TIMER), EINVAL);
	CHECK_EQ(s->qp->state, IBV_QPS_INIT);
	/* RTS straight from INIT is refused too. */
	CHECK_EQ(rts(s, my_psn, 0), EINVAL);
	CHECK_EQ(rtr(s, &peer, 0), 0);
	CHECK_EQ(s->qp->state, IBV_QPS_RTR);
	CHECK_EQ(rts(s, my_psn, IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT), EINVAL);
	CHECK_EQ(rts(s, my_psn, 0), 0);
	struct ibv_qp_init_attr init;
	CHECK_EQ(ibv_query_qp(s->qp, &attr, IBV_QP_STATE, &init), 0);
	CHECK_EQ(attr.qp_state, IBV_QPS_RTS);
	CHECK_EQ(init.qp_type, IBV_QPT_UC);
	return peer;
}

/* The child answers each Send with one of its own, then takes the parent's Writes. */
static int child(int to_parent, int from_parent)
{
	struct side s;
	const struct peer_info parent = connect_side(&s, to_parent, from_parent, 0xFFFFF0);
	(void)parent;
	for (uint32_t round = 0; round < ROUNDS; ++round) {
		post_recv(&s, 1000 + round, 0, SEND_SIZE);
		tell(&s, 'p');
		struct ibv_wc wc = expect_wc(&s, 1000 + round, IBV_WC_RECV);
		CHECK_EQ(wc.byte_len, SEND_SIZE);
		CHECK(check_pattern(s.buf, SEND_SIZE, round));
		hear(&s, 'p'); /* the parent's receive is posted */
		fill_pattern(s.buf + SEND_SIZE, SEND_SIZE, 100 + round);
		CHECK_EQ(post_send(&s, 2000 + round, IBV_WR_SEND, SEND_SIZE, SEND_SIZE, 0, 0, 0), 0);
		expect_wc(&s, 2000 + round, IBV_WC_SEND);
	}
	/* A plain Write into [2 * SEND_SIZE, + WRITE_SIZE), then a Send with Immediate. */
	post_recv(&s, 3000, 0, 16);
	tell(&s, 'w');
	struct ibv_wc wc = expect_wc(&s, 3000, IBV_WC_RECV);
	CHECK(wc.wc_flags & IBV_WC_WITH_IMM);
	CHECK_EQ(ntohl(wc.imm_data), 0x5EED);
	CHECK_EQ(wc.byte_len, 0);
	CHECK(check_pattern(s.buf + 2 * SEND_SIZE, WRITE_SIZE, 7));
	/* A Write with Immediate consumes a receive and reports its length. */
	post_recv(&s, 3001, 0, 16);
	tell(&s, 'i');
	wc = expect_wc(&s, 3001, IBV_WC_RECV_RDMA_WITH_IMM);
	CHECK(wc.wc_flags & IBV_WC_WITH_IMM);
	CHECK_EQ(ntohl(wc.imm_data), 0xC0FFEE);
	CHECK_EQ(wc.byte_len, WRITE_IMM_SIZE);
	CHECK(check_pattern(s.buf + 2 * SEND_SIZE + WRITE_SIZE, WRITE_IMM_SIZE, 8));
	tell(&s, 'q');
	hear(&s, 'q');
	close_side(&s);
	return 0;
}

static void parent(int to_child, int from_child)
{
	struct side s;
	const struct peer_info peer = connect_side(&s, to_child, from_child, 0x123);
	for (uint32_t round = 0; round < ROUNDS; ++round) {
		hear(&s, 'p'); /* the child's receive is posted */
		post_recv(&s, 1000 + round, SEND_SIZE, SEND_SIZE);
		fill_pattern(s.buf, SEND_SIZE, round);
		CHECK_EQ(post_send(&s, round, IBV_WR_SEND, 0, SEND_SIZE, 0, 0, 0), 0);
		/* UC completes a Send as its last packet leaves: before the answer can come. */
		expect_wc(&s, round, IBV_WC_SEND);
		tell(&s, 'p');
		struct ibv_wc wc = expect_wc(&s, 1000 + round, IBV_WC_RECV);
		CHECK_EQ(wc.byte_len, SEND_SIZE);
		CHECK(check_pattern(s.buf + SEND_SIZE, SEND_SIZE, 100 + round));
	}
	/* UC has no RDMA Read. */
	CHECK_EQ(post_send(&s, 9, IBV_WR_RDMA_READ, 0, 16, peer.addr, peer.rkey, 0), EINVAL);

	hear(&s, 'w');
	fill_pattern(s.buf + 2 * SEND_SIZE, WRITE_SIZE, 7);
	CHECK_EQ(post_send(&s, 10, IBV_WR_RDMA_WRITE, 2 * SEND_SIZE, WRITE_SIZE, peer.addr + 2 * SEND_SIZE, peer.rkey,
			   0),
		 0);
	CHECK_EQ(post_send(&s, 11, IBV_WR_SEND_WITH_IMM, 0, 0, 0, 0, 0x5EED), 0);
	expect_wc(&s, 10, IBV_WC_RDMA_WRITE);
	expect_wc(&s, 11, IBV_WC_SEND);

	hear(&s, 'i');
	fill_pattern(s.buf + 2 * SEND_SIZE + WRITE_SIZE, WRITE_IMM_SIZE, 8);
	CHECK_EQ(post_send(&s, 12, IBV_WR_RDMA_WRITE_WITH_IMM, 2 * SEND_SIZE + WRITE_SIZE, WRITE_IMM_SIZE,
			   peer.addr + 2 * SEND_SIZE + WRITE_SIZE, peer.rkey, 0xC0FFEE),
		 0);
	expect_wc(&s, 12, IBV_WC_RDMA_WRITE);
	hear(&s, 'q');
	tell(&s, 'q');
	close_side(&s);
}

/* iWARP has no unreliable connection. */
static void iwarp_refuses(void)
{
	struct side s;
	open_side(&s);
	errno = 0;
	CHECK(create_uc_qp(&s) == NULL);
	CHECK_EQ(errno, EOPNOTSUPP);
	s.qp = NULL;
	CHECK_EQ(ibv_destroy_cq(s.cq), 0);
	CHECK_EQ(ibv_destroy_comp_channel(s.channel), 0);
	CHECK_EQ(ibv_dereg_mr(s.mr), 0);
	CHECK_EQ(ibv_dealloc_pd(s.pd), 0);
	CHECK_EQ(ibv_close_device(s.context), 0);
	free(s.buf);
	printf("iwarp: UC QPs EOPNOTSUPP\n");
}

int main(void)
{
	const char *transport = getenv("PEERCM_TRANSPORT");
	if (!transport || strcmp(transport, "roce") != 0) {
		iwarp_refuses();
		return 0;
	}
	CHECK_EQ(run_pair(child, parent), 0);
	printf("roce: modify_qp-connected UC pair: %d rounds of %d-byte Sends, Writes of %d and %d bytes verified\n",
	       ROUNDS, SEND_SIZE, WRITE_SIZE, WRITE_IMM_SIZE);
	return 0;
}
