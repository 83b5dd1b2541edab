#include "capi/rsocket_link.hpp"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <thread>
#include <unordered_map>

#include "engine/log.hpp"

namespace peercm::capi::rsock {
namespace {

constexpr std::size_t kReadBuffer = 256 * 1024;

void store_be32(std::uint8_t* p, std::uint32_t v) {
  for (int i = 3; i >= 0; --i, v >>= 8) p[i] = static_cast<std::uint8_t>(v);
}
void store_be64(std::uint8_t* p, std::uint64_t v) {
  for (int i = 7; i >= 0; --i, v >>= 8) p[i] = static_cast<std::uint8_t>(v);
}
std::uint64_t load_be(const std::uint8_t* p, int n) {
  std::uint64_t v = 0;
  for (int i = 0; i < n; ++i) v = (v << 8) | p[i];
  return v;
}

bool contains(const Region& region, std::uint64_t offset, std::uint64_t length) {
  return offset >= region.offset && length <= region.length && offset - region.offset <= region.length - length;
}

// The agent: one thread, one epoll set, every link's TCP connection and socket-pair end.
// Made once and never destroyed: the thread runs for the life of the process.
class Agent {
 public:
  Agent() : epoll_fd_(::epoll_create1(EPOLL_CLOEXEC)) {
    std::thread([this] { run(); }).detach();
  }

  std::shared_ptr<Link> find(int app_fd) {
    std::lock_guard lock(mutex_);
    auto it = by_fd_.find(app_fd);
    return it == by_fd_.end() ? nullptr : it->second.link;
  }

  void add(const std::shared_ptr<Link>& link) {
    std::lock_guard lock(mutex_);
    const std::uint64_t id = ++last_id_;
    by_fd_[link->app_fd()] = Entry{link, id};
    by_id_[id] = link;
    epoll_event tcp{};
    tcp.events = EPOLLIN | EPOLLRDHUP;
    tcp.data.u64 = id << 1;
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, link->tcp_fd(), &tcp);
    epoll_event pair{};
    pair.events = 0;
    pair.data.u64 = (id << 1) | 1;
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, link->agent_fd(), &pair);
  }

  bool remove(int app_fd) {
    std::shared_ptr<Link> dropped;  // closed after the lock is released
    std::lock_guard lock(mutex_);
    auto it = by_fd_.find(app_fd);
    if (it == by_fd_.end()) return false;
    dropped = it->second.link;
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, dropped->tcp_fd(), nullptr);
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, dropped->agent_fd(), nullptr);
    by_id_.erase(it->second.id);
    by_fd_.erase(it);
    return true;
  }

 private:
  struct Entry {
    std::shared_ptr<Link> link;
    std::uint64_t id = 0;
  };

  void run() {
    std::array<epoll_event, 64> events{};
    for (;;) {
      const int n = ::epoll_wait(epoll_fd_, events.data(), static_cast<int>(events.size()), -1);
      for (int i = 0; i < n; ++i) {
        const std::uint64_t id = events[static_cast<std::size_t>(i)].data.u64 >> 1;
        const bool pair = (events[static_cast<std::size_t>(i)].data.u64 & 1) != 0;
        std::shared_ptr<Link> link;
        {
          std::lock_guard lock(mutex_);
          auto it = by_id_.find(id);
          if (it == by_id_.end()) continue;
          link = it->second;
        }
        const bool alive = pair ? link->on_pair_writable() : link->on_tcp_readable();
        std::lock_guard lock(mutex_);
        if (!by_id_.contains(id)) continue;  // closed meanwhile
        if (!alive) {
          ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, link->tcp_fd(), nullptr);
          ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, link->agent_fd(), nullptr);
          link->end_stream();
          continue;
        }
        // Back-pressure: while the application has not taken the data already read, read no
        // more from TCP (its window then closes the peer's sender) and wait for the pair.
        const bool blocked = link->pending_to_application();
        epoll_event tcp{};
        tcp.events = blocked ? 0u : (EPOLLIN | EPOLLRDHUP);
        tcp.data.u64 = id << 1;
        ::epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, link->tcp_fd(), &tcp);
        epoll_event out{};
        out.events = blocked ? EPOLLOUT : 0u;
        out.data.u64 = (id << 1) | 1;
        ::epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, link->agent_fd(), &out);
      }
    }
  }

  const int epoll_fd_;
  std::mutex mutex_;
  std::uint64_t last_id_ = 0;
  std::unordered_map<int, Entry> by_fd_;
  std::unordered_map<std::uint64_t, std::shared_ptr<Link>> by_id_;
};

Agent& agent() {
  static Agent* const instance = new Agent;  // never destroyed: its thread outlives main()
  return *instance;
}

}  // namespace

void encode_header(const FrameHeader& header, std::uint8_t* out) {
  out[0] = static_cast<std::uint8_t>(header.type);
  out[1] = out[2] = out[3] = 0;
  store_be32(out + 4, header.length);
  store_be64(out + 8, header.offset);
}

bool decode_header(const std::uint8_t* in, FrameHeader& header) {
  if (in[0] < static_cast<std::uint8_t>(FrameType::data) || in[0] > static_cast<std::uint8_t>(FrameType::iowrite))
    return false;
  header.type = static_cast<FrameType>(in[0]);
  header.length = static_cast<std::uint32_t>(load_be(in + 4, 4));
  header.offset = load_be(in + 8, 8);
  return header.type == FrameType::iomap || header.length <= kMaxFramePayload;
}

Link::Link(int app_fd, int tcp_fd, int agent_fd, bool nonblocking)
    : app_fd_(app_fd), tcp_fd_(tcp_fd), agent_fd_(agent_fd), nonblocking_(nonblocking), in_(kReadBuffer) {}

Link::~Link() {
  ::close(tcp_fd_);
  ::close(agent_fd_);
}

void Link::set_nonblocking(bool on) {
  std::lock_guard lock(send_mutex_);
  nonblocking_ = on;
}

ssize_t Link::send_frame(const FrameHeader& header, const std::uint8_t* payload, int flags) {
  std::array<std::uint8_t, kFrameHeaderSize> head{};
  encode_header(header, head.data());
  const std::size_t payload_length = header.type == FrameType::iomap ? 0 : header.length;
  std::lock_guard lock(send_mutex_);
  const bool dont_wait = nonblocking_ || (flags & MSG_DONTWAIT) != 0;
  std::array<iovec, 2> iov{iovec{head.data(), head.size()},
                           iovec{const_cast<std::uint8_t*>(payload), payload_length}};
  std::size_t total = head.size() + payload_length;
  std::size_t sent = 0;
  while (sent < total) {
    msghdr msg{};
    std::array<iovec, 2> rest{};
    std::size_t count = 0;
    std::size_t skip = sent;
    for (const iovec& part : iov) {
      if (skip >= part.iov_len) {
        skip -= part.iov_len;
        continue;
      }
      rest[count++] = iovec{static_cast<std::uint8_t*>(part.iov_base) + skip, part.iov_len - skip};
      skip = 0;
    }
    msg.msg_iov = rest.data();
    msg.msg_iovlen = count;
    // Once a frame has begun it is finished, whatever the socket's mode: a half frame would
    // break the stream for the peer.
    const int wait_flag = sent == 0 && dont_wait ? MSG_DONTWAIT : 0;
    const ssize_t n = ::sendmsg(tcp_fd_, &msg, MSG_NOSIGNAL | wait_flag);
    if (n < 0) {
      if (errno == EINTR) continue;
      return -1;  // EAGAIN before the first byte, or the connection's error
    }
    sent += static_cast<std::size_t>(n);
  }
  return static_cast<ssize_t>(payload_length);
}

// Frames of up to kMaxFramePayload until `length` bytes went, as a blocking stream socket
// sends everything (rcopy checks rsend's count against the whole file); without blocking,
// what went before a frame would have waited (EAGAIN when that is the first).
ssize_t Link::send_frames(FrameType type, const std::uint8_t* bytes, std::size_t length, std::uint64_t offset,
                          int flags) {
  std::size_t sent = 0;
  while (sent < length) {
    const auto chunk = static_cast<std::uint32_t>(std::min<std::size_t>(length - sent, kMaxFramePayload));
    const std::uint64_t at = type == FrameType::iowrite ? offset + sent : 0;
    if (send_frame(FrameHeader{type, chunk, at}, bytes + sent, flags) < 0) {
      if (sent > 0 && errno == EAGAIN) break;
      return -1;
    }
    sent += chunk;
  }
  return static_cast<ssize_t>(sent);
}

ssize_t Link::send_data(const std::uint8_t* bytes, std::size_t length, int flags) {
  return send_frames(FrameType::data, bytes, length, 0, flags);
}

off_t Link::map(void* buffer, std::size_t length, off_t offset) {
  if (!buffer || length == 0 || offset < -1) {
    errno = EINVAL;
    return -1;
  }
  Region region{0, length, static_cast<std::uint8_t*>(buffer)};
  {
    std::lock_guard lock(maps_mutex_);
    if (offset == -1) {
      for (const Region& r : local_) region.offset = std::max(region.offset, r.offset + r.length);
    } else {
      region.offset = static_cast<std::uint64_t>(offset);
    }
    if (region.offset + length < region.offset) {
      errno = EINVAL;
      return -1;
    }
    for (const Region& r : local_) {
      if (region.offset < r.offset + r.length && r.offset < region.offset + length) {
        errno = EINVAL;  // overlaps a mapping of this socket
        return -1;
      }
    }
    local_.push_back(region);
  }
  // The peer learns the region before any later frame of ours, so by the time it hears
  // anything we send after riomap() it may riowrite there.
  const FrameHeader announce{FrameType::iomap, static_cast<std::uint32_t>(std::min<std::size_t>(length, UINT32_MAX)),
                             region.offset};
  if (send_frame(announce, nullptr, 0) < 0) return -1;
  return static_cast<off_t>(region.offset);
}

int Link::unmap(void* buffer, std::size_t length) {
  std::uint64_t offset = 0;
  {
    std::lock_guard lock(maps_mutex_);
    auto it = std::find_if(local_.begin(), local_.end(),
                           [&](const Region& r) { return r.base == buffer && r.length == length; });
    if (it == local_.end()) {
      errno = EINVAL;
      return -1;
    }
    offset = it->offset;
    local_.erase(it);
  }
  return send_frame(FrameHeader{FrameType::iounmap, 0, offset}, nullptr, 0) < 0 ? -1 : 0;
}

ssize_t Link::write_remote(const std::uint8_t* bytes, std::size_t length, std::uint64_t offset, int flags) {
  if (length == 0) return 0;
  {
    std::lock_guard lock(maps_mutex_);
    const bool mapped = std::any_of(peer_.begin(), peer_.end(), [&](const Region& r) { return contains(r, offset, length); });
    if (!mapped) {
      errno = EINVAL;  // the peer mapped nothing there (or has not told us yet)
      return -1;
    }
  }
  return send_frames(FrameType::iowrite, bytes, length, offset, flags);
}

bool Link::on_tcp_readable() {
  if (in_begin_ == in_end_) in_begin_ = in_end_ = 0;
  const ssize_t n = ::recv(tcp_fd_, in_.data() + in_end_, in_.size() - in_end_, MSG_DONTWAIT);
  if (n == 0) return false;  // the peer closed: the application reads EOF after what came before
  if (n < 0) return errno == EAGAIN || errno == EINTR;
  in_end_ += static_cast<std::size_t>(n);
  return parse();
}

bool Link::on_pair_writable() { return parse(); }

bool Link::parse() {
  pending_begin_ = pending_end_ = 0;
  while (in_begin_ < in_end_) {
    const std::size_t available = in_end_ - in_begin_;
    if (in_header_) {
      if (available < kFrameHeaderSize) break;
      if (!decode_header(in_.data() + in_begin_, frame_)) {
        PEERCM_LOG(warn, "rsocket", "fd {}: the peer broke the framing; the connection ends", app_fd_);
        ::shutdown(tcp_fd_, SHUT_RDWR);
        return false;
      }
      in_begin_ += kFrameHeaderSize;
      frame_done_ = 0;
      if (frame_.type == FrameType::iomap || frame_.type == FrameType::iounmap) {
        std::lock_guard lock(maps_mutex_);
        if (frame_.type == FrameType::iounmap) {
          std::erase_if(peer_, [&](const Region& r) { return r.offset == frame_.offset; });
        } else if (peer_.size() >= kMaxPeerMappings || frame_.length == 0) {
          PEERCM_LOG(warn, "rsocket", "fd {}: the peer announced mapping {} of length {}; the connection ends", app_fd_,
                    peer_.size() + 1, frame_.length);
          ::shutdown(tcp_fd_, SHUT_RDWR);
          return false;
        } else {
          peer_.push_back(Region{frame_.offset, frame_.length, nullptr});
        }
        continue;
      }
      in_header_ = frame_.length == 0;
      continue;
    }
    const auto take = static_cast<std::size_t>(std::min<std::uint64_t>(available, frame_.length - frame_done_));
    const std::uint8_t* bytes = in_.data() + in_begin_;
    std::size_t used = take;
    if (frame_.type == FrameType::data) {
      const ssize_t n = ::send(agent_fd_, bytes, take, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n < 0 && errno != EAGAIN && errno != EINTR) {
        used = take;  // the application closed its end: nobody reads the stream any more
      } else {
        used = n < 0 ? 0 : static_cast<std::size_t>(n);
      }
    } else {
      place(frame_.offset + frame_done_, bytes, take, frame_done_ + take == frame_.length);
    }
    in_begin_ += used;
    frame_done_ += used;
    if (frame_done_ == frame_.length) in_header_ = true;
    if (used < take) {
      pending_begin_ = in_begin_;
      pending_end_ = in_begin_ + (take - used);
      return true;  // the pair is full: wait until the application reads
    }
  }
  if (in_begin_ == in_end_) {
    in_begin_ = in_end_ = 0;
  } else if (in_begin_ > 0) {
    std::memmove(in_.data(), in_.data() + in_begin_, in_end_ - in_begin_);  // a partial header
    in_end_ -= in_begin_;
    in_begin_ = 0;
  }
  return true;
}

void Link::place(std::uint64_t offset, const std::uint8_t* bytes, std::size_t n, bool frame_ends) {
  if (n == 0) return;
  std::lock_guard lock(maps_mutex_);
  auto it = std::find_if(local_.begin(), local_.end(), [&](const Region& r) { return contains(r, offset, n); });
  if (it == local_.end()) {
    // Written after we unmapped the region (the peer had not heard yet) or outside it: the
    // bytes go nowhere, as they would into a deregistered region.
    PEERCM_LOG(debug, "rsocket", "fd {}: {} bytes at mapping offset {} outside every mapped region; dropped", app_fd_, n,
               offset);
    return;
  }
  std::uint8_t* target = it->base + (offset - it->offset);
  if (!frame_ends) {
    std::memcpy(target, bytes, n);
    return;
  }
  // The frame's last byte is stored last: riostream spins on the last byte of a transfer and
  // then reads the rest.
  std::memcpy(target, bytes, n - 1);
  // A release store: the bytes before it are visible to whoever sees it.
  std::atomic_ref<std::uint8_t>(target[n - 1]).store(bytes[n - 1], std::memory_order_release);
}

void Link::end_stream() { ::shutdown(agent_fd_, SHUT_WR); }

std::shared_ptr<Link> find(int app_fd) { return agent().find(app_fd); }

std::shared_ptr<Link> attach(int fd) {
  if (auto existing = agent().find(fd)) return existing;
  int type = 0;
  socklen_t type_length = sizeof type;
  if (::getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &type_length) != 0) return nullptr;
  if (type != SOCK_STREAM) {
    errno = ENOTSUP;  // datagram rsockets stay the kernel's sockets (udpong)
    return nullptr;
  }
  sockaddr_storage peer{};
  socklen_t peer_length = sizeof peer;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_length) != 0) return nullptr;  // ENOTCONN
  const int status = ::fcntl(fd, F_GETFL);
  const int descriptor_flags = ::fcntl(fd, F_GETFD);
  const int tcp = ::fcntl(fd, F_DUPFD_CLOEXEC, 3);
  if (status < 0 || descriptor_flags < 0 || tcp < 0) return nullptr;
  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0) {
    ::close(tcp);
    return nullptr;
  }
  // The application's descriptor number now names the pair's end; the TCP connection lives
  // on under `tcp`, blocking (the agent reads with MSG_DONTWAIT, senders choose per frame).
  if (::dup3(pair[0], fd, (descriptor_flags & FD_CLOEXEC) ? O_CLOEXEC : 0) < 0) {
    ::close(pair[0]);
    ::close(pair[1]);
    ::close(tcp);
    return nullptr;
  }
  ::close(pair[0]);
  const bool nonblocking = (status & O_NONBLOCK) != 0;
  if (nonblocking) ::fcntl(fd, F_SETFL, O_NONBLOCK);
  ::fcntl(tcp, F_SETFL, status & ~O_NONBLOCK);
  ::fcntl(pair[1], F_SETFL, O_NONBLOCK);
  const int one = 1;
  ::setsockopt(tcp, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);  // an rsocket sends at once
  auto link = std::make_shared<Link>(fd, tcp, pair[1], nonblocking);
  agent().add(link);
  return link;
}

bool detach(int fd) { return agent().remove(fd); }

}  // namespace peercm::capi::rsock
