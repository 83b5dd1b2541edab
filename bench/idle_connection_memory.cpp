// Heap cost of an idle established connection: opens N client/server connections between
// two contexts, lets them go idle, and divides the growth of the malloc heap by the number
// of connection ends. Application buffers are not registered (they are "buffers aside");
// QPs use the default capabilities. Prints the figure and its ratio to the 32 KiB budget.
#include <arpa/inet.h>
#include <malloc.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <thread>
#include <vector>

#include "peercm/cm.hpp"
#include "peercm/verbs.hpp"

using namespace peercm;
using namespace std::chrono_literals;

namespace {

constexpr double kBudgetBytes = 32 * 1024;

std::size_t heap_in_use() { return mallinfo2().uordblks; }

bool wait_for(EventChannel& channel, CmEventType type, CmEvent* out = nullptr) {
  auto event = channel.get_event(5s);
  if (!event || event->type != type) return false;
  if (out) *out = std::move(*event);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  const int connections = argc > 1 ? std::atoi(argv[1]) : 200;
  auto server_ctx = std::move(Context::open().value());
  auto client_ctx = std::move(Context::open().value());
  auto server_events = std::move(EventChannel::create().value());
  auto client_events = std::move(EventChannel::create().value());
  auto server_pd = std::move(ProtectionDomain::allocate(*server_ctx).value());
  auto client_pd = std::move(ProtectionDomain::allocate(*client_ctx).value());
  auto server_cq = std::move(CompletionQueue::create(*server_ctx, 4096).value());
  auto client_cq = std::move(CompletionQueue::create(*client_ctx, 4096).value());
  auto listener = std::move(CmId::create(*server_ctx, *server_events).value());
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (!listener->bind(address) || !listener->listen(connections)) return 1;
  address.sin_port = listener->local_address().sin_port;
  QpInitAttr server_attr{.send_cq = server_cq.get(), .recv_cq = server_cq.get()};
  QpInitAttr client_attr{.send_cq = client_cq.get(), .recv_cq = client_cq.get()};

  // Warm up once so lazily created per-context state (receive buffer, timers) is not counted.
  std::vector<std::unique_ptr<CmId>> clients, servers;
  auto open_one = [&](std::uint32_t tag) {
    auto id = std::move(CmId::create(*client_ctx, *client_events).value());
    (void)id->set_option(CmOption::p2p_tag, tag);
    if (!id->resolve_addr(address) || !wait_for(*client_events, CmEventType::addr_resolved)) return false;
    if (!id->resolve_route() || !wait_for(*client_events, CmEventType::route_resolved)) return false;
    if (!id->create_qp(*client_pd, client_attr) || !id->connect({})) return false;
    CmEvent request;
    if (!wait_for(*server_events, CmEventType::connect_request, &request)) return false;
    if (!request.new_id->create_qp(*server_pd, server_attr) || !request.new_id->accept({})) return false;
    if (!wait_for(*server_events, CmEventType::established) || !wait_for(*client_events, CmEventType::established))
      return false;
    clients.push_back(std::move(id));
    servers.push_back(std::move(request.new_id));
    return true;
  };
  if (!open_one(0)) return 1;
  std::this_thread::sleep_for(50ms);
  const std::size_t before = heap_in_use();
  for (int i = 1; i <= connections; ++i) {
    if (!open_one(static_cast<std::uint32_t>(i))) {
      std::fprintf(stderr, "connection %d failed\n", i);
      return 1;
    }
  }
  std::this_thread::sleep_for(100ms);  // idle
  const std::size_t after = heap_in_use();
  const double per_end = static_cast<double>(after - before) / (2.0 * connections);
  std::printf("{\"connections\":%d,\"heap_bytes_per_connection_end\":%.0f,\"budget_bytes\":%.0f,\"ratio\":%.3f}\n",
              connections, per_end, kBudgetBytes, per_end / kBudgetBytes);
  clients.clear();
  servers.clear();
  return per_end <= kBudgetBytes ? 0 : 2;
}
