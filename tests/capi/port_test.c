/* rdma_bind_addr takes the port, as the kernel's rdma_cm does: a second id binding it fails
 * at once with EADDRINUSE (not at rdma_listen), in this process or against a listener of
 * another, until the holder is destroyed; port 0 takes a free port that rdma_get_src_port
 * reads straight after the bind. rdma_get_src_port / rdma_get_dst_port are right from
 * ADDR_RESOLVED on for the active side (an unbound id is bound at resolution) and from
 * CONNECT_REQUEST on for the passive side, and stay so once connected: the client's source
 * port is the server's peer port. Over RoCE (PEERCM_TRANSPORT=roce) the port is the service
 * port of the node's address (each process takes a random 127/8 address of its own). */
#define _GNU_SOURCE
#include <time.h>

#include "capi_test.h"

static int roce;

static struct sockaddr_in own_address(uint16_t port)
{
	struct sockaddr_in a = loopback(port);

	if (roce)
		a.sin_addr.s_addr = htonl((127u << 24) | ((unsigned)(rand() % 254 + 1) << 16) |
					  ((unsigned)(rand() % 256) << 8) | (unsigned)(rand() % 254 + 1));
	return a;
}

static struct rdma_cm_id *new_id(struct rdma_event_channel *cm)
{
	struct rdma_cm_id *id;

	CHECK(rdma_create_id(cm, &id, NULL, RDMA_PS_TCP) == 0);
	return id;
}

static void expect_bind_fails(struct rdma_event_channel *cm, struct sockaddr_in address, int error)
{
	struct rdma_cm_id *id = new_id(cm);

	errno = 0;
	CHECK_EQ(rdma_bind_addr(id, (struct sockaddr *)&address), -1);
	CHECK_EQ(errno, error);
	CHECK(rdma_destroy_id(id) == 0);
}

/* Conflicts inside one process. Returns nothing; each step checks itself. */
static void bind_conflicts(void)
{
	struct rdma_event_channel *cm;
	struct rdma_cm_id *first, *again;
	struct sockaddr_in address = own_address(0), any = loopback(0);
	uint16_t port;

	CHECK((cm = rdma_create_event_channel()) != NULL);
	first = new_id(cm);
	CHECK(rdma_bind_addr(first, (struct sockaddr *)&address) == 0);
	port = ntohs(rdma_get_src_port(first));
	CHECK(port != 0); /* port 0: a free one, taken at bind */
	CHECK(first->route.addr.src_sin.sin_addr.s_addr == address.sin_addr.s_addr);
	address.sin_port = htons(port);
	/* Bound, not listening: the port is taken already. */
	expect_bind_fails(cm, address, EADDRINUSE);
	any.sin_addr.s_addr = htonl(INADDR_ANY);
	any.sin_port = htons(port);
	expect_bind_fails(cm, any, EADDRINUSE);
	/* Listening on the port it reserved. */
	CHECK(rdma_listen(first, 4) == 0);
	CHECK_EQ(ntohs(rdma_get_src_port(first)), port);
	expect_bind_fails(cm, address, EADDRINUSE);
	expect_bind_fails(cm, any, EADDRINUSE);
	/* Free again once its holder is gone. */
	CHECK(rdma_destroy_id(first) == 0);
	again = new_id(cm);
	CHECK(rdma_bind_addr(again, (struct sockaddr *)&address) == 0);
	CHECK_EQ(ntohs(rdma_get_src_port(again)), port);
	CHECK(rdma_listen(again, 4) == 0);
	CHECK(rdma_destroy_id(again) == 0);
	rdma_destroy_event_channel(cm);
}

static struct sockaddr_in server_address;

/* Two requests: each carries the client's source port, which must be the child's dst port
 * from CONNECT_REQUEST on, with the listener's port as its src port. */
static int server(int port_fd)
{
	struct rdma_event_channel *cm;
	struct rdma_cm_id *listener;
	struct rdma_cm_event *event;
	uint16_t port;

	CHECK((cm = rdma_create_event_channel()) != NULL);
	listener = new_id(cm);
	CHECK(rdma_bind_addr(listener, (struct sockaddr *)&server_address) == 0);
	CHECK(rdma_listen(listener, 4) == 0);
	port = ntohs(rdma_get_src_port(listener));
	tell_port(port_fd, listener);
	for (int i = 0; i < 2; i++) {
		struct rdma_cm_id *id;
		struct ibv_qp_init_attr attr;
		uint16_t client_port;

		event = server_event(cm, RDMA_CM_EVENT_CONNECT_REQUEST);
		id = event->id;
		CHECK(event->param.conn.private_data_len >= sizeof client_port);
		memcpy(&client_port, event->param.conn.private_data, sizeof client_port);
		CHECK(rdma_ack_cm_event(event) == 0);
		CHECK_EQ(ntohs(rdma_get_src_port(id)), port);
		CHECK_EQ(rdma_get_dst_port(id), client_port);
		memset(&attr, 0, sizeof attr);
		attr.cap.max_send_wr = attr.cap.max_recv_wr = 1;
		attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
		CHECK(rdma_create_qp(id, NULL, &attr) == 0);
		CHECK(rdma_accept(id, NULL) == 0);
		CHECK(rdma_ack_cm_event(server_event(cm, RDMA_CM_EVENT_ESTABLISHED)) == 0);
		CHECK_EQ(ntohs(rdma_get_src_port(id)), port);
		CHECK_EQ(rdma_get_dst_port(id), client_port);
		if (i == 1) {
			/* A server restarted on its port binds it again while a connection its old
			 * listener accepted still runs on it (over iWARP, a TCP socket on the port). */
			struct sockaddr_in same = server_address;

			same.sin_port = htons(port);
			CHECK(rdma_destroy_id(listener) == 0);
			listener = new_id(cm);
			CHECK(rdma_bind_addr(listener, (struct sockaddr *)&same) == 0);
			CHECK(rdma_listen(listener, 4) == 0);
			CHECK_EQ(ntohs(rdma_get_src_port(listener)), port);
		}
		CHECK(rdma_ack_cm_event(server_event(cm, RDMA_CM_EVENT_DISCONNECTED)) == 0);
		rdma_destroy_qp(id);
		CHECK(rdma_destroy_id(id) == 0);
	}
	CHECK(early_request == NULL);
	CHECK(rdma_destroy_id(listener) == 0);
	rdma_destroy_event_channel(cm);
	return 0;
}

/* One connection; `bind_first`: bound to (own address, 0) before resolving, else bound by the
 * resolution. */
static void client_connection(struct rdma_event_channel *cm, int bind_first)
{
	struct rdma_cm_id *id = new_id(cm);
	struct rdma_conn_param param;
	struct ibv_qp_init_attr attr;
	uint16_t port = 0;
	__be16 src;

	if (bind_first) {
		struct sockaddr_in address = own_address(0);

		CHECK(rdma_bind_addr(id, (struct sockaddr *)&address) == 0);
		port = ntohs(rdma_get_src_port(id));
		CHECK(port != 0);
	}
	CHECK(rdma_resolve_addr(id, NULL, (struct sockaddr *)&server_address, 2000) == 0);
	CHECK(rdma_ack_cm_event(expect_event(cm, RDMA_CM_EVENT_ADDR_RESOLVED)) == 0);
	src = rdma_get_src_port(id);
	CHECK(src != 0);
	if (bind_first)
		CHECK_EQ(ntohs(src), port);
	CHECK(id->route.addr.src_sin.sin_family == AF_INET);
	CHECK(id->route.addr.src_sin.sin_addr.s_addr != htonl(INADDR_ANY));
	CHECK_EQ(rdma_get_dst_port(id), server_address.sin_port);
	CHECK(rdma_resolve_route(id, 2000) == 0);
	CHECK(rdma_ack_cm_event(expect_event(cm, RDMA_CM_EVENT_ROUTE_RESOLVED)) == 0);
	CHECK_EQ(rdma_get_src_port(id), src);
	memset(&attr, 0, sizeof attr);
	attr.cap.max_send_wr = attr.cap.max_recv_wr = 1;
	attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
	CHECK(rdma_create_qp(id, NULL, &attr) == 0);
	memset(&param, 0, sizeof param);
	param.private_data = &src;
	param.private_data_len = sizeof src;
	param.responder_resources = param.initiator_depth = 1;
	CHECK(rdma_connect(id, &param) == 0);
	CHECK(rdma_ack_cm_event(expect_event(cm, RDMA_CM_EVENT_ESTABLISHED)) == 0);
	CHECK_EQ(rdma_get_src_port(id), src);
	CHECK_EQ(rdma_get_dst_port(id), server_address.sin_port);
	CHECK(rdma_disconnect(id) == 0);
	CHECK(rdma_ack_cm_event(expect_event(cm, RDMA_CM_EVENT_DISCONNECTED)) == 0);
	rdma_destroy_qp(id);
	CHECK(rdma_destroy_id(id) == 0);
}

int main(void)
{
	const char *transport = getenv("PEERCM_TRANSPORT");
	struct rdma_event_channel *cm;
	uint16_t port;
	pid_t peer;

	roce = transport && strcmp(transport, "roce") == 0;
	srand((unsigned)time(NULL) ^ (unsigned)getpid());
	server_address = own_address(0);
	peer = spawn_peer(server, &port);
	server_address.sin_port = htons(port);

	bind_conflicts();
	/* Another process listens there: the port is not ours to bind (over RoCE the whole
	 * address is the other node's). */
	CHECK((cm = rdma_create_event_channel()) != NULL);
	expect_bind_fails(cm, server_address, EADDRINUSE);
	client_connection(cm, 0);
	client_connection(cm, 1);
	rdma_destroy_event_channel(cm);
	CHECK_EQ(join_peer(peer), 0);
	printf("bind takes the port (EADDRINUSE at bind, in-process and against another process's "
	       "listener); source and destination ports right from resolution and request on\n");
	return 0;
}
