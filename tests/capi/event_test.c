/* Event-driven client and server (two processes) through the C API, the way rping is
 * written: CM events from an event channel, CQs driven by completion channels. Pins down:
 * CONNECT_REQUEST fields (private data, IRD/ORD as the listener sees them, the child id
 * inheriting the listener's context and device), ESTABLISHED with the reply's private data,
 * verified Send/Recv, RDMA Write and RDMA Read, and the flush of an outstanding receive
 * (IBV_WC_WR_FLUSH_ERR through the completion channel) when the client disconnects. */
#define _GNU_SOURCE
#include "capi_test.h"

enum { LEN = 64 * 1024 };

struct advert {
	uint64_t source_addr; /* the client's buffer the server reads */
	uint32_t source_rkey;
	uint32_t sink_rkey;
	uint64_t sink_addr; /* the client's buffer the server writes */
};

static const char client_hello[] = "client-hello";
static const char server_hello[] = "server-hello";
static int listener_marker;

struct side {
	struct ibv_pd *pd;
	struct ibv_comp_channel *channel;
	struct ibv_cq *cq;
};

static void setup_side(struct side *s, struct rdma_cm_id *id)
{
	struct ibv_qp_init_attr attr;

	CHECK(id->verbs != NULL);
	CHECK((s->pd = ibv_alloc_pd(id->verbs)) != NULL);
	CHECK((s->channel = ibv_create_comp_channel(id->verbs)) != NULL);
	CHECK((s->cq = ibv_create_cq(id->verbs, 16, s, s->channel, 0)) != NULL);
	CHECK(ibv_req_notify_cq(s->cq, 0) == 0);
	memset(&attr, 0, sizeof attr);
	attr.cap.max_send_wr = 8;
	attr.cap.max_recv_wr = 8;
	attr.cap.max_send_sge = 2;
	attr.cap.max_recv_sge = 2;
	attr.qp_type = IBV_QPT_RC;
	attr.send_cq = s->cq;
	attr.recv_cq = s->cq;
	CHECK(rdma_create_qp(id, s->pd, &attr) == 0);
	CHECK(id->qp != NULL);
	CHECK(id->pd == s->pd);
}

static void teardown_side(struct side *s, struct rdma_cm_id *id)
{
	destroy_qp_and_verbs(id, NULL, s->cq, s->channel, s->pd);
}

static void post_recv(struct ibv_qp *qp, uint64_t wr_id, void *addr, uint32_t len, struct ibv_mr *mr)
{
	struct ibv_sge sge = { .addr = (uintptr_t)addr, .length = len, .lkey = mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = wr_id, .sg_list = &sge, .num_sge = 1 }, *bad;

	CHECK(ibv_post_recv(qp, &wr, &bad) == 0);
}

static void post_send(struct ibv_qp *qp, uint64_t wr_id, enum ibv_wr_opcode opcode, void *addr, uint32_t len,
		      struct ibv_mr *mr, uint64_t remote_addr, uint32_t rkey)
{
	struct ibv_sge sge = { .addr = (uintptr_t)addr, .length = len, .lkey = mr->lkey };
	struct ibv_send_wr wr, *bad;

	memset(&wr, 0, sizeof wr);
	wr.wr_id = wr_id;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = opcode;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.wr.rdma.remote_addr = remote_addr;
	wr.wr.rdma.rkey = rkey;
	CHECK(ibv_post_send(qp, &wr, &bad) == 0);
}

static void expect_wc(struct side *s, uint64_t wr_id, enum ibv_wc_status status, enum ibv_wc_opcode opcode,
		      uint32_t byte_len)
{
	struct ibv_wc wc = wait_wc(s->cq, s->channel);

	CHECK_EQ(wc.wr_id, wr_id);
	CHECK_EQ(wc.status, status);
	if (status == IBV_WC_SUCCESS) {
		CHECK_EQ(wc.opcode, opcode);
		CHECK_EQ(wc.byte_len, byte_len);
	}
}

static int server(int port_fd)
{
	struct rdma_event_channel *channel;
	struct rdma_cm_id *listener, *child;
	struct rdma_cm_event *event;
	struct sockaddr_in addr = loopback(0);
	struct rdma_conn_param param;
	struct side s;
	struct advert adv;
	static uint8_t written[LEN], read_back[LEN];
	static const char done[] = "done";
	struct ibv_mr *adv_mr, *written_mr, *read_mr, *done_mr, *spare_mr;
	uint8_t spare[32];
	struct ibv_qp_attr qp_attr;
	struct ibv_qp_init_attr init_attr;

	CHECK((channel = rdma_create_event_channel()) != NULL);
	CHECK(rdma_create_id(channel, &listener, &listener_marker, RDMA_PS_TCP) == 0);
	CHECK(rdma_bind_addr(listener, (struct sockaddr *)&addr) == 0);
	CHECK(rdma_listen(listener, 0) == 0); /* 0: the largest backlog */
	tell_port(port_fd, listener);

	event = expect_event(channel, RDMA_CM_EVENT_CONNECT_REQUEST);
	CHECK(event->listen_id == listener);
	child = event->id;
	CHECK(child != listener);
	CHECK(child->context == &listener_marker);
	CHECK(child->verbs == listener->verbs);
	CHECK(child->channel == channel);
	CHECK_EQ(event->param.conn.private_data_len, sizeof client_hello);
	CHECK(memcmp(event->param.conn.private_data, client_hello, sizeof client_hello) == 0);
	/* The client asked IRD 3, ORD 5: the listener sees them swapped. */
	CHECK_EQ(event->param.conn.responder_resources, 5);
	CHECK_EQ(event->param.conn.initiator_depth, 3);
	CHECK_EQ(rdma_get_peer_addr(child)->sa_family, AF_INET);
	CHECK_EQ(((struct sockaddr_in *)rdma_get_peer_addr(child))->sin_addr.s_addr, htonl(INADDR_LOOPBACK));
	CHECK(rdma_ack_cm_event(event) == 0);

	setup_side(&s, child);
	CHECK((adv_mr = ibv_reg_mr(s.pd, &adv, sizeof adv, IBV_ACCESS_LOCAL_WRITE)) != NULL);
	CHECK((written_mr = ibv_reg_mr(s.pd, written, LEN, 0)) != NULL);
	/* An iWARP Read sink takes the Read Response as a tagged write: remote write access. */
	CHECK((read_mr = ibv_reg_mr(s.pd, read_back, LEN, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE)) != NULL);
	CHECK((done_mr = ibv_reg_mr(s.pd, (void *)done, sizeof done, 0)) != NULL);
	CHECK((spare_mr = ibv_reg_mr(s.pd, spare, sizeof spare, IBV_ACCESS_LOCAL_WRITE)) != NULL);
	post_recv(child->qp, 10, &adv, sizeof adv, adv_mr);
	post_recv(child->qp, 11, spare, sizeof spare, spare_mr); /* never filled: flushed at the end */

	memset(&param, 0, sizeof param);
	param.private_data = server_hello;
	param.private_data_len = sizeof server_hello;
	param.responder_resources = 3;
	param.initiator_depth = 5;
	CHECK(rdma_accept(child, &param) == 0);
	event = expect_event(channel, RDMA_CM_EVENT_ESTABLISHED);
	CHECK(event->id == child);
	CHECK(rdma_ack_cm_event(event) == 0);

	expect_wc(&s, 10, IBV_WC_SUCCESS, IBV_WC_RECV, sizeof adv);
	fill_pattern(written, LEN, 2);
	post_send(child->qp, 20, IBV_WR_RDMA_WRITE, written, LEN, written_mr, adv.sink_addr, adv.sink_rkey);
	expect_wc(&s, 20, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE, LEN);
	post_send(child->qp, 21, IBV_WR_RDMA_READ, read_back, LEN, read_mr, adv.source_addr, adv.source_rkey);
	expect_wc(&s, 21, IBV_WC_SUCCESS, IBV_WC_RDMA_READ, LEN);
	CHECK(check_pattern(read_back, LEN, 1));
	post_send(child->qp, 22, IBV_WR_SEND, (void *)done, sizeof done, done_mr, 0, 0);
	expect_wc(&s, 22, IBV_WC_SUCCESS, IBV_WC_SEND, sizeof done);

	event = expect_event(channel, RDMA_CM_EVENT_DISCONNECTED);
	CHECK(event->id == child);
	CHECK(rdma_ack_cm_event(event) == 0);
	/* The receive still posted completes in error, announced through the channel. */
	expect_wc(&s, 11, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV, 0);
	CHECK(ibv_query_qp(child->qp, &qp_attr, IBV_QP_STATE, &init_attr) == 0);
	CHECK_EQ(qp_attr.qp_state, IBV_QPS_ERR);
	CHECK(init_attr.send_cq == s.cq);
	CHECK_EQ(init_attr.cap.max_send_wr, 8);

	CHECK(ibv_dereg_mr(adv_mr) == 0);
	CHECK(ibv_dereg_mr(written_mr) == 0);
	CHECK(ibv_dereg_mr(read_mr) == 0);
	CHECK(ibv_dereg_mr(done_mr) == 0);
	CHECK(ibv_dereg_mr(spare_mr) == 0);
	teardown_side(&s, child);
	CHECK(rdma_destroy_id(child) == 0);
	CHECK(rdma_destroy_id(listener) == 0);
	rdma_destroy_event_channel(channel);
	return 0;
}

int main(void)
{
	uint16_t port;
	pid_t peer = spawn_peer(server, &port);
	struct rdma_event_channel *channel;
	struct rdma_cm_id *id;
	struct rdma_cm_event *event;
	struct sockaddr_in addr = loopback(port);
	struct rdma_conn_param param;
	struct side s;
	struct advert adv;
	static uint8_t source[LEN], sink[LEN];
	char done[8];
	struct ibv_mr *adv_mr, *source_mr, *sink_mr, *done_mr;
	int client_marker = 0;

	CHECK((channel = rdma_create_event_channel()) != NULL);
	CHECK(rdma_create_id(channel, &id, &client_marker, RDMA_PS_TCP) == 0);
	CHECK(id->verbs == NULL); /* no device before the id is bound or resolved */
	CHECK(rdma_resolve_addr(id, NULL, (struct sockaddr *)&addr, 2000) == 0);
	event = expect_event(channel, RDMA_CM_EVENT_ADDR_RESOLVED);
	CHECK(event->id == id && event->status == 0);
	CHECK(rdma_ack_cm_event(event) == 0);
	CHECK(id->verbs != NULL);
	CHECK(rdma_resolve_route(id, 2000) == 0);
	CHECK(rdma_ack_cm_event(expect_event(channel, RDMA_CM_EVENT_ROUTE_RESOLVED)) == 0);

	setup_side(&s, id);
	fill_pattern(source, LEN, 1);
	CHECK((adv_mr = ibv_reg_mr(s.pd, &adv, sizeof adv, 0)) != NULL);
	CHECK((source_mr = ibv_reg_mr(s.pd, source, LEN, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ)) != NULL);
	CHECK((sink_mr = ibv_reg_mr(s.pd, sink, LEN, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE)) != NULL);
	CHECK((done_mr = ibv_reg_mr(s.pd, done, sizeof done, IBV_ACCESS_LOCAL_WRITE)) != NULL);
	post_recv(id->qp, 100, done, sizeof done, done_mr);

	memset(&param, 0, sizeof param);
	param.private_data = client_hello;
	param.private_data_len = sizeof client_hello;
	param.responder_resources = 3;
	param.initiator_depth = 5;
	CHECK(rdma_connect(id, &param) == 0);
	event = expect_event(channel, RDMA_CM_EVENT_ESTABLISHED);
	CHECK(event->id == id);
	CHECK_EQ(event->param.conn.private_data_len, sizeof server_hello);
	CHECK(memcmp(event->param.conn.private_data, server_hello, sizeof server_hello) == 0);
	CHECK(rdma_ack_cm_event(event) == 0);
	CHECK(id->context == &client_marker);
	CHECK_EQ(ntohs(rdma_get_dst_port(id)), port);
	CHECK(rdma_get_src_port(id) != 0);

	adv.source_addr = (uintptr_t)source;
	adv.source_rkey = source_mr->rkey;
	adv.sink_addr = (uintptr_t)sink;
	adv.sink_rkey = sink_mr->rkey;
	post_send(id->qp, 1, IBV_WR_SEND, &adv, sizeof adv, adv_mr, 0, 0);
	expect_wc(&s, 1, IBV_WC_SUCCESS, IBV_WC_SEND, sizeof adv);
	expect_wc(&s, 100, IBV_WC_SUCCESS, IBV_WC_RECV, 5);
	CHECK(strcmp(done, "done") == 0);
	CHECK(check_pattern(sink, LEN, 2)); /* the server's RDMA Write landed before its Send */

	CHECK(rdma_disconnect(id) == 0);
	CHECK(rdma_ack_cm_event(expect_event(channel, RDMA_CM_EVENT_DISCONNECTED)) == 0);
	CHECK(rdma_ack_cm_event(expect_event(channel, RDMA_CM_EVENT_TIMEWAIT_EXIT)) == 0);

	CHECK(ibv_dereg_mr(adv_mr) == 0);
	CHECK(ibv_dereg_mr(source_mr) == 0);
	CHECK(ibv_dereg_mr(sink_mr) == 0);
	CHECK(ibv_dereg_mr(done_mr) == 0);
	teardown_side(&s, id);
	CHECK(rdma_destroy_id(id) == 0);
	rdma_destroy_event_channel(channel);
	CHECK_EQ(join_peer(peer), 0);
	printf("event-driven client/server: send, RDMA write, RDMA read verified\n");
	return 0;
}
