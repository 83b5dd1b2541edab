// A shared receive queue: the posted WRs (a core::ReceiveQueue the engines of its QPs draw
// from under the context lock) and how many QueuePair objects were made with it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "api/context_impl.hpp"
#include "core/receive_queue.hpp"

namespace peercm::detail {

struct SharedReceiveQueueImpl {
  std::shared_ptr<ContextImpl> context;
  std::uint32_t pd = 0;
  SrqAttr attr;
  core::ReceiveQueue queue;  // guarded by the context lock
  // Counted up when a QueuePairImpl is made with this SRQ, down when its QueuePair goes
  // (the impl may live on in its connection, detached): ibv_destroy_srq's EBUSY.
  std::size_t qps = 0;
};

}  // namespace peercm::detail
