// The p2p collision resolver: one state per p2p key (docs/p2p.md, Rules), one function per input.
// Every decision carries the rule of docs/p2p.md it implements.
#include "core/p2p_resolver.hpp"

#include <cassert>
#include <tuple>

namespace peercm::core {
namespace {

// Rule 3: (node GUID, attempt id) decides — exactly the IB CM's (CA GUID, QPN). Two nodes
// configured with the same GUID whose CmId counters agree would tie; the incarnation (random per
// open) breaks that tie the same way on both sides, so the order stays total and antisymmetric.
bool local_wins(const NodeIdentity& local, AttemptId ours, const NodeIdentity& peer, AttemptId theirs) {
  return std::tie(local.guid, ours, local.incarnation) > std::tie(peer.guid, theirs, peer.incarnation);
}

}  // namespace

P2pResolver::P2pResolver(NodeIdentity local) : local_(local) {}

bool P2pResolver::has_attempt(KeyState state) {
  return state == KeyState::requesting || state == KeyState::lost || state == KeyState::binding ||
         state == KeyState::checking;
}

// Rule 6: a request of the incarnation we know whose attempt is no newer than the one we know is
// a late copy: attempt ids grow within an incarnation, and the peer's CM lets one attempt per key
// live at a time, so an older id belongs to an attempt that has ended (or moved to our link).
// Without the peer's CmId (`known` empty) every request of that incarnation is a copy.
bool P2pResolver::older_or_same(const PeerRequest& request, std::uint64_t incarnation,
                                std::optional<AttemptId> known) {
  return request.incarnation == incarnation && (!known || request.attempt <= *known);
}

// ---------------------------------------------------------------------------------------------
// Inputs: the application

Status<std::errc> P2pResolver::connect(const P2pKey& key, AttemptId attempt, LinkId attempt_link,
                                       Time deadline) {
  if (auto it = entries_.find(key); it != entries_.end()) {
    // Rule 5: one connection per p2p key, always.
    if (it->second.state == KeyState::established) return fail(std::errc::already_connected);
    // Rule 5: a delivered (or accepted) request for K is the connection; an attempt is pending.
    return fail(std::errc::connection_already_in_progress);
  }
  if (attempt_link == 0 || links_.contains(attempt_link) || attempts_.contains(attempt)) {
    return fail(std::errc::invalid_argument);
  }
  entries_.emplace(key, Entry{.state = KeyState::requesting,
                              .link = attempt_link,
                              .attempt = attempt,
                              .deadline = deadline});
  links_.emplace(attempt_link, key);
  attempts_.emplace(attempt, key);
  deadlines_.emplace(deadline, attempt);  // rule 8: every attempt ends by its deadline
  return {};
}

Status<std::errc> P2pResolver::connect(const P2pKey& key, AttemptId attempt, LinkId attempt_link,
                                       Time deadline, Time now, const TakeBack& take_back,
                                       const CheckLink& check) {
  expire(now);
  auto it = entries_.find(key);
  if (it != entries_.end() && it->second.state == KeyState::established && check) {
    if (attempt_link == 0 || links_.contains(attempt_link) || attempts_.contains(attempt)) {
      return fail(std::errc::invalid_argument);
    }
    // R5b: a transport without resets cannot tell a connection whose peer restarted from a
    // live one without asking it. The attempt waits on the answer instead of EISCONN now.
    if (!check(it->second.link)) return fail(std::errc::already_connected);
    Entry& entry = it->second;
    entry.state = KeyState::checking;
    entry.attempt = attempt;
    entry.attempt_link = attempt_link;
    entry.deadline = deadline;
    attempts_.emplace(attempt, key);
    deadlines_.emplace(deadline, attempt);  // rule 8: the wait is bounded by the attempt's deadline
    ++stats_.links_checked;
    return {};
  }
  if (it == entries_.end() || it->second.state != KeyState::delivered || !take_back) {
    return connect(key, attempt, attempt_link, deadline);
  }
  if (attempt_link == 0 || links_.contains(attempt_link) || attempts_.contains(attempt)) {
    return fail(std::errc::invalid_argument);
  }
  // Rule 5 refined (docs/p2p.md, Rules, R5): "delivered" means fetched. A request the
  // application has not fetched is taken back and meets the attempt as rule 3 says.
  const Entry delivered = it->second;
  if (!take_back(delivered.link)) return fail(std::errc::connection_already_in_progress);
  const PeerRequest request{.link = delivered.link,
                            .incarnation = delivered.peer_incarnation,
                            .attempt = delivered.peer_cmid.value_or(0),
                            .guid = delivered.peer_guid};
  if (stats_.delivered > 0) --stats_.delivered;  // it never reached the application
  forget(it);
  auto admitted = connect(key, attempt, attempt_link, deadline);
  assert(admitted);
  if (!admitted) return admitted;
  on_request_while_requesting(entries_.find(key), request,
                              NodeIdentity{.guid = request.guid, .incarnation = request.incarnation});
  return {};
}

bool P2pResolver::attempt_dials(AttemptId attempt, LinkId attempt_link) const {
  auto at = attempts_.find(attempt);
  if (at == attempts_.end()) return false;
  auto it = entries_.find(at->second);
  return it != entries_.end() && it->second.state == KeyState::requesting && it->second.link == attempt_link;
}

// ---------------------------------------------------------------------------------------------
// Inputs: the connection manager

void P2pResolver::handle_request(const P2pKey& key, LinkId link, const NodeIdentity& peer,
                                 AttemptId peer_attempt, Time now) {
  expire(now);  // rule 8: an attempt past its deadline binds nothing
  if (link == 0 || links_.contains(link)) return;  // driver error: one request per new link

  if (peer == local_) {
    // Our own request, looped back (a connect to our own listener): it is no collision and no
    // p2p connection; the attempt's side tracks the key. Delivered like client/server.
    ++stats_.delivered;
    emit({.kind = P2pAction::Kind::deliver_request, .key = key, .link = link});
    return;
  }

  const PeerRequest request{.link = link, .incarnation = peer.incarnation, .attempt = peer_attempt, .guid = peer.guid};
  auto it = entries_.find(key);
  if (it == entries_.end()) {
    deliver(key, request);  // rule 4: no local attempt, no connection
    return;
  }
  Entry& entry = it->second;
  switch (entry.state) {
    case KeyState::requesting:
      on_request_while_requesting(it, request, peer);
      return;
    case KeyState::lost:
      // Rule 3: our request is gone (the peer rejected it, or its link closed), so this is the
      // request our attempt must take: binding is the only way left to ESTABLISHED.
      bind(it, request);
      return;
    case KeyState::checking:
      on_request_while_checking(it, request);
      return;
    case KeyState::delivered:
    case KeyState::accepted:
    case KeyState::binding:
    case KeyState::established:
      if (older_or_same(request, entry.peer_incarnation, entry.peer_cmid)) {
        // Rule 6: a late duplicate (e.g. the request of the passive peer's aborted attempt).
        reject(key, link, P2pRejectReason::duplicate);
        return;
      }
      // Rule 6: a new incarnation (the peer restarted), or a newer attempt of the same one (the
      // peer closed `link` and connects again): the old link is dead at the peer.
      replace(it, request);
      return;
  }
}

void P2pResolver::on_request_while_requesting(Entries::iterator it, const PeerRequest& request,
                                              const NodeIdentity& peer) {
  Entry& entry = it->second;
  if (entry.held.link != 0) {
    if (older_or_same(request, entry.held.incarnation, entry.held.attempt)) {
      reject(it->first, request.link, P2pRejectReason::duplicate);  // rule 6: a late copy
      return;
    }
    // Rule 6: the held request's attempt is over (the peer restarted or tried again): answer it.
    ++(request.incarnation != entry.held.incarnation ? stats_.replaced_restarted : stats_.replaced_stale);
    links_.erase(entry.held.link);
    reject(it->first, entry.held.link, P2pRejectReason::duplicate);
    entry.held = {};
  }
  if (local_wins(local_, entry.attempt, peer, request.attempt)) {
    // Rule 3, active peer: R loses; keep waiting for O's reply. R is answered with a collision
    // reject once O is ESTABLISHED — and goes on as a fresh request if O ends otherwise, since
    // the passive peer's attempt then has nothing else to wait for.
    entry.collided = true;
    entry.held = request;
    links_.emplace(request.link, it->first);
    return;
  }
  // Rule 3, passive peer: abort O, accept R, bind O's CmId to R's connection.
  bind(it, request);
}

// R5b, outcome (a): a request that rule 6 says replaces the checked connection proves the peer
// restarted (or closed the link and connects anew). The stale link goes first (DISCONNECTED on
// its CmId), then the waiting attempt takes the request as a lost attempt does (rule 3): it has
// sent nothing, and the request, newer than anything of the peer this node knows, is no stale
// copy, so the attempt ends ESTABLISHED on its own CmId whatever the GUIDs say.
void P2pResolver::on_request_while_checking(Entries::iterator it, const PeerRequest& request) {
  Entry& entry = it->second;
  if (older_or_same(request, entry.peer_incarnation, entry.peer_cmid)) {
    reject(it->first, request.link, P2pRejectReason::duplicate);  // rule 6: a late copy
    return;
  }
  ++(request.incarnation != entry.peer_incarnation ? stats_.replaced_restarted : stats_.replaced_stale);
  emit({.kind = P2pAction::Kind::teardown_link, .key = it->first, .link = entry.link});
  links_.erase(entry.link);
  entry.link = 0;
  entry.attempt_link = 0;
  entry.state = KeyState::lost;
  entry.peer_cmid.reset();
  bind(it, request);
}

// R5b: the check is over with the connection still up (it answered, or the attempt ended
// otherwise): the key is the established connection it was.
void P2pResolver::end_check(Entries::iterator it) {
  Entry& entry = it->second;
  deadlines_.erase({entry.deadline, entry.attempt});
  attempts_.erase(entry.attempt);
  entry.state = KeyState::established;
  entry.attempt = 0;
  entry.attempt_link = 0;
}

void P2pResolver::handle_link_alive(LinkId link) {
  auto found = links_.find(link);
  if (found == links_.end()) return;
  auto it = entries_.find(found->second);
  assert(it != entries_.end());
  if (it->second.state != KeyState::checking || it->second.link != link) return;
  // R5b, outcome (b): the peer answered on the connection, so it is the incarnation we are
  // connected to: rule 5 stands, reported now that it is known.
  ++stats_.checks_alive;
  emit({.kind = P2pAction::Kind::attempt_already_connected,
        .key = it->first,
        .link = link,
        .attempt = it->second.attempt});
  end_check(it);
}

void P2pResolver::handle_attempt_rejected_by_cm(AttemptId attempt) {
  auto at = attempts_.find(attempt);
  if (at == attempts_.end()) return;
  auto it = entries_.find(at->second);
  assert(it != entries_.end());
  // Rule 3: our request lost at the peer (or was a duplicate there): not an error for the
  // application; wait for the winner's request until the deadline.
  if (it->second.state == KeyState::requesting) attempt_lost_link(it);
}

void P2pResolver::handle_attempt_ended(AttemptId attempt) {
  auto at = attempts_.find(attempt);
  if (at == attempts_.end()) return;
  auto it = entries_.find(at->second);
  assert(it != entries_.end());
  if (it->second.state == KeyState::checking) {
    end_check(it);  // the attempt held no link of its own; the connection it waited on stays
    return;
  }
  attempt_over(it);  // the driver reported the end and closes whatever link the attempt held
}

void P2pResolver::handle_established(const P2pKey& key, LinkId link, std::uint64_t peer_incarnation) {
  established(key, link, peer_incarnation, std::nullopt);
}

void P2pResolver::handle_established(const P2pKey& key, LinkId link, std::uint64_t peer_incarnation,
                                     AttemptId peer_cmid) {
  established(key, link, peer_incarnation, peer_cmid);
}

void P2pResolver::established(const P2pKey& key, LinkId link, std::uint64_t peer_incarnation,
                              std::optional<AttemptId> peer_cmid) {
  auto found = links_.find(link);
  if (found == links_.end() || !(found->second == key)) return;
  auto it = entries_.find(key);
  assert(it != entries_.end());
  Entry& entry = it->second;
  if (entry.link != link) return;  // a held request does not establish
  const PeerRequest held = entry.held;
  switch (entry.state) {
    case KeyState::requesting:
      // Our attempt's own request was accepted: the attempt ends ESTABLISHED. The Reply named
      // the peer's CmId on the link, if the driver passed it on.
      if (entry.collided) ++stats_.collisions_won;
      if (held.link != 0) links_.erase(held.link);
      entry.held = {};
      entry.peer_cmid = peer_cmid;
      deadlines_.erase({entry.deadline, entry.attempt});
      attempts_.erase(entry.attempt);
      break;
    case KeyState::binding:
      // Rule 3 passive: the bound attempt ends ESTABLISHED on the peer's connection; the peer's
      // CmId on it is its attempt, known from its request.
      deadlines_.erase({entry.deadline, entry.attempt});
      attempts_.erase(entry.attempt);
      break;
    case KeyState::delivered:  // established without an explicit accept: the app accepted
    case KeyState::accepted:
      break;
    case KeyState::established:
    case KeyState::checking:
    case KeyState::lost:
      return;
  }
  entry.state = KeyState::established;
  entry.peer_incarnation = peer_incarnation;
  entry.attempt = 0;
  entry.collided = false;
  if (held.link == 0) return;
  if (held.incarnation != peer_incarnation) {
    // Rule 6 with rule 7: the peer answered from the incarnation it runs now, so a held request
    // of another one comes from an incarnation that has ended (it arrived before the Reply, and a
    // restart outlasts any message in flight). Over a transport without resets (the IB CM) it
    // stays held across the restart; it is a late duplicate, not a newer attempt.
    reject(key, held.link, P2pRejectReason::duplicate);
    return;
  }
  if (older_or_same(held, peer_incarnation, entry.peer_cmid)) {
    // Rule 3, active peer: the losing request gets its collision reject now.
    reject(key, held.link, P2pRejectReason::collision);
    return;
  }
  // Rule 6: the held request comes from an attempt newer than the peer's CmId on our new link (or
  // from a new incarnation): the peer closed that link before it even reached us. It goes, and
  // the held request proceeds (rule 4).
  replace(it, held);
}

void P2pResolver::handle_request_accepted(LinkId link) {
  auto found = links_.find(link);
  if (found == links_.end()) return;
  Entry& entry = entries_.find(found->second)->second;
  if (entry.state == KeyState::delivered && entry.link == link) entry.state = KeyState::accepted;
}

void P2pResolver::handle_request_rejected(LinkId link) {
  auto found = links_.find(link);
  if (found == links_.end()) return;
  auto it = entries_.find(found->second);
  const KeyState state = it->second.state;
  if ((state == KeyState::delivered || state == KeyState::accepted) && it->second.link == link) forget(it);
}

void P2pResolver::handle_link_closed(LinkId link) {
  auto found = links_.find(link);
  if (found == links_.end()) return;  // already forgotten (rejected, aborted, torn down)
  auto it = entries_.find(found->second);
  assert(it != entries_.end());
  Entry& entry = it->second;
  if (entry.held.link == link) {
    // The passive peer aborted its losing request (it bound its attempt to ours) or gave up.
    links_.erase(link);
    entry.held = {};
    return;
  }
  assert(entry.link == link);
  switch (entry.state) {
    case KeyState::requesting:
    case KeyState::binding:
      // Rule 8: the attempt lives on until its deadline; a (new) request of the peer can still
      // bind it — e.g. a restarted peer's (rule 6).
      attempt_lost_link(it);
      return;
    case KeyState::delivered:
    case KeyState::accepted:
    case KeyState::established:
      forget(it);  // no leak: nothing outlives its connection
      return;
    case KeyState::checking: {
      // R5b, outcome (c): the checked connection ended (its probe went unanswered, the peer's
      // host refused it, the peer or the application closed it) and no newer request came:
      // the key is free, and the attempt goes on as a fresh connect.
      entry.state = KeyState::requesting;
      entry.link = entry.attempt_link;
      entry.attempt_link = 0;
      entry.peer_incarnation = 0;
      entry.peer_cmid.reset();
      links_.erase(link);
      links_.emplace(entry.link, it->first);
      emit({.kind = P2pAction::Kind::dial_attempt, .key = it->first, .link = entry.link, .attempt = entry.attempt});
      return;
    }
    case KeyState::lost:
      return;  // holds no link
  }
}

void P2pResolver::handle_timeout(Time now) { expire(now); }

// ---------------------------------------------------------------------------------------------
// Outputs

std::optional<Time> P2pResolver::next_deadline() const {
  if (deadlines_.empty()) return std::nullopt;
  return deadlines_.begin()->first;
}

std::optional<P2pAction> P2pResolver::poll_action() {
  if (next_action_ == actions_.size()) {
    actions_.clear();
    next_action_ = 0;
    return std::nullopt;
  }
  return actions_[next_action_++];
}

std::optional<LinkId> P2pResolver::established_link(const P2pKey& key) const {
  auto it = entries_.find(key);
  if (it == entries_.end()) return std::nullopt;
  if (it->second.state != KeyState::established && it->second.state != KeyState::checking) return std::nullopt;
  return it->second.link;
}

// ---------------------------------------------------------------------------------------------
// Decisions

void P2pResolver::deliver(const P2pKey& key, const PeerRequest& request) {
  entries_.emplace(key, Entry{.state = KeyState::delivered,
                              .link = request.link,
                              .peer_incarnation = request.incarnation,
                              .peer_cmid = request.attempt,
                              .peer_guid = request.guid});
  links_.emplace(request.link, key);
  ++stats_.delivered;
  emit({.kind = P2pAction::Kind::deliver_request, .key = key, .link = request.link});
}

void P2pResolver::bind(Entries::iterator it, const PeerRequest& request) {
  Entry& entry = it->second;
  assert(has_attempt(entry.state) && entry.held.link == 0);
  // The link the attempt held: its own request's (passive peer), or a replaced request's
  // (rule 6 while binding); none when lost. The driver closes it without a word to the app.
  const LinkId aborted = entry.link;
  if (aborted != 0) links_.erase(aborted);
  if (entry.state != KeyState::binding) ++stats_.collisions_lost;
  entry.state = KeyState::binding;
  entry.link = request.link;
  entry.collided = false;
  entry.peer_incarnation = request.incarnation;
  entry.peer_cmid = request.attempt;
  links_.emplace(request.link, it->first);
  emit({.kind = P2pAction::Kind::accept_into_attempt,
        .key = it->first,
        .link = request.link,
        .aborted_link = aborted,
        .attempt = entry.attempt});
}

void P2pResolver::reject(const P2pKey& key, LinkId link, P2pRejectReason reason) {
  ++(reason == P2pRejectReason::collision ? stats_.rejected_collision : stats_.rejected_duplicate);
  // Not tracked: the driver answers and closes the link; its close is then a no-op here.
  emit({.kind = P2pAction::Kind::reject_request, .key = key, .link = link, .reason = reason});
}

void P2pResolver::replace(Entries::iterator it, const PeerRequest& request) {
  Entry& entry = it->second;
  ++(request.incarnation != entry.peer_incarnation ? stats_.replaced_restarted : stats_.replaced_stale);
  if (entry.state == KeyState::binding) {
    // Our attempt was bound to the old request: it moves on to the new one (rule 3 passive
    // again), its CmId never having been ESTABLISHED on the old link.
    bind(it, request);
    return;
  }
  // Rule 6: tear the old link down, then the request proceeds normally: with no attempt for K
  // (there is none while a request or a connection holds K), that is rule 4.
  const P2pKey key = it->first;
  emit({.kind = P2pAction::Kind::teardown_link, .key = key, .link = entry.link});
  forget(it);
  deliver(key, request);
}

// The attempt's link is gone (peer rejected it, or it closed): it waits for the peer's request,
// and takes a held one at once — the peer is waiting on that request's reply.
void P2pResolver::attempt_lost_link(Entries::iterator it) {
  Entry& entry = it->second;
  links_.erase(entry.link);
  entry.link = 0;
  entry.state = KeyState::lost;
  entry.peer_cmid.reset();
  if (entry.held.link != 0) {
    const PeerRequest held = entry.held;
    links_.erase(held.link);
    entry.held = {};
    bind(it, held);  // rule 3: the lost attempt binds the peer's request
  }
}

// The attempt ended without a connection (rule 8, or the driver reported its end): forget it;
// a held request goes on as if it had just arrived (rule 4: no local attempt any more).
void P2pResolver::attempt_over(Entries::iterator it) {
  const PeerRequest held = it->second.held;
  const P2pKey key = it->first;
  if (held.link != 0) links_.erase(held.link);
  it->second.held = {};
  forget(it);
  if (held.link != 0) deliver(key, held);
}

void P2pResolver::forget(Entries::iterator it) {
  Entry& entry = it->second;
  if (entry.link != 0) links_.erase(entry.link);
  if (entry.held.link != 0) links_.erase(entry.held.link);
  if (has_attempt(entry.state)) {
    deadlines_.erase({entry.deadline, entry.attempt});
    attempts_.erase(entry.attempt);
  }
  entries_.erase(it);
}

void P2pResolver::expire(Time now) {
  while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
    const AttemptId attempt = deadlines_.begin()->second;
    auto at = attempts_.find(attempt);
    assert(at != attempts_.end());
    auto it = entries_.find(at->second);
    assert(it != entries_.end());
    // Rule 8: CONNECT_ERROR at the deadline; the driver closes the link the attempt held.
    ++stats_.attempts_timed_out;
    const bool checking = it->second.state == KeyState::checking;
    emit({.kind = P2pAction::Kind::attempt_failed,
          .key = it->first,
          .link = checking ? 0 : it->second.link,  // R5b: the checked connection is not the attempt's
          .attempt = attempt});
    if (checking) {
      end_check(it);
    } else {
      attempt_over(it);
    }
  }
}

}  // namespace peercm::core
