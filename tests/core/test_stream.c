/* cpu streams and events: ordering, real concurrency, cross-stream waits that never run
 * early, re-recorded events, destroy with pending work, errors, a stress run, and idle
 * workers that sleep until work comes. No
 * test sleeps to "wait long enough": gates are opened explicitly and every blocking
 * wait in a test helper has a timeout that fails the test instead of hanging it. */
#include <check.h>

#include "check_main.h"
#include <pthread.h>
#include <sched.h>
#include <unistd.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <fsdp2/fsdp2.h>

#include "core/env_internal.h"
#include "core/error.h"

#define OK(call) ck_assert_msg((call) == FSDP2_SUCCESS, "%s failed: %s", #call, fsdp2_last_error())

static const fsdp2_device_t cpu = FSDP2_DEVICE_CPU_INIT;

/* A gate that host functions block on until the test opens it (or 30 s pass). */
typedef struct gate {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int open;
    atomic_int entered;
    atomic_int passed;
} gate_t;

static void gate_init(gate_t *g)
{
    pthread_mutex_init(&g->lock, NULL);
    pthread_cond_init(&g->cond, NULL);
    g->open = 0;
    atomic_init(&g->entered, 0);
    atomic_init(&g->passed, 0);
}

static void gate_open(gate_t *g)
{
    pthread_mutex_lock(&g->lock);
    g->open = 1;
    pthread_cond_broadcast(&g->cond);
    pthread_mutex_unlock(&g->lock);
}

static fsdp2_status_t gate_wait(void *arg)
{
    gate_t *g = arg;
    atomic_fetch_add(&g->entered, 1);
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += 30;
    pthread_mutex_lock(&g->lock);
    int rc = 0;
    while (!g->open && rc == 0)
        rc = pthread_cond_timedwait(&g->cond, &g->lock, &deadline);
    pthread_mutex_unlock(&g->lock);
    atomic_fetch_add(&g->passed, 1);
    return g->open ? FSDP2_SUCCESS : FSDP2_ERR_TIMEOUT;
}

/* Blocks the test (up to 30 s) until the gate's function is running. */
static void gate_await_entered(gate_t *g)
{
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    while (atomic_load(&g->entered) == 0) {
        clock_gettime(CLOCK_MONOTONIC, &now);
        ck_assert_msg(now.tv_sec - start.tv_sec < 30, "gate function never started");
        sched_yield();
    }
}

/* Records the order tasks ran in. */
typedef struct log_entry {
    atomic_int *next;
    int *order;
    int id;
} log_entry_t;

static fsdp2_status_t log_run(void *arg)
{
    log_entry_t *e = arg;
    e->order[atomic_fetch_add(e->next, 1)] = e->id;
    return FSDP2_SUCCESS;
}

START_TEST(tasks_on_one_stream_run_in_submission_order)
{
    enum { N = 5000 };
    fsdp2_stream_t *s;
    OK(fsdp2_stream_create(cpu, "order", &s));
    static int order[N];
    static log_entry_t entries[N];
    atomic_int next;
    atomic_init(&next, 0);
    for (int i = 0; i < N; i++) {
        entries[i] = (log_entry_t){&next, order, i};
        OK(fsdp2_stream_launch_host(s, log_run, &entries[i]));
    }
    OK(fsdp2_stream_synchronize(s));
    ck_assert_int_eq(atomic_load(&next), N);
    for (int i = 0; i < N; i++)
        ck_assert_int_eq(order[i], i);
    OK(fsdp2_stream_destroy(s));
}
END_TEST

/* Both functions can only finish if they run at the same time. */
typedef struct rendezvous {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int arrived;
} rendezvous_t;

static fsdp2_status_t rendezvous_run(void *arg)
{
    rendezvous_t *r = arg;
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += 30;
    pthread_mutex_lock(&r->lock);
    r->arrived++;
    pthread_cond_broadcast(&r->cond);
    int rc = 0;
    while (r->arrived < 2 && rc == 0)
        rc = pthread_cond_timedwait(&r->cond, &r->lock, &deadline);
    int met = r->arrived >= 2;
    pthread_mutex_unlock(&r->lock);
    return met ? FSDP2_SUCCESS : fsdp2_error(FSDP2_ERR_TIMEOUT, "the other stream never ran");
}

START_TEST(two_streams_run_concurrently)
{
    rendezvous_t r = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};
    fsdp2_stream_t *a, *b;
    OK(fsdp2_stream_create(cpu, "a", &a));
    OK(fsdp2_stream_create(cpu, "b", &b));
    OK(fsdp2_stream_launch_host(a, rendezvous_run, &r));
    OK(fsdp2_stream_launch_host(b, rendezvous_run, &r));
    OK(fsdp2_stream_synchronize(a));
    OK(fsdp2_stream_synchronize(b));
    ck_assert_int_eq(r.arrived, 2);
    OK(fsdp2_stream_destroy(a));
    OK(fsdp2_stream_destroy(b));
}
END_TEST

typedef struct observe {
    gate_t *gate;
    int saw_passed; /* gate->passed when this ran */
    atomic_int ran;
} observe_t;

static fsdp2_status_t observe_run(void *arg)
{
    observe_t *o = arg;
    o->saw_passed = atomic_load(&o->gate->passed);
    atomic_store(&o->ran, 1);
    return FSDP2_SUCCESS;
}

START_TEST(wait_event_holds_later_work_until_the_recorded_work_is_done)
{
    gate_t g;
    gate_init(&g);
    observe_t o = {&g, -1, 0};
    fsdp2_stream_t *a, *b;
    fsdp2_event_t *e;
    OK(fsdp2_stream_create(cpu, "producer", &a));
    OK(fsdp2_stream_create(cpu, "consumer", &b));
    OK(fsdp2_event_create(cpu, &e));
    OK(fsdp2_stream_launch_host(a, gate_wait, &g));
    OK(fsdp2_event_record(e, a));
    OK(fsdp2_stream_wait_event(b, e));
    OK(fsdp2_stream_launch_host(b, observe_run, &o));
    gate_await_entered(&g);
    ck_assert_int_eq(fsdp2_event_query(e), FSDP2_ERR_NOT_READY);
    ck_assert_int_eq(fsdp2_stream_query(a), FSDP2_ERR_NOT_READY);
    ck_assert_int_eq(fsdp2_stream_query(b), FSDP2_ERR_NOT_READY);
    ck_assert_int_eq(fsdp2_event_wait_timeout(e, 20), FSDP2_ERR_TIMEOUT);
    ck_assert_int_eq(atomic_load(&o.ran), 0);
    gate_open(&g);
    OK(fsdp2_stream_synchronize(b));
    ck_assert_int_eq(atomic_load(&o.ran), 1);
    ck_assert_int_eq(o.saw_passed, 1);
    OK(fsdp2_event_query(e));
    OK(fsdp2_stream_query(a));
    OK(fsdp2_event_destroy(e));
    OK(fsdp2_stream_destroy(a));
    OK(fsdp2_stream_destroy(b));
}
END_TEST

START_TEST(rerecording_an_event_elsewhere_does_not_release_earlier_waits)
{
    gate_t g;
    gate_init(&g);
    observe_t o = {&g, -1, 0};
    fsdp2_stream_t *a, *b, *c;
    fsdp2_event_t *e;
    OK(fsdp2_stream_create(cpu, "a", &a));
    OK(fsdp2_stream_create(cpu, "b", &b));
    OK(fsdp2_stream_create(cpu, "c", &c));
    OK(fsdp2_event_create(cpu, &e));
    OK(fsdp2_stream_launch_host(a, gate_wait, &g));
    OK(fsdp2_event_record(e, a));
    OK(fsdp2_stream_wait_event(c, e)); /* captures the record on a */
    OK(fsdp2_stream_launch_host(c, observe_run, &o));
    OK(fsdp2_event_record(e, b)); /* b is idle: this record is complete at once */
    OK(fsdp2_stream_synchronize(b));
    OK(fsdp2_event_synchronize(e));
    ck_assert_int_eq(fsdp2_stream_query(c), FSDP2_ERR_NOT_READY);
    ck_assert_int_eq(atomic_load(&o.ran), 0);
    gate_open(&g);
    OK(fsdp2_stream_synchronize(c));
    ck_assert_int_eq(o.saw_passed, 1);
    OK(fsdp2_event_destroy(e));
    OK(fsdp2_stream_destroy(a));
    OK(fsdp2_stream_destroy(b));
    OK(fsdp2_stream_destroy(c));
}
END_TEST

START_TEST(an_event_never_recorded_is_complete)
{
    fsdp2_stream_t *s;
    fsdp2_event_t *e;
    OK(fsdp2_stream_create(cpu, "s", &s));
    OK(fsdp2_event_create(cpu, &e));
    OK(fsdp2_event_query(e));
    OK(fsdp2_event_synchronize(e));
    OK(fsdp2_stream_wait_event(s, e));
    OK(fsdp2_stream_synchronize(s));
    OK(fsdp2_event_destroy(e));
    OK(fsdp2_stream_destroy(s));
}
END_TEST

START_TEST(the_current_stream_runs_inline_and_waits_block_the_caller)
{
    fsdp2_stream_t *cur, *cur2, *side;
    fsdp2_event_t *e;
    OK(fsdp2_stream_current(cpu, &cur));
    OK(fsdp2_stream_current(cpu, &cur2));
    ck_assert_ptr_eq(cur, cur2);
    ck_assert_int_eq(fsdp2_stream_destroy(cur), FSDP2_ERR_INVALID_ARGUMENT);
    OK(fsdp2_event_create(cpu, &e));
    float x[4] = {0};
    OK(fsdp2_fill_async(x, FSDP2_F32, 4, 2.5, cur)); /* runs before returning */
    ck_assert_float_eq(x[3], 2.5f);
    OK(fsdp2_event_record(e, cur));
    OK(fsdp2_event_query(e));

    gate_t g;
    gate_init(&g);
    OK(fsdp2_stream_create(cpu, "side", &side));
    OK(fsdp2_stream_launch_host(side, gate_wait, &g));
    OK(fsdp2_fill_async(x, FSDP2_F32, 4, 7.0, side));
    OK(fsdp2_event_record(e, side));
    ck_assert_int_eq(fsdp2_event_wait_timeout(e, 10), FSDP2_ERR_TIMEOUT);
    ck_assert_ptr_nonnull(strstr(fsdp2_last_error(), "side"));
    gate_open(&g);
    OK(fsdp2_stream_wait_event(cur, e)); /* blocks this thread until the fill ran */
    ck_assert_float_eq(x[0], 7.0f);
    OK(fsdp2_event_destroy(e));
    OK(fsdp2_stream_destroy(side));
}
END_TEST

static fsdp2_status_t count_run(void *arg)
{
    atomic_fetch_add((atomic_int *)arg, 1);
    return FSDP2_SUCCESS;
}

static fsdp2_status_t gate_open_run(void *arg)
{
    gate_open(arg);
    return FSDP2_SUCCESS;
}

START_TEST(destroy_with_pending_work_runs_it_first)
{
    gate_t g;
    gate_init(&g);
    atomic_int count;
    atomic_init(&count, 0);
    fsdp2_stream_t *s, *opener;
    fsdp2_event_t *e;
    OK(fsdp2_stream_create(cpu, "pending", &s));
    OK(fsdp2_stream_create(cpu, "opener", &opener));
    OK(fsdp2_event_create(cpu, &e));
    OK(fsdp2_stream_launch_host(s, gate_wait, &g));
    for (int i = 0; i < 500; i++)
        OK(fsdp2_stream_launch_host(s, count_run, &count));
    OK(fsdp2_event_record(e, s));
    /* The gate opens from another thread, so destroy starts with the work still queued. */
    OK(fsdp2_stream_launch_host(opener, gate_open_run, &g));
    OK(fsdp2_stream_destroy(s));
    ck_assert_int_eq(atomic_load(&count), 500);
    /* The event still names the destroyed stream: it must read as complete. */
    OK(fsdp2_event_query(e));
    OK(fsdp2_event_synchronize(e));
    OK(fsdp2_event_destroy(e));
    OK(fsdp2_stream_destroy(opener));
}
END_TEST

static fsdp2_status_t fail_run(void *arg)
{
    (void)arg;
    return fsdp2_error(FSDP2_ERR_PEER_FAILED, "rank 3 went away");
}

START_TEST(a_failing_host_function_is_reported_and_later_work_still_runs)
{
    atomic_int count;
    atomic_init(&count, 0);
    fsdp2_stream_t *s, *cur;
    OK(fsdp2_stream_create(cpu, "coll", &s));
    OK(fsdp2_stream_launch_host(s, fail_run, NULL));
    OK(fsdp2_stream_launch_host(s, count_run, &count));
    ck_assert_int_eq(fsdp2_stream_synchronize(s), FSDP2_ERR_PEER_FAILED);
    ck_assert_ptr_nonnull(strstr(fsdp2_last_error(), "rank 3 went away"));
    ck_assert_ptr_nonnull(strstr(fsdp2_last_error(), "coll"));
    ck_assert_int_eq(atomic_load(&count), 1);
    ck_assert_int_eq(fsdp2_stream_query(s), FSDP2_ERR_PEER_FAILED); /* sticky */
    OK(fsdp2_stream_destroy(s));
    /* On the current stream the failure comes straight back from the launch. */
    OK(fsdp2_stream_current(cpu, &cur));
    ck_assert_int_eq(fsdp2_stream_launch_host(cur, fail_run, NULL), FSDP2_ERR_PEER_FAILED);
}
END_TEST

START_TEST(bad_arguments_are_errors)
{
    fsdp2_stream_t *s;
    fsdp2_event_t *e;
    fsdp2_device_t meta = FSDP2_DEVICE_META_INIT;
    ck_assert_int_eq(fsdp2_stream_create(meta, "m", &s), FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(fsdp2_stream_create(cpu, "x", NULL), FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(fsdp2_stream_launch_host(NULL, count_run, NULL), FSDP2_ERR_INVALID_ARGUMENT);
    OK(fsdp2_stream_create(cpu, "s", &s));
    OK(fsdp2_event_create(cpu, &e));
    ck_assert_int_eq(fsdp2_stream_launch_host(s, NULL, NULL), FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(fsdp2_event_wait_timeout(e, -5), FSDP2_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(fsdp2_memcpy_async(NULL, e, 8, s), FSDP2_ERR_INVALID_ARGUMENT);
    OK(fsdp2_memcpy_async(NULL, NULL, 0, s));
    OK(fsdp2_stream_destroy(NULL));
    OK(fsdp2_event_destroy(NULL));
    OK(fsdp2_event_destroy(e));
    OK(fsdp2_stream_destroy(s));
#if !FSDP2_BUILT_WITH_CUDA
    fsdp2_device_t cuda = {FSDP2_DEVICE_CUDA, 0};
    ck_assert_int_eq(fsdp2_stream_create(cuda, "g", &s), FSDP2_ERR_NOT_AVAILABLE);
#endif
}
END_TEST

/* Ping-pong: two streams take turns on one counter, ordered only by events, through
 * queues small enough (depth 4) that producers block on full queues. Any early start
 * shows up as a turn taken out of order. */
typedef struct turn {
    atomic_long *counter;
    long expect;
    atomic_int *violations;
} turn_t;

static fsdp2_status_t turn_run(void *arg)
{
    turn_t *t = arg;
    long seen = atomic_load(t->counter);
    if (seen != t->expect)
        atomic_fetch_add(t->violations, 1);
    atomic_store(t->counter, seen + 1);
    return FSDP2_SUCCESS;
}

START_TEST(stress_ping_pong_between_streams_never_runs_early)
{
    setenv("FSDP2_CPU_STREAM_DEPTH", "4", 1);
    OK(fsdp2_env_reload());
    enum { ROUNDS = 3000 };
    static turn_t turns[2 * ROUNDS];
    atomic_long counter;
    atomic_int violations;
    atomic_init(&counter, 0);
    atomic_init(&violations, 0);
    fsdp2_stream_t *s[2];
    fsdp2_event_t *done[2];
    OK(fsdp2_stream_create(cpu, "ping", &s[0]));
    OK(fsdp2_stream_create(cpu, "pong", &s[1]));
    OK(fsdp2_event_create(cpu, &done[0]));
    OK(fsdp2_event_create(cpu, &done[1]));
    for (long i = 0; i < 2 * ROUNDS; i++) {
        int me = (int)(i & 1), other = 1 - me;
        turns[i] = (turn_t){&counter, i, &violations};
        OK(fsdp2_stream_wait_event(s[me], done[other]));
        OK(fsdp2_stream_launch_host(s[me], turn_run, &turns[i]));
        OK(fsdp2_event_record(done[me], s[me]));
    }
    OK(fsdp2_stream_synchronize(s[0]));
    OK(fsdp2_stream_synchronize(s[1]));
    ck_assert_int_eq(atomic_load(&violations), 0);
    ck_assert_int_eq(atomic_load(&counter), 2 * ROUNDS);
    for (int k = 0; k < 2; k++) {
        OK(fsdp2_event_destroy(done[k]));
        OK(fsdp2_stream_destroy(s[k]));
    }
}
END_TEST

/* Many streams, many events, kernels and copies: a pipeline of NSTAGE streams passes
 * buffers along (fill -> copy -> accumulate -> cast), each hop ordered by events,
 * over a ring of buffers reused only after their last reader's event. */
START_TEST(stress_pipeline_of_kernels_through_event_ordered_buffer_ring)
{
    enum { NSTAGE = 4, RING = 3, ITERS = 400, N = 257 };
    fsdp2_stream_t *st[NSTAGE];
    fsdp2_event_t *stage_done[RING][NSTAGE];
    static float a[RING][N], b[RING][N];
    static double out[ITERS][N];
    for (int k = 0; k < NSTAGE; k++) {
        char name[16];
        snprintf(name, sizeof(name), "stage%d", k);
        OK(fsdp2_stream_create(cpu, name, &st[k]));
    }
    for (int r = 0; r < RING; r++)
        for (int k = 0; k < NSTAGE; k++)
            OK(fsdp2_event_create(cpu, &stage_done[r][k]));
    for (int it = 0; it < ITERS; it++) {
        int r = it % RING;
        /* Stage 0 may overwrite slot r only after the last stage's previous use of it. */
        OK(fsdp2_stream_wait_event(st[0], stage_done[r][NSTAGE - 1]));
        OK(fsdp2_fill_async(a[r], FSDP2_F32, N, (double)it, st[0]));
        OK(fsdp2_event_record(stage_done[r][0], st[0]));
        OK(fsdp2_stream_wait_event(st[1], stage_done[r][0]));
        OK(fsdp2_memcpy_async(b[r], a[r], sizeof(b[r]), st[1]));
        OK(fsdp2_event_record(stage_done[r][1], st[1]));
        OK(fsdp2_stream_wait_event(st[2], stage_done[r][1]));
        OK(fsdp2_axpy_async(b[r], a[r], FSDP2_F32, N, 0.5, st[2])); /* b = 1.5 * it */
        OK(fsdp2_event_record(stage_done[r][2], st[2]));
        OK(fsdp2_stream_wait_event(st[3], stage_done[r][2]));
        OK(fsdp2_cast_async(out[it], FSDP2_F64, b[r], FSDP2_F32, N, st[3]));
        OK(fsdp2_event_record(stage_done[r][3], st[3]));
    }
    OK(fsdp2_stream_synchronize(st[NSTAGE - 1]));
    for (int it = 0; it < ITERS; it++)
        for (int i = 0; i < N; i++)
            ck_assert_msg(out[it][i] == 1.5 * it, "iteration %d element %d: got %g, want %g", it,
                          i, out[it][i], 1.5 * it);
    for (int r = 0; r < RING; r++)
        for (int k = 0; k < NSTAGE; k++)
            OK(fsdp2_event_destroy(stage_done[r][k]));
    for (int k = 0; k < NSTAGE; k++)
        OK(fsdp2_stream_destroy(st[k]));
}
END_TEST

/* Streams used from several application threads at once. */
typedef struct producer {
    fsdp2_stream_t *stream;
    atomic_int *count;
} producer_t;

static void *producer_main(void *arg)
{
    producer_t *p = arg;
    for (int i = 0; i < 2000; i++)
        if (fsdp2_stream_launch_host(p->stream, count_run, p->count) != FSDP2_SUCCESS)
            return (void *)1;
    return NULL;
}

START_TEST(stress_many_threads_enqueue_on_shared_streams)
{
    setenv("FSDP2_CPU_STREAM_DEPTH", "16", 1);
    OK(fsdp2_env_reload());
    enum { THREADS = 6, STREAMS = 3 };
    fsdp2_stream_t *s[STREAMS];
    atomic_int count;
    atomic_init(&count, 0);
    for (int k = 0; k < STREAMS; k++)
        OK(fsdp2_stream_create(cpu, "shared", &s[k]));
    pthread_t th[THREADS];
    producer_t p[THREADS];
    for (int t = 0; t < THREADS; t++) {
        p[t] = (producer_t){s[t % STREAMS], &count};
        ck_assert_int_eq(pthread_create(&th[t], NULL, producer_main, &p[t]), 0);
    }
    for (int t = 0; t < THREADS; t++) {
        void *ret;
        pthread_join(th[t], &ret);
        ck_assert_ptr_null(ret);
    }
    for (int k = 0; k < STREAMS; k++)
        OK(fsdp2_stream_destroy(s[k]));
    ck_assert_int_eq(atomic_load(&count), THREADS * 2000);
}
END_TEST

typedef struct self_use {
    fsdp2_stream_t *stream;
    fsdp2_event_t *later; /* recorded on stream after a task behind this one */
    atomic_int recorded;
    fsdp2_status_t enqueue, sync, destroy, event_sync, event_wait;
} self_use_t;

static fsdp2_status_t use_own_stream(void *arg)
{
    self_use_t *u = arg;
    u->enqueue = fsdp2_stream_launch_host(u->stream, count_run, NULL);
    u->sync = fsdp2_stream_synchronize(u->stream);
    u->destroy = fsdp2_stream_destroy(u->stream);
    struct timespec start, now, pause = {0, 100000};
    clock_gettime(CLOCK_MONOTONIC, &start);
    while (!atomic_load(&u->recorded)) { /* the test records it after enqueuing us */
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec - start.tv_sec >= 30)
            return FSDP2_ERR_TIMEOUT;
        nanosleep(&pause, NULL);
    }
    fsdp2_stream_t *current;
    u->event_sync = fsdp2_event_synchronize(u->later);
    u->event_wait = fsdp2_stream_current(cpu, &current);
    if (u->event_wait == FSDP2_SUCCESS)
        u->event_wait = fsdp2_stream_wait_event(current, u->later);
    return FSDP2_SUCCESS;
}

START_TEST(a_host_function_using_its_own_stream_is_refused_not_a_deadlock)
{
    self_use_t u = {.stream = NULL};
    atomic_init(&u.recorded, 0);
    OK(fsdp2_stream_create(cpu, "self", &u.stream));
    OK(fsdp2_event_create(cpu, &u.later));
    atomic_int behind;
    atomic_init(&behind, 0);
    OK(fsdp2_stream_launch_host(u.stream, use_own_stream, &u));
    OK(fsdp2_stream_launch_host(u.stream, count_run, &behind));
    OK(fsdp2_event_record(u.later, u.stream)); /* past the task that would wait for it */
    atomic_store(&u.recorded, 1);
    OK(fsdp2_stream_synchronize(u.stream));
    ck_assert_int_eq(u.enqueue, FSDP2_ERR_INVALID_STATE);
    ck_assert_int_eq(u.sync, FSDP2_ERR_INVALID_STATE);
    ck_assert_int_eq(u.destroy, FSDP2_ERR_INVALID_STATE);
    ck_assert_int_eq(u.event_sync, FSDP2_ERR_INVALID_STATE);
    ck_assert_int_eq(u.event_wait, FSDP2_ERR_INVALID_STATE);
    ck_assert_int_eq(atomic_load(&behind), 1);
    OK(fsdp2_event_destroy(u.later));
    OK(fsdp2_stream_destroy(u.stream));
}
END_TEST

START_TEST(errors_are_kept_on_the_current_stream_and_reported_by_destroy)
{
    fsdp2_stream_t *cur, *s;
    OK(fsdp2_stream_current(cpu, &cur));
    ck_assert_int_eq(fsdp2_stream_launch_host(cur, fail_run, NULL), FSDP2_ERR_PEER_FAILED);
    ck_assert_int_eq(fsdp2_stream_synchronize(cur), FSDP2_ERR_PEER_FAILED);
    ck_assert_ptr_nonnull(strstr(fsdp2_last_error(), "rank 3 went away"));
    /* a side stream destroyed without anyone synchronizing reports what failed */
    OK(fsdp2_stream_create(cpu, "unread", &s));
    OK(fsdp2_stream_launch_host(s, fail_run, NULL));
    ck_assert_int_eq(fsdp2_stream_destroy(s), FSDP2_ERR_PEER_FAILED);
    ck_assert_ptr_nonnull(strstr(fsdp2_last_error(), "unread"));
}
END_TEST

typedef struct exclusive {
    atomic_int active, overlaps, next, out_of_order;
    atomic_int ran_on_caller;
    pthread_t caller;
} exclusive_t;

typedef struct exclusive_task {
    exclusive_t *x;
    int id;
} exclusive_task_t;

static fsdp2_status_t exclusive_run(void *arg)
{
    exclusive_task_t *t = arg;
    if (atomic_fetch_add(&t->x->active, 1) != 0)
        atomic_fetch_add(&t->x->overlaps, 1);
    if (atomic_load(&t->x->next) != t->id)
        atomic_fetch_add(&t->x->out_of_order, 1);
    atomic_store(&t->x->next, t->id + 1);
    if (pthread_equal(pthread_self(), t->x->caller))
        atomic_fetch_add(&t->x->ran_on_caller, 1);
    atomic_fetch_sub(&t->x->active, 1);
    return FSDP2_SUCCESS;
}

/* A caller blocked in synchronize runs queued tasks itself while the worker is idle
 * (instead of two thread hand-offs); the worker and the caller must never run two tasks
 * of one stream at once, nor out of order. */
START_TEST(a_synchronizing_caller_helps_without_breaking_order_or_exclusivity)
{
    enum { ROUNDS = 200, BATCH = 10 };
    static exclusive_task_t tasks[ROUNDS * BATCH];
    exclusive_t x;
    atomic_init(&x.active, 0);
    atomic_init(&x.overlaps, 0);
    atomic_init(&x.next, 0);
    atomic_init(&x.out_of_order, 0);
    atomic_init(&x.ran_on_caller, 0);
    x.caller = pthread_self();
    fsdp2_stream_t *s;
    OK(fsdp2_stream_create(cpu, "helped", &s));
    for (int r = 0; r < ROUNDS; r++) {
        for (int b = 0; b < BATCH; b++) {
            int id = r * BATCH + b;
            tasks[id] = (exclusive_task_t){&x, id};
            OK(fsdp2_stream_launch_host(s, exclusive_run, &tasks[id]));
        }
        OK(fsdp2_stream_synchronize(s));
    }
    ck_assert_int_eq(atomic_load(&x.overlaps), 0);
    ck_assert_int_eq(atomic_load(&x.out_of_order), 0);
    ck_assert_int_eq(atomic_load(&x.next), ROUNDS * BATCH);
    OK(fsdp2_stream_destroy(s));
}
END_TEST

/* ---- idle workers ---- */

typedef struct ran_on {
    atomic_int ran;
    pthread_t thread;
    pid_t tid;
    int policy;
} ran_on_t;

static fsdp2_status_t note_thread(void *arg)
{
    ran_on_t *r = arg;
    r->thread = pthread_self();
    r->tid = gettid();
    struct sched_param param;
    pthread_getschedparam(pthread_self(), &r->policy, &param);
    atomic_store(&r->ran, 1);
    return FSDP2_SUCCESS;
}

static fsdp2_status_t nothing(void *arg)
{
    (void)arg;
    return FSDP2_SUCCESS;
}

/* Tasks the caller waits for at once: the caller runs most of them itself. */
static void waited_for_at_once(fsdp2_stream_t *s)
{
    for (int i = 0; i < 64; i++) {
        OK(fsdp2_stream_launch_host(s, nothing, NULL));
        OK(fsdp2_stream_synchronize(s));
    }
}

/* Polls without any stream call until r ran, for up to 30 s. */
static void await_ran_without_stream_calls(ran_on_t *r)
{
    struct timespec start, now, pause = {0, 100000};
    clock_gettime(CLOCK_MONOTONIC, &start);
    while (!atomic_load(&r->ran)) {
        clock_gettime(CLOCK_MONOTONIC, &now);
        ck_assert_msg(now.tv_sec - start.tv_sec < 30, "the task never ran");
        nanosleep(&pause, NULL);
    }
}

/* The times the thread blocked so far (voluntary context switches, from procfs; a
 * yield is not one). */
static long times_blocked(pid_t tid)
{
    char path[64], line[256];
    snprintf(path, sizeof(path), "/proc/self/task/%d/status", (int)tid);
    FILE *f = fopen(path, "r");
    ck_assert_msg(f != NULL, "%s", path);
    long value = -1;
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, "voluntary_ctxt_switches: %ld", &value) == 1)
            break;
    fclose(f);
    ck_assert_msg(value >= 0, "%s has no voluntary_ctxt_switches", path);
    return value;
}

static void sleep_ms(long ms)
{
    struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&t, &t) != 0)
        ;
}

/* A worker with nothing queued yields a few times, then sleeps until an enqueue wakes
 * it: over an idle interval it blocks once, however its last tasks were run (by itself
 * or by waiters); a worker that woke on a timer would block once per wake-up. The
 * interval is the measurement, not a wait for something to happen. */
static void set_defer_wake(const char *mode)
{
    setenv("FSDP2_CPU_STREAM_DEFER_WAKE", mode, 1);
    OK(fsdp2_env_reload());
}

static void *try_batch(void *unused)
{
    (void)unused;
    struct sched_param param = {0};
    return (void *)(intptr_t)pthread_setschedparam(pthread_self(), SCHED_BATCH, &param);
}

/* Whether this system lets a thread make itself SCHED_BATCH (a container's seccomp
 * policy may not); workers are SCHED_BATCH where it does. */
static int batch_allowed(void)
{
    pthread_t t;
    void *rc = (void *)1;
    ck_assert_int_eq(pthread_create(&t, NULL, try_batch, NULL), 0);
    pthread_join(t, &rc);
    return rc == NULL;
}

START_TEST(an_idle_worker_sleeps_until_the_next_task_wakes_it)
{
    set_defer_wake("auto"); /* no shared-memory group here: wake-ups are not deferred */
    fsdp2_stream_t *s;
    OK(fsdp2_stream_create(cpu, "idle", &s));
    for (int round = 0; round < 3; round++) {
        ran_on_t r = {.ran = 0};
        OK(fsdp2_stream_launch_host(s, note_thread, &r));
        await_ran_without_stream_calls(&r); /* runs on the worker: nobody waits for it */
        ck_assert_msg(!pthread_equal(r.thread, pthread_self()), "ran on the caller");
        ck_assert_msg(r.policy == SCHED_BATCH || !batch_allowed(), "worker policy %d", r.policy);
        waited_for_at_once(s); /* the worker idles after tasks that waiters ran */
        long before = times_blocked(r.tid);
        sleep_ms(200);
        long after = times_blocked(r.tid);
        ck_assert_msg(after - before <= 2, "round %d: the idle worker blocked %ld times in 200 ms",
                      round, after - before);
    }
    OK(fsdp2_stream_destroy(s));
}
END_TEST

typedef struct enqueuing_thread {
    fsdp2_stream_t *s;
    ran_on_t *r;
} enqueuing_thread_t;

static void *enqueue_and_exit(void *arg)
{
    enqueuing_thread_t *t = arg;
    waited_for_at_once(t->s);
    OK(fsdp2_stream_launch_host(t->s, note_thread, t->r));
    return NULL; /* exits without waiting for its task */
}

START_TEST(a_task_whose_thread_exits_at_once_still_runs)
{
    set_defer_wake(_i ? "on" : "off"); /* with deferral it exits owing the wake-up */
    fsdp2_stream_t *s;
    OK(fsdp2_stream_create(cpu, "exit", &s));
    for (int round = 0; round < 5; round++) {
        ran_on_t r = {.ran = 0};
        enqueuing_thread_t t = {s, &r};
        pthread_t thread;
        ck_assert_int_eq(pthread_create(&thread, NULL, enqueue_and_exit, &t), 0);
        ck_assert_int_eq(pthread_join(thread, NULL), 0);
        await_ran_without_stream_calls(&r);
    }
    OK(fsdp2_stream_destroy(s)); /* and no reference left behind (ASan's leak check) */
    set_defer_wake("auto");
}
END_TEST

/* With deferred wake-ups, after tasks their waiters ran, the worker naps and an enqueue
 * leaves its wake-up to the enqueuing thread's next stream call: a task whose thread
 * makes none still runs, on the worker, when the nap ends. */
START_TEST(a_deferred_wake_up_still_runs_a_task_nobody_waits_for)
{
    set_defer_wake("on");
    fsdp2_stream_t *s;
    OK(fsdp2_stream_create(cpu, "deferred", &s));
    for (int round = 0; round < 5; round++) {
        waited_for_at_once(s);
        ran_on_t r = {.ran = 0};
        OK(fsdp2_stream_launch_host(s, note_thread, &r));
        await_ran_without_stream_calls(&r);
        ck_assert_msg(!pthread_equal(r.thread, pthread_self()), "ran on the caller");
        /* The mode was in effect: the worker naps after 8 tasks in a row its waiters ran
         * (a loaded machine may let the worker win a claim now and then: try again). */
        int napped = 0;
        for (int tries = 0; round == 4 && tries < 20 && !napped; tries++) {
            waited_for_at_once(s);
            long before = times_blocked(r.tid);
            sleep_ms(50);
            napped = times_blocked(r.tid) - before >= 5;
        }
        ck_assert_msg(round < 4 || napped, "the worker never napped");
    }
    OK(fsdp2_stream_destroy(s));
    set_defer_wake("auto");
}
END_TEST

typedef struct slow_task {
    atomic_int done;
} slow_task_t;

static fsdp2_status_t slow_run(void *arg)
{
    sleep_ms(20);
    atomic_store(&((slow_task_t *)arg)->done, 1);
    return FSDP2_SUCCESS;
}

/* A host function on stream a that makes a blocking stream b wait for an event recorded
 * on a after the function itself: b's task waits for a, which runs this function, so
 * the enqueue from here must not wait for b. */
typedef struct wait_behind_self {
    fsdp2_stream_t *b;
    fsdp2_event_t *e;
    atomic_int recorded, returned;
    fsdp2_status_t status;
} wait_behind_self_t;

static fsdp2_status_t wait_behind_self_run(void *arg)
{
    wait_behind_self_t *w = arg;
    while (!atomic_load(&w->recorded))
        sched_yield();
    w->status = fsdp2_stream_wait_event(w->b, w->e);
    atomic_store(&w->returned, 1);
    return FSDP2_SUCCESS;
}

/* FSDP2_CPU_STREAM_BLOCKING=on: each task enqueued by an application thread has run when
 * its enqueue returns (as CUDA_LAUNCH_BLOCKING=1) and the enqueue returns that task's
 * failure, not an earlier one's; an enqueue from a host function does not wait. Streams
 * take the setting when they are made. */
START_TEST(blocking_streams_run_each_task_before_its_enqueue_returns)
{
    setenv("FSDP2_CPU_STREAM_BLOCKING", "on", 1);
    OK(fsdp2_env_reload());
    fsdp2_stream_t *s, *t;
    fsdp2_event_t *e;
    OK(fsdp2_stream_create(cpu, "blocking", &s));
    OK(fsdp2_stream_create(cpu, "blocking2", &t));
    OK(fsdp2_event_create(cpu, &e));
    unsetenv("FSDP2_CPU_STREAM_BLOCKING"); /* made streams keep it */
    OK(fsdp2_env_reload());

    slow_task_t task = {.done = 0};
    OK(fsdp2_stream_launch_host(s, slow_run, &task));
    ck_assert_int_eq(atomic_load(&task.done), 1);

    float src[1000], dst[1000] = {0};
    for (int i = 0; i < 1000; i++)
        src[i] = (float)i * 0.5f;
    OK(fsdp2_memcpy_async(dst, src, sizeof(src), s));
    ck_assert_mem_eq(dst, src, sizeof(src));
    OK(fsdp2_event_record(e, s));
    OK(fsdp2_stream_wait_event(t, e));

    /* A failure is its own enqueue's; later work on the stream still succeeds, and the
     * stream keeps the first failure for synchronize. */
    ck_assert_int_eq(fsdp2_stream_launch_host(t, fail_run, NULL), FSDP2_ERR_PEER_FAILED);
    ck_assert_ptr_nonnull(strstr(fsdp2_last_error(), "rank 3 went away"));
    slow_task_t after = {.done = 0};
    OK(fsdp2_stream_launch_host(t, slow_run, &after));
    ck_assert_int_eq(atomic_load(&after.done), 1);
    OK(fsdp2_stream_wait_event(t, e));
    ck_assert_int_eq(fsdp2_stream_synchronize(t), FSDP2_ERR_PEER_FAILED); /* sticky */
    OK(fsdp2_stream_synchronize(s));

    /* From a host function on a stream without the setting (run by its worker: nobody
     * waits for it), an enqueue on t waiting for work behind the function returns. */
    fsdp2_stream_t *a;
    OK(fsdp2_stream_create(cpu, "async", &a));
    wait_behind_self_t w = {.b = t, .e = e, .recorded = 0, .returned = 0};
    OK(fsdp2_stream_launch_host(a, wait_behind_self_run, &w));
    OK(fsdp2_event_record(e, a)); /* after the function */
    atomic_store(&w.recorded, 1);
    while (!atomic_load(&w.returned))
        sched_yield();
    ck_assert_int_eq(w.status, FSDP2_SUCCESS);
    ck_assert_int_eq(fsdp2_stream_synchronize(t), FSDP2_ERR_PEER_FAILED); /* still sticky */
    OK(fsdp2_event_query(e));
    OK(fsdp2_event_destroy(e));
    OK(fsdp2_stream_destroy(t)); /* already reported */
    OK(fsdp2_stream_destroy(s));

    /* Without the setting a task runs after its enqueue returns. */
    gate_t g;
    gate_init(&g);
    OK(fsdp2_stream_launch_host(a, gate_wait, &g));
    ck_assert_int_eq(fsdp2_stream_query(a), FSDP2_ERR_NOT_READY);
    gate_open(&g);
    OK(fsdp2_stream_destroy(a));
}
END_TEST

static Suite *stream_suite(void)
{
    Suite *s = suite_create("stream");
    TCase *tc = tcase_create("cpu");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, tasks_on_one_stream_run_in_submission_order);
    tcase_add_test(tc, two_streams_run_concurrently);
    tcase_add_test(tc, wait_event_holds_later_work_until_the_recorded_work_is_done);
    tcase_add_test(tc, rerecording_an_event_elsewhere_does_not_release_earlier_waits);
    tcase_add_test(tc, an_event_never_recorded_is_complete);
    tcase_add_test(tc, the_current_stream_runs_inline_and_waits_block_the_caller);
    tcase_add_test(tc, destroy_with_pending_work_runs_it_first);
    tcase_add_test(tc, a_failing_host_function_is_reported_and_later_work_still_runs);
    tcase_add_test(tc, bad_arguments_are_errors);
    tcase_add_test(tc, stress_ping_pong_between_streams_never_runs_early);
    tcase_add_test(tc, stress_pipeline_of_kernels_through_event_ordered_buffer_ring);
    tcase_add_test(tc, stress_many_threads_enqueue_on_shared_streams);
    tcase_add_test(tc, a_host_function_using_its_own_stream_is_refused_not_a_deadlock);
    tcase_add_test(tc, errors_are_kept_on_the_current_stream_and_reported_by_destroy);
    tcase_add_test(tc, a_synchronizing_caller_helps_without_breaking_order_or_exclusivity);
    tcase_add_test(tc, an_idle_worker_sleeps_until_the_next_task_wakes_it);
    tcase_add_loop_test(tc, a_task_whose_thread_exits_at_once_still_runs, 0, 2);
    tcase_add_test(tc, a_deferred_wake_up_still_runs_a_task_nobody_waits_for);
    tcase_add_test(tc, blocking_streams_run_each_task_before_its_enqueue_returns);
    suite_add_tcase(s, tc);
    return s;
}

FSDP2_CHECK_MAIN(stream_suite)
