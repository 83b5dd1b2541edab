/* rdma-core 44's side of abi_layout_test: compiled with the system's headers only
 * (Debian's libibverbs-dev and librdmacm-dev), never peercm's. */
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include "abi_layout.h"

const struct layout_entry layout_rdma_core[] = {
#include "abi_layout_fields.h"
};
const size_t layout_rdma_core_count = sizeof layout_rdma_core / sizeof layout_rdma_core[0];
