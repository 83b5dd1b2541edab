// Posted receive WRs in the order they were posted: a queue pair's own receive queue, or a
// shared receive queue several queue pairs of one context draw from. The queue-pair engine
// finds the receive of an untagged Send here (RFC 5040 §5.3) and does not care which it is.
// It is plain data: whoever owns it serialises its users (the context lock).
#pragma once

#include <cstdint>
#include <optional>

#include "core/memory_table.hpp"
#include "core/ring_deque.hpp"
#include "peercm/verbs_types.hpp"

namespace peercm::core {

struct PostedRecv {
  RecvWr wr;
  std::uint64_t capacity = 0;     // sum of the SGE lengths
  std::optional<WcStatus> error;  // set when the WR failed its local checks at post time
};

// The receive as posted: its capacity, and whether every SGE names memory of `pd` this
// side may write (verbs checks the lkeys of a receive at post time, or at placement).
inline void check_posted_recv(PostedRecv& posted, const MemoryTable& memory, std::uint32_t pd) {
  for (const Sge& sge : posted.wr.sg_list) {
    posted.capacity += sge.length;
    if (!posted.error && !memory.check_local(sge, pd, true)) posted.error = WcStatus::local_protection_error;
  }
}
inline PostedRecv make_posted_recv(const RecvWr& wr, const MemoryTable& memory, std::uint32_t pd) {
  PostedRecv posted{.wr = wr};
  check_posted_recv(posted, memory, pd);
  return posted;
}

class ReceiveQueue {
 public:
  void push(PostedRecv posted) { entries_.push_back(std::move(posted)); }
  // make_posted_recv() and push() in one, built where it stays: the WR is copied once.
  const PostedRecv& post(const RecvWr& wr, const MemoryTable& memory, std::uint32_t pd) {
    PostedRecv& posted = entries_.emplace_back(wr);
    check_posted_recv(posted, memory, pd);
    return posted;
  }
  // The WR the next Send consumes; null when none is posted.
  const PostedRecv* next() const { return entries_.empty() ? nullptr : &entries_.front(); }
  // Removes next(): from here on the WR belongs to the message that took it, whichever
  // queue pair that is.
  PostedRecv take() {
    PostedRecv posted = std::move(entries_.front());
    entries_.pop_front();
    return posted;
  }
  std::size_t size() const { return entries_.size(); }
  bool empty() const { return entries_.empty(); }

 private:
  RingDeque<PostedRecv> entries_;
};

// What a QP entering ERROR still holds of its receives completes with IBV_WC_WR_FLUSH_ERR
// (verbs): the one a message in progress took, then its queue in posting order. `push`
// takes each completion to the QP's receive CQ.
template <typename Push>
void flush_receives(std::optional<PostedRecv>& taken, ReceiveQueue& queue, std::uint32_t qp_num, Push&& push) {
  const auto flushed = [&](const PostedRecv& posted) {
    push(WorkCompletion{
        .wr_id = posted.wr.wr_id, .status = WcStatus::wr_flush_error, .opcode = WcOpcode::recv, .qp_num = qp_num});
  };
  if (taken) {
    flushed(*taken);
    taken.reset();
  }
  while (!queue.empty()) flushed(queue.take());
}

}  // namespace peercm::core
