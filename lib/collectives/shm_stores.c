/* How the shared-memory transport writes bytes: into its slots, and into a
 * collective's output. Plain stores (memcpy) or non-temporal ones, which go past the
 * writer's caches to memory; the choices only, the protocol is in shm.c.
 *
 * Slots. A slot's bytes are written by one rank and read by the others. Written with
 * plain stores they are still in the writer's cache, modified, when a reader asks for
 * them: the fast case when writer and readers share a cache that holds the slots in
 * flight, since the reader then gets each line from there. Where they share none, every
 * line crosses between caches one at a time; where the slots do not fit, the lines are
 * written back to memory anyway, after a read of each (read for ownership). Non-temporal
 * stores send the bytes to memory, which any reader fetches at memory speed.
 * FSDP2_SHM_STREAM_STORES (resolved per group at creation, fsdp2_shm_stores_resolve):
 * - topology: fsdp2_shm_stores_rule, from the smallest cache all the members' CPUs
 *   share (hwloc) and the bytes of slots a collective fills;
 * - learn: where the topology may be wrong (virtual CPUs that the host moves between
 *   physical caches unseen), each rank times its collectives per kind and size class,
 *   tries the other way on its third run (SHM_STREAM_FIRST_TRY counts from 0) and then
 *   every SHM_STREAM_EXPLORE runs, and keeps the cheaper. A try of a way found far
 *   costlier costs several runs' time, so the wait after it grows (next_wait) and it
 *   writes only the first 1/SHM_STREAM_PART of the steps the other way (a part try;
 *   fsdp2_shm_post changes the way after them). Figures in docs/collectives.md.
 * Only the writer's stores change, never the steps, so ranks may choose differently.
 *
 * Outputs. A gather writes output lines it never read, and a plain store first reads
 * each from memory (read for ownership): past the cache that is a third of the traffic.
 * A reduce-scatter's results are the same (fsdp2_shm_reduce_stream).
 * FSDP2_SHM_STREAM_OUTPUT=auto streams the outputs too large to stay cached. */
#include <string.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "collectives/group_internal.h"
#include "collectives/shm_internal.h"
#include "core/log_internal.h"

#define SHM_STREAM_FIRST_TRY 2      /* learn: the run (from 0) that first tries the other way */
#define SHM_STREAM_EXPLORE 8        /* learn: then runs between tries */
/* While the other way costs more, the wait starts at 2 * SHM_STREAM_EXPLORE and doubles
 * with each try up to SHM_STREAM_EXPLORE_MILD_MAX runs; while it costs more than
 * SHM_STREAM_FAR times as much (with SHM_STREAM_FAR_SAMPLES counted runs of each way),
 * from SHM_STREAM_EXPLORE_FAR up to SHM_STREAM_EXPLORE_FAR_MAX; either way no longer
 * than about SHM_STREAM_WAIT_NS of runs of the way in use (next_wait). */
#define SHM_STREAM_EXPLORE_MILD_MAX 64
#define SHM_STREAM_EXPLORE_FAR 32
#define SHM_STREAM_EXPLORE_FAR_MAX 256
#define SHM_STREAM_WAIT_NS 1e9
#define SHM_STREAM_FAR_SAMPLES 2
#define SHM_STREAM_FAR 2.0
#define SHM_STREAM_PART 8           /* a try of a way found far costlier takes 1/8 of the run */
#define SHM_STREAM_SWITCH 0.9       /* learn: switch when the other way costs this much or less */
#define SHM_STREAM_COPY_MIN 256     /* copies shorter than this use memcpy even when streaming */

void fsdp2_shm_stream_copy(char *dst, const char *src, size_t n)
{
#if defined(__SSE2__)
    if (n >= SHM_STREAM_COPY_MIN) {
        size_t head = (size_t)(-(uintptr_t)dst & 15);
        memcpy(dst, src, head);
        dst += head, src += head, n -= head;
        for (; n >= 64; n -= 64, dst += 64, src += 64) {
            __m128i a = _mm_loadu_si128((const __m128i *)src);
            __m128i b = _mm_loadu_si128((const __m128i *)(src + 16));
            __m128i c = _mm_loadu_si128((const __m128i *)(src + 32));
            __m128i d = _mm_loadu_si128((const __m128i *)(src + 48));
            _mm_stream_si128((__m128i *)dst, a);
            _mm_stream_si128((__m128i *)(dst + 16), b);
            _mm_stream_si128((__m128i *)(dst + 32), c);
            _mm_stream_si128((__m128i *)(dst + 48), d);
        }
    }
#endif
    memcpy(dst, src, n);
}

void fsdp2_shm_fence_streams(void)
{
#if defined(__SSE2__)
    _mm_sfence(); /* non-temporal stores are weakly ordered */
#endif
}

/* Reductions stream straight from the registers, 16 bytes at a time: no block on the
 * stack to stream afterwards, so each output line is written once; the work is bound by
 * memory, so wider vectors would not help. bf16 and f16 (converted to f32 and back) go a
 * block at a time. The arithmetic is fsdp2_reduce_rank_order's, lane by lane: each x / pre, summed
 * in rank order, / post, rounded once. */
#define SHM_REDUCE_STREAM_BLOCK (1u << 10) /* bytes: small enough to stay in L1 */

#if defined(__SSE2__)
/* count: a multiple of 4 (whole lines). Divides as fsdp2_reduce_rank_order decides, from
 * the factors as doubles. */
static void reduce_stream_f32(float *dst, const void *const *src, int n, size_t count,
                              float pre, float post, int divide_pre, int divide_post)
{
    __m128 vpre = _mm_set1_ps(pre), vpost = _mm_set1_ps(post);
    for (size_t i = 0; i < count; i += 4) {
        __m128 acc = _mm_loadu_ps((const float *)src[0] + i);
        if (divide_pre)
            acc = _mm_div_ps(acc, vpre);
        for (int r = 1; r < n; r++) {
            __m128 v = _mm_loadu_ps((const float *)src[r] + i);
            acc = _mm_add_ps(acc, divide_pre ? _mm_div_ps(v, vpre) : v);
        }
        _mm_stream_ps(dst + i, divide_post ? _mm_div_ps(acc, vpost) : acc);
    }
}

/* count: a multiple of 2 (whole lines). */
static void reduce_stream_f64(double *dst, const void *const *src, int n, size_t count,
                              double pre, double post)
{
    __m128d vpre = _mm_set1_pd(pre), vpost = _mm_set1_pd(post);
    int divide_pre = pre != 1.0, divide_post = post != 1.0;
    for (size_t i = 0; i < count; i += 2) {
        __m128d acc = _mm_loadu_pd((const double *)src[0] + i);
        if (divide_pre)
            acc = _mm_div_pd(acc, vpre);
        for (int r = 1; r < n; r++) {
            __m128d v = _mm_loadu_pd((const double *)src[r] + i);
            acc = _mm_add_pd(acc, divide_pre ? _mm_div_pd(v, vpre) : v);
        }
        _mm_stream_pd(dst + i, divide_post ? _mm_div_pd(acc, vpost) : acc);
    }
}
#endif

/* Sources advanced by `skip` elements of es bytes. */
static void advance(const void **to, const void *const *from, int n, size_t skip, size_t es)
{
    for (int r = 0; r < n; r++)
        to[r] = (const char *)from[r] + skip * es;
}

void fsdp2_shm_reduce_stream(char *dst, fsdp2_dtype_t dtype, size_t es,
                             const void *const *src, int n, size_t count, double pre,
                             double post)
{
    /* elements before dst's first whole line, and whole lines after them */
    size_t head = ((size_t)(-(uintptr_t)dst) & (SHM_LINE - 1)) / es;
    if ((uintptr_t)dst % es || head >= count) {
        fsdp2_reduce_rank_order(dst, dtype, src, n, count, pre, post);
        return;
    }
    size_t body = (count - head) / (SHM_LINE / es) * (SHM_LINE / es);
    const void *at[FSDP2_SHM_MAX_RANKS];
    char *out = dst + head * es;
    fsdp2_reduce_rank_order(dst, dtype, src, n, head, pre, post);
    advance(at, src, n, head, es);
#if defined(__SSE2__)
    if (dtype == FSDP2_F32) {
        reduce_stream_f32((float *)out, at, n, body, (float)pre, (float)post, pre != 1.0,
                          post != 1.0);
    } else if (dtype == FSDP2_F64) {
        reduce_stream_f64((double *)out, at, n, body, pre, post);
    } else
#endif
    {
        _Alignas(SHM_LINE) char block[SHM_REDUCE_STREAM_BLOCK];
        const void *part[FSDP2_SHM_MAX_RANKS];
        for (size_t done = 0, per = sizeof(block) / es; done < body; done += per) {
            size_t k = per < body - done ? per : body - done;
            advance(part, at, n, done, es);
            fsdp2_reduce_rank_order(block, dtype, part, n, k, pre, post);
            fsdp2_shm_stream_copy(out + done * es, block, k * es);
        }
    }
    advance(at, at, n, body, es);
    fsdp2_reduce_rank_order(out + body * es, dtype, at, n, count - head - body, pre, post);
}

/* op's size class (x4 each from sg->stream_min), or -1: always memcpy. */
static int store_class(const shm_group_t *sg, const coll_op_t *op)
{
#if !defined(__SSE2__)
    (void)sg, (void)op;
    return -1; /* no non-temporal stores to use */
#endif
    size_t bytes = op->count * op->elem_size;
    if (op->kind == COLL_BARRIER || bytes < sg->stream_min ||
        (op->kind == COLL_ALL_REDUCE && shm_all_reduce_one_step(&sg->params, sg->g->size, bytes)))
        return -1; /* one step: memcpy */
    int c = 0;
    for (bytes /= sg->stream_min; bytes >= 4 && c < SHM_STORE_CLASSES - 1; bytes /= 4)
        c++;
    return c;
}

/* op's row of sg->stores: its kind, except in place. An in-place reduce-scatter's
 * results are not streamed, and an in-place all-gather copies no own block to its
 * output, so their costs per byte differ from the out-of-place ones' and would mislead
 * their choice, and back. */
static int store_row(const shm_group_t *sg, const coll_op_t *op)
{
    size_t bytes = op->count * op->elem_size;
    int rank = sg->g->rank;
    if (op->kind == COLL_REDUCE_SCATTER && coll_in_place_block(op->send, op->recv, bytes, rank))
        return SHM_ROW_IN_PLACE_RS;
    if (op->kind == COLL_ALL_GATHER && coll_in_place_block(op->recv, op->send, bytes, rank))
        return SHM_ROW_IN_PLACE_AG;
    return (int)op->kind;
}

/* Whether the way not in use costs more than twice the way in use. It needs more than
 * one run of each way: a single late peer in either figure would otherwise hold a class
 * in the wrong way for the longer waits. */
static int far_from_other(const shm_store_class_t *k)
{
    return k->counted[0] >= SHM_STREAM_FAR_SAMPLES && k->counted[1] >= SHM_STREAM_FAR_SAMPLES &&
           k->ns_per_byte[!k->streaming] > SHM_STREAM_FAR * k->ns_per_byte[k->streaming];
}

/* Whether the way not in use costs more than the way in use (by its last figure). */
static int other_costlier(const shm_store_class_t *k)
{
    return k->ns_per_byte[!k->streaming] > k->ns_per_byte[k->streaming];
}

/* The wait after a try that did not switch, longer after each while the other way stays
 * costlier: far costlier, SHM_STREAM_EXPLORE_FAR runs after the first such try, twice
 * the last wait after each next one, up to SHM_STREAM_EXPLORE_FAR_MAX runs; costlier,
 * from 2 * SHM_STREAM_EXPLORE up to SHM_STREAM_EXPLORE_MILD_MAX; either to no more runs
 * of the way in use than take SHM_STREAM_WAIT_NS (but the first wait at least); 0 (the
 * usual SHM_STREAM_EXPLORE) when the other way is no costlier.
 *
 * A try of a costlier way costs what it costs more, on every try, for as long as the
 * other way stays costlier; hence the growing waits. A long wait costs when the other
 * way has become the cheaper without the way in use getting dearer (the vCPUs moved
 * close again while streaming); the time cap bounds that to about a second for large
 * collectives. */
static uint32_t next_wait(const shm_store_class_t *k, const coll_op_t *op)
{
    uint32_t first, max;
    if (far_from_other(k))
        first = SHM_STREAM_EXPLORE_FAR, max = SHM_STREAM_EXPLORE_FAR_MAX;
    else if (other_costlier(k))
        first = 2 * SHM_STREAM_EXPLORE, max = SHM_STREAM_EXPLORE_MILD_MAX;
    else
        return 0;
    uint32_t wait = k->wait ? 2 * k->wait : first;
    double run_ns = k->ns_per_byte[k->streaming] * (double)(op->count * op->elem_size);
    double most = run_ns > 0 ? SHM_STREAM_WAIT_NS / run_ns : max;
    if (most > max)
        most = max;
    if (most < first)
        most = first;
    return wait < most ? wait : (uint32_t)most;
}

int fsdp2_shm_stores_rule(size_t shared_cache, int n, size_t bytes, size_t ring)
{
    size_t filled = (size_t)n * (bytes < ring ? bytes : ring);
    return shared_cache == 0 || filled > shared_cache / 2;
}

shm_stores_t fsdp2_shm_stores_resolve(shm_stores_t policy, int virtual_host, int cache_known)
{
    if (policy != SHM_STORES_AUTO)
        return policy == SHM_STORES_TOPOLOGY && !cache_known ? SHM_STORES_LEARN : policy;
    return virtual_host || !cache_known ? SHM_STORES_LEARN : SHM_STORES_TOPOLOGY;
}

int fsdp2_shm_stores_choose(shm_group_t *sg, const coll_op_t *op, uint64_t *part_steps)
{
    *part_steps = 0;
    int c = store_class(sg, op);
    if (c < 0 || sg->stores_policy == SHM_STORES_PLAIN)
        return 0;
    if (sg->stores_policy == SHM_STORES_STREAM)
        return 1;
    if (sg->stores_policy == SHM_STORES_TOPOLOGY)
        return fsdp2_shm_stores_rule(sg->shared_cache, sg->g->size, op->count * op->elem_size,
                                     sg->params.slots * sg->params.slot);
    const shm_store_class_t *k = &sg->stores[store_row(sg, op)][c];
    /* A long wait holds while the other way still looks far costlier, a shorter one
     * while it looks costlier: should the way in use get dearer in the meantime, the
     * next try comes that many (or SHM_STREAM_EXPLORE) runs after the last, at once if
     * those have passed. */
    uint64_t every = SHM_STREAM_EXPLORE;
    if (k->wait && far_from_other(k))
        every = k->wait;
    else if (k->wait && other_costlier(k))
        every = k->wait < SHM_STREAM_EXPLORE_MILD_MAX ? k->wait : SHM_STREAM_EXPLORE_MILD_MAX;
    /* The first try comes early (after one counted run of the way in use): a large
     * collective in the wrong way costs several times the right one. */
    if (!(k->runs == SHM_STREAM_FIRST_TRY || k->try_whole || k->runs - k->last_try >= every))
        return k->streaming;
    /* The last figure of the other way is far costlier: try it on part of the run only.
     * Such a try cost 2-5 runs' time when whole; a part try tells whether the other way
     * is still far costlier, and one that finds it not has the next run try it whole. */
    const double *avg = k->ns_per_byte;
    if (!k->try_whole && avg[k->streaming] > 0 &&
        avg[!k->streaming] > SHM_STREAM_FAR * avg[k->streaming]) {
        uint32_t part = k->last_run_steps / SHM_STREAM_PART;
        *part_steps = part ? part : 1;
    }
    return !k->streaming;
}

/* Whether op's run is timed for fsdp2_shm_stores_learn. */
int fsdp2_shm_stores_timed(const shm_group_t *sg, const coll_op_t *op)
{
    return sg->stores_policy == SHM_STORES_LEARN && store_class(sg, op) >= 0;
}

/* A part try: the other way's cost per byte, as if it had taken the whole run, from
 * what the run cost beyond the way in use's figure for the rest. Far costlier still, it
 * may lower that way's figure and the long waits go on; else the next run tries it
 * whole (a figure from a part of a run is too rough to switch on).
 *
 * It never raises the figure. When the way in use has just become dearer, its own
 * figure lags behind, and the estimate comes out too high by the lag divided by the
 * part's share of the run's steps (about 1/8, but the steps of the class's last run may
 * differ from this one's up to 4x). Kept, the lower old figure lets the switch come as
 * soon as the way in use's rising figure passes it; raised, it could hold the class in
 * the dearer way for a whole long wait. */
static void learn_part(shm_store_class_t *k, const coll_op_t *op, uint64_t run, double share,
                       double cost)
{
    double *avg = k->ns_per_byte;
    double other = (cost - (1 - share) * avg[k->streaming]) / share;
    k->last_try = run;
    if (other > SHM_STREAM_FAR * avg[k->streaming]) {
        if (other < avg[!k->streaming])
            avg[!k->streaming] = other;
        k->counted[!k->streaming]++;
        k->wait = next_wait(k, op);
    } else {
        k->try_whole = 1;
        k->wait = 0;
    }
}

/* The first run of a class is not counted (it pays for first use), and a whole try of
 * the other way stands alone, since it is seldom tried and an old figure says little
 * about where the CPUs are now (a part try only lowers the figure, learn_part). A
 * run's time includes waiting for late peers, so a choice can be wrong for a while; it
 * costs speed only (the steps are the same either way), and the other way is tried
 * again SHM_STREAM_EXPLORE (or next_wait's) runs later. */
void fsdp2_shm_stores_learn(shm_group_t *sg, const coll_op_t *op, int first_way, double share,
                            uint64_t steps, int64_t ns)
{
    int c = store_class(sg, op);
    if (c < 0 || sg->stores_policy != SHM_STORES_LEARN)
        return;
    shm_store_class_t *k = &sg->stores[store_row(sg, op)][c];
    uint64_t run = k->runs++;
    k->last_run_steps = steps < UINT32_MAX ? (uint32_t)steps : UINT32_MAX;
    if (run == 0)
        return;
    double cost = (double)ns / (double)(op->count * op->elem_size);
    if (share < 1 && first_way != k->streaming) {
        learn_part(k, op, run, share, cost);
        return;
    }
    int streamed = first_way; /* the whole run */
    double *avg = k->ns_per_byte;
    k->try_whole = 0;
    avg[streamed] = avg[streamed] > 0 && streamed == k->streaming
                        ? 0.75 * avg[streamed] + 0.25 * cost
                        : cost;
    k->counted[streamed]++;
    if (streamed != k->streaming) { /* a try: wait longer after each that found it dearer */
        k->last_try = run;
        k->wait = next_wait(k, op);
    }
    if (avg[0] > 0 && avg[1] > 0 && avg[!k->streaming] <= SHM_STREAM_SWITCH * avg[k->streaming]) {
        /* The way left behind was measured as the cheaper: no long wait before trying
         * it again, whatever its figure now says (one late run can switch). */
        k->streaming = !k->streaming;
        k->wait = 0;
        FSDP2_LOG(DEBUG, COLL, "group '%s': %s of %zu bytes now %s (%.3f against %.3f ns/byte)",
                  sg->g->name, fsdp2_coll_kind_name(op->kind), op->count * op->elem_size,
                  k->streaming ? "streams its slot stores" : "uses memcpy",
                  avg[k->streaming], avg[!k->streaming]);
    }
}

/* A gather writes output lines it never read, and past the cache a plain store first
 * reads each line from memory (read for ownership): outputs of at least
 * FSDP2_SHM_STREAM_OUTPUT_MIN bytes, too large to stay cached between calls, go out
 * with non-temporal stores, and so do out-of-place reduce-scatter results
 * (fsdp2_shm_reduce_stream). An all-reduce writes over lines it read moments before,
 * and an in-place reduce-scatter over lines still cached: auto never streams those.
 * The figures behind the rule: docs/collectives.md. */
int fsdp2_shm_out_streams(const shm_group_t *sg, const coll_op_t *op)
{
#if defined(__SSE2__)
    size_t bytes = op->count * op->elem_size;
    if (sg->output_policy != SHM_STORES_AUTO)
        return sg->output_policy == SHM_STORES_STREAM;
    switch (op->kind) {
    case COLL_ALL_GATHER:
    case COLL_ALL_GATHER_PIECES: return bytes * (size_t)sg->g->size >= sg->out_stream_min;
    case COLL_BROADCAST: return bytes >= sg->out_stream_min;
    case COLL_REDUCE_SCATTER:
        return bytes >= sg->out_stream_min &&
               !coll_in_place_block(op->send, op->recv, bytes, sg->g->rank);
    case COLL_ALL_REDUCE: return 0; /* over lines it just read */
    default: return 0;
    }
#else
    (void)sg, (void)op;
    return 0; /* no non-temporal stores to use */
#endif
}
