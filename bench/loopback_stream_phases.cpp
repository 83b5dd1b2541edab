// A plain TCP stream over loopback, timed in slices: how far the host alone moves a stream.
//
// Every stack's 1 MiB stream on this guest is bimodal: 4-6 GB/s in most runs, 1.5-2.5 GB/s in
// a quarter of them, for peercm, UCX and plain sockets alike. This shows where the slow mode
// comes from. One connection, no framing and no library: the sender (second allowed CPU)
// send()s 1 MiB at a time from a buffer at a page OFFSET, the receiver (first allowed CPU)
// recv()s 1 MiB at a time, both busy-polling with MSG_DONTWAIT as the benchmarked stacks do.
// It prints the rate of every slice of 128 MiB; the offsets take turns, one slice each, so a
// slow phase of the host shows in every offset at once while a slow offset would show alone.
//
//   loopback_stream_phases [SLICES] [OFFSET...]     (default: 48 slices; offsets 0 16 2048 4090)
#include "loopback_pair.hpp"

#include <pthread.h>
#include <sched.h>
#include <sys/socket.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;
constexpr std::size_t kMessage = 1 << 20;
constexpr std::size_t kSlice = 128 * kMessage;

void pin_to_allowed_cpu(int index) {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (::sched_getaffinity(0, sizeof allowed, &allowed) != 0) return;
  int seen = 0;
  std::size_t last = 0;
  for (std::size_t cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &allowed)) continue;
    last = cpu;
    if (seen++ == index) break;
  }
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(last, &one);
  ::pthread_setaffinity_np(::pthread_self(), sizeof one, &one);
}

}  // namespace

int main(int argc, char** argv) {
  const int slices = argc > 1 ? std::atoi(argv[1]) : 48;
  std::vector<int> offsets;
  for (int i = 2; i < argc; ++i) offsets.push_back(std::atoi(argv[i]) & 4095);
  if (offsets.empty()) offsets = {0, 16, 2048, 4090};
  if (slices <= 0) {
    std::fprintf(stderr, "loopback_stream_phases: SLICES must be positive\n");
    return 2;
  }

  const peercm::bench::LoopbackPair pair = peercm::bench::connect_loopback_pair();
  const int sender = pair.sender;
  const int receiver = pair.receiver;
  const std::uint64_t total = static_cast<std::uint64_t>(slices) * kSlice;

  std::atomic<bool> receive_failed{false};
  std::thread receiving([&] {
    pin_to_allowed_cpu(0);
    std::uint8_t* into = peercm::bench::touched_area(kMessage);
    std::uint64_t got = 0;
    while (got < total) {
      const ssize_t n = ::recv(receiver, into, kMessage, MSG_DONTWAIT);
      if (n > 0) {
        got += static_cast<std::uint64_t>(n);
      } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
        receive_failed = true;
        return;
      }
    }
  });

  pin_to_allowed_cpu(1);
  std::uint8_t* area = peercm::bench::touched_area(kMessage + 4096);
  bool send_failed = false;
  std::printf("slice  offset  GB/s\n");
  for (int slice = 0; slice < slices && !send_failed && !receive_failed; ++slice) {
    const int offset = offsets[static_cast<std::size_t>(slice) % offsets.size()];
    const std::uint8_t* from = area + offset;
    const auto start = Clock::now();
    for (std::size_t sent_in_slice = 0; sent_in_slice < kSlice && !send_failed && !receive_failed;) {
      const std::size_t at = sent_in_slice % kMessage;
      const ssize_t n = ::send(sender, from + at, kMessage - at, MSG_DONTWAIT);
      if (n > 0) {
        sent_in_slice += static_cast<std::size_t>(n);
      } else if (n < 0 && errno != EAGAIN && errno != EINTR) {
        std::perror("send");
        send_failed = true;
      }
    }
    if (send_failed || receive_failed) break;
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    std::printf("%5d  %6d  %5.2f\n", slice, offset, static_cast<double>(kSlice) / seconds / 1e9);
    std::fflush(stdout);
  }
  // A sender that stopped early ends the receiver's wait with EOF.
  if (send_failed) ::shutdown(sender, SHUT_WR);
  receiving.join();
  pair.close_all();
  if (receive_failed && !send_failed) std::fprintf(stderr, "loopback_stream_phases: the receiver lost the connection\n");
  return send_failed || receive_failed ? 1 : 0;
}
