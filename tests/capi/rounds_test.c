/* Rounds of connect, exchange, disconnect and destroy ids, with the PD, completion channel,
 * CQ and MR made once on the first id's device and used in every round, as rdma-core's
 * cmtime does: the device context rdma_cm ids share stays the same when the last id of a
 * round goes (librdmacm keeps its devices open until the process exits). Even rounds make
 * their QP with ibv_create_qp on that PD and CQ, walk it through INIT/RTR/RTS with
 * rdma_init_qp_attr and name it by conn_param.qp_num (CONNECT_RESPONSE, rdma_establish on
 * the client); odd rounds use rdma_create_qp with the same PD and CQ. Each round a message
 * goes each way, its bytes checked. A last round connects without a QP, as cmtime's "no QPs"
 * round does. Over RoCE (PEERCM_TRANSPORT=roce) the server takes a random 127/8 address, so
 * that parallel tests never share (address, 4791). */
#define _GNU_SOURCE
#include <time.h>

#include "capi_test.h"

enum { ROUNDS = 6, MSG = 256, NO_QP_CLIENT = 0xC11E7, NO_QP_SERVER = 0x5E7E7 };

static int roce;

struct verbs {
	struct ibv_context *context;
	__be64 node_guid;
	struct ibv_pd *pd;
	struct ibv_comp_channel *channel;
	struct ibv_cq *cq;
	struct ibv_mr *mr;
	uint8_t buf[2][MSG]; /* [0] receives, [1] sends */
};

/* Made once, on the device of the first id; every later id must be on the same context. */
static void use_device_of(struct verbs *v, struct rdma_cm_id *id)
{
	struct ibv_device_attr attr;

	CHECK(id->verbs != NULL);
	CHECK(ibv_query_device(id->verbs, &attr) == 0);
	if (v->context) {
		CHECK(id->verbs == v->context);
		CHECK(attr.node_guid == v->node_guid); /* one node: the same GUID */
		return;
	}
	v->context = id->verbs;
	v->node_guid = attr.node_guid;
	CHECK((v->pd = ibv_alloc_pd(v->context)) != NULL);
	CHECK((v->channel = ibv_create_comp_channel(v->context)) != NULL);
	CHECK((v->cq = ibv_create_cq(v->context, 16, v, v->channel, 0)) != NULL);
	CHECK((v->mr = ibv_reg_mr(v->pd, v->buf, sizeof v->buf, IBV_ACCESS_LOCAL_WRITE)) != NULL);
}

static void free_verbs(struct verbs *v)
{
	CHECK(ibv_dereg_mr(v->mr) == 0);
	CHECK(ibv_destroy_cq(v->cq) == 0);
	CHECK(ibv_destroy_comp_channel(v->channel) == 0);
	CHECK(ibv_dealloc_pd(v->pd) == 0);
}

static struct ibv_qp_init_attr qp_attr(struct verbs *v)
{
	struct ibv_qp_init_attr attr;

	memset(&attr, 0, sizeof attr);
	attr.cap.max_send_wr = attr.cap.max_recv_wr = 2;
	attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
	attr.qp_type = IBV_QPT_RC;
	attr.sq_sig_all = 1;
	attr.send_cq = attr.recv_cq = v->cq;
	return attr;
}

/* ibv_create_qp on the shared PD and CQ, moved to `state` with what rdma_init_qp_attr says,
 * as cmtime's modify_qp() does. */
static void modify_as_cm_says(struct rdma_cm_id *id, struct ibv_qp *qp, enum ibv_qp_state state)
{
	struct ibv_qp_attr attr;
	int mask = 0;

	memset(&attr, 0, sizeof attr);
	attr.qp_state = state;
	CHECK(rdma_init_qp_attr(id, &attr, &mask) == 0);
	CHECK(ibv_modify_qp(qp, &attr, mask) == 0);
}

static struct ibv_qp *make_qp(struct verbs *v, struct rdma_cm_id *id, int round)
{
	struct ibv_qp_init_attr attr = qp_attr(v);
	struct ibv_qp *qp;

	if (round % 2) {
		CHECK(rdma_create_qp(id, v->pd, &attr) == 0);
		return id->qp;
	}
	CHECK((qp = ibv_create_qp(v->pd, &attr)) != NULL);
	modify_as_cm_says(id, qp, IBV_QPS_INIT);
	return qp;
}

static void drop_qp(struct rdma_cm_id *id, struct ibv_qp *qp, int round)
{
	if (round % 2)
		rdma_destroy_qp(id);
	else
		CHECK(ibv_destroy_qp(qp) == 0);
}

static void post_recv(struct verbs *v, struct ibv_qp *qp, uint64_t wr_id)
{
	struct ibv_sge sge = { .addr = (uintptr_t)v->buf[0], .length = MSG, .lkey = v->mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = wr_id, .sg_list = &sge, .num_sge = 1 }, *bad;

	memset(v->buf[0], 0, MSG);
	CHECK(ibv_post_recv(qp, &wr, &bad) == 0);
}

static void send_and_check(struct verbs *v, struct ibv_qp *qp, uint64_t wr_id, uint32_t seed)
{
	struct ibv_sge sge = { .addr = (uintptr_t)v->buf[1], .length = MSG, .lkey = v->mr->lkey };
	struct ibv_send_wr wr, *bad;
	struct ibv_wc wc;

	fill_pattern(v->buf[1], MSG, seed);
	memset(&wr, 0, sizeof wr);
	wr.wr_id = wr_id;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = IBV_WR_SEND;
	CHECK(ibv_post_send(qp, &wr, &bad) == 0);
	wc = wait_wc(v->cq, v->channel);
	CHECK_EQ(wc.status, IBV_WC_SUCCESS);
	CHECK_EQ(wc.wr_id, wr_id);
	CHECK_EQ(wc.opcode, IBV_WC_SEND);
}

static void receive_and_check(struct verbs *v, struct ibv_qp *qp, uint64_t wr_id, uint32_t seed)
{
	struct ibv_wc wc = wait_wc(v->cq, v->channel);

	CHECK_EQ(wc.status, IBV_WC_SUCCESS);
	CHECK_EQ(wc.wr_id, wr_id);
	CHECK_EQ(wc.opcode, IBV_WC_RECV);
	CHECK_EQ(wc.byte_len, MSG);
	CHECK_EQ(wc.qp_num, qp->qp_num);
	CHECK(check_pattern(v->buf[0], MSG, seed));
}

static struct sockaddr_in server_address;

static int server(int port_fd)
{
	static struct verbs v;
	struct rdma_event_channel *cm;
	struct rdma_cm_id *listener;
	struct rdma_cm_event *event;

	CHECK((cm = rdma_create_event_channel()) != NULL);
	CHECK(rdma_create_id(cm, &listener, NULL, RDMA_PS_TCP) == 0);
	CHECK(rdma_bind_addr(listener, (struct sockaddr *)&server_address) == 0);
	CHECK(rdma_listen(listener, 4) == 0);
	tell_port(port_fd, listener);
	for (int round = 0; round < ROUNDS; round++) {
		struct rdma_conn_param param;
		struct rdma_cm_id *id;
		struct ibv_qp *qp;

		event = server_event(cm, RDMA_CM_EVENT_CONNECT_REQUEST);
		id = event->id;
		CHECK(rdma_ack_cm_event(event) == 0);
		use_device_of(&v, id);
		CHECK(id->verbs == listener->verbs);
		qp = make_qp(&v, id, round);
		post_recv(&v, qp, (uint64_t)round);
		memset(&param, 0, sizeof param);
		param.responder_resources = param.initiator_depth = 1;
		if (round % 2 == 0) {
			modify_as_cm_says(id, qp, IBV_QPS_RTR);
			modify_as_cm_says(id, qp, IBV_QPS_RTS);
			param.qp_num = qp->qp_num;
		}
		CHECK(rdma_accept(id, &param) == 0);
		CHECK(rdma_ack_cm_event(expect_event(cm, RDMA_CM_EVENT_ESTABLISHED)) == 0);
		receive_and_check(&v, qp, (uint64_t)round, 1000u + (uint32_t)round);
		send_and_check(&v, qp, 100u + (uint64_t)round, 2000u + (uint32_t)round);
		CHECK(rdma_ack_cm_event(server_event(cm, RDMA_CM_EVENT_DISCONNECTED)) == 0);
		drop_qp(id, qp, round);
		CHECK(rdma_destroy_id(id) == 0);
	}
	if (roce) {
		/* cmtime's "no QPs" round: the CM exchange alone, a made-up QP number each way. */
		struct rdma_conn_param param;
		struct rdma_cm_id *id;

		event = server_event(cm, RDMA_CM_EVENT_CONNECT_REQUEST);
		id = event->id;
		CHECK(rdma_ack_cm_event(event) == 0);
		memset(&param, 0, sizeof param);
		param.qp_num = NO_QP_SERVER;
		CHECK(rdma_accept(id, &param) == 0);
		CHECK(rdma_ack_cm_event(expect_event(cm, RDMA_CM_EVENT_ESTABLISHED)) == 0);
		CHECK(rdma_ack_cm_event(expect_event(cm, RDMA_CM_EVENT_DISCONNECTED)) == 0);
		CHECK(rdma_destroy_id(id) == 0);
	}
	CHECK(rdma_destroy_id(listener) == 0);
	/* No id is left: the device's objects still work. */
	{
		struct ibv_wc wc;
		struct ibv_mr *again = ibv_reg_mr(v.pd, v.buf, MSG, IBV_ACCESS_LOCAL_WRITE);

		CHECK(again != NULL);
		CHECK(ibv_dereg_mr(again) == 0);
		CHECK_EQ(ibv_poll_cq(v.cq, 1, &wc), 0);
	}
	free_verbs(&v);
	rdma_destroy_event_channel(cm);
	return 0;
}

static void client_round(struct verbs *v, struct rdma_event_channel *cm, const struct sockaddr_in *to, int round)
{
	struct rdma_conn_param param;
	struct rdma_cm_id *id;
	struct ibv_qp *qp;

	id = resolve_towards(cm, to);
	use_device_of(v, id);
	qp = make_qp(v, id, round);
	post_recv(v, qp, (uint64_t)round);
	memset(&param, 0, sizeof param);
	param.responder_resources = param.initiator_depth = 1;
	if (round % 2 == 0) {
		/* cmtime's connect_response(): RTR and RTS after the reply, then rdma_establish. */
		param.qp_num = qp->qp_num;
		CHECK(rdma_connect(id, &param) == 0);
		CHECK(rdma_ack_cm_event(expect_event(cm, RDMA_CM_EVENT_CONNECT_RESPONSE)) == 0);
		modify_as_cm_says(id, qp, IBV_QPS_RTR);
		modify_as_cm_says(id, qp, IBV_QPS_RTS);
		CHECK(rdma_establish(id) == 0);
	} else {
		CHECK(rdma_connect(id, &param) == 0);
		CHECK(rdma_ack_cm_event(expect_event(cm, RDMA_CM_EVENT_ESTABLISHED)) == 0);
	}
	send_and_check(v, qp, 100u + (uint64_t)round, 1000u + (uint32_t)round);
	receive_and_check(v, qp, (uint64_t)round, 2000u + (uint32_t)round);
	CHECK(rdma_disconnect(id) == 0);
	CHECK(rdma_ack_cm_event(expect_event(cm, RDMA_CM_EVENT_DISCONNECTED)) == 0);
	drop_qp(id, qp, round);
	CHECK(rdma_destroy_id(id) == 0);
	/* The round's last id is gone; the shared objects are not. */
	{
		struct ibv_wc wc;

		CHECK_EQ(ibv_poll_cq(v->cq, 1, &wc), 0);
	}
}

/* The last round of rdma-core's cmtime: connect with a qp_num that names no QP. Over RoCE the
 * IB CM exchange runs alone (CONNECT_RESPONSE, rdma_establish), as rdma_cm over IB allows;
 * iWARP needs a QP for its stream, so rdma_connect is EINVAL there, as with iw_cm. */
static void client_round_without_qp(struct rdma_event_channel *cm, const struct sockaddr_in *to)
{
	struct rdma_conn_param param;
	struct rdma_cm_id *id = resolve_towards(cm, to);

	memset(&param, 0, sizeof param);
	param.qp_num = NO_QP_CLIENT;
	if (!roce) {
		CHECK(rdma_connect(id, &param) == -1 && errno == EINVAL);
		CHECK(rdma_destroy_id(id) == 0);
		return;
	}
	CHECK(rdma_connect(id, &param) == 0);
	CHECK(rdma_ack_cm_event(expect_event(cm, RDMA_CM_EVENT_CONNECT_RESPONSE)) == 0);
	CHECK(rdma_establish(id) == 0);
	CHECK(rdma_disconnect(id) == 0);
	CHECK(rdma_ack_cm_event(expect_event(cm, RDMA_CM_EVENT_DISCONNECTED)) == 0);
	CHECK(rdma_destroy_id(id) == 0);
}

int main(void)
{
	static struct verbs v;
	struct rdma_event_channel *cm;
	const char *transport = getenv("PEERCM_TRANSPORT");
	uint16_t port;
	pid_t peer;

	roce = transport && strcmp(transport, "roce") == 0;
	server_address = loopback(0);
	if (roce) {
		srand((unsigned)time(NULL) ^ (unsigned)getpid());
		server_address.sin_addr.s_addr =
			htonl((127u << 24) | ((unsigned)(rand() % 254 + 1) << 16) |
			      ((unsigned)(rand() % 256) << 8) | (unsigned)(rand() % 254 + 1));
	}
	peer = spawn_peer(server, &port);
	server_address.sin_port = htons(port);

	CHECK((cm = rdma_create_event_channel()) != NULL);
	for (int round = 0; round < ROUNDS; round++)
		client_round(&v, cm, &server_address, round);
	client_round_without_qp(cm, &server_address);
	free_verbs(&v);
	rdma_destroy_event_channel(cm);
	CHECK_EQ(join_peer(peer), 0);
	printf("%d rounds on one device context: the same PD, CQ and MR in each, QPs by qp_num and by "
	       "rdma_create_qp, messages checked both ways\n", ROUNDS);
	return 0;
}
