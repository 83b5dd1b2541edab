// MPA connection setup (RFC 5044 §7.1, RFC 6581 §9): initiator and responder wired back to
// back in memory, plus hand-made frames for what a peercm peer would never send.
#include "core/mpa_handshake.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

namespace peercm::core {
namespace {

using namespace std::chrono_literals;
using wire::IrdOrdBlock;
using wire::kIrdOrdMax;
using wire::MpaFrame;
using wire::MpaFrameKind;
using wire::WireError;
using Bytes = std::vector<std::uint8_t>;

const Time kStart = Time{} + 100s;

Bytes bytes_of(std::string_view text) { return Bytes(text.begin(), text.end()); }

// What a socket would take: everything pending, gone from the core.
template <class Core>
Bytes take_transmit(Core& core) {
  const auto pending = core.pending_transmit();
  Bytes out(pending.begin(), pending.end());
  core.consume_transmit(out.size());
  return out;
}

template <class Core>
std::vector<MpaEvent> drain(Core& core) {
  std::vector<MpaEvent> events;
  while (auto event = core.poll_event()) events.push_back(std::move(*event));
  return events;
}

Bytes encode(const MpaFrame& frame) {
  Bytes out(wire::kMpaMaxFrameSize);
  auto n = wire::encode_mpa_frame(frame, out);
  EXPECT_TRUE(n.has_value());
  out.resize(n ? *n : 0);
  return out;
}

MpaFrame make_request(std::optional<IrdOrdBlock> block, bool crc = true, bool markers = false) {
  MpaFrame frame;
  frame.kind = MpaFrameKind::request;
  frame.crc = crc;
  frame.markers = markers;
  frame.revision = block ? 2 : 1;
  frame.enhanced = block;
  return frame;
}

MpaFrame make_reply(std::optional<IrdOrdBlock> block, bool crc = true, bool markers = false,
                    bool rejected = false) {
  MpaFrame frame = make_request(block, crc, markers);
  frame.kind = MpaFrameKind::reply;
  frame.rejected = rejected;
  return frame;
}

IrdOrdBlock p2p_block(bool send, bool write, bool read, std::uint16_t ird = 16,
                      std::uint16_t ord = 16) {
  return IrdOrdBlock{.peer_to_peer = true, .send_rtr = send, .write_rtr = write,
                     .read_rtr = read, .ird = ird, .ord = ord};
}

IrdOrdBlock cs_block(std::uint16_t ird, std::uint16_t ord) {
  return IrdOrdBlock{.ird = ird, .ord = ord};
}

// A readable one-line form of an event, so whole events compare in one EXPECT_EQ.
std::string describe(const MpaEvent& e) {
  std::ostringstream out;
  out << "kind=" << static_cast<int>(e.kind) << " failure=" << static_cast<int>(e.failure)
      << " wire=" << (e.wire_error ? std::string(wire::to_string(*e.wire_error)) : "-")
      << " term=" << e.send_terminate << " rev=" << int{e.result.revision}
      << " crc=" << e.result.crc << " ird=" << e.result.ird << " ord=" << e.result.ord
      << " peer_ird=" << e.result.peer_ird << " peer_ord=" << e.result.peer_ord
      << " rtr=" << static_cast<int>(e.result.rtr) << " p2p=" << e.result.peer_to_peer
      << " pd=" << std::string(e.result.peer_private_data.begin(), e.result.peer_private_data.end());
  return out.str();
}

MpaConfig config_with(CrcPolicy crc, bool p2p = false) {
  MpaConfig config;
  config.crc = crc;
  config.peer_to_peer = p2p;
  return config;
}

// Hands the initiator one frame (all at once) and returns its single event.
MpaEvent initiator_outcome(const MpaConfig& config, const Bytes& reply) {
  MpaInitiator initiator(config, {}, kStart);
  (void)take_transmit(initiator);
  EXPECT_EQ(initiator.handle_bytes(reply), reply.size());
  auto events = drain(initiator);
  EXPECT_EQ(events.size(), 1u);
  EXPECT_TRUE(initiator.finished());
  return events.empty() ? MpaEvent{} : events.front();
}

// A responder fed `request`; returns it for the test to answer.
struct FedResponder {
  explicit FedResponder(const MpaConfig& config, const Bytes& request)
      : responder(config, kStart) {
    EXPECT_EQ(responder.handle_bytes(request), request.size());
    events = drain(responder);
  }
  MpaResponder responder;
  std::vector<MpaEvent> events;
};

// Initiator and responder back to back: Request across, ULP accepts, Reply across.
struct Handshake {
  Handshake(const MpaConfig& initiator_config, const MpaConfig& responder_config,
            const Bytes& request_pd = {})
      : initiator(initiator_config, request_pd, kStart), responder(responder_config, kStart) {}

  // Returns the responder's events.
  std::vector<MpaEvent> send_request() {
    request = take_transmit(initiator);
    EXPECT_EQ(responder.handle_bytes(request), request.size());
    return drain(responder);
  }
  // Returns the initiator's events.
  std::vector<MpaEvent> send_reply() {
    reply = take_transmit(responder);
    EXPECT_EQ(initiator.handle_bytes(reply), reply.size());
    return drain(initiator);
  }
  // Runs the whole exchange; expects success and returns (initiator, responder) results.
  std::pair<MpaResult, MpaResult> accept(std::uint16_t ird, std::uint16_t ord,
                                         const Bytes& reply_pd = {}) {
    auto at_responder = send_request();
    EXPECT_EQ(at_responder.size(), 1u);
    EXPECT_EQ(at_responder.at(0).kind, MpaEvent::Kind::request_received);
    responder.accept(ird, ord, reply_pd);
    at_responder = drain(responder);
    EXPECT_EQ(at_responder.size(), 1u);
    EXPECT_EQ(at_responder.at(0).kind, MpaEvent::Kind::established) << describe(at_responder.at(0));
    auto at_initiator = send_reply();
    EXPECT_EQ(at_initiator.size(), 1u);
    EXPECT_EQ(at_initiator.at(0).kind, MpaEvent::Kind::established) << describe(at_initiator.at(0));
    return {at_initiator.at(0).result, at_responder.at(0).result};
  }

  MpaInitiator initiator;
  MpaResponder responder;
  Bytes request;
  Bytes reply;
};

// ---------------------------------------------------------------------------------------------
// Basic exchanges

TEST(MpaHandshake, Rev2DefaultAcceptCarriesPrivateDataBothWays) {
  Handshake h(MpaConfig{}, MpaConfig{}, bytes_of("hello"));
  auto at_responder = h.send_request();
  ASSERT_EQ(at_responder.size(), 1u);
  EXPECT_EQ(at_responder[0].kind, MpaEvent::Kind::request_received);
  EXPECT_EQ(at_responder[0].result.peer_private_data, bytes_of("hello"));
  EXPECT_EQ(h.responder.request().peer_private_data, bytes_of("hello"));
  EXPECT_EQ(h.responder.request().peer_ird, 16);
  EXPECT_EQ(h.responder.request().peer_ord, 16);
  EXPECT_FALSE(h.responder.finished());
  EXPECT_EQ(h.responder.max_private_data(), 508u);

  // The Request on the wire: Rev 2, S=1, C=1, M=0, A=0 (RFC 6581 §5, §9.2).
  auto request = wire::decode_mpa_frame(h.request, MpaFrameKind::request);
  ASSERT_TRUE(request.has_value());
  EXPECT_EQ(request->revision, 2);
  EXPECT_TRUE(request->crc);
  EXPECT_FALSE(request->markers);
  ASSERT_TRUE(request->enhanced.has_value());
  EXPECT_EQ(*request->enhanced, cs_block(16, 16));

  h.responder.accept(16, 16, bytes_of("world"));
  auto responder_events = drain(h.responder);
  ASSERT_EQ(responder_events.size(), 1u);
  EXPECT_EQ(responder_events[0].kind, MpaEvent::Kind::established);
  EXPECT_TRUE(h.responder.finished());
  EXPECT_FALSE(h.responder.deadline().has_value());
  const MpaResult& r = responder_events[0].result;
  EXPECT_EQ(r.revision, 2);
  EXPECT_TRUE(r.crc);
  EXPECT_EQ(r.ird, 16);
  EXPECT_EQ(r.ord, 16);
  EXPECT_EQ(r.peer_ird, 16);
  EXPECT_EQ(r.peer_ord, 16);
  EXPECT_EQ(r.rtr, RtrType::none);
  EXPECT_FALSE(r.peer_to_peer);
  EXPECT_EQ(r.peer_private_data, bytes_of("hello"));

  auto initiator_events = h.send_reply();
  ASSERT_EQ(initiator_events.size(), 1u);
  EXPECT_EQ(initiator_events[0].kind, MpaEvent::Kind::established);
  const MpaResult& i = initiator_events[0].result;
  EXPECT_EQ(i.revision, 2);
  EXPECT_TRUE(i.crc);
  EXPECT_EQ(i.ird, 16);
  EXPECT_EQ(i.ord, 16);
  EXPECT_EQ(i.peer_ird, 16);
  EXPECT_EQ(i.peer_ord, 16);
  EXPECT_EQ(i.rtr, RtrType::none);
  EXPECT_FALSE(i.peer_to_peer);
  EXPECT_EQ(i.peer_private_data, bytes_of("world"));
  EXPECT_TRUE(h.initiator.finished());
  EXPECT_FALSE(h.initiator.deadline().has_value());
  EXPECT_TRUE(h.initiator.pending_transmit().empty());
  EXPECT_TRUE(h.responder.pending_transmit().empty());

  auto reply = wire::decode_mpa_frame(h.reply, MpaFrameKind::reply);
  ASSERT_TRUE(reply.has_value());
  EXPECT_EQ(reply->revision, 2);
  EXPECT_FALSE(reply->rejected);
  EXPECT_FALSE(reply->markers);
  EXPECT_EQ(*reply->enhanced, cs_block(16, 16));
}

TEST(MpaHandshake, PendingTransmitDrainsInPieces) {
  MpaInitiator initiator(MpaConfig{}, bytes_of("abc"), kStart);
  const std::size_t total = initiator.pending_transmit().size();
  EXPECT_EQ(total, 20u + 4u + 3u);
  initiator.consume_transmit(5);
  EXPECT_EQ(initiator.pending_transmit().size(), total - 5);
  EXPECT_EQ(initiator.pending_transmit()[0], 'D');  // "MPA I|D Req Frame"
  initiator.consume_transmit(total - 5);
  EXPECT_TRUE(initiator.pending_transmit().empty());
}

TEST(MpaHandshake, Rev1ConfigSendsPlainFramesAndNegotiatesNothing) {
  MpaConfig plain;
  plain.enhanced = false;
  plain.peer_to_peer = true;  // ignored without the RFC 6581 block
  plain.ird = 3;
  plain.ord = 5;
  Handshake h(plain, MpaConfig{}, bytes_of("req"));
  auto [i, r] = h.accept(7, 9, bytes_of("rep"));

  auto request = wire::decode_mpa_frame(h.request, MpaFrameKind::request);
  ASSERT_TRUE(request.has_value());
  EXPECT_EQ(request->revision, 1);
  EXPECT_FALSE(request->enhanced.has_value());
  auto reply = wire::decode_mpa_frame(h.reply, MpaFrameKind::reply);
  ASSERT_TRUE(reply.has_value());
  EXPECT_EQ(reply->revision, 1);  // unenhanced Request => unenhanced Rev 1 Reply
  EXPECT_FALSE(reply->enhanced.has_value());

  EXPECT_EQ(i.revision, 1);
  EXPECT_EQ(i.ird, 3);
  EXPECT_EQ(i.ord, 5);
  EXPECT_EQ(i.peer_ird, kIrdOrdMax);
  EXPECT_EQ(i.peer_ord, kIrdOrdMax);
  EXPECT_EQ(i.rtr, RtrType::none);
  EXPECT_FALSE(i.peer_to_peer);
  EXPECT_EQ(i.peer_private_data, bytes_of("rep"));

  EXPECT_EQ(r.revision, 1);
  EXPECT_EQ(r.ird, 7);  // what the ULP passed, nothing to clamp against
  EXPECT_EQ(r.ord, 9);
  EXPECT_EQ(r.peer_ird, kIrdOrdMax);
  EXPECT_EQ(r.peer_ord, kIrdOrdMax);
  EXPECT_EQ(r.rtr, RtrType::none);
  EXPECT_FALSE(r.peer_to_peer);
  EXPECT_EQ(r.peer_private_data, bytes_of("req"));
  EXPECT_EQ(h.responder.max_private_data(), 512u);
}

TEST(MpaHandshake, ResponderAnswersRev2RequestWithoutBlockWithRev1) {
  MpaFrame request = make_request(std::nullopt);
  request.revision = 2;  // Rev 2, S=0: legal, no enhanced feature
  FedResponder fed(MpaConfig{}, encode(request));
  ASSERT_EQ(fed.events.size(), 1u);
  fed.responder.accept(1, 1, {});
  const Bytes reply_bytes = take_transmit(fed.responder);
  auto reply = wire::decode_mpa_frame(reply_bytes, MpaFrameKind::reply);
  ASSERT_TRUE(reply.has_value());
  EXPECT_EQ(reply->revision, 1);
  EXPECT_FALSE(reply->enhanced.has_value());
}

TEST(MpaHandshake, InitiatorFallsBackOnRev1Reply) {
  MpaConfig config = config_with(CrcPolicy::preferred, /*p2p=*/true);
  config.ird = 4;
  config.ord = 6;
  MpaFrame reply = make_reply(std::nullopt, /*crc=*/false);
  const Bytes pd = bytes_of("old peer");
  reply.private_data = pd;
  MpaEvent e = initiator_outcome(config, encode(reply));
  EXPECT_EQ(e.kind, MpaEvent::Kind::established) << describe(e);
  EXPECT_EQ(e.result.revision, 1);
  EXPECT_TRUE(e.result.crc);  // our Request had C=1
  EXPECT_EQ(e.result.ird, 4);
  EXPECT_EQ(e.result.ord, 6);
  EXPECT_EQ(e.result.peer_ird, kIrdOrdMax);
  EXPECT_EQ(e.result.peer_ord, kIrdOrdMax);
  EXPECT_EQ(e.result.rtr, RtrType::none);
  EXPECT_FALSE(e.result.peer_to_peer);
  EXPECT_EQ(e.result.peer_private_data, pd);
}

TEST(MpaHandshake, InitiatorRefusesEnhancedReplyToRev1Request) {
  MpaConfig config;
  config.enhanced = false;
  MpaEvent e = initiator_outcome(config, encode(make_reply(cs_block(1, 1))));
  EXPECT_EQ(e.kind, MpaEvent::Kind::failed);
  EXPECT_EQ(e.failure, MpaFailure::bad_frame);
  EXPECT_EQ(e.wire_error, WireError::mpa_bad_revision);
}

// ---------------------------------------------------------------------------------------------
// CRC (RFC 5044 §7.1.1): on iff C=1 in either frame

class MpaCrcMatrix : public ::testing::TestWithParam<std::tuple<CrcPolicy, CrcPolicy>> {};

TEST_P(MpaCrcMatrix, CrcOnIffEitherFrameHasC) {
  const auto [initiator_policy, responder_policy] = GetParam();
  const bool initiator_c = initiator_policy != CrcPolicy::off;
  const bool responder_c = responder_policy == CrcPolicy::required ||
                           (responder_policy == CrcPolicy::preferred && initiator_c);
  Handshake h(config_with(initiator_policy), config_with(responder_policy));
  auto [i, r] = h.accept(16, 16);
  EXPECT_EQ(wire::decode_mpa_frame(h.request, MpaFrameKind::request)->crc, initiator_c);
  EXPECT_EQ(wire::decode_mpa_frame(h.reply, MpaFrameKind::reply)->crc, responder_c);
  EXPECT_EQ(i.crc, initiator_c || responder_c);
  EXPECT_EQ(r.crc, initiator_c || responder_c);
  // Only off/off (and off/preferred, which follows the initiator) turn CRC off.
  EXPECT_EQ(i.crc, !(initiator_policy == CrcPolicy::off && responder_policy != CrcPolicy::required));
}

INSTANTIATE_TEST_SUITE_P(
    MpaAllPolicies, MpaCrcMatrix,
    ::testing::Combine(::testing::Values(CrcPolicy::required, CrcPolicy::preferred, CrcPolicy::off),
                       ::testing::Values(CrcPolicy::required, CrcPolicy::preferred, CrcPolicy::off)),
    [](const auto& test_param) {
      const auto name = [](CrcPolicy p) {
        return p == CrcPolicy::required ? "required" : p == CrcPolicy::preferred ? "preferred" : "off";
      };
      return std::string("initiator_") + name(std::get<0>(test_param.param)) + "_responder_" +
             name(std::get<1>(test_param.param));
    });

// ---------------------------------------------------------------------------------------------
// Markers: refused both ways

TEST(MpaHandshake, MarkersInEnhancedRequestAreRejectedWithRev2Reply) {
  FedResponder fed(MpaConfig{}, encode(make_request(p2p_block(true, true, true), true, /*markers=*/true)));
  ASSERT_EQ(fed.events.size(), 1u);
  EXPECT_EQ(fed.events[0].kind, MpaEvent::Kind::failed);
  EXPECT_EQ(fed.events[0].failure, MpaFailure::markers_requested);
  EXPECT_FALSE(fed.events[0].send_terminate);
  EXPECT_TRUE(fed.responder.finished());
  EXPECT_FALSE(fed.responder.deadline().has_value());
  const Bytes reply_bytes = take_transmit(fed.responder);
  auto reply = wire::decode_mpa_frame(reply_bytes, MpaFrameKind::reply);
  ASSERT_TRUE(reply.has_value());
  EXPECT_TRUE(reply->rejected);
  EXPECT_FALSE(reply->markers);
  EXPECT_EQ(reply->revision, 2);
  ASSERT_TRUE(reply->enhanced.has_value());
  EXPECT_TRUE(reply->enhanced->peer_to_peer);  // RFC 6581 §9.2: A echoed even when rejecting
  // A late accept changes nothing.
  fed.responder.accept(1, 1, {});
  EXPECT_TRUE(fed.responder.pending_transmit().empty());
  EXPECT_FALSE(fed.responder.poll_event().has_value());
}

TEST(MpaHandshake, MarkersInPlainRequestAreRejectedWithRev1Reply) {
  FedResponder fed(MpaConfig{}, encode(make_request(std::nullopt, true, /*markers=*/true)));
  ASSERT_EQ(fed.events.size(), 1u);
  EXPECT_EQ(fed.events[0].failure, MpaFailure::markers_requested);
  const Bytes reply_bytes = take_transmit(fed.responder);
  auto reply = wire::decode_mpa_frame(reply_bytes, MpaFrameKind::reply);
  ASSERT_TRUE(reply.has_value());
  EXPECT_TRUE(reply->rejected);
  EXPECT_FALSE(reply->markers);
  EXPECT_EQ(reply->revision, 1);
  EXPECT_FALSE(reply->enhanced.has_value());
}

TEST(MpaHandshake, MarkersInReplyFailTheInitiator) {
  MpaEvent e = initiator_outcome(MpaConfig{}, encode(make_reply(cs_block(16, 16), true, /*markers=*/true)));
  EXPECT_EQ(e.kind, MpaEvent::Kind::failed);
  EXPECT_EQ(e.failure, MpaFailure::markers_requested);
  EXPECT_FALSE(e.wire_error.has_value());
}

// ---------------------------------------------------------------------------------------------
// IRD/ORD (RFC 6581 §9.1)

TEST(MpaIrdOrd, ResponderOrdIsClampedToInitiatorIrd) {
  MpaConfig initiator;
  initiator.ird = 4;
  initiator.ord = 8;
  Handshake h(initiator, MpaConfig{});
  auto [i, r] = h.accept(/*ird=*/2, /*ord=*/10);
  EXPECT_EQ(r.ord, 4);  // <= initiator IRD
  EXPECT_EQ(r.ird, 2);  // what the ULP provides
  EXPECT_EQ(r.peer_ird, 4);
  EXPECT_EQ(r.peer_ord, 8);
  EXPECT_EQ(*wire::decode_mpa_frame(h.reply, MpaFrameKind::reply)->enhanced, cs_block(2, 4));
  EXPECT_EQ(i.ird, 4);  // >= responder ORD 4
  EXPECT_EQ(i.ord, 2);  // <= responder IRD 2
  EXPECT_EQ(i.peer_ird, 2);
  EXPECT_EQ(i.peer_ord, 4);
}

TEST(MpaIrdOrd, UnclampedValuesPassThrough) {
  MpaConfig initiator;
  initiator.ird = 10;
  initiator.ord = 3;
  Handshake h(initiator, MpaConfig{});
  auto [i, r] = h.accept(/*ird=*/5, /*ord=*/7);
  EXPECT_EQ(r.ird, 5);
  EXPECT_EQ(r.ord, 7);
  EXPECT_EQ(i.ird, 10);
  EXPECT_EQ(i.ord, 3);
}

TEST(MpaIrdOrd, InitiatorOrd3FFFMeansResponderKeepsIrdAndRepliesIrd3FFF) {
  MpaConfig initiator;
  initiator.ird = 4;
  initiator.ord = kIrdOrdMax;
  Handshake h(initiator, MpaConfig{});
  auto [i, r] = h.accept(/*ird=*/6, /*ord=*/2);
  EXPECT_EQ(*wire::decode_mpa_frame(h.reply, MpaFrameKind::reply)->enhanced, cs_block(kIrdOrdMax, 2));
  EXPECT_EQ(r.ird, 6);
  EXPECT_EQ(r.ord, 2);
  EXPECT_EQ(i.ord, kIrdOrdMax);  // Reply IRD 0x3FFF: leave our ORD unchanged
  EXPECT_EQ(i.ird, 4);
  EXPECT_EQ(i.peer_ird, kIrdOrdMax);
}

TEST(MpaIrdOrd, InitiatorIrd3FFFMeansResponderKeepsOrdAndRepliesOrd3FFF) {
  MpaConfig initiator;
  initiator.ird = kIrdOrdMax;
  initiator.ord = 4;
  Handshake h(initiator, MpaConfig{});
  auto [i, r] = h.accept(/*ird=*/6, /*ord=*/100);
  EXPECT_EQ(*wire::decode_mpa_frame(h.reply, MpaFrameKind::reply)->enhanced, cs_block(6, kIrdOrdMax));
  EXPECT_EQ(r.ord, 100);  // not clamped: the ULPs negotiate
  EXPECT_EQ(r.ird, 6);
  EXPECT_EQ(i.ird, kIrdOrdMax);  // Reply ORD 0x3FFF: leave our IRD unchanged
  EXPECT_EQ(i.ord, 4);
}

TEST(MpaIrdOrd, ReplyOrd3FFFNeverCountsAsInsufficientIrd) {
  MpaConfig config;
  config.ird = 2;
  config.ord = 2;
  MpaEvent e = initiator_outcome(config, encode(make_reply(cs_block(1, kIrdOrdMax))));
  EXPECT_EQ(e.kind, MpaEvent::Kind::established) << describe(e);
  EXPECT_EQ(e.result.ird, 2);
  EXPECT_EQ(e.result.ord, 1);
}

TEST(MpaIrdOrd, ReplyIrd3FFFLeavesInitiatorOrd) {
  MpaConfig config;
  config.ird = 2;
  config.ord = 9;
  MpaEvent e = initiator_outcome(config, encode(make_reply(cs_block(kIrdOrdMax, 2))));
  EXPECT_EQ(e.kind, MpaEvent::Kind::established) << describe(e);
  EXPECT_EQ(e.result.ord, 9);
  EXPECT_EQ(e.result.ird, 2);
}

TEST(MpaIrdOrd, InsufficientIrdFailsWithTerminate) {
  MpaConfig config;
  config.ird = 4;
  MpaEvent e = initiator_outcome(config, encode(make_reply(cs_block(16, 8))));
  EXPECT_EQ(e.kind, MpaEvent::Kind::failed);
  EXPECT_EQ(e.failure, MpaFailure::insufficient_ird);
  EXPECT_TRUE(e.send_terminate);  // Terminate 2/0/6
  EXPECT_EQ(e.result.peer_ord, 8);
  EXPECT_EQ(e.result.peer_ird, 16);
}

TEST(MpaIrdOrd, ResponderOrdEqualToInitiatorIrdIsEnough) {
  MpaConfig config;
  config.ird = 4;
  MpaEvent e = initiator_outcome(config, encode(make_reply(cs_block(16, 4))));
  EXPECT_EQ(e.kind, MpaEvent::Kind::established) << describe(e);
  EXPECT_EQ(e.result.ird, 4);
}

TEST(MpaIrdOrd, ResponderIrdAbove14BitsFailsLocally) {
  FedResponder fed(MpaConfig{}, encode(make_request(cs_block(4, 4))));
  fed.responder.accept(0x4000, 1, {});
  auto events = drain(fed.responder);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].failure, MpaFailure::bad_frame);
  EXPECT_EQ(events[0].wire_error, WireError::mpa_ird_ord_out_of_range);
  EXPECT_TRUE(fed.responder.pending_transmit().empty());
}

// ---------------------------------------------------------------------------------------------
// RTR negotiation (RFC 6581 §9.2, docs/p2p.md R9)

TEST(MpaRtr, PeerToPeerBackToBackSelectsWrite) {
  Handshake h(config_with(CrcPolicy::preferred, true), MpaConfig{});
  auto [i, r] = h.accept(16, 16);
  auto request = wire::decode_mpa_frame(h.request, MpaFrameKind::request);
  EXPECT_EQ(*request->enhanced, p2p_block(true, true, true));  // all three offered
  auto reply = wire::decode_mpa_frame(h.reply, MpaFrameKind::reply);
  EXPECT_EQ(*reply->enhanced, p2p_block(false, true, false));  // exactly one selected
  EXPECT_EQ(i.rtr, RtrType::write);
  EXPECT_EQ(r.rtr, RtrType::write);
  EXPECT_TRUE(i.peer_to_peer);
  EXPECT_TRUE(r.peer_to_peer);
}

TEST(MpaRtr, ClientServerRequestGetsClientServerReply) {
  // A=0 with stray B/C/D: they are ignored on receipt (RFC 6581 §9.2).
  IrdOrdBlock block = p2p_block(true, true, true);
  block.peer_to_peer = false;
  FedResponder fed(MpaConfig{}, encode(make_request(block)));
  EXPECT_FALSE(fed.responder.request().peer_to_peer);
  fed.responder.accept(16, 16, {});
  auto events = drain(fed.responder);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].result.rtr, RtrType::none);
  EXPECT_FALSE(events[0].result.peer_to_peer);
  const Bytes reply_bytes = take_transmit(fed.responder);
  EXPECT_EQ(*wire::decode_mpa_frame(reply_bytes, MpaFrameKind::reply)->enhanced, cs_block(16, 16));
}

// Responder selection: (offered send, write, read, recv posted) -> selected.
struct ResponderRtrCase {
  bool send, write, read, recv_posted;
  RtrType expected;
};

class MpaResponderRtr : public ::testing::TestWithParam<ResponderRtrCase> {};

TEST_P(MpaResponderRtr, SelectsExactlyOneType) {
  const ResponderRtrCase c = GetParam();
  MpaConfig config;
  config.responder_has_recv_posted = c.recv_posted;
  FedResponder fed(config, encode(make_request(p2p_block(c.send, c.write, c.read))));
  ASSERT_EQ(fed.events.size(), 1u);
  EXPECT_TRUE(fed.responder.request().peer_to_peer);
  fed.responder.accept(16, 16, {});
  auto events = drain(fed.responder);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, MpaEvent::Kind::established);
  EXPECT_EQ(events[0].result.rtr, c.expected);
  EXPECT_TRUE(events[0].result.peer_to_peer);
  const Bytes reply_bytes = take_transmit(fed.responder);
  auto reply = wire::decode_mpa_frame(reply_bytes, MpaFrameKind::reply);
  ASSERT_TRUE(reply.has_value());
  const IrdOrdBlock& b = *reply->enhanced;
  EXPECT_TRUE(b.peer_to_peer);
  EXPECT_EQ(int{b.send_rtr} + int{b.write_rtr} + int{b.read_rtr}, 1);
  EXPECT_EQ(b.write_rtr, c.expected == RtrType::write);
  EXPECT_EQ(b.read_rtr, c.expected == RtrType::read);
  EXPECT_EQ(b.send_rtr, c.expected == RtrType::send);
}

// When nothing offered is acceptable the responder still names one type it supports (Write,
// RFC 6581 §9.2); the initiator then finds no common type.
INSTANTIATE_TEST_SUITE_P(
    MpaMatrix, MpaResponderRtr,
    ::testing::Values(
        ResponderRtrCase{false, false, false, false, RtrType::write},
        ResponderRtrCase{false, false, false, true, RtrType::write},
        ResponderRtrCase{true, false, false, false, RtrType::write},
        ResponderRtrCase{true, false, false, true, RtrType::send},
        ResponderRtrCase{false, true, false, false, RtrType::write},
        ResponderRtrCase{false, true, false, true, RtrType::write},
        ResponderRtrCase{true, true, false, false, RtrType::write},
        ResponderRtrCase{true, true, false, true, RtrType::write},
        ResponderRtrCase{false, false, true, false, RtrType::read},
        ResponderRtrCase{false, false, true, true, RtrType::read},
        ResponderRtrCase{true, false, true, false, RtrType::read},
        ResponderRtrCase{true, false, true, true, RtrType::read},
        ResponderRtrCase{false, true, true, false, RtrType::write},
        ResponderRtrCase{false, true, true, true, RtrType::write},
        ResponderRtrCase{true, true, true, false, RtrType::write},
        ResponderRtrCase{true, true, true, true, RtrType::write}),
    [](const auto& test_param) {
      const ResponderRtrCase& c = test_param.param;
      return std::string("offer_") + (c.send ? "S" : "") + (c.write ? "W" : "") + (c.read ? "R" : "") +
             (c.send || c.write || c.read ? "" : "none") + (c.recv_posted ? "_recv" : "_norecv");
    });

// Initiator choice: (Reply's send, write, read) -> chosen, none = Terminate 2/0/7.
struct InitiatorRtrCase {
  bool send, write, read;
  RtrType expected;
};

class MpaInitiatorRtr : public ::testing::TestWithParam<InitiatorRtrCase> {};

TEST_P(MpaInitiatorRtr, PicksCommonTypeWritePreferred) {
  const InitiatorRtrCase c = GetParam();
  MpaEvent e = initiator_outcome(config_with(CrcPolicy::preferred, true),
                                 encode(make_reply(p2p_block(c.send, c.write, c.read))));
  if (c.expected == RtrType::none) {
    EXPECT_EQ(e.kind, MpaEvent::Kind::failed);
    EXPECT_EQ(e.failure, MpaFailure::no_matching_rtr);
    EXPECT_TRUE(e.send_terminate);
  } else {
    EXPECT_EQ(e.kind, MpaEvent::Kind::established) << describe(e);
    EXPECT_EQ(e.result.rtr, c.expected);
    EXPECT_TRUE(e.result.peer_to_peer);
    EXPECT_FALSE(e.send_terminate);
  }
}

INSTANTIATE_TEST_SUITE_P(
    MpaMatrix, MpaInitiatorRtr,
    ::testing::Values(InitiatorRtrCase{false, false, false, RtrType::none},
                      InitiatorRtrCase{true, false, false, RtrType::send},
                      InitiatorRtrCase{false, true, false, RtrType::write},
                      InitiatorRtrCase{false, false, true, RtrType::read},
                      InitiatorRtrCase{true, true, false, RtrType::write},
                      InitiatorRtrCase{true, false, true, RtrType::read},
                      InitiatorRtrCase{false, true, true, RtrType::write},
                      InitiatorRtrCase{true, true, true, RtrType::write}),
    [](const auto& test_param) {
      const InitiatorRtrCase& c = test_param.param;
      return std::string("reply_") + (c.send ? "S" : "") + (c.write ? "W" : "") + (c.read ? "R" : "") +
             (c.send || c.write || c.read ? "" : "none");
    });

TEST(MpaRtr, ReplyWithoutPeerToPeerFlagFallsBackToClientServer) {
  // A responder that knows only the client-server model answers A=0: no RTR, no Terminate.
  MpaEvent e = initiator_outcome(config_with(CrcPolicy::preferred, true), encode(make_reply(cs_block(16, 16))));
  EXPECT_EQ(e.kind, MpaEvent::Kind::established) << describe(e);
  EXPECT_EQ(e.result.rtr, RtrType::none);
  EXPECT_FALSE(e.result.peer_to_peer);
  EXPECT_FALSE(e.send_terminate);
}

TEST(MpaRtr, ClientServerInitiatorIgnoresPeerToPeerReply) {
  MpaEvent e = initiator_outcome(MpaConfig{}, encode(make_reply(p2p_block(false, true, false))));
  EXPECT_EQ(e.kind, MpaEvent::Kind::established);
  EXPECT_EQ(e.result.rtr, RtrType::none);
  EXPECT_FALSE(e.result.peer_to_peer);
}

TEST(MpaRtr, ReadRtrRaisesResponderIrdAndInitiatorOrdToOne) {
  // Responder: only Read offered, initiator ORD 0, ULP asks for IRD 0.
  FedResponder fed(MpaConfig{}, encode(make_request(p2p_block(false, false, true, /*ird=*/4, /*ord=*/0))));
  fed.responder.accept(/*ird=*/0, /*ord=*/0, {});
  auto events = drain(fed.responder);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].result.rtr, RtrType::read);
  EXPECT_EQ(events[0].result.ird, 1);
  const Bytes reply = take_transmit(fed.responder);
  EXPECT_EQ(wire::decode_mpa_frame(reply, MpaFrameKind::reply)->enhanced->ird, 1);

  // Initiator with ORD 0 choosing Read: its ORD becomes 1.
  MpaConfig config = config_with(CrcPolicy::preferred, true);
  config.ord = 0;
  MpaEvent e = initiator_outcome(config, encode(make_reply(p2p_block(false, false, true, /*ird=*/1, /*ord=*/0))));
  EXPECT_EQ(e.kind, MpaEvent::Kind::established) << describe(e);
  EXPECT_EQ(e.result.rtr, RtrType::read);
  EXPECT_EQ(e.result.ord, 1);
}

TEST(MpaRtr, ReadRtrUnusableWhenResponderIrdIsZero) {
  // Read only, responder IRD 0: a zero-length Read would overrun it.
  MpaEvent e = initiator_outcome(config_with(CrcPolicy::preferred, true),
                                 encode(make_reply(p2p_block(false, false, true, /*ird=*/0, /*ord=*/0))));
  EXPECT_EQ(e.failure, MpaFailure::no_matching_rtr);
  // With Send also offered, Send is used instead.
  e = initiator_outcome(config_with(CrcPolicy::preferred, true),
                        encode(make_reply(p2p_block(true, false, true, /*ird=*/0, /*ord=*/0))));
  EXPECT_EQ(e.kind, MpaEvent::Kind::established);
  EXPECT_EQ(e.result.rtr, RtrType::send);
}

// ---------------------------------------------------------------------------------------------
// Reject, timeouts, close

TEST(MpaHandshake, RejectCarriesPrivateDataAndIrdOrd) {
  MpaConfig responder_config;
  responder_config.ird = 3;
  responder_config.ord = 2;
  Handshake h(config_with(CrcPolicy::preferred, true), responder_config, bytes_of("hi"));
  ASSERT_EQ(h.send_request().size(), 1u);
  h.responder.reject(bytes_of("p2p collision"));
  EXPECT_TRUE(h.responder.finished());
  EXPECT_FALSE(h.responder.deadline().has_value());
  EXPECT_FALSE(h.responder.poll_event().has_value());
  h.responder.accept(1, 1, {});  // too late: no-op
  auto events = h.send_reply();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, MpaEvent::Kind::rejected);
  EXPECT_EQ(events[0].result.peer_private_data, bytes_of("p2p collision"));
  EXPECT_EQ(events[0].result.peer_ird, 3);
  EXPECT_EQ(events[0].result.peer_ord, 2);
  EXPECT_TRUE(h.initiator.finished());
  EXPECT_FALSE(h.initiator.deadline().has_value());
  auto reply = wire::decode_mpa_frame(h.reply, MpaFrameKind::reply);
  EXPECT_TRUE(reply->rejected);
  EXPECT_EQ(reply->revision, 2);
  EXPECT_TRUE(reply->enhanced->peer_to_peer);
}

TEST(MpaHandshake, RejectOfPlainRequestIsPlain) {
  MpaConfig plain;
  plain.enhanced = false;
  Handshake h(plain, MpaConfig{});
  ASSERT_EQ(h.send_request().size(), 1u);
  h.responder.reject(bytes_of("no"));
  auto events = h.send_reply();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, MpaEvent::Kind::rejected);
  EXPECT_EQ(events[0].result.peer_private_data, bytes_of("no"));
  EXPECT_EQ(wire::decode_mpa_frame(h.reply, MpaFrameKind::reply)->revision, 1);
}

TEST(MpaTimeout, InitiatorWithoutReplyTimesOut) {
  MpaConfig config;
  config.timeout = 3s;
  MpaInitiator initiator(config, {}, kStart);
  ASSERT_EQ(initiator.deadline(), kStart + 3s);
  initiator.handle_timeout(kStart + 3s - 1ns);
  EXPECT_FALSE(initiator.poll_event().has_value());
  EXPECT_FALSE(initiator.finished());
  initiator.handle_timeout(kStart + 3s);
  auto event = initiator.poll_event();
  ASSERT_TRUE(event.has_value());
  EXPECT_EQ(event->kind, MpaEvent::Kind::failed);
  EXPECT_EQ(event->failure, MpaFailure::timeout);
  EXPECT_TRUE(initiator.finished());
  EXPECT_FALSE(initiator.deadline().has_value());
  initiator.handle_timeout(kStart + 10s);
  EXPECT_FALSE(initiator.poll_event().has_value());
  // A Reply arriving now is not consumed.
  const Bytes reply = encode(make_reply(cs_block(1, 1)));
  EXPECT_EQ(initiator.handle_bytes(reply), 0u);
  EXPECT_FALSE(initiator.poll_event().has_value());
}

TEST(MpaTimeout, ResponderWithoutRequestTimesOut) {
  MpaConfig config;
  config.timeout = 2s;
  MpaResponder responder(config, kStart);
  ASSERT_EQ(responder.deadline(), kStart + 2s);
  responder.handle_timeout(kStart + 1s);
  EXPECT_FALSE(responder.poll_event().has_value());
  responder.handle_timeout(kStart + 5s);
  auto event = responder.poll_event();
  ASSERT_TRUE(event.has_value());
  EXPECT_EQ(event->failure, MpaFailure::timeout);
  EXPECT_FALSE(responder.deadline().has_value());
  EXPECT_TRUE(responder.pending_transmit().empty());
}

TEST(MpaTimeout, ResponderWaitingForUlpTimesOutAndIgnoresLateAccept) {
  MpaConfig config;
  config.timeout = 2s;
  FedResponder fed(config, encode(make_request(cs_block(1, 1))));
  ASSERT_EQ(fed.events.size(), 1u);
  EXPECT_EQ(fed.responder.deadline(), kStart + 2s);  // still bounded while the ULP decides
  fed.responder.handle_timeout(kStart + 2s);
  auto events = drain(fed.responder);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].failure, MpaFailure::timeout);
  fed.responder.accept(1, 1, {});
  EXPECT_TRUE(fed.responder.pending_transmit().empty());
  EXPECT_FALSE(fed.responder.poll_event().has_value());
}

TEST(MpaClose, ConnectionClosedDuringSetupFailsBothRoles) {
  MpaInitiator initiator(MpaConfig{}, {}, kStart);
  initiator.handle_connection_closed();
  auto event = initiator.poll_event();
  ASSERT_TRUE(event.has_value());
  EXPECT_EQ(event->failure, MpaFailure::connection_closed);
  EXPECT_FALSE(initiator.deadline().has_value());

  MpaResponder responder(MpaConfig{}, kStart);
  responder.handle_connection_closed();
  event = responder.poll_event();
  ASSERT_TRUE(event.has_value());
  EXPECT_EQ(event->failure, MpaFailure::connection_closed);

  FedResponder fed(MpaConfig{}, encode(make_request(cs_block(1, 1))));
  fed.responder.handle_connection_closed();
  auto events = drain(fed.responder);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].failure, MpaFailure::connection_closed);
}

TEST(MpaClose, CloseAfterEstablishedIsNotAnMpaEvent) {
  Handshake h(MpaConfig{}, MpaConfig{});
  (void)h.accept(16, 16);
  h.initiator.handle_connection_closed();
  h.responder.handle_connection_closed();
  h.initiator.handle_timeout(kStart + 1h);
  h.responder.handle_timeout(kStart + 1h);
  EXPECT_FALSE(h.initiator.poll_event().has_value());
  EXPECT_FALSE(h.responder.poll_event().has_value());
}

// ---------------------------------------------------------------------------------------------
// Private data limits

TEST(MpaPrivateData, LimitIs512IncludingTheIrdOrdBlock) {
  EXPECT_EQ(mpa_max_private_data(true), 508u);
  EXPECT_EQ(mpa_max_private_data(false), 512u);

  const Bytes fits(508, 0xAB);
  MpaInitiator ok(MpaConfig{}, fits, kStart);
  EXPECT_EQ(ok.pending_transmit().size(), 20u + 512u);
  EXPECT_FALSE(ok.poll_event().has_value());

  const Bytes too_long(509, 0xAB);
  MpaInitiator bad(MpaConfig{}, too_long, kStart);
  EXPECT_TRUE(bad.pending_transmit().empty());
  EXPECT_TRUE(bad.finished());
  EXPECT_FALSE(bad.deadline().has_value());
  auto event = bad.poll_event();
  ASSERT_TRUE(event.has_value());
  EXPECT_EQ(event->kind, MpaEvent::Kind::failed);
  EXPECT_EQ(event->failure, MpaFailure::bad_frame);
  EXPECT_EQ(event->wire_error, WireError::mpa_private_data_too_long);

  MpaConfig plain;
  plain.enhanced = false;
  MpaInitiator plain_ok(plain, Bytes(512, 1), kStart);
  EXPECT_EQ(plain_ok.pending_transmit().size(), 20u + 512u);
  MpaInitiator plain_bad(plain, Bytes(513, 1), kStart);
  EXPECT_TRUE(plain_bad.pending_transmit().empty());
  EXPECT_EQ(plain_bad.poll_event()->wire_error, WireError::mpa_private_data_too_long);
}

TEST(MpaPrivateData, OversizedAcceptOrRejectFailsLocally) {
  for (const bool accepting : {true, false}) {
    FedResponder fed(MpaConfig{}, encode(make_request(cs_block(1, 1))));
    ASSERT_EQ(fed.events.size(), 1u);
    const Bytes too_long(fed.responder.max_private_data() + 1, 0x55);
    if (accepting) {
      fed.responder.accept(1, 1, too_long);
    } else {
      fed.responder.reject(too_long);
    }
    auto events = drain(fed.responder);
    ASSERT_EQ(events.size(), 1u);
    EXPECT_EQ(events[0].kind, MpaEvent::Kind::failed);
    EXPECT_EQ(events[0].failure, MpaFailure::bad_frame);
    EXPECT_EQ(events[0].wire_error, WireError::mpa_private_data_too_long);
    EXPECT_TRUE(fed.responder.pending_transmit().empty());
    EXPECT_TRUE(fed.responder.finished());
  }
}

TEST(MpaPrivateData, MaximalPrivateDataCrossesIntact) {
  Bytes request_pd(508);
  Bytes reply_pd(508);
  for (std::size_t k = 0; k < 508; ++k) {
    request_pd[k] = static_cast<std::uint8_t>(k);
    reply_pd[k] = static_cast<std::uint8_t>(255 - k % 256);
  }
  Handshake h(MpaConfig{}, MpaConfig{}, request_pd);
  auto [i, r] = h.accept(16, 16, reply_pd);
  EXPECT_EQ(r.peer_private_data, request_pd);
  EXPECT_EQ(i.peer_private_data, reply_pd);
}

// ---------------------------------------------------------------------------------------------
// Malformed frames (RFC 5044 §7.1.2: close, report locally; MPA error 4)

Bytes with_byte(Bytes frame, std::size_t offset, std::uint8_t value) {
  frame.at(offset) = value;
  return frame;
}

struct MalformedCase {
  const char* name;
  Bytes frame;
  WireError expected;
};

std::vector<MalformedCase> malformed_replies() {
  const Bytes good = encode(make_reply(cs_block(16, 16)));
  return {
      {"request key", encode(make_request(cs_block(16, 16))), WireError::mpa_bad_key},
      {"garbage key", with_byte(good, 0, 'X'), WireError::mpa_bad_key},
      {"revision 0", with_byte(good, 17, 0), WireError::mpa_bad_revision},
      {"revision 3", with_byte(good, 17, 3), WireError::mpa_bad_revision},
      {"reserved bits", with_byte(good, 16, static_cast<std::uint8_t>(good[16] | 0x01)),
       WireError::mpa_reserved_bits_set},
      {"PD_Length 513", with_byte(with_byte(good, 18, 0x02), 19, 0x01),
       WireError::mpa_private_data_too_long},
      {"S=1 with Rev 1", with_byte(good, 17, 1), WireError::mpa_enhanced_needs_rev2},
      {"S=1 with PD_Length 2", with_byte(good, 19, 2), WireError::mpa_length_mismatch},
  };
}

std::vector<MalformedCase> malformed_requests() {
  const Bytes good = encode(make_request(cs_block(16, 16)));
  return {
      {"reply key", encode(make_reply(cs_block(16, 16))), WireError::mpa_bad_key},
      {"revision 0", with_byte(good, 17, 0), WireError::mpa_bad_revision},
      {"reserved bits", with_byte(good, 16, static_cast<std::uint8_t>(good[16] | 0x08)),
       WireError::mpa_reserved_bits_set},
      {"R=1 in a Request", with_byte(good, 16, static_cast<std::uint8_t>(good[16] | 0x20)),
       WireError::mpa_reject_in_request},
      {"PD_Length 600", with_byte(with_byte(good, 18, 0x02), 19, 0x58),
       WireError::mpa_private_data_too_long},
  };
}

TEST(MpaMalformed, InitiatorFailsWithBadFrame) {
  for (const auto& c : malformed_replies()) {
    SCOPED_TRACE(c.name);
    MpaInitiator initiator(MpaConfig{}, {}, kStart);
    (void)initiator.handle_bytes(c.frame);
    auto events = drain(initiator);
    ASSERT_EQ(events.size(), 1u);
    EXPECT_EQ(events[0].kind, MpaEvent::Kind::failed);
    EXPECT_EQ(events[0].failure, MpaFailure::bad_frame);
    EXPECT_EQ(events[0].wire_error, c.expected);
    EXPECT_TRUE(initiator.finished());
    EXPECT_FALSE(initiator.deadline().has_value());
  }
}

TEST(MpaMalformed, ResponderFailsWithBadFrameAndSendsNothing) {
  for (const auto& c : malformed_requests()) {
    SCOPED_TRACE(c.name);
    MpaResponder responder(MpaConfig{}, kStart);
    (void)responder.handle_bytes(c.frame);
    auto events = drain(responder);
    ASSERT_EQ(events.size(), 1u);
    EXPECT_EQ(events[0].kind, MpaEvent::Kind::failed);
    EXPECT_EQ(events[0].failure, MpaFailure::bad_frame);
    EXPECT_EQ(events[0].wire_error, c.expected);
    EXPECT_TRUE(responder.pending_transmit().empty());
    EXPECT_TRUE(responder.finished());
  }
}

TEST(MpaMalformed, WrongKeyFailsAtTheFirstWrongByte) {
  MpaResponder responder(MpaConfig{}, kStart);
  const Bytes http = bytes_of("GET / HTTP/1.1\r\n\r\n");
  EXPECT_EQ(responder.handle_bytes(http), 1u);
  auto event = responder.poll_event();
  ASSERT_TRUE(event.has_value());
  EXPECT_EQ(event->wire_error, WireError::mpa_bad_key);
}

// ---------------------------------------------------------------------------------------------
// Chunking: byte at a time == all at once; never past the frame

struct FeedOutcome {
  std::size_t consumed = 0;
  std::vector<std::string> events;
};

template <class Core, class Answer>
FeedOutcome feed(Core& core, const Bytes& stream, bool byte_at_a_time, Answer answer) {
  FeedOutcome out;
  if (byte_at_a_time) {
    for (std::size_t k = 0; k < stream.size(); ++k) {
      out.consumed += core.handle_bytes(std::span<const std::uint8_t>(stream).subspan(k, 1));
      while (auto e = core.poll_event()) {
        out.events.push_back(describe(*e));
        answer(core, *e);
      }
    }
  } else {
    out.consumed = core.handle_bytes(stream);
    while (auto e = core.poll_event()) {
      out.events.push_back(describe(*e));
      answer(core, *e);
    }
  }
  // A second look never takes more once the frame is done.
  out.consumed += core.handle_bytes(stream);
  while (auto e = core.poll_event()) out.events.push_back(describe(*e));
  return out;
}

TEST(MpaChunking, InitiatorByteAtATimeMatchesAllAtOnce) {
  const Bytes fpdu_tail = {0x00, 0x0e, 0xc1, 0x40, 0x00, 0x00, 0x00, 0x01};
  std::vector<Bytes> streams;
  MpaFrame reply = make_reply(p2p_block(true, true, false, 8, 4));
  const Bytes pd = bytes_of("private");
  reply.private_data = pd;
  streams.push_back(encode(reply));
  Bytes with_tail = encode(reply);
  with_tail.insert(with_tail.end(), fpdu_tail.begin(), fpdu_tail.end());
  streams.push_back(with_tail);
  MpaFrame rejected = make_reply(cs_block(1, 1), true, false, true);
  rejected.private_data = pd;
  streams.push_back(encode(rejected));
  streams.push_back(encode(make_reply(std::nullopt)));
  streams.push_back(encode(make_reply(cs_block(1, 100))));  // insufficient IRD
  for (const auto& c : malformed_replies()) streams.push_back(c.frame);

  const auto nothing = [](MpaInitiator&, const MpaEvent&) {};
  for (std::size_t s = 0; s < streams.size(); ++s) {
    SCOPED_TRACE(s);
    MpaInitiator whole(config_with(CrcPolicy::preferred, true), {}, kStart);
    MpaInitiator bytewise(config_with(CrcPolicy::preferred, true), {}, kStart);
    const FeedOutcome a = feed(whole, streams[s], false, nothing);
    const FeedOutcome b = feed(bytewise, streams[s], true, nothing);
    EXPECT_EQ(a.consumed, b.consumed);
    EXPECT_EQ(a.events, b.events);
    ASSERT_EQ(a.events.size(), 1u);
  }
}

TEST(MpaChunking, InitiatorNeverConsumesPastTheReply) {
  MpaFrame reply = make_reply(cs_block(16, 16));
  Bytes stream = encode(reply);
  const std::size_t frame_size = stream.size();
  stream.insert(stream.end(), {0x00, 0x0e, 0xc1, 0x40});
  MpaInitiator initiator(MpaConfig{}, {}, kStart);
  EXPECT_EQ(initiator.handle_bytes(stream), frame_size);
  EXPECT_EQ(initiator.poll_event()->kind, MpaEvent::Kind::established);
  EXPECT_EQ(initiator.handle_bytes(std::span<const std::uint8_t>(stream).subspan(frame_size)), 0u);
}

TEST(MpaChunking, ResponderByteAtATimeMatchesAllAtOnce) {
  std::vector<Bytes> streams;
  MpaFrame request = make_request(p2p_block(true, false, true, 2, 3));
  const Bytes pd = bytes_of("hello responder");
  request.private_data = pd;
  Bytes with_tail = encode(request);
  with_tail.insert(with_tail.end(), {0x00, 0x2e, 0x41, 0x41});  // the first FPDU, early
  streams.push_back(with_tail);
  streams.push_back(encode(make_request(std::nullopt)));
  streams.push_back(encode(make_request(cs_block(1, 1), true, /*markers=*/true)));
  for (const auto& c : malformed_requests()) streams.push_back(c.frame);

  const auto accept = [](MpaResponder& responder, const MpaEvent& e) {
    if (e.kind == MpaEvent::Kind::request_received) responder.accept(4, 4, {});
  };
  for (std::size_t s = 0; s < streams.size(); ++s) {
    SCOPED_TRACE(s);
    MpaResponder whole(MpaConfig{}, kStart);
    MpaResponder bytewise(MpaConfig{}, kStart);
    const FeedOutcome a = feed(whole, streams[s], false, accept);
    const FeedOutcome b = feed(bytewise, streams[s], true, accept);
    EXPECT_EQ(a.consumed, b.consumed);
    EXPECT_EQ(a.events, b.events);
    const auto pa = whole.pending_transmit();
    const auto pb = bytewise.pending_transmit();
    EXPECT_EQ(Bytes(pa.begin(), pa.end()), Bytes(pb.begin(), pb.end()));
  }
  // The first stream's FPDU bytes were left for the queue-pair engine.
  MpaResponder responder(MpaConfig{}, kStart);
  EXPECT_EQ(responder.handle_bytes(streams[0]), streams[0].size() - 4);
}

TEST(MpaChunking, WholeExchangeByteAtATime) {
  MpaInitiator initiator(config_with(CrcPolicy::preferred, true), bytes_of("req"), kStart);
  MpaResponder responder(MpaConfig{}, kStart);
  // Request, one byte per step.
  while (!initiator.pending_transmit().empty()) {
    EXPECT_EQ(responder.handle_bytes(initiator.pending_transmit().first(1)), 1u);
    initiator.consume_transmit(1);
  }
  auto request_event = responder.poll_event();
  ASSERT_TRUE(request_event.has_value());
  EXPECT_EQ(request_event->kind, MpaEvent::Kind::request_received);
  responder.accept(16, 16, bytes_of("rep"));
  while (!responder.pending_transmit().empty()) {
    EXPECT_EQ(initiator.handle_bytes(responder.pending_transmit().first(1)), 1u);
    responder.consume_transmit(1);
  }
  auto i = initiator.poll_event();
  auto r = responder.poll_event();
  ASSERT_TRUE(i.has_value());
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(i->kind, MpaEvent::Kind::established);
  EXPECT_EQ(r->kind, MpaEvent::Kind::established);
  EXPECT_EQ(i->result.rtr, RtrType::write);
  EXPECT_EQ(r->result.rtr, RtrType::write);
  EXPECT_EQ(i->result.peer_private_data, bytes_of("rep"));
  EXPECT_EQ(r->result.peer_private_data, bytes_of("req"));
}

}  // namespace
}  // namespace peercm::core
