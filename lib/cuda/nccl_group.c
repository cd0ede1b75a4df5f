/* The nccl backend: collectives on CUDA memory over one NCCL communicator per group.
 *
 * Set-up: every member adds 1 to the group's creation counter in the store, which tells
 * it this creation's generation (a group name may be created again after a destroy);
 * rank 0 publishes a fresh ncclUniqueId under that generation and the others read it.
 * The communicator is non-blocking (ncclConfig_t.blocking = 0): no NCCL call waits for
 * peers on the caller's thread. Initialisation is polled with ncclCommGetAsyncError
 * until it is done, the group's timeout passes or the group is aborted.
 *
 * Collectives are enqueued on the caller's cuda stream, in the group's sequence order
 * on every member (NCCL matches them by order). all_gather_pieces is a grouped set of
 * broadcasts, one per rank and piece, straight into the pieces: every member must pass
 * the same piece sizes (FSDP's layouts are the same on every rank); a layout that is
 * one contiguous rank-major block is a plain all-gather. Reductions: SUM and AVG map to
 * ncclSum and ncclAvg; other divide factors to ncclPreMulSum with 1 / (pre * post) as
 * the scalar, so each contribution is scaled once before the sum. The rounding is
 * NCCL's: with bf16 and f16 the sums are not the rank-order f32 sums of the ucx backend.
 * In a group of one, a reduction with divide factors is the library's own kernel (the
 * ucx backend's result, bit for bit): NCCL's one-rank reduction kernel leaves the last
 * elements unwritten before NCCL 2.29.7 (NVIDIA/nccl issue 1950; seen with 2.28.9).
 *
 * Errors: after each collective an event is recorded on its stream; a watchdog thread
 * polls the pending events and ncclCommGetAsyncError. A collective still pending after
 * the group's timeout, or an asynchronous NCCL error (a failed peer), fails the group
 * (its sticky error) and aborts the communicator (ncclCommAbort), which ends the kernels
 * that were waiting; fsdp2_group_abort does the same at once. Later collectives fail
 * with that error. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "collectives/group_internal.h"
#include "core/clock.h"
#include "core/device_ops.h"
#include "core/error.h"
#include "core/log_internal.h"
#include "cuda/cuda_check.h"
#include "cuda/cuda_kernels.h"
#include "cuda/cuda_stream.h"

/* Collectives in flight that the watchdog follows; an enqueue that finds them all in use
 * waits for the oldest to finish. */
#define NCCL_PENDING 1024
/* How often the watchdog looks at pending collectives. */
#define NCCL_WATCH_MS 5

typedef struct nccl_pending {
    cudaEvent_t done;
    uint64_t seq;
    coll_kind_t kind;
    int64_t since_ms;
} nccl_pending_t;

typedef struct nccl_group {
    ncclComm_t comm;
    int device;
    float *barrier_buf; /* one element on the device */
    /* Everything below, and every use of comm, under lock. comm_gone: aborted or
     * destroyed, comm must not be touched. */
    pthread_mutex_t lock;
    pthread_cond_t wake;
    int comm_gone;
    int stopping;
    pthread_t watchdog;
    int watchdog_started;
    nccl_pending_t pending[NCCL_PENDING];
    size_t head, count; /* ring of pending collectives, oldest at head */
} nccl_group_t;

static nccl_group_t *ng_of(fsdp2_group_t *g)
{
    return (nccl_group_t *)g->backend;
}

static fsdp2_status_t nccl_status(fsdp2_group_t *g, ncclResult_t res, const char *call)
{
    const char *last = ncclGetLastError(NULL);
    fsdp2_status_t status = res == ncclInvalidArgument || res == ncclInvalidUsage
                                ? FSDP2_ERR_INVALID_ARGUMENT
                                : res == ncclRemoteError || res == ncclSystemError
                                      ? FSDP2_ERR_PEER_FAILED
                                      : FSDP2_ERR_BACKEND;
    return fsdp2_group_fail(g, status, "%s failed on cuda:%d: %s%s%s", call, ng_of(g)->device,
                            ncclGetErrorString(res), last && last[0] ? ": " : "",
                            last ? last : "");
}

/* Makes the group's device current for the calling thread; *prev to restore, or -1. */
static fsdp2_status_t enter_device(int device, int *prev)
{
    int current = -1;
    *prev = -1;
    FSDP2_CUDA_CHECK(cudaGetDevice(&current));
    if (current != device) {
        FSDP2_CUDA_CHECK(cudaSetDevice(device));
        *prev = current;
    }
    return FSDP2_SUCCESS;
}

static void leave_device(int prev)
{
    if (prev >= 0)
        (void)cudaSetDevice(prev);
}

/* Aborts the communicator once (lock held): its kernels end, its resources go. */
static void abort_comm_locked(nccl_group_t *ng)
{
    if (ng->comm_gone)
        return;
    ng->comm_gone = 1;
    ncclResult_t res = ncclCommAbort(ng->comm);
    if (res != ncclSuccess)
        FSDP2_LOG(WARN, COLL, "ncclCommAbort: %s", ncclGetErrorString(res));
}

/* Waits (lock held) until the communicator's last call has finished: ncclInProgress
 * polled until done, the deadline, or an abort of the group. */
static fsdp2_status_t wait_done_locked(fsdp2_group_t *g, ncclResult_t res, const char *call,
                                       int64_t deadline_ms)
{
    nccl_group_t *ng = ng_of(g);
    while (res == ncclInProgress) {
        if (atomic_load(&g->aborted) || ng->comm_gone) {
            fsdp2_status_t status = fsdp2_group_check(g);
            return status != FSDP2_SUCCESS
                       ? status
                       : fsdp2_group_fail(g, FSDP2_ERR_ABORTED, "%s: the group was aborted", call);
        }
        if (fsdp2_now_ms() > deadline_ms) {
            fsdp2_status_t status = fsdp2_group_fail(
                g, FSDP2_ERR_TIMEOUT, "%s did not complete within %.1f s (the group's timeout)",
                call, (double)g->timeout_ms / 1e3);
            abort_comm_locked(ng);
            return status;
        }
        struct timespec nap = {0, 100000}; /* 0.1 ms */
        nanosleep(&nap, NULL);
        ncclResult_t async = ncclSuccess;
        ncclResult_t got = ncclCommGetAsyncError(ng->comm, &async);
        res = got != ncclSuccess ? got : async;
    }
    if (res != ncclSuccess) {
        fsdp2_status_t status = nccl_status(g, res, call);
        abort_comm_locked(ng);
        return status;
    }
    return FSDP2_SUCCESS;
}

/* ---- the watchdog ---- */

static void *watchdog_main(void *arg)
{
    fsdp2_group_t *g = arg;
    nccl_group_t *ng = ng_of(g);
    (void)cudaSetDevice(ng->device);
    pthread_mutex_lock(&ng->lock);
    while (!ng->stopping) {
        if (ng->count == 0 || ng->comm_gone) {
            pthread_cond_wait(&ng->wake, &ng->lock);
            continue;
        }
        while (ng->count > 0) { /* retire what has finished, oldest first */
            cudaError_t err = cudaEventQuery(ng->pending[ng->head].done);
            if (err == cudaErrorNotReady) {
                (void)cudaGetLastError();
                break;
            }
            if (err != cudaSuccess) {
                fsdp2_cuda_status(err, "cudaEventQuery", __FILE__, __LINE__);
                fsdp2_group_fail(g, FSDP2_ERR_BACKEND, "%s seq %llu: %s",
                                 fsdp2_coll_kind_name(ng->pending[ng->head].kind),
                                 (unsigned long long)ng->pending[ng->head].seq,
                                 fsdp2_last_error());
                abort_comm_locked(ng);
                break;
            }
            ng->head = (ng->head + 1) % NCCL_PENDING;
            ng->count--;
            pthread_cond_broadcast(&ng->wake); /* an enqueue may wait for a free entry */
        }
        if (ng->count > 0 && !ng->comm_gone) {
            const nccl_pending_t *p = &ng->pending[ng->head];
            ncclResult_t async = ncclSuccess;
            ncclResult_t got = ncclCommGetAsyncError(ng->comm, &async);
            if (got != ncclSuccess || (async != ncclSuccess && async != ncclInProgress)) {
                nccl_status(g, got != ncclSuccess ? got : async, fsdp2_coll_kind_name(p->kind));
                abort_comm_locked(ng);
            } else if (fsdp2_now_ms() - p->since_ms > g->timeout_ms) {
                fsdp2_group_fail(g, FSDP2_ERR_TIMEOUT,
                                 "%s (seq %llu) did not finish within %.1f s (the group's "
                                 "timeout: a peer is dead or hung, or the stream is blocked); "
                                 "the NCCL communicator was aborted",
                                 fsdp2_coll_kind_name(p->kind), (unsigned long long)p->seq,
                                 (double)g->timeout_ms / 1e3);
                abort_comm_locked(ng);
            }
        }
        if (ng->count > 0 && !ng->comm_gone) {
            /* ng->wake counts the default clock */
            struct timespec until = fsdp2_time_after(CLOCK_REALTIME, NCCL_WATCH_MS * 1000000LL);
            pthread_cond_timedwait(&ng->wake, &ng->lock, &until);
        }
    }
    pthread_mutex_unlock(&ng->lock);
    return NULL;
}

/* ---- set-up ---- */

static fsdp2_status_t pick_device(fsdp2_group_t *g, int *device)
{
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess || count == 0) {
        (void)cudaGetLastError();
        return fsdp2_error(FSDP2_ERR_NOT_AVAILABLE, "group '%s' (nccl): no CUDA device: %s",
                           g->name, err != cudaSuccess ? cudaGetErrorString(err) : "0 devices");
    }
    if (g->cuda_device < 0)
        FSDP2_CUDA_CHECK(cudaGetDevice(device));
    else
        *device = g->cuda_device;
    if (*device >= count)
        return fsdp2_error(FSDP2_ERR_INVALID_ARGUMENT,
                           "group '%s' (nccl): rank %d asks for cuda:%d but this host has %d "
                           "CUDA device%s (NCCL needs one GPU per rank of a host)",
                           g->name, g->rank, *device, count, count == 1 ? "" : "s");
    return FSDP2_SUCCESS;
}

/* The unique id of this creation of the group, from rank 0 through the store. */
static fsdp2_status_t exchange_id(fsdp2_group_t *g, fsdp2_store_t *store, ncclUniqueId *id)
{
    char key[FSDP2_GROUP_KEY_MAX];
    int64_t created = 0;
    snprintf(key, sizeof(key), "%s/nccl-creations", g->name);
    FSDP2_CHECK(fsdp2_store_add(store, key, 1, &created));
    int64_t generation = (created - 1) / g->size;
    char what[64];
    snprintf(what, sizeof(what), "nccl-id-%lld", (long long)generation);
    fsdp2_group_member_key(g, what, 0, key);
    if (g->rank == 0) {
        ncclResult_t res = ncclGetUniqueId(id);
        if (res != ncclSuccess)
            return fsdp2_error(FSDP2_ERR_BACKEND, "group '%s': ncclGetUniqueId: %s", g->name,
                               ncclGetErrorString(res));
        return fsdp2_store_set(store, key, id, sizeof(*id));
    }
    size_t len = 0;
    const char *keys[1] = {key};
    FSDP2_CHECK(fsdp2_setup_wait_keys(&g->setup, store, keys, 1, "hear rank 0's NCCL unique id"));
    FSDP2_CHECK(fsdp2_store_get(store, key, id, sizeof(*id), &len));
    if (len != sizeof(*id))
        return fsdp2_error(FSDP2_ERR_CORRUPT, "group '%s': NCCL unique id '%s' has %zu bytes, "
                           "not %zu", g->name, key, len, sizeof(*id));
    return FSDP2_SUCCESS;
}

static void free_group(nccl_group_t *ng)
{
    for (size_t i = 0; i < NCCL_PENDING; i++)
        if (ng->pending[i].done)
            (void)cudaEventDestroy(ng->pending[i].done);
    if (ng->barrier_buf)
        (void)cudaFree(ng->barrier_buf);
    pthread_cond_destroy(&ng->wake);
    pthread_mutex_destroy(&ng->lock);
    free(ng);
}

static fsdp2_status_t nccl_create(fsdp2_group_t *g, fsdp2_store_t *store)
{
    int device;
    FSDP2_CHECK(pick_device(g, &device));
    nccl_group_t *ng = calloc(1, sizeof(*ng));
    if (!ng)
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "group '%s': nccl state", g->name);
    ng->device = device;
    g->cuda_device = device; /* group.c checks streams against it */
    ng->comm_gone = 1; /* until initialised */
    pthread_mutex_init(&ng->lock, NULL);
    pthread_cond_init(&ng->wake, NULL);
    g->backend = ng;
    fsdp2_status_t status = FSDP2_SUCCESS;
    int prev = -1;
    FSDP2_CHECK_GOTO(enter_device(device, &prev), status, fail);
    for (size_t i = 0; i < NCCL_PENDING; i++)
        FSDP2_CUDA_CHECK_GOTO(cudaEventCreateWithFlags(&ng->pending[i].done,
                                                       cudaEventDisableTiming),
                              status, fail);
    FSDP2_CUDA_CHECK_GOTO(cudaMalloc((void **)&ng->barrier_buf, sizeof(float)), status, fail);
    FSDP2_CUDA_CHECK_GOTO(cudaMemset(ng->barrier_buf, 0, sizeof(float)), status, fail);
    ncclUniqueId id;
    FSDP2_CHECK_GOTO(exchange_id(g, store, &id), status, fail);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    int64_t deadline = fsdp2_now_ms() + g->timeout_ms;
    pthread_mutex_lock(&ng->lock);
    ncclResult_t res = ncclCommInitRankConfig(&ng->comm, g->size, id, g->rank, &config);
    if (res == ncclSuccess || res == ncclInProgress)
        ng->comm_gone = 0;
    status = ng->comm_gone ? nccl_status(g, res, "ncclCommInitRankConfig")
                           : wait_done_locked(g, res, "ncclCommInitRankConfig", deadline);
    pthread_mutex_unlock(&ng->lock);
    if (status != FSDP2_SUCCESS)
        goto fail;
    if (pthread_create(&ng->watchdog, NULL, watchdog_main, g) != 0) {
        status = fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "group '%s': watchdog thread", g->name);
        goto fail;
    }
    ng->watchdog_started = 1;
    leave_device(prev);
    FSDP2_LOG(INFO, COLL, "group '%s': NCCL communicator on cuda:%d, rank %d of %d", g->name,
              device, g->rank, g->size);
    return FSDP2_SUCCESS;
fail:
    pthread_mutex_lock(&ng->lock);
    abort_comm_locked(ng);
    pthread_mutex_unlock(&ng->lock);
    free_group(ng);
    g->backend = NULL;
    leave_device(prev);
    return status;
}

static void nccl_destroy(fsdp2_group_t *g)
{
    nccl_group_t *ng = ng_of(g);
    if (!ng)
        return;
    int prev = -1;
    (void)enter_device(ng->device, &prev);
    pthread_mutex_lock(&ng->lock);
    ng->stopping = 1;
    pthread_cond_broadcast(&ng->wake);
    pthread_mutex_unlock(&ng->lock);
    if (ng->watchdog_started)
        pthread_join(ng->watchdog, NULL);
    pthread_mutex_lock(&ng->lock);
    if (!ng->comm_gone) {
        /* Streams were synchronized (the contract): finalize flushes, destroy frees. A
         * failed or slow finalize aborts instead. */
        int64_t deadline = fsdp2_now_ms() + g->timeout_ms;
        ncclResult_t res = ncclCommFinalize(ng->comm);
        if (wait_done_locked(g, res, "ncclCommFinalize", deadline) == FSDP2_SUCCESS &&
            !ng->comm_gone) {
            ng->comm_gone = 1;
            res = ncclCommDestroy(ng->comm);
            if (res != ncclSuccess)
                FSDP2_LOG(WARN, COLL, "group '%s': ncclCommDestroy: %s", g->name,
                          ncclGetErrorString(res));
        }
        abort_comm_locked(ng); /* no-op when destroyed */
    }
    pthread_mutex_unlock(&ng->lock);
    free_group(ng);
    g->backend = NULL;
    leave_device(prev);
}

/* NCCL has no message to tell the peers why: their communicators fail by their own
 * watchdog (the group's timeout), as with ncclCommAbort everywhere. */
static void nccl_abort(fsdp2_group_t *g, const char *reason)
{
    (void)reason;
    nccl_group_t *ng = ng_of(g);
    int prev = -1;
    if (enter_device(ng->device, &prev) != FSDP2_SUCCESS)
        return;
    pthread_mutex_lock(&ng->lock);
    abort_comm_locked(ng);
    pthread_cond_broadcast(&ng->wake);
    pthread_mutex_unlock(&ng->lock);
    leave_device(prev);
}

/* ---- collectives ---- */

static int nccl_type_of(fsdp2_dtype_t dtype, ncclDataType_t *type)
{
    switch (dtype) {
    case FSDP2_F32: *type = ncclFloat32; return 1;
    case FSDP2_F64: *type = ncclFloat64; return 1;
    case FSDP2_BF16: *type = ncclBfloat16; return 1;
    case FSDP2_F16: *type = ncclFloat16; return 1;
    case FSDP2_I32: *type = ncclInt32; return 1;
    case FSDP2_I64: *type = ncclInt64; return 1;
    case FSDP2_U8: *type = ncclUint8; return 1;
    default: return 0;
    }
}

/* The reduction op for op->reduce: *custom says whether it was created (and must be
 * destroyed once the call that uses it has returned). */
static ncclResult_t reduction_of(fsdp2_group_t *g, const coll_op_t *op, ncclDataType_t type,
                                 ncclRedOp_t *red, int *custom)
{
    nccl_group_t *ng = ng_of(g);
    double pre = op->reduce.pre_divide, post = op->reduce.post_divide;
    *custom = 0;
    if (pre == 1.0 && post == 1.0) {
        *red = ncclSum;
        return ncclSuccess;
    }
    if (pre == 1.0 && post == (double)g->size && op->reduce.op == FSDP2_REDUCE_AVG) {
        *red = ncclAvg;
        return ncclSuccess;
    }
    double factor = 1.0 / (pre * post);
    union {
        float f32;
        double f64;
        uint16_t u16;
    } scalar;
    switch (op->dtype) {
    case FSDP2_F32: scalar.f32 = (float)factor; break;
    case FSDP2_F64: scalar.f64 = factor; break;
    case FSDP2_BF16: scalar.u16 = fsdp2_f64_to_bf16(factor); break;
    default: scalar.u16 = fsdp2_f64_to_f16(factor); break;
    }
    *custom = 1;
    return ncclRedOpCreatePreMulSum(red, &scalar, type, ncclScalarHostImmediate, ng->comm);
}

/* The pieces as one contiguous rank-major block (what a plain all-gather writes), or
 * NULL. */
static void *pieces_contiguous(const fsdp2_group_t *g, const coll_op_t *op)
{
    size_t n = op->offsets[g->size];
    char *base = NULL, *at = NULL;
    for (size_t k = 0; k < n; k++) {
        if (!op->pieces[k].bytes)
            continue;
        if (!base)
            base = at = op->pieces[k].data;
        if ((char *)op->pieces[k].data != at)
            return NULL;
        at += op->pieces[k].bytes;
    }
    return base;
}

/* Issues op's NCCL calls (lock held); the result of the last one. A reduction op made
 * for the call comes back in *red with *custom set: it may be destroyed once the call
 * has finished (not while it is in progress). */
static ncclResult_t issue(fsdp2_group_t *g, const coll_op_t *op, cudaStream_t cs,
                          ncclDataType_t type, ncclRedOp_t *red, int *custom)
{
    nccl_group_t *ng = ng_of(g);
    ncclComm_t comm = ng->comm;
    *custom = 0;
    switch (op->kind) {
    case COLL_ALL_GATHER:
        return ncclAllGather(op->send, op->recv, op->count, type, comm, cs);
    case COLL_ALL_GATHER_PIECES: {
        void *flat = pieces_contiguous(g, op);
        if (flat)
            return ncclAllGather(op->send, flat, op->count, ncclUint8, comm, cs);
        ncclResult_t res = ncclGroupStart();
        for (int r = 0; r < g->size && res == ncclSuccess; r++) {
            size_t at = 0;
            for (size_t k = op->offsets[r]; k < op->offsets[r + 1] && res == ncclSuccess; k++) {
                size_t bytes = op->pieces[k].bytes;
                if (bytes)
                    res = ncclBroadcast((const char *)op->send + at, op->pieces[k].data, bytes,
                                        ncclUint8, r, comm, cs);
                at += bytes;
            }
        }
        ncclResult_t end = ncclGroupEnd();
        return res != ncclSuccess ? res : end;
    }
    case COLL_REDUCE_SCATTER:
    case COLL_ALL_REDUCE: {
        ncclResult_t res = reduction_of(g, op, type, red, custom);
        if (res != ncclSuccess)
            return res;
        if (op->kind == COLL_REDUCE_SCATTER)
            return ncclReduceScatter(op->send, op->recv, op->count, type, *red, comm, cs);
        return ncclAllReduce(op->send, op->recv, op->count, type, *red, comm, cs);
    }
    case COLL_BROADCAST:
        return ncclBroadcast(op->send, op->recv, op->count, type, op->root, comm, cs);
    case COLL_BARRIER:
        return ncclAllReduce(ng->barrier_buf, ng->barrier_buf, 1, ncclFloat32, ncclSum, comm, cs);
    }
    return ncclInvalidArgument;
}

/* A reduction over one rank that divides: done by fsdp2_cuda_divide, not NCCL. */
static int one_rank_divide(const fsdp2_group_t *g, const coll_op_t *op)
{
    return g->size == 1 && (op->kind == COLL_REDUCE_SCATTER || op->kind == COLL_ALL_REDUCE) &&
           (op->reduce.pre_divide != 1.0 || op->reduce.post_divide != 1.0);
}

/* Follows op on stream: an event the watchdog polls (lock held). */
static fsdp2_status_t track_locked(fsdp2_group_t *g, const coll_op_t *op, cudaStream_t cs)
{
    nccl_group_t *ng = ng_of(g);
    while (ng->count == NCCL_PENDING && !ng->comm_gone)
        pthread_cond_wait(&ng->wake, &ng->lock);
    if (ng->comm_gone)
        return FSDP2_SUCCESS;
    nccl_pending_t *p = &ng->pending[(ng->head + ng->count) % NCCL_PENDING];
    FSDP2_CUDA_CHECK(cudaEventRecord(p->done, cs));
    p->seq = op->seq;
    p->kind = op->kind;
    p->since_ms = fsdp2_now_ms();
    if (ng->count++ == 0)
        pthread_cond_broadcast(&ng->wake);
    return FSDP2_SUCCESS;
}

static fsdp2_status_t nccl_enqueue(fsdp2_group_t *g, const coll_op_t *op, fsdp2_stream_t *stream)
{
    nccl_group_t *ng = ng_of(g);
    const char *what = fsdp2_coll_kind_name(op->kind); /* group.c checked the stream */
    ncclDataType_t type = ncclUint8;
    if (op->kind != COLL_BARRIER && !nccl_type_of(op->dtype, &type))
        return fsdp2_error(FSDP2_ERR_INVALID_ARGUMENT, "%s on group '%s': dtype %d", what,
                           g->name, (int)op->dtype);
    if (op->kind != COLL_BARRIER && op->count == 0)
        return FSDP2_SUCCESS; /* every member skips it alike: counts agree */
    cudaStream_t cs = fsdp2_cuda_stream_handle(stream);
    int prev = -1;
    FSDP2_CHECK(enter_device(ng->device, &prev));
    pthread_mutex_lock(&ng->lock);
    fsdp2_status_t status = fsdp2_group_check(g);
    if (status == FSDP2_SUCCESS && ng->comm_gone)
        status = fsdp2_group_fail(g, FSDP2_ERR_ABORTED, "%s: the NCCL communicator was aborted",
                                  what);
    if (status == FSDP2_SUCCESS) {
        int64_t deadline = fsdp2_now_ms() + g->timeout_ms;
        ncclRedOp_t red = ncclSum;
        int custom = 0;
        ncclResult_t res = ncclSuccess;
        if (one_rank_divide(g, op)) {
            cudaError_t err = fsdp2_cuda_divide(op->recv, op->send, op->dtype, op->count,
                                                op->reduce.pre_divide, op->reduce.post_divide, cs);
            if (err != cudaSuccess)
                status = fsdp2_cuda_status(err, "fsdp2_cuda_divide", __FILE__, __LINE__);
        } else {
            res = issue(g, op, cs, type, &red, &custom);
        }
        if (status == FSDP2_SUCCESS)
            status = wait_done_locked(g, res, what, deadline);
        if (custom && !ng->comm_gone)
            (void)ncclRedOpDestroy(red, ng->comm);
    }
    if (status == FSDP2_SUCCESS)
        status = track_locked(g, op, cs);
    pthread_mutex_unlock(&ng->lock);
    leave_device(prev);
    return status;
}

/* Pending collectives whose event has not completed (the watchdog retires completed
 * ones only every few milliseconds). */
static int nccl_in_flight(fsdp2_group_t *g)
{
    nccl_group_t *ng = ng_of(g);
    int prev = -1, n = 0;
    if (enter_device(ng->device, &prev) != FSDP2_SUCCESS)
        return 0;
    pthread_mutex_lock(&ng->lock);
    for (size_t i = 0; !ng->comm_gone && i < ng->count; i++) {
        cudaError_t err = cudaEventQuery(ng->pending[(ng->head + i) % NCCL_PENDING].done);
        if (err == cudaErrorNotReady)
            n++;
        (void)cudaGetLastError();
    }
    pthread_mutex_unlock(&ng->lock);
    leave_device(prev);
    return n;
}

const fsdp2_group_ops_t fsdp2_nccl_group_ops = {
    .name = "nccl",
    .create = nccl_create,
    .destroy = nccl_destroy,
    .enqueue = nccl_enqueue,
    .abort = nccl_abort,
    .in_flight = nccl_in_flight,
};
