// The simulated world behind run_p2p_simulation(): a message-level network with a virtual
// clock (p2p_world.cpp), a minimal CM driver model around each node's P2pResolver
// (cm_model.cpp), and the four properties of design.md §3 as executable checks
// (properties.cpp).
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <iterator>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "core/p2p_resolver.hpp"
#include "network.hpp"
#include "p2p_sim.hpp"
#include "sim_rng.hpp"

namespace peercm::sim {

using core::AttemptId;
using core::Duration;
using core::LinkId;
using core::NodeIdentity;
using core::P2pAction;
using core::P2pKey;
using core::Time;

// How traces and violations name a node: "n2#1" is node 2 in its first incarnation. Formatted
// only when a trace line is actually written.
struct NodeName {
  int index = 0;
  std::uint32_t epoch = 0;
};

// What one seed picks before the run starts.
struct Scenario {
  int nodes = 2;
  std::uint32_t tags = 1;
  Duration max_delay{};            // every message takes [0, max_delay]; FIFO per link direction
  Duration timeout{};              // the connect timeout: every attempt's deadline
  Duration chaos{};                // the window in which the planned connects and crashes happen
  int connects = 0;                // planned app connects in the chaos phase
  unsigned simultaneous_percent = 0;  // a planned connect is mirrored by the peer at the same instant
  unsigned app_reject_percent = 0;    // the app rejects a CONNECT_REQUEST
  unsigned close_percent = 0;         // the app closes an ESTABLISHED connection later
  unsigned reconnect_percent = 0;     // ... and connects again at once / after DISCONNECTED
  // A connect whose key has a CONNECT_REQUEST the app has not answered yet takes it back from
  // the app (docs/p2p.md, rule 5 refined: the CM retracts the unseen event) instead of EALREADY.
  unsigned take_unseen_percent = 0;
  int crashes = 0;
  bool shared_guids = false;  // nodes configured with equal GUIDs: the attempt id decides
  // When the responder's CmId becomes ESTABLISHED: as it sends the accept Reply (what
  // MpaResponder::accept() reports), or only when the initiator's RTR arrives.
  bool responder_established_on_reply = false;
};

// ---------------------------------------------------------------------------------------------
// The network: links carry whole CM messages (the MPA/RTR bytes are other cores' business).

enum class MessageKind : std::uint8_t {
  request,  // initiator -> responder: MPA Request + CM header (identity, attempt, tag, listen port)
  accept,   // responder -> initiator: MPA Reply, accepted (identity, the responder's CmId)
  reject,   // responder -> initiator: MPA Reply, rejected (`why`), then the responder closes
  rtr,      // initiator -> responder: the RTR, first FPDU after the Reply (rule 9)
  close,    // either way: FIN/RST; also what a crashed node's peers see
};
enum class RejectWhy : std::uint8_t { collision, duplicate, application };

struct Message {
  MessageKind kind = MessageKind::close;
  NodeIdentity from;
  AttemptId cmid = 0;  // request: the initiator's attempt; accept: the responder's CmId
  std::uint32_t tag = 0;
  std::uint16_t listen_port = 0;
  RejectWhy why = RejectWhy::application;
};

// A transport connection. Side 0 is the initiator, side 1 the responder; the responder's side is
// bound to whatever incarnation of the target node is up when the request arrives.
struct Link {
  int node[2] = {0, 0};
  std::uint32_t epoch[2] = {0, 0};  // the incarnation (restart count) of each side's node
  std::uint32_t tag = 0;
  bool open[2] = {false, false};
  bool established[2] = {false, false};
  AttemptId cmid[2] = {0, 0};  // the CmId on each side, 0 for none
  Time last_arrival[2] = {};   // per direction (indexed by receiving side): FIFO per link
  NodeIdentity initiator;      // from the request's CM header
  bool app_rejected = false;   // the responder's application rejected the request
  bool app_closed[2] = {false, false};  // that side's application closed the connection
};

// ---------------------------------------------------------------------------------------------
// The nodes: a resolver plus what the CM and the application would hold.

enum class Outcome : std::uint8_t { pending, established, rejected_by_app, unreachable, timed_out, crashed };

struct CmId {
  AttemptId number = 0;
  bool active = false;  // made by connect(); otherwise delivered by the listener
  enum class State : std::uint8_t { connecting, awaiting_app, accepted, established } state{};
  int peer = 0;
  std::uint32_t tag = 0;
  LinkId link = 0;                   // 0: an attempt waiting without a link (lost)
  std::uint64_t peer_incarnation = 0;  // from the request (a link this CmId responds on)
  std::vector<std::uint32_t> work_requests;  // posted before ESTABLISHED, not yet completed
  std::size_t attempt = 0;           // active: index into World::attempts_
};

struct Node {
  bool up = true;
  std::uint32_t epoch = 1;
  NodeIdentity id;
  std::optional<core::P2pResolver> resolver;
  std::map<AttemptId, CmId> cmids;
  AttemptId next_cmid = 1;
  std::optional<Time> timer;  // the earliest timer event scheduled for the resolver
  std::vector<std::pair<Time, Time>> down;  // [crash, restart] windows
};

// One app connect the resolver accepted, for the liveness property.
struct AttemptRecord {
  int node = 0;
  int peer = 0;
  std::uint32_t tag = 0;
  AttemptId cmid = 0;
  Time start{};
  Time deadline{};
  Time end{};
  Outcome outcome = Outcome::pending;
  bool final_round = false;
  // The peer's application closed a connection this attempt was bound to before it was
  // ESTABLISHED here: the attempt may then rightly run into its deadline.
  bool peer_app_closed_binding = false;
};

enum class EventKind : std::uint8_t {
  message, unreachable, timer, app_connect, app_answer, app_close, post_wr, crash, restart
};

struct Event {
  Time at{};
  std::uint64_t seq = 0;  // ties at one instant keep scheduling order
  EventKind kind = EventKind::message;
  int node = 0;
  std::uint32_t epoch = 0;  // app/timer/restart events: the incarnation they were meant for
  int peer = 0;
  std::uint32_t tag = 0;
  AttemptId cmid = 0;
  bool accept = false;
  LinkId link = 0;
  int side = 0;  // message/unreachable: the receiving side
  Message message;
  Duration downtime{};
};

struct EventLater {
  bool operator()(const Event& a, const Event& b) const {
    return a.at != b.at ? a.at > b.at : a.seq > b.seq;
  }
};

// ---------------------------------------------------------------------------------------------

// The RoCE world (roce_world.cpp): production IbCmAgents over MAD datagrams.
SimResult run_roce_simulation(std::uint64_t seed, const SimConfig& config);

class World {
 public:
  World(std::uint64_t seed, const SimConfig& config);
  SimResult run();

 private:
  enum class Phase : std::uint8_t { chaos, final_round, teardown };

  // p2p_world.cpp: scenario, event loop, network
  void plan_chaos();
  void plan_final_round();
  void close_everything();
  void schedule(Event event);
  bool run_until_quiet();
  void dispatch(const Event& event);
  LinkId open_link(int initiator, int responder, std::uint32_t tag);
  Link& link(LinkId id) { return links_[id - 1]; }
  int side_of(int node, LinkId id) const;
  void send(LinkId id, int from_side, const Message& message);
  void close_end(LinkId id, int side, bool send_close);
  Duration delay();
  P2pKey key_of(int peer, std::uint32_t tag) const;
  std::uint16_t port_of(int node) const;
  std::uint32_t address_of(int node) const;

  // cm_model.cpp: the driver model (network inputs, resolver outputs, application)
  void on_message(const Event& event);
  void on_request(const Event& event);
  void on_accept(Node& node, LinkId id, const Message& message);
  void on_reject(Node& node, LinkId id, const Message& message);
  void on_rtr(Node& node, LinkId id);
  void on_close(Node& node, LinkId id, int side);
  void on_unreachable(const Event& event);
  void on_timer(const Event& event);
  void drain(int index);
  void apply(int index, const P2pAction& action);
  void arm_timer(int index);
  void app_connect(int index, int peer, std::uint32_t tag);
  // The active CmId of an attempt the resolver took, with its record and work requests.
  CmId& start_attempt(int index, int peer, std::uint32_t tag, AttemptId number, LinkId id, Time deadline);
  // The attempt's request on its own link `id`, which opens at the initiator's end.
  void send_request(int index, LinkId id, AttemptId number, std::uint32_t tag);
  bool take_unseen_request(int index, int peer, std::uint32_t tag, AttemptId number, LinkId id, Time deadline);
  void app_answer(const Event& event);
  void app_close(const Event& event);
  void post_work_request(const Event& event);
  void crash(int index, Duration downtime);
  void restart(int index, std::uint32_t epoch);
  CmId* find_cmid(int index, AttemptId number);
  void establish(int index, CmId& cmid);
  void responder_established(int index, CmId& cmid);
  void note_binding_lost(int index, const CmId& cmid, LinkId id);
  void end_attempt(int index, CmId& cmid, Outcome outcome);
  void disconnected(int index, AttemptId number, const char* why);
  std::uint32_t post_new_work_request();
  void complete_work_request(std::uint32_t id);

  // properties.cpp: design.md §3 properties
  void check_established(int index, const CmId& cmid);
  void check_attempt_liveness();
  void check_quiescent(const char* when);
  void check_final_round();
  void check_no_leak();
  void check_integrity();
  bool disturbed(const AttemptRecord& attempt) const;
  int fully_established(int a, int b, std::uint32_t tag) const;
  void violation(std::string what);

  template <class... Args>
  void trace(fmt::format_string<Args...> format, Args&&... args) {
    if (!config_.verbose) return;
    auto out = std::back_inserter(result_.trace);
    fmt::format_to(out, "{:10.3f}ms  ", static_cast<double>(now_.time_since_epoch().count()) / 1e6);
    fmt::format_to(out, format, std::forward<Args>(args)...);
    result_.trace.push_back('\n');
  }
  NodeName name(int index) const {
    return {index, nodes_[static_cast<std::size_t>(index)].epoch};
  }

  std::uint64_t seed_;
  SimConfig config_;
  Rng rng_;
  Scenario scenario_;
  Network network_;  // streams: in order per direction, reliable
  Phase phase_ = Phase::chaos;
  Time now_{};
  std::uint64_t next_seq_ = 0;
  std::vector<Event> queue_;  // a binary heap ordered by EventLater
  std::vector<Node> nodes_;
  std::vector<Link> links_;
  std::vector<AttemptRecord> attempts_;
  std::vector<std::uint8_t> work_request_done_;  // completions per work request
  std::vector<bool> work_request_lost_;          // died with a crashed process
  std::vector<std::tuple<int, int, std::uint32_t>> asked_;  // final round: (a, b, tag), a < b
  std::uint64_t incarnation_counter_ = 0;
  SimResult result_;
};

}  // namespace peercm::sim

template <>
struct fmt::formatter<peercm::sim::NodeName> : fmt::formatter<std::string_view> {
  template <class Context>
  auto format(const peercm::sim::NodeName& name, Context& context) const {
    return fmt::format_to(context.out(), "n{}#{}", name.index, name.epoch);
  }
};
