/* The main() every Check test program shares: run one suite (forking each test, so
 * environment changes stay inside it), exit 0 only without failures. */
#ifndef FSDP2_TESTS_CHECK_MAIN_H
#define FSDP2_TESTS_CHECK_MAIN_H

#include <check.h>
#include <stdlib.h>

#define FSDP2_CHECK_MAIN(make_suite)                        \
    int main(void)                                          \
    {                                                       \
        SRunner *sr = srunner_create(make_suite());         \
        srunner_run_all(sr, CK_NORMAL);                     \
        int failed = srunner_ntests_failed(sr);             \
        srunner_free(sr);                                   \
        return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;   \
    }

#endif
