/* The devices: one per transport, each truthful about itself, so that a verbs program picks
 * one by name (-d) as on real hardware and one that takes the first gets the transport the
 * user asked for (PEERCM_TRANSPORT, read at each call). peercm_iw0 is an iWARP RNIC with one
 * GID; peercm_roce0 is a RoCEv2 channel adapter (IBV_TRANSPORT_IB over an Ethernet link)
 * whose GIDs are IPv4 addresses mapped to IPv6: first the context's own 127/8 address, then the
 * host's interface addresses. rdma_cm ids
 * take the device of their transport, the same context for every id, which
 * rdma_get_devices lists in the same order. */
#define _GNU_SOURCE
#include "capi_test.h"

static struct ibv_device *find(struct ibv_device **list, const char *name)
{
	for (int i = 0; list[i]; i++)
		if (strcmp(ibv_get_device_name(list[i]), name) == 0)
			return list[i];
	return NULL;
}

static void check_list_order(const char *first, const char *second)
{
	int n = -1;
	struct ibv_device **list = ibv_get_device_list(&n);

	CHECK(list != NULL);
	CHECK_EQ(n, 2);
	CHECK(list[2] == NULL);
	CHECK(strcmp(ibv_get_device_name(list[0]), first) == 0);
	CHECK(strcmp(ibv_get_device_name(list[1]), second) == 0);
	ibv_free_device_list(list);
}

static void check_iwarp(struct ibv_device *device)
{
	struct ibv_context *context;
	struct ibv_device_attr attr;
	struct ibv_port_attr port;
	union ibv_gid gid;

	CHECK_EQ(device->node_type, IBV_NODE_RNIC);
	CHECK_EQ(device->transport_type, IBV_TRANSPORT_IWARP);
	CHECK((context = ibv_open_device(device)) != NULL);
	CHECK(context->device == device);
	CHECK(ibv_query_device(context, &attr) == 0);
	CHECK_EQ(attr.phys_port_cnt, 1);
	CHECK_EQ(attr.max_sge_rd, 1);
	CHECK(ibv_query_port(context, 1, &port) == 0);
	CHECK_EQ(port.state, IBV_PORT_ACTIVE);
	CHECK_EQ(port.link_layer, IBV_LINK_LAYER_ETHERNET);
	CHECK_EQ(port.active_mtu, IBV_MTU_1024);
	CHECK_EQ(port.gid_tbl_len, 1);
	CHECK(ibv_query_gid(context, 1, 0, &gid) == 0);
	CHECK(gid.global.interface_id == attr.node_guid);
	CHECK(ibv_query_gid(context, 1, 1, &gid) != 0);
	CHECK(ibv_close_device(context) == 0);
}

static void check_roce(struct ibv_device *device)
{
	static const uint8_t mapped_prefix[12] = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff };
	struct ibv_context *context;
	struct ibv_device_attr attr;
	struct ibv_port_attr port;
	union ibv_gid gid;
	int loopback_seen = 0, filled = 0;

	CHECK_EQ(device->node_type, IBV_NODE_CA);
	CHECK_EQ(device->transport_type, IBV_TRANSPORT_IB);
	CHECK((context = ibv_open_device(device)) != NULL);
	CHECK(context->device == device);
	CHECK(ibv_query_device(context, &attr) == 0);
	CHECK_EQ(attr.phys_port_cnt, 1);
	CHECK(attr.max_sge_rd > 1);
	CHECK(ibv_query_port(context, 1, &port) == 0);
	CHECK_EQ(port.state, IBV_PORT_ACTIVE);
	CHECK_EQ(port.link_layer, IBV_LINK_LAYER_ETHERNET);
	CHECK_EQ(port.active_mtu, IBV_MTU_1024);
	CHECK_EQ(port.max_mtu, IBV_MTU_4096);
	CHECK(port.gid_tbl_len > 1);
	for (int i = 0; i < port.gid_tbl_len; i++) {
		static const uint8_t zero[16];
		uint32_t address;

		CHECK(ibv_query_gid(context, 1, i, &gid) == 0);
		if (memcmp(gid.raw, zero, sizeof zero) == 0)
			continue; /* an empty entry: none filled after it */
		CHECK_EQ(filled, i);
		filled++;
		CHECK(memcmp(gid.raw, mapped_prefix, sizeof mapped_prefix) == 0);
		memcpy(&address, &gid.raw[12], 4);
		if (i == 0 && (ntohl(address) >> 24) == 127)
			loopback_seen = 1; /* the context's own 127/8 address */
	}
	CHECK(loopback_seen);
	CHECK(ibv_query_gid(context, 1, port.gid_tbl_len, &gid) != 0);
	CHECK(ibv_close_device(context) == 0);
}

/* An id's device once it is bound, for the transport PEERCM_TRANSPORT names now. */
static struct ibv_context *id_device(const char *name)
{
	struct rdma_cm_id *id;
	struct sockaddr_in address = loopback(0);
	struct ibv_context *context;

	CHECK(rdma_create_id(NULL, &id, NULL, RDMA_PS_TCP) == 0);
	if (strcmp(name, "peercm_roce0") == 0) /* a RoCE node's own address: no other test's */
		address.sin_addr.s_addr = htonl((127u << 24) | (201u << 16) | ((((unsigned)getpid() >> 8) & 0xff) << 8) |
						 ((unsigned)getpid() % 250 + 1));
	CHECK(rdma_bind_addr(id, (struct sockaddr *)&address) == 0);
	context = id->verbs;
	CHECK(context != NULL);
	CHECK(strcmp(ibv_get_device_name(context->device), name) == 0);
	CHECK(rdma_destroy_id(id) == 0);
	return context;
}

int main(void)
{
	struct ibv_device **list;
	struct ibv_context **cm_devices, *iwarp, *roce;
	int n = 0;

	unsetenv("PEERCM_TRANSPORT");
	check_list_order("peercm_iw0", "peercm_roce0");
	setenv("PEERCM_TRANSPORT", "roce", 1);
	check_list_order("peercm_roce0", "peercm_iw0");
	unsetenv("PEERCM_TRANSPORT");

	CHECK((list = ibv_get_device_list(NULL)) != NULL);
	check_iwarp(find(list, "peercm_iw0"));
	check_roce(find(list, "peercm_roce0"));
	ibv_free_device_list(list);

	/* rdma_cm: the transport picks the device, and its context is shared and kept. */
	iwarp = id_device("peercm_iw0");
	CHECK(id_device("peercm_iw0") == iwarp);
	setenv("PEERCM_TRANSPORT", "roce", 1);
	roce = id_device("peercm_roce0");
	CHECK(roce != iwarp);
	CHECK((cm_devices = rdma_get_devices(&n)) != NULL);
	CHECK_EQ(n, 2);
	CHECK(cm_devices[0] == roce && cm_devices[1] == iwarp && cm_devices[2] == NULL);
	rdma_free_devices(cm_devices);
	unsetenv("PEERCM_TRANSPORT");
	CHECK((cm_devices = rdma_get_devices(&n)) != NULL);
	CHECK(cm_devices[0] == iwarp && cm_devices[1] == roce);
	rdma_free_devices(cm_devices);
	printf("peercm_iw0 (iWARP RNIC) and peercm_roce0 (RoCEv2 CA), listed and chosen by PEERCM_TRANSPORT\n");
	return 0;
}
