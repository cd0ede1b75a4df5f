/* Process groups and collectives.
 *
 * A group is a set of processes that run collectives together, each knowing its rank
 * in the group. It is created collectively from the rendezvous store (every member calls
 * fsdp2_group_create with the same name and size) and runs over a backend: `ucx` for
 * host memory (shared memory within a host, TCP or RDMA across hosts; UCX_TLS
 * overrides), `nccl` for CUDA memory (one GPU per member: NCCL refuses two members of a
 * group on one GPU).
 *
 * Every collective is enqueued on an fsdp2_stream and runs in that stream's order,
 * asynchronously to the caller: on a cpu side stream it overlaps the application's
 * compute. Members must enqueue the collectives of one group in the same order (each
 * call takes the next sequence number of the group, and messages are matched by it), but
 * may run them on different streams: an all-gather on one stream and a reduce-scatter on
 * another proceed concurrently over UCX messages, one after the other in sequence order
 * over shared memory (groups within one host). Buffers must stay valid and untouched until the
 * collective has run (record an event after it).
 *
 * Failures (a dead or hung peer, FSDP2_TIMEOUT passing, an abort) become the stream's
 * error, reported by fsdp2_stream_synchronize, and make the group fail every later
 * collective at once with the same status: nothing hangs. Collectives accept count 0.
 * Reductions on bf16/f16 accumulate in f32 and round once; every rank sums the
 * contributions in rank order, so all ranks get the same bits. */
#ifndef FSDP2_GROUP_H
#define FSDP2_GROUP_H

#include <stddef.h>

#include <fsdp2/dtype.h>
#include <fsdp2/export.h>
#include <fsdp2/status.h>
#include <fsdp2/store.h>
#include <fsdp2/stream.h>

FSDP2_EXTERN_C_BEGIN

typedef struct fsdp2_group fsdp2_group_t;

typedef enum fsdp2_backend {
    FSDP2_BACKEND_UCX = 1,
    FSDP2_BACKEND_NCCL = 2,
} fsdp2_backend_t;

typedef struct fsdp2_group_options {
    unsigned size;           /* sizeof(fsdp2_group_options_t) */
    fsdp2_backend_t backend; /* FSDP2_BACKEND_UCX */
    long timeout_ms;         /* <= 0: FSDP2_TIMEOUT */
    /* nccl: the CUDA device index of this member's communicator (cuda:N); -1: the
     * calling thread's current CUDA device. Ignored by ucx. */
    int cuda_device;
} fsdp2_group_options_t;

#define FSDP2_GROUP_OPTIONS_INIT {sizeof(fsdp2_group_options_t), FSDP2_BACKEND_UCX, 0, -1}

/* Collective over the members: creates this process's end of group `name` (unique per
 * group, the same string on every member; it prefixes the store keys used to exchange
 * addresses) where this process has rank `rank` of `size`. Blocks until every member
 * has connected, or the timeout (an error naming the ranks that never arrived). Settings
 * that every member must share (FSDP2_UCX_SEGMENT_BYTES; FSDP2_SHM_SLOT_BYTES and the
 * other sizes of the shared-memory protocol) are compared: a member whose value differs
 * makes every member fail with FSDP2_ERR_INVALID_CONFIG, naming the variable and values.
 * A member whose own part fails makes every other member's creation fail at once with
 * FSDP2_ERR_PEER_FAILED, naming it and its error: the group exists on every member or
 * on none. A creation that failed past its checks of the arguments leaves keys in the
 * store: try again under another name. */
FSDP2_API fsdp2_status_t fsdp2_group_create(fsdp2_store_t *store, const char *name, int rank,
                                            int size, const fsdp2_group_options_t *options,
                                            fsdp2_group_t **group);

/* Destroys this process's end. Not collective, but peers still talking to a destroyed
 * end fail. Collectives of the group still queued or running on streams are waited for
 * first (up to the group's timeout, then aborted and given one more second; a warning
 * says so: synchronize those streams first); a group whose collectives never end is kept
 * rather than freed under them, and FSDP2_ERR_INVALID_STATE says so. NULL ignored. */
FSDP2_API fsdp2_status_t fsdp2_group_destroy(fsdp2_group_t *group);

FSDP2_API fsdp2_status_t fsdp2_group_rank(const fsdp2_group_t *group, int *rank);
FSDP2_API fsdp2_status_t fsdp2_group_size(const fsdp2_group_t *group, int *size);

/* Makes running and later collectives of this process's end fail with
 * FSDP2_ERR_ABORTED (as soon as they notice: within milliseconds). Peers waiting on us
 * then fail at once where the group runs over shared memory (one host), else by their
 * own timeout or peer-failure detection. Thread-safe. */
FSDP2_API fsdp2_status_t fsdp2_group_abort(fsdp2_group_t *group);

/* The group's sticky error: FSDP2_SUCCESS while healthy. Never blocks. */
FSDP2_API fsdp2_status_t fsdp2_group_error(fsdp2_group_t *group);

typedef enum fsdp2_reduce_op {
    FSDP2_REDUCE_SUM = 0,
    FSDP2_REDUCE_AVG = 1, /* sum / group size */
} fsdp2_reduce_op_t;

/* result = (sum over ranks of (x_r / pre_divide)) / post_divide, and / size for AVG.
 * FSDP's gradient reduction divides before and after so that f16 sums do not overflow;
 * 1.0 means no division. */
typedef struct fsdp2_reduce {
    fsdp2_reduce_op_t op;
    double pre_divide;
    double post_divide;
} fsdp2_reduce_t;

#define FSDP2_REDUCE_SUM_INIT {FSDP2_REDUCE_SUM, 1.0, 1.0}
#define FSDP2_REDUCE_AVG_INIT {FSDP2_REDUCE_AVG, 1.0, 1.0}

/* recv[r * count .. ] = send of rank r, for every rank r (recv holds size * count).
 * send may be recv + rank * count (in place); otherwise it must not overlap recv. */
FSDP2_API fsdp2_status_t fsdp2_all_gather_async(fsdp2_group_t *group, const void *send, void *recv,
                                                size_t count, fsdp2_dtype_t dtype,
                                                fsdp2_stream_t *stream);

typedef struct fsdp2_iov {
    void *data;
    size_t bytes;
} fsdp2_iov_t;

/* All-gather of `bytes` bytes per rank straight into final places: rank r's bytes are
 * scattered over pieces[offsets[r] .. offsets[r + 1]) in order (offsets has size + 1
 * entries, offsets[0] == 0), whose lengths add up to `bytes`. Pieces may not overlap
 * and must outlive the collective, like the pieces array itself. Each of this rank's
 * pieces is either in place (where its part of send is) or apart from send. */
FSDP2_API fsdp2_status_t fsdp2_all_gather_pieces_async(fsdp2_group_t *group, const void *send,
                                                       size_t bytes, const fsdp2_iov_t *pieces,
                                                       const size_t *offsets,
                                                       fsdp2_stream_t *stream);

/* recv (recv_count elements) = reduction over ranks of send[rank * recv_count ..]
 * (send holds size * recv_count elements). recv is either apart from send or in place:
 * exactly this rank's block of send, which then holds the result (send is const, yet
 * that block is written, as with NCCL); the other blocks are left as they were. dtypes
 * f32, f64, bf16, f16. */
FSDP2_API fsdp2_status_t fsdp2_reduce_scatter_async(fsdp2_group_t *group, const void *send,
                                                    void *recv, size_t recv_count,
                                                    fsdp2_dtype_t dtype,
                                                    const fsdp2_reduce_t *reduce,
                                                    fsdp2_stream_t *stream);

/* buf (count elements, any count) = reduction over ranks of buf, in place. buf must stay
 * valid until stream's work completes: a variable on the caller's stack may be it when the
 * caller synchronizes the stream before returning (fsdp2_mesh_average does it for a few
 * doubles). */
FSDP2_API fsdp2_status_t fsdp2_all_reduce_async(fsdp2_group_t *group, void *buf, size_t count,
                                                fsdp2_dtype_t dtype, const fsdp2_reduce_t *reduce,
                                                fsdp2_stream_t *stream);

/* buf of every rank = buf of rank root. */
FSDP2_API fsdp2_status_t fsdp2_broadcast_async(fsdp2_group_t *group, void *buf, size_t count,
                                               fsdp2_dtype_t dtype, int root,
                                               fsdp2_stream_t *stream);

/* Completes on every rank once every rank has reached it. */
FSDP2_API fsdp2_status_t fsdp2_barrier_async(fsdp2_group_t *group, fsdp2_stream_t *stream);

FSDP2_EXTERN_C_END

#endif
