/* Process groups inside the library: the generic part (lib/collectives/group.c: checks,
 * sequence numbers, the sticky error) and the backend interface it dispatches to. */
#ifndef FSDP2_COLLECTIVES_GROUP_INTERNAL_H
#define FSDP2_COLLECTIVES_GROUP_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include <fsdp2/group.h>

#include "collectives/setup.h"

#define FSDP2_GROUP_NAME_MAX FSDP2_SETUP_NAME_MAX

typedef enum coll_kind {
    COLL_ALL_GATHER,
    COLL_ALL_GATHER_PIECES,
    COLL_REDUCE_SCATTER,
    COLL_ALL_REDUCE,
    COLL_BROADCAST,
    COLL_BARRIER,
} coll_kind_t;

/* One collective, as validated by group.c. Counts are elements of dtype, except for
 * COLL_ALL_GATHER_PIECES where `count` is bytes and dtype is u8. */
typedef struct coll_op {
    coll_kind_t kind;
    uint64_t seq; /* the group's sequence number: the same on every member */
    const void *send;
    void *recv;
    size_t count;
    fsdp2_dtype_t dtype;
    size_t elem_size;
    fsdp2_reduce_t reduce;
    int root;
    const fsdp2_iov_t *pieces;
    const size_t *offsets;
} coll_op_t;

/* Whether part is exactly rank's block (block_bytes) of whole: an in-place all-gather's
 * send in its recv, or an in-place reduce-scatter's recv in its send. */
static inline int coll_in_place_block(const void *whole, const void *part, size_t block_bytes,
                                      int rank)
{
    return whole && (const char *)part == (const char *)whole + (size_t)rank * block_bytes;
}

/* What a collective is, as the members compare it: under one sequence number every
 * member must make the same call (kind, bytes per rank, dtype, broadcast root, reduce
 * op). Both transports check it at first contact with a peer. */
typedef struct coll_stamp {
    uint32_t kind, dtype;
    uint64_t bytes;
    int32_t root;   /* a broadcast's root, else 0 */
    uint32_t reduce; /* a reduction's op, else 0 */
} coll_stamp_t;

void fsdp2_coll_stamp(const coll_op_t *op, coll_stamp_t *s);
int fsdp2_coll_stamp_equal(const coll_stamp_t *a, const coll_stamp_t *b);
/* "all_gather of 4096 B (seq 7)", "broadcast of 64 B from rank 1 (seq 2)", ... */
void fsdp2_coll_stamp_text(const coll_stamp_t *s, uint64_t seq, char *buf, size_t len);

struct fsdp2_group;

typedef struct fsdp2_group_ops {
    const char *name;
    /* Connects this member (collective); fills g->backend. */
    fsdp2_status_t (*create)(struct fsdp2_group *g, fsdp2_store_t *store);
    void (*destroy)(struct fsdp2_group *g);
    /* Enqueues op on stream; op is copied. */
    fsdp2_status_t (*enqueue)(struct fsdp2_group *g, const coll_op_t *op, fsdp2_stream_t *stream);
    /* Optional: tells the peers now that this member failed, and why (thread-safe; never
     * called from inside the backend's own progress callbacks). */
    void (*abort)(struct fsdp2_group *g, const char *reason);
    /* Collectives enqueued and not finished yet (thread-safe): destroy waits for 0. */
    int (*in_flight)(struct fsdp2_group *g);
} fsdp2_group_ops_t;

struct fsdp2_group {
    const fsdp2_group_ops_t *ops;
    char name[FSDP2_GROUP_NAME_MAX];
    int rank, size;
    long timeout_ms;
    int cuda_device; /* nccl: the option as given (-1: the creating thread's device) */
    atomic_uint_fast64_t next_seq;
    atomic_int aborted;
    atomic_int error; /* sticky fsdp2_status_t, first failure wins */
    pthread_mutex_t error_lock;
    char error_message[640];
    fsdp2_setup_t setup; /* its creation: its waits end at once when a member fails */
    void *backend;
};

extern const fsdp2_group_ops_t fsdp2_ucx_group_ops;
extern const fsdp2_group_ops_t fsdp2_nccl_group_ops;

/* "all_gather", "reduce_scatter", ...: for messages. */
const char *fsdp2_coll_kind_name(coll_kind_t kind);

/* Records the group's first failure (status and message) and returns status with the
 * message also set as this thread's last error. */
fsdp2_status_t fsdp2_group_fail(struct fsdp2_group *g, fsdp2_status_t status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* A failure of this rank inside the group's collective sequence (a collective it could
 * not enqueue or run, or a failed step around them): fails the group here with status,
 * ends this rank's collectives still running, and tells the peers at once (they fail
 * with FSDP2_ERR_PEER_FAILED naming this rank and reason). Keeps this thread's last
 * error as it was. Idempotent: only the first failure is recorded and sent. */
void fsdp2_group_break(struct fsdp2_group *g, fsdp2_status_t status, const char *reason);

/* The group's recorded failure message into buf ("" while healthy). */
void fsdp2_group_error_text(struct fsdp2_group *g, char *buf, size_t len);

/* The sticky error, with its message set as this thread's last error; FSDP2_SUCCESS if
 * healthy. Collectives call it before starting so a failed group fails fast. */
fsdp2_status_t fsdp2_group_check(struct fsdp2_group *g);

/* A group's timeout: the options' (may be NULL), else FSDP2_TIMEOUT. After
 * fsdp2_env_init. */
long fsdp2_group_timeout_ms(const fsdp2_group_options_t *options);

/* fsdp2_group_create as a step of the set-up `parent` (a mesh's; NULL: none): a failure
 * is reported there too (collectives/setup.h). */
fsdp2_status_t fsdp2_group_create_in(fsdp2_store_t *store, const char *name, int rank, int size,
                                     const fsdp2_group_options_t *options, fsdp2_setup_t *parent,
                                     struct fsdp2_group **out);

/* Member r's store key for `what` during set-up: "<group name>/<what>/<r>" (the
 * waits and barriers of a group's creation: collectives/setup.h, on g->setup). */
#define FSDP2_GROUP_KEY_MAX FSDP2_SETUP_KEY_MAX
void fsdp2_group_member_key(const struct fsdp2_group *g, const char *what, int r, char *key);

/* dst[i] = reduction of src[0][i] .. src[n-1][i] in rank order: each x / pre, summed in
 * f32 (f64 for f64), then / post (post already includes the group size for AVG),
 * rounded once. dst may alias one of the sources. dtype f32, f64, bf16 or f16. */
void fsdp2_reduce_rank_order(void *dst, fsdp2_dtype_t dtype, const void *const *src, int n,
                             size_t count, double pre, double post);

#endif
