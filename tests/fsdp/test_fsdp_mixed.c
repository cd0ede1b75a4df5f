/* Mixed precision in fully_shard (fsdp2_mp_policy_t) and the reduce-scatter divide
 * factor, with real processes (1 to 4 ranks on a 1D mesh, and on a [ws, 1] HSDP mesh,
 * where the replicas' all-reduce is the whole reduction). A traced step shows the
 * copy-in casts on their own stream, each done before the all-gather that sends it.
 *
 * Under param_dtype = bf16 the test is the application: it reads the whole parameters as
 * bf16 (fsdp2_param_unsharded), computes in double on their f32 values, and adds its
 * gradients into the bf16 views (f32 -> bf16, round to nearest even). The reference that
 * judges it is an emulating one, on one process: per rank, the bf16 rounding of the f32
 * masters, the gradient of that rank's samples, rounded to bf16 the way the rank writes
 * it; then the reduction as fsdp2/group.h defines it for every reduce dtype (summed in
 * f32 in rank order, divided by ws, rounded once to the reduce dtype), added into the
 * zeroed f32 sharded gradients. Every step is therefore compared bitwise: the views,
 * the sharded gradients, the f32 masters. A plain f32 reference (no rounding at all)
 * checks, with a tolerance, that bf16 training still goes where f32 training goes. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <fsdp2/dtype.h>
#include <fsdp2/fsdp.h>

#include <cjson/cJSON.h>
#include <fsdp2/trace.h>
#include <unistd.h>

#include "../core/check_main.h"
#include "mlp_model.h"

#define MIXED_STEPS 4

/* After MIXED_STEPS steps, |bf16-trained - f32-trained| over a tensor, relative to the
 * largest change f32 training made to it. bf16 keeps 8 significant bits: each weight
 * the forward sees and each per-rank gradient is off by up to 2^-9 relative, which moves
 * a gradient by a few 2^-9 (a sum of products of such values), so the update is within
 * about 1e-2 of f32's (measured: at most 7.7e-3, fc3.weight, over ws 1..4); 3e-2 leaves
 * room for that to compound. A missing or doubled reduction is off by 50% or more. The
 * exact check is the bitwise one against the emulation; this one is a sanity bound. */
#define UPDATE_TOLERANCE 3e-2

static float bf16_round(float x)
{
    return fsdp2_bf16_to_f32(fsdp2_f32_to_bf16(x));
}

static int64_t numel_of(int l, int kind)
{
    return (int64_t)DIM[l + 1] * (kind ? 1 : DIM[l]);
}

static float *values_of(ref_model_t *m, int l, int kind)
{
    return kind ? m->b[l] : m->w[l];
}

static const char *kind_name(int kind)
{
    return kind ? "bias" : "weight";
}

/* ---------------------------------------------------------------------------------- */
/* The emulating reference                                                             */

/* What a rank writes into its bf16 gradient view: the double gradient as f32, added
 * into the zeroed bf16 value, rounded. */
static float written_grad(double v)
{
    return bf16_round(fsdp2_bf16_to_f32(0) + (float)v);
}

/* The reduced gradient of one step under param_dtype bf16 from the f32 masters `emu`
 * (its w, b), into emu's gw, gb: what the library must leave in the f32 sharded
 * gradients (zeroed before the step). */
static void emulate_grads(ref_model_t *emu, int ws, fsdp2_dtype_t reduce, work_t *w)
{
    static ref_model_t seen;
    float acc[LAYERS][2][MAX_OUT * MAX_IN];
    int per_rank = SAMPLES / ws, samples[SAMPLES];
    for (int rank = 0; rank < ws; rank++) {
        memset(&seen, 0, sizeof(seen));
        for (int l = 0; l < LAYERS; l++)
            for (int kind = 0; kind < 2; kind++)
                for (int64_t k = 0; k < numel_of(l, kind); k++)
                    values_of(&seen, l, kind)[k] = bf16_round(values_of(emu, l, kind)[k]);
        for (int s = 0; s < per_rank; s++)
            samples[s] = rank * per_rank + s;
        ref_accumulate(&seen, w, samples, per_rank);
        for (int l = 0; l < LAYERS; l++) {
            for (int kind = 0; kind < 2; kind++) {
                const double *g = kind ? seen.gb[l] : seen.gw[l];
                for (int64_t k = 0; k < numel_of(l, kind); k++) {
                    float v = written_grad(g[k]);
                    acc[l][kind][k] = rank == 0 ? v : acc[l][kind][k] + v; /* f32, rank order */
                }
            }
        }
    }
    for (int l = 0; l < LAYERS; l++) {
        for (int kind = 0; kind < 2; kind++) {
            double *out = kind ? emu->gb[l] : emu->gw[l];
            for (int64_t k = 0; k < numel_of(l, kind); k++) {
                float v = acc[l][kind][k] / (float)ws;
                out[k] = reduce == FSDP2_BF16 ? bf16_round(v) : v;
            }
        }
    }
}

/* ---------------------------------------------------------------------------------- */
/* The rank as a bf16 application                                                     */

/* The whole parameter in param_dtype: bf16, shaped like the declared one, each element
 * the bf16 rounding of the f32 master (bitwise). Its f32 values go to seen. */
static int check_bf16_view(run_t *r, int l, int kind, const float *master, float *seen,
                           const char *where)
{
    rank_ctx_t *c = r->c;
    fsdp2_tensor_t *t = NULL;
    int fails = OK(c, fsdp2_param_unsharded(r->p[l][kind], &t));
    if (fails)
        return fails;
    int64_t n = numel_of(l, kind);
    fails += RANK_CHECK(c, t && t->dtype == FSDP2_BF16 && t->numel == n &&
                               t->ndim == (kind ? 1 : 2) && t->shape[0] == DIM[l + 1] && t->data,
                        "step %d, %s: %s.%s unsharded is %s with %lld elements (%d-D), want bf16 "
                        "with %lld (%d-D)",
                        r->step, where, LAYER_NAME[l], kind_name(kind),
                        t ? fsdp2_dtype_name(t->dtype) : "NULL", t ? (long long)t->numel : -1,
                        t ? t->ndim : -1, (long long)n, kind ? 1 : 2);
    if (fails)
        return fails;
    const uint16_t *bits = t->data;
    for (int64_t k = 0; k < n; k++) {
        uint16_t want = fsdp2_f32_to_bf16(master[k]);
        fails += RANK_CHECK(c, bits[k] == want,
                            "step %d, %s: %s.%s unsharded[%lld] is bf16 0x%04x (%.9g), want "
                            "0x%04x (%.9g) = bf16 of the f32 master %.9g",
                            r->step, where, LAYER_NAME[l], kind_name(kind), (long long)k, bits[k],
                            fsdp2_bf16_to_f32(bits[k]), want, fsdp2_bf16_to_f32(want), master[k]);
        if (fails)
            return fails;
        if (seen)
            seen[k] = fsdp2_bf16_to_f32(bits[k]);
    }
    return fails;
}

/* Adds v into the bf16 gradient view (zeroed by pre_backward). */
static int add_bf16_grad(run_t *r, int l, int kind, const double *v)
{
    rank_ctx_t *c = r->c;
    fsdp2_tensor_t *g = NULL;
    int fails = OK(c, fsdp2_param_grad(r->p[l][kind], &g));
    if (fails)
        return fails;
    int64_t n = numel_of(l, kind);
    fails += RANK_CHECK(c, g && g->dtype == FSDP2_BF16 && g->numel == n && g->data,
                        "step %d: %s.%s grad view is %s with %lld elements, want bf16 with %lld",
                        r->step, LAYER_NAME[l], kind_name(kind),
                        g ? fsdp2_dtype_name(g->dtype) : "NULL", g ? (long long)g->numel : -1,
                        (long long)n);
    if (fails)
        return fails;
    uint16_t *bits = g->data;
    for (int64_t k = 0; k < n; k++) {
        fails += RANK_CHECK(c, bits[k] == 0, "step %d: %s.%s grad[%lld] is 0x%04x after "
                                             "pre_backward, want 0 (zeroed)",
                            r->step, LAYER_NAME[l], kind_name(kind), (long long)k, bits[k]);
        if (fails)
            return fails;
        bits[k] = fsdp2_f32_to_bf16(fsdp2_bf16_to_f32(bits[k]) + (float)v[k]);
    }
    return fails;
}

/* One step's forward and backward through the hooks. The math runs on seen, the f32
 * values of the bf16 views (filled during forward, the same in backward). */
static int bf16_step(run_t *r, ref_model_t *master, ref_model_t *seen)
{
    rank_ctx_t *c = r->c;
    int samples[SAMPLES], n;
    local_samples(r, 0, 1, samples, &n);
    memset(seen, 0, sizeof(*seen));
    int fails = OK(c, fsdp2_pre_forward(r->root));
    for (int l = 0; l < LAYERS && !fails; l++) {
        fails += OK(c, fsdp2_pre_forward(r->fc[l]));
        for (int kind = 0; kind < 2 && !fails; kind++)
            fails += check_bf16_view(r, l, kind, values_of(master, l, kind),
                                     values_of(seen, l, kind), "forward");
        if (!fails)
            fails += OK(c, fsdp2_post_forward(r->fc[l]));
    }
    if (fails)
        return fails;
    fails += OK(c, fsdp2_post_forward(r->root));
    ref_accumulate(seen, &r->work, samples, n);
    fails += OK(c, fsdp2_pre_backward(r->root));
    for (int l = LAYERS - 1; l >= 0 && !fails; l--) {
        fails += OK(c, fsdp2_pre_backward(r->fc[l]));
        if (!fails) /* gathered again for backward: the same bits */
            fails += check_bf16_view(r, l, 0, master->w[l], NULL, "backward");
        if (!fails)
            fails += add_bf16_grad(r, l, 0, seen->gw[l]);
        if (!fails)
            fails += add_bf16_grad(r, l, 1, seen->gb[l]);
        if (!fails)
            fails += OK(c, fsdp2_post_backward(r->fc[l]));
    }
    if (fails)
        return fails;
    fails += OK(c, fsdp2_post_backward(r->root));
    return fails + OK(c, fsdp2_backward_finish(r->root));
}

/* The shards and their gradients stay in the declared f32 under any policy. */
/* The f32 sharded gradients against the emulation's, bitwise. */
static int compare_grads_exact(run_t *r, const ref_model_t *emu)
{
    float want[MAX_OUT * MAX_IN];
    int fails = 0;
    for (int l = 0; l < LAYERS; l++) {
        for (int kind = 0; kind < 2; kind++) {
            const double *g = kind ? emu->gb[l] : emu->gw[l];
            for (int64_t k = 0; k < numel_of(l, kind); k++)
                want[k] = (float)g[k];
            fails += compare_full(r, l, kind, 1, want, 0.0);
        }
    }
    return fails;
}

static int check_sharded_f32(run_t *r)
{
    int fails = 0;
    for (int l = 0; l < LAYERS; l++) {
        for (int kind = 0; kind < 2; kind++) {
            fsdp2_dtensor_t *dt = NULL, *gt = NULL;
            fails += OK(r->c, fsdp2_param_sharded(r->p[l][kind], &dt));
            fails += OK(r->c, fsdp2_param_sharded_grad(r->p[l][kind], &gt));
            if (fails)
                return fails;
            fsdp2_dtensor_info_t pi, gi;
            fails += OK(r->c, fsdp2_dtensor_info(dt, &pi));
            fails += OK(r->c, fsdp2_dtensor_info(gt, &gi));
            fails += RANK_CHECK(r->c, pi.dtype == FSDP2_F32 && gi.dtype == FSDP2_F32,
                                "%s.%s: sharded %s, sharded grad %s; want both f32 (the "
                                "declared dtype)",
                                LAYER_NAME[l], kind_name(kind), fsdp2_dtype_name(pi.dtype),
                                fsdp2_dtype_name(gi.dtype));
        }
    }
    return fails;
}

/* ---------------------------------------------------------------------------------- */
/* The memory plan, in closed form                                                     */

/* What the plan must hold for this model on ws ranks, computed from the shapes: pe and
 * re are the bytes of param_dtype and reduce_dtype (the shards stay f32). */
static uint64_t max_shard_numel(int ws)
{
    uint64_t max_shard = 0;
    for (int l = 0; l < LAYERS; l++) {
        uint64_t shard = (uint64_t)((DIM[l + 1] + ws - 1) / ws) * (DIM[l] + 1);
        max_shard = shard > max_shard ? shard : max_shard;
    }
    return max_shard;
}

static fsdp2_memory_plan_t expected_plan(int ws, size_t pe, size_t re)
{
    fsdp2_memory_plan_t p;
    memset(&p, 0, sizeof(p));
    uint64_t max_shard = 0, max_full = 0, sum_full = 0, shards = 0;
    for (int l = 0; l < LAYERS; l++) {
        uint64_t shard = (uint64_t)((DIM[l + 1] + ws - 1) / ws) * (DIM[l] + 1);
        uint64_t full = (uint64_t)DIM[l + 1] * (DIM[l] + 1);
        max_shard = shard > max_shard ? shard : max_shard;
        max_full = full > max_full ? full : max_full;
        sum_full += full;
        shards += shard;
    }
    int cast = pe != 4;
    p.sharded_params = p.sharded_grads = 4 * shards;
    if (ws > 1) /* a ring of two (ws x padded shard), plus the two cast shards the
                   all-gathers send (one being cast while the other is sent) */
        p.unsharded_params = 2 * ws * max_shard * pe + (cast ? 2 * max_shard * pe : 0);
    else /* one rank: the shard is the parameters; cast, each group its own bf16 copy */
        p.unsharded_params = cast ? sum_full * pe : 0;
    p.unsharded_grads = 2 * max_full * pe;
    p.reduce_scatter = ws > 1 ? (uint64_t)ws * max_shard * re : 0; /* in place */
    p.total = p.sharded_params + p.sharded_grads + p.unsharded_params + p.unsharded_grads +
              p.reduce_scatter;
    return p;
}

static int check_plan(run_t *r, const char *what, const fsdp2_memory_plan_t *got,
                      const fsdp2_memory_plan_t *want)
{
    return RANK_CHECK(
        r->c,
        got->sharded_params == want->sharded_params && got->sharded_grads == want->sharded_grads &&
            got->unsharded_params == want->unsharded_params &&
            got->unsharded_grads == want->unsharded_grads &&
            got->reduce_scatter == want->reduce_scatter && got->total == want->total,
        "%s plan (sharded params, grads, unsharded params, grads, reduce-scatter, total): got "
        "%llu %llu %llu %llu %llu %llu, want %llu %llu %llu %llu %llu %llu",
        what, (unsigned long long)got->sharded_params, (unsigned long long)got->sharded_grads,
        (unsigned long long)got->unsharded_params, (unsigned long long)got->unsharded_grads,
        (unsigned long long)got->reduce_scatter, (unsigned long long)got->total,
        (unsigned long long)want->sharded_params, (unsigned long long)want->sharded_grads,
        (unsigned long long)want->unsharded_params, (unsigned long long)want->unsharded_grads,
        (unsigned long long)want->reduce_scatter, (unsigned long long)want->total);
}

static int plan_of(run_t *r, fsdp2_memory_plan_t *plan)
{
    memset(plan, 0, sizeof(*plan));
    plan->size = sizeof(*plan);
    return OK(r->c, fsdp2_memory_plan(r->root, plan));
}

/* The f32 model's plan (no policy), as the reference the bf16 plan shrinks from. */
static int f32_plan(rank_ctx_t *c, fsdp2_memory_plan_t *plan)
{
    run_t *r = malloc(sizeof(*r));
    int fails = run_open(c, r);
    build_options_t bo = BUILD_DEFAULT;
    if (!fails)
        fails += build_model(r, &bo);
    if (!fails)
        fails += plan_of(r, plan);
    fsdp2_memory_plan_t want = expected_plan(c->size, 4, 4);
    if (!fails)
        fails += check_plan(r, "f32", plan, &want);
    fails += run_close(r);
    free(r);
    return fails;
}

/* The bf16 plan: the closed form, and against the f32 model's plan the shards the same,
 * the unsharded parameters and gradients half (the ring holds bf16) plus the two cast
 * shards the all-gathers send, the staging half only when the reduction is in bf16. Planning
 * allocates the plan's non-shard bytes; *planned is then what stays allocated. */
static int check_bf16_plan(run_t *r, const fsdp2_memory_plan_t *f32, fsdp2_dtype_t reduce,
                           uint64_t *planned)
{
    rank_ctx_t *c = r->c;
    fsdp2_memory_plan_t plan;
    uint64_t before = cpu_allocated(r, NULL);
    int fails = plan_of(r, &plan);
    *planned = cpu_allocated(r, NULL);
    if (fails)
        return fails;
    fsdp2_memory_plan_t want = expected_plan(c->size, 2, reduce == FSDP2_BF16 ? 2 : 4);
    fails += check_plan(r, "bf16", &plan, &want);
    uint64_t send = 2 * 2 * max_shard_numel(c->size);
    uint64_t want_rs = reduce == FSDP2_BF16 ? f32->reduce_scatter / 2 : f32->reduce_scatter;
    if (c->size > 1)
        fails += RANK_CHECK(c, plan.sharded_params == f32->sharded_params &&
                                   plan.unsharded_params == f32->unsharded_params / 2 + send &&
                                   plan.unsharded_grads == f32->unsharded_grads / 2 &&
                                   plan.reduce_scatter == want_rs,
                            "bf16 vs f32 plan: sharded params %llu vs %llu, unsharded params "
                            "%llu vs %llu (want half + the %llu bytes of two cast shards), grads %llu "
                            "vs %llu (want half), staging %llu vs %llu (want %llu)",
                            (unsigned long long)plan.sharded_params,
                            (unsigned long long)f32->sharded_params,
                            (unsigned long long)plan.unsharded_params,
                            (unsigned long long)f32->unsharded_params, (unsigned long long)send,
                            (unsigned long long)plan.unsharded_grads,
                            (unsigned long long)f32->unsharded_grads,
                            (unsigned long long)plan.reduce_scatter,
                            (unsigned long long)f32->reduce_scatter, (unsigned long long)want_rs);
    uint64_t non_shard = plan.total - plan.sharded_params - plan.sharded_grads;
    return fails + RANK_CHECK(c, *planned - before == non_shard,
                              "planning allocated %llu bytes, the plan's non-shard bytes are %llu",
                              (unsigned long long)(*planned - before),
                              (unsigned long long)non_shard);
}

/* ---------------------------------------------------------------------------------- */
/* The training bodies                                                                 */

static int build_mixed(run_t *r, fsdp2_mp_policy_t mp)
{
    build_options_t bo = BUILD_DEFAULT;
    bo.shard = SHARD_BY_CALLER;
    int fails = build_model(r, &bo);
    r->opts.mp = mp;
    for (int l = 0; l < LAYERS && !fails; l++)
        fails += OK(r->c, fsdp2_fully_shard(r->fc[l], &r->opts));
    if (!fails)
        fails += OK(r->c, fsdp2_fully_shard(r->root, &r->opts));
    return fails + (fails ? 0 : run_bind_hooks(r));
}

/* max |got - ref| over a tensor against the largest |ref - init|: see UPDATE_TOLERANCE. */
static int compare_updates(run_t *r, const ref_model_t *f32ref)
{
    ref_model_t init;
    ref_init(&init);
    int fails = 0;
    for (int l = 0; l < LAYERS; l++) {
        for (int kind = 0; kind < 2; kind++) {
            fsdp2_dtensor_t *dt = NULL;
            fsdp2_tensor_t *full = NULL;
            fails += OK(r->c, fsdp2_param_sharded(r->p[l][kind], &dt));
            if (!fails)
                fails += OK(r->c, fsdp2_dtensor_full_tensor(dt, NULL, &full));
            if (fails)
                return fails;
            const float *got = full->data;
            const float *want = values_of((ref_model_t *)f32ref, l, kind);
            const float *start = values_of(&init, l, kind);
            double worst = 0, moved = 0;
            int64_t at = 0;
            for (int64_t k = 0; k < numel_of(l, kind); k++) {
                double e = fabs((double)got[k] - want[k]), m = fabs((double)want[k] - start[k]);
                moved = m > moved ? m : moved;
                if (e > worst || isnan(e)) {
                    worst = isnan(e) ? INFINITY : e;
                    at = k;
                }
            }
            fails += RANK_CHECK(r->c, worst <= UPDATE_TOLERANCE * moved,
                                "after %d bf16 steps %s.%s[%lld] is %.9g, f32 training %.9g: "
                                "off by %.3g, more than %.0e of the largest update %.3g",
                                MIXED_STEPS, LAYER_NAME[l], kind_name(kind), (long long)at,
                                got[at], want[at], worst, UPDATE_TOLERANCE, moved);
            fsdp2_tensor_release(full);
        }
    }
    return fails;
}

/* ---------------------------------------------------------------------------------- */
/* Copy-in on its own stream, as the trace of a step shows it                         */

typedef struct timed {
    double ts, end;
    int tid;
} timed_t;

static int by_start(const void *a, const void *b)
{
    double x = ((const timed_t *)a)->ts, y = ((const timed_t *)b)->ts;
    return (x > y) - (x < y);
}

static const char *trace_text(const cJSON *o, const char *key)
{
    const cJSON *v = o ? cJSON_GetObjectItemCaseSensitive(o, key) : NULL;
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static double trace_num(const cJSON *o, const char *key)
{
    const cJSON *v = o ? cJSON_GetObjectItemCaseSensitive(o, key) : NULL;
    return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

/* In this rank's trace of one step (ws > 1): each layer's copy-ins (the casts into the
 * send buffers) ran on the track "fsdp-all-gather-copy-in", its all-gathers on
 * "fsdp-all-gather", one copy-in per all-gather, each ending before its all-gather
 * began (events in a file are in time order per track); and a cast into a send buffer
 * began only after the all-gather that last sent from it ended. */
static int check_copy_in_trace(rank_ctx_t *c, const char *path)
{
    FILE *f = fopen(path, "rb");
    int fails = RANK_CHECK(c, f != NULL, "cannot open the trace %s", path);
    if (!f)
        return fails;
    static char buf[4 << 20];
    size_t len = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[len] = '\0';
    cJSON *root = cJSON_Parse(buf);
    const cJSON *events = root ? cJSON_GetObjectItemCaseSensitive(root, "traceEvents") : NULL;
    const cJSON *e;
    char names[64][48] = {{0}};
    cJSON_ArrayForEach(e, events)
    {
        int tid = (int)trace_num(e, "tid");
        const char *n = trace_text(cJSON_GetObjectItemCaseSensitive(e, "args"), "name");
        const char *ph = trace_text(e, "ph"), *what = trace_text(e, "name");
        if (ph && !strcmp(ph, "M") && what && !strcmp(what, "thread_name") && n && tid >= 0 &&
            tid < 64)
            snprintf(names[tid], sizeof(names[tid]), "%s", n);
    }
    for (int l = 0; l < LAYERS; l++) {
        timed_t copies[8], gathers[8];
        int nc = 0, ng = 0;
        cJSON_ArrayForEach(e, events)
        {
            const char *cat = trace_text(e, "cat"), *ph = trace_text(e, "ph");
            const char *module = trace_text(cJSON_GetObjectItemCaseSensitive(e, "args"), "module");
            if (!cat || !ph || strcmp(ph, "X") || !module || strcmp(module, LAYER_NAME[l]))
                continue;
            timed_t t = {trace_num(e, "ts"), trace_num(e, "ts") + trace_num(e, "dur"),
                         (int)trace_num(e, "tid")};
            if (t.tid < 0 || t.tid >= 64)
                continue;
            if (!strcmp(cat, "copy_in") && nc < 8)
                copies[nc++] = t;
            if (!strcmp(cat, "all_gather") && ng < 8)
                gathers[ng++] = t;
        }
        fails += RANK_CHECK(c, ng == 2 && nc == ng,
                            "%s: %d copy-ins and %d all-gathers in the traced step, want 2 each",
                            LAYER_NAME[l], nc, ng);
        for (int i = 0; i < nc && i < ng && !fails; i++) {
            fails += RANK_CHECK(c, !strcmp(names[copies[i].tid], "fsdp-all-gather-copy-in") &&
                                       !strcmp(names[gathers[i].tid], "fsdp-all-gather"),
                                "%s: copy-in %d on track '%s', its all-gather on '%s'",
                                LAYER_NAME[l], i, names[copies[i].tid], names[gathers[i].tid]);
            fails += RANK_CHECK(c, copies[i].end <= gathers[i].ts,
                                "%s: copy-in %d ends at %.3f us, after its all-gather began "
                                "(%.3f us)",
                                LAYER_NAME[l], i, copies[i].end, gathers[i].ts);
        }
    }
    /* The send buffers alternate: the cast into one waits for the all-gather that sent
     * from it last, two all-gathers back (both streams run in issue order, so the i-th
     * copy-in of the step feeds its i-th all-gather). */
    timed_t copies[16], gathers[16];
    int nc = 0, ng = 0;
    cJSON_ArrayForEach(e, events)
    {
        const char *cat = trace_text(e, "cat"), *ph = trace_text(e, "ph");
        if (!cat || !ph || strcmp(ph, "X"))
            continue;
        timed_t t = {trace_num(e, "ts"), trace_num(e, "ts") + trace_num(e, "dur"), 0};
        if (!strcmp(cat, "copy_in") && nc < 16)
            copies[nc++] = t;
        if (!strcmp(cat, "all_gather") && ng < 16)
            gathers[ng++] = t;
    }
    qsort(copies, (size_t)nc, sizeof(timed_t), by_start);
    qsort(gathers, (size_t)ng, sizeof(timed_t), by_start);
    for (int i = 2; i < nc && i - 2 < ng && !fails; i++)
        fails += RANK_CHECK(c, copies[i].ts >= gathers[i - 2].end,
                            "copy-in %d of the step starts at %.3f us, before the all-gather "
                            "that last sent from its buffer ended (%.3f us)",
                            i, copies[i].ts, gathers[i - 2].end);
    cJSON_Delete(root);
    return fails;
}

/* Steps under {bf16, reduce}, each compared bitwise with the emulating reference; with
 * memory, the plan against the closed form and the f32 plan, and no allocation inside
 * a step. */
static int mixed_training_on(rank_ctx_t *c, fsdp2_dtype_t reduce_dtype, int memory,
                             int replicas)
{
    fsdp2_memory_plan_t f32 = {0};
    int fails = memory ? f32_plan(c, &f32) : 0;
    run_t *r = malloc(sizeof(*r));
    ref_model_t *emu = malloc(sizeof(*emu)), *f32ref = malloc(sizeof(*f32ref));
    ref_model_t *seen = malloc(sizeof(*seen));
    work_t *refwork = malloc(sizeof(*refwork));
    fsdp2_dtype_t reduce = reduce_dtype == FSDP2_DTYPE_COUNT ? FSDP2_BF16 : reduce_dtype;
    fails += replicas > 1 ? run_open_2d(c, r, replicas) : run_open(c, r);
    fsdp2_mp_policy_t mp = {FSDP2_BF16, reduce_dtype, FSDP2_DTYPE_COUNT, 1};
    if (!fails)
        fails += build_mixed(r, mp);
    if (!fails)
        fails += check_sharded_f32(r);
    ref_init(emu);
    ref_init(f32ref);
    uint64_t planned = 0;
    if (!fails && memory)
        fails += check_bf16_plan(r, &f32, reduce, &planned);
    for (int s = 0; s < MIXED_STEPS && !fails; s++) {
        r->step = s;
        for (int l = 0; l < LAYERS; l++) { /* the f32 masters, bitwise the emulation's */
            fails += compare_full(r, l, 0, 0, emu->w[l], 0.0);
            fails += compare_full(r, l, 1, 0, emu->b[l], 0.0);
        }
        if (memory)
            fails += OK(c, fsdp2_memory_stats_reset_peak(CPU));
        /* Step 1 traced (with memory, at ws > 1): copy-in on its own stream. */
        /* Without a context or launcher variables each rank traces as a world of one,
         * so each gets a path of its own. */
        char trace[96];
        int traced = memory && s == 1 && c->size > 1;
        snprintf(trace, sizeof(trace), "/tmp/fsdp2-mixed-trace-%d-%d-%d.json", (int)getppid(),
                 (int)reduce, c->rank);
        if (traced && !fails)
            fails += OK(c, fsdp2_trace_start(NULL, trace));
        if (!fails)
            fails += bf16_step(r, emu, seen);
        if (traced) {
            fails += OK(c, fsdp2_module_synchronize(r->root));
            fails += OK(c, fsdp2_trace_stop(NULL));
            if (!fails)
                fails += check_copy_in_trace(c, trace);
            unlink(trace);
        }
        if (fails)
            break;
        if (memory) {
            uint64_t peak = 0, now = cpu_allocated(r, &peak);
            fails += RANK_CHECK(c, peak == planned && now == planned,
                                "step %d: cpu peak %llu and live %llu bytes, want both %llu (as "
                                "planned)",
                                s, (unsigned long long)peak, (unsigned long long)now,
                                (unsigned long long)planned);
        }
        emulate_grads(emu, c->size, reduce, refwork);
        fails += compare_grads_exact(r, emu);
        fails += run_sgd(r);
        ref_sgd(emu);
        int all[SAMPLES], n_all;
        global_samples(c->size, 0, 1, all, &n_all);
        ref_accumulate(f32ref, refwork, all, n_all);
        ref_sgd(f32ref);
    }
    if (!fails)
        fails += compare_updates(r, f32ref);
    fails += run_close(r);
    free(refwork);
    free(seen);
    free(f32ref);
    free(emu);
    free(r);
    return fails;
}

static int mixed_training(rank_ctx_t *c, fsdp2_dtype_t reduce_dtype, int memory)
{
    return mixed_training_on(c, reduce_dtype, memory, 1);
}

/* f32, no policy: with a divide factor f each rank's gradient is divided by f and the
 * results summed, so the sharded gradient is ws / f times the average; f = ws is the
 * average, f = 0 goes back to it. The steps train on, each compared with the reference
 * (whose gradient is scaled the same way). */
static int body_divide_factor(rank_ctx_t *c)
{
    run_t *r = malloc(sizeof(*r));
    work_t *refwork = malloc(sizeof(*refwork));
    int fails = run_open(c, r);
    build_options_t bo = BUILD_DEFAULT;
    if (!fails)
        fails += build_model(r, &bo);
    ref_model_t ref;
    ref_init(&ref);
    const double factors[] = {c->size, 2, 0};
    for (int s = 0; s < 3 && !fails; s++) {
        r->step = s;
        double f = factors[s];
        for (int l = 0; l < LAYERS; l++)
            fails += OK(c, fsdp2_set_reduce_scatter_divide_factor(r->fc[l], f));
        fails += run_micro_batch(r, &ref, refwork, 0, 1);
        if (fails)
            break;
        double scale = f == 0 ? 1.0 : c->size / f;
        for (int l = 0; l < LAYERS; l++) {
            for (int k = 0; k < DIM[l + 1] * DIM[l]; k++)
                ref.gw[l][k] *= scale;
            for (int k = 0; k < DIM[l + 1]; k++)
                ref.gb[l][k] *= scale;
        }
        if (fails += compare_grads(r, &ref))
            fprintf(stderr, "rank %d/%d: step %d: divide factor %g, want %g x the average\n",
                    c->rank, c->size, s, f, scale);
        fails += run_sgd(r);
        ref_sgd(&ref);
        fails += compare_params(r, &ref);
    }
    if (!fails)
        fails += REFUSED(c, fsdp2_set_reduce_scatter_divide_factor(r->fc[0], -1.0),
                         FSDP2_ERR_INVALID_ARGUMENT, "-1");
    fails += run_close(r);
    free(refwork);
    free(r);
    return fails;
}

/* A policy naming a dtype that is not floating is refused before anything is sharded,
 * naming the field and the dtype; the module stays unsharded with its declared values,
 * and a valid policy then shards it. */
static int body_invalid_policy(rank_ctx_t *c)
{
    run_t *r = malloc(sizeof(*r));
    int fails = run_open(c, r);
    build_options_t bo = BUILD_DEFAULT;
    bo.shard = SHARD_BY_CALLER;
    if (!fails)
        fails += build_model(r, &bo);
    if (fails)
        goto out;
    const struct {
        fsdp2_mp_policy_t mp;
        const char *field, *dtype;
    } bad[] = {
        {{FSDP2_I32, FSDP2_DTYPE_COUNT, FSDP2_DTYPE_COUNT, 1}, "param_dtype", "i32"},
        {{FSDP2_BF16, FSDP2_I64, FSDP2_DTYPE_COUNT, 1}, "reduce_dtype", "i64"},
        {{FSDP2_U8, FSDP2_F32, FSDP2_DTYPE_COUNT, 1}, "param_dtype", "u8"},
        {{(fsdp2_dtype_t)42, FSDP2_DTYPE_COUNT, FSDP2_DTYPE_COUNT, 1}, "param_dtype", "42"},
        {{FSDP2_BF16, FSDP2_F32, FSDP2_I64, 1}, "output_dtype", "i64"},
        {{FSDP2_BF16, FSDP2_F32, FSDP2_F32, 2}, "cast_forward_inputs", "2"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        r->opts.mp = bad[i].mp;
        fails += REFUSED(c, fsdp2_fully_shard(r->fc[0], &r->opts), FSDP2_ERR_INVALID_ARGUMENT,
                         bad[i].field);
        const char *msg = fsdp2_last_error();
        fails += RANK_CHECK(c, strstr(msg, bad[i].dtype) != NULL,
                            "policy %zu: message '%s' does not name the dtype '%s'", i, msg,
                            bad[i].dtype);
        fsdp2_module_state_t st = state_of(r, r->fc[0]);
        fails += RANK_CHECK(c, st.sharded == 0, "policy %zu: fc1 sharded %d after the refusal",
                            i, st.sharded);
    }
    fsdp2_mp_policy_t good = {FSDP2_BF16, FSDP2_F32, FSDP2_DTYPE_COUNT, 1};
    r->opts.mp = good;
    for (int l = 0; l < LAYERS && !fails; l++)
        fails += OK(c, fsdp2_fully_shard(r->fc[l], &r->opts));
    if (!fails)
        fails += OK(c, fsdp2_fully_shard(r->root, &r->opts));
    ref_model_t ref;
    ref_init(&ref);
    for (int l = 0; l < LAYERS && !fails; l++) { /* the refusals lost no declared value */
        fails += compare_full(r, l, 0, 0, ref.w[l], 0.0);
        fails += compare_full(r, l, 1, 0, ref.b[l], 0.0);
    }
out:
    fails += run_close(r);
    free(r);
    return fails;
}

static int body_bf16(rank_ctx_t *c)
{
    return mixed_training(c, FSDP2_DTYPE_COUNT, 0);
}

static int body_bf16_reduce_f32(rank_ctx_t *c)
{
    return mixed_training(c, FSDP2_F32, 0);
}

/* [ws, 1]: nothing to reduce-scatter, the replicas' all-reduce is the whole reduction,
 * and it is the same reduction in reduce_dtype (group.h sums every collective in rank
 * order). */
static int body_replicated_reduce_f32(rank_ctx_t *c)
{
    return mixed_training_on(c, FSDP2_F32, 0, c->size);
}

static int body_memory(rank_ctx_t *c)
{
    return mixed_training(c, FSDP2_DTYPE_COUNT, 1) + mixed_training(c, FSDP2_F32, 1);
}

/* ---------------------------------------------------------------------------------- */

START_TEST(bf16_views_are_the_rounded_f32_masters_and_bf16_reduction_is_exact)
{
    run_case(_i, body_bf16, "bf16 parameters, bf16 reduction");
}
END_TEST

START_TEST(bf16_gradients_reduced_in_f32_are_the_f32_average_of_the_rank_gradients)
{
    run_case(_i, body_bf16_reduce_f32, "bf16 parameters, f32 reduction");
}
END_TEST

START_TEST(bf16_gradients_on_a_ws_x_1_hsdp_mesh_are_reduced_in_f32_as_on_a_1d_mesh)
{
    run_case(_i, body_replicated_reduce_f32, "bf16 parameters, f32 reduction, [ws, 1] mesh");
}
END_TEST

START_TEST(the_divide_factor_sums_gradients_divided_by_it)
{
    run_case(_i, body_divide_factor, "reduce-scatter divide factor");
}
END_TEST

START_TEST(the_bf16_plan_halves_the_unsharded_buffers_and_no_step_allocates)
{
    run_case(_i, body_memory, "bf16 memory plan");
}
END_TEST

START_TEST(a_policy_with_a_non_floating_dtype_is_refused_naming_it)
{
    run_case(_i, body_invalid_policy, "invalid policy");
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("fsdp_mixed");
    TCase *tc = tcase_create("mixed");
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, bf16_views_are_the_rounded_f32_masters_and_bf16_reduction_is_exact, 1, 5);
    tcase_add_loop_test(tc, bf16_gradients_reduced_in_f32_are_the_f32_average_of_the_rank_gradients, 1, 5);
    tcase_add_loop_test(tc, bf16_gradients_on_a_ws_x_1_hsdp_mesh_are_reduced_in_f32_as_on_a_1d_mesh,
                        2, 5);
    tcase_add_loop_test(tc, the_divide_factor_sums_gradients_divided_by_it, 1, 5);
    tcase_add_loop_test(tc, the_bf16_plan_halves_the_unsharded_buffers_and_no_step_allocates, 1, 5);
    tcase_add_loop_test(tc, a_policy_with_a_non_floating_dtype_is_refused_naming_it, 1, 5);
    suite_add_tcase(s, tc);
    return s;
}

FSDP2_CHECK_MAIN(suite)
