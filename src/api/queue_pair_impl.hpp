// A queue pair: the RDMAP/DDP engine (or, over RoCE, the RC core) plus the completion queues it reports to, and a hook
// to the connection that carries it once the CM has bound one.
#pragma once

#include <functional>
#include <memory>

#include "api/completion_queue_impl.hpp"
#include "api/context_impl.hpp"
#include "api/shared_receive_queue_impl.hpp"
#include "api/roce/roce_qp.hpp"
#include "core/queue_pair_engine.hpp"

namespace peercm::detail {

struct QueuePairImpl {
  QueuePairImpl(std::shared_ptr<ContextImpl> ctx, std::uint32_t pd, const QpInitAttr& attr);

  std::shared_ptr<ContextImpl> context;
  std::shared_ptr<CompletionQueueImpl> send_cq;
  std::shared_ptr<CompletionQueueImpl> recv_cq;
  // The SRQ the engine takes receives from, until the QueuePair goes (then null).
  std::shared_ptr<SharedReceiveQueueImpl> srq;
  QpCaps caps;
  std::uint32_t pd;
  bool signal_all;  // sq_sig_all
  std::uint32_t qp_num;
  // The iWARP RDMAP/DDP engine. A QP made on its own keeps its receives here until a transport
  // takes it; a RoCE QP drops it once its RC, UD or UC core runs (drop_idle_engine()), so it is
  // null exactly when one of those is set.
  std::unique_ptr<core::QueuePairEngine> engine;
  void drop_idle_engine() { engine.reset(); }
  // A QP of a RoCE CmId (or connected by modify_qp) runs on this RC core.
  std::unique_ptr<roce::RoceQp> roce;
  // A UD QP of a RoCE context (ibv_create_qp IBV_QPT_UD) runs on this core instead.
  std::unique_ptr<roce::RoceUdQp> roce_ud;
  // A UC QP of a RoCE context (ibv_create_qp IBV_QPT_UC) runs on this core instead.
  std::unique_ptr<roce::RoceUcQp> roce_uc;
  // Set by the connection carrying this QP: pushes pending bytes to the socket.
  // Called with the context lock held.
  std::function<void()> kick_transmit;
  // Set with kick_transmit by an iWARP connection: writes a WR the engine can frame at once
  // (QueuePairEngine::frame_direct) and returns true, or returns false for post_send().
  std::function<bool(const SendWr&)> send_direct;
  // A QP of its own (QueuePair::create) carries at most one connection in its life.
  bool standalone = false;
  bool claimed = false;
};

}  // namespace peercm::detail
