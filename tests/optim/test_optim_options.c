/* Optimizer options and learning-rate schedules, on one process and without a mesh:
 * every invalid option or schedule field is refused naming its value; StepLR and the
 * cosine schedule against their closed forms (and StepLR against the values torch
 * prints for gamma 0.7); an optimizer over a tree with nothing sharded (refused: no
 * parameters); clipping such a tree (norm 0, nothing communicated). */
#include <check.h>
#include <math.h>
#include <string.h>

#include <fsdp2/fsdp.h>
#include <fsdp2/optim.h>

#include "../core/check_main.h"

/* The call failed with `want` and the message names `needle`. */
#define ck_refused(call, want, needle)                                                        \
    do {                                                                                      \
        fsdp2_status_t s_ = (call);                                                           \
        ck_assert_msg(s_ == (want) && strstr(fsdp2_last_error(), (needle)),                   \
                      "%s = %s (%s), want %s naming '%s'", #call, fsdp2_status_name(s_),      \
                      fsdp2_last_error(), fsdp2_status_name(want), (needle));                 \
    } while (0)

START_TEST(invalid_options_are_refused_naming_the_value)
{
    fsdp2_module_t *root = NULL;
    ck_assert_int_eq(fsdp2_module_create("", &root), FSDP2_SUCCESS);
    fsdp2_optimizer_t *opt = NULL;
    fsdp2_optimizer_options_t o;

#define REFUSE_OPTION(base, field, value, needle)                                             \
    do {                                                                                      \
        fsdp2_optimizer_options_t init_ = base;                                               \
        o = init_;                                                                            \
        o.field = value;                                                                      \
        ck_refused(fsdp2_optimizer_create(root, &o, &opt), FSDP2_ERR_INVALID_ARGUMENT, needle); \
        ck_assert_ptr_null(opt);                                                              \
    } while (0)

    REFUSE_OPTION(FSDP2_SGD_OPTIONS_INIT(0.1), size, 8, "size 8");
    REFUSE_OPTION(FSDP2_SGD_OPTIONS_INIT(0.1), kind, (fsdp2_optimizer_kind_t)7, "kind 7");
    REFUSE_OPTION(FSDP2_SGD_OPTIONS_INIT(0.1), lr, -0.5, "lr -0.5");
    REFUSE_OPTION(FSDP2_SGD_OPTIONS_INIT(0.1), lr, NAN, "lr nan");
    REFUSE_OPTION(FSDP2_SGD_OPTIONS_INIT(0.1), weight_decay, -0.25, "weight_decay -0.25");
    REFUSE_OPTION(FSDP2_SGD_OPTIONS_INIT(0.1), momentum, -0.75, "momentum -0.75");
    REFUSE_OPTION(FSDP2_SGD_OPTIONS_INIT(0.1), nesterov, 1, "momentum 0");
    o = (fsdp2_optimizer_options_t)FSDP2_SGD_OPTIONS_INIT(0.1);
    o.nesterov = 1;
    o.momentum = 0.9;
    o.dampening = 0.125;
    ck_refused(fsdp2_optimizer_create(root, &o, &opt), FSDP2_ERR_INVALID_ARGUMENT,
               "dampening 0.125");
    REFUSE_OPTION(FSDP2_ADAMW_OPTIONS_INIT(1e-3), beta1, 1.0, "beta1 1");
    REFUSE_OPTION(FSDP2_ADAMW_OPTIONS_INIT(1e-3), beta1, -0.1, "beta1 -0.1");
    REFUSE_OPTION(FSDP2_ADAMW_OPTIONS_INIT(1e-3), beta2, 1.5, "beta2 1.5");
    REFUSE_OPTION(FSDP2_ADAMW_OPTIONS_INIT(1e-3), eps, 0.0, "eps 0");
    REFUSE_OPTION(FSDP2_ADAMW_OPTIONS_INIT(1e-3), weight_decay, -1.0, "weight_decay -1");
    REFUSE_OPTION(FSDP2_ADADELTA_OPTIONS_INIT(1.0), rho, 1.5, "rho 1.5");
    REFUSE_OPTION(FSDP2_ADADELTA_OPTIONS_INIT(1.0), rho, -0.5, "rho -0.5");
    REFUSE_OPTION(FSDP2_ADADELTA_OPTIONS_INIT(1.0), eps, -1e-6, "eps -1e-06");
#undef REFUSE_OPTION

    /* Fields another rule uses are not checked (SGD ignores betas), but nothing under
     * root is sharded: an optimizer of no parameters would train nothing, so it is
     * refused, naming the call that was forgotten. */
    o = (fsdp2_optimizer_options_t)FSDP2_SGD_OPTIONS_INIT(0.1);
    o.beta1 = 2.0;
    ck_refused(fsdp2_optimizer_create(root, &o, &opt), FSDP2_ERR_INVALID_ARGUMENT,
               "was fsdp2_fully_shard called?");
    ck_assert_ptr_null(opt);
    ck_assert_int_eq(fsdp2_optimizer_destroy(NULL), FSDP2_SUCCESS);
    ck_refused(fsdp2_optimizer_create(NULL, &o, &opt), FSDP2_ERR_INVALID_ARGUMENT, "root");
    ck_refused(fsdp2_optimizer_step(NULL), FSDP2_ERR_INVALID_ARGUMENT, "NULL");
    ck_refused(fsdp2_clip_grad_norm(root, 1.0, 3.0, NULL), FSDP2_ERR_INVALID_ARGUMENT,
               "norm_type 3");
    ck_refused(fsdp2_clip_grad_norm(root, -1.0, 2.0, NULL), FSDP2_ERR_INVALID_ARGUMENT,
               "max_norm -1");
    /* No sharded parameter: the norm is 0 and nothing is communicated. */
    double norm = -1;
    ck_assert_int_eq(fsdp2_clip_grad_norm(root, 1.0, INFINITY, &norm), FSDP2_SUCCESS);
    ck_assert(norm == 0.0);
    fsdp2_module_destroy(root);
}
END_TEST

static double lr_of(const fsdp2_lr_schedule_t *s, double base, int64_t t)
{
    double lr = -1;
    fsdp2_status_t st = fsdp2_lr_at(s, base, t, &lr);
    ck_assert_msg(st == FSDP2_SUCCESS, "lr_at(t=%lld): %s", (long long)t, fsdp2_last_error());
    return lr;
}

#define ck_close(got, want)                                                                  \
    ck_assert_msg(fabs((got) - (want)) <= 1e-12 * fmax(fabs(want), 1e-300), "%s = %.17g, want %.17g", \
                  #got, (double)(got), (double)(want))

START_TEST(step_lr_matches_torch_steplr_for_epochs_0_to_5)
{
    fsdp2_lr_schedule_t every = {FSDP2_LR_STEP, 1, 0.7, 0, 0, 0.0};
    fsdp2_lr_schedule_t second = {FSDP2_LR_STEP, 2, 0.7, 0, 0, 0.0};
    /* torch.optim.lr_scheduler.StepLR(opt, step_size, gamma=0.7), lr 0.1, epochs 0..5. */
    const double want1[6] = {0.1, 0.07, 0.049, 0.0343, 0.02401, 0.016807};
    const double want2[6] = {0.1, 0.1, 0.07, 0.07, 0.049, 0.049};
    for (int t = 0; t < 6; t++) {
        ck_close(lr_of(&every, 0.1, t), want1[t]);
        ck_close(lr_of(&second, 0.1, t), want2[t]);
    }
    fsdp2_lr_schedule_t constant = {FSDP2_LR_CONSTANT, 0, 0, 0, 0, 0.0};
    ck_close(lr_of(&constant, 0.25, 1000), 0.25);
}
END_TEST

START_TEST(cosine_warms_up_linearly_from_zero_then_decays_to_min_lr)
{
    fsdp2_lr_schedule_t s = {FSDP2_LR_COSINE, 0, 0, 10, 110, 1e-5};
    const double base = 1e-3;
    ck_close(lr_of(&s, base, 0), 0.0);
    ck_close(lr_of(&s, base, 5), base / 2);
    ck_close(lr_of(&s, base, 9), base * 0.9);
    ck_close(lr_of(&s, base, 10), base);
    ck_close(lr_of(&s, base, 60), (base + 1e-5) / 2);
    ck_close(lr_of(&s, base, 35), 1e-5 + (base - 1e-5) * 0.5 * (1 + cos(M_PI / 4)));
    ck_close(lr_of(&s, base, 110), 1e-5);
    ck_close(lr_of(&s, base, 1000), 1e-5);
    /* Monotone after the warmup. */
    for (int t = 10; t < 110; t++)
        ck_assert(lr_of(&s, base, t + 1) <= lr_of(&s, base, t));
    /* No warmup: starts at base. total == warmup: straight to min_lr. */
    fsdp2_lr_schedule_t cold = {FSDP2_LR_COSINE, 0, 0, 0, 100, 0.0};
    ck_close(lr_of(&cold, base, 0), base);
    fsdp2_lr_schedule_t flat = {FSDP2_LR_COSINE, 0, 0, 10, 10, 2e-4};
    ck_close(lr_of(&flat, base, 10), 2e-4);
    ck_close(lr_of(&flat, base, 4), base * 0.4);
}
END_TEST

START_TEST(invalid_schedules_are_refused_naming_the_value)
{
    double lr = 0;
    fsdp2_lr_schedule_t step0 = {FSDP2_LR_STEP, 0, 0.7, 0, 0, 0.0};
    ck_refused(fsdp2_lr_at(&step0, 0.1, 1, &lr), FSDP2_ERR_INVALID_ARGUMENT, "step_size 0");
    fsdp2_lr_schedule_t gamma = {FSDP2_LR_STEP, 3, -0.5, 0, 0, 0.0};
    ck_refused(fsdp2_lr_at(&gamma, 0.1, 1, &lr), FSDP2_ERR_INVALID_ARGUMENT, "gamma -0.5");
    fsdp2_lr_schedule_t warm = {FSDP2_LR_COSINE, 0, 0, -4, 10, 0.0};
    ck_refused(fsdp2_lr_at(&warm, 0.1, 1, &lr), FSDP2_ERR_INVALID_ARGUMENT, "warmup -4");
    fsdp2_lr_schedule_t total = {FSDP2_LR_COSINE, 0, 0, 20, 15, 0.0};
    ck_refused(fsdp2_lr_at(&total, 0.1, 1, &lr), FSDP2_ERR_INVALID_ARGUMENT, "total 15");
    fsdp2_lr_schedule_t min = {FSDP2_LR_COSINE, 0, 0, 2, 15, -1.0};
    ck_refused(fsdp2_lr_at(&min, 0.1, 1, &lr), FSDP2_ERR_INVALID_ARGUMENT, "min_lr -1");
    fsdp2_lr_schedule_t kind = {(fsdp2_lr_schedule_kind_t)9, 0, 0, 0, 0, 0.0};
    ck_refused(fsdp2_lr_at(&kind, 0.1, 1, &lr), FSDP2_ERR_INVALID_ARGUMENT, "kind 9");
    fsdp2_lr_schedule_t ok = {FSDP2_LR_CONSTANT, 0, 0, 0, 0, 0.0};
    ck_refused(fsdp2_lr_at(&ok, 0.1, -2, &lr), FSDP2_ERR_INVALID_ARGUMENT, "step -2");
    ck_refused(fsdp2_lr_at(&ok, -0.1, 0, &lr), FSDP2_ERR_INVALID_ARGUMENT, "base_lr -0.1");
    ck_refused(fsdp2_lr_at(NULL, 0.1, 0, &lr), FSDP2_ERR_INVALID_ARGUMENT, "NULL");
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("optim_options");
    TCase *tc = tcase_create("validation");
    tcase_add_test(tc, invalid_options_are_refused_naming_the_value);
    tcase_add_test(tc, invalid_schedules_are_refused_naming_the_value);
    suite_add_tcase(s, tc);

    tc = tcase_create("schedules");
    tcase_add_test(tc, step_lr_matches_torch_steplr_for_epochs_0_to_5);
    tcase_add_test(tc, cosine_warms_up_linearly_from_zero_then_decays_to_min_lr);
    suite_add_tcase(s, tc);
    return s;
}

FSDP2_CHECK_MAIN(suite)
