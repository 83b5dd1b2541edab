// The extended verbs of libibverbs: ibv_query_device_ex and the GID queries, the extended CQ
// (ibv_create_cq_ex, start/next/end_poll and the ibv_wc_read_* accessors), the extended QP
// (ibv_create_qp_ex and the ibv_wr_* builders, posted through the QP's ordinary post path),
// ibv_create_srq_ex / ibv_get_srq_num, and the calls for what peercm has not (XRC, multicast,
// flow steering, device memory, parent and thread domains, memory windows, work queues,
// completion counters, ECE), which fail as rdma-core does for a provider without the feature.
#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "capi/handles.hpp"

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wold-style-cast"
#include <infiniband/driver.h>
#pragma GCC diagnostic pop

namespace peercm::capi {
namespace {

template <class T>
T* fail_null(int error) {
  errno = error;
  return nullptr;
}

// The port's one GID, as ibv_query_gid gives it.
Status<std::errc> fill_gid_entry(ibv_context* context, ibv_gid_entry& entry) {
  entry = ibv_gid_entry{};
  if (ibv_query_gid(context, 1, 0, &entry.gid) != 0) return fail(std::errc::invalid_argument);
  entry.gid_index = 0;
  entry.port_num = 1;
  // The kernel gives an iWARP device's GIDs the IB type (rdma-core reports them so).
  entry.gid_type = uses_roce(context) ? IBV_GID_TYPE_ROCE_V2 : IBV_GID_TYPE_IB;
  entry.ndev_ifindex = 0;  // no netdev of its own: it runs over whatever interface the route takes
  return {};
}

// --- the extended CQ ---

CqShell* cq_shell(ibv_cq_ex* cq) { return reinterpret_cast<CqShell*>(cq); }
const WorkCompletion& current(ibv_cq_ex* cq) { return cq_shell(cq)->state->current; }

// Takes the next completion into `current`; ENOENT when there is none.
int poll_one(ibv_cq_ex* cq) {
  CqState& state = *cq_shell(cq)->state;
  const bool found = state.cpp->poll(std::span(&state.current, 1)) == 1;
  note_poll(ibv_cq_ex_to_cq(cq), found);
  if (!found) return ENOENT;
  const ibv_wc converted = to_ibv_wc(state.current);
  cq->status = converted.status;
  cq->wr_id = converted.wr_id;
  return 0;
}

int cq_start_poll(ibv_cq_ex* cq, ibv_poll_cq_attr* attr) {
  if (attr && attr->comp_mask != 0) return EINVAL;
  return poll_one(cq);
}
int cq_next_poll(ibv_cq_ex* cq) { return poll_one(cq); }
void cq_end_poll(ibv_cq_ex*) {}  // each completion left the queue when it was read

ibv_wc_opcode read_opcode(ibv_cq_ex* cq) { return to_ibv_wc(current(cq)).opcode; }
uint32_t read_vendor_err(ibv_cq_ex*) { return 0; }
uint32_t read_byte_len(ibv_cq_ex* cq) { return current(cq).byte_len; }
// The immediate data, or with IBV_WC_WITH_INV the invalidated rkey (ibv_wc's union).
__be32 read_imm_data(ibv_cq_ex* cq) {
  const WorkCompletion& wc = current(cq);
  return (wc.wc_flags & kWcWithInvalidate) ? wc.invalidated_rkey : wc.imm_data;
}
uint32_t read_qp_num(ibv_cq_ex* cq) { return current(cq).qp_num; }
uint32_t read_src_qp(ibv_cq_ex*) { return 0; }  // RC: the QP is connected to one peer
unsigned int read_wc_flags(ibv_cq_ex* cq) { return to_ibv_wc(current(cq)).wc_flags; }
uint32_t read_slid(ibv_cq_ex*) { return 0; }  // no LIDs over Ethernet
uint8_t read_sl(ibv_cq_ex*) { return 0; }
uint8_t read_dlid_path_bits(ibv_cq_ex*) { return 0; }
// Never reached: the flags that would let a program call these are refused at create.
uint64_t read_no_u64(ibv_cq_ex*) { return 0; }
uint16_t read_no_u16(ibv_cq_ex*) { return 0; }
uint32_t read_no_u32(ibv_cq_ex*) { return 0; }
void read_no_tm_info(ibv_cq_ex*, ibv_wc_tm_info* info) {
  if (info) *info = ibv_wc_tm_info{};
}

// --- the extended QP ---

QpShell* qp_shell(ibv_qp_ex* qp) { return reinterpret_cast<QpShell*>(qp); }
QpHandleState& qp_state(ibv_qp_ex* qp) { return *qp_shell(qp)->state; }

void record_error(QpHandleState& state, int error) {
  if (state.batch_error == 0) state.batch_error = error;
}

// A new WR of the batch with the builder's wr_id and flags; null when the batch already
// failed or was not started (the failure is kept for wr_complete).
SendWr* begin_wr(ibv_qp_ex* qp, std::uint64_t op_flag, WrOpcode opcode) {
  QpHandleState& state = qp_state(qp);
  if (!state.building) {
    record_error(state, EINVAL);
    return nullptr;
  }
  if (!(state.send_ops & op_flag)) {
    record_error(state, EOPNOTSUPP);
    return nullptr;
  }
  if (state.batch_error != 0) return nullptr;
  SendWr& wr = state.batch.emplace_back();
  wr.wr_id = qp->wr_id;
  wr.opcode = opcode;
  wr.flags = qp->wr_flags & (IBV_SEND_FENCE | IBV_SEND_SIGNALED | IBV_SEND_SOLICITED | IBV_SEND_INLINE);
  // IBV_SEND_IP_CSUM (checksum offload for UD and raw QPs) is dropped, as ibv_post_send drops it.
  return &wr;
}

// The WR the setters complete: the last one begun; EINVAL if there is none.
SendWr* last_wr(ibv_qp_ex* qp) {
  QpHandleState& state = qp_state(qp);
  if (state.batch_error != 0) return nullptr;
  if (!state.building || state.batch.empty()) {
    record_error(state, EINVAL);
    return nullptr;
  }
  return &state.batch.back();
}

void wr_send(ibv_qp_ex* qp) { begin_wr(qp, IBV_QP_EX_WITH_SEND, WrOpcode::send); }
void wr_send_imm(ibv_qp_ex* qp, __be32 imm_data) {
  if (SendWr* wr = begin_wr(qp, IBV_QP_EX_WITH_SEND_WITH_IMM, WrOpcode::send_with_imm)) wr->imm_data = imm_data;
}
void wr_send_inv(ibv_qp_ex* qp, uint32_t invalidate_rkey) {
  if (SendWr* wr = begin_wr(qp, IBV_QP_EX_WITH_SEND_WITH_INV, WrOpcode::send_with_invalidate))
    wr->invalidate_rkey = invalidate_rkey;
}
void wr_rdma_write(ibv_qp_ex* qp, uint32_t rkey, uint64_t remote_addr) {
  if (SendWr* wr = begin_wr(qp, IBV_QP_EX_WITH_RDMA_WRITE, WrOpcode::rdma_write)) {
    wr->rkey = rkey;
    wr->remote_addr = remote_addr;
  }
}
void wr_rdma_write_imm(ibv_qp_ex* qp, uint32_t rkey, uint64_t remote_addr, __be32 imm_data) {
  if (SendWr* wr = begin_wr(qp, IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM, WrOpcode::rdma_write_with_imm)) {
    wr->rkey = rkey;
    wr->remote_addr = remote_addr;
    wr->imm_data = imm_data;
  }
}
void wr_rdma_read(ibv_qp_ex* qp, uint32_t rkey, uint64_t remote_addr) {
  if (SendWr* wr = begin_wr(qp, IBV_QP_EX_WITH_RDMA_READ, WrOpcode::rdma_read)) {
    wr->rkey = rkey;
    wr->remote_addr = remote_addr;
  }
}

// The operations no peercm transport has: never in send_ops_flags, so the batch fails.
void refuse(ibv_qp_ex* qp) { record_error(qp_state(qp), EOPNOTSUPP); }
void wr_atomic_cmp_swp(ibv_qp_ex* qp, uint32_t, uint64_t, uint64_t, uint64_t) { refuse(qp); }
void wr_atomic_fetch_add(ibv_qp_ex* qp, uint32_t, uint64_t, uint64_t) { refuse(qp); }
void wr_bind_mw(ibv_qp_ex* qp, ibv_mw*, uint32_t, const ibv_mw_bind_info*) { refuse(qp); }
void wr_local_inv(ibv_qp_ex* qp, uint32_t) { refuse(qp); }
void wr_send_tso(ibv_qp_ex* qp, void*, uint16_t, uint16_t) { refuse(qp); }
void wr_atomic_write(ibv_qp_ex* qp, uint32_t, uint64_t, const void*) { refuse(qp); }
void wr_flush(ibv_qp_ex* qp, uint32_t, uint64_t, size_t, uint8_t, uint8_t) { refuse(qp); }
// Addressing of UD and XRC QPs: an RC QP has no use for it (rdma-core's providers ignore
// the call on an RC QP; peercm fails the batch so the mistake is seen).
void wr_set_ud_addr(ibv_qp_ex* qp, ibv_ah*, uint32_t, uint32_t) { record_error(qp_state(qp), EINVAL); }
void wr_set_xrc_srqn(ibv_qp_ex* qp, uint32_t) { record_error(qp_state(qp), EINVAL); }

void wr_set_sge(ibv_qp_ex* qp, uint32_t lkey, uint64_t addr, uint32_t length) {
  if (SendWr* wr = last_wr(qp)) {
    wr->sg_list.clear();
    wr->sg_list.push_back(Sge{.addr = addr, .length = length, .lkey = lkey});
  }
}

void wr_set_sge_list(ibv_qp_ex* qp, size_t num_sge, const ibv_sge* sg_list) {
  SendWr* wr = last_wr(qp);
  if (!wr) return;
  if (num_sge > static_cast<size_t>(kMaxSge) || (num_sge > 0 && !sg_list)) {
    record_error(qp_state(qp), EINVAL);
    return;
  }
  wr->sg_list.clear();
  for (size_t i = 0; i < num_sge; ++i)
    wr->sg_list.push_back(Sge{.addr = sg_list[i].addr, .length = sg_list[i].length, .lkey = sg_list[i].lkey});
}

// Inline data is copied now, as verbs requires (the caller may reuse its buffer at once),
// into one buffer the batch keeps until it is posted; the QP copies it again at post time.
void set_inline(ibv_qp_ex* qp, size_t num_buf, const ibv_data_buf* bufs) {
  SendWr* wr = last_wr(qp);
  if (!wr) return;
  QpHandleState& state = qp_state(qp);
  size_t total = 0;
  for (size_t i = 0; i < num_buf; ++i) total += bufs[i].length;
  if (total > state.caps.max_inline_data) {
    record_error(state, EINVAL);
    return;
  }
  std::vector<std::uint8_t>& bytes = state.inline_copies.emplace_back(total);
  size_t at = 0;
  for (size_t i = 0; i < num_buf; ++i) {
    if (bufs[i].length > 0) std::memcpy(bytes.data() + at, bufs[i].addr, bufs[i].length);
    at += bufs[i].length;
  }
  wr->flags |= kSendInline;
  wr->sg_list.clear();
  if (total > 0)
    wr->sg_list.push_back(
        Sge{.addr = reinterpret_cast<std::uintptr_t>(bytes.data()), .length = static_cast<std::uint32_t>(total)});
}

void wr_set_inline_data(ibv_qp_ex* qp, void* addr, size_t length) {
  const ibv_data_buf buf{addr, length};
  set_inline(qp, 1, &buf);
}
void wr_set_inline_data_list(ibv_qp_ex* qp, size_t num_buf, const ibv_data_buf* buf_list) {
  if (num_buf > 0 && !buf_list) {
    record_error(qp_state(qp), EINVAL);
    return;
  }
  set_inline(qp, num_buf, buf_list);
}

void reset_batch(QpHandleState& state) {
  state.batch.clear();
  state.inline_copies.clear();
  state.batch_error = 0;
  state.building = false;
}

void wr_start(ibv_qp_ex* qp) {
  QpHandleState& state = qp_state(qp);
  reset_batch(state);
  state.building = true;
}

// Posts the batch in order through the QP's post path. A batch a builder failed is dropped
// whole; a post that fails midway (ENOMEM: the send queue is full) leaves the WRs before it
// posted, as ibv_post_send does.
int wr_complete(ibv_qp_ex* qp) {
  QpHandleState& state = qp_state(qp);
  if (!state.building) return EINVAL;
  int result = state.batch_error;
  if (result == 0) {
    for (const SendWr& wr : state.batch) {
      if (auto posted = state.cpp->post_send(wr); !posted) {
        result = errno_of(posted.error());
        break;
      }
    }
  }
  reset_batch(state);
  return result;
}

void wr_abort(ibv_qp_ex* qp) { reset_batch(qp_state(qp)); }

}  // namespace

// What ibv_create_qp_ex and rdma_create_qp_ex accept in send_ops_flags, and so what the
// QP's builders do: no atomics, memory windows, local invalidation, TSO or flush.
bool send_ops_supported(ibv_context* context, std::uint64_t send_ops) {
  std::uint64_t ops = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_INV | IBV_QP_EX_WITH_RDMA_WRITE |
                      IBV_QP_EX_WITH_RDMA_READ;
  if (uses_roce(context)) ops |= IBV_QP_EX_WITH_SEND_WITH_IMM | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM;
  return (send_ops & ~ops) == 0;
}

void make_qp_extended(ibv_qp* qp, std::uint64_t send_ops) {
  QpShell* shell = reinterpret_cast<QpShell*>(qp);
  shell->state->extended = true;
  shell->state->send_ops = send_ops;
  ibv_qp_ex& ex = shell->ex;
  ex.comp_mask = 0;
  ex.wr_id = 0;
  ex.wr_flags = 0;
  ex.wr_atomic_cmp_swp = wr_atomic_cmp_swp;
  ex.wr_atomic_fetch_add = wr_atomic_fetch_add;
  ex.wr_bind_mw = wr_bind_mw;
  ex.wr_local_inv = wr_local_inv;
  ex.wr_rdma_read = wr_rdma_read;
  ex.wr_rdma_write = wr_rdma_write;
  ex.wr_rdma_write_imm = wr_rdma_write_imm;
  ex.wr_send = wr_send;
  ex.wr_send_imm = wr_send_imm;
  ex.wr_send_inv = wr_send_inv;
  ex.wr_send_tso = wr_send_tso;
  ex.wr_set_ud_addr = wr_set_ud_addr;
  ex.wr_set_xrc_srqn = wr_set_xrc_srqn;
  ex.wr_set_inline_data = wr_set_inline_data;
  ex.wr_set_inline_data_list = wr_set_inline_data_list;
  ex.wr_set_sge = wr_set_sge;
  ex.wr_set_sge_list = wr_set_sge_list;
  ex.wr_start = wr_start;
  ex.wr_complete = wr_complete;
  ex.wr_abort = wr_abort;
  ex.wr_atomic_write = wr_atomic_write;
  ex.wr_flush = wr_flush;
}

}  // namespace peercm::capi

using namespace peercm;
using namespace peercm::capi;

// --- extended queries ---

int ibv_query_device_ex(ibv_context* context, const ibv_query_device_ex_input* input, ibv_device_attr_ex* attr) {
  if (!context || !attr) return EINVAL;
  if (input && input->comp_mask != 0) return EINVAL;
  *attr = ibv_device_attr_ex{};
  if (int failed = ibv_query_device(context, &attr->orig_attr); failed != 0) return failed;
  attr->device_cap_flags_ex = attr->orig_attr.device_cap_flags;
  attr->phys_port_cnt_ex = attr->orig_attr.phys_port_cnt;
  // Everything else stays zero: no on-demand paging, completion timestamps, TSO, RSS, work
  // queues, packet pacing, raw packet offloads, tag matching, CQ moderation, device memory,
  // PCI atomics or XRC.
  return 0;
}

int ibv_query_gid_ex(ibv_context* context, uint32_t port_num, uint32_t gid_index, ibv_gid_entry* entry,
                     uint32_t flags) {
  if (!context || !entry || flags != 0 || port_num != 1) return EINVAL;
  if (gid_index != 0) return ENODATA;  // rdma-core's answer for an empty table entry
  auto filled = fill_gid_entry(context, *entry);
  return filled ? 0 : errno_of(filled.error());
}

ssize_t ibv_query_gid_table(ibv_context* context, ibv_gid_entry* entries, size_t max_entries, uint32_t flags) {
  if (!context || flags != 0 || (max_entries > 0 && !entries)) return -EINVAL;
  if (max_entries < 1) return -EINVAL;  // rdma-core: the array must hold every valid entry
  auto filled = fill_gid_entry(context, entries[0]);
  return filled ? 1 : -errno_of(filled.error());
}

int ibv_query_gid_type(ibv_context* context, uint8_t port_num, unsigned int index, ibv_gid_type_sysfs* type) {
  if (!context || !type || port_num != 1 || index != 0) return fail_errno(EINVAL);
  *type = uses_roce(context) ? IBV_GID_TYPE_SYSFS_ROCE_V2 : IBV_GID_TYPE_SYSFS_IB_ROCE_V1;
  return 0;
}

int ibv_read_sysfs_file(const char* dir, const char* file, char* buf, size_t size) {
  if (!dir || !file || !buf || size == 0) return fail_errno(EINVAL);
  const std::string path = std::string(dir) + "/" + file;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  const ssize_t got = ::read(fd, buf, size);
  const int saved = errno;
  ::close(fd);
  if (got < 0) return fail_errno(saved);
  auto length = static_cast<size_t>(got);
  if (length > 0 && buf[length - 1] == '\n') --length;
  if (length == size) --length;  // room for the terminator
  buf[length] = '\0';
  return static_cast<int>(length);
}

int ibv_query_port_speed(ibv_context* context, uint32_t port_num, uint64_t* port_speed) {
  if (!context || !port_speed || port_num != 1) return EINVAL;
  // ibv_query_port's width 1X and speed SDR: 2.5 Gb/s. Over loopback TCP or UDP the real
  // rate is the host's; this is the nominal figure the port reports.
  *port_speed = 25;
  return 0;
}

int ibv_query_comp_cntr_caps(ibv_context* context, ibv_comp_cntr_caps* caps) {
  if (!context || !caps) return EINVAL;
  *caps = ibv_comp_cntr_caps{};
  return 0;
}

// --- extended completion queues ---

ibv_cq_ex* ibv_create_cq_ex(ibv_context* context, ibv_cq_init_attr_ex* cq_attr) {
  if (!context || !cq_attr) return fail_null<ibv_cq_ex>(EINVAL);
  if (cq_attr->comp_mask & ~static_cast<uint32_t>(IBV_CQ_INIT_ATTR_MASK_FLAGS | IBV_CQ_INIT_ATTR_MASK_PD))
    return fail_null<ibv_cq_ex>(EINVAL);
  // A parent domain is never made here, so none can be named.
  if ((cq_attr->comp_mask & IBV_CQ_INIT_ATTR_MASK_PD) && cq_attr->parent_domain) return fail_null<ibv_cq_ex>(EINVAL);
  // Timestamps, VLANs, flow tags and tag matching are not known to this device.
  if (cq_attr->wc_flags & ~static_cast<uint64_t>(IBV_WC_STANDARD_FLAGS)) return fail_null<ibv_cq_ex>(EOPNOTSUPP);
  if ((cq_attr->comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS) &&
      (cq_attr->flags & ~static_cast<uint32_t>(IBV_CREATE_CQ_ATTR_SINGLE_THREADED | IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN)))
    return fail_null<ibv_cq_ex>(EOPNOTSUPP);
  if (cq_attr->cqe > static_cast<uint32_t>(kMaxCqe)) return fail_null<ibv_cq_ex>(EINVAL);
  // The flags are hints a software CQ can ignore: it is thread-safe either way, and an
  // overrun still moves the affected QPs to ERROR.
  ibv_cq* cq = ibv_create_cq(context, static_cast<int>(cq_attr->cqe), cq_attr->cq_context, cq_attr->channel,
                             static_cast<int>(cq_attr->comp_vector));
  if (!cq) return nullptr;
  ibv_cq_ex& ex = reinterpret_cast<CqShell*>(cq)->ex;
  ex.comp_mask = 0;
  ex.status = IBV_WC_SUCCESS;
  ex.wr_id = 0;
  ex.start_poll = cq_start_poll;
  ex.next_poll = cq_next_poll;
  ex.end_poll = cq_end_poll;
  ex.read_opcode = read_opcode;
  ex.read_vendor_err = read_vendor_err;
  ex.read_byte_len = read_byte_len;
  ex.read_imm_data = read_imm_data;
  ex.read_qp_num = read_qp_num;
  ex.read_src_qp = read_src_qp;
  ex.read_wc_flags = read_wc_flags;
  ex.read_slid = read_slid;
  ex.read_sl = read_sl;
  ex.read_dlid_path_bits = read_dlid_path_bits;
  ex.read_completion_ts = read_no_u64;
  ex.read_cvlan = read_no_u16;
  ex.read_flow_tag = read_no_u32;
  ex.read_tm_info = read_no_tm_info;
  ex.read_completion_wallclock_ns = read_no_u64;
  return &ex;
}

int ibv_modify_cq(ibv_cq* cq, ibv_modify_cq_attr* attr) {
  if (!cq || !attr) return EINVAL;
  return EOPNOTSUPP;  // no CQ moderation (cq_mod_caps are zero)
}

// --- extended queue pairs ---

ibv_qp* ibv_create_qp_ex(ibv_context* context, ibv_qp_init_attr_ex* attr) {
  if (!context || !attr) return fail_null<ibv_qp>(EINVAL);
  constexpr uint32_t understood = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
  if (attr->comp_mask & ~understood) return fail_null<ibv_qp>(EOPNOTSUPP);  // XRC, TSO, RSS, create flags
  if (!(attr->comp_mask & IBV_QP_INIT_ATTR_PD) || !attr->pd) return fail_null<ibv_qp>(EINVAL);
  if (attr->pd->context != context) return fail_null<ibv_qp>(EINVAL);
  const bool extended = (attr->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) != 0;
  if (extended && !send_ops_supported(context, attr->send_ops_flags)) return fail_null<ibv_qp>(EOPNOTSUPP);
  // The leading members of ibv_qp_init_attr_ex are an ibv_qp_init_attr (rdma-core relies
  // on the same); the caller learns its capabilities through them.
  ibv_qp* qp = ibv_create_qp(attr->pd, reinterpret_cast<ibv_qp_init_attr*>(attr));
  if (!qp || !extended) return qp;
  make_qp_extended(qp, attr->send_ops_flags);
  return qp;
}

ibv_qp_ex* ibv_qp_to_qp_ex(ibv_qp* qp) {
  if (!qp) return nullptr;
  QpShell* shell = reinterpret_cast<QpShell*>(qp);
  return shell->state->extended ? &shell->ex : nullptr;
}

// --- extended shared receive queues ---

ibv_srq* ibv_create_srq_ex(ibv_context* context, ibv_srq_init_attr_ex* attr) {
  if (!context || !attr) return fail_null<ibv_srq>(EINVAL);
  constexpr uint32_t basic = IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_TYPE;
  if (attr->comp_mask & ~basic) return fail_null<ibv_srq>(EOPNOTSUPP);  // XRC domain, CQ, tag matching
  if ((attr->comp_mask & IBV_SRQ_INIT_ATTR_TYPE) && attr->srq_type != IBV_SRQT_BASIC)
    return fail_null<ibv_srq>(EOPNOTSUPP);
  if (!(attr->comp_mask & IBV_SRQ_INIT_ATTR_PD) || !attr->pd) return fail_null<ibv_srq>(EINVAL);
  if (attr->pd->context != context) return fail_null<ibv_srq>(EINVAL);
  // Its leading members are an ibv_srq_init_attr, which learns what was made.
  return ibv_create_srq(attr->pd, reinterpret_cast<ibv_srq_init_attr*>(attr));
}

// rdma-core's providers give every SRQ its number, basic ones included; peercm's is the
// handle, unique in the process.
int ibv_get_srq_num(ibv_srq* srq, uint32_t* srq_num) {
  if (!srq || !srq_num) return EINVAL;
  *srq_num = srq->handle;
  return 0;
}

// --- what peercm has not ---

ibv_xrcd* ibv_open_xrcd(ibv_context* context, ibv_xrcd_init_attr*) {
  return fail_null<ibv_xrcd>(context ? EOPNOTSUPP : EINVAL);
}
int ibv_close_xrcd(ibv_xrcd* xrcd) { return xrcd ? EOPNOTSUPP : EINVAL; }
ibv_qp* ibv_open_qp(ibv_context* context, ibv_qp_open_attr*) {
  return fail_null<ibv_qp>(context ? EOPNOTSUPP : EINVAL);
}

// Multicast needs UD QPs, which peercm has not: EOPNOTSUPP, the kernel's answer for a device
// without multicast.
int ibv_attach_mcast(ibv_qp* qp, const ibv_gid*, uint16_t) { return qp ? EOPNOTSUPP : EINVAL; }
int ibv_detach_mcast(ibv_qp* qp, const ibv_gid*, uint16_t) { return qp ? EOPNOTSUPP : EINVAL; }

ibv_flow* ibv_create_flow(ibv_qp* qp, ibv_flow_attr*) { return fail_null<ibv_flow>(qp ? EOPNOTSUPP : EINVAL); }
int ibv_destroy_flow(ibv_flow* flow_id) { return flow_id ? EOPNOTSUPP : EINVAL; }

ibv_dm* ibv_alloc_dm(ibv_context* context, ibv_alloc_dm_attr*) {
  return fail_null<ibv_dm>(context ? EOPNOTSUPP : EINVAL);
}
int ibv_free_dm(ibv_dm* dm) { return dm ? EOPNOTSUPP : EINVAL; }
ibv_mr* ibv_reg_dm_mr(ibv_pd* pd, ibv_dm*, uint64_t, size_t, unsigned int) {
  return fail_null<ibv_mr>(pd ? EOPNOTSUPP : EINVAL);
}

ibv_mr* ibv_alloc_null_mr(ibv_pd* pd) { return fail_null<ibv_mr>(pd ? EOPNOTSUPP : EINVAL); }

int ibv_advise_mr(ibv_pd* pd, ibv_advise_mr_advice, uint32_t, ibv_sge*, uint32_t) {
  return pd ? EOPNOTSUPP : EINVAL;  // prefetching is for on-demand paging MRs
}

ibv_td* ibv_alloc_td(ibv_context* context, ibv_td_init_attr*) {
  return fail_null<ibv_td>(context ? EOPNOTSUPP : EINVAL);
}
int ibv_dealloc_td(ibv_td* td) { return td ? EOPNOTSUPP : EINVAL; }
ibv_pd* ibv_alloc_parent_domain(ibv_context* context, ibv_parent_domain_init_attr*) {
  return fail_null<ibv_pd>(context ? EOPNOTSUPP : EINVAL);
}

// rdma-core's default for a device without CC-DMA bounce buffers: page-aligned ordinary
// memory, registered as any other (ibv_rc_pingpong allocates its buffer this way).
struct ibv_buf {
  ibv_pd* pd;
  void* addr;
  size_t length;
};
void* ibv_alloc_buf(ibv_pd* pd, size_t size, ibv_buf** buf) {
  if (buf) *buf = nullptr;
  if (!pd || !buf) return fail_null<void>(EINVAL);
  void* memory = nullptr;
  if (const int failed = ::posix_memalign(&memory, static_cast<size_t>(::sysconf(_SC_PAGESIZE)), size); failed != 0)
    return fail_null<void>(failed);
  *buf = new ibv_buf{pd, memory, size};
  return memory;
}
void ibv_free_buf(ibv_buf* buf) {
  if (!buf) return;
  std::free(buf->addr);
  delete buf;
}
ibv_mr* ibv_reg_buf_mr(ibv_pd* pd, ibv_buf* buf, void* addr, size_t length, int access) {
  if (!pd || !buf) return fail_null<ibv_mr>(EINVAL);
  const auto start = reinterpret_cast<std::uintptr_t>(buf->addr);
  const auto at = reinterpret_cast<std::uintptr_t>(addr);
  if (at < start || length > buf->length || at - start > buf->length - length) return fail_null<ibv_mr>(EINVAL);
  return ibv_reg_mr(pd, addr, length, access);
}

ibv_mw* ibv_alloc_mw(ibv_pd* pd, ibv_mw_type) { return fail_null<ibv_mw>(pd ? EOPNOTSUPP : EINVAL); }
int ibv_dealloc_mw(ibv_mw* mw) { return mw ? EOPNOTSUPP : EINVAL; }
int ibv_bind_mw(ibv_qp* qp, ibv_mw* mw, ibv_mw_bind*) { return qp && mw ? EOPNOTSUPP : EINVAL; }

ibv_comp_cntr* ibv_create_comp_cntr(ibv_context* context, ibv_comp_cntr_init_attr*) {
  return fail_null<ibv_comp_cntr>(context ? EOPNOTSUPP : EINVAL);
}
int ibv_destroy_comp_cntr(ibv_comp_cntr* counter) { return counter ? EOPNOTSUPP : EINVAL; }
int ibv_set_comp_cntr(ibv_comp_cntr* counter, uint64_t) { return counter ? EOPNOTSUPP : EINVAL; }
int ibv_set_err_comp_cntr(ibv_comp_cntr* counter, uint64_t) { return counter ? EOPNOTSUPP : EINVAL; }
int ibv_inc_comp_cntr(ibv_comp_cntr* counter, uint64_t) { return counter ? EOPNOTSUPP : EINVAL; }
int ibv_inc_err_comp_cntr(ibv_comp_cntr* counter, uint64_t) { return counter ? EOPNOTSUPP : EINVAL; }
int ibv_read_comp_cntr(ibv_comp_cntr* counter, uint64_t*) { return counter ? EOPNOTSUPP : EINVAL; }
int ibv_read_err_comp_cntr(ibv_comp_cntr* counter, uint64_t*) { return counter ? EOPNOTSUPP : EINVAL; }
int ibv_qp_attach_comp_cntr(ibv_qp* qp, ibv_comp_cntr*, ibv_qp_attach_comp_cntr_attr*) {
  return qp ? EOPNOTSUPP : EINVAL;
}

int ibv_set_ece(ibv_qp* qp, ibv_ece* ece) { return qp && ece ? EOPNOTSUPP : EINVAL; }
int ibv_query_ece(ibv_qp* qp, ibv_ece* ece) { return qp && ece ? EOPNOTSUPP : EINVAL; }

ibv_wq* ibv_create_wq(ibv_context* context, ibv_wq_init_attr*) {
  return fail_null<ibv_wq>(context ? EOPNOTSUPP : EINVAL);
}
int ibv_modify_wq(ibv_wq* wq, ibv_wq_attr*) { return wq ? EOPNOTSUPP : EINVAL; }
int ibv_destroy_wq(ibv_wq* wq) { return wq ? EOPNOTSUPP : EINVAL; }
ibv_rwq_ind_table* ibv_create_rwq_ind_table(ibv_context* context, ibv_rwq_ind_table_init_attr*) {
  return fail_null<ibv_rwq_ind_table>(context ? EOPNOTSUPP : EINVAL);
}
int ibv_destroy_rwq_ind_table(ibv_rwq_ind_table* table) { return table ? EOPNOTSUPP : EINVAL; }
