/* A destroyed QP leaves nothing in its CQ, as on hardware, whose providers clean a destroyed
 * QP's entries out of the CQ: neither a Receive that completed before the QP went but was not
 * polled yet, nor the flushes of its other Receives. Another QP's completions in the same CQ
 * stay, in order.
 *
 * This is the order of libfabric's verbs;ofi_rxm at a peer's shutdown: the peer's last
 * message completes a Receive, the DISCONNECTED event is handled before the CQ is polled, and
 * the endpoint is closed (rdma_destroy_ep); libfabric's verbs provider then reports the WRs it
 * did not see complete as flushed, and whatever the CQ still held for that QP would reach
 * ofi_rxm after the endpoint was freed
 * (docs/drop-in-middleware.md, "libfabric's verbs provider"). */
#define _GNU_SOURCE
#include "capi_test.h"

enum { RECVS = 3, OTHER_WR_ID = 3000 };

struct endpoint {
	struct rdma_event_channel *cm;
	struct rdma_cm_id *id;
	struct ibv_pd *pd;
	struct ibv_comp_channel *channel;
	struct ibv_cq *cq;
	struct ibv_mr *mr;
	uint8_t buf[RECVS + 1][64];
};

static void post_recv(struct endpoint *e, struct ibv_qp *qp, int slot, uint64_t wr_id)
{
	struct ibv_sge sge = { .addr = (uintptr_t)e->buf[slot], .length = 64, .lkey = e->mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = wr_id, .sg_list = &sge, .num_sge = 1 }, *bad;

	CHECK(ibv_post_recv(qp, &wr, &bad) == 0);
}

static int server(int port_fd)
{
	static struct endpoint e;
	struct rdma_cm_id *listener;
	struct sockaddr_in addr = loopback(0);
	struct ibv_qp_init_attr attr = { 0 };
	struct ibv_qp_attr to_error = { .qp_state = IBV_QPS_ERR };
	struct ibv_qp *other;
	struct pollfd pfd;
	struct ibv_cq *cq;
	void *context;
	struct ibv_wc wc[RECVS + 2];
	int got = 0;

	CHECK((e.cm = rdma_create_event_channel()) != NULL);
	e.id = take_one_request(e.cm, &addr, port_fd, &listener);
	create_rc_qp(e.id, &e, RECVS + 1, 0, &e.pd, &e.channel, &e.cq);
	CHECK((e.mr = ibv_reg_mr(e.pd, e.buf, sizeof e.buf, IBV_ACCESS_LOCAL_WRITE)) != NULL);
	/* A second QP on the same CQ, never connected, with one Receive. */
	attr.cap.max_send_wr = attr.cap.max_recv_wr = 1;
	attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
	attr.send_cq = attr.recv_cq = e.cq;
	attr.qp_type = IBV_QPT_RC;
	CHECK((other = ibv_create_qp(e.pd, &attr)) != NULL);
	post_recv(&e, other, RECVS, OTHER_WR_ID);
	for (int i = 0; i < RECVS; i++)
		post_recv(&e, e.id->qp, i, 1000 + (uint64_t)i);
	CHECK(ibv_req_notify_cq(e.cq, 0) == 0); /* armed before anything can complete */
	CHECK(rdma_accept(e.id, NULL) == 0);
	CHECK(rdma_ack_cm_event(expect_event(e.cm, RDMA_CM_EVENT_ESTABLISHED)) == 0);
	/* The client's message came before its disconnect: by now its Receive has completed,
	 * and the channel says so without a poll. The first completion can only be the
	 * connected QP's: the other QP fails only below. */
	CHECK(rdma_ack_cm_event(expect_event(e.cm, RDMA_CM_EVENT_DISCONNECTED)) == 0);
	pfd = (struct pollfd){ .fd = e.channel->fd, .events = POLLIN };
	CHECK_EQ(poll(&pfd, 1, TEST_TIMEOUT_MS), 1);
	CHECK(ibv_get_cq_event(e.channel, &cq, &context) == 0);
	CHECK(cq == e.cq && context == &e);
	ibv_ack_cq_events(cq, 1);
	/* The other QP's Receive flushes behind the connected QP's completions. */
	CHECK(ibv_modify_qp(other, &to_error, IBV_QP_STATE) == 0);

	rdma_destroy_qp(e.id);

	/* Only the other QP's flush is left. */
	for (int polls = 0; polls < 50; polls++) {
		int n = ibv_poll_cq(e.cq, RECVS + 2 - got, wc + got);

		CHECK(n >= 0);
		got += n;
		usleep(1000);
	}
	for (int i = 0; got != 1 && i < got; i++)
		fprintf(stderr, "left in the CQ: wr_id %llu status %d qp_num %u\n", (unsigned long long)wc[i].wr_id,
			wc[i].status, wc[i].qp_num);
	CHECK_EQ(got, 1);
	CHECK_EQ(wc[0].wr_id, OTHER_WR_ID);
	CHECK_EQ(wc[0].status, IBV_WC_WR_FLUSH_ERR);
	CHECK_EQ(wc[0].qp_num, other->qp_num);

	CHECK(ibv_destroy_qp(other) == 0);
	CHECK(ibv_dereg_mr(e.mr) == 0);
	CHECK(ibv_destroy_cq(e.cq) == 0);
	CHECK(ibv_destroy_comp_channel(e.channel) == 0);
	CHECK(ibv_dealloc_pd(e.pd) == 0);
	CHECK(rdma_destroy_id(e.id) == 0);
	CHECK(rdma_destroy_id(listener) == 0);
	rdma_destroy_event_channel(e.cm);
	return 0;
}

int main(void)
{
	uint16_t port;
	pid_t peer = spawn_peer(server, &port);
	static struct endpoint e;
	struct sockaddr_in addr = loopback(port);
	struct ibv_sge sge;
	struct ibv_send_wr wr = { 0 }, *bad;
	struct ibv_wc wc;

	CHECK((e.cm = rdma_create_event_channel()) != NULL);
	e.id = resolve_towards(e.cm, &addr);
	create_rc_qp(e.id, &e, RECVS + 1, 1, &e.pd, &e.channel, &e.cq);
	CHECK((e.mr = ibv_reg_mr(e.pd, e.buf, sizeof e.buf, IBV_ACCESS_LOCAL_WRITE)) != NULL);
	CHECK(rdma_connect(e.id, NULL) == 0);
	CHECK(rdma_ack_cm_event(expect_event(e.cm, RDMA_CM_EVENT_ESTABLISHED)) == 0);
	memcpy(e.buf[0], "last words", 11);
	sge = (struct ibv_sge){ .addr = (uintptr_t)e.buf[0], .length = 11, .lkey = e.mr->lkey };
	wr.wr_id = 1;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = IBV_WR_SEND;
	CHECK(ibv_post_send(e.id->qp, &wr, &bad) == 0);
	wc = wait_wc(e.cq, e.channel);
	CHECK_EQ(wc.status, IBV_WC_SUCCESS);
	CHECK(rdma_disconnect(e.id) == 0);
	CHECK(rdma_ack_cm_event(expect_event(e.cm, RDMA_CM_EVENT_DISCONNECTED)) == 0);
	destroy_qp_and_verbs(e.id, e.mr, e.cq, e.channel, e.pd);
	CHECK(rdma_destroy_id(e.id) == 0);
	rdma_destroy_event_channel(e.cm);
	CHECK_EQ(join_peer(peer), 0);
	printf("a destroyed QP left none of its completions in the CQ; the other QP's flush stayed\n");
	return 0;
}
