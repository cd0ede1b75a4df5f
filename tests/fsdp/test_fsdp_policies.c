/* The module-boundary side of mixed precision (cast_forward_inputs, output_dtype), the
 * offload policy on a cpu device, and options built against earlier headers, with real
 * processes.
 *
 * Boundary: fc1 and fc2 compute in bf16, fc3 too but hands its output back in f32
 * (output_dtype), as a model whose head feeds an f32 loss. The test is the application:
 * it casts its f32 inputs with fsdp2_cast_forward_input, computes each layer in f32 on
 * the bf16 whole parameters and rounds the activations to bf16, and casts the last
 * output with fsdp2_cast_forward_output. Its reference, on one process, rounds to bf16
 * with its own round-to-nearest-even (written here from the bits) and runs the same
 * arithmetic, so each rank's outputs must agree bitwise; a plain f32 forward bounds how
 * far bf16 may go. The dtype queries, the casts of non-floating and already-cast
 * tensors, and every malformed call (wrong dtype, shape or device, NULLs, a bad dtype)
 * are checked too.
 *
 * Offload on cpu: accepted, said once in the log (stderr is captured), and the run is
 * the run without it: the SGD reference of mlp_model.h and the same memory plan, equal
 * to what was allocated. Bad values and offload of cuda shards are refused by name. */
#include <check.h>
#include <fcntl.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <fsdp2/fsdp.h>
#include <fsdp2/stream.h>

#include "../core/check_main.h"
#include "mlp_model.h"

/* |bf16 forward - f32 forward| relative to max(|f32|, 0.1): activations and weights of
 * 8 significant bits through three layers move the outputs by a few 2^-9 relative
 * (measured: at most 6.5e-3 over ws 1..4). This is a sanity bound; the exact check is
 * the bitwise one against the emulation. */
#define BF16_TOLERANCE 3e-2

/* Round to nearest even from the bits; NaN and infinity never occur here. */
static uint16_t to_bf16(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof(u));
    uint32_t lsb = (u >> 16) & 1u;
    return (uint16_t)((u + 0x7fffu + lsb) >> 16);
}

static float from_bf16(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float x;
    memcpy(&x, &u, sizeof(x));
    return x;
}

static float input_of(int sample, int j)
{
    return (float)sin(0.3 * sample + 0.11 * j + 0.5);
}

/* One layer as the application computes it: f32 sums over bf16 operands, tanh between
 * layers, the result rounded to bf16 (or kept f32 when `f32`, the plain reference). */
static void layer(const float *W, const float *b, int in, int out, const float *x, float *y,
                  int hidden, int f32)
{
    for (int o = 0; o < out; o++) {
        float z = b[o];
        for (int i = 0; i < in; i++)
            z += W[o * in + i] * x[i];
        float v = hidden ? tanhf(z) : z;
        y[o] = f32 ? v : from_bf16(to_bf16(v));
    }
}

/* The reference forward of one sample: bf16 (emulated) or plain f32. */
static void reference_forward(int sample, int f32, float *out)
{
    float x[MAX_IN], y[MAX_IN], W[MAX_OUT * MAX_IN], b[MAX_OUT];
    for (int j = 0; j < DIM[0]; j++)
        x[j] = f32 ? input_of(sample, j) : from_bf16(to_bf16(input_of(sample, j)));
    for (int l = 0; l < LAYERS; l++) {
        for (int k = 0; k < DIM[l + 1] * DIM[l]; k++)
            W[k] = f32 ? weight_init(l, k) : from_bf16(to_bf16(weight_init(l, k)));
        for (int k = 0; k < DIM[l + 1]; k++)
            b[k] = f32 ? bias_init(l, k) : from_bf16(to_bf16(bias_init(l, k)));
        layer(W, b, DIM[l], DIM[l + 1], x, y, l < LAYERS - 1, f32);
        memcpy(x, y, sizeof(float) * (size_t)DIM[l + 1]);
    }
    memcpy(out, x, sizeof(float) * (size_t)DIM[LAYERS]);
}

static fsdp2_mp_policy_t policy(fsdp2_dtype_t param, fsdp2_dtype_t output, int cast_inputs)
{
    fsdp2_mp_policy_t mp = FSDP2_MP_POLICY_INIT;
    mp.param_dtype = param;
    mp.reduce_dtype = FSDP2_F32;
    mp.output_dtype = output;
    mp.cast_forward_inputs = cast_inputs;
    return mp;
}

static int expect_dtype(rank_ctx_t *c, const char *what, fsdp2_dtype_t got, fsdp2_dtype_t want)
{
    return RANK_CHECK(c, got == want, "%s is %s, want %s", what, fsdp2_dtype_name(got),
                      fsdp2_dtype_name(want));
}

static fsdp2_tensor_t *tensor(rank_ctx_t *c, fsdp2_dtype_t dtype, int64_t rows, int64_t cols)
{
    int64_t shape[2] = {rows, cols};
    fsdp2_tensor_t *t = NULL;
    if (OK(c, fsdp2_tensor_zeros(CPU, dtype, 2, shape, &t)))
        return NULL;
    return t;
}

/* The bf16 whole parameter of layer l as f32 values. */
static int whole_bf16(run_t *r, int l, int kind, float *out)
{
    fsdp2_tensor_t *t = NULL;
    int fails = OK(r->c, fsdp2_param_unsharded(r->p[l][kind], &t));
    if (fails)
        return fails;
    fails += RANK_CHECK(r->c, t->dtype == FSDP2_BF16 && t->data,
                        "%s.%s is whole as %s, want bf16", LAYER_NAME[l], kind ? "bias" : "weight",
                        fsdp2_dtype_name(t->dtype));
    for (int64_t k = 0; k < t->numel && !fails; k++)
        out[k] = from_bf16(((const uint16_t *)t->data)[k]);
    return fails;
}

/* The application's forward of this rank's samples through the boundary casts; the f32
 * outputs in out [n][3]. */
static int boundary_forward(run_t *r, const int *samples, int n, float *out)
{
    rank_ctx_t *c = r->c;
    fsdp2_tensor_t *x = tensor(c, FSDP2_F32, n, DIM[0]);
    fsdp2_tensor_t *act = NULL, *result = tensor(c, FSDP2_F32, n, DIM[LAYERS]);
    fsdp2_stream_t *current = NULL;
    int fails = !x || !result;
    fails += fails ? 0 : OK(c, fsdp2_stream_current(CPU, &current));
    for (int s = 0; s < n && !fails; s++)
        for (int j = 0; j < DIM[0]; j++)
            ((float *)x->data)[s * DIM[0] + j] = input_of(samples[s], j);
    fails += fails ? 0 : OK(c, fsdp2_pre_forward(r->root));
    fsdp2_tensor_t *in = x;
    for (int l = 0; l < LAYERS && !fails; l++) {
        fsdp2_dtype_t want;
        fails += OK(c, fsdp2_forward_input_dtype(r->fc[l], in->dtype, &want));
        fails += expect_dtype(c, "an input's dtype at the boundary", want, FSDP2_BF16);
        fsdp2_tensor_t *cast = fails ? NULL : tensor(c, want, n, DIM[l]);
        fails += !cast;
        fails += fails ? 0 : OK(c, fsdp2_pre_forward(r->fc[l]));
        fails += fails ? 0 : OK(c, fsdp2_cast_forward_input(r->fc[l], in, cast));
        fails += fails ? 0 : OK(c, fsdp2_stream_synchronize(current));
        /* The first layer's input is the rounding of the f32 input, bitwise. */
        for (int64_t k = 0; k < (l == 0 && !fails ? cast->numel : 0); k++) {
            uint16_t got = ((const uint16_t *)cast->data)[k];
            uint16_t want_bits = to_bf16(((const float *)x->data)[k]);
            if (got != want_bits) {
                fails += RANK_CHECK(c, 0, "input element %lld cast to bf16 0x%04x, want 0x%04x",
                                    (long long)k, got, want_bits);
                break;
            }
        }
        float W[MAX_OUT * MAX_IN], b[MAX_OUT], xi[MAX_IN], yo[MAX_OUT];
        fails += fails ? 0 : whole_bf16(r, l, 0, W);
        fails += fails ? 0 : whole_bf16(r, l, 1, b);
        fsdp2_tensor_t *y = fails ? NULL : tensor(c, FSDP2_BF16, n, DIM[l + 1]);
        fails += !y;
        for (int s = 0; s < n && !fails; s++) {
            for (int i = 0; i < DIM[l]; i++)
                xi[i] = from_bf16(((const uint16_t *)cast->data)[s * DIM[l] + i]);
            layer(W, b, DIM[l], DIM[l + 1], xi, yo, l < LAYERS - 1, 0);
            for (int o = 0; o < DIM[l + 1]; o++)
                ((uint16_t *)y->data)[s * DIM[l + 1] + o] = to_bf16(yo[o]);
        }
        if (!fails && l == LAYERS - 1) {
            fsdp2_dtype_t od;
            fails += OK(c, fsdp2_forward_output_dtype(r->fc[l], y->dtype, &od));
            fails += expect_dtype(c, "fc3's output dtype", od, FSDP2_F32);
            fails += fails ? 0 : OK(c, fsdp2_cast_forward_output(r->fc[l], y, result));
        } else if (!fails) {
            fsdp2_dtype_t od;
            fails += OK(c, fsdp2_forward_output_dtype(r->fc[l], y->dtype, &od));
            fails += expect_dtype(c, "a hidden layer's output dtype", od, FSDP2_BF16);
        }
        fails += fails ? 0 : OK(c, fsdp2_post_forward(r->fc[l]));
        fsdp2_tensor_release(cast);
        fsdp2_tensor_release(act);
        act = y;
        in = y;
    }
    fails += fails ? 0 : OK(c, fsdp2_post_forward(r->root));
    fails += fails ? 0 : OK(c, fsdp2_stream_synchronize(current));
    if (!fails)
        memcpy(out, result->data, result->nbytes);
    fsdp2_tensor_release(act);
    fsdp2_tensor_release(x);
    fsdp2_tensor_release(result);
    return fails;
}

static int shard_with_boundary(run_t *r)
{
    build_options_t bo = BUILD_DEFAULT;
    bo.shard = SHARD_BY_CALLER;
    int fails = build_model(r, &bo);
    for (int l = 0; l < LAYERS && !fails; l++) {
        r->opts.mp = policy(FSDP2_BF16, l == LAYERS - 1 ? FSDP2_F32 : FSDP2_DTYPE_COUNT, 1);
        fails += OK(r->c, fsdp2_fully_shard(r->fc[l], &r->opts));
    }
    r->opts.mp = policy(FSDP2_BF16, FSDP2_DTYPE_COUNT, 1);
    fails += fails ? 0 : OK(r->c, fsdp2_fully_shard(r->root, &r->opts));
    return fails + run_bind_hooks(r);
}

static int body_boundary(rank_ctx_t *c)
{
    run_t *r = malloc(sizeof(*r));
    int fails = run_open(c, r);
    fails += fails ? 0 : shard_with_boundary(r);
    int samples[SAMPLES], n = 0;
    local_samples(r, 0, 1, samples, &n);
    float out[SAMPLES * MAX_OUT];
    double worst = 0;
    fails += fails ? 0 : boundary_forward(r, samples, n, out);
    for (int s = 0; s < n && !fails; s++) {
        float emu[MAX_OUT], f32[MAX_OUT];
        reference_forward(samples[s], 0, emu);
        reference_forward(samples[s], 1, f32);
        for (int k = 0; k < DIM[LAYERS] && !fails; k++) {
            float got = out[s * DIM[LAYERS] + k];
            fails += RANK_CHECK(c, memcmp(&got, &emu[k], sizeof(float)) == 0,
                                "sample %d output %d is %.9g, the bf16 emulation %.9g",
                                samples[s], k, got, emu[k]);
            double err = fabs(got - f32[k]) / fmax(fabs(f32[k]), 0.1);
            worst = fmax(worst, err);
        }
    }
    fails += RANK_CHECK(c, worst <= BF16_TOLERANCE,
                        "bf16 forward is %.3g (relative) from the f32 forward, beyond %.3g", worst,
                        BF16_TOLERANCE);
    fails += run_close(r);
    free(r);
    return fails;
}

/* ---------------------------------------------------------------------------------- */
/* Queries and casts one module at a time; the malformed calls                         */

/* A one-parameter module [5,3] f32 sharded with mp (NULL: not sharded). */
static fsdp2_param_t *lone_param;

static int lone_module(run_t *r, const char *name, const fsdp2_mp_policy_t *mp,
                       fsdp2_module_t **m)
{
    rank_ctx_t *c = r->c;
    int fails = OK(c, fsdp2_module_create(name, m));
    fsdp2_tensor_t *w = fails ? NULL : tensor(c, FSDP2_F32, 5, 3);
    fails += !w;
    fails += fails ? 0 : OK(c, fsdp2_module_add_param(*m, "weight", w, 1, &lone_param));
    fsdp2_tensor_release(w);
    if (!fails && mp) {
        fsdp2_shard_options_t o = FSDP2_SHARD_OPTIONS_INIT;
        o.mesh = r->mesh;
        o.mp = *mp;
        fails += OK(c, fsdp2_fully_shard(*m, &o));
    }
    return fails;
}

static int query(rank_ctx_t *c, fsdp2_module_t *m, int output, fsdp2_dtype_t in, fsdp2_dtype_t want,
                 const char *what)
{
    fsdp2_dtype_t got = FSDP2_DTYPE_COUNT;
    int fails = OK(c, output ? fsdp2_forward_output_dtype(m, in, &got)
                             : fsdp2_forward_input_dtype(m, in, &got));
    char label[160];
    snprintf(label, sizeof(label), "%s: %s %s", what, output ? "output" : "input",
             fsdp2_dtype_name(in));
    return fails + expect_dtype(c, label, got, want);
}

static int body_queries(rank_ctx_t *c)
{
    run_t *r = malloc(sizeof(*r));
    fsdp2_module_t *bf = NULL, *nocast = NULL, *unnamed = NULL, *f32 = NULL, *plain = NULL;
    fsdp2_mp_policy_t p_bf = policy(FSDP2_BF16, FSDP2_F16, 1);
    fsdp2_mp_policy_t p_nocast = policy(FSDP2_BF16, FSDP2_DTYPE_COUNT, 0);
    fsdp2_mp_policy_t p_unnamed = policy(FSDP2_DTYPE_COUNT, FSDP2_DTYPE_COUNT, 1);
    fsdp2_mp_policy_t p_f32 = policy(FSDP2_F32, FSDP2_DTYPE_COUNT, 1);
    int fails = run_open(c, r);
    fails += fails ? 0 : lone_module(r, "bf", &p_bf, &bf);
    fails += fails ? 0 : lone_module(r, "nocast", &p_nocast, &nocast);
    fails += fails ? 0 : lone_module(r, "unnamed", &p_unnamed, &unnamed);
    fails += fails ? 0 : lone_module(r, "f32", &p_f32, &f32);
    fails += fails ? 0 : lone_module(r, "plain", NULL, &plain);
    if (fails)
        goto out;
    fails += query(c, bf, 0, FSDP2_F32, FSDP2_BF16, "bf16 with cast");
    fails += query(c, bf, 0, FSDP2_F64, FSDP2_BF16, "bf16 with cast");
    fails += query(c, bf, 0, FSDP2_BF16, FSDP2_BF16, "bf16 with cast");
    fails += query(c, bf, 0, FSDP2_I64, FSDP2_I64, "bf16 with cast (integers stay)");
    fails += query(c, bf, 1, FSDP2_BF16, FSDP2_F16, "output_dtype f16");
    fails += query(c, bf, 1, FSDP2_I32, FSDP2_I32, "output_dtype f16 (integers stay)");
    fails += query(c, nocast, 0, FSDP2_F32, FSDP2_F32, "cast_forward_inputs 0");
    fails += query(c, nocast, 1, FSDP2_BF16, FSDP2_BF16, "no output_dtype");
    fails += query(c, unnamed, 0, FSDP2_F16, FSDP2_F16, "no param_dtype");
    fails += query(c, f32, 0, FSDP2_BF16, FSDP2_F32, "param_dtype f32 named");
    fails += query(c, plain, 0, FSDP2_F32, FSDP2_F32, "not sharded");
    fails += query(c, plain, 1, FSDP2_F32, FSDP2_F32, "not sharded");

    /* Casts: f32 -> bf16 bitwise as rounded here; an i64 input copied as it is; an
     * unsharded module copies. */
    fsdp2_tensor_t *src = tensor(c, FSDP2_F32, 4, 6), *dst = tensor(c, FSDP2_BF16, 4, 6);
    fsdp2_tensor_t *isrc = tensor(c, FSDP2_I64, 2, 3), *idst = tensor(c, FSDP2_I64, 2, 3);
    fsdp2_tensor_t *copy = tensor(c, FSDP2_F32, 4, 6), *wide = tensor(c, FSDP2_F16, 4, 6);
    fsdp2_tensor_t *shape = tensor(c, FSDP2_BF16, 6, 4), *back = tensor(c, FSDP2_F16, 4, 6);
    fsdp2_tensor_t *meta = NULL;
    fsdp2_stream_t *current = NULL;
    fails += !src || !dst || !isrc || !idst || !copy || !wide || !shape || !back;
    if (!fails) {
        int64_t sh[2] = {4, 6};
        fails += OK(c, fsdp2_tensor_empty(META, FSDP2_BF16, 2, sh, &meta));
        fails += OK(c, fsdp2_stream_current(CPU, &current));
    }
    for (int64_t k = 0; k < (fails ? 0 : 24); k++)
        ((float *)src->data)[k] = (float)(1.7 * sin(3.1 * (double)k + 0.2)) * 1000.0f;
    for (int64_t k = 0; k < (fails ? 0 : 6); k++)
        ((int64_t *)isrc->data)[k] = (int64_t)1 << (40 + k);
    fails += fails ? 0 : OK(c, fsdp2_cast_forward_input(bf, src, dst));
    fails += fails ? 0 : OK(c, fsdp2_cast_forward_input(bf, isrc, idst));
    fails += fails ? 0 : OK(c, fsdp2_cast_forward_input(plain, src, copy));
    fails += fails ? 0 : OK(c, fsdp2_cast_forward_output(bf, dst, back));
    fails += fails ? 0 : OK(c, fsdp2_stream_synchronize(current));
    for (int64_t k = 0; k < (fails ? 0 : 24); k++) {
        float v = ((const float *)src->data)[k];
        uint16_t got = ((const uint16_t *)dst->data)[k];
        fails += RANK_CHECK(c, got == to_bf16(v),
                            "element %lld: %.9g cast to bf16 0x%04x, want 0x%04x", (long long)k,
                            v, got, to_bf16(v));
        fails += RANK_CHECK(c, ((const float *)copy->data)[k] == v,
                            "element %lld: the unsharded module's copy is %.9g, want %.9g",
                            (long long)k, ((const float *)copy->data)[k], v);
        if (fails)
            break;
    }
    for (int64_t k = 0; k < (fails ? 0 : 6); k++)
        fails += RANK_CHECK(c, ((int64_t *)idst->data)[k] == ((int64_t *)isrc->data)[k],
                            "i64 element %lld changed", (long long)k);

    /* Malformed calls, each named. */
    if (!fails) {
        fails += REFUSED(c, fsdp2_cast_forward_input(bf, src, wide), FSDP2_ERR_DTYPE_MISMATCH,
                         "destination is f16, but a f32 tensor becomes bf16");
        fails += REFUSED(c, fsdp2_cast_forward_input(bf, src, wide), 0, "'bf'");
        fails += REFUSED(c, fsdp2_cast_forward_input(bf, src, shape), FSDP2_ERR_SHAPE_MISMATCH,
                         "[6,4]");
        fails += REFUSED(c, fsdp2_cast_forward_input(bf, src, meta), FSDP2_ERR_DEVICE_MISMATCH,
                         "device type");
        fails += REFUSED(c, fsdp2_cast_forward_output(bf, dst, copy), FSDP2_ERR_DTYPE_MISMATCH,
                         "becomes f16");
        fails += REFUSED(c, fsdp2_cast_forward_input(bf, NULL, dst), FSDP2_ERR_INVALID_ARGUMENT,
                         "NULL");
        fails += REFUSED(c, fsdp2_cast_forward_output(NULL, dst, back),
                         FSDP2_ERR_INVALID_ARGUMENT, "NULL");
        fsdp2_dtype_t d;
        fails += REFUSED(c, fsdp2_forward_input_dtype(bf, (fsdp2_dtype_t)42, &d),
                         FSDP2_ERR_INVALID_ARGUMENT, "dtype 42");
        fails += REFUSED(c, fsdp2_forward_output_dtype(bf, FSDP2_F32, NULL),
                         FSDP2_ERR_INVALID_ARGUMENT, "NULL");
    }
    fsdp2_tensor_release(src);
    fsdp2_tensor_release(dst);
    fsdp2_tensor_release(isrc);
    fsdp2_tensor_release(idst);
    fsdp2_tensor_release(copy);
    fsdp2_tensor_release(wide);
    fsdp2_tensor_release(shape);
    fsdp2_tensor_release(back);
    fsdp2_tensor_release(meta);
out:
    for (fsdp2_module_t **m = (fsdp2_module_t *[]){bf, nocast, unnamed, f32, plain, NULL}; *m; m++)
        fails += OK(c, fsdp2_module_destroy(*m));
    fails += OK(c, fsdp2_mesh_destroy(r->mesh));
    free(r);
    return fails;
}

/* ---------------------------------------------------------------------------------- */
/* Options of another size                                                             */

/* No smaller options struct was ever released: the sizes the struct had before mixed
 * precision and before output_dtype (with its tail padding), and any other size but
 * sizeof, are refused naming the size, and the module can still be sharded after. */
static int body_old_options(rank_ctx_t *c)
{
    run_t *r = malloc(sizeof(*r));
    fsdp2_module_t *odd = NULL;
    int fails = run_open(c, r);
    fails += fails ? 0 : lone_module(r, "odd", NULL, &odd);
    if (!fails) {
        const unsigned sizes[] = {offsetof(fsdp2_shard_options_t, mp),
                                  offsetof(fsdp2_shard_options_t, mp.output_dtype),
                                  sizeof(fsdp2_shard_options_t) - 4,
                                  sizeof(fsdp2_shard_options_t) + 8};
        for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
            fsdp2_shard_options_t bad = FSDP2_SHARD_OPTIONS_INIT;
            bad.mesh = r->mesh;
            bad.size = sizes[i];
            char needle[64];
            snprintf(needle, sizeof(needle), "options size %u", bad.size);
            fails += REFUSED(c, fsdp2_fully_shard(odd, &bad), FSDP2_ERR_INVALID_ARGUMENT, needle);
        }
        fsdp2_shard_options_t good = FSDP2_SHARD_OPTIONS_INIT;
        good.mesh = r->mesh;
        fails += OK(c, fsdp2_fully_shard(odd, &good));
    }
    fails += OK(c, fsdp2_module_destroy(odd));
    fails += OK(c, fsdp2_mesh_destroy(r->mesh));
    free(r);
    return fails;
}

/* ---------------------------------------------------------------------------------- */
/* Offload on a cpu device                                                             */

/* How many lines of the file hold needle. */
static int lines_with(const char *path, const char *needle)
{
    FILE *f = fopen(path, "r");
    char line[1024];
    int n = 0;
    while (f && fgets(line, sizeof(line), f))
        n += strstr(line, needle) != NULL;
    if (f)
        fclose(f);
    return n;
}

static int probe_offload(run_t *r, probe_point_t at, int layer)
{
    (void)layer;
    return probe_memory(r, at);
}

/* Trains STEPS steps (the SGD reference) with offload_params as given, the allocator's
 * peak equal to the plan in each; the plan out. */
static int train_offload(rank_ctx_t *c, int offload, fsdp2_memory_plan_t *plan, int *said)
{
    run_t *r = malloc(sizeof(*r));
    char log[64];
    snprintf(log, sizeof(log), "/tmp/fsdp2-offload-%d-%d.log", (int)getpid(), offload);
    int fails = run_open(c, r);
    build_options_t bo = BUILD_DEFAULT;
    bo.shard = SHARD_BY_CALLER;
    fails += fails ? 0 : build_model(r, &bo);
    r->opts.offload.offload_params = offload;
    fflush(stderr);
    int saved = dup(2), fd = open(log, O_CREAT | O_TRUNC | O_WRONLY, 0600);
    fails += RANK_CHECK(c, saved >= 0 && fd >= 0, "cannot capture stderr into %s", log);
    if (!fails)
        dup2(fd, 2);
    r->allocated_before_shard = cpu_allocated(r, NULL);
    for (int l = 0; l < LAYERS && !fails; l++)
        fails += OK(c, fsdp2_fully_shard(r->fc[l], &r->opts));
    fails += fails ? 0 : OK(c, fsdp2_fully_shard(r->root, &r->opts));
    r->allocated_after_shard = cpu_allocated(r, NULL);
    fflush(stderr);
    if (saved >= 0) {
        dup2(saved, 2);
        close(saved);
    }
    if (fd >= 0)
        close(fd);
    *said = lines_with(log, "offload_params");
    unlink(log);
    fails += run_bind_hooks(r);
    fails += fails ? 0 : plan_memory(r, plan);
    r->probe = probe_offload;
    ref_model_t ref;
    ref_init(&ref);
    fails += fails ? 0 : run_train(r, &ref, 0, STEPS, 1);
    fails += run_close(r);
    free(r);
    return fails;
}

static int body_offload(rank_ctx_t *c)
{
    fsdp2_memory_plan_t without, with;
    int said_without = 0, said_with = 0;
    int fails = train_offload(c, 0, &without, &said_without);
    fails += fails ? 0 : train_offload(c, 1, &with, &said_with);
    fails += RANK_CHECK(c, said_without == 0 && said_with == 1,
                        "the log names offload_params %d times without offload and %d times with "
                        "it over 4 fully_shard calls, want 0 and 1",
                        said_without, said_with);
    fails += RANK_CHECK(c, with.total == without.total &&
                               with.sharded_params == without.sharded_params,
                        "offload on cpu changed the plan: %llu bytes, %llu without",
                        (unsigned long long)with.total, (unsigned long long)without.total);
    /* Bad values, and cuda shards, refused by name before anything is sharded. */
    run_t *r = malloc(sizeof(*r));
    fails += run_open(c, r);
    build_options_t bo = BUILD_DEFAULT;
    bo.shard = SHARD_BY_CALLER;
    fails += fails ? 0 : build_model(r, &bo);
    if (!fails) {
        fsdp2_shard_options_t o = r->opts;
        o.offload.offload_params = 2;
        fails += REFUSED(c, fsdp2_fully_shard(r->fc[0], &o), FSDP2_ERR_INVALID_ARGUMENT,
                         "offload_params 2");
        o.offload.offload_params = 1;
        o.offload.pin_memory = -1;
        fails += REFUSED(c, fsdp2_fully_shard(r->fc[0], &o), FSDP2_ERR_INVALID_ARGUMENT,
                         "pin_memory -1");
        o.offload.pin_memory = 1;
        o.device.type = FSDP2_DEVICE_CUDA;
        fails += REFUSED(c, fsdp2_fully_shard(r->fc[0], &o), FSDP2_ERR_UNSUPPORTED,
                         "offload of cuda shards");
        fails += RANK_CHECK(c, !state_of(r, r->fc[0]).sharded, "fc1 sharded after refusals");
    }
    fails += run_close(r);
    free(r);
    return fails;
}

START_TEST(forward_casts_at_module_boundaries_match_a_bf16_emulation_bitwise)
{
    run_case(_i, body_boundary, "cast_forward_inputs and output_dtype");
}
END_TEST

START_TEST(boundary_dtypes_and_casts_follow_each_policy_and_refuse_malformed_calls)
{
    run_case(_i, body_queries, "boundary dtype queries and casts");
}
END_TEST

START_TEST(options_of_never_released_sizes_are_refused)
{
    run_case(2, body_old_options, "options of another size");
}
END_TEST

START_TEST(offload_on_cpu_trains_as_without_it_and_says_so_once)
{
    run_case(_i, body_offload, "offload_params on cpu");
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("fsdp_policies");
    TCase *tc = tcase_create("policies");
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, forward_casts_at_module_boundaries_match_a_bf16_emulation_bitwise, 1,
                        5);
    tcase_add_loop_test(tc, boundary_dtypes_and_casts_follow_each_policy_and_refuse_malformed_calls,
                        1, 3);
    tcase_add_test(tc, options_of_never_released_sizes_are_refused);
    tcase_add_loop_test(tc, offload_on_cpu_trains_as_without_it_and_says_so_once, 2, 5);
    suite_add_tcase(s, tc);
    return s;
}

FSDP2_CHECK_MAIN(suite)
