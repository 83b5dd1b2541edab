/* The drop-in libmlx5.so.1 and libefa.so.1: the "direct verbs" libraries of two vendors'
 * providers, which Debian's perftest, libfabric and UCX link (and so load) whether or not
 * such a device is present. peercm's devices are neither, so every function answers as the
 * real library does for a device of another vendor: not supported (NULL or -1 with errno
 * EOPNOTSUPP, or EOPNOTSUPP returned), and mlx5dv_is_supported() says false. Only the
 * functions those programs import are here (libmlx5.map, libefa.map); the parameters are
 * never read, so they are declared opaque. */
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#define UNSUPPORTED_PTR(name, ...)                                                          \
	void *name(__VA_ARGS__);                                                            \
	void *name(__VA_ARGS__)                                                             \
	{                                                                                   \
		errno = EOPNOTSUPP;                                                         \
		return NULL;                                                                \
	}
#define UNSUPPORTED_INT(name, ...)                                                          \
	int name(__VA_ARGS__);                                                              \
	int name(__VA_ARGS__)                                                               \
	{                                                                                   \
		errno = EOPNOTSUPP;                                                         \
		return EOPNOTSUPP;                                                          \
	}
#define UNSUPPORTED_VOID(name, ...)                                                         \
	void name(__VA_ARGS__);                                                             \
	void name(__VA_ARGS__)                                                              \
	{                                                                                   \
	}

#ifdef PEERCM_DIRECT_VERBS_MLX5
bool mlx5dv_is_supported(void *device);
bool mlx5dv_is_supported(void *device)
{
	(void)device;
	return false;
}
UNSUPPORTED_PTR(mlx5dv_open_device, void *device, void *attr)
UNSUPPORTED_INT(mlx5dv_init_obj, void *obj, unsigned long long obj_type)
UNSUPPORTED_PTR(mlx5dv_create_cq, void *context, void *cq_attr, void *mlx5_cq_attr)
UNSUPPORTED_PTR(mlx5dv_create_qp, void *context, void *qp_attr, void *mlx5_qp_attr)
UNSUPPORTED_PTR(mlx5dv_qp_ex_from_ibv_qp_ex, void *qp)
UNSUPPORTED_PTR(mlx5dv_create_mkey, void *mkey_init_attr)
UNSUPPORTED_INT(mlx5dv_destroy_mkey, void *mkey)
UNSUPPORTED_INT(mlx5dv_crypto_login, void *context, void *login_attr)
UNSUPPORTED_PTR(mlx5dv_dek_create, void *context, void *init_attr)
UNSUPPORTED_INT(mlx5dv_dek_destroy, void *dek)
UNSUPPORTED_INT(mlx5dv_devx_general_cmd, void *context, const void *in, size_t inlen, void *out, size_t outlen)
UNSUPPORTED_PTR(mlx5dv_devx_obj_create, void *context, const void *in, size_t inlen, void *out, size_t outlen)
UNSUPPORTED_INT(mlx5dv_devx_obj_destroy, void *obj)
UNSUPPORTED_INT(mlx5dv_devx_obj_modify, void *obj, const void *in, size_t inlen, void *out, size_t outlen)
UNSUPPORTED_INT(mlx5dv_devx_obj_query, void *obj, const void *in, size_t inlen, void *out, size_t outlen)
UNSUPPORTED_PTR(mlx5dv_devx_umem_reg, void *context, void *addr, size_t size, unsigned int access)
UNSUPPORTED_INT(mlx5dv_devx_umem_dereg, void *umem)
UNSUPPORTED_PTR(mlx5dv_devx_alloc_uar, void *context, unsigned int flags)
UNSUPPORTED_VOID(mlx5dv_devx_free_uar, void *uar)
UNSUPPORTED_INT(mlx5dv_devx_qp_modify, void *qp, const void *in, size_t inlen, void *out, size_t outlen)
UNSUPPORTED_INT(mlx5dv_devx_qp_query, void *qp, const void *in, size_t inlen, void *out, size_t outlen)
UNSUPPORTED_PTR(mlx5dv_devx_create_event_channel, void *context, int flags)
UNSUPPORTED_VOID(mlx5dv_devx_destroy_event_channel, void *event_channel)
UNSUPPORTED_INT(mlx5dv_devx_subscribe_devx_event, void *event_channel, void *obj, unsigned short events_sz,
		unsigned short *events_num, unsigned long long cookie)
ssize_t mlx5dv_devx_get_event(void *event_channel, void *event_data, size_t event_resp_len);
ssize_t mlx5dv_devx_get_event(void *event_channel, void *event_data, size_t event_resp_len)
{
	(void)event_channel;
	(void)event_data;
	(void)event_resp_len;
	errno = EOPNOTSUPP;
	return -1;
}
#endif

#ifdef PEERCM_DIRECT_VERBS_EFA
UNSUPPORTED_INT(efadv_query_device, void *context, void *attr, unsigned int inlen)
UNSUPPORTED_INT(efadv_query_ah, void *ah, void *attr, unsigned int inlen)
UNSUPPORTED_PTR(efadv_create_qp_ex, void *context, void *attr_ex, void *efa_attr, unsigned int inlen)
UNSUPPORTED_PTR(efadv_create_cq, void *context, void *attr_ex, void *efa_attr, unsigned int inlen)
UNSUPPORTED_PTR(efadv_cq_from_ibv_cq_ex, void *cq)
#endif
