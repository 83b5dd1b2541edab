/* The passive side speaks first, as rdma-core's cmatose and perftest's write_lat -R do: right
 * after ESTABLISHED the server RDMA-Writes into the client's buffer (address and rkey from the
 * client's private data) and then Sends, while the client only waits for its receive. Over
 * iWARP this needs the RTR every peercm Request offers (docs/p2p.md); a bare RFC 5044 fence
 * would hold the server's messages until the client's first FPDU, which never comes. */
#define _GNU_SOURCE
#include "capi_test.h"

enum { WRITE_LEN = 4096, SEND_LEN = 64, SEED_WRITE = 7, SEED_SEND = 11 };

struct remote_buffer {
	uint64_t addr;
	uint32_t rkey;
} __attribute__((packed));

static int server(int port_fd)
{
	static uint8_t write_src[WRITE_LEN], send_src[SEND_LEN];
	struct rdma_event_channel *cm;
	struct rdma_cm_id *listener, *id;
	struct rdma_cm_event *event;
	struct ibv_pd *pd;
	struct ibv_comp_channel *channel;
	struct ibv_cq *cq;
	struct ibv_mr *write_mr, *send_mr;
	struct remote_buffer remote;
	struct sockaddr_in addr = loopback(0);

	CHECK((cm = rdma_create_event_channel()) != NULL);
	CHECK(rdma_create_id(cm, &listener, NULL, RDMA_PS_TCP) == 0);
	CHECK(rdma_bind_addr(listener, (struct sockaddr *)&addr) == 0);
	CHECK(rdma_listen(listener, 4) == 0);
	tell_port(port_fd, listener);
	event = expect_event(cm, RDMA_CM_EVENT_CONNECT_REQUEST);
	id = event->id;
	CHECK(event->param.conn.private_data_len >= sizeof remote);
	memcpy(&remote, event->param.conn.private_data, sizeof remote);
	CHECK(rdma_ack_cm_event(event) == 0);
	create_rc_qp(id, NULL, 4, 1, &pd, &channel, &cq);
	fill_pattern(write_src, sizeof write_src, SEED_WRITE);
	fill_pattern(send_src, sizeof send_src, SEED_SEND);
	CHECK((write_mr = ibv_reg_mr(pd, write_src, sizeof write_src, 0)) != NULL);
	CHECK((send_mr = ibv_reg_mr(pd, send_src, sizeof send_src, 0)) != NULL);
	CHECK(rdma_accept(id, NULL) == 0);
	CHECK(rdma_ack_cm_event(expect_event(cm, RDMA_CM_EVENT_ESTABLISHED)) == 0);

	/* Speak first: nothing has come from the client, nor will before it sees these. */
	{
		struct ibv_sge write_sge = { .addr = (uintptr_t)write_src, .length = WRITE_LEN, .lkey = write_mr->lkey };
		struct ibv_sge send_sge = { .addr = (uintptr_t)send_src, .length = SEND_LEN, .lkey = send_mr->lkey };
		struct ibv_send_wr send_wr = { .wr_id = 2, .sg_list = &send_sge, .num_sge = 1, .opcode = IBV_WR_SEND };
		struct ibv_send_wr write_wr = { .wr_id = 1, .next = &send_wr, .sg_list = &write_sge, .num_sge = 1,
						.opcode = IBV_WR_RDMA_WRITE };
		struct ibv_send_wr *bad;

		write_wr.wr.rdma.remote_addr = remote.addr;
		write_wr.wr.rdma.rkey = remote.rkey;
		CHECK(ibv_post_send(id->qp, &write_wr, &bad) == 0);
	}
	for (uint64_t want = 1; want <= 2; want++) {
		struct ibv_wc wc = wait_wc(cq, channel);

		CHECK_EQ(wc.status, IBV_WC_SUCCESS);
		CHECK_EQ(wc.wr_id, want);
	}
	CHECK(rdma_ack_cm_event(expect_event(cm, RDMA_CM_EVENT_DISCONNECTED)) == 0);
	CHECK(ibv_dereg_mr(send_mr) == 0);
	destroy_qp_and_verbs(id, write_mr, cq, channel, pd);
	CHECK(rdma_destroy_id(id) == 0);
	CHECK(rdma_destroy_id(listener) == 0);
	rdma_destroy_event_channel(cm);
	return 0;
}

int main(void)
{
	static uint8_t target[WRITE_LEN], landing[SEND_LEN];
	uint16_t port;
	pid_t peer = spawn_peer(server, &port);
	struct sockaddr_in addr = loopback(port);
	struct rdma_event_channel *cm;
	struct rdma_cm_id *id;
	struct ibv_pd *pd;
	struct ibv_comp_channel *channel;
	struct ibv_cq *cq;
	struct ibv_mr *target_mr, *landing_mr;
	struct remote_buffer remote;
	struct rdma_conn_param param;

	CHECK((cm = rdma_create_event_channel()) != NULL);
	id = resolve_towards(cm, &addr);
	create_rc_qp(id, NULL, 4, 0, &pd, &channel, &cq);
	CHECK((target_mr = ibv_reg_mr(pd, target, sizeof target, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE)) !=
	      NULL);
	CHECK((landing_mr = ibv_reg_mr(pd, landing, sizeof landing, IBV_ACCESS_LOCAL_WRITE)) != NULL);
	{
		struct ibv_sge sge = { .addr = (uintptr_t)landing, .length = SEND_LEN, .lkey = landing_mr->lkey };
		struct ibv_recv_wr wr = { .wr_id = 5, .sg_list = &sge, .num_sge = 1 }, *bad;

		CHECK(ibv_post_recv(id->qp, &wr, &bad) == 0);
	}
	remote.addr = (uintptr_t)target;
	remote.rkey = target_mr->rkey;
	memset(&param, 0, sizeof param);
	param.private_data = &remote;
	param.private_data_len = sizeof remote;
	CHECK(rdma_connect(id, &param) == 0);
	CHECK(rdma_ack_cm_event(expect_event(cm, RDMA_CM_EVENT_ESTABLISHED)) == 0);

	/* Only receive: the server's Send completes our receive, after its Write was placed. */
	{
		struct ibv_wc wc = wait_wc(cq, channel);

		CHECK_EQ(wc.status, IBV_WC_SUCCESS);
		CHECK_EQ(wc.wr_id, 5);
		CHECK_EQ(wc.opcode, IBV_WC_RECV);
		CHECK_EQ(wc.byte_len, SEND_LEN);
	}
	CHECK(check_pattern(landing, sizeof landing, SEED_SEND));
	CHECK(check_pattern(target, sizeof target, SEED_WRITE));
	CHECK(rdma_disconnect(id) == 0);
	CHECK(rdma_ack_cm_event(expect_event(cm, RDMA_CM_EVENT_DISCONNECTED)) == 0);
	CHECK(ibv_dereg_mr(landing_mr) == 0);
	destroy_qp_and_verbs(id, target_mr, cq, channel, pd);
	CHECK(rdma_destroy_id(id) == 0);
	rdma_destroy_event_channel(cm);
	CHECK_EQ(join_peer(peer), 0);
	printf("the passive side wrote and sent first; the active side only received\n");
	return 0;
}
