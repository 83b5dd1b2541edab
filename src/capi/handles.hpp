// The handle structs behind the C API. Each C struct (ibv_qp, rdma_cm_id, ...) is the first
// member of a standard-layout shell whose second member points at the C++ state, so a C
// pointer converts back to its shell without any lookup. The states own the C++ objects and
// count who depends on them, because verbs lets the application destroy things in any order
// and answers EBUSY (or waits for acks) where rdma-core does.
#pragma once

#include <netinet/in.h>

#include <atomic>
#include <cstddef>
#include <cerrno>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <system_error>
#include <thread>
#include <type_traits>
#include <vector>

#include "peercm/cm.hpp"
#include "peercm/verbs.hpp"

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wold-style-cast"
#pragma GCC diagnostic ignored "-Wsign-conversion"
#pragma GCC diagnostic ignored "-Wconversion"
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>
#pragma GCC diagnostic pop

namespace peercm::capi {

template <class C, class S>
struct Shell {
  C pub;
  S* state;
};

template <class S, class C>
S* state_of(C* pub) {
  static_assert(std::is_standard_layout_v<Shell<C, S>>);
  return reinterpret_cast<Shell<C, S>*>(pub)->state;
}

// verbs convention: 0 or a positive errno value.
inline int errno_of(std::errc error) { return static_cast<int>(error); }
// rdma_cm convention: 0, or -1 with errno set.
inline int fail_errno(int error) {
  errno = error;
  return -1;
}
inline int fail_errno(std::errc error) { return fail_errno(errno_of(error)); }

// rdma-core's channel fds start blocking, and an application that wants ibv_get_cq_event() or
// rdma_get_cm_event() not to block sets O_NONBLOCK on them: the flag is how it says so.
void make_blocking(int fd);
bool nonblocking(int fd);

// What the device reports, and the bounds create calls are checked against.
inline constexpr int kMaxQpWr = 16384;
inline constexpr int kMaxSge = 16;
inline constexpr std::uint32_t kMaxInline = 4096;
inline constexpr std::uint32_t kDefaultInline = 256;
inline constexpr int kMaxCqe = 1 << 22;
inline constexpr std::uint8_t kMaxRdAtom = 16;  // IRD and ORD
inline constexpr int kMaxSrq = 1 << 16;
inline constexpr int kMaxSrqWr = kMaxQpWr;

struct PdState;

// The devices, one per transport (docs/c-api.md "The devices").
inline constexpr const char* kIwarpDeviceName = "peercm_iw0";
inline constexpr const char* kRoceDeviceName = "peercm_roce0";
inline constexpr int kRoceGidTableLength = 16;
// PEERCM_TRANSPORT=roce: RoCEv2; unset or anything else: iWARP. The transport of new rdma_cm
// ids (read per id, so a program or test may switch it between ids) and the device listed first.
Transport default_transport();

// An opened device (ibv_context). `refs` counts the opener and every object made on it.
struct ContextState {
  std::unique_ptr<Context> cpp;
  Transport transport = Transport::iwarp;  // the device's
  std::atomic<int> refs{1};
  ibv_pd* default_pd = nullptr;   // rdma_cm's per-device PD (ids given no PD); guarded by the CM lock
};
// A context is the `context` member of a verbs_context, whose table of extended verbs code
// built against rdma-core's headers calls through (the drop-in libibverbs, docs/drop-in.md);
// the state follows the table.
struct ContextShell {
  verbs_context ext;
  ContextState* state;
};
inline ContextShell* shell_of(ibv_context* pub) {
  static_assert(std::is_standard_layout_v<ContextShell>);
  static_assert(offsetof(verbs_context, context) + sizeof(ibv_context) == sizeof(verbs_context));
  auto* bytes = reinterpret_cast<unsigned char*>(pub) - offsetof(verbs_context, context);
  return reinterpret_cast<ContextShell*>(bytes);
}
template <>
inline ContextState* state_of<ContextState, ibv_context>(ibv_context* pub) {
  return shell_of(pub)->state;
}

ibv_context* open_context(Transport transport);
// rdma_core_abi.cpp: the table of extended verbs and the marker that says it is there.
void fill_extended_ops(verbs_context& ext);
Transport transport_of(ibv_context* context);
void retain(ibv_context* context);
void release(ibv_context* context);
Context& cpp_context(ibv_context* context);

// The context of `transport`'s device that rdma_cm ids of that transport share: opened with
// the first, kept until the process exits (as librdmacm keeps its devices open), so the PD,
// CQs and QPs an application made on `id->verbs` outlive any id. Null (errno set) if it
// cannot be opened.
ibv_context* cm_context(Transport transport);
ibv_pd* cm_default_pd(ibv_context* context);

struct PdState {
  std::unique_ptr<ProtectionDomain> cpp;
  std::atomic<int> users{0};  // MRs and QPs
  bool orphaned = false;      // a default PD left in use at exit: freed by its last user
};
using PdShell = Shell<ibv_pd, PdState>;
void release_pd_user(ibv_pd* pd);

struct MrState {
  std::unique_ptr<MemoryRegion> cpp;
};
using MrShell = Shell<ibv_mr, MrState>;

struct CompChannelState {
  std::unique_ptr<CompletionChannel> cpp;
};
using CompChannelShell = Shell<ibv_comp_channel, CompChannelState>;

struct CqState {
  std::unique_ptr<CompletionQueue> cpp;
  std::atomic<int> qps{0};
  std::mutex mutex;  // events_reported / events_acked
  std::condition_variable acked;
  std::uint64_t events_reported = 0;
  std::uint64_t events_acked = 0;
  // ibv_create_cq_ex's poll: the completion between ibv_start_poll and ibv_end_poll.
  WorkCompletion current{};
};
// Every CQ is allocated as an ibv_cq_ex (whose first members are ibv_cq's), so one made by
// ibv_create_cq_ex and seen through ibv_cq_ex_to_cq finds its state like any other.
struct CqShell {
  union {
    ibv_cq pub;
    ibv_cq_ex ex;
  };
  CqState* state;
};
template <>
inline CqState* state_of<CqState, ibv_cq>(ibv_cq* pub) {
  static_assert(std::is_standard_layout_v<CqShell>);
  return reinterpret_cast<CqShell*>(pub)->state;
}

// A shared receive queue. The QPs made with it are counted by the C++ SRQ itself
// (ibv_destroy_srq's EBUSY).
struct SrqState {
  std::unique_ptr<SharedReceiveQueue> cpp;
};
using SrqShell = Shell<ibv_srq, SrqState>;

struct IdState;

// modify_qp to RTR without the CM over RoCE: the path RTR connected the RC QP's responder
// with, kept until RTS starts its requester (verbs_roce.cpp).
struct PendingRtr {
  std::uint32_t local = 0;   // host order, the source GID's address
  std::uint32_t remote = 0;  // host order, the destination GID's address
  std::uint32_t remote_qpn = 0;
  std::uint32_t rq_psn = 0;
  std::uint32_t path_mtu = 1024;  // bytes
  std::uint8_t max_dest_rd_atomic = 1;
  std::uint8_t min_rnr_timer = 12;
};

struct QpHandleState {
  std::unique_ptr<QueuePair> cpp;
  std::optional<PendingRtr> rtr;  // RoCE RC QPs connected by modify_qp
  rdma_cm_id* id = nullptr;  // the rdma_cm id it is attached to (rdma_create_qp)
  ibv_qp_state recorded = IBV_QPS_RESET;  // modify_qp's target before the connection runs it
  ibv_qp_cap caps{};
  int sq_sig_all = 0;
  // ibv_create_qp_ex with send_ops_flags: the ibv_wr_* batch between wr_start and
  // wr_complete (verbs_ex.cpp). `batch_error` is the first failure of a builder.
  std::uint64_t send_ops = 0;
  bool extended = false;
  bool building = false;
  int batch_error = 0;
  std::vector<SendWr> batch;
  std::deque<std::vector<std::uint8_t>> inline_copies;  // the bytes of inline WRs until posted
};
// Every QP is allocated as an ibv_qp_ex (whose first member is the ibv_qp) for the same
// reason as CQs.
struct QpShell {
  union {
    ibv_qp pub;
    ibv_qp_ex ex;
  };
  QpHandleState* state;
};
template <>
inline QpHandleState* state_of<QpHandleState, ibv_qp>(ibv_qp* pub) {
  static_assert(std::is_standard_layout_v<QpShell>);
  return reinterpret_cast<QpShell*>(pub)->state;
}

struct EventChannelState {
  std::unique_ptr<EventChannel> cpp;
  // The thread that last called rdma_get_cm_event() on the channel.
  std::atomic<std::thread::id> consumer{};
};
using EventChannelShell = Shell<rdma_event_channel, EventChannelState>;

struct IdState {
  std::unique_ptr<CmId> cpp;
  ibv_context* context = nullptr;  // the CM device context (exposed as verbs once bound)
  bool sync = false;               // made with no channel: owns its private channel
  int peer_to_peer = -1;           // RDMA_OPTION_ID_PEER_TO_PEER: -1 unset, 0, 1
  // Events handed to the application and not acked yet (rdma_destroy_id waits for them).
  std::mutex mutex;
  std::condition_variable events_done;
  int events_out = 0;
  // CONNECT_REQUEST resources as the peer sees them: rdma_accept(NULL) answers with them.
  std::uint8_t request_responder_resources = kMaxRdAtom;
  std::uint8_t request_initiator_depth = kMaxRdAtom;
  // rdma_create_ep on a passive id: the QP every rdma_get_request() child gets.
  std::unique_ptr<ibv_qp_init_attr> child_qp_attr;
  ibv_pd* child_pd = nullptr;
};
using IdShell = Shell<rdma_cm_id, IdState>;

// An event handed to the application: the C struct and the bytes it points at.
struct EventState {
  std::vector<std::uint8_t> private_data;
  rdma_cm_id* counted = nullptr;  // whose events_out this event is counted in
};
using EventShell = Shell<rdma_cm_event, EventState>;

// cm_api.cpp, for the synchronous calls and rdma_create_qp.
rdma_cm_id* id_of(CmId* cpp);
// A synchronous id's wait for the next event of its own channel (librdmacm's "complete").
int sync_complete(rdma_cm_id* id);
void fill_route(rdma_cm_id* id);

// verbs_api.cpp, for ibv_poll_cq and the extended CQ's poll: counts a poll that found the
// CQ empty (and resets the count on one that did not). Programs busy-poll their CQs, and with
// progress threads every completion is made by one: each 64th empty poll in a row yields the
// CPU to it, as peercm's own tools do, so that a poller spinning on a small or busy machine
// does not keep it from running.
void note_poll(ibv_cq* cq, bool found);

// verbs_api.cpp, for rdma_create_qp and rdma_destroy_id.
void detach_from_id(ibv_qp* qp);
// verbs_api.cpp, for the extended CQ's poll (verbs_ex.cpp).
ibv_wc to_ibv_wc(const WorkCompletion& in);
// verbs_ex.cpp, for ibv_create_qp_ex and rdma_create_qp_ex: whether the context's QPs can
// offer these ibv_wr_* operations, and turning a new QP into an ibv_qp_ex offering them.
bool send_ops_supported(ibv_context* context, std::uint64_t send_ops);
void make_qp_extended(ibv_qp* qp, std::uint64_t send_ops);

// verbs_roce.cpp: verbs without the CM over RoCE (docs/c-api.md, "RoCE without the CM").
// The context runs RoCEv2 (a non-iWARP device, or PEERCM_TRANSPORT=roce), else iWARP.
bool uses_roce(ibv_context* context);
// ibv_query_gid of a RoCE context: index 0 its own 127/8 address, then the host's
// interface addresses, each as ::ffff:a.b.c.d. 0, or -1 past the table's end.
int roce_query_gid(ibv_context* context, int index, ibv_gid* gid);
// ibv_modify_qp for what the CM does not drive: every change of a UD or UC QP, and an RC QP's
// RTR with an address vector and RTS after it. nullopt leaves the call to ibv_modify_qp.
std::optional<int> modify_qp_without_cm(ibv_qp* qp, const ibv_qp_attr& attr, int attr_mask);
// ibv_create_qp IBV_QPT_UD on a RoCE context: the QP becomes a UD QP.
int make_ud_qp(ibv_qp* qp);
// ibv_create_qp IBV_QPT_UC on a RoCE context: the QP becomes a UC QP.
int make_uc_qp(ibv_qp* qp);
int post_ud_send(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad_wr);
std::uint32_t ud_qkey(ibv_qp* qp);
// convert_send's SGE part, shared with the UD path (verbs_api.cpp).
Status<std::errc> convert_sge_list(const ibv_sge* list, int count, SgeList& out);

}  // namespace peercm::capi
