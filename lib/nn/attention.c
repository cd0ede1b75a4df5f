/* Causal self-attention, one (sample, query head) at a time and, within it, in blocks of
 * ATT_ROWS query rows: rows [r0, r1) see keys [0, r1) only, so the GEMMs skip the masked
 * part above the diagonal (about half of them for long sequences). Per block: scores by
 * one sgemm into the saved probabilities, a masked softmax per row, one sgemm for the
 * output. The backward recomputes nothing: it reads the saved probabilities and needs one
 * [seq, seq] scratch for their gradient.
 *
 * One core serves both layouts: GPT-2's fused qkv (q, k and v are column ranges of one
 * [seq, 3 dim] row) and Llama's separate q, k, v with grouped key/value heads. A layout is
 * where each of q, k, v, y starts and its row stride; query head h reads key/value head
 * h / group.
 *
 * Under bf16 compute (nn_compute_bf16_wanted) the same blocks run with bf16 GEMM operands:
 * copies of the operands rounded to bf16 in a per-thread staging (below); the scores, the
 * softmax and every gradient stay f32. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>

#include "core/fault.h"
#include "gemm.h"
#include "nn_common.h"

/* Query rows per block: small enough that the skipped triangle is most of the masked
 * part, large enough that each GEMM still has ATT_ROWS rows. */
#define ATT_ROWS 64

/* Where the operands of one sample live (pointers at head 0, row 0; strides in floats). */
typedef struct att_layout {
    int64_t batch, seq, heads, group, hd;
    int64_t ldq, ldk, ldy; /* row strides of q, of k and v, of y */
    int ops16;             /* the GEMMs take bf16 operands */
} att_layout_t;

/* Threads with a scratch of their own in the backward, at most. */
#define ATT_MAX_SLOTS 256

/* One backward thread's scratch: the gradient of one block of probabilities. */
static size_t slot_bytes(int64_t seq)
{
    return nn_region_bytes((seq < ATT_ROWS ? seq : ATT_ROWS) * seq);
}

fsdp2_status_t fsdp2_nn_attention_workspace_bytes(int64_t seq, size_t *bytes)
{
    FSDP2_ARG_CHECK(bytes, "bytes is NULL");
    FSDP2_CHECK(nn_check_dim(seq, "seq"));
    FSDP2_ARG_CHECK(seq <= 46340, "seq = %lld: seq * seq overflows a BLAS int", (long long)seq);
    int slots = nn_threads();
    *bytes = slot_bytes(seq) * (size_t)(slots < ATT_MAX_SLOTS ? slots : ATT_MAX_SLOTS);
    return FSDP2_SUCCESS;
}

/* ---- bf16 staging ----
 * One thread's bf16 copies for one (sample, head) or (sample, key/value head): k and v of
 * the head [seq, hd], and per block of rows, q's and dy's rows [rows, hd] and the
 * probabilities' and their gradient's [rows, seq] (the forward uses k, v, q and the
 * probabilities). The forward takes no workspace and the workspace query knows seq only
 * (its answer does not depend on dtypes), so the staging is each thread's own: allocated
 * (fsdp2_malloc) by every thread of the team on the first bf16 attention call, or by a
 * prepare call (team_staging), kept for the thread's life, allocated again only for a
 * larger shape; every byte allocated is counted. */
typedef struct att_staging {
    int64_t elems;
    uint16_t data[];
} att_staging_t;

static pthread_once_t staging_once = PTHREAD_ONCE_INIT;
static pthread_key_t staging_key;
static int staging_key_ok;
static int64_t staging_allocated; /* bytes, ever */

static void staging_init(void)
{
    staging_key_ok = pthread_key_create(&staging_key, free) == 0;
}

int64_t nn_attention_staging_bytes(int64_t seq, int64_t hd)
{
    int64_t rows = seq < ATT_ROWS ? seq : ATT_ROWS;
    return (int64_t)sizeof(uint16_t) * 2 * (seq * hd + rows * (hd + seq));
}

int64_t nn_attention_staging_allocated(void)
{
    return __atomic_load_n(&staging_allocated, __ATOMIC_RELAXED);
}

/* This thread's staging, of at least the bytes of (seq, hd). */
static fsdp2_status_t staging(int64_t seq, int64_t hd, uint16_t **out)
{
    pthread_once(&staging_once, staging_init);
    if (!staging_key_ok)
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "no thread key for attention's bf16 staging");
    int64_t bytes = nn_attention_staging_bytes(seq, hd);
    att_staging_t *s = pthread_getspecific(staging_key);
    if (!s || s->elems * (int64_t)sizeof(uint16_t) < bytes) {
        att_staging_t *grown = fsdp2_malloc(sizeof(*grown) + (size_t)bytes);
        if (!grown || pthread_setspecific(staging_key, grown) != 0) {
            free(grown);
            return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY,
                               "no room for attention's %lld bytes of bf16 staging (seq %lld, "
                               "head_dim %lld)", (long long)bytes, (long long)seq, (long long)hd);
        }
        free(s);
        grown->elems = bytes / (int64_t)sizeof(uint16_t);
        __atomic_add_fetch(&staging_allocated, bytes, __ATOMIC_RELAXED);
        s = grown;
    }
    *out = s->data;
    return FSDP2_SUCCESS;
}

/* rows x cols of a row-major f32 matrix (leading dimension ld) from (r0, c0), rounded to
 * bf16 into dst, dense [rows, cols]. */
static void to_bf16(uint16_t *dst, const float *src, int64_t ld, int64_t r0, int64_t c0,
                    int64_t rows, int64_t cols)
{
    nn_convert_block(dst, FSDP2_BF16, src, FSDP2_F32, ld, r0, c0, rows, cols);
}

/* Rows [r0, r1) of p (ld seq) hold scores for keys [0, r1): keep key j <= row i, softmax
 * them, zero the rest of the row. */
static void causal_softmax(float *p, int64_t seq, int64_t r0, int64_t r1)
{
    if (nn_gemm_preparing())
        return;
    for (int64_t i = r0; i < r1; i++) {
        float *row = p + i * seq, max = row[0];
        for (int64_t j = 1; j <= i; j++)
            max = row[j] > max ? row[j] : max;
        float sum = 0;
        for (int64_t j = 0; j <= i; j++) {
            row[j] = nn_expf(row[j] - max);
            sum += row[j];
        }
        float inv = 1.0f / sum;
        for (int64_t j = 0; j <= i; j++)
            row[j] *= inv;
        for (int64_t j = i + 1; j < seq; j++)
            row[j] = 0.0f;
    }
}

/* The forward's bf16 copies in one thread's staging. */
typedef struct fwd_stage {
    uint16_t *k, *v, *q, *p; /* [seq, hd], [seq, hd], [rows, hd], [rows, seq] */
} fwd_stage_t;

/* k and v of key/value head kvh of sample b rounded into the staging. */
static fsdp2_status_t stage_kv(const att_layout_t *l, int64_t b, int64_t kvh, const float *k,
                               const float *v, uint16_t **k16, uint16_t **v16, uint16_t **rest)
{
    int64_t seq = l->seq, hd = l->hd;
    FSDP2_CHECK(staging(seq, hd, k16));
    *v16 = *k16 + seq * hd;
    *rest = *v16 + seq * hd;
    to_bf16(*k16, k, l->ldk, b * seq, kvh * hd, seq, hd);
    to_bf16(*v16, v, l->ldk, b * seq, kvh * hd, seq, hd);
    return FSDP2_SUCCESS;
}

/* One (sample, query head): its probabilities and its columns of y. */
static fsdp2_status_t attention_head_forward(const att_layout_t *l, int64_t b, int64_t h,
                                             const float *q, const float *k, const float *v,
                                             float *y, float *probs)
{
    int64_t seq = l->seq, hd = l->hd, ldq = l->ldq, ldk = l->ldk, ldy = l->ldy, T = seq;
    float scale = (float)(1.0 / sqrt((double)hd));
    const float *qh = q + b * seq * ldq + h * hd;
    const float *kh = k + b * seq * ldk + (h / l->group) * hd;
    const float *vh = v + b * seq * ldk + (h / l->group) * hd;
    float *p = probs + (b * l->heads + h) * seq * seq;
    float *out = y + b * seq * ldy + h * hd;
    fwd_stage_t st = {0};
    if (l->ops16) {
        FSDP2_CHECK(stage_kv(l, b, h / l->group, k, v, &st.k, &st.v, &st.q));
        st.p = st.q + (seq < ATT_ROWS ? seq : ATT_ROWS) * hd;
    }
    for (int64_t r0 = 0; r0 < seq; r0 += ATT_ROWS) {
        int64_t r1 = r0 + ATT_ROWS < seq ? r0 + ATT_ROWS : seq, M = r1 - r0, N = r1;
        if (l->ops16) {
            to_bf16(st.q, q, ldq, b * seq + r0, h * hd, M, hd);
            FSDP2_CHECK(nn_gemm_bf16(0, 1, M, N, hd, scale, st.q, hd, st.k, hd, 0.0f,
                                     p + r0 * T, T));
        } else {
            FSDP2_CHECK(nn_sgemm(0, 1, M, N, hd, scale, qh + r0 * ldq, ldq, kh, ldk, 0.0f,
                                 p + r0 * T, T));
        }
        causal_softmax(p, seq, r0, r1);
        if (l->ops16) {
            to_bf16(st.p, p, T, r0, 0, M, N);
            FSDP2_CHECK(nn_gemm_bf16(0, 0, M, hd, N, 1.0f, st.p, N, st.v, hd, 0.0f,
                                     out + r0 * ldy, ldy));
        } else {
            FSDP2_CHECK(nn_sgemm(0, 0, M, hd, N, 1.0f, p + r0 * T, T, vh, ldk, 0.0f,
                                 out + r0 * ldy, ldy));
        }
    }
    return FSDP2_SUCCESS;
}

/* Every thread of the team takes its staging before any work is shared out, so that the
 * first bf16 call allocates it on all of them: with dynamic scheduling a thread that got
 * no work in the first call would otherwise allocate in a later step. */
static void team_staging(const att_layout_t *l, nn_par_status_t *ps)
{
    uint16_t *unused;
    fsdp2_status_t s = l->ops16 && l->seq > 0 ? staging(l->seq, l->hd, &unused) : FSDP2_SUCCESS;
    if (s != FSDP2_SUCCESS)
        nn_par_fail(ps, s);
}

/* The (sample, head) pairs are independent: one thread each, GEMMs on their thread. */
static fsdp2_status_t attention_forward(const att_layout_t *l, const float *q, const float *k,
                                        const float *v, float *y, float *probs)
{
    nn_par_status_t ps = {.status = FSDP2_SUCCESS};
    int64_t pairs = l->batch * l->heads;
    if (nn_gemm_preparing()) {
        /* In the team the real call starts: each thread takes its staging, and the calling
         * thread (the master, the one preparing) walks one pair, which has every shape, its
         * primitives made inside the region as the real calls would make them. */
        FSDP2_OMP("omp parallel if(pairs > 1)")
        {
            team_staging(l, &ps);
            FSDP2_OMP("omp master")
            {
                fsdp2_status_t s = attention_head_forward(l, 0, 0, q, k, v, y, probs);
                if (s != FSDP2_SUCCESS)
                    nn_par_fail(&ps, s);
            }
        }
        return nn_par_result(&ps);
    }
    FSDP2_OMP("omp parallel if(pairs > 1)")
    {
        team_staging(l, &ps);
        FSDP2_OMP("omp for schedule(dynamic)")
        for (int64_t i = 0; i < pairs; i++) {
            fsdp2_status_t s = attention_head_forward(l, i / l->heads, i % l->heads, q, k, v,
                                                      y, probs);
            if (s != FSDP2_SUCCESS)
                nn_par_fail(&ps, s);
        }
    }
    return nn_par_result(&ps);
}

/* dS = P (dP - rowsum(P dP)) in place over rows [r0, r1), held in db from row r0 on;
 * masked entries have P = 0 */
static void softmax_backward(const float *p, float *db, int64_t seq, int64_t r0, int64_t r1)
{
    if (nn_gemm_preparing())
        return;
    for (int64_t i = r0; i < r1; i++) {
        const float *pr = p + i * seq;
        float *dr = db + (i - r0) * seq;
        double dot = 0; /* the terms have both signs: summed in f64 */
        for (int64_t j = 0; j <= i; j++)
            dot += (double)pr[j] * dr[j];
        for (int64_t j = 0; j <= i; j++)
            dr[j] = pr[j] * (dr[j] - (float)dot);
        for (int64_t j = i + 1; j < r1; j++)
            dr[j] = 0.0f;
    }
}

/* The backward's bf16 copies in one thread's staging. */
typedef struct bwd_stage {
    uint16_t *k, *v;         /* [seq, hd] */
    uint16_t *q, *g, *p, *ds; /* [rows, hd], [rows, hd], [rows, seq], [rows, seq] */
} bwd_stage_t;

/* The block of query rows [r0, r1) of head h under bf16 operands: the f32 path's four
 * GEMMs, each operand rounded as it enters; dP and dS stay f32 in db (ld seq). */
static fsdp2_status_t block_backward_bf16(const att_layout_t *l, int64_t b, int64_t h,
                                          int64_t r0, const float *q, const float *p,
                                          const float *dy, float *dq, float *dkh, float *dvh,
                                          float *db, const bwd_stage_t *st)
{
    int64_t seq = l->seq, hd = l->hd, ldq = l->ldq, ldk = l->ldk, T = seq;
    int64_t r1 = r0 + ATT_ROWS < seq ? r0 + ATT_ROWS : seq, M = r1 - r0, N = r1;
    float scale = (float)(1.0 / sqrt((double)hd));
    to_bf16(st->g, dy, l->ldy, b * seq + r0, h * hd, M, hd);
    to_bf16(st->p, p, T, r0, 0, M, N);
    /* dP = dY V^T; dV += P^T dY */
    FSDP2_CHECK(nn_gemm_bf16(0, 1, M, N, hd, 1.0f, st->g, hd, st->v, hd, 0.0f, db, T));
    FSDP2_CHECK(nn_gemm_bf16(1, 0, N, hd, M, 1.0f, st->p, N, st->g, hd, 1.0f, dvh, ldk));
    softmax_backward(p, db, seq, r0, r1);
    to_bf16(st->ds, db, T, 0, 0, M, N);
    to_bf16(st->q, q, ldq, b * seq + r0, h * hd, M, hd);
    /* dQ += scale dS K; dK += scale dS^T Q */
    FSDP2_CHECK(nn_gemm_bf16(0, 0, M, hd, N, scale, st->ds, N, st->k, hd, 1.0f,
                             dq + (b * seq + r0) * ldq + h * hd, ldq));
    FSDP2_CHECK(nn_gemm_bf16(1, 0, N, hd, M, scale, st->ds, N, st->q, hd, 1.0f, dkh, ldk));
    return FSDP2_SUCCESS;
}

/* One (sample, key/value head) and the query heads that read it: dk and dv of that head
 * are written by this call alone. dq, dk, dv share q's and k's layouts. */
static fsdp2_status_t attention_group_backward(const att_layout_t *l, int64_t b, int64_t kvh,
                                               const float *q, const float *k, const float *v,
                                               const float *probs, const float *dy, float *dq,
                                               float *dk, float *dv, float *dp)
{
    int64_t seq = l->seq, hd = l->hd, ldq = l->ldq, ldk = l->ldk, ldy = l->ldy, T = seq;
    float scale = (float)(1.0 / sqrt((double)hd));
    int64_t kat = b * seq * ldk + kvh * hd;
    const float *kh = k + kat, *vh = v + kat;
    float *dkh = dk + kat, *dvh = dv + kat;
    bwd_stage_t st = {0};
    if (l->ops16) {
        uint16_t *rest;
        int64_t rows = seq < ATT_ROWS ? seq : ATT_ROWS;
        FSDP2_CHECK(stage_kv(l, b, kvh, k, v, &st.k, &st.v, &rest));
        st.q = rest;
        st.g = st.q + rows * hd;
        st.p = st.g + rows * hd;
        st.ds = st.p + rows * seq;
    }
    for (int64_t h = kvh * l->group; h < (kvh + 1) * l->group; h++) {
        int64_t qat = b * seq * ldq + h * hd;
        const float *qh = q + qat;
        float *dqh = dq + qat;
        const float *p = probs + (b * l->heads + h) * seq * seq;
        const float *g = dy + b * seq * ldy + h * hd;
        if (l->ops16) {
            for (int64_t r0 = 0; r0 < seq; r0 += ATT_ROWS)
                FSDP2_CHECK(block_backward_bf16(l, b, h, r0, q, p, dy, dq, dkh, dvh, dp, &st));
            continue;
        }
        for (int64_t r0 = 0; r0 < seq; r0 += ATT_ROWS) {
            int64_t r1 = r0 + ATT_ROWS < seq ? r0 + ATT_ROWS : seq, M = r1 - r0, N = r1;
            const float *pb = p + r0 * T, *gb = g + r0 * ldy;
            float *db = dp; /* this block's rows */
            /* dP = dY V^T; dV += P^T dY (keys [0, r1) only: the rest of P is 0) */
            FSDP2_CHECK(nn_sgemm(0, 1, M, N, hd, 1.0f, gb, ldy, vh, ldk, 0.0f, db, T));
            FSDP2_CHECK(nn_sgemm(1, 0, N, hd, M, 1.0f, pb, T, gb, ldy, 1.0f, dvh, ldk));
            softmax_backward(p, db, seq, r0, r1);
            /* dQ += scale dS K; dK += scale dS^T Q */
            FSDP2_CHECK(nn_sgemm(0, 0, M, hd, N, scale, db, T, kh, ldk, 1.0f, dqh + r0 * ldq,
                                 ldq));
            FSDP2_CHECK(nn_sgemm(1, 0, N, hd, M, scale, db, T, qh + r0 * ldq, ldq, 1.0f, dkh,
                                 ldk));
        }
    }
    return FSDP2_SUCCESS;
}

/* One thread per (sample, key/value head), as many as the workspace has scratches for
 * (slots; at least 1) and the pool has threads: a workspace sized for a larger layer must
 * not start a team larger than fsdp2_nn_set_threads asked for. */
static fsdp2_status_t attention_backward(const att_layout_t *l, const float *q, const float *k,
                                         const float *v, const float *probs, const float *dy,
                                         float *dq, float *dk, float *dv, nn_carve_t *c,
                                         int slots)
{
    float *scratch[ATT_MAX_SLOTS];
    int64_t rows = l->seq < ATT_ROWS ? l->seq : ATT_ROWS;
    int pool = nn_threads();
    slots = slots > pool ? pool : slots;
    slots = slots < 1 ? 1 : (slots > ATT_MAX_SLOTS ? ATT_MAX_SLOTS : slots);
    for (int i = 0; i < slots; i++)
        scratch[i] = nn_carve_floats(c, rows * l->seq);
    nn_par_status_t ps = {.status = FSDP2_SUCCESS};
    int64_t kv_heads = l->heads / l->group, groups = l->batch * kv_heads;
    if (nn_gemm_preparing()) { /* as the forward's: one group, in the real call's team */
        FSDP2_OMP("omp parallel num_threads(slots) if(groups > 1 && slots > 1)")
        {
            team_staging(l, &ps);
            FSDP2_OMP("omp master")
            {
                fsdp2_status_t s = attention_group_backward(l, 0, 0, q, k, v, probs, dy, dq, dk,
                                                            dv, scratch[0]);
                if (s != FSDP2_SUCCESS)
                    nn_par_fail(&ps, s);
            }
        }
        return nn_par_result(&ps);
    }
    FSDP2_OMP("omp parallel num_threads(slots) if(groups > 1 && slots > 1)")
    {
        team_staging(l, &ps);
        FSDP2_OMP("omp for schedule(dynamic)")
        for (int64_t i = 0; i < groups; i++) {
            float *dp = scratch[nn_thread_index() % slots];
            fsdp2_status_t s = attention_group_backward(l, i / kv_heads, i % kv_heads, q, k, v,
                                                        probs, dy, dq, dk, dv, dp);
            if (s != FSDP2_SUCCESS)
                nn_par_fail(&ps, s);
        }
    }
    return nn_par_result(&ps);
}

/* The layout of sizes given by a caller, checked: every stride and seq * seq fit a BLAS
 * int, heads and kv_heads positive with kv_heads dividing heads. */
static fsdp2_status_t attention_layout(int64_t batch, int64_t seq, int64_t heads,
                                       int64_t kv_heads, int64_t hd, int fused, att_layout_t *l)
{
    FSDP2_CHECK(nn_check_dim(batch, "batch"));
    FSDP2_CHECK(nn_check_dim(seq, "seq"));
    FSDP2_ARG_CHECK(seq <= 46340, "seq = %lld: seq * seq overflows a BLAS int", (long long)seq);
    FSDP2_ARG_CHECK(heads > 0 && heads <= INT_MAX, "heads = %lld is outside [1, %d]",
                    (long long)heads, INT_MAX);
    FSDP2_ARG_CHECK(kv_heads > 0 && heads % kv_heads == 0,
                    "kv_heads = %lld does not divide heads = %lld", (long long)kv_heads,
                    (long long)heads);
    FSDP2_ARG_CHECK(hd > 0 && hd <= INT_MAX / 3 / heads,
                    "head_dim = %lld with heads = %lld: a row of q, k and v overflows a BLAS int",
                    (long long)hd, (long long)heads);
    *l = (att_layout_t){.batch = batch, .seq = seq, .heads = heads, .group = heads / kv_heads,
                        .hd = hd, .ldq = heads * hd, .ldk = kv_heads * hd, .ldy = heads * hd};
    if (fused) /* q, k and v are column ranges of one row of 3 * dim */
        l->ldq = l->ldk = 3 * heads * hd;
    return FSDP2_SUCCESS;
}

/* GPT-2's fused layout: dim and heads as the caller gives them. */
static fsdp2_status_t fused_layout(int64_t batch, int64_t seq, int64_t dim, int64_t heads,
                                   att_layout_t *l)
{
    FSDP2_CHECK(nn_check_dim(3 * dim, "3 * dim"));
    FSDP2_ARG_CHECK(heads > 0 && dim % heads == 0,
                    "dim = %lld does not split into heads = %lld equal heads", (long long)dim,
                    (long long)heads);
    if (dim == 0) { /* no features: nothing to compute, but the other sizes still count */
        FSDP2_CHECK(nn_check_dim(batch, "batch"));
        FSDP2_CHECK(nn_check_dim(seq, "seq"));
        *l = (att_layout_t){.batch = 0};
        return FSDP2_SUCCESS;
    }
    return attention_layout(batch, seq, heads, heads, dim / heads, 1, l);
}

fsdp2_status_t fsdp2_nn_attention_forward(const float *qkv, int64_t batch, int64_t seq,
                                          int64_t dim, int64_t heads, float *y, float *probs)
{
    att_layout_t l;
    FSDP2_CHECK(fused_layout(batch, seq, dim, heads, &l));
    int64_t n = batch * seq * dim;
    FSDP2_ARG_CHECK((qkv && y && probs) || n == 0, "qkv, y or probs is NULL");
    if (n == 0)
        return FSDP2_SUCCESS;
    FSDP2_CHECK(nn_compute_bf16_wanted(&l.ops16));
    return attention_forward(&l, qkv, qkv + dim, qkv + 2 * dim, y, probs);
}

fsdp2_status_t fsdp2_nn_attention_backward(const float *qkv, const float *probs, const float *dy,
                                           int64_t batch, int64_t seq, int64_t dim, int64_t heads,
                                           float *dqkv, fsdp2_nn_workspace_t *ws)
{
    att_layout_t l;
    FSDP2_CHECK(fused_layout(batch, seq, dim, heads, &l));
    int64_t n = batch * seq * dim;
    FSDP2_ARG_CHECK((qkv && probs && dy && dqkv) || n == 0, "qkv, probs, dy or dqkv is NULL");
    nn_carve_t c;
    FSDP2_CHECK(nn_carve_begin(ws, slot_bytes(seq), "attention backward", &c));
    if (n == 0)
        return FSDP2_SUCCESS;
    FSDP2_CHECK(nn_compute_bf16_wanted(&l.ops16));
    return attention_backward(&l, qkv, qkv + dim, qkv + 2 * dim, probs, dy, dqkv, dqkv + dim,
                              dqkv + 2 * dim, &c, (int)(ws->bytes / slot_bytes(seq)));
}

fsdp2_status_t fsdp2_nn_gqa_attention_forward(const float *q, const float *k, const float *v,
                                              int64_t batch, int64_t seq, int64_t heads,
                                              int64_t kv_heads, int64_t head_dim, float *y,
                                              float *probs)
{
    att_layout_t l;
    FSDP2_CHECK(attention_layout(batch, seq, heads, kv_heads, head_dim, 0, &l));
    int64_t n = batch * seq;
    FSDP2_ARG_CHECK((q && k && v && y && probs) || n == 0, "q, k, v, y or probs is NULL");
    if (n == 0)
        return FSDP2_SUCCESS;
    FSDP2_CHECK(nn_compute_bf16_wanted(&l.ops16));
    return attention_forward(&l, q, k, v, y, probs);
}

fsdp2_status_t fsdp2_nn_gqa_attention_backward(const float *q, const float *k, const float *v,
                                               const float *probs, const float *dy, int64_t batch,
                                               int64_t seq, int64_t heads, int64_t kv_heads,
                                               int64_t head_dim, float *dq, float *dk, float *dv,
                                               fsdp2_nn_workspace_t *ws)
{
    att_layout_t l;
    FSDP2_CHECK(attention_layout(batch, seq, heads, kv_heads, head_dim, 0, &l));
    int64_t n = batch * seq;
    const void *in[] = {q, k, v, probs, dy, dq, dk, dv};
    static const char *const names[] = {"q", "k", "v", "probs", "dy", "dq", "dk", "dv"};
    for (int i = 0; i < 8 && n > 0; i++)
        FSDP2_ARG_CHECK(in[i], "%s is NULL (grouped-query attention backward)", names[i]);
    FSDP2_ARG_CHECK(n == 0 || (dq != dy && dk != dy && dv != dy),
                    "dq, dk or dv aliases dy: the backward adds into them");
    nn_carve_t c;
    FSDP2_CHECK(nn_carve_begin(ws, slot_bytes(seq), "attention backward", &c));
    if (n == 0)
        return FSDP2_SUCCESS;
    FSDP2_CHECK(nn_compute_bf16_wanted(&l.ops16));
    return attention_backward(&l, q, k, v, probs, dy, dq, dk, dv, &c,
                              (int)(ws->bytes / slot_bytes(seq)));
}

/* The forward and the backward of l in prepare mode (nn_prepare_begin), every array in one
 * span: the outputs apart from the inputs where the calls insist. */
static fsdp2_status_t prepare(int64_t batch, int64_t seq, int64_t dim, int64_t heads,
                              int64_t kv_heads, int64_t hd, int fused)
{
    size_t ws_bytes;
    FSDP2_CHECK(fsdp2_nn_attention_workspace_bytes(seq, &ws_bytes));
    /* q, k, v, y and their gradients (fused: qkv's rows of 3 dim), the probabilities */
    const int64_t arrays[2][3] = {{batch, seq, fused ? 3 * dim : dim}, {batch, heads, seq * seq}};
    size_t bytes;
    FSDP2_CHECK(nn_prepare_bytes(arrays, 2, ws_bytes, &bytes));
    nn_prepare_t p;
    FSDP2_CHECK(nn_prepare_begin(&p, bytes));
    float *a = p.span, *out = a + 16, *grad = a + 32, *g2 = a + 48, *g3 = a + 64;
    fsdp2_nn_workspace_t ws = {p.span, ws_bytes};
    fsdp2_status_t s;
    if (fused) {
        s = fsdp2_nn_attention_forward(a, batch, seq, dim, heads, out, out);
        if (s == FSDP2_SUCCESS)
            s = fsdp2_nn_attention_backward(a, a, out, batch, seq, dim, heads, grad, &ws);
    } else {
        s = fsdp2_nn_gqa_attention_forward(a, a, a, batch, seq, heads, kv_heads, hd, out, out);
        if (s == FSDP2_SUCCESS)
            s = fsdp2_nn_gqa_attention_backward(a, a, a, a, out, batch, seq, heads, kv_heads, hd,
                                                grad, g2, g3, &ws);
    }
    nn_prepare_end(&p);
    return s;
}

fsdp2_status_t fsdp2_nn_attention_prepare(int64_t batch, int64_t seq, int64_t dim, int64_t heads)
{
    att_layout_t l;
    FSDP2_CHECK(fused_layout(batch, seq, dim, heads, &l));
    if (batch * seq * dim == 0)
        return FSDP2_SUCCESS;
    return prepare(batch, seq, dim, heads, heads, dim / heads, 1);
}

fsdp2_status_t fsdp2_nn_gqa_attention_prepare(int64_t batch, int64_t seq, int64_t heads,
                                              int64_t kv_heads, int64_t head_dim)
{
    att_layout_t l;
    FSDP2_CHECK(attention_layout(batch, seq, heads, kv_heads, head_dim, 0, &l));
    if (batch * seq == 0)
        return FSDP2_SUCCESS;
    return prepare(batch, seq, heads * head_dim, heads, kv_heads, head_dim, 0);
}

