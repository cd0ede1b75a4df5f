/* Writes what the recorder holds as one rank's Chrome trace-event file (format in
 * docs/tracing.md): metadata naming the rank and its tracks, then every finished slice,
 * flow pair and memory counter in time order, one event per line. Written to a
 * temporary file beside the target and renamed, so a reader never sees half a trace. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <fsdp2/version.h>

#include "core/error.h"
#include "core/log_internal.h"
#include "core/trace_rec.h"

static const char *const mem_names[TRACE_MEM_COUNT] = {
    "sharded_params", "sharded_grads", "unsharded_params", "unsharded_grads", "reduce_scatter",
    "optimizer_state", "post_forward_params",
};

static void put_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            fprintf(f, "\\%c", *p);
        else if (*p < 0x20)
            fprintf(f, "\\u%04x", *p);
        else
            fputc(*p, f);
    }
    fputc('"', f);
}

/* Microseconds with nanosecond decimals, exactly. */
static void put_us(FILE *f, int64_t ns)
{
    fprintf(f, "%lld.%03lld", (long long)(ns / 1000), (long long)(ns % 1000));
}

typedef struct item {
    int64_t ts;
    size_t index;
} item_t;

static int item_order(const void *a, const void *b)
{
    const item_t *x = a, *y = b;
    if (x->ts != y->ts)
        return x->ts < y->ts ? -1 : 1;
    return x->index < y->index ? -1 : x->index > y->index;
}

static void put_slice(FILE *f, int rank, const trace_rec_t *r, int64_t t0, int64_t t1)
{
    fprintf(f, "{\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":", rank, r->track);
    put_us(f, t0);
    fputs(",\"dur\":", f);
    put_us(f, t1 - t0);
    fputs(",\"name\":", f);
    if (r->cat == TRACE_FORWARD || r->cat == TRACE_BACKWARD) {
        char name[160];
        snprintf(name, sizeof(name), "%s %s", fsdp2_trace_cat_name(r->cat),
                 r->u.s.module[0] ? r->u.s.module : "(root)");
        put_string(f, name);
    } else {
        put_string(f, r->u.s.name);
    }
    fputs(",\"cat\":", f);
    put_string(f, fsdp2_trace_cat_name(r->cat));
    fputs(",\"args\":{", f);
    const char *sep = "";
    if (r->has_module) {
        fputs("\"module\":", f);
        put_string(f, r->u.s.module);
        sep = ",";
    }
    if (r->cat != TRACE_STEP && r->step >= 0) {
        fprintf(f, "%s\"step\":%lld", sep, (long long)r->step);
        sep = ",";
    }
    if (r->bytes) {
        fprintf(f, "%s\"bytes\":%llu", sep, (unsigned long long)r->bytes);
        sep = ",";
    }
    if (r->dtype >= 0) {
        fprintf(f, "%s\"dtype\":", sep);
        put_string(f, fsdp2_dtype_name((fsdp2_dtype_t)r->dtype));
        sep = ",";
    }
    if (r->u.s.group[0]) {
        fprintf(f, "%s\"group\":", sep);
        put_string(f, r->u.s.group);
        sep = ",";
    }
    if (r->seq >= 0) {
        fprintf(f, "%s\"seq\":%lld", sep, (long long)r->seq);
        sep = ",";
    }
    if (r->mem < TRACE_MEM_COUNT)
        fprintf(f, "%s\"category\":\"%s\"", sep, mem_names[r->mem]);
    fputs("}}", f);
}

/* The arrow of flow destination d: its source slice's end, and the release. 0 when
 * either end is missing or they are out of order (a record made inside an open slice). */
static int flow_ends(const trace_rec_t *recs, size_t n, const trace_rec_t *d, int64_t *s_ts,
                     int *s_track)
{
    if (d->link < 0 || (size_t)d->link >= n)
        return 0;
    const trace_rec_t *src = &recs[d->link];
    if (atomic_load(&src->kind) != TREC_FLOW_SRC || src->gen != d->gen || src->link < 0 ||
        (size_t)src->link >= n)
        return 0;
    const trace_rec_t *sl = &recs[src->link];
    int64_t t0 = atomic_load(&sl->t0), t1 = atomic_load(&sl->t1), td = atomic_load(&d->t0);
    if (atomic_load(&sl->kind) != TREC_SLICE || sl->gen != d->gen || !t0 || !t1 || !td)
        return 0;
    *s_ts = t1 - 1 > t0 ? t1 - 1 : t0; /* inside the slice it binds to */
    *s_track = sl->track;
    return td >= *s_ts;
}

static void put_metadata(FILE *f, int rank)
{
    const trace_state_t *t = &fsdp2_trace_;
    fprintf(f, "{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":%d,\"args\":{\"name\":\"rank %d\"}},\n",
            rank, rank);
    fprintf(f, "{\"ph\":\"M\",\"name\":\"process_sort_index\",\"pid\":%d,\"args\":{\"sort_index\":%d}},\n",
            rank, rank);
    static const char *const fixed[] = {NULL, "steps", "compute", "optimizer"};
    for (int tid = 1; tid <= 3; tid++) {
        fprintf(f, "{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":\"%s\"}},\n",
                rank, tid, fixed[tid]);
        fprintf(f, "{\"ph\":\"M\",\"name\":\"thread_sort_index\",\"pid\":%d,\"tid\":%d,\"args\":{\"sort_index\":%d}},\n",
                rank, tid, tid);
    }
    for (int k = 0; k < t->num_tracks; k++) {
        fprintf(f, "{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":",
                rank, t->tracks[k].tid);
        put_string(f, t->tracks[k].name);
        fprintf(f, "}},\n{\"ph\":\"M\",\"name\":\"thread_sort_index\",\"pid\":%d,\"tid\":%d,\"args\":{\"sort_index\":%d}},\n",
                rank, t->tracks[k].tid, t->tracks[k].tid);
    }
}

static void put_host(FILE *f)
{
    char host[256] = "";
    gethostname(host, sizeof(host) - 1);
    char boot[64] = "";
    FILE *b = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (b) {
        if (!fgets(boot, sizeof(boot), b))
            boot[0] = '\0';
        fclose(b);
        boot[strcspn(boot, "\n")] = '\0';
    }
    struct timespec mono, real;
    clock_gettime(CLOCK_MONOTONIC, &mono);
    clock_gettime(CLOCK_REALTIME, &real);
    long long offset = ((long long)real.tv_sec - mono.tv_sec) * 1000000000LL +
                       (real.tv_nsec - mono.tv_nsec);
    fputs("\"host\":", f);
    put_string(f, host);
    fputs(",\"boot_id\":", f);
    put_string(f, boot);
    fprintf(f, ",\"realtime_minus_monotonic_ns\":%lld", offset);
}

static fsdp2_status_t write_events(FILE *f, int rank, int world_size)
{
    const trace_state_t *t = &fsdp2_trace_;
    size_t n = atomic_load(&t->next);
    if (n > t->capacity)
        n = t->capacity;
    item_t *items = malloc((n ? n : 1) * sizeof(*items));
    if (!items)
        return fsdp2_error(FSDP2_ERR_OUT_OF_MEMORY, "trace: %zu records to sort", n);
    size_t m = 0, unfinished = 0, written = 0;
    unsigned gen = atomic_load(&t->gen);
    for (size_t i = 0; i < n; i++) {
        const trace_rec_t *r = &t->recs[i];
        int kind = atomic_load_explicit(&r->kind, memory_order_acquire);
        if (atomic_load_explicit(&r->gen, memory_order_relaxed) != gen)
            continue; /* reserved but not yet reset, or from an earlier trace */
        int64_t t0 = atomic_load(&r->t0), t1 = atomic_load(&r->t1);
        if (kind == TREC_SLICE && (!t0 || !t1 || t1 < t0)) {
            unfinished++;
            continue;
        }
        if (kind == TREC_SLICE || kind == TREC_COUNTER || kind == TREC_FLOW_DST)
            items[m++] = (item_t){t0, i};
    }
    qsort(items, m, sizeof(*items), item_order);
    for (size_t k = 0; k < m; k++) { /* what will be written: a flow is two events */
        const trace_rec_t *r = &t->recs[items[k].index];
        int64_t s_ts;
        int s_track;
        if (atomic_load(&r->kind) != TREC_FLOW_DST)
            written++;
        else if (flow_ends(t->recs, n, r, &s_ts, &s_track))
            written += 2;
    }
    size_t dropped = atomic_load(&t->dropped);
    fprintf(f, "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"producer\":\"libfsdp2 %s\","
               "\"format\":1,\"clock\":\"monotonic\",\"ranks\":[{\"rank\":%d,\"world_size\":%d,",
            FSDP2_VERSION_STRING, rank, world_size);
    put_host(f);
    fprintf(f, ",\"events\":%zu,\"dropped\":%zu,\"unfinished\":%zu}]},\n\"traceEvents\":[\n",
            written, dropped, unfinished);
    put_metadata(f, rank);
    const char *sep = "";
    for (size_t k = 0; k < m; k++) {
        const trace_rec_t *r = &t->recs[items[k].index];
        int kind = atomic_load(&r->kind);
        if (kind == TREC_FLOW_DST) {
            int64_t s_ts;
            int s_track;
            if (!flow_ends(t->recs, n, r, &s_ts, &s_track))
                continue;
            unsigned long long id = ((unsigned long long)rank << 32) | items[k].index;
            fprintf(f, "%s{\"ph\":\"s\",\"id\":%llu,\"pid\":%d,\"tid\":%d,\"ts\":", sep, id, rank,
                    s_track);
            put_us(f, s_ts);
            fprintf(f, ",\"name\":\"event\",\"cat\":\"flow\"},\n{\"ph\":\"f\",\"id\":%llu,\"pid\":%d,"
                       "\"tid\":%d,\"ts\":",
                    id, rank, r->track);
            put_us(f, atomic_load(&r->t0));
            fputs(",\"name\":\"event\",\"cat\":\"flow\"}", f);
        } else if (kind == TREC_COUNTER) {
            fprintf(f, "%s{\"ph\":\"C\",\"pid\":%d,\"name\":\"memory\",\"ts\":", sep, rank);
            put_us(f, atomic_load(&r->t0));
            fputs(",\"args\":{", f);
            for (int c = 0; c < TRACE_MEM_COUNT; c++)
                fprintf(f, "%s\"%s\":%lld", c ? "," : "", mem_names[c],
                        (long long)(r->u.values[c] > 0 ? r->u.values[c] : 0));
            fputs("}}", f);
        } else {
            fputs(sep, f);
            put_slice(f, rank, r, atomic_load(&r->t0), atomic_load(&r->t1));
        }
        sep = ",\n";
    }
    fputs(m ? "\n]}\n" : "]}\n", f);
    free(items);
    if (dropped || unfinished)
        FSDP2_LOG(WARN, CORE,
                  "trace of rank %d: %zu records dropped (FSDP2_TRACE_EVENTS is %zu), %zu "
                  "operations unfinished at stop (synchronize their streams first)",
                  rank, dropped, t->capacity, unfinished);
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_trace_write_part(const char *path, int rank, int world_size)
{
    char tmp[4200];
    int len = snprintf(tmp, sizeof(tmp), "%s.tmp.%ld", path, (long)getpid());
    FSDP2_ARG_CHECK(len > 0 && (size_t)len < sizeof(tmp), "trace path '%s' is too long", path);
    FILE *f = fopen(tmp, "w");
    if (!f)
        return fsdp2_error(FSDP2_ERR_IO, "trace: cannot create '%s': %s", tmp, strerror(errno));
    fsdp2_status_t status = write_events(f, rank, world_size);
    int failed = ferror(f), err = errno;
    if (fclose(f) != 0) {
        failed = 1;
        err = errno;
    }
    if (status == FSDP2_SUCCESS && failed)
        status = fsdp2_error(FSDP2_ERR_IO, "trace: writing '%s' failed: %s", tmp, strerror(err));
    if (status == FSDP2_SUCCESS && rename(tmp, path) != 0)
        status = fsdp2_error(FSDP2_ERR_IO, "trace: cannot rename '%s' to '%s': %s", tmp, path,
                             strerror(errno));
    if (status != FSDP2_SUCCESS)
        unlink(tmp);
    return status;
}
