// The four properties of design.md §3 as executable checks: Uniqueness (at every ESTABLISHED
// and at quiescence), Liveness (per attempt and per pair), Integrity (every work request
// completed exactly once) and No leak (nothing tracked once every connection is gone).
#include <algorithm>
#include <chrono>

#include "p2p_model.hpp"

namespace peercm::sim {

namespace {

double millis(Time t) { return static_cast<double>(t.time_since_epoch().count()) / 1e6; }

}  // namespace

// Uniqueness, checked the moment a CmId becomes ESTABLISHED.
void World::check_established(int index, const CmId& cmid) {
  const Node& node = nodes_[static_cast<std::size_t>(index)];
  // The model and the resolver agree on which link is the connection. (None at all is fine: the
  // resolver may have replaced the link at once — rule 6 — and its teardown is next in line.)
  const auto established = node.resolver->established_link(key_of(cmid.peer, cmid.tag));
  if (established && *established != cmid.link) {
    violation(fmt::format("{}: c{} ESTABLISHED on L{} but the resolver's connection to n{} tag {} is L{}",
                          name(index), cmid.number, cmid.link, cmid.peer, cmid.tag,
                          established.value_or(0)));
    return;
  }
  for (const auto& [number, other] : node.cmids) {
    if (number != cmid.number && other.state == CmId::State::established &&
        other.peer == cmid.peer && other.tag == cmid.tag) {
      violation(fmt::format("{}: two ESTABLISHED CmIds (c{} on L{}, c{} on L{}) to n{} tag {}",
                            name(index), number, other.link, cmid.number, cmid.link, cmid.peer,
                            cmid.tag));
      return;
    }
  }
  const Link& k = link(cmid.link);
  if (k.established[0] && k.established[1] && fully_established(index, cmid.peer, cmid.tag) > 1) {
    violation(fmt::format("two connections ESTABLISHED at both ends between n{} and n{} tag {}",
                          index, cmid.peer, cmid.tag));
  }
}

int World::fully_established(int a, int b, std::uint32_t tag) const {
  int count = 0;
  for (const Link& k : links_) {
    const bool pair = (k.node[0] == a && k.node[1] == b) || (k.node[0] == b && k.node[1] == a);
    if (pair && k.tag == tag && k.open[0] && k.open[1] && k.established[0] && k.established[1]) ++count;
  }
  return count;
}

// Liveness per attempt: between nodes that stayed up (and had not crashed within one connect
// timeout before, which could leave a doomed attempt of the old incarnation to collide with),
// every attempt ends ESTABLISHED or REJECTED by the application — never on its deadline —
// unless the peer's application closed the very connection the attempt was bound to.
bool World::disturbed(const AttemptRecord& attempt) const {
  const Time from = attempt.start - scenario_.timeout - 2 * scenario_.max_delay;
  for (int index : {attempt.node, attempt.peer}) {
    for (const auto& [crash, restart] : nodes_[static_cast<std::size_t>(index)].down) {
      if (crash <= attempt.end && restart >= from) return true;
    }
  }
  return false;
}

void World::check_attempt_liveness() {
  for (const AttemptRecord& attempt : attempts_) {
    const bool failed = attempt.outcome == Outcome::timed_out || attempt.outcome == Outcome::unreachable ||
                        attempt.outcome == Outcome::pending;
    if (failed && !disturbed(attempt) && !attempt.peer_app_closed_binding) {
      violation(fmt::format("n{}'s attempt c{} to n{} tag {} (started at {:.3f}ms) ended {} at {:.3f}ms "
                            "though both nodes stayed up",
                            attempt.node, attempt.cmid, attempt.peer, attempt.tag, millis(attempt.start),
                            attempt.outcome == Outcome::timed_out ? "CONNECT_ERROR (deadline)"
                            : attempt.outcome == Outcome::unreachable ? "UNREACHABLE"
                                                                     : "never",
                            millis(attempt.end)));
      return;
    }
  }
}

// At quiescence (no message in flight, no timer armed): every attempt ended, every connection is
// established at both ends on the same link, and each resolver tracks exactly those.
void World::check_quiescent(const char* when) {
  for (LinkId id = 1; id <= links_.size(); ++id) {
    const Link& k = links_[id - 1];
    if ((k.open[0] || k.open[1]) && !(k.open[0] && k.open[1] && k.established[0] && k.established[1])) {
      violation(fmt::format("{}: L{} (n{} -> n{} tag {}) is open but not established at both ends "
                            "(open {}/{}, established {}/{})",
                            when, id, k.node[0], k.node[1], k.tag, k.open[0], k.open[1],
                            k.established[0], k.established[1]));
      return;
    }
  }
  for (std::size_t i = 0; i < nodes_.size(); ++i) {
    const int index = static_cast<int>(i);
    const Node& node = nodes_[i];
    if (!node.up) {
      violation(fmt::format("{}: {} is still down", when, name(index)));
      return;
    }
    if (node.resolver->tracked_attempts() != 0 || node.resolver->next_deadline()) {
      violation(fmt::format("{}: {}'s resolver still tracks {} attempt(s)", when, name(index),
                            node.resolver->tracked_attempts()));
      return;
    }
    if (node.resolver->tracked_links() != node.cmids.size()) {
      violation(fmt::format("{}: {}'s resolver tracks {} link(s) for {} CmId(s)", when, name(index),
                            node.resolver->tracked_links(), node.cmids.size()));
      return;
    }
    for (const auto& [number, cmid] : node.cmids) {
      if (cmid.state != CmId::State::established) {
        violation(fmt::format("{}: {}'s c{} is not established", when, name(index), number));
        return;
      }
      const Link& k = links_[cmid.link - 1];
      const int side = k.node[0] == index ? 0 : 1;
      const Node& peer = nodes_[static_cast<std::size_t>(cmid.peer)];
      const auto theirs = peer.cmids.find(k.cmid[1 - side]);
      // Both nodes agree on which link is the connection.
      if (k.node[1 - side] != cmid.peer || theirs == peer.cmids.end() ||
          theirs->second.state != CmId::State::established || theirs->second.link != cmid.link ||
          theirs->second.peer != index || theirs->second.tag != cmid.tag) {
        violation(fmt::format("{}: {}'s c{} on L{} has no matching ESTABLISHED CmId at n{}", when,
                              name(index), number, cmid.link, cmid.peer));
        return;
      }
      if (node.resolver->established_link(key_of(cmid.peer, cmid.tag)) != std::optional<LinkId>(cmid.link)) {
        violation(fmt::format("{}: {}'s resolver disagrees about L{}", when, name(index), cmid.link));
        return;
      }
    }
  }
}

// Liveness per pair: with every node up and no fault, each pair that asked ends with exactly
// one connection, and every attempt of the round ends ESTABLISHED.
void World::check_final_round() {
  for (const auto& [a, b, tag] : asked_) {
    const int count = fully_established(a, b, tag);
    if (count != 1) {
      violation(fmt::format("final round: n{} and n{} asked for tag {} and ended with {} connection(s)",
                            a, b, tag, count));
      return;
    }
  }
  for (const AttemptRecord& attempt : attempts_) {
    if (attempt.final_round && attempt.outcome != Outcome::established) {
      violation(fmt::format("final round: n{}'s attempt c{} to n{} tag {} did not end ESTABLISHED",
                            attempt.node, attempt.cmid, attempt.peer, attempt.tag));
      return;
    }
  }
}

// No leak: once the applications closed everything, nothing is tracked and no timer is armed.
void World::check_no_leak() {
  for (std::size_t i = 0; i < nodes_.size(); ++i) {
    const Node& node = nodes_[i];
    const auto& resolver = *node.resolver;
    if (!node.cmids.empty() || resolver.tracked_links() != 0 || resolver.tracked_attempts() != 0 ||
        resolver.next_deadline()) {
      violation(fmt::format("after teardown: {} keeps {} CmId(s); its resolver tracks {} link(s), {} "
                            "attempt(s){}",
                            name(static_cast<int>(i)), node.cmids.size(), resolver.tracked_links(),
                            resolver.tracked_attempts(), resolver.next_deadline() ? " and a deadline" : ""));
      return;
    }
  }
  for (LinkId id = 1; id <= links_.size(); ++id) {
    if (links_[id - 1].open[0] || links_[id - 1].open[1]) {
      violation(fmt::format("after teardown: L{} is still open", id));
      return;
    }
  }
}

// Integrity: every work request posted completed exactly once (ran on the winning connection or
// was flushed); only a crashed process's own work requests die with it.
void World::check_integrity() {
  for (std::size_t wr = 0; wr < work_request_done_.size(); ++wr) {
    if (!work_request_lost_[wr] && work_request_done_[wr] != 1) {
      violation(fmt::format("work request {} completed {} time(s)", wr, work_request_done_[wr]));
      return;
    }
  }
}

}  // namespace peercm::sim
