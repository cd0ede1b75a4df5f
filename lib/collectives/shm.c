/* The shared-memory transport: collectives of a group whose members all run on this
 * host, through one POSIX shared-memory segment per group.
 *
 * Each member owns a ring of params.slots slots of params.slot bytes in the segment. A
 * collective is a sequence of steps; in each step a rank copies the bytes its peers need
 * into its next slot and publishes that (its `head` counter), then reads what it needs
 * from its peers' slots for that step and says so (its `done` counter for each writer).
 * A writer reuses a slot once every reader has finished with it, params.slots steps later,
 * so copy-in and copy-out of consecutive steps overlap across ranks, and the slots stay
 * small enough to be read back from cache: that is what Open MPI's vader BTL and NCCL's
 * shm transport do. Counters are monotonic over the group's life (all members run the
 * same steps in the same order), published with release stores and read with acquire
 * loads. A rank that has nothing for a step neither writes nor waits for it.
 *
 * Reductions (shm_reduce.c) read straight from the peers' slots and sum in rank order.
 * How a rank writes its slots and its output (plain or non-temporal stores,
 * shm_stores.c) is its own choice and never changes the steps (fsdp2_shm_slot_copy,
 * fsdp2_shm_out_copy).
 *
 * Collectives of a group run one at a time, in sequence order (a stream thread waits for
 * its collective's turn), so concurrent collectives on different streams never compete
 * for the slots. Waiting spins briefly, then yields the core, then sleeps on a futex in
 * the segment: with more ranks than cores the peer we wait for needs this core. A wait
 * fails on the group's timeout, an abort, a peer whose process is gone, or a peer that
 * marked the segment broken because its own collective failed: nothing hangs. */
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "collectives/shm_run.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/log_internal.h"

/* ---- writing the slots and the output (choices in shm_stores.c) ---- */

/* Copies n bytes into a slot, with non-temporal stores when this collective streams
 * (fsdp2_shm_post fences them before it publishes the step). */
void fsdp2_shm_slot_copy(const run_t *x, char *dst, const char *src, size_t n)
{
    if (x->streaming)
        fsdp2_shm_stream_copy(dst, src, n);
    else
        memcpy(dst, src, n);
}

/* Copies n bytes into the caller's output, streamed when the output is too large to
 * stay in cache (out_streaming; fsdp2_shm_run fences before the collective returns). */
void fsdp2_shm_out_copy(const run_t *x, char *dst, const char *src, size_t n)
{
    if (x->out_streaming)
        fsdp2_shm_stream_copy(dst, src, n);
    else
        memcpy(dst, src, n);
}

static void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ volatile("yield");
#endif
}

static void futex_wait(atomic_uint *word, unsigned value, long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    syscall(SYS_futex, (unsigned *)word, FUTEX_WAIT, value, &ts, NULL, 0);
}

static void wake_sleepers(rank_line_t *line)
{
    if (atomic_load(&line->sleepers) > 0) {
        atomic_fetch_add(&line->bell, 1);
        syscall(SYS_futex, (unsigned *)&line->bell, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
    }
}

/* Counters advance with release stores (post, finish_step), which let this core go on
 * while the peers' copies of the line are taken back; a sequentially consistent store
 * would wait for that. A sleeper already seen is woken at once (advanced); one that may
 * be announcing itself just now is woken here, before this rank waits itself (wait_for)
 * and when its collective ends. Pairs with wait_for: a sleeper announces itself before
 * its last check of the counter, and the fence here comes after the counter's store and
 * before the announcement is read, so one of them sees the other. */
static void pay_wake(run_t *x)
{
    if (!x->owed_wake)
        return;
    x->owed_wake = 0;
    atomic_thread_fence(memory_order_seq_cst);
    wake_sleepers(&x->sg->lines[x->me]);
}

/* One of this rank's counters was just advanced. */
static void advanced(run_t *x)
{
    x->owed_wake = 1;
    if (atomic_load_explicit(&x->sg->lines[x->me].sleepers, memory_order_relaxed) > 0)
        pay_wake(x);
}

static shm_counter_t *head_of(const run_t *x, int r) { return &x->sg->lines[r].head; }

static shm_counter_t *done_of(const run_t *x, int reader, int writer)
{
    return x->sg->done + (size_t)reader * x->sg->row + (size_t)writer;
}

static char *slot_of(const run_t *x, int r, uint64_t step)
{
    const shm_params_t *p = &x->sg->params;
    return x->sg->ring + ((size_t)r * p->slots + (size_t)(step % p->slots)) * p->slot;
}

/* The first rank to mark the segment broken also leaves its reason there. */
static void mark_broken(shm_group_t *sg, int rank, const char *reason)
{
    int expected = 0;
    if (atomic_compare_exchange_strong(&sg->hdr->broken, &expected, rank + 1)) {
        snprintf(sg->hdr->reason, sizeof(sg->hdr->reason), "%s", reason);
        atomic_store_explicit(&sg->hdr->reason_ready, 1, memory_order_release);
    }
    for (int r = 0; r < sg->g->size; r++) {
        atomic_fetch_add(&sg->lines[r].bell, 1);
        syscall(SYS_futex, (unsigned *)&sg->lines[r].bell, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
    }
}

void fsdp2_shm_abort(shm_group_t *sg, const char *reason)
{
    mark_broken(sg, sg->g->rank, reason);
}

/* Why the rank that broke the segment failed: it writes the reason right after marking
 * it, so a short wait finds it unless that rank died in between. */
static void broken_reason(const shm_group_t *sg, char *buf, size_t len)
{
    for (int i = 0; i < 1000; i++) {
        if (atomic_load_explicit(&sg->hdr->reason_ready, memory_order_acquire)) {
            size_t n = strnlen(sg->hdr->reason, sizeof(sg->hdr->reason) - 1);
            n = n < len - 1 ? n : len - 1;
            memcpy(buf, sg->hdr->reason, n);
            buf[n] = '\0';
            return;
        }
        sched_yield();
    }
    snprintf(buf, len, "its reason was not published");
}

/* Fails the group and marks the segment broken, so that peers fail now rather than at
 * their timeout. */
static fsdp2_status_t run_fail(run_t *x, fsdp2_status_t status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static fsdp2_status_t run_fail(run_t *x, fsdp2_status_t status, const char *fmt, ...)
{
    char message[320];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof(message), fmt, ap);
    va_end(ap);
    char reason[512];
    snprintf(reason, sizeof(reason), "group '%s' rank %d: %s", x->sg->g->name, x->me, message);
    mark_broken(x->sg, x->me, reason);
    return fsdp2_group_fail(x->sg->g, status, "%s", message);
}

/* Called while a wait is idle: every reason to stop waiting for peer. */
static fsdp2_status_t check_health(run_t *x, int peer)
{
    fsdp2_group_t *g = x->sg->g;
    int broken = atomic_load(&x->sg->hdr->broken);
    if (broken && broken != x->me + 1) {
        char reason[512];
        broken_reason(x->sg, reason, sizeof(reason));
        return fsdp2_group_fail(g, FSDP2_ERR_PEER_FAILED, "%s: rank %d failed: %s", x->what,
                                broken - 1, reason);
    }
    if (atomic_load(&g->aborted))
        return run_fail(x, FSDP2_ERR_ABORTED, "%s: aborted", x->what);
    if (atomic_load(&g->error) != FSDP2_SUCCESS)
        return fsdp2_group_check(g); /* another collective of the group failed here */
    int64_t now = fsdp2_now_ms();
    if (!x->deadline_ms) /* the first idle wait: the collective's clock starts */
        x->deadline_ms = now + g->timeout_ms;
    if (!x->liveness_ms)
        x->liveness_ms = now + x->sg->liveness_ms;
    if (now >= x->liveness_ms) {
        x->liveness_ms = now + x->sg->liveness_ms;
        if (x->sg->gone(x->sg->gone_arg, peer))
            return run_fail(x, FSDP2_ERR_PEER_FAILED, "%s: peer %d failed (its process is gone)",
                            x->what, peer);
    }
    if (now >= x->deadline_ms)
        return run_fail(x, FSDP2_ERR_TIMEOUT,
                        "%s: rank %d did not arrive within %.1f s (FSDP2_TIMEOUT)", x->what, peer,
                        (double)x->sg->g->timeout_ms / 1e3);
    return FSDP2_SUCCESS;
}

/* With a core per rank, both ranks' threads sometimes end up on one core and stay there
 * (the scheduler does not move threads that keep waking each other: every collective
 * then ran at a tenth of its speed or less). A wait that found its peer last waiting on
 * this core moves itself to a core no rank was seen on, and gives its allowed cores
 * back at once, so the scheduler is free again afterwards. */
static void move_off_peer_core(run_t *x, int peer, int cpu)
{
    if (!x->sg->nudge || atomic_load_explicit(&x->sg->lines[peer].cpu, memory_order_relaxed) !=
                             cpu + 1)
        return;
    cpu_set_t allowed, one;
    if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0)
        return;
    int target = -1;
    for (int c = 0; c < CPU_SETSIZE && target < 0; c++) {
        if (!CPU_ISSET(c, &allowed) || c == cpu)
            continue;
        int seen = 0;
        for (int r = 0; r < x->n; r++)
            seen |= atomic_load_explicit(&x->sg->lines[r].cpu, memory_order_relaxed) == c + 1;
        if (!seen)
            target = c;
    }
    if (target < 0)
        return;
    CPU_ZERO(&one);
    CPU_SET(target, &one);
    if (sched_setaffinity(0, sizeof(one), &one) == 0) {
        atomic_store_explicit(&x->sg->lines[x->me].cpu, target + 1, memory_order_relaxed);
        sched_setaffinity(0, sizeof(allowed), &allowed);
    }
}

/* Waits until *word >= target; peer is the rank that advances it. */
static fsdp2_status_t wait_for(run_t *x, shm_counter_t *word, uint64_t target, int peer)
{
    if (atomic_load_explicit(word, memory_order_acquire) >= target)
        return FSDP2_SUCCESS;
    pay_wake(x); /* a peer asleep on our counters must not wait for us while we wait */
    rank_line_t *line = &x->sg->lines[peer]; /* peer advances word */
    atomic_int *mine = &x->sg->lines[x->me].cpu; /* on our head's line: stored if changed */
    int contended = 0, yields = 0, spinning = x->sg->spin_ns > 0, cpu = -1;
    int64_t start = 0; /* a short wait reads no clock and leaves the cpu hint alone */
    for (int i = 0;; i++) {
        if (atomic_load_explicit(word, memory_order_acquire) >= target)
            return FSDP2_SUCCESS;
        if (spinning) {
            cpu_relax();
            if ((i & 63) != 63)
                continue;
            int64_t now = fsdp2_now_ns();
            if (!start) { /* 64 spins: the spin budget starts, and where we wait is noted */
                start = now;
                cpu = sched_getcpu();
                if (atomic_load_explicit(mine, memory_order_relaxed) != cpu + 1)
                    atomic_store_explicit(mine, cpu + 1, memory_order_relaxed);
            } else if (now - start >= x->sg->spin_ns) {
                spinning = 0;
                move_off_peer_core(x, peer, cpu);
            }
            continue;
        }
        FSDP2_CHECK(check_health(x, peer));
        if (yields++ < x->sg->wait_yields && contended < x->sg->contended_max) {
            int64_t t0 = fsdp2_now_ns();
            sched_yield();
            contended += fsdp2_now_ns() - t0 > x->sg->contended_ns;
            continue;
        }
        atomic_fetch_add(&line->sleepers, 1);
        unsigned bell = atomic_load(&line->bell);
        if (atomic_load(word) < target)
            futex_wait(&line->bell, bell, x->sg->sleep_ms);
        atomic_fetch_sub(&line->sleepers, 1);
    }
}

fsdp2_status_t fsdp2_shm_slot_for_write(run_t *x, uint64_t t, char **slot)
{
    uint64_t slots = x->sg->params.slots;
    for (int k = 1; k < x->n && t >= slots; k++) {
        int p = (x->me + k) % x->n;
        FSDP2_CHECK(wait_for(x, done_of(x, p, x->me), t + 1 - slots, p));
    }
    *slot = slot_of(x, x->me, t);
    return FSDP2_SUCCESS;
}

void fsdp2_shm_post(run_t *x, uint64_t t)
{
    if (x->fence_posts)
        fsdp2_shm_fence_streams(); /* the slot before its head */
    atomic_store_explicit(head_of(x, x->me), t + 1, memory_order_release);
    advanced(x);
    if (++x->posts == x->part_steps) { /* a part try ends with this step */
        x->streaming = !x->streaming;
        x->fence_posts = 1; /* whichever way: streamed lines may follow */
        x->part_posts = x->posts;
    }
}

/* ---- stamps ---- */

static shm_stamp_t *stamp_of(const shm_group_t *sg, int r, uint64_t seq)
{
    return &sg->stamps[(size_t)r * SHM_STAMPS + seq % SHM_STAMPS];
}

/* This rank's collective, before its first step (its head's release publishes it). */
static void stamp_write(shm_group_t *sg, const coll_op_t *op)
{
    shm_stamp_t *s = stamp_of(sg, sg->g->rank, op->seq);
    fsdp2_coll_stamp(op, &s->call);
    atomic_store_explicit(&s->seq1, op->seq + 1, memory_order_release);
    atomic_store_explicit(&sg->lines[sg->g->rank].last_stamp, op->seq + 1, memory_order_release);
}

/* The first time this collective meets rank r (r has posted a step we waited for): r's
 * stamp for this sequence number must be this rank's call. Otherwise both calls are
 * named, the group fails here and is marked broken for every peer. */
static fsdp2_status_t check_stamp(run_t *x, int r)
{
    uint64_t bit = (uint64_t)1 << (r % 64);
    if (!x->op || (x->stamped[r / 64] & bit))
        return FSDP2_SUCCESS;
    x->stamped[r / 64] |= bit;
    const coll_op_t *op = x->op;
    const shm_stamp_t *mine = stamp_of(x->sg, x->me, op->seq);
    const shm_stamp_t *theirs = stamp_of(x->sg, r, op->seq);
    uint64_t seq = op->seq;
    if (atomic_load_explicit(&theirs->seq1, memory_order_acquire) == seq + 1 &&
        fsdp2_coll_stamp_equal(&theirs->call, &mine->call))
        return FSDP2_SUCCESS;
    char a[160], b[160];
    fsdp2_coll_stamp_text(&mine->call, seq, a, sizeof(a));
    uint64_t last = atomic_load_explicit(&x->sg->lines[r].last_stamp, memory_order_acquire);
    if (atomic_load_explicit(&theirs->seq1, memory_order_acquire) == seq + 1)
        fsdp2_coll_stamp_text(&theirs->call, seq, b, sizeof(b));
    else if (last)
        fsdp2_coll_stamp_text(&stamp_of(x->sg, r, last - 1)->call, last - 1, b, sizeof(b));
    else
        snprintf(b, sizeof(b), "no collective yet");
    fsdp2_status_t status = fsdp2_group_fail(
        x->sg->g, FSDP2_ERR_INVALID_STATE,
        "rank %d called %s where rank %d called %s: the ranks of a group must call the "
        "same collectives in the same order",
        r, b, x->me, a);
    char reason[640];
    fsdp2_group_error_text(x->sg->g, reason, sizeof(reason));
    mark_broken(x->sg, x->me, reason);
    return status;
}

fsdp2_status_t fsdp2_shm_slot_for_read(run_t *x, int r, uint64_t t, const char **slot)
{
    FSDP2_CHECK(wait_for(x, head_of(x, r), t + 1, r));
    FSDP2_CHECK(check_stamp(x, r));
    *slot = slot_of(x, r, t);
    return FSDP2_SUCCESS;
}

void fsdp2_shm_finish_step(run_t *x, uint64_t t)
{
    for (int k = 1; k < x->n; k++)
        atomic_store_explicit(done_of(x, x->me, (x->me + k) % x->n), t + 1,
                              memory_order_release);
    advanced(x);
}

/* ---- gathers ---- */

void fsdp2_shm_sink_write(const run_t *x, sink_t *s, size_t off, const char *src, size_t m)
{
    if (s->buf) {
        fsdp2_shm_out_copy(x, s->buf + off, src, m);
        return;
    }
    while (m) { /* pieces are filled in order, so off is always the cursor */
        size_t room = s->piece->bytes - s->at;
        if (!room) {
            s->piece++;
            s->at = 0;
            continue;
        }
        size_t k = min_size(room, m);
        fsdp2_shm_out_copy(x, (char *)s->piece->data + s->at, src, k);
        s->at += k;
        src += k;
        m -= k;
    }
}

/* Rank r's len[r] bytes reach sinks[r] on every other rank; this rank's bytes come from
 * mine, and reach its own sink too when own is set: a slot's worth at a time, right after
 * that piece went into the slot, so it is read from memory once (copying all of it first
 * read a large input twice). */
fsdp2_status_t fsdp2_shm_gather(run_t *x, const char *mine, const size_t *len, sink_t *sinks,
                                int own)
{
    size_t most = 0;
    for (int r = 0; r < x->n; r++)
        most = len[r] > most ? len[r] : most;
    size_t slot_bytes = x->sg->params.slot;
    for (size_t off = 0; off < most; off += slot_bytes) {
        uint64_t t = x->next++;
        if (off < len[x->me]) {
            char *slot;
            FSDP2_CHECK(fsdp2_shm_slot_for_write(x, t, &slot));
            size_t m = min_size(slot_bytes, len[x->me] - off);
            fsdp2_shm_slot_copy(x, slot, mine + off, m);
            fsdp2_shm_post(x, t);
            if (own) /* from mine, still in cache (the slot may have been streamed) */
                fsdp2_shm_sink_write(x, &sinks[x->me], off, mine + off, m);
        }
        /* Copy out whichever peers have posted, blocking only when none has: with more
         * ranks than cores they arrive in any order. */
        int pending[FSDP2_SHM_MAX_RANKS], np = 0;
        for (int k = 1; k < x->n; k++)
            if (off < len[(x->me + k) % x->n])
                pending[np++] = (x->me + k) % x->n;
        while (np > 0) {
            int ready = -1;
            for (int i = 0; i < np && ready < 0; i++)
                if (atomic_load_explicit(head_of(x, pending[i]), memory_order_acquire) > t)
                    ready = i;
            if (ready < 0) {
                FSDP2_CHECK(wait_for(x, head_of(x, pending[0]), t + 1, pending[0]));
                ready = 0;
            }
            int r = pending[ready];
            FSDP2_CHECK(check_stamp(x, r));
            pending[ready] = pending[--np];
            fsdp2_shm_sink_write(x, &sinks[r], off, slot_of(x, r, t),
                                 min_size(slot_bytes, len[r] - off));
        }
        fsdp2_shm_finish_step(x, t);
    }
    return FSDP2_SUCCESS;
}

static fsdp2_status_t run_all_gather(run_t *x, const coll_op_t *op)
{
    size_t bytes = op->count * op->elem_size, len[FSDP2_SHM_MAX_RANKS];
    sink_t sinks[FSDP2_SHM_MAX_RANKS];
    char *recv = op->recv;
    for (int r = 0; r < x->n; r++) {
        len[r] = bytes;
        sinks[r] = (sink_t){.buf = recv + (size_t)r * bytes};
    }
    char *mine = recv + (size_t)x->me * bytes;
    return fsdp2_shm_gather(x, op->send, len, sinks, mine != (const char *)op->send);
}

int fsdp2_shm_pieces_own(const coll_op_t *op, int me)
{
    /* This rank's pieces are each in place or apart from the input (group.c checks). */
    const char *src = op->send;
    int in_place = 0;
    for (size_t k = op->offsets[me]; k < op->offsets[me + 1]; k++) {
        in_place |= op->pieces[k].bytes && op->pieces[k].data == src;
        src += op->pieces[k].bytes;
    }
    src = op->send;
    for (size_t k = op->offsets[me]; in_place && k < op->offsets[me + 1]; k++) {
        if (op->pieces[k].bytes && op->pieces[k].data != src)
            memcpy(op->pieces[k].data, src, op->pieces[k].bytes);
        src += op->pieces[k].bytes;
    }
    return !in_place;
}

static fsdp2_status_t run_all_gather_pieces(run_t *x, const coll_op_t *op)
{
    size_t len[FSDP2_SHM_MAX_RANKS];
    sink_t sinks[FSDP2_SHM_MAX_RANKS];
    for (int r = 0; r < x->n; r++) {
        len[r] = op->count;
        sinks[r] = (sink_t){.piece = op->pieces + op->offsets[r]};
    }
    return fsdp2_shm_gather(x, op->send, len, sinks, fsdp2_shm_pieces_own(op, x->me));
}

static fsdp2_status_t run_broadcast(run_t *x, const coll_op_t *op)
{
    size_t len[FSDP2_SHM_MAX_RANKS] = {0};
    sink_t sinks[FSDP2_SHM_MAX_RANKS] = {{0}};
    len[op->root] = op->count * op->elem_size;
    sinks[op->root].buf = op->recv;
    return fsdp2_shm_gather(x, op->send, len, sinks, 0);
}

fsdp2_status_t fsdp2_shm_sync_step(run_t *x)
{
    uint64_t t = x->next++;
    atomic_store_explicit(head_of(x, x->me), t + 1, memory_order_release);
    advanced(x);
    for (int k = 1; k < x->n; k++) {
        int r = (x->me + k) % x->n;
        FSDP2_CHECK(wait_for(x, head_of(x, r), t + 1, r));
        FSDP2_CHECK(check_stamp(x, r));
    }
    fsdp2_shm_finish_step(x, t);
    return FSDP2_SUCCESS;
}

/* ---- turns ---- */

/* Waits until the group's collectives before op's have finished here; *deadline_ms (0:
 * not started) starts the collective's clock if it has to wait. */
static fsdp2_status_t wait_turn(shm_group_t *sg, const coll_op_t *op, int64_t *deadline_ms,
                                const char *what)
{
    fsdp2_status_t status = FSDP2_SUCCESS;
    pthread_mutex_lock(&sg->lock);
    while (sg->turn != op->seq && status == FSDP2_SUCCESS) {
        status = fsdp2_group_check(sg->g);
        if (status != FSDP2_SUCCESS)
            break;
        int64_t now = fsdp2_now_ms();
        if (!*deadline_ms)
            *deadline_ms = now + sg->g->timeout_ms;
        if (now >= *deadline_ms) {
            pthread_mutex_unlock(&sg->lock);
            return fsdp2_group_fail(sg->g, FSDP2_ERR_TIMEOUT,
                                    "%s: the group's collective %llu (before this one) did not "
                                    "finish within %.1f s (FSDP2_TIMEOUT)",
                                    what, (unsigned long long)sg->turn,
                                    (double)sg->g->timeout_ms / 1e3);
        }
        /* wakes to see group failures */
        struct timespec ts = fsdp2_time_after(CLOCK_MONOTONIC, 10 * 1000000L);
        pthread_cond_timedwait(&sg->turn_changed, &sg->lock, &ts);
    }
    pthread_mutex_unlock(&sg->lock);
    return status;
}

static fsdp2_status_t run_through_slots(run_t *x, const coll_op_t *op)
{
    switch (op->kind) {
    case COLL_ALL_GATHER: return run_all_gather(x, op);
    case COLL_ALL_GATHER_PIECES: return run_all_gather_pieces(x, op);
    case COLL_REDUCE_SCATTER: return fsdp2_shm_run_reduce_scatter(x, op);
    case COLL_ALL_REDUCE: return fsdp2_shm_run_all_reduce(x, op);
    case COLL_BROADCAST: return run_broadcast(x, op);
    case COLL_BARRIER: return fsdp2_shm_sync_step(x);
    }
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_shm_run(shm_group_t *sg, const coll_op_t *op)
{
    fsdp2_group_t *g = sg->g;
    const char *what = fsdp2_coll_kind_name(op->kind);
    int64_t deadline = 0; /* started by the first wait that goes idle (few collectives) */
    fsdp2_status_t status = wait_turn(sg, op, &deadline, what);
    if (status == FSDP2_SUCCESS)
        status = fsdp2_group_check(g);
    if (status != FSDP2_SUCCESS) {
        /* The group has failed here, so this rank will not take part: the peers must
         * not wait for it until their timeout. */
        char reason[640];
        fsdp2_group_error_text(g, reason, sizeof(reason));
        mark_broken(sg, g->rank, reason);
        return status;
    }
    stamp_write(sg, op);
    run_t x = {.sg = sg, .what = what, .me = g->rank, .n = g->size, .next = sg->steps,
               .deadline_ms = deadline, .op = op};
    x.streaming = x.fence_posts = fsdp2_shm_stores_choose(sg, op, &x.part_steps);
    int first_way = x.streaming;
    x.out_streaming = fsdp2_shm_out_streams(sg, op);
    int timed = fsdp2_shm_stores_timed(sg, op);
    int direct = 0;
    if (fsdp2_shm_direct_wanted(sg, op))
        status = fsdp2_shm_direct_run(&x, op, &direct);
    int64_t start = timed ? fsdp2_now_ns() : 0; /* the slots' part alone */
    if (status == FSDP2_SUCCESS && !direct)
        status = run_through_slots(&x, op);
    pay_wake(&x);
    if (x.out_streaming)
        fsdp2_shm_fence_streams(); /* the output, before anyone reads it */
    /* A rank that posted nothing (a broadcast's readers) wrote no slot either way. */
    if (status == FSDP2_SUCCESS && timed && x.posts > 0 && !direct) {
        double share = x.part_posts ? (double)x.part_posts / (double)x.posts : 1;
        fsdp2_shm_stores_learn(sg, op, first_way, share, x.posts, fsdp2_now_ns() - start);
    }
    pthread_mutex_lock(&sg->lock);
    sg->steps = x.next;
    sg->turn++;
    pthread_cond_broadcast(&sg->turn_changed);
    pthread_mutex_unlock(&sg->lock);
    return status;
}
