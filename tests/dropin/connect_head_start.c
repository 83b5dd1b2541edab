/* LD_PRELOAD for perftest 4.5-0.17's -R client over RoCE, used only after a run lost its
 * connect/listen race (run_case.sh): the client's second rdma_connect (its test QP's, right
 * after the last exchange on the first connection) waits HEAD_START_MS milliseconds (20 when
 * unset), giving the server the time to listen again that perftest's own retry (fixed
 * upstream: it reallocates its ids) should have given it. Nothing else is changed: the call
 * itself is the drop-in's. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <rdma/rdma_cma.h>
#include <stddef.h>
#include <stdlib.h>
#include <unistd.h>

int rdma_connect(struct rdma_cm_id *id, struct rdma_conn_param *conn_param)
{
	static int calls;
	int (*next)(struct rdma_cm_id *, struct rdma_conn_param *) =
		(int (*)(struct rdma_cm_id *, struct rdma_conn_param *))dlsym(RTLD_NEXT, "rdma_connect");
	if (next == NULL)
		return -1;
	if (calls++ > 0) {
		const char *ms = getenv("HEAD_START_MS");
		usleep((useconds_t)(ms != NULL ? atoi(ms) : 20) * 1000u);
	}
	return next(id, conn_param);
}
