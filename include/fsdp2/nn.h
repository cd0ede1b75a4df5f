/* Layers for C applications: forward and backward of the pieces of an MLP, a CNN, and
 * GPT-2 and Llama style transformers, on the cpu device. Built when the library is
 * configured with -Dnn=true (the default); GEMMs go to oneDNN's matmul (or to the BLAS in
 * a build without oneDNN).
 *
 * Conventions, the same for every function here:
 * - Activations and their gradients are f32 arrays the caller owns, contiguous and
 *   row-major: `rows` rows (batch x sequence, flattened) of the layer's features.
 * - Parameters are tensors on a cpu device (what fsdp2_param_unsharded gives inside a
 *   unit's hooks), f32 or bf16; their gradients (fsdp2_param_grad) are tensors of the same
 *   shape, f32 or bf16, independently of the parameter's dtype. bf16 values are converted
 *   on the fly and everything accumulates in f32: an application writes no cast code.
 *   With bf16 weights on a CPU with bf16 matrix units (AVX512-BF16, AMX), the GEMMs of
 *   the linear layer, the LoRA adapters and conv2d take bf16 operands, the activations
 *   rounded to bf16, as PyTorch's CPU autocast does (FSDP2_NN_BF16_GEMM, docs/nn.md);
 *   attention's do too under bf16 compute (fsdp2_nn_set_compute_dtype).
 * - Every gradient a backward produces is ADDED to what its buffer holds: parameter
 *   gradients (as FSDP's hooks expect: they zero them per backward) and input gradients
 *   alike, so an input used twice (a residual stream, a tied weight) sums its
 *   contributions without an extra op. Zero the input-gradient buffers before a backward:
 *   carve a block's (or a whole model's) input gradients from one allocation and clear it
 *   with one memset per step, rather than one per buffer.
 *   The one exception is the losses, which WRITE the gradient that starts a backward.
 *   Any gradient pointer may be NULL: that gradient is not computed.
 * - A bf16 gradient receives each call's contribution, summed in f32, with one rounding.
 * - Some functions need scratch memory: a workspace the caller provides (never
 *   allocated here, so a training step allocates nothing; the exceptions are
 *   FSDP2_NN_BF16_GEMM=on on a CPU without bf16 kernels, whose emulation takes 1 MiB per
 *   thread once, on the thread's first bf16 GEMM, and attention's bf16 staging under
 *   bf16 compute, once per thread: fsdp2_nn_set_compute_dtype). Each such function has a
 *   `_workspace_bytes` query; the answer does not depend on dtypes, so one workspace of
 *   the largest answer serves every call of a model (fsdp2_nn_workspace_bytes gives it
 *   for a list of layers). A layer with a query always needs its workspace, whatever the
 *   dtypes (so a program written for f32 runs unchanged with bf16): one missing or too
 *   small is refused with the bytes needed.
 * - Arguments come in one order: inputs (the arrays read: x, what the forward saved, dy),
 *   sizes and settings (rows, eps, p, ...), parameters (tensors), outputs (y, what the
 *   forward saves, the gradients), the workspace.
 * - Threading: one pool, OpenMP's, sized by fsdp2_nn_set_threads (else OMP_NUM_THREADS, else
 *   one thread per CPU), runs the GEMMs and the layers' own loops: rows, (sample, head)
 *   pairs or elements are split among its threads. Functions may run concurrently on
 *   different threads when their output buffers and workspaces differ.
 * - Bad input (a NULL pointer, a negative size, a shape that does not match, a parameter
 *   on another device, an id out of range) returns an error naming the value; nothing
 *   is written then. */
#ifndef FSDP2_NN_H
#define FSDP2_NN_H

#include <stddef.h>
#include <stdint.h>

#include <fsdp2/export.h>
#include <fsdp2/status.h>
#include <fsdp2/tensor.h>

FSDP2_EXTERN_C_BEGIN

/* Caller-owned scratch memory; data aligned to at least 16 bytes. */
typedef struct fsdp2_nn_workspace {
    void *data;
    size_t bytes;
} fsdp2_nn_workspace_t;

/* ---- linear: y[rows, out] = x[rows, in] weight[out, in]^T + bias[out] ---- */

/* Workspace both directions need for a weight [out, in]: about 2 MiB whatever the number
 * of rows, as bf16 weights are converted in blocks of rows of about 1 MiB (at least one
 * row: 8 in + 4 out bytes and alignment when a row alone is larger). */
FSDP2_API fsdp2_status_t fsdp2_nn_linear_workspace_bytes(int64_t in, int64_t out,
                                                         size_t *bytes);

/* y is written. bias may be NULL. */
FSDP2_API fsdp2_status_t fsdp2_nn_linear_forward(const float *x, int64_t rows,
                                                 const fsdp2_tensor_t *weight,
                                                 const fsdp2_tensor_t *bias, float *y,
                                                 fsdp2_nn_workspace_t *ws);

/* dx += dy weight; dweight += dy^T x; dbias += the column sums of dy. */
FSDP2_API fsdp2_status_t fsdp2_nn_linear_backward(const float *x, const float *dy, int64_t rows,
                                                  const fsdp2_tensor_t *weight, float *dx,
                                                  fsdp2_tensor_t *dweight, fsdp2_tensor_t *dbias,
                                                  fsdp2_nn_workspace_t *ws);

/* Creates now the GEMM primitives that the forward and the backward (dx and the weight's
 * gradient) of rows rows through a weight [out, in] of weight_dtype, with a bias or not
 * (bias 0 or 1), and a weight gradient of grad_dtype will use: see "Preparing the GEMMs"
 * at the end of this header. */
FSDP2_API fsdp2_status_t fsdp2_nn_linear_prepare(int64_t rows, int64_t in, int64_t out,
                                                 fsdp2_dtype_t weight_dtype,
                                                 fsdp2_dtype_t grad_dtype, int bias);

/* ---- LoRA linear: y = x W^T + b + scale * dropout(x) A^T B^T ----
 * A frozen base (weight [out, in], bias [out] or NULL) and a low-rank adapter as PEFT's
 * LoRA: A = lora_A.weight [r, in], B = lora_B.weight [out, r], scale = lora_alpha / r,
 * the dropout on the adapter's input only. The backward computes no gradient of the base:
 * dx and the adapter's dA, dB only. */
typedef struct fsdp2_nn_lora {
    const fsdp2_tensor_t *a; /* [r, in], f32 or bf16 */
    const fsdp2_tensor_t *b; /* [out, r], f32 or bf16 */
    double scale;            /* lora_alpha / r */
    double dropout;          /* lora_dropout, in [0, 1) */
    uint64_t seed, offset;   /* the mask, as fsdp2_nn_dropout_forward's over x's elements */
} fsdp2_nn_lora_t;

/* Workspace both directions need: about 4 MiB for rank r adapters whatever the rows (the
 * adapter's input in blocks of rows, the adapter as f32, its gradients' sums), or the
 * base linear's, whichever is larger. */
FSDP2_API fsdp2_status_t fsdp2_nn_lora_workspace_bytes(int64_t in, int64_t out, int64_t r,
                                                       size_t *bytes);

/* y is written; it may not alias x. r may be any size (as peft's). */
FSDP2_API fsdp2_status_t fsdp2_nn_lora_forward(const float *x, int64_t rows,
                                               const fsdp2_tensor_t *weight,
                                               const fsdp2_tensor_t *bias,
                                               const fsdp2_nn_lora_t *lora, float *y,
                                               fsdp2_nn_workspace_t *ws);

/* dx += dy W + the adapter's part (through the same dropout mask); da, db += the
 * adapter's gradients (either may be NULL). The adapter's input is recomputed from x. */
FSDP2_API fsdp2_status_t fsdp2_nn_lora_backward(const float *x, const float *dy, int64_t rows,
                                                const fsdp2_tensor_t *weight,
                                                const fsdp2_nn_lora_t *lora, float *dx,
                                                fsdp2_tensor_t *da, fsdp2_tensor_t *db,
                                                fsdp2_nn_workspace_t *ws);

/* Creates now the GEMM primitives of fsdp2_nn_lora_forward and _backward (dx and the
 * adapter's gradients, of adapter_dtype) for rows rows, a base weight [out, in] of
 * weight_dtype with a bias or not (0 or 1) and rank r adapters of adapter_dtype with this
 * scale (a GEMM's alpha, so part of its shape): see "Preparing the GEMMs" at the end of
 * this header. The dropout does not change them. */
FSDP2_API fsdp2_status_t fsdp2_nn_lora_prepare(int64_t rows, int64_t in, int64_t out, int64_t r,
                                               double scale, fsdp2_dtype_t weight_dtype,
                                               fsdp2_dtype_t adapter_dtype, int bias);

/* ---- embedding: y[i] = weight[ids[i]] for a table weight[num, dim] ---- */

/* Workspace of the backward for n ids over a table [num, dim]. */
FSDP2_API fsdp2_status_t fsdp2_nn_embedding_workspace_bytes(int64_t n, int64_t num, int64_t dim,
                                                            size_t *bytes);

/* y[n, dim] is written (accumulate 0) or added to (accumulate 1: the position embedding
 * on top of the token embedding). Every id must lie in [0, num). */
FSDP2_API fsdp2_status_t fsdp2_nn_embedding_forward(const int32_t *ids, int64_t n, int accumulate,
                                                    const fsdp2_tensor_t *weight, float *y);

/* dweight[ids[i]] += dy[i]: a scatter-add. Rows hit by several ids are summed in f32 first
 * (one rounding per row for a bf16 gradient). */
FSDP2_API fsdp2_status_t fsdp2_nn_embedding_backward(const int32_t *ids, const float *dy,
                                                     int64_t n, fsdp2_tensor_t *dweight,
                                                     fsdp2_nn_workspace_t *ws);

/* ---- layer norm over the last dim (dim = weight's length) ---- */

FSDP2_API fsdp2_status_t fsdp2_nn_layernorm_workspace_bytes(int64_t dim, size_t *bytes);

/* y = (x - mean) * rstd * weight + bias with rstd = 1 / sqrt(var + eps) (the biased
 * variance, as torch.nn.LayerNorm). mean[rows] and rstd[rows] are written for the
 * backward. y may alias x only when the backward is not needed. */
FSDP2_API fsdp2_status_t fsdp2_nn_layernorm_forward(const float *x, int64_t rows, float eps,
                                                    const fsdp2_tensor_t *weight,
                                                    const fsdp2_tensor_t *bias, float *y,
                                                    float *mean, float *rstd,
                                                    fsdp2_nn_workspace_t *ws);

/* The residual add and the layer norm after it in one pass over the rows: sum = x + delta
 * (as fsdp2_nn_residual_forward), then y, mean and rstd of sum as fsdp2_nn_layernorm_forward
 * gives them, the same bits, with each row normalised while it is in cache. sum may alias
 * x or delta; y may not alias sum. */
FSDP2_API fsdp2_status_t fsdp2_nn_add_layernorm_forward(const float *x, const float *delta,
                                                        int64_t rows, float eps,
                                                        const fsdp2_tensor_t *weight,
                                                        const fsdp2_tensor_t *bias, float *sum,
                                                        float *y, float *mean, float *rstd,
                                                        fsdp2_nn_workspace_t *ws);

/* dx += d/dx (dx may not alias x or dy); dweight += sum over rows of dy * xhat; dbias +=
 * sum over rows of dy. */
FSDP2_API fsdp2_status_t fsdp2_nn_layernorm_backward(const float *x, const float *mean,
                                                     const float *rstd, const float *dy,
                                                     int64_t rows, const fsdp2_tensor_t *weight,
                                                     float *dx, fsdp2_tensor_t *dweight,
                                                     fsdp2_tensor_t *dbias,
                                                     fsdp2_nn_workspace_t *ws);

/* ---- element-wise activations ---- */

/* GELU, tanh approximation (torch's approximate="tanh", GPT-2's):
 * y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). y may alias x without backward. */
FSDP2_API fsdp2_status_t fsdp2_nn_gelu_forward(const float *x, int64_t n, float *y);
/* dx += dy * gelu'(x). */
FSDP2_API fsdp2_status_t fsdp2_nn_gelu_backward(const float *x, const float *dy, int64_t n,
                                                float *dx);

/* y = max(x, 0). y may alias x (the backward reads y). */
FSDP2_API fsdp2_status_t fsdp2_nn_relu_forward(const float *x, int64_t n, float *y);
/* dx += dy where y > 0. */
FSDP2_API fsdp2_status_t fsdp2_nn_relu_backward(const float *y, const float *dy, int64_t n,
                                                float *dx);

/* Inverted dropout with probability p in [0, 1): y = x * m with m 0 or 1/(1-p). The mask
 * comes from a counter-based generator (Philox 4x32) at element offset + i of the stream
 * keyed by seed, so it is reproducible and never stored: the backward recomputes it, and
 * a tensor split into pieces (offset = the piece's first element) gets the masks the
 * whole would. y may alias x. p = 0 copies. */
FSDP2_API fsdp2_status_t fsdp2_nn_dropout_forward(const float *x, int64_t n, double p,
                                                  uint64_t seed, uint64_t offset, float *y);
/* dx += dy * m, the same m as the forward with these arguments. */
FSDP2_API fsdp2_status_t fsdp2_nn_dropout_backward(const float *dy, int64_t n, double p,
                                                   uint64_t seed, uint64_t offset, float *dx);

/* ---- residual add ---- */

/* y = a + b; y may alias a or b. */
FSDP2_API fsdp2_status_t fsdp2_nn_residual_forward(const float *a, const float *b, int64_t n,
                                                   float *y);
/* da += dy; db += dy (either may be NULL; neither may alias dy). */
FSDP2_API fsdp2_status_t fsdp2_nn_residual_backward(const float *dy, int64_t n, float *da,
                                                    float *db);

/* ---- zeroing ---- */

/* x[0..n) = 0, split among the pool's threads; blocks until done. For the input-gradient
 * buffers the backwards add into, zeroed before them: one thread's memset would leave the
 * other threads of a many-core host idle. n >= 0; x may be NULL only when n is 0. */
FSDP2_API fsdp2_status_t fsdp2_nn_zero(float *x, int64_t n);

/* ---- 2-D convolution, no padding, stride 1 ----
 * x [batch, c, h, w], weight [o, c, k, k], bias [o] -> y [batch, o, h - k + 1, w - k + 1],
 * as GEMMs over an im2col matrix of a few samples at a time (the workspace holds it). */

FSDP2_API fsdp2_status_t fsdp2_nn_conv2d_workspace_bytes(int64_t c, int64_t h, int64_t w,
                                                         int64_t o, int64_t k, size_t *bytes);

/* y is written. bias may be NULL. */
FSDP2_API fsdp2_status_t fsdp2_nn_conv2d_forward(const float *x, int64_t batch, int64_t h,
                                                 int64_t w, const fsdp2_tensor_t *weight,
                                                 const fsdp2_tensor_t *bias, float *y,
                                                 fsdp2_nn_workspace_t *ws);

/* dx += the input gradient; dweight, dbias += theirs. */
FSDP2_API fsdp2_status_t fsdp2_nn_conv2d_backward(const float *x, const float *dy, int64_t batch,
                                                  int64_t h, int64_t w,
                                                  const fsdp2_tensor_t *weight, float *dx,
                                                  fsdp2_tensor_t *dweight, fsdp2_tensor_t *dbias,
                                                  fsdp2_nn_workspace_t *ws);

/* Creates now the GEMM primitives of fsdp2_nn_conv2d_forward and _backward (dx and the
 * weight's gradient, of grad_dtype) for batch samples [c, h, w] and a weight [o, c, k, k]
 * of weight_dtype: see "Preparing the GEMMs" at the end of this header. A bias does not
 * change them. */
FSDP2_API fsdp2_status_t fsdp2_nn_conv2d_prepare(int64_t batch, int64_t c, int64_t h, int64_t w,
                                                 int64_t o, int64_t k,
                                                 fsdp2_dtype_t weight_dtype,
                                                 fsdp2_dtype_t grad_dtype);

/* ---- 2x2 max pooling, stride 2 ----
 * x [planes, h, w] (planes = batch x channels) -> y [planes, h / 2, w / 2] (an odd last row
 * or column is dropped); argmax [planes, h / 2, w / 2] keeps each maximum's index in its
 * plane (the first of equal values) for the backward. */
FSDP2_API fsdp2_status_t fsdp2_nn_maxpool2d_forward(const float *x, int64_t planes, int64_t h,
                                                    int64_t w, float *y, int32_t *argmax);
/* dx[argmax] += dy. */
FSDP2_API fsdp2_status_t fsdp2_nn_maxpool2d_backward(const float *dy, const int32_t *argmax,
                                                     int64_t planes, int64_t h, int64_t w,
                                                     float *dx);

/* ---- causal multi-head self-attention ----
 * qkv [batch, seq, 3 * dim]: the fused projection's output, q then k then v, head h in
 * columns [h * hd, (h + 1) * hd) of each with hd = dim / heads. y [batch, seq, dim]: the
 * heads' outputs side by side (the output projection is a linear after it).
 * probs [batch, heads, seq, seq]: softmax(q k^T / sqrt(hd)) with the causal mask (a
 * position sees itself and earlier ones; the masked entries are 0), kept for backward. */

/* The backward's workspace: a [min(seq, 64), seq] f32 scratch per thread of the pool (ask
 * after fsdp2_nn_set_threads), whatever the compute dtype; the forward takes none. Under
 * bf16 compute both directions also use a bf16 staging of each thread's own
 * (fsdp2_nn_set_compute_dtype). */
FSDP2_API fsdp2_status_t fsdp2_nn_attention_workspace_bytes(int64_t seq, size_t *bytes);

FSDP2_API fsdp2_status_t fsdp2_nn_attention_forward(const float *qkv, int64_t batch,
                                                    int64_t seq, int64_t dim, int64_t heads,
                                                    float *y, float *probs);
/* dqkv += the gradient of qkv. */
FSDP2_API fsdp2_status_t fsdp2_nn_attention_backward(const float *qkv, const float *probs,
                                                     const float *dy, int64_t batch, int64_t seq,
                                                     int64_t dim, int64_t heads, float *dqkv,
                                                     fsdp2_nn_workspace_t *ws);

/* Creates now the GEMM primitives of fsdp2_nn_attention_forward and _backward for these
 * sizes, at the compute dtype (fsdp2_nn_set_compute_dtype) and thread count set: see
 * "Preparing the GEMMs" at the end of this header. */
FSDP2_API fsdp2_status_t fsdp2_nn_attention_prepare(int64_t batch, int64_t seq, int64_t dim,
                                                    int64_t heads);

/* ---- Llama-family layers ---- */

/* RMSNorm over the last dim (dim = weight's length), as Llama's:
 * y = x * rstd * weight with rstd = 1 / sqrt(mean(x^2) + eps), the mean summed in f64.
 * rstd[rows] is written for the backward. y may alias x only when the backward is not
 * needed. The workspace holds the weight as f32 and the gradient's sums. */
FSDP2_API fsdp2_status_t fsdp2_nn_rmsnorm_workspace_bytes(int64_t dim, size_t *bytes);

FSDP2_API fsdp2_status_t fsdp2_nn_rmsnorm_forward(const float *x, int64_t rows, float eps,
                                                  const fsdp2_tensor_t *weight, float *y,
                                                  float *rstd, fsdp2_nn_workspace_t *ws);

/* The residual add and the RMSNorm after it in one pass, as fsdp2_nn_add_layernorm_forward. */
FSDP2_API fsdp2_status_t fsdp2_nn_add_rmsnorm_forward(const float *x, const float *delta,
                                                      int64_t rows, float eps,
                                                      const fsdp2_tensor_t *weight, float *sum,
                                                      float *y, float *rstd,
                                                      fsdp2_nn_workspace_t *ws);

/* dx += d/dx (dx may not alias x or dy); dweight += sum over rows of dy * x * rstd. */
FSDP2_API fsdp2_status_t fsdp2_nn_rmsnorm_backward(const float *x, const float *rstd,
                                                   const float *dy, int64_t rows,
                                                   const fsdp2_tensor_t *weight, float *dx,
                                                   fsdp2_tensor_t *dweight,
                                                   fsdp2_nn_workspace_t *ws);

/* SwiGLU's gate: y = silu(gate) * up with silu(g) = g / (1 + e^-g), element-wise over n
 * (Llama's MLP is down(silu(gate(x)) * up(x))). y may alias gate or up without backward. */
FSDP2_API fsdp2_status_t fsdp2_nn_swiglu_forward(const float *gate, const float *up, int64_t n,
                                                 float *y);
/* dgate += dy * up * silu'(gate); dup += dy * silu(gate) (either may be NULL). */
FSDP2_API fsdp2_status_t fsdp2_nn_swiglu_backward(const float *gate, const float *up,
                                                  const float *dy, int64_t n, float *dgate,
                                                  float *dup);

/* Rotary position embeddings as Llama's (the "rotate half" pairing: feature i of a head
 * turns with feature i + head_dim / 2 by the angle pos * inv_freq[i]). */
typedef enum fsdp2_nn_rope_scaling {
    FSDP2_NN_ROPE_DEFAULT = 0, /* inv_freq[i] = theta^(-2i / head_dim) */
    FSDP2_NN_ROPE_LLAMA3 = 1,  /* Llama 3's rope_scaling of rope_type "llama3" */
} fsdp2_nn_rope_scaling_t;

/* A config.json's rope fields. The llama3 fields are read only with that scaling. */
typedef struct fsdp2_nn_rope_config {
    double theta;                   /* rope_theta */
    fsdp2_nn_rope_scaling_t scaling;
    double factor;                  /* rope_scaling.factor */
    double low_freq_factor;         /* rope_scaling.low_freq_factor */
    double high_freq_factor;        /* rope_scaling.high_freq_factor */
    int64_t original_max_positions; /* rope_scaling.original_max_position_embeddings */
} fsdp2_nn_rope_config_t;

#define FSDP2_NN_ROPE_CONFIG_INIT {10000.0, FSDP2_NN_ROPE_DEFAULT, 1.0, 1.0, 1.0, 0}

/* Writes the table the rotations read: table[positions, head_dim], for each position
 * the cosines of its head_dim / 2 angles, then their sines (f32, as transformers computes
 * them: inv_freq and the angle rounded to f32). Built once, when the model is planned;
 * head_dim must be even. Refuses a theta, factor or frequency bound that is not finite
 * and positive, or llama3 bounds with high_freq_factor <= low_freq_factor. */
FSDP2_API fsdp2_status_t fsdp2_nn_rope_table(const fsdp2_nn_rope_config_t *config,
                                             int64_t head_dim, int64_t positions,
                                             float *table);

/* x [batch, seq, heads * head_dim] (q or k as the projection wrote it): each head of the
 * row at position t (0 <= t < seq <= positions) is rotated by the table's row t into y.
 * y may alias x (the rotation in place). */
FSDP2_API fsdp2_status_t fsdp2_nn_rope_forward(const float *x, const float *table, int64_t batch,
                                               int64_t seq, int64_t heads, int64_t head_dim,
                                               int64_t positions, float *y);
/* dx += the rotation back of dy. dx may be dy itself: then dy is rotated back in place
 * (written, not added), which suits a forward done in place. dx is required. */
FSDP2_API fsdp2_status_t fsdp2_nn_rope_backward(const float *dy, const float *table, int64_t batch,
                                                int64_t seq, int64_t heads, int64_t head_dim,
                                                int64_t positions, float *dx);

/* ---- causal grouped-query attention ----
 * q [batch, seq, heads * head_dim]; k and v [batch, seq, kv_heads * head_dim], kv_heads
 * dividing heads: query head h reads key/value head h / (heads / kv_heads) (kv_heads =
 * heads is multi-head attention, 1 is multi-query). y [batch, seq, heads * head_dim].
 * probs [batch, heads, seq, seq] as for fsdp2_nn_attention_forward (scale 1/sqrt(head_dim),
 * causal mask), kept for the backward, whose workspace is fsdp2_nn_attention_workspace_bytes. */
FSDP2_API fsdp2_status_t fsdp2_nn_gqa_attention_forward(const float *q, const float *k,
                                                        const float *v, int64_t batch,
                                                        int64_t seq, int64_t heads,
                                                        int64_t kv_heads, int64_t head_dim,
                                                        float *y, float *probs);
/* dq, dk, dv += the gradients (a key/value head sums the gradients of its group's query
 * heads). All three are required (none may be NULL or alias dy). */
FSDP2_API fsdp2_status_t fsdp2_nn_gqa_attention_backward(const float *q, const float *k,
                                                         const float *v, const float *probs,
                                                         const float *dy, int64_t batch,
                                                         int64_t seq, int64_t heads,
                                                         int64_t kv_heads, int64_t head_dim,
                                                         float *dq, float *dk, float *dv,
                                                         fsdp2_nn_workspace_t *ws);

/* fsdp2_nn_attention_prepare for the grouped-query layout. */
FSDP2_API fsdp2_status_t fsdp2_nn_gqa_attention_prepare(int64_t batch, int64_t seq,
                                                        int64_t heads, int64_t kv_heads,
                                                        int64_t head_dim);

/* ---- losses: they WRITE the gradient ---- */

/* Cross-entropy's settings. divisor says what the summed loss is divided by:
 * - divisor > 0: by divisor. Pass the number of counted targets of the whole global
 *   batch (every micro-batch of every rank) to get its mean, then SUM the gradients over
 *   the ranks. FSDP averages the gradients over the ranks (it divides their sum by the
 *   world size), so pass that count divided by the world size: the result is then the
 *   global mean's gradient whichever rank counted how many ignored targets.
 * - divisor <= 0 (the default): by the rows this call counted: the mean over this call's
 *   rows. Averaged by FSDP over ranks whose counts differ, it weighs each rank's rows
 *   by 1 / (its count x world size), which is not the global mean; it is when every
 *   rank counts the same number of rows (no ignored targets, equal micro-batches). */
typedef struct fsdp2_nn_cross_entropy_options {
    unsigned size;        /* sizeof(fsdp2_nn_cross_entropy_options_t) */
    int32_t ignore_index; /* rows with this target are skipped (-100, as torch's) */
    double divisor;       /* see above; NaN is refused */
} fsdp2_nn_cross_entropy_options_t;

#define FSDP2_NN_CROSS_ENTROPY_OPTIONS_INIT {sizeof(fsdp2_nn_cross_entropy_options_t), -100, 0.0}

typedef struct fsdp2_nn_cross_entropy_result {
    double loss;     /* the summed -log softmax(logits)[target] of the counted rows / divisor */
    int64_t counted; /* rows whose target is not ignore_index */
    int64_t correct; /* counted rows whose arg-max (the first of equal values) is the target */
} fsdp2_nn_cross_entropy_result_t;

/* Cross-entropy of logits [rows, classes] against targets [rows]: any target other than
 * ignore_index must lie in [0, classes). options may be NULL (the defaults). dlogits (may
 * be NULL) is written with d loss / d logits (ignored rows get 0); it may be logits itself
 * (in place, which saves a [rows, classes] buffer for a large vocabulary). */
FSDP2_API fsdp2_status_t fsdp2_nn_cross_entropy(
    const float *logits, const int32_t *targets, int64_t rows, int64_t classes,
    const fsdp2_nn_cross_entropy_options_t *options, float *dlogits,
    fsdp2_nn_cross_entropy_result_t *result);

/* Mean squared error over n elements: *loss = mean((pred - target)^2); dpred (may be
 * NULL) is written with 2 (pred - target) / n. */
FSDP2_API fsdp2_status_t fsdp2_nn_mse(const float *pred, const float *target, int64_t n,
                                      double *loss, float *dpred);

/* ---- the workspace of a whole model ---- */

/* A layer's shape, as its _workspace_bytes query takes it. */
typedef enum fsdp2_nn_layer_kind {
    FSDP2_NN_LINEAR = 0,    /* dims: in, out */
    FSDP2_NN_LORA = 1,      /* dims: in, out, r */
    FSDP2_NN_EMBEDDING = 2, /* dims: n, num, dim */
    FSDP2_NN_LAYERNORM = 3, /* dims: dim */
    FSDP2_NN_RMSNORM = 4,   /* dims: dim */
    FSDP2_NN_CONV2D = 5,    /* dims: c, h, w, o, k */
    FSDP2_NN_ATTENTION = 6, /* dims: seq (grouped-query attention's too) */
} fsdp2_nn_layer_kind_t;

typedef struct fsdp2_nn_layer_shape {
    fsdp2_nn_layer_kind_t kind;
    int64_t dims[5]; /* as the kind says; the rest ignored */
} fsdp2_nn_layer_shape_t;

/* The bytes of one workspace that serves every call of the count layers (each distinct
 * shape once is enough): the largest of their queries' answers. A bad shape is refused
 * naming its index and the query's complaint. The layers without a query (activations,
 * dropout, residual, pooling, rope, losses) need none. */
FSDP2_API fsdp2_status_t fsdp2_nn_workspace_bytes(const fsdp2_nn_layer_shape_t *layers,
                                                  size_t count, size_t *bytes);

/* ---- threads and counters ---- */

/* The layers' threads (>= 1) for calls made from this thread: OpenMP's pool, which the
 * GEMMs share (and the BLAS's in a build without oneDNN). Ask the workspace queries after
 * it: the attention backward's scratch is per thread. */
FSDP2_API fsdp2_status_t fsdp2_nn_set_threads(int threads);

/* Preparing the GEMMs. With oneDNN, a GEMM's kernel is made (compiled for the CPU) once
 * per shape: sizes, strides, dtypes, and the thread count. Unprepared, that happens on the
 * shape's first call, inside the first step. A layer's _prepare call makes now those its
 * forward and backward will use for the given sizes, at this thread's thread count
 * (fsdp2_nn_set_threads first) and the FSDP2_NN_BF16_GEMM mode, so that a step of those
 * sizes makes none: call it when the model is planned, once per distinct shape. It reads
 * and writes none of the layer's data and takes no workspace; under bf16 compute the
 * attention calls also take each thread's bf16 staging then. Without oneDNN it makes no
 * primitive (the BLAS keeps nothing per shape). Other sizes (a last, smaller batch) still
 * get theirs on first use, and each thread still makes its small per-shape oneDNN memory
 * descriptors on its first call of a shape (and, for bf16 GEMMs emulated in f32, its
 * 1 MiB scratch). */

/* The dtype the layers compute in, for the whole process (f32 until set): FSDP2_F32 or
 * FSDP2_BF16, any other dtype refused naming it. Under bf16, where FSDP2_NN_BF16_GEMM
 * lets a layer take bf16 GEMM operands (on; auto on a CPU with bf16 matmul kernels), the
 * attention layers (fused and grouped-query) multiply as PyTorch's CPU autocast and
 * FSDP2's param_dtype bf16 do: q, k, v, dy, the probabilities and their gradient are
 * rounded to bf16 (nearest even) as they enter each GEMM, the sums and every output f32,
 * the softmax and its backward f32. Their bf16 copies are a scratch of each thread that
 * runs attention, allocated by the whole team on the first such call and kept:
 * 4 (seq hd + r (hd + seq)) bytes with r = min(seq, 64) and hd the head dimension, made
 * again, larger, only by a call of a larger shape; the workspace queries do not change.
 * The linear layer does not read this setting: its weight's dtype decides (a bf16 weight
 * is what FSDP2's param_dtype bf16 hands it). Under f32 or FSDP2_NN_BF16_GEMM=off the
 * layers give the bits of f32 compute. Set it before the steps, not while layers run. */
FSDP2_API fsdp2_status_t fsdp2_nn_set_compute_dtype(fsdp2_dtype_t dtype);

/* The dtype fsdp2_nn_set_compute_dtype set (FSDP2_F32 if never). */
FSDP2_API fsdp2_status_t fsdp2_nn_get_compute_dtype(fsdp2_dtype_t *dtype);

/* What the layers' GEMMs did since the process started, for a benchmark's breakdown:
 * calls, floating-point operations (2 m n k each) and seconds (the time of a GEMM that
 * runs on one thread of a parallel region counts divided by the region's threads), and
 * the engine ("onednn" or "blas"). Fixed layout: fields are never added. */
typedef struct fsdp2_nn_gemm_stats {
    int64_t calls;
    double flops;
    double seconds;
    const char *engine;
} fsdp2_nn_gemm_stats_t;

FSDP2_API fsdp2_status_t fsdp2_nn_gemm_stats(fsdp2_nn_gemm_stats_t *stats);

FSDP2_EXTERN_C_END

#endif
