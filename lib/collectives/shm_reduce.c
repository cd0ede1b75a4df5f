/* Reductions of the shared-memory transport (the protocol they are written in: shm.c).
 *
 * Reductions read straight from the peers' slots: reduce-scatter has each rank copy the
 * pieces of its input the others own into its slot and sum its own piece from all slots
 * in rank order (identical bits on every rank); all-reduce does that over torch.chunk
 * ranges and then all-gathers the ranges (from 16 MiB, reducing straight into the slot
 * the results are gathered from, or in place and then streamed into it), or, up to
 * 16 KiB (at 2 ranks also from 192 KiB up to a slot), has every rank post its whole
 * buffer and reduce everything itself (one step instead of two). */
#include <string.h>

#include "collectives/group_internal.h"
#include "collectives/shm_run.h"
#include "core/error.h"


/* A copy of a reduction: a piece of a peer's range into this rank's slot (to_slot), or
 * a peer's result out of its slot into the buffer. */
typedef struct copy_job {
    char *dst;
    const char *src;
    size_t n;
    int to_slot;
} copy_job_t;

/* The copies of step t of a pipelined reduction that put the piece at `off` of every
 * peer's range of base ([lo[p], hi[p]) elements, piece elements of es bytes at most)
 * into this rank's slot, peer by peer in ring order (reduce_ranges and reduce_own_piece
 * read them from there), appended to job[*jobs]; *slot stays NULL when no peer has rows
 * left at off (then nothing is posted). */
static fsdp2_status_t peer_piece_jobs(run_t *x, uint64_t t, const char *base, const size_t *lo,
                                      const size_t *hi, size_t off, size_t piece, size_t es,
                                      copy_job_t *job, int *jobs, char **slot)
{
    int n = x->n, me = x->me;
    *slot = NULL;
    for (int k = 1; k < n; k++) {
        int p = (me + k) % n;
        size_t len = hi[p] - lo[p];
        if (off >= len)
            continue;
        if (!*slot)
            FSDP2_CHECK(fsdp2_shm_slot_for_write(x, t, slot));
        job[(*jobs)++] = (copy_job_t){*slot + (size_t)(k - 1) * piece * es,
                                      base + (lo[p] + off) * es, min_size(piece, len - off) * es,
                                      1};
    }
    return FSDP2_SUCCESS;
}

/* The sources of this rank's piece at `off` in step t: its own elements of base, and
 * each peer's piece for it in that peer's slot (the reader's side of peer_piece_jobs'
 * layout: in a writer's slot, this rank's piece is the (me - writer - 1)-th, mod n). */
static fsdp2_status_t piece_sources(run_t *x, uint64_t t, const char *base, size_t lo_me,
                                    size_t off, size_t piece, size_t es, const void **src)
{
    int n = x->n, me = x->me;
    for (int r = 0; r < n; r++) {
        if (r == me) {
            src[r] = base + (lo_me + off) * es;
            continue;
        }
        const char *peer_slot;
        FSDP2_CHECK(fsdp2_shm_slot_for_read(x, r, t, &peer_slot));
        src[r] = peer_slot + (size_t)((me - r + n) % n - 1) * piece * es;
    }
    return FSDP2_SUCCESS;
}

/* Step t of a pipelined reduction: peer_piece_jobs' copies, one after the other, and the
 * slot posted. */
static fsdp2_status_t post_peer_pieces(run_t *x, uint64_t t, const char *base, const size_t *lo,
                                       const size_t *hi, size_t off, size_t piece, size_t es)
{
    copy_job_t job[FSDP2_SHM_MAX_RANKS];
    int jobs = 0;
    char *slot;
    FSDP2_CHECK(peer_piece_jobs(x, t, base, lo, hi, off, piece, es, job, &jobs, &slot));
    for (int j = 0; j < jobs; j++)
        fsdp2_shm_slot_copy(x, job[j].dst, job[j].src, job[j].n);
    if (slot)
        fsdp2_shm_post(x, t);
    return FSDP2_SUCCESS;
}

/* Reduces m elements of the sources into out: straight, or when the output streams,
 * with non-temporal stores (fsdp2_shm_reduce_stream; a plain store would first read its
 * line). */
void fsdp2_shm_reduce_out(const run_t *x, const coll_op_t *op, char *out,
                          const void *const *src, size_t m)
{
    double pre = op->reduce.pre_divide, post = op->reduce.post_divide;
    if (x->out_streaming)
        fsdp2_shm_reduce_stream(out, op->dtype, op->elem_size, src, x->n, m, pre, post);
    else
        fsdp2_reduce_rank_order(out, op->dtype, src, x->n, m, pre, post);
}

/* Elements of es bytes per peer in one step's slot of a reduction over n ranks: a writer's
 * slot holds one piece for each peer, each a whole number of cache lines. */
static size_t piece_elements(const run_t *x, size_t es)
{
    return x->sg->params.slot / (size_t)(x->n - 1) / SHM_LINE * SHM_LINE / es;
}

/* Rank r's result covers elements [lo[r], hi[r]) of the send buffers; this rank's goes
 * to out. In each step a writer's slot holds one piece for each peer, in the order of
 * the peers after it. */
static fsdp2_status_t reduce_ranges(run_t *x, const coll_op_t *op, const size_t *lo,
                                    const size_t *hi, char *out)
{
    int n = x->n, me = x->me;
    size_t es = op->elem_size;
    size_t piece = piece_elements(x, es);
    size_t most = 0, mine = hi[me] - lo[me];
    for (int r = 0; r < n; r++)
        most = hi[r] - lo[r] > most ? hi[r] - lo[r] : most;
    const char *send = op->send;
    const void *src[FSDP2_SHM_MAX_RANKS];
    for (size_t off = 0; off < most; off += piece) {
        uint64_t t = x->next++;
        FSDP2_CHECK(post_peer_pieces(x, t, send, lo, hi, off, piece, es));
        if (off < mine) {
            FSDP2_CHECK(piece_sources(x, t, send, lo[me], off, piece, es, src));
            fsdp2_shm_reduce_out(x, op, out + off * es, src, min_size(piece, mine - off));
        }
        fsdp2_shm_finish_step(x, t);
    }
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_shm_run_reduce_scatter(run_t *x, const coll_op_t *op)
{
    size_t lo[FSDP2_SHM_MAX_RANKS], hi[FSDP2_SHM_MAX_RANKS];
    for (int r = 0; r < x->n; r++) {
        lo[r] = (size_t)r * op->count;
        hi[r] = lo[r] + op->count;
    }
    return reduce_ranges(x, op, lo, hi, op->recv);
}

/* Up to one slot (shm_all_reduce_one_step says when): every rank posts its whole buffer
 * and reduces all of them itself. */
static fsdp2_status_t all_reduce_one_step(run_t *x, const coll_op_t *op)
{
    size_t bytes = op->count * op->elem_size;
    const void *src[FSDP2_SHM_MAX_RANKS];
    uint64_t t = x->next++;
    char *slot;
    FSDP2_CHECK(fsdp2_shm_slot_for_write(x, t, &slot));
    if (bytes) /* count 0: recv may be NULL */
        memcpy(slot, op->recv, bytes);
    fsdp2_shm_post(x, t);
    for (int r = 0; r < x->n; r++) {
        const char *peer_slot = op->recv;
        if (r != x->me)
            FSDP2_CHECK(fsdp2_shm_slot_for_read(x, r, t, &peer_slot));
        src[r] = peer_slot;
    }
    /* the result overwrites our own contribution block by block, after reading it */
    fsdp2_reduce_rank_order(op->recv, op->dtype, src, x->n, op->count, op->reduce.pre_divide,
                            op->reduce.post_divide);
    fsdp2_shm_finish_step(x, t);
    return FSDP2_SUCCESS;
}

/* The fused all-reduce's layout: rank r's range [lo[r], hi[r]) of the buffer, pieces of
 * `piece` elements per peer, es bytes each. */
typedef struct fused {
    const coll_op_t *op;
    char *buf;
    const size_t *lo, *hi;
    size_t piece, es;
} fused_t;

/* This rank's piece at off, summed from its buffer and the peers' pieces of step t into
 * its slot of t_result (or, streaming, in place and then into the slot: the kernel's
 * stores are plain), and written to its buffer; t is finished. */
static fsdp2_status_t reduce_own_piece(run_t *x, const fused_t *f, size_t off, uint64_t t,
                                       uint64_t t_result)
{
    int n = x->n, me = x->me;
    size_t es = f->es, m = min_size(f->piece, f->hi[me] - f->lo[me] - off);
    const coll_op_t *op = f->op;
    const void *src[FSDP2_SHM_MAX_RANKS];
    FSDP2_CHECK(piece_sources(x, t, f->buf, f->lo[me], off, f->piece, es, src));
    char *result, *own = f->buf + (f->lo[me] + off) * es;
    FSDP2_CHECK(fsdp2_shm_slot_for_write(x, t_result, &result));
    if (x->streaming) {
        fsdp2_reduce_rank_order(own, op->dtype, src, n, m, op->reduce.pre_divide,
                                op->reduce.post_divide);
        fsdp2_shm_finish_step(x, t); /* done with the peers' pieces */
        fsdp2_shm_slot_copy(x, result, own, m * es);
        fsdp2_shm_post(x, t_result);
    } else {
        fsdp2_reduce_rank_order(result, op->dtype, src, n, m, op->reduce.pre_divide,
                                op->reduce.post_divide);
        fsdp2_shm_post(x, t_result);
        fsdp2_shm_finish_step(x, t); /* done with the peers' pieces */
        fsdp2_shm_out_copy(x, own, result, m * es);
    }
    return FSDP2_SUCCESS;
}

/* The peers' results at off (step t_result) into the buffer, each as soon as it is
 * there. */
static fsdp2_status_t results_out(run_t *x, const fused_t *f, size_t off, uint64_t t_result)
{
    for (int k = 1; k < x->n; k++) {
        int r = (x->me + k) % x->n;
        size_t len = f->hi[r] - f->lo[r];
        if (off >= len)
            continue;
        const char *peer_slot;
        FSDP2_CHECK(fsdp2_shm_slot_for_read(x, r, t_result, &peer_slot));
        fsdp2_shm_out_copy(x, f->buf + (f->lo[r] + off) * f->es, peer_slot,
                           min_size(f->piece, len - off) * f->es);
    }
    fsdp2_shm_finish_step(x, t_result);
    return FSDP2_SUCCESS;
}

/* The peers' results at off (step t_result) out, paired with the next piece's copy-in
 * at off_next (step t_next; 0: none), sg->pair_chunk bytes of each copy in turn: the
 * copies out read the other cores' caches and the copies in read memory, and a core
 * does both at once faster than one after the other. */
static fsdp2_status_t results_out_paired(run_t *x, const fused_t *f, size_t off,
                                         uint64_t t_result, size_t off_next, uint64_t t_next)
{
    int n = x->n, me = x->me, jobs = 0;
    size_t es = f->es, most = 0;
    copy_job_t job[2 * FSDP2_SHM_MAX_RANKS];
    for (int k = 1; k < n; k++) {
        int r = (me + k) % n;
        size_t len = f->hi[r] - f->lo[r];
        if (off >= len)
            continue;
        const char *peer_slot;
        FSDP2_CHECK(fsdp2_shm_slot_for_read(x, r, t_result, &peer_slot));
        job[jobs++] = (copy_job_t){f->buf + (f->lo[r] + off) * es, peer_slot,
                                   min_size(f->piece, len - off) * es, 0};
    }
    char *slot = NULL;
    if (t_next)
        FSDP2_CHECK(peer_piece_jobs(x, t_next, f->buf, f->lo, f->hi, off_next, f->piece, es,
                                    job, &jobs, &slot));
    for (int j = 0; j < jobs; j++)
        most = job[j].n > most ? job[j].n : most;
    size_t chunk = x->sg->pair_chunk;
    for (size_t c = 0; c < most; c += chunk)
        for (int j = 0; j < jobs; j++) {
            if (c >= job[j].n)
                continue;
            size_t k = min_size(chunk, job[j].n - c);
            if (job[j].to_slot)
                fsdp2_shm_slot_copy(x, job[j].dst + c, job[j].src + c, k);
            else
                fsdp2_shm_out_copy(x, job[j].dst + c, job[j].src + c, k);
        }
    if (slot)
        fsdp2_shm_post(x, t_next);
    fsdp2_shm_finish_step(x, t_result);
    return FSDP2_SUCCESS;
}

/* All-reduce of large buffers, in two steps per piece: the pieces of the peers' ranges go
 * out (as in reduce_ranges), then each rank reduces its own piece straight into its next
 * slot, and every rank, itself included, copies the results out of the slots. Writing
 * the result once into a slot that stays in cache saves writing it to the buffer and
 * reading it back to send it.
 *
 * With a CPU per rank (shm_placement.c), the peers' results of one piece go out paired
 * with the next piece's copy-in (results_out_paired): the copy-out reads another core's
 * cache while the copy-in reads memory, and one core overlaps the two. With more ranks
 * than CPUs the two would compete for a CPU a peer needs, and stay apart (figures:
 * docs/collectives.md). The steps are the same either way. */
static fsdp2_status_t all_reduce_fused(run_t *x, const coll_op_t *op, const size_t *lo,
                                       const size_t *hi)
{
    int n = x->n, pair = x->sg->core_per_rank;
    size_t es = op->elem_size, most = 0;
    fused_t f = {op, op->recv, lo, hi, piece_elements(x, es), es};
    for (int r = 0; r < n; r++)
        most = hi[r] - lo[r] > most ? hi[r] - lo[r] : most;
    if (!most) /* no steps (an empty all-reduce takes one step instead, so never) */
        return FSDP2_SUCCESS;
    /* piece k's steps: t (its copy-in) and t_result; every rank numbers them the same */
    uint64_t t = x->next++;
    FSDP2_CHECK(post_peer_pieces(x, t, f.buf, lo, hi, 0, f.piece, es));
    for (size_t off = 0; off < most; off += f.piece) {
        uint64_t t_result = x->next++;
        size_t off_next = off + f.piece;
        uint64_t t_next = off_next < most ? x->next++ : 0;
        if (off < hi[x->me] - lo[x->me])
            FSDP2_CHECK(reduce_own_piece(x, &f, off, t, t_result));
        else
            fsdp2_shm_finish_step(x, t);
        if (pair) {
            FSDP2_CHECK(results_out_paired(x, &f, off, t_result, off_next, t_next));
        } else {
            FSDP2_CHECK(results_out(x, &f, off, t_result));
            if (t_next)
                FSDP2_CHECK(post_peer_pieces(x, t_next, f.buf, lo, hi, off_next, f.piece, es));
        }
        t = t_next;
    }
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_shm_run_all_reduce(run_t *x, const coll_op_t *op)
{
    size_t es = op->elem_size;
    if (shm_all_reduce_one_step(&x->sg->params, x->n, op->count * es))
        return all_reduce_one_step(x, op);
    size_t lo[FSDP2_SHM_MAX_RANKS], hi[FSDP2_SHM_MAX_RANKS], len[FSDP2_SHM_MAX_RANKS];
    sink_t sinks[FSDP2_SHM_MAX_RANKS];
    size_t chunk = (op->count + (size_t)x->n - 1) / (size_t)x->n; /* torch.chunk */
    char *buf = op->recv;
    for (int r = 0; r < x->n; r++) {
        lo[r] = min_size(chunk * (size_t)r, op->count);
        hi[r] = min_size(chunk * (size_t)(r + 1), op->count);
        len[r] = (hi[r] - lo[r]) * es;
        sinks[r] = (sink_t){.buf = buf + lo[r] * es};
    }
    if (op->count * es >= x->sg->params.fused_min) /* the same on every rank (agreed) */
        return all_reduce_fused(x, op, lo, hi);
    /* Peers read our buffer only through our slots, so our range can take the result
     * while they still reduce theirs. */
    FSDP2_CHECK(reduce_ranges(x, op, lo, hi, buf + lo[x->me] * es));
    return fsdp2_shm_gather(x, buf + lo[x->me] * es, len, sinks, 0);
}
