/* Who am I: rank, world size and local placement from the launcher's environment.
 *
 * Each launcher is one row of a table naming its variables. The first row whose rank
 * variable is set is the source; every value is then parsed strictly (decimal digits
 * only, no sign, no trailing text) and checked against the others, so that a typo or a
 * half-configured launch is an error naming the variable and its value instead of a
 * hang at the first rendezvous. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <fsdp2/bootstrap.h>

#include "core/env_internal.h"
#include "core/error.h"
#include "core/log_internal.h"

typedef struct launcher_vars {
    fsdp2_launcher_t launcher;
    const char *rank;
    const char *world_size;
    const char *local_rank;
    const char *local_world_size; /* NULL: computed (Slurm) */
    const char *node_rank;        /* NULL: the launcher does not say */
    const char *local_rank_alt;   /* read when local_rank is unset; NULL: none */
    const char *local_world_size_alt;
} launcher_vars_t;

/* Open MPI's OMPI_COMM_WORLD_NODE_RANK is the process's rank among those on its node
 * (it counts spawned processes too), not the node's index, so node_rank stays -1.
 * Two PMI launchers name the local values differently: Cray PALS sets PMI_LOCAL_*,
 * Hydra (MPICH, Intel MPI) sets MPI_LOCALRANKID and MPI_LOCALNRANKS. */
static const launcher_vars_t launchers[] = {
    {FSDP2_LAUNCHER_TORCHRUN, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
     "GROUP_RANK", NULL, NULL},
    {FSDP2_LAUNCHER_OPENMPI, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
     "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", NULL, NULL, NULL},
    {FSDP2_LAUNCHER_SLURM, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", NULL,
     "SLURM_NODEID", NULL, NULL},
    {FSDP2_LAUNCHER_PMI, "PMI_RANK", "PMI_SIZE", "PMI_LOCAL_RANK", "PMI_LOCAL_SIZE", NULL,
     "MPI_LOCALRANKID", "MPI_LOCALNRANKS"},
};

const char *fsdp2_launcher_name(fsdp2_launcher_t launcher)
{
    switch (launcher) {
    case FSDP2_LAUNCHER_NONE:
        return "none";
    case FSDP2_LAUNCHER_TORCHRUN:
        return "torchrun";
    case FSDP2_LAUNCHER_OPENMPI:
        return "openmpi";
    case FSDP2_LAUNCHER_SLURM:
        return "slurm";
    case FSDP2_LAUNCHER_PMI:
        return "pmi";
    }
    return "unknown";
}

/* Parses text as a decimal in [lo, hi] (the library's one integer syntax); the message
 * names var and the text. */
static fsdp2_status_t parse_int_text(const char *var, const char *text, long lo, long hi,
                                     int *out)
{
    int64_t value = 0;
    FSDP2_CHECK(fsdp2_env_parse_int(var, text, lo, hi, &value));
    *out = (int)value;
    return FSDP2_SUCCESS;
}

/* Reads var into *out when set; *present says whether it was. */
static fsdp2_status_t read_int(const char *var, long lo, long hi, int *out, int *present)
{
    const char *text = var ? getenv(var) : NULL;
    *present = text != NULL;
    if (!text)
        return FSDP2_SUCCESS;
    return parse_int_text(var, text, lo, hi, out);
}

/* Reads var, or alt (may be NULL) when var is unset; when both are set they must agree.
 * *used names the variable the value came from (var when neither is set). */
static fsdp2_status_t read_int_or_alt(const char *var, const char *alt, long lo, long hi,
                                      int *out, int *present, const char **used)
{
    int alt_value = 0, has_alt = 0;
    *used = var;
    FSDP2_CHECK(read_int(var, lo, hi, out, present));
    FSDP2_CHECK(read_int(alt, lo, hi, &alt_value, &has_alt));
    if (!has_alt)
        return FSDP2_SUCCESS;
    if (*present && *out != alt_value)
        return fsdp2_error(FSDP2_ERR_INVALID_CONFIG, "%s=%d and %s=%d disagree", var, *out,
                           alt, alt_value);
    *out = alt_value;
    if (!*present)
        *used = alt;
    *present = 1;
    return FSDP2_SUCCESS;
}

static fsdp2_status_t require_int(const char *var, const char *because, long lo, long hi,
                                  int *out)
{
    int present = 0;
    FSDP2_CHECK(read_int(var, lo, hi, out, &present));
    if (!present)
        return fsdp2_error(FSDP2_ERR_INVALID_CONFIG, "%s is not set (%s)", var, because);
    return FSDP2_SUCCESS;
}

/* Slurm's task count on node node_id from var (SLURM_STEP_TASKS_PER_NODE or
 * SLURM_TASKS_PER_NODE), whose compressed form lists counts per node in node order,
 * "2(x3),1" meaning 2,2,2,1. */
static fsdp2_status_t slurm_tasks_on_node(const char *var, const char *text, int node_id,
                                          int *count)
{
    const char *p = text;
    long node = 0;
    int found = 0;
    if (text[0] == '\0')
        return fsdp2_error(FSDP2_ERR_INVALID_CONFIG, "%s is set but empty", var);
    while (*p) {
        char *end;
        if (*p < '0' || *p > '9')
            goto malformed;
        long n = strtol(p, &end, 10);
        long repeat = 1;
        if (n < 1 || n > INT_MAX)
            goto malformed;
        p = end;
        if (*p == '(') {
            if (p[1] != 'x')
                goto malformed;
            if (p[2] < '0' || p[2] > '9')
                goto malformed;
            repeat = strtol(p + 2, &end, 10);
            if (repeat < 1 || repeat > INT_MAX || *end != ')')
                goto malformed;
            p = end + 1;
        }
        if (node <= node_id && node_id < node + repeat)
            found = (int)n;
        node = node + repeat > INT_MAX ? INT_MAX : node + repeat;
        if (*p == ',' && p[1])
            p++;
        else if (*p) /* anything else, or a comma that ends the list */
            goto malformed;
    }
    if (found > 0) { /* the whole list parsed, not only up to this node's entry */
        *count = found;
        return FSDP2_SUCCESS;
    }
    return fsdp2_error(FSDP2_ERR_INVALID_CONFIG,
                       "%s='%s' lists %ld nodes but SLURM_NODEID=%d", var, text, node, node_id);
malformed:
    return fsdp2_error(FSDP2_ERR_INVALID_CONFIG,
                       "%s='%s' is not a list like '2(x3),1' (at '%s')", var, text, p);
}

/* Slurm's tasks on this node; *var names the variable it came from.
 *
 * The per-node lists are exact: SLURM_STEP_TASKS_PER_NODE for this job step (an srun
 * inside an allocation may use fewer tasks than the allocation has), then
 * SLURM_TASKS_PER_NODE for the allocation. SLURM_NTASKS_PER_NODE is only the requested
 * maximum from --ntasks-per-node: under `srun -n3 --ntasks-per-node=2` node 1 runs one
 * task, not two. So it is read only when neither list is set, and ignored otherwise. */
static fsdp2_status_t read_slurm_local_size(int node_rank, int world_size, int *local_size,
                                            const char **var)
{
    static const char *const lists[] = {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"};
    for (size_t i = 0; i < sizeof(lists) / sizeof(lists[0]); i++) {
        const char *text = getenv(lists[i]);
        if (!text)
            continue;
        *var = lists[i];
        if (node_rank < 0)
            return fsdp2_error(FSDP2_ERR_INVALID_CONFIG,
                               "SLURM_NODEID is not set (needed to read %s='%s')", lists[i],
                               text);
        return slurm_tasks_on_node(lists[i], text, node_rank, local_size);
    }
    int present = 0;
    *var = "SLURM_NTASKS_PER_NODE";
    FSDP2_CHECK(read_int(*var, 1, world_size, local_size, &present));
    if (!present)
        return fsdp2_error(FSDP2_ERR_INVALID_CONFIG,
                           "SLURM_PROCID is set but none of SLURM_STEP_TASKS_PER_NODE, "
                           "SLURM_TASKS_PER_NODE or SLURM_NTASKS_PER_NODE is");
    return FSDP2_SUCCESS;
}

/* Local rank and size. When a launcher sets neither (a hand-written RANK/WORLD_SIZE
 * launch, PMI without local variables), every rank is taken to be on this host; one
 * without the other is an error. */
static fsdp2_status_t read_local(const launcher_vars_t *l, fsdp2_process_info_t *info)
{
    const char *rank_var = l->local_rank, *size_var = l->local_world_size;
    int has_rank = 0, has_size = 0;
    FSDP2_CHECK(read_int_or_alt(l->local_rank, l->local_rank_alt, 0, INT_MAX,
                                &info->local_rank, &has_rank, &rank_var));
    if (l->local_world_size) {
        FSDP2_CHECK(read_int_or_alt(l->local_world_size, l->local_world_size_alt, 1,
                                    info->world_size, &info->local_world_size, &has_size,
                                    &size_var));
    } else {
        FSDP2_CHECK(read_slurm_local_size(info->node_rank, info->world_size,
                                          &info->local_world_size, &size_var));
        has_size = 1;
    }
    if (has_rank != has_size) {
        const char *missing_alt = has_rank ? l->local_world_size_alt : l->local_rank_alt;
        return fsdp2_error(FSDP2_ERR_INVALID_CONFIG, "%s is not set%s%s%s but %s is",
                           has_rank ? size_var : rank_var, missing_alt ? " (nor " : "",
                           missing_alt ? missing_alt : "", missing_alt ? ")" : "",
                           has_rank ? rank_var : size_var);
    }
    if (!has_rank) {
        info->local_rank = info->rank;
        info->local_world_size = info->world_size;
        FSDP2_LOG(INFO, INIT, "%s and %s are not set: assuming all %d ranks on this host",
                  l->local_rank, l->local_world_size, info->world_size);
        return FSDP2_SUCCESS;
    }
    if (info->local_world_size > info->world_size)
        return fsdp2_error(FSDP2_ERR_INVALID_CONFIG,
                           "%s gives %d ranks on this node, more than the world size %d",
                           size_var, info->local_world_size, info->world_size);
    if (info->local_rank >= info->local_world_size)
        return fsdp2_error(FSDP2_ERR_INVALID_CONFIG, "%s=%d is not below %s=%d", rank_var,
                           info->local_rank, size_var, info->local_world_size);
    return FSDP2_SUCCESS;
}

static fsdp2_status_t read_master(fsdp2_process_info_t *info)
{
    const char *addr = getenv("MASTER_ADDR");
    if (addr) {
        size_t len = strlen(addr);
        if (len == 0)
            return fsdp2_error(FSDP2_ERR_INVALID_CONFIG, "MASTER_ADDR is set but empty");
        if (len >= FSDP2_HOST_MAX)
            return fsdp2_error(FSDP2_ERR_INVALID_CONFIG,
                               "MASTER_ADDR='%.64s...' is %zu bytes long (at most %d)", addr,
                               len, FSDP2_HOST_MAX - 1);
        memcpy(info->master_addr, addr, len + 1);
    }
    int has_port = 0;
    FSDP2_CHECK(read_int("MASTER_PORT", 1, 65535, &info->master_port, &has_port));
    if (info->world_size > 1 && (!addr || !has_port))
        return fsdp2_error(FSDP2_ERR_INVALID_CONFIG,
                           "%s is not set; a world of %d ranks (from %s) needs MASTER_ADDR and "
                           "MASTER_PORT for the rendezvous",
                           addr ? "MASTER_PORT" : "MASTER_ADDR", info->world_size,
                           fsdp2_launcher_name(info->launcher));
    return FSDP2_SUCCESS;
}

static fsdp2_status_t read_launcher(const launcher_vars_t *l, fsdp2_process_info_t *info)
{
    info->launcher = l->launcher;
    char because[96];
    snprintf(because, sizeof(because), "%s is set", l->rank);
    FSDP2_CHECK(require_int(l->world_size, because, 1, INT_MAX, &info->world_size));
    FSDP2_CHECK(require_int(l->rank, because, 0, INT_MAX, &info->rank));
    if (info->rank >= info->world_size)
        return fsdp2_error(FSDP2_ERR_INVALID_CONFIG, "%s=%d is not below %s=%d", l->rank,
                           info->rank, l->world_size, info->world_size);
    int has_node = 0;
    FSDP2_CHECK(read_int(l->node_rank, 0, INT_MAX, &info->node_rank, &has_node));
    if (!has_node)
        info->node_rank = -1;
    FSDP2_CHECK(read_local(l, info));
    return read_master(info);
}

fsdp2_status_t fsdp2_process_info_from_env(fsdp2_process_info_t *info)
{
    FSDP2_ARG_CHECK(info != NULL, "info is NULL");
    fsdp2_process_info_t found = {FSDP2_LAUNCHER_NONE, 0, 1, 0, 1, -1, "", 0};
    const launcher_vars_t *source = NULL;
    for (size_t i = 0; i < sizeof(launchers) / sizeof(launchers[0]) && !source; i++)
        if (getenv(launchers[i].rank))
            source = &launchers[i];
    if (source)
        FSDP2_CHECK(read_launcher(source, &found));
    else
        FSDP2_CHECK(read_master(&found));
    *info = found;
    FSDP2_LOG(INFO, INIT, "%s: rank %d of %d, local rank %d of %d, node %d, master %s:%d",
              fsdp2_launcher_name(found.launcher), found.rank, found.world_size,
              found.local_rank, found.local_world_size, found.node_rank,
              found.master_addr[0] ? found.master_addr : "(unset)", found.master_port);
    return FSDP2_SUCCESS;
}
