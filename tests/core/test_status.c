/* Tests for fsdp2/status.h: the status list, its names and strings, and the thread-local
 * detailed message that failing calls leave behind.
 *
 * The reference for names and strings is the X-macro itself, expanded here a second time
 * into a table of (value, #name, text) that shares no code with lib/core/status.c. */
#include <check.h>

#include "check_main.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <fsdp2/device.h>
#include <fsdp2/log.h>
#include <fsdp2/status.h>
#include <fsdp2/version.h>

#include "core/error.h"

#define TEST_TIMEOUT_S 30

struct status_row {
    fsdp2_status_t value;
    const char *name;
    const char *text;
};

static const struct status_row status_rows[] = {
#define STATUS_ROW_(name, value, text) {(fsdp2_status_t)(value), #name, text},
    FSDP2_STATUS_MAP(STATUS_ROW_)
#undef STATUS_ROW_
};

#define STATUS_COUNT ((int)(sizeof(status_rows) / sizeof(status_rows[0])))

/* ---------------------------------------------------------------------------------- */
/* Names and strings                                                                  */

START_TEST(the_library_reports_the_version_of_its_header)
{
    ck_assert_uint_eq(fsdp2_version(), FSDP2_VERSION_CODE);
    ck_assert_uint_eq(fsdp2_version(), (unsigned)(FSDP2_VERSION_MAJOR * 10000 +
                                                  FSDP2_VERSION_MINOR * 100 + FSDP2_VERSION_PATCH));
    char text[32];
    snprintf(text, sizeof(text), "%d.%d.%d", FSDP2_VERSION_MAJOR, FSDP2_VERSION_MINOR,
             FSDP2_VERSION_PATCH);
    ck_assert_str_eq(text, FSDP2_VERSION_STRING);
}
END_TEST

START_TEST(status_values_are_distinct_and_the_enum_matches_the_map)
{
    for (int i = 0; i < STATUS_COUNT; i++)
        for (int j = i + 1; j < STATUS_COUNT; j++)
            ck_assert_msg(status_rows[i].value != status_rows[j].value,
                          "%s and %s share value %d", status_rows[i].name, status_rows[j].name,
                          (int)status_rows[i].value);
    ck_assert_int_eq(FSDP2_SUCCESS, 0);
    ck_assert_int_eq(FSDP2_ERR_SHAPE_MISMATCH, 4);
    ck_assert_int_eq(FSDP2_ERR_INTERNAL, 19);
}
END_TEST

START_TEST(every_status_name_equals_its_x_macro_token)
{
    for (int i = 0; i < STATUS_COUNT; i++) {
        const char *got = fsdp2_status_name(status_rows[i].value);
        ck_assert_ptr_nonnull(got);
        ck_assert_msg(strcmp(got, status_rows[i].name) == 0,
                      "fsdp2_status_name(%d) = '%s', expected '%s'", (int)status_rows[i].value,
                      got, status_rows[i].name);
    }
    ck_assert_str_eq(fsdp2_status_name(FSDP2_ERR_SHAPE_MISMATCH), "ERR_SHAPE_MISMATCH");
}
END_TEST

START_TEST(every_strerror_equals_its_x_macro_text_and_is_non_empty)
{
    for (int i = 0; i < STATUS_COUNT; i++) {
        const char *got = fsdp2_strerror(status_rows[i].value);
        ck_assert_ptr_nonnull(got);
        ck_assert_msg(got[0] != '\0', "fsdp2_strerror(%s) is empty", status_rows[i].name);
        ck_assert_msg(strcmp(got, status_rows[i].text) == 0,
                      "fsdp2_strerror(%s) = '%s', expected '%s'", status_rows[i].name, got,
                      status_rows[i].text);
    }
}
END_TEST

START_TEST(strerror_and_status_name_are_pairwise_distinct)
{
    for (int i = 0; i < STATUS_COUNT; i++) {
        for (int j = i + 1; j < STATUS_COUNT; j++) {
            const char *ti = fsdp2_strerror(status_rows[i].value);
            const char *tj = fsdp2_strerror(status_rows[j].value);
            ck_assert_msg(strcmp(ti, tj) != 0, "%s and %s share strerror '%s'",
                          status_rows[i].name, status_rows[j].name, ti);
            const char *ni = fsdp2_status_name(status_rows[i].value);
            const char *nj = fsdp2_status_name(status_rows[j].value);
            ck_assert_msg(strcmp(ni, nj) != 0, "%d and %d share status name '%s'",
                          (int)status_rows[i].value, (int)status_rows[j].value, ni);
        }
    }
}
END_TEST

START_TEST(values_outside_the_map_give_unknown_status_and_unknown_name)
{
    const int outside[] = {STATUS_COUNT, STATUS_COUNT + 1, 100, 1 << 20, -1};
    for (size_t i = 0; i < sizeof(outside) / sizeof(outside[0]); i++) {
        fsdp2_status_t s = (fsdp2_status_t)outside[i];
        const char *text = fsdp2_strerror(s);
        const char *name = fsdp2_status_name(s);
        ck_assert_ptr_nonnull(text);
        ck_assert_ptr_nonnull(name);
        ck_assert_msg(strcmp(text, "unknown status") == 0,
                      "fsdp2_strerror(%d) = '%s', expected 'unknown status'", outside[i], text);
        ck_assert_msg(strcmp(name, "UNKNOWN") == 0,
                      "fsdp2_status_name(%d) = '%s', expected 'UNKNOWN'", outside[i], name);
    }
}
END_TEST

/* ---------------------------------------------------------------------------------- */
/* The thread-local message                                                           */

START_TEST(last_error_is_empty_before_any_failure)
{
    ck_assert_ptr_nonnull(fsdp2_last_error());
    ck_assert_str_eq(fsdp2_last_error(), "");
}
END_TEST

START_TEST(device_parse_failure_message_names_the_bad_text)
{
    fsdp2_device_t device;
    fsdp2_status_t s = fsdp2_device_parse("gpu:0", &device);
    ck_assert_msg(s == FSDP2_ERR_INVALID_ARGUMENT, "status %s, expected ERR_INVALID_ARGUMENT",
                  fsdp2_status_name(s));
    ck_assert_msg(strstr(fsdp2_last_error(), "gpu:0") != NULL,
                  "message '%s' does not contain 'gpu:0'", fsdp2_last_error());
}
END_TEST

START_TEST(message_survives_a_later_successful_call_on_the_same_thread)
{
    fsdp2_device_t device;
    ck_assert_int_eq(fsdp2_device_parse("gpu:0", &device), FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(fsdp2_device_parse("cpu", &device), FSDP2_SUCCESS);
    ck_assert_msg(strstr(fsdp2_last_error(), "gpu:0") != NULL,
                  "message after a success is '%s', expected the earlier one naming 'gpu:0'",
                  fsdp2_last_error());
}
END_TEST

START_TEST(a_later_failure_replaces_the_message)
{
    fsdp2_device_t device;
    ck_assert_int_eq(fsdp2_device_parse("gpu:0", &device), FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(fsdp2_device_parse("tpu:7", &device), FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_msg(strstr(fsdp2_last_error(), "tpu:7") != NULL &&
                      strstr(fsdp2_last_error(), "gpu:0") == NULL,
                  "message '%s', expected one naming 'tpu:7' only", fsdp2_last_error());
}
END_TEST

/* A caller that wraps the message it was given passes fsdp2_last_error() to fsdp2_error,
 * whose own buffer it is: the new message must hold the old one whole. */
START_TEST(wrapping_the_last_message_keeps_it_whole)
{
    fsdp2_device_t device;
    ck_assert_int_eq(fsdp2_device_parse("tpu:7", &device), FSDP2_ERR_INVALID_ARGUMENT);
    char before[512];
    snprintf(before, sizeof(before), "%s", fsdp2_last_error());
    ck_assert_int_eq(fsdp2_error(FSDP2_ERR_IO, "while loading: %s (%d)", fsdp2_last_error(), 42),
                     FSDP2_ERR_IO);
    char want[600];
    snprintf(want, sizeof(want), "while loading: %s (42)", before);
    ck_assert_str_eq(fsdp2_last_error(), want);
}
END_TEST

struct thread_result {
    char before[256]; /* the thread's message before it fails */
    char after[256];  /* and after */
    fsdp2_status_t status;
};

static void *fail_on_other_thread(void *arg)
{
    struct thread_result *r = arg;
    snprintf(r->before, sizeof(r->before), "%s", fsdp2_last_error());
    fsdp2_device_t device;
    r->status = fsdp2_device_parse("other-thread-device", &device);
    snprintf(r->after, sizeof(r->after), "%s", fsdp2_last_error());
    return NULL;
}

START_TEST(last_error_is_thread_local)
{
    fsdp2_device_t device;
    ck_assert_int_eq(fsdp2_device_parse("gpu:0", &device), FSDP2_ERR_INVALID_ARGUMENT);
    char main_before[256];
    snprintf(main_before, sizeof(main_before), "%s", fsdp2_last_error());

    struct thread_result r;
    memset(&r, 0, sizeof(r));
    pthread_t thread;
    ck_assert_int_eq(pthread_create(&thread, NULL, fail_on_other_thread, &r), 0);
    ck_assert_int_eq(pthread_join(thread, NULL), 0);

    /* The new thread starts with no message: the main thread's is not visible there. */
    ck_assert_msg(r.before[0] == '\0', "second thread's initial message is '%s', expected ''",
                  r.before);
    ck_assert_int_eq(r.status, FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_msg(strstr(r.after, "other-thread-device") != NULL,
                  "second thread's message '%s' does not name 'other-thread-device'", r.after);
    ck_assert_msg(strcmp(fsdp2_last_error(), main_before) == 0,
                  "main thread's message changed from '%s' to '%s'", main_before,
                  fsdp2_last_error());
}
END_TEST

/* ---------------------------------------------------------------------------------- */
/* Log settings                                                                        */

START_TEST(log_set_level_accepts_every_level_from_error_to_trace)
{
    for (int level = FSDP2_LOG_ERROR; level <= FSDP2_LOG_TRACE; level++) {
        fsdp2_status_t s = fsdp2_log_set_level((fsdp2_log_level_t)level);
        ck_assert_msg(s == FSDP2_SUCCESS, "fsdp2_log_set_level(%d) = %s (%s)", level,
                      fsdp2_status_name(s), fsdp2_last_error());
    }
    /* Leave the level quiet: TRACE would log every later call of this forked test. */
    ck_assert_int_eq(fsdp2_log_set_level(FSDP2_LOG_WARN), FSDP2_SUCCESS);
}
END_TEST

START_TEST(log_set_level_rejects_7_and_names_it)
{
    fsdp2_status_t s = fsdp2_log_set_level((fsdp2_log_level_t)7);
    ck_assert_msg(s == FSDP2_ERR_INVALID_ARGUMENT, "status %s, expected ERR_INVALID_ARGUMENT",
                  fsdp2_status_name(s));
    ck_assert_msg(strstr(fsdp2_last_error(), "7") != NULL, "message '%s' does not contain '7'",
                  fsdp2_last_error());
}
END_TEST

START_TEST(log_set_level_rejects_negative_level)
{
    fsdp2_status_t s = fsdp2_log_set_level((fsdp2_log_level_t)-1);
    ck_assert_msg(s == FSDP2_ERR_INVALID_ARGUMENT, "status %s, expected ERR_INVALID_ARGUMENT",
                  fsdp2_status_name(s));
    ck_assert_msg(strstr(fsdp2_last_error(), "-1") != NULL, "message '%s' does not contain '-1'",
                  fsdp2_last_error());
}
END_TEST

START_TEST(log_set_rank_accepts_minus_one_and_rejects_minus_two)
{
    ck_assert_int_eq(fsdp2_log_set_rank(-1), FSDP2_SUCCESS);
    ck_assert_int_eq(fsdp2_log_set_rank(0), FSDP2_SUCCESS);
    ck_assert_int_eq(fsdp2_log_set_rank(12345), FSDP2_SUCCESS);
    fsdp2_status_t s = fsdp2_log_set_rank(-2);
    ck_assert_msg(s == FSDP2_ERR_INVALID_ARGUMENT, "status %s, expected ERR_INVALID_ARGUMENT",
                  fsdp2_status_name(s));
    ck_assert_msg(strstr(fsdp2_last_error(), "-2") != NULL, "message '%s' does not contain '-2'",
                  fsdp2_last_error());
}
END_TEST

static TCase *tcase_new(const char *name)
{
    TCase *tc = tcase_create(name);
    tcase_set_timeout(tc, TEST_TIMEOUT_S);
    return tc;
}

static Suite *status_suite(void)
{
    Suite *s = suite_create("status");

    TCase *names = tcase_new("names");
    tcase_add_test(names, the_library_reports_the_version_of_its_header);
    tcase_add_test(names, status_values_are_distinct_and_the_enum_matches_the_map);
    tcase_add_test(names, every_status_name_equals_its_x_macro_token);
    tcase_add_test(names, every_strerror_equals_its_x_macro_text_and_is_non_empty);
    tcase_add_test(names, strerror_and_status_name_are_pairwise_distinct);
    tcase_add_test(names, values_outside_the_map_give_unknown_status_and_unknown_name);
    suite_add_tcase(s, names);

    TCase *last_error = tcase_new("last_error");
    tcase_add_test(last_error, last_error_is_empty_before_any_failure);
    tcase_add_test(last_error, device_parse_failure_message_names_the_bad_text);
    tcase_add_test(last_error, message_survives_a_later_successful_call_on_the_same_thread);
    tcase_add_test(last_error, a_later_failure_replaces_the_message);
    tcase_add_test(last_error, wrapping_the_last_message_keeps_it_whole);
    tcase_add_test(last_error, last_error_is_thread_local);
    suite_add_tcase(s, last_error);

    TCase *log = tcase_new("log");
    tcase_add_test(log, log_set_level_accepts_every_level_from_error_to_trace);
    tcase_add_test(log, log_set_level_rejects_7_and_names_it);
    tcase_add_test(log, log_set_level_rejects_negative_level);
    tcase_add_test(log, log_set_rank_accepts_minus_one_and_rejects_minus_two);
    suite_add_tcase(s, log);

    return s;
}

FSDP2_CHECK_MAIN(status_suite)
