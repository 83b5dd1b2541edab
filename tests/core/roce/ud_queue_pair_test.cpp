// The UD queue-pair core: what a datagram carries (BTH + DETH, the ICRC), what a receive gets
// (the GRH area, the sender's QPN), and every datagram it must drop and count instead of
// delivering (wrong Q_Key, another QPN, too short, corrupted, no receive, not ready).
#include <gtest/gtest.h>

#include <arpa/inet.h>

#include <cstring>
#include <memory>
#include <vector>

#include "core/roce/ud_queue_pair.hpp"
#include "rc_test_support.hpp"
#include "wire/roce/packet.hpp"

namespace peercm::core::roce::test {
namespace {

constexpr std::uint32_t kQkey = 0x11111111;
constexpr std::uint16_t kSourcePortA = 0xC123;
constexpr std::uint16_t kSourcePortB = 0xC456;

struct UdNode {
  UdNode(std::uint32_t qpn, std::uint16_t source_port, std::uint64_t seed)
      : memory(seed), qp(UdQpConfig{.qpn = qpn, .pd = 1, .udp_source_port = source_port}, memory, scq, rcq) {}

  Mr reg(std::size_t size) {
    auto& buffer = buffers.emplace_back(std::make_unique<std::uint8_t[]>(size));
    std::memset(buffer.get(), 0, size);
    Mr mr{buffer.get(), reinterpret_cast<std::uintptr_t>(buffer.get()), size, 0};
    auto key = memory.register_region(1, mr.addr, size, kAccessLocalWrite);
    EXPECT_TRUE(key.has_value());
    mr.key = key ? *key : 0;
    return mr;
  }
  void ready(std::uint32_t qkey = kQkey) {
    qp.to_init(qkey);
    qp.to_rtr();
    qp.to_rts(0x123456);
  }
  Status<std::errc> send(std::uint64_t id, const Mr& mr, std::size_t length, const UdDestination& to,
                         WrOpcode opcode = WrOpcode::send, std::uint32_t imm = 0, std::uint32_t max_payload = 4096) {
    SendWr wr;
    wr.wr_id = id;
    wr.opcode = opcode;
    wr.imm_data = imm;
    wr.sg_list = {mr.sge(0, length)};
    return qp.post_send(wr, to, max_payload);
  }
  Status<std::errc> recv(std::uint64_t id, const Mr& mr, std::size_t offset, std::size_t length) {
    return qp.post_recv(RecvWr{.wr_id = id, .sg_list = {mr.sge(offset, length)}});
  }

  MemoryTable memory;
  TestCq scq;
  TestCq rcq;
  UdQueuePair qp;
  std::vector<std::unique_ptr<std::uint8_t[]>> buffers;
};

class UdQueuePairTest : public ::testing::Test {
 protected:
  UdQueuePairTest() : a(0x101, kSourcePortA, 1), b(0x202, kSourcePortB, 2) {
    a.ready();
    b.ready();
  }
  UdDestination a_to_b(std::uint32_t qkey = kQkey) const {
    return UdDestination{.local_ip = kIpA, .remote_ip = kIpB, .remote_qpn = 0x202, .remote_qkey = qkey};
  }
  // Hands a's next datagram to b as it would arrive; false when a had none.
  bool deliver_a_to_b() {
    auto datagram = a.qp.poll_datagram();
    if (!datagram) return false;
    b.qp.handle_datagram(datagram->bytes, datagram->local_ip, kSourcePortA, datagram->remote_ip);
    return true;
  }

  UdNode a;
  UdNode b;
};

TEST_F(UdQueuePairTest, SendArrivesWithGrhSourceQpnAndCompletesBothSides) {
  const Mr out = a.reg(1000);
  const Mr in = b.reg(kGrhSize + 1000);
  fill_pattern(out.bytes(0, 1000), 7);
  ASSERT_TRUE(b.recv(77, in, 0, kGrhSize + 1000));
  ASSERT_TRUE(a.send(5, out, 1000, a_to_b()));

  auto datagram = a.qp.poll_datagram();
  ASSERT_TRUE(datagram.has_value());
  EXPECT_EQ(datagram->local_ip, kIpA);
  EXPECT_EQ(datagram->remote_ip, kIpB);
  // On the wire: UD SEND ONLY to QP 0x202 with the first PSN, DETH with the Q_Key and our QPN.
  auto packet = w::decode_verified_packet(
      datagram->bytes, w::IcrcPseudoHeader{.ip = w::Ipv4IcrcFields{.source = kIpA, .destination = kIpB},
                                           .udp_source_port = kSourcePortA});
  ASSERT_TRUE(packet.has_value());
  EXPECT_EQ(packet->headers.bth.opcode, w::Opcode::ud_send_only);
  EXPECT_EQ(packet->headers.bth.destination_qp, 0x202u);
  EXPECT_EQ(packet->headers.bth.psn, 0x123456u);
  EXPECT_EQ(packet->headers.deth.q_key, kQkey);
  EXPECT_EQ(packet->headers.deth.source_qp, 0x101u);
  EXPECT_EQ(packet->payload.size(), 1000u);
  ASSERT_EQ(a.scq.wcs.size(), 1u);
  EXPECT_EQ(a.scq.wcs[0].wr_id, 5u);
  EXPECT_EQ(a.scq.wcs[0].status, WcStatus::success);
  EXPECT_EQ(a.scq.wcs[0].opcode, WcOpcode::send);

  b.qp.handle_datagram(datagram->bytes, kIpA, kSourcePortA, kIpB);
  ASSERT_EQ(b.rcq.wcs.size(), 1u);
  const WorkCompletion& wc = b.rcq.wcs[0];
  EXPECT_EQ(wc.wr_id, 77u);
  EXPECT_EQ(wc.status, WcStatus::success);
  EXPECT_EQ(wc.opcode, WcOpcode::recv);
  EXPECT_EQ(wc.byte_len, kGrhSize + 1000);
  EXPECT_EQ(wc.src_qp, 0x101u);
  EXPECT_EQ(wc.qp_num, 0x202u);
  EXPECT_TRUE(wc.wc_flags & kWcGrh);
  EXPECT_FALSE(wc.wc_flags & kWcWithImm);
  EXPECT_TRUE(has_pattern(in.bytes(kGrhSize, 1000), 7));
  // The GRH area names the sender: IPv4 header in its last 20 bytes.
  std::array<std::uint8_t, kGrhSize> grh{};
  std::memcpy(grh.data(), in.data, kGrhSize);
  const auto source = ipv4_source_of_grh(grh);
  ASSERT_TRUE(source.has_value());
  EXPECT_EQ(*source, kIpA);
  EXPECT_EQ(std::vector<std::uint8_t>(in.data + 36, in.data + 40), std::vector<std::uint8_t>(kIpB.begin(), kIpB.end()));
  EXPECT_EQ(b.qp.stats().datagrams_received, 1u);
}

TEST_F(UdQueuePairTest, ImmediateDataAndScatteredReceive) {
  const Mr out = a.reg(100);
  const Mr in = b.reg(kGrhSize + 100);
  fill_pattern(out.bytes(0, 100), 3);
  // The GRH area split over two SGEs and the payload over the second and a third.
  ASSERT_TRUE(b.qp.post_recv(RecvWr{.wr_id = 1, .sg_list = {in.sge(0, 30), in.sge(30, 60), in.sge(90, 50)}}));
  std::uint32_t imm = 0;
  const std::uint8_t imm_bytes[4] = {0xDE, 0xAD, 0xBE, 0xEF};
  std::memcpy(&imm, imm_bytes, 4);
  ASSERT_TRUE(a.send(2, out, 100, a_to_b(), WrOpcode::send_with_imm, imm));
  ASSERT_TRUE(deliver_a_to_b());
  ASSERT_EQ(b.rcq.wcs.size(), 1u);
  EXPECT_EQ(b.rcq.wcs[0].status, WcStatus::success);
  EXPECT_TRUE(b.rcq.wcs[0].wc_flags & kWcWithImm);
  EXPECT_EQ(b.rcq.wcs[0].imm_data, imm);  // same bytes in memory on both sides
  EXPECT_TRUE(has_pattern(in.bytes(kGrhSize, 100), 3));
}

TEST_F(UdQueuePairTest, ControlledQkeyTakesTheQpsOwn) {
  const Mr out = a.reg(8);
  const Mr in = b.reg(kGrhSize + 8);
  ASSERT_TRUE(b.recv(1, in, 0, kGrhSize + 8));
  ASSERT_TRUE(a.send(1, out, 8, a_to_b(0x80000000u)));
  ASSERT_TRUE(deliver_a_to_b());
  ASSERT_EQ(b.rcq.wcs.size(), 1u);
  EXPECT_EQ(b.rcq.wcs[0].status, WcStatus::success);
}

TEST_F(UdQueuePairTest, HostileDatagramsAreDroppedAndCounted) {
  const Mr out = a.reg(64);
  const Mr in = b.reg(kGrhSize + 64);
  ASSERT_TRUE(b.recv(1, in, 0, kGrhSize + 64));

  // Wrong Q_Key.
  ASSERT_TRUE(a.send(1, out, 64, a_to_b(0x22222222)));
  ASSERT_TRUE(deliver_a_to_b());
  EXPECT_EQ(b.qp.stats().dropped_bad_qkey, 1u);

  // Addressed to another QPN (the device routes by QPN; the core checks it again).
  UdDestination elsewhere = a_to_b();
  elsewhere.remote_qpn = 0x303;
  ASSERT_TRUE(a.send(2, out, 64, elsewhere));
  ASSERT_TRUE(deliver_a_to_b());
  EXPECT_EQ(b.qp.stats().dropped_malformed, 1u);

  // Too short to hold BTH + ICRC, and a DETH cut off.
  const std::uint8_t tiny[3] = {0x64, 0, 0};
  b.qp.handle_datagram(tiny, kIpA, kSourcePortA, kIpB);
  EXPECT_EQ(b.qp.stats().dropped_malformed, 2u);
  ASSERT_TRUE(a.send(3, out, 0, a_to_b()));
  auto cut = a.qp.poll_datagram();
  ASSERT_TRUE(cut.has_value());
  b.qp.handle_datagram(std::span(cut->bytes).first(w::kBthSize + 4), kIpA, kSourcePortA, kIpB);
  EXPECT_EQ(b.qp.stats().dropped_malformed, 3u);

  // A flipped payload bit fails the ICRC; so does a different source port.
  ASSERT_TRUE(a.send(4, out, 64, a_to_b()));
  auto corrupt = a.qp.poll_datagram();
  ASSERT_TRUE(corrupt.has_value());
  corrupt->bytes[w::kBthSize + w::kDethSize + 5] ^= 0x10;
  b.qp.handle_datagram(corrupt->bytes, kIpA, kSourcePortA, kIpB);
  ASSERT_TRUE(a.send(5, out, 64, a_to_b()));
  auto moved = a.qp.poll_datagram();
  ASSERT_TRUE(moved.has_value());
  b.qp.handle_datagram(moved->bytes, kIpA, kSourcePortA + 1, kIpB);
  EXPECT_EQ(b.qp.stats().dropped_bad_icrc, 2u);

  // An RC opcode sent to a UD QP.
  std::vector<std::uint8_t> rc(64);
  w::PacketHeaders headers;
  headers.bth.opcode = w::Opcode::rc_send_only;
  headers.bth.destination_qp = 0x202;
  auto size = w::encode_packet(headers, {}, w::IcrcPseudoHeader{.ip = w::Ipv4IcrcFields{.source = kIpA, .destination = kIpB},
                                                                .udp_source_port = kSourcePortA},
                               rc);
  ASSERT_TRUE(size.has_value());
  b.qp.handle_datagram(std::span(rc).first(*size), kIpA, kSourcePortA, kIpB);
  EXPECT_EQ(b.qp.stats().dropped_malformed, 4u);

  // None of them took the receive: a good datagram still finds it.
  EXPECT_TRUE(b.rcq.wcs.empty());
  EXPECT_EQ(b.qp.recv_queue_size(), 1u);
  ASSERT_TRUE(a.send(6, out, 64, a_to_b()));
  ASSERT_TRUE(deliver_a_to_b());
  ASSERT_EQ(b.rcq.wcs.size(), 1u);
  EXPECT_EQ(b.rcq.wcs[0].status, WcStatus::success);

  // No receive posted: dropped (UD has no RNR).
  ASSERT_TRUE(a.send(7, out, 64, a_to_b()));
  ASSERT_TRUE(deliver_a_to_b());
  EXPECT_EQ(b.qp.stats().dropped_no_receive, 1u);
  EXPECT_EQ(b.rcq.wcs.size(), 1u);
}

TEST_F(UdQueuePairTest, ReceiveTooSmallCompletesWithLengthError) {
  const Mr out = a.reg(100);
  const Mr in = b.reg(kGrhSize + 99);
  ASSERT_TRUE(b.recv(9, in, 0, kGrhSize + 99));
  ASSERT_TRUE(a.send(1, out, 100, a_to_b()));
  ASSERT_TRUE(deliver_a_to_b());
  ASSERT_EQ(b.rcq.wcs.size(), 1u);
  EXPECT_EQ(b.rcq.wcs[0].wr_id, 9u);
  EXPECT_EQ(b.rcq.wcs[0].status, WcStatus::local_length_error);
  EXPECT_EQ(b.qp.stats().receive_too_small, 1u);
}

TEST(UdQueuePair, NotReadyQpsRefuseSendsAndDropDatagrams) {
  UdNode a(0x101, kSourcePortA, 1);
  UdNode b(0x202, kSourcePortB, 2);
  const Mr out = a.reg(16);
  const Mr in = b.reg(kGrhSize + 16);
  const UdDestination to{.local_ip = kIpA, .remote_ip = kIpB, .remote_qpn = 0x202, .remote_qkey = kQkey};
  EXPECT_EQ(a.send(1, out, 16, to).error(), std::errc::invalid_argument);  // RESET
  a.qp.to_init(kQkey);
  a.qp.to_rtr();
  EXPECT_EQ(a.send(1, out, 16, to).error(), std::errc::invalid_argument);  // RTR: receive only
  a.qp.to_rts(0);
  b.qp.to_init(kQkey);
  ASSERT_TRUE(b.recv(1, in, 0, kGrhSize + 16));  // receives may wait from INIT on
  ASSERT_TRUE(a.send(1, out, 16, to));
  auto datagram = a.qp.poll_datagram();
  ASSERT_TRUE(datagram.has_value());
  b.qp.handle_datagram(datagram->bytes, kIpA, kSourcePortA, kIpB);
  EXPECT_EQ(b.qp.stats().dropped_not_ready, 1u);
  EXPECT_TRUE(b.rcq.wcs.empty());
  // Over the path MTU, or more SGEs than the QP has.
  EXPECT_EQ(a.send(2, out, 16, to, WrOpcode::send, 0, 8).error(), std::errc::invalid_argument);
  SendWr write;
  write.opcode = WrOpcode::rdma_write;
  EXPECT_EQ(a.qp.post_send(write, to, 4096).error(), std::errc::invalid_argument);
}

TEST(UdQueuePair, ErrorFlushesBothQueuesAndLaterWork) {
  UdNode a(0x101, kSourcePortA, 1);
  a.ready();
  const Mr mr = a.reg(kGrhSize + 16);
  const UdDestination to{.local_ip = kIpA, .remote_ip = kIpB, .remote_qpn = 0x202, .remote_qkey = kQkey};
  ASSERT_TRUE(a.recv(10, mr, 0, kGrhSize + 16));
  ASSERT_TRUE(a.send(20, mr, 16, to));
  a.qp.modify_to_error();
  EXPECT_FALSE(a.qp.poll_datagram().has_value());
  ASSERT_EQ(a.scq.wcs.size(), 1u);
  EXPECT_EQ(a.scq.wcs[0].wr_id, 20u);
  EXPECT_EQ(a.scq.wcs[0].status, WcStatus::wr_flush_error);
  ASSERT_EQ(a.rcq.wcs.size(), 1u);
  EXPECT_EQ(a.rcq.wcs[0].wr_id, 10u);
  EXPECT_EQ(a.rcq.wcs[0].status, WcStatus::wr_flush_error);
  ASSERT_TRUE(a.send(21, mr, 16, to));
  ASSERT_TRUE(a.recv(11, mr, 0, 16));
  EXPECT_EQ(a.scq.wcs.size(), 2u);
  EXPECT_EQ(a.rcq.wcs.size(), 2u);
  EXPECT_EQ(a.scq.wcs[1].status, WcStatus::wr_flush_error);
}

TEST(UdQueuePair, BadLkeyCompletesWithProtectionErrorAndSendsNothing) {
  UdNode a(0x101, kSourcePortA, 1);
  a.ready();
  Mr mr = a.reg(16);
  mr.key ^= 0xFF;
  const UdDestination to{.local_ip = kIpA, .remote_ip = kIpB, .remote_qpn = 0x202, .remote_qkey = kQkey};
  ASSERT_TRUE(a.send(1, mr, 16, to));
  EXPECT_FALSE(a.qp.poll_datagram().has_value());
  ASSERT_EQ(a.scq.wcs.size(), 1u);
  EXPECT_EQ(a.scq.wcs[0].status, WcStatus::local_protection_error);
}

// A CQ with room for `room` completions.
class SmallCq final : public CompletionSink {
 public:
  explicit SmallCq(std::size_t room) : room_(room) {}
  bool push(const WorkCompletion& wc) override {
    if (wcs.size() >= room_) return false;
    wcs.push_back(wc);
    return true;
  }
  std::vector<WorkCompletion> wcs;

 private:
  std::size_t room_;
};

TEST(UdQueuePair, FullReceiveCqPutsTheQpInError) {
  UdNode a(0x101, kSourcePortA, 1);
  a.ready();
  MemoryTable memory(2);
  TestCq send_cq;
  SmallCq recv_cq(1);
  UdQueuePair b(UdQpConfig{.qpn = 0x202, .pd = 1, .udp_source_port = kSourcePortB}, memory, send_cq, recv_cq);
  b.to_init(kQkey);
  b.to_rtr();
  std::vector<std::uint8_t> buffer(2 * (kGrhSize + 8));
  const auto key = memory.register_region(1, reinterpret_cast<std::uintptr_t>(buffer.data()), buffer.size(),
                                          kAccessLocalWrite);
  ASSERT_TRUE(key.has_value());
  for (std::uint64_t i = 0; i < 3; ++i)
    ASSERT_TRUE(b.post_recv(RecvWr{
        .wr_id = i,
        .sg_list = {Sge{reinterpret_cast<std::uintptr_t>(buffer.data()) + (i % 2) * (kGrhSize + 8),
                        static_cast<std::uint32_t>(kGrhSize + 8), *key}}}));
  const Mr out = a.reg(8);
  const UdDestination to{.local_ip = kIpA, .remote_ip = kIpB, .remote_qpn = 0x202, .remote_qkey = kQkey};
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(a.send(1, out, 8, to));
    auto datagram = a.qp.poll_datagram();
    ASSERT_TRUE(datagram.has_value());
    b.handle_datagram(datagram->bytes, kIpA, kSourcePortA, kIpB);
  }
  // The first fits; the second is lost, and so is the flush of the third receive.
  ASSERT_EQ(recv_cq.wcs.size(), 1u);
  EXPECT_EQ(recv_cq.wcs[0].status, WcStatus::success);
  EXPECT_EQ(b.state(), QpState::error);
  EXPECT_EQ(b.stats().completions_lost, 2u);
  EXPECT_EQ(b.recv_queue_size(), 0u);
}

TEST(UdGrh, Ipv4HeaderRoundTripsAndChecksumGuardsIt) {
  auto grh = ipv4_grh(kIpA, kIpB, 100);
  for (std::size_t i = 0; i < 20; ++i) EXPECT_EQ(grh[i], 0) << i;
  EXPECT_EQ(grh[20], 0x45);
  EXPECT_EQ(grh[22] << 8 | grh[23], 20 + 8 + 100);
  EXPECT_EQ(grh[29], 17);
  auto source = ipv4_source_of_grh(grh);
  ASSERT_TRUE(source.has_value());
  EXPECT_EQ(*source, kIpA);
  grh[33] ^= 1;  // the source address changes: the checksum no longer holds
  EXPECT_FALSE(ipv4_source_of_grh(grh).has_value());
  std::array<std::uint8_t, kGrhSize> ipv6{};
  ipv6[0] = 0x60;
  EXPECT_FALSE(ipv4_source_of_grh(ipv6).has_value());
}

}  // namespace
}  // namespace peercm::core::roce::test
