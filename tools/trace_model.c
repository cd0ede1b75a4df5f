/* The model of a trace (see trace_model.h): tracks, nesting, flows, steps and ranks
 * built from the events trace_parse.c read, and the questions the commands ask of it. */
#include "trace_parse.h"

#include <stdio.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

const char *const trace_memory_category_names[TRACE_MEMORY_CATEGORIES] = {
    "sharded_params", "sharded_grads", "unsharded_params",
    "unsharded_grads", "reduce_scatter", "optimizer_state",
    "post_forward_params",
};

/* ---- strings owned by the model -------------------------------------------------- */

typedef struct trace_arena {
    struct trace_arena *next;
    size_t used, cap;
    char data[];
} trace_arena_t;

const char *trace_model_strdup(trace_model_t *m, const char *s)
{
    size_t n = strlen(s) + 1;
    trace_arena_t *a = m->strings;
    if (a == NULL || a->cap - a->used < n) {
        size_t cap = n > 65536 ? n : 65536;
        trace_arena_t *b = malloc(sizeof(*b) + cap);
        if (b == NULL)
            return NULL;
        b->next = a;
        b->used = 0;
        b->cap = cap;
        m->strings = a = b;
    }
    char *out = a->data + a->used;
    memcpy(out, s, n);
    a->used += n;
    return out;
}

void *trace_reserve(void *array, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return array;
    size_t n = *cap ? *cap : 64;
    while (n < need)
        n *= 2;
    void *p = realloc(array, n * elem);
    if (p != NULL)
        *cap = n;
    return p;
}

/* ---- after the events: tracks, nesting, flows, steps, ranks ------------------------ */

/* qsort, which must not see the NULL of an array never grown. */
static void sort(void *array, size_t n, size_t elem, int (*compare)(const void *, const void *))
{
    if (n > 1)
        qsort(array, n, elem, compare);
}

static int compare_slices(const void *a, const void *b)
{
    const trace_slice_t *x = a, *y = b;
    if (x->pid != y->pid)
        return x->pid < y->pid ? -1 : 1;
    if (x->tid != y->tid)
        return x->tid < y->tid ? -1 : 1;
    if (x->ts != y->ts)
        return x->ts < y->ts ? -1 : 1;
    if (x->dur != y->dur)
        return x->dur > y->dur ? -1 : 1;
    return x->event < y->event ? -1 : x->event > y->event;
}

static int compare_meta(const void *a, const void *b)
{
    const trace_track_meta_t *x = a, *y = b;
    if (x->pid != y->pid)
        return x->pid < y->pid ? -1 : 1;
    return x->tid < y->tid ? -1 : x->tid > y->tid;
}

/* Tracks are the (pid, tid) of slices and of thread metadata, merged in order. */
static int build_tracks(trace_loader_t *L)
{
    trace_model_t *m = L->m;
    sort(m->slices, m->n_slices, sizeof(*m->slices), compare_slices);
    sort(L->meta, L->n_meta, sizeof(*L->meta), compare_meta);
    m->tracks = calloc(m->n_slices + L->n_meta + 1, sizeof(*m->tracks));
    if (m->tracks == NULL)
        return trace_loader_fail(L, "out of memory");
    size_t i = 0, j = 0;
    while (i < m->n_slices || j < L->n_meta) {
        int64_t pid, tid;
        if (j >= L->n_meta || (i < m->n_slices && (m->slices[i].pid < L->meta[j].pid ||
            (m->slices[i].pid == L->meta[j].pid && m->slices[i].tid <= L->meta[j].tid)))) {
            pid = m->slices[i].pid, tid = m->slices[i].tid;
        } else {
            pid = L->meta[j].pid, tid = L->meta[j].tid;
        }
        trace_track_t *t = &m->tracks[m->n_tracks];
        *t = (trace_track_t){.pid = pid, .tid = tid, .sort_index = (double)tid, .first_slice = i};
        for (; i < m->n_slices && m->slices[i].pid == pid && m->slices[i].tid == tid; i++)
            m->slices[i].track = m->n_tracks;
        t->n_slices = i - t->first_slice;
        for (; j < L->n_meta && L->meta[j].pid == pid && L->meta[j].tid == tid; j++) {
            if (L->meta[j].name)
                t->name = L->meta[j].name;
            if (L->meta[j].has_sort)
                t->sort_index = L->meta[j].sort_index;
        }
        m->n_tracks++;
    }
    return 0;
}

/* On each track a slice must end before the next one starts or inside its parent. The
 * stack holds the open ancestors; the violation reported is the earliest in the file. */
static int check_nesting(trace_loader_t *L)
{
    trace_model_t *m = L->m;
    size_t *stack = malloc((m->n_slices + 1) * sizeof(*stack));
    if (stack == NULL)
        return trace_loader_fail(L, "out of memory");
    const trace_slice_t *bad = NULL, *bad_parent = NULL;
    for (size_t t = 0; t < m->n_tracks; t++) {
        const trace_track_t *track = &m->tracks[t];
        size_t depth = 0;
        for (size_t k = 0; k < track->n_slices; k++) {
            trace_slice_t *s = &m->slices[track->first_slice + k];
            while (depth > 0) {
                const trace_slice_t *top = &m->slices[stack[depth - 1]];
                if (top->ts + top->dur > s->ts + TRACE_EPSILON_US)
                    break;
                depth--;
            }
            if (depth > 0) {
                const trace_slice_t *top = &m->slices[stack[depth - 1]];
                if (s->ts + s->dur > top->ts + top->dur + TRACE_EPSILON_US &&
                    (bad == NULL || s->event < bad->event)) {
                    bad = s;
                    bad_parent = top;
                }
            }
            s->depth = (int)depth;
            stack[depth++] = track->first_slice + k;
        }
    }
    free(stack);
    if (bad == NULL)
        return 0;
    char a[96], b[96];
    return trace_loader_fail(L, "event %zu (pid %lld, tid %lld, ts %.3f, dur %.3f, \"%s\") "
                             "partly overlaps event %zu (ts %.3f, dur %.3f, \"%s\") on the same "
                             "track: slices on a track must nest or be disjoint", bad->event,
                             (long long)bad->pid, (long long)bad->tid, bad->ts, bad->dur,
                             trace_printable(bad->name, a, sizeof(a), 60), bad_parent->event,
                             bad_parent->ts, bad_parent->dur,
                             trace_printable(bad_parent->name, b, sizeof(b), 60));
}

static int compare_ends(const void *a, const void *b)
{
    const trace_flow_end_t *x = a, *y = b;
    int c = strcmp(x->id, y->id);
    if (c)
        return c;
    if (x->phase != y->phase)
        return x->phase == 's' ? -1 : 1;
    return x->event < y->event ? -1 : x->event > y->event;
}

static const char *end_text(const trace_flow_end_t *e, char *buf, size_t len)
{
    snprintf(buf, len, "'%c' event %zu (pid %lld, tid %lld, ts %.3f)", e->phase, e->event,
             (long long)e->pid, (long long)e->tid, e->ts);
    return buf;
}

/* Each id: one 's', one 'f', the 'f' not earlier. Reports the problem whose first event
 * comes first in the file. */
static int pair_flows(trace_loader_t *L)
{
    trace_model_t *m = L->m;
    sort(L->ends, L->n_ends, sizeof(*L->ends), compare_ends);
    m->flows = calloc(L->n_ends / 2 + 1, sizeof(*m->flows));
    if (m->flows == NULL)
        return trace_loader_fail(L, "out of memory");
    char problem[512] = "", x[128], y[128], id[80];
    size_t problem_event = (size_t)-1;
    for (size_t i = 0; i < L->n_ends;) {
        size_t j = i, n_s = 0;
        while (j < L->n_ends && !strcmp(L->ends[j].id, L->ends[i].id))
            n_s += L->ends[j++].phase == 's';
        size_t n_f = j - i - n_s, first = L->ends[i].event;
        for (size_t k = i; k < j; k++)
            first = L->ends[k].event < first ? L->ends[k].event : first;
        const trace_flow_end_t *s = &L->ends[i], *f = &L->ends[i + n_s];
        trace_printable(s->id, id, sizeof(id), 40);
        if (first < problem_event && (n_s != 1 || n_f != 1)) {
            if (n_s == 0 || n_f == 0)
                snprintf(problem, sizeof(problem), "flow id %s has %s but no '%c'", id,
                         end_text(s, x, sizeof(x)), n_s == 0 ? 's' : 'f');
            else
                snprintf(problem, sizeof(problem), "flow id %s has %zu 's' and %zu 'f' events "
                         "(one of each expected; first %s)", id, n_s, n_f,
                         end_text(s, x, sizeof(x)));
            problem_event = first;
        } else if (n_s == 1 && n_f == 1) {
            if (f->ts < s->ts - TRACE_EPSILON_US && first < problem_event) {
                snprintf(problem, sizeof(problem), "flow id %s: %s is earlier than its %s", id,
                         end_text(f, x, sizeof(x)), end_text(s, y, sizeof(y)));
                problem_event = first;
            }
            m->flows[m->n_flows++] = (trace_flow_t){s->id, s->pid, s->tid, f->pid, f->tid,
                                                    s->ts, f->ts};
        }
        i = j;
    }
    return problem[0] ? trace_loader_fail(L, "%s", problem) : 0;
}

static int compare_counters(const void *a, const void *b)
{
    const trace_counter_t *x = a, *y = b;
    if (x->pid != y->pid)
        return x->pid < y->pid ? -1 : 1;
    if (x->ts != y->ts)
        return x->ts < y->ts ? -1 : 1;
    return x->event < y->event ? -1 : x->event > y->event;
}

static int compare_steps(const void *a, const void *b)
{
    const trace_step_t *x = a, *y = b;
    if (x->pid != y->pid)
        return x->pid < y->pid ? -1 : 1;
    return x->step < y->step ? -1 : x->step > y->step;
}

/* A step slice's number is args.step, else N of its name "step N". */
static int build_steps(trace_loader_t *L)
{
    trace_model_t *m = L->m;
    m->steps = calloc(m->n_slices + 1, sizeof(*m->steps));
    if (m->steps == NULL)
        return trace_loader_fail(L, "out of memory");
    for (size_t i = 0; i < m->n_slices; i++) {
        const trace_slice_t *s = &m->slices[i];
        if (strcmp(s->cat, "step") != 0)
            continue;
        long long n = s->step;
        int used = 0;
        char a[96];
        if (!s->has_step && (sscanf(s->name, "step %lld%n", &n, &used) != 1 || s->name[used]))
            return trace_loader_fail(L, "event %zu (pid %lld, tid %lld, ts %.3f, \"%s\"): a "
                                     "step slice without args.step and not named \"step N\"",
                                     s->event, (long long)s->pid, (long long)s->tid, s->ts,
                                     trace_printable(s->name, a, sizeof(a), 60));
        m->steps[m->n_steps++] = (trace_step_t){s->pid, n, s->ts, s->dur, i};
    }
    sort(m->steps, m->n_steps, sizeof(*m->steps), compare_steps);
    for (size_t i = 1; i < m->n_steps; i++) {
        const trace_step_t *x = &m->steps[i - 1], *y = &m->steps[i];
        if (x->pid == y->pid && x->step == y->step)
            return trace_loader_fail(L, "rank %lld has two slices for step %lld (events %zu "
                                     "and %zu)", (long long)x->pid, (long long)x->step,
                                     m->slices[x->slice].event, m->slices[y->slice].event);
    }
    return 0;
}

static int compare_pids(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

typedef struct display_key {
    double sort_index;
    int64_t tid;
    size_t track;
} display_key_t;

static int compare_display(const void *a, const void *b)
{
    const display_key_t *x = a, *y = b;
    if (x->sort_index != y->sort_index)
        return x->sort_index < y->sort_index ? -1 : 1;
    return x->tid < y->tid ? -1 : x->tid > y->tid;
}

/* The rank's tracks tracks[first .. first + n) in display order into out. */
static int order_tracks(const trace_model_t *m, size_t first, size_t n, size_t *out)
{
    display_key_t *keys = malloc((n + 1) * sizeof(*keys));
    if (keys == NULL)
        return -1;
    for (size_t k = 0; k < n; k++)
        keys[k] = (display_key_t){m->tracks[first + k].sort_index, m->tracks[first + k].tid,
                                  first + k};
    sort(keys, n, sizeof(*keys), compare_display);
    for (size_t k = 0; k < n; k++)
        out[k] = keys[k].track;
    free(keys);
    return 0;
}

static int build_ranks(trace_loader_t *L)
{
    trace_model_t *m = L->m;
    sort(L->pids, L->n_pids, sizeof(*L->pids), compare_pids);
    sort(m->counters, m->n_counters, sizeof(*m->counters), compare_counters);
    m->ranks = calloc(L->n_pids + 1, sizeof(*m->ranks));
    if (m->ranks == NULL)
        return trace_loader_fail(L, "out of memory");
    size_t t = 0, c = 0, s = 0;
    for (size_t i = 0; i < L->n_pids; i++) {
        if (m->n_ranks > 0 && m->ranks[m->n_ranks - 1].pid == L->pids[i])
            continue;
        trace_rank_t *r = &m->ranks[m->n_ranks++];
        r->pid = L->pids[i];
        size_t first = t;
        for (; t < m->n_tracks && m->tracks[t].pid == r->pid; t++)
            ;
        r->n_tracks = t - first;
        r->tracks = malloc((r->n_tracks + 1) * sizeof(*r->tracks));
        if (r->tracks == NULL || order_tracks(m, first, r->n_tracks, r->tracks))
            return trace_loader_fail(L, "out of memory");
        for (r->first_counter = c; c < m->n_counters && m->counters[c].pid == r->pid; c++)
            ;
        r->n_counters = c - r->first_counter;
        for (r->first_step = s; s < m->n_steps && m->steps[s].pid == r->pid; s++)
            ;
        r->n_steps = s - r->first_step;
    }
    return 0;
}

int trace_model_load(const char *path, trace_model_t **out, char *error, size_t error_len)
{
    *out = NULL;
    trace_model_t *m = calloc(1, sizeof(*m));
    trace_loader_t L = {.m = m, .error = error, .error_len = error_len};
    if (m == NULL || (m->path = strdup(path)) == NULL) {
        snprintf(error, error_len, "%s: out of memory", path);
        free(m);
        return -1;
    }
    int rc = trace_parse_file(&L, path);
    if (rc == 0)
        rc = build_tracks(&L);
    if (rc == 0)
        rc = check_nesting(&L);
    if (rc == 0)
        rc = pair_flows(&L);
    if (rc == 0)
        rc = build_steps(&L);
    if (rc == 0)
        rc = build_ranks(&L);
    free(L.ends);
    free(L.meta);
    free(L.pids);
    if (rc != 0) {
        trace_model_free(m);
        return -1;
    }
    *out = m;
    return 0;
}

void trace_model_free(trace_model_t *m)
{
    if (m == NULL)
        return;
    for (size_t i = 0; i < m->n_ranks; i++)
        free(m->ranks[i].tracks);
    while (m->strings) {
        trace_arena_t *next = m->strings->next;
        free(m->strings);
        m->strings = next;
    }
    free(m->ranks);
    free(m->steps);
    free(m->counters);
    free(m->flows);
    free(m->tracks);
    free(m->slices);
    free(m->path);
    free(m);
}

const trace_rank_t *trace_model_rank(const trace_model_t *m, int64_t pid)
{
    for (size_t i = 0; i < m->n_ranks; i++)
        if (m->ranks[i].pid == pid)
            return &m->ranks[i];
    return NULL;
}

const trace_step_t *trace_model_step(const trace_model_t *m, const trace_rank_t *rank,
                                     int64_t step)
{
    for (size_t i = 0; i < rank->n_steps; i++)
        if (m->steps[rank->first_step + i].step == step)
            return &m->steps[rank->first_step + i];
    return NULL;
}

double trace_counter_total(const trace_counter_t *c)
{
    double total = 0;
    for (int k = 0; k < TRACE_MEMORY_CATEGORIES; k++)
        total += c->bytes[k];
    return total;
}

const trace_counter_t *trace_memory_peak(const trace_model_t *m, const trace_rank_t *r,
                                         double ws, double we, double *at)
{
    *at = ws;
    if (r->n_counters == 0)
        return NULL;
    const trace_counter_t *c = &m->counters[r->first_counter];
    size_t n = r->n_counters, lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (c[mid].ts <= ws)
            lo = mid + 1;
        else
            hi = mid;
    }
    const trace_counter_t *best = lo > 0 ? &c[lo - 1] : NULL;
    double best_total = best ? trace_counter_total(best) : -1;
    *at = ws;
    for (size_t i = lo; i < n && c[i].ts < we; i++) {
        if (i + 1 < n && c[i + 1].ts == c[i].ts)
            continue;
        double total = trace_counter_total(&c[i]);
        if (total > best_total) {
            best = &c[i];
            best_total = total;
            *at = c[i].ts;
        }
    }
    return best;
}

const char *trace_format_bytes(double bytes, char *buf, size_t len)
{
    if (bytes < 1024)
        snprintf(buf, len, "%.0f B", bytes);
    else if (bytes < 1024.0 * 1024)
        snprintf(buf, len, "%.1f KiB", bytes / 1024);
    else if (bytes < 1024.0 * 1024 * 1024)
        snprintf(buf, len, "%.2f MiB", bytes / (1024.0 * 1024));
    else
        snprintf(buf, len, "%.2f GiB", bytes / (1024.0 * 1024 * 1024));
    return buf;
}

const char *trace_track_label(const trace_track_t *t, char *buf, size_t len)
{
    if (t->name != NULL)
        return t->name;
    snprintf(buf, len, "tid %lld", (long long)t->tid);
    return buf;
}

int trace_select_ranks(const trace_model_t *m, const trace_filter_t *filter,
                       const trace_rank_t **out, char *error, size_t error_len)
{
    size_t n = 0;
    for (size_t i = 0; i < m->n_ranks; i++)
        if (!filter->has_rank || m->ranks[i].pid == filter->rank)
            out[n++] = &m->ranks[i];
    if (n > 0 || !filter->has_rank)
        return (int)n;
    int len = snprintf(error, error_len, "%s: no rank %lld in the trace (ranks:", m->path,
                       (long long)filter->rank);
    for (size_t i = 0; i < m->n_ranks && i < 16 && len > 0 && (size_t)len < error_len; i++)
        len += snprintf(error + len, error_len - len, "%s %lld", i ? "," : "",
                        (long long)m->ranks[i].pid);
    if (len > 0 && (size_t)len < error_len)
        snprintf(error + len, error_len - len, "%s)",
                 m->n_ranks > 16 ? ", ..." : m->n_ranks ? "" : " none");
    return -1;
}

int trace_fail(char *error, size_t len, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(error, len, fmt, ap);
    va_end(ap);
    return -1;
}
