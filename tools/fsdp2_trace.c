/* fsdp2-trace: check, summarise, draw and merge the timeline traces libfsdp2 writes
 * (docs/tracing.md).
 *
 *   fsdp2-trace check TRACE                                  is the file well formed?
 *   fsdp2-trace summary TRACE [--json] [--rank R] [--step N] overlap and memory per step
 *   fsdp2-trace svg TRACE -o OUT.svg [--step N] [--rank R]   one step as a picture
 *   fsdp2-trace merge -o OUT IN...                           per-rank files into one
 *
 * Exit status 0 on success; 1 with one line "fsdp2-trace: error: ..." naming the file
 * and the problem when a trace is bad or an output cannot be written; 2 for a wrong
 * command line. Output files appear whole or not at all (written to OUT.tmp, renamed). */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <fsdp2/status.h>
#include <fsdp2/trace.h>

#include "trace_model.h"

static const char usage_text[] =
    "usage: fsdp2-trace check TRACE\n"
    "       fsdp2-trace summary TRACE [--json] [--rank R] [--step N]\n"
    "       fsdp2-trace svg TRACE -o OUT.svg [--step N] [--rank R]\n"
    "       fsdp2-trace merge -o OUT IN...\n"
    "       fsdp2-trace --help\n";

static const char help_text[] =
    "\n"
    "check    validates TRACE (a Chrome trace-event JSON file written by libfsdp2):\n"
    "         slices with numeric pid/tid/ts/dur >= 0 and string name/cat, nested or\n"
    "         disjoint on each track; one 's' and one later 'f' per flow id; memory\n"
    "         counters with six non-negative categories. Prints the counts, or the first\n"
    "         problem with its event.\n"
    "summary  per rank and per step: step, compute and communication time, how much of\n"
    "         the communication hid behind compute and how much was exposed, per module\n"
    "         (all-gather, reduce-scatter + all-reduce), and the peak of memory in use with\n"
    "         its categories and the buffers that held it; then each rank's means.\n"
    "         --json prints one JSON object {\"steps\": [...]} instead; --rank and --step\n"
    "         keep one rank or one step.\n"
    "svg      draws one step (default: the highest step on every rank) of every rank, or of\n"
    "         --rank R: one lane per track, slices coloured by category, flow arrows and\n"
    "         the memory in use, as a standalone SVG file.\n"
    "merge    merges per-rank trace files (left by fsdp2_trace_stop when rank 0 could not\n"
    "         read them) into OUT, moving them onto the wall clock when they come from\n"
    "         several hosts.\n"
    "\n"
    "Exit status: 0 success, 1 bad trace or unwritable output, 2 wrong command line.\n";

enum { OPT_JSON = 1, OPT_RANK = 2, OPT_STEP = 4, OPT_OUTPUT = 8 };

typedef struct args {
    const char *command;
    const char **files;
    size_t n_files;
    const char *output;
    int json;
    trace_filter_t filter;
} args_t;

static int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int usage_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "fsdp2-trace: error: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n%s", usage_text);
    va_end(ap);
    return 2;
}

static int parse_integer(const char *option, const char *text, int64_t *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0')
        return usage_error("%s '%s' is not an integer", option, text);
    *out = v;
    return 0;
}

/* The options `allowed` of a command and its files; 0, or 2 after a usage message. */
static int parse_args(int argc, char **argv, int allowed, args_t *a)
{
    a->files = calloc((size_t)argc, sizeof(*a->files));
    if (a->files == NULL)
        return usage_error("out of memory");
    int only_files = 0;
    for (int i = 2; i < argc; i++) {
        const char *arg = argv[i];
        if (only_files || arg[0] != '-' || arg[1] == '\0') {
            a->files[a->n_files++] = arg;
            continue;
        }
        if (!strcmp(arg, "--")) {
            only_files = 1;
            continue;
        }
        size_t name_len = strcspn(arg, "=");
        const char *inline_value = arg[name_len] == '=' ? arg + name_len + 1 : NULL;
        char name[32];
        snprintf(name, sizeof(name), "%.*s", (int)(name_len < 31 ? name_len : 31), arg);
        int which = !strcmp(name, "--json") ? OPT_JSON : !strcmp(name, "--rank") ? OPT_RANK
                  : !strcmp(name, "--step") ? OPT_STEP
                  : !strcmp(name, "-o") || !strcmp(name, "--output") ? OPT_OUTPUT : 0;
        if (!(which & allowed))
            return usage_error("unknown option '%s' for %s", arg, a->command);
        if (which == OPT_JSON) {
            if (inline_value)
                return usage_error("--json takes no value");
            a->json = 1;
            continue;
        }
        const char *value = inline_value;
        if (value == NULL && (value = i + 1 < argc ? argv[++i] : NULL) == NULL)
            return usage_error("%s needs a value", name);
        if (which == OPT_OUTPUT) {
            a->output = value;
        } else if (which == OPT_RANK) {
            a->filter.has_rank = 1;
            if (parse_integer("--rank", value, &a->filter.rank))
                return 2;
        } else {
            a->filter.has_step = 1;
            if (parse_integer("--step", value, &a->filter.step))
                return 2;
        }
    }
    return 0;
}

static int report(const char *message)
{
    fprintf(stderr, "fsdp2-trace: error: %s\n", message);
    return 1;
}

/* data into path whole or not at all: written to path.tmp, flushed, renamed. */
static int write_file(const char *path, const char *data, size_t len)
{
    size_t n = strlen(path) + 5;
    char *tmp = malloc(n), message[1024];
    if (tmp == NULL)
        return report("out of memory");
    snprintf(tmp, n, "%s.tmp", path);
    const char *failed = NULL; /* the file of the step that failed, errno says why */
    FILE *f = fopen(tmp, "wb");
    if (f == NULL) {
        failed = tmp;
    } else {
        int ok = fwrite(data, 1, len, f) == len && fflush(f) == 0 && fsync(fileno(f)) == 0;
        int saved = errno;
        if (fclose(f) != 0 && ok)
            ok = 0, saved = errno;
        errno = saved;
        if (!ok)
            failed = tmp;
        else if (rename(tmp, path) != 0)
            failed = path;
    }
    if (failed != NULL) {
        snprintf(message, sizeof(message), "cannot write %s: %s", failed, strerror(errno));
        unlink(tmp);
    }
    free(tmp);
    return failed != NULL ? report(message) : 0;
}

static int load(const char *path, trace_model_t **model)
{
    char message[1024];
    if (trace_model_load(path, model, message, sizeof(message)) != 0)
        return report(message);
    return 0;
}

static int run_check(const args_t *a)
{
    if (a->n_files != 1)
        return usage_error("check takes one TRACE");
    trace_model_t *m;
    if (load(a->files[0], &m))
        return 1;
    printf("ok: %zu slices, %zu flows, %zu counters, %zu ranks\n", m->n_slices, m->n_flows,
           m->n_counters, m->n_ranks);
    trace_model_free(m);
    return 0;
}

static int run_summary(const args_t *a)
{
    if (a->n_files != 1)
        return usage_error("summary takes one TRACE");
    trace_model_t *m;
    if (load(a->files[0], &m))
        return 1;
    char message[1024];
    int rc = trace_summary_write(m, &a->filter, a->json, stdout, message, sizeof(message));
    trace_model_free(m);
    if (rc != 0)
        return report(message);
    if (fflush(stdout) != 0 || ferror(stdout)) {
        snprintf(message, sizeof(message), "cannot write the summary: %s", strerror(errno));
        return report(message);
    }
    return 0;
}

static int run_svg(const args_t *a)
{
    if (a->n_files != 1)
        return usage_error("svg takes one TRACE");
    if (a->output == NULL)
        return usage_error("svg needs -o OUT.svg");
    trace_model_t *m;
    if (load(a->files[0], &m))
        return 1;
    /* the whole picture in memory first: nothing is written when drawing fails */
    char *data = NULL, message[1024] = "out of memory";
    size_t len = 0;
    const char *slash = strrchr(a->files[0], '/');
    FILE *f = open_memstream(&data, &len);
    int rc = -1;
    if (f != NULL) {
        rc = trace_svg_write(m, &a->filter, slash ? slash + 1 : a->files[0], f, message,
                             sizeof(message));
        if (fclose(f) != 0 && rc == 0) {
            snprintf(message, sizeof(message), "out of memory");
            rc = -1;
        }
    }
    trace_model_free(m);
    rc = rc == 0 ? write_file(a->output, data, len) : report(message);
    free(data);
    return rc;
}

static int run_merge(const args_t *a)
{
    if (a->output == NULL || a->n_files == 0)
        return usage_error("merge needs -o OUT and at least one IN");
    fsdp2_status_t s = fsdp2_trace_merge(a->files, a->n_files, a->output);
    if (s != FSDP2_SUCCESS) {
        fprintf(stderr, "fsdp2-trace: error: merge into %s: %s: %s\n", a->output,
                fsdp2_status_name(s), fsdp2_last_error());
        return 1;
    }
    printf("%zu file%s -> %s\n", a->n_files, a->n_files == 1 ? "" : "s", a->output);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") ||
                      !strcmp(argv[1], "help"))) {
        printf("%s%s", usage_text, help_text);
        return 0;
    }
    if (argc < 2)
        return usage_error("no command");
    static const struct {
        const char *name;
        int options;
        int (*run)(const args_t *);
    } commands[] = {
        {"check", 0, run_check},
        {"summary", OPT_JSON | OPT_RANK | OPT_STEP, run_summary},
        {"svg", OPT_OUTPUT | OPT_RANK | OPT_STEP, run_svg},
        {"merge", OPT_OUTPUT, run_merge},
    };
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++) {
        if (strcmp(argv[1], commands[i].name) != 0)
            continue;
        args_t a = {.command = commands[i].name};
        int rc = parse_args(argc, argv, commands[i].options, &a);
        if (rc == 0)
            rc = commands[i].run(&a);
        free(a.files);
        return rc;
    }
    return usage_error("unknown command '%s'", argv[1]);
}
