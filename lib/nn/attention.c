/* Causal multi-head self-attention over a fused qkv input, one (sample, head) at a time
 * and, within it, in blocks of ATT_ROWS query rows: rows [r0, r1) see keys [0, r1) only,
 * so the GEMMs skip the masked part above the diagonal (about half of them for long
 * sequences). Per block: scores by one sgemm into the saved probabilities, a masked
 * softmax per row, one sgemm for the output. The backward recomputes nothing: it reads
 * the saved probabilities and needs one [seq, seq] scratch for their gradient. */
#include <cblas.h>
#include <math.h>

#include "nn_common.h"

/* Query rows per block: small enough that the skipped triangle is most of the masked
 * part, large enough that each GEMM still has ATT_ROWS rows. */
#define ATT_ROWS 64

fsdp2_status_t fsdp2_nn_attention_workspace_bytes(int64_t seq, size_t *bytes)
{
    FSDP2_ARG_CHECK(bytes, "bytes is NULL");
    FSDP2_CHECK(nn_check_dim(seq, "seq"));
    FSDP2_ARG_CHECK(seq <= 46340, "seq = %lld: seq * seq overflows a BLAS int", (long long)seq);
    *bytes = nn_region_bytes(seq * seq);
    return FSDP2_SUCCESS;
}

static fsdp2_status_t check_attention(int64_t batch, int64_t seq, int64_t dim, int64_t heads)
{
    FSDP2_CHECK(nn_check_dim(batch, "batch"));
    FSDP2_CHECK(nn_check_dim(seq, "seq"));
    FSDP2_ARG_CHECK(seq <= 46340, "seq = %lld: seq * seq overflows a BLAS int", (long long)seq);
    FSDP2_CHECK(nn_check_dim(3 * dim, "3 * dim"));
    FSDP2_ARG_CHECK(heads > 0 && dim % heads == 0,
                    "dim = %lld does not split into heads = %lld equal heads", (long long)dim,
                    (long long)heads);
    return FSDP2_SUCCESS;
}

/* Rows [r0, r1) of p (ld seq) hold scores for keys [0, r1): keep key j <= row i, softmax
 * them, zero the rest of the row. */
static void causal_softmax(float *p, int64_t seq, int64_t r0, int64_t r1)
{
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

fsdp2_status_t fsdp2_nn_attention_forward(const float *qkv, int64_t batch, int64_t seq,
                                          int64_t dim, int64_t heads, float *y, float *probs)
{
    FSDP2_CHECK(check_attention(batch, seq, dim, heads));
    int64_t hd = dim / heads, n = batch * seq * dim;
    FSDP2_ARG_CHECK((qkv && y && probs) || n == 0, "qkv, y or probs is NULL");
    if (n == 0)
        return FSDP2_SUCCESS;
    float scale = (float)(1.0 / sqrt((double)hd));
    int ld = (int)(3 * dim), T = (int)seq, D = (int)hd;
    for (int64_t b = 0; b < batch; b++) {
        for (int64_t h = 0; h < heads; h++) {
            const float *q = qkv + b * seq * 3 * dim + h * hd, *k = q + dim, *v = q + 2 * dim;
            float *p = probs + (b * heads + h) * seq * seq, *out = y + b * seq * dim + h * hd;
            for (int64_t r0 = 0; r0 < seq; r0 += ATT_ROWS) {
                int64_t r1 = r0 + ATT_ROWS < seq ? r0 + ATT_ROWS : seq;
                int M = (int)(r1 - r0), N = (int)r1;
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, D, scale, q + r0 * ld,
                            ld, k, ld, 0.0f, p + r0 * T, T);
                causal_softmax(p, seq, r0, r1);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, D, N, 1.0f, p + r0 * T,
                            T, v, ld, 0.0f, out + r0 * dim, (int)dim);
            }
        }
    }
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_nn_attention_backward(const float *qkv, const float *probs, int64_t batch,
                                           int64_t seq, int64_t dim, int64_t heads,
                                           const float *dy, float *dqkv,
                                           fsdp2_nn_workspace_t *ws)
{
    FSDP2_CHECK(check_attention(batch, seq, dim, heads));
    int64_t hd = dim / heads, n = batch * seq * dim;
    FSDP2_ARG_CHECK((qkv && probs && dy && dqkv) || n == 0, "qkv, probs, dy or dqkv is NULL");
    size_t need;
    FSDP2_CHECK(fsdp2_nn_attention_workspace_bytes(seq, &need));
    nn_carve_t c;
    FSDP2_CHECK(nn_carve_begin(ws, need, "attention backward", &c));
    if (n == 0)
        return FSDP2_SUCCESS;
    float *dp = nn_carve_floats(&c, seq * seq);
    float scale = (float)(1.0 / sqrt((double)hd));
    int ld = (int)(3 * dim), T = (int)seq, D = (int)hd;
    for (int64_t b = 0; b < batch; b++) {
        for (int64_t h = 0; h < heads; h++) {
            int64_t at = b * seq * 3 * dim + h * hd;
            const float *q = qkv + at, *k = q + dim, *v = q + 2 * dim;
            float *dq = dqkv + at, *dk = dq + dim, *dv = dq + 2 * dim;
            const float *p = probs + (b * heads + h) * seq * seq;
            const float *g = dy + b * seq * dim + h * hd;
            for (int64_t r0 = 0; r0 < seq; r0 += ATT_ROWS) {
                int64_t r1 = r0 + ATT_ROWS < seq ? r0 + ATT_ROWS : seq;
                int M = (int)(r1 - r0), N = (int)r1;
                const float *pb = p + r0 * T, *gb = g + r0 * dim;
                float *db = dp + r0 * T;
                /* dP = dY V^T; dV += P^T dY (keys [0, r1) only: the rest of P is 0) */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, D, 1.0f, gb, (int)dim,
                            v, ld, 0.0f, db, T);
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, N, D, M, 1.0f, pb, T, gb,
                            (int)dim, 1.0f, dv, ld);
                /* dS = P (dP - rowsum(P dP)), in place; masked entries have P = 0 */
                for (int64_t i = r0; i < r1; i++) {
                    const float *pr = p + i * seq;
                    float *dr = dp + i * seq;
                    double dot = 0; /* the terms have both signs: summed in f64 */
                    for (int64_t j = 0; j <= i; j++)
                        dot += (double)pr[j] * dr[j];
                    for (int64_t j = 0; j <= i; j++)
                        dr[j] = pr[j] * (dr[j] - (float)dot);
                    for (int64_t j = i + 1; j < r1; j++)
                        dr[j] = 0.0f;
                }
                /* dQ += scale dS K; dK += scale dS^T Q */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, D, N, scale, db, T, k,
                            ld, 1.0f, dq + r0 * ld, ld);
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, N, D, M, scale, db, T,
                            q + r0 * ld, ld, 1.0f, dk, ld);
            }
        }
    }
    return FSDP2_SUCCESS;
}
