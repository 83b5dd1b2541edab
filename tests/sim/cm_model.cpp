// The CM driver model: what a connection manager does around the P2pResolver. Network messages
// and application calls become resolver inputs; each P2pAction becomes what a CM would do with
// the connection and the CmId (apply()). The application is modelled too: it answers
// CONNECT_REQUESTs, posts work requests while connecting, closes and reconnects.
#include <algorithm>
#include <chrono>
#include <system_error>

#include "p2p_model.hpp"

namespace peercm::sim {

using namespace std::chrono_literals;
using Kind = P2pAction::Kind;

namespace {

const char* why_name(RejectWhy why) {
  switch (why) {
    case RejectWhy::collision: return "collision";
    case RejectWhy::duplicate: return "duplicate";
    case RejectWhy::application: return "application";
  }
  return "?";
}

const char* outcome_name(Outcome outcome) {
  switch (outcome) {
    case Outcome::pending: return "pending";
    case Outcome::established: return "ESTABLISHED";
    case Outcome::rejected_by_app: return "REJECTED";
    case Outcome::unreachable: return "UNREACHABLE";
    case Outcome::timed_out: return "CONNECT_ERROR";
    case Outcome::crashed: return "crashed";
  }
  return "?";
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Network inputs

void World::on_message(const Event& event) {
  if (event.message.kind == MessageKind::request) {
    on_request(event);
    return;
  }
  Link& k = link(event.link);
  if (!k.open[event.side]) return;  // that end is closed (or its node crashed): dropped
  const int index = k.node[event.side];
  Node& node = nodes_[static_cast<std::size_t>(index)];
  switch (event.message.kind) {
    case MessageKind::accept: on_accept(node, event.link, event.message); break;
    case MessageKind::reject: on_reject(node, event.link, event.message); break;
    case MessageKind::rtr: on_rtr(node, event.link); break;
    case MessageKind::close: on_close(node, event.link, event.side); break;
    case MessageKind::request: break;
  }
  drain(index);
}

void World::on_request(const Event& event) {
  Link& k = link(event.link);
  const int index = k.node[1];
  Node& node = nodes_[static_cast<std::size_t>(index)];
  const Message& request = event.message;
  if (!node.up) {
    // Nobody listens at the address: the initiator learns it after a round trip.
    trace("L{}: request from n{} finds n{} down", event.link, k.node[0], index);
    schedule({.at = now_ + delay(), .kind = EventKind::unreachable, .node = k.node[0],
              .link = event.link, .side = 0});
    return;
  }
  k.epoch[1] = node.epoch;
  k.open[1] = true;
  k.initiator = request.from;
  // Rule 2: the key of a request is (TCP source address, advertised listening port, tag).
  const P2pKey key{.address = address_of(k.node[0]), .port = request.listen_port, .tag = request.tag};
  trace("{} <- L{} request from n{} (guid {:#x} inc {:#x} attempt c{} tag {})", name(index),
        event.link, k.node[0], request.from.guid, request.from.incarnation, request.cmid, request.tag);
  node.resolver->handle_request(key, event.link, request.from, request.cmid, now_);
  drain(index);
}

void World::on_accept(Node& node, LinkId id, const Message& message) {
  const int index = static_cast<int>(&node - nodes_.data());
  CmId* cmid = find_cmid(index, link(id).cmid[0]);
  if (cmid == nullptr || !cmid->active || cmid->state != CmId::State::connecting || cmid->link != id) {
    violation(fmt::format("{}: accept on L{} finds no attempt waiting on it", name(index), id));
    return;
  }
  trace("{} <- L{} accept (peer CmId c{}): c{} ESTABLISHED", name(index), id, message.cmid, cmid->number);
  node.resolver->handle_established(key_of(cmid->peer, cmid->tag), id, message.from.incarnation,
                                    message.cmid);
  link(id).established[0] = true;
  send(id, 0, Message{.kind = MessageKind::rtr});  // rule 9: the RTR goes first
  establish(index, *cmid);
}

void World::on_reject(Node& node, LinkId id, const Message& message) {
  const int index = static_cast<int>(&node - nodes_.data());
  CmId* cmid = find_cmid(index, link(id).cmid[0]);
  if (cmid == nullptr || !cmid->active || cmid->link != id) {
    violation(fmt::format("{}: reject on L{} finds no attempt waiting on it", name(index), id));
    return;
  }
  if (message.why == RejectWhy::application) {
    if (!link(id).app_rejected) violation(fmt::format("L{}: application reject nobody made", id));
    trace("{} <- L{} reject (application): c{} REJECTED", name(index), id, cmid->number);
    node.resolver->handle_attempt_ended(cmid->number);
    close_end(id, 0, false);
    end_attempt(index, *cmid, Outcome::rejected_by_app);
    return;
  }
  // Rule 3: a CM-level reject is never the application's business; the attempt waits.
  trace("{} <- L{} reject ({}): c{} waits for the peer's request", name(index), id,
        why_name(message.why), cmid->number);
  node.resolver->handle_attempt_rejected_by_cm(cmid->number);
  cmid->link = 0;
  close_end(id, 0, false);
}

void World::on_rtr(Node& node, LinkId id) {
  const int index = static_cast<int>(&node - nodes_.data());
  CmId* cmid = find_cmid(index, link(id).cmid[1]);
  if (cmid != nullptr && cmid->link == id && cmid->state == CmId::State::established) {
    trace("{} <- L{} RTR", name(index), id);  // established on its Reply already
    return;
  }
  const bool waiting = cmid != nullptr && cmid->link == id &&
                       (cmid->state == CmId::State::accepted ||
                        (cmid->active && cmid->state == CmId::State::connecting));
  if (!waiting) {
    violation(fmt::format("{}: RTR on L{} finds no accepted CmId", name(index), id));
    return;
  }
  trace("{} <- L{} RTR: c{} ESTABLISHED", name(index), id, cmid->number);
  responder_established(index, *cmid);
}

// The responder's side of `cmid.link` is ESTABLISHED (on its Reply or on the RTR).
void World::responder_established(int index, CmId& cmid) {
  nodes_[static_cast<std::size_t>(index)].resolver->handle_established(
      key_of(cmid.peer, cmid.tag), cmid.link, cmid.peer_incarnation);
  link(cmid.link).established[1] = true;
  establish(index, cmid);
}

// An attempt lost the connection it was bound to; if the peer's application had closed it, the
// attempt is excused from the per-attempt liveness check.
void World::note_binding_lost(int index, const CmId& cmid, LinkId id) {
  const Link& k = link(id);
  const int peer_side = k.node[0] == index ? 1 : 0;
  if (cmid.active && k.app_closed[peer_side]) attempts_[cmid.attempt].peer_app_closed_binding = true;
}

void World::on_close(Node& node, LinkId id, int side) {
  const int index = static_cast<int>(&node - nodes_.data());
  const AttemptId number = link(id).cmid[side];
  close_end(id, side, false);
  CmId* cmid = find_cmid(index, number);
  if (cmid == nullptr || cmid->link != id) {
    trace("{} <- L{} close", name(index), id);
    return;
  }
  if (cmid->state == CmId::State::established) {
    disconnected(index, number, "peer closed");
  } else if (cmid->active) {
    // Rule 8: the attempt lives on until its deadline; a peer's request may still bind it.
    trace("{} <- L{} close: attempt c{} waits without a link", name(index), id, number);
    note_binding_lost(index, *cmid, id);
    cmid->link = 0;
  } else {
    trace("{} <- L{} close: c{} (not yet established) destroyed", name(index), id, number);
    node.cmids.erase(number);
  }
}

void World::on_unreachable(const Event& event) {
  Link& k = link(event.link);
  if (!k.open[0]) return;
  const int index = k.node[0];
  CmId* cmid = find_cmid(index, k.cmid[0]);
  if (cmid != nullptr && cmid->link == event.link) {
    // The attempt's end first, then its link's close (which would otherwise look like a peer
    // that went away while the attempt lives on).
    trace("{}: L{} unreachable: c{} UNREACHABLE", name(index), event.link, cmid->number);
    nodes_[static_cast<std::size_t>(index)].resolver->handle_attempt_ended(cmid->number);
    end_attempt(index, *cmid, Outcome::unreachable);
  }
  close_end(event.link, 0, false);
  drain(index);
}

void World::on_timer(const Event& event) {
  Node& node = nodes_[static_cast<std::size_t>(event.node)];
  if (!node.up || node.epoch != event.epoch) return;
  if (node.timer == event.at) node.timer.reset();
  node.resolver->handle_timeout(now_);
  drain(event.node);
}

// ---------------------------------------------------------------------------------------------
// Resolver outputs: each action, and what the CM does with it

void World::drain(int index) {
  Node& node = nodes_[static_cast<std::size_t>(index)];
  if (!node.up) return;
  while (auto action = node.resolver->poll_action()) {
    apply(index, *action);
    if (!result_.ok) return;
  }
  arm_timer(index);
}

void World::apply(int index, const P2pAction& action) {
  Node& node = nodes_[static_cast<std::size_t>(index)];
  switch (action.kind) {
    case Kind::deliver_request: {
      // Rule 4: CONNECT_REQUEST on the listener: a new CmId for the request's connection.
      Link& k = link(action.link);
      const AttemptId number = node.next_cmid++;
      node.cmids[number] = CmId{.number = number,
                                .active = false,
                                .state = CmId::State::awaiting_app,
                                .peer = k.node[0],
                                .tag = k.tag,
                                .link = action.link,
                                .peer_incarnation = k.initiator.incarnation};
      k.cmid[1] = number;
      const bool accept = phase_ != Phase::chaos || !rng_.percent(scenario_.app_reject_percent);
      trace("{}: CONNECT_REQUEST on L{} -> c{}; the app will {}", name(index), action.link, number,
            accept ? "accept" : "reject");
      schedule({.at = now_ + delay(), .kind = EventKind::app_answer, .node = index,
                .epoch = node.epoch, .cmid = number, .accept = accept});
      return;
    }
    case Kind::reject_request:
      // Rules 3/6: MPA Reject with the reason, then the connection closes.
      trace("{}: reject L{} ({})", name(index), action.link,
            action.reason == core::P2pRejectReason::collision ? "collision" : "duplicate");
      send(action.link, 1,
           Message{.kind = MessageKind::reject,
                   .why = action.reason == core::P2pRejectReason::collision ? RejectWhy::collision
                                                                           : RejectWhy::duplicate});
      close_end(action.link, 1, true);
      return;
    case Kind::accept_into_attempt: {
      // Rule 3 passive: the attempt's CmId (and its QP with the posted work requests) moves to
      // the request's connection, which is accepted on its behalf; its old link closes quietly.
      CmId* cmid = find_cmid(index, action.attempt);
      if (cmid == nullptr || !cmid->active || cmid->state != CmId::State::connecting) {
        violation(fmt::format("{}: accept_into_attempt for c{}, which is not connecting", name(index),
                              action.attempt));
        return;
      }
      if (cmid->link != action.aborted_link) {
        violation(fmt::format("{}: accept_into_attempt aborts L{} but c{} holds L{}", name(index),
                              action.aborted_link, cmid->number, cmid->link));
        return;
      }
      trace("{}: accept L{} into c{} (aborting L{})", name(index), action.link, cmid->number,
            action.aborted_link);
      if (action.aborted_link != 0) {
        note_binding_lost(index, *cmid, action.aborted_link);
        close_end(action.aborted_link, side_of(index, action.aborted_link), true);
      }
      Link& k = link(action.link);
      cmid->link = action.link;
      cmid->peer_incarnation = k.initiator.incarnation;
      k.cmid[1] = cmid->number;
      send(action.link, 1, Message{.kind = MessageKind::accept, .from = node.id, .cmid = cmid->number});
      if (scenario_.responder_established_on_reply) responder_established(index, *cmid);
      return;
    }
    case Kind::teardown_link: {
      // Rule 6: the peer restarted (or connected again): its old connection goes.
      const int side = side_of(index, action.link);
      const AttemptId number = link(action.link).cmid[side];
      close_end(action.link, side, true);
      CmId* cmid = find_cmid(index, number);
      if (cmid == nullptr || cmid->link != action.link) return;
      if (cmid->active && cmid->state != CmId::State::established) {
        violation(fmt::format("{}: teardown of L{}, which attempt c{} is waiting on", name(index),
                              action.link, number));
      } else if (cmid->state == CmId::State::established) {
        disconnected(index, number, "replaced");
      } else {
        trace("{}: teardown L{}: c{} (not yet established) destroyed", name(index), action.link, number);
        node.cmids.erase(number);
      }
      return;
    }
    case Kind::attempt_failed: {
      // Rule 8: CONNECT_ERROR at the deadline; the posted work requests are flushed.
      CmId* cmid = find_cmid(index, action.attempt);
      if (cmid == nullptr || !cmid->active || cmid->state != CmId::State::connecting ||
          cmid->link != action.link) {
        violation(fmt::format("{}: attempt_failed for c{} on L{} does not match the CmId", name(index),
                              action.attempt, action.link));
        return;
      }
      if (action.link != 0) close_end(action.link, side_of(index, action.link), true);
      end_attempt(index, *cmid, Outcome::timed_out);
      return;
    }
  }
}

void World::arm_timer(int index) {
  Node& node = nodes_[static_cast<std::size_t>(index)];
  const auto deadline = node.resolver->next_deadline();
  if (!deadline || (node.timer && *node.timer <= *deadline)) return;
  node.timer = std::max(*deadline, now_);
  schedule({.at = *node.timer, .kind = EventKind::timer, .node = index, .epoch = node.epoch});
}

// ---------------------------------------------------------------------------------------------
// The application

void World::app_connect(int index, int peer, std::uint32_t tag) {
  Node& node = nodes_[static_cast<std::size_t>(index)];
  if (!node.up) return;
  const LinkId id = open_link(index, peer, tag);
  const AttemptId number = node.next_cmid++;
  const Time deadline = now_ + scenario_.timeout;
  const auto status = node.resolver->connect(key_of(peer, tag), number, id, deadline);
  if (!status) {
    if (status.error() == std::errc::connection_already_in_progress &&
        take_unseen_request(index, peer, tag, number, id, deadline))
      return;
    // Rule 5: EISCONN / EALREADY — the connection exists or is on its way.
    trace("{}: connect c{} to n{} tag {}: {}", name(index), number, peer, tag,
          std::make_error_code(status.error()).message());
    return;
  }
  trace("{}: connect c{} to n{} tag {} on L{}", name(index), number, peer, tag, id);
  start_attempt(index, peer, tag, number, id, deadline);
  send_request(index, id, number, tag);
  drain(index);
}

void World::send_request(int index, LinkId id, AttemptId number, std::uint32_t tag) {
  Link& k = link(id);
  k.open[0] = true;
  k.cmid[0] = number;
  send(id, 0, Message{.kind = MessageKind::request, .from = nodes_[static_cast<std::size_t>(index)].id,
                      .cmid = number, .tag = tag, .listen_port = port_of(index)});
}

CmId& World::start_attempt(int index, int peer, std::uint32_t tag, AttemptId number, LinkId id, Time deadline) {
  Node& node = nodes_[static_cast<std::size_t>(index)];
  CmId& cmid = node.cmids[number] = CmId{.number = number, .active = true, .peer = peer, .tag = tag,
                                         .link = id, .attempt = attempts_.size()};
  attempts_.push_back({.node = index, .peer = peer, .tag = tag, .cmid = number, .start = now_,
                       .deadline = deadline, .final_round = phase_ == Phase::final_round});
  // Rule 7: work requests posted while the collision is being resolved.
  for (int i = rng_.between(0, 3); i > 0; --i) cmid.work_requests.push_back(post_new_work_request());
  for (int i = rng_.between(0, 2); i > 0; --i) {
    schedule({.at = now_ + 2 * delay(), .kind = EventKind::post_wr, .node = index,
              .epoch = node.epoch, .cmid = number});
  }
  return cmid;
}

// Rule 5 refined (docs/p2p.md): the request the application has not answered is retracted from
// it and meets the new attempt as a colliding request (rule 3) before the attempt's own request
// goes out: bound to it when it wins, held when the attempt wins (whose request then goes out).
bool World::take_unseen_request(int index, int peer, std::uint32_t tag, AttemptId number, LinkId id,
                                Time deadline) {
  Node& node = nodes_[static_cast<std::size_t>(index)];
  const auto unseen = std::find_if(node.cmids.begin(), node.cmids.end(), [&](const auto& entry) {
    const CmId& c = entry.second;
    return !c.active && c.state == CmId::State::awaiting_app && c.peer == peer && c.tag == tag;
  });
  if (unseen == node.cmids.end() || !rng_.percent(scenario_.take_unseen_percent)) return false;
  const LinkId request = unseen->second.link;
  const Link& k = link(request);
  node.resolver->handle_request_rejected(request);  // the CM takes it back from the listener
  const auto status = node.resolver->connect(key_of(peer, tag), number, id, deadline);
  if (!status) {
    violation(fmt::format("{}: connect c{} after taking back the request on L{}: {}", name(index), number,
                          request, std::make_error_code(status.error()).message()));
    return true;
  }
  trace("{}: connect c{} to n{} tag {} on L{} takes back the unanswered request on L{} (c{})", name(index),
        number, peer, tag, id, request, unseen->first);
  node.cmids.erase(unseen);
  ++result_.stats.taken_back;
  start_attempt(index, peer, tag, number, id, deadline);
  node.resolver->handle_request(key_of(peer, tag), request, k.initiator, k.cmid[0], now_);
  drain(index);
  const CmId* cmid = find_cmid(index, number);
  if (cmid != nullptr && cmid->link == id) send_request(index, id, number, tag);  // not bound: ours goes out
  return true;
}

void World::app_answer(const Event& event) {
  Node& node = nodes_[static_cast<std::size_t>(event.node)];
  if (!node.up || node.epoch != event.epoch) return;
  CmId* cmid = find_cmid(event.node, event.cmid);
  if (cmid == nullptr || cmid->state != CmId::State::awaiting_app) return;  // torn down meanwhile
  const LinkId id = cmid->link;
  if (event.accept) {
    trace("{}: app accepts c{} on L{}", name(event.node), cmid->number, id);
    cmid->state = CmId::State::accepted;
    send(id, 1, Message{.kind = MessageKind::accept, .from = node.id, .cmid = cmid->number});
    node.resolver->handle_request_accepted(id);
    if (scenario_.responder_established_on_reply) responder_established(event.node, *cmid);
  } else {
    trace("{}: app rejects c{} on L{}", name(event.node), cmid->number, id);
    link(id).app_rejected = true;
    send(id, 1, Message{.kind = MessageKind::reject, .why = RejectWhy::application});
    node.resolver->handle_request_rejected(id);
    node.cmids.erase(event.cmid);
    close_end(id, 1, true);
  }
  drain(event.node);
}

void World::app_close(const Event& event) {
  Node& node = nodes_[static_cast<std::size_t>(event.node)];
  if (!node.up || node.epoch != event.epoch) return;
  CmId* cmid = find_cmid(event.node, event.cmid);
  if (cmid == nullptr || cmid->state != CmId::State::established) return;
  const int peer = cmid->peer;
  const std::uint32_t tag = cmid->tag;
  trace("{}: app closes c{} on L{}", name(event.node), cmid->number, cmid->link);
  const int side = side_of(event.node, cmid->link);
  link(cmid->link).app_closed[side] = true;
  close_end(cmid->link, side, true);
  node.cmids.erase(event.cmid);
  drain(event.node);
  // ... and may connect again at once: its new request races the close to the peer.
  if (phase_ == Phase::chaos && rng_.percent(scenario_.reconnect_percent)) app_connect(event.node, peer, tag);
}

void World::post_work_request(const Event& event) {
  Node& node = nodes_[static_cast<std::size_t>(event.node)];
  if (!node.up || node.epoch != event.epoch) return;
  CmId* cmid = find_cmid(event.node, event.cmid);
  if (cmid == nullptr) return;  // the CmId is gone: nothing was posted
  const std::uint32_t wr = post_new_work_request();
  if (cmid->state == CmId::State::established) {
    complete_work_request(wr);  // runs on the connection at once
  } else {
    cmid->work_requests.push_back(wr);
  }
}

void World::crash(int index, Duration downtime) {
  Node& node = nodes_[static_cast<std::size_t>(index)];
  if (!node.up) return;
  trace("{}: CRASH (down for {}ms)", name(index),
        std::chrono::duration_cast<std::chrono::milliseconds>(downtime).count());
  ++result_.stats.crashes;
  // Every connection vanishes with the process; the peers see a close after a delay.
  for (LinkId id = 1; id <= links_.size(); ++id) {
    Link& k = link(id);
    for (int side = 0; side < 2; ++side) {
      if (k.node[side] == index && k.epoch[side] == node.epoch && k.open[side]) {
        k.open[side] = false;
        k.established[side] = false;
        k.cmid[side] = 0;
        send(id, side, Message{.kind = MessageKind::close});
      }
    }
  }
  for (auto& [number, cmid] : node.cmids) {
    for (std::uint32_t wr : cmid.work_requests) work_request_lost_[wr] = true;
    if (cmid.active && cmid.state == CmId::State::connecting) {
      attempts_[cmid.attempt].outcome = Outcome::crashed;
      attempts_[cmid.attempt].end = now_;
    }
  }
  node.cmids.clear();
  // Keep the dead resolver's statistics in the totals.
  const auto& stats = node.resolver->stats();
  result_.stats.collisions += stats.collisions_lost;
  result_.stats.rejected_duplicate += stats.rejected_duplicate;
  result_.stats.replaced += stats.replaced_restarted + stats.replaced_stale;
  result_.stats.timed_out += stats.attempts_timed_out;
  node.resolver.reset();
  node.up = false;
  node.down.emplace_back(now_, now_ + downtime);
  schedule({.at = now_ + downtime, .kind = EventKind::restart, .node = index, .epoch = node.epoch});
}

void World::restart(int index, std::uint32_t epoch) {
  Node& node = nodes_[static_cast<std::size_t>(index)];
  if (node.up || node.epoch != epoch) return;
  ++node.epoch;
  node.id.incarnation = (rng_.next() << 16) | (++incarnation_counter_ & 0xFFFF);
  node.resolver.emplace(node.id);
  node.next_cmid = 1;  // a new process numbers its CmIds from 1 again
  node.timer.reset();
  node.up = true;
  trace("{}: RESTART with incarnation {:#x}", name(index), node.id.incarnation);
}

// ---------------------------------------------------------------------------------------------
// CmId lifecycle

CmId* World::find_cmid(int index, AttemptId number) {
  auto& cmids = nodes_[static_cast<std::size_t>(index)].cmids;
  auto it = cmids.find(number);
  return it == cmids.end() ? nullptr : &it->second;
}

void World::establish(int index, CmId& cmid) {
  cmid.state = CmId::State::established;
  if (cmid.active) {
    attempts_[cmid.attempt].outcome = Outcome::established;
    attempts_[cmid.attempt].end = now_;
  }
  // Rule 7: what was posted while resolving runs on the winning connection, once.
  for (std::uint32_t wr : cmid.work_requests) complete_work_request(wr);
  cmid.work_requests.clear();
  check_established(index, cmid);
  if (phase_ == Phase::chaos && rng_.percent(scenario_.close_percent)) {
    // Often at once: the close (and a reconnect) then races everything still in flight.
    const int max_ms = static_cast<int>(scenario_.timeout / 2ms);
    const Duration after = rng_.percent(30) ? Duration::zero() : rng_.between(0, max_ms) * 1ms;
    schedule({.at = now_ + after,
              .kind = EventKind::app_close, .node = index,
              .epoch = nodes_[static_cast<std::size_t>(index)].epoch, .cmid = cmid.number});
  }
}

void World::end_attempt(int index, CmId& cmid, Outcome outcome) {
  AttemptRecord& record = attempts_[cmid.attempt];
  record.outcome = outcome;
  record.end = now_;
  trace("{}: attempt c{} ends {} ({} work request(s) flushed)", name(index), cmid.number,
        outcome_name(outcome), cmid.work_requests.size());
  // Rule 8: within the connect timeout, whatever the outcome.
  if (now_ > record.deadline) {
    violation(fmt::format("{}: attempt c{} ended {} after its deadline", name(index), cmid.number,
                          outcome_name(outcome)));
  }
  for (std::uint32_t wr : cmid.work_requests) complete_work_request(wr);  // flush errors
  nodes_[static_cast<std::size_t>(index)].cmids.erase(cmid.number);
}

void World::disconnected(int index, AttemptId number, const char* why) {
  CmId* cmid = find_cmid(index, number);
  if (cmid == nullptr) {
    violation(fmt::format("{}: c{} disconnected, but it does not exist", name(index), number));
    return;
  }
  const int peer = cmid->peer;
  const std::uint32_t tag = cmid->tag;
  trace("{}: c{} DISCONNECTED ({})", name(index), number, why);
  nodes_[static_cast<std::size_t>(index)].cmids.erase(number);
  if (phase_ == Phase::chaos && rng_.percent(scenario_.reconnect_percent / 2)) {
    schedule({.at = now_ + delay(), .kind = EventKind::app_connect, .node = index, .peer = peer, .tag = tag});
  }
}

std::uint32_t World::post_new_work_request() {
  work_request_done_.push_back(0);
  work_request_lost_.push_back(false);
  return static_cast<std::uint32_t>(work_request_done_.size() - 1);
}

void World::complete_work_request(std::uint32_t id) {
  // Rule 7 / integrity: exactly once, success or flush.
  if (++work_request_done_[id] > 1) violation(fmt::format("work request {} completed twice", id));
}

}  // namespace peercm::sim
