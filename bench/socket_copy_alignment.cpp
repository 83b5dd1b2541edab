// How fast the kernel copies a TCP stream's bytes, by where the user buffer sits in its page.
//
// Every stack in the side-by-side suite moves its bytes through the same two kernel copies:
// send() into the socket's pages and recv() out of them. On CPUs whose `rep movsb` slows down
// when the destination lies 1-15 bytes past the source modulo 4096 (4K aliasing of the
// loads and stores), those copies run several times slower for some offsets between the
// application's buffer and the kernel's pages. The kernel fills its pages from the sending
// thread's page fragment, in the stream's order, so a buffer at an unlucky page offset streams
// slowly for as long as it is used (loopback_stream_phases: +4090 at 0.4x of +0). The slow
// runs every stack shows in about a quarter of its samples are something else: phases of the
// host that slow every offset alike (loopback_stream_phases again).
//
//   socket_copy_alignment [REPS] [OFFSET...]
//
// One loopback connection with 4 MiB socket buffers; for each OFFSET, REPS times: send() of
// 1 MiB from a buffer at that page offset (the receiver not reading, so only the sender's copy
// and its TCP path are timed), then recv() of the queued 1 MiB (only the receiver's copy is
// timed) into a buffer at -OFFSET's page offset when OFFSET < 0, else at 0. Prints the best
// rate of each.
#include "loopback_pair.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;
constexpr std::size_t kMessage = 1 << 20;
constexpr std::size_t kArea = 4 << 20;

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 20;
  std::vector<int> offsets;
  for (int i = 2; i < argc; ++i) offsets.push_back(std::atoi(argv[i]));
  if (offsets.empty()) offsets = {0, 16, 64, 4080, 4084, 4088, 4092, -4, -8, -12, -16};

  const peercm::bench::LoopbackPair pair = peercm::bench::connect_loopback_pair(4 << 20);
  const int sender = pair.sender;
  const int receiver = pair.receiver;
  std::uint8_t* source = peercm::bench::touched_area(kArea);
  std::uint8_t* destination = peercm::bench::touched_area(kArea);

  std::printf("%-8s %14s %14s\n", "offset", "send GB/s", "recv GB/s");
  for (const int offset : offsets) {
    std::uint8_t* from = source + (offset >= 0 ? offset : 0);
    std::uint8_t* into = destination + (offset < 0 ? -offset : 0);
    double best_send = 1e9, best_recv = 1e9;
    for (int r = 0; r < reps; ++r) {
      const auto t0 = Clock::now();
      const ssize_t sent = ::send(sender, from, kMessage, MSG_DONTWAIT);
      const auto t1 = Clock::now();
      if (sent == static_cast<ssize_t>(kMessage)) best_send = std::min(best_send, seconds(t1 - t0));
      ssize_t got = 0;
      const auto t2 = Clock::now();
      while (sent > 0 && got < sent) {
        const ssize_t n = ::recv(receiver, into, static_cast<std::size_t>(sent - got), 0);
        if (n <= 0) break;
        got += n;
      }
      const auto t3 = Clock::now();
      if (got > 0) best_recv = std::min(best_recv, seconds(t3 - t2) * static_cast<double>(kMessage) / static_cast<double>(got));
    }
    const std::string label = offset >= 0 ? "send+" + std::to_string(offset) : "recv+" + std::to_string(-offset);
    std::printf("%-8s %14.2f %14.2f\n", label.c_str(), kMessage / best_send / 1e9, kMessage / best_recv / 1e9);
  }
  pair.close_all();
  return 0;
}
