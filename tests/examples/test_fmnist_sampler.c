/* Unit tests of the Fashion-MNIST example's sampler (fm_sampler in
 * examples/fashion_mnist/data.c), in one process, against the definition of
 * torch.utils.data.DistributedSampler: pad the epoch's permutation by wrapping to
 * ws * ceil(n / ws); rank r takes positions r, r+ws, ...
 *
 * Hot loops fail with `if (!ok) ck_abort_msg(...)` so one mismatch reports one element. */
#include <check.h>

#include "../core/check_main.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "data.h"
#include "fmnist_units.h"

/* Every rank's share put back at its global position of the padded order:
 * padded[rank + k * ws] = rank's k-th entry. Checks each rank's count. */
static int *gather_padded(int n, int ws, uint64_t seed, int epoch, int shuffle, int *total)
{
    int per = (n + ws - 1) / ws;
    int *padded = xcalloc((size_t)ws * per, sizeof(int));
    for (int r = 0; r < ws; r++) {
        int count = -1;
        int *mine = fm_sampler(n, ws, r, seed, epoch, shuffle, &count);
        ck_assert_msg(mine != NULL, "fm_sampler(n=%d, ws=%d, rank=%d) returned NULL", n, ws, r);
        ck_assert_msg(count == per, "n=%d ws=%d rank %d: count %d, want ceil(n/ws) = %d", n, ws, r,
                      count, per);
        for (int k = 0; k < per; k++)
            padded[r + (size_t)k * ws] = mine[k];
        free(mine);
    }
    *total = ws * per;
    return padded;
}

static const int SAMPLER_NS[] = {1, 2, 10, 11, 60000};
#define N_SAMPLER_NS ((int)(sizeof(SAMPLER_NS) / sizeof(SAMPLER_NS[0])))

/* DistributedSampler: the first n positions hold a permutation of 0..n-1 and the padding
 * repeats it from its start (indices += indices[:padding], repeated when the padding is
 * longer than n). Loop index: n index * 4 + ws - 1. */
START_TEST(sampler_shards_cover_a_permutation_padded_by_wrapping_like_distributed_sampler)
{
    int n = SAMPLER_NS[_i / 4], ws = _i % 4 + 1;
    for (int epoch = 0; epoch < 3; epoch++) {
        int total;
        int *padded = gather_padded(n, ws, 42, epoch, 1, &total);
        ck_assert_int_eq(total, ws * ((n + ws - 1) / ws));
        char *seen = xcalloc((size_t)n, 1);
        for (int g = 0; g < n; g++) {
            int v = padded[g];
            if (v < 0 || v >= n || seen[v])
                ck_abort_msg("n=%d ws=%d epoch %d: position %d holds %d (%s)", n, ws, epoch, g, v,
                             v < 0 || v >= n ? "out of range" : "seen before");
            seen[v] = 1;
        }
        for (int g = n; g < total; g++)
            ck_assert_msg(padded[g] == padded[g % n],
                          "n=%d ws=%d epoch %d: padding position %d holds %d, want position "
                          "%d's %d",
                          n, ws, epoch, g, padded[g], g % n, padded[g % n]);
        free(seen);
        free(padded);
    }
}
END_TEST

START_TEST(sampler_without_shuffle_splits_the_identity_order_round_robin)
{
    int n = SAMPLER_NS[_i / 4], ws = _i % 4 + 1;
    int per = (n + ws - 1) / ws;
    for (int r = 0; r < ws; r++) {
        int count = -1;
        int *mine = fm_sampler(n, ws, r, 42, 3, 0, &count);
        ck_assert_int_eq(count, per);
        for (int k = 0; k < per; k++)
            if (mine[k] != (r + k * ws) % n)
                ck_abort_msg("n=%d ws=%d rank %d entry %d: got %d, want %d", n, ws, r, k, mine[k],
                             (r + k * ws) % n);
        free(mine);
    }
}
END_TEST

START_TEST(sampler_gives_the_same_order_for_the_same_seed_and_epoch)
{
    for (int ws = 1; ws <= 4; ws++) {
        for (int r = 0; r < ws; r++) {
            int c1, c2;
            int *a = fm_sampler(60000, ws, r, 7, 5, 1, &c1);
            int *b = fm_sampler(60000, ws, r, 7, 5, 1, &c2);
            ck_assert_int_eq(c1, c2);
            for (int k = 0; k < c1; k++)
                if (a[k] != b[k])
                    ck_abort_msg("ws=%d rank %d entry %d: %d then %d", ws, r, k, a[k], b[k]);
            free(a);
            free(b);
        }
    }
}
END_TEST

/* Fraction of positions where two orders of 0..n-1 agree: ~1/n for independent shuffles. */
static double fraction_equal(const int *a, const int *b, int n)
{
    int same = 0;
    for (int i = 0; i < n; i++)
        same += a[i] == b[i];
    return (double)same / n;
}

START_TEST(sampler_shuffles_and_reshuffles_for_each_epoch_and_seed)
{
    const int n = 60000;
    int c;
    int *identity = fm_sampler(n, 1, 0, 0, 0, 0, &c);
    int *e0 = fm_sampler(n, 1, 0, 7, 0, 1, &c);
    int *e1 = fm_sampler(n, 1, 0, 7, 1, 1, &c);
    int *s8 = fm_sampler(n, 1, 0, 8, 0, 1, &c);
    double fixed = fraction_equal(identity, e0, n);
    double epochs = fraction_equal(e0, e1, n);
    double seeds = fraction_equal(e0, s8, n);
    ck_assert_msg(fixed < 1e-3, "epoch 0 leaves %.5f of the positions in place", fixed);
    ck_assert_msg(epochs < 1e-3, "epochs 0 and 1 agree at %.5f of the positions", epochs);
    ck_assert_msg(seeds < 1e-3, "seeds 7 and 8 agree at %.5f of the positions", seeds);
    /* The first samples of rank 0 change between epochs, so it does not see the same
     * prefix of the data every epoch. */
    int *r0e0 = fm_sampler(n, 4, 0, 7, 0, 1, &c);
    int *r0e1 = fm_sampler(n, 4, 0, 7, 1, 1, &c);
    ck_assert_msg(fraction_equal(r0e0, r0e1, c) < 1e-2, "rank 0 of 4 keeps %.4f of its order",
                  fraction_equal(r0e0, r0e1, c));
    free(identity);
    free(e0);
    free(e1);
    free(s8);
    free(r0e0);
    free(r0e1);
}
END_TEST

/* A Fisher-Yates shuffle draws each of the 3! orders of 3 samples with probability 1/6;
 * over 6000 epochs each count is within 5 standard deviations (5 * 28.9) of 1000. */
START_TEST(sampler_draws_every_order_of_3_samples_equally_often_across_epochs)
{
    const int epochs = 6000;
    int counts[27] = {0};
    for (int e = 0; e < epochs; e++) {
        int c;
        int *o = fm_sampler(3, 1, 0, 11, e, 1, &c);
        counts[o[0] * 9 + o[1] * 3 + o[2]]++;
        free(o);
    }
    const int perms[6] = {0 * 9 + 1 * 3 + 2, 0 * 9 + 2 * 3 + 1, 1 * 9 + 0 * 3 + 2,
                          1 * 9 + 2 * 3 + 0, 2 * 9 + 0 * 3 + 1, 2 * 9 + 1 * 3 + 0};
    double sigma = sqrt(epochs * (1.0 / 6) * (5.0 / 6));
    for (int k = 0; k < 6; k++) {
        int v = perms[k];
        ck_assert_msg(fabs(counts[v] - epochs / 6.0) < 5 * sigma,
                      "order %d%d%d drawn %d times in %d epochs, want %.0f +- %.0f", v / 9,
                      v / 3 % 3, v % 3, counts[v], epochs, epochs / 6.0, 5 * sigma);
    }
}
END_TEST

static Suite *fmnist_sampler_suite(void)
{
    Suite *s = suite_create("fmnist_sampler");

    TCase *sampler = tcase_create("sampler");
    tcase_set_timeout(sampler, TEST_TIMEOUT_S);
    tcase_add_loop_test(sampler,
                        sampler_shards_cover_a_permutation_padded_by_wrapping_like_distributed_sampler,
                        0, 4 * N_SAMPLER_NS);
    tcase_add_loop_test(sampler, sampler_without_shuffle_splits_the_identity_order_round_robin, 0,
                        4 * N_SAMPLER_NS);
    tcase_add_test(sampler, sampler_gives_the_same_order_for_the_same_seed_and_epoch);
    tcase_add_test(sampler, sampler_shuffles_and_reshuffles_for_each_epoch_and_seed);
    tcase_add_test(sampler, sampler_draws_every_order_of_3_samples_equally_often_across_epochs);
    suite_add_tcase(s, sampler);

    return s;
}

FSDP2_CHECK_MAIN(fmnist_sampler_suite)
