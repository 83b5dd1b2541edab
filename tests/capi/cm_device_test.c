/* rdma_cm over RoCE on the device context the application opened, as perftest -R uses it:
 * the program opens peercm_roce0 itself, its first id resolves (the CM picks the source
 * address), then it reads GID 0 of its own context and resolves a second id *from* that
 * GID's address. A RoCE NIC has one GID table for every context of the device, so that
 * address is one the CM can bind: the ids run on the application's context (id->verbs), and
 * GID 0 is the address the first id resolved from. Run with PEERCM_TRANSPORT=roce. */
#include <time.h>

#include "capi_test.h"

static struct ibv_context *open_roce_device(void)
{
	int count = 0;
	struct ibv_device **list = ibv_get_device_list(&count);
	CHECK(list);
	struct ibv_context *context = NULL;
	for (int i = 0; i < count && !context; ++i)
		if (strcmp(ibv_get_device_name(list[i]), "peercm_roce0") == 0)
			context = ibv_open_device(list[i]);
	ibv_free_device_list(list);
	CHECK(context);
	return context;
}

static void resolve(struct rdma_event_channel *channel, struct rdma_cm_id *id, struct sockaddr *src,
		    struct sockaddr_in *dst)
{
	CHECK_EQ(rdma_resolve_addr(id, src, (struct sockaddr *)dst, 2000), 0);
	struct rdma_cm_event *event = expect_event(channel, RDMA_CM_EVENT_ADDR_RESOLVED);
	CHECK_EQ(rdma_ack_cm_event(event), 0);
}

int main(void)
{
	const char *transport = getenv("PEERCM_TRANSPORT");
	CHECK(transport && strcmp(transport, "roce") == 0);
	srand((unsigned)time(NULL) ^ (unsigned)getpid());
	struct ibv_context *context = open_roce_device();

	struct rdma_event_channel *channel = rdma_create_event_channel();
	CHECK(channel);
	struct sockaddr_in dst = { .sin_family = AF_INET, .sin_port = htons((uint16_t)(20000 + rand() % 20000)) };
	dst.sin_addr.s_addr = htonl(0x7F000000u | (uint32_t)(rand() % 250 + 1) << 16 | (uint32_t)(rand() % 250) << 8 |
				    (uint32_t)(rand() % 250 + 1));

	/* perftest's control connection: an id resolved from no source. */
	struct rdma_cm_id *first = NULL;
	CHECK_EQ(rdma_create_id(channel, &first, NULL, RDMA_PS_TCP), 0);
	resolve(channel, first, NULL, &dst);
	CHECK(first->verbs == context);
	const struct sockaddr_in *first_source = (const struct sockaddr_in *)rdma_get_local_addr(first);
	CHECK_EQ(first_source->sin_family, AF_INET);

	/* Its data ids: the source is GID 0 of the context it opened. */
	union ibv_gid gid;
	CHECK_EQ(ibv_query_gid(context, 1, 0, &gid), 0);
	struct sockaddr_in from_gid = { .sin_family = AF_INET };
	memcpy(&from_gid.sin_addr, &gid.raw[12], 4);
	CHECK_EQ(from_gid.sin_addr.s_addr, first_source->sin_addr.s_addr);
	struct rdma_cm_id *second = NULL;
	CHECK_EQ(rdma_create_id(channel, &second, NULL, RDMA_PS_TCP), 0);
	resolve(channel, second, (struct sockaddr *)&from_gid, &dst);
	CHECK(second->verbs == context);
	const struct sockaddr_in *second_source = (const struct sockaddr_in *)rdma_get_local_addr(second);
	CHECK_EQ(second_source->sin_addr.s_addr, from_gid.sin_addr.s_addr);

	CHECK_EQ(rdma_destroy_id(second), 0);
	CHECK_EQ(rdma_destroy_id(first), 0);
	rdma_destroy_event_channel(channel);
	/* The application's close leaves the context to the CM, which keeps it to the end. */
	CHECK_EQ(ibv_close_device(context), 0);
	printf("roce: ids run on the opened device context; GID 0 is their source address and binds\n");
	return 0;
}
