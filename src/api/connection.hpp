// One TCP stream of the iWARP CM (api/iwarp_cm.cpp): during setup it hands the peer's bytes to
// the CM agent and sends the agent's MPA frames; once the agent starts it, it pumps bytes
// between the socket and the queue-pair engine (zero copy both ways where CRC allows). It
// decides nothing about the CM. All methods and callbacks run with the context lock held.
#pragma once

#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/uio.h>

#include <array>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "api/context_impl.hpp"
#include "api/queue_pair_impl.hpp"
#include "core/mpa_handshake.hpp"
#include "core/queue_pair_engine.hpp"

namespace peercm::detail {

// TCP_NODELAY, so that FPDUs leave as they are framed. A listener with it passes it on to
// the sockets it accepts (Linux copies it into each), which then need no call of their own.
void set_socket_options(int fd);

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  struct Callbacks {
    std::function<void(int error)> tcp_failed;  // active: connect() failed (errno)
    std::function<void()> tcp_connected;        // active: connect() succeeded
    // Bytes that arrived before start(): returns how many the handshake used; the rest are
    // kept for the engine.
    std::function<std::size_t(std::span<const std::uint8_t> bytes)> setup_bytes;
    std::function<void(const core::QpEvent& event)> qp_event;
    std::function<void()> closed;  // the socket is closed and unregistered
  };

  Connection(std::shared_ptr<ContextImpl> ctx, int fd, Callbacks callbacks);
  ~Connection();

  // Active open: a non-blocking connect to `destination`. It leaves from `bound_fd` when given
  // (a TCP socket already bound to the id's port, which the connection then owns), else from a
  // new socket on `source`'s address and a free port.
  static Result<std::shared_ptr<Connection>, std::errc> open(std::shared_ptr<ContextImpl> ctx,
                                                             const sockaddr_in& destination,
                                                             const std::optional<sockaddr_in>& source,
                                                             Callbacks callbacks, int bound_fd = -1);
  // Passive open: an accepted socket waiting for the MPA Request.
  static Result<std::shared_ptr<Connection>, std::errc> adopt(std::shared_ptr<ContextImpl> ctx, int fd,
                                                              const sockaddr_in& peer, Callbacks callbacks);

  // Passive: reads what the peer has already sent. A connecting peer sends its Request right
  // behind the handshake, so it is usually there by the time the socket is accepted: read now,
  // not one epoll round later.
  void receive_pending() {
    auto self = shared_from_this();
    on_io(EPOLLIN);
  }
  void set_callbacks(Callbacks callbacks) { callbacks_ = std::move(callbacks); }
  // Setup: bytes of the CM's (an MPA frame), sent in order; what the socket does not take now
  // waits for it to become writable. The first ones leave at once, even while TCP connects.
  void send_setup(std::span<const std::uint8_t> bytes);
  // The MPA handshake is done: `qp` (none: nothing runs) takes the stream with what MPA agreed;
  // bytes that arrived behind the handshake go to it first.
  void start(std::shared_ptr<QueuePairImpl> qp, const core::MpaResult& result, bool initiator);
  // RFC 6581 §8: the handshake failed with a Terminate to send (2/0/`code`) before the close;
  // without a QP to frame it, the stream just closes.
  void terminate_setup(std::shared_ptr<QueuePairImpl> qp, bool crc, std::uint8_t code);

  // Graceful: flush the QP, send what is pending, then close.
  void disconnect();
  // Abortive: close now (RST), no events beyond `closed`.
  void abort();
  bool is_open() const { return fd_ >= 0; }
  sockaddr_in local_address() const;
  sockaddr_in peer_address() const;

 private:
  enum class Phase : std::uint8_t { tcp_connecting, mpa, running, closing, closed };

  void register_io();
  void on_io(std::uint32_t events);
  void on_connected(std::uint32_t events);
  void receive();
  bool expects_large_payload();  // (qp_ set) the next read should take only a header
  void receive_setup(std::span<const std::uint8_t> bytes);
  void feed_engine(std::span<const std::uint8_t> bytes);
  void transmit();
  bool send_direct(const SendWr& wr);
  void transmit_setup();
  void drain_qp_events();
  [[gnu::noinline]] void deliver_qp_events();
  void start_engine();
  void update_interest();
  void close_socket(bool send_fin = true);

  std::shared_ptr<ContextImpl> ctx_;
  int fd_;
  // Known from connect()/accept(): still right after the peer reset the connection.
  sockaddr_in peer_{};
  Callbacks callbacks_;
  Phase phase_ = Phase::mpa;
  bool initiator_ = false;
  std::optional<core::MpaResult> result_;
  std::vector<std::uint8_t> setup_out_;  // setup bytes the socket has not taken yet
  std::shared_ptr<QueuePairImpl> qp_;
  std::vector<std::uint8_t> early_bytes_;  // FPDU bytes that arrived before the QP started
  bool want_write_ = false;
  int early_connect_error_ = 0;  // what an early send() reported while TCP connected (send_setup)
  bool header_sized_reads_ = false;  // see expects_large_payload()
  bool registered_ = false;
  bool peer_closed_ = false;
  bool socket_failed_ = false;  // a read failed (RST, error)
  bool closed_notified_ = false;
};

}  // namespace peercm::detail
