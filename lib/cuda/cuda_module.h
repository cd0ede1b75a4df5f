/* The contract between libfsdp2 and its CUDA module, libfsdp2-cuda.so.
 *
 * Everything that links CUDA (the cuda device backend, its kernels, the optimizers' and
 * clipping's kernels, the nccl collectives backend) is built into the module; libfsdp2
 * itself links no CUDA library. The first request for a cuda device or an nccl group
 * loads the module (lib/core/cuda_loader.c) and calls its one exported symbol,
 * FSDP2_CUDA_MODULE_INIT, with the host table below: the module calls back into the
 * libfsdp2 that loaded it for errors, logging and counted allocation, never into another
 * copy (a program linked with the static library loads the same module). The module
 * answers with its table of entry points, which libfsdp2 keeps for the process: the
 * module is never unloaded.
 *
 * Both sides come from one build, so the tables need no compatibility across versions:
 * each carries FSDP2_CUDA_MODULE_ABI and its size, and a mismatch (a module from another
 * build on the search path) is refused with both values named.
 *
 * This header names no CUDA type: libfsdp2's own code includes it. */
#ifndef FSDP2_CUDA_MODULE_H
#define FSDP2_CUDA_MODULE_H

#include <stddef.h>
#include <stdint.h>

#include <fsdp2/device.h>
#include <fsdp2/dtype.h>
#include <fsdp2/status.h>
#include <fsdp2/store.h>
#include <fsdp2/tensor.h>

#include "collectives/setup.h"
#include "core/log_internal.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FSDP2_CUDA_MODULE_ABI 2u
/* The module's file name, looked for beside libfsdp2.so and on the library path. */
#define FSDP2_CUDA_MODULE_FILE "libfsdp2-cuda.so"
#define FSDP2_CUDA_MODULE_INIT "fsdp2_cuda_module_init"

struct fsdp2_device_ops;
struct fsdp2_group;
struct fsdp2_group_ops;
struct optim_coeffs;
struct optim_shard;

/* What libfsdp2 lends the module at load time. The variadic entries take printf formats. */
typedef struct fsdp2_cuda_host {
    uint32_t abi;  /* FSDP2_CUDA_MODULE_ABI */
    uint32_t size; /* sizeof(fsdp2_cuda_host_t) */
    fsdp2_status_t (*error)(fsdp2_status_t status, const char *fmt, ...);
    void (*error_set_message)(const char *msg);
    const char *(*last_error)(void);
    const char *(*status_name)(fsdp2_status_t status);
    int (*log_enabled)(fsdp2_log_level_t level, fsdp2_subsys_t subsys);
    void (*log_write)(fsdp2_log_level_t level, fsdp2_subsys_t subsys, const char *fmt, ...);
    fsdp2_status_t (*device_alloc)(fsdp2_device_t device, size_t bytes, void **ptr);
    fsdp2_status_t (*dtype_size)(fsdp2_dtype_t dtype, size_t *bytes);
    const char *(*dtype_name)(fsdp2_dtype_t dtype);
    uint16_t (*f64_to_bf16)(double value);
    uint16_t (*f64_to_f16)(double value);
} fsdp2_cuda_host_t;

/* What the collectives layer lends the nccl backend when it first asks for it. */
typedef struct fsdp2_cuda_group_host {
    uint32_t abi;
    uint32_t size; /* sizeof(fsdp2_cuda_group_host_t) */
    fsdp2_status_t (*group_fail)(struct fsdp2_group *g, fsdp2_status_t status, const char *fmt,
                                 ...);
    fsdp2_status_t (*group_check)(struct fsdp2_group *g);
    void (*group_member_key)(const struct fsdp2_group *g, const char *what, int r, char *key);
    const char *(*coll_kind_name)(int kind);
    fsdp2_status_t (*store_set)(fsdp2_store_t *store, const char *key, const void *value,
                                size_t len);
    fsdp2_status_t (*store_get)(fsdp2_store_t *store, const char *key, void *buf, size_t cap,
                                size_t *len);
    fsdp2_status_t (*store_add)(fsdp2_store_t *store, const char *key, int64_t delta,
                                int64_t *result);
    fsdp2_status_t (*setup_wait_keys)(fsdp2_setup_t *s, fsdp2_store_t *store,
                                      const char *const *keys, size_t n, const char *verb);
} fsdp2_cuda_group_host_t;

/* A piece of one optimizer shard that one block updates. */
typedef struct fsdp2_cuda_optim_chunk {
    int32_t shard; /* index into the shard table */
    int32_t count; /* elements, at most FSDP2_CUDA_OPTIM_CHUNK */
    int64_t start; /* first element */
} fsdp2_cuda_optim_chunk_t;

#define FSDP2_CUDA_OPTIM_CHUNK 65536

/* Bytes of a cuda device's scratch: what gradient clipping combines its norm in. */
#define FSDP2_CUDA_SCRATCH ((size_t)64 << 10)

/* The module's entry points. */
typedef struct fsdp2_cuda_module {
    uint32_t abi;
    uint32_t size; /* sizeof(fsdp2_cuda_module_t) */
    const struct fsdp2_device_ops *device_ops;
    /* The nccl collectives backend, given the collectives layer's helpers (the first call
     * keeps them; every call returns the same ops). */
    const struct fsdp2_group_ops *(*nccl_ops)(const fsdp2_cuda_group_host_t *group_host);

    /* Chunks needed for shards of these sizes (to size the table), and the table itself
     * (host memory, fsdp2_cuda_optim_chunks(shards, count) entries). */
    size_t (*optim_chunks)(const struct optim_shard *shards, size_t count);
    void (*optim_fill_chunks)(const struct optim_shard *shards, size_t count,
                              fsdp2_cuda_optim_chunk_t *chunks);
    /* One step of rule c->kind over the shards of dtype (f32 or f64) whose table (shards,
     * device pointers inside) and chunks are in device memory, on the current stream of
     * cuda:index. */
    fsdp2_status_t (*optim_step)(int index, const struct optim_coeffs *c, fsdp2_dtype_t dtype,
                                 const void *shards, const void *chunks, size_t nchunks);
    /* The scratch of cuda:index (FSDP2_CUDA_SCRATCH bytes), allocated at the first call
     * through the device allocator (so counted) and kept for the process. */
    fsdp2_status_t (*scratch)(int index, double **scratch);
    /* *share (device memory) = the 2-norm's sum of squares (inf 0) or the inf-norm's max
     * |g| (inf 1) over count f32/f64 tensors on cuda:index, on its current stream. */
    fsdp2_status_t (*norm_shares)(int index, fsdp2_tensor_t *const *grads, size_t count, int inf,
                                  double *share);
    /* Every tensor scaled by coef in place, on the current stream (as clipping scales cpu
     * gradients: f32 with coef rounded to f32 first). */
    fsdp2_status_t (*scale_all)(int index, fsdp2_tensor_t *const *grads, size_t count,
                                double coef);
} fsdp2_cuda_module_t;

/* The module's one exported symbol. Keeps host (static storage on libfsdp2's side) and
 * sets *module; FSDP2_ERR_NOT_AVAILABLE when host is from another build. */
typedef fsdp2_status_t (*fsdp2_cuda_module_init_fn)(const fsdp2_cuda_host_t *host,
                                                    const fsdp2_cuda_module_t **module);

#ifdef __cplusplus
}
#endif

#endif
