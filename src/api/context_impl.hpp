// Shared state of one device context: the lock that serialises every protocol core of the
// context, the reactor that drives its sockets, and its memory table.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "core/memory_table.hpp"
#include "core/permutation24.hpp"
#include "engine/reactor.hpp"
#include "engine/tcp_mss.hpp"
#include "peercm/cm.hpp"
#include "peercm/verbs.hpp"
#include "api/transport_cm.hpp"

namespace peercm::detail {

struct QueuePairImpl;
namespace roce {
class RoceDevice;
}

struct ContextImpl {
  explicit ContextImpl(const ContextOptions& options);
  ~ContextImpl();

  std::uint32_t next_pd() { return ++pd_counter; }
  // QP numbers: a counter through the context's keyed permutation of the 24-bit QPN space,
  // skipping the numbers InfiniBand reserves (0 and 1 are the SMI and GSI, and RoCE's CM
  // runs on QP1; 0xFFFFFF is multicast). They repeat only after 2^24 QPs, and follow no
  // order a peer could extrapolate from the ones it saw (docs/reliability.md, "Numbers a
  // peer can see"). A RoCE QP's number is its wire QPN, as with any RoCE device, so
  // qp_num(), work completions and the peer's ConnParam::qp_num all agree.
  // A context that owns a RoCE slot (api/roce/address_share.hpp) numbers its QPs within the
  // slot: the slot in the top 7 bits, a counter through a keyed permutation of the other 17
  // below (the same rule, 2^17 numbers per context), so that a datagram reaching another
  // process on a shared address finds its way here.
  std::uint32_t next_qp_num();
  // Claims a RoCE slot once, the first time RoCE is used (a RoCE CmId, a RoCE device of the C
  // API). QPs numbered before have no slot in their number. Called under the lock or before
  // the context is shared.
  void want_roce_slot();
  int roce_slot() const { return roce_slot_.load(std::memory_order_acquire); }
  int roce_slot_fd() const { return roce_slot_fd_; }
  std::uint32_t next_cmid() { return ++cmid_counter; }
  // Inline mode: run the reactor once on the caller's thread.
  void progress(std::chrono::milliseconds max_wait);
  // One non-blocking reactor pass on the caller's thread, with `lock` (unlocked, on `mutex`)
  // taken here and left held, so that a completion queue poll takes what the pass completed
  // without locking again. Inline mode waits for the lock. Thread mode: a polling
  // application thread runs the pass itself only when the lock is free, instead of waiting
  // for the progress thread to wake up; either way its activity keeps the progress thread
  // parked (docs/progress.md). `lock` stays unowned when the mutex was taken.
  void poll_pass(std::unique_lock<std::mutex>& lock);
  // Thread mode: sleeps until `fd` is readable or `max_wait` passes, as the reactor's driver
  // (Reactor::wait_as_driver), so that a socket event costs this thread one wake-up rather
  // than waking the progress thread, which then wakes this one. Sleeps on `fd` alone, and
  // hands the reactor back to the progress thread, while that thread is at work.
  void wait_as_poller(int fd, std::chrono::milliseconds max_wait);
  // Longest sleep of wait_as_poller() before it looks at the clock and the timers again.
  static constexpr std::chrono::milliseconds kMaxPollerSlice{100};

  std::mutex mutex;  // guards everything below and every core of this context
  engine::Reactor reactor{mutex};
  core::MemoryTable memory;
  // memory.remote_writes_landed() when the application last posted an RDMA Write: a peer's
  // Write landed since answers it (CompletionQueue::poll, docs/progress.md hand-over 7).
  // Written under the mutex, read by a CQ poll that may not hold it.
  std::atomic<std::uint64_t> landed_at_last_write_post{0};
  std::uint64_t node_guid;
  std::uint64_t incarnation;
  ProgressMode mode;
  std::chrono::milliseconds timewait;
  CmStats stats;
  std::unique_ptr<std::uint8_t[]> receive_scratch;  // shared by the context's connections
  engine::EmssCache emss_cache;                    // sizes the connections' FPDUs
  // The connection managers of the transports (transport_cm()), made on first use.
  std::array<std::unique_ptr<TransportCm>, 2> cms;
  // QPs made without a CmId (QueuePair::create), by number: rdma_cm's conn_param.qp_num.
  std::unordered_map<std::uint32_t, std::weak_ptr<QueuePairImpl>> standalone_qps;
  // Atomic: application threads create objects without the lock while the progress thread
  // creates ids for incoming requests.
  std::atomic<std::uint32_t> pd_counter = 0;
  std::atomic<std::uint32_t> qp_counter = 0;
  std::atomic<std::uint32_t> cmid_counter = 0;
  core::Permutation24 qp_numbers;
  core::KeyedPermutation<9> slot_qp_numbers;  // 18 bits, cycle-walked down to 17
  RoceOptions roce_options;
  // The RoCE transport's sockets, agents and QP table, made by the first RoCE CmId.
  std::unique_ptr<roce::RoceDevice> roce;

 private:
  std::atomic<int> roce_slot_ = -1;
  int roce_slot_fd_ = -1;
  bool roce_slot_tried_ = false;
};

}  // namespace peercm::detail
