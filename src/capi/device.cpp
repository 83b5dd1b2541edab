// The C API's two devices, one per transport ("peercm_iw0", an iWARP RNIC, and
// "peercm_roce0", a RoCEv2 channel adapter), their contexts, and the context of each device
// that the rdma_cm ids of its transport share, with its per-device protection domain.
#include <arpa/inet.h>
#include <endian.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <random>

#include "api/context_impl.hpp"
#include "capi/handles.hpp"
#include "peercm/version.hpp"

namespace peercm::capi {
namespace {

ibv_device make_device(Transport transport) {
  ibv_device device{};
  const char* name = transport == Transport::roce ? kRoceDeviceName : kIwarpDeviceName;
  device.node_type = transport == Transport::roce ? IBV_NODE_CA : IBV_NODE_RNIC;
  device.transport_type = transport == Transport::roce ? IBV_TRANSPORT_IB : IBV_TRANSPORT_IWARP;
  std::strncpy(device.name, name, sizeof device.name - 1);
  std::strncpy(device.dev_name, name, sizeof device.dev_name - 1);
  return device;
}

// Indexed by Transport.
std::array<ibv_device, 2> g_devices{make_device(Transport::iwarp), make_device(Transport::roce)};

std::size_t index_of(Transport transport) { return transport == Transport::roce ? 1 : 0; }

// Lets a PD that outlived its device's hold go with its last user.
void free_pd(ibv_pd* pd) {
  ibv_context* context = pd->context;
  delete state_of<PdState>(pd);
  delete reinterpret_cast<PdShell*>(pd);
  release(context);
}

// The contexts rdma_cm ids share, one per device, as librdmacm keeps each device it opened
// until the process exits: an application may keep the PD, CQs and QPs it made on `id->verbs`
// across ids (cmtime does), so the context must not change under them when its last id goes.
struct CmDevices {
  std::mutex mutex;
  std::array<ibv_context*, 2> contexts{};  // by Transport; guarded by `mutex`
  // RoCE contexts the application opened (ibv_open_device) and has not closed, oldest first;
  // guarded by `mutex`. The first RoCE id adopts the oldest (cm_context()).
  std::vector<ibv_context*> opened_roce;
  // fork(): the contexts' progress threads pause across it, so that no lock they might hold
  // (an allocator's, ASan's among them) is copied into the child held by a thread the child
  // does not have. The child leaves the contexts to its parent.
  CmDevices() {
    ::pthread_atfork(
        [] {
          CmDevices& cm = g_cm();
          cm.mutex.lock();
          cm.for_each_threaded([](detail::ContextImpl& impl) { impl.reactor.stop_thread(); });
        },
        [] {
          CmDevices& cm = g_cm();
          cm.for_each_threaded([](detail::ContextImpl& impl) { impl.reactor.start_thread(); });
          cm.mutex.unlock();
        },
        [] {
          CmDevices& cm = g_cm();
          for (ibv_context*& context : cm.contexts)
            if (context) left_by_fork().push_back(std::exchange(context, nullptr));
          // Nor does it adopt one it inherited for rdma_cm: its thread is the parent's.
          cm.opened_roce.clear();
          cm.mutex.unlock();
        });
  }

  template <class F>
  void for_each_threaded(F&& f) {
    for (ibv_context* context : contexts)
      if (context && cpp_context(context).progress_mode() == ProgressMode::thread) f(cpp_context(context).impl());
  }

  // Contexts a fork() child inherited: their progress threads stayed in the parent, so the
  // child opens its own and never touches these. Never freed, and held by a plain pointer
  // that static destruction leaves alone, so they stay reachable at exit (no false leak).
  static std::vector<ibv_context*>& left_by_fork() {
    static auto* contexts = new std::vector<ibv_context*>;
    return *contexts;
  }

  // Process exit (or the library's unloading): the process's hold on each context goes. A
  // context whose objects are all destroyed closes now (its progress thread is joined); one
  // the application still holds objects of lives on with them, as a PD it leaks would.
  ~CmDevices() {
    for (ibv_context*& slot : contexts) {
      ibv_context* context = std::exchange(slot, nullptr);
      if (!context) continue;
      ibv_pd* default_pd = nullptr;
      bool free_now = false;
      {
        std::lock_guard lock(mutex);
        default_pd = std::exchange(state_of<ContextState>(context)->default_pd, nullptr);
        if (default_pd) {
          PdState* pd = state_of<PdState>(default_pd);
          free_now = pd->users.load() == 0;
          pd->orphaned = !free_now;  // else its last user frees it
        }
      }
      if (free_now) free_pd(default_pd);
      release(context);
    }
  }

  static CmDevices& g_cm();
};

CmDevices g_cm_devices;
CmDevices& CmDevices::g_cm() { return g_cm_devices; }

}  // namespace

Transport default_transport() {
  const char* name = std::getenv("PEERCM_TRANSPORT");
  return name != nullptr && std::strcmp(name, "roce") == 0 ? Transport::roce : Transport::iwarp;
}

void make_blocking(int fd) {
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
}

bool nonblocking(int fd) {
  const int flags = ::fcntl(fd, F_GETFL);
  return flags >= 0 && (flags & O_NONBLOCK);
}

ibv_context* open_context(Transport transport) {
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
  shell->state->transport = transport;
  // A RoCE device numbers its QPs within the context's slot from the first one on, so that
  // they work on an address other processes share (docs/roce-transport.md).
  if (transport == Transport::roce) {
    std::lock_guard lock(shell->state->cpp->impl().mutex);
    shell->state->cpp->impl().want_roce_slot();
  }
  ibv_context& pub = shell->ext.context;
  fill_extended_ops(shell->ext);
  pub.device = &g_devices[index_of(transport)];
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

Transport transport_of(ibv_context* context) { return state_of<ContextState>(context)->transport; }

void retain(ibv_context* context) { state_of<ContextState>(context)->refs.fetch_add(1); }

void release(ibv_context* context) {
  ContextState* state = state_of<ContextState>(context);
  if (state->refs.fetch_sub(1) != 1) return;
  state->cpp.reset();  // stops the progress thread
  ::close(context->async_fd);
  pthread_mutex_destroy(&context->mutex);
  delete state;
  delete shell_of(context);
}

Context& cpp_context(ibv_context* context) { return *state_of<ContextState>(context)->cpp; }

ibv_context* cm_context(Transport transport) {
  std::lock_guard lock(g_cm_devices.mutex);
  ibv_context*& context = g_cm_devices.contexts[index_of(transport)];
  if (context) return context;
  if (transport == Transport::roce && !g_cm_devices.opened_roce.empty()) {
    // A RoCE context's addresses (its GIDs, its UDP 4791 sockets) are its own, where a RoCE
    // NIC has one GID table for all its contexts. rdma_cm therefore runs on the RoCE context
    // the application opened: the GID it reads there is the address its ids bind and
    // resolve from (perftest -R binds its ids to the GID of its own context).
    context = g_cm_devices.opened_roce.front();
    retain(context);
    return context;
  }
  context = open_context(transport);
  return context;
}

ibv_pd* cm_default_pd(ibv_context* context) {
  std::lock_guard lock(g_cm_devices.mutex);
  ContextState* state = state_of<ContextState>(context);
  if (!state->default_pd) state->default_pd = ibv_alloc_pd(context);
  return state->default_pd;
}

void release_pd_user(ibv_pd* pd) {
  PdState* state = state_of<PdState>(pd);
  if (state->users.fetch_sub(1) != 1) return;
  bool free_now = false;
  {
    // Decided under the CM lock, where the exit orphans it: exactly one frees.
    std::lock_guard lock(g_cm_devices.mutex);
    free_now = state->orphaned && state->users.load() == 0;
    if (free_now) state->orphaned = false;
  }
  if (free_now) free_pd(pd);
}

}  // namespace peercm::capi

using namespace peercm;
using namespace peercm::capi;

// --- devices ---

// The device of PEERCM_TRANSPORT first: a program that takes the first device gets the
// transport the user asked for, and one given `-d` picks by name as on real hardware.
ibv_device** ibv_get_device_list(int* num_devices) {
  auto** list = static_cast<ibv_device**>(std::calloc(g_devices.size() + 1, sizeof(ibv_device*)));
  if (!list) {
    errno = ENOMEM;
    return nullptr;
  }
  const Transport first = default_transport();
  const Transport second = first == Transport::roce ? Transport::iwarp : Transport::roce;
  list[0] = &g_devices[index_of(first)];
  list[1] = &g_devices[index_of(second)];
  if (num_devices) *num_devices = static_cast<int>(g_devices.size());
  return list;
}

void ibv_free_device_list(ibv_device** list) { std::free(list); }

const char* ibv_get_device_name(ibv_device* device) { return device ? device->name : nullptr; }

// A device's GUID in listings (ibv_devices): drawn once per process for each device and never
// zero. Each opened context is a node of its own and reports its own node GUID
// (ibv_query_device).
__be64 ibv_get_device_guid(ibv_device* device) {
  static const std::array<std::uint64_t, 2> guids = [] {
    std::random_device source;
    std::array<std::uint64_t, 2> drawn{};
    for (std::uint64_t& guid : drawn) {
      while (guid == 0) guid = (std::uint64_t{source()} << 32) | source();
    }
    return drawn;
  }();
  static_assert(std::tuple_size_v<decltype(g_devices)> == std::tuple_size_v<decltype(guids)>);
  for (std::size_t i = 0; i < g_devices.size(); ++i) {
    if (device == &g_devices[i]) return htobe64(guids[i]);
  }
  return 0;
}

ibv_context* ibv_open_device(ibv_device* device) {
  for (ibv_device& known : g_devices)
    if (device == &known) {
      const Transport transport =
          &known == &g_devices[index_of(Transport::roce)] ? Transport::roce : Transport::iwarp;
      ibv_context* context = open_context(transport);
      if (context && transport == Transport::roce) {
        std::lock_guard lock(g_cm_devices.mutex);
        g_cm_devices.opened_roce.push_back(context);
      }
      return context;
    }
  errno = ENODEV;
  return nullptr;
}

int ibv_close_device(ibv_context* context) {
  if (!context) return EINVAL;
  {
    std::lock_guard lock(g_cm_devices.mutex);
    std::erase(g_cm_devices.opened_roce, context);
  }
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
  // An iWARP Read has one sink buffer (RFC 5040 §4.4); an IB Read Request scatters its
  // responses over the WR's SGEs.
  attr->max_sge_rd = transport_of(context) == Transport::roce ? kMaxSge : 1;
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
  // iWARP: an MPA FPDU fits a 1500-byte Ethernet frame. RoCE: the path MTU of a connection
  // that leaves the host (1024 fits a 1500-byte frame with its headers); between two
  // loopback addresses the QPs use 4096 on their own.
  attr->active_mtu = IBV_MTU_1024;
  attr->gid_tbl_len = transport_of(context) == Transport::roce ? kRoceGidTableLength : 1;
  attr->max_msg_sz = UINT32_MAX;
  attr->pkey_tbl_len = 1;
  attr->active_width = 1;
  attr->active_speed = 1;
  attr->phys_state = 5;  // LinkUp
  attr->link_layer = IBV_LINK_LAYER_ETHERNET;
  return 0;
}

int ibv_query_gid(ibv_context* context, uint8_t port_num, int index, ibv_gid* gid) {
  if (!context || !gid || port_num != 1 || index < 0) return -1;
  *gid = ibv_gid{};
  if (transport_of(context) == Transport::iwarp) {
    if (index != 0) return -1;
    gid->global.interface_id = htobe64(cpp_context(context).node_guid());
    return 0;
  }
  if (index >= kRoceGidTableLength) return -1;
  // Index 0 is the context's own 127/8 address, then the host's interface addresses
  // (verbs_roce.cpp); entries past them are empty (all zeros), as on any RoCE device.
  if (roce_query_gid(context, index, gid) != 0) *gid = ibv_gid{};
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
