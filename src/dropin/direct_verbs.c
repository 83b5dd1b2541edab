/* The vendor direct-verbs libraries of the drop-in directory: libmlx5.so.1 and libefa.so.1.
 *
 * Programs built against rdma-core link these beside libibverbs (UCX's libuct_ib links
 * libmlx5, libfabric links libefa, perftest both), and call them only after asking whether a
 * device is theirs. The system's copies cannot load over the drop-in libibverbs: they are
 * rdma-core's providers and bind, at load time, to libibverbs' private provider interface
 * (IBVERBS_PRIVATE_34: ibv_cmd_*, verbs_register_driver_34, ...), which peercm does not have.
 * These stand in for them with the functions those programs import, under rdma-core's symbol
 * versions (libmlx5.map, libefa.map), and answer as those libraries do for a device that is
 * neither an mlx5 nor an EFA device: mlx5dv_is_supported() is false, and every other call
 * fails with EOPNOTSUPP (returned, or in errno where the function returns a pointer or -1).
 * One source makes both libraries (PEERCM_DV_MLX5, PEERCM_DV_EFA); no parameter is ever read. */
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct ibv_context;
struct ibv_device;

static void *not_this_device(void) {
  errno = EOPNOTSUPP;
  return NULL;
}

#ifdef PEERCM_DV_MLX5
bool mlx5dv_is_supported(struct ibv_device *device) {
  (void)device;
  return false;
}

void *mlx5dv_open_device(struct ibv_device *device, void *attr) {
  (void)device, (void)attr;
  return not_this_device();
}

void *mlx5dv_create_cq(struct ibv_context *context, void *cq_attr, void *mlx5_cq_attr) {
  (void)context, (void)cq_attr, (void)mlx5_cq_attr;
  return not_this_device();
}

void *mlx5dv_create_qp(struct ibv_context *context, void *qp_attr, void *mlx5_qp_attr) {
  (void)context, (void)qp_attr, (void)mlx5_qp_attr;
  return not_this_device();
}

void *mlx5dv_create_mkey(void *mkey_attr) {
  (void)mkey_attr;
  return not_this_device();
}

void *mlx5dv_qp_ex_from_ibv_qp_ex(void *qp) {
  (void)qp;
  return not_this_device();
}

void *mlx5dv_devx_create_event_channel(struct ibv_context *context, int flags) {
  (void)context, (void)flags;
  return not_this_device();
}

void *mlx5dv_devx_alloc_uar(struct ibv_context *context, uint32_t flags) {
  (void)context, (void)flags;
  return not_this_device();
}

void *mlx5dv_devx_obj_create(struct ibv_context *context, const void *in, size_t inlen, void *out, size_t outlen) {
  (void)context, (void)in, (void)inlen, (void)out, (void)outlen;
  return not_this_device();
}

void *mlx5dv_devx_umem_reg(struct ibv_context *context, void *addr, size_t size, uint32_t access) {
  (void)context, (void)addr, (void)size, (void)access;
  return not_this_device();
}

void *mlx5dv_dek_create(struct ibv_context *context, void *init_attr) {
  (void)context, (void)init_attr;
  return not_this_device();
}

void mlx5dv_devx_destroy_event_channel(void *channel) { (void)channel; }

void mlx5dv_devx_free_uar(void *uar) { (void)uar; }

ssize_t mlx5dv_devx_get_event(void *channel, void *event_data, size_t event_resp_len) {
  (void)channel, (void)event_data, (void)event_resp_len;
  errno = EOPNOTSUPP;
  return -1;
}

int mlx5dv_init_obj(void *obj, uint64_t obj_type) {
  (void)obj, (void)obj_type;
  return EOPNOTSUPP;
}

int mlx5dv_destroy_mkey(void *mkey) {
  (void)mkey;
  return EOPNOTSUPP;
}

int mlx5dv_devx_subscribe_devx_event(void *channel, void *obj, uint16_t events_sz, uint16_t *events_num, uint64_t cookie) {
  (void)channel, (void)obj, (void)events_sz, (void)events_num, (void)cookie;
  return EOPNOTSUPP;
}

int mlx5dv_crypto_login(struct ibv_context *context, void *login_attr) {
  (void)context, (void)login_attr;
  return EOPNOTSUPP;
}

int mlx5dv_dek_destroy(void *dek) {
  (void)dek;
  return EOPNOTSUPP;
}

int mlx5dv_devx_general_cmd(struct ibv_context *context, const void *in, size_t inlen, void *out, size_t outlen) {
  (void)context, (void)in, (void)inlen, (void)out, (void)outlen;
  return EOPNOTSUPP;
}

int mlx5dv_devx_obj_destroy(void *obj) {
  (void)obj;
  return EOPNOTSUPP;
}

int mlx5dv_devx_obj_modify(void *obj, const void *in, size_t inlen, void *out, size_t outlen) {
  (void)obj, (void)in, (void)inlen, (void)out, (void)outlen;
  return EOPNOTSUPP;
}

int mlx5dv_devx_obj_query(void *obj, const void *in, size_t inlen, void *out, size_t outlen) {
  (void)obj, (void)in, (void)inlen, (void)out, (void)outlen;
  return EOPNOTSUPP;
}

int mlx5dv_devx_umem_dereg(void *umem) {
  (void)umem;
  return EOPNOTSUPP;
}

int mlx5dv_devx_qp_modify(void *qp, const void *in, size_t inlen, void *out, size_t outlen) {
  (void)qp, (void)in, (void)inlen, (void)out, (void)outlen;
  return EOPNOTSUPP;
}

int mlx5dv_devx_qp_query(void *qp, const void *in, size_t inlen, void *out, size_t outlen) {
  (void)qp, (void)in, (void)inlen, (void)out, (void)outlen;
  return EOPNOTSUPP;
}
#endif /* PEERCM_DV_MLX5 */

#ifdef PEERCM_DV_EFA
int efadv_query_device(struct ibv_context *context, void *attr, uint32_t inlen) {
  (void)context, (void)attr, (void)inlen;
  return EOPNOTSUPP;
}

int efadv_query_ah(void *ah, void *attr, uint32_t inlen) {
  (void)ah, (void)attr, (void)inlen;
  return EOPNOTSUPP;
}

void *efadv_create_qp_ex(struct ibv_context *context, void *attr_ex, void *efa_attr, uint32_t inlen) {
  (void)context, (void)attr_ex, (void)efa_attr, (void)inlen;
  return not_this_device();
}

void *efadv_create_cq(struct ibv_context *context, void *attr_ex, void *efa_attr, uint32_t inlen) {
  (void)context, (void)attr_ex, (void)efa_attr, (void)inlen;
  return not_this_device();
}

void *efadv_cq_from_ibv_cq_ex(void *cq_ex) {
  (void)cq_ex;
  return not_this_device();
}
#endif /* PEERCM_DV_EFA */
