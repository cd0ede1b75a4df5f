/* HSDP: fully_shard on a 2D [replicate, shard] mesh, with real processes (2 to 4 ranks),
 * against the one-process SGD reference of mlp_model.h.
 *
 * Every rank trains on its own slice of the batch (global rank g of R x S ranks takes
 * samples [g * 24 / (R * S), ...)), so the reference's full-batch gradient is the mean
 * over all R * S ranks. The reduce-scatter over the shard dim alone gives the mean over
 * one replica's samples only: a missing or wrong all-reduce over the replicate dim shows
 * as gradients (and then parameters) off by the other replicas' share, and as replicas
 * that drift apart. The meshes cover R = 1 (one replica: FSDP through a 2D mesh), S = 1
 * (every rank holds whole parameters: the all-reduce alone reduces) and both > 1.
 *
 * Checkpoints cross layouts: saved on a 1D 4-rank mesh and loaded on 2x2, saved on 2x2
 * and loaded on a 1D 3-rank mesh, compared bitwise; the 2x2 save must write every chunk
 * once (replica 0), which the parent checks in metadata.json and the rank files. */
#include <check.h>
#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <fsdp2/checkpoint.h>
#include <fsdp2/fsdp.h>

#include "../core/check_main.h"
#include "../core/remove_tree.h"
#include "mlp_model.h"

typedef struct mesh_shape {
    int replicas, shards; /* [R, S] */
} mesh_shape_t;

/* Loop index -> mesh, for the tests that run on every layout. */
static const mesh_shape_t MESHES[] = {{2, 2}, {1, 4}, {4, 1}, {2, 1}, {1, 3}, {3, 1}};
#define NUM_MESHES ((int)(sizeof(MESHES) / sizeof(MESHES[0])))

#define SAVED_STEPS 3 /* steps trained before a checkpoint is saved */

/* What the parent hands its ranks (c->arg): forked, so the pointer stays valid. */
typedef struct hsdp_job {
    mesh_shape_t mesh;
    char root[PATH_MAX - 64]; /* mkdtemp'd by the parent */
    char dir[PATH_MAX];       /* root/ckpt: the checkpoint */
    char expected[PATH_MAX];  /* root/expected.bin: whole tensors a saving run wrote */
} hsdp_job_t;

static const char *kind_name(int kind)
{
    return kind ? "bias" : "weight";
}

static int64_t numel_of(int l, int kind)
{
    return (int64_t)DIM[l + 1] * (kind ? 1 : DIM[l]);
}

/* Like run_open, on a [replicate, shard] mesh; checks the row-major coordinates. */
static int hsdp_open(rank_ctx_t *c, run_t *r, mesh_shape_t m)
{
    int fails = run_open_2d(c, r, m.replicas); /* the checks below catch a shard size
                                                  that is not ws / replicas */
    if (fails)
        return fails;
    int rep = -1, shard = -1, dim = -1;
    fails += OK(c, fsdp2_mesh_coordinate(r->mesh, 0, &rep));
    fails += OK(c, fsdp2_mesh_coordinate(r->mesh, 1, &shard));
    fails += OK(c, fsdp2_mesh_dim(r->mesh, "shard", &dim));
    fails += RANK_CHECK(c, rep == c->rank / m.shards && shard == c->rank % m.shards && dim == 1,
                        "mesh %dx%d: rank %d at (%d, %d), 'shard' dim %d; want (%d, %d), dim 1",
                        m.replicas, m.shards, c->rank, rep, shard, dim, c->rank / m.shards,
                        c->rank % m.shards);
    return fails;
}

/* got against want (whose: what want is) bit for bit; prints the first difference with
 * both values and their bits. */
static int compare_bits(run_t *r, const char *what, const char *whose, const float *got,
                        const float *want, int64_t n)
{
    for (int64_t k = 0; k < n; k++) {
        if (memcmp(&got[k], &want[k], sizeof(float)) == 0)
            continue;
        uint32_t gb, wb;
        memcpy(&gb, &got[k], sizeof(gb));
        memcpy(&wb, &want[k], sizeof(wb));
        return RANK_CHECK(r->c, 0, "step %d: %s[%lld] is %.9g (0x%08x), %s %.9g (0x%08x)",
                          r->step, what, (long long)k, got[k], gb, whose, want[k], wb);
    }
    return 0;
}

/* Parameter (grad 0) or sharded gradient (grad 1) of layer l, gathered whole. */
static int full_of(run_t *r, int l, int kind, int grad, fsdp2_tensor_t **full)
{
    rank_ctx_t *c = r->c;
    fsdp2_dtensor_t *dt = NULL;
    *full = NULL;
    int fails = grad ? OK(c, fsdp2_param_sharded_grad(r->p[l][kind], &dt))
                     : OK(c, fsdp2_param_sharded(r->p[l][kind], &dt));
    if (fails || !dt)
        return fails + RANK_CHECK(c, dt != NULL, "%s.%s: no DTensor", LAYER_NAME[l],
                                  kind_name(kind));
    fails += OK(c, fsdp2_dtensor_full_tensor(dt, NULL, full));
    if (!fails)
        fails += RANK_CHECK(c, (*full)->numel == numel_of(l, kind) && (*full)->dtype == FSDP2_F32,
                            "%s.%s: full tensor of %lld %s, want %lld f32", LAYER_NAME[l],
                            kind_name(kind), (long long)(*full)->numel,
                            fsdp2_dtype_name((*full)->dtype), (long long)numel_of(l, kind));
    return fails;
}

/* ---------------------------------------------------------------------------------- */
/* Layout                                                                              */

/* One DTensor of a parameter: [Replicate, Shard(0)] on the run's mesh, torch.chunk's
 * rows [off, off + len) of the shard dim, whatever the replica. */
static int check_dtensor_layout(run_t *r, int l, int kind, int grad, int64_t off, int64_t len)
{
    rank_ctx_t *c = r->c;
    static const fsdp2_placement_t want[2] = {FSDP2_REPLICATE_INIT, FSDP2_SHARD_INIT(0)};
    char what[64];
    snprintf(what, sizeof(what), "%s.%s%s", LAYER_NAME[l], kind_name(kind), grad ? " grad" : "");
    fsdp2_dtensor_t *dt = NULL;
    int fails = grad ? OK(c, fsdp2_param_sharded_grad(r->p[l][kind], &dt))
                     : OK(c, fsdp2_param_sharded(r->p[l][kind], &dt));
    if (fails || !dt)
        return fails + RANK_CHECK(c, dt != NULL, "%s: no DTensor", what);
    fsdp2_dtensor_info_t info;
    fsdp2_mesh_t *mesh = NULL;
    fails += OK(c, fsdp2_dtensor_info(dt, &info));
    fails += OK(c, fsdp2_dtensor_mesh(dt, &mesh));
    if (fails)
        return fails;
    char placements[96] = "";
    fsdp2_placements_format(info.mesh_ndim, info.placements, placements, sizeof(placements));
    fails += RANK_CHECK(c, mesh == r->mesh && info.mesh_ndim == 2 &&
                               info.placements[0].type == FSDP2_PLACEMENT_REPLICATE &&
                               info.placements[1].type == FSDP2_PLACEMENT_SHARD &&
                               info.placements[1].dim == 0,
                        "%s: %s over %d mesh dims (mesh %p), want [Replicate(), Shard(dim=0)] "
                        "over the 2 of %p",
                        what, placements, info.mesh_ndim, (void *)mesh, (void *)r->mesh);
    int ndim = kind ? 1 : 2;
    int64_t rows = DIM[l + 1], cols = kind ? 1 : DIM[l];
    int64_t shape[2] = {rows, cols};
    fails += RANK_CHECK(c, info.ndim == ndim && info.shape[0] == rows &&
                               (kind || info.shape[1] == cols) && info.local_shape[0] == len &&
                               (kind || info.local_shape[1] == cols) && info.offset[0] == off &&
                               info.dtype == FSDP2_F32,
                        "%s: %d-D global [%lld,..], local %lld rows at %lld; want %d-D [%lld,..], "
                        "%lld rows at %lld",
                        what, info.ndim, (long long)info.shape[0], (long long)info.local_shape[0],
                        (long long)info.offset[0], ndim, (long long)rows, (long long)len,
                        (long long)off);
    fails += OK(c, fsdp2_dtensor_check(dt, what, r->mesh, want, FSDP2_F32, ndim, shape));
    fsdp2_tensor_t *local = NULL;
    fails += OK(c, fsdp2_dtensor_to_local(dt, &local));
    if (local)
        fails += RANK_CHECK(c, local->numel == len * cols, "%s: local tensor of %lld, want %lld",
                            what, (long long)local->numel, (long long)(len * cols));
    fsdp2_tensor_release(local);
    return fails;
}

/* Every parameter and gradient is [Replicate, Shard(0)] with the rows of this rank's
 * shard coordinate, and the groups' shards are padded chunks over S (not R * S). */
static int check_hsdp_layout(run_t *r, mesh_shape_t m)
{
    rank_ctx_t *c = r->c;
    int shard = c->rank % m.shards, fails = 0;
    for (int l = 0; l < LAYERS; l++) {
        int64_t expect_shard = 0;
        for (int kind = 0; kind < 2; kind++) {
            int64_t off, len;
            chunk_rows(DIM[l + 1], m.shards, shard, &off, &len);
            expect_shard += ((DIM[l + 1] + m.shards - 1) / m.shards) * (kind ? 1 : DIM[l]);
            fails += check_dtensor_layout(r, l, kind, 0, off, len);
            fails += check_dtensor_layout(r, l, kind, 1, off, len);
        }
        fsdp2_module_state_t st = state_of(r, r->fc[l]);
        fails += RANK_CHECK(c, st.sharded && st.shard_numel == expect_shard &&
                                   st.unsharded_numel == numel_of(l, 0) + numel_of(l, 1),
                            "%s on %dx%d: shard_numel %lld, unsharded_numel %lld; want %lld "
                            "(chunks over S = %d), %lld",
                            LAYER_NAME[l], m.replicas, m.shards, (long long)st.shard_numel,
                            (long long)st.unsharded_numel, (long long)expect_shard, m.shards,
                            (long long)(numel_of(l, 0) + numel_of(l, 1)));
    }
    return fails;
}

/* Every replica holds the same parameters (grad 0) or sharded gradients (grad 1): each
 * rank gathers its whole tensor over the shard dim, the replicas exchange theirs over the
 * replicate dim, and every one is compared bitwise with replica 0's. */
static int check_replicas_equal(run_t *r, int grad)
{
    rank_ctx_t *c = r->c;
    fsdp2_group_t *rep = NULL;
    int replicas = 0;
    int fails = OK(c, fsdp2_mesh_group(r->mesh, 0, &rep));
    if (!fails)
        fails += OK(c, fsdp2_group_size(rep, &replicas));
    for (int l = 0; l < LAYERS && !fails; l++) {
        for (int kind = 0; kind < 2 && !fails; kind++) {
            fsdp2_tensor_t *full = NULL;
            fails += full_of(r, l, kind, grad, &full);
            int64_t n = numel_of(l, kind);
            float *all = calloc((size_t)(replicas * n), sizeof(float));
            if (!fails)
                fails += OK(c, fsdp2_all_gather_async(rep, full->data, all, (size_t)n, FSDP2_F32,
                                                      c->stream));
            if (!fails)
                fails += OK(c, fsdp2_stream_synchronize(c->stream));
            for (int j = 1; j < replicas && !fails; j++) {
                char what[96];
                snprintf(what, sizeof(what), "replica %d's %s.%s%s", j, LAYER_NAME[l],
                         kind_name(kind), grad ? " grad" : "");
                fails += compare_bits(r, what, "replica 0's", all + j * n, all, n);
            }
            free(all);
            fsdp2_tensor_release(full);
        }
    }
    return fails;
}

static int probe_replicas(run_t *r, probe_point_t at, int layer)
{
    (void)layer;
    if (at == PROBE_FINISHED && r->planned_allocated)
        return probe_memory(r, at) + check_replicas_equal(r, 1);
    if (at == PROBE_FINISHED)
        return check_replicas_equal(r, 1);
    if (at == PROBE_STEP_START)
        return probe_memory(r, at);
    if (at == PROBE_STEP_END)
        return check_replicas_equal(r, 0);
    return 0;
}

/* ---------------------------------------------------------------------------------- */
/* Training                                                                            */

static int body_train(rank_ctx_t *c)
{
    const hsdp_job_t *job = c->arg;
    run_t *r = malloc(sizeof(*r));
    int fails = hsdp_open(c, r, job->mesh);
    build_options_t bo = BUILD_DEFAULT;
    if (!fails)
        fails += build_model(r, &bo);
    ref_model_t ref;
    ref_init(&ref);
    if (!fails)
        fails += compare_params(r, &ref);
    /* The plan holds every byte of the steps (the replicate all-reduce included). */
    fsdp2_memory_plan_t plan;
    if (!fails)
        fails += plan_memory(r, &plan);
    r->probe = probe_replicas;
    if (!fails)
        fails += run_train(r, &ref, 0, STEPS, 1);
    if (!fails) {
        fsdp2_module_state_t s1 = state_of(r, r->fc[0]);
        fails += RANK_CHECK(c, s1.reduce_scatters == STEPS,
                            "fc1 reduce_scatters %llu after %d steps, want %d",
                            (unsigned long long)s1.reduce_scatters, STEPS, STEPS);
    }
    fails += run_close(r);
    free(r);
    return fails;
}

static int body_layout(rank_ctx_t *c)
{
    const hsdp_job_t *job = c->arg;
    run_t *r = malloc(sizeof(*r));
    int fails = hsdp_open(c, r, job->mesh);
    build_options_t bo = BUILD_DEFAULT;
    if (!fails)
        fails += build_model(r, &bo);
    if (!fails)
        fails += check_hsdp_layout(r, job->mesh);
    if (!fails)
        fails += check_replicas_equal(r, 0);
    ref_model_t ref;
    ref_init(&ref);
    r->probe = probe_replicas; /* replicas stay equal while fed different samples */
    if (!fails)
        fails += run_train(r, &ref, 0, 2, 0);
    if (!fails) /* the optimizer wrote through the local tensors: the layout is unchanged */
        fails += check_hsdp_layout(r, job->mesh);
    fails += run_close(r);
    free(r);
    return fails;
}

/* Two micro-batches per step: the first without gradient sync (no reduce-scatter, no
 * all-reduce), the second with it; the sharded gradients are the sum of both. */
static int body_accumulate(rank_ctx_t *c)
{
    const hsdp_job_t *job = c->arg;
    run_t *r = malloc(sizeof(*r));
    work_t *refwork = malloc(sizeof(*refwork));
    int fails = hsdp_open(c, r, job->mesh);
    build_options_t bo = BUILD_DEFAULT;
    if (!fails)
        fails += build_model(r, &bo);
    ref_model_t ref;
    ref_init(&ref);
    for (int s = 0; s < 3 && !fails; s++) {
        r->step = s;
        for (int micro = 0; micro < 2 && !fails; micro++) {
            fails += OK(c, fsdp2_set_requires_gradient_sync(r->root, micro == 1));
            r->grads_start_at_zero = micro == 0; /* the accumulator may hold micro 0 */
            uint64_t rs_before = state_of(r, r->fc[0]).reduce_scatters;
            fails += run_micro_batch(r, &ref, refwork, micro, 2);
            if (fails)
                break;
            uint64_t rs_after = state_of(r, r->fc[0]).reduce_scatters;
            fails += RANK_CHECK(c, rs_after == rs_before + (micro == 1),
                                "step %d micro %d: fc1 reduce_scatters went %llu -> %llu, want +%d",
                                s, micro, (unsigned long long)rs_before,
                                (unsigned long long)rs_after, micro == 1);
        }
        if (fails)
            break;
        fails += compare_grads(r, &ref);
        fails += run_sgd(r);
        ref_sgd(&ref);
        fails += compare_params(r, &ref);
    }
    fails += run_close(r);
    free(refwork);
    free(r);
    return fails;
}

/* ---------------------------------------------------------------------------------- */
/* Checkpoints across layouts                                                          */

static int save_model(run_t *r, const char *dir)
{
    fsdp2_state_dict_t *sd = NULL;
    int fails = OK(r->c, fsdp2_state_dict_create(r->root, NULL, &sd));
    fsdp2_checkpoint_options_t opts = FSDP2_CHECKPOINT_OPTIONS_INIT;
    opts.step = SAVED_STEPS;
    if (!fails)
        fails += OK(r->c, fsdp2_checkpoint_save(sd, dir, &opts));
    fsdp2_state_dict_destroy(sd);
    return fails;
}

static int load_model(run_t *r, const char *dir, int saved_world_size)
{
    fsdp2_state_dict_t *sd = NULL;
    int fails = OK(r->c, fsdp2_state_dict_create(r->root, NULL, &sd));
    fsdp2_checkpoint_report_t rep;
    memset(&rep, 0, sizeof(rep));
    rep.size = sizeof(rep);
    if (!fails)
        fails += OK(r->c, fsdp2_checkpoint_load(sd, dir, NULL, &rep));
    if (!fails)
        fails += RANK_CHECK(r->c, rep.loaded == 2 * LAYERS && rep.missing == 0 &&
                                      rep.unexpected == 0 && rep.mismatched == 0 &&
                                      rep.saved_world_size == saved_world_size &&
                                      rep.step == SAVED_STEPS,
                            "load: %zu loaded, %zu missing, %zu unexpected, %zu mismatched, saved "
                            "by %d ranks at step %lld; want %d, 0, 0, 0, %d ranks, step %d",
                            rep.loaded, rep.missing, rep.unexpected, rep.mismatched,
                            rep.saved_world_size, (long long)rep.step, 2 * LAYERS,
                            saved_world_size, SAVED_STEPS);
    fsdp2_state_dict_destroy(sd);
    return fails;
}

/* b's whole tensors equal a's bitwise (want_equal) or differ somewhere in each tensor
 * (before a load: the load has something to do). */
static int compare_models(run_t *b, run_t *a, int want_equal)
{
    int fails = 0;
    for (int l = 0; l < LAYERS && !fails; l++) {
        for (int kind = 0; kind < 2 && !fails; kind++) {
            fsdp2_tensor_t *fb = NULL, *fa = NULL;
            fails += full_of(b, l, kind, 0, &fb);
            fails += full_of(a, l, kind, 0, &fa);
            char what[64];
            snprintf(what, sizeof(what), "%s.%s", LAYER_NAME[l], kind_name(kind));
            if (!fails && want_equal)
                fails += compare_bits(b, what, "saved", fb->data, fa->data, fb->numel);
            else if (!fails)
                fails += RANK_CHECK(b->c, memcmp(fb->data, fa->data, fb->nbytes) != 0,
                                    "%s: the fresh model already holds the trained values", what);
            fsdp2_tensor_release(fb);
            fsdp2_tensor_release(fa);
        }
    }
    return fails;
}

/* The reference after `steps` full-batch steps. */
static void ref_train(ref_model_t *ref, int steps)
{
    work_t *w = malloc(sizeof(*w));
    int all[SAMPLES], n;
    global_samples(1, 0, 1, all, &n);
    ref_init(ref);
    for (int s = 0; s < steps; s++) {
        ref_accumulate(ref, w, all, n);
        ref_sgd(ref);
    }
    free(w);
}

/* 4 ranks: train on a 1D mesh and save; load into the same tree on 2x2, compare bitwise
 * with the trained model, then train one more step on 2x2 against the reference. */
static int body_save_1d_load_2x2(rank_ctx_t *c)
{
    const hsdp_job_t *job = c->arg;
    run_t *a = calloc(1, sizeof(*a)), *b = calloc(1, sizeof(*b));
    build_options_t bo = BUILD_DEFAULT;
    ref_model_t ref;
    ref_init(&ref);
    int fails = run_open(c, a);
    if (!fails)
        fails += build_model(a, &bo);
    if (!fails)
        fails += run_train(a, &ref, 0, SAVED_STEPS, 0);
    if (!fails)
        fails += save_model(a, job->dir);
    if (!fails)
        fails += hsdp_open(c, b, (mesh_shape_t){2, 2});
    if (!fails)
        fails += build_model(b, &bo);
    if (!fails)
        fails += compare_models(b, a, 0);
    if (!fails)
        fails += load_model(b, job->dir, 4);
    if (!fails)
        fails += compare_models(b, a, 1);
    if (!fails)
        fails += run_train(b, &ref, SAVED_STEPS, 1, 1);
    fails += run_close(b);
    fails += run_close(a);
    free(a);
    free(b);
    return fails;
}

/* 4 ranks on 2x2: train, save, and (rank 0) write the whole tensors to job->expected. */
static int body_save_2x2(rank_ctx_t *c)
{
    const hsdp_job_t *job = c->arg;
    run_t *r = malloc(sizeof(*r));
    build_options_t bo = BUILD_DEFAULT;
    ref_model_t ref;
    ref_init(&ref);
    int fails = hsdp_open(c, r, (mesh_shape_t){2, 2});
    if (!fails)
        fails += build_model(r, &bo);
    if (!fails)
        fails += run_train(r, &ref, 0, SAVED_STEPS, 0);
    if (!fails)
        fails += save_model(r, job->dir);
    FILE *f = !fails && c->rank == 0 ? fopen(job->expected, "wb") : NULL;
    fails += RANK_CHECK(c, fails || c->rank != 0 || f, "fopen %s: %s", job->expected,
                        strerror(errno));
    for (int l = 0; l < LAYERS && !fails; l++) {
        for (int kind = 0; kind < 2 && !fails; kind++) {
            fsdp2_tensor_t *full = NULL;
            fails += full_of(r, l, kind, 0, &full);
            if (!fails && f)
                fails += RANK_CHECK(c, fwrite(full->data, 1, full->nbytes, f) == full->nbytes,
                                    "short write to %s", job->expected);
            fsdp2_tensor_release(full);
        }
    }
    if (f)
        fails += RANK_CHECK(c, fclose(f) == 0, "fclose %s", job->expected);
    fails += run_close(r);
    free(r);
    return fails;
}

/* 3 ranks on a 1D mesh: load the 2x2 checkpoint, compare bitwise with what the saving
 * run wrote, then train one more step against the reference. */
static int body_load_1d3(rank_ctx_t *c)
{
    const hsdp_job_t *job = c->arg;
    run_t *r = malloc(sizeof(*r));
    build_options_t bo = BUILD_DEFAULT;
    int fails = run_open(c, r);
    if (!fails)
        fails += build_model(r, &bo);
    if (!fails)
        fails += load_model(r, job->dir, 4);
    FILE *f = fails ? NULL : fopen(job->expected, "rb");
    fails += RANK_CHECK(c, fails || f, "fopen %s: %s", job->expected, strerror(errno));
    for (int l = 0; l < LAYERS && !fails; l++) {
        for (int kind = 0; kind < 2 && !fails; kind++) {
            float want[MAX_OUT * MAX_IN];
            size_t n = (size_t)numel_of(l, kind);
            fails += RANK_CHECK(c, fread(want, sizeof(float), n, f) == n, "short read of %s",
                                job->expected);
            fsdp2_tensor_t *full = NULL;
            fails += full_of(r, l, kind, 0, &full);
            char what[64];
            snprintf(what, sizeof(what), "loaded %s.%s", LAYER_NAME[l], kind_name(kind));
            if (!fails)
                fails += compare_bits(r, what, "saved", full->data, want, (int64_t)n);
            fsdp2_tensor_release(full);
        }
    }
    if (f)
        fclose(f);
    ref_model_t ref;
    ref_train(&ref, SAVED_STEPS);
    if (!fails)
        fails += run_train(r, &ref, SAVED_STEPS, 1, 1);
    fails += run_close(r);
    free(r);
    return fails;
}

/* ---------------------------------------------------------------------------------- */
/* The parent: jobs, and what a save left on disk                                      */

static void job_init(hsdp_job_t *job, mesh_shape_t m)
{
    memset(job, 0, sizeof(*job));
    job->mesh = m;
    const char *tmp = getenv("TMPDIR");
    snprintf(job->root, sizeof(job->root), "%s/fsdp2-hsdp-XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
    ck_assert_msg(mkdtemp(job->root) != NULL, "mkdtemp %s: %s", job->root, strerror(errno));
    snprintf(job->dir, sizeof(job->dir), "%s/ckpt", job->root);
    snprintf(job->expected, sizeof(job->expected), "%s/expected.bin", job->root);
}

static void job_done(hsdp_job_t *job)
{
    remove_tree(job->root);
}

static void run_job(int ws, rank_fn body, hsdp_job_t *job, const char *what)
{
    ranks_result_t res;
    int rc = run_ranks(ws, body, job, GROUP_TIMEOUT_MS, DEADLINE_S, &res);
    ck_assert_msg(rc == 0, "%s (%d ranks): %s (rank exit codes %d %d %d %d; see stderr)", what, ws,
                  res.timed_out ? "timed out" : "a rank failed", res.status[0], res.status[1],
                  res.status[2], res.status[3]);
}

/* One case of a loop test: body on mesh m. */
static void run_mesh_job(mesh_shape_t m, rank_fn body, const char *what)
{
    hsdp_job_t job;
    memset(&job, 0, sizeof(job));
    job.mesh = m;
    char text[96];
    snprintf(text, sizeof(text), "%s on %dx%d", what, m.replicas, m.shards);
    run_job(m.replicas * m.shards, body, &job, text);
}

static char *read_text(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "fopen %s: %s", path, strerror(errno));
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = malloc((size_t)n + 1);
    ck_assert_msg(fread(text, 1, (size_t)n, f) == (size_t)n, "short read of %s", path);
    text[n] = '\0';
    fclose(f);
    *len = (size_t)n;
    return text;
}

static int64_t json_at(const cJSON *array, int i)
{
    const cJSON *v = cJSON_GetArrayItem(array, i);
    return cJSON_IsNumber(v) ? (int64_t)v->valuedouble : -1;
}

/* The tensor names a rank file's safetensors header lists (comma-separated into names);
 * returns how many, or -1 when the file does not exist. */
static int rank_file_tensors(const char *path, char *names, size_t len)
{
    names[0] = '\0';
    FILE *f = fopen(path, "rb");
    if (!f)
        return -1;
    unsigned char head[8];
    ck_assert_msg(fread(head, 1, 8, f) == 8, "%s: no safetensors header length", path);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--)
        n = n << 8 | head[i];
    ck_assert_msg(n > 0 && n < (1u << 20), "%s: header length %llu", path, (unsigned long long)n);
    char *json = malloc(n + 1);
    ck_assert_msg(fread(json, 1, n, f) == n, "%s: short header", path);
    json[n] = '\0';
    fclose(f);
    cJSON *h = cJSON_Parse(json);
    ck_assert_msg(h != NULL, "%s: header is not JSON: %.200s", path, json);
    int count = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, h)
    {
        if (strcmp(e->string, "__metadata__") == 0)
            continue;
        count++;
        size_t used = strlen(names);
        snprintf(names + used, len - used, "%s%s", used ? "," : "", e->string);
    }
    cJSON_Delete(h);
    free(json);
    return count;
}

/* What a save on an [R, S] mesh (1D: R = 1, mesh_ndim 1) left in dir: every tensor's
 * chunks tile dim 0 exactly (no gap, no overlap: each row written once), chunk k is
 * torch.chunk's piece k over S in replica 0's rank file k, and the other replicas' rank
 * files hold no tensors. The data itself is checked by fsdp2_checkpoint_verify. */
static void check_saved_once(const char *dir, int mesh_ndim, mesh_shape_t m)
{
    char path[PATH_MAX + 32];
    snprintf(path, sizeof(path), "%s/metadata.json", dir);
    size_t len;
    char *text = read_text(path, &len);
    cJSON *meta = cJSON_ParseWithLength(text, len);
    ck_assert_msg(meta != NULL, "%s is not JSON", path);
    const cJSON *ws = cJSON_GetObjectItemCaseSensitive(meta, "world_size");
    const cJSON *mesh = cJSON_GetObjectItemCaseSensitive(meta, "mesh");
    int want_mesh[2] = {mesh_ndim == 2 ? m.replicas : m.shards, m.shards};
    ck_assert_msg(cJSON_IsNumber(ws) && ws->valueint == m.replicas * m.shards &&
                      cJSON_GetArraySize(mesh) == mesh_ndim &&
                      json_at(mesh, 0) == want_mesh[0] &&
                      (mesh_ndim == 1 || json_at(mesh, 1) == want_mesh[1]),
                  "%s: world_size %d, mesh of %d dims [%lld, %lld]; want %d, %d dims [%d, %d]",
                  path, cJSON_IsNumber(ws) ? ws->valueint : -1, cJSON_GetArraySize(mesh),
                  (long long)json_at(mesh, 0), (long long)json_at(mesh, 1),
                  m.replicas * m.shards, mesh_ndim, want_mesh[0], want_mesh[1]);
    const char *want_placements = mesh_ndim == 2 ? "[Replicate(), Shard(dim=0)]" : "[Shard(dim=0)]";
    const cJSON *tensors = cJSON_GetObjectItemCaseSensitive(meta, "tensors");
    for (int l = 0; l < LAYERS; l++) {
        for (int kind = 0; kind < 2; kind++) {
            char name[64];
            snprintf(name, sizeof(name), "%s.%s", LAYER_NAME[l], kind_name(kind));
            const cJSON *t = cJSON_GetObjectItemCaseSensitive(tensors, name);
            const cJSON *pl = cJSON_GetObjectItemCaseSensitive(t, "placements");
            ck_assert_msg(cJSON_IsString(pl) && strcmp(pl->valuestring, want_placements) == 0,
                          "%s: '%s' placements '%s', want '%s'", path, name,
                          cJSON_IsString(pl) ? pl->valuestring : "(none)", want_placements);
            const cJSON *chunks = cJSON_GetObjectItemCaseSensitive(t, "chunks");
            int64_t rows = DIM[l + 1], covered = 0, nonempty = 0;
            int seen[8] = {0};
            for (int k = 0; k < m.shards; k++) {
                int64_t off, n;
                chunk_rows(rows, m.shards, k, &off, &n);
                nonempty += n > 0;
            }
            const cJSON *ch;
            cJSON_ArrayForEach(ch, chunks)
            {
                const cJSON *file = cJSON_GetObjectItemCaseSensitive(ch, "file");
                int rank = -1;
                ck_assert_msg(cJSON_IsString(file) &&
                                  sscanf(file->valuestring, "rank-%d.safetensors", &rank) == 1,
                              "%s: '%s' chunk without a rank file", path, name);
                int64_t start = json_at(cJSON_GetObjectItemCaseSensitive(ch, "global_offset"), 0);
                int64_t n = json_at(cJSON_GetObjectItemCaseSensitive(ch, "shape"), 0);
                int64_t want_off = -1, want_n = -1;
                if (rank >= 0)
                    chunk_rows(rows, m.shards, rank % m.shards, &want_off, &want_n);
                ck_assert_msg(rank >= 0 && rank < m.shards && !seen[rank] && start == want_off &&
                                  n == want_n && n > 0,
                              "%s: '%s' chunk in %s (replica %d, shard %d): rows [%lld, +%lld)%s; "
                              "want each piece once, from replica 0's files (ranks 0..%d), piece "
                              "%d being rows [%lld, +%lld)",
                              path, name, file->valuestring, rank / m.shards, rank % m.shards,
                              (long long)start, (long long)n,
                              rank >= 0 && rank < m.shards && seen[rank] ? " again" : "",
                              m.shards - 1, rank % m.shards, (long long)want_off,
                              (long long)want_n);
                seen[rank] = 1;
                covered += n;
            }
            ck_assert_msg(covered == rows && cJSON_GetArraySize(chunks) == nonempty,
                          "%s: '%s' has %d chunks covering %lld rows, want %lld chunks tiling "
                          "%lld rows",
                          path, name, cJSON_GetArraySize(chunks), (long long)covered,
                          (long long)nonempty, (long long)rows);
        }
    }
    cJSON_Delete(meta);
    free(text);
    for (int rank = m.shards; rank < m.replicas * m.shards; rank++) {
        char names[512];
        snprintf(path, sizeof(path), "%s/rank-%05d.safetensors", dir, rank);
        int n = rank_file_tensors(path, names, sizeof(names));
        ck_assert_msg(n <= 0, "%s (replica %d) holds %d tensors (%s), want none: replica 0 "
                              "writes every piece",
                      path, rank / m.shards, n, names);
    }
    uint64_t bytes = 0;
    ck_assert_msg(fsdp2_checkpoint_verify(dir, &bytes) == FSDP2_SUCCESS, "verify %s: %s", dir,
                  fsdp2_last_error());
}

/* ---------------------------------------------------------------------------------- */

START_TEST(hsdp_sgd_matches_one_process_sgd_on_every_mesh)
{
    run_mesh_job(MESHES[_i], body_train, "HSDP training");
}
END_TEST

START_TEST(hsdp_params_are_replicate_shard0_in_torch_chunk_rows_and_replicas_stay_equal)
{
    run_mesh_job(MESHES[_i], body_layout, "HSDP layout");
}
END_TEST

START_TEST(hsdp_no_sync_then_sync_micro_batches_equal_the_sum_of_their_gradients)
{
    static const mesh_shape_t meshes[] = {{2, 2}, {2, 1}};
    run_mesh_job(meshes[_i], body_accumulate, "HSDP accumulation");
}
END_TEST

START_TEST(a_1d_4_rank_checkpoint_loads_bitwise_into_a_2x2_hsdp_model)
{
    hsdp_job_t job;
    job_init(&job, (mesh_shape_t){1, 4});
    run_job(4, body_save_1d_load_2x2, &job, "1D save, then 2x2 load");
    check_saved_once(job.dir, 1, job.mesh);
    job_done(&job);
}
END_TEST

START_TEST(a_2x2_hsdp_checkpoint_writes_each_chunk_once_and_loads_bitwise_on_1d_3_ranks)
{
    hsdp_job_t job;
    job_init(&job, (mesh_shape_t){2, 2});
    run_job(4, body_save_2x2, &job, "2x2 training and save");
    check_saved_once(job.dir, 2, job.mesh);
    run_job(3, body_load_1d3, &job, "1D 3-rank load of the 2x2 save");
    job_done(&job);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("fsdp_hsdp");
    TCase *tc = tcase_create("numerics");
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, hsdp_sgd_matches_one_process_sgd_on_every_mesh, 0, NUM_MESHES);
    tcase_add_loop_test(tc, hsdp_params_are_replicate_shard0_in_torch_chunk_rows_and_replicas_stay_equal,
                        0, NUM_MESHES);
    tcase_add_loop_test(tc, hsdp_no_sync_then_sync_micro_batches_equal_the_sum_of_their_gradients,
                        0, 2);
    suite_add_tcase(s, tc);

    tc = tcase_create("checkpoint");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, a_1d_4_rank_checkpoint_loads_bitwise_into_a_2x2_hsdp_model);
    tcase_add_test(tc, a_2x2_hsdp_checkpoint_writes_each_chunk_once_and_loads_bitwise_on_1d_3_ranks);
    suite_add_tcase(s, tc);
    return s;
}

FSDP2_CHECK_MAIN(suite)
