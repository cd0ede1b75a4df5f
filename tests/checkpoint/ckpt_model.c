/* See ckpt_model.h. */
#include "ckpt_model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *const STATE_NAME[2] = {"exp_avg", "exp_avg_sq"};

static const fsdp2_device_t CPU = FSDP2_DEVICE_CPU_INIT;
static const fsdp2_device_t META = FSDP2_DEVICE_META_INIT;
static const char *const MODULE_NAME[3] = {"enc", "head", "conv"};

static const param_spec_t ENC_WEIGHT = {"enc", "weight", "enc.weight", FSDP2_F32, 2, {7, 13}, 0};
static const param_spec_t ENC_BIAS = {"enc", "bias", "enc.bias", FSDP2_F32, 1, {5}, 1};
static const param_spec_t HEAD_WEIGHT = {"head", "weight", "head.weight", FSDP2_F32, 2, {3, 5}, 2};
static const param_spec_t CONV_KERNEL = {"conv", "kernel", "conv.kernel", FSDP2_F64, 3,
                                         {4, 2, 3}, 3};
static const param_spec_t HEAD_PROJ = {"head", "proj", "head.proj", FSDP2_F32, 2, {1000, 600}, 5};
const param_spec_t WHOLE_SPEC[NUM_WHOLE] = {
    {"enc", "running", "enc.running", FSDP2_F32, 1, {6}, -1},
    {"", "scale", "scale", FSDP2_F32, 1, {4}, -1},
};
static const param_spec_t CONV_KERNEL_F32 = {"conv", "kernel", "conv.kernel", FSDP2_F32, 3,
                                             {4, 2, 3}, 3};
static const param_spec_t HEAD_BIAS = {"head", "bias", "head.bias", FSDP2_F32, 1, {3}, 4};
static const param_spec_t HEAD_WEIGHT_WIDER = {"head", "weight", "head.weight", FSDP2_F32, 2,
                                               {3, 6}, 2};

int check_ok(const rank_ctx_t *c, fsdp2_status_t s, const char *expr, const char *file, int line)
{
    if (s == FSDP2_SUCCESS)
        return 0;
    fprintf(stderr, "rank %d/%d: %s:%d: %s = %s (%s)\n", c->rank, c->size, file, line, expr,
            fsdp2_status_name(s), fsdp2_last_error());
    return 1;
}

int check_refused(const rank_ctx_t *c, fsdp2_status_t s, fsdp2_status_t want, const char *needle1,
                  const char *needle2, const char *expr, const char *file, int line)
{
    const char *msg = fsdp2_last_error();
    int bad = s == FSDP2_SUCCESS || (want != FSDP2_SUCCESS && s != want) ||
              (needle1 && !strstr(msg, needle1)) || (needle2 && !strstr(msg, needle2));
    if (!bad)
        return 0;
    fprintf(stderr,
            "rank %d/%d: %s:%d: %s = %s, want %s with a message naming '%s'%s%s%s; got '%s'\n",
            c->rank, c->size, file, line, expr, fsdp2_status_name(s),
            want == FSDP2_SUCCESS ? "an error" : fsdp2_status_name(want), needle1 ? needle1 : "",
            needle2 ? " and '" : "", needle2 ? needle2 : "", needle2 ? "'" : "",
            s == FSDP2_SUCCESS ? "(success)" : msg);
    return 1;
}

double value_of(int seed, int slot, int64_t k)
{
    return sin(1.7 * seed + 0.37 * slot + 0.011 * (double)k + 0.5) * (1.0 + slot);
}

void chunk_rows(int64_t n, int ws, int r, int64_t *off, int64_t *len)
{
    int64_t chunk = (n + ws - 1) / ws;
    int64_t s = r * chunk < n ? r * chunk : n;
    int64_t e = (r + 1) * chunk < n ? (r + 1) * chunk : n;
    *off = s;
    *len = e - s;
}

int64_t spec_numel(const param_spec_t *s)
{
    int64_t n = 1;
    for (int d = 0; d < s->ndim; d++)
        n *= s->shape[d];
    return n;
}

int variant_specs(variant_t v, param_spec_t *out)
{
    int n = 0;
    out[n++] = ENC_WEIGHT;
    if (v != VARIANT_MISSING_PARAM)
        out[n++] = ENC_BIAS;
    out[n++] = v == VARIANT_RESHAPED ? HEAD_WEIGHT_WIDER : HEAD_WEIGHT;
    if (v == VARIANT_EXTRA_PARAM)
        out[n++] = HEAD_BIAS;
    out[n++] = HEAD_PROJ;
    out[n++] = v == VARIANT_RETYPED ? CONV_KERNEL_F32 : CONV_KERNEL;
    return n;
}

fsdp2_mesh_t *mesh_open(rank_ctx_t *c, int *fails)
{
    fsdp2_group_options_t go = FSDP2_GROUP_OPTIONS_INIT;
    go.timeout_ms = GROUP_TIMEOUT_MS; /* a rank that fails early must not hang the others */
    int ws = c->size;
    fsdp2_mesh_t *mesh = NULL;
    *fails += OK(c, fsdp2_mesh_create(c->store, "ckpt", c->rank, c->size, 1, &ws, NULL, &go,
                                      &mesh));
    return mesh;
}

/* ---------------------------------------------------------------------------------- */
/* Filling                                                                             */

static void store_value(fsdp2_dtype_t dtype, void *data, int64_t i, double v)
{
    if (dtype == FSDP2_F64)
        ((double *)data)[i] = v;
    else
        ((float *)data)[i] = (float)v;
}

/* local's elements are the global elements from first on (rows of dim 0 are
 * contiguous in the global row-major order). */
static void fill_local(fsdp2_tensor_t *local, int seed, int slot, int64_t first)
{
    for (int64_t i = 0; i < local->numel; i++)
        store_value(local->dtype, local->data, i, value_of(seed, slot, first + i));
}

static int64_t row_numel(int ndim, const int64_t *shape)
{
    int64_t n = 1;
    for (int d = 1; d < ndim; d++)
        n *= shape[d];
    return n;
}

static int fill_dtensor(const rank_ctx_t *c, fsdp2_dtensor_t *dt, int seed, int slot)
{
    fsdp2_dtensor_info_t info;
    fsdp2_tensor_t *local = NULL;
    int fails = OK(c, fsdp2_dtensor_info(dt, &info));
    fails += OK(c, fsdp2_dtensor_to_local(dt, &local));
    if (!fails)
        fill_local(local, seed, slot, info.offset[0] * row_numel(info.ndim, info.shape));
    fsdp2_tensor_release(local);
    return fails;
}

typedef struct init_ctx {
    model_t *m;
    int seed;
    int unknown;
} init_ctx_t;

static fsdp2_status_t init_param(fsdp2_param_t *param, fsdp2_tensor_t *shard,
                                 const int64_t *global_offset, void *ctx)
{
    init_ctx_t *ic = ctx;
    int j = 0;
    while (j < ic->m->np && ic->m->p[j] != param)
        j++;
    if (j == ic->m->np) {
        ic->unknown++;
        return FSDP2_SUCCESS;
    }
    const param_spec_t *s = &ic->m->spec[j];
    fill_local(shard, ic->seed, 3 * s->t, global_offset[0] * row_numel(s->ndim, s->shape));
    return FSDP2_SUCCESS;
}

int model_slot_dtensor(model_t *m, int j, int s, fsdp2_dtensor_t **dt)
{
    *dt = NULL;
    if (s == 0)
        return OK(m->c, fsdp2_param_sharded(m->p[j], dt));
    return OK(m->c, fsdp2_optimizer_state(m->opt, m->p[j], STATE_NAME[s - 1], dt));
}

int model_fill(model_t *m, int seed)
{
    int fails = 0;
    for (int j = 0; j < m->np && !fails; j++) {
        for (int s = 0; s < 3 && !fails; s++) {
            fsdp2_dtensor_t *dt = NULL;
            fails += model_slot_dtensor(m, j, s, &dt);
            if (!fails)
                fails += fill_dtensor(m->c, dt, seed, 3 * m->spec[j].t + s);
        }
    }
    if (!fails)
        for (int i = 0; i < NUM_WHOLE; i++)
            fill_local(m->whole[i], seed, WHOLE_SLOT + i, 0);
    return fails;
}

/* ---------------------------------------------------------------------------------- */
/* The tree                                                                            */

int model_open(rank_ctx_t *c, fsdp2_mesh_t *mesh, variant_t v, int seed, model_t *m)
{
    memset(m, 0, sizeof(*m));
    m->c = c;
    m->mesh = mesh;
    m->np = variant_specs(v, m->spec);
    int fails = OK(c, fsdp2_module_create("", &m->root));
    for (int i = 0; i < 3 && !fails; i++) {
        fails += OK(c, fsdp2_module_create(MODULE_NAME[i], &m->mods[i]));
        if (!fails)
            fails += OK(c, fsdp2_module_add_child(m->root, m->mods[i]));
    }
    for (int j = 0; j < m->np && !fails; j++) {
        const param_spec_t *s = &m->spec[j];
        int i = 0;
        while (strcmp(MODULE_NAME[i], s->module))
            i++;
        fsdp2_tensor_t *t = NULL;
        fails += OK(c, fsdp2_tensor_empty(META, s->dtype, s->ndim, s->shape, &t));
        if (!fails)
            fails += OK(c, fsdp2_module_add_param(m->mods[i], s->name, t, 1, &m->p[j]));
        fsdp2_tensor_release(t);
    }
    const param_spec_t *b = &WHOLE_SPEC[0], *s = &WHOLE_SPEC[1];
    if (!fails)
        fails += OK(c, fsdp2_tensor_empty(CPU, b->dtype, b->ndim, b->shape, &m->whole[0]));
    if (!fails)
        fails += OK(c, fsdp2_module_add_buffer(m->mods[0], b->name, m->whole[0]));
    /* The ignored parameter is the cpu tensor it was declared with. */
    fsdp2_tensor_t *scale = NULL;
    if (!fails)
        fails += OK(c, fsdp2_tensor_empty(CPU, s->dtype, s->ndim, s->shape, &scale));
    if (!fails)
        fails += OK(c, fsdp2_module_add_param(m->root, s->name, scale, 1, &m->scale));
    fsdp2_tensor_release(scale);
    fsdp2_shard_options_t so = FSDP2_SHARD_OPTIONS_INIT;
    so.mesh = mesh;
    for (int i = 0; i < 3 && !fails; i++)
        fails += OK(c, fsdp2_fully_shard(m->mods[i], &so));
    so.ignored_params = &m->scale;
    so.num_ignored_params = 1;
    if (!fails)
        fails += OK(c, fsdp2_fully_shard(m->root, &so));
    if (!fails)
        fails += OK(c, fsdp2_param_unsharded(m->scale, &m->whole[1]));
    init_ctx_t ic = {m, seed, 0};
    if (!fails && seed >= 0)
        fails += OK(c, fsdp2_module_materialize(m->root, init_param, &ic));
    fails += RANK_CHECK(c, ic.unknown == 0, "materialize called init on %d unknown parameters",
                        ic.unknown);
    fsdp2_optimizer_options_t o = FSDP2_ADAMW_OPTIONS_INIT(1e-2);
    if (!fails)
        fails += OK(c, fsdp2_optimizer_create(m->root, &o, &m->opt));
    if (!fails && seed >= 0)
        fails += model_fill(m, seed);
    if (!fails)
        fails += OK(c, fsdp2_state_dict_create(m->root, m->opt, &m->sd));
    return fails;
}

int model_close(model_t *m)
{
    int fails = OK(m->c, fsdp2_state_dict_destroy(m->sd));
    fails += OK(m->c, fsdp2_optimizer_destroy(m->opt));
    if (m->root) {
        fails += OK(m->c, fsdp2_module_synchronize(m->root));
        fails += OK(m->c, fsdp2_module_destroy(m->root));
    }
    fsdp2_tensor_release(m->whole[0]);
    memset(m, 0, sizeof(*m));
    return fails;
}

int model_find(const model_t *m, const char *fqn)
{
    for (int j = 0; j < m->np; j++)
        if (!strcmp(m->spec[j].fqn, fqn))
            return j;
    return -1;
}

/* ---------------------------------------------------------------------------------- */
/* Comparisons                                                                         */

int compare_bits(const rank_ctx_t *c, const char *what, const char *when, fsdp2_dtype_t dtype,
                 const void *got, const void *want, int64_t n)
{
    size_t elem = dtype == FSDP2_F64 ? 8 : 4;
    for (int64_t i = 0; i < n; i++) {
        const char *g = (const char *)got + i * (int64_t)elem, *w = (const char *)want + i * (int64_t)elem;
        if (!memcmp(g, w, elem))
            continue;
        double gv, wv;
        uint64_t gb = 0, wb = 0;
        if (dtype == FSDP2_F64) {
            memcpy(&gv, g, 8);
            memcpy(&wv, w, 8);
            memcpy(&gb, g, 8);
            memcpy(&wb, w, 8);
        } else {
            float gf, wf;
            uint32_t g32, w32;
            memcpy(&gf, g, 4);
            memcpy(&wf, w, 4);
            memcpy(&g32, g, 4);
            memcpy(&w32, w, 4);
            gv = gf;
            wv = wf;
            gb = g32;
            wb = w32;
        }
        return RANK_CHECK(c, 0, "%s: %s[%lld] is %.17g (bits 0x%llx), want %.17g (bits 0x%llx)",
                          when, what, (long long)i, gv, (unsigned long long)gb, wv,
                          (unsigned long long)wb);
    }
    return 0;
}

static int check_values(const rank_ctx_t *c, const char *what, const char *when,
                        const fsdp2_tensor_t *t, const param_spec_t *s, int seed, int slot)
{
    int64_t n = spec_numel(s);
    fsdp2_dtype_t dtype = s->dtype;
    int fails = RANK_CHECK(c, t->numel == n && t->dtype == dtype,
                           "%s: %s has %lld elements of %s, want %lld of %s", when, what,
                           (long long)t->numel, fsdp2_dtype_name(t->dtype), (long long)n,
                           fsdp2_dtype_name(dtype));
    if (fails)
        return fails;
    void *want = malloc((size_t)n * 8);
    for (int64_t i = 0; i < n; i++)
        store_value(dtype, want, i, value_of(seed, slot, i));
    fails += compare_bits(c, what, when, dtype, t->data, want, n);
    free(want);
    return fails;
}

int model_check(model_t *m, int param_seed, int state_seed, const char *except, int except_seed,
                const char *when)
{
    int fails = 0;
    for (int j = 0; j < m->np; j++) {
        int excepted = except && !strcmp(m->spec[j].fqn, except);
        for (int s = 0; s < 3; s++) {
            int want_seed = excepted ? except_seed : s ? state_seed : param_seed;
            char what[96];
            snprintf(what, sizeof(what), "%s%s%s", m->spec[j].fqn, s ? " " : "",
                     s ? STATE_NAME[s - 1] : "");
            fsdp2_dtensor_t *dt = NULL;
            fsdp2_tensor_t *full = NULL;
            int f = model_slot_dtensor(m, j, s, &dt);
            /* Every rank must still take part in the gather: no early return. */
            if (!f)
                f += OK(m->c, fsdp2_dtensor_full_tensor(dt, NULL, &full));
            if (!f)
                f += check_values(m->c, what, when, full, &m->spec[j], want_seed,
                                  3 * m->spec[j].t + s);
            fsdp2_tensor_release(full);
            fails += f;
        }
    }
    for (int i = 0; i < NUM_WHOLE; i++)
        fails += check_values(m->c, WHOLE_SPEC[i].fqn, when, m->whole[i], &WHOLE_SPEC[i],
                              param_seed, WHOLE_SLOT + i);
    return fails;
}

/* ---------------------------------------------------------------------------------- */
/* Saving and loading                                                                  */

int model_save(model_t *m, const char *dir, int64_t step)
{
    const char *keys[1] = {"who"}, *values[1] = {"test"};
    fsdp2_checkpoint_options_t o = FSDP2_CHECKPOINT_OPTIONS_INIT;
    o.step = step;
    o.extra_keys = keys;
    o.extra_values = values;
    o.num_extra = 1;
    return OK(m->c, fsdp2_checkpoint_save(m->sd, dir, &o));
}

int model_load(model_t *m, const char *dir, int strict, fsdp2_checkpoint_report_t *report)
{
    fsdp2_checkpoint_options_t o = FSDP2_CHECKPOINT_OPTIONS_INIT;
    o.strict = strict;
    report->size = sizeof(*report);
    return OK(m->c, fsdp2_checkpoint_load(m->sd, dir, &o, report));
}

int model_check_steps(model_t *m, int64_t want, const char *when)
{
    int64_t steps = -1;
    int fails = OK(m->c, fsdp2_optimizer_steps(m->opt, &steps));
    return fails + RANK_CHECK(m->c, steps == want, "%s: optimizer step count %lld, want %lld",
                              when, (long long)steps, (long long)want);
}
