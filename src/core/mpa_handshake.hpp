// MPA connection setup (RFC 5044 §7.1, RFC 6581) as a sans-IO core: bytes and time in,
// bytes, deadlines and events out. One object per TCP connection and role.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "core/time.hpp"
#include "wire/mpa_frame.hpp"

namespace peercm::core {

enum class CrcPolicy : std::uint8_t {
  required,   // send C=1: CRC is on for the connection
  preferred,  // send C=1 as initiator; as responder follow the initiator's C bit
  off,        // send C=0: CRC is off unless the peer asks for it (RFC 5044 §7.1.1: comply)
};

// RFC 6581 §9.2 RTR message types.
enum class RtrType : std::uint8_t { none, write, read, send };

struct MpaConfig {
  CrcPolicy crc = CrcPolicy::preferred;
  bool enhanced = true;       // revision 2 with the IRD/ORD block; false: plain revision 1
  bool peer_to_peer = false;  // RFC 6581 A flag: negotiate an RTR
  std::uint16_t ird = 16;     // inbound RDMA Reads we can serve
  std::uint16_t ord = 16;     // outbound RDMA Reads we want to issue
  bool responder_has_recv_posted = false;  // responder may select a Send RTR only then
  Duration timeout = std::chrono::seconds(10);
};

// What both sides agreed on; handed to the queue-pair engine.
struct MpaResult {
  std::uint8_t revision = 2;
  bool crc = true;
  std::uint16_t ird = 0;  // ours, after negotiation
  std::uint16_t ord = 0;  // ours, after negotiation
  std::uint16_t peer_ird = 0;  // 0x3FFF ("ULP negotiates") when no IRD/ORD block was exchanged
  std::uint16_t peer_ord = 0;
  RtrType rtr = RtrType::none;  // the RTR the initiator sends first (p2p only)
  bool peer_to_peer = false;
  std::vector<std::uint8_t> peer_private_data;  // the ULP bytes after the IRD/ORD block
};

enum class MpaFailure : std::uint8_t {
  timeout,              // no complete frame before the deadline
  bad_frame,            // malformed frame (wire error in `wire_error`); MPA error 4
  markers_requested,    // peer asked for Markers, which peercm refuses
  crc_conflict,         // unused by RFC-conformant policies; kept for strict peers
  insufficient_ird,     // initiator cannot satisfy the responder's ORD: Terminate 2/0/6
  no_matching_rtr,      // no common RTR type: Terminate 2/0/7
  connection_closed,    // peer closed the TCP connection during setup
};

struct MpaEvent {
  enum class Kind : std::uint8_t {
    request_received,  // responder: a valid Request; call accept() or reject()
    established,       // both: full operation; `result` is filled
    rejected,          // initiator: the peer's ULP rejected; `result.peer_private_data` says why
    failed,            // both: setup failed; close the connection
  };
  Kind kind = Kind::failed;
  MpaResult result;
  MpaFailure failure = MpaFailure::bad_frame;
  std::optional<wire::WireError> wire_error;
  // Failures that RFC 6581 §8 answers with a Terminate before closing (2/0/6, 2/0/7).
  bool send_terminate = false;
};

// The most ULP private data one frame can carry: 512 bytes minus the RFC 6581 IRD/ORD block
// when the frame is enhanced (RFC 5044 §7.1, RFC 6581 §9). Private data above it makes the
// constructor / accept() / reject() fail locally with bad_frame + mpa_private_data_too_long.
constexpr std::size_t mpa_max_private_data(bool enhanced) {
  return wire::kMpaMaxPrivateData - (enhanced ? wire::kIrdOrdBlockSize : 0);
}

namespace detail {

// Storage for the one frame a handshake sends: fixed size, never reallocated.
class MpaTransmitBuffer {
 public:
  std::span<std::uint8_t> storage() { return bytes_; }
  void set_length(std::size_t n);
  std::span<const std::uint8_t> pending() const;
  void consume(std::size_t n);

 private:
  std::array<std::uint8_t, wire::kMpaMaxFrameSize> bytes_{};
  std::size_t length_ = 0;
  std::size_t sent_ = 0;
};

// FIFO of handshake events; a handshake emits at most two (request_received, then an end).
class MpaEventQueue {
 public:
  void push(MpaEvent event);
  std::optional<MpaEvent> pop();

 private:
  std::array<MpaEvent, 2> events_{};
  std::size_t head_ = 0;
  std::size_t count_ = 0;
};

}  // namespace detail

// The side that sends the MPA Request.
class MpaInitiator {
 public:
  // `private_data`: the ULP bytes for the Request (after any CM header the caller prepends).
  // More than mpa_max_private_data(config.enhanced) bytes (or IRD/ORD above 0x3FFF) fails at
  // once: a `failed`/bad_frame event with wire_error mpa_private_data_too_long and nothing to
  // send. With enhanced=false, peer_to_peer is ignored (RTRs need the RFC 6581 block).
  MpaInitiator(const MpaConfig& config, std::span<const std::uint8_t> private_data, Time now);

  // Bytes to write, in order; call consume_transmit() with what the socket took.
  std::span<const std::uint8_t> pending_transmit() const;
  void consume_transmit(std::size_t n);
  // Bytes from the peer. Returns how many were used: never more than the Reply frame, so the
  // caller hands what follows (the first FPDUs) to the queue-pair engine.
  std::size_t handle_bytes(std::span<const std::uint8_t> bytes);
  void handle_timeout(Time now);
  void handle_connection_closed();
  std::optional<Time> deadline() const;
  std::optional<MpaEvent> poll_event();
  bool finished() const;

 private:
  // RFC 5044 §7.1.2 Initiator: the Request is queued at construction, then we wait.
  enum class State : std::uint8_t { awaiting_reply, established, rejected, failed };

  void on_reply(const wire::MpaFrame& reply);
  void fail(MpaFailure failure, std::optional<wire::WireError> wire_error = std::nullopt,
            bool send_terminate = false);

  MpaConfig config_;
  State state_ = State::awaiting_reply;
  Time deadline_;
  bool sent_crc_ = true;        // C in our Request
  bool sent_enhanced_ = true;   // S in our Request
  bool sent_p2p_ = false;       // A (and B, C, D) in our Request
  MpaResult result_;
  wire::MpaFrameReader reader_{wire::MpaFrameKind::reply};
  detail::MpaTransmitBuffer transmit_;
  detail::MpaEventQueue events_;
};

// The side that receives the MPA Request. It follows the Request (RFC 6581 §5, §9.2): an
// enhanced Request gets a Rev 2 enhanced Reply, A=1 gets A=1 and one RTR type; so
// config.enhanced and config.peer_to_peer are not consulted here.
class MpaResponder {
 public:
  MpaResponder(const MpaConfig& config, Time now);

  std::size_t handle_bytes(std::span<const std::uint8_t> bytes);
  void handle_timeout(Time now);
  void handle_connection_closed();
  // After request_received: the ULP's answer. `ird`/`ord` are what the ULP wants (clamped
  // per RFC 6581 §9.1); the Reply is then pending for transmit.
  // accept() emits `established` at once; reject() emits nothing (the ULP knows). Called in any
  // other state (e.g. after a timeout) they do nothing. Private data above
  // max_private_data() or IRD/ORD above 0x3FFF fail the handshake locally (bad_frame).
  void accept(std::uint16_t ird, std::uint16_t ord, std::span<const std::uint8_t> private_data);
  void reject(std::span<const std::uint8_t> private_data);
  // The Request as received (valid after request_received): revision, its C bit as `crc`,
  // the initiator's IRD/ORD as peer_ird/peer_ord (0x3FFF when the Request had no IRD/ORD
  // block), its A flag as peer_to_peer, its private data; ird/ord are our configured values.
  const MpaResult& request() const;

  // The Reply, after accept()/reject() — or after a `failed` for a Request with M=1 (the R=1
  // Reply still goes out before the close).
  std::span<const std::uint8_t> pending_transmit() const;
  void consume_transmit(std::size_t n);
  std::optional<Time> deadline() const;
  std::optional<MpaEvent> poll_event();
  bool finished() const;
  // Most private data accept()/reject() can carry: depends on whether the Request was enhanced.
  std::size_t max_private_data() const { return mpa_max_private_data(request_enhanced_); }

 private:
  // RFC 5044 §7.1.2 Responder: wait for the Request, then for the ULP's answer.
  enum class State : std::uint8_t { awaiting_request, awaiting_ulp, established, rejected, failed };

  // What RFC 6581 §9.1/§9.2 negotiation gives for the ULP's ird/ord.
  struct Negotiated {
    std::uint16_t ird = 0;  // ours
    std::uint16_t ord = 0;  // ours
    RtrType rtr = RtrType::none;
    wire::IrdOrdBlock block;  // what the Reply carries
  };

  void on_request(const wire::MpaFrame& request);
  Negotiated negotiate(std::uint16_t ird, std::uint16_t ord) const;
  std::optional<wire::WireError> queue_reply(bool rejected, const Negotiated& negotiated,
                                             std::span<const std::uint8_t> private_data);
  bool reply_crc() const;
  void fail(MpaFailure failure, std::optional<wire::WireError> wire_error = std::nullopt);

  MpaConfig config_;
  State state_ = State::awaiting_request;
  Time deadline_;
  bool request_enhanced_ = false;  // S in the Request
  wire::IrdOrdBlock request_block_;  // valid when request_enhanced_
  MpaResult request_;
  wire::MpaFrameReader reader_{wire::MpaFrameKind::request};
  detail::MpaTransmitBuffer transmit_;
  detail::MpaEventQueue events_;
};

}  // namespace peercm::core
