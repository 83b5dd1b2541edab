// Verbs without the CM over RoCE (src/api/roce/roce_verbs.hpp), two contexts in one process:
// GIDs, an RC pair connected by connect_rc (what modify_qp RTR/RTS does), UD QPs, a UC pair
// connected by modify_uc, and the device dropping and counting datagrams that name no QP of it
// or come from an address other than the QP's peer.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <set>
#include <span>
#include <thread>
#include <vector>

#include "api/roce/roce_verbs.hpp"
#include "wire/roce/packet.hpp"
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

// A pump drains the QPs that took an input, not every QP of the context: with many idle
// connections, one busy pair's traffic costs each context a few QP drains per message. (A
// pump that walked every QP drained all kIdlePairs + 1 of them per input: far over the bound.)
TEST(RoceVerbs, IdleQueuePairsAreNotDrainedForAnotherPairsTraffic) {
  constexpr std::size_t kIdlePairs = 128;
  constexpr std::size_t kMessages = 50;
  Side a;
  Side b;
  const std::uint32_t address_a = *roce::gid_address(*a.context, 0);
  const std::uint32_t address_b = *roce::gid_address(*b.context, 0);
  std::vector<std::unique_ptr<QueuePair>> qps_a, qps_b;
  for (std::size_t i = 0; i <= kIdlePairs; ++i) {  // the last pair is the busy one
    qps_a.push_back(standalone_qp(a));
    qps_b.push_back(standalone_qp(b));
    const std::uint32_t psn = static_cast<std::uint32_t>(0x100 + i);
    ASSERT_TRUE(roce::connect_rc(*qps_a.back(), {.local = address_a, .remote = address_b,
                                                  .remote_qpn = qps_b.back()->qp_num(), .rq_psn = psn,
                                                  .sq_psn = psn, .path_mtu = 1024}));
    ASSERT_TRUE(roce::connect_rc(*qps_b.back(), {.local = address_b, .remote = address_a,
                                                  .remote_qpn = qps_a.back()->qp_num(), .rq_psn = psn,
                                                  .sq_psn = psn, .path_mtu = 1024}));
  }
  QueuePair& busy_a = *qps_a.back();
  QueuePair& busy_b = *qps_b.back();
  std::vector<std::uint8_t> buffer_a(64), buffer_b(64 * kMessages);
  auto mr_a = a.region(buffer_a);
  auto mr_b = b.region(buffer_b);
  for (std::size_t i = 0; i < kMessages; ++i)
    ASSERT_TRUE(busy_b.post_recv(RecvWr{.wr_id = i, .sg_list = {mr_b->sge(64 * i, 64)}}));

  const std::uint64_t drains_before = roce::qp_drains(*a.context) + roce::qp_drains(*b.context);
  for (std::size_t i = 0; i < kMessages; ++i) {
    SendWr send;
    send.wr_id = i;
    send.opcode = WrOpcode::send;
    send.flags = kSendSignaled;
    send.sg_list = {mr_a->sge(0, 64)};
    ASSERT_TRUE(busy_a.post_send(send));
    const auto sent = poll_n(*a.cq, 1);
    ASSERT_EQ(sent.size(), 1u) << "message " << i;
    EXPECT_EQ(sent[0].status, WcStatus::success);
  }
  EXPECT_EQ(poll_n(*b.cq, kMessages).size(), kMessages);
  const std::uint64_t drains = roce::qp_drains(*a.context) + roce::qp_drains(*b.context) - drains_before;
  // Per message: the post, the Send at b, its ACK at a, and a resend or two if the host is slow.
  EXPECT_LE(drains, 8 * kMessages);
  EXPECT_GE(drains, 2 * kMessages);  // the busy pair's own drains are counted
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

// One RDMA WRITE ONLY to `qp_b`, built by hand: the right QPN, PSN and R_Key, and an ICRC
// computed as if it came from `claimed_source`, sent from a socket bound to `sent_from`.
void send_crafted_write(std::uint32_t sent_from, std::uint32_t claimed_source, std::uint32_t destination,
                        std::uint32_t qpn, std::uint32_t psn, std::uint64_t address, std::uint32_t rkey,
                        std::span<const std::uint8_t> payload) {
  const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in local{};
  local.sin_family = AF_INET;
  local.sin_addr.s_addr = htonl(sent_from);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&local), sizeof local), 0);
  socklen_t length = sizeof local;
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length), 0);
  namespace w = wire::roce;
  w::PacketHeaders headers;
  headers.bth.opcode = w::Opcode::rc_rdma_write_only;
  headers.bth.destination_qp = qpn;
  headers.bth.psn = psn;
  headers.bth.ack_request = true;
  headers.reth = w::Reth{.virtual_address = address, .r_key = rkey,
                         .dma_length = static_cast<std::uint32_t>(payload.size())};
  const w::IcrcPseudoHeader pseudo{.ip = w::Ipv4IcrcFields{.source = bytes(claimed_source), .destination = bytes(destination)},
                                   .udp_source_port = ntohs(local.sin_port)};
  std::vector<std::uint8_t> packet(w::packet_size(headers.bth.opcode, payload.size()));
  auto size = w::encode_packet(headers, payload, pseudo, packet);
  ASSERT_TRUE(size.has_value());
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(w::kRoceUdpPort);
  to.sin_addr.s_addr = htonl(destination);
  EXPECT_EQ(::sendto(fd, packet.data(), *size, 0, reinterpret_cast<sockaddr*>(&to), sizeof to),
            static_cast<ssize_t>(*size));
  ::close(fd);
}

// A connected RC QP takes packets from its peer's address alone (docs/reliability.md,
// "Packets from outside a connection"). The attacker knows the QPN, the next PSN and the
// R_Key and computes the ICRC as the peer would; from another 127/8 address its WRITE is
// dropped and counted. The same packet from the peer's address lands, so the packet itself
// was valid.
TEST(RoceVerbs, RcWriteFromAnotherAddressIsDroppedThoughEverythingElseIsRight) {
  Side a;
  Side b;
  auto qp_a = standalone_qp(a);
  auto qp_b = standalone_qp(b);
  const std::uint32_t address_a = *roce::gid_address(*a.context, 0);
  const std::uint32_t address_b = *roce::gid_address(*b.context, 0);
  const std::uint32_t attacker = address_a ^ 0x5A5A;  // another 127/8 address
  std::vector<std::uint8_t> target(4096, 0);
  auto mr_b = b.region(target);
  ASSERT_TRUE(roce::connect_rc(*qp_a, {.local = address_a, .remote = address_b, .remote_qpn = qp_b->qp_num(),
                                       .rq_psn = 0x222, .sq_psn = 0x111, .path_mtu = 1024}));
  ASSERT_TRUE(roce::connect_rc(*qp_b, {.local = address_b, .remote = address_a, .remote_qpn = qp_a->qp_num(),
                                       .rq_psn = 0x111, .sq_psn = 0x222, .path_mtu = 1024}));
  const std::vector<std::uint8_t> payload(256, 0xEE);
  const auto address = reinterpret_cast<std::uintptr_t>(target.data());
  auto wait_for = [&](auto done) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!done() && std::chrono::steady_clock::now() < deadline)
      EXPECT_TRUE(poll_n(*b.cq, 1, std::chrono::milliseconds(1)).empty());
    return done();
  };
  send_crafted_write(attacker, address_a, address_b, qp_b->qp_num(), 0x111, address, mr_b->rkey(), payload);
  ASSERT_TRUE(wait_for([&] { return roce::rc_stats(*qp_b).dropped_foreign_source == 1; }));
  EXPECT_TRUE(std::all_of(target.begin(), target.end(), [](std::uint8_t v) { return v == 0; }));
  EXPECT_EQ(roce::rc_stats(*qp_b).dropped_bad_icrc, 0u);

  send_crafted_write(address_a, address_a, address_b, qp_b->qp_num(), 0x111, address, mr_b->rkey(), payload);
  // Read the bytes only after rc_stats() (which takes the context lock) saw the datagram
  // handled: the placement happened under that lock.
  ASSERT_TRUE(wait_for([&] { return roce::rc_stats(*qp_b).datagrams_received >= 2; }));
  EXPECT_TRUE(std::all_of(target.begin(), target.begin() + 256, [](std::uint8_t v) { return v == 0xEE; }));
  EXPECT_EQ(roce::rc_stats(*qp_b).dropped_foreign_source, 1u);
}

// QPNs are wire values an attacker needs next to the PSN and R_Key (docs/reliability.md,
// "Numbers a peer can see"): consecutive QPs of a context get numbers in no order, never
// the reserved 0, 1 or 0xFFFFFF, and two contexts number their QPs unrelatedly.
TEST(RoceVerbs, QpNumbersFollowNoOrderAndSkipTheReservedOnes) {
  Side a;
  Side b;
  std::vector<std::unique_ptr<QueuePair>> qps_a, qps_b;
  std::vector<std::uint32_t> numbers;
  int equal = 0;
  for (int i = 0; i < 400; ++i) {
    qps_a.push_back(standalone_qp(a));
    qps_b.push_back(standalone_qp(b));
    numbers.push_back(qps_a.back()->qp_num());
    equal += qps_a.back()->qp_num() == qps_b.back()->qp_num();
  }
  EXPECT_LE(equal, 1);
  std::set<std::uint32_t> unique(numbers.begin(), numbers.end());
  EXPECT_EQ(unique.size(), numbers.size());
  std::set<std::uint32_t> steps;
  int predicted = 0;
  for (std::size_t i = 0; i < numbers.size(); ++i) {
    EXPECT_GT(numbers[i], 1u);
    EXPECT_LT(numbers[i], 0xFFFFFFu);
    if (i < 2) continue;
    const std::uint32_t step = numbers[i - 1] - numbers[i - 2];
    steps.insert(step);
    predicted += numbers[i] == numbers[i - 1] + step;
  }
  EXPECT_GE(steps.size(), 390u);
  EXPECT_LE(predicted, 1);
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

// The peer ACKed our first Send and then its process ended; our second Send bounces off its
// closed port. When our timer runs before we read that ACK (our process was not scheduled,
// or the ACK came while a pass ran), the port unreachable must not fail the Send the peer
// did receive: the ACK already waiting in our socket is taken first. (Acting on the bounce
// at once failed both Sends with retries exceeded, as rdma-core's srq_pingpong saw when its
// partner exited right after its last message.)
TEST(RoceVerbs, AnAckWaitingUnreadCompletesItsSendBeforeAPortUnreachableEndsTheQp) {
  ContextOptions options;
  options.progress = ProgressMode::inline_;  // nothing reads a's sockets unless the test polls
  Side a(options);
  auto b = std::make_unique<Side>();
  auto qp_a = standalone_qp(a);
  auto qp_b = standalone_qp(*b);
  const std::uint32_t address_a = *roce::gid_address(*a.context, 0);
  const std::uint32_t address_b = *roce::gid_address(*b->context, 0);
  std::vector<std::uint8_t> buffer_a(256), buffer_b(256);
  auto mr_a = a.region(buffer_a);
  auto mr_b = b->region(buffer_b);
  ASSERT_TRUE(qp_b->post_recv(RecvWr{.wr_id = 7, .sg_list = {mr_b->sge(0, 64)}}));
  const roce::RcPath a_to_b{.local = address_a, .remote = address_b, .remote_qpn = qp_b->qp_num(),
                            .rq_psn = 0x222, .sq_psn = 0x111, .timeout = 10};  // 4 ms
  const roce::RcPath b_to_a{.local = address_b, .remote = address_a, .remote_qpn = qp_a->qp_num(),
                            .rq_psn = 0x111, .sq_psn = 0x222};
  ASSERT_TRUE(roce::connect_rc(*qp_a, a_to_b));
  ASSERT_TRUE(roce::connect_rc(*qp_b, b_to_a));

  ASSERT_TRUE(qp_a->post_send(SendWr{.wr_id = 1, .opcode = WrOpcode::send, .flags = kSendSignaled, .sg_list = {mr_a->sge(0, 64)}}));
  ASSERT_EQ(poll_n(*b->cq, 1).size(), 1u);  // b took it, and its ACK went out
  qp_b.reset();
  mr_b.reset();
  b.reset();  // the peer's process ends: its port closes
  ASSERT_TRUE(qp_a->post_send(SendWr{.wr_id = 2, .opcode = WrOpcode::send, .flags = kSendSignaled, .sg_list = {mr_a->sge(64, 64)}}));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the bounce is in, the ACK timer due
  roce::run_timer(*a.context);

  const auto completions = poll_n(*a.cq, 2);
  ASSERT_EQ(completions.size(), 2u);
  EXPECT_EQ(completions[0].wr_id, 1u);
  EXPECT_EQ(completions[0].status, WcStatus::success);
  EXPECT_EQ(completions[1].wr_id, 2u);
  EXPECT_EQ(completions[1].status, WcStatus::retry_exceeded);
  EXPECT_GE(roce::port_unreachable_counts(*a.context).taken, 1u);
  EXPECT_EQ(qp_a->state(), QpState::error);
}

}  // namespace
}  // namespace peercm::test
