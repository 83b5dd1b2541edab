// p2p_scale: on-demand meshes of many simulated nodes on the production IB CM agent
// (src/core/ibcm, with its P2pResolver), in simulated time. Every node runs one IbCmAgent; a
// node's CM is a queue: each MAD it handles and each application call costs `--cm-cost` of its
// time, one after the other. MADs take `--latency` one way; nothing is lost. The application
// accepts every CONNECT_REQUEST at once. The figures: time to the full mesh, CM MADs per
// connection, collisions per connection, and the agent's memory per node, counted by this
// program's allocator (every byte the agent allocates while a node's code runs is charged to
// that node).
//
//   p2p_scale --nodes 256 [--pattern both|one|ring:K] [--latency-us 10] [--cm-cost-us 5] [--seed 1]
//   p2p_scale --table         the table of docs/p2p-scale.md (256 to 2,048 nodes, 4,096 as rings)
//
// Patterns: `both`: every node connects to every other at once (an MPI all-to-all whose ranks
// all send first: every pair collides); `one`: only the lower rank of each pair connects (no
// collisions); `ring:K`: every node connects to its K successors, both ends asking (a sparse
// neighbourhood, for sizes whose full mesh does not fit in this machine's memory).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <optional>
#include <queue>
#include <string>
#include <string_view>
#include <vector>

#include "core/ibcm/ibcm_agent.hpp"
#include "sim_rng.hpp"
#include "wire/ibcm/gid.hpp"

// ---------------------------------------------------------------------------------------------
// The counting allocator: every allocation carries a 16-byte prefix naming its size and the node
// whose code allocated it; the live bytes of each node are kept in `g_live`.

namespace {

constexpr std::size_t kPrefix = 16;
constexpr std::size_t kMaxCounted = 1 << 16;
std::int64_t g_live[kMaxCounted + 1] = {};
std::uint32_t g_node = kMaxCounted;  // the node whose code runs now; kMaxCounted: none

void* counted_alloc(std::size_t size) {
  auto* base = static_cast<unsigned char*>(std::malloc(size + kPrefix));
  if (base == nullptr) throw std::bad_alloc();
  const std::uint64_t header[2] = {size, g_node};
  std::memcpy(base, header, sizeof header);
  g_live[g_node] += static_cast<std::int64_t>(size);
  return base + kPrefix;
}

void counted_free(void* pointer) {
  if (pointer == nullptr) return;
  auto* base = static_cast<unsigned char*>(pointer) - kPrefix;
  std::uint64_t header[2];
  std::memcpy(header, base, sizeof header);
  g_live[header[1]] -= static_cast<std::int64_t>(header[0]);
  std::free(base);
}

}  // namespace

void* operator new(std::size_t size) { return counted_alloc(size); }
void* operator new[](std::size_t size) { return counted_alloc(size); }
void operator delete(void* pointer) noexcept { counted_free(pointer); }
void operator delete[](void* pointer) noexcept { counted_free(pointer); }
void operator delete(void* pointer, std::size_t) noexcept { counted_free(pointer); }
void operator delete[](void* pointer, std::size_t) noexcept { counted_free(pointer); }

namespace peercm::sim {
namespace {

using namespace std::chrono_literals;
namespace ib = core::ibcm;
namespace w = wire::ibcm;
using core::Duration;
using core::Time;

constexpr std::uint16_t kPort = 7471;

struct ScaleConfig {
  int nodes = 256;
  enum class Pattern : std::uint8_t { both, one, ring } pattern = Pattern::both;
  int ring = 0;
  Duration latency = 10us;
  Duration cm_cost = 5us;
  std::uint64_t seed = 1;
};

struct ScaleResult {
  std::uint64_t connections = 0;  // pairs ESTABLISHED at both ends
  std::uint64_t wanted = 0;
  Duration time_to_mesh{};
  std::uint64_t mads = 0;
  std::uint64_t dropped = 0;  // losing REQs the active peer dropped (rule 3)
  std::uint64_t bound = 0;    // attempts bound to the peer's REQ: one per collision (rule 3 passive)
  std::uint64_t failed = 0;  // attempts that ended without a connection
  double bytes_per_node = 0;  // agent memory after the mesh, mean over nodes
  std::int64_t max_bytes_per_node = 0;
  double wall_seconds = 0;
};

// A node id a → its IPv4 address 10.x.y.z.
ib::Ipv4Address address(int i) {
  const auto n = static_cast<std::uint32_t>(i + 1);
  return {10, static_cast<std::uint8_t>(n >> 16), static_cast<std::uint8_t>(n >> 8), static_cast<std::uint8_t>(n)};
}
int index_of(const ib::Ipv4Address& a) { return ((a[1] << 16) | (a[2] << 8) | a[3]) - 1; }

class Mesh {
 public:
  explicit Mesh(const ScaleConfig& config) : config_(config), rng_(config.seed) {
    nodes_.resize(static_cast<std::size_t>(config.nodes));
    for (int i = 0; i < config.nodes; ++i) {
      Node& n = node(i);
      g_node = static_cast<std::uint32_t>(i);
      n.agent = std::make_unique<ib::IbCmAgent>(ib::IbCmAgentConfig{
          .identity = {.guid = rng_.next(), .incarnation = rng_.next() | 1},
          .address = address(i),
          .connect_timeout = 60s,
          .first_comm_id = static_cast<std::uint32_t>(rng_.next()),
          .tid_high = static_cast<std::uint32_t>(i + 1)});
      n.agent->listen(kPort);
      n.next_qpn = 0x100;
      g_node = kMaxCounted;
    }
  }

  ScaleResult run() {
    const auto began = std::chrono::steady_clock::now();
    plan();
    while (!queue_.empty()) {
      const Event e = queue_.top();
      queue_.pop();
      now_ = e.at;
      dispatch(e);
    }
    ScaleResult result;
    result.wanted = wanted_;
    result.connections = established_ends_ / 2;
    result.time_to_mesh = last_established_ - Time{};
    result.mads = mads_;
    result.failed = failed_;
    std::int64_t total = 0;
    for (int i = 0; i < config_.nodes; ++i) {
      const auto& stats = node(i).agent->stats();
      result.dropped += stats.p2p_dropped;
      result.bound += stats.p2p_bound;
      total += g_live[i];
      result.max_bytes_per_node = std::max(result.max_bytes_per_node, g_live[i]);
    }
    result.bytes_per_node = static_cast<double>(total) / config_.nodes;
    result.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
    return result;
  }

 private:
  struct Node {
    std::unique_ptr<ib::IbCmAgent> agent;
    Time busy_until{};  // the node's CM queue
    std::uint32_t next_qpn = 0;
    std::optional<Time> timer;
  };
  enum class Kind : std::uint8_t { connect, mad, timer };
  struct Event {
    Time at{};
    std::uint64_t seq = 0;
    Kind kind = Kind::mad;
    int node = 0;
    int peer = 0;  // connect: the destination; mad: the sender
    std::shared_ptr<const ib::OutboundMad> mad;
    bool operator>(const Event& other) const { return at != other.at ? at > other.at : seq > other.seq; }
  };

  Node& node(int i) { return nodes_[static_cast<std::size_t>(i)]; }

  // The simulator's own queue is nobody's memory.
  void schedule(Event e) {
    const std::uint32_t charged = g_node;
    g_node = kMaxCounted;
    e.seq = seq_++;
    queue_.push(std::move(e));
    g_node = charged;
  }

  // Work arriving at a node at `at` runs when its CM is free, for cm_cost: the event is handled
  // (and its outputs leave) when that work is done.
  Time queue_at(int i, Time at) {
    Node& n = node(i);
    const Time start = std::max(at, n.busy_until);
    n.busy_until = start + config_.cm_cost;
    return n.busy_until;
  }

  void plan() {
    const int count = config_.nodes;
    for (int a = 0; a < count; ++a) {
      std::vector<int> peers;
      switch (config_.pattern) {
        case ScaleConfig::Pattern::both:
        case ScaleConfig::Pattern::one:
          for (int b = 0; b < count; ++b) {
            if (b != a && (config_.pattern == ScaleConfig::Pattern::both || a < b)) peers.push_back(b);
          }
          break;
        case ScaleConfig::Pattern::ring:
          for (int k = 1; k <= config_.ring; ++k) {
            peers.push_back((a + k) % count);
            peers.push_back((a - k + count) % count);
          }
          break;
      }
      // Each application asks for its peers in its own order.
      for (std::size_t i = peers.size(); i > 1; --i) std::swap(peers[i - 1], peers[rng_.next() % i]);
      for (int b : peers) schedule({.at = queue_at(a, Time{}), .kind = Kind::connect, .node = a, .peer = b});
    }
    wanted_ = config_.pattern == ScaleConfig::Pattern::ring
                  ? static_cast<std::uint64_t>(count) * static_cast<std::uint64_t>(config_.ring)
                  : static_cast<std::uint64_t>(count) * static_cast<std::uint64_t>(count - 1) / 2;
  }

  void dispatch(const Event& e) {
    Node& n = node(e.node);
    g_node = static_cast<std::uint32_t>(e.node);
    switch (e.kind) {
      case Kind::connect: {
        const ib::IbCmConnectParams params{.destination = address(e.peer), .port = kPort, .tag = 0,
                                           .peer_to_peer = true, .qpn = n.next_qpn++,
                                           .starting_psn = static_cast<std::uint32_t>(rng_.next() & 0xFFFFFF)};
        (void)n.agent->connect(params, now_);  // EALREADY / EISCONN: the pair is being or is connected
        break;
      }
      case Kind::mad:
        n.agent->handle_mad(w::ipv4_mapped_gid(address(e.peer)), e.mad->bytes, now_);
        break;
      case Kind::timer:
        if (n.timer == e.at) n.timer.reset();
        if (auto d = n.agent->next_deadline(); d && *d <= now_) n.agent->handle_timeout(now_);
        break;
    }
    pump(e.node);
    g_node = kMaxCounted;
  }

  void pump(int i) {
    Node& n = node(i);
    while (auto mad = n.agent->poll_mad()) {
      ++mads_;
      const auto to = w::ipv4_of_gid(mad->destination);
      if (!to) continue;
      const int target = index_of(*to);
      g_node = kMaxCounted;
      auto shared = std::make_shared<const ib::OutboundMad>(*mad);
      g_node = static_cast<std::uint32_t>(i);
      schedule({.at = queue_at(target, now_ + config_.latency), .kind = Kind::mad, .node = target, .peer = i,
                .mad = std::move(shared)});
    }
    while (auto event = n.agent->poll_event()) {
      switch (event->kind) {
        case ib::IbCmAgentEvent::Kind::connect_request:
          (void)n.agent->accept(event->id, {.qpn = n.next_qpn++,
                                            .starting_psn = static_cast<std::uint32_t>(rng_.next() & 0xFFFFFF)},
                                now_);
          break;
        case ib::IbCmAgentEvent::Kind::established:
          ++established_ends_;
          last_established_ = now_;
          break;
        case ib::IbCmAgentEvent::Kind::rejected:
        case ib::IbCmAgentEvent::Kind::unreachable:
        case ib::IbCmAgentEvent::Kind::connect_error:
          ++failed_;
          break;
        default:
          break;
      }
    }
    // Only deadlines before the mesh could matter; the agents' own retries are what counts.
    if (auto d = n.agent->next_deadline(); d && (!n.timer || *d < *n.timer)) {
      n.timer = *d;
      schedule({.at = *d, .kind = Kind::timer, .node = i});
    }
  }

  ScaleConfig config_;
  Rng rng_;
  std::vector<Node> nodes_;
  std::priority_queue<Event, std::vector<Event>, std::greater<>> queue_;
  Time now_{};
  std::uint64_t seq_ = 0;
  std::uint64_t wanted_ = 0;
  std::uint64_t established_ends_ = 0;
  Time last_established_{};
  std::uint64_t mads_ = 0;
  std::uint64_t failed_ = 0;
};

std::string pattern_name(const ScaleConfig& config) {
  switch (config.pattern) {
    case ScaleConfig::Pattern::both: return "full mesh, both ends ask";
    case ScaleConfig::Pattern::one: return "full mesh, lower rank asks";
    case ScaleConfig::Pattern::ring: return fmt::format("ring, {} neighbours each side, both ask", config.ring);
  }
  return "";
}

void print_row(const ScaleConfig& config, const ScaleResult& r) {
  const double per = r.connections == 0 ? 0 : 1.0 / static_cast<double>(r.connections);
  fmt::print("| {} | {} | {} of {} | {:.1f} ms | {:.2f} | {:.3f} | {:.0f} KiB ({:.0f} B per connection end) | {:.1f} s |\n",
             config.nodes, pattern_name(config), r.connections, r.wanted,
             std::chrono::duration<double, std::milli>(r.time_to_mesh).count(), static_cast<double>(r.mads) * per,
             static_cast<double>(r.bound) * per, r.bytes_per_node / 1024.0,
             r.bytes_per_node * static_cast<double>(config.nodes) / (2.0 * static_cast<double>(std::max<std::uint64_t>(r.connections, 1))),
             r.wall_seconds);
  std::fflush(stdout);
}

void print_header() {
  fmt::print("| nodes | pattern | connections | time to mesh | CM MADs per connection | collisions per connection | "
             "agent memory per node | wall time |\n|---|---|---|---|---|---|---|---|\n");
}

[[noreturn]] void usage() {
  std::fputs("usage: p2p_scale [--table] [--nodes N] [--pattern both|one|ring:K] [--latency-us U] [--cm-cost-us U] "
             "[--seed S]\n",
             stderr);
  std::exit(2);
}

}  // namespace
}  // namespace peercm::sim

int main(int argc, char** argv) {
  using namespace peercm::sim;
  ScaleConfig config;
  bool table = false;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage();
      return argv[++i];
    };
    if (arg == "--table") {
      table = true;
    } else if (arg == "--nodes") {
      config.nodes = std::atoi(value().c_str());
    } else if (arg == "--pattern") {
      const std::string p = value();
      if (p == "both") {
        config.pattern = ScaleConfig::Pattern::both;
      } else if (p == "one") {
        config.pattern = ScaleConfig::Pattern::one;
      } else if (p.rfind("ring:", 0) == 0) {
        config.pattern = ScaleConfig::Pattern::ring;
        config.ring = std::atoi(p.c_str() + 5);
      } else {
        usage();
      }
    } else if (arg == "--latency-us") {
      config.latency = std::chrono::microseconds(std::atoi(value().c_str()));
    } else if (arg == "--cm-cost-us") {
      config.cm_cost = std::chrono::microseconds(std::atoi(value().c_str()));
    } else if (arg == "--seed") {
      config.seed = std::strtoull(value().c_str(), nullptr, 0);
    } else {
      usage();
    }
  }
  if (config.nodes < 2 || config.nodes > static_cast<int>(kMaxCounted)) usage();
  print_header();
  if (!table) {
    const ScaleResult result = Mesh(config).run();
    print_row(config, result);
    return result.connections == result.wanted && result.failed == 0 ? 0 : 1;
  }
  int status = 0;
  struct Row {
    int nodes;
    ScaleConfig::Pattern pattern;
    int ring;
  };
  for (const Row row : {Row{256, ScaleConfig::Pattern::both, 0}, Row{256, ScaleConfig::Pattern::one, 0},
                        Row{512, ScaleConfig::Pattern::both, 0}, Row{1024, ScaleConfig::Pattern::both, 0},
                        Row{1024, ScaleConfig::Pattern::one, 0}, Row{2048, ScaleConfig::Pattern::both, 0},
                        Row{4096, ScaleConfig::Pattern::ring, 16},
                        Row{4096, ScaleConfig::Pattern::ring, 64}}) {
    ScaleConfig c = config;
    c.nodes = row.nodes;
    c.pattern = row.pattern;
    c.ring = row.ring;
    const ScaleResult result = Mesh(c).run();
    print_row(c, result);
    if (result.connections != result.wanted || result.failed != 0) status = 1;
  }
  return status;
}
