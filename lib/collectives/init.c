/* fsdp2_init: environment -> store -> world group. Here rather than in lib/mesh because
 * it creates a group. */
#include <stdio.h>
#include <stdlib.h>

#include "collectives/group_internal.h"
#include "collectives/mesh_default.h"
#include "collectives/trace_session.h"
#include "core/error.h"
#include "core/options.h"
#include <fsdp2/init.h>
#include <fsdp2/log.h>

#define CONTEXT_HSDP_MESHES 4

struct fsdp2_context {
    fsdp2_process_info_t info;
    fsdp2_store_t *store;
    fsdp2_group_t *world;
    fsdp2_mesh_t *mesh; /* 1D over world */
    fsdp2_group_options_t go;
    fsdp2_mesh_t *hsdp[CONTEXT_HSDP_MESHES]; /* fsdp2_context_hsdp_mesh's, by creation */
    /* HSDP meshes that failed to form: a retry takes a new name, since a failed creation
     * leaves its keys in the store (alike on every rank: a mesh fails on all or none) */
    int hsdp_failures;
};

fsdp2_status_t fsdp2_init(const fsdp2_init_options_t *options, fsdp2_context_t **out)
{
    FSDP2_ARG_CHECK(out, "ctx is NULL");
    *out = NULL;
    fsdp2_init_options_t opts = FSDP2_INIT_OPTIONS_INIT;
    if (options)
        FSDP2_CHECK(fsdp2_options_copy("init options", &opts, sizeof(opts), options, NULL, 0));
    fsdp2_context_t *c = calloc(1, sizeof(*c));
    if (!c)
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "context");
    fsdp2_status_t status = FSDP2_SUCCESS;
    FSDP2_CHECK_GOTO(fsdp2_process_info_from_env(&c->info), status, cleanup);
    fsdp2_log_set_rank(c->info.rank);
    fsdp2_store_options_t so = FSDP2_STORE_OPTIONS_INIT;
    so.host = c->info.master_addr[0] ? c->info.master_addr : "127.0.0.1";
    so.port = c->info.master_port; /* 0 in a world of 1: any free port */
    so.is_server = c->info.rank == 0;
    so.world_size = c->info.world_size;
    so.rank = c->info.rank;
    so.timeout_ms = opts.timeout_ms;
    FSDP2_CHECK_GOTO(fsdp2_store_create(&so, &c->store), status, cleanup);
    c->go = (fsdp2_group_options_t)FSDP2_GROUP_OPTIONS_INIT;
    c->go.backend = opts.backend;
    c->go.timeout_ms = opts.timeout_ms;
    /* One GPU per local rank, as torchrun's users set it (LOCAL_RANK); the nccl backend
     * says so when this host has fewer GPUs. */
    if (opts.backend == FSDP2_BACKEND_NCCL)
        c->go.cuda_device = c->info.local_rank;
    FSDP2_CHECK_GOTO(fsdp2_group_create(c->store, "world", c->info.rank, c->info.world_size,
                                        &c->go, &c->world),
                     status, cleanup);
    FSDP2_CHECK_GOTO(fsdp2_mesh_wrap_group(c->world, c->store, &c->go, &c->mesh), status, cleanup);
    fsdp2_default_mesh_set(c->mesh);
    FSDP2_CHECK_GOTO(fsdp2_trace_session_from_env(c), status, cleanup);
    *out = c;
    return FSDP2_SUCCESS;
cleanup:;
    /* Tearing down what was made sets messages of its own: the cause is kept. */
    char message[1024];
    snprintf(message, sizeof(message), "%s", fsdp2_last_error());
    /* Ranks whose init succeeded are in their first collective on the world, or soon
     * will be: it fails at once, naming this rank and the cause. */
    if (c->world)
        fsdp2_group_break(c->world, status, message);
    fsdp2_finalize(c);
    return fsdp2_error(status, "%s", message);
}

fsdp2_status_t fsdp2_finalize(fsdp2_context_t *c)
{
    if (!c)
        return FSDP2_SUCCESS;
    /* A trace started on this context is written while the store can still meet. */
    fsdp2_status_t traced = fsdp2_trace_session_end(c);
    for (int i = 0; i < CONTEXT_HSDP_MESHES; i++)
        fsdp2_mesh_destroy(c->hsdp[i]);
    fsdp2_mesh_destroy(c->mesh);
    fsdp2_group_destroy(c->world);
    fsdp2_status_t status = fsdp2_store_destroy(c->store);
    free(c);
    return traced != FSDP2_SUCCESS ? traced : status;
}

fsdp2_status_t fsdp2_context_info(const fsdp2_context_t *c, fsdp2_process_info_t *info)
{
    FSDP2_ARG_CHECK(c && info, "ctx or info is NULL");
    *info = c->info;
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_context_store(const fsdp2_context_t *c, fsdp2_store_t **store)
{
    FSDP2_ARG_CHECK(c && store, "ctx or store is NULL");
    *store = c->store;
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_context_world(const fsdp2_context_t *c, fsdp2_group_t **world)
{
    FSDP2_ARG_CHECK(c && world, "ctx or world is NULL");
    *world = c->world;
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_context_mesh(const fsdp2_context_t *c, fsdp2_mesh_t **mesh)
{
    FSDP2_ARG_CHECK(c && mesh, "ctx or mesh is NULL");
    *mesh = c->mesh;
    return FSDP2_SUCCESS;
}

/* Every rank's proposal for the HSDP mesh (its shard size, and whether its node's
 * ranks are consecutive), so that all ranks refuse a bad layout together instead of
 * some waiting for a mesh the others will not create. */
static fsdp2_status_t agree_hsdp(fsdp2_context_t *c, int shard, int consecutive)
{
    int ws = c->info.world_size;
    double mine[2] = {shard, consecutive}, *all = calloc((size_t)ws * 2, sizeof(double));
    if (!all)
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "hsdp mesh");
    fsdp2_device_t cpu = FSDP2_DEVICE_CPU_INIT;
    fsdp2_stream_t *stream;
    fsdp2_status_t status = fsdp2_stream_current(cpu, &stream);
    if (status == FSDP2_SUCCESS)
        status = fsdp2_all_gather_async(c->world, mine, all, 2, FSDP2_F64, stream);
    if (status == FSDP2_SUCCESS)
        status = fsdp2_stream_synchronize(stream);
    for (int r = 0; r < ws && status == FSDP2_SUCCESS; r++) {
        if (!all[2 * r + 1])
            status = fsdp2_error(FSDP2_ERR_INVALID_CONFIG,
                                 "hsdp mesh: rank %d's node ranks are not consecutive (its "
                                 "rank %% local world size is not its local rank); map ranks by "
                                 "node, or pass the shard size",
                                 r);
        else if ((int)all[2 * r] != shard)
            status = fsdp2_error(FSDP2_ERR_INVALID_CONFIG,
                                 "hsdp mesh: rank %d asks for shard size %d, rank %d for %d "
                                 "(nodes with different numbers of ranks need an explicit shard "
                                 "size)",
                                 c->info.rank, shard, r, (int)all[2 * r]);
    }
    free(all);
    return status;
}

fsdp2_status_t fsdp2_context_hsdp_mesh(fsdp2_context_t *c, int shard, fsdp2_mesh_t **mesh)
{
    FSDP2_ARG_CHECK(c && mesh, "hsdp mesh: ctx or mesh is NULL");
    *mesh = NULL;
    const fsdp2_process_info_t *in = &c->info;
    int consecutive = 1;
    if (shard == 0) { /* the node's ranks */
        shard = in->local_world_size;
        consecutive = in->rank % shard == in->local_rank;
    }
    FSDP2_ARG_CHECK(shard >= 1 && in->world_size % shard == 0,
                    "hsdp mesh: shard size %d does not divide the world size %d", shard,
                    in->world_size);
    int i = 0;
    for (; i < CONTEXT_HSDP_MESHES && c->hsdp[i] && consecutive; i++) {
        int size;
        FSDP2_CHECK(fsdp2_mesh_size(c->hsdp[i], 1, &size));
        if (size == shard) {
            *mesh = c->hsdp[i];
            return FSDP2_SUCCESS;
        }
    }
    if (i == CONTEXT_HSDP_MESHES)
        return fsdp2_error(FSDP2_ERR_INVALID_ARGUMENT,
                           "hsdp mesh: shard size %d would be the context's %d-th HSDP mesh; it "
                           "keeps %d",
                           shard, i + 1, CONTEXT_HSDP_MESHES);
    FSDP2_CHECK(agree_hsdp(c, shard, consecutive));
    int shape[2] = {in->world_size / shard, shard};
    char name[32];
    if (c->hsdp_failures == 0)
        snprintf(name, sizeof(name), "hsdp%d", shard);
    else
        snprintf(name, sizeof(name), "hsdp%d-%d", shard, c->hsdp_failures);
    const char *const names[2] = {"replicate", "shard"};
    fsdp2_status_t status = fsdp2_mesh_create(c->store, name, in->rank, in->world_size, 2, shape,
                                              names, &c->go, &c->hsdp[i]);
    if (status != FSDP2_SUCCESS) {
        c->hsdp_failures++;
        return status;
    }
    *mesh = c->hsdp[i];
    return FSDP2_SUCCESS;
}
