/* fsdp2run: starts the local ranks of a libfsdp2 job, torchrun-style.
 *
 *   fsdp2run --nproc-per-node N [--nnodes M --node-rank K --master-addr A --master-port P]
 *            [--bind auto|none|core|numa] [--] PROGRAM [ARGS...]
 *   fsdp2run --topology
 *   fsdp2run [--bind auto|none|core|numa] PROGRAM [ARGS...] (under mpirun, srun or PMI)
 *
 * --bind auto (the default) is core when the local ranks outnumber the usable CPUs and
 * none otherwise (or when hwloc is missing or cannot bind this machine): oversubscribed
 * ranks that the scheduler moves between cores wait for each other far longer (at 4
 * ranks on 2 CPUs, binding raised bench/collectives' median busbw 1.2-8.6x,
 * docs/performance-collectives.md), while ranks with a CPU each do as well free.
 *
 * Each local rank gets RANK (node_rank * N + local rank), WORLD_SIZE (M * N),
 * LOCAL_RANK, LOCAL_WORLD_SIZE (N), GROUP_RANK (K), GROUP_WORLD_SIZE (M), MASTER_ADDR,
 * MASTER_PORT and, unless already set, OMP_NUM_THREADS = usable CPUs / N (at least 1) and,
 * where the ranks' threads then outnumber the usable CPUs, OMP_WAIT_POLICY=PASSIVE.
 * One node: MASTER_ADDR defaults to 127.0.0.1 and a free port is picked. Several nodes:
 * all four multi-node flags are required, identical on every node but --node-rank.
 *
 * The rendezvous store authenticates its ranks with FSDP2_STORE_SECRET (or
 * FSDP2_STORE_SECRET_FILE): on one node fsdp2run makes a fresh random secret for the
 * job's ranks unless one is set; several nodes need the same one on every node, so the
 * user gives it (fsdp2run warns when there is none: the store then admits any client).
 *
 * Process groups: each rank is started in its own session (setsid), so it leads its own
 * process group. A Ctrl-C at the terminal therefore reaches only fsdp2run, which
 * forwards it once to every rank's group (rank and anything it started); nothing is
 * delivered twice. Local rank 0 (on every node) keeps fsdp2run's stdin (setsid frees it
 * from job control, so it can read the terminal); the other ranks read /dev/null.
 *
 * Under mpirun, srun or a PMI launcher (OMPI_COMM_WORLD_RANK, SLURM_PROCID or PMI_RANK
 * set) and without --nproc-per-node, fsdp2run binds (if asked, from that launcher's
 * local rank) and then execs PROGRAM in place: the library's bootstrap reads those
 * variables itself. Note that an sbatch script's own environment has SLURM_PROCID set,
 * so there give --nproc-per-node explicitly or start the ranks with srun. */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fsdp2/bootstrap.h>
#include <fsdp2/topology.h>

#include "fsdp2run.h"

typedef struct options {
    int nproc_per_node; /* 0: not given */
    int nnodes, node_rank;
    const char *master_addr;
    int master_port; /* 0: not given */
    int node_rank_given;
    fsdp2_bind_mode_t bind;
    int bind_auto; /* --bind auto: decided once the rank count is known */
    int topology;
    char **program; /* PROGRAM ARGS... NULL-terminated */
} options_t;

static const char usage_text[] =
    "usage: fsdp2run --nproc-per-node N [--nnodes M --node-rank K --master-addr A\n"
    "                --master-port P] [--bind auto|none|core|numa] [--] PROGRAM [ARGS...]\n"
    "       fsdp2run --topology\n"
    "       fsdp2run [--bind auto|none|core|numa] PROGRAM [ARGS...]   (under mpirun/srun/PMI)\n"
    "\n"
    "Starts N local ranks of PROGRAM with RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,\n"
    "GROUP_RANK, GROUP_WORLD_SIZE, MASTER_ADDR and MASTER_PORT set (and OMP_NUM_THREADS =\n"
    "usable CPUs / N unless already set; OMP_WAIT_POLICY=PASSIVE, unless set, where the\n"
    "ranks' threads outnumber the usable CPUs). Each output line is printed with\n"
    "\"[rank R] \" in front. When a rank fails, the others get SIGTERM, then SIGKILL after\n"
    "FSDP2RUN_GRACE_SECONDS (default 5), and fsdp2run exits with the failing rank's\n"
    "status (128+signal when it was killed). SIGINT, SIGTERM and SIGHUP are forwarded to\n"
    "every rank; a second one kills them.\n"
    "\n"
    "  --nproc-per-node N   local ranks to start (1..4096)\n"
    "  --nnodes M           nodes in the job (default 1)\n"
    "  --node-rank K        this node's index, 0..M-1 (required when M > 1)\n"
    "  --master-addr A      where rank 0 serves the rendezvous (default 127.0.0.1 for one\n"
    "                       node; required when M > 1)\n"
    "  --master-port P      its port (default: a free one for one node; required when M > 1)\n"
    "  --bind MODE          auto (default: core when the ranks outnumber the usable CPUs,\n"
    "                       else none), none, core (a block of cores per rank) or numa\n"
    "  --topology           print the machine's cores, NUMA nodes and GPUs, and exit\n"
    "  -h, --help           this text\n";

__attribute__((format(printf, 1, 2))) static int usage_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "fsdp2run: ");
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n\n%s", usage_text);
    return FSDP2RUN_EXIT_USAGE;
}

static int parse_int(const char *flag, const char *text, int lo, int hi, int *out)
{
    char *end = NULL;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno || end == text || *end != '\0' || v < lo || v > hi) {
        char range[64];
        snprintf(range, sizeof(range), "an integer from %d to %d", lo, hi);
        fprintf(stderr, "fsdp2run: %s '%s' is not valid: expected %s\n\n%s", flag, text, range,
                usage_text);
        return -1;
    }
    *out = (int)v;
    return 0;
}

/* Options come first; the first word that is not one (or the one after "--") starts
 * PROGRAM. Accepts "--flag value" and "--flag=value", and torchrun's underscores. */
static int parse_options(int argc, char **argv, options_t *o)
{
    *o = (options_t){.nnodes = 1, .bind = FSDP2_BIND_NONE, .bind_auto = 1};
    int i = 1;
    for (; i < argc; i++) {
        const char *arg = argv[i];
        if (strcmp(arg, "--") == 0) {
            i++;
            break;
        }
        if (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0) {
            fputs(usage_text, stdout);
            exit(0);
        }
        if (strncmp(arg, "--", 2) != 0) {
            if (arg[0] == '-')
                return usage_error("unknown option '%s'", arg);
            break;
        }
        char name[64];
        const char *eq = strchr(arg, '=');
        size_t nlen = eq ? (size_t)(eq - arg) : strlen(arg);
        if (nlen >= sizeof(name))
            return usage_error("unknown option '%s'", arg);
        for (size_t k = 0; k < nlen; k++)
            name[k] = arg[k] == '_' ? '-' : arg[k];
        name[nlen] = '\0';
        if (strcmp(name, "--topology") == 0 && !eq) {
            o->topology = 1;
            continue;
        }
        static const char *const with_value[] = {"--nproc-per-node", "--nnodes", "--node-rank",
                                                 "--master-addr", "--master-port", "--bind"};
        int known = 0;
        for (size_t k = 0; k < sizeof(with_value) / sizeof(with_value[0]); k++)
            known |= strcmp(name, with_value[k]) == 0;
        if (!known)
            return usage_error("unknown option '%s'", arg);
        const char *value = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
        if (!value)
            return usage_error("option %s needs a value", name);
        int rc = 0;
        if (strcmp(name, "--nproc-per-node") == 0) {
            rc = parse_int(name, value, 1, 4096, &o->nproc_per_node);
        } else if (strcmp(name, "--nnodes") == 0) {
            rc = parse_int(name, value, 1, 65536, &o->nnodes);
        } else if (strcmp(name, "--node-rank") == 0) {
            rc = parse_int(name, value, 0, 65535, &o->node_rank);
            o->node_rank_given = 1;
        } else if (strcmp(name, "--master-port") == 0) {
            rc = parse_int(name, value, 1, 65535, &o->master_port);
        } else if (strcmp(name, "--master-addr") == 0) {
            if (value[0] == '\0' || strlen(value) >= FSDP2_HOST_MAX)
                return usage_error("--master-addr '%s' is not valid: expected a host name or "
                                   "address", value);
            o->master_addr = value;
        } else if (strcmp(value, "auto") == 0) {
            o->bind_auto = 1;
        } else if (fsdp2_bind_mode_parse(value, &o->bind) != FSDP2_SUCCESS) {
            return usage_error("--bind '%s' is not valid: expected auto, none, core or numa",
                               value);
        } else {
            o->bind_auto = 0;
        }
        if (rc != 0)
            return FSDP2RUN_EXIT_USAGE;
    }
    o->program = i < argc ? &argv[i] : NULL;
    if (o->topology)
        return 0;
    if (o->nnodes > 1 && !o->nproc_per_node)
        return usage_error("--nnodes needs --nproc-per-node");
    if (o->nnodes > 1 && (!o->node_rank_given || !o->master_addr || !o->master_port))
        return usage_error("--nnodes %d needs --node-rank, --master-addr and --master-port",
                           o->nnodes);
    if (o->node_rank >= o->nnodes)
        return usage_error("--node-rank %d is not valid: it must be below --nnodes %d",
                           o->node_rank, o->nnodes);
    if ((long)o->nnodes * o->nproc_per_node > 1L << 24)
        return usage_error("--nnodes %d times --nproc-per-node %d is too large", o->nnodes,
                           o->nproc_per_node);
    if (!o->program)
        return usage_error("no PROGRAM given");
    return 0;
}

static int print_topology(void)
{
    fsdp2_topology_t *topo = NULL;
    size_t needed = 0;
    char *text = NULL;
    if (fsdp2_topology_load(&topo) != FSDP2_SUCCESS ||
        fsdp2_topology_format(topo, NULL, 0, &needed) != FSDP2_SUCCESS ||
        !(text = malloc(needed + 1)) ||
        fsdp2_topology_format(topo, text, needed + 1, NULL) != FSDP2_SUCCESS) {
        fprintf(stderr, "fsdp2run: --topology: %s\n", fsdp2_last_error());
        free(text);
        fsdp2_topology_destroy(topo);
        return FSDP2RUN_EXIT_ERROR;
    }
    fputs(text, stdout);
    free(text);
    fsdp2_topology_destroy(topo);
    return 0;
}

static int under_other_launcher(void)
{
    return getenv("OMPI_COMM_WORLD_RANK") || getenv("SLURM_PROCID") || getenv("PMI_RANK");
}

/* mpirun/srun started this process as one rank: bind if asked, then become PROGRAM. */
static int exec_in_place(const options_t *o)
{
    if (o->bind != FSDP2_BIND_NONE) {
        fsdp2_process_info_t info;
        fsdp2_topology_t *topo = NULL;
        if (fsdp2_process_info_from_env(&info) != FSDP2_SUCCESS ||
            fsdp2_topology_load(&topo) != FSDP2_SUCCESS ||
            fsdp2_topology_bind_self(topo, info.local_rank, info.local_world_size, o->bind) !=
                FSDP2_SUCCESS) {
            fprintf(stderr, "fsdp2run: --bind %s: %s\n", fsdp2_bind_mode_name(o->bind),
                    fsdp2_last_error());
            fsdp2_topology_destroy(topo);
            return FSDP2RUN_EXIT_ERROR;
        }
        fsdp2_topology_destroy(topo);
    }
    execvp(o->program[0], o->program);
    fprintf(stderr, "fsdp2run: cannot run '%s': %s\n", o->program[0], strerror(errno));
    return errno == ENOENT ? 127 : 126;
}

/* A port nobody listens on now (the kernel's pick for port 0). Rank 0's store binds it
 * moments later; the window in between is the same one torchrun accepts. */
static int pick_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_ANY)};
    socklen_t len = sizeof(addr);
    int port = -1;
    if (bind(fd, (struct sockaddr *)&addr, sizeof(addr)) == 0 &&
        getsockname(fd, (struct sockaddr *)&addr, &len) == 0)
        port = ntohs(addr.sin_port);
    close(fd);
    return port;
}

static int grace_ms_from_env(long *grace_ms)
{
    const char *text = getenv("FSDP2RUN_GRACE_SECONDS");
    *grace_ms = 5000;
    if (!text)
        return 0;
    char *end = NULL;
    double s = strtod(text, &end);
    if (end == text || *end != '\0' || !(s >= 0 && s <= 86400)) {
        fprintf(stderr, "fsdp2run: FSDP2RUN_GRACE_SECONDS='%s' is not valid: expected seconds "
                "from 0 to 86400\n", text);
        return -1;
    }
    *grace_ms = (long)(s * 1000.0 + 0.5);
    return 0;
}

static void set_env_int(const char *name, long value)
{
    char text[24];
    snprintf(text, sizeof(text), "%ld", value);
    setenv(name, text, 1);
}

typedef struct omp_plan {
    int threads; /* OMP_NUM_THREADS, unless already set */
    int passive; /* OMP_WAIT_POLICY=PASSIVE, unless already set */
} omp_plan_t;

/* The child between fork and exec: its own session, the pipes as stdout/stderr, the
 * parent's signal set-up undone, the rank's environment, the binding. */
static void run_child(const options_t *o, const rank_proc_t *r, int out_w, int err_w,
                      int report_w, const sigset_t *old_mask, const fsdp2_topology_t *topo,
                      const char *master_addr, int master_port, const omp_plan_t *omp)
{
    setsid();
    /* the report pipe's write end stays open across exec, for the library */
    if (report_w >= 0 && fcntl(report_w, F_SETFD, 0) == 0)
        set_env_int("FSDP2_RUN_REPORT_FD", report_w);
    if (dup2(out_w, STDOUT_FILENO) < 0 || dup2(err_w, STDERR_FILENO) < 0)
        _exit(FSDP2RUN_EXIT_ERROR);
    if (r->local_rank != 0) {
        int null_fd = open("/dev/null", O_RDONLY);
        if (null_fd >= 0 && null_fd != STDIN_FILENO) {
            dup2(null_fd, STDIN_FILENO);
            close(null_fd);
        }
    }
    signal(SIGPIPE, SIG_DFL);
    sigprocmask(SIG_SETMASK, old_mask, NULL);

    set_env_int("RANK", r->rank);
    set_env_int("WORLD_SIZE", (long)o->nnodes * o->nproc_per_node);
    set_env_int("LOCAL_RANK", r->local_rank);
    set_env_int("LOCAL_WORLD_SIZE", o->nproc_per_node);
    set_env_int("GROUP_RANK", o->node_rank);
    set_env_int("GROUP_WORLD_SIZE", o->nnodes);
    setenv("MASTER_ADDR", master_addr, 1);
    set_env_int("MASTER_PORT", master_port);
    if (!getenv("OMP_NUM_THREADS"))
        set_env_int("OMP_NUM_THREADS", omp->threads);
    /* Where the ranks' OpenMP threads outnumber the usable CPUs, a thread that spins
     * between parallel regions holds a core another rank needs: there they sleep. Else
     * libgomp's default stands: a moment's spin, which keeps back-to-back small GEMMs
     * from waking sleeping threads each time. libgomp reads it once at load, so only the
     * environment can set it. */
    if (!getenv("OMP_WAIT_POLICY") && omp->passive)
        setenv("OMP_WAIT_POLICY", "PASSIVE", 1);

    /* Under --bind auto binding is a preference: a machine hwloc cannot bind on (a
     * synthetic or XML topology) runs the rank unbound. */
    if (topo && fsdp2_topology_bind_self(topo, r->local_rank, o->nproc_per_node, o->bind) !=
                    FSDP2_SUCCESS && !o->bind_auto) {
        fprintf(stderr, "fsdp2run: --bind %s failed: %s\n", fsdp2_bind_mode_name(o->bind),
                fsdp2_last_error());
        _exit(FSDP2RUN_EXIT_ERROR);
    }
    execvp(o->program[0], o->program);
    fprintf(stderr, "fsdp2run: cannot run '%s': %s\n", o->program[0], strerror(errno));
    _exit(errno == ENOENT ? 127 : 126);
}

/* OpenMP's threads per local rank (usable CPUs / N, at least 1; OpenBLAS reads
 * OMP_NUM_THREADS too), and whether the ranks' threads (the user's OMP_NUM_THREADS where
 * set, its first level) outnumber the usable CPUs. */
static omp_plan_t plan_omp(int nproc)
{
    cpu_set_t set;
    int cpus = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1;
    omp_plan_t p = {.threads = cpus / nproc > 1 ? cpus / nproc : 1};
    long threads = p.threads;
    const char *v = getenv("OMP_NUM_THREADS");
    char *end = NULL;
    long given = v ? strtol(v, &end, 10) : 0;
    if (v && end != v && given > 0 && (*end == '\0' || *end == ','))
        threads = given;
    p.passive = (long)nproc * threads > cpus;
    return p;
}

static int spawn_rank(const options_t *o, supervisor_t *sv, rank_proc_t *r, int report_w,
                      const sigset_t *old_mask, const fsdp2_topology_t *topo,
                      const char *master_addr, int master_port)
{
    int out[2] = {-1, -1}, err[2] = {-1, -1};
    r->streams[0] = (rank_stream_t){.fd = -1, .out_fd = STDOUT_FILENO};
    r->streams[1] = (rank_stream_t){.fd = -1, .out_fd = STDERR_FILENO};
    r->streams[0].buf = malloc(FSDP2RUN_LINE_MAX);
    r->streams[1].buf = malloc(FSDP2RUN_LINE_MAX);
    if (!r->streams[0].buf || !r->streams[1].buf) {
        fprintf(stderr, "fsdp2run: out of memory for rank %d's output buffers\n", r->rank);
        return -1;
    }
    if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) {
        fprintf(stderr, "fsdp2run: pipe for rank %d: %s\n", r->rank, strerror(errno));
        goto fail;
    }
    omp_plan_t omp = plan_omp(o->nproc_per_node);
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "fsdp2run: fork for rank %d: %s\n", r->rank, strerror(errno));
        goto fail;
    }
    if (pid == 0)
        run_child(o, r, out[1], err[1], report_w, old_mask, topo, master_addr, master_port,
                  &omp);
    close(out[1]);
    close(err[1]);
    fcntl(out[0], F_SETFL, O_NONBLOCK);
    fcntl(err[0], F_SETFL, O_NONBLOCK);
    r->streams[0].fd = out[0];
    r->streams[1].fd = err[0];
    r->pid = pid;
    r->running = 1;
    sv->running++;
    return 0;
fail:
    for (int k = 0; k < 2; k++) {
        if (out[k] >= 0)
            close(out[k]);
        if (err[k] >= 0)
            close(err[k]);
    }
    return -1;
}

/* FSDP2_STORE_SECRET for the ranks: 32 random bytes as hex, unless the user gave one;
 * on several nodes the user must (each node's fsdp2run would make another). */
static int job_secret(const options_t *o)
{
    const char *given = getenv("FSDP2_STORE_SECRET"), *file = getenv("FSDP2_STORE_SECRET_FILE");
    if ((given && given[0]) || (file && file[0]))
        return 0;
    if (o->nnodes > 1) {
        fprintf(stderr, "fsdp2run: warning: no FSDP2_STORE_SECRET or FSDP2_STORE_SECRET_FILE: "
                        "the rendezvous store will admit any client that reaches it; give "
                        "every node the same secret\n");
        return 0;
    }
    unsigned char bytes[32];
    size_t got = 0;
    while (got < sizeof(bytes)) {
        ssize_t n = getrandom(bytes + got, sizeof(bytes) - got, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            fprintf(stderr, "fsdp2run: getrandom: %s\n", strerror(errno));
            return -1;
        }
        got += (size_t)n;
    }
    char hex[2 * sizeof(bytes) + 1];
    for (size_t i = 0; i < sizeof(bytes); i++)
        snprintf(hex + 2 * i, 3, "%02x", bytes[i]);
    return setenv("FSDP2_STORE_SECRET", hex, 1);
}

static int launch(options_t *o)
{
    long grace_ms;
    if (grace_ms_from_env(&grace_ms) != 0)
        return FSDP2RUN_EXIT_USAGE;
    const char *master_addr = o->master_addr ? o->master_addr : "127.0.0.1";
    if (job_secret(o) != 0)
        return FSDP2RUN_EXIT_ERROR;
    int master_port = o->master_port ? o->master_port : pick_free_port();
    if (master_port <= 0) {
        fprintf(stderr, "fsdp2run: cannot find a free port: %s\n", strerror(errno));
        return FSDP2RUN_EXIT_ERROR;
    }
    fsdp2_topology_t *topo = NULL;
    /* --bind auto decides here, from the one topology the ranks are bound by
     * (fsdp2_topology_auto_bind); a machine hwloc cannot read, or a build without it,
     * runs the ranks unbound: topo stays NULL */
    if ((o->bind != FSDP2_BIND_NONE || o->bind_auto) &&
        fsdp2_topology_load(&topo) != FSDP2_SUCCESS && !o->bind_auto) {
        fprintf(stderr, "fsdp2run: --bind %s: %s\n", fsdp2_bind_mode_name(o->bind),
                fsdp2_last_error());
        return FSDP2RUN_EXIT_ERROR;
    }
    if (topo && o->bind_auto)
        fsdp2_topology_auto_bind(topo, o->nproc_per_node, &o->bind);

    /* Signals are read from a signalfd in the event loop, so they stay blocked from
     * here on (the children unblock them before exec). Blocking them before the first
     * fork means none is lost or handled half-way through starting the ranks. */
    sigset_t mask, old_mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGCHLD);
    sigaddset(&mask, SIGINT);
    sigaddset(&mask, SIGTERM);
    sigaddset(&mask, SIGHUP);
    sigprocmask(SIG_BLOCK, &mask, &old_mask);
    signal(SIGPIPE, SIG_IGN);

    supervisor_t sv = {.nranks = o->nproc_per_node, .grace_ms = grace_ms, .kill_at_ms = -1,
                       .report_fd = -1};
    /* Each rank says there whether its first failure was its own or a peer's echo. */
    int report[2] = {-1, -1};
    if (pipe2(report, O_CLOEXEC | O_NONBLOCK) == 0)
        sv.report_fd = report[0];
    sv.signal_fd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
    sv.ranks = calloc((size_t)sv.nranks, sizeof(*sv.ranks));
    int status = FSDP2RUN_EXIT_ERROR, reraise = 0;
    if (sv.signal_fd < 0 || !sv.ranks) {
        fprintf(stderr, "fsdp2run: cannot set up: %s\n", strerror(errno));
        goto cleanup;
    }
    for (int i = 0; i < sv.nranks; i++) {
        rank_proc_t *r = &sv.ranks[i];
        r->local_rank = i;
        r->rank = o->node_rank * o->nproc_per_node + i;
        if (spawn_rank(o, &sv, r, report[1], &old_mask, topo, master_addr, master_port) != 0) {
            /* Stop the ones already started, then collect them and their output. */
            sv.interrupted_by = 0;
            fsdp2run_signal_ranks(&sv, SIGKILL);
            sv.killed = 1;
            sv.nranks = i + 1;
            fsdp2run_supervise(&sv, &reraise);
            reraise = 0;
            goto cleanup;
        }
    }
    if (report[1] >= 0)
        close(report[1]);
    report[1] = -1;
    status = fsdp2run_supervise(&sv, &reraise);
cleanup:
    if (report[1] >= 0)
        close(report[1]);
    if (sv.report_fd >= 0)
        close(sv.report_fd);
    if (sv.ranks)
        for (int i = 0; i < o->nproc_per_node; i++)
            for (int k = 0; k < 2; k++)
                free(sv.ranks[i].streams[k].buf);
    free(sv.ranks);
    if (sv.signal_fd >= 0)
        close(sv.signal_fd);
    fsdp2_topology_destroy(topo);
    if (reraise) {
        /* Die of the signal we were stopped with, so that a calling shell or script
         * sees WIFSIGNALED and stops too (a Ctrl-C must stop the loop around us). */
        signal(reraise, SIG_DFL);
        sigprocmask(SIG_SETMASK, &old_mask, NULL);
        raise(reraise);
        sigset_t only;
        sigemptyset(&only);
        sigaddset(&only, reraise);
        sigprocmask(SIG_UNBLOCK, &only, NULL);
    }
    return status;
}

int main(int argc, char **argv)
{
    /* With fd 0, 1 or 2 closed, a pipe could land there and dup2 onto itself would keep
     * its close-on-exec flag. */
    for (int fd = 0; fd < 3; fd++)
        if (fcntl(fd, F_GETFD) < 0 && open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY) < 0)
            return FSDP2RUN_EXIT_ERROR;
    options_t o;
    int rc = parse_options(argc, argv, &o);
    if (rc != 0)
        return rc;
    if (o.topology)
        return print_topology();
    if (!o.nproc_per_node) {
        if (under_other_launcher())
            return exec_in_place(&o); /* auto: the launcher that started us binds */
        return usage_error("--nproc-per-node is required (unless started by mpirun, srun or "
                           "a PMI launcher)");
    }
    return launch(&o);
}
