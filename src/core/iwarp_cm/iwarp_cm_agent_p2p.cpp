// The iWARP binding of the p2p resolver (docs/p2p.md, Rules): each p2p stream is a resolver
// link, and each P2pAction becomes what MPA does with that stream and the application's
// attempt. The decisions are the resolver's; only how they go on the wire is iWARP's: the
// losing request is answered with an MPA Reject carrying the CM reject, and its stream closes.
#include <array>
#include <cerrno>

#include "core/iwarp_cm/iwarp_cm_agent.hpp"
#include "wire/cm_header.hpp"

namespace peercm::core::iwarp {

// R4: no local attempt for the key: the listener's application decides.
void IwarpCmAgent::deliver_request(const P2pAction& action, Time /*now*/) {
  Stream* s = find_stream(action.link);
  if (s == nullptr || s->phase != StreamPhase::parked) return;
  Id* listener = find_id(s->listener);
  if (listener == nullptr || listener->state != IdState::listening) {
    abandon(action.link, /*graceful=*/false);
    resolver_.handle_link_closed(action.link);
    return;
  }
  ++stats_.delivered_requests;
  auto header = wire::decode_cm_header(s->responder->request().peer_private_data);
  deliver(action.link, s->listener,
          header ? header->application_data : std::span<const std::uint8_t>{});
}

// R3 (active peer) and R6: the losing or duplicate request is answered by the CM, never by the
// application: an MPA Reject whose private data is the CM reject.
void IwarpCmAgent::reject_request(const P2pAction& action, Time /*now*/) {
  Stream* s = find_stream(action.link);
  if (s == nullptr || !s->responder) return;
  if (action.reason == P2pRejectReason::collision) {
    ++stats_.rejects_sent_collision;
    ++stats_.collisions_won;
  } else {
    ++stats_.rejects_sent_duplicate;
  }
  std::array<std::uint8_t, wire::kCmRejectSize> reject{};
  [[maybe_unused]] auto n = wire::encode_cm_reject(action.reason == P2pRejectReason::collision
                                                       ? wire::CmRejectReason::collision
                                                       : wire::CmRejectReason::duplicate,
                                                   reject);
  s->responder->reject(reject);
  flush_transmit(action.link, *s);
  abandon(action.link, /*graceful=*/true);
  resolver_.handle_link_closed(action.link);
}

// R3, passive peer: our attempt lost; its id (and the queue pair the API runs on it) takes over
// the peer's request (R7: work posted meanwhile runs on this connection). The attempt's own
// stream ends silently.
void IwarpCmAgent::accept_into_attempt(const P2pAction& action, Time now) {
  Stream* s = find_stream(action.link);
  auto at = attempts_.find(action.attempt);
  Id* record = at != attempts_.end() ? find_id(at->second) : nullptr;
  if (s == nullptr || s->phase != StreamPhase::parked || record == nullptr) {
    if (s != nullptr) abandon(action.link, /*graceful=*/false);
    resolver_.handle_link_closed(action.link);
    if (record == nullptr) resolver_.handle_attempt_ended(action.attempt);
    return;
  }
  const IwarpCmId id = at->second;
  ++stats_.collisions_lost;
  if (record->stream != 0 && record->stream != action.link && find_stream(record->stream) != nullptr) {
    abandon(record->stream, /*graceful=*/false);
  }
  if (action.aborted_link != 0) resolver_.handle_link_closed(action.aborted_link);
  record->stream = action.link;
  record->peer_incarnation = s->peer_node.incarnation;
  s->owner = id;
  s->phase = StreamPhase::requested;
  release_charge(*s);  // B1: the application holds it, through its own attempt
  const std::vector<std::uint8_t> reply =
      cm_header(record->connect.tag, record->connect.number, record->connect.private_data);
  s->responder->accept(record->connect.ird, record->connect.ord, reply);
  drain_handshake(action.link, now);
}

// R6: the peer restarted (or connects anew): its old connection goes, DISCONNECTED on its id.
void IwarpCmAgent::teardown_link(const P2pAction& action, Time /*now*/) {
  Stream* s = find_stream(action.link);
  if (s == nullptr || s->owner == 0) return;
  Id* record = find_id(s->owner);
  if (record == nullptr) return;
  emit_disconnected(s->owner, *record);
  close_stream(action.link, *s, /*graceful=*/true);
}

// R8: the attempt's deadline passed: CONNECT_ERROR, and whatever stream it held closes.
void IwarpCmAgent::attempt_failed(const P2pAction& action, Time /*now*/) {
  auto at = attempts_.find(action.attempt);
  if (at == attempts_.end()) return;
  const IwarpCmId id = at->second;
  attempts_.erase(at);
  Id* record = find_id(id);
  if (record == nullptr) return;
  record->p2p_attempt = false;
  if (record->stream != 0 && find_stream(record->stream) != nullptr) abandon(record->stream, /*graceful=*/false);
  record->stream = 0;
  push(IwarpCmEvent{.kind = IwarpCmEvent::Kind::connect_error, .id = id, .status = ETIMEDOUT,
                    .reason = IwarpEndReason::timeout});
  ids_.erase(id);
}

}  // namespace peercm::core::iwarp
