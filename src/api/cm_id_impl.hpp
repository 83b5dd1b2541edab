// The state behind a CmId: rdma_cm's address/route/connect/listen life cycle, transport-neutral.
// What its transport's CM keeps for it is `transport_state`, reached only through `cm`
// (api/transport_cm.hpp). All members are guarded by the context lock.
#pragma once

#include <netinet/in.h>

#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "api/context_impl.hpp"
#include "api/event_channel_impl.hpp"
#include "api/queue_pair_impl.hpp"
#include "api/transport_cm.hpp"
#include "core/mpa_handshake.hpp"
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

  CmIdImpl(std::shared_ptr<ContextImpl> ctx, std::shared_ptr<EventChannelImpl> channel, void* user_context,
           TransportCm& cm, std::unique_ptr<TransportIdState> transport_state);
  ~CmIdImpl();

  // Events are queued to the channel with `owner` as their id.
  void emit(CmEventType type, int status = 0, ConnParam param = {}, RejectReason reason = RejectReason::none);
  void emit_disconnected();
  // rdma_cm's conn_param.qp_num: takes the unclaimed QueuePair::create() QP of that number.
  bool claim_qp(std::uint32_t qp_num);
  // The public CmId of a new id made by the stack (an incoming request): the application
  // owns it from its CONNECT_REQUEST on.
  static std::unique_ptr<CmId> make_public(const std::shared_ptr<CmIdImpl>& impl);
  // Listener: CONNECT_REQUEST for `child`, a new id the transport made for an incoming request
  // (`what` says which kind, for the log); the application owns the child from the event on.
  void push_connect_request(const std::shared_ptr<CmIdImpl>& child, ConnParam param, std::string_view what);

  std::shared_ptr<ContextImpl> ctx;
  std::shared_ptr<EventChannelImpl> channel;
  CmId* owner = nullptr;
  Context* public_context = nullptr;
  void* user_context;
  std::uint32_t number;
  State state = State::idle;
  // Options (CmOption).
  bool peer_to_peer;
  std::int64_t connect_timeout_ms = 10000;
  core::CrcPolicy crc = core::CrcPolicy::preferred;
  std::uint32_t tag = 0;
  bool datagram = false;  // rdma_cm's UDP port space

  std::optional<sockaddr_in> bound_address;
  sockaddr_in destination{};
  sockaddr_in peer{};

  std::shared_ptr<QueuePairImpl> qp_impl;
  std::unique_ptr<QueuePair> qp;  // null when the QP is the caller's (attach_qp, qp_num)
  // connect() named its QP by number: the reply is reported as connect_response, and
  // establish() is then expected (rdma_cm for an active id without a QP).
  bool qp_by_number = false;
  bool response_pending = false;
  bool disconnected_emitted = false;

  TransportCm* cm;
  std::unique_ptr<TransportIdState> transport_state;
};

}  // namespace peercm::detail
