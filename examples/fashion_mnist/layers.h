/* The layers of the example's two models, forward and backward, on plain float arrays
 * (row-major, batch first). Backward functions ADD into weight and bias gradients (the
 * library zeroes them per backward) and write the input gradient when dx is not NULL. */
#ifndef FMNIST_LAYERS_H
#define FMNIST_LAYERS_H

#include <stdint.h>

/* y[B, out] = x[B, in] W[out, in]^T + b */
void linear_forward(const float *x, const float *w, const float *b, float *y, int batch, int in,
                    int out);
void linear_backward(const float *x, const float *w, const float *dy, float *dw, float *db,
                     float *dx, int batch, int in, int out);

/* In place on the output: y = max(y, 0); backward masks dy where y <= 0. */
void relu_forward(float *y, int64_t n);
void relu_backward(const float *y, float *dy, int64_t n);

/* A valid (no padding, stride 1) convolution: x[B, C, H, W], w[O, C, K, K], b[O] ->
 * y[B, O, H-K+1, W-K+1], as one GEMM per chunk of `chunk` samples over an im2col buffer
 * (bigger GEMMs than one per sample: the weight gradient's has chunk*(H-K+1)*(W-K+1)
 * terms). scratch holds conv_scratch(...) floats. */
int64_t conv_scratch(int c, int h, int wd, int o, int k, int chunk);
void conv_forward(const float *x, const float *w, const float *b, float *y, float *scratch,
                  int chunk, int batch, int c, int h, int wd, int o, int k);
void conv_backward(const float *x, const float *w, const float *dy, float *dw, float *db,
                   float *dx, float *scratch, int chunk, int batch, int c, int h, int wd, int o,
                   int k);

/* 2x2 max pooling, stride 2: x[B, C, H, W] -> y[B, C, H/2, W/2]; arg keeps the index of
 * each maximum for the backward. */
void maxpool_forward(const float *x, float *y, int32_t *arg, int batch, int c, int h, int wd);
void maxpool_backward(const float *dy, const int32_t *arg, float *dx, int batch, int c, int h,
                      int wd);

/* Inverted dropout with probability p: mask (0 or 1/(1-p)) from a counter-based stream
 * keyed on (seed, index), so it is reproducible; y *= mask; backward dy *= mask. */
void dropout_forward(float *y, float *mask, int64_t n, double p, uint64_t seed, uint64_t offset);
void dropout_backward(float *dy, const float *mask, int64_t n);

/* log_softmax over classes then the mean negative log-likelihood of labels: returns the
 * loss; dlogits (may be NULL) gets d loss / d logits; *correct counts argmax hits. */
double log_softmax_nll(const float *logits, const int *labels, float *dlogits, int batch,
                       int classes, int *correct);

#endif
