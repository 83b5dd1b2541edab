// A completion queue: a bounded ring the queue-pair engines push into (under the context
// lock) and the application polls. Overrun is reported, never written past.
#pragma once

#include <atomic>
#include <memory>
#include <vector>

#include "api/context_impl.hpp"
#include "core/queue_pair_engine.hpp"

namespace peercm::detail {

struct CompletionChannelImpl {
  CompletionChannelImpl();
  ~CompletionChannelImpl();
  void notify(CompletionQueue* cq);  // called with the context lock held
  void forget(CompletionQueue* cq);  // a CQ going away: drops its queued notifications

  int event_fd = -1;
  std::mutex mutex;  // after the context lock in lock order
  std::vector<CompletionQueue*> ready;
  std::shared_ptr<ContextImpl> context;
};

struct CompletionQueueImpl final : core::CompletionSink {
  CompletionQueueImpl(std::shared_ptr<ContextImpl> ctx, std::uint32_t capacity, CompletionChannelImpl* channel);

  bool push(const WorkCompletion& completion) override;
  void solicited() override;
  // Removes the completions of QP `qp_num` that the application has not polled, keeping the
  // others in order; counts what went in `removed` and, of those, the successful ones in
  // `successful`. Called with the context lock held, as the QP is destroyed
  // (QueuePair::~QueuePair).
  void discard_qp(std::uint32_t qp_num, std::size_t& removed, std::size_t& successful);

  std::shared_ptr<ContextImpl> context;
  std::vector<WorkCompletion> ring;
  std::size_t head = 0;
  std::atomic<std::size_t> count{0};  // read without the lock by poll's fast path
  std::atomic<bool> overrun{false};
  CompletionChannelImpl* channel;
  CompletionQueue* owner = nullptr;
  enum class Arm : std::uint8_t { none, next, solicited } arm = Arm::none;
  std::uint64_t acked = 0;
};

}  // namespace peercm::detail
