// CmId over RoCEv2 (TransportCm RoceCm): rdma_cm's life cycle (bind, resolve, listen, connect,
// accept, reject, disconnect) driven through the IB CM agent of the id's local address, and
// the agent's events turned into CmEvents. All run under the context lock.
#pragma once

#include <netinet/in.h>

#include <optional>
#include <span>
#include <system_error>

#include "core/listen_backlog.hpp"
#include "api/transport_cm.hpp"
#include "core/ibcm/ibcm_agent.hpp"
#include "core/roce/rc_events.hpp"
#include "peercm/cm.hpp"
#include "peercm/result.hpp"

namespace peercm::detail {
struct CmIdImpl;
struct ContextImpl;
struct QueuePairImpl;
}  // namespace peercm::detail

namespace peercm::detail::roce {

class RoceDevice;
struct RocePort;

// What the RoCE CM keeps per CmId. The agent of `address` (host order) knows the id's
// connection as `agent_id` (0: none).
struct RoceIdState final : TransportIdState {
  std::uint32_t address = 0;
  std::uint32_t agent_id = 0;
  std::uint16_t listen_port = 0;
  std::uint32_t psn = 0;  // our first request PSN
  ConnParam param;        // the resources connect()/accept() offered
  // A connect()/accept() whose qp_num names no QP of the context: the IB CM exchange alone,
  // with this number in the REQ/REP (rdma-core's cmtime "no QPs" round; iWARP refuses it).
  std::optional<std::uint32_t> qpn_without_qp;
  // The service port this id holds in the device's port space (bind or resolve_addr), at
  // reserved_address (host order; RoceDevice::kAnyAddress for INADDR_ANY). 0: none.
  std::uint16_t reserved_service = 0;
  std::uint32_t reserved_address = 0;
  // listener: the requests delivered and not yet decided (B1)
  core::ListenBacklog backlog;
  // passive: charged to its listener's backlog, from `peer_source`
  bool counted_in_backlog = false;
  std::uint32_t peer_source = 0;
  std::weak_ptr<CmIdImpl> listener;
  // The RC core runs (RTR and RTS): since our REP left (passive), or since the REP came
  // (active). Holds the peer's QPN it was started for.
  std::optional<std::uint32_t> started_for_qpn;
};

class RoceCm final : public TransportCm {
 public:
  explicit RoceCm(ContextImpl& ctx) : ctx_(ctx) {}
  Transport transport() const override { return Transport::roce; }
  std::unique_ptr<TransportIdState> new_id_state() const override { return std::make_unique<RoceIdState>(); }
  bool binds_route_source() const override { return false; }
  bool supports_datagram() const override { return true; }
  Status<std::errc> reserve_port(CmIdImpl& id, sockaddr_in& address) override;
  Status<std::errc> listen(CmIdImpl& id, int backlog) override;
  void resolve_addr(CmIdImpl& id, const sockaddr_in& destination) override;
  void before_connect(CmIdImpl&, std::unique_lock<std::mutex>&) override {}
  Status<std::errc> connect(CmIdImpl& id, const ConnParam& param, std::optional<CmEvent>& retracted) override;
  Status<std::errc> accept(CmIdImpl& id, const ConnParam& param) override;
  Status<std::errc> reject(CmIdImpl& id, std::span<const std::uint8_t> private_data) override;
  Status<std::errc> disconnect(CmIdImpl& id) override;
  Result<std::shared_ptr<QueuePairImpl>, std::errc> create_qp(CmIdImpl& id, std::uint32_t pd,
                                                               const QpInitAttr& attr) override;
  Status<std::errc> attach_qp(CmIdImpl& id, const std::shared_ptr<QueuePairImpl>& qp) override;
  void release(CmIdImpl& id) override;
  sockaddr_in local_address(CmIdImpl& id) override;
  void add_stats(CmStats& stats) override;

 private:
  ContextImpl& ctx_;
};

// The context's device, made on first use.
RoceDevice& device_of(ContextImpl& ctx);

// Inputs from the device.
void on_agent_event(RoceDevice& device, RocePort& port, core::ibcm::IbCmAgentEvent& event);
void on_qp_error(RoceDevice& device, QueuePairImpl& qp, const core::roce::RcEvent& event);
// The QP heard from its peer after a check its id's connect asked for (docs/p2p.md R5b).
void on_qp_alive(RoceDevice& device, QueuePairImpl& qp);

}  // namespace peercm::detail::roce
