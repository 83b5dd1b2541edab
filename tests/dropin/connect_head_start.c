/* LD_PRELOAD for perftest 4.5-0.17's -R client over RoCE, used only after a run lost its
 * connect/listen race (run_case.sh): the client's second rdma_connect (its test QP's, right
 * after the last exchange on the first connection) waits 20 ms, giving the server the time
 * to listen again that perftest's own retry (fixed upstream: it reallocates its ids) should
 * have given it. Nothing else is changed: the call itself is the drop-in's. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <rdma/rdma_cma.h>
#include <stddef.h>
#include <unistd.h>

int rdma_connect(struct rdma_cm_id *id, struct rdma_conn_param *conn_param)
{
	static int calls;
	int (*next)(struct rdma_cm_id *, struct rdma_conn_param *) =
		(int (*)(struct rdma_cm_id *, struct rdma_conn_param *))dlsym(RTLD_NEXT, "rdma_connect");
	if (next == NULL)
		return -1;
	if (calls++ > 0)
		usleep(20000);
	return next(id, conn_param);
}
