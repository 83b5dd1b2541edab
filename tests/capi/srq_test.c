/* Shared receive queues: a server serves two connections from one SRQ (ibv_create_srq,
 * ibv_post_srq_recv, `srq` in the QP attributes): each Send takes the oldest WR whichever
 * connection it came through, its completion names the QP, the data is verified, and the
 * WRs left over are not flushed when the connections end. One client receives through an
 * SRQ of its own id (rdma_create_srq, rdma_create_qp taking the id's SRQ, rdma_post_recv
 * posting to it). Then a passive rdma_create_ep whose QP template names an SRQ serves two
 * rdma_get_request connections from it. Also the device limits, the attribute calls, bad_wr
 * and EBUSY. */
#define _GNU_SOURCE
#include "capi_test.h"

enum { MSGS = 8, EXTRA = 3, SLOT = 256, SRQ_WR = 16 };

/* `count` DISCONNECTED events of `cm`; a TIMEWAIT_EXIT of an id that ended first may come
 * between them. */
static void expect_disconnected(struct rdma_event_channel *cm, int count)
{
	struct pollfd pfd = { .fd = cm->fd, .events = POLLIN };
	struct rdma_cm_event *event;

	while (count > 0) {
		CHECK_EQ(poll(&pfd, 1, TEST_TIMEOUT_MS), 1);
		CHECK(rdma_get_cm_event(cm, &event) == 0);
		if (event->event == RDMA_CM_EVENT_DISCONNECTED)
			count--;
		else
			CHECK_EQ(event->event, RDMA_CM_EVENT_TIMEWAIT_EXIT);
		CHECK(rdma_ack_cm_event(event) == 0);
	}
}

/* ---------------------------------------------------------------- server */

static struct ibv_pd *pd;
static struct ibv_comp_channel *channel;
static struct ibv_cq *cq;
static struct ibv_srq *srq;
static struct ibv_mr *slots_mr, *ack_mr;
static uint8_t slots[MSGS + EXTRA][SLOT];
static uint32_t ack;

static void check_device(struct ibv_context *verbs)
{
	struct ibv_device_attr attr;

	CHECK_EQ(ibv_query_device(verbs, &attr), 0);
	CHECK(attr.max_srq > 0);
	CHECK(attr.max_srq_wr >= SRQ_WR);
	CHECK(attr.max_srq_sge >= 1);
	CHECK(!(attr.device_cap_flags & IBV_DEVICE_SRQ_RESIZE));
}

static void check_attributes(void)
{
	struct ibv_srq_init_attr too_big = { .attr = { .max_wr = 1u << 30, .max_sge = 1 } };
	struct ibv_srq_attr attr;

	errno = 0;
	CHECK(ibv_create_srq(pd, &too_big) == NULL && errno == EINVAL);
	CHECK_EQ(ibv_query_srq(srq, &attr), 0);
	CHECK_EQ(attr.max_wr, SRQ_WR);
	CHECK_EQ(attr.max_sge, 1);
	CHECK_EQ(attr.srq_limit, 0);
	attr.srq_limit = 4;
	CHECK_EQ(ibv_modify_srq(srq, &attr, IBV_SRQ_LIMIT), 0);
	attr.srq_limit = SRQ_WR + 1;
	CHECK_EQ(ibv_modify_srq(srq, &attr, IBV_SRQ_LIMIT), EINVAL);
	attr.max_wr = 2 * SRQ_WR;
	CHECK_EQ(ibv_modify_srq(srq, &attr, IBV_SRQ_MAX_WR), EOPNOTSUPP);
	CHECK_EQ(ibv_query_srq(srq, &attr), 0);
	CHECK_EQ(attr.max_wr, SRQ_WR);
	CHECK_EQ(attr.srq_limit, 4);
}

/* WR i receives message i into slots[i]. The first list stops at a WR with too many SGEs:
 * the WR before it is posted, bad_wr names it, and the rest go in a second list. */
static void post_slots(void)
{
	struct ibv_sge sge[MSGS + EXTRA][2];
	struct ibv_recv_wr wr[MSGS + EXTRA], bad_one, *bad = NULL;

	for (int i = 0; i < MSGS + EXTRA; i++) {
		sge[i][0] = (struct ibv_sge){ .addr = (uintptr_t)slots[i], .length = SLOT, .lkey = slots_mr->lkey };
		sge[i][1] = sge[i][0];
		wr[i] = (struct ibv_recv_wr){ .wr_id = (uint64_t)i, .next = i + 1 < MSGS + EXTRA ? &wr[i + 1] : NULL,
					      .sg_list = sge[i], .num_sge = 1 };
	}
	bad_one = wr[1];
	bad_one.num_sge = 2; /* max_sge is 1 */
	wr[0].next = &bad_one;
	CHECK_EQ(ibv_post_srq_recv(srq, &wr[0], &bad), EINVAL);
	CHECK(bad == &bad_one);
	CHECK_EQ(ibv_post_srq_recv(srq, &wr[1], &bad), 0);
}

static struct rdma_cm_id *accept_one(struct rdma_event_channel *cm)
{
	struct rdma_cm_event *event = expect_event(cm, RDMA_CM_EVENT_CONNECT_REQUEST);
	struct rdma_cm_id *id = event->id;
	struct ibv_qp_init_attr attr;
	struct ibv_recv_wr wr = { .wr_id = 99 }, *bad = NULL;

	CHECK(rdma_ack_cm_event(event) == 0);
	memset(&attr, 0, sizeof attr);
	attr.cap.max_send_wr = 4;
	attr.cap.max_send_sge = 1;
	attr.send_cq = attr.recv_cq = cq;
	attr.srq = srq;
	attr.qp_type = IBV_QPT_RC;
	CHECK(rdma_create_qp(id, pd, &attr) == 0);
	CHECK(id->qp->srq == srq);
	CHECK_EQ(ibv_post_recv(id->qp, &wr, &bad), EINVAL); /* its receives come from the SRQ */
	CHECK(bad == &wr);
	CHECK(rdma_accept(id, NULL) == 0);
	CHECK(rdma_ack_cm_event(expect_event(cm, RDMA_CM_EVENT_ESTABLISHED)) == 0);
	return id;
}

static int server(int port_fd)
{
	struct rdma_event_channel *cm;
	struct rdma_cm_id *listener, *ids[2];
	struct sockaddr_in addr = loopback(0);
	struct ibv_srq_init_attr init = { .srq_context = &ack, .attr = { .max_wr = SRQ_WR, .max_sge = 0 } };
	struct ibv_wc wc;

	CHECK((cm = rdma_create_event_channel()) != NULL);
	CHECK(rdma_create_id(cm, &listener, NULL, RDMA_PS_TCP) == 0);
	CHECK(rdma_bind_addr(listener, (struct sockaddr *)&addr) == 0);
	CHECK(rdma_listen(listener, 4) == 0);
	check_device(listener->verbs);
	CHECK((pd = ibv_alloc_pd(listener->verbs)) != NULL);
	CHECK((channel = ibv_create_comp_channel(listener->verbs)) != NULL);
	CHECK((cq = ibv_create_cq(listener->verbs, 64, NULL, channel, 0)) != NULL);
	CHECK((srq = ibv_create_srq(pd, &init)) != NULL);
	CHECK_EQ(init.attr.max_wr, SRQ_WR); /* what it got */
	CHECK_EQ(init.attr.max_sge, 1);
	CHECK(srq->srq_context == &ack && srq->pd == pd && srq->context == listener->verbs);
	check_attributes();
	CHECK((slots_mr = ibv_reg_mr(pd, slots, sizeof slots, IBV_ACCESS_LOCAL_WRITE)) != NULL);
	CHECK((ack_mr = ibv_reg_mr(pd, &ack, sizeof ack, IBV_ACCESS_LOCAL_WRITE)) != NULL);
	post_slots();
	tell_port(port_fd, listener);
	ids[0] = accept_one(cm);
	ids[1] = accept_one(cm);

	/* Message i comes from client i % 2, which waits for its ack before the next one goes. */
	for (uint32_t i = 0; i < MSGS; i++) {
		struct rdma_cm_id *from = ids[i % 2];
		struct ibv_sge sge = { .addr = (uintptr_t)&ack, .length = sizeof ack, .lkey = ack_mr->lkey };
		struct ibv_send_wr send = { .wr_id = 500 + i, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
					    .send_flags = IBV_SEND_SIGNALED },
				   *bad;

		wc = wait_wc(cq, channel);
		CHECK_EQ(wc.status, IBV_WC_SUCCESS);
		CHECK_EQ(wc.opcode, IBV_WC_RECV);
		CHECK_EQ(wc.wr_id, i); /* the oldest WR, whichever QP it came through */
		CHECK_EQ(wc.qp_num, from->qp->qp_num);
		CHECK_EQ(wc.byte_len, 100 + i);
		CHECK(check_pattern(slots[i], 100 + i, i));
		ack = (uint32_t)wc.wr_id;
		CHECK(ibv_post_send(from->qp, &send, &bad) == 0);
		wc = wait_wc(cq, channel);
		CHECK_EQ(wc.status, IBV_WC_SUCCESS);
		CHECK_EQ(wc.wr_id, 500 + i);
	}

	/* The connections end: the SRQ's remaining WRs belong to no QP and are not flushed. */
	expect_disconnected(cm, 2);
	usleep(100 * 1000);
	CHECK_EQ(ibv_poll_cq(cq, 1, &wc), 0);
	CHECK_EQ(ibv_destroy_srq(srq), EBUSY); /* QPs still use it */
	for (int i = 0; i < 2; i++) {
		rdma_destroy_qp(ids[i]);
		CHECK(rdma_destroy_id(ids[i]) == 0);
	}
	CHECK_EQ(ibv_dealloc_pd(pd), EBUSY); /* the SRQ and the MRs use it */
	CHECK_EQ(ibv_destroy_srq(srq), 0);
	CHECK(ibv_dereg_mr(slots_mr) == 0);
	CHECK(ibv_dereg_mr(ack_mr) == 0);
	CHECK(ibv_destroy_cq(cq) == 0);
	CHECK(ibv_destroy_comp_channel(channel) == 0);
	CHECK(ibv_dealloc_pd(pd) == 0);
	CHECK(rdma_destroy_id(listener) == 0);
	rdma_destroy_event_channel(cm);
	return 0;
}

/* ---------------------------------------------------------------- rdma_create_ep */

/* A passive endpoint whose QP template names an SRQ: the QP of every rdma_get_request takes
 * its receives from it. The SRQ is made first, on the context rdma_cm ids share. */
static int ep_server(int port_fd)
{
	struct rdma_addrinfo hints, *res;
	struct ibv_context **devices;
	struct ibv_srq_init_attr init = { .attr = { .max_wr = 4, .max_sge = 1 } };
	struct ibv_qp_init_attr attr;
	struct rdma_cm_id *listen_id, *ids[2];
	struct ibv_wc wc;
	int got = 0, seen[2] = { 0, 0 }, taken[2] = { 0, 0 };

	memset(&hints, 0, sizeof hints);
	hints.ai_port_space = RDMA_PS_TCP;
	hints.ai_flags = RAI_PASSIVE;
	CHECK_EQ(rdma_getaddrinfo("127.0.0.1", "0", &hints, &res), 0);
	CHECK((devices = rdma_get_devices(NULL)) != NULL);
	CHECK((pd = ibv_alloc_pd(devices[0])) != NULL);
	CHECK((srq = ibv_create_srq(pd, &init)) != NULL);
	CHECK((slots_mr = ibv_reg_mr(pd, slots, sizeof slots, IBV_ACCESS_LOCAL_WRITE)) != NULL);
	for (int i = 0; i < 2; i++) {
		struct ibv_sge sge = { .addr = (uintptr_t)slots[i], .length = SLOT, .lkey = slots_mr->lkey };
		struct ibv_recv_wr wr = { .wr_id = (uint64_t)i, .sg_list = &sge, .num_sge = 1 }, *bad;

		CHECK_EQ(ibv_post_srq_recv(srq, &wr, &bad), 0);
	}
	memset(&attr, 0, sizeof attr);
	attr.cap.max_send_wr = 4;
	attr.cap.max_send_sge = 1;
	attr.srq = srq;
	attr.sq_sig_all = 1;
	CHECK(rdma_create_ep(&listen_id, res, pd, &attr) == 0);
	CHECK(rdma_listen(listen_id, 4) == 0);
	tell_port(port_fd, listen_id);
	for (int i = 0; i < 2; i++) {
		CHECK(rdma_get_request(listen_id, &ids[i]) == 0);
		CHECK(ids[i]->qp != NULL && ids[i]->qp->srq == srq);
		CHECK(ids[i]->srq == NULL); /* the template's SRQ, not one of the id's own */
		CHECK(rdma_accept(ids[i], NULL) == 0);
	}
	/* Which connection's Send comes first is not ordered: each takes the oldest WR then. */
	while (got < 2) {
		int n = 0;

		for (int i = 0; i < 2; i++) {
			n = ibv_poll_cq(ids[i]->recv_cq, 1, &wc);
			CHECK(n >= 0);
			if (n == 0)
				continue;
			CHECK_EQ(wc.status, IBV_WC_SUCCESS);
			CHECK(wc.wr_id < 2 && !taken[wc.wr_id]);
			taken[wc.wr_id] = 1;
			CHECK_EQ(wc.qp_num, ids[i]->qp->qp_num);
			CHECK_EQ(wc.byte_len, 64 + i);
			CHECK(check_pattern(slots[wc.wr_id], 64 + (size_t)i, 50 + (uint32_t)i));
			seen[i]++;
			got++;
		}
		if (got < 2)
			usleep(1000);
	}
	CHECK(seen[0] == 1 && seen[1] == 1);
	for (int i = 0; i < 2; i++) {
		CHECK(rdma_disconnect(ids[i]) == 0);
		rdma_destroy_ep(ids[i]);
	}
	rdma_destroy_ep(listen_id);
	CHECK_EQ(ibv_destroy_srq(srq), 0);
	CHECK(ibv_dereg_mr(slots_mr) == 0);
	CHECK(ibv_dealloc_pd(pd) == 0);
	rdma_free_devices(devices);
	rdma_freeaddrinfo(res);
	return 0;
}

static void ep_clients(uint16_t port)
{
	struct rdma_addrinfo hints, *res;
	struct rdma_cm_id *ep[2];
	static uint8_t msg[2][SLOT];
	struct ibv_mr *mr[2];
	struct ibv_wc wc;
	char service[16];

	memset(&hints, 0, sizeof hints);
	hints.ai_port_space = RDMA_PS_TCP;
	snprintf(service, sizeof service, "%u", port);
	CHECK_EQ(rdma_getaddrinfo("127.0.0.1", service, &hints, &res), 0);
	for (int i = 0; i < 2; i++) {
		struct ibv_qp_init_attr attr;

		memset(&attr, 0, sizeof attr);
		attr.cap.max_send_wr = attr.cap.max_recv_wr = 2;
		attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
		attr.sq_sig_all = 1;
		CHECK(rdma_create_ep(&ep[i], res, NULL, &attr) == 0);
		CHECK(rdma_connect(ep[i], NULL) == 0);
		fill_pattern(msg[i], 64 + (size_t)i, 50 + (uint32_t)i);
		CHECK((mr[i] = rdma_reg_msgs(ep[i], msg[i], SLOT)) != NULL);
	}
	for (int i = 1; i >= 0; i--) {
		CHECK(rdma_post_send(ep[i], NULL, msg[i], 64 + (size_t)i, mr[i], 0) == 0);
		CHECK_EQ(rdma_get_send_comp(ep[i], &wc), 1);
		CHECK_EQ(wc.status, IBV_WC_SUCCESS);
	}
	for (int i = 0; i < 2; i++) {
		CHECK(rdma_disconnect(ep[i]) == 0);
		CHECK(rdma_dereg_mr(mr[i]) == 0);
		rdma_destroy_ep(ep[i]);
	}
	rdma_freeaddrinfo(res);
}

/* ---------------------------------------------------------------- clients */

struct client {
	struct rdma_cm_id *id;
	struct ibv_mr *mr;
	uint8_t msg[SLOT];
	uint32_t ack;
};

/* Client 0 receives its acks through an SRQ of its id; client 1 through its QP. */
static void connect_client(struct client *c, struct rdma_event_channel *cm, uint16_t port, int with_srq)
{
	struct sockaddr_in addr = loopback(port);
	struct ibv_qp_init_attr attr;

	CHECK(rdma_create_id(cm, &c->id, c, RDMA_PS_TCP) == 0);
	CHECK(rdma_resolve_addr(c->id, NULL, (struct sockaddr *)&addr, 2000) == 0);
	CHECK(rdma_ack_cm_event(expect_event(cm, RDMA_CM_EVENT_ADDR_RESOLVED)) == 0);
	CHECK(rdma_resolve_route(c->id, 2000) == 0);
	CHECK(rdma_ack_cm_event(expect_event(cm, RDMA_CM_EVENT_ROUTE_RESOLVED)) == 0);
	if (with_srq) {
		struct ibv_srq_init_attr init = { .attr = { .max_wr = 4, .max_sge = 1 } };

		CHECK(rdma_create_srq(c->id, NULL, &init) == 0);
		CHECK(c->id->srq != NULL && c->id->pd != NULL);
		errno = 0;
		CHECK(rdma_create_srq(c->id, NULL, &init) == -1 && errno == EINVAL); /* one per id */
	}
	memset(&attr, 0, sizeof attr);
	attr.cap.max_send_wr = attr.cap.max_recv_wr = 4;
	attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
	CHECK(rdma_create_qp(c->id, NULL, &attr) == 0);
	CHECK(c->id->qp->srq == c->id->srq);
	CHECK(attr.srq == c->id->srq);
	CHECK((c->mr = rdma_reg_msgs(c->id, c, sizeof *c)) != NULL);
	CHECK(rdma_post_recv(c->id, NULL, &c->ack, sizeof c->ack, c->mr) == 0);
	CHECK(rdma_connect(c->id, NULL) == 0);
	CHECK(rdma_ack_cm_event(expect_event(cm, RDMA_CM_EVENT_ESTABLISHED)) == 0);
}

int main(void)
{
	uint16_t port;
	pid_t peer = spawn_peer(server, &port);
	struct rdma_event_channel *cm;
	static struct client clients[2];
	struct ibv_wc wc;

	CHECK((cm = rdma_create_event_channel()) != NULL);
	connect_client(&clients[0], cm, port, 1);
	connect_client(&clients[1], cm, port, 0);
	for (uint32_t i = 0; i < MSGS; i++) {
		struct client *c = &clients[i % 2];

		fill_pattern(c->msg, 100 + i, i);
		CHECK(rdma_post_send(c->id, NULL, c->msg, 100 + i, c->mr, IBV_SEND_SIGNALED) == 0);
		CHECK_EQ(rdma_get_send_comp(c->id, &wc), 1);
		CHECK_EQ(wc.status, IBV_WC_SUCCESS);
		CHECK_EQ(rdma_get_recv_comp(c->id, &wc), 1);
		CHECK_EQ(wc.status, IBV_WC_SUCCESS);
		CHECK_EQ(wc.qp_num, c->id->qp->qp_num);
		CHECK_EQ(c->ack, i); /* the server took WR i for message i */
		CHECK(rdma_post_recv(c->id, NULL, &c->ack, sizeof c->ack, c->mr) == 0);
	}
	for (int i = 0; i < 2; i++) {
		struct client *c = &clients[i];

		CHECK(rdma_disconnect(c->id) == 0);
		expect_disconnected(cm, 1);
		if (c->id->srq) {
			struct ibv_srq *kept = c->id->srq;

			rdma_destroy_srq(c->id); /* its QP still uses it: it stays */
			CHECK(c->id->srq == kept);
		}
		rdma_destroy_qp(c->id);
		rdma_destroy_srq(c->id);
		CHECK(c->id->srq == NULL);
		CHECK(rdma_dereg_mr(c->mr) == 0);
		CHECK(rdma_destroy_id(c->id) == 0);
	}
	rdma_destroy_event_channel(cm);
	CHECK_EQ(join_peer(peer), 0);

	peer = spawn_peer(ep_server, &port);
	ep_clients(port);
	CHECK_EQ(join_peer(peer), 0);
	printf("%d messages from two connections through one SRQ, in posting order, data verified;"
	       " rdma_create_ep with an SRQ in its QP template\n", MSGS);
	return 0;
}
