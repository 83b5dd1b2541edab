// Hostile bytes at the target's listener: no Request at all, a Request dripped one byte at a
// time, garbage instead of MPA, and, after a valid MPA exchange, malformed FPDUs and FPDUs
// with a corrupted CRC. Each ends the connection the RFC way (close, MPA reject, or a
// Terminate with the RFC 5040 §4.8 code), places nothing, and frees everything.
#include <gtest/gtest.h>

#include <random>

#include "fault_fixture.hpp"
#include "wire/byte_io.hpp"

namespace peercm::test {
namespace {

using namespace std::chrono_literals;

// --- the MPA exchange ---------------------------------------------------------------------

using HostileHandshake = FaultTest;

TEST_F(HostileHandshake, SilentConnectionEndsAtTheHandshakeTimeout) {
  auto silent = RawSocket::connect_to(port);
  ASSERT_GE(silent.fd(), 0);
  const auto start = Clock::now();
  bool eof = false;
  const auto got = silent.read_for(3s, &eof);
  const double closed_ms = ms_since(start);
  EXPECT_TRUE(eof) << "the listener must close a connection that never sends a Request";
  EXPECT_TRUE(got.empty()) << "nothing is answered to silence";
  EXPECT_GE(closed_ms, static_cast<double>(kHandshakeTimeout.count()) * 0.9);
  EXPECT_LT(closed_ms, static_cast<double>(kHandshakeTimeout.count()) + 500.0);
  report("closed after " + std::to_string(closed_ms) + " ms (timeout " + std::to_string(kHandshakeTimeout.count()) +
         " ms)");
  EXPECT_FALSE(target.channel->get_event(20ms).has_value());
}

TEST_F(HostileHandshake, SlowDripEndsAtTheHandshakeTimeout) {
  // A valid Request, one byte every 100 ms: each byte is progress, none extends the deadline.
  const auto request = mpa_request_bytes(true);
  auto drip = RawSocket::connect_to(port);
  ASSERT_GE(drip.fd(), 0);
  const auto start = Clock::now();
  bool eof = false;
  std::size_t sent = 0;
  while (!eof && sent < request.size() && ms_since(start) < 3000) {
    if (!drip.send_all(std::span(request).subspan(sent, 1))) break;
    ++sent;
    drip.read_for(100ms, &eof);
  }
  if (!eof) drip.read_for(1s, &eof);
  const double closed_ms = ms_since(start);
  EXPECT_TRUE(eof);
  EXPECT_LT(sent, request.size()) << "the whole Request went through: the drip was not cut off";
  EXPECT_LT(closed_ms, static_cast<double>(kHandshakeTimeout.count()) + 500.0);
  report("closed after " + std::to_string(closed_ms) + " ms, " + std::to_string(sent) + " of " +
         std::to_string(request.size()) + " bytes dripped");
  EXPECT_FALSE(target.channel->get_event(20ms).has_value());
}

struct Garbage {
  const char* name;
  std::vector<std::uint8_t> (*bytes)();
  bool reject_reply;  // RFC 5044 §7.1.2: answered with R=1 before the close
};

std::vector<std::uint8_t> random_bytes() {
  std::mt19937 rng(5044);
  std::vector<std::uint8_t> v(256);
  for (auto& b : v) b = static_cast<std::uint8_t>(rng());
  return v;
}
std::vector<std::uint8_t> http_request() {
  const std::string_view s = "GET / HTTP/1.1\r\nHost: peercm\r\n\r\n";
  return {s.begin(), s.end()};
}
std::vector<std::uint8_t> reply_frame() {
  return mpa_bytes(wire::MpaFrame{.kind = wire::MpaFrameKind::reply, .revision = 2, .enhanced = wire::IrdOrdBlock{}});
}
std::vector<std::uint8_t> revision_3() {
  auto v = mpa_request_bytes(true);
  v[17] = 3;
  return v;
}
std::vector<std::uint8_t> private_data_too_long() {
  auto v = mpa_request_bytes(true);
  wire::store_be16(v.data() + 18, 513);  // RFC 5044 §7.1: at most 512
  v.resize(wire::kMpaFrameHeaderSize + 513, 0);
  return v;
}
std::vector<std::uint8_t> reserved_bits() {
  auto v = mpa_request_bytes(true);
  v[16] |= 0x0F;
  return v;
}
std::vector<std::uint8_t> reject_bit_in_request() {
  auto v = mpa_request_bytes(true);
  v[16] |= 0x20;
  return v;
}
std::vector<std::uint8_t> markers_requested() {
  return mpa_bytes(wire::MpaFrame{.kind = wire::MpaFrameKind::request,
                                  .markers = true,
                                  .revision = 2,
                                  .enhanced = wire::IrdOrdBlock{.ird = 16, .ord = 16}});
}
void PrintTo(const Garbage& g, std::ostream* os) { *os << g.name; }

class GarbageInsteadOfMpa : public HostileHandshake, public testing::WithParamInterface<Garbage> {};

TEST_P(GarbageInsteadOfMpa, ClosesAtOnceWithoutBotheringTheApplication) {
  const Garbage& g = GetParam();
  auto socket = RawSocket::connect_to(port);
  ASSERT_GE(socket.fd(), 0);
  const auto start = Clock::now();
  ASSERT_TRUE(socket.send_all(g.bytes()));
  bool eof = false;
  const auto answer = socket.read_for(2s, &eof);
  const double closed_ms = ms_since(start);
  EXPECT_TRUE(eof);
  EXPECT_LT(closed_ms, static_cast<double>(kHandshakeTimeout.count())) << "closed by the timeout, not by the check";
  if (g.reject_reply) {
    ASSERT_GE(answer.size(), wire::kMpaFrameHeaderSize);
    auto reply = wire::decode_mpa_frame(answer, wire::MpaFrameKind::reply);
    ASSERT_TRUE(reply.has_value());
    EXPECT_TRUE(reply->rejected);
    EXPECT_FALSE(reply->markers);
  } else {
    EXPECT_TRUE(answer.empty()) << "RFC 5044 §7.1.2: a malformed Request gets no Reply";
  }
  report("closed after " + std::to_string(closed_ms) + " ms, answer " + std::to_string(answer.size()) + " B");
  EXPECT_FALSE(target.channel->get_event(20ms).has_value()) << "garbage reached the application";
}

INSTANTIATE_TEST_SUITE_P(Cases, GarbageInsteadOfMpa,
                         testing::Values(Garbage{"RandomBytes", random_bytes, false},
                                         Garbage{"HttpRequest", http_request, false},
                                         Garbage{"ReplyKey", reply_frame, false},
                                         Garbage{"Revision3", revision_3, false},
                                         Garbage{"PrivateDataTooLong", private_data_too_long, false},
                                         Garbage{"ReservedBits", reserved_bits, false},
                                         Garbage{"RejectBitInRequest", reject_bit_in_request, false},
                                         Garbage{"MarkersRequested", markers_requested, true}),
                         [](const testing::TestParamInfo<Garbage>& param_info) {
                           return std::string(param_info.param.name);
                         });

// An initiator must not send before the Reply (RFC 5044 §7.1.2). One that streams anyway
// while the application has yet to decide must not make the target buffer the stream: the
// target gives the setup up, and the request's id learns it with CONNECT_ERROR.
TEST_F(HostileHandshake, BytesBeforeTheReplyEndTheSetupInsteadOfBeingBuffered) {
  auto socket = RawSocket::connect_to(port);
  ASSERT_GE(socket.fd(), 0);
  ASSERT_TRUE(socket.send_all(mpa_request_bytes(true)));
  auto request = expect_event(*target.channel, CmEventType::connect_request);
  ASSERT_TRUE(request.new_id);
  const std::int64_t heap_at_request = heap_bytes();
  std::int64_t peak_growth = 0;
  const std::vector<std::uint8_t> chunk(64 * 1024, 0x99);
  std::size_t pushed = 0;
  bool closed = false;
  const auto start = Clock::now();
  // 32 MiB at most; a target that neither reads nor closes holds the peer by flow control.
  while (pushed < (32u << 20)) {
    const ssize_t n = ::send(socket.fd(), chunk.data(), chunk.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    peak_growth = std::max(peak_growth, heap_bytes() - heap_at_request);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{socket.fd(), POLLOUT, 0};
      if (::poll(&p, 1, 1000) <= 0) break;
      continue;
    }
    if (n <= 0) {
      closed = true;
      break;
    }
    pushed += static_cast<std::size_t>(n);
  }
  const double closed_ms = ms_since(start);
  auto event = expect_event(*target.channel, CmEventType::connect_error);
  EXPECT_EQ(event.id, request.new_id.get());
  settle();
  peak_growth = std::max(peak_growth, heap_bytes() - heap_at_request);
  report("pushed " + std::to_string(pushed >> 10) + " KiB before the Reply; target heap peak +" +
         std::to_string(peak_growth >> 10) + " KiB; " + (closed ? "closed by the target" : "not closed") + " after " +
         std::to_string(closed_ms) + " ms");
  EXPECT_TRUE(closed) << "the target neither closed nor stopped the stream";
  EXPECT_LT(closed_ms, static_cast<double>(kHandshakeTimeout.count())) << "ended by the timeout, not by the check";
  EXPECT_LT(peak_growth, 1 << 20) << "the target buffered what the peer should not have sent";
  EXPECT_FALSE(request.new_id->accept({})) << "a failed setup cannot be accepted";
  request.new_id.reset();
}

// --- after a valid exchange: malformed FPDUs -----------------------------------------------

// A Send FPDU (MSN 1, QN 0) with a 16-byte payload, and a Write FPDU, CRC off, to patch.
std::vector<std::uint8_t> send_fpdu(std::uint32_t msn = 1, std::size_t payload = 16) {
  const std::vector<std::uint8_t> bytes(payload, 0x3C);
  return fpdu_bytes(wire::SegmentHeader{.opcode = wire::RdmapOpcode::send, .queue_number = 0, .msn = msn}, bytes, false);
}
std::vector<std::uint8_t> write_fpdu() {
  const std::vector<std::uint8_t> bytes(16, 0x3C);
  return fpdu_bytes(wire::SegmentHeader{.opcode = wire::RdmapOpcode::rdma_write, .stag = 0x100, .tagged_offset = 0},
                    bytes, false);
}

struct BadFpdu {
  const char* name;
  std::vector<std::uint8_t> (*bytes)();
  bool terminate;  // false: the target must answer with nothing (a Terminate from the peer)
  std::uint8_t layer_type = 0;  // RFC 5040 §4.8 Terminate Control: Layer<<4 | EType,
  std::uint8_t code = 0;        // Error Code,
  std::uint8_t hdrct = 0;       // HdrCt (M 0x80, D 0x40, R 0x20)
  bool check_code = true;
};

std::vector<std::uint8_t> ddp_version_untagged() {
  auto v = send_fpdu();
  v[2] = static_cast<std::uint8_t>((v[2] & ~0x03) | 0x02);
  return v;
}
std::vector<std::uint8_t> ddp_version_tagged() {
  auto v = write_fpdu();
  v[2] = static_cast<std::uint8_t>((v[2] & ~0x03) | 0x00);
  return v;
}
std::vector<std::uint8_t> rdmap_version() {
  auto v = send_fpdu();
  v[3] = static_cast<std::uint8_t>((v[3] & 0x3F) | 0x80);
  return v;
}
std::vector<std::uint8_t> unknown_opcode() {
  auto v = send_fpdu();
  v[3] = static_cast<std::uint8_t>((v[3] & 0xF0) | 0x0C);
  return v;
}
std::vector<std::uint8_t> tagged_send() {
  auto v = send_fpdu();
  v[2] |= 0x80;
  return v;
}
std::vector<std::uint8_t> bad_queue_number() {
  auto v = send_fpdu();
  wire::store_be32(v.data() + 2 + 6, 5);
  return v;
}
std::vector<std::uint8_t> msn_out_of_range() { return send_fpdu(7); }
std::vector<std::uint8_t> too_long_for_the_receive() { return send_fpdu(1, 128); }
std::vector<std::uint8_t> ulpdu_too_short() {
  auto v = send_fpdu();
  wire::store_be16(v.data(), 4);
  v.resize(wire::fpdu_wire_size(4));
  return v;
}
std::vector<std::uint8_t> read_request_wrong_length() {
  auto v = send_fpdu(1, 32);  // 18 + 32 = 50 bytes of ULPDU, a Read Request has 46
  v[3] = static_cast<std::uint8_t>((v[3] & 0xF0) | 0x01);
  wire::store_be32(v.data() + 2 + 6, 1);
  return v;
}
std::vector<std::uint8_t> garbage_stream() {
  std::mt19937 rng(5041);
  std::vector<std::uint8_t> v(4096);
  for (auto& b : v) b = static_cast<std::uint8_t>(rng());
  return v;
}
std::vector<std::uint8_t> terminate_from_peer() {
  return fpdu_bytes(wire::SegmentHeader{.opcode = wire::RdmapOpcode::terminate,
                                        .queue_number = wire::kQueueTerminate,
                                        .msn = 1,
                                        .terminate = {.code = {wire::TerminateLayer::rdmap, 0x2, 0xFF}}},
                    {}, false);
}

void PrintTo(const BadFpdu& b, std::ostream* os) { *os << b.name; }

class GarbageAfterHandshake : public FaultTest, public testing::WithParamInterface<BadFpdu> {};

TEST_P(GarbageAfterHandshake, EndsWithTheRightTerminateAndPlacesNothing) {
  const BadFpdu& bad = GetParam();
  auto c = raw_connection(/*crc=*/false);
  ASSERT_TRUE(c.id);
  std::vector<std::uint8_t> sink(64, 0xEE), out(8, 1);
  auto sink_mr = target.region(sink);
  auto out_mr = target.region(out);
  ASSERT_TRUE(c.qp->post_recv(RecvWr{.wr_id = 1, .sg_list = {sink_mr->sge()}}));
  // The responder holds this until the peer's first valid FPDU, which never comes.
  ASSERT_TRUE(c.qp->post_send(SendWr{.wr_id = 2, .opcode = WrOpcode::send, .sg_list = {out_mr->sge()}}));
  const auto sent = bad.bytes();
  const auto start = Clock::now();
  ASSERT_TRUE(c.socket.send_all(sent));
  bool eof = false;
  const auto stream_bytes = c.socket.read_for(3s, &eof);
  const double closed_ms = ms_since(start);
  EXPECT_TRUE(eof) << "the target keeps the broken stream open";
  const PeerStream stream = parse_peer_stream(stream_bytes);
  EXPECT_TRUE(stream.well_formed);
  char control[32];
  std::snprintf(control, sizeof control, "%02x %02x %02x", stream.terminate_control[0], stream.terminate_control[1],
                stream.terminate_control[2]);
  if (bad.terminate) {
    ASSERT_TRUE(stream.terminate) << "no Terminate";
    EXPECT_EQ(stream.opcodes.size(), 1u) << "the Terminate is the only FPDU (the held Send stays held)";
    if (bad.check_code) {
      EXPECT_EQ(stream.terminate_control[0], bad.layer_type) << control;
      EXPECT_EQ(stream.terminate_control[1], bad.code) << control;
      // iwarp-wire.md §3.8: DDP errors copy the segment length and DDP header, RDMAP remote
      // operation errors too when the header arrived whole.
      EXPECT_EQ(stream.terminate_control[2], bad.hdrct) << control;
    }
    // With the offending DDP header copied (D), it is the one we sent.
    if (stream.terminate_control[2] & 0x40) {
      const std::size_t header_length = (sent[2] & 0x80) ? wire::kTaggedHeaderSize : wire::kUntaggedHeaderSize;
      ASSERT_GE(stream.terminate_body.size(), 4 + 2 + header_length);
      EXPECT_TRUE(std::equal(sent.begin() + 2, sent.begin() + 2 + static_cast<std::ptrdiff_t>(header_length),
                             stream.terminate_body.begin() + 6));
    }
  } else {
    EXPECT_FALSE(stream.terminate) << "RFC 5040 §6.2: a Terminate is never answered with one";
  }
  report(std::string(stream.terminate ? "Terminate " : "no Terminate ") + (stream.terminate ? control : "") +
         ", closed after " + std::to_string(closed_ms) + " ms");
  expect_event(*target.channel, CmEventType::disconnected);
  EXPECT_EQ(c.qp->state(), QpState::error);
  expect_each_once({1, 2}, {WcStatus::wr_flush_error});
  EXPECT_TRUE(std::all_of(sink.begin(), sink.end(), [](std::uint8_t b) { return b == 0xEE; })) << "bytes were placed";
}

INSTANTIATE_TEST_SUITE_P(
    Cases, GarbageAfterHandshake,
    testing::Values(BadFpdu{"DdpVersionUntagged", ddp_version_untagged, true, 0x12, 0x06, 0xC0},
                    BadFpdu{"DdpVersionTagged", ddp_version_tagged, true, 0x11, 0x04, 0xC0},
                    BadFpdu{"RdmapVersion", rdmap_version, true, 0x02, 0x05, 0xC0},
                    BadFpdu{"UnknownOpcode", unknown_opcode, true, 0x02, 0x06, 0xC0},
                    BadFpdu{"TaggedFlagOnASend", tagged_send, true, 0x02, 0x06, 0xC0},
                    BadFpdu{"BadQueueNumber", bad_queue_number, true, 0x12, 0x01, 0xC0},
                    BadFpdu{"MsnOutOfRange", msn_out_of_range, true, 0x12, 0x03, 0xC0},
                    BadFpdu{"TooLongForTheReceive", too_long_for_the_receive, true, 0x12, 0x05, 0xC0},
                    // A 4-byte ULPDU cannot hold the header the Terminate would copy.
                    BadFpdu{"UlpduTooShort", ulpdu_too_short, true, 0x02, 0xFF, 0x00},
                    BadFpdu{"ReadRequestWrongLength", read_request_wrong_length, true, 0x02, 0xFF, 0xC0},
                    BadFpdu{"RandomStream", garbage_stream, true, 0, 0, 0, /*check_code=*/false},
                    BadFpdu{"TerminateFromThePeer", terminate_from_peer, false}),
    [](const testing::TestParamInfo<BadFpdu>& param_info) { return std::string(param_info.param.name); });

// --- after a valid exchange with CRC on: a corrupted CRC ------------------------------------

using CorruptCrc = FaultTest;

TEST_F(CorruptCrc, WriteIsNotPlacedAndTheStreamTerminates) {
  auto c = raw_connection(/*crc=*/true);
  ASSERT_TRUE(c.id);
  std::vector<std::uint8_t> exposed(4096, 0x42), sink(64, 0xEE);
  auto exposed_mr = target.region(exposed);
  auto sink_mr = target.region(sink);
  ASSERT_TRUE(c.qp->post_recv(RecvWr{.wr_id = 1, .sg_list = {sink_mr->sge()}}));
  const std::vector<std::uint8_t> payload(1024, 0x77);
  // A valid Write (right STag, in bounds) that would land if its CRC checked.
  auto fpdu = fpdu_bytes(wire::SegmentHeader{.opcode = wire::RdmapOpcode::rdma_write,
                                             .stag = exposed_mr->rkey(),
                                             .tagged_offset = reinterpret_cast<std::uintptr_t>(exposed.data())},
                         payload, true);
  fpdu.back() ^= 0x01;
  const auto start = Clock::now();
  ASSERT_TRUE(c.socket.send_all(fpdu));
  bool eof = false;
  const PeerStream stream = parse_peer_stream(c.socket.read_for(3s, &eof));
  EXPECT_TRUE(eof);
  ASSERT_TRUE(stream.terminate);
  // RFC 5044 §8 / RFC 5040 §4.8: layer LLP (2), type 0, code 0x02 "MPA CRC error"; an LLP
  // error copies no header.
  EXPECT_EQ(stream.terminate_control[0], 0x20);
  EXPECT_EQ(stream.terminate_control[1], 0x02);
  EXPECT_EQ(stream.terminate_control[2], 0x00);
  report("Terminate 20 02 00 after " + std::to_string(ms_since(start)) + " ms");
  expect_event(*target.channel, CmEventType::disconnected);
  expect_each_once({1}, {WcStatus::wr_flush_error});
  EXPECT_TRUE(std::all_of(exposed.begin(), exposed.end(), [](std::uint8_t b) { return b == 0x42; }))
      << "a Write with a bad CRC was placed";
}

TEST_F(CorruptCrc, SendIsNotDeliveredAndTheReceiveIsFlushed) {
  auto c = raw_connection(/*crc=*/true);
  ASSERT_TRUE(c.id);
  std::vector<std::uint8_t> sink(64, 0xEE);
  auto sink_mr = target.region(sink);
  ASSERT_TRUE(c.qp->post_recv(RecvWr{.wr_id = 1, .sg_list = {sink_mr->sge()}}));
  const std::vector<std::uint8_t> payload(48, 0x77);
  auto fpdu = fpdu_bytes(wire::SegmentHeader{.opcode = wire::RdmapOpcode::send, .queue_number = 0, .msn = 1}, payload, true);
  fpdu[fpdu.size() - 6] ^= 0x10;  // a payload bit: only the CRC can tell
  const auto start = Clock::now();
  ASSERT_TRUE(c.socket.send_all(fpdu));
  bool eof = false;
  const PeerStream stream = parse_peer_stream(c.socket.read_for(3s, &eof));
  EXPECT_TRUE(eof);
  ASSERT_TRUE(stream.terminate);
  EXPECT_EQ(stream.terminate_control[0], 0x20);
  EXPECT_EQ(stream.terminate_control[1], 0x02);
  EXPECT_EQ(stream.terminate_control[2], 0x00);
  report("Terminate 20 02 00 after " + std::to_string(ms_since(start)) + " ms");
  expect_event(*target.channel, CmEventType::disconnected);
  expect_each_once({1}, {WcStatus::wr_flush_error});
  EXPECT_TRUE(std::all_of(sink.begin(), sink.end(), [](std::uint8_t b) { return b == 0xEE; }));
}

}  // namespace
}  // namespace peercm::test
