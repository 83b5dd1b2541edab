/* A UD ping-pong between two processes over RoCEv2, as ibv_ud_pingpong and udaddy use UD:
 * each side makes a UD QP (INIT with its Q_Key, RTR, RTS) and learns the other's GID and QPN
 * over a pipe. The pinger sends to an address handle made from the ponger's GID; the
 * ponger answers every ping through an address handle made from the received completion
 * (ibv_create_ah_from_wc), to the completion's src_qp. Every receive must carry the 40-byte
 * GRH area first (IBV_WC_GRH, the IPv4 header naming the sender) and the payload intact.
 * Datagrams with a wrong Q_Key or to a QPN nobody has are dropped: the receive they would
 * have taken gets the next good one. A send over the path MTU is EINVAL. */
#include "capi_test.h"

enum { QKEY = 0x11111111, PINGS = 50, MAX_PAYLOAD = 4096, SLOT = 40 + MAX_PAYLOAD, SLOTS = 8 };

struct side {
	struct ibv_context *context;
	struct ibv_pd *pd;
	struct ibv_mr *mr;
	struct ibv_comp_channel *channel;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	uint8_t *buf; /* SLOTS receive slots, then one send slot */
};

static uint8_t *send_slot(struct side *s)
{
	return s->buf + (size_t)SLOTS * SLOT;
}

static void post_recv(struct side *s, int slot)
{
	struct ibv_sge sge = { .addr = (uintptr_t)(s->buf + (size_t)slot * SLOT), .length = SLOT, .lkey = s->mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = (uint64_t)slot, .sg_list = &sge, .num_sge = 1 }, *bad;
	CHECK_EQ(ibv_post_recv(s->qp, &wr, &bad), 0);
}

static void open_side(struct side *s)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	CHECK(list && list[0]);
	s->context = ibv_open_device(list[0]);
	CHECK(s->context);
	ibv_free_device_list(list);
	CHECK((s->pd = ibv_alloc_pd(s->context)) != NULL);
	CHECK((s->buf = calloc(SLOTS + 1, SLOT)) != NULL);
	CHECK((s->mr = ibv_reg_mr(s->pd, s->buf, (size_t)(SLOTS + 1) * SLOT, IBV_ACCESS_LOCAL_WRITE)) != NULL);
	CHECK((s->channel = ibv_create_comp_channel(s->context)) != NULL);
	CHECK((s->cq = ibv_create_cq(s->context, 2 * SLOTS, NULL, s->channel, 0)) != NULL);
	struct ibv_qp_init_attr init = {
		.send_cq = s->cq,
		.recv_cq = s->cq,
		.cap = { .max_send_wr = 4, .max_recv_wr = SLOTS, .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_UD,
	};
	CHECK((s->qp = ibv_create_qp(s->pd, &init)) != NULL);
	CHECK_EQ(s->qp->qp_type, IBV_QPT_UD);
	struct ibv_qp_attr attr = { .qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1, .qkey = QKEY };
	CHECK_EQ(ibv_modify_qp(s->qp, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY), 0);
	for (int slot = 0; slot < SLOTS; ++slot)
		post_recv(s, slot);
	attr.qp_state = IBV_QPS_RTR;
	CHECK_EQ(ibv_modify_qp(s->qp, &attr, IBV_QP_STATE), 0);
	attr.qp_state = IBV_QPS_RTS;
	attr.sq_psn = 0x1234;
	CHECK_EQ(ibv_modify_qp(s->qp, &attr, IBV_QP_STATE | IBV_QP_SQ_PSN), 0);
	struct ibv_qp_init_attr got;
	CHECK_EQ(ibv_query_qp(s->qp, &attr, IBV_QP_STATE | IBV_QP_QKEY, &got), 0);
	CHECK_EQ(attr.qp_state, IBV_QPS_RTS);
	CHECK_EQ(attr.qkey, QKEY);
	CHECK_EQ(got.qp_type, IBV_QPT_UD);
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

static struct peer_info swap_info(struct side *s, int to_peer, int from_peer)
{
	struct peer_info me = { .qpn = s->qp->qp_num }, peer;
	CHECK_EQ(ibv_query_gid(s->context, 1, 0, &me.gid), 0);
	write_all(to_peer, &me, sizeof me);
	read_all(from_peer, &peer, sizeof peer);
	return peer;
}

static int send_to(struct side *s, struct ibv_ah *ah, uint32_t qpn, uint32_t qkey, uint32_t length, uint64_t id)
{
	struct ibv_sge sge = { .addr = (uintptr_t)send_slot(s), .length = length, .lkey = s->mr->lkey };
	struct ibv_send_wr wr = { .wr_id = id, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
				  .send_flags = IBV_SEND_SIGNALED }, *bad;
	wr.wr.ud.ah = ah;
	wr.wr.ud.remote_qpn = qpn;
	wr.wr.ud.remote_qkey = qkey;
	return ibv_post_send(s->qp, &wr, &bad);
}

/* The next receive: its slot holds the GRH area then `length` bytes of pattern `seed`. */
static struct ibv_wc expect_datagram(struct side *s, uint32_t from_qpn, const union ibv_gid *from_gid, uint32_t length,
				     uint32_t seed)
{
	struct ibv_wc wc = wait_wc(s->cq, s->channel);
	while (wc.opcode == IBV_WC_SEND) { /* our own send completions come in between */
		CHECK_EQ(wc.status, IBV_WC_SUCCESS);
		wc = wait_wc(s->cq, s->channel);
	}
	CHECK_EQ(wc.status, IBV_WC_SUCCESS);
	CHECK_EQ(wc.opcode, IBV_WC_RECV);
	CHECK(wc.wc_flags & IBV_WC_GRH);
	CHECK_EQ(wc.src_qp, from_qpn);
	CHECK_EQ(wc.qp_num, s->qp->qp_num);
	CHECK_EQ(wc.byte_len, 40 + length);
	const uint8_t *slot = s->buf + wc.wr_id * SLOT;
	CHECK_EQ(slot[20], 0x45);                             /* IPv4, IHL 5 */
	CHECK(memcmp(slot + 32, from_gid->raw + 12, 4) == 0); /* its source address */
	CHECK(check_pattern(slot + 40, length, seed));
	return wc;
}

static int ponger(int to_peer, int from_peer)
{
	struct side s;
	open_side(&s);
	struct peer_info pinger = swap_info(&s, to_peer, from_peer);
	for (uint32_t i = 0; i < PINGS; ++i) {
		const uint32_t length = 1 + (i * 997) % MAX_PAYLOAD;
		struct ibv_wc wc = expect_datagram(&s, pinger.qpn, &pinger.gid, length, i);
		const uint8_t *slot = s.buf + wc.wr_id * SLOT;
		struct ibv_ah_attr attr;
		CHECK_EQ(ibv_init_ah_from_wc(s.context, 1, &wc, (struct ibv_grh *)slot, &attr), 0);
		CHECK_EQ(attr.is_global, 1);
		CHECK(memcmp(attr.grh.dgid.raw, pinger.gid.raw, 16) == 0);
		CHECK_EQ(attr.grh.sgid_index, 0);
		struct ibv_ah *ah = ibv_create_ah_from_wc(s.pd, &wc, (struct ibv_grh *)slot, 1);
		CHECK(ah);
		memcpy(send_slot(&s), slot + 40, length); /* the pong echoes the ping */
		post_recv(&s, (int)wc.wr_id);
		CHECK_EQ(send_to(&s, ah, wc.src_qp, QKEY, length, 1000 + i), 0);
		struct ibv_wc sent = wait_wc(s.cq, s.channel);
		CHECK_EQ(sent.status, IBV_WC_SUCCESS);
		CHECK_EQ(sent.opcode, IBV_WC_SEND);
		CHECK_EQ(sent.wr_id, 1000 + i);
		CHECK_EQ(ibv_destroy_ah(ah), 0);
	}
	char done = 0;
	read_all(from_peer, &done, 1);
	CHECK_EQ(done, 'q');
	close_side(&s);
	return 0;
}

static void pinger(int to_peer, int from_peer)
{
	struct side s;
	open_side(&s);
	struct peer_info peer = swap_info(&s, to_peer, from_peer);
	struct ibv_ah_attr attr = { .is_global = 1, .port_num = 1,
				    .grh = { .dgid = peer.gid, .sgid_index = 0, .hop_limit = 64 } };
	struct ibv_ah *ah = ibv_create_ah(s.pd, &attr);
	CHECK(ah);
	/* Neither a datagram with the wrong Q_Key nor one to a QPN nobody has is delivered. */
	fill_pattern(send_slot(&s), 64, 999);
	CHECK_EQ(send_to(&s, ah, peer.qpn, QKEY + 1, 64, 1), 0);
	CHECK_EQ(send_to(&s, ah, peer.qpn + 77, QKEY, 64, 2), 0);
	/* Over the path MTU (4096 between loopback addresses). */
	CHECK_EQ(send_to(&s, ah, peer.qpn, QKEY, MAX_PAYLOAD + 1, 3), EINVAL);
	for (uint32_t i = 0; i < PINGS; ++i) {
		const uint32_t length = 1 + (i * 997) % MAX_PAYLOAD;
		fill_pattern(send_slot(&s), length, i);
		CHECK_EQ(send_to(&s, ah, peer.qpn, QKEY, length, 100 + i), 0);
		struct ibv_wc wc = expect_datagram(&s, peer.qpn, &peer.gid, length, i);
		post_recv(&s, (int)wc.wr_id);
	}
	const char done = 'q';
	write_all(to_peer, &done, 1);
	CHECK_EQ(ibv_destroy_ah(ah), 0);
	close_side(&s);
}

int main(void)
{
	const char *transport = getenv("PEERCM_TRANSPORT");
	if (!transport || strcmp(transport, "roce") != 0) {
		fprintf(stderr, "UD needs PEERCM_TRANSPORT=roce\n");
		return 1;
	}
	CHECK_EQ(run_pair(ponger, pinger), 0);
	printf("roce: %d UD pings of 1-%d bytes answered through address handles from the completions\n", PINGS,
	       MAX_PAYLOAD);
	return 0;
}
