// `peercm cmtime`: how long each step of connection setup and teardown takes, after
// rdma-core's cmtime (librdmacm/examples/cmtime.c), in one process over 127.0.0.1.
//
// The steps run in phases, as cmtime does: every connection goes through one step before
// any goes through the next (create id, resolve addr, resolve route, create QP, connect,
// disconnect, destroy). Each step reports its total (from the first call to the last
// completion) and its per-connection time (call to completion) as average/min/max.
//
//   client-server: two contexts; the server listens and accepts in its own thread, the
//     client drives N CmIds through the steps. connect ends when both sides saw
//     ESTABLISHED, disconnect when both sides saw DISCONNECTED.
//   p2p: two contexts, each with a listener; each creates N CmIds that connect to the
//     other's listener with the same tags (tag i for pair i), both released by one barrier
//     so that every pair collides. design.md §3: each colliding pair becomes exactly one
//     connection, each side sees ESTABLISHED on the CmId it connected with and never a
//     CONNECT_REQUEST. Any CONNECT_REQUEST is accepted (so that the run ends and counts
//     what happened) and reported as an error.
//
// --transport roce runs both modes over RoCEv2 (docs/roce-transport.md): each node is an
// IPv4 address of its own (a random 127/8 one: a RoCE context binds (address, 4791)), and a
// connection is named by its ends' addresses and wire QPNs (its addresses alone are shared
// by every connection between the two nodes). The TCP baseline is plain TCP either way.
//
// In the same run, a plain-TCP baseline: N non-blocking connects issued at once, each
// followed by an 8-byte request answered with 8 bytes, timed per connection from connect()
// to the reply; the ratio peercm/TCP compares the connect step with it. Both are also given
// as the process's CPU time (every thread, user and system) per connection over the connect
// step and over the baseline: the work each does, wherever the scheduler put it.
//
// Connect private data (after the CM header in p2p mode): magic "CMTM", the pair number.
#include <fmt/core.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "endpoint.hpp"
#include "subcommands.hpp"
#include "tcp_baseline.hpp"

namespace peercm::tool {
namespace {

using TimePoint = Clock::time_point;
using std::chrono::milliseconds;

enum Step : std::size_t {
  kCreateId,
  kResolveAddr,
  kResolveRoute,
  kCreateQp,
  kConnect,
  kDisconnect,
  kDestroy,
  kStepCount
};
constexpr std::array<const char*, kStepCount> kStepNames = {"create_id", "resolve_addr", "resolve_route", "create_qp",
                                                            "connect",   "disconnect",   "destroy"};

constexpr std::uint32_t kPrivateMagic = 0x4D544D43;  // "CMTM"
constexpr std::size_t kExchangeSize = 8;             // TCP baseline request and reply
constexpr std::size_t kMaxListedTags = 8;            // tags named in an error message
constexpr int kRoceAddressAttempts = 32;  // random 127/8 addresses tried for a RoCE listener

// The listen() backlog that lets one peer hold `requests` undecided requests at once: B1
// (docs/p2p.md) gives one source address at most backlog - backlog/4 of them, and every
// request here comes from the one other node. A smaller backlog refuses the requests past that
// share (REJ 28 over RoCE: REJECTED on the peer's attempt) whenever the accepting side runs
// behind, which is B1 working, not a CM fault.
int backlog_for_one_peer(std::uint32_t requests) {
  const std::uint32_t wanted = requests + 16;
  return static_cast<int>(wanted + (wanted + 2) / 3);  // b - b/4 >= wanted
}

double micros(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

// One end of a connection: iWARP (address, TCP port); RoCE (address, wire QPN), since the
// ports a RoCE id reports are its service's, shared by its node's connections.
using EndKey = std::tuple<std::uint32_t, std::uint16_t, std::uint32_t>;
EndKey end_key(const sockaddr_in& a, std::uint32_t qpn) {
  return qpn != 0 ? EndKey{a.sin_addr.s_addr, 0, qpn} : EndKey{a.sin_addr.s_addr, a.sin_port, 0};
}

std::string end_text(const sockaddr_in& a, std::uint32_t qpn) {
  return qpn != 0 ? fmt::format("{}/qp{}", format_address(a), qpn) : format_address(a);
}

std::string describe(const CmEvent& event) {
  std::string text(to_string(event.type));
  if (event.status != 0) text += fmt::format(" ({})", std::generic_category().message(event.status));
  if (event.reject_reason != RejectReason::none) text += fmt::format(" [reason: {}]", to_string(event.reject_reason));
  return text;
}

std::string list_tags(const std::vector<std::uint32_t>& tags, std::size_t count) {
  std::string text;
  for (std::size_t i = 0; i < tags.size(); ++i) text += fmt::format("{}{}", i ? ", " : "", tags[i]);
  if (count > tags.size()) text += ", ...";
  return text;
}

// Another thread failed and said why: unwind without adding an error of our own.
struct Aborted {};

// CPU time of the whole process (every thread, user and system), us.
double process_cpu_us() {
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) * 1e6 +
         static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec);
}

// The process's CPU time over one phase that several threads run: the first start() opens
// it, the first end() closes it.
class CpuWindow {
 public:
  void start() {
    std::lock_guard lock(mutex_);
    if (!started_) started_ = process_cpu_us();
  }
  void end() {
    std::lock_guard lock(mutex_);
    if (started_ && !used_) used_ = process_cpu_us() - *started_;
  }
  double used_us() {
    std::lock_guard lock(mutex_);
    return used_.value_or(0.0);
  }

 private:
  std::mutex mutex_;
  std::optional<double> started_;
  std::optional<double> used_;
};

// What the threads of one run share: the wait bound, the error list and the abort flag.
struct Shared {
  milliseconds timeout{kWaitTimeout};
  std::atomic<bool> abort{false};
  std::mutex mutex;
  std::vector<std::string> errors;
  CpuWindow connect_cpu;  // the connect step

  void error(std::string text) {
    std::lock_guard lock(mutex);
    errors.push_back(std::move(text));
  }
  void fatal(std::string text) {
    error(std::move(text));
    abort.store(true);
  }
  void check() const {
    if (abort.load()) throw Aborted{};
  }
};

// A barrier for the threads that drive ids (one in client-server mode, two in p2p mode).
// It spins (yielding) rather than sleeping so that both p2p sides leave it within
// microseconds of each other; it gives up when another thread failed or after the timeout.
class SpinBarrier {
 public:
  explicit SpinBarrier(int parties) : parties_(parties) {}
  // `round` is the caller's own count of passed barriers.
  void arrive_and_wait(int& round, Shared& shared) {
    ++round;
    arrived_.fetch_add(1);
    const auto deadline = Clock::now() + shared.timeout;
    while (arrived_.load() < round * parties_) {
      shared.check();
      if (Clock::now() >= deadline)
        throw ToolError(fmt::format("timed out after {} ms waiting for the other side to finish a step",
                                    shared.timeout.count()));
      std::this_thread::yield();
    }
  }

 private:
  int parties_;
  std::atomic<int> arrived_{0};
};

// One connection as one node sees it.
struct Conn {
  std::unique_ptr<CmId> id;
  std::uint32_t index = 0;  // the pair number (and p2p tag); passive ids: from the private data
  bool passive = false;     // created by a CONNECT_REQUEST
  std::array<std::optional<TimePoint>, kStepCount> start;
  std::array<std::optional<TimePoint>, kStepCount> done;
  bool established = false;
  bool disconnected = false;
  bool connect_failed = false;  // connect() returned an error at once (p2p rule 5)
  sockaddr_in local{};          // as seen at ESTABLISHED
  sockaddr_in peer{};
  std::uint32_t local_qpn = 0;  // RoCE: the wire QPNs of the two ends (0 over iWARP)
  std::uint32_t peer_qpn = 0;
  EndKey local_key() const { return end_key(local, local_qpn); }
  EndKey peer_key() const { return end_key(peer, peer_qpn); }
  std::string local_text() const { return end_text(local, local_qpn); }
  std::string peer_text() const { return end_text(peer, peer_qpn); }
};

struct NodeStats {
  std::uint64_t collisions_won = 0;
  std::uint64_t collisions_lost = 0;
  std::uint64_t rejects_sent_collision = 0;
  std::uint64_t rejects_sent_duplicate = 0;
  std::uint64_t rejects_received_collision = 0;
  std::uint64_t rejects_received_duplicate = 0;
};

// One context with its event channel, PD, CQ, optional listener and the ids it drives
// (`own`) or accepted (`accepted`). Each node is driven by one thread; other threads read
// only its atomic counters (and everything else after the driving thread is joined).
class Node {
 public:
  Node(std::string name, ProgressMode mode, Transport transport, bool peer_to_peer, std::optional<std::int64_t> crc,
       Shared& shared)
      : name_(std::move(name)), shared_(shared), peer_to_peer_(peer_to_peer), crc_(crc), device_(mode, transport) {
    auto pd = ProtectionDomain::allocate(*device_.context);
    if (!pd) throw_errc("ProtectionDomain::allocate", pd.error());
    pd_ = std::move(*pd);
    auto cq = CompletionQueue::create(*device_.context, 4096);
    if (!cq) throw_errc("CompletionQueue::create", cq.error());
    cq_ = std::move(*cq);
  }
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  const std::string& name() const { return name_; }

  // On 127.0.0.1 (iWARP), or on a random 127/8 address of this node's own (RoCE: an
  // address whose (address, 4791) another context holds is replaced by another).
  void listen(int backlog) {
    const bool roce = device_.transport == Transport::roce;
    for (int attempt = 0;; ++attempt) {
      auto created = CmId::create(*device_.context, *device_.channel, nullptr, device_.transport);
      if (!created) throw_errc("CmId::create (listener)", created.error());
      listener_ = std::move(*created);
      set_option(*listener_, CmOption::peer_to_peer, peer_to_peer_ ? 1 : 0, "listener");
      if (crc_) set_option(*listener_, CmOption::crc, *crc_, "listener");
      auto ok = listener_->bind(*parse_address(roce ? random_loopback_host() : "127.0.0.1", 0));
      if (!ok) throw_errc(fmt::format("{}: bind", name_), ok.error());
      ok = listener_->listen(backlog);
      if (ok) break;
      if (!roce || ok.error() != std::errc::address_in_use || attempt + 1 >= kRoceAddressAttempts)
        throw_errc(fmt::format("{}: listen", name_), ok.error());
      listener_.reset();
    }
    listen_address_ = listener_->local_address();
  }
  const sockaddr_in& listen_address() const { return listen_address_; }
  // A server expects this many accepted connections before connect is complete.
  void expect_accepted(std::uint32_t n) { expected_accepted_.store(n); }

  // --- the steps of the ids this node drives ---

  void create_ids(std::uint32_t n) {
    own_.clear();
    own_.reserve(n);  // by_id_ points into it
    expected_own_.store(n);
    phase_start_[kCreateId] = Clock::now();
    for (std::uint32_t i = 0; i < n; ++i) {
      Conn& c = own_.emplace_back();
      c.index = i;
      c.start[kCreateId] = Clock::now();
      auto created = CmId::create(*device_.context, *device_.channel, nullptr, device_.transport);
      c.done[kCreateId] = Clock::now();
      if (!created) throw_errc(fmt::format("{}: CmId::create (pair {})", name_, i), created.error());
      c.id = std::move(*created);
      by_id_[c.id.get()] = &c;
    }
    // Options are not part of rdma_create_id's time.
    for (Conn& c : own_) {
      set_option(*c.id, CmOption::peer_to_peer, peer_to_peer_ ? 1 : 0, "id");
      if (peer_to_peer_) set_option(*c.id, CmOption::p2p_tag, c.index, "id");
      if (crc_) set_option(*c.id, CmOption::crc, *crc_, "id");
    }
  }

  void resolve_addrs(const sockaddr_in& destination) {
    phase_start_[kResolveAddr] = Clock::now();
    for (Conn& c : own_) {
      c.start[kResolveAddr] = Clock::now();
      auto ok = c.id->resolve_addr(destination, shared_.timeout);
      if (!ok) throw_errc(fmt::format("{}: resolve_addr (pair {})", name_, c.index), ok.error());
    }
    pump_until([&] { return resolved_[0] == own_.size(); }, *phase_start_[kResolveAddr] + shared_.timeout,
               "ADDR_RESOLVED");
  }

  void resolve_routes() {
    phase_start_[kResolveRoute] = Clock::now();
    for (Conn& c : own_) {
      c.start[kResolveRoute] = Clock::now();
      auto ok = c.id->resolve_route(shared_.timeout);
      if (!ok) throw_errc(fmt::format("{}: resolve_route (pair {})", name_, c.index), ok.error());
    }
    pump_until([&] { return resolved_[1] == own_.size(); }, *phase_start_[kResolveRoute] + shared_.timeout,
               "ROUTE_RESOLVED");
  }

  void create_qps() {
    phase_start_[kCreateQp] = Clock::now();
    const QpInitAttr attr = qp_attr();
    for (Conn& c : own_) {
      c.start[kCreateQp] = Clock::now();
      auto qp = c.id->create_qp(*pd_, attr);
      c.done[kCreateQp] = Clock::now();
      if (!qp) throw_errc(fmt::format("{}: create_qp (pair {})", name_, c.index), qp.error());
    }
  }

  // Issues every connect; the caller waits for completion (it depends on the other side too).
  void connect_all() {
    std::vector<ConnParam> params(own_.size());
    for (std::size_t i = 0; i < own_.size(); ++i) {
      ByteWriter w;
      w.u32(kPrivateMagic).u32(own_[i].index);
      params[i].private_data = std::move(w.bytes());
    }
    phase_start_[kConnect] = Clock::now();
    for (std::size_t i = 0; i < own_.size(); ++i) {
      Conn& c = own_[i];
      c.start[kConnect] = Clock::now();
      auto ok = c.id->connect(params[i]);
      if (ok) continue;
      const bool rule5 =
          ok.error() == std::errc::connection_already_in_progress || ok.error() == std::errc::already_connected;
      if (!peer_to_peer_ || !rule5) throw_errc(fmt::format("{}: connect (pair {})", name_, c.index), ok.error());
      // design.md §3 rule 5: the peer's request for this key got here first and was
      // delivered, so the pair did not collide. Counted and reported; the run goes on.
      c.connect_failed = true;
      connect_failed_.fetch_add(1);
    }
  }

  void disconnect_all() {
    phase_start_[kDisconnect] = Clock::now();
    for (Conn& c : own_) {
      if (!c.established) continue;
      c.start[kDisconnect] = Clock::now();
      auto ok = c.id->disconnect();
      // The peer may have closed this very connection a moment ago (p2p: both sides
      // disconnect); whether DISCONNECTED arrives is what counts.
      if (!ok && ok.error() != std::errc::not_connected && ok.error() != std::errc::invalid_argument)
        throw_errc(fmt::format("{}: disconnect (pair {})", name_, c.index), ok.error());
    }
  }

  void destroy_all() {
    phase_start_[kDestroy] = Clock::now();
    for (Conn& c : own_) {
      by_id_.erase(c.id.get());
      c.start[kDestroy] = Clock::now();
      c.id.reset();
      c.done[kDestroy] = Clock::now();
    }
  }

  // --- completion, readable from any thread ---

  // Every own id established (or failed at once) and every accepted request established:
  // a server's expected ones, and (p2p) any request taken so far, whose ESTABLISHED must be
  // seen before the other side may start to disconnect.
  bool connect_complete() const {
    return established_.load() + connect_failed_.load() >= expected_own_.load() &&
           accepted_established_.load() >= std::max<std::size_t>(expected_accepted_.load(), requests_.load());
  }
  bool disconnect_complete() const {
    return disconnected_.load() >= established_.load() &&
           accepted_disconnected_.load() >= accepted_established_.load();
  }
  std::string status() const {
    return fmt::format("{}: {} of {} established, {} disconnected; accepted {} established, {} disconnected; {} "
                       "connect requests",
                       name_, established_.load(), expected_own_.load(), disconnected_.load(),
                       accepted_established_.load(), accepted_disconnected_.load(), requests_.load());
  }

  // Handles events until `done()` holds; throws ToolError at `deadline`, Aborted when
  // another thread failed.
  template <class Done>
  void pump_until(Done done, TimePoint deadline, std::string_view what) {
    const TimePoint entered = Clock::now();
    for (;;) {
      if (done()) return;
      shared_.check();
      const auto now = Clock::now();
      if (now >= deadline)
        throw ToolError(fmt::format("{}: timed out after {:.0f} ms waiting for {} ({})", name_,
                                    micros(now - entered) / 1000, what, status()));
      // Short slices: the condition may depend on the other node's thread. Not 1 ms:
      // get_event() truncates what is left of its timeout to whole milliseconds and, in
      // inline progress mode, gives up without driving progress when that is 0.
      auto event = device_.channel->get_event(milliseconds(2));
      if (!event) {
        if (event.error() == std::errc::timed_out) continue;
        throw_errc(fmt::format("{}: get_event", name_), event.error());
      }
      handle(std::move(*event), Clock::now());
    }
  }

  // --- results (after the driving thread is done) ---

  const std::vector<Conn>& own() const { return own_; }
  const std::deque<Conn>& accepted() const { return accepted_; }
  const std::array<std::optional<TimePoint>, kStepCount>& phase_start() const { return phase_start_; }
  std::size_t requests() const { return requests_.load(); }
  std::size_t own_established() const { return established_.load(); }
  std::size_t accepted_established() const { return accepted_established_.load(); }
  std::size_t connect_failed() const { return connect_failed_.load(); }
  NodeStats stats() const {
    const CmStats s = cm_stats(*device_.context);
    NodeStats n;
    n.collisions_won = s.collisions_won;
    n.collisions_lost = s.collisions_lost;
    n.rejects_sent_collision = s.rejects_sent[static_cast<int>(RejectReason::collision)];
    n.rejects_sent_duplicate = s.rejects_sent[static_cast<int>(RejectReason::duplicate)];
    n.rejects_received_collision = s.rejects_received[static_cast<int>(RejectReason::collision)];
    n.rejects_received_duplicate = s.rejects_received[static_cast<int>(RejectReason::duplicate)];
    return n;
  }

 private:
  QpInitAttr qp_attr() const {
    QpInitAttr attr;
    attr.send_cq = cq_.get();
    attr.recv_cq = cq_.get();
    attr.caps.max_send_wr = 16;
    attr.caps.max_recv_wr = 16;
    attr.caps.max_send_sge = 1;
    attr.caps.max_recv_sge = 1;
    attr.caps.max_inline_data = 64;
    return attr;
  }

  void set_option(CmId& id, CmOption option, std::int64_t value, std::string_view what) {
    auto ok = id.set_option(option, value);
    if (!ok) throw_errc(fmt::format("{}: set_option on {}", name_, what), ok.error());
  }

  void handle(CmEvent event, TimePoint now) {
    if (event.type == CmEventType::connect_request) {
      on_request(event, now);
      return;
    }
    auto it = by_id_.find(event.id);
    if (it == by_id_.end()) return;  // a late event of an id already destroyed
    Conn& c = *it->second;
    const auto where = [&] {
      return fmt::format("{}: {} on {} {}", name_, describe(event), c.passive ? "accepted id of pair" : "pair",
                         c.index);
    };
    switch (event.type) {
      case CmEventType::addr_resolved:
      case CmEventType::route_resolved: {
        const Step step = event.type == CmEventType::addr_resolved ? kResolveAddr : kResolveRoute;
        if (!c.done[step]) {
          c.done[step] = now;
          ++resolved_[step == kResolveAddr ? 0 : 1];
        }
        break;
      }
      case CmEventType::established:
        if (c.established) throw ToolError(where() + " (a second time)");
        c.established = true;
        c.done[kConnect] = now;
        c.local = c.id->local_address();
        c.peer = c.id->peer_address();
        if (device_.transport == Transport::roce) {
          // A RoCE id's local port is its service's (0 for an unbound connecting id): the
          // connection is (address, QPN) at each end.
          if (QueuePair* qp = c.id->qp()) c.local_qpn = qp->qp_num();  // the wire QPN
          c.peer_qpn = event.param.qp_num;
          if (c.local.sin_addr.s_addr == 0 || c.peer.sin_addr.s_addr == 0 || c.local_qpn == 0 || c.peer_qpn == 0)
            shared_.error(fmt::format("{}: ESTABLISHED on {} {}, but its ends read {} -> {}", name_,
                                      c.passive ? "accepted id of pair" : "pair", c.index, c.local_text(),
                                      c.peer_text()));
        } else if (c.local.sin_port == 0 || c.peer.sin_port == 0) {
          shared_.error(fmt::format("{}: ESTABLISHED on {} {}, but its addresses read {} -> {}", name_,
                                    c.passive ? "accepted id of pair" : "pair", c.index, format_address(c.local),
                                    format_address(c.peer)));
        }
        (c.passive ? accepted_established_ : established_).fetch_add(1);
        break;
      case CmEventType::disconnected:
        if (c.disconnected) break;
        if (!c.established) throw ToolError(where() + " before ESTABLISHED");
        c.disconnected = true;
        c.done[kDisconnect] = now;
        (c.passive ? accepted_disconnected_ : disconnected_).fetch_add(1);
        break;
      case CmEventType::timewait_exit:
        break;
      default:
        throw ToolError(where());
    }
  }

  // A CONNECT_REQUEST: the server's normal work, an error in p2p mode (design.md §3 rule 3
  // binds a colliding request to the local attempt). Accepted in both cases, so that the
  // peer's attempt completes and the run counts what happened.
  void on_request(CmEvent& event, TimePoint now) {
    requests_.fetch_add(1);
    if (!event.new_id) throw ToolError(fmt::format("{}: CONNECT_REQUEST without a new id", name_));
    ByteReader r(event.param.private_data);
    const std::uint32_t magic = r.u32();
    const std::uint32_t index = r.u32();
    if (!r.ok() || magic != kPrivateMagic)
      throw ToolError(fmt::format("{}: CONNECT_REQUEST from {} without cmtime private data ({} bytes)", name_,
                                  format_address(event.new_id->peer_address()), event.param.private_data.size()));
    Conn& c = accepted_.emplace_back();
    c.passive = true;
    c.index = index;
    c.id = std::move(event.new_id);
    c.start[kConnect] = now;
    by_id_[c.id.get()] = &c;
    auto qp = c.id->create_qp(*pd_, qp_attr());
    if (!qp) throw_errc(fmt::format("{}: create_qp on a request (pair {})", name_, index), qp.error());
    auto ok = c.id->accept(ConnParam{});
    if (!ok) throw_errc(fmt::format("{}: accept (pair {})", name_, index), ok.error());
  }

  std::string name_;
  Shared& shared_;
  bool peer_to_peer_;
  std::optional<std::int64_t> crc_;  // CmOption::crc, or the library default
  // Destroyed in reverse order: the ids go before the CQ, the PD and the context.
  Device device_;
  std::unique_ptr<ProtectionDomain> pd_;
  std::unique_ptr<CompletionQueue> cq_;
  std::unique_ptr<CmId> listener_;
  sockaddr_in listen_address_{};
  std::vector<Conn> own_;
  std::deque<Conn> accepted_;  // stable addresses
  std::unordered_map<const CmId*, Conn*> by_id_;
  std::array<std::optional<TimePoint>, kStepCount> phase_start_;
  std::array<std::size_t, 2> resolved_{};  // ADDR_RESOLVED, ROUTE_RESOLVED seen
  std::atomic<std::uint32_t> expected_own_{0};
  std::atomic<std::uint32_t> expected_accepted_{0};
  std::atomic<std::size_t> established_{0};
  std::atomic<std::size_t> disconnected_{0};
  std::atomic<std::size_t> connect_failed_{0};
  std::atomic<std::size_t> accepted_established_{0};
  std::atomic<std::size_t> accepted_disconnected_{0};
  std::atomic<std::size_t> requests_{0};
};

// The steps of a node that drives ids, in lockstep with the other driving thread (p2p)
// through `barrier`. A phase that needs the other side (connect, disconnect) ends when
// both `self` and `other` are complete; `self` keeps handling its events meanwhile.
void run_steps(Node& self, Node& other, const sockaddr_in& destination, std::uint32_t n, SpinBarrier& barrier,
               Shared& shared) {
  int round = 0;
  barrier.arrive_and_wait(round, shared);
  self.create_ids(n);
  barrier.arrive_and_wait(round, shared);
  self.resolve_addrs(destination);
  barrier.arrive_and_wait(round, shared);
  self.resolve_routes();
  barrier.arrive_and_wait(round, shared);
  self.create_qps();
  barrier.arrive_and_wait(round, shared);
  shared.connect_cpu.start();
  self.connect_all();
  self.pump_until([&] { return self.connect_complete() && other.connect_complete(); },
                  *self.phase_start()[kConnect] + shared.timeout, "ESTABLISHED on every connection");
  shared.connect_cpu.end();
  barrier.arrive_and_wait(round, shared);
  self.disconnect_all();
  self.pump_until([&] { return self.disconnect_complete() && other.disconnect_complete(); },
                  *self.phase_start()[kDisconnect] + shared.timeout, "DISCONNECTED on every connection");
  barrier.arrive_and_wait(round, shared);
  self.destroy_all();
}

// Runs `body` and turns its failure into the run's error (and the abort of the others).
template <class Body>
void guarded(Shared& shared, Body&& body) {
  try {
    body();
  } catch (const Aborted&) {
  } catch (const std::exception& e) {
    shared.fatal(e.what());
  }
}

// --- statistics ---

struct StepStats {
  double total_us = 0;
  double avg_us = 0;
  double min_us = 0;
  double max_us = 0;
  std::size_t samples = 0;
};

StepStats step_stats(const std::vector<double>& samples, double total_us) {
  const Summary s = summarize(samples);
  return StepStats{
      .total_us = total_us, .avg_us = s.average, .min_us = s.min, .max_us = s.max, .samples = samples.size()};
}

struct PeercmResult {
  bool completed = false;  // every step ran (the counts below are meaningful)
  std::array<StepStats, kStepCount> steps{};
  double connect_cpu_us = 0;  // the process's CPU time over the connect step
  std::vector<double> connect_latency;  // connect() -> ESTABLISHED on that id, us
  std::size_t established = 0;          // client-server: pairs; p2p: distinct connections
  std::array<std::size_t, 2> established_per_side{};
  std::size_t pairs_matched = 0;  // both ends name the same connection (TCP 4-tuple; RoCE: addresses and QPNs)
  std::size_t connect_requests = 0;
  std::size_t connect_failed = 0;
  std::size_t uncollided_pairs = 0;  // p2p: a request came before the local connect on its tag
  std::array<NodeStats, 2> node_stats{};
};

// The time of every step, per connection and in total. `active`: the nodes that drive ids
// (their phase starts open each step); `all`: every node (completions anywhere close it).
// Single-ended steps (create id, resolve, create QP, destroy) count each id of the active
// nodes. Connect and disconnect count each pair once, through the ids of `active[0]` and
// `pair_end` (the other end of its i-th id): from the earlier call at either end to the
// later completion at either end. The connect latency counts every id that connected.
void collect_times(PeercmResult& r, const std::vector<const Node*>& active, const std::vector<const Node*>& all,
                   const std::function<const Conn*(std::size_t)>& pair_end) {
  for (std::size_t step = 0; step < kStepCount; ++step) {
    std::optional<TimePoint> first;
    for (const Node* node : active)
      if (auto t = node->phase_start()[step]; t && (!first || *t < *first)) first = t;
    std::optional<TimePoint> last;
    auto note = [&](const Conn& c) {
      if (auto t = c.done[step]; t && (!last || *t > *last)) last = t;
    };
    for (const Node* node : all) {
      for (const Conn& c : node->own()) note(c);
      for (const Conn& c : node->accepted()) note(c);
    }
    std::vector<double> samples;
    if (step == kConnect || step == kDisconnect) {
      const std::vector<Conn>& own = active.front()->own();
      for (std::size_t i = 0; i < own.size(); ++i) {
        const Conn& c = own[i];
        const Conn* other = pair_end(i);
        if (!c.start[step] || !c.done[step] || !other || !other->done[step]) continue;
        TimePoint begin = *c.start[step];
        if (!other->passive && other->start[step]) begin = std::min(begin, *other->start[step]);
        samples.push_back(micros(std::max(*c.done[step], *other->done[step]) - begin));
      }
    } else {
      for (const Node* node : active)
        for (const Conn& c : node->own())
          if (c.start[step] && c.done[step]) samples.push_back(micros(*c.done[step] - *c.start[step]));
    }
    r.steps[step] = step_stats(samples, first && last ? micros(*last - *first) : 0.0);
  }
  for (const Node* node : active)
    for (const Conn& c : node->own())
      if (c.start[kConnect] && c.done[kConnect])
        r.connect_latency.push_back(micros(*c.done[kConnect] - *c.start[kConnect]));
}

// --- client-server ---

PeercmResult run_client_server(std::uint32_t n, ProgressMode mode, Transport transport, bool peer_to_peer,
                               std::optional<std::int64_t> crc, Shared& shared) {
  PeercmResult r;
  Node server("server", mode, transport, peer_to_peer, crc, shared);
  Node client("client", mode, transport, peer_to_peer, crc, shared);
  server.listen(backlog_for_one_peer(n));
  server.expect_accepted(n);

  std::atomic<bool> stop{false};
  // The server only handles events; it stops when the client is done (or failed). Its wait
  // is bounded too: every client step is.
  std::thread server_thread([&] {
    guarded(shared, [&] {
      server.pump_until([&] { return stop.load(); }, Clock::now() + shared.timeout * 8,
                        "the client to finish");
    });
  });
  SpinBarrier barrier(1);
  guarded(shared, [&] { run_steps(client, server, server.listen_address(), n, barrier, shared); });
  stop.store(true);
  server_thread.join();
  r.completed = !shared.abort.load();
  if (!r.completed) return r;
  r.connect_cpu_us = shared.connect_cpu.used_us();

  // The server's end of pair i, by the pair number in the private data.
  std::vector<const Conn*> server_end(n, nullptr);
  for (const Conn& c : server.accepted()) {
    if (c.index >= n) {
      shared.error(fmt::format("server: a request named pair {} (of {})", c.index, n));
    } else if (server_end[c.index]) {
      shared.error(fmt::format("server: two requests for pair {}", c.index));
    } else {
      server_end[c.index] = &c;
    }
  }
  collect_times(r, {&client}, {&client, &server},
                [&](std::size_t i) { return i < server_end.size() ? server_end[i] : nullptr; });

  for (std::uint32_t i = 0; i < n; ++i) {
    const Conn& c = client.own()[i];
    const Conn* s = server_end[i];
    if (!c.established || !s || !s->established) continue;
    if (c.local_key() == s->peer_key() && c.peer_key() == s->local_key()) {
      ++r.pairs_matched;
    } else {
      shared.error(fmt::format("pair {}: the ends disagree on the connection (client {} -> {}, server {} <- {})", i,
                               c.local_text(), c.peer_text(), s->local_text(), s->peer_text()));
    }
  }
  r.established = r.pairs_matched;
  r.established_per_side = {client.own_established(), server.accepted_established()};
  r.connect_requests = server.requests() + client.requests();
  r.node_stats = {client.stats(), server.stats()};
  if (r.established != n) shared.error(fmt::format("{} of {} connections established on both ends", r.established, n));
  if (server.requests() != n)
    shared.error(fmt::format("the server saw {} CONNECT_REQUESTs for {} connections", server.requests(), n));
  if (client.requests() != 0) shared.error(fmt::format("the client saw {} CONNECT_REQUESTs", client.requests()));
  return r;
}

// --- p2p ---

PeercmResult run_p2p(std::uint32_t n, ProgressMode mode, Transport transport, std::optional<std::int64_t> crc,
                     Shared& shared) {
  PeercmResult r;
  Node a("a", mode, transport, true, crc, shared);
  Node b("b", mode, transport, true, crc, shared);
  // Until every pair collides, each side may have to take all of the other's requests.
  a.listen(backlog_for_one_peer(n));
  b.listen(backlog_for_one_peer(n));
  SpinBarrier barrier(2);
  std::thread thread_b([&] { guarded(shared, [&] { run_steps(b, a, a.listen_address(), n, barrier, shared); }); });
  guarded(shared, [&] { run_steps(a, b, b.listen_address(), n, barrier, shared); });
  thread_b.join();
  r.completed = !shared.abort.load();
  if (!r.completed) return r;
  r.connect_cpu_us = shared.connect_cpu.used_us();

  collect_times(r, {&a, &b}, {&a, &b},
                [&](std::size_t i) { return i < b.own().size() ? &b.own()[i] : nullptr; });

  // Distinct connections (TCP 4-tuples; RoCE: addresses and QPNs) over every established id
  // of both sides (either direction).
  std::set<std::pair<EndKey, EndKey>> connections;
  for (const Node* node : {&a, &b}) {
    auto add = [&](const Conn& c) {
      if (!c.established) return;
      connections.insert(std::minmax(c.local_key(), c.peer_key()));
    };
    for (const Conn& c : node->own()) add(c);
    for (const Conn& c : node->accepted()) add(c);
  }
  r.established = connections.size();
  r.established_per_side = {a.own_established(), b.own_established()};
  for (std::uint32_t i = 0; i < n; ++i) {
    const Conn& x = a.own()[i];
    const Conn& y = b.own()[i];
    if (x.established && y.established && x.local_key() == y.peer_key() && x.peer_key() == y.local_key())
      ++r.pairs_matched;
  }
  r.connect_requests = a.requests() + b.requests();
  r.connect_failed = a.connect_failed() + b.connect_failed();
  r.node_stats = {a.stats(), b.stats()};

  for (const Node* node : {&a, &b}) {
    if (node->own_established() != n)
      shared.error(fmt::format("{}: ESTABLISHED on {} of its {} ids", node->name(), node->own_established(), n));
    // A request for tag i while our own connect on tag i was pending is a collision the CM
    // did not resolve. A request that came before our connect on that tag (which then fails
    // with EALREADY/EISCONN, rule 5) means this pair did not collide at all: correct CM
    // behaviour (rule 4), but not what this run is for.
    std::vector<std::uint32_t> unresolved, uncollided, failed;
    std::size_t unresolved_count = 0, uncollided_count = 0, failed_count = 0;
    auto note = [](std::vector<std::uint32_t>& tags, std::size_t& count, std::uint32_t tag) {
      if (tags.size() < kMaxListedTags) tags.push_back(tag);
      ++count;
    };
    for (const Conn& c : node->accepted()) {
      if (c.index < n && node->own()[c.index].connect_failed) {
        note(uncollided, uncollided_count, c.index);
      } else {
        note(unresolved, unresolved_count, c.index);
      }
    }
    for (const Conn& c : node->own())
      if (c.connect_failed) note(failed, failed_count, c.index);
    r.uncollided_pairs += uncollided_count;
    if (unresolved_count > 0)
      shared.error(fmt::format("{}: {} CONNECT_REQUESTs while its own connect on the same tag was pending (tags {}); "
                               "design.md §3 rule 3 binds a colliding request to the local attempt",
                               node->name(), unresolved_count, list_tags(unresolved, unresolved_count)));
    if (uncollided_count > 0)
      shared.error(fmt::format("{}: {} CONNECT_REQUESTs arrived before its own connect on the same tag (tags {}): "
                               "those pairs did not collide (one side ran ahead; --progress inline makes every "
                               "pair collide)",
                               node->name(), uncollided_count, list_tags(uncollided, uncollided_count)));
    if (failed_count > uncollided_count)
      shared.error(fmt::format("{}: connect failed at once on {} tags (tags {})", node->name(), failed_count,
                               list_tags(failed, failed_count)));
  }
  if (r.established != n) shared.error(fmt::format("{} connections established for {} pairs", r.established, n));
  if (r.pairs_matched != n)
    shared.error(fmt::format("{} of {} pairs share one connection between their two ids", r.pairs_matched, n));
  return r;
}

// --- TCP baseline ---

struct TcpResult {
  std::vector<double> samples;  // connect() -> reply received, us
  double total_us = 0;
  double cpu_us = 0;  // the process's CPU time from the first connect() to the last reply
};

class Epoll {
 public:
  Epoll() : fd_(::epoll_create1(EPOLL_CLOEXEC)) {
    if (fd_ < 0) throw ToolError(fmt::format("epoll_create1: {}", std::strerror(errno)));
  }
  ~Epoll() { ::close(fd_); }
  Epoll(const Epoll&) = delete;
  Epoll& operator=(const Epoll&) = delete;
  void add(int fd, std::uint32_t events, std::uint64_t data) { control(EPOLL_CTL_ADD, fd, events, data); }
  void modify(int fd, std::uint32_t events, std::uint64_t data) { control(EPOLL_CTL_MOD, fd, events, data); }
  int wait(std::span<epoll_event> out, int timeout_ms) {
    const int n = ::epoll_wait(fd_, out.data(), static_cast<int>(out.size()), timeout_ms);
    if (n < 0 && errno != EINTR) throw ToolError(fmt::format("epoll_wait: {}", std::strerror(errno)));
    return std::max(n, 0);
  }

 private:
  void control(int op, int fd, std::uint32_t events, std::uint64_t data) {
    epoll_event ev{};
    ev.events = events;
    ev.data.u64 = data;
    if (::epoll_ctl(fd_, op, fd, &ev) != 0) throw ToolError(fmt::format("epoll_ctl: {}", std::strerror(errno)));
  }
  int fd_;
};

void set_nodelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

// Accepts connections, answers each 8-byte request with 8 bytes, closes on the client's
// close; until `stop`. Sets `ready` once it waits for connections.
void tcp_serve(Socket& listener, const std::atomic<bool>& stop, std::atomic<bool>& ready, Shared& shared) {
  struct Peer {
    Socket socket;
    std::size_t got = 0;
  };
  Epoll ep;
  constexpr std::uint64_t kListener = ~std::uint64_t{0};
  ep.add(listener.fd(), EPOLLIN, kListener);
  std::unordered_map<int, Peer> peers;
  const auto deadline = Clock::now() + shared.timeout;
  std::array<epoll_event, 64> events{};
  std::array<std::uint8_t, 64> buffer{};
  ready.store(true);
  while (!stop.load()) {
    shared.check();
    if (Clock::now() >= deadline) throw ToolError("tcp baseline server: timed out");
    const int n = ep.wait(events, 1);
    for (int k = 0; k < n; ++k) {
      const epoll_event& ev = events[static_cast<std::size_t>(k)];
      if (ev.data.u64 == kListener) {
        for (;;) {
          const int fd = ::accept4(listener.fd(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
          if (fd < 0) break;
          set_nodelay(fd);
          peers.emplace(fd, Peer{Socket(fd)});
          ep.add(fd, EPOLLIN | EPOLLRDHUP, static_cast<std::uint64_t>(fd));
        }
        continue;
      }
      const int fd = static_cast<int>(ev.data.u64);
      auto it = peers.find(fd);
      if (it == peers.end()) continue;
      Peer& p = it->second;
      for (;;) {
        const ssize_t r = ::recv(fd, buffer.data(), buffer.size(), MSG_DONTWAIT);
        if (r > 0) {
          const std::size_t before = p.got;
          p.got += static_cast<std::size_t>(r);
          if (before < kExchangeSize && p.got >= kExchangeSize) {
            const ssize_t w = ::send(fd, buffer.data(), kExchangeSize, MSG_DONTWAIT | MSG_NOSIGNAL);
            if (w != static_cast<ssize_t>(kExchangeSize))
              throw ToolError(fmt::format("tcp baseline server: send: {}", w < 0 ? std::strerror(errno) : "short"));
          }
          continue;
        }
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
        peers.erase(it);  // the client closed (or reset): done with it; closes the socket
        break;
      }
    }
  }
}

TcpResult run_tcp_baseline(std::uint32_t n, Shared& shared) {
  Socket listener(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!listener) throw ToolError(fmt::format("tcp baseline: socket: {}", std::strerror(errno)));
  sockaddr_in address = *parse_address("127.0.0.1", 0);
  // A backlog for every connection: they all arrive at once (a full accept queue drops SYNs,
  // which costs a 1 s retransmission).
  if (::bind(listener.fd(), reinterpret_cast<const sockaddr*>(&address), sizeof address) != 0 ||
      ::listen(listener.fd(), static_cast<int>(n) + 16) != 0)
    throw ToolError(fmt::format("tcp baseline: listen: {}", std::strerror(errno)));
  address.sin_port = htons(local_port(listener));

  std::atomic<bool> stop{false};
  std::atomic<bool> ready{false};
  std::thread server([&] { guarded(shared, [&] { tcp_serve(listener, stop, ready, shared); }); });
  TcpResult result;
  guarded(shared, [&] {
    // As with peercm, the server is up and waiting before the clock starts.
    const auto ready_deadline = Clock::now() + shared.timeout;
    while (!ready.load()) {
      shared.check();
      if (Clock::now() >= ready_deadline) throw ToolError("tcp baseline: the server thread did not start");
      std::this_thread::yield();
    }
    struct Client {
      Socket socket;
      TimePoint start;
      bool sent = false;
      std::size_t got = 0;
    };
    std::vector<Client> clients(n);
    Epoll ep;
    const double cpu_start = process_cpu_us();
    const TimePoint phase_start = Clock::now();
    TimePoint last = phase_start;
    const auto deadline = phase_start + shared.timeout;
    for (std::uint32_t i = 0; i < n; ++i) {
      Client& c = clients[i];
      c.start = Clock::now();
      c.socket = Socket(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
      if (!c.socket) throw ToolError(fmt::format("tcp baseline: socket: {}", std::strerror(errno)));
      set_nodelay(c.socket.fd());
      if (::connect(c.socket.fd(), reinterpret_cast<const sockaddr*>(&address), sizeof address) != 0 &&
          errno != EINPROGRESS)
        throw ToolError(fmt::format("tcp baseline: connect: {}", std::strerror(errno)));
      ep.add(c.socket.fd(), EPOLLOUT, i);
    }
    std::size_t done = 0;
    std::array<epoll_event, 64> events{};
    std::array<std::uint8_t, kExchangeSize> request{1, 2, 3, 4, 5, 6, 7, 8};
    std::array<std::uint8_t, 64> reply{};
    while (done < n) {
      shared.check();
      if (Clock::now() >= deadline)
        throw ToolError(fmt::format("tcp baseline: timed out after {} ms ({} of {} exchanges done)",
                                    shared.timeout.count(), done, n));
      const int got = ep.wait(events, 1);
      for (int k = 0; k < got; ++k) {
        const epoll_event& ev = events[static_cast<std::size_t>(k)];
        Client& c = clients[ev.data.u64];
        if (!c.socket) continue;
        const int fd = c.socket.fd();
        if (!c.sent) {
          int error = 0;
          socklen_t len = sizeof error;
          ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len);
          if (error != 0) throw ToolError(fmt::format("tcp baseline: connect: {}", std::strerror(error)));
          const ssize_t w = ::send(fd, request.data(), request.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
          if (w != static_cast<ssize_t>(request.size()))
            throw ToolError(fmt::format("tcp baseline: send: {}", w < 0 ? std::strerror(errno) : "short"));
          c.sent = true;
          ep.modify(fd, EPOLLIN | EPOLLRDHUP, ev.data.u64);
          continue;
        }
        const ssize_t r = ::recv(fd, reply.data(), reply.size(), MSG_DONTWAIT);
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) continue;
        if (r <= 0) throw ToolError("tcp baseline: the server closed before replying");
        c.got += static_cast<std::size_t>(r);
        if (c.got < kExchangeSize) continue;
        const TimePoint now = Clock::now();
        result.samples.push_back(micros(now - c.start));
        last = now;
        c.socket = Socket();  // close; the server closes its end on EOF
        ++done;
      }
    }
    result.total_us = micros(last - phase_start);
    result.cpu_us = process_cpu_us() - cpu_start;
  });
  stop.store(true);
  server.join();
  return result;
}

// --- options and output ---

struct CmtimeOptions {
  std::uint32_t connections = 100;
  std::string mode = "client-server";
  std::string transport = "iwarp";
  std::string progress = "thread";
  std::string peer_to_peer = "off";
  std::string crc;
  std::int64_t timeout_ms = kWaitTimeout.count();
  bool json = false;
};

nlohmann::json step_json(const StepStats& s) {
  return {{"total_us", s.total_us}, {"avg_us", s.avg_us}, {"min_us", s.min_us}, {"max_us", s.max_us}};
}

nlohmann::json node_stats_json(const NodeStats& s) {
  return {{"collisions_won", s.collisions_won},
          {"collisions_lost", s.collisions_lost},
          {"rejects_sent", {{"collision", s.rejects_sent_collision}, {"duplicate", s.rejects_sent_duplicate}}},
          {"rejects_received",
           {{"collision", s.rejects_received_collision}, {"duplicate", s.rejects_received_duplicate}}}};
}

double ratio(double a, double b) { return b > 0 ? a / b : 0.0; }

void print_report(const CmtimeOptions& o, bool p2p, const PeercmResult& r, const TcpResult& tcp,
                  const std::vector<std::string>& errors) {
  const Summary lat = summarize(r.connect_latency);
  const Summary base = summarize(tcp.samples);
  const double ratio_connect = ratio(lat.average, base.average);
  const double ratio_total = ratio(r.steps[kConnect].total_us, tcp.total_us);
  const double per_connection = o.connections > 0 ? 1.0 / o.connections : 0.0;
  const double cpu_peercm = r.connect_cpu_us * per_connection;
  const double cpu_tcp = tcp.cpu_us * per_connection;
  const std::array<const char*, 2> sides = p2p ? std::array{"a", "b"} : std::array{"client", "server"};
  if (o.json) {
    nlohmann::json steps = nlohmann::json::object();
    for (std::size_t s = 0; s < kStepCount; ++s) steps[kStepNames[s]] = step_json(r.steps[s]);
    nlohmann::json out{
        {"mode", o.mode},
        {"transport", o.transport},
        {"connections", o.connections},
        {"progress", o.progress},
        {"crc", o.crc.empty() ? "default" : o.crc},
        {"peer_to_peer", p2p || o.peer_to_peer == "on"},
        {"completed", r.completed},
        {"steps", steps},
        {"connect_latency_us",
         {{"avg", lat.average}, {"p50", lat.median}, {"p99", lat.p99}, {"min", lat.min}, {"max", lat.max}}},
        {"tcp",
         {{"connect_exchange_us",
           {{"avg", base.average}, {"p50", base.median}, {"p99", base.p99}, {"min", base.min}, {"max", base.max}}},
          {"total_us", tcp.total_us}}},
        {"ratio_connect", ratio_connect},
        {"ratio_connect_total", ratio_total},
        {"cpu_us_per_connection", {{"peercm", cpu_peercm}, {"tcp", cpu_tcp}}},
        {"ratio_cpu", ratio(cpu_peercm, cpu_tcp)},
        {"established", r.established},
        {"established_per_side", {{sides[0], r.established_per_side[0]}, {sides[1], r.established_per_side[1]}}},
        {"pairs_matched", r.pairs_matched},
        {"connect_requests_seen", r.connect_requests},
        {"connect_failed", r.connect_failed},
        {"uncollided_pairs", r.uncollided_pairs},
        {"cm_stats", {{sides[0], node_stats_json(r.node_stats[0])}, {sides[1], node_stats_json(r.node_stats[1])}}},
        {"errors", errors}};
    fmt::print("{}\n", out.dump());
    return;
  }
  fmt::print("peercm cmtime: {}, {}, {} connections, progress {}, crc {}{}\n", o.mode, o.transport, o.connections,
             o.progress, o.crc.empty() ? "default" : o.crc, !p2p && o.peer_to_peer == "on" ? ", PeerToPeer on" : "");
  if (r.completed) {
    fmt::print("  {:<16} {:>12} {:>10} {:>10} {:>10}\n", "step", "total us", "avg us", "min us", "max us");
    for (std::size_t s = 0; s < kStepCount; ++s) {
      const StepStats& st = r.steps[s];
      fmt::print("  {:<16} {:>12.1f} {:>10.1f} {:>10.1f} {:>10.1f}\n", kStepNames[s], st.total_us, st.avg_us, st.min_us,
                 st.max_us);
    }
    fmt::print("  connect() -> ESTABLISHED, us     avg {:>9.1f}  p50 {:>9.1f}  p99 {:>9.1f}\n", lat.average, lat.median,
               lat.p99);
    fmt::print("  tcp connect + 8 B exchange, us   avg {:>9.1f}  p50 {:>9.1f}  p99 {:>9.1f}  (total {:.1f})\n",
               base.average, base.median, base.p99, tcp.total_us);
    fmt::print("  ratio peercm/tcp                 avg {:>9.2f}  total {:.2f}\n", ratio_connect, ratio_total);
    fmt::print("  process CPU per connection, us   peercm {:.1f}  tcp {:.1f}  ratio {:.2f}\n", cpu_peercm, cpu_tcp,
               ratio(cpu_peercm, cpu_tcp));
    fmt::print("  established {} (per side: {} {}, {} {}), pairs matched {}, connect requests seen {}\n", r.established,
               sides[0], r.established_per_side[0], sides[1], r.established_per_side[1], r.pairs_matched,
               r.connect_requests);
    if (p2p) {
      for (std::size_t i = 0; i < 2; ++i) {
        const NodeStats& s = r.node_stats[i];
        fmt::print("  cm stats {}: collisions won {}, lost {}; rejects sent collision {} duplicate {}, received "
                   "collision {} duplicate {}\n",
                   sides[i], s.collisions_won, s.collisions_lost, s.rejects_sent_collision, s.rejects_sent_duplicate,
                   s.rejects_received_collision, s.rejects_received_duplicate);
      }
    }
  }
  for (const std::string& e : errors) fmt::print("  ERROR: {}\n", e);
}

int run_cmtime(const CmtimeOptions& o) {
  const bool p2p = o.mode == "p2p";
  Shared shared;
  shared.timeout = milliseconds(o.timeout_ms);
  const ProgressMode mode = progress_option(o.progress);
  const auto crc = crc_option(o.crc);
  const Transport transport = transport_option(o.transport);
  PeercmResult result = p2p ? run_p2p(o.connections, mode, transport, crc, shared)
                            : run_client_server(o.connections, mode, transport, o.peer_to_peer == "on", crc, shared);
  TcpResult tcp;
  if (result.completed) {
    tcp = run_tcp_baseline(o.connections, shared);
    if (shared.abort.load()) result.completed = false;
  }
  std::vector<std::string> errors;
  {
    std::lock_guard lock(shared.mutex);
    errors = shared.errors;
  }
  print_report(o, p2p, result, tcp, errors);
  if (o.json)
    for (const std::string& e : errors) fmt::print(stderr, "peercm cmtime: error: {}\n", e);
  return errors.empty() && result.completed ? 0 : 1;
}

}  // namespace

void add_cmtime(CLI::App& app) {
  auto o = std::make_shared<CmtimeOptions>();
  auto* cmd = app.add_subcommand("cmtime", "Per-step connection setup timing (client-server and simultaneous p2p)");
  cmd->option_defaults()->always_capture_default();
  cmd->add_option("--connections,-c", o->connections, "Connections (pairs in p2p mode)")
      ->check(CLI::Range(1u, 4000u));  // within the default somaxconn (4096) backlog
  cmd->add_option("--mode", o->mode, "client-server, or p2p (both sides connect with the same tags at once)")
      ->check(CLI::IsMember({"client-server", "p2p"}));
  cmd->add_option("--transport", o->transport,
                  "iwarp (MPA over TCP) or roce (RoCEv2 over UDP 4791; each node on a random 127/8 address)")
      ->check(CLI::IsMember({"iwarp", "roce"}));
  cmd->add_option("--progress", o->progress, "Progress mode of the peercm contexts")
      ->check(CLI::IsMember({"thread", "inline"}));
  cmd->add_option("--peer-to-peer", o->peer_to_peer,
                  "client-server: the PeerToPeer option of the ids (on: CM header and RTR, no collisions)")
      ->check(CLI::IsMember({"on", "off"}));
  cmd->add_option("--crc", o->crc, "MPA CRC: on (required) or off (default: the library's preference)")
      ->check(CLI::IsMember({"on", "off"}));
  cmd->add_option("--timeout-ms", o->timeout_ms, "Every wait (each step, each barrier) gives up after this long")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{3600000}));
  cmd->add_flag("--json", o->json, "Print the result as JSON");
  cmd->callback([o] {
    try {
      if (o->transport == "roce" && !o->crc.empty()) throw CLI::ValidationError("cmtime", "--crc is MPA's (iwarp only)");
      exit_status = run_cmtime(*o);
    } catch (const ToolError& e) {
      fmt::print(stderr, "peercm cmtime: error: {}\n", e.what());
      exit_status = 1;
    }
  });
}

}  // namespace peercm::tool
