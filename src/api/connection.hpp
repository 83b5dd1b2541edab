// One TCP connection of a CmId: drives the MPA handshake core, then pumps bytes between the
// socket and the queue-pair engine (zero copy both ways where CRC allows). All methods and
// callbacks run with the context lock held.
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

namespace peercm::detail {

// TCP_NODELAY, so that FPDUs leave as they are framed. A listener with it passes it on to
// the sockets it accepts (Linux copies it into each), which then need no call of their own.
void set_socket_options(int fd);

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  struct Callbacks {
    std::function<void(int error)> tcp_failed;           // active: connect() failed (errno)
    std::function<void(core::MpaEvent& event)> mpa_event;  // request_received, established, rejected, failed
    std::function<void(const core::QpEvent& event)> qp_event;
    std::function<void()> closed;                        // the socket is closed and unregistered
  };

  Connection(std::shared_ptr<ContextImpl> ctx, int fd, Callbacks callbacks);
  ~Connection();

  // Active open: a non-blocking connect to `destination`, then the MPA Request. It leaves from
  // `bound_fd` when given (a TCP socket already bound to the id's port, which the connection
  // then owns), else from a new socket on `source`'s address and a free port.
  static Result<std::shared_ptr<Connection>, std::errc> open(std::shared_ptr<ContextImpl> ctx,
                                                             const sockaddr_in& destination,
                                                             const std::optional<sockaddr_in>& source,
                                                             const core::MpaConfig& config,
                                                             std::vector<std::uint8_t> request_private_data,
                                                             Callbacks callbacks, int bound_fd = -1);
  // Passive open: an accepted socket waiting for the MPA Request.
  static Result<std::shared_ptr<Connection>, std::errc> adopt(std::shared_ptr<ContextImpl> ctx, int fd,
                                                              const sockaddr_in& peer, const core::MpaConfig& config,
                                                              Callbacks callbacks);

  // Passive: reads what the peer has already sent. A connecting peer sends its Request right
  // behind the handshake, so it is usually there by the time the socket is accepted: read now,
  // not one epoll round later.
  void receive_pending() {
    auto self = shared_from_this();
    on_io(EPOLLIN);
  }
  // Replaces who hears about this connection (a listener hands it to a new CmId).
  void set_callbacks(Callbacks callbacks) { callbacks_ = std::move(callbacks); }
  core::MpaResponder* responder() { return responder_ ? &*responder_ : nullptr; }
  // During setup: the peer has sent nothing, not even a byte still waiting in the socket.
  bool silent() const;
  std::chrono::steady_clock::time_point opened_at() const { return opened_at_; }
  // Responder: answer the Request. The QP (if any) starts when the Reply is out.
  void accept(std::shared_ptr<QueuePairImpl> qp, std::uint16_t ird, std::uint16_t ord,
              std::span<const std::uint8_t> private_data);
  void reject(std::span<const std::uint8_t> private_data);
  // Initiator: the QP that runs once the Reply arrives.
  void bind_qp(std::shared_ptr<QueuePairImpl> qp);
  const std::optional<core::MpaResult>& result() const { return result_; }

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
  void send_request_early();
  void on_connected(std::uint32_t events);
  void on_mpa_timeout();
  void receive();
  bool expects_large_payload();  // (qp_ set) the next read should take only a header
  void receive_mpa(std::span<const std::uint8_t> bytes);
  void feed_engine(std::span<const std::uint8_t> bytes);
  void transmit();
  bool send_direct(const SendWr& wr);
  void transmit_mpa();
  void drain_mpa_events();
  void drain_qp_events();
  [[gnu::noinline]] void deliver_qp_events();
  void start_engine();
  void arm_mpa_timer(std::chrono::steady_clock::time_point deadline);
  void update_interest();
  void close_socket(bool send_fin = true);

  std::shared_ptr<ContextImpl> ctx_;
  int fd_;
  // Known from connect()/accept(): still right after the peer reset the connection.
  sockaddr_in peer_{};
  Callbacks callbacks_;
  Phase phase_ = Phase::mpa;
  core::MpaConfig config_;
  std::optional<core::MpaInitiator> initiator_;
  std::optional<core::MpaResponder> responder_;
  std::optional<core::MpaResult> result_;
  std::vector<std::uint8_t> request_private_data_;
  std::shared_ptr<QueuePairImpl> qp_;
  std::vector<std::uint8_t> early_bytes_;  // FPDU bytes that arrived before the QP started
  std::optional<engine::Reactor::TimerId> mpa_timer_;
  bool want_write_ = false;
  int early_connect_error_ = 0;  // what the early Request's send() reported (send_request_early)
  bool header_sized_reads_ = false;  // see expects_large_payload()
  bool registered_ = false;
  bool peer_closed_ = false;
  bool socket_failed_ = false;  // a read failed (RST, error)
  bool closed_notified_ = false;
  bool heard_from_peer_ = false;  // a byte arrived during setup
  std::chrono::steady_clock::time_point opened_at_ = std::chrono::steady_clock::now();
};

}  // namespace peercm::detail
