/* Layer math with OpenBLAS GEMMs (im2col for the convolutions). */
#include <cblas.h>
#include <math.h>
#include <string.h>

#include <fsdp2/random.h>

#include "layers.h"

void linear_forward(const float *x, const float *w, const float *b, float *y, int batch, int in,
                    int out)
{
    for (int i = 0; i < batch; i++)
        memcpy(y + (size_t)i * out, b, sizeof(float) * (size_t)out);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, batch, out, in, 1.0f, x, in, w, in, 1.0f,
                y, out);
}

void linear_backward(const float *x, const float *w, const float *dy, float *dw, float *db,
                     float *dx, int batch, int in, int out)
{
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, out, in, batch, 1.0f, dy, out, x, in,
                1.0f, dw, in);
    for (int i = 0; i < batch; i++) {
        for (int j = 0; j < out; j++)
            db[j] += dy[(size_t)i * out + j];
    }
    if (dx)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, batch, in, out, 1.0f, dy, out, w,
                    in, 0.0f, dx, in);
}

void relu_forward(float *y, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        y[i] = y[i] > 0 ? y[i] : 0;
}

void relu_backward(const float *y, float *dy, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        dy[i] = y[i] > 0 ? dy[i] : 0;
}

/* col[(ci*K + ki)*K + kj][at + oi*OW + oj] = x[ci][oi + ki][oj + kj], rows ld apart: one
 * sample's columns of a chunk's im2col matrix. */
static void im2col(const float *x, float *col, int64_t ld, int64_t at, int c, int h, int wd, int k)
{
    int oh = h - k + 1, ow = wd - k + 1;
    for (int ci = 0; ci < c; ci++) {
        for (int ki = 0; ki < k; ki++) {
            for (int kj = 0; kj < k; kj++) {
                float *row = col + ((int64_t)(ci * k + ki) * k + kj) * ld + at;
                for (int oi = 0; oi < oh; oi++)
                    memcpy(row + (size_t)oi * ow, x + ((size_t)ci * h + oi + ki) * wd + kj,
                           sizeof(float) * (size_t)ow);
            }
        }
    }
}

static void col2im_add(const float *col, int64_t ld, int64_t at, float *dx, int c, int h, int wd,
                       int k)
{
    int oh = h - k + 1, ow = wd - k + 1;
    for (int ci = 0; ci < c; ci++) {
        for (int ki = 0; ki < k; ki++) {
            for (int kj = 0; kj < k; kj++) {
                const float *row = col + ((int64_t)(ci * k + ki) * k + kj) * ld + at;
                for (int oi = 0; oi < oh; oi++) {
                    float *d = dx + ((size_t)ci * h + oi + ki) * wd + kj;
                    const float *s = row + (size_t)oi * ow;
                    for (int oj = 0; oj < ow; oj++)
                        d[oj] += s[oj];
                }
            }
        }
    }
}

int64_t conv_scratch(int c, int h, int wd, int o, int k, int chunk)
{
    int64_t n = (int64_t)(h - k + 1) * (wd - k + 1);
    return ((int64_t)c * k * k + o) * n * chunk; /* im2col [C*K*K, chunk*n] + [O, chunk*n] */
}

void conv_forward(const float *x, const float *w, const float *b, float *y, float *scratch,
                  int chunk, int batch, int c, int h, int wd, int o, int k)
{
    int64_t n = (int64_t)(h - k + 1) * (wd - k + 1), kk = (int64_t)c * k * k;
    for (int s0 = 0; s0 < batch; s0 += chunk) {
        int m = batch - s0 < chunk ? batch - s0 : chunk;
        int64_t ld = m * n;
        float *col = scratch, *out = scratch + kk * ld;
        for (int j = 0; j < m; j++)
            im2col(x + (size_t)(s0 + j) * c * h * wd, col, ld, j * n, c, h, wd, k);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, o, (int)ld, (int)kk, 1.0f, w,
                    (int)kk, col, (int)ld, 0.0f, out, (int)ld);
        for (int j = 0; j < m; j++) {
            float *ys = y + (size_t)(s0 + j) * o * n;
            for (int oc = 0; oc < o; oc++) {
                const float *src = out + oc * ld + j * n;
                for (int64_t i = 0; i < n; i++)
                    ys[oc * n + i] = src[i] + b[oc];
            }
        }
    }
}

void conv_backward(const float *x, const float *w, const float *dy, float *dw, float *db,
                   float *dx, float *scratch, int chunk, int batch, int c, int h, int wd, int o,
                   int k)
{
    int64_t n = (int64_t)(h - k + 1) * (wd - k + 1), kk = (int64_t)c * k * k;
    for (int s0 = 0; s0 < batch; s0 += chunk) {
        int m = batch - s0 < chunk ? batch - s0 : chunk;
        int64_t ld = m * n;
        float *col = scratch, *g = scratch + kk * ld;
        for (int j = 0; j < m; j++) {
            im2col(x + (size_t)(s0 + j) * c * h * wd, col, ld, j * n, c, h, wd, k);
            const float *dys = dy + (size_t)(s0 + j) * o * n;
            for (int oc = 0; oc < o; oc++)
                memcpy(g + oc * ld + j * n, dys + oc * n, sizeof(float) * (size_t)n);
        }
        for (int oc = 0; oc < o; oc++) {
            float sum = 0;
            for (int64_t i = 0; i < ld; i++)
                sum += g[oc * ld + i];
            db[oc] += sum;
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, o, (int)kk, (int)ld, 1.0f, g,
                    (int)ld, col, (int)ld, 1.0f, dw, (int)kk);
        if (!dx)
            continue;
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)kk, (int)ld, o, 1.0f, w,
                    (int)kk, g, (int)ld, 0.0f, col, (int)ld);
        for (int j = 0; j < m; j++) {
            float *dxs = dx + (size_t)(s0 + j) * c * h * wd;
            memset(dxs, 0, sizeof(float) * (size_t)c * h * wd);
            col2im_add(col, ld, j * n, dxs, c, h, wd, k);
        }
    }
}

void maxpool_forward(const float *x, float *y, int32_t *arg, int batch, int c, int h, int wd)
{
    int oh = h / 2, ow = wd / 2;
    for (int p = 0; p < batch * c; p++) {
        const float *xp = x + (size_t)p * h * wd;
        for (int i = 0; i < oh; i++) {
            for (int j = 0; j < ow; j++) {
                int best = (2 * i) * wd + 2 * j;
                const int cand[3] = {best + 1, best + wd, best + wd + 1};
                for (int q = 0; q < 3; q++) {
                    if (xp[cand[q]] > xp[best])
                        best = cand[q];
                }
                size_t at = (size_t)p * oh * ow + (size_t)i * ow + j;
                y[at] = xp[best];
                arg[at] = best;
            }
        }
    }
}

void maxpool_backward(const float *dy, const int32_t *arg, float *dx, int batch, int c, int h,
                      int wd)
{
    int oh = h / 2, ow = wd / 2;
    memset(dx, 0, sizeof(float) * (size_t)batch * c * h * wd);
    for (int p = 0; p < batch * c; p++) {
        for (int i = 0; i < oh * ow; i++) {
            size_t at = (size_t)p * oh * ow + i;
            dx[(size_t)p * h * wd + arg[at]] += dy[at];
        }
    }
}

void dropout_forward(float *y, float *mask, int64_t n, double p, uint64_t seed, uint64_t offset)
{
    const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    float keep = (float)(1.0 / (1.0 - p));
    uint32_t r[4];
    uint64_t have = UINT64_MAX; /* the block of 4 in r */
    for (int64_t i = 0; i < n; i++) {
        uint64_t index = offset + (uint64_t)i, block = index / 4;
        if (block != have) {
            const uint32_t counter[4] = {(uint32_t)block, (uint32_t)(block >> 32), 0x64726f70u, 0};
            fsdp2_philox4x32(counter, key, r);
            have = block;
        }
        double u = (double)r[index % 4] * 0x1.0p-32;
        mask[i] = u < p ? 0.0f : keep;
        y[i] *= mask[i];
    }
}

void dropout_backward(float *dy, const float *mask, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        dy[i] *= mask[i];
}

double log_softmax_nll(const float *logits, const int *labels, float *dlogits, int batch,
                       int classes, int *correct)
{
    double loss = 0;
    int hits = 0;
    for (int i = 0; i < batch; i++) {
        const float *z = logits + (size_t)i * classes;
        int arg = 0;
        for (int j = 1; j < classes; j++)
            arg = z[j] > z[arg] ? j : arg;
        double sum = 0;
        for (int j = 0; j < classes; j++)
            sum += exp((double)z[j] - z[arg]);
        double lse = z[arg] + log(sum);
        loss += lse - z[labels[i]];
        hits += arg == labels[i];
        for (int j = 0; dlogits && j < classes; j++) {
            double p = exp((double)z[j] - lse);
            dlogits[(size_t)i * classes + j] = (float)((p - (j == labels[i])) / batch);
        }
    }
    if (correct)
        *correct = hits;
    return loss / batch;
}
