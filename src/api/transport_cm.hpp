// The one interface between a CmId (cm_id.cpp, rdma_cm's life cycle and its checks) and its
// transport's connection manager: iWARP (api/iwarp_cm.*, over core/iwarp_cm's agent) and RoCE
// (api/roce/roce_cm.*, over core/ibcm's agent). A CmIdImpl holds transport-neutral state and a
// pointer to the state its transport keeps for it (TransportIdState). Every method runs under the
// context lock.
#pragma once

#include <netinet/in.h>

#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <system_error>

#include "peercm/cm.hpp"
#include "peercm/result.hpp"

namespace peercm::detail {

struct CmIdImpl;
struct ContextImpl;
struct QueuePairImpl;

// What a transport keeps per CmId.
struct TransportIdState {
  virtual ~TransportIdState() = default;
};

class TransportCm {
 public:
  virtual ~TransportCm() = default;

  virtual Transport transport() const = 0;
  // A new id's state for this transport.
  virtual std::unique_ptr<TransportIdState> new_id_state() const = 0;
  // resolve_addr's implicit bind (api/port_reservation.hpp) takes the source the host's routes
  // pick; otherwise the transport picks its own in resolve_addr().
  virtual bool binds_route_source() const = 0;
  // CmOption::datagram (rdma_cm's UDP port space).
  virtual bool supports_datagram() const = 0;
  // rdma_bind_addr that takes the port (api/port_reservation.hpp); `address` gets the port.
  virtual Status<std::errc> reserve_port(CmIdImpl& id, sockaddr_in& address) = 0;
  // `backlog` > 0.
  virtual Status<std::errc> listen(CmIdImpl& id, int backlog) = 0;
  // Emits ADDR_RESOLVED or ADDR_ERROR (the destination is checked already).
  virtual void resolve_addr(CmIdImpl& id, const sockaddr_in& destination) = 0;
  // Before connect()'s state checks, with the lock that it may release for a moment: a p2p
  // connect may first take in what the node has already received (docs/p2p.md, Rules, R5).
  virtual void before_connect(CmIdImpl& id, std::unique_lock<std::mutex>& lock) = 0;
  // From route_resolved. `retracted`: a CONNECT_REQUEST taken back from the application (R5),
  // to be destroyed by the caller once the context lock is released.
  virtual Status<std::errc> connect(CmIdImpl& id, const ConnParam& param, std::optional<CmEvent>& retracted) = 0;
  virtual Status<std::errc> accept(CmIdImpl& id, const ConnParam& param) = 0;
  virtual Status<std::errc> reject(CmIdImpl& id, std::span<const std::uint8_t> private_data) = 0;
  virtual Status<std::errc> disconnect(CmIdImpl& id) = 0;
  // A QP for the id (rdma_create_qp).
  virtual Result<std::shared_ptr<QueuePairImpl>, std::errc> create_qp(CmIdImpl& id, std::uint32_t pd,
                                                                       const QpInitAttr& attr) = 0;
  // A QP made on its own (QueuePair::create) becomes the id's.
  virtual Status<std::errc> attach_qp(CmIdImpl& id, const std::shared_ptr<QueuePairImpl>& qp) = 0;
  // The CmId is going: its connection ends, its listener stops, no further events.
  virtual void release(CmIdImpl& id) = 0;
  virtual sockaddr_in local_address(CmIdImpl& id) = 0;
  // Adds the transport's counters (collisions, rejects) to `stats`.
  virtual void add_stats(CmStats& stats) = 0;
};

// The context's CM for `transport`, made on first use; null for a transport peercm lacks.
TransportCm* transport_cm(ContextImpl& ctx, Transport transport);

}  // namespace peercm::detail
