// MPA connection setup (RFC 5044 §7.1) with RFC 6581 enhanced negotiation: IRD/ORD (§9.1)
// and the peer-to-peer RTR choice (§9.2). Rules carry the RFC section they implement.
#include "core/mpa_handshake.hpp"

#include <algorithm>
#include <cassert>
#include <utility>

namespace peercm::core {
namespace {

using wire::IrdOrdBlock;
using wire::kIrdOrdMax;
using wire::MpaFrame;
using wire::MpaFrameKind;
using wire::WireError;

constexpr std::uint8_t kRevisionPlain = 1;     // RFC 5044
constexpr std::uint8_t kRevisionEnhanced = 2;  // RFC 6581 §5: any enhanced feature needs Rev >= 2

// RFC 6581 §9.1: 0x3FFF in IRD or ORD means "no automatic negotiation, the ULP handles it".
// peercm also reports it as the peer's value when no IRD/ORD block was exchanged.
constexpr std::uint16_t kUlpNegotiates = kIrdOrdMax;

MpaEvent make_event(MpaEvent::Kind kind, const MpaResult& result) {
  MpaEvent event;
  event.kind = kind;
  event.result = result;
  return event;
}

MpaEvent make_failure(MpaFailure failure, const MpaResult& result,
                      std::optional<WireError> wire_error, bool send_terminate) {
  MpaEvent event = make_event(MpaEvent::Kind::failed, result);
  event.failure = failure;
  event.wire_error = wire_error;
  event.send_terminate = send_terminate;
  return event;
}

void copy_private_data(std::vector<std::uint8_t>& to, std::span<const std::uint8_t> from) {
  to.assign(from.begin(), from.end());
}

// RFC 6581 §9.2: the initiator picks one type set in both frames — its free choice; peercm
// prefers Write, then Read, then Send (docs/p2p.md R9). A Read RTR consumes one slot of
// the responder's IRD, so it is only usable when that IRD is not 0.
RtrType choose_initiator_rtr(const IrdOrdBlock& reply) {
  if (!reply.peer_to_peer) return RtrType::none;  // §9.2: B, C, D are ignored when A=0
  if (reply.write_rtr) return RtrType::write;
  if (reply.read_rtr && reply.ird != 0) return RtrType::read;
  if (reply.send_rtr) return RtrType::send;
  return RtrType::none;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Helpers

namespace detail {

void MpaTransmitBuffer::set_length(std::size_t n) {
  length_ = std::min(n, bytes_.size());
  sent_ = 0;
}

std::span<const std::uint8_t> MpaTransmitBuffer::pending() const {
  return std::span<const std::uint8_t>(bytes_).subspan(sent_, length_ - sent_);
}

void MpaTransmitBuffer::consume(std::size_t n) {
  assert(n <= length_ - sent_);
  sent_ += std::min(n, length_ - sent_);
}

void MpaEventQueue::push(MpaEvent event) {
  assert(count_ < events_.size());
  if (count_ == events_.size()) return;
  events_[(head_ + count_) % events_.size()] = std::move(event);
  ++count_;
}

std::optional<MpaEvent> MpaEventQueue::pop() {
  if (count_ == 0) return std::nullopt;
  std::optional<MpaEvent> event = std::move(events_[head_]);
  head_ = (head_ + 1) % events_.size();
  --count_;
  return event;
}

}  // namespace detail

// ---------------------------------------------------------------------------------------------
// Initiator

MpaInitiator::MpaInitiator(const MpaConfig& config, std::span<const std::uint8_t> private_data,
                           Time now)
    : config_(config), deadline_(now + config.timeout) {
  // RFC 5044 §7.1.1: C=1 unless the administrator turned CRC off.
  sent_crc_ = config.crc != CrcPolicy::off;
  // RFC 6581 §5: send the enhanced format (Rev 2, S=1) only when enhanced features are wanted.
  sent_enhanced_ = config.enhanced;
  // RFC 6581 §9.2: A=1 and every RTR type we can send; p2p needs the enhanced block.
  sent_p2p_ = config.enhanced && config.peer_to_peer;

  MpaFrame request;
  request.kind = MpaFrameKind::request;
  request.markers = false;  // RFC 5044 §7.1.2: M=1 would ask for Markers; peercm never does
  request.crc = sent_crc_;
  request.rejected = false;  // RFC 5044 §7.1.2: R is 0 in a Request
  request.revision = sent_enhanced_ ? kRevisionEnhanced : kRevisionPlain;
  if (sent_enhanced_) {
    // RFC 6581 §9.1: the Request carries our current IRD and the ORD we would like.
    request.enhanced = IrdOrdBlock{.peer_to_peer = sent_p2p_,
                                   .send_rtr = sent_p2p_,
                                   .write_rtr = sent_p2p_,
                                   .read_rtr = sent_p2p_,
                                   .ird = config.ird,
                                   .ord = config.ord};
  }
  request.private_data = private_data;

  result_.revision = request.revision;
  result_.crc = sent_crc_;
  result_.ird = config.ird;
  result_.ord = config.ord;

  // Too much private data (or IRD/ORD above 14 bits) is the caller's mistake: report it as a
  // local failure instead of sending a frame the peer must reject.
  auto written = wire::encode_mpa_frame(request, transmit_.storage());
  if (!written) {
    fail(MpaFailure::bad_frame, written.error());
    return;
  }
  transmit_.set_length(*written);
}

std::span<const std::uint8_t> MpaInitiator::pending_transmit() const { return transmit_.pending(); }

void MpaInitiator::consume_transmit(std::size_t n) { transmit_.consume(n); }

std::size_t MpaInitiator::handle_bytes(std::span<const std::uint8_t> bytes) {
  // After the Reply every byte is FPDU stream: leave it to the caller.
  if (state_ != State::awaiting_reply) return 0;
  const std::size_t used = reader_.feed(bytes);
  if (auto error = reader_.error()) {
    // RFC 5044 §7.1.2: a malformed Reply (key, Rev, PD_Length) closes the connection.
    fail(MpaFailure::bad_frame, error);
  } else if (reader_.complete()) {
    on_reply(*reader_.frame());
  }
  return used;
}

void MpaInitiator::on_reply(const MpaFrame& reply) {
  result_.revision = reply.revision;
  copy_private_data(result_.peer_private_data, reply.private_data);
  // RFC 6581 §5: an unenhanced Request gets an unenhanced Reply; an IRD/ORD block we did not
  // offer means the peer speaks a revision we did not ask for.
  if (reply.enhanced && !sent_enhanced_) {
    fail(MpaFailure::bad_frame, WireError::mpa_bad_revision);
    return;
  }
  if (reply.enhanced) {
    result_.peer_ird = reply.enhanced->ird;
    result_.peer_ord = reply.enhanced->ord;
  } else {
    result_.peer_ird = kUlpNegotiates;
    result_.peer_ord = kUlpNegotiates;
  }
  // RFC 5044 §7.1.1: CRC is on in both directions iff C=1 in the Request or the Reply.
  result_.crc = sent_crc_ || reply.crc;

  // RFC 5044 §7.1.2: R=1 — the peer's ULP rejected; its private data says why. RFC 6581 §9.1:
  // the peer's IRD/ORD go to the ULP on reject too.
  if (reply.rejected) {
    state_ = State::rejected;
    events_.push(make_event(MpaEvent::Kind::rejected, result_));
    return;
  }
  // RFC 5044 §4.2: M=1 in the Reply asks us to mark what we send; peercm has no Markers
  // (fact sheet §1.5), so it closes.
  if (reply.markers) {
    fail(MpaFailure::markers_requested);
    return;
  }

  if (!reply.enhanced) {
    // RFC 6581 §5/§10 fallback: an unenhanced (Rev 1) Reply — no IRD/ORD negotiation (keep
    // the configured values, the ULP handles them) and no RTR.
    result_.ird = config_.ird;
    result_.ord = config_.ord;
    result_.rtr = RtrType::none;
    result_.peer_to_peer = false;
    state_ = State::established;
    events_.push(make_event(MpaEvent::Kind::established, result_));
    return;
  }

  const IrdOrdBlock& block = *reply.enhanced;
  // RFC 6581 §9.1: our IRD must be >= the responder's ORD; config.ird is all we can provide.
  // 0x3FFF in the Reply's ORD: leave our IRD unchanged.
  result_.ird = config_.ird;
  if (block.ord != kUlpNegotiates && block.ord > config_.ird) {
    fail(MpaFailure::insufficient_ird, std::nullopt, /*send_terminate=*/true);  // Terminate 2/0/6
    return;
  }
  // RFC 6581 §9.1: our ORD must be <= the responder's IRD; 0x3FFF: leave our ORD unchanged.
  result_.ord = block.ird == kUlpNegotiates ? config_.ord : std::min(config_.ord, block.ird);

  // RFC 6581 §9.2: in peer-to-peer mode pick an RTR type set in both frames. A Reply with
  // A=0 breaks §9.2's "MUST set A=1", but it is what a responder that knows only the
  // client-server model sends: peercm offers the RTR on every connection (docs/p2p.md "RTR on
  // every connection"), so it meets such responders and falls back to the RFC 5044 exchange,
  // where our first FPDU lifts the responder's fence.
  result_.rtr = RtrType::none;
  result_.peer_to_peer = false;
  if (sent_p2p_ && block.peer_to_peer) {
    const RtrType rtr = choose_initiator_rtr(block);
    if (rtr == RtrType::none) {
      fail(MpaFailure::no_matching_rtr, std::nullopt, /*send_terminate=*/true);  // Terminate 2/0/7
      return;
    }
    result_.rtr = rtr;
    result_.peer_to_peer = true;
    // RFC 6581 §9.1: a zero-length Read RTR needs one ORD slot on our side.
    if (rtr == RtrType::read) result_.ord = std::max<std::uint16_t>(result_.ord, 1);
  }
  // RFC 6581 §9.2 (A=0 sent): a Reply with A=1 anyway is ignored — client-server it is.

  state_ = State::established;
  events_.push(make_event(MpaEvent::Kind::established, result_));
}

void MpaInitiator::handle_timeout(Time now) {
  // RFC 5044 §7.1.2: bound the startup exchange with a timeout (DoS defence).
  if (finished() || now < deadline_) return;
  fail(MpaFailure::timeout);
}

void MpaInitiator::handle_connection_closed() {
  if (finished()) return;
  fail(MpaFailure::connection_closed);
}

std::optional<Time> MpaInitiator::deadline() const {
  if (finished()) return std::nullopt;
  return deadline_;
}

std::optional<MpaEvent> MpaInitiator::poll_event() { return events_.pop(); }

bool MpaInitiator::finished() const { return state_ != State::awaiting_reply; }

void MpaInitiator::fail(MpaFailure failure, std::optional<WireError> wire_error,
                        bool send_terminate) {
  state_ = State::failed;
  events_.push(make_failure(failure, result_, wire_error, send_terminate));
}

// ---------------------------------------------------------------------------------------------
// Responder

MpaResponder::MpaResponder(const MpaConfig& config, Time now)
    : config_(config), deadline_(now + config.timeout) {}

std::size_t MpaResponder::handle_bytes(std::span<const std::uint8_t> bytes) {
  // RFC 5044 §7.1.2: nothing but the Request is read before the ULP answers; after the Reply
  // every byte is FPDU stream and belongs to the caller.
  if (state_ != State::awaiting_request) return 0;
  const std::size_t used = reader_.feed(bytes);
  if (auto error = reader_.error()) {
    // RFC 5044 §7.1.2: a malformed Request (or a Reply key: Responder/Responder mistake)
    // closes the connection without a Reply.
    fail(MpaFailure::bad_frame, error);
  } else if (reader_.complete()) {
    on_request(*reader_.frame());
  }
  return used;
}

void MpaResponder::on_request(const MpaFrame& request) {
  request_enhanced_ = request.enhanced.has_value();
  request_.revision = request.revision;
  request_.crc = request.crc;
  request_.ird = config_.ird;
  request_.ord = config_.ord;
  if (request_enhanced_) {
    request_block_ = *request.enhanced;
    request_.peer_ird = request_block_.ird;
    request_.peer_ord = request_block_.ord;
    request_.peer_to_peer = request_block_.peer_to_peer;
  } else {
    // RFC 6581 §5: a Rev 1 (or S=0) Request negotiates nothing; the ULP handles IRD/ORD.
    request_.peer_ird = kUlpNegotiates;
    request_.peer_ord = kUlpNegotiates;
    request_.peer_to_peer = false;
  }
  copy_private_data(request_.peer_private_data, request.private_data);

  // RFC 5044 §4.2: M=1 asks us to put Markers in what we send. peercm has none and, like
  // siw/erdma, answers with R=1, M=0 and gives up (fact sheet §1.5).
  if (request.markers) {
    const std::optional<WireError> error = queue_reply(true, negotiate(config_.ird, config_.ord), {});
    fail(MpaFailure::markers_requested, error);
    return;
  }
  // RFC 5044 §7.1.2: hand the private data to the ULP; it accepts or rejects.
  state_ = State::awaiting_ulp;
  events_.push(make_event(MpaEvent::Kind::request_received, request_));
}

MpaResponder::Negotiated MpaResponder::negotiate(std::uint16_t ird, std::uint16_t ord) const {
  Negotiated n;
  n.ird = ird;
  n.ord = ord;
  if (!request_enhanced_) return n;  // RFC 6581 §5: no block, no negotiation, no RTR

  // RFC 6581 §9.2: A=1 in the Request => A=1 in the Reply and at least one RTR type. peercm
  // selects exactly one: Write, then Read, then Send only with a receive posted (docs/p2p.md
  // R9). None acceptable: still name one we support (Write); the initiator then finds no
  // common type and sends Terminate 2/0/7.
  if (request_block_.peer_to_peer) {
    n.block.peer_to_peer = true;
    if (request_block_.write_rtr) {
      n.rtr = RtrType::write;
    } else if (request_block_.read_rtr) {
      n.rtr = RtrType::read;
    } else if (request_block_.send_rtr && config_.responder_has_recv_posted) {
      n.rtr = RtrType::send;
    } else {
      n.rtr = RtrType::write;
    }
    n.block.write_rtr = n.rtr == RtrType::write;
    n.block.read_rtr = n.rtr == RtrType::read;
    n.block.send_rtr = n.rtr == RtrType::send;
  }

  // RFC 6581 §9.1: our IRD is what the ULP provides; we MAY raise it to 1 so the zero-length
  // Read RTR fits. Initiator ORD 0x3FFF: keep our IRD and reply IRD 0x3FFF.
  if (n.rtr == RtrType::read) n.ird = std::max<std::uint16_t>(n.ird, 1);
  n.block.ird = request_block_.ord == kUlpNegotiates ? kUlpNegotiates : n.ird;
  // RFC 6581 §9.1: our ORD MUST be <= the initiator's IRD. Initiator IRD 0x3FFF: keep our ORD
  // and reply ORD 0x3FFF.
  if (request_block_.ird == kUlpNegotiates) {
    n.block.ord = kUlpNegotiates;
  } else {
    n.ord = std::min(n.ord, request_block_.ird);
    n.block.ord = n.ord;
  }
  return n;
}

bool MpaResponder::reply_crc() const {
  // RFC 5044 §7.1.1: C is a preference; CRC is on iff either frame has C=1.
  switch (config_.crc) {
    case CrcPolicy::required: return true;
    case CrcPolicy::preferred: return request_.crc;
    case CrcPolicy::off: return false;
  }
  return true;
}

std::optional<WireError> MpaResponder::queue_reply(bool rejected, const Negotiated& negotiated,
                                                   std::span<const std::uint8_t> private_data) {
  MpaFrame reply;
  reply.kind = MpaFrameKind::reply;
  reply.markers = false;  // peercm never asks for Markers
  reply.crc = reply_crc();
  reply.rejected = rejected;
  // RFC 6581 §5: enhanced Request => enhanced Reply (Rev 2, S=1), accepting or rejecting;
  // unenhanced Request => unenhanced Reply, Rev 1 (safe with RFC 5044 peers).
  reply.revision = request_enhanced_ ? kRevisionEnhanced : kRevisionPlain;
  if (request_enhanced_) reply.enhanced = negotiated.block;
  reply.private_data = private_data;
  auto written = wire::encode_mpa_frame(reply, transmit_.storage());
  if (!written) return written.error();
  transmit_.set_length(*written);
  return std::nullopt;
}

void MpaResponder::accept(std::uint16_t ird, std::uint16_t ord,
                          std::span<const std::uint8_t> private_data) {
  // Late answers (after a timeout or a close) are no-ops.
  if (state_ != State::awaiting_ulp) return;
  const Negotiated n = negotiate(ird, ord);
  // Oversized private data or IRD/ORD above 14 bits: the ULP's mistake, reported locally.
  if (auto error = queue_reply(false, n, private_data)) {
    fail(MpaFailure::bad_frame, error);
    return;
  }
  MpaResult result = request_;
  result.revision = request_enhanced_ ? kRevisionEnhanced : kRevisionPlain;
  result.crc = request_.crc || reply_crc();  // RFC 5044 §7.1.1
  result.ird = n.ird;
  result.ord = n.ord;
  result.rtr = n.rtr;
  result.peer_to_peer = request_enhanced_ && request_block_.peer_to_peer;
  // RFC 5044 §7.1.2: after sending the Reply the Responder is in full operation (the
  // "no FPDU before the first inbound FPDU" fence belongs to the queue-pair engine).
  state_ = State::established;
  events_.push(make_event(MpaEvent::Kind::established, result));
}

void MpaResponder::reject(std::span<const std::uint8_t> private_data) {
  if (state_ != State::awaiting_ulp) return;
  // RFC 5044 §7.1.2: Reply with R=1 and the ULP's reason; RFC 6581 §5: still enhanced when the
  // Request was, carrying our IRD/ORD (§9.1: the peer passes them to its ULP on reject too).
  if (auto error = queue_reply(true, negotiate(config_.ird, config_.ord), private_data)) {
    fail(MpaFailure::bad_frame, error);
    return;
  }
  state_ = State::rejected;
}

const MpaResult& MpaResponder::request() const { return request_; }

void MpaResponder::handle_timeout(Time now) {
  // RFC 5044 §7.1.2: time out waiting for a Request (Responder/Responder mistakes, DoS) and,
  // peercm's choice, for the ULP's answer too.
  if (finished() || now < deadline_) return;
  fail(MpaFailure::timeout);
}

void MpaResponder::handle_connection_closed() {
  if (finished()) return;
  fail(MpaFailure::connection_closed);
}

std::span<const std::uint8_t> MpaResponder::pending_transmit() const { return transmit_.pending(); }

void MpaResponder::consume_transmit(std::size_t n) { transmit_.consume(n); }

std::optional<Time> MpaResponder::deadline() const {
  if (finished()) return std::nullopt;
  return deadline_;
}

std::optional<MpaEvent> MpaResponder::poll_event() { return events_.pop(); }

bool MpaResponder::finished() const {
  return state_ != State::awaiting_request && state_ != State::awaiting_ulp;
}

void MpaResponder::fail(MpaFailure failure, std::optional<WireError> wire_error) {
  state_ = State::failed;
  events_.push(make_failure(failure, request_, wire_error, /*send_terminate=*/false));
}

}  // namespace peercm::core
