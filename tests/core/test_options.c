/* Versioned options structs (lib/core/options.h): the helper itself (the current size
 * copies everything, an earlier version's size only its fields and keeps the defaults
 * of the rest, any other size is refused naming it and the sizes accepted), and each
 * public options struct through its API: sizes other than the current one, smaller and
 * larger, are refused by the store, group, init, optimizer, checkpoint and random init
 * calls (no earlier version has been released); the output structs without a size field
 * keep the layout the ABI fixes. */
#include <check.h>
#include <stddef.h>
#include <string.h>

#include <fsdp2/fsdp2.h>

#include "check_main.h"
#include "core/options.h"

typedef struct demo_options {
    unsigned size;
    int a;
    long b;
    int c; /* added later */
} demo_options_t;

#define ck_refused(call, needle)                                                              \
    do {                                                                                      \
        fsdp2_status_t s_ = (call);                                                           \
        ck_assert_msg(s_ == FSDP2_ERR_INVALID_ARGUMENT && strstr(fsdp2_last_error(), (needle)), \
                      "%s = %s (%s), want INVALID_ARGUMENT naming '%s'", #call,               \
                      fsdp2_status_name(s_), fsdp2_last_error(), (needle));                   \
    } while (0)

START_TEST(the_helper_takes_the_current_and_earlier_sizes_and_refuses_the_rest)
{
    const fsdp2_options_version_t earlier[] = {{offsetof(demo_options_t, c), offsetof(demo_options_t, c)}};
    demo_options_t user = {sizeof(demo_options_t), 1, 2, 3}, dst = {sizeof(demo_options_t), 9, 9, 9};
    ck_assert_int_eq(fsdp2_options_copy("demo", &dst, sizeof(dst), &user, earlier, 1), FSDP2_SUCCESS);
    ck_assert(dst.size == sizeof(dst) && dst.a == 1 && dst.b == 2 && dst.c == 3);

    /* An older application: its struct ended before c. */
    unsigned char old[offsetof(demo_options_t, c)];
    demo_options_t fields = {offsetof(demo_options_t, c), 4, 5, 0};
    memcpy(old, &fields, sizeof(old));
    dst = (demo_options_t){sizeof(demo_options_t), 9, 9, 9};
    ck_assert_int_eq(fsdp2_options_copy("demo", &dst, sizeof(dst), old, earlier, 1), FSDP2_SUCCESS);
    ck_assert(dst.size == sizeof(dst) && dst.a == 4 && dst.b == 5 && dst.c == 9);

    user.size = sizeof(demo_options_t) + 8; /* a newer header's */
    ck_refused(fsdp2_options_copy("demo", &dst, sizeof(dst), &user, earlier, 1), "size");
    char want[96];
    snprintf(want, sizeof(want), "demo size %zu is not one this library knows (%zu or %zu",
             sizeof(demo_options_t) + 8, sizeof(demo_options_t), offsetof(demo_options_t, c));
    ck_assert_msg(strstr(fsdp2_last_error(), want), "message '%s'", fsdp2_last_error());
    user.size = 0;
    ck_refused(fsdp2_options_copy("demo", &dst, sizeof(dst), &user, NULL, 0), "size 0");
}
END_TEST

static fsdp2_store_t *one_store(void)
{
    fsdp2_store_options_t so = FSDP2_STORE_OPTIONS_INIT;
    so.is_server = 1;
    fsdp2_store_t *store = NULL;
    ck_assert_int_eq(fsdp2_store_create(&so, &store), FSDP2_SUCCESS);
    return store;
}

START_TEST(every_options_struct_refuses_sizes_no_version_had)
{
    fsdp2_store_options_t so = FSDP2_STORE_OPTIONS_INIT;
    so.is_server = 1;
    so.size += 8;
    fsdp2_store_t *store = NULL;
    ck_refused(fsdp2_store_create(&so, &store), "store options size");
    so.size = 8;
    ck_refused(fsdp2_store_create(&so, &store), "store options size 8");

    store = one_store();
    fsdp2_group_options_t go = FSDP2_GROUP_OPTIONS_INIT;
    go.size += 4;
    fsdp2_group_t *g = NULL;
    ck_refused(fsdp2_group_create(store, "big", 0, 1, &go, &g), "group options size");

    fsdp2_init_options_t io = FSDP2_INIT_OPTIONS_INIT;
    io.size += 8;
    fsdp2_context_t *ctx = NULL;
    ck_refused(fsdp2_init(&io, &ctx), "init options size");

    fsdp2_module_t *root = NULL;
    ck_assert_int_eq(fsdp2_module_create("", &root), FSDP2_SUCCESS);
    fsdp2_optimizer_options_t oo = FSDP2_SGD_OPTIONS_INIT(0.1);
    oo.size = 12;
    fsdp2_optimizer_t *opt = NULL;
    ck_refused(fsdp2_optimizer_create(root, &oo, &opt), "optimizer options size 12");
    fsdp2_module_destroy(root);

    fsdp2_random_init_t ri = FSDP2_RANDOM_UNIFORM_INIT(1, 0.0, 1.0);
    ri.size += 8;
    double v = 0;
    ck_refused(fsdp2_random_value(&ri, 0, &v), "random init size");

    fsdp2_checkpoint_options_t co = FSDP2_CHECKPOINT_OPTIONS_INIT;
    co.size -= 4;
    ck_refused(fsdp2_checkpoint_import_full((fsdp2_state_dict_t *)1, "/nonexistent", &co, NULL),
               "checkpoint options size");
    fsdp2_store_destroy(store);
}
END_TEST

/* Nothing has been released with a smaller struct, so no earlier size is accepted: the
 * group options as they were before cuda_device are refused like any other size. */
START_TEST(group_options_without_cuda_device_are_refused)
{
    fsdp2_store_t *store = one_store();
    fsdp2_group_options_t go = FSDP2_GROUP_OPTIONS_INIT;
    go.size = offsetof(fsdp2_group_options_t, cuda_device);
    fsdp2_group_t *g = NULL;
    char want[64];
    snprintf(want, sizeof(want), "group options size %u", go.size);
    ck_refused(fsdp2_group_create(store, "older", 0, 1, &go, &g), want);
    ck_assert_ptr_null(g);
    fsdp2_store_destroy(store);
}
END_TEST

/* The output structs have no size field: their layout is fixed for the ABI (their
 * header comments say so), and a field added to one is a new struct and function. These
 * are the layouts the ABI baseline records. */
START_TEST(the_fixed_output_structs_keep_their_layout)
{
    ck_assert_uint_eq(sizeof(fsdp2_memory_stats_t), 32);
    ck_assert_uint_eq(offsetof(fsdp2_memory_stats_t, free_count), 24);
    ck_assert_uint_eq(sizeof(fsdp2_lr_schedule_t), 48);
    ck_assert_uint_eq(offsetof(fsdp2_lr_schedule_t, min_lr), 40);
    ck_assert_uint_eq(offsetof(fsdp2_process_info_t, master_addr), 24);
    ck_assert_uint_eq(sizeof(fsdp2_process_info_t), 24 + FSDP2_HOST_MAX + 4);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("options");
    TCase *tc = tcase_create("options");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, the_helper_takes_the_current_and_earlier_sizes_and_refuses_the_rest);
    tcase_add_test(tc, every_options_struct_refuses_sizes_no_version_had);
    tcase_add_test(tc, group_options_without_cuda_device_are_refused);
    tcase_add_test(tc, the_fixed_output_structs_keep_their_layout);
    suite_add_tcase(s, tc);
    return s;
}

FSDP2_CHECK_MAIN(suite)
