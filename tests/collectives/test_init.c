/* fsdp2_init: a process with no launcher variables is a world of 1 with a working world
 * group; bad launcher variables are errors naming them, and nothing is left behind.
 * (Multi-rank fsdp2_init runs in two_nodes.sh through coll_check.) */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/check_main.h"
#include <fsdp2/fsdp2.h>

static const char *const launcher_vars[] = {
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
    "MASTER_PORT", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "SLURM_PROCID",
    "SLURM_NTASKS", "PMI_RANK", "PMI_SIZE"};

static void clear_launcher_env(void)
{
    for (size_t i = 0; i < sizeof(launcher_vars) / sizeof(launcher_vars[0]); i++)
        unsetenv(launcher_vars[i]);
}

START_TEST(a_bare_process_is_a_world_of_one_with_a_working_group)
{
    clear_launcher_env();
    fsdp2_context_t *ctx;
    ck_assert_msg(fsdp2_init(NULL, &ctx) == FSDP2_SUCCESS, "%s", fsdp2_last_error());
    fsdp2_process_info_t info;
    fsdp2_group_t *world;
    ck_assert_int_eq(fsdp2_context_info(ctx, &info), FSDP2_SUCCESS);
    ck_assert_int_eq(info.rank, 0);
    ck_assert_int_eq(info.world_size, 1);
    ck_assert_int_eq(fsdp2_context_world(ctx, &world), FSDP2_SUCCESS);
    fsdp2_stream_t *cur;
    fsdp2_device_t cpu = FSDP2_DEVICE_CPU_INIT;
    ck_assert_int_eq(fsdp2_stream_current(cpu, &cur), FSDP2_SUCCESS);
    float x[3] = {1, 2, 3};
    ck_assert_int_eq(fsdp2_all_reduce_async(world, x, 3, FSDP2_F32, NULL, cur), FSDP2_SUCCESS);
    ck_assert_float_eq(x[2], 3.0f);
    ck_assert_int_eq(fsdp2_finalize(ctx), FSDP2_SUCCESS);
}
END_TEST

START_TEST(bad_launcher_variables_are_errors_naming_them)
{
    clear_launcher_env();
    setenv("RANK", "5", 1);
    setenv("WORLD_SIZE", "2", 1);
    fsdp2_context_t *ctx = (fsdp2_context_t *)&ctx;
    ck_assert_int_eq(fsdp2_init(NULL, &ctx), FSDP2_ERR_INVALID_CONFIG);
    ck_assert_ptr_null(ctx);
    ck_assert_msg(strstr(fsdp2_last_error(), "RANK") != NULL, "%s", fsdp2_last_error());
    ck_assert_int_eq(fsdp2_finalize(NULL), FSDP2_SUCCESS);
}
END_TEST

START_TEST(the_hsdp_mesh_of_one_process_and_bad_shard_sizes)
{
    clear_launcher_env();
    fsdp2_context_t *ctx;
    ck_assert_msg(fsdp2_init(NULL, &ctx) == FSDP2_SUCCESS, "%s", fsdp2_last_error());
    fsdp2_mesh_t *mesh = NULL, *again = NULL;
    ck_assert_msg(fsdp2_context_hsdp_mesh(ctx, 0, &mesh) == FSDP2_SUCCESS, "%s",
                  fsdp2_last_error());
    ck_assert_int_eq(fsdp2_context_hsdp_mesh(ctx, 1, &again), FSDP2_SUCCESS);
    ck_assert_ptr_eq(mesh, again);
    int ndim = 0, size0 = 0, size1 = 0, dim = -1;
    ck_assert_int_eq(fsdp2_mesh_ndim(mesh, &ndim), FSDP2_SUCCESS);
    ck_assert_int_eq(fsdp2_mesh_size(mesh, 0, &size0), FSDP2_SUCCESS);
    ck_assert_int_eq(fsdp2_mesh_size(mesh, 1, &size1), FSDP2_SUCCESS);
    ck_assert_int_eq(fsdp2_mesh_dim(mesh, "shard", &dim), FSDP2_SUCCESS);
    ck_assert_int_eq(ndim, 2);
    ck_assert_int_eq(size0, 1);
    ck_assert_int_eq(size1, 1);
    ck_assert_int_eq(dim, 1);
    const int bad[] = {3, -2};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char needle[64];
        snprintf(needle, sizeof(needle), "shard size %d does not divide the world size 1", bad[i]);
        ck_assert_int_eq(fsdp2_context_hsdp_mesh(ctx, bad[i], &again), FSDP2_ERR_INVALID_ARGUMENT);
        ck_assert_ptr_null(again);
        ck_assert_msg(strstr(fsdp2_last_error(), needle), "%s", fsdp2_last_error());
    }
    ck_assert_int_eq(fsdp2_context_hsdp_mesh(NULL, 0, &again), FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(fsdp2_finalize(ctx), FSDP2_SUCCESS);
}
END_TEST

static Suite *init_suite(void)
{
    Suite *s = suite_create("init");
    TCase *tc = tcase_create("init");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, a_bare_process_is_a_world_of_one_with_a_working_group);
    tcase_add_test(tc, bad_launcher_variables_are_errors_naming_them);
    tcase_add_test(tc, the_hsdp_mesh_of_one_process_and_bad_shard_sizes);
    suite_add_tcase(s, tc);
    return s;
}

FSDP2_CHECK_MAIN(init_suite)
