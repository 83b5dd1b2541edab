// Batched UDP output of the RoCE device. Datagrams queue during one pump and leave together
// at its end: one sendmmsg per run of datagrams from the same socket, and on loopback
// consecutive datagrams of one size to one destination travel as a single UDP GSO send
// (the receiver's UDP_GRO socket takes them in one read and splits them again). A 1 MiB
// Write is then a few dozen system calls instead of 256 (docs/roce-transport.md).
//
// GSO only on loopback: the kernel numbers the IPv4 identification of the segments it cuts
// 0, 1, 2, ..., and the ICRC of a RoCE stack that reads the real IP header covers that
// field; on loopback every receiver is a peercm socket, which verifies with ID 0 (docs/roce-wire.md,
// "Decision: IPv4 identification 0 with DF").
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

namespace peercm::detail::roce {

class UdpSender {
 public:
  // `coalesce` false: never GSO, each datagram its own message (RoceOptions::coalesce).
  explicit UdpSender(bool coalesce = true);

  // Copies the datagram (its pieces may point into memory that changes once the QP moves
  // on) and queues it behind the ones queued before; it leaves at the next flush(), or
  // earlier when the queue is full. `alone`: never in a GSO send with others. A GSO send to a
  // closed port comes back as one ICMP error quoting its first datagram only, so datagrams
  // whose bounces must each be seen (CM MADs: each names its own exchange) travel alone.
  void add(int fd, const sockaddr_in& to, std::span<const iovec> pieces, bool alone = false);
  // Sends everything queued, in order. A datagram the socket refuses (a full send buffer)
  // is lost, as on a congested link: the CM and RC resend.
  void flush();

  std::uint64_t send_failures() const { return send_failures_; }
  std::uint64_t system_calls() const { return system_calls_; }
  std::uint64_t datagrams() const { return datagrams_; }

  // Limits of one GSO send: the kernel's segment count, and an IPv4 datagram's size.
  static constexpr std::size_t kMaxSegments = 64;
  static constexpr std::size_t kMaxCoalescedBytes = 65000;

 private:
  struct Message {
    int fd = -1;
    sockaddr_in to{};
    std::size_t offset = 0;     // into arena_
    std::size_t bytes = 0;
    std::size_t segment = 0;    // every datagram's size but the last one's
    std::size_t count = 0;      // datagrams in it
    bool closed = false;        // a shorter datagram ended it
  };

  bool can_join(const Message& last, int fd, const sockaddr_in& to, std::size_t size) const;
  // Sends messages_[first, last), all from one socket.
  void send_run(std::size_t first, std::size_t last);
  // A GSO send the kernel refused as such: its datagrams one by one, and no GSO from now on.
  void send_segments(const Message& message);

  static constexpr std::size_t kArenaBytes = 1 << 20;
  static constexpr std::size_t kMaxMessages = 256;
  std::unique_ptr<std::uint8_t[]> arena_;  // not zero-filled: 1 MiB of page faults otherwise
  std::size_t used_ = 0;
  std::vector<Message> messages_;
  std::vector<mmsghdr> headers_;
  std::vector<iovec> iovs_;
  std::vector<std::uint8_t> controls_;
  bool gso_ = true;
  std::uint64_t send_failures_ = 0;
  std::uint64_t system_calls_ = 0;
  std::uint64_t datagrams_ = 0;
};

}  // namespace peercm::detail::roce
