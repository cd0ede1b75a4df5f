/* The ucx backend's state, shared by its protocol (ucx.c: requests, waits, the
 * algorithms, enqueue) and its set-up (ucx_setup.c: the process's UCP context, the
 * exchange of identities and addresses, endpoints, create and destroy). */
#ifndef FSDP2_COLLECTIVES_UCX_INTERNAL_H
#define FSDP2_COLLECTIVES_UCX_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>

#include <ucp/api/ucp.h>

#include "collectives/group_internal.h"
#include "collectives/shm.h"

/* Array sizes of a group's state: collectives enqueued and not yet finished, and
 * reductions running at once (each with its scratch set); an enqueue past either waits. */
#define UCX_SLOTS 64
#define UCX_SCRATCH_SETS 4

/* A tag's phase: the data of a collective's rounds, an all-reduce's gather, a barrier,
 * the stamp each rank sends its peers with a collective's first round, and the message
 * that tells the peers this rank's group failed (any sequence number and source). */
enum { PHASE_DATA = 0, PHASE_GATHER = 1, PHASE_BARRIER = 2, PHASE_STAMP = 3, PHASE_ABORT = 4 };
#define PHASE_MASK (0xfull << 28)

/* The abort message: why the sender failed (the reason as its group recorded it; the
 * sender is the tag's source). */
typedef struct ucx_abort_msg {
    char reason[512];
} ucx_abort_msg_t;

typedef struct ucx_group ucx_group_t;

typedef struct ucx_slot {
    coll_op_t op;
    ucx_group_t *ug;
    int busy;
    atomic_int ran; /* ucx_run started on it: it frees the slot when done */
    struct req_list *list; /* used by the thread running the op */
} ucx_slot_t;

struct ucx_group {
    fsdp2_group_t *g;
    ucp_worker_h worker;
    int efd;
    ucp_ep_h *eps; /* [size]; eps[rank] unused */
    atomic_int failed_peer; /* -1, or the first peer UCX reported as failed */
    atomic_long liveness_checked_ms; /* shared by the collectives running at once */
    int has_context; /* holds a reference on the process's UCP context */
    pthread_mutex_t lock;
    pthread_cond_t changed;
    ucx_slot_t slots[UCX_SLOTS];
    size_t segment; /* FSDP2_UCX_SEGMENT_BYTES: bytes per peer per reduction round (agreed) */
    int spin;       /* FSDP2_UCX_SPIN: idle progress calls, each followed by a yield */
    void *scratch[UCX_SCRATCH_SETS]; /* (size - 1) * segment bytes each */
    const void **sources[UCX_SCRATCH_SETS]; /* size pointers each: a reduction's inputs */
    int scratch_busy[UCX_SCRATCH_SETS];
    int reductions_in_flight; /* enqueued and not finished; at most UCX_SCRATCH_SETS */
    struct ucx_peer_error *peer_errors; /* [size]: the error handlers' arguments */
    /* Failing together across hosts: a receive for any peer's abort message is posted at
     * creation (abort_req, into abort_in); its callback sets abort_from (1 + that peer).
     * This rank's own goes out once (abort_sent) from abort_out, with abort_reqs [size]
     * for its sends: nothing is allocated when a group fails. */
    void *abort_req;
    ucx_abort_msg_t abort_in;
    atomic_int abort_from;
    ucx_abort_msg_t abort_out;
    atomic_int abort_sent;
    void **abort_reqs;
    shm_group_t *shm; /* every member on this host: collectives go through shared memory */
};

typedef struct ucx_peer_error {
    ucx_group_t *ug;
    int peer;
    atomic_int failed; /* UCX reported this endpoint failed, or the process is gone */
    int local;         /* on this host: error mode NONE, liveness by pid */
    pid_t pid;
} ucx_peer_error_t;

/* The requests of one round of a collective, with the peer each involves: a send's
 * destination as r, a receive's source as RECV_FROM(r) (negative), so that a failed peer
 * fails exactly the rounds that wait on it, and a failure knows which are receives. */
#define RECV_FROM(r) (-2 - (r))
#define PEER_OF(code) ((code) >= 0 ? (code) : -2 - (code))
typedef struct req_list {
    void **req;
    int *peer;
    size_t *want; /* a receive's expected bytes: a message of another length is a mismatch */
    int *stamp_from; /* the peer whose stamp the request receives, else -1 (NULL: none) */
    coll_stamp_t *stamps; /* [size]: this rank's call at [rank], each peer's as it arrives */
    uint64_t seq;         /* the collective the stamps describe */
    int n;
    /* A receive that completed at once with another length than wanted: -1 if none. */
    int short_peer;
    size_t short_got, short_want;
} req_list_t;

static inline uint64_t make_tag(uint64_t seq, int phase, int src, size_t segment)
{
    return ((seq & 0xffffffffull) << 32) | ((uint64_t)(phase & 0xf) << 28) |
           ((uint64_t)(src & 0xfff) << 16) | (segment & 0xffff);
}

/* ucx.c */
void fsdp2_ucx_add_send(ucx_group_t *ug, req_list_t *rl, int peer, const void *buf,
                        size_t bytes, uint64_t tag);
void fsdp2_ucx_add_recv(ucx_group_t *ug, req_list_t *rl, int from, void *buf, size_t bytes,
                        uint64_t tag);
/* Waits for every request of rl (what names the wait in errors). */
fsdp2_status_t fsdp2_ucx_wait_list(ucx_group_t *ug, req_list_t *rl, const char *what);
void fsdp2_ucx_close_endpoint(ucx_group_t *ug, int r);
/* Looks now whether peer (on this host) is still alive; marks it failed if not. */
void fsdp2_ucx_check_one(ucx_group_t *ug, int peer);
fsdp2_status_t fsdp2_ucx_enqueue(fsdp2_group_t *g, const coll_op_t *op,
                                 fsdp2_stream_t *stream);
/* ucx_abort.c */
/* Adds this rank's stamp for op (a send to every peer) and a receive of every peer's to
 * rl: the first round of each collective. */
void fsdp2_ucx_add_stamps(ucx_group_t *ug, req_list_t *rl, const coll_op_t *op);
/* Peer's stamp arrived: it must be this rank's call, else the group fails naming both. */
fsdp2_status_t fsdp2_ucx_check_stamp(ucx_group_t *ug, const req_list_t *rl, int peer);
/* Posts the receive for the peers' abort messages (set-up, after the endpoints). */
fsdp2_status_t fsdp2_ucx_listen_aborts(ucx_group_t *ug);
/* Cancels it (destroy). */
void fsdp2_ucx_stop_listening(ucx_group_t *ug);
/* Tells every peer still reachable that this rank's group failed, and why: once, waiting
 * at most a short while for the messages to leave. Thread-safe. */
void fsdp2_ucx_send_abort(ucx_group_t *ug, const char *reason);

#endif
