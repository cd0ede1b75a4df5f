/* FSDP2_SHM_STREAM_STORES=learn's schedule (lib/collectives/shm_stores.c), driven in one
 * process with made-up costs: which runs try the other way of writing the slots, when
 * the way in use switches, and how the wait between tries grows while the other way
 * costs more than twice as much and falls back once it does not. test_shm.c runs the
 * real collectives in every mode. */
#include <check.h>
#include <string.h>

#include "../core/check_main.h"
#include "collectives/shm_internal.h"

#define BYTES (16u << 20)
#define STEPS 64 /* a run's steps: a part try takes 8 */
#define MAX_TRIES 64

typedef struct learner {
    fsdp2_group_t g;
    shm_group_t sg;
    coll_op_t op;
    double ns_scale; /* costs are cost[way] * ns_scale ns per byte */
    /* runs that tried the way not in use, in order */
    uint64_t tried[MAX_TRIES];
    uint64_t part[MAX_TRIES]; /* and the steps each tried it for (0: the whole run) */
    int n_tried;
} learner_t;

static void learner_init(learner_t *l)
{
    memset(l, 0, sizeof(*l));
    strcpy(l->g.name, "stores");
    l->g.size = 2;
    l->sg.g = &l->g;
    l->sg.stores_policy = SHM_STORES_LEARN;
    l->sg.output_policy = SHM_STORES_AUTO;
    fsdp2_shm_params(&l->sg.params); /* the env table's defaults */
    l->sg.stream_min = 16u << 10;
    l->op = (coll_op_t){.kind = COLL_ALL_GATHER, .count = BYTES / 4, .elem_size = 4,
                        .dtype = FSDP2_F32};
    l->ns_scale = 1e-3; /* runs of 17-67 us: the waits' time cap does not bind */
}

/* 16 MiB from 16 KiB in steps of x4: the schedule's size class 5 */
#define CLASS 5

/* The way in use of the class the learner's op falls in (in place: rank 0's block). */
static int in_use(const learner_t *l)
{
    int row = l->op.recv && l->op.send == l->op.recv ? SHM_ROW_IN_PLACE_AG : COLL_ALL_GATHER;
    return l->sg.stores[row][CLASS].streaming;
}

/* One collective of STEPS steps costing cost[way] (times ns_scale) ns per byte, times
 * slow; a part try costs its share of each way. A try is recorded, with its part. */
static void run_once(learner_t *l, uint64_t run, const double cost[2], double slow)
{
    uint64_t part = 0;
    int way = fsdp2_shm_stores_choose(&l->sg, &l->op, &part);
    if (way != in_use(l) && l->n_tried < MAX_TRIES) {
        l->part[l->n_tried] = part;
        l->tried[l->n_tried++] = run;
    } else {
        ck_assert_uint_eq(part, 0); /* only tries have parts */
    }
    double share = part ? (double)part / STEPS : 1;
    double per_byte = share * cost[way] + (1 - share) * cost[!way];
    fsdp2_shm_stores_learn(&l->sg, &l->op, way, share, STEPS,
                           (int64_t)(slow * per_byte * l->ns_scale * BYTES));
}

static void assert_tries(const learner_t *l, const uint64_t *want, int n, int exact)
{
    if (exact)
        ck_assert_int_eq(l->n_tried, n);
    else
        ck_assert_int_ge(l->n_tried, n);
    for (int i = 0; i < n; i++)
        ck_assert_msg(l->tried[i] == want[i], "try %d at run %llu, want %llu", i,
                      (unsigned long long)l->tried[i], (unsigned long long)want[i]);
}

#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* The first n tries took part[i] steps each (0: the whole run). */
static void assert_parts(const learner_t *l, const uint64_t *part, int n)
{
    ck_assert_int_ge(l->n_tried, n);
    for (int i = 0; i < n; i++)
        ck_assert_msg(l->part[i] == part[i], "try %d at run %llu took %llu steps, want %llu", i,
                      (unsigned long long)l->tried[i], (unsigned long long)l->part[i],
                      (unsigned long long)part[i]);
}

/* The tries exactly (exact) or at least want[0..n), each taking part[i] steps. */
static void assert_schedule(const learner_t *l, const uint64_t *want, const uint64_t *part, int n,
                            int exact)
{
    assert_tries(l, want, n, exact);
    assert_parts(l, part, n);
}

/* `runs` collectives of a new learner l at fixed costs (cost[way] * ns_scale ns per
 * byte): the way in use at the end must be `way`, and the tries exactly want[0..n). */
static void check_steady(learner_t *l, double ns_scale, const double cost[2], uint64_t runs,
                         int way, const uint64_t *want, int n)
{
    learner_init(l);
    l->ns_scale = ns_scale;
    for (uint64_t run = 0; run < runs; run++)
        run_once(l, run, cost, 1.0);
    ck_assert_int_eq(in_use(l), way);
    assert_tries(l, want, n, 1);
}

#if defined(__SSE2__)
/* Far CPUs: plain stores cost 4x streaming. The first try (run 2) switches to
 * streaming; after the try that has seen plain twice, the waits double from 32 to 256.
 * Every try after the switch takes 1/8 of its run, and what it costs beyond streaming's
 * figure puts plain's at 4x again. */
START_TEST(tries_of_a_far_costlier_way_back_off_to_one_in_256)
{
    const double cost[2] = {4.0, 1.0};
    const uint64_t want[] = {2, 10, 42, 106, 234, 490, 746, 1002};
    learner_t l;
    check_steady(&l, 1e-3, cost, 1100, 1, want, COUNT(want));
    const uint64_t part[] = {0, STEPS / 8, STEPS / 8, STEPS / 8, STEPS / 8, STEPS / 8, STEPS / 8};
    assert_parts(&l, part, COUNT(part));
    const shm_store_class_t *k = &l.sg.stores[COLL_ALL_GATHER][CLASS];
    /* (within what whole ns of a run, times 8, allow) */
    ck_assert_double_eq_tol(k->ns_per_byte[0], 4.0 * l.ns_scale, 1e-3 * l.ns_scale);
    ck_assert_double_eq_tol(k->ns_per_byte[1], 1.0 * l.ns_scale, 1e-3 * l.ns_scale);
}
END_TEST

/* Near CPUs: streaming costs 1.3x plain, less than twice: plain stays, and the other
 * way is tried whole after waits that double from 16 runs to 64. */
START_TEST(a_mildly_costlier_way_is_tried_after_waits_growing_to_64_runs)
{
    const double cost[2] = {1.0, 1.3};
    const uint64_t want[] = {2, 18, 50, 114, 178, 242};
    learner_t l;
    check_steady(&l, 1e-3, cost, 250, 0, want, COUNT(want));
    const uint64_t part[] = {0, 0, 0, 0, 0, 0};
    assert_parts(&l, part, COUNT(part));
}
END_TEST

/* The CPUs move close after the waits reached 256: the next try (at most 256 runs
 * later, on 1/8 of its run) finds plain no longer far costlier, the run after tries it
 * whole and switches back (a part never switches), and the waits start over at 8 and
 * grow again, streaming being costlier. */
START_TEST(after_the_cpus_move_the_next_try_switches_back_and_the_waits_start_over)
{
    learner_t l;
    learner_init(&l);
    const double far[2] = {4.0, 1.0}, near[2] = {1.0, 1.3};
    for (uint64_t run = 0; run < 1100; run++) {
        run_once(&l, run, run < 600 ? far : near, 1.0);
        if (run == 746) /* the first try after the move, a part: no switch */
            ck_assert_int_eq(in_use(&l), 1);
        if (run == 747) /* the whole try: plain is cheaper again */
            ck_assert_int_eq(in_use(&l), 0);
    }
    ck_assert_int_eq(in_use(&l), 0);
    /* far: 2, 10, 42, 106, 234, 490; the move at 600; 746 (a part) and 747 switch back
     * to plain; then streaming (1.3x) is tried whole after 8, 16, 32, then 64 runs */
    const uint64_t head[] = {2, 10, 42, 106, 234, 490, 746, 747, 755, 771, 803, 867, 931};
    const uint64_t part[] = {0, 8, 8, 8, 8, 8, 8, 0, 0, 0, 0, 0, 0};
    assert_schedule(&l, head, part, COUNT(head), 0);
}
END_TEST

/* One late run of the other way (a peer arrived late) must not start the long waits:
 * the far wait needs two counted runs of each way (the wait after it is 16, streaming
 * looking costlier). Its figure makes the next try a part, which finds streaming within
 * 2x, so the run after tries it whole, and the waits grow from 16 again. */
START_TEST(one_slow_try_does_not_start_the_long_waits)
{
    learner_t l;
    learner_init(&l);
    const double cost[2] = {1.0, 1.3};
    for (uint64_t run = 0; run < 40; run++)
        run_once(&l, run, cost, run == 2 ? 10.0 : 1.0); /* the first try ran 10x slow */
    const uint64_t want[] = {2, 18, 19, 35};
    const uint64_t part[] = {0, 8, 0, 0};
    assert_schedule(&l, want, part, COUNT(want), 1);
}
END_TEST

/* Runs of 17 ms (the way in use) and 67 ms: the waits stop growing at a second's worth,
 * 59 runs, so that a move of the CPUs back close is noticed within about a second. */
START_TEST(the_waits_stop_at_about_a_second_of_runs)
{
    const double cost[2] = {4.0, 1.0};
    const uint64_t want[] = {2, 10, 42, 101, 160, 219, 278};
    learner_t l;
    check_steady(&l, 1.0, cost, 300, 1, want, COUNT(want));
}
END_TEST

/* The other way stops being far costlier without a switch (plain goes from 4x to 1.5x
 * streaming's cost): the long wait runs out, the part try that sees 1.5x has the next
 * run try plain whole, and that brings the wait back to 16 runs. */
START_TEST(a_try_that_finds_the_other_way_no_longer_far_brings_back_the_short_wait)
{
    learner_t l;
    learner_init(&l);
    const double far[2] = {4.0, 1.0}, nearer[2] = {1.5, 1.0};
    for (uint64_t run = 0; run < 520; run++)
        run_once(&l, run, run < 300 ? far : nearer, 1.0);
    ck_assert_int_eq(in_use(&l), 1);
    const uint64_t want[] = {2, 10, 42, 106, 234, 490, 491, 507};
    assert_tries(&l, want, COUNT(want), 1);
    ck_assert_uint_eq(l.part[6], 0);
}
END_TEST

/* Runs of 50 ms: a second's worth is 20 runs, less than the shortest long wait, 32. */
START_TEST(the_long_wait_is_32_runs_at_least)
{
    const double cost[2] = {4.0, 1.0};
    const uint64_t want[] = {2, 10, 42, 74, 106, 138};
    learner_t l;
    check_steady(&l, 3.0, cost, 140, 1, want, COUNT(want));
}
END_TEST

/* One run of the way in use 40x late (a descheduled peer) switches to the far costlier
 * way; that must not hold it there for the long wait: the way left behind is tried
 * again at once (8 runs after the last try have passed; on a part, its figure being the
 * late run's), whole on the run after, switches back, and the waits start over. */
START_TEST(a_switch_on_one_late_run_does_not_keep_the_long_wait)
{
    learner_t l;
    learner_init(&l);
    const double cost[2] = {4.0, 1.0};
    for (uint64_t run = 0; run < 560; run++) {
        run_once(&l, run, cost, run == 500 ? 40.0 : 1.0);
        if (run == 500)
            ck_assert_int_eq(in_use(&l), 0); /* switched on the late run */
    }
    ck_assert_int_eq(in_use(&l), 1);
    const uint64_t want[] = {2, 10, 42, 106, 234, 490, 501, 502, 510, 542};
    const uint64_t part[] = {0, 8, 8, 8, 8, 8, 8, 0, 8, 8};
    assert_schedule(&l, want, part, COUNT(want), 1);
}
END_TEST

/* Plain in use, streaming 3x dearer (part tries), when the CPUs move far apart at
 * run 498, a part try: plain is 4x what it was, streaming a quarter of plain. The way in
 * use's figure still says 1, so the part's estimate of streaming comes out at 22; it
 * must not replace the figure of 3, which plain's rising figure passes within a few
 * runs: the switch comes then, not at the next long wait's end (run 754). */
START_TEST(a_part_try_as_the_way_in_use_gets_dearer_does_not_hold_the_class_in_it)
{
    learner_t l;
    learner_init(&l);
    const double near[2] = {1.0, 3.0}, far[2] = {4.0, 1.0};
    int switched_at = -1;
    for (uint64_t run = 0; run < 520; run++) {
        run_once(&l, run, run < 498 ? near : far, 1.0);
        if (switched_at < 0 && in_use(&l) == 1)
            switched_at = (int)run;
    }
    /* then plain is tried whole 8 runs after the last try (streaming's figure still high) */
    const uint64_t want[] = {2, 18, 50, 114, 242, 498, 506};
    const uint64_t part[] = {0, 8, 8, 8, 8, 8, 0};
    assert_schedule(&l, want, part, COUNT(want), 1);
    /* plain's figure after k runs at 4: 4 - 3 * 0.75^k, past 3 / 0.9 at k = 6 */
    ck_assert_int_eq(switched_at, 504);
}
END_TEST

/* An in-place all-gather learns in a row of its own: its runs, far cheaper plain here,
 * leave the out-of-place all-gathers' class as it was (streaming, plain 4x dearer). */
START_TEST(in_place_all_gathers_learn_apart_from_out_of_place_ones)
{
    learner_t l;
    learner_init(&l);
    const double far[2] = {4.0, 1.0}, near[2] = {1.0, 3.0};
    for (uint64_t run = 0; run < 20; run++)
        run_once(&l, run, far, 1.0);
    static char out[2 * BYTES];
    l.op.recv = out;
    l.op.send = out; /* rank 0's block of the output */
    for (uint64_t run = 0; run < 20; run++)
        run_once(&l, run, near, 1.0);
    const shm_store_class_t *oop = &l.sg.stores[COLL_ALL_GATHER][CLASS];
    const shm_store_class_t *inp = &l.sg.stores[SHM_ROW_IN_PLACE_AG][CLASS];
    ck_assert_int_eq(oop->runs, 20);
    ck_assert_int_eq(oop->streaming, 1);
    ck_assert_int_eq(inp->runs, 20);
    ck_assert_int_eq(inp->streaming, 0);
    ck_assert_double_eq_tol(inp->ns_per_byte[0], 1.0 * l.ns_scale, 1e-3 * l.ns_scale);
}
END_TEST

#else
/* Without SSE2 there are no non-temporal stores: learn writes plainly, and learns nothing. */
START_TEST(without_sse2_auto_always_writes_plainly)
{
    const double cost[2] = {4.0, 1.0};
    learner_t l;
    check_steady(&l, 1e-3, cost, 100, 0, NULL, 0);
    assert_schedule(&l, NULL, NULL, 0, 1);
}
END_TEST
#endif

static Suite *suite(void)
{
    Suite *s = suite_create("shm_stores");
    TCase *t = tcase_create("auto");
#if !defined(__SSE2__)
    tcase_add_test(t, without_sse2_auto_always_writes_plainly);
#else
    tcase_add_test(t, tries_of_a_far_costlier_way_back_off_to_one_in_256);
    tcase_add_test(t, a_mildly_costlier_way_is_tried_after_waits_growing_to_64_runs);
    tcase_add_test(t, after_the_cpus_move_the_next_try_switches_back_and_the_waits_start_over);
    tcase_add_test(t, one_slow_try_does_not_start_the_long_waits);
    tcase_add_test(t, the_waits_stop_at_about_a_second_of_runs);
    tcase_add_test(t, a_try_that_finds_the_other_way_no_longer_far_brings_back_the_short_wait);
    tcase_add_test(t, the_long_wait_is_32_runs_at_least);
    tcase_add_test(t, a_switch_on_one_late_run_does_not_keep_the_long_wait);
    tcase_add_test(t, a_part_try_as_the_way_in_use_gets_dearer_does_not_hold_the_class_in_it);
    tcase_add_test(t, in_place_all_gathers_learn_apart_from_out_of_place_ones);
#endif
    suite_add_tcase(s, t);
    return s;
}

FSDP2_CHECK_MAIN(suite)
