// Shared state of one device context: the lock that serialises every protocol core of the
// context, the reactor that drives its sockets, and its memory table.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "core/memory_table.hpp"
#include "engine/reactor.hpp"
#include "peercm/cm.hpp"
#include "peercm/verbs.hpp"
#include "api/p2p_driver.hpp"

namespace peercm::detail {

struct ContextImpl {
  explicit ContextImpl(const ContextOptions& options);
  ~ContextImpl();

  std::uint32_t next_pd() { return ++pd_counter; }
  std::uint32_t next_qp_num() { return ++qp_counter; }
  std::uint32_t next_cmid() { return ++cmid_counter; }
  // Inline mode: run the reactor once on the caller's thread.
  void progress(std::chrono::milliseconds max_wait);
  // Thread mode: a polling application thread may run one non-blocking reactor pass itself
  // when the lock is free, instead of waiting for the progress thread to wake up.
  void try_progress();

  std::mutex mutex;  // guards everything below and every core of this context
  engine::Reactor reactor{mutex};
  core::MemoryTable memory;
  std::uint64_t node_guid;
  std::uint64_t incarnation;
  ProgressMode mode;
  CmStats stats;
  std::vector<std::uint8_t> receive_scratch;  // shared by the context's connections
  std::uint16_t p2p_listen_port = 0;  // advertised in CM headers: the first listener's port
  std::unique_ptr<P2pDriver> p2p;
  std::uint32_t pd_counter = 0;
  std::uint32_t qp_counter = 0;
  std::uint32_t cmid_counter = 0;
};

}  // namespace peercm::detail
