/* The module's side of the contract in cuda_module.h: its init entry point, and the
 * libfsdp2 functions the module's sources call, each forwarding to the host table of the
 * libfsdp2 that loaded the module. The module's version script (module.map) exports the
 * init entry point only, so these definitions bind inside the module and never stand in
 * for libfsdp2's own. */
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>

#include "collectives/group_internal.h"
#include "core/error.h"
#include "core/log_internal.h"
#include "cuda/cuda_module.h"
#include "cuda/cuda_optim.h"
#include "cuda/cuda_stream.h"

/* The longest message the host keeps (lib/core/status.c); longer ones are cut there too. */
#define HOST_MESSAGE_MAX 1024

static _Atomic(const fsdp2_cuda_host_t *) host;
static _Atomic(const fsdp2_cuda_group_host_t *) group_host;

fsdp2_status_t fsdp2_error(fsdp2_status_t status, const char *fmt, ...)
{
    char msg[HOST_MESSAGE_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    return host->error(status, "%s", msg);
}

void fsdp2_error_set_message(const char *msg)
{
    host->error_set_message(msg);
}

const char *fsdp2_last_error(void)
{
    return host->last_error();
}

const char *fsdp2_status_name(fsdp2_status_t status)
{
    return host->status_name(status);
}

int fsdp2_log_enabled(fsdp2_log_level_t level, fsdp2_subsys_t subsys)
{
    return host->log_enabled(level, subsys);
}

void fsdp2_log_write(fsdp2_log_level_t level, fsdp2_subsys_t subsys, const char *fmt, ...)
{
    char msg[HOST_MESSAGE_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    host->log_write(level, subsys, "%s", msg);
}

fsdp2_status_t fsdp2_device_alloc(fsdp2_device_t device, size_t bytes, void **ptr)
{
    return host->device_alloc(device, bytes, ptr);
}

fsdp2_status_t fsdp2_dtype_size(fsdp2_dtype_t dtype, size_t *bytes)
{
    return host->dtype_size(dtype, bytes);
}

const char *fsdp2_dtype_name(fsdp2_dtype_t dtype)
{
    return host->dtype_name(dtype);
}

uint16_t fsdp2_f64_to_bf16(double value)
{
    return host->f64_to_bf16(value);
}

uint16_t fsdp2_f64_to_f16(double value)
{
    return host->f64_to_f16(value);
}

fsdp2_status_t fsdp2_group_fail(struct fsdp2_group *g, fsdp2_status_t status, const char *fmt,
                                ...)
{
    char msg[HOST_MESSAGE_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    return group_host->group_fail(g, status, "%s", msg);
}

fsdp2_status_t fsdp2_group_check(struct fsdp2_group *g)
{
    return group_host->group_check(g);
}

void fsdp2_group_member_key(const struct fsdp2_group *g, const char *what, int r, char *key)
{
    group_host->group_member_key(g, what, r, key);
}

const char *fsdp2_coll_kind_name(coll_kind_t kind)
{
    return group_host->coll_kind_name((int)kind);
}

fsdp2_status_t fsdp2_store_set(fsdp2_store_t *store, const char *key, const void *value,
                               size_t len)
{
    return group_host->store_set(store, key, value, len);
}

fsdp2_status_t fsdp2_store_get(fsdp2_store_t *store, const char *key, void *buf, size_t cap,
                               size_t *len)
{
    return group_host->store_get(store, key, buf, cap, len);
}

fsdp2_status_t fsdp2_store_add(fsdp2_store_t *store, const char *key, int64_t delta,
                               int64_t *result)
{
    return group_host->store_add(store, key, delta, result);
}

fsdp2_status_t fsdp2_setup_wait_keys(fsdp2_setup_t *s, fsdp2_store_t *store,
                                     const char *const *keys, size_t n, const char *verb)
{
    return group_host->setup_wait_keys(s, store, keys, n, verb);
}

/* ---- the entry points ---- */

/* The collectives layer asks once per process, under its own once-guard; the table it
 * passes has static storage. Only the libfsdp2 that loaded the module may: another
 * copy's table (or one of another build) gets no ops. */
static const struct fsdp2_group_ops *module_nccl_ops(const fsdp2_cuda_group_host_t *gh)
{
    if (!gh || gh->abi != FSDP2_CUDA_MODULE_ABI || gh->size != sizeof(*gh))
        return NULL;
    const fsdp2_cuda_group_host_t *expected = NULL;
    if (!atomic_compare_exchange_strong(&group_host, &expected, gh) && expected != gh)
        return NULL;
    return &fsdp2_nccl_group_ops;
}

static const fsdp2_cuda_module_t module = {
    .abi = FSDP2_CUDA_MODULE_ABI,
    .size = sizeof(fsdp2_cuda_module_t),
    .device_ops = &fsdp2_cuda_ops,
    .nccl_ops = module_nccl_ops,
    .optim_chunks = fsdp2_cuda_optim_chunks,
    .optim_fill_chunks = fsdp2_cuda_optim_fill_chunks,
    .optim_step = fsdp2_cuda_optim_step,
    .scratch = fsdp2_cuda_scratch,
    .norm_shares = fsdp2_cuda_norm_shares,
    .scale_all = fsdp2_cuda_scale_all,
};

__attribute__((visibility("default"))) fsdp2_status_t
fsdp2_cuda_module_init(const fsdp2_cuda_host_t *h, const fsdp2_cuda_module_t **out)
{
    if (!h || !out || h->abi != FSDP2_CUDA_MODULE_ABI || h->size != sizeof(*h))
        return FSDP2_ERR_NOT_AVAILABLE; /* the loader names both sides' versions */
    /* One libfsdp2 per module: a second copy in the process (a program linked with the
     * static library beside a plugin using libfsdp2.so) would take the first one's
     * errors and counters over. */
    const fsdp2_cuda_host_t *expected = NULL;
    if (!atomic_compare_exchange_strong(&host, &expected, h) && expected != h)
        return FSDP2_ERR_INVALID_STATE;
    *out = &module;
    return FSDP2_SUCCESS;
}
