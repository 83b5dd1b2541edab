// The state behind a CmId: rdma_cm's address/route/connect/listen life cycle on top of a
// Connection. All members are guarded by the context lock.
#pragma once

#include <netinet/in.h>

#include <memory>
#include <optional>
#include <vector>

#include "api/connection.hpp"
#include "api/context_impl.hpp"
#include "api/event_channel_impl.hpp"
#include "api/queue_pair_impl.hpp"
#include "core/p2p_resolver.hpp"
#include "peercm/cm.hpp"

namespace peercm::detail {

struct CmIdImpl : std::enable_shared_from_this<CmIdImpl> {
  enum class State : std::uint8_t {
    idle,
    bound,
    addr_resolved,
    route_resolved,
    connecting,
    listening,
    request_received,  // passive: CONNECT_REQUEST delivered, accept()/reject() pending
    accepting,
    established,
    disconnected,
  };

  CmIdImpl(std::shared_ptr<ContextImpl> ctx, std::shared_ptr<EventChannelImpl> channel, void* user_context);
  ~CmIdImpl();

  // Events are queued to the channel with `owner` as their id.
  void emit(CmEventType type, int status = 0, ConnParam param = {}, RejectReason reason = RejectReason::none);
  void emit_disconnected();
  // Callbacks for this id's connection; `link` names it to the p2p resolver (0: not tracked).
  Connection::Callbacks connection_callbacks(core::LinkId link = 0);
  // design.md §3 rule 1: the CM header that leads p2p requests and their accepting Replies.
  std::vector<std::uint8_t> cm_header(std::span<const std::uint8_t> application_data) const;
  // Ends this id's p2p bookkeeping (attempt and link) when it goes away or fails.
  void end_p2p();
  core::MpaConfig mpa_config(std::uint16_t ird, std::uint16_t ord) const;
  // rdma_cm's conn_param.qp_num: takes the unclaimed QueuePair::create() QP of that number.
  bool claim_qp(std::uint32_t qp_num);

  // listener side
  void on_listen_readable();
  // Backlog full: closes the oldest silent handshake, else the oldest whose Request is still
  // incomplete after a grace period; false if none.
  bool displace_stalled_handshake();
  void on_incoming_request(const std::shared_ptr<Connection>& conn);
  // A request the resolver let through to the application (rule 4), or any non-p2p request.
  void deliver_request(const std::shared_ptr<Connection>& conn, std::span<const std::uint8_t> app_data,
                       core::LinkId link, const core::P2pKey& key, const core::NodeIdentity& peer,
                       core::AttemptId peer_cmid);
  void release_pending();
  // The public CmId of a new id made by the stack (an incoming request): the application
  // owns it from its CONNECT_REQUEST on.
  static std::unique_ptr<CmId> make_public(const std::shared_ptr<CmIdImpl>& impl);

  std::shared_ptr<ContextImpl> ctx;
  std::shared_ptr<EventChannelImpl> channel;
  CmId* owner = nullptr;
  Context* public_context = nullptr;
  void* user_context;
  std::uint32_t number;
  State state = State::idle;
  bool peer_to_peer;
  std::int64_t connect_timeout_ms = 10000;
  core::CrcPolicy crc = core::CrcPolicy::preferred;
  std::uint32_t tag = 0;

  std::optional<sockaddr_in> bound_address;
  // The port rdma_bind_addr took (api/port_reservation.hpp). iWARP: a TCP socket bound to
  // bound_address, which listen() listens on and connect() connects from.
  int reserved_fd = -1;
  sockaddr_in destination{};
  sockaddr_in peer{};

  // listener
  int listen_fd = -1;
  int backlog = 0;
  std::size_t pending = 0;  // handshakes and undecided requests counted against the backlog
  std::vector<std::shared_ptr<Connection>> handshaking;

  // connection
  std::shared_ptr<Connection> connection;
  std::weak_ptr<CmIdImpl> listener;  // passive ids: the listener whose backlog they count in
  bool counted_in_backlog = false;
  std::shared_ptr<QueuePairImpl> qp_impl;
  std::unique_ptr<QueuePair> qp;  // null when the QP is the caller's (attach_qp, qp_num)
  // connect() named its QP by number: the reply is reported as connect_response, and
  // establish() is then expected (rdma_cm for an active id without a QP).
  bool qp_by_number = false;
  bool response_pending = false;
  // p2p (design.md §3)
  bool p2p_attempt = false;  // connect() went through the resolver
  core::P2pKey key;
  core::LinkId link = 0;     // the resolver's name for `connection` (0: untracked)
  ConnParam connect_param;   // reused when the attempt is bound to the peer's request
  std::uint64_t peer_incarnation = 0;
  core::NodeIdentity peer_node;     // a delivered p2p request's sender
  core::AttemptId peer_cmid = 0;
  bool disconnected_emitted = false;
  bool timewait_emitted = false;
  std::optional<engine::Reactor::TimerId> timewait_timer;

  // RoCE (api/roce/roce_cm.cpp). The agent of `roce_address` (host order) knows this id's
  // connection as `roce_id` (0: none).
  Transport transport = Transport::iwarp;
  bool datagram = false;  // CmOption::datagram: SIDR in rdma_cm's UDP port space
  std::uint32_t roce_address = 0;
  std::uint32_t roce_id = 0;
  std::uint16_t roce_listen_port = 0;
  std::uint32_t roce_psn = 0;  // our first request PSN
  ConnParam roce_param;        // the resources connect()/accept() offered
  // A connect()/accept() whose qp_num names no QP of the context: the IB CM exchange alone,
  // with this number in the REQ/REP (rdma-core's cmtime "no QPs" round; iWARP refuses it).
  std::optional<std::uint32_t> roce_qpn_without_qp;
  // The service port this id holds in the device's port space (bind or resolve_addr), at
  // roce_reserved_address (host order; RoceDevice::kAnyAddress for INADDR_ANY). 0: none.
  std::uint16_t roce_reserved_service = 0;
  std::uint32_t roce_reserved_address = 0;
};

}  // namespace peercm::detail
