/* Outstanding receives are flushed on disconnect: every one completes, in the order posted,
 * with IBV_WC_WR_FLUSH_ERR, and the armed CQ's completion channel becomes readable for it, on
 * the side that disconnects and on its peer. A receive posted afterwards flushes at once. */
#define _GNU_SOURCE
#include "capi_test.h"

enum { RECVS = 3 };

struct endpoint {
	struct rdma_event_channel *cm;
	struct rdma_cm_id *id;
	struct ibv_pd *pd;
	struct ibv_comp_channel *channel;
	struct ibv_cq *cq;
	struct ibv_mr *mr;
	uint8_t buf[RECVS][64];
};

static void make_qp(struct endpoint *e)
{
	create_rc_qp(e->id, e, RECVS + 1, 0, &e->pd, &e->channel, &e->cq);
	CHECK((e->mr = ibv_reg_mr(e->pd, e->buf, sizeof e->buf, IBV_ACCESS_LOCAL_WRITE)) != NULL);
	for (int i = 0; i < RECVS; i++) {
		struct ibv_sge sge = { .addr = (uintptr_t)e->buf[i], .length = 64, .lkey = e->mr->lkey };
		struct ibv_recv_wr wr = { .wr_id = 1000 + (uint64_t)i, .sg_list = &sge, .num_sge = 1 }, *bad;

		CHECK(ibv_post_recv(e->id->qp, &wr, &bad) == 0);
	}
	CHECK(ibv_req_notify_cq(e->cq, 0) == 0); /* armed before anything can complete */
}

/* The channel signals without a poll first; then every receive flushes in order. */
static void expect_flushed(struct endpoint *e)
{
	struct pollfd pfd = { .fd = e->channel->fd, .events = POLLIN };
	struct ibv_cq *cq;
	void *context;
	struct ibv_wc wc[RECVS + 1];
	int got = 0;

	CHECK_EQ(poll(&pfd, 1, TEST_TIMEOUT_MS), 1);
	CHECK(ibv_get_cq_event(e->channel, &cq, &context) == 0);
	CHECK(cq == e->cq && context == e);
	ibv_ack_cq_events(cq, 1);
	while (got < RECVS) {
		int n = ibv_poll_cq(e->cq, RECVS + 1, wc + got);

		CHECK(n >= 0);
		got += n;
		if (n == 0)
			usleep(1000);
	}
	CHECK_EQ(got, RECVS);
	for (int i = 0; i < RECVS; i++) {
		CHECK_EQ(wc[i].status, IBV_WC_WR_FLUSH_ERR);
		CHECK_EQ(wc[i].wr_id, 1000 + i);
		CHECK_EQ(wc[i].qp_num, e->id->qp->qp_num);
	}
	{
		/* A receive posted on the failed QP completes at once, flushed. */
		struct ibv_sge sge = { .addr = (uintptr_t)e->buf[0], .length = 64, .lkey = e->mr->lkey };
		struct ibv_recv_wr wr = { .wr_id = 2000, .sg_list = &sge, .num_sge = 1 }, *bad;
		struct ibv_wc late = { 0 };

		CHECK(ibv_post_recv(e->id->qp, &wr, &bad) == 0);
		CHECK_EQ(ibv_poll_cq(e->cq, 1, &late), 1);
		CHECK_EQ(late.wr_id, 2000);
		CHECK_EQ(late.status, IBV_WC_WR_FLUSH_ERR);
	}
}

static void teardown(struct endpoint *e)
{
	destroy_qp_and_verbs(e->id, e->mr, e->cq, e->channel, e->pd);
}

static int server(int port_fd)
{
	static struct endpoint e;
	struct rdma_cm_id *listener;
	struct sockaddr_in addr = loopback(0);

	CHECK((e.cm = rdma_create_event_channel()) != NULL);
	e.id = take_one_request(e.cm, &addr, port_fd, &listener);
	make_qp(&e);
	CHECK(rdma_accept(e.id, NULL) == 0);
	CHECK(rdma_ack_cm_event(expect_event(e.cm, RDMA_CM_EVENT_ESTABLISHED)) == 0);
	CHECK(rdma_ack_cm_event(expect_event(e.cm, RDMA_CM_EVENT_DISCONNECTED)) == 0);
	expect_flushed(&e);
	teardown(&e);
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

	CHECK((e.cm = rdma_create_event_channel()) != NULL);
	e.id = resolve_towards(e.cm, &addr);
	make_qp(&e);
	CHECK(rdma_connect(e.id, NULL) == 0);
	CHECK(rdma_ack_cm_event(expect_event(e.cm, RDMA_CM_EVENT_ESTABLISHED)) == 0);
	CHECK(rdma_disconnect(e.id) == 0);
	CHECK(rdma_ack_cm_event(expect_event(e.cm, RDMA_CM_EVENT_DISCONNECTED)) == 0);
	expect_flushed(&e);
	teardown(&e);
	CHECK(rdma_destroy_id(e.id) == 0);
	rdma_destroy_event_channel(e.cm);
	CHECK_EQ(join_peer(peer), 0);
	printf("outstanding receives flushed on both sides, completion channels signalled\n");
	return 0;
}
