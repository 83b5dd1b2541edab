// STag guessing: a peer that knows a valid STag index (24 bits) tries every other 8-bit key,
// one connection per try, with RDMA Writes and with RDMA Read Requests. No try touches or
// discloses a byte; each ends its connection with the Terminate RFC 5041 §7.2 (Write: DDP
// layer, tagged buffer error, invalid STag) or RFC 5040 §7.2 (Read: RDMAP layer, remote
// protection error, invalid STag) prescribes; the right key then works.
#include <gtest/gtest.h>

#include "fault_fixture.hpp"
#include "wire/byte_io.hpp"

namespace peercm::test {
namespace {

using namespace std::chrono_literals;

constexpr std::size_t kExposed = 4096;
constexpr std::uint32_t kLength = 64;
constexpr std::uint32_t kPeerSinkStag = 0x00ABCD01;  // the guesser's own (fictitious) sink

class StagGuessing : public FaultTest {
 protected:
  void SetUp() override {
    FaultTest::SetUp();
    exposed.assign(kExposed, 0x42);
    for (std::size_t i = 0; i < kExposed; ++i) exposed[i] = static_cast<std::uint8_t>(i * 13 + 5);
    original = exposed;
    exposed_mr = target.region(exposed);
  }
  void TearDown() override {
    exposed_mr.reset();
    exposed.clear();
    exposed.shrink_to_fit();
    original.clear();
    original.shrink_to_fit();
    FaultTest::TearDown();
  }

  std::uint64_t base() const { return reinterpret_cast<std::uintptr_t>(exposed.data()); }
  std::uint32_t with_key(std::uint32_t key) const { return (exposed_mr->rkey() & ~0xFFu) | key; }

  // One connection, one FPDU; returns what the target sent back until it closed.
  PeerStream one_try(const std::vector<std::uint8_t>& fpdu, bool expect_close) {
    auto c = raw_connection(/*crc=*/false);
    if (!c.id) return {};
    std::vector<std::uint8_t> sink(16);
    auto sink_mr = target.region(sink);
    EXPECT_TRUE(c.qp->post_recv(RecvWr{.wr_id = 1, .sg_list = {sink_mr->sge()}}));
    EXPECT_TRUE(c.socket.send_all(fpdu));
    bool eof = false;
    std::vector<std::uint8_t> bytes;
    if (expect_close) {
      bytes = c.socket.read_for(3s, &eof);
      EXPECT_TRUE(eof) << "the target kept the connection after a bad STag";
    } else {
      // A valid access is answered (Read) or silent (Write); then the peer leaves.
      bytes = c.socket.read_for(200ms, &eof);
      c.socket.reset();
    }
    expect_event(*target.channel, CmEventType::disconnected);
    expect_each_once({1}, {WcStatus::wr_flush_error});
    return parse_peer_stream(bytes);
  }

  std::vector<std::uint8_t> write_fpdu(std::uint32_t stag) const {
    const std::vector<std::uint8_t> payload(kLength, 0xF0);
    return fpdu_bytes(wire::SegmentHeader{.opcode = wire::RdmapOpcode::rdma_write, .stag = stag, .tagged_offset = base()},
                      payload, false);
  }
  std::vector<std::uint8_t> read_request_fpdu(std::uint32_t stag) const {
    return fpdu_bytes(wire::SegmentHeader{.opcode = wire::RdmapOpcode::read_request,
                                          .queue_number = wire::kQueueReadRequest,
                                          .msn = 1,
                                          .read_request = {.sink_stag = kPeerSinkStag,
                                                           .sink_offset = 0,
                                                           .size = kLength,
                                                           .source_stag = stag,
                                                           .source_offset = base()}},
                      {}, false);
  }

  std::vector<std::uint8_t> exposed;
  std::vector<std::uint8_t> original;
  std::unique_ptr<MemoryRegion> exposed_mr;
};

TEST_F(StagGuessing, EveryWrongKeyOnAWriteIsAnInvalidStagTerminate) {
  const std::uint32_t right = exposed_mr->rkey() & 0xFF;
  int tries = 0, terminated = 0;
  const auto start = Clock::now();
  for (std::uint32_t key = 0; key < 256; ++key) {
    if (key == right) continue;
    ++tries;
    const auto fpdu = write_fpdu(with_key(key));
    const PeerStream stream = one_try(fpdu, true);
    ASSERT_TRUE(stream.terminate) << "key " << key;
    ASSERT_EQ(stream.opcodes.size(), 1u) << "key " << key;
    // RFC 5040 §4.8 / RFC 5041 §7.2: Layer 1 (DDP), EType 1 (tagged buffer), code 0x00
    // (invalid STag); HdrCt M and D: the segment length and our tagged header come back.
    ASSERT_EQ(stream.terminate_control[0], 0x11) << "key " << key;
    ASSERT_EQ(stream.terminate_control[1], 0x00) << "key " << key;
    ASSERT_EQ(stream.terminate_control[2], 0xC0) << "key " << key;
    ASSERT_GE(stream.terminate_body.size(), 6 + wire::kTaggedHeaderSize);
    EXPECT_EQ(wire::load_be16(stream.terminate_body.data() + 4), wire::kTaggedHeaderSize + kLength)
        << "the offending ULPDU length";
    EXPECT_TRUE(std::equal(fpdu.begin() + 2, fpdu.begin() + 2 + wire::kTaggedHeaderSize, stream.terminate_body.begin() + 6));
    ++terminated;
  }
  const double total_ms = ms_since(start);
  EXPECT_EQ(tries, 255);
  EXPECT_EQ(terminated, 255);
  EXPECT_EQ(exposed, original) << "a wrong key wrote into the region";
  report(std::to_string(tries) + " wrong keys, " + std::to_string(terminated) + " Terminates 11 00 c0, " +
         std::to_string(total_ms / tries) + " ms per try");
  // The right key is accepted: the checks above could have failed.
  const PeerStream ok = one_try(write_fpdu(exposed_mr->rkey()), false);
  EXPECT_FALSE(ok.terminate);
  EXPECT_TRUE(std::all_of(exposed.begin(), exposed.begin() + kLength, [](std::uint8_t b) { return b == 0xF0; }));
}

TEST_F(StagGuessing, EveryWrongKeyOnAReadIsAnInvalidStagTerminateAndDisclosesNothing) {
  const std::uint32_t right = exposed_mr->rkey() & 0xFF;
  int tries = 0, terminated = 0;
  const auto start = Clock::now();
  for (std::uint32_t key = 0; key < 256; ++key) {
    if (key == right) continue;
    ++tries;
    const auto fpdu = read_request_fpdu(with_key(key));
    const PeerStream stream = one_try(fpdu, true);
    ASSERT_TRUE(stream.terminate) << "key " << key;
    ASSERT_EQ(stream.opcodes.size(), 1u) << "no Read Response may precede the Terminate, key " << key;
    // RFC 5040 §4.8 / §7.2: Layer 0 (RDMAP), EType 1 (remote protection), code 0x00 (invalid
    // STag); HdrCt M, D and R: the Read Request header is copied too.
    ASSERT_EQ(stream.terminate_control[0], 0x01) << "key " << key;
    ASSERT_EQ(stream.terminate_control[1], 0x00) << "key " << key;
    ASSERT_EQ(stream.terminate_control[2], 0xE0) << "key " << key;
    ASSERT_GE(stream.terminate_body.size(), 6 + wire::kReadRequestUlpduSize);
    EXPECT_TRUE(std::equal(fpdu.begin() + 2, fpdu.begin() + 2 + wire::kReadRequestUlpduSize,
                           stream.terminate_body.begin() + 6))
        << "the copied DDP and Read Request headers are ours";
    ++terminated;
  }
  const double total_ms = ms_since(start);
  EXPECT_EQ(tries, 255);
  EXPECT_EQ(terminated, 255);
  report(std::to_string(tries) + " wrong keys, " + std::to_string(terminated) + " Terminates 01 00 e0, " +
         std::to_string(total_ms / tries) + " ms per try");
  // The right key gets a Read Response carrying the region's first bytes.
  auto c = raw_connection(false);
  ASSERT_TRUE(c.id);
  ASSERT_TRUE(c.socket.send_all(read_request_fpdu(exposed_mr->rkey())));
  const auto response = c.socket.read_exact(wire::fpdu_wire_size(wire::kTaggedHeaderSize + kLength), 3s);
  const PeerStream stream = parse_peer_stream(response);
  ASSERT_EQ(stream.opcodes.size(), 1u);
  EXPECT_EQ(stream.opcodes[0], static_cast<std::uint8_t>(wire::RdmapOpcode::read_response));
  EXPECT_TRUE(std::equal(original.begin(), original.begin() + kLength, response.begin() + 2 + wire::kTaggedHeaderSize));
  c.socket.reset();
  expect_event(*target.channel, CmEventType::disconnected);
}

}  // namespace
}  // namespace peercm::test
