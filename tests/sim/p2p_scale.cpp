// p2p_scale: on-demand meshes of many simulated nodes on the production IB CM agent
// (src/core/ibcm, with its P2pResolver), in simulated time. Every node runs one IbCmAgent; a
// node's CM is a queue: each MAD it handles and each application call costs `--cm-cost` of its
// time, one after the other. MADs take `--latency` one way; nothing is lost. The application
// accepts every CONNECT_REQUEST at once. The figures: time to the full mesh, CM MADs per
// connection, collisions per connection, and the agent's memory per node, counted by this
// program's allocator (every byte the agent allocates while a node's code runs is charged to
// that node), after the mesh and at the agents' peak (all nodes together, mid-handshake).
//
//   p2p_scale --nodes 256 [--pattern both|one|ring:K] [--window W] [--latency-us 10] [--cm-cost-us 5]
//             [--seed 1]
//   p2p_scale --table         the table of docs/p2p-scale.md but its 4,096-node full mesh
//
// Patterns: `both`: every node connects to every other at once (an MPI all-to-all whose ranks
// all send first: every pair collides); `one`: only the lower rank of each pair connects (no
// collisions); `ring:K`: every node connects to its K successors, both ends asking (a sparse
// neighbourhood). `--window W`: each application keeps at most W of its own connects under way
// and asks for its next peer when one of them ends, as an MPI library that connects on demand
// with a bounded number of attempts out; without it, every connect is asked at t = 0.
#include <fmt/format.h>

#include <algorithm>
#include <array>
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
#include <utility>
#include <vector>

#include <sys/mman.h>

#include "core/ibcm/ibcm_agent.hpp"
#include "sim_rng.hpp"
#include "wire/ibcm/gid.hpp"

// ---------------------------------------------------------------------------------------------
// The counting allocator: every allocation is charged to the node whose code runs (`g_node`) and
// its release to the node whose code runs then (an agent's memory is only ever released by its
// own node's code); the live bytes of each node are kept in `g_live`. Blocks of up to kMaxSmall
// bytes come from one size class per 16 bytes, each carved from its own stretch of one reserved
// address range, so a block's class is its address and it carries no header: a full mesh holds
// tens of millions of small blocks (≈ 14 per connection end at the peak), and a per-block
// prefix naming size and node, plus glibc's own header and rounding, cost ≈ 300 B per
// connection end. The size released is the one sized delete passes (what was asked), else the
// class's. Larger blocks go to malloc with a 16-byte prefix naming their size.

namespace {

constexpr std::size_t kMaxCounted = 1 << 16;
std::int64_t g_live[kMaxCounted + 1] = {};
std::uint32_t g_node = kMaxCounted;  // the node whose code runs now; kMaxCounted: none
std::int64_t g_agents_live = 0;      // the sum of g_live over the nodes
std::int64_t g_agents_peak = 0;

constexpr std::size_t kGranule = 16;  // operator new's alignment (__STDCPP_DEFAULT_NEW_ALIGNMENT__)
constexpr std::size_t kMaxSmall = 1024;
constexpr std::size_t kClasses = kMaxSmall / kGranule;
constexpr std::size_t kClassSpan = std::size_t{1} << 37;  // 128 GiB of addresses per class
constexpr std::size_t kPrefix = 16;

struct SizeClasses {
  unsigned char* base = nullptr;
  unsigned char* next[kClasses] = {};  // the first never-used byte of each class's stretch
  void* free[kClasses] = {};           // each class's released blocks, linked through their first word
};
SizeClasses g_small;

void charge(std::size_t size) {
  g_live[g_node] += static_cast<std::int64_t>(size);
  if (g_node != kMaxCounted) {
    g_agents_live += static_cast<std::int64_t>(size);
    g_agents_peak = std::max(g_agents_peak, g_agents_live);
  }
}

void discharge(std::size_t size) {
  g_live[g_node] -= static_cast<std::int64_t>(size);
  if (g_node != kMaxCounted) g_agents_live -= static_cast<std::int64_t>(size);
}

void* counted_alloc(std::size_t size) {
  if (size > kMaxSmall) {
    auto* base = static_cast<unsigned char*>(std::malloc(size + kPrefix));
    if (base == nullptr) throw std::bad_alloc();
    std::memcpy(base, &size, sizeof size);
    charge(size);
    return base + kPrefix;
  }
  if (g_small.base == nullptr) {
    // Address space only: pages are backed as blocks are first used.
    void* range = mmap(nullptr, kClasses * kClassSpan, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (range == MAP_FAILED) throw std::bad_alloc();
    g_small.base = static_cast<unsigned char*>(range);
    for (std::size_t c = 0; c < kClasses; ++c) g_small.next[c] = g_small.base + c * kClassSpan;
  }
  const std::size_t c = size == 0 ? 0 : (size - 1) / kGranule;
  void* block = g_small.free[c];
  if (block != nullptr) {
    std::memcpy(&g_small.free[c], block, sizeof(void*));
  } else {
    block = g_small.next[c];
    g_small.next[c] += (c + 1) * kGranule;
    if (g_small.next[c] > g_small.base + (c + 1) * kClassSpan) throw std::bad_alloc();
  }
  charge(size);
  return block;
}

void counted_free(void* pointer, std::optional<std::size_t> size) {
  if (pointer == nullptr) return;
  auto* p = static_cast<unsigned char*>(pointer);
  if (g_small.base == nullptr || p < g_small.base || p >= g_small.base + kClasses * kClassSpan) {
    std::size_t asked = 0;
    std::memcpy(&asked, p - kPrefix, sizeof asked);
    discharge(asked);
    std::free(p - kPrefix);
    return;
  }
  const std::size_t c = static_cast<std::size_t>(p - g_small.base) / kClassSpan;
  discharge(size.value_or((c + 1) * kGranule));
  std::memcpy(pointer, &g_small.free[c], sizeof(void*));
  g_small.free[c] = pointer;
}

}  // namespace

void* operator new(std::size_t size) { return counted_alloc(size); }
void* operator new[](std::size_t size) { return counted_alloc(size); }
void operator delete(void* pointer) noexcept { counted_free(pointer, std::nullopt); }
void operator delete[](void* pointer) noexcept { counted_free(pointer, std::nullopt); }
void operator delete(void* pointer, std::size_t size) noexcept { counted_free(pointer, size); }
void operator delete[](void* pointer, std::size_t size) noexcept { counted_free(pointer, size); }

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
  int window = 0;  // 0: every connect at t = 0
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
  std::int64_t agents_peak = 0;  // the most the agents held at once, all nodes together
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
    g_agents_peak = g_agents_live;  // --table: each run its own peak
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

  ~Mesh() {
    for (Node& n : nodes_) {
      while (n.head != nullptr) delete std::exchange(n.head, n.head->next);
    }
    while (spare_ != nullptr) delete std::exchange(spare_, spare_->next);
  }
  Mesh(const Mesh&) = delete;
  Mesh& operator=(const Mesh&) = delete;

  ScaleResult run() {
    const auto began = std::chrono::steady_clock::now();
    plan();
    while (auto e = next_event()) {
      now_ = e->at;
      dispatch(*e);
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
    result.agents_peak = g_agents_peak;
    result.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
    return result;
  }

 private:
  enum class Kind : std::uint8_t { connect, mad, timer };
  // Events run in the order of (at, seq); seq numbers them as they were scheduled.
  struct Event {
    Time at{};
    std::uint64_t seq = 0;
    Kind kind = Kind::mad;
    int node = 0;
    int peer = 0;  // connect: the destination; mad: the sender
    std::array<std::uint8_t, w::kMadSize> bytes{};  // mad
  };
  struct Due {  // a node's next event, or a timer
    Time at{};
    std::uint64_t seq = 0;
    int node = 0;
    bool operator>(const Due& other) const { return at != other.at ? at > other.at : seq > other.seq; }
  };
  // A node's CM queue, as events: its application's connects (all asked at t = 0, so they fill
  // its first (N-1) x cm_cost), then the MADs that reach it, each behind the last. Every event a
  // node's queue takes runs after everything already in it, so each queue is a FIFO in time
  // order and the simulation runs the earliest head among N queues (plus the timers), instead of
  // one heap of every MAD in flight. The MADs wait in chunks of kChunk.
  static constexpr std::size_t kChunk = 8;
  struct Chunk {
    std::array<Event, kChunk> events;
    Chunk* next = nullptr;
  };
  struct Node {
    std::unique_ptr<ib::IbCmAgent> agent;
    Time busy_until{};  // the node's CM queue
    std::uint32_t next_qpn = 0;
    std::optional<Time> timer;
    std::vector<std::uint16_t> peers;  // its connects, in its application's order
    std::size_t planned = 0;           // the first `planned` of them fill its queue from t = 0
    std::size_t connects_done = 0;     // of the planned ones
    std::size_t next_peer = 0;         // --window: the next connect to ask for
    std::vector<ib::IbCmId> attempts;  // --window: its connects under way (at most W)
    std::uint64_t first_connect_seq = 0;
    Chunk* head = nullptr;  // its queued MADs: head->events[head_index] .. tail->events[tail_index - 1]
    Chunk* tail = nullptr;
    std::size_t head_index = 0;
    std::size_t tail_index = 0;
  };

  Node& node(int i) { return nodes_[static_cast<std::size_t>(i)]; }

  static bool has_work(const Node& n) { return n.connects_done < n.planned || n.head != nullptr; }
  // The head of node i's queue (has_work).
  Due head_of(int i) {
    Node& n = node(i);
    if (n.connects_done < n.planned) {
      return {.at = Time{} + config_.cm_cost * static_cast<Duration::rep>(n.connects_done + 1),
              .seq = n.first_connect_seq + n.connects_done, .node = i};
    }
    const Event& e = n.head->events[n.head_index];
    return {.at = e.at, .seq = e.seq, .node = i};
  }

  // The simulator's own queues are nobody's memory. `mad` null: a connect to `from`.
  void enqueue(int target, Time at, int from, const ib::OutboundMad* mad) {
    const std::uint32_t charged = g_node;
    g_node = kMaxCounted;
    Node& n = node(target);
    const bool idle = !has_work(n);
    if (n.tail == nullptr || n.tail_index == kChunk) {
      Chunk* chunk = spare_;
      if (chunk != nullptr) {
        spare_ = chunk->next;
        chunk->next = nullptr;
      } else {
        chunk = new Chunk;
      }
      if (n.tail == nullptr) {
        n.head = chunk;
        n.head_index = 0;
      } else {
        n.tail->next = chunk;
      }
      n.tail = chunk;
      n.tail_index = 0;
    }
    Event& e = n.tail->events[n.tail_index++];
    e.at = at;
    e.seq = seq_++;
    e.kind = mad != nullptr ? Kind::mad : Kind::connect;
    e.node = target;
    e.peer = from;
    if (mad != nullptr) e.bytes = mad->bytes;
    if (idle) ready_.push(head_of(target));
    g_node = charged;
  }

  void schedule_timer(int i, Time at) {
    const std::uint32_t charged = g_node;
    g_node = kMaxCounted;
    timers_.push({.at = at, .seq = seq_++, .node = i});
    g_node = charged;
  }

  // The earliest event: a node's head or a timer, by (at, seq).
  std::optional<Event> next_event() {
    const bool from_timers = !timers_.empty() && (ready_.empty() || ready_.top() > timers_.top());
    if (from_timers) {
      const Due due = timers_.top();
      timers_.pop();
      return Event{.at = due.at, .seq = due.seq, .kind = Kind::timer, .node = due.node};
    }
    if (ready_.empty()) return std::nullopt;
    const Due due = ready_.top();
    ready_.pop();
    Node& n = node(due.node);
    std::optional<Event> e;
    if (n.connects_done < n.planned) {
      e = Event{.at = due.at, .seq = due.seq, .kind = Kind::connect, .node = due.node,
                .peer = n.peers[n.connects_done++]};
    } else {
      e = n.head->events[n.head_index++];
      if (n.head == n.tail && n.head_index == n.tail_index) {
        n.head->next = spare_;
        spare_ = n.head;
        n.head = n.tail = nullptr;
        n.head_index = n.tail_index = 0;
      } else if (n.head_index == kChunk) {
        Chunk* done = n.head;
        n.head = done->next;
        n.head_index = 0;
        done->next = spare_;
        spare_ = done;
      }
    }
    if (has_work(n)) ready_.push(head_of(due.node));
    return e;
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
      // Each application asks for its peers in its own order, at once: its CM takes one connect
      // after the other.
      for (std::size_t i = peers.size(); i > 1; --i) std::swap(peers[i - 1], peers[rng_.next() % i]);
      Node& n = node(a);
      n.peers.assign(peers.begin(), peers.end());
      n.planned = config_.window > 0 ? std::min(peers.size(), static_cast<std::size_t>(config_.window)) : peers.size();
      n.next_peer = n.planned;
      n.attempts.reserve(n.planned);
      n.first_connect_seq = seq_;
      seq_ += n.planned;
      n.busy_until = Time{} + config_.cm_cost * static_cast<Duration::rep>(n.planned);
      if (has_work(n)) ready_.push(head_of(a));
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
        auto attempt = n.agent->connect(params, now_);
        if (config_.window > 0) {
          if (attempt) {
            n.attempts.push_back(*attempt);
          } else {
            ask_next(e.node);  // EALREADY / EISCONN: the pair is being or is connected
          }
        }
        break;
      }
      case Kind::mad:
        n.agent->handle_mad(w::ipv4_mapped_gid(address(e.peer)), e.bytes, now_);
        break;
      case Kind::timer:
        if (n.timer == e.at) n.timer.reset();
        if (auto d = n.agent->next_deadline(); d && *d <= now_) n.agent->handle_timeout(now_);
        break;
    }
    pump(e.node);
    g_node = kMaxCounted;
  }

  // --window: one of node i's own connects ended; its application asks for the next peer.
  void attempt_ended(int i, ib::IbCmId id) {
    Node& n = node(i);
    const auto found = std::find(n.attempts.begin(), n.attempts.end(), id);
    if (found == n.attempts.end()) return;  // an accepted request's id, not a connect of its own
    *found = n.attempts.back();
    n.attempts.pop_back();
    ask_next(i);
  }

  void ask_next(int i) {
    Node& n = node(i);
    if (n.next_peer == n.peers.size()) return;
    const int peer = n.peers[n.next_peer++];
    enqueue(i, queue_at(i, now_), peer, nullptr);
  }

  void pump(int i) {
    Node& n = node(i);
    while (auto mad = n.agent->poll_mad()) {
      ++mads_;
      const auto to = w::ipv4_of_gid(mad->destination);
      if (!to) continue;
      const int target = index_of(*to);
      enqueue(target, queue_at(target, now_ + config_.latency), i, &*mad);
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
          attempt_ended(i, event->id);
          break;
        case ib::IbCmAgentEvent::Kind::rejected:
        case ib::IbCmAgentEvent::Kind::unreachable:
        case ib::IbCmAgentEvent::Kind::connect_error:
          ++failed_;
          attempt_ended(i, event->id);
          break;
        default:
          break;
      }
    }
    // Only deadlines before the mesh could matter; the agents' own retries are what counts.
    if (auto d = n.agent->next_deadline(); d && (!n.timer || *d < *n.timer)) {
      n.timer = *d;
      schedule_timer(i, *d);
    }
  }

  ScaleConfig config_;
  Rng rng_;
  std::vector<Node> nodes_;
  std::priority_queue<Due, std::vector<Due>, std::greater<>> ready_;   // the nodes with work, by their head
  std::priority_queue<Due, std::vector<Due>, std::greater<>> timers_;
  Chunk* spare_ = nullptr;  // emptied chunks, for reuse
  Time now_{};
  std::uint64_t seq_ = 0;
  std::uint64_t wanted_ = 0;
  std::uint64_t established_ends_ = 0;
  Time last_established_{};
  std::uint64_t mads_ = 0;
  std::uint64_t failed_ = 0;
};

std::string pattern_name(const ScaleConfig& config) {
  std::string name;
  switch (config.pattern) {
    case ScaleConfig::Pattern::both: name = "full mesh, both ends ask"; break;
    case ScaleConfig::Pattern::one: name = "full mesh, lower rank asks"; break;
    case ScaleConfig::Pattern::ring: name = fmt::format("ring, {} neighbours each side, both ask", config.ring); break;
  }
  if (config.window > 0) name += fmt::format(", {} at a time", config.window);
  return name;
}

void print_row(const ScaleConfig& config, const ScaleResult& r) {
  const double per = r.connections == 0 ? 0 : 1.0 / static_cast<double>(r.connections);
  const double ends = 2.0 * static_cast<double>(std::max<std::uint64_t>(r.connections, 1));
  fmt::print("| {} | {} | {} of {} | {:.1f} ms | {:.2f} | {:.3f} | {:.0f} KiB ({:.0f} B per connection end) | {:.0f} B "
             "| {:.1f} s |\n",
             config.nodes, pattern_name(config), r.connections, r.wanted,
             std::chrono::duration<double, std::milli>(r.time_to_mesh).count(), static_cast<double>(r.mads) * per,
             static_cast<double>(r.bound) * per, r.bytes_per_node / 1024.0,
             r.bytes_per_node * static_cast<double>(config.nodes) / ends, static_cast<double>(r.agents_peak) / ends,
             r.wall_seconds);
  std::fflush(stdout);
}

void print_header() {
  fmt::print("| nodes | pattern | connections | time to mesh | CM MADs per connection | collisions per connection | "
             "agent memory per node | agents at their peak, per connection end | wall time |\n"
             "|---|---|---|---|---|---|---|---|---|\n");
}

[[noreturn]] void usage() {
  std::fputs("usage: p2p_scale [--table] [--nodes N] [--pattern both|one|ring:K] [--window W] [--latency-us U] "
             "[--cm-cost-us U] [--seed S]\n",
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
    } else if (arg == "--window") {
      config.window = std::atoi(value().c_str());
      if (config.window < 1) usage();
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
    int ring = 0;
    int window = 0;
  };
  // The 4,096-node full mesh (--nodes 4096 --window 16: ≈ 14 GiB, about an hour) is run alone.
  for (const Row row : {Row{256, ScaleConfig::Pattern::both}, Row{256, ScaleConfig::Pattern::one},
                        Row{256, ScaleConfig::Pattern::both, 0, 16}, Row{512, ScaleConfig::Pattern::both},
                        Row{1024, ScaleConfig::Pattern::both}, Row{1024, ScaleConfig::Pattern::one},
                        Row{1024, ScaleConfig::Pattern::both, 0, 16}, Row{2048, ScaleConfig::Pattern::both},
                        Row{4096, ScaleConfig::Pattern::ring, 16}, Row{4096, ScaleConfig::Pattern::ring, 64}}) {
    ScaleConfig c = config;
    c.nodes = row.nodes;
    c.pattern = row.pattern;
    c.ring = row.ring;
    c.window = row.window;
    const ScaleResult result = Mesh(c).run();
    print_row(c, result);
    if (result.connections != result.wanted || result.failed != 0) status = 1;
  }
  return status;
}
