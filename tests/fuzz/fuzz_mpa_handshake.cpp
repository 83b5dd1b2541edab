// The MPA handshake cores (RFC 5044 §7.1, RFC 6581 §9) fed arbitrary peer bytes.
// Input: a configuration byte (bit 0: responder; bits 1-2: CRC policy; bit 3: enhanced;
// bit 4: peer-to-peer; bit 5: responder has a receive posted; bits 6-7: the responder ULP's
// answer: accept, reject, none, or accept after the close), IRD and ORD selectors, a split
// byte (bit 7: poll events only at the end, so they queue up; bits 0-6: split seed), a
// private-data length selector, then the peer's bytes, fed in pieces.
// Oracles: the core never takes more bytes than offered and none after it finished; it ends
// (after the close and the deadline) finished, without a deadline, having reported exactly
// one outcome, nothing after it; it sends nothing but its one frame — nothing after a
// failure, nothing from a responder before the ULP answered — and that frame decodes and
// says what the configuration and the peer's frame imply; an established result follows
// from the frames exchanged (CRC rule, RTR choice, private data); only the two RFC 6581 §8
// failures ask for a Terminate.
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "core/mpa_handshake.hpp"
#include "fuzz_support.hpp"
#include "wire/mpa_frame.hpp"

namespace {

using namespace peercm::core;
using peercm::fuzz::Splitter;
using peercm::wire::IrdOrdBlock;
using peercm::wire::MpaFrame;
using peercm::wire::MpaFrameKind;
using Bytes = std::vector<std::uint8_t>;

const Time kStart = Time{} + std::chrono::seconds(100);

enum class Answer : std::uint8_t { accept, reject, none, late };

struct Setup {
  bool responder = false;
  MpaConfig config;
  Answer answer = Answer::accept;
  std::uint16_t answer_ird = 0;
  std::uint16_t answer_ord = 0;
  Bytes private_data;
  std::uint64_t split_seed = 0;
  bool poll_late = false;
};

// 0xFF: "ULP negotiates"; 0xFE: out of the 14-bit range (a local mistake); else small.
std::uint16_t ird_ord(std::uint8_t selector) {
  if (selector == 0xFF) return peercm::wire::kIrdOrdMax;
  if (selector == 0xFE) return peercm::wire::kIrdOrdMax + 1;
  return selector & 0x1F;
}

Setup read_setup(peercm::fuzz::Input& in) {
  Setup s;
  const std::uint8_t c = in.byte();
  s.responder = c & 1;
  constexpr CrcPolicy kPolicies[] = {CrcPolicy::required, CrcPolicy::preferred, CrcPolicy::off, CrcPolicy::preferred};
  s.config.crc = kPolicies[(c >> 1) & 3];
  s.config.enhanced = (c & 0x08) != 0;
  s.config.peer_to_peer = (c & 0x10) != 0;
  s.config.responder_has_recv_posted = (c & 0x20) != 0;
  s.answer = static_cast<Answer>(c >> 6);
  s.config.ird = ird_ord(in.byte());
  s.config.ord = ird_ord(in.byte());
  // The responder's ULP answers with its own values: the configured ones swapped, so the
  // negotiation sees IRD != ORD.
  s.answer_ird = s.config.ord;
  s.answer_ord = s.config.ird;
  const std::uint8_t split = in.byte();
  s.split_seed = split & 0x7F;
  s.poll_late = (split & 0x80) != 0;
  s.private_data.resize(std::size_t{in.byte()} * 2);  // up to 510: some too long for an enhanced frame
  for (std::size_t i = 0; i < s.private_data.size(); ++i) s.private_data[i] = static_cast<std::uint8_t>(i * 7 + 1);
  return s;
}

bool is_outcome(MpaEvent::Kind kind) { return kind != MpaEvent::Kind::request_received; }

// Everything a core sends, taken in pieces as a socket would.
template <class Core>
class Wire {
 public:
  Wire(Core& core, std::uint64_t seed) : core_(core), split_(seed) {}

  void drain() {
    while (!core_.pending_transmit().empty()) {
      const auto pending = core_.pending_transmit();
      const std::size_t n = split_.next(pending.size());
      sent_.insert(sent_.end(), pending.begin(), pending.begin() + static_cast<std::ptrdiff_t>(n));
      core_.consume_transmit(n);
    }
  }
  std::size_t total() const { return sent_.size() + core_.pending_transmit().size(); }
  const Bytes& sent() const { return sent_; }

 private:
  Core& core_;
  Splitter split_;
  Bytes sent_;
};

struct Events {
  bool late = false;  // poll only when asked to at the end: the core must hold what it emits
  std::vector<MpaEvent> all;
  std::optional<std::size_t> output_at_outcome;  // what had been sent or queued by then

  template <class Core, class W>
  void poll(Core& core, const W& wire) {
    while (auto event = core.poll_event()) {
      FUZZ_CHECK(!outcome(), "an event after the outcome");
      all.push_back(*event);
      if (is_outcome(event->kind)) output_at_outcome = wire.total();
    }
    if (output_at_outcome && all.back().kind == MpaEvent::Kind::failed)
      FUZZ_CHECK(wire.total() == *output_at_outcome, "output after a failure");
  }
  template <class Core, class W>
  void poll_unless_late(Core& core, const W& wire) {
    if (!late) poll(core, wire);
  }
  bool has(MpaEvent::Kind kind) const {
    return std::any_of(all.begin(), all.end(), [&](const MpaEvent& e) { return e.kind == kind; });
  }
  const MpaEvent* outcome() const {
    for (const MpaEvent& e : all)
      if (is_outcome(e.kind)) return &e;
    return nullptr;
  }
};

void check_failure(const MpaEvent& e) {
  const bool rfc6581_terminate = e.failure == MpaFailure::insufficient_ird || e.failure == MpaFailure::no_matching_rtr;
  FUZZ_CHECK(e.send_terminate == rfc6581_terminate, "Terminate asked for a failure that has none");
  FUZZ_CHECK(e.failure != MpaFailure::bad_frame || e.wire_error.has_value(), "bad frame without its wire error");
  // The one other failure that may carry one: a Markers Request whose R=1 Reply could not be
  // encoded (IRD/ORD above 14 bits in the configuration).
  FUZZ_CHECK(!e.wire_error || e.failure == MpaFailure::bad_frame || e.failure == MpaFailure::markers_requested,
             "wire error on a failure that is not about a frame");
}

// Feeds `peer` in pieces; returns how many bytes the core used.
template <class Core, class W>
std::size_t feed(Core& core, W& wire, Events& events, std::span<const std::uint8_t> peer, std::uint64_t seed) {
  Splitter split(seed ^ 0x5A);
  std::size_t used = 0;
  std::size_t at = 0;
  while (at < peer.size()) {
    const auto chunk = peer.subspan(at, split.next(peer.size() - at));
    const bool was_finished = core.finished();
    const std::size_t n = core.handle_bytes(chunk);
    FUZZ_CHECK(n <= chunk.size(), "handshake took more than it was given");
    FUZZ_CHECK(!was_finished || n == 0, "handshake took bytes after it finished");
    used += n;
    at += chunk.size();
    events.poll_unless_late(core, wire);
    if (n < chunk.size() && !core.finished() && !events.late) {
      // Only a responder waiting for its ULP stops reading without finishing.
      FUZZ_CHECK(!events.all.empty() && events.all.back().kind == MpaEvent::Kind::request_received,
                 "handshake stopped reading while waiting for its frame");
    }
    wire.drain();
  }
  return used;
}

// The core must end: closed and past its deadline it is finished with no deadline left.
template <class Core, class W>
void finish(Core& core, W& wire, Events& events) {
  core.handle_timeout(kStart);  // before the deadline: nothing happens
  events.poll(core, wire);
  core.handle_connection_closed();
  core.handle_timeout(kStart + std::chrono::hours(1));
  events.poll(core, wire);
  wire.drain();
  FUZZ_CHECK(core.finished(), "handshake not finished after close and timeout");
  FUZZ_CHECK(!core.deadline().has_value(), "a finished handshake still has a deadline");
}

void run_initiator(const Setup& s, std::span<const std::uint8_t> peer) {
  MpaInitiator core(s.config, s.private_data, kStart);
  Wire wire(core, s.split_seed);
  Events events{.late = s.poll_late};
  events.poll(core, wire);
  const std::size_t request_size = wire.total();
  const bool failed_at_once = !events.all.empty();
  if (failed_at_once) {
    FUZZ_CHECK(events.all[0].kind == MpaEvent::Kind::failed && events.all[0].failure == MpaFailure::bad_frame,
               "a constructor failure that is not bad_frame");
    FUZZ_CHECK(request_size == 0, "a Request queued by a failed initiator");
  } else {
    wire.drain();
    auto request = peercm::wire::decode_mpa_frame(wire.sent(), MpaFrameKind::request);
    FUZZ_CHECK(request.has_value(), "the initiator's Request does not decode");
    FUZZ_CHECK(request->crc == (s.config.crc != CrcPolicy::off), "Request C bit does not follow the CRC policy");
    FUZZ_CHECK(request->enhanced.has_value() == s.config.enhanced, "Request S bit does not follow the config");
    FUZZ_CHECK(!request->markers, "Request asks for Markers");
    FUZZ_CHECK(std::equal(request->private_data.begin(), request->private_data.end(), s.private_data.begin(),
                          s.private_data.end()),
               "Request private data differs");
  }

  const std::size_t used = feed(core, wire, events, peer, s.split_seed);
  finish(core, wire, events);
  FUZZ_CHECK(wire.total() == request_size, "the initiator sent something besides its Request");
  const MpaEvent* outcome = events.outcome();
  FUZZ_CHECK(outcome != nullptr && events.all.size() == 1, "initiator without exactly one outcome");
  if (failed_at_once) return;

  if (outcome->kind == MpaEvent::Kind::failed) {
    check_failure(*outcome);
    if (outcome->failure == MpaFailure::timeout || outcome->failure == MpaFailure::connection_closed) {
      auto length = peercm::wire::mpa_frame_length(peer, MpaFrameKind::reply);
      FUZZ_CHECK(!length || peer.size() < *length, "a whole Reply was there but the initiator waited");
      FUZZ_CHECK(used == peer.size(), "a waiting initiator left bytes unread");
    }
    return;
  }
  // established or rejected: the bytes used are exactly one valid Reply.
  auto reply = peercm::wire::decode_mpa_frame(peer.first(used), MpaFrameKind::reply);
  FUZZ_CHECK(reply.has_value(), "initiator ended on bytes that are not one valid Reply");
  const MpaResult& r = outcome->result;
  FUZZ_CHECK(std::equal(r.peer_private_data.begin(), r.peer_private_data.end(), reply->private_data.begin(),
                        reply->private_data.end()),
             "peer private data differs from the Reply");
  FUZZ_CHECK(r.crc == ((s.config.crc != CrcPolicy::off) || reply->crc), "CRC is not on iff either C bit is set");
  FUZZ_CHECK((outcome->kind == MpaEvent::Kind::rejected) == reply->rejected, "rejected iff R=1");
  if (outcome->kind == MpaEvent::Kind::rejected) return;
  FUZZ_CHECK(!reply->markers, "established although the Reply asks for Markers");
  FUZZ_CHECK(!reply->enhanced || s.config.enhanced, "established on an IRD/ORD block we did not offer");
  FUZZ_CHECK(r.ird == s.config.ird, "initiator IRD changed");
  const bool p2p = s.config.enhanced && s.config.peer_to_peer;
  FUZZ_CHECK(r.peer_to_peer == (p2p && reply->enhanced.has_value() && reply->enhanced->peer_to_peer),
             "peer-to-peer without both sides' A flag");
  const IrdOrdBlock block = reply->enhanced.value_or(IrdOrdBlock{});
  switch (r.rtr) {
    case RtrType::none: FUZZ_CHECK(!r.peer_to_peer, "peer-to-peer without an RTR"); break;
    case RtrType::write: FUZZ_CHECK(block.peer_to_peer && block.write_rtr, "Write RTR not offered"); break;
    case RtrType::read: FUZZ_CHECK(block.peer_to_peer && block.read_rtr && block.ird != 0, "Read RTR not usable"); break;
    case RtrType::send: FUZZ_CHECK(block.peer_to_peer && block.send_rtr, "Send RTR not offered"); break;
  }
  if (reply->enhanced && block.ord != peercm::wire::kIrdOrdMax)
    FUZZ_CHECK(block.ord <= s.config.ird, "established with less IRD than the responder's ORD");
}

void run_responder(const Setup& s, std::span<const std::uint8_t> peer) {
  MpaResponder core(s.config, kStart);
  Wire wire(core, s.split_seed);
  Events events{.late = s.poll_late};
  FUZZ_CHECK(wire.total() == 0, "responder queued output before a Request");

  const std::size_t request_bytes = feed(core, wire, events, peer, s.split_seed);
  if (events.has(MpaEvent::Kind::request_received))
    FUZZ_CHECK(wire.total() == 0, "responder sent before its ULP answered");
  if (events.late || events.has(MpaEvent::Kind::request_received)) {
    // Without polling, the ULP answers blindly: answers outside awaiting_ulp are no-ops.
    if (s.answer == Answer::accept) core.accept(s.answer_ird, s.answer_ord, s.private_data);
    if (s.answer == Answer::reject) core.reject(s.private_data);
    events.poll(core, wire);
    wire.drain();
    // The rest of the stream belongs to the caller now.
    const std::size_t more = feed(core, wire, events, peer.subspan(request_bytes), s.split_seed + 1);
    FUZZ_CHECK(more == 0, "responder read past its Request");
  }
  const bool requested = events.has(MpaEvent::Kind::request_received);
  if (requested) {
    FUZZ_CHECK(events.all[0].kind == MpaEvent::Kind::request_received, "request_received after another event");
    const MpaResult& request = core.request();
    auto frame = peercm::wire::decode_mpa_frame(peer.first(request_bytes), MpaFrameKind::request);
    FUZZ_CHECK(frame.has_value(), "request_received on bytes that are not one valid Request");
    FUZZ_CHECK(request.crc == frame->crc && request.revision == frame->revision, "Request fields misreported");
    FUZZ_CHECK(std::equal(request.peer_private_data.begin(), request.peer_private_data.end(),
                          frame->private_data.begin(), frame->private_data.end()),
               "Request private data misreported");
    FUZZ_CHECK(!frame->markers, "a Request with Markers reached the ULP");
  }
  const std::size_t before_close = wire.total();
  finish(core, wire, events);
  if (s.answer == Answer::late) {
    core.accept(s.answer_ird, s.answer_ord, s.private_data);
    core.reject(s.private_data);
    events.poll(core, wire);
  }
  FUZZ_CHECK(wire.total() == before_close, "responder sent something after its outcome");

  const MpaEvent* outcome = events.outcome();
  const bool ulp_rejected = requested && s.answer == Answer::reject && outcome == nullptr;
  FUZZ_CHECK(outcome != nullptr || ulp_rejected, "responder without an outcome");
  FUZZ_CHECK(events.all.size() <= 2, "more than request_received and one outcome");
  if (outcome != nullptr && outcome->kind == MpaEvent::Kind::failed) {
    check_failure(*outcome);
    FUZZ_CHECK(!outcome->send_terminate, "responder asked for a Terminate");
    if (outcome->failure != MpaFailure::markers_requested) {
      FUZZ_CHECK(wire.total() == 0, "a failed responder sent a Reply");
      return;
    }
  }
  if (wire.total() == 0) {
    FUZZ_CHECK(outcome == nullptr || outcome->kind != MpaEvent::Kind::established, "established without a Reply");
    return;
  }
  auto reply = peercm::wire::decode_mpa_frame(wire.sent(), MpaFrameKind::reply);
  FUZZ_CHECK(reply.has_value(), "the responder's Reply does not decode");
  FUZZ_CHECK(!reply->markers, "Reply asks for Markers");
  const bool markers_failure = outcome != nullptr && outcome->kind == MpaEvent::Kind::failed;
  FUZZ_CHECK(reply->rejected == (ulp_rejected || markers_failure), "Reply R bit does not match the answer");
  // A Reply answers a Request: the bytes the responder read are exactly one.
  auto request = peercm::wire::decode_mpa_frame(peer.first(request_bytes), MpaFrameKind::request);
  FUZZ_CHECK(request.has_value(), "a Reply without one valid Request before it");
  const MpaResult& req = core.request();
  FUZZ_CHECK(reply->revision == (request->enhanced ? 2 : 1), "Reply revision does not follow the Request");
  FUZZ_CHECK(reply->enhanced.has_value() == request->enhanced.has_value(), "Reply S bit does not follow the Request");
  switch (s.config.crc) {
    case CrcPolicy::required: FUZZ_CHECK(reply->crc, "required CRC not asked for"); break;
    case CrcPolicy::preferred: FUZZ_CHECK(reply->crc == req.crc, "preferred CRC does not follow the Request"); break;
    case CrcPolicy::off: FUZZ_CHECK(!reply->crc, "CRC asked for with policy off"); break;
  }
  if (outcome == nullptr || outcome->kind != MpaEvent::Kind::established) return;
  const MpaResult& r = outcome->result;
  FUZZ_CHECK(r.crc == (req.crc || reply->crc), "CRC is not on iff either C bit is set");
  FUZZ_CHECK(std::equal(reply->private_data.begin(), reply->private_data.end(), s.private_data.begin(),
                        s.private_data.end()),
             "Reply private data differs");
  if (!reply->enhanced) {
    FUZZ_CHECK(r.rtr == RtrType::none && !r.peer_to_peer, "RTR without an IRD/ORD block");
    return;
  }
  const IrdOrdBlock& block = *reply->enhanced;
  FUZZ_CHECK(block.peer_to_peer == req.peer_to_peer && r.peer_to_peer == req.peer_to_peer, "A bit not mirrored");
  const int rtr_bits = int{block.write_rtr} + int{block.read_rtr} + int{block.send_rtr};
  FUZZ_CHECK(rtr_bits == (req.peer_to_peer ? 1 : 0), "not exactly one RTR type selected");
  if (req.peer_to_peer) {
    const RtrType selected = block.write_rtr ? RtrType::write : block.read_rtr ? RtrType::read : RtrType::send;
    FUZZ_CHECK(r.rtr == selected, "result RTR differs from the Reply");
    FUZZ_CHECK(r.rtr != RtrType::send || s.config.responder_has_recv_posted, "Send RTR without a posted receive");
  }
  if (req.peer_ird != peercm::wire::kIrdOrdMax) FUZZ_CHECK(r.ord <= req.peer_ird, "responder ORD above the initiator's IRD");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  peercm::fuzz::Input in(data, size);
  const Setup setup = read_setup(in);
  const auto peer = in.rest();
  if (setup.responder) {
    run_responder(setup, peer);
  } else {
    run_initiator(setup, peer);
  }
  return 0;
}
