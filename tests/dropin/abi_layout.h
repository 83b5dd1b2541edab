/* One measured fact of the ABI: a struct's size, a member's offset or size, a constant. */
#ifndef PEERCM_TESTS_DROPIN_ABI_LAYOUT_H
#define PEERCM_TESTS_DROPIN_ABI_LAYOUT_H

#include <stddef.h>

struct layout_entry {
	const char *what;
	unsigned long long value;
};

#define LAYOUT_SIZE(type) {#type " size", sizeof(type)},
#define LAYOUT_MEMBER(type, member)                                                          \
	{#type "." #member " offset", offsetof(type, member)},                               \
		{#type "." #member " size", sizeof(((type *)0)->member)},
#define LAYOUT_CONSTANT(name) {#name, (unsigned long long)(name)},

extern const struct layout_entry layout_rdma_core[];
extern const size_t layout_rdma_core_count;
extern const struct layout_entry layout_peercm[];
extern const size_t layout_peercm_count;

#endif
