/* rdma_cm's UDP port space over RoCEv2, in udaddy's pattern (two processes): the server
 * listens on an RDMA_PS_UDP id, the client resolves and connects (a SIDR request), the server
 * answers CONNECT_REQUEST with rdma_accept naming its UD QP; the client's ESTABLISHED carries
 * the address vector, QPN and Q_Key (RDMA_UDP_QKEY) of the server's QP. The client sends
 * numbered messages through an AH made from that event; the server answers each through an AH
 * made from the first completion (ibv_create_ah_from_wc), to its src_qp and its own Q_Key.
 * Then: a request the server rejects (REJECTED with its private data), a port nobody listens
 * on (UNREACHABLE at once), an address nobody answers at (UNREACHABLE after the retries).
 * Over iWARP, RDMA_PS_UDP is refused with EPROTONOSUPPORT. */
#define _POSIX_C_SOURCE 200809L
#include "capi_test.h"

#include <netdb.h>
#include <time.h>

enum { MSGS = 8, PAYLOAD = 256, GRH = 40, SLOT = GRH + PAYLOAD, UNREACHABLE_WAIT_MS = 30000 };

static const char hello[] = "hello sidr";
static const char welcome[] = "welcome";
static const char refusal[] = "no thanks";

static uint32_t server_address;
static uint32_t client_address;

struct ud_side {
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_comp_channel *channel;
	struct ibv_mr *mr;
	uint8_t *buf; /* MSGS receive slots, then MSGS send slots */
};

static struct sockaddr_in address_of(uint32_t host, uint16_t port)
{
	struct sockaddr_in a;

	memset(&a, 0, sizeof a);
	a.sin_family = AF_INET;
	a.sin_port = htons(port);
	a.sin_addr.s_addr = htonl(host);
	return a;
}

static uint32_t random_loopback(void)
{
	uint32_t host;

	do
		host = (127u << 24) | ((uint32_t)rand() & 0xFFFFFF);
	while ((host & 0xFF) == 0 || (host & 0xFF) == 0xFF || host == ((127u << 24) | 1));
	return host;
}

/* The next event on `cm`, which must be `type`, within `ms`. */
static struct rdma_cm_event *expect_event_within(struct rdma_event_channel *cm, enum rdma_cm_event_type type, int ms)
{
	struct pollfd pfd = { .fd = cm->fd, .events = POLLIN };
	struct rdma_cm_event *event;

	if (poll(&pfd, 1, ms) != 1) {
		fprintf(stderr, "no CM event within %d ms, wanted %s\n", ms, rdma_event_str(type));
		exit(1);
	}
	CHECK(rdma_get_cm_event(cm, &event) == 0);
	if (event->event != type) {
		fprintf(stderr, "got %s (status %d), wanted %s\n", rdma_event_str(event->event), event->status,
			rdma_event_str(type));
		exit(1);
	}
	return event;
}

/* udaddy's init_node: PD, CQ and a UD QP through rdma_create_qp, receives posted. */
static void make_ud_side(struct rdma_cm_id *id, struct ud_side *s)
{
	struct ibv_qp_init_attr attr;
	struct ibv_qp_attr qp_attr;
	struct ibv_qp_init_attr init;

	CHECK((s->pd = ibv_alloc_pd(id->verbs)) != NULL);
	CHECK((s->channel = ibv_create_comp_channel(id->verbs)) != NULL);
	CHECK((s->cq = ibv_create_cq(id->verbs, 2 * MSGS, NULL, s->channel, 0)) != NULL);
	CHECK((s->buf = calloc(2 * MSGS, SLOT)) != NULL);
	CHECK((s->mr = ibv_reg_mr(s->pd, s->buf, 2 * MSGS * SLOT, IBV_ACCESS_LOCAL_WRITE)) != NULL);
	memset(&attr, 0, sizeof attr);
	attr.cap.max_send_wr = attr.cap.max_recv_wr = MSGS;
	attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
	attr.qp_type = IBV_QPT_UD;
	attr.send_cq = attr.recv_cq = s->cq;
	CHECK(rdma_create_qp(id, s->pd, &attr) == 0);
	CHECK(id->qp != NULL && id->qp->qp_type == IBV_QPT_UD);
	/* rdma_cm hands the UD QP over in RTS with the UDP port space's Q_Key. */
	CHECK(ibv_query_qp(id->qp, &qp_attr, IBV_QP_STATE | IBV_QP_QKEY, &init) == 0);
	CHECK_EQ(qp_attr.qp_state, IBV_QPS_RTS);
	CHECK_EQ(qp_attr.qkey, RDMA_UDP_QKEY);
	memset(&qp_attr, 0, sizeof qp_attr);
	int mask = 0;
	qp_attr.qp_state = IBV_QPS_INIT;
	CHECK(rdma_init_qp_attr(id, &qp_attr, &mask) == 0);
	CHECK(mask & IBV_QP_QKEY);
	CHECK_EQ(qp_attr.qkey, RDMA_UDP_QKEY);
	for (int i = 0; i < MSGS; i++) {
		struct ibv_sge sge = { .addr = (uintptr_t)(s->buf + (size_t)i * SLOT), .length = SLOT, .lkey = s->mr->lkey };
		struct ibv_recv_wr wr = { .wr_id = (uint64_t)i, .sg_list = &sge, .num_sge = 1 }, *bad;
		CHECK(ibv_post_recv(id->qp, &wr, &bad) == 0);
	}
}

static void free_ud_side(struct rdma_cm_id *id, struct ud_side *s)
{
	CHECK(ibv_dereg_mr(s->mr) == 0);
	rdma_destroy_qp(id);
	CHECK(ibv_destroy_cq(s->cq) == 0);
	CHECK(ibv_destroy_comp_channel(s->channel) == 0);
	CHECK(ibv_dealloc_pd(s->pd) == 0);
	free(s->buf);
}

/* Message `seq`: its number, then a pattern seeded by it (and by who sends it). */
static void fill_message(uint8_t *p, uint32_t seq, uint32_t who)
{
	memcpy(p, &seq, sizeof seq);
	fill_pattern(p + sizeof seq, PAYLOAD - sizeof seq, seq * 7 + who);
}

static void send_messages(struct rdma_cm_id *id, struct ud_side *s, struct ibv_ah *ah, uint32_t qpn, uint32_t qkey,
			  uint32_t who)
{
	for (uint32_t i = 0; i < MSGS; i++) {
		uint8_t *slot = s->buf + (size_t)(MSGS + i) * SLOT;
		fill_message(slot, i, who);
		struct ibv_sge sge = { .addr = (uintptr_t)slot, .length = PAYLOAD, .lkey = s->mr->lkey };
		struct ibv_send_wr wr, *bad;
		memset(&wr, 0, sizeof wr);
		wr.wr_id = 100 + i;
		wr.sg_list = &sge;
		wr.num_sge = 1;
		wr.opcode = IBV_WR_SEND_WITH_IMM;
		wr.send_flags = IBV_SEND_SIGNALED;
		wr.imm_data = htonl(id->qp->qp_num); /* udaddy names its QP this way */
		wr.wr.ud.ah = ah;
		wr.wr.ud.remote_qpn = qpn;
		wr.wr.ud.remote_qkey = qkey;
		CHECK(ibv_post_send(id->qp, &wr, &bad) == 0);
	}
}

/* Waits for MSGS receives and MSGS send completions (in any order); checks every message. The
 * first receive is returned in *first. */
static void complete_exchange(struct ud_side *s, uint32_t expect_src_qp, uint32_t sender, int sends,
			      struct ibv_wc *first)
{
	int received = 0, sent = 0;
	unsigned seen = 0;

	while (received < MSGS || sent < sends) {
		struct ibv_wc wc = wait_wc(s->cq, s->channel);
		CHECK_EQ(wc.status, IBV_WC_SUCCESS);
		if (wc.opcode == IBV_WC_SEND) {
			sent++;
			continue;
		}
		CHECK_EQ(wc.opcode, IBV_WC_RECV);
		CHECK(wc.wc_flags & IBV_WC_GRH);
		CHECK(wc.wc_flags & IBV_WC_WITH_IMM);
		CHECK_EQ(wc.byte_len, GRH + PAYLOAD);
		if (expect_src_qp)
			CHECK_EQ(wc.src_qp, expect_src_qp);
		CHECK_EQ(ntohl(wc.imm_data), wc.src_qp);
		const uint8_t *p = s->buf + (size_t)wc.wr_id * SLOT + GRH;
		uint32_t seq;
		memcpy(&seq, p, sizeof seq);
		CHECK(seq < MSGS);
		CHECK(check_pattern(p + sizeof seq, PAYLOAD - sizeof seq, seq * 7 + sender));
		CHECK(!(seen & (1u << seq)));
		seen |= 1u << seq;
		if (received == 0 && first)
			*first = wc;
		received++;
	}
}

static int server(int port_fd)
{
	struct rdma_event_channel *cm = rdma_create_event_channel();
	struct rdma_cm_id *listener, *id;
	struct rdma_cm_event *event;
	struct sockaddr_in bind_to = address_of(server_address, 0);
	struct ud_side s;
	struct ibv_wc first;
	struct ibv_qp_attr qp_attr;
	struct ibv_qp_init_attr init;

	CHECK(cm != NULL);
	CHECK(rdma_create_id(cm, &listener, NULL, RDMA_PS_UDP) == 0);
	CHECK_EQ(listener->qp_type, IBV_QPT_UD);
	CHECK(rdma_bind_addr(listener, (struct sockaddr *)&bind_to) == 0);
	CHECK(rdma_listen(listener, 4) == 0);
	tell_port(port_fd, listener);

	/* 1: accepted, then the data exchange. */
	event = expect_event(cm, RDMA_CM_EVENT_CONNECT_REQUEST);
	id = event->id;
	CHECK(event->listen_id == listener);
	CHECK(event->param.ud.private_data_len >= sizeof hello);
	CHECK(memcmp(event->param.ud.private_data, hello, sizeof hello) == 0);
	CHECK_EQ(ntohl(id->route.addr.dst_sin.sin_addr.s_addr), client_address);
	CHECK(rdma_ack_cm_event(event) == 0);
	make_ud_side(id, &s);
	struct rdma_conn_param accept;
	memset(&accept, 0, sizeof accept);
	accept.qp_num = id->qp->qp_num;
	accept.private_data = welcome;
	accept.private_data_len = sizeof welcome;
	CHECK(rdma_accept(id, &accept) == 0);
	complete_exchange(&s, 0, 1, 0, &first);
	struct ibv_ah *ah = ibv_create_ah_from_wc(s.pd, &first, (struct ibv_grh *)(s.buf + (size_t)first.wr_id * SLOT),
						  id->port_num);
	CHECK(ah != NULL);
	CHECK(ibv_query_qp(id->qp, &qp_attr, IBV_QP_QKEY, &init) == 0);
	/* Receives again for the replies' slots are not needed: the client only receives. */
	send_messages(id, &s, ah, ntohl(first.imm_data), qp_attr.qkey, 2);
	for (int sent = 0; sent < MSGS; sent++) {
		struct ibv_wc wc = wait_wc(s.cq, s.channel);
		CHECK_EQ(wc.status, IBV_WC_SUCCESS);
		CHECK_EQ(wc.opcode, IBV_WC_SEND);
	}
	CHECK(ibv_destroy_ah(ah) == 0);
	free_ud_side(id, &s);
	CHECK(rdma_destroy_id(id) == 0);

	/* 2: rejected with private data. */
	event = expect_event(cm, RDMA_CM_EVENT_CONNECT_REQUEST);
	id = event->id;
	CHECK(rdma_ack_cm_event(event) == 0);
	CHECK(rdma_reject(id, refusal, sizeof refusal) == 0);
	CHECK(rdma_destroy_id(id) == 0);

	/* 3: the client's last request, after its tries at other ports and addresses. */
	event = expect_event_within(cm, RDMA_CM_EVENT_CONNECT_REQUEST, UNREACHABLE_WAIT_MS);
	id = event->id;
	CHECK(rdma_ack_cm_event(event) == 0);
	CHECK(rdma_reject(id, NULL, 0) == 0);
	CHECK(rdma_destroy_id(id) == 0);
	CHECK(rdma_destroy_id(listener) == 0);
	rdma_destroy_event_channel(cm);
	return 0;
}

/* A resolved UDP-port-space id from client_address to `to`. */
static struct rdma_cm_id *resolved_id(struct rdma_event_channel *cm, struct sockaddr_in *to)
{
	struct rdma_cm_id *id;
	struct sockaddr_in from = address_of(client_address, 0);

	CHECK(rdma_create_id(cm, &id, NULL, RDMA_PS_UDP) == 0);
	CHECK(rdma_resolve_addr(id, (struct sockaddr *)&from, (struct sockaddr *)to, 2000) == 0);
	CHECK(rdma_ack_cm_event(expect_event(cm, RDMA_CM_EVENT_ADDR_RESOLVED)) == 0);
	CHECK(rdma_resolve_route(id, 2000) == 0);
	CHECK(rdma_ack_cm_event(expect_event(cm, RDMA_CM_EVENT_ROUTE_RESOLVED)) == 0);
	return id;
}

static void connect_with(struct rdma_cm_id *id, const void *data, uint8_t len)
{
	struct rdma_conn_param param;

	memset(&param, 0, sizeof param);
	param.private_data = data;
	param.private_data_len = len;
	CHECK(rdma_connect(id, &param) == 0);
}

static void check_addrinfo(uint16_t port)
{
	struct rdma_addrinfo hints, *res;
	char host[INET_ADDRSTRLEN], service[8];
	struct in_addr in = { .s_addr = htonl(server_address) };

	CHECK(inet_ntop(AF_INET, &in, host, sizeof host) != NULL);
	snprintf(service, sizeof service, "%u", port);
	memset(&hints, 0, sizeof hints);
	hints.ai_port_space = RDMA_PS_UDP; /* udaddy's hints */
	CHECK(rdma_getaddrinfo(host, service, &hints, &res) == 0);
	CHECK_EQ(res->ai_port_space, RDMA_PS_UDP);
	CHECK_EQ(res->ai_qp_type, IBV_QPT_UD);
	CHECK(res->ai_dst_addr != NULL);
	CHECK_EQ(((struct sockaddr_in *)res->ai_dst_addr)->sin_port, htons(port));
	rdma_freeaddrinfo(res);
	memset(&hints, 0, sizeof hints);
	hints.ai_qp_type = IBV_QPT_UD;
	hints.ai_flags = RAI_PASSIVE;
	CHECK(rdma_getaddrinfo(host, service, &hints, &res) == 0);
	CHECK_EQ(res->ai_port_space, RDMA_PS_UDP);
	CHECK(res->ai_src_addr != NULL);
	rdma_freeaddrinfo(res);
	hints.ai_port_space = RDMA_PS_TCP; /* UD in TCP's port space names nothing */
	CHECK(rdma_getaddrinfo(host, service, &hints, &res) == EAI_SOCKTYPE);
}

static int run_roce(void)
{
	uint16_t port;
	srand((unsigned)getpid() ^ (unsigned)time(NULL));
	server_address = random_loopback();
	do
		client_address = random_loopback();
	while (client_address == server_address);
	pid_t pid = spawn_peer(server, &port);
	check_addrinfo(port);

	struct rdma_event_channel *cm = rdma_create_event_channel();
	CHECK(cm != NULL);
	struct sockaddr_in to = address_of(server_address, port);

	/* 1: SIDR answered; the ESTABLISHED event names the server's UD QP. */
	struct rdma_cm_id *id = resolved_id(cm, &to);
	struct ud_side s;
	make_ud_side(id, &s);
	connect_with(id, hello, sizeof hello);
	struct rdma_cm_event *event = expect_event(cm, RDMA_CM_EVENT_ESTABLISHED);
	CHECK_EQ(event->status, 0);
	struct rdma_ud_param ud = event->param.ud;
	CHECK_EQ(ud.qkey, RDMA_UDP_QKEY);
	CHECK(ud.qp_num != 0);
	CHECK(ud.private_data_len >= sizeof welcome);
	CHECK(memcmp(ud.private_data, welcome, sizeof welcome) == 0);
	CHECK_EQ(ud.ah_attr.is_global, 1);
	CHECK_EQ(ud.ah_attr.port_num, 1);
	uint8_t want_gid[16] = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF };
	uint32_t be = htonl(server_address);
	memcpy(want_gid + 12, &be, 4);
	CHECK(memcmp(ud.ah_attr.grh.dgid.raw, want_gid, 16) == 0);
	union ibv_gid ours;
	CHECK(ibv_query_gid(id->verbs, 1, ud.ah_attr.grh.sgid_index, &ours) == 0);
	be = htonl(client_address);
	memcpy(want_gid + 12, &be, 4);
	CHECK(memcmp(ours.raw, want_gid, 16) == 0);
	struct ibv_ah *ah = ibv_create_ah(s.pd, &ud.ah_attr);
	CHECK(ah != NULL);
	CHECK(rdma_ack_cm_event(event) == 0);
	send_messages(id, &s, ah, ud.qp_num, ud.qkey, 1);
	complete_exchange(&s, ud.qp_num, 2, MSGS, NULL);
	/* A UD id has no connection to end. */
	CHECK(rdma_disconnect(id) == -1);
	CHECK(ibv_destroy_ah(ah) == 0);
	free_ud_side(id, &s);
	CHECK(rdma_destroy_id(id) == 0);

	/* 2: the server rejects: REJECTED with its private data. */
	id = resolved_id(cm, &to);
	connect_with(id, NULL, 0);
	event = expect_event(cm, RDMA_CM_EVENT_REJECTED);
	CHECK_EQ(event->status, -ECONNREFUSED);
	CHECK(event->param.ud.private_data_len >= sizeof refusal);
	CHECK(memcmp(event->param.ud.private_data, refusal, sizeof refusal) == 0);
	CHECK(rdma_ack_cm_event(event) == 0);
	CHECK(rdma_destroy_id(id) == 0);

	/* 3: nobody listens on the port: the node says so (SIDR status 1), UNREACHABLE at once. */
	struct sockaddr_in closed = address_of(server_address, (uint16_t)(port + 1));
	id = resolved_id(cm, &closed);
	connect_with(id, NULL, 0);
	event = expect_event(cm, RDMA_CM_EVENT_UNREACHABLE);
	CHECK_EQ(event->status, -ECONNREFUSED);
	CHECK(rdma_ack_cm_event(event) == 0);
	CHECK(rdma_destroy_id(id) == 0);

	/* 4: nothing at the address: the SIDR_REQ goes unanswered through its retries, bounded by
	 * the connect timeout (10 s). */
	uint32_t nobody;
	do
		nobody = random_loopback();
	while (nobody == server_address || nobody == client_address);
	struct sockaddr_in void_to = address_of(nobody, port);
	id = resolved_id(cm, &void_to);
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	connect_with(id, NULL, 0);
	event = expect_event_within(cm, RDMA_CM_EVENT_UNREACHABLE, UNREACHABLE_WAIT_MS);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	CHECK_EQ(event->status, -ETIMEDOUT);
	CHECK(rdma_ack_cm_event(event) == 0);
	CHECK(rdma_destroy_id(id) == 0);
	long elapsed_ms = (t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000;
	CHECK(elapsed_ms >= 5000 && elapsed_ms <= 15000);

	/* The server's last request: it must still be serving after all that. */
	id = resolved_id(cm, &to);
	connect_with(id, NULL, 0);
	event = expect_event(cm, RDMA_CM_EVENT_REJECTED);
	CHECK(rdma_ack_cm_event(event) == 0);
	CHECK(rdma_destroy_id(id) == 0);
	rdma_destroy_event_channel(cm);

	int status;
	CHECK(waitpid(pid, &status, 0) == pid);
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	printf("udaddy_test: SIDR accept, reject, closed port, unreachable: ok\n");
	return 0;
}

int main(void)
{
	const char *transport = getenv("PEERCM_TRANSPORT");
	if (transport && strcmp(transport, "roce") == 0)
		return run_roce();
	/* iWARP: no datagram service, so no UDP port space. */
	struct rdma_cm_id *id;
	errno = 0;
	CHECK(rdma_create_id(NULL, &id, NULL, RDMA_PS_UDP) == -1);
	CHECK_EQ(errno, EPROTONOSUPPORT);
	printf("udaddy_test: RDMA_PS_UDP refused over iWARP: ok\n");
	return 0;
}
