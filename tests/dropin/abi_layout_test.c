/* The drop-in's ABI: every size, offset and constant of abi_layout_fields.h is the same in
 * peercm's headers as in rdma-core 44's, which Debian's binaries were compiled with. Prints
 * each difference; exit 0 only when there is none. */
#include <stdio.h>
#include <string.h>

#include "abi_layout.h"

int main(void)
{
	if (layout_rdma_core_count != layout_peercm_count) {
		printf("the two halves measured %zu and %zu facts\n", layout_rdma_core_count, layout_peercm_count);
		return 1;
	}
	size_t differences = 0;
	for (size_t i = 0; i < layout_rdma_core_count; i++) {
		const struct layout_entry *want = &layout_rdma_core[i], *have = &layout_peercm[i];
		if (strcmp(want->what, have->what) != 0 || want->value != have->value) {
			printf("%s: rdma-core %llu, peercm %llu\n", want->what, want->value, have->value);
			differences++;
		}
	}
	printf("%zu facts compared (sizes, offsets, member sizes, constants), %zu differ\n", layout_rdma_core_count,
	       differences);
	/* the list must be the long one it is, not an empty shell */
	return differences == 0 && layout_rdma_core_count > 500 ? 0 : 1;
}
