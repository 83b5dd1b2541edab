// The verbs API: device context, protection domain, memory regions, completion queues and
// RC queue pairs. Semantics follow libibverbs; ownership is RAII.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <system_error>

#include "peercm/result.hpp"
#include "peercm/verbs_types.hpp"

namespace peercm {

namespace detail {
struct ContextImpl;
struct CompletionQueueImpl;
struct CompletionChannelImpl;
struct QueuePairImpl;
struct SharedReceiveQueueImpl;
}  // namespace detail

enum class ProgressMode : std::uint8_t {
  thread,  // a progress thread per context drives the sockets, as RDMA hardware would
  inline_, // the application's poll/get_event calls drive progress (lowest latency)
};

// Test hook of the RoCE transport: faults applied to every UDP datagram this context sends
// (CM MADs and RC packets alike), as a lossy network between two contexts would. Each
// datagram is dropped with probability `drop`, else sent twice with `duplicate`, else held
// back with `reorder` and sent right after the next one. Zero everywhere: a clean wire.
struct RoceFaults {
  double drop = 0;
  double duplicate = 0;
  double reorder = 0;
  std::uint64_t seed = 0;  // of the context's fault generator; the same seed, the same choices
};

// The RoCE transport's settings of a context (docs/roce-transport.md).
struct RoceOptions {
  // IB CM timer exponents, 4.096 us * 2^n; the defaults are Linux rdma_cm's (about 268 ms
  // packet lifetime, 4.3 s response timeout, 15 retries). Tests shorten them.
  std::uint8_t cm_packet_lifetime = 16;
  std::uint8_t cm_response_timeout = 20;
  std::uint8_t cm_max_retries = 15;
  // Consecutive datagrams of one size to one loopback destination leave as one UDP GSO send
  // (docs/roce-transport.md). A packet capture on lo sees such a send as one large frame;
  // turn this off to capture one frame per RoCE packet.
  bool coalesce = true;
  // How long an RC responder may hold the ACK a message asked for, waiting for the reply it
  // then leaves with in one batch; only while the traffic alternates (docs/roce-transport.md).
  // Zero: every ACK leaves at once.
  std::chrono::microseconds ack_delay{50};
  // Keepalive of connections the CM made: after this long without a packet from the peer,
  // an idle RC QP probes it every local ACK timeout, and retry_cnt + 1 unanswered probes end
  // the connection (DISCONNECTED; the QP's work flushes). A dead peer is noticed within this
  // interval + 8 x 67 ms with the CM's defaults (docs/roce-transport.md, "Dead peers").
  // Zero: none, as RC hardware. QPs connected by modify_qp have none either: without a CM
  // nobody would be told.
  std::chrono::milliseconds keepalive_interval{2000};
  RoceFaults faults;
};

struct ContextOptions {
  std::uint64_t node_guid = 0;  // 0: random
  ProgressMode progress = ProgressMode::thread;
  // How long after a connection's socket closed its CmId reports TIMEWAIT_EXIT. rdma_cm
  // reports it after the QP's timewait; programs commonly destroy the id right after
  // disconnecting, and an event queued at that moment would be purged with the id after a
  // poll() had already seen the channel readable (rdma_get_cm_event would then block).
  std::chrono::milliseconds timewait{200};
  // The process's descriptor table is grown to hold this many descriptors when the context
  // opens (capped by RLIMIT_NOFILE; 0 leaves it alone). Linux grows it by doubling, and in
  // a multi-threaded process each growth waits for an RCU grace period, which a burst of
  // connections would otherwise pay in the middle of its setup (docs/performance.md).
  int reserved_descriptors = 4096;
  RoceOptions roce;
};

// One opened software iWARP device (a "node" of design.md §3).
class Context {
 public:
  static Result<std::unique_ptr<Context>, std::errc> open(const ContextOptions& options = {});
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  std::uint64_t node_guid() const;
  std::uint64_t incarnation() const;
  ProgressMode progress_mode() const;
  // Runs the I/O engine once, waiting at most `max_wait` (inline mode; harmless otherwise).
  void progress(std::chrono::milliseconds max_wait = std::chrono::milliseconds(0));

  detail::ContextImpl& impl() { return *impl_; }
  std::shared_ptr<detail::ContextImpl> impl_shared() const { return impl_; }

 private:
  explicit Context(std::shared_ptr<detail::ContextImpl> impl);
  std::shared_ptr<detail::ContextImpl> impl_;
};

class ProtectionDomain {
 public:
  static Result<std::unique_ptr<ProtectionDomain>, std::errc> allocate(Context& context);
  ~ProtectionDomain();
  ProtectionDomain(const ProtectionDomain&) = delete;
  ProtectionDomain& operator=(const ProtectionDomain&) = delete;

  Context& context() const { return context_; }
  std::uint32_t handle() const { return handle_; }

 private:
  ProtectionDomain(Context& context, std::uint32_t handle) : context_(context), handle_(handle) {}
  Context& context_;
  std::uint32_t handle_;
};

// Registered memory. lkey == rkey: a 24-bit index and a random 8-bit key (an STag).
class MemoryRegion {
 public:
  // `access` is a combination of Access flags.
  static Result<std::unique_ptr<MemoryRegion>, std::errc> register_memory(ProtectionDomain& pd, void* addr,
                                                                          std::size_t length, std::uint32_t access);
  ~MemoryRegion();  // deregisters
  MemoryRegion(const MemoryRegion&) = delete;
  MemoryRegion& operator=(const MemoryRegion&) = delete;

  void* addr() const { return addr_; }
  std::size_t length() const { return length_; }
  std::uint32_t lkey() const { return stag_; }
  std::uint32_t rkey() const { return stag_; }
  std::uint32_t access() const { return access_; }
  // An SGE covering [offset, offset+length) of this region.
  Sge sge(std::size_t offset, std::size_t length) const;
  Sge sge() const { return sge(0, length_); }

 private:
  MemoryRegion(ProtectionDomain& pd, void* addr, std::size_t length, std::uint32_t access, std::uint32_t stag)
      : pd_(pd), addr_(addr), length_(length), access_(access), stag_(stag) {}
  ProtectionDomain& pd_;
  void* addr_;
  std::size_t length_;
  std::uint32_t access_;
  std::uint32_t stag_;
};

class CompletionQueue;

// A pollable fd that becomes readable when an armed CQ gets a completion (ibv_comp_channel).
class CompletionChannel {
 public:
  static Result<std::unique_ptr<CompletionChannel>, std::errc> create(Context& context);
  ~CompletionChannel();
  CompletionChannel(const CompletionChannel&) = delete;
  CompletionChannel& operator=(const CompletionChannel&) = delete;

  int fd() const;
  // Waits for the next notification (ibv_get_cq_event); ETIMEDOUT after `timeout`
  // (negative: forever). The CQ must be re-armed with request_notify().
  Result<CompletionQueue*, std::errc> get_event(std::chrono::milliseconds timeout = std::chrono::milliseconds(-1));
  void ack_events(CompletionQueue& cq, unsigned count);

  detail::CompletionChannelImpl& impl() { return *impl_; }

 private:
  explicit CompletionChannel(Context& context);
  Context& context_;
  std::shared_ptr<detail::CompletionChannelImpl> impl_;
};

class CompletionQueue {
 public:
  static Result<std::unique_ptr<CompletionQueue>, std::errc> create(Context& context, std::uint32_t capacity,
                                                                    CompletionChannel* channel = nullptr);
  ~CompletionQueue();
  CompletionQueue(const CompletionQueue&) = delete;
  CompletionQueue& operator=(const CompletionQueue&) = delete;

  // Moves up to out.size() completions into `out`; returns how many.
  std::size_t poll(std::span<WorkCompletion> out);
  // Arms the channel for the next completion (or only the next solicited one).
  Status<std::errc> request_notify(bool solicited_only = false);
  std::uint32_t capacity() const;
  // True once a completion could not be queued; the affected QPs went to ERROR.
  bool overrun() const;
  std::uint64_t events_acked() const;
  Context& context() const { return context_; }

  detail::CompletionQueueImpl& impl() { return *impl_; }
  std::shared_ptr<detail::CompletionQueueImpl> impl_shared() const { return impl_; }

 private:
  CompletionQueue(Context& context, std::shared_ptr<detail::CompletionQueueImpl> impl);
  Context& context_;
  std::shared_ptr<detail::CompletionQueueImpl> impl_;
};

// A shared receive queue (ibv_srq): receive WRs that the QPs made with it take, in the
// order posted, for the untagged Sends they receive. It serves QPs of its own context only.
class SharedReceiveQueue {
 public:
  // EINVAL for a max_wr of 0. attr.srq_limit is not applied (ibv_create_srq ignores it
  // too): modify() sets the limit.
  static Result<std::unique_ptr<SharedReceiveQueue>, std::errc> create(ProtectionDomain& pd, const SrqAttr& attr);
  // ibv_destroy_srq: EBUSY while a QP made with it exists, and `srq` stays; else resets
  // `srq`. Plain destruction while QPs use it leaves the queue, WRs and all, to those QPs
  // until they go.
  static Status<std::errc> destroy(std::unique_ptr<SharedReceiveQueue>& srq);
  ~SharedReceiveQueue();
  SharedReceiveQueue(const SharedReceiveQueue&) = delete;
  SharedReceiveQueue& operator=(const SharedReceiveQueue&) = delete;

  // EINVAL for more SGEs than max_sge or an SGE that is not local-write memory of the PD
  // (checked now: the WR names no QP whose stream an error could end), ENOMEM when max_wr
  // WRs wait. A WR stays here until a QP's Send takes it; a QP's error never flushes it.
  Status<std::errc> post_recv(const RecvWr& wr);
  // Sets srq_limit (EINVAL above max_wr). No IBV_EVENT_SRQ_LIMIT_REACHED follows: the
  // stack has no asynchronous events.
  Status<std::errc> modify(std::uint32_t srq_limit);
  SrqAttr query() const;
  std::size_t posted() const;  // WRs waiting for a Send
  ProtectionDomain& pd() const { return pd_; }

  detail::SharedReceiveQueueImpl& impl() { return *impl_; }
  std::shared_ptr<detail::SharedReceiveQueueImpl> impl_shared() const { return impl_; }

 private:
  SharedReceiveQueue(ProtectionDomain& pd, std::shared_ptr<detail::SharedReceiveQueueImpl> impl);
  ProtectionDomain& pd_;
  std::shared_ptr<detail::SharedReceiveQueueImpl> impl_;
};

struct QpInitAttr {
  CompletionQueue* send_cq = nullptr;
  CompletionQueue* recv_cq = nullptr;
  // Receives come from this SRQ (same context); caps.max_recv_wr / max_recv_sge are then
  // unused and post_recv() is EINVAL.
  SharedReceiveQueue* srq = nullptr;
  QpCaps caps;
  bool sq_sig_all = true;
};

// An RC queue pair. Created through CmId::create_qp(), which binds it to a connection, or on
// its own (ibv_create_qp) and then attached to a CmId or named by number in a ConnParam.
class QueuePair {
 public:
  // A QP of no CmId yet; the context knows it by qp_num() until it is destroyed.
  static Result<std::unique_ptr<QueuePair>, std::errc> create(ProtectionDomain& pd, const QpInitAttr& attr);
  ~QueuePair();
  QueuePair(const QueuePair&) = delete;
  QueuePair& operator=(const QueuePair&) = delete;

  std::uint32_t qp_num() const;
  QpState state() const;
  const QpCaps& caps() const;
  // EINVAL for a malformed WR, ENOMEM when the queue is full. Work posted before the
  // connection is established waits for it. post_recv() is EINVAL on a QP with an SRQ.
  // Send / RDMA Write with Immediate are RoCE only: EINVAL on an iWARP QP (RFC 5040 has no
  // immediate data).
  Status<std::errc> post_send(const SendWr& wr);
  Status<std::errc> post_recv(const RecvWr& wr);
  // Moves the QP to ERROR: outstanding work completes with a flush error (of an SRQ's
  // WRs, only the one a message in progress had taken).
  void to_error();

  detail::QueuePairImpl& impl() { return *impl_; }

 private:
  friend class CmId;
  explicit QueuePair(std::shared_ptr<detail::QueuePairImpl> impl);
  std::shared_ptr<detail::QueuePairImpl> impl_;
};

}  // namespace peercm
