/* Loading the CUDA module (lib/core/cuda_loader.c): where it is looked for, and the
 * message when it, or what it needs, is missing. Check forks each test, so each starts
 * with nothing loaded and its own FSDP2_CUDA_MODULE (with CK_FORK=no the program says it
 * cannot run and exits 77). */
#include <check.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <fsdp2/fsdp2.h>

#include "core/cuda_loader.h"

static const fsdp2_device_t cuda0 = {FSDP2_DEVICE_CUDA, 0};

#define ASSERT_HAS(text)                                                                 \
    ck_assert_msg(strstr(fsdp2_last_error(), (text)) != NULL, "message '%s' lacks '%s'", \
                  fsdp2_last_error(), (text))

/* Every way in to cuda fails with FSDP2_ERR_NOT_AVAILABLE and a message with `want`. */
static void assert_every_entry_fails(const char *want)
{
    ck_assert_int_eq(fsdp2_device_check(cuda0), FSDP2_ERR_NOT_AVAILABLE);
    ASSERT_HAS(want);
    ASSERT_HAS("cuda:0");

    int count = -1;
    ck_assert_int_eq(fsdp2_cuda_device_count(&count), FSDP2_SUCCESS);
    ck_assert_int_eq(count, 0);

    fsdp2_tensor_t *t = NULL;
    const int64_t shape[1] = {4};
    ck_assert_int_eq(fsdp2_tensor_zeros(cuda0, FSDP2_F32, 1, shape, &t), FSDP2_ERR_NOT_AVAILABLE);
    ck_assert_ptr_null(t);
    ASSERT_HAS(want);

    fsdp2_stream_t *s = NULL;
    ck_assert_int_eq(fsdp2_stream_create(cuda0, "side", &s), FSDP2_ERR_NOT_AVAILABLE);
    ASSERT_HAS(want);

    fsdp2_store_options_t so = FSDP2_STORE_OPTIONS_INIT;
    so.is_server = 1;
    fsdp2_store_t *store = NULL;
    ck_assert_int_eq(fsdp2_store_create(&so, &store), FSDP2_SUCCESS);
    fsdp2_group_options_t go = FSDP2_GROUP_OPTIONS_INIT;
    go.backend = FSDP2_BACKEND_NCCL;
    go.cuda_device = 0;
    fsdp2_group_t *g = NULL;
    ck_assert_int_eq(fsdp2_group_create(store, "g", 0, 1, &go, &g), FSDP2_ERR_NOT_AVAILABLE);
    ck_assert_ptr_null(g);
    ASSERT_HAS("nccl");
    ASSERT_HAS(want);
    fsdp2_store_destroy(store);
}

START_TEST(a_missing_module_path_is_named_with_the_loader_reason)
{
    setenv("FSDP2_CUDA_MODULE", "/nonexistent/libfsdp2-cuda.so", 1);
    assert_every_entry_fails("FSDP2_CUDA_MODULE='/nonexistent/libfsdp2-cuda.so'");
    ASSERT_HAS("cannot open shared object file");
    const fsdp2_cuda_module_t *m = NULL;
    ck_assert_int_eq(fsdp2_cuda_module_get(&m), FSDP2_ERR_NOT_AVAILABLE);
    ck_assert_ptr_null(m);
}
END_TEST

START_TEST(a_library_that_is_not_a_module_is_refused)
{
    setenv("FSDP2_CUDA_MODULE", "libm.so.6", 1);
    assert_every_entry_fails("has no fsdp2_cuda_module_init");
}
END_TEST

START_TEST(a_module_of_another_build_is_refused_naming_both)
{
    const char *fake = getenv("FSDP2_TEST_FAKE_MODULE");
    ck_assert_msg(fake != NULL, "meson sets FSDP2_TEST_FAKE_MODULE");
    setenv("FSDP2_CUDA_MODULE", fake, 1);
    assert_every_entry_fails("is from another build of libfsdp2");
    char both[128];
    snprintf(both, sizeof(both), "module ABI %u with %zu-byte tables, where this one has ABI %u",
             FSDP2_CUDA_MODULE_ABI + 1, sizeof(fsdp2_cuda_module_t) + 8, FSDP2_CUDA_MODULE_ABI);
    ASSERT_HAS(both);
}
END_TEST

START_TEST(a_module_refusing_the_host_is_refused)
{
    const char *fake = getenv("FSDP2_TEST_REFUSING_MODULE");
    ck_assert_msg(fake != NULL, "meson sets FSDP2_TEST_REFUSING_MODULE");
    setenv("FSDP2_CUDA_MODULE", fake, 1);
    assert_every_entry_fails("it refused this one's host table");
}
END_TEST

/* Without FSDP2_CUDA_MODULE: a build with CUDA finds its module (here by the test's rpath
 * to the build's lib/), and what fails is the device, not the loading; a build without
 * CUDA says how to get the module. */
START_TEST(the_default_search_finds_this_builds_module)
{
    unsetenv("FSDP2_CUDA_MODULE");
    const fsdp2_cuda_module_t *m = NULL;
    fsdp2_status_t s = fsdp2_cuda_module_get(&m);
#if FSDP2_BUILT_WITH_CUDA
    ck_assert_msg(s == FSDP2_SUCCESS, "%s", fsdp2_last_error());
    ck_assert_ptr_nonnull(m->device_ops);
    ck_assert_uint_eq(m->abi, FSDP2_CUDA_MODULE_ABI);
    int count = -1;
    ck_assert_int_eq(fsdp2_cuda_device_count(&count), FSDP2_SUCCESS);
    if (count == 0) {
        ck_assert_int_eq(fsdp2_device_check(cuda0), FSDP2_ERR_NOT_AVAILABLE);
        ASSERT_HAS("cuda:0 not available");
        ck_assert_ptr_null(strstr(fsdp2_last_error(), "could not be loaded"));
    } else {
        ck_assert_int_eq(fsdp2_device_check(cuda0), FSDP2_SUCCESS);
    }
#else
    ck_assert_int_eq(s, FSDP2_ERR_NOT_AVAILABLE);
    ck_assert_ptr_null(m);
    assert_every_entry_fails("-Dcuda=enabled");
    ASSERT_HAS("libfsdp2-cuda.so");
#endif
}
END_TEST

/* On a machine without the NVIDIA driver (the CI machines), the module says so. */
START_TEST(a_machine_without_the_driver_is_told_so)
{
#if FSDP2_BUILT_WITH_CUDA
    unsetenv("FSDP2_CUDA_MODULE");
    void *driver = dlopen("libcuda.so.1", RTLD_LAZY);
    if (driver) {
        dlclose(driver);
        return; /* a driver is installed: the other tests cover this machine */
    }
    ck_assert_int_eq(fsdp2_device_check(cuda0), FSDP2_ERR_NOT_AVAILABLE);
    ASSERT_HAS("no NVIDIA driver: libcuda.so.1 cannot be loaded");
#endif
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("cuda_loader");
    TCase *tc = tcase_create("loader");
    tcase_add_test(tc, a_missing_module_path_is_named_with_the_loader_reason);
    tcase_add_test(tc, a_library_that_is_not_a_module_is_refused);
    tcase_add_test(tc, a_module_of_another_build_is_refused_naming_both);
    tcase_add_test(tc, a_module_refusing_the_host_is_refused);
    tcase_add_test(tc, the_default_search_finds_this_builds_module);
    tcase_add_test(tc, a_machine_without_the_driver_is_told_so);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    const char *fork_mode = getenv("CK_FORK");
    if (fork_mode && strcmp(fork_mode, "no") == 0) {
        puts("SKIP: each test loads the module once per process (CK_FORK=no)");
        return 77;
    }
    SRunner *sr = srunner_create(suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
