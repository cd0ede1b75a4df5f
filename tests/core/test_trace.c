/* The trace recorder on one process: what a file holds (steps, nested ranges, a slice
 * timed on a side stream, the flow from its event to the wait it released, memory
 * counters), the errors (twice started, stopped while off, unwritable paths, unbalanced
 * ranges), a full buffer, work still queued at stop, FSDP2_TRACE through fsdp2_init, and
 * merging (corrupt inputs, one rank twice, parts from two hosts moved onto the wall
 * clock). Files are read back with cJSON, independently of the writer. */
#include <check.h>
#include <dirent.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <fsdp2/fsdp2.h>

#include "check_main.h"
#include "remove_tree.h"
#include "core/env_internal.h"
#include "core/trace_internal.h"

static char dir[128];
static const fsdp2_device_t CPU = FSDP2_DEVICE_CPU_INIT;

static void setup(void)
{
    snprintf(dir, sizeof(dir), "/tmp/fsdp2-trace-core-%ld", (long)getpid());
    ck_assert_int_eq(mkdir(dir, 0700), 0);
}

static void teardown(void)
{
    remove_tree(dir);
}

static char *path_in(const char *name)
{
    static char buf[4][256];
    static int next;
    char *p = buf[next++ % 4];
    snprintf(p, 256, "%s/%s", dir, name);
    return p;
}

static cJSON *load(const char *path)
{
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "cannot open %s", path);
    static char buf[1 << 22];
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    cJSON *root = cJSON_Parse(buf);
    ck_assert_msg(root && cJSON_IsArray(cJSON_GetObjectItem(root, "traceEvents")),
                  "%s is not JSON with traceEvents", path);
    return root;
}

/* The first event with ph and name (NULL: any name), or NULL. */
static const cJSON *find(const cJSON *root, const char *ph, const char *name)
{
    const cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItem(root, "traceEvents"))
    {
        if (!strcmp(cJSON_GetObjectItem(e, "ph")->valuestring, ph) &&
            (!name || (cJSON_GetObjectItem(e, "name") &&
                       !strcmp(cJSON_GetObjectItem(e, "name")->valuestring, name))))
            return e;
    }
    return NULL;
}

static double field(const cJSON *e, const char *key)
{
    const cJSON *v = cJSON_GetObjectItem(e, key);
    ck_assert_msg(cJSON_IsNumber(v), "no number %s", key);
    return v->valuedouble;
}

static double rank_info(const cJSON *root, const char *key)
{
    const cJSON *ranks = cJSON_GetObjectItem(cJSON_GetObjectItem(root, "otherData"), "ranks");
    return field(cJSON_GetArrayItem(ranks, 0), key);
}

/* No temporary file is left beside the traces. */
static void assert_no_tmp(void)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    while ((de = readdir(d)))
        ck_assert_msg(!strstr(de->d_name, ".tmp"), "left behind: %s", de->d_name);
    closedir(d);
}

static fsdp2_status_t spin(void *arg)
{
    volatile double x = 0;
    for (int i = 0; i < 200000; i++)
        x += i * 0.5;
    (void)arg;
    return FSDP2_SUCCESS;
}

START_TEST(a_trace_holds_steps_ranges_a_stream_slice_its_flow_and_counters)
{
    fsdp2_stream_t *side, *current;
    fsdp2_event_t *ev;
    ck_assert_int_eq(fsdp2_stream_create(CPU, "side-test", &side), FSDP2_SUCCESS);
    ck_assert_int_eq(fsdp2_stream_current(CPU, &current), FSDP2_SUCCESS);
    ck_assert_int_eq(fsdp2_event_create(CPU, &ev), FSDP2_SUCCESS);
    fsdp2_trace_mem_static(TRACE_MEM_SHARDED_PARAMS, 4096);
    ck_assert_int_eq(fsdp2_trace_start(NULL, path_in("t.json")), FSDP2_SUCCESS);
    int on = 0;
    ck_assert_int_eq(fsdp2_trace_active(&on), FSDP2_SUCCESS);
    ck_assert_int_eq(on, 1);
    ck_assert_int_eq(fsdp2_trace_step(7), FSDP2_SUCCESS);
    ck_assert_int_eq(fsdp2_trace_range_push("outer"), FSDP2_SUCCESS);
    ck_assert_int_eq(fsdp2_trace_range_push("inner"), FSDP2_SUCCESS);
    ck_assert_int_eq(fsdp2_trace_range_pop(), FSDP2_SUCCESS);
    ck_assert_int_eq(fsdp2_trace_range_pop(), FSDP2_SUCCESS);
    trace_op_t op = TRACE_OP_INIT(TRACE_ALL_GATHER);
    op.module = "layer.0";
    op.bytes = 1234;
    op.dtype = FSDP2_BF16;
    trace_token_t t = fsdp2_trace_stream_begin(side, &op);
    ck_assert_int_ge(t, 0);
    ck_assert_int_eq(fsdp2_stream_launch_host(side, spin, NULL), FSDP2_SUCCESS);
    fsdp2_trace_stream_end(side, t);
    trace_op_t hold = TRACE_OP_INIT(TRACE_MEMORY);
    hold.name = "layer.0";
    hold.bytes = 1000;
    hold.mem = TRACE_MEM_UNSHARDED_PARAMS;
    trace_token_t h = fsdp2_trace_host_begin(0, "unsharded buffer 0", &hold);
    ck_assert_int_eq(fsdp2_event_record(ev, side), FSDP2_SUCCESS);
    ck_assert_int_eq(fsdp2_stream_wait_event(current, ev), FSDP2_SUCCESS);
    fsdp2_trace_host_end(h);
    ck_assert_int_eq(fsdp2_stream_synchronize(side), FSDP2_SUCCESS);
    ck_assert_int_eq(fsdp2_trace_stop(NULL), FSDP2_SUCCESS);
    ck_assert_int_eq(fsdp2_trace_active(&on), FSDP2_SUCCESS);
    ck_assert_int_eq(on, 0);
    assert_no_tmp();

    cJSON *root = load(path_in("t.json"));
    const cJSON *step = find(root, "X", "step 7");
    const cJSON *outer = find(root, "X", "outer"), *inner = find(root, "X", "inner");
    const cJSON *ag = find(root, "X", "all_gather");
    ck_assert_ptr_nonnull(step);
    ck_assert_ptr_nonnull(outer);
    ck_assert_ptr_nonnull(inner);
    ck_assert_ptr_nonnull(ag);
    ck_assert_str_eq(cJSON_GetObjectItem(outer, "cat")->valuestring, "user");
    ck_assert(field(inner, "ts") >= field(outer, "ts"));
    ck_assert(field(inner, "ts") + field(inner, "dur") <= field(outer, "ts") + field(outer, "dur"));
    ck_assert(field(outer, "ts") >= field(step, "ts"));
    const cJSON *args = cJSON_GetObjectItem(ag, "args");
    ck_assert_str_eq(cJSON_GetObjectItem(args, "module")->valuestring, "layer.0");
    ck_assert_str_eq(cJSON_GetObjectItem(args, "dtype")->valuestring, "bf16");
    ck_assert_int_eq((int)field(args, "bytes"), 1234);
    ck_assert_int_eq((int)field(args, "step"), 7);
    ck_assert(field(ag, "dur") > 0);
    /* The all-gather's track is named after its stream, and differs from compute's. */
    ck_assert_int_ne((int)field(ag, "tid"), (int)field(outer, "tid"));
    const cJSON *s = find(root, "s", NULL), *f = find(root, "f", NULL);
    ck_assert_ptr_nonnull(s);
    ck_assert_ptr_nonnull(f);
    ck_assert_int_eq((long long)field(s, "id"), (long long)field(f, "id"));
    ck_assert_int_eq((int)field(s, "tid"), (int)field(ag, "tid"));
    ck_assert_int_eq((int)field(f, "tid"), (int)field(outer, "tid"));
    ck_assert(field(s, "ts") >= field(ag, "ts") && field(s, "ts") <= field(ag, "ts") + field(ag, "dur"));
    ck_assert(field(f, "ts") >= field(s, "ts"));
    /* Counters: the static 4096 from the start, the hold's 1000 while held. */
    const cJSON *c0 = find(root, "C", "memory");
    ck_assert_int_eq((int)field(cJSON_GetObjectItem(c0, "args"), "sharded_params"), 4096);
    int saw_hold = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItem(root, "traceEvents"))
    {
        if (!strcmp(cJSON_GetObjectItem(e, "ph")->valuestring, "C"))
            saw_hold |= (int)field(cJSON_GetObjectItem(e, "args"), "unsharded_params") == 1000;
    }
    ck_assert(saw_hold);
    ck_assert_int_eq((int)rank_info(root, "dropped"), 0);
    ck_assert_int_eq((int)rank_info(root, "unfinished"), 0);
    cJSON_Delete(root);
    fsdp2_trace_mem_static(TRACE_MEM_SHARDED_PARAMS, -4096);
    fsdp2_event_destroy(ev);
    fsdp2_stream_destroy(side);
}
END_TEST

START_TEST(misuse_and_unwritable_paths_are_clear_errors)
{
    ck_assert_int_eq(fsdp2_trace_stop(NULL), FSDP2_ERR_INVALID_STATE);
    ck_assert_int_eq(fsdp2_trace_start(NULL, NULL), FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(fsdp2_trace_start(NULL, ""), FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(fsdp2_trace_start(NULL, "/nonexistent-dir/x/t.json"), FSDP2_ERR_IO);
    ck_assert_ptr_nonnull(strstr(fsdp2_last_error(), "/nonexistent-dir/x"));
    ck_assert_int_eq(fsdp2_trace_start(NULL, dir), FSDP2_ERR_IO);
    ck_assert_ptr_nonnull(strstr(fsdp2_last_error(), "is a directory"));
    ck_assert_int_eq(fsdp2_trace_start(NULL, path_in("a.json")), FSDP2_SUCCESS);
    ck_assert_int_eq(fsdp2_trace_start(NULL, path_in("b.json")), FSDP2_ERR_INVALID_STATE);
    ck_assert_ptr_nonnull(strstr(fsdp2_last_error(), "a.json"));
    ck_assert_int_eq(fsdp2_trace_range_pop(), FSDP2_ERR_INVALID_STATE);
    ck_assert_int_eq(fsdp2_trace_range_push(NULL), FSDP2_ERR_INVALID_ARGUMENT);
    for (int i = 0; i < 32; i++)
        ck_assert_int_eq(fsdp2_trace_range_push("r"), FSDP2_SUCCESS);
    ck_assert_int_eq(fsdp2_trace_range_push("r"), FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(fsdp2_trace_step(-1), FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(fsdp2_trace_stop(NULL), FSDP2_SUCCESS);
    /* Ranges left open end at the stop. */
    cJSON *root = load(path_in("a.json"));
    ck_assert_ptr_nonnull(find(root, "X", "r"));
    ck_assert_int_eq((int)rank_info(root, "unfinished"), 0);
    cJSON_Delete(root);
    /* Off, everything is a no-op. */
    ck_assert_int_eq(fsdp2_trace_range_push("x"), FSDP2_SUCCESS);
    ck_assert_int_eq(fsdp2_trace_range_pop(), FSDP2_SUCCESS);
    ck_assert_int_eq(fsdp2_trace_step(3), FSDP2_SUCCESS);
}
END_TEST

START_TEST(a_full_buffer_drops_records_and_says_how_many)
{
    setenv("FSDP2_TRACE_EVENTS", "1024", 1);
    ck_assert_int_eq(fsdp2_env_reload(), FSDP2_SUCCESS);
    ck_assert_int_eq(fsdp2_trace_start(NULL, path_in("full.json")), FSDP2_SUCCESS);
    for (int i = 0; i < 1500; i++) {
        ck_assert_int_eq(fsdp2_trace_range_push("r"), FSDP2_SUCCESS);
        ck_assert_int_eq(fsdp2_trace_range_pop(), FSDP2_SUCCESS);
    }
    ck_assert_int_eq(fsdp2_trace_stop(NULL), FSDP2_SUCCESS);
    cJSON *root = load(path_in("full.json"));
    /* One counter at the start, then 1023 ranges fit. */
    ck_assert_int_eq((int)rank_info(root, "dropped"), 1500 - 1023);
    ck_assert_int_eq((int)rank_info(root, "events"), 1024);
    cJSON_Delete(root);
}
END_TEST

static atomic_int gate;

static fsdp2_status_t wait_gate(void *arg)
{
    (void)arg;
    while (!atomic_load(&gate))
        usleep(1000);
    return FSDP2_SUCCESS;
}

START_TEST(work_still_queued_at_stop_is_left_out_and_never_stamps_the_next_trace)
{
    fsdp2_stream_t *side;
    ck_assert_int_eq(fsdp2_stream_create(CPU, "late", &side), FSDP2_SUCCESS);
    atomic_store(&gate, 0);
    ck_assert_int_eq(fsdp2_trace_start(NULL, path_in("one.json")), FSDP2_SUCCESS);
    ck_assert_int_eq(fsdp2_stream_launch_host(side, wait_gate, NULL), FSDP2_SUCCESS);
    trace_op_t op = TRACE_OP_INIT(TRACE_REDUCE_SCATTER);
    trace_token_t t = fsdp2_trace_stream_begin(side, &op);
    fsdp2_trace_stream_end(side, t);
    ck_assert_int_eq(fsdp2_trace_stop(NULL), FSDP2_SUCCESS);
    ck_assert_int_eq(fsdp2_trace_start(NULL, path_in("two.json")), FSDP2_SUCCESS);
    atomic_store(&gate, 1); /* the first trace's markers run now, during the second */
    ck_assert_int_eq(fsdp2_stream_synchronize(side), FSDP2_SUCCESS);
    ck_assert_int_eq(fsdp2_trace_stop(NULL), FSDP2_SUCCESS);
    cJSON *one = load(path_in("one.json")), *two = load(path_in("two.json"));
    ck_assert_int_eq((int)rank_info(one, "unfinished"), 1);
    ck_assert_ptr_null(find(one, "X", "reduce_scatter"));
    ck_assert_ptr_null(find(two, "X", "reduce_scatter"));
    ck_assert_int_eq((int)rank_info(two, "unfinished"), 0);
    cJSON_Delete(one);
    cJSON_Delete(two);
    fsdp2_stream_destroy(side);
}
END_TEST

START_TEST(a_token_kept_across_a_stop_and_a_start_ends_nothing_in_the_new_trace)
{
    trace_op_t hold = TRACE_OP_INIT(TRACE_MEMORY);
    hold.bytes = 100;
    hold.mem = TRACE_MEM_UNSHARDED_GRADS;
    ck_assert_int_eq(fsdp2_trace_start(NULL, path_in("old.json")), FSDP2_SUCCESS);
    trace_token_t old = fsdp2_trace_host_begin(0, "gradient accumulator of a.module.whose."
                                                  "name.is.longer.than.any.buffer.field", &hold);
    ck_assert_int_ge(old, 0);
    ck_assert_int_eq(fsdp2_trace_stop(NULL), FSDP2_SUCCESS);
    ck_assert_int_eq(fsdp2_trace_start(NULL, path_in("new.json")), FSDP2_SUCCESS);
    ck_assert_int_eq(fsdp2_trace_range_push("x"), FSDP2_SUCCESS); /* may reuse old's index */
    fsdp2_trace_host_end(old);
    usleep(2000);
    ck_assert_int_eq(fsdp2_trace_range_pop(), FSDP2_SUCCESS);
    /* A long buffer name finds its track again: two holds, one track. */
    trace_token_t a = fsdp2_trace_host_begin(0, "gradient accumulator of a.module.whose."
                                                "name.is.longer.than.any.buffer.field", &hold);
    fsdp2_trace_host_end(a);
    trace_token_t b = fsdp2_trace_host_begin(0, "gradient accumulator of a.module.whose."
                                                "name.is.longer.than.any.buffer.field", &hold);
    fsdp2_trace_host_end(b);
    ck_assert_int_eq(fsdp2_trace_stop(NULL), FSDP2_SUCCESS);
    cJSON *root = load(path_in("new.json"));
    const cJSON *x = find(root, "X", "x");
    ck_assert_ptr_nonnull(x);
    ck_assert(field(x, "dur") >= 2000.0); /* not ended early by the old token */
    int tids[2], n = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItem(root, "traceEvents"))
    {
        if (!strcmp(cJSON_GetObjectItem(e, "ph")->valuestring, "X") &&
            !strcmp(cJSON_GetObjectItem(e, "cat")->valuestring, "memory") && n < 2)
            tids[n++] = (int)field(e, "tid");
        if (!strcmp(cJSON_GetObjectItem(e, "ph")->valuestring, "C"))
            ck_assert_int_ge((int)field(cJSON_GetObjectItem(e, "args"), "unsharded_grads"), 0);
    }
    ck_assert_int_eq(n, 2);
    ck_assert_int_eq(tids[0], tids[1]);
    cJSON_Delete(root);
}
END_TEST

START_TEST(fsdp2_trace_starts_at_init_and_is_written_at_finalize)
{
    setenv("FSDP2_TRACE", "/nonexistent-dir/t.json", 1);
    ck_assert_int_eq(fsdp2_env_reload(), FSDP2_SUCCESS);
    fsdp2_context_t *ctx = NULL;
    ck_assert_int_eq(fsdp2_init(NULL, &ctx), FSDP2_ERR_INVALID_CONFIG);
    ck_assert_ptr_nonnull(strstr(fsdp2_last_error(), "FSDP2_TRACE='/nonexistent-dir/t.json'"));
    int on = 1;
    ck_assert_int_eq(fsdp2_trace_active(&on), FSDP2_SUCCESS);
    ck_assert_int_eq(on, 0);
    setenv("FSDP2_TRACE", path_in("init.json"), 1);
    ck_assert_int_eq(fsdp2_env_reload(), FSDP2_SUCCESS);
    ck_assert_int_eq(fsdp2_init(NULL, &ctx), FSDP2_SUCCESS);
    ck_assert_int_eq(fsdp2_trace_active(&on), FSDP2_SUCCESS);
    ck_assert_int_eq(on, 1);
    ck_assert_int_eq(fsdp2_trace_range_push("work"), FSDP2_SUCCESS);
    ck_assert_int_eq(fsdp2_trace_range_pop(), FSDP2_SUCCESS);
    ck_assert_int_eq(fsdp2_finalize(ctx), FSDP2_SUCCESS);
    cJSON *root = load(path_in("init.json"));
    ck_assert_ptr_nonnull(find(root, "X", "work"));
    cJSON_Delete(root);
}
END_TEST

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
}

static const char *part_text(int rank, const char *boot, long long offset_ns, double ts)
{
    static char buf[2][1024];
    snprintf(buf[rank % 2], sizeof(buf[0]),
             "{\"otherData\":{\"ranks\":[{\"rank\":%d,\"boot_id\":\"%s\","
             "\"realtime_minus_monotonic_ns\":%lld}]},\"traceEvents\":["
             "{\"ph\":\"X\",\"pid\":%d,\"tid\":2,\"ts\":%.3f,\"dur\":1,\"name\":\"a\",\"cat\":\"user\"}]}",
             rank, boot, offset_ns, rank, ts);
    return buf[rank % 2];
}

START_TEST(merge_refuses_bad_parts_and_moves_other_hosts_onto_the_wall_clock)
{
    char p0[256], p1[256];
    snprintf(p0, sizeof(p0), "%s", path_in("p0.json"));
    snprintf(p1, sizeof(p1), "%s", path_in("p1.json"));
    const char *in[2] = {p0, p1};
    write_text(in[0], part_text(0, "boot-a", 1000000, 10.0));
    write_text(in[1], "{\"traceEvents\": [");
    ck_assert_int_eq(fsdp2_trace_merge(in, 2, path_in("m.json")), FSDP2_ERR_CORRUPT);
    ck_assert_ptr_nonnull(strstr(fsdp2_last_error(), "p1.json"));
    ck_assert_int_eq(access(path_in("m.json"), F_OK), -1);
    const char *missing[1] = {path_in("none.json")};
    ck_assert_int_eq(fsdp2_trace_merge(missing, 1, path_in("m.json")), FSDP2_ERR_IO);
    write_text(in[1], part_text(0, "boot-a", 1000000, 20.0));
    ck_assert_int_eq(fsdp2_trace_merge(in, 2, path_in("m.json")), FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(fsdp2_last_error(), "rank 0 is in both"));
    /* Two hosts: each part moves by its own realtime - monotonic offset (1 ms, 5 ms),
     * less the smallest (1 ms, recorded as the base): 10 stays, 20 becomes 4020. The
     * base is a real wall-clock size, where a double resolves only 0.25 us: the shift
     * must not go through it. */
    long long big = 1700000000000000000LL;
    write_text(in[0], part_text(0, "boot-a", big + 1000000, 10.001));
    write_text(in[1], part_text(1, "boot-b", big + 5000000, 20.002));
    ck_assert_int_eq(fsdp2_trace_merge(in, 2, path_in("m.json")), FSDP2_SUCCESS);
    cJSON *root = load(path_in("m.json"));
    const cJSON *other = cJSON_GetObjectItem(root, "otherData");
    ck_assert_str_eq(cJSON_GetObjectItem(other, "clock")->valuestring, "realtime");
    ck_assert_double_eq_tol(field(other, "realtime_base_us"), (big + 1000000) / 1000.0, 1.0);
    const cJSON *e;
    int seen = 0;
    cJSON_ArrayForEach(e, cJSON_GetObjectItem(root, "traceEvents"))
    {
        double want = field(e, "pid") == 0 ? 10.001 : 4020.002;
        ck_assert_double_eq_tol(field(e, "ts"), want, 1e-6);
        seen++;
    }
    ck_assert_int_eq(seen, 2);
    cJSON_Delete(root);
    /* A file merged across hosts is not a part any more. */
    const char *again[2] = {path_in("m.json"), p1};
    ck_assert_int_eq(fsdp2_trace_merge(again, 2, path_in("m2.json")), FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(fsdp2_last_error(), "already merged"));
    /* One host: timestamps stay. */
    write_text(in[0], part_text(0, "boot-a", 1000000, 10.0));
    write_text(in[1], part_text(1, "boot-a", 5000000, 20.0));
    ck_assert_int_eq(fsdp2_trace_merge(in, 2, path_in("m.json")), FSDP2_SUCCESS);
    root = load(path_in("m.json"));
    ck_assert_double_eq_tol(field(find(root, "X", "a"), "ts"), 10.0, 1e-9);
    cJSON_Delete(root);
    assert_no_tmp();
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("trace");
    TCase *tc = tcase_create("trace");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, a_trace_holds_steps_ranges_a_stream_slice_its_flow_and_counters);
    tcase_add_test(tc, misuse_and_unwritable_paths_are_clear_errors);
    tcase_add_test(tc, a_full_buffer_drops_records_and_says_how_many);
    tcase_add_test(tc, work_still_queued_at_stop_is_left_out_and_never_stamps_the_next_trace);
    tcase_add_test(tc, a_token_kept_across_a_stop_and_a_start_ends_nothing_in_the_new_trace);
#ifdef FSDP2_HAVE_UCX /* fsdp2_init makes a world group */
    tcase_add_test(tc, fsdp2_trace_starts_at_init_and_is_written_at_finalize);
#endif
    tcase_add_test(tc, merge_refuses_bad_parts_and_moves_other_hosts_onto_the_wall_clock);
    suite_add_tcase(s, tc);
    return s;
}

FSDP2_CHECK_MAIN(suite)
