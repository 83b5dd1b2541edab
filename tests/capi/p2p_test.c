/* The peer-to-peer connection model from C: two processes each listen, then connect to each
 * other at the same moment; with RDMA_OPTION_ID_PEER_TO_PEER turned on (rdma_cm's
 * client/server semantics are the default) they end with one connection. Each process counts the connections it sees established
 * (its connect id, or a request it accepted when its own connect was refused with EALREADY or
 * EISCONN), and the two exchange a message over the one they have. Repeated over fresh
 * process pairs, since who wins depends on timing and node GUIDs.
 * Usage: p2p_test [rounds] */
#define _GNU_SOURCE
#include "capi_test.h"

enum { GRACE_MS = 300 };

struct node {
	struct rdma_event_channel *cm;
	struct rdma_cm_id *listener, *attempt, *accepted, *connection;
	struct ibv_pd *pd;
	struct ibv_comp_channel *channel;
	struct ibv_cq *cq;
	struct ibv_mr *mr;
	char out[32], in[32];
	int established;
	int attempt_settled; /* our connect ended: established, or refused by the CM */
};

static void make_qp(struct node *n, struct rdma_cm_id *id)
{
	struct ibv_qp_init_attr attr;
	struct ibv_sge sge = { .addr = (uintptr_t)n->in, .length = sizeof n->in, .lkey = n->mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1 }, *bad;

	memset(&attr, 0, sizeof attr);
	attr.cap.max_send_wr = attr.cap.max_recv_wr = 2;
	attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
	attr.send_cq = attr.recv_cq = n->cq;
	CHECK(rdma_create_qp(id, n->pd, &attr) == 0);
	/* Posted before the connection: whichever id carries it receives the peer's message. */
	CHECK(ibv_post_recv(id->qp, &wr, &bad) == 0);
}

static void handle(struct node *n, struct rdma_cm_event *event, uint16_t peer_port)
{
	int on = 1;

	switch (event->event) {
	case RDMA_CM_EVENT_ADDR_RESOLVED:
		CHECK(rdma_resolve_route(n->attempt, 2000) == 0);
		break;
	case RDMA_CM_EVENT_ROUTE_RESOLVED:
		make_qp(n, n->attempt);
		CHECK(rdma_set_option(n->attempt, RDMA_OPTION_ID, RDMA_OPTION_ID_PEER_TO_PEER, &on, sizeof on) == 0);
		if (rdma_connect(n->attempt, NULL) != 0) {
			/* design.md §3 rule 5: the peer's request, already ours, is the connection. */
			CHECK(errno == EALREADY || errno == EISCONN);
			n->attempt_settled = 1;
		}
		break;
	case RDMA_CM_EVENT_CONNECT_REQUEST:
		CHECK(n->accepted == NULL);
		n->accepted = event->id;
		make_qp(n, n->accepted);
		CHECK(rdma_accept(n->accepted, NULL) == 0);
		break;
	case RDMA_CM_EVENT_ESTABLISHED:
		n->established++;
		n->connection = event->id;
		if (event->id == n->attempt)
			n->attempt_settled = 1;
		break;
	default:
		fprintf(stderr, "node %u: unexpected %s (status %d)\n", peer_port, rdma_event_str(event->event),
			event->status);
		exit(1);
	}
}

static int run_node(uint16_t own_port, uint16_t peer_port, int ready_fd, int go_fd)
{
	static struct node n;
	struct sockaddr_in own = loopback(own_port), peer = loopback(peer_port);
	struct rdma_cm_event *event;
	struct ibv_wc wc;
	char go;

	CHECK((n.cm = rdma_create_event_channel()) != NULL);
	CHECK(rdma_create_id(n.cm, &n.listener, NULL, RDMA_PS_TCP) == 0);
	CHECK(rdma_bind_addr(n.listener, (struct sockaddr *)&own) == 0);
	CHECK(rdma_listen(n.listener, 0) == 0);
	CHECK((n.pd = ibv_alloc_pd(n.listener->verbs)) != NULL);
	CHECK((n.channel = ibv_create_comp_channel(n.listener->verbs)) != NULL);
	CHECK((n.cq = ibv_create_cq(n.listener->verbs, 8, &n, n.channel, 0)) != NULL);
	CHECK((n.mr = ibv_reg_mr(n.pd, n.out, sizeof n.out + sizeof n.in, IBV_ACCESS_LOCAL_WRITE)) != NULL);
	CHECK(rdma_create_id(n.cm, &n.attempt, NULL, RDMA_PS_TCP) == 0);

	CHECK(write(ready_fd, "r", 1) == 1);
	CHECK(read(go_fd, &go, 1) == 1); /* both nodes start here together */
	CHECK(rdma_resolve_addr(n.attempt, NULL, (struct sockaddr *)&peer, 2000) == 0);

	/* Until the connection is up and our own attempt has ended, then a grace period in
	 * which a second connection would show up if there were one. */
	for (;;) {
		struct pollfd pfd = { .fd = n.cm->fd, .events = POLLIN };
		const int settled = n.established > 0 && n.attempt_settled;
		const int ready = poll(&pfd, 1, settled ? GRACE_MS : TEST_TIMEOUT_MS);

		CHECK(ready >= 0);
		if (ready == 0) {
			CHECK(settled);
			break;
		}
		CHECK(rdma_get_cm_event(n.cm, &event) == 0);
		handle(&n, event, peer_port);
		CHECK(rdma_ack_cm_event(event) == 0);
	}
	CHECK_EQ(n.established, 1);

	/* Both ends of the one connection: each sends, each receives the other's words. */
	snprintf(n.out, sizeof n.out, "hello from %u", own_port);
	{
		struct ibv_sge sge = { .addr = (uintptr_t)n.out, .length = sizeof n.out, .lkey = n.mr->lkey };
		struct ibv_send_wr wr, *bad;
		char expected[32];
		int sent = 0, received = 0;

		memset(&wr, 0, sizeof wr);
		wr.wr_id = 2;
		wr.sg_list = &sge;
		wr.num_sge = 1;
		wr.opcode = IBV_WR_SEND;
		wr.send_flags = IBV_SEND_SIGNALED;
		CHECK(ibv_post_send(n.connection->qp, &wr, &bad) == 0);
		while (!sent || !received) {
			wc = wait_wc(n.cq, n.channel);
			CHECK_EQ(wc.status, IBV_WC_SUCCESS);
			CHECK_EQ(wc.qp_num, n.connection->qp->qp_num);
			if (wc.wr_id == 2)
				sent = 1;
			else
				received = 1;
		}
		snprintf(expected, sizeof expected, "hello from %u", peer_port);
		CHECK(strcmp(n.in, expected) == 0);
	}

	/* The lower port ends the connection; the other learns of it. */
	if (own_port < peer_port)
		CHECK(rdma_disconnect(n.connection) == 0);
	for (;;) {
		event = expect_event(n.cm, RDMA_CM_EVENT_DISCONNECTED);
		const int ours = event->id == n.connection;

		CHECK(rdma_ack_cm_event(event) == 0);
		if (ours)
			break;
	}
	if (own_port > peer_port)
		CHECK(rdma_disconnect(n.connection) == 0);

	CHECK(ibv_dereg_mr(n.mr) == 0);
	rdma_destroy_qp(n.attempt);
	CHECK(rdma_destroy_id(n.attempt) == 0);
	if (n.accepted) {
		rdma_destroy_qp(n.accepted);
		CHECK(rdma_destroy_id(n.accepted) == 0);
	}
	CHECK(ibv_destroy_cq(n.cq) == 0);
	CHECK(ibv_destroy_comp_channel(n.channel) == 0);
	CHECK(ibv_dealloc_pd(n.pd) == 0);
	CHECK(rdma_destroy_id(n.listener) == 0);
	rdma_destroy_event_channel(n.cm);
	return 0;
}

static uint16_t free_port(void)
{
	int s = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = loopback(0);
	socklen_t len = sizeof a;

	CHECK(bind(s, (struct sockaddr *)&a, sizeof a) == 0);
	CHECK(getsockname(s, (struct sockaddr *)&a, &len) == 0);
	close(s);
	return ntohs(a.sin_port);
}

int main(int argc, char **argv)
{
	const int rounds = argc > 1 ? atoi(argv[1]) : 10;

	for (int round = 0; round < rounds; round++) {
		uint16_t ports[2] = { free_port(), free_port() };
		int ready[2], go[2];
		pid_t pids[2];
		char byte;

		if (ports[0] == ports[1])
			ports[1] = free_port();
		CHECK(pipe(ready) == 0 && pipe(go) == 0);
		fflush(NULL);
		for (int i = 0; i < 2; i++) {
			pids[i] = fork();
			CHECK(pids[i] >= 0);
			if (pids[i] == 0) {
				close(ready[0]);
				close(go[1]);
				exit(run_node(ports[i], ports[1 - i], ready[1], go[0]));
			}
		}
		close(ready[1]);
		close(go[0]);
		CHECK(read(ready[0], &byte, 1) == 1 && read(ready[0], &byte, 1) == 1);
		CHECK(write(go[1], "gg", 2) == 2);
		close(ready[0]);
		close(go[1]);
		for (int i = 0; i < 2; i++) {
			const int status = join_peer(pids[i]);

			if (status != 0) {
				fprintf(stderr, "round %d: node on port %u failed (%d)\n", round, ports[i], status);
				return 1;
			}
		}
	}
	printf("%d rounds: simultaneous connects between two listening processes gave one connection\n", rounds);
	return 0;
}
