/* Device meshes with real processes: 1D over 1-4 ranks and 2D [2,2], [1,4], [4,1] over 4
 * ranks. Coordinates must be row-major (PyTorch's init_device_mesh), and an all-reduce of
 * the global ranks over each dim's group must equal the closed form of the ranks that
 * share the other coordinate. Block groups (fsdp2_mesh_block_group: n consecutive ranks
 * of the last dim) for every divisor n: this rank's rank in it, its size, and an
 * all-reduce over it equal to the closed form of its members; n = the dim's size is the
 * dim's own group, a second call gives the same group, a non-divisor is an error naming
 * it. fsdp2_mesh_average gives the mean over every rank. Invalid shapes and names are
 * errors naming them. */
#include <check.h>
#include <stdio.h>
#include <string.h>

#include "../core/check_main.h"
#include "core/fault.h"
#include "ranks.h"

#define OK(ctx, call) RANK_CHECK(ctx, (call) == FSDP2_SUCCESS, "%s", #call)

typedef struct mesh_case {
    int ndim;
    int shape[2];
} mesh_case_t;

/* Sum of the global ranks in this rank's group along dim, computed from coordinates. */
static double expected_sum(const mesh_case_t *mc, const int *coords, int dim)
{
    double sum = 0;
    for (int c = 0; c < mc->shape[dim]; c++) {
        int k[2] = {coords[0], mc->ndim == 2 ? coords[1] : 0};
        k[dim] = c;
        sum += mc->ndim == 2 ? k[0] * mc->shape[1] + k[1] : k[0];
    }
    return sum;
}

static int check_blocks(rank_ctx_t *c, const mesh_case_t *mc, fsdp2_mesh_t *mesh,
                        const int *coords)
{
    int fails = 0, last = mc->ndim - 1, size = mc->shape[last], coord = coords[last];
    for (int n = 1; n <= size + 1; n++) {
        fsdp2_group_t *g = NULL, *again = NULL, *dim = NULL;
        if (n > size || size % n != 0) {
            char needle[32];
            snprintf(needle, sizeof(needle), "%d does not", n);
            fails += RANK_CHECK(c, fsdp2_mesh_block_group(mesh, n, &g) == FSDP2_ERR_INVALID_ARGUMENT &&
                                       strstr(fsdp2_last_error(), needle) != NULL && g == NULL,
                                "block of %d over a dim of %d: %s", n, size, fsdp2_last_error());
            continue;
        }
        fails += OK(c, fsdp2_mesh_block_group(mesh, n, &g));
        fails += OK(c, fsdp2_mesh_block_group(mesh, n, &again));
        fails += OK(c, fsdp2_mesh_group(mesh, last, &dim));
        if (fails)
            return fails;
        int grank = -1, gsize = -1;
        fsdp2_group_rank(g, &grank);
        fsdp2_group_size(g, &gsize);
        fails += RANK_CHECK(c, grank == coord % n && gsize == n && again == g &&
                                   (n != size || g == dim),
                            "block of %d: rank %d of %d (want %d of %d), cached %d, dim's %d", n,
                            grank, gsize, coord % n, n, again == g, g == dim);
        double v = c->rank, want = 0;
        for (int k = coord - coord % n; k < coord - coord % n + n; k++)
            want += mc->ndim == 2 ? coords[0] * mc->shape[1] + k : k;
        fails += OK(c, fsdp2_all_reduce_async(g, &v, 1, FSDP2_F64, NULL, c->stream));
        fails += OK(c, fsdp2_stream_synchronize(c->stream));
        fails += RANK_CHECK(c, v == want, "block of %d: sum of ranks %g, want %g", n, v, want);
    }
    return fails;
}

static int body_mesh(rank_ctx_t *c)
{
    const mesh_case_t *mc = c->arg;
    int fails = 0;
    const char *names[2] = {"replicate", "shard"};
    fsdp2_mesh_t *mesh = NULL;
    char name[32];
    snprintf(name, sizeof(name), "mesh-%dx%d", mc->shape[0], mc->ndim == 2 ? mc->shape[1] : 1);
    fails += OK(c, fsdp2_mesh_create(c->store, name, c->rank, c->size, mc->ndim, mc->shape,
                                     mc->ndim == 2 ? names : NULL, NULL, &mesh));
    if (fails)
        return fails;
    int coords[2] = {0, 0};
    for (int d = 0; d < mc->ndim; d++)
        fails += OK(c, fsdp2_mesh_coordinate(mesh, d, &coords[d]));
    int want0 = mc->ndim == 2 ? c->rank / mc->shape[1] : c->rank;
    fails += RANK_CHECK(c, coords[0] == want0, "coordinate 0 is %d, want %d", coords[0], want0);
    if (mc->ndim == 2)
        fails += RANK_CHECK(c, coords[1] == c->rank % mc->shape[1], "coordinate 1 is %d", coords[1]);
    int back = -1;
    fails += OK(c, fsdp2_mesh_rank_at(mesh, coords, &back));
    fails += RANK_CHECK(c, back == c->rank, "rank_at gives %d", back);
    for (int d = 0; d < mc->ndim; d++) {
        fsdp2_group_t *g;
        int grank = -1, gsize = -1;
        fails += OK(c, fsdp2_mesh_group(mesh, d, &g));
        fsdp2_group_rank(g, &grank);
        fsdp2_group_size(g, &gsize);
        fails += RANK_CHECK(c, grank == coords[d] && gsize == mc->shape[d],
                            "dim %d group: rank %d of %d", d, grank, gsize);
        double v = c->rank;
        fails += OK(c, fsdp2_all_reduce_async(g, &v, 1, FSDP2_F64, NULL, c->stream));
        fails += OK(c, fsdp2_stream_synchronize(c->stream));
        fails += RANK_CHECK(c, v == expected_sum(mc, coords, d), "dim %d sum %g, want %g", d, v,
                            expected_sum(mc, coords, d));
    }
    /* the mean over the whole mesh of (rank, 2 rank + 1), in a stack array */
    double mean[2] = {c->rank, 2.0 * c->rank + 1};
    fails += OK(c, fsdp2_mesh_average(mesh, mean, 2, c->stream));
    double want = (c->size - 1) / 2.0;
    fails += RANK_CHECK(c, mean[0] == want && mean[1] == 2 * want + 1,
                        "mesh average (%g, %g), want (%g, %g)", mean[0], mean[1], want,
                        2 * want + 1);
    fails += check_blocks(c, mc, mesh, coords);
    if (mc->ndim == 2) {
        int dim = -1;
        fails += OK(c, fsdp2_mesh_dim(mesh, "shard", &dim));
        fails += RANK_CHECK(c, dim == 1, "'shard' is dim %d", dim);
        fails += RANK_CHECK(c, fsdp2_mesh_dim(mesh, "tensor", &dim) == FSDP2_ERR_INVALID_ARGUMENT &&
                                   strstr(fsdp2_last_error(), "tensor") != NULL,
                            "unknown dim name");
    }
    fails += OK(c, fsdp2_mesh_destroy(mesh));
    return fails;
}

START_TEST(one_dim_meshes_over_1_to_4_ranks)
{
    for (int size = 1; size <= 4; size++) {
        mesh_case_t mc = {1, {size, 1}};
        ranks_result_t res;
        ck_assert_msg(run_ranks(size, body_mesh, &mc, 20000, 60, &res) == 0,
                      "size %d: statuses %d %d %d %d", size, res.status[0], res.status[1],
                      res.status[2], res.status[3]);
    }
}
END_TEST

START_TEST(two_dim_meshes_over_4_ranks_are_row_major_with_a_group_per_dim)
{
    const mesh_case_t cases[] = {{2, {2, 2}}, {2, {1, 4}}, {2, {4, 1}}};
    for (size_t k = 0; k < 3; k++) {
        ranks_result_t res;
        ck_assert_msg(run_ranks(4, body_mesh, (void *)&cases[k], 20000, 60, &res) == 0,
                      "[%d,%d]: statuses %d %d %d %d", cases[k].shape[0], cases[k].shape[1],
                      res.status[0], res.status[1], res.status[2], res.status[3]);
    }
}
END_TEST

static int body_bad_meshes(rank_ctx_t *c)
{
    int fails = 0;
    fsdp2_mesh_t *m = NULL;
    const int three[1] = {3}, zero[2] = {0, 4}, two_two[2] = {2, 2};
    const char *dup[2] = {"x", "x"};
    fails += RANK_CHECK(c, fsdp2_mesh_create(c->store, "bad1", c->rank, c->size, 1, three, NULL,
                                             NULL, &m) == FSDP2_ERR_INVALID_ARGUMENT &&
                               strstr(fsdp2_last_error(), "[3]") != NULL,
                        "shape [3] on 4 ranks");
    fails += RANK_CHECK(c, fsdp2_mesh_create(c->store, "bad2", c->rank, c->size, 2, zero, NULL,
                                             NULL, &m) == FSDP2_ERR_INVALID_ARGUMENT,
                        "a zero dim");
    fails += RANK_CHECK(c, fsdp2_mesh_create(c->store, "bad3", c->rank, c->size, 3, two_two, NULL,
                                             NULL, &m) == FSDP2_ERR_INVALID_ARGUMENT,
                        "three dims");
    fails += RANK_CHECK(c, fsdp2_mesh_create(c->store, "bad5", c->rank, c->size, 0, two_two, NULL,
                                             NULL, &m) == FSDP2_ERR_INVALID_ARGUMENT,
                        "no dims");
    const int negative[2] = {-2, -2};
    fails += RANK_CHECK(c, fsdp2_mesh_create(c->store, "bad6", c->rank, c->size, 2, negative,
                                             NULL, NULL, &m) == FSDP2_ERR_INVALID_ARGUMENT &&
                               strstr(fsdp2_last_error(), "-2") != NULL,
                        "negative dims (product 4): %s", fsdp2_last_error());
    fails += RANK_CHECK(c, fsdp2_mesh_create(c->store, "bad4", c->rank, c->size, 2, two_two, dup,
                                             NULL, &m) == FSDP2_ERR_INVALID_ARGUMENT &&
                               strstr(fsdp2_last_error(), "'x'") != NULL,
                        "duplicate names");
    /* 61 characters: cut to 60 in its group names, it could share keys with another */
    const char *longer = "a-mesh-name-of-sixty-one-characters-which-is-one-too-many-xyz";
    fails += RANK_CHECK(c, strlen(longer) == 61, "the long name is 61 characters");
    fails += RANK_CHECK(c, fsdp2_mesh_create(c->store, longer, c->rank, c->size, 2, two_two, NULL,
                                             NULL, &m) == FSDP2_ERR_INVALID_ARGUMENT &&
                               strstr(fsdp2_last_error(), "61 characters") != NULL,
                        "a 61-character mesh name: %s", fsdp2_last_error());
    fails += RANK_CHECK(c, m == NULL, "no mesh on failure");
    return fails;
}

START_TEST(invalid_meshes_are_errors_naming_the_problem)
{
    ranks_result_t res;
    ck_assert_int_eq(run_ranks(4, body_bad_meshes, NULL, 20000, 60, &res), 0);
}
END_TEST

/* A 2x2 mesh that world rank 3 never creates: each rank whose dim group waits for a
 * member that never joins gets a timeout naming that member by its rank in the group,
 * and the world ranks of the group's members (rank 1: its 'replicate' group {1,3};
 * rank 2: its 'shard' group {2,3}; rank 0: its 'shard' group {0,1}, as rank 1 gave up
 * before reaching it). */
static int body_mesh_missing_rank(rank_ctx_t *c)
{
    int64_t n = 0;
    if (c->rank == 3) { /* leaves once the others reported */
        const char *key = "all-reported";
        int fails = OK(c, fsdp2_store_wait(c->store, &key, 1));
        return fails + OK(c, fsdp2_store_set(c->store, "rank-3-left", "1", 1));
    }
    const int shape[2] = {2, 2};
    const char *names[2] = {"replicate", "shard"};
    fsdp2_group_options_t options = FSDP2_GROUP_OPTIONS_INIT;
    options.timeout_ms = 1500;
    fsdp2_mesh_t *mesh = NULL;
    fsdp2_status_t s = fsdp2_mesh_create(c->store, "partial", c->rank, c->size, 2, shape, names,
                                         &options, &mesh);
    static const char *const want[3] = {"dim 'shard' are world ranks 0,1",
                                        "dim 'replicate' are world ranks 1,3",
                                        "dim 'shard' are world ranks 2,3"};
    int fails = RANK_CHECK(c, s == FSDP2_ERR_TIMEOUT && mesh == NULL, "status %s",
                           fsdp2_status_name(s));
    /* after the group's timeout (1.5 s), not the store's (30 s) */
    fails += RANK_CHECK(c, strstr(fsdp2_last_error(), "member 1 did not join within 1.5 s") &&
                               strstr(fsdp2_last_error(), want[c->rank]) != NULL,
                        "message: %s", fsdp2_last_error());
    fails += OK(c, fsdp2_store_add(c->store, "reported", 1, &n));
    if (n == 3)
        fails += OK(c, fsdp2_store_set(c->store, "all-reported", "1", 1));
    if (c->rank == 0) { /* serves the store: leaves last */
        const char *key = "rank-3-left";
        fails += OK(c, fsdp2_store_wait(c->store, &key, 1));
    }
    return fails;
}

START_TEST(a_rank_missing_from_a_mesh_is_named_in_its_group_and_in_the_world)
{
    ranks_result_t res;
    ck_assert_msg(run_ranks(4, body_mesh_missing_rank, NULL, 1500, 60, &res) == 0,
                  "statuses %d %d %d %d (timed out %d)", res.status[0], res.status[1],
                  res.status[2], res.status[3], res.timed_out);
}
END_TEST

/* A rank that fails its part of a 2x2 mesh's creation, in either dim's group or at the
 * end, fails the mesh on every rank at once: the members of its groups, of the group it
 * will not create, and the ranks that share no group with it all name its error. Rank 1
 * counts the allocation points of one creation, then fails a sample of them (the first,
 * both sides of the middle, where its first group ends, and the last, where its second
 * group and the mesh end), one creation per point; a mesh made afterwards works. */
static int body_mesh_fails_on_one_rank(rank_ctx_t *c)
{
    const int shape[2] = {2, 2}, victim = 1;
    const char *names[2] = {"replicate", "shard"};
    fsdp2_group_options_t options = FSDP2_GROUP_OPTIONS_INIT;
    options.timeout_ms = 60000; /* a creation that waits for it fails the check on `took` */
    fsdp2_mesh_t *mesh = NULL;
    if (c->rank == victim)
        fsdp2_fault_arm(FAULT_NONE, 0); /* counting only */
    int fails = OK(c, fsdp2_mesh_create(c->store, "probe", c->rank, c->size, 2, shape, names,
                                        &options, &mesh));
    uint64_t points = fsdp2_fault_count(FAULT_ALLOC);
    fsdp2_fault_disarm();
    fsdp2_mesh_destroy(mesh);
    int64_t n = 0;
    fails += OK(c, ranks_value_from(c, victim, "points", (int64_t)points, &n));
    fails += RANK_CHECK(c, n >= 8, "%lld allocation points", (long long)n);
    for (int64_t at = 1; at <= n && fails == 0; at++) {
        int near_middle = at + 3 > n / 2 && at < n / 2 + 3;
        if (!(at == 1 || near_middle || at + 8 > n))
            continue;
        char name[32], mesh_q[40], group_q[40]; /* the mesh's name, or one of its groups' */
        snprintf(name, sizeof(name), "walk%lld", (long long)at);
        snprintf(mesh_q, sizeof(mesh_q), "'%s'", name);
        snprintf(group_q, sizeof(group_q), "'%s/", name);
        if (c->rank == victim)
            fsdp2_fault_arm(FAULT_ALLOC, (uint64_t)at);
        struct timespec t0;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        mesh = NULL;
        fsdp2_status_t st = fsdp2_mesh_create(c->store, name, c->rank, c->size, 2, shape, names,
                                              &options, &mesh);
        double took = ranks_seconds_since(&t0);
        int fired = fsdp2_fault_fired();
        fsdp2_fault_disarm();
        const char *msg = fsdp2_last_error();
        fails += RANK_CHECK(c, mesh == NULL, "%s: a mesh on a failed creation", name);
        if (c->rank == victim)
            fails += RANK_CHECK(c, fired && st == FSDP2_ERR_OUT_OF_MEMORY, "%s: %s: %s", name,
                                fsdp2_status_name(st), msg);
        else
            fails += RANK_CHECK(c, st == FSDP2_ERR_PEER_FAILED && strstr(msg, "OUT_OF_MEMORY") &&
                                       (strstr(msg, mesh_q) || strstr(msg, group_q)),
                                "%s: %s: %s", name, fsdp2_status_name(st), msg);
        fails += RANK_CHECK(c, took < 30.0, "%s: failed after %.1f s (timeout 60 s)", name, took);
        fsdp2_mesh_destroy(mesh);
    }
    fails += OK(c, fsdp2_mesh_create(c->store, "after", c->rank, c->size, 2, shape, names,
                                     &options, &mesh));
    for (int d = 0; d < 2 && fails == 0; d++) {
        fsdp2_group_t *g = NULL;
        float x = (float)c->rank;
        fails += OK(c, fsdp2_mesh_group(mesh, d, &g));
        fails += OK(c, fsdp2_all_reduce_async(g, &x, 1, FSDP2_F32, NULL, c->stream));
        fails += OK(c, fsdp2_stream_synchronize(c->stream));
        /* dim 0 joins ranks r and r + 2, dim 1 ranks r and r ^ 1 */
        float want = d == 0 ? (float)(2 * (c->rank % 2) + 2) : (float)(4 * (c->rank / 2) + 1);
        fails += RANK_CHECK(c, x == want, "dim %d: sum %g, want %g", d, x, want);
    }
    fsdp2_mesh_destroy(mesh);
    return fails;
}

START_TEST(a_rank_that_fails_its_part_of_a_mesh_fails_it_on_every_rank_at_once)
{
    ranks_result_t res;
    ck_assert_msg(run_ranks(4, body_mesh_fails_on_one_rank, NULL, 20000, 120, &res) == 0,
                  "statuses %d %d %d %d (timed out %d)", res.status[0], res.status[1],
                  res.status[2], res.status[3], res.timed_out);
}
END_TEST

static Suite *mesh_suite(void)
{
    Suite *s = suite_create("mesh");
    TCase *tc = tcase_create("mesh");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, one_dim_meshes_over_1_to_4_ranks);
    tcase_add_test(tc, two_dim_meshes_over_4_ranks_are_row_major_with_a_group_per_dim);
    tcase_add_test(tc, invalid_meshes_are_errors_naming_the_problem);
    tcase_add_test(tc, a_rank_missing_from_a_mesh_is_named_in_its_group_and_in_the_world);
    tcase_add_test(tc, a_rank_that_fails_its_part_of_a_mesh_fails_it_on_every_rank_at_once);
    suite_add_tcase(s, tc);
    return s;
}

FSDP2_CHECK_MAIN(mesh_suite)
