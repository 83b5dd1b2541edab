/* An all-to-all of verified messages, the MPI job of issue 32 (docs/drop-in.md).
 *
 * Every rank sends every other rank a series of messages straight after MPI_Init: no
 * barrier or warm-up exchange runs over the fabric first, so each connection is opened on
 * demand by the first message that needs it (the lazy connection setup of the BTLs and
 * MTLs this runs over). Each message's bytes follow a pattern of (source, destination,
 * sequence number, offset); the receiver checks every byte and its length. The sizes go
 * from a few bytes (eager sends) to 1 MiB (rendezvous: RDMA Read/Write on the RDMA paths).
 *
 *   mpi_alltoall [ROUNDS] [--corrupt]
 *     ROUNDS (default 3) passes over the size list; --corrupt makes rank 1 send one wrong
 *     byte to rank 0, to show that the check catches it (the run must then fail).
 *
 * Rank 0 prints one line: "mpi_alltoall: ranks=N messages=M bytes=B mismatches=X".
 * Exit status 0 when every message of every rank arrived intact, 1 otherwise.
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const int kSizes[] = {1, 8, 100, 4096, 12289, 65536, 262147, 1048576};
enum { kNumSizes = (int)(sizeof kSizes / sizeof kSizes[0]) };

/* The byte at `offset` of message `seq` from `src` to `dst`: a cheap mix that differs
 * between any two of those that a misrouted or stale buffer could be confused with. */
static unsigned char pattern_byte(int src, int dst, int seq, size_t offset) {
  uint32_t x = (uint32_t)src * 2654435761u ^ (uint32_t)dst * 40503u ^ (uint32_t)seq * 97u;
  x ^= (uint32_t)offset * 2246822519u;
  x ^= x >> 15;
  return (unsigned char)(x ^ (x >> 8));
}

static void fill(unsigned char *buf, int len, int src, int dst, int seq) {
  for (int i = 0; i < len; ++i) buf[i] = pattern_byte(src, dst, seq, (size_t)i);
}

/* Returns the number of wrong bytes (or 1 for a wrong length). */
static long check(const unsigned char *buf, int expected_len, int received_len, int src,
                  int dst, int seq) {
  if (received_len != expected_len) {
    fprintf(stderr, "mpi_alltoall: rank %d: message %d from %d has %d bytes, expected %d\n",
            dst, seq, src, received_len, expected_len);
    return 1;
  }
  long wrong = 0;
  for (int i = 0; i < expected_len; ++i) {
    if (buf[i] != pattern_byte(src, dst, seq, (size_t)i)) {
      if (wrong == 0)
        fprintf(stderr, "mpi_alltoall: rank %d: message %d from %d differs at byte %d\n",
                dst, seq, src, i);
      ++wrong;
    }
  }
  return wrong;
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int rounds = 3, corrupt = 0;
  for (int i = 1; i < argc; ++i) {
    if (strcmp(argv[i], "--corrupt") == 0)
      corrupt = 1;
    else
      rounds = atoi(argv[i]);
  }
  if (rounds < 1 || rounds > 1000) rounds = 3;
  const int per_peer = rounds * kNumSizes;
  const int peers = size - 1;

  unsigned char **send_bufs = calloc((size_t)peers * per_peer, sizeof *send_bufs);
  unsigned char **recv_bufs = calloc((size_t)peers * per_peer, sizeof *recv_bufs);
  MPI_Request *requests = calloc((size_t)2 * peers * per_peer + 1, sizeof *requests);
  MPI_Status *statuses = calloc((size_t)2 * peers * per_peer + 1, sizeof *statuses);
  if (!send_bufs || !recv_bufs || !requests || !statuses) MPI_Abort(MPI_COMM_WORLD, 2);

  /* Receives first (each from its own peer and tag), then the sends, in an order that
   * starts at a different peer on each rank so that all the connections open at once. */
  int n = 0;
  for (int p = 0; p < peers; ++p) {
    int src = (rank + 1 + p) % size;
    for (int seq = 0; seq < per_peer; ++seq) {
      int len = kSizes[seq % kNumSizes];
      unsigned char *buf = malloc((size_t)len);
      if (!buf) MPI_Abort(MPI_COMM_WORLD, 2);
      memset(buf, 0, (size_t)len);
      recv_bufs[p * per_peer + seq] = buf;
      MPI_Irecv(buf, len, MPI_BYTE, src, seq, MPI_COMM_WORLD, &requests[n++]);
    }
  }
  for (int p = 0; p < peers; ++p) {
    int dst = (rank + size - 1 - p) % size;
    for (int seq = 0; seq < per_peer; ++seq) {
      int len = kSizes[seq % kNumSizes];
      unsigned char *buf = malloc((size_t)len);
      if (!buf) MPI_Abort(MPI_COMM_WORLD, 2);
      fill(buf, len, rank, dst, seq);
      if (corrupt && rank == 1 && dst == 0 && seq == kNumSizes - 1) buf[len / 2] ^= 0x40;
      send_bufs[p * per_peer + seq] = buf;
      MPI_Isend(buf, len, MPI_BYTE, dst, seq, MPI_COMM_WORLD, &requests[n++]);
    }
  }
  MPI_Waitall(n, requests, statuses);

  long mismatches = 0, bytes = 0;
  for (int p = 0; p < peers; ++p) {
    int src = (rank + 1 + p) % size;
    for (int seq = 0; seq < per_peer; ++seq) {
      int len = kSizes[seq % kNumSizes];
      const MPI_Status *st = &statuses[p * per_peer + seq];
      int got = 0;
      MPI_Get_count(st, MPI_BYTE, &got);
      if (st->MPI_SOURCE != src || st->MPI_TAG != seq) {
        fprintf(stderr, "mpi_alltoall: rank %d: receive %d/%d matched source %d tag %d\n",
                rank, src, seq, st->MPI_SOURCE, st->MPI_TAG);
        ++mismatches;
      }
      mismatches += check(recv_bufs[p * per_peer + seq], len, got, src, rank, seq);
      bytes += got;
    }
  }

  long totals[2] = {0, 0}, mine[2] = {mismatches, bytes};
  MPI_Reduce(mine, totals, 2, MPI_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
  if (rank == 0)
    printf("mpi_alltoall: ranks=%d messages=%ld bytes=%ld mismatches=%ld\n", size,
           (long)size * peers * per_peer, totals[1], totals[0]);

  for (int i = 0; i < peers * per_peer; ++i) {
    free(send_bufs[i]);
    free(recv_bufs[i]);
  }
  free(send_bufs);
  free(recv_bufs);
  free(requests);
  free(statuses);
  int failed = totals[0] != 0;
  MPI_Bcast(&failed, 1, MPI_INT, 0, MPI_COMM_WORLD);
  MPI_Finalize();
  return failed ? 1 : 0;
}
