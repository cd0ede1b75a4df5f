/* fsdp2_mesh: a mesh layout (lib/mesh/mesh_layout.c) plus one process group per dim. It
 * lives in the collectives layer because it creates groups; the layout math below it
 * needs no communication. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collectives/group_internal.h"
#include "collectives/mesh_default.h"
#include "collectives/mesh_fail.h"
#include "collectives/setup.h"
#include "core/env_internal.h"
#include "core/error.h"
#include "mesh/mesh_layout.h"

#define MESH_MAX_BLOCK_GROUPS 8

#define MESH_NAME_CHARS 60 /* longest mesh name (block group names add up to 73 more) */

struct fsdp2_mesh {
    mesh_layout_t layout;
    int rank;
    int coords[FSDP2_MESH_MAX_DIMS];
    fsdp2_group_t *groups[FSDP2_MESH_MAX_DIMS];
    int borrowed; /* groups belong to someone else */
    /* What creates further groups later (blocks of the last dim): the store the mesh was
     * made with, its name and the groups' options. */
    fsdp2_store_t *store;
    char name[64];
    fsdp2_group_options_t options;
    struct {
        int n;
        fsdp2_group_t *group; /* owned, even when the dims' groups are borrowed */
    } blocks[MESH_MAX_BLOCK_GROUPS];
    int num_blocks;
};

static void keep_creator(fsdp2_mesh_t *m, fsdp2_store_t *store, const char *name,
                         const fsdp2_group_options_t *options)
{
    fsdp2_group_options_t defaults = FSDP2_GROUP_OPTIONS_INIT;
    m->store = store;
    snprintf(m->name, sizeof(m->name), "%s", name);
    m->options = options ? *options : defaults;
}

fsdp2_status_t fsdp2_mesh_fail(fsdp2_mesh_t *mesh, fsdp2_status_t status)
{
    if (status == FSDP2_SUCCESS || !mesh)
        return status;
    char reason[512];
    snprintf(reason, sizeof(reason), "%s", fsdp2_last_error());
    for (int d = 0; d < mesh->layout.ndim; d++)
        if (mesh->groups[d])
            fsdp2_group_break(mesh->groups[d], status, reason);
    for (int b = 0; b < mesh->num_blocks; b++)
        if (mesh->blocks[b].group)
            fsdp2_group_break(mesh->blocks[b].group, status, reason);
    return status;
}

static _Atomic(fsdp2_mesh_t *) default_mesh;

fsdp2_mesh_t *fsdp2_default_mesh(void)
{
    return default_mesh;
}

void fsdp2_default_mesh_set(fsdp2_mesh_t *mesh)
{
    default_mesh = mesh;
}

fsdp2_status_t fsdp2_mesh_wrap_group(fsdp2_group_t *g, fsdp2_store_t *store,
                                     const fsdp2_group_options_t *options, fsdp2_mesh_t **out)
{
    FSDP2_ARG_CHECK(g && store && out, "mesh_wrap_group: group, store or out is NULL");
    fsdp2_mesh_t *m = calloc(1, sizeof(*m));
    if (!m)
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "world mesh");
    const char *names[1] = {"world"};
    fsdp2_status_t status = mesh_layout_init(&m->layout, g->size, 1, &g->size, names);
    if (status != FSDP2_SUCCESS) {
        free(m);
        return status;
    }
    m->rank = g->rank;
    m->coords[0] = g->rank;
    m->groups[0] = g;
    m->borrowed = 1;
    keep_creator(m, store, "world", options);
    *out = m;
    return FSDP2_SUCCESS;
}

/* A dim's group failed to form: its messages name members by their rank in the group,
 * so add which world ranks those are. */
static fsdp2_status_t name_world_ranks(const fsdp2_mesh_t *m, int d, fsdp2_status_t status)
{
    char message[512], ranks[160];
    snprintf(message, sizeof(message), "%s", fsdp2_last_error());
    int n = m->layout.shape[d], *members = malloc((size_t)n * sizeof(int));
    if (!members) /* the group's own message still says what failed */
        return fsdp2_error(status, "%s", message);
    mesh_layout_group_ranks(&m->layout, m->rank, d, members);
    size_t used = 0;
    for (int k = 0; k < n && used < sizeof(ranks); k++) {
        int w = snprintf(ranks + used, sizeof(ranks) - used, "%s%d", k ? "," : "", members[k]);
        used += w > 0 ? (size_t)w : 0;
    }
    free(members);
    return fsdp2_error(status, "%s (members 0..%d of dim '%s' are world ranks %s%s)", message,
                       n - 1, m->layout.names[d], ranks, used >= sizeof(ranks) ? "..." : "");
}

/* The group of dim d: the ranks that share every other coordinate, named by the mesh,
 * the dim and those coordinates, the same string on every member. Returns snprintf's
 * length (FSDP2_GROUP_NAME_MAX or more: it did not fit). */
static int dim_group_name(const fsdp2_mesh_t *m, int d, char name[FSDP2_GROUP_NAME_MAX])
{
    int other = m->layout.ndim == 2 ? m->coords[1 - d] : 0;
    return snprintf(name, FSDP2_GROUP_NAME_MAX, "%s/%s/%d", m->name, m->layout.names[d], other);
}

/* Tells the members of dim d's group, which this rank did not finish or will not create,
 * that its part failed with status and this thread's last error, which stays its error. */
static void tell_dim_group(const fsdp2_mesh_t *m, fsdp2_store_t *store, int d,
                           fsdp2_status_t status)
{
    char name[FSDP2_GROUP_NAME_MAX];
    if ((size_t)dim_group_name(m, d, name) >= sizeof(name))
        return;
    fsdp2_setup_t s = {.kind = "group", .name = name, .rank = m->coords[d],
                       .size = m->layout.shape[d]};
    char own[FSDP2_ERROR_MESSAGE_MAX];
    snprintf(own, sizeof(own), "%s", fsdp2_last_error());
    (void)fsdp2_setup_failed(&s, store, status);
    (void)fsdp2_error(status, "%s", own);
}

fsdp2_status_t fsdp2_mesh_create(fsdp2_store_t *store, const char *name, int rank, int world_size,
                                 int ndim, const int *shape, const char *const *names,
                                 const fsdp2_group_options_t *options, fsdp2_mesh_t **out)
{
    FSDP2_ARG_CHECK(out, "mesh is NULL");
    *out = NULL;
    FSDP2_ARG_CHECK(store && name && name[0], "mesh: store or name is NULL or empty");
    /* the whole name goes into every group name: cut short, two meshes could share keys */
    FSDP2_ARG_CHECK(strlen(name) <= MESH_NAME_CHARS, "mesh name '%.60s...' is %zu characters "
                    "long, more than %d", name, strlen(name), MESH_NAME_CHARS);
    FSDP2_ARG_CHECK(world_size >= 1 && rank >= 0 && rank < world_size,
                    "mesh '%s': rank %d is not in 0..%d", name, rank, world_size - 1);
    fsdp2_mesh_t *m = calloc(1, sizeof(*m));
    if (!m)
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "mesh '%s'", name);
    fsdp2_status_t status = mesh_layout_init(&m->layout, world_size, ndim, shape, names);
    if (status != FSDP2_SUCCESS) {
        free(m);
        return status;
    }
    m->rank = rank;
    keep_creator(m, store, name, options);
    mesh_layout_coords(&m->layout, rank, m->coords);
    /* The mesh exists on every rank or on none: a rank whose part fails reports it to
     * the mesh (its groups do so themselves) and to the groups it will not create; every
     * rank ends with a barrier. */
    fsdp2_setup_t setup = {.kind = "mesh", .name = name, .rank = rank, .size = world_size};
    status = fsdp2_env_init();
    setup.timeout_ms = fsdp2_group_timeout_ms(&m->options);
    int d = 0;
    for (; d < ndim && status == FSDP2_SUCCESS; d++) {
        char group_name[FSDP2_GROUP_NAME_MAX];
        int len = dim_group_name(m, d, group_name);
        status = (size_t)len < sizeof(group_name)
                     ? fsdp2_group_create_in(store, group_name, m->coords[d],
                                             m->layout.shape[d], options, &setup, &m->groups[d])
                     : fsdp2_error(FSDP2_ERR_INVALID_ARGUMENT, "mesh '%s': the group name of dim "
                                   "'%s' is %d characters long", name, m->layout.names[d], len);
        if (status != FSDP2_SUCCESS && (size_t)len < sizeof(group_name))
            status = name_world_ranks(m, d, status);
    }
    /* from the failed dim's group (told twice does no harm: the first report stays); a
     * timeout is each waiting member's own */
    for (int left = d > 0 ? d - 1 : 0;
         status != FSDP2_SUCCESS && status != FSDP2_ERR_TIMEOUT && left < ndim; left++)
        tell_dim_group(m, store, left, status);
    if (status == FSDP2_SUCCESS && world_size > 1)
        status = fsdp2_setup_barrier(&setup, store, "mesh/ready");
    if (status != FSDP2_SUCCESS) {
        status = fsdp2_setup_failed(&setup, store, status); /* not if it learnt it there */
        fsdp2_mesh_destroy(m);
        return status;
    }
    *out = m;
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_mesh_destroy(fsdp2_mesh_t *m)
{
    if (!m)
        return FSDP2_SUCCESS;
    for (int i = 0; i < m->num_blocks; i++)
        fsdp2_group_destroy(m->blocks[i].group);
    for (int d = 0; d < FSDP2_MESH_MAX_DIMS && !m->borrowed; d++)
        fsdp2_group_destroy(m->groups[d]);
    if (fsdp2_default_mesh() == m)
        fsdp2_default_mesh_set(NULL);
    free(m);
    return FSDP2_SUCCESS;
}

static fsdp2_status_t check_dim(const fsdp2_mesh_t *m, int dim)
{
    FSDP2_ARG_CHECK(m, "mesh is NULL");
    FSDP2_ARG_CHECK(dim >= 0 && dim < m->layout.ndim, "mesh dim %d is not in 0..%d", dim,
                    m->layout.ndim - 1);
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_mesh_ndim(const fsdp2_mesh_t *m, int *ndim)
{
    FSDP2_ARG_CHECK(m && ndim, "mesh or ndim is NULL");
    *ndim = m->layout.ndim;
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_mesh_size(const fsdp2_mesh_t *m, int dim, int *size)
{
    FSDP2_CHECK(check_dim(m, dim));
    FSDP2_ARG_CHECK(size, "size is NULL");
    *size = m->layout.shape[dim];
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_mesh_dim(const fsdp2_mesh_t *m, const char *name, int *dim)
{
    FSDP2_ARG_CHECK(m && name && dim, "mesh, name or dim is NULL");
    for (int d = 0; d < m->layout.ndim; d++) {
        if (strcmp(m->layout.names[d], name) == 0) {
            *dim = d;
            return FSDP2_SUCCESS;
        }
    }
    return fsdp2_error(FSDP2_ERR_INVALID_ARGUMENT, "the mesh has no dim named '%s' (it has %s%s%s)",
                       name, m->layout.names[0], m->layout.ndim == 2 ? ", " : "",
                       m->layout.ndim == 2 ? m->layout.names[1] : "");
}

fsdp2_status_t fsdp2_mesh_coordinate(const fsdp2_mesh_t *m, int dim, int *coord)
{
    FSDP2_CHECK(check_dim(m, dim));
    FSDP2_ARG_CHECK(coord, "coord is NULL");
    *coord = m->coords[dim];
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_mesh_rank_at(const fsdp2_mesh_t *m, const int *coords, int *rank)
{
    FSDP2_ARG_CHECK(m && coords && rank, "mesh, coords or rank is NULL");
    for (int d = 0; d < m->layout.ndim; d++)
        FSDP2_ARG_CHECK(coords[d] >= 0 && coords[d] < m->layout.shape[d],
                        "mesh coordinate %d along dim %d is not in 0..%d", coords[d], d,
                        m->layout.shape[d] - 1);
    *rank = mesh_layout_rank(&m->layout, coords);
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_mesh_group(const fsdp2_mesh_t *m, int dim, fsdp2_group_t **group)
{
    FSDP2_CHECK(check_dim(m, dim));
    FSDP2_ARG_CHECK(group, "group is NULL");
    *group = m->groups[dim];
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_mesh_block_group(fsdp2_mesh_t *m, int n, fsdp2_group_t **group)
{
    FSDP2_ARG_CHECK(m && group, "mesh_block_group: mesh or group is NULL");
    *group = NULL;
    int last = m->layout.ndim - 1, size = m->layout.shape[last];
    FSDP2_ARG_CHECK(n >= 1 && n <= size && size % n == 0,
                    "mesh_block_group: %d does not divide the size %d of dim '%s'", n, size,
                    m->layout.names[last]);
    if (n == size) {
        *group = m->groups[last];
        return FSDP2_SUCCESS;
    }
    for (int i = 0; i < m->num_blocks; i++) {
        if (m->blocks[i].n == n) {
            *group = m->blocks[i].group;
            return FSDP2_SUCCESS;
        }
    }
    if (m->num_blocks == MESH_MAX_BLOCK_GROUPS)
        return fsdp2_error(FSDP2_ERR_INVALID_ARGUMENT,
                           "mesh_block_group: the mesh already has %d block groups (of sizes "
                           "other than %d); that is the most it keeps",
                           MESH_MAX_BLOCK_GROUPS, n);
    /* Named by the mesh, the dim, the other coordinate, n and the block: the same
     * string on the block's members only. */
    char name[FSDP2_GROUP_NAME_MAX];
    int coord = m->coords[last], other = last == 1 ? m->coords[0] : 0;
    int len = snprintf(name, sizeof(name), "%s/%s/%d/block%d-%d", m->name,
                       m->layout.names[last], other, n, coord / n);
    if ((size_t)len >= sizeof(name))
        return fsdp2_error(FSDP2_ERR_INVALID_ARGUMENT, "mesh_block_group: the group name of "
                           "blocks of %d in mesh '%s' is %d characters long", n, m->name, len);
    fsdp2_group_t *g;
    FSDP2_CHECK(fsdp2_group_create(m->store, name, coord % n, n, &m->options, &g));
    m->blocks[m->num_blocks].n = n;
    m->blocks[m->num_blocks].group = g;
    m->num_blocks++;
    *group = g;
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_mesh_average(const fsdp2_mesh_t *m, double *values, size_t count,
                                  fsdp2_stream_t *stream)
{
    FSDP2_ARG_CHECK(m && stream, "mesh_average: mesh or stream is NULL");
    FSDP2_ARG_CHECK(values || count == 0, "mesh_average: values is NULL");
    /* the sum over the whole mesh: over each dim's group in turn */
    int ranks = 1;
    for (int d = m->layout.ndim - 1; d >= 0; d--) {
        ranks *= m->layout.shape[d];
        if (m->layout.shape[d] > 1)
            FSDP2_CHECK(fsdp2_all_reduce_async(m->groups[d], values, count, FSDP2_F64, NULL,
                                               stream));
    }
    FSDP2_CHECK(fsdp2_stream_synchronize(stream));
    for (size_t i = 0; i < count; i++)
        values[i] /= ranks;
    return FSDP2_SUCCESS;
}
