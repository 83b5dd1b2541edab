// The verbs of libibverbs over the C++ verbs API: protection domains, memory regions,
// completion channels and queues, RC queue pairs and work requests. Verbs that return an int
// give 0 or a positive errno value; those that return a pointer set errno.
#include <fcntl.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <unordered_map>

#include "capi/handles.hpp"
#include "engine/busy_poll.hpp"

namespace peercm::capi {
namespace {

std::atomic<std::uint32_t> g_mr_handles{0};
std::atomic<std::uint32_t> g_srq_handles{0};

// ibv_get_cq_event() learns a CompletionQueue*; this finds its ibv_cq.
struct CqRegistry {
  std::mutex mutex;
  std::unordered_map<const CompletionQueue*, ibv_cq*> cqs;
};
CqRegistry g_cqs;

template <class T>
T* fail_null(int error) {
  errno = error;
  return nullptr;
}

ibv_wc_status wc_status(WcStatus status) {
  switch (status) {
    case WcStatus::success: return IBV_WC_SUCCESS;
    case WcStatus::local_length_error: return IBV_WC_LOC_LEN_ERR;
    case WcStatus::local_qp_operation_error: return IBV_WC_LOC_QP_OP_ERR;
    case WcStatus::local_protection_error: return IBV_WC_LOC_PROT_ERR;
    case WcStatus::wr_flush_error: return IBV_WC_WR_FLUSH_ERR;
    case WcStatus::remote_invalid_request_error: return IBV_WC_REM_INV_REQ_ERR;
    case WcStatus::remote_access_error: return IBV_WC_REM_ACCESS_ERR;
    case WcStatus::remote_operation_error: return IBV_WC_REM_OP_ERR;
    case WcStatus::fatal_error: return IBV_WC_FATAL_ERR;
    case WcStatus::retry_exceeded: return IBV_WC_RETRY_EXC_ERR;
    case WcStatus::rnr_retry_exceeded: return IBV_WC_RNR_RETRY_EXC_ERR;
  }
  return IBV_WC_GENERAL_ERR;
}

ibv_wc_opcode wc_opcode(WcOpcode opcode) {
  switch (opcode) {
    case WcOpcode::send: return IBV_WC_SEND;
    case WcOpcode::rdma_write: return IBV_WC_RDMA_WRITE;
    case WcOpcode::rdma_read: return IBV_WC_RDMA_READ;
    case WcOpcode::recv: return IBV_WC_RECV;
    case WcOpcode::recv_rdma_with_imm: return IBV_WC_RECV_RDMA_WITH_IMM;
  }
  return IBV_WC_SEND;
}

}  // namespace

ibv_wc to_ibv_wc(const WorkCompletion& in) {
  ibv_wc out{};
  out.wr_id = in.wr_id;
  out.status = wc_status(in.status);
  out.opcode = wc_opcode(in.opcode);
  out.byte_len = in.byte_len;
  out.qp_num = in.qp_num;
  if (in.wc_flags & kWcWithInvalidate) {
    out.wc_flags |= IBV_WC_WITH_INV;
    out.invalidated_rkey = in.invalidated_rkey;
  }
  if (in.wc_flags & kWcWithImm) {
    out.wc_flags |= IBV_WC_WITH_IMM;
    out.imm_data = in.imm_data;  // network byte order on both sides
  }
  if (in.wc_flags & kWcGrh) out.wc_flags |= IBV_WC_GRH;
  out.src_qp = in.src_qp;
  return out;
}

namespace {

// The state the application sees: the connection's once it runs, else what modify_qp set.
ibv_qp_state effective_state(const QpHandleState& qp) {
  // RoCE: the responder runs from RTR; its RTS is still to come.
  if (qp.rtr && qp.rtr->remote != 0 && qp.cpp->state() != peercm::QpState::error) return IBV_QPS_RTR;
  switch (qp.cpp->state()) {
    case peercm::QpState::rts: return IBV_QPS_RTS;
    case peercm::QpState::error: return IBV_QPS_ERR;
    case peercm::QpState::reset:
    case peercm::QpState::init:
    case peercm::QpState::rtr: break;
  }
  return qp.recorded;
}

Status<std::errc> convert_sges(const ibv_sge* list, int count, SgeList& out) {
  if (count < 0 || count > kMaxSge || (count > 0 && !list)) return fail(std::errc::invalid_argument);
  out.clear();
  for (int i = 0; i < count; ++i) out.push_back(Sge{.addr = list[i].addr, .length = list[i].length, .lkey = list[i].lkey});
  return {};
}

Status<std::errc> convert_send(const ibv_send_wr& in, SendWr& out) {
  if (auto ok = convert_sges(in.sg_list, in.num_sge, out.sg_list); !ok) return ok;
  out.wr_id = in.wr_id;
  out.flags = in.send_flags & (IBV_SEND_FENCE | IBV_SEND_SIGNALED | IBV_SEND_SOLICITED | IBV_SEND_INLINE);
  out.remote_addr = 0;
  out.rkey = 0;
  out.invalidate_rkey = 0;
  out.imm_data = 0;
  switch (in.opcode) {
    case IBV_WR_SEND: out.opcode = WrOpcode::send; return {};
    case IBV_WR_SEND_WITH_IMM:
      out.opcode = WrOpcode::send_with_imm;
      out.imm_data = in.imm_data;  // __be32 on both sides
      return {};
    case IBV_WR_SEND_WITH_INV:
      out.opcode = WrOpcode::send_with_invalidate;
      out.invalidate_rkey = in.invalidate_rkey;
      return {};
    case IBV_WR_RDMA_WRITE_WITH_IMM:
      out.opcode = WrOpcode::rdma_write_with_imm;
      out.imm_data = in.imm_data;
      out.remote_addr = in.wr.rdma.remote_addr;
      out.rkey = in.wr.rdma.rkey;
      return {};
    case IBV_WR_RDMA_WRITE:
    case IBV_WR_RDMA_READ:
      out.opcode = in.opcode == IBV_WR_RDMA_WRITE ? WrOpcode::rdma_write : WrOpcode::rdma_read;
      out.remote_addr = in.wr.rdma.remote_addr;
      out.rkey = in.wr.rdma.rkey;
      return {};
    default:
      // No atomics, memory windows or TSO. (The immediate opcodes above pass on to the
      // QP, whose transport decides: an iWARP QP refuses them with EINVAL.)
      return fail(std::errc::invalid_argument);
  }
}

void release_cq_user(ibv_cq* cq) { state_of<CqState>(cq)->qps.fetch_sub(1); }

// Posts a chain of receive WRs to a QP or an SRQ; stops at the first failure (bad_wr).
template <class ReceiveQueue>
int post_recv_list(ReceiveQueue& queue, ibv_recv_wr* wr, ibv_recv_wr** bad_wr) {
  RecvWr converted;
  for (ibv_recv_wr* at = wr; at; at = at->next) {
    converted.wr_id = at->wr_id;
    auto ok = convert_sges(at->sg_list, at->num_sge, converted.sg_list);
    if (ok) ok = queue.post_recv(converted);
    if (!ok) {
      if (bad_wr) *bad_wr = at;
      return errno_of(ok.error());
    }
  }
  return 0;
}

}  // namespace

Status<std::errc> convert_sge_list(const ibv_sge* list, int count, SgeList& out) {
  return convert_sges(list, count, out);
}

void detach_from_id(ibv_qp* qp) {
  QpHandleState* state = state_of<QpHandleState>(qp);
  if (!state->id) return;
  state_of<IdState>(state->id)->cpp->detach_qp();
  if (state->id->qp == qp) state->id->qp = nullptr;
  state->id = nullptr;
}

}  // namespace peercm::capi

using namespace peercm;
using namespace peercm::capi;

// --- protection domains ---

ibv_pd* ibv_alloc_pd(ibv_context* context) {
  if (!context) return fail_null<ibv_pd>(EINVAL);
  auto pd = ProtectionDomain::allocate(cpp_context(context));
  if (!pd) return fail_null<ibv_pd>(errno_of(pd.error()));
  auto* shell = new PdShell{};
  shell->state = new PdState{};
  shell->state->cpp = std::move(*pd);
  shell->pub.context = context;
  shell->pub.handle = shell->state->cpp->handle();
  retain(context);
  return &shell->pub;
}

int ibv_dealloc_pd(ibv_pd* pd) {
  if (!pd) return EINVAL;
  PdState* state = state_of<PdState>(pd);
  if (state->users.load() > 0) return EBUSY;
  if (state_of<ContextState>(pd->context)->default_pd == pd) return EBUSY;  // rdma_cm's, not the application's
  ibv_context* context = pd->context;
  delete state;
  delete reinterpret_cast<PdShell*>(pd);
  release(context);
  return 0;
}

// --- memory regions ---

ibv_mr* ibv_reg_mr(ibv_pd* pd, void* addr, size_t length, int access) {
  if (!pd) return fail_null<ibv_mr>(EINVAL);
  const auto flags = static_cast<unsigned>(access);
  // verbs: remote write (or atomic) access needs local write access too.
  if ((flags & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) && !(flags & IBV_ACCESS_LOCAL_WRITE))
    return fail_null<ibv_mr>(EINVAL);
  if (flags & (IBV_ACCESS_ZERO_BASED | IBV_ACCESS_ON_DEMAND)) return fail_null<ibv_mr>(EOPNOTSUPP);
  const std::uint32_t rights = flags & (kAccessLocalWrite | kAccessRemoteWrite | kAccessRemoteRead);
  PdState* pd_state = state_of<PdState>(pd);
  auto mr = MemoryRegion::register_memory(*pd_state->cpp, addr, length, rights);
  if (!mr) return fail_null<ibv_mr>(errno_of(mr.error()));
  auto* shell = new MrShell{};
  shell->state = new MrState{};
  shell->state->cpp = std::move(*mr);
  ibv_mr& pub = shell->pub;
  pub.context = pd->context;
  pub.pd = pd;
  pub.addr = addr;
  pub.length = length;
  pub.handle = ++g_mr_handles;
  pub.lkey = shell->state->cpp->lkey();
  pub.rkey = shell->state->cpp->rkey();
  pd_state->users.fetch_add(1);
  return &pub;
}

int ibv_dereg_mr(ibv_mr* mr) {
  if (!mr) return EINVAL;
  ibv_pd* pd = mr->pd;
  delete state_of<MrState>(mr);  // deregisters: later remote accesses with its STag fail
  delete reinterpret_cast<MrShell*>(mr);
  release_pd_user(pd);
  return 0;
}

// --- completion channels ---

ibv_comp_channel* ibv_create_comp_channel(ibv_context* context) {
  if (!context) return fail_null<ibv_comp_channel>(EINVAL);
  auto channel = CompletionChannel::create(cpp_context(context));
  if (!channel) return fail_null<ibv_comp_channel>(errno_of(channel.error()));
  auto* shell = new CompChannelShell{};
  shell->state = new CompChannelState{};
  shell->state->cpp = std::move(*channel);
  shell->pub.context = context;
  shell->pub.fd = shell->state->cpp->fd();
  make_blocking(shell->pub.fd);
  shell->pub.refcnt = 0;
  retain(context);
  return &shell->pub;
}

int ibv_destroy_comp_channel(ibv_comp_channel* channel) {
  if (!channel) return EINVAL;
  if (__atomic_load_n(&channel->refcnt, __ATOMIC_ACQUIRE) > 0) return EBUSY;  // CQs still report to it
  ibv_context* context = channel->context;
  delete state_of<CompChannelState>(channel);
  delete reinterpret_cast<CompChannelShell*>(channel);
  release(context);
  return 0;
}

// --- completion queues ---

ibv_cq* ibv_create_cq(ibv_context* context, int cqe, void* cq_context, ibv_comp_channel* channel, int) {
  if (!context || cqe < 1 || cqe > kMaxCqe || (channel && channel->context != context))
    return fail_null<ibv_cq>(EINVAL);
  CompletionChannel* cpp_channel = channel ? state_of<CompChannelState>(channel)->cpp.get() : nullptr;
  auto cq = CompletionQueue::create(cpp_context(context), static_cast<std::uint32_t>(cqe), cpp_channel);
  if (!cq) return fail_null<ibv_cq>(errno_of(cq.error()));
  auto* shell = new CqShell{};
  std::memset(&shell->ex, 0, sizeof shell->ex);  // the extended part stays zero unless ibv_create_cq_ex fills it
  shell->state = new CqState{};
  shell->state->cpp = std::move(*cq);
  ibv_cq& pub = shell->pub;
  pub.context = context;
  pub.channel = channel;
  pub.cq_context = cq_context;
  pub.handle = 0;
  pub.cqe = cqe;
  pthread_mutex_init(&pub.mutex, nullptr);
  pthread_cond_init(&pub.cond, nullptr);
  if (channel) __atomic_add_fetch(&channel->refcnt, 1, __ATOMIC_ACQ_REL);
  retain(context);
  {
    std::lock_guard lock(g_cqs.mutex);
    g_cqs.cqs[shell->state->cpp.get()] = &pub;
  }
  return &pub;
}

int ibv_resize_cq(ibv_cq* cq, int cqe) {
  if (!cq || cqe < 1) return EINVAL;
  return cqe <= cq->cqe ? 0 : EOPNOTSUPP;  // a CQ keeps the capacity it was made with
}

int ibv_destroy_cq(ibv_cq* cq) {
  if (!cq) return EINVAL;
  CqState* state = state_of<CqState>(cq);
  if (state->qps.load() > 0) return EBUSY;
  {
    // verbs: every event ibv_get_cq_event() reported must be acked first.
    std::unique_lock lock(state->mutex);
    state->acked.wait(lock, [state] { return state->events_acked >= state->events_reported; });
  }
  {
    std::lock_guard lock(g_cqs.mutex);
    g_cqs.cqs.erase(state->cpp.get());
  }
  ibv_context* context = cq->context;
  ibv_comp_channel* channel = cq->channel;
  delete state;
  pthread_cond_destroy(&cq->cond);
  pthread_mutex_destroy(&cq->mutex);
  delete reinterpret_cast<CqShell*>(cq);
  if (channel) __atomic_sub_fetch(&channel->refcnt, 1, __ATOMIC_ACQ_REL);
  release(context);
  return 0;
}

int ibv_get_cq_event(ibv_comp_channel* channel, ibv_cq** cq, void** cq_context) {
  if (!channel || !cq || !cq_context) return fail_errno(EINVAL);
  CompChannelState* state = state_of<CompChannelState>(channel);
  const auto wait = nonblocking(channel->fd) ? std::chrono::milliseconds(0) : std::chrono::milliseconds(-1);
  for (;;) {
    auto notified = state->cpp->get_event(wait);
    if (!notified) return fail_errno(notified.error() == std::errc::timed_out ? EAGAIN : errno_of(notified.error()));
    ibv_cq* found = nullptr;
    {
      std::lock_guard lock(g_cqs.mutex);
      if (auto it = g_cqs.cqs.find(*notified); it != g_cqs.cqs.end()) found = it->second;
    }
    if (!found) continue;
    CqState* cq_state = state_of<CqState>(found);
    {
      std::lock_guard lock(cq_state->mutex);
      ++cq_state->events_reported;
    }
    *cq = found;
    *cq_context = found->cq_context;
    return 0;
  }
}

void ibv_ack_cq_events(ibv_cq* cq, unsigned int nevents) {
  if (!cq || nevents == 0) return;
  CqState* state = state_of<CqState>(cq);
  if (cq->channel) state_of<CompChannelState>(cq->channel)->cpp->ack_events(*state->cpp, nevents);
  {
    // Under the lock: ibv_destroy_cq frees the CQ once every event is acked.
    std::lock_guard lock(state->mutex);
    state->events_acked += nevents;
    state->acked.notify_all();
  }
}

namespace peercm::capi {
namespace {

// ibv_poll_cq's work: up to num_entries completions into wc.
int poll_into(ibv_cq* cq, int num_entries, ibv_wc* wc) {
  CompletionQueue& cpp = *state_of<CqState>(cq)->cpp;
  WorkCompletion batch[32];
  int done = 0;
  while (done < num_entries) {
    const std::size_t want = std::min<std::size_t>(std::size(batch), static_cast<std::size_t>(num_entries - done));
    const std::size_t got = cpp.poll(std::span(batch, want));
    for (std::size_t i = 0; i < got; ++i) wc[done++] = to_ibv_wc(batch[i]);
    if (got < want) break;
  }
  return done;
}

}  // namespace

void note_poll(ibv_cq* cq, bool found) {
  // Spin, then yield: docs/progress.md, "Waiting". Inline contexts never yield: the polling
  // thread is the one that makes progress.
  thread_local engine::BusyPollBudget budget;
  if (budget.should_yield(found) && cpp_context(cq->context).progress_mode() == ProgressMode::thread)
    std::this_thread::yield();
}

}  // namespace peercm::capi

int ibv_poll_cq(ibv_cq* cq, int num_entries, ibv_wc* wc) {
  if (!cq || num_entries < 0 || (num_entries > 0 && !wc)) return -EINVAL;
  const int done = poll_into(cq, num_entries, wc);
  if (num_entries > 0) note_poll(cq, done > 0);
  return done;
}


int ibv_req_notify_cq(ibv_cq* cq, int solicited_only) {
  if (!cq) return EINVAL;
  auto armed = state_of<CqState>(cq)->cpp->request_notify(solicited_only != 0);
  return armed ? 0 : errno_of(armed.error());
}

// --- shared receive queues ---

ibv_srq* ibv_create_srq(ibv_pd* pd, ibv_srq_init_attr* attr) {
  if (!pd || !attr) return fail_null<ibv_srq>(EINVAL);
  ibv_srq_attr& want = attr->attr;
  if (want.max_wr == 0 || want.max_wr > static_cast<std::uint32_t>(kMaxSrqWr) ||
      want.max_sge > static_cast<std::uint32_t>(kMaxSge))
    return fail_null<ibv_srq>(EINVAL);
  PdState* pd_state = state_of<PdState>(pd);
  auto srq =
      SharedReceiveQueue::create(*pd_state->cpp, SrqAttr{.max_wr = want.max_wr, .max_sge = std::max(want.max_sge, 1u)});
  if (!srq) return fail_null<ibv_srq>(errno_of(srq.error()));
  auto* shell = new SrqShell{};
  shell->state = new SrqState{};
  shell->state->cpp = std::move(*srq);
  const SrqAttr got = shell->state->cpp->query();
  want.max_wr = got.max_wr;  // verbs: the caller learns what it got; srq_limit is left as given
  want.max_sge = got.max_sge;
  ibv_srq& pub = shell->pub;
  pub.context = pd->context;
  pub.srq_context = attr->srq_context;
  pub.pd = pd;
  pub.handle = ++g_srq_handles;
  pthread_mutex_init(&pub.mutex, nullptr);
  pthread_cond_init(&pub.cond, nullptr);
  pd_state->users.fetch_add(1);
  retain(pd->context);
  return &pub;
}

// Resizing is not offered (no IBV_DEVICE_SRQ_RESIZE). The limit is kept and reported, and
// arms nothing: the device raises no asynchronous events, IBV_EVENT_SRQ_LIMIT_REACHED
// included.
int ibv_modify_srq(ibv_srq* srq, ibv_srq_attr* attr, int attr_mask) {
  if (!srq || !attr) return EINVAL;
  if (attr_mask & ~(IBV_SRQ_MAX_WR | IBV_SRQ_LIMIT)) return EINVAL;
  if (attr_mask & IBV_SRQ_MAX_WR) return EOPNOTSUPP;
  if (!(attr_mask & IBV_SRQ_LIMIT)) return 0;
  auto modified = state_of<SrqState>(srq)->cpp->modify(attr->srq_limit);
  return modified ? 0 : errno_of(modified.error());
}

int ibv_query_srq(ibv_srq* srq, ibv_srq_attr* attr) {
  if (!srq || !attr) return EINVAL;
  const SrqAttr got = state_of<SrqState>(srq)->cpp->query();
  *attr = ibv_srq_attr{.max_wr = got.max_wr, .max_sge = got.max_sge, .srq_limit = got.srq_limit};
  return 0;
}

int ibv_destroy_srq(ibv_srq* srq) {
  if (!srq) return EINVAL;
  SrqState* state = state_of<SrqState>(srq);
  if (auto destroyed = SharedReceiveQueue::destroy(state->cpp); !destroyed) return errno_of(destroyed.error());
  ibv_pd* pd = srq->pd;
  ibv_context* context = srq->context;
  delete state;
  pthread_cond_destroy(&srq->cond);
  pthread_mutex_destroy(&srq->mutex);
  delete reinterpret_cast<SrqShell*>(srq);
  release_pd_user(pd);
  release(context);
  return 0;
}

int ibv_post_srq_recv(ibv_srq* srq, ibv_recv_wr* wr, ibv_recv_wr** bad_wr) {
  if (!srq) return EINVAL;
  return post_recv_list(*state_of<SrqState>(srq)->cpp, wr, bad_wr);
}

// --- queue pairs ---

ibv_qp* ibv_create_qp(ibv_pd* pd, ibv_qp_init_attr* attr) {
  if (!pd || !attr || !attr->send_cq || !attr->recv_cq) return fail_null<ibv_qp>(EINVAL);
  // UD and UC over RoCE only: iWARP has neither a datagram service nor an unreliable
  // connection (docs/c-api.md).
  const bool ud = attr->qp_type == IBV_QPT_UD;
  const bool uc = attr->qp_type == IBV_QPT_UC;
  if (attr->qp_type != IBV_QPT_RC && !((ud || uc) && uses_roce(pd->context))) return fail_null<ibv_qp>(EOPNOTSUPP);
  if (ud && attr->srq) return fail_null<ibv_qp>(EINVAL);
  const ibv_qp_cap& want = attr->cap;
  // verbs: with an SRQ the receive capabilities are ignored.
  const bool own_recv = attr->srq == nullptr;
  if (want.max_send_wr > kMaxQpWr || want.max_send_sge > kMaxSge || want.max_inline_data > kMaxInline ||
      (own_recv && (want.max_recv_wr > kMaxQpWr || want.max_recv_sge > kMaxSge)))
    return fail_null<ibv_qp>(EINVAL);
  if (attr->send_cq->context != pd->context || attr->recv_cq->context != pd->context ||
      (attr->srq && attr->srq->context != pd->context))
    return fail_null<ibv_qp>(EINVAL);
  QpInitAttr init;
  init.send_cq = state_of<CqState>(attr->send_cq)->cpp.get();
  init.recv_cq = state_of<CqState>(attr->recv_cq)->cpp.get();
  init.srq = attr->srq ? state_of<SrqState>(attr->srq)->cpp.get() : nullptr;
  init.caps = QpCaps{.max_send_wr = want.max_send_wr,
                     .max_recv_wr = own_recv ? want.max_recv_wr : 0,
                     .max_send_sge = std::max(want.max_send_sge, 1u),
                     .max_recv_sge = own_recv ? std::max(want.max_recv_sge, 1u) : 0,
                     .max_inline_data = std::max(want.max_inline_data, kDefaultInline)};
  init.sq_sig_all = attr->sq_sig_all != 0;
  auto qp = QueuePair::create(*state_of<PdState>(pd)->cpp, init);
  if (!qp) return fail_null<ibv_qp>(errno_of(qp.error()));
  auto* shell = new QpShell{};
  std::memset(&shell->ex, 0, sizeof shell->ex);  // the extended part stays zero unless ibv_create_qp_ex fills it
  shell->state = new QpHandleState{};
  QpHandleState& state = *shell->state;
  state.cpp = std::move(*qp);
  state.caps = ibv_qp_cap{init.caps.max_send_wr, init.caps.max_recv_wr, init.caps.max_send_sge,
                          init.caps.max_recv_sge, init.caps.max_inline_data};
  state.sq_sig_all = attr->sq_sig_all;
  attr->cap = state.caps;  // verbs: the caller learns what it got
  ibv_qp& pub = shell->pub;
  pub.context = pd->context;
  pub.qp_context = attr->qp_context;
  pub.pd = pd;
  pub.send_cq = attr->send_cq;
  pub.recv_cq = attr->recv_cq;
  pub.srq = attr->srq;
  pub.qp_num = state.cpp->qp_num();
  pub.handle = pub.qp_num;
  pub.state = IBV_QPS_RESET;
  pub.qp_type = attr->qp_type;
  pthread_mutex_init(&pub.mutex, nullptr);
  pthread_cond_init(&pub.cond, nullptr);
  if (ud || uc) {
    if (const int made = ud ? make_ud_qp(&pub) : make_uc_qp(&pub); made != 0) {
      pthread_cond_destroy(&pub.cond);
      pthread_mutex_destroy(&pub.mutex);
      delete shell->state;
      delete shell;
      return fail_null<ibv_qp>(made);
    }
  }
  state_of<PdState>(pd)->users.fetch_add(1);
  state_of<CqState>(attr->send_cq)->qps.fetch_add(1);
  state_of<CqState>(attr->recv_cq)->qps.fetch_add(1);
  retain(pd->context);
  return &pub;
}

// On iWARP the connection manager moves a QP to RTS when its connection runs (and to ERROR
// when it ends); the application only moves it to ERROR itself. Before the connection,
// INIT/RTR/RTS are recorded; once the QP runs they change nothing, so IB-style code that
// walks the states after CONNECT_RESPONSE works unchanged. A QP that ran is not reusable.
int ibv_modify_qp(ibv_qp* qp, ibv_qp_attr* attr, int attr_mask) {
  if (!qp || !attr) return EINVAL;
  if (auto handled = modify_qp_without_cm(qp, *attr, attr_mask)) return *handled;
  QpHandleState& state = *state_of<QpHandleState>(qp);
  if (!(attr_mask & IBV_QP_STATE)) return 0;  // addressing and timers mean nothing over TCP
  const peercm::QpState engine = state.cpp->state();
  switch (attr->qp_state) {
    case IBV_QPS_ERR:
      state.cpp->to_error();
      state.recorded = IBV_QPS_ERR;
      break;
    case IBV_QPS_RESET:
      if (engine == peercm::QpState::rts || engine == peercm::QpState::error) return EINVAL;
      state.recorded = IBV_QPS_RESET;
      break;
    case IBV_QPS_INIT:
    case IBV_QPS_RTR:
    case IBV_QPS_RTS:
      if (engine == peercm::QpState::error) return EINVAL;
      if (engine != peercm::QpState::rts) state.recorded = attr->qp_state;
      break;
    default:
      return EINVAL;  // SQD / SQE have no iWARP counterpart
  }
  qp->state = effective_state(state);
  return 0;
}

int ibv_query_qp(ibv_qp* qp, ibv_qp_attr* attr, int, ibv_qp_init_attr* init_attr) {
  if (!qp || !attr) return EINVAL;
  const QpHandleState& state = *state_of<QpHandleState>(qp);
  *attr = ibv_qp_attr{};
  attr->qp_state = effective_state(state);
  attr->cur_qp_state = attr->qp_state;
  attr->path_mtu = IBV_MTU_1024;
  attr->qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  attr->cap = state.caps;
  attr->max_rd_atomic = kMaxRdAtom;
  attr->max_dest_rd_atomic = kMaxRdAtom;
  attr->port_num = 1;
  if (qp->qp_type == IBV_QPT_UD) {
    attr->qkey = ud_qkey(qp);
    attr->path_mtu = IBV_MTU_4096;
  }
  qp->state = attr->qp_state;
  if (init_attr) {
    *init_attr = ibv_qp_init_attr{};
    init_attr->qp_context = qp->qp_context;
    init_attr->send_cq = qp->send_cq;
    init_attr->recv_cq = qp->recv_cq;
    init_attr->srq = qp->srq;
    init_attr->cap = state.caps;
    init_attr->qp_type = qp->qp_type;
    init_attr->sq_sig_all = state.sq_sig_all;
  }
  return 0;
}

int ibv_destroy_qp(ibv_qp* qp) {
  if (!qp) return EINVAL;
  QpHandleState* state = state_of<QpHandleState>(qp);
  detach_from_id(qp);
  // A QP that still carries a connection ends it (its WRs flush) rather than leave the peer
  // writing into memory the application is about to free.
  if (state->cpp->state() == peercm::QpState::rts) state->cpp->to_error();
  ibv_pd* pd = qp->pd;
  ibv_cq* send_cq = qp->send_cq;
  ibv_cq* recv_cq = qp->recv_cq;
  ibv_context* context = qp->context;
  delete state;
  pthread_cond_destroy(&qp->cond);
  pthread_mutex_destroy(&qp->mutex);
  delete reinterpret_cast<QpShell*>(qp);
  release_cq_user(send_cq);
  release_cq_user(recv_cq);
  release_pd_user(pd);
  release(context);
  return 0;
}

int ibv_post_send(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad_wr) {
  if (!qp) return EINVAL;
  if (qp->qp_type == IBV_QPT_UD) return post_ud_send(qp, wr, bad_wr);
  QpHandleState& state = *state_of<QpHandleState>(qp);
  if (state.rtr && state.rtr->remote != 0) {
    // A RoCE RC QP in RTR receives; it sends from RTS on (its send PSN comes with RTS).
    if (bad_wr) *bad_wr = wr;
    return EINVAL;
  }
  QueuePair& cpp = *state.cpp;
  SendWr converted;
  for (ibv_send_wr* at = wr; at; at = at->next) {
    auto ok = convert_send(*at, converted);
    if (ok) ok = cpp.post_send(converted);
    if (!ok) {
      if (bad_wr) *bad_wr = at;
      return errno_of(ok.error());
    }
  }
  return 0;
}

int ibv_post_recv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad_wr) {
  if (!qp) return EINVAL;
  return post_recv_list(*state_of<QpHandleState>(qp)->cpp, wr, bad_wr);
}

// Address handles, UD and modify_qp without the CM over RoCE: verbs_roce.cpp.
