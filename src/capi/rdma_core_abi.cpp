// What code compiled against rdma-core's own headers calls that peercm's headers spell
// otherwise: the verbs_context table of extended verbs (rdma-core's inline functions call
// through it, passing the size of the struct they were compiled with), and the exported
// entry points those inline functions and macros expand to (_ibv_query_gid_ex,
// ibv_reg_mr_iova2, ...). Each one forwards to the verb that peercm's own API implements, so
// there is one implementation of every verb; this file only adapts calling conventions.
// The drop-in libibverbs.so.1 exports these under rdma-core's symbol versions (dropin/).
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "capi/handles.hpp"

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wold-style-cast"
#pragma GCC diagnostic ignored "-Wsign-conversion"
#pragma GCC diagnostic ignored "-Wconversion"
#include <infiniband/driver.h>
#pragma GCC diagnostic pop

namespace peercm::capi {
namespace {

// The caller's struct may be an older (shorter) or newer (longer) one than peercm's: the
// common prefix is copied and any tail the caller has beyond it is zeroed.
void copy_sized(void* out, std::size_t out_size, const void* in, std::size_t in_size) {
  const std::size_t common = out_size < in_size ? out_size : in_size;
  std::memcpy(out, in, common);
  if (out_size > common) std::memset(static_cast<unsigned char*>(out) + common, 0, out_size - common);
}

int query_port_sized(ibv_context* context, uint8_t port_num, ibv_port_attr* attr, std::size_t attr_size) {
  if (!attr) return EINVAL;
  ibv_port_attr full{};
  const int rc = ibv_query_port(context, port_num, &full);
  if (rc == 0) copy_sized(attr, attr_size, &full, sizeof full);
  return rc;
}

int query_device_ex_sized(ibv_context* context, const ibv_query_device_ex_input* input, ibv_device_attr_ex* attr,
                          std::size_t attr_size) {
  if (!attr || attr_size < sizeof attr->orig_attr) return EINVAL;
  ibv_device_attr_ex full{};
  const int rc = ibv_query_device_ex(context, input, &full);
  if (rc == 0) copy_sized(attr, attr_size, &full, sizeof full);
  return rc;
}

}  // namespace

void fill_extended_ops(verbs_context& ext) {
  ext.query_port = query_port_sized;
  ext.query_device_ex = query_device_ex_sized;
  ext.create_cq_ex = ibv_create_cq_ex;
  ext.create_qp_ex = ibv_create_qp_ex;
  ext.create_srq_ex = ibv_create_srq_ex;
  ext.get_srq_num = ibv_get_srq_num;
  // Everything else stays NULL: rdma-core's inline callers answer a NULL entry with
  // EOPNOTSUPP (errno EOPNOTSUPP for those returning a pointer), as for a provider without
  // the feature, which is what peercm's own functions for them answer too.
  ext.sz = sizeof ext;
  ext.context.abi_compat = VERBS_ABI_IS_EXTENDED;
}

}  // namespace peercm::capi

// rdma-core's names for these; peercm's headers declare the ones its API offers as well.
extern "C" {
int _ibv_query_gid_ex(ibv_context* context, uint32_t port_num, uint32_t gid_index, ibv_gid_entry* entry,
                      uint32_t flags, size_t entry_size);
ssize_t _ibv_query_gid_table(ibv_context* context, ibv_gid_entry* entries, size_t max_entries, uint32_t flags,
                             size_t entry_size);
int ibv_dontfork_range(void* base, size_t size);
int ibv_dofork_range(void* base, size_t size);
}

int _ibv_query_gid_ex(ibv_context* context, uint32_t port_num, uint32_t gid_index, ibv_gid_entry* entry,
                      uint32_t flags, size_t entry_size) {
  if (!entry || entry_size < sizeof entry->gid) return EINVAL;
  ibv_gid_entry full{};
  const int rc = ibv_query_gid_ex(context, port_num, gid_index, &full, flags);
  if (rc == 0) peercm::capi::copy_sized(entry, entry_size, &full, sizeof full);
  return rc;
}

ssize_t _ibv_query_gid_table(ibv_context* context, ibv_gid_entry* entries, size_t max_entries, uint32_t flags,
                             size_t entry_size) {
  if (entry_size < sizeof(ibv_gid_entry)) return -EINVAL;
  std::vector<ibv_gid_entry> full(max_entries);
  const ssize_t count = ibv_query_gid_table(context, full.data(), max_entries, flags);
  for (ssize_t i = 0; i < count; ++i) {
    auto* out = reinterpret_cast<unsigned char*>(entries) + static_cast<std::size_t>(i) * entry_size;
    peercm::capi::copy_sized(out, entry_size, &full[static_cast<std::size_t>(i)], sizeof(ibv_gid_entry));
  }
  return count;
}

// peercm's MRs are addressed by their virtual address: an iova other than `addr` is a
// zero-based or offset MR, which it does not offer.
ibv_mr* ibv_reg_mr_iova2(ibv_pd* pd, void* addr, size_t length, uint64_t iova, unsigned int access) {
  if (iova != reinterpret_cast<std::uintptr_t>(addr)) {
    errno = EOPNOTSUPP;
    return nullptr;
  }
  // The optional access bits are hints a device may ignore (rdma-core's contract for them).
  return ibv_reg_mr(pd, addr, length, static_cast<int>(access & ~static_cast<unsigned>(IBV_ACCESS_OPTIONAL_RANGE)));
}

ibv_mr* ibv_reg_mr_iova(ibv_pd* pd, void* addr, size_t length, uint64_t iova, int access) {
  return ibv_reg_mr_iova2(pd, addr, length, iova, static_cast<unsigned>(access));
}

// No device memory to import a dma-buf into.
ibv_mr* ibv_reg_dmabuf_mr(ibv_pd* pd, uint64_t, size_t, uint64_t, int, int) {
  errno = pd ? EOPNOTSUPP : EINVAL;
  return nullptr;
}

// Registered memory is ordinary memory that the engine copies from and to: a fork() child
// neither shares nor breaks it, so fork protection is never needed.
ibv_fork_status ibv_is_fork_initialized(void) { return IBV_FORK_UNNEEDED; }
int ibv_dontfork_range(void*, size_t) { return 0; }
int ibv_dofork_range(void*, size_t) { return 0; }

// The devices have no sysfs directories of the kernel's. As in rdma-core, $SYSFS_PATH (read
// once, ignored in setuid programs, trailing slashes dropped) replaces /sys: Open MPI's openib
// BTL takes <path>/class/infiniband being a directory as the sign that verbs devices exist,
// so a tree holding that directory lets it see peercm's devices (docs/drop-in.md).
const char* ibv_get_sysfs_path(void) {
  static const std::string path = [] {
    const char* env = secure_getenv("SYSFS_PATH");
    std::string chosen = env && *env ? env : "/sys";
    while (chosen.size() > 1 && chosen.back() == '/') chosen.pop_back();
    return chosen;
  }();
  return path.c_str();
}
