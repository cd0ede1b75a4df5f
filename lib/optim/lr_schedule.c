/* Learning-rate schedules: closed forms of the rate at step t (see fsdp2/optim.h). */
#include <math.h>

#include <fsdp2/optim.h>

#include "core/error.h"

static fsdp2_status_t step_lr(const fsdp2_lr_schedule_t *s, double base, int64_t t, double *lr)
{
    FSDP2_ARG_CHECK(s->step_size >= 1, "lr schedule STEP: step_size %lld must be >= 1",
                    (long long)s->step_size);
    FSDP2_ARG_CHECK(s->gamma >= 0.0 && isfinite(s->gamma),
                    "lr schedule STEP: gamma %g must be finite and >= 0", s->gamma);
    /* StepLR's closed form; its chained form multiplies by gamma at each boundary, which
     * differs from this in the last ulp at most. */
    *lr = base * pow(s->gamma, (double)(t / s->step_size));
    return FSDP2_SUCCESS;
}

static fsdp2_status_t cosine_lr(const fsdp2_lr_schedule_t *s, double base, int64_t t, double *lr)
{
    FSDP2_ARG_CHECK(s->warmup >= 0, "lr schedule COSINE: warmup %lld must be >= 0",
                    (long long)s->warmup);
    FSDP2_ARG_CHECK(s->total >= s->warmup,
                    "lr schedule COSINE: total %lld must be >= warmup %lld", (long long)s->total,
                    (long long)s->warmup);
    FSDP2_ARG_CHECK(s->min_lr >= 0.0 && isfinite(s->min_lr),
                    "lr schedule COSINE: min_lr %g must be finite and >= 0", s->min_lr);
    if (t < s->warmup) {
        *lr = base * (double)t / (double)s->warmup;
    } else if (t < s->total) {
        /* total > warmup here, so the division is safe. */
        double progress = (double)(t - s->warmup) / (double)(s->total - s->warmup);
        *lr = s->min_lr + (base - s->min_lr) * 0.5 * (1.0 + cos(M_PI * progress));
    } else {
        *lr = s->min_lr;
    }
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_lr_at(const fsdp2_lr_schedule_t *schedule, double base_lr, int64_t t,
                           double *lr)
{
    FSDP2_ARG_CHECK(schedule && lr, "lr_at: schedule or lr is NULL");
    FSDP2_ARG_CHECK(base_lr >= 0.0 && isfinite(base_lr), "lr_at: base_lr %g must be finite and >= 0",
                    base_lr);
    FSDP2_ARG_CHECK(t >= 0, "lr_at: step %lld must be >= 0", (long long)t);
    switch (schedule->kind) {
    case FSDP2_LR_CONSTANT:
        *lr = base_lr;
        return FSDP2_SUCCESS;
    case FSDP2_LR_STEP:
        return step_lr(schedule, base_lr, t, lr);
    case FSDP2_LR_COSINE:
        return cosine_lr(schedule, base_lr, t, lr);
    }
    return fsdp2_error(FSDP2_ERR_INVALID_ARGUMENT,
                       "lr_at: schedule kind %d is not CONSTANT, STEP or COSINE",
                       (int)schedule->kind);
}
