/* Helpers of the C API tests: checks that end the process with a message, event and
 * completion waits with a deadline, and a fork()ed peer process that tells its port. */
#ifndef PEERCM_CAPI_TEST_H
#define PEERCM_CAPI_TEST_H

#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>

#define CHECK(cond)                                                                             \
	do {                                                                                    \
		if (!(cond)) {                                                                  \
			fprintf(stderr, "%s:%d: check failed: %s (errno %d: %s)\n", __FILE__, \
				__LINE__, #cond, errno, strerror(errno));                       \
			exit(1);                                                                \
		}                                                                               \
	} while (0)

#define CHECK_EQ(a, b)                                                                          \
	do {                                                                                    \
		long long a_ = (long long)(a), b_ = (long long)(b);                             \
		if (a_ != b_) {                                                                 \
			fprintf(stderr, "%s:%d: %s == %lld, expected %s == %lld\n", __FILE__,   \
				__LINE__, #a, a_, #b, b_);                                      \
			exit(1);                                                                \
		}                                                                               \
	} while (0)

enum { TEST_TIMEOUT_MS = 10000 };

/* The next CM event of `channel`, which must be `type` and come within the timeout. */
static inline struct rdma_cm_event *expect_event(struct rdma_event_channel *channel, enum rdma_cm_event_type type)
{
	struct pollfd pfd = { .fd = channel->fd, .events = POLLIN };
	struct rdma_cm_event *event;

	if (poll(&pfd, 1, TEST_TIMEOUT_MS) != 1) {
		fprintf(stderr, "no CM event within %d ms, wanted %s\n", TEST_TIMEOUT_MS, rdma_event_str(type));
		exit(1);
	}
	CHECK(rdma_get_cm_event(channel, &event) == 0);
	if (event->event != type) {
		fprintf(stderr, "got %s (status %d), wanted %s\n", rdma_event_str(event->event), event->status,
			rdma_event_str(type));
		exit(1);
	}
	return event;
}

/* One completion from `cq`, sleeping on its completion channel between polls. */
static inline struct ibv_wc wait_wc(struct ibv_cq *cq, struct ibv_comp_channel *channel)
{
	struct ibv_wc wc;
	struct ibv_cq *event_cq;
	void *event_context;
	struct pollfd pfd = { .fd = channel->fd, .events = POLLIN };

	for (;;) {
		int n = ibv_poll_cq(cq, 1, &wc);
		CHECK(n >= 0);
		if (n == 1)
			return wc;
		CHECK(ibv_req_notify_cq(cq, 0) == 0);
		n = ibv_poll_cq(cq, 1, &wc);
		CHECK(n >= 0);
		if (n == 1)
			return wc;
		if (poll(&pfd, 1, TEST_TIMEOUT_MS) != 1) {
			fprintf(stderr, "no completion within %d ms\n", TEST_TIMEOUT_MS);
			exit(1);
		}
		CHECK(ibv_get_cq_event(channel, &event_cq, &event_context) == 0);
		CHECK(event_cq == cq);
		CHECK(event_context == cq->cq_context);
		ibv_ack_cq_events(cq, 1);
	}
}

static inline struct sockaddr_in loopback(uint16_t port)
{
	struct sockaddr_in a;

	memset(&a, 0, sizeof a);
	a.sin_family = AF_INET;
	a.sin_port = htons(port);
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	return a;
}

static inline uint8_t pattern(uint32_t seed, size_t i)
{
	uint32_t x = (uint32_t)i * 2654435761u + seed * 40503u;

	x ^= x >> 13;
	return (uint8_t)(x ^ (x >> 7));
}

static inline void fill_pattern(uint8_t *buf, size_t len, uint32_t seed)
{
	for (size_t i = 0; i < len; i++)
		buf[i] = pattern(seed, i);
}

static inline int check_pattern(const uint8_t *buf, size_t len, uint32_t seed)
{
	for (size_t i = 0; i < len; i++)
		if (buf[i] != pattern(seed, i))
			return 0;
	return 1;
}

/* A PD, a completion channel and a CQ (`cq_context`, 8 entries) on `id`'s device, and an RC
 * QP of `wrs` send and receive WRs of one SGE on them; destroy_qp_and_verbs() undoes it. */
static inline void create_rc_qp(struct rdma_cm_id *id, void *cq_context, uint32_t wrs, int sq_sig_all,
				struct ibv_pd **pd, struct ibv_comp_channel **channel, struct ibv_cq **cq)
{
	struct ibv_qp_init_attr attr;

	CHECK((*pd = ibv_alloc_pd(id->verbs)) != NULL);
	CHECK((*channel = ibv_create_comp_channel(id->verbs)) != NULL);
	CHECK((*cq = ibv_create_cq(id->verbs, 8, cq_context, *channel, 0)) != NULL);
	memset(&attr, 0, sizeof attr);
	attr.cap.max_send_wr = attr.cap.max_recv_wr = wrs;
	attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
	attr.send_cq = attr.recv_cq = *cq;
	attr.qp_type = IBV_QPT_RC;
	attr.sq_sig_all = sq_sig_all;
	CHECK(rdma_create_qp(id, *pd, &attr) == 0);
}

/* The QP of `id` and the verbs objects it was made with, in the order verbs frees them
 * (`mr` may be NULL). */
static inline void destroy_qp_and_verbs(struct rdma_cm_id *id, struct ibv_mr *mr, struct ibv_cq *cq,
					struct ibv_comp_channel *channel, struct ibv_pd *pd)
{
	if (mr)
		CHECK(ibv_dereg_mr(mr) == 0);
	rdma_destroy_qp(id);
	CHECK(ibv_destroy_cq(cq) == 0);
	CHECK(ibv_destroy_comp_channel(channel) == 0);
	CHECK(ibv_dealloc_pd(pd) == 0);
}

/* A peer process: runs `body(port_pipe_write_end)`, which writes its listening port (uint16_t)
 * to the fd once it listens. Returns the child's pid; *port gets the port. */
static inline pid_t spawn_peer(int (*body)(int port_fd), uint16_t *port)
{
	int fds[2];
	pid_t pid;

	CHECK(pipe(fds) == 0);
	fflush(NULL);
	pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		close(fds[0]);
		exit(body(fds[1]));
	}
	close(fds[1]);
	CHECK(read(fds[0], port, sizeof *port) == (ssize_t)sizeof *port);
	close(fds[0]);
	return pid;
}

/* The out-of-band exchange of the verbs-only tests (as ibv_*_pingpong do over TCP): what each
 * side tells the other of its QP and memory, and whole writes and reads on the pipes. */
struct peer_info {
	union ibv_gid gid;
	uint32_t qpn;
	uint32_t psn;
	uint64_t addr;
	uint32_t rkey;
};

static inline void write_all(int fd, const void *data, size_t n)
{
	CHECK(write(fd, data, n) == (ssize_t)n);
}

static inline void read_all(int fd, void *data, size_t n)
{
	size_t got = 0;

	while (got < n) {
		ssize_t r = read(fd, (char *)data + got, n - got);

		CHECK(r > 0);
		got += (size_t)r;
	}
}

/* Two processes joined by a pipe each way, as verbs programs exchange GIDs and QP numbers
 * out of band: `child(to_parent, from_parent)` runs in a forked process, `parent(to_child,
 * from_child)` here, each under a 60 s alarm. Returns the child's exit status (0 on success). */
static inline int run_pair(int (*child)(int, int), void (*parent)(int, int))
{
	int down[2], up[2], status = 0;
	pid_t pid;

	CHECK(pipe(down) == 0 && pipe(up) == 0);
	fflush(NULL);
	pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		alarm(60);
		close(down[1]);
		close(up[0]);
		_exit(child(up[1], down[0]));
	}
	close(down[0]);
	close(up[1]);
	alarm(60);
	parent(down[1], up[0]);
	CHECK(waitpid(pid, &status, 0) == pid);
	return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static inline void tell_port(int port_fd, struct rdma_cm_id *listener)
{
	uint16_t port = ntohs(rdma_get_src_port(listener));

	CHECK(port != 0);
	CHECK(write(port_fd, &port, sizeof port) == (ssize_t)sizeof port);
	close(port_fd);
}

/* The client's next request may reach the server before the server's ESTABLISHED or
 * DISCONNECTED of the connection before it: the client hears its own at once, and its next
 * REQ, from another address, may overtake its RTU or DREQ (events of two connections have no
 * order between them). Such a request waits here. */
static struct rdma_cm_event *early_request __attribute__((unused));

static inline struct rdma_cm_event *server_event(struct rdma_event_channel *cm, enum rdma_cm_event_type type)
{
	struct rdma_cm_event *event;

	if (type == RDMA_CM_EVENT_CONNECT_REQUEST && early_request) {
		event = early_request;
		early_request = NULL;
		return event;
	}
	if ((type == RDMA_CM_EVENT_ESTABLISHED || type == RDMA_CM_EVENT_DISCONNECTED) && !early_request) {
		struct pollfd pfd = { .fd = cm->fd, .events = POLLIN };

		CHECK(poll(&pfd, 1, TEST_TIMEOUT_MS) == 1);
		CHECK(rdma_get_cm_event(cm, &event) == 0);
		if (event->event == type)
			return event;
		if (event->event != RDMA_CM_EVENT_CONNECT_REQUEST) {
			fprintf(stderr, "got %s, wanted %s\n", rdma_event_str(event->event), rdma_event_str(type));
			exit(1);
		}
		early_request = event;
	}
	return expect_event(cm, type);
}

/* A listener on `address` (its port told through `port_fd`) and the id of the first
 * CONNECT_REQUEST it takes. */
static inline struct rdma_cm_id *take_one_request(struct rdma_event_channel *cm, const struct sockaddr_in *address,
						  int port_fd, struct rdma_cm_id **listener)
{
	struct rdma_cm_event *event;
	struct rdma_cm_id *id;

	CHECK(rdma_create_id(cm, listener, NULL, RDMA_PS_TCP) == 0);
	CHECK(rdma_bind_addr(*listener, (struct sockaddr *)address) == 0);
	CHECK(rdma_listen(*listener, 4) == 0);
	tell_port(port_fd, *listener);
	event = expect_event(cm, RDMA_CM_EVENT_CONNECT_REQUEST);
	id = event->id;
	CHECK(rdma_ack_cm_event(event) == 0);
	return id;
}

/* A new id of `cm` with its address and route resolved towards `address`. */
static inline struct rdma_cm_id *resolve_towards(struct rdma_event_channel *cm, const struct sockaddr_in *address)
{
	struct rdma_cm_id *id;

	CHECK(rdma_create_id(cm, &id, NULL, RDMA_PS_TCP) == 0);
	CHECK(rdma_resolve_addr(id, NULL, (struct sockaddr *)address, 2000) == 0);
	CHECK(rdma_ack_cm_event(expect_event(cm, RDMA_CM_EVENT_ADDR_RESOLVED)) == 0);
	CHECK(rdma_resolve_route(id, 2000) == 0);
	CHECK(rdma_ack_cm_event(expect_event(cm, RDMA_CM_EVENT_ROUTE_RESOLVED)) == 0);
	return id;
}

/* The peer process's exit status: 0 when it passed. */
static inline int join_peer(pid_t pid)
{
	int status = 0;

	CHECK(waitpid(pid, &status, 0) == pid);
	return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

#endif /* PEERCM_CAPI_TEST_H */
