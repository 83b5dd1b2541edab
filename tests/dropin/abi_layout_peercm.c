/* peercm's side of abi_layout_test: the same list measured on peercm's headers. */
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include "abi_layout.h"

#ifndef PEERCM_VERBS_API
#error "this half must be compiled against peercm's include directory"
#endif

const struct layout_entry layout_peercm[] = {
#include "abi_layout_fields.h"
};
const size_t layout_peercm_count = sizeof layout_peercm / sizeof layout_peercm[0];
