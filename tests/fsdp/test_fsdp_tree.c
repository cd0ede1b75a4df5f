/* fsdp2_fully_shard_tree with real processes (1 to 4 ranks): which modules become groups
 * (by size, by a policy, on a nested tree), in which order, and that the tree it shards
 * trains like the one-process reference of mlp_model.h.
 *
 * The layers hold fc1 7*13+7 = 98, fc2 5*7+5 = 40 and fc3 3*5+3 = 18 elements. A layer
 * that is no group of its own has its parameters in an enclosing group (the root's, or
 * block's): whole between that group's hooks, which the driver (run_forward /
 * run_backward) calls around every layer it holds. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <fsdp2/fsdp.h>

#include "../core/check_main.h"
#include "mlp_model.h"

#define FC1_NUMEL 98
#define FC2_NUMEL 40
#define FC3_NUMEL 18

/* The module's own name: the last part of its FQN ("" for the root). */
static const char *module_name(const fsdp2_module_t *m, char *buf, size_t len)
{
    if (fsdp2_module_fqn(m, buf, len) != FSDP2_SUCCESS)
        return "?";
    const char *dot = strrchr(buf, '.');
    return dot ? dot + 1 : buf;
}

/* What a group should hold: nothing (not a group), or `params` parameters of `numel`
 * elements in all. */
typedef struct expect_group {
    int sharded;
    size_t params;
    int64_t numel;
} expect_group_t;

static int check_group(run_t *r, const fsdp2_module_t *m, const char *name, expect_group_t want,
                       int is_root)
{
    fsdp2_module_state_t st = state_of(r, m);
    if (!want.sharded)
        return RANK_CHECK(r->c, !st.sharded, "%s is a group (%zu params); want none", name,
                          st.num_params);
    return RANK_CHECK(r->c, st.sharded && st.num_params == want.params &&
                                st.unsharded_numel == want.numel && st.is_root == is_root,
                      "%s: sharded %d, %zu params of %lld elements, is_root %d; want 1, %zu, "
                      "%lld, %d",
                      name, st.sharded, st.num_params, (long long)st.unsharded_numel, st.is_root,
                      want.params, (long long)want.numel, is_root);
}

/* The root, fc1..fc3 and (nested) block against the expected groups, and every parameter
 * owned by one of them. */
static int check_groups(run_t *r, expect_group_t root, const expect_group_t fc[LAYERS],
                        expect_group_t block)
{
    int fails = check_group(r, r->root, "root", root, 1);
    for (int l = 0; l < LAYERS; l++)
        fails += check_group(r, r->fc[l], LAYER_NAME[l], fc[l], 0);
    if (r->block)
        fails += check_group(r, r->block, "block", block, 0);
    for (int l = 0; l < LAYERS; l++) {
        for (int kind = 0; kind < 2; kind++) {
            fsdp2_param_info_t pi;
            fails += OK(r->c, fsdp2_param_info(r->p[l][kind], &pi));
            fails += RANK_CHECK(r->c, pi.sharded == 1,
                                "%s: info sharded %d, want 1 (in some group)", pi.fqn, pi.sharded);
        }
    }
    return fails;
}

/* Inside its group's hooks every layer is whole (the group is fc[l], or block, or the
 * root, each between its pre and post hooks there). */
static int probe_whole(run_t *r, probe_point_t at, int layer)
{
    if (at != PROBE_PRE_FORWARD && at != PROBE_PRE_BACKWARD)
        return 0;
    fsdp2_module_state_t st = state_of(r, r->fc[layer]);
    return RANK_CHECK(r->c, st.unshard_state == FSDP2_UNSHARDED,
                      "step %d: after pre_%s(%s) it is %s (training state %s), want UNSHARDED",
                      r->step, at == PROBE_PRE_FORWARD ? "forward" : "backward",
                      LAYER_NAME[layer], unshard_state_name(st.unshard_state),
                      training_state_name(st.training_state));
}

/* Builds the (flat or nested) tree with a ring of `ring` unsharded buffers, lets shard()
 * shard it, checks the groups and the values they took over, and trains it for `steps`
 * steps against the reference. */
typedef int (*shard_fn)(run_t *r);

static int shard_and_train(rank_ctx_t *c, int nested, int ring, int steps, shard_fn shard,
                           expect_group_t root, const expect_group_t fc[LAYERS],
                           expect_group_t block)
{
    run_t *r = malloc(sizeof(*r));
    int fails = run_open(c, r);
    build_options_t bo = BUILD_DEFAULT;
    bo.nested = nested;
    bo.unsharded_buffers = ring;
    bo.shard = SHARD_BY_CALLER;
    if (!fails)
        fails += build_model(r, &bo);
    if (!fails)
        fails += shard(r);
    if (!fails)
        fails += run_bind_hooks(r);
    if (!fails)
        fails += check_groups(r, root, fc, block);
    ref_model_t ref;
    ref_init(&ref);
    if (!fails)
        fails += compare_params(r, &ref); /* the declared values, in whichever group */
    r->probe = probe_whole;
    if (!fails)
        fails += run_train(r, &ref, 0, steps, 1);
    fails += run_close(r);
    free(r);
    return fails;
}

/* ---------------------------------------------------------------------------------- */
/* By size                                                                             */

static int64_t min_params_now;

static int shard_by_size(run_t *r)
{
    return OK(r->c, fsdp2_fully_shard_tree(r->root, &r->opts, NULL, NULL, min_params_now));
}

/* min_params 30: fc1 (98) and fc2 (40) get groups; fc3 (18) goes to the root's. */
static int body_min_params(rank_ctx_t *c)
{
    min_params_now = 30;
    const expect_group_t fc[LAYERS] = {{1, 2, FC1_NUMEL}, {1, 2, FC2_NUMEL}, {0, 0, 0}};
    expect_group_t root = {1, 2, FC3_NUMEL}, none = {0, 0, 0};
    return shard_and_train(c, 0, 2, 3, shard_by_size, root, fc, none);
}

/* "At least": min_params equal to fc2's 40 elements selects fc2, one more does not (the
 * selection alone: the two trees are not trained). */
static int body_min_params_boundary(rank_ctx_t *c)
{
    const expect_group_t none = {0, 0, 0};
    const expect_group_t at[LAYERS] = {{1, 2, FC1_NUMEL}, {1, 2, FC2_NUMEL}, none};
    const expect_group_t above[LAYERS] = {{1, 2, FC1_NUMEL}, none, none};
    min_params_now = FC2_NUMEL;
    int fails = shard_and_train(c, 0, 2, 0, shard_by_size, (expect_group_t){1, 2, FC3_NUMEL},
                                at, none);
    min_params_now = FC2_NUMEL + 1;
    return fails + shard_and_train(c, 0, 2, 0, shard_by_size,
                                   (expect_group_t){1, 4, FC2_NUMEL + FC3_NUMEL}, above, none);
}

/* ---------------------------------------------------------------------------------- */
/* By policy                                                                           */

/* The policy's record: the names it was asked about, in order, and what it accepts. */
typedef struct policy_ctx {
    const char *accept[4];
    int accept_all;
    char seen[8][FSDP2_NAME_MAX];
    int num_seen;
    int bad_ctx; /* calls that got another ctx than the one given */
} policy_ctx_t;

static policy_ctx_t policy_now;

static int by_name(const fsdp2_module_t *m, void *ctx)
{
    policy_ctx_t *p = &policy_now;
    p->bad_ctx += ctx != p;
    char buf[FSDP2_FQN_MAX];
    const char *name = module_name(m, buf, sizeof(buf));
    if (p->num_seen < 8)
        snprintf(p->seen[p->num_seen++], FSDP2_NAME_MAX, "%.*s", FSDP2_NAME_MAX - 1, name);
    if (p->accept_all)
        return 1;
    for (int i = 0; i < 4 && p->accept[i]; i++)
        if (strcmp(p->accept[i], name) == 0)
            return 1;
    return 0;
}

static int shard_by_policy(run_t *r)
{
    int fails = OK(r->c, fsdp2_fully_shard_tree(r->root, &r->opts, by_name, &policy_now, 0));
    return fails + RANK_CHECK(r->c, policy_now.bad_ctx == 0,
                              "the policy got a ctx other than the one given %d times",
                              policy_now.bad_ctx);
}

/* Index of name among the names the policy saw, -1 if never. */
static int seen_at(const policy_ctx_t *p, const char *name)
{
    for (int i = 0; i < p->num_seen; i++)
        if (strcmp(p->seen[i], name) == 0)
            return i;
    return -1;
}

/* A policy accepting fc1 and fc3 by name: fc2 goes to the root's group. */
static int body_policy(rank_ctx_t *c)
{
    memset(&policy_now, 0, sizeof(policy_now));
    policy_now.accept[0] = "fc1";
    policy_now.accept[1] = "fc3";
    const expect_group_t fc[LAYERS] = {{1, 2, FC1_NUMEL}, {0, 0, 0}, {1, 2, FC3_NUMEL}};
    int fails = shard_and_train(c, 0, 2, 3, shard_by_policy, (expect_group_t){1, 2, FC2_NUMEL},
                                fc, (expect_group_t){0, 0, 0});
    for (int l = 0; l < LAYERS; l++) {
        int at = seen_at(&policy_now, LAYER_NAME[l]);
        fails += RANK_CHECK(c, at >= 0, "the policy was never asked about %s", LAYER_NAME[l]);
    }
    return fails;
}

/* A policy accepting nothing: the root is sharded anyway, holding every parameter. */
static int body_policy_none(rank_ctx_t *c)
{
    memset(&policy_now, 0, sizeof(policy_now));
    const expect_group_t none = {0, 0, 0}, fc[LAYERS] = {none, none, none};
    return shard_and_train(c, 0, 2, 3, shard_by_policy,
                           (expect_group_t){1, 6, FC1_NUMEL + FC2_NUMEL + FC3_NUMEL}, fc, none);
}

/* ---------------------------------------------------------------------------------- */
/* Nested: root -> {block -> {fc1, fc2}, fc3}                                          */

/* A policy accepting everything: fc1 and fc2 are asked about (and sharded) before their
 * parent block, and the root, if asked at all, last. Were a parent sharded before its
 * children, it would own their parameters and their fully_shard would be refused. */
static int nested_by_policy(rank_ctx_t *c, int ring)
{
    memset(&policy_now, 0, sizeof(policy_now));
    policy_now.accept_all = 1;
    const expect_group_t fc[LAYERS] = {{1, 2, FC1_NUMEL}, {1, 2, FC2_NUMEL}, {1, 2, FC3_NUMEL}};
    int fails = shard_and_train(c, 1, ring, 3, shard_by_policy, (expect_group_t){1, 0, 0}, fc,
                                (expect_group_t){1, 0, 0});
    int a = seen_at(&policy_now, "fc1"), b = seen_at(&policy_now, "fc2");
    int blk = seen_at(&policy_now, "block"), root = seen_at(&policy_now, "");
    fails += RANK_CHECK(c, a >= 0 && b >= 0 && blk > a && blk > b,
                        "policy order: fc1 at %d, fc2 at %d, block at %d; want both children "
                        "before block",
                        a, b, blk);
    fails += RANK_CHECK(c, root < 0 || root == policy_now.num_seen - 1,
                        "the policy saw the root at %d of %d; want it last if at all", root,
                        policy_now.num_seen);
    return fails;
}

/* A ring of three: block, the layer inside it and the next layer's prefetch each have a
 * buffer. */
static int body_nested_policy(rank_ctx_t *c)
{
    return nested_by_policy(c, 3);
}

/* The default ring of two, which block and fc1 fill when fc1's pre_forward prefetches
 * fc2: the prefetch must not take fc1's own buffer (a prefetch that finds no buffer is
 * skipped; fc1 stays whole between its hooks). */
static int body_nested_default_ring(rank_ctx_t *c)
{
    return nested_by_policy(c, 2);
}

/* By size on the nested tree: every module with parameters of its own left (fc1, fc2,
 * fc3) gets a group; block, whose parameters its children own, gets none; the root is
 * a group (with nothing) and the root of the tree. */
static int body_nested_min_params(rank_ctx_t *c)
{
    min_params_now = 0;
    const expect_group_t fc[LAYERS] = {{1, 2, FC1_NUMEL}, {1, 2, FC2_NUMEL}, {1, 2, FC3_NUMEL}};
    return shard_and_train(c, 1, 2, 3, shard_by_size, (expect_group_t){1, 0, 0}, fc,
                           (expect_group_t){0, 0, 0});
}

/* ---------------------------------------------------------------------------------- */

START_TEST(min_params_gives_the_big_layers_groups_and_the_small_one_to_the_root)
{
    run_case(_i, body_min_params, "fully_shard_tree min_params 30");
}
END_TEST

START_TEST(min_params_selects_a_module_with_exactly_that_many_elements)
{
    run_case(_i, body_min_params_boundary, "fully_shard_tree min_params 40 and 41");
}
END_TEST

START_TEST(a_policy_selects_modules_by_name_and_the_rest_go_to_the_root)
{
    run_case(_i, body_policy, "fully_shard_tree by name");
}
END_TEST

START_TEST(a_policy_selecting_nothing_still_shards_the_root_with_every_parameter)
{
    run_case(_i, body_policy_none, "fully_shard_tree selecting nothing");
}
END_TEST

START_TEST(a_nested_tree_is_sharded_children_first_and_the_root_last)
{
    run_case(_i, body_nested_policy, "fully_shard_tree nested, policy");
}
END_TEST

START_TEST(a_nested_tree_keeps_each_layer_whole_in_its_hooks_with_the_default_ring)
{
    run_case(_i, body_nested_default_ring, "fully_shard_tree nested, ring of 2");
}
END_TEST

START_TEST(min_params_zero_on_a_nested_tree_skips_a_module_without_parameters)
{
    run_case(_i, body_nested_min_params, "fully_shard_tree nested, min_params 0");
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("fsdp_tree");
    TCase *tc = tcase_create("by_size");
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, min_params_gives_the_big_layers_groups_and_the_small_one_to_the_root, 1, 5);
    tcase_add_loop_test(tc, min_params_selects_a_module_with_exactly_that_many_elements, 1, 5);
    suite_add_tcase(s, tc);

    tc = tcase_create("by_policy");
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, a_policy_selects_modules_by_name_and_the_rest_go_to_the_root, 1, 5);
    tcase_add_loop_test(tc, a_policy_selecting_nothing_still_shards_the_root_with_every_parameter, 1, 5);
    suite_add_tcase(s, tc);

    tc = tcase_create("nested");
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, a_nested_tree_is_sharded_children_first_and_the_root_last, 1, 5);
    tcase_add_loop_test(tc, a_nested_tree_keeps_each_layer_whole_in_its_hooks_with_the_default_ring, 1, 5);
    tcase_add_loop_test(tc, min_params_zero_on_a_nested_tree_skips_a_module_without_parameters, 1, 5);
    suite_add_tcase(s, tc);
    return s;
}

FSDP2_CHECK_MAIN(suite)
