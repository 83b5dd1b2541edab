// CmId over RoCEv2: rdma_cm's life cycle (bind, resolve, listen, connect, accept, reject,
// disconnect) driven through the IB CM agent of the id's local address, and the agent's
// events turned into CmEvents. cm_id.cpp calls these for ids whose transport is roce; all
// run under the context lock.
#pragma once

#include <netinet/in.h>

#include <optional>
#include <span>
#include <system_error>

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

// The context's device, made on first use.
RoceDevice& device_of(ContextImpl& ctx);

Status<std::errc> listen(CmIdImpl& id);
void resolve_addr(CmIdImpl& id, const sockaddr_in& destination);
// `retracted`: a CONNECT_REQUEST taken back from the application (see roce_cm.cpp), to be
// destroyed by the caller once the context lock is released.
Status<std::errc> connect(CmIdImpl& id, const ConnParam& param, std::optional<CmEvent>& retracted);
Status<std::errc> accept(CmIdImpl& id, const ConnParam& param);
Status<std::errc> reject(CmIdImpl& id, std::span<const std::uint8_t> private_data);
Status<std::errc> disconnect(CmIdImpl& id);
Result<std::shared_ptr<QueuePairImpl>, std::errc> create_qp(CmIdImpl& id, std::uint32_t pd, const QpInitAttr& attr);
// A QP made on its own (QueuePair::create, ibv_create_qp) and never used: it gets its RC
// core and send socket here. EINVAL before the id has an address, for an SRQ QP, or one in use.
Status<std::errc> attach_qp(CmIdImpl& id, const std::shared_ptr<QueuePairImpl>& qp);
// The CmId is going: its connection ends (DREQ, or REJ for an unanswered request), its
// listener stops, and the agent's later events about it are dropped.
void release(CmIdImpl& id);

// Inputs from the device.
void on_agent_event(RoceDevice& device, RocePort& port, core::ibcm::IbCmAgentEvent& event);
void on_qp_error(RoceDevice& device, QueuePairImpl& qp, const core::roce::RcEvent& event);

}  // namespace peercm::detail::roce
