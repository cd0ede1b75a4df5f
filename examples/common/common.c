/* The helpers both example programs share (common.h). */
#include <math.h>
#include <sched.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common.h"

double example_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- the command line ---- */

/* Parses text as an integer in lo..hi; 0 with the message printed when it is not. */
static int parse_number(const char *flag, const char *text, long lo, long hi, long *v)
{
    char *end;
    *v = strtol(text, &end, 10);
    if (!*text || *end || *v < lo || *v > hi) {
        fprintf(stderr, "error: %s %s is not an integer in %ld..%ld\n", flag, text, lo, hi);
        return 0;
    }
    return 1;
}

static int parse_real(const char *flag, const char *text, double *v)
{
    char *end;
    *v = strtod(text, &end);
    if (!*text || *end || !(*v >= 0) || !isfinite(*v)) {
        fprintf(stderr, "error: %s %s is not a non-negative number\n", flag, text);
        return 0;
    }
    return 1;
}

long example_number(const char *flag, const char *text, long lo, long hi)
{
    long v;
    if (!parse_number(flag, text, lo, hi, &v))
        exit(2);
    return v;
}

double example_real(const char *flag, const char *text)
{
    double v;
    if (!parse_real(flag, text, &v))
        exit(2);
    return v;
}

static const example_flag_t *find_flag(const example_flag_t *flags, const char *name)
{
    for (const example_flag_t *f = flags; f->name; f++)
        if (!strcmp(f->name, name))
            return f;
    return NULL;
}

/* A value the flag's kind refuses: its message is printed; the usage follows if asked. */
static void bad_value(const char *prog, const example_cli_t *cli)
{
    if (cli->usage_after_bad_value)
        cli->usage(prog, NULL);
    exit(2);
}

void example_parse_flags(int argc, char **argv, const example_flag_t *flags,
                         const example_cli_t *cli)
{
    for (int i = 1; i < argc; i++) {
        const char *name = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        const example_flag_t *f = find_flag(flags, name);
        if (f && f->kind == EXAMPLE_SWITCH) {
            *(int *)f->to = 1;
            if (f->given)
                *f->given = 1;
            continue;
        }
        if (!strcmp(name, "--help") || !strcmp(name, "-h"))
            cli->usage(argv[0], NULL);
        if (!v || !f)
            cli->usage(argv[0], name);
        i++;
        long n;
        double x;
        switch (f->kind) {
        case EXAMPLE_STRING:
            *(const char **)f->to = v;
            break;
        case EXAMPLE_INT:
        case EXAMPLE_LONG:
            if (!parse_number(name, v, f->lo, f->hi, &n))
                bad_value(argv[0], cli);
            if (f->kind == EXAMPLE_INT)
                *(int *)f->to = (int)n;
            else
                *(long *)f->to = n;
            break;
        case EXAMPLE_REAL:
            if (!parse_real(name, v, &x))
                bad_value(argv[0], cli);
            *(double *)f->to = x;
            break;
        case EXAMPLE_CALL:
            f->call(v, f->to);
            break;
        case EXAMPLE_SWITCH:
            break;
        }
        if (f->given)
            *f->given = 1;
    }
}

/* ---- the rank's share of the host ---- */

int example_threads_for(int bound_cpus, long online_cpus, int local_ranks)
{
    if (bound_cpus > 0 && bound_cpus < online_cpus) /* a launcher bound this rank */
        return bound_cpus;
    long share = online_cpus / (local_ranks > 0 ? local_ranks : 1);
    return share > 1 ? (int)share : 1;
}

int example_threads(int local_ranks)
{
    cpu_set_t set;
    int bound = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 0;
    return example_threads_for(bound, sysconf(_SC_NPROCESSORS_ONLN), local_ranks);
}

/* ---- the layout ---- */

void example_mesh(fsdp2_context_t *ctx, int no_shard, int hsdp, fsdp2_mesh_t **mesh)
{
    if (no_shard)
        CHECK(fsdp2_context_hsdp_mesh(ctx, 1, mesh));
    else if (hsdp) /* shard within a node, replicate across nodes */
        CHECK(fsdp2_context_hsdp_mesh(ctx, 0, mesh));
    else
        CHECK(fsdp2_context_mesh(ctx, mesh));
}

void example_world_sum(fsdp2_group_t *world, fsdp2_stream_t *current, double *v, int n)
{
    CHECK(fsdp2_all_reduce_async(world, v, (size_t)n, FSDP2_F64, NULL, current));
    CHECK(fsdp2_stream_synchronize(current));
}
