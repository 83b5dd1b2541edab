// The IB CM p2p simulation behind run_ibcm_simulation(): a seeded event loop over IbCmAgents.
// Phases: chaos (loss, duplicates, simultaneous connects, app rejects and slow answers, closes,
// a crash and restart), a final round without loss in which every pair connects every tag from
// both sides, then a teardown that closes everything. Properties are in ibcm_sim.hpp.
#include "ibcm_sim.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <queue>
#include <vector>

#include "core/ibcm/ibcm_agent.hpp"

namespace peercm::core::ibcm::sim {
namespace {

using namespace std::chrono_literals;
namespace w = wire::ibcm;
using EventKind = IbCmAgentEvent::Kind;

constexpr std::uint16_t kPort = 7471;

class Rng {
 public:
  explicit Rng(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next() {
    std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  int between(int lo, int hi) { return lo + static_cast<int>(next() % static_cast<std::uint64_t>(hi - lo + 1)); }
  bool percent(int p) { return static_cast<int>(next() % 100) < p; }
  Duration upto(Duration max) {
    return max.count() <= 0 ? Duration::zero() : Duration{static_cast<Duration::rep>(next() % static_cast<std::uint64_t>(max.count() + 1))};
  }

 private:
  std::uint64_t state_;
};

enum class Phase : std::uint8_t { chaos, final_round, teardown };
enum class Ev : std::uint8_t { mad, timer, connect, answer, close, crash, restart };

struct SimEvent {
  Time at{};
  std::uint64_t seq = 0;
  Ev kind = Ev::mad;
  int node = 0;
  std::uint32_t epoch = 0;
  int peer = 0;
  std::uint32_t tag = 0;
  IbCmId id = 0;
  bool accept = true;
  int from = 0;
  std::shared_ptr<const OutboundMad> mad;
};

struct Later {
  bool operator()(const SimEvent& a, const SimEvent& b) const { return a.at != b.at ? a.at > b.at : a.seq > b.seq; }
};

struct AppRec {
  bool active = false;
  int peer = 0;
  std::uint32_t tag = 0;
  bool established = false;
  Time deadline{};
  std::uint32_t local_comm = 0;
  std::uint32_t peer_comm = 0;
};

struct Node {
  std::unique_ptr<IbCmAgent> agent;
  bool up = true;
  std::uint32_t epoch = 1;
  std::uint64_t guid = 0;
  std::uint32_t next_qpn = 0;
  std::optional<Time> timer;
  std::map<IbCmId, AppRec> ids;
};

class World {
 public:
  World(std::uint64_t seed, const IbSimConfig& config) : seed_(seed), config_(config), rng_(seed) {
    nodes_count_ = config.nodes > 0 ? config.nodes : rng_.between(2, 4);
    tags_ = static_cast<std::uint32_t>(rng_.between(1, 2));
    max_delay_ = Duration{rng_.between(100, 4000) * 1000};  // 0.1 to 4 ms, within the lifetime
    loss_ = rng_.percent(70) ? rng_.between(0, 10) : 0;
    dup_ = rng_.percent(60) ? rng_.between(0, 10) : 0;
    simultaneous_ = rng_.between(30, 90);
    reject_ = rng_.percent(50) ? rng_.between(0, 20) : 0;
    slow_ = rng_.percent(50) ? rng_.between(0, 30) : 0;
    silent_ = rng_.percent(20) ? rng_.between(0, 10) : 0;
    close_ = rng_.between(0, 50);
    crashes_ = rng_.percent(40) ? 1 : 0;
    shared_guid_ = rng_.percent(20);
    timing_ = {.packet_lifetime = 10, .cm_response_timeout = 12, .max_cm_retries = 4, .service_timeout = 14,
               .timewait = 13};
    for (int i = 0; i < nodes_count_; ++i) {
      nodes_.emplace_back();
      nodes_.back().guid = shared_guid_ ? 0x5000 : 0x5000 + rng_.next() % 0x1000;
      open(i);
    }
  }

  IbSimResult run() {
    const Duration chaos = Duration{rng_.between(20, 200) * 1000000};
    const int connects = rng_.between(2, 12);
    for (int i = 0; i < connects; ++i) {
      const int a = rng_.between(0, nodes_count_ - 1);
      int b = rng_.between(0, nodes_count_ - 2);
      if (b >= a) ++b;
      const std::uint32_t tag = static_cast<std::uint32_t>(rng_.between(0, static_cast<int>(tags_) - 1));
      const Time at = now_ + rng_.upto(chaos);
      schedule({.at = at, .kind = Ev::connect, .node = a, .peer = b, .tag = tag});
      if (rng_.percent(simultaneous_)) {
        schedule({.at = at + (rng_.percent(50) ? Duration::zero() : rng_.upto(max_delay_)), .kind = Ev::connect,
                  .node = b, .peer = a, .tag = tag});
      }
    }
    for (int i = 0; i < crashes_; ++i) {
      schedule({.at = now_ + rng_.upto(chaos), .kind = Ev::crash, .node = rng_.between(0, nodes_count_ - 1),
                .id = static_cast<IbCmId>(rng_.between(1, 300))});  // downtime in ms
    }
    if (!run_until_quiet()) return finish();
    check_quiet_state("after chaos");
    if (!result_.ok) return finish();

    // Final round: no loss; every pair asks for every tag from both sides.
    phase_ = Phase::final_round;
    loss_ = 0;
    for (int a = 0; a < nodes_count_; ++a) {
      for (int b = a + 1; b < nodes_count_; ++b) {
        for (std::uint32_t tag = 0; tag < tags_; ++tag) {
          const Time at = now_ + rng_.upto(2ms);
          schedule({.at = at, .kind = Ev::connect, .node = a, .peer = b, .tag = tag});
          schedule({.at = at + (rng_.percent(50) ? Duration::zero() : rng_.upto(max_delay_)), .kind = Ev::connect,
                    .node = b, .peer = a, .tag = tag});
        }
      }
    }
    if (!run_until_quiet()) return finish();
    check_quiet_state("after the final round");
    check_final_round();
    if (!result_.ok) return finish();

    // Teardown: every node closes everything; then nothing may remain.
    phase_ = Phase::teardown;
    for (int n = 0; n < nodes_count_; ++n) {
      std::vector<IbCmId> ids;
      for (const auto& [id, rec] : node(n).ids) {
        if (rec.established) ids.push_back(id);
      }
      for (IbCmId id : ids) close(n, id);
    }
    if (!run_until_quiet()) return finish();
    check_no_leak();
    return finish();
  }

 private:
  Node& node(int i) { return nodes_[static_cast<std::size_t>(i)]; }
  static Ipv4Address address(int i) { return {10, 0, 0, static_cast<std::uint8_t>(i + 1)}; }
  static int index_of(const Ipv4Address& a) { return a[3] - 1; }

  void open(int i) {
    Node& n = node(i);
    IbCmAgentConfig config{.identity = {.guid = n.guid, .incarnation = rng_.next() | 1},
                           .address = address(i),
                           .timing = timing_,
                           .connect_timeout = 300ms,
                           .first_comm_id = static_cast<std::uint32_t>(rng_.next()),
                           .tid_high = static_cast<std::uint32_t>(i + 1)};
    n.agent = std::make_unique<IbCmAgent>(config);
    n.agent->listen(kPort);
    n.up = true;
    n.next_qpn = static_cast<std::uint32_t>(rng_.between(0x100, 0x400000));
    n.timer.reset();
  }

  void schedule(SimEvent e) {
    e.seq = seq_++;
    queue_.push(std::move(e));
  }

  bool run_until_quiet() {
    while (!queue_.empty()) {
      SimEvent e = queue_.top();
      queue_.pop();
      now_ = std::max(now_, e.at);
      ++result_.stats.events;
      if (result_.stats.events > 2'000'000) {
        violation("no quiescence (event budget exhausted)");
        return false;
      }
      dispatch(e);
      if (!result_.ok) return false;
    }
    return true;
  }

  void dispatch(const SimEvent& e) {
    switch (e.kind) {
      case Ev::mad: {
        Node& n = node(e.node);
        if (!n.up) return;
        n.agent->handle_mad(w::ipv4_mapped_gid(address(e.from)), e.mad->bytes, now_);
        break;
      }
      case Ev::timer: {
        Node& n = node(e.node);
        if (!n.up || n.epoch != e.epoch) return;
        if (n.timer == e.at) n.timer.reset();
        if (auto d = n.agent->next_deadline(); d && *d <= now_) n.agent->handle_timeout(now_);
        break;
      }
      case Ev::connect: connect(e.node, e.peer, e.tag); break;
      case Ev::answer: answer(e); break;
      case Ev::close:
        if (!node(e.node).up || node(e.node).epoch != e.epoch) return;
        close(e.node, e.id);
        break;
      case Ev::crash: crash(e.node, Duration{std::chrono::milliseconds(e.id)}); return;
      case Ev::restart: {
        Node& n = node(e.node);
        if (n.up || n.epoch != e.epoch) return;
        ++n.epoch;
        open(e.node);
        trace("n{}#{}: RESTART", e.node, n.epoch);
        break;
      }
    }
    pump(e.node);
  }

  void connect(int a, int b, std::uint32_t tag) {
    Node& n = node(a);
    if (!n.up) return;
    IbCmConnectParams params{.destination = address(b), .port = kPort, .tag = tag, .peer_to_peer = true,
                             .qpn = n.next_qpn++, .starting_psn = static_cast<std::uint32_t>(rng_.next() & 0xFFFFFF)};
    auto id = n.agent->connect(params, now_);
    if (!id) {
      trace("n{}: connect to n{} tag {}: {}", a, b, tag, std::make_error_code(id.error()).message());
      return;
    }
    ++result_.stats.attempts;
    trace("n{}: connect c{} to n{} tag {} qpn {:#x}", a, *id, b, tag, params.qpn);
    n.ids[*id] = AppRec{.active = true, .peer = b, .tag = tag, .deadline = now_ + 300ms};
    pump(a);
  }

  void answer(const SimEvent& e) {
    Node& n = node(e.node);
    if (!n.up || n.epoch != e.epoch) return;
    auto it = n.ids.find(e.id);
    if (it == n.ids.end()) return;
    if (e.accept) {
      const auto status = n.agent->accept(e.id, {.qpn = n.next_qpn++}, now_);
      trace("n{}: accept c{}: {}", e.node, e.id, status ? "ok" : "EINVAL");
    } else {
      const auto status = n.agent->reject(e.id, {}, now_);
      trace("n{}: reject c{}: {}", e.node, e.id, status ? "ok" : "EINVAL");
      if (status) n.ids.erase(it);
    }
  }

  void close(int i, IbCmId id) {
    Node& n = node(i);
    auto it = n.ids.find(id);
    if (it == n.ids.end() || !it->second.established) return;
    if (!n.agent->disconnect(id, now_)) return;
    trace("n{}: close c{}", i, id);
    it->second.established = false;
    const AppRec rec = it->second;
    pump(i);
    if (phase_ == Phase::chaos && rng_.percent(30)) {
      schedule({.at = now_ + rng_.upto(max_delay_), .kind = Ev::connect, .node = i, .peer = rec.peer, .tag = rec.tag});
    }
  }

  void crash(int i, Duration downtime) {
    Node& n = node(i);
    if (!n.up) return;
    trace("n{}#{}: CRASH for {}ms", i, n.epoch, std::chrono::duration_cast<std::chrono::milliseconds>(downtime).count());
    ++result_.stats.crashes;
    collect_stats(*n.agent);
    n.agent.reset();
    n.up = false;
    n.ids.clear();
    n.timer.reset();
    schedule({.at = now_ + downtime, .kind = Ev::restart, .node = i, .epoch = n.epoch});
  }

  // Moves a node's outputs on: MADs onto the network, events to its application.
  void pump(int i) {
    Node& n = node(i);
    if (!n.up) return;
    while (auto mad = n.agent->poll_mad()) {
      const auto to = w::ipv4_of_gid(mad->destination);
      if (!to) continue;
      const int target = index_of(*to);
      if (target < 0 || target >= nodes_count_) continue;
      if ((mad->bytes[16] << 8 | mad->bytes[17]) == static_cast<int>(w::CmAttribute::mra)) ++result_.stats.mras;
      if (rng_.percent(loss_)) continue;
      auto shared = std::make_shared<const OutboundMad>(*mad);
      const int copies = rng_.percent(dup_) ? 2 : 1;
      for (int c = 0; c < copies; ++c) {
        schedule({.at = now_ + rng_.upto(max_delay_), .kind = Ev::mad, .node = target, .from = i, .mad = shared});
      }
    }
    while (auto event = n.agent->poll_event()) on_event(i, *event);
    if (!result_.ok) return;
    if (auto d = n.agent->next_deadline(); d && (!n.timer || *d < *n.timer)) {
      n.timer = std::max(*d, now_);
      schedule({.at = *n.timer, .kind = Ev::timer, .node = i, .epoch = n.epoch});
    }
  }

  void on_event(int i, const IbCmAgentEvent& e) {
    Node& n = node(i);
    switch (e.kind) {
      case EventKind::connect_request: {
        const int peer = index_of(e.peer_address);
        n.ids[e.id] = AppRec{.active = false, .peer = peer, .tag = e.tag};
        trace("n{}: CONNECT_REQUEST c{} from n{} tag {}", i, e.id, peer, e.tag);
        const bool chaos = phase_ == Phase::chaos;
        if (chaos && rng_.percent(silent_)) return;  // never answered: the MRA promise runs out
        const bool accept = !chaos || !rng_.percent(reject_);
        const Duration delay = rng_.percent(slow_) ? Duration{rng_.between(10, 40) * 1000000} : rng_.upto(2ms);
        schedule({.at = now_ + delay, .kind = Ev::answer, .node = i, .epoch = n.epoch, .id = e.id, .accept = accept});
        return;
      }
      case EventKind::established: {
        auto it = n.ids.find(e.id);
        if (it == n.ids.end()) {
          violation(fmt::format("n{}: ESTABLISHED on c{}, which the application does not know", i, e.id));
          return;
        }
        AppRec& rec = it->second;
        if (rec.active && now_ > rec.deadline) {
          violation(fmt::format("n{}: attempt c{} established after its deadline", i, e.id));
        }
        rec.established = true;
        rec.local_comm = e.local_comm_id;
        rec.peer_comm = e.peer.comm_id;
        ++result_.stats.established;
        trace("n{}: c{} ESTABLISHED (comm {:#x} <-> {:#x})", i, e.id, rec.local_comm, rec.peer_comm);
        int count = 0;
        for (const auto& [id, other] : n.ids) count += other.established && other.peer == rec.peer && other.tag == rec.tag;
        if (count > 1) {
          violation(fmt::format("uniqueness: n{} holds {} connections to n{} tag {}", i, count, rec.peer, rec.tag));
          return;
        }
        if (phase_ == Phase::chaos && rng_.percent(close_)) {
          schedule({.at = now_ + (rng_.percent(30) ? Duration::zero() : Duration{rng_.between(0, 100) * 1000000}),
                    .kind = Ev::close, .node = i, .epoch = n.epoch, .id = e.id});
        }
        return;
      }
      case EventKind::rejected:
      case EventKind::unreachable:
      case EventKind::connect_error: {
        auto it = n.ids.find(e.id);
        if (it == n.ids.end()) return;
        if (it->second.active) {
          ++result_.stats.failed;
          if (now_ > it->second.deadline) {
            violation(fmt::format("liveness: n{} attempt c{} ended after its deadline", i, e.id));
          }
        }
        trace("n{}: c{} ends ({})", i, e.id, static_cast<int>(e.kind));
        n.ids.erase(it);
        return;
      }
      case EventKind::disconnected: {
        trace("n{}: c{} DISCONNECTED", i, e.id);
        if (auto it = n.ids.find(e.id); it != n.ids.end()) it->second.established = false;
        return;
      }
      case EventKind::timewait_exit:
        n.ids.erase(e.id);
        return;
    }
  }

  // At quiescence: every attempt has ended, every delivered request has been answered.
  void check_quiet_state(const char* when) {
    for (int i = 0; i < nodes_count_ && result_.ok; ++i) {
      for (const auto& [id, rec] : node(i).ids) {
        if (!rec.established) {
          violation(fmt::format("liveness {}: n{} c{} ({}) neither established nor ended", when, i, id,
                                rec.active ? "attempt" : "request"));
          return;
        }
      }
    }
  }

  // Every pair asked for every tag: exactly one connection each, and both ends agree on it.
  void check_final_round() {
    for (int a = 0; a < nodes_count_ && result_.ok; ++a) {
      for (int b = 0; b < nodes_count_ && result_.ok; ++b) {
        if (a == b) continue;
        for (std::uint32_t tag = 0; tag < tags_; ++tag) {
          const AppRec* mine = nullptr;
          int count = 0;
          for (const auto& [id, rec] : node(a).ids) {
            if (rec.established && rec.peer == b && rec.tag == tag) {
              ++count;
              mine = &rec;
            }
          }
          if (count != 1) {
            violation(fmt::format("liveness: n{} holds {} connections to n{} tag {} after the final round", a, count, b, tag));
            return;
          }
          bool mirrored = false;
          for (const auto& [id, rec] : node(b).ids) {
            mirrored |= rec.established && rec.peer == a && rec.tag == tag && rec.local_comm == mine->peer_comm &&
                        rec.peer_comm == mine->local_comm;
          }
          if (!mirrored) {
            violation(fmt::format("integrity: n{}'s connection to n{} tag {} (comm {:#x} <-> {:#x}) has no mirror", a, b,
                                  tag, mine->local_comm, mine->peer_comm));
            return;
          }
        }
      }
    }
  }

  void check_no_leak() {
    for (int i = 0; i < nodes_count_ && result_.ok; ++i) {
      const IbCmAgent& agent = *node(i).agent;
      if (!node(i).ids.empty() || agent.connection_count() != 0 || agent.id_count() != 0 ||
          agent.pending_request_count() != 0 || agent.next_deadline() || agent.resolver().tracked_links() != 0 ||
          agent.resolver().tracked_attempts() != 0) {
        violation(fmt::format("no leak: n{} keeps app ids {} connections {} ids {} pending {} timer {} links {} attempts {}",
                              i, node(i).ids.size(), agent.connection_count(), agent.id_count(),
                              agent.pending_request_count(), agent.next_deadline().has_value(),
                              agent.resolver().tracked_links(), agent.resolver().tracked_attempts()));
      }
    }
  }

  void collect_stats(const IbCmAgent& agent) {
    result_.stats.bound += agent.stats().p2p_bound;
    result_.stats.dropped += agent.stats().p2p_dropped;
    result_.stats.duplicates += agent.stats().p2p_duplicates;
    result_.stats.replaced += agent.resolver().stats().replaced_restarted + agent.resolver().stats().replaced_stale;
  }

  IbSimResult finish() {
    for (int i = 0; i < nodes_count_; ++i) {
      if (node(i).up) collect_stats(*node(i).agent);
    }
    return std::move(result_);
  }

  void violation(std::string what) {
    if (!result_.ok) return;
    result_.ok = false;
    result_.violation = fmt::format("at {:.3f} ms: {}", static_cast<double>(now_.time_since_epoch().count()) / 1e6, what);
  }

  template <class... Args>
  void trace(fmt::format_string<Args...> format, Args&&... args) {
    if (!config_.verbose) return;
    auto out = std::back_inserter(result_.trace);
    fmt::format_to(out, "{:10.3f}ms  ", static_cast<double>(now_.time_since_epoch().count()) / 1e6);
    fmt::format_to(out, format, std::forward<Args>(args)...);
    result_.trace.push_back('\n');
  }

  std::uint64_t seed_;
  IbSimConfig config_;
  Rng rng_;
  int nodes_count_ = 2;
  std::uint32_t tags_ = 1;
  Duration max_delay_{};
  int loss_ = 0;
  int dup_ = 0;
  int simultaneous_ = 0;
  int reject_ = 0;
  int slow_ = 0;
  int silent_ = 0;
  int close_ = 0;
  int crashes_ = 0;
  bool shared_guid_ = false;
  IbCmTiming timing_;
  Phase phase_ = Phase::chaos;
  Time now_ = Time{} + 1s;
  std::uint64_t seq_ = 0;
  std::priority_queue<SimEvent, std::vector<SimEvent>, Later> queue_;
  std::vector<Node> nodes_;
  IbSimResult result_;
};

}  // namespace

IbSimResult run_ibcm_simulation(std::uint64_t seed, const IbSimConfig& config) {
  World world(seed, config);
  return world.run();
}

}  // namespace peercm::core::ibcm::sim
