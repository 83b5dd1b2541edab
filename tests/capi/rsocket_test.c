/* rsockets as riostream, rstream, rcopy and udpong use them: a stream both ways (3 MiB in one
 * blocking rsend, read with rpoll), then riomap on both sides and riowrite ping-pong where the receiver makes
 * no call at all and spins on the last byte of its mapped buffer, as riostream does. The
 * client connects non-blocking (rpoll for POLLOUT). Wrong calls get their errno, and a peer
 * that breaks the framing ends its connection (EOF) without harm to the other. Datagram
 * rsockets stay the kernel's UDP sockets. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <time.h>

#include <rdma/rsocket.h>

#include "capi_test.h"

enum { XFER = 64 * 1024, STREAM = 3 << 20, ROUNDS = 20 };

static uint8_t mapped[XFER];
static uint8_t source[XFER];
static uint8_t stream_buf[STREAM];

static double now_s(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* Spins on the mapped buffer's last byte with no call into the library, as riostream does
 * (with an acquire load: the agent stores that byte last, with release). */
static void spin_for(uint8_t marker)
{
	double deadline = now_s() + TEST_TIMEOUT_MS / 1000.0;

	while (__atomic_load_n(&mapped[XFER - 1], __ATOMIC_ACQUIRE) != marker)
		CHECK(now_s() < deadline);
}

static void send_all(int rs, const uint8_t *buf, size_t len)
{
	size_t done = 0;

	while (done < len) {
		ssize_t n = rsend(rs, buf + done, len - done, 0);

		CHECK(n > 0);
		done += (size_t)n;
	}
}

static void recv_all(int rs, uint8_t *buf, size_t len)
{
	size_t done = 0;

	while (done < len) {
		struct pollfd pfd = { .fd = rs, .events = POLLIN };
		ssize_t n;

		CHECK_EQ(rpoll(&pfd, 1, TEST_TIMEOUT_MS), 1);
		n = rrecv(rs, buf + done, len - done, 0);
		CHECK(n > 0);
		done += (size_t)n;
	}
}

static void write_all_remote(int rs, const uint8_t *buf, size_t len, off_t offset)
{
	size_t done = 0;

	while (done < len) {
		size_t n = riowrite(rs, buf + done, len - done, offset + (off_t)done, 0);

		CHECK(n != (size_t)-1 && n > 0);
		done += n;
	}
}

/* Round r: XFER bytes of pattern r whose last byte is the round's marker. */
static void fill_round(uint8_t *buf, int round)
{
	fill_pattern(buf, XFER - 1, (uint32_t)round);
	buf[XFER - 1] = (uint8_t)(round + 1);
}

static void expect_round(int round)
{
	spin_for((uint8_t)(round + 1));
	CHECK(check_pattern(mapped, XFER - 1, (uint32_t)round));
}

static void exchange_sync(int rs, int first)
{
	uint8_t sync[16] = { 0 };

	if (first) {
		send_all(rs, sync, sizeof sync);
		recv_all(rs, sync, sizeof sync);
	} else {
		recv_all(rs, sync, sizeof sync);
		send_all(rs, sync, sizeof sync);
	}
}

static int server(int port_fd)
{
	struct sockaddr_in addr = loopback(0);
	socklen_t len = sizeof addr;
	int listener, rs, broken;
	uint16_t port;
	off_t offset;
	uint8_t byte;

	CHECK((listener = rsocket(AF_INET, SOCK_STREAM, 0)) >= 0);
	CHECK(rbind(listener, (struct sockaddr *)&addr, sizeof addr) == 0);
	CHECK(rlisten(listener, 4) == 0);
	CHECK(rgetsockname(listener, (struct sockaddr *)&addr, &len) == 0);
	port = ntohs(addr.sin_port);
	CHECK(write(port_fd, &port, sizeof port) == (ssize_t)sizeof port);
	close(port_fd);
	CHECK((rs = raccept(listener, NULL, NULL)) >= 0);

	/* A stream of 1 MiB each way through the framing. */
	recv_all(rs, stream_buf, STREAM);
	CHECK(check_pattern(stream_buf, STREAM, 99));
	send_all(rs, stream_buf, STREAM);

	CHECK((offset = riomap(rs, mapped, XFER, PROT_WRITE, 0, -1)) == 0);
	exchange_sync(rs, 0);
	for (int round = 0; round < ROUNDS; round += 2) {
		expect_round(round);
		fill_round(source, round + 1);
		write_all_remote(rs, source, XFER, 0);
	}
	exchange_sync(rs, 0);
	CHECK(riounmap(rs, mapped, XFER) == 0);
	CHECK_EQ(rrecv(rs, &byte, 1, 0), 0); /* the client closed */
	CHECK(rclose(rs) == 0);

	/* A peer that breaks the framing: its connection ends, nothing else. */
	CHECK((broken = raccept(listener, NULL, NULL)) >= 0);
	CHECK_EQ(rrecv(broken, &byte, 1, 0), 0);
	CHECK(rclose(broken) == 0);
	CHECK(rclose(listener) == 0);
	return 0;
}

int main(void)
{
	uint16_t port;
	pid_t peer;
	struct sockaddr_in addr;
	int rs, raw;
	off_t offset;

	/* spawn_peer() takes the port from the pipe the server writes to. */
	peer = spawn_peer(server, &port);
	addr = loopback(port);
	CHECK((rs = rsocket(AF_INET, SOCK_STREAM, 0)) >= 0);

	/* Wrong calls before the connection: nothing to map on or write to. */
	CHECK(riomap(rs, mapped, XFER, PROT_WRITE, 0, -1) == -1 && errno == ENOTCONN);

	/* Non-blocking connect, as riostream's async mode does it. */
	CHECK(rfcntl(rs, F_SETFL, O_NONBLOCK) == 0);
	if (rconnect(rs, (struct sockaddr *)&addr, sizeof addr) != 0) {
		struct pollfd pfd = { .fd = rs, .events = POLLOUT };
		int error = 0;
		socklen_t len = sizeof error;

		CHECK_EQ(errno, EINPROGRESS);
		CHECK_EQ(rpoll(&pfd, 1, TEST_TIMEOUT_MS), 1);
		CHECK(rgetsockopt(rs, SOL_SOCKET, SO_ERROR, &error, &len) == 0);
		CHECK_EQ(error, 0);
	}
	CHECK(rfcntl(rs, F_SETFL, 0) == 0);

	fill_pattern(stream_buf, STREAM, 99);
	/* A blocking rsend sends it all, as a blocking stream socket does (rcopy relies on it). */
	CHECK_EQ(rsend(rs, stream_buf, STREAM, 0), STREAM);
	memset(stream_buf, 0, STREAM);
	recv_all(rs, stream_buf, STREAM);
	CHECK(check_pattern(stream_buf, STREAM, 99));

	CHECK(riomap(rs, mapped, XFER, PROT_READ, 0, -1) == -1 && errno == EINVAL);
	CHECK((offset = riomap(rs, mapped, XFER, PROT_WRITE, 0, 0)) == 0);
	exchange_sync(rs, 1); /* after it the server's mapping is known here */
	CHECK(riowrite(rs, source, 16, XFER, 0) == (size_t)-1 && errno == EINVAL);
	for (int round = 0; round < ROUNDS; round += 2) {
		fill_round(source, round);
		write_all_remote(rs, source, XFER, 0);
		expect_round(round + 1);
	}
	exchange_sync(rs, 1);
	CHECK(riounmap(rs, mapped, XFER) == 0);
	CHECK(riounmap(rs, mapped, XFER) == -1 && errno == EINVAL);
	CHECK(rclose(rs) == 0);

	/* A raw TCP peer sends a frame of an unknown type. */
	{
		uint8_t garbage[16] = { 0x7f, 0, 0, 0, 0, 0, 0, 8 };

		CHECK((raw = socket(AF_INET, SOCK_STREAM, 0)) >= 0);
		CHECK(connect(raw, (struct sockaddr *)&addr, sizeof addr) == 0);
		CHECK(send(raw, garbage, sizeof garbage, 0) == (ssize_t)sizeof garbage);
		close(raw);
	}
	CHECK_EQ(join_peer(peer), 0);

	/* Datagram rsockets are the kernel's UDP sockets (udpong). */
	{
		struct sockaddr_in self = loopback(0), from;
		socklen_t len = sizeof self, from_len = sizeof from;
		int ds;
		char got[8];

		CHECK((ds = rsocket(AF_INET, SOCK_DGRAM, 0)) >= 0);
		CHECK(rbind(ds, (struct sockaddr *)&self, sizeof self) == 0);
		CHECK(rgetsockname(ds, (struct sockaddr *)&self, &len) == 0);
		CHECK_EQ(rsendto(ds, "ping", 4, 0, (struct sockaddr *)&self, sizeof self), 4);
		CHECK_EQ(rrecvfrom(ds, got, sizeof got, 0, (struct sockaddr *)&from, &from_len), 4);
		CHECK(memcmp(got, "ping", 4) == 0);
		CHECK(rconnect(ds, (struct sockaddr *)&self, sizeof self) == 0);
		CHECK_EQ(rsend(ds, "pong", 4, 0), 4);
		CHECK_EQ(rrecv(ds, got, sizeof got, 0), 4);
		CHECK(rclose(ds) == 0);
	}
	printf("rsockets: 3 MiB streamed both ways, %d riowrite rounds into spinning peers, datagrams\n", ROUNDS);
	return 0;
}
