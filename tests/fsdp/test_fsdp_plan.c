/* fsdp2_plan_model against the real thing: each rank plans the model for its own
 * coordinates with no mesh, then shards it over a real mesh, and the plan must be what
 * fsdp2_memory_plan reports, byte for byte in every category; the optimizer's state what
 * fsdp2_optimizer_state_bytes reports; and the collectives one step issues (the groups'
 * counters) the plan's counts. At ws 1 to 4, with reshard_after_forward 0 and N, one
 * unsharded buffer, a nested tree, a frozen and an ignored bias, bf16 parameters with f32
 * reduction, and HSDP [2, 2]. Then the refusals. */
#include <check.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <fsdp2/fsdp2.h>

#include "../core/check_main.h"
#include "mlp_model.h"

typedef struct plan_case {
    int nested, frozen, ignored, reshard, buffers, bf16, hsdp;
    int keep_last; /* fc3 sharded with reshard_after_forward 0 */
    fsdp2_optimizer_kind_t optimizer;
    int momentum;
} plan_case_t;

static plan_case_t the_case;

/* Sums, over this rank's traced collectives of one kind (cat), the bytes the trace gives
 * them (the rank's own chunk) times the ranks of their group: the payload the plan
 * counts, for the collectives of FSDP's units (those naming a module). Block gathers
 * (group ".../block...") go to *block. Returns -1 when the file
 * cannot be read. */
static int traced_payloads(const char *path, int shard, int block_ranks, int replicas,
                           uint64_t *gather, uint64_t *block, uint64_t *scatter,
                           uint64_t *reduce)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return -1;
    static char buf[4 << 20];
    size_t len = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[len] = '\0';
    cJSON *root = cJSON_Parse(buf);
    const cJSON *events = cJSON_GetObjectItemCaseSensitive(root, "traceEvents"), *e;
    *gather = *block = *scatter = *reduce = 0;
    cJSON_ArrayForEach(e, events) {
        const cJSON *cat = cJSON_GetObjectItemCaseSensitive(e, "cat");
        const cJSON *args = cJSON_GetObjectItemCaseSensitive(e, "args");
        const cJSON *bytes = cJSON_GetObjectItemCaseSensitive(args, "bytes");
        const cJSON *group = cJSON_GetObjectItemCaseSensitive(args, "group");
        const cJSON *module = cJSON_GetObjectItemCaseSensitive(args, "module");
        /* FSDP's own (the comparisons' full_tensor gathers name no module) */
        if (!cJSON_IsString(cat) || !cJSON_IsNumber(bytes) || !cJSON_IsString(module))
            continue;
        uint64_t b = (uint64_t)bytes->valuedouble;
        int over_block = cJSON_IsString(group) && strstr(group->valuestring, "/block") != NULL;
        if (!strcmp(cat->valuestring, "all_gather") && over_block)
            *block += b * (uint64_t)block_ranks;
        else if (!strcmp(cat->valuestring, "all_gather"))
            *gather += b * (uint64_t)shard;
        else if (!strcmp(cat->valuestring, "reduce_scatter"))
            *scatter += b * (uint64_t)shard;
        else if (!strcmp(cat->valuestring, "all_reduce") && replicas > 1)
            *reduce += b;
    }
    cJSON_Delete(root);
    return 0;
}

/* The units build_model shards: the layers and the block. */
static int layers_and_block(const fsdp2_module_t *m, void *ctx)
{
    (void)ctx;
    char fqn[FSDP2_FQN_MAX];
    if (fsdp2_module_fqn(m, fqn, sizeof(fqn)) != FSDP2_SUCCESS)
        return 0;
    const char *last = strrchr(fqn, '.');
    last = last ? last + 1 : fqn;
    return strncmp(last, "fc", 2) == 0 || strcmp(last, "block") == 0;
}

static void keep_fc3(const fsdp2_module_t *unit, fsdp2_shard_options_t *o, void *ctx)
{
    (void)ctx;
    char fqn[FSDP2_FQN_MAX];
    if (fsdp2_module_fqn(unit, fqn, sizeof(fqn)) == FSDP2_SUCCESS && strcmp(fqn, "fc3") == 0)
        o->reshard_after_forward = 0;
}

#define SAME(c, field, a, b)                                                                \
    RANK_CHECK((c), (a).field == (b).field, "%s: planned %llu, real %llu", #field,         \
               (unsigned long long)(a).field, (unsigned long long)(b).field)

static int plan_then_shard(rank_ctx_t *c)
{
    const plan_case_t *pc = &the_case;
    run_t *r = calloc(1, sizeof(*r));
    int fails = pc->hsdp ? run_open_2d(c, r, 2) : run_open(c, r);
    build_options_t bo = BUILD_DEFAULT;
    bo.nested = pc->nested;
    bo.frozen_fc2_bias = pc->frozen;
    bo.ignore_fc2_bias = pc->ignored;
    bo.reshard_after_forward = pc->reshard;
    bo.unsharded_buffers = pc->buffers ? pc->buffers : 2;
    bo.shard = SHARD_BY_CALLER;
    if (!fails)
        fails += build_model(r, &bo);
    if (fails) {
        run_close(r);
        free(r);
        return fails;
    }
    if (pc->bf16) {
        r->opts.mp.param_dtype = FSDP2_BF16;
        r->opts.mp.reduce_dtype = FSDP2_F32;
    }
    fsdp2_optimizer_options_t oo = FSDP2_SGD_OPTIONS_INIT(0.1);
    if (pc->optimizer == FSDP2_OPTIMIZER_ADAMW)
        oo = (fsdp2_optimizer_options_t)FSDP2_ADAMW_OPTIONS_INIT(1e-3);
    else if (pc->optimizer == FSDP2_OPTIMIZER_ADADELTA)
        oo = (fsdp2_optimizer_options_t)FSDP2_ADADELTA_OPTIONS_INIT(1.0);
    else
        oo.momentum = pc->momentum ? 0.9 : 0.0;

    /* The plan, from the rank's coordinates only. */
    fsdp2_plan_options_t po = FSDP2_PLAN_OPTIONS_INIT;
    po.replicas = pc->hsdp ? 2 : 1;
    po.shard = c->size / po.replicas;
    po.rank = c->rank % po.shard;
    po.shard_options = &r->opts; /* its mesh is not used */
    po.policy = layers_and_block;
    po.optimizer = &oo;
    if (pc->keep_last)
        po.unit_options = keep_fc3;
    fsdp2_plan_report_t planned = {.size = sizeof(planned)};
    uint64_t before = cpu_allocated(r, NULL);
    fails += OK(c, fsdp2_plan_model(r->root, &po, &planned));
    fails += RANK_CHECK(c, cpu_allocated(r, NULL) == before,
                        "planning left %llu bytes allocated",
                        (unsigned long long)(cpu_allocated(r, NULL) - before));
    int units = LAYERS + 1 + (pc->nested ? 1 : 0);
    fails += RANK_CHECK(c, planned.units == units, "planned %d units, want %d", planned.units,
                        units);

    /* The real thing, as build_model shards it. */
    r->allocated_before_shard = cpu_allocated(r, NULL);
    for (int l = 0; l < LAYERS && !fails; l++) {
        fsdp2_shard_options_t o = r->opts;
        if (pc->keep_last && l == LAYERS - 1)
            o.reshard_after_forward = 0;
        fails += OK(c, fsdp2_fully_shard(r->fc[l], &o));
    }
    if (!fails && r->block)
        fails += OK(c, fsdp2_fully_shard(r->block, &r->opts));
    if (!fails)
        fails += OK(c, fsdp2_fully_shard(r->root, &r->opts));
    r->allocated_after_shard = cpu_allocated(r, NULL);
    fails += run_bind_hooks(r);
    fsdp2_memory_plan_t real;
    if (!fails)
        fails += plan_memory(r, &real);
    if (!fails) {
        fails += SAME(c, sharded_params, planned.memory, real);
        fails += SAME(c, sharded_grads, planned.memory, real);
        fails += SAME(c, unsharded_params, planned.memory, real);
        fails += SAME(c, unsharded_grads, planned.memory, real);
        fails += SAME(c, reduce_scatter, planned.memory, real);
        fails += SAME(c, post_forward_params, planned.memory, real);
        fails += SAME(c, total, planned.memory, real);
        fails += SAME(c, ring_buffers, planned.memory, real);
        fails += SAME(c, groups, planned.memory, real);
    }
    fsdp2_optimizer_t *opt = NULL;
    if (!fails)
        fails += OK(c, fsdp2_optimizer_create(r->root, &oo, &opt));
    uint64_t state = 0;
    if (!fails)
        fails += OK(c, fsdp2_optimizer_state_bytes(opt, &state));
    fails += RANK_CHECK(c, planned.optimizer_state == state,
                        "optimizer state: planned %llu, real %llu",
                        (unsigned long long)planned.optimizer_state, (unsigned long long)state);
    fails += RANK_CHECK(c, planned.total == real.total + state,
                        "total: planned %llu, want plan %llu + state %llu",
                        (unsigned long long)planned.total, (unsigned long long)real.total,
                        (unsigned long long)state);
    fsdp2_optimizer_destroy(opt);

    /* One step (f32 only: the reference is f32): the groups' counters against the plan
     * (over one rank they count unshards that communicate nothing, which the plan
     * leaves out). */
    if (!fails && !pc->bf16 && po.shard > 1) {
        ref_model_t ref;
        ref_init(&ref);
        for (int l = 0; l < LAYERS; l++)
            ref.frozen_bias[l] = r->frozen_bias[l];
        /* Traced (without a context: the rank from the launcher's variables, each rank
         * writing its own part). */
        char dir[] = "/tmp/fsdp2-plan-XXXXXX", path[64], part[96], env[16];
        int traced = mkdtemp(dir) != NULL;
        if (traced) {
            snprintf(env, sizeof(env), "%d", c->rank);
            setenv("RANK", env, 1);
            snprintf(env, sizeof(env), "%d", c->size);
            setenv("WORLD_SIZE", env, 1);
            setenv("MASTER_ADDR", "127.0.0.1", 1);
            setenv("MASTER_PORT", "1", 1);
            snprintf(path, sizeof(path), "%s/trace.json", dir);
            fails += OK(c, fsdp2_trace_start(NULL, path));
        }
        fails += run_train(r, &ref, 0, 1, 0);
        if (traced) {
            fails += OK(c, fsdp2_module_synchronize(r->root));
            fails += OK(c, fsdp2_trace_stop(NULL));
            snprintf(part, sizeof(part), "%s.rank%d.json", path, c->rank);
            uint64_t ag = 0, bag = 0, rs = 0, ar = 0;
            int read = traced_payloads(c->size > 1 ? part : path, po.shard,
                                       planned.block_all_gather.ranks, po.replicas, &ag,
                                       &bag, &rs, &ar);
            fails += RANK_CHECK(c, read == 0, "cannot read the trace %s", part);
            fails += RANK_CHECK(c, ag == planned.all_gather.bytes && bag ==
                                   planned.block_all_gather.bytes,
                                "traced all-gather payloads %llu + %llu over blocks, planned "
                                "%llu + %llu",
                                (unsigned long long)ag, (unsigned long long)bag,
                                (unsigned long long)planned.all_gather.bytes,
                                (unsigned long long)planned.block_all_gather.bytes);
            fails += RANK_CHECK(c, rs == planned.reduce_scatter.bytes,
                                "traced reduce-scatter payloads %llu, planned %llu",
                                (unsigned long long)rs,
                                (unsigned long long)planned.reduce_scatter.bytes);
            fails += RANK_CHECK(c, ar == planned.all_reduce.bytes,
                                "traced all-reduce payloads %llu, planned %llu",
                                (unsigned long long)ar,
                                (unsigned long long)planned.all_reduce.bytes);
            remove(part);
            remove(path);
            rmdir(dir);
        }
        uint64_t gathers = 0, scatters = 0;
        fsdp2_module_t *units_list[LAYERS + 2];
        int n = 0;
        for (int l = 0; l < LAYERS; l++)
            units_list[n++] = r->fc[l];
        if (r->block)
            units_list[n++] = r->block;
        units_list[n++] = r->root;
        for (int i = 0; i < n; i++) {
            fsdp2_module_state_t st = state_of(r, units_list[i]);
            gathers += st.all_gathers;
            scatters += st.reduce_scatters;
        }
        uint64_t want = planned.all_gather.calls + planned.block_all_gather.calls;
        fails += RANK_CHECK(c, gathers == want, "a step issued %llu all-gathers, the plan says %llu",
                            (unsigned long long)gathers, (unsigned long long)want);
        fails += RANK_CHECK(c, (pc->reshard > 1 && pc->reshard < c->size) ==
                                   (planned.block_all_gather.calls > 0),
                            "reshard_after_forward %d: %llu block all-gathers", pc->reshard,
                            (unsigned long long)planned.block_all_gather.calls);
        fails += RANK_CHECK(c, scatters == planned.reduce_scatter.calls,
                            "a step issued %llu reduce-scatters, the plan says %llu",
                            (unsigned long long)scatters,
                            (unsigned long long)planned.reduce_scatter.calls);
    }
    fails += run_close(r);
    free(r);
    return fails;
}

static void run_plan_case(int ws, plan_case_t pc, const char *what)
{
    the_case = pc;
    run_case(ws, plan_then_shard, what);
}

START_TEST(plan_equals_the_real_plan_for_fsdp_at_1_to_4_ranks)
{
    for (int ws = 1; ws <= 4; ws++)
        run_plan_case(ws, (plan_case_t){.reshard = 1, .optimizer = FSDP2_OPTIMIZER_ADAMW},
                      "fsdp, AdamW");
}
END_TEST

START_TEST(plan_equals_the_real_plan_with_the_options)
{
    run_plan_case(3, (plan_case_t){.reshard = 0, .optimizer = FSDP2_OPTIMIZER_SGD, .momentum = 1},
                  "reshard_after_forward 0, SGD with momentum");
    run_plan_case(4, (plan_case_t){.reshard = 2, .optimizer = FSDP2_OPTIMIZER_ADADELTA},
                  "reshard_after_forward 2, Adadelta");
    run_plan_case(4, (plan_case_t){.reshard = 1, .keep_last = 1, .optimizer = FSDP2_OPTIMIZER_ADAMW},
                  "the last layer kept from forward to backward (unit_options)");
    run_plan_case(2, (plan_case_t){.reshard = 1, .buffers = 1, .nested = 1},
                  "one unsharded buffer, nested tree, SGD");
    run_plan_case(3, (plan_case_t){.reshard = 1, .nested = 1, .frozen = 1,
                                   .optimizer = FSDP2_OPTIMIZER_ADAMW},
                  "nested tree, frozen bias");
    run_plan_case(3, (plan_case_t){.reshard = 1, .ignored = 1, .optimizer = FSDP2_OPTIMIZER_ADAMW},
                  "ignored bias");
    run_plan_case(2, (plan_case_t){.reshard = 1, .bf16 = 1, .optimizer = FSDP2_OPTIMIZER_ADAMW},
                  "bf16 parameters, f32 reduction");
    run_plan_case(4, (plan_case_t){.reshard = 1, .bf16 = 1, .nested = 1},
                  "bf16 parameters, nested tree");
}
END_TEST

START_TEST(plan_equals_the_real_plan_for_hsdp)
{
    run_plan_case(4, (plan_case_t){.reshard = 1, .hsdp = 1, .optimizer = FSDP2_OPTIMIZER_ADAMW},
                  "HSDP [2, 2]");
    run_plan_case(2, (plan_case_t){.reshard = 1, .hsdp = 1}, "HSDP [2, 1]");
}
END_TEST

/* The formulas on a shape done by hand: one [10, 3] f32 weight, 4 ranks, rank 3. */
START_TEST(plan_of_one_layer_by_hand)
{
    fsdp2_module_t *root;
    fsdp2_tensor_t *w;
    ck_assert_int_eq(fsdp2_module_create("", &root), FSDP2_SUCCESS);
    ck_assert_int_eq(fsdp2_tensor_empty(META, FSDP2_F32, 2, (int64_t[]){10, 3}, &w),
                     FSDP2_SUCCESS);
    ck_assert_int_eq(fsdp2_module_add_param(root, "w", w, 1, NULL), FSDP2_SUCCESS);
    fsdp2_tensor_release(w);
    fsdp2_optimizer_options_t adamw = FSDP2_ADAMW_OPTIONS_INIT(1e-3);
    fsdp2_plan_options_t po = FSDP2_PLAN_OPTIONS_INIT;
    po.shard = 4;
    po.rank = 3;
    po.optimizer = &adamw;
    fsdp2_plan_report_t rep = {.size = sizeof(rep)};
    ck_assert_int_eq(fsdp2_plan_model(root, &po, &rep), FSDP2_SUCCESS);
    /* chunk rows ceil(10 / 4) = 3: a padded shard of 9 floats; rank 3 holds row 9 only */
    ck_assert_uint_eq(rep.memory.sharded_params, 36);
    ck_assert_uint_eq(rep.memory.sharded_grads, 36);
    /* the root alone: its own unsharded buffer of 4 x 9 floats, two gradient buffers of
     * the 30 floats, reduce-scatter staging of 4 x 9 floats */
    ck_assert_uint_eq(rep.memory.unsharded_params, 144);
    ck_assert_uint_eq(rep.memory.unsharded_grads, 240);
    ck_assert_uint_eq(rep.memory.reduce_scatter, 144);
    ck_assert_uint_eq(rep.memory.total, 36 + 36 + 144 + 240 + 144);
    ck_assert_uint_eq(rep.optimizer_state, 2 * 3 * 4); /* two states of its 1 x 3 rows */
    ck_assert_uint_eq(rep.total, rep.memory.total + 24);
    ck_assert_int_eq(rep.param_numel, 30);
    /* one all-gather (the root keeps its parameters for the backward), one reduce-scatter */
    ck_assert_uint_eq(rep.all_gather.calls, 1);
    ck_assert_uint_eq(rep.all_gather.bytes, 144);
    ck_assert_uint_eq(rep.all_gather.sent, 108);
    ck_assert_uint_eq(rep.reduce_scatter.calls, 1);
    ck_assert_uint_eq(rep.reduce_scatter.bytes, 144);
    ck_assert_uint_eq(rep.all_reduce.calls, 0);
    /* The tree is untouched: it still shards for real afterwards, and planning again
     * gives the same. */
    fsdp2_plan_report_t again = {.size = sizeof(again)};
    ck_assert_int_eq(fsdp2_plan_model(root, &po, &again), FSDP2_SUCCESS);
    ck_assert_uint_eq(again.memory.total, rep.memory.total);
    fsdp2_module_destroy(root);
}
END_TEST

START_TEST(bad_options_are_refused_naming_them)
{
    fsdp2_module_t *root;
    fsdp2_tensor_t *w;
    ck_assert_int_eq(fsdp2_module_create("", &root), FSDP2_SUCCESS);
    ck_assert_int_eq(fsdp2_tensor_empty(META, FSDP2_F32, 1, (int64_t[]){8}, &w), FSDP2_SUCCESS);
    ck_assert_int_eq(fsdp2_module_add_param(root, "w", w, 1, NULL), FSDP2_SUCCESS);
    fsdp2_tensor_release(w);
    fsdp2_plan_report_t rep = {.size = sizeof(rep)};
    fsdp2_plan_options_t po = FSDP2_PLAN_OPTIONS_INIT;
    po.rank = 1;
    ck_assert_int_eq(fsdp2_plan_model(root, &po, &rep), FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(fsdp2_last_error(), "rank 1 is not in 0..0"));
    po = (fsdp2_plan_options_t)FSDP2_PLAN_OPTIONS_INIT;
    po.shard = 0;
    ck_assert_int_eq(fsdp2_plan_model(root, &po, &rep), FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(fsdp2_last_error(), "shard 0"));
    fsdp2_shard_options_t so = FSDP2_SHARD_OPTIONS_INIT;
    po = (fsdp2_plan_options_t)FSDP2_PLAN_OPTIONS_INIT;
    po.shard = 4;
    so.reshard_after_forward = 3;
    po.shard_options = &so;
    ck_assert_int_eq(fsdp2_plan_model(root, &po, &rep), FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(fsdp2_last_error(), "reshard_after_forward 3"));
    so = (fsdp2_shard_options_t)FSDP2_SHARD_OPTIONS_INIT;
    so.unsharded_buffers = 0;
    po = (fsdp2_plan_options_t)FSDP2_PLAN_OPTIONS_INIT;
    po.shard_options = &so;
    ck_assert_int_eq(fsdp2_plan_model(root, &po, &rep), FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(fsdp2_last_error(), "unsharded_buffers 0"));
    so = (fsdp2_shard_options_t)FSDP2_SHARD_OPTIONS_INIT;
    so.size = 12;
    po.shard_options = &so;
    ck_assert_int_eq(fsdp2_plan_model(root, &po, &rep), FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(fsdp2_last_error(), "options size 12"));
    fsdp2_optimizer_options_t bad = FSDP2_ADAMW_OPTIONS_INIT(-1.0);
    po = (fsdp2_plan_options_t)FSDP2_PLAN_OPTIONS_INIT;
    po.optimizer = &bad;
    ck_assert_int_eq(fsdp2_plan_model(root, &po, &rep), FSDP2_ERR_INVALID_ARGUMENT);
    po = (fsdp2_plan_options_t)FSDP2_PLAN_OPTIONS_INIT;
    po.size--;
    ck_assert_int_eq(fsdp2_plan_model(root, &po, &rep), FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(fsdp2_last_error(), "options size"));
    fsdp2_module_destroy(root);
}
END_TEST

/* A unit refused midway (its own options bad) leaves the tree as it was: no module or
 * parameter attached to a unit, and the tree shards for real afterwards. */
static void second_unit_bad(const fsdp2_module_t *unit, fsdp2_shard_options_t *o, void *ctx)
{
    int *seen = ctx;
    if (++*seen == 2)
        o->unsharded_buffers = 0;
    (void)unit;
}

START_TEST(a_failure_midway_leaves_the_tree_as_it_was)
{
    fsdp2_module_t *root, *a, *b;
    fsdp2_param_t *pa, *pb;
    ck_assert_int_eq(fsdp2_module_create("", &root), FSDP2_SUCCESS);
    ck_assert_int_eq(fsdp2_module_create("a", &a), FSDP2_SUCCESS);
    ck_assert_int_eq(fsdp2_module_create("b", &b), FSDP2_SUCCESS);
    ck_assert_int_eq(fsdp2_module_add_child(root, a), FSDP2_SUCCESS);
    ck_assert_int_eq(fsdp2_module_add_child(root, b), FSDP2_SUCCESS);
    fsdp2_tensor_t *w;
    ck_assert_int_eq(fsdp2_tensor_empty(META, FSDP2_F32, 1, (int64_t[]){8}, &w), FSDP2_SUCCESS);
    ck_assert_int_eq(fsdp2_module_add_param(a, "w", w, 1, &pa), FSDP2_SUCCESS);
    ck_assert_int_eq(fsdp2_module_add_param(b, "w", w, 1, &pb), FSDP2_SUCCESS);
    fsdp2_tensor_release(w);
    int seen = 0;
    fsdp2_plan_options_t po = FSDP2_PLAN_OPTIONS_INIT;
    po.unit_options = second_unit_bad;
    po.unit_options_ctx = &seen;
    fsdp2_plan_report_t rep = {.size = sizeof(rep)};
    ck_assert_int_eq(fsdp2_plan_model(root, &po, &rep), FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(fsdp2_last_error(), "unsharded_buffers 0"));
    ck_assert_int_eq(seen, 2);
    fsdp2_module_state_t st = {.size = sizeof(st)};
    ck_assert_int_eq(fsdp2_module_state(a, &st), FSDP2_SUCCESS);
    ck_assert_int_eq(st.sharded, 0);
    ck_assert_int_eq(fsdp2_module_state(root, &st), FSDP2_SUCCESS);
    ck_assert_int_eq(st.sharded, 0);
    fsdp2_dtensor_t *dt = NULL;
    ck_assert_int_eq(fsdp2_param_sharded(pa, &dt), FSDP2_ERR_INVALID_STATE);
    /* planning again without the bad unit works */
    po.unit_options = NULL;
    ck_assert_int_eq(fsdp2_plan_model(root, &po, &rep), FSDP2_SUCCESS);
    ck_assert_int_eq(rep.units, 3);
    fsdp2_module_destroy(root);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("fsdp_plan");
    TCase *by_hand = tcase_create("by_hand");
    tcase_add_test(by_hand, plan_of_one_layer_by_hand);
    tcase_add_test(by_hand, bad_options_are_refused_naming_them);
    tcase_add_test(by_hand, a_failure_midway_leaves_the_tree_as_it_was);
    suite_add_tcase(s, by_hand);
    TCase *real = tcase_create("real");
    tcase_set_timeout(real, 300);
    tcase_add_test(real, plan_equals_the_real_plan_for_fsdp_at_1_to_4_ranks);
    tcase_add_test(real, plan_equals_the_real_plan_with_the_options);
    tcase_add_test(real, plan_equals_the_real_plan_for_hsdp);
    suite_add_tcase(s, real);
    return s;
}

FSDP2_CHECK_MAIN(suite)
