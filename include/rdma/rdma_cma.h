/* The rdma_cm C API of librdmacm, as peercm offers it: communication identifiers over the
 * peercm connection manager (MPA over TCP, IPv4), with the events, fields and call order of
 * rdma-core's man pages, and one option of peercm's own (RDMA_OPTION_ID_PEER_TO_PEER).
 * Struct layouts and constant values are rdma-core's; docs/c-api.md lists the differences. */
#ifndef PEERCM_RDMA_CMA_H
#define PEERCM_RDMA_CMA_H

#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <sys/socket.h>

#ifdef __cplusplus
extern "C" {
#endif

enum rdma_cm_event_type {
	RDMA_CM_EVENT_ADDR_RESOLVED,
	RDMA_CM_EVENT_ADDR_ERROR,
	RDMA_CM_EVENT_ROUTE_RESOLVED,
	RDMA_CM_EVENT_ROUTE_ERROR,
	RDMA_CM_EVENT_CONNECT_REQUEST,
	RDMA_CM_EVENT_CONNECT_RESPONSE,
	RDMA_CM_EVENT_CONNECT_ERROR,
	RDMA_CM_EVENT_UNREACHABLE,
	RDMA_CM_EVENT_REJECTED,
	RDMA_CM_EVENT_ESTABLISHED,
	RDMA_CM_EVENT_DISCONNECTED,
	RDMA_CM_EVENT_DEVICE_REMOVAL,
	RDMA_CM_EVENT_MULTICAST_JOIN,
	RDMA_CM_EVENT_MULTICAST_ERROR,
	RDMA_CM_EVENT_ADDR_CHANGE,
	RDMA_CM_EVENT_TIMEWAIT_EXIT,
};

enum rdma_port_space {
	RDMA_PS_IPOIB = 0x0002,
	RDMA_PS_TCP = 0x0106,
	RDMA_PS_UDP = 0x0111,
	RDMA_PS_IB = 0x013F,
};

#define RDMA_IB_IP_PS_MASK 0xFFFFFFFFFFFF0000ULL
#define RDMA_IB_IP_PORT_MASK 0x000000000000FFFFULL
#define RDMA_IB_IP_PS_TCP 0x0000000001060000ULL
#define RDMA_IB_IP_PS_UDP 0x0000000001110000ULL
#define RDMA_IB_PS_IB 0x00000000013F0000ULL

#define RDMA_UDP_QKEY 0x01234567

struct rdma_ib_addr {
	union ibv_gid sgid;
	union ibv_gid dgid;
	__be16 pkey;
};

struct rdma_addr {
	union {
		struct sockaddr src_addr;
		struct sockaddr_in src_sin;
		struct sockaddr_in6 src_sin6;
		struct sockaddr_storage src_storage;
	};
	union {
		struct sockaddr dst_addr;
		struct sockaddr_in dst_sin;
		struct sockaddr_in6 dst_sin6;
		struct sockaddr_storage dst_storage;
	};
	union {
		struct rdma_ib_addr ibaddr;
	} addr;
};

/* An IB path record; iWARP has none (path_rec stays NULL, num_paths 0). */
struct ibv_sa_path_rec;

struct rdma_route {
	struct rdma_addr addr;
	struct ibv_sa_path_rec *path_rec;
	int num_paths;
};

struct rdma_event_channel {
	int fd; /* readable exactly while an event waits */
};

struct rdma_cm_event;

struct rdma_cm_id {
	struct ibv_context *verbs; /* NULL until the id is bound or resolved */
	struct rdma_event_channel *channel;
	void *context;
	struct ibv_qp *qp;
	struct rdma_route route;
	enum rdma_port_space ps;
	uint8_t port_num;
	struct rdma_cm_event *event; /* synchronous ids: the last event a call waited for */
	struct ibv_comp_channel *send_cq_channel;
	struct ibv_cq *send_cq;
	struct ibv_comp_channel *recv_cq_channel;
	struct ibv_cq *recv_cq;
	struct ibv_srq *srq;
	struct ibv_pd *pd;
	enum ibv_qp_type qp_type;
};

enum {
	RDMA_MAX_RESP_RES = 0xFF,   /* "as many as the device allows" */
	RDMA_MAX_INIT_DEPTH = 0xFF,
};

struct rdma_conn_param {
	const void *private_data;
	uint8_t private_data_len;
	uint8_t responder_resources; /* IRD */
	uint8_t initiator_depth;     /* ORD */
	uint8_t flow_control;
	uint8_t retry_count;
	uint8_t rnr_retry_count;
	/* Used when the id has no QP: qp_num names the QP (ibv_create_qp) to connect. */
	uint8_t srq;
	uint32_t qp_num;
};

struct rdma_ud_param {
	const void *private_data;
	uint8_t private_data_len;
	struct ibv_ah_attr ah_attr;
	uint32_t qp_num;
	uint32_t qkey;
};

struct rdma_cm_event {
	struct rdma_cm_id *id;
	struct rdma_cm_id *listen_id;
	enum rdma_cm_event_type event;
	int status; /* 0, or a negative errno value */
	union {
		struct rdma_conn_param conn;
		struct rdma_ud_param ud;
	} param;
};

#define RAI_PASSIVE 0x00000001
#define RAI_NUMERICHOST 0x00000002
#define RAI_NOROUTE 0x00000004
#define RAI_FAMILY 0x00000008

struct rdma_addrinfo {
	int ai_flags;
	int ai_family;
	int ai_qp_type;
	int ai_port_space;
	socklen_t ai_src_len;
	socklen_t ai_dst_len;
	struct sockaddr *ai_src_addr;
	struct sockaddr *ai_dst_addr;
	char *ai_src_canonname;
	char *ai_dst_canonname;
	size_t ai_route_len;
	void *ai_route;
	size_t ai_connect_len;
	void *ai_connect;
	struct rdma_addrinfo *ai_next;
};

enum rdma_cm_join_mc_attr_mask {
	RDMA_CM_JOIN_MC_ATTR_ADDRESS = 1 << 0,
	RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS = 1 << 1,
	RDMA_CM_JOIN_MC_ATTR_RESERVED = 1 << 2,
};

enum rdma_cm_mc_join_flags {
	RDMA_MC_JOIN_FLAG_FULLMEMBER,
	RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER,
	RDMA_MC_JOIN_FLAG_RESERVED,
};

struct rdma_cm_join_mc_attr_ex {
	uint32_t comp_mask;
	uint32_t join_flags;
	struct sockaddr *addr;
};

/* Event channels and ids. Every call returns 0, or -1 with errno set. */
struct rdma_event_channel *rdma_create_event_channel(void);
void rdma_destroy_event_channel(struct rdma_event_channel *channel);
/* A NULL channel makes a synchronous id: resolve, connect, accept and disconnect block. */
int rdma_create_id(struct rdma_event_channel *channel, struct rdma_cm_id **id, void *context,
		   enum rdma_port_space ps);
int rdma_create_ep(struct rdma_cm_id **id, struct rdma_addrinfo *res, struct ibv_pd *pd,
		   struct ibv_qp_init_attr *qp_init_attr);
void rdma_destroy_ep(struct rdma_cm_id *id);
int rdma_destroy_id(struct rdma_cm_id *id);
int rdma_bind_addr(struct rdma_cm_id *id, struct sockaddr *addr);
int rdma_resolve_addr(struct rdma_cm_id *id, struct sockaddr *src_addr, struct sockaddr *dst_addr, int timeout_ms);
int rdma_resolve_route(struct rdma_cm_id *id, int timeout_ms);
int rdma_create_qp(struct rdma_cm_id *id, struct ibv_pd *pd, struct ibv_qp_init_attr *qp_init_attr);
int rdma_create_qp_ex(struct rdma_cm_id *id, struct ibv_qp_init_attr_ex *qp_init_attr);
void rdma_destroy_qp(struct rdma_cm_id *id);
int rdma_connect(struct rdma_cm_id *id, struct rdma_conn_param *conn_param);
int rdma_establish(struct rdma_cm_id *id);
/* A backlog of 0 or less means the largest the system allows. */
int rdma_listen(struct rdma_cm_id *id, int backlog);
int rdma_get_request(struct rdma_cm_id *listen, struct rdma_cm_id **id);
int rdma_accept(struct rdma_cm_id *id, struct rdma_conn_param *conn_param);
int rdma_reject(struct rdma_cm_id *id, const void *private_data, uint8_t private_data_len);
int rdma_reject_ece(struct rdma_cm_id *id, const void *private_data, uint8_t private_data_len);
int rdma_notify(struct rdma_cm_id *id, enum ibv_event_type event);
int rdma_disconnect(struct rdma_cm_id *id);
int rdma_join_multicast(struct rdma_cm_id *id, struct sockaddr *addr, void *context);
int rdma_leave_multicast(struct rdma_cm_id *id, struct sockaddr *addr);
int rdma_join_multicast_ex(struct rdma_cm_id *id, struct rdma_cm_join_mc_attr_ex *mc_join_attr, void *context);
/* Blocks unless the channel's fd was made non-blocking (then -1 with errno EAGAIN). */
int rdma_get_cm_event(struct rdma_event_channel *channel, struct rdma_cm_event **event);
int rdma_ack_cm_event(struct rdma_cm_event *event);
__be16 rdma_get_src_port(struct rdma_cm_id *id);
__be16 rdma_get_dst_port(struct rdma_cm_id *id);

static inline struct sockaddr *rdma_get_local_addr(struct rdma_cm_id *id)
{
	return &id->route.addr.src_addr;
}

static inline struct sockaddr *rdma_get_peer_addr(struct rdma_cm_id *id)
{
	return &id->route.addr.dst_addr;
}

struct ibv_context **rdma_get_devices(int *num_devices);
void rdma_free_devices(struct ibv_context **list);
const char *rdma_event_str(enum rdma_cm_event_type event);

/* Option levels. */
enum {
	RDMA_OPTION_ID = 0,
	RDMA_OPTION_IB = 1,
};

/* Options of RDMA_OPTION_ID. */
enum {
	RDMA_OPTION_ID_TOS = 0,         /* uint8_t */
	RDMA_OPTION_ID_REUSEADDR = 1,   /* int */
	RDMA_OPTION_ID_AFONLY = 2,      /* int */
	RDMA_OPTION_ID_ACK_TIMEOUT = 3, /* uint8_t */
	/* peercm: the peer-to-peer connection model for this id (int, 0 or 1, default 1).
	 * Simultaneous connects between two listening nodes become one connection; a second
	 * connect to the same peer and tag fails with EALREADY or EISCONN. */
	RDMA_OPTION_ID_PEER_TO_PEER = 0x5000,
	/* peercm: the tag of the id's peer-to-peer key (uint32_t, default 0): ids with
	 * different tags may hold separate connections to one peer. */
	RDMA_OPTION_ID_P2P_TAG = 0x5001,
};

/* Options of RDMA_OPTION_IB. */
enum {
	RDMA_OPTION_IB_PATH = 1, /* IB path records: ENOSYS here */
};

int rdma_set_option(struct rdma_cm_id *id, int level, int optname, void *optval, size_t optlen);
/* A NULL channel makes the id synchronous. */
int rdma_migrate_id(struct rdma_cm_id *id, struct rdma_event_channel *channel);
int rdma_getaddrinfo(const char *node, const char *service, const struct rdma_addrinfo *hints,
		     struct rdma_addrinfo **res);
void rdma_freeaddrinfo(struct rdma_addrinfo *res);
int rdma_init_qp_attr(struct rdma_cm_id *id, struct ibv_qp_attr *qp_attr, int *qp_attr_mask);
int rdma_set_local_ece(struct rdma_cm_id *id, struct ibv_ece *ece);
int rdma_get_remote_ece(struct rdma_cm_id *id, struct ibv_ece *ece);

#ifdef __cplusplus
}
#endif

#endif /* PEERCM_RDMA_CMA_H */
