/* Traces of real sharded steps (1 to 4 ranks): each rank traces three steps of the MLP of
 * mlp_model.h into its own file, rank 0 merges them with fsdp2_trace_merge and checks the
 * result against what the model says must have happened, computed here from the shapes:
 * every slice balanced and nested on its track, every flow paired and in order, one
 * forward and one backward per layer per step on compute, two all-gathers and one
 * reduce-scatter per layer per step carrying exactly that layer's padded shard bytes, the
 * memory counters' sharded bytes equal to the shards' sizes and the unsharded ones never
 * above the plan. The numbers still match the one-process reference (run_train).
 *
 * With reshard_after_forward = 2 at 4 ranks, each layer's second (backward) all-gather
 * runs over its block of 2 ranks (a group named ".../block2-<b>") and carries the
 * post-forward shard's bytes (ceil(rows / 2) rows), and a post-forward hold of that size
 * shows between forward and backward. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <fsdp2/fsdp.h>
#include <fsdp2/trace.h>

#include "../core/check_main.h"
#include "../core/remove_tree.h"
#include "mlp_model.h"

#define TRACED_FROM 1
#define TRACED_STEPS 3
#define EPS_US 0.0005

static char dir[256];
static int block; /* reshard_after_forward of the traced run (1, or 2 at 4 ranks) */

typedef struct slice {
    int pid, tid;
    double ts, end;
    const char *name, *cat, *module, *category, *group;
    long long step, bytes;
} slice_t;

static int slice_order(const void *a, const void *b)
{
    const slice_t *x = a, *y = b;
    if (x->pid != y->pid)
        return x->pid - y->pid;
    if (x->tid != y->tid)
        return x->tid - y->tid;
    if (x->ts != y->ts)
        return x->ts < y->ts ? -1 : 1;
    return x->end > y->end ? -1 : x->end < y->end; /* the enclosing one first */
}

static double num(const cJSON *o, const char *key, double missing)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(v) ? v->valuedouble : missing;
}

static const char *text(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* Padded shard bytes of layer l at ws (weight and bias, f32): what one rank sends in the
 * layer's all-gather and receives from its reduce-scatter. */
static long long shard_bytes(int l, int ws)
{
    int64_t rows = DIM[l + 1], chunk = (rows + ws - 1) / ws;
    return (long long)(chunk * DIM[l] + chunk) * 4;
}

static long long full_bytes(int l)
{
    return (long long)(DIM[l + 1] * DIM[l] + DIM[l + 1]) * 4;
}

static int probe_steps(run_t *r, probe_point_t at, int layer)
{
    (void)layer;
    if (at != PROBE_STEP_START || r->step < TRACED_FROM)
        return 0;
    int fails = 0;
    if (r->step == TRACED_FROM) {
        /* Without fsdp2_init, the rank comes from the launcher's variables. */
        char rank[16], size[16], path[320];
        snprintf(rank, sizeof(rank), "%d", r->c->rank);
        snprintf(size, sizeof(size), "%d", r->c->size);
        setenv("RANK", rank, 1);
        setenv("WORLD_SIZE", size, 1);
        setenv("MASTER_ADDR", "127.0.0.1", 1);
        setenv("MASTER_PORT", "1", 1);
        snprintf(path, sizeof(path), "%s/trace.json", dir);
        fails += OK(r->c, fsdp2_trace_start(NULL, path));
    }
    return fails + OK(r->c, fsdp2_trace_step(r->step));
}

/* Checks rank 0 makes of the merged trace; returns failures. */
static int check_merged(rank_ctx_t *c, const char *path, uint64_t planned_unsharded)
{
    int ws = c->size, fails = 0;
    FILE *f = fopen(path, "rb");
    fails += RANK_CHECK(c, f != NULL, "cannot open the merged trace %s", path);
    if (!f)
        return fails;
    static char buf[8 << 20];
    size_t len = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[len] = '\0';
    cJSON *root = cJSON_Parse(buf);
    cJSON *events = root ? cJSON_GetObjectItemCaseSensitive(root, "traceEvents") : NULL;
    fails += RANK_CHECK(c, cJSON_IsArray(events), "the merged trace is not JSON with traceEvents");
    if (!cJSON_IsArray(events)) {
        cJSON_Delete(root);
        return fails;
    }
    int n = cJSON_GetArraySize(events), ns = 0, flows_s = 0, flows_f = 0;
    slice_t *sl = calloc((size_t)n, sizeof(*sl));
    double *flow_s = calloc((size_t)n, sizeof(double)), *flow_f = calloc((size_t)n, sizeof(double));
    long long *flow_id_s = calloc((size_t)n, sizeof(long long)),
              *flow_id_f = calloc((size_t)n, sizeof(long long));
    long long sharded_params[8] = {0}, max_unsharded[8] = {0};
    int counters[8] = {0};
    const cJSON *e;
    cJSON_ArrayForEach(e, events)
    {
        const char *ph = text(e, "ph");
        int pid = (int)num(e, "pid", -1);
        if (!ph || pid < 0 || pid >= ws) {
            fails += RANK_CHECK(c, 0, "an event without ph or with pid %d", pid);
            continue;
        }
        if (!strcmp(ph, "X")) {
            const cJSON *args = cJSON_GetObjectItemCaseSensitive(e, "args");
            slice_t *s = &sl[ns++];
            s->pid = pid;
            s->tid = (int)num(e, "tid", -1);
            s->ts = num(e, "ts", NAN);
            s->end = s->ts + num(e, "dur", NAN);
            s->name = text(e, "name");
            s->cat = text(e, "cat");
            s->module = text(args, "module");
            s->category = text(args, "category");
            s->group = text(args, "group");
            s->step = (long long)num(args, "step", -1);
            s->bytes = (long long)num(args, "bytes", 0);
            fails += RANK_CHECK(c, s->name && s->cat && isfinite(s->ts) && s->end >= s->ts,
                                "a malformed slice on rank %d track %d", pid, s->tid);
        } else if (!strcmp(ph, "s")) {
            flow_id_s[flows_s] = (long long)num(e, "id", -1);
            flow_s[flows_s++] = num(e, "ts", NAN);
        } else if (!strcmp(ph, "f")) {
            flow_id_f[flows_f] = (long long)num(e, "id", -1);
            flow_f[flows_f++] = num(e, "ts", NAN);
        } else if (!strcmp(ph, "C")) {
            const cJSON *args = cJSON_GetObjectItemCaseSensitive(e, "args");
            static const char *const keys[] = {"sharded_params", "sharded_grads",
                                               "unsharded_params", "unsharded_grads",
                                               "reduce_scatter", "optimizer_state"};
            for (int k = 0; k < 6; k++)
                fails += RANK_CHECK(c, num(args, keys[k], -1) >= 0,
                                    "a memory counter of rank %d lacks %s", pid, keys[k]);
            if (!counters[pid]++)
                sharded_params[pid] = (long long)num(args, "sharded_params", -1);
            long long u = (long long)num(args, "unsharded_params", 0);
            if (u > max_unsharded[pid])
                max_unsharded[pid] = u;
        }
    }
    /* Slices on a track nest or are disjoint. */
    qsort(sl, (size_t)ns, sizeof(*sl), slice_order);
    for (int i = 0; i < ns; i++) {
        for (int j = i - 1; j >= 0 && sl[j].pid == sl[i].pid && sl[j].tid == sl[i].tid; j--) {
            if (sl[j].end <= sl[i].ts + EPS_US)
                continue; /* before it */
            fails += RANK_CHECK(c, sl[i].end <= sl[j].end + EPS_US,
                                "rank %d track %d: '%s' [%.3f, %.3f] partly overlaps '%s' "
                                "[%.3f, %.3f]",
                                sl[i].pid, sl[i].tid, sl[i].name, sl[i].ts, sl[i].end, sl[j].name,
                                sl[j].ts, sl[j].end);
            break;
        }
    }
    /* Flows pair up, the release not before the record. */
    fails += RANK_CHECK(c, flows_s == flows_f, "%d flow starts, %d flow ends", flows_s, flows_f);
    for (int i = 0; i < flows_f; i++) {
        int found = 0;
        for (int j = 0; j < flows_s; j++) {
            if (flow_id_s[j] == flow_id_f[i]) {
                found++;
                fails += RANK_CHECK(c, flow_f[i] >= flow_s[j], "flow %lld ends before it starts",
                                    flow_id_f[i]);
            }
        }
        fails += RANK_CHECK(c, found == 1, "flow %lld has %d starts", flow_id_f[i], found);
    }
    if (ws > 1)
        fails += RANK_CHECK(c, flows_f >= ws * TRACED_STEPS * LAYERS,
                            "%d flows: want at least one per gathered layer per step", flows_f);
    /* Per rank, step and layer: what ran, and the bytes it carried. */
    for (int rank = 0; rank < ws; rank++) {
        long long want_sharded = 0;
        for (int l = 0; l < LAYERS; l++)
            want_sharded += shard_bytes(l, ws);
        fails += RANK_CHECK(c, counters[rank] > 0 && sharded_params[rank] == want_sharded,
                            "rank %d: %d counters, sharded_params %lld, want %lld", rank,
                            counters[rank], sharded_params[rank], want_sharded);
        fails += RANK_CHECK(c, max_unsharded[rank] <= (long long)planned_unsharded &&
                                   (ws == 1 || max_unsharded[rank] > 0),
                            "rank %d: unsharded_params up to %lld bytes, plan %llu", rank,
                            max_unsharded[rank], (unsigned long long)planned_unsharded);
        for (int step = TRACED_FROM; step < TRACED_FROM + TRACED_STEPS; step++) {
            int steps = 0;
            for (int i = 0; i < ns; i++) {
                char want[32];
                snprintf(want, sizeof(want), "step %d", step);
                steps += sl[i].pid == rank && !strcmp(sl[i].cat, "step") && !strcmp(sl[i].name, want);
            }
            fails += RANK_CHECK(c, steps == 1, "rank %d: %d slices 'step %d'", rank, steps, step);
            for (int l = 0; l < LAYERS; l++) {
                int fwd = 0, bwd = 0, ag = 0, rs = 0, hold = 0, bad_bytes = 0, pf_hold = 0;
                int block_ag = 0;
                for (int i = 0; i < ns; i++) {
                    const slice_t *s = &sl[i];
                    if (s->pid != rank || s->step != step || !s->module ||
                        strcmp(s->module, LAYER_NAME[l]))
                        continue;
                    fwd += !strcmp(s->cat, "forward");
                    bwd += !strcmp(s->cat, "backward");
                    if (!strcmp(s->cat, "all_gather")) {
                        /* With a block: the first (forward) over the shard dim, the
                         * second (backward) over the block. */
                        int over_block = s->group && strstr(s->group, "/block") != NULL;
                        ag++;
                        block_ag += over_block;
                        bad_bytes += s->bytes != (over_block ? shard_bytes(l, block)
                                                             : shard_bytes(l, ws));
                    }
                    if (!strcmp(s->cat, "memory") && s->category &&
                        !strcmp(s->category, "post_forward_params")) {
                        pf_hold++;
                        bad_bytes += s->bytes != shard_bytes(l, block);
                    }
                    if (!strcmp(s->cat, "reduce_scatter")) {
                        rs++;
                        bad_bytes += s->bytes * ws != shard_bytes(l, ws) * ws;
                    }
                    if (!strcmp(s->cat, "memory") && s->category &&
                        strncmp(s->category, "unsharded_", 10) == 0) {
                        hold++; /* its parameters or its gradients, whole */
                        bad_bytes += s->bytes != full_bytes(l);
                    }
                }
                int gathers = ws > 1 ? 2 : 0, reduces = ws > 1 ? 1 : 0;
                /* Held: the gradient buffer, and with ws > 1 the parameters twice. */
                int holds = ws > 1 ? 3 : 1, blocked = block > 1 && block < ws;
                fails += RANK_CHECK(c, fwd == 1 && bwd == 1 && ag == gathers && rs == reduces &&
                                           hold == holds && !bad_bytes &&
                                           block_ag == blocked && pf_hold == blocked,
                                    "rank %d step %d %s: %d forward, %d backward, %d all-gathers "
                                    "(want %d; %d over a block, want %d), %d reduce-scatters "
                                    "(want %d), %d buffer holds (want %d), %d post-forward holds "
                                    "(want %d), %d slices with wrong bytes (shard %lld)",
                                    rank, step, LAYER_NAME[l], fwd, bwd, ag, gathers, block_ag,
                                    blocked, rs, reduces, hold, holds, pf_hold, blocked, bad_bytes,
                                    shard_bytes(l, ws));
            }
        }
    }
    free(sl);
    free(flow_s);
    free(flow_f);
    free(flow_id_s);
    free(flow_id_f);
    cJSON_Delete(root);
    return fails;
}

static int body_trace(rank_ctx_t *c)
{
    run_t *r = malloc(sizeof(*r));
    int fails = run_open(c, r);
    build_options_t bo = BUILD_DEFAULT;
    bo.reshard_after_forward = block;
    if (!fails)
        fails += build_model(r, &bo);
    ref_model_t ref;
    ref_init(&ref);
    r->probe = probe_steps;
    if (!fails)
        fails += run_train(r, &ref, 0, TRACED_FROM + TRACED_STEPS, 0);
    fails += OK(c, fsdp2_trace_stop(NULL));
    fsdp2_memory_plan_t plan = {.size = sizeof(plan)};
    if (!fails)
        fails += OK(c, fsdp2_memory_plan(r->root, &plan));
    /* Every rank's file is written: rank 0 merges them. */
    if (!fails)
        fails += OK(c, fsdp2_store_barrier(c->store, "trace-written"));
    if (!fails && c->rank == 0) {
        const char *parts[4];
        char names[4][320], merged[320];
        for (int k = 0; k < c->size; k++) {
            if (c->size > 1)
                snprintf(names[k], sizeof(names[k]), "%s/trace.json.rank%d.json", dir, k);
            else
                snprintf(names[k], sizeof(names[k]), "%s/trace.json", dir);
            parts[k] = names[k];
        }
        snprintf(merged, sizeof(merged), "%s/merged.json", dir);
        fails += OK(c, fsdp2_trace_merge(parts, (size_t)c->size, merged));
        if (!fails)
            fails += check_merged(c, merged, plan.unsharded_params);
        if (!fails && block > 1)
            fails += RANK_CHECK(c, plan.post_forward_params > 0,
                                "reshard_after_forward %d: the plan has no post-forward bytes",
                                block);
    }
    fails += run_close(r);
    free(r);
    return fails;
}

static void traced_run(int ws, int n, const char *what)
{
    snprintf(dir, sizeof(dir), "/tmp/fsdp2-trace-test-%ld-%d-%d", (long)getpid(), ws, n);
    ck_assert_int_eq(mkdir(dir, 0700), 0);
    block = n;
    run_case(ws, body_trace, what);
    remove_tree(dir);
}

START_TEST(a_traced_step_shows_each_layers_work_with_its_bytes_on_every_rank)
{
    traced_run(_i, 1, "traced steps");
}
END_TEST

START_TEST(reshard_to_2_of_4_gathers_backward_over_the_block_with_the_smaller_shards)
{
    traced_run(4, 2, "traced steps with reshard_after_forward 2");
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("fsdp_trace");
    TCase *tc = tcase_create("trace");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, a_traced_step_shows_each_layers_work_with_its_bytes_on_every_rank, 1, 5);
    tcase_add_test(tc, reshard_to_2_of_4_gathers_backward_over_the_block_with_the_smaller_shards);
    suite_add_tcase(s, tc);
    return s;
}

FSDP2_CHECK_MAIN(suite)
