// CPU cost of one poll of an empty completion queue on an established iWARP connection
// over loopback, through the public API. A busy-polling application finds each message on
// the pass after it lands, so half a pass is added to every message's latency on average.
// With a progress thread the pass is the poller's own reactor pass (try-lock, a direct
// recv() that finds nothing, the lease); inline, Context::progress() does the same.
#include <arpa/inet.h>
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdio>
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

}  // namespace
