/* fsdp2_process_info_from_env: each launcher's variables, the order in which launchers
 * are tried, and every inconsistent or malformed value being an error that names the
 * variable and its value.
 *
 * Check forks every test, so each one clears every launcher variable, sets its own with
 * setenv and leaves nothing behind. Expected values are written out literally. */
#include <check.h>

#include "check_main.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <fsdp2/bootstrap.h>
#include <fsdp2/status.h>

static const char *const all_vars[] = {
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
    "MASTER_PORT", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_COMM_WORLD_NODE_RANK",
    "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE",
    "SLURM_TASKS_PER_NODE", "SLURM_STEP_TASKS_PER_NODE", "SLURM_NODEID", "PMI_RANK",
    "PMI_SIZE", "PMI_LOCAL_RANK", "PMI_LOCAL_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS",
};

/* Clears every launcher variable, then sets "NAME=value" pairs (NULL-terminated). */
static void env_only(const char *first, ...)
{
    for (size_t i = 0; i < sizeof(all_vars) / sizeof(all_vars[0]); i++)
        unsetenv(all_vars[i]);
    va_list ap;
    va_start(ap, first);
    for (const char *kv = first; kv; kv = va_arg(ap, const char *)) {
        char name[64];
        const char *eq = strchr(kv, '=');
        ck_assert_ptr_nonnull(eq);
        snprintf(name, sizeof(name), "%.*s", (int)(eq - kv), kv);
        ck_assert_int_eq(setenv(name, eq + 1, 1), 0);
    }
    va_end(ap);
}

static fsdp2_process_info_t read_ok(void)
{
    fsdp2_process_info_t info;
    memset(&info, 0x5a, sizeof(info));
    fsdp2_status_t s = fsdp2_process_info_from_env(&info);
    ck_assert_msg(s == FSDP2_SUCCESS, "from_env failed: %s: %s", fsdp2_status_name(s),
                  fsdp2_last_error());
    return info;
}

static void expect_info(fsdp2_process_info_t got, fsdp2_launcher_t launcher, int rank, int world,
                        int local_rank, int local_world, int node, const char *addr, int port)
{
    ck_assert_str_eq(fsdp2_launcher_name(got.launcher), fsdp2_launcher_name(launcher));
    ck_assert_int_eq(got.rank, rank);
    ck_assert_int_eq(got.world_size, world);
    ck_assert_int_eq(got.local_rank, local_rank);
    ck_assert_int_eq(got.local_world_size, local_world);
    ck_assert_int_eq(got.node_rank, node);
    ck_assert_str_eq(got.master_addr, addr);
    ck_assert_int_eq(got.master_port, port);
}

START_TEST(no_variables_is_rank_0_of_a_world_of_1)
{
    env_only(NULL);
    expect_info(read_ok(), FSDP2_LAUNCHER_NONE, 0, 1, 0, 1, -1, "", 0);
}
END_TEST

START_TEST(torchrun_variables_give_rank_local_rank_node_and_master)
{
    env_only("RANK=5", "WORLD_SIZE=8", "LOCAL_RANK=1", "LOCAL_WORLD_SIZE=4", "GROUP_RANK=1",
             "MASTER_ADDR=node0.example", "MASTER_PORT=29500", NULL);
    expect_info(read_ok(), FSDP2_LAUNCHER_TORCHRUN, 5, 8, 1, 4, 1, "node0.example", 29500);
}
END_TEST

START_TEST(openmpi_variables_give_rank_and_local_rank_without_node)
{
    env_only("OMPI_COMM_WORLD_RANK=3", "OMPI_COMM_WORLD_SIZE=4",
             "OMPI_COMM_WORLD_LOCAL_RANK=1", "OMPI_COMM_WORLD_LOCAL_SIZE=2",
             "OMPI_COMM_WORLD_NODE_RANK=1", "MASTER_ADDR=::1", "MASTER_PORT=1", NULL);
    expect_info(read_ok(), FSDP2_LAUNCHER_OPENMPI, 3, 4, 1, 2, -1, "::1", 1);
}
END_TEST

START_TEST(slurm_variables_with_ntasks_per_node)
{
    env_only("SLURM_PROCID=6", "SLURM_NTASKS=8", "SLURM_LOCALID=2", "SLURM_NTASKS_PER_NODE=4",
             "SLURM_NODEID=1", "MASTER_ADDR=10.0.0.1", "MASTER_PORT=65535", NULL);
    expect_info(read_ok(), FSDP2_LAUNCHER_SLURM, 6, 8, 2, 4, 1, "10.0.0.1", 65535);
}
END_TEST

/* "3(x2),1": nodes 0 and 1 run 3 tasks, node 2 runs 1. */
START_TEST(slurm_compressed_tasks_per_node_is_indexed_by_node_id)
{
    env_only("SLURM_PROCID=4", "SLURM_NTASKS=7", "SLURM_LOCALID=1",
             "SLURM_TASKS_PER_NODE=3(x2),1", "SLURM_NODEID=1", "MASTER_ADDR=h",
             "MASTER_PORT=2000", NULL);
    expect_info(read_ok(), FSDP2_LAUNCHER_SLURM, 4, 7, 1, 3, 1, "h", 2000);
    env_only("SLURM_PROCID=6", "SLURM_NTASKS=7", "SLURM_LOCALID=0",
             "SLURM_TASKS_PER_NODE=3(x2),1", "SLURM_NODEID=2", "MASTER_ADDR=h",
             "MASTER_PORT=2000", NULL);
    expect_info(read_ok(), FSDP2_LAUNCHER_SLURM, 6, 7, 0, 1, 2, "h", 2000);
}
END_TEST

/* srun -n3 --ntasks-per-node=2: SLURM_NTASKS_PER_NODE=2 is only the maximum; node 1
 * runs 1 task, as SLURM_TASKS_PER_NODE=2,1 says. */
START_TEST(slurm_tasks_per_node_wins_over_the_ntasks_per_node_maximum)
{
    env_only("SLURM_PROCID=1", "SLURM_NTASKS=3", "SLURM_LOCALID=1", "SLURM_NTASKS_PER_NODE=2",
             "SLURM_TASKS_PER_NODE=2,1", "SLURM_NODEID=0", "MASTER_ADDR=h",
             "MASTER_PORT=2000", NULL);
    expect_info(read_ok(), FSDP2_LAUNCHER_SLURM, 1, 3, 1, 2, 0, "h", 2000);
    env_only("SLURM_PROCID=2", "SLURM_NTASKS=3", "SLURM_LOCALID=0", "SLURM_NTASKS_PER_NODE=2",
             "SLURM_TASKS_PER_NODE=2,1", "SLURM_NODEID=1", "MASTER_ADDR=h",
             "MASTER_PORT=2000", NULL);
    expect_info(read_ok(), FSDP2_LAUNCHER_SLURM, 2, 3, 0, 1, 1, "h", 2000);
}
END_TEST

/* srun -n3 inside an allocation of 4 tasks on each of 2 nodes: the step's list wins. */
START_TEST(slurm_step_tasks_per_node_wins_over_the_allocation_list)
{
    env_only("SLURM_PROCID=2", "SLURM_NTASKS=3", "SLURM_LOCALID=0",
             "SLURM_TASKS_PER_NODE=4(x2)", "SLURM_STEP_TASKS_PER_NODE=2,1", "SLURM_NODEID=1",
             "SLURM_NTASKS_PER_NODE=4", "MASTER_ADDR=h", "MASTER_PORT=2000", NULL);
    expect_info(read_ok(), FSDP2_LAUNCHER_SLURM, 2, 3, 0, 1, 1, "h", 2000);
    env_only("SLURM_PROCID=0", "SLURM_NTASKS=3", "SLURM_LOCALID=0",
             "SLURM_STEP_TASKS_PER_NODE=2,1", "SLURM_NODEID=0", "MASTER_ADDR=h",
             "MASTER_PORT=2000", NULL);
    expect_info(read_ok(), FSDP2_LAUNCHER_SLURM, 0, 3, 0, 2, 0, "h", 2000);
}
END_TEST

START_TEST(pmi_variables_with_local_values)
{
    env_only("PMI_RANK=2", "PMI_SIZE=3", "PMI_LOCAL_RANK=2", "PMI_LOCAL_SIZE=3",
             "MASTER_ADDR=localhost", "MASTER_PORT=4000", NULL);
    expect_info(read_ok(), FSDP2_LAUNCHER_PMI, 2, 3, 2, 3, -1, "localhost", 4000);
}
END_TEST

/* Hydra (MPICH, Intel MPI) sets MPI_LOCALRANKID/MPI_LOCALNRANKS instead of PMI_LOCAL_*. */
START_TEST(pmi_hydra_local_variables_give_local_rank_and_size)
{
    env_only("PMI_RANK=3", "PMI_SIZE=4", "MPI_LOCALRANKID=1", "MPI_LOCALNRANKS=2",
             "MASTER_ADDR=localhost", "MASTER_PORT=4000", NULL);
    expect_info(read_ok(), FSDP2_LAUNCHER_PMI, 3, 4, 1, 2, -1, "localhost", 4000);
    env_only("PMI_RANK=3", "PMI_SIZE=4", "PMI_LOCAL_RANK=1", "PMI_LOCAL_SIZE=2",
             "MPI_LOCALRANKID=1", "MPI_LOCALNRANKS=2", "MASTER_ADDR=localhost",
             "MASTER_PORT=4000", NULL);
    expect_info(read_ok(), FSDP2_LAUNCHER_PMI, 3, 4, 1, 2, -1, "localhost", 4000);
    /* Only the PMI source reads them. */
    env_only("OMPI_COMM_WORLD_RANK=0", "OMPI_COMM_WORLD_SIZE=1",
             "OMPI_COMM_WORLD_LOCAL_RANK=0", "OMPI_COMM_WORLD_LOCAL_SIZE=1",
             "MPI_LOCALRANKID=5", "MPI_LOCALNRANKS=9", NULL);
    expect_info(read_ok(), FSDP2_LAUNCHER_OPENMPI, 0, 1, 0, 1, -1, "", 0);
}
END_TEST

START_TEST(without_local_variables_every_rank_is_on_this_host)
{
    env_only("PMI_RANK=1", "PMI_SIZE=2", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=4000", NULL);
    expect_info(read_ok(), FSDP2_LAUNCHER_PMI, 1, 2, 1, 2, -1, "127.0.0.1", 4000);
    env_only("RANK=0", "WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=4000", NULL);
    expect_info(read_ok(), FSDP2_LAUNCHER_TORCHRUN, 0, 2, 0, 2, -1, "127.0.0.1", 4000);
}
END_TEST

/* fsdp2run under srun or mpirun: the RANK it sets wins over the outer launcher's. */
START_TEST(torchrun_variables_win_over_slurm_and_openmpi)
{
    env_only("RANK=1", "WORLD_SIZE=2", "LOCAL_RANK=1", "LOCAL_WORLD_SIZE=2",
             "SLURM_PROCID=0", "SLURM_NTASKS=1", "OMPI_COMM_WORLD_RANK=0",
             "OMPI_COMM_WORLD_SIZE=1", "MASTER_ADDR=a", "MASTER_PORT=9", NULL);
    expect_info(read_ok(), FSDP2_LAUNCHER_TORCHRUN, 1, 2, 1, 2, -1, "a", 9);
    env_only("OMPI_COMM_WORLD_RANK=0", "OMPI_COMM_WORLD_SIZE=1",
             "OMPI_COMM_WORLD_LOCAL_RANK=0", "OMPI_COMM_WORLD_LOCAL_SIZE=1", "SLURM_PROCID=3",
             "SLURM_NTASKS=4", NULL);
    expect_info(read_ok(), FSDP2_LAUNCHER_OPENMPI, 0, 1, 0, 1, -1, "", 0);
}
END_TEST

START_TEST(a_world_of_1_needs_no_master_address)
{
    env_only("OMPI_COMM_WORLD_RANK=0", "OMPI_COMM_WORLD_SIZE=1",
             "OMPI_COMM_WORLD_LOCAL_RANK=0", "OMPI_COMM_WORLD_LOCAL_SIZE=1", NULL);
    expect_info(read_ok(), FSDP2_LAUNCHER_OPENMPI, 0, 1, 0, 1, -1, "", 0);
}
END_TEST

START_TEST(launcher_names_are_never_null)
{
    ck_assert_str_eq(fsdp2_launcher_name(FSDP2_LAUNCHER_NONE), "none");
    ck_assert_str_eq(fsdp2_launcher_name(FSDP2_LAUNCHER_TORCHRUN), "torchrun");
    ck_assert_str_eq(fsdp2_launcher_name(FSDP2_LAUNCHER_OPENMPI), "openmpi");
    ck_assert_str_eq(fsdp2_launcher_name(FSDP2_LAUNCHER_SLURM), "slurm");
    ck_assert_str_eq(fsdp2_launcher_name(FSDP2_LAUNCHER_PMI), "pmi");
    ck_assert_str_eq(fsdp2_launcher_name((fsdp2_launcher_t)99), "unknown");
    ck_assert_int_eq(fsdp2_process_info_from_env(NULL), FSDP2_ERR_INVALID_ARGUMENT);
}
END_TEST

/* Invalid environments: each row sets the variables after env_only() and names the
 * substrings the message must contain (the variable and its value). */
typedef struct bad_env {
    const char *vars[8];
    const char *expect[2];
} bad_env_t;

#define TR "LOCAL_RANK=0", "LOCAL_WORLD_SIZE=1", "MASTER_ADDR=h", "MASTER_PORT=1"

static const bad_env_t bad_envs[] = {
    {{"RANK=4", "WORLD_SIZE=4", TR}, {"RANK=4", "WORLD_SIZE=4"}},
    {{"RANK=abc", "WORLD_SIZE=4", TR}, {"RANK='abc'", "integer"}},
    {{"RANK=1x", "WORLD_SIZE=4", TR}, {"RANK='1x'", NULL}},
    {{"RANK=-1", "WORLD_SIZE=4", TR}, {"RANK='-1'", NULL}},
    {{"RANK= 1", "WORLD_SIZE=4", TR}, {"RANK=' 1'", NULL}},
    {{"RANK=", "WORLD_SIZE=4", TR}, {"RANK", "empty"}},
    {{"RANK=0", "WORLD_SIZE=99999999999999999999", TR}, {"WORLD_SIZE='9999", "range"}},
    {{"RANK=0", "WORLD_SIZE=0", TR}, {"WORLD_SIZE='0'", "range"}},
    {{"RANK=0", TR}, {"WORLD_SIZE is not set", "RANK is set"}},
    {{"RANK=0", "WORLD_SIZE=4", "LOCAL_RANK=2", "LOCAL_WORLD_SIZE=2", "MASTER_ADDR=h",
      "MASTER_PORT=1"},
     {"LOCAL_RANK=2", "LOCAL_WORLD_SIZE=2"}},
    {{"RANK=0", "WORLD_SIZE=2", "LOCAL_RANK=0", "LOCAL_WORLD_SIZE=3", "MASTER_ADDR=h",
      "MASTER_PORT=1"},
     {"LOCAL_WORLD_SIZE='3'", "1..2"}},
    {{"RANK=0", "WORLD_SIZE=2", "LOCAL_RANK=0", "MASTER_ADDR=h", "MASTER_PORT=1"},
     {"LOCAL_WORLD_SIZE is not set", "LOCAL_RANK is"}},
    {{"RANK=0", "WORLD_SIZE=2", "LOCAL_RANK=0", "LOCAL_WORLD_SIZE=1", "MASTER_ADDR=h",
      "MASTER_PORT=0"},
     {"MASTER_PORT='0'", "1..65535"}},
    {{"RANK=0", "WORLD_SIZE=2", "LOCAL_RANK=0", "LOCAL_WORLD_SIZE=1", "MASTER_ADDR=h",
      "MASTER_PORT=65536"},
     {"MASTER_PORT='65536'", "1..65535"}},
    {{"RANK=0", "WORLD_SIZE=2", "LOCAL_RANK=0", "LOCAL_WORLD_SIZE=1", "MASTER_ADDR=h",
      "MASTER_PORT=http"},
     {"MASTER_PORT='http'", NULL}},
    {{"RANK=0", "WORLD_SIZE=2", "LOCAL_RANK=0", "LOCAL_WORLD_SIZE=1", "MASTER_ADDR=",
      "MASTER_PORT=5"},
     {"MASTER_ADDR", "empty"}},
    {{"RANK=0", "WORLD_SIZE=2", "LOCAL_RANK=0", "LOCAL_WORLD_SIZE=1", "MASTER_PORT=5"},
     {"MASTER_ADDR is not set", "2 ranks"}},
    {{"RANK=0", "WORLD_SIZE=2", "LOCAL_RANK=0", "LOCAL_WORLD_SIZE=1", "MASTER_ADDR=h"},
     {"MASTER_PORT is not set", "torchrun"}},
    {{"OMPI_COMM_WORLD_RANK=1", "OMPI_COMM_WORLD_SIZE=2", "OMPI_COMM_WORLD_LOCAL_RANK=1",
      "OMPI_COMM_WORLD_LOCAL_SIZE=2"},
     {"MASTER_ADDR is not set", "openmpi"}},
    {{"OMPI_COMM_WORLD_RANK=2", "OMPI_COMM_WORLD_SIZE=2"},
     {"OMPI_COMM_WORLD_RANK=2", "OMPI_COMM_WORLD_SIZE=2"}},
    {{"SLURM_PROCID=0", "SLURM_NTASKS=2", "SLURM_LOCALID=0", "MASTER_ADDR=h",
      "MASTER_PORT=1"},
     {"SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE"}},
    {{"SLURM_PROCID=0", "SLURM_NTASKS=4", "SLURM_LOCALID=0", "SLURM_TASKS_PER_NODE=2(x2)",
      "SLURM_NODEID=2", "MASTER_ADDR=h", "MASTER_PORT=1"},
     {"SLURM_TASKS_PER_NODE='2(x2)'", "SLURM_NODEID=2"}},
    {{"SLURM_PROCID=0", "SLURM_NTASKS=4", "SLURM_LOCALID=0", "SLURM_TASKS_PER_NODE=2(y2)",
      "SLURM_NODEID=0", "MASTER_ADDR=h", "MASTER_PORT=1"},
     {"SLURM_TASKS_PER_NODE='2(y2)'", NULL}},
    {{"SLURM_PROCID=0", "SLURM_NTASKS=4", "SLURM_LOCALID=0", "SLURM_TASKS_PER_NODE=2,2",
      "MASTER_ADDR=h", "MASTER_PORT=1"},
     {"SLURM_NODEID is not set", NULL}},
    {{"SLURM_PROCID=0", "SLURM_NTASKS=4", "SLURM_LOCALID=3", "SLURM_NTASKS_PER_NODE=2",
      "SLURM_NODEID=0", "MASTER_ADDR=h", "MASTER_PORT=1"},
     {"SLURM_LOCALID=3", "SLURM_NTASKS_PER_NODE=2"}},
    {{"SLURM_PROCID=0", "SLURM_NTASKS=4", "SLURM_NTASKS_PER_NODE=2", "MASTER_ADDR=h",
      "MASTER_PORT=1"},
     {"SLURM_LOCALID is not set", NULL}},
    {{"SLURM_PROCID=0", "SLURM_NTASKS=3", "SLURM_LOCALID=0", "SLURM_NTASKS_PER_NODE=2",
      "SLURM_TASKS_PER_NODE=2,x", "SLURM_NODEID=1", "MASTER_ADDR=h", "MASTER_PORT=1"},
     {"SLURM_TASKS_PER_NODE='2,x'", NULL}},
    {{"SLURM_PROCID=0", "SLURM_NTASKS=3", "SLURM_LOCALID=0", "SLURM_NTASKS_PER_NODE=2",
      "SLURM_TASKS_PER_NODE=", "SLURM_NODEID=0", "MASTER_ADDR=h", "MASTER_PORT=1"},
     {"SLURM_TASKS_PER_NODE", "empty"}},
    /* the whole list must parse, not only the part up to this node's entry */
    {{"SLURM_PROCID=0", "SLURM_NTASKS=3", "SLURM_LOCALID=0", "SLURM_TASKS_PER_NODE=2,1,",
      "SLURM_NODEID=0", "MASTER_ADDR=h", "MASTER_PORT=1"},
     {"SLURM_TASKS_PER_NODE='2,1,'", "at ','"}},
    {{"SLURM_PROCID=0", "SLURM_NTASKS=3", "SLURM_LOCALID=0", "SLURM_TASKS_PER_NODE=2,1,x",
      "SLURM_NODEID=0", "MASTER_ADDR=h", "MASTER_PORT=1"},
     {"SLURM_TASKS_PER_NODE='2,1,x'", "at 'x'"}},
    {{"SLURM_PROCID=2", "SLURM_NTASKS=3", "SLURM_LOCALID=1", "SLURM_NTASKS_PER_NODE=2",
      "SLURM_TASKS_PER_NODE=2,1", "SLURM_NODEID=1", "MASTER_ADDR=h", "MASTER_PORT=1"},
     {"SLURM_LOCALID=1", "SLURM_TASKS_PER_NODE=1"}},
    {{"SLURM_PROCID=0", "SLURM_NTASKS=3", "SLURM_LOCALID=0", "SLURM_TASKS_PER_NODE=2,1",
      "SLURM_STEP_TASKS_PER_NODE=2(x", "SLURM_NODEID=0", "MASTER_ADDR=h", "MASTER_PORT=1"},
     {"SLURM_STEP_TASKS_PER_NODE='2(x'", NULL}},
    {{"SLURM_PROCID=0", "SLURM_NTASKS=3", "SLURM_LOCALID=0", "SLURM_TASKS_PER_NODE=2(x2)",
      "SLURM_STEP_TASKS_PER_NODE=2,1", "SLURM_NODEID=2", "MASTER_ADDR=h", "MASTER_PORT=1"},
     {"SLURM_STEP_TASKS_PER_NODE='2,1'", "SLURM_NODEID=2"}},
    {{"SLURM_PROCID=0", "SLURM_NTASKS=3", "SLURM_LOCALID=0", "SLURM_STEP_TASKS_PER_NODE=2,1",
      "MASTER_ADDR=h", "MASTER_PORT=1"},
     {"SLURM_NODEID is not set", "SLURM_STEP_TASKS_PER_NODE='2,1'"}},
    {{"PMI_RANK=0", "PMI_SIZE=x"}, {"PMI_SIZE='x'", NULL}},
    {{"PMI_RANK=0", "PMI_SIZE=1", "PMI_LOCAL_RANK=0"}, {"PMI_LOCAL_SIZE is not set", NULL}},
    {{"PMI_RANK=0", "PMI_SIZE=4", "PMI_LOCAL_RANK=1", "PMI_LOCAL_SIZE=2", "MPI_LOCALRANKID=0",
      "MPI_LOCALNRANKS=2", "MASTER_ADDR=h", "MASTER_PORT=1"},
     {"PMI_LOCAL_RANK=1", "MPI_LOCALRANKID=0"}},
    {{"PMI_RANK=0", "PMI_SIZE=4", "PMI_LOCAL_RANK=0", "PMI_LOCAL_SIZE=2", "MPI_LOCALRANKID=0",
      "MPI_LOCALNRANKS=4", "MASTER_ADDR=h", "MASTER_PORT=1"},
     {"PMI_LOCAL_SIZE=2", "MPI_LOCALNRANKS=4"}},
    {{"PMI_RANK=0", "PMI_SIZE=4", "MPI_LOCALRANKID=x", "MPI_LOCALNRANKS=2", "MASTER_ADDR=h",
      "MASTER_PORT=1"},
     {"MPI_LOCALRANKID='x'", NULL}},
    {{"PMI_RANK=0", "PMI_SIZE=4", "MPI_LOCALRANKID=2", "MPI_LOCALNRANKS=2", "MASTER_ADDR=h",
      "MASTER_PORT=1"},
     {"MPI_LOCALRANKID=2", "MPI_LOCALNRANKS=2"}},
    {{"PMI_RANK=0", "PMI_SIZE=4", "MPI_LOCALRANKID=0", "MPI_LOCALNRANKS=5", "MASTER_ADDR=h",
      "MASTER_PORT=1"},
     {"MPI_LOCALNRANKS='5'", "1..4"}},
    {{"PMI_RANK=0", "PMI_SIZE=4", "MPI_LOCALRANKID=1", "MASTER_ADDR=h", "MASTER_PORT=1"},
     {"PMI_LOCAL_SIZE is not set (nor MPI_LOCALNRANKS)", "MPI_LOCALRANKID is"}},
};

START_TEST(inconsistent_or_malformed_values_are_errors_naming_variable_and_value)
{
    const bad_env_t *row = &bad_envs[_i];
    env_only(NULL);
    for (int v = 0; v < 8 && row->vars[v]; v++) {
        const char *eq = strchr(row->vars[v], '=');
        char name[64];
        snprintf(name, sizeof(name), "%.*s", (int)(eq - row->vars[v]), row->vars[v]);
        ck_assert_int_eq(setenv(name, eq + 1, 1), 0);
    }
    fsdp2_process_info_t info;
    fsdp2_status_t s = fsdp2_process_info_from_env(&info);
    const char *msg = fsdp2_last_error();
    ck_assert_msg(s == FSDP2_ERR_INVALID_CONFIG, "row %d (%s...): got %s, message '%s'", _i,
                  row->vars[0], fsdp2_status_name(s), msg);
    for (int e = 0; e < 2 && row->expect[e]; e++)
        ck_assert_msg(strstr(msg, row->expect[e]), "row %d: message '%s' lacks '%s'", _i, msg,
                      row->expect[e]);
}
END_TEST

START_TEST(a_master_address_longer_than_the_limit_is_an_error)
{
    char addr[FSDP2_HOST_MAX + 10];
    memset(addr, 'a', sizeof(addr) - 1);
    addr[sizeof(addr) - 1] = '\0';
    env_only("MASTER_PORT=5", NULL);
    setenv("MASTER_ADDR", addr, 1);
    fsdp2_process_info_t info;
    ck_assert_int_eq(fsdp2_process_info_from_env(&info), FSDP2_ERR_INVALID_CONFIG);
    ck_assert_ptr_nonnull(strstr(fsdp2_last_error(), "MASTER_ADDR"));
    addr[FSDP2_HOST_MAX - 1] = '\0';
    setenv("MASTER_ADDR", addr, 1);
    ck_assert_str_eq(read_ok().master_addr, addr);
}
END_TEST

static Suite *bootstrap_suite(void)
{
    Suite *s = suite_create("bootstrap");
    TCase *tc = tcase_create("env");
    tcase_add_test(tc, no_variables_is_rank_0_of_a_world_of_1);
    tcase_add_test(tc, torchrun_variables_give_rank_local_rank_node_and_master);
    tcase_add_test(tc, openmpi_variables_give_rank_and_local_rank_without_node);
    tcase_add_test(tc, slurm_variables_with_ntasks_per_node);
    tcase_add_test(tc, slurm_compressed_tasks_per_node_is_indexed_by_node_id);
    tcase_add_test(tc, slurm_tasks_per_node_wins_over_the_ntasks_per_node_maximum);
    tcase_add_test(tc, slurm_step_tasks_per_node_wins_over_the_allocation_list);
    tcase_add_test(tc, pmi_variables_with_local_values);
    tcase_add_test(tc, pmi_hydra_local_variables_give_local_rank_and_size);
    tcase_add_test(tc, without_local_variables_every_rank_is_on_this_host);
    tcase_add_test(tc, torchrun_variables_win_over_slurm_and_openmpi);
    tcase_add_test(tc, a_world_of_1_needs_no_master_address);
    tcase_add_test(tc, launcher_names_are_never_null);
    tcase_add_loop_test(tc, inconsistent_or_malformed_values_are_errors_naming_variable_and_value,
                        0, (int)(sizeof(bad_envs) / sizeof(bad_envs[0])));
    tcase_add_test(tc, a_master_address_longer_than_the_limit_is_an_error);
    suite_add_tcase(s, tc);
    return s;
}

FSDP2_CHECK_MAIN(bootstrap_suite)
