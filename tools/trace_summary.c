/* fsdp2-trace summary: per rank and per step, how much communication hid behind compute,
 * per module, and what held memory at the step's peak.
 *
 * The definitions (the tests check them against hand-computed fixtures):
 * - A step is a `step` slice; an operation belongs to step N when its args.step is N,
 *   or, without args.step, when it starts inside the step's window [ts, ts + dur)
 *   (windows do not overlap; if they did, the latest-starting one would take it).
 * - C, the compute of a rank, is the union of its forward/backward/optimizer/user
 *   slices on every track, minus its `wait` slices (the thread blocked on an event
 *   inside an enclosing module's forward is not computing). A collective is hidden
 *   where it lies inside C.
 * - Per module: all_gather slices, reduce_scatter + all_reduce slices, and the sum over
 *   them of |slice ∩ C|. Per step: U, the union of the step's collectives (broadcast and
 *   barrier too), |U|, |U ∩ C| and |C ∩ window|.
 * - Peak memory: the largest total of the counter in effect (the last one at or before
 *   the moment) over the window, and the memory slices that contain that moment. */
#include "trace_model.h"

#include <cjson/cJSON.h>

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* Formats into a local `char size[32]`. */
#define BYTES(bytes) trace_format_bytes((bytes), size, sizeof(size))

typedef struct interval {
    double a, b;
} interval_t;

typedef struct module_report {
    const char *module; /* NULL: collectives without args.module */
    double first_ts, all_gather_us, reduce_scatter_us, hidden_us;
} module_report_t;

typedef struct step_report {
    const trace_step_t *step;
    double compute_us, comm_us, hidden_us;
    const trace_counter_t *peak; /* NULL: no counter in effect in the window */
    double peak_ts;
    const trace_slice_t **holders;
    size_t n_holders;
    module_report_t *modules;
    size_t n_modules;
} step_report_t;

/* Everything the summary of the selected ranks needs; freed by report_free. */
typedef struct report {
    const trace_model_t *m;
    step_report_t *steps;
    size_t n_steps;
    const trace_rank_t **ranks;
    size_t n_ranks;
} report_t;

static int is_compute(const char *cat)
{
    return !strcmp(cat, "forward") || !strcmp(cat, "backward") || !strcmp(cat, "optimizer") ||
           !strcmp(cat, "user");
}

static int is_module_collective(const char *cat)
{
    return !strcmp(cat, "all_gather") || !strcmp(cat, "reduce_scatter") ||
           !strcmp(cat, "all_reduce");
}

static int is_collective(const char *cat)
{
    return is_module_collective(cat) || !strcmp(cat, "broadcast") || !strcmp(cat, "barrier");
}

/* ---- interval sets ----------------------------------------------------------------- */

static int compare_intervals(const void *x, const void *y)
{
    const interval_t *a = x, *b = y;
    return a->a < b->a ? -1 : a->a > b->a;
}

/* Sorts v and joins what overlaps or touches, in place; the new count. */
static size_t merge_intervals(interval_t *v, size_t n)
{
    if (n == 0)
        return 0;
    qsort(v, n, sizeof(*v), compare_intervals);
    size_t out = 0;
    for (size_t i = 1; i < n; i++) {
        if (v[i].a <= v[out].b)
            v[out].b = v[i].b > v[out].b ? v[i].b : v[out].b;
        else
            v[++out] = v[i];
    }
    return out + 1;
}

/* Merged set c minus merged set w, into out (room for nc + nw intervals). */
static size_t subtract_intervals(const interval_t *c, size_t nc, const interval_t *w, size_t nw,
                                 interval_t *out)
{
    size_t n = 0, j = 0;
    for (size_t i = 0; i < nc; i++) {
        double a = c[i].a, b = c[i].b;
        while (j < nw && w[j].b <= a)
            j++;
        for (size_t k = j; k < nw && w[k].a < b; k++) {
            if (w[k].a > a)
                out[n++] = (interval_t){a, w[k].a};
            if (w[k].b > a)
                a = w[k].b;
        }
        if (a < b)
            out[n++] = (interval_t){a, b};
    }
    return n;
}

/* |set ∩ [a, b]| for a merged set. */
static double measure_within(const interval_t *set, size_t n, double a, double b)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (set[mid].b <= a)
            lo = mid + 1;
        else
            hi = mid;
    }
    double sum = 0;
    for (size_t i = lo; i < n && set[i].a < b; i++)
        sum += (set[i].b < b ? set[i].b : b) - (set[i].a > a ? set[i].a : a);
    return sum;
}

static double measure(const interval_t *set, size_t n)
{
    double sum = 0;
    for (size_t i = 0; i < n; i++)
        sum += set[i].b - set[i].a;
    return sum;
}

/* ---- one rank ---------------------------------------------------------------------- */

/* Of a rank: C, and the slices a step counts (collectives, compute slices of a module)
 * bucketed by the step they belong to: those of the rank's k-th step (by number) are
 * slices[start[k] .. start[k + 1]). One pass over the rank, not one per step. */
typedef struct rank_view {
    const trace_slice_t **slices;
    size_t *start;
    interval_t *compute;
    size_t n_compute;
} rank_view_t;

typedef struct window {
    double ts, end;
    size_t step;
} window_t;

static int compare_windows(const void *x, const void *y)
{
    const window_t *a = x, *b = y;
    return a->ts < b->ts ? -1 : a->ts > b->ts;
}

static int counts_for_steps(const trace_slice_t *s)
{
    return is_collective(s->cat) || (is_compute(s->cat) && s->module != NULL);
}

/* The index among the rank's steps of the step s belongs to: args.step, else the
 * (latest-starting) step whose window [ts, ts + dur) holds its start. SIZE_MAX: none. */
static size_t owner(const trace_step_t *steps, size_t n, const window_t *by_ts,
                    const trace_slice_t *s)
{
    size_t lo = 0, hi = n;
    if (s->has_step) {
        while (lo < hi) {
            size_t mid = (lo + hi) / 2;
            if (steps[mid].step < s->step)
                lo = mid + 1;
            else
                hi = mid;
        }
        return lo < n && steps[lo].step == s->step ? lo : SIZE_MAX;
    }
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (by_ts[mid].ts <= s->ts)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo > 0 && s->ts < by_ts[lo - 1].end ? by_ts[lo - 1].step : SIZE_MAX;
}

static int rank_view_init(const trace_model_t *m, const trace_rank_t *r, rank_view_t *v)
{
    const trace_step_t *steps = &m->steps[r->first_step];
    size_t n = 0;
    for (size_t t = 0; t < r->n_tracks; t++)
        n += m->tracks[r->tracks[t]].n_slices;
    v->slices = malloc((n + 1) * sizeof(*v->slices));
    v->compute = malloc((n + 1) * sizeof(*v->compute));
    interval_t *waits = malloc((n + 1) * sizeof(*waits)), *busy = malloc((2 * n + 1) * sizeof(*busy));
    size_t n_waits = 0;
    v->start = calloc(r->n_steps + 2, sizeof(*v->start));
    v->n_compute = 0;
    size_t *owners = malloc((n + 1) * sizeof(*owners));
    window_t *by_ts = malloc((r->n_steps + 1) * sizeof(*by_ts));
    int rc = -1;
    if (v->slices && v->compute && v->start && owners && by_ts && waits && busy) {
        for (size_t k = 0; k < r->n_steps; k++)
            by_ts[k] = (window_t){steps[k].ts, steps[k].ts + steps[k].dur, k};
        if (r->n_steps > 1)
            qsort(by_ts, r->n_steps, sizeof(*by_ts), compare_windows);
        /* counts at start[k + 2], then sums: start[k + 1] is where bucket k fills from,
         * and once filled, where it ends */
        for (size_t t = 0, i = 0; t < r->n_tracks; t++) {
            const trace_track_t *track = &m->tracks[r->tracks[t]];
            for (size_t j = 0; j < track->n_slices; j++, i++) {
                const trace_slice_t *s = &m->slices[track->first_slice + j];
                if (is_compute(s->cat))
                    v->compute[v->n_compute++] = (interval_t){s->ts, s->ts + s->dur};
                else if (!strcmp(s->cat, "wait"))
                    waits[n_waits++] = (interval_t){s->ts, s->ts + s->dur};
                owners[i] = counts_for_steps(s) ? owner(steps, r->n_steps, by_ts, s) : SIZE_MAX;
                if (owners[i] != SIZE_MAX)
                    v->start[owners[i] + 2]++;
            }
        }
        for (size_t k = 2; k < r->n_steps + 2; k++)
            v->start[k] += v->start[k - 1];
        for (size_t t = 0, i = 0; t < r->n_tracks; t++) {
            const trace_track_t *track = &m->tracks[r->tracks[t]];
            for (size_t j = 0; j < track->n_slices; j++, i++)
                if (owners[i] != SIZE_MAX)
                    v->slices[v->start[owners[i] + 1]++] = &m->slices[track->first_slice + j];
        }
        v->n_compute = merge_intervals(v->compute, v->n_compute);
        n_waits = merge_intervals(waits, n_waits);
        size_t nb = subtract_intervals(v->compute, v->n_compute, waits, n_waits, busy);
        interval_t *fit = realloc(v->compute, (nb + 1) * sizeof(*fit));
        if (fit) {
            memcpy(fit, busy, nb * sizeof(*fit));
            v->compute = fit;
            v->n_compute = nb;
            rc = 0;
        }
    }
    free(waits);
    free(busy);
    free(owners);
    free(by_ts);
    return rc;
}

static void rank_view_free(rank_view_t *v)
{
    free(v->slices);
    free(v->start);
    free(v->compute);
}

static int compare_modules(const void *x, const void *y)
{
    const module_report_t *a = x, *b = y;
    if (a->module == NULL || b->module == NULL)
        return (a->module != NULL) - (b->module != NULL);
    return strcmp(a->module, b->module);
}

static int compare_module_order(const void *x, const void *y)
{
    const module_report_t *a = x, *b = y;
    if (a->first_ts != b->first_ts)
        return a->first_ts < b->first_ts ? -1 : 1;
    return compare_modules(a, b);
}

/* One row per module with a compute slice or a collective in the step, in the order the
 * modules first ran (the model's order, usually); collectives without a module make the
 * row of module NULL. */
static int step_modules(const rank_view_t *v, size_t k, step_report_t *out)
{
    const trace_slice_t *const *bucket = &v->slices[v->start[k]];
    size_t n_bucket = v->start[k + 1] - v->start[k];
    module_report_t *rows = malloc((n_bucket + 1) * sizeof(*rows));
    if (rows == NULL)
        return -1;
    size_t n = 0;
    for (size_t i = 0; i < n_bucket; i++) {
        const trace_slice_t *s = bucket[i];
        int collective = is_module_collective(s->cat);
        if (!collective && s->module == NULL) /* broadcast, barrier */
            continue;
        module_report_t r = {.module = s->module, .first_ts = s->ts};
        if (collective) {
            double *sum = !strcmp(s->cat, "all_gather") ? &r.all_gather_us : &r.reduce_scatter_us;
            *sum = s->dur;
            r.hidden_us = fmin(measure_within(v->compute, v->n_compute, s->ts, s->ts + s->dur),
                               s->dur);
        }
        if (collective || is_compute(s->cat))
            rows[n++] = r;
    }
    if (n > 1)
        qsort(rows, n, sizeof(*rows), compare_modules);
    size_t groups = 0;
    for (size_t i = 0; i < n; i++) {
        if (groups > 0 && compare_modules(&rows[groups - 1], &rows[i]) == 0) {
            module_report_t *g = &rows[groups - 1];
            g->first_ts = rows[i].first_ts < g->first_ts ? rows[i].first_ts : g->first_ts;
            g->all_gather_us += rows[i].all_gather_us;
            g->reduce_scatter_us += rows[i].reduce_scatter_us;
            g->hidden_us += rows[i].hidden_us;
        } else {
            rows[groups++] = rows[i];
        }
    }
    if (groups > 1)
        qsort(rows, groups, sizeof(*rows), compare_module_order);
    out->modules = rows;
    out->n_modules = groups;
    return 0;
}

/* The memory slices containing the peak's moment, track by track in display order. On
 * a track the slices containing a moment are a chain of ancestors, all after the last
 * top-level slice that starts before it: the walk back stops there. */
static int step_peak(const trace_model_t *m, const trace_rank_t *r, step_report_t *out)
{
    const trace_step_t *step = out->step;
    out->peak = trace_memory_peak(m, r, step->ts, step->ts + step->dur, &out->peak_ts);
    if (out->peak == NULL)
        return 0;
    double t = out->peak_ts + TRACE_EPSILON_US;
    size_t cap = 0;
    for (size_t k = 0; k < r->n_tracks; k++) {
        const trace_track_t *track = &m->tracks[r->tracks[k]];
        const trace_slice_t *v = &m->slices[track->first_slice];
        size_t lo = 0, hi = track->n_slices, first = out->n_holders;
        while (lo < hi) {
            size_t mid = (lo + hi) / 2;
            if (v[mid].ts <= t)
                lo = mid + 1;
            else
                hi = mid;
        }
        for (size_t i = lo; i-- > 0;) {
            if (v[i].ts + v[i].dur > t && !strcmp(v[i].cat, "memory")) {
                if (out->n_holders == cap) {
                    cap = cap ? 2 * cap : 8;
                    const trace_slice_t **h = realloc(out->holders, cap * sizeof(*h));
                    if (h == NULL)
                        return -1;
                    out->holders = h;
                }
                out->holders[out->n_holders++] = &v[i];
            }
            if (v[i].depth == 0)
                break;
        }
        for (size_t a = first, b = out->n_holders; a + 1 < b; a++, b--) {
            const trace_slice_t *x = out->holders[a];
            out->holders[a] = out->holders[b - 1];
            out->holders[b - 1] = x;
        }
    }
    return 0;
}

/* The k-th step of the rank. */
static int step_report(const rank_view_t *v, const trace_model_t *m, const trace_rank_t *r,
                       size_t k, step_report_t *out)
{
    const trace_step_t *step = out->step;
    size_t n_bucket = v->start[k + 1] - v->start[k], n = 0;
    interval_t *u = malloc((n_bucket + 1) * sizeof(*u));
    if (u == NULL)
        return -1;
    for (size_t i = 0; i < n_bucket; i++) {
        const trace_slice_t *s = v->slices[v->start[k] + i];
        if (is_collective(s->cat))
            u[n++] = (interval_t){s->ts, s->ts + s->dur};
    }
    n = merge_intervals(u, n);
    out->comm_us = measure(u, n);
    out->hidden_us = 0;
    for (size_t i = 0; i < n; i++)
        out->hidden_us += measure_within(v->compute, v->n_compute, u[i].a, u[i].b);
    out->hidden_us = fmin(out->hidden_us, out->comm_us); /* not above by rounding */
    free(u);
    out->compute_us = measure_within(v->compute, v->n_compute, step->ts, step->ts + step->dur);
    if (step_modules(v, k, out) || step_peak(m, r, out))
        return -1;
    return 0;
}

/* ---- selecting and computing --------------------------------------------------------- */

static void report_free(report_t *rep)
{
    for (size_t i = 0; i < rep->n_steps; i++) {
        free(rep->steps[i].holders);
        free(rep->steps[i].modules);
    }
    free(rep->steps);
    free(rep->ranks);
}


static int report_build(const trace_model_t *m, const trace_filter_t *filter, report_t *rep,
                        char *error, size_t error_len)
{
    *rep = (report_t){.m = m};
    rep->ranks = malloc((m->n_ranks + 1) * sizeof(*rep->ranks));
    rep->steps = calloc(m->n_steps + 1, sizeof(*rep->steps));
    if (rep->ranks == NULL || rep->steps == NULL)
        return trace_fail(error, error_len, "%s: out of memory", m->path);
    int n = trace_select_ranks(m, filter, rep->ranks, error, error_len);
    if (n < 0)
        return -1;
    rep->n_ranks = (size_t)n;
    for (size_t i = 0; i < rep->n_ranks; i++) {
        const trace_rank_t *r = rep->ranks[i];
        for (size_t k = 0; k < r->n_steps; k++) {
            const trace_step_t *step = &m->steps[r->first_step + k];
            if (!filter->has_step || step->step == filter->step)
                rep->steps[rep->n_steps++].step = step;
        }
    }
    if (rep->n_steps == 0 && filter->has_step)
        return trace_fail(error, error_len, "%s: no step %lld in the trace%s", m->path,
                    (long long)filter->step, filter->has_rank ? " on that rank" : "");
    if (rep->n_steps == 0)
        return trace_fail(error, error_len, "%s: no step slices (cat \"step\") to summarise",
                    m->path);
    size_t s = 0;
    for (size_t i = 0; i < rep->n_ranks; i++) {
        const trace_rank_t *r = rep->ranks[i];
        rank_view_t v;
        int rc = rank_view_init(m, r, &v);
        for (; rc == 0 && s < rep->n_steps && rep->steps[s].step->pid == r->pid; s++)
            rc = step_report(&v, m, r, (size_t)(rep->steps[s].step - &m->steps[r->first_step]),
                             &rep->steps[s]);
        rank_view_free(&v);
        if (rc)
            return trace_fail(error, error_len, "%s: out of memory", m->path);
    }
    return 0;
}

/* ---- text -------------------------------------------------------------------------- */

static const char *module_label(const char *module)
{
    return module == NULL ? "(no module)" : module[0] == '\0' ? "(root)" : module;
}

static void print_overlap(FILE *out, double hidden, double comm, int width)
{
    if (comm > 0)
        fprintf(out, "%*.1f%s", width, 100.0 * hidden / comm, width ? "" : "%");
    else
        fprintf(out, "%*s", width, "-");
}

static void print_totals(FILE *out, double step, double compute, double comm, double hidden)
{
    fprintf(out, "step %.3f ms, compute %.3f ms, communication %.3f ms (hidden ", step / 1e3,
            compute / 1e3, comm / 1e3);
    print_overlap(out, hidden, comm, 0);
    fprintf(out, ", exposed %.3f ms)", (comm - hidden) / 1e3);
}

static void print_peak(FILE *out, const trace_model_t *m, const step_report_t *s)
{
    if (s->peak == NULL) {
        fprintf(out, "  no memory counter in effect during the step\n");
        return;
    }
    char size[32];
    fprintf(out, "  peak %s at +%.3f ms:", BYTES(trace_counter_total(s->peak)),
            (s->peak_ts - s->step->ts) / 1e3);
    const char *sep = " ";
    for (int k = 0; k < TRACE_MEMORY_CATEGORIES; k++) {
        if (s->peak->bytes[k] > 0) {
            fprintf(out, "%s%s %s", sep, trace_memory_category_names[k],
                    BYTES(s->peak->bytes[k]));
            sep = ", ";
        }
    }
    fprintf(out, s->n_holders ? "; held by" : "; no buffer slice holds memory then");
    for (size_t i = 0; i < s->n_holders; i++) {
        const trace_slice_t *h = s->holders[i];
        char buf[64], name[160], track[160];
        fprintf(out, "%s %s (%s", i ? "," : "", trace_printable(module_label(h->name), name,
                sizeof(name), 120), trace_printable(trace_track_label(&m->tracks[h->track],
                buf, sizeof(buf)), track, sizeof(track), 120));
        if (h->has_bytes)
            fprintf(out, ", %s", BYTES(h->bytes));
        if (h->memory_category)
            fprintf(out, " %s", trace_printable(h->memory_category, name, sizeof(name), 60));
        fprintf(out, ")");
    }
    fprintf(out, "\n");
}

static void print_modules(FILE *out, const step_report_t *s)
{
    if (s->n_modules == 0) {
        fprintf(out, "  no module ran in the step\n");
        return;
    }
    char name[256];
    int width = 6;
    for (size_t i = 0; i < s->n_modules; i++) {
        int len = (int)strlen(trace_printable(module_label(s->modules[i].module), name,
                                              sizeof(name), 200));
        width = len > width ? len : width;
    }
    fprintf(out, "  %-*s  %13s  %17s  %9s  %10s\n", width, "module", "all-gather ms",
            "reduce-scatter ms", "overlap %", "exposed ms");
    for (size_t i = 0; i < s->n_modules; i++) {
        const module_report_t *r = &s->modules[i];
        double comm = r->all_gather_us + r->reduce_scatter_us;
        fprintf(out, "  %-*s  %13.3f  %17.3f  ", width,
                trace_printable(module_label(r->module), name, sizeof(name), 200),
                r->all_gather_us / 1e3, r->reduce_scatter_us / 1e3);
        print_overlap(out, r->hidden_us, comm, 9);
        fprintf(out, "  %10.3f\n", (comm - r->hidden_us) / 1e3);
    }
}

static void print_text(const report_t *rep, FILE *out)
{
    for (size_t i = 0; i < rep->n_steps; i++) {
        const step_report_t *s = &rep->steps[i];
        fprintf(out, "%srank %lld step %lld: ", i ? "\n" : "", (long long)s->step->pid,
                (long long)s->step->step);
        print_totals(out, s->step->dur, s->compute_us, s->comm_us, s->hidden_us);
        char size[32];
        if (s->peak)
            fprintf(out, ", peak memory %s\n", BYTES(trace_counter_total(s->peak)));
        else
            fprintf(out, ", peak memory -\n");
        print_modules(out, s);
        print_peak(out, rep->m, s);
    }
    fprintf(out, "\n");
    for (size_t r = 0; r < rep->n_ranks; r++) {
        double step = 0, compute = 0, comm = 0, hidden = 0, peak_sum = 0, peak_max = 0;
        size_t n = 0, n_peaks = 0;
        for (size_t i = 0; i < rep->n_steps; i++) {
            const step_report_t *s = &rep->steps[i];
            if (s->step->pid != rep->ranks[r]->pid)
                continue;
            n++;
            step += s->step->dur, compute += s->compute_us, comm += s->comm_us;
            hidden += s->hidden_us;
            if (s->peak) {
                double total = trace_counter_total(s->peak);
                n_peaks++;
                peak_sum += total;
                peak_max = total > peak_max ? total : peak_max;
            }
        }
        if (n == 0)
            continue;
        fprintf(out, "rank %lld, mean of %zu step%s: ", (long long)rep->ranks[r]->pid, n,
                n == 1 ? "" : "s");
        print_totals(out, step / n, compute / n, comm / n, hidden / n);
        char size[32], max[32];
        if (n_peaks)
            fprintf(out, ", peak memory mean %s, max %s\n", BYTES(peak_sum / n_peaks),
                    trace_format_bytes(peak_max, max, sizeof(max)));
        else
            fprintf(out, ", peak memory -\n");
    }
}

/* ---- JSON -------------------------------------------------------------------------- */

/* Milliseconds to the nanosecond and percentages to 1e-6, so that the numbers print
 * short instead of with binary noise in the 17th digit. */
static double ms(double us)
{
    return round(us * 1e3) / 1e6;
}

static cJSON *number_or_null(double numerator, double denominator)
{
    if (denominator > 0)
        return cJSON_CreateNumber(round(1e8 * numerator / denominator) / 1e6);
    return cJSON_CreateNull();
}

/* cJSON's adders return NULL when out of memory; ok remembers that any failed. */
static void add(cJSON *object, const char *key, cJSON *value, int *ok)
{
    if (value == NULL || !cJSON_AddItemToObject(object, key, value)) {
        cJSON_Delete(value);
        *ok = 0;
    }
}

static cJSON *json_peak(const trace_model_t *m, const step_report_t *s, int *ok)
{
    if (s->peak == NULL)
        return cJSON_CreateNull();
    cJSON *peak = cJSON_CreateObject(), *cats = cJSON_CreateObject();
    cJSON *holders = cJSON_CreateArray();
    add(peak, "bytes", cJSON_CreateNumber(trace_counter_total(s->peak)), ok);
    add(peak, "ts_us", cJSON_CreateNumber(s->peak_ts), ok);
    for (int k = 0; k < TRACE_MEMORY_CATEGORIES; k++)
        add(cats, trace_memory_category_names[k], cJSON_CreateNumber(s->peak->bytes[k]), ok);
    add(peak, "categories", cats, ok);
    for (size_t i = 0; i < s->n_holders; i++) {
        const trace_slice_t *h = s->holders[i];
        cJSON *o = cJSON_CreateObject();
        char buf[64];
        add(o, "module", cJSON_CreateString(h->name), ok);
        add(o, "bytes", h->has_bytes ? cJSON_CreateNumber(h->bytes) : cJSON_CreateNull(), ok);
        add(o, "category", h->memory_category ? cJSON_CreateString(h->memory_category)
                                              : cJSON_CreateNull(), ok);
        add(o, "track", cJSON_CreateString(trace_track_label(&m->tracks[h->track], buf,
                                                             sizeof(buf))), ok);
        if (o == NULL || !cJSON_AddItemToArray(holders, o))
            *ok = 0;
    }
    add(peak, "holders", holders, ok);
    return peak;
}

static cJSON *json_step(const trace_model_t *m, const step_report_t *s, int *ok)
{
    cJSON *o = cJSON_CreateObject(), *modules = cJSON_CreateArray();
    add(o, "rank", cJSON_CreateNumber((double)s->step->pid), ok);
    add(o, "step", cJSON_CreateNumber((double)s->step->step), ok);
    add(o, "step_ms", cJSON_CreateNumber(ms(s->step->dur)), ok);
    add(o, "compute_ms", cJSON_CreateNumber(ms(s->compute_us)), ok);
    add(o, "comm_ms", cJSON_CreateNumber(ms(s->comm_us)), ok);
    add(o, "hidden_ms", cJSON_CreateNumber(ms(s->hidden_us)), ok);
    add(o, "exposed_ms", cJSON_CreateNumber(ms(s->comm_us - s->hidden_us)), ok);
    add(o, "overlap_pct", number_or_null(s->hidden_us, s->comm_us), ok);
    add(o, "peak", json_peak(m, s, ok), ok);
    for (size_t i = 0; i < s->n_modules; i++) {
        const module_report_t *r = &s->modules[i];
        double comm = r->all_gather_us + r->reduce_scatter_us;
        cJSON *row = cJSON_CreateObject();
        add(row, "module", r->module ? cJSON_CreateString(r->module) : cJSON_CreateNull(), ok);
        add(row, "all_gather_ms", cJSON_CreateNumber(ms(r->all_gather_us)), ok);
        add(row, "reduce_scatter_ms", cJSON_CreateNumber(ms(r->reduce_scatter_us)), ok);
        add(row, "hidden_ms", cJSON_CreateNumber(ms(r->hidden_us)), ok);
        add(row, "exposed_ms", cJSON_CreateNumber(ms(comm - r->hidden_us)), ok);
        add(row, "overlap_pct", number_or_null(r->hidden_us, comm), ok);
        if (row == NULL || !cJSON_AddItemToArray(modules, row))
            *ok = 0;
    }
    add(o, "modules", modules, ok);
    return o;
}

static int print_json(const report_t *rep, FILE *out)
{
    int ok = 1;
    cJSON *root = cJSON_CreateObject(), *steps = cJSON_CreateArray();
    for (size_t i = 0; i < rep->n_steps; i++) {
        cJSON *o = json_step(rep->m, &rep->steps[i], &ok);
        if (o == NULL || !cJSON_AddItemToArray(steps, o))
            ok = 0;
    }
    add(root, "steps", steps, &ok);
    char *text = ok ? cJSON_Print(root) : NULL;
    cJSON_Delete(root);
    if (text == NULL)
        return -1;
    fprintf(out, "%s\n", text);
    cJSON_free(text);
    return 0;
}

int trace_summary_write(const trace_model_t *m, const trace_filter_t *filter, int json,
                        FILE *out, char *error, size_t error_len)
{
    report_t rep;
    int rc = report_build(m, filter, &rep, error, error_len);
    if (rc == 0 && json && print_json(&rep, out) != 0)
        rc = trace_fail(error, error_len, "%s: out of memory", m->path);
    else if (rc == 0 && !json)
        print_text(&rep, out);
    report_free(&rep);
    return rc;
}
