// The peer-to-peer collision resolver (docs/p2p.md, Rules: R3-R8 and R5a) as a sans-IO core:
// application calls, connection events and time in; polled actions and one deadline out. It knows
// attempts, peers, tags and node identities — never MPA, TCP or the IB CM — so the same object
// serves every transport (docs/p2p.md, Pieces). The transport's CM agent names connections
// (LinkId) and does what each P2pAction says (core/p2p_executor.hpp); the resolver keeps one small
// record per p2p key and forgets a link once it closed and an attempt once it ended.
#pragma once

#include <compare>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <system_error>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/time.hpp"
#include "peercm/result.hpp"

namespace peercm::core {

// docs/p2p.md R2: (peer address, advertised listening port, tag). For an outgoing attempt
// the address and port are the destination; for a request, the TCP source address and the
// listening port the initiator advertises in its CM header.
struct P2pKey {
  std::uint32_t address = 0;
  std::uint16_t port = 0;
  std::uint32_t tag = 0;
  // The sender's node GUID when its request advertises no listening port (0): without a
  // listening address, only the node tells two non-listening peers on one host apart.
  // Attempts always name a listener, so their keys leave it 0 and never match such a key.
  std::uint64_t node = 0;
  friend auto operator<=>(const P2pKey&, const P2pKey&) = default;
};

// docs/p2p.md, Rules, vocabulary: the node GUID (random at open unless set) and the incarnation
// (random at every open; a new one means the peer restarted).
struct NodeIdentity {
  std::uint64_t guid = 0;
  std::uint64_t incarnation = 0;
  friend bool operator==(const NodeIdentity&, const NodeIdentity&) = default;
};

// The local CmId number of an outgoing attempt: the collision tie-breaker after the GUID (the
// QPN over the IB CM). Numbers grow within one incarnation (a per-context counter shared by
// every CmId, a fresh one per connect): rule 6 tells a late copy of an older request from a
// newer attempt by comparing them.
using AttemptId = std::uint32_t;
// A transport connection, named by the driver; never reused, never 0.
using LinkId = std::uint64_t;

enum class P2pRejectReason : std::uint8_t { collision = 1, duplicate = 2 };

struct P2pAction {
  enum class Kind : std::uint8_t {
    // rule 4: give the request on `link` to the application (CONNECT_REQUEST on the listener).
    deliver_request,
    // rules 3/6: answer the request on `link` with a reject carrying `reason`, then close it.
    // A collision reject comes once the active peer's own attempt is ESTABLISHED (rule 3).
    reject_request,
    // rule 3 passive: close `attempt`'s current link silently (`aborted_link`, 0 when it has
    // none any more), accept the request on `link` on behalf of `attempt` (its CmId and QP move
    // to `link`); the app sees ESTABLISHED on that CmId once `link` establishes.
    accept_into_attempt,
    // rule 6: a restarted (or re-connecting) peer replaces `link`: tear it down (DISCONNECTED
    // on its CmId when it was established).
    teardown_link,
    // rule 8: `attempt` ends with CONNECT_ERROR (deadline passed); close `link` if not 0 (the
    // attempt's own link, or the request link it was bound to).
    attempt_failed,
    // rule R5b: the connection `attempt` waited on ended without a new request: the attempt
    // proceeds as a fresh connect, its own request going out on `link` (the attempt_link its
    // connect() named).
    dial_attempt,
    // rule R5b: the key's established connection `link` answered its check, so the peer is the
    // incarnation it was: `attempt` ends with EISCONN, reported as an event (CONNECT_ERROR).
    // `link` stays established; nothing is closed.
    attempt_already_connected,
  };
  Kind kind = Kind::deliver_request;
  P2pKey key;
  LinkId link = 0;
  LinkId aborted_link = 0;
  AttemptId attempt = 0;
  P2pRejectReason reason = P2pRejectReason::collision;
};

struct P2pStats {
  std::uint64_t collisions_won = 0;      // attempts that established after holding a losing request
  std::uint64_t collisions_lost = 0;     // accept_into_attempt: an attempt bound to the peer's request
  std::uint64_t rejected_collision = 0;  // requests answered with reject(collision)
  std::uint64_t rejected_duplicate = 0;  // requests answered with reject(duplicate)
  std::uint64_t replaced_restarted = 0;  // links replaced by a request with a new incarnation
  std::uint64_t delivered = 0;           // requests delivered to the application
  std::uint64_t attempts_timed_out = 0;  // attempt_failed
  std::uint64_t replaced_stale = 0;      // links replaced by a newer attempt of the same incarnation
  std::uint64_t links_checked = 0;       // R5b: connects that waited on a check of the connection
  std::uint64_t checks_alive = 0;        // of which the connection answered (EISCONN)
};

class P2pResolver {
 public:
  explicit P2pResolver(NodeIdentity local);

  // --- inputs: the application ---
  // App connect on `key` (rule 5): EISCONN if K has an established link; EALREADY if a
  // delivered request for K is undecided (or accepted, not yet established) or another attempt
  // for K is pending. `attempt_link` is the link the attempt's own request travels on. The
  // attempt ends (established / failed) by `deadline`. EINVAL for an attempt id or link that is
  // already in use, or link 0.
  Status<std::errc> connect(const P2pKey& key, AttemptId attempt, LinkId attempt_link, Time deadline);
  // The same with the unseen-request rule (docs/p2p.md, Rules, R5): when a delivered request
  // for `key` is undecided, the resolver asks `take_back` (with the request's link) to take its
  // CONNECT_REQUEST back from the application if the application has not fetched it. If it
  // did (true), that request meets the new attempt as a colliding request (rule 3), before the
  // attempt has sent anything: either the attempt is bound to it at once (accept_into_attempt,
  // aborted_link = `attempt_link`, which then never carries a request: see attempt_dials()) or
  // the attempt's request goes out and the taken-back request is held. If it did not (false),
  // EALREADY as above. Every transport uses this entry point; only the taking back is theirs.
  using TakeBack = std::function<bool(LinkId request_link)>;
  // R5b, the stale-connection rule (docs/p2p.md, Rules): when `key` has an established link,
  // `check` (when given) is asked to check it (its transport sends a liveness probe on it) and
  // answers whether it started one. If it did, the attempt is admitted and waits without
  // dialling (attempt_dials() is false) until the first of: a request for `key` that rule 6
  // says replaces the link (teardown_link, then accept_into_attempt with aborted_link 0),
  // handle_link_alive(link) (attempt_already_connected), the link's close (dial_attempt: the
  // attempt's request goes out on `attempt_link`), or its deadline (attempt_failed, link 0).
  // If it did not, or without `check`, EISCONN at once as before.
  using CheckLink = std::function<bool(LinkId established_link)>;
  Status<std::errc> connect(const P2pKey& key, AttemptId attempt, LinkId attempt_link, Time deadline,
                            Time now, const TakeBack& take_back, const CheckLink& check = {});
  // Whether `attempt` still waits for a reply on `attempt_link` (its own request must go out):
  // false once connect() bound it to a taken-back request.
  bool attempt_dials(AttemptId attempt, LinkId attempt_link) const;

  // --- inputs: the connection manager / transport ---
  // An incoming p2p request on `link` for `key` from `peer`, whose attempt id is
  // `peer_attempt` (rules 3, 4, 6). A request our pending attempt wins (rule 3, active peer) is
  // held: rejected (collision) once our attempt is ESTABLISHED; if our attempt ends any other way
  // (REJECTED, UNREACHABLE, deadline, destroyed) it proceeds as if it had just arrived (rule 4):
  // the peer's losing attempt is waiting for exactly that.
  void handle_request(const P2pKey& key, LinkId link, const NodeIdentity& peer,
                      AttemptId peer_attempt, Time now);
  // The peer's CM rejected our attempt's request (collision or duplicate): the attempt is NOT
  // reported to the app; it keeps waiting for the peer's own request until its deadline (rule 3:
  // never REJECTED). Its own link is forgotten (the driver closes it).
  void handle_attempt_rejected_by_cm(AttemptId attempt);
  // The attempt ended otherwise (application reject, unreachable, error, app destroyed its id):
  // forget it, with whatever link it held (the driver closes that link). Report it BEFORE the
  // close of the attempt's link: a close alone means the attempt lives on (see
  // handle_link_closed).
  void handle_attempt_ended(AttemptId attempt);
  // `link` for `key` reached ESTABLISHED (an attempt's own link, or an accepted request link).
  // For an attempt's own link the peer's CmId on it stays unknown here: a later request of that
  // incarnation is then always a duplicate (rule 6 in its plain form).
  void handle_established(const P2pKey& key, LinkId link, std::uint64_t peer_incarnation);
  // Same, with the CmId number the peer put in its accept Reply (its CM header). With it, a
  // request of the same incarnation whose attempt id is greater than that CmId comes from a
  // NEWER attempt (the peer can only have closed `link` before making it), not a late
  // duplicate: `link` is replaced. Drivers should prefer this overload.
  void handle_established(const P2pKey& key, LinkId link, std::uint64_t peer_incarnation,
                          AttemptId peer_cmid);
  void handle_request_accepted(LinkId link);  // the app accepted a delivered request
  void handle_request_rejected(LinkId link);  // the app rejected a delivered request
  // Any link closed (established or not). An attempt whose own (or bound) link closes lives on
  // until its deadline and binds the peer's next request (a restarted peer's, say).
  void handle_link_closed(LinkId link);
  // R5b: the established `link` answered the check connect() asked for (the peer is the same
  // incarnation). Ignored unless an attempt waits on that link's check.
  void handle_link_alive(LinkId link);
  void handle_timeout(Time now);

  // --- outputs ---
  std::optional<Time> next_deadline() const;
  std::optional<P2pAction> poll_action();

  // --- introspection ---
  std::size_t tracked_links() const { return links_.size(); }
  std::size_t tracked_attempts() const { return attempts_.size(); }
  const P2pStats& stats() const { return stats_; }
  const NodeIdentity& local() const { return local_; }
  std::optional<LinkId> established_link(const P2pKey& key) const;

 private:
  // One state per p2p key; a key without an entry is idle. At most one attempt and at most one
  // link per key at any time (rule 5: one connection per p2p key, always).
  enum class KeyState : std::uint8_t {
    requesting,   // our attempt's request is out on `link`; waiting for the reply. A colliding
                  // request it wins is `held` (rule 3, active peer)
    lost,         // our attempt has no link (rejected by the peer's CM, or its link closed):
                  // waiting for the peer's request to bind (rule 3)
    delivered,    // the peer's request on `link` is with the application, undecided (rule 4)
    accepted,     // the application accepted it; waiting for `link` to establish
    binding,      // our attempt was bound to the peer's request on `link` (rule 3 passive)
    established,  // `link` is the connection for this key
    checking,     // `link` is established and being checked (R5b): `attempt` waits on it and
                  // will dial on `attempt_link` if the link ends without a new request
  };

  // A peer's request: its link and what its CM header said.
  struct PeerRequest {
    LinkId link = 0;  // 0: none
    std::uint64_t incarnation = 0;
    AttemptId attempt = 0;
    std::uint64_t guid = 0;  // the sender's node GUID (rule 3's order for a taken-back request)
  };

  struct Entry {
    KeyState state = KeyState::requesting;
    LinkId link = 0;        // see KeyState; 0 only when lost
    AttemptId attempt = 0;  // requesting / lost / binding / checking
    Time deadline{};        // requesting / lost / binding / checking
    LinkId attempt_link = 0;  // checking: where the attempt's own request goes if it dials
    bool collided = false;  // requesting: won a collision (stats)
    PeerRequest held;       // requesting: the colliding request our attempt wins
    std::uint64_t peer_incarnation = 0;  // delivered / accepted / binding / established / checking
    std::optional<AttemptId> peer_cmid;  // the peer's CmId on `link`, when known
    std::uint64_t peer_guid = 0;         // delivered: the request's sender (unseen-request rule)
  };

  using Entries = std::map<P2pKey, Entry>;

  static bool has_attempt(KeyState state);
  static bool older_or_same(const PeerRequest& request, std::uint64_t incarnation,
                            std::optional<AttemptId> known);
  void on_request_while_requesting(Entries::iterator it, const PeerRequest& request,
                                   const NodeIdentity& peer);
  void on_request_while_checking(Entries::iterator it, const PeerRequest& request);
  void end_check(Entries::iterator it);
  void deliver(const P2pKey& key, const PeerRequest& request);
  void bind(Entries::iterator it, const PeerRequest& request);
  void reject(const P2pKey& key, LinkId link, P2pRejectReason reason);
  void replace(Entries::iterator it, const PeerRequest& request);
  void established(const P2pKey& key, LinkId link, std::uint64_t peer_incarnation,
                   std::optional<AttemptId> peer_cmid);
  void attempt_lost_link(Entries::iterator it);
  void attempt_over(Entries::iterator it);
  void forget(Entries::iterator it);
  void expire(Time now);
  void emit(const P2pAction& action) { actions_.push_back(action); }

  NodeIdentity local_;
  Entries entries_;
  std::unordered_map<LinkId, P2pKey> links_;        // every link some entry holds
  std::unordered_map<AttemptId, P2pKey> attempts_;  // every attempt some entry holds
  std::set<std::pair<Time, AttemptId>> deadlines_;  // one per attempt
  std::vector<P2pAction> actions_;
  std::size_t next_action_ = 0;
  P2pStats stats_;
};

}  // namespace peercm::core
