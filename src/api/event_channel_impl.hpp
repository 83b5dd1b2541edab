// The queue behind an EventChannel: CM events pushed by the contexts (under their lock),
// taken by the application; an eventfd makes it pollable.
#pragma once

#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "peercm/cm.hpp"

namespace peercm::detail {

struct ContextImpl;

struct EventChannelImpl {
  EventChannelImpl();
  ~EventChannelImpl();
  void push(CmEvent event);
  // Removes every queued event about `id` (an id being destroyed), so no event carries a
  // dangling id; the caller destroys them after releasing any context lock.
  std::vector<CmEvent> purge(CmId* id);
  // Whether events about `id` wait in the queue (not fetched yet).
  bool holds_events_for(const CmId* id);
  // Takes back a CONNECT_REQUEST for `id` that the application has not fetched yet.
  std::optional<CmEvent> retract_request(CmId* id);
  // Inline progress: contexts whose ids report here are driven by get_event().
  void attach(const std::shared_ptr<ContextImpl>& context);
  void drain_if_empty();  // with `mutex` held

  int event_fd = -1;
  std::mutex mutex;  // after any context lock in lock order
  std::deque<CmEvent> events;
  std::vector<std::weak_ptr<ContextImpl>> inline_contexts;
};

}  // namespace peercm::detail
