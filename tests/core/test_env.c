/* Tests for the environment table (fsdp2/env.h, lib/core/env_internal.h) and the INFO
 * lines it logs.
 *
 * Check runs every test in its own forked process, and main() calls nothing in the
 * library, so each test starts with fsdp2_env_init's pthread_once not yet run: a test
 * sets its variables first and then makes its first library call (or calls the
 * internal fsdp2_env_reload). The expected values are written out here from the
 * documented defaults and ranges, not read back from the library's table, except where
 * a test is about the table itself ("every default parses", "every name is listed"). */
#include <check.h>

#include "check_main.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <fsdp2/device.h>
#include <fsdp2/env.h>
#include <fsdp2/log.h>
#include <fsdp2/status.h>
#include <fsdp2/stream.h>

#include "core/env_internal.h"
#include "core/log_internal.h"

#define TEST_TIMEOUT_S 30

struct env_row {
    fsdp2_env_id_t id;
    const char *name;
    const char *def;
    const char *accepted;
};

static const struct env_row env_rows[FSDP2_ENV_COUNT] = {
#define ENV_ROW_(id, var, kind, def, accepted, help) {FSDP2_ENV_##id, var, def, accepted},
    FSDP2_ENV_MAP(ENV_ROW_)
#undef ENV_ROW_
};

/* Unsets every variable of the table, so the test does not depend on the caller's
 * environment. */
static void env_clear(void)
{
    for (int i = 0; i < FSDP2_ENV_COUNT; i++)
        unsetenv(env_rows[i].name);
}

static void env_set(const char *name, const char *value)
{
    ck_assert_int_eq(setenv(name, value, 1), 0);
}

/* ---------------------------------------------------------------------------------- */
/* Defaults                                                                            */

START_TEST(defaults_when_nothing_is_set_match_the_documented_values)
{
    env_clear();
    fsdp2_status_t s = fsdp2_env_init();
    ck_assert_msg(s == FSDP2_SUCCESS, "fsdp2_env_init = %s (%s)", fsdp2_status_name(s),
                  fsdp2_last_error());
    ck_assert_int_eq(fsdp2_env_int(FSDP2_ENV_LOG_LEVEL), FSDP2_LOG_WARN);
    ck_assert_int_eq(fsdp2_env_int(FSDP2_ENV_TIMEOUT), 300000);
    ck_assert_int_eq(fsdp2_env_int(FSDP2_ENV_CPU_STREAM_DEPTH), 1024);
    int64_t subsys = fsdp2_env_int(FSDP2_ENV_LOG_SUBSYS);
    /* "all": the nine documented subsystems init..text are bits 0..8. */
    ck_assert_msg((subsys & 0x1ff) == 0x1ff, "LOG_SUBSYS default = %#llx, expected bits 0..8 set",
                  (long long)subsys);
}
END_TEST

START_TEST(reload_with_every_variable_unset_succeeds)
{
    env_clear();
    fsdp2_status_t s = fsdp2_env_reload();
    ck_assert_msg(s == FSDP2_SUCCESS, "fsdp2_env_reload = %s (%s)", fsdp2_status_name(s),
                  fsdp2_last_error());
}
END_TEST

/* Unset, a variable falls back to its default even if the default text were broken (the
 * parser then uses 0), so set each default explicitly: it must parse, and to the same
 * value as leaving the variable unset. */
START_TEST(every_default_in_the_table_parses_to_the_unset_value)
{
    for (int i = 0; i < FSDP2_ENV_COUNT; i++) {
        env_clear();
        ck_assert_int_eq(fsdp2_env_reload(), FSDP2_SUCCESS);
        int64_t unset_value = fsdp2_env_int(env_rows[i].id);
        env_set(env_rows[i].name, env_rows[i].def);
        fsdp2_status_t s = fsdp2_env_reload();
        ck_assert_msg(s == FSDP2_SUCCESS, "%s=%s (its default) gives %s: %s", env_rows[i].name,
                      env_rows[i].def, fsdp2_status_name(s), fsdp2_last_error());
        ck_assert_msg(fsdp2_env_int(env_rows[i].id) == unset_value,
                      "%s=%s parses to %lld, unset gives %lld", env_rows[i].name,
                      env_rows[i].def, (long long)fsdp2_env_int(env_rows[i].id),
                      (long long)unset_value);
    }
}
END_TEST

/* ---------------------------------------------------------------------------------- */
/* Bad values                                                                          */

struct bad_value {
    const char *name;
    const char *value;
    const char *accepted; /* what the message must list */
    fsdp2_env_id_t id;
    int64_t def; /* the value that stays in effect */
};

static const struct bad_value bad_values[] = {
    {"FSDP2_LOG_LEVEL", "loud", "error|warn|info|debug|trace", FSDP2_ENV_LOG_LEVEL, 1},
    {"FSDP2_LOG_LEVEL", "", "error|warn|info|debug|trace", FSDP2_ENV_LOG_LEVEL, 1},
    {"FSDP2_TIMEOUT", "abc", "0.001..604800", FSDP2_ENV_TIMEOUT, 300000},
    {"FSDP2_TIMEOUT", "-1", "0.001..604800", FSDP2_ENV_TIMEOUT, 300000},
    {"FSDP2_TIMEOUT", "0", "0.001..604800", FSDP2_ENV_TIMEOUT, 300000},
    {"FSDP2_TIMEOUT", "604801", "0.001..604800", FSDP2_ENV_TIMEOUT, 300000},
    {"FSDP2_TIMEOUT", "nan", "0.001..604800", FSDP2_ENV_TIMEOUT, 300000},
    {"FSDP2_TIMEOUT", "5s", "0.001..604800", FSDP2_ENV_TIMEOUT, 300000},
    /* decimal only: strtod alone would read hex, exponents and infinity */
    {"FSDP2_TIMEOUT", "0x10", "0.001..604800", FSDP2_ENV_TIMEOUT, 300000},
    {"FSDP2_TIMEOUT", "1e3", "0.001..604800", FSDP2_ENV_TIMEOUT, 300000},
    {"FSDP2_TIMEOUT", "inf", "0.001..604800", FSDP2_ENV_TIMEOUT, 300000},
    {"FSDP2_TIMEOUT", " 5", "0.001..604800", FSDP2_ENV_TIMEOUT, 300000},
    {"FSDP2_TIMEOUT", ".", "0.001..604800", FSDP2_ENV_TIMEOUT, 300000},
    {"FSDP2_CPU_STREAM_DEPTH", "2", "4..1048576", FSDP2_ENV_CPU_STREAM_DEPTH, 1024},
    {"FSDP2_CPU_STREAM_DEPTH", "12x", "4..1048576", FSDP2_ENV_CPU_STREAM_DEPTH, 1024},
    {"FSDP2_CPU_STREAM_DEPTH", "1048577", "4..1048576", FSDP2_ENV_CPU_STREAM_DEPTH, 1024},
    {"FSDP2_CPU_STREAM_DEPTH", "99999999999999999999", "4..1048576",
     FSDP2_ENV_CPU_STREAM_DEPTH, 1024},
    {"FSDP2_CPU_STREAM_DEPTH", "64.5", "4..1048576", FSDP2_ENV_CPU_STREAM_DEPTH, 1024},
    /* one integer syntax: no space, no '+', the whole text, within range */
    {"FSDP2_CPU_STREAM_DEPTH", " 5", "4..1048576", FSDP2_ENV_CPU_STREAM_DEPTH, 1024},
    {"FSDP2_CPU_STREAM_DEPTH", "+5", "4..1048576", FSDP2_ENV_CPU_STREAM_DEPTH, 1024},
    {"FSDP2_CPU_STREAM_DEPTH", "5 ", "4..1048576", FSDP2_ENV_CPU_STREAM_DEPTH, 1024},
    {"FSDP2_CPU_STREAM_DEPTH", "5x", "4..1048576", FSDP2_ENV_CPU_STREAM_DEPTH, 1024},
    {"FSDP2_CPU_STREAM_DEPTH", "", "4..1048576", FSDP2_ENV_CPU_STREAM_DEPTH, 1024},
    {"FSDP2_CPU_STREAM_DEPTH", "0x10", "4..1048576", FSDP2_ENV_CPU_STREAM_DEPTH, 1024},
    {"FSDP2_CPU_STREAM_DEPTH", "-5", "4..1048576", FSDP2_ENV_CPU_STREAM_DEPTH, 1024},
    {"FSDP2_CPU_STREAM_DEPTH", "9223372036854775808", "4..1048576", FSDP2_ENV_CPU_STREAM_DEPTH,
     1024},
    {"FSDP2_FAULT_RANK", "--1", "-1..1048575", FSDP2_ENV_FAULT_RANK, -1},
    {"FSDP2_FAULT_RANK", "-2", "-1..1048575", FSDP2_ENV_FAULT_RANK, -1},
    {"FSDP2_FAULT_RANK", "+1", "-1..1048575", FSDP2_ENV_FAULT_RANK, -1},
    {"FSDP2_RUN_REPORT_FD", " 5", "-1..1048576", FSDP2_ENV_RUN_REPORT_FD, -1},
    {"FSDP2_CPU_MEMORY_LIMIT", " 5", "0..1125899906842624", FSDP2_ENV_CPU_MEMORY_LIMIT, 0},
    {"FSDP2_CPU_MEMORY_LIMIT", "+5", "0..1125899906842624", FSDP2_ENV_CPU_MEMORY_LIMIT, 0},
    {"FSDP2_CPU_MEMORY_LIMIT", "", "0..1125899906842624", FSDP2_ENV_CPU_MEMORY_LIMIT, 0},
    {"FSDP2_TIMEOUT", "+5", "0.001..604800", FSDP2_ENV_TIMEOUT, 300000},
    {"FSDP2_TIMEOUT", "", "0.001..604800", FSDP2_ENV_TIMEOUT, 300000},
    {"FSDP2_LOG_SUBSYS", "stream,bogus", "init|core|stream|mesh|coll|fsdp|ckpt|optim|text|nn",
     FSDP2_ENV_LOG_SUBSYS, -1},
    {"FSDP2_LOG_SUBSYS", "stream,,coll", "init|core|stream|mesh|coll|fsdp|ckpt|optim|text|nn",
     FSDP2_ENV_LOG_SUBSYS, -1},
    {"FSDP2_CPU_MEMORY_LIMIT", "-1", "0..1125899906842624", FSDP2_ENV_CPU_MEMORY_LIMIT, 0},
    {"FSDP2_CPU_MEMORY_LIMIT", "3X", "0..1125899906842624", FSDP2_ENV_CPU_MEMORY_LIMIT, 0},
    {"FSDP2_CPU_MEMORY_LIMIT", "1.5G", "0..1125899906842624", FSDP2_ENV_CPU_MEMORY_LIMIT, 0},
    {"FSDP2_CPU_MEMORY_LIMIT", "2GB", "0..1125899906842624", FSDP2_ENV_CPU_MEMORY_LIMIT, 0},
    {"FSDP2_CPU_MEMORY_LIMIT", "G", "0..1125899906842624", FSDP2_ENV_CPU_MEMORY_LIMIT, 0},
    {"FSDP2_CPU_MEMORY_LIMIT", "1025T", "0..1125899906842624", FSDP2_ENV_CPU_MEMORY_LIMIT, 0},
    {"FSDP2_CPU_MEMORY_LIMIT", "99999999999999999999", "0..1125899906842624",
     FSDP2_ENV_CPU_MEMORY_LIMIT, 0},
};

#define BAD_VALUE_COUNT ((int)(sizeof(bad_values) / sizeof(bad_values[0])))

static void assert_names_bad_value(const struct bad_value *b, const char *call,
                                   fsdp2_status_t s)
{
    const char *msg = fsdp2_last_error();
    ck_assert_msg(s == FSDP2_ERR_INVALID_CONFIG, "%s with %s='%s' = %s, expected "
                  "ERR_INVALID_CONFIG", call, b->name, b->value, fsdp2_status_name(s));
    ck_assert_msg(strstr(msg, b->name) != NULL, "%s: message '%s' does not name %s", call, msg,
                  b->name);
    char quoted[128];
    snprintf(quoted, sizeof(quoted), "'%s'", b->value);
    ck_assert_msg(strstr(msg, quoted) != NULL, "%s: message '%s' does not name the value %s",
                  call, msg, quoted);
    ck_assert_msg(strstr(msg, b->accepted) != NULL,
                  "%s: message '%s' does not list the accepted values '%s'", call, msg,
                  b->accepted);
}

START_TEST(bad_value_is_invalid_config_naming_variable_value_and_accepted)
{
    const struct bad_value *b = &bad_values[_i];
    env_clear();
    env_set(b->name, b->value);
    assert_names_bad_value(b, "fsdp2_env_reload", fsdp2_env_reload());
    /* Read once: later calls give the same answer. */
    assert_names_bad_value(b, "fsdp2_env_init", fsdp2_env_init());
    ck_assert_msg(fsdp2_env_int(b->id) == b->def,
                  "%s='%s' was rejected but its value is %lld, expected the default %lld",
                  b->name, b->value, (long long)fsdp2_env_int(b->id), (long long)b->def);
}
END_TEST

START_TEST(bad_value_makes_first_call_env_init_fail_without_reload)
{
    const struct bad_value *b = &bad_values[_i];
    env_clear();
    env_set(b->name, b->value);
    assert_names_bad_value(b, "fsdp2_env_init", fsdp2_env_init());
}
END_TEST

START_TEST(bad_value_makes_cpu_stream_create_fail_with_the_same_error)
{
    const struct bad_value *b = &bad_values[_i];
    env_clear();
    env_set(b->name, b->value);
    fsdp2_device_t cpu = FSDP2_DEVICE_CPU_INIT;
    fsdp2_stream_t *stream = (fsdp2_stream_t *)&stream; /* must be overwritten */
    fsdp2_status_t s = fsdp2_stream_create(cpu, "env-test", &stream);
    assert_names_bad_value(b, "fsdp2_stream_create(cpu)", s);
    ck_assert_ptr_null(stream);
}
END_TEST

START_TEST(first_bad_variable_in_table_order_is_reported_when_two_are_bad)
{
    env_clear();
    env_set("FSDP2_LOG_LEVEL", "loud");
    env_set("FSDP2_TIMEOUT", "abc");
    ck_assert_int_eq(fsdp2_env_reload(), FSDP2_ERR_INVALID_CONFIG);
    ck_assert_msg(strstr(fsdp2_last_error(), "FSDP2_LOG_LEVEL='loud'") != NULL,
                  "message '%s', expected the first bad variable, FSDP2_LOG_LEVEL='loud'",
                  fsdp2_last_error());
}
END_TEST

START_TEST(fixing_the_value_and_reloading_clears_the_error)
{
    env_clear();
    env_set("FSDP2_TIMEOUT", "abc");
    ck_assert_int_eq(fsdp2_env_reload(), FSDP2_ERR_INVALID_CONFIG);
    env_set("FSDP2_TIMEOUT", "7");
    fsdp2_status_t s = fsdp2_env_reload();
    ck_assert_msg(s == FSDP2_SUCCESS, "reload after fixing = %s (%s)", fsdp2_status_name(s),
                  fsdp2_last_error());
    ck_assert_int_eq(fsdp2_env_init(), FSDP2_SUCCESS);
    ck_assert_int_eq(fsdp2_env_int(FSDP2_ENV_TIMEOUT), 7000);
}
END_TEST

/* ---------------------------------------------------------------------------------- */
/* Good values                                                                         */

struct good_value {
    const char *name;
    const char *value;
    fsdp2_env_id_t id;
    int64_t expected;
};

static const struct good_value good_values[] = {
    {"FSDP2_TIMEOUT", "2.5", FSDP2_ENV_TIMEOUT, 2500},
    {"FSDP2_TIMEOUT", "0.001", FSDP2_ENV_TIMEOUT, 1},
    {"FSDP2_TIMEOUT", "604800", FSDP2_ENV_TIMEOUT, 604800000},
    {"FSDP2_TIMEOUT", ".5", FSDP2_ENV_TIMEOUT, 500},
    {"FSDP2_TIMEOUT", "7.", FSDP2_ENV_TIMEOUT, 7000},
    {"FSDP2_CPU_STREAM_DEPTH", "4", FSDP2_ENV_CPU_STREAM_DEPTH, 4},
    {"FSDP2_CPU_STREAM_DEPTH", "1048576", FSDP2_ENV_CPU_STREAM_DEPTH, 1048576},
    {"FSDP2_CPU_STREAM_DEPTH", "100", FSDP2_ENV_CPU_STREAM_DEPTH, 100},
    {"FSDP2_LOG_LEVEL", "error", FSDP2_ENV_LOG_LEVEL, FSDP2_LOG_ERROR},
    {"FSDP2_LOG_LEVEL", "warn", FSDP2_ENV_LOG_LEVEL, FSDP2_LOG_WARN},
    {"FSDP2_LOG_LEVEL", "info", FSDP2_ENV_LOG_LEVEL, FSDP2_LOG_INFO},
    {"FSDP2_LOG_LEVEL", "debug", FSDP2_ENV_LOG_LEVEL, FSDP2_LOG_DEBUG},
    {"FSDP2_LOG_LEVEL", "trace", FSDP2_ENV_LOG_LEVEL, FSDP2_LOG_TRACE},
    /* Bit i is the i-th name of log.h's list init,core,stream,mesh,coll,fsdp,ckpt,optim,text,
     * nn. */
    {"FSDP2_LOG_SUBSYS", "stream,coll", FSDP2_ENV_LOG_SUBSYS, (1 << 2) | (1 << 4)},
    {"FSDP2_LOG_SUBSYS", "init", FSDP2_ENV_LOG_SUBSYS, 1 << 0},
    {"FSDP2_LOG_SUBSYS", "optim,init", FSDP2_ENV_LOG_SUBSYS, (1 << 7) | (1 << 0)},
    {"FSDP2_LOG_SUBSYS", "coll,coll", FSDP2_ENV_LOG_SUBSYS, 1 << 4},
    {"FSDP2_LOG_SUBSYS", "text,nn", FSDP2_ENV_LOG_SUBSYS, (1 << 8) | (1 << 9)},
    {"FSDP2_FAULT_RANK", "-1", FSDP2_ENV_FAULT_RANK, -1},
    {"FSDP2_FAULT_RANK", "0", FSDP2_ENV_FAULT_RANK, 0},
    {"FSDP2_FAULT_AT", "1000000000000", FSDP2_ENV_FAULT_AT, 1000000000000ll},
    {"FSDP2_RUN_REPORT_FD", "7", FSDP2_ENV_RUN_REPORT_FD, 7},
    {"FSDP2_TRACE", "/tmp/t.json", FSDP2_ENV_TRACE, 1},
    {"FSDP2_TRACE", "", FSDP2_ENV_TRACE, 0},
    {"FSDP2_CPU_MEMORY_LIMIT", "0", FSDP2_ENV_CPU_MEMORY_LIMIT, 0},
    {"FSDP2_CPU_MEMORY_LIMIT", "4096", FSDP2_ENV_CPU_MEMORY_LIMIT, 4096},
    {"FSDP2_CPU_MEMORY_LIMIT", "512K", FSDP2_ENV_CPU_MEMORY_LIMIT, 512 << 10},
    {"FSDP2_CPU_MEMORY_LIMIT", "3M", FSDP2_ENV_CPU_MEMORY_LIMIT, 3 << 20},
    {"FSDP2_CPU_MEMORY_LIMIT", "24G", FSDP2_ENV_CPU_MEMORY_LIMIT, 24ll << 30},
    {"FSDP2_CPU_MEMORY_LIMIT", "1024T", FSDP2_ENV_CPU_MEMORY_LIMIT, 1024ll << 40},
};

#define GOOD_VALUE_COUNT ((int)(sizeof(good_values) / sizeof(good_values[0])))

START_TEST(good_value_parses_to_the_expected_number)
{
    const struct good_value *g = &good_values[_i];
    env_clear();
    env_set(g->name, g->value);
    /* Keeps FSDP2_LOG_LEVEL=info..trace from printing the table into the test output. */
    ck_assert_int_eq(fsdp2_log_set_level(FSDP2_LOG_ERROR), FSDP2_SUCCESS);
    fsdp2_status_t s = fsdp2_env_reload();
    ck_assert_msg(s == FSDP2_SUCCESS, "%s='%s' = %s (%s)", g->name, g->value,
                  fsdp2_status_name(s), fsdp2_last_error());
    int64_t got = fsdp2_env_int(g->id);
    ck_assert_msg(got == g->expected, "%s='%s' parses to %lld (%#llx), expected %lld (%#llx)",
                  g->name, g->value, (long long)got, (long long)got, (long long)g->expected,
                  (long long)g->expected);
}
END_TEST

START_TEST(log_subsys_all_sets_every_documented_subsystem_bit)
{
    env_clear();
    env_set("FSDP2_LOG_SUBSYS", "all");
    ck_assert_int_eq(fsdp2_env_reload(), FSDP2_SUCCESS);
    int64_t got = fsdp2_env_int(FSDP2_ENV_LOG_SUBSYS);
    ck_assert_msg((got & 0x1ff) == 0x1ff, "LOG_SUBSYS=all gives %#llx, expected bits 0..8 set",
                  (long long)got);
}
END_TEST

START_TEST(good_cpu_stream_depth_lets_cpu_stream_create_succeed)
{
    env_clear();
    env_set("FSDP2_CPU_STREAM_DEPTH", "4");
    fsdp2_device_t cpu = FSDP2_DEVICE_CPU_INIT;
    fsdp2_stream_t *stream = NULL;
    fsdp2_status_t s = fsdp2_stream_create(cpu, "env-test", &stream);
    ck_assert_msg(s == FSDP2_SUCCESS, "fsdp2_stream_create = %s (%s)", fsdp2_status_name(s),
                  fsdp2_last_error());
    ck_assert_ptr_nonnull(stream);
    ck_assert_int_eq(fsdp2_stream_synchronize(stream), FSDP2_SUCCESS);
    ck_assert_int_eq(fsdp2_stream_destroy(stream), FSDP2_SUCCESS);
}
END_TEST

/* ---------------------------------------------------------------------------------- */
/* The one integer syntax, for variables outside the table (RANK, SLURM_NNODES, ...)    */

struct int_case {
    const char *text;
    int ok;
    int64_t value;
};

static const struct int_case int_cases[] = {
    {"5", 1, 5},       {"0", 1, 0},        {"-3", 1, -3},   {"10", 1, 10},
    {" 5", 0, 0},      {"+5", 0, 0},       {"5 ", 0, 0},    {"5x", 0, 0},
    {"", 0, 0},        {"-", 0, 0},        {"--3", 0, 0},   {"0x10", 0, 0},
    {"11", 0, 0},      {"-11", 0, 0},      {"1e1", 0, 0},   {"99999999999999999999", 0, 0},
    {"-9223372036854775809", 0, 0},
};

#define INT_CASE_COUNT ((int)(sizeof(int_cases) / sizeof(int_cases[0])))

START_TEST(parse_int_takes_only_plain_decimals_in_range_and_names_variable_and_value)
{
    const struct int_case *c = &int_cases[_i];
    int64_t got = 42;
    fsdp2_status_t s = fsdp2_env_parse_int("SOME_RANK", c->text, -10, 10, &got);
    if (c->ok) {
        ck_assert_msg(s == FSDP2_SUCCESS, "'%s': %s (%s)", c->text, fsdp2_status_name(s),
                      fsdp2_last_error());
        ck_assert_msg(got == c->value, "'%s' parses to %lld, expected %lld", c->text,
                      (long long)got, (long long)c->value);
        return;
    }
    ck_assert_msg(s == FSDP2_ERR_INVALID_CONFIG, "'%s' = %s, expected ERR_INVALID_CONFIG",
                  c->text, fsdp2_status_name(s));
    ck_assert_int_eq(got, 42);
    char quoted[64];
    snprintf(quoted, sizeof(quoted), "SOME_RANK='%s'", c->text);
    ck_assert_msg(strstr(fsdp2_last_error(), quoted) && strstr(fsdp2_last_error(), "-10..10"),
                  "message '%s' lacks %s or the range -10..10", fsdp2_last_error(), quoted);
    int64_t quiet = 42;
    ck_assert_int_eq(fsdp2_env_decimal(c->text, -10, 10, &quiet), 0);
    ck_assert_int_eq(quiet, 42);
}
END_TEST

/* ---------------------------------------------------------------------------------- */
/* Text variables (paths, the secret)                                                  */

START_TEST(a_path_is_read_once_and_kept_when_the_process_changes_it)
{
    env_clear();
    env_set("FSDP2_CUDA_MODULE", "/opt/a/libfsdp2-cuda.so");
    ck_assert_int_eq(fsdp2_env_reload(), FSDP2_SUCCESS);
    env_set("FSDP2_CUDA_MODULE", "/opt/b/libfsdp2-cuda.so");
    ck_assert_str_eq(fsdp2_env_text(FSDP2_ENV_CUDA_MODULE), "/opt/a/libfsdp2-cuda.so");
    ck_assert_int_eq(fsdp2_env_reload(), FSDP2_SUCCESS);
    ck_assert_str_eq(fsdp2_env_text(FSDP2_ENV_CUDA_MODULE), "/opt/b/libfsdp2-cuda.so");
    env_set("FSDP2_CUDA_MODULE", "");
    ck_assert_int_eq(fsdp2_env_reload(), FSDP2_SUCCESS);
    ck_assert_ptr_null(fsdp2_env_text(FSDP2_ENV_CUDA_MODULE));
    unsetenv("FSDP2_CUDA_MODULE");
    ck_assert_int_eq(fsdp2_env_reload(), FSDP2_SUCCESS);
    ck_assert_ptr_null(fsdp2_env_text(FSDP2_ENV_CUDA_MODULE));
}
END_TEST

START_TEST(describe_shows_the_secrets_length_never_its_bytes)
{
    env_clear();
    env_set("FSDP2_STORE_SECRET", "hunter2-of-this-job");
    ck_assert_int_eq(fsdp2_env_reload(), FSDP2_SUCCESS);
    ck_assert_str_eq(fsdp2_env_text(FSDP2_ENV_STORE_SECRET), "hunter2-of-this-job");
    char buf[16384];
    ck_assert_int_eq(fsdp2_env_describe(buf, sizeof(buf), NULL), FSDP2_SUCCESS);
    ck_assert_msg(strstr(buf, "hunter2") == NULL, "describe shows the secret:\n%s", buf);
    ck_assert_msg(strstr(buf, "FSDP2_STORE_SECRET=(19 bytes, not shown)"), "%s", buf);
}
END_TEST

/* ---------------------------------------------------------------------------------- */
/* fsdp2_env_describe                                                                  */

START_TEST(describe_lists_every_variable_and_reports_needed)
{
    env_clear();
    char buf[16384];
    size_t needed = 0;
    ck_assert_int_eq(fsdp2_env_describe(buf, sizeof(buf), &needed), FSDP2_SUCCESS);
    ck_assert_msg(needed == strlen(buf) + 1, "needed = %zu, strlen + 1 = %zu", needed,
                  strlen(buf) + 1);
    for (int i = 0; i < FSDP2_ENV_COUNT; i++) {
        char line_start[128];
        snprintf(line_start, sizeof(line_start), "%s=%s (default)", env_rows[i].name,
                 env_rows[i].def);
        ck_assert_msg(strstr(buf, line_start) != NULL, "describe does not contain '%s':\n%s",
                      line_start, buf);
        ck_assert_msg(strstr(buf, env_rows[i].accepted) != NULL,
                      "describe does not list %s's accepted values '%s':\n%s", env_rows[i].name,
                      env_rows[i].accepted, buf);
    }
    int lines = 0;
    for (const char *p = buf; *p; p++)
        lines += *p == '\n';
    ck_assert_int_eq(lines, FSDP2_ENV_COUNT);
}
END_TEST

START_TEST(describe_shows_a_set_value_without_default_marker)
{
    env_clear();
    env_set("FSDP2_TIMEOUT", "2.5");
    char buf[8192];
    ck_assert_int_eq(fsdp2_env_describe(buf, sizeof(buf), NULL), FSDP2_SUCCESS);
    ck_assert_msg(strstr(buf, "FSDP2_TIMEOUT=2.5 ") != NULL &&
                      strstr(buf, "FSDP2_TIMEOUT=2.5 (default)") == NULL,
                  "describe with FSDP2_TIMEOUT=2.5:\n%s", buf);
    ck_assert_msg(strstr(buf, "FSDP2_LOG_LEVEL=warn (default)") != NULL,
                  "describe with only FSDP2_TIMEOUT set:\n%s", buf);
}
END_TEST

START_TEST(describe_needed_is_the_same_for_null_buffer_and_full_buffer)
{
    env_clear();
    size_t needed_null = 0, needed_full = 0;
    ck_assert_int_eq(fsdp2_env_describe(NULL, 0, &needed_null), FSDP2_SUCCESS);
    char buf[8192];
    ck_assert_int_eq(fsdp2_env_describe(buf, sizeof(buf), &needed_full), FSDP2_SUCCESS);
    ck_assert_msg(needed_null == needed_full && needed_full > 1,
                  "needed with NULL buffer %zu, with full buffer %zu", needed_null, needed_full);
}
END_TEST

START_TEST(describe_truncates_safely_into_10_bytes)
{
    env_clear();
    char full[8192];
    size_t needed_full = 0;
    ck_assert_int_eq(fsdp2_env_describe(full, sizeof(full), &needed_full), FSDP2_SUCCESS);

    /* The 10 bytes handed over are followed by a guard that must stay untouched. */
    char buf[64];
    memset(buf, 0x5a, sizeof(buf));
    size_t needed = 0;
    ck_assert_int_eq(fsdp2_env_describe(buf, 10, &needed), FSDP2_SUCCESS);
    ck_assert_msg(needed == needed_full, "needed %zu with 10 bytes, %zu with a full buffer",
                  needed, needed_full);
    ck_assert_msg(buf[9] == '\0', "byte 9 is %#x, expected the terminating NUL",
                  (unsigned char)buf[9]);
    ck_assert_msg(strncmp(buf, full, 9) == 0, "truncated '%s' is not the start of '%.9s'", buf,
                  full);
    for (size_t i = 10; i < sizeof(buf); i++)
        ck_assert_msg((unsigned char)buf[i] == 0x5a, "byte %zu past the 10-byte buffer was "
                      "written: %#x", i, (unsigned char)buf[i]);
}
END_TEST

START_TEST(describe_into_one_byte_writes_only_the_nul)
{
    env_clear();
    char buf[4] = {'x', 'x', 'x', 'x'};
    ck_assert_int_eq(fsdp2_env_describe(buf, 1, NULL), FSDP2_SUCCESS);
    ck_assert_int_eq(buf[0], '\0');
    ck_assert_int_eq(buf[1], 'x');
}
END_TEST

START_TEST(describe_rejects_null_buffer_with_nonzero_length)
{
    fsdp2_status_t s = fsdp2_env_describe(NULL, 10, NULL);
    ck_assert_msg(s == FSDP2_ERR_INVALID_ARGUMENT, "status %s, expected ERR_INVALID_ARGUMENT",
                  fsdp2_status_name(s));
    ck_assert_msg(strstr(fsdp2_last_error(), "10") != NULL, "message '%s' does not name len=10",
                  fsdp2_last_error());
}
END_TEST

/* ---------------------------------------------------------------------------------- */
/* INFO logging of the table                                                           */

/* Runs fsdp2_env_init with stderr sent to a temporary file; returns what was written
 * (malloc'd) and the status in *status. */
static char *capture_env_init(fsdp2_status_t *status, int calls)
{
    FILE *tmp = tmpfile();
    ck_assert_ptr_nonnull(tmp);
    fflush(stderr);
    int saved = dup(STDERR_FILENO);
    ck_assert_int_ge(saved, 0);
    ck_assert_int_ge(dup2(fileno(tmp), STDERR_FILENO), 0);
    for (int i = 0; i < calls; i++)
        *status = fsdp2_env_init();
    fflush(stderr);
    ck_assert_int_ge(dup2(saved, STDERR_FILENO), 0);
    close(saved);

    ck_assert_int_ge(fseek(tmp, 0, SEEK_END), 0);
    long size = ftell(tmp);
    ck_assert_int_ge(size, 0);
    rewind(tmp);
    char *text = calloc((size_t)size + 1, 1);
    ck_assert_ptr_nonnull(text);
    ck_assert_int_eq(fread(text, 1, (size_t)size, tmp), (size_t)size);
    fclose(tmp);
    return text;
}

static int count_substring(const char *text, const char *needle)
{
    int n = 0;
    for (const char *p = strstr(text, needle); p; p = strstr(p + 1, needle))
        n++;
    return n;
}

START_TEST(info_level_logs_each_variable_once_with_host_pid_rank_prefix)
{
    env_clear();
    env_set("FSDP2_LOG_LEVEL", "info");
    fsdp2_status_t s = FSDP2_ERR_INTERNAL;
    char *text = capture_env_init(&s, 2);
    ck_assert_msg(s == FSDP2_SUCCESS, "fsdp2_env_init = %s (%s)", fsdp2_status_name(s),
                  fsdp2_last_error());

    const char *line = strstr(text, "FSDP2_TIMEOUT=300 (default)");
    ck_assert_msg(line != NULL, "no 'FSDP2_TIMEOUT=300 (default)' in stderr:\n%s", text);
    while (line > text && line[-1] != '\n')
        line--;

    char host[256] = "?";
    gethostname(host, sizeof(host) - 1);
    char prefix[320];
    snprintf(prefix, sizeof(prefix), "%s:%d:- ", host, (int)getpid());
    ck_assert_msg(strncmp(line, prefix, strlen(prefix)) == 0,
                  "line '%.200s' does not start with '%s'", line, prefix);

    ck_assert_msg(strstr(text, "FSDP2_LOG_LEVEL=info\n") != NULL,
                  "the set FSDP2_LOG_LEVEL is not logged as 'FSDP2_LOG_LEVEL=info':\n%s", text);
    /* Two calls of fsdp2_env_init, yet each variable is logged once (read once). */
    for (int i = 0; i < FSDP2_ENV_COUNT; i++) {
        char needle[128];
        snprintf(needle, sizeof(needle), "%s=", env_rows[i].name);
        ck_assert_msg(count_substring(text, needle) == 1, "'%s' appears %d times, expected 1:\n%s",
                      needle, count_substring(text, needle), text);
    }
    free(text);
}
END_TEST

START_TEST(default_level_prints_nothing_on_env_init)
{
    env_clear();
    fsdp2_status_t s = FSDP2_ERR_INTERNAL;
    char *text = capture_env_init(&s, 1);
    ck_assert_int_eq(s, FSDP2_SUCCESS);
    ck_assert_msg(text[0] == '\0', "stderr at the default level was:\n%s", text);
    free(text);
}
END_TEST

START_TEST(log_subsys_without_init_silences_the_table_at_info)
{
    env_clear();
    env_set("FSDP2_LOG_LEVEL", "info");
    env_set("FSDP2_LOG_SUBSYS", "stream,coll");
    fsdp2_status_t s = FSDP2_ERR_INTERNAL;
    char *text = capture_env_init(&s, 1);
    ck_assert_int_eq(s, FSDP2_SUCCESS);
    ck_assert_msg(text[0] == '\0', "stderr with FSDP2_LOG_SUBSYS=stream,coll was:\n%s", text);
    free(text);
}
END_TEST

START_TEST(log_set_rank_shows_the_rank_in_the_prefix)
{
    env_clear();
    env_set("FSDP2_LOG_LEVEL", "info");
    ck_assert_int_eq(fsdp2_log_set_rank(3), FSDP2_SUCCESS);
    fsdp2_status_t s = FSDP2_ERR_INTERNAL;
    char *text = capture_env_init(&s, 1);
    ck_assert_int_eq(s, FSDP2_SUCCESS);
    char host[256] = "?";
    gethostname(host, sizeof(host) - 1);
    char prefix[320];
    snprintf(prefix, sizeof(prefix), "%s:%d:3 ", host, (int)getpid());
    ck_assert_msg(strncmp(text, prefix, strlen(prefix)) == 0,
                  "stderr '%.200s' does not start with '%s'", text, prefix);
    free(text);
}
END_TEST

static TCase *tcase_new(const char *name)
{
    TCase *tc = tcase_create(name);
    tcase_set_timeout(tc, TEST_TIMEOUT_S);
    return tc;
}

/* Every subsystem the log knows can be chosen by name: the variable's choices and the
 * log's list are two tables that must not drift apart. */
START_TEST(every_log_subsystem_is_a_choice_of_fsdp2_log_subsys)
{
    static const char *const names[] = {
#define SUBSYS_NAME_(name, str) str,
        FSDP2_SUBSYS_MAP(SUBSYS_NAME_)
#undef SUBSYS_NAME_
    };
    for (int i = 0; i < FSDP2_SUBSYS_COUNT; i++) {
        env_clear();
        env_set("FSDP2_LOG_SUBSYS", names[i]);
        ck_assert_msg(fsdp2_env_reload() == FSDP2_SUCCESS, "FSDP2_LOG_SUBSYS=%s: %s", names[i],
                      fsdp2_last_error());
        ck_assert_int_eq(fsdp2_env_int(FSDP2_ENV_LOG_SUBSYS), 1 << i);
    }
    env_clear();
    ck_assert_int_eq(fsdp2_env_reload(), FSDP2_SUCCESS);
}
END_TEST

static Suite *env_suite(void)
{
    Suite *s = suite_create("env");

    TCase *defaults = tcase_new("defaults");
    tcase_add_test(defaults, defaults_when_nothing_is_set_match_the_documented_values);
    tcase_add_test(defaults, reload_with_every_variable_unset_succeeds);
    tcase_add_test(defaults, every_log_subsystem_is_a_choice_of_fsdp2_log_subsys);
    tcase_add_test(defaults, every_default_in_the_table_parses_to_the_unset_value);
    suite_add_tcase(s, defaults);

    TCase *bad = tcase_new("bad_values");
    tcase_add_loop_test(bad, bad_value_is_invalid_config_naming_variable_value_and_accepted, 0,
                        BAD_VALUE_COUNT);
    tcase_add_loop_test(bad, bad_value_makes_first_call_env_init_fail_without_reload, 0,
                        BAD_VALUE_COUNT);
    tcase_add_loop_test(bad, bad_value_makes_cpu_stream_create_fail_with_the_same_error, 0,
                        BAD_VALUE_COUNT);
    tcase_add_test(bad, first_bad_variable_in_table_order_is_reported_when_two_are_bad);
    tcase_add_test(bad, fixing_the_value_and_reloading_clears_the_error);
    suite_add_tcase(s, bad);

    TCase *good = tcase_new("good_values");
    tcase_add_loop_test(good, good_value_parses_to_the_expected_number, 0, GOOD_VALUE_COUNT);
    tcase_add_test(good, log_subsys_all_sets_every_documented_subsystem_bit);
    tcase_add_test(good, good_cpu_stream_depth_lets_cpu_stream_create_succeed);
    tcase_add_loop_test(good,
                        parse_int_takes_only_plain_decimals_in_range_and_names_variable_and_value,
                        0, INT_CASE_COUNT);
    tcase_add_test(good, a_path_is_read_once_and_kept_when_the_process_changes_it);
    tcase_add_test(good, describe_shows_the_secrets_length_never_its_bytes);
    suite_add_tcase(s, good);

    TCase *describe = tcase_new("describe");
    tcase_add_test(describe, describe_lists_every_variable_and_reports_needed);
    tcase_add_test(describe, describe_shows_a_set_value_without_default_marker);
    tcase_add_test(describe, describe_needed_is_the_same_for_null_buffer_and_full_buffer);
    tcase_add_test(describe, describe_truncates_safely_into_10_bytes);
    tcase_add_test(describe, describe_into_one_byte_writes_only_the_nul);
    tcase_add_test(describe, describe_rejects_null_buffer_with_nonzero_length);
    suite_add_tcase(s, describe);

    TCase *logging = tcase_new("logging");
    tcase_add_test(logging, info_level_logs_each_variable_once_with_host_pid_rank_prefix);
    tcase_add_test(logging, default_level_prints_nothing_on_env_init);
    tcase_add_test(logging, log_subsys_without_init_silences_the_table_at_info);
    tcase_add_test(logging, log_set_rank_shows_the_rank_in_the_prefix);
    suite_add_tcase(s, logging);

    return s;
}

FSDP2_CHECK_MAIN(env_suite)
