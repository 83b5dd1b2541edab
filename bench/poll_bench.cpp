// The message path through the public API, on an established iWARP connection over loopback.
//
// BM_EmptyCqPoll: one poll of an empty completion queue. A busy-polling application finds
// each message on the pass after it lands, so half a pass is added to every message's
// latency on average. With a progress thread the pass is the poller's own reactor pass
// (try-lock, a direct recv() that finds nothing, the lease); inline, Context::progress()
// does the same.
//
// BM_SendPingPong: one 8 B Send each way (CRC off), as `peercm perf` times it (the receiver reposts
// its receive, then answers), driven by one thread with both contexts inline. Loopback TCP
// hands the bytes over inside sendmsg(), so every poll finds them: the figure is the CPU
// cost of the round trip's user-space path and system calls, without waiting. Under
// `valgrind --tool=callgrind` its instruction count per iteration is the deterministic
// measure of that path.
#include <arpa/inet.h>
#include <benchmark/benchmark.h>

#include <array>
#include <chrono>
#include <memory>

#include "peercm/cm.hpp"
#include "peercm/verbs.hpp"

namespace {

using namespace peercm;
using namespace std::chrono_literals;

bool wait_for(EventChannel& channel, CmEventType type, CmEvent* out = nullptr) {
  auto event = channel.get_event(5s);
  if (!event || event->type != type) return false;
  if (out) *out = std::move(*event);
  return true;
}

// Two contexts and one established connection between them.
struct ConnectedPair {
  explicit ConnectedPair(ProgressMode mode) {
    ContextOptions options;
    options.progress = mode;
    server_ctx = std::move(Context::open(options).value());
    client_ctx = std::move(Context::open(options).value());
    server_events = std::move(EventChannel::create().value());
    client_events = std::move(EventChannel::create().value());
    server_pd = std::move(ProtectionDomain::allocate(*server_ctx).value());
    client_pd = std::move(ProtectionDomain::allocate(*client_ctx).value());
    server_cq = std::move(CompletionQueue::create(*server_ctx, 64).value());
    client_cq = std::move(CompletionQueue::create(*client_ctx, 64).value());
    listener = std::move(CmId::create(*server_ctx, *server_events).value());
    client = std::move(CmId::create(*client_ctx, *client_events).value());
  }

  bool connect() {
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (!listener->bind(address) || !listener->listen(1)) return false;
    address.sin_port = listener->local_address().sin_port;
    const QpInitAttr server_attr{.send_cq = server_cq.get(), .recv_cq = server_cq.get()};
    const QpInitAttr client_attr{.send_cq = client_cq.get(), .recv_cq = client_cq.get()};
    if (!client->resolve_addr(address) || !wait_for(*client_events, CmEventType::addr_resolved)) return false;
    if (!client->resolve_route() || !wait_for(*client_events, CmEventType::route_resolved)) return false;
    if (!client->create_qp(*client_pd, client_attr) || !client->connect({})) return false;
    CmEvent request;
    if (!wait_for(*server_events, CmEventType::connect_request, &request)) return false;
    server = std::move(request.new_id);
    if (!server->create_qp(*server_pd, server_attr) || !server->accept({})) return false;
    return wait_for(*server_events, CmEventType::established) && wait_for(*client_events, CmEventType::established);
  }

  std::unique_ptr<Context> server_ctx, client_ctx;
  std::unique_ptr<EventChannel> server_events, client_events;
  std::unique_ptr<ProtectionDomain> server_pd, client_pd;
  std::unique_ptr<CompletionQueue> server_cq, client_cq;
  std::unique_ptr<CmId> listener, client, server;
};

void BM_EmptyCqPoll(benchmark::State& state) {
  const auto mode = state.range(0) == 0 ? ProgressMode::thread : ProgressMode::inline_;
  ConnectedPair pair(mode);
  if (!pair.connect()) {
    state.SkipWithError("loopback connection failed");
    return;
  }
  WorkCompletion batch[16];
  std::size_t found = 0;
  for (auto _ : state) found += pair.client_cq->poll(batch);
  if (found != 0) state.SkipWithError("a completion arrived on an idle connection");
}
BENCHMARK(BM_EmptyCqPoll)->ArgName("inline")->Arg(0)->Arg(1);

// Polls until a receive completes; send completions on the way are consumed.
bool await_recv(CompletionQueue& cq) {
  WorkCompletion batch[4];
  for (int polls = 0; polls < 1'000'000; ++polls) {
    const std::size_t n = cq.poll(batch);
    for (std::size_t i = 0; i < n; ++i) {
      if (batch[i].status != WcStatus::success) return false;
      if (batch[i].opcode == WcOpcode::recv) return true;
    }
  }
  return false;
}

void BM_SendPingPong(benchmark::State& state) {
  ConnectedPair pair(ProgressMode::inline_);
  std::array<std::uint8_t, 64> client_memory{}, server_memory{};
  auto client_mr = MemoryRegion::register_memory(*pair.client_pd, client_memory.data(), client_memory.size(),
                                                 kAccessLocalWrite);
  auto server_mr = MemoryRegion::register_memory(*pair.server_pd, server_memory.data(), server_memory.size(),
                                                 kAccessLocalWrite);
  // CRC off, as in the latency rows compared with stacks that carry none.
  const bool crc_off = pair.listener->set_option(CmOption::crc, 2).has_value() &&
                       pair.client->set_option(CmOption::crc, 2).has_value();
  if (!crc_off || !client_mr || !server_mr || !pair.connect()) {
    state.SkipWithError("loopback connection failed");
    return;
  }
  QueuePair& client_qp = *pair.client->qp();
  QueuePair& server_qp = *pair.server->qp();
  auto post_recv = [](QueuePair& qp, const MemoryRegion& mr) {
    RecvWr wr;
    wr.sg_list.push_back(mr.sge(32, 32));
    return qp.post_recv(wr).has_value();
  };
  auto post_send = [](QueuePair& qp, const MemoryRegion& mr) {
    SendWr wr;
    wr.flags = kSendSignaled;
    wr.sg_list.push_back(mr.sge(0, 8));
    return qp.post_send(wr).has_value();
  };
  if (!post_recv(client_qp, **client_mr) || !post_recv(server_qp, **server_mr)) {
    state.SkipWithError("post_recv failed");
    return;
  }
  for (auto _ : state) {
    const bool ok = post_send(client_qp, **client_mr) && await_recv(*pair.server_cq) &&
                    post_recv(server_qp, **server_mr) && post_send(server_qp, **server_mr) &&
                    await_recv(*pair.client_cq) && post_recv(client_qp, **client_mr);
    if (!ok) {
      state.SkipWithError("the ping-pong failed");
      return;
    }
  }
}
BENCHMARK(BM_SendPingPong);

}  // namespace
