/* One collective of the shared-memory transport as it runs on this rank, and the step
 * protocol the collectives are written in: shared by shm.c (the protocol, waiting, the
 * gathers, turns) and shm_reduce.c (reduce-scatter and all-reduce). */
#ifndef FSDP2_COLLECTIVES_SHM_RUN_H
#define FSDP2_COLLECTIVES_SHM_RUN_H

#include <stddef.h>
#include <stdint.h>

#include "collectives/shm_internal.h"

/* One collective's view: who we are, the next step, and the wait bookkeeping. */
typedef struct run {
    shm_group_t *sg;
    const char *what;
    int me, n;
    uint64_t next; /* the step number the collective uses next */
    int streaming; /* this rank writes its slots with non-temporal stores */
    int out_streaming; /* and its output (fsdp2_shm_out_copy) */
    int fence_posts; /* set whenever streaming is: each post fences (streaming may change) */
    uint64_t posts;      /* steps this rank has posted in this collective */
    uint64_t part_steps; /* a part try: the way changes after this many posts (0: none) */
    uint64_t part_posts; /* the posts before it changed (0: it did not) */
    int owed_wake;     /* a counter advanced since this rank last looked for sleepers */
    const direct_desc_t *direct_descs; /* a single-copy collective's announcements */
    const coll_op_t *op;  /* the collective, as this rank called it */
    uint64_t stamped[FSDP2_SHM_MAX_RANKS / 64]; /* bit r: rank r's stamp was compared */
    int64_t deadline_ms, liveness_ms; /* 0: not started (no wait has gone idle yet) */
} run_t;

static inline size_t min_size(size_t a, size_t b) { return a < b ? a : b; }

/* Where a rank's gathered bytes go: a buffer, or the pieces of all_gather_pieces. */
typedef struct sink {
    char *buf;
    const fsdp2_iov_t *piece; /* the current piece, and how much of it is written */
    size_t at;
} sink_t;

/* ---- shm.c: the step protocol ---- */

/* Copies n bytes into a slot (non-temporal stores when x->streaming), or into the
 * caller's output (when x->out_streaming). */
void fsdp2_shm_slot_copy(const run_t *x, char *dst, const char *src, size_t n);
void fsdp2_shm_out_copy(const run_t *x, char *dst, const char *src, size_t n);
/* This rank's slot for step t, once every reader has finished with its previous use. */
fsdp2_status_t fsdp2_shm_slot_for_write(run_t *x, uint64_t t, char **slot);
/* Publishes this rank's slot of step t, fencing streamed stores first. On a part try
 * (shm_stores.c) the x->part_steps-th post then changes x->streaming for the rest of
 * the collective: read it afresh for each slot, never across a post. */
void fsdp2_shm_post(run_t *x, uint64_t t);
/* Rank r's slot of step t, once r has posted it. */
fsdp2_status_t fsdp2_shm_slot_for_read(run_t *x, int r, uint64_t t, const char **slot);
/* Every peer's slot of step t is free as far as this rank is concerned: read, or never
 * needed (a reader may mark a step it skips before the writer has posted it). */
void fsdp2_shm_finish_step(run_t *x, uint64_t t);
/* Writes m bytes from src at offset off of sink s (pieces: off must be s's cursor). */
void fsdp2_shm_sink_write(const run_t *x, sink_t *s, size_t off, const char *src, size_t m);
/* Whether this rank's own block of a pieces gather still has to be written from op->send:
 * not when one of its pieces is the input itself, in which case the others have just
 * been copied from it. */
int fsdp2_shm_pieces_own(const coll_op_t *op, int me);
/* Rank r's len[r] bytes reach sinks[r] on every other rank (and this rank's own sink
 * when own is set), from mine on this rank. */
fsdp2_status_t fsdp2_shm_gather(run_t *x, const char *mine, const size_t *len, sink_t *sinks,
                                int own);

/* A step that moves no bytes: posted, then waited for on every peer (a barrier). It
 * counts no post (x->posts: the slot stores' learner times slot writes only). */
fsdp2_status_t fsdp2_shm_sync_step(run_t *x);

/* ---- shm_reduce.c ---- */

fsdp2_status_t fsdp2_shm_run_reduce_scatter(run_t *x, const coll_op_t *op);
fsdp2_status_t fsdp2_shm_run_all_reduce(run_t *x, const coll_op_t *op);
/* Reduces m elements of src[0..n) into out, in rank order (x->out_streaming: with
 * non-temporal stores, fsdp2_shm_reduce_stream). */
void fsdp2_shm_reduce_out(const run_t *x, const coll_op_t *op, char *out,
                          const void *const *src, size_t m);

/* ---- shm_direct.c: single-copy collectives ---- */

/* Whether op is one the ranks try single-copy: the same answer on every rank (it depends
 * on op and on what the group agreed at set-up), so that all of them announce. */
int fsdp2_shm_direct_wanted(const shm_group_t *sg, const coll_op_t *op);
/* Announces this rank's buffers, and when every rank's lie in its arena and every rank
 * mapped the arenas it needs, runs op on them in place (*ran = 1); otherwise the ranks
 * agree to run it through the slots (*ran = 0). */
fsdp2_status_t fsdp2_shm_direct_run(run_t *x, const coll_op_t *op, int *ran);

#endif
