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

core::Time core_now() { return core::Time(std::chrono::steady_clock::now().time_since_epoch()); }

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

std::string_view failure_name(core::MpaFailure failure) {
  switch (failure) {
    case core::MpaFailure::timeout: return "no MPA frame before the connect timeout";
    case core::MpaFailure::bad_frame: return "malformed MPA frame";
    case core::MpaFailure::markers_requested: return "the peer asked for MPA Markers, which peercm refuses";
    case core::MpaFailure::crc_conflict: return "CRC policies conflict";
    case core::MpaFailure::insufficient_ird: return "our IRD cannot meet the responder's ORD (Terminate 2/0/6)";
    case core::MpaFailure::no_matching_rtr: return "no common RTR type (Terminate 2/0/7)";
    case core::MpaFailure::connection_closed: return "the peer closed the TCP connection during setup";
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
  if (mpa_timer_) ctx_->reactor.cancel_timer(*mpa_timer_);
}

Result<std::shared_ptr<Connection>, std::errc> Connection::open(std::shared_ptr<ContextImpl> ctx,
                                                                const sockaddr_in& destination,
                                                                const std::optional<sockaddr_in>& source,
                                                                const core::MpaConfig& config,
                                                                std::vector<std::uint8_t> request_private_data,
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
  conn->config_ = config;
  conn->peer_ = destination;
  conn->request_private_data_ = std::move(request_private_data);
  // Created now so that its deadline bounds the TCP connect as well.
  conn->initiator_.emplace(config, conn->request_private_data_, core_now());
  conn->phase_ = Phase::tcp_connecting;
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&destination), sizeof destination) != 0 &&
      errno != EINPROGRESS) {
    return fail(static_cast<std::errc>(errno));  // the destructor closes fd
  }
  conn->send_request_early();
  conn->register_io();
  // The whole setup, TCP included, is bounded by the connect timeout.
  conn->arm_mpa_timer(std::chrono::steady_clock::now() + config.timeout);
  return conn;
}

Result<std::shared_ptr<Connection>, std::errc> Connection::adopt(std::shared_ptr<ContextImpl> ctx, int fd,
                                                                 const sockaddr_in& peer, const core::MpaConfig& config,
                                                                 Callbacks callbacks) {
  // No set_socket_options(): an accepted socket inherits TCP_NODELAY from its listener.
  auto conn = std::make_shared<Connection>(ctx, fd, std::move(callbacks));
  conn->peer_ = peer;
  conn->config_ = config;
  conn->responder_.emplace(config, core_now());
  conn->phase_ = Phase::mpa;
  conn->register_io();
  conn->arm_mpa_timer(std::chrono::steady_clock::now() + config.timeout);
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

void Connection::arm_mpa_timer(std::chrono::steady_clock::time_point deadline) {
  std::weak_ptr<Connection> weak = weak_from_this();
  mpa_timer_ = ctx_->reactor.add_timer(deadline, [weak] {
    if (auto self = weak.lock()) self->on_mpa_timeout();
  });
}

void Connection::on_mpa_timeout() {
  mpa_timer_.reset();
  auto self = shared_from_this();
  if (phase_ == Phase::tcp_connecting) {
    close_socket();
    if (auto callback = callbacks_.tcp_failed) callback(ETIMEDOUT);
    return;
  }
  if (phase_ != Phase::mpa) return;
  const auto now = core_now();
  if (initiator_) initiator_->handle_timeout(now);
  if (responder_) responder_->handle_timeout(now);
  drain_mpa_events();
  // The core started its clock after the TCP connect: follow its own deadline.
  std::optional<core::Time> deadline = initiator_ ? initiator_->deadline() : responder_ ? responder_->deadline() : std::nullopt;
  if (phase_ == Phase::mpa && deadline && !mpa_timer_) arm_mpa_timer(std::chrono::steady_clock::time_point(deadline->time_since_epoch()));
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
void Connection::send_request_early() {
  const std::span<const std::uint8_t> request = initiator_->pending_transmit();
  const ssize_t n = ::send(fd_, request.data(), request.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  if (n < 0) {
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) early_connect_error_ = errno;
    want_write_ = true;
    return;
  }
  initiator_->consume_transmit(static_cast<std::size_t>(n));
  phase_ = Phase::mpa;
  want_write_ = !initiator_->pending_transmit().empty();
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
    close_socket();
    if (auto callback = callbacks_.tcp_failed) callback(error);
    return;
  }
  phase_ = Phase::mpa;
  if (registered_) ctx_->reactor.poll_directly(fd_, true);
  transmit_mpa();
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
      std::span<std::uint8_t> target = qp_->engine.receive_target();
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
          qp_->engine.handle_placed(std::min(got, target.size()));
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
          qp_->engine.handle_peer_closed();
          drain_qp_events();
          return;
        }
        if (errno == EAGAIN || errno == EWOULDBLOCK) return;
        if (errno == EINTR) continue;
        qp_->engine.handle_connection_lost();
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
        receive_mpa(bytes);
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
      if (initiator_) initiator_->handle_connection_closed();
      if (responder_) responder_->handle_connection_closed();
      drain_mpa_events();
      if (phase_ == Phase::mpa) close_socket();
    } else if (qp_ && phase_ == Phase::running) {
      if (n == 0) {
        qp_->engine.handle_peer_closed();
      } else {
        qp_->engine.handle_connection_lost();
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
  return qp_->engine.receive_target().size() >= kZeroCopyThreshold ||
         qp_->engine.last_message_largest_segment() >= kZeroCopyThreshold;
}

bool Connection::silent() const {
  if (heard_from_peer_ || fd_ < 0) return false;
  std::uint8_t byte = 0;
  // EAGAIN: nothing sent; 0 or an error: gone, which is no reason to keep the place either.
  return ::recv(fd_, &byte, 1, MSG_PEEK | MSG_DONTWAIT) <= 0;
}

void Connection::receive_mpa(std::span<const std::uint8_t> bytes) {
  heard_from_peer_ = true;
  std::size_t used = 0;
  if (initiator_) used = initiator_->handle_bytes(bytes);
  if (responder_) used = responder_->handle_bytes(bytes);
  if (used < bytes.size()) early_bytes_.insert(early_bytes_.end(), bytes.begin() + static_cast<std::ptrdiff_t>(used), bytes.end());
  drain_mpa_events();
  if (phase_ == Phase::mpa && early_bytes_.size() > kMaxEarlyBytes) {
    // RFC 5044 §7.1.2: FPDUs follow the Reply. A peer streaming before it got one (while our
    // application decides) would otherwise be buffered without bound: give the setup up.
    std::vector<std::uint8_t>().swap(early_bytes_);
    if (initiator_) initiator_->handle_connection_closed();
    if (responder_) responder_->handle_connection_closed();
    drain_mpa_events();
    if (phase_ == Phase::mpa) close_socket();
  }
}

void Connection::feed_engine(std::span<const std::uint8_t> bytes) {
  if (!qp_) return;
  qp_->engine.handle_bytes(bytes);
  drain_qp_events();
  transmit();
}

void Connection::drain_mpa_events() {
  auto self = shared_from_this();
  for (;;) {
    std::optional<core::MpaEvent> event;
    if (initiator_) event = initiator_->poll_event();
    if (!event && responder_) event = responder_->poll_event();
    if (!event) break;
    switch (event->kind) {
      case core::MpaEvent::Kind::established:
        result_ = event->result;
        PEERCM_LOG(info, "mpa", "{} {}: established, revision {}, CRC {}, IRD {} ORD {}, RTR {}",
                  initiator_ ? "initiator to" : "responder for", log::address(peer_), result_->revision,
                  result_->crc ? "on" : "off", result_->ird, result_->ord, rtr_name(result_->rtr));
        if (mpa_timer_) {
          ctx_->reactor.cancel_timer(*mpa_timer_);
          mpa_timer_.reset();
        }
        transmit_mpa();  // the responder's Reply goes out before any FPDU
        start_engine();
        break;
      case core::MpaEvent::Kind::request_received:
        break;
      case core::MpaEvent::Kind::rejected:
      case core::MpaEvent::Kind::failed:
        if (event->kind == core::MpaEvent::Kind::rejected) {
          PEERCM_LOG(info, "mpa", "initiator to {}: the peer rejected the Request", log::address(peer_));
        } else {
          PEERCM_LOG(warn, "mpa", "{} {}: setup failed: {}", initiator_ ? "initiator to" : "responder for",
                    log::address(peer_), failure_name(event->failure));
        }
        if (mpa_timer_) {
          ctx_->reactor.cancel_timer(*mpa_timer_);
          mpa_timer_.reset();
        }
        transmit_mpa();  // a reject Reply still goes out
        break;
    }
    // A copy: the callback may replace this connection's callbacks.
    if (auto callback = callbacks_.mpa_event) callback(*event);
    if (event->kind == core::MpaEvent::Kind::rejected || event->kind == core::MpaEvent::Kind::failed) {
      if (event->send_terminate && qp_) {
        // RFC 6581 §8: 2/0/6 or 2/0/7 go out as a Terminate before the connection closes.
        const std::uint8_t code = event->failure == core::MpaFailure::insufficient_ird ? 0x06 : 0x07;
        core::StreamParams params;
        params.crc = event->result.crc;
        qp_->engine.connect(params);
        qp_->engine.terminate(wire::TerminateCode{wire::TerminateLayer::llp, 0x0, code});
        phase_ = Phase::closing;
        transmit();
        drain_qp_events();
      } else {
        close_socket();
      }
      return;
    }
  }
  transmit_mpa();
}

void Connection::transmit_mpa() {
  for (;;) {
    std::span<const std::uint8_t> bytes = initiator_ ? initiator_->pending_transmit()
                                          : responder_ ? responder_->pending_transmit()
                                                       : std::span<const std::uint8_t>{};
    if (bytes.empty() || fd_ < 0) break;
    const ssize_t n = ::send(fd_, bytes.data(), bytes.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      want_write_ = errno == EAGAIN || errno == EWOULDBLOCK;
      update_interest();
      return;
    }
    if (initiator_) initiator_->consume_transmit(static_cast<std::size_t>(n));
    if (responder_) responder_->consume_transmit(static_cast<std::size_t>(n));
  }
  if (want_write_ && phase_ != Phase::running) {
    want_write_ = false;
    update_interest();
  }
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
  params.responder = responder_.has_value();
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
  qp_->engine.connect(params);
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
    transmit_mpa();
    return;
  }
  if (!qp_) return;
  std::array<iovec, kMaxIovecs> iov;  // gather_transmit() fills what sendmsg() reads
  // Called after every input; most find nothing to send (a received Send's reply is the
  // application's to post), so the engine is asked before anything is framed.
  while (qp_->engine.has_transmit()) {
    const std::size_t count = qp_->engine.gather_transmit(iov);
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
      qp_->engine.handle_connection_lost();
      drain_qp_events();
      return;
    }
    qp_->engine.handle_transmitted(static_cast<std::size_t>(n));
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
  const std::span<const iovec> fpdu = qp_->engine.frame_direct(wr);
  if (fpdu.empty()) return false;
  msghdr msg{};
  msg.msg_iov = const_cast<iovec*>(fpdu.data());
  msg.msg_iovlen = fpdu.size();
  ssize_t n;
  do n = ::sendmsg(fd_, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
  while (n < 0 && errno == EINTR);
  const bool failed = n < 0 && errno != EAGAIN && errno != EWOULDBLOCK;
  qp_->engine.finish_direct(wr, n < 0 ? 0 : static_cast<std::size_t>(n));
  if (failed) {
    qp_->engine.handle_connection_lost();
    drain_qp_events();
    return true;
  }
  if (qp_->engine.has_transmit()) {
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
  if (qp_->engine.has_events()) deliver_qp_events();
  // Nothing more will be sent (Terminate out, or flushed after a disconnect): close.
  if (qp_ && qp_->engine.transmit_closed() && !qp_->engine.has_transmit()) close_socket();
}

void Connection::deliver_qp_events() {
  auto event = qp_->engine.poll_event();
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
  } while (qp_ && (event = qp_->engine.poll_event()));
}

void Connection::accept(std::shared_ptr<QueuePairImpl> qp, std::uint16_t ird, std::uint16_t ord,
                        std::span<const std::uint8_t> private_data) {
  if (!responder_) return;
  qp_ = std::move(qp);
  responder_->accept(ird, ord, private_data);
  drain_mpa_events();
}

void Connection::reject(std::span<const std::uint8_t> private_data) {
  if (!responder_) return;
  responder_->reject(private_data);
  drain_mpa_events();
  transmit_mpa();
  close_socket();
}

void Connection::bind_qp(std::shared_ptr<QueuePairImpl> qp) { qp_ = std::move(qp); }

void Connection::disconnect() {
  if (fd_ < 0) return;
  if (qp_ && phase_ == Phase::running) {
    phase_ = Phase::closing;
    qp_->engine.disconnect();
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
  if (mpa_timer_) {
    ctx_->reactor.cancel_timer(*mpa_timer_);
    mpa_timer_.reset();
  }
  ctx_->reactor.remove(fd_);
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
