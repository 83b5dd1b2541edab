// The one device of the C API ("peercm0", an iWARP RNIC), its contexts, and the context
// that rdma_cm ids share with their per-device protection domain.
#include <endian.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <random>

#include "capi/handles.hpp"
#include "peercm/version.hpp"

namespace peercm::capi {
namespace {

ibv_device make_device() {
  ibv_device device{};
  device.node_type = IBV_NODE_RNIC;
  device.transport_type = IBV_TRANSPORT_IWARP;
  std::strncpy(device.name, "peercm0", sizeof device.name - 1);
  std::strncpy(device.dev_name, "peercm0", sizeof device.dev_name - 1);
  return device;
}

ibv_device g_device = make_device();

struct CmDevice {
  std::mutex mutex;
  ibv_context* context = nullptr;
  int users = 0;  // rdma_cm ids and rdma_get_devices() lists
};
CmDevice g_cm;

// Lets a PD that outlived its device's hold go with its last user.
void free_pd(ibv_pd* pd) {
  ibv_context* context = pd->context;
  delete state_of<PdState>(pd);
  delete reinterpret_cast<PdShell*>(pd);
  release(context);
}

}  // namespace

void make_blocking(int fd) {
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
}

bool nonblocking(int fd) {
  const int flags = ::fcntl(fd, F_GETFL);
  return flags >= 0 && (flags & O_NONBLOCK);
}

ibv_context* open_context() {
  auto cpp = Context::open();
  if (!cpp) {
    errno = errno_of(cpp.error());
    return nullptr;
  }
  const int async_fd = ::eventfd(0, EFD_CLOEXEC);
  if (async_fd < 0) return nullptr;
  auto* shell = new ContextShell{};
  shell->state = new ContextState{};
  shell->state->cpp = std::move(*cpp);
  ibv_context& pub = shell->pub;
  pub.device = &g_device;
  pub.cmd_fd = -1;
  pub.async_fd = async_fd;
  pub.num_comp_vectors = 1;
  pthread_mutex_init(&pub.mutex, nullptr);
  pub.ops.poll_cq = ibv_poll_cq;
  pub.ops.req_notify_cq = ibv_req_notify_cq;
  pub.ops.post_send = ibv_post_send;
  pub.ops.post_recv = ibv_post_recv;
  pub.ops.post_srq_recv = ibv_post_srq_recv;
  return &pub;
}

void retain(ibv_context* context) { state_of<ContextState>(context)->refs.fetch_add(1); }

void release(ibv_context* context) {
  ContextState* state = state_of<ContextState>(context);
  if (state->refs.fetch_sub(1) != 1) return;
  state->cpp.reset();  // stops the progress thread
  ::close(context->async_fd);
  pthread_mutex_destroy(&context->mutex);
  delete state;
  delete reinterpret_cast<ContextShell*>(context);
}

Context& cpp_context(ibv_context* context) { return *state_of<ContextState>(context)->cpp; }

ibv_context* acquire_cm_context() {
  std::lock_guard lock(g_cm.mutex);
  if (!g_cm.context) {
    g_cm.context = open_context();
    if (!g_cm.context) return nullptr;
  }
  ++g_cm.users;
  return g_cm.context;
}

void release_cm_context() {
  ibv_context* closing = nullptr;
  ibv_pd* default_pd = nullptr;
  {
    std::lock_guard lock(g_cm.mutex);
    if (--g_cm.users > 0) return;
    closing = g_cm.context;
    g_cm.context = nullptr;
    default_pd = state_of<ContextState>(closing)->default_pd;
    state_of<ContextState>(closing)->default_pd = nullptr;
  }
  if (default_pd) {
    bool free_now = false;
    {
      std::lock_guard lock(g_cm.mutex);
      PdState* pd = state_of<PdState>(default_pd);
      pd->orphaned = true;
      free_now = pd->users.load() == 0;
    }
    if (free_now) free_pd(default_pd);
  }
  release(closing);
}

ibv_pd* cm_default_pd(ibv_context* context) {
  std::lock_guard lock(g_cm.mutex);
  ContextState* state = state_of<ContextState>(context);
  if (!state->default_pd) state->default_pd = ibv_alloc_pd(context);
  return state->default_pd;
}

void release_pd_user(ibv_pd* pd) {
  PdState* state = state_of<PdState>(pd);
  if (state->users.fetch_sub(1) != 1) return;
  bool free_now = false;
  {
    // Decided under the CM lock, where release_cm_context() orphans it: exactly one frees.
    std::lock_guard lock(g_cm.mutex);
    free_now = state->orphaned && state->users.load() == 0;
    if (free_now) state->orphaned = false;
  }
  if (free_now) free_pd(pd);
}

}  // namespace peercm::capi

using namespace peercm::capi;

// --- devices ---

ibv_device** ibv_get_device_list(int* num_devices) {
  auto** list = static_cast<ibv_device**>(std::calloc(2, sizeof(ibv_device*)));
  if (!list) {
    errno = ENOMEM;
    return nullptr;
  }
  list[0] = &g_device;
  if (num_devices) *num_devices = 1;
  return list;
}

void ibv_free_device_list(ibv_device** list) { std::free(list); }

const char* ibv_get_device_name(ibv_device* device) { return device ? device->name : nullptr; }

// The device's GUID in listings (ibv_devices): drawn once per process and never zero. Each
// opened context is a node of its own and reports its own node GUID (ibv_query_device).
__be64 ibv_get_device_guid(ibv_device* device) {
  if (device != &g_device) return 0;
  static const std::uint64_t guid = [] {
    std::random_device source;
    std::uint64_t drawn = 0;
    while (drawn == 0) drawn = (std::uint64_t{source()} << 32) | source();
    return drawn;
  }();
  return htobe64(guid);
}

ibv_context* ibv_open_device(ibv_device* device) {
  if (device != &g_device) {
    errno = ENODEV;
    return nullptr;
  }
  return open_context();
}

int ibv_close_device(ibv_context* context) {
  if (!context) return EINVAL;
  release(context);
  return 0;
}

int ibv_query_device(ibv_context* context, ibv_device_attr* attr) {
  if (!context || !attr) return EINVAL;
  *attr = ibv_device_attr{};
  const std::string_view version = peercm::version();
  std::snprintf(attr->fw_ver, sizeof attr->fw_ver, "peercm %.*s", static_cast<int>(version.size()), version.data());
  attr->node_guid = htobe64(cpp_context(context).node_guid());
  attr->sys_image_guid = attr->node_guid;
  attr->max_mr_size = UINT64_MAX;
  attr->page_size_cap = 4096;
  attr->max_qp = 1 << 16;
  attr->max_qp_wr = kMaxQpWr;
  attr->device_cap_flags = IBV_DEVICE_CURR_QP_STATE_MOD;
  attr->max_sge = kMaxSge;
  attr->max_sge_rd = 1;  // an iWARP Read has one sink buffer (RFC 5040 §4.4)
  attr->max_cq = 1 << 16;
  attr->max_cqe = kMaxCqe;
  attr->max_mr = 1 << 20;
  attr->max_pd = 1 << 16;
  attr->max_qp_rd_atom = kMaxRdAtom;
  attr->max_res_rd_atom = kMaxRdAtom;
  attr->max_qp_init_rd_atom = kMaxRdAtom;
  attr->max_srq = kMaxSrq;
  attr->max_srq_wr = kMaxSrqWr;
  attr->max_srq_sge = kMaxSge;
  attr->atomic_cap = IBV_ATOMIC_NONE;
  attr->max_pkeys = 1;
  attr->phys_port_cnt = 1;
  return 0;
}

int ibv_query_port(ibv_context* context, uint8_t port_num, ibv_port_attr* attr) {
  if (!context || !attr || port_num != 1) return EINVAL;
  *attr = ibv_port_attr{};
  attr->state = IBV_PORT_ACTIVE;
  attr->max_mtu = IBV_MTU_4096;
  attr->active_mtu = IBV_MTU_1024;  // an MPA FPDU fits a 1500-byte Ethernet frame
  attr->gid_tbl_len = 1;
  attr->max_msg_sz = UINT32_MAX;
  attr->pkey_tbl_len = 1;
  attr->active_width = 1;
  attr->active_speed = 1;
  attr->phys_state = 5;  // LinkUp
  attr->link_layer = IBV_LINK_LAYER_ETHERNET;
  return 0;
}

int ibv_query_gid(ibv_context* context, uint8_t port_num, int index, ibv_gid* gid) {
  if (!context || !gid || port_num != 1) return -1;
  if (uses_roce(context)) return roce_query_gid(context, index, gid);  // verbs_roce.cpp
  if (index != 0) return -1;
  *gid = ibv_gid{};
  gid->global.interface_id = htobe64(cpp_context(context).node_guid());
  return 0;
}

int ibv_query_pkey(ibv_context* context, uint8_t port_num, int index, __be16* pkey) {
  if (!context || !pkey || port_num != 1 || index != 0) return -1;
  *pkey = htobe16(0xFFFF);
  return 0;
}

// No asynchronous events are generated: errors reach the application as completions and
// CM events. The call blocks as it would on a quiet device, or says EAGAIN when asked not to.
int ibv_get_async_event(ibv_context* context, ibv_async_event*) {
  if (!context) return fail_errno(EINVAL);
  const int flags = ::fcntl(context->async_fd, F_GETFL);
  if (flags >= 0 && (flags & O_NONBLOCK)) return fail_errno(EAGAIN);
  pollfd pfd{context->async_fd, POLLIN, 0};
  for (;;) ::poll(&pfd, 1, -1);
}

void ibv_ack_async_event(ibv_async_event*) {}

int ibv_fork_init() { return 0; }  // no pinned pages: nothing to protect across fork()

// --- names ---

const char* ibv_wc_status_str(ibv_wc_status status) {
  static const char* const names[] = {
      "success",
      "local length error",
      "local QP operation error",
      "local EE context operation error",
      "local protection error",
      "Work Request Flushed Error",
      "memory management operation error",
      "bad response error",
      "local access error",
      "remote invalid request error",
      "remote access error",
      "remote operation error",
      "transport retry counter exceeded",
      "RNR retry counter exceeded",
      "local RDD violation error",
      "remote invalid RD request",
      "aborted error",
      "invalid EE context number",
      "invalid EE context state",
      "fatal error",
      "response timeout error",
      "general error",
      "TM error",
      "TM software rendezvous",
  };
  const auto i = static_cast<std::size_t>(status);
  return i < std::size(names) ? names[i] : "unknown";
}

const char* ibv_node_type_str(ibv_node_type node_type) {
  switch (node_type) {
    case IBV_NODE_CA: return "InfiniBand channel adapter";
    case IBV_NODE_SWITCH: return "InfiniBand switch";
    case IBV_NODE_ROUTER: return "InfiniBand router";
    case IBV_NODE_RNIC: return "iWARP NIC";
    case IBV_NODE_USNIC: return "usNIC";
    case IBV_NODE_USNIC_UDP: return "usNIC UDP";
    case IBV_NODE_UNSPECIFIED: return "unspecified";
    case IBV_NODE_UNKNOWN: break;
  }
  return "unknown";
}

const char* ibv_port_state_str(ibv_port_state port_state) {
  switch (port_state) {
    case IBV_PORT_NOP: return "PORT_NOP";
    case IBV_PORT_DOWN: return "PORT_DOWN";
    case IBV_PORT_INIT: return "PORT_INIT";
    case IBV_PORT_ARMED: return "PORT_ARMED";
    case IBV_PORT_ACTIVE: return "PORT_ACTIVE";
    case IBV_PORT_ACTIVE_DEFER: return "PORT_ACTIVE_DEFER";
  }
  return "invalid state";
}

const char* ibv_event_type_str(ibv_event_type event) {
  static const char* const names[] = {
      "CQ error",          "local work queue catastrophic error", "invalid request local work queue error",
      "local access violation work queue error", "communication established", "send queue drained",
      "path migrated",     "path migration request error",       "local catastrophic error",
      "port active",       "port error",                         "LID change",
      "P_Key change",      "SM change",                          "SRQ catastrophic error",
      "SRQ limit reached", "last WQE reached",                   "client reregistration",
      "GID table change",  "WQ fatal",
  };
  const auto i = static_cast<std::size_t>(event);
  return i < std::size(names) ? names[i] : "unknown";
}
