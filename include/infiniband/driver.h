/* The part of rdma-core's provider header that applications use: GID types as sysfs names
 * them and the sysfs reader. peercm has no providers, so nothing else of it is offered. */
#ifndef PEERCM_INFINIBAND_DRIVER_H
#define PEERCM_INFINIBAND_DRIVER_H

#include <infiniband/verbs.h>

#ifdef __cplusplus
extern "C" {
#endif

enum ibv_gid_type_sysfs {
	IBV_GID_TYPE_SYSFS_IB_ROCE_V1, /* also what an iWARP device's GIDs are */
	IBV_GID_TYPE_SYSFS_ROCE_V2,
};

/* The type of a GID: 0 or -1 with errno (EINVAL for an index past the table). */
int ibv_query_gid_type(struct ibv_context *context, uint8_t port_num, unsigned int index,
		       enum ibv_gid_type_sysfs *type);

/* Reads dir/file into buf (NUL-terminated, a trailing newline dropped): the length read, or
 * -1 with errno. peercm's device has no sysfs directory, so its paths are empty. */
/* "/sys": peercm's devices have no directory under it. */
const char *ibv_get_sysfs_path(void);

int ibv_read_sysfs_file(const char *dir, const char *file, char *buf, size_t size);

#ifdef __cplusplus
}
#endif

#endif /* PEERCM_INFINIBAND_DRIVER_H */
