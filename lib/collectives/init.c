/* fsdp2_init: environment -> store -> world group. Here rather than in lib/mesh because
 * it creates a group. */
#include <stdlib.h>

#include "collectives/mesh_default.h"
#include "collectives/trace_session.h"
#include "core/error.h"
#include <fsdp2/init.h>
#include <fsdp2/log.h>

struct fsdp2_context {
    fsdp2_process_info_t info;
    fsdp2_store_t *store;
    fsdp2_group_t *world;
    fsdp2_mesh_t *mesh; /* 1D over world */
};

fsdp2_status_t fsdp2_init(const fsdp2_init_options_t *options, fsdp2_context_t **out)
{
    FSDP2_ARG_CHECK(out, "ctx is NULL");
    *out = NULL;
    fsdp2_init_options_t opts = FSDP2_INIT_OPTIONS_INIT;
    if (options) {
        FSDP2_ARG_CHECK(options->size >= sizeof(opts), "init options: size %u, expected %zu",
                        options->size, sizeof(opts));
        opts = *options;
    }
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
    fsdp2_group_options_t go = FSDP2_GROUP_OPTIONS_INIT;
    go.backend = opts.backend;
    go.timeout_ms = opts.timeout_ms;
    FSDP2_CHECK_GOTO(fsdp2_group_create(c->store, "world", c->info.rank, c->info.world_size, &go,
                                        &c->world),
                     status, cleanup);
    FSDP2_CHECK_GOTO(fsdp2_mesh_wrap_group(c->world, c->store, &go, &c->mesh), status, cleanup);
    fsdp2_default_mesh_set(c->mesh);
    FSDP2_CHECK_GOTO(fsdp2_trace_session_from_env(c), status, cleanup);
    *out = c;
    return FSDP2_SUCCESS;
cleanup:
    fsdp2_finalize(c);
    return status;
}

fsdp2_status_t fsdp2_finalize(fsdp2_context_t *c)
{
    if (!c)
        return FSDP2_SUCCESS;
    /* A trace started on this context is written while the store can still meet. */
    fsdp2_status_t traced = fsdp2_trace_session_end(c);
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
