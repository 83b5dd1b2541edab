// The iWARP CM agent of one node as a sans-IO core, shaped like the IB CM agent
// (core/ibcm/ibcm_agent.hpp): application calls, stream bytes, stream events and time in;
// actions on streams (open, send, start, close), CM events and one deadline out. It owns every
// decision of rdma_cm over MPA/TCP: the listener backlog, the MPA handshake of each stream
// (core/mpa_handshake), the p2p binding (core/p2p_resolver, through core/p2p_executor), parked
// requests, and rejects. It reads no clock, opens no socket and takes no lock: the API layer
// (api/iwarp_cm.cpp) runs the streams and hands their bytes in; a simulator can do the same.
//
// Streams. A stream is one TCP connection, named by the agent (StreamId, never 0, never reused).
// The agent asks for outgoing ones (Action::open_stream) and is told of incoming ones
// (handle_stream_accepted). Until its MPA handshake ends, every byte of a stream goes through the
// agent (handle_bytes) and every byte it sends comes from the agent (Action::transmit). Then
// Action::start_stream hands it to the queue-pair engine, with what MPA agreed; from then on
// the agent only hears that its data path ended (handle_stream_down) or that it closed
// (handle_stream_closed). A p2p stream is also the resolver's link (LinkId = StreamId).
//
// Ids. The application names connections by IwarpCmId (rdma_cm's cm_id): one per listener
// (listen), per connect (connect) and per delivered request (Event::connect_request). An id
// ends after rejected, unreachable, connect_error or timewait_exit, or when destroyed.
//
// The rules (collision, unseen request, backlog, duplicates, restarts) are stated in
// docs/p2p.md, "Rules"; the comments below cite them as R1..R9 and B1.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <system_error>
#include <vector>

#include "core/mpa_handshake.hpp"
#include "core/p2p_executor.hpp"
#include "core/p2p_resolver.hpp"
#include "core/time.hpp"
#include "core/listen_backlog.hpp"
#include "peercm/result.hpp"

namespace peercm::core::iwarp {

using IwarpCmId = std::uint32_t;  // never 0, never reused by one agent
using StreamId = std::uint64_t;   // never 0, never reused by one agent

// An IPv4 endpoint in host byte order.
struct Endpoint {
  std::uint32_t address = 0;
  std::uint16_t port = 0;
  friend bool operator==(const Endpoint&, const Endpoint&) = default;
};

struct IwarpCmAgentConfig {
  NodeIdentity identity;  // node GUID and incarnation (R1)
  // Between the close of a disconnected stream and TIMEWAIT_EXIT.
  Duration timewait = std::chrono::milliseconds(100);
  // B1: a handshake whose Request is still incomplete this long after its stream was accepted
  // may make room in a full backlog (a real client's Request arrives in one segment).
  Duration partial_request_grace = std::chrono::milliseconds(100);
};

// The private data one MPA Request or Reply carries for the application (RFC 6581 enhanced).
inline constexpr std::size_t kMaxPrivateData = wire::kMpaMaxPrivateData - wire::kIrdOrdBlockSize;

struct IwarpListenParams {
  std::uint16_t port = 0;  // the bound port; the first listener's is the node's p2p port (R2)
  int backlog = 128;       // B1
  CrcPolicy crc = CrcPolicy::preferred;
  Duration handshake_timeout = std::chrono::seconds(10);
};

struct IwarpConnectParams {
  Endpoint destination;
  bool peer_to_peer = true;
  std::uint32_t tag = 0;
  // The CmId number: the CM header's cmid and the attempt id of rule 3's order. Fresh for every
  // connect and growing within the node (R3, R6).
  AttemptId number = 0;
  CrcPolicy crc = CrcPolicy::preferred;
  std::uint16_t ird = 16;  // responder resources offered
  std::uint16_t ord = 16;  // initiator depth offered
  std::vector<std::uint8_t> private_data;  // ≤ kMaxPrivateData, less the CM header when p2p
  Duration timeout = std::chrono::seconds(10);  // the handshake's, and a p2p attempt's (R8)
};

struct IwarpAcceptParams {
  AttemptId number = 0;  // the accepting CmId's number: a p2p Reply's CM header names it (R1)
  std::uint16_t ird = 16;
  std::uint16_t ord = 16;
  std::vector<std::uint8_t> private_data;  // ≤ kMaxPrivateData
};

// Reasons an id's connect ends without a connection, as rdma_cm reports them.
enum class IwarpEndReason : std::uint8_t {
  none,
  application,  // the peer's application rejected (MPA Reject without a CM reject)
  refused,      // TCP refused: nobody listens
  timeout,      // the handshake or the p2p attempt ran out of time (R8)
  markers,      // the peer asked for MPA Markers, which peercm refuses
  invalid,      // the peer broke MPA, or the stream failed during setup
};

struct IwarpCmEvent {
  enum class Kind : std::uint8_t {
    connect_request,  // a new id (`id`) for a request on listener `listener`: accept or reject it
    established,
    rejected,       // the id's connect ends: `reason`, `private_data`; status ECONNREFUSED
    unreachable,    // the TCP connect failed (`status`: its errno)
    connect_error,  // setup failed (`status`, `reason`)
    disconnected,
    timewait_exit,  // the id ends
  };
  Kind kind = Kind::established;
  IwarpCmId id = 0;
  IwarpCmId listener = 0;  // connect_request
  int status = 0;          // an errno value
  IwarpEndReason reason = IwarpEndReason::none;
  std::vector<std::uint8_t> private_data;  // the application's bytes (CM headers removed)
  // connect_request, established: the resources as the peer offered them (its IRD, ORD).
  std::uint16_t peer_ird = 0;
  std::uint16_t peer_ord = 0;
  Endpoint peer;             // connect_request, established: the stream's far end
  bool peer_to_peer = false;  // connect_request: it carried a CM header
  std::uint32_t tag = 0;
  // connect_request, established, disconnected: the id's stream.
  StreamId stream = 0;
};

struct IwarpCmAction {
  enum class Kind : std::uint8_t {
    // Open stream `stream` for id `id` to `destination` (a TCP connect from the id's source).
    // handle_stream_failed() or bytes follow.
    open_stream,
    // Send `bytes` on `stream` (an MPA frame), after whatever was sent on it before.
    transmit,
    // The stream's MPA handshake is done: run id `id`'s queue pair on it with `mpa` (its
    // `peer_to_peer`, `rtr` and `crc` are what the engine needs); `initiator` tells the role.
    // From now on the stream's bytes are the engine's.
    start_stream,
    // RFC 6581 §8: the handshake failed with a Terminate (`terminate_code`, 2/0/6 or 2/0/7)
    // to send before the close. With no queue pair to frame it, close the stream.
    terminate_stream,
    // Close `stream`: `graceful` flushes the queue pair and sends what is pending first (rdma
    // disconnect); otherwise abortive (RST), leaving the queue pair as it is.
    close_stream,
  };
  Kind kind = Kind::transmit;
  StreamId stream = 0;
  IwarpCmId id = 0;
  Endpoint destination;
  std::vector<std::uint8_t> bytes;
  MpaResult mpa;
  bool initiator = false;
  std::uint8_t terminate_code = 0;
  bool graceful = false;
};

struct IwarpCmAgentStats {
  std::uint64_t collisions_won = 0;     // attempts ESTABLISHED after a colliding request lost
  std::uint64_t collisions_lost = 0;    // attempts bound to the peer's request (R3 passive)
  std::uint64_t delivered_requests = 0; // p2p requests delivered to the application (R4)
  std::uint64_t rejects_sent_collision = 0;
  std::uint64_t rejects_sent_duplicate = 0;
  std::uint64_t rejects_sent_application = 0;
  std::uint64_t rejects_received_collision = 0;
  std::uint64_t rejects_received_duplicate = 0;
  std::uint64_t rejects_received_application = 0;
  std::uint64_t rejects_received_refused = 0;
  std::uint64_t backlog_refused = 0;    // accepted streams closed at once: backlog full (B1)
  std::uint64_t backlog_displaced = 0;  // stalled handshakes closed to make room (B1)
};

class IwarpCmAgent : private P2pBinding {
 public:
  explicit IwarpCmAgent(const IwarpCmAgentConfig& config);

  // --- inputs: the application ---
  // A listener (B1). Its requests arrive through handle_stream_accepted().
  IwarpCmId listen(const IwarpListenParams& params);
  // R5: EISCONN / EALREADY; EINVAL for too much private data. `take_back` is the unseen-request
  // rule's question (R5): take the CONNECT_REQUEST of id `request` back from the application if
  // it has not fetched it (true), else false. Without it, rule 5 stands plain.
  using TakeBack = std::function<bool(IwarpCmId request)>;
  Result<IwarpCmId, std::errc> connect(const IwarpConnectParams& params, Time now, const TakeBack& take_back = {});
  // A connect_request's id: the MPA Reply (with our CM header when p2p), then start_stream and
  // `established`. EINVAL for any other id or too much private data.
  Status<std::errc> accept(IwarpCmId id, const IwarpAcceptParams& params, Time now);
  // A connect_request's id: MPA Reject with `private_data`, the stream closes; the id ends.
  Status<std::errc> reject(IwarpCmId id, std::span<const std::uint8_t> private_data, Time now);
  // `disconnected` now and a graceful close; ENOTCONN without a stream, EINVAL while undecided.
  Status<std::errc> disconnect(IwarpCmId id, Time now);
  // The application destroyed the id: its stream closes abortively (a listener's handshakes
  // too), a p2p attempt leaves the resolver, no further events. Unknown ids are ignored.
  void destroy(IwarpCmId id, Time now);

  // --- inputs: the streams and time ---
  // An incoming stream on `listener` from `peer`. nullopt: refused (B1: backlog full and no
  // stalled handshake to displace): close it.
  std::optional<StreamId> handle_stream_accepted(IwarpCmId listener, const Endpoint& peer, Time now);
  // The TCP connect of an open_stream succeeded (its timeout now bounds the MPA exchange alone:
  // before it, running out of time is UNREACHABLE, after it CONNECT_ERROR).
  void handle_stream_connected(StreamId stream);
  // The TCP connect of an open_stream failed with `error` (an errno value).
  void handle_stream_failed(StreamId stream, int error, Time now);
  // Bytes that arrived on a stream before start_stream. Returns how many the handshake used:
  // the rest (FPDUs right behind the Reply) belong to the queue pair once the stream starts.
  std::size_t handle_bytes(StreamId stream, std::span<const std::uint8_t> bytes, Time now);
  // A started stream's data path ended: a Terminate, a reset, the peer's close.
  void handle_stream_down(StreamId stream, Time now);
  // The stream is closed (by either side, for any reason, or by a close_stream action).
  void handle_stream_closed(StreamId stream, Time now);
  void handle_timeout(Time now);

  // --- outputs ---
  std::optional<IwarpCmAction> poll_action();
  std::optional<IwarpCmEvent> poll_event();
  std::optional<Time> next_deadline() const;

  // --- introspection ---
  // The stream an id runs on (0: none yet, or none any more).
  StreamId stream_of(IwarpCmId id) const;
  // The node's advertised p2p listening port: the first listener's (R2); 0 without one.
  std::uint16_t p2p_listen_port() const { return p2p_listen_port_; }
  struct Backlog {
    std::size_t pending = 0;      // requests charged to the listener (B1): not yet held or answered
    std::size_t handshaking = 0;  // streams whose Request is not complete yet
  };
  Backlog backlog_of(IwarpCmId listener) const;
  std::size_t id_count() const { return ids_.size(); }
  std::size_t stream_count() const { return streams_.size(); }
  const P2pResolver& resolver() const { return resolver_; }
  const IwarpCmAgentStats& stats() const { return stats_; }

 private:
  enum class IdState : std::uint8_t {
    listening,
    connecting,  // active: our Request is out, or the attempt waits for the peer's (p2p)
    requested,   // passive: connect_request delivered, accept()/reject() pending
    accepting,   // passive: accepted; established follows at once
    established,
    disconnected,
  };

  struct Id {
    IdState state = IdState::connecting;
    StreamId stream = 0;
    IwarpCmId listener = 0;       // passive ids: the listener of their request
    bool p2p_attempt = false;     // connect() went through the resolver
    bool peer_to_peer = false;    // the connection carries CM headers
    P2pKey key;
    IwarpConnectParams connect;   // active: what answers a peer request on the attempt's behalf
    std::uint64_t peer_incarnation = 0;
    bool disconnected_reported = false;
    std::optional<Time> timewait_until;
    // listener
    IwarpListenParams listen;
    ListenBacklog backlog;              // B1
    std::vector<StreamId> handshaking;  // oldest first
  };

  enum class StreamPhase : std::uint8_t {
    connecting,   // active: Request out (or queued behind the TCP connect), Reply awaited
    handshaking,  // passive: Request awaited (counted in its listener's backlog)
    parked,       // passive p2p: the Request is the resolver's to place
    requested,    // passive: the Request is with an id
    running,      // start_stream done
    closing,      // close_stream sent; waiting for handle_stream_closed
  };

  struct Stream {
    StreamPhase phase = StreamPhase::connecting;
    IwarpCmId owner = 0;     // the id it serves (0: a handshake or a parked request)
    IwarpCmId listener = 0;  // passive: where it arrived
    Endpoint peer;
    Time opened_at{};
    bool heard = false;      // a byte arrived during setup
    bool charged = false;    // passive: counts in its listener's backlog (B1), source peer.address
    bool tcp_connected = false;
    bool p2p = false;        // a p2p link of the resolver
    P2pKey key;              // passive p2p: the request's key
    NodeIdentity peer_node;  // passive p2p: the request's sender
    AttemptId peer_cmid = 0;
    std::optional<MpaInitiator> initiator;
    std::optional<MpaResponder> responder;
    std::optional<Time> deadline;  // the handshake's
  };

  // P2pBinding: the resolver's actions on iWARP (docs/p2p.md, Rules)
  void deliver_request(const P2pAction& action, Time now) override;
  void reject_request(const P2pAction& action, Time now) override;
  void accept_into_attempt(const P2pAction& action, Time now) override;
  void teardown_link(const P2pAction& action, Time now) override;
  void attempt_failed(const P2pAction& action, Time now) override;
  // R5b needs no check over iWARP: a dead peer's stream is reset by its kernel, so an
  // established link is a live one and connect() passes no CheckLink. Never emitted here.
  void dial_attempt(const P2pAction&, Time) override {}
  void attempt_already_connected(const P2pAction&, Time) override {}

  StreamId new_stream() { return next_stream_++; }
  Id* find_id(IwarpCmId id);
  Stream* find_stream(StreamId stream);
  void sync_deadline(StreamId stream, Stream& s);
  void drain_handshake(StreamId stream, Time now);
  void flush_transmit(StreamId stream, Stream& s);
  void on_request(StreamId stream, Time now);
  void deliver(StreamId stream, IwarpCmId listener, std::span<const std::uint8_t> app_data);
  void on_established(StreamId stream, const MpaResult& result, Time now);
  void on_rejected(StreamId stream, const MpaResult& result, Time now);
  void on_failed(StreamId stream, const MpaEvent& event, Time now);
  void tcp_failed(IwarpCmId id, int error, Time now);
  bool displace_stalled_handshake(Id& listener, std::uint32_t source, Time now);
  void release_charge(Stream& s);
  void forget_stream(StreamId stream);
  void abandon(StreamId stream, bool graceful);
  void close_stream(StreamId stream, Stream& s, bool graceful);
  void end_p2p(IwarpCmId id);
  void emit_disconnected(IwarpCmId id, Id& record);
  void run_resolver(Time now) { executor_.run(resolver_, *this, now); }
  std::vector<std::uint8_t> cm_header(std::uint32_t tag, AttemptId number,
                                      std::span<const std::uint8_t> application) const;
  static MpaConfig mpa_config(CrcPolicy crc, std::uint16_t ird, std::uint16_t ord, Duration timeout);
  void push(IwarpCmAction action) { actions_.push_back(std::move(action)); }
  void push(IwarpCmEvent event) { events_.push_back(std::move(event)); }

  IwarpCmAgentConfig config_;
  P2pResolver resolver_;
  P2pExecutor executor_;
  std::map<IwarpCmId, Id> ids_;
  std::map<StreamId, Stream> streams_;
  std::map<AttemptId, IwarpCmId> attempts_;  // p2p attempt (CmId number) → id
  std::set<std::pair<Time, StreamId>> handshake_deadlines_;
  std::set<std::pair<Time, IwarpCmId>> timewaits_;
  std::uint16_t p2p_listen_port_ = 0;
  IwarpCmId p2p_listener_ = 0;
  IwarpCmId next_id_ = 1;
  StreamId next_stream_ = 1;
  std::deque<IwarpCmAction> actions_;
  std::deque<IwarpCmEvent> events_;
  IwarpCmAgentStats stats_;
};

}  // namespace peercm::core::iwarp
