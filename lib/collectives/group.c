/* Process groups: argument checks, sequence numbers and the sticky error; the backend
 * (ucx for host memory, nccl for CUDA memory) does the communication. */
#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "collectives/group_internal.h"
#include "core/clock.h"
#include "core/cuda_loader.h"
#include "core/device_ops.h"
#include "core/env_internal.h"
#include "core/error.h"
#include "core/fault.h"
#include "core/options.h"
#include "core/log_internal.h"
#include "core/trace_internal.h"
#include "mesh/store_internal.h"

const char *fsdp2_coll_kind_name(coll_kind_t kind)
{
    switch (kind) {
    case COLL_ALL_GATHER: return "all_gather";
    case COLL_ALL_GATHER_PIECES: return "all_gather_pieces";
    case COLL_REDUCE_SCATTER: return "reduce_scatter";
    case COLL_ALL_REDUCE: return "all_reduce";
    case COLL_BROADCAST: return "broadcast";
    case COLL_BARRIER: return "barrier";
    }
    return "collective";
}

static int is_reduction(coll_kind_t kind)
{
    return kind == COLL_REDUCE_SCATTER || kind == COLL_ALL_REDUCE;
}

void fsdp2_coll_stamp(const coll_op_t *op, coll_stamp_t *s)
{
    memset(s, 0, sizeof(*s));
    s->kind = (uint32_t)op->kind;
    s->dtype = (uint32_t)op->dtype;
    s->bytes = (uint64_t)op->count * op->elem_size;
    s->root = op->kind == COLL_BROADCAST ? op->root : 0;
    s->reduce = is_reduction(op->kind) ? (uint32_t)op->reduce.op : 0;
}

int fsdp2_coll_stamp_equal(const coll_stamp_t *a, const coll_stamp_t *b)
{
    return a->kind == b->kind && a->dtype == b->dtype && a->bytes == b->bytes &&
           a->root == b->root && a->reduce == b->reduce;
}

void fsdp2_coll_stamp_text(const coll_stamp_t *s, uint64_t seq, char *buf, size_t len)
{
    unsigned long long q = (unsigned long long)seq, bytes = (unsigned long long)s->bytes;
    if (s->kind > COLL_BARRIER) /* from a peer that speaks another protocol */
        snprintf(buf, len, "an unknown collective %u (seq %llu)", s->kind, q);
    else if (s->kind == COLL_BARRIER)
        snprintf(buf, len, "barrier (seq %llu)", q);
    else if (s->kind == COLL_BROADCAST)
        snprintf(buf, len, "broadcast of %llu B from rank %d (seq %llu)", bytes, s->root, q);
    else if (is_reduction((coll_kind_t)s->kind))
        snprintf(buf, len, "%s of %llu B of %s, %s (seq %llu)",
                 fsdp2_coll_kind_name((coll_kind_t)s->kind), bytes,
                 fsdp2_dtype_name((fsdp2_dtype_t)s->dtype), s->reduce ? "avg" : "sum", q);
    else
        snprintf(buf, len, "%s of %llu B (seq %llu)", fsdp2_coll_kind_name((coll_kind_t)s->kind),
                 bytes, q);
}

/* Tells a launcher that watches (fsdp2run: FSDP2_RUN_REPORT_FD, a pipe) whether this
 * process's first group failure was its own ("origin") or a peer's ("echo"), so that it
 * can name the rank that failed first rather than the first to exit. Once per process;
 * a line of a few bytes is one atomic write, and a full pipe drops it. */
static void report_to_launcher(int echo)
{
    static atomic_int reported;
    int64_t fd = fsdp2_env_int(FSDP2_ENV_RUN_REPORT_FD), r;
    const char *rank = getenv("RANK"); /* fsdp2run's, torchrun style */
    if (fd < 3 || !rank || !fsdp2_env_decimal(rank, 0, INT32_MAX, &r) ||
        atomic_exchange(&reported, 1))
        return;
    char line[48];
    int n = snprintf(line, sizeof(line), "%lld %s\n", (long long)r, echo ? "echo" : "origin");
    if (write((int)fd, line, (size_t)n) != n)
        FSDP2_LOG(DEBUG, COLL, "could not tell the launcher (FSDP2_RUN_REPORT_FD=%lld)",
                  (long long)fd);
}

fsdp2_status_t fsdp2_group_fail(fsdp2_group_t *g, fsdp2_status_t status, const char *fmt, ...)
{
    char message[384];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof(message), fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&g->error_lock);
    int expected = FSDP2_SUCCESS;
    if (atomic_compare_exchange_strong(&g->error, &expected, (int)status)) {
        snprintf(g->error_message, sizeof(g->error_message), "group '%s' rank %d: %s", g->name,
                 g->rank, message);
        FSDP2_LOG(WARN, COLL, "%s", g->error_message);
        report_to_launcher(status == FSDP2_ERR_PEER_FAILED);
    }
    pthread_mutex_unlock(&g->error_lock);
    return fsdp2_error(status, "group '%s' rank %d: %s", g->name, g->rank, message);
}

void fsdp2_group_error_text(fsdp2_group_t *g, char *buf, size_t len)
{
    pthread_mutex_lock(&g->error_lock);
    snprintf(buf, len, "%s", g->error_message);
    pthread_mutex_unlock(&g->error_lock);
}

void fsdp2_group_break(fsdp2_group_t *g, fsdp2_status_t status, const char *reason)
{
    char kept[1024], message[512];
    snprintf(kept, sizeof(kept), "%s", fsdp2_last_error());
    snprintf(message, sizeof(message), "%s", reason ? reason : "");
    fsdp2_group_fail(g, status == FSDP2_SUCCESS ? FSDP2_ERR_ABORTED : status, "%s", message);
    if (!atomic_exchange(&g->aborted, 1) && g->ops->abort)
        g->ops->abort(g, message);
    fsdp2_error_set_message(kept);
}

fsdp2_status_t fsdp2_group_check(fsdp2_group_t *g)
{
    fsdp2_status_t status = (fsdp2_status_t)atomic_load(&g->error);
    if (status == FSDP2_SUCCESS)
        return FSDP2_SUCCESS;
    pthread_mutex_lock(&g->error_lock);
    fsdp2_error_set_message(g->error_message);
    pthread_mutex_unlock(&g->error_lock);
    return status;
}

/* ---- the nccl backend, from the CUDA module ---- */

static const char *kind_name(int kind)
{
    return fsdp2_coll_kind_name((coll_kind_t)kind);
}

static const fsdp2_cuda_group_host_t nccl_host = {
    .abi = FSDP2_CUDA_MODULE_ABI,
    .size = sizeof(fsdp2_cuda_group_host_t),
    .group_fail = fsdp2_group_fail,
    .group_check = fsdp2_group_check,
    .group_member_key = fsdp2_group_member_key,
    .coll_kind_name = kind_name,
    .store_set = fsdp2_store_set,
    .store_get = fsdp2_store_get,
    .store_add = fsdp2_store_add,
    .setup_wait_keys = fsdp2_setup_wait_keys,
};

static pthread_once_t nccl_once = PTHREAD_ONCE_INIT;
static const fsdp2_group_ops_t *nccl_group_ops;

static void nccl_load(void)
{
    const fsdp2_cuda_module_t *module = NULL;
    if (fsdp2_cuda_module_get(&module) == FSDP2_SUCCESS)
        nccl_group_ops = module->nccl_ops(&nccl_host);
}

static fsdp2_status_t nccl_ops(const fsdp2_group_ops_t **ops)
{
    pthread_once(&nccl_once, nccl_load);
    if (!nccl_group_ops) {
        const fsdp2_cuda_module_t *module = NULL;
        FSDP2_CHECK(fsdp2_cuda_module_get(&module)); /* the loader's kept message */
        return fsdp2_error(FSDP2_ERR_INTERNAL, "the CUDA module refused this libfsdp2's "
                           "collectives table (another copy of libfsdp2 in the process?)");
    }
    *ops = nccl_group_ops;
    return FSDP2_SUCCESS;
}

long fsdp2_group_timeout_ms(const fsdp2_group_options_t *options)
{
    return options && options->timeout_ms > 0 ? options->timeout_ms
                                              : (long)fsdp2_env_int(FSDP2_ENV_TIMEOUT);
}

fsdp2_status_t fsdp2_group_create(fsdp2_store_t *store, const char *name, int rank, int size,
                                  const fsdp2_group_options_t *options, fsdp2_group_t **out)
{
    return fsdp2_group_create_in(store, name, rank, size, options, NULL, out);
}

fsdp2_status_t fsdp2_group_create_in(fsdp2_store_t *store, const char *name, int rank, int size,
                                     const fsdp2_group_options_t *options, fsdp2_setup_t *parent,
                                     fsdp2_group_t **out)
{
    FSDP2_ARG_CHECK(out, "group is NULL");
    *out = NULL;
    FSDP2_ARG_CHECK(store && name, "store or name is NULL");
    FSDP2_ARG_CHECK(name[0] && strlen(name) < FSDP2_GROUP_NAME_MAX,
                    "group name '%s' must have 1..%d characters", name, FSDP2_GROUP_NAME_MAX - 1);
    FSDP2_ARG_CHECK(size >= 1 && size <= 4096, "group '%s': size %d is not in 1..4096", name, size);
    FSDP2_ARG_CHECK(rank >= 0 && rank < size, "group '%s': rank %d is not in 0..%d", name, rank,
                    size - 1);
    fsdp2_group_options_t opts = FSDP2_GROUP_OPTIONS_INIT;
    if (options)
        FSDP2_CHECK(fsdp2_options_copy("group options", &opts, sizeof(opts), options, NULL, 0));
    FSDP2_ARG_CHECK(opts.backend == FSDP2_BACKEND_UCX || opts.backend == FSDP2_BACKEND_NCCL,
                    "group '%s': backend %d is not ucx or nccl", name, (int)opts.backend);
    /* From here on a failure is reported to the other members (collectives/setup.h). */
    fsdp2_setup_t setup = {.kind = "group", .name = name, .rank = rank, .size = size,
                           .parent = parent};
    fsdp2_status_t status = fsdp2_env_init();
    fsdp2_group_t *g = status == FSDP2_SUCCESS ? fsdp2_calloc(1, sizeof(*g)) : NULL;
    if (status == FSDP2_SUCCESS && !g)
        status = fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "group '%s'", name);
    if (status != FSDP2_SUCCESS)
        return fsdp2_setup_failed(&setup, store, status);
    snprintf(g->name, sizeof(g->name), "%s", name);
    g->rank = rank;
    g->size = size;
    g->timeout_ms = fsdp2_group_timeout_ms(&opts);
    g->cuda_device = opts.cuda_device;
    atomic_init(&g->next_seq, 0);
    atomic_init(&g->aborted, 0);
    atomic_init(&g->error, FSDP2_SUCCESS);
    pthread_mutex_init(&g->error_lock, NULL);
    g->setup = setup;
    g->setup.name = g->name;
    g->setup.timeout_ms = g->timeout_ms;
    const fsdp2_group_ops_t *ops = NULL;
    if (opts.backend == FSDP2_BACKEND_UCX) {
#ifdef FSDP2_HAVE_UCX
        ops = &fsdp2_ucx_group_ops;
#else
        status = fsdp2_error(FSDP2_ERR_NOT_AVAILABLE,
                             "group '%s': libfsdp2 was built without UCX (libucx-dev)", name);
#endif
    } else if (nccl_ops(&ops) != FSDP2_SUCCESS) {
        status = fsdp2_error(FSDP2_ERR_NOT_AVAILABLE, "group '%s': the nccl backend: %s", name,
                             fsdp2_last_error());
    }
    g->ops = ops;
    if (status == FSDP2_SUCCESS)
        status = ops->create(g, store);
    if (status != FSDP2_SUCCESS) {
        /* what failed before the backend, or in nccl's (ucx reports before its teardown) */
        status = fsdp2_setup_failed(&g->setup, store, status);
        pthread_mutex_destroy(&g->error_lock);
        free(g);
        return status;
    }
    FSDP2_LOG(INFO, COLL, "group '%s': rank %d of %d over %s", name, rank, size, ops->name);
    *out = g;
    return FSDP2_SUCCESS;
}

/* Waits up to wait_ms for the group's collectives in flight to finish; how many are
 * left. */
static int drain(fsdp2_group_t *g, long wait_ms)
{
    int64_t deadline = fsdp2_now_ms() + wait_ms;
    int left;
    while ((left = g->ops->in_flight(g)) > 0 && fsdp2_now_ms() < deadline) {
        struct timespec nap = {0, 1000000}; /* 1 ms */
        nanosleep(&nap, NULL);
    }
    return left;
}

/* Collectives still queued or running on streams use the group: destroying it under
 * them would free what they read. They are waited for (the group's timeout: peers run
 * the same collectives, or fail them by then), then aborted and given a last second;
 * a group whose collectives never end is kept, not freed, and the error says so. */
fsdp2_status_t fsdp2_group_destroy(fsdp2_group_t *g)
{
    if (!g)
        return FSDP2_SUCCESS;
    if (g->ops->in_flight && g->ops->in_flight(g) > 0) {
        FSDP2_LOG(WARN, COLL,
                  "group '%s': destroyed with %d collective%s in flight: waiting for them "
                  "(synchronize the streams that run them first)",
                  g->name, g->ops->in_flight(g), g->ops->in_flight(g) == 1 ? "" : "s");
        int left = drain(g, g->timeout_ms);
        if (left > 0) {
            fsdp2_group_break(g, FSDP2_ERR_ABORTED, "destroyed with collectives in flight");
            left = drain(g, 1000);
        }
        if (left > 0)
            return fsdp2_error(FSDP2_ERR_INVALID_STATE,
                               "group '%s': destroyed with %d collective%s that did not end "
                               "within %.1f s; the group is kept (not freed) so that they "
                               "cannot touch freed memory",
                               g->name, left, left == 1 ? "" : "s",
                               (double)g->timeout_ms / 1e3 + 1.0);
    }
    g->ops->destroy(g);
    pthread_mutex_destroy(&g->error_lock);
    free(g);
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_group_rank(const fsdp2_group_t *g, int *rank)
{
    FSDP2_ARG_CHECK(g && rank, "group or rank is NULL");
    *rank = g->rank;
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_group_size(const fsdp2_group_t *g, int *size)
{
    FSDP2_ARG_CHECK(g && size, "group or size is NULL");
    *size = g->size;
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_group_abort(fsdp2_group_t *g)
{
    FSDP2_ARG_CHECK(g, "group is NULL");
    fsdp2_group_break(g, FSDP2_ERR_ABORTED, "aborted by the application");
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_group_error(fsdp2_group_t *g)
{
    FSDP2_ARG_CHECK(g, "group is NULL");
    return fsdp2_group_check(g);
}

/* Tracing: a slice on the stream around the collective. */
static trace_token_t trace_begin(fsdp2_group_t *g, const coll_op_t *op, fsdp2_stream_t *stream)
{
    static const trace_cat_t cats[] = {
        [COLL_ALL_GATHER] = TRACE_ALL_GATHER,     [COLL_ALL_GATHER_PIECES] = TRACE_ALL_GATHER,
        [COLL_REDUCE_SCATTER] = TRACE_REDUCE_SCATTER, [COLL_ALL_REDUCE] = TRACE_ALL_REDUCE,
        [COLL_BROADCAST] = TRACE_BROADCAST,       [COLL_BARRIER] = TRACE_BARRIER,
    };
    if (!fsdp2_tracing())
        return TRACE_NO_TOKEN;
    trace_op_t t = TRACE_OP_INIT(cats[op->kind]);
    t.bytes = op->count * op->elem_size;
    t.dtype = op->kind == COLL_ALL_GATHER_PIECES || op->kind == COLL_BARRIER ? -1 : (int)op->dtype;
    t.group = g->name;
    t.seq = (int64_t)op->seq;
    return fsdp2_trace_stream_begin(stream, &t);
}

/* Common checks, then the next sequence number and the backend. */
static fsdp2_status_t enqueue(fsdp2_group_t *g, coll_op_t *op, fsdp2_stream_t *stream,
                              const char *what)
{
    FSDP2_ARG_CHECK(g && stream, "%s: group or stream is NULL", what);
    if (op->kind != COLL_BARRIER && op->kind != COLL_ALL_GATHER_PIECES) {
        FSDP2_ARG_CHECK(fsdp2_dtype_size(op->dtype, &op->elem_size) == FSDP2_SUCCESS,
                        "%s on group '%s': dtype %d is not valid", what, g->name, (int)op->dtype);
    }
    FSDP2_ARG_CHECK(stream->device.type == FSDP2_DEVICE_CPU || strcmp(g->ops->name, "ucx") != 0,
                    "%s on group '%s': the ucx backend moves host memory; use a cpu stream",
                    what, g->name);
    FSDP2_ARG_CHECK(strcmp(g->ops->name, "nccl") != 0 ||
                        (stream->device.type == FSDP2_DEVICE_CUDA &&
                         stream->device.index == g->cuda_device),
                    "%s on group '%s': the nccl backend runs on streams of cuda:%d (the group's "
                    "device), not on this %s stream",
                    what, g->name, g->cuda_device,
                    stream->device.type == FSDP2_DEVICE_CPU ? "cpu" : "other device's");
    FSDP2_CHECK(fsdp2_group_check(g));
    op->seq = atomic_fetch_add(&g->next_seq, 1);
    trace_token_t traced = trace_begin(g, op, stream);
    fsdp2_status_t status = fsdp2_fault_hit(FAULT_COLLECTIVE)
                                ? fsdp2_fault_error(FAULT_COLLECTIVE, what)
                                : g->ops->enqueue(g, op, stream);
    if (traced >= 0)
        fsdp2_trace_stream_end(stream, traced);
    if (status != FSDP2_SUCCESS && fsdp2_group_check(g) == FSDP2_SUCCESS) {
        /* The sequence number is spent: this rank is now out of step with its peers, so
         * the group cannot be used any more, and the peers are told at once. */
        char reason[512];
        snprintf(reason, sizeof(reason), "%s could not be enqueued: %s", what, fsdp2_last_error());
        fsdp2_group_break(g, status, reason);
        return fsdp2_group_check(g);
    }
    return status;
}

static fsdp2_status_t check_reduce(fsdp2_group_t *g, const fsdp2_reduce_t *reduce,
                                   fsdp2_dtype_t dtype, const char *what, fsdp2_reduce_t *out)
{
    fsdp2_reduce_t r = FSDP2_REDUCE_SUM_INIT;
    if (reduce)
        r = *reduce;
    FSDP2_ARG_CHECK(dtype == FSDP2_F32 || dtype == FSDP2_F64 || dtype == FSDP2_BF16 ||
                        dtype == FSDP2_F16,
                    "%s on group '%s': dtype %s cannot be reduced (f32, f64, bf16, f16)", what,
                    g->name, fsdp2_dtype_name(dtype));
    FSDP2_ARG_CHECK(r.op == FSDP2_REDUCE_SUM || r.op == FSDP2_REDUCE_AVG,
                    "%s on group '%s': reduce op %d is not sum or avg", what, g->name, (int)r.op);
    FSDP2_ARG_CHECK(isfinite(r.pre_divide) && r.pre_divide > 0 && isfinite(r.post_divide) &&
                        r.post_divide > 0,
                    "%s on group '%s': divide factors pre=%g post=%g must be finite and > 0",
                    what, g->name, r.pre_divide, r.post_divide);
    if (r.op == FSDP2_REDUCE_AVG)
        r.post_divide *= g->size;
    *out = r;
    return FSDP2_SUCCESS;
}

/* Whether [a, a + na) and [b, b + nb) share a byte (no sum that could wrap). */
static int overlaps(const void *a, size_t na, const void *b, size_t nb)
{
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return na && nb && (x >= y ? x - y < nb : y - x < na);
}

/* Bytes of one rank's block of count elements (0 for an unknown dtype: enqueue says),
 * checked so that the whole group's (size blocks) fits in a size_t. */
static fsdp2_status_t block_bytes(const fsdp2_group_t *g, size_t count, fsdp2_dtype_t dtype,
                                  const char *what, size_t *bytes)
{
    size_t es = 0;
    *bytes = 0;
    if (fsdp2_dtype_size(dtype, &es) != FSDP2_SUCCESS || count == 0)
        return FSDP2_SUCCESS;
    FSDP2_ARG_CHECK(count <= SIZE_MAX / es / (size_t)g->size,
                    "%s on group '%s': count %zu of %zu-byte elements times %d ranks overflows",
                    what, g->name, count, es, g->size);
    *bytes = count * es;
    return FSDP2_SUCCESS;
}

/* part (one rank's block, bytes) is either exactly this rank's block of whole (size
 * blocks: in place) or shares no byte with it. */
static fsdp2_status_t check_in_place_or_apart(const fsdp2_group_t *g, const char *what,
                                              const char *part_name, const void *part,
                                              const char *whole_name, const void *whole,
                                              size_t bytes)
{
    FSDP2_ARG_CHECK(coll_in_place_block(whole, part, bytes, g->rank) ||
                        !overlaps(part, bytes, whole, bytes * (size_t)g->size),
                    "%s on group '%s': %s %p (%zu bytes) overlaps %s %p (%zu bytes) but is not "
                    "in place (this rank's block of %s, at offset %zu)",
                    what, g->name, part_name, part, bytes, whole_name, whole,
                    bytes * (size_t)g->size, whole_name, (size_t)g->rank * bytes);
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_all_gather_async(fsdp2_group_t *g, const void *send, void *recv, size_t count,
                                      fsdp2_dtype_t dtype, fsdp2_stream_t *stream)
{
    FSDP2_ARG_CHECK(g, "all_gather: group is NULL");
    FSDP2_ARG_CHECK(count == 0 || (send && recv), "all_gather on group '%s': send=%p recv=%p with count %zu",
                    g->name, send, recv, count);
    size_t bytes = 0;
    FSDP2_CHECK(block_bytes(g, count, dtype, "all_gather", &bytes));
    FSDP2_CHECK(check_in_place_or_apart(g, "all_gather", "send", send, "recv", recv, bytes));
    coll_op_t op = {.kind = COLL_ALL_GATHER, .send = send, .recv = recv, .count = count,
                    .dtype = dtype};
    return enqueue(g, &op, stream, "all_gather");
}

fsdp2_status_t fsdp2_all_gather_pieces_async(fsdp2_group_t *g, const void *send, size_t bytes,
                                             const fsdp2_iov_t *pieces, const size_t *offsets,
                                             fsdp2_stream_t *stream)
{
    FSDP2_ARG_CHECK(g && offsets, "all_gather_pieces: group or offsets is NULL");
    FSDP2_ARG_CHECK(bytes == 0 || send, "all_gather_pieces on group '%s': send is NULL",
                    g->name);
    FSDP2_ARG_CHECK(offsets[0] == 0, "all_gather_pieces on group '%s': offsets[0] is %zu, not 0",
                    g->name, offsets[0]);
    for (int r = 0; r < g->size; r++) {
        FSDP2_ARG_CHECK(offsets[r + 1] >= offsets[r],
                        "all_gather_pieces on group '%s': offsets[%d]=%zu < offsets[%d]=%zu",
                        g->name, r + 1, offsets[r + 1], r, offsets[r]);
        FSDP2_ARG_CHECK(offsets[r + 1] == offsets[r] || pieces,
                        "all_gather_pieces on group '%s': pieces is NULL", g->name);
        size_t total = 0;
        for (size_t k = offsets[r]; k < offsets[r + 1]; k++) {
            FSDP2_ARG_CHECK(pieces[k].data || pieces[k].bytes == 0,
                            "all_gather_pieces on group '%s': piece %zu has no data", g->name, k);
            FSDP2_ARG_CHECK(pieces[k].bytes <= bytes - total,
                            "all_gather_pieces on group '%s': rank %d's pieces hold more than "
                            "%zu bytes (pieces[%zu] has %zu)", g->name, r, bytes, k,
                            pieces[k].bytes);
            total += pieces[k].bytes;
        }
        FSDP2_ARG_CHECK(total == bytes,
                        "all_gather_pieces on group '%s': rank %d's pieces hold %zu bytes, not %zu",
                        g->name, r, total, bytes);
    }
    /* This rank's pieces: each where its part of send already is (in place), or apart
     * from send (peers read send while the pieces are written); no other rank's piece
     * may overlap send (it is written while send is read). */
    uintptr_t at = (uintptr_t)send;
    for (size_t k = offsets[g->rank]; bytes && k < offsets[g->rank + 1]; at += pieces[k].bytes, k++)
        FSDP2_ARG_CHECK((uintptr_t)pieces[k].data == at ||
                            !overlaps(pieces[k].data, pieces[k].bytes, send, bytes),
                        "all_gather_pieces on group '%s': this rank's pieces[%zu] (%p, %zu "
                        "bytes) overlaps send %p (%zu bytes) but is not in place (%p)",
                        g->name, k, pieces[k].data, pieces[k].bytes, send, bytes, (void *)at);
    for (int r = 0; bytes && r < g->size; r++)
        for (size_t k = offsets[r]; r != g->rank && k < offsets[r + 1]; k++)
            FSDP2_ARG_CHECK(!overlaps(pieces[k].data, pieces[k].bytes, send, bytes),
                            "all_gather_pieces on group '%s': rank %d's pieces[%zu] (%p, %zu "
                            "bytes) overlaps send %p (%zu bytes)",
                            g->name, r, k, pieces[k].data, pieces[k].bytes, send, bytes);
    coll_op_t op = {.kind = COLL_ALL_GATHER_PIECES, .send = send, .count = bytes,
                    .dtype = FSDP2_U8, .elem_size = 1, .pieces = pieces, .offsets = offsets};
    return enqueue(g, &op, stream, "all_gather_pieces");
}

fsdp2_status_t fsdp2_reduce_scatter_async(fsdp2_group_t *g, const void *send, void *recv,
                                          size_t recv_count, fsdp2_dtype_t dtype,
                                          const fsdp2_reduce_t *reduce, fsdp2_stream_t *stream)
{
    FSDP2_ARG_CHECK(g, "reduce_scatter: group is NULL");
    FSDP2_ARG_CHECK(recv_count == 0 || (send && recv),
                    "reduce_scatter on group '%s': send=%p recv=%p with count %zu", g->name, send,
                    recv, recv_count);
    coll_op_t op = {.kind = COLL_REDUCE_SCATTER, .send = send, .recv = recv,
                    .count = recv_count, .dtype = dtype};
    FSDP2_CHECK(check_reduce(g, reduce, dtype, "reduce_scatter", &op.reduce));
    size_t bytes = 0;
    FSDP2_CHECK(block_bytes(g, recv_count, dtype, "reduce_scatter", &bytes));
    /* The other blocks of send are read while recv is written; this rank's own block is
     * read only by this rank, each element before its result is written (in place, as
     * NCCL allows). */
    FSDP2_CHECK(check_in_place_or_apart(g, "reduce_scatter", "recv", recv, "send", send, bytes));
    return enqueue(g, &op, stream, "reduce_scatter");
}

fsdp2_status_t fsdp2_all_reduce_async(fsdp2_group_t *g, void *buf, size_t count,
                                      fsdp2_dtype_t dtype, const fsdp2_reduce_t *reduce,
                                      fsdp2_stream_t *stream)
{
    FSDP2_ARG_CHECK(g, "all_reduce: group is NULL");
    FSDP2_ARG_CHECK(count == 0 || buf, "all_reduce on group '%s': buf is NULL with count %zu",
                    g->name, count);
    coll_op_t op = {.kind = COLL_ALL_REDUCE, .send = buf, .recv = buf, .count = count,
                    .dtype = dtype};
    FSDP2_CHECK(check_reduce(g, reduce, dtype, "all_reduce", &op.reduce));
    return enqueue(g, &op, stream, "all_reduce");
}

fsdp2_status_t fsdp2_broadcast_async(fsdp2_group_t *g, void *buf, size_t count,
                                     fsdp2_dtype_t dtype, int root, fsdp2_stream_t *stream)
{
    FSDP2_ARG_CHECK(g, "broadcast: group is NULL");
    FSDP2_ARG_CHECK(root >= 0 && root < g->size, "broadcast on group '%s': root %d is not in 0..%d",
                    g->name, root, g->size - 1);
    FSDP2_ARG_CHECK(count == 0 || buf, "broadcast on group '%s': buf is NULL with count %zu",
                    g->name, count);
    coll_op_t op = {.kind = COLL_BROADCAST, .send = buf, .recv = buf, .count = count,
                    .dtype = dtype, .root = root};
    return enqueue(g, &op, stream, "broadcast");
}

fsdp2_status_t fsdp2_barrier_async(fsdp2_group_t *g, fsdp2_stream_t *stream)
{
    coll_op_t op = {.kind = COLL_BARRIER, .dtype = FSDP2_U8, .elem_size = 1};
    return enqueue(g, &op, stream, "barrier");
}

void fsdp2_group_member_key(const fsdp2_group_t *g, const char *what, int r, char *key)
{
    fsdp2_setup_key(&g->setup, what, r, key);
}

