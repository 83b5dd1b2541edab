#include "api/roce/udp_sender.hpp"

#include <netinet/udp.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace peercm::detail::roce {

namespace {

// The errors a send reports when an ICMP error for an earlier datagram is pending on an
// IP_RECVERR socket (port, host or network unreachable).
bool reported_icmp_error(int error) {
  return error == ECONNREFUSED || error == EHOSTUNREACH || error == ENETUNREACH || error == EHOSTDOWN;
}

constexpr std::size_t kControlSize = CMSG_SPACE(sizeof(std::uint16_t));

bool same_destination(const sockaddr_in& a, const sockaddr_in& b) {
  return a.sin_addr.s_addr == b.sin_addr.s_addr && a.sin_port == b.sin_port;
}

bool is_loopback(const sockaddr_in& to) { return (ntohl(to.sin_addr.s_addr) >> 24) == 127; }

}  // namespace

UdpSender::UdpSender(bool coalesce) : arena_(new std::uint8_t[kArenaBytes]), gso_(coalesce) {
  messages_.reserve(kMaxMessages);
  headers_.resize(kMaxMessages);
  iovs_.resize(kMaxMessages);
  controls_.resize(kMaxMessages * kControlSize);
}

bool UdpSender::can_join(const Message& last, int fd, const sockaddr_in& to, std::size_t size) const {
  return gso_ && !last.closed && last.fd == fd && same_destination(last.to, to) && is_loopback(to) &&
         size <= last.segment && last.count < kMaxSegments && last.bytes + size <= kMaxCoalescedBytes;
}

void UdpSender::add(int fd, const sockaddr_in& to, std::span<const iovec> pieces, bool alone) {
  std::size_t size = 0;
  for (const iovec& piece : pieces) size += piece.iov_len;
  if (size > kArenaBytes) {
    ++send_failures_;
    return;
  }
  if (used_ + size > kArenaBytes || messages_.size() == kMaxMessages) flush();
  std::uint8_t* out = arena_.get() + used_;
  for (const iovec& piece : pieces) {
    std::memcpy(out, piece.iov_base, piece.iov_len);
    out += piece.iov_len;
  }
  if (!alone && !messages_.empty() && can_join(messages_.back(), fd, to, size)) {
    Message& last = messages_.back();
    last.bytes += size;
    ++last.count;
    last.closed = size < last.segment;  // GSO: only the last segment may be shorter
  } else {
    messages_.push_back(
        Message{.fd = fd, .to = to, .offset = used_, .bytes = size, .segment = size, .count = 1, .closed = alone});
  }
  used_ += size;
  ++datagrams_;
}

void UdpSender::flush() {
  std::size_t first = 0;
  while (first < messages_.size()) {
    std::size_t last = first + 1;
    while (last < messages_.size() && messages_[last].fd == messages_[first].fd) ++last;
    send_run(first, last);
    first = last;
  }
  messages_.clear();
  used_ = 0;
}

void UdpSender::send_run(std::size_t first, std::size_t last) {
  const std::size_t count = last - first;
  for (std::size_t i = 0; i < count; ++i) {
    Message& message = messages_[first + i];
    iovs_[i] = iovec{arena_.get() + message.offset, message.bytes};
    mmsghdr& header = headers_[i];
    header = mmsghdr{};
    header.msg_hdr.msg_name = &message.to;
    header.msg_hdr.msg_namelen = sizeof message.to;
    header.msg_hdr.msg_iov = &iovs_[i];
    header.msg_hdr.msg_iovlen = 1;
    if (message.count > 1) {
      // UDP_SEGMENT: the kernel cuts the buffer into datagrams of `segment` bytes.
      std::uint8_t* control = controls_.data() + i * kControlSize;
      std::memset(control, 0, kControlSize);
      header.msg_hdr.msg_control = control;
      header.msg_hdr.msg_controllen = kControlSize;
      cmsghdr* cmsg = CMSG_FIRSTHDR(&header.msg_hdr);
      cmsg->cmsg_level = SOL_UDP;
      cmsg->cmsg_type = UDP_SEGMENT;
      cmsg->cmsg_len = CMSG_LEN(sizeof(std::uint16_t));
      const auto segment = static_cast<std::uint16_t>(message.segment);
      std::memcpy(CMSG_DATA(cmsg), &segment, sizeof segment);
    }
  }
  std::size_t next = 0;
  int refused_retries = 0;
  while (next < count) {
    ++system_calls_;
    const int sent = ::sendmmsg(messages_[first].fd, headers_.data() + next, static_cast<unsigned>(count - next),
                                MSG_DONTWAIT);
    if (sent > 0) {
      next += static_cast<std::size_t>(sent);
      continue;
    }
    const int error = errno;
    if (sent < 0 && error == EINTR) continue;
    // A socket with IP_RECVERR reports an ICMP error that arrived for an earlier datagram
    // (to any peer) on its next send, which then sends nothing; the error itself waits in
    // the error queue for the reader. Reporting it cleared it: the send goes again. (A route
    // that is really missing fails the same way each time: a few tries, then it counts.)
    if (sent < 0 && reported_icmp_error(error) && refused_retries < 4) {
      ++refused_retries;
      continue;
    }
    // headers_[next] failed alone: a GSO send the kernel cannot do goes out datagram by
    // datagram; any other refusal loses that message (its datagrams are resent by RC/CM).
    const Message& failed = messages_[first + next];
    if (failed.count > 1 && (error == EINVAL || error == EIO || error == ENOPROTOOPT || error == EOPNOTSUPP)) {
      gso_ = false;
      send_segments(failed);
    } else {
      send_failures_ += failed.count;
    }
    ++next;
  }
}

void UdpSender::send_segments(const Message& message) {
  for (std::size_t offset = 0; offset < message.bytes; offset += message.segment) {
    const std::size_t size = std::min(message.segment, message.bytes - offset);
    iovec piece{arena_.get() + message.offset + offset, size};
    msghdr header{};
    header.msg_name = const_cast<sockaddr_in*>(&message.to);
    header.msg_namelen = sizeof message.to;
    header.msg_iov = &piece;
    header.msg_iovlen = 1;
    ++system_calls_;
    ssize_t sent = ::sendmsg(message.fd, &header, MSG_DONTWAIT);
    if (sent < 0 && reported_icmp_error(errno)) sent = ::sendmsg(message.fd, &header, MSG_DONTWAIT);  // as above
    if (sent < 0) ++send_failures_;
  }
}

}  // namespace peercm::detail::roce
