// The RoCE world of the simulator: each node is a production IbCmAgent (src/core/ibcm, with its
// P2pResolver) listening in peer-to-peer mode; CM MADs travel as datagrams on the shared network
// (network.hpp): delayed, lost, duplicated, reordered, cut by partitions. The application model
// connects (often from both sides at once), answers requests (accepts, rejects, answers slowly or
// never), closes, reconnects; nodes crash and restart. Each seed also picks the CM timing an
// application configures: REQ retries and TIMEWAIT.
//
// Phases: chaos (every fault), a final round without loss or partitions in which pairs connect
// from one or both sides, then a teardown that closes everything. Properties:
//  - uniqueness: no node ever holds two established connections for one (peer, tag);
//  - liveness: every attempt ends (ESTABLISHED or an error) by its deadline; between nodes that
//    stayed up and could reach each other, without loss and with applications that answer, no
//    attempt ends in an error; after the final round every pair and tag holds exactly one
//    connection;
//  - integrity: no connection ends unless an application closed it or a node restarted; at
//    quiescence both ends agree on every connection: each one's peer comm ID, QPN and starting PSN
//    are the other's own; and two production RC QPs set up with what the two CMs negotiated for
//    one of the connections carry Sends over the lossy network exactly once, in order, intact
//    (rc_data.hpp);
//  - no leak: once everything is closed and every timer ran out, agents hold no connection, id,
//    pending REQ, timer or resolver state;
//  - rule R5a of docs/p2p.md: a connect that takes back an unseen request sends its own REQ at once
//    if and only if its (GUID, QPN) is the larger; otherwise it is bound to the request;
//  - rule R5b: on most seeds the world offers connect() the check of a key's established
//    connection, as the api layer does (src/api/roce/roce_cm.cpp): the connection's QP probes its
//    peer, retry_cnt + 1 times a local ACK timeout apart, over the same lossy network. The peer
//    answers while it runs the incarnation and the QP of that connection (a crashed or restarted
//    peer, or one that closed the connection, does not); an answer is handle_connection_alive(),
//    no answer ends the connection as a QP error does (disconnect()). A connect that waits on a
//    check ends in one of R5b's outcomes: (a) the restarted peer's REQ replaced the connection
//    (it ended first) and the attempt is ESTABLISHED without a REQ of its own; (b) the connection
//    answered: CONNECT_ERROR with `already_connected` while it stays ESTABLISHED; (c) the
//    connection ended first and the attempt's own REQ went out; (d) the deadline. A probe goes
//    unanswered only when the peer restarted, closed the connection, or the phase lost MADs or
//    cut the pair.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <tuple>
#include <variant>
#include <vector>

#include "core/ibcm/ibcm_agent.hpp"
#include "network.hpp"
#include "rc_data.hpp"
#include "worlds.hpp"
#include "wire/ibcm/cm_common.hpp"
#include "wire/ibcm/gid.hpp"
#include "wire/ibcm/cm_message.hpp"

namespace peercm::sim {
namespace {

using namespace std::chrono_literals;
namespace ib = core::ibcm;
namespace w = wire::ibcm;
using AgentEvent = ib::IbCmAgentEvent::Kind;

constexpr std::uint16_t kPort = 7471;
constexpr std::uint64_t kMaxRoceEvents = 2'000'000;
constexpr Duration kConnectTimeout = 300ms;

// R5b's liveness probe on a connection's QP: sent (try), reaching the peer (arrival), its answer
// reaching us (answer), a try's local ACK timeout running out (expiry).
enum class Ev : std::uint8_t { mad, timer, connect, answer, close, crash, restart, probe_try, probe_arrival,
                               probe_answer, probe_expiry };

struct RoceEvent {
  Time at{};
  std::uint64_t seq = 0;
  Ev kind = Ev::mad;
  int node = 0;
  std::uint32_t epoch = 0;
  int peer = 0;
  std::uint32_t tag = 0;
  ib::IbCmId id = 0;
  bool accept = true;
  int from = 0;
  Duration downtime{};
  std::shared_ptr<const ib::OutboundMad> mad;
  std::uint32_t generation = 0;  // probe: the check it belongs to
  std::uint32_t qpn = 0;         // probe_arrival: the QP it is addressed to
  std::uint32_t from_epoch = 0;  // probe_arrival: the checking node's incarnation
};

struct RoceLater {
  bool operator()(const RoceEvent& a, const RoceEvent& b) const { return a.at != b.at ? a.at > b.at : a.seq > b.seq; }
};

// What the application knows of one of its ids.
struct AppId {
  bool active = false;
  int peer = 0;
  std::uint32_t tag = 0;
  bool established = false;
  bool answered = false;  // passive: the application accepted or rejected it
  bool closed = false;    // this application closed it
  Time start{};           // active: when the application connected
  Time deadline{};
  std::uint32_t peer_epoch = 0;  // the peer's incarnation when it was ESTABLISHED here
  std::uint32_t qpn = 0;  // ours, as given to connect() or accept()
  std::uint32_t psn = 0;
  std::uint32_t local_comm = 0;
  ib::IbCmPeer remote;    // from ESTABLISHED (or the CONNECT_REQUEST)
  // Its QP runs: from accept() or REP sent (passive, or bound to the peer's REQ) or ESTABLISHED
  // (active) until the application closes it, it is DISCONNECTED or it ends. Only such a QP
  // answers a liveness probe.
  bool qp_live = false;
  // R5b: an attempt admitted without a REQ while the key's connection `checked` is checked.
  bool checking = false;
  bool dialed = false;  // its own REQ went out meanwhile (outcome c)
  ib::IbCmId checked = 0;
  std::uint32_t checked_peer_epoch = 0;  // the peer's incarnation that connection was ESTABLISHED with
};

// R5b: a liveness check running on one established connection's QP.
struct Check {
  std::uint32_t generation = 0;
  int tries_left = 0;
  Time started{};
};

struct RoceNode {
  std::unique_ptr<ib::IbCmAgent> agent;
  bool up = true;
  std::uint32_t epoch = 1;
  std::uint64_t guid = 0;
  std::uint32_t next_qpn = 0;
  std::optional<Time> timer;
  std::map<ib::IbCmId, AppId> ids;
  std::vector<std::pair<Time, Time>> down;  // [crash, restart) windows
  std::vector<std::uint32_t> closed_comms;       // local comm IDs of connections this application closed
  std::vector<std::uint32_t> established_comms;  // local comm IDs of connections ever ESTABLISHED here
  std::vector<std::tuple<Time, int, std::uint32_t>> closes;  // (when, peer, tag) this application closed
  std::map<ib::IbCmId, Check> checks;  // R5b: by the checked connection's id
};

enum class Phase : std::uint8_t { chaos, final_round, teardown };

class RoceWorld {
 public:
  RoceWorld(std::uint64_t seed, const SimConfig& config)
      : seed_(seed), config_(config), rng_(seed), network_(rng_, Faults{}) {
    nodes_count_ = config.nodes > 0 ? config.nodes : rng_.between(2, 4);
    tags_ = static_cast<std::uint32_t>(rng_.between(1, 2));
    faults_ = Faults{.max_delay = Duration{rng_.between(100, 4000) * 1000},  // 0.1 to 4 ms
                     .zero_delay_percent = 10,
                     .loss_percent = rng_.percent(70) ? static_cast<unsigned>(rng_.between(0, 10)) : 0u,
                     .duplicate_percent = rng_.percent(60) ? static_cast<unsigned>(rng_.between(0, 10)) : 0u};
    network_.set_faults(faults_);
    simultaneous_ = static_cast<unsigned>(rng_.between(30, 90));
    reject_ = rng_.percent(50) ? static_cast<unsigned>(rng_.between(0, 30)) : 0u;
    slow_ = rng_.percent(50) ? static_cast<unsigned>(rng_.between(0, 30)) : 0u;
    silent_ = rng_.percent(20) ? static_cast<unsigned>(rng_.between(0, 10)) : 0u;
    close_ = static_cast<unsigned>(rng_.between(0, 50));
    take_unseen_ = rng_.percent(50) ? static_cast<unsigned>(rng_.between(0, 100)) : 0u;
    crashes_ = rng_.percent(40) ? 1 : 0;
    partitions_ = rng_.percent(25) ? rng_.between(1, 2) : 0;
    shared_guid_ = rng_.percent(20);
    // The CM timing is the application's to configure (ContextOptions: retries, TIMEWAIT): a seed
    // picks how often a REQ is sent (2 to 5 times, 25 ms apart) and how long a node remembers a
    // REQ it dropped or answered (TIMEWAIT 34 to 268 ms), so some seeds remember a dropped REQ for
    // longer than its sender keeps sending it.
    timing_ = {.packet_lifetime = 10,
               .cm_response_timeout = 12,
               .max_cm_retries = static_cast<std::uint8_t>(rng_.between(1, 4)),
               .service_timeout = 14,
               .timewait = static_cast<std::uint8_t>(rng_.between(13, 16))};
    // Some seeds give nodes with one GUID the same QPN sequence too (identical processes): then
    // only the incarnation orders their colliding attempts (rule 3's tie-break).
    shared_qpns_ = shared_guid_ && rng_.percent(50);
    first_qpn_ = static_cast<std::uint32_t>(rng_.between(0x100, 0x400000));
    // R5b: whether the world offers connect() the check, and the QP's timing (local ACK timeout
    // 8 to 30 ms, retry_cnt 0 to 3, so a check gives up within 120 ms, well inside an attempt's
    // 300 ms), from a stream of their own so that the rest of a seed's choices stay what they were.
    Rng check_rng(seed ^ 0x5b5b5b5b5b5b5b5bULL);
    checks_ = check_rng.percent(80);
    probe_timeout_ = Duration{check_rng.between(8, 30) * 1000000};
    probe_tries_ = check_rng.between(1, 4);
    for (int i = 0; i < nodes_count_; ++i) {
      nodes_.emplace_back();
      nodes_.back().guid = shared_guid_ ? 0x5000 : 0x5000 + rng_.next() % 0x1000;
      open(i);
    }
  }

  SimResult run() {
    trace("seed {} (roce): {} nodes, {} tag(s), delays 0..{}us, loss {}%, duplicates {}%, {}% simultaneous, "
          "app reject {}%, slow {}%, silent {}%, close {}%, take unseen {}%, {} crash(es), {} partition(s){}, "
          "CM retries {}, TIMEWAIT 2^{} x 4.096 us, {}",
          seed_, nodes_count_, tags_, std::chrono::duration_cast<std::chrono::microseconds>(faults_.max_delay).count(),
          faults_.loss_percent, faults_.duplicate_percent, simultaneous_, reject_, slow_, silent_, close_,
          take_unseen_, crashes_, partitions_, shared_guid_ ? ", shared GUIDs" : "", timing_.max_cm_retries,
          timing_.timewait,
          checks_ ? fmt::format("R5b checks: {} probe(s) {} ms apart", probe_tries_,
                                std::chrono::duration_cast<std::chrono::milliseconds>(probe_timeout_).count())
                  : std::string("no R5b checks"));
    const Duration chaos = Duration{rng_.between(20, 200) * 1000000};
    const int connects = rng_.between(2, 12);
    for (int i = 0; i < connects; ++i) {
      const auto [a, b] = pair();
      const std::uint32_t tag = random_tag();
      const Time at = now_ + upto(chaos);
      schedule({.at = at, .kind = Ev::connect, .node = a, .peer = b, .tag = tag});
      if (rng_.percent(simultaneous_)) {
        schedule({.at = at + (rng_.percent(50) ? Duration::zero() : upto(faults_.max_delay)), .kind = Ev::connect,
                  .node = b, .peer = a, .tag = tag});
      }
    }
    // docs/p2p.md R6: a restart takes longer than a message can be in flight, so no message of
    // the previous incarnation arrives once the node runs again.
    for (int i = 0; i < crashes_; ++i) {
      schedule({.at = now_ + upto(chaos), .kind = Ev::crash, .node = rng_.between(0, nodes_count_ - 1),
                .downtime = faults_.max_delay + Duration{rng_.between(1, 300) * 1000000}});
    }
    for (int i = 0; i < partitions_; ++i) {
      const auto [a, b] = pair();
      const Time from = now_ + upto(chaos);
      const Time until = from + Duration{rng_.between(1, 400) * 1000000};
      network_.partition({.a = a, .b = b, .from = from, .until = until});
      ++result_.stats.partitions;
      trace("partition n{} | n{} from {:.3f} ms to {:.3f} ms", a, b, ms(from), ms(until));
    }
    trace("--- chaos phase");
    if (!run_until_quiet()) return finish();
    check_quiet_state("after chaos");
    if (!result_.ok) return finish();

    // Final round: no loss, no partitions; every pair asks for every tag from both sides. (Both:
    // without keepalives, a connection to a crashed incarnation stays half-open at the survivor
    // until the restarted node's REQ replaces it, rule 6.)
    trace("--- final round");
    phase_ = Phase::final_round;
    chaos_loss_ = faults_.loss_percent;
    faults_.loss_percent = 0;
    network_.set_faults(faults_);
    network_.heal_all();
    for (int a = 0; a < nodes_count_; ++a) {
      for (int b = a + 1; b < nodes_count_; ++b) {
        for (std::uint32_t tag = 0; tag < tags_; ++tag) {
          const Time at = now_ + upto(2ms);
          schedule({.at = at, .kind = Ev::connect, .node = a, .peer = b, .tag = tag});
          schedule({.at = at + (rng_.percent(50) ? Duration::zero() : upto(faults_.max_delay)), .kind = Ev::connect,
                    .node = b, .peer = a, .tag = tag});
        }
      }
    }
    if (!run_until_quiet()) return finish();
    check_quiet_state("after the final round");
    check_final_round();
    if (!result_.ok) return finish();
    check_data();
    if (!result_.ok) return finish();

    // Teardown: every node closes everything; then nothing may remain.
    trace("--- teardown");
    phase_ = Phase::teardown;
    for (int n = 0; n < nodes_count_; ++n) {
      std::vector<ib::IbCmId> ids;
      for (const auto& [id, app] : node(n).ids) {
        if (app.established) ids.push_back(id);
      }
      for (ib::IbCmId id : ids) close(n, id);
    }
    if (!run_until_quiet()) return finish();
    check_no_leak();
    return finish();
  }

 private:
  RoceNode& node(int i) { return nodes_[static_cast<std::size_t>(i)]; }
  static ib::Ipv4Address address(int i) { return {10, 0, 0, static_cast<std::uint8_t>(i + 1)}; }
  static int index_of(const ib::Ipv4Address& a) { return a[3] - 1; }
  static double ms(Time t) { return static_cast<double>(t.time_since_epoch().count()) / 1e6; }
  Duration upto(Duration max) {
    return max.count() <= 0 ? Duration::zero()
                            : Duration{static_cast<Duration::rep>(
                                  rng_.between(std::uint64_t{0}, static_cast<std::uint64_t>(max.count())))};
  }
  std::pair<int, int> pair() {
    const int a = rng_.between(0, nodes_count_ - 1);
    int b = rng_.between(0, nodes_count_ - 2);
    if (b >= a) ++b;
    return {a, b};
  }
  std::uint32_t random_tag() { return static_cast<std::uint32_t>(rng_.between(0, static_cast<int>(tags_) - 1)); }

  void open(int i) {
    RoceNode& n = node(i);
    ib::IbCmAgentConfig agent_config{.identity = {.guid = n.guid, .incarnation = rng_.next() | 1},
                                     .address = address(i),
                                     .timing = timing_,
                                     .connect_timeout = kConnectTimeout,
                                     .first_comm_id = static_cast<std::uint32_t>(rng_.next()),
                                     .tid_high = static_cast<std::uint32_t>(i + 1)};
    n.agent = std::make_unique<ib::IbCmAgent>(agent_config);
    n.agent->listen(kPort);
    n.up = true;
    n.next_qpn = shared_qpns_ ? first_qpn_ : static_cast<std::uint32_t>(rng_.between(0x100, 0x400000));
    n.timer.reset();
  }

  void schedule(RoceEvent e) {
    e.seq = seq_++;
    queue_.push_back(std::move(e));
    std::push_heap(queue_.begin(), queue_.end(), RoceLater{});
  }

  bool run_until_quiet() {
    while (!queue_.empty()) {
      std::pop_heap(queue_.begin(), queue_.end(), RoceLater{});
      RoceEvent e = std::move(queue_.back());
      queue_.pop_back();
      now_ = std::max(now_, e.at);
      if (++result_.stats.events > kMaxRoceEvents) {
        violation("no quiescence (event budget exhausted)");
        return false;
      }
      dispatch(e);
      if (!result_.ok) return false;
    }
    return true;
  }

  void dispatch(const RoceEvent& e) {
    switch (e.kind) {
      case Ev::mad: {
        RoceNode& n = node(e.node);
        if (!n.up) return;
        n.agent->handle_mad(w::ipv4_mapped_gid(address(e.from)), e.mad->bytes, now_);
        break;
      }
      case Ev::timer: {
        RoceNode& n = node(e.node);
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
      case Ev::crash: crash(e.node, e.downtime); return;
      case Ev::probe_try: probe_try(e); return;
      case Ev::probe_arrival: probe_arrival(e); return;
      case Ev::probe_answer: probe_answer(e); break;
      case Ev::probe_expiry: probe_expiry(e); break;
      case Ev::restart: {
        RoceNode& n = node(e.node);
        if (n.up || n.epoch != e.epoch) return;
        ++n.epoch;
        n.down.back().second = now_;
        open(e.node);
        trace("n{}#{}: RESTART", e.node, n.epoch);
        break;
      }
    }
    pump(e.node);
  }

  void connect(int a, int b, std::uint32_t tag) {
    RoceNode& n = node(a);
    if (!n.up) return;
    const std::uint32_t qpn = n.next_qpn++;
    const auto psn = static_cast<std::uint32_t>(rng_.next() & 0xFFFFFF);
    ib::IbCmConnectParams params{.destination = address(b), .port = kPort, .tag = tag, .peer_to_peer = true,
                                 .qpn = qpn, .starting_psn = psn};
    // docs/p2p.md R5: a CONNECT_REQUEST the application has not taken yet (it takes each one when
    // it answers it) goes back to the CM, whose resolver lets it meet the attempt (R3).
    const bool may_take = rng_.percent(take_unseen_);
    ib::IbCmId taken = 0;
    ib::IbCmPeer taken_from;
    const auto take_back = [&](ib::IbCmId request) {
      auto it = n.ids.find(request);
      if (!may_take || it == n.ids.end() || it->second.answered) return false;
      taken = request;
      taken_from = it->second.remote;
      n.ids.erase(it);
      return true;
    };
    // docs/p2p.md R5b: as the api layer does, the key's established connection is checked by its QP.
    ib::IbCmId checked = 0;
    const auto check = [&](ib::IbCmId established) {
      auto it = n.ids.find(established);
      if (it == n.ids.end() || !it->second.established || !it->second.qp_live) return false;
      checked = established;
      return true;
    };
    auto id = checks_ ? n.agent->connect(params, now_, take_back, check) : n.agent->connect(params, now_, take_back);
    if (!id) {
      trace("n{}: connect to n{} tag {}: {}", a, b, tag, std::make_error_code(id.error()).message());
      return;
    }
    ++result_.stats.attempts;
    if (taken != 0) {
      ++result_.stats.taken_back;
      trace("n{}: connect c{} to n{} tag {} qpn {:#x} takes back the unseen request c{}", a, *id, b, tag, qpn, taken);
    } else {
      trace("n{}: connect c{} to n{} tag {} qpn {:#x}", a, *id, b, tag, qpn);
    }
    n.ids[*id] = AppId{.active = true, .peer = b, .tag = tag, .start = now_, .deadline = now_ + kConnectTimeout,
                       .qpn = qpn, .psn = psn, .checking = checked != 0, .checked = checked,
                       .checked_peer_epoch = checked != 0 ? n.ids.at(checked).peer_epoch : 0};
    if (checked != 0) {
      ++result_.stats.checks;
      ++checking_attempts_;
      trace("n{}: c{} waits on a check of c{} (R5b)", a, *id, checked);
      start_check(a, checked);
    }
    if (taken != 0) check_unseen_request_rule(a, qpn, taken_from);
  }

  // --- R5b: the liveness check of an established connection, run by its QP ---

  void start_check(int i, ib::IbCmId id) {
    RoceNode& n = node(i);
    n.checks[id] = Check{.generation = ++check_generation_, .tries_left = probe_tries_, .started = now_};
    schedule({.at = now_, .kind = Ev::probe_try, .node = i, .epoch = n.epoch, .id = id,
              .generation = check_generation_});
  }

  const Check* running_check(const RoceEvent& e) {
    RoceNode& n = node(e.node);
    if (!n.up || n.epoch != e.epoch) return nullptr;
    auto it = n.checks.find(e.id);
    return it == n.checks.end() || it->second.generation != e.generation ? nullptr : &it->second;
  }

  // The QP of `qpn` at node p, if it runs in incarnation `epoch`.
  const AppId* live_qp(int p, std::uint32_t epoch, std::uint32_t qpn) {
    const RoceNode& peer = node(p);
    if (!peer.up || peer.epoch != epoch) return nullptr;
    for (const auto& [id, app] : peer.ids) {
      if (app.qp_live && app.qpn == qpn) return &app;
    }
    return nullptr;
  }

  void probe_try(const RoceEvent& e) {
    if (running_check(e) == nullptr) return;
    RoceNode& n = node(e.node);
    auto it = n.ids.find(e.id);
    if (it == n.ids.end()) return;
    const AppId& app = it->second;
    for (Time at : network_.datagram_arrivals(e.node, app.peer, now_)) {
      schedule({.at = at, .kind = Ev::probe_arrival, .node = app.peer, .epoch = app.peer_epoch, .id = e.id,
                .from = e.node, .generation = e.generation, .qpn = app.remote.qpn, .from_epoch = n.epoch});
    }
    schedule({.at = now_ + probe_timeout_, .kind = Ev::probe_expiry, .node = e.node, .epoch = n.epoch, .id = e.id,
              .generation = e.generation});
  }

  // The peer's QP answers any request of its connection; a QP that no longer runs (a crashed or
  // restarted peer, a closed connection) answers nothing.
  void probe_arrival(const RoceEvent& e) {
    if (live_qp(e.node, e.epoch, e.qpn) == nullptr) return;
    for (Time at : network_.datagram_arrivals(e.node, e.from, now_)) {
      schedule({.at = at, .kind = Ev::probe_answer, .node = e.from, .epoch = e.from_epoch, .id = e.id,
                .generation = e.generation});
    }
  }

  // Any packet from the peer after the probe left confirms the connection (RcQueuePair::
  // poll_liveness_confirmed), an earlier check's answer included.
  void probe_answer(const RoceEvent& e) {
    RoceNode& n = node(e.node);
    if (!n.up || n.epoch != e.epoch || n.checks.erase(e.id) == 0) return;
    ++result_.stats.probes_answered;
    trace("n{}: c{} answered its check", e.node, e.id);
    n.agent->handle_connection_alive(e.id, now_);
  }

  void probe_expiry(const RoceEvent& e) {
    const Check* check = running_check(e);
    if (check == nullptr) return;
    RoceNode& n = node(e.node);
    if (--n.checks.at(e.id).tries_left > 0) {
      probe_try(e);
      return;
    }
    const Time started = check->started;
    n.checks.erase(e.id);
    auto it = n.ids.find(e.id);
    if (it == n.ids.end() || !it->second.established) return;
    AppId& app = it->second;
    if (!probe_failure_excused(e.node, app, started)) {
      violation(fmt::format("R5b: n{}'s check of c{} to n{} tag {} went unanswered though n{} runs its QP and "
                            "nothing was lost",
                            e.node, e.id, app.peer, app.tag, app.peer));
      return;
    }
    // The QP gives up (retry_exceeded) and the api layer disconnects (on_qp_error).
    ++result_.stats.probes_failed;
    trace("n{}: c{} failed its check: disconnect", e.node, e.id);
    if (!n.agent->disconnect(e.id, now_)) return;
    app.established = false;
    app.qp_live = false;
    app.closed = true;
    n.closed_comms.push_back(app.local_comm);
    n.closes.emplace_back(now_, app.peer, app.tag);
  }

  bool probe_failure_excused(int i, const AppId& app, Time started) {
    if (live_qp(app.peer, app.peer_epoch, app.remote.qpn) == nullptr) return true;
    if (faults_.loss_percent > 0) return true;
    for (const Partition& p : network_.partitions()) {
      if (((p.a == i && p.b == app.peer) || (p.a == app.peer && p.b == i)) && p.from <= now_ && p.until >= started) {
        return true;
      }
    }
    return false;
  }

  // docs/p2p.md R5a: the taken-back request meets the attempt under R3 before the attempt has
  // sent anything. Its sender's (GUID, QPN) the larger: the attempt is bound to it and sends no
  // REQ; ours the larger: our REQ goes out now. (A full tie is the incarnations' to break: not
  // judged here.)
  void check_unseen_request_rule(int a, std::uint32_t qpn, const ib::IbCmPeer& sender) {
    RoceNode& n = node(a);
    if (n.guid == sender.guid && qpn == sender.qpn) return;
    const bool ours_larger = std::tie(n.guid, qpn) > std::tie(sender.guid, sender.qpn);
    watched_qpn_ = qpn;
    watched_req_sent_ = false;
    pump(a);
    watched_qpn_.reset();
    if (watched_req_sent_ != ours_larger) {
      violation(fmt::format("rule R5a: n{}'s attempt (GUID {:#x}, QPN {:#x}) took back the unseen request of "
                            "(GUID {:#x}, QPN {:#x}) and {} its own REQ",
                            a, n.guid, qpn, sender.guid, sender.qpn, watched_req_sent_ ? "sent" : "did not send"));
    }
  }

  void answer(const RoceEvent& e) {
    RoceNode& n = node(e.node);
    if (!n.up || n.epoch != e.epoch) return;
    auto it = n.ids.find(e.id);
    if (it == n.ids.end() || it->second.answered) return;
    it->second.answered = true;
    if (e.accept) {
      const std::uint32_t qpn = n.next_qpn++;
      const auto psn = static_cast<std::uint32_t>(rng_.next() & 0xFFFFFF);
      const auto status = n.agent->accept(e.id, {.qpn = qpn, .starting_psn = psn}, now_);
      trace("n{}: accept c{}: {}", e.node, e.id, status ? "ok" : "EINVAL");
      it->second.qpn = qpn;
      it->second.psn = psn;
      it->second.qp_live = status.has_value();
    } else {
      const auto status = n.agent->reject(e.id, {}, now_);
      trace("n{}: reject c{}: {}", e.node, e.id, status ? "ok" : "EINVAL");
      const AppId rejected = it->second;
      if (status) n.ids.erase(it);
      // Some applications turn a request down to connect themselves: the two attempts may meet
      // (docs/p2p-resolver.md, decision 2: the active peer holds the losing request).
      if (status && rng_.percent(50)) {
        schedule({.at = now_ + upto(faults_.max_delay), .kind = Ev::connect, .node = e.node, .peer = rejected.peer,
                  .tag = rejected.tag});
      }
    }
  }

  void close(int i, ib::IbCmId id) {
    RoceNode& n = node(i);
    auto it = n.ids.find(id);
    if (it == n.ids.end() || !it->second.established) return;
    if (!n.agent->disconnect(id, now_)) return;
    trace("n{}: close c{}", i, id);
    it->second.established = false;
    it->second.closed = true;
    it->second.qp_live = false;
    n.checks.erase(id);
    n.closed_comms.push_back(it->second.local_comm);
    n.closes.emplace_back(now_, it->second.peer, it->second.tag);
    const AppId app = it->second;
    pump(i);
    if (phase_ == Phase::chaos && rng_.percent(30)) {
      schedule({.at = now_ + upto(faults_.max_delay), .kind = Ev::connect, .node = i, .peer = app.peer, .tag = app.tag});
    }
  }

  void crash(int i, Duration downtime) {
    RoceNode& n = node(i);
    if (!n.up) return;
    trace("n{}#{}: CRASH for {}ms", i, n.epoch, std::chrono::duration_cast<std::chrono::milliseconds>(downtime).count());
    ++result_.stats.crashes;
    collect_stats(*n.agent);
    n.agent.reset();
    n.up = false;
    n.down.emplace_back(now_, Time::max());
    for (const auto& [id, app] : n.ids) checking_attempts_ -= app.checking;
    n.ids.clear();
    n.checks.clear();
    n.timer.reset();
    schedule({.at = now_ + downtime, .kind = Ev::restart, .node = i, .epoch = n.epoch});
  }

  // Moves a node's outputs on: MADs onto the network, events to its application, its deadline.
  void pump(int i) {
    RoceNode& n = node(i);
    if (!n.up) return;
    while (auto mad = n.agent->poll_mad()) {
      const auto to = w::ipv4_of_gid(mad->destination);
      if (!to) continue;
      const int target = index_of(*to);
      if (target < 0 || target >= nodes_count_) continue;
      if ((mad->bytes[16] << 8 | mad->bytes[17]) == static_cast<int>(w::CmAttribute::mra)) ++result_.stats.mras;
      if (watched_qpn_ || checking_attempts_ > 0) {
        if (auto decoded = w::decode_cm_mad(mad->bytes); decoded && std::holds_alternative<w::CmReq>(decoded->message)) {
          const std::uint32_t sent = std::get<w::CmReq>(decoded->message).local_qpn;
          if (watched_qpn_) watched_req_sent_ |= sent == *watched_qpn_;
          for (auto& [id, app] : n.ids) app.dialed |= app.checking && app.qpn == sent;
        }
      }
      auto shared = std::make_shared<const ib::OutboundMad>(*mad);
      for (Time at : network_.datagram_arrivals(i, target, now_)) {
        schedule({.at = at, .kind = Ev::mad, .node = target, .from = i, .mad = shared});
      }
    }
    while (auto event = n.agent->poll_event()) {
      on_event(i, *event);
      if (!result_.ok) return;
    }
    if (auto d = n.agent->next_deadline(); d && (!n.timer || *d < *n.timer)) {
      n.timer = std::max(*d, now_);
      schedule({.at = *n.timer, .kind = Ev::timer, .node = i, .epoch = n.epoch});
    }
  }

  void on_event(int i, const ib::IbCmAgentEvent& e) {
    RoceNode& n = node(i);
    switch (e.kind) {
      case AgentEvent::connect_request: {
        const int peer = index_of(e.peer_address);
        n.ids[e.id] = AppId{.active = false, .peer = peer, .tag = e.tag, .remote = e.peer};
        trace("n{}: CONNECT_REQUEST c{} from n{} tag {}", i, e.id, peer, e.tag);
        const bool chaos = phase_ == Phase::chaos;
        if (chaos && rng_.percent(silent_)) return;  // never answered: the MRA promise runs out
        const bool accept = !chaos || !rng_.percent(reject_);
        const Duration delay = rng_.percent(slow_) ? Duration{rng_.between(10, 40) * 1000000} : upto(2ms);
        schedule({.at = now_ + delay, .kind = Ev::answer, .node = i, .epoch = n.epoch, .id = e.id, .accept = accept});
        return;
      }
      case AgentEvent::established: {
        auto it = n.ids.find(e.id);
        if (it == n.ids.end()) {
          violation(fmt::format("n{}: ESTABLISHED on c{}, which the application does not know", i, e.id));
          return;
        }
        AppId& app = it->second;
        if (app.active && now_ > app.deadline) {
          violation(fmt::format("liveness: n{} attempt c{} established after its deadline", i, e.id));
          return;
        }
        if (app.checking && !r5b_established(i, e.id, app)) return;
        app.established = true;
        app.qp_live = true;
        app.local_comm = e.local_comm_id;
        app.remote = e.peer;
        app.peer_epoch = node(app.peer).epoch;
        n.established_comms.push_back(app.local_comm);
        ++result_.stats.established;
        trace("n{}: c{} ESTABLISHED (comm {:#x} <-> {:#x})", i, e.id, app.local_comm, app.remote.comm_id);
        int count = 0;
        for (const auto& [id, other] : n.ids) count += other.established && other.peer == app.peer && other.tag == app.tag;
        if (count > 1) {
          violation(fmt::format("uniqueness: n{} holds {} connections to n{} tag {}", i, count, app.peer, app.tag));
          return;
        }
        if (phase_ == Phase::chaos && rng_.percent(close_)) {
          schedule({.at = now_ + (rng_.percent(30) ? Duration::zero() : Duration{rng_.between(0, 100) * 1000000}),
                    .kind = Ev::close, .node = i, .epoch = n.epoch, .id = e.id});
        }
        return;
      }
      case AgentEvent::reply_sent:
        // The QP would start receiving here (api/roce/roce_cm.cpp); the CM outcome follows.
        if (auto it = n.ids.find(e.id); it != n.ids.end()) {
          it->second.qp_live = true;
        } else {
          violation(fmt::format("n{}: REP sent for c{}, which the application does not know", i, e.id));
        }
        trace("n{}: c{} REP sent to QP {:#x}", i, e.id, e.peer.qpn);
        return;
      case AgentEvent::rejected:
      case AgentEvent::unreachable:
      case AgentEvent::connect_error: {
        auto it = n.ids.find(e.id);
        if (it == n.ids.end()) return;
        if (e.already_connected) {
          r5b_already_connected(i, e.id, it->second);
          n.ids.erase(it);
          return;
        }
        if (it->second.checking) {
          ++result_.stats.check_deadline;
          --checking_attempts_;
        }
        if (it->second.active) {
          ++result_.stats.timed_out;
          if (now_ > it->second.deadline) {
            violation(fmt::format("liveness: n{} attempt c{} ended after its deadline", i, e.id));
            return;
          }
          if (e.kind != AgentEvent::rejected && !excused(i, it->second)) {
            violation(fmt::format("liveness: n{}'s attempt c{} to n{} tag {} (started at {:.3f} ms) ended in an "
                                  "error though both nodes stayed up and nothing was lost",
                                  i, e.id, it->second.peer, it->second.tag, ms(it->second.start)));
            return;
          }
        }
        trace("n{}: c{} ends ({})", i, e.id, static_cast<int>(e.kind));
        n.ids.erase(it);
        return;
      }
      case AgentEvent::disconnected: {
        trace("n{}: c{} DISCONNECTED", i, e.id);
        auto it = n.ids.find(e.id);
        if (it == n.ids.end()) return;
        const AppId& app = it->second;
        const RoceNode& peer = node(app.peer);
        const auto known = [&](const std::vector<std::uint32_t>& comms) {
          return std::find(comms.begin(), comms.end(), app.remote.comm_id) != comms.end();
        };
        // A connection ends rightly when an application closed it, when the peer restarted, or
        // when it never was ESTABLISHED at the peer (its RTU was lost: the peer's side failed).
        const bool explained = app.closed || !app.established || peer.epoch != app.peer_epoch || !peer.up ||
                               known(peer.closed_comms) || !known(peer.established_comms);
        if (!explained) {
          violation(fmt::format("integrity: n{}'s connection c{} to n{} tag {} ended though neither application "
                                "closed it and n{} did not restart",
                                i, e.id, app.peer, app.tag, app.peer));
          return;
        }
        it->second.established = false;
        it->second.qp_live = false;
        n.checks.erase(e.id);
        return;
      }
      case AgentEvent::timewait_exit:
        n.ids.erase(e.id);
        return;
    }
  }

  // R5b, outcomes (a) and (c): an attempt that waited on a check is ESTABLISHED once the checked
  // connection has ended, on the restarted peer's REQ (nothing of its own sent) or on its own REQ.
  bool r5b_established(int i, ib::IbCmId id, AppId& app) {
    RoceNode& n = node(i);
    app.checking = false;
    --checking_attempts_;
    ++(app.dialed ? result_.stats.check_dialed : result_.stats.check_replaced);
    if (!app.dialed && node(app.peer).epoch != app.checked_peer_epoch) ++result_.stats.check_replaced_restarted;
    auto checked = n.ids.find(app.checked);
    if (checked != n.ids.end() && checked->second.established) {
      violation(fmt::format("R5b: n{}'s attempt c{} is ESTABLISHED ({}) while the connection c{} it waited on "
                            "stays ESTABLISHED",
                            i, id, app.dialed ? "on its own REQ" : "on the peer's REQ", app.checked));
      return false;
    }
    return true;
  }

  // R5b, outcome (b): EISCONN only for an attempt that waited on a check, and only while the
  // checked connection stays ESTABLISHED.
  void r5b_already_connected(int i, ib::IbCmId id, const AppId& app) {
    RoceNode& n = node(i);
    if (!app.checking) {
      violation(fmt::format("R5b: n{}'s c{} ends with EISCONN though it waited on no check", i, id));
      return;
    }
    --checking_attempts_;
    ++result_.stats.check_alive;
    auto checked = n.ids.find(app.checked);
    if (checked == n.ids.end() || !checked->second.established) {
      violation(fmt::format("R5b: n{}'s attempt c{} ends with EISCONN though the connection c{} it waited on has "
                            "ended",
                            i, id, app.checked));
      return;
    }
    trace("n{}: c{} EISCONN: c{} answered its check", i, id, app.checked);
  }

  // Whether an attempt may rightly end in an error: a crash of either node within one timeout
  // before it or during it, a partition between them meanwhile, any loss in this phase, a peer
  // application that leaves requests unanswered, or one that closed a connection of this key
  // meanwhile (the one the attempt was bound to, before it was ESTABLISHED here).
  bool excused(int i, const AppId& attempt) const {
    if (phase_ == Phase::chaos && (faults_.loss_percent > 0 || silent_ > 0)) return true;
    for (const auto& [when, peer, tag] : nodes_[static_cast<std::size_t>(attempt.peer)].closes) {
      if (peer == i && tag == attempt.tag && when >= attempt.start) return true;
    }
    const Time from = attempt.start - kConnectTimeout;
    for (int n : {i, attempt.peer}) {
      for (const auto& [crash, restart] : nodes_[static_cast<std::size_t>(n)].down) {
        if (crash <= now_ && restart >= from) return true;
      }
    }
    for (const Partition& p : network_.partitions()) {
      if (((p.a == i && p.b == attempt.peer) || (p.a == attempt.peer && p.b == i)) && p.from <= now_ &&
          p.until >= from) {
        return true;
      }
    }
    return false;
  }

  // At quiescence: every attempt has ended, every delivered request has been answered.
  void check_quiet_state(const char* when) {
    for (int i = 0; i < nodes_count_ && result_.ok; ++i) {
      for (const auto& [id, app] : node(i).ids) {
        if (!app.established) {
          violation(fmt::format("liveness {}: n{} c{} ({}) neither established nor ended", when, i, id,
                                app.active ? "attempt" : "request"));
          return;
        }
      }
    }
  }

  // Every pair and tag: exactly one connection, and both ends agree on it.
  void check_final_round() {
    for (int a = 0; a < nodes_count_ && result_.ok; ++a) {
      for (int b = 0; b < nodes_count_ && result_.ok; ++b) {
        if (a == b) continue;
        for (std::uint32_t tag = 0; tag < tags_; ++tag) {
          const AppId* mine = nullptr;
          int count = 0;
          for (const auto& [id, app] : node(a).ids) {
            if (app.established && app.peer == b && app.tag == tag) {
              ++count;
              mine = &app;
            }
          }
          if (count != 1) {
            violation(fmt::format("liveness: n{} holds {} connections to n{} tag {} after the final round", a, count,
                                  b, tag));
            return;
          }
          bool mirrored = false;
          for (const auto& [id, app] : node(b).ids) {
            mirrored |= app.established && app.peer == a && app.tag == tag && app.local_comm == mine->remote.comm_id &&
                        app.remote.comm_id == mine->local_comm && app.qpn == mine->remote.qpn &&
                        app.psn == mine->remote.starting_psn && app.remote.qpn == mine->qpn &&
                        app.remote.starting_psn == mine->psn;
          }
          if (!mirrored) {
            violation(fmt::format("integrity: n{}'s connection to n{} tag {} (comm {:#x} <-> {:#x}, qpn {:#x} <-> "
                                  "{:#x}) has no mirror",
                                  a, b, tag, mine->local_comm, mine->remote.comm_id, mine->qpn, mine->remote.qpn));
            return;
          }
        }
      }
    }
  }

  // One connection, picked at random, carries data between two production RC QPs set up with
  // exactly what each end's CM negotiated, over the chaos phase's duplicates and reordering and
  // up to 5% loss (more would let seven retries run out now and then, which is the QP's own
  // test's business, not the CM's).
  void check_data() {
    const auto [a, b] = pair();
    const std::uint32_t tag = random_tag();
    const AppId* ends[2] = {nullptr, nullptr};
    for (int side = 0; side < 2; ++side) {
      for (const auto& [id, app] : node(side == 0 ? a : b).ids) {
        if (app.established && app.peer == (side == 0 ? b : a) && app.tag == tag) ends[side] = &app;
      }
    }
    if (ends[0] == nullptr || ends[1] == nullptr) return;  // check_final_round has vouched for it
    Faults data_faults = faults_;
    data_faults.loss_percent = std::min(chaos_loss_, 5u);
    network_.set_faults(data_faults);
    const auto end_of = [](int index, const AppId& app) {
      return RcEnd{.node = index, .qpn = app.qpn, .psn = app.psn, .peer_qpn = app.remote.qpn,
                   .peer_psn = app.remote.starting_psn};
    };
    const RcDataResult data = check_rc_data(rng_, network_, end_of(a, *ends[0]), end_of(b, *ends[1]), now_);
    network_.set_faults(faults_);
    result_.stats.work_requests += data.messages;
    trace("data: n{} <-> n{} tag {}: {} messages in {} packets{}", a, b, tag, data.messages, data.packets,
          data.failure.empty() ? "" : ": " + data.failure);
    if (!data.failure.empty()) {
      violation(fmt::format("integrity: data between n{} and n{} tag {}: {}", a, b, tag, data.failure));
    }
  }

  void check_no_leak() {
    for (int i = 0; i < nodes_count_ && result_.ok; ++i) {
      const ib::IbCmAgent& agent = *node(i).agent;
      if (!node(i).ids.empty() || !node(i).checks.empty() || agent.connection_count() != 0 || agent.id_count() != 0 ||
          agent.pending_request_count() != 0 || agent.next_deadline() || agent.resolver().tracked_links() != 0 ||
          agent.resolver().tracked_attempts() != 0) {
        violation(fmt::format(
            "no leak: n{} keeps app ids {} connections {} ids {} pending {} timer {} links {} attempts {}", i,
            node(i).ids.size(), agent.connection_count(), agent.id_count(), agent.pending_request_count(),
            agent.next_deadline().has_value(), agent.resolver().tracked_links(), agent.resolver().tracked_attempts()));
      }
    }
  }

  void collect_stats(const ib::IbCmAgent& agent) {
    result_.stats.collisions += agent.stats().p2p_bound;
    result_.stats.dropped += agent.stats().p2p_dropped;
    result_.stats.rejected_duplicate += agent.stats().p2p_duplicates;
    result_.stats.replaced += agent.resolver().stats().replaced_restarted + agent.resolver().stats().replaced_stale;
  }

  SimResult finish() {
    for (int i = 0; i < nodes_count_; ++i) {
      if (node(i).up) collect_stats(*node(i).agent);
    }
    return std::move(result_);
  }

  void violation(std::string what) {
    if (!result_.ok) return;
    result_.ok = false;
    result_.violation = fmt::format("at {:.3f} ms: {}", ms(now_), what);
    trace("VIOLATION: {}", result_.violation);
  }

  template <class... Args>
  void trace(fmt::format_string<Args...> format, Args&&... args) {
    if (!config_.verbose) return;
    auto out = std::back_inserter(result_.trace);
    fmt::format_to(out, "{:10.3f}ms  ", ms(now_));
    fmt::format_to(out, format, std::forward<Args>(args)...);
    result_.trace.push_back('\n');
  }

  std::uint64_t seed_;
  SimConfig config_;
  Rng rng_;
  Network network_;
  Faults faults_;
  int nodes_count_ = 2;
  std::uint32_t tags_ = 1;
  unsigned simultaneous_ = 0;
  unsigned reject_ = 0;
  unsigned slow_ = 0;
  unsigned silent_ = 0;
  unsigned close_ = 0;
  unsigned take_unseen_ = 0;
  unsigned chaos_loss_ = 0;
  int crashes_ = 0;
  int partitions_ = 0;
  bool shared_guid_ = false;
  bool shared_qpns_ = false;
  std::uint32_t first_qpn_ = 0;
  bool checks_ = false;  // R5b: connect() gets the check
  Duration probe_timeout_{};
  int probe_tries_ = 1;
  std::uint32_t check_generation_ = 0;
  int checking_attempts_ = 0;  // attempts waiting on a check: pump() then watches REQs
  std::optional<std::uint32_t> watched_qpn_;  // R5a: the taken-back request's attempt, while connect() runs
  bool watched_req_sent_ = false;
  ib::IbCmTiming timing_;
  Phase phase_ = Phase::chaos;
  Time now_ = Time{} + 1s;
  std::uint64_t seq_ = 0;
  std::vector<RoceEvent> queue_;  // a binary heap ordered by RoceLater
  std::vector<RoceNode> nodes_;
  SimResult result_;
};

}  // namespace

SimResult run_roce_simulation(std::uint64_t seed, const SimConfig& config) {
  RoceWorld world(seed, config);
  return world.run();
}

}  // namespace peercm::sim
