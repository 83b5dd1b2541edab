/* Time of the first MPI_Alltoall of a fresh job: the connection-setup figure that
 * bench/side_by_side.sh sets against `peercm mesh --ranks N --model p2p` (time_to_mesh_us).
 *
 * With `--mca btl tcp,self --mca pml ob1` Open MPI opens its TCP connections lazily, on the
 * first message to each peer, so the first all-to-all (8 bytes per peer) includes connection
 * setup; the second one, timed the same way, runs over established connections.
 *
 *   mpi_alltoall_first            time from the return of MPI_Init to the return of the first
 *                                 MPI_Alltoall. MPI_Init ends in the runtime's out-of-band
 *                                 fence (PMIx), so the ranks leave it together (like the start
 *                                 barrier of `peercm mesh`), and every connection is opened
 *                                 inside the timed all-to-all.
 *   mpi_alltoall_first --barrier  MPI_Barrier first, then time the all-to-all. The barrier runs
 *                                 over the TCP BTL and opens some connections itself (log2 N
 *                                 per rank), which the all-to-all then does not pay for.
 *
 * Every figure is the maximum over the ranks. Prints one JSON line on rank 0:
 *   {"ranks":N,"start":"init"|"barrier","bytes_per_peer":8,"first_alltoall_us":F,
 *    "second_alltoall_us":S,"barrier_us":B,"init_us":I,"verified":true|false}
 *
 *   build: mpicc -O2 -o mpi_alltoall_first bench/mpi_alltoall_first.c
 *   run:   mpirun --allow-run-as-root --oversubscribe -np 8 --mca btl tcp,self --mca pml ob1 \
 *            --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo ./mpi_alltoall_first
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { kBytesPerPeer = 8 };

static double monotonic_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double timed_alltoall(const char *send, char *recv, MPI_Comm comm) {
  double t0 = MPI_Wtime();
  MPI_Alltoall(send, kBytesPerPeer, MPI_BYTE, recv, kBytesPerPeer, MPI_BYTE, comm);
  return MPI_Wtime() - t0;
}

int main(int argc, char **argv) {
  double t_init0 = monotonic_s(); /* MPI_Wtime is not to be called before MPI_Init */
  MPI_Init(&argc, &argv);
  double t_init = monotonic_s() - t_init0;
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);

  char *send = malloc((size_t)size * kBytesPerPeer);
  char *recv = malloc((size_t)size * kBytesPerPeer);
  if (!send || !recv) MPI_Abort(MPI_COMM_WORLD, 2);
  for (int p = 0; p < size; ++p) {
    uint64_t v = ((uint64_t)rank << 32) | (uint32_t)p;
    memcpy(send + (size_t)p * kBytesPerPeer, &v, kBytesPerPeer);
  }

  /* MPI_Init ends in the runtime's out-of-band fence (PMIx), so the ranks leave it
   * together; an MPI_Barrier instead goes over the TCP BTL and opens some of the
   * connections itself (log2 N per rank), hiding them from the all-to-all. */
  int with_barrier = argc > 1 && strcmp(argv[1], "--barrier") == 0;
  double t_barrier = 0;
  if (with_barrier) {
    double b0 = MPI_Wtime();
    MPI_Barrier(MPI_COMM_WORLD);
    t_barrier = MPI_Wtime() - b0;
  }
  double t_first = timed_alltoall(send, recv, MPI_COMM_WORLD);

  int bad = 0; /* every peer's block must be (peer, me) */
  for (int p = 0; p < size; ++p) {
    uint64_t v;
    memcpy(&v, recv + (size_t)p * kBytesPerPeer, kBytesPerPeer);
    if (v != (((uint64_t)p << 32) | (uint32_t)rank)) bad = 1;
  }
  MPI_Barrier(MPI_COMM_WORLD);
  double t_second = timed_alltoall(send, recv, MPI_COMM_WORLD);

  double local[4] = {t_first, t_second, t_barrier, t_init}, max[4];
  int any_bad = 0;
  MPI_Reduce(local, max, 4, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
  MPI_Reduce(&bad, &any_bad, 1, MPI_INT, MPI_MAX, 0, MPI_COMM_WORLD);
  if (rank == 0) {
    printf("{\"ranks\":%d,\"start\":\"%s\",\"bytes_per_peer\":%d,\"first_alltoall_us\":%.1f,"
           "\"second_alltoall_us\":%.1f,\"barrier_us\":%.1f,\"init_us\":%.1f,\"verified\":%s}\n",
           size, with_barrier ? "barrier" : "init", kBytesPerPeer, max[0] * 1e6, max[1] * 1e6, max[2] * 1e6, max[3] * 1e6,
           any_bad ? "false" : "true");
    fflush(stdout);
  }
  free(send);
  free(recv);
  MPI_Finalize();
  return any_bad ? 1 : 0;
}
