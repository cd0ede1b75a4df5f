/* fully_shard's numbers, with real processes (1 to 4 ranks on a 1D mesh): sharded SGD
 * against the one-process reference of mlp_model.h, with gradient accumulation,
 * reshard_after_forward off, a frozen parameter, an ignored parameter, and parameters
 * declared on meta and materialised after sharding. The schedule and the controls are
 * tested in test_fsdp_controls.c, fully_shard_tree in test_fsdp_tree.c. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <fsdp2/fsdp.h>

#include "../core/check_main.h"
#include "mlp_model.h"

/* Default probe of the plain run: the training states, and that the default
 * reshard_after_forward frees fc1's parameters at its post_forward. */
static int probe_states(run_t *r, probe_point_t at, int layer)
{
    if (layer < 0)
        return 0;
    fsdp2_module_state_t st = state_of(r, r->fc[layer]);
    fsdp2_training_state_t want_ts = FSDP2_STATE_IDLE;
    switch (at) {
    case PROBE_PRE_FORWARD: want_ts = FSDP2_STATE_FORWARD; break;
    case PROBE_POST_FORWARD: want_ts = FSDP2_STATE_AFTER_FORWARD; break;
    case PROBE_PRE_BACKWARD: want_ts = FSDP2_STATE_BACKWARD; break;
    case PROBE_POST_BACKWARD: want_ts = FSDP2_STATE_AFTER_BACKWARD; break;
    default: return 0;
    }
    int fails = RANK_CHECK(r->c, st.training_state == want_ts,
                           "step %d: %s training_state %d at probe %d, want %d", r->step,
                           LAYER_NAME[layer], (int)st.training_state, (int)at, (int)want_ts);
    if (at == PROBE_PRE_FORWARD || at == PROBE_PRE_BACKWARD)
        fails += RANK_CHECK(r->c, st.unshard_state == FSDP2_UNSHARDED,
                            "step %d: %s is %s inside its hooks, want UNSHARDED", r->step,
                            LAYER_NAME[layer], unshard_state_name(st.unshard_state));
    if (at == PROBE_POST_FORWARD && layer == 0)
        fails += RANK_CHECK(r->c, st.unshard_state == FSDP2_SHARDED,
                            "step %d: fc1 is %s after post_forward with reshard_after_forward "
                            "1, want SHARDED",
                            r->step, unshard_state_name(st.unshard_state));
    return fails;
}

/* Each rank's DTensor pieces are torch.chunk's rows, and the groups' sizes add up. */
static int check_layout(run_t *r)
{
    rank_ctx_t *c = r->c;
    int fails = 0;
    for (int l = 0; l < LAYERS; l++) {
        int64_t expect_shard = 0;
        for (int kind = 0; kind < 2; kind++) {
            fsdp2_dtensor_t *dt = NULL;
            fails += OK(c, fsdp2_param_sharded(r->p[l][kind], &dt));
            if (fails)
                return fails;
            fsdp2_dtensor_info_t info;
            fails += OK(c, fsdp2_dtensor_info(dt, &info));
            int64_t off, len;
            chunk_rows(DIM[l + 1], c->size, c->rank, &off, &len);
            expect_shard += ((DIM[l + 1] + c->size - 1) / c->size) * (kind ? 1 : DIM[l]);
            fails += RANK_CHECK(c, info.ndim == (kind ? 1 : 2) && info.shape[0] == DIM[l + 1] &&
                                       info.local_shape[0] == len && info.offset[0] == off &&
                                       info.mesh_ndim == 1 &&
                                       info.placements[0].type == FSDP2_PLACEMENT_SHARD &&
                                       info.placements[0].dim == 0 && info.dtype == FSDP2_F32,
                                "%s.%s: shard of %lld rows at %lld (placement %d dim %d), want %lld "
                                "at %lld, Shard(0)",
                                LAYER_NAME[l], kind ? "bias" : "weight",
                                (long long)info.local_shape[0], (long long)info.offset[0],
                                (int)info.placements[0].type, info.placements[0].dim,
                                (long long)len, (long long)off);
            fsdp2_param_info_t pi;
            fails += OK(c, fsdp2_param_info(r->p[l][kind], &pi));
            fails += RANK_CHECK(c, pi.sharded == 1 && pi.materialized == 1,
                                "%s: info sharded %d materialized %d, want 1 1", pi.fqn,
                                pi.sharded, pi.materialized);
        }
        fsdp2_module_state_t st = state_of(r, r->fc[l]);
        int64_t full = (int64_t)DIM[l + 1] * DIM[l] + DIM[l + 1];
        fails += RANK_CHECK(c, st.sharded && st.num_params == 2 && st.shard_numel == expect_shard &&
                                   st.unsharded_numel == full && st.unshard_state == FSDP2_SHARDED,
                            "%s: state sharded %d, %zu params, shard_numel %lld, unsharded_numel "
                            "%lld, %s; want 1, 2, %lld, %lld, SHARDED",
                            LAYER_NAME[l], st.sharded, st.num_params, (long long)st.shard_numel,
                            (long long)st.unsharded_numel, unshard_state_name(st.unshard_state),
                            (long long)expect_shard, (long long)full);
    }
    fsdp2_module_state_t rs = state_of(r, r->root);
    fails += RANK_CHECK(c, rs.sharded && rs.num_params == 0 && rs.shard_numel == 0,
                        "root: sharded %d, %zu params, shard_numel %lld; want 1, 0, 0", rs.sharded,
                        rs.num_params, (long long)rs.shard_numel);
    return fails;
}

static int body_train(rank_ctx_t *c)
{
    run_t *r = malloc(sizeof(*r));
    int fails = run_open(c, r);
    build_options_t bo = BUILD_DEFAULT;
    if (!fails)
        fails += build_model(r, &bo);
    if (!fails)
        fails += check_layout(r);
    ref_model_t ref;
    ref_init(&ref);
    if (!fails)
        fails += compare_params(r, &ref); /* fully_shard copied the declared values */
    r->probe = probe_states;
    if (!fails)
        fails += run_train(r, &ref, 0, STEPS, 1);
    if (!fails) {
        fsdp2_module_state_t rs = state_of(r, r->root), s1 = state_of(r, r->fc[0]);
        fails += RANK_CHECK(c, rs.is_root == 1 && s1.is_root == 0 &&
                                   s1.training_state == FSDP2_STATE_IDLE,
                            "after the steps: root is_root %d, fc1 is_root %d state %d", rs.is_root,
                            s1.is_root, (int)s1.training_state);
        fails += RANK_CHECK(c, s1.reduce_scatters == STEPS,
                            "fc1 reduce_scatters %llu after %d steps, want %d",
                            (unsigned long long)s1.reduce_scatters, STEPS, STEPS);
    }
    fails += run_close(r);
    free(r);
    return fails;
}

/* Two micro-batches per step: the first without gradient sync (no reduce-scatter), the
 * second with it; the sharded gradients are the sum of the two micro-batch gradients. */
static int body_accumulate(rank_ctx_t *c)
{
    run_t *r = malloc(sizeof(*r));
    work_t *refwork = malloc(sizeof(*refwork));
    int fails = run_open(c, r);
    build_options_t bo = BUILD_DEFAULT;
    if (!fails)
        fails += build_model(r, &bo);
    ref_model_t ref;
    ref_init(&ref);
    for (int s = 0; s < 3 && !fails; s++) {
        r->step = s;
        for (int micro = 0; micro < 2 && !fails; micro++) {
            fails += OK(c, fsdp2_set_requires_gradient_sync(r->root, micro == 1));
            /* The second micro-batch's view may be the accumulator holding the first's
             * gradients (the application adds either way). */
            r->grads_start_at_zero = micro == 0;
            uint64_t rs_before = state_of(r, r->fc[0]).reduce_scatters;
            fails += run_micro_batch(r, &ref, refwork, micro, 2);
            if (fails)
                break;
            fsdp2_module_state_t st = state_of(r, r->fc[0]);
            fails += RANK_CHECK(c, st.requires_gradient_sync == (micro == 1),
                                "fc1 requires_gradient_sync %d, want %d (set on the root)",
                                st.requires_gradient_sync, micro == 1);
            fails += RANK_CHECK(c, st.reduce_scatters == rs_before + (micro == 1),
                                "step %d micro %d: fc1 reduce_scatters went %llu -> %llu, want +%d",
                                s, micro, (unsigned long long)rs_before,
                                (unsigned long long)st.reduce_scatters, micro == 1);
        }
        if (fails)
            break;
        fails += compare_grads(r, &ref);
        fails += run_sgd(r);
        ref_sgd(&ref);
        fails += compare_params(r, &ref);
    }
    fails += run_close(r);
    free(refwork);
    free(r);
    return fails;
}

static int probe_kept_whole(run_t *r, probe_point_t at, int layer)
{
    if (at != PROBE_POST_FORWARD || layer != 0)
        return 0;
    fsdp2_module_state_t st = state_of(r, r->fc[0]);
    return RANK_CHECK(r->c, st.unshard_state == FSDP2_UNSHARDED && st.reshard_after_forward == 0,
                      "step %d: fc1 is %s (reshard_after_forward %d) after post_forward, want "
                      "UNSHARDED with reshard_after_forward 0",
                      r->step, unshard_state_name(st.unshard_state), st.reshard_after_forward);
}

static int body_no_reshard(rank_ctx_t *c)
{
    run_t *r = malloc(sizeof(*r));
    int fails = run_open(c, r);
    build_options_t bo = BUILD_DEFAULT;
    bo.reshard_after_forward = 0;
    if (!fails)
        fails += build_model(r, &bo);
    ref_model_t ref;
    ref_init(&ref);
    r->probe = probe_kept_whole;
    if (!fails)
        fails += run_train(r, &ref, 0, 3, 0);
    fails += run_close(r);
    free(r);
    return fails;
}

/* The frozen parameter has no gradient view even inside its module's backward. */
static int probe_frozen_grad(run_t *r, probe_point_t at, int layer)
{
    if (at != PROBE_PRE_BACKWARD || layer != 1)
        return 0;
    fsdp2_tensor_t *t = NULL;
    return REFUSED(r->c, fsdp2_param_grad(r->p[1][1], &t), FSDP2_SUCCESS, NULL);
}

static int body_frozen(rank_ctx_t *c)
{
    run_t *r = malloc(sizeof(*r));
    int fails = run_open(c, r);
    build_options_t bo = BUILD_DEFAULT;
    bo.frozen_fc2_bias = 1;
    if (!fails)
        fails += build_model(r, &bo);
    ref_model_t ref;
    ref_init(&ref);
    ref.frozen_bias[1] = 1;
    if (fails)
        goto out;
    fsdp2_param_t *frozen = r->p[1][1];
    fsdp2_param_info_t pi;
    fails += OK(c, fsdp2_param_info(frozen, &pi));
    fails += RANK_CHECK(c, pi.requires_grad == 0, "fc2.bias requires_grad %d", pi.requires_grad);
    fsdp2_dtensor_t *g = (fsdp2_dtensor_t *)&g; /* anything but NULL: the call must clear it */
    fails += OK(c, fsdp2_param_sharded_grad(frozen, &g));
    fails += RANK_CHECK(c, g == NULL, "fc2.bias (frozen) has a sharded grad %p", (void *)g);
    fsdp2_tensor_t *t = NULL;
    fails += REFUSED(c, fsdp2_param_grad(frozen, &t), FSDP2_SUCCESS, NULL);
    r->probe = probe_frozen_grad;
    fails += run_train(r, &ref, 0, STEPS, 1);
    /* Bitwise the declared values: nothing ever touched it. */
    float init[MAX_OUT];
    for (int k = 0; k < DIM[2]; k++)
        init[k] = bias_init(1, k);
    if (!fails)
        fails += compare_full(r, 1, 1, 0, init, 0.0);
out:
    fails += run_close(r);
    free(r);
    return fails;
}

typedef struct init_calls {
    run_t *r;
    int calls[LAYERS][2];
    int fails;
} init_calls_t;

/* Writes the formula into this rank's shard, from its global offset. */
static fsdp2_status_t formula_init(fsdp2_param_t *param, fsdp2_tensor_t *shard,
                                   const int64_t *global_offset, void *ctx)
{
    init_calls_t *ic = ctx;
    run_t *r = ic->r;
    int l = -1, kind = -1;
    for (int i = 0; i < LAYERS; i++)
        for (int k = 0; k < 2; k++)
            if (r->p[i][k] == param) {
                l = i;
                kind = k;
            }
    if (l < 0) {
        ic->fails += RANK_CHECK(r->c, 0, "materialize called init on an unknown parameter");
        return FSDP2_SUCCESS;
    }
    ic->calls[l][kind]++;
    int64_t off, len, cols = kind ? 1 : DIM[l];
    chunk_rows(DIM[l + 1], r->c->size, r->c->rank, &off, &len);
    int bad = RANK_CHECK(r->c, shard && shard->dtype == FSDP2_F32 && shard->shape[0] == len &&
                                   shard->numel == len * cols && global_offset[0] == off &&
                                   (kind || global_offset[1] == 0) && (len == 0 || shard->data),
                         "%s.%s: init got %lld rows at %lld, want %lld at %lld", LAYER_NAME[l],
                         kind ? "bias" : "weight", shard ? (long long)shard->shape[0] : -1,
                         (long long)global_offset[0], (long long)len, (long long)off);
    ic->fails += bad;
    if (bad)
        return FSDP2_SUCCESS;
    float *v = shard->data;
    for (int64_t k = 0; k < shard->numel; k++) {
        int64_t flat = global_offset[0] * cols + k;
        v[k] = kind ? bias_init(l, flat) : weight_init(l, flat);
    }
    return FSDP2_SUCCESS;
}

static int body_meta_formula(rank_ctx_t *c)
{
    run_t *r = malloc(sizeof(*r));
    int fails = run_open(c, r);
    build_options_t bo = BUILD_DEFAULT;
    bo.meta = 1;
    if (!fails)
        fails += build_model(r, &bo);
    if (fails)
        goto out;
    fsdp2_param_info_t pi;
    fails += OK(c, fsdp2_param_info(r->p[0][0], &pi));
    fails += RANK_CHECK(c, pi.materialized == 0 && pi.sharded == 1,
                        "meta fc1.weight after fully_shard: materialized %d sharded %d, want 0 1",
                        pi.materialized, pi.sharded);
    init_calls_t ic;
    memset(&ic, 0, sizeof(ic));
    ic.r = r;
    fails += OK(c, fsdp2_module_materialize(r->root, formula_init, &ic));
    fails += ic.fails;
    for (int l = 0; l < LAYERS; l++)
        for (int k = 0; k < 2; k++)
            fails += RANK_CHECK(c, ic.calls[l][k] == 1, "init called %d times for %s.%s, want 1",
                                ic.calls[l][k], LAYER_NAME[l], k ? "bias" : "weight");
    fails += OK(c, fsdp2_param_info(r->p[2][1], &pi));
    fails += RANK_CHECK(c, pi.materialized == 1, "fc3.bias materialized %d after materialize",
                        pi.materialized);
    if (fails)
        goto out;
    ref_model_t ref;
    ref_init(&ref);
    for (int l = 0; l < LAYERS; l++) { /* bitwise */
        fails += compare_full(r, l, 0, 0, ref.w[l], 0.0);
        fails += compare_full(r, l, 1, 0, ref.b[l], 0.0);
    }
    if (!fails) /* and it trains like the model declared on cpu */
        fails += run_train(r, &ref, 0, 2, 0);
out:
    fails += run_close(r);
    free(r);
    return fails;
}

static int body_meta_random(rank_ctx_t *c)
{
    run_t *r = malloc(sizeof(*r));
    int fails = run_open(c, r);
    build_options_t bo = BUILD_DEFAULT;
    bo.meta = 1;
    bo.random_init = 1;
    if (!fails)
        fails += build_model(r, &bo);
    if (!fails)
        fails += OK(c, fsdp2_module_materialize(r->root, NULL, NULL));
    for (int l = 0; l < LAYERS && !fails; l++) {
        for (int kind = 0; kind < 2 && !fails; kind++) {
            int64_t shape[2] = {DIM[l + 1], DIM[l]};
            fsdp2_tensor_t *whole = NULL;
            fails += OK(c, fsdp2_tensor_empty(CPU, FSDP2_F32, kind ? 1 : 2, shape, &whole));
            if (fails)
                break;
            fsdp2_random_init_t init = random_init_of(l, kind);
            fails += OK(c, fsdp2_random_fill(whole, &init, NULL, NULL));
            if (!fails)
                fails += compare_full(r, l, kind, 0, whole->data, 0.0);
            fsdp2_tensor_release(whole);
        }
    }
    fails += run_close(r);
    free(r);
    return fails;
}

/* The ignored fc2.bias, wherever the step is: the declared tensor itself (same memory),
 * holding the declared values bitwise. */
static int check_ignored_untouched(run_t *r, const char *where)
{
    fsdp2_tensor_t *t = NULL;
    int fails = OK(r->c, fsdp2_param_unsharded(r->p[1][1], &t));
    if (fails)
        return fails;
    const void *declared = r->declared_data[1][1];
    fails += RANK_CHECK(r->c, t && t->data == declared && t->numel == DIM[2],
                        "step %d, %s: ignored fc2.bias is %p with %lld elements, want the "
                        "declared %p with %d",
                        r->step, where, t ? t->data : NULL, t ? (long long)t->numel : -1,
                        declared, DIM[2]);
    if (fails)
        return fails;
    float init[MAX_OUT];
    for (int k = 0; k < DIM[2]; k++)
        init[k] = bias_init(1, k);
    char what[96];
    snprintf(what, sizeof(what), "ignored fc2.bias (%s)", where);
    return compare_values(r, what, t->data, init, DIM[2], 0.0);
}

static int probe_ignored(run_t *r, probe_point_t at, int layer)
{
    static const char *const where[] = {"step start",   "pre_forward",   "post_forward",
                                        "backward start", "pre_backward", "post_backward",
                                        "backward end", "backward_finish", "optimizer",
                                        "step end"};
    _Static_assert(sizeof(where) / sizeof(where[0]) == PROBE_STEP_END + 1,
                   "a name for every probe point");
    char text[64];
    snprintf(text, sizeof(text), "%s%s%s", where[at], layer >= 0 ? " of " : "",
             layer >= 0 ? LAYER_NAME[layer] : "");
    return check_ignored_untouched(r, text);
}

/* fc2.bias in ignored_params: no group owns it, fc2's group holds only its weight, and the
 * other parameters train like the reference with fc2.bias a constant. */
static int body_ignored(rank_ctx_t *c)
{
    run_t *r = malloc(sizeof(*r));
    int fails = run_open(c, r);
    build_options_t bo = BUILD_DEFAULT;
    bo.ignore_fc2_bias = 1;
    if (!fails)
        fails += build_model(r, &bo);
    if (fails)
        goto out;
    for (int l = 0; l < LAYERS; l++) {
        for (int kind = 0; kind < 2; kind++) {
            fsdp2_param_info_t pi;
            fails += OK(c, fsdp2_param_info(r->p[l][kind], &pi));
            int want = !(l == 1 && kind == 1);
            fails += RANK_CHECK(c, pi.sharded == want && pi.materialized == 1,
                                "%s: info sharded %d materialized %d, want %d 1", pi.fqn,
                                pi.sharded, pi.materialized, want);
        }
    }
    fsdp2_module_state_t s2 = state_of(r, r->fc[1]), rs = state_of(r, r->root);
    fails += RANK_CHECK(c, s2.sharded && s2.num_params == 1 &&
                               s2.unsharded_numel == DIM[2] * DIM[1],
                        "fc2: sharded %d, %zu params, unsharded_numel %lld; want 1, 1 (the weight "
                        "alone), %d",
                        s2.sharded, s2.num_params, (long long)s2.unsharded_numel, DIM[2] * DIM[1]);
    fails += RANK_CHECK(c, rs.num_params == 0, "root holds %zu params, want 0 (fc2.bias ignored)",
                        rs.num_params);
    fails += check_ignored_untouched(r, "after fully_shard");
    ref_model_t ref;
    ref_init(&ref);
    ref.frozen_bias[1] = 1;
    r->probe = probe_ignored;
    if (!fails)
        fails += run_train(r, &ref, 0, STEPS, 1);
out:
    fails += run_close(r);
    free(r);
    return fails;
}

/* ---------------------------------------------------------------------------------- */

START_TEST(sharded_sgd_matches_one_process_sgd_for_every_world_size)
{
    run_case(_i, body_train, "training");
}
END_TEST

START_TEST(accumulated_no_sync_micro_batches_equal_the_sum_of_their_gradients)
{
    run_case(_i, body_accumulate, "gradient accumulation");
}
END_TEST

START_TEST(reshard_after_forward_off_keeps_parameters_whole_and_changes_no_number)
{
    run_case(_i, body_no_reshard, "reshard_after_forward 0");
}
END_TEST

START_TEST(a_frozen_parameter_never_changes_and_has_no_gradient_even_in_its_backward)
{
    run_case(_i, body_frozen, "frozen parameter");
}
END_TEST

START_TEST(an_ignored_parameter_stays_the_declared_tensor_and_the_rest_trains)
{
    run_case(_i, body_ignored, "ignored parameter");
}
END_TEST

START_TEST(meta_parameters_materialised_from_shard_offsets_equal_the_formula)
{
    run_case(_i, body_meta_formula, "meta init");
}
END_TEST

START_TEST(seeded_random_init_is_bitwise_the_same_for_every_world_size)
{
    run_case(_i, body_meta_random, "seeded init");
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("fsdp_train");
    TCase *tc = tcase_create("numerics");
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, sharded_sgd_matches_one_process_sgd_for_every_world_size, 1, 5);
    tcase_add_loop_test(tc, accumulated_no_sync_micro_batches_equal_the_sum_of_their_gradients, 1, 5);
    tcase_add_loop_test(tc, reshard_after_forward_off_keeps_parameters_whole_and_changes_no_number, 1, 5);
    tcase_add_loop_test(tc, a_frozen_parameter_never_changes_and_has_no_gradient_even_in_its_backward, 1, 5);
    tcase_add_loop_test(tc, an_ignored_parameter_stays_the_declared_tensor_and_the_rest_trains, 1, 5);
    suite_add_tcase(s, tc);

    tc = tcase_create("init");
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, meta_parameters_materialised_from_shard_offsets_equal_the_formula, 1, 5);
    tcase_add_loop_test(tc, seeded_random_init_is_bitwise_the_same_for_every_world_size, 1, 5);
    suite_add_tcase(s, tc);
    return s;
}

FSDP2_CHECK_MAIN(suite)
