/* Immediate data through the C API over RoCEv2 (PEERCM_TRANSPORT=roce, set here): a Send with
 * Immediate completes the peer's receive as IBV_WC_RECV with IBV_WC_WITH_IMM and the value in
 * network order; an RDMA Write with Immediate places its data and completes a receive as
 * IBV_WC_RECV_RDMA_WITH_IMM with byte_len = the Write's length. The sender sees IBV_WC_SEND and
 * IBV_WC_RDMA_WRITE. The server's region travels in the accept's private data. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <time.h>

#include "capi_test.h"

enum { LEN = 3000 };

struct region {
	uint64_t addr;
	uint32_t rkey;
};

struct endpoint {
	struct rdma_event_channel *cm;
	struct rdma_cm_id *id;
	struct ibv_pd *pd;
	struct ibv_comp_channel *channel;
	struct ibv_cq *cq;
	struct ibv_mr *mr;
	uint8_t inbox[LEN], target[LEN], source[LEN];
};

static struct sockaddr_in server_address; /* chosen before the fork: both sides know it */

static void make_qp(struct endpoint *e)
{
	create_rc_qp(e->id, NULL, 4, 1, &e->pd, &e->channel, &e->cq);
	CHECK((e->mr = ibv_reg_mr(e->pd, e, sizeof *e, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE)) != NULL);
}

static void teardown(struct endpoint *e)
{
	destroy_qp_and_verbs(e->id, e->mr, e->cq, e->channel, e->pd);
}

/* The next receive completion: `wr_id`, `opcode`, with the immediate `imm` (host order here,
 * network order in the completion) and `len` bytes. */
static void expect_recv_with_imm(struct endpoint *e, uint64_t wr_id, enum ibv_wc_opcode opcode, uint32_t imm,
				 uint32_t len)
{
	struct ibv_wc wc = wait_wc(e->cq, e->channel);

	CHECK_EQ(wc.status, IBV_WC_SUCCESS);
	CHECK_EQ(wc.wr_id, wr_id);
	CHECK_EQ(wc.opcode, opcode);
	CHECK(wc.wc_flags & IBV_WC_WITH_IMM);
	CHECK_EQ(wc.imm_data, htonl(imm));
	CHECK_EQ(wc.byte_len, len);
}

static int server(int port_fd)
{
	static struct endpoint e;
	struct rdma_cm_id *listener;
	struct region exposed;
	struct rdma_conn_param param;

	CHECK((e.cm = rdma_create_event_channel()) != NULL);
	e.id = take_one_request(e.cm, &server_address, port_fd, &listener);
	make_qp(&e);
	for (uint64_t i = 0; i < 2; i++) {
		struct ibv_sge sge = { .addr = (uintptr_t)e.inbox, .length = LEN, .lkey = e.mr->lkey };
		struct ibv_recv_wr wr = { .wr_id = 100 + i, .sg_list = &sge, .num_sge = 1 }, *bad;

		CHECK(ibv_post_recv(e.id->qp, &wr, &bad) == 0);
	}
	exposed.addr = (uintptr_t)e.target;
	exposed.rkey = e.mr->rkey;
	memset(&param, 0, sizeof param);
	param.private_data = &exposed;
	param.private_data_len = sizeof exposed;
	CHECK(rdma_accept(e.id, &param) == 0);
	CHECK(rdma_ack_cm_event(expect_event(e.cm, RDMA_CM_EVENT_ESTABLISHED)) == 0);

	expect_recv_with_imm(&e, 100, IBV_WC_RECV, 0x11223344, 100);
	CHECK(check_pattern(e.inbox, 100, 1));
	expect_recv_with_imm(&e, 101, IBV_WC_RECV_RDMA_WITH_IMM, 0x55667788, LEN);
	CHECK(check_pattern(e.target, LEN, 2));

	CHECK(rdma_ack_cm_event(expect_event(e.cm, RDMA_CM_EVENT_DISCONNECTED)) == 0);
	teardown(&e);
	CHECK(rdma_destroy_id(e.id) == 0);
	CHECK(rdma_destroy_id(listener) == 0);
	rdma_destroy_event_channel(e.cm);
	return 0;
}

int main(void)
{
	static struct endpoint e;
	struct rdma_cm_event *event;
	struct region remote;
	struct ibv_wc wc;
	uint16_t port;
	pid_t peer;

	/* A RoCE node is one address: the server takes a random 127/8 one, so that parallel
	 * tests never share (address, 4791). */
	setenv("PEERCM_TRANSPORT", "roce", 1);
	srand((unsigned)time(NULL) ^ (unsigned)getpid());
	server_address = loopback(0);
	server_address.sin_addr.s_addr =
		htonl((127u << 24) | ((unsigned)(rand() % 254 + 1) << 16) | ((unsigned)(rand() % 256) << 8) |
		      (unsigned)(rand() % 254 + 1));
	peer = spawn_peer(server, &port);
	server_address.sin_port = htons(port);

	CHECK((e.cm = rdma_create_event_channel()) != NULL);
	e.id = resolve_towards(e.cm, &server_address);
	make_qp(&e);
	CHECK(rdma_connect(e.id, NULL) == 0);
	event = expect_event(e.cm, RDMA_CM_EVENT_ESTABLISHED);
	CHECK(event->param.conn.private_data_len >= sizeof remote);
	memcpy(&remote, event->param.conn.private_data, sizeof remote);
	CHECK(rdma_ack_cm_event(event) == 0);

	fill_pattern(e.source, 100, 1);
	{
		struct ibv_sge sge = { .addr = (uintptr_t)e.source, .length = 100, .lkey = e.mr->lkey };
		struct ibv_send_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND_WITH_IMM,
					  .imm_data = htonl(0x11223344) },
				   *bad;

		CHECK(ibv_post_send(e.id->qp, &wr, &bad) == 0);
		wc = wait_wc(e.cq, e.channel);
		CHECK_EQ(wc.status, IBV_WC_SUCCESS);
		CHECK_EQ(wc.wr_id, 1);
		CHECK_EQ(wc.opcode, IBV_WC_SEND);
	}
	fill_pattern(e.source, LEN, 2);
	{
		struct ibv_sge sge = { .addr = (uintptr_t)e.source, .length = LEN, .lkey = e.mr->lkey };
		struct ibv_send_wr wr = { .wr_id = 2, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE_WITH_IMM,
					  .imm_data = htonl(0x55667788) },
				   *bad;

		wr.wr.rdma.remote_addr = remote.addr;
		wr.wr.rdma.rkey = remote.rkey;
		CHECK(ibv_post_send(e.id->qp, &wr, &bad) == 0);
		wc = wait_wc(e.cq, e.channel);
		CHECK_EQ(wc.status, IBV_WC_SUCCESS);
		CHECK_EQ(wc.wr_id, 2);
		CHECK_EQ(wc.opcode, IBV_WC_RDMA_WRITE);
	}
	/* Both receives were consumed before the ACKs came back: the disconnect flushes nothing. */
	CHECK(rdma_disconnect(e.id) == 0);
	CHECK(rdma_ack_cm_event(expect_event(e.cm, RDMA_CM_EVENT_DISCONNECTED)) == 0);
	teardown(&e);
	CHECK(rdma_destroy_id(e.id) == 0);
	rdma_destroy_event_channel(e.cm);
	CHECK_EQ(join_peer(peer), 0);
	printf("Send and RDMA Write with Immediate over RoCEv2: both completions carry the immediate data\n");
	return 0;
}
