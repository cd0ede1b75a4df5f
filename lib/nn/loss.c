/* The losses that start a backward: cross-entropy over logits and mean squared error. */
#include <math.h>
#include <string.h>

#include "core/options.h"
#include "nn_common.h"

/* The cross-entropy's rows go in this many parts (the most threads it uses). */
#define CE_PARTS 64

fsdp2_status_t fsdp2_nn_cross_entropy(const float *logits, const int32_t *targets, int64_t rows,
                                      int64_t classes,
                                      const fsdp2_nn_cross_entropy_options_t *options,
                                      float *dlogits, fsdp2_nn_cross_entropy_result_t *result)
{
    fsdp2_nn_cross_entropy_options_t o = FSDP2_NN_CROSS_ENTROPY_OPTIONS_INIT;
    if (options)
        FSDP2_CHECK(fsdp2_options_copy("cross-entropy options", &o, sizeof(o), options, NULL, 0));
    int32_t ignore_index = o.ignore_index;
    double divisor = o.divisor;
    FSDP2_ARG_CHECK(result, "result is NULL");
    FSDP2_ARG_CHECK(rows >= 0 && classes >= 0, "rows = %lld, classes = %lld: negative",
                    (long long)rows, (long long)classes);
    FSDP2_ARG_CHECK((logits && targets) || rows == 0, "logits or targets is NULL");
    FSDP2_ARG_CHECK(classes > 0 || rows == 0, "cross-entropy over 0 classes");
    FSDP2_ARG_CHECK(!isnan(divisor), "divisor is NaN");
    int64_t count = 0;
    for (int64_t r = 0; r < rows; r++) {
        if (targets[r] == ignore_index)
            continue;
        if (targets[r] < 0 || targets[r] >= classes)
            return fsdp2_error(FSDP2_ERR_INVALID_ARGUMENT,
                               "target %d of row %lld is outside [0, %lld) and is not the "
                               "ignore index %d",
                               targets[r], (long long)r, (long long)classes, ignore_index);
        count++;
    }
    double div = divisor > 0 ? divisor : (double)count;
    /* rows in CE_PARTS fixed parts, summed each in order and then part by part: the same
     * numbers on any number of threads */
    double part_sum[CE_PARTS] = {0};
    int64_t part_hits[CE_PARTS] = {0};
    FSDP2_OMP("omp parallel for schedule(dynamic) if(rows * classes > FSDP2_PAR_CHUNK)")
    for (int part = 0; part < CE_PARTS; part++) {
        for (int64_t r = rows * part / CE_PARTS; r < rows * (part + 1) / CE_PARTS; r++) {
            const float *z = logits + r * classes;
            float *d = dlogits ? dlogits + r * classes : NULL;
            if (targets[r] == ignore_index) {
                if (d)
                    memset(d, 0, sizeof(float) * (size_t)classes);
                continue;
            }
            int64_t arg = 0;
            for (int64_t j = 1; j < classes; j++)
                arg = z[j] > z[arg] ? j : arg;
            double s = 0;
            for (int64_t j = 0; j < classes; j++)
                s += nn_expf(z[j] - z[arg]);
            double lse = z[arg] + log(s);
            part_sum[part] += lse - z[targets[r]];
            part_hits[part] += arg == targets[r];
            if (!d)
                continue;
            /* z - lse in f64: lse rounded to f32 would be off by up to half an f32 step of
             * itself (3e-5 at 1000), which the exponent turns into a relative error */
            float inv = (float)(1.0 / div);
            for (int64_t j = 0; j < classes; j++)
                d[j] = nn_expf((float)((double)z[j] - lse)) * inv;
            d[targets[r]] -= inv;
        }
    }
    double sum = 0;
    int64_t hits = 0;
    for (int part = 0; part < CE_PARTS; part++) {
        sum += part_sum[part];
        hits += part_hits[part];
    }
    result->loss = count > 0 ? sum / div : 0.0;
    result->counted = count;
    result->correct = hits;
    return FSDP2_SUCCESS;
}

fsdp2_status_t fsdp2_nn_mse(const float *pred, const float *target, int64_t n, double *loss,
                            float *dpred)
{
    FSDP2_ARG_CHECK(loss, "loss is NULL");
    FSDP2_ARG_CHECK(n >= 0, "n = %lld is negative", (long long)n);
    FSDP2_ARG_CHECK((pred && target) || n == 0, "pred or target is NULL");
    double sum = 0;
    for (int64_t i = 0; i < n; i++) {
        double e = (double)pred[i] - target[i];
        sum += e * e;
        if (dpred)
            dpred[i] = (float)(2.0 * e / (double)n);
    }
    *loss = n > 0 ? sum / (double)n : 0.0;
    return FSDP2_SUCCESS;
}
