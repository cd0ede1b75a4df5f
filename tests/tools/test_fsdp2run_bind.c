/* fsdp2run --bind: the default (auto) and each mode, checking each rank's CPUs with
 * sched_getaffinity against the core layout read from sysfs (not through hwloc);
 * --topology; and the path under mpirun where fsdp2run binds and then becomes the
 * program. */
#include <check.h>

#include "../core/check_main.h"
#include <dirent.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

#ifdef FSDP2_HAVE_HWLOC
/* The CPUs this test may use, and for each its core as (package, core id) from sysfs:
 * a reference that does not go through hwloc. */
typedef struct cpu_info {
    int n;
    int cpu[CPU_SETSIZE];
    long core[CPU_SETSIZE];
} cpu_info_t;

static long read_sysfs_long(int cpu, const char *file)
{
    char path[128];
    snprintf(path, sizeof(path), "/sys/devices/system/cpu/cpu%d/topology/%s", cpu, file);
    FILE *f = fopen(path, "r");
    long v = -1;
    if (f) {
        if (fscanf(f, "%ld", &v) != 1)
            v = -1;
        fclose(f);
    }
    return v;
}

static void usable_cpus(cpu_info_t *info)
{
    cpu_set_t set;
    ck_assert(sched_getaffinity(0, sizeof(set), &set) == 0);
    info->n = 0;
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &set)) {
            info->cpu[info->n] = c;
            info->core[info->n] = read_sysfs_long(c, "physical_package_id") * 100000 +
                                  read_sysfs_long(c, "core_id");
            info->n++;
        }
}

/* Parses "[rank R] affinity RANK=R cpus=a,b" lines into a bitmask per rank. */
static void parse_affinity(const char *text, int n, cpu_set_t *sets)
{
    for (int r = 0; r < n; r++)
        CPU_ZERO(&sets[r]);
    int seen = 0;
    for (const char *p = text; (p = strstr(p, "affinity RANK=")) != NULL; p++) {
        int rank, off = 0;
        ck_assert(sscanf(p, "affinity RANK=%d cpus=%n", &rank, &off) == 1 && off > 0);
        ck_assert(rank >= 0 && rank < n);
        for (const char *q = p + off; *q >= '0' && *q <= '9';) {
            char *end;
            long cpu = strtol(q, &end, 10);
            CPU_SET((int)cpu, &sets[rank]);
            q = *end == ',' ? end + 1 : end;
        }
        seen++;
    }
    ck_assert_int_eq(seen, n);
}

/* The cores of cpu_info touched by set; each must be covered whole. */
static int whole_cores(const cpu_info_t *info, const cpu_set_t *set, long *cores, int max)
{
    int n = 0;
    for (int i = 0; i < info->n; i++) {
        if (!CPU_ISSET(info->cpu[i], set))
            continue;
        int known = 0;
        for (int k = 0; k < n; k++)
            known |= cores[k] == info->core[i];
        if (!known && n < max)
            cores[n++] = info->core[i];
    }
    for (int i = 0; i < info->n; i++)
        for (int k = 0; k < n; k++)
            if (info->core[i] == cores[k])
                ck_assert_msg(CPU_ISSET(info->cpu[i], set),
                              "CPU %d shares a core with the rank's CPUs but is not bound",
                              info->cpu[i]);
    return n;
}

/* One rank per core (at most 4 ranks), then twice as many ranks as cores: each rank's
 * CPUs are whole cores; with ranks <= cores they are disjoint and cover every usable
 * CPU; with more ranks each rank has exactly one core and the cores are evenly shared. */
START_TEST(bind_core_pins_each_rank_to_its_own_cores)
{
    cpu_info_t info;
    usable_cpus(&info);
    long cores_all[CPU_SETSIZE];
    cpu_set_t all;
    CPU_ZERO(&all);
    for (int i = 0; i < info.n; i++)
        CPU_SET(info.cpu[i], &all);
    int ncores = whole_cores(&info, &all, cores_all, CPU_SETSIZE);
    int n = _i == 0 ? (ncores < 4 ? ncores : 4) : 2 * ncores;
    if (n > MAX_RANKS)
        return;
    char nproc[16];
    snprintf(nproc, sizeof(nproc), "%d", n);
    const char *args[] = {"--nproc-per-node", nproc, "--bind", "core", path_of("PRINT_ENV"),
                          "--affinity", NULL};
    ck_assert_int_eq(run(args), 0);
    char *text = slurp(out_path);
    cpu_set_t sets[MAX_RANKS], seen;
    parse_affinity(text, n, sets);
    CPU_ZERO(&seen);
    int uses[CPU_SETSIZE] = {0};
    for (int r = 0; r < n; r++) {
        long cores[CPU_SETSIZE];
        int k = whole_cores(&info, &sets[r], cores, CPU_SETSIZE);
        ck_assert_msg(k >= 1, "rank %d is bound to no usable core", r);
        cpu_set_t outside;
        CPU_AND(&outside, &sets[r], &all);
        ck_assert_msg(CPU_EQUAL(&outside, &sets[r]), "rank %d bound outside the usable CPUs", r);
        if (n <= ncores) {
            cpu_set_t both;
            CPU_AND(&both, &seen, &sets[r]);
            ck_assert_msg(CPU_COUNT(&both) == 0, "rank %d shares CPUs with a lower rank", r);
            CPU_OR(&seen, &seen, &sets[r]);
        } else {
            ck_assert_int_eq(k, 1);
            for (int c = 0; c < ncores; c++)
                uses[c] += cores_all[c] == cores[0];
        }
    }
    if (n <= ncores && n == ncores)
        ck_assert_msg(CPU_EQUAL(&seen, &all), "the ranks leave usable CPUs unused");
    for (int c = 0; n > ncores && c < ncores; c++)
        ck_assert_msg(uses[c] == n / ncores, "core %d is used by %d ranks, expected %d", c,
                      uses[c], n / ncores);
    free(text);
}
END_TEST

/* Without --bind (auto): ranks that fit the usable CPUs are left free (every usable
 * CPU); twice as many ranks as CPUs are bound, each to one core, unless --bind none
 * says otherwise. The test keeps at most 2 CPUs of its own so that the oversubscribed
 * case fits MAX_RANKS on any machine (fsdp2run inherits the affinity). */
START_TEST(bind_auto_binds_only_when_ranks_outnumber_the_cpus)
{
    cpu_set_t saved, two;
    ck_assert(sched_getaffinity(0, sizeof(saved), &saved) == 0);
    CPU_ZERO(&two);
    for (int c = 0, kept = 0; c < CPU_SETSIZE && kept < 2; c++)
        if (CPU_ISSET(c, &saved)) {
            CPU_SET(c, &two);
            kept++;
        }
    ck_assert(sched_setaffinity(0, sizeof(two), &two) == 0);
    cpu_info_t info;
    usable_cpus(&info);
    cpu_set_t all;
    CPU_ZERO(&all);
    for (int i = 0; i < info.n; i++)
        CPU_SET(info.cpu[i], &all);
    int over = _i != 0, n = over ? 2 * info.n : info.n;
    char nproc[16];
    snprintf(nproc, sizeof(nproc), "%d", n);
    const char *args[] = {"--nproc-per-node", nproc, path_of("PRINT_ENV"), "--affinity", NULL};
    const char *args_none[] = {"--nproc-per-node", nproc, "--bind", "none", path_of("PRINT_ENV"),
                               "--affinity", NULL};
    for (int explicit_none = 0; explicit_none < 2; explicit_none++) {
        ck_assert_int_eq(run(explicit_none ? args_none : args), 0);
        char *text = slurp(out_path);
        cpu_set_t sets[MAX_RANKS];
        parse_affinity(text, n, sets);
        for (int r = 0; r < n; r++) {
            long cores[CPU_SETSIZE];
            if (!over || explicit_none)
                ck_assert_msg(CPU_EQUAL(&sets[r], &all), "%d ranks on %d CPUs%s: rank %d bound",
                              n, info.n, explicit_none ? " (--bind none)" : "", r);
            else
                ck_assert_msg(whole_cores(&info, &sets[r], cores, CPU_SETSIZE) == 1,
                              "%d ranks on %d CPUs: rank %d is not bound to one core", n,
                              info.n, r);
        }
        free(text);
    }
    ck_assert(sched_setaffinity(0, sizeof(saved), &saved) == 0);
}
END_TEST

START_TEST(bind_numa_on_one_node_gives_every_cpu)
{
    DIR *d = opendir("/sys/devices/system/node");
    int nodes = 0;
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL)
        nodes += strncmp(e->d_name, "node", 4) == 0 && e->d_name[4] >= '0' && e->d_name[4] <= '9';
    if (d)
        closedir(d);
    if (nodes != 1)
        return; /* the one-node expectation below is only this machine's */
    const char *args[] = {"--nproc-per-node", "2", "--bind", "numa", path_of("PRINT_ENV"),
                          "--affinity", NULL};
    ck_assert_int_eq(run(args), 0);
    char *text = slurp(out_path);
    cpu_set_t sets[2], all;
    parse_affinity(text, 2, sets);
    ck_assert(sched_getaffinity(0, sizeof(all), &all) == 0);
    ck_assert(CPU_EQUAL(&sets[0], &all) && CPU_EQUAL(&sets[1], &all));
    free(text);
}
END_TEST

/* Under mpirun, --bind uses mpirun's local rank: local rank 1 of 2 gets whole cores, not
 * all of them (with at least 2 cores). */
START_TEST(under_mpirun_bind_core_uses_the_local_rank)
{
    cpu_info_t info;
    usable_cpus(&info);
    cpu_set_t all;
    CPU_ZERO(&all);
    for (int i = 0; i < info.n; i++)
        CPU_SET(info.cpu[i], &all);
    long cores[CPU_SETSIZE];
    if (whole_cores(&info, &all, cores, CPU_SETSIZE) < 2)
        return;
    setenv("OMPI_COMM_WORLD_RANK", "1", 1);
    setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
    setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1", 1);
    setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2", 1);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", "1", 1);
    const char *args[] = {"--bind", "core", path_of("PRINT_ENV"), "--affinity", NULL};
    ck_assert_int_eq(run(args), 0);
    char *text = slurp(out_path);
    /* Not prefixed: it is the rank itself; print_env reads RANK (unset) as 0. */
    cpu_set_t set[1];
    parse_affinity(text, 1, set);
    ck_assert_int_ge(whole_cores(&info, &set[0], cores, CPU_SETSIZE), 1);
    ck_assert_msg(!CPU_EQUAL(&set[0], &all), "local rank 1 of 2 was bound to every CPU");
    free(text);
}
END_TEST
#endif

#ifdef FSDP2_HAVE_HWLOC
START_TEST(topology_prints_cores_and_exits_0)
{
    const char *args[] = {"--topology", NULL};
    ck_assert_int_eq(run(args), 0);
    char *text = slurp(out_path);
    ck_assert_msg(strstr(text, "cores") && strstr(text, "NUMA node") && strstr(text, "GPUs"),
                  "--topology printed:\n%s", text);
    free(text);
}
END_TEST
#else
START_TEST(topology_without_hwloc_exits_1_saying_so)
{
    const char *args[] = {"--topology", NULL};
    ck_assert_int_eq(run(args), 1);
    char *text = slurp(err_path);
    ck_assert_msg(strstr(text, "without hwloc"), "--topology printed:\n%s", text);
    free(text);
}
END_TEST
#endif

/* Started by mpirun (OMPI_COMM_WORLD_RANK set) without --nproc-per-node, fsdp2run
 * becomes PROGRAM: same pid, no prefix. */
START_TEST(under_mpirun_it_execs_the_program_in_place)
{
    setenv("OMPI_COMM_WORLD_RANK", "0", 1);
    setenv("OMPI_COMM_WORLD_SIZE", "1", 1);
    setenv("OMPI_COMM_WORLD_LOCAL_RANK", "0", 1);
    setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "1", 1);
    const char *args[] = {path_of("PRINT_ENV"), "--pid", NULL};
    pid_t pid = start(args);
    ck_assert_int_eq(exit_code(wait_exit(pid, WAIT_MS, err_path)), 0);
    char *text = slurp(out_path), want[64];
    snprintf(want, sizeof(want), "pid RANK=0 PID=%d\n", (int)pid);
    ck_assert_msg(strstr(text, want) && !strstr(text, "[rank"), "output:\n%s", text);
    free(text);
}
END_TEST

/* The same under srun and under a PMI launcher (Hydra's local variable names), one
 * environment per loop iteration. */
START_TEST(under_srun_or_pmi_it_execs_the_program_in_place)
{
    static const char *const envs[][6] = {
        {"SLURM_PROCID=0", "SLURM_NTASKS=1", "SLURM_LOCALID=0", "SLURM_NODEID=0",
         "SLURM_TASKS_PER_NODE=1", NULL},
        {"PMI_RANK=0", "PMI_SIZE=1", "MPI_LOCALRANKID=0", "MPI_LOCALNRANKS=1", NULL},
    };
    for (int i = 0; envs[_i][i]; i++)
        putenv((char *)envs[_i][i]);
    const char *args[] = {path_of("PRINT_ENV"), "--pid", NULL};
    pid_t pid = start(args);
    ck_assert_int_eq(exit_code(wait_exit(pid, WAIT_MS, err_path)), 0);
    char *text = slurp(out_path), want[64];
    snprintf(want, sizeof(want), "pid RANK=0 PID=%d\n", (int)pid);
    ck_assert_msg(strstr(text, want) && !strstr(text, "[rank"), "launcher %d output:\n%s", _i,
                  text);
    free(text);
}
END_TEST

/* Each bad command line exits 2 with a message naming the flag or value. */

static Suite *fsdp2run_bind_suite(void)
{
    Suite *s = suite_create("fsdp2run-bind");
    TCase *tc = tcase_create("bind-topology-mpirun");
    tcase_add_checked_fixture(tc, harness_setup, harness_teardown);
    tcase_set_timeout(tc, 60);
#ifdef FSDP2_HAVE_HWLOC
    tcase_add_loop_test(tc, bind_core_pins_each_rank_to_its_own_cores, 0, 2);
    tcase_add_loop_test(tc, bind_auto_binds_only_when_ranks_outnumber_the_cpus, 0, 2);
    tcase_add_test(tc, bind_numa_on_one_node_gives_every_cpu);
    tcase_add_test(tc, topology_prints_cores_and_exits_0);
    tcase_add_test(tc, under_mpirun_bind_core_uses_the_local_rank);
#else
    tcase_add_test(tc, topology_without_hwloc_exits_1_saying_so);
#endif
    tcase_add_test(tc, under_mpirun_it_execs_the_program_in_place);
    tcase_add_loop_test(tc, under_srun_or_pmi_it_execs_the_program_in_place, 0, 2);
    suite_add_tcase(s, tc);
    return s;
}

FSDP2_CHECK_MAIN(fsdp2run_bind_suite)
