// CPU cost of one small message through the sans-IO queue-pair engine, sockets aside: two
// engines back to back in memory, the bytes of one handed to the other as a socket read
// would. This is the user-space part of every message's latency (sender: post_send, framing,
// gather; receiver: decode, checks, placement, completion), so it is measured on its own.
//
// One iteration = the receiver posts a receive (Send only), the sender posts one signaled
// work request, its FPDU crosses, and both completions are taken.
#include <benchmark/benchmark.h>

#include <sys/uio.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "core/memory_table.hpp"
#include "core/queue_pair_engine.hpp"

namespace {

using namespace peercm;
using namespace peercm::core;

constexpr std::uint32_t kPd = 7;
constexpr std::uint32_t kAllAccess = kAccessLocalWrite | kAccessRemoteWrite | kAccessRemoteRead;

class CountingCq final : public CompletionSink {
 public:
  bool push(const WorkCompletion& wc) override {
    ++count;
    last_status = wc.status;
    return true;
  }
  void solicited() override {}
  std::uint64_t count = 0;
  WcStatus last_status = WcStatus::success;
};

struct Node {
  explicit Node(std::uint32_t qp_num)
      : memory(qp_num), qp(QpConfig{qp_num, kPd, {}, /*signal_all=*/true, nullptr}, memory, scq, rcq) {
    buffer.resize(4096);
    stag = memory.register_region(kPd, reinterpret_cast<std::uintptr_t>(buffer.data()), buffer.size(), kAllAccess)
               .value();
  }
  Sge sge(std::uint32_t length) const { return Sge{reinterpret_cast<std::uintptr_t>(buffer.data()), length, stag}; }

  MemoryTable memory;
  CountingCq scq;
  CountingCq rcq;
  QueuePairEngine qp;
  std::vector<std::uint8_t> buffer;
  std::uint32_t stag = 0;
};

// Writes what `from` has to send into `wire`, as one socket write and one read would.
void cross(QueuePairEngine& from, QueuePairEngine& to, std::vector<std::uint8_t>& wire) {
  std::array<iovec, 16> iov{};
  const std::size_t count = from.gather_transmit(iov);
  std::size_t total = 0;
  for (std::size_t i = 0; i < count; ++i) {
    std::memcpy(wire.data() + total, iov[i].iov_base, iov[i].iov_len);
    total += iov[i].iov_len;
  }
  from.handle_transmitted(total);
  to.handle_bytes(std::span(wire.data(), total));
  while (from.poll_event()) {
  }
  while (to.poll_event()) {
  }
}

void run(benchmark::State& state, WrOpcode opcode) {
  const bool crc = state.range(0) != 0;
  const auto size = static_cast<std::uint32_t>(state.range(1));
  Node a(1), b(2);
  StreamParams params;
  params.crc = crc;
  params.mulpdu = 65000;
  a.qp.connect(params);
  params.responder = true;
  b.qp.connect(params);
  std::vector<std::uint8_t> wire(size + 256);
  // The responder may send only after the first inbound FPDU (RFC 5044 §7.1.2): a first
  // message out of the timed loop also settles every lazily allocated structure.
  for (int warm = 0; warm < 2; ++warm) {
    if (opcode == WrOpcode::send) (void)b.qp.post_recv(RecvWr{.wr_id = 0, .sg_list = {b.sge(size)}});
    (void)a.qp.post_send(SendWr{.wr_id = 0, .opcode = opcode, .flags = kSendSignaled, .sg_list = {a.sge(size)},
                                .remote_addr = reinterpret_cast<std::uintptr_t>(b.buffer.data()), .rkey = b.stag});
    cross(a.qp, b.qp, wire);
  }
  std::uint64_t id = 1;
  for (auto _ : state) {
    if (opcode == WrOpcode::send) (void)b.qp.post_recv(RecvWr{.wr_id = id, .sg_list = {b.sge(size)}});
    (void)a.qp.post_send(SendWr{.wr_id = id, .opcode = opcode, .flags = kSendSignaled, .sg_list = {a.sge(size)},
                                .remote_addr = reinterpret_cast<std::uintptr_t>(b.buffer.data()), .rkey = b.stag});
    cross(a.qp, b.qp, wire);
    ++id;
  }
  const std::uint64_t expected = id + 1;  // the two warm-up messages too
  if (a.scq.count != expected || (opcode == WrOpcode::send && b.rcq.count != expected) ||
      a.scq.last_status != WcStatus::success)
    state.SkipWithError("a message did not complete");
  state.SetItemsProcessed(state.iterations());
}

void BM_SendMessage(benchmark::State& state) { run(state, WrOpcode::send); }
void BM_WriteMessage(benchmark::State& state) { run(state, WrOpcode::rdma_write); }

BENCHMARK(BM_SendMessage)->ArgNames({"crc", "size"})->ArgsProduct({{0, 1}, {8, 4096}});
BENCHMARK(BM_WriteMessage)->ArgNames({"crc", "size"})->ArgsProduct({{0, 1}, {8, 4096}});

}  // namespace
