// The RoCE device's batched UDP output (api/roce/udp_sender.hpp): order, contents and
// datagram boundaries survive batching, equal-size datagrams to one loopback destination
// share a GSO send, and a refused datagram is counted, not silently kept.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "api/roce/udp_sender.hpp"

namespace peercm::detail::roce {
namespace {

struct UdpSocket {
  int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  ~UdpSocket() { ::close(fd); }
  sockaddr_in bind_loopback() {
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
    socklen_t length = sizeof address;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
    return address;
  }
  // Without UDP_GRO the kernel hands a GSO send over datagram by datagram.
  std::vector<std::vector<std::uint8_t>> receive_all() {
    std::vector<std::vector<std::uint8_t>> out;
    for (;;) {
      pollfd ready{fd, POLLIN, 0};
      if (::poll(&ready, 1, 200) <= 0) return out;
      std::vector<std::uint8_t> bytes(70000);
      const ssize_t n = ::recv(fd, bytes.data(), bytes.size(), 0);
      if (n < 0) return out;
      bytes.resize(static_cast<std::size_t>(n));
      out.push_back(std::move(bytes));
    }
  }
};

std::vector<std::uint8_t> datagram(std::uint8_t tag, std::size_t size) {
  std::vector<std::uint8_t> bytes(size);
  for (std::size_t i = 0; i < size; ++i) bytes[i] = static_cast<std::uint8_t>(tag + i);
  return bytes;
}

// Each datagram in two pieces, as the RC core hands them over (header, payload).
void add(UdpSender& sender, int fd, const sockaddr_in& to, const std::vector<std::uint8_t>& bytes) {
  const std::size_t split = bytes.size() / 3;
  const iovec pieces[2] = {{const_cast<std::uint8_t*>(bytes.data()), split},
                           {const_cast<std::uint8_t*>(bytes.data() + split), bytes.size() - split}};
  sender.add(fd, to, pieces);
}

TEST(UdpSender, BatchesKeepOrderContentsAndBoundaries) {
  UdpSocket from, first, second;
  const sockaddr_in to_first = first.bind_loopback();
  const sockaddr_in to_second = second.bind_loopback();
  UdpSender sender;
  std::vector<std::vector<std::uint8_t>> expected_first, expected_second;
  // Five full-size datagrams, a shorter last one (they may share one GSO send), one more
  // full-size datagram after it (the shorter one closed that send), and two to another socket.
  for (std::uint8_t i = 0; i < 5; ++i) expected_first.push_back(datagram(i, 1200));
  expected_first.push_back(datagram(9, 300));
  expected_first.push_back(datagram(11, 1200));
  expected_second.push_back(datagram(20, 64));
  expected_second.push_back(datagram(21, 64));
  for (const auto& bytes : expected_first) add(sender, from.fd, to_first, bytes);
  for (const auto& bytes : expected_second) add(sender, from.fd, to_second, bytes);
  // The sender copied them: changing the sources now must not change what leaves.
  std::vector<std::uint8_t> scratch = datagram(0, 1200);
  add(sender, from.fd, to_first, scratch);
  expected_first.push_back(scratch);
  scratch.assign(scratch.size(), 0xEE);
  sender.flush();

  EXPECT_EQ(first.receive_all(), expected_first);
  EXPECT_EQ(second.receive_all(), expected_second);
  EXPECT_EQ(sender.datagrams(), 10u);
  EXPECT_EQ(sender.send_failures(), 0u);
  // One socket, so one sendmmsg for all of it.
  EXPECT_EQ(sender.system_calls(), 1u);
}

// More than the kernel takes in one GSO send (it refuses the whole send beyond 64 segments).
TEST(UdpSender, GsoSendsStayWithinTheKernelsSegmentLimit) {
  UdpSocket from, to;
  const sockaddr_in address = to.bind_loopback();
  int big = 4 << 20;
  ::setsockopt(to.fd, SOL_SOCKET, SO_RCVBUF, &big, sizeof big);
  UdpSender sender;
  const std::size_t count = UdpSender::kMaxSegments * 2 + 3;
  std::vector<std::vector<std::uint8_t>> expected;
  for (std::size_t i = 0; i < count; ++i) expected.push_back(datagram(static_cast<std::uint8_t>(i), 256));
  for (const auto& bytes : expected) add(sender, from.fd, address, bytes);
  sender.flush();
  EXPECT_EQ(to.receive_all(), expected);
  EXPECT_EQ(sender.send_failures(), 0u);
  EXPECT_EQ(sender.system_calls(), 1u);  // three GSO sends in one sendmmsg, no fallback
}

// A UDP_GRO socket (the device's 4791 sockets) takes a coalesced send in one read, with the
// datagram size beside it; with coalescing off it reads each datagram alone.
TEST(UdpSender, GroSocketReadsACoalescedSendAtOnceUnlessCoalescingIsOff) {
  for (const bool coalesce : {true, false}) {
    UdpSocket from, to;
    const sockaddr_in address = to.bind_loopback();
    int on = 1;
    ASSERT_EQ(::setsockopt(to.fd, SOL_UDP, UDP_GRO, &on, sizeof on), 0);
    UdpSender sender(coalesce);
    for (std::uint8_t i = 0; i < 6; ++i) add(sender, from.fd, address, datagram(i, 1000));
    sender.flush();
    std::vector<std::size_t> reads, segments;
    for (;;) {
      pollfd ready{to.fd, POLLIN, 0};
      if (::poll(&ready, 1, 200) <= 0) break;
      std::vector<std::uint8_t> bytes(70000);
      alignas(cmsghdr) std::uint8_t control[CMSG_SPACE(sizeof(int))] = {};
      iovec piece{bytes.data(), bytes.size()};
      msghdr header{};
      header.msg_iov = &piece;
      header.msg_iovlen = 1;
      header.msg_control = control;
      header.msg_controllen = sizeof control;
      const ssize_t n = ::recvmsg(to.fd, &header, 0);
      ASSERT_GT(n, 0);
      reads.push_back(static_cast<std::size_t>(n));
      int segment = 0;
      for (cmsghdr* c = CMSG_FIRSTHDR(&header); c != nullptr; c = CMSG_NXTHDR(&header, c))
        if (c->cmsg_level == SOL_UDP && c->cmsg_type == UDP_GRO) std::memcpy(&segment, CMSG_DATA(c), sizeof segment);
      segments.push_back(static_cast<std::size_t>(segment));
    }
    if (coalesce) {
      EXPECT_EQ(reads, std::vector<std::size_t>{6000});
      EXPECT_EQ(segments, std::vector<std::size_t>{1000});
    } else {
      EXPECT_EQ(reads, std::vector<std::size_t>(6, 1000));
    }
  }
}

// Datagrams added `alone` never share a GSO send: a GRO socket reads them one by one, and to a
// closed port each comes back as its own ICMP error (a GSO send bounces once, quoting its first
// datagram): the CM's MADs rely on that to end each exchange whose MAD bounced.
TEST(UdpSender, DatagramsAddedAloneTravelAloneAndEachBouncesOnItsOwn) {
  {
    UdpSocket from, to;
    const sockaddr_in address = to.bind_loopback();
    int on = 1;
    ASSERT_EQ(::setsockopt(to.fd, SOL_UDP, UDP_GRO, &on, sizeof on), 0);
    UdpSender sender;
    for (std::uint8_t i = 0; i < 4; ++i) {
      const auto bytes = datagram(i, 256);
      const iovec piece{const_cast<std::uint8_t*>(bytes.data()), bytes.size()};
      sender.add(from.fd, address, std::span(&piece, 1), /*alone=*/true);
    }
    sender.flush();
    std::vector<std::size_t> reads;
    for (auto& bytes : to.receive_all()) reads.push_back(bytes.size());
    EXPECT_EQ(reads, std::vector<std::size_t>(4, 256));
  }
  // A closed port: bind a socket for its address, then close it.
  sockaddr_in closed{};
  {
    UdpSocket gone;
    closed = gone.bind_loopback();
  }
  UdpSocket from;
  int on = 1;
  ASSERT_EQ(::setsockopt(from.fd, IPPROTO_IP, IP_RECVERR, &on, sizeof on), 0);
  UdpSender sender;
  for (std::uint8_t i = 0; i < 3; ++i) {
    const auto bytes = datagram(static_cast<std::uint8_t>(0x40 + i), 256);
    const iovec piece{const_cast<std::uint8_t*>(bytes.data()), bytes.size()};
    sender.add(from.fd, closed, std::span(&piece, 1), /*alone=*/true);
  }
  sender.flush();
  std::vector<std::uint8_t> first_bytes_quoted;
  for (int spins = 0; spins < 100 && first_bytes_quoted.size() < 3; ++spins) {
    std::uint8_t quoted[512];
    alignas(cmsghdr) std::uint8_t control[512];
    iovec piece{quoted, sizeof quoted};
    msghdr header{};
    header.msg_iov = &piece;
    header.msg_iovlen = 1;
    header.msg_control = control;
    header.msg_controllen = sizeof control;
    if (::recvmsg(from.fd, &header, MSG_ERRQUEUE | MSG_DONTWAIT) <= 0) {
      ::usleep(1000);
      continue;
    }
    first_bytes_quoted.push_back(quoted[0]);  // the payload of the datagram that bounced
  }
  EXPECT_EQ(first_bytes_quoted, (std::vector<std::uint8_t>{0x40, 0x41, 0x42}));
  EXPECT_EQ(sender.send_failures(), 0u);
}

TEST(UdpSender, ARefusedDatagramIsCounted) {
  UdpSocket from;
  sockaddr_in nowhere{};
  nowhere.sin_family = AF_INET;
  nowhere.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  nowhere.sin_port = 0;  // port 0: the kernel refuses to send there
  UdpSender sender;
  add(sender, from.fd, nowhere, datagram(1, 100));
  sender.flush();
  EXPECT_EQ(sender.send_failures(), 1u);
}

}  // namespace
}  // namespace peercm::detail::roce
