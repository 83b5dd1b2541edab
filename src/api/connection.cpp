#include "api/connection.hpp"

#include <fcntl.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>

#include "engine/log.hpp"
#include "engine/tcp_mss.hpp"
#include "wire/fpdu.hpp"

namespace peercm::detail {
namespace {

constexpr std::size_t kReceiveBufferSize = 256 * 1024;
constexpr std::size_t kMaxIovecs = 64;
constexpr std::size_t kHeaderReadSize = 128;
constexpr std::size_t kZeroCopyThreshold = 8192;
// FPDU bytes kept from before the engine starts: a first FPDU sent early, not a stream.
constexpr std::size_t kMaxEarlyBytes = 64 * 1024;

}  // namespace

std::string_view rtr_name(core::RtrType rtr) {
  switch (rtr) {
    case core::RtrType::none: return "none";
    case core::RtrType::write: return "zero-length Write";
    case core::RtrType::read: return "zero-length Read";
    case core::RtrType::send: return "zero-length Send";
  }
  return "?";
}

std::string_view qp_event_name(core::QpEvent::Kind kind) {
  switch (kind) {
    case core::QpEvent::Kind::terminate_sent: return "we sent a Terminate";
    case core::QpEvent::Kind::terminate_received: return "the peer sent a Terminate";
    case core::QpEvent::Kind::connection_lost: return "the TCP connection failed or was reset";
    case core::QpEvent::Kind::peer_closed: return "the peer closed the connection";
  }
  return "?";
}

void set_socket_options(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

Connection::Connection(std::shared_ptr<ContextImpl> ctx, int fd, Callbacks callbacks)
    : ctx_(std::move(ctx)), fd_(fd), callbacks_(std::move(callbacks)) {}

Connection::~Connection() {
  if (fd_ >= 0) {
    ctx_->reactor.remove(fd_);
    ::close(fd_);
  }
}

Result<std::shared_ptr<Connection>, std::errc> Connection::open(std::shared_ptr<ContextImpl> ctx,
                                                                const sockaddr_in& destination,
                                                                const std::optional<sockaddr_in>& source,
                                                                Callbacks callbacks, int bound_fd) {
  const int fd = bound_fd >= 0 ? bound_fd : ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return fail(static_cast<std::errc>(errno));
  set_socket_options(fd);
  if (source && bound_fd < 0) {
    sockaddr_in src = *source;
    src.sin_port = 0;  // the listener's port stays the listener's
    if (::bind(fd, reinterpret_cast<const sockaddr*>(&src), sizeof src) != 0) {
      const int err = errno;
      ::close(fd);
      return fail(static_cast<std::errc>(err));
    }
  }
  auto conn = std::make_shared<Connection>(ctx, fd, std::move(callbacks));
  conn->peer_ = destination;
  conn->initiator_ = true;
  conn->phase_ = Phase::tcp_connecting;
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&destination), sizeof destination) != 0 &&
      errno != EINPROGRESS) {
    return fail(static_cast<std::errc>(errno));  // the destructor closes fd
  }
  // Registered once the first setup bytes (the Request) are offered: send_setup().
  return conn;
}

Result<std::shared_ptr<Connection>, std::errc> Connection::adopt(std::shared_ptr<ContextImpl> ctx, int fd,
                                                                 const sockaddr_in& peer, Callbacks callbacks) {
  // No set_socket_options(): an accepted socket inherits TCP_NODELAY from its listener.
  auto conn = std::make_shared<Connection>(ctx, fd, std::move(callbacks));
  conn->peer_ = peer;
  conn->phase_ = Phase::mpa;
  conn->register_io();
  return conn;
}

void Connection::register_io() {
  std::weak_ptr<Connection> weak = weak_from_this();
  auto ok = ctx_->reactor.add(fd_, EPOLLIN | EPOLLRDHUP | (want_write_ ? EPOLLOUT : 0u), [weak](std::uint32_t events) {
    if (auto self = weak.lock()) self->on_io(events);
  });
  registered_ = ok.has_value();
  // A busy-polling application reads its connection's data without asking epoll first. Not
  // while TCP connects: a direct pass offers EPOLLOUT unasked, which would read as "connected".
  if (registered_ && phase_ != Phase::tcp_connecting) ctx_->reactor.poll_directly(fd_, true);
}

void Connection::update_interest() {
  if (fd_ < 0 || !registered_) return;
  [[maybe_unused]] auto ok = ctx_->reactor.modify(fd_, EPOLLIN | EPOLLRDHUP | (want_write_ ? EPOLLOUT : 0u));
}

// The caller holds a reference (callbacks may drop the owner's).
void Connection::on_io(std::uint32_t events) {
  if (phase_ == Phase::tcp_connecting) {
    if (events & (EPOLLOUT | EPOLLERR | EPOLLHUP)) on_connected(events);
    return;
  }
  if (events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) receive();
  if (fd_ >= 0 && (events & EPOLLOUT)) transmit();
}

// A handshake that completed inside connect() (loopback does, as does any path where the
// SYN-ACK is back before connect() returns) leaves the socket writable at once: the Request
// goes out now, and no EPOLLOUT round (and no epoll_ctl to drop it after) is needed. A socket
// still connecting refuses with EAGAIN and waits for EPOLLOUT as usual. A refused connect
// reports its error here, once (the send clears SO_ERROR), so it is kept for on_connected().
void Connection::send_setup(std::span<const std::uint8_t> bytes) {
  if (fd_ < 0) return;
  setup_out_.insert(setup_out_.end(), bytes.begin(), bytes.end());
  if (phase_ != Phase::tcp_connecting) {
    transmit_setup();
    return;
  }
  if (registered_) return;  // waiting for EPOLLOUT
  const ssize_t n = ::send(fd_, setup_out_.data(), setup_out_.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  if (n < 0) {
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) early_connect_error_ = errno;
    want_write_ = true;
  } else {
    setup_out_.erase(setup_out_.begin(), setup_out_.begin() + n);
    phase_ = Phase::mpa;
    want_write_ = !setup_out_.empty();
  }
  register_io();
  if (phase_ == Phase::mpa) {
    if (auto callback = callbacks_.tcp_connected) callback();
  }
}

void Connection::on_connected(std::uint32_t events) {
  int error = early_connect_error_;
  // A connect that failed reports EPOLLERR (refused, unreachable) with the reason in
  // SO_ERROR; plain writability means connected, and costs no getsockopt().
  if (error == 0 && (events & (EPOLLERR | EPOLLHUP))) {
    socklen_t len = sizeof error;
    ::getsockopt(fd_, SOL_SOCKET, SO_ERROR, &error, &len);
  }
  if (error != 0) {
    // The CM hears of the failure before the close, which then says nothing new.
    auto self = shared_from_this();
    if (auto callback = callbacks_.tcp_failed) callback(error);
    close_socket();
    return;
  }
  phase_ = Phase::mpa;
  if (registered_) ctx_->reactor.poll_directly(fd_, true);
  transmit_setup();
  if (auto callback = callbacks_.tcp_connected) callback();
}

void Connection::receive() {
  // One receive buffer per context (every connection is served under its lock): an idle
  // connection owns no buffer.
  // Not zero-filled: a fresh 256 KiB filled with zeros cost a context's first receive
  // 170 us of page faults; unfilled, only the pages reads reach are ever touched.
  if (!ctx_->receive_scratch) ctx_->receive_scratch.reset(new std::uint8_t[kReceiveBufferSize]);
  const std::span<std::uint8_t> rx_buffer(ctx_->receive_scratch.get(), kReceiveBufferSize);
  // Bounded so one busy connection cannot starve the others of the reactor.
  for (int round = 0; round < 16 && fd_ >= 0; ++round) {
    if (phase_ == Phase::running && qp_) {
      std::span<std::uint8_t> target = qp_->engine->receive_target();
      if (!target.empty()) {
        // One system call per FPDU: the rest of the payload lands in its target, and the
        // trailer with the next header (and a few payload bytes) in the scratch buffer.
        std::array<iovec, 2> iov{iovec{target.data(), target.size()}, iovec{rx_buffer.data(), kHeaderReadSize}};
        msghdr msg{};
        msg.msg_iov = iov.data();
        msg.msg_iovlen = iov.size();
        const ssize_t n = ::recvmsg(fd_, &msg, MSG_DONTWAIT);
        if (n > 0) {
          const auto got = static_cast<std::size_t>(n);
          qp_->engine->handle_placed(std::min(got, target.size()));
          if (got > target.size()) {
            feed_engine(std::span<const std::uint8_t>(rx_buffer.data(), got - target.size()));
            header_sized_reads_ = qp_ && expects_large_payload();
          } else {
            drain_qp_events();
            transmit();
          }
          if (got < target.size() + kHeaderReadSize) return;
          continue;
        }
        if (n == 0) {
          peer_closed_ = true;
          qp_->engine->handle_peer_closed();
          drain_qp_events();
          return;
        }
        if (errno == EAGAIN || errno == EWOULDBLOCK) return;
        if (errno == EINTR) continue;
        qp_->engine->handle_connection_lost();
        drain_qp_events();
        return;
      }
    }
    // Large payloads come straight into their target (zero copy): while they flow, read
    // only a little past each header so the payload is not pulled into this buffer and copied.
    const std::size_t want = header_sized_reads_ ? kHeaderReadSize : rx_buffer.size();
    const ssize_t n = ::recv(fd_, rx_buffer.data(), want, MSG_DONTWAIT);
    if (n > 0) {
      const std::span<const std::uint8_t> bytes(rx_buffer.data(), static_cast<std::size_t>(n));
      if (phase_ == Phase::mpa) {
        receive_setup(bytes);
      } else if (phase_ == Phase::running || phase_ == Phase::closing) {
        feed_engine(bytes);
        if (qp_) header_sized_reads_ = expects_large_payload();
      }
      if (static_cast<std::size_t>(n) < want) return;
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (n < 0 && errno == EINTR) continue;
    // EOF or a socket error.
    peer_closed_ = n == 0;
    socket_failed_ = n < 0;
    if (phase_ == Phase::mpa) {
      close_socket();  // the CM hears of it through `closed`
    } else if (qp_ && phase_ == Phase::running) {
      if (n == 0) {
        qp_->engine->handle_peer_closed();
      } else {
        qp_->engine->handle_connection_lost();
      }
      drain_qp_events();
    } else {
      close_socket();
    }
    return;
  }
}

// While a large payload is under way, and after a message with a large segment (the next one is
// likely large too: a 64 KiB ping-pong read whole into the scratch buffer paid a 64 KiB copy).
bool Connection::expects_large_payload() {
  return qp_->engine->receive_target().size() >= kZeroCopyThreshold ||
         qp_->engine->last_message_largest_segment() >= kZeroCopyThreshold;
}

void Connection::receive_setup(std::span<const std::uint8_t> bytes) {
  auto self = shared_from_this();
  const std::size_t used = callbacks_.setup_bytes ? callbacks_.setup_bytes(bytes) : bytes.size();
  if (used >= bytes.size() || fd_ < 0) return;
  const auto rest = bytes.subspan(used);
  if (phase_ == Phase::running) {
    feed_engine(rest);  // the CM started the stream while handling these bytes
    return;
  }
  if (phase_ != Phase::mpa) return;
  early_bytes_.insert(early_bytes_.end(), rest.begin(), rest.end());
  if (early_bytes_.size() > kMaxEarlyBytes) {
    // RFC 5044 §7.1.2: FPDUs follow the Reply. A peer streaming before it got one (while our
    // application decides) would otherwise be buffered without bound: give the setup up.
    std::vector<std::uint8_t>().swap(early_bytes_);
    close_socket();
  }
}

void Connection::feed_engine(std::span<const std::uint8_t> bytes) {
  if (!qp_) return;
  qp_->engine->handle_bytes(bytes);
  drain_qp_events();
  transmit();
}

void Connection::transmit_setup() {
  while (!setup_out_.empty() && fd_ >= 0) {
    const ssize_t n = ::send(fd_, setup_out_.data(), setup_out_.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      want_write_ = errno == EAGAIN || errno == EWOULDBLOCK;
      update_interest();
      return;
    }
    setup_out_.erase(setup_out_.begin(), setup_out_.begin() + n);
  }
  if (want_write_ && phase_ != Phase::running) {
    want_write_ = false;
    update_interest();
  }
}

void Connection::start(std::shared_ptr<QueuePairImpl> qp, const core::MpaResult& result, bool initiator) {
  initiator_ = initiator;
  result_ = result;
  PEERCM_LOG(info, "mpa", "{} {}: established, revision {}, CRC {}, IRD {} ORD {}, RTR {}",
             initiator ? "initiator to" : "responder for", log::address(peer_), result.revision,
             result.crc ? "on" : "off", result.ird, result.ord, rtr_name(result.rtr));
  transmit_setup();  // the responder's Reply goes out before any FPDU
  qp_ = std::move(qp);
  start_engine();
}

void Connection::terminate_setup(std::shared_ptr<QueuePairImpl> qp, bool crc, std::uint8_t code) {
  if (fd_ < 0) return;
  transmit_setup();
  if (!qp) {
    close_socket();
    return;
  }
  qp_ = std::move(qp);
  core::StreamParams params;
  params.crc = crc;
  qp_->engine->connect(params);
  qp_->engine->terminate(wire::TerminateCode{wire::TerminateLayer::llp, 0x0, code});
  phase_ = Phase::closing;
  transmit();
  drain_qp_events();
}

void Connection::start_engine() {
  if (!qp_ || !result_ || phase_ == Phase::running) return;
  const core::MpaResult& r = *result_;
  core::StreamParams params;
  params.crc = r.crc;
  const std::size_t emss = ctx_->emss_cache.get(fd_, peer_.sin_addr.s_addr, std::chrono::steady_clock::now());
  params.mulpdu = wire::mulpdu_for_emss(emss);
  params.ird = r.ird;
  params.ord = r.ord;
  params.responder = !initiator_;
  if (r.rtr != core::RtrType::none) {
    if (initiator_) params.send_rtr = r.rtr;
    else params.expect_rtr = r.rtr;
  }
  phase_ = Phase::running;
  std::weak_ptr<Connection> weak = weak_from_this();
  qp_->kick_transmit = [weak] {
    if (auto self = weak.lock()) self->transmit();
  };
  qp_->send_direct = [weak](const SendWr& wr) {
    auto self = weak.lock();
    return self && self->send_direct(wr);
  };
  qp_->engine->connect(params);
  if (params.responder) {
    // The first thing to look at when a server's first message never arrives.
    if (r.rtr == core::RtrType::none) {
      PEERCM_LOG(info, "qp", "QP {} (responder for {}): sends wait for the initiator's first FPDU (RFC 5044 §7.1.2 "
                "rule 4: its Request offered no RTR)", qp_->qp_num, log::address(peer_));
    } else {
      PEERCM_LOG(debug, "qp", "QP {} (responder for {}): sends wait for the initiator's {} RTR", qp_->qp_num,
                 log::address(peer_), rtr_name(r.rtr));
    }
  }
  if (!early_bytes_.empty()) {
    std::vector<std::uint8_t> early;
    early.swap(early_bytes_);
    feed_engine(early);
  }
  transmit();
}

void Connection::transmit() {
  if (fd_ < 0) return;
  if (phase_ == Phase::mpa || phase_ == Phase::tcp_connecting) {
    transmit_setup();
    return;
  }
  if (!qp_) return;
  std::array<iovec, kMaxIovecs> iov;  // gather_transmit() fills what sendmsg() reads
  // Called after every input; most find nothing to send (a received Send's reply is the
  // application's to post), so the engine is asked before anything is framed.
  while (qp_->engine->has_transmit()) {
    const std::size_t count = qp_->engine->gather_transmit(iov);
    if (count == 0) break;
    msghdr msg{};
    msg.msg_iov = iov.data();
    msg.msg_iovlen = count;
    const ssize_t n = ::sendmsg(fd_, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        if (!want_write_) {
          want_write_ = true;
          update_interest();
        }
        return;
      }
      qp_->engine->handle_connection_lost();
      drain_qp_events();
      return;
    }
    qp_->engine->handle_transmitted(static_cast<std::size_t>(n));
  }
  if (want_write_) {
    want_write_ = false;
    update_interest();
  }
  drain_qp_events();  // closes the socket once the engine has nothing more to send
}

// A WR posted while nothing waits to go out is written at once, without entering the send
// queue; what the socket does not take waits for room like any queued FPDU.
bool Connection::send_direct(const SendWr& wr) {
  if (fd_ < 0 || phase_ != Phase::running || !qp_) return false;
  const std::span<const iovec> fpdu = qp_->engine->frame_direct(wr);
  if (fpdu.empty()) return false;
  msghdr msg{};
  msg.msg_iov = const_cast<iovec*>(fpdu.data());
  msg.msg_iovlen = fpdu.size();
  ssize_t n;
  do n = ::sendmsg(fd_, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
  while (n < 0 && errno == EINTR);
  const bool failed = n < 0 && errno != EAGAIN && errno != EWOULDBLOCK;
  qp_->engine->finish_direct(wr, n < 0 ? 0 : static_cast<std::size_t>(n));
  if (failed) {
    qp_->engine->handle_connection_lost();
    drain_qp_events();
    return true;
  }
  if (qp_->engine->has_transmit()) {
    transmit();  // the rest, or a Terminate after a CQ overrun
    return true;
  }
  drain_qp_events();
  return true;
}

void Connection::drain_qp_events() {
  if (!qp_) return;
  // Called after every receive and transmit; events are rare, so they are taken out of line
  // and this stays a few loads.
  if (qp_->engine->has_events()) deliver_qp_events();
  // Nothing more will be sent (Terminate out, or flushed after a disconnect): close.
  if (qp_ && qp_->engine->transmit_closed() && !qp_->engine->has_transmit()) close_socket();
}

void Connection::deliver_qp_events() {
  auto event = qp_->engine->poll_event();
  auto self = shared_from_this();  // a callback may drop the owner's reference
  do {
    const bool terminate = event->kind == core::QpEvent::Kind::terminate_sent ||
                           event->kind == core::QpEvent::Kind::terminate_received;
    PEERCM_LOG_AT(terminate ? log::Level::warn : log::Level::info, "qp",
                  "QP {} ({}): {}{}; outstanding work requests flush", qp_->qp_num, log::address(peer_),
                  qp_event_name(event->kind),
                  terminate ? fmt::format(" (layer {} type {} code 0x{:02x})", static_cast<int>(event->code.layer),
                                          static_cast<int>(event->code.error_type), event->code.error_code)
                            : std::string());
    if (auto callback = callbacks_.qp_event) callback(*event);
  } while (qp_ && (event = qp_->engine->poll_event()));
}

void Connection::disconnect() {
  if (fd_ < 0) return;
  if (qp_ && phase_ == Phase::running) {
    phase_ = Phase::closing;
    qp_->engine->disconnect();
    transmit();
    drain_qp_events();
  } else {
    close_socket();
  }
}

void Connection::abort() {
  if (fd_ < 0) return;
  linger hard{1, 0};
  ::setsockopt(fd_, SOL_SOCKET, SO_LINGER, &hard, sizeof hard);
  // A setup given up (a losing p2p attempt) ends with the RST alone; an established
  // connection still sends its FIN first.
  close_socket(/*send_fin=*/phase_ == Phase::running || phase_ == Phase::closing);
}

void Connection::close_socket(bool send_fin) {
  if (fd_ < 0) return;
  if (registered_) ctx_->reactor.remove(fd_);
  registered_ = false;
  // After the peer's FIN close() sends ours, and a reset socket sends nothing: no shutdown().
  if (send_fin && !peer_closed_ && !socket_failed_) ::shutdown(fd_, SHUT_WR);
  ::close(fd_);
  fd_ = -1;
  phase_ = Phase::closed;
  if (qp_) {
    qp_->kick_transmit = nullptr;
    qp_->send_direct = nullptr;
  }
  if (!closed_notified_) {
    closed_notified_ = true;
    auto self = shared_from_this();
    if (auto callback = callbacks_.closed) callback();
  }
}

sockaddr_in Connection::local_address() const {
  sockaddr_in a{};
  socklen_t len = sizeof a;
  if (fd_ >= 0) ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
  return a;
}

sockaddr_in Connection::peer_address() const { return peer_; }

}  // namespace peercm::detail
