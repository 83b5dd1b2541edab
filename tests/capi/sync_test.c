/* The synchronous API, the way rdma_server/rdma_client use it: rdma_getaddrinfo, rdma_create_ep
 * (passive with a QP template, active with CQs made for the id), rdma_get_request, and
 * rdma_accept / rdma_connect / rdma_disconnect blocking because the ids have no channel; data
 * moves with the rdma_verbs.h helpers (inline and registered sends), verified on both sides.
 * Also: a blocking connect to a closed port fails with ECONNREFUSED, and ibv_post_send refuses
 * the immediate-data opcodes (iWARP has none) with EINVAL and bad_wr, leaving the QP usable. */
#define _GNU_SOURCE
#include "capi_test.h"

enum { LEN = 4096 };

static const char request_data[] = "sync-request";

static struct rdma_addrinfo *resolve(const char *node, const char *service, int passive)
{
	struct rdma_addrinfo hints, *res = NULL;

	memset(&hints, 0, sizeof hints);
	hints.ai_port_space = RDMA_PS_TCP;
	if (passive)
		hints.ai_flags = RAI_PASSIVE;
	CHECK_EQ(rdma_getaddrinfo(node, service, &hints, &res), 0);
	CHECK(res != NULL);
	CHECK_EQ(res->ai_family, AF_INET);
	CHECK_EQ(res->ai_qp_type, IBV_QPT_RC);
	CHECK(passive ? res->ai_src_addr != NULL : res->ai_dst_addr != NULL);
	return res;
}

/* rdma_getaddrinfo(NULL, NULL, hints) gives back the hints' own addresses, as librdmacm does
 * (libfabric's verbs provider resolves a peer's address this way); with no hints either it is
 * EINVAL. Returns a result naming the same destination as `named`, which it frees. */
static struct rdma_addrinfo *resolve_from_hints(struct rdma_addrinfo *named)
{
	struct rdma_addrinfo hints, *res;
	struct sockaddr_in source;

	errno = 0;
	CHECK_EQ(rdma_getaddrinfo(NULL, NULL, NULL, &res), -1);
	CHECK_EQ(errno, EINVAL);

	memset(&source, 0, sizeof source);
	source.sin_family = AF_INET;
	source.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	memset(&hints, 0, sizeof hints);
	hints.ai_family = AF_INET;
	hints.ai_qp_type = IBV_QPT_RC;
	hints.ai_port_space = RDMA_PS_TCP;
	hints.ai_dst_addr = named->ai_dst_addr;
	hints.ai_dst_len = named->ai_dst_len;
	hints.ai_src_addr = (struct sockaddr *)&source;
	hints.ai_src_len = sizeof source;
	CHECK_EQ(rdma_getaddrinfo(NULL, NULL, &hints, &res), 0);
	CHECK_EQ(res->ai_family, AF_INET);
	CHECK_EQ(res->ai_qp_type, IBV_QPT_RC);
	CHECK_EQ(res->ai_port_space, RDMA_PS_TCP);
	CHECK_EQ(res->ai_dst_len, named->ai_dst_len);
	CHECK(memcmp(res->ai_dst_addr, named->ai_dst_addr, named->ai_dst_len) == 0);
	CHECK_EQ(res->ai_src_len, (socklen_t)sizeof source);
	CHECK(memcmp(res->ai_src_addr, &source, sizeof source) == 0);
	rdma_freeaddrinfo(named);
	return res;
}

static struct ibv_qp_init_attr qp_template(void)
{
	struct ibv_qp_init_attr attr;

	memset(&attr, 0, sizeof attr);
	attr.cap.max_send_wr = attr.cap.max_recv_wr = 4;
	attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
	attr.cap.max_inline_data = 16;
	attr.sq_sig_all = 1;
	return attr;
}

static int server(int port_fd)
{
	struct rdma_addrinfo *res = resolve("127.0.0.1", "0", 1);
	struct ibv_qp_init_attr attr = qp_template(), got;
	struct ibv_qp_attr qp_attr;
	struct rdma_cm_id *listen_id, *id;
	static uint8_t recv_buf[LEN], bulk[LEN];
	static const char reply[16] = "inline-reply";
	struct ibv_mr *recv_mr, *bulk_mr;
	struct ibv_wc wc;
	int ret;

	CHECK(rdma_create_ep(&listen_id, res, NULL, &attr) == 0);
	CHECK(listen_id->channel != NULL); /* a private channel */
	CHECK(rdma_listen(listen_id, -1) == 0); /* negative: the largest backlog */
	tell_port(port_fd, listen_id);

	CHECK(rdma_get_request(listen_id, &id) == 0);
	CHECK(id->event != NULL);
	CHECK_EQ(id->event->event, RDMA_CM_EVENT_CONNECT_REQUEST);
	CHECK_EQ(id->event->param.conn.private_data_len, sizeof request_data);
	CHECK(memcmp(id->event->param.conn.private_data, request_data, sizeof request_data) == 0);
	CHECK(id->qp != NULL); /* made from the listener's template */
	CHECK(id->recv_cq != NULL && id->recv_cq->cq_context == id);
	CHECK(ibv_query_qp(id->qp, &qp_attr, IBV_QP_CAP, &got) == 0);
	CHECK(got.cap.max_inline_data >= 16);

	CHECK((recv_mr = rdma_reg_msgs(id, recv_buf, LEN)) != NULL);
	CHECK((bulk_mr = rdma_reg_msgs(id, bulk, LEN)) != NULL);
	CHECK(rdma_post_recv(id, (void *)(uintptr_t)7, recv_buf, LEN, recv_mr) == 0);
	CHECK(rdma_accept(id, NULL) == 0); /* returns once ESTABLISHED */
	CHECK_EQ(id->event->event, RDMA_CM_EVENT_ESTABLISHED);

	while ((ret = rdma_get_recv_comp(id, &wc)) == 0)
		;
	CHECK_EQ(ret, 1);
	CHECK_EQ(wc.status, IBV_WC_SUCCESS);
	CHECK_EQ(wc.wr_id, 7);
	CHECK_EQ(wc.byte_len, LEN);
	CHECK(check_pattern(recv_buf, LEN, 3));

	CHECK(rdma_post_send(id, NULL, (void *)reply, sizeof reply, NULL, IBV_SEND_INLINE) == 0);
	CHECK_EQ(rdma_get_send_comp(id, &wc), 1);
	CHECK_EQ(wc.status, IBV_WC_SUCCESS);
	fill_pattern(bulk, LEN, 4);
	CHECK(rdma_post_send(id, NULL, bulk, LEN, bulk_mr, 0) == 0);
	CHECK_EQ(rdma_get_send_comp(id, &wc), 1);
	CHECK_EQ(wc.status, IBV_WC_SUCCESS);

	/* The client disconnects; ours returns on the DISCONNECTED it already caused. */
	CHECK(rdma_disconnect(id) == 0);
	CHECK_EQ(id->event->event, RDMA_CM_EVENT_DISCONNECTED);

	CHECK(rdma_dereg_mr(recv_mr) == 0);
	CHECK(rdma_dereg_mr(bulk_mr) == 0);
	rdma_destroy_ep(id);
	rdma_destroy_ep(listen_id);
	rdma_freeaddrinfo(res);
	return 0;
}

/* IBV_WR_SEND_WITH_IMM and IBV_WR_RDMA_WRITE_WITH_IMM on an iWARP QP: EINVAL at post, the
 * failing WR in bad_wr, nothing sent (the server's exchange that follows still matches). */
static void immediate_data_is_refused(struct rdma_cm_id *id, uint8_t *buf, struct ibv_mr *mr)
{
	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = 8, .lkey = mr->lkey };
	struct ibv_send_wr second, first, *bad = NULL;

	memset(&second, 0, sizeof second);
	second.wr_id = 2;
	second.opcode = IBV_WR_SEND_WITH_IMM;
	second.sg_list = &sge;
	second.num_sge = 1;
	second.imm_data = htonl(0x1234);
	first = second;
	first.wr_id = 1;
	first.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
	first.wr.rdma.remote_addr = 0x1000;
	first.wr.rdma.rkey = 1;
	first.next = &second;
	CHECK_EQ(ibv_post_send(id->qp, &first, &bad), EINVAL);
	CHECK(bad == &first);
	bad = NULL;
	CHECK_EQ(ibv_post_send(id->qp, &second, &bad), EINVAL);
	CHECK(bad == &second);
}

static void connect_to_closed_port(void)
{
	int probe = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = loopback(0);
	socklen_t len = sizeof a;
	char service[16];
	struct rdma_addrinfo *res;
	struct ibv_qp_init_attr attr = qp_template();
	struct rdma_cm_id *id;

	/* A port that was free a moment ago. */
	CHECK(bind(probe, (struct sockaddr *)&a, sizeof a) == 0);
	CHECK(getsockname(probe, (struct sockaddr *)&a, &len) == 0);
	close(probe);
	snprintf(service, sizeof service, "%u", ntohs(a.sin_port));
	res = resolve("127.0.0.1", service, 0);
	CHECK(rdma_create_ep(&id, res, NULL, &attr) == 0);
	errno = 0;
	CHECK_EQ(rdma_connect(id, NULL), -1);
	CHECK_EQ(errno, ECONNREFUSED);
	CHECK_EQ(id->event->event, RDMA_CM_EVENT_REJECTED);
	rdma_destroy_ep(id);
	rdma_freeaddrinfo(res);
}

int main(void)
{
	uint16_t port;
	pid_t peer = spawn_peer(server, &port);
	char service[16];
	struct rdma_addrinfo *res;
	struct ibv_qp_init_attr attr = qp_template();
	struct rdma_conn_param param;
	struct rdma_cm_id *id;
	static uint8_t send_buf[LEN], reply[16], bulk[LEN];
	struct ibv_mr *send_mr, *reply_mr, *bulk_mr;
	struct ibv_wc wc;

	snprintf(service, sizeof service, "%u", port);
	res = resolve_from_hints(resolve("127.0.0.1", service, 0));
	CHECK(rdma_create_ep(&id, res, NULL, &attr) == 0);
	CHECK(attr.cap.max_inline_data >= 16); /* rdma_client reads it back from here */
	CHECK(id->qp != NULL && id->pd != NULL);
	CHECK(id->send_cq != NULL && id->send_cq->cq_context == id);
	CHECK(id->recv_cq_channel != NULL);

	CHECK((send_mr = rdma_reg_msgs(id, send_buf, LEN)) != NULL);
	CHECK((reply_mr = rdma_reg_msgs(id, reply, sizeof reply)) != NULL);
	CHECK((bulk_mr = rdma_reg_msgs(id, bulk, LEN)) != NULL);
	CHECK(rdma_post_recv(id, NULL, reply, sizeof reply, reply_mr) == 0);
	CHECK(rdma_post_recv(id, NULL, bulk, LEN, bulk_mr) == 0);

	memset(&param, 0, sizeof param);
	param.private_data = request_data;
	param.private_data_len = sizeof request_data;
	param.responder_resources = RDMA_MAX_RESP_RES;
	param.initiator_depth = RDMA_MAX_INIT_DEPTH;
	CHECK(rdma_connect(id, &param) == 0); /* returns once ESTABLISHED */
	CHECK_EQ(id->event->event, RDMA_CM_EVENT_ESTABLISHED);

	immediate_data_is_refused(id, send_buf, send_mr);
	fill_pattern(send_buf, LEN, 3);
	CHECK(rdma_post_send(id, NULL, send_buf, LEN, send_mr, 0) == 0);
	CHECK_EQ(rdma_get_send_comp(id, &wc), 1);
	CHECK_EQ(wc.status, IBV_WC_SUCCESS);
	CHECK_EQ(rdma_get_recv_comp(id, &wc), 1);
	CHECK_EQ(wc.status, IBV_WC_SUCCESS);
	CHECK_EQ(wc.byte_len, sizeof reply);
	CHECK(strcmp((char *)reply, "inline-reply") == 0);
	CHECK_EQ(rdma_get_recv_comp(id, &wc), 1);
	CHECK_EQ(wc.status, IBV_WC_SUCCESS);
	CHECK_EQ(wc.byte_len, LEN);
	CHECK(check_pattern(bulk, LEN, 4));

	CHECK(rdma_disconnect(id) == 0); /* returns on DISCONNECTED */
	CHECK_EQ(id->event->event, RDMA_CM_EVENT_DISCONNECTED);
	CHECK(rdma_dereg_mr(send_mr) == 0);
	CHECK(rdma_dereg_mr(reply_mr) == 0);
	CHECK(rdma_dereg_mr(bulk_mr) == 0);
	rdma_destroy_ep(id);
	rdma_freeaddrinfo(res);
	CHECK_EQ(join_peer(peer), 0);

	connect_to_closed_port();
	printf("synchronous endpoints: create_ep/get_request/accept/connect/disconnect verified\n");
	return 0;
}
