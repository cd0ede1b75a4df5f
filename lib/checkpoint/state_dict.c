/* State dicts: the tree's parameters, buffers and optimizer state as named tensors. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint/checkpoint_internal.h"
#include "core/error.h"
#include "core/fault.h"
#include "dtensor/dtensor_internal.h"
#include "fsdp/fsdp_internal.h"

static fsdp2_status_t add(fsdp2_state_dict_t *sd, const char *name, fsdp2_dtensor_t *dt,
                          fsdp2_tensor_t *t, int optimizer)
{
    sd_entry_t *bigger = realloc(sd->entries, (sd->count + 1) * sizeof(*bigger));
    if (!bigger)
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "state dict");
    sd->entries = bigger;
    char *copy = strdup(name);
    if (!copy)
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "state dict");
    sd->entries[sd->count++] = (sd_entry_t){.name = copy, .dtensor = dt, .tensor = t,
                                            .optimizer = optimizer};
    fsdp2_mesh_t *mesh = NULL;
    if (dt)
        fsdp2_dtensor_mesh(dt, &mesh);
    if (mesh && !sd->mesh)
        sd->mesh = mesh;
    else if (mesh && mesh != sd->mesh)
        return fsdp2_error(FSDP2_ERR_INVALID_ARGUMENT,
                           "state_dict: '%s' lives on another mesh than '%s'; one state dict "
                           "saves over one mesh",
                           name, sd->entries[0].name);
    return FSDP2_SUCCESS;
}

static fsdp2_status_t add_buffers(fsdp2_state_dict_t *sd, const fsdp2_module_t *m)
{
    for (size_t i = 0; i < m->num_buffers; i++) {
        char fqn[FSDP2_FQN_MAX];
        fsdp_module_fqn(m, fqn, sizeof(fqn));
        size_t used = strlen(fqn);
        snprintf(fqn + used, sizeof(fqn) - used, "%s%s", used ? "." : "", m->buffers[i].name);
        FSDP2_CHECK(add(sd, fqn, NULL, m->buffers[i].tensor, 0));
    }
    for (size_t i = 0; i < m->num_children; i++)
        FSDP2_CHECK(add_buffers(sd, m->children[i]));
    return FSDP2_SUCCESS;
}

static fsdp2_status_t add_params(fsdp2_state_dict_t *sd, fsdp2_module_t *root)
{
    size_t n;
    FSDP2_CHECK(fsdp2_module_params(root, NULL, 0, &n));
    fsdp2_param_t **params = fsdp2_calloc(n ? n : 1, sizeof(*params));
    if (!params)
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "state dict");
    fsdp2_status_t status = fsdp2_module_params(root, params, n, &n);
    const char *names[8];
    size_t nstates = 0;
    if (status == FSDP2_SUCCESS && sd->opt)
        status = fsdp2_optimizer_state_names(sd->opt, names, 8, &nstates);
    for (size_t i = 0; i < n && status == FSDP2_SUCCESS; i++) {
        fsdp2_param_info_t info;
        status = fsdp2_param_info(params[i], &info);
        if (status != FSDP2_SUCCESS)
            break;
        if (info.sharded) {
            fsdp2_dtensor_t *dt;
            status = fsdp2_param_sharded(params[i], &dt);
            if (status == FSDP2_SUCCESS)
                status = add(sd, info.fqn, dt, NULL, 0);
            if (status == FSDP2_SUCCESS)
                sd->entries[sd->count - 1].param = params[i];
        } else {
            fsdp2_tensor_t *t;
            status = fsdp2_param_unsharded(params[i], &t);
            if (status == FSDP2_SUCCESS)
                status = add(sd, info.fqn, NULL, t, 0);
        }
        for (size_t k = 0; k < nstates && k < 8 && status == FSDP2_SUCCESS; k++) {
            fsdp2_dtensor_t *state;
            if (fsdp2_optimizer_state(sd->opt, params[i], names[k], &state) != FSDP2_SUCCESS)
                continue; /* frozen or ignored: the optimizer keeps nothing for it */
            char name[FSDP2_FQN_MAX + 64];
            snprintf(name, sizeof(name), "optim.state.%s.%s", info.fqn, names[k]);
            status = add(sd, name, state, NULL, 1);
        }
    }
    free(params);
    return status;
}

int sd_entry_unmaterialized(const sd_entry_t *e)
{
    fsdp2_param_info_t info;
    return e->param && fsdp2_param_info(e->param, &info) == FSDP2_SUCCESS && !info.materialized;
}

void sd_entry_materialized(const sd_entry_t *e)
{
    if (e->param)
        fsdp_param_set_materialized(e->param);
}

static int by_name(const void *a, const void *b)
{
    return strcmp(((const sd_entry_t *)a)->name, ((const sd_entry_t *)b)->name);
}

fsdp2_status_t fsdp2_state_dict_create(fsdp2_module_t *root, fsdp2_optimizer_t *opt,
                                       fsdp2_state_dict_t **out)
{
    FSDP2_ARG_CHECK(root && out, "state_dict: root or out is NULL");
    *out = NULL;
    fsdp2_state_dict_t *sd = fsdp2_calloc(1, sizeof(*sd));
    if (!sd)
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "state dict");
    sd->opt = opt;
    fsdp2_status_t status = add_params(sd, root);
    if (status == FSDP2_SUCCESS)
        status = add_buffers(sd, root);
    if (status != FSDP2_SUCCESS) {
        fsdp2_state_dict_destroy(sd);
        return status;
    }
    qsort(sd->entries, sd->count, sizeof(*sd->entries), by_name);
    for (size_t i = 1; i < sd->count; i++) {
        if (!strcmp(sd->entries[i - 1].name, sd->entries[i].name)) {
            status = fsdp2_error(FSDP2_ERR_INVALID_ARGUMENT, "state_dict: two tensors named '%s'",
                                 sd->entries[i].name);
            fsdp2_state_dict_destroy(sd);
            return status;
        }
    }
    *out = sd;
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_state_dict_destroy(fsdp2_state_dict_t *sd)
{
    if (!sd)
        return FSDP2_SUCCESS;
    for (size_t i = 0; i < sd->count; i++)
        free(sd->entries[i].name);
    free(sd->entries);
    free(sd);
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_state_dict_size(const fsdp2_state_dict_t *sd, size_t *count)
{
    FSDP2_ARG_CHECK(sd && count, "state dict or count is NULL");
    *count = sd->count;
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_state_dict_entry(const fsdp2_state_dict_t *sd, size_t i, const char **name,
                                      fsdp2_dtensor_t **dtensor, fsdp2_tensor_t **tensor)
{
    FSDP2_ARG_CHECK(sd, "state dict is NULL");
    FSDP2_ARG_CHECK(i < sd->count, "state dict has %zu entries, not index %zu", sd->count, i);
    if (name)
        *name = sd->entries[i].name;
    if (dtensor)
        *dtensor = sd->entries[i].dtensor;
    if (tensor)
        *tensor = sd->entries[i].tensor;
    return FSDP2_SUCCESS;
}

fsdp2_status_t ckpt_mesh_rank(fsdp2_mesh_t *mesh, int *rank, int *size)
{
    int ndim, shape[2] = {1, 1}, coords[2] = {0, 0};
    FSDP2_CHECK(fsdp2_mesh_ndim(mesh, &ndim));
    for (int i = 0; i < ndim; i++) {
        FSDP2_CHECK(fsdp2_mesh_size(mesh, i, &shape[i]));
        FSDP2_CHECK(fsdp2_mesh_coordinate(mesh, i, &coords[i]));
    }
    *rank = coords[0] * shape[1] + coords[1];
    *size = shape[0] * shape[1];
    return FSDP2_SUCCESS;
}

fsdp2_status_t sd_block_of(const fsdp2_state_dict_t *sd, const sd_entry_t *e, sd_block_t *b)
{
    memset(b, 0, sizeof(*b));
    if (e->tensor) {
        int rank = 0, size = 1;
        if (sd->mesh)
            FSDP2_CHECK(ckpt_mesh_rank(sd->mesh, &rank, &size));
        b->dtype = e->tensor->dtype;
        b->ndim = e->tensor->ndim;
        memcpy(b->shape, e->tensor->shape, sizeof(b->shape));
        memcpy(b->local, e->tensor->shape, sizeof(b->local));
        b->data = e->tensor;
        b->writer = rank == 0;
        return FSDP2_SUCCESS;
    }
    fsdp2_dtensor_info_t info;
    FSDP2_CHECK(fsdp2_dtensor_info(e->dtensor, &info));
    b->dtype = info.dtype;
    b->ndim = info.ndim;
    memcpy(b->shape, info.shape, sizeof(b->shape));
    memcpy(b->offset, info.offset, sizeof(b->offset));
    memcpy(b->local, info.local_shape, sizeof(b->local));
    b->data = e->dtensor->local; /* borrowed: the DTensor keeps it */
    /* Of the ranks holding the same piece (Replicate dims), coordinate 0 saves it. */
    b->writer = 1;
    for (int i = 0; i < info.mesh_ndim; i++) {
        if (info.placements[i].type == FSDP2_PLACEMENT_PARTIAL)
            return fsdp2_error(FSDP2_ERR_UNSUPPORTED,
                               "checkpoint: '%s' is Partial; reduce it before saving", e->name);
        if (info.placements[i].type == FSDP2_PLACEMENT_REPLICATE) {
            int c;
            FSDP2_CHECK(fsdp2_mesh_coordinate(sd->mesh, i, &c));
            b->writer &= c == 0;
        }
    }
    return FSDP2_SUCCESS;
}
