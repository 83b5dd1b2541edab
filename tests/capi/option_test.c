/* rdma_set_option: the rdma_cm options with their sizes (EINVAL for a wrong length, ENOSYS
 * for unknown levels and names), and RDMA_OPTION_ID_PEER_TO_PEER / RDMA_OPTION_ID_P2P_TAG:
 * - by default an id connects client/server, so a process may open two connections to one
 *   server (what classic rdma_cm programs do), whether it listens itself or not;
 * - with the option on, a second connect to the same peer and tag fails with EISCONN (one
 *   connection per p2p key), another tag gets its own connection, the option off lifts it. */
#define _GNU_SOURCE
#include "capi_test.h"

enum { CONNECTIONS = 7 };

static void expect_option_errors(void)
{
	struct rdma_cm_id *id;
	uint8_t u8 = 0;
	int on = 1, two = 2;
	uint32_t tag = 9;
	uint64_t wide = 1;

	CHECK(rdma_create_id(NULL, &id, NULL, RDMA_PS_TCP) == 0);
	CHECK(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &u8, sizeof u8) == 0);
	CHECK(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &u8, sizeof u8) == 0);
	CHECK(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR, &on, sizeof on) == 0);
	CHECK(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_AFONLY, &on, sizeof on) == 0);
	CHECK(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_PEER_TO_PEER, &on, sizeof on) == 0);
	CHECK(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_P2P_TAG, &tag, sizeof tag) == 0);

	struct {
		int level, name;
		void *value;
		size_t len;
		int error;
	} bad[] = {
		{ RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &on, sizeof on, EINVAL },
		{ RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &wide, sizeof wide, EINVAL },
		{ RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR, &u8, sizeof u8, EINVAL },
		{ RDMA_OPTION_ID, RDMA_OPTION_ID_AFONLY, &wide, sizeof wide, EINVAL },
		{ RDMA_OPTION_ID, RDMA_OPTION_ID_PEER_TO_PEER, &u8, sizeof u8, EINVAL },
		{ RDMA_OPTION_ID, RDMA_OPTION_ID_PEER_TO_PEER, &two, sizeof two, EINVAL },
		{ RDMA_OPTION_ID, RDMA_OPTION_ID_P2P_TAG, &wide, sizeof wide, EINVAL },
		{ RDMA_OPTION_ID, 77, &on, sizeof on, ENOSYS },
		{ RDMA_OPTION_IB, RDMA_OPTION_IB_PATH, &wide, sizeof wide, ENOSYS },
		{ RDMA_OPTION_IB, 99, &on, sizeof on, ENOSYS },
		{ 42, RDMA_OPTION_ID_TOS, &u8, sizeof u8, ENOSYS },
	};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		errno = 0;
		if (rdma_set_option(id, bad[i].level, bad[i].name, bad[i].value, bad[i].len) != -1 ||
		    errno != bad[i].error) {
			fprintf(stderr, "option %zu (level %d name %d len %zu): errno %d, expected %d\n", i,
				bad[i].level, bad[i].name, bad[i].len, errno, bad[i].error);
			exit(1);
		}
	}
	CHECK(rdma_destroy_id(id) == 0);
}

/* Accepts every request, then waits for each connection to end. */
static int server(int port_fd)
{
	struct rdma_event_channel *channel;
	struct rdma_cm_id *listener, *children[CONNECTIONS];
	struct rdma_cm_event *event;
	struct sockaddr_in addr = loopback(0);
	struct ibv_qp_init_attr attr;
	int requests = 0, ended = 0;

	CHECK((channel = rdma_create_event_channel()) != NULL);
	CHECK(rdma_create_id(channel, &listener, NULL, RDMA_PS_TCP) == 0);
	CHECK(rdma_bind_addr(listener, (struct sockaddr *)&addr) == 0);
	CHECK(rdma_listen(listener, 0) == 0);
	tell_port(port_fd, listener);
	while (ended < CONNECTIONS) {
		struct pollfd pfd = { .fd = channel->fd, .events = POLLIN };

		CHECK_EQ(poll(&pfd, 1, TEST_TIMEOUT_MS), 1);
		CHECK(rdma_get_cm_event(channel, &event) == 0);
		switch (event->event) {
		case RDMA_CM_EVENT_CONNECT_REQUEST:
			CHECK(requests < CONNECTIONS);
			children[requests++] = event->id;
			memset(&attr, 0, sizeof attr);
			attr.cap.max_send_wr = attr.cap.max_recv_wr = 2;
			attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
			CHECK(rdma_create_qp(event->id, NULL, &attr) == 0);
			CHECK(rdma_accept(event->id, NULL) == 0);
			break;
		case RDMA_CM_EVENT_DISCONNECTED:
			ended++;
			break;
		case RDMA_CM_EVENT_ESTABLISHED:
		case RDMA_CM_EVENT_TIMEWAIT_EXIT:
			break;
		default:
			fprintf(stderr, "server: unexpected %s\n", rdma_event_str(event->event));
			exit(1);
		}
		CHECK(rdma_ack_cm_event(event) == 0);
	}
	for (int i = 0; i < requests; i++) {
		rdma_destroy_qp(children[i]);
		CHECK(rdma_destroy_id(children[i]) == 0);
	}
	CHECK(rdma_destroy_id(listener) == 0);
	rdma_destroy_event_channel(channel);
	return 0;
}

/* A synchronous id up to rdma_connect(); p2p -1 leaves the option at its default. */
static struct rdma_cm_id *client_id(uint16_t port, int p2p, uint32_t tag, int *connect_errno)
{
	struct sockaddr_in addr = loopback(port);
	struct ibv_qp_init_attr attr;
	struct rdma_cm_id *id;

	CHECK(rdma_create_id(NULL, &id, NULL, RDMA_PS_TCP) == 0);
	if (p2p >= 0)
		CHECK(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_PEER_TO_PEER, &p2p, sizeof p2p) == 0);
	CHECK(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_P2P_TAG, &tag, sizeof tag) == 0);
	CHECK(rdma_resolve_addr(id, NULL, (struct sockaddr *)&addr, 2000) == 0);
	CHECK(rdma_resolve_route(id, 2000) == 0);
	memset(&attr, 0, sizeof attr);
	attr.cap.max_send_wr = attr.cap.max_recv_wr = 2;
	attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
	CHECK(rdma_create_qp(id, NULL, &attr) == 0);
	errno = 0;
	*connect_errno = rdma_connect(id, NULL) == 0 ? 0 : errno;
	return id;
}

int main(void)
{
	uint16_t port;
	pid_t peer;
	struct rdma_cm_id *ids[8];
	int error[8];
	struct rdma_cm_id *listener;
	struct sockaddr_in any = loopback(0);

	expect_option_errors();
	peer = spawn_peer(server, &port);

	/* Default, on a node without a listener: plain client/server, two connections. */
	ids[0] = client_id(port, -1, 0, &error[0]);
	ids[1] = client_id(port, -1, 0, &error[1]);
	CHECK_EQ(error[0], 0);
	CHECK_EQ(error[1], 0);
	/* Peer-to-peer on: one connection per (peer, tag). */
	ids[2] = client_id(port, 1, 0, &error[2]);
	ids[3] = client_id(port, 1, 0, &error[3]);
	ids[4] = client_id(port, 1, 7, &error[4]);
	CHECK_EQ(error[2], 0);
	CHECK_EQ(error[3], EISCONN);
	CHECK_EQ(error[4], 0);
	/* Off: client/server again, whatever the tags. */
	ids[5] = client_id(port, 0, 0, &error[5]);
	CHECK_EQ(error[5], 0);
	/* Default on a node that listens too: still client/server (libfabric's ofi_rxm and MPI
	 * listen and connect, and settle simultaneous connects themselves). */
	CHECK(rdma_create_id(NULL, &listener, NULL, RDMA_PS_TCP) == 0);
	CHECK(rdma_bind_addr(listener, (struct sockaddr *)&any) == 0);
	CHECK(rdma_listen(listener, 4) == 0);
	ids[6] = client_id(port, -1, 0, &error[6]);
	ids[7] = client_id(port, -1, 0, &error[7]);
	CHECK_EQ(error[6], 0);
	CHECK_EQ(error[7], 0);

	for (int i = 0; i < 8; i++) {
		if (error[i] == 0)
			CHECK(rdma_disconnect(ids[i]) == 0);
		rdma_destroy_ep(ids[i]);
	}
	rdma_destroy_id(listener);
	CHECK_EQ(join_peer(peer), 0);
	printf("options: errors as rdma_cm; peer-to-peer default and option verified\n");
	return 0;
}
