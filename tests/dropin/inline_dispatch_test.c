/* Built against rdma-core 44's headers and libibverbs (the system's), run on the drop-in
 * libibverbs.so.1: the calls rdma-core compiles inline into a program (ibv_query_port,
 * ibv_query_device_ex, ibv_create_cq_ex, ibv_create_qp_ex, ibv_wr_*, ibv_poll_cq,
 * ibv_post_send, ...) must reach peercm through the verbs_context table, and the verbs
 * peercm lacks must fail as on a provider without them: EOPNOTSUPP. The data path (Sends,
 * Writes and Reads between two processes) is the Debian binaries' cases (run_case.sh); this
 * program checks the dispatch itself and the refusals. */
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures;

#define CHECK(cond, ...)                                                                    \
	do {                                                                                \
		if (!(cond)) {                                                              \
			printf("FAIL %s:%d: ", __FILE__, __LINE__);                         \
			printf(__VA_ARGS__);                                                \
			printf("\n");                                                       \
			failures++;                                                         \
		}                                                                           \
	} while (0)

static struct ibv_context *open_by_name(const char *name)
{
	int count = 0;
	struct ibv_device **list = ibv_get_device_list(&count);
	struct ibv_context *context = NULL;
	for (int i = 0; list && i < count; i++)
		if (strcmp(ibv_get_device_name(list[i]), name) == 0)
			context = ibv_open_device(list[i]);
	ibv_free_device_list(list);
	return context;
}

static void check_device(const char *name, int roce)
{
	struct ibv_context *context = open_by_name(name);
	CHECK(context, "%s not opened (is this running on peercm's drop-in?)", name);
	if (!context)
		return;

	/* abi_compat says the context sits in a verbs_context: without it every extended verb
	 * below would quietly take rdma-core's legacy path or fail with EOPNOTSUPP */
	CHECK(verbs_get_ctx(context) != NULL, "abi_compat %p is not rdma-core's extended marker", context->abi_compat);

	/* ___ibv_query_port: verbs_context.query_port with rdma-core 44's sizeof */
	struct ibv_port_attr port;
	memset(&port, 0xa5, sizeof port);
	CHECK(ibv_query_port(context, 1, &port) == 0, "ibv_query_port");
	CHECK(port.state == IBV_PORT_ACTIVE && port.link_layer == IBV_LINK_LAYER_ETHERNET,
	      "port state %d link layer %d", port.state, port.link_layer);
	CHECK(port.gid_tbl_len == (roce ? 16 : 1), "gid_tbl_len %d", port.gid_tbl_len);

	/* ibv_query_device_ex: verbs_context.query_device_ex */
	struct ibv_device_attr_ex attr_ex;
	memset(&attr_ex, 0xa5, sizeof attr_ex);
	CHECK(ibv_query_device_ex(context, NULL, &attr_ex) == 0, "ibv_query_device_ex");
	CHECK(attr_ex.orig_attr.max_qp_wr == 16384 && attr_ex.orig_attr.phys_port_cnt == 1, "device_attr_ex");
	CHECK(attr_ex.odp_caps.general_caps == 0, "no on-demand paging");

	/* ibv_query_gid_ex: _ibv_query_gid_ex with rdma-core 44's entry size */
	struct ibv_gid_entry entry;
	CHECK(ibv_query_gid_ex(context, 1, 0, &entry, 0) == 0, "ibv_query_gid_ex");
	CHECK(entry.gid_type == (roce ? IBV_GID_TYPE_ROCE_V2 : IBV_GID_TYPE_IB), "gid type %u", entry.gid_type);

	struct ibv_pd *pd = ibv_alloc_pd(context);
	CHECK(pd, "ibv_alloc_pd");

	/* ibv_create_cq_ex (verbs_context.create_cq_ex), then an empty poll through its table */
	struct ibv_comp_channel *channel = ibv_create_comp_channel(context);
	CHECK(channel, "ibv_create_comp_channel");
	struct ibv_cq_init_attr_ex cq_attr = {.cqe = 16, .channel = channel, .wc_flags = IBV_WC_EX_WITH_BYTE_LEN};
	struct ibv_cq_ex *cq_ex = ibv_create_cq_ex(context, &cq_attr);
	CHECK(cq_ex, "ibv_create_cq_ex: errno %d", errno);
	if (cq_ex) {
		struct ibv_poll_cq_attr poll_attr = {0};
		CHECK(ibv_start_poll(cq_ex, &poll_attr) == ENOENT, "an empty CQ's start_poll is ENOENT");
		struct ibv_wc wc;
		/* ibv_poll_cq: ops.poll_cq on the same CQ */
		CHECK(ibv_poll_cq(ibv_cq_ex_to_cq(cq_ex), 1, &wc) == 0, "ibv_poll_cq on an empty CQ");
		/* ibv_req_notify_cq: ops.req_notify_cq */
		CHECK(ibv_req_notify_cq(ibv_cq_ex_to_cq(cq_ex), 0) == 0, "ibv_req_notify_cq");
	}

	/* ibv_create_qp_ex with send_ops_flags (verbs_context.create_qp_ex), ibv_qp_to_qp_ex */
	struct ibv_qp_init_attr_ex qp_attr = {
		.send_cq = ibv_cq_ex_to_cq(cq_ex),
		.recv_cq = ibv_cq_ex_to_cq(cq_ex),
		.cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1},
		.qp_type = IBV_QPT_RC,
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
		.pd = pd,
		.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_WRITE,
	};
	struct ibv_qp *qp = cq_ex ? ibv_create_qp_ex(context, &qp_attr) : NULL;
	CHECK(qp, "ibv_create_qp_ex: errno %d", errno);
	if (qp) {
		struct ibv_qp_ex *qpx = ibv_qp_to_qp_ex(qp);
		CHECK(qpx, "ibv_qp_to_qp_ex");
		if (qpx) {
			/* a batch on a QP that is not connected: built through the table, then refused
			 * at completion (not RTS) or accepted for later: either way it returns */
			ibv_wr_start(qpx);
			ibv_wr_abort(qpx);
		}
		/* ibv_post_recv: ops.post_recv */
		char buffer[64];
		struct ibv_mr *mr = ibv_reg_mr(pd, buffer, sizeof buffer, IBV_ACCESS_LOCAL_WRITE);
		CHECK(mr, "ibv_reg_mr");
		if (mr) {
			struct ibv_sge sge = {.addr = (uintptr_t)buffer, .length = sizeof buffer, .lkey = mr->lkey};
			struct ibv_recv_wr recv = {.wr_id = 1, .sg_list = &sge, .num_sge = 1}, *bad = NULL;
			CHECK(ibv_post_recv(qp, &recv, &bad) == 0, "ibv_post_recv");
		}
		CHECK(ibv_destroy_qp(qp) == 0, "ibv_destroy_qp");
		if (mr)
			CHECK(ibv_dereg_mr(mr) == 0, "ibv_dereg_mr");
	}
	/* ibv_reg_mr with an optional access flag: rdma-core's macro calls ibv_reg_mr_iova2 */
	static char relaxed[4096];
	struct ibv_mr *relaxed_mr =
		ibv_reg_mr(pd, relaxed, sizeof relaxed, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_RELAXED_ORDERING);
	CHECK(relaxed_mr, "ibv_reg_mr with IBV_ACCESS_RELAXED_ORDERING: errno %d", errno);
	if (relaxed_mr)
		ibv_dereg_mr(relaxed_mr);

	/* what peercm lacks: EOPNOTSUPP, as from a provider without the feature */
	errno = 0;
	CHECK(ibv_alloc_td(context, &(struct ibv_td_init_attr){0}) == NULL && errno == EOPNOTSUPP,
	      "ibv_alloc_td: errno %d", errno);
	errno = 0;
	CHECK(ibv_open_xrcd(context, &(struct ibv_xrcd_init_attr){0}) == NULL && errno == EOPNOTSUPP,
	      "ibv_open_xrcd: errno %d", errno);
	errno = 0;
	CHECK(ibv_alloc_dm(context, &(struct ibv_alloc_dm_attr){.length = 64}) == NULL && errno == EOPNOTSUPP,
	      "ibv_alloc_dm: errno %d", errno);
	errno = 0;
	CHECK(ibv_alloc_mw(pd, IBV_MW_TYPE_1) == NULL && errno == EOPNOTSUPP, "ibv_alloc_mw: errno %d", errno);
	errno = 0;
	CHECK(ibv_reg_dmabuf_mr(pd, 0, 4096, 0, -1, IBV_ACCESS_LOCAL_WRITE) == NULL && errno == EOPNOTSUPP,
	      "ibv_reg_dmabuf_mr: errno %d", errno);
	errno = 0;
	CHECK(ibv_alloc_null_mr(pd) == NULL && errno == EOPNOTSUPP, "ibv_alloc_null_mr: errno %d", errno);
	if (cq_ex) {
		struct ibv_modify_cq_attr moderate = {.attr_mask = IBV_CQ_ATTR_MODERATE};
		CHECK(ibv_modify_cq(ibv_cq_ex_to_cq(cq_ex), &moderate) == EOPNOTSUPP, "ibv_modify_cq");
		CHECK(ibv_destroy_cq(ibv_cq_ex_to_cq(cq_ex)) == 0, "ibv_destroy_cq");
	}
	if (channel)
		CHECK(ibv_destroy_comp_channel(channel) == 0, "ibv_destroy_comp_channel");
	CHECK(ibv_is_fork_initialized() == IBV_FORK_UNNEEDED, "ibv_is_fork_initialized");
	if (pd)
		CHECK(ibv_dealloc_pd(pd) == 0, "ibv_dealloc_pd");
	CHECK(ibv_close_device(context) == 0, "ibv_close_device");
	printf("%s: extended verbs dispatched, unsupported ones EOPNOTSUPP\n", name);
}

int main(void)
{
	check_device("peercm_iw0", 0);
	check_device("peercm_roce0", 1);
	printf("%d failures\n", failures);
	return failures == 0 ? 0 : 1;
}
