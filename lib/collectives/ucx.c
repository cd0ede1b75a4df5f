/* The ucx backend: collectives on host memory over UCX tagged messages.
 *
 * One UCP context per process, one worker per group (thread mode MULTI: collectives of
 * one group may run at once on different stream threads), one endpoint per peer. Worker
 * addresses are exchanged through the rendezvous store (set-up and destroy:
 * ucx_setup.c; what both files share: ucx_internal.h). Groups whose members all run on
 * this host go through shared memory instead (shm.c).
 *
 * Algorithms are direct (pairwise): every rank sends each peer exactly the bytes that
 * peer needs and receives straight into their final place. On one host UCX moves large
 * messages with a single copy (CMA / shared memory rendezvous), so this moves each byte
 * once, and every rank sums the contributions in rank order (identical bits everywhere).
 * A message's tag is (sequence number, phase, source rank, segment): collectives are
 * matched by the group's sequence number, not by arrival order.
 *
 * Progress: spin on ucp_worker_progress for a short while, then arm the worker and
 * poll() its event fd, so that four ranks on two cores do not starve one another. Every
 * wait checks the deadline (the group's timeout), the abort flag and peer failures
 * reported by UCX's error handler, and cancels what is outstanding before failing. */
#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "collectives/ucx_internal.h"
#include "core/clock.h"
#include "core/device_ops.h"
#include "core/error.h"
#include "core/log_internal.h"

/* ---- requests ---- */

static void *post_send(ucx_group_t *ug, int peer, const void *buf, size_t bytes, uint64_t tag)
{
    ucp_request_param_t param = {.op_attr_mask = 0};
    return ucp_tag_send_nbx(ug->eps[peer], buf, bytes, tag, &param);
}

/* Closes the endpoint to peer r at destroy time. Healthy endpoints close gracefully
 * (flushing, bounded by a short wait): force-closing them makes the peer's UCX 1.13 trip
 * an assertion when its TCP lane sees the reset. Endpoints UCX reported failed must be
 * force-closed, and are. */
void fsdp2_ucx_close_endpoint(ucx_group_t *ug, int r)
{
    if (!ug->eps[r])
        return;
    int failed = atomic_load(&ug->peer_errors[r].failed);
    if (failed && ug->peer_errors[r].local) {
        /* a dead process on this host: nothing to flush to, and FORCE needs PEER mode;
         * ucp_worker_destroy releases the endpoint */
        ug->eps[r] = NULL;
        return;
    }
    ucp_request_param_t param = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                                 .flags = failed ? UCP_EP_CLOSE_FLAG_FORCE : 0};
    void *req = ucp_ep_close_nbx(ug->eps[r], &param);
    if (req && !UCS_PTR_IS_ERR(req)) {
        int64_t deadline = fsdp2_now_ms() + 2000;
        while (ucp_request_check_status(req) == UCS_INPROGRESS && fsdp2_now_ms() < deadline)
            ucp_worker_progress(ug->worker);
        ucp_request_free(req); /* released by UCX when done, if it is not yet */
    }
    ug->eps[r] = NULL;
}

/* A receive; *info gets the message's length when it completes at once (NULL back).
 * UCX 1.13 leaves info unwritten then, so receives are posted to complete through a
 * request (NO_IMM_CMPL), whose length wait_all reads: immediate completion stays handled
 * for UCX versions that do write it. */
static void *post_recv(ucx_group_t *ug, void *buf, size_t bytes, uint64_t tag,
                       ucp_tag_recv_info_t *info)
{
    ucp_request_param_t param = {.op_attr_mask = UCP_OP_ATTR_FIELD_RECV_INFO |
                                                 UCP_OP_ATTR_FLAG_NO_IMM_CMPL,
                                 .recv_info.tag_info = info};
    return ucp_tag_recv_nbx(ug->worker, buf, bytes, tag, ~0ull, &param);
}

static void *post_recv_iov(ucx_group_t *ug, const fsdp2_iov_t *iov, size_t n, uint64_t tag,
                           ucp_tag_recv_info_t *info)
{
    _Static_assert(sizeof(fsdp2_iov_t) == sizeof(ucp_dt_iov_t),
                   "fsdp2_iov_t must match ucp_dt_iov_t");
    ucp_request_param_t param = {.op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE |
                                                 UCP_OP_ATTR_FIELD_RECV_INFO |
                                                 UCP_OP_ATTR_FLAG_NO_IMM_CMPL,
                                 .datatype = ucp_dt_make_iov(),
                                 .recv_info.tag_info = info};
    return ucp_tag_recv_nbx(ug->worker, (void *)iov, n, tag, ~0ull, &param);
}

/* Notes a receive that completed at once (req NULL) with another length than wanted
 * (info->length starts as SIZE_MAX: a UCX that did not write it is not taken for 0). */
static void note_immediate(req_list_t *rl, int from, const void *req,
                           const ucp_tag_recv_info_t *info, size_t want)
{
    if (req == NULL && info->length != SIZE_MAX && info->length != want && rl->short_peer < 0) {
        rl->short_peer = from;
        rl->short_got = info->length;
        rl->short_want = want;
    }
}

void fsdp2_ucx_add_send(ucx_group_t *ug, req_list_t *rl, int peer, const void *buf,
                        size_t bytes, uint64_t tag)
{
    if (rl->stamp_from)
        rl->stamp_from[rl->n] = -1;
    rl->peer[rl->n] = peer;
    rl->req[rl->n++] = post_send(ug, peer, buf, bytes, tag);
}

void fsdp2_ucx_add_recv(ucx_group_t *ug, req_list_t *rl, int from, void *buf, size_t bytes,
                        uint64_t tag)
{
    ucp_tag_recv_info_t info = {.length = SIZE_MAX};
    if (rl->stamp_from)
        rl->stamp_from[rl->n] = -1;
    rl->peer[rl->n] = RECV_FROM(from);
    rl->want[rl->n] = bytes;
    rl->req[rl->n] = post_recv(ug, buf, bytes, tag, &info);
    note_immediate(rl, from, rl->req[rl->n], &info, bytes);
    rl->n++;
}

static void add_recv_iov(ucx_group_t *ug, req_list_t *rl, int from, const fsdp2_iov_t *iov,
                         size_t n, uint64_t tag)
{
    ucp_tag_recv_info_t info = {.length = SIZE_MAX};
    size_t bytes = 0;
    for (size_t k = 0; k < n; k++)
        bytes += iov[k].bytes;
    if (rl->stamp_from)
        rl->stamp_from[rl->n] = -1;
    rl->peer[rl->n] = RECV_FROM(from);
    rl->want[rl->n] = bytes;
    rl->req[rl->n] = post_recv_iov(ug, iov, n, tag, &info);
    note_immediate(rl, from, rl->req[rl->n], &info, bytes);
    rl->n++;
}

/* Ends outstanding requests after a failure without waiting for them: receives are
 * cancelled, and every request is freed (UCX releases one still in flight when it
 * completes). Sends cannot be cancelled and a dead or stuck peer may never take them, so
 * waiting could last forever; instead the group is failed for good, and the buffers of
 * the failed collective stay in UCX's hands until the group is destroyed. */
static void cancel_all(ucx_group_t *ug, void **reqs, const int *peers, int n)
{
    for (int i = 0; i < n; i++) {
        if (!reqs[i] || UCS_PTR_IS_ERR(reqs[i])) {
            reqs[i] = NULL;
            continue;
        }
        if (peers[i] < 0) /* a receive */
            ucp_request_cancel(ug->worker, reqs[i]);
        ucp_request_free(reqs[i]);
        reqs[i] = NULL;
    }
}

static void mark_failed(ucx_group_t *ug, int peer)
{
    atomic_store(&ug->peer_errors[peer].failed, 1);
    int expected = -1;
    atomic_compare_exchange_strong(&ug->failed_peer, &expected, peer);
}

/* Same-host peers run without UCX failure detection (it would force TCP): a waiting
 * rank checks, at most every 100 ms, that the processes it waits for still exist. */

static void check_liveness(ucx_group_t *ug, const int *peers, int n, void **reqs)
{
    long t = (long)fsdp2_now_ms(), last = atomic_load(&ug->liveness_checked_ms);
    if (t - last < 100 || !atomic_compare_exchange_strong(&ug->liveness_checked_ms, &last, t))
        return; /* checked recently, or another thread is checking now */
    for (int i = 0; i < n; i++)
        if (reqs[i])
            fsdp2_ucx_check_one(ug, PEER_OF(peers[i]));
}

/* Marks a same-host peer failed if its process is gone (or a zombie). */
void fsdp2_ucx_check_one(ucx_group_t *ug, int peer)
{
    ucx_peer_error_t *pe = &ug->peer_errors[peer];
    if (!pe->local || atomic_load(&pe->failed))
        return;
    char path[64], state = 0;
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pe->pid);
    FILE *f = fopen(path, "r");
    if (f) { /* "pid (comm) S ...": a zombie has exited */
        char buf[512];
        size_t len = fread(buf, 1, sizeof(buf) - 1, f);
        buf[len] = '\0';
        char *close_paren = strrchr(buf, ')');
        if (close_paren && close_paren[1] == ' ')
            state = close_paren[2];
        fclose(f);
    }
    if ((kill(pe->pid, 0) != 0 && errno == ESRCH) || state == 'Z' || state == 'X') {
        FSDP2_LOG(WARN, COLL, "group '%s': peer %d (pid %d) has exited", ug->g->name, pe->peer,
                  (int)pe->pid);
        mark_failed(ug, pe->peer);
    }
}

/* A peer UCX reported failed that one of the pending requests involves, or -1. A peer
 * that failed after delivering everything this round needs does not fail it. */
static int failed_peer_among(ucx_group_t *ug, void **reqs, const int *peers, int n)
{
    if (atomic_load(&ug->failed_peer) < 0)
        return -1;
    for (int i = 0; i < n; i++)
        if (reqs[i] && atomic_load(&ug->peer_errors[PEER_OF(peers[i])].failed))
            return PEER_OF(peers[i]);
    return -1;
}

/* Waits for requests reqs[0..n) (NULL entries are done), then clears them. */
/* The error of a message whose length is not the one this rank's call expects: the
 * ranks called different collectives, or different sizes, as this sequence number. */
static fsdp2_status_t length_mismatch(ucx_group_t *ug, const char *what, int peer, size_t got,
                                      size_t want)
{
    return fsdp2_group_fail(ug->g, FSDP2_ERR_INVALID_STATE,
                            "%s: rank %d sent %zu bytes where this rank's call expects %zu: "
                            "the ranks of a group must call the same collectives with the "
                            "same sizes in the same order",
                            what, peer, got, want);
}

/* Waits for the requests of rl (NULL entries are done), then clears them: each receive
 * must bring its expected length, and each stamp this rank's call. */
static fsdp2_status_t wait_all(ucx_group_t *ug, req_list_t *rl, const char *what)
{
    void **reqs = rl->req;
    const int *peers = rl->peer;
    const size_t *want = rl->want;
    int n = rl->n;
    fsdp2_group_t *g = ug->g;
    int64_t deadline = fsdp2_now_ms() + g->timeout_ms;
    int idle = 0;
    for (;;) {
        int pending = 0, failed_peer = -1;
        ucs_status_t failed = UCS_OK;
        for (int i = 0; i < n; i++) {
            if (!reqs[i])
                continue;
            if (UCS_PTR_IS_ERR(reqs[i])) {
                failed = UCS_PTR_STATUS(reqs[i]);
                failed_peer = PEER_OF(peers[i]);
                reqs[i] = NULL;
                continue;
            }
            ucs_status_t s = ucp_request_check_status(reqs[i]);
            if (s == UCS_INPROGRESS) {
                pending++;
                continue;
            }
            if (s != UCS_OK) {
                failed = s;
                failed_peer = PEER_OF(peers[i]);
            }
            ucp_tag_recv_info_t info;
            if (s == UCS_OK && want && peers[i] < 0 &&
                ucp_tag_recv_request_test(reqs[i], &info) == UCS_OK && info.length != want[i]) {
                ucp_request_free(reqs[i]);
                reqs[i] = NULL;
                cancel_all(ug, reqs, peers, n);
                return length_mismatch(ug, what, PEER_OF(peers[i]), info.length, want[i]);
            }
            ucp_request_free(reqs[i]);
            reqs[i] = NULL;
            if (s == UCS_OK && rl->stamp_from && rl->stamp_from[i] >= 0) {
                fsdp2_status_t mismatch = fsdp2_ucx_check_stamp(ug, rl, rl->stamp_from[i]);
                if (mismatch != FSDP2_SUCCESS) {
                    cancel_all(ug, reqs, peers, n);
                    return mismatch;
                }
            }
        }
        if (failed != UCS_OK) {
            /* a transfer failed: was it because a peer on this host died? */
            atomic_store(&ug->liveness_checked_ms, 0);
            check_liveness(ug, peers, n, reqs);
            if (failed_peer >= 0 && ug->peer_errors[failed_peer].local)
                fsdp2_ucx_check_one(ug, failed_peer);
            cancel_all(ug, reqs, peers, n);
            int peer = atomic_load(&ug->failed_peer);
            if (peer >= 0)
                return fsdp2_group_fail(g, FSDP2_ERR_PEER_FAILED, "%s: peer %d failed (%s)", what,
                                        peer, ucs_status_string(failed));
            if (failed == UCS_ERR_MESSAGE_TRUNCATED)
                return fsdp2_group_fail(g, FSDP2_ERR_INVALID_STATE,
                                        "%s: rank %d sent more bytes than this rank's call "
                                        "expects: the ranks of a group must call the same "
                                        "collectives with the same sizes in the same order",
                                        what, failed_peer);
            return fsdp2_group_fail(g, FSDP2_ERR_BACKEND, "%s: %s", what,
                                    ucs_status_string(failed));
        }
        if (!pending)
            return FSDP2_SUCCESS;
        if (ucp_worker_progress(ug->worker)) {
            idle = 0;
            continue;
        }
        if (atomic_load(&g->aborted)) {
            cancel_all(ug, reqs, peers, n);
            return fsdp2_group_fail(g, FSDP2_ERR_ABORTED, "%s: aborted", what);
        }
        int from = atomic_load(&ug->abort_from);
        if (from) {
            cancel_all(ug, reqs, peers, n);
            return fsdp2_group_fail(g, FSDP2_ERR_PEER_FAILED, "%s: rank %d failed: %s", what,
                                    from - 1, ug->abort_in.reason);
        }
        check_liveness(ug, peers, n, reqs);
        int peer = failed_peer_among(ug, reqs, peers, n);
        if (peer >= 0) {
            cancel_all(ug, reqs, peers, n);
            return fsdp2_group_fail(g, FSDP2_ERR_PEER_FAILED, "%s: peer %d failed", what, peer);
        }
        int64_t left = deadline - fsdp2_now_ms();
        if (left <= 0) {
            cancel_all(ug, reqs, peers, n);
            return fsdp2_group_fail(g, FSDP2_ERR_TIMEOUT,
                                    "%s: %d transfers still pending after %.1f s (FSDP2_TIMEOUT)",
                                    what, pending, (double)g->timeout_ms / 1e3);
        }
        /* Idle: give the core away before trying again, since with more ranks than
         * cores the peer we wait for may need this one; block on the event fd only
         * after a while (waking from it costs a scheduler round trip). */
        if (++idle < ug->spin) {
            sched_yield();
            continue;
        }
        if (ucp_worker_arm(ug->worker) == UCS_OK) {
            struct pollfd pfd = {.fd = ug->efd, .events = POLLIN};
            poll(&pfd, 1, left < 10 ? (int)left + 1 : 10);
        }
        idle = 0;
    }
}

fsdp2_status_t fsdp2_ucx_wait_list(ucx_group_t *ug, req_list_t *rl, const char *what)
{
    fsdp2_status_t status;
    if (rl->short_peer >= 0) {
        cancel_all(ug, rl->req, rl->peer, rl->n);
        status = length_mismatch(ug, what, rl->short_peer, rl->short_got, rl->short_want);
    } else {
        status = wait_all(ug, rl, what);
    }
    rl->n = 0;
    rl->short_peer = -1;
    return status;
}

/* ---- algorithms ---- */

static fsdp2_status_t run_all_gather(ucx_group_t *ug, const coll_op_t *op, req_list_t *rl)
{
    fsdp2_group_t *g = ug->g;
    size_t bytes = op->count * op->elem_size;
    char *recv = op->recv;
    rl->n = 0;
    fsdp2_ucx_add_stamps(ug, rl, op);
    for (int k = 1; k < g->size; k++) {
        int r = (g->rank + g->size - k) % g->size;
        fsdp2_ucx_add_recv(ug, rl, r, recv + (size_t)r * bytes, bytes,
                           make_tag(op->seq, PHASE_DATA, r, 0));
    }
    for (int k = 1; k < g->size; k++) {
        int p = (g->rank + k) % g->size;
        fsdp2_ucx_add_send(ug, rl, p, op->send, bytes, make_tag(op->seq, PHASE_DATA, g->rank, 0));
    }
    char *mine = recv + (size_t)g->rank * bytes;
    if (bytes && mine != (const char *)op->send)
        memcpy(mine, op->send, bytes);
    return fsdp2_ucx_wait_list(ug, rl, "all_gather");
}

static fsdp2_status_t run_all_gather_pieces(ucx_group_t *ug, const coll_op_t *op, req_list_t *rl)
{
    fsdp2_group_t *g = ug->g;
    rl->n = 0;
    fsdp2_ucx_add_stamps(ug, rl, op);
    for (int k = 1; k < g->size; k++) {
        int r = (g->rank + g->size - k) % g->size;
        size_t first = op->offsets[r], count = op->offsets[r + 1] - first;
        static char nothing; /* UCX asserts on an iov array of NULL, which no pieces may be */
        if (count == 0)
            fsdp2_ucx_add_recv(ug, rl, r, &nothing, 0, make_tag(op->seq, PHASE_DATA, r, 0));
        else
            add_recv_iov(ug, rl, r, op->pieces + first, count, make_tag(op->seq, PHASE_DATA, r, 0));
    }
    for (int k = 1; k < g->size; k++) {
        int p = (g->rank + k) % g->size;
        fsdp2_ucx_add_send(ug, rl, p, op->send, op->count,
                           make_tag(op->seq, PHASE_DATA, g->rank, 0));
    }
    const char *src = op->send;
    for (size_t k = op->offsets[g->rank]; k < op->offsets[g->rank + 1]; k++) {
        if (op->pieces[k].bytes && op->pieces[k].data != src) /* apart from send (group.c) */
            memcpy(op->pieces[k].data, src, op->pieces[k].bytes);
        src += op->pieces[k].bytes;
    }
    return fsdp2_ucx_wait_list(ug, rl, "all_gather_pieces");
}

/* A free scratch set for a running reduction. fsdp2_ucx_enqueue lets at most UCX_SCRATCH_SETS
 * reductions of the group be in flight, and since every rank enqueues in the same order
 * they are the same reductions everywhere, so a set is free for each of them. (Handing
 * out sets without that bound deadlocked: rank 0 holding every set for seqs 0-3 while
 * rank 1 held them for seqs 4-7.) Returns -1 once the group has failed: sets used by a
 * failed round are never reused. */
static int scratch_acquire(ucx_group_t *ug)
{
    pthread_mutex_lock(&ug->lock);
    int got = -1;
    while (got < 0 && atomic_load(&ug->g->error) == FSDP2_SUCCESS) {
        for (int i = 0; i < UCX_SCRATCH_SETS && got < 0; i++)
            if (!ug->scratch_busy[i])
                got = i;
        if (got < 0)
            pthread_cond_wait(&ug->changed, &ug->lock);
    }
    if (got >= 0)
        ug->scratch_busy[got] = 1;
    pthread_mutex_unlock(&ug->lock);
    return got;
}

/* After a failed round UCX may still write into the set (a receive already matched is
 * not stopped by cancelling it), so it is never handed out again; waiters are woken to
 * see the group's error. */
static void scratch_release(ucx_group_t *ug, int set, int reusable)
{
    pthread_mutex_lock(&ug->lock);
    if (reusable)
        ug->scratch_busy[set] = 0;
    pthread_cond_broadcast(&ug->changed);
    pthread_mutex_unlock(&ug->lock);
}

/* Rank r's part of a reduction: elements [*lo, *hi) of the send buffers. A reduce-scatter
 * gives every rank `count`; an all-reduce splits its count as torch.chunk does. Computed
 * per rank instead of kept in arrays: groups reach 4096 ranks, and collectives may run
 * on the caller's stack. */
typedef struct ranges {
    size_t count;
    int size, chunked;
} ranges_t;

static void range_of(const ranges_t *rg, int r, size_t *lo, size_t *hi)
{
    if (!rg->chunked) {
        *lo = (size_t)r * rg->count;
        *hi = *lo + rg->count;
        return;
    }
    size_t chunk = (rg->count + (size_t)rg->size - 1) / (size_t)rg->size;
    size_t a = chunk * (size_t)r, b = a + chunk;
    *lo = a < rg->count ? a : rg->count;
    *hi = b < rg->count ? b : rg->count;
}

static size_t range_len(const ranges_t *rg, int r)
{
    size_t lo, hi;
    range_of(rg, r, &lo, &hi);
    return hi - lo;
}

/* The reduction half shared by reduce_scatter and all_reduce: this rank's result goes to
 * out. Rounds of at most ug->segment bytes per peer bound the scratch. */
static fsdp2_status_t run_reduction(ucx_group_t *ug, const coll_op_t *op, req_list_t *rl,
                                    const ranges_t *rg, char *out, const char *what)
{
    fsdp2_group_t *g = ug->g;
    size_t es = op->elem_size, seg = ug->segment / es;
    size_t mine = range_len(rg, g->rank), most = range_len(rg, 0); /* rank 0's is longest */
    size_t my_lo, my_hi;
    range_of(rg, g->rank, &my_lo, &my_hi);
    int set = scratch_acquire(ug);
    if (set < 0)
        return fsdp2_group_check(ug->g);
    char *scratch = ug->scratch[set];
    const void **src = ug->sources[set];
    fsdp2_status_t status = FSDP2_SUCCESS;
    for (size_t s = 0, off = 0; off < most && status == FSDP2_SUCCESS; s++, off += seg) {
        rl->n = 0;
        if (s == 0)
            fsdp2_ucx_add_stamps(ug, rl, op);
        size_t m = off < mine ? (mine - off < seg ? mine - off : seg) : 0;
        for (int k = 1; k < g->size && m; k++) {
            int r = (g->rank + g->size - k) % g->size;
            int slot = (r - g->rank + g->size) % g->size - 1;
            fsdp2_ucx_add_recv(ug, rl, r, scratch + (size_t)slot * ug->segment, m * es,
                               make_tag(op->seq, PHASE_DATA, r, s));
        }
        for (int k = 1; k < g->size; k++) {
            int p = (g->rank + k) % g->size;
            size_t lo, hi;
            range_of(rg, p, &lo, &hi);
            if (off >= hi - lo)
                continue;
            size_t pm = hi - lo - off < seg ? hi - lo - off : seg;
            fsdp2_ucx_add_send(ug, rl, p, op->send + (lo + off) * es, pm * es,
                               make_tag(op->seq, PHASE_DATA, g->rank, s));
        }
        status = fsdp2_ucx_wait_list(ug, rl, what);
        if (status != FSDP2_SUCCESS || !m)
            continue;
        for (int r = 0; r < g->size; r++) {
            int slot = (r - g->rank + g->size) % g->size - 1;
            src[r] = r == g->rank ? (const void *)(op->send + (my_lo + off) * es)
                                  : (const void *)(scratch + (size_t)slot * ug->segment);
        }
        fsdp2_reduce_rank_order(out + off * es, op->dtype, src, g->size, m,
                                op->reduce.pre_divide, op->reduce.post_divide);
    }
    scratch_release(ug, set, status == FSDP2_SUCCESS);
    return status;
}

static fsdp2_status_t run_reduce_scatter(ucx_group_t *ug, const coll_op_t *op, req_list_t *rl)
{
    ranges_t rg = {.count = op->count, .size = ug->g->size, .chunked = 0};
    return run_reduction(ug, op, rl, &rg, op->recv, "reduce_scatter");
}

static fsdp2_status_t run_all_reduce(ucx_group_t *ug, const coll_op_t *op, req_list_t *rl)
{
    fsdp2_group_t *g = ug->g;
    ranges_t rg = {.count = op->count, .size = g->size, .chunked = 1};
    size_t es = op->elem_size, my_lo, my_hi;
    range_of(&rg, g->rank, &my_lo, &my_hi);
    char *buf = op->recv;
    FSDP2_CHECK(run_reduction(ug, op, rl, &rg, buf + my_lo * es, "all_reduce"));
    /* Everyone's sends of our range have completed (the reduction waited for them), so
     * the ranges can now be overwritten with the results. */
    rl->n = 0;
    for (int k = 1; k < g->size; k++) {
        int r = (g->rank + g->size - k) % g->size;
        size_t lo, hi;
        range_of(&rg, r, &lo, &hi);
        if (hi > lo)
            fsdp2_ucx_add_recv(ug, rl, r, buf + lo * es, (hi - lo) * es,
                               make_tag(op->seq, PHASE_GATHER, r, 0));
    }
    size_t mine = my_hi - my_lo;
    for (int k = 1; k < g->size && mine; k++) {
        int p = (g->rank + k) % g->size;
        fsdp2_ucx_add_send(ug, rl, p, buf + my_lo * es, mine * es,
                           make_tag(op->seq, PHASE_GATHER, g->rank, 0));
    }
    return fsdp2_ucx_wait_list(ug, rl, "all_reduce");
}

static fsdp2_status_t run_broadcast(ucx_group_t *ug, const coll_op_t *op, req_list_t *rl)
{
    fsdp2_group_t *g = ug->g;
    size_t bytes = op->count * op->elem_size;
    rl->n = 0;
    fsdp2_ucx_add_stamps(ug, rl, op);
    if (g->rank == op->root) {
        for (int k = 1; k < g->size; k++) {
            int p = (g->rank + k) % g->size;
            fsdp2_ucx_add_send(ug, rl, p, op->recv, bytes,
                               make_tag(op->seq, PHASE_DATA, op->root, 0));
        }
    } else {
        fsdp2_ucx_add_recv(ug, rl, op->root, op->recv, bytes,
                           make_tag(op->seq, PHASE_DATA, op->root, 0));
    }
    return fsdp2_ucx_wait_list(ug, rl, "broadcast");
}

static fsdp2_status_t run_barrier(ucx_group_t *ug, const coll_op_t *op, req_list_t *rl)
{
    fsdp2_group_t *g = ug->g;
    rl->n = 0;
    fsdp2_ucx_add_stamps(ug, rl, op);
    for (int k = 1; k < g->size; k++) {
        int r = (g->rank + g->size - k) % g->size;
        fsdp2_ucx_add_recv(ug, rl, r, NULL, 0, make_tag(op->seq, PHASE_BARRIER, r, 0));
    }
    for (int k = 1; k < g->size; k++) {
        int p = (g->rank + k) % g->size;
        fsdp2_ucx_add_send(ug, rl, p, NULL, 0, make_tag(op->seq, PHASE_BARRIER, g->rank, 0));
    }
    return fsdp2_ucx_wait_list(ug, rl, "barrier");
}

static int is_reduction(const coll_op_t *op)
{
    return op->kind == COLL_REDUCE_SCATTER || op->kind == COLL_ALL_REDUCE;
}

/* Marks the slot free (and the reduction finished). */
static void slot_release(ucx_group_t *ug, ucx_slot_t *slot)
{
    pthread_mutex_lock(&ug->lock);
    if (is_reduction(&slot->op))
        ug->reductions_in_flight--;
    slot->busy = 0;
    pthread_cond_broadcast(&ug->changed);
    pthread_mutex_unlock(&ug->lock);
}

/* The host function a collective becomes on its stream. */
static fsdp2_status_t ucx_run(void *arg)
{
    ucx_slot_t *slot = arg;
    ucx_group_t *ug = slot->ug;
    coll_op_t op = slot->op;
    atomic_store(&slot->ran, 1);
    fsdp2_status_t status = fsdp2_group_check(ug->g);
    if (status == FSDP2_SUCCESS && ug->shm) {
        status = fsdp2_shm_run(ug->shm, &op);
    } else if (status == FSDP2_SUCCESS) {
        switch (op.kind) {
        case COLL_ALL_GATHER: status = run_all_gather(ug, &op, slot->list); break;
        case COLL_ALL_GATHER_PIECES: status = run_all_gather_pieces(ug, &op, slot->list); break;
        case COLL_REDUCE_SCATTER: status = run_reduce_scatter(ug, &op, slot->list); break;
        case COLL_ALL_REDUCE: status = run_all_reduce(ug, &op, slot->list); break;
        case COLL_BROADCAST: status = run_broadcast(ug, &op, slot->list); break;
        case COLL_BARRIER: status = run_barrier(ug, &op, slot->list); break;
        }
        /* Peers that still wait for this rank would otherwise wait out their timeout
         * (across hosts nothing else tells them); a failure that came from a peer's
         * abort message was already sent to all by that peer. */
        if (status != FSDP2_SUCCESS && !atomic_load(&ug->abort_from)) {
            char reason[640];
            fsdp2_group_error_text(ug->g, reason, sizeof(reason));
            fsdp2_ucx_send_abort(ug, reason);
        }
    }
    slot_release(ug, slot);
    return status;
}

fsdp2_status_t fsdp2_ucx_enqueue(fsdp2_group_t *g, const coll_op_t *op,
                                 fsdp2_stream_t *stream)
{
    ucx_group_t *ug = g->backend;
    ucx_slot_t *slot = &ug->slots[op->seq % UCX_SLOTS];
    int64_t deadline = fsdp2_now_ms() + g->timeout_ms;
    pthread_mutex_lock(&ug->lock);
    /* Like a full queue, a slot still in use or a fifth reduction in flight makes the
     * caller wait; both are freed by collectives every rank already has in flight, unless
     * those wait for something this thread would do only after this call: then the wait
     * ends at the group's timeout (and the group fails: this collective's sequence number
     * is spent). */
    while (slot->busy ||
           (is_reduction(op) && ug->reductions_in_flight >= UCX_SCRATCH_SETS)) {
        if (fsdp2_now_ms() >= deadline) {
            int busy = slot->busy;
            pthread_mutex_unlock(&ug->lock);
            /* enqueue() in group.c fails the group, naming the collective */
            return fsdp2_error(FSDP2_ERR_TIMEOUT,
                               busy ? "waited %.1f s (FSDP2_TIMEOUT) for the collective %d "
                                      "places before it to free its slot"
                                    : "waited %.1f s (FSDP2_TIMEOUT) for one of the group's %d "
                                      "reductions in flight to finish",
                               (double)g->timeout_ms / 1e3, busy ? UCX_SLOTS : UCX_SCRATCH_SETS);
        }
        /* re-checks the deadline; REALTIME: the condition variable's clock */
        struct timespec ts = fsdp2_time_after(CLOCK_REALTIME, 10 * 1000000L);
        pthread_cond_timedwait(&ug->changed, &ug->lock, &ts);
    }
    slot->busy = 1;
    atomic_store(&slot->ran, 0);
    slot->op = *op;
    if (is_reduction(op))
        ug->reductions_in_flight++;
    pthread_mutex_unlock(&ug->lock);
    fsdp2_status_t status = fsdp2_stream_launch_host(stream, ucx_run, slot);
    if (status != FSDP2_SUCCESS && !atomic_load(&slot->ran))
        slot_release(ug, slot); /* never ran (a run frees the slot itself) */
    return status;
}
