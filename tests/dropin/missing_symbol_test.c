/* Built against rdma-core's headers and libibverbs, this program imports a function the
 * drop-in libibverbs does not offer (ibv_import_device, IBVERBS_1.10). Run through the
 * drop-in it must not start: the loader names the symbol and its version (CMakeLists.txt
 * checks the message). Run on rdma-core it prints the device count and exits 0. */
#include <infiniband/verbs.h>
#include <stdio.h>

int main(int argc, char **argv)
{
	(void)argv;
	int count = 0;
	struct ibv_device **list = ibv_get_device_list(&count);
	if (list)
		ibv_free_device_list(list);
	/* never reached with argc 1: referenced so that the import is there */
	if (argc > 5)
		return ibv_import_device(-1) == NULL;
	printf("%d devices\n", count);
	return 0;
}
