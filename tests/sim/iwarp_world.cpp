// The iWARP world of the simulator: each node is a production IwarpCmAgent (src/core/iwarp_cm,
// with its MPA handshakes and P2pResolver) listening in peer-to-peer mode. Its streams are
// TCP-like on the shared network (network.hpp): the SYN, then every byte in order, reliable while
// the path is up; a crashed node's streams reset at their far ends; a segment sent across a
// partition resets its stream, and a connect across one times out. The application model
// connects (often from both sides at once), fetches CONNECT_REQUESTs late (so a connect can take
// an unseen one back, docs/p2p.md R5), answers them (accepts, rejects, slowly or never), closes,
// reconnects; nodes crash and restart.
//
// Phases and properties as in the RoCE world (roce_world.cpp):
//  - uniqueness: no node ever holds two established connections for one (peer, tag);
//  - liveness: every attempt ends by its deadline; between nodes that stayed up and could reach
//    each other, with applications that answer, no attempt ends in an error; after the final
//    round every pair and tag holds exactly one connection;
//  - integrity: no connection ends unless an application closed it, a node restarted or a
//    partition reset it; at quiescence both ends of every connection run on the two ends of one
//    stream, and the production queue-pair engines on them (core/queue_pair_engine, started with
//    what MPA agreed, RTR included) have carried every Send both ways exactly once, in order,
//    intact;
//  - no leak: once everything is closed and every timer ran out, agents hold no stream, no id but
//    the listener, no resolver state and no deadline;
//  - rule R5a of docs/p2p.md: a connect that takes back an unseen request dials at once if and
//    only if its (GUID, attempt id, incarnation) is the larger; otherwise it is bound to the request.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <string>
#include <cerrno>
#include <chrono>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <tuple>
#include <vector>

#include "core/iwarp_cm/iwarp_cm_agent.hpp"
#include "core/memory_table.hpp"
#include "core/queue_pair_engine.hpp"
#include "network.hpp"
#include "worlds.hpp"

namespace peercm::sim {
namespace {

using namespace std::chrono_literals;
namespace iw = core::iwarp;
using AgentEvent = iw::IwarpCmEvent::Kind;
using AgentAction = iw::IwarpCmAction::Kind;
using core::AttemptId;
using core::NodeIdentity;

constexpr std::uint64_t kMaxIwarpEvents = 2'000'000;
constexpr Duration kConnectTimeout = 1s;
constexpr Duration kSynTimeout = 200ms;  // a connect across a partition fails after this

enum class Ev : std::uint8_t { syn, syn_ack, refused, bytes, fin, timer, connect, fetch, answer, close, crash, restart };

struct IwarpEvent {
  Time at{};
  std::uint64_t seq = 0;
  Ev kind = Ev::bytes;
  int node = 0;
  std::uint32_t epoch = 0;
  int peer = 0;
  std::uint32_t tag = 0;
  iw::IwarpCmId id = 0;
  bool accept = true;
  std::size_t stream = 0;  // world stream index
  int side = 0;            // the receiving end
  std::shared_ptr<const std::vector<std::uint8_t>> bytes;
  Duration downtime{};
};

struct IwarpLater {
  bool operator()(const IwarpEvent& a, const IwarpEvent& b) const { return a.at != b.at ? a.at > b.at : a.seq > b.seq; }
};

class Cq final : public core::CompletionSink {
 public:
  bool push(const WorkCompletion& completion) override {
    completions.push_back(completion);
    return true;
  }
  std::vector<WorkCompletion> completions;
};

constexpr std::size_t kSlot = 2048;          // one receive buffer per message
constexpr std::uint32_t kMaxMessage = 2000;  // up to two FPDUs
constexpr int kMaxMessages = 2;              // Sends per end; each end posts this many receives

std::uint8_t pattern(std::uint64_t salt, std::size_t i) {
  const std::uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ (salt + 1) * 0xD1B54A32D192ED03ull;
  return static_cast<std::uint8_t>((x >> 29) ^ (x >> 47));
}

// The production queue-pair engine on one end of a started stream, with the Sends it posted
// and the receives for the peer's.
struct QpEnd {
  explicit QpEnd(std::uint64_t memory_seed) : memory(memory_seed), engine(core::QpConfig{}, memory, send_cq, recv_cq) {}
  core::MemoryTable memory;
  Cq send_cq;
  Cq recv_cq;
  core::QueuePairEngine engine;
  std::vector<std::uint8_t> send_buffer;
  std::vector<std::uint8_t> recv_buffer;
  std::vector<std::uint32_t> lengths;  // of the Sends this end posted
  std::uint64_t salt = 0;
};

// One TCP connection between two nodes: end 0 opened it, end 1 accepted it.
struct SimStream {
  int node[2] = {0, 0};
  std::uint32_t epoch[2] = {0, 0};
  iw::StreamId id[2] = {0, 0};  // each agent's name for it (0: not accepted yet)
  bool open[2] = {false, false};
  bool started[2] = {false, false};
  bool established[2] = {false, false};  // an id ESTABLISHED on this end
  std::shared_ptr<QpEnd> qp[2];               // from start_stream on
  std::vector<std::uint8_t> early[2];          // bytes past the handshake before start_stream
  Time last_arrival[2] = {};  // per direction, indexed by the receiving end
  // The opener's identity and attempt id when an attempt dialled it: what its request carries.
  NodeIdentity opener{};
  AttemptId attempt = 0;
};

struct AppId {
  bool active = false;
  int peer = 0;
  std::uint32_t tag = 0;
  bool fetched = false;   // passive: the application has taken the CONNECT_REQUEST
  bool answered = false;  // passive: accepted or rejected
  bool established = false;
  bool closed = false;
  Time start{};
  Time deadline{};
  std::uint32_t peer_epoch = 0;
  std::size_t stream = SIZE_MAX;  // world stream of the connection, once ESTABLISHED
  AttemptId number = 0;           // active: the attempt id given to connect()
  std::size_t request_stream = SIZE_MAX;  // passive: the world stream its request came on
};

struct IwarpNode {
  std::unique_ptr<iw::IwarpCmAgent> agent;
  iw::IwarpCmId listener = 0;
  bool up = true;
  std::uint32_t epoch = 1;
  NodeIdentity identity;
  AttemptId next_number = 1;
  std::optional<Time> timer;
  std::map<iw::IwarpCmId, AppId> ids;
  std::map<iw::StreamId, std::size_t> streams;  // agent stream → world stream
  std::vector<std::pair<Time, Time>> down;
  std::vector<std::tuple<Time, int, std::uint32_t>> closes;  // (when, peer, tag) the application closed
};

enum class Phase : std::uint8_t { chaos, final_round, teardown };

class IwarpWorld {
 public:
  IwarpWorld(std::uint64_t seed, const SimConfig& config)
      : seed_(seed), config_(config), rng_(seed), network_(rng_, Faults{}) {
    static constexpr Duration kDelays[] = {0us, 50us, 5ms, 50ms, 150ms};
    nodes_count_ = config.nodes > 0 ? config.nodes : rng_.between(2, 6);
    tags_ = static_cast<std::uint32_t>(rng_.between(1, 2));
    faults_ = Faults{.max_delay = kDelays[rng_.between(0, 4)]};
    network_.set_faults(faults_);
    simultaneous_ = static_cast<unsigned>(rng_.between(0, 3) * 30);
    reject_ = rng_.percent(60) ? 0u : static_cast<unsigned>(rng_.between(5, 30));
    slow_ = rng_.percent(50) ? static_cast<unsigned>(rng_.between(0, 30)) : 0u;
    close_ = static_cast<unsigned>(rng_.between(0, 2) * 30);
    reconnect_ = static_cast<unsigned>(rng_.between(0, 3) * 30);
    take_unseen_ = static_cast<unsigned>(rng_.between(0, 3) * 30);
    // Some applications leave CONNECT_REQUESTs in their channel for a while: a connect meets
    // more of them unseen, stale ones too (docs/p2p.md, the variant considered and not done).
    slow_fetch_ = rng_.percent(30) ? rng_.between(1, 50) * 1ms : Duration::zero();
    crashes_ = rng_.percent(60) ? 0 : rng_.between(1, 2);
    partitions_ = rng_.percent(25) ? rng_.between(1, 2) : 0;
    shared_guid_ = rng_.percent(30);
    for (int i = 0; i < nodes_count_; ++i) {
      nodes_.emplace_back();
      node(i).identity.guid = shared_guid_ ? 0x1000 : rng_.next();
      open(i);
    }
  }

  SimResult run() {
    trace("seed {} (iwarp): {} nodes, {} tag(s), delays 0..{}us, {}% simultaneous, app reject {}%, slow {}%, "
          "close {}%, reconnect {}%, take unseen {}%, {} crash(es), {} partition(s){}",
          seed_, nodes_count_, tags_, std::chrono::duration_cast<std::chrono::microseconds>(faults_.max_delay).count(),
          simultaneous_, reject_, slow_, close_, reconnect_, take_unseen_, crashes_, partitions_,
          shared_guid_ ? ", shared GUIDs" : "");
    const Duration chaos = rng_.between(0, 3000) * 1ms;
    const int connects = rng_.between(1, 3 * nodes_count_);
    for (int i = 0; i < connects; ++i) {
      const auto [a, b] = pair();
      const std::uint32_t tag = random_tag();
      const Time at = now_ + upto(chaos) / 1ms * 1ms;  // whole ms: independent connects meet now and then
      schedule({.at = at, .kind = Ev::connect, .node = a, .peer = b, .tag = tag});
      if (rng_.percent(simultaneous_)) {
        schedule({.at = rng_.percent(50) ? at : at + network_.delay(), .kind = Ev::connect, .node = b, .peer = a,
                  .tag = tag});
      }
    }
    for (int i = 0; i < crashes_; ++i) {
      // Down for longer than a segment can travel (docs/p2p-resolver.md, decision 7).
      schedule({.at = now_ + upto(chaos), .kind = Ev::crash, .node = rng_.between(0, nodes_count_ - 1),
                .downtime = faults_.max_delay + 1us + rng_.between(0, 2000) * 1ms});
    }
    for (int i = 0; i < partitions_; ++i) {
      const auto [a, b] = pair();
      const Time from = now_ + upto(chaos);
      const Time until = from + rng_.between(1, 1500) * 1ms;
      network_.partition({.a = a, .b = b, .from = from, .until = until});
      ++result_.stats.partitions;
      trace("partition n{} | n{} from {:.3f} ms to {:.3f} ms", a, b, ms(from), ms(until));
    }
    trace("--- chaos phase");
    if (!run_until_quiet()) return finish();
    check_quiet_state("after chaos");
    if (!result_.ok) return finish();

    trace("--- final round");
    phase_ = Phase::final_round;
    network_.heal_all();
    for (int a = 0; a < nodes_count_; ++a) {
      for (int b = a + 1; b < nodes_count_; ++b) {
        for (std::uint32_t tag = 0; tag < tags_; ++tag) {
          const Time at = now_ + network_.delay();
          const int mode = rng_.between(0, 2);  // a asks, b asks, or both at once
          if (mode != 1) schedule({.at = at, .kind = Ev::connect, .node = a, .peer = b, .tag = tag});
          if (mode != 0) schedule({.at = at, .kind = Ev::connect, .node = b, .peer = a, .tag = tag});
        }
      }
    }
    if (!run_until_quiet()) return finish();
    check_quiet_state("after the final round");
    check_final_round();
    if (!result_.ok) return finish();

    trace("--- teardown");
    phase_ = Phase::teardown;
    for (int n = 0; n < nodes_count_; ++n) {
      std::vector<iw::IwarpCmId> ids;
      for (const auto& [id, app] : node(n).ids) {
        if (app.established) ids.push_back(id);
      }
      for (iw::IwarpCmId id : ids) close(n, id);
    }
    if (!run_until_quiet()) return finish();
    check_no_leak();
    return finish();
  }

 private:
  IwarpNode& node(int i) { return nodes_[static_cast<std::size_t>(i)]; }
  const IwarpNode& node(int i) const { return nodes_[static_cast<std::size_t>(i)]; }
  static std::uint32_t address_of(int i) { return 0x0A000001u + static_cast<std::uint32_t>(i); }
  static std::uint16_t port_of(int i) { return static_cast<std::uint16_t>(7000 + i); }
  int index_of(std::uint32_t address) const {
    const auto index = static_cast<int>(address - 0x0A000001u);
    return index >= 0 && index < nodes_count_ ? index : -1;
  }
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
    IwarpNode& n = node(i);
    n.identity.incarnation = (rng_.next() << 16) | (++incarnation_counter_ & 0xFFFF);
    n.agent = std::make_unique<iw::IwarpCmAgent>(iw::IwarpCmAgentConfig{.identity = n.identity});
    n.listener = n.agent->listen({.port = port_of(i), .handshake_timeout = kConnectTimeout});
    n.up = true;
    n.next_number = 1;
    n.timer.reset();
    n.streams.clear();
  }

  void schedule(IwarpEvent e) {
    e.seq = seq_++;
    queue_.push_back(std::move(e));
    std::push_heap(queue_.begin(), queue_.end(), IwarpLater{});
  }

  bool run_until_quiet() {
    while (!queue_.empty()) {
      std::pop_heap(queue_.begin(), queue_.end(), IwarpLater{});
      IwarpEvent e = std::move(queue_.back());
      queue_.pop_back();
      now_ = std::max(now_, e.at);
      if (++result_.stats.events > kMaxIwarpEvents) {
        violation("no quiescence (event budget exhausted)");
        return false;
      }
      dispatch(e);
      if (!result_.ok) return false;
    }
    return true;
  }

  // Whether the end of stream `k` at `side` still belongs to a live incarnation.
  bool end_alive(const SimStream& s, int side) const {
    const IwarpNode& n = node(s.node[side]);
    return s.open[side] && n.up && n.epoch == s.epoch[side];
  }

  void dispatch(const IwarpEvent& e) {
    switch (e.kind) {
      case Ev::syn: on_syn(e); break;
      case Ev::syn_ack: {
        SimStream& s = streams_[e.stream];
        if (!end_alive(s, 0)) return;
        node(s.node[0]).agent->handle_stream_connected(s.id[0]);
        break;
      }
      case Ev::refused: {
        SimStream& s = streams_[e.stream];
        if (!end_alive(s, 0)) return;
        s.open[0] = false;
        node(s.node[0]).streams.erase(s.id[0]);
        node(s.node[0]).agent->handle_stream_failed(s.id[0], e.accept ? ECONNREFUSED : ETIMEDOUT, now_);
        break;
      }
      case Ev::bytes: {
        SimStream& s = streams_[e.stream];
        if (!end_alive(s, e.side)) return;
        if (s.started[e.side]) {
          s.qp[e.side]->engine.handle_bytes(*e.bytes);
          flush_qp(e.stream, e.side);
          break;
        }
        // The handshake takes what is its own; the rest is the queue pair's once it starts.
        const std::size_t used = node(e.node).agent->handle_bytes(s.id[e.side], *e.bytes, now_);
        if (used < e.bytes->size()) {
          s.early[e.side].insert(s.early[e.side].end(), e.bytes->begin() + static_cast<std::ptrdiff_t>(used),
                                 e.bytes->end());
        }
        break;
      }
      case Ev::fin: {
        SimStream& s = streams_[e.stream];
        if (!end_alive(s, e.side)) return;
        s.open[e.side] = false;
        IwarpNode& n = node(e.node);
        n.streams.erase(s.id[e.side]);
        if (s.started[e.side]) s.qp[e.side]->engine.handle_peer_closed();
        if (s.started[e.side]) n.agent->handle_stream_down(s.id[e.side], now_);
        n.agent->handle_stream_closed(s.id[e.side], now_);
        break;
      }
      case Ev::timer: {
        IwarpNode& n = node(e.node);
        if (!n.up || n.epoch != e.epoch) return;
        if (n.timer == e.at) n.timer.reset();
        if (auto d = n.agent->next_deadline(); d && *d <= now_) n.agent->handle_timeout(now_);
        break;
      }
      case Ev::connect: connect(e.node, e.peer, e.tag); break;
      case Ev::fetch: fetch(e); break;
      case Ev::answer: answer(e); break;
      case Ev::close:
        if (!node(e.node).up || node(e.node).epoch != e.epoch) return;
        close(e.node, e.id);
        break;
      case Ev::crash: crash(e.node, e.downtime); return;
      case Ev::restart: {
        IwarpNode& n = node(e.node);
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

  // The SYN reaches the target: its listener takes the stream, or nobody is there.
  void on_syn(const IwarpEvent& e) {
    SimStream& s = streams_[e.stream];
    if (!end_alive(s, 0)) return;
    IwarpNode& target = node(s.node[1]);
    std::optional<iw::StreamId> accepted;
    if (target.up) {
      accepted = target.agent->handle_stream_accepted(
          target.listener,
          iw::Endpoint{.address = address_of(s.node[0]), .port = static_cast<std::uint16_t>(40000 + e.stream % 20000)},
          now_);
    }
    if (!accepted) {  // RST: nobody listens (or the backlog refused it)
      schedule({.at = now_ + network_.delay(), .kind = Ev::refused, .node = s.node[0], .accept = true,
                .stream = e.stream});
      return;
    }
    s.epoch[1] = target.epoch;
    s.id[1] = *accepted;
    s.open[1] = true;
    target.streams[*accepted] = e.stream;
    schedule({.at = network_.stream_arrival(now_, s.last_arrival[0]), .kind = Ev::syn_ack, .node = s.node[0],
              .stream = e.stream, .side = 0});
  }

  // A segment (bytes or FIN) from `side` of stream `k`. Across a partition the stream resets.
  void send(std::size_t k, int side, std::shared_ptr<const std::vector<std::uint8_t>> bytes) {
    SimStream& s = streams_[k];
    const int to = 1 - side;
    if (network_.cut(s.node[0], s.node[1], now_)) {
      reset(k, now_ + kSynTimeout);
      return;
    }
    const Ev kind = bytes ? Ev::bytes : Ev::fin;
    schedule({.at = network_.stream_arrival(now_, s.last_arrival[to]), .kind = kind, .node = s.node[to],
              .stream = k, .side = to, .bytes = std::move(bytes)});
  }

  // TCP gives up on the stream: both ends learn it at `at`.
  void reset(std::size_t k, Time at) {
    SimStream& s = streams_[k];
    for (int side = 0; side < 2; ++side) {
      if (!s.open[side]) continue;
      schedule({.at = std::max(at, s.last_arrival[side]), .kind = Ev::fin, .node = s.node[side], .stream = k,
                .side = side});
    }
  }

  // The queue pair of a started end: receives for the peer's Sends and Sends of its own posted,
  // then full operation with what MPA agreed (the initiator's RTR goes first, the responder's
  // Sends wait for it).
  void start_qp(std::size_t k, int side, const core::MpaResult& mpa, bool initiator) {
    SimStream& s = streams_[k];
    auto qp = std::make_shared<QpEnd>(rng_.next());
    const int messages = rng_.between(1, kMaxMessages);
    qp->salt = rng_.next();
    qp->send_buffer.resize(kSlot * static_cast<std::size_t>(messages));
    qp->recv_buffer.assign(kSlot * static_cast<std::size_t>(kMaxMessages), 0);
    const auto send_key = qp->memory.register_region(0, reinterpret_cast<std::uintptr_t>(qp->send_buffer.data()),
                                                     qp->send_buffer.size(), kAccessLocalWrite);
    const auto recv_key = qp->memory.register_region(0, reinterpret_cast<std::uintptr_t>(qp->recv_buffer.data()),
                                                     qp->recv_buffer.size(), kAccessLocalWrite);
    for (int m = 0; m < kMaxMessages && recv_key; ++m) {
      RecvWr receive{.wr_id = static_cast<std::uint64_t>(m)};
      receive.sg_list.push_back(Sge{reinterpret_cast<std::uintptr_t>(qp->recv_buffer.data()) +
                                        static_cast<std::uint64_t>(m) * kSlot,
                                    kSlot, *recv_key});
      (void)qp->engine.post_recv(receive);
    }
    for (int m = 0; m < messages && send_key; ++m) {
      const auto offset = static_cast<std::uint64_t>(m) * kSlot;
      const auto length = static_cast<std::uint32_t>(rng_.between(std::uint64_t{0}, std::uint64_t{kMaxMessage}));
      qp->lengths.push_back(length);
      for (std::size_t b = 0; b < length; ++b) qp->send_buffer[offset + b] = pattern(qp->salt, offset + b);
      SendWr send{.wr_id = static_cast<std::uint64_t>(m), .opcode = WrOpcode::send};
      send.sg_list.push_back(Sge{reinterpret_cast<std::uintptr_t>(qp->send_buffer.data()) + offset, length, *send_key});
      (void)qp->engine.post_send(send);
    }
    core::StreamParams params;
    params.crc = mpa.crc;
    params.ird = mpa.ird;
    params.ord = mpa.ord;
    params.responder = !initiator;
    if (mpa.rtr != core::RtrType::none) {
      if (initiator) {
        params.send_rtr = mpa.rtr;
      } else {
        params.expect_rtr = mpa.rtr;
      }
    }
    qp->engine.connect(params);
    s.qp[side] = std::move(qp);
    if (!s.early[side].empty()) {
      s.qp[side]->engine.handle_bytes(s.early[side]);
      s.early[side].clear();
    }
    flush_qp(k, side);
  }

  // What the queue pair of end `side` has to send goes on the stream now.
  void flush_qp(std::size_t k, int side) {
    SimStream& s = streams_[k];
    const std::shared_ptr<QpEnd> qp = s.qp[side];
    while (qp && s.open[side] && qp->engine.has_transmit()) {
      std::array<iovec, 16> pieces{};
      const std::size_t count = qp->engine.gather_transmit(pieces);
      auto bytes = std::make_shared<std::vector<std::uint8_t>>();
      for (std::size_t p = 0; p < count; ++p) {
        const auto* data = static_cast<const std::uint8_t*>(pieces[p].iov_base);
        bytes->insert(bytes->end(), data, data + pieces[p].iov_len);
      }
      if (bytes->empty()) break;
      qp->engine.handle_transmitted(bytes->size());
      if (s.open[1 - side]) send(k, side, std::move(bytes));
    }
  }

  // What `receiver` holds must be `sender`'s Sends, once each, in order, intact.
  static std::string verify_data(const QpEnd& sender, const QpEnd& receiver) {
    if (sender.send_cq.completions.size() != sender.lengths.size()) {
      return fmt::format("{} of {} Sends completed", sender.send_cq.completions.size(), sender.lengths.size());
    }
    for (const WorkCompletion& wc : sender.send_cq.completions) {
      if (wc.status != WcStatus::success) return fmt::format("Send {} completed in error", wc.wr_id);
    }
    if (receiver.recv_cq.completions.size() != sender.lengths.size()) {
      return fmt::format("{} of {} Sends received", receiver.recv_cq.completions.size(), sender.lengths.size());
    }
    for (std::size_t m = 0; m < sender.lengths.size(); ++m) {
      const WorkCompletion& wc = receiver.recv_cq.completions[m];
      if (wc.status != WcStatus::success || wc.wr_id != m || wc.byte_len != sender.lengths[m]) {
        return fmt::format("receive {} is wr {} of {} bytes, expected Send {} of {} bytes", m, wc.wr_id, wc.byte_len,
                           m, sender.lengths[m]);
      }
      for (std::size_t b = 0; b < sender.lengths[m]; ++b) {
        if (receiver.recv_buffer[m * kSlot + b] != pattern(sender.salt, m * kSlot + b)) {
          return fmt::format("Send {} differs at byte {}", m, b);
        }
      }
    }
    return {};
  }

  // The agent closes its end: the far end hears the FIN after what was sent before it.
  void close_end(int i, iw::StreamId stream) {
    IwarpNode& n = node(i);
    auto found = n.streams.find(stream);
    if (found == n.streams.end()) {
      n.agent->handle_stream_closed(stream, now_);
      return;
    }
    const std::size_t k = found->second;
    SimStream& s = streams_[k];
    const int side = s.node[0] == i && s.id[0] == stream && s.epoch[0] == n.epoch ? 0 : 1;
    n.streams.erase(found);
    const bool peer_open = s.open[1 - side];
    s.open[side] = false;
    if (peer_open) send(k, side, nullptr);
    n.agent->handle_stream_closed(stream, now_);
  }

  void execute(int i, iw::IwarpCmAction& action) {
    IwarpNode& n = node(i);
    switch (action.kind) {
      case AgentAction::open_stream: {
        const int target = index_of(action.destination.address);
        const std::size_t k = streams_.size();
        SimStream& s = streams_.emplace_back();
        if (action.id == watched_attempt_) watched_dialled_ = true;
        if (auto app = n.ids.find(action.id); app != n.ids.end() && app->second.active) {
          s.opener = n.identity;
          s.attempt = app->second.number;
        }
        s.node[0] = i;
        s.node[1] = target < 0 ? i : target;
        s.epoch[0] = n.epoch;
        s.id[0] = action.stream;
        s.open[0] = true;
        n.streams[action.stream] = k;
        if (target < 0 || network_.cut(i, target, now_)) {
          schedule({.at = now_ + kSynTimeout, .kind = Ev::refused, .node = i, .accept = false, .stream = k});
          return;
        }
        schedule({.at = network_.stream_arrival(now_, s.last_arrival[1]), .kind = Ev::syn, .node = target,
                  .stream = k, .side = 1});
        return;
      }
      case AgentAction::transmit: {
        auto found = n.streams.find(action.stream);
        if (found == n.streams.end()) return;
        const SimStream& s = streams_[found->second];
        const int side = s.node[0] == i && s.id[0] == action.stream ? 0 : 1;
        send(found->second, side, std::make_shared<const std::vector<std::uint8_t>>(std::move(action.bytes)));
        return;
      }
      case AgentAction::start_stream: {
        auto found = n.streams.find(action.stream);
        if (found == n.streams.end()) return;
        SimStream& s = streams_[found->second];
        const int side = s.node[0] == i && s.id[0] == action.stream ? 0 : 1;
        s.started[side] = true;
        start_qp(found->second, side, action.mpa, action.initiator);
        return;
      }
      case AgentAction::terminate_stream:
      case AgentAction::close_stream:
        close_end(i, action.stream);
        return;
    }
  }

  // Moves a node's outputs on: stream actions, events to its application, its deadline.
  void pump(int i) {
    IwarpNode& n = node(i);
    if (!n.up) return;
    for (;;) {
      if (auto action = n.agent->poll_action()) {
        execute(i, *action);
        continue;
      }
      if (auto event = n.agent->poll_event()) {
        on_event(i, *event);
        if (!result_.ok) return;
        continue;
      }
      break;
    }
    if (auto d = n.agent->next_deadline(); d && (!n.timer || *d < *n.timer)) {
      n.timer = std::max(*d, now_);
      schedule({.at = *n.timer, .kind = Ev::timer, .node = i, .epoch = n.epoch});
    }
  }

  void connect(int a, int b, std::uint32_t tag) {
    IwarpNode& n = node(a);
    if (!n.up) return;
    const AttemptId number = n.next_number++;
    const bool may_take = rng_.percent(take_unseen_);
    iw::IwarpCmId taken = 0;
    std::size_t taken_stream = SIZE_MAX;
    // docs/p2p.md R5: the application has not fetched the request yet: the CM takes it back.
    const auto take_back = [&](iw::IwarpCmId request) {
      auto it = n.ids.find(request);
      if (!may_take || it == n.ids.end() || it->second.fetched) return false;
      taken = request;
      taken_stream = it->second.request_stream;
      n.ids.erase(it);
      return true;
    };
    auto id = n.agent->connect({.destination = {.address = address_of(b), .port = port_of(b)},
                                .tag = tag,
                                .number = number,
                                .timeout = kConnectTimeout},
                               now_, take_back);
    if (!id) {
      trace("n{}: connect to n{} tag {}: {}", a, b, tag, std::make_error_code(id.error()).message());
      return;
    }
    ++result_.stats.attempts;
    if (taken != 0) {
      ++result_.stats.taken_back;
      trace("n{}: connect c{} to n{} tag {} (number {}) takes back the unseen request c{}", a, *id, b, tag, number,
            taken);
    } else {
      trace("n{}: connect c{} to n{} tag {} (number {})", a, *id, b, tag, number);
    }
    n.ids[*id] = AppId{.active = true, .peer = b, .tag = tag, .fetched = true, .start = now_,
                       .deadline = now_ + kConnectTimeout, .number = number};
    if (taken != 0 && taken_stream < streams_.size() && streams_[taken_stream].attempt != 0) {
      check_unseen_request_rule(a, *id, number, streams_[taken_stream]);
    }
  }

  // docs/p2p.md R5a: the taken-back request meets the attempt under R3 before the attempt has
  // sent anything. Its sender's (GUID, attempt id, incarnation) the larger: the attempt is bound
  // to it and dials nothing; ours the larger: our stream is opened now.
  void check_unseen_request_rule(int a, iw::IwarpCmId id, AttemptId number, const SimStream& request) {
    IwarpNode& n = node(a);
    const bool ours_larger = std::tie(n.identity.guid, number, n.identity.incarnation) >
                             std::tie(request.opener.guid, request.attempt, request.opener.incarnation);
    watched_attempt_ = id;
    watched_dialled_ = false;
    pump(a);
    watched_attempt_ = 0;
    if (watched_dialled_ != ours_larger) {
      violation(fmt::format("rule R5a: n{}'s attempt c{} (GUID {:#x}, attempt {}) took back the unseen request of "
                            "(GUID {:#x}, attempt {}) and {}",
                            a, id, n.identity.guid, number, request.opener.guid, request.attempt,
                            watched_dialled_ ? "dialled" : "did not dial"));
    }
  }

  // The application takes a CONNECT_REQUEST from its channel and decides.
  void fetch(const IwarpEvent& e) {
    IwarpNode& n = node(e.node);
    if (!n.up || n.epoch != e.epoch) return;
    auto it = n.ids.find(e.id);
    if (it == n.ids.end() || it->second.fetched) return;
    it->second.fetched = true;
    const bool chaos = phase_ == Phase::chaos;
    const bool accept = !chaos || !rng_.percent(reject_);
    const Duration delay = chaos && rng_.percent(slow_) ? rng_.between(10, 200) * 1ms : network_.delay();
    schedule({.at = now_ + delay, .kind = Ev::answer, .node = e.node, .epoch = n.epoch, .id = e.id, .accept = accept});
  }

  void answer(const IwarpEvent& e) {
    IwarpNode& n = node(e.node);
    if (!n.up || n.epoch != e.epoch) return;
    auto it = n.ids.find(e.id);
    if (it == n.ids.end() || it->second.answered) return;
    it->second.answered = true;
    if (e.accept) {
      const auto status = n.agent->accept(e.id, {.number = n.next_number++}, now_);
      trace("n{}: accept c{}: {}", e.node, e.id, status ? "ok" : "EINVAL");
      return;
    }
    const auto status = n.agent->reject(e.id, {}, now_);
    trace("n{}: reject c{}: {}", e.node, e.id, status ? "ok" : "EINVAL");
    const AppId rejected = it->second;
    if (status) {
      n.ids.erase(it);
      n.agent->destroy(e.id, now_);
    }
    if (status && rng_.percent(50)) {  // turned down to connect itself (decision 2)
      schedule({.at = now_ + network_.delay(), .kind = Ev::connect, .node = e.node, .peer = rejected.peer,
                .tag = rejected.tag});
    }
  }

  void close(int i, iw::IwarpCmId id) {
    IwarpNode& n = node(i);
    auto it = n.ids.find(id);
    if (it == n.ids.end() || !it->second.established) return;
    if (!n.agent->disconnect(id, now_)) return;
    trace("n{}: close c{}", i, id);
    it->second.established = false;
    it->second.closed = true;
    n.closes.emplace_back(now_, it->second.peer, it->second.tag);
    const AppId app = it->second;
    pump(i);
    if (phase_ == Phase::chaos && rng_.percent(reconnect_)) {
      schedule({.at = rng_.percent(50) ? now_ : now_ + network_.delay(), .kind = Ev::connect, .node = i,
                .peer = app.peer, .tag = app.tag});
    }
  }

  void crash(int i, Duration downtime) {
    IwarpNode& n = node(i);
    if (!n.up) return;
    trace("n{}#{}: CRASH for {}ms", i, n.epoch, std::chrono::duration_cast<std::chrono::milliseconds>(downtime).count());
    ++result_.stats.crashes;
    collect_stats(*n.agent);
    // The kernel resets the process's connections: every far end hears of it.
    for (const auto& [stream, k] : n.streams) {
      SimStream& s = streams_[k];
      const int side = s.node[0] == i && s.id[0] == stream && s.epoch[0] == n.epoch ? 0 : 1;
      s.open[side] = false;
      if (s.open[1 - side]) send(k, side, nullptr);
    }
    n.streams.clear();
    n.agent.reset();
    n.up = false;
    n.ids.clear();
    n.timer.reset();
    n.down.emplace_back(now_, Time::max());
    schedule({.at = now_ + downtime, .kind = Ev::restart, .node = i, .epoch = n.epoch});
  }

  void on_event(int i, const iw::IwarpCmEvent& e) {
    IwarpNode& n = node(i);
    switch (e.kind) {
      case AgentEvent::connect_request: {
        const int peer = index_of(e.peer.address);
        auto stream = n.streams.find(e.stream);
        n.ids[e.id] = AppId{.active = false, .peer = peer, .tag = e.tag,
                            .request_stream = stream == n.streams.end() ? SIZE_MAX : stream->second};
        trace("n{}: CONNECT_REQUEST c{} from n{} tag {}", i, e.id, peer, e.tag);
        // The application fetches it a little later: until then a connect can take it back.
        schedule({.at = now_ + network_.delay() + upto(slow_fetch_), .kind = Ev::fetch, .node = i, .epoch = n.epoch,
                  .id = e.id});
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
        app.established = true;
        app.peer_epoch = node(app.peer).epoch;
        const auto found = n.streams.find(e.stream);
        app.stream = found == n.streams.end() ? SIZE_MAX : found->second;
        if (app.stream != SIZE_MAX) {
          SimStream& s = streams_[app.stream];
          s.established[s.node[0] == i && s.id[0] == e.stream ? 0 : 1] = true;
        }
        ++result_.stats.established;
        trace("n{}: c{} ESTABLISHED on S{}", i, e.id, app.stream);
        int count = 0;
        for (const auto& [id, other] : n.ids) count += other.established && other.peer == app.peer && other.tag == app.tag;
        if (count > 1) {
          violation(fmt::format("uniqueness: n{} holds {} connections to n{} tag {}", i, count, app.peer, app.tag));
          return;
        }
        if (phase_ == Phase::chaos && rng_.percent(close_)) {
          schedule({.at = now_ + (rng_.percent(30) ? Duration::zero() : network_.delay()), .kind = Ev::close,
                    .node = i, .epoch = n.epoch, .id = e.id});
        }
        return;
      }
      case AgentEvent::rejected:
      case AgentEvent::unreachable:
      case AgentEvent::connect_error: {
        auto it = n.ids.find(e.id);
        if (it == n.ids.end()) return;
        if (it->second.active) {
          ++result_.stats.timed_out;
          if (now_ > it->second.deadline) {
            violation(fmt::format("liveness: n{} attempt c{} ended after its deadline", i, e.id));
            return;
          }
          const bool by_application = e.kind == AgentEvent::rejected && e.reason == iw::IwarpEndReason::application;
          if (!by_application && !excused(i, it->second)) {
            violation(fmt::format("liveness: n{}'s attempt c{} to n{} tag {} (started at {:.3f} ms) ended in an "
                                  "error ({}) though both nodes stayed up and could reach each other",
                                  i, e.id, it->second.peer, it->second.tag, ms(it->second.start),
                                  static_cast<int>(e.kind)));
            return;
          }
        }
        trace("n{}: c{} ends ({})", i, e.id, static_cast<int>(e.kind));
        n.ids.erase(it);
        n.agent->destroy(e.id, now_);  // rdma_destroy_id once the id ended
        return;
      }
      case AgentEvent::disconnected: {
        trace("n{}: c{} DISCONNECTED", i, e.id);
        auto it = n.ids.find(e.id);
        if (it == n.ids.end()) return;
        AppId& app = it->second;
        if (app.established && !app.closed && !disconnect_explained(i, app)) {
          violation(fmt::format("integrity: n{}'s connection c{} to n{} tag {} ended though neither application "
                                "closed it, n{} did not restart and no partition reset it",
                                i, e.id, app.peer, app.tag, app.peer));
          return;
        }
        app.established = false;
        return;
      }
      case AgentEvent::timewait_exit:
        n.ids.erase(e.id);
        n.agent->destroy(e.id, now_);
        return;
    }
  }

  // A connection may end unasked when it never was ESTABLISHED at the peer (a responder is
  // ESTABLISHED as it accepts: a request whose initiator gave up meanwhile, say the passive peer's
  // aborted one, dies at once), when the peer's application closed one of this key, when the
  // peer restarted, or when a partition between the two reset streams since.
  bool disconnect_explained(int i, const AppId& app) const {
    if (app.stream != SIZE_MAX) {
      const SimStream& s = streams_[app.stream];
      if (!s.established[s.node[0] == i ? 1 : 0]) return true;
    }
    const IwarpNode& peer = node(app.peer);
    if (!peer.up || peer.epoch != app.peer_epoch) return true;
    for (const auto& [when, to, tag] : peer.closes) {
      if (to == i && tag == app.tag) return true;
    }
    for (const Partition& p : network_.partitions()) {
      if ((p.a == i && p.b == app.peer) || (p.a == app.peer && p.b == i)) return true;
    }
    return false;
  }

  bool excused(int i, const AppId& attempt) const {
    for (const auto& [when, peer, tag] : node(attempt.peer).closes) {
      if (peer == i && tag == attempt.tag && when >= attempt.start) return true;
    }
    const Time from = attempt.start - kConnectTimeout;
    for (int n : {i, attempt.peer}) {
      for (const auto& [crash, restart] : node(n).down) {
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

  void check_quiet_state(const char* when) {
    for (int i = 0; i < nodes_count_ && result_.ok; ++i) {
      for (const auto& [id, app] : node(i).ids) {
        if (!app.established && !app.closed) {
          violation(fmt::format("liveness {}: n{} c{} ({}) neither established nor ended", when, i, id,
                                app.active ? "attempt" : "request"));
          return;
        }
      }
    }
  }

  // Every pair and tag: exactly one connection, and its two ends are the two ends of one stream.
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
            mirrored |= app.established && app.peer == a && app.tag == tag && app.stream == mine->stream &&
                        mine->stream != SIZE_MAX;
          }
          if (!mirrored) {
            violation(fmt::format("integrity: n{}'s connection to n{} tag {} (S{}) has no mirror", a, b, tag,
                                  mine->stream));
            return;
          }
          const SimStream& s = streams_[mine->stream];
          const int side = s.node[0] == a ? 0 : 1;
          if (!s.qp[0] || !s.qp[1]) {
            violation(fmt::format("integrity: S{} between n{} and n{} has no queue pair at one end", mine->stream, a, b));
            return;
          }
          if (std::string failed = verify_data(*s.qp[side], *s.qp[1 - side]); !failed.empty()) {
            violation(fmt::format("integrity: data from n{} to n{} tag {} on S{}: {}", a, b, tag, mine->stream, failed));
            return;
          }
          result_.stats.work_requests += s.qp[side]->lengths.size();
        }
      }
    }
  }

  void check_no_leak() {
    for (int i = 0; i < nodes_count_ && result_.ok; ++i) {
      const iw::IwarpCmAgent& agent = *node(i).agent;
      if (!node(i).ids.empty() || agent.stream_count() != 0 || agent.id_count() != 1 || agent.next_deadline() ||
          agent.resolver().tracked_links() != 0 || agent.resolver().tracked_attempts() != 0) {
        violation(fmt::format("no leak: n{} keeps app ids {} streams {} ids {} (the listener is 1) timer {} links {} "
                              "attempts {}",
                              i, node(i).ids.size(), agent.stream_count(), agent.id_count(),
                              agent.next_deadline().has_value(), agent.resolver().tracked_links(),
                              agent.resolver().tracked_attempts()));
      }
    }
  }

  void collect_stats(const iw::IwarpCmAgent& agent) {
    result_.stats.collisions += agent.stats().collisions_lost;
    result_.stats.rejected_duplicate += agent.stats().rejects_sent_duplicate;
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
  unsigned close_ = 0;
  unsigned reconnect_ = 0;
  unsigned take_unseen_ = 0;
  Duration slow_fetch_{};
  iw::IwarpCmId watched_attempt_ = 0;  // R5a: the attempt whose connect() took back a request
  bool watched_dialled_ = false;
  int crashes_ = 0;
  int partitions_ = 0;
  bool shared_guid_ = false;
  std::uint64_t incarnation_counter_ = 0;
  Phase phase_ = Phase::chaos;
  Time now_ = Time{} + 1s;
  std::uint64_t seq_ = 0;
  std::vector<IwarpEvent> queue_;  // a binary heap ordered by IwarpLater
  std::vector<IwarpNode> nodes_;
  std::vector<SimStream> streams_;
  SimResult result_;
};

}  // namespace

SimResult run_iwarp_simulation(std::uint64_t seed, const SimConfig& config) {
  IwarpWorld world(seed, config);
  return world.run();
}

}  // namespace peercm::sim
