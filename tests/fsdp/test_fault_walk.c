/* The fault-injection walk (docs/reliability.md#fault-injection): one training step over
 * real processes, failed at each of its failure points in turn.
 *
 * The step: forward and backward through the FSDP hooks of a root and two units (uneven
 * shapes: 7 and 3 rows over 2 or 3 ranks), backward_finish, gradient clipping (2-norm and
 * inf-norm), the optimizer, a checkpoint save and load, every parameter gathered whole
 * (a redistribution), and a last all-reduce. A counting run (nothing fails) gives each
 * rank's number of points of each kind (allocations, stream enqueues, collective starts,
 * checkpoint reads and writes, core/fault.h); then for every kind, every rank and every
 * N up to that rank's count, a fresh job runs the step with point N failing on that
 * rank. For each it asserts:
 * - every rank returns an error, within 10 s of the step's start, although the groups'
 *   timeout is 60 s (only failing together can be that fast); or, where the library
 *   absorbs the failure, every rank succeeds with the parameters of the counting run,
 *   bit for bit;
 * - no rank crashes (the suite also runs under ASan and UBSan) or hangs (the runner's
 *   deadline);
 * - the checkpoint directory is absent or whole (fsdp2_checkpoint_verify), with no
 *   "<dir>.partial" left;
 * - no shared-memory segment of the job's ranks is left in /dev/shm.
 * It prints the points walked and the outcomes, per world size.
 *
 * WALK_SAMPLE=P walks a deterministic sample instead: about P points of each kind on
 * each rank, evenly spaced (every ceil(count / P)-th, offset by the rank), and always
 * the first and the last. The sanitizer builds walk a sample (tests/fsdp/meson.build):
 * they look for memory and thread errors on each kind's paths, where the normal build
 * walks every point. */
#include <check.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <fsdp2/checkpoint.h>
#include <fsdp2/fsdp.h>
#include <fsdp2/optim.h>

#include "../collectives/ranks.h"
#include "../core/check_main.h"
#include "../core/remove_tree.h"
#include "core/error.h"
#include "core/fault.h"

#define GROUP_TIMEOUT_MS 60000
#define DEADLINE_S 40
#define FAIL_WITHIN_S 10.0

/* Exit codes of a rank (the runner turns a body's return into its exit code). */
enum { STEP_OK = 0, STEP_FAILED = 10, SETUP_FAILED = 20, TOO_SLOW = 30, BAD_RESULT = 40 };

typedef struct walk {
    char dir[256];   /* the checkpoint directory */
    char files[256]; /* where the ranks leave counts and results */
    fault_kind_t kind;
    uint64_t at; /* 0: the counting run */
    int victim;
} walk_t;

typedef struct model {
    fsdp2_mesh_t *mesh;
    fsdp2_module_t *root, *unit[2];
    fsdp2_param_t *p[5];
    fsdp2_optimizer_t *opt;
    fsdp2_state_dict_t *sd;
} model_t;

static const char *const UNIT_NAME[2] = {"a", "b"};
static const int64_t ROWS[2] = {7, 3}, COLS[2] = {5, 7};

static fsdp2_status_t add_param(fsdp2_module_t *m, const char *name, int ndim,
                                const int64_t *shape, float base, fsdp2_param_t **p)
{
    fsdp2_device_t cpu = FSDP2_DEVICE_CPU_INIT;
    fsdp2_tensor_t *t;
    fsdp2_status_t s = fsdp2_tensor_empty(cpu, FSDP2_F32, ndim, shape, &t);
    if (s != FSDP2_SUCCESS)
        return s;
    float *v = t->data;
    for (int64_t i = 0; i < t->numel; i++)
        v[i] = base + 0.01f * (float)(i % 13) - 0.05f * (float)(i % 3);
    s = fsdp2_module_add_param(m, name, t, 1, p);
    fsdp2_tensor_release(t);
    return s;
}

static fsdp2_status_t build(rank_ctx_t *c, model_t *md)
{
    fsdp2_group_options_t go = FSDP2_GROUP_OPTIONS_INIT;
    go.timeout_ms = GROUP_TIMEOUT_MS;
    int shape[1] = {c->size};
    FSDP2_CHECK(fsdp2_mesh_create(c->store, "walk", c->rank, c->size, 1, shape, NULL, &go,
                                      &md->mesh));
    FSDP2_CHECK(fsdp2_module_create("", &md->root));
    int64_t scale_shape[1] = {5};
    FSDP2_CHECK(add_param(md->root, "scale", 1, scale_shape, 1.0f, &md->p[4]));
    for (int u = 0; u < 2; u++) {
        FSDP2_CHECK(fsdp2_module_create(UNIT_NAME[u], &md->unit[u]));
        FSDP2_CHECK(fsdp2_module_add_child(md->root, md->unit[u]));
        int64_t w[2] = {ROWS[u], COLS[u]}, b[1] = {ROWS[u]};
        FSDP2_CHECK(add_param(md->unit[u], "weight", 2, w, 0.1f * (float)(u + 1), &md->p[2 * u]));
        FSDP2_CHECK(add_param(md->unit[u], "bias", 1, b, -0.2f, &md->p[2 * u + 1]));
    }
    fsdp2_shard_options_t so = FSDP2_SHARD_OPTIONS_INIT;
    so.mesh = md->mesh;
    for (int u = 0; u < 2; u++)
        FSDP2_CHECK(fsdp2_fully_shard(md->unit[u], &so));
    FSDP2_CHECK(fsdp2_fully_shard(md->root, &so));
    fsdp2_optimizer_options_t oo = FSDP2_ADAMW_OPTIONS_INIT(0.01);
    FSDP2_CHECK(fsdp2_optimizer_create(md->root, &oo, &md->opt));
    return fsdp2_state_dict_create(md->root, md->opt, &md->sd);
}

static void teardown(model_t *md)
{
    fsdp2_state_dict_destroy(md->sd);
    fsdp2_optimizer_destroy(md->opt);
    fsdp2_module_destroy(md->root);
    fsdp2_mesh_destroy(md->mesh);
}

/* The unit's gradient: a function of its whole parameters (so that every rank's differs
 * by its rank, and the reduce-scatter's average matters). */
static fsdp2_status_t backward_of(fsdp2_module_t *unit, int nparams, fsdp2_param_t *const *p,
                                  int rank)
{
    FSDP2_CHECK(fsdp2_pre_backward(unit));
    for (int i = 0; i < nparams; i++) {
        fsdp2_tensor_t *value, *grad;
        FSDP2_CHECK(fsdp2_param_unsharded(p[i], &value));
        FSDP2_CHECK(fsdp2_param_grad(p[i], &grad));
        const float *v = value->data;
        float *g = grad->data;
        for (int64_t k = 0; k < grad->numel; k++)
            g[k] += 0.5f * v[k] + 0.01f * (float)(rank + 1);
    }
    return fsdp2_post_backward(unit);
}

static fsdp2_status_t forward_of(fsdp2_module_t *unit, fsdp2_param_t *weight)
{
    FSDP2_CHECK(fsdp2_pre_forward(unit));
    fsdp2_tensor_t *w;
    FSDP2_CHECK(fsdp2_param_unsharded(weight, &w));
    volatile float sink = ((const float *)w->data)[0]; /* the forward reads its parameters */
    (void)sink;
    return fsdp2_post_forward(unit);
}

/* The step; *sum gets a bitwise digest of every parameter gathered whole. */
static fsdp2_status_t step(rank_ctx_t *c, model_t *md, const char *dir, uint64_t *digest)
{
    fsdp2_device_t cpu = FSDP2_DEVICE_CPU_INIT;
    fsdp2_stream_t *current;
    FSDP2_CHECK(fsdp2_stream_current(cpu, &current));
    FSDP2_CHECK(fsdp2_pre_forward(md->root));
    for (int u = 0; u < 2; u++)
        FSDP2_CHECK(forward_of(md->unit[u], md->p[2 * u]));
    FSDP2_CHECK(fsdp2_post_forward(md->root));
    FSDP2_CHECK(fsdp2_pre_backward(md->root));
    for (int u = 1; u >= 0; u--)
        FSDP2_CHECK(backward_of(md->unit[u], 2, &md->p[2 * u], c->rank));
    {
        fsdp2_tensor_t *grad;
        FSDP2_CHECK(fsdp2_param_grad(md->p[4], &grad));
        float *g = grad->data;
        for (int64_t k = 0; k < grad->numel; k++)
            g[k] += 0.25f * (float)(k + c->rank);
    }
    FSDP2_CHECK(fsdp2_post_backward(md->root));
    FSDP2_CHECK(fsdp2_backward_finish(md->root));
    FSDP2_CHECK(fsdp2_stream_synchronize(current));
    double norm = 0, inf_norm = 0;
    FSDP2_CHECK(fsdp2_clip_grad_norm(md->root, 1e9, INFINITY, &inf_norm));
    FSDP2_CHECK(fsdp2_clip_grad_norm(md->root, 0.5, 2.0, &norm));
    FSDP2_CHECK(fsdp2_optimizer_step(md->opt));
    FSDP2_CHECK(fsdp2_optimizer_zero_grad(md->opt));
    FSDP2_CHECK(fsdp2_checkpoint_save(md->sd, dir, NULL));
    FSDP2_CHECK(fsdp2_checkpoint_load(md->sd, dir, NULL, NULL));
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < 5; i++) {
        fsdp2_dtensor_t *sharded;
        fsdp2_tensor_t *full;
        FSDP2_CHECK(fsdp2_param_sharded(md->p[i], &sharded));
        FSDP2_CHECK(fsdp2_dtensor_full_tensor(sharded, NULL, &full));
        const unsigned char *b = full->data;
        for (size_t k = 0; k < full->nbytes; k++)
            h = (h ^ b[k]) * 1099511628211ull;
        fsdp2_tensor_release(full);
    }
    float one = 1.0f;
    fsdp2_group_t *world;
    FSDP2_CHECK(fsdp2_mesh_group(md->mesh, 0, &world));
    FSDP2_CHECK(fsdp2_all_reduce_async(world, &one, 1, FSDP2_F32, NULL, current));
    FSDP2_CHECK(fsdp2_stream_synchronize(current));
    *digest = h;
    return FSDP2_SUCCESS;
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

static int body(rank_ctx_t *c)
{
    const walk_t *w = c->arg;
    model_t md = {0};
    if (build(c, &md) != FSDP2_SUCCESS) {
        fprintf(stderr, "rank %d: set-up: %s\n", c->rank, fsdp2_last_error());
        teardown(&md);
        return SETUP_FAILED;
    }
    /* every rank is set up before any fault can fire */
    if (fsdp2_store_barrier(c->store, "set-up") != FSDP2_SUCCESS) {
        teardown(&md);
        return SETUP_FAILED;
    }
    if (w->at == 0)
        fsdp2_fault_arm(FAULT_NONE, 0); /* counting only */
    else if (c->rank == w->victim)
        fsdp2_fault_arm(w->kind, w->at);
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    uint64_t digest = 0;
    fsdp2_status_t s = step(c, &md, w->dir, &digest);
    double took = ranks_seconds_since(&t0);
    char path[320], text[256];
    if (w->at == 0) {
        snprintf(path, sizeof(path), "%s/counts.%d", w->files, c->rank);
        snprintf(text, sizeof(text), "%llu %llu %llu %llu\n",
                 (unsigned long long)fsdp2_fault_count(FAULT_ALLOC),
                 (unsigned long long)fsdp2_fault_count(FAULT_ENQUEUE),
                 (unsigned long long)fsdp2_fault_count(FAULT_COLLECTIVE),
                 (unsigned long long)fsdp2_fault_count(FAULT_IO));
        write_file(path, text);
    }
    int fired = fsdp2_fault_fired();
    fsdp2_fault_disarm();
    if (s == FSDP2_SUCCESS) {
        snprintf(path, sizeof(path), "%s/digest.%d", w->files, c->rank);
        snprintf(text, sizeof(text), "%016llx\n", (unsigned long long)digest);
        write_file(path, text);
    } else if (w->at == 0 || (c->rank == w->victim && !fired)) {
        fprintf(stderr, "rank %d: the step failed without its fault: %s\n", c->rank,
                fsdp2_last_error());
    }
    if (s != FSDP2_SUCCESS && getenv("WALK_VERBOSE"))
        fprintf(stderr, "rank %d: %s at %.2f s: %s\n", c->rank, fsdp2_status_name(s), took,
                fsdp2_last_error());
    teardown(&md);
    if (took > FAIL_WITHIN_S) {
        fprintf(stderr, "rank %d: %s after %.2f s (more than %.0f s): %s\n", c->rank,
                fsdp2_status_name(s), took, FAIL_WITHIN_S, fsdp2_last_error());
        return TOO_SLOW;
    }
    return s == FSDP2_SUCCESS ? STEP_OK : STEP_FAILED;
}

static int read_text(const char *path, char *buf, size_t len)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    size_t n = fread(buf, 1, len - 1, f);
    buf[n] = '\0';
    fclose(f);
    return 1;
}

/* The checkpoint directory and its "<dir>.partial". */
static void remove_checkpoint(const char *dir)
{
    char partial[300];
    snprintf(partial, sizeof(partial), "%s.partial", dir);
    remove_tree(dir);
    remove_tree(partial);
}

/* The names of our segments in /dev/shm ("fsdp2-<pid>-..."), up to SHM_NAMES of them. */
#define SHM_NAMES 64
typedef struct shm_names {
    int count;
    char name[SHM_NAMES][256]; /* a d_name whole */
} shm_names_t;

static void shm_list(shm_names_t *l)
{
    l->count = 0;
    DIR *d = opendir("/dev/shm");
    struct dirent *e;
    while (d && (e = readdir(d)) && l->count < SHM_NAMES)
        if (strncmp(e->d_name, "fsdp2-", 6) == 0)
            snprintf(l->name[l->count++], sizeof(l->name[0]), "%s", e->d_name);
    if (d)
        closedir(d);
}

/* Segments in /dev/shm created by the job's ranks, all exited (they are unlinked once
 * mapped, so none should stay): named after one of their pids and not there before the
 * job. Other jobs' segments, which a walk running beside this one may leave for a moment,
 * are theirs to check; one left long ago by a process whose pid a rank now has (pids
 * wrap) was there before. */
static int shm_leftovers(const shm_names_t *before, const ranks_result_t *res, int ws)
{
    shm_names_t now;
    shm_list(&now);
    int n = 0;
    for (int i = 0; i < now.count; i++) {
        int pid = 0, old = 0;
        if (sscanf(now.name[i], "fsdp2-%d-", &pid) != 1)
            continue;
        for (int j = 0; j < before->count && !old; j++)
            old = strcmp(now.name[i], before->name[j]) == 0;
        for (int r = 0; r < ws && !old; r++)
            n += pid > 0 && pid == res->pid[r];
    }
    return n;
}

typedef struct tally {
    int walked, together, absorbed;
} tally_t;

/* Whether the walk visits point n (1..count) of one kind on rank victim when it walks
 * about `sample` points of each kind on each rank (0: every point). */
static int in_sample(unsigned long long n, unsigned long long count, int victim,
                     unsigned long long sample)
{
    unsigned long long every = sample ? (count + sample - 1) / sample : 1;
    return every <= 1 || n == 1 || n == count || (n + (unsigned long long)victim) % every == 0;
}

/* One case: the job, then its checks. */
static void run_case(int ws, walk_t *w, const char *reference, tally_t *t)
{
    remove_checkpoint(w->dir);
    for (int r = 0; r < ws; r++) {
        char path[320];
        snprintf(path, sizeof(path), "%s/digest.%d", w->files, r);
        unlink(path);
    }
    shm_names_t before;
    shm_list(&before);
    ranks_result_t res;
    run_ranks_store_only(ws, body, w, DEADLINE_S, &res);
    char what[128];
    snprintf(what, sizeof(what), "ws %d, %s point %llu on rank %d", ws,
             fsdp2_fault_kind_name(w->kind), (unsigned long long)w->at, w->victim);
    ck_assert_msg(!res.timed_out, "%s: the ranks hung", what);
    int failed = 0, ok = 0;
    for (int r = 0; r < ws; r++) {
        ck_assert_msg(res.status[r] == STEP_OK || res.status[r] == STEP_FAILED,
                      "%s: rank %d exited %d (20 set-up, 30 too slow, > 128 a signal)", what, r,
                      res.status[r]);
        failed += res.status[r] == STEP_FAILED;
        ok += res.status[r] == STEP_OK;
    }
    ck_assert_msg(failed == ws || ok == ws, "%s: %d ranks failed and %d succeeded", what,
                  failed, ok);
    if (ok == ws) {
        for (int r = 0; r < ws; r++) {
            char path[320], digest[64] = "";
            snprintf(path, sizeof(path), "%s/digest.%d", w->files, r);
            ck_assert_msg(read_text(path, digest, sizeof(digest)) && !strcmp(digest, reference),
                          "%s: the step succeeded with other parameters on rank %d (%s, not %s)",
                          what, r, digest, reference);
        }
        t->absorbed++;
        if (getenv("WALK_VERBOSE"))
            printf("%s: absorbed\n", what);
    } else {
        t->together++;
    }
    char partial[300];
    snprintf(partial, sizeof(partial), "%s.partial", w->dir);
    struct stat st;
    ck_assert_msg(stat(partial, &st) != 0, "%s: %s was left", what, partial);
    if (stat(w->dir, &st) == 0) {
        uint64_t bytes = 0;
        ck_assert_msg(fsdp2_checkpoint_verify(w->dir, &bytes) == FSDP2_SUCCESS,
                      "%s: a checkpoint that does not verify: %s", what, fsdp2_last_error());
    }
    ck_assert_msg(shm_leftovers(&before, &res, ws) == 0, "%s: entries left in /dev/shm", what);
    t->walked++;
}

static void walk(int ws)
{
    walk_t w = {.kind = FAULT_NONE, .at = 0};
    char base[] = "/tmp/fsdp2-walk-XXXXXX";
    ck_assert(mkdtemp(base) != NULL);
    snprintf(w.files, sizeof(w.files), "%s", base);
    snprintf(w.dir, sizeof(w.dir), "%s/ckpt", base);
    /* The counting run: nothing fails; its digest is the reference. */
    ranks_result_t res;
    remove_checkpoint(w.dir);
    int bad = run_ranks_store_only(ws, body, &w, DEADLINE_S, &res);
    ck_assert_msg(bad == 0 && !res.timed_out, "ws %d: the step without faults failed: %d %d %d",
                  ws, res.status[0], res.status[1], res.status[2]);
    char reference[64] = "", path[320], text[256];
    snprintf(path, sizeof(path), "%s/digest.0", w.files);
    ck_assert(read_text(path, reference, sizeof(reference)));
    unsigned long long counts[4][4] = {{0}};
    for (int r = 0; r < ws; r++) {
        snprintf(path, sizeof(path), "%s/counts.%d", w.files, r);
        ck_assert(read_text(path, text, sizeof(text)));
        ck_assert(sscanf(text, "%llu %llu %llu %llu", &counts[r][0], &counts[r][1],
                         &counts[r][2], &counts[r][3]) == 4);
    }
    tally_t total = {0};
    const char *sample_text = getenv("WALK_SAMPLE");
    unsigned long long sample = sample_text ? strtoull(sample_text, NULL, 10) : 0;
    if (sample)
        printf("ws %d: a sample of about %llu points of each kind on each rank\n", ws, sample);
    for (int k = FAULT_ALLOC; k <= FAULT_IO; k++) {
        unsigned long long most = 0;
        for (int r = 0; r < ws; r++)
            most = counts[r][k - 1] > most ? counts[r][k - 1] : most;
        tally_t t = {0};
        /* WALK_ONLY="KIND N" runs that case alone (with WALK_VERBOSE=1: every rank's error) */
        const char *only = getenv("WALK_ONLY");
        char only_kind[16] = "";
        unsigned long long only_at = 0;
        if (only && sscanf(only, "%15s %llu", only_kind, &only_at) != 2)
            only = NULL;
        for (unsigned long long n = 1; n <= most; n++) {
            if (only && (strcmp(only_kind, fsdp2_fault_kind_name((fault_kind_t)k)) || n != only_at))
                continue;
            for (int victim = 0; victim < ws; victim++) {
                if (counts[victim][k - 1] < n ||
                    !(only || in_sample(n, counts[victim][k - 1], victim, sample)))
                    continue;
                w.kind = (fault_kind_t)k;
                w.at = n;
                w.victim = victim;
                run_case(ws, &w, reference, &t);
            }
        }
        printf("ws %d: %-10s points per rank", ws, fsdp2_fault_kind_name((fault_kind_t)k));
        for (int r = 0; r < ws; r++)
            printf(" %llu", counts[r][k - 1]);
        printf("; walked %d: failed together %d, absorbed %d\n", t.walked, t.together,
               t.absorbed);
        ck_assert_msg(only || most == 0 || t.walked > 0, "ws %d: no %s point walked", ws,
                      fsdp2_fault_kind_name((fault_kind_t)k));
        total.walked += t.walked;
        total.together += t.together;
        total.absorbed += t.absorbed;
    }
    printf("ws %d: %d points walked: every rank failed within %.0f s in %d, the step "
           "succeeded with the reference parameters in %d\n",
           ws, total.walked, FAIL_WITHIN_S, total.together, total.absorbed);
    fflush(stdout);
    remove_checkpoint(w.dir);
    for (int r = 0; r < ws; r++) {
        snprintf(path, sizeof(path), "%s/counts.%d", w.files, r);
        unlink(path);
        snprintf(path, sizeof(path), "%s/digest.%d", w.files, r);
        unlink(path);
    }
    rmdir(base);
}

START_TEST(every_failure_point_of_a_step_fails_every_rank_together)
{
    walk(_i);
}
END_TEST

static Suite *walk_suite(void)
{
    Suite *s = suite_create("fault walk");
    TCase *tc = tcase_create("walk");
    tcase_set_timeout(tc, 1200);
    tcase_add_loop_test(tc, every_failure_point_of_a_step_fails_every_rank_together, 2, 4);
    suite_add_tcase(s, tc);
    return s;
}

FSDP2_CHECK_MAIN(walk_suite)
