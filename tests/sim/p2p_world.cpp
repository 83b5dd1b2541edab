// The simulated world: what a seed picks, the three phases of a run, the event loop with its
// virtual clock, and the message-level network (random delay per message, FIFO per link
// direction, reordered across links).
#include <algorithm>
#include <chrono>

#include "p2p_model.hpp"

namespace peercm::sim {

using namespace std::chrono_literals;

namespace {

// A run that has not gone quiet after this many events is a livelock.
constexpr std::uint64_t kMaxEvents = 200'000;

Scenario pick_scenario(Rng& rng, const SimConfig& config) {
  static constexpr Duration kDelays[] = {0us, 50us, 5ms, 50ms, 150ms};
  static constexpr unsigned kPercents[] = {0, 30, 70, 100};
  Scenario s;
  s.nodes = config.nodes != 0 ? config.nodes : rng.between(2, 6);
  s.tags = static_cast<std::uint32_t>(rng.between(1, 2));
  s.max_delay = kDelays[rng.between(0, 4)];
  s.timeout = 1s;  // > the longest resolution: 4 message delays plus the app's answer
  s.chaos = rng.between(0, 3000) * 1ms;
  s.connects = rng.between(1, 3 * s.nodes);
  s.simultaneous_percent = kPercents[rng.between(0, 3)];
  s.app_reject_percent = rng.percent(70) ? 0 : 10;
  s.close_percent = kPercents[rng.between(0, 2)];
  s.reconnect_percent = kPercents[rng.between(0, 3)];
  s.crashes = rng.percent(60) ? 0 : rng.between(1, 2);
  s.shared_guids = rng.percent(30);
  s.responder_established_on_reply = rng.percent(50);
  s.take_unseen_percent = kPercents[rng.between(0, 3)];
  return s;
}

}  // namespace

World::World(std::uint64_t seed, const SimConfig& config)
    : seed_(seed),
      config_(config),
      rng_(seed),
      scenario_(pick_scenario(rng_, config)),
      network_(rng_, Faults{.max_delay = scenario_.max_delay}) {
  nodes_.resize(static_cast<std::size_t>(scenario_.nodes));
  const bool two_guids = rng_.percent(50);
  for (std::size_t i = 0; i < nodes_.size(); ++i) {
    Node& node = nodes_[i];
    node.id.guid = scenario_.shared_guids ? 0x1000 + (two_guids ? i % 2 : 0) : rng_.next();
    // Random order, unique within the run (the low bits count).
    node.id.incarnation = (rng_.next() << 16) | (++incarnation_counter_ & 0xFFFF);
    node.resolver.emplace(node.id);
  }
  queue_.reserve(256);
  links_.reserve(64);
}

SimResult World::run() {
  trace("seed {}: {} nodes, {} tag(s), delays 0..{}us, timeout {}ms, chaos {}ms, {} connects "
        "({}% simultaneous), app reject {}%, close {}%, reconnect {}%, {} crash(es){}, responder "
        "ESTABLISHED on {}",
        seed_, scenario_.nodes, scenario_.tags,
        std::chrono::duration_cast<std::chrono::microseconds>(scenario_.max_delay).count(),
        std::chrono::duration_cast<std::chrono::milliseconds>(scenario_.timeout).count(),
        std::chrono::duration_cast<std::chrono::milliseconds>(scenario_.chaos).count(),
        scenario_.connects, scenario_.simultaneous_percent, scenario_.app_reject_percent,
        scenario_.close_percent, scenario_.reconnect_percent, scenario_.crashes,
        scenario_.shared_guids ? ", shared GUIDs" : "",
        scenario_.responder_established_on_reply ? "its Reply" : "the RTR");
  for (std::size_t i = 0; i < nodes_.size(); ++i) {
    trace("{}: address 10.0.0.{} port {} guid {:#x} incarnation {:#x}", name(static_cast<int>(i)),
          i + 1, port_of(static_cast<int>(i)), nodes_[i].id.guid, nodes_[i].id.incarnation);
  }

  // Phase 1: simultaneous connects, closes, crashes and restarts, until everything settled.
  trace("--- chaos phase");
  plan_chaos();
  if (run_until_quiet()) check_attempt_liveness();
  if (result_.ok) check_quiescent("after the chaos phase");

  // Phase 2: every node up, no faults: pairs that ask must end with exactly one connection.
  if (result_.ok) {
    trace("--- final round");
    phase_ = Phase::final_round;
    plan_final_round();
    if (run_until_quiet()) check_final_round();
    if (result_.ok) check_quiescent("after the final round");
  }

  // Phase 3: the applications close everything; nothing may stay behind.
  if (result_.ok) {
    trace("--- teardown");
    phase_ = Phase::teardown;
    close_everything();
    if (run_until_quiet()) check_no_leak();
    if (result_.ok) check_integrity();
  }

  for (const Node& node : nodes_) {
    const auto& stats = node.resolver->stats();
    result_.stats.collisions += stats.collisions_lost;
    result_.stats.rejected_duplicate += stats.rejected_duplicate;
    result_.stats.replaced += stats.replaced_restarted + stats.replaced_stale;
    result_.stats.timed_out += stats.attempts_timed_out;
  }
  result_.stats.attempts = attempts_.size();
  result_.stats.established = static_cast<std::uint64_t>(std::count_if(
      attempts_.begin(), attempts_.end(),
      [](const AttemptRecord& a) { return a.outcome == Outcome::established; }));
  result_.stats.work_requests = work_request_done_.size();
  return std::move(result_);
}

// ---------------------------------------------------------------------------------------------
// Planning

void World::plan_chaos() {
  const auto chaos_ms = static_cast<int>(scenario_.chaos / 1ms);
  for (int i = 0; i < scenario_.connects; ++i) {
    const int a = rng_.between(0, scenario_.nodes - 1);
    int b = rng_.between(0, scenario_.nodes - 2);
    if (b >= a) ++b;
    const auto tag = static_cast<std::uint32_t>(rng_.between(0, static_cast<int>(scenario_.tags) - 1));
    // Whole milliseconds: independent connects meet at the same instant now and then.
    const Time at = Time{} + rng_.between(0, chaos_ms) * 1ms;
    schedule({.at = at, .kind = EventKind::app_connect, .node = a, .peer = b, .tag = tag});
    if (rng_.percent(scenario_.simultaneous_percent)) {
      // The peer connects too: at the very same instant, or while the first request travels.
      const Time mirror = rng_.percent(50) ? at : at + delay();
      schedule({.at = mirror, .kind = EventKind::app_connect, .node = b, .peer = a, .tag = tag});
    }
  }
  for (int i = 0; i < scenario_.crashes; ++i) {
    // Down for longer than a message can travel: a restarted node never races its previous
    // incarnation's messages (incarnations are random, so nothing could order them).
    const Duration downtime = scenario_.max_delay + 1us +
                              rng_.between(0, static_cast<int>(2 * scenario_.timeout / 1ms)) * 1ms;
    schedule({.at = Time{} + rng_.between(0, chaos_ms) * 1ms,
              .kind = EventKind::crash,
              .node = rng_.between(0, scenario_.nodes - 1),
              .downtime = downtime});
  }
}

void World::plan_final_round() {
  const int pairs = rng_.between(1, scenario_.nodes);
  for (int i = 0; i < pairs; ++i) {
    const int a = rng_.between(0, scenario_.nodes - 1);
    int b = rng_.between(0, scenario_.nodes - 2);
    if (b >= a) ++b;
    const auto tag = static_cast<std::uint32_t>(rng_.between(0, static_cast<int>(scenario_.tags) - 1));
    const Time at = now_ + delay();
    const int mode = rng_.between(0, 2);  // a asks, b asks, or both at once
    if (mode != 1) schedule({.at = at, .kind = EventKind::app_connect, .node = a, .peer = b, .tag = tag});
    if (mode != 0) schedule({.at = at, .kind = EventKind::app_connect, .node = b, .peer = a, .tag = tag});
    asked_.emplace_back(std::min(a, b), std::max(a, b), tag);
  }
}

void World::close_everything() {
  for (std::size_t i = 0; i < nodes_.size(); ++i) {
    std::vector<AttemptId> established;
    for (const auto& [number, cmid] : nodes_[i].cmids) established.push_back(number);
    for (AttemptId number : established) {
      app_close({.at = now_, .kind = EventKind::app_close, .node = static_cast<int>(i),
                 .epoch = nodes_[i].epoch, .cmid = number});
    }
  }
}

// ---------------------------------------------------------------------------------------------
// The event loop

void World::schedule(Event event) {
  event.seq = next_seq_++;
  queue_.push_back(event);
  std::push_heap(queue_.begin(), queue_.end(), EventLater{});
}

bool World::run_until_quiet() {
  while (!queue_.empty() && result_.ok) {
    std::pop_heap(queue_.begin(), queue_.end(), EventLater{});
    const Event event = queue_.back();
    queue_.pop_back();
    now_ = event.at;
    if (++result_.stats.events > kMaxEvents) {
      violation(fmt::format("no quiescence after {} events (livelock)", kMaxEvents));
      break;
    }
    dispatch(event);
  }
  return result_.ok;
}

void World::dispatch(const Event& event) {
  switch (event.kind) {
    case EventKind::message: on_message(event); return;
    case EventKind::unreachable: on_unreachable(event); return;
    case EventKind::timer: on_timer(event); return;
    case EventKind::app_connect: app_connect(event.node, event.peer, event.tag); return;
    case EventKind::app_answer: app_answer(event); return;
    case EventKind::app_close: app_close(event); return;
    case EventKind::post_wr: post_work_request(event); return;
    case EventKind::crash: crash(event.node, event.downtime); return;
    case EventKind::restart: restart(event.node, event.epoch); return;
  }
}

// ---------------------------------------------------------------------------------------------
// The network

Duration World::delay() { return network_.delay(); }

std::uint32_t World::address_of(int node) const { return 0x0A000001u + static_cast<std::uint32_t>(node); }
std::uint16_t World::port_of(int node) const { return static_cast<std::uint16_t>(7000 + node); }

P2pKey World::key_of(int peer, std::uint32_t tag) const {
  return P2pKey{.address = address_of(peer), .port = port_of(peer), .tag = tag};
}

LinkId World::open_link(int initiator, int responder, std::uint32_t tag) {
  Link& created = links_.emplace_back();
  created.node[0] = initiator;
  created.node[1] = responder;
  created.epoch[0] = nodes_[static_cast<std::size_t>(initiator)].epoch;
  created.tag = tag;
  return links_.size();
}

int World::side_of(int node, LinkId id) const {
  const Link& k = links_[id - 1];
  return k.node[0] == node && k.epoch[0] == nodes_[static_cast<std::size_t>(node)].epoch ? 0 : 1;
}

void World::send(LinkId id, int from_side, const Message& message) {
  Link& k = link(id);
  const int to = 1 - from_side;
  const Time at = network_.stream_arrival(now_, k.last_arrival[to]);
  schedule({.at = at, .kind = EventKind::message, .node = k.node[to], .link = id, .side = to,
            .message = message});
}

void World::close_end(LinkId id, int side, bool send_close) {
  Link& k = link(id);
  if (!k.open[side]) return;
  k.open[side] = false;
  k.established[side] = false;
  k.cmid[side] = 0;
  if (send_close) send(id, side, Message{.kind = MessageKind::close});
  Node& node = nodes_[static_cast<std::size_t>(k.node[side])];
  if (node.up) node.resolver->handle_link_closed(id);
}

void World::violation(std::string what) {
  if (!result_.ok) return;
  result_.ok = false;
  result_.violation = fmt::format("at {:.3f}ms: {}",
                                  static_cast<double>(now_.time_since_epoch().count()) / 1e6, what);
  trace("VIOLATION: {}", what);
}

// ---------------------------------------------------------------------------------------------

SimResult run_iwarp_simulation(std::uint64_t seed, const SimConfig& config) {
  World world(seed, config);
  return world.run();
}

SimResult run_p2p_simulation(std::uint64_t seed, const SimConfig& config) {
  return config.transport == Transport::roce ? run_roce_simulation(seed, config)
                                             : run_iwarp_simulation(seed, config);
}

const char* transport_name(Transport transport) { return transport == Transport::roce ? "roce" : "iwarp"; }

std::string replay_command(std::string_view program, std::uint64_t seed, const SimConfig& config) {
  std::string command = fmt::format("{} --transport {} --seed {}", program, transport_name(config.transport), seed);
  if (config.nodes != 0) command += fmt::format(" --nodes {}", config.nodes);
  return command + " --verbose";
}

}  // namespace peercm::sim
