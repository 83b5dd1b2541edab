// The p2p collision resolver: one state per p2p key (design.md §3), one function per input.
// Every decision carries the rule of design.md §3 it implements.
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
  return state == KeyState::requesting || state == KeyState::lost || state == KeyState::binding;
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

  auto it = entries_.find(key);
  if (it == entries_.end()) {
    deliver(key, link, peer, peer_attempt);  // rule 4: no local attempt, no connection
    return;
  }
  Entry& entry = it->second;
  switch (entry.state) {
    case KeyState::requesting:
      if (local_wins(local_, entry.attempt, peer, peer_attempt)) {
        // Rule 3, active peer: reject R with "p2p collision", keep waiting for O's reply.
        entry.collided = true;
        reject(key, link, P2pRejectReason::collision);
      } else {
        // Rule 3, passive peer: abort O, accept R, bind O's CmId to R's connection.
        bind(it, link, peer, peer_attempt);
      }
      return;
    case KeyState::lost:
      // Rule 3: the peer rejected O as the active peer, so this is the winner's request; O's
      // request is gone, so only binding can end O with ESTABLISHED.
      bind(it, link, peer, peer_attempt);
      return;
    case KeyState::delivered:
    case KeyState::accepted:
    case KeyState::binding:
    case KeyState::established:
      // Rule 6: the same incarnation and an attempt no newer than the one we know on `link` is a
      // late duplicate (e.g. the request of the passive peer's aborted attempt); with the peer's
      // CmId unknown, every request of that incarnation is one.
      if (peer.incarnation == entry.peer_incarnation &&
          (!entry.peer_cmid || peer_attempt <= *entry.peer_cmid)) {
        reject(key, link, P2pRejectReason::duplicate);
        return;
      }
      // Rule 6: a new incarnation (the peer restarted), or a newer attempt of the same one (the
      // peer closed `link` and connects again): the old link is dead at the peer.
      replace(it, link, peer, peer_attempt);
      return;
  }
}

void P2pResolver::handle_attempt_rejected_by_cm(AttemptId attempt) {
  auto at = attempts_.find(attempt);
  if (at == attempts_.end()) return;
  auto it = entries_.find(at->second);
  assert(it != entries_.end());
  // Rule 3: our request lost the collision at the peer (or was a duplicate there): not an
  // error for the application; wait for the winner's request until the deadline.
  if (it->second.state == KeyState::requesting) attempt_lost_link(it->second);
}

void P2pResolver::handle_attempt_ended(AttemptId attempt) {
  auto at = attempts_.find(attempt);
  if (at == attempts_.end()) return;
  auto it = entries_.find(at->second);
  assert(it != entries_.end());
  forget(it);  // the driver reported the end and closes whatever link the attempt held
}

void P2pResolver::handle_established(const P2pKey& key, LinkId link, std::uint64_t peer_incarnation) {
  auto found = links_.find(link);
  if (found == links_.end() || !(found->second == key)) return;
  auto it = entries_.find(key);
  assert(it != entries_.end());
  Entry& entry = it->second;
  switch (entry.state) {
    case KeyState::requesting:
      // Our attempt's own request was accepted: the attempt ends ESTABLISHED. The peer's CmId
      // on the link is unknown here (see the other overload).
      if (entry.collided) ++stats_.collisions_won;
      deadlines_.erase({entry.deadline, entry.attempt});
      attempts_.erase(entry.attempt);
      entry.peer_cmid.reset();
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
    case KeyState::lost:
      return;
  }
  entry.state = KeyState::established;
  entry.peer_incarnation = peer_incarnation;
  entry.attempt = 0;
  entry.collided = false;
}

void P2pResolver::handle_established(const P2pKey& key, LinkId link, std::uint64_t peer_incarnation,
                                     AttemptId peer_cmid) {
  auto found = links_.find(link);
  if (found == links_.end() || !(found->second == key)) return;
  const KeyState before = entries_.find(key)->second.state;
  handle_established(key, link, peer_incarnation);
  // For our own attempt's link, the Reply told us the peer's CmId; for a request link we
  // already know it (the peer's attempt id from its request).
  if (before == KeyState::requesting) entries_.find(key)->second.peer_cmid = peer_cmid;
}

void P2pResolver::handle_request_accepted(LinkId link) {
  auto found = links_.find(link);
  if (found == links_.end()) return;
  Entry& entry = entries_.find(found->second)->second;
  if (entry.state == KeyState::delivered) entry.state = KeyState::accepted;
}

void P2pResolver::handle_request_rejected(LinkId link) {
  auto found = links_.find(link);
  if (found == links_.end()) return;
  auto it = entries_.find(found->second);
  if (it->second.state == KeyState::delivered || it->second.state == KeyState::accepted) forget(it);
}

void P2pResolver::handle_link_closed(LinkId link) {
  auto found = links_.find(link);
  if (found == links_.end()) return;  // already forgotten (rejected, aborted, torn down)
  auto it = entries_.find(found->second);
  assert(it != entries_.end() && it->second.link == link);
  switch (it->second.state) {
    case KeyState::requesting:
    case KeyState::binding:
      // Rule 8: the attempt lives on until its deadline; a (new) request of the peer can still
      // bind it — e.g. a restarted peer's (rule 6).
      attempt_lost_link(it->second);
      return;
    case KeyState::delivered:
    case KeyState::accepted:
    case KeyState::established:
      forget(it);  // no leak: nothing outlives its connection
      return;
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
  if (it == entries_.end() || it->second.state != KeyState::established) return std::nullopt;
  return it->second.link;
}

// ---------------------------------------------------------------------------------------------
// Decisions

void P2pResolver::deliver(const P2pKey& key, LinkId link, const NodeIdentity& peer,
                          AttemptId peer_attempt) {
  entries_.emplace(key, Entry{.state = KeyState::delivered,
                              .link = link,
                              .peer_incarnation = peer.incarnation,
                              .peer_cmid = peer_attempt});
  links_.emplace(link, key);
  ++stats_.delivered;
  emit({.kind = P2pAction::Kind::deliver_request, .key = key, .link = link});
}

void P2pResolver::bind(Entries::iterator it, LinkId link, const NodeIdentity& peer,
                       AttemptId peer_attempt) {
  Entry& entry = it->second;
  assert(has_attempt(entry.state));
  // The link the attempt held: its own request's (passive peer), or a replaced request's
  // (rule 6 while binding); none when lost. The driver closes it without a word to the app.
  const LinkId aborted = entry.link;
  if (aborted != 0) links_.erase(aborted);
  if (entry.state != KeyState::binding) ++stats_.collisions_lost;
  entry.state = KeyState::binding;
  entry.link = link;
  entry.collided = false;
  entry.peer_incarnation = peer.incarnation;
  entry.peer_cmid = peer_attempt;
  links_.emplace(link, it->first);
  emit({.kind = P2pAction::Kind::accept_into_attempt,
        .key = it->first,
        .link = link,
        .aborted_link = aborted,
        .attempt = entry.attempt});
}

void P2pResolver::reject(const P2pKey& key, LinkId link, P2pRejectReason reason) {
  ++(reason == P2pRejectReason::collision ? stats_.rejected_collision : stats_.rejected_duplicate);
  // Not tracked: the driver answers and closes the link; its close is then a no-op here.
  emit({.kind = P2pAction::Kind::reject_request, .key = key, .link = link, .reason = reason});
}

void P2pResolver::replace(Entries::iterator it, LinkId link, const NodeIdentity& peer,
                          AttemptId peer_attempt) {
  Entry& entry = it->second;
  ++(peer.incarnation != entry.peer_incarnation ? stats_.replaced_restarted : stats_.replaced_stale);
  if (entry.state == KeyState::binding) {
    // Our attempt was bound to the old request: it moves on to the new one (rule 3 passive
    // again), its CmId never having been ESTABLISHED on the old link.
    bind(it, link, peer, peer_attempt);
    return;
  }
  // Rule 6: tear the old link down, then the request proceeds normally: with no attempt for K
  // (there is none while a request or a connection holds K), that is rule 4.
  const P2pKey key = it->first;
  emit({.kind = P2pAction::Kind::teardown_link, .key = key, .link = entry.link});
  forget(it);
  deliver(key, link, peer, peer_attempt);
}

void P2pResolver::attempt_lost_link(Entry& entry) {
  links_.erase(entry.link);
  entry.link = 0;
  entry.state = KeyState::lost;
  entry.peer_cmid.reset();
}

void P2pResolver::forget(Entries::iterator it) {
  Entry& entry = it->second;
  if (entry.link != 0) links_.erase(entry.link);
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
    emit({.kind = P2pAction::Kind::attempt_failed,
          .key = it->first,
          .link = it->second.link,
          .attempt = attempt});
    forget(it);
  }
}

}  // namespace peercm::core
