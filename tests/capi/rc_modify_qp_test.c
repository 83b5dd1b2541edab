/* An RC pair connected without the CM, as ibv_rc_pingpong, perftest and UCX connect: each
 * process queries its GID, the two swap (GID, QPN, PSN, buffer address, rkey) over a pipe,
 * and ibv_modify_qp takes each QP through INIT, RTR (the peer's GID in the GRH, its QPN and
 * PSN, path MTU) and RTS. Then verified Sends both ways, an RDMA Write and an RDMA Read.
 * Over RoCEv2 (PEERCM_TRANSPORT=roce). Without it (iWARP) the RTS after such an RTR must be
 * EINVAL, address handles EOPNOTSUPP and UD QPs EOPNOTSUPP. */
#include "capi_test.h"

enum { BUFFER = 1 << 17, SEND_SIZE = 10000, WRITE_SIZE = 40000, READ_SIZE = 30000 };

struct side {
	struct ibv_context *context;
	struct ibv_pd *pd;
	struct ibv_mr *mr;
	struct ibv_comp_channel *channel;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	unsigned char *buf;
};

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
	s->mr = ibv_reg_mr(s->pd, s->buf, BUFFER,
			   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
	CHECK(s->mr);
	s->channel = ibv_create_comp_channel(s->context);
	CHECK(s->channel);
	s->cq = ibv_create_cq(s->context, 64, NULL, s->channel, 0);
	CHECK(s->cq);
	struct ibv_qp_init_attr init = {
		.send_cq = s->cq,
		.recv_cq = s->cq,
		.cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
	};
	s->qp = ibv_create_qp(s->pd, &init);
	CHECK(s->qp);
	struct ibv_qp_attr attr = {
		.qp_state = IBV_QPS_INIT,
		.pkey_index = 0,
		.port_num = 1,
		.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ,
	};
	CHECK_EQ(ibv_modify_qp(s->qp, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS), 0);
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

static struct peer_info local_info(struct side *s, uint32_t psn)
{
	struct peer_info me = { .qpn = s->qp->qp_num, .psn = psn, .addr = (uintptr_t)s->buf, .rkey = s->mr->rkey };
	CHECK_EQ(ibv_query_gid(s->context, 1, 0, &me.gid), 0);
	return me;
}

static int rtr(struct side *s, const struct peer_info *peer)
{
	struct ibv_qp_attr attr = {
		.qp_state = IBV_QPS_RTR,
		.path_mtu = IBV_MTU_1024,
		.dest_qp_num = peer->qpn,
		.rq_psn = peer->psn,
		.max_dest_rd_atomic = 4,
		.min_rnr_timer = 12,
		.ah_attr = { .is_global = 1, .port_num = 1,
			     .grh = { .dgid = peer->gid, .sgid_index = 0, .hop_limit = 1 } },
	};
	return ibv_modify_qp(s->qp, &attr,
			     IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
				     IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
}

static int rts(struct side *s, uint32_t psn)
{
	struct ibv_qp_attr attr = {
		.qp_state = IBV_QPS_RTS, .sq_psn = psn, .timeout = 14, .retry_cnt = 7, .rnr_retry = 7,
		.max_rd_atomic = 4,
	};
	return ibv_modify_qp(s->qp, &attr,
			     IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
				     IBV_QP_MAX_QP_RD_ATOMIC);
}

static void post_recv(struct side *s, uint64_t id, size_t offset, uint32_t length)
{
	struct ibv_sge sge = { .addr = (uintptr_t)s->buf + offset, .length = length, .lkey = s->mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = id, .sg_list = &sge, .num_sge = 1 }, *bad;
	CHECK_EQ(ibv_post_recv(s->qp, &wr, &bad), 0);
}

static void post_send(struct side *s, uint64_t id, enum ibv_wr_opcode opcode, size_t offset, uint32_t length,
		      uint64_t remote_addr, uint32_t rkey)
{
	struct ibv_sge sge = { .addr = (uintptr_t)s->buf + offset, .length = length, .lkey = s->mr->lkey };
	struct ibv_send_wr wr = { .wr_id = id, .sg_list = &sge, .num_sge = 1, .opcode = opcode,
				  .send_flags = IBV_SEND_SIGNALED }, *bad;
	wr.wr.rdma.remote_addr = remote_addr;
	wr.wr.rdma.rkey = rkey;
	CHECK_EQ(ibv_post_send(s->qp, &wr, &bad), 0);
}

/* The next `count` completions, in whatever order the send and receive sides finish (an
 * ACK may follow the peer's reply); each must be a success and carry one of `ids`. */
struct expected {
	uint64_t id;
	enum ibv_wc_opcode opcode;
	uint32_t byte_len; /* checked for receives and Reads */
};

static void expect_wcs(struct side *s, const struct expected *want, int count)
{
	int seen[8] = { 0 };
	CHECK(count <= 8);
	for (int n = 0; n < count; ++n) {
		struct ibv_wc wc = wait_wc(s->cq, s->channel);
		if (wc.status != IBV_WC_SUCCESS)
			fprintf(stderr, "wr %llu: %s\n", (unsigned long long)wc.wr_id, ibv_wc_status_str(wc.status));
		CHECK_EQ(wc.status, IBV_WC_SUCCESS);
		CHECK_EQ(wc.qp_num, s->qp->qp_num);
		int match = -1;
		for (int i = 0; i < count; ++i)
			if (!seen[i] && want[i].id == wc.wr_id)
				match = i;
		if (match < 0)
			fprintf(stderr, "unexpected completion of wr %llu\n", (unsigned long long)wc.wr_id);
		CHECK(match >= 0);
		seen[match] = 1;
		CHECK_EQ(wc.opcode, want[match].opcode);
		if (wc.opcode == IBV_WC_RECV || wc.opcode == IBV_WC_RDMA_READ)
			CHECK_EQ(wc.byte_len, want[match].byte_len);
	}
}

static void expect_wc(struct side *s, uint64_t id, enum ibv_wc_opcode opcode, uint32_t byte_len)
{
	struct expected one = { id, opcode, byte_len };
	expect_wcs(s, &one, 1);
}

/* Both processes: open, swap, connect by modify_qp. `to_peer`/`from_peer` are the pipe ends.
 * A side that only receives may stop at RTR (`stay_in_rtr`), as perftest's bandwidth servers do. */
static struct peer_info connect_side_to(struct side *s, int to_peer, int from_peer, uint32_t my_psn, int stay_in_rtr)
{
	open_side(s);
	struct peer_info me = local_info(s, my_psn), peer;
	/* RoCEv2 GID of an IPv4 address: ::ffff:a.b.c.d, here one of 127/8. */
	static const unsigned char mapped[12] = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF };
	CHECK(memcmp(me.gid.raw, mapped, 12) == 0);
	CHECK_EQ(me.gid.raw[12], 127);
	/* Receives may be posted in INIT, before the peer is known (rc_pingpong does). */
	post_recv(s, 100, 0, SEND_SIZE);
	write_all(to_peer, &me, sizeof me);
	read_all(from_peer, &peer, sizeof peer);
	CHECK(memcmp(me.gid.raw, peer.gid.raw, 16) != 0); /* two processes, two addresses */
	CHECK_EQ(rtr(s, &peer), 0);
	CHECK_EQ(s->qp->state, IBV_QPS_RTR);
	if (stay_in_rtr)
		return peer;
	CHECK_EQ(rts(s, my_psn), 0);
	struct ibv_qp_attr attr;
	struct ibv_qp_init_attr init;
	CHECK_EQ(ibv_query_qp(s->qp, &attr, IBV_QP_STATE, &init), 0);
	CHECK_EQ(attr.qp_state, IBV_QPS_RTS);
	return peer;
}

static struct peer_info connect_side(struct side *s, int to_peer, int from_peer, uint32_t my_psn)
{
	return connect_side_to(s, to_peer, from_peer, my_psn, 0);
}

/* The child: receives a Send, answers with one, receives the parent's Write (announced by a
 * Send) and lets it Read, then waits for the parent's goodbye. */
static int child(int to_parent, int from_parent)
{
	struct side s;
	struct peer_info parent = connect_side(&s, to_parent, from_parent, 0xABCDEF);
	(void)parent;
	/* What the parent will Read, written before a verbs call: the peer's Read reaches this
	 * memory through the wire alone, which TSan cannot see as ordered after a later write. */
	fill_pattern(s.buf + 2 * SEND_SIZE + WRITE_SIZE, READ_SIZE, 4);
	expect_wc(&s, 100, IBV_WC_RECV, SEND_SIZE);
	CHECK(check_pattern(s.buf, SEND_SIZE, 1));
	post_recv(&s, 101, 0, 16);
	fill_pattern(s.buf + SEND_SIZE, SEND_SIZE, 2);
	post_send(&s, 200, IBV_WR_SEND, SEND_SIZE, SEND_SIZE, 0, 0);
	/* The parent's Write lands in [2*SEND_SIZE, +WRITE_SIZE); its Send says it is done. */
	const struct expected sent_then_told[] = { { 200, IBV_WC_SEND, 0 }, { 101, IBV_WC_RECV, 0 } };
	expect_wcs(&s, sent_then_told, 2);
	CHECK(check_pattern(s.buf + 2 * SEND_SIZE, WRITE_SIZE, 3));
	char go = 'r';
	write_all(to_parent, &go, 1);
	read_all(from_parent, &go, 1); /* the parent has read it */
	CHECK_EQ(go, 'q');
	close_side(&s);
	return 0;
}

static void parent(int to_child, int from_child)
{
	struct side s;
	struct peer_info peer = connect_side(&s, to_child, from_child, 0x123);
	post_recv(&s, 101, SEND_SIZE, SEND_SIZE);
	fill_pattern(s.buf + 4 * SEND_SIZE, SEND_SIZE, 1);
	post_send(&s, 1, IBV_WR_SEND, 4 * SEND_SIZE, SEND_SIZE, 0, 0);
	/* The child's answer takes the receive posted in INIT. */
	const struct expected exchange[] = { { 1, IBV_WC_SEND, 0 }, { 100, IBV_WC_RECV, SEND_SIZE } };
	expect_wcs(&s, exchange, 2);
	CHECK(check_pattern(s.buf, SEND_SIZE, 2));
	CHECK_EQ(s.buf[SEND_SIZE], 0); /* the second receive is untouched */
	fill_pattern(s.buf + 2 * SEND_SIZE, WRITE_SIZE, 3);
	post_send(&s, 2, IBV_WR_RDMA_WRITE, 2 * SEND_SIZE, WRITE_SIZE, peer.addr + 2 * SEND_SIZE, peer.rkey);
	expect_wc(&s, 2, IBV_WC_RDMA_WRITE, 0);
	post_send(&s, 3, IBV_WR_SEND, 0, 0, 0, 0);
	expect_wc(&s, 3, IBV_WC_SEND, 0);
	char go = 0;
	read_all(from_child, &go, 1);
	CHECK_EQ(go, 'r');
	memset(s.buf + 2 * SEND_SIZE + WRITE_SIZE, 0, READ_SIZE);
	post_send(&s, 4, IBV_WR_RDMA_READ, 2 * SEND_SIZE + WRITE_SIZE, READ_SIZE,
		  peer.addr + 2 * SEND_SIZE + WRITE_SIZE, peer.rkey);
	expect_wc(&s, 4, IBV_WC_RDMA_READ, READ_SIZE);
	CHECK(check_pattern(s.buf + 2 * SEND_SIZE + WRITE_SIZE, READ_SIZE, 4));
	go = 'q';
	write_all(to_child, &go, 1);
	close_side(&s);
}

/* perftest's ib_send_bw / ib_write_bw / ib_read_bw server: its QP stays in RTR, and the
 * client's Sends, Writes and Reads must still be acknowledged and answered. A send posted in
 * RTR is EINVAL (it sends from RTS on). */
static int rtr_only_child(int to_parent, int from_parent)
{
	struct side s;
	struct peer_info parent = connect_side_to(&s, to_parent, from_parent, 0x777, 1);
	(void)parent;
	struct ibv_sge sge = { .addr = (uintptr_t)s.buf, .length = 1, .lkey = s.mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 9, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND }, *bad = NULL;
	CHECK_EQ(ibv_post_send(s.qp, &wr, &bad), EINVAL);
	CHECK(bad == &wr);
	fill_pattern(s.buf + 2 * SEND_SIZE + WRITE_SIZE, READ_SIZE, 6); /* what the parent Reads */
	char go = 'r';
	write_all(to_parent, &go, 1);
	expect_wc(&s, 100, IBV_WC_RECV, SEND_SIZE);
	CHECK(check_pattern(s.buf, SEND_SIZE, 5));
	read_all(from_parent, &go, 1); /* the parent's Write and Read are done */
	CHECK_EQ(go, 'q');
	CHECK_EQ(s.qp->state, IBV_QPS_RTR);
	struct ibv_qp_attr attr;
	struct ibv_qp_init_attr init;
	CHECK_EQ(ibv_query_qp(s.qp, &attr, IBV_QP_STATE, &init), 0);
	CHECK_EQ(attr.qp_state, IBV_QPS_RTR);
	/* After a verbs call: the Write's bytes came through the wire and the pipe alone, an
	 * order TSan sees only through the context's lock. */
	CHECK(check_pattern(s.buf + 2 * SEND_SIZE, WRITE_SIZE, 7));
	close_side(&s);
	return 0;
}

static void rtr_only_parent(int to_child, int from_child)
{
	struct side s;
	struct peer_info peer = connect_side(&s, to_child, from_child, 0x4242);
	fill_pattern(s.buf + 4 * SEND_SIZE, SEND_SIZE, 5);
	post_send(&s, 1, IBV_WR_SEND, 4 * SEND_SIZE, SEND_SIZE, 0, 0);
	expect_wc(&s, 1, IBV_WC_SEND, 0);
	fill_pattern(s.buf + 2 * SEND_SIZE, WRITE_SIZE, 7);
	post_send(&s, 2, IBV_WR_RDMA_WRITE, 2 * SEND_SIZE, WRITE_SIZE, peer.addr + 2 * SEND_SIZE, peer.rkey);
	expect_wc(&s, 2, IBV_WC_RDMA_WRITE, 0);
	char go = 0;
	read_all(from_child, &go, 1); /* the child's Read source is filled */
	CHECK_EQ(go, 'r');
	memset(s.buf + 2 * SEND_SIZE + WRITE_SIZE, 0, READ_SIZE);
	post_send(&s, 3, IBV_WR_RDMA_READ, 2 * SEND_SIZE + WRITE_SIZE, READ_SIZE,
		  peer.addr + 2 * SEND_SIZE + WRITE_SIZE, peer.rkey);
	expect_wc(&s, 3, IBV_WC_RDMA_READ, READ_SIZE);
	CHECK(check_pattern(s.buf + 2 * SEND_SIZE + WRITE_SIZE, READ_SIZE, 6));
	go = 'q';
	write_all(to_child, &go, 1);
	close_side(&s);
}

/* iWARP: a QP runs only on the CM's TCP stream. */
static void iwarp_refuses(void)
{
	struct side s;
	open_side(&s);
	struct peer_info me = local_info(&s, 1);
	CHECK_EQ(rtr(&s, &me), 0); /* recorded, as siw does */
	errno = 0;
	CHECK_EQ(rts(&s, 1), EINVAL);
	struct ibv_ah_attr ah = { .is_global = 1, .port_num = 1, .grh = { .dgid = me.gid } };
	errno = 0;
	CHECK(ibv_create_ah(s.pd, &ah) == NULL);
	CHECK_EQ(errno, EOPNOTSUPP);
	struct ibv_qp_init_attr ud = { .send_cq = s.cq, .recv_cq = s.cq, .cap = { 1, 1, 1, 1, 0 }, .qp_type = IBV_QPT_UD };
	errno = 0;
	CHECK(ibv_create_qp(s.pd, &ud) == NULL);
	CHECK_EQ(errno, EOPNOTSUPP);
	close_side(&s);
	printf("iwarp: RTS without a connection EINVAL, address handles and UD QPs EOPNOTSUPP\n");
}

int main(void)
{
	const char *transport = getenv("PEERCM_TRANSPORT");
	if (!transport || strcmp(transport, "roce") != 0) {
		iwarp_refuses();
		return 0;
	}
	CHECK_EQ(run_pair(child, parent), 0);
	printf("roce: modify_qp-connected RC pair: Sends both ways, Write and Read of %d and %d bytes verified\n",
	       WRITE_SIZE, READ_SIZE);
	CHECK_EQ(run_pair(rtr_only_child, rtr_only_parent), 0);
	printf("roce: a QP left in RTR takes a Send, a Write and answers a Read; its own send is EINVAL\n");
	return 0;
}
