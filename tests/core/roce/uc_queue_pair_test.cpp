// The UC queue-pair core: segmentation of Sends and Writes over the PMTU, completion as the
// last packet leaves, a PSN gap that loses the message in flight and the recovery at the
// next First/Only, a Send without a receive dropped (no RNR), the WRs UC refuses at post,
// immediate data, the flush on ERROR, and hostile datagrams dropped and counted.
#include <gtest/gtest.h>

#include <arpa/inet.h>

#include <cstring>
#include <functional>
#include <memory>
#include <vector>

#include "core/roce/uc_queue_pair.hpp"
#include "rc_test_support.hpp"
#include "wire/roce/packet.hpp"
#include "wire/roce/psn.hpp"

namespace peercm::core::roce::test {
namespace {

constexpr std::uint32_t kQpnA = 0x31;
constexpr std::uint32_t kQpnB = 0x42;
constexpr std::uint32_t kPsnA = 0xFFFFFE;  // wraps within the first message
constexpr std::uint32_t kPsnB = 777;

struct UcNode {
  UcNode(std::uint32_t qpn, std::uint64_t seed, QpCaps caps = {.max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 4,
                                                             .max_recv_sge = 4, .max_inline_data = 64})
      : memory(seed), qp(UcQpConfig{.qpn = qpn, .pd = 1, .caps = caps}, memory, scq, rcq) {}

  Mr reg(std::size_t size, std::uint32_t access = kAllAccess) {
    auto& buffer = buffers.emplace_back(std::make_unique<std::uint8_t[]>(size + 1));
    std::memset(buffer.get(), 0, size + 1);
    Mr mr{buffer.get(), reinterpret_cast<std::uintptr_t>(buffer.get()), size, 0};
    auto key = memory.register_region(1, mr.addr, size, access);
    EXPECT_TRUE(key.has_value());
    mr.key = key ? *key : 0;
    return mr;
  }
  Status<std::errc> post(std::uint64_t id, WrOpcode op, std::vector<Sge> sges, std::uint32_t flags = 0,
                         std::uint64_t remote_addr = 0, std::uint32_t rkey = 0, std::uint32_t imm = 0) {
    SendWr wr;
    wr.wr_id = id;
    wr.opcode = op;
    wr.flags = flags;
    wr.sg_list = std::move(sges);
    wr.remote_addr = remote_addr;
    wr.rkey = rkey;
    wr.imm_data = imm;
    return qp.post_send(wr);
  }
  Status<std::errc> recv(std::uint64_t id, std::vector<Sge> sges) {
    return qp.post_recv(RecvWr{.wr_id = id, .sg_list = std::move(sges)});
  }

  MemoryTable memory;
  TestCq scq;
  TestCq rcq;
  UcQueuePair qp;
  std::vector<std::unique_ptr<std::uint8_t[]>> buffers;
};

UcPath path_of(bool a_side, w::PathMtu pmtu) {
  UcPath path;
  path.remote_qpn = a_side ? kQpnB : kQpnA;
  path.recv_psn = a_side ? kPsnB : kPsnA;
  path.pmtu = pmtu;
  path.local_ip = a_side ? kIpA : kIpB;
  path.remote_ip = a_side ? kIpB : kIpA;
  path.udp_source_port = a_side ? kPortA : kPortB;
  return path;
}

Bytes flatten(const RcDatagram& d) {
  Bytes out(d.header.begin(), d.header.begin() + static_cast<std::ptrdiff_t>(d.header_size));
  for (const iovec& piece : d.payload) {
    const auto* p = static_cast<const std::uint8_t*>(piece.iov_base);
    out.insert(out.end(), p, p + piece.iov_len);
  }
  out.insert(out.end(), d.trailer.begin(), d.trailer.begin() + static_cast<std::ptrdiff_t>(d.trailer_size));
  return out;
}

class UcQueuePairTest : public ::testing::Test {
 protected:
  explicit UcQueuePairTest(w::PathMtu pmtu = w::PathMtu::mtu256) : a(kQpnA, 1), b(kQpnB, 2) {
    for (auto [node, a_side] : {std::pair{&a, true}, std::pair{&b, false}}) {
      EXPECT_TRUE(node->qp.to_init().has_value());
      EXPECT_TRUE(node->qp.to_rtr(path_of(a_side, pmtu)).has_value());
      EXPECT_TRUE(node->qp.to_rts(a_side ? kPsnA : kPsnB).has_value());
    }
  }
  // Everything A has to send now, as datagrams.
  std::vector<Bytes> drain_a() {
    std::vector<Bytes> out;
    RcDatagram d;
    for (int i = 0; i < 100000 && a.qp.poll_datagram(d); ++i) out.push_back(flatten(d));
    return out;
  }
  void to_b(const Bytes& datagram) { b.qp.handle_datagram(datagram, kIpA, kPortA); }
  // A's datagrams to B; `keep` (packet index, view) false drops one.
  std::size_t send_a_to_b(const std::function<bool(std::size_t, const w::PacketView&)>& keep = {}) {
    const auto datagrams = drain_a();
    for (std::size_t i = 0; i < datagrams.size(); ++i) {
      auto view = w::decode_packet(datagrams[i]);
      EXPECT_TRUE(view.has_value());
      if (!keep || (view && keep(i, *view))) to_b(datagrams[i]);
    }
    return datagrams.size();
  }

  UcNode a;
  UcNode b;
};

TEST_F(UcQueuePairTest, SendSegmentsOverThePmtuAndCompletesAsItsLastPacketLeaves) {
  const Mr src = a.reg(1000);
  const Mr dst = b.reg(2000);
  fill_pattern(src.bytes(0, 1000), 7);
  ASSERT_TRUE(b.recv(50, {dst.sge(0, 600), dst.sge(600, 1400)}).has_value());
  ASSERT_TRUE(a.post(1, WrOpcode::send, {src.sge(0, 300), src.sge(300, 700)}, kSendSolicited).has_value());

  RcDatagram d;
  std::vector<Bytes> packets;
  while (a.qp.poll_datagram(d)) packets.push_back(flatten(d));
  ASSERT_EQ(packets.size(), 4u);  // 256 + 256 + 256 + 232
  const w::Opcode expected[] = {w::Opcode::uc_send_first, w::Opcode::uc_send_middle, w::Opcode::uc_send_middle,
                                w::Opcode::uc_send_last};
  std::uint32_t psn = kPsnA;
  for (std::size_t i = 0; i < packets.size(); ++i) {
    auto view = w::decode_verified_packet(
        packets[i], w::IcrcPseudoHeader{.ip = w::Ipv4IcrcFields{.source = kIpA, .destination = kIpB},
                                        .udp_source_port = kPortA});
    ASSERT_TRUE(view.has_value()) << i;
    EXPECT_EQ(view->headers.bth.opcode, expected[i]);
    EXPECT_EQ(view->headers.bth.psn, psn) << i;  // wraps past 0xFFFFFF
    EXPECT_EQ(view->headers.bth.destination_qp, kQpnB);
    EXPECT_FALSE(view->headers.bth.ack_request);  // UC asks for no ACKs
    EXPECT_EQ(view->headers.bth.solicited_event, i == 3);
    psn = w::psn_next(psn);
  }
  EXPECT_EQ(psn, 2u);
  // The WR completed when the driver came back after its last packet.
  ASSERT_EQ(a.scq.wcs.size(), 1u);
  EXPECT_EQ(a.scq.wcs[0].wr_id, 1u);
  EXPECT_EQ(a.scq.wcs[0].status, WcStatus::success);
  EXPECT_EQ(a.scq.wcs[0].opcode, WcOpcode::send);
  EXPECT_EQ(a.scq.wcs[0].byte_len, 1000u);
  EXPECT_EQ(a.qp.send_queue_size(), 0u);

  for (const Bytes& p : packets) to_b(p);
  ASSERT_EQ(b.rcq.wcs.size(), 1u);
  EXPECT_EQ(b.rcq.wcs[0].wr_id, 50u);
  EXPECT_EQ(b.rcq.wcs[0].status, WcStatus::success);
  EXPECT_EQ(b.rcq.wcs[0].byte_len, 1000u);
  EXPECT_TRUE(b.rcq.wcs[0].wc_flags & kWcSolicited);
  EXPECT_EQ(b.rcq.solicited_events, 1);
  EXPECT_TRUE(has_pattern(dst.bytes(0, 1000), 7));
  EXPECT_EQ(b.qp.stats().messages_delivered, 1u);
  // Nothing goes back: UC has no ACKs.
  RcDatagram none;
  EXPECT_FALSE(b.qp.poll_datagram(none));
}

TEST_F(UcQueuePairTest, WriteSegmentsWithOneRethAndImmediateOnTheLastPacket) {
  const Mr src = a.reg(700);
  const Mr dst = b.reg(700, kAccessLocalWrite | kAccessRemoteWrite);
  fill_pattern(src.bytes(0, 700), 9);
  ASSERT_TRUE(b.recv(60, {}).has_value());
  ASSERT_TRUE(
      a.post(2, WrOpcode::rdma_write_with_imm, {src.sge(0, 700)}, 0, dst.addr, dst.key, htonl(0xCAFEF00D)).has_value());
  std::vector<w::Opcode> opcodes;
  send_a_to_b([&](std::size_t i, const w::PacketView& v) {
    opcodes.push_back(v.headers.bth.opcode);
    if (i == 0) {
      EXPECT_EQ(v.headers.reth.virtual_address, dst.addr);
      EXPECT_EQ(v.headers.reth.dma_length, 700u);
    }
    if (i == 2) {
      EXPECT_EQ(v.headers.immediate, 0xCAFEF00Du);
    }
    return true;
  });
  EXPECT_EQ(opcodes, (std::vector<w::Opcode>{w::Opcode::uc_rdma_write_first, w::Opcode::uc_rdma_write_middle,
                                             w::Opcode::uc_rdma_write_last_immediate}));
  EXPECT_TRUE(has_pattern(dst.bytes(0, 700), 9));
  ASSERT_EQ(b.rcq.wcs.size(), 1u);
  EXPECT_EQ(b.rcq.wcs[0].wr_id, 60u);
  EXPECT_EQ(b.rcq.wcs[0].opcode, WcOpcode::recv_rdma_with_imm);
  EXPECT_EQ(b.rcq.wcs[0].byte_len, 700u);
  EXPECT_TRUE(b.rcq.wcs[0].wc_flags & kWcWithImm);
  EXPECT_EQ(ntohl(b.rcq.wcs[0].imm_data), 0xCAFEF00Du);
  // The sender completes without hearing back; drain_a() came back after the last packet.
  ASSERT_EQ(a.scq.wcs.size(), 1u);
  EXPECT_EQ(a.scq.wcs[0].opcode, WcOpcode::rdma_write);
  EXPECT_EQ(a.scq.wcs[0].status, WcStatus::success);
}

TEST_F(UcQueuePairTest, SendWithImmediateAndPlainWriteNeedNoReceiveButTheImmediateDoes) {
  const Mr src = a.reg(100);
  const Mr dst = b.reg(200, kAccessLocalWrite | kAccessRemoteWrite);
  fill_pattern(src.bytes(0, 100), 3);
  // A plain Write consumes no receive and completes nothing at B.
  ASSERT_TRUE(a.post(1, WrOpcode::rdma_write, {src.sge(0, 100)}, 0, dst.addr + 100, dst.key).has_value());
  send_a_to_b();
  EXPECT_TRUE(has_pattern(dst.bytes(100, 100), 3));
  EXPECT_TRUE(b.rcq.wcs.empty());
  // A Send with Immediate carries its ImmDt in the ONLY packet.
  ASSERT_TRUE(b.recv(70, {dst.sge(0, 100)}).has_value());
  ASSERT_TRUE(a.post(2, WrOpcode::send_with_imm, {src.sge(0, 10)}, 0, 0, 0, htonl(0x01020304)).has_value());
  send_a_to_b([](std::size_t, const w::PacketView& v) {
    EXPECT_EQ(v.headers.bth.opcode, w::Opcode::uc_send_only_immediate);
    return true;
  });
  ASSERT_EQ(b.rcq.wcs.size(), 1u);
  EXPECT_EQ(b.rcq.wcs[0].opcode, WcOpcode::recv);
  EXPECT_EQ(b.rcq.wcs[0].byte_len, 10u);
  EXPECT_TRUE(b.rcq.wcs[0].wc_flags & kWcWithImm);
  EXPECT_EQ(ntohl(b.rcq.wcs[0].imm_data), 0x01020304u);
  // A Write with Immediate and no receive: dropped, counted, nothing completes.
  ASSERT_TRUE(a.post(3, WrOpcode::rdma_write_with_imm, {src.sge(0, 4)}, 0, dst.addr, dst.key, 5).has_value());
  send_a_to_b();
  EXPECT_EQ(b.rcq.wcs.size(), 1u);
  EXPECT_EQ(b.qp.stats().dropped_no_receive, 1u);
  EXPECT_EQ(b.qp.state(), QpState::rts);
}

TEST_F(UcQueuePairTest, PsnGapDropsTheMessageInFlightAndTheNextFirstRecovers) {
  const Mr src = a.reg(4096);
  const Mr dst = b.reg(4096);
  fill_pattern(src.bytes(0, 4096), 11);
  ASSERT_TRUE(b.recv(80, {dst.sge(0, 2048)}).has_value());
  ASSERT_TRUE(b.recv(81, {dst.sge(2048, 2048)}).has_value());
  // Message 1 (3 packets) loses its middle packet; message 2 (3 packets) arrives whole.
  ASSERT_TRUE(a.post(1, WrOpcode::send, {src.sge(0, 600)}).has_value());
  ASSERT_TRUE(a.post(2, WrOpcode::send, {src.sge(1000, 700)}).has_value());
  send_a_to_b([](std::size_t i, const w::PacketView&) { return i != 1; });
  // Both sends completed successfully at A: UC does not know about the loss.
  ASSERT_EQ(a.scq.wcs.size(), 2u);
  EXPECT_EQ(a.scq.wcs[0].status, WcStatus::success);
  EXPECT_EQ(a.scq.wcs[1].status, WcStatus::success);
  // At B the Last of message 1 met a PSN gap: message 1 is lost. Message 2 landed in the
  // receive message 1 had begun (its receive is reused from its start).
  EXPECT_EQ(b.qp.stats().dropped_out_of_sequence, 1u);
  EXPECT_EQ(b.qp.stats().messages_discarded, 1u);
  ASSERT_EQ(b.rcq.wcs.size(), 1u);
  EXPECT_EQ(b.rcq.wcs[0].wr_id, 80u);
  EXPECT_EQ(b.rcq.wcs[0].byte_len, 700u);
  EXPECT_TRUE(std::equal(dst.data, dst.data + 700, src.data + 1000));
  EXPECT_EQ(b.qp.recv_queue_size(), 1u);
  EXPECT_EQ(b.qp.state(), QpState::rts);

  // A lost First: the Middle and Last that follow are dropped until the next Only.
  ASSERT_TRUE(a.post(3, WrOpcode::send, {src.sge(0, 600)}).has_value());
  ASSERT_TRUE(a.post(4, WrOpcode::send_with_imm, {src.sge(2000, 50)}, 0, 0, 0, htonl(44)).has_value());
  send_a_to_b([](std::size_t i, const w::PacketView&) { return i != 0; });
  EXPECT_EQ(b.qp.stats().dropped_out_of_sequence, 3u);
  EXPECT_EQ(b.qp.stats().messages_discarded, 1u);  // nothing was in progress
  ASSERT_EQ(b.rcq.wcs.size(), 2u);
  EXPECT_EQ(b.rcq.wcs[1].wr_id, 81u);
  EXPECT_EQ(b.rcq.wcs[1].byte_len, 50u);
  EXPECT_EQ(ntohl(b.rcq.wcs[1].imm_data), 44u);
  EXPECT_TRUE(std::equal(dst.data + 2048, dst.data + 2098, src.data + 2000));
}

TEST_F(UcQueuePairTest, ReorderedMiddleIsAGapAndANewFirstEndsAMessageInProgress) {
  const Mr src = a.reg(2048);
  const Mr dst = b.reg(2048);
  ASSERT_TRUE(b.recv(1, {dst.sge(0, 2048)}).has_value());
  ASSERT_TRUE(a.post(1, WrOpcode::send, {src.sge(0, 768)}).has_value());  // 3 packets
  auto packets = drain_a();
  ASSERT_EQ(packets.size(), 3u);
  to_b(packets[0]);
  to_b(packets[2]);  // Last before Middle: a gap
  to_b(packets[1]);  // then Middle with no message in progress
  EXPECT_EQ(b.qp.stats().dropped_out_of_sequence, 2u);
  EXPECT_TRUE(b.rcq.wcs.empty());
  // A First while a message is in progress starts over.
  ASSERT_TRUE(a.post(2, WrOpcode::send, {src.sge(0, 600)}).has_value());
  ASSERT_TRUE(a.post(3, WrOpcode::send, {src.sge(0, 300)}).has_value());
  packets = drain_a();
  ASSERT_EQ(packets.size(), 5u);
  to_b(packets[0]);  // message 2's First
  to_b(packets[3]);  // message 3's First: message 2 is discarded
  to_b(packets[4]);
  ASSERT_EQ(b.rcq.wcs.size(), 1u);
  EXPECT_EQ(b.rcq.wcs[0].byte_len, 300u);
  EXPECT_EQ(b.qp.stats().messages_discarded, 2u);
}

TEST_F(UcQueuePairTest, SendWithoutAPostedReceiveIsDroppedAndCounted) {
  const Mr src = a.reg(600);
  const Mr dst = b.reg(600);
  fill_pattern(src.bytes(0, 600), 5);
  ASSERT_TRUE(a.post(1, WrOpcode::send, {src.sge(0, 600)}).has_value());  // 3 packets
  send_a_to_b();
  EXPECT_EQ(b.qp.stats().dropped_no_receive, 1u);
  EXPECT_EQ(b.qp.stats().dropped_out_of_sequence, 2u);  // its Middle and Last
  EXPECT_TRUE(b.rcq.wcs.empty());
  EXPECT_EQ(b.qp.state(), QpState::rts);  // no RNR, no error
  ASSERT_EQ(a.scq.wcs.size(), 1u);
  EXPECT_EQ(a.scq.wcs[0].status, WcStatus::success);
  // The next one finds its receive.
  ASSERT_TRUE(b.recv(9, {dst.sge(0, 600)}).has_value());
  ASSERT_TRUE(a.post(2, WrOpcode::send, {src.sge(0, 600)}).has_value());
  send_a_to_b();
  ASSERT_EQ(b.rcq.wcs.size(), 1u);
  EXPECT_EQ(b.rcq.wcs[0].wr_id, 9u);
  EXPECT_TRUE(has_pattern(dst.bytes(0, 600), 5));
}

TEST_F(UcQueuePairTest, ReadInvalidateAndOversizedWrsAreRefusedAtPost) {
  const Mr buf = a.reg(256);
  EXPECT_EQ(a.post(1, WrOpcode::rdma_read, {buf.sge(0, 8)}, 0, 0x1000, 5).error(), std::errc::invalid_argument);
  EXPECT_EQ(a.post(2, WrOpcode::send_with_invalidate, {buf.sge(0, 8)}).error(), std::errc::invalid_argument);
  EXPECT_EQ(a.post(3, WrOpcode::send, {buf.sge(0, 1), buf.sge(1, 1), buf.sge(2, 1), buf.sge(3, 1), buf.sge(4, 1)})
                .error(),
            std::errc::invalid_argument);
  EXPECT_EQ(a.post(4, WrOpcode::send, {buf.sge(0, 65)}, kSendInline).error(), std::errc::invalid_argument);
  EXPECT_TRUE(drain_a().empty());
  EXPECT_TRUE(a.scq.wcs.empty());
  EXPECT_EQ(a.qp.state(), QpState::rts);
  // Before RTS a send is refused too; receives may be posted from RESET on.
  UcNode fresh(0x55, 3);
  const Mr fb = fresh.reg(16);
  EXPECT_EQ(fresh.post(1, WrOpcode::send, {fb.sge(0, 4)}).error(), std::errc::invalid_argument);
  EXPECT_TRUE(fresh.recv(1, {fb.sge(0, 16)}).has_value());
  EXPECT_EQ(fresh.qp.to_rts(0).error(), std::errc::invalid_argument);
  EXPECT_EQ(fresh.qp.to_rtr(path_of(true, w::PathMtu::mtu256)).error(), std::errc::invalid_argument);  // not INIT
  ASSERT_TRUE(fresh.qp.to_init().has_value());
  UcPath bad = path_of(true, w::PathMtu::mtu256);
  bad.remote_qpn = 0x1000000;
  EXPECT_EQ(fresh.qp.to_rtr(bad).error(), std::errc::invalid_argument);
}

TEST_F(UcQueuePairTest, SendQueueFullIsEnomemAndInlineDataIsCopiedAtPost) {
  const Mr src = a.reg(64);
  fill_pattern(src.bytes(0, 64), 1);
  const Mr dst = b.reg(64);
  ASSERT_TRUE(b.recv(1, {dst.sge(0, 64)}).has_value());
  ASSERT_TRUE(a.post(1, WrOpcode::send, {src.sge(0, 64)}, kSendInline).has_value());
  std::memset(src.data, 0, 64);  // the inline copy was taken at post
  for (std::uint64_t i = 2; i <= 16; ++i) ASSERT_TRUE(a.post(i, WrOpcode::rdma_write, {}, 0, 0, 0).has_value());
  EXPECT_EQ(a.post(17, WrOpcode::send, {}).error(), std::errc::not_enough_memory);
  send_a_to_b();
  ASSERT_EQ(b.rcq.wcs.size(), 1u);
  EXPECT_TRUE(has_pattern(dst.bytes(0, 64), 1));
  EXPECT_EQ(a.scq.wcs.size(), 16u);
  EXPECT_EQ(b.qp.stats().messages_delivered, 16u);  // zero-length Writes need no valid R_Key
}

TEST_F(UcQueuePairTest, ErrorFlushesEveryOutstandingWr) {
  const Mr src = a.reg(1024);
  ASSERT_TRUE(a.post(1, WrOpcode::send, {src.sge(0, 600)}).has_value());
  ASSERT_TRUE(a.post(2, WrOpcode::send, {src.sge(0, 10)}).has_value());
  ASSERT_TRUE(a.recv(10, {src.sge(0, 100)}).has_value());
  ASSERT_TRUE(a.recv(11, {src.sge(100, 100)}).has_value());
  RcDatagram d;
  ASSERT_TRUE(a.qp.poll_datagram(d));  // WR 1's First left; WR 1 is mid-message
  a.qp.modify_to_error();
  EXPECT_EQ(a.qp.state(), QpState::error);
  ASSERT_EQ(a.scq.wcs.size(), 2u);
  EXPECT_EQ(a.scq.wcs[0].wr_id, 1u);
  EXPECT_EQ(a.scq.wcs[0].status, WcStatus::wr_flush_error);
  EXPECT_EQ(a.scq.wcs[1].status, WcStatus::wr_flush_error);
  ASSERT_EQ(a.rcq.wcs.size(), 2u);
  EXPECT_EQ(a.rcq.wcs[0].wr_id, 10u);
  EXPECT_EQ(a.rcq.wcs[1].wr_id, 11u);
  EXPECT_EQ(a.rcq.wcs[1].status, WcStatus::wr_flush_error);
  EXPECT_FALSE(a.qp.poll_datagram(d));
  // Later WRs flush at once; datagrams are dropped.
  ASSERT_TRUE(a.post(3, WrOpcode::send, {src.sge(0, 8)}).has_value());
  ASSERT_TRUE(a.recv(12, {src.sge(0, 8)}).has_value());
  EXPECT_EQ(a.scq.wcs.back().wr_id, 3u);
  EXPECT_EQ(a.scq.wcs.back().status, WcStatus::wr_flush_error);
  EXPECT_EQ(a.rcq.wcs.back().wr_id, 12u);
  const std::uint64_t before = a.qp.stats().dropped_not_ready;
  a.qp.handle_datagram(Bytes(64, 0), kIpB, kPortB);
  EXPECT_EQ(a.qp.stats().dropped_not_ready, before + 1);
}

TEST_F(UcQueuePairTest, LastPacketHandedOutCompletesSuccessfullyBeforeTheFlush) {
  const Mr src = a.reg(64);
  ASSERT_TRUE(a.post(1, WrOpcode::send, {src.sge(0, 8)}).has_value());
  ASSERT_TRUE(a.post(2, WrOpcode::send, {src.sge(0, 8)}).has_value());
  RcDatagram d;
  ASSERT_TRUE(a.qp.poll_datagram(d));
  EXPECT_TRUE(a.scq.wcs.empty());  // its payload iovecs are still in use
  a.qp.modify_to_error();
  ASSERT_EQ(a.scq.wcs.size(), 2u);
  EXPECT_EQ(a.scq.wcs[0].status, WcStatus::success);
  EXPECT_EQ(a.scq.wcs[1].status, WcStatus::wr_flush_error);
}

TEST_F(UcQueuePairTest, BadLkeyAndTooSmallReceiveCompleteInErrorAndMoveToError) {
  const Mr src = a.reg(64);
  Sge bad = src.sge(0, 8);
  bad.lkey ^= 0x5A5A;
  ASSERT_TRUE(a.post(1, WrOpcode::send, {bad}).has_value());
  ASSERT_EQ(a.scq.wcs.size(), 1u);
  EXPECT_EQ(a.scq.wcs[0].status, WcStatus::local_protection_error);
  EXPECT_EQ(a.qp.state(), QpState::error);

  UcNode c(kQpnA, 4);
  const Mr csrc = c.reg(600);
  ASSERT_TRUE(c.qp.to_init().has_value());
  ASSERT_TRUE(c.qp.to_rtr(path_of(true, w::PathMtu::mtu256)).has_value());
  ASSERT_TRUE(c.qp.to_rts(kPsnA).has_value());
  const Mr dst = b.reg(100);
  ASSERT_TRUE(b.recv(1, {dst.sge(0, 100)}).has_value());
  ASSERT_TRUE(b.recv(2, {dst.sge(0, 100)}).has_value());
  ASSERT_TRUE(c.post(1, WrOpcode::send, {csrc.sge(0, 300)}).has_value());
  RcDatagram d;
  while (c.qp.poll_datagram(d)) b.qp.handle_datagram(flatten(d), kIpA, kPortA);
  ASSERT_EQ(b.rcq.wcs.size(), 2u);
  EXPECT_EQ(b.rcq.wcs[0].wr_id, 1u);
  EXPECT_EQ(b.rcq.wcs[0].status, WcStatus::local_length_error);
  EXPECT_EQ(b.rcq.wcs[1].status, WcStatus::wr_flush_error);
  EXPECT_EQ(b.qp.state(), QpState::error);
}

TEST_F(UcQueuePairTest, AReceiveWithABadLkeyCompletesInErrorWhenASendTakesIt) {
  const Mr src = a.reg(64);
  const Mr dst = b.reg(64);
  Sge bad = dst.sge(0, 64);
  bad.lkey ^= 0x5A5A;
  ASSERT_TRUE(b.recv(1, {bad}).has_value());
  ASSERT_TRUE(b.recv(2, {dst.sge(0, 64)}).has_value());
  EXPECT_TRUE(b.rcq.wcs.empty());  // found out when a Send lands in it
  ASSERT_TRUE(a.post(1, WrOpcode::send, {src.sge(0, 8)}).has_value());
  send_a_to_b();
  ASSERT_EQ(b.rcq.wcs.size(), 2u);
  EXPECT_EQ(b.rcq.wcs[0].wr_id, 1u);
  EXPECT_EQ(b.rcq.wcs[0].status, WcStatus::local_protection_error);
  EXPECT_EQ(b.rcq.wcs[1].status, WcStatus::wr_flush_error);
  EXPECT_EQ(b.qp.state(), QpState::error);
}

TEST_F(UcQueuePairTest, WriteWithABadRkeyIsDroppedWithoutError) {
  const Mr src = a.reg(600);
  const Mr dst = b.reg(600, kAccessLocalWrite);  // no remote write
  fill_pattern(src.bytes(0, 600), 2);
  ASSERT_TRUE(a.post(1, WrOpcode::rdma_write, {src.sge(0, 600)}, 0, dst.addr, dst.key).has_value());
  send_a_to_b();
  EXPECT_EQ(b.qp.stats().dropped_access, 1u);
  EXPECT_EQ(b.qp.stats().dropped_out_of_sequence, 2u);
  EXPECT_EQ(dst.data[0], 0);
  EXPECT_EQ(b.qp.state(), QpState::rts);
}

TEST_F(UcQueuePairTest, HostileDatagramsAreDroppedAndCounted) {
  const Mr src = a.reg(64);
  const Mr dst = b.reg(64);
  ASSERT_TRUE(b.recv(1, {dst.sge(0, 64)}).has_value());
  ASSERT_TRUE(a.post(1, WrOpcode::send, {src.sge(0, 32)}).has_value());
  const auto packets = drain_a();
  ASSERT_EQ(packets.size(), 1u);
  const Bytes good = packets[0];
  const w::IcrcPseudoHeader pseudo{.ip = w::Ipv4IcrcFields{.source = kIpA, .destination = kIpB},
                                   .udp_source_port = kPortA};
  auto reencode = [&](const std::function<void(w::PacketHeaders&)>& change, std::size_t payload = 32) {
    auto view = w::decode_packet(good);
    EXPECT_TRUE(view.has_value());
    w::PacketHeaders h = view->headers;
    change(h);
    Bytes body(payload, 0xAB);
    Bytes out(w::packet_size(h.bth.opcode, body.size()));
    auto size = w::encode_packet(h, body, pseudo, out);
    EXPECT_TRUE(size.has_value());
    out.resize(size ? *size : 0);
    return out;
  };
  Bytes corrupted = good;
  corrupted[w::kBthSize + 3] ^= 0xFF;
  to_b(corrupted);
  EXPECT_EQ(b.qp.stats().dropped_bad_icrc, 1u);
  b.qp.handle_datagram(good, kIpA, kPortA + 1);  // another source port: ICRC fails
  EXPECT_EQ(b.qp.stats().dropped_bad_icrc, 2u);
  b.qp.handle_datagram(good, std::array<std::uint8_t, 4>{10, 0, 0, 66}, kPortA);  // another address, a valid ICRC
  EXPECT_EQ(b.qp.stats().dropped_foreign_source, 1u);
  to_b(Bytes(good.begin(), good.begin() + 10));  // truncated
  to_b(reencode([](w::PacketHeaders& h) { h.bth.destination_qp = 0x99; }));
  to_b(reencode([](w::PacketHeaders& h) { h.bth.opcode = w::Opcode::rc_send_only; }));
  to_b(reencode([](w::PacketHeaders& h) { h.bth.opcode = w::Opcode::ud_send_only; }));
  to_b(reencode([](w::PacketHeaders& h) { h.bth.partition_key = 0x1234; }));
  to_b(reencode([](w::PacketHeaders& h) { h.bth.opcode = w::Opcode::uc_send_only; }, 300));  // over the PMTU
  EXPECT_EQ(b.qp.stats().dropped_malformed, 6u);
  EXPECT_TRUE(b.rcq.wcs.empty());
  EXPECT_EQ(b.qp.state(), QpState::rts);
  // The real one still lands.
  to_b(good);
  ASSERT_EQ(b.rcq.wcs.size(), 1u);
  EXPECT_EQ(b.rcq.wcs[0].byte_len, 32u);
  EXPECT_EQ(b.qp.stats().datagrams_received, 10u);
}

TEST(UcQueuePairSrq, SendsTakeTheSharedQueuesReceivesInPostingOrder) {
  MemoryTable memory(5);
  TestCq scq, rcq;
  ReceiveQueue srq;
  UcQueuePair b(UcQpConfig{.qpn = kQpnB, .pd = 1, .caps = {.max_send_wr = 4, .max_send_sge = 1}, .srq = &srq}, memory,
                scq, rcq);
  ASSERT_TRUE(b.to_init().has_value());
  ASSERT_TRUE(b.to_rtr(path_of(false, w::PathMtu::mtu256)).has_value());
  UcNode a(kQpnA, 6);
  ASSERT_TRUE(a.qp.to_init().has_value());
  ASSERT_TRUE(a.qp.to_rtr(path_of(true, w::PathMtu::mtu256)).has_value());
  ASSERT_TRUE(a.qp.to_rts(kPsnA).has_value());
  std::vector<std::uint8_t> sink(64, 0);
  auto key = memory.register_region(1, reinterpret_cast<std::uintptr_t>(sink.data()), sink.size(), kAccessLocalWrite);
  ASSERT_TRUE(key.has_value());
  const std::uint64_t base = reinterpret_cast<std::uintptr_t>(sink.data());
  srq.post(RecvWr{.wr_id = 1, .sg_list = {Sge{base, 32, *key}}}, memory, 1);
  srq.post(RecvWr{.wr_id = 2, .sg_list = {Sge{base + 32, 32, *key}}}, memory, 1);
  EXPECT_EQ(b.post_recv(RecvWr{.wr_id = 3}).error(), std::errc::invalid_argument);
  const Mr src = a.reg(32);
  fill_pattern(src.bytes(0, 32), 4);
  ASSERT_TRUE(a.post(10, WrOpcode::send, {src.sge(0, 20)}).has_value());
  ASSERT_TRUE(a.post(11, WrOpcode::send, {src.sge(0, 32)}).has_value());
  RcDatagram d;
  while (a.qp.poll_datagram(d)) b.handle_datagram(flatten(d), kIpA, kPortA);  // B in RTR: it receives
  ASSERT_EQ(rcq.wcs.size(), 2u);
  EXPECT_EQ(rcq.wcs[0].wr_id, 1u);
  EXPECT_EQ(rcq.wcs[0].byte_len, 20u);
  EXPECT_EQ(rcq.wcs[1].wr_id, 2u);
  EXPECT_TRUE(has_pattern(std::span<const std::uint8_t>(sink.data() + 32, 32), 4));
  EXPECT_TRUE(srq.empty());
}

TEST(UcQueuePairState, DatagramsBeforeRtrAreDropped) {
  UcNode node(kQpnB, 1);
  node.qp.handle_datagram(Bytes(40, 0), kIpA, kPortA);
  EXPECT_EQ(node.qp.stats().dropped_not_ready, 1u);
  ASSERT_TRUE(node.qp.to_init().has_value());
  node.qp.handle_datagram(Bytes(40, 0), kIpA, kPortA);
  EXPECT_EQ(node.qp.stats().dropped_not_ready, 2u);
  EXPECT_EQ(node.qp.state(), QpState::init);
}

}  // namespace
}  // namespace peercm::core::roce::test
