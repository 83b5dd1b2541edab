// The connection manager API: event channels and communication identifiers (CmId), with
// the events and semantics of rdma_cm, plus the peer-to-peer connection model (design.md §3).
#pragma once

#include <netinet/in.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <system_error>
#include <vector>

#include "peercm/result.hpp"
#include "peercm/verbs.hpp"

namespace peercm {

namespace detail {
struct EventChannelImpl;
struct CmIdImpl;
}  // namespace detail

class CmId;

// The wire a CmId and its QP use. iwarp: MPA/DDP/RDMAP over TCP. roce: RoCEv2 (RC over
// UDP port 4791) with the IB CM over QP1 (docs/roce-transport.md). Chosen when the id is
// created; ids made for incoming requests take their listener's.
enum class Transport : std::uint8_t { iwarp, roce };
std::string_view to_string(Transport transport);

enum class CmEventType : std::uint8_t {
  addr_resolved,
  addr_error,
  route_resolved,
  route_error,
  connect_request,
  connect_response,  // active side without a QP: the application completes with establish()
  established,
  rejected,
  unreachable,
  connect_error,
  disconnected,
  timewait_exit,
};
std::string_view to_string(CmEventType type);

// Why an attempt or a request was rejected (statistics and REJECTED events).
enum class RejectReason : std::uint8_t {
  none,
  application,   // the peer's application called reject()
  refused,       // nothing listens at the address (TCP refused)
  collision,     // p2p: this request lost the collision (design.md §3 rule 3)
  duplicate,     // p2p: late duplicate of an established connection (rule 6)
  timeout,       // the handshake did not finish in time
  markers,       // the peer asked for MPA markers
  invalid,       // malformed MPA exchange
};
std::string_view to_string(RejectReason reason);

// rdma_conn_param: private data and RDMA Read resources. responder_resources is our IRD,
// initiator_depth our ORD; in a CONNECT_REQUEST they are given as the peer sees them.
struct ConnParam {
  std::vector<std::uint8_t> private_data;
  std::uint8_t responder_resources = 16;
  std::uint8_t initiator_depth = 16;
  // In events: the peer's QP number. In connect()/accept() on an id without a QP: the number
  // of a QP made with QueuePair::create() that the connection runs on (rdma_cm's qp_num).
  std::uint32_t qp_num = 0;
  // Datagram ids (CmOption::datagram), established: the Q_Key of the peer's UD QP.
  std::uint32_t qkey = 0;
};

struct CmEvent {
  CmEventType type = CmEventType::addr_error;
  CmId* id = nullptr;         // the id the event is about
  CmId* listen_id = nullptr;  // connect_request: the listener
  int status = 0;             // 0 or a positive errno value
  RejectReason reject_reason = RejectReason::none;
  ConnParam param;            // private data and the peer's resources
  // connect_request: the new id; the application owns it from here on.
  std::unique_ptr<CmId> new_id;
};

// A queue of CM events with a pollable fd (rdma_event_channel).
class EventChannel {
 public:
  static Result<std::unique_ptr<EventChannel>, std::errc> create();
  ~EventChannel();
  EventChannel(const EventChannel&) = delete;
  EventChannel& operator=(const EventChannel&) = delete;

  int fd() const;
  // The next event; ETIMEDOUT after `timeout` (negative: wait forever). In inline progress
  // mode waiting drives the contexts whose ids report here.
  Result<CmEvent, std::errc> get_event(std::chrono::milliseconds timeout = std::chrono::milliseconds(-1));
  // rdma_ack_cm_event: releases the event (kept for parity; events are values).
  void ack_event(CmEvent&& event);

  detail::EventChannelImpl& impl() { return *impl_; }
  std::shared_ptr<detail::EventChannelImpl> impl_shared() const { return impl_; }

 private:
  EventChannel();
  std::shared_ptr<detail::EventChannelImpl> impl_;
};

enum class CmOption : std::uint8_t {
  peer_to_peer,     // bool, default on (design.md §3)
  // Milliseconds, default 10000. On an active id it bounds the whole attempt, p2p or
  // client/server, over iWARP and RoCE alike (docs/p2p.md R8): without ESTABLISHED (or a
  // reject) by then the attempt ends UNREACHABLE (ETIMEDOUT) if the peer was never heard
  // (iWARP: the TCP connect did not complete; RoCE: nothing answered the REQ), CONNECT_ERROR
  // (ETIMEDOUT, RejectReason::timeout) otherwise; a p2p attempt always CONNECT_ERROR. Over
  // RoCE the peer is sent a REJ(timeout); the IB CM's own resends (RoceOptions) may end the
  // attempt sooner. On a listening id it bounds every incoming setup, from the TCP accept to
  // the application's accept() or reject(): a peer that sends no MPA Request, or sends it too
  // slowly, is closed then (RFC 5044 §7.1.2). It applies to connections accepted after the call.
  connect_timeout,
  crc,              // 0 required, 1 preferred, 2 off
  p2p_tag,          // 32-bit tag of the p2p key
  // bool, default off; set before bind/listen/connect. On: rdma_cm's UDP port space over RoCE:
  // connect() is a SIDR request whose established event names the peer's UD QP (qp_num,
  // qkey), accept() answers a request with the UD QP given by qp_num, and the id has no
  // connection to disconnect. EPROTONOSUPPORT over iWARP, which has no datagram service.
  datagram,
};

// Process-wide default of the PeerToPeer option for new ids.
void set_default_peer_to_peer(bool on);
bool default_peer_to_peer();

struct CmStats {
  std::uint64_t collisions_won = 0;
  std::uint64_t collisions_lost = 0;
  std::uint64_t delivered_requests = 0;  // p2p requests that matched no attempt (rule 4)
  std::uint64_t rejects_sent[8] = {};      // by RejectReason
  std::uint64_t rejects_received[8] = {};  // by RejectReason
  // Times an iWARP listener found the process out of descriptors (or the kernel out of
  // memory) at accept() and paused (docs/reliability.md, "Descriptor exhaustion").
  std::uint64_t accept_pauses = 0;
  // Requests a listener had no room for (docs/p2p.md, B1): iWARP streams closed at once, RoCE
  // REQs answered with REJ 28 (also counted in rejects_sent as application rejects).
  std::uint64_t backlog_refused = 0;
};

// A communication identifier (rdma_cm_id).
class CmId {
 public:
  // `transport` is fixed for the id's life. A RoCE id's QP comes from create_qp(), or from
  // attach_qp() once the id has an address.
  static Result<std::unique_ptr<CmId>, std::errc> create(Context& context, EventChannel& channel,
                                                         void* user_context = nullptr,
                                                         Transport transport = Transport::iwarp);
  ~CmId();
  CmId(const CmId&) = delete;
  CmId& operator=(const CmId&) = delete;

  Status<std::errc> set_option(CmOption option, std::int64_t value);
  std::int64_t option(CmOption option) const;

  Status<std::errc> bind(const sockaddr_in& address);
  Status<std::errc> listen(int backlog);
  Status<std::errc> resolve_addr(const sockaddr_in& destination,
                                 std::chrono::milliseconds timeout = std::chrono::milliseconds(2000));
  Status<std::errc> resolve_route(std::chrono::milliseconds timeout = std::chrono::milliseconds(2000));
  // Peer-to-peer (docs/p2p.md R5): EALREADY while the key has an attempt or an undecided
  // request, EISCONN when it has a connection; over RoCE a connection is checked first (R5b),
  // and its EISCONN arrives as CONNECT_ERROR with status EISCONN once the peer has answered.
  Status<std::errc> connect(const ConnParam& param);
  Status<std::errc> accept(const ConnParam& param);
  Status<std::errc> reject(std::span<const std::uint8_t> private_data = {});
  // Active side whose connect() named its QP by number: the connection reported
  // connect_response and runs; this completes the exchange (rdma_establish). EINVAL otherwise.
  Status<std::errc> establish();
  Status<std::errc> disconnect();
  // Moves the id, with its queued events (and a listener's queued requests), to `channel`.
  Status<std::errc> migrate(EventChannel& channel);

  Result<QueuePair*, std::errc> create_qp(ProtectionDomain& pd, const QpInitAttr& attr);
  void destroy_qp();
  QueuePair* qp() const;
  // A QP the caller owns (QueuePair::create) becomes this id's QP, as create_qp()'s would;
  // EINVAL if the id has one. When the id goes while connected, the QP moves to ERROR.
  Status<std::errc> attach_qp(QueuePair& qp);
  void detach_qp();

  Context& context() const;
  Transport transport() const;
  void* user_context() const;
  std::uint32_t number() const;  // the CmId number (p2p tie-breaker)
  sockaddr_in local_address() const;
  sockaddr_in peer_address() const;

  detail::CmIdImpl& impl() { return *impl_; }

 private:
  friend struct detail::CmIdImpl;
  explicit CmId(std::shared_ptr<detail::CmIdImpl> impl);
  std::shared_ptr<detail::CmIdImpl> impl_;
};

CmStats cm_stats(Context& context);

}  // namespace peercm
