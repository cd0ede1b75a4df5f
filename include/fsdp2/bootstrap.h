/* Who am I: rank, world size and local placement of this process, from the launcher's
 * environment.
 *
 * Sources, tried in this order (the first whose rank variable is set wins, and all of
 * its variables must then be consistent):
 *   torchrun / fsdp2run: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK
 *                        (node rank), MASTER_ADDR, MASTER_PORT
 *   Open MPI:            OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE (no node
 *                        index: OMPI_COMM_WORLD_NODE_RANK is a rank within the node)
 *   Slurm:               SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID, and the
 *                        local size from the entry for SLURM_NODEID in
 *                        SLURM_STEP_TASKS_PER_NODE (the job step), else in
 *                        SLURM_TASKS_PER_NODE ("2(x3),1" = 2,2,2,1), else from
 *                        SLURM_NTASKS_PER_NODE (only a maximum: the last resort)
 *   PMI:                 PMI_RANK, PMI_SIZE (local values from PMI_LOCAL_RANK/SIZE, as
 *                        Cray PALS sets them, or MPI_LOCALRANKID/MPI_LOCALNRANKS, as
 *                        MPICH and Intel MPI's Hydra do; both set must agree)
 * With none of them set, the process is rank 0 of a world of 1. A launcher that sets
 * neither local variable (a hand-written RANK/WORLD_SIZE launch) puts every rank on this
 * host (local = global); setting only one of the two is an error. Numbers are plain
 * decimal digits: no sign, no spaces, nothing after them.
 * MASTER_ADDR / MASTER_PORT (where rank 0 serves the rendezvous store) are read for
 * every source; world size 1 needs none, larger worlds without them are an error naming
 * the missing variable, whatever the source. */
#ifndef FSDP2_BOOTSTRAP_H
#define FSDP2_BOOTSTRAP_H

#include <fsdp2/export.h>
#include <fsdp2/status.h>

FSDP2_EXTERN_C_BEGIN

#define FSDP2_HOST_MAX 256

typedef enum fsdp2_launcher {
    FSDP2_LAUNCHER_NONE = 0, /* no variables: a single process */
    FSDP2_LAUNCHER_TORCHRUN = 1,
    FSDP2_LAUNCHER_OPENMPI = 2,
    FSDP2_LAUNCHER_SLURM = 3,
    FSDP2_LAUNCHER_PMI = 4,
} fsdp2_launcher_t;

/* Where this process sits in the job, as its launcher told it (output).
 * This struct has no size field: its layout is fixed for the ABI (version 0 of
 * libfsdp2.so); more fields would come as a new struct and function, never by growing it. */
typedef struct fsdp2_process_info {
    fsdp2_launcher_t launcher;
    int rank, world_size;
    int local_rank, local_world_size;
    int node_rank; /* -1 when the launcher does not say */
    char master_addr[FSDP2_HOST_MAX]; /* "" when unset */
    int master_port;                  /* 0 when unset */
} fsdp2_process_info_t;

/* Reads the environment. Inconsistent values (rank >= world size, a non-number, local
 * rank >= local world size, a port outside 1..65535) are FSDP2_ERR_INVALID_CONFIG
 * naming the variable and its value. Does not block, touches no network. */
FSDP2_API fsdp2_status_t fsdp2_process_info_from_env(fsdp2_process_info_t *info);

/* "torchrun", "openmpi", ... for messages. Never NULL. */
FSDP2_API const char *fsdp2_launcher_name(fsdp2_launcher_t launcher);

FSDP2_EXTERN_C_END

#endif
