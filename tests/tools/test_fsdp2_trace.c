/* fsdp2-trace as a user runs it: the real binary on hand-written traces.
 *
 * traces/two_ranks.json is small enough to work out by hand; the numbers below are
 * computed from its slices in the comments, not read back from the tool. Broken
 * fixtures must each give exit 1 and one line naming the file and the problem, and no
 * output file. The SVG is checked for balanced tags and escaping here, with xmllint
 * and rsvg-convert when meson found them (XMLLINT, RSVG_CONVERT).
 *
 * Each test runs in its own process (Check forks) with its own directory; the tool
 * runs to completion with waitpid, and Check's timeout stops a hung one. */
#include <check.h>

#include "../core/check_main.h"
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char dir[256];

static const char *env(const char *var)
{
    const char *v = getenv(var);
    ck_assert_msg(v && *v, "%s is not set (meson sets it)", var);
    return v;
}

static const char *trace(const char *name)
{
    static char paths[8][512];
    static int next;
    char *p = paths[next++ % 8];
    snprintf(p, 512, "%s/%s", env("TRACES"), name);
    return p;
}

/* dir/name, in one of eight buffers used in turn */
static const char *in_dir(const char *name)
{
    static char paths[8][512];
    static int next;
    char *p = paths[next++ % 8];
    snprintf(p, 512, "%s/%s", dir, name);
    return p;
}

static void setup(void)
{
    snprintf(dir, sizeof(dir), "/tmp/fsdp2-trace-test-XXXXXX");
    ck_assert_msg(mkdtemp(dir) != NULL, "mkdtemp: %s", strerror(errno));
}

static void teardown(void)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    char path[600];
    while (d && (e = readdir(d)) != NULL) {
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        if (e->d_name[0] != '.')
            unlink(path);
    }
    if (d)
        closedir(d);
    rmdir(dir);
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "cannot open %s: %s", path, strerror(errno));
    size_t cap = 4096, len = 0, n;
    char *text = malloc(cap);
    while ((n = fread(text + len, 1, cap - len - 1, f)) > 0)
        if ((len += n) + 1 >= cap)
            text = realloc(text, cap *= 2);
    fclose(f);
    text[len] = '\0';
    return text;
}

static int exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

typedef struct result {
    int code;
    char *out, *err;
} result_t;

/* argv[0] .. NULL run to completion, stdout and stderr into files; dying of a signal
 * fails the test. */
static result_t run_program(const char *const *argv)
{
    char out[300], err[300];
    snprintf(out, sizeof(out), "%s/stdout", dir);
    snprintf(err, sizeof(err), "%s/stderr", dir);
    pid_t pid = fork();
    ck_assert_msg(pid >= 0, "fork: %s", strerror(errno));
    if (pid == 0) {
        int o = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        int e = open(err, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (o < 0 || e < 0 || dup2(o, 1) < 0 || dup2(e, 2) < 0)
            _exit(126);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    int status;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    result_t r = {0, slurp(out), slurp(err)};
    ck_assert_msg(WIFEXITED(status), "%s died of signal %d; stderr:\n%s", argv[0],
                  WIFSIGNALED(status) ? WTERMSIG(status) : 0, r.err);
    r.code = WEXITSTATUS(status);
    return r;
}

/* fsdp2-trace ARGS... (NULL-terminated) */
static result_t tool(const char *first, ...)
{
    const char *argv[32] = {env("FSDP2_TRACE_TOOL"), first};
    int n = 1;
    if (first != NULL) {
        va_list ap;
        va_start(ap, first);
        for (n = 2; n < 31 && (argv[n] = va_arg(ap, const char *)) != NULL;)
            n++;
        va_end(ap);
    }
    argv[n] = NULL;
    return run_program(argv);
}

static void result_free(result_t *r)
{
    free(r->out);
    free(r->err);
}

/* Exit 1 with exactly one line "fsdp2-trace: error: ..." holding each of the strings. */
static void assert_one_line_error(const result_t *r, const char *a, const char *b)
{
    ck_assert_msg(r->code == 1, "exit %d, not 1; stderr:\n%s", r->code, r->err);
    const char *nl = strchr(r->err, '\n');
    ck_assert_msg(strncmp(r->err, "fsdp2-trace: error: ", 20) == 0 && nl && nl[1] == '\0',
                  "stderr is not one error line:\n%s", r->err);
    ck_assert_msg(strstr(r->err, a) != NULL, "stderr lacks \"%s\":\n%s", a, r->err);
    ck_assert_msg(b == NULL || strstr(r->err, b) != NULL, "stderr lacks \"%s\":\n%s", b, r->err);
}

/* ---- check ----------------------------------------------------------------------- */

START_TEST(check_counts_slices_flows_counters_and_ranks)
{
    /* rank 0: 3 steps, 11 compute, 2 optimizer, 6 all-gather track, 5 reduce-scatter
     * track, 3 all-reduce track, 7 memory = 37; rank 1: 2 + 4 + 3 + 3 + 2 = 14.
     * Counters: 12 on rank 0 (two at ts 620) and 5 on rank 1. */
    result_t r = tool("check", trace("two_ranks.json"), NULL);
    ck_assert_msg(r.code == 0, "exit %d; stderr:\n%s", r.code, r.err);
    ck_assert_str_eq(r.out, "ok: 51 slices, 4 flows, 17 counters, 2 ranks\n");
    ck_assert_str_eq(r.err, "");
    result_free(&r);
}
END_TEST

START_TEST(touching_ends_and_rounding_below_half_a_nanosecond_pass)
{
    /* a child ends 0.0001 us after its parent, b starts 0.0004 us before a ends, a
     * zero-length mark sits on b's end, a flow's f is 0.0003 us before its s. */
    result_t r = tool("check", trace("touching_and_rounding.json"), NULL);
    ck_assert_msg(r.code == 0, "exit %d; stderr:\n%s", r.code, r.err);
    ck_assert_str_eq(r.out, "ok: 6 slices, 1 flows, 0 counters, 1 ranks\n");
    result_free(&r);
}
END_TEST

typedef struct broken {
    const char *file, *names, *also;
} broken_t;

static const broken_t broken[] = {
    {"not_json.json", "not valid JSON at line 1 column 1", NULL},
    {"empty.json", "empty file", NULL},
    {"truncated.json", "ends before the JSON is complete", NULL},
    {"no_trace_events.json", "no \"traceEvents\" array", NULL},
    {"top_level_array.json", "top level is a JSON array", NULL},
    {"trailing_data.json", "line 2 column 1", "data after the top-level object"},
    {"partial_overlap.json", "event 3 (pid 0, tid 2, ts 5.000, dur 10.000, \"forward straddler\") "
                             "partly overlaps event 1", "\"forward outer\""},
    {"unpaired_flow.json", "flow id 7 has 's' event 3 (pid 0, tid 10, ts 20.000) but no 'f'",
     NULL},
    {"flow_backwards.json", "flow id e1: 'f' event 1", "is earlier than its 's' event 0"},
    {"counter_missing_key.json", "event 1 (ph C, pid 0, ts 5.000, \"memory\")",
     "memory counter has no \"reduce_scatter\""},
    {"negative_dur.json", "event 0 (ph X, pid 0, tid 2, ts 3.000, \"forward fc1\")",
     "dur -5 is negative"},
    {"string_ts.json", "\"ts\" is not a finite number", NULL},
    {"no_such_file.json", "cannot open: No such file or directory", NULL},
};

START_TEST(each_broken_trace_exits_1_naming_the_file_and_problem)
{
    const broken_t *b = &broken[_i];
    const char *path = trace(b->file);
    result_t r = tool("check", path, NULL);
    assert_one_line_error(&r, b->names, b->also);
    ck_assert_msg(strstr(r.err, path) != NULL, "stderr does not name %s:\n%s", path, r.err);
    ck_assert_str_eq(r.out, "");
    result_free(&r);
    /* summary and svg load the same way */
    r = tool("summary", path, "--json", NULL);
    assert_one_line_error(&r, b->names, b->also);
    ck_assert_str_eq(r.out, "");
    result_free(&r);
    const char *svg = in_dir("out.svg");
    r = tool("svg", path, "-o", svg, NULL);
    assert_one_line_error(&r, b->names, b->also);
    ck_assert_msg(!exists(svg) && !exists(in_dir("out.svg.tmp")), "an output file was left");
    result_free(&r);
}
END_TEST

/* ---- summary ------------------------------------------------------------------------- */

#define MIB 1048576.0
#define NO_OVERLAP -1.0 /* JSON null: nothing to overlap */

typedef struct module_expect {
    const char *module;
    double all_gather, reduce_scatter, hidden, exposed, overlap;
} module_expect_t;

typedef struct holder_expect {
    const char *module, *track, *category;
    double bytes;
} holder_expect_t;

typedef struct step_expect {
    int rank, step;
    double step_ms, compute_ms, comm_ms, hidden_ms, exposed_ms, overlap;
    double peak_bytes, peak_ts, categories[6];
    int n_holders, n_modules;
    holder_expect_t holders[3];
    module_expect_t modules[4];
} step_expect_t;

/* Rank 0's compute C = [0,50] u [100,980] u [1100,1450] u [1500,1800] u [1900,1950]
 * (user data, forward/backward of the root with nested modules, optimizer, forward,
 * user loss, backward, optimizer). Rank 1's C = [105,1005] u [1105,1505]. */
static const step_expect_t expected[] = {
    /* Step 0 on rank 0, window [0,1000). Collectives of the step: broadcast [10,40] (no
     * args.step, inside the window), all_gathers [30,100] [110,150] [240,320] [500,520],
     * reduce_scatters [620,700] [800,1000], all_reduce [950,1050] (args.step 0 though it
     * ends in step 1). U = [10,100] [110,150] [240,320] [500,520] [620,700] [800,1050]
     * = 90+40+80+20+80+250 = 560 us; U n C = 40+40+80+20+80+180 = 440 us. The copies
     * (copy_in, copy_out, accumulate) are not communication. Compute = 50 + 880.
     * Memory: the two counters at ts 620 leave only the second (18 MiB) in effect; the
     * peak is 20 MiB at 800. Holders at 800: fc1 [650,820] and fc1 [800,1000] and the
     * root [30,1000]; fc2 [600,800] ended there. */
    {0, 0, 1.0, 0.93, 0.56, 0.44, 0.12, 100.0 * 440 / 560,
     20 * MIB, 800, {4 * MIB, 4 * MIB, 1 * MIB, 1 * MIB, 2 * MIB, 8 * MIB},
     3, 4,
     {{"fc1", "unsharded buffer 0", "unsharded_params", MIB},
      {"fc1", "gradient buffer 0", "unsharded_grads", MIB},
      {"", "unsharded buffer 1", "unsharded_params", 2 * MIB}},
     /* in the order they first ran: root 30 (its all_gather), fc1 110, fc2 240, norm
      * 250. root: ag [30,100] hides 20, all_reduce [950,1050] hides 30: 50 of 170.
      * fc1: ag 40 all hidden, rs [800,1000] hides 180: 220 of 240. fc2: ag 80 + 20, rs
      * 80, all hidden. norm: forward only, nothing to overlap. */
     {{"", 0.07, 0.1, 0.05, 0.12, 100.0 * 50 / 170},
      {"fc1", 0.04, 0.2, 0.22, 0.02, 100.0 * 220 / 240},
      {"fc2", 0.1, 0.08, 0.18, 0.0, 100.0},
      {"norm", 0, 0, 0, 0, NO_OVERLAP}}},
    /* Step 1 on rank 0 (its slice has no args.step: "step 1" names it), window
     * [1000,2000). all_gather [1000,1100], reduce_scatter [1800,1900], barrier
     * [1950,1990] (by its ts): 240 us, none inside C. Compute 350 + 300 + 50. Peak: 21
     * MiB at 1500, held by the root's gradients [1500,1900] and parameters [1000,1850]. */
    {0, 1, 1.0, 0.7, 0.24, 0.0, 0.24, 0.0,
     21 * MIB, 1500, {4 * MIB, 4 * MIB, 2 * MIB, 3 * MIB, 0, 8 * MIB},
     2, 1,
     {{"", "gradient buffer 0", "unsharded_grads", 3 * MIB},
      {"", "unsharded buffer 1", "unsharded_params", 2 * MIB}},
     {{"", 0.1, 0.1, 0.0, 0.2, 0.0}}},
    /* Step 2 on rank 0, [2000,2100): nothing ran. The counter of ts 1900 (16 MiB) is in
     * effect when the window opens, so the peak is at 2000; no buffer is held. */
    {0, 2, 0.1, 0.0, 0.0, 0.0, 0.0, NO_OVERLAP,
     16 * MIB, 2000, {4 * MIB, 4 * MIB, 0, 0, 0, 8 * MIB},
     0, 0, {{0}}, {{0}}},
    /* Step 0 on rank 1, [5,1105). U = [5,105] [505,555] [700,800] [1005,1105] = 350;
     * hidden 50 + 100. Compute 900. Peak 15 MiB at 505, the root's buffer [5,1105]. */
    {1, 0, 1.1, 0.9, 0.35, 0.15, 0.2, 100.0 * 150 / 350,
     15 * MIB, 505, {4 * MIB, 0, 2 * MIB, 1 * MIB, 0, 8 * MIB},
     1, 2,
     {{"", "unsharded buffer 0", "unsharded_params", 2 * MIB}},
     {{"", 0.1, 0.1, 0.0, 0.2, 0.0}, {"fc1", 0.05, 0.1, 0.15, 0.0, 100.0}}},
    /* Step 1 on rank 1, [1105,2005): all_gather [1105,1205] hidden under the forward;
     * reduce_scatter [1505,1605] has no args.step and belongs here by its ts, exposed.
     * The counter at 1105 is in effect from the window's start: 14 MiB; the buffer
     * [5,1105] ended there, [1105,1505] holds it. */
    {1, 1, 0.9, 0.4, 0.2, 0.1, 0.1, 50.0,
     14 * MIB, 1105, {4 * MIB, 0, 2 * MIB, 0, 0, 8 * MIB},
     1, 1,
     {{"", "unsharded buffer 0", "unsharded_params", 2 * MIB}},
     {{"", 0.1, 0.1, 0.1, 0.1, 50.0}}},
};

static void assert_close(const cJSON *object, const char *key, double want, const char *where)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(object, key);
    if (want == NO_OVERLAP) {
        ck_assert_msg(cJSON_IsNull(v), "%s: %s is not null", where, key);
        return;
    }
    ck_assert_msg(cJSON_IsNumber(v), "%s: %s is not a number", where, key);
    ck_assert_msg(fabs(v->valuedouble - want) <= 1e-6 * fmax(1, fabs(want)),
                  "%s: %s is %.9g, expected %.9g", where, key, v->valuedouble, want);
}

static void assert_string(const cJSON *object, const char *key, const char *want,
                          const char *where)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(object, key);
    ck_assert_msg(cJSON_IsString(v) && !strcmp(v->valuestring, want),
                  "%s: %s is %s, expected \"%s\"", where, key,
                  cJSON_IsString(v) ? v->valuestring : "not a string", want);
}

static void assert_step(const cJSON *s, const step_expect_t *e)
{
    char where[64];
    snprintf(where, sizeof(where), "rank %d step %d", e->rank, e->step);
    assert_close(s, "rank", e->rank, where);
    assert_close(s, "step", e->step, where);
    assert_close(s, "step_ms", e->step_ms, where);
    assert_close(s, "compute_ms", e->compute_ms, where);
    assert_close(s, "comm_ms", e->comm_ms, where);
    assert_close(s, "hidden_ms", e->hidden_ms, where);
    assert_close(s, "exposed_ms", e->exposed_ms, where);
    assert_close(s, "overlap_pct", e->overlap, where);
    const cJSON *peak = cJSON_GetObjectItemCaseSensitive(s, "peak");
    assert_close(peak, "bytes", e->peak_bytes, where);
    assert_close(peak, "ts_us", e->peak_ts, where);
    static const char *const cats[] = {"sharded_params", "sharded_grads", "unsharded_params",
                                       "unsharded_grads", "reduce_scatter", "optimizer_state"};
    const cJSON *categories = cJSON_GetObjectItemCaseSensitive(peak, "categories");
    ck_assert_int_eq(cJSON_GetArraySize(categories), 7);
    for (int k = 0; k < 6; k++)
        assert_close(categories, cats[k], e->categories[k], where);
    /* The fixtures' counters predate post_forward_params: it reads as 0. */
    assert_close(categories, "post_forward_params", 0, where);
    const cJSON *holders = cJSON_GetObjectItemCaseSensitive(peak, "holders");
    ck_assert_msg(cJSON_GetArraySize(holders) == e->n_holders, "%s: %d holders, expected %d",
                  where, cJSON_GetArraySize(holders), e->n_holders);
    for (int i = 0; i < e->n_holders; i++) {
        const cJSON *h = cJSON_GetArrayItem(holders, i);
        assert_string(h, "module", e->holders[i].module, where);
        assert_string(h, "track", e->holders[i].track, where);
        assert_string(h, "category", e->holders[i].category, where);
        assert_close(h, "bytes", e->holders[i].bytes, where);
    }
    const cJSON *modules = cJSON_GetObjectItemCaseSensitive(s, "modules");
    ck_assert_msg(cJSON_GetArraySize(modules) == e->n_modules, "%s: %d modules, expected %d",
                  where, cJSON_GetArraySize(modules), e->n_modules);
    for (int i = 0; i < e->n_modules; i++) {
        const cJSON *m = cJSON_GetArrayItem(modules, i);
        const module_expect_t *x = &e->modules[i];
        char row[128];
        snprintf(row, sizeof(row), "%s module \"%s\"", where, x->module);
        assert_string(m, "module", x->module, row);
        assert_close(m, "all_gather_ms", x->all_gather, row);
        assert_close(m, "reduce_scatter_ms", x->reduce_scatter, row);
        assert_close(m, "hidden_ms", x->hidden, row);
        assert_close(m, "exposed_ms", x->exposed, row);
        assert_close(m, "overlap_pct", x->overlap, row);
    }
}

static cJSON *summary_json(const char *rank, const char *step)
{
    const char *args[8] = {"summary", trace("two_ranks.json"), "--json"};
    int n = 3;
    if (rank)
        args[n++] = "--rank", args[n++] = rank;
    if (step)
        args[n++] = "--step", args[n++] = step;
    result_t r = tool(args[0], args[1], args[2], args[3], args[4], args[5], args[6], NULL);
    ck_assert_msg(r.code == 0, "exit %d; stderr:\n%s", r.code, r.err);
    cJSON *root = cJSON_Parse(r.out);
    ck_assert_msg(root != NULL, "stdout is not JSON:\n%s", r.out);
    result_free(&r);
    return root;
}

START_TEST(summary_json_matches_the_hand_computed_steps)
{
    cJSON *root = summary_json(NULL, NULL);
    const cJSON *steps = cJSON_GetObjectItemCaseSensitive(root, "steps");
    size_t n = sizeof(expected) / sizeof(expected[0]);
    ck_assert_int_eq(cJSON_GetArraySize(steps), (int)n);
    for (size_t i = 0; i < n; i++)
        assert_step(cJSON_GetArrayItem(steps, (int)i), &expected[i]);
    cJSON_Delete(root);
}
END_TEST

START_TEST(summary_filters_by_rank_and_step)
{
    cJSON *root = summary_json("1", "1");
    const cJSON *steps = cJSON_GetObjectItemCaseSensitive(root, "steps");
    ck_assert_int_eq(cJSON_GetArraySize(steps), 1);
    assert_step(cJSON_GetArrayItem(steps, 0), &expected[4]);
    cJSON_Delete(root);
    /* only rank 0 has a step 2 */
    root = summary_json(NULL, "2");
    steps = cJSON_GetObjectItemCaseSensitive(root, "steps");
    ck_assert_int_eq(cJSON_GetArraySize(steps), 1);
    assert_step(cJSON_GetArrayItem(steps, 0), &expected[2]);
    cJSON_Delete(root);
    root = summary_json("0", NULL);
    ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(root, "steps")), 3);
    cJSON_Delete(root);

    result_t r = tool("summary", trace("two_ranks.json"), "--rank", "5", NULL);
    assert_one_line_error(&r, "no rank 5 in the trace", "(ranks: 0, 1)");
    result_free(&r);
    r = tool("summary", trace("two_ranks.json"), "--step", "9", NULL);
    assert_one_line_error(&r, "no step 9", "two_ranks.json");
    result_free(&r);
    r = tool("summary", trace("two_ranks.json"), "--rank", "1", "--step", "2", NULL);
    assert_one_line_error(&r, "no step 2", NULL);
    result_free(&r);
}
END_TEST

/* The line of text that starts with prefix, or fail. */
static const char *line_starting(const char *text, const char *prefix)
{
    for (const char *p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
        if (!strncmp(p, prefix, strlen(prefix)))
            return p;
    ck_abort_msg("no line starts with \"%s\" in:\n%s", prefix, text);
    return NULL;
}

static void assert_line(const char *text, const char *line)
{
    size_t n = strlen(line);
    const char *p = line_starting(text, line);
    ck_assert_msg(p[n] == '\n', "line differs from \"%s\": %.*s", line,
                  (int)(strchr(p, '\n') ? strchr(p, '\n') - p : 200), p);
}

START_TEST(summary_text_has_headers_module_tables_peaks_and_means)
{
    result_t r = tool("summary", trace("two_ranks.json"), NULL);
    ck_assert_msg(r.code == 0, "exit %d; stderr:\n%s", r.code, r.err);
    assert_line(r.out, "rank 0 step 0: step 1.000 ms, compute 0.930 ms, communication 0.560 ms "
                       "(hidden 78.6%, exposed 0.120 ms), peak memory 20.00 MiB");
    assert_line(r.out, "rank 0 step 2: step 0.100 ms, compute 0.000 ms, communication 0.000 ms "
                       "(hidden -, exposed 0.000 ms), peak memory 16.00 MiB");
    assert_line(r.out, "rank 1 step 0: step 1.100 ms, compute 0.900 ms, communication 0.350 ms "
                       "(hidden 42.9%, exposed 0.200 ms), peak memory 15.00 MiB");
    /* rows: module, all-gather ms, reduce-scatter ms, overlap %, exposed ms */
    char name[32], overlap[16];
    double ag, rs, exposed;
    const char *row = line_starting(r.out, "  (root)");
    ck_assert_int_eq(sscanf(row, "%31s %lf %lf %15s %lf", name, &ag, &rs, overlap, &exposed), 5);
    ck_assert_msg(ag == 0.07 && rs == 0.1 && !strcmp(overlap, "29.4") && exposed == 0.12,
                  "root row: %.80s", row);
    row = line_starting(r.out, "  norm ");
    ck_assert_int_eq(sscanf(row, "%31s %lf %lf %15s %lf", name, &ag, &rs, overlap, &exposed), 5);
    ck_assert_msg(ag == 0 && rs == 0 && !strcmp(overlap, "-") && exposed == 0, "norm row: %.80s",
                  row);
    assert_line(r.out, "  peak 20.00 MiB at +0.800 ms: sharded_params 4.00 MiB, sharded_grads "
                       "4.00 MiB, unsharded_params 1.00 MiB, unsharded_grads 1.00 MiB, "
                       "reduce_scatter 2.00 MiB, optimizer_state 8.00 MiB; held by fc1 "
                       "(unsharded buffer 0, 1.00 MiB unsharded_params), fc1 (gradient buffer "
                       "0, 1.00 MiB unsharded_grads), (root) (unsharded buffer 1, 2.00 MiB "
                       "unsharded_params)");
    assert_line(r.out, "  no module ran in the step");
    /* means: rank 0 (1000+1000+100)/3, (930+700+0)/3, (560+240+0)/3, 440/800 hidden,
     * (120+240+0)/3, peaks 20, 21, 16 MiB. rank 1: 1000, 650, 275, 250/550, 150. */
    assert_line(r.out, "rank 0, mean of 3 steps: step 0.700 ms, compute 0.543 ms, communication "
                       "0.267 ms (hidden 55.0%, exposed 0.120 ms), peak memory mean 19.00 MiB, "
                       "max 21.00 MiB");
    assert_line(r.out, "rank 1, mean of 2 steps: step 1.000 ms, compute 0.650 ms, communication "
                       "0.275 ms (hidden 45.5%, exposed 0.150 ms), peak memory mean 14.50 MiB, "
                       "max 15.00 MiB");
    result_free(&r);
}
END_TEST

/* ---- svg ------------------------------------------------------------------------------ */

/* Every element closed in order, attributes quoted, '&' only in entities. */
static void assert_balanced_xml(const char *text)
{
    const char *stack[64];
    size_t stack_len[64];
    int depth = 0, elements = 0;
    for (const char *p = text; *p; p++) {
        if (*p == '&') {
            static const char *const ok[] = {"&amp;", "&lt;", "&gt;", "&quot;", "&apos;"};
            int good = 0;
            for (int k = 0; k < 5; k++)
                good |= !strncmp(p, ok[k], strlen(ok[k]));
            ck_assert_msg(good, "a bare '&': %.40s", p);
            continue;
        }
        if (*p != '<')
            continue;
        if (p[1] == '?' || p[1] == '!') {
            p = strchr(p, '>');
            ck_assert(p != NULL);
            continue;
        }
        const char *q = p + 1;
        int closing = *q == '/';
        q += closing;
        size_t n = strcspn(q, " \t\n/>");
        const char *end = q + n;
        char quote = 0;
        for (; *end && (quote || *end != '>'); end++)
            quote = quote ? (*end == quote ? 0 : quote) : (*end == '"' || *end == '\'' ? *end : 0);
        ck_assert_msg(*end == '>', "tag not closed: %.40s", p);
        if (closing) {
            ck_assert_msg(depth > 0 && stack_len[depth - 1] == n &&
                              !strncmp(stack[depth - 1], q, n),
                          "</%.*s> closes nothing open", (int)n, q);
            depth--;
        } else if (end[-1] != '/') {
            ck_assert(depth < 64);
            stack[depth] = q;
            stack_len[depth++] = n;
        }
        elements += !closing;
        p = end;
    }
    ck_assert_msg(depth == 0, "%d elements left open", depth);
    ck_assert_msg(elements > 10, "only %d elements", elements);
}

static unsigned png_width(const char *path)
{
    unsigned char h[24];
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "no PNG at %s", path);
    size_t n = fread(h, 1, sizeof(h), f);
    fclose(f);
    ck_assert_msg(n == 24 && !memcmp(h, "\x89PNG\r\n\x1a\n", 8) && !memcmp(h + 12, "IHDR", 4),
                  "%s is not a PNG", path);
    return (unsigned)h[16] << 24 | (unsigned)h[17] << 16 | (unsigned)h[18] << 8 | h[19];
}

/* xmllint and rsvg-convert agree with assert_balanced_xml, when meson found them. */
static void assert_valid_svg(const char *svg)
{
    char *text = slurp(svg);
    ck_assert_msg(!strncmp(text, "<?xml version=\"1.0\" encoding=\"UTF-8\"", 36), "no XML prolog");
    ck_assert_msg(strstr(text, "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" "
                               "width=\"1600\"") != NULL, "no SVG 1.1 root of width 1600");
    const char *ns = strstr(text, "http://www.w3.org/2000/svg\"");
    ck_assert_msg(!strstr(text, "<script") && !strstr(text, "href") &&
                  strstr(text, "http") == ns && !strstr(ns + 1, "http"),
                  "a script or a reference other than the namespace");
    assert_balanced_xml(text);
    free(text);
    const char *xmllint = getenv("XMLLINT");
    if (xmllint && *xmllint) {
        const char *argv[] = {xmllint, "--noout", svg, NULL};
        result_t r = run_program(argv);
        ck_assert_msg(r.code == 0, "xmllint: %s", r.err);
        result_free(&r);
    }
    const char *rsvg = getenv("RSVG_CONVERT");
    if (rsvg && *rsvg) {
        const char *png = in_dir("out.png");
        const char *argv[] = {rsvg, "-o", png, svg, NULL};
        result_t r = run_program(argv);
        ck_assert_msg(r.code == 0, "rsvg-convert: %s", r.err);
        ck_assert_int_eq(png_width(png), 1600);
        result_free(&r);
    }
}

START_TEST(svg_of_the_last_common_step_is_valid_and_labelled)
{
    const char *svg = in_dir("out.svg");
    result_t r = tool("svg", trace("two_ranks.json"), "-o", svg, NULL);
    ck_assert_msg(r.code == 0, "exit %d; stderr:\n%s", r.code, r.err);
    ck_assert_msg(!exists(in_dir("out.svg.tmp")), "out.svg.tmp left behind");
    assert_valid_svg(svg);
    char *text = slurp(svg);
    /* rank 0 has steps 0-2, rank 1 0-1: step 1, window [1000, 2005] */
    ck_assert_msg(strstr(text, "two_ranks.json \xe2\x80\x94 step 1, 1.005 ms, 2 ranks"),
                  "title");
    static const char *const lanes[] = {
        "rank 0 \xc2\xb7 steps", "rank 0 \xc2\xb7 compute", "rank 0 \xc2\xb7 optimizer",
        "rank 0 \xc2\xb7 fsdp-all-reduce", "rank 0 \xc2\xb7 fsdp-all-gather",
        "rank 0 \xc2\xb7 fsdp-reduce-scatter", "rank 0 \xc2\xb7 gradient buffer 0",
        "rank 0 \xc2\xb7 unsharded buffer 1", "rank 0 \xc2\xb7 memory",
        "rank 1 \xc2\xb7 steps", "rank 1 \xc2\xb7 compute", "rank 1 \xc2\xb7 memory",
    };
    const char *last = text;
    for (size_t i = 0; i < sizeof(lanes) / sizeof(lanes[0]); i++) {
        const char *at = strstr(text, lanes[i]);
        ck_assert_msg(at != NULL, "no lane \"%s\"", lanes[i]);
        ck_assert_msg(at > last, "lane \"%s\" out of order (thread_sort_index)", lanes[i]);
        last = at;
    }
    /* unsharded buffer 0 of rank 0 holds nothing during step 1 */
    ck_assert_msg(!strstr(text, "rank 0 \xc2\xb7 unsharded buffer 0"), "an empty lane drawn");
    ck_assert_msg(strstr(text, ">peak 21.00 MiB<") && strstr(text, ">peak 14.00 MiB<"),
                  "the peaks of step 1 are not marked");
    ck_assert_msg(strstr(text, "marker-end=\"url(#arrow)\""), "no flow arrow");
    ck_assert_msg(strstr(text, ">all_gather<") && strstr(text, ">barrier<"), "legend");
    free(text);
    result_free(&r);
}
END_TEST

START_TEST(svg_of_a_chosen_rank_and_step)
{
    const char *svg = in_dir("out.svg");
    result_t r = tool("svg", trace("two_ranks.json"), "--rank", "1", "--step", "0", "-o", svg,
                      NULL);
    ck_assert_msg(r.code == 0, "exit %d; stderr:\n%s", r.code, r.err);
    assert_valid_svg(svg);
    char *text = slurp(svg);
    ck_assert_msg(strstr(text, "step 0, 1.100 ms, 1 rank<"), "title");
    ck_assert_msg(strstr(text, "rank 1 \xc2\xb7 compute") && !strstr(text, "rank 0 \xc2\xb7"),
                  "lanes of rank 0 drawn");
    ck_assert_msg(strstr(text, ">peak 15.00 MiB<"), "peak of rank 1 step 0");
    free(text);
    result_free(&r);
}
END_TEST

START_TEST(svg_escapes_names)
{
    const char *svg = in_dir("out.svg");
    result_t r = tool("svg", trace("odd_names.json"), "-o", svg, NULL);
    ck_assert_msg(r.code == 0, "exit %d; stderr:\n%s", r.code, r.err);
    assert_valid_svg(svg);
    char *text = slurp(svg);
    ck_assert_msg(strstr(text, "enc&lt;0&gt;&amp;&apos;dec&apos;?\xc3\xbc"), "module name");
    ck_assert_msg(strstr(text, "compute &lt;main&gt; &amp; &quot;friends&quot;"), "track name");
    ck_assert_msg(strstr(text, ">other<"), "an unknown category is not in the legend as other");
    free(text);
    result_free(&r);
}
END_TEST

START_TEST(svg_errors_leave_no_file_and_keep_an_old_one)
{
    const char *svg = in_dir("out.svg"), *tmp = in_dir("out.svg.tmp");
    result_t r = tool("svg", trace("two_ranks.json"), "--step", "7", "-o", svg, NULL);
    assert_one_line_error(&r, "no step 7", NULL);
    ck_assert_msg(!exists(svg) && !exists(tmp), "an output file was left");
    result_free(&r);

    FILE *f = fopen(svg, "w");
    fputs("previous picture\n", f);
    fclose(f);
    r = tool("svg", trace("truncated.json"), "-o", svg, NULL);
    assert_one_line_error(&r, "truncated", NULL);
    char *kept = slurp(svg);
    ck_assert_str_eq(kept, "previous picture\n");
    ck_assert_msg(!exists(tmp), "out.svg.tmp left behind");
    free(kept);
    result_free(&r);

    const char *nowhere = in_dir("no/such/dir.svg");
    r = tool("svg", trace("two_ranks.json"), "-o", nowhere, NULL);
    assert_one_line_error(&r, "cannot write", "no/such/dir.svg");
    result_free(&r);
}
END_TEST

/* ---- merge and the command line ------------------------------------------------------ */

START_TEST(merge_joins_parts_into_one_trace)
{
    const char *out = in_dir("merged.json");
    result_t r = tool("merge", "-o", out, trace("part_rank0.json"), trace("part_rank1.json"),
                      NULL);
    ck_assert_msg(r.code == 0, "exit %d; stderr:\n%s", r.code, r.err);
    result_free(&r);
    r = tool("check", out, NULL);
    ck_assert_str_eq(r.out, "ok: 6 slices, 0 flows, 2 counters, 2 ranks\n");
    result_free(&r);
    r = tool("merge", "-o", out, trace("part_rank0.json"), trace("no_such_part.json"), NULL);
    assert_one_line_error(&r, "no_such_part.json", out);
    result_free(&r);
}
END_TEST

START_TEST(help_shows_every_command)
{
    result_t r = tool("--help", NULL);
    ck_assert_int_eq(r.code, 0);
    static const char *const lines[] = {
        "usage: fsdp2-trace check TRACE\n",
        "       fsdp2-trace summary TRACE [--json] [--rank R] [--step N]\n",
        "       fsdp2-trace svg TRACE -o OUT.svg [--step N] [--rank R]\n",
        "       fsdp2-trace merge -o OUT IN...\n",
    };
    for (size_t i = 0; i < sizeof(lines) / sizeof(lines[0]); i++)
        ck_assert_msg(strstr(r.out, lines[i]), "--help lacks %s", lines[i]);
    result_free(&r);
}
END_TEST

START_TEST(bad_command_lines_exit_2_with_usage)
{
    static const struct {
        const char *args[6], *names;
    } cases[] = {
        {{NULL}, "no command"},
        {{"frobnicate", NULL}, "unknown command 'frobnicate'"},
        {{"check", NULL}, "check takes one TRACE"},
        {{"check", "a.json", "b.json", NULL}, "check takes one TRACE"},
        {{"summary", "t.json", "--rank", NULL}, "--rank needs a value"},
        {{"summary", "t.json", "--rank", "one", NULL}, "--rank 'one' is not an integer"},
        {{"summary", "t.json", "--step=2x", NULL}, "--step '2x' is not an integer"},
        {{"summary", "t.json", "-o", "x", NULL}, "unknown option '-o' for summary"},
        {{"check", "t.json", "--json", NULL}, "unknown option '--json' for check"},
        {{"svg", "t.json", NULL}, "svg needs -o OUT.svg"},
        {{"merge", "in.json", NULL}, "merge needs -o OUT"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const char *const *a = cases[i].args;
        result_t r = a[0] ? tool(a[0], a[1], a[2], a[3], a[4], a[5], NULL) : tool(NULL);
        ck_assert_msg(r.code == 2, "case %zu: exit %d, not 2", i, r.code);
        ck_assert_msg(strstr(r.err, cases[i].names) && strstr(r.err, "usage:"),
                      "case %zu: stderr lacks \"%s\" and usage:\n%s", i, cases[i].names, r.err);
        result_free(&r);
    }
}
END_TEST

static Suite *fsdp2_trace_suite(void)
{
    Suite *s = suite_create("fsdp2-trace");
    TCase *check = tcase_create("check");
    tcase_add_checked_fixture(check, setup, teardown);
    tcase_add_test(check, check_counts_slices_flows_counters_and_ranks);
    tcase_add_test(check, touching_ends_and_rounding_below_half_a_nanosecond_pass);
    tcase_add_loop_test(check, each_broken_trace_exits_1_naming_the_file_and_problem, 0,
                        sizeof(broken) / sizeof(broken[0]));
    suite_add_tcase(s, check);

    TCase *summary = tcase_create("summary");
    tcase_add_checked_fixture(summary, setup, teardown);
    tcase_add_test(summary, summary_json_matches_the_hand_computed_steps);
    tcase_add_test(summary, summary_filters_by_rank_and_step);
    tcase_add_test(summary, summary_text_has_headers_module_tables_peaks_and_means);
    suite_add_tcase(s, summary);

    TCase *svg = tcase_create("svg");
    tcase_add_checked_fixture(svg, setup, teardown);
    tcase_set_timeout(svg, 60);
    tcase_add_test(svg, svg_of_the_last_common_step_is_valid_and_labelled);
    tcase_add_test(svg, svg_of_a_chosen_rank_and_step);
    tcase_add_test(svg, svg_escapes_names);
    tcase_add_test(svg, svg_errors_leave_no_file_and_keep_an_old_one);
    suite_add_tcase(s, svg);

    TCase *cli = tcase_create("command line");
    tcase_add_checked_fixture(cli, setup, teardown);
    tcase_add_test(cli, merge_joins_parts_into_one_trace);
    tcase_add_test(cli, help_shows_every_command);
    tcase_add_test(cli, bad_command_lines_exit_2_with_usage);
    suite_add_tcase(s, cli);
    return s;
}

FSDP2_CHECK_MAIN(fsdp2_trace_suite)
