// Verbs without the CM over RoCE (src/api/roce/roce_verbs.hpp), two contexts in one process:
// GIDs, an RC pair connected by connect_rc (what modify_qp RTR/RTS does), UD QPs, a UC pair
// connected by modify_uc, and the device dropping and counting datagrams that name no QP of it.
#include <gtest/gtest.h>

#include <cstring>

#include "api/roce/roce_verbs.hpp"
#include "loopback_pair.hpp"

namespace peercm::test {
namespace {

namespace roce = detail::roce;

constexpr std::uint32_t kQkey = 0x11111111;

core::roce::Ipv4Bytes bytes(std::uint32_t address) {
  return {static_cast<std::uint8_t>(address >> 24), static_cast<std::uint8_t>(address >> 16),
          static_cast<std::uint8_t>(address >> 8), static_cast<std::uint8_t>(address)};
}

std::unique_ptr<QueuePair> standalone_qp(Side& side) {
  return std::move(QueuePair::create(*side.pd, side.qp_attr()).value());
}

TEST(RoceVerbs, GidIndexZeroIsAContextsOwnLoopbackAddress) {
  Side a;
  Side b;
  const auto address_a = roce::gid_address(*a.context, 0);
  const auto address_b = roce::gid_address(*b.context, 0);
  ASSERT_TRUE(address_a && address_b);
  EXPECT_EQ(*address_a >> 24, 127u);
  EXPECT_EQ(*address_b >> 24, 127u);
  EXPECT_NE(*address_a, *address_b);  // two nodes never share (address, 4791)
  EXPECT_EQ(*roce::gid_address(*a.context, 0), *address_a);  // stable
  EXPECT_EQ(roce::gid_index_of(*a.context, *address_a), 0);
  EXPECT_EQ(roce::gid_index_of(*a.context, *address_b), -1);
  EXPECT_EQ(roce::gid_address(*a.context, 1000).error(), std::errc::invalid_argument);
  EXPECT_EQ(roce::gid_address(*a.context, -1).error(), std::errc::invalid_argument);
}

TEST(RoceVerbs, RcPairConnectedWithoutTheCmMovesSendsAndWrites) {
  Side a;
  Side b;
  auto qp_a = standalone_qp(a);
  auto qp_b = standalone_qp(b);
  const std::uint32_t address_a = *roce::gid_address(*a.context, 0);
  const std::uint32_t address_b = *roce::gid_address(*b.context, 0);
  std::vector<std::uint8_t> buffer_a(1 << 16), buffer_b(1 << 16);
  auto mr_a = a.region(buffer_a);
  auto mr_b = b.region(buffer_b);
  // A receive posted before the connection (INIT) moves with the QP to its RC core.
  ASSERT_TRUE(qp_b->post_recv(RecvWr{.wr_id = 7, .sg_list = {mr_b->sge(0, 20000)}}));
  const roce::RcPath a_to_b{.local = address_a, .remote = address_b, .remote_qpn = qp_b->qp_num(),
                            .rq_psn = 0x222, .sq_psn = 0x111, .path_mtu = 1024};
  const roce::RcPath b_to_a{.local = address_b, .remote = address_a, .remote_qpn = qp_a->qp_num(),
                            .rq_psn = 0x111, .sq_psn = 0x222, .path_mtu = 1024};
  ASSERT_TRUE(roce::connect_rc(*qp_a, a_to_b));
  ASSERT_TRUE(roce::connect_rc(*qp_b, b_to_a));
  EXPECT_EQ(qp_a->state(), QpState::rts);
  EXPECT_EQ(roce::connect_rc(*qp_a, a_to_b).error(), std::errc::invalid_argument);  // runs already

  for (std::size_t i = 0; i < 20000; ++i) buffer_a[i] = static_cast<std::uint8_t>(i * 7);
  SendWr send;
  send.wr_id = 1;
  send.opcode = WrOpcode::send;
  send.flags = kSendSignaled;
  send.sg_list = {mr_a->sge(0, 20000)};
  ASSERT_TRUE(qp_a->post_send(send));
  SendWr write;
  write.wr_id = 2;
  write.opcode = WrOpcode::rdma_write;
  write.flags = kSendSignaled;
  write.sg_list = {mr_a->sge(0, 30000)};
  write.remote_addr = reinterpret_cast<std::uintptr_t>(buffer_b.data()) + 30000;
  write.rkey = mr_b->rkey();
  ASSERT_TRUE(qp_a->post_send(write));
  const auto sent = poll_n(*a.cq, 2);
  ASSERT_EQ(sent.size(), 2u);
  for (const auto& wc : sent) EXPECT_EQ(wc.status, WcStatus::success);
  const auto received = poll_n(*b.cq, 1);
  ASSERT_EQ(received.size(), 1u);
  EXPECT_EQ(received[0].wr_id, 7u);
  EXPECT_EQ(received[0].byte_len, 20000u);
  EXPECT_EQ(std::memcmp(buffer_a.data(), buffer_b.data(), 20000), 0);
  EXPECT_EQ(std::memcmp(buffer_a.data(), buffer_b.data() + 30000, 30000), 0);
}

TEST(RoceVerbs, ConnectRcRefusesBadPaths) {
  Side a;
  auto qp = standalone_qp(a);
  const std::uint32_t local = *roce::gid_address(*a.context, 0);
  roce::RcPath path{.local = local, .remote = local + 1, .remote_qpn = 0x100, .path_mtu = 1000};
  EXPECT_EQ(roce::connect_rc(*qp, path).error(), std::errc::invalid_argument);  // no such MTU
  path.path_mtu = 4096;
  path.remote_qpn = 1u << 24;
  EXPECT_EQ(roce::connect_rc(*qp, path).error(), std::errc::invalid_argument);
  path.remote_qpn = 0x100;
  path.local = (127u << 24) | 0x0A0B0C;  // not an address of this context
  EXPECT_EQ(roce::connect_rc(*qp, path).error(), std::errc::invalid_argument);
  path.local = local;
  EXPECT_TRUE(roce::connect_rc(*qp, path));
}

TEST(RoceVerbs, UdDatagramsToUnknownQpnsAreDroppedAndCounted) {
  Side a;
  Side b;
  auto qp_a = standalone_qp(a);
  auto qp_b = standalone_qp(b);
  ASSERT_TRUE(roce::make_ud(*qp_a));
  ASSERT_TRUE(roce::make_ud(*qp_b));
  EXPECT_TRUE(roce::is_ud(*qp_a));
  for (auto* qp : {qp_a.get(), qp_b.get()}) {
    ASSERT_TRUE(roce::modify_ud(*qp, roce::UdState::init, kQkey, true, 0));
    ASSERT_TRUE(roce::modify_ud(*qp, roce::UdState::rtr, 0, false, 0));
    ASSERT_TRUE(roce::modify_ud(*qp, roce::UdState::rts, 0, false, 5));
  }
  EXPECT_EQ(roce::ud_qkey(*qp_b), kQkey);
  EXPECT_EQ(roce::modify_ud(*qp_a, roce::UdState::init, 0, false, 0).error(), std::errc::invalid_argument);
  const std::uint32_t address_a = *roce::gid_address(*a.context, 0);
  const std::uint32_t address_b = *roce::gid_address(*b.context, 0);
  std::vector<std::uint8_t> buffer_a(4096), buffer_b(4096);
  auto mr_a = a.region(buffer_a);
  auto mr_b = b.region(buffer_b);
  // A plain post_send has no address: EINVAL.
  SendWr send;
  send.wr_id = 1;
  send.opcode = WrOpcode::send;
  send.flags = kSendSignaled;
  send.sg_list = {mr_a->sge(0, 100)};
  EXPECT_EQ(qp_a->post_send(send).error(), std::errc::invalid_argument);

  core::roce::UdDestination nobody{.local_ip = bytes(address_a), .remote_ip = bytes(address_b),
                                   .remote_qpn = qp_b->qp_num() + 50, .remote_qkey = kQkey};
  ASSERT_TRUE(roce::post_ud_send(*qp_a, send, nobody));
  ASSERT_EQ(poll_n(*a.cq, 1).size(), 1u);  // sent: UD completes as the datagram leaves

  ASSERT_TRUE(qp_b->post_recv(RecvWr{.wr_id = 9, .sg_list = {mr_b->sge(0, 40 + 100)}}));
  core::roce::UdDestination to_b = nobody;
  to_b.remote_qpn = qp_b->qp_num();
  for (std::size_t i = 0; i < 100; ++i) buffer_a[i] = static_cast<std::uint8_t>(i + 1);
  ASSERT_TRUE(roce::post_ud_send(*qp_a, send, to_b));
  const auto received = poll_n(*b.cq, 1);
  ASSERT_EQ(received.size(), 1u);
  EXPECT_EQ(received[0].src_qp, qp_a->qp_num());
  EXPECT_EQ(received[0].byte_len, 140u);
  EXPECT_TRUE(received[0].wc_flags & kWcGrh);
  EXPECT_EQ(std::memcmp(buffer_a.data(), buffer_b.data() + 40, 100), 0);
  // The datagram before it was for a QPN b has not; it arrived first (one socket, in order).
  EXPECT_EQ(roce::dropped_unknown_qp(*b.context), 1u);
  EXPECT_EQ(roce::ud_stats(*qp_b).datagrams_received, 1u);

  // A send from another source address than the QP's first is refused.
  core::roce::UdDestination elsewhere = to_b;
  elsewhere.local_ip = bytes(address_a + 1);
  EXPECT_EQ(roce::post_ud_send(*qp_a, send, elsewhere).error(), std::errc::invalid_argument);
}

TEST(RoceVerbs, UcPairMovesMessagesAndDropsASendWithoutAReceive) {
  Side a;
  Side b;
  auto qp_a = standalone_qp(a);
  auto qp_b = standalone_qp(b);
  ASSERT_TRUE(roce::make_uc(*qp_a));
  ASSERT_TRUE(roce::make_uc(*qp_b));
  EXPECT_EQ(roce::make_uc(*qp_a).error(), std::errc::invalid_argument);  // one RoCE half per QP
  const std::uint32_t address_a = *roce::gid_address(*a.context, 0);
  const std::uint32_t address_b = *roce::gid_address(*b.context, 0);
  EXPECT_EQ(roce::modify_uc(*qp_a, {.state = roce::UcState::rts}).error(), std::errc::invalid_argument);
  roce::UcModify rtr_a{.state = roce::UcState::rtr, .local = address_a, .remote = address_b,
                       .remote_qpn = qp_b->qp_num(), .rq_psn = 0x222, .path_mtu = 1000};
  roce::UcModify rtr_b{.state = roce::UcState::rtr, .local = address_b, .remote = address_a,
                       .remote_qpn = qp_a->qp_num(), .rq_psn = 0x111, .path_mtu = 1024};
  ASSERT_TRUE(roce::modify_uc(*qp_a, {.state = roce::UcState::init}));
  ASSERT_TRUE(roce::modify_uc(*qp_b, {.state = roce::UcState::init}));
  EXPECT_EQ(roce::modify_uc(*qp_a, rtr_a).error(), std::errc::invalid_argument);  // no such MTU
  rtr_a.path_mtu = 1024;
  ASSERT_TRUE(roce::modify_uc(*qp_a, rtr_a));
  ASSERT_TRUE(roce::modify_uc(*qp_b, rtr_b));
  EXPECT_EQ(qp_b->state(), QpState::rtr);
  ASSERT_TRUE(roce::modify_uc(*qp_a, {.state = roce::UcState::rts, .sq_psn = 0x111}));
  ASSERT_TRUE(roce::modify_uc(*qp_b, {.state = roce::UcState::rts, .sq_psn = 0x222}));
  EXPECT_EQ(qp_a->state(), QpState::rts);

  std::vector<std::uint8_t> buffer_a(1 << 16), buffer_b(1 << 16);
  auto mr_a = a.region(buffer_a);
  auto mr_b = b.region(buffer_b);
  for (std::size_t i = 0; i < buffer_a.size(); ++i) buffer_a[i] = static_cast<std::uint8_t>(i * 13 + 1);
  SendWr send;
  send.wr_id = 1;
  send.opcode = WrOpcode::send;
  send.flags = kSendSignaled;
  send.sg_list = {mr_a->sge(0, 5000)};
  // No receive at b: dropped there, yet a success here (UC never hears back).
  ASSERT_TRUE(qp_a->post_send(send));
  const auto first = poll_n(*a.cq, 1);
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0].status, WcStatus::success);
  // b takes it on its own progress: wait until it has (and dropped it), bounded.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (roce::uc_stats(*qp_b).dropped_no_receive == 0 && std::chrono::steady_clock::now() < deadline)
    EXPECT_TRUE(poll_n(*b.cq, 1, std::chrono::milliseconds(1)).empty());
  ASSERT_EQ(roce::uc_stats(*qp_b).dropped_no_receive, 1u);
  // Then a Write and a Send that find their receive.
  ASSERT_TRUE(qp_b->post_recv(RecvWr{.wr_id = 9, .sg_list = {mr_b->sge(0, 20000)}}));
  SendWr write;
  write.wr_id = 2;
  write.opcode = WrOpcode::rdma_write;
  write.flags = kSendSignaled;
  write.sg_list = {mr_a->sge(0, 30000)};
  write.remote_addr = reinterpret_cast<std::uintptr_t>(buffer_b.data()) + 30000;
  write.rkey = mr_b->rkey();
  ASSERT_TRUE(qp_a->post_send(write));
  send.wr_id = 3;
  send.sg_list = {mr_a->sge(100, 12000)};
  ASSERT_TRUE(qp_a->post_send(send));
  SendWr read = write;
  read.opcode = WrOpcode::rdma_read;
  EXPECT_EQ(qp_a->post_send(read).error(), std::errc::invalid_argument);  // UC has no Read
  ASSERT_EQ(poll_n(*a.cq, 2).size(), 2u);
  const auto received = poll_n(*b.cq, 1);
  ASSERT_EQ(received.size(), 1u);
  EXPECT_EQ(received[0].wr_id, 9u);
  EXPECT_EQ(received[0].byte_len, 12000u);
  EXPECT_EQ(std::memcmp(buffer_a.data() + 100, buffer_b.data(), 12000), 0);
  EXPECT_EQ(std::memcmp(buffer_a.data(), buffer_b.data() + 30000, 30000), 0);
  const core::roce::UcStats stats = roce::uc_stats(*qp_b);
  EXPECT_EQ(stats.dropped_no_receive, 1u);
  EXPECT_EQ(stats.messages_delivered, 2u);
  EXPECT_EQ(roce::dropped_unknown_qp(*b.context), 0u);

  qp_a->to_error();
  EXPECT_EQ(qp_a->state(), QpState::error);
  ASSERT_TRUE(qp_a->post_send(send));  // flushed at once
  const auto flushed = poll_n(*a.cq, 1);
  ASSERT_EQ(flushed.size(), 1u);
  EXPECT_EQ(flushed[0].status, WcStatus::wr_flush_error);
}

}  // namespace
}  // namespace peercm::test
