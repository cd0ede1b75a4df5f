/* examples/common: a rank's GEMM threads (the CPUs a launcher bound it to, else its share
 * of the online ones) and the flag tables both example programs parse their command
 * lines with (values, aliases, the refusals' exit status 2). */
#include <check.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../core/check_main.h"
#include "common.h"

START_TEST(a_bound_rank_gets_its_cpus_else_its_share_of_the_online_ones)
{
    const struct {
        int bound;
        long online;
        int local, want;
    } cases[] = {
        {0, 8, 2, 4},  /* affinity unknown: 8 cores over 2 ranks */
        {8, 8, 2, 4},  /* bound to every CPU: not bound */
        {2, 8, 4, 2},  /* bound to 2 of 8 */
        {3, 16, 1, 3}, /* one rank bound to 3: 3, not 16 */
        {1, 2, 1, 1},
        {0, 2, 4, 1},  /* more ranks than cores: at least 1 */
        {4, 8, 0, 4},  /* no local world size known */
        {0, 8, 0, 8},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int got = example_threads_for(cases[i].bound, cases[i].online, cases[i].local);
        ck_assert_msg(got == cases[i].want, "bound %d, online %ld, %d local ranks: %d threads, "
                      "want %d", cases[i].bound, cases[i].online, cases[i].local, got,
                      cases[i].want);
    }
}
END_TEST

START_TEST(this_process_bound_to_one_cpu_gets_one_thread)
{
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    cpu_set_t set;
    ck_assert_int_eq(sched_getaffinity(0, sizeof(set), &set), 0);
    int first = 0;
    while (!CPU_ISSET(first, &set))
        first++;
    int all = CPU_COUNT(&set);
    if (all == online) /* not bound by whoever runs the test: the share of the host */
        ck_assert_int_eq(example_threads(1), (int)online);
    CPU_ZERO(&set);
    CPU_SET(first, &set);
    ck_assert_int_eq(sched_setaffinity(0, sizeof(set), &set), 0);
    int got = example_threads(1);
    ck_assert_msg(got == 1, "bound to CPU %d of %ld online: %d threads, want 1", first, online,
                  got);
}
END_TEST

typedef struct parsed {
    int on, n, given, calls;
    long big;
    double x;
    const char *name, *last_call;
} parsed_t;

static void record(const char *value, void *to)
{
    parsed_t *p = to;
    p->calls++;
    p->last_call = value;
}

static int usage_calls;

static void usage(const char *prog, const char *bad)
{
    (void)prog;
    fprintf(stderr, "usage%s%s\n", bad ? ": bad " : "", bad ? bad : "");
    usage_calls++;
    exit(2);
}

static void parse(int argc, char **argv, parsed_t *p, int usage_after_bad_value)
{
    memset(p, 0, sizeof(*p));
    const example_flag_t flags[] = {
        EXAMPLE_FLAG("--on", EXAMPLE_SWITCH, &p->on),
        {.name = "--name", .kind = EXAMPLE_STRING, .to = &p->name, .given = &p->given},
        EXAMPLE_RANGE("--n", EXAMPLE_INT, &p->n, 1, 10),
        EXAMPLE_RANGE("--also-n", EXAMPLE_INT, &p->n, 1, 10),
        EXAMPLE_RANGE("--big", EXAMPLE_LONG, &p->big, 0, 1L << 40),
        EXAMPLE_FLAG("--x", EXAMPLE_REAL, &p->x),
        EXAMPLE_CALLED("--call", record, p),
        EXAMPLE_FLAGS_END,
    };
    const example_cli_t cli = {usage, usage_after_bad_value};
    example_parse_flags(argc, argv, flags, &cli);
}

START_TEST(a_flag_table_sets_each_kind_and_aliases_share_a_target)
{
    char *argv[] = {"prog", "--n", "3", "--on", "--big", "1099511627776", "--x", "0.25",
                    "--call", "a", "--call", "b", "--also-n", "7", "--name", "z"};
    parsed_t p;
    parse(16, argv, &p, 0);
    ck_assert_int_eq(p.on, 1);
    ck_assert_int_eq(p.n, 7); /* the alias, given last */
    ck_assert(p.big == 1L << 40);
    ck_assert(p.x == 0.25);
    ck_assert_int_eq(p.calls, 2);
    ck_assert_str_eq(p.last_call, "b");
    ck_assert_str_eq(p.name, "z");
    ck_assert_int_eq(p.given, 1);
    char *none[] = {"prog"};
    parse(1, none, &p, 0);
    ck_assert_int_eq(p.given, 0);
    ck_assert_ptr_null(p.name);
}
END_TEST

/* Each of these exits 2 (Check's exit tests): out of range, not a number, negative, not
 * finite, a missing value, an unknown flag, --help; with the usage printed after a bad
 * value when asked (its exit comes from usage). */
static char *bad_lines[][3] = {
    {"prog", "--n", "11"},    {"prog", "--n", "3x"},   {"prog", "--x", "-1"},
    {"prog", "--x", "inf"},   {"prog", "--big", ""},   {"prog", "--name", NULL},
    {"prog", "--what", "1"},  {"prog", "--help", NULL},
};

START_TEST(bad_values_unknown_flags_and_help_exit_2)
{
    char **argv = bad_lines[_i];
    int argc = argv[2] ? 3 : 2;
    parsed_t p;
    parse(argc, argv, &p, _i % 2);
    ck_abort_msg("%s %s was accepted", argv[1], argv[2] ? argv[2] : "");
}
END_TEST

START_TEST(numbers_outside_the_flag_table_exit_2_too)
{
    ck_assert_int_eq(example_number("--k", "5", 1, 5), 5);
    ck_assert(example_real("--r", "1e-3") == 1e-3);
    if (_i == 0)
        example_number("--k", "6", 1, 5);
    else
        example_real("--r", "nan");
    ck_abort_msg("accepted");
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("example_common");
    TCase *tc = tcase_create("common");
    tcase_add_test(tc, a_bound_rank_gets_its_cpus_else_its_share_of_the_online_ones);
    tcase_add_test(tc, this_process_bound_to_one_cpu_gets_one_thread);
    tcase_add_test(tc, a_flag_table_sets_each_kind_and_aliases_share_a_target);
    tcase_add_loop_exit_test(tc, bad_values_unknown_flags_and_help_exit_2, 2, 0,
                             (int)(sizeof(bad_lines) / sizeof(bad_lines[0])));
    tcase_add_loop_exit_test(tc, numbers_outside_the_flag_table_exit_2_too, 2, 0, 2);
    suite_add_tcase(s, tc);
    return s;
}

FSDP2_CHECK_MAIN(suite)
