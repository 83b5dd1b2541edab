// The IB CM agent of one node as a sans-IO core: it owns the node's IbCmConnections, routes each
// inbound CM MAD to its connection (roce-ibcm-wire.md §4.6 lookup: REQs by the sender's (CA GUID,
// comm ID), then by Service ID to a listener; everything else by our comm ID), allocates comm
// IDs, answers what belongs to no connection (REJ 8, REJ 10, DREP), and binds the peer-to-peer
// model of docs/p2p.md to the IB CM through the transport-independent P2pResolver.
//
// p2p binding (docs/p2p.md R3, wire sheet §5): a p2p REQ carries the peercm p2p header
// (ibcm_p2p_header.hpp). Each REQ exchange is one resolver link. The collision order is the
// resolver's: node GUID = CA GUID, attempt id = QPN. The active peer drops the losing REQ and its
// copies silently; the passive peer's REQ_SENT connection takes the peer's REQ (its REQ stops,
// its comm ID stays) and answers it with a REP on behalf of the application's attempt.
//
// SIDR (ibcm_agent_sidr.cpp): rdma_cm's UDP port space has no connections; one SIDR_REQ /
// SIDR_REP exchange per id, matched by request ID, resent on a timer, bounded in both directions.
//
// The application names connections by IbCmId (rdma_cm's cm_id): an attempt keeps its id when
// it is bound to the peer's REQ. Ids end after `rejected`, `unreachable`, `connect_error`, or
// `timewait_exit`; a connection whose id ended finishes its own protocol (TIMEWAIT) alone.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <system_error>
#include <tuple>
#include <utility>
#include <vector>

#include "core/ibcm/ibcm_connection.hpp"
#include "core/ibcm/ibcm_types.hpp"
#include "core/p2p_executor.hpp"
#include "core/p2p_resolver.hpp"
#include "core/time.hpp"
#include "wire/ibcm/cm_sidr.hpp"
#include "peercm/result.hpp"

namespace peercm::core::ibcm {

using IbCmId = std::uint32_t;  // never 0, never reused by one agent

struct IbCmAgentConfig {
  NodeIdentity identity;  // guid = the CA GUID of every REQ/REP; incarnation: random per open
  Ipv4Address address{};  // our IPv4 address; the GID is ::ffff:a.b.c.d (§1.1)
  IbCmTiming timing;
  // Bounds every active attempt whose connect() names none (CmOption::connect_timeout).
  Duration connect_timeout = std::chrono::seconds(30);
  std::uint32_t first_comm_id = 1;  // comm IDs count up from here (random per open, §4.6)
  // Bits of first_comm_id that every comm ID (and SIDR request ID) keeps; the others count.
  // The I/O layer puts what routes a reply to this agent there (a RoCE slot).
  std::uint32_t comm_id_fixed_bits = 0;
  std::uint32_t tid_high = 1;       // the upper 32 bits of the TIDs this agent starts (§3.3)
};

// The most application bytes a REQ carries: rdma_cm leaves 56 (§6), the p2p header takes 20.
inline constexpr std::size_t kMaxConnectPrivateData = 56;
inline constexpr std::size_t kMaxP2pConnectPrivateData = 36;
inline constexpr std::size_t kMaxAcceptPrivateData = 196;
inline constexpr std::size_t kMaxP2pAcceptPrivateData = 176;

struct IbCmConnectParams {
  Ipv4Address destination{};
  std::uint16_t port = 0;  // the service: rdma_cm's TCP port space (§6)
  // The port this node listens on, sent as the rdma_cm header's source port: p2p keys are
  // (peer address, its listening port, tag) (docs/p2p.md R2). 0: `port`.
  std::uint16_t source_port = 0;
  std::uint32_t tag = 0;
  bool peer_to_peer = true;
  std::uint32_t qpn = 0;  // also the attempt id of the p2p order; must grow per attempt
  std::uint32_t starting_psn = 0;
  std::uint8_t responder_resources = 0;
  std::uint8_t initiator_depth = 0;
  std::uint8_t retry_count = 7;
  std::uint8_t rnr_retry_count = 7;
  std::uint8_t path_mtu = 3;
  std::vector<std::uint8_t> private_data;  // ≤ 56, or ≤ 36 with peer_to_peer
  // The attempt ends by now + this unless ESTABLISHED (CmOption::connect_timeout): a p2p
  // attempt by the resolver (docs/p2p.md R8), a client/server one by the agent, whatever the
  // IB CM's own retries allow. None: the agent's IbCmAgentConfig::connect_timeout.
  std::optional<Duration> connect_timeout;
};

// SIDR (IBTA ch. 12.11), rdma_cm's UDP port space: one SIDR_REQ/SIDR_REP exchange tells a UD
// client the service's QPN and Q_Key; no connection, no comm IDs, no TIMEWAIT.
// The application bytes a SIDR_REQ carries after rdma_cm's header: 216 - 36.
inline constexpr std::size_t kMaxSidrRequestPrivateData = 180;
inline constexpr std::size_t kMaxSidrReplyPrivateData = 136;
// rdma_cm's Q_Key for RDMA_PS_UDP (the kernel's RDMA_UDP_QKEY).
inline constexpr std::uint32_t kRdmaUdpQkey = 0x01234567;
// SIDR exchanges held at once in each direction: our unanswered requests, and received requests
// the application has not answered. A REQ beyond the bound is dropped and counted.
inline constexpr std::size_t kMaxSidrPending = 64;
// REQs whose exchange ended, remembered for TIMEWAIT so that their late copies are dropped: at
// most this many; past it the one that would expire first is forgotten (a late copy of it is
// then a new REQ). Every REQ a sender makes end would otherwise cost memory for 2.1 s, whatever
// the rate (docs/reliability.md, "Requests a listener holds").
inline constexpr std::size_t kMaxTombstones = 4096;

struct IbCmSidrParams {
  Ipv4Address destination{};
  std::uint16_t port = 0;         // the service: rdma_cm's UDP port space (§6)
  std::uint16_t source_port = 0;  // the rdma_cm header's source port
  std::vector<std::uint8_t> private_data;  // ≤ 180
  // The SIDR_REQ is resent every `retry_interval` up to `max_retries` times, then the id is
  // unreachable. Unset: the agent's cm_response_timeout and max_cm_retries.
  std::optional<Duration> retry_interval;
  std::optional<std::uint8_t> max_retries;
};

struct IbCmAcceptParams {
  std::uint32_t qpn = 0;
  std::uint32_t qkey = kRdmaUdpQkey;  // a SIDR request's answer only
  std::uint32_t starting_psn = 0;
  std::uint8_t responder_resources = 0;
  std::uint8_t initiator_depth = 0;
  std::uint8_t rnr_retry_count = 7;
  std::vector<std::uint8_t> private_data;  // ≤ 196, or ≤ 176 for a p2p request; SIDR: ≤ 136
};

struct IbCmAgentEvent {
  enum class Kind : std::uint8_t {
    connect_request,  // a new id for a delivered REQ: accept() or reject() it
    reply_sent,       // passive: our REP is out (accept(), or R3 bound an attempt to the
                      // peer's REQ); `peer` is the REQ's QP. IBTA ch. 12: the QP receives
                      // from now on, so that the peer's first packets, which may overtake
                      // the RTU, are not lost. ESTABLISHED follows at the RTU.
    established,
    rejected,         // the peer rejected (`reason`, `private_data`, `ari`); the id ends
    unreachable,      // our REQ went unanswered through every retry or until the attempt's
                      // connect timeout; the id ends
    connect_error,    // establishment failed otherwise (connect timeout after the peer spoke,
                      // p2p deadline, REP retries, MRA promise, the peer restarted); the id ends.
                    // `already_connected`: R5b, the key's connection proved alive (EISCONN)
    disconnected,
    timewait_exit,    // the id ends
  };
  Kind kind = Kind::established;
  IbCmId id = 0;
  std::uint16_t reason = 0;
  std::vector<std::uint8_t> private_data;  // the application's bytes (CM headers removed)
  std::vector<std::uint8_t> ari;
  // connect_request, established: who is at the other end.
  Ipv4Address peer_address{};
  std::uint16_t port = 0;
  // connect_request: the service (listened port) the REQ was addressed to, from its Service
  // ID. `port` is the peer's advertised source port, which differs when the peer listens too.
  std::uint16_t service_port = 0;
  std::uint32_t tag = 0;
  bool peer_to_peer = false;
  IbCmPeer peer;
  std::uint32_t local_comm_id = 0;
  // SIDR: connect_request for a SIDR_REQ, established for a valid SIDR_REP (peer.qpn, qkey),
  // rejected for any other status (`reason` = the SIDR status), unreachable when no REP came.
  bool datagram = false;
  std::uint32_t qkey = 0;
  bool already_connected = false;
};

struct IbCmAgentStats {
  std::uint64_t mads_received = 0;
  std::uint64_t malformed = 0;           // dropped: did not decode
  std::uint64_t unmatched = 0;           // dropped: no connection for it
  std::uint64_t duplicate_reqs = 0;      // REQs routed to their existing connection
  std::uint64_t rejected_no_service = 0; // REJ 8
  std::uint64_t rejected_stale = 0;      // REJ 10 sent by the agent
  std::uint64_t p2p_dropped = 0;         // losing REQs (and copies) dropped silently (rule 3)
  std::uint64_t p2p_duplicates = 0;      // REQs rejected as late duplicates (rule 6)
  std::uint64_t p2p_bound = 0;           // attempts bound to the peer's REQ (rule 3 passive)
  std::uint64_t sidr_malformed = 0;      // SIDR MADs dropped: did not decode
  std::uint64_t sidr_unmatched = 0;      // SIDR_REPs for no request of ours (or from elsewhere)
  std::uint64_t sidr_duplicates = 0;     // SIDR_REQ copies (dropped, or answered again)
  std::uint64_t sidr_flood_dropped = 0;  // SIDR_REQs beyond kMaxSidrPending
  std::uint64_t tombstones_evicted = 0;  // ended REQs forgotten early: more than kMaxTombstones
  std::uint64_t sidr_no_service = 0;     // answered with status service_unsupported
  std::uint64_t rejected_address = 0;    // a REQ (REJ 12) or SIDR_REQ (status rejected) naming another address than its source
  std::uint64_t peer_unreachable = 0;    // exchanges ended by handle_peer_unreachable
};

class IbCmAgent : private P2pBinding {
 public:
  explicit IbCmAgent(const IbCmAgentConfig& config);

  // --- inputs: the application ---
  // REQs for `port` in rdma_cm's TCP port space reach this node; others get REJ 8 (§6).
  void listen(std::uint16_t port);
  void stop_listening(std::uint16_t port);
  // p2p: EISCONN / EALREADY per docs/p2p.md, Rules, R5; EINVAL for too much private data, a
  // field the REQ cannot carry, or a QPN another pending attempt uses. `take_back` is R5's
  // unseen-request question: take the connect_request of id `request` back from the application
  // if it has not fetched it (true); the resolver then lets its REQ meet the attempt (R3).
  using TakeBack = std::function<bool(IbCmId request)>;
  // `check` is R5b's (docs/p2p.md, Rules): when the key has an established connection, asked
  // with that connection's id to check it (send a liveness probe on its QP now); true if it
  // did. The attempt then waits: ESTABLISHED on it when the restarted peer's REQ replaces the
  // connection (whose id gets `disconnected` first), connect_error with `already_connected`
  // after handle_connection_alive(), its own REQ out once the connection ends (disconnect(),
  // destroy(), a DREQ), connect_error at its deadline. Without it: EISCONN at once.
  using CheckConnection = std::function<bool(IbCmId established)>;
  Result<IbCmId, std::errc> connect(const IbCmConnectParams& params, Time now, const TakeBack& take_back = {},
                                    const CheckConnection& check = {});
  // SIDR: a UD service id for `params.port`: its SIDR_REQs reach this node's UDP listeners.
  void listen_datagram(std::uint16_t port);
  void stop_listening_datagram(std::uint16_t port);
  // SIDR_REQ to `params.destination`; `established`, `rejected` or `unreachable` follows and the
  // id ends. EINVAL for too much private data; ENOBUFS with kMaxSidrPending requests out.
  Result<IbCmId, std::errc> sidr_request(const IbCmSidrParams& params, Time now);
  // A connect_request's id: the REP (§4.9 REQ_RCVD → REP_SENT). EINVAL for any other id.
  // For a SIDR request: a SIDR_REP (status valid, `qpn`, `qkey`); the id ends.
  Status<std::errc> accept(IbCmId id, const IbCmAcceptParams& params, Time now);
  // A connect_request's id: REJ reason 28 with `private_data` (§6 rdma_reject); the id ends.
  // For a SIDR request: a SIDR_REP with status rejected.
  Status<std::errc> reject(IbCmId id, std::span<const std::uint8_t> private_data, Time now);
  // An established id: DREQ; `disconnected` and `timewait_exit` follow.
  Status<std::errc> disconnect(IbCmId id, Time now);
  // The application destroyed the id (ib_destroy_cm_id): whatever its connection is doing
  // ends without further events: REJ while establishing, DREQ when established, and a p2p
  // attempt leaves the resolver. Unknown ids are ignored.
  void destroy(IbCmId id, Time now);

  // --- inputs: the network and time ---
  // One CM MAD from the GSI datagram whose source address is `from` (answers that belong to no
  // connection go there).
  void handle_mad(const Gid& from, std::span<const std::uint8_t> mad, Time now);
  void handle_timeout(Time now);
  // The host of `peer` reported our MAD to it undeliverable: nobody holds its CM port (an ICMP
  // port unreachable that the I/O layer matched to the MAD it quotes, whose Local
  // Communication ID is `local_comm_id`; docs/reliability.md, "Dead peers"). The exchange of
  // that connection, if it waits for `peer`, ends at once as if its resends had run out: an
  // attempt UNREACHABLE, an accepted request CONNECT_ERROR, a DREQ to TIMEWAIT. Nothing else
  // changes, so a forged error can end no exchange with another peer.
  void handle_peer_unreachable(const Gid& peer, std::uint32_t local_comm_id, Time now);
  // R5b: the established id `id` heard from its peer after the check a connect() asked for:
  // the attempt waiting on it ends with connect_error, `already_connected`. Otherwise a no-op.
  void handle_connection_alive(IbCmId id, Time now);

  // --- outputs ---
  std::optional<OutboundMad> poll_mad();
  std::optional<IbCmAgentEvent> poll_event();
  std::optional<Time> next_deadline() const;

  // --- introspection ---
  std::size_t connection_count() const { return conns_.size(); }
  std::size_t id_count() const { return ids_.size(); }
  // REQs waiting on the resolver (held) plus remembered dropped REQs.
  std::size_t pending_request_count() const { return pending_.size() + tombstones_.size(); }
  // SIDR exchanges under way: our unanswered requests plus received ones not yet answered.
  std::size_t sidr_count() const { return sidr_out_.size() + sidr_in_.size(); }
  std::optional<IbCmState> state_of(IbCmId id) const;
  const IbCmConnection* connection_of(IbCmId id) const;
  const P2pResolver& resolver() const { return resolver_; }
  const IbCmAgentStats& stats() const { return stats_; }
  const IbCmAgentConfig& config() const { return config_; }

 private:
  using RemoteKey = std::pair<std::uint64_t, std::uint32_t>;  // (peer CA GUID, peer comm ID)

  struct Conn {
    IbCmConnection cm;
    IbCmId owner = 0;  // 0: the id ended; the connection finishes alone
    LinkId link = 0;   // p2p: the resolver's name for this connection's REQ exchange
    std::optional<Time> indexed_deadline;      // indexed in timers_
    bool indexed_remote = false;               // indexed in by_remote_ under remote_of()
    bool indexed_established = false;          // indexed in established_by_qpn_
    // A delivered p2p REQ while its connection is in REQ_RCVD: kept so that R5's unseen-request
    // rule can take it back; freed once the connection leaves REQ_RCVD (it never returns).
    std::unique_ptr<std::array<std::uint8_t, wire::ibcm::kMadSize>> request_mad;
  };

  struct Id {
    enum class Phase : std::uint8_t { connecting, requested, accepted, established, closing };
    Phase phase = Phase::connecting;
    bool active = false;  // made by connect()
    bool p2p = false;
    P2pKey key;
    std::uint32_t conn = 0;  // local comm ID; 0: a p2p attempt waiting for the peer's REQ
    AttemptId qpn = 0;       // active: the attempt's QPN (its p2p attempt id)
    // Active, until ESTABLISHED: what answers a peer REQ on the attempt's behalf (rule 3
    // passive). An established id answers no REQ, so it keeps none.
    std::unique_ptr<const IbCmConnectParams> params;
    std::uint64_t peer_incarnation = 0;
    // Active, bound to the peer's REQ (R3 passive) until ESTABLISHED: that REQ's application
    // data, which the attempt's ESTABLISHED carries since it never sees a CONNECT_REQUEST.
    std::vector<std::uint8_t> bound_request_data;
    bool pending_attempt = false;  // active p2p: in attempts_
    // Active client/server, until ESTABLISHED: when the attempt ends (connect_deadlines_).
    std::optional<Time> connect_deadline;
    bool disconnect_reported = false;  // DISCONNECTED went up before the DREQ exchange ended
  };

  // A p2p REQ the resolver has not placed on a connection (just arrived, or held, rule 3).
  struct PendingRequest {
    std::array<std::uint8_t, wire::ibcm::kMadSize> mad{};
    RemoteKey remote;
  };

  // ibcm_agent.cpp: routing, connections, ids
  void on_req(const wire::ibcm::CmReq& req, std::uint64_t tid, std::span<const std::uint8_t> mad,
              const Gid& from, Time now);
  void on_rep(const wire::ibcm::CmRep& rep, std::uint64_t tid, const Gid& from, Time now);
  void on_rej(const wire::ibcm::CmRej& rej, Time now);
  void on_dreq(const wire::ibcm::CmDreq& dreq, std::uint64_t tid, const Gid& from, Time now);
  IbCmId open_passive(const wire::ibcm::CmReq& req, std::uint64_t tid, const P2pKey& key, LinkId link,
                      std::uint64_t incarnation, bool p2p, Time now);
  Conn* find_conn(std::uint32_t local_comm_id, std::uint32_t peer_comm_id);
  std::uint32_t new_conn();
  void index_remote(std::uint32_t comm);
  // A connection's key in by_remote_: (peer CA GUID, peer comm ID), fixed once the peer is known.
  static RemoteKey remote_of(const Conn& conn) { return {conn.cm.peer().guid, conn.cm.peer().comm_id}; }
  void sync(std::uint32_t comm, Time now);
  void on_conn_event(std::uint32_t comm, const IbCmEvent& event, Time now);
  void conn_failed(std::uint32_t comm, IbCmAgentEvent::Kind kind, const IbCmEvent& event);
  void detach(std::uint32_t comm);
  void end_id(IbCmId id);
  void push_event(IbCmAgentEvent event);
  IbCmAgentEvent peer_event(IbCmAgentEvent::Kind kind, IbCmId id, const Conn& conn) const;
  Id* find_id(IbCmId id);
  void send_answer(const wire::ibcm::CmMessage& message, std::uint64_t tid, const Gid& to);
  bool stale(std::uint64_t guid, std::uint32_t qpn, std::uint32_t except_comm, Time now);
  void index_established(std::uint32_t comm, Conn& conn);
  void remember_dropped(const RemoteKey& remote, Time now);
  void expire_tombstones(Time now);
  void unindex_connect_deadline(IbCmId id, Id& record);
  void expire_connect_deadlines(Time now);

  // ibcm_agent_sidr.cpp: SIDR
  struct SidrOutstanding {  // our SIDR_REQ, waiting for its REP
    IbCmId id = 0;
    OutboundMad mad;
    Time deadline{};
    Duration interval{};
    std::uint8_t retries_left = 0;
    Ipv4Address destination{};
    std::uint16_t port = 0;
  };
  struct SidrReceived {  // a delivered SIDR_REQ the application has not answered
    Gid from{};
    std::uint64_t tid = 0;
    std::uint32_t request_id = 0;
    std::uint64_t service_id = 0;
  };
  using SidrRemote = std::pair<Gid, std::uint32_t>;  // (sender, its request ID)
  struct SidrAnswered {  // the REP sent, resent for copies of its REQ until `until`
    OutboundMad mad;
    Time until{};
  };
  void handle_sidr_mad(const Gid& from, std::span<const std::uint8_t> mad, Time now);
  void on_sidr_req(const wire::ibcm::CmSidrReq& req, std::uint64_t tid, const Gid& from, Time now);
  void on_sidr_rep(const wire::ibcm::CmSidrRep& rep, const Gid& from);
  bool answer_sidr(IbCmId id, wire::ibcm::SidrStatus status, std::uint32_t qpn, std::uint32_t qkey,
                   std::span<const std::uint8_t> private_data, Time now);
  void send_sidr_rep(const Gid& to, std::uint64_t tid, const wire::ibcm::CmSidrRep& rep, Time now);
  void sidr_timeout(Time now);
  void sidr_deadline(std::optional<Time>& next) const;

  // ibcm_agent_p2p.cpp: the resolver binding
  void on_p2p_req(const wire::ibcm::CmReq& req, std::span<const std::uint8_t> mad, const P2pKey& key,
                  std::uint64_t incarnation, Time now);
  void drain_resolver(Time now) { executor_.run(resolver_, *this, now); }
  bool take_back_request(LinkId link, const TakeBack& take_back);
  bool check_connection(LinkId link, const CheckConnection& check);
  std::optional<IbCmRequestParams> request_of(const IbCmConnectParams& params) const;
  // P2pBinding: the resolver's actions over the IB CM (docs/p2p.md, Rules)
  void deliver_request(const P2pAction& action, Time now) override;
  void accept_into_attempt(const P2pAction& action, Time now) override;
  void reject_request(const P2pAction& action, Time now) override;
  void teardown_link(const P2pAction& action, Time now) override;
  void attempt_failed(const P2pAction& action, Time now) override;
  void dial_attempt(const P2pAction& action, Time now) override;
  void attempt_already_connected(const P2pAction& action, Time now) override;
  std::optional<PendingRequest> take_pending(LinkId link);
  std::vector<std::uint8_t> reply_private_data(std::uint32_t tag, std::span<const std::uint8_t> application) const;

  IbCmAgentConfig config_;
  Gid gid_;
  P2pResolver resolver_;
  P2pExecutor executor_;
  std::set<std::uint16_t> listeners_;
  std::map<std::uint32_t, Conn> conns_;        // by local comm ID
  std::map<IbCmId, Id> ids_;
  std::map<RemoteKey, std::uint32_t> by_remote_;  // §4.6: REQ duplicates
  std::map<LinkId, std::uint32_t> link_conn_;     // p2p link → local comm ID
  std::map<LinkId, PendingRequest> pending_;
  std::map<RemoteKey, LinkId> pending_by_remote_;
  std::map<AttemptId, IbCmId> attempts_;          // p2p attempt id (QPN) → id
  std::map<RemoteKey, Time> tombstones_;          // REQs dropped or ended: copies ignored until
  std::set<std::pair<Time, RemoteKey>> tombstone_expiry_;  // tombstones_ in the order they end
  std::set<std::pair<Time, std::uint32_t>> timers_;
  std::set<std::pair<Time, IbCmId>> connect_deadlines_;  // Id::connect_deadline, soonest first
  // ESTABLISHED connections by (peer CA GUID, peer QPN, local comm ID): §4.9's stale check
  // without a walk over every connection.
  std::set<std::tuple<std::uint64_t, std::uint32_t, std::uint32_t>> established_by_qpn_;
  std::uint32_t next_comm_id_;
  // The next free comm ID (never 0, none in use), counting within the non-fixed bits.
  std::uint32_t take_comm_id();
  IbCmId next_id_ = 1;
  LinkId next_link_ = 1;
  std::vector<OutboundMad> mads_;
  std::size_t next_mad_ = 0;
  std::vector<IbCmAgentEvent> events_;
  std::size_t next_event_ = 0;
  IbCmAgentStats stats_;
  std::set<std::uint16_t> datagram_listeners_;
  std::map<std::uint32_t, SidrOutstanding> sidr_out_;  // by request ID
  std::map<IbCmId, std::uint32_t> sidr_out_ids_;      // id → request ID
  std::map<IbCmId, SidrReceived> sidr_in_;
  std::map<SidrRemote, IbCmId> sidr_in_by_remote_;
  std::map<SidrRemote, SidrAnswered> sidr_answered_;
};

}  // namespace peercm::core::ibcm
